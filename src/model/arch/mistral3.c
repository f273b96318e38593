/* mistral3: Ministral 3 (and the text model of Mistral Small 3.x files that say
 * mistral3). Llama's layer (RoPE on adjacent pairs, SwiGLU, Q/K/V biases where a
 * file has them) with, as llama.cpp reads this architecture:
 *   - YaRN from the common keys (hparams.c), its betas from
 *     rope.scaling.yarn_beta_fast/_slow, and rope.scaling.yarn_log_multiplier
 *     (Ministral 3's mscale_all_dim): cos and sin times mscale(factor, 1) /
 *     mscale(factor, log_mul), mscale(f, m) = 1 + 0.1 m ln f, times attn_factor;
 *   - Llama 4's attention temperature tuning, attention.temperature_scale
 *     (llama_4_scaling_beta; 0 or absent = none): after RoPE the queries at position
 *     p are multiplied by 1 + scale * ln(floor(p / original) + 1), original =
 *     rope.scaling.original_context_length (default context_length).
 * Every dim of a head rotates (llama.cpp asserts rope.dimension_count = head size):
 * a file that says otherwise is refused. Its optional attn_output / FFN biases, a
 * mixture of experts and rope_freqs.weight are refused by name (README, unsupported).
 *
 *   x += o(attention(temp(p) * rope(q), rope(k), v))   of attn_norm(x)
 *   x += down(silu(gate·h) * (up·h))                   h = ffn_norm(x)              */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

#include <math.h>

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    if (hp->n_rot != hp->head_dim_k)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.rope.dimension_count' %d differs from the head size %d: %s rotates every "
                       "dim of a head", lab, arch, hp->n_rot, hp->head_dim_k, arch);
    static const char *const unsupported[] = {"blk.0.attn_output.bias", "blk.0.ffn_gate.bias", "blk.0.ffn_up.bias",
                                              "blk.0.ffn_down.bias", "blk.0.ffn_gate_inp.weight"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (pkv_gguf_find_tensor(g, unsupported[i]))
            return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' (%s's optional output/FFN biases and experts) is not "
                           "supported", lab, unsupported[i], arch);
    pkv_status s = pkv_hp_opt_f32(g, arch, "attention.temperature_scale", 0.0f, &hp->attn_temp.scale);
    if (!s && !isfinite(hp->attn_temp.scale))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.attention.temperature_scale' is %g, must be finite", lab, arch,
                    (double)hp->attn_temp.scale);
    if (!s && hp->attn_temp.scale != 0) /* llama.cpp's n_attn_temp_floor_scale: the original context, never 0 */
        s = pkv_hp_opt_u32(g, arch, "rope.scaling.original_context_length", 1, 1u << 30, hp->n_ctx_train,
                           &hp->attn_temp.floor_len);
    return s;
}

static pkv_status load_layer(pkv_loader *L, int il) {
    return pkv_load_prenorm(L, il, &(pkv_attn_tensors){0}, NULL, PKV_FFN_GATED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .temp = true});
    return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){0}, NULL, PKV_FFN_GATED, false);
}

/* Ministral 3's keys (its converter's): the YaRN betas, mscale_all_dim 1 as the log
 * multiplier, llama_4_scaling_beta 0.1 as the temperature scale */
static pkv_status mk_keys(pkv_mk *b) {
    PKV_MK_TRY(pkv_mk_f32(b, "rope.scaling.yarn_beta_fast", 32.0f));
    PKV_MK_TRY(pkv_mk_f32(b, "rope.scaling.yarn_beta_slow", 1.0f));
    PKV_MK_TRY(pkv_mk_f32(b, "rope.scaling.yarn_log_multiplier", 1.0f));
    return pkv_mk_f32(b, "attention.temperature_scale", 0.1f);
}

/* YaRN by 16 over min(256, context) original positions, base 1e6, as Ministral 3 */
static const pkv_arch_mk mk = {.rope_base = 1000000.0f, .rope_factor = 16.0f, .rope_yarn = true, .rms_eps = 1e-5f,
                               .keys = mk_keys, .layer = mk_layer};

const pkv_arch_ops pkv_arch_mistral3 = {.name = "mistral3", .yarn_log_mul = true, .hparams = hparams,
                                        .load_layer = load_layer, .layer = layer, .mk = &mk};
