/* qwen2: Qwen2 and Qwen2.5. Llama's block with Q/K/V biases and RoPE on
 * (i, i + n_rot/2) pairs.
 *
 *   x += o(attention(rope(q + bq), rope(k + bk), v + bv))    of attn_norm(x)
 *   x += down(silu(gate·h) * (up·h))                         h = ffn_norm(x)      */
#include "model/arch/arch.h"

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qkv_bias = true}, NULL, PKV_FFN_GATED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm});
    return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

const pkv_arch_ops pkv_arch_qwen2 = {.name = "qwen2", .rope_neox = true, .load_layer = load_layer, .layer = layer};
