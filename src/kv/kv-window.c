/* Sliding-window layers: a second page pool.
 *
 * A layer with a window attends to the last `window` tokens only. When a cache
 * has such layers, their K/V live in a sub-cache (c->sub) with the same layout,
 * page size and sequence ids as the cache the user holds (which keeps the
 * full-attention layers). Page i of a sequence covers the same tokens in both
 * pools; in the window pool, pages wholly before len + 1 - keep (keep = window +
 * page_size) are given back as the sequence grows, and their block-table entries
 * become -1 (s->n_hole of them, always leading). The page kept beyond the window
 * makes short rollbacks (speculative decoding) free.
 *
 * This file is the window pool's memory kind (kv_kind_window): its hooks run
 * the per-pool operations (kv1_*) on the sub-cache after the full pool's
 * (kv-memory.c runs the kinds in turn). When an operation goes back into
 * released pages (a truncate or a shift whose result needs window tokens that
 * are gone), the window pool's sequence is
 * emptied instead and pkv_kv_seq_window_len reports how far it is behind: the
 * model recomputes the window layers from the tokens (pkv_kv_window_replay), so
 * the result equals a replay. Prefix reuse in the window pool is trusted through
 * the main pool's verified pages (kv_page.link).
 *
 * The window pool's own public functions (window length, replay, reset, its
 * block table) are here too. */
#include "kv/kv-impl.h"

#include <stdio.h>
#include <string.h>

static kv_seq *sub_seq(pkv_kv_cache *c, int32_t seq) { return &c->sub->seqs[seq]; }

/* Both pools hand out sequence ids the same way; they must agree. */
static pkv_status same_id(int32_t a, int32_t b, const char *what) {
    if (a != b) return pkv_err(PKV_ERR_INTERNAL, "%s: the window pool gave sequence %d for %d", what, b, a);
    return PKV_OK;
}

/* Publish both pools' full pages within the first `written` tokens (main first:
 * the window pool's pages link to the main pool's). Later pages may hold K/V that
 * was never computed (a step that failed after appending) and are never offered. */
static void publish_both(pkv_kv_cache *c, int32_t seq, int64_t written) {
    pkv_kv_seq_publish_upto(c, &c->seqs[seq], written);
    pkv_kv_seq_publish_upto(c->sub, sub_seq(c, seq), written);
}

/* The window sequence no longer holds what its layers need: empty it (its
 * layers are recomputed from token 0 by the next forward pass). Its full pages
 * within the first `written` tokens are published first; later ones may hold K/V
 * that was never computed (a failed step or replay) and must never be offered.
 * Cannot fail. */
static void window_reset(pkv_kv_cache *c, int32_t seq, int64_t written) {
    kv_seq *w = sub_seq(c, seq);
    if (w->n_tokens == 0 && !w->swapped) return;
    pkv_kv_seq_publish_upto(c->sub, w, written);
    pkv_kv_seq_release(c->sub, w);
    c->stats.window_replays++;
}

/* Does the window sequence hold every token its next query needs? */
static bool window_covers(const pkv_kv_cache *c, const kv_seq *w) {
    int64_t need = w->n_tokens + 1 - c->sub->window;
    return (need > 0 ? need / c->page_size : 0) >= w->n_hole;
}

pkv_status pkv_kv_window_drop(pkv_kv_cache *sub, kv_seq *s, int64_t upto) {
    upto = PKV_MIN(upto, pkv_kv_seq_pages(sub, s));
    if (upto <= s->n_hole) return PKV_OK;
    pkv_kv_seq_publish(sub, s); /* published pages stay cached for prefix reuse */
    if (s->prefix) { /* shared nodes are immutable: take the pages into the own list */
        int64_t n = pkv_kv_seq_pages(sub, s);
        int32_t *arr = pkv_malloc((size_t)(n + 1) * sizeof *arr);
        if (!arr) return pkv_err(PKV_ERR_NOMEM, "window: out of memory for %lld page ids", (long long)n);
        pkv_kv_seq_flatten(s, n, arr);
        for (int64_t i = 0; i < s->n_prefix; i++) pkv_kv_page_ref(sub, arr[i]);
        pkv_kv_node_unref(sub, s->prefix);
        pkv_free(s->own);
        s->prefix = NULL;
        s->n_prefix = 0;
        s->own = arr;
        s->cap_own = (size_t)(n + 1);
        s->n_own = (size_t)n;
    }
    for (int64_t i = s->n_hole; i < upto; i++) {
        pkv_kv_page_unref(sub, s->own[i]);
        s->own[i] = -1;
    }
    sub->main->stats.window_released += (uint64_t)(upto - s->n_hole);
    s->n_hole = upto;
    return PKV_OK;
}


