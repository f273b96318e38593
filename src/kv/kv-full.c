/* The full-attention page pool as a memory kind: the cache the user holds, whose
 * per-pool operations (kv1_*, in kv-seq.c, kv-ops.c, kv-swap.c, kv-prefix.c) own
 * the sequences. It is the first kind: it picks sequence ids, checks ids and
 * arguments, and its kv_seq carries what the other kinds keep per sequence. */
#include "kv/kv-impl.h"

#include <string.h>

static bool full_present(const pkv_kv_cache *c) {
    (void)c;
    return true; /* even for NULL: its hooks report it */
}

static size_t full_token_bytes(const pkv_kv_cache *c) { return c->page_bytes_all / (size_t)c->page_size; }

static pkv_kv_cache *full_pool(pkv_kv_cache *c) { return c; }

static void full_drop(pkv_kv_cache *c, int32_t id) { kv1_seq_free(c, id); }

static pkv_status full_seq_free(pkv_kv_cache *c, int32_t seq) {
    pkv_status st = kv1_seq_free(c, seq);
    if (!st && c->tier_pending) { /* its pages became cached: to the tiers' writer threads */
        bool done = pkv_kv_disk_queue(c);
        done = pkv_kv_remote_queue(c) && done;
        c->tier_pending = !done;
    }
    return st;
}

static pkv_status full_append(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                              const int32_t *tokens, const int32_t *pos, int32_t *rows, int32_t *rows_window,
                              const int64_t *len) {
    (void)rows_window;
    (void)len;
    return kv1_append_batch(c, n_seqs, seqs, n_tokens, tokens, pos, rows);
}

static void full_append_undo(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int64_t *len) {
    for (int i = 0; i < n_seqs; i++) kv1_truncate(c, seqs[i], len[i]);
}

static pkv_status full_seq_clear_check(pkv_kv_cache *c, int32_t seq) {
    return pkv_kv_seq_get(c, seq, "clear sequence") ? PKV_OK : PKV_ERR_NOT_FOUND;
}

static pkv_status full_clear_check(const pkv_kv_cache *c) {
    return c ? PKV_OK : pkv_err(PKV_ERR_INVALID, "pkv_kv_clear: cache is NULL");
}

/* The match is cut back to the m pages every kind can serve. */
static pkv_status full_prefix_take(pkv_kv_cache *c, int32_t seq, int64_t m, kv_pending p) {
    (void)p;
    if (m < c->seqs[seq].n_tokens / c->page_size) kv1_truncate(c, seq, m * c->page_size);
    return PKV_OK;
}

static void full_prefix_undo(pkv_kv_cache *c, int32_t seq) { kv1_truncate(c, seq, 0); }

/* ---------------------------------------------------------- save / load */

/* The full-attention layers: the layers whose K/V this pool holds. Its part of a
 * file: their geometry rows and payload (every token); tokens and positions are
 * the frame's (kv-file.c), this kind puts them into its pages on load. */
static bool full_holds_layer(const pkv_kv_cache *c, int il) { return pkv_kv_pool_holds(c, il); }

static int full_file_bytes(const pkv_kv_cache *c, const kv_file *f, const kv_file_part *part, kv_file_at at, int il,
                           size_t bytes[2]) {
    (void)part;
    if (at == KV_FILE_LAYER) return pkv_kv_file_attn_bytes(c, il, f->n_tokens, bytes);
    if (at == KV_FILE_STAGING) { /* the moves' staging; the page ids of a save */
        bytes[0] = pkv_kv_file_attn_staging(c, f->n_tokens);
        bytes[1] = (size_t)((f->n_tokens + c->page_size - 1) / c->page_size + 1) * sizeof(int32_t);
    }
    return 0;
}

static pkv_status full_save(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    kv_seq *s = &c->seqs[f->seq];
    if (at == KV_FILE_ROW) pkv_kv_file_attn_row(f, il);
    if (at == KV_FILE_HEADER) { /* the sequence's pages, published first */
        pkv_kv_seq_publish(c, s);
        pkv_kv_seq_flatten(s, pkv_kv_seq_pages(c, s), part->ptr);
    }
    if (at == KV_FILE_LAYER) return pkv_kv_file_attn_save(f, c, il, part->ptr, 0, f->n_tokens);
    return PKV_OK;
}

