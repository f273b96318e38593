/* The forward pass: a batch of tokens from several sequences in one step, all
 * through device kernels, with K/V stored in and read from the paged cache. Each
 * sequence has its own block table; forked sequences share pages.
 *
 * One step, T tokens in total:
 *   append T tokens to the cache (rows = page*page_size + slot for each token)
 *   x = the architecture's input (pkv_arch_ops.input; default the token embedding
 *       rows times the model's embedding scale, and media rows)           f32 [T][E]
 *   per layer: the architecture's block diagram (src/model/arch/<arch>.c) over the
 *              blocks of blocks.h, each adding its output to x
 *   logits = the architecture's head (pkv_arch_ops.output; default
 *            rmsnorm(x[out rows])·Woutᵀ)
 * Here: the step's plan (the integers every kernel reads), the cache append and its
 * rollback, and the window pool's recomputation. If any step fails, the appended
 * tokens are truncated away again (nothing changes). */
#include <string.h>

#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/lora.h"

/* Build the host-side integer block (ids, positions, rows, output rows, attention
 * meta of the main pool and of the window pool, and the recurrent kernels' meta)
 * for the step; the cache append already happened. rows NULL: a replay
 * (pl->replay; the tokens are in the main pool already, at len_before[i] onwards).
 * rows_w NULL: no window pool. state: the cache has recurrent layers. */
static pkv_status plan(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, const pkv_fwd_batch *b, const int32_t *rows,
                       const int32_t *rows_w, bool state, const int64_t *len_before, pkv_fwd_plan *pl) {
    pkv_kv_block_table bt, bw;
    pkv_status s = pkv_kv_block_table_get(c, b->n_seqs, b->seqs, true, &bt);
    if (!s && rows_w) s = pkv_kv_block_table_window(c, b->n_seqs, b->seqs, &bw);
    if (s) return s;
    int64_t T = 0;
    for (int i = 0; i < b->n_seqs; i++) T += b->n_tokens[i];
    int64_t n_out = b->all_logits ? T : b->n_seqs;
    if (b->n_logits)
        for (int i = n_out = 0; i < b->n_seqs; i++) n_out += b->n_logits[i];
    pl->n_seqs = b->n_seqs;
    pl->meta_pages = bt.indptr[b->n_seqs];
    pl->window = rows_w != NULL;
    pl->replay = rows == NULL;
    pl->peek = b->peek;
    pl->state = state;
    pl->meta_pages_w = rows_w ? bw.indptr[b->n_seqs] : 0;
    pl->off_ids = 0;
    pl->off_pos = (size_t)T;
    pl->off_rows = 2 * (size_t)T;
    pl->off_rows_w = 3 * (size_t)T;
    pl->off_out = 4 * (size_t)T;
    pl->off_meta = pl->off_out + (size_t)n_out;
    pl->off_meta_w = pl->off_meta + 2 * (size_t)T + (size_t)b->n_seqs + 1 + (size_t)pl->meta_pages;
    pl->off_smeta = pl->off_meta_w + (rows_w ? 2 * (size_t)T + (size_t)b->n_seqs + 1 + (size_t)pl->meta_pages_w : 0);
    size_t n_ints = pl->off_smeta + (state ? 2 * (size_t)b->n_seqs + 1 : 0);
    pl->off_qwin = b->span_end ? n_ints : 0;
    if (b->span_end) n_ints += (size_t)T;
    if ((s = pkv_fwd_reserve(m, c, wsp, T, n_out, n_ints))) return s;
    int32_t *I = (*wsp)->host_ints;
    int32_t *q_seq = I + pl->off_meta, *q_len = q_seq + T, *indptr = q_len + T, *pages = indptr + b->n_seqs + 1;
    int64_t k = 0, o = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        int32_t nt = b->n_tokens[i], first_out = b->n_logits ? nt - b->n_logits[i] : b->all_logits ? 0 : nt - 1;
        const int32_t *positions = bt.positions + bt.tok_indptr[i] + len_before[i];
        for (int32_t j = 0; j < nt; j++, k++) {
            I[pl->off_ids + k] = b->tokens[k] < 0 ? 0 : b->tokens[k]; /* a media row: its row replaces the lookup */
            I[pl->off_pos + k] = b->peek ? b->pos[k] : positions[j];
            I[pl->off_rows + k] = rows ? rows[k] : -1;
            I[pl->off_rows_w + k] = rows_w ? rows_w[k] : -1;
            q_seq[k] = i;
            q_len[k] = (int32_t)(b->peek ? len_before[i] : len_before[i] + j + 1);
            if (b->span_end && b->span_end[k] > j + 1) q_len[k] = (int32_t)(len_before[i] + b->span_end[k]); /* non-causal */
            if (b->span_end) I[pl->off_qwin + k] = (int32_t)(len_before[i] + j + 1); /* its window's end (plan) */
            if (j >= first_out) I[pl->off_out + o++] = (int32_t)k;
        }
    }
    memcpy(indptr, bt.indptr, ((size_t)b->n_seqs + 1) * sizeof *indptr);
    memcpy(pages, bt.pages, (size_t)pl->meta_pages * sizeof *pages);
    if (rows_w) { /* the same queries over the window pool's table */
        int32_t *mw = I + pl->off_meta_w;
        memcpy(mw, q_seq, 2 * (size_t)T * sizeof *mw);
        memcpy(mw + 2 * T, bw.indptr, ((size_t)b->n_seqs + 1) * sizeof *mw);
        memcpy(mw + 2 * T + b->n_seqs + 1, bw.pages, (size_t)pl->meta_pages_w * sizeof *mw);
    }
    if (state) { /* each sequence's token rows and its live state slot */
        int32_t *sm = I + pl->off_smeta;
        sm[0] = 0;
        for (int i = 0; i < b->n_seqs; i++) sm[i + 1] = sm[i] + b->n_tokens[i];
        if ((s = pkv_kv_state_slots(c, b->n_seqs, b->seqs, sm + b->n_seqs + 1))) return s;
    }
    pl->T = T;
    pl->n_out = n_out;
    for (int i = 0; i < (*wsp)->n; i++) /* every device that runs a kernel of the step */
        if ((s = pkv_buffer_write((*wsp)->d[i].ints, 0, I, n_ints * 4))) return s;
    return PKV_OK;
}

