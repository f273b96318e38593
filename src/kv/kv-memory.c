/* The public KV operations: each runs the hooks of the memory kinds a cache holds
 * (pkv_mem_kind, kv-impl.h), in table order, and undoes what the earlier kinds
 * did when a later one fails. Nothing here knows what a kind is: a new kind is
 * one file with its hooks plus one line in kv_kinds[] (docs/kv-cache.md, "Adding
 * a memory kind"). */
#include "kv/kv-impl.h"

#include <stdio.h>
#include <string.h>

/* Table order is dependency order: the full pool owns the sequences and is
 * first; the window pool's pages link to the full pool's; the media records
 * follow the tokens; the recurrent state goes back to what the kept tokens hold. */
static const pkv_mem_kind *const kv_kinds[] = {&kv_kind_full, &kv_kind_window, &kv_kind_media, &kv_kind_state};
#define N_KINDS PKV_MEM_KINDS
_Static_assert(sizeof kv_kinds / sizeof kv_kinds[0] == N_KINDS, "PKV_MEM_KINDS is the length of kv_kinds");

int pkv_kv_kinds(const pkv_kv_cache *c, const pkv_mem_kind *out[N_KINDS]) {
    int n = 0;
    for (int i = 0; i < N_KINDS; i++)
        if (kv_kinds[i]->present(c)) out[n++] = kv_kinds[i];
    return n;
}

int pkv_kv_kinds_all(const pkv_mem_kind *out[N_KINDS]) {
    for (int i = 0; i < N_KINDS; i++) out[i] = kv_kinds[i];
    return N_KINDS;
}

/* The error message of st kept across an undo (which may set its own). */
static pkv_status err_keep(pkv_status st, const char *msg) { return pkv_err(st, "%s", msg); }

#define KIND_HOOKS(k, n, hook, ...)                                                                                    \
    do {                                                                                                               \
        for (int i_ = 0; i_ < (n) && !st; i_++)                                                                        \
            if ((k)[i_]->hook) st = (k)[i_]->hook(__VA_ARGS__);                                                        \
    } while (0)

/* A resident sequence is about to change: every kind's prepare hook. */
static pkv_status prepare_all(pkv_kv_cache *c, const pkv_mem_kind **k, int n, int32_t seq, int64_t written,
                              const char *what) {
    pkv_status st = PKV_OK;
    KIND_HOOKS(k, n, prepare, c, seq, written, what);
    return st;
}

/* ------------------------------------------------------------ sequences */

/* Undo the new sequence id in kinds [0, upto). */
static void drop_new(pkv_kv_cache *c, const pkv_mem_kind **k, int upto, int32_t id) {
    for (int i = upto - 1; i >= 0; i--)
        if (k[i]->drop) k[i]->drop(c, id);
}

/* A new sequence (fork: a child of parent). On error nothing is changed. */
static pkv_status seq_new(pkv_kv_cache *c, uint64_t fingerprint, bool fork, int32_t parent, int32_t *out,
                          const char *what) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k);
    pkv_status st = PKV_OK;
    KIND_HOOKS(k, n, new_check, c, fork, parent, what);
    if (!st && fork) st = prepare_all(c, k, n, parent, INT64_MAX, what);
    if (st) return st;
    int32_t id = -1;
    for (int i = 0; i < n; i++) {
        if (fork ? !k[i]->fork : !k[i]->create) continue;
        st = fork ? k[i]->fork(c, parent, out ? &id : NULL) : k[i]->create(c, fingerprint, out ? &id : NULL);
        if (st) {
            drop_new(c, k, i, id);
            return st;
        }
    }
    *out = id;
    return PKV_OK;
}

pkv_status pkv_kv_seq_create(pkv_kv_cache *c, uint64_t fingerprint, int32_t *seq) {
    return seq_new(c, fingerprint, false, -1, seq, "create sequence");
}

/* The child holds what the parent holds: pages shared, state copied, media
 * records copied. On error nothing is changed. */
pkv_status pkv_kv_fork(pkv_kv_cache *c, int32_t parent, int32_t *child) {
    return seq_new(c, 0, true, parent, child, "fork");
}

