/* Sequences: block tables as shared node chains plus own pages, append with
 * copy-on-write, CSR block tables, O(1) fork, truncate. */
#include "kv/kv-impl.h"

#include <string.h>

kv_seq *pkv_kv_seq_get(pkv_kv_cache *c, int32_t id, const char *what) {
    if (!c) {
        pkv_err(PKV_ERR_INVALID, "%s: cache is NULL", what);
        return NULL;
    }
    if (id < 0 || (size_t)id >= c->n_seqs || !c->seqs[id].live) {
        pkv_err(PKV_ERR_NOT_FOUND, "%s: no sequence %d in this cache", what, id);
        return NULL;
    }
    return &c->seqs[id];
}

kv_seq *pkv_kv_seq_resident(pkv_kv_cache *c, int32_t id, const char *what) {
    kv_seq *s = pkv_kv_seq_get(c, id, what);
    if (s && s->swapped) {
        pkv_err(PKV_ERR_INVALID, "%s: sequence %d is swapped out (pkv_kv_swap_in it first)", what, id);
        return NULL;
    }
    return s;
}

int64_t pkv_kv_seq_pages(const pkv_kv_cache *c, const kv_seq *s) {
    return (s->n_tokens + c->page_size - 1) / c->page_size;
}

int32_t pkv_kv_seq_page(const kv_seq *s, int64_t i) {
    if (i >= s->n_prefix) return s->own[i - s->n_prefix];
    const kv_node *n = s->prefix;
    while (i < n->n_before) n = n->parent;
    return n->pages[i - n->n_before];
}

void pkv_kv_seq_flatten(const kv_seq *s, int64_t n, int32_t *out) {
    int64_t k = PKV_MIN(n, s->n_prefix);
    for (const kv_node *nd = s->prefix; nd; nd = nd->parent) {
        if (nd->n_before >= k) continue;
        int64_t take = PKV_MIN(nd->n, k - nd->n_before);
        memcpy(out + nd->n_before, nd->pages, (size_t)take * sizeof *out);
    }
    if (n > s->n_prefix) memcpy(out + s->n_prefix, s->own, (size_t)(n - s->n_prefix) * sizeof *out);
}

void pkv_kv_node_unref(pkv_kv_cache *c, kv_node *n) {
    while (n && --n->refs == 0) {
        for (int64_t i = 0; i < n->n; i++) pkv_kv_page_unref(c, n->pages[i]);
        kv_node *parent = n->parent;
        pkv_free(n->pages);
        pkv_free(n);
        n = parent;
    }
}

pkv_status pkv_kv_keep_prepare(pkv_kv_cache *c, kv_seq *s, int64_t keep, int64_t n_tail, int64_t n_tokens,
                               kv_keep_plan *plan) {
    (void)c;
    memset(plan, 0, sizeof *plan);
    plan->keep = keep;
    if (n_tokens >= s->n_prefix * c->page_size && keep >= s->n_prefix) {
        /* The node chain stays; only the own list changes. */
        size_t need = (size_t)(keep - s->n_prefix + n_tail);
        void *arr = s->own;
        size_t cap = s->cap_own;
        pkv_status st = pkv_grow(&arr, &cap, need ? need : 1, sizeof(int32_t));
        if (st) return st;
        s->own = arr;
        s->cap_own = cap;
        return PKV_OK;
    }
    plan->cap = (size_t)(keep + n_tail) + 1;
    plan->arr = pkv_malloc(plan->cap * sizeof(int32_t));
    if (!plan->arr) return pkv_err(PKV_ERR_NOMEM, "KV sequence: out of memory for a block table of %zu pages", plan->cap);
    pkv_kv_seq_flatten(s, keep, plan->arr);
    return PKV_OK;
}

