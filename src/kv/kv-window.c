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
 * Every public KV operation below runs the per-pool operation (kv1_*) on both
 * pools. When an operation goes back into released pages (a truncate or a shift
 * whose result needs window tokens that are gone), the window pool's sequence is
 * emptied instead and pkv_kv_seq_window_len reports how far it is behind: the
 * model recomputes the window layers from the tokens (pkv_kv_window_replay), so
 * the result equals a replay. Prefix reuse in the window pool is trusted through
 * the main pool's verified pages (kv_page.link).
 *
 * The recurrent state of layers with state_per_head > 0 (kv-state.c) lives in the
 * main cache only; the wrappers here run its part of each operation after (or,
 * where it must be able to fail first, before) the pools' parts. */
#include "kv/kv-impl.h"

#include <stdio.h>
#include <string.h>

static kv_seq *sub_seq(pkv_kv_cache *c, int32_t seq) { return &c->sub->seqs[seq]; }

/* Both pools hand out sequence ids the same way; they must agree. */
static pkv_status same_id(int32_t a, int32_t b, const char *what) {
    if (a != b) return pkv_err(PKV_ERR_INTERNAL, "%s: the window pool gave sequence %d for %d", what, b, a);
    return PKV_OK;
}

/* Publish both pools' full pages (main first: the window pool's pages link to
 * the main pool's). */
