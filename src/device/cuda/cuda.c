/* CUDA backend: discovery, device memory, the in-order stream, transfers at any
 * byte offset, and the host side of every kernel (alignment checks, launch
 * parameters); the kernels themselves are in cuda-kernels.cu.
 *
 * Written on a machine without a GPU: it compiles in CI but has never run.
 * docs/gpu.md lists what a GPU session must run.
 *
 * Queue model (I3): every operation of a device instance (transfers and
 * kernels) goes on one CUDA stream, created non-blocking so work other code puts
 * on the legacy default stream does not serialize with it. Stream order is
 * submission order, so a copy queued before a kernel is seen by that kernel.
 * read waits for the stream (and so for everything queued before it); sync too.
 *
 * Memory: one cudaMalloc per buffer; the buffer handle is the device pointer.
 * Host data moves through pinned, device-mapped staging memory (a bump allocator
 * reset when the stream is idle; transfers above PKV_CU_STAGING_MAX go in
 * chunks): write copies the caller's bytes into staging before it returns, as the
 * device API promises, and queues the copy to the device. read copies straight
 * into the caller's memory and waits. fill is cudaMemsetAsync, copy
 * cudaMemcpyAsync: both take any byte offset and size.
 *
 * copy_regions: the region list is cut into chunks (cuda-plan.c), the chunk
 * table written to staging, and one kernel launch copies every chunk, reading
 * the table from the mapped staging memory. Staging is only reused after the
 * stream has drained, so the table outlives the kernel. */
#include "device/cuda/cuda-plan.h"
#include "device/device-impl.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PKV_CU_STAGING_MIN ((size_t)1 << 20)
#define PKV_CU_STAGING_MAX ((size_t)64 << 20)

typedef struct pkv_cu_ctx {
    char name[64];
    int index;
    cudaStream_t stream;
    int n_sm;
    /* pinned, mapped staging: host address, the device's address of it */
    uint8_t *stage;
    uint8_t *stage_dev;
    size_t stage_cap, stage_used;
    /* partial results of the split decode attention, bytes */
    void *att_part;
    size_t att_part_cap;
    int att_split; /* PKV_CUDA_ATT_SPLIT: splits forced for every attention, 0 = chosen per call */
    bool gemm;     /* PKV_CUDA_GEMM=1: the tiled prefill matmul (faster, not batch-invariant) */
} pkv_cu_ctx;

/* ------------------------------------------------------------------ errors */

static pkv_status cu_fail(const pkv_cu_ctx *c, const char *call, cudaError_t e) {
    pkv_status s = e == cudaErrorMemoryAllocation ? PKV_ERR_NOMEM : PKV_ERR_DEVICE;
    /* Clear the runtime's last error, so the next launch's check does not report
     * this one again (errors that poison the context stay and are reported by
     * every later call: the device is lost then). */
    (void)cudaGetLastError();
    return pkv_err(s, "%s: %s failed: %s (%s)", c ? c->name : "cuda", call, cudaGetErrorName(e),
                   cudaGetErrorString(e));
}

#define CU_TRY(c, call, expr)                                                              \
    do {                                                                                   \
        cudaError_t _e = (expr);                                                           \
        if (_e != cudaSuccess) return cu_fail((c), (call), _e);                            \
    } while (0)
#define TRY(x)                                                                             \
    do {                                                                                   \
        pkv_status _s = (x);                                                               \
        if (_s) return _s;                                                                 \
    } while (0)

/* The runtime's current device is per thread: set it before every call, since
 * instances on different GPUs may be used from one thread. */
static pkv_status use(pkv_cu_ctx *c) {
    CU_TRY(c, "cudaSetDevice", cudaSetDevice(c->index));
    return PKV_OK;
}

/* --------------------------------------------------------------- discovery */

static struct {
    pthread_once_t once;
    int n;
    char why[256];
} g_cu = {PTHREAD_ONCE_INIT, 0, ""};

static void cu_discover(void) {
    const char *off = getenv("PKV_CUDA_DISABLE");
    if (off && strcmp(off, "1") == 0) {
        snprintf(g_cu.why, sizeof g_cu.why, "disabled by PKV_CUDA_DISABLE=1");
        return;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        pkv_cu_why((int)e, cudaGetErrorName(e), cudaGetErrorString(e), g_cu.why, sizeof g_cu.why);
        (void)cudaGetLastError();
        n = 0;
    }
    g_cu.n = n;
}