/* ------------------------------------------------------ its public API */

int64_t pkv_kv_seq_window_len(const pkv_kv_cache *c, int32_t seq) {
    int64_t n = pkv_kv_seq_len(c, seq);
    if (n < 0 || !c->sub) return n;
    return c->sub->seqs[seq].n_tokens;
}

pkv_status pkv_kv_window_replay(pkv_kv_cache *c, int32_t seq, int32_t n, int32_t *rows_window) {
    if (!c || !c->sub) return pkv_err(PKV_ERR_INVALID, "window replay: the cache has no sliding-window layers");
    kv_seq *s = pkv_kv_seq_resident(c, seq, "window replay");
    if (!s) return PKV_ERR_INVALID;
    kv_seq *w = sub_seq(c, seq);
    if (n < 0 || w->n_tokens + n > s->n_tokens || (n > 0 && !rows_window))
        return pkv_err(PKV_ERR_INVALID, "window replay: %d tokens from %lld of sequence %d (%lld tokens)", n,
                       (long long)w->n_tokens, seq, (long long)s->n_tokens);
    if (n == 0) return PKV_OK;
    int32_t *tp = pkv_malloc((size_t)n * 2 * sizeof *tp);
    if (!tp) return pkv_err(PKV_ERR_NOMEM, "window replay: out of memory");
    pkv_status st = pkv_kv_seq_tokens(c, seq, w->n_tokens, n, tp, tp + n);
    pkv_kv_seq_publish(c, s);
    if (!st) st = pkv_kv_window_drop(c->sub, w, kv_window_first_page(c->sub, w->n_tokens));
    if (!st) st = kv1_append_batch(c->sub, 1, &seq, &n, tp, tp + n, rows_window);
    pkv_free(tp);
    return st;
}

pkv_status pkv_kv_window_reset(pkv_kv_cache *c, int32_t seq) {
    if (!pkv_kv_seq_get(c, seq, "window reset")) return PKV_ERR_NOT_FOUND;
    /* the failed replay's tokens were never written (pages full before it were
     * published when it appended) */
    if (c->sub) window_reset(c, seq, 0);
    return PKV_OK;
}

pkv_status pkv_kv_block_table_window(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, pkv_kv_block_table *out) {
    if (!c || !c->sub) return pkv_err(PKV_ERR_INVALID, "window block table: the cache has no sliding-window layers");
    for (int i = 0; i < n_seqs && seqs; i++)
        if (!pkv_kv_seq_resident(c, seqs[i], "window block table")) return PKV_ERR_INVALID;
    return kv1_block_table_get(c->sub, n_seqs, seqs, false, out);
}

/* ------------------------------------------------------------- the kind */

static bool window_present(const pkv_kv_cache *c) { return c && c->sub; }

/* A sequence holds the window, the page kept for rollback, and the page being
 * filled, whatever its length. */
static size_t window_seq_bytes(const pkv_kv_cache *c) {
    int64_t ps = c->page_size;
    return c->sub->page_bytes_all * (size_t)((c->sub->keep + ps - 1) / ps + 1);
}

static pkv_kv_cache *window_pool(pkv_kv_cache *c) { return c->sub; }

/* Before the full pool changes a sequence: both pools' full pages published
 * (main first: the window pool's pages link to the main pool's). */
static pkv_status window_prepare(pkv_kv_cache *c, int32_t seq, int64_t written, const char *what) {
    if (!pkv_kv_seq_resident(c, seq, what)) return PKV_ERR_INVALID;
    publish_both(c, seq, written);
    return PKV_OK;
}

static pkv_status window_create(pkv_kv_cache *c, uint64_t fingerprint, int32_t *id) {
    int32_t w;
    pkv_status st = kv1_seq_create(c->sub, fingerprint, &w);
    if (!st && (st = same_id(*id, w, "create sequence"))) kv1_seq_free(c->sub, w);
    return st;
}

static pkv_status window_fork(pkv_kv_cache *c, int32_t parent, int32_t *child) {
    int32_t w;
    pkv_status st = kv1_fork(c->sub, parent, &w);
    if (!st && (st = same_id(*child, w, "fork"))) kv1_seq_free(c->sub, w);
    return st;
}

