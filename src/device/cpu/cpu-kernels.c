/* The CPU backend's kernels. The dispatcher (kernels.c) has checked buffers and
 * bounds; values read from memory that no host check sees (ids, page ids, row
 * indices) are guarded here as kernel-list.h states. Work is split over the device's
 * thread pool. Results match ref.c within the tolerances of check-kernels.c.
 *
 * Determinism: every output element is computed by one task with a fixed
 * operation order, independent of the thread count and of how many rows share a
 * call (a matmul row gets the same operations whether it comes alone or with
 * others), so fork == replay holds bitwise on the CPU.
 *
 * Instruction-set path: the matmul inner products come from one of the tables
 * in cpu-dots.h (attention's from the matching one of cpu-attention.h), chosen
 * at EVERY kernel call: the best the CPU supports, or the one named by the
 * environment variable PKV_CPU_PATH. On x86-64: amx > avx512 > avx2 > generic
 * (amx is avx512 with q8_0 matmuls on AMX tiles, cpu-amx.c); on aarch64:
 * i8mm > dotprod > neon > generic (cpu-neon.c, from the kernel's HWCAP bits).
 * Reading it per call lets a test setenv() between calls; an unavailable path
 * falls back to the next best with one warning in the log.
 *
 * Accuracy: matmuls with quantized weights (q8_0, q4_0, q4_k, q5_k, q6_k, mxfp4)
 * quantize each activation row to 8 bits per block of 32 once per call
 * (d = amax/127, block sums kept), as ggml's CPU backend does, and use integer
 * dot products; their normalized mean squared error against the reference is
 * about 1e-5 on random data (bound in check-kernels.c). All other kernels
 * compute in f32 and agree with the double-precision reference to rounding
 * (nmse < 1e-10). */
#include "device/cpu/cpu-impl.h"

#include "base/quant.h"
#include "device/cpu/cpu-amx.h"
#include "device/cpu/cpu-attention.h"
#include "device/cpu/cpu-dots.h"
#include "device/cpu/ref.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ path choice */

/* The paths of this architecture, worst to best; the index is the level. */
#if defined(PKV_CPU_X86)
static const char *const g_paths[] = {"generic", "avx2", "avx512", "amx"};
#define PATH_AMX 3
#elif defined(PKV_CPU_ARM)
static const char *const g_paths[] = {"generic", "neon", "dotprod", "i8mm"};
#else
static const char *const g_paths[] = {"generic"};
#endif
#define N_PATHS ((int)(sizeof g_paths / sizeof g_paths[0]))

#ifdef PKV_CPU_X86
static bool have_avx2(void) {
    __builtin_cpu_init();
    /* F16C is not asked for: every CPU with AVX2 has it (and clang 14 does not
     * know the name). */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static bool have_avx512(void) {
    return have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}
#endif

#ifdef PKV_CPU_ARM
#include <sys/auxv.h>
/* Linux's aarch64 hwcap bits (asm/hwcap.h), for C libraries that lack them */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1ul << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1ul << 13)
#endif
#endif

/* The best level this CPU (and kernel) can run. */
static int have_level(void) {
#if defined(PKV_CPU_X86)
    return have_avx512() ? (pkv_cpu_amx_available() ? 3 : 2) : have_avx2() ? 1 : 0;
#elif defined(PKV_CPU_ARM)
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (!(hw & HWCAP_ASIMD)) return 0;
    if (!(hw & HWCAP_ASIMDDP)) return 1;
    return hw2 & HWCAP2_I8MM ? 3 : 2;
#else
    return 0;
#endif
}

static atomic_int g_warned_unknown, g_warned_missing; /* one warning each per process */

/* The AVX-512 table with its empty slots filled from the AVX2 one. */
#ifdef PKV_CPU_X86
static pkv_cpu_dots g_avx512_full;
static pthread_once_t g_avx512_once = PTHREAD_ONCE_INIT;
static void avx512_init(void) {
    g_avx512_full = pkv_cpu_dots_avx2;
    const pkv_cpu_dots *x = &pkv_cpu_dots_avx512;
    g_avx512_full.name = x->name;
#define TAKE(f) if (x->f) g_avx512_full.f = x->f
    TAKE(f32x); TAKE(f16x); TAKE(bf16x); TAKE(f32t); TAKE(f16t); TAKE(bf16t); TAKE(f16row); TAKE(f32f16row); TAKE(q8_0); TAKE(q4_0); TAKE(mxfp4); TAKE(q8a); TAKE(scan);
    if (__builtin_cpu_supports("avx512vnni")) {
        x = &pkv_cpu_dots_vnni;
        TAKE(q8_0); TAKE(q4_0); TAKE(mxfp4); TAKE(q8_0z); TAKE(q8z); TAKE(q4_kr);
        for (int t = 0; t < PKV_TYPE_COUNT; t++) {
            TAKE(more[t]);
            TAKE(sup[t]);
        }
        g_avx512_full.slow = x->slow;
    }
#undef TAKE
}
#endif