static void publish_both(pkv_kv_cache *c, int32_t seq) {
    pkv_kv_seq_publish(c, &c->seqs[seq]);
    pkv_kv_seq_publish(c->sub, sub_seq(c, seq));
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


/* ------------------------------------------------------------ sequences */

/* A new live state slot can be had (checked before anything changes). */
static pkv_status state_slot_check(const pkv_kv_cache *c, const char *what, int32_t seq) {
    if (!kv_has_state(c) || pkv_kv_state_available(c) > 0) return PKV_OK;
    char who[48] = "";
    if (seq >= 0) snprintf(who, sizeof who, " of sequence %d", seq);
    return pkv_err(PKV_ERR_NOMEM, "%s%s: no recurrent-state slot can be had: all %lld state slots hold the live "
                   "states of other sequences (raise pkv_kv_params.state_slots)", what, who, (long long)c->n_slots);
}

pkv_status pkv_kv_seq_create(pkv_kv_cache *c, uint64_t fingerprint, int32_t *seq) {
    pkv_status st = c ? state_slot_check(c, "create sequence", -1) : PKV_OK;
    if (st) return st;
    int32_t id = -1;
    if ((st = kv1_seq_create(c, fingerprint, seq ? &id : NULL))) return st;
    if (c->sub) {
        int32_t w;
        if ((st = kv1_seq_create(c->sub, fingerprint, &w)) || (st = same_id(id, w, "create sequence"))) {
            if (!st) kv1_seq_free(c->sub, w);
            kv1_seq_free(c, id);
            return st;
        }
    }
    if ((st = pkv_kv_state_seq_new(c, id))) {
        if (c->sub) kv1_seq_free(c->sub, id);
        kv1_seq_free(c, id);
        return pkv_err_prefix(st, "create sequence");
    }
    *seq = id;
    return PKV_OK;
}

pkv_status pkv_kv_seq_free(pkv_kv_cache *c, int32_t seq) {
    if (c && c->sub && pkv_kv_seq_get(c, seq, "free sequence")) {
        if (!c->seqs[seq].swapped && !sub_seq(c, seq)->swapped) publish_both(c, seq);
        kv1_seq_free(c->sub, seq);
    }
    pkv_status st = kv1_seq_free(c, seq);
    if (!st && c->disk_pending) pkv_kv_disk_queue(c); /* its pages became cached: to the writer thread */
    return st;
}

int64_t pkv_kv_seq_window_len(const pkv_kv_cache *c, int32_t seq) {
    int64_t n = pkv_kv_seq_len(c, seq);
    if (n < 0 || !c->sub) return n;
    return c->sub->seqs[seq].n_tokens;
}

/* --------------------------------------------------------------- append */

static pkv_status append_pools(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                               const int32_t *tokens, const int32_t *pos, int32_t *rows, int32_t *rows_window) {
    if (!c || !c->sub) return kv1_append_batch(c, n_seqs, seqs, n_tokens, tokens, pos, rows);
    if (n_seqs < 0 || (n_seqs > 0 && (!seqs || !n_tokens)))
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_append_batch: NULL argument or negative count");
    int64_t total = 0;
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = pkv_kv_seq_resident(c, seqs[i], "append");
        if (!s) return PKV_ERR_INVALID;
        const kv_seq *w = sub_seq(c, seqs[i]);
        if (w->n_tokens != s->n_tokens)
            return pkv_err(PKV_ERR_INVALID,
                           "append: the sliding-window layers of sequence %d hold %lld of its %lld tokens: recompute "
                           "them first (pkv_kv_window_replay; pkv_model_forward does it)",
                           seqs[i], (long long)w->n_tokens, (long long)s->n_tokens);
        if (n_tokens[i] > 0) total += n_tokens[i];
    }
    if (total == 0) return kv1_append_batch(c, n_seqs, seqs, n_tokens, tokens, pos, rows);
    pkv_status st;
    for (int i = 0; i < n_seqs; i++) { /* what no query of this step or later can see */
        /* the main pool first publishes what the last step wrote, so the window
         * pages published by the drop can link to it */
        pkv_kv_seq_publish(c, &c->seqs[seqs[i]]);
        kv_seq *w = sub_seq(c, seqs[i]);
        if ((st = pkv_kv_window_drop(c->sub, w, kv_window_first_page(c->sub, w->n_tokens)))) return st;
    }
    int64_t stack_len[16];
    int64_t *len = n_seqs <= 16 ? stack_len : pkv_malloc((size_t)n_seqs * sizeof *len);
    int32_t *wp = pkv_malloc((size_t)total * sizeof *wp), *wr = rows_window ? rows_window : pkv_malloc((size_t)total * 4);
    if (!len || !wp || !wr) {
        st = pkv_err(PKV_ERR_NOMEM, "append: out of memory");
        goto out;
    }
    for (int i = 0; i < n_seqs; i++) len[i] = c->seqs[seqs[i]].n_tokens;
    if ((st = kv1_append_batch(c, n_seqs, seqs, n_tokens, tokens, pos, rows))) goto out;
    /* The window pool takes the positions the main pool assigned. */
    int64_t k = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (n_tokens[i] > 0) pkv_kv_seq_tokens(c, seqs[i], len[i], n_tokens[i], NULL, wp + k);
        k += PKV_MAX(n_tokens[i], 0);
    }
    if ((st = kv1_append_batch(c->sub, n_seqs, seqs, n_tokens, tokens, wp, wr))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        for (int i = 0; i < n_seqs; i++) kv1_truncate(c, seqs[i], len[i]);
        st = pkv_err(st, "%s (the pool of the sliding-window layers: %lld pages)", msg, (long long)c->sub->n_pages);
    }
out:
    if (len != stack_len) pkv_free(len);
    pkv_free(wp);
    if (wr != rows_window) pkv_free(wr);
    return st;
}

/* The recurrent state moves along with the tokens: the forward pass writes it in
 * the step that appends them, so it must hold every earlier token. */
pkv_status pkv_kv_append_batch_w(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                                 const int32_t *tokens, const int32_t *pos, int32_t *rows, int32_t *rows_window) {
    const bool state = kv_has_state(c) && n_seqs > 0 && seqs && n_tokens;
    for (int i = 0; state && i < n_seqs; i++) {
        if (seqs[i] < 0 || (size_t)seqs[i] >= c->n_seqs || !c->seqs[seqs[i]].live || c->seqs[seqs[i]].swapped)
            continue; /* the pools report it */
        const kv_seq *s = &c->seqs[seqs[i]];
        if (n_tokens[i] > 0 && s->st.len < s->n_tokens)
            return pkv_err(PKV_ERR_INVALID,
                           "append: the recurrent state of sequence %d has taken in %lld of its %lld tokens: run the "
                           "rest through the recurrent layers first (pkv_kv_state_replay; pkv_model_forward does it)",
                           seqs[i], (long long)s->st.len, (long long)s->n_tokens);
    }
    pkv_status st = append_pools(c, n_seqs, seqs, n_tokens, tokens, pos, rows, rows_window);
    for (int i = 0; state && !st && i < n_seqs; i++)
        if (n_tokens[i] > 0) c->seqs[seqs[i]].st.len += n_tokens[i];
    return st;
}

