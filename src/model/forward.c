/* The forward pass: a batch of tokens from several sequences in one step, all
 * through device kernels, with K/V stored in and read from the paged cache. Each
 * sequence has its own block table; forked sequences share pages.
 *
 * One step, T tokens in total:
 *   append T tokens to the cache (rows = page*page_size + slot for each token)
 *   x = embed(tokens)                                   f32 [T][E]
 *   per layer:  xb = rmsnorm(x)
 *               q, k, v = xb·Wqᵀ (+b), xb·Wkᵀ (+b), xb·Wvᵀ (+b)
 *               (qwen3: per-head rmsnorm of q and k)
 *               rope(q), rope(k) at the tokens' positions
 *               K/V cache rows <- k, v                   (set_rows, f16 or f32)
 *               att = paged_attention(q, cache, block tables)
 *               x += att·Woᵀ
 *               x += down(silu(xb·Wgᵀ) * (xb·Wuᵀ)) with xb = rmsnorm(x)
 *   logits = rmsnorm(x[out rows])·Woutᵀ
 * If any step fails, the appended tokens are truncated away again (nothing changes). */
#include <math.h>
#include <string.h>

#include "model/forward.h"

/* Workspace buffers on the model's device, grown on demand and kept between steps
 * so a decode step allocates nothing. */
struct pkv_fwd_ws {
    pkv_device *dev;
    int64_t cap_tokens, cap_out;
    size_t cap_ints;
    pkv_buffer *x;      /* f32 [T][E] residual stream */
    pkv_buffer *xb;     /* f32 [T][max(E, qd, od)] */
    pkv_buffer *q;      /* f32 [T][qd] */
    pkv_buffer *k, *v;  /* f32 [T][kd], [T][vd] */
    pkv_buffer *att;    /* f32 [T][od] */
    pkv_buffer *hb, *hb2; /* f32 [T][F] */
    pkv_buffer *logits; /* f32 [n_out][V] */
    pkv_buffer *ints;   /* i32: ids[T] pos[T] rows[T] out[n_out] meta[...] */
    int32_t *host_ints;
    size_t host_cap;
};

void pkv_fwd_ws_free(pkv_fwd_ws *ws) {
    if (!ws) return;
    pkv_buffer *bufs[] = {ws->x, ws->xb, ws->q, ws->k, ws->v, ws->att, ws->hb, ws->hb2, ws->logits, ws->ints};
    for (size_t i = 0; i < PKV_ARRAY_LEN(bufs); i++) pkv_buffer_free(bufs[i]);
    pkv_free(ws->host_ints);
    pkv_free(ws);
}

/* The largest per-token widths over all layers (I4: layers may differ). */
static void widths(const pkv_model *m, int64_t *qd, int64_t *kd, int64_t *vd, int64_t *od, int64_t *ff) {
    *qd = *kd = *vd = *od = *ff = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const pkv_layer *ly = &m->layers[l];
        *qd = PKV_MAX(*qd, (int64_t)ly->n_head * m->hp.head_dim_k);
        *kd = PKV_MAX(*kd, (int64_t)ly->n_head_kv * m->hp.head_dim_k);
        *vd = PKV_MAX(*vd, (int64_t)ly->n_head_kv * m->hp.head_dim_v);
        *od = PKV_MAX(*od, (int64_t)ly->n_head * m->hp.head_dim_v);
        *ff = PKV_MAX(*ff, (int64_t)ly->n_ff);
    }
}

static pkv_status realloc_buf(pkv_device *dev, pkv_buffer **b, size_t bytes) {
    pkv_buffer *nb = pkv_buffer_alloc(dev, bytes ? bytes : 4);
    if (!nb) return pkv_err_prefix(PKV_ERR_NOMEM, "forward workspace");
    pkv_buffer_free(*b);
    *b = nb;
    return PKV_OK;
}