void pkv_kv_keep_apply(pkv_kv_cache *c, kv_seq *s, kv_keep_plan *plan, const int32_t *tail, int64_t n_tail,
                       int64_t n_tokens) {
    int64_t keep = plan->keep;
    if (plan->arr) {
        for (int64_t i = 0; i < keep; i++) pkv_kv_page_ref(c, plan->arr[i]);
        for (size_t i = 0; i < s->n_own; i++) pkv_kv_page_unref(c, s->own[i]);
        pkv_kv_node_unref(c, s->prefix);
        pkv_free(s->own);
        s->prefix = NULL;
        s->n_prefix = 0;
        s->own = plan->arr;
        s->cap_own = plan->cap;
        s->n_own = (size_t)keep;
        plan->arr = NULL;
    } else {
        for (size_t i = (size_t)(keep - s->n_prefix); i < s->n_own; i++) pkv_kv_page_unref(c, s->own[i]);
        s->n_own = (size_t)(keep - s->n_prefix);
    }
    if (n_tail) memcpy(s->own + s->n_own, tail, (size_t)n_tail * sizeof *tail);
    s->n_own += (size_t)n_tail;
    s->n_tokens = n_tokens;
    s->n_hole = PKV_MIN(s->n_hole, keep);
    if (n_tokens <= s->exact_until) s->exact_until = INT64_MAX; /* every moved token is gone */
    int64_t full = n_tokens / c->page_size;
    if (s->pub_n >= full) {
        s->pub_n = PKV_MIN(s->pub_n, full);
        s->pub_stop = false;
    }
    if (keep <= s->pub_n) {
        s->pub_n = keep;
        s->pub_stop = false;
    }
}

pkv_status pkv_kv_seq_alloc_slot(pkv_kv_cache *c, int32_t *id) {
    size_t i = 0;
    while (i < c->n_seqs && c->seqs[i].live) i++;
    if (i == c->n_seqs) {
        if (c->n_seqs >= INT32_MAX) return pkv_err(PKV_ERR_NOMEM, "KV cache: too many sequences");
        void *arr = c->seqs;
        size_t cap = c->cap_seqs;
        pkv_status s = pkv_grow(&arr, &cap, c->n_seqs + 1, sizeof(kv_seq));
        if (s) return s;
        c->seqs = arr;
        c->cap_seqs = cap;
        c->n_seqs++;
    }
    memset(&c->seqs[i], 0, sizeof c->seqs[i]);
    c->seqs[i].exact_until = INT64_MAX;
    c->seqs[i].st.slot = -1;
    *id = (int32_t)i;
    return PKV_OK;
}

void pkv_kv_seq_adopt(pkv_kv_cache *c, int32_t id, uint64_t fp, int64_t exact_until, int64_t n_tokens, int64_t n_hole,
                      int32_t *pages, int64_t n_pages) {
    kv_seq *s = &c->seqs[id];
    memset(s, 0, sizeof *s);
    s->live = true;
    s->fp = fp;
    s->exact_until = exact_until;
    s->n_tokens = n_tokens;
    s->n_hole = n_hole;
    s->own = pages;
    s->n_own = (size_t)n_pages;
    s->cap_own = (size_t)(n_pages ? n_pages : 1);
    s->st.slot = -1;
    c->n_live++;
}

void pkv_kv_seq_unadopt(pkv_kv_cache *c, int32_t id) {
    kv_seq *s = &c->seqs[id];
    pkv_kv_seq_release(c, s); /* nothing of it was published */
    s->live = false;
    c->n_live--;
}

pkv_status kv1_seq_create(pkv_kv_cache *c, uint64_t fingerprint, int32_t *seq) {
    if (!c || !seq) return pkv_err(PKV_ERR_INVALID, "pkv_kv_seq_create: NULL argument");
    int32_t id = -1;
    pkv_status st = pkv_kv_seq_alloc_slot(c, &id);
    if (st) return st;
    kv_seq *s = &c->seqs[id];
    s->live = true;
    s->fp = fingerprint;
    c->n_live++;
    *seq = id;
    return PKV_OK;
}

void pkv_kv_seq_release(pkv_kv_cache *c, kv_seq *s) {
    if (s->swapped) {
        pkv_kv_host_release_pages(c, s->host, pkv_kv_seq_pages(c, s));
    } else {
        for (size_t i = 0; i < s->n_own; i++) pkv_kv_page_unref(c, s->own[i]);
        pkv_kv_node_unref(c, s->prefix);
    }
    pkv_free(s->own);
    pkv_free(s->host);
    pkv_free(s->sw_tok);
    pkv_free(s->sw_pos);
    pkv_kv_media_release(s);
    bool live = s->live;
    uint64_t fp = s->fp;
    kv_seq_state st = s->st; /* the state's owner (kv-state.c) releases it */
    memset(s, 0, sizeof *s);
    s->live = live;
    s->fp = fp;
    s->st = st;
    s->exact_until = INT64_MAX;
}