static void window_drop_seq(pkv_kv_cache *c, int32_t id) { kv1_seq_free(c->sub, id); }

static pkv_status window_seq_free(pkv_kv_cache *c, int32_t seq) {
    if (pkv_kv_seq_get(c, seq, "free sequence")) {
        if (!c->seqs[seq].swapped && !sub_seq(c, seq)->swapped) publish_both(c, seq, INT64_MAX);
        kv1_seq_free(c->sub, seq);
    }
    return PKV_OK; /* the full pool reports a bad id */
}

/* The window layers must hold every token of the sequences first. */
static pkv_status window_append_check(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens) {
    if (n_seqs < 0 || (n_seqs > 0 && (!seqs || !n_tokens)))
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_append_batch: NULL argument or negative count");
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = pkv_kv_seq_resident(c, seqs[i], "append");
        if (!s) return PKV_ERR_INVALID;
        const kv_seq *w = sub_seq(c, seqs[i]);
        if (w->n_tokens != s->n_tokens)
            return pkv_err(PKV_ERR_INVALID,
                           "append: the sliding-window layers of sequence %d hold %lld of its %lld tokens: recompute "
                           "them first (pkv_kv_window_replay; pkv_model_forward does it)",
                           seqs[i], (long long)w->n_tokens, (long long)s->n_tokens);
    }
    return PKV_OK;
}

static int64_t append_total(int n_seqs, const int32_t *n_tokens) {
    int64_t total = 0;
    for (int i = 0; i < n_seqs; i++)
        if (n_tokens[i] > 0) total += n_tokens[i];
    return total;
}

/* Give back what no query of this step or later can see. */
static pkv_status window_append_prepare(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens) {
    if (append_total(n_seqs, n_tokens) == 0) return PKV_OK;
    pkv_status st;
    for (int i = 0; i < n_seqs; i++) {
        /* the main pool first publishes what the last step wrote, so the window
         * pages published by the drop can link to it */
        pkv_kv_seq_publish(c, &c->seqs[seqs[i]]);
        kv_seq *w = sub_seq(c, seqs[i]);
        if ((st = pkv_kv_window_drop(c->sub, w, kv_window_first_page(c->sub, w->n_tokens)))) return st;
    }
    return PKV_OK;
}

/* The window pool takes the positions the main pool assigned. */
static pkv_status window_append(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                                const int32_t *tokens, const int32_t *pos, int32_t *rows, int32_t *rows_window,
                                const int64_t *len) {
    (void)pos;
    (void)rows;
    int64_t total = append_total(n_seqs, n_tokens);
    if (total == 0) return PKV_OK;
    int32_t *wp = pkv_malloc((size_t)total * sizeof *wp), *wr = rows_window ? rows_window : pkv_malloc((size_t)total * 4);
    pkv_status st = PKV_OK;
    if (!wp || !wr) {
        st = pkv_err(PKV_ERR_NOMEM, "append: out of memory");
        goto out;
    }
    int64_t k = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (n_tokens[i] > 0) pkv_kv_seq_tokens(c, seqs[i], len[i], n_tokens[i], NULL, wp + k);
        k += PKV_MAX(n_tokens[i], 0);
    }
    if ((st = kv1_append_batch(c->sub, n_seqs, seqs, n_tokens, tokens, wp, wr))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        st = pkv_err(st, "%s (the pool of the sliding-window layers: %lld pages)", msg, (long long)c->sub->n_pages);
    }
out:
    pkv_free(wp);
    if (wr != rows_window) pkv_free(wr);
    return st;
}

/* The window pool's side of a truncate (the main pool's succeeded). Cannot fail. */
static void window_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    kv_seq *w = sub_seq(c, seq);
    if (n_keep >= w->n_tokens) return; /* behind already: the replay covers it */
    /* Back into released pages: the next query needs tokens from n_keep + 1 - window. */
    int64_t need = n_keep + 1 - c->sub->window;
    if ((need > 0 ? need / c->page_size : 0) < w->n_hole || kv1_truncate(c->sub, seq, n_keep) || !window_covers(c, w))
        window_reset(c, seq, n_keep);
}

static pkv_status window_truncate_kind(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    window_truncate(c, seq, n_keep);
    return PKV_OK;
}

