/* The building blocks of a forward step: the workspace, the kernels' thin wrappers,
 * and the attention, FFN and mixture-of-experts blocks that src/model/arch/ composes
 * (blocks.h says what each computes).
 *
 * Tensor parallelism (several devices): each device computes the heads and FFN rows
 * of its shard from the normed input broadcast to it, and the partial outputs are
 * summed into the residual stream on the first device. Each shard's K/V live where
 * the cache put them; when that is another device than the shard's (the cache on
 * the host), q, k and v go there, attention runs there, and its output comes back:
 * attention always runs where its KV is stored. A gated delta-net layer splits
 * the same way by key-head groups; each shard's recurrent state stays on its
 * device (the cache keeps it there, also with the KV on the host). */
#include <math.h>
#include <string.h>

#include "base/quant.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/lora.h"

void pkv_fwd_ws_free(pkv_fwd_ws *ws) {
    if (!ws) return;
    for (int i = 0; i < ws->n; i++) {
        pkv_dev_ws *d = &ws->d[i];
        pkv_buffer *bufs[] = {d->x,      d->xb,   d->y,      d->q,      d->k,      d->v,      d->att,
                              d->hb,     d->hb2,  d->logits, d->ints,   d->router, d->xe,     d->moe_ids, d->moe_sel, d->moe_wt, d->moe_acc,
                              d->gate,   d->ssm_u, d->ssm_z, d->ssm_bg, d->ssm_o, d->ple, d->ple_tok, d->ple_g, d->ffn_acc,
                              d->emb,    d->hid,  d->qpart, d->apart, d->mla_a, d->mla_b, d->mla_c};
        for (size_t k = 0; k < PKV_ARRAY_LEN(bufs); k++) pkv_buffer_free(bufs[k]);
    }
    pkv_free(ws->host_ints);
    pkv_free(ws->h_ple);
    pkv_free(ws->h_probs);
    pkv_free(ws->h_out);
    pkv_free(ws->h_y);
    pkv_free(ws->h_wsel);
    pkv_free(ws->h_x);
    pkv_free(ws->h_rows);
    pkv_free(ws->h_sel);
    pkv_free(ws->regions);
    pkv_buffer_free(ws->lora_s);
    pkv_buffer_free(ws->lora_t);
    pkv_buffer_free(ws->lora_d);
    pkv_free(ws);
}

/* The largest per-token widths over all layers (I4: layers may differ). */
static void widths(const pkv_model *m, int64_t *qd, int64_t *kd, int64_t *vd, int64_t *od, int64_t *ff) {
    *qd = *kd = *vd = *od = *ff = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const pkv_layer *ly = &m->layers[l];
        *qd = PKV_MAX(*qd, (int64_t)ly->n_head * ly->head_dim_k);
        *kd = PKV_MAX(*kd, (int64_t)ly->n_head_kv * ly->head_dim_k);
        *vd = PKV_MAX(*vd, (int64_t)ly->n_head_kv * ly->head_dim_v);
        if (ly->latent > 0) *vd = PKV_MAX(*vd, (int64_t)ly->n_rot); /* MLA: the rotary key part in v (mla_kv) */
        *od = PKV_MAX(*od, (int64_t)ly->n_head * ly->head_dim_v);
        *ff = PKV_MAX(*ff, (int64_t)ly->n_ff);
    }
    *ff = PKV_MAX(*ff, (int64_t)m->hp.moe.n_ff); /* gemma4: experts beside a dense FFN of another size */
    for (int l = 0; l < m->hp.n_layer; l++) *ff = PKV_MAX(*ff, m->layers[l].moe.sh_gate.ne1); /* shared experts */
}

static pkv_status realloc_buf(pkv_device *dev, pkv_buffer **b, size_t bytes) {
    pkv_buffer *nb = pkv_buffer_alloc(dev, bytes ? bytes : 4);
    if (!nb) return pkv_err_prefix(PKV_ERR_NOMEM, "forward workspace");
    pkv_buffer_free(*b);
    *b = nb;
    return PKV_OK;
}

/* The workspace of dev (created empty on first use). */
pkv_dev_ws *pkv_fwd_dev(pkv_fwd_ws *ws, pkv_device *dev) {
    for (int i = 0; i < ws->n; i++)
        if (ws->d[i].dev == dev) return &ws->d[i];
    if (ws->n == PKV_MAX_DEVICES + 1) return NULL;
    memset(&ws->d[ws->n], 0, sizeof ws->d[0]);
    ws->d[ws->n].dev = dev;
    return &ws->d[ws->n++];
}

/* Make sure dev's workspace holds T tokens, n_out logits rows (main device only)
 * and n_ints ints; the delta-net layers' buffers on the model's devices (model_dev). */