pkv_status pkv_kv_seq_free(pkv_kv_cache *c, int32_t seq) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k);
    pkv_status st = PKV_OK;
    for (int i = n - 1; i >= 0; i--)
        if (k[i]->seq_free) st = k[i]->seq_free(c, seq);
    return st; /* the first kind's */
}

/* --------------------------------------------------------------- append */

/* Each kind takes the tokens in turn; a failure takes the earlier kinds' back. */
pkv_status pkv_kv_append_batch_w(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                                 const int32_t *tokens, const int32_t *pos, int32_t *rows, int32_t *rows_window) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k), n_append = 0;
    pkv_status st = PKV_OK;
    KIND_HOOKS(k, n, append_check, c, n_seqs, seqs, n_tokens);
    KIND_HOOKS(k, n, append_prepare, c, n_seqs, seqs, n_tokens);
    if (st) return st;
    for (int i = 0; i < n; i++) n_append += k[i]->append != NULL;
    /* The lengths before, for an undo: only when a second kind appends (it has
     * checked the sequences). */
    int64_t stack_len[16], *len = NULL;
    if (n_append > 1 && n_seqs > 0) {
        len = n_seqs <= 16 ? stack_len : pkv_malloc((size_t)n_seqs * sizeof *len);
        if (!len) return pkv_err(PKV_ERR_NOMEM, "append: out of memory");
        for (int i = 0; i < n_seqs; i++) len[i] = pkv_kv_seq_len(c, seqs[i]);
    }
    int done = 0;
    for (; done < n && !st; done++)
        if (k[done]->append) st = k[done]->append(c, n_seqs, seqs, n_tokens, tokens, pos, rows, rows_window, len);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        for (int i = done - 2; i >= 0; i--)
            if (k[i]->append_undo) k[i]->append_undo(c, n_seqs, seqs, len);
        st = err_keep(st, msg);
    } else {
        for (int i = 0; i < n; i++)
            if (k[i]->appended) k[i]->appended(c, n_seqs, seqs, n_tokens);
    }
    if (len != stack_len) pkv_free(len);
    return st;
}

pkv_status pkv_kv_append_batch(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                               const int32_t *tokens, const int32_t *pos, int32_t *rows) {
    return pkv_kv_append_batch_w(c, n_seqs, seqs, n_tokens, tokens, pos, rows, NULL);
}

pkv_status pkv_kv_block_table_get(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, bool with_positions,
                                  pkv_kv_block_table *out) {
    return kv1_block_table_get(c, n_seqs, seqs, with_positions, out);
}

/* ------------------------------------------------------- truncate, shift */

/* Where n_keep falls inside something a kind keeps whole (a media chunk), the
 * whole of it goes. The kinds after the first cannot fail but the recurrent
 * state's restore, which leaves the pages truncated and the state to recompute. */
pkv_status pkv_kv_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k);
    if (pkv_kv_seq_len(c, seq) >= 0)
        for (int i = 0; i < n; i++)
            if (k[i]->cut) n_keep = k[i]->cut(c, seq, n_keep);
    pkv_status st = prepare_all(c, k, n, seq, n_keep, "truncate");
    KIND_HOOKS(k, n, truncate, c, seq, n_keep);
    return st;
}

/* Every token from `start` on changes (the attention layers' outputs feed the
 * recurrent ones): the state goes back to the last checkpoint at or before start,
 * as for a truncate there. */
pkv_status pkv_kv_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k);
    pkv_status st = PKV_OK;
    if (pkv_kv_seq_len(c, seq) >= 0) KIND_HOOKS(k, n, shift_check, c, seq, start, n_remove, pos_delta);
    /* a shift that only drops the tail is a truncate: what it drops may never
     * have been written (a rolled-back step), so none of it is published */
    const int64_t len = pkv_kv_seq_len(c, seq);
    const bool tail = len >= 0 && start >= 0 && start <= len && n_remove == len - start;
    if (!st) st = prepare_all(c, k, n, seq, tail ? start : INT64_MAX, "shift");
    KIND_HOOKS(k, n, shift, c, seq, start, n_remove, pos_delta);
    return st;
}