int pkv_cuda_count(char *why, size_t why_size) {
    pthread_once(&g_cu.once, cu_discover);
    if (why && why_size) snprintf(why, why_size, "%s", g_cu.n ? "" : g_cu.why);
    return g_cu.n;
}

/* ------------------------------------------------------------------ memory */

static pkv_status cu_buffer_alloc(void *ctx, size_t size, void **handle) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) return cu_fail(c, "cudaMalloc", e);
    *handle = p;
    return PKV_OK;
}

static void cu_buffer_free(void *ctx, void *handle) {
    pkv_cu_ctx *c = ctx;
    /* Queued work may still use the buffer: wait for it. A failure leaves
     * nothing better to do than free anyway (the device is lost). */
    if (use(c) == PKV_OK) (void)cudaStreamSynchronize(c->stream);
    (void)cudaFree(handle);
    (void)cudaGetLastError();
}

/* ------------------------------------------------------------------- queue */

static pkv_status cu_sync(void *ctx) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    CU_TRY(c, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    c->stage_used = 0;
    return PKV_OK;
}

/* Work starts when queued; flush only reports an error of earlier work. */
static pkv_status cu_flush(void *ctx) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    cudaError_t e = cudaStreamQuery(c->stream);
    if (e != cudaSuccess && e != cudaErrorNotReady) return cu_fail(c, "cudaStreamQuery", e);
    return PKV_OK;
}

/* ----------------------------------------------------------------- staging */

static void staging_release(pkv_cu_ctx *c) {
    if (c->stage) (void)cudaFreeHost(c->stage);
    c->stage = c->stage_dev = NULL;
    c->stage_cap = c->stage_used = 0;
}

/* Reserve n (<= PKV_CU_STAGING_MAX) bytes of staging at *p; may wait for the
 * stream to drain (the space is reclaimed only when idle) and grow it. */
static pkv_status staging_get(pkv_cu_ctx *c, size_t n, uint8_t **p) {
    size_t start = (c->stage_used + 15) & ~(size_t)15;
    if (c->stage && start + n <= c->stage_cap) {
        *p = c->stage + start;
        c->stage_used = start + n;
        return PKV_OK;
    }
    TRY(cu_sync(c));
    if (n > c->stage_cap) {
        size_t cap = PKV_MAX(PKV_MAX(n, 2 * c->stage_cap), PKV_CU_STAGING_MIN);
        if (cap > PKV_CU_STAGING_MAX) cap = PKV_MAX(n, PKV_CU_STAGING_MAX);
        staging_release(c);
        void *h = NULL, *d = NULL;
        cudaError_t e = cudaHostAlloc(&h, cap, cudaHostAllocPortable | cudaHostAllocMapped);
        if (e == cudaSuccess) {
            e = cudaHostGetDevicePointer(&d, h, 0);
            if (e != cudaSuccess) (void)cudaFreeHost(h);
        }
        if (e != cudaSuccess) {
            pkv_status s = cu_fail(c, "cudaHostAlloc", e);
            return pkv_err_prefix(s, "%s: %zu bytes of pinned staging", c->name, cap);
        }
        c->stage = h;
        c->stage_dev = d;
        c->stage_cap = cap;
    }
    *p = c->stage;
    c->stage_used = n;
    return PKV_OK;
}

/* --------------------------------------------------------------- transfers */

static pkv_status cu_write(void *ctx, void *dst, size_t off, const void *src, size_t n) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    for (size_t done = 0; done < n;) {
        size_t k = PKV_MIN(n - done, PKV_CU_STAGING_MAX);
        uint8_t *p = NULL;
        pkv_status s = staging_get(c, k, &p);
        if (s) return pkv_err_prefix(s, "%s: write of %zu bytes at offset %zu", c->name, n, off);
        memcpy(p, (const uint8_t *)src + done, k);
        CU_TRY(c, "cudaMemcpyAsync (host to device)",
               cudaMemcpyAsync((uint8_t *)dst + off + done, p, k, cudaMemcpyHostToDevice, c->stream));
        done += k;
    }
    return PKV_OK;
}

static pkv_status cu_read(void *ctx, void *src, size_t off, void *dst, size_t n) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    CU_TRY(c, "cudaMemcpyAsync (device to host)",
           cudaMemcpyAsync(dst, (const uint8_t *)src + off, n, cudaMemcpyDeviceToHost, c->stream));
    pkv_status s = cu_sync(c);
    if (s) return pkv_err_prefix(s, "%s: read of %zu bytes at offset %zu", c->name, n, off);
    return PKV_OK;
}

