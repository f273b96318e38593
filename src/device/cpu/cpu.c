/* CPU backend: memory is host memory from the allocator hooks; the queue is
 * synchronous, so in-order semantics hold trivially and sync has nothing to do. */
#include "device/cpu/cpu-impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Copies at least this large bypass the cache with streaming stores: a copy of
 * many MiB would only evict everything else, and the stores skip the
 * read-for-ownership of each destination line (that is what makes glibc's huge
 * memcpy fast; for the 4 MiB pieces a KV swap moves it does not kick in). */
#define STREAM_MIN ((size_t)1 << 20)

static void copy_bytes(uint8_t *dst, const uint8_t *src, size_t n) {
#if defined(__SSE2__)
    if (n >= STREAM_MIN) {
        size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        memcpy(dst, src, head);
        dst += head;
        src += head;
        n -= head;
        size_t body = n & ~(size_t)63;
        for (size_t i = 0; i < body; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16)),
                    c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
            _mm_stream_si128((__m128i *)(dst + i), a);
            _mm_stream_si128((__m128i *)(dst + i + 16), b);
            _mm_stream_si128((__m128i *)(dst + i + 32), c);
            _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
        _mm_sfence(); /* streaming stores are weakly ordered: complete them before returning */
        memcpy(dst + body, src + body, n - body);
        return;
    }
#endif
    memcpy(dst, src, n);
}

typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
} chunk_job;

static void chunk_task(int i, int n_tasks, void *arg) {
    chunk_job *j = arg;
    size_t a = j->n * (size_t)i / (size_t)n_tasks, b = j->n * (size_t)(i + 1) / (size_t)n_tasks;
    copy_bytes(j->dst + a, j->src + a, b - a);
}

/* One large copy split over the pool's threads (each part streamed). */
static void copy_big(pkv_cpu_ctx *c, uint8_t *dst, const uint8_t *src, size_t n) {
    int tasks = n >= 4 * STREAM_MIN ? pkv_pool_threads(c->pool) : 1;
    chunk_job j = {dst, src, n};
    pkv_pool_run(c->pool, tasks, chunk_task, &j);
}

static void cpu_destroy(void *ctx) {
    pkv_cpu_ctx *c = ctx;
    pkv_pool_free(c->pool);
    pkv_cpu_repack_free_all(c);
    pthread_mutex_destroy(&c->repack_lock);
    pkv_free(c);
}

static pkv_status cpu_buffer_alloc(void *ctx, size_t size, void **handle) {
    pkv_cpu_ctx *c = ctx;
    void *p = pkv_malloc(size);
    if (!p) return pkv_err(PKV_ERR_NOMEM, "%s: cannot allocate %zu bytes of host memory", c->name, size);
    *handle = p;
    return PKV_OK;
}

static pkv_status cpu_buffer_wrap(void *ctx, const void *host, size_t size, void **handle) {
    (void)ctx;
    (void)size;
    *handle = (void *)(uintptr_t)host; /* kernels only read weights; the dispatcher refuses writes */
    return PKV_OK;
}

static void cpu_buffer_unwrap(void *ctx, void *handle, size_t size) { pkv_cpu_repack_drop(ctx, handle, size); }

static void cpu_buffer_free(void *ctx, void *handle) {
    (void)ctx;
    pkv_free(handle);
}

static pkv_status cpu_write(void *ctx, void *dst, size_t off, const void *src, size_t n) {
    copy_big(ctx, (uint8_t *)dst + off, src, n);
    return PKV_OK;
}

static pkv_status cpu_read(void *ctx, void *src, size_t off, void *dst, size_t n) {
    copy_big(ctx, dst, (const uint8_t *)src + off, n);
    return PKV_OK;
}

static pkv_status cpu_fill(void *ctx, void *dst, size_t off, size_t n, uint8_t value) {
    (void)ctx;
    memset((uint8_t *)dst + off, value, n);
    return PKV_OK;
}

static pkv_status cpu_copy(void *ctx, void *src, size_t src_off, void *dst, size_t dst_off, size_t n) {
    copy_big(ctx, (uint8_t *)dst + dst_off, (const uint8_t *)src + src_off, n);
    return PKV_OK;
}

typedef struct {
    uint8_t *src, *dst;
    const pkv_region *r;
    size_t n;
} regions_job;

static void regions_task(int i, int n_tasks, void *arg) {
    regions_job *j = arg;
    size_t a = j->n * (size_t)i / (size_t)n_tasks, b = j->n * (size_t)(i + 1) / (size_t)n_tasks;
    for (size_t k = a; k < b; k++)
        if (j->r[k].size) copy_bytes(j->dst + j->r[k].dst_off, j->src + j->r[k].src_off, j->r[k].size);
}

static pkv_status cpu_copy_regions(void *ctx, void *src, void *dst, const pkv_region *r, size_t n) {
    pkv_cpu_ctx *c = ctx;
    regions_job j = {src, dst, r, n};
    size_t total = 0;
    for (size_t k = 0; k < n; k++) total += r[k].size;
    /* Regions never overlap (checked by the dispatcher), so threads may split them;
     * below a few MiB one thread is faster than waking the pool. */
    int tasks = total >= ((size_t)4 << 20) ? pkv_pool_threads(c->pool) : 1;
    if ((size_t)tasks > n) tasks = (int)n;
    pkv_pool_run(c->pool, tasks, regions_task, &j);
    return PKV_OK;
}

const pkv_backend_ops pkv_cpu_backend_ops = {
    .version = PKV_BACKEND_VERSION,
    .destroy = cpu_destroy,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_wrap = cpu_buffer_wrap,
    .buffer_unwrap = cpu_buffer_unwrap,
    .write = cpu_write,
    .read = cpu_read,
    .fill = cpu_fill,
    .copy = cpu_copy,
    .copy_regions = cpu_copy_regions,
    .flush = NULL,
    .sync = NULL,
    .kernels = &pkv_cpu_kernel_ops,
};

pkv_status pkv_cpu_backend_create(const char *name, pkv_device_params params, const pkv_backend_ops **ops,
                                  void **ctx, pkv_device_caps *caps) {
    pkv_cpu_ctx *c = pkv_calloc(1, sizeof *c);
    if (!c) return pkv_err(PKV_ERR_NOMEM, "opening %s: out of memory", name);
    snprintf(c->name, sizeof c->name, "%s", name);
    int threads = params.n_threads > 0 ? params.n_threads : pkv_cpu_count();
    c->pool = pkv_pool_create(threads);
    if (!c->pool) {
        pkv_free(c);
        return pkv_err_prefix(PKV_ERR_NOMEM, "opening %s", name);
    }
    pthread_mutex_init(&c->repack_lock, NULL);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    memset(caps, 0, sizeof *caps);
    snprintf(caps->name, sizeof caps->name, "%s", name);
    snprintf(caps->description, sizeof caps->description, "host CPU, %d threads, %s kernels", pkv_pool_threads(c->pool),
             pkv_cpu_path_name());
    caps->kind = PKV_DEVICE_CPU;
    caps->memory_bytes = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
    caps->transfer_align = 1;
    caps->max_buffer_bytes = 0;
    caps->host_memory = true;
    caps->batch_invariant = true; /* every kernel computes a row the same way whatever the batch */
    *ops = &pkv_cpu_backend_ops;
    *ctx = c;
    return PKV_OK;
}
