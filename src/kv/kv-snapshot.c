/* A read-only snapshot of one page pool for live views (pagekv serve's
 * GET /v1/kv): each page's flags and how many block tables hold it, the host
 * pool's use, and every live sequence's block table. The pools are those of the
 * memory kinds that have one (their `pool` hook), numbered in table order: 0 the
 * full pool, 1 the window pool. Nothing is changed, so it
 * is taken on the thread that uses the cache, between its operations. */
#include "kv/kv-impl.h"

#include <string.h>

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

pkv_kv_snapshot *pkv_kv_snapshot_take(const pkv_kv_cache *c, int pool) {
    if (!c) {
        pkv_err(PKV_ERR_INVALID, "kv snapshot: cache is NULL");
        return NULL;
    }
    /* pool i: the i-th memory kind with a page pool, in table order */
    const pkv_mem_kind *kinds[PKV_MEM_KINDS];
    const pkv_kv_cache *p = NULL;
    int nk = pkv_kv_kinds(c, kinds);
    for (int i = 0, n = 0; i < nk && !p && pool >= 0; i++)
        if (kinds[i]->pool && n++ == pool) p = kinds[i]->pool((pkv_kv_cache *)c);
    if (!p) {
        pkv_err(PKV_ERR_INVALID, "kv snapshot: no pool %d (0 = main pool, 1 = the window pool of a cache with "
                                 "sliding-window layers)", pool);
        return NULL;
    }
    int n_seqs = 0;
    int64_t listed = 0;
    for (size_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].live) {
            n_seqs++;
            listed += pkv_kv_seq_pages(p, &p->seqs[i]);
        }
    /* one block: header, seqs, pages, refs, flags, host_used */
    size_t o_seqs = align8(sizeof(pkv_kv_snapshot));
    size_t o_pages = o_seqs + align8((size_t)n_seqs * sizeof(pkv_kv_snapshot_seq));
    size_t o_refs = o_pages + align8((size_t)listed * sizeof(int32_t));
    size_t o_flags = o_refs + align8((size_t)p->n_pages * sizeof(int32_t));
    size_t o_host = o_flags + align8((size_t)p->n_pages);
    size_t total = o_host + (size_t)p->host_pages;
    uint8_t *mem = pkv_calloc(1, total);
    if (!mem) {
        pkv_err(PKV_ERR_NOMEM, "kv snapshot: out of memory for %zu bytes (%lld pages, %lld block table entries)",
                total, (long long)p->n_pages, (long long)listed);
        return NULL;
    }
    pkv_kv_snapshot *s = (pkv_kv_snapshot *)(void *)mem;
    s->page_size = p->page_size;
    s->n_pages = p->n_pages;
    s->host_pages = p->host_pages;
    s->n_seqs = n_seqs;
    s->n_listed = listed;
    s->seqs = (pkv_kv_snapshot_seq *)(void *)(mem + o_seqs);
    s->pages = (int32_t *)(void *)(mem + o_pages);
    s->page_refs = (int32_t *)(void *)(mem + o_refs);
    s->page_flags = mem + o_flags;
    s->host_used = mem + o_host;
    pkv_kv_stats_get(c, &s->stats);
    for (int64_t i = 0; i < p->n_pages; i++) {
        const kv_page *pg = &p->pages[i];
        uint8_t f = 0;
        if (pg->free) f |= PKV_KV_PAGE_FREE;
        if (pg->indexed) f |= PKV_KV_PAGE_INDEX;
        if (pg->indexed && pg->refs == 0) f |= PKV_KV_PAGE_CACHED;
        s->page_flags[i] = f;
    }
    if (p->host_used) memcpy(s->host_used, p->host_used, (size_t)p->host_pages);
    int k = 0;
    int64_t at = 0;
    for (size_t i = 0; i < p->n_seqs; i++) {
        const kv_seq *q = &p->seqs[i];
        if (!q->live) continue;
        int64_t n = pkv_kv_seq_pages(p, q);
        pkv_kv_snapshot_seq *o = &s->seqs[k++];
        o->id = (int32_t)i;
        o->n_tokens = q->n_tokens;
        o->swapped = q->swapped;
        o->first = at;
        o->n = n;
        if (q->swapped) {
            memcpy(s->pages + at, q->host, (size_t)n * sizeof *s->pages);
        } else {
            pkv_kv_seq_flatten(q, n, s->pages + at);
            for (int64_t j = 0; j < n; j++)
                if (s->pages[at + j] >= 0) s->page_refs[s->pages[at + j]]++;
        }
        at += n;
    }
    return s;
}

void pkv_kv_snapshot_free(pkv_kv_snapshot *s) { pkv_free(s); }