/* ----------------------------------------------------------------- clear */

pkv_status pkv_kv_seq_clear(pkv_kv_cache *c, int32_t seq) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k);
    pkv_status st = PKV_OK;
    KIND_HOOKS(k, n, seq_clear_check, c, seq);
    for (int i = n - 1; i >= 0 && !st; i--)
        if (k[i]->seq_clear) st = k[i]->seq_clear(c, seq);
    KIND_HOOKS(k, n, seq_cleared, c, seq);
    return st;
}

pkv_status pkv_kv_clear(pkv_kv_cache *c) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k);
    pkv_status st = PKV_OK;
    KIND_HOOKS(k, n, clear_check, c);
    for (int i = n - 1; i >= 0 && !st; i--)
        if (k[i]->clear) st = k[i]->clear(c);
    KIND_HOOKS(k, n, cleared, c);
    return st;
}

/* ------------------------------------------------------------------ swap */

/* Each kind's swap_out_prepare (out) or swap_in_prepare hook, into p[]; *prepared:
 * how many kinds (from the first) may hold something in p[] to abort. */
static pkv_status swap_prepare(pkv_kv_cache *c, const pkv_mem_kind **k, int n, int32_t seq, bool out,
                               kv_pending p[N_KINDS], int *prepared) {
    memset(p, 0, N_KINDS * sizeof *p);
    pkv_status st = PKV_OK;
    int i = 0;
    for (; i < n && !st; i++) {
        pkv_status (*f)(pkv_kv_cache *, int32_t, kv_pending *) = out ? k[i]->swap_out_prepare : k[i]->swap_in_prepare;
        if (f) st = f(c, seq, &p[i]);
    }
    *prepared = st ? i - 1 : i; /* the failed one took nothing */
    return st;
}

/* On error nothing is changed (a kind that cannot take its pages back in
 * recomputes them instead). */
pkv_status pkv_kv_swap_out(pkv_kv_cache *c, int32_t seq) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k), prepared;
    kv_pending p[N_KINDS];
    pkv_status st = swap_prepare(c, k, n, seq, true, p, &prepared);
    if (!st) st = prepare_all(c, k, n, seq, INT64_MAX, "swap out");
    int i = n - 1;
    for (; i >= 0 && !st; i--)
        if (k[i]->swap_out) st = k[i]->swap_out(c, seq);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        for (int j = i + 2; j < n; j++) /* i + 1 failed */
            if (k[j]->swap_out_undo) k[j]->swap_out_undo(c, seq);
        for (int j = 0; j < prepared; j++)
            if (k[j]->swap_out_abort) k[j]->swap_out_abort(c, seq, p[j]);
        return err_keep(st, msg);
    }
    for (int j = 0; j < n; j++)
        if (k[j]->swap_out_commit) k[j]->swap_out_commit(c, seq, p[j]);
    return PKV_OK;
}

pkv_status pkv_kv_swap_in(pkv_kv_cache *c, int32_t seq) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k), prepared;
    kv_pending p[N_KINDS];
    pkv_status st = swap_prepare(c, k, n, seq, false, p, &prepared);
    KIND_HOOKS(k, n, swap_in, c, seq);
    for (int j = 0; j < prepared; j++) {
        if (st && k[j]->swap_in_abort) k[j]->swap_in_abort(c, seq, p[j]);
        if (!st && k[j]->swap_in_commit) k[j]->swap_in_commit(c, seq, p[j]);
    }
    return st;
}

/* ---------------------------------------------------------- prefix reuse */

/* The first kind's match, narrowed to the longest run of pages every other kind
 * can serve (the window before its end resident beside the pages; the state
 * stored at its end). On error seq is empty. */