pkv_status kv1_seq_free(pkv_kv_cache *c, int32_t seq) {
    kv_seq *s = pkv_kv_seq_get(c, seq, "free sequence");
    if (!s) return PKV_ERR_NOT_FOUND;
    pkv_kv_seq_publish(c, s);
    pkv_kv_seq_release(c, s);
    pkv_kv_state_seq_release(c, s); /* no-op without recurrent layers */
    s->live = false;
    c->n_live--;
    return PKV_OK;
}

int64_t pkv_kv_seq_len(const pkv_kv_cache *c, int32_t seq) {
    if (!c || seq < 0 || (size_t)seq >= c->n_seqs || !c->seqs[seq].live) return -1;
    return c->seqs[seq].n_tokens;
}

bool pkv_kv_seq_swapped(const pkv_kv_cache *c, int32_t seq) {
    return pkv_kv_seq_len(c, seq) >= 0 && c->seqs[seq].swapped;
}

pkv_status pkv_kv_seq_tokens(const pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n, int32_t *tokens,
                             int32_t *pos) {
    kv_seq *s = pkv_kv_seq_get((pkv_kv_cache *)c, seq, "sequence tokens");
    if (!s) return PKV_ERR_NOT_FOUND;
    if (start < 0 || n < 0 || start + n > s->n_tokens)
        return pkv_err(PKV_ERR_INVALID, "sequence %d tokens [%lld, +%lld) are outside its %lld tokens", seq,
                       (long long)start, (long long)n, (long long)s->n_tokens);
    if (s->swapped) {
        if (tokens) memcpy(tokens, s->sw_tok + start, (size_t)n * sizeof *tokens);
        if (pos) memcpy(pos, s->sw_pos + start, (size_t)n * sizeof *pos);
        return PKV_OK;
    }
    int ps = c->page_size;
    for (int64_t t = start; t < start + n;) {
        int64_t pi = t / ps, slot = t % ps;
        int32_t page = pkv_kv_seq_page(s, pi);
        int64_t k = PKV_MIN(ps - slot, start + n - t);
        size_t at = (size_t)page * ps + (size_t)slot;
        if (tokens) memcpy(tokens + (t - start), c->tok + at, (size_t)k * sizeof *tokens);
        if (pos) memcpy(pos + (t - start), c->pos + at, (size_t)k * sizeof *pos);
        t += k;
    }
    return PKV_OK;
}

/* ------------------------------------------------------------- page stats */

pkv_status pkv_kv_seq_page_stats(const pkv_kv_cache *c, int32_t seq, int64_t *pages, int64_t *shared) {
    if (!pages || !shared) return pkv_err(PKV_ERR_INVALID, "sequence page stats: NULL output");
    *pages = *shared = 0;
    kv_seq *s = pkv_kv_seq_get((pkv_kv_cache *)c, seq, "sequence page stats");
    if (!s) return PKV_ERR_NOT_FOUND;
    *pages = pkv_kv_seq_pages(c, s);
    if (s->swapped) return PKV_OK; /* host copies are the sequence's own */
    /* A node's pages are reached by every holder of it and of every node below it
     * in this chain: once one of those has another holder, the rest of the chain is
     * shared whole. Otherwise a page is shared when it has another holder itself
     * (a prefix match put it in someone else's list too). */
    bool chain_shared = false;
    for (const kv_node *nd = s->prefix; nd; nd = nd->parent) {
        chain_shared = chain_shared || nd->refs > 1;
        if (chain_shared) {
            *shared += nd->n;
            continue;
        }
        for (int64_t i = 0; i < nd->n; i++) *shared += c->pages[nd->pages[i]].refs > 1;
    }
    for (size_t i = 0; i < s->n_own; i++) *shared += c->pages[s->own[i]].refs > 1;
    return PKV_OK;
}