/* The last layer of the cache with a window (window > 0) or with recurrent state
 * (state), or -1. */
static int last_layer_of(const pkv_kv_cache *c, bool state) {
    const pkv_kv_layout *lay = pkv_kv_cache_layout(c);
    int last = -1;
    for (int l = 0; l < pkv_kv_layout_n_layers(lay); l++) {
        pkv_kv_layer_info li;
        if (!pkv_kv_layout_layer(lay, l, &li) && (state ? li.state_per_head > 0 : li.window > 0)) last = l;
    }
    return last;
}

/* Tokens per forward step on a cache with a window pool or recurrent state, so one
 * step never needs more window pages than pkv_cache_params.n_window_pages provides
 * for, and a replay is done in bounded pieces. */
#define FWD_WINDOW_STEP 256

/* What a step must keep beside the full layers' KV: the last window layer and the
 * last recurrent layer (-1: none). */
typedef struct fwd_mem {
    int last_w, last_r;
} fwd_mem;

/* The default head (pkv_arch_ops.output). */
static pkv_status head(pkv_fwd *f, float *logits) {
    pkv_status s = pkv_blk_logits(f, logits);
    return s ? s : pkv_device_sync(f->m->dev);
}

/* Under several ranks (src/dist/): this rank's part of a step that runs layers [0,
 * n_layer): its layers [lo, hi), the rank it receives the residual stream from and
 * the one it sends it to (-1: none), and the rank whose layers end the step, whose
 * result (status, logits, hidden rows) goes to every other rank. */
typedef struct fwd_ranks {
    int lo, hi, from, to, last;
} fwd_ranks;

static fwd_ranks ranks_of(const pkv_model *m, int n_layer) {
    fwd_ranks r = {.lo = 0, .hi = n_layer, .from = -1, .to = -1, .last = 0};
    if (m->n_ranks <= 1) return r;
    r.lo = PKV_MIN(m->rank_first[m->rank], n_layer);
    r.hi = PKV_MIN(m->rank_first[m->rank + 1], n_layer);
    while (m->rank_first[r.last + 1] < n_layer) r.last++;
    r.from = m->rank > 0 && m->rank <= r.last ? m->rank - 1 : -1;
    r.to = m->rank < r.last ? m->rank + 1 : -1;
    return r;
}