pkv_status pkv_kv_append_batch(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                               const int32_t *tokens, const int32_t *pos, int32_t *rows) {
    return pkv_kv_append_batch_w(c, n_seqs, seqs, n_tokens, tokens, pos, rows, NULL);
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

pkv_status pkv_kv_block_table_get(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, bool with_positions,
                                  pkv_kv_block_table *out) {
    return kv1_block_table_get(c, n_seqs, seqs, with_positions, out);
}

pkv_status pkv_kv_block_table_window(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, pkv_kv_block_table *out) {
    if (!c || !c->sub) return pkv_err(PKV_ERR_INVALID, "window block table: the cache has no sliding-window layers");
    for (int i = 0; i < n_seqs && seqs; i++)
        if (!pkv_kv_seq_resident(c, seqs[i], "window block table")) return PKV_ERR_INVALID;
    return kv1_block_table_get(c->sub, n_seqs, seqs, false, out);
}

/* ------------------------------------------------------------ fork etc. */

static pkv_status fork_pools(pkv_kv_cache *c, int32_t parent, int32_t *child) {
    if (!c || !c->sub) return kv1_fork(c, parent, child);
    if (!pkv_kv_seq_resident(c, parent, "fork")) return PKV_ERR_INVALID;
    publish_both(c, parent);
    pkv_status st = kv1_fork(c, parent, child);
    if (st) return st;
    int32_t w;
    if ((st = kv1_fork(c->sub, parent, &w)) || (st = same_id(*child, w, "fork"))) {
        if (!st) kv1_seq_free(c->sub, w);
        kv1_seq_free(c, *child);
    }
    return st;
}

/* The child's live state is a copy of the parent's; the checkpoints are shared. */
pkv_status pkv_kv_fork(pkv_kv_cache *c, int32_t parent, int32_t *child) {
    if (kv_has_state(c)) {
        if (!pkv_kv_seq_resident(c, parent, "fork")) return PKV_ERR_INVALID;
        pkv_status st = state_slot_check(c, "fork", parent);
        if (st) return st;
    }
    int32_t id = -1;
    pkv_status st = fork_pools(c, parent, child ? &id : NULL);
    if (st) return st;
    if ((st = pkv_kv_state_fork(c, parent, id)) || (st = pkv_kv_media_copy(&c->seqs[id], &c->seqs[parent]))) {
        if (c->sub) kv1_seq_free(c->sub, id);
        kv1_seq_free(c, id);
        return st;
    }
    *child = id;
    return PKV_OK;
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

/* Only the kept tokens are known to be written (the write contract): a rollback
 * after a failed step drops tokens whose K/V was never computed, so neither pool
 * publishes anything past n_keep (kv1_truncate publishes the main pool's kept
 * pages first, so the window pool's kept pages can link to them). */
static pkv_status truncate_pools(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    if (!c || !c->sub) return kv1_truncate(c, seq, n_keep);
    if (!pkv_kv_seq_resident(c, seq, "truncate")) return PKV_ERR_INVALID;
    pkv_status st = kv1_truncate(c, seq, n_keep);
    if (st) return st;
    window_truncate(c, seq, n_keep);
    return PKV_OK;
}

/* The recurrent state goes back to the last checkpoint at or before n_keep. */
pkv_status pkv_kv_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    /* into a media chunk: the whole chunk goes (its rows are one input) */
    if (pkv_kv_seq_len(c, seq) >= 0) n_keep = pkv_kv_media_cut(&c->seqs[seq], n_keep);
    pkv_status st = truncate_pools(c, seq, n_keep);
    if (!st) pkv_kv_media_truncate(&c->seqs[seq], n_keep);
    return st ? st : pkv_kv_state_rewind(c, seq, n_keep);
}

static pkv_status shift_pools(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    if (!c || !c->sub) return kv1_shift(c, seq, start, n_remove, pos_delta);
    if (!pkv_kv_seq_resident(c, seq, "shift")) return PKV_ERR_INVALID;
    int64_t len = c->seqs[seq].n_tokens;
    /* nothing moves: a truncate, which publishes only the tokens it keeps */
    if (start >= 0 && start <= len && n_remove == len - start) return truncate_pools(c, seq, start);
    publish_both(c, seq);
    pkv_status st = kv1_shift(c, seq, start, n_remove, pos_delta);
    if (st) return st;
    kv_seq *w = sub_seq(c, seq);
    if (w->n_tokens <= start) return PKV_OK; /* the shift moves nothing the window pool holds */
    /* The window pool shifts the same way (kv1_shift rebuilds only what the new
     * window needs when the shift starts in released pages); when a token the new
     * window needs is gone, or pages run out, its layers are recomputed instead. */
    /* Shrinking brings older tokens into the window: those must not be released
     * (checked after the shift, whichever path it took). */
    if (w->n_tokens != len || kv1_shift(c->sub, seq, start, n_remove, pos_delta) || !window_covers(c, w))
        window_reset(c, seq, INT64_MAX);
    return PKV_OK;
}

/* Every token from `start` on changes (the attention layers' outputs feed the
 * recurrent ones): the state goes back to the last checkpoint at or before start,
 * as for a truncate there. */
pkv_status pkv_kv_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    pkv_status st = pkv_kv_seq_len(c, seq) >= 0 ? pkv_kv_media_shift_check(&c->seqs[seq], seq, start, n_remove, pos_delta)
                                                 : PKV_OK;
    if (st) return st;
    st = shift_pools(c, seq, start, n_remove, pos_delta);
    if (!st) pkv_kv_media_shift_apply(&c->seqs[seq], start, n_remove);
    if (st || (n_remove == 0 && pos_delta == 0)) return st;
    return pkv_kv_state_rewind(c, seq, start);
}

