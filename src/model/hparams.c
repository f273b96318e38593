/* Hyper-parameters from GGUF metadata, with the key names llama.cpp's converters
 * write ("<arch>.block_count", "<arch>.attention.head_count", ...). Head counts and
 * FFN sizes may be per-layer arrays (I4: never assume layer 0 speaks for all). */
#include "model/model-impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *k_arch_names[PKV_ARCH_COUNT] = {"llama",  "qwen2",  "qwen3", "qwen3moe",
                                                    "phi3",   "gemma2", "gemma3", "gpt-oss"};

const char *pkv_arch_name(pkv_arch a) { return (unsigned)a < PKV_ARCH_COUNT ? k_arch_names[a] : "unknown"; }

static void key(char *buf, size_t n, const char *arch, const char *suffix) { snprintf(buf, n, "%s.%s", arch, suffix); }

/* A u32 that must be present. */
static pkv_status need_u32(const pkv_gguf *g, const char *arch, const char *suffix, uint32_t lo, uint32_t hi, int *out) {
    char k[128];
    key(k, sizeof k, arch, suffix);
    uint32_t v;
    pkv_status s = pkv_gguf_get_u32(g, k, &v);
    if (s) return s;
    if (v < lo || v > hi)
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' is %u, expected a value in [%u, %u]", pkv_gguf_label(g), k, v, lo, hi);
    *out = (int)v;
    return PKV_OK;
}

/* An optional u32 (def when absent). */
static pkv_status opt_u32(const pkv_gguf *g, const char *arch, const char *suffix, uint32_t lo, uint32_t hi, int def, int *out) {
    char k[128];
    key(k, sizeof k, arch, suffix);
    if (pkv_gguf_find_key(g, k) < 0) {
        *out = def;
        return PKV_OK;
    }
    return need_u32(g, arch, suffix, lo, hi, out);
}

static pkv_status opt_f32(const pkv_gguf *g, const char *arch, const char *suffix, float def, float *out) {
    char k[128];
    key(k, sizeof k, arch, suffix);
    if (pkv_gguf_find_key(g, k) < 0) {
        *out = def;
        return PKV_OK;
    }
    return pkv_gguf_get_f32(g, k, out);
}

/* A per-layer value: a scalar u32 applying to every layer, or an array of
 * n_layer integers. *out is pkv_malloc'd [n_layer]. def < 0: required. */
static pkv_status per_layer(const pkv_gguf *g, const char *arch, const char *suffix, int n_layer, int def, int lo, int hi,
                            int **out) {
    char k[128];
    key(k, sizeof k, arch, suffix);
    int *v = pkv_calloc((size_t)n_layer, sizeof *v);
    if (!v) return pkv_err(PKV_ERR_NOMEM, "%s: per-layer '%s'", pkv_gguf_label(g), k);
    int64_t idx = pkv_gguf_find_key(g, k);
    pkv_status s = PKV_OK;
    if (idx < 0) {
        if (def < 0) s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s' not found", pkv_gguf_label(g), k);
        for (int l = 0; l < n_layer; l++) v[l] = def;
    } else if (pkv_gguf_kv_type(g, idx) == PKV_GGUF_ARRAY) {
        pkv_gguf_array a;
        s = pkv_gguf_get_arr(g, k, PKV_GGUF_TYPE_COUNT, &a);
        if (!s && (a.type == PKV_GGUF_STRING || a.type == PKV_GGUF_FLOAT32 || a.type == PKV_GGUF_FLOAT64))
            s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s' is an array of %s, expected integers", pkv_gguf_label(g), k,
                        pkv_gguf_type_name(a.type));
        if (!s && a.count != (uint64_t)n_layer)
            s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s' has %llu entries, expected one per layer (%d)", pkv_gguf_label(g), k,
                        (unsigned long long)a.count, n_layer);
        for (int l = 0; !s && l < n_layer; l++) {
            int64_t x = pkv_gguf_arr_int(&a, (uint64_t)l);
            if (x < lo || x > hi)
                s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s' layer %d is %lld, expected a value in [%d, %d]", pkv_gguf_label(g),
                            k, l, (long long)x, lo, hi);
            else
                v[l] = (int)x;
        }
    } else {
        int x = 0;
        s = need_u32(g, arch, suffix, (uint32_t)lo, (uint32_t)hi, &x);
        for (int l = 0; !s && l < n_layer; l++) v[l] = x;
    }
    if (s) {
        pkv_free(v);
        return s;
    }
    *out = v;
    return PKV_OK;
}

