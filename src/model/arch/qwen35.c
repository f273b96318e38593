/* qwen35: Qwen3.5 (dense), and qwen35moe: Qwen3.5/3.6-MoE (Qwen3.6-35B-A3B), the same
 * layers with a mixture of experts in place of every FFN (the MTP layer's too): the
 * top k of the router's softmax, renormalised, times expert_weights_scale where
 * given, plus a shared expert gated per token by sigmoid(ffn_gate_inp_shexp · h).
 * Three of every four layers are gated delta-net linear
 * attention with a fixed-size recurrent state per sequence (kept in the cache's
 * state slots); the fourth is full attention whose Q projection also gives a
 * per-head output gate. Both kinds have a SwiGLU FFN behind a norm named
 * post_attention_norm. RoPE: llama.cpp's interleaved M-RoPE, which for text (every
 * section at the token's position) is plain neox RoPE over rope.dimension_count
 * dims; files whose sections leave dims at the fourth section's position 0 are
 * refused.
 *
 *   recurrent:  x += delta_net(attn_norm(x))            (blocks.h: pkv_blk_delta_net)
 *   attention:  x += o(attention(rope(q_norm(q)), rope(k_norm(k)), v) * sigmoid(gate))   of attn_norm(x)
 *   both:       x += down(silu(gate·h) * (up·h))        h = post_attention_norm(x)
 *   (qwen35moe: x += sum over the top k experts e of w_e down_e(silu(gate_e·h) * (up_e·h))
 *                    + sigmoid(gate_inp_shexp·h) down_sh(silu(gate_sh·h) * (up_sh·h)))
 *
 * Split over several devices, a delta-net layer goes by key-head groups (each device
 * its key heads, their value heads and that part of the recurrent state, kept in the
 * cache's state slots of its shard), an attention layer by KV-head groups.
 *
 * The MTP ("nextn") layers after the trunk (nextn_predict_layers) are not run with
 * it; the first of them loads alone as an MTP head (pkv_model_params.mtp), its
 * input from the target's hidden state h of the previous position:
 *   x = eh_e·enorm(embed(token)) + eh_h·hnorm(h)     eh_e, eh_h: nextn.eh_proj's column halves */
#include <math.h>
#include <string.h>

#include "model/arch/arch.h"
#include "model/arch/mk.h"

/* Which layers are recurrent: attention.recurrent_layers (one bool per layer, MTP
 * layers included), else every layer but each full_attention_interval-th. */