/* The level of the path for this call (an index of g_paths). */
static int path_select(void) {
    const char *env = getenv("PKV_CPU_PATH");
    int want = N_PATHS - 1;
    if (env && *env) {
        int k = 0;
        while (k < N_PATHS && strcmp(env, g_paths[k]) != 0) k++;
        if (k < N_PATHS)
            want = k;
        else if (!atomic_exchange(&g_warned_unknown, 1)) {
            char list[96] = "";
            for (int i = 0; i < N_PATHS; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", g_paths[i]);
            PKV_WARN("PKV_CPU_PATH=%s is not one of %s; using the best available", env, list);
        }
    }
    const int have = have_level();
    if (env && *env && want > have && !atomic_exchange(&g_warned_missing, 1))
        PKV_WARN("PKV_CPU_PATH=%s: this CPU (or kernel) lacks it; using %s", env, g_paths[have]);
    return PKV_MIN(want, have);
}

const char *pkv_cpu_path_name(void) { return g_paths[path_select()]; }

const char *const *pkv_cpu_paths(int *n) {
    *n = N_PATHS;
    return g_paths;
}

bool pkv_cpu_path_available(const char *name) {
    const int have = have_level();
    for (int k = 0; k <= have && k < N_PATHS; k++)
        if (name && strcmp(name, g_paths[k]) == 0) return true;
    return false;
}

static const pkv_cpu_dots *dots_for(int use) {
#if defined(PKV_CPU_X86)
    if (use >= 2) {
        pthread_once(&g_avx512_once, avx512_init);
        return &g_avx512_full;
    }
    if (use == 1) return &pkv_cpu_dots_avx2;
#elif defined(PKV_CPU_ARM)
    if (use == 3) return &pkv_cpu_dots_i8mm;
    if (use == 2) return &pkv_cpu_dots_dotprod;
    if (use == 1) return &pkv_cpu_dots_neon;
#endif
    (void)use;
    return &pkv_cpu_dots_generic;
}

static const pkv_cpu_dots *dots_select(void) { return dots_for(path_select()); }

static pkv_qdot_fn qdot(const pkv_cpu_dots *d, pkv_type t) {
    switch (t) {
    case PKV_TYPE_Q8_0: return d->q8_0;
    case PKV_TYPE_Q4_0: return d->q4_0;
    case PKV_TYPE_Q4_K: return d->q4_k;
    case PKV_TYPE_Q5_K: return d->q5_k;
    case PKV_TYPE_Q6_K: return d->q6_k;
    case PKV_TYPE_MXFP4: return d->mxfp4;
    default: return (int)t >= 0 && t < PKV_TYPE_COUNT ? d->more[t] : NULL;
    }
}

static pkv_sdot_fn sdot(const pkv_cpu_dots *d, pkv_type t) {
    return (int)t >= 0 && t < PKV_TYPE_COUNT ? d->sup[t] : NULL;
}

/* Split [0, n) into n_tasks even ranges; task i gets [*a, *b). */
static void range(int64_t n, int i, int n_tasks, int64_t *a, int64_t *b) {
    *a = n * i / n_tasks;
    *b = n * (i + 1) / n_tasks;
}

/* Tasks for `items` units of roughly `work` element-operations in all: one task
 * below ~64k operations (waking the pool costs more), else a few per thread. */
static int n_tasks_for(const pkv_cpu_ctx *c, int64_t items, double work) {
    if (work < 65536.0 || items <= 1) return 1;
    int64_t t = (int64_t)pkv_pool_threads(c->pool) * 4;
    return (int)PKV_MIN(t, items);
}

static bool supports_type(void *ctx, pkv_type t) {
    (void)ctx;
    switch (t) {
    case PKV_TYPE_F32:
    case PKV_TYPE_F16:
    case PKV_TYPE_BF16:
    case PKV_TYPE_Q8_0:
    case PKV_TYPE_Q4_0:
    case PKV_TYPE_Q4_K:
    case PKV_TYPE_Q5_K:
    case PKV_TYPE_Q6_K:
    case PKV_TYPE_MXFP4: return true;
    default: return pkv_qblock_decoder(t) != NULL;
    }
}

/* Matmuls with weights of type t on the path the next call takes: slow where
 * the type has no dot kernel of its own there (cpu-dots.h, slow). */
static pkv_weight_speed weight_speed(void *ctx, pkv_type t) {
    if (!supports_type(ctx, t)) return PKV_WEIGHT_NONE;
    const pkv_cpu_dots *d = dots_select();
    return (int)t < 64 && (d->slow >> t & 1) ? PKV_WEIGHT_SLOW : PKV_WEIGHT_FAST;
}

static void weight_layout(void *ctx, pkv_type t, char *buf, size_t size) { pkv_cpu_repack_layout(ctx, t, buf, size); }

#define TRY(x)                                                                             \
    do {                                                                                   \
        pkv_status _s = (x);                                                               \
        if (_s) return _s;                                                                 \
    } while (0)

/* The CPU kernels read f32/i32 tensors at offsets that are multiples of 4 and f16
 * tensors at multiples of 2 (natural alignment; weights of block types at any
 * offset). Anything else is refused rather than read misaligned. */
static pkv_status aligned(const pkv_cpu_ctx *c, const char *kernel, const char *name, pkv_tref t, size_t align) {
    if ((uintptr_t)pkv_cpu_ptr(t) % align == 0) return PKV_OK;
    return pkv_err(PKV_ERR_INVALID, "%s: kernel %s: argument %s at offset %zu is not %zu-byte aligned", c->name, kernel,
                   name, t.off, align);
}

/* ----------------------------------------------------------------- matmul */

/* Weight rows prefetched ahead: with short rows (1024 q8_0 columns are 17 cache
 * lines) the hardware prefetcher alone left a third of the bandwidth unused. */
#ifndef PF_ROWS
#define PF_ROWS 2
#endif
/* Weight rows per L2-resident chunk of the float tile loop (a multiple of 4). */
#ifndef MM_QCHUNK
#define MM_QCHUNK 64
#endif
#ifndef MM_WCHUNK
#define MM_WCHUNK 32
#endif
typedef struct {
    const pkv_cpu_dots *dots;
    const uint8_t *w;
    size_t rb; /* bytes per weight row */
    pkv_type wt;
    int64_t rows, cols, n, xblock; /* xblock: x rows per cache block */
    const float *x;                /* f32 [n][cols] */
    const pkv_q8a *xq;             /* [n][cols/32], for quantized weights */
    const pkv_q8z *xz;             /* [n][(cols/32 + 1)/2], q8_0 with q8_0z */
    const pkv_q8s *xs;             /* [n][cols/256], k-quants with q4_ks/q5_ks/q6_ks */
    const pkv_amx_xb *xa;          /* [ceil(n/16)][cols/32], q8_0 and q4_k on the amx path */
    const pkv_q4kr *wr;            /* q4_k repacked: [rows/8][cols/256] (cpu-repack.c) */
    float *y;                      /* f32 [n][rows] */
} mm_job;

/* q4_k on the repacked layout: whole groups of 8 weight rows per task, the rows
 * past the last whole group (the last task's) on the plain layout. Otherwise
 * as the plain quantized loop below: a chunk of weight rows stays in cache
 * while each group of PKV_QDOT_NX activation rows meets all of it. */
static void mm_repacked(const mm_job *j, int ti, int n_tasks) {
    int64_t g0, g1;
    range((j->rows + PKV_Q4KR_ROWS - 1) / PKV_Q4KR_ROWS, ti, n_tasks, &g0, &g1);
    const int64_t wb = j->cols / 256, full = j->rows / PKV_Q4KR_ROWS, chunk = MM_QCHUNK / PKV_Q4KR_ROWS;
    const pkv_sdot_fn sd = sdot(j->dots, j->wt);
    float out[PKV_Q4KR_ROWS * PKV_QDOT_NX];
    for (int64_t x0 = 0; x0 < j->n; x0 += j->xblock) {
        const int64_t x1 = PKV_MIN(j->n, x0 + j->xblock);
        for (int64_t c0 = g0; c0 < g1; c0 += chunk) {
            const int64_t c1 = PKV_MIN(g1, c0 + chunk);
            for (int64_t i = x0; i < x1; i += PKV_QDOT_NX) {
                const int nx = (int)PKV_MIN(PKV_QDOT_NX, x1 - i);
                const pkv_q8s *xi = j->xs + i * wb;
                for (int64_t g = c0; g < c1; g++) {
                    if (g < full) {
                        j->dots->q4_kr(j->wr + g * wb, xi, wb, wb, nx, out);
                        for (int k = 0; k < nx; k++)
                            memcpy(j->y + (i + k) * j->rows + g * PKV_Q4KR_ROWS, out + PKV_Q4KR_ROWS * k,
                                   PKV_Q4KR_ROWS * sizeof *out);
                        continue;
                    }
                    for (int64_t r = g * PKV_Q4KR_ROWS; r < j->rows; r++) {
                        sd(j->w + (size_t)r * j->rb, xi, wb, wb, nx, out);
                        for (int k = 0; k < nx; k++) j->y[(i + k) * j->rows + r] = out[k];
                    }
                }
            }
        }
    }
}

static void mm_task(int ti, int n_tasks, void *arg) {
    const mm_job *j = arg;
    int64_t r0, r1;
    if (j->xa) { /* whole groups of 16 weight rows per task */
        range((j->rows + 15) / 16, ti, n_tasks, &r0, &r1);
        pkv_amx_rows(j->wt, j->w, j->rb, r0 * 16, PKV_MIN(j->rows, r1 * 16), j->cols / 32, j->xq, j->xa, j->n, j->y,
                     j->rows);
        return;
    }
    if (j->wr) {
        mm_repacked(j, ti, n_tasks);
        return;
    }
    range(j->rows, ti, n_tasks, &r0, &r1);
    const int64_t xb = j->cols / 32, wb = j->cols / (int64_t)pkv_type_block_elems(j->wt);
    const pkv_qdot_fn qd = qdot(j->dots, j->wt);
    const pkv_sdot_fn sd = j->xs ? sdot(j->dots, j->wt) : NULL;
    /* Two weight rows at a time against q8a rows (the ARM paths); not with the
     * q8z or super-block activation layouts. */
    const pkv_qdot2_fn qd2 =
        j->xz || sd || (int)j->wt < 0 || j->wt >= PKV_TYPE_COUNT ? NULL : j->dots->pair[j->wt];
    /* Float weights with a register tile (cpu-dots.h, f32t): 4 weight rows at a
     * time against the x rows 4 at a time, each pair in its own accumulator. */
    const void *tile = j->wt == PKV_TYPE_F32 ? (const void *)j->dots->f32t
                       : j->wt == PKV_TYPE_F16  ? (const void *)j->dots->f16t
                       : j->wt == PKV_TYPE_BF16 ? (const void *)j->dots->bf16t
                                                : NULL;
    if (tile) {
        const size_t es = j->wt == PKV_TYPE_F32 ? 4 : 2;
        const int64_t ws = (int64_t)(j->rb / es);
        for (int64_t x0 = 0; x0 < j->n; x0 += j->xblock) {
            const int64_t x1 = PKV_MIN(j->n, x0 + j->xblock);
            /* A chunk of weight rows stays in L2 while each group of 4 x rows
             * (in L1) meets all of its tiles. */
            for (int64_t c0 = r0; c0 < r1; c0 += MM_WCHUNK) {
                const int64_t c1 = PKV_MIN(r1, c0 + MM_WCHUNK);
                for (int64_t i = x0; i < x1; i += 4) {
                    const int nx = (int)PKV_MIN(4, x1 - i);
                    const float *xi = j->x + i * j->cols;
                    /* Fewer than 4 x rows (decode): one weight row after the
                     * other, a single forward stream the hardware prefetcher
                     * follows (f16, 1024 columns, AVX-512 EPYC: 25 -> 35 GB/s
                     * on 2 threads against 4-row tiles with the software
                     * prefetch below). A pair's operations are the same in
                     * every tile shape, so the result is too. */
                    const int tw = nx < 4 ? 1 : 4;
                    for (int64_t r = c0; r < c1; r += tw) {
                        const int nw = (int)PKV_MIN(tw, c1 - r);
                        const uint8_t *wr = j->w + (size_t)r * j->rb;
                        if (tw == 4 && i == x0) { /* first pass over the chunk: the next tile's rows */
                            const int64_t pf = PKV_MIN(4, r1 - (r + 4));
                            for (size_t o = 0; pf > 0 && o < (size_t)pf * j->rb; o += 64)
                                __builtin_prefetch(wr + 4 * j->rb + o);
                        }
                        float *y = j->y + i * j->rows + r;
                        if (j->wt == PKV_TYPE_F32)
                            j->dots->f32t((const float *)(const void *)wr, ws, nw, xi, j->cols, nx, j->cols, y,
                                          j->rows);
                        else if (j->wt == PKV_TYPE_F16)
                            j->dots->f16t((const uint16_t *)(const void *)wr, ws, nw, xi, j->cols, nx, j->cols, y,
                                          j->rows);
                        else
                            j->dots->bf16t((const uint16_t *)(const void *)wr, ws, nw, xi, j->cols, nx, j->cols, y,
                                           j->rows);
                    }
                }
            }
        }
        return;
    }
    if ((qd || sd) && j->n > 1) {
        /* Quantized prefill and batched decode: a chunk of weight rows stays in
         * cache while each group of PKV_QDOT_NX (8) activation rows (in L1) meets
         * all of its rows; a weight block is decoded once per group (the dots
         * take a row's operations the same in every group size). */
        for (int64_t x0 = 0; x0 < j->n; x0 += j->xblock) {
            const int64_t x1 = PKV_MIN(j->n, x0 + j->xblock);
            for (int64_t c0 = r0; c0 < r1; c0 += MM_QCHUNK) {
                const int64_t c1 = PKV_MIN(r1, c0 + MM_QCHUNK);
                for (int64_t i = x0; i < x1; i += PKV_QDOT_NX) {
                    const int nx = (int)PKV_MIN(PKV_QDOT_NX, x1 - i);
                    float out[2 * PKV_QDOT_NX];
                    for (int64_t r = c0; r < c1; r++) {
                        const uint8_t *wr = j->w + (size_t)r * j->rb;
                        if (i == x0 && r + PF_ROWS < r1)
                            for (size_t o = 0; o < j->rb; o += 64) __builtin_prefetch(wr + PF_ROWS * j->rb + o);
                        if (qd2 && r + 1 < c1) { /* two weight rows (the pairing does not change results) */
                            if (i == x0 && r + 1 + PF_ROWS < r1)
                                for (size_t o = 0; o < j->rb; o += 64) __builtin_prefetch(wr + (PF_ROWS + 1) * j->rb + o);
                            qd2(wr, j->rb, j->xq + i * xb, xb, wb, nx, out);
                            for (int k = 0; k < nx; k++) {
                                j->y[(i + k) * j->rows + r] = out[k];
                                j->y[(i + k) * j->rows + r + 1] = out[PKV_QDOT_NX + k];
                            }
                            r++;
                            continue;
                        }
                        if (j->xz)
                            j->dots->q8_0z(wr, j->xz + i * ((xb + 1) / 2), (xb + 1) / 2, wb, nx, out);
                        else if (sd)
                            sd(wr, j->xs + i * wb, wb, wb, nx, out);
                        else
                            qd(wr, j->xq + i * xb, xb, wb, nx, out);
                        for (int k = 0; k < nx; k++) j->y[(i + k) * j->rows + r] = out[k];
                    }
                }
            }
        }
        return;
    }
    /* Weights are streamed once per block of x rows; the block stays in cache. */
    for (int64_t x0 = 0; x0 < j->n; x0 += j->xblock) {
        const int64_t x1 = PKV_MIN(j->n, x0 + j->xblock);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = j->w + (size_t)r * j->rb;
            float *y = j->y + r;
            if (r + PF_ROWS < r1)
                for (size_t o = 0; o < j->rb; o += 64) __builtin_prefetch(wr + PF_ROWS * j->rb + o);
            float out[4];
            switch (j->wt) {
            case PKV_TYPE_F32:
            case PKV_TYPE_F16:
            case PKV_TYPE_BF16:
                /* four x rows per weight-row pass: each weight vector is loaded once */
                for (int64_t i = x0; i < x1; i += 4) {
                    const int nx = (int)PKV_MIN(4, x1 - i);
                    const float *xi = j->x + i * j->cols;
                    if (j->wt == PKV_TYPE_F32)
                        j->dots->f32x((const float *)(const void *)wr, xi, j->cols, j->cols, nx, out);
                    else if (j->wt == PKV_TYPE_F16)
                        j->dots->f16x((const uint16_t *)(const void *)wr, xi, j->cols, j->cols, nx, out);
                    else
                        j->dots->bf16x((const uint16_t *)(const void *)wr, xi, j->cols, j->cols, nx, out);
                    for (int k = 0; k < nx; k++) y[(i + k) * j->rows] = out[k];
                }
                break;
            default:
                /* four x rows per weight-row pass: each weight block is decoded once */
                for (int64_t i = x0; i < x1; i += 4) {
                    const int nx = (int)PKV_MIN(4, x1 - i);
                    if (j->xz)
                        j->dots->q8_0z(wr, j->xz + i * ((xb + 1) / 2), (xb + 1) / 2, wb, nx, out);
                    else if (sd)
                        sd(wr, j->xs + i * wb, wb, wb, nx, out);
                    else
                        qd(wr, j->xq + i * xb, xb, wb, nx, out);
                    for (int k = 0; k < nx; k++) y[(i + k) * j->rows] = out[k];
                }
                break;
            }
        }
    }
}