static pkv_status cu_fill(void *ctx, void *dst, size_t off, size_t n, uint8_t value) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    CU_TRY(c, "cudaMemsetAsync", cudaMemsetAsync((uint8_t *)dst + off, value, n, c->stream));
    return PKV_OK;
}

static pkv_status cu_copy(void *ctx, void *src, size_t src_off, void *dst, size_t dst_off, size_t n) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    CU_TRY(c, "cudaMemcpyAsync (device to device)",
           cudaMemcpyAsync((uint8_t *)dst + dst_off, (const uint8_t *)src + src_off, n, cudaMemcpyDeviceToDevice,
                           c->stream));
    return PKV_OK;
}

static pkv_status cu_copy_regions(void *ctx, void *src, void *dst, const pkv_region *r, size_t n) {
    pkv_cu_ctx *c = ctx;
    TRY(use(c));
    size_t count = pkv_cu_plan_regions(r, n, PKV_CU_CHUNK_BYTES, NULL, 0);
    if (count == 0) return PKV_OK;
    pkv_cu_chunk *chunks = pkv_malloc(count * sizeof *chunks);
    if (!chunks) return pkv_err(PKV_ERR_NOMEM, "%s: copy_regions: no host memory for %zu chunks", c->name, count);
    pkv_cu_plan_regions(r, n, PKV_CU_CHUNK_BYTES, chunks, count);
    /* Normally one launch; a table larger than the staging limit (over 2.7
     * million chunks, 170 GiB of copies) takes one launch per staging load. */
    const size_t per = PKV_CU_STAGING_MAX / sizeof *chunks;
    pkv_status s = PKV_OK;
    for (size_t i = 0; i < count && !s; i += per) {
        size_t k = PKV_MIN(per, count - i);
        uint8_t *p = NULL;
        s = staging_get(c, k * sizeof *chunks, &p);
        if (s) break;
        memcpy(p, chunks + i, k * sizeof *chunks);
        int e = pkv_cu_launch_copy_chunks(src, dst, (const pkv_cu_chunk *)(void *)(c->stage_dev + (p - c->stage)),
                                          (int64_t)k, c->stream);
        if (e) s = cu_fail(c, "copy_regions kernel launch", (cudaError_t)e);
    }
    pkv_free(chunks);
    return s;
}

/* ----------------------------------------------------------------- kernels */

#define PTR(t) ((uint8_t *)(t).buf->handle + (t).off)
#define ALIGN(kernel, arg, off, a) TRY(pkv_cu_check_align(c->name, kernel, arg, off, a))

static pkv_status launched(pkv_cu_ctx *c, const char *kernel, int e) {
    if (!e) return PKV_OK;
    char call[64];
    snprintf(call, sizeof call, "kernel %s launch", kernel);
    return cu_fail(c, call, (cudaError_t)e);
}

static bool cu_supports_type(void *ctx, pkv_type t) {
    (void)ctx;
    return pkv_cu_wtype(t) >= 0;
}

/* mxfp4 blocks (17 bytes) are read byte by byte: any offset */
static size_t weight_align(pkv_type t) { return t == PKV_TYPE_F32 ? 4 : t == PKV_TYPE_MXFP4 ? 1 : 2; }

static pkv_status cu_matmul(void *ctx, const pkv_k_matmul_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("matmul", "w", a->w.off, weight_align(a->wtype));
    ALIGN("matmul", "x", a->x.off, 4);
    ALIGN("matmul", "y", a->y.off, 4);
    TRY(use(c));
    pkv_cu_matmul p = {PTR(a->w), pkv_cu_wtype(a->wtype), pkv_type_row_bytes(a->wtype, (size_t)a->cols), a->rows,
                       a->cols, a->n, (const float *)(void *)PTR(a->x), (float *)(void *)PTR(a->y), c->gemm};
    return launched(c, "matmul", pkv_cu_launch_matmul(&p, c->stream));
}

static pkv_status cu_get_rows(void *ctx, const pkv_k_get_rows_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("get_rows", "w", a->w.off, weight_align(a->wtype));
    ALIGN("get_rows", "ids", a->ids.off, 4);
    ALIGN("get_rows", "out", a->out.off, 4);
    TRY(use(c));
    pkv_cu_get_rows p = {PTR(a->w), pkv_cu_wtype(a->wtype), pkv_type_row_bytes(a->wtype, (size_t)a->cols),
                         a->n_vocab, a->cols, a->n, (const int32_t *)(void *)PTR(a->ids),
                         (float *)(void *)PTR(a->out), a->scale};
    return launched(c, "get_rows", pkv_cu_launch_get_rows(&p, c->stream));
}