static pkv_status dev_reserve(const pkv_model *m, pkv_dev_ws *w, bool main_dev, bool model_dev, int64_t T, int64_t n_out,
                              size_t n_ints) {
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
        if (model_dev && m->hp.recurrent) { /* (each device's shard is at most the whole layer) */
            const pkv_hparams *hp = &m->hp;
            int64_t C = 2 * (int64_t)hp->ssm.n_k_heads * hp->ssm.d_k + (int64_t)hp->ssm.n_v_heads * hp->ssm.d_v,
                    Z = (int64_t)hp->ssm.n_v_heads * hp->ssm.d_v;
            if (hp->shortconv.l_cache) /* pkv_blk_short_conv: B in ssm_u, C in ssm_z, x in ssm_o ([T][E] at most) */
                C = PKV_MAX(C, (int64_t)hp->n_embd), Z = PKV_MAX(Z, (int64_t)hp->n_embd);
            if ((s = realloc_buf(dev, &w->ssm_u, t4 * (size_t)C)) || (s = realloc_buf(dev, &w->ssm_z, t4 * (size_t)Z)) ||
                (s = realloc_buf(dev, &w->ssm_bg, t4 * 2 * (size_t)hp->ssm.n_v_heads)) ||
                (s = realloc_buf(dev, &w->ssm_o, t4 * (size_t)Z)))
                return s;
        }
        bool gated = false; /* an attention output gate somewhere (qwen35): its buffer */
        for (int l = 0; l < m->hp.n_layer && !gated; l++) gated = m->layers[l].sh && m->layers[l].sh[0].wq_gate.buf;
        if (gated && (s = realloc_buf(dev, &w->gate, t4 * (size_t)od))) return s;
        if (main_dev && m->hp.n_embd_per_layer > 0) { /* per-layer inputs [n_layer][T][P], staged tokens' rows, a gate */
            const size_t P = (size_t)m->hp.n_embd_per_layer, nl = (size_t)m->hp.n_layer;
            if ((s = realloc_buf(dev, &w->ple, t4 * P * nl)) || (s = realloc_buf(dev, &w->ple_tok, t4 * P * nl)) ||
                (s = realloc_buf(dev, &w->ple_g, t4 * P)))
                return s;
        }
        if (main_dev && m->hp.moe_dense && (s = realloc_buf(dev, &w->ffn_acc, t4 * 2 * (size_t)E))) return s;
        if (m->hp.mla.kv_lora > 0) { /* pkv_blk_mla's buffers: the widest head set's dims, or q_lora */
            const pkv_hparams *hp = &m->hp;
            int64_t M = PKV_MAX(hp->mla.q_lora, hp->n_rot);
            for (int l = 0; l < hp->n_layer; l++)
                M = PKV_MAX(M, (int64_t)m->layers[l].n_head *
                                   PKV_MAX(PKV_MAX(hp->mla.dk, hp->mla.kv_lora), PKV_MAX(hp->mla.dv, hp->n_rot)));
            if ((s = realloc_buf(dev, &w->mla_a, t4 * (size_t)M)) || (s = realloc_buf(dev, &w->mla_b, t4 * (size_t)M)) ||
                (s = realloc_buf(dev, &w->mla_c, t4 * (size_t)M)))
                return s;
        }
        if (m->kv_draft &&
            ((s = realloc_buf(dev, &w->qpart, t4 * (size_t)qd)) || (s = realloc_buf(dev, &w->apart, t4 * (size_t)od))))
            return s;
        if (m->hp.n_embd_out > 0 && ((s = realloc_buf(dev, &w->emb, t4 * (size_t)m->hp.n_embd_out)) ||
                                     (s = realloc_buf(dev, &w->hid, t4 * (size_t)m->hp.n_embd_out))))
            return s;
        if (main_dev && m->hp.moe.n_expert > 0 &&
            ((s = realloc_buf(dev, &w->router, t4 * (size_t)m->hp.moe.n_expert)) ||
             (s = realloc_buf(dev, &w->moe_sel, t4 * 2 * (size_t)m->hp.moe.n_used)) ||
             (s = realloc_buf(dev, &w->moe_wt, t4)) || (s = realloc_buf(dev, &w->moe_acc, t4 * (size_t)E))))
            return s;
        if (m->hp.moe.n_expert > 0 && /* every device holds experts on a split */
            ((s = realloc_buf(dev, &w->xe, t4 * (size_t)E)) || (s = realloc_buf(dev, &w->moe_ids, t4))))
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
pkv_status pkv_fwd_reserve(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, int64_t T, int64_t n_out, size_t n_ints) {
    pkv_fwd_ws *ws = *wsp;
    if (!ws) {
        ws = pkv_calloc(1, sizeof *ws);
        if (!ws) return pkv_err(PKV_ERR_NOMEM, "forward workspace");
        *wsp = ws;
    }
    pkv_status s;
    for (int d = 0; d < m->n_dev; d++) {
        pkv_dev_ws *w = pkv_fwd_dev(ws, m->devs[d]);
        if (!w) return pkv_err(PKV_ERR_INTERNAL, "forward: too many devices");
        if ((s = dev_reserve(m, w, d == 0, true, T, n_out, n_ints))) return s;
    }
    /* where the attention layers' KV is stored: the first attention layer says it
     * (every one is stored alike; recurrent layers keep their state on the device).
     * A model reading another's cache may have other shards than devices. */
    int l0 = 0;
    while (l0 + 1 < m->hp.n_layer && m->layers[l0].recurrent) l0++;
    pkv_kv_shard_info sh;
    pkv_kv_layer_info li;
    const int kl0 = m->kv_layer ? m->kv_layer[l0] : l0;
    const int n_sh = pkv_kv_layout_layer(pkv_kv_cache_layout(c), kl0, &li) == PKV_OK ? li.n_shards : 0;
    for (int d = 0; d < n_sh && pkv_kv_shard(c, kl0, d, &sh) == PKV_OK; d++) {
        pkv_dev_ws *w = pkv_fwd_dev(ws, sh.storage);
        if (!w) return pkv_err(PKV_ERR_INTERNAL, "forward: too many devices");
        bool model_dev = false;
        for (int k = 0; k < m->n_dev; k++) model_dev |= m->devs[k] == w->dev;
        if ((s = dev_reserve(m, w, w->dev == m->dev, model_dev, T, n_out, n_ints))) return s;
    }
    if (m->embd_of) { /* an assistant: the embedding rows come from its target's device */
        pkv_dev_ws *w = pkv_fwd_dev(ws, m->embd_of->dev);
        if (!w) return pkv_err(PKV_ERR_INTERNAL, "forward: too many devices");
        bool model_dev = false;
        for (int k = 0; k < m->n_dev; k++) model_dev |= m->devs[k] == w->dev;
        if ((s = dev_reserve(m, w, w->dev == m->dev, model_dev, T, n_out, n_ints))) return s;
    }
    if (n_ints > ws->host_cap) {
        void *p = ws->host_ints;
        if ((s = pkv_grow(&p, &ws->host_cap, n_ints, sizeof(int32_t)))) return s;
        ws->host_ints = p;
    }
    return PKV_OK;
}

static pkv_tref R(pkv_buffer *b, size_t off) { return pkv_tref_make(b, off); }

pkv_status pkv_blk_matmul(const pkv_fwd *f, pkv_device *dev, const pkv_weight *w, pkv_buffer *x, pkv_buffer *y, int64_t T) {
    pkv_k_matmul_args a = {.w = R(w->buf, 0), .wtype = w->type, .rows = w->ne1, .cols = w->ne0,
                           .x = R(x, 0), .y = R(y, 0), .n = T};
    pkv_status s = pkv_k_matmul(dev, &a);
    return s || !f->lora ? s : pkv_lora_delta(f, dev, w, x, R(y, 0), T);
}

/* y (a region of a buffer) = x·wᵀ for T rows. */
static pkv_status matmul_at(pkv_device *dev, const pkv_weight *w, pkv_buffer *x, pkv_tref y, int64_t T) {
    pkv_k_matmul_args a = {.w = R(w->buf, 0), .wtype = w->type, .rows = w->ne1, .cols = w->ne0, .x = R(x, 0), .y = y, .n = T};
    return pkv_k_matmul(dev, &a);
}

static pkv_status add_bias(pkv_device *dev, const pkv_weight *b, pkv_buffer *y, int64_t T) {
    if (!b->buf) return PKV_OK;
    pkv_k_add_args a = {.a = R(y, 0), .b = R(b->buf, 0), .y = R(y, 0), .n = T * b->ne0, .b_len = b->ne0};
    return pkv_k_add(dev, &a);
}

pkv_status pkv_blk_rmsnorm(pkv_device *dev, pkv_buffer *x, const pkv_weight *w, pkv_buffer *y, int64_t rows, int64_t len,
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
static pkv_status rope_dim(pkv_device *dev, const pkv_hparams *hp, const pkv_layer *ly, pkv_buffer *x, int64_t r0,
                           int64_t T, int n_heads, int head_dim, pkv_tref pos, pkv_tref ff, float temp) {
    if (ly->nope) return PKV_OK; /* smollm3's every fourth layer: positions come from the others */
    const size_t stride = (size_t)n_heads * (size_t)head_dim * 4;
    pkv_k_rope_args a = {.x = R(x, (size_t)r0 * stride), .dtype = PKV_TYPE_F32, .n_rows = T, .max_rows = T,
                         .row_stride = stride, .n_heads = n_heads,
                         .head_dim = head_dim, .n_rot = ly->n_rot, .neox = hp->rope_neox,
                         .freq_base = ly->rope_base, .freq_scale = ly->rope_freq_scale,
                         .pos = R(pos.buf, pos.off + (size_t)r0 * 4), .mscale = hp->yarn.attn_factor * temp, .ff = ff};
    if (hp->yarn.ext_factor != 0) {
        float dims[2];
        pkv_rope_yarn_corr_dims(ly->n_rot, hp->yarn.n_ctx_orig, ly->rope_base, hp->yarn.beta_fast, hp->yarn.beta_slow, dims);
        a.ext_factor = hp->yarn.ext_factor;
        a.corr_lo = dims[0];
        a.corr_hi = dims[1];
        if (ly->rope_freq_scale < 1.0f) a.mscale *= 1.0f + 0.1f * logf(1.0f / ly->rope_freq_scale);
    }
    pkv_rope_partial(&a, ly->rope_pairs); /* gemma4's full layers (never with YaRN: hparams refuses it) */
    return pkv_k_rope(dev, &a);
}

/* rope_dim over heads of the layer's key size */
static pkv_status rope(pkv_device *dev, const pkv_hparams *hp, const pkv_layer *ly, pkv_buffer *x, int64_t r0, int64_t T,
                       int n_heads, pkv_tref pos, pkv_tref ff, float temp) {
    return rope_dim(dev, hp, ly, x, r0, T, n_heads, ly->head_dim_k, pos, ff, temp);
}

/* Llama 4-style temperature tuning of a query at pos (hp.attn_temp), as llama.cpp
 * computes it: 1 + scale * ln(floor((pos + offset) / floor_len) + 1), the quotient in
 * f32, the result rounded to f32. */
static float attn_temp(const pkv_hparams *hp, int32_t pos) {
    const float q = ((float)pos + hp->attn_temp.offset) / (float)hp->attn_temp.floor_len;
    return (float)(log((double)floorf(q) + 1.0) * (double)hp->attn_temp.scale + 1.0);
}

/* rows [r0, r0 + n) of q (n_heads heads each) times t, for a NoPE layer's
 * temperature (no RoPE to scale them with): t goes through the device as the
 * one-element multiplier of a unary kernel, in w->att (free until the attention). */
static pkv_status scale_rows(pkv_device *dev, pkv_dev_ws *w, pkv_buffer *q, int64_t r0, int64_t n, int64_t row, float t) {
    if (t == 1.0f) return PKV_OK;
    pkv_status s = pkv_buffer_write(w->att, 0, &t, sizeof t);
    pkv_k_unary_args a = {.x = R(q, (size_t)(r0 * row * 4)), .y = R(q, (size_t)(r0 * row * 4)), .n = n * row,
                          .op = PKV_UNARY_ID, .mul = R(w->att, 0), .mul_len = 1};
    return s ? s : pkv_k_unary(dev, &a);
}

/* RoPE of the step's queries; with temperature tuning each run of rows whose factor
 * is the same turns with cos and sin times it, which scales the whole query where
 * every dim rotates (hparams requires that of such files). */
static pkv_status rope_q(const pkv_fwd *f, pkv_device *dev, pkv_dev_ws *w, const pkv_layer *ly, int n_heads, pkv_tref pos,
                         pkv_tref ff, bool temp) {
    const pkv_hparams *hp = &f->m->hp;
    pkv_buffer *q = w->q;
    if (!temp || hp->attn_temp.scale == 0) return rope(dev, hp, ly, q, 0, f->T, n_heads, pos, ff, 1.0f);
    const int32_t *hpos = f->ws->host_ints + f->pl->off_pos;
    for (int64_t r0 = 0, r1; r0 < f->T; r0 = r1) {
        const float t = attn_temp(hp, hpos[r0]);
        for (r1 = r0 + 1; r1 < f->T && attn_temp(hp, hpos[r1]) == t;) r1++;
        pkv_status s = ly->nope ? scale_rows(dev, w, q, r0, r1 - r0, (int64_t)n_heads * ly->head_dim_k, t)
                                : rope(dev, hp, ly, q, r0, r1 - r0, n_heads, pos, ff, t);
        if (s) return s;
    }
    return PKV_OK;
}

/* LongRoPE: the factors Q and K turn with on device d, the set (short or long) the
 * cache's K is rotated with (pkv_kv_params.rope_factors); buf NULL without LongRoPE. */
static pkv_status rope_factors(const pkv_fwd *f, int d, pkv_tref *out) {
    const pkv_model *m = f->m;
    const int n = m->longrope.n;
    *out = R(NULL, 0);
    if (!n) return PKV_OK;
    int nc = 0;
    const float *cf = pkv_kv_layout_rope_factors(pkv_kv_cache_layout(f->c), &nc);
    for (int set = 0; cf && nc == n && set < 2; set++)
        if (!memcmp(cf, m->longrope.host + (size_t)set * n, (size_t)n * sizeof *cf)) {
            *out = R(m->longrope.dev[d].buf, (size_t)set * n * sizeof *cf);
            return PKV_OK;
        }
    return pkv_err(PKV_ERR_INVALID, "forward: %s has LongRoPE factors (rope_factors_short/long) and the cache's K is "
                   "rotated with %s: make the cache with pkv_model_cache_create", m->label,
                   cf ? "other factors" : "none");
}

/* Copy n bytes between workspaces; nothing to do on the same buffer. */
static pkv_status move(pkv_buffer *src, pkv_buffer *dst, size_t n) {
    return src == dst ? PKV_OK : pkv_buffer_copy(src, 0, dst, 0, n);
}

/* x += part on the model's main device, part first times m->res_scale where the
 * model has one (Granite's residual multiplier; part is scratch). */
static pkv_status residual_add(const pkv_model *m, pkv_buffer *x, pkv_buffer *part, int64_t n) {
    pkv_k_unary_args a = {.x = R(part, 0), .y = R(part, 0), .n = n, .op = PKV_UNARY_ID, .mul = R(m->res_scale.buf, 0),
                          .mul_len = 1};
    pkv_status s = m->res_scale.buf ? pkv_k_unary(m->dev, &a) : PKV_OK;
    return s ? s : add(m->dev, x, part, n);
}

/* Fold each shard's partial output y into the residual stream x on the main
 * device (summing in device order). post_norm (Gemma): the whole output is RMS
 * normed first, so the partials are summed into w0->y, normed, then added. */
static pkv_status reduce_to(const pkv_model *m, pkv_fwd_ws *ws, pkv_dev_ws *w0, int64_t T, const pkv_weight *post_norm,
                            pkv_tref out) {
    size_t bytes = (size_t)T * (size_t)m->hp.n_embd * 4;
    if ((post_norm && post_norm->buf) || out.buf) {
        pkv_status s;
        for (int d = 1; d < m->n_dev; d++) { /* w0 is device 0's: sum the others into its y */
            pkv_dev_ws *w = pkv_fwd_dev(ws, m->devs[d]);
            if ((s = pkv_buffer_copy(w->y, 0, w0->xb, 0, bytes)) || (s = add(m->dev, w0->y, w0->xb, T * m->hp.n_embd)))
                return s;
        }
        if (post_norm && post_norm->buf &&
            (s = pkv_blk_rmsnorm(m->dev, w0->y, post_norm, w0->y, T, m->hp.n_embd, m->hp.rms_eps)))
            return s;
        return out.buf ? pkv_buffer_copy(w0->y, 0, out.buf, out.off, bytes) : residual_add(m, w0->x, w0->y, T * m->hp.n_embd);
    }
    for (int d = 0; d < m->n_dev; d++) {
        pkv_dev_ws *w = pkv_fwd_dev(ws, m->devs[d]);
        pkv_buffer *part = w->y;
        if (w != w0) { /* bring the partial to the main device (its xb is free now) */
            pkv_status s = pkv_buffer_copy(w->y, 0, w0->xb, 0, bytes);
            if (s) return s;
            part = w0->xb;
        }
        pkv_status s = residual_add(m, w0->x, part, T * m->hp.n_embd);
        if (s) return s;
    }
    return PKV_OK;
}

/* reduce into the residual stream. */
static pkv_status reduce(const pkv_model *m, pkv_fwd_ws *ws, pkv_dev_ws *w0, int64_t T, const pkv_weight *post_norm) {
    return reduce_to(m, ws, w0, T, post_norm, R(NULL, 0));
}

/* The window the attention kernel gets: the layer's, and for queries that append
 * nothing (pl->peek) one less: the kernel counts the query's own position among
 * the last `window`, and a query at the position after the cached tokens sees those
 * with pos > its pos - window (llama.cpp's sliding mask), window - 1 of them. */
static int window_of(const pkv_fwd_plan *pl, const pkv_layer *ly) {
    return pl->peek && ly->window > 1 ? ly->window - 1 : ly->window;
}

/* Where the window is counted back from (device.h's q_win): for a step with
 * non-causal spans on a sliding-window layer, each row's own causal length, so a
 * media chunk's row at position p sees [p + 1 - window, chunk end) as in
 * llama.cpp, not the chunk's last `window` tokens; else none. */
static pkv_tref q_win_of(const pkv_fwd_plan *pl, const pkv_layer *ly, const pkv_dev_ws *w) {
    return pl->off_qwin && (ly->window > 0 || ly->chunk > 0) ? R(w->ints, pl->off_qwin * 4) : R(NULL, 0);
}

/* A one-device reader's attention over every shard of cache layer kl (no K/V of its
 * own, no sinks): per shard, its query heads of the shard's KV heads (whole groups)
 * are gathered token by token into the storing device's qpart, attended there into
 * apart, and scattered back into w->att. */
static pkv_status attend_shards(pkv_fwd *f, const pkv_layer *ly, int kl, const pkv_kv_layer_info *li, pkv_dev_ws *w) {
    const pkv_fwd_plan *pl = f->pl;
    const int64_t T = f->T;
    const int hk = ly->head_dim_k, hv = ly->head_dim_v, g = ly->n_head / ly->n_head_kv;
    const int page_size = pkv_kv_layout_page_size(pkv_kv_cache_layout(f->c));
    const bool wpool = li->window > 0;
    const size_t off_meta = wpool ? pl->off_meta_w : pl->off_meta;
    const int meta_pages = wpool ? pl->meta_pages_w : pl->meta_pages;
    const size_t qrow = (size_t)ly->n_head * hk * 4, orow = (size_t)ly->n_head * hv * 4;
    pkv_status s;
    int covered = 0; /* heads [0, covered) attended: replicas of a KV head are read once */
    for (int k = 0; k < li->n_shards; k++) {
        pkv_kv_shard_info sh;
        if ((s = pkv_kv_shard(f->c, kl, k, &sh))) return s;
        if (sh.head_begin < covered) continue;
        covered = sh.head_begin + sh.n_heads;
        pkv_dev_ws *kw = pkv_fwd_dev(f->ws, sh.storage);
        if (!kw || !kw->qpart) return pkv_err(PKV_ERR_INTERNAL, "forward: no workspace for %s", pkv_device_name(sh.storage));
        const int nq = sh.n_heads * g;
        const size_t qb = (size_t)nq * hk * 4, ob = (size_t)nq * hv * 4;
        for (int64_t t = 0; t < T; t++)
            if ((s = pkv_buffer_copy(w->q, (size_t)t * qrow + (size_t)sh.head_begin * g * hk * 4, kw->qpart, (size_t)t * qb, qb)))
                return s;
        pkv_k_attention_args at = {.q = R(kw->qpart, 0), .k = R(sh.k, sh.k_off), .v = R(sh.v, sh.v_off), .out = R(kw->apart, 0),
                                   .meta = R(kw->ints, off_meta * 4), .k_type = li->dtype_k, .v_type = li->dtype_v,
                                   .n_q = (int)T, .n_seq = pl->n_seqs, .meta_pages = meta_pages, .n_pages = (int)sh.n_pages,
                                   .page_size = page_size, .n_head = nq, .n_kv = sh.n_heads, .dk = hk, .dv = hv,
                                   .scale = f->m->hp.attn_scale > 0 ? f->m->hp.attn_scale : 1.0f / sqrtf((float)hk),
                                   .window = window_of(pl, ly), .softcap = f->m->hp.softcap.attn,
                                   .q_win = q_win_of(pl, ly, kw), .chunk = ly->chunk};
        if ((s = pkv_k_attention(sh.storage, &at))) return s;
        for (int64_t t = 0; t < T; t++)
            if ((s = pkv_buffer_copy(kw->apart, (size_t)t * ob, w->att, (size_t)t * orow + (size_t)sh.head_begin * g * hv * 4, ob)))
                return s;
    }
    return PKV_OK;
}

/* The first shard before d holding the same KV heads as shard d (a replica: more
 * devices than KV heads, or MLA's one latent head); -1: none. */
static int replica_of(const pkv_layer *ly, int d) {
    for (int r = 0; r < d; r++)
        if (ly->sh[r].kv_h0 == ly->sh[d].kv_h0 && ly->sh[r].n_kv == ly->sh[d].n_kv) return r;
    return -1;
}

/* The RMS norm of each q head and (where the layer computes them) k head, with the
 * shard's q_norm / k_norm weights. */
static pkv_status qk_norm(pkv_device *dev, const pkv_shard_w *sw, pkv_dev_ws *w, int64_t T, int hk, float eps, bool own_kv) {
    PKV_CHECK_INTERNAL(sw->q_norm.buf && (!own_kv || sw->k_norm.buf));
    pkv_status s = pkv_blk_rmsnorm(dev, w->q, &sw->q_norm, w->q, T * sw->n_q, hk, eps);
    return s || !own_kv ? s : pkv_blk_rmsnorm(dev, w->k, &sw->k_norm, w->k, T * sw->n_kv, hk, eps);
}

pkv_status pkv_blk_attention(pkv_fwd *f, int il, const pkv_attn_kind *kind) {
    const pkv_model *m = f->m;
    pkv_kv_cache *c = f->c;
    pkv_fwd_ws *ws = f->ws;
    const pkv_fwd_plan *pl = f->pl;
    const int64_t T = f->T;
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    pkv_dev_ws *w0 = pkv_fwd_dev(ws, m->dev);
    int64_t E = hp->n_embd;
    const int hk = ly->head_dim_k, hv = ly->head_dim_v;
    size_t xbytes = (size_t)T * (size_t)E * 4;
    pkv_status s;
    if ((s = pkv_blk_rmsnorm(m->dev, w0->x, kind->norm, w0->xb, T, E, hp->rms_eps))) return s;
    /* shared-KV drafts read another model's layer; a layer reusing KV (gemma4) an
     * earlier layer's, which it neither computes nor writes */
    int kl = m->kv_layer ? m->kv_layer[il] : il;
    const bool own_kv = !ly->kv_reuse;
    pkv_kv_layer_info li;
    if ((s = pkv_kv_layout_layer(pkv_kv_cache_layout(c), kl, &li))) return s;
    /* A one-device model that only reads another model's cache (an assistant over a
     * tensor-parallel target) attends over each of the layer's shards in turn: its
     * query heads of that shard's KV heads go where the shard is stored. */
    const bool split_reader = !own_kv && m->n_dev == 1 && li.n_shards > 1;
    if ((li.n_shards != m->n_dev && !split_reader) || li.n_kv_heads != ly->n_head_kv || li.head_dim_k != hk ||
        li.head_dim_v != hv)
        return pkv_err(PKV_ERR_MISMATCH,
                       "layer %d (cache layer %d): the KV cache (%d heads of %d/%d in %d shards) does not match the model (%d "
                       "heads of %d/%d on %d devices)",
                       il, kl, li.n_kv_heads, li.head_dim_k, li.head_dim_v, li.n_shards, ly->n_head_kv, hk, hv, m->n_dev);
    int page_size = pkv_kv_layout_page_size(pkv_kv_cache_layout(c));
    /* A cache layer with a window keeps only that many tokens (plus a page): the
     * model's layer must not look further back (a chunk of C looks back C - 1 at most). */
    const int span = ly->window ? ly->window : ly->chunk;
    if (li.window > 0 && (span == 0 || span > li.window))
        return pkv_err(PKV_ERR_MISMATCH, "layer %d (cache layer %d): the cache keeps a window of %d tokens, the model's layer "
                       "attends to %s%d", il, kl, li.window, span ? "" : "all tokens, not ", span ? span : li.window);
    /* a query that appends nothing sits one past the cached tokens: its chunk is not
     * the last cached token's (the kernel's) when that one ends a chunk */
    if (ly->chunk > 0 && pl->peek)
        return pkv_err(PKV_ERR_UNSUPPORTED, "layer %d: read-only queries (peek) on a chunked-attention layer are not "
                       "supported", il);
    const bool wpool = li.window > 0;
    const size_t off_rows = wpool ? pl->off_rows_w : pl->off_rows, off_meta = wpool ? pl->off_meta_w : pl->off_meta;
    const int meta_pages = wpool ? pl->meta_pages_w : pl->meta_pages;
    for (int d = 0; d < m->n_dev; d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        pkv_dev_ws *w = pkv_fwd_dev(ws, dev);
        int64_t qd = (int64_t)sw->n_q * hk, kd = (int64_t)sw->n_kv * hk, vd = (int64_t)sw->n_kv * hv,
                od = (int64_t)sw->n_q * hv;
        /* a replica of an earlier shard's KV heads takes that shard's K and V (after
         * norms and RoPE), so every replica holds the same bytes whatever device
         * computes: a saved and reloaded replica then reads what the original read */
        const int r = replica_of(ly, d);
        const bool calc_kv = own_kv && r < 0;
        if ((s = move(w0->xb, w->xb, xbytes))) return s;
        if ((s = pkv_blk_matmul(f, dev, &sw->wq, w->xb, w->q, T)) || (s = add_bias(dev, &sw->bq, w->q, T))) return s;
        if (own_kv && r >= 0) {
            pkv_dev_ws *wr = pkv_fwd_dev(ws, m->devs[r]);
            if ((s = move(wr->k, w->k, (size_t)(T * kd * 4))) || (s = move(wr->v, w->v, (size_t)(T * vd * 4)))) return s;
        }
        if (calc_kv) {
            /* no V projection (gemma4's attention_k_eq_v): V is K's, before K's norm and RoPE */
            if ((s = pkv_blk_matmul(f, dev, &sw->wk, w->xb, w->k, T)) ||
                (s = sw->wv.buf ? pkv_blk_matmul(f, dev, &sw->wv, w->xb, w->v, T) : pkv_buffer_copy(w->k, 0, w->v, 0, (size_t)(T * kd * 4))))
                return s;
            if ((s = add_bias(dev, &sw->bk, w->k, T)) || (s = add_bias(dev, &sw->bv, w->v, T))) return s;
        }
        if (kind->qk_norm && (s = qk_norm(dev, sw, w, T, hk, hp->rms_eps, calc_kv))) return s; /* before RoPE */
        if (kind->v_norm && calc_kv) { /* V's weightless RMS norm per head (the weight is ones) */
            PKV_CHECK_INTERNAL(sw->v_norm.buf);
            if ((s = pkv_blk_rmsnorm(dev, w->v, &sw->v_norm, w->v, T * sw->n_kv, hv, hp->rms_eps))) return s;
        }
        pkv_tref pos = R(w->ints, pl->off_pos * 4), ff;
        if ((s = rope_factors(f, sw->dev, &ff)) || (s = rope_q(f, dev, w, ly, sw->n_q, pos, ff, kind->temp)) ||
            (calc_kv && (s = rope(dev, hp, ly, w->k, 0, T, sw->n_kv, pos, ff, 1.0f))))
            return s;
        /* llama4: RMS norms (weights of ones) of the turned heads */
        if (kind->qk_norm_roped && (s = qk_norm(dev, sw, w, T, hk, hp->rms_eps, calc_kv))) return s;

        if (split_reader) {
            if ((s = attend_shards(f, ly, kl, &li, w))) return s;
        } else {
            pkv_kv_shard_info sh;
            if ((s = pkv_kv_shard(c, kl, d, &sh))) return s;
            if (sh.head_begin != sw->kv_h0 || sh.n_heads != sw->n_kv)
                return pkv_err(PKV_ERR_MISMATCH, "layer %d shard %d: the cache holds KV heads [%d, %d) but the model computes [%d, %d)",
                               il, d, sh.head_begin, sh.head_begin + sh.n_heads, sw->kv_h0, sw->kv_h0 + sw->n_kv);
            /* Attention runs where the shard's KV is stored (I5): on the host with --kv-on-host. */
            pkv_device *kdev = sh.storage;
            pkv_dev_ws *kw = pkv_fwd_dev(ws, kdev);
            if (!kw) return pkv_err(PKV_ERR_INTERNAL, "forward: no workspace for %s", pkv_device_name(kdev));
            if (kw != w) {
                if ((s = move(w->q, kw->q, (size_t)(T * qd * 4))) ||
                    (own_kv && ((s = move(w->k, kw->k, (size_t)(T * kd * 4))) || (s = move(w->v, kw->v, (size_t)(T * vd * 4))))))
                    return s;
            }
            int64_t rows = sh.n_pages * page_size;
            pkv_tref idx = R(kw->ints, off_rows * 4);
            pkv_k_set_rows_args sk = {.src = R(kw->k, 0), .src_stride = (size_t)kd * 4, .dst = R(sh.k, sh.k_off), .dst_type = li.dtype_k,
                                      .dst_stride = sh.k_row_bytes, .dst_rows = rows, .idx = idx, .n = T, .row_elems = kd};
            pkv_k_set_rows_args sv = {.src = R(kw->v, 0), .src_stride = (size_t)vd * 4, .dst = R(sh.v, sh.v_off), .dst_type = li.dtype_v,
                                      .dst_stride = sh.v_row_bytes, .dst_rows = rows, .idx = idx, .n = T, .row_elems = vd};
            /* A replay recomputes window layers only: the full layers' rows are cached. */
            if (own_kv && (wpool || !pl->replay) && ((s = pkv_k_set_rows(kdev, &sk)) || (s = pkv_k_set_rows(kdev, &sv)))) return s;
            pkv_k_attention_args at = {.q = R(kw->q, 0), .k = R(sh.k, sh.k_off), .v = R(sh.v, sh.v_off), .out = R(kw->att, 0),
                                       .meta = R(kw->ints, off_meta * 4), .k_type = li.dtype_k, .v_type = li.dtype_v, .n_q = (int)T,
                                       .n_seq = pl->n_seqs, .meta_pages = meta_pages, .n_pages = (int)sh.n_pages,
                                       .page_size = page_size, .n_head = sw->n_q, .n_kv = sw->n_kv, .dk = hk, .dv = hv,
                                       .scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hk),
                                       .window = window_of(pl, ly), .softcap = hp->softcap.attn, .q_win = q_win_of(pl, ly, kw),
                                       .sinks = pkv_tref_make(kind->sinks ? sw->sinks.buf : NULL, 0), .chunk = ly->chunk};
            PKV_CHECK_INTERNAL(!kind->sinks || sw->sinks.buf);
            if ((s = pkv_k_attention(kdev, &at))) return s;
            if (kw != w && (s = move(kw->att, w->att, (size_t)(T * od * 4)))) return s;
        }
        if (kind->out_gate) { /* att *= sigmoid(gate·xb) */
            PKV_CHECK_INTERNAL(sw->wq_gate.buf);
            pkv_k_unary_args ga = {.x = R(w->gate, 0), .y = R(w->att, 0), .n = T * od, .op = PKV_UNARY_SIGMOID,
                                   .mul = R(w->att, 0), .mul_len = T * od};
            if ((s = pkv_blk_matmul(f, dev, &sw->wq_gate, w->xb, w->gate, T)) || (s = pkv_k_unary(dev, &ga))) return s;
        }
        if ((s = pkv_blk_matmul(f, dev, &sw->wo, w->att, w->y, T)) || (s = add_bias(dev, &sw->bo, w->y, T))) return s;
    }
    return reduce(m, ws, w0, T, kind->post_norm);
}

/* ------------------------------------------------ multi-head latent attention */

/* Copy T x n_h runs of cw floats between two layouts of per-head rows: row (t, h) of
 * src at ((t n_h + h) src_w + src_c0) floats when src is token-major, else at
 * ((h T + t) src_w + src_c0); likewise dst. One batched copy. */
typedef struct heads_layout {
    pkv_buffer *buf;
    int64_t w, c0;
    bool head_major;
} heads_layout;

static size_t heads_at(const heads_layout *l, int64_t T, int n_h, int64_t t, int h) {
    const int64_t row = l->head_major ? (int64_t)h * T + t : t * n_h + h;
    return (size_t)(row * l->w + l->c0) * 4;
}

static pkv_status heads_copy(pkv_fwd_ws *ws, heads_layout src, heads_layout dst, int64_t T, int n_h, int64_t cw) {
    const size_t n = (size_t)T * (size_t)n_h;
    if (n > ws->cap_regions) {
        void *p = ws->regions;
        pkv_status s = pkv_grow(&p, &ws->cap_regions, n, sizeof *ws->regions);
        if (s) return s;
        ws->regions = p;
    }
    size_t k = 0;
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < n_h; h++)
            ws->regions[k++] = (pkv_region){heads_at(&src, T, n_h, t, h), heads_at(&dst, T, n_h, t, h), (size_t)cw * 4};
    return pkv_buffer_copy_regions(src.buf, dst.buf, ws->regions, n);
}