/* What every rank's step must agree on: its batch, the cache rows it writes
 * (identical page ids on every rank) and the layers it runs. */
static uint64_t step_digest(const pkv_fwd_batch *b, int64_t T, const int32_t *rows, const int32_t *rows_w, int n_layer) {
    uint64_t h = pkv_hash64(&n_layer, sizeof n_layer, (uint64_t)T);
    h = pkv_hash64(b->seqs, (size_t)b->n_seqs * sizeof *b->seqs, h);
    h = pkv_hash64(b->n_tokens, (size_t)b->n_seqs * sizeof *b->n_tokens, h);
    h = pkv_hash64(b->tokens, (size_t)T * sizeof *b->tokens, h);
    if (rows) h = pkv_hash64(rows, (size_t)T * sizeof *rows, h);
    if (rows_w) h = pkv_hash64(rows_w, (size_t)T * sizeof *rows_w, h);
    return h;
}

/* The residual stream x [T][n_embd] from the previous rank (into dev's x), or to
 * the next one; s: this rank's status so far (a failure is passed on, not x). */
static pkv_status pass_x(pkv_fwd *f, const fwd_ranks *rk, bool in, pkv_status s, uint64_t digest) {
    const size_t n = (size_t)f->T * (size_t)f->m->hp.n_embd * sizeof(float);
    pkv_buffer *x = pkv_fwd_dev(f->ws, f->m->dev)->x;
    float *h = pkv_malloc(n);
    if (!h) return pkv_err(PKV_ERR_NOMEM, "forward: %zu bytes for the residual stream between ranks", n);
    if (in) {
        s = pkv_dist_recv_step(rk->from, s, digest, h, n);
        if (!s) s = pkv_buffer_write(x, 0, h, n);
    } else {
        if (!s) s = pkv_buffer_read(x, 0, h, n);
        s = pkv_dist_send_step(rk->to, s, digest, h, n);
    }
    pkv_free(h);
    return s;
}

/* The step's result from the last rank to every other: its status, then (OK) the
 * logits [n_out][n_vocab] and the hidden rows [T][n_embd] that were asked for. */
static pkv_status pass_result(pkv_fwd *f, const fwd_ranks *rk, pkv_status s, uint64_t digest, float *logits) {
    const pkv_model *m = f->m;
    const pkv_fwd_batch *b = f->b;
    int64_t n_out = b->all_logits ? f->T : b->n_seqs;
    if (b->n_logits)
        for (int i = n_out = 0; i < b->n_seqs; i++) n_out += b->n_logits[i];
    const size_t nl = logits ? (size_t)n_out * (size_t)m->hp.n_vocab * sizeof *logits : 0,
                 nh = b->hidden_out ? (size_t)f->T * (size_t)m->hp.n_embd * sizeof(float) : 0;
    if (m->rank != rk->last) {
        s = pkv_dist_recv_step(rk->last, s, digest, logits, nl);
        return nh ? pkv_dist_recv_step(rk->last, s, digest, b->hidden_out, nh) : s;
    }
    for (int r = 0; r < m->n_ranks; r++) {
        if (r == m->rank) continue;
        pkv_status t = pkv_dist_send_step(r, s, digest, logits, nl);
        if (!t && nh) t = pkv_dist_send_step(r, s, digest, b->hidden_out, nh);
        if (!s) s = t;
    }
    return s;
}

/* One step. Normally b's tokens are appended and run through every layer, and
 * logits (or, with no_output, nothing) come out. replay: b holds one sequence's
 * tokens that are in the main pool already, from its window length (a window
 * pool) or its state length (recurrent layers) on; only the layers up to the last
 * such layer run, writing the window layers' KV or the recurrent state. */