pkv_status pkv_kv_pages_held(const pkv_kv_cache *c, int n_seqs, const int32_t *seqs, int64_t *device_pages,
                             int64_t *host_pages) {
    if (!c || !device_pages || !host_pages || n_seqs < 0 || (n_seqs && !seqs))
        return pkv_err(PKV_ERR_INVALID, "pages held: NULL argument");
    *device_pages = *host_pages = 0;
    uint8_t *seen = pkv_calloc((size_t)(c->n_pages / 8 + 1), 1); /* [n_pages] bits */
    if (!seen) return pkv_err(PKV_ERR_NOMEM, "pages held: out of memory for a %lld-page bitmap", (long long)c->n_pages);
    const kv_node **done = NULL; /* nodes already counted (a shared chain is walked once) */
    size_t n_done = 0, cap_done = 0;
    pkv_status st = PKV_OK;
#define MARK(p)                                                   \
    do {                                                          \
        int32_t p_ = (p);                                         \
        if (!(seen[p_ >> 3] & (1u << (p_ & 7)))) {                \
            seen[p_ >> 3] |= (uint8_t)(1u << (p_ & 7));           \
            (*device_pages)++;                                    \
        }                                                         \
    } while (0)
    for (int k = 0; k < n_seqs && !st; k++) {
        if (seqs[k] < 0 || (size_t)seqs[k] >= c->n_seqs || !c->seqs[seqs[k]].live) continue;
        const kv_seq *s = &c->seqs[seqs[k]];
        if (s->swapped) {
            *host_pages += pkv_kv_seq_pages(c, s);
            continue;
        }
        for (const kv_node *nd = s->prefix; nd; nd = nd->parent) {
            bool seen_node = false;
            if (nd->refs > 1) { /* only a shared node can be met twice */
                for (size_t i = 0; i < n_done && !seen_node; i++) seen_node = done[i] == nd;
                if (seen_node) break; /* it and everything above it are counted */
                if (n_done == cap_done) {
                    size_t nc = cap_done ? cap_done * 2 : 16;
                    const kv_node **a = pkv_realloc(done, nc * sizeof *a);
                    if (!a) {
                        st = pkv_err(PKV_ERR_NOMEM, "pages held: out of memory");
                        break;
                    }
                    done = a;
                    cap_done = nc;
                }
                done[n_done++] = nd;
            }
            for (int64_t i = 0; i < nd->n; i++) MARK(nd->pages[i]);
        }
        for (size_t i = 0; i < s->n_own; i++) MARK(s->own[i]);
    }
#undef MARK
    pkv_free(done);
    pkv_free(seen);
    return st;
}

/* ------------------------------------------------------------------ append */

pkv_status pkv_kv_append(pkv_kv_cache *c, int32_t seq, int32_t n, const int32_t *tokens, const int32_t *pos,
                         int32_t *rows) {
    return pkv_kv_append_batch(c, 1, &seq, &n, tokens, pos, rows);
}

/* Does appending into the partial page `id` require a private copy first? */
static bool page_is_shared(const pkv_kv_cache *c, int32_t id) {
    return c->pages[id].refs > 1 || c->pages[id].indexed;
}