/* y_h = w_h · x_h for each of n_h heads, head-major: w holds head h's [rows][cols]
 * at row h rows, x [n_h][T][cols], y [n_h][T][rows]. */
static pkv_status matmul_heads(pkv_device *dev, const pkv_weight *w, int n_h, int64_t rows, pkv_buffer *x, pkv_buffer *y,
                               int64_t T) {
    const size_t rb = pkv_type_row_bytes(w->type, (size_t)w->ne0);
    for (int h = 0; h < n_h; h++) {
        pkv_k_matmul_args a = {.w = R(w->buf, (size_t)h * (size_t)rows * rb), .wtype = w->type, .rows = rows,
                               .cols = w->ne0, .x = R(x, (size_t)h * (size_t)T * (size_t)w->ne0 * 4),
                               .y = R(y, (size_t)h * (size_t)T * (size_t)rows * 4), .n = T};
        pkv_status s = pkv_k_matmul(dev, &a);
        if (s) return s;
    }
    return PKV_OK;
}

/* The latent rows of the step on device w (from w->xb) into shard sh of the cache:
 * c = rmsnorm(kv_lat·xb) to the row's first R values (in w->k), rope(kv_pe·xb) to its
 * last P (in w->v), written where the shard is stored (kw). src (another replica's
 * workspace, NULL: none): its rows are taken instead of computed, so every replica
 * holds the same bytes whatever device computes. */