/* The main pool's shift succeeded (its sequence lost n_remove tokens). Cannot fail. */
static pkv_status window_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    int64_t len = c->seqs[seq].n_tokens + n_remove; /* the main sequence's length before */
    kv_seq *w = sub_seq(c, seq);
    if (w->n_tokens <= start) return PKV_OK; /* the shift moves nothing the window pool holds */
    if (start + n_remove == len) { /* nothing moves: a truncate */
        window_truncate(c, seq, start);
        return PKV_OK;
    }
    /* The window pool shifts the same way (kv1_shift rebuilds only what the new
     * window needs when the shift starts in released pages); when a token the new
     * window needs is gone, or pages run out, its layers are recomputed instead. */
    /* Shrinking brings older tokens into the window: those must not be released
     * (checked after the shift, whichever path it took). */
    if (w->n_tokens != len || kv1_shift(c->sub, seq, start, n_remove, pos_delta) || !window_covers(c, w))
        window_reset(c, seq, INT64_MAX);
    return PKV_OK;
}

static pkv_status window_seq_clear(pkv_kv_cache *c, int32_t seq) { return kv1_seq_clear(c->sub, seq); }

static pkv_status window_clear(pkv_kv_cache *c) { return kv1_clear(c->sub); }

/* Out before the main pool (reverse order). */
static pkv_status window_swap_out(pkv_kv_cache *c, int32_t seq) {
    pkv_status st = kv1_swap_out(c->sub, seq);
    return st ? pkv_err_prefix(st, "the pool of the sliding-window layers") : PKV_OK;
}

/* The main pool's swap out failed: back in (its pages were just freed, so this
 * cannot really fail; if it does, the window layers are recomputed). */
static void window_swap_out_undo(pkv_kv_cache *c, int32_t seq) {
    if (kv1_swap_in(c->sub, seq)) window_reset(c, seq, INT64_MAX);
}

/* Without room in the window pool the window layers are recomputed instead. */
static pkv_status window_swap_in(pkv_kv_cache *c, int32_t seq) {
    if (sub_seq(c, seq)->swapped && kv1_swap_in(c->sub, seq)) window_reset(c, seq, INT64_MAX);
    return PKV_OK;
}

/* The window page published beside main page mp (same sequence, same index). */
int32_t pkv_kv_window_linked(const pkv_kv_cache *c, int32_t mp) {
    const kv_page *m = &c->pages[mp];
    const pkv_kv_cache *w = c->sub;
    for (int32_t q = w->buckets[m->key & (w->n_buckets - 1)]; q >= 0; q = w->pages[q].hnext)
        if (w->pages[q].link == mp && w->pages[q].link_gen == m->gen && w->pages[q].key == m->key) return q;
    return -1;
}

/* A prefix hit needs the window before its end resident: the window pages of the
 * matched main pages still cached beside them. found[j]: window page beside main
 * page j; first: the first page the hit's window needs. */
typedef struct window_match {
    int64_t first;
    int32_t found[];
} window_match;

static pkv_status window_prefix_begin(pkv_kv_cache *c, int32_t seq, int64_t n_pages, kv_pending *p) {
    (void)c;
    (void)seq;
    window_match *wm = pkv_malloc(sizeof *wm + (size_t)n_pages * sizeof(int32_t));
    if (!wm) return pkv_err(PKV_ERR_NOMEM, "prefix match: out of memory");
    wm->first = 0;
    p->ptr = wm;
    return PKV_OK;
}

static bool window_prefix_ok(pkv_kv_cache *c, int32_t seq, int64_t m, kv_pending p) {
    window_match *wm = p.ptr;
    int ps = c->page_size;
    const kv_seq *s = &c->seqs[seq];
    int64_t need = m * ps + 1 - c->sub->window;
    wm->first = need > 0 ? need / ps : 0;
    for (int64_t j = m - 1; j >= wm->first; j--)
        if ((wm->found[j] = pkv_kv_window_linked(c, pkv_kv_seq_page(s, j))) < 0) return false;
    return true;
}

static pkv_status window_prefix_take(pkv_kv_cache *c, int32_t seq, int64_t m, kv_pending p) {
    if (m == 0) return PKV_OK;
    const window_match *wm = p.ptr;
    kv_seq *w = sub_seq(c, seq);
    void *arr = w->own;
    size_t cap = w->cap_own;
    pkv_status st = pkv_grow(&arr, &cap, (size_t)m, sizeof(int32_t));
    if (st) return st;
    w->own = arr;
    w->cap_own = cap;
    for (int64_t j = 0; j < m; j++) {
        w->own[j] = j < wm->first ? -1 : wm->found[j];
        pkv_kv_page_ref(c->sub, w->own[j]);
    }
    w->n_own = (size_t)m;
    w->n_hole = wm->first;
    w->n_tokens = m * c->page_size;
    w->pub_n = m;
    w->pub_stop = false;
    c->sub->stats.prefix_hit_pages += (uint64_t)(m - wm->first);
    return PKV_OK;
}