pkv_status kv1_append_batch(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                               const int32_t *tokens, const int32_t *pos, int32_t *rows) {
    if (!c || n_seqs < 0 || (n_seqs > 0 && (!seqs || !n_tokens)))
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_append_batch: NULL argument or negative count");
    int ps = c->page_size;
    int64_t total = 0, need = 0, n_cow = 0;
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = pkv_kv_seq_resident(c, seqs[i], "append");
        if (!s) return PKV_ERR_INVALID;
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return pkv_err(PKV_ERR_INVALID, "append: sequence %d appears twice in the batch (entries %d and %d)",
                               seqs[i], j, i);
        if (n_tokens[i] < 0) return pkv_err(PKV_ERR_INVALID, "append: %d tokens for sequence %d", n_tokens[i], seqs[i]);
        if (s->n_tokens + n_tokens[i] > (int64_t)INT32_MAX)
            return pkv_err(PKV_ERR_INVALID, "append: sequence %d would exceed 2^31 tokens", seqs[i]);
        total += n_tokens[i];
        int64_t have = pkv_kv_seq_pages(c, s);
        need += (s->n_tokens + n_tokens[i] + ps - 1) / ps - have;
        if (n_tokens[i] > 0 && s->n_tokens % ps && page_is_shared(c, s->own[s->n_own - 1])) n_cow++;
    }
    if (total > 0 && !rows) return pkv_err(PKV_ERR_INVALID, "append: rows is NULL");
    if (total == 0) return PKV_OK;
    /* Publish what previous steps wrote, so full pages become shareable and a page
     * that is published gets copied below rather than overwritten. */
    for (int i = 0; i < n_seqs; i++) pkv_kv_seq_publish(c, &c->seqs[seqs[i]]);
    n_cow = 0;
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = &c->seqs[seqs[i]];
        if (n_tokens[i] > 0 && s->n_tokens % ps && page_is_shared(c, s->own[s->n_own - 1])) n_cow++;
    }
    int64_t avail = pkv_kv_pool_available(c);
    if (need + n_cow > avail)
        return pkv_err(PKV_ERR_OUT_OF_PAGES,
                       "append of %lld tokens to %d sequences needs %lld pages (%lld copy-on-write), %lld are free or "
                       "evictable of %lld",
                       (long long)total, n_seqs, (long long)(need + n_cow), (long long)n_cow, (long long)avail,
                       (long long)c->n_pages);
    /* Reserve every host array before changing anything. */
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = &c->seqs[seqs[i]];
        size_t want = s->n_own + (size_t)((s->n_tokens + n_tokens[i] + ps - 1) / ps - pkv_kv_seq_pages(c, s));
        void *arr = s->own;
        size_t cap = s->cap_own;
        pkv_status st = pkv_grow(&arr, &cap, want ? want : 1, sizeof(int32_t));
        if (st) return pkv_err_prefix(st, "append to sequence %d", seqs[i]);
        s->own = arr;
        s->cap_own = cap;
    }
    int32_t *fresh = pkv_malloc((size_t)(need + n_cow) * sizeof *fresh);
    kv_run *runs = pkv_malloc((size_t)(n_cow ? n_cow : 1) * sizeof *runs);
    bool *cow = pkv_malloc((size_t)n_seqs * sizeof *cow);
    if (!fresh || !runs || !cow) {
        pkv_free(fresh);
        pkv_free(runs);
        pkv_free(cow);
        return pkv_err(PKV_ERR_NOMEM, "append: out of memory for %lld page ids", (long long)(need + n_cow));
    }
    pkv_kv_pool_take(c, need + n_cow, fresh);
    /* Copy-on-write: the shared partial pages, all layers and shards, one batched
     * region copy per arena. */
    int64_t k = 0;
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = &c->seqs[seqs[i]];
        /* Decided once: two sequences sharing the page both copy it, even though
         * the first copy drops the page to one holder. */
        cow[i] = n_tokens[i] > 0 && s->n_tokens % ps && page_is_shared(c, s->own[s->n_own - 1]);
        if (cow[i]) {
            runs[k].src = (int64_t)s->own[s->n_own - 1] * ps;
            runs[k].dst = (int64_t)fresh[k] * ps;
            runs[k].n = s->n_tokens % ps; /* only the valid slots */
            k++;
        }
    }
    if (n_cow) {
        pkv_status st = pkv_kv_copy_runs(c, runs, (size_t)n_cow);
        if (st) {
            for (int64_t i = 0; i < need + n_cow; i++) pkv_kv_page_unref(c, fresh[i]);
            pkv_free(fresh);
            pkv_free(runs);
            pkv_free(cow);
            return pkv_err_prefix(st, "append: copy-on-write of %lld pages", (long long)n_cow);
        }
    }
    /* Commit. */
    k = 0;
    int64_t next = n_cow, at = 0;
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = &c->seqs[seqs[i]];
        int32_t nt = n_tokens[i];
        if (nt == 0) continue;
        if (cow[i]) {
            int32_t old = s->own[s->n_own - 1], nw = fresh[k++];
            size_t used = (size_t)(s->n_tokens % ps);
            memcpy(c->tok + (size_t)nw * ps, c->tok + (size_t)old * ps, used * sizeof(int32_t));
            memcpy(c->pos + (size_t)nw * ps, c->pos + (size_t)old * ps, used * sizeof(int32_t));
            s->own[s->n_own - 1] = nw;
            pkv_kv_page_unref(c, old);
            c->stats.cow_pages++;
            c->stats.cow_bytes += used * (c->page_bytes_all / (size_t)ps);
        }
        int32_t last_pos = -1;
        if (s->n_tokens > 0) {
            int32_t lp = pkv_kv_seq_page(s, (s->n_tokens - 1) / ps);
            last_pos = c->pos[(size_t)lp * ps + (size_t)((s->n_tokens - 1) % ps)];
        }
        for (int32_t j = 0; j < nt; j++, at++) {
            int64_t t = s->n_tokens;
            if (t % ps == 0) s->own[s->n_own++] = fresh[next++];
            int32_t page = s->own[s->n_own - 1];
            size_t idx = (size_t)page * ps + (size_t)(t % ps);
            c->tok[idx] = tokens ? tokens[at] : -1;
            c->pos[idx] = pos ? pos[at] : ++last_pos;
            rows[at] = (int32_t)idx;
            s->n_tokens++;
        }
    }
    pkv_free(fresh);
    pkv_free(runs);
    pkv_free(cow);
    return PKV_OK;
}