static pkv_status cpu_matmul(void *ctx, const pkv_k_matmul_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "matmul", "x", a->x, 4));
    TRY(aligned(c, "matmul", "y", a->y, 4));
    if (a->wtype == PKV_TYPE_F32 || a->wtype == PKV_TYPE_F16 || a->wtype == PKV_TYPE_BF16)
        TRY(aligned(c, "matmul", "w", a->w, pkv_type_block_bytes(a->wtype)));
    mm_job j = {0};
    const int path = path_select();
    j.dots = dots_for(path);
    j.w = pkv_cpu_ptr(a->w);
    j.wt = a->wtype;
    j.rb = pkv_type_row_bytes(a->wtype, (size_t)a->cols);
    j.rows = a->rows;
    j.cols = a->cols;
    j.n = a->n;
    j.x = pkv_cpu_ptr(a->x);
    j.y = pkv_cpu_ptr(a->y);
    const bool q8 = qdot(j.dots, a->wtype) != NULL || sdot(j.dots, a->wtype) != NULL;
    if (!q8 && a->wtype != PKV_TYPE_F32 && a->wtype != PKV_TYPE_F16 && a->wtype != PKV_TYPE_BF16)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: matmul: weight type %s", c->name, pkv_type_name(a->wtype));
    /* about 256 KiB of activations per block */
    j.xblock = PKV_MAX(1, (int64_t)(262144 / ((size_t)a->cols * (q8 ? 1 : 4))));
    const int n_tasks = n_tasks_for(c, a->rows, (double)a->rows * (double)a->cols * (double)a->n);
    pkv_q8a *xq = NULL;
    pkv_q8z *xz = NULL;
    pkv_q8s *xs = NULL;
    if (q8) {
        const int64_t nb = a->cols / 32;
        xq = pkv_malloc((size_t)a->n * (size_t)nb * sizeof *xq);
        if (!xq) return pkv_err(PKV_ERR_NOMEM, "%s: matmul: no memory to quantize %lld activation rows", c->name, (long long)a->n);
        j.dots->q8a(j.x, xq, a->n * nb);
        j.xq = xq;
#ifdef PATH_AMX
        if (path == PATH_AMX && pkv_amx_supports(a->wtype)) {
            pkv_amx_xb *xa = pkv_malloc((size_t)((a->n + 15) / 16) * (size_t)nb * sizeof *xa);
            if (!xa) {
                pkv_free(xq);
                return pkv_err(PKV_ERR_NOMEM, "%s: matmul: no memory to lay out %lld activation rows", c->name, (long long)a->n);
            }
            pkv_amx_x_layout(xq, a->n, nb, xa);
            j.xa = xa;
            pkv_pool_run(c->pool, n_tasks, mm_task, &j);
            pkv_free(xa);
            pkv_free(xq);
            return PKV_OK;
        }
#endif
        if (a->wtype == PKV_TYPE_Q8_0 && j.dots->q8_0z && j.dots->q8z) {
            xz = pkv_malloc((size_t)a->n * (size_t)((nb + 1) / 2) * sizeof *xz);
            if (!xz) {
                pkv_free(xq);
                return pkv_err(PKV_ERR_NOMEM, "%s: matmul: no memory to lay out %lld activation rows", c->name, (long long)a->n);
            }
            for (int64_t r = 0; r < a->n; r++) j.dots->q8z(xq + r * nb, xz + r * ((nb + 1) / 2), nb);
            j.xz = xz;
        }
        if (sdot(j.dots, a->wtype)) {
            xs = pkv_malloc((size_t)a->n * (size_t)(nb / 8) * sizeof *xs);
            if (!xs) {
                pkv_free(xq);
                return pkv_err(PKV_ERR_NOMEM, "%s: matmul: no memory to lay out %lld activation rows", c->name, (long long)a->n);
            }
            pkv_cpu_q8s(xq, xs, a->n * (nb / 8));
            j.xs = xs;
            if (j.dots->q4_kr) j.wr = pkv_cpu_repack_get(c, a->w, a->wtype, a->rows, a->cols);
        }
    }
    pkv_pool_run(c->pool, n_tasks, mm_task, &j);
    pkv_free(xs);
    pkv_free(xz);
    pkv_free(xq);
    return PKV_OK;
}

/* --------------------------------------------------------------- get_rows */

typedef struct {
    const pkv_k_get_rows_args *a;
    const uint8_t *w;
    const int32_t *ids;
    float *out;
    size_t rb;
} gr_job;

static void gr_task(int ti, int n_tasks, void *arg) {
    const gr_job *j = arg;
    int64_t i0, i1;
    range(j->a->n, ti, n_tasks, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        float *o = j->out + i * j->a->cols;
        const int32_t id = j->ids[i];
        if (id < 0 || id >= j->a->n_vocab)
            memset(o, 0, (size_t)j->a->cols * sizeof(float));
        else
            pkv_dequantize_row(j->a->wtype, j->w + (size_t)id * j->rb, o, j->a->cols);
        if (j->a->scale != 0) /* Gemma's embedding scale: one f32 multiply per element */
            for (int64_t c = 0; c < j->a->cols; c++) o[c] = o[c] * j->a->scale;
    }
}

static pkv_status cpu_get_rows(void *ctx, const pkv_k_get_rows_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "get_rows", "ids", a->ids, 4));
    TRY(aligned(c, "get_rows", "out", a->out, 4));
    gr_job j = {a, pkv_cpu_ptr(a->w), pkv_cpu_ptr(a->ids), pkv_cpu_ptr(a->out), pkv_type_row_bytes(a->wtype, (size_t)a->cols)};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n, (double)a->n * (double)a->cols), gr_task, &j);
    return PKV_OK;
}

/* ------------------------------------------------------- row-wise kernels */

typedef struct {
    const void *args;
    int64_t n; /* rows or elements */
} rows_job;

static void rms_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_rms_norm_args *a = j->args;
    const float *x = pkv_cpu_ptr(a->x), *w = pkv_cpu_ptr(a->w);
    float *y = pkv_cpu_ptr(a->y);
    int64_t r0, r1;
    range(a->n_rows, ti, n_tasks, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * a->row_len;
        float *yr = y + r * a->row_len;
        /* 8 partial sums (independent chains the compiler vectorizes; one
         * serial chain of double adds was 4% of a prefill), then the tail, then
         * a fixed pairwise combination: the same order for every row */
        double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t k = 0;
        for (; k + 8 <= a->row_len; k += 8)
            for (int q = 0; q < 8; q++) p[q] += (double)xr[k + q] * xr[k + q];
        for (int q = 0; k < a->row_len; k++, q++) p[q] += (double)xr[k] * xr[k];
        const double ss = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
        const float inv = (float)(1.0 / sqrt(ss / (double)a->row_len + (double)a->eps));
        for (k = 0; k < a->row_len; k++) yr[k] = xr[k] * inv * w[k];
    }
}

static pkv_status cpu_rms_norm(void *ctx, const pkv_k_rms_norm_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "rms_norm", "x", a->x, 4));
    TRY(aligned(c, "rms_norm", "w", a->w, 4));
    TRY(aligned(c, "rms_norm", "y", a->y, 4));
    rows_job j = {a, a->n_rows};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n_rows, (double)a->n_rows * (double)a->row_len), rms_task, &j);
    return PKV_OK;
}

static void ln_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_layer_norm_args *a = j->args;
    const float *x = pkv_cpu_ptr(a->x);
    const float *w = a->w.buf ? pkv_cpu_ptr(a->w) : NULL, *b = a->b.buf ? pkv_cpu_ptr(a->b) : NULL;
    float *y = pkv_cpu_ptr(a->y);
    const int64_t len = a->row_len;
    int64_t r0, r1;
    range(a->n_rows, ti, n_tasks, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * len;
        float *yr = y + r * len;
        /* two passes (mean, then squared deviations), each in 8 double partial
         * sums combined in a fixed order, as rms_norm */
        double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t k = 0;
        for (; k + 8 <= len; k += 8)
            for (int q = 0; q < 8; q++) p[q] += (double)xr[k + q];
        for (int q = 0; k < len; k++, q++) p[q] += (double)xr[k];
        const double mean = (((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))) / (double)len;
        for (int q = 0; q < 8; q++) p[q] = 0;
        for (k = 0; k + 8 <= len; k += 8)
            for (int q = 0; q < 8; q++) p[q] += ((double)xr[k + q] - mean) * ((double)xr[k + q] - mean);
        for (int q = 0; k < len; k++, q++) p[q] += ((double)xr[k] - mean) * ((double)xr[k] - mean);
        const double var = (((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))) / (double)len;
        const float inv = (float)(1.0 / sqrt(var + (double)a->eps)), m = (float)mean;
        for (k = 0; k < len; k++) {
            float v = (xr[k] - m) * inv;
            if (w) v *= w[k];
            if (b) v += b[k];
            yr[k] = v;
        }
    }
}

static pkv_status cpu_layer_norm(void *ctx, const pkv_k_layer_norm_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "layer_norm", "x", a->x, 4));
    TRY(aligned(c, "layer_norm", "y", a->y, 4));
    if (a->w.buf) TRY(aligned(c, "layer_norm", "w", a->w, 4));
    if (a->b.buf) TRY(aligned(c, "layer_norm", "b", a->b, 4));
    rows_job j = {a, a->n_rows};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n_rows, (double)a->n_rows * (double)a->row_len * 2), ln_task, &j);
    return PKV_OK;
}

static void add_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_add_args *a = j->args;
    const float *x = pkv_cpu_ptr(a->a), *b = pkv_cpu_ptr(a->b);
    float *y = pkv_cpu_ptr(a->y);
    int64_t i0, i1;
    range(a->n, ti, n_tasks, &i0, &i1);
    if (a->b_len == a->n) {
        for (int64_t i = i0; i < i1; i++) y[i] = x[i] + b[i];
    } else {
        for (int64_t i = i0; i < i1; i++) y[i] = x[i] + b[i % a->b_len];
    }
}

static pkv_status cpu_add(void *ctx, const pkv_k_add_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "add", "a", a->a, 4));
    TRY(aligned(c, "add", "b", a->b, 4));
    TRY(aligned(c, "add", "y", a->y, 4));
    rows_job j = {a, a->n};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n / 1024 + 1, (double)a->n), add_task, &j);
    return PKV_OK;
}