pkv_status pkv_kv_seq_clear(pkv_kv_cache *c, int32_t seq) {
    kv_seq *s = pkv_kv_seq_get(c, seq, "clear sequence");
    if (!s) return PKV_ERR_NOT_FOUND;
    pkv_status st;
    /* a swapped sequence becomes resident: it needs a live state slot again */
    if (s->swapped && (st = state_slot_check(c, "clear", seq))) return st;
    if (c->sub && (st = kv1_seq_clear(c->sub, seq))) return st;
    if ((st = kv1_seq_clear(c, seq))) return st;
    return pkv_kv_state_seq_empty(c, seq);
}

pkv_status pkv_kv_clear(pkv_kv_cache *c) {
    if (!c) return pkv_err(PKV_ERR_INVALID, "pkv_kv_clear: cache is NULL");
    pkv_status st = pkv_kv_state_clear_check(c); /* swapped sequences need live slots again */
    if (st) return st;
    if (c->sub && (st = kv1_clear(c->sub))) return st;
    if ((st = kv1_clear(c))) return st;
    return pkv_kv_state_clear(c);
}

/* ------------------------------------------------------------------ swap */

static pkv_status swap_out_pools(pkv_kv_cache *c, int32_t seq) {
    if (!c || !c->sub) return kv1_swap_out(c, seq);
    if (!pkv_kv_seq_resident(c, seq, "swap out")) return PKV_ERR_INVALID;
    publish_both(c, seq);
    pkv_status st = kv1_swap_out(c->sub, seq);
    if (st) return pkv_err_prefix(st, "the pool of the sliding-window layers");
    if ((st = kv1_swap_out(c, seq))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        if (kv1_swap_in(c->sub, seq)) window_reset(c, seq, INT64_MAX); /* its pages were just freed: cannot really fail */
        return pkv_err(st, "%s", msg);
    }
    return PKV_OK;
}

/* The live state goes to a host copy with the pages (its slot is freed, its
 * checkpoints dropped) and comes back into a fresh slot. */
