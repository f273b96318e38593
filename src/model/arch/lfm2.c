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
 * attention layer by KV-head groups.
 *
 * lfm2moe (LFM2-8B-A1B): the same layers; after leading_dense_block_count dense
 * ones, the FFN is a mixture of experts as llama.cpp's build_moe_ffn runs it for
 * LFM2: expert_gating_func (required; sigmoid in the released files) scores, the
 * top k chosen on scores + exp_probs_b (required), weighted by the unbiased scores
 * divided by their sum (pkv_blk_moe). As llama.cpp, expert_weights_norm and
 * expert_weights_scale are not read (LFM2's converter writes neither): the weights
 * are always normalised and never scaled. */
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
    if (hp->moe.n_expert) { /* lfm2moe (the expert keys, required, are read with the common ones) */
        if ((s = pkv_hp_opt_u32(g, arch, "leading_dense_block_count", 0, (uint32_t)hp->n_layer, 0, &hp->shortconv.n_dense)))
            return s;
        if (!hp->moe_route.gating)
            return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.expert_gating_func' not found (llama.cpp requires it for %s)", lab,
                           arch, arch);
    }
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
    if (!m->hp.moe.n_expert || il < m->hp.shortconv.n_dense) return pkv_load_ffn(L, il, false);
    if ((s = pkv_load_moe(L, il, PKV_MOE_PROBS_B))) return s;
    if (!ly->moe.probs_b.buf)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor 'blk.%d.exp_probs_b.bias' not found (the routing bias of a %s mixture "
                       "layer)", m->label, il, pkv_arch_name(m->hp.arch));
    return PKV_OK;
}

/* expert_gating_func, llama.cpp's values: 1 softmax, 2 sigmoid, 3 softmax of the top k */
static pkv_moe_gating gating_of(const pkv_hparams *hp) {
    return hp->moe_route.gating == 1 ? PKV_MOE_SOFTMAX_TOPK
           : hp->moe_route.gating == 3 ? PKV_MOE_TOPK_SOFTMAX
                                       : PKV_MOE_SIGMOID_TOPK;
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = ly->recurrent ? pkv_blk_short_conv(f, il, &(pkv_short_conv_kind){.norm = &ly->attn_norm})
                                 : pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true});
    if (s) return s;
    const pkv_hparams *hp = &f->m->hp;
    if (!ly->moe.router.buf) return pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
    return pkv_blk_moe(f, il, &(pkv_moe_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU, .gating = gating_of(hp),
                                              .norm_w = true});
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
    if (p->n_layer > 64) return pkv_err(PKV_ERR_INVALID, "mkmodel: %s takes at most 64 layers, not %d", p->arch, p->n_layer);
    if (pkv_arch_ops_find(p->arch)->moe) { /* lfm2moe: 4 experts, 2 used, by default */
        if (!p->n_expert) p->n_expert = 4;
        if (!p->n_expert_used) p->n_expert_used = 2;
    }
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

/* lfm2moe: the first layer dense, sigmoid routing (llama.cpp's converter's keys) */
static pkv_status mk_keys(pkv_mk *b) {
    if (b->p->n_expert) {
        PKV_MK_TRY(pkv_mk_expert_keys(b, b->p->n_ff));
        PKV_MK_TRY(pkv_mk_u32(b, "leading_dense_block_count", 1));
        PKV_MK_TRY(pkv_mk_u32(b, "expert_gating_func", 2));
    }
    return pkv_mk_u32(b, "shortconv.l_cache", 3);
}

/* lfm2moe's layers after the first are mixtures (with exp_probs_b). */
static pkv_status mk_layer(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E;
    const pkv_ffn_tensors ffn = p->n_expert && l > 0 ? PKV_FFN_EXPERTS : PKV_FFN_GATED;
    if (mk_attends(l)) {
        PKV_MK_TRY(pkv_mk_layer(b, l, &(pkv_attn_tensors){.qk_norm = true}, NULL, ffn, false));
    } else {
        PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
        PKV_MK_TRY(pkv_mk_blk(b, l, "shortconv.in_proj.weight", p->type, E, 3 * E, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk(b, l, "shortconv.conv.weight", PKV_TYPE_F32, 3, E, 0.0, 0.5));
        PKV_MK_TRY(pkv_mk_blk(b, l, "shortconv.out_proj.weight", p->type, E, E, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_norm(b, l, "ffn_norm.weight", E));
        PKV_MK_TRY(pkv_mk_ffn(b, l, ffn));
    }
    return ffn == PKV_FFN_EXPERTS ? pkv_mk_moe_extras(b, l, PKV_MOE_PROBS_B, 0) : PKV_OK;
}

/* lfm2 and lfm2moe differ in their FFN only (the expert keys) */
#define LFM2_MK(takes_)                                                                                                \
    {.takes = (takes_), .rope_base = 1000000.0f, .rms_eps = 1e-5f, .check = mk_check, .check_rows = mk_check_rows,       \
     .sizes = mk_sizes, .keys = mk_keys, .layer = mk_layer}
#define LFM2_OPS(name_, moe_, mk_)                                                                                     \
    {.name = (name_), .moe = (moe_), .moe_after_dense = (moe_), .rope_neox = true, .kv0_recurrent = true,               \
     .output_norm = "token_embd_norm.weight", .hparams = hparams, .load_layer = load_layer, .layer = layer,            \
     .state_desc = state_desc, .mk = (mk_)}

static const pkv_arch_mk mk = LFM2_MK(0), mk_moe = LFM2_MK(PKV_MK_EXPERTS);
const pkv_arch_ops pkv_arch_lfm2 = LFM2_OPS("lfm2", false, &mk), pkv_arch_lfm2moe = LFM2_OPS("lfm2moe", true, &mk_moe);
