/* Internal device-layer API used by the kv and model layers: the compute kernels.
 * Each pkv_k_* function checks that every buffer belongs to `dev`, that every
 * region it will touch lies inside its buffer, and that the shape is sane, then
 * queues the kernel on the device in order with transfers (I3).
 *
 * Conventions: a pkv_tref names (buffer, byte offset). Shapes are listed
 * outermost first; "f32 [n][cols]" means n rows of cols contiguous floats.
 * Unless stated, input and output may not alias; "in place ok" says otherwise.
 * The plain-C reference of every kernel lives in src/device/cpu/ref.c and is the
 * definition of its result. */
#ifndef PKV_DEVICE_H
#define PKV_DEVICE_H

#include "pagekv.h"

/* The types a KV page (and so set_rows' dst, rope's x and attention's k/v) may
 * hold: f32, f16, and the GGUF blocks q8_0 and q4_0 (32 elements per block along
 * a head's dimension, quant.h). Quantized rows are head_dim / 32 blocks per head. */
static inline bool pkv_kv_type_ok(pkv_type t) {
    return t == PKV_TYPE_F32 || t == PKV_TYPE_F16 || t == PKV_TYPE_Q8_0 || t == PKV_TYPE_Q4_0;
}
static inline bool pkv_kv_type_quant(pkv_type t) { return t == PKV_TYPE_Q8_0 || t == PKV_TYPE_Q4_0; }

typedef struct pkv_tref {
    pkv_buffer *buf;
    size_t off; /* bytes */
} pkv_tref;

static inline pkv_tref pkv_tref_make(pkv_buffer *buf, size_t off) {
    pkv_tref t = {buf, off};
    return t;
}

#include "device/kernel-list.h"

/* The kernel slots of a backend. A NULL slot means "not supported on this device". */
typedef struct pkv_kernel_ops {
    /* Which weight types matmul/get_rows accept; NULL = all of the reference's. */
    bool (*supports_type)(void *ctx, pkv_type t);
    /* How matmuls with weights of type t run (pkv_device_weight_speed); NULL:
     * PKV_WEIGHT_FAST for every supported type. */
    pkv_weight_speed (*weight_speed)(void *ctx, pkv_type t);
    /* pkv_device_weight_layout; NULL: "plain" */
    void (*weight_layout)(void *ctx, pkv_type t, char *buf, size_t size);
#define PKV_KERNEL_SLOT(name) pkv_status (*name)(void *ctx, const pkv_k_##name##_args *a);
    PKV_KERNELS(PKV_KERNEL_SLOT)
#undef PKV_KERNEL_SLOT
} pkv_kernel_ops;

/* pkv_k_<name>(dev, args) for every kernel of PKV_KERNELS: checks the arguments,
 * then queues the kernel (PKV_ERR_UNSUPPORTED where the device has no slot). */
#define PKV_KERNEL_ENTRY(name) pkv_status pkv_k_##name(pkv_device *dev, const pkv_k_##name##_args *a);
PKV_KERNELS(PKV_KERNEL_ENTRY)
#undef PKV_KERNEL_ENTRY

/* Turn the safe routing of transfers that failed the open-time self-check off
 * (raw true) or back on; returns the previous setting. The conformance suite
 * runs raw so it reports what the backend itself does. */
bool pkv_device_set_raw(pkv_device *dev, bool raw);

/* A read-only buffer over host memory that stays valid and unchanged until the
 * buffer is freed (weights of a mapped GGUF file used in place, not copied).
 * NULL with PKV_ERR_UNSUPPORTED when the device cannot use host memory directly
 * (every device but the CPU): the caller then allocates and writes. Transfers
 * into a wrapped buffer (write, fill, copy to it) are refused. */
pkv_buffer *pkv_buffer_wrap_host(pkv_device *dev, const void *host, size_t size);

/* Does the device have kernel slot `k` for weight type t (matmul/get_rows)? */
bool pkv_device_supports_weight(const pkv_device *dev, pkv_type t);

#endif /* PKV_DEVICE_H */
