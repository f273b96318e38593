/* Repacked weight layouts of the CPU matmul (cpu-impl.h, pkv_cpu_repack_get):
 * q4_k rows in groups of 8 as pkv_q4kr (cpu-dots.h) for the avx2 and avx512
 * paths. The copy is made on the first matmul that uses a weight and kept per
 * weight until its buffer is freed; only wrapped buffers (a mapped GGUF file:
 * read-only while they live) are repacked, so a copy can never go stale. A
 * weight that cannot be repacked (fewer than 8 rows, a path without the kernel,
 * no memory) keeps the plain layout; rows past the last whole group of 8 are
 * read from the plain layout. */
#include "device/cpu/cpu-impl.h"

#include "device/cpu/cpu-dots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pkv_cpu_repack {
    struct pkv_cpu_repack *next;
    const uint8_t *w; /* the plain weights */
    int64_t rows, cols;
    pkv_type t;
    pkv_q4kr *data;  /* rows / 8 groups of cols / 256 super-blocks; NULL: plain */
    size_t bytes;    /* of data */
    const char *why; /* data == NULL: why the plain layout */
} pkv_cpu_repack;

static bool repack_enabled(void) {
    const char *e = getenv("PKV_CPU_REPACK");
    return !(e && e[0] == '0' && !e[1]);
}

typedef struct {
    const uint8_t *w;
    size_t rb;
    int64_t groups, nb;
    pkv_q4kr *dst;
} repack_job;

static void repack_task(int ti, int n_tasks, void *arg) {
    const repack_job *j = arg;
    for (int64_t g = j->groups * ti / n_tasks; g < j->groups * (ti + 1) / n_tasks; g++)
        pkv_cpu_repack_q4_k(j->w + (size_t)g * PKV_Q4KR_ROWS * j->rb, j->rb, j->nb, j->dst + g * j->nb);
}

static pkv_cpu_repack *repack_make(pkv_cpu_ctx *c, const uint8_t *w, pkv_type t, int64_t rows, int64_t cols) {
    pkv_cpu_repack *e = pkv_calloc(1, sizeof *e);
    if (!e) return NULL;
    e->w = w;
    e->rows = rows;
    e->cols = cols;
    e->t = t;
    const int64_t groups = rows / PKV_Q4KR_ROWS, nb = cols / 256;
    if (groups == 0) {
        e->why = "fewer than 8 rows";
        return e;
    }
    e->bytes = (size_t)groups * (size_t)nb * sizeof(pkv_q4kr);
    e->data = pkv_malloc(e->bytes);
    if (!e->data) {
        e->bytes = 0;
        e->why = "no memory for the copy";
        return e;
    }
    repack_job j = {w, pkv_type_row_bytes(t, (size_t)cols), groups, nb, e->data};
    pkv_pool_run(c->pool, (int)PKV_MIN(groups, (int64_t)pkv_pool_threads(c->pool)), repack_task, &j);
    return e;
}

const struct pkv_q4kr *pkv_cpu_repack_get(pkv_cpu_ctx *c, pkv_tref w, pkv_type t, int64_t rows, int64_t cols) {
    if (t != PKV_TYPE_Q4_K || !repack_enabled()) return NULL;
    const uint8_t *p = pkv_cpu_ptr(w);
    pthread_mutex_lock(&c->repack_lock);
    pkv_cpu_repack *e = c->repacked;
    while (e && !(e->w == p && e->rows == rows && e->cols == cols && e->t == t)) e = e->next;
    if (!e && (e = w.buf->wrapped ? repack_make(c, p, t, rows, cols) : NULL) != NULL) {
        e->next = c->repacked;
        c->repacked = e;
    }
    pthread_mutex_unlock(&c->repack_lock);
    return e ? e->data : NULL;
}

void pkv_cpu_repack_drop(pkv_cpu_ctx *c, const void *host, size_t size) {
    const uint8_t *lo = host, *hi = lo + size;
    pthread_mutex_lock(&c->repack_lock);
    for (pkv_cpu_repack **pp = &c->repacked; *pp;) {
        pkv_cpu_repack *e = *pp;
        if (e->w >= lo && e->w < hi) {
            *pp = e->next;
            pkv_free(e->data);
            pkv_free(e);
        } else {
            pp = &e->next;
        }
    }
    pthread_mutex_unlock(&c->repack_lock);
}

void pkv_cpu_repack_free_all(pkv_cpu_ctx *c) {
    while (c->repacked) {
        pkv_cpu_repack *e = c->repacked;
        c->repacked = e->next;
        pkv_free(e->data);
        pkv_free(e);
    }
}

void pkv_cpu_repack_layout(pkv_cpu_ctx *c, pkv_type t, char *buf, size_t size) {
    int64_t n_rep = 0, n_plain = 0;
    uint64_t bytes = 0;
    const char *why = NULL;
    pthread_mutex_lock(&c->repack_lock);
    for (const pkv_cpu_repack *e = c->repacked; e; e = e->next) {
        if (e->t != t) continue;
        if (e->data) {
            n_rep++;
            bytes += e->bytes;
        } else {
            n_plain++;
            why = e->why;
        }
    }
    pthread_mutex_unlock(&c->repack_lock);
    if (!n_rep && !n_plain)
        snprintf(buf, size, "plain");
    else if (!n_plain)
        snprintf(buf, size, "repacked8: %lld weights (%llu bytes)", (long long)n_rep, (unsigned long long)bytes);
    else
        snprintf(buf, size, "repacked8: %lld weights (%llu bytes), plain: %lld weights (%s)", (long long)n_rep,
                 (unsigned long long)bytes, (long long)n_plain, why);
}
