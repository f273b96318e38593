/* qwen3: Qwen3 dense. Per-head RMS norms of q and k before RoPE, an explicit head
 * size (attention.key_length), no biases.
 *
 *   x += o(attention(rope(q_norm(q)), rope(k_norm(k)), v))   of attn_norm(x)
 *   x += down(silu(gate·h) * (up·h))                         h = ffn_norm(x)      */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_GATED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true});
    return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_GATED, false);
}

static const pkv_arch_mk mk = {.rope_base = 1000000.0f, .rms_eps = 1e-6f, .head_keys = true, .layer = mk_layer};

const pkv_arch_ops pkv_arch_qwen3 = {.name = "qwen3", .rope_neox = true, .rerank = true, .load_layer = load_layer, .layer = layer, .mk = &mk};