static void swiglu_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_swiglu_args *a = j->args;
    const float *g = pkv_cpu_ptr(a->g), *u = pkv_cpu_ptr(a->u);
    float *y = pkv_cpu_ptr(a->y);
    int64_t i0, i1;
    range(a->n, ti, n_tasks, &i0, &i1);
    if (a->gelu) { /* the tanh form as x * sigmoid(2t) (0.5 (1 + tanh t) = sigmoid(2t)): 1 + tanh(t)
                    * cancels to nothing in f32 for x < -4.5; exp(-2|t|) never overflows or cancels.
                    * The same expression as the Vulkan and CUDA kernels. */
        for (int64_t i = i0; i < i1; i++) {
            const float x = g[i];
            float t = 0.7978845608f * (x + 0.044715f * x * x * x);
            t = t > 50.0f ? 50.0f : t < -50.0f ? -50.0f : t;
            const float e = expf(-2.0f * fabsf(t));
            y[i] = (t >= 0 ? x / (1.0f + e) : x * e / (1.0f + e)) * u[i];
        }
        return;
    }
    if (a->oai) { /* gpt-oss: the gate clamped above, the up projection both ways, plus one */
        const float alpha = a->alpha, lim = a->limit;
        for (int64_t i = i0; i < i1; i++) {
            const float x = fminf(g[i], lim), v = fminf(fmaxf(u[i], -lim), lim);
            y[i] = x / (1.0f + expf(-alpha * x)) * (v + 1.0f);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static pkv_status cpu_swiglu(void *ctx, const pkv_k_swiglu_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "swiglu", "g", a->g, 4));
    TRY(aligned(c, "swiglu", "u", a->u, 4));
    TRY(aligned(c, "swiglu", "y", a->y, 4));
    rows_job j = {a, a->n};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n / 1024 + 1, (double)a->n * 8), swiglu_task, &j);
    return PKV_OK;
}

/* Rotate the pairs [i0, i1) of every head of one row by cs/sn (index i - i0).
 * f16 rows are widened a head at a time with the path's vector conversion where
 * it has one (exact both ways; the rotation is the same f32 arithmetic). */
static void rope_row(const pkv_k_rope_args *a, const pkv_cpu_dots *d, uint8_t *xr, int i0, int i1, const float *cs,
                     const float *sn, float *hb) {
    const int half = a->n_rot / 2;
    const bool vec16 = a->dtype == PKV_TYPE_F16 && d->f16row && d->f32f16row && hb;
    for (int h = 0; h < a->n_heads; h++) {
        const size_t base = (size_t)h * (size_t)a->head_dim;
        if (a->dtype == PKV_TYPE_F32 || vec16) {
            float *f = (float *)(void *)xr + base;
            if (vec16) {
                f = hb;
                d->f16row((const uint16_t *)(const void *)xr + base, hb, a->n_rot);
            }
            for (int i = i0; i < i1; i++) {
                const size_t e0 = (size_t)(a->neox ? i : 2 * i), e1 = (size_t)(a->neox ? i + half : 2 * i + 1);
                const float c = cs[i - i0], s = sn[i - i0];
                const float v0 = f[e0], v1 = f[e1];
                f[e0] = v0 * c - v1 * s;
                f[e1] = v0 * s + v1 * c;
            }
            if (vec16) d->f32f16row(hb, (uint16_t *)(void *)xr + base, a->n_rot);
            continue;
        }
        for (int i = i0; i < i1; i++) {
            const size_t e0 = base + (size_t)(a->neox ? i : 2 * i);
            const size_t e1 = base + (size_t)(a->neox ? i + half : 2 * i + 1);
            const float c = cs[i - i0], s = sn[i - i0];
            uint16_t h0, h1;
            memcpy(&h0, xr + 2 * e0, 2);
            memcpy(&h1, xr + 2 * e1, 2);
            const float v0 = pkv_f16_to_f32(h0), v1 = pkv_f16_to_f32(h1);
            h0 = pkv_f32_to_f16(v0 * c - v1 * s);
            h1 = pkv_f32_to_f16(v0 * s + v1 * c);
            memcpy(xr + 2 * e0, &h0, 2);
            memcpy(xr + 2 * e1, &h1, 2);
        }
    }
}

/* A quantized row (kernel-list.h): each head dequantized into hb (head_dim floats),
 * rotated with the f32 arithmetic above, and quantized again. */
static void rope_row_quant(const pkv_k_rope_args *a, uint8_t *xr, const float *cs, const float *sn, float *hb) {
    const int half = a->n_rot / 2;
    const size_t hbytes = pkv_type_row_bytes(a->dtype, (size_t)a->head_dim);
    for (int h = 0; h < a->n_heads; h++) {
        uint8_t *hp = xr + (size_t)h * hbytes;
        pkv_dequantize_row(a->dtype, hp, hb, a->head_dim);
        for (int i = 0; i < half; i++) {
            const size_t e0 = (size_t)(a->neox ? i : 2 * i), e1 = (size_t)(a->neox ? i + half : 2 * i + 1);
            const float v0 = hb[e0], v1 = hb[e1];
            hb[e0] = v0 * cs[i] - v1 * sn[i];
            hb[e1] = v0 * sn[i] + v1 * cs[i];
        }
        pkv_quantize_row(a->dtype, hb, hp, a->head_dim);
    }
}

typedef struct {
    const pkv_k_rope_args *a;
    const pkv_cpu_dots *dots;
} rope_job;

/* YaRN's factor on pair i's unscaled angle (kernel-list.h): freq_scale without YaRN. */
static double rope_factor(const pkv_k_rope_args *a, int i) {
    if (a->ext_factor == 0) return (double)a->freq_scale;
    const double y = ((double)i - (double)a->corr_lo) / fmax(0.001, (double)a->corr_hi - (double)a->corr_lo);
    const double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * (double)a->ext_factor;
    return (double)a->freq_scale * (1.0 - mix) + mix;
}

#define ROPE_PAIRS 512 /* cos/sin for up to 512 pairs at a time */
static void rope_task(int ti, int n_tasks, void *arg) {
    const rope_job *j = arg;
    const pkv_k_rope_args *a = j->a;
    uint8_t *x = pkv_cpu_ptr(a->x);
    const int32_t *pos = pkv_cpu_ptr(a->pos);
    const int32_t *rows = a->rows.buf ? pkv_cpu_ptr(a->rows) : NULL;
    const float *ff = a->ff.buf ? pkv_cpu_ptr(a->ff) : NULL;
    const int64_t max_rows = rows ? a->max_rows : a->n_rows;
    const int half = a->n_rot / 2;
    float cs[ROPE_PAIRS], sn[ROPE_PAIRS], hb[2 * ROPE_PAIRS];
    double pw[ROPE_PAIRS];
    const double ms = a->mscale > 0 ? (double)a->mscale : 1.0;
    float *hbp = a->n_rot <= 2 * ROPE_PAIRS ? hb : NULL;
    int64_t r0, r1;
    range(a->n_rows, ti, n_tasks, &r0, &r1);
    /* theta in double: positions reach 1e5 and more, where f32 loses radians */
    if (half <= ROPE_PAIRS) {
        /* The powers once per task, cos/sin once per distinct position in a run of
         * rows (a shift rotates every row by the same delta): the same values. */
        /* YaRN folds its mix into the powers; without it the angle is pos * freq_scale * pw */
        for (int i = 0; i < half; i++)
            pw[i] = pow((double)a->freq_base, -2.0 * i / (double)a->n_rot) * (a->ext_factor == 0 ? 1.0 : rope_factor(a, i)) /
                    (ff ? (double)ff[i] : 1.0);
        const double fs = a->ext_factor == 0 ? (double)a->freq_scale : 1.0;
        bool have = false;
        int32_t last = 0;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t row = rows ? rows[r] : r;
            if (row < 0 || row >= max_rows) continue;
            if (!have || pos[r] != last) {
                for (int i = 0; i < half; i++) {
                    const double th = (double)pos[r] * fs * pw[i];
                    cs[i] = (float)(cos(th) * ms);
                    sn[i] = (float)(sin(th) * ms);
                }
                have = true;
                last = pos[r];
            }
            if (pkv_kv_type_quant(a->dtype))
                rope_row_quant(a, x + (size_t)row * a->row_stride, cs, sn, hb);
            else
                rope_row(a, j->dots, x + (size_t)row * a->row_stride, 0, half, cs, sn, hbp);
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const int64_t row = rows ? rows[r] : r;
        if (row < 0 || row >= max_rows) continue;
        for (int i0 = 0; i0 < half; i0 += ROPE_PAIRS) {
            const int i1 = PKV_MIN(half, i0 + ROPE_PAIRS);
            for (int i = i0; i < i1; i++) {
                const double p = pow((double)a->freq_base, -2.0 * i / (double)a->n_rot) / (ff ? (double)ff[i] : 1.0);
                const double th = a->ext_factor == 0 ? (double)pos[r] * (double)a->freq_scale * p
                                                     : (double)pos[r] * p * rope_factor(a, i);
                cs[i - i0] = (float)(cos(th) * ms);
                sn[i - i0] = (float)(sin(th) * ms);
            }
            rope_row(a, j->dots, x + (size_t)row * a->row_stride, i0, i1, cs, sn, NULL);
        }
    }
}

static pkv_status cpu_rope(void *ctx, const pkv_k_rope_args *a) {
    pkv_cpu_ctx *c = ctx;
    rope_job j = {a, dots_select()};
    const size_t es = a->dtype == PKV_TYPE_F32 ? 4 : 2;
    if (pkv_kv_type_quant(a->dtype) && a->head_dim > 2 * ROPE_PAIRS)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: rope of %s rows: head size %d is above the %d this kernel re-quantizes",
                       c->name, pkv_type_name(a->dtype), a->head_dim, 2 * ROPE_PAIRS);
    TRY(aligned(c, "rope", "x", a->x, es));
    TRY(aligned(c, "rope", "pos", a->pos, 4));
    if (a->row_stride % es) return pkv_err(PKV_ERR_INVALID, "%s: rope: row stride %zu is not a multiple of %zu", c->name, a->row_stride, es);
    if (a->rows.buf) TRY(aligned(c, "rope", "rows", a->rows, 4));
    if (a->ff.buf) TRY(aligned(c, "rope", "ff", a->ff, 4));
    pkv_pool_run(c->pool, n_tasks_for(c, a->n_rows, (double)a->n_rows * a->n_heads * a->n_rot * 4), rope_task, &j);
    return PKV_OK;
}

typedef struct {
    const pkv_k_set_rows_args *args;
    const pkv_cpu_dots *dots;
} set_rows_job;

static void set_rows_task(int ti, int n_tasks, void *arg) {
    const set_rows_job *j = arg;
    const pkv_k_set_rows_args *a = j->args;
    const uint8_t *src = pkv_cpu_ptr(a->src);
    uint8_t *dst = pkv_cpu_ptr(a->dst);
    const int32_t *idx = pkv_cpu_ptr(a->idx);
    int64_t i0, i1;
    range(a->n, ti, n_tasks, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        if (idx[i] < 0 || idx[i] >= a->dst_rows) continue;
        const uint8_t *s = src + (size_t)i * a->src_stride;
        uint8_t *d = dst + (size_t)idx[i] * a->dst_stride;
        if (pkv_kv_type_quant(a->dst_type)) { /* the reference quantizer itself, block by block */
            float f[32];
            for (int64_t b = 0; b < a->row_elems / 32; b++) {
                memcpy(f, s + (size_t)b * 128, sizeof f);
                pkv_quantize_row(a->dst_type, f, d + (size_t)b * pkv_type_block_bytes(a->dst_type), 32);
            }
            continue;
        }
        if (a->dst_type == PKV_TYPE_F32) {
            memcpy(d, s, (size_t)a->row_elems * 4);
            continue;
        }
        if (j->dots && j->dots->f32f16row) { /* the same rounding, vectorized */
            j->dots->f32f16row((const float *)(const void *)s, (uint16_t *)(void *)d, a->row_elems);
            continue;
        }
        for (int64_t k = 0; k < a->row_elems; k++) {
            float f;
            memcpy(&f, s + 4 * k, 4);
            const uint16_t h = pkv_f32_to_f16(f);
            memcpy(d + 2 * k, &h, 2);
        }
    }
}