/* ------------------------------------------------------------- block table */

pkv_status kv1_block_table_get(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, bool with_positions,
                                  pkv_kv_block_table *out) {
    if (!c || !out || n_seqs < 0 || (n_seqs > 0 && !seqs))
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_block_table_get: NULL argument or negative count");
    int64_t n_pages = 0, n_tok = 0;
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = pkv_kv_seq_resident(c, seqs[i], "block table");
        if (!s) return PKV_ERR_INVALID;
        n_pages += pkv_kv_seq_pages(c, s);
        n_tok += s->n_tokens;
    }
    if (n_pages > INT32_MAX || n_tok > INT32_MAX)
        return pkv_err(PKV_ERR_INVALID, "block table: %lld pages / %lld tokens exceed 2^31", (long long)n_pages,
                       (long long)n_tok);
    void *a;
    size_t cap;
    pkv_status st = PKV_OK;
    /* The per-sequence arrays share one capacity; grow each to it. */
    size_t seq_need = (size_t)n_seqs + 1;
    if (seq_need > c->cap_seqs_bt) {
        size_t c1, c2, c3, c4;
        c1 = c2 = c3 = c4 = c->cap_seqs_bt;
        a = c->bt_indptr; if (!st) st = pkv_grow(&a, &c1, seq_need, sizeof(int32_t)); c->bt_indptr = a;
        a = c->bt_last; if (!st) st = pkv_grow(&a, &c2, seq_need, sizeof(int32_t)); c->bt_last = a;
        a = c->bt_len; if (!st) st = pkv_grow(&a, &c3, seq_need, sizeof(int32_t)); c->bt_len = a;
        a = c->bt_tok_indptr; if (!st) st = pkv_grow(&a, &c4, seq_need, sizeof(int32_t)); c->bt_tok_indptr = a;
        if (st) return st; /* arrays that grew keep their larger block; cap stays the old minimum */
        c->cap_seqs_bt = PKV_MIN(PKV_MIN(c1, c2), PKV_MIN(c3, c4));
    }
    a = c->bt_pages; cap = c->cap_pages_bt;
    st = pkv_grow(&a, &cap, (size_t)(n_pages ? n_pages : 1), sizeof(int32_t));
    c->bt_pages = a; c->cap_pages_bt = cap;
    if (st) return st;
    if (with_positions) {
        a = c->bt_pos; cap = c->cap_pos_bt;
        st = pkv_grow(&a, &cap, (size_t)(n_tok ? n_tok : 1), sizeof(int32_t));
        c->bt_pos = a; c->cap_pos_bt = cap;
        if (st) return st;
    }
    int32_t pg = 0, tk = 0;
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = &c->seqs[seqs[i]];
        int64_t np = pkv_kv_seq_pages(c, s);
        c->bt_indptr[i] = pg;
        c->bt_tok_indptr[i] = tk;
        pkv_kv_seq_flatten(s, np, c->bt_pages + pg);
        c->bt_last[i] = s->n_tokens == 0 ? 0 : (int32_t)((s->n_tokens - 1) % c->page_size + 1);
        c->bt_len[i] = (int32_t)s->n_tokens;
        if (with_positions) pkv_kv_seq_tokens(c, seqs[i], 0, s->n_tokens, NULL, c->bt_pos + tk);
        pg += (int32_t)np;
        tk += (int32_t)s->n_tokens;
    }
    c->bt_indptr[n_seqs] = pg;
    c->bt_tok_indptr[n_seqs] = tk;
    out->n_seqs = n_seqs;
    out->indptr = c->bt_indptr;
    out->pages = c->bt_pages;
    out->last_page_len = c->bt_last;
    out->seq_len = c->bt_len;
    out->tok_indptr = with_positions ? c->bt_tok_indptr : NULL;
    out->positions = with_positions ? c->bt_pos : NULL;
    return PKV_OK;
}