static void window_prefix_undo(pkv_kv_cache *c, int32_t seq) { pkv_kv_seq_release(c->sub, sub_seq(c, seq)); }

static void window_prefix_end(kv_pending p) { pkv_free(p.ptr); }

/* ---------------------------------------------------------- save / load */

/* The window layers' part of a file (version 2): after exact_until u64 w_first,
 * u64 w_len, the tokens their sections hold ([w_first, w_len): w_first on a
 * page boundary, the pages before it released; w_len < n_tokens when the window
 * layers are behind); their geometry rows are attention rows. part: a = w_first,
 * b = w_len; ptr (save) the window sequence's page ids. */
static bool window_holds_layer(const pkv_kv_cache *c, int il) { return pkv_kv_pool_holds(c->sub, il); }

/* The span a save writes: what the window sequence holds. */
static void save_span(const pkv_kv_cache *c, int32_t seq, int64_t *first, int64_t *len) {
    const kv_seq *w = &c->sub->seqs[seq];
    *len = w->n_tokens;
    *first = PKV_MIN(w->n_hole * c->page_size, *len);
}

pkv_status pkv_kv_window_span_check(const kv_file *f, uint64_t wf, uint64_t wl, bool window) {
    uint64_t n = (uint64_t)f->n_tokens;
    int ps = f->cache->page_size;
    if (wl > n || wf > wl || wf % (uint64_t)ps)
        return pkv_err(PKV_ERR_FORMAT, "%s is corrupt: window tokens [%llu, %llu) of %llu (pages of %d)", f->path,
                       (unsigned long long)wf, (unsigned long long)wl, (unsigned long long)n, ps);
    if (!window && (wf != 0 || wl != n))
        return pkv_err(PKV_ERR_FORMAT, "%s is corrupt: window tokens [%llu, %llu) of %llu in a file without window "
                       "layers", f->path, (unsigned long long)wf, (unsigned long long)wl, (unsigned long long)n);
    return PKV_OK;
}

static int window_file_bytes(const pkv_kv_cache *c, const kv_file *f, const kv_file_part *part, kv_file_at at,
                             int il, size_t bytes[2]) {
    int64_t first = part->a, len = part->b;
    if (!f->load && (at == KV_FILE_LAYER || at == KV_FILE_STAGING)) save_span(c, f->seq, &first, &len);
    if (at == KV_FILE_HEADER) bytes[0] = 16;
    if (at == KV_FILE_LAYER) return pkv_kv_file_attn_bytes(c, il, len - first, bytes);
    if (at == KV_FILE_STAGING) {
        bytes[0] = pkv_kv_file_attn_staging(c->sub, f->n_tokens);
        bytes[1] = (size_t)((len + c->page_size - 1) / c->page_size + 1) * sizeof(int32_t);
    }
    return at == KV_FILE_HEADER;
}

static pkv_status window_save(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    int32_t *pages = part->ptr;
    if (at == KV_FILE_ROW) pkv_kv_file_attn_row(f, il);
    if (at == KV_FILE_HEADER) {
        kv_seq *w = sub_seq(c, f->seq);
        pkv_kv_seq_flatten(w, pkv_kv_seq_pages(c->sub, w), pages);
        save_span(c, f->seq, &part->a, &part->b);
        pkv_kv_file_put64(f, (uint64_t)part->a);
        pkv_kv_file_put64(f, (uint64_t)part->b);
    }
    if (at == KV_FILE_LAYER)
        return pkv_kv_file_attn_save(f, c->sub, il, pages + part->a / c->page_size, part->a, part->b);
    return PKV_OK;
}