static pkv_status pattern(const pkv_gguf *g, const char *arch, pkv_hparams *hp, int n_layer_all) {
    const char *lab = pkv_gguf_label(g);
    char k[128];
    snprintf(k, sizeof k, "%s.attention.recurrent_layers", arch);
    hp->recurrent = 0;
    if (pkv_gguf_find_key(g, k) >= 0) {
        pkv_gguf_array a;
        pkv_status s = pkv_gguf_get_arr(g, k, PKV_GGUF_TYPE_COUNT, &a);
        if (s) return s;
        if (a.type == PKV_GGUF_STRING || a.type == PKV_GGUF_FLOAT32 || a.type == PKV_GGUF_FLOAT64 ||
            a.count != (uint64_t)n_layer_all)
            return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' must hold one bool per layer (%d), found %llu of %s", lab, k,
                           n_layer_all, (unsigned long long)a.count, pkv_gguf_type_name(a.type));
        for (int l = 0; l < hp->n_layer; l++)
            if (pkv_gguf_arr_int(&a, (uint64_t)l)) hp->recurrent |= 1ull << l;
        for (int l = hp->n_layer; l < n_layer_all; l++)
            if (pkv_gguf_arr_int(&a, (uint64_t)l))
                return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' marks layer %d, an MTP layer, recurrent", lab, k, l);
        return PKV_OK;
    }
    int every = 4;
    pkv_status s = pkv_hp_opt_u32(g, arch, "full_attention_interval", 1, 4096, 4, &every);
    for (int l = 0; !s && l < hp->n_layer; l++)
        if ((l + 1) % every != 0) hp->recurrent |= 1ull << l;
    return s;
}

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    const int n_layer_all = hp->n_layer;
    pkv_status s = pkv_hp_opt_u32(g, arch, "nextn_predict_layers", 0, (uint32_t)n_layer_all - 1, 0, &hp->n_nextn);
    if (s) return s;
    hp->n_layer = n_layer_all - hp->n_nextn;
    if (hp->n_layer > 64)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: %d trunk layers; %s files of more than 64 layers are not supported yet",
                       lab, hp->n_layer, arch);
    int inner = 0;
    if ((s = pkv_hp_ssm_keys(g, arch, hp, &inner))) return s;
    if (hp->ssm.n_v_heads % hp->ssm.n_k_heads)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.ssm.time_step_rank' %d (value heads) is not a multiple of '%s.ssm.group_count' %d "
                       "(key heads)", lab, arch, hp->ssm.n_v_heads, arch, hp->ssm.n_k_heads);
    if (inner % hp->ssm.n_v_heads || inner / hp->ssm.n_v_heads != hp->ssm.d_k)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.ssm.inner_size' %d must be '%s.ssm.time_step_rank' %d times '%s.ssm.state_size' %d "
                       "(key and value heads of one size)", lab, arch, inner, arch, hp->ssm.n_v_heads, arch, hp->ssm.d_k);
    hp->ssm.d_v = inner / hp->ssm.n_v_heads;
    /* the cache describes a key head's state in parts (pkv_fwd_state_desc) */
    const int R = hp->ssm.n_v_heads / hp->ssm.n_k_heads, parts = (hp->ssm.d_conv - 1) * (2 + R) + R;
    if (parts > PKV_KV_STATE_MAX_PARTS)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: a key head's recurrent state is %d parts (conv kernel %d, %d value heads "
                       "per key head), the cache describes at most %d: not supported", lab, parts, hp->ssm.d_conv, R,
                       PKV_KV_STATE_MAX_PARTS);
    if (hp->head_dim_k != hp->head_dim_v)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.key_length' %d and 'value_length' %d differ (the output gate needs "
                       "them equal)", lab, arch, hp->head_dim_k, hp->head_dim_v);
    /* M-RoPE sections: for text every dim pair takes the token's position unless its
     * sector falls to the fourth section (position 0 for text in llama.cpp) */
    char k[128];
    snprintf(k, sizeof k, "%s.rope.dimension_sections", arch);
    pkv_gguf_array a;
    if ((s = pkv_gguf_get_arr(g, k, PKV_GGUF_TYPE_COUNT, &a))) return s;
    if (a.type == PKV_GGUF_STRING || a.type == PKV_GGUF_FLOAT32 || a.type == PKV_GGUF_FLOAT64 || a.count < 3 || a.count > 4)
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' must hold 3 or 4 integers", lab, k);
    int64_t sec[4] = {0, 0, 0, 0}, sum = 0;
    for (uint64_t i = 0; i < a.count; i++) {
        sec[i] = pkv_gguf_arr_int(&a, i);
        if (sec[i] < 0 || sec[i] > 4096) return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' entry %llu is %lld", lab, k,
                                                        (unsigned long long)i, (long long)sec[i]);
        sum += sec[i];
    }
    if (sum <= 0) return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' sums to 0", lab, k);
    for (int i = 0; i < hp->n_rot / 2; i++) { /* llama.cpp's interleaved assignment of pair i */
        int64_t sector = i % sum;
        bool pos = (sector % 3 == 0 && sector < 3 * sec[0]) || (sector % 3 == 1 && sector < 3 * sec[1]) ||
                   (sector % 3 == 2 && sector < 3 * sec[2]);
        if (!pos)
            return pkv_err(PKV_ERR_UNSUPPORTED, "%s: key '%s' [%lld, %lld, %lld, %lld] leaves rotary pair %d to the fourth "
                           "section, which text does not rotate: not supported", lab, k, (long long)sec[0],
                           (long long)sec[1], (long long)sec[2], (long long)sec[3], i);
    }
    return pattern(g, arch, hp, n_layer_all);
}