static pkv_status cu_rms_norm(void *ctx, const pkv_k_rms_norm_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("rms_norm", "x", a->x.off, 4);
    ALIGN("rms_norm", "w", a->w.off, 4);
    ALIGN("rms_norm", "y", a->y.off, 4);
    TRY(use(c));
    return launched(c, "rms_norm",
                    pkv_cu_launch_rms_norm((const float *)(void *)PTR(a->x), (const float *)(void *)PTR(a->w),
                                           (float *)(void *)PTR(a->y), a->n_rows, a->row_len, a->eps, c->stream));
}

static pkv_status cu_layer_norm(void *ctx, const pkv_k_layer_norm_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("layer_norm", "x", a->x.off, 4);
    ALIGN("layer_norm", "y", a->y.off, 4);
    if (a->w.buf) ALIGN("layer_norm", "w", a->w.off, 4);
    if (a->b.buf) ALIGN("layer_norm", "b", a->b.off, 4);
    TRY(use(c));
    return launched(c, "layer_norm",
                    pkv_cu_launch_layer_norm((const float *)(void *)PTR(a->x),
                                             a->w.buf ? (const float *)(void *)PTR(a->w) : NULL,
                                             a->b.buf ? (const float *)(void *)PTR(a->b) : NULL,
                                             (float *)(void *)PTR(a->y), a->n_rows, a->row_len, a->eps, c->stream));
}

static pkv_status cu_add(void *ctx, const pkv_k_add_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("add", "a", a->a.off, 4);
    ALIGN("add", "b", a->b.off, 4);
    ALIGN("add", "y", a->y.off, 4);
    TRY(use(c));
    return launched(c, "add",
                    pkv_cu_launch_add((const float *)(void *)PTR(a->a), (const float *)(void *)PTR(a->b),
                                      (float *)(void *)PTR(a->y), a->n, a->b_len, c->stream));
}

static pkv_status cu_swiglu(void *ctx, const pkv_k_swiglu_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("swiglu", "g", a->g.off, 4);
    ALIGN("swiglu", "u", a->u.off, 4);
    ALIGN("swiglu", "y", a->y.off, 4);
    TRY(use(c));
    pkv_cu_swiglu p = {(const float *)(void *)PTR(a->g), (const float *)(void *)PTR(a->u), (float *)(void *)PTR(a->y),
                       a->n, a->gelu ? 1 : 0, a->oai ? 1 : 0, a->alpha, a->limit};
    return launched(c, "swiglu", pkv_cu_launch_swiglu(&p, c->stream));
}

/* Quantized KV pages (q8_0/q4_0) have CPU and Vulkan kernels; the CUDA ones are
 * not written yet: refused by name rather than read as another type. */
static pkv_status no_quant_kv(const pkv_cu_ctx *c, const char *kernel, pkv_type t) {
    return pkv_err(PKV_ERR_UNSUPPORTED,
                   "kernel %s on %s: KV pages of type %s are not supported by the CUDA backend yet (use --kv-type "
                   "f16 or f32 on CUDA devices)", kernel, c->name, pkv_type_name(t) ? pkv_type_name(t) : "?");
}

static pkv_status cu_rope(void *ctx, const pkv_k_rope_args *a) {
    pkv_cu_ctx *c = ctx;
    if (a->ff.buf)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel rope on %s: frequency factors (LongRoPE) are not implemented on "
                       "CUDA yet; use the CPU", c->name);
    if (pkv_kv_type_quant(a->dtype)) return no_quant_kv(c, "rope", a->dtype);
    const bool f16 = a->dtype == PKV_TYPE_F16;
    const size_t es = f16 ? 2 : 4;
    ALIGN("rope", "x", a->x.off, es);
    ALIGN("rope", "row_stride", a->row_stride, es);
    ALIGN("rope", "pos", a->pos.off, 4);
    if (a->rows.buf) ALIGN("rope", "rows", a->rows.off, 4);
    TRY(use(c));
    pkv_cu_rope p = {PTR(a->x),
                     f16,
                     a->n_rows,
                     a->rows.buf ? a->max_rows : a->n_rows,
                     a->row_stride,
                     a->n_heads,
                     a->head_dim,
                     a->n_rot,
                     a->neox,
                     a->freq_base,
                     a->freq_scale,
                     (const int32_t *)(void *)PTR(a->pos),
                     a->rows.buf ? (const int32_t *)(void *)PTR(a->rows) : NULL,
                     a->ext_factor,
                     a->corr_lo,
                     a->corr_hi,
                     a->mscale > 0 ? a->mscale : 1.0f};
    return launched(c, "rope", pkv_cu_launch_rope(&p, c->stream));
}