static pkv_status step(pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, const pkv_fwd_batch *b, float *logits, fwd_mem mem,
                       bool replay, bool no_output) {
    int64_t T = 0;
    for (int i = 0; i < b->n_seqs; i++) T += b->n_tokens[i];
    const bool state = mem.last_r >= 0 && !b->peek; /* queries that append nothing move no state */
    int64_t stack_len[16];
    int64_t *len_before = b->n_seqs <= 16 ? stack_len : pkv_malloc((size_t)b->n_seqs * sizeof *len_before);
    int32_t *rows = pkv_malloc((size_t)T * 2 * sizeof *rows), *rows_w = NULL;
    pkv_status s = PKV_OK;
    if (!len_before || !rows) {
        s = pkv_err(PKV_ERR_NOMEM, "forward: %lld tokens", (long long)T);
        goto out;
    }
    if (mem.last_w >= 0) rows_w = rows + T; /* only once rows is known not to be NULL */
    for (int i = 0; i < b->n_seqs; i++)
        len_before[i] = !replay ? pkv_kv_seq_len(c, b->seqs[i])
                        : state ? pkv_kv_seq_state_len(c, b->seqs[i])
                                : pkv_kv_seq_window_len(c, b->seqs[i]);
    /* Recurrent state: a step of several tokens (a prompt, a speculative
     * verification) starts with a checkpoint where the state is, so rolling some of
     * them back costs a copy and the replay of the kept ones, not of everything
     * since the last checkpoint */
    for (int i = 0; state && !replay && i < b->n_seqs; i++)
        if (b->n_tokens[i] > 1) {
            const int32_t two = 2;
            pkv_kv_state_step_done(c, 1, &b->seqs[i], &two); /* checkpoints only when the state has moved on */
        }
    /* A shared-KV draft writes only its mapped layers of a page: such pages must
     * never be offered for prefix reuse, so they are appended without token ids. (A
     * model whose last layers reuse its own earlier layers' KV writes every layer of
     * its cache: its pages are published.) */
    bool publish = !b->no_publish && !m->kv_draft;
    if (replay && rows_w)
        s = pkv_kv_window_replay(c, b->seqs[0], b->n_tokens[0], rows_w);
    else if (b->peek) /* nothing is appended: no rows to write (the layers write none) */
        for (int64_t k = 0; k < 2 * T; k++) rows[k] = -1;
    else if (!replay)
        s = pkv_kv_append_batch_w(c, b->n_seqs, b->seqs, b->n_tokens, publish ? b->tokens : NULL, b->pos, rows, rows_w);
    if (s) goto out;
    pkv_fwd_plan pl;
    memset(&pl, 0, sizeof pl);
    s = plan(m, c, wsp, b, replay ? NULL : rows, rows_w, state, len_before, &pl);
    pkv_fwd_ws *ws = *wsp;
    pkv_device *dev = m->dev;
    const pkv_arch_ops *ops = pkv_arch_ops_of(m->hp.arch);
    pkv_fwd f = {.m = m, .c = c, .ws = ws, .pl = &pl, .b = b, .T = T};
    const pkv_lora_set *stack_sets[16], **sets = b->n_seqs <= 16 ? stack_sets : pkv_malloc((size_t)b->n_seqs * sizeof *sets);
    if (!s && !sets) s = pkv_err(PKV_ERR_NOMEM, "forward: LoRA sets of %d sequences", b->n_seqs);
    if (!s) s = pkv_lora_step(&f, sets);
    if (!s) s = ops->input ? ops->input(&f) : pkv_blk_embed(&f);
    /* the architecture's layers; a replay stops after the last layer it recomputes,
     * whose FFN is not needed */
    const int n_layer = !replay ? m->hp.n_layer : (state ? mem.last_r : mem.last_w) + 1;
    /* under several ranks, this rank's layers between the residual stream's receipt
     * and its passing on; the last rank's result goes to every rank */
    const fwd_ranks rk = ranks_of(m, n_layer);
    const uint64_t digest = m->n_ranks > 1 ? step_digest(b, T, replay || b->peek ? NULL : rows, rows_w, n_layer) : 0;
    if (rk.from >= 0) s = pass_x(&f, &rk, true, s, digest);
    for (int il = rk.lo; !s && il < rk.hi; il++) {
        f.attn_only = replay && il == n_layer - 1;
        s = ops->layer(&f, il);
    }
    if (rk.to >= 0) s = pass_x(&f, &rk, false, s, digest);
    if (!s && m->rank == rk.last)
        s = replay || no_output ? pkv_device_sync(dev) : ops->output ? ops->output(&f, logits) : head(&f, logits);
    if (m->n_ranks > 1) s = pass_result(&f, &rk, s, digest, replay || no_output ? NULL : logits);
    if (sets != stack_sets) pkv_free(sets);
    /* the recurrent state took the tokens in: its length moves (a replay), and the
     * cache takes the checkpoints its policy asks for */
    if (!s && replay && state) s = pkv_kv_state_replay(c, b->seqs[0], b->n_tokens[0]);
    if (!s && state) s = pkv_kv_state_step_done(c, b->n_seqs, b->seqs, b->n_tokens);
    if (s) { /* roll the cache back: the step never happened */
        pkv_status keep = s;
        char msg[1024];
        strncpy(msg, pkv_errmsg(), sizeof msg - 1);
        msg[sizeof msg - 1] = 0;
        if (replay && state)
            pkv_kv_state_reset(c, b->seqs[0]); /* the state is half-updated: back to a checkpoint */
        else if (replay)
            pkv_kv_window_reset(c, b->seqs[0]);
        else
            for (int i = 0; i < b->n_seqs; i++) pkv_kv_truncate(c, b->seqs[i], len_before[i]);
        s = pkv_err(keep, "%s", msg);
    }
out:
    if (len_before != stack_len) pkv_free(len_before);
    pkv_free(rows);
    return s;
}