pkv_status pkv_hparams_read(const pkv_gguf *g, pkv_hparams *hp, int **n_head_out, int **n_head_kv_out, int **n_ff_out) {
    const char *lab = pkv_gguf_label(g);
    const char *as;
    size_t alen;
    pkv_status s = pkv_gguf_get_str(g, "general.architecture", &as, &alen);
    if (s) return s;
    char arch[32];
    if (alen >= sizeof arch) alen = sizeof arch - 1;
    memcpy(arch, as, alen);
    arch[alen] = 0;
    memset(hp, 0, sizeof *hp);
    hp->arch = PKV_ARCH_COUNT;
    for (int a = 0; a < PKV_ARCH_COUNT; a++)
        if (!strcmp(arch, k_arch_names[a])) hp->arch = (pkv_arch)a;
    if (hp->arch == PKV_ARCH_COUNT)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, gpt-oss)",
                       lab, arch);

    if ((s = need_u32(g, arch, "block_count", 1, 4096, &hp->n_layer))) return s;
    if ((s = need_u32(g, arch, "embedding_length", 1, 1 << 20, &hp->n_embd))) return s;
    if ((s = opt_u32(g, arch, "context_length", 1, 1u << 30, 4096, &hp->n_ctx_train))) return s;
    int *n_head = NULL, *n_head_kv = NULL, *n_ff = NULL;
    if ((s = per_layer(g, arch, "attention.head_count", hp->n_layer, -1, 1, 4096, &n_head))) return s;
    /* head_count_kv defaults to head_count, layer by layer */
    char k[128];
    key(k, sizeof k, arch, "attention.head_count_kv");
    if (pkv_gguf_find_key(g, k) < 0) {
        n_head_kv = pkv_malloc((size_t)hp->n_layer * sizeof(int));
        if (!n_head_kv) s = pkv_err(PKV_ERR_NOMEM, "%s: head counts", lab);
        else memcpy(n_head_kv, n_head, (size_t)hp->n_layer * sizeof(int));
    } else {
        s = per_layer(g, arch, "attention.head_count_kv", hp->n_layer, -1, 1, 4096, &n_head_kv);
    }
    const bool oss = hp->arch == PKV_ARCH_GPT_OSS;
    bool moe = hp->arch == PKV_ARCH_QWEN3MOE || oss;
    if (!s && moe) { /* expert counts and sizes: llama.cpp's keys */
        s = need_u32(g, arch, "expert_count", 1, 4096, &hp->n_expert);
        if (!s) s = need_u32(g, arch, "expert_used_count", 1, 4096, &hp->n_expert_used);
        if (!s) s = need_u32(g, arch, "expert_feed_forward_length", 1, 1 << 24, &hp->n_ff_exp);
        if (!s && hp->n_expert_used > hp->n_expert)
            s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.expert_used_count' is %d, more than the %d experts of '%s.expert_count'",
                        lab, arch, hp->n_expert_used, hp->n_expert, arch);
    }
    /* a MoE layer's FFN is its experts: feed_forward_length (a dense size some files
     * also carry) is not used */
    if (!s) s = per_layer(g, arch, "feed_forward_length", hp->n_layer, moe ? hp->n_ff_exp : -1, 1, 1 << 24, &n_ff);
    for (int l = 0; !s && moe && l < hp->n_layer; l++) n_ff[l] = hp->n_ff_exp;
    for (int l = 0; !s && l < hp->n_layer; l++)
        if (n_head[l] % n_head_kv[l])
            s = pkv_err(PKV_ERR_FORMAT, "%s: layer %d has %d attention heads, not a multiple of its %d KV heads", lab, l,
                        n_head[l], n_head_kv[l]);
    int def_hd = n_head && n_head[0] && hp->n_embd % n_head[0] == 0 ? hp->n_embd / n_head[0] : 0;
    if (!s) s = opt_u32(g, arch, "attention.key_length", 1, 4096, def_hd, &hp->head_dim_k);
    if (!s) s = opt_u32(g, arch, "attention.value_length", 1, 4096, hp->head_dim_k, &hp->head_dim_v);
    if (!s && hp->head_dim_k == 0)
        s = pkv_err(PKV_ERR_FORMAT, "%s: no '%s.attention.key_length' and embedding_length %d is not a multiple of head_count %d",
                    lab, arch, hp->n_embd, n_head[0]);
    if (!s) s = opt_u32(g, arch, "rope.dimension_count", 2, 4096, hp->head_dim_k, &hp->n_rot);
    if (!s && (hp->n_rot > hp->head_dim_k || hp->n_rot % 2))
        s = pkv_err(PKV_ERR_FORMAT, "%s: rope.dimension_count %d must be even and at most the head size %d", lab, hp->n_rot,
                    hp->head_dim_k);
    if (!s) s = opt_f32(g, arch, "rope.freq_base", 10000.0f, &hp->rope_base);
    if (!s) s = opt_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps);
    if (!s && !(hp->rope_base > 0))
        s = pkv_err(PKV_ERR_FORMAT, "%s: rope.freq_base %g must be > 0", lab, (double)hp->rope_base);
    if (!s && !(hp->rms_eps > 0 && hp->rms_eps < 1))
        s = pkv_err(PKV_ERR_FORMAT, "%s: attention.layer_norm_rms_epsilon %g is outside (0, 1)", lab, (double)hp->rms_eps);
    hp->rope_freq_scale = 1.0f;
    /* RoPE scaling: none, linear and YaRN; anything else (LongRoPE, ...) would give
     * silently wrong output, so it is refused. Without rope.scaling.type the scaling
     * is linear, as llama.cpp reads a file: its rope.scaling.factor, or the older
     * rope.scale_linear, still applies (absent: 1). */
    key(k, sizeof k, arch, "rope.scaling.type");
    {
        const char *st = "linear";
        size_t sl = 6;
        if (!s && pkv_gguf_find_key(g, k) >= 0) s = pkv_gguf_get_str(g, k, &st, &sl);
        const bool yarn = !s && sl == 4 && !memcmp(st, "yarn", 4);
        if (!s && !(sl == 4 && !memcmp(st, "none", 4))) {
            if ((sl == 6 && !memcmp(st, "linear", 6)) || yarn) {
                float f = 1.0f;
                char kf[128];
                key(kf, sizeof kf, arch, "rope.scaling.factor");
                const char *fk = pkv_gguf_find_key(g, kf) >= 0 ? "rope.scaling.factor" : "rope.scale_linear";
                s = opt_f32(g, arch, fk, 1.0f, &f);
                if (!s && !(f > 0 && f < INFINITY))
                    s = pkv_err(PKV_ERR_FORMAT, "%s: %s.%s %g must be > 0", lab, arch, fk, (double)f);
                if (!s) hp->rope_freq_scale = 1.0f / f;
            } else {
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: RoPE scaling '%.*s' is not supported (supported: none, linear, yarn)",
                            lab, (int)sl, st);
            }
        }
        /* YaRN as llama.cpp runs it: ext_factor 1, the correction range from the
         * original context and beta_fast / beta_slow, and the magnitude factor
         * 1 + 0.1 ln(factor) on cos and sin (forward.c). A zero original context
         * would put the whole range at -inf: refused, not replaced. The betas are the
         * file's (its converter copies the model's config; 32 and 1 when absent, which
         * is what gpt-oss has): llama.cpp reads those two keys only for grok and
         * mistral3 and runs every other architecture at 32 / 1, so a file with other
         * values differs there, deliberately. Its rope.scaling.yarn_ext_factor and
         * yarn_attn_factor are ignored, as llama.cpp ignores them for these
         * architectures. */
        if (!s && yarn) {
            hp->rope_ext_factor = 1.0f;
            s = opt_u32(g, arch, "rope.scaling.original_context_length", 1, 1u << 30, hp->n_ctx_train, &hp->rope_n_ctx_orig);
            if (!s) s = opt_f32(g, arch, "rope.scaling.yarn_beta_fast", 32.0f, &hp->rope_beta_fast);
            if (!s) s = opt_f32(g, arch, "rope.scaling.yarn_beta_slow", 1.0f, &hp->rope_beta_slow);
            if (!s && !(hp->rope_beta_fast > 0 && hp->rope_beta_fast < INFINITY && hp->rope_beta_slow > 0 &&
                        hp->rope_beta_slow < INFINITY))
                s = pkv_err(PKV_ERR_FORMAT, "%s: '%s.rope.scaling.yarn_beta_fast' %g and '_slow' %g must be > 0", lab, arch,
                            (double)hp->rope_beta_fast, (double)hp->rope_beta_slow);
            float log_mul = 0;
            if (!s) s = opt_f32(g, arch, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul);
            if (!s && log_mul != 0)
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: key '%s.rope.scaling.yarn_log_multiplier' (%g, DeepSeek's YaRN "
                            "magnitude) is not supported", lab, arch, (double)log_mul);
        }
    }
    if (!s) s = opt_f32(g, arch, "rope.scaling.attn_factor", 1.0f, &hp->rope_attn_factor);
    if (!s && !(hp->rope_attn_factor > 0 && hp->rope_attn_factor < INFINITY))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.scaling.attn_factor' is %g, must be > 0", lab, arch,
                    (double)hp->rope_attn_factor);
    /* Phi-3 128k / Phi-3.5 / Phi-4-mini: LongRoPE's per-dimension factors */
    if (!s && (pkv_gguf_find_tensor(g, "rope_factors_long.weight") || pkv_gguf_find_tensor(g, "rope_factors_short.weight")))
        s = pkv_err(PKV_ERR_UNSUPPORTED,
                    "%s: tensors 'rope_factors_long.weight'/'rope_factors_short.weight' (LongRoPE: Phi-3 128k, Phi-3.5, "
                    "Phi-4-mini) are not supported yet; Phi-3 4k-context files are",
                    lab);
    if (!s && pkv_gguf_find_tensor(g, "rope_freqs.weight"))
        s = pkv_err(PKV_ERR_UNSUPPORTED,
                    "%s: tensor 'rope_freqs.weight' (Llama 3.1-style RoPE frequency scaling) is not supported", lab);
    hp->rope_neox = hp->arch != PKV_ARCH_LLAMA;
    bool gemma3 = hp->arch == PKV_ARCH_GEMMA3;
    if (!s && (hp->arch == PKV_ARCH_GEMMA2 || gemma3)) { /* llama.cpp's keys and rules for Gemma 2 and 3 */
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->gelu = true;
        /* gemma2: even layers slide, odd layers see everything; gemma3: five of every
         * six layers slide, with their own RoPE base (llama.cpp's
         * rope_freq_base_train_swa) and no RoPE scaling, which is for the global layers */
        hp->swa_pattern = gemma3 ? 6 : 2;
        hp->rope_base_swa = gemma3 ? 10000.0f : 0.0f;
        hp->rope_freq_scale_swa = 1.0f;
        /* gemma3 needs the window, as llama.cpp does: without it the sliding layers
         * would see everything, silently wrong */
        s = gemma3 ? need_u32(g, arch, "attention.sliding_window", 1, 1u << 30, &hp->n_swa)
                   : opt_u32(g, arch, "attention.sliding_window", 1, 1u << 30, 0, &hp->n_swa);
        if (!s && hp->n_swa > hp->n_ctx_train)
            s = pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.sliding_window' %d is larger than '%s.context_length' %d", lab,
                        arch, hp->n_swa, arch, hp->n_ctx_train);
        /* a file may give the sliding layers' base (llama.cpp reads the key too) */
        if (!s && gemma3) s = opt_f32(g, arch, "rope.freq_base_swa", 10000.0f, &hp->rope_base_swa);
        if (!s && gemma3 && !(hp->rope_base_swa > 0 && hp->rope_base_swa < INFINITY))
            s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch,
                        (double)hp->rope_base_swa);
        if (!s) s = opt_f32(g, arch, "attn_logit_softcapping", 0.0f, &hp->attn_softcap);
        if (!s) s = opt_f32(g, arch, "final_logit_softcapping", 0.0f, &hp->final_softcap);
        if (!s && (!(hp->attn_softcap >= 0) || !(hp->final_softcap >= 0) || hp->attn_softcap == INFINITY ||
                   hp->final_softcap == INFINITY))
            s = pkv_err(PKV_ERR_FORMAT, "%s: '%s.attn_logit_softcapping' %g and '%s.final_logit_softcapping' %g must be >= 0",
                        lab, arch, (double)hp->attn_softcap, arch, (double)hp->final_softcap);
        /* the query scale: by model size, as llama.cpp does (the 27B models, gemma2's
         * 46 layers and gemma3's 62, use n_embd / n_head; the others the head size).
         * gemma3 has no soft-caps in its files; where the keys are there anyway they
         * are honoured, as for gemma2. */
        int n_layer_27b = gemma3 ? 62 : 46;
        if (!s)
            hp->attn_scale =
                1.0f / sqrtf(hp->n_layer == n_layer_27b ? (float)(hp->n_embd / n_head[0]) : (float)hp->head_dim_k);
    }
    if (!s && oss) { /* llama.cpp's llama_model_openai_moe::load_arch_hparams */
        hp->attn_sinks = true;
        hp->swiglu_oai = true;
        hp->moe_weight_softmax = true;
        /* every other layer slides, the even ones (set_swa_pattern(2); the file may
         * say otherwise), over the required attention.sliding_window */
        s = need_u32(g, arch, "attention.sliding_window", 1, 1u << 30, &hp->n_swa);
        if (!s && hp->n_swa > hp->n_ctx_train)
            s = pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.sliding_window' %d is larger than '%s.context_length' %d", lab,
                        arch, hp->n_swa, arch, hp->n_ctx_train);
        if (!s) s = opt_u32(g, arch, "attention.sliding_window_pattern", 1, 4096, 2, &hp->swa_pattern);
        /* the sliding layers rotate as the others unless the file gives them a base */
        float base_swa = 0;
        if (!s) s = opt_f32(g, arch, "rope.freq_base_swa", 0.0f, &base_swa);
        if (!s && base_swa != 0 && !(base_swa > 0 && base_swa < INFINITY))
            s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch, (double)base_swa);
        hp->rope_base_swa = base_swa;
        hp->rope_freq_scale_swa = hp->rope_freq_scale;
        /* llama.cpp sizes the heads by the rotary dimensions and scales scores by
         * 1/sqrt(n_rot): both are the head size here, or the file is refused */
        if (!s && hp->n_rot != hp->head_dim_k)
            s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: '%s.rope.dimension_count' %d differs from '%s.attention.key_length' %d "
                        "(gpt-oss rotates whole heads)", lab, arch, hp->n_rot, arch, hp->head_dim_k);
    }
    if (s) {
        pkv_free(n_head);
        pkv_free(n_head_kv);
        pkv_free(n_ff);
        return s;
    }
    *n_head_out = n_head;
    *n_head_kv_out = n_head_kv;
    *n_ff_out = n_ff;
    return PKV_OK;
}