pkv_status pkv_kv_swap_out(pkv_kv_cache *c, int32_t seq) {
    if (!kv_has_state(c)) return swap_out_pools(c, seq);
    if (!pkv_kv_seq_resident(c, seq, "swap out")) return PKV_ERR_INVALID;
    uint8_t *host = NULL;
    pkv_status st = pkv_kv_state_swap_out_prepare(c, seq, &host);
    if (st) return st;
    if ((st = swap_out_pools(c, seq))) {
        pkv_free(host);
        return st;
    }
    pkv_kv_state_swap_out_commit(c, seq, host);
    return PKV_OK;
}

pkv_status pkv_kv_swap_in(pkv_kv_cache *c, int32_t seq) {
    int32_t slot = -1;
    kv_seq *s = kv_has_state(c) ? pkv_kv_seq_get(c, seq, "swap in") : NULL;
    pkv_status st;
    if (s && s->swapped && (st = pkv_kv_state_swap_in_prepare(c, seq, &slot))) return st;
    if ((st = kv1_swap_in(c, seq))) {
        if (slot >= 0) pkv_kv_state_slot_unref(c, slot, c->slots[slot].gen);
        return st;
    }
    if (slot >= 0) pkv_kv_state_swap_in_commit(c, seq, slot);
    if (!c->sub) return PKV_OK;
    /* Without room in the window pool the window layers are recomputed instead. */
    if (sub_seq(c, seq)->swapped && kv1_swap_in(c->sub, seq)) window_reset(c, seq, INT64_MAX);
    return PKV_OK;
}

/* ---------------------------------------------------------- prefix reuse */

/* The window page published beside main page mp (same sequence, same index). */
static int32_t linked(const pkv_kv_cache *c, int32_t mp) {
    const kv_page *m = &c->pages[mp];
    const pkv_kv_cache *w = c->sub;
    for (int32_t q = w->buckets[m->key & (w->n_buckets - 1)]; q >= 0; q = w->pages[q].hnext)
        if (w->pages[q].link == mp && w->pages[q].link_gen == m->gen && w->pages[q].key == m->key) return q;
    return -1;
}

static pkv_status prefix_match_pools(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                                     int64_t *n_matched) {
    pkv_status st = kv1_prefix_match(c, seq, tokens, pos, n, n_matched);
    if (st || (!c->sub && !kv_has_state(c)) || *n_matched == 0) return st;
    /* A hit needs the window before its end resident: the longest matched page
     * boundary whose window pages are all still cached beside the main pages.
     * With recurrent layers it also needs the state stored at that boundary. */
    int ps = c->page_size;
    kv_seq *s = &c->seqs[seq];
    int64_t np = *n_matched / ps;
    int32_t *found = c->sub ? pkv_malloc((size_t)np * sizeof *found) : NULL;
    if (c->sub && !found) {
        kv1_truncate(c, seq, 0);
        *n_matched = 0;
        return pkv_err(PKV_ERR_NOMEM, "prefix match: out of memory");
    }
    int64_t m = np, first = 0;
    for (; m > 0; m--) {
        if (kv_has_state(c) && !pkv_kv_state_stored(c, pkv_kv_seq_page(s, m - 1), m * ps)) continue;
        if (!c->sub) break;
        int64_t need = m * ps + 1 - c->sub->window;
        first = need > 0 ? need / ps : 0;
        int64_t j = m - 1;
        for (; j >= first; j--)
            if ((found[j] = linked(c, pkv_kv_seq_page(s, j))) < 0) break;
        if (j < first) break;
    }
    if (m < np) kv1_truncate(c, seq, m * ps);
    if (m > 0 && c->sub) {
        kv_seq *w = sub_seq(c, seq);
        void *arr = w->own;
        size_t cap = w->cap_own;
        if ((st = pkv_grow(&arr, &cap, (size_t)m, sizeof(int32_t)))) {
            pkv_free(found);
            kv1_truncate(c, seq, 0);
            *n_matched = 0;
            return st;
        }
        w->own = arr;
        w->cap_own = cap;
        for (int64_t j = 0; j < m; j++) {
            w->own[j] = j < first ? -1 : found[j];
            pkv_kv_page_ref(c->sub, w->own[j]);
        }
        w->n_own = (size_t)m;
        w->n_hole = first;
        w->n_tokens = m * ps;
        w->pub_n = m;
        w->pub_stop = false;
        c->sub->stats.prefix_hit_pages += (uint64_t)(m - first);
    }
    pkv_free(found);
    if (m > 0 && (st = pkv_kv_state_prefix_take(c, seq, m))) {
        if (c->sub) pkv_kv_seq_release(c->sub, sub_seq(c, seq));
        kv1_truncate(c, seq, 0);
        *n_matched = 0;
        return st;
    }
    *n_matched = m * ps;
    return PKV_OK;
}

