/* The backend interface: what a backend (cpu, vulkan, faulty, ...) implements.
 * Only src/device/ includes this file. The dispatcher (device.c) validates every
 * argument once before calling a backend, so backends may assume:
 *   - buffers are non-NULL and belong to this device,
 *   - every (offset, size) region lies inside its buffer,
 *   - sizes are > 0 (zero-length transfers never reach the backend),
 *   - regions that must not overlap do not.
 * Backends must accept any byte offset and size (I2); where their hardware needs
 * alignment they handle unaligned heads and tails themselves. */
#ifndef PKV_DEVICE_IMPL_H
#define PKV_DEVICE_IMPL_H

#include "base/base.h"
#include "device/device.h"

#define PKV_BACKEND_VERSION 1

typedef struct pkv_backend_ops {
    int version; /* PKV_BACKEND_VERSION */

    void (*destroy)(void *ctx);

    /* Memory. *handle receives the backend's buffer object. */
    pkv_status (*buffer_alloc)(void *ctx, size_t size, void **handle);
    void (*buffer_free)(void *ctx, void *handle);

    /* Transfers, queued in order with kernels. */
    pkv_status (*write)(void *ctx, void *dst, size_t off, const void *src, size_t n);
    pkv_status (*read)(void *ctx, void *src, size_t off, void *dst, size_t n);
    pkv_status (*fill)(void *ctx, void *dst, size_t off, size_t n, uint8_t value);
    pkv_status (*copy)(void *ctx, void *src, size_t src_off, void *dst, size_t dst_off, size_t n);
    pkv_status (*copy_regions)(void *ctx, void *src, void *dst, const pkv_region *r, size_t n);

    pkv_status (*flush)(void *ctx); /* may be NULL: nothing to submit */
    pkv_status (*sync)(void *ctx);  /* may be NULL: everything is synchronous */

    /* Kernels; NULL when the backend has none (caps.has_kernels false). */
    const struct pkv_kernel_ops *kernels;

    /* Optional (may be NULL): a buffer over host memory the caller keeps alive and
     * never changes (weights in a mapped GGUF file), used in place. Only a backend
     * whose kernels read host memory directly (the CPU) has it. */
    pkv_status (*buffer_wrap)(void *ctx, const void *host, size_t size, void **handle);
    /* Optional (may be NULL): a wrapped buffer is freed (the backend drops what
     * it derived from that memory, such as the CPU's repacked weights). */
    void (*buffer_unwrap)(void *ctx, void *handle, size_t size);

    /* Optional (may be NULL): the backend's own count of device memory
     * allocations (pkv_device_memory_stats_get). */
    void (*memory_stats)(void *ctx, pkv_device_memory_stats *out);
} pkv_backend_ops;

struct pkv_device {
    const pkv_backend_ops *ops;
    void *ctx;
    pkv_device_caps caps;
    uint64_t allocated; /* bytes in live buffers */
    uint64_t memory_limit;
    int n_buffers;
    /* Self-check at open (device.c): a primitive that failed it is routed through
     * a slower path that passed (reads or writes at an offset through whole
     * prefixes from offset 0); raw turns the routing off, so the conformance
     * suite sees what the backend itself does. */
    bool bad_offset_read, bad_offset_write;
    bool raw;
};

struct pkv_buffer {
    pkv_device *dev;
    void *handle; /* backend object */
    size_t size;
    bool wrapped; /* memory owned by someone else (pkv_buffer_wrap_host): read-only, not counted */
};

/* Backend constructors, used by pkv_device_open. On failure they return an error
 * status with a message and leave nothing allocated. */
pkv_status pkv_cpu_backend_create(const char *name, pkv_device_params params,
                                  const pkv_backend_ops **ops, void **ctx,
                                  pkv_device_caps *caps);
pkv_status pkv_faulty_backend_create(const char *name, pkv_device_params params,
                                     const pkv_backend_ops **ops, void **ctx,
                                     pkv_device_caps *caps);
#ifdef PKV_HAVE_VULKAN
/* Number of Vulkan physical devices usable for compute, or 0 with *why set. */
int pkv_vulkan_count(char *why, size_t why_size);
/* See pkv_vulkan_validation_messages (pagekv.h). */
int64_t pkv_vulkan_validation(char *msg, size_t msg_size);
pkv_status pkv_vulkan_backend_create(const char *name, int index, pkv_device_params params,
                                     const pkv_backend_ops **ops, void **ctx,
                                     pkv_device_caps *caps);
#endif
#ifdef PKV_HAVE_CUDA
/* Number of CUDA devices, or 0 with *why set (no driver, no GPU, ...). */
int pkv_cuda_count(char *why, size_t why_size);
pkv_status pkv_cuda_backend_create(const char *name, int index, pkv_device_params params,
                                   const pkv_backend_ops **ops, void **ctx, pkv_device_caps *caps);
#endif

#endif /* PKV_DEVICE_IMPL_H */