static pkv_status mla_kv(pkv_fwd *f, const pkv_layer *ly, const pkv_shard_w *sw, pkv_dev_ws *w, pkv_dev_ws *kw,
                         const pkv_dev_ws *src, const pkv_kv_shard_info *sh, const pkv_kv_layer_info *li) {
    const pkv_hparams *hp = &f->m->hp;
    const int64_t T = f->T, Rl = ly->latent, P = ly->n_rot;
    pkv_device *dev = w->dev;
    pkv_status s;
    if (src) {
        if ((s = move(src->k, w->k, (size_t)(T * Rl * 4))) || (s = move(src->v, w->v, (size_t)(T * P * 4)))) return s;
    } else if ((s = pkv_blk_matmul(f, dev, &sw->mla.kv_lat, w->xb, w->k, T)) ||
               (s = pkv_blk_rmsnorm(dev, w->k, &sw->mla.kv_norm, w->k, T, Rl, hp->rms_eps)) ||
               (s = pkv_blk_matmul(f, dev, &sw->mla.kv_pe, w->xb, w->v, T)) ||
               (s = rope_dim(dev, hp, ly, w->v, 0, T, 1, (int)P, R(w->ints, f->pl->off_pos * 4), R(NULL, 0), 1.0f))) {
        return s;
    }
    if (f->pl->replay) return PKV_OK; /* a replay recomputes window layers only: these rows are cached */
    if ((s = move(w->k, kw->k, (size_t)(T * Rl * 4))) || (s = move(w->v, kw->v, (size_t)(T * P * 4)))) return s;
    const int64_t rows = sh->n_pages * pkv_kv_layout_page_size(pkv_kv_cache_layout(f->c));
    const pkv_tref idx = R(kw->ints, f->pl->off_rows * 4);
    pkv_k_set_rows_args lat = {.src = R(kw->k, 0), .src_stride = (size_t)Rl * 4, .dst = R(sh->k, sh->k_off),
                               .dst_type = li->dtype_k, .dst_stride = sh->k_row_bytes, .dst_rows = rows, .idx = idx, .n = T,
                               .row_elems = Rl};
    pkv_k_set_rows_args pe = lat;
    pe.src = R(kw->v, 0);
    pe.src_stride = (size_t)P * 4;
    pe.dst = R(sh->k, sh->k_off + pkv_type_row_bytes(li->dtype_k, (size_t)Rl));
    pe.row_elems = P;
    if ((s = pkv_k_set_rows(sh->storage, &lat))) return s;
    return pkv_k_set_rows(sh->storage, &pe);
}

/* The step's absorbed queries on device w into w->q, f32 [T][n_q][R + P]: each head's
 * [k_b_h·q_nope_h, rope(q_pe_h)]. */
static pkv_status mla_q(pkv_fwd *f, const pkv_layer *ly, const pkv_shard_w *sw, pkv_dev_ws *w) {
    const pkv_hparams *hp = &f->m->hp;
    const int64_t T = f->T, Rl = ly->latent, P = ly->n_rot, N = hp->mla.dk - P;
    const int nq = sw->n_q;
    pkv_device *dev = w->dev;
    pkv_buffer *qin = w->xb;
    pkv_status s;
    if (sw->mla.q_a.buf) { /* q_lora_rank: q = q_b · rmsnorm(q_a · xb) */
        if ((s = pkv_blk_matmul(f, dev, &sw->mla.q_a, w->xb, w->mla_a, T)) ||
            (s = pkv_blk_rmsnorm(dev, w->mla_a, &sw->mla.q_a_norm, w->mla_a, T, hp->mla.q_lora, hp->rms_eps)))
            return s;
        qin = w->mla_a;
    }
    const int64_t KD = Rl + P;
    if ((s = pkv_blk_matmul(f, dev, &sw->mla.q_nope, qin, w->mla_b, T)) ||
        (s = pkv_blk_matmul(f, dev, &sw->mla.q_pe, qin, w->mla_c, T)) ||
        (s = rope_dim(dev, hp, ly, w->mla_c, 0, T, nq, (int)P, R(w->ints, f->pl->off_pos * 4), R(NULL, 0), 1.0f)) ||
        (s = heads_copy(f->ws, (heads_layout){w->mla_b, N, 0, false}, (heads_layout){w->mla_a, N, 0, true}, T, nq, N)) ||
        (s = matmul_heads(dev, &sw->mla.k_b, nq, Rl, w->mla_a, w->mla_b, T)) ||
        (s = heads_copy(f->ws, (heads_layout){w->mla_b, Rl, 0, true}, (heads_layout){w->q, KD, 0, false}, T, nq, Rl)))
        return s;
    return heads_copy(f->ws, (heads_layout){w->mla_c, P, 0, false}, (heads_layout){w->q, KD, Rl, false}, T, nq, P);
}