/* ----------------------------------------------------------------- stats */

void pkv_kv_stats_get(const pkv_kv_cache *c, pkv_kv_stats *out) {
    kv1_stats(c, out);
    if (!c || !out) return;
    pkv_kv_disk_stats(c, out);
    out->page_bytes = c->page_bytes_all;
    if (!c->sub) return;
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

/* ---------------------------------------------------------- media prefixes */

pkv_status pkv_kv_prefix_match(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                               int64_t *n_matched) {
    return pkv_kv_prefix_match_media(c, seq, tokens, pos, n, NULL, 0, n_matched);
}

/* The match may not end inside a chunk (a non-causal chunk's rows depend on the
 * rows after them; any chunk is one input): matched again up to that chunk's start
 * when it does. Without records, up to the first media id. The chunks matched are
 * recorded in seq. */
pkv_status pkv_kv_prefix_match_media(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                                     const pkv_kv_media *media, int n_media, int64_t *n_matched) {
    if (!c || !n_matched || (n > 0 && !tokens) || n < 0 || n_media < 0 || (n_media && !media))
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_prefix_match: NULL argument or negative count");
    *n_matched = 0;
    int64_t lim = n;
    if (!n_media)
        for (int64_t t = 0; t < n; t++)
            if (pkv_token_is_media(tokens[t])) {
                lim = t;
                break;
            }
    if (n_media) { /* the records must describe these tokens (rows past n may be cut off: n - 1 is usual) */
        pkv_status st = PKV_OK;
        int k = n_media;
        while (k > 0 && media[k - 1].start >= n) k--;
        if (k > 0 && media[k - 1].start + media[k - 1].n_rows > n) { /* the last chunk reaches past n */
            lim = PKV_MIN(lim, media[k - 1].start);
            k--;
        }
        if ((st = pkv_kv_media_verify(media, k, tokens, lim, "prefix match", true))) return st;
        n_media = k;
    }
    uint64_t hits = c->stats.prefix_hit_pages, hits_w = c->sub ? c->sub->stats.prefix_hit_pages : 0;
    pkv_status st = prefix_match_pools(c, seq, tokens, pos, lim, n_matched);
    if (st || !n_media || !*n_matched) return st;
    int64_t cut = pkv_kv_media_cut(&c->seqs[seq], *n_matched); /* no records yet: look in the given ones */
    for (int i = 0; i < n_media; i++)
        if (*n_matched > media[i].start && *n_matched < media[i].start + media[i].n_rows) cut = media[i].start;
    if (cut < *n_matched) { /* again, up to the chunk: the pages before it were hits a moment ago */
        if ((st = pkv_kv_truncate(c, seq, 0))) return st;
        c->stats.prefix_hit_pages = hits;
        if (c->sub) c->sub->stats.prefix_hit_pages = hits_w;
        if ((st = prefix_match_pools(c, seq, tokens, pos, cut, n_matched))) return st;
    }
    kv_seq *s = &c->seqs[seq];
    for (int i = 0; i < n_media && media[i].start + media[i].n_rows <= *n_matched; i++)
        if ((st = pkv_kv_media_add(c, seq, &media[i]))) {
            pkv_kv_truncate(c, seq, 0);
            *n_matched = 0;
            return st;
        }
    (void)s;
    return PKV_OK;
}