static pkv_status cu_set_rows(void *ctx, const pkv_k_set_rows_args *a) {
    pkv_cu_ctx *c = ctx;
    if (pkv_kv_type_quant(a->dst_type)) return no_quant_kv(c, "set_rows", a->dst_type);
    const bool f16 = a->dst_type == PKV_TYPE_F16;
    const size_t es = f16 ? 2 : 4;
    ALIGN("set_rows", "src", a->src.off, 4);
    ALIGN("set_rows", "src_stride", a->src_stride, 4);
    ALIGN("set_rows", "dst", a->dst.off, es);
    ALIGN("set_rows", "dst_stride", a->dst_stride, es);
    ALIGN("set_rows", "idx", a->idx.off, 4);
    TRY(use(c));
    pkv_cu_set_rows p = {PTR(a->src), a->src_stride, PTR(a->dst), f16, a->dst_stride, a->dst_rows, a->n,
                         a->row_elems, (const int32_t *)(void *)PTR(a->idx)};
    return launched(c, "set_rows", pkv_cu_launch_set_rows(&p, c->stream));
}

/* Room for the split attention's partial results; on failure the caller runs
 * unsplit instead (slower for long decodes, same results up to rounding). */
static bool att_partial(pkv_cu_ctx *c, size_t bytes) {
    if (bytes <= c->att_part_cap) return true;
    if (c->att_part) {
        if (cudaStreamSynchronize(c->stream) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        (void)cudaFree(c->att_part);
        c->att_part = NULL;
        c->att_part_cap = 0;
    }
    size_t cap = PKV_MAX(bytes, (size_t)1 << 20);
    if (cudaMalloc(&c->att_part, cap) != cudaSuccess) {
        (void)cudaGetLastError();
        c->att_part = NULL;
        return false;
    }
    c->att_part_cap = cap;
    return true;
}

static pkv_status cu_attention(void *ctx, const pkv_k_attention_args *a) {
    pkv_cu_ctx *c = ctx;
    if (a->dk > PKV_CU_ATT_MAX_D || a->dv > PKV_CU_ATT_MAX_D || a->n_head > 65535)
        return pkv_err(PKV_ERR_UNSUPPORTED,
                       "kernel attention on %s: head sizes dk %d, dv %d, %d heads (the CUDA kernel supports head "
                       "sizes up to %d and up to 65535 heads)",
                       c->name, a->dk, a->dv, a->n_head, PKV_CU_ATT_MAX_D);
    if (pkv_kv_type_quant(a->k_type)) return no_quant_kv(c, "attention", a->k_type);
    if (pkv_kv_type_quant(a->v_type)) return no_quant_kv(c, "attention", a->v_type);
    if (a->k_type != a->v_type)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel attention on %s: K %s with V %s: the CUDA kernel takes one type for "
                                            "both", c->name, pkv_type_name(a->k_type), pkv_type_name(a->v_type));
    const size_t es = a->k_type == PKV_TYPE_F16 ? 2 : 4;
    ALIGN("attention", "q", a->q.off, 4);
    ALIGN("attention", "k", a->k.off, es);
    ALIGN("attention", "v", a->v.off, es);
    ALIGN("attention", "out", a->out.off, 4);
    ALIGN("attention", "meta", a->meta.off, 4);
    if (a->sinks.buf) ALIGN("attention", "sinks", a->sinks.off, 4);
    if (a->q_win.buf) ALIGN("attention", "q_win", a->q_win.off, 4);
    TRY(use(c));
    /* A sliding window caps the tokens a query reads: size the splits by the
     * pages of one window per sequence when that is less than the block table
     * (q_win can move a query's window back further: then the whole table). */
    int split_pages = a->meta_pages;
    if ((a->window > 0 || a->chunk > 0) && !a->q_win.buf) {
        const int span = a->window > 0 && (a->chunk <= 0 || a->window < a->chunk) ? a->window : a->chunk;
        const int64_t wp = (int64_t)a->n_seq * (((int64_t)span + a->page_size - 1) / a->page_size + 1);
        if (wp < split_pages) split_pages = (int)wp;
    }
    int n_split = c->att_split ? c->att_split
                               : pkv_cu_attention_splits(a->n_q, a->n_head, split_pages, a->page_size, a->n_seq, c->n_sm);
    const size_t part = (size_t)a->n_q * (size_t)a->n_head * (size_t)n_split * (size_t)(a->dv + 2) * sizeof(float);
    if (n_split > 1 && !att_partial(c, part)) n_split = 1;
    pkv_cu_attention p = {.q = (const float *)(void *)PTR(a->q),
                          .k = PTR(a->k),
                          .v = PTR(a->v),
                          .kv_f16 = a->k_type == PKV_TYPE_F16,
                          .meta = (const int32_t *)(void *)PTR(a->meta),
                          .out = (float *)(void *)PTR(a->out),
                          .partial = n_split > 1 ? c->att_part : NULL,
                          .n_split = n_split,
                          .n_q = a->n_q,
                          .n_seq = a->n_seq,
                          .meta_pages = a->meta_pages,
                          .n_pages = a->n_pages,
                          .page_size = a->page_size,
                          .n_head = a->n_head,
                          .n_kv = a->n_kv,
                          .dk = a->dk,
                          .dv = a->dv,
                          .v_stride = a->v_in_k ? a->dk : a->dv,
                          .scale = a->scale,
                          .window = a->window,
                          .chunk = a->chunk,
                          .q_win = a->q_win.buf ? (const int32_t *)(void *)PTR(a->q_win) : NULL,
                          .softcap = a->softcap,
                          .sinks = a->sinks.buf ? (const float *)(void *)PTR(a->sinks) : NULL};
    return launched(c, "attention", pkv_cu_launch_attention(&p, c->stream));
}

