/* gemma4-assistant: Gemma 4's MTP drafter ("assistant"), with llama.cpp's keys,
 * tensors and arithmetic (src/models/gemma4-assistant.cpp). A small model of width
 * Ea (embedding_length) that drafts for a gemma4 target of width Eb
 * (embedding_length_out) from the target's own state:
 *   - input: the target's token embedding of the token times sqrt(Eb), and the
 *     target's final normed hidden state h (Eb wide), through nextn.pre_projection
 *     [2 Eb -> Ea] (embedding columns first; loaded as two column halves);
 *   - its layers have queries only (attn_q, attn_q_norm, attn_output): a sliding layer
 *     attends over the KV of the target's last sliding layer that owns KV, a full layer
 *     over the target's last full one (pkv_context_attach resolves the map); it writes
 *     no KV of its own. RoPE, norms and scale 1 as in gemma4 (its keys: which layers
 *     slide, the sliding layers' head sizes, rope_freqs.weight);
 *   - head: logits = token_embd · rmsnorm(x) * output_norm (tied, no soft-cap), and
 *     the next hidden state post_projection · (the same normed x) [Ea -> Eb].
 *
 *   x  = pre_e·(embd_target(token) * sqrt(Eb)) + pre_h·h
 *   x += post_attention_norm(o(attention(prope(q_norm(q)), the target's K/V)))   of attn_norm(x)
 *   x += post_ffw_norm(down(gelu(gate·h) * (up·h)))                            h = ffn_norm(x)
 *   x *= layer_output_scale
 *
 * The input and the head are forward.c's (pkv_model.assistant); the drafting loop
 * (every step at the position after the target's last token, fed the previous
 * step's h) is speculative.c's. */
#include <math.h>

#include "model/arch/arch.h"

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    char k[128];
    pkv_status s;
    int nextn = 0;
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    if (pkv_gguf_find_key(g, k) < 0) return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' not found", lab, k);
    if ((s = pkv_hp_need_u32(g, arch, "embedding_length_out", 1, 1 << 20, &hp->n_embd_out)) ||
        (s = pkv_hp_opt_u32(g, arch, "nextn_predict_layers", 0, 4096, hp->n_layer, &nextn)) ||
        (s = pkv_hp_window(g, arch, hp, true)) || (s = pkv_gemma4_pattern(g, arch, hp)) ||
        (s = pkv_hp_need_u32(g, arch, "attention.key_length_swa", 1, 4096, &hp->head_dim_k_swa)) ||
        (s = pkv_hp_need_u32(g, arch, "attention.value_length_swa", 1, 4096, &hp->head_dim_v_swa)) ||
        (s = pkv_hp_opt_u32(g, arch, "rope.dimension_count_swa", 2, 4096, hp->n_rot, &hp->n_rot_swa)) ||
        (s = pkv_hp_opt_f32(g, arch, "rope.freq_base_swa", 10000.0f, &hp->rope_base_swa)))
        return s;
    if (nextn != hp->n_layer)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.nextn_predict_layers' %d must equal '%s.block_count' %d (every layer of an "
                       "assistant is a drafting layer)", lab, arch, nextn, arch, hp->n_layer);
    if (hp->n_swa < 2)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.sliding_window' %d: an assistant needs a window of at least 2 (its "
                       "queries sit after the cached tokens)", lab, arch, hp->n_swa);
    if (hp->n_embd_out == hp->n_embd)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.embedding_length_out' %d (the target's width) equals '%s.embedding_length': "
                       "an assistant has a width of its own (llama.cpp refuses this file too)", lab, arch, hp->n_embd_out, arch);
    if (hp->head_dim_k != hp->head_dim_v || hp->head_dim_k_swa != hp->head_dim_v_swa)
        return pkv_err(PKV_ERR_FORMAT, "%s: Gemma 4 needs '%s.attention.key_length' %d == 'value_length' %d and "
                       "'key_length_swa' %d == 'value_length_swa' %d", lab, arch, hp->head_dim_k, hp->head_dim_v,
                       hp->head_dim_k_swa, hp->head_dim_v_swa);
    if (hp->n_rot_swa % 2 || hp->n_rot_swa > hp->head_dim_k_swa)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.rope.dimension_count_swa' %d must be even and at most "
                       "'%s.attention.key_length_swa' %d", lab, arch, hp->n_rot_swa, arch, hp->head_dim_k_swa);
    if (!(hp->rope_base_swa > 0 && hp->rope_base_swa < INFINITY))
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch, (double)hp->rope_base_swa);
    if (hp->rope_ext_factor != 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: YaRN RoPE scaling ('%s.rope.scaling.type') with Gemma 4's proportional RoPE "
                       "is not supported", lab, arch);
    hp->embd_scale = sqrtf((float)hp->n_embd_out); /* the target's embedding, at the target's scale */
    hp->attn_scale = 1.0f;
    hp->rope_freq_scale_swa = 1.0f;
    hp->final_softcap = 0; /* llama.cpp's assistant caps nothing */
    return pkv_gemma4_rope_freqs(g, hp);
}

/* nextn.pre_projection [Ea][2 Eb]: the embedding's columns, then h's; and
 * nextn.post_projection [Eb][Ea]. */
static pkv_status load_global(pkv_loader *L) {
    pkv_model *m = pkv_loader_model(L);
    const int64_t Ea = m->hp.n_embd, Eb = m->hp.n_embd_out;
    pkv_status s;
    if ((s = pkv_load_global_cols(L, "nextn.pre_projection.weight", 2 * Eb, Ea, 0, Eb, &m->asst_pre_e)) ||
        (s = pkv_load_global_cols(L, "nextn.pre_projection.weight", 2 * Eb, Ea, Eb, Eb, &m->asst_pre_h)) ||
        (s = pkv_load_global(L, "nextn.post_projection.weight", Ea, Eb, true, false, &m->asst_post)))
        return s;
    m->assistant = true;
    return PKV_OK;
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_model *m = pkv_loader_model(L);
    pkv_layer *ly = &m->layers[il];
    char name[96];
    /* queries only: the layer reads the target's KV (ly->kv_reuse, set at load) */
    pkv_status s = pkv_load_prenorm(L, il, &(pkv_attn_tensors){.qk_norm = true}, NULL, PKV_FFN_GATED);
    if (!s) s = pkv_load_norm(L, il, "post_attention_norm.weight", &ly->post_attn_norm);
    if (!s) s = pkv_load_norm(L, il, "post_ffw_norm.weight", &ly->post_ffn_norm);
    snprintf(name, sizeof name, "blk.%d.layer_output_scale.weight", il);
    if (!s) s = pkv_load_global(L, name, 1, 1, true, true, &ly->out_scale); /* required, as llama.cpp requires it */
    return s;
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true,
                                                               .post_norm = &ly->post_attn_norm});
    if (!s) s = pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_GELU, .post_norm = &ly->post_ffn_norm});
    return s ? s : pkv_blk_scale(f, &ly->out_scale);
}

const pkv_arch_ops pkv_arch_gemma4_assistant = {.name = "gemma4-assistant",
                                                .rope_neox = true,
                                                .rope_freqs = true,
                                                .hparams = hparams,
                                                .load_layer = load_layer,
                                                .layer = layer,
                                                .load_global = load_global};
