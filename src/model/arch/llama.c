/* llama: Llama 2/3, Mistral and the files that say "llama". RoPE on adjacent
 * pairs; Q/K/V biases where a file has them.
 *
 *   x += o(attention(rope(q), rope(k), v))      q, k, v = projections of attn_norm(x)
 *   x += down(silu(gate·h) * (up·h))            h = ffn_norm(x)                      */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){0}, NULL, PKV_FFN_GATED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm});
    return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){0}, NULL, PKV_FFN_GATED, false);
}

static const pkv_arch_mk mk = {.rope_base = 10000.0f, .rms_eps = 1e-5f, .layer = mk_layer};

const pkv_arch_ops pkv_arch_llama = {.name = "llama", .load_layer = load_layer, .layer = layer, .mk = &mk};