/* Recompute what the sequence's full-layer KV does not hold, up to its length: the
 * window layers (after a truncate or shift back into released window pages) or the
 * recurrent state (after a truncate or shift put a checkpoint back, or a failed
 * step), FWD_WINDOW_STEP tokens at a time. */
static pkv_status catch_up(pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, int32_t seq, const pkv_lora_set *lora, fwd_mem mem) {
    const bool state = mem.last_r >= 0;
    int64_t len = pkv_kv_seq_len(c, seq), have = state ? pkv_kv_seq_state_len(c, seq) : pkv_kv_seq_window_len(c, seq);
    if (have >= len) return PKV_OK;
    int32_t *tok = pkv_malloc((size_t)FWD_WINDOW_STEP * sizeof *tok);
    if (!tok) return pkv_err(PKV_ERR_NOMEM, "forward: out of memory");
    pkv_status s = PKV_OK;
    while (!s && have < len) {
        int32_t n = (int32_t)PKV_MIN(len - have, FWD_WINDOW_STEP);
        s = pkv_kv_seq_tokens(c, seq, have, n, tok, NULL);
        for (int32_t j = 0; !s && j < n; j++)
            if (pkv_token_is_media(tok[j]))
                s = pkv_err(PKV_ERR_UNSUPPORTED, "sequence %d: the %s must be recomputed from token %lld, which is a media row: "
                            "the cache does not keep media embeddings; truncate before the media and decode it again", seq,
                            state ? "recurrent state" : "sliding-window layers", (long long)(have + j));
            else if (tok[j] < 0)
                s = pkv_err(PKV_ERR_INVALID, "sequence %d: the %s must be recomputed from token %lld, but its token ids were not "
                            "recorded (appended without tokens)", seq, state ? "recurrent state" : "sliding-window layers",
                            (long long)(have + j));
        pkv_fwd_batch rb = {.n_seqs = 1, .seqs = &seq, .n_tokens = &n, .tokens = tok, .lora = lora ? &lora : NULL};
        if (!s) s = step(m, c, wsp, &rb, NULL, mem, true, true);
        have += n;
    }
    pkv_free(tok);
    return s ? pkv_err_prefix(s, "recomputing the %s of sequence %d", state ? "recurrent state" : "sliding-window layers", seq)
             : PKV_OK;
}

/* Where sequence i's tokens are cut into steps: every FWD_WINDOW_STEP tokens, and
 * with recurrent state also at the last page boundary inside them, so the state
 * there is checkpointed and offered to prefix matching with the pages before it. */