pkv_status pkv_blk_mla(pkv_fwd *f, int il, const pkv_weight *norm) {
    const pkv_model *m = f->m;
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    const int64_t T = f->T, E = hp->n_embd, Rl = ly->latent, P = ly->n_rot, V = hp->mla.dv;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, m->dev);
    pkv_status s;
    pkv_kv_layer_info li;
    if ((s = pkv_blk_rmsnorm(m->dev, w0->x, norm, w0->xb, T, E, hp->rms_eps)) ||
        (s = pkv_kv_layout_layer(pkv_kv_cache_layout(f->c), il, &li)))
        return s;
    if (!li.v_in_k || li.rope_off != Rl || li.head_dim_k != Rl + P || li.head_dim_v != Rl || li.window > 0 ||
        li.n_shards != m->n_dev)
        return pkv_err(PKV_ERR_MISMATCH, "layer %d: the KV cache layer (%s, rows of %d/%d, rotary from %d, %d shards) is not "
                       "the model's latent one (V read from K, rows of %lld/%lld, rotary from %lld, %d devices)", il,
                       li.v_in_k ? "V read from K" : "K and V", li.head_dim_k, li.head_dim_v, li.rope_off, li.n_shards,
                       (long long)(Rl + P), (long long)Rl, (long long)Rl, m->n_dev);
    const int page_size = pkv_kv_layout_page_size(pkv_kv_cache_layout(f->c));
    for (int d = 0; d < m->n_dev; d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_dev_ws *w = pkv_fwd_dev(f->ws, m->devs[d]);
        pkv_kv_shard_info sh;
        if ((s = pkv_kv_shard(f->c, il, d, &sh))) return s;
        pkv_dev_ws *kw = pkv_fwd_dev(f->ws, sh.storage); /* attention runs where the replica is stored (I5) */
        if (!kw) return pkv_err(PKV_ERR_INTERNAL, "forward: no workspace for %s", pkv_device_name(sh.storage));
        const int nq = sw->n_q;
        const int r = replica_of(ly, d); /* every shard is a replica of the one latent head */
        if ((s = move(w0->xb, w->xb, (size_t)(T * E * 4))) ||
            (s = mla_kv(f, ly, sw, w, kw, r < 0 ? NULL : pkv_fwd_dev(f->ws, m->devs[r]), &sh, &li)) ||
            (s = mla_q(f, ly, sw, w)) || (s = move(w->q, kw->q, (size_t)(T * nq * (Rl + P) * 4))))
            return s;
        const int wpool_meta = f->pl->meta_pages;
        pkv_k_attention_args at = {.q = R(kw->q, 0), .k = R(sh.k, sh.k_off), .out = R(kw->att, 0),
                                   .meta = R(kw->ints, f->pl->off_meta * 4), .k_type = li.dtype_k, .v_type = li.dtype_k,
                                   .n_q = (int)T, .n_seq = f->pl->n_seqs, .meta_pages = wpool_meta,
                                   .n_pages = (int)sh.n_pages, .page_size = page_size, .n_head = nq, .n_kv = 1,
                                   .dk = (int)(Rl + P), .dv = (int)Rl,
                                   .scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hp->mla.dk),
                                   .v_in_k = true};
        /* o_h = v_b_h · latent_h, then the output projection of this shard's heads */
        if ((s = pkv_k_attention(sh.storage, &at)) || (s = move(kw->att, w->att, (size_t)(T * nq * Rl * 4))) ||
            (s = heads_copy(f->ws, (heads_layout){w->att, Rl, 0, false}, (heads_layout){w->mla_a, Rl, 0, true}, T, nq, Rl)) ||
            (s = matmul_heads(w->dev, &sw->mla.v_b, nq, V, w->mla_a, w->mla_b, T)) ||
            (s = heads_copy(f->ws, (heads_layout){w->mla_b, V, 0, true}, (heads_layout){w->mla_c, V, 0, false}, T, nq, V)) ||
            (s = pkv_blk_matmul(f, w->dev, &sw->wo, w->mla_c, w->y, T)))
            return s;
    }
    return reduce(m, f->ws, w0, T, NULL);
}

/* hb = act(hb) * hb2 over n elements of w's workspace. */
static pkv_k_swiglu_args glu(pkv_glu act, pkv_dev_ws *w, int64_t n) {
    return (pkv_k_swiglu_args){.g = R(w->hb, 0), .u = R(w->hb2, 0), .y = R(w->hb, 0), .n = n, .gelu = act == PKV_GLU_GELU,
                               .oai = act == PKV_GLU_SILU_OAI, .alpha = 1.702f, .limit = 7.0f};
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
    size_t t = (size_t)cap, E = (size_t)hp->n_embd, X = (size_t)hp->moe.n_expert, K = (size_t)hp->moe.n_used;
    float *p = pkv_malloc(t * X * 4), *o = pkv_malloc(t * E * 4), *y = pkv_malloc(t * E * 4), *w = pkv_malloc(t * K * 4);
    float *x = pkv_malloc(t * E * 4);
    int32_t *r = pkv_malloc(t * 4), *sel = pkv_malloc(t * K * 4);
    if (!p || !o || !y || !w || !r || !sel || !x) {
        pkv_free(p), pkv_free(o), pkv_free(y), pkv_free(w), pkv_free(r), pkv_free(sel), pkv_free(x);
        return pkv_err(PKV_ERR_NOMEM, "forward: mixture-of-experts scratch for %lld tokens", (long long)cap);
    }
    pkv_free(ws->h_probs), pkv_free(ws->h_out), pkv_free(ws->h_y), pkv_free(ws->h_wsel), pkv_free(ws->h_rows),
        pkv_free(ws->h_sel), pkv_free(ws->h_x);
    ws->h_probs = p, ws->h_out = o, ws->h_y = y, ws->h_wsel = w, ws->h_rows = r, ws->h_sel = sel, ws->h_x = x;
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

/* The routing kernel's arguments for kind k (hp: the sizes and groups). */
static pkv_k_moe_route_args route_args(const pkv_hparams *hp, const pkv_moe_kind *k) {
    return (pkv_k_moe_route_args){.n_expert = hp->moe.n_expert,
                                  .k = hp->moe.n_used,
                                  .n_group = hp->moe_route.n_group,
                                  .n_group_used = hp->moe_route.n_group_used,
                                  .gating = (int)k->gating,
                                  .norm_w = k->norm_w,
                                  .sel_logits = k->sel_logits,
                                  .w_scale = k->w_scale};
}

/* Expert e on the n rows ws->h_rows of xb into y of the device of the part that
 * holds it (*d; its copy of xb made by moe_to): one matmul of each of its matrices,
 * its weights read in place. kind->weight_in: each row is first scaled by its weight
 * (the host copy ws->h_x of xb, written into xe). */
static pkv_status moe_expert(pkv_fwd *f, int il, const pkv_moe_kind *kind, int32_t e, int64_t n, int *dp) {
    const pkv_model *m = f->m;
    const pkv_layer *ly = &m->layers[il];
    pkv_fwd_ws *ws = f->ws;
    int d = 0;
    while (e >= ly->moe.ep[d].e0 + ly->moe.ep[d].n) d++;
    *dp = d;
    const struct pkv_moe_part *pt = &ly->moe.ep[d];
    pkv_device *dev = m->devs[d];
    pkv_dev_ws *w = pkv_fwd_dev(ws, dev);
    const int64_t T = f->T, E = m->hp.n_embd, K = m->hp.moe.n_used, F = m->hp.moe.n_ff, le = e - pt->e0;
    pkv_status s;
    if (kind->weight_in) {
        for (int64_t i = 0; i < n; i++) {
            int64_t t = ws->h_rows[i];
            float wt = 0;
            for (int64_t k = 0; k < K; k++)
                if (ws->h_sel[t * K + k] == e) wt = ws->h_wsel[t * K + k];
            for (int64_t c = 0; c < E; c++) ws->h_y[i * E + c] = ws->h_x[t * E + c] * wt;
        }
        if ((s = pkv_buffer_write(w->xe, 0, ws->h_y, (size_t)(n * E) * 4))) return s;
    } else {
        pkv_k_get_rows_args g = {.w = R(w->xb, 0), .wtype = PKV_TYPE_F32, .n_vocab = T, .cols = E,
                                 .ids = R(w->moe_ids, 0), .out = R(w->xe, 0), .n = n};
        if ((s = pkv_buffer_write(w->moe_ids, 0, ws->h_rows, (size_t)n * 4)) || (s = pkv_k_get_rows(dev, &g))) return s;
    }
    /* LoRA adapters: on one device only (refused on a split at load), whose part is every expert */
    pkv_k_swiglu_args sg = glu(kind->act, w, n * F);
    if ((s = matmul_rows(dev, &pt->gate, le * F, F, w->xe, w->hb, n)) ||
        (f->lora && (s = pkv_lora_delta_expert(f, dev, &pt->gate, e, w->xe, w->hb, ws->h_rows, n))) ||
        (s = add_bias_row(dev, &pt->gate_b, le, w->hb, n)) || (s = matmul_rows(dev, &pt->up, le * F, F, w->xe, w->hb2, n)) ||
        (f->lora && (s = pkv_lora_delta_expert(f, dev, &pt->up, e, w->xe, w->hb2, ws->h_rows, n))) ||
        (s = add_bias_row(dev, &pt->up_b, le, w->hb2, n)) || (s = pkv_k_swiglu(dev, &sg)) ||
        (s = matmul_rows(dev, &pt->down, le * E, E, w->hb, w->y, n)) ||
        (f->lora && (s = pkv_lora_delta_expert(f, dev, &pt->down, e, w->hb, w->y, ws->h_rows, n))) ||
        (s = add_bias_row(dev, &pt->down_b, le, w->y, n)))
        return s;
    return PKV_OK;
}

/* The shared expert (ly->moe.sh_*) of every token added to w0->moe_acc, times
 * sigmoid(sh_gate_inp · xb) where the layer has that gate (ws->h_rows: 0..T-1). */
static pkv_status moe_shared(pkv_fwd *f, int il, const pkv_moe_kind *kind) {
    const pkv_model *m = f->m;
    const pkv_layer *ly = &m->layers[il];
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, m->dev);
    pkv_device *dev = m->dev;
    const int64_t T = f->T, E = m->hp.n_embd;
    pkv_k_swiglu_args sg = glu(kind->act, w0, T * ly->moe.sh_gate.ne1);
    pkv_status s;
    if ((s = pkv_blk_matmul(f, dev, &ly->moe.sh_gate, w0->xb, w0->hb, T)) ||
        (s = pkv_blk_matmul(f, dev, &ly->moe.sh_up, w0->xb, w0->hb2, T)) || (s = pkv_k_swiglu(dev, &sg)) ||
        (s = pkv_blk_matmul(f, dev, &ly->moe.sh_down, w0->hb, w0->y, T)))
        return s;
    if (!ly->moe.sh_gate_inp.buf) return add(dev, w0->moe_acc, w0->y, T * E);
    /* the gate's logit per token (a one-row matmul), its sigmoid the row weights */
    pkv_k_unary_args sig = {.x = R(w0->router, 0), .y = R(w0->router, 0), .n = T, .op = PKV_UNARY_SIGMOID};
    pkv_k_moe_combine_args cb = {.out = R(w0->moe_acc, 0), .y = R(w0->y, 0), .rows = R(w0->moe_ids, 0),
                                 .w = R(w0->router, 0), .n = T, .cols = E, .out_rows = T, .add = true};
    if ((s = pkv_blk_matmul(f, dev, &ly->moe.sh_gate_inp, w0->xb, w0->router, T)) || (s = pkv_k_unary(dev, &sig)) ||
        (s = pkv_buffer_write(w0->moe_ids, 0, f->ws->h_rows, (size_t)T * 4)))
        return s;
    return pkv_k_moe_combine(dev, &cb);
}

/* A mixture of experts in place of the FFN (llama.cpp's semantics): each token's
 * experts and weights by the routing kernel (pkv_k_moe_route), then
 *   x += sum over sel of w_e * down_e(act(gate_e · xb) * (up_e · xb))   (+ the shared expert)
 * with expert e's bias rows after its matmuls where the file has them (gpt-oss) and,
 * with kind->weight_in, w_e applied to the expert's input instead of its output
 * (Llama 4). Routing is per token, so it does not depend on the batch. The choices
 * are read back once per layer (which rows each expert gets); each expert then runs
 * once on its rows, and the weighted sum is formed on the first device
 * (pkv_k_moe_combine), expert by expert in ascending order, then the shared expert,
 * so a token's result is the same whatever else is in the batch. */