static pkv_status cu_softmax(void *ctx, const pkv_k_softmax_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("softmax", "x", a->x.off, 4);
    ALIGN("softmax", "y", a->y.off, 4);
    TRY(use(c));
    return launched(c, "softmax",
                    pkv_cu_launch_softmax((const float *)(void *)PTR(a->x), (float *)(void *)PTR(a->y), a->n_rows,
                                          a->row_len, c->stream));
}

static pkv_status cu_argmax(void *ctx, const pkv_k_argmax_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("argmax", "x", a->x.off, 4);
    ALIGN("argmax", "out", a->out.off, 4);
    TRY(use(c));
    return launched(c, "argmax",
                    pkv_cu_launch_argmax((const float *)(void *)PTR(a->x), (int32_t *)(void *)PTR(a->out), a->n_rows,
                                         a->row_len, c->stream));
}

/* ---- recurrent layers */

static pkv_status cu_ssm_conv(void *ctx, const pkv_k_ssm_conv_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("ssm_conv", "x", a->x.off, 4);
    ALIGN("ssm_conv", "w", a->w.off, 4);
    ALIGN("ssm_conv", "y", a->y.off, 4);
    ALIGN("ssm_conv", "state", a->state.off, 4);
    ALIGN("ssm_conv", "meta", a->meta.off, 4);
    TRY(use(c));
    pkv_cu_ssm_conv p = {(const float *)(void *)PTR(a->x), (const float *)(void *)PTR(a->w), (float *)(void *)PTR(a->y),
                         PTR(a->state), a->state_stride, a->n_slots, (const int32_t *)(void *)PTR(a->meta), a->n_tok,
                         a->channels, a->n_seq, a->d_conv, a->silu ? 1 : 0};
    return launched(c, "ssm_conv", pkv_cu_launch_ssm_conv(&p, c->stream));
}

static pkv_status cu_delta_net(void *ctx, const pkv_k_delta_net_args *a) {
    pkv_cu_ctx *c = ctx;
    if (a->d_k > PKV_CU_DN_MAX_DK)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel delta_net on %s: key head size %d (the CUDA kernel keeps a state "
                       "column of up to %d in registers)", c->name, a->d_k, PKV_CU_DN_MAX_DK);
    const char *names[] = {"q", "k", "v", "g", "beta", "out", "state", "meta"};
    const pkv_tref refs[] = {a->q, a->k, a->v, a->g, a->beta, a->out, a->state, a->meta};
    for (int i = 0; i < 8; i++) ALIGN("delta_net", names[i], refs[i].off, 4);
    TRY(use(c));
    pkv_cu_delta_net p = {PTR(a->q), PTR(a->k), PTR(a->v), a->q_stride, a->k_stride, a->v_stride,
                          (const float *)(void *)PTR(a->g), (const float *)(void *)PTR(a->beta),
                          (float *)(void *)PTR(a->out), PTR(a->state), a->state_stride, a->n_slots,
                          (const int32_t *)(void *)PTR(a->meta), a->n_tok, a->n_seq, a->n_k_heads, a->n_v_heads, a->d_k,
                          a->d_v, a->grouped ? 1 : 0, a->scale};
    return launched(c, "delta_net", pkv_cu_launch_delta_net(&p, c->stream));
}

