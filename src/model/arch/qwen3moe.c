/* qwen3moe: Qwen3-30B-A3B, Qwen3-235B-A22B. Qwen3's attention; a mixture of experts
 * in place of the FFN, the top k of the router's softmax, renormalized.
 *
 *   x += o(attention(rope(q_norm(q)), rope(k_norm(k)), v))   of attn_norm(x)
 *   x += sum over the top k experts e of p_e / sum(p) * down_e(silu(gate_e·h) * (up_e·h))
 *        p = softmax(router·h), h = ffn_norm(x)                                   */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_EXPERTS);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true});
    return s ? s
             : pkv_blk_moe(f, il, &(pkv_moe_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU, .gating = PKV_MOE_SOFTMAX_TOPK, .norm_w = true});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_EXPERTS, false);
}

static const pkv_arch_mk mk = {
    .takes = PKV_MK_EXPERTS, .rope_base = 1000000.0f, .rms_eps = 1e-6f, .head_keys = true, .layer = mk_layer};

const pkv_arch_ops pkv_arch_qwen3moe = {
    .name = "qwen3moe", .moe = true, .rope_neox = true, .load_layer = load_layer, .layer = layer, .mk = &mk};