static pkv_status cpu_set_rows(void *ctx, const pkv_k_set_rows_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "set_rows", "idx", a->idx, 4));
    set_rows_job j = {a, dots_select()};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n, (double)a->n * (double)a->row_elems), set_rows_task, &j);
    return PKV_OK;
}

static void softmax_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_softmax_args *a = j->args;
    const float *x = pkv_cpu_ptr(a->x);
    float *y = pkv_cpu_ptr(a->y);
    int64_t r0, r1;
    range(a->n_rows, ti, n_tasks, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * a->row_len;
        float *yr = y + r * a->row_len;
        float mx = -INFINITY;
        for (int64_t k = 0; k < a->row_len; k++) mx = fmaxf(mx, xr[k]);
        double sum = 0;
        for (int64_t k = 0; k < a->row_len; k++) {
            const float e = expf(xr[k] - mx);
            yr[k] = e;
            sum += e;
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t k = 0; k < a->row_len; k++) yr[k] *= inv;
    }
}

static pkv_status cpu_softmax(void *ctx, const pkv_k_softmax_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "softmax", "x", a->x, 4));
    TRY(aligned(c, "softmax", "y", a->y, 4));
    rows_job j = {a, a->n_rows};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n_rows, (double)a->n_rows * (double)a->row_len * 8), softmax_task, &j);
    return PKV_OK;
}

static void argmax_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_argmax_args *a = j->args;
    const float *x = pkv_cpu_ptr(a->x);
    int32_t *out = pkv_cpu_ptr(a->out);
    int64_t r0, r1;
    range(a->n_rows, ti, n_tasks, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * a->row_len;
        int64_t best = 0;
        for (int64_t k = 1; k < a->row_len; k++)
            if (xr[k] > xr[best]) best = k;
        out[r] = (int32_t)best;
    }
}

static pkv_status cpu_argmax(void *ctx, const pkv_k_argmax_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "argmax", "x", a->x, 4));
    TRY(aligned(c, "argmax", "out", a->out, 4));
    rows_job j = {a, a->n_rows};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n_rows, (double)a->n_rows * (double)a->row_len), argmax_task, &j);
    return PKV_OK;
}

/* ------------------------------------------------------- recurrent layers */

/* Sequence s of a recurrent kernel's meta (kernel-list.h): 0 = bad range (skip), 1 =
 * bad slot (zero output rows), 2 = run it. */
static int rec_seq(const int32_t *meta, int n_seq, int64_t n_tok, int64_t n_slots, int s, int64_t *lo, int64_t *hi,
                   int64_t *slot) {
    *lo = meta[s];
    *hi = meta[s + 1];
    *slot = meta[n_seq + 1 + s];
    if (*lo < 0 || *hi < *lo || *hi > n_tok) return 0;
    return *slot >= 0 && *slot < n_slots ? 2 : 1;
}

/* Channels per block of the conv: a block's windows stay in L1 while the
 * block walks the sequence's token rows. */
#define CONV_BLOCK 64

static void conv_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_ssm_conv_args *a = j->args;
    const float *x = pkv_cpu_ptr(a->x), *w = pkv_cpu_ptr(a->w);
    float *y = pkv_cpu_ptr(a->y);
    const int32_t *meta = pkv_cpu_ptr(a->meta);
    const int64_t C = a->channels, nb = (C + CONV_BLOCK - 1) / CONV_BLOCK;
    const int K = a->d_conv;
    int64_t b0, b1;
    range((int64_t)a->n_seq * nb, ti, n_tasks, &b0, &b1);
    for (int64_t item = b0; item < b1; item++) {
        const int s = (int)(item / nb);
        const int64_t c0 = item % nb * CONV_BLOCK, c1 = PKV_MIN(c0 + CONV_BLOCK, C);
        int64_t lo, hi, slot;
        const int ok = rec_seq(meta, a->n_seq, a->n_tok, a->n_slots, s, &lo, &hi, &slot);
        if (ok == 0) continue;
        if (ok == 1) {
            for (int64_t t = lo; t < hi; t++) memset(y + t * C + c0, 0, (size_t)(c1 - c0) * sizeof(float));
            continue;
        }
        float *st = (float *)(void *)((uint8_t *)pkv_cpu_ptr(a->state) + (size_t)slot * a->state_stride);
        /* win[j][c - c0]: channel c's input j steps into its window (oldest first).
         * x[t][c] is read before y[t][c] is written, so y may alias x. */
        float win[PKV_SSM_CONV_MAX - 1][CONV_BLOCK];
        for (int jj = 0; jj < K - 1; jj++)
            for (int64_t c = c0; c < c1; c++) win[jj][c - c0] = st[(size_t)jj * C + c];
        for (int64_t t = lo; t < hi; t++) {
            for (int64_t c = c0; c < c1; c++) {
                const float *wc = w + c * K;
                const float xin = x[t * C + c];
                /* taps oldest to newest, the token itself last: the order of every backend */
                float acc = 0.0f;
                for (int jj = 0; jj < K - 1; jj++) acc += wc[jj] * win[jj][c - c0];
                acc += wc[K - 1] * xin;
                for (int jj = 0; jj + 1 < K - 1; jj++) win[jj][c - c0] = win[jj + 1][c - c0];
                win[K - 2][c - c0] = xin;
                y[t * C + c] = a->silu ? acc / (1.0f + expf(-acc)) : acc;
            }
        }
        for (int jj = 0; jj < K - 1; jj++)
            for (int64_t c = c0; c < c1; c++) st[(size_t)jj * C + c] = win[jj][c - c0];
    }
}

static pkv_status cpu_ssm_conv(void *ctx, const pkv_k_ssm_conv_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "ssm_conv", "x", a->x, 4));
    TRY(aligned(c, "ssm_conv", "w", a->w, 4));
    TRY(aligned(c, "ssm_conv", "y", a->y, 4));
    TRY(aligned(c, "ssm_conv", "state", a->state, 4));
    TRY(aligned(c, "ssm_conv", "meta", a->meta, 4));
    const int64_t items = (int64_t)a->n_seq * ((a->channels + CONV_BLOCK - 1) / CONV_BLOCK);
    rows_job j = {a, items};
    pkv_pool_run(c->pool, n_tasks_for(c, items, (double)a->n_tok * (double)a->channels * a->d_conv), conv_task, &j);
    return PKV_OK;
}

typedef struct {
    const pkv_k_delta_net_args *a;
    float *scratch; /* [n_tasks][2 d_v] */
} dn_job;

/* One (sequence, v head) at a time, tokens in order, the state updated in place
 * in f32. Every value column j of the state sees the same operations in the same
 * order (sums over the key dim i ascending) whatever the batch, the thread count or
 * how a sequence's tokens are split over calls. The j loops are contiguous (the
 * slot is [d_k][d_v]) and vectorize. */
static void dn_task(int ti, int n_tasks, void *arg) {
    const dn_job *jb = arg;
    const pkv_k_delta_net_args *a = jb->a;
    const int dk = a->d_k, dv = a->d_v, hv = a->n_v_heads, hk = a->n_k_heads;
    const uint8_t *q = pkv_cpu_ptr(a->q), *k = pkv_cpu_ptr(a->k), *v = pkv_cpu_ptr(a->v);
    const float *g = pkv_cpu_ptr(a->g), *beta = pkv_cpu_ptr(a->beta);
    float *out = pkv_cpu_ptr(a->out);
    const int32_t *meta = pkv_cpu_ptr(a->meta);
    float *kv = jb->scratch + (size_t)ti * 2 * dv, *o = kv + dv;
    int64_t i0, i1;
    range((int64_t)a->n_seq * hv, ti, n_tasks, &i0, &i1);
    for (int64_t item = i0; item < i1; item++) {
        const int s = (int)(item / hv), h = (int)(item % hv);
        const int kh = a->grouped ? h / (hv / hk) : h % hk;
        int64_t lo, hi, slot;
        const int ok = rec_seq(meta, a->n_seq, a->n_tok, a->n_slots, s, &lo, &hi, &slot);
        if (ok == 0) continue;
        if (ok == 1) {
            for (int64_t t = lo; t < hi; t++) memset(out + (t * hv + h) * dv, 0, (size_t)dv * sizeof(float));
            continue;
        }
        float *S = (float *)(void *)((uint8_t *)pkv_cpu_ptr(a->state) + (size_t)slot * a->state_stride) + (size_t)h * dk * dv;
        for (int64_t t = lo; t < hi; t++) {
            const float *qt = (const float *)(const void *)(q + (size_t)t * a->q_stride) + (size_t)kh * dk;
            const float *kt = (const float *)(const void *)(k + (size_t)t * a->k_stride) + (size_t)kh * dk;
            const float *vt = (const float *)(const void *)(v + (size_t)t * a->v_stride) + (size_t)h * dv;
            const float decay = expf(g[t * hv + h]), b = beta[t * hv + h];
            for (int jj = 0; jj < dv; jj++) kv[jj] = 0.0f;
            for (int i = 0; i < dk; i++) {
                float *row = S + (size_t)i * dv;
                const float ki = kt[i];
                for (int jj = 0; jj < dv; jj++) {
                    const float sv = row[jj] * decay;
                    row[jj] = sv;
                    kv[jj] += sv * ki;
                }
            }
            for (int jj = 0; jj < dv; jj++) {
                kv[jj] = b * (vt[jj] - kv[jj]); /* now the delta d_j */
                o[jj] = 0.0f;
            }
            for (int i = 0; i < dk; i++) {
                float *row = S + (size_t)i * dv;
                const float ki = kt[i], qi = qt[i];
                for (int jj = 0; jj < dv; jj++) {
                    const float sv = row[jj] + ki * kv[jj];
                    row[jj] = sv;
                    o[jj] += sv * qi;
                }
            }
            float *ot = out + (t * hv + h) * dv;
            for (int jj = 0; jj < dv; jj++) ot[jj] = o[jj] * a->scale;
        }
    }
}

static pkv_status cpu_delta_net(void *ctx, const pkv_k_delta_net_args *a) {
    pkv_cpu_ctx *c = ctx;
    const char *names[] = {"q", "k", "v", "g", "beta", "out", "state", "meta"};
    const pkv_tref refs[] = {a->q, a->k, a->v, a->g, a->beta, a->out, a->state, a->meta};
    for (int i = 0; i < 8; i++) TRY(aligned(c, "delta_net", names[i], refs[i], 4));
    const int64_t items = (int64_t)a->n_seq * a->n_v_heads;
    const int n_tasks = n_tasks_for(c, items, (double)a->n_tok * a->n_v_heads * (double)a->d_k * a->d_v * 4);
    dn_job j = {a, pkv_malloc((size_t)n_tasks * 2 * (size_t)a->d_v * sizeof(float))};
    if (!j.scratch) return pkv_err(PKV_ERR_NOMEM, "%s: kernel delta_net: no memory for %d x %d floats of scratch", c->name,
                                   n_tasks, 2 * a->d_v);
    pkv_pool_run(c->pool, n_tasks, dn_task, &j);
    pkv_free(j.scratch);
    return PKV_OK;
}

typedef struct {
    const pkv_k_ssm_scan_args *a;
    void (*scan)(float *S, int nr, int ds, float decay, const float *dx, const float *B, const float *C, float *o);
} scan_job;