/* The experts' sum, post-normed where the kind says, into out (NULL: added to x). */
static pkv_status moe_to(pkv_fwd *f, int il, const pkv_moe_kind *kind, pkv_tref out) {
    const pkv_model *m = f->m;
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    pkv_fwd_ws *ws = f->ws;
    pkv_dev_ws *w0 = pkv_fwd_dev(ws, m->dev);
    pkv_device *dev = m->dev;
    const int64_t T = f->T, E = hp->n_embd, X = hp->moe.n_expert, K = hp->moe.n_used;
    pkv_status s;
    PKV_CHECK_INTERNAL(X > 0 && ly->moe.router.buf);
    /* the router's input: the experts' (norm), or a norm of its own (gemma4) */
    if ((s = pkv_blk_rmsnorm(dev, w0->x, kind->router_norm ? kind->router_norm : kind->norm, w0->xb, T, E, hp->rms_eps)))
        return s;
    if ((s = moe_host_reserve(ws, hp, T))) return s;
    pkv_k_moe_route_args ra = route_args(hp, kind);
    ra.logits = R(w0->router, 0), ra.sel = R(w0->moe_sel, 0), ra.w = R(w0->moe_sel, (size_t)(T * K) * 4), ra.n = T;
    if (ly->moe.probs_b.buf) ra.bias = R(ly->moe.probs_b.buf, 0);
    if ((s = pkv_blk_matmul(f, dev, &ly->moe.router, w0->xb, w0->router, T)) ||
        (s = add_bias(dev, &ly->moe.router_b, w0->router, T)) || (s = pkv_k_moe_route(dev, &ra)))
        return s;
    if (kind->router_norm && (s = pkv_blk_rmsnorm(dev, w0->x, kind->norm, w0->xb, T, E, hp->rms_eps))) return s;
    /* the one read back: each token's experts and weights */
    if ((s = pkv_buffer_read(w0->moe_sel, 0, ws->h_sel, (size_t)(T * K) * 4)) ||
        (s = pkv_buffer_read(w0->moe_sel, (size_t)(T * K) * 4, ws->h_wsel, (size_t)(T * K) * 4)))
        return s;
    if (kind->weight_in && (s = pkv_buffer_read(w0->xb, 0, ws->h_x, (size_t)(T * E) * 4))) return s;
    for (int d = 1; !kind->weight_in && d < m->n_dev; d++) /* expert parallelism: xb to each part's device */
        if (ly->moe.ep[d].n > 0 && (s = move(w0->xb, pkv_fwd_dev(ws, m->devs[d])->xb, (size_t)(T * E) * 4))) return s;
    if ((s = pkv_buffer_fill(w0->moe_acc, 0, (size_t)(T * E) * 4, 0))) return s;
    for (int32_t e = 0; e < X; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++)
                if (ws->h_sel[t * K + k] == e) {
                    /* the row's weight in the sum: applied to the input instead (weight_in); gemma4's
                     * per-expert output scale */
                    float wt = kind->weight_in ? 1.0f : ws->h_wsel[t * K + k];
                    ws->h_probs[n] = kind->exp_scale ? wt * kind->exp_scale[e] : wt;
                    ws->h_rows[n++] = (int32_t)t;
                }
        if (!n) continue;
        int d = 0;
        if ((s = moe_expert(f, il, kind, e, n, &d))) return s;
        pkv_dev_ws *wd = pkv_fwd_dev(ws, m->devs[d]);
        pkv_k_moe_combine_args cb = {.out = R(w0->moe_acc, 0), .y = R(w0->y, 0), .rows = R(w0->moe_ids, 0),
                                     .w = R(w0->moe_wt, 0), .n = n, .cols = E, .out_rows = T, .add = true};
        if ((d && (s = move(wd->y, w0->y, (size_t)(n * E) * 4))) ||
            (s = pkv_buffer_write(w0->moe_ids, 0, ws->h_rows, (size_t)n * 4)) ||
            (s = pkv_buffer_write(w0->moe_wt, 0, ws->h_probs, (size_t)n * 4)) || (s = pkv_k_moe_combine(dev, &cb)))
            return s;
    }
    for (int64_t t = 0; t < T; t++) ws->h_rows[t] = (int32_t)t; /* the shared expert's rows: every token */
    if (ly->moe.sh_gate.buf && (s = moe_shared(f, il, kind))) return s;
    if (kind->post_norm && (s = pkv_blk_rmsnorm(dev, w0->moe_acc, kind->post_norm, w0->moe_acc, T, E, hp->rms_eps))) return s;
    return out.buf ? pkv_buffer_copy(w0->moe_acc, 0, out.buf, out.off, (size_t)(T * E) * 4) : residual_add(m, w0->x, w0->moe_acc, T * E);
}

pkv_status pkv_blk_moe(pkv_fwd *f, int il, const pkv_moe_kind *kind) {
    return f->attn_only ? PKV_OK : moe_to(f, il, kind, R(NULL, 0));
}



/* The FFN's output, post-normed where the kind says, into out (NULL: added to x). */
static pkv_status ffn_to(pkv_fwd *f, int il, const pkv_ffn_kind *kind, pkv_tref out) {
    const pkv_model *m = f->m;
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    pkv_fwd_ws *ws = f->ws;
    pkv_dev_ws *w0 = pkv_fwd_dev(ws, m->dev);
    const int64_t T = f->T, E = hp->n_embd;
    pkv_status s;
    if ((s = pkv_blk_rmsnorm(m->dev, w0->x, kind->norm, w0->xb, T, E, hp->rms_eps))) return s;
    for (int d = 0; d < m->n_dev; d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        pkv_dev_ws *w = pkv_fwd_dev(ws, dev);
        PKV_CHECK_INTERNAL((kind->ungated || sw->w_gate.buf) && sw->w_up.buf && sw->w_down.buf);
        if ((s = move(w0->xb, w->xb, (size_t)T * (size_t)E * 4))) return s;
        if (kind->ungated) { /* hb = up_act(up·xb) */
            pkv_k_unary_args ua = {.x = R(w->hb, 0), .y = R(w->hb, 0), .n = T * sw->n_ff, .op = kind->up_act};
            if ((s = pkv_blk_matmul(f, dev, &sw->w_up, w->xb, w->hb, T)) || (s = pkv_k_unary(dev, &ua))) return s;
        } else {
            if ((s = pkv_blk_matmul(f, dev, &sw->w_gate, w->xb, w->hb, T)) ||
                (s = pkv_blk_matmul(f, dev, &sw->w_up, w->xb, w->hb2, T)))
                return s;
            pkv_k_swiglu_args sg = glu(kind->act, w, T * sw->n_ff);
            if ((s = pkv_k_swiglu(dev, &sg))) return s;
        }
        if ((s = pkv_blk_matmul(f, dev, &sw->w_down, w->hb, w->y, T))) return s;
    }
    return reduce_to(m, ws, w0, T, kind->post_norm, out);
}

pkv_status pkv_blk_ffn(pkv_fwd *f, int il, const pkv_ffn_kind *kind) {
    return f->attn_only ? PKV_OK : ffn_to(f, il, kind, R(NULL, 0));
}

pkv_status pkv_blk_ffn_moe(pkv_fwd *f, int il, const pkv_ffn_kind *dense, const pkv_moe_kind *moe,
                           const pkv_weight *post_norm) {
    if (f->attn_only) return PKV_OK;
    const pkv_model *m = f->m;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, m->dev);
    const int64_t n = f->T * m->hp.n_embd;
    PKV_CHECK_INTERNAL(w0->ffn_acc);
    pkv_tref a = R(w0->ffn_acc, 0), b = R(w0->ffn_acc, (size_t)n * 4);
    pkv_k_add_args ab = {.a = a, .b = b, .y = a, .n = n, .b_len = n};
    pkv_status s;
    if ((s = ffn_to(f, il, dense, a)) || (s = moe_to(f, il, moe, b)) || (s = pkv_k_add(m->dev, &ab))) return s;
    pkv_k_rms_norm_args nm = {.x = a, .w = R(post_norm->buf, 0), .y = a, .n_rows = f->T, .row_len = m->hp.n_embd,
                              .eps = m->hp.rms_eps};
    pkv_k_add_args ax = {.a = R(w0->x, 0), .b = a, .y = R(w0->x, 0), .n = n, .b_len = n};
    if ((s = pkv_k_rms_norm(m->dev, &nm))) return s;
    return pkv_k_add(m->dev, &ax);
}

pkv_status pkv_blk_ple_inputs(pkv_fwd *f) {
    const pkv_model *m = f->m;
    const pkv_hparams *hp = &m->hp;
    pkv_fwd_ws *ws = f->ws;
    pkv_dev_ws *w0 = pkv_fwd_dev(ws, m->dev);
    pkv_device *dev = m->dev;
    const int64_t T = f->T, P = hp->n_embd_per_layer, NL = hp->n_layer, E = hp->n_embd;
    const size_t n = (size_t)(NL * T * P);
    pkv_status s;
    PKV_CHECK_INTERNAL(P > 0 && m->ple.tok && m->ple.model_proj.buf && m->ple.half.buf);
    if (n + (size_t)(NL * P) > ws->h_ple_cap) {
        void *p = ws->h_ple;
        if ((s = pkv_grow(&p, &ws->h_ple_cap, n + (size_t)(NL * P), sizeof(float)))) return s;
        ws->h_ple = p;
    }
    /* the tokens' rows, dequantized and scaled as llama.cpp does (f32 multiply), to [l][t][P] */
    float *row = ws->h_ple + n;
    const size_t rb = pkv_type_row_bytes(m->ple.tok_type, (size_t)(NL * P));
    const float sc = sqrtf((float)P);
    for (int64_t t = 0; t < T; t++) {
        const int32_t id = ws->host_ints[f->pl->off_ids + (size_t)t];
        if ((s = pkv_dequantize_row(m->ple.tok_type, m->ple.tok + (size_t)id * rb, row, NL * P))) return s;
        for (int64_t l = 0; l < NL; l++)
            for (int64_t j = 0; j < P; j++) ws->h_ple[(size_t)((l * T + t) * P + j)] = row[l * P + j] * sc;
    }
    if ((s = pkv_buffer_write(w0->ple_tok, 0, ws->h_ple, n * 4))) return s;
    const size_t rows_b = pkv_type_row_bytes(m->ple.model_proj.type, (size_t)E);
    for (int64_t l = 0; l < NL; l++) { /* layer l's P rows of the projection into its [T][P] block */
        pkv_k_matmul_args a = {.w = R(m->ple.model_proj.buf, (size_t)(l * P) * rows_b), .wtype = m->ple.model_proj.type,
                               .rows = P, .cols = E, .x = R(w0->x, 0), .y = R(w0->ple, (size_t)(l * T * P) * 4), .n = T};
        if ((s = pkv_k_matmul(dev, &a))) return s;
    }
    pkv_k_rms_norm_args nm = {.x = R(w0->ple, 0), .w = R(m->ple.proj_norm.buf, 0), .y = R(w0->ple, 0), .n_rows = NL * T,
                              .row_len = P, .eps = hp->rms_eps * (float)E};
    pkv_k_unary_args mean = {.x = R(w0->ple, 0), .y = R(w0->ple, 0), .n = (int64_t)n, .op = PKV_UNARY_ID,
                             .bias = R(w0->ple_tok, 0), .bias_len = (int64_t)n, .mul = R(m->ple.half.buf, 0), .mul_len = 1};
    if ((s = pkv_k_rms_norm(dev, &nm)) || (s = pkv_k_unary(dev, &mean))) return s;
    return PKV_OK;
}

pkv_status pkv_blk_ple(pkv_fwd *f, int il) {
    if (f->attn_only) return PKV_OK;
    const pkv_model *m = f->m;
    const pkv_layer *ly = &m->layers[il];
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, m->dev);
    pkv_device *dev = m->dev;
    const int64_t T = f->T, P = m->hp.n_embd_per_layer, E = m->hp.n_embd;
    PKV_CHECK_INTERNAL(P > 0 && ly->ple.gate.buf && ly->ple.proj.buf && ly->ple.post_norm.buf);
    pkv_k_swiglu_args g = {.g = R(w0->ple_g, 0), .u = R(w0->ple, (size_t)(il * T * P) * 4), .y = R(w0->ple_g, 0), .n = T * P,
                           .gelu = true};
    pkv_status s;
    if ((s = pkv_blk_matmul(f, dev, &ly->ple.gate, w0->x, w0->ple_g, T)) || (s = pkv_k_swiglu(dev, &g)) ||
        (s = pkv_blk_matmul(f, dev, &ly->ple.proj, w0->ple_g, w0->y, T)) ||
        (s = pkv_blk_rmsnorm(dev, w0->y, &ly->ple.post_norm, w0->y, T, E, m->hp.rms_eps)))
        return s;
    return add(dev, w0->x, w0->y, T * E);
}

pkv_status pkv_blk_scale(pkv_fwd *f, const pkv_weight *sc) {
    if (f->attn_only || !sc->buf) return PKV_OK;
    const pkv_model *m = f->m;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, m->dev);
    pkv_k_unary_args a = {.x = R(w0->x, 0), .y = R(w0->x, 0), .n = f->T * m->hp.n_embd, .op = PKV_UNARY_ID,
                          .mul = R(sc->buf, 0), .mul_len = 1};
    return pkv_k_unary(m->dev, &a);
}

