/* glm4moe: GLM-4.5, GLM-4.6, GLM-4.7 (and GLM-4.5-Air). Attention with Q/K/V
 * biases (where the file has them) and, where the file has attn_q_norm and
 * attn_k_norm, per-head Q/K RMS norms; neox RoPE over the first
 * rope.dimension_count dims of each head (GLM rotates half); the first
 * leading_dense_block_count layers have a dense SwiGLU FFN, the others a mixture of
 * experts with llama.cpp's routing for this architecture: sigmoid scores, selected
 * with the exp_probs_b bias, weights the unbiased scores (normalized where
 * expert_weights_norm, times expert_weights_scale), in expert groups where the file
 * has them, plus the shared expert. The FFN's norm is post_attention_norm.
 *
 *   x += o(attention(rope(q_norm(q + bq)), rope(k_norm(k + bk)), v + bv))    of attn_norm(x)
 *   x += dense:  down(silu(gate·h) * (up·h))                                  h = post_attention_norm(x)
 *        MoE:    sum over the chosen experts e of w_e * ffn_e(h) + ffn_shexp(h)
 *
 * The MTP ("nextn") layers after the trunk (nextn_predict_layers) are not run with
 * it; the first loads alone as an MTP head (pkv_model_params.mtp), as qwen35's:
 * x = eh_e·enorm(embed(token)) + eh_h·hnorm(h), then this layer (a MoE one). */

#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    const int n_layer_all = hp->n_layer;
    int dense = 0;
    pkv_status s = pkv_hp_opt_u32(g, arch, "nextn_predict_layers", 0, (uint32_t)n_layer_all - 1, 0, &hp->n_nextn);
    if (s) return s;
    hp->n_layer = n_layer_all - hp->n_nextn;
    if ((s = pkv_hp_opt_u32(g, arch, "leading_dense_block_count", 0, (uint32_t)hp->n_layer, 0, &dense))) return s;
    /* the expert keys are read with the common ones (pkv_arch_ops.moe_after_dense) */
    if (dense < n_layer_all && hp->moe.n_expert == 0)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.leading_dense_block_count' %d of %d layers: the others are mixtures of "
                       "experts, but the file has no '%s.expert_count'", lab, arch, dense, n_layer_all, arch);
    if (hp->moe.n_expert && (s = pkv_hp_need_u32(g, arch, "expert_shared_count", 0, 64, &hp->moe_route.n_shared)))
        return s;
    if (hp->head_dim_k != hp->head_dim_v)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.key_length' %d and 'value_length' %d differ (llama.cpp requires "
                       "them equal for %s)", lab, arch, hp->head_dim_k, hp->head_dim_v, arch);
    /* GLM-4.6V's M-RoPE: text-only files have no sections (or all zero) */
    char k[128];
    snprintf(k, sizeof k, "%s.rope.dimension_sections", arch);
    if (pkv_gguf_find_key(g, k) >= 0) {
        pkv_gguf_array a;
        if ((s = pkv_gguf_get_arr(g, k, PKV_GGUF_TYPE_COUNT, &a))) return s;
        for (uint64_t i = 0; i < a.count; i++)
            if (a.type == PKV_GGUF_STRING || a.type == PKV_GGUF_FLOAT32 || a.type == PKV_GGUF_FLOAT64 ||
                pkv_gguf_arr_int(&a, i) != 0)
                return pkv_err(PKV_ERR_UNSUPPORTED, "%s: key '%s' (M-RoPE sections, GLM-4.6V) is not supported for %s",
                               lab, k, arch);
    }
    return PKV_OK;
}

/* Whether layer il of the model (the file's layer_base + il) has a dense FFN. */
static pkv_status is_dense(pkv_loader *L, int il, bool *dense) {
    const pkv_model *m = pkv_loader_model(L);
    const char *arch = pkv_arch_name(m->hp.arch);
    int n = 0;
    pkv_status s = pkv_hp_opt_u32(pkv_loader_gguf(L), arch, "leading_dense_block_count", 0, 1u << 30, 0, &n);
    *dense = m->hp.layer_base + il < n;
    return s;
}

/* Q/K norms on a layer that has both tensors; one without the other is refused. */
static pkv_status has_qk_norm(pkv_loader *L, int il, bool *qk) {
    const pkv_model *m = pkv_loader_model(L);
    char q[96], k[96];
    const int fl = m->hp.layer_base + il;
    snprintf(q, sizeof q, "blk.%d.attn_q_norm.weight", fl);
    snprintf(k, sizeof k, "blk.%d.attn_k_norm.weight", fl);
    const bool hq = pkv_gguf_find_tensor(pkv_loader_gguf(L), q) != NULL, hk = pkv_gguf_find_tensor(pkv_loader_gguf(L), k) != NULL;
    *qk = hq;
    if (hq != hk)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' %s but '%s' %s: Q and K norms come together", m->label, q,
                       hq ? "is present" : "is absent", k, hk ? "is present" : "is absent");
    return PKV_OK;
}

/* A mixture layer: the experts, exp_probs_b (llama.cpp requires it for this
 * architecture) and the shared experts' FFN of expert_shared_count expert widths. */