static pkv_status prefix_match_kinds(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos,
                                     int64_t n, int64_t *n_matched) {
    const pkv_mem_kind *k[N_KINDS];
    int nk = pkv_kv_kinds(c, k);
    pkv_status st = k[0]->prefix_match(c, seq, tokens, pos, n, n_matched);
    bool narrow = false;
    for (int i = 1; i < nk; i++) narrow |= k[i]->prefix_ok != NULL;
    if (st || !narrow || *n_matched == 0) return st;
    int64_t np = *n_matched / c->page_size;
    kv_pending p[N_KINDS];
    memset(p, 0, sizeof p);
    int begun = 0, failed = -1; /* the kind whose begin or take failed */
    for (; begun < nk && !st; begun++)
        if (k[begun]->prefix_begin && (st = k[begun]->prefix_begin(c, seq, np, &p[begun]))) failed = begun;
    int64_t m = np;
    for (; !st && m > 0; m--) {
        bool ok = true;
        for (int i = 0; i < nk && ok; i++) ok = !k[i]->prefix_ok || k[i]->prefix_ok(c, seq, m, p[i]);
        if (ok) break;
    }
    for (int i = 0; i < nk && !st; i++)
        if (k[i]->prefix_take && (st = k[i]->prefix_take(c, seq, m, p[i]))) failed = i;
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        for (int i = failed - 1; i >= 0; i--)
            if (k[i]->prefix_undo) k[i]->prefix_undo(c, seq);
        *n_matched = 0;
        st = err_keep(st, msg);
    } else {
        *n_matched = m * c->page_size;
    }
    for (int i = 0; i < begun; i++)
        if (k[i]->prefix_end) k[i]->prefix_end(p[i]);
    return st;
}

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
    /* the prefix-hit counters of the kinds' pools, to count a rematch once */
    const pkv_mem_kind *kinds[N_KINDS];
    int nk = pkv_kv_kinds(c, kinds);
    uint64_t hits[N_KINDS] = {0};
    for (int i = 0; i < nk; i++)
        if (kinds[i]->pool) hits[i] = kinds[i]->pool(c)->stats.prefix_hit_pages;
    pkv_status st = prefix_match_kinds(c, seq, tokens, pos, lim, n_matched);
    if (st || !n_media || !*n_matched) return st;
    int64_t cut = *n_matched; /* where the kinds can cut (no media records yet: look in the given ones) */
    for (int i = 0; i < nk; i++)
        if (kinds[i]->cut) cut = kinds[i]->cut(c, seq, cut);
    for (int i = 0; i < n_media; i++)
        if (*n_matched > media[i].start && *n_matched < media[i].start + media[i].n_rows) cut = media[i].start;
    if (cut < *n_matched) { /* again, up to the chunk: the pages before it were hits a moment ago */
        if ((st = pkv_kv_truncate(c, seq, 0))) return st;
        for (int i = 0; i < nk; i++)
            if (kinds[i]->pool) kinds[i]->pool(c)->stats.prefix_hit_pages = hits[i];
        if ((st = prefix_match_kinds(c, seq, tokens, pos, cut, n_matched))) return st;
    }
    for (int i = 0; i < n_media && media[i].start + media[i].n_rows <= *n_matched; i++)
        if ((st = pkv_kv_media_add(c, seq, &media[i]))) {
            pkv_kv_truncate(c, seq, 0);
            *n_matched = 0;
            return st;
        }
    return PKV_OK;
}

/* ----------------------------------------------------------------- stats */

uint64_t pkv_kv_seq_bytes(const pkv_kv_cache *c, int64_t n_tokens) {
    const pkv_mem_kind *k[N_KINDS];
    int n = c ? pkv_kv_kinds(c, k) : 0;
    uint64_t b = 0;
    for (int i = 0; i < n; i++) {
        if (k[i]->token_bytes) b += (uint64_t)k[i]->token_bytes(c) * (uint64_t)PKV_MAX(n_tokens, 0);
        if (k[i]->seq_bytes) b += k[i]->seq_bytes(c);
    }
    return b;
}

void pkv_kv_stats_get(const pkv_kv_cache *c, pkv_kv_stats *out) {
    const pkv_mem_kind *k[N_KINDS];
    int n = pkv_kv_kinds(c, k);
    for (int i = 0; i < n; i++)
        if (k[i]->stats) k[i]->stats(c, out);
}
