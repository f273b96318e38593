/* The full-attention page pool as a memory kind: the cache the user holds, whose
 * per-pool operations (kv1_*, in kv-seq.c, kv-ops.c, kv-swap.c, kv-prefix.c) own
 * the sequences. It is the first kind: it picks sequence ids, checks ids and
 * arguments, and its kv_seq carries what the other kinds keep per sequence. */
#include "kv/kv-impl.h"

static bool full_present(const pkv_kv_cache *c) {
    (void)c;
    return true; /* even for NULL: its hooks report it */
}

static size_t full_token_bytes(const pkv_kv_cache *c) { return c->page_bytes_all / (size_t)c->page_size; }

static pkv_kv_cache *full_pool(pkv_kv_cache *c) { return c; }

static void full_drop(pkv_kv_cache *c, int32_t id) { kv1_seq_free(c, id); }

static pkv_status full_seq_free(pkv_kv_cache *c, int32_t seq) {
    pkv_status st = kv1_seq_free(c, seq);
    if (!st && c->disk_pending) pkv_kv_disk_queue(c); /* its pages became cached: to the writer thread */
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

static void full_stats(const pkv_kv_cache *c, pkv_kv_stats *out) {
    kv1_stats(c, out);
    if (!c || !out) return;
    pkv_kv_disk_stats(c, out);
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
    .stats = full_stats,
};
