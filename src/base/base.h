/* Internal base layer: errors, logging, allocation, threads, hashing.
 * Every layer may include this; it includes only libc and pagekv.h. */
#ifndef PKV_BASE_H
#define PKV_BASE_H

#include "pagekv.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define PKV_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define PKV_PRINTF(a, b)
#endif

#define PKV_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PKV_MAX(a, b) ((a) > (b) ? (a) : (b))
#define PKV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Record the thread's last error message and return s, so callers write
 *     return pkv_err(PKV_ERR_INVALID, "layer %d: ...", il); */
pkv_status pkv_err(pkv_status s, const char *fmt, ...) PKV_PRINTF(2, 3);
/* Prefix the current message with context: "loading x.gguf: <old message>". The
 * separator is added here (a prefix's own trailing ": " is dropped); with no message
 * yet the prefix alone becomes it. */
pkv_status pkv_err_prefix(pkv_status s, const char *fmt, ...) PKV_PRINTF(2, 3);
void pkv_err_clear(void);

void pkv_log(pkv_log_level level, const char *fmt, ...) PKV_PRINTF(2, 3);
#define PKV_DEBUG(...) pkv_log(PKV_LOG_DEBUG, __VA_ARGS__)
#define PKV_INFO(...) pkv_log(PKV_LOG_INFO, __VA_ARGS__)
#define PKV_WARN(...) pkv_log(PKV_LOG_WARN, __VA_ARGS__)

/* Internal invariant check: logs file/line and returns PKV_ERR_INTERNAL from the
 * enclosing function (which must return pkv_status). Never aborts (I7). */
#define PKV_CHECK_INTERNAL(cond)                                                           \
    do {                                                                                   \
        if (!(cond))                                                                       \
            return pkv_err(PKV_ERR_INTERNAL, "internal error at %s:%d: %s", __FILE__,      \
                           __LINE__, #cond);                                               \
    } while (0)

/* Allocation through the hooks. pkv_malloc(0) returns a valid unique pointer. */
void *pkv_malloc(size_t n);
void *pkv_calloc(size_t count, size_t size); /* checks count*size overflow */
void *pkv_realloc(void *p, size_t n);
void pkv_free(void *p);
char *pkv_strdup(const char *s);
char *pkv_strndup(const char *s, size_t n); /* the first n bytes of s (no NUL among them needed), NUL-terminated */
/* Grow *arr (of elem bytes each) so it holds at least need elements; *cap updated.
 * On failure returns PKV_ERR_NOMEM with a message and leaves the array and its capacity unchanged. */
pkv_status pkv_grow(void **arr, size_t *cap, size_t need, size_t elem);

/* Overflow-checked size arithmetic: returns false on overflow. */
static inline bool pkv_mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}
static inline bool pkv_add_ok(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return false;
    *out = a + b;
    return true;
}

/* Thread pool: pkv_pool_run calls fn(i, n_tasks, arg) for i in [0, n_tasks) across
 * the pool's threads plus the caller's, and returns when all have finished. */
typedef struct pkv_pool pkv_pool;
typedef void (*pkv_pool_fn)(int i, int n_tasks, void *arg);
/* n_threads counts the calling thread: 1 makes a pool that runs everything inline. */
pkv_pool *pkv_pool_create(int n_threads);
void pkv_pool_free(pkv_pool *pool);
int pkv_pool_threads(const pkv_pool *pool);
void pkv_pool_run(pkv_pool *pool, int n_tasks, pkv_pool_fn fn, void *arg);
int pkv_cpu_count(void);

/* 64-bit hashing (FNV-1a style mixing with a final avalanche). Chainable:
 * pkv_hash64(data, n, seed) with seed = previous hash. */
uint64_t pkv_hash64(const void *data, size_t n, uint64_t seed);
/* The same contract for bulk data (weights): faster on large n, other values. */
uint64_t pkv_hash64_bulk(const void *data, size_t n, uint64_t seed);

/* Safe output files (file.c). pkv_file_check_output: PKV_OK when path does not
 * exist or is a regular file; PKV_ERR_IO naming what it is otherwise (device, FIFO,
 * symlink, directory). pkv_wfile_open checks the target and opens a fresh temporary
 * file beside it; write to w->f, then pkv_wfile_commit (flush, fsync, check the
 * target again, rename over it, fsync the directory) or pkv_wfile_abort (remove the
 * temporary). Both release w; the target is never touched unless the rename
 * succeeds (a failed directory fsync after it is reported, the file in place). */
#include <stdio.h>
typedef struct pkv_wfile {
    FILE *f;
    char *path, *tmp;
} pkv_wfile;
pkv_status pkv_file_check_output(const char *path);
/* A lock file (never written: the target of flock): refused when it is not a
 * regular file (a symlink is never followed), else opened, created when
 * missing. The descriptor, or -1 with errno set and pkv_errmsg() saying why
 * (which file, "is a symbolic link: refused"). */
int pkv_file_open_lock(const char *path);
pkv_status pkv_wfile_open(pkv_wfile *w, const char *path);
pkv_status pkv_wfile_commit(pkv_wfile *w);
void pkv_wfile_abort(pkv_wfile *w);

/* Monotonic time in seconds. */
double pkv_time_now(void);

#endif /* PKV_BASE_H */