/* The FFN: gated, or (qwen35moe) experts with a gated shared expert. */
static pkv_status load_ffn(pkv_loader *L, int il) {
    return pkv_loader_model(L)->hp.moe.n_expert ? pkv_load_moe(L, il, PKV_MOE_SHARED_GATE) : pkv_load_ffn(L, il, false);
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_model *m = pkv_loader_model(L);
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    pkv_status s;
    ly->recurrent = hp->recurrent >> il & 1;
    if ((s = pkv_load_norm(L, il, "attn_norm.weight", &ly->attn_norm)) ||
        (s = ly->recurrent ? pkv_load_delta_net(L, il)
                           : pkv_load_attention(L, il, &(pkv_attn_tensors){.qk_norm = true, .q_gate = true})) ||
        (s = pkv_load_norm(L, il, "post_attention_norm.weight", &ly->ffn_norm)))
        return s;
    return load_ffn(L, il);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_hparams *hp = &f->m->hp;
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = ly->recurrent ? pkv_blk_delta_net(f, il, &ly->attn_norm)
                                 : pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true,
                                                                              .out_gate = true});
    if (s) return s;
    if (hp->moe.n_expert)
        return pkv_blk_moe(f, il, &(pkv_moe_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU, .gating = PKV_MOE_SOFTMAX_TOPK,
                                                  .norm_w = true, .w_scale = hp->moe_route.w_scale});
    return pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

/* ------------------------------------------------------- pagekv mkmodel */


/* Three delta-net layers and one attention layer by default. */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (!p->n_layer) p->n_layer = 4;
    if (!p->ssm_v_heads) p->ssm_v_heads = 4;
    if (!p->ssm_k_heads) p->ssm_k_heads = p->ssm_v_heads >= 2 ? 2 : 1;
    /* k-quant rows are blocks of 256: the output projection's rows too */
    if (!p->ssm_head_dim) p->ssm_head_dim = pkv_type_block_elems(p->type) == 256 ? 256 / p->ssm_v_heads : 16;
    if (p->ssm_state)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: %s's delta-net state is head size x head size: --ssm-state is for "
                       "Mamba-2 layers (granitehybrid, nemotron_h)", p->arch);
    PKV_MK_TRY(pkv_mk_ssm_check(p));
    if (p->n_mtp < 0 || p->n_mtp > 4)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: %s takes 0 to 4 MTP layers, not %d", p->arch, p->n_mtp);
    if ((p->head_dim ? p->head_dim : p->n_embd / (p->n_head ? p->n_head : 4)) % 4)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: qwen35 rotates half of each head in pairs of sections: the head size must be a "
                       "multiple of 4");
    return PKV_OK;
}

/* llama.cpp's keys: every 4th layer attends, the others are delta-net layers. */
static pkv_status mk_keys(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    if (p->n_expert) { /* qwen35moe */
        PKV_MK_TRY(pkv_mk_expert_keys(b, p->n_ff));
        PKV_MK_TRY(pkv_mk_u32(b, "expert_shared_feed_forward_length", (uint32_t)p->n_ff));
    }
    PKV_MK_TRY(pkv_mk_ssm_keys(b, 4, p->ssm_head_dim, p->ssm_k_heads, p->ssm_v_heads, p->ssm_v_heads * p->ssm_head_dim));
    PKV_MK_TRY(pkv_mk_u32(b, "full_attention_interval", 4));
    uint8_t recr[64 + 4];
    for (int l = 0; l < p->n_layer + p->n_mtp; l++) recr[l] = l < p->n_layer && (l + 1) % 4 != 0;
    PKV_MK_TRY(pkv_mk_arr(b, "attention.recurrent_layers", PKV_GGUF_BOOL, recr, (uint64_t)(p->n_layer + p->n_mtp)));
    /* M-RoPE sections over half the head (Qwen3.5 rotates a quarter), so every pair
     * takes the text position: [ceil, mid, floor] thirds of the pairs, and 0 */
    int32_t P = p->head_dim / 4, sec[4] = {(P + 2) / 3, (P + 1) / 3, P / 3, 0};
    return pkv_mk_arr(b, "rope.dimension_sections", PKV_GGUF_INT32, sec, 4);
}