/* Rows of a head per call of the path's scan: dx for them on the stack. */
#define SCAN_ROWS 64

/* One (sequence, head) at a time, tokens in order, the state updated in place in
 * f32: every state row sees the same operations in the same order (the path's scan,
 * cpu-dots.h) whatever the batch, the thread count or how a sequence's tokens are
 * split over calls. Prefill keeps a head's state (head_dim x d_state floats, 32 KiB
 * for Mamba-2's 64 x 128) in cache across the sequence's tokens. */
static void scan_task(int ti, int n_tasks, void *arg) {
    const scan_job *j = arg;
    const pkv_k_ssm_scan_args *a = j->a;
    const int nh = a->n_head, hd = a->head_dim, ds = a->d_state, per_group = a->n_head / a->n_group;
    const uint8_t *x = pkv_cpu_ptr(a->x), *B = pkv_cpu_ptr(a->B), *C = pkv_cpu_ptr(a->C);
    const float *dt = pkv_cpu_ptr(a->dt), *dt_bias = pkv_cpu_ptr(a->dt_bias), *A = pkv_cpu_ptr(a->A);
    const float *D = a->D.buf ? pkv_cpu_ptr(a->D) : NULL;
    float *y = pkv_cpu_ptr(a->y);
    const int32_t *meta = pkv_cpu_ptr(a->meta);
    int64_t i0, i1;
    range((int64_t)a->n_seq * nh, ti, n_tasks, &i0, &i1);
    for (int64_t item = i0; item < i1; item++) {
        const int s = (int)(item / nh), h = (int)(item % nh), g = h / per_group;
        int64_t lo, hi, slot;
        const int ok = rec_seq(meta, a->n_seq, a->n_tok, a->n_slots, s, &lo, &hi, &slot);
        if (ok == 0) continue;
        if (ok == 1) {
            for (int64_t t = lo; t < hi; t++) memset(y + (t * nh + h) * hd, 0, (size_t)hd * sizeof(float));
            continue;
        }
        float *S = (float *)(void *)((uint8_t *)pkv_cpu_ptr(a->state) + (size_t)slot * a->state_stride) + (size_t)h * hd * ds;
        const float skip = D ? D[h] : 0.0f;
        for (int64_t t = lo; t < hi; t++) {
            const float *xt = (const float *)(const void *)(x + (size_t)t * a->x_stride) + (size_t)h * hd;
            const float *Bt = (const float *)(const void *)(B + (size_t)t * a->B_stride) + (size_t)g * ds;
            const float *Ct = (const float *)(const void *)(C + (size_t)t * a->C_stride) + (size_t)g * ds;
            const float v = dt[t * nh + h] + dt_bias[h];
            const float d = v > 20.0f ? v : log1pf(expf(v)), decay = expf(d * A[h]);
            float *yt = y + (t * nh + h) * hd;
            for (int r0 = 0; r0 < hd; r0 += SCAN_ROWS) {
                const int nr = PKV_MIN(SCAN_ROWS, hd - r0);
                float dx[SCAN_ROWS];
                for (int r = 0; r < nr; r++) dx[r] = d * xt[r0 + r];
                j->scan(S + (size_t)r0 * ds, nr, ds, decay, dx, Bt, Ct, yt + r0);
            }
            for (int i = 0; i < hd; i++) yt[i] += skip * xt[i];
        }
    }
}

static pkv_status cpu_ssm_scan(void *ctx, const pkv_k_ssm_scan_args *a) {
    pkv_cpu_ctx *c = ctx;
    const char *names[] = {"x", "B", "C", "dt", "dt_bias", "A", "D", "y", "state", "meta"};
    const pkv_tref refs[] = {a->x, a->B, a->C, a->dt, a->dt_bias, a->A, a->D, a->y, a->state, a->meta};
    for (int i = 0; i < 10; i++)
        if (refs[i].buf) TRY(aligned(c, "ssm_scan", names[i], refs[i], 4));
    const pkv_cpu_dots *d = dots_select();
    scan_job j = {a, d->scan ? d->scan : pkv_cpu_dots_generic.scan};
    const int64_t items = (int64_t)a->n_seq * a->n_head;
    pkv_pool_run(c->pool, n_tasks_for(c, items, (double)a->n_tok * a->n_head * (double)a->head_dim * a->d_state * 4), scan_task,
                 &j);
    return PKV_OK;
}

static void l2_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_l2_norm_args *a = j->args;
    const uint8_t *x = pkv_cpu_ptr(a->x);
    uint8_t *y = pkv_cpu_ptr(a->y);
    int64_t r0, r1;
    range(a->n * a->n_heads, ti, n_tasks, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = r / a->n_heads, h = r % a->n_heads, d = a->head_dim;
        const float *xr = (const float *)(const void *)(x + (size_t)t * a->x_stride) + h * d;
        float *yr = (float *)(void *)(y + (size_t)t * a->y_stride) + h * d;
        /* as rms_norm: 8 partial sums in double, a fixed combination */
        double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = 0;
        for (; i + 8 <= d; i += 8)
            for (int u = 0; u < 8; u++) p[u] += (double)xr[i + u] * xr[i + u];
        for (int u = 0; i < d; i++, u++) p[u] += (double)xr[i] * xr[i];
        const double ss = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
        const float inv = (float)(1.0 / sqrt(ss + (double)a->eps));
        for (i = 0; i < d; i++) yr[i] = xr[i] * inv;
    }
}

static pkv_status cpu_l2_norm(void *ctx, const pkv_k_l2_norm_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "l2_norm", "x", a->x, 4));
    TRY(aligned(c, "l2_norm", "y", a->y, 4));
    rows_job j = {a, a->n * a->n_heads};
    pkv_pool_run(c->pool, n_tasks_for(c, j.n, (double)j.n * (double)a->head_dim), l2_task, &j);
    return PKV_OK;
}

static void unary_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_unary_args *a = j->args;
    const float *x = pkv_cpu_ptr(a->x);
    const float *bias = a->bias.buf ? pkv_cpu_ptr(a->bias) : NULL, *mul = a->mul.buf ? pkv_cpu_ptr(a->mul) : NULL;
    float *y = pkv_cpu_ptr(a->y);
    int64_t i0, i1;
    range(a->n, ti, n_tasks, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        float v = x[i];
        if (bias) v += bias[i % a->bias_len];
        switch (a->op) {
        case PKV_UNARY_SIGMOID: v = 1.0f / (1.0f + expf(-v)); break;
        case PKV_UNARY_SOFTPLUS: v = v > 20.0f ? v : log1pf(expf(v)); break;
        case PKV_UNARY_SILU: v = v / (1.0f + expf(-v)); break;
        case PKV_UNARY_GELU: {
            /* as the reference: x * sigmoid(2t), no cancellation for t < 0 */
            const float t = 0.7978845608f * (v + 0.044715f * v * v * v), e = expf(-2.0f * fabsf(t));
            v = t >= 0 ? v / (1.0f + e) : v * e / (1.0f + e);
            break;
        }
        case PKV_UNARY_GELU_ERF: v = 0.5f * v * erfcf(-v * 0.70710678f); break;
        case PKV_UNARY_RELU_SQR: v = v > 0.0f ? v * v : 0.0f; break;
        case PKV_UNARY_ID: break;
        }
        y[i] = mul ? v * mul[i % a->mul_len] : v;
    }
}

static pkv_status cpu_unary(void *ctx, const pkv_k_unary_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "unary", "x", a->x, 4));
    TRY(aligned(c, "unary", "y", a->y, 4));
    if (a->bias.buf) TRY(aligned(c, "unary", "bias", a->bias, 4));
    if (a->mul.buf) TRY(aligned(c, "unary", "mul", a->mul, 4));
    rows_job j = {a, a->n};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n / 1024 + 1, (double)a->n * 8), unary_task, &j);
    return PKV_OK;
}

static void moe_route_task(int ti, int n_tasks, void *arg) {
    const rows_job *j = arg;
    const pkv_k_moe_route_args *a = j->args;
    int64_t r0, r1;
    range(a->n, ti, n_tasks, &r0, &r1);
    pkv_ref_moe_route(a, pkv_cpu_ptr(a->logits), a->bias.buf ? pkv_cpu_ptr(a->bias) : NULL, pkv_cpu_ptr(a->sel),
                      pkv_cpu_ptr(a->w), r0, r1);
}

/* The reference's arithmetic (in double: the routing decides, and costs little). */
static pkv_status cpu_moe_route(void *ctx, const pkv_k_moe_route_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "moe_route", "logits", a->logits, 4));
    if (a->bias.buf) TRY(aligned(c, "moe_route", "bias", a->bias, 4));
    TRY(aligned(c, "moe_route", "sel", a->sel, 4));
    TRY(aligned(c, "moe_route", "w", a->w, 4));
    rows_job j = {a, a->n};
    pkv_pool_run(c->pool, n_tasks_for(c, a->n, (double)a->n * a->n_expert * a->k), moe_route_task, &j);
    return PKV_OK;
}

static pkv_status cpu_moe_combine(void *ctx, const pkv_k_moe_combine_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "moe_combine", "out", a->out, 4));
    TRY(aligned(c, "moe_combine", "y", a->y, 4));
    TRY(aligned(c, "moe_combine", "rows", a->rows, 4));
    TRY(aligned(c, "moe_combine", "w", a->w, 4));
    pkv_ref_moe_combine(a, pkv_cpu_ptr(a->out), pkv_cpu_ptr(a->y), pkv_cpu_ptr(a->rows), pkv_cpu_ptr(a->w));
    return PKV_OK;
}

/* -------------------------------------------------------------- attention */

/* A query's visible tokens are cut into fixed spans of ATT_SPAN tokens at
 * absolute positions (span c covers [c*ATT_SPAN, (c+1)*ATT_SPAN)); each span
 * yields an exact online-softmax partial (running max m, sum l, weighted value
 * sum a), and the partials are folded in span order (att_fold). The cut depends
 * only on the query's own q_len, so a query gets the same operations whether
 * its spans run in one task or in many (flash-decoding), whatever the thread
 * count and whoever shares the call. Within a span, scores are taken in chunks
 * of ATT_CHUNK tokens, also at absolute positions: the running max moves once
 * per chunk and the value sum keeps the output in registers across the chunk.
 *
 * Queries of one sequence that follow each other in the call are taken in
 * blocks (prefill): each K/V row is read once per block, scored against all the
 * block's query heads (the same per-row operations as alone), and each query
 * only uses the tokens below its own q_len. */
#define ATT_PREFETCH 4 /* tokens ahead */
#define ATT_CHUNK PKV_ATT_TOKENS /* tokens scored before their values are summed */
#define ATT_SPAN 256    /* tokens per partial (a multiple of ATT_CHUNK) */
#define ATT_BLOCK_ROWS 32 /* query rows (queries x group heads) per block, about */
#define ATT_MAX_BLOCK 16 /* queries per block at most */

typedef struct {
    int i0, nq;   /* query rows i0 .. i0+nq, one sequence */
    int n_span;   /* spans of the longest of them */
    int64_t part; /* first partial of this block (split mode): [query][span][head] */
} att_block;

