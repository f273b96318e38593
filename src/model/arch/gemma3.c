/* gemma3: Gemma 3 (text). Gemma 2's block (gemma2.c) with per-head q and k norms
 * and without soft-caps; five of every six layers slide, rotating with a base of
 * their own (rope.freq_base_swa, 10000) and no scaling; the global layers take the
 * model's base and linear scaling.
 *
 *   x += post_attention_norm(o(attention(rope(q_norm(q)), rope(k_norm(k)), v)))   of attn_norm(x)
 *   x += post_ffw_norm(down(gelu(gate·h) * (up·h)))                               h = ffn_norm(x) */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    return pkv_gemma_hparams(g, arch, hp, n_head, true);
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_layer *ly = &pkv_loader_model(L)->layers[il];
    pkv_status s = pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_GATED);
    if (!s) s = pkv_load_norm(L, il, "post_attention_norm.weight", &ly->post_attn_norm);
    return s ? s : pkv_load_norm(L, il, "post_ffw_norm.weight", &ly->post_ffn_norm);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s =
        pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true, .post_norm = &ly->post_attn_norm});
    return s ? s
             : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_GELU, .post_norm = &ly->post_ffn_norm});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_GATED, true);
}

/* The global layers: base 1e6 and linear scaling by 8 as the 4B-27B files have them
 * (here by 4: any factor but 1 shows whether the scaling is applied, and to the
 * global layers only). No soft-caps; no output.weight. */
static const pkv_arch_mk mk = {.takes = PKV_MK_WINDOW,
                               .tied = true,
                               .rope_base = 1000000.0f,
                               .rope_factor = 4.0f,
                               .rms_eps = 1e-6f,
                               .head_keys = true,
                               .keys = pkv_mk_window_key,
                               .layer = mk_layer};

const pkv_arch_ops pkv_arch_gemma3 = {.name = "gemma3",
                                      .rope_neox = true,
                                      .hparams = hparams,
                                      .load_layer = load_layer,
                                      .layer = layer,
                                      .output = pkv_gemma_output, /* soft-caps where the file has the key */
                                      .mk = &mk};
