/* phi3: Phi-3 (4k context), Phi-3-medium. Fused matrices: attn_qkv holds Q's rows,
 * then K's, then V's (separate attn_q/k/v are taken too); ffn_up holds the gate's
 * rows, then the up projection's. Partial rotary through rope.dimension_count.
 * LongRoPE files (rope_factors_*) are refused in hparams.c.
 *
 *   x += o(attention(rope(q), rope(k), v))      [q; k; v] = qkv·attn_norm(x)
 *   x += down(silu(g) * u)                      [g; u] = up·ffn_norm(x)            */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){.fused_qkv = true}, NULL, PKV_FFN_FUSED_UP);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm});
    return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

/* ------------------------------------------------------- pagekv mkmodel */


/* Q, K, V in one matrix, and the gate's rows then the up projection's in another,
 * as Phi-3's GGUFs have them */
static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){.fused_qkv = true}, NULL, PKV_FFN_FUSED_UP, false);
}

static const pkv_arch_mk mk = {.rope_base = 10000.0f, .rms_eps = 1e-5f, .layer = mk_layer};

const pkv_arch_ops pkv_arch_phi3 = {.name = "phi3", .rope_neox = true, .load_layer = load_layer, .layer = layer, .mk = &mk};
