/* The forward pass: a batch of tokens from several sequences in one step, all
 * through device kernels, with K/V stored in and read from the paged cache. Each
 * sequence has its own block table; forked sequences share pages.
 *
 * One step, T tokens in total:
 *   append T tokens to the cache (rows = page*page_size + slot for each token)
 *   x = embed(tokens)                                   f32 [T][E]
 *   per layer:  xb = rmsnorm(x)
 *               q, k, v = xb·Wqᵀ (+b), xb·Wkᵀ (+b), xb·Wvᵀ (+b)
 *               (qwen3, gemma3: per-head rmsnorm of q and k)
 *               rope(q), rope(k) at the tokens' positions (the layer's base and scale;
 *               YaRN's mix and magnitude where the model has it)
 *               K/V cache rows <- k, v                   (set_rows, f16 or f32)
 *               att = paged_attention(q, cache, block tables)   (gpt-oss: with sinks)
 *               x += att·Woᵀ (+b)
 *               x += down(silu(xb·Wgᵀ) * (xb·Wuᵀ)) with xb = rmsnorm(x)
 *               (or a mixture of experts, moe_layer)
 *   logits = rmsnorm(x[out rows])·Woutᵀ
 * With tensor parallelism (several devices), each device computes the heads and
 * FFN rows of its shard from the normed input broadcast to it, and the partial
 * outputs are summed into the residual stream on the first device. Each shard's
 * K/V live where the cache put them; when that is another device than the
 * shard's (the cache on the host), q, k and v go there, attention runs there,
 * and its output comes back: attention always runs where its KV is stored.
 * If any step fails, the appended tokens are truncated away again (nothing changes). */
#include <math.h>
#include <string.h>

#include "model/forward.h"

/* Workspace buffers of one device, grown on demand and kept between steps so a
 * decode step allocates nothing. */
typedef struct dev_ws {
    pkv_device *dev;
    int64_t cap_tokens, cap_out;
    size_t cap_ints;
    pkv_buffer *x;      /* f32 [T][E] residual stream (first device) */
    pkv_buffer *xb;     /* f32 [T][max(E, qd, od)] */
    pkv_buffer *y;      /* f32 [T][E] a shard's partial output */
    pkv_buffer *q;      /* f32 [T][qd] */
    pkv_buffer *k, *v;  /* f32 [T][kd], [T][vd] */
    pkv_buffer *att;    /* f32 [T][od] */
    pkv_buffer *hb, *hb2; /* f32 [T][F] */
    pkv_buffer *logits; /* f32 [n_out][V] (first device) */
    pkv_buffer *ints;   /* i32: ids[T] pos[T] rows[T] out[n_out] meta[...] */
    /* mixture of experts (first device) */
    pkv_buffer *router; /* f32 [T][n_expert] */
    pkv_buffer *xe;     /* f32 [T][E] the rows routed to one expert */
    pkv_buffer *moe_ids; /* i32 [T] */
} dev_ws;

struct pkv_fwd_ws {
    int n;
    dev_ws d[PKV_MAX_DEVICES + 1]; /* every device of the model, and the host */
    int32_t *host_ints;
    size_t host_cap;
    /* MoE routing and combining on the host: probs [T][n_expert], out [T][E],
     * y [T][E], rows [T] (token of each routed row), sel [T][n_expert_used],
     * wsel [T][n_expert_used] */
    float *h_probs, *h_out, *h_y, *h_wsel;
    int32_t *h_rows, *h_sel;
    int64_t h_cap_tokens;
};

