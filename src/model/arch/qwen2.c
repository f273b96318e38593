/* qwen2: Qwen2 and Qwen2.5. Llama's block with Q/K/V biases and RoPE on
 * (i, i + n_rot/2) pairs.
 *
 *   x += o(attention(rope(q + bq), rope(k + bk), v + bv))    of attn_norm(x)
 *   x += down(silu(gate·h) * (up·h))                         h = ffn_norm(x)      */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qkv_bias = true}, NULL, PKV_FFN_GATED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm});
    return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){.qkv_bias = true}, NULL, PKV_FFN_GATED, false);
}

static const pkv_arch_mk mk = {.rope_base = 1000000.0f, .rms_eps = 1e-6f, .layer = mk_layer};

const pkv_arch_ops pkv_arch_qwen2 = {.name = "qwen2", .rope_neox = true, .load_layer = load_layer, .layer = layer, .mk = &mk};