static pkv_status window_load_check(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    if (at == KV_FILE_ROW) return pkv_kv_file_attn_row_check(f, il);
    if (at == KV_FILE_HEADER) {
        uint64_t wf = pkv_kv_file_get64(f), wl = pkv_kv_file_get64(f);
        pkv_status st = pkv_kv_window_span_check(f, wf, wl, true);
        part->a = (int64_t)wf;
        part->b = (int64_t)wl;
        return st;
    }
    if (at != KV_FILE_FIT) return PKV_OK;
    int64_t ps = c->page_size, need = (part->b + ps - 1) / ps - part->a / ps;
    if (need > pkv_kv_pool_available(c->sub))
        return pkv_err(PKV_ERR_OUT_OF_PAGES, "load of %s needs %lld pages of the sliding-window pool, %lld are free or "
                       "evictable", f->path, (long long)need, (long long)pkv_kv_pool_available(c->sub));
    return PKV_OK;
}

/* The window sequence (the same id): -1 for the released pages, then pages
 * holding the span's K/V, tokens and positions. */
static pkv_status window_load(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    int ps = c->page_size;
    int64_t w_first = part->a, w_len = part->b, w_hole = w_first / ps, w_pages = (w_len + ps - 1) / ps;
    int32_t *wpages = pkv_malloc((size_t)(w_pages ? w_pages : 1) * sizeof *wpages), wid = -1;
    if (!wpages) return pkv_err(PKV_ERR_NOMEM, "out of memory for %lld page ids", (long long)w_pages);
    pkv_status st = pkv_kv_seq_alloc_slot(c->sub, &wid);
    if (!st) st = same_id(f->seq, wid, "load");
    if (st) {
        pkv_free(wpages);
        return st;
    }
    for (int64_t i = 0; i < w_hole; i++) wpages[i] = -1;
    pkv_kv_pool_take(c->sub, w_pages - w_hole, wpages + w_hole); /* available: checked at KV_FILE_FIT */
    for (int il = 0; il < c->layout.n_layers && !st; il++)
        if (pkv_kv_pool_holds(c->sub, il)) st = pkv_kv_file_attn_load(f, c->sub, il, wpages + w_hole, w_first, w_len);
    if (st) {
        for (int64_t i = w_hole; i < w_pages; i++) pkv_kv_page_unref(c->sub, wpages[i]);
        pkv_free(wpages);
        return st;
    }
    const uint8_t *tp = f->data + f->tok_off;
    int64_t n = f->n_tokens;
    for (int64_t t = w_first; t < w_len; t++) {
        size_t wa = (size_t)wpages[t / ps] * ps + (size_t)(t % ps);
        memcpy(&c->sub->tok[wa], tp + (size_t)t * 4, 4);
        memcpy(&c->sub->pos[wa], tp + (size_t)(n + t) * 4, 4);
    }
    pkv_kv_seq_adopt(c->sub, f->seq, f->fp, f->exact_until, w_len, w_hole, wpages, w_pages);
    return PKV_OK;
}

static void window_load_undo(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    (void)part;
    pkv_kv_seq_unadopt(c->sub, f->seq);
}

static void window_stats(const pkv_kv_cache *c, pkv_kv_stats *out) {
    if (!out) return;
    pkv_kv_stats w;
    kv1_stats(c->sub, &w);
    out->window_pages = w.n_pages;
    out->window_free = w.pages_free;
    out->window_cached = w.pages_cached;
    out->window_used = w.pages_used;
    out->window_page_bytes = c->sub->page_bytes_all;
    out->cow_pages += w.cow_pages;
    out->cow_bytes += w.cow_bytes;
    out->evicted_pages += w.evicted_pages;
}

const pkv_mem_kind kv_kind_window = {
    .name = "sliding window",
    .present = window_present,
    .seq_bytes = window_seq_bytes,
    .pool = window_pool,
    .prepare = window_prepare,
    .create = window_create,
    .fork = window_fork,
    .drop = window_drop_seq,
    .seq_free = window_seq_free,
    .append_check = window_append_check,
    .append_prepare = window_append_prepare,
    .append = window_append,
    .truncate = window_truncate_kind,
    .shift = window_shift,
    .seq_clear = window_seq_clear,
    .clear = window_clear,
    .swap_out = window_swap_out,
    .swap_out_undo = window_swap_out_undo,
    .swap_in = window_swap_in,
    .prefix_begin = window_prefix_begin,
    .prefix_ok = window_prefix_ok,
    .prefix_take = window_prefix_take,
    .prefix_undo = window_prefix_undo,
    .prefix_end = window_prefix_end,
    .file_version = 2,
    .file_what = "sliding-window layers",
    .holds_layer = window_holds_layer,
    .file_bytes = window_file_bytes,
    .save = window_save,
    .load_check = window_load_check,
    .load = window_load,
    .load_undo = window_load_undo,
    .stats = window_stats,
};