static pkv_status full_load_check(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    (void)part;
    if (at == KV_FILE_ROW) return pkv_kv_file_attn_row_check(f, il);
    if (at != KV_FILE_FIT) return PKV_OK;
    int64_t n_pages = (f->n_tokens + c->page_size - 1) / c->page_size, avail = pkv_kv_pool_available(c);
    if (n_pages > avail)
        return pkv_err(PKV_ERR_OUT_OF_PAGES, "load of %s needs %lld pages, %lld are free or evictable", f->path,
                       (long long)n_pages, (long long)avail);
    return PKV_OK;
}

/* The new sequence: its id, its pages with the file's K/V, tokens and positions. */
static pkv_status full_load(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    (void)part;
    int ps = c->page_size;
    int64_t n = f->n_tokens, n_pages = (n + ps - 1) / ps;
    int32_t *pages = pkv_malloc((size_t)(n_pages ? n_pages : 1) * sizeof *pages), id = -1;
    if (!pages) return pkv_err(PKV_ERR_NOMEM, "out of memory for %lld page ids", (long long)n_pages);
    pkv_status st = pkv_kv_seq_alloc_slot(c, &id);
    if (st) {
        pkv_free(pages);
        return st;
    }
    pkv_kv_pool_take(c, n_pages, pages); /* available: checked at KV_FILE_FIT */
    for (int il = 0; il < c->layout.n_layers && !st; il++)
        if (pkv_kv_pool_holds(c, il)) st = pkv_kv_file_attn_load(f, c, il, pages, 0, n);
    if (st) {
        for (int64_t i = 0; i < n_pages; i++) pkv_kv_page_unref(c, pages[i]);
        pkv_free(pages);
        return st;
    }
    const uint8_t *tp = f->data + f->tok_off;
    for (int64_t t = 0; t < n; t++) {
        size_t at = (size_t)pages[t / ps] * ps + (size_t)(t % ps);
        memcpy(&c->tok[at], tp + (size_t)t * 4, 4);
        memcpy(&c->pos[at], tp + (size_t)(n + t) * 4, 4);
    }
    pkv_kv_seq_adopt(c, id, f->fp, f->exact_until, n, 0, pages, n_pages);
    f->seq = id;
    return PKV_OK;
}

static void full_load_undo(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    (void)part;
    pkv_kv_seq_unadopt(c, f->seq);
}

static void full_stats(const pkv_kv_cache *c, pkv_kv_stats *out) {
    kv1_stats(c, out);
    if (!c || !out) return;
    pkv_kv_disk_stats(c, out);
    pkv_kv_remote_stats(c, out);
    out->page_bytes = c->page_bytes_all;
}

const pkv_mem_kind kv_kind_full = {
    .name = "full attention",
    .present = full_present,
    .token_bytes = full_token_bytes,
    .pool = full_pool,
    .create = kv1_seq_create,
    .fork = kv1_fork,
    .drop = full_drop,
    .seq_free = full_seq_free,
    .append = full_append,
    .append_undo = full_append_undo,
    .truncate = kv1_truncate,
    .shift = kv1_shift,
    .seq_clear_check = full_seq_clear_check,
    .seq_clear = kv1_seq_clear,
    .clear_check = full_clear_check,
    .clear = kv1_clear,
    .swap_out = kv1_swap_out,
    .swap_in = kv1_swap_in,
    .prefix_match = kv1_prefix_match,
    .prefix_take = full_prefix_take,
    .prefix_undo = full_prefix_undo,
    .holds_layer = full_holds_layer,
    .file_bytes = full_file_bytes,
    .save = full_save,
    .load_check = full_load_check,
    .load = full_load,
    .load_undo = full_load_undo,
    .stats = full_stats,
};