/* Make sure the workspace holds T tokens, n_out logits rows and n_ints ints. */
static pkv_status ws_reserve(const pkv_model *m, pkv_fwd_ws **wsp, int64_t T, int64_t n_out, size_t n_ints) {
    pkv_fwd_ws *ws = *wsp;
    if (!ws) {
        ws = pkv_calloc(1, sizeof *ws);
        if (!ws) return pkv_err(PKV_ERR_NOMEM, "forward workspace");
        ws->dev = m->dev;
        *wsp = ws;
    }
    pkv_status s = PKV_OK;
    if (T > ws->cap_tokens) {
        int64_t cap = PKV_MAX(T, ws->cap_tokens * 2);
        int64_t qd, kd, vd, od, ff, E = m->hp.n_embd;
        widths(m, &qd, &kd, &vd, &od, &ff);
        size_t t4 = (size_t)cap * 4;
        if ((s = realloc_buf(m->dev, &ws->x, t4 * (size_t)E)) || (s = realloc_buf(m->dev, &ws->xb, t4 * (size_t)PKV_MAX(E, PKV_MAX(qd, od)))) ||
            (s = realloc_buf(m->dev, &ws->q, t4 * (size_t)qd)) || (s = realloc_buf(m->dev, &ws->k, t4 * (size_t)kd)) ||
            (s = realloc_buf(m->dev, &ws->v, t4 * (size_t)vd)) || (s = realloc_buf(m->dev, &ws->att, t4 * (size_t)od)) ||
            (s = realloc_buf(m->dev, &ws->hb, t4 * (size_t)ff)) || (s = realloc_buf(m->dev, &ws->hb2, t4 * (size_t)ff)))
            return s;
        ws->cap_tokens = cap;
    }
    if (n_out > ws->cap_out) {
        int64_t cap = PKV_MAX(n_out, ws->cap_out * 2);
        if ((s = realloc_buf(m->dev, &ws->logits, (size_t)cap * 4 * (size_t)m->hp.n_vocab))) return s;
        ws->cap_out = cap;
    }
    if (n_ints > ws->cap_ints) {
        size_t cap = PKV_MAX(n_ints, ws->cap_ints * 2);
        if ((s = realloc_buf(m->dev, &ws->ints, cap * 4))) return s;
        ws->cap_ints = cap;
    }
    if (n_ints > ws->host_cap) {
        void *p = ws->host_ints;
        if ((s = pkv_grow(&p, &ws->host_cap, n_ints, sizeof(int32_t)))) return s;
        ws->host_ints = p;
    }
    return PKV_OK;
}

static pkv_tref R(pkv_buffer *b, size_t off) { return pkv_tref_make(b, off); }

static pkv_status matmul(pkv_device *dev, const pkv_weight *w, pkv_buffer *x, pkv_buffer *y, int64_t T) {
    pkv_k_matmul_args a = {.w = R(w->buf, 0), .wtype = w->type, .rows = w->ne1, .cols = w->ne0,
                           .x = R(x, 0), .y = R(y, 0), .n = T};
    return pkv_k_matmul(dev, &a);
}

static pkv_status add_bias(pkv_device *dev, const pkv_weight *b, pkv_buffer *y, int64_t T) {
    if (!b->buf) return PKV_OK;
    pkv_k_add_args a = {.a = R(y, 0), .b = R(b->buf, 0), .y = R(y, 0), .n = T * b->ne0, .b_len = b->ne0};
    return pkv_k_add(dev, &a);
}

static pkv_status rmsnorm(pkv_device *dev, pkv_buffer *x, const pkv_weight *w, pkv_buffer *y, int64_t rows, int64_t len,
                          float eps) {
    pkv_k_rms_norm_args a = {.x = R(x, 0), .w = R(w->buf, 0), .y = R(y, 0), .n_rows = rows, .row_len = len, .eps = eps};
    return pkv_k_rms_norm(dev, &a);
}

static pkv_status add(pkv_device *dev, pkv_buffer *a, pkv_buffer *b, int64_t n) {
    pkv_k_add_args x = {.a = R(a, 0), .b = R(b, 0), .y = R(a, 0), .n = n, .b_len = n};
    return pkv_k_add(dev, &x);
}

static pkv_status rope(pkv_device *dev, const pkv_hparams *hp, pkv_buffer *x, int64_t T, int n_heads, pkv_tref pos) {
    pkv_k_rope_args a = {.x = R(x, 0), .dtype = PKV_TYPE_F32, .n_rows = T, .max_rows = T,
                         .row_stride = (size_t)n_heads * (size_t)hp->head_dim_k * 4, .n_heads = n_heads,
                         .head_dim = hp->head_dim_k, .n_rot = hp->n_rot, .neox = hp->rope_neox,
                         .freq_base = hp->rope_base, .freq_scale = hp->rope_freq_scale, .pos = pos};
    return pkv_k_rope(dev, &a);
}