void pkv_fwd_state_layout(const pkv_hparams *hp, int64_t *conv, int64_t *total) {
    const int64_t R = hp->ssm.n_v_heads / hp->ssm.n_k_heads, dk = hp->ssm.d_k, dv = hp->ssm.d_v;
    *conv = (int64_t)(hp->ssm.d_conv - 1) * (2 * dk + R * dv);
    *total = *conv + R * dk * dv;
}

void pkv_fwd_state_desc(const pkv_hparams *hp, pkv_kv_layer_desc *d) {
    const int R = hp->ssm.n_v_heads / hp->ssm.n_k_heads, dk = hp->ssm.d_k, dv = hp->ssm.d_v;
    int64_t conv, total;
    pkv_fwd_state_layout(hp, &conv, &total);
    d->n_kv_heads = hp->ssm.n_k_heads;
    d->state_per_head = (int)total;
    /* per conv row: the group's q, its k, its R value heads; then its R delta matrices
     * (the model refuses files with more parts than the cache describes) */
    int n = 0;
    for (int t = 0; t < hp->ssm.d_conv - 1 && n + 2 + R <= PKV_KV_STATE_MAX_PARTS; t++) {
        d->state_part[n++] = dk;
        d->state_part[n++] = dk;
        for (int r = 0; r < R; r++) d->state_part[n++] = dv;
    }
    for (int r = 0; r < R && n < PKV_KV_STATE_MAX_PARTS; r++) d->state_part[n++] = dk * dv;
    d->state_n_parts = n;
}

void pkv_model_state_desc(const pkv_model *m, int il, pkv_kv_layer_desc *d) {
    const pkv_arch_ops *ops = pkv_arch_ops_of(m->hp.arch);
    if (ops->state_desc) ops->state_desc(m, il, d);
    else pkv_fwd_state_desc(&m->hp, d);
}

pkv_status pkv_blk_state_shard(pkv_fwd *f, int il, int d, size_t slot_bytes, pkv_kv_shard_info *sh) {
    const pkv_model *m = f->m;
    const pkv_shard_w *sw = &m->layers[il].sh[d];
    const int kl = m->kv_layer ? m->kv_layer[il] : il;
    pkv_kv_layer_info li;
    pkv_kv_layer_desc want;
    memset(&want, 0, sizeof want);
    pkv_model_state_desc(m, il, &want);
    pkv_status s = pkv_kv_layout_layer(pkv_kv_cache_layout(f->c), kl, &li);
    if (s) return s;
    if (li.n_kv_heads != want.n_kv_heads || li.state_per_head != want.state_per_head || li.n_shards != m->n_dev ||
        li.state_n_parts != want.state_n_parts ||
        memcmp(li.state_part, want.state_part, (size_t)want.state_n_parts * sizeof *want.state_part))
        return pkv_err(PKV_ERR_MISMATCH, "layer %d (cache layer %d): the cache keeps a recurrent state of %d heads x %d floats "
                       "(%d parts) in %d shards, the model needs %d x %d (%d parts) on %d devices", il, kl, li.n_kv_heads,
                       li.state_per_head, li.state_n_parts, li.n_shards, want.n_kv_heads, want.state_per_head,
                       want.state_n_parts, m->n_dev);
    if ((s = pkv_kv_shard(f->c, kl, d, sh))) return s;
    if (sh->head_begin != sw->kv_h0 || sh->n_heads != sw->n_kv || !sh->state || sh->state_slot_bytes < slot_bytes)
        return pkv_err(PKV_ERR_MISMATCH, "layer %d shard %d: the cache holds the recurrent state of heads [%d, %d) in slots "
                       "of %zu bytes but the model computes [%d, %d) in %zu", il, d, sh->head_begin,
                       sh->head_begin + sh->n_heads, sh->state_slot_bytes, sw->kv_h0, sw->kv_h0 + sw->n_kv, slot_bytes);
    if (sh->storage != m->devs[d])
        return pkv_err(PKV_ERR_UNSUPPORTED, "layer %d: the recurrent state is on %s but the layer runs on %s: keep the "
                       "cache on the model's devices for recurrent layers", il, pkv_device_name(sh->storage),
                       pkv_device_name(m->devs[d]));
    return PKV_OK;
}

pkv_status pkv_blk_delta_net(pkv_fwd *f, int il, const pkv_weight *norm) {
    const pkv_model *m = f->m;
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    const pkv_fwd_plan *pl = f->pl;
    pkv_fwd_ws *ws = f->ws;
    pkv_dev_ws *w0 = pkv_fwd_dev(ws, m->dev);
    const int64_t T = f->T, E = hp->n_embd, dk = hp->ssm.d_k, dv = hp->ssm.d_v;
    pkv_status s;
    PKV_CHECK_INTERNAL(ly->recurrent && pl->state);
    int64_t conv, per_group;
    pkv_fwd_state_layout(hp, &conv, &per_group);
    const size_t xbytes = (size_t)T * (size_t)E * 4;
    if ((s = pkv_blk_rmsnorm(m->dev, w0->x, norm, w0->xb, T, E, hp->rms_eps))) return s;
    for (int d = 0; d < m->n_dev; d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        pkv_dev_ws *w = pkv_fwd_dev(ws, dev);
        /* this shard: key heads Hk, value heads Hv (r-major), channels C */
        const int64_t Hk = sw->n_kv, Hv = sw->n_q, C = 2 * Hk * dk + Hv * dv;
        pkv_kv_shard_info sh;
        if ((s = pkv_blk_state_shard(f, il, d, (size_t)(Hk * per_group) * 4, &sh))) return s;
        /* the shard's slot: its conv window [d_conv - 1][C], then its delta matrices
         * [Hv][dk][dv] (the parts of pkv_fwd_state_desc, shard-major) */
        const size_t stride = sh.state_slot_bytes, delta_off = (size_t)(Hk * conv) * 4;
        const pkv_tref meta = R(w->ints, pl->off_smeta * 4);
        pkv_k_unary_args beta = {.x = R(w->ssm_bg, 0), .y = R(w->ssm_bg, 0), .n = T * Hv, .op = PKV_UNARY_SIGMOID};
        pkv_k_unary_args gate = {.x = R(w->ssm_bg, (size_t)(T * Hv) * 4), .y = R(w->ssm_bg, (size_t)(T * Hv) * 4),
                                 .n = T * Hv, .op = PKV_UNARY_SOFTPLUS, .bias = R(sw->ssm.dt.buf, 0), .bias_len = Hv,
                                 .mul = R(sw->ssm.a.buf, 0), .mul_len = Hv};
        pkv_k_ssm_conv_args cv = {.x = R(w->ssm_u, 0), .w = R(sw->ssm.conv.buf, 0), .y = R(w->ssm_u, 0),
                                  .state = R(sh.state, sh.state_off), .state_stride = stride, .n_slots = sh.n_state_slots,
                                  .meta = meta, .n_tok = T, .channels = C, .n_seq = pl->n_seqs, .d_conv = hp->ssm.d_conv,
                                  .silu = true};
        pkv_k_l2_norm_args l2 = {.x = R(w->ssm_u, 0), .y = R(w->ssm_u, 0), .n = T, .n_heads = 2 * Hk, .head_dim = dk,
                                 .x_stride = (size_t)C * 4, .y_stride = (size_t)C * 4, .eps = hp->rms_eps};
        pkv_k_delta_net_args dn = {.q = R(w->ssm_u, 0), .k = R(w->ssm_u, (size_t)(Hk * dk) * 4),
                                   .v = R(w->ssm_u, (size_t)(2 * Hk * dk) * 4), .q_stride = (size_t)C * 4,
                                   .k_stride = (size_t)C * 4, .v_stride = (size_t)C * 4, .g = gate.y, .beta = beta.y,
                                   .out = R(w->ssm_o, 0), .state = R(sh.state, sh.state_off + delta_off),
                                   .state_stride = stride, .n_slots = sh.n_state_slots, .meta = meta, .n_tok = T,
                                   .n_seq = pl->n_seqs, .n_k_heads = (int)Hk, .n_v_heads = (int)Hv, .d_k = (int)dk,
                                   .d_v = (int)dv, .grouped = false};
        /* the output norm per value head, then times silu(z) */
        pkv_k_swiglu_args zg = {.g = R(w->ssm_z, 0), .u = R(w->ssm_o, 0), .y = R(w->ssm_o, 0), .n = T * Hv * dv};
        if ((s = move(w0->xb, w->xb, xbytes)) || (s = pkv_blk_matmul(f, dev, &sw->ssm.qkv, w->xb, w->ssm_u, T)) ||
            (s = pkv_blk_matmul(f, dev, &sw->ssm.z, w->xb, w->ssm_z, T)) ||
            (s = pkv_blk_matmul(f, dev, &sw->ssm.beta, w->xb, w->ssm_bg, T)) || (s = pkv_k_unary(dev, &beta)) ||
            (s = matmul_at(dev, &sw->ssm.alpha, w->xb, gate.x, T)) ||
            (f->lora && (s = pkv_lora_delta(f, dev, &sw->ssm.alpha, w->xb, gate.x, T))) || (s = pkv_k_unary(dev, &gate)) ||
            (s = pkv_k_ssm_conv(dev, &cv)) || (s = pkv_k_l2_norm(dev, &l2)) || (s = pkv_k_delta_net(dev, &dn)) ||
            (s = pkv_blk_rmsnorm(dev, w->ssm_o, &sw->ssm.norm, w->ssm_o, T * Hv, dv, hp->rms_eps)) ||
            (s = pkv_k_swiglu(dev, &zg)) || (s = pkv_blk_matmul(f, dev, &sw->ssm.out, w->ssm_o, w->y, T)))
            return s;
    }
    return reduce(m, ws, w0, T, NULL);
}

void pkv_mamba2_state_desc(const pkv_hparams *hp, pkv_kv_layer_desc *d) {
    const int R = hp->ssm.n_v_heads / hp->ssm.n_k_heads, N = hp->ssm.d_k, P = hp->ssm.d_v;
    d->n_kv_heads = hp->ssm.n_k_heads;
    d->state_per_head = (hp->ssm.d_conv - 1) * (R * P + 2 * N) + R * P * N;
    int n = 0; /* the hparams hook refuses a conv kernel whose parts the cache cannot describe */
    for (int t = 0; t < hp->ssm.d_conv - 1 && n + 3 < PKV_KV_STATE_MAX_PARTS; t++) {
        d->state_part[n++] = R * P;
        d->state_part[n++] = N;
        d->state_part[n++] = N;
    }
    d->state_part[n++] = R * P * N;
    d->state_n_parts = n;
}

