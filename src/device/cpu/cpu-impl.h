/* CPU backend internals shared by its transfer code (cpu.c), its kernels
 * (cpu-kernels.c, ref.c) and the faulty test device that wraps it. */
#ifndef PKV_CPU_IMPL_H
#define PKV_CPU_IMPL_H

#include "device/device-impl.h"

typedef struct pkv_cpu_ctx {
    char name[64];
    pkv_pool *pool; /* n_threads workers, including the caller */
} pkv_cpu_ctx;

/* A CPU buffer handle is the start of its host memory (uint8_t *). Only code in
 * src/device/cpu/ and src/device/faulty/ may turn a pkv_tref into a pointer. */
static inline void *pkv_cpu_ptr(pkv_tref t) { return (uint8_t *)t.buf->handle + t.off; }

/* The CPU kernel table (cpu-kernels.c). */
extern const pkv_kernel_ops pkv_cpu_kernel_ops;

/* The instruction-set path the kernels take now: "generic", "avx2", "avx512"
 * or "amx" on x86-64, "generic", "neon", "dotprod" or "i8mm" on aarch64 (the
 * best available, or PKV_CPU_PATH's choice; read per call). */
const char *pkv_cpu_path_name(void);
/* The names PKV_CPU_PATH takes on this architecture, worst to best (*n of them). */
const char *const *pkv_cpu_paths(int *n);
/* True when this CPU (and kernel) can run the path named (one of those). */
bool pkv_cpu_path_available(const char *name);

/* The CPU transfer table, reused by the faulty device. */
extern const pkv_backend_ops pkv_cpu_backend_ops;

#endif