/* The attention part of one layer for one shard (the whole layer when unsharded). */
static pkv_status attention_layer(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws *ws, int il, int64_t T, const pkv_fwd_plan *pl) {
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    pkv_device *dev = m->dev;
    int64_t E = hp->n_embd, qd = (int64_t)ly->n_head * hp->head_dim_k, kd = (int64_t)ly->n_head_kv * hp->head_dim_k,
            vd = (int64_t)ly->n_head_kv * hp->head_dim_v;
    pkv_status s;
    if ((s = rmsnorm(dev, ws->x, &ly->attn_norm, ws->xb, T, E, hp->rms_eps))) return s;
    if ((s = matmul(dev, &ly->wq, ws->xb, ws->q, T)) || (s = matmul(dev, &ly->wk, ws->xb, ws->k, T)) ||
        (s = matmul(dev, &ly->wv, ws->xb, ws->v, T)))
        return s;
    if ((s = add_bias(dev, &ly->bq, ws->q, T)) || (s = add_bias(dev, &ly->bk, ws->k, T)) || (s = add_bias(dev, &ly->bv, ws->v, T)))
        return s;
    if (ly->q_norm.buf) { /* qwen3: RMS norm of each head before RoPE */
        if ((s = rmsnorm(dev, ws->q, &ly->q_norm, ws->q, T * ly->n_head, hp->head_dim_k, hp->rms_eps)) ||
            (s = rmsnorm(dev, ws->k, &ly->k_norm, ws->k, T * ly->n_head_kv, hp->head_dim_k, hp->rms_eps)))
            return s;
    }
    pkv_tref pos = R(ws->ints, pl->off_pos * 4);
    if ((s = rope(dev, hp, ws->q, T, ly->n_head, pos)) || (s = rope(dev, hp, ws->k, T, ly->n_head_kv, pos))) return s;

    int kl = m->kv_layer ? m->kv_layer[il] : il; /* shared-KV drafts read another layer */
    pkv_kv_shard_info sh;
    if ((s = pkv_kv_shard(c, kl, 0, &sh))) return s;
    if (sh.compute != dev || sh.storage != dev)
        return pkv_err(PKV_ERR_MISMATCH, "layer %d: KV shard is stored on %s and computed on %s, but the model runs on %s", il,
                       pkv_device_name(sh.storage), pkv_device_name(sh.compute), pkv_device_name(dev));
    pkv_kv_layer_info li;
    if ((s = pkv_kv_layout_layer(pkv_kv_cache_layout(c), kl, &li))) return s;
    if (li.n_shards != 1 || li.n_kv_heads != ly->n_head_kv || li.head_dim_k != hp->head_dim_k || li.head_dim_v != hp->head_dim_v)
        return pkv_err(PKV_ERR_MISMATCH, "layer %d (cache layer %d): the KV cache geometry (%d heads of %d/%d, %d shards) does not match the model (%d heads of %d/%d)",
                       il, kl, li.n_kv_heads, li.head_dim_k, li.head_dim_v, li.n_shards, ly->n_head_kv, hp->head_dim_k, hp->head_dim_v);
    int64_t rows = sh.n_pages * pkv_kv_layout_page_size(pkv_kv_cache_layout(c));
    pkv_tref idx = R(ws->ints, pl->off_rows * 4);
    pkv_k_set_rows_args sk = {.src = R(ws->k, 0), .src_stride = (size_t)kd * 4, .dst = R(sh.k, sh.k_off), .dst_type = li.dtype,
                              .dst_stride = sh.k_row_bytes, .dst_rows = rows, .idx = idx, .n = T, .row_elems = kd};
    pkv_k_set_rows_args sv = {.src = R(ws->v, 0), .src_stride = (size_t)vd * 4, .dst = R(sh.v, sh.v_off), .dst_type = li.dtype,
                              .dst_stride = sh.v_row_bytes, .dst_rows = rows, .idx = idx, .n = T, .row_elems = vd};
    if ((s = pkv_k_set_rows(dev, &sk)) || (s = pkv_k_set_rows(dev, &sv))) return s;
    pkv_k_attention_args at = {.q = R(ws->q, 0), .k = R(sh.k, sh.k_off), .v = R(sh.v, sh.v_off), .out = R(ws->att, 0),
                               .meta = R(ws->ints, pl->off_meta * 4), .kv_type = li.dtype, .n_q = (int)T,
                               .n_seq = pl->n_seqs, .meta_pages = pl->meta_pages, .n_pages = (int)sh.n_pages,
                               .page_size = pkv_kv_layout_page_size(pkv_kv_cache_layout(c)), .n_head = ly->n_head,
                               .n_kv = ly->n_head_kv, .dk = hp->head_dim_k, .dv = hp->head_dim_v,
                               .scale = 1.0f / sqrtf((float)hp->head_dim_k)};
    if ((s = pkv_k_attention(dev, &at))) return s;
    (void)qd;
    if ((s = matmul(dev, &ly->wo, ws->att, ws->xb, T))) return s;
    return add(dev, ws->x, ws->xb, T * E);
}