pkv_status pkv_blk_mamba2(pkv_fwd *f, int il, const pkv_mamba2_kind *kind) {
    const pkv_model *m = f->m;
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    const pkv_fwd_plan *pl = f->pl;
    pkv_fwd_ws *ws = f->ws;
    pkv_dev_ws *w0 = pkv_fwd_dev(ws, m->dev);
    const int64_t T = f->T, E = hp->n_embd, N = hp->ssm.d_k, P = hp->ssm.d_v, hg = hp->ssm.n_v_heads / hp->ssm.n_k_heads;
    pkv_status s;
    PKV_CHECK_INTERNAL(ly->recurrent && pl->state);
    if ((s = pkv_blk_rmsnorm(m->dev, w0->x, kind->norm, w0->xb, T, E, hp->rms_eps))) return s;
    for (int d = 0; d < (ly->rec_first ? 1 : m->n_dev); d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        pkv_dev_ws *w = pkv_fwd_dev(ws, dev);
        /* this shard: groups ng, heads nh, conv channels C = [x | B | C] */
        const int64_t ng = sw->n_kv, nh = sw->n_q, C = nh * P + 2 * ng * N, conv = (int64_t)(hp->ssm.d_conv - 1) * C;
        pkv_kv_shard_info sh;
        if ((s = pkv_blk_state_shard(f, il, d, (size_t)(conv + nh * P * N) * 4, &sh))) return s;
        const size_t stride = sh.state_slot_bytes;
        const pkv_tref meta = R(w->ints, pl->off_smeta * 4);
        pkv_k_ssm_conv_args cv = {.x = R(w->ssm_u, 0), .w = R(sw->ssm.conv.buf, 0), .y = R(w->ssm_u, 0),
                                  .state = R(sh.state, sh.state_off), .state_stride = stride, .n_slots = sh.n_state_slots,
                                  .meta = meta, .n_tok = T, .channels = C, .n_seq = pl->n_seqs, .d_conv = hp->ssm.d_conv};
        pkv_k_unary_args act = {.x = R(w->ssm_u, 0), .y = R(w->ssm_u, 0), .n = T * C, .op = PKV_UNARY_SILU,
                                .bias = R(sw->ssm.conv_b.buf, 0), .bias_len = sw->ssm.conv_b.buf ? C : 0};
        pkv_k_ssm_scan_args sc = {.x = R(w->ssm_u, 0), .B = R(w->ssm_u, (size_t)(nh * P) * 4),
                                  .C = R(w->ssm_u, (size_t)(nh * P + ng * N) * 4), .x_stride = (size_t)C * 4,
                                  .B_stride = (size_t)C * 4, .C_stride = (size_t)C * 4, .dt = R(w->ssm_bg, 0),
                                  .dt_bias = R(sw->ssm.dt.buf, 0), .A = R(sw->ssm.a.buf, 0), .D = R(sw->ssm.d.buf, 0),
                                  .y = R(w->ssm_o, 0), .state = R(sh.state, sh.state_off + (size_t)conv * 4),
                                  .state_stride = stride, .n_slots = sh.n_state_slots, .meta = meta, .n_tok = T,
                                  .n_seq = pl->n_seqs, .n_head = (int)nh, .head_dim = (int)P, .n_group = (int)ng,
                                  .d_state = (int)N};
        /* y * silu(z), then the group norm: weightless per group, times ssm_norm */
        pkv_k_swiglu_args zg = {.g = R(w->ssm_z, 0), .u = R(w->ssm_o, 0), .y = R(w->ssm_o, 0), .n = T * nh * P};
        pkv_k_unary_args gw = {.x = R(w->ssm_o, 0), .y = R(w->ssm_o, 0), .n = T * nh * P, .op = PKV_UNARY_ID,
                               .mul = R(sw->ssm.gnorm.buf, 0), .mul_len = nh * P};
        if ((s = move(w0->xb, w->xb, (size_t)(T * E) * 4)) || (s = pkv_blk_matmul(f, dev, &sw->ssm.qkv, w->xb, w->ssm_u, T)) ||
            (s = pkv_blk_matmul(f, dev, &sw->ssm.z, w->xb, w->ssm_z, T)) ||
            (s = pkv_blk_matmul(f, dev, &sw->ssm.beta, w->xb, w->ssm_bg, T)) || (s = pkv_k_ssm_conv(dev, &cv)) ||
            (s = pkv_k_unary(dev, &act)) || (s = pkv_k_ssm_scan(dev, &sc)) || (s = pkv_k_swiglu(dev, &zg)) ||
            (s = pkv_blk_rmsnorm(dev, w->ssm_o, &sw->ssm.norm, w->ssm_o, T * ng, hg * P, hp->rms_eps)) ||
            (s = pkv_k_unary(dev, &gw)) || (s = pkv_blk_matmul(f, dev, &sw->ssm.out, w->ssm_o, w->y, T)))
            return s;
    }
    /* rec_first: the whole output is the first device's (the model's main one) */
    return ly->rec_first ? residual_add(m, w0->x, w0->y, T * E) : reduce(m, ws, w0, T, NULL);
}

void pkv_short_conv_state_desc(const pkv_hparams *hp, pkv_kv_layer_desc *d) {
    const int c = hp->n_embd / hp->shortconv.n_unit;
    d->n_kv_heads = hp->shortconv.n_unit;
    d->state_per_head = (hp->shortconv.l_cache - 1) * c;
    d->state_n_parts = hp->shortconv.l_cache - 1; /* at most PKV_SSM_CONV_MAX - 1 (the model refuses more) */
    for (int t = 0; t < d->state_n_parts; t++) d->state_part[t] = c;
}

pkv_status pkv_blk_short_conv(pkv_fwd *f, int il, const pkv_short_conv_kind *kind) {
    const pkv_model *m = f->m;
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    const pkv_fwd_plan *pl = f->pl;
    pkv_fwd_ws *ws = f->ws;
    pkv_dev_ws *w0 = pkv_fwd_dev(ws, m->dev);
    const int64_t T = f->T, E = hp->n_embd, c = E / hp->shortconv.n_unit, L = hp->shortconv.l_cache;
    pkv_status s;
    PKV_CHECK_INTERNAL(ly->recurrent && pl->state);
    const size_t xbytes = (size_t)T * (size_t)E * 4;
    if ((s = pkv_blk_rmsnorm(m->dev, w0->x, kind->norm, w0->xb, T, E, hp->rms_eps))) return s;
    for (int d = 0; d < m->n_dev; d++) {
        const pkv_shard_w *sw = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        pkv_dev_ws *w = pkv_fwd_dev(ws, dev);
        const int64_t n = sw->n_kv * c; /* this shard's channels */
        pkv_kv_shard_info sh;
        if ((s = pkv_blk_state_shard(f, il, d, (size_t)((L - 1) * n) * 4, &sh))) return s;
        /* B in ssm_u, C in ssm_z, x in ssm_o: bx = B x; conv; y = C conv */
        pkv_k_unary_args bx = {.x = R(w->ssm_o, 0), .y = R(w->ssm_o, 0), .n = T * n, .op = PKV_UNARY_ID,
                               .mul = R(w->ssm_u, 0), .mul_len = T * n};
        pkv_k_ssm_conv_args cv = {.x = R(w->ssm_o, 0), .w = R(sw->sc.conv.buf, 0), .y = R(w->ssm_o, 0),
                                  .state = R(sh.state, sh.state_off), .state_stride = sh.state_slot_bytes,
                                  .n_slots = sh.n_state_slots, .meta = R(w->ints, pl->off_smeta * 4), .n_tok = T,
                                  .channels = n, .n_seq = pl->n_seqs, .d_conv = (int)L, .silu = false};
        pkv_k_unary_args cy = bx;
        cy.mul = R(w->ssm_z, 0);
        if ((s = move(w0->xb, w->xb, xbytes)) || (s = pkv_blk_matmul(f, dev, &sw->sc.in_b, w->xb, w->ssm_u, T)) ||
            (s = pkv_blk_matmul(f, dev, &sw->sc.in_c, w->xb, w->ssm_z, T)) ||
            (s = pkv_blk_matmul(f, dev, &sw->sc.in_x, w->xb, w->ssm_o, T)) || (s = pkv_k_unary(dev, &bx)) ||
            (s = pkv_k_ssm_conv(dev, &cv)) || (s = pkv_k_unary(dev, &cy)) ||
            (s = pkv_blk_matmul(f, dev, &sw->sc.out, w->ssm_o, w->y, T)))
            return s;
    }
    return reduce(m, ws, w0, T, NULL);
}

pkv_status pkv_blk_embed(pkv_fwd *f) {
    const pkv_model *m = f->m;
    const pkv_fwd_batch *b = f->b;
    const int64_t T = f->T, E = m->hp.n_embd;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, m->dev);
    pkv_k_get_rows_args ge = {.w = R(m->tok_embd.buf, 0), .wtype = m->tok_embd.type, .n_vocab = m->hp.n_vocab, .cols = E,
                              .ids = R(w0->ints, f->pl->off_ids * 4), .out = R(w0->x, 0), .n = T, .scale = m->hp.embd_scale};
    pkv_status s = pkv_k_get_rows(m->dev, &ge);
    /* an adapter of token_embd adds to its rows (the media rows below replace theirs) */
    if (!s && f->lora) s = pkv_lora_embed(f, m->dev, ge.ids, w0->x);
    /* media rows replace their tokens' rows, unscaled (Gemma scales token
     * embeddings only), one write per run of consecutive media tokens */
    for (int64_t k = 0, r = 0; !s && b->media_embd && k < T;) {
        if (!pkv_token_is_media(b->tokens[k])) {
            k++;
            continue;
        }
        int64_t k1 = k;
        while (k1 < T && pkv_token_is_media(b->tokens[k1])) k1++;
        s = pkv_buffer_write(w0->x, (size_t)(k * E) * 4, b->media_embd + (size_t)(r * E), (size_t)((k1 - k) * E) * 4);
        r += k1 - k;
        k = k1;
    }
    return s;
}

pkv_status pkv_blk_nextn_input(pkv_fwd *f) {
    const pkv_model *m = f->m;
    pkv_status s = pkv_blk_embed(f);
    if (s || !m->mtp) return s;
    const int64_t T = f->T, E = m->hp.n_embd;
    pkv_device *dev = m->dev;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, dev);
    if (!f->b->hidden_in) s = pkv_err(PKV_ERR_INVALID, "forward: an MTP head needs the target's hidden states");
    if (!s) s = pkv_blk_rmsnorm(dev, w0->x, &m->nextn.enorm, w0->x, T, E, m->hp.rms_eps);
    if (!s) s = pkv_blk_matmul(f, dev, &m->nextn.eh_e, w0->x, w0->xb, T);
    if (!s) s = pkv_buffer_write(w0->y, 0, f->b->hidden_in, (size_t)(T * E) * 4);
    if (!s) s = pkv_blk_rmsnorm(dev, w0->y, &m->nextn.hnorm, w0->y, T, E, m->hp.rms_eps);
    if (!s) s = pkv_blk_matmul(f, dev, &m->nextn.eh_h, w0->y, w0->x, T);
    if (!s) s = add(dev, w0->x, w0->xb, T * E);
    return s;
}

pkv_status pkv_blk_logits(pkv_fwd *f, float *logits) {
    const pkv_model *m = f->m;
    const pkv_fwd_plan *pl = f->pl;
    const int64_t T = f->T, E = m->hp.n_embd;
    pkv_device *dev = m->dev;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, dev);
    pkv_status s;
    if (f->b->hidden_out) { /* every row's final norm, kept; then the rows that need logits */
        s = pkv_blk_rmsnorm(dev, w0->x, &m->output_norm, w0->xb, T, E, m->hp.rms_eps);
        if (!s) s = pkv_buffer_read(w0->xb, 0, f->b->hidden_out, (size_t)(T * E) * 4);
        pkv_k_get_rows_args g = {.w = R(w0->xb, 0), .wtype = PKV_TYPE_F32, .n_vocab = T, .cols = E,
                                 .ids = R(w0->ints, pl->off_out * 4), .out = R(w0->y, 0), .n = pl->n_out};
        if (!s) s = pkv_k_get_rows(dev, &g);
        if (!s) s = pkv_blk_matmul(f, dev, &m->output, w0->y, w0->logits, pl->n_out);
    } else { /* gather the rows that need logits, final norm, output projection */
        pkv_k_get_rows_args g = {.w = R(w0->x, 0), .wtype = PKV_TYPE_F32, .n_vocab = T, .cols = E,
                                 .ids = R(w0->ints, pl->off_out * 4), .out = R(w0->xb, 0), .n = pl->n_out};
        s = pkv_k_get_rows(dev, &g);
        if (!s) s = pkv_blk_rmsnorm(dev, w0->xb, &m->output_norm, w0->xb, pl->n_out, E, m->hp.rms_eps);
        if (!s) s = pkv_blk_matmul(f, dev, &m->output, w0->xb, w0->logits, pl->n_out);
    }
    if (!s && logits) s = pkv_buffer_read(w0->logits, 0, logits, (size_t)pl->n_out * (size_t)m->hp.n_vocab * 4);
    return s;
}
