/* gpt-oss: gpt-oss-20b and -120b (llama.cpp's "openai_moe"). Q/K/V and output
 * biases; a learned sink logit per head in every softmax; even layers slide (the
 * window required); YaRN; a mixture of experts with biases everywhere, the top k of
 * the router's logits weighted by a softmax over those k, each expert's activation
 * the clamped SwiGLU. Its FFN norm is named post_attention_norm.
 *
 *   x += o(attention_with_sinks(rope(q + bq), rope(k + bk), v + bv)) + bo   of attn_norm(x)
 *   l  = router·h + b_router,  h = post_attention_norm(x)
 *   x += sum over the top k of l: softmax(l_topk)_e * (down_e(swiglu_oai(gate_e·h + bg_e, up_e·h + bu_e)) + bd_e) */
#include <math.h>

#include "model/arch/arch.h"
#include "model/arch/mk.h"

/* llama.cpp's llama_model_openai_moe::load_arch_hparams */
static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    /* every other layer slides, the even ones (set_swa_pattern(2); the file may
     * say otherwise), over the required attention.sliding_window */
    pkv_status s = pkv_hp_window(g, arch, hp, true);
    if (!s) s = pkv_hp_opt_u32(g, arch, "attention.sliding_window_pattern", 1, 4096, 2, &hp->swa.pattern);
    /* the sliding layers rotate as the others unless the file gives them a base */
    float base_swa = 0;
    if (!s) s = pkv_hp_opt_f32(g, arch, "rope.freq_base_swa", 0.0f, &base_swa);
    if (!s && base_swa != 0 && !(base_swa > 0 && base_swa < INFINITY))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch, (double)base_swa);
    hp->swa.rope_base = base_swa;
    hp->swa.rope_freq_scale = hp->rope_freq_scale;
    /* llama.cpp sizes the heads by the rotary dimensions and scales scores by
     * 1/sqrt(n_rot): both are the head size here, or the file is refused */
    if (!s && hp->n_rot != hp->head_dim_k)
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: '%s.rope.dimension_count' %d differs from '%s.attention.key_length' %d "
                    "(gpt-oss rotates whole heads)", lab, arch, hp->n_rot, arch, hp->head_dim_k);
    return s;
}

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qkv_bias = true, .out_bias = true, .sinks = true},
                            "post_attention_norm.weight", PKV_FFN_EXPERTS_BIASED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .sinks = true});
    return s ? s
             : pkv_blk_moe(f, il, &(pkv_moe_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU_OAI,
                                                  .gating = PKV_MOE_TOPK_SOFTMAX});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_keys(pkv_mk *b) {
    PKV_MK_TRY(pkv_mk_expert_keys(b, b->p->n_ff));
    return pkv_mk_window_key(b);
}

/* The FFN norm has the name of Gemma's post-attention norm. */
static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){.qkv_bias = true, .out_bias = true, .sinks = true},
                        "post_attention_norm.weight", PKV_FFN_EXPERTS_BIASED, false);
}

/* Base 150000 and YaRN as its files have them (factor 32 over 4096 positions),
 * here factor 4 over 256, so tests' positions pass the original context. */
static const pkv_arch_mk mk = {.takes = PKV_MK_WINDOW | PKV_MK_EXPERTS,
                               .rope_base = 150000.0f,
                               .rope_factor = 4.0f,
                               .rope_yarn = true,
                               .rms_eps = 1e-5f,
                               .head_keys = true,
                               .keys = mk_keys,
                               .layer = mk_layer};

const pkv_arch_ops pkv_arch_gpt_oss = {
    .name = "gpt-oss", .moe = true, .rope_neox = true, .hparams = hparams, .load_layer = load_layer, .layer = layer, .mk = &mk};