static int32_t chunk_len(const pkv_kv_cache *c, fwd_mem mem, int64_t len0, int32_t off, int32_t n_tokens,
                         const int32_t *span_end) {
    int32_t n = PKV_MIN(n_tokens - off, FWD_WINDOW_STEP);
    if (mem.last_r >= 0) {
        int64_t ps = pkv_kv_layout_page_size(pkv_kv_cache_layout(c)), start = len0 + off, end = len0 + n_tokens;
        int64_t boundary = end / ps * ps;
        if (boundary > start && boundary < start + n) n = (int32_t)(boundary - start);
    }
    /* a non-causal span (span_end: this sequence's entries) is never split: the cut
     * moves before it, or, when it starts the chunk, after it */
    if (span_end && off + n < n_tokens && span_end[off + n - 1] > off + n) {
        int32_t a = off + n - 1;
        while (a > off && span_end[a - 1] == span_end[off + n - 1]) a--;
        n = a > off ? a - off : span_end[off + n - 1] - off;
    }
    return n;
}

/* Sequence i's entries of b->span_end, or NULL. */
static const int32_t *span_of(const pkv_fwd_batch *b, int i) {
    if (!b->span_end) return NULL;
    int64_t k = 0;
    for (int j = 0; j < i; j++) k += b->n_tokens[j];
    return b->span_end + k;
}