/* A gated delta-net layer, llama.cpp's tensors. */
static pkv_status mk_delta_net(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E, Hv = p->ssm_v_heads, dS = p->ssm_head_dim, C = 2 * (int64_t)p->ssm_k_heads * dS + Hv * dS;
    const double lin_v = sqrt(3.0 / (double)(Hv * dS));
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
    PKV_MK_TRY(pkv_mk_blk(b, l, "attn_qkv.weight", p->type, E, C, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "attn_gate.weight", p->type, E, Hv * dS, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_conv1d.weight", PKV_TYPE_F32, 4, C, 0.0, 0.5));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_dt.bias", PKV_TYPE_F32, Hv, 1, 0.0, 1.0));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_a", PKV_TYPE_F32, Hv, 1, -1.0, 0.5)); /* -exp(A_log) < 0 */
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_beta.weight", p->type, E, Hv, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_alpha.weight", p->type, E, Hv, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_norm(b, l, "ssm_norm.weight", dS));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_out.weight", p->type, Hv * dS, E, 0.0, lin_v));
    PKV_MK_TRY(pkv_mk_norm(b, l, "post_attention_norm.weight", E));
    return pkv_mk_ffn(b, l, p->n_expert ? PKV_FFN_EXPERTS : PKV_FFN_GATED);
}

/* qwen35moe: a gated shared expert of n_ff rows beside the experts. */
static pkv_status mk_shared(pkv_mk *b, int l) {
    return b->p->n_expert ? pkv_mk_moe_extras(b, l, PKV_MOE_SHARED_GATE, b->p->n_ff) : PKV_OK;
}

/* A delta-net or attention layer; an MTP layer after the trunk is an attention
 * layer plus its nextn tensors: x = eh_proj [enorm(embedding); hnorm(h)], its own
 * final norm. */
static pkv_status mk_layer(pkv_mk *b, int l) {
    const bool mtp = l >= b->p->n_layer;
    if (!mtp && (l + 1) % 4 != 0) {
        PKV_MK_TRY(mk_delta_net(b, l));
        return mk_shared(b, l);
    }
    PKV_MK_TRY(pkv_mk_layer(b, l, &(pkv_attn_tensors){.q_gate = true, .qk_norm = true}, "post_attention_norm.weight",
                            b->p->n_expert ? PKV_FFN_EXPERTS : PKV_FFN_GATED, false));
    PKV_MK_TRY(mk_shared(b, l));
    if (!mtp) return PKV_OK;
    return pkv_mk_nextn(b, l);
}

/* qwen35 and qwen35moe differ in their FFN only (the hparams' expert count) */
#define QWEN35_MK(takes_)                                                                                              \
    {.takes = (takes_), .rope_base = 1000000.0f, .rope_half = true, .rms_eps = 1e-6f, .head_keys = true,                 \
     .check = mk_check, .check_rows = pkv_mk_ssm_rows, .keys = mk_keys, .layer = mk_layer}
#define QWEN35_OPS(name_, moe_, mk_)                                                                                   \
    {.name = (name_), .moe = (moe_), .rope_neox = true, .hparams = hparams, .load_layer = load_layer, .layer = layer,      \
     .load_global = pkv_load_nextn, .mtp_head = true, .input = pkv_blk_nextn_input, .mk = (mk_)}

static const pkv_arch_mk mk = QWEN35_MK(PKV_MK_DELTANET | PKV_MK_MTP),
                         mk_moe = QWEN35_MK(PKV_MK_DELTANET | PKV_MK_MTP | PKV_MK_EXPERTS);
const pkv_arch_ops pkv_arch_qwen35 = QWEN35_OPS("qwen35", false, &mk),
                   pkv_arch_qwen35moe = QWEN35_OPS("qwen35moe", true, &mk_moe);