static pkv_status load_moe(pkv_loader *L, int il) {
    const pkv_model *m = pkv_loader_model(L);
    const pkv_hparams *hp = &m->hp;
    const pkv_layer *ly = &m->layers[il];
    const int fl = hp->layer_base + il;
    pkv_status s = pkv_load_moe(L, il, PKV_MOE_PROBS_B | (hp->moe_route.n_shared > 0 ? PKV_MOE_SHARED : 0));
    if (s) return s;
    if (!ly->moe.probs_b.buf)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor 'blk.%d.exp_probs_b.bias' not found (the routing bias of a %s mixture "
                       "layer)", m->label, fl, pkv_arch_name(hp->arch));
    const int64_t want = (int64_t)hp->moe.n_ff * hp->moe_route.n_shared;
    if (hp->moe_route.n_shared > 0 && ly->moe.sh_gate.ne1 != want)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor 'blk.%d.ffn_gate_shexp.weight' has %lld rows, expected %lld "
                       "('%s.expert_feed_forward_length' %d times 'expert_shared_count' %d)", m->label, fl,
                       (long long)ly->moe.sh_gate.ne1, (long long)want, pkv_arch_name(hp->arch), hp->moe.n_ff,
                       hp->moe_route.n_shared);
    return PKV_OK;
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_layer *ly = &pkv_loader_model(L)->layers[il];
    bool dense = false, qk = false;
    pkv_status s;
    if ((s = is_dense(L, il, &dense)) || (s = has_qk_norm(L, il, &qk))) return s;
    if (dense) return pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qk_norm = qk}, "post_attention_norm.weight", PKV_FFN_GATED);
    if ((s = pkv_load_norm(L, il, "attn_norm.weight", &ly->attn_norm)) ||
        (s = pkv_load_attention(L, il, &(pkv_attn_tensors){.qk_norm = qk})) ||
        (s = pkv_load_norm(L, il, "post_attention_norm.weight", &ly->ffn_norm)))
        return s;
    return load_moe(L, il);
}

/* expert_gating_func: llama.cpp's default for this architecture is sigmoid */
static pkv_moe_gating gating_of(const pkv_hparams *hp) {
    return hp->moe_route.gating == 1 ? PKV_MOE_SOFTMAX_TOPK
           : hp->moe_route.gating == 3 ? PKV_MOE_TOPK_SOFTMAX
                                       : PKV_MOE_SIGMOID_TOPK;
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_hparams *hp = &f->m->hp;
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = ly->sh[0].q_norm.buf != NULL});
    if (s) return s;
    if (!ly->moe.router.buf) return pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
    return pkv_blk_moe(f, il, &(pkv_moe_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU, .gating = gating_of(hp),
                                              .norm_w = hp->moe_route.norm_w, .w_scale = hp->moe_route.w_scale});
}

/* ------------------------------------------------------- pagekv mkmodel */


/* Three layers (the first dense) and one MTP layer by default. */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (!p->n_layer) p->n_layer = 3;
    if (!p->n_expert) p->n_expert = 4;
    if (!p->n_expert_used) p->n_expert_used = 2;
    if (p->n_mtp == 0) p->n_mtp = 1;
    else if (p->n_mtp < 0) p->n_mtp = 0;
    if (p->n_mtp > 4) return pkv_err(PKV_ERR_INVALID, "mkmodel: %d MTP layers: glm4moe takes 0 to 4", p->n_mtp);
    if ((p->head_dim ? p->head_dim : p->n_embd / (p->n_head ? p->n_head : 4)) % 4)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: glm4moe rotates half of each head: the head size must be a multiple of 4");
    return PKV_OK;
}

static pkv_status mk_keys(pkv_mk *b) {
    PKV_MK_TRY(pkv_mk_expert_keys(b, b->p->n_ff));
    PKV_MK_TRY(pkv_mk_u32(b, "leading_dense_block_count", 1));
    PKV_MK_TRY(pkv_mk_u32(b, "expert_shared_count", 1));
    PKV_MK_TRY(pkv_mk_f32(b, "expert_weights_scale", 2.5f));
    PKV_MK_TRY(pkv_gguf_writer_add_bool(b->w, pkv_mk_key(b, "expert_weights_norm"), true));
    return pkv_mk_u32(b, "expert_gating_func", 2); /* sigmoid */
}

/* Layer 0 dense, the others (MTP layers too) mixtures with exp_probs_b and a shared
 * expert; Q/K norms on the odd layers (GLM-4.5 has them, GLM-4.5-Air not: both
 * kinds in one file). An MTP layer adds its nextn tensors. */
static pkv_status mk_layer(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const pkv_attn_tensors at = {.qkv_bias = true, .qk_norm = l % 2 == 1};
    if (l == 0) return pkv_mk_layer(b, l, &at, "post_attention_norm.weight", PKV_FFN_GATED, false);
    PKV_MK_TRY(pkv_mk_layer(b, l, &at, "post_attention_norm.weight", PKV_FFN_EXPERTS, false));
    PKV_MK_TRY(pkv_mk_moe_extras(b, l, PKV_MOE_PROBS_B | PKV_MOE_SHARED, p->n_ff));
    if (l < p->n_layer) return PKV_OK;
    return pkv_mk_nextn(b, l);
}

static const pkv_arch_mk mk = {.takes = PKV_MK_EXPERTS | PKV_MK_MTP,
                               .rope_base = 1000000.0f,
                               .rope_half = true,
                               .rms_eps = 1e-5f,
                               .head_keys = true,
                               .check = mk_check,
                               .keys = mk_keys,
                               .layer = mk_layer};

const pkv_arch_ops pkv_arch_glm4moe = {.name = "glm4moe",
                                       .moe_after_dense = true,
                                       .rope_neox = true,
                                       .hparams = hparams,
                                       .load_layer = load_layer,
                                       .layer = layer,
                                       .load_global = pkv_load_nextn,
                                       .mtp_head = true,
                                       .input = pkv_blk_nextn_input,
                                       .mk = &mk};
