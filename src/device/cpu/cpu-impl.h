/* CPU backend internals shared by its transfer code (cpu.c), its kernels
 * (cpu-kernels.c, ref.c) and the faulty test device that wraps it. */
#ifndef PKV_CPU_IMPL_H
#define PKV_CPU_IMPL_H

#include "device/device-impl.h"

#include <pthread.h>

struct pkv_cpu_repack;

typedef struct pkv_cpu_ctx {
    char name[64];
    pkv_pool *pool; /* n_threads workers, including the caller */
    pthread_mutex_t repack_lock;
    struct pkv_cpu_repack *repacked; /* weights with a repacked copy (cpu-repack.c) */
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

/* Repacked weights (cpu-repack.c): the q4_k weights of wrapped (mapped,
 * read-only) buffers get a copy in the pkv_q4kr layout on the first matmul that
 * uses them, kept until the buffer is freed; PKV_CPU_REPACK=0 turns it off.
 * pkv_cpu_repack_get gives the groups of weight w (rows x cols), or NULL where
 * the weight keeps the plain layout (and records why, for
 * pkv_cpu_repack_layout). */
struct pkv_q4kr;
const struct pkv_q4kr *pkv_cpu_repack_get(pkv_cpu_ctx *c, pkv_tref w, pkv_type t, int64_t rows, int64_t cols);
/* Forget the copies of weights in [host, host + size) (a wrapped buffer freed). */
void pkv_cpu_repack_drop(pkv_cpu_ctx *c, const void *host, size_t size);
void pkv_cpu_repack_free_all(pkv_cpu_ctx *c);
/* Which layout the matmuls with weights of type t used so far, as text: "plain"
 * or "repacked8: N weights (B bytes)[, plain: M weights (reason)]". */
void pkv_cpu_repack_layout(pkv_cpu_ctx *c, pkv_type t, char *buf, size_t size);

/* The CPU transfer table, reused by the faulty device. */
extern const pkv_backend_ops pkv_cpu_backend_ops;

#endif
