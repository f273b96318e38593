/* Allocation hooks with failure injection for tests (Lua's lua_Alloc idea:
 * one place every allocation passes through). */
#include "base/base.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static void *libc_alloc(size_t n, void *u) { (void)u; return malloc(n); }
static void *libc_realloc(void *p, size_t n, void *u) { (void)u; return realloc(p, n); }
static void libc_free(void *p, void *u) { (void)u; free(p); }

static pkv_allocator g_alloc = {libc_alloc, libc_realloc, libc_free, NULL};
static _Atomic uint64_t g_count;   /* allocations since the last pkv_alloc_fail_at */
static _Atomic uint64_t g_fail_at; /* 0: never fail */
static _Atomic int64_t g_live;

void pkv_allocator_set(const pkv_allocator *a) {
    if (a && a->alloc && a->realloc && a->free)
        g_alloc = *a;
    else
        g_alloc = (pkv_allocator){libc_alloc, libc_realloc, libc_free, NULL};
}

uint64_t pkv_alloc_fail_at(uint64_t n) {
    uint64_t c = atomic_exchange(&g_count, 0);
    atomic_store(&g_fail_at, n);
    return c;
}

int64_t pkv_alloc_live(void) { return atomic_load(&g_live); }

/* True when this allocation must fail (test injection). */
static bool inject_failure(void) {
    uint64_t c = atomic_fetch_add(&g_count, 1) + 1;
    uint64_t f = atomic_load(&g_fail_at);
    return f != 0 && c == f;
}

void *pkv_malloc(size_t n) {
    if (inject_failure()) return NULL;
    void *p = g_alloc.alloc(n ? n : 1, g_alloc.user);
    if (p) atomic_fetch_add(&g_live, 1);
    return p;
}

void *pkv_calloc(size_t count, size_t size) {
    size_t n;
    if (!pkv_mul_ok(count, size, &n)) return NULL;
    void *p = pkv_malloc(n);
    if (p) memset(p, 0, n);
    return p;
}

void *pkv_realloc(void *p, size_t n) {
    if (!p) return pkv_malloc(n);
    if (inject_failure()) return NULL;
    return g_alloc.realloc(p, n ? n : 1, g_alloc.user);
}

void pkv_free(void *p) {
    if (!p) return;
    atomic_fetch_sub(&g_live, 1);
    g_alloc.free(p, g_alloc.user);
}

char *pkv_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = pkv_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *pkv_strndup(const char *s, size_t n) {
    char *d = pkv_malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

pkv_status pkv_grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return PKV_OK;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2) return pkv_err(PKV_ERR_NOMEM, "array of %zu elements is too large", need);
        ncap *= 2;
    }
    size_t bytes;
    if (!pkv_mul_ok(ncap, elem, &bytes))
        return pkv_err(PKV_ERR_NOMEM, "array of %zu x %zu bytes overflows", ncap, elem);
    void *p = pkv_realloc(*arr, bytes);
    if (!p) return pkv_err(PKV_ERR_NOMEM, "cannot allocate %zu bytes", bytes);
    *arr = p;
    *cap = ncap;
    return PKV_OK;
}