static pkv_status cu_ssm_scan(void *ctx, const pkv_k_ssm_scan_args *a) {
    pkv_cu_ctx *c = ctx;
    if (a->d_state > PKV_CU_SCAN_MAX_DS)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel ssm_scan on %s: state size %d (the CUDA kernel keeps a state "
                       "row of up to %d in registers)", c->name, a->d_state, PKV_CU_SCAN_MAX_DS);
    const char *names[] = {"x", "B", "C", "dt", "dt_bias", "A", "D", "y", "state", "meta"};
    const pkv_tref refs[] = {a->x, a->B, a->C, a->dt, a->dt_bias, a->A, a->D, a->y, a->state, a->meta};
    for (int i = 0; i < 10; i++)
        if (refs[i].buf) ALIGN("ssm_scan", names[i], refs[i].off, 4);
    TRY(use(c));
    pkv_cu_ssm_scan p = {PTR(a->x), PTR(a->B), PTR(a->C), a->x_stride, a->B_stride, a->C_stride,
                         (const float *)(void *)PTR(a->dt), (const float *)(void *)PTR(a->dt_bias),
                         (const float *)(void *)PTR(a->A), a->D.buf ? (const float *)(void *)PTR(a->D) : NULL,
                         (float *)(void *)PTR(a->y), PTR(a->state), a->state_stride, a->n_slots,
                         (const int32_t *)(void *)PTR(a->meta), a->n_tok, a->n_seq, a->n_head, a->head_dim,
                         a->n_group, a->d_state};
    return launched(c, "ssm_scan", pkv_cu_launch_ssm_scan(&p, c->stream));
}

static pkv_status cu_l2_norm(void *ctx, const pkv_k_l2_norm_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("l2_norm", "x", a->x.off, 4);
    ALIGN("l2_norm", "y", a->y.off, 4);
    TRY(use(c));
    pkv_cu_l2_norm p = {PTR(a->x), PTR(a->y), a->n, a->n_heads, a->head_dim, a->x_stride, a->y_stride, a->eps};
    return launched(c, "l2_norm", pkv_cu_launch_l2_norm(&p, c->stream));
}

static pkv_status cu_unary(void *ctx, const pkv_k_unary_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("unary", "x", a->x.off, 4);
    ALIGN("unary", "y", a->y.off, 4);
    if (a->bias.buf) ALIGN("unary", "bias", a->bias.off, 4);
    if (a->mul.buf) ALIGN("unary", "mul", a->mul.off, 4);
    TRY(use(c));
    pkv_cu_unary p = {(const float *)(void *)PTR(a->x), (float *)(void *)PTR(a->y), a->n, (int)a->op,
                      a->bias.buf ? (const float *)(void *)PTR(a->bias) : NULL, a->bias_len,
                      a->mul.buf ? (const float *)(void *)PTR(a->mul) : NULL, a->mul_len};
    return launched(c, "unary", pkv_cu_launch_unary(&p, c->stream));
}

static pkv_status cu_moe_route(void *ctx, const pkv_k_moe_route_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("moe_route", "logits", a->logits.off, 4);
    if (a->bias.buf) ALIGN("moe_route", "bias", a->bias.off, 4);
    ALIGN("moe_route", "sel", a->sel.off, 4);
    ALIGN("moe_route", "w", a->w.off, 4);
    TRY(use(c));
    pkv_cu_moe_route p = {(const float *)(void *)PTR(a->logits), a->bias.buf ? (const float *)(void *)PTR(a->bias) : NULL,
                          (int32_t *)(void *)PTR(a->sel), (float *)(void *)PTR(a->w), a->n, a->n_expert, a->k,
                          a->n_group, a->n_group_used, a->gating, a->norm_w, a->sel_logits, a->w_scale};
    return launched(c, "moe_route", pkv_cu_launch_moe_route(&p, c->stream));
}

static pkv_status cu_moe_combine(void *ctx, const pkv_k_moe_combine_args *a) {
    pkv_cu_ctx *c = ctx;
    ALIGN("moe_combine", "out", a->out.off, 4);
    ALIGN("moe_combine", "y", a->y.off, 4);
    ALIGN("moe_combine", "rows", a->rows.off, 4);
    ALIGN("moe_combine", "w", a->w.off, 4);
    TRY(use(c));
    pkv_cu_moe_combine p = {(float *)(void *)PTR(a->out), (const float *)(void *)PTR(a->y), (const float *)(void *)PTR(a->w),
                            (const int32_t *)(void *)PTR(a->rows), a->n, a->cols, a->out_rows, a->add};
    return launched(c, "moe_combine", pkv_cu_launch_moe_combine(&p, c->stream));
}

