/* Page pool: reference counts, a free list, and an LRU list of cached pages
 * (published to the prefix index, referenced by nobody) that are evicted
 * oldest-first when the free list runs dry. Page ids are shared by every shard. */
#include "kv/kv-impl.h"

#include <stdlib.h>
#include <string.h>

pkv_status pkv_kv_pool_init(pkv_kv_cache *c) {
    size_t n = (size_t)c->n_pages, ps = (size_t)c->page_size;
    c->pages = pkv_calloc(n, sizeof *c->pages);
    c->tok = pkv_calloc(n * ps, sizeof *c->tok);
    c->pos = pkv_calloc(n * ps, sizeof *c->pos);
    c->free_stack = pkv_calloc(n, sizeof *c->free_stack);
    uint64_t nb = 1;
    while (nb < n) nb <<= 1;
    c->n_buckets = nb;
    c->buckets = pkv_calloc((size_t)nb, sizeof *c->buckets);
    if (!c->pages || !c->tok || !c->pos || !c->free_stack || !c->buckets)
        return pkv_err(PKV_ERR_NOMEM, "KV page pool: out of host memory for %zu pages", n);
    pkv_kv_pool_reset(c);
    return PKV_OK;
}

void pkv_kv_pool_release(pkv_kv_cache *c) {
    pkv_free(c->pages);
    pkv_free(c->tok);
    pkv_free(c->pos);
    pkv_free(c->free_stack);
    pkv_free(c->buckets);
    c->pages = NULL;
    c->tok = c->pos = c->free_stack = c->buckets = NULL;
}

void pkv_kv_pool_reset(pkv_kv_cache *c) {
    /* Pushed in reverse so a fresh pool hands out ascending ids (long runs for
     * coalesced transfers). */
    for (int64_t i = 0; i < c->n_pages; i++) {
        kv_page *p = &c->pages[i];
        uint32_t gen = p->gen + 1;
        memset(p, 0, sizeof *p);
        p->gen = gen;
        p->lru_prev = p->lru_next = p->hnext = p->prev_page = -1;
        p->st_slot = -1; /* the caller (kv1_clear) releases the state slots wholesale */
        p->free = true;
        c->free_stack[i] = (int32_t)(c->n_pages - 1 - i);
    }
    c->n_free = c->n_pages;
    for (uint64_t b = 0; b < c->n_buckets; b++) c->buckets[b] = -1;
    c->lru_head = c->lru_tail = -1;
    c->n_cached = 0;
}

int64_t pkv_kv_pool_available(const pkv_kv_cache *c) { return c->n_free + c->n_cached; }

static void lru_unlink(pkv_kv_cache *c, int32_t id) {
    kv_page *p = &c->pages[id];
    if (p->lru_prev >= 0)
        c->pages[p->lru_prev].lru_next = p->lru_next;
    else
        c->lru_head = p->lru_next;
    if (p->lru_next >= 0)
        c->pages[p->lru_next].lru_prev = p->lru_prev;
    else
        c->lru_tail = p->lru_prev;
    p->lru_prev = p->lru_next = -1;
    c->n_cached--;
}

static void lru_push(pkv_kv_cache *c, int32_t id) {
    kv_page *p = &c->pages[id];
    p->lru_next = -1;
    p->lru_prev = c->lru_tail;
    if (c->lru_tail >= 0)
        c->pages[c->lru_tail].lru_next = id;
    else
        c->lru_head = id;
    c->lru_tail = id;
    c->n_cached++;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void pkv_kv_pool_take(pkv_kv_cache *c, int64_t n, int32_t *out) {
    for (int64_t i = 0; i < n; i++) {
        int32_t id;
        if (c->n_free > 0) {
            id = c->free_stack[--c->n_free];
        } else {
            id = c->lru_head; /* availability was checked by the caller */
            if (c->disk && !c->pages[id].on_disk) pkv_kv_disk_put(c, id); /* it leaves memory: keep it on disk */
            if (c->remote && !c->pages[id].on_remote) pkv_kv_remote_put(c, id); /* and in Redis */
            lru_unlink(c, id);
            pkv_kv_index_remove(c, id);
            c->stats.evicted_pages++;
        }
        kv_page *p = &c->pages[id];
        p->free = false;
        p->refs = 1;
        out[i] = id;
    }
    if (n > 1) qsort(out, (size_t)n, sizeof *out, cmp_i32);
}

/* Both ignore -1, a window page already released (kv-window.c). */
void pkv_kv_page_ref(pkv_kv_cache *c, int32_t id) {
    if (id < 0) return;
    kv_page *p = &c->pages[id];
    if (p->refs == 0 && !p->free) lru_unlink(c, id); /* a cached page comes back into use */
    p->refs++;
}

bool pkv_kv_page_unref(pkv_kv_cache *c, int32_t id) {
    if (id < 0) return false;
    kv_page *p = &c->pages[id];
    if (--p->refs > 0) return false;
    if (p->indexed) {
        lru_push(c, id);
        if ((c->disk && !p->on_disk) || (c->remote && !p->on_remote)) c->tier_pending++;
        return false;
    }
    p->free = true;
    c->free_stack[c->n_free++] = id;
    return true;
}