static pkv_status ffn_layer(const pkv_model *m, pkv_fwd_ws *ws, int il, int64_t T) {
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    pkv_device *dev = m->dev;
    int64_t E = hp->n_embd;
    pkv_status s;
    if ((s = rmsnorm(dev, ws->x, &ly->ffn_norm, ws->xb, T, E, hp->rms_eps))) return s;
    if ((s = matmul(dev, &ly->w_gate, ws->xb, ws->hb, T)) || (s = matmul(dev, &ly->w_up, ws->xb, ws->hb2, T))) return s;
    pkv_k_swiglu_args sw = {.g = R(ws->hb, 0), .u = R(ws->hb2, 0), .y = R(ws->hb, 0), .n = T * ly->n_ff};
    if ((s = pkv_k_swiglu(dev, &sw))) return s;
    if ((s = matmul(dev, &ly->w_down, ws->hb, ws->xb, T))) return s;
    return add(dev, ws->x, ws->xb, T * E);
}

/* Build the host-side integer block (ids, positions, rows, output rows, attention
 * meta) for the step; the cache append already happened. */
static pkv_status plan(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, const pkv_fwd_batch *b, const int32_t *rows,
                       const int64_t *len_before, pkv_fwd_plan *pl) {
    pkv_kv_block_table bt;
    pkv_status s = pkv_kv_block_table_get(c, b->n_seqs, b->seqs, true, &bt);
    if (s) return s;
    int64_t T = 0;
    for (int i = 0; i < b->n_seqs; i++) T += b->n_tokens[i];
    int64_t n_out = b->all_logits ? T : b->n_seqs;
    pl->n_seqs = b->n_seqs;
    pl->meta_pages = bt.indptr[b->n_seqs];
    pl->off_ids = 0;
    pl->off_pos = (size_t)T;
    pl->off_rows = 2 * (size_t)T;
    pl->off_out = 3 * (size_t)T;
    pl->off_meta = pl->off_out + (size_t)n_out;
    size_t n_ints = pl->off_meta + 2 * (size_t)T + (size_t)b->n_seqs + 1 + (size_t)pl->meta_pages;
    if ((s = ws_reserve(m, wsp, T, n_out, n_ints))) return s;
    int32_t *I = (*wsp)->host_ints;
    int32_t *q_seq = I + pl->off_meta, *q_len = q_seq + T, *indptr = q_len + T, *pages = indptr + b->n_seqs + 1;
    int64_t k = 0, o = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        int32_t nt = b->n_tokens[i];
        const int32_t *positions = bt.positions + bt.tok_indptr[i] + (bt.tok_indptr[i + 1] - bt.tok_indptr[i] - nt);
        for (int32_t j = 0; j < nt; j++, k++) {
            I[pl->off_ids + k] = b->tokens[k];
            I[pl->off_pos + k] = positions[j];
            I[pl->off_rows + k] = rows[k];
            q_seq[k] = i;
            q_len[k] = (int32_t)(len_before[i] + j + 1);
            if (b->all_logits) I[pl->off_out + o++] = (int32_t)k;
        }
        if (!b->all_logits) I[pl->off_out + o++] = (int32_t)(k - 1);
    }
    memcpy(indptr, bt.indptr, ((size_t)b->n_seqs + 1) * sizeof *indptr);
    memcpy(pages, bt.pages, (size_t)pl->meta_pages * sizeof *pages);
    pl->T = T;
    pl->n_out = n_out;
    return pkv_buffer_write((*wsp)->ints, 0, I, n_ints * 4);
}

