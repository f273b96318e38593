/* lfm2: Liquid LFM2 / LFM2.5. Most layers are gated short convolutions with a small
 * per-sequence conv state (l_cache - 1 inputs of every channel, kept in the cache's
 * state slots); the others are GQA attention with per-head Q/K norms. Which is which
 * is llama.cpp's rule: a layer whose attention.head_count_kv entry is 0 is a
 * convolution (kv0_recurrent). Every layer has a SwiGLU FFN behind ffn_norm. The
 * final norm is the tensor llama.cpp names token_embd_norm (it is applied after the
 * last layer, not to the embedding). RoPE: neox.
 *
 *   conv:       x += out_proj·(C * conv(B * u))   B, C, u = in_proj·attn_norm(x)   (pkv_blk_short_conv)
 *   attention:  x += o(attention(rope(q_norm(q)), rope(k_norm(k)), v))      of attn_norm(x)
 *   both:       x += down(silu(gate·h) * (up·h))        h = ffn_norm(x)
 *
 * Split over several devices, a conv layer goes by channel blocks of
 * n_embd / head_count channels (the unit, hp.shortconv.n_unit = head_count: its
 * channels' in_proj rows, taps, state and out_proj columns on one device), an
 * attention layer by KV-head groups. */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    const char *lab = pkv_gguf_label(g);
    pkv_status s = pkv_hp_need_u32(g, arch, "shortconv.l_cache", 2, PKV_SSM_CONV_MAX, &hp->shortconv.l_cache);
    if (s) return s;
    hp->shortconv.n_unit = n_head[0];
    if (hp->n_embd % hp->shortconv.n_unit)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.embedding_length' %d is not a multiple of '%s.attention.head_count' %d (the "
                       "short convolutions' channel blocks)", lab, arch, hp->n_embd, arch, hp->shortconv.n_unit);
    if (hp->head_dim_k != hp->head_dim_v)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.key_length' %d and 'value_length' %d differ", lab, arch,
                       hp->head_dim_k, hp->head_dim_v);
    if (pkv_gguf_find_tensor(g, "dense_2_out.weight")) /* LFM2-ColBert's embedding head */
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor 'dense_2_out.weight' (LFM2-ColBert's output projection) is not "
                       "supported", lab);
    if ((s = pkv_hp_window(g, arch, hp, false))) return s;
    if (hp->swa.n > 0) /* the forward pass keeps no window pool beside recurrent state */
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: key '%s.attention.sliding_window' %d: sliding-window attention beside "
                       "short convolutions is not supported", lab, arch, hp->swa.n);
    return PKV_OK;
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_model *m = pkv_loader_model(L);
    pkv_layer *ly = &m->layers[il];
    pkv_status s;
    ly->recurrent = m->hp.recurrent >> il & 1;
    if ((s = pkv_load_norm(L, il, "attn_norm.weight", &ly->attn_norm)) ||
        (s = ly->recurrent ? pkv_load_short_conv(L, il)
                           : pkv_load_attention(L, il, &(pkv_attn_tensors){.qk_norm = true, .fused_qkv = true})) ||
        (s = pkv_load_norm(L, il, "ffn_norm.weight", &ly->ffn_norm)))
        return s;
    return pkv_load_ffn(L, il, false);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = ly->recurrent ? pkv_blk_short_conv(f, il, &(pkv_short_conv_kind){.norm = &ly->attn_norm})
                                 : pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true});
    if (s) return s;
    return pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

static void state_desc(const pkv_model *m, int il, pkv_kv_layer_desc *d) {
    (void)il;
    pkv_short_conv_state_desc(&m->hp, d);
}

/* ------------------------------------------------------- pagekv mkmodel */

/* Layer l attends when l % 3 == 2 (LFM2-1.2B: 6 of 16), else it convolves. */
static bool mk_attends(int l) { return l % 3 == 2; }

/* Six layers by default, two of them attention. */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (!p->n_layer) p->n_layer = 6;
    if (p->n_layer > 64) return pkv_err(PKV_ERR_INVALID, "mkmodel: lfm2 takes at most 64 layers, not %d", p->n_layer);
    return PKV_OK;
}

static pkv_status mk_check_rows(const pkv_mkmodel_params *p, size_t blk) {
    (void)blk;
    if (p->n_embd % p->n_head)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: lfm2's width %d must be a multiple of its %d heads (the conv's channel "
                       "blocks)", p->n_embd, p->n_head);
    return PKV_OK;
}

/* head_count_kv per layer: 0 on the conv layers. */
static pkv_status mk_sizes(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    int32_t kv[64];
    for (int l = 0; l < p->n_layer; l++) kv[l] = mk_attends(l) ? p->n_head_kv : 0;
    PKV_MK_TRY(pkv_mk_u32(b, "feed_forward_length", (uint32_t)p->n_ff));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.head_count", (uint32_t)p->n_head));
    return pkv_mk_arr(b, "attention.head_count_kv", PKV_GGUF_INT32, kv, (uint64_t)p->n_layer);
}

static pkv_status mk_keys(pkv_mk *b) { return pkv_mk_u32(b, "shortconv.l_cache", 3); }

static pkv_status mk_layer(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E;
    if (mk_attends(l))
        return pkv_mk_layer(b, l, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_GATED, false);
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
    PKV_MK_TRY(pkv_mk_blk(b, l, "shortconv.in_proj.weight", p->type, E, 3 * E, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "shortconv.conv.weight", PKV_TYPE_F32, 3, E, 0.0, 0.5));
    PKV_MK_TRY(pkv_mk_blk(b, l, "shortconv.out_proj.weight", p->type, E, E, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_norm(b, l, "ffn_norm.weight", E));
    return pkv_mk_ffn(b, l, PKV_FFN_GATED);
}

static const pkv_arch_mk mk = {.rope_base = 1000000.0f, .rms_eps = 1e-5f, .check = mk_check, .check_rows = mk_check_rows,
                               .sizes = mk_sizes, .keys = mk_keys, .layer = mk_layer};
const pkv_arch_ops pkv_arch_lfm2 = {.name = "lfm2", .rope_neox = true, .kv0_recurrent = true,
                                    .output_norm = "token_embd_norm.weight", .hparams = hparams,
                                    .load_layer = load_layer, .layer = layer, .state_desc = state_desc, .mk = &mk};