typedef struct {
    const pkv_k_attention_args *a;
    const pkv_cpu_att *att;
    const float *q;
    const float *sinks; /* [n_head] or NULL */
    const int32_t *q_win; /* [n_q] or NULL (kernel-list.h) */
    const uint8_t *k, *v;
    const int32_t *meta;
    float *out;
    att_block *blocks;
    int n_blocks, max_spans;
    int kv_per_item; /* KV heads per work item */
    bool split;      /* one item per (block, span, KV heads): partials, then a merge */
    float *part;     /* split: [..][n_head][dv + 2] partials (m, l, a) */
    float *scratch;  /* [n_tasks][per_task] */
    size_t per_task;
    int64_t n_items;
} att_job;

/* The visible length of query i (0: nothing visible or a bad sequence), its
 * sequence's first page-table entry and page count. */
static int64_t att_len(const att_job *j, int i, int64_t *lo, int64_t *np) {
    const pkv_k_attention_args *a = j->a;
    const int32_t *q_seq = j->meta, *q_len = j->meta + a->n_q, *indptr = j->meta + 2 * (size_t)a->n_q;
    const int s = q_seq[i];
    if (s < 0 || s >= a->n_seq || indptr[s] < 0 || indptr[s] > indptr[s + 1] || indptr[s + 1] > a->meta_pages) return 0;
    *lo = indptr[s];
    *np = indptr[s + 1] - indptr[s];
    const int64_t len = PKV_MIN((int64_t)q_len[i], *np * a->page_size);
    return len > 0 ? len : 0;
}

/* state (M, L, A) <- state folded with the partial (m, l, a), exactly as online
 * softmax would: one function (not inlined) so that every caller rounds alike. */
__attribute__((noinline)) static void att_fold(float *M, float *L, float *A, float m, float l, const float *pa, int dv) {
    if (m == -INFINITY) return; /* the span saw no token (skipped pages) */
    const float mx = m > *M ? m : *M;
    const float so = expf(*M - mx), sn = expf(m - mx); /* so = 0 on the first partial */
    *L = *L * so + l * sn;
    for (int d = 0; d < dv; d++) A[d] = A[d] * so + pa[d] * sn;
    *M = mx;
}

/* A sink: one more logit (value zero) in the softmax of a head that saw a token. */
__attribute__((noinline)) static void att_sink(float *M, float *L, float *A, float sink, int dv) {
    if (*M == -INFINITY) return; /* no token seen: the output stays zero */
    const float mx = sink > *M ? sink : *M;
    const float so = expf(*M - mx), sn = expf(sink - mx);
    *L = *L * so + sn;
    for (int d = 0; d < dv; d++) A[d] = A[d] * so;
    *M = mx;
}

__attribute__((noinline)) static void att_finish(float *o, float L, const float *A, int dv) {
    const float inv = L > 0 ? 1.0f / L : 0.0f;
    for (int d = 0; d < dv; d++) o[d] = A[d] * inv;
}

/* Per-task scratch for blocks of up to nq queries and kv_per_item KV heads. */
static size_t att_scratch_floats(const pkv_k_attention_args *a, int nq, int kv_per_item) {
    const size_t rows = (size_t)nq * (size_t)kv_per_item * (size_t)(a->n_head / a->n_kv);
    /* qbuf, acc, fold A, m, l, fold M, fold L, p[ATT_CHUNK]; token pointers */
    return rows * ((size_t)a->dk + 2 * (size_t)a->dv + 4 + ATT_CHUNK) +
           (size_t)kv_per_item * ATT_CHUNK * (size_t)(a->dk + a->dv) +
           2 * (ATT_SPAN + ATT_PREFETCH) * (sizeof(void *) / sizeof(float) + 1) + 32;
}

/* Softmax bookkeeping for row r's chunk of n scores p, then its values. */
static void att_flush_row(const att_job *j, float *acc, float *m, float *l, float *p, const float *const *vp, int n) {
    const pkv_k_attention_args *a = j->a;
    float mx[4] = {p[0], p[0], p[0], p[0]}; /* four chains (max is exact in any order) */
    for (int c = 1; c < n; c++) mx[c & 3] = p[c] > mx[c & 3] ? p[c] : mx[c & 3];
    const float m01 = mx[0] > mx[1] ? mx[0] : mx[1], m23 = mx[2] > mx[3] ? mx[2] : mx[3];
    const float cmax = m01 > m23 ? m01 : m23;
    if (cmax > *m) {
        const float corr = expf(*m - cmax); /* 0 on the first chunk */
        *l *= corr;
        for (int d = 0; d < a->dv; d++) acc[d] *= corr;
        *m = cmax;
    }
    *l += j->att->softexp(p, n, *m);
    j->att->vsum(acc, p, vp, n, a->dv);
}

/* Block b, spans [c0, c1), KV heads [k0, k0 + nk). Rows r = (kvh - k0, query,
 * group head). Split mode writes each span's partial; otherwise the partials are
 * folded here and the outputs written. */
static void att_run(const att_job *j, int bi, int c0, int c1, int k0, int nk, float *sc) {
    const pkv_k_attention_args *a = j->a;
    const att_block *blk = &j->blocks[bi];
    const int group = a->n_head / a->n_kv, nq = blk->nq, qg = nq * group, rows = nk * qg;
    const int32_t *pages = j->meta + 2 * (size_t)a->n_q + a->n_seq + 1;
    /* K and V rows other than f32 are widened to f32 per chunk (f16, or quantized
     * blocks dequantized as they are read: the pool itself is never copied) */
    const pkv_type kt = a->k_type, vt = a->v_type;
    const bool kwide = kt != PKV_TYPE_F32, vwide = vt != PKV_TYPE_F32;
    const size_t krow = pkv_type_row_bytes(kt, (size_t)a->dk), vrow = pkv_type_row_bytes(vt, (size_t)a->dv);
    /* one token, all KV heads; v_in_k (one KV head): V is the head of the K row */
    const size_t kslab = krow * a->n_kv, vslab = a->v_in_k ? kslab : vrow * a->n_kv;
    float *qbuf = sc, *acc = qbuf + (size_t)rows * a->dk, *FA = acc + (size_t)rows * a->dv;
    float *m = FA + (size_t)rows * a->dv, *l = m + rows, *FM = l + rows, *FL = FM + rows, *p = FL + rows;
    float *kf = p + (size_t)rows * ATT_CHUNK, *vf = kf + (size_t)nk * ATT_CHUNK * a->dk; /* the chunk's rows as f32 */
    const uint8_t **tk = (const uint8_t **)(void *)(((uintptr_t)(vf + (size_t)nk * ATT_CHUNK * a->dv) + 15) & ~(uintptr_t)15);
    const uint8_t **tv = tk + ATT_SPAN + ATT_PREFETCH;
    int64_t len[64], start[64], lo = 0, np = 0, len_max = 0, start_min = INT64_MAX;
    for (int b = 0; b < nq; b++) {
        len[b] = att_len(j, blk->i0 + b, &lo, &np);
        len_max = PKV_MAX(len_max, len[b]);
        /* a sliding window: the query's last `window` tokens, counted back from
         * q_win when given; a chunked layer: its chunk (kernel-list.h) */
        start[b] = pkv_att_first(len[b], j->q_win ? j->q_win[blk->i0 + b] : len[b], a->window, a->chunk);
        start_min = PKV_MIN(start_min, start[b]);
    }
    for (int kk = 0; kk < nk; kk++)
        for (int b = 0; b < nq; b++)
            memcpy(qbuf + ((size_t)kk * qg + (size_t)b * group) * a->dk,
                   j->q + ((size_t)(blk->i0 + b) * a->n_head + (size_t)(k0 + kk) * group) * a->dk,
                   (size_t)group * a->dk * sizeof(float));
    for (int r = 0; r < rows; r++) {
        FM[r] = -INFINITY;
        FL[r] = 0;
    }
    memset(FA, 0, (size_t)rows * a->dv * sizeof(float));
    for (int c = c0; c < c1; c++) {
        const int64_t t0 = (int64_t)c * ATT_SPAN, t1 = (int64_t)(c + 1) * ATT_SPAN <= start_min ? t0 /* before every window */
                                                                                          : PKV_MIN(t0 + ATT_SPAN, len_max);
        /* token slabs of the span and the few after it (NULL: page outside the pool) */
        const int64_t t_pf = PKV_MIN(t1 + ATT_PREFETCH, np * a->page_size);
        for (int64_t t = t0; t < t_pf; t++) {
            const int32_t page = pages[lo + t / a->page_size];
            const uint8_t *ks = NULL, *vs = NULL;
            if (page >= 0 && page < a->n_pages) {
                const size_t slot = (size_t)page * a->page_size + (size_t)(t % a->page_size);
                ks = j->k + slot * kslab + (size_t)k0 * krow;
                vs = j->v + slot * vslab + (size_t)k0 * vrow;
            }
            tk[t - t0] = ks;
            tv[t - t0] = vs;
        }
        for (int r = 0; r < rows; r++) {
            m[r] = -INFINITY;
            l[r] = 0;
        }
        memset(acc, 0, (size_t)rows * a->dv * sizeof(float));
        for (int64_t u0 = t0; u0 < t1; u0 += ATT_CHUNK) {
            const int64_t u1 = PKV_MIN(u0 + ATT_CHUNK, t1);
            /* the chunk's rows of our KV heads, widened to f32 in memory order
             * (kf/vf: [token][head][d]); the rows of the token ATT_PREFETCH
             * ahead prefetched, across pages too (pages are scattered: from
             * DRAM, decode at depth 4096 took 1.93 ms per layer without, 1.63
             * with; 16 tokens ahead was worse) */
            int n = 0;
            const uint8_t *krs[ATT_CHUNK], *vrs[ATT_CHUNK];
            for (int64_t t = u0; t < u1; t++) {
                const uint8_t *ks = tk[t - t0];
                if (t + ATT_PREFETCH < t_pf && tk[t + ATT_PREFETCH - t0]) {
                    const uint8_t *pk = tk[t + ATT_PREFETCH - t0], *pv = tv[t + ATT_PREFETCH - t0];
                    for (size_t o = 0; o < (size_t)nk * krow; o += 64) __builtin_prefetch(pk + o);
                    for (size_t o = 0; o < (size_t)nk * vrow; o += 64) __builtin_prefetch(pv + o);
                }
                if (!ks) continue;
                krs[n] = ks;
                vrs[n] = tv[t - t0];
                /* our heads' rows of a token are adjacent: one call each */
                if (kt == PKV_TYPE_F16)
                    j->att->cvt((const uint16_t *)(const void *)ks, kf + (size_t)n * nk * a->dk, (int64_t)nk * a->dk);
                else if (kwide)
                    j->att->deq(kt, ks, kf + (size_t)n * nk * a->dk, (int64_t)nk * a->dk);
                if (vt == PKV_TYPE_F16)
                    j->att->cvt((const uint16_t *)(const void *)vrs[n], vf + (size_t)n * nk * a->dv, (int64_t)nk * a->dv);
                else if (vwide)
                    j->att->deq(vt, vrs[n], vf + (size_t)n * nk * a->dv, (int64_t)nk * a->dv);
                n++;
            }
            if (!n) continue;
            for (int kk = 0; kk < nk; kk++) {
                const float *kp[ATT_CHUNK], *vp[ATT_CHUNK];
                for (int x = 0; x < n; x++) {
                    kp[x] = kwide ? kf + ((size_t)x * nk + kk) * a->dk : (const float *)(const void *)(krs[x] + kk * krow);
                    vp[x] = vwide ? vf + ((size_t)x * nk + kk) * a->dv : (const float *)(const void *)(vrs[x] + kk * vrow);
                }
                for (int x = n; x < ATT_CHUNK; x++) kp[x] = kp[0];
                j->att->scores(kp, qbuf + (size_t)kk * qg * a->dk, a->dk, qg, a->dk, a->scale, p + (size_t)kk * qg * ATT_CHUNK,
                               ATT_CHUNK);
                if (a->softcap > 0) /* Gemma 2: cap * tanh(s / cap), the same libm call on every path */
                    for (int r = kk * qg; r < (kk + 1) * qg; r++)
                        for (int x = 0; x < n; x++)
                            p[(size_t)r * ATT_CHUNK + x] = a->softcap * tanhf(p[(size_t)r * ATT_CHUNK + x] / a->softcap);
                /* query b sees the chunk's tokens with start[b] <= t < len[b]: the
                 * scores from index xb on, nb of them; skipped pages come before or
                 * after them within the chunk in token order, so count its tokens */
                for (int b = 0; b < nq; b++) {
                    int nb = 0, xb = 0;
                    for (int64_t t = u0; t < PKV_MIN(u1, len[b]); t++) {
                        if (!tk[t - t0]) continue;
                        if (t < start[b]) xb++;
                        else nb++;
                    }
                    if (!nb) continue;
                    for (int g = 0; g < group; g++) {
                        const int r = kk * qg + b * group + g;
                        att_flush_row(j, acc + (size_t)r * a->dv, &m[r], &l[r], p + (size_t)r * ATT_CHUNK + xb, vp + xb, nb);
                    }
                }
            }
        }
        /* the span's partials */
        for (int kk = 0; kk < nk; kk++)
            for (int b = 0; b < nq; b++) {
                if ((int64_t)c * ATT_SPAN >= len[b]) continue;
                for (int g = 0; g < group; g++) {
                    const int r = kk * qg + b * group + g;
                    if (j->split) {
                        float *pp = j->part + ((size_t)blk->part + ((size_t)b * j->max_spans + c) * a->n_head +
                                               (size_t)(k0 + kk) * group + g) * (size_t)(a->dv + 2);
                        pp[0] = m[r];
                        pp[1] = l[r];
                        memcpy(pp + 2, acc + (size_t)r * a->dv, (size_t)a->dv * sizeof(float));
                    } else {
                        att_fold(&FM[r], &FL[r], FA + (size_t)r * a->dv, m[r], l[r], acc + (size_t)r * a->dv, a->dv);
                    }
                }
            }
    }
    if (j->split) return;
    for (int kk = 0; kk < nk; kk++)
        for (int b = 0; b < nq; b++)
            for (int g = 0; g < group; g++) {
                const int r = kk * qg + b * group + g, h = (k0 + kk) * group + g;
                if (j->sinks) att_sink(&FM[r], &FL[r], FA + (size_t)r * a->dv, j->sinks[h], a->dv);
                att_finish(j->out + ((size_t)(blk->i0 + b) * a->n_head + (size_t)h) * a->dv, FL[r], FA + (size_t)r * a->dv,
                           a->dv);
            }
}

