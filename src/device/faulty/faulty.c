/* The faulty test device: the CPU backend, except that a read at a non-zero
 * offset returns corrupted bytes — the offset-read failure of DESIGN.md #1.
 * It exists to prove that `pagekv check` catches such a device and that the KV
 * layer never trusts a device that failed it. Registered only with
 * PKV_FAULTY_DEVICE=1. */
#include "device/cpu/cpu-impl.h"

#include <string.h>

static pkv_status faulty_read(void *ctx, void *src, size_t off, void *dst, size_t n) {
    pkv_status s = pkv_cpu_backend_ops.read(ctx, src, off, dst, n);
    if (s || off == 0) return s;
    /* Like the real bug: the bytes come back as if read from offset 0, with
     * every 7th byte flipped so even a zero-filled buffer shows the damage. */
    memcpy(dst, src, n);
    for (size_t i = 0; i < n; i += 7) ((uint8_t *)dst)[i] ^= 0x5a;
    return PKV_OK;
}

static pkv_backend_ops g_faulty_ops;

pkv_status pkv_faulty_backend_create(const char *name, pkv_device_params params, const pkv_backend_ops **ops,
                                     void **ctx, pkv_device_caps *caps) {
    pkv_status s = pkv_cpu_backend_create(name, params, ops, ctx, caps);
    if (s) return s;
    g_faulty_ops = pkv_cpu_backend_ops;
    g_faulty_ops.read = faulty_read;
    *ops = &g_faulty_ops;
    caps->kind = PKV_DEVICE_TEST;
    strncpy(caps->description, "CPU with corrupted offset reads (test device)", sizeof caps->description - 1);
    return PKV_OK;
}
