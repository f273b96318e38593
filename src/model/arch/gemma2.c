/* gemma2: Gemma 2. Embeddings times sqrt(n_embd); RMS norms of the attention's and
 * the FFN's outputs before their residual adds; GeGLU; attention scores and final
 * logits soft-capped (cap * tanh(x / cap)); even layers slide over the last
 * attention.sliding_window tokens, odd layers see everything.
 *
 *   x += post_attention_norm(o(attention(rope(q), rope(k), v)))    of attn_norm(x)
 *   x += post_ffw_norm(down(gelu(gate·h) * (up·h)))                h = ffn_norm(x)  */
#include <math.h>

#include "model/arch/arch.h"
#include "model/arch/mk.h"

pkv_status pkv_gemma_hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head, bool gemma3) {
    const char *lab = pkv_gguf_label(g);
    hp->embd_scale = sqrtf((float)hp->n_embd);
    /* gemma2: even layers slide, odd layers see everything; gemma3: five of every
     * six layers slide, with their own RoPE base (llama.cpp's
     * rope_freq_base_train_swa) and no RoPE scaling, which is for the global layers */
    hp->swa.pattern = gemma3 ? 6 : 2;
    hp->swa.rope_base = gemma3 ? 10000.0f : 0.0f;
    hp->swa.rope_freq_scale = 1.0f;
    /* gemma3 needs the window, as llama.cpp does: without it the sliding layers
     * would see everything, silently wrong */
    pkv_status s = pkv_hp_window(g, arch, hp, gemma3);
    /* a file may give the sliding layers' base (llama.cpp reads the key too) */
    if (!s && gemma3) s = pkv_hp_opt_f32(g, arch, "rope.freq_base_swa", 10000.0f, &hp->swa.rope_base);
    if (!s && gemma3 && !(hp->swa.rope_base > 0 && hp->swa.rope_base < INFINITY))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch, (double)hp->swa.rope_base);
    if (!s) s = pkv_hp_opt_f32(g, arch, "attn_logit_softcapping", 0.0f, &hp->softcap.attn);
    if (!s) s = pkv_hp_opt_f32(g, arch, "final_logit_softcapping", 0.0f, &hp->softcap.final);
    if (!s && (!(hp->softcap.attn >= 0) || !(hp->softcap.final >= 0) || hp->softcap.attn == INFINITY ||
               hp->softcap.final == INFINITY))
        s = pkv_err(PKV_ERR_FORMAT, "%s: '%s.attn_logit_softcapping' %g and '%s.final_logit_softcapping' %g must be >= 0", lab,
                    arch, (double)hp->softcap.attn, arch, (double)hp->softcap.final);
    /* the query scale: by model size, as llama.cpp does (the 27B models, gemma2's
     * 46 layers and gemma3's 62, use n_embd / n_head; the others the head size).
     * gemma3 has no soft-caps in its files; where the keys are there anyway they
     * are honoured, as for gemma2. */
    int n_layer_27b = gemma3 ? 62 : 46;
    if (!s)
        hp->attn_scale = 1.0f / sqrtf(hp->n_layer == n_layer_27b ? (float)(hp->n_embd / n_head[0]) : (float)hp->head_dim_k);
    return s;
}

pkv_status pkv_gemma_output(pkv_fwd *f, float *logits) {
    pkv_status s = pkv_blk_logits(f, logits);
    const float cap = f->m->hp.softcap.final;
    if (!s && logits && cap > 0) { /* on the host copy */
        const size_t n = (size_t)f->pl->n_out * (size_t)f->m->hp.n_vocab;
        for (size_t i = 0; i < n; i++) logits[i] = cap * tanhf(logits[i] / cap);
    } else if (!s)
        s = pkv_device_sync(f->m->dev);
    return s;
}

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    return pkv_gemma_hparams(g, arch, hp, n_head, false);
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_layer *ly = &pkv_loader_model(L)->layers[il];
    pkv_status s = pkv_load_prenorm(L, il, &(pkv_attn_tensors){0}, NULL, PKV_FFN_GATED);
    if (!s) s = pkv_load_norm(L, il, "post_attention_norm.weight", &ly->post_attn_norm);
    return s ? s : pkv_load_norm(L, il, "post_ffw_norm.weight", &ly->post_ffn_norm);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .post_norm = &ly->post_attn_norm});
    return s ? s
             : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_GELU, .post_norm = &ly->post_ffn_norm});
}

/* ------------------------------------------------------- pagekv mkmodel */


static pkv_status mk_keys(pkv_mk *b) {
    PKV_MK_TRY(pkv_mk_window_key(b));
    PKV_MK_TRY(pkv_mk_f32(b, "attn_logit_softcapping", 50.0f));
    return pkv_mk_f32(b, "final_logit_softcapping", 30.0f);
}

static pkv_status mk_layer(pkv_mk *b, int l) {
    return pkv_mk_layer(b, l, &(pkv_attn_tensors){0}, NULL, PKV_FFN_GATED, true);
}

/* Gemma files have no output.weight */
static const pkv_arch_mk mk = {.takes = PKV_MK_WINDOW,
                               .tied = true,
                               .rope_base = 10000.0f,
                               .rms_eps = 1e-6f,
                               .head_keys = true,
                               .keys = mk_keys,
                               .layer = mk_layer};

const pkv_arch_ops pkv_arch_gemma2 = {.name = "gemma2",
                                      .rope_neox = true,
                                      .hparams = hparams,
                                      .load_layer = load_layer,
                                      .layer = layer,
                                      .output = pkv_gemma_output,
                                      .mk = &mk};