/* -------------------------------------------------------------------- fork */

pkv_status kv1_fork(pkv_kv_cache *c, int32_t parent, int32_t *child) {
    if (!c || !child) return pkv_err(PKV_ERR_INVALID, "pkv_kv_fork: NULL argument");
    kv_seq *p = pkv_kv_seq_resident(c, parent, "fork");
    if (!p) return PKV_ERR_INVALID;
    int ps = c->page_size;
    bool partial = p->n_tokens % ps != 0;
    size_t n_full_own = p->n_own - (partial ? 1 : 0);
    /* Allocate everything first: a node for the parent's own full pages, and the
     * own lists (just the partial page) of parent and child. */
    int32_t id = -1;
    pkv_status st = pkv_kv_seq_alloc_slot(c, &id);
    if (st) return st;
    p = &c->seqs[parent]; /* the slot array may have moved */
    kv_node *node = NULL;
    int32_t *p_own = NULL, *c_own = pkv_malloc(2 * sizeof(int32_t));
    if (n_full_own > 0) {
        node = pkv_malloc(sizeof *node);
        p_own = pkv_malloc(2 * sizeof(int32_t));
    }
    if (!c_own || (n_full_own > 0 && (!node || !p_own))) {
        pkv_free(c_own);
        pkv_free(node);
        pkv_free(p_own);
        return pkv_err(PKV_ERR_NOMEM, "fork of sequence %d: out of memory", parent);
    }
    pkv_kv_seq_publish(c, p);
    if (n_full_own > 0) {
        node->refs = 1; /* the parent; the child adds its own below */
        node->parent = p->prefix; /* the parent's reference moves into the node */
        node->n_before = p->n_prefix;
        node->n = (int64_t)n_full_own;
        node->pages = p->own; /* the node takes the array and its page references */
        if (partial) p_own[0] = p->own[p->n_own - 1];
        p->prefix = node;
        p->n_prefix += (int64_t)n_full_own;
        p->own = p_own;
        p->cap_own = 2;
        p->n_own = partial ? 1 : 0;
    }
    kv_seq *s = &c->seqs[id];
    memset(s, 0, sizeof *s);
    s->st.slot = -1; /* the state (kv-state.c) is forked by the caller */
    s->live = true;
    s->fp = p->fp;
    s->n_tokens = p->n_tokens;
    s->prefix = p->prefix;
    if (s->prefix) s->prefix->refs++;
    s->n_prefix = p->n_prefix;
    s->own = c_own;
    s->cap_own = 2;
    s->n_own = p->n_own;
    if (partial) {
        s->own[0] = p->own[p->n_own - 1];
        pkv_kv_page_ref(c, s->own[0]);
    }
    s->pub_n = p->pub_n;
    s->pub_stop = p->pub_stop;
    s->exact_until = p->exact_until;
    s->n_hole = p->n_hole;
    c->n_live++;
    *child = id;
    return PKV_OK;
}

/* ---------------------------------------------------------------- truncate */

pkv_status kv1_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    kv_seq *s = pkv_kv_seq_resident(c, seq, "truncate");
    if (!s) return PKV_ERR_INVALID;
    if (n_keep < 0 || n_keep > s->n_tokens)
        return pkv_err(PKV_ERR_INVALID, "truncate: cannot keep %lld tokens of sequence %d, which has %lld",
                       (long long)n_keep, seq, (long long)s->n_tokens);
    if (n_keep == s->n_tokens) return PKV_OK;
    int ps = c->page_size;
    kv_keep_plan plan;
    pkv_status st = pkv_kv_keep_prepare(c, s, (n_keep + ps - 1) / ps, 0, n_keep, &plan);
    if (st) return pkv_err_prefix(st, "truncate of sequence %d", seq);
    /* The kept tokens were written (the write contract), so their full pages may
     * be published; the dropped ones may never have been (a failed step). */
    pkv_kv_seq_publish_upto(c, s, n_keep);
    pkv_kv_keep_apply(c, s, &plan, NULL, 0, n_keep);
    return PKV_OK;
}