/* .<name> for each kernel of PKV_KERNELS (kernel-list.h) */
#define SLOT(name) .name = cu_##name,
static const pkv_kernel_ops cu_kernel_ops = {
    .supports_type = cu_supports_type,
    PKV_KERNELS(SLOT)
};
#undef SLOT

/* ---------------------------------------------------------------- lifetime */

static void cu_destroy(void *ctx) {
    pkv_cu_ctx *c = ctx;
    if (!c) return;
    if (cudaSetDevice(c->index) == cudaSuccess) {
        if (c->stream) {
            (void)cudaStreamSynchronize(c->stream);
            (void)cudaStreamDestroy(c->stream);
        }
        if (c->att_part) (void)cudaFree(c->att_part);
        staging_release(c);
    }
    (void)cudaGetLastError();
    pkv_free(c);
}

static const pkv_backend_ops cu_ops = {
    .version = PKV_BACKEND_VERSION,
    .destroy = cu_destroy,
    .buffer_alloc = cu_buffer_alloc,
    .buffer_free = cu_buffer_free,
    .write = cu_write,
    .read = cu_read,
    .fill = cu_fill,
    .copy = cu_copy,
    .copy_regions = cu_copy_regions,
    .flush = cu_flush,
    .sync = cu_sync,
    .kernels = &cu_kernel_ops,
};

static pkv_status cu_open(pkv_cu_ctx *c, pkv_device_caps *caps) {
    TRY(use(c));
    struct cudaDeviceProp p;
    CU_TRY(c, "cudaGetDeviceProperties", cudaGetDeviceProperties(&p, c->index));
    if (!p.canMapHostMemory)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s (%s): the device cannot map host memory, which this backend needs",
                       c->name, p.name);
    cudaError_t e = (cudaError_t)pkv_cu_probe();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pkv_err(PKV_ERR_UNSUPPORTED,
                       "%s (%s, compute capability %d.%d): this build has no code it can run (%s); rebuild with "
                       "CMAKE_CUDA_ARCHITECTURES including %d%d",
                       c->name, p.name, p.major, p.minor, cudaGetErrorName(e), p.major, p.minor);
    }
    CU_TRY(c, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    c->n_sm = p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
    /* For tests and debugging: force the attention's split count (1 = never split). */
    const char *split = getenv("PKV_CUDA_ATT_SPLIT");
    if (split && atoi(split) >= 1 && atoi(split) <= PKV_CU_ATT_MAX_SPLIT) c->att_split = atoi(split);
    /* The tiled matmul for batches of more than PKV_CU_MMV_MAX rows: faster prefill,
     * another summation order than decode's (docs/gpu.md) */
    const char *gemm = getenv("PKV_CUDA_GEMM");
    c->gemm = gemm && !strcmp(gemm, "1");
    int drv = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    memset(caps, 0, sizeof *caps);
    snprintf(caps->name, sizeof caps->name, "%s", c->name);
    snprintf(caps->description, sizeof caps->description, "%.80s, sm_%d%d, %d SMs, driver %d.%d", p.name, p.major,
             p.minor, p.multiProcessorCount, drv / 1000, drv % 1000 / 10);
    caps->kind = PKV_DEVICE_CUDA;
    caps->memory_bytes = p.totalGlobalMem;
    caps->max_buffer_bytes = p.totalGlobalMem;
    caps->transfer_align = 16; /* region copies move 16-byte words when offsets allow */
    caps->host_memory = false;
    return PKV_OK;
}

pkv_status pkv_cuda_backend_create(const char *name, int index, pkv_device_params params,
                                   const pkv_backend_ops **ops, void **ctx, pkv_device_caps *caps) {
    (void)params;
    char why[256];
    int n = pkv_cuda_count(why, sizeof why);
    if (index < 0 || index >= n)
        return pkv_err(PKV_ERR_NOT_FOUND, "no CUDA device %d (%d found%s%s)", index, n, n ? "" : ": ", why);
    pkv_cu_ctx *c = pkv_calloc(1, sizeof *c);
    if (!c) return pkv_err(PKV_ERR_NOMEM, "opening %s: out of memory", name);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->index = index;
    pkv_status s = cu_open(c, caps);
    if (s) {
        cu_destroy(c);
        return pkv_err_prefix(s, "opening %s", name);
    }
    *ops = &cu_ops;
    *ctx = c;
    return PKV_OK;
}