void pkv_fwd_ws_free(pkv_fwd_ws *ws) {
    if (!ws) return;
    for (int i = 0; i < ws->n; i++) {
        dev_ws *d = &ws->d[i];
        pkv_buffer *bufs[] = {d->x,      d->xb,   d->y,      d->q,      d->k,      d->v,      d->att,
                              d->hb,     d->hb2,  d->logits, d->ints,   d->router, d->xe,     d->moe_ids};
        for (size_t k = 0; k < PKV_ARRAY_LEN(bufs); k++) pkv_buffer_free(bufs[k]);
    }
    pkv_free(ws->host_ints);
    pkv_free(ws->h_probs);
    pkv_free(ws->h_out);
    pkv_free(ws->h_y);
    pkv_free(ws->h_wsel);
    pkv_free(ws->h_rows);
    pkv_free(ws->h_sel);
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

/* The workspace of dev (created empty on first use). */
static dev_ws *ws_of(pkv_fwd_ws *ws, pkv_device *dev) {
    for (int i = 0; i < ws->n; i++)
        if (ws->d[i].dev == dev) return &ws->d[i];
    if (ws->n == PKV_MAX_DEVICES + 1) return NULL;
    memset(&ws->d[ws->n], 0, sizeof ws->d[0]);
    ws->d[ws->n].dev = dev;
    return &ws->d[ws->n++];
}

/* Make sure dev's workspace holds T tokens, n_out logits rows (main device only)
 * and n_ints ints. */
static pkv_status dev_reserve(const pkv_model *m, dev_ws *w, bool main_dev, int64_t T, int64_t n_out, size_t n_ints) {
    pkv_status s = PKV_OK;
    pkv_device *dev = w->dev;
    if (T > w->cap_tokens) {
        int64_t cap = PKV_MAX(T, w->cap_tokens * 2);
        int64_t qd, kd, vd, od, ff, E = m->hp.n_embd;
        widths(m, &qd, &kd, &vd, &od, &ff);
        size_t t4 = (size_t)cap * 4;
        if ((main_dev && (s = realloc_buf(dev, &w->x, t4 * (size_t)E))) ||
            (s = realloc_buf(dev, &w->xb, t4 * (size_t)PKV_MAX(E, PKV_MAX(qd, od)))) || (s = realloc_buf(dev, &w->y, t4 * (size_t)E)) ||
            (s = realloc_buf(dev, &w->q, t4 * (size_t)qd)) || (s = realloc_buf(dev, &w->k, t4 * (size_t)kd)) ||
            (s = realloc_buf(dev, &w->v, t4 * (size_t)vd)) || (s = realloc_buf(dev, &w->att, t4 * (size_t)od)) ||
            (s = realloc_buf(dev, &w->hb, t4 * (size_t)ff)) || (s = realloc_buf(dev, &w->hb2, t4 * (size_t)ff)))
            return s;
        if (main_dev && m->hp.n_expert > 0 &&
            ((s = realloc_buf(dev, &w->router, t4 * (size_t)m->hp.n_expert)) || (s = realloc_buf(dev, &w->xe, t4 * (size_t)E)) ||
             (s = realloc_buf(dev, &w->moe_ids, t4))))
            return s;
        w->cap_tokens = cap;
    }
    if (main_dev && n_out > w->cap_out) {
        int64_t cap = PKV_MAX(n_out, w->cap_out * 2);
        if ((s = realloc_buf(dev, &w->logits, (size_t)cap * 4 * (size_t)m->hp.n_vocab))) return s;
        w->cap_out = cap;
    }
    if (n_ints > w->cap_ints) {
        size_t cap = PKV_MAX(n_ints, w->cap_ints * 2);
        if ((s = realloc_buf(dev, &w->ints, cap * 4))) return s;
        w->cap_ints = cap;
    }
    return PKV_OK;
}

/* Every device the step touches: the model's devices, and the KV storage devices. */
static pkv_status ws_reserve(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, int64_t T, int64_t n_out, size_t n_ints) {
    pkv_fwd_ws *ws = *wsp;
    if (!ws) {
        ws = pkv_calloc(1, sizeof *ws);
        if (!ws) return pkv_err(PKV_ERR_NOMEM, "forward workspace");
        *wsp = ws;
    }
    pkv_status s;
    for (int d = 0; d < m->n_dev; d++) {
        dev_ws *w = ws_of(ws, m->devs[d]);
        if (!w) return pkv_err(PKV_ERR_INTERNAL, "forward: too many devices");
        if ((s = dev_reserve(m, w, d == 0, T, n_out, n_ints))) return s;
    }
    pkv_kv_shard_info sh;
    for (int d = 0; d < m->n_dev && pkv_kv_shard(c, m->kv_layer ? m->kv_layer[0] : 0, d, &sh) == PKV_OK; d++) {
        dev_ws *w = ws_of(ws, sh.storage);
        if (!w) return pkv_err(PKV_ERR_INTERNAL, "forward: too many devices");
        if ((s = dev_reserve(m, w, w->dev == m->dev, T, n_out, n_ints))) return s;
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

/* RoPE with the layer's own base and scale (gemma3's sliding and global layers differ).
 * YaRN as llama.cpp runs it: the correction range from the layer's base, and cos and
 * sin times rope.scaling.attn_factor and, where the layer scales (factor > 1),
 * 1 + 0.1 ln(factor): llama.cpp's context divides that factor out of its attn_factor and
 * ggml's rope multiplies it back in; the product is computed once here. */
static pkv_status rope(pkv_device *dev, const pkv_hparams *hp, const pkv_layer *ly, pkv_buffer *x, int64_t T, int n_heads,
                       pkv_tref pos) {
    pkv_k_rope_args a = {.x = R(x, 0), .dtype = PKV_TYPE_F32, .n_rows = T, .max_rows = T,
                         .row_stride = (size_t)n_heads * (size_t)hp->head_dim_k * 4, .n_heads = n_heads,
                         .head_dim = hp->head_dim_k, .n_rot = hp->n_rot, .neox = hp->rope_neox,
                         .freq_base = ly->rope_base, .freq_scale = ly->rope_freq_scale, .pos = pos,
                         .mscale = hp->rope_attn_factor};
    if (hp->rope_ext_factor != 0) {
        float dims[2];
        pkv_rope_yarn_corr_dims(hp->n_rot, hp->rope_n_ctx_orig, ly->rope_base, hp->rope_beta_fast, hp->rope_beta_slow, dims);
        a.ext_factor = hp->rope_ext_factor;
        a.corr_lo = dims[0];
        a.corr_hi = dims[1];
        if (ly->rope_freq_scale < 1.0f) a.mscale *= 1.0f + 0.1f * logf(1.0f / ly->rope_freq_scale);
    }
    return pkv_k_rope(dev, &a);
}

/* Copy n bytes between workspaces; nothing to do on the same buffer. */
static pkv_status move(pkv_buffer *src, pkv_buffer *dst, size_t n) {
    return src == dst ? PKV_OK : pkv_buffer_copy(src, 0, dst, 0, n);
}

/* Fold each shard's partial output y into the residual stream x on the main
 * device (summing in device order). post_norm (Gemma): the whole output is RMS
 * normed first, so the partials are summed into w0->y, normed, then added. */
static pkv_status reduce(const pkv_model *m, pkv_fwd_ws *ws, dev_ws *w0, int64_t T, const pkv_weight *post_norm) {
    size_t bytes = (size_t)T * (size_t)m->hp.n_embd * 4;
    if (post_norm && post_norm->buf) {
        pkv_status s;
        for (int d = 1; d < m->n_dev; d++) { /* w0 is device 0's: sum the others into its y */
            dev_ws *w = ws_of(ws, m->devs[d]);
            if ((s = pkv_buffer_copy(w->y, 0, w0->xb, 0, bytes)) || (s = add(m->dev, w0->y, w0->xb, T * m->hp.n_embd)))
                return s;
        }
        if ((s = rmsnorm(m->dev, w0->y, post_norm, w0->y, T, m->hp.n_embd, m->hp.rms_eps))) return s;
        return add(m->dev, w0->x, w0->y, T * m->hp.n_embd);
    }
    for (int d = 0; d < m->n_dev; d++) {
        dev_ws *w = ws_of(ws, m->devs[d]);
        pkv_buffer *part = w->y;
        if (w != w0) { /* bring the partial to the main device (its xb is free now) */
            pkv_status s = pkv_buffer_copy(w->y, 0, w0->xb, 0, bytes);
            if (s) return s;
            part = w0->xb;
        }
        pkv_status s = add(m->dev, w0->x, part, T * m->hp.n_embd);
        if (s) return s;
    }
    return PKV_OK;
}

/* The attention part of one layer: every shard on its device, attention where
 * its KV is stored, partial outputs summed into x. */
static pkv_status attention_layer(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws *ws, int il, int64_t T, const pkv_fwd_plan *pl) {
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    dev_ws *w0 = ws_of(ws, m->dev);
    int64_t E = hp->n_embd;
    size_t xbytes = (size_t)T * (size_t)E * 4;
    pkv_status s;
    if ((s = rmsnorm(m->dev, w0->x, &ly->attn_norm, w0->xb, T, E, hp->rms_eps))) return s;
    int kl = m->kv_layer ? m->kv_layer[il] : il; /* shared-KV drafts read another layer */
    pkv_kv_layer_info li;
    if ((s = pkv_kv_layout_layer(pkv_kv_cache_layout(c), kl, &li))) return s;
    if (li.n_shards != m->n_dev || li.n_kv_heads != ly->n_head_kv || li.head_dim_k != hp->head_dim_k ||
        li.head_dim_v != hp->head_dim_v)
        return pkv_err(PKV_ERR_MISMATCH,
                       "layer %d (cache layer %d): the KV cache (%d heads of %d/%d in %d shards) does not match the model (%d "
                       "heads of %d/%d on %d devices)",
                       il, kl, li.n_kv_heads, li.head_dim_k, li.head_dim_v, li.n_shards, ly->n_head_kv, hp->head_dim_k,
                       hp->head_dim_v, m->n_dev);
    int page_size = pkv_kv_layout_page_size(pkv_kv_cache_layout(c));
    /* A cache layer with a window keeps only that many tokens (plus a page): the
     * model's layer must not look further back. */
    if (li.window > 0 && (ly->window == 0 || ly->window > li.window))
        return pkv_err(PKV_ERR_MISMATCH, "layer %d (cache layer %d): the cache keeps a window of %d tokens, the model's layer "
                       "attends to %s%d", il, kl, li.window, ly->window ? "" : "all tokens, not ", ly->window ? ly->window : li.window);
    const bool wpool = li.window > 0;
    const size_t off_rows = wpool ? pl->off_rows_w : pl->off_rows, off_meta = wpool ? pl->off_meta_w : pl->off_meta;
    const int meta_pages = wpool ? pl->meta_pages_w : pl->meta_pages;
    for (int d = 0; d < m->n_dev; d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        dev_ws *w = ws_of(ws, dev);
        int64_t qd = (int64_t)sw->n_q * hp->head_dim_k, kd = (int64_t)sw->n_kv * hp->head_dim_k,
                vd = (int64_t)sw->n_kv * hp->head_dim_v, od = (int64_t)sw->n_q * hp->head_dim_v;
        if ((s = move(w0->xb, w->xb, xbytes))) return s;
        if ((s = matmul(dev, &sw->wq, w->xb, w->q, T)) || (s = matmul(dev, &sw->wk, w->xb, w->k, T)) ||
            (s = matmul(dev, &sw->wv, w->xb, w->v, T)))
            return s;
        if ((s = add_bias(dev, &sw->bq, w->q, T)) || (s = add_bias(dev, &sw->bk, w->k, T)) || (s = add_bias(dev, &sw->bv, w->v, T)))
            return s;
        if (sw->q_norm.buf) { /* qwen3: RMS norm of each head before RoPE */
            if ((s = rmsnorm(dev, w->q, &sw->q_norm, w->q, T * sw->n_q, hp->head_dim_k, hp->rms_eps)) ||
                (s = rmsnorm(dev, w->k, &sw->k_norm, w->k, T * sw->n_kv, hp->head_dim_k, hp->rms_eps)))
                return s;
        }
        pkv_tref pos = R(w->ints, pl->off_pos * 4);
        if ((s = rope(dev, hp, ly, w->q, T, sw->n_q, pos)) || (s = rope(dev, hp, ly, w->k, T, sw->n_kv, pos))) return s;

        pkv_kv_shard_info sh;
        if ((s = pkv_kv_shard(c, kl, d, &sh))) return s;
        if (sh.head_begin != sw->kv_h0 || sh.n_heads != sw->n_kv)
            return pkv_err(PKV_ERR_MISMATCH, "layer %d shard %d: the cache holds KV heads [%d, %d) but the model computes [%d, %d)",
                           il, d, sh.head_begin, sh.head_begin + sh.n_heads, sw->kv_h0, sw->kv_h0 + sw->n_kv);
        /* Attention runs where the shard's KV is stored (I5): on the host with --kv-on-host. */
        pkv_device *kdev = sh.storage;
        dev_ws *kw = ws_of(ws, kdev);
        if (!kw) return pkv_err(PKV_ERR_INTERNAL, "forward: no workspace for %s", pkv_device_name(kdev));
        if (kw != w) {
            if ((s = move(w->q, kw->q, (size_t)(T * qd * 4))) || (s = move(w->k, kw->k, (size_t)(T * kd * 4))) ||
                (s = move(w->v, kw->v, (size_t)(T * vd * 4))))
                return s;
        }
        int64_t rows = sh.n_pages * page_size;
        pkv_tref idx = R(kw->ints, off_rows * 4);
        pkv_k_set_rows_args sk = {.src = R(kw->k, 0), .src_stride = (size_t)kd * 4, .dst = R(sh.k, sh.k_off), .dst_type = li.dtype_k,
                                  .dst_stride = sh.k_row_bytes, .dst_rows = rows, .idx = idx, .n = T, .row_elems = kd};
        pkv_k_set_rows_args sv = {.src = R(kw->v, 0), .src_stride = (size_t)vd * 4, .dst = R(sh.v, sh.v_off), .dst_type = li.dtype_v,
                                  .dst_stride = sh.v_row_bytes, .dst_rows = rows, .idx = idx, .n = T, .row_elems = vd};
        /* A replay recomputes window layers only: the full layers' rows are cached. */
        if ((wpool || !pl->replay) && ((s = pkv_k_set_rows(kdev, &sk)) || (s = pkv_k_set_rows(kdev, &sv)))) return s;
        pkv_k_attention_args at = {.q = R(kw->q, 0), .k = R(sh.k, sh.k_off), .v = R(sh.v, sh.v_off), .out = R(kw->att, 0),
                                   .meta = R(kw->ints, off_meta * 4), .k_type = li.dtype_k, .v_type = li.dtype_v, .n_q = (int)T,
                                   .n_seq = pl->n_seqs, .meta_pages = meta_pages, .n_pages = (int)sh.n_pages,
                                   .page_size = page_size, .n_head = sw->n_q, .n_kv = sw->n_kv, .dk = hp->head_dim_k,
                                   .dv = hp->head_dim_v,
                                   .scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim_k),
                                   .window = ly->window, .softcap = hp->attn_softcap,
                                   .sinks = pkv_tref_make(sw->sinks.buf, 0)};
        if ((s = pkv_k_attention(kdev, &at))) return s;
        if (kw != w && (s = move(kw->att, w->att, (size_t)(T * od * 4)))) return s;
        if ((s = matmul(dev, &sw->wo, w->att, w->y, T)) || (s = add_bias(dev, &sw->bo, w->y, T))) return s;
    }
    return reduce(m, ws, w0, T, &ly->post_attn_norm);
}

/* rows [r0, r0 + rows) of weight w (one expert's matrix), times x. */
static pkv_status matmul_rows(pkv_device *dev, const pkv_weight *w, int64_t r0, int64_t rows, pkv_buffer *x, pkv_buffer *y,
                              int64_t T) {
    size_t rb = pkv_type_row_bytes(w->type, (size_t)w->ne0);
    pkv_k_matmul_args a = {.w = R(w->buf, (size_t)r0 * rb), .wtype = w->type, .rows = rows, .cols = w->ne0,
                           .x = R(x, 0), .y = R(y, 0), .n = T};
    return pkv_k_matmul(dev, &a);
}

static pkv_status moe_host_reserve(pkv_fwd_ws *ws, const pkv_hparams *hp, int64_t T) {
    if (T <= ws->h_cap_tokens) return PKV_OK;
    int64_t cap = PKV_MAX(T, ws->h_cap_tokens * 2);
    size_t t = (size_t)cap, E = (size_t)hp->n_embd, X = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    float *p = pkv_malloc(t * X * 4), *o = pkv_malloc(t * E * 4), *y = pkv_malloc(t * E * 4), *w = pkv_malloc(t * K * 4);
    int32_t *r = pkv_malloc(t * 4), *sel = pkv_malloc(t * K * 4);
    if (!p || !o || !y || !w || !r || !sel) {
        pkv_free(p), pkv_free(o), pkv_free(y), pkv_free(w), pkv_free(r), pkv_free(sel);
        return pkv_err(PKV_ERR_NOMEM, "forward: mixture-of-experts scratch for %lld tokens", (long long)cap);
    }
    pkv_free(ws->h_probs), pkv_free(ws->h_out), pkv_free(ws->h_y), pkv_free(ws->h_wsel), pkv_free(ws->h_rows),
        pkv_free(ws->h_sel);
    ws->h_probs = p, ws->h_out = o, ws->h_y = y, ws->h_wsel = w, ws->h_rows = r, ws->h_sel = sel;
    ws->h_cap_tokens = cap;
    return PKV_OK;
}

/* Bias row `row` of b ([rows][ne0], absent: nothing) added to each of the n rows of y. */
static pkv_status add_bias_row(pkv_device *dev, const pkv_weight *b, int64_t row, pkv_buffer *y, int64_t n) {
    if (!b->buf) return PKV_OK;
    pkv_k_add_args a = {.a = R(y, 0), .b = R(b->buf, (size_t)(row * b->ne0) * 4), .y = R(y, 0), .n = n * b->ne0,
                        .b_len = b->ne0};
    return pkv_k_add(dev, &a);
}

/* A mixture of experts in place of the FFN (qwen3moe, gpt-oss; llama.cpp's semantics):
 *   qwen3moe:  probs = softmax(router · xb)           per token, over n_expert
 *              sel   = the n_expert_used largest probs (ties: the lower expert first)
 *              w     = probs[sel] / sum(probs[sel])   (Qwen3-MoE normalizes the top k)
 *   gpt-oss:   logits = router · xb + b_router
 *              sel   = the n_expert_used largest logits (ties: the lower expert first)
 *              w     = softmax(logits[sel])           (llama.cpp's SOFTMAX_WEIGHT gating)
 *   x += sum over sel of w_e * down_e(act(gate_e · xb) * (up_e · xb)), act silu (SwiGLU);
 *   gpt-oss adds expert e's bias row after each of its three matmuls and its act is the
 *   clamped SwiGLU (pkv_k_swiglu_args.oai, alpha 1.702, limit 7).
 * Routing is per token, so it does not depend on the batch. Each expert runs once
 * per step on the rows routed to it (gathered with get_rows), its weights read in
 * place. Routing and the weighted sum run on the host for now (one read of the
 * probabilities and one of each active expert's output per layer: correct on every
 * backend, a round trip per expert on a GPU); each token's sum adds its experts in
 * ascending index order, so the result is the same whatever else is in the batch. */
static pkv_status moe_layer(const pkv_model *m, pkv_fwd_ws *ws, const pkv_layer *ly, dev_ws *w0, int64_t T) {
    const pkv_hparams *hp = &m->hp;
    pkv_device *dev = m->dev;
    int64_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = ly->n_ff;
    pkv_status s;
    if ((s = moe_host_reserve(ws, hp, T))) return s;
    if ((s = matmul(dev, &ly->moe_router, w0->xb, w0->router, T)) || (s = add_bias(dev, &ly->moe_router_b, w0->router, T)))
        return s;
    if (!hp->moe_weight_softmax) {
        pkv_k_softmax_args sm = {.x = R(w0->router, 0), .y = R(w0->router, 0), .n_rows = T, .row_len = X};
        if ((s = pkv_k_softmax(dev, &sm))) return s;
    }
    if ((s = pkv_buffer_read(w0->router, 0, ws->h_probs, (size_t)(T * X) * 4))) return s;
    for (int64_t t = 0; t < T; t++) { /* top k by selection (k is small), then the weights */
        const float *p = ws->h_probs + t * X; /* probabilities, or (gpt-oss) logits */
        int32_t *sel = ws->h_sel + t * K;
        double sum = 0;
        for (int64_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (int32_t e = 0; e < X; e++) {
                bool taken = false;
                for (int64_t j = 0; j < k && !taken; j++) taken = sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[k] = best;
            sum += hp->moe_weight_softmax ? exp((double)p[best] - (double)p[sel[0]]) : p[best];
        }
        for (int64_t k = 0; k < K; k++)
            ws->h_wsel[t * K + k] = (float)((hp->moe_weight_softmax ? exp((double)p[sel[k]] - (double)p[sel[0]]) : p[sel[k]]) / sum);
    }
    memset(ws->h_out, 0, (size_t)(T * E) * 4);
    for (int32_t e = 0; e < X; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++)
                if (ws->h_sel[t * K + k] == e) ws->h_rows[n++] = (int32_t)t;
        if (!n) continue;
        pkv_k_get_rows_args g = {.w = R(w0->xb, 0), .wtype = PKV_TYPE_F32, .n_vocab = T, .cols = E,
                                 .ids = R(w0->moe_ids, 0), .out = R(w0->xe, 0), .n = n};
        pkv_k_swiglu_args sg = {.g = R(w0->hb, 0), .u = R(w0->hb2, 0), .y = R(w0->hb, 0), .n = n * F,
                                .oai = hp->swiglu_oai, .alpha = 1.702f, .limit = 7.0f};
        if ((s = pkv_buffer_write(w0->moe_ids, 0, ws->h_rows, (size_t)n * 4)) || (s = pkv_k_get_rows(dev, &g)) ||
            (s = matmul_rows(dev, &ly->moe_gate, (int64_t)e * F, F, w0->xe, w0->hb, n)) ||
            (s = add_bias_row(dev, &ly->moe_gate_b, e, w0->hb, n)) ||
            (s = matmul_rows(dev, &ly->moe_up, (int64_t)e * F, F, w0->xe, w0->hb2, n)) ||
            (s = add_bias_row(dev, &ly->moe_up_b, e, w0->hb2, n)) || (s = pkv_k_swiglu(dev, &sg)) ||
            (s = matmul_rows(dev, &ly->moe_down, (int64_t)e * E, E, w0->hb, w0->y, n)) ||
            (s = add_bias_row(dev, &ly->moe_down_b, e, w0->y, n)) || (s = pkv_buffer_read(w0->y, 0, ws->h_y, (size_t)(n * E) * 4)))
            return s;
        for (int64_t i = 0; i < n; i++) {
            int64_t t = ws->h_rows[i];
            float wt = 0;
            for (int64_t k = 0; k < K; k++)
                if (ws->h_sel[t * K + k] == e) wt = ws->h_wsel[t * K + k];
            float *o = ws->h_out + t * E;
            const float *y = ws->h_y + i * E;
            for (int64_t c = 0; c < E; c++) o[c] += wt * y[c];
        }
    }
    if ((s = pkv_buffer_write(w0->y, 0, ws->h_out, (size_t)(T * E) * 4))) return s;
    return add(dev, w0->x, w0->y, T * E);
}

static pkv_status ffn_layer(const pkv_model *m, pkv_fwd_ws *ws, int il, int64_t T) {
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    dev_ws *w0 = ws_of(ws, m->dev);
    int64_t E = hp->n_embd;
    pkv_status s;
    if ((s = rmsnorm(m->dev, w0->x, &ly->ffn_norm, w0->xb, T, E, hp->rms_eps))) return s;
    if (hp->n_expert > 0) return moe_layer(m, ws, ly, w0, T);
    for (int d = 0; d < m->n_dev; d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        dev_ws *w = ws_of(ws, dev);
        if ((s = move(w0->xb, w->xb, (size_t)T * (size_t)E * 4))) return s;
        if ((s = matmul(dev, &sw->w_gate, w->xb, w->hb, T)) || (s = matmul(dev, &sw->w_up, w->xb, w->hb2, T))) return s;
        pkv_k_swiglu_args sg = {.g = R(w->hb, 0), .u = R(w->hb2, 0), .y = R(w->hb, 0), .n = T * sw->n_ff, .gelu = hp->gelu};
        if ((s = pkv_k_swiglu(dev, &sg))) return s;
        if ((s = matmul(dev, &sw->w_down, w->hb, w->y, T))) return s;
    }
    return reduce(m, ws, w0, T, &ly->post_ffn_norm);
}

/* Build the host-side integer block (ids, positions, rows, output rows, attention
 * meta of the main pool and of the window pool) for the step; the cache append
 * already happened. rows NULL: a replay (pl->replay; the tokens are in the main
 * pool already, at len_before[i] onwards). rows_w NULL: no window pool. */
static pkv_status plan(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, const pkv_fwd_batch *b, const int32_t *rows,
                       const int32_t *rows_w, const int64_t *len_before, pkv_fwd_plan *pl) {
    pkv_kv_block_table bt, bw;
    pkv_status s = pkv_kv_block_table_get(c, b->n_seqs, b->seqs, true, &bt);
    if (!s && rows_w) s = pkv_kv_block_table_window(c, b->n_seqs, b->seqs, &bw);
    if (s) return s;
    int64_t T = 0;
    for (int i = 0; i < b->n_seqs; i++) T += b->n_tokens[i];
    int64_t n_out = b->all_logits ? T : b->n_seqs;
    pl->n_seqs = b->n_seqs;
    pl->meta_pages = bt.indptr[b->n_seqs];
    pl->window = rows_w != NULL;
    pl->replay = rows == NULL;
    pl->meta_pages_w = rows_w ? bw.indptr[b->n_seqs] : 0;
    pl->off_ids = 0;
    pl->off_pos = (size_t)T;
    pl->off_rows = 2 * (size_t)T;
    pl->off_rows_w = 3 * (size_t)T;
    pl->off_out = 4 * (size_t)T;
    pl->off_meta = pl->off_out + (size_t)n_out;
    pl->off_meta_w = pl->off_meta + 2 * (size_t)T + (size_t)b->n_seqs + 1 + (size_t)pl->meta_pages;
    size_t n_ints = pl->off_meta_w + (rows_w ? 2 * (size_t)T + (size_t)b->n_seqs + 1 + (size_t)pl->meta_pages_w : 0);
    if ((s = ws_reserve(m, c, wsp, T, n_out, n_ints))) return s;
    int32_t *I = (*wsp)->host_ints;
    int32_t *q_seq = I + pl->off_meta, *q_len = q_seq + T, *indptr = q_len + T, *pages = indptr + b->n_seqs + 1;
    int64_t k = 0, o = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        int32_t nt = b->n_tokens[i];
        const int32_t *positions = bt.positions + bt.tok_indptr[i] + len_before[i];
        for (int32_t j = 0; j < nt; j++, k++) {
            I[pl->off_ids + k] = b->tokens[k];
            I[pl->off_pos + k] = positions[j];
            I[pl->off_rows + k] = rows ? rows[k] : -1;
            I[pl->off_rows_w + k] = rows_w ? rows_w[k] : -1;
            q_seq[k] = i;
            q_len[k] = (int32_t)(len_before[i] + j + 1);
            if (b->all_logits) I[pl->off_out + o++] = (int32_t)k;
        }
        if (!b->all_logits) I[pl->off_out + o++] = (int32_t)(k - 1);
    }
    memcpy(indptr, bt.indptr, ((size_t)b->n_seqs + 1) * sizeof *indptr);
    memcpy(pages, bt.pages, (size_t)pl->meta_pages * sizeof *pages);
    if (rows_w) { /* the same queries over the window pool's table */
        int32_t *mw = I + pl->off_meta_w;
        memcpy(mw, q_seq, 2 * (size_t)T * sizeof *mw);
        memcpy(mw + 2 * T, bw.indptr, ((size_t)b->n_seqs + 1) * sizeof *mw);
        memcpy(mw + 2 * T + b->n_seqs + 1, bw.pages, (size_t)pl->meta_pages_w * sizeof *mw);
    }
    pl->T = T;
    pl->n_out = n_out;
    for (int i = 0; i < (*wsp)->n; i++) /* every device that runs a kernel of the step */
        if ((s = pkv_buffer_write((*wsp)->d[i].ints, 0, I, n_ints * 4))) return s;
    return PKV_OK;
}

/* Does the cache keep some layers in a window pool? Then the last such layer. */
static int last_window_layer(const pkv_kv_cache *c) {
    const pkv_kv_layout *lay = pkv_kv_cache_layout(c);
    int last = -1;
    for (int l = 0; l < pkv_kv_layout_n_layers(lay); l++) {
        pkv_kv_layer_info li;
        if (!pkv_kv_layout_layer(lay, l, &li) && li.window > 0) last = l;
    }
    return last;
}

/* Tokens per forward step on a cache with a window pool, so one step never needs
 * more window pages than pkv_cache_params.n_window_pages provides for. */
#define FWD_WINDOW_STEP 256

/* One step. Normally b's tokens are appended and run through every layer, and
 * logits (or, with no_output, nothing) come out. replay: b holds one sequence's
 * tokens that are in the main pool already, from its window length on; only the
 * layers up to the last window layer run, writing the window layers' KV. */
static pkv_status step(pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, const pkv_fwd_batch *b, float *logits, int last_w,
                       bool replay, bool no_output) {
    int64_t T = 0;
    for (int i = 0; i < b->n_seqs; i++) T += b->n_tokens[i];
    int64_t stack_len[16];
    int64_t *len_before = b->n_seqs <= 16 ? stack_len : pkv_malloc((size_t)b->n_seqs * sizeof *len_before);
    int32_t *rows = pkv_malloc((size_t)T * 2 * sizeof *rows), *rows_w = last_w >= 0 ? rows + T : NULL;
    pkv_status s = PKV_OK;
    if (!len_before || !rows) {
        s = pkv_err(PKV_ERR_NOMEM, "forward: %lld tokens", (long long)T);
        goto out;
    }
    for (int i = 0; i < b->n_seqs; i++)
        len_before[i] = replay ? pkv_kv_seq_window_len(c, b->seqs[i]) : pkv_kv_seq_len(c, b->seqs[i]);
    /* A shared-KV draft writes only its mapped layers of a page: such pages must
     * never be offered for prefix reuse, so they are appended without token ids. */
    bool publish = !b->no_publish && !m->kv_layer;
    if (replay)
        s = pkv_kv_window_replay(c, b->seqs[0], b->n_tokens[0], rows_w);
    else
        s = pkv_kv_append_batch_w(c, b->n_seqs, b->seqs, b->n_tokens, publish ? b->tokens : NULL, b->pos, rows, rows_w);
    if (s) goto out;
    pkv_fwd_plan pl;
    memset(&pl, 0, sizeof pl);
    s = plan(m, c, wsp, b, replay ? NULL : rows, rows_w, len_before, &pl);
    pkv_fwd_ws *ws = *wsp;
    pkv_device *dev = m->dev;
    dev_ws *w0 = s ? NULL : ws_of(ws, dev);
    if (!s) {
        pkv_k_get_rows_args ge = {.w = R(m->tok_embd.buf, 0), .wtype = m->tok_embd.type, .n_vocab = m->hp.n_vocab,
                                  .cols = m->hp.n_embd, .ids = R(w0->ints, pl.off_ids * 4), .out = R(w0->x, 0), .n = T,
                                  .scale = m->hp.embd_scale};
        s = pkv_k_get_rows(dev, &ge);
    }
    const int n_layer = replay ? last_w + 1 : m->hp.n_layer;
    for (int il = 0; !s && il < n_layer; il++) {
        s = attention_layer(m, c, ws, il, T, &pl);
        if (!s && il + 1 < n_layer + (replay ? 0 : 1)) s = ffn_layer(m, ws, il, T);
    }
    if (replay || no_output) {
        if (!s) s = pkv_device_sync(dev);
        goto done;
    }
    if (!s) { /* gather the rows that need logits, final norm, output projection */
        pkv_k_get_rows_args g = {.w = R(w0->x, 0), .wtype = PKV_TYPE_F32, .n_vocab = T, .cols = m->hp.n_embd,
                                 .ids = R(w0->ints, pl.off_out * 4), .out = R(w0->xb, 0), .n = pl.n_out};
        s = pkv_k_get_rows(dev, &g);
    }
    if (!s) s = rmsnorm(dev, w0->xb, &m->output_norm, w0->xb, pl.n_out, m->hp.n_embd, m->hp.rms_eps);
    if (!s) s = matmul(dev, &m->output, w0->xb, w0->logits, pl.n_out);
    if (!s && logits) s = pkv_buffer_read(w0->logits, 0, logits, (size_t)pl.n_out * (size_t)m->hp.n_vocab * 4);
    if (!s && logits && m->hp.final_softcap > 0) { /* Gemma 2: cap * tanh(logit / cap), on the host copy */
        const float cap = m->hp.final_softcap;
        for (size_t i = 0; i < (size_t)pl.n_out * (size_t)m->hp.n_vocab; i++) logits[i] = cap * tanhf(logits[i] / cap);
    }
    else if (!s) s = pkv_device_sync(dev);
done:
    if (s) { /* roll the cache back: the step never happened */
        pkv_status keep = s;
        char msg[1024];
        strncpy(msg, pkv_errmsg(), sizeof msg - 1);
        msg[sizeof msg - 1] = 0;
        if (replay)
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

/* Recompute the window layers of sequence seq up to its length (after a truncate
 * or shift back into released window pages), FWD_WINDOW_STEP tokens at a time. */
static pkv_status window_catch_up(pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, int32_t seq, int last_w) {
    int64_t len = pkv_kv_seq_len(c, seq), wl = pkv_kv_seq_window_len(c, seq);
    if (wl >= len) return PKV_OK;
    int32_t *tok = pkv_malloc((size_t)FWD_WINDOW_STEP * sizeof *tok);
    if (!tok) return pkv_err(PKV_ERR_NOMEM, "forward: out of memory");
    pkv_status s = PKV_OK;
    while (!s && wl < len) {
        int32_t n = (int32_t)PKV_MIN(len - wl, FWD_WINDOW_STEP);
        s = pkv_kv_seq_tokens(c, seq, wl, n, tok, NULL);
        for (int32_t j = 0; !s && j < n; j++)
            if (tok[j] < 0)
                s = pkv_err(PKV_ERR_INVALID, "sequence %d: the sliding-window layers must be recomputed from token %lld, "
                            "but its token ids were not recorded (appended without tokens)", seq, (long long)(wl + j));
        pkv_fwd_batch rb = {.n_seqs = 1, .seqs = &seq, .n_tokens = &n, .tokens = tok};
        if (!s) s = step(m, c, wsp, &rb, NULL, last_w, true, true);
        wl += n;
    }
    pkv_free(tok);
    return s ? pkv_err_prefix(s, "recomputing the sliding-window layers of sequence %d", seq) : PKV_OK;
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
    const int last_w = last_window_layer(c);
    if (last_w < 0) return step(m, c, wsp, b, logits, -1, false, false);
    /* A window pool: catch its sequences up, then at most FWD_WINDOW_STEP tokens
     * per step (the kernels are batch-invariant, so the result does not depend on
     * the split). */
    pkv_status s = PKV_OK;
    for (int i = 0; i < b->n_seqs && !s; i++) s = window_catch_up(m, c, wsp, b->seqs[i], last_w);
    if (s || T <= FWD_WINDOW_STEP) return s ? s : step(m, c, wsp, b, logits, last_w, false, false);
    int64_t stack_len[16];
    int64_t *len0 = b->n_seqs <= 16 ? stack_len : pkv_malloc((size_t)b->n_seqs * sizeof *len0);
    if (!len0) return pkv_err(PKV_ERR_NOMEM, "forward: out of memory");
    for (int i = 0; i < b->n_seqs; i++) len0[i] = pkv_kv_seq_len(c, b->seqs[i]);
    const size_t V = (size_t)m->hp.n_vocab;
    int64_t k0 = 0;
    for (int i = 0; i < b->n_seqs && !s; k0 += b->n_tokens[i], i++)
        for (int32_t off = 0; off < b->n_tokens[i] && !s; off += FWD_WINDOW_STEP) {
            int32_t n = PKV_MIN(b->n_tokens[i] - off, FWD_WINDOW_STEP);
            bool last = off + n == b->n_tokens[i];
            pkv_fwd_batch sb = {.n_seqs = 1, .seqs = &b->seqs[i], .n_tokens = &n, .tokens = b->tokens + k0 + off,
                                .pos = b->pos ? b->pos + k0 + off : NULL, .all_logits = b->all_logits,
                                .no_publish = b->no_publish};
            float *out = !logits ? NULL : b->all_logits ? logits + (size_t)(k0 + off) * V : last ? logits + (size_t)i * V : NULL;
            s = step(m, c, wsp, &sb, out, last_w, false, !b->all_logits && !last);
        }
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        for (int i = 0; i < b->n_seqs; i++) pkv_kv_truncate(c, b->seqs[i], len0[i]);
        s = pkv_err(s, "%s", msg);
    }
    if (len0 != stack_len) pkv_free(len0);
    return s;
}