pkv_status pkv_model_forward(pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, const pkv_fwd_batch *b, float *logits) {
    if (!m || !c || !wsp || !b || b->n_seqs <= 0 || !b->seqs || !b->n_tokens || !b->tokens)
        return pkv_err(PKV_ERR_INVALID, "forward: bad arguments");
    int64_t T = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        if (b->n_tokens[i] <= 0) return pkv_err(PKV_ERR_INVALID, "forward: sequence %d of the batch has %d tokens", i, b->n_tokens[i]);
        T += b->n_tokens[i];
        if (b->n_logits && (b->n_logits[i] < 1 || b->n_logits[i] > b->n_tokens[i]))
            return pkv_err(PKV_ERR_INVALID, "forward: sequence %d of the batch asks for logits of %d of its %d tokens", i,
                           b->n_logits[i], b->n_tokens[i]);
    }
    int64_t n_media = 0;
    for (int64_t k = 0; k < T; k++) {
        if (b->media_embd && pkv_token_is_media(b->tokens[k])) {
            n_media++;
            continue;
        }
        if (b->tokens[k] < 0 || b->tokens[k] >= m->hp.n_vocab)
            return pkv_err(PKV_ERR_INVALID, "token id %d at batch position %lld is outside the vocabulary [0, %d)", b->tokens[k],
                           (long long)k, m->hp.n_vocab);
    }
    if (b->media_embd && n_media != b->n_media_rows)
        return pkv_err(PKV_ERR_INVALID, "forward: the batch holds %lld media rows' ids, %lld rows were given", (long long)n_media,
                       (long long)b->n_media_rows);
    if (n_media && (m->assistant || m->mtp || m->ple.tok || b->peek || b->hidden_in))
        return pkv_err(PKV_ERR_UNSUPPORTED, "forward: media rows into %s (a model with per-layer embeddings, a query-only draft or an "
                       "MTP head) are not supported",
                       m->label);
    const fwd_mem mem = {.last_w = last_layer_of(c, false), .last_r = last_layer_of(c, true)};
    if (b->peek) { /* read-only queries: the cache must hold what they read; they run in one step */
        if (!b->pos) return pkv_err(PKV_ERR_INVALID, "forward: queries that append nothing need their positions");
        if (!m->assistant)
            return pkv_err(PKV_ERR_INVALID, "forward: %s computes K/V: only a model whose layers only read (a query-only "
                           "draft, pkv_model_info.assistant) runs queries that append nothing", m->label);
        for (int i = 0; i < b->n_seqs; i++) {
            if (mem.last_r >= 0 && pkv_kv_seq_state_len(c, b->seqs[i]) < pkv_kv_seq_len(c, b->seqs[i]))
                return pkv_err(PKV_ERR_INVALID, "forward: sequence %d's recurrent state is behind its tokens", b->seqs[i]);
            if (mem.last_w >= 0 && pkv_kv_seq_window_len(c, b->seqs[i]) < pkv_kv_seq_len(c, b->seqs[i]))
                return pkv_err(PKV_ERR_INVALID, "forward: sequence %d's sliding-window layers hold %lld of its %lld tokens: the "
                               "model that owns the cache must decode first (it recomputes them)", b->seqs[i],
                               (long long)pkv_kv_seq_window_len(c, b->seqs[i]), (long long)pkv_kv_seq_len(c, b->seqs[i]));
        }
        return step(m, c, wsp, b, logits, mem, false, false);
    }
    if (mem.last_w >= 0 && mem.last_r >= 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "forward: a cache with both sliding-window layers (layer %d) and recurrent layers "
                       "(layer %d) is not supported", mem.last_w, mem.last_r);
    if (mem.last_w < 0 && mem.last_r < 0) return step(m, c, wsp, b, logits, mem, false, false);
    /* A window pool or recurrent state: catch its sequences up, then steps of at most
     * FWD_WINDOW_STEP tokens per sequence (the kernels are batch-invariant, so the
     * result does not depend on the split). */
    pkv_status s = PKV_OK;
    for (int i = 0; i < b->n_seqs && !s; i++) s = catch_up(m, c, wsp, b->seqs[i], b->lora ? b->lora[i] : NULL, mem);
    if (s) return s;
    bool one_step = true;
    for (int i = 0; i < b->n_seqs && one_step; i++)
        one_step = chunk_len(c, mem, pkv_kv_seq_len(c, b->seqs[i]), 0, b->n_tokens[i], span_of(b, i)) == b->n_tokens[i];
    if (one_step) return step(m, c, wsp, b, logits, mem, false, false);
    /* Rounds of one chunk of every sequence that has tokens left, batched together
     * (a sequence whose tokens cross a page boundary does not make the others run
     * alone). Each round gathers its tokens, positions and hidden rows, and its
     * logits and hidden rows are scattered back. */
    const int ns = b->n_seqs;
    const size_t V = (size_t)m->hp.n_vocab, E = (size_t)m->hp.n_embd;
    int64_t n_out = 0;
    for (int i = 0; i < ns; i++) n_out += b->n_logits ? b->n_logits[i] : b->all_logits ? b->n_tokens[i] : 1;
    int64_t *len0 = pkv_malloc((size_t)ns * sizeof *len0);
    int32_t *ints = pkv_malloc((size_t)ns * 8 * sizeof *ints + (size_t)T * 2 * sizeof *ints);
    float *hin = b->hidden_in ? pkv_malloc((size_t)T * E * sizeof *hin) : NULL;
    float *hout = b->hidden_out ? pkv_malloc((size_t)T * E * sizeof *hout) : NULL;
    float *lg = logits ? pkv_malloc((size_t)n_out * V * sizeof *lg) : NULL;
    /* media: each token's first media row (prefix counts), a round's rows and spans */
    int64_t *mpre = n_media ? pkv_malloc(((size_t)T + 1) * sizeof *mpre) : NULL;
    float *r_embd = n_media ? pkv_malloc((size_t)n_media * E * sizeof *r_embd) : NULL;
    int32_t *r_span = b->span_end ? pkv_malloc((size_t)T * sizeof *r_span) : NULL;
    const pkv_lora_set **r_lora = b->lora ? pkv_malloc((size_t)ns * sizeof *r_lora) : NULL;
    if ((n_media && (!mpre || !r_embd)) || (b->span_end && !r_span) || (b->lora && !r_lora)) {
        s = pkv_err(PKV_ERR_NOMEM, "forward: out of memory for %lld media rows in rounds", (long long)n_media);
        goto free;
    }
    if (mpre) mpre[0] = 0;
    for (int64_t k = 0; mpre && k < T; k++) mpre[k + 1] = mpre[k] + pkv_token_is_media(b->tokens[k]);
    if (!len0 || !ints || (b->hidden_in && !hin) || (b->hidden_out && !hout) || (logits && !lg)) {
        s = pkv_err(PKV_ERR_NOMEM, "forward: out of memory for %lld tokens in rounds", (long long)T);
        goto free;
    }
    /* per sequence: first token k0, first logits row o0, first token with logits,
     * tokens done; per round: its sequences, their tokens and rows; tokens, pos */
    int32_t *k0 = ints, *o0 = k0 + ns, *first = o0 + ns, *done = first + ns, *r_seq = done + ns, *r_n = r_seq + ns,
            *r_nl = r_n + ns, *r_i = r_nl + ns, *r_tok = r_i + ns, *r_pos = r_tok + T;
    for (int i = 0, k = 0, o = 0; i < ns; k += b->n_tokens[i], i++) {
        len0[i] = pkv_kv_seq_len(c, b->seqs[i]);
        const int32_t nt = b->n_tokens[i];
        k0[i] = k;
        o0[i] = o;
        first[i] = b->n_logits ? nt - b->n_logits[i] : b->all_logits ? 0 : nt - 1;
        o += nt - first[i];
        done[i] = 0;
    }
    for (;;) {
        int nr = 0;
        int64_t t = 0, rows = 0, mr = 0;
        for (int i = 0; i < ns; i++) {
            const int32_t nt = b->n_tokens[i], off = done[i];
            if (off >= nt) continue;
            int32_t n = chunk_len(c, mem, len0[i], off, nt, b->span_end ? b->span_end + k0[i] : NULL),
                    from = PKV_MAX(off, first[i]);
            if (mpre) { /* the chunk's media rows, contiguous in b->media_embd */
                int64_t m0 = mpre[k0[i] + off], m1 = mpre[k0[i] + off + n];
                memcpy(r_embd + (size_t)mr * E, b->media_embd + (size_t)m0 * E, (size_t)(m1 - m0) * E * sizeof *r_embd);
                mr += m1 - m0;
            }
            for (int32_t j = 0; r_span && j < n; j++) { /* ends relative to the chunk */
                int32_t e = b->span_end[k0[i] + off + j];
                r_span[t + j] = e > off + j + 1 ? e - off : 0;
            }
            r_seq[nr] = b->seqs[i];
            r_n[nr] = n;
            r_nl[nr] = off + n > from ? off + n - from : 0; /* the chunk's rows with logits: a suffix of it */
            r_i[nr] = i;
            if (r_lora) r_lora[nr] = b->lora[i];
            memcpy(r_tok + t, b->tokens + k0[i] + off, (size_t)n * sizeof *r_tok);
            if (b->pos) memcpy(r_pos + t, b->pos + k0[i] + off, (size_t)n * sizeof *r_pos);
            if (hin) memcpy(hin + (size_t)t * E, b->hidden_in + (size_t)(k0[i] + off) * E, (size_t)n * E * sizeof *hin);
            rows += r_nl[nr];
            t += n;
            nr++;
        }
        if (!nr) break;
        bool extra = !rows && hout; /* hidden rows wanted, no logits: one row computed and dropped */
        if (extra) r_nl[0] = 1;
        pkv_fwd_batch sb = {.n_seqs = nr, .seqs = r_seq, .n_tokens = r_n, .tokens = r_tok, .pos = b->pos ? r_pos : NULL,
                            .n_logits = r_nl, .no_publish = b->no_publish, .hidden_in = hin, .hidden_out = hout,
                            .media_embd = mpre ? r_embd : NULL, .n_media_rows = mr, .span_end = r_span,
                            .lora = r_lora};
        if ((s = step(m, c, wsp, &sb, lg && rows ? lg : NULL, mem, false, !rows && !hout))) break;
        for (int j = 0, o = 0; j < nr; j++) { /* scatter, and move each sequence on */
            const int i = r_i[j];
            const int32_t off = done[i], n = r_n[j];
            if (lg && rows && r_nl[j] && !extra) {
                int32_t from = PKV_MAX(off, first[i]);
                memcpy(logits + (size_t)(o0[i] + from - first[i]) * V, lg + (size_t)o * V, (size_t)r_nl[j] * V * sizeof *lg);
                o += r_nl[j];
            }
            done[i] += n;
        }
        if (hout) /* the round's hidden rows, in its token order */
            for (int j = 0, tt = 0; j < nr; tt += r_n[j], j++) {
                const int i = r_i[j];
                memcpy(b->hidden_out + (size_t)(k0[i] + done[i] - r_n[j]) * E, hout + (size_t)tt * E,
                       (size_t)r_n[j] * E * sizeof *hout);
            }
    }
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        for (int i = 0; i < b->n_seqs; i++) pkv_kv_truncate(c, b->seqs[i], len0[i]);
        s = pkv_err(s, "%s", msg);
    }
free:
    pkv_free(mpre);
    pkv_free(r_embd);
    pkv_free(r_span);
    pkv_free(r_lora);
    pkv_free(len0);
    pkv_free(ints);
    pkv_free(hin);
    pkv_free(hout);
    pkv_free(lg);
    return s;
}