static void att_task(int ti, int n_tasks, void *arg) {
    const att_job *j = arg;
    const int kv_items = (j->a->n_kv + j->kv_per_item - 1) / j->kv_per_item;
    float *sc = j->scratch + (size_t)ti * j->per_task;
    int64_t i0, i1;
    range(j->n_items, ti, n_tasks, &i0, &i1);
    for (int64_t it = i0; it < i1; it++) {
        const int kv = (int)(it % kv_items), k0 = kv * j->kv_per_item;
        const int nk = PKV_MIN(j->kv_per_item, j->a->n_kv - k0);
        if (j->split) {
            const int64_t bc = it / kv_items;
            const int bi = (int)(bc / j->max_spans), c = (int)(bc % j->max_spans);
            if (c < j->blocks[bi].n_span) att_run(j, bi, c, c + 1, k0, nk, sc);
        } else {
            att_run(j, (int)(it / kv_items), 0, j->blocks[it / kv_items].n_span, k0, nk, sc);
        }
    }
}

/* Split mode: fold each (query, head)'s span partials in span order. */
static void att_merge_task(int ti, int n_tasks, void *arg) {
    const att_job *j = arg;
    const pkv_k_attention_args *a = j->a;
    float *A = j->scratch + (size_t)ti * j->per_task;
    int64_t i0, i1;
    range(j->n_blocks, ti, n_tasks, &i0, &i1);
    for (int64_t bi = i0; bi < i1; bi++) {
        const att_block *blk = &j->blocks[bi];
        for (int b = 0; b < blk->nq; b++) {
            int64_t lo, np;
            const int64_t len = att_len(j, blk->i0 + b, &lo, &np);
            const int ns = (int)((len + ATT_SPAN - 1) / ATT_SPAN);
            for (int h = 0; h < a->n_head; h++) {
                float M = -INFINITY, L = 0;
                memset(A, 0, (size_t)a->dv * sizeof(float));
                for (int c = 0; c < ns; c++) {
                    const float *pp =
                        j->part + ((size_t)blk->part + ((size_t)b * j->max_spans + c) * a->n_head + h) * (size_t)(a->dv + 2);
                    att_fold(&M, &L, A, pp[0], pp[1], pp + 2, a->dv);
                }
                if (j->sinks) att_sink(&M, &L, A, j->sinks[h], a->dv);
                att_finish(j->out + ((size_t)(blk->i0 + b) * a->n_head + h) * a->dv, L, A, a->dv);
            }
        }
    }
}

static pkv_status cpu_attention(void *ctx, const pkv_k_attention_args *a) {
    pkv_cpu_ctx *c = ctx;
    TRY(aligned(c, "attention", "q", a->q, 4));
    TRY(aligned(c, "attention", "k", a->k, a->k_type == PKV_TYPE_F32 ? 4 : 2));
    TRY(aligned(c, "attention", "v", a->v, a->v_type == PKV_TYPE_F32 ? 4 : 2));
    TRY(aligned(c, "attention", "out", a->out, 4));
    TRY(aligned(c, "attention", "meta", a->meta, 4));
    if (a->sinks.buf) TRY(aligned(c, "attention", "sinks", a->sinks, 4));
    if (a->q_win.buf) TRY(aligned(c, "attention", "q_win", a->q_win, 4));
    if (a->n_q <= 0) return PKV_OK;
    att_job j = {0};
    j.a = a;
    j.att = pkv_cpu_att_for(dots_select()->name);
    j.q = pkv_cpu_ptr(a->q);
    j.sinks = a->sinks.buf ? pkv_cpu_ptr(a->sinks) : NULL;
    j.q_win = a->q_win.buf ? pkv_cpu_ptr(a->q_win) : NULL;
    j.k = pkv_cpu_ptr(a->k);
    j.v = pkv_cpu_ptr(a->v);
    j.meta = pkv_cpu_ptr(a->meta);
    j.out = pkv_cpu_ptr(a->out);
    const int group = a->n_head / a->n_kv, max_nq = PKV_MAX(1, PKV_MIN(ATT_MAX_BLOCK, ATT_BLOCK_ROWS / group));
    j.blocks = pkv_malloc((size_t)a->n_q * sizeof *j.blocks);
    if (!j.blocks) return pkv_err(PKV_ERR_NOMEM, "%s: attention: no memory for %d query blocks", c->name, a->n_q);
    /* blocks: runs of queries of one sequence; their spans; the partials they need */
    const int32_t *q_seq = j.meta;
    int64_t tokens = 0, n_part = 0;
    int big = 1; /* queries in the largest block */
    for (int i = 0; i < a->n_q;) {
        att_block *blk = &j.blocks[j.n_blocks++];
        blk->i0 = i;
        blk->nq = 1;
        while (i + blk->nq < a->n_q && blk->nq < max_nq && q_seq[i + blk->nq] == q_seq[i]) blk->nq++;
        big = PKV_MAX(big, blk->nq);
        int64_t len_max = 0;
        for (int b = 0; b < blk->nq; b++) {
            int64_t lo, np;
            const int64_t len = att_len(&j, i + b, &lo, &np);
            len_max = PKV_MAX(len_max, len);
            tokens += len;
        }
        blk->n_span = (int)((len_max + ATT_SPAN - 1) / ATT_SPAN);
        j.max_spans = PKV_MAX(j.max_spans, blk->n_span);
        i += blk->nq;
    }
    for (int bi = 0; bi < j.n_blocks; bi++) {
        j.blocks[bi].part = n_part;
        n_part += (int64_t)j.blocks[bi].nq * j.max_spans * a->n_head;
    }
    /* How the work is cut changes no result (see above): split the spans over
     * the pool when the (block, KV head) items alone would leave threads idle
     * and the partials are small; a task then takes all KV heads of a span
     * (a token's rows of all heads are adjacent in memory). */
    const int threads = pkv_pool_threads(c->pool);
    const double work = (double)tokens * a->n_head * (a->dk + a->dv);
    j.kv_per_item = 1;
    j.split = false;
    if (j.max_spans > 1 && (int64_t)j.n_blocks * a->n_kv < 4 * threads &&
        (double)n_part * (a->dv + 2) * sizeof(float) < 16e6) {
        j.split = true;
        j.kv_per_item = a->n_kv;
        while (j.kv_per_item > 1 && (int64_t)j.n_blocks * j.max_spans * (a->n_kv / j.kv_per_item) < 4 * threads)
            j.kv_per_item /= 2;
    }
    const int kv_items = (a->n_kv + j.kv_per_item - 1) / j.kv_per_item;
    j.n_items = (int64_t)j.n_blocks * (j.split ? j.max_spans : 1) * kv_items;
    j.per_task = att_scratch_floats(a, big, j.kv_per_item);
    j.per_task = PKV_MAX(j.per_task, (size_t)a->dv);
    int n_tasks = n_tasks_for(c, j.n_items, work);
    j.scratch = pkv_malloc((size_t)n_tasks * j.per_task * sizeof(float));
    if (j.split) j.part = pkv_malloc((size_t)PKV_MAX(n_part, 1) * (size_t)(a->dv + 2) * sizeof(float));
    if (!j.scratch || (j.split && !j.part)) {
        pkv_free(j.scratch);
        pkv_free(j.part);
        pkv_free(j.blocks);
        return pkv_err(PKV_ERR_NOMEM, "%s: attention: no memory for scratch", c->name);
    }
    pkv_pool_run(c->pool, n_tasks, att_task, &j);
    if (j.split) pkv_pool_run(c->pool, PKV_MIN(n_tasks, j.n_blocks), att_merge_task, &j);
    pkv_free(j.scratch);
    pkv_free(j.part);
    pkv_free(j.blocks);
    return PKV_OK;
}

/* .<name> for each kernel of PKV_KERNELS (kernel-list.h) */
#define SLOT(name) .name = cpu_##name,
const pkv_kernel_ops pkv_cpu_kernel_ops = {
    .supports_type = supports_type,
    .weight_speed = weight_speed,
    .weight_layout = weight_layout,
    PKV_KERNELS(SLOT)
};
#undef SLOT