pkv_status pkv_model_forward(pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, const pkv_fwd_batch *b, float *logits) {
    if (!m || !c || !wsp || !b || b->n_seqs <= 0 || !b->seqs || !b->n_tokens || !b->tokens)
        return pkv_err(PKV_ERR_INVALID, "forward: bad arguments");
    int64_t T = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        if (b->n_tokens[i] <= 0) return pkv_err(PKV_ERR_INVALID, "forward: sequence %d of the batch has %d tokens", i, b->n_tokens[i]);
        T += b->n_tokens[i];
    }
    for (int64_t k = 0; k < T; k++)
        if (b->tokens[k] < 0 || b->tokens[k] >= m->hp.n_vocab)
            return pkv_err(PKV_ERR_INVALID, "token id %d at batch position %lld is outside the vocabulary [0, %d)", b->tokens[k],
                           (long long)k, m->hp.n_vocab);
    int64_t stack_len[16];
    int64_t *len_before = b->n_seqs <= 16 ? stack_len : pkv_malloc((size_t)b->n_seqs * sizeof *len_before);
    int32_t *rows = pkv_malloc((size_t)T * sizeof *rows);
    pkv_status s = PKV_OK;
    if (!len_before || !rows) {
        s = pkv_err(PKV_ERR_NOMEM, "forward: %lld tokens", (long long)T);
        goto out;
    }
    for (int i = 0; i < b->n_seqs; i++) len_before[i] = pkv_kv_seq_len(c, b->seqs[i]);
    /* A shared-KV draft writes only its mapped layers of a page: such pages must
     * never be offered for prefix reuse, so they are appended without token ids. */
    bool publish = !b->no_publish && !m->kv_layer;
    if ((s = pkv_kv_append_batch(c, b->n_seqs, b->seqs, b->n_tokens, publish ? b->tokens : NULL, b->pos, rows))) goto out;
    pkv_fwd_plan pl;
    s = plan(m, c, wsp, b, rows, len_before, &pl);
    pkv_fwd_ws *ws = *wsp;
    pkv_device *dev = m->dev;
    if (!s) {
        pkv_k_get_rows_args ge = {.w = R(m->tok_embd.buf, 0), .wtype = m->tok_embd.type, .n_vocab = m->hp.n_vocab,
                                  .cols = m->hp.n_embd, .ids = R(ws->ints, pl.off_ids * 4), .out = R(ws->x, 0), .n = T};
        s = pkv_k_get_rows(dev, &ge);
    }
    for (int il = 0; !s && il < m->hp.n_layer; il++) {
        s = attention_layer(m, c, ws, il, T, &pl);
        if (!s) s = ffn_layer(m, ws, il, T);
    }
    if (!s) { /* gather the rows that need logits, final norm, output projection */
        pkv_k_get_rows_args g = {.w = R(ws->x, 0), .wtype = PKV_TYPE_F32, .n_vocab = T, .cols = m->hp.n_embd,
                                 .ids = R(ws->ints, pl.off_out * 4), .out = R(ws->xb, 0), .n = pl.n_out};
        s = pkv_k_get_rows(dev, &g);
    }
    if (!s) s = rmsnorm(dev, ws->xb, &m->output_norm, ws->xb, pl.n_out, m->hp.n_embd, m->hp.rms_eps);
    if (!s) s = matmul(dev, &m->output, ws->xb, ws->logits, pl.n_out);
    if (!s && logits) s = pkv_buffer_read(ws->logits, 0, logits, (size_t)pl.n_out * (size_t)m->hp.n_vocab * 4);
    else if (!s) s = pkv_device_sync(dev);
    if (s) { /* roll the cache back: the step never happened */
        pkv_status keep = s;
        char msg[1024];
        strncpy(msg, pkv_errmsg(), sizeof msg - 1);
        msg[sizeof msg - 1] = 0;
        for (int i = 0; i < b->n_seqs; i++) pkv_kv_truncate(c, b->seqs[i], len_before[i]);
        s = pkv_err(keep, "%s", msg);
    }
out:
    if (len_before != stack_len) pkv_free(len_before);
    pkv_free(rows);
    return s;
}
