/* Hyper-parameters from GGUF metadata, with the key names llama.cpp's converters
 * write ("<arch>.block_count", "<arch>.attention.head_count", ...). Head counts and
 * FFN sizes may be per-layer arrays (I4: never assume layer 0 speaks for all). */
#include "model/arch/arch.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The model fingerprint hashes pkv_hparams' bytes, so its groups must keep the
 * offsets the flat fields had: 4-byte members only, no padding. */
_Static_assert(sizeof(((pkv_hparams *)0)->moe) == 3 * sizeof(int), "hparams.moe changes the fingerprint");
_Static_assert(sizeof(((pkv_hparams *)0)->swa) == 4 * sizeof(float), "hparams.swa changes the fingerprint");
_Static_assert(sizeof(((pkv_hparams *)0)->yarn) == 5 * sizeof(float), "hparams.yarn changes the fingerprint");
_Static_assert(offsetof(pkv_hparams, moe) == offsetof(pkv_hparams, rms_eps) + sizeof(float), "hparams.moe moved");

/* Every architecture, in the order of pkv_arch; each is one file in src/model/arch/. */
static const pkv_arch_ops *const k_archs[PKV_ARCH_COUNT] = {
    [PKV_ARCH_LLAMA] = &pkv_arch_llama,   [PKV_ARCH_QWEN2] = &pkv_arch_qwen2,   [PKV_ARCH_QWEN3] = &pkv_arch_qwen3,
    [PKV_ARCH_QWEN3MOE] = &pkv_arch_qwen3moe, [PKV_ARCH_PHI3] = &pkv_arch_phi3, [PKV_ARCH_GEMMA2] = &pkv_arch_gemma2,
    [PKV_ARCH_GEMMA3] = &pkv_arch_gemma3, [PKV_ARCH_GPT_OSS] = &pkv_arch_gpt_oss, [PKV_ARCH_QWEN35] = &pkv_arch_qwen35,
    [PKV_ARCH_GEMMA4] = &pkv_arch_gemma4, [PKV_ARCH_GEMMA4_ASSISTANT] = &pkv_arch_gemma4_assistant,
    [PKV_ARCH_SMOLLM3] = &pkv_arch_smollm3, [PKV_ARCH_MISTRAL3] = &pkv_arch_mistral3,
    [PKV_ARCH_QWEN35MOE] = &pkv_arch_qwen35moe,
    [PKV_ARCH_DEEPSEEK2] = &pkv_arch_deepseek2,
    [PKV_ARCH_LLAMA4] = &pkv_arch_llama4,
    [PKV_ARCH_GLM4MOE] = &pkv_arch_glm4moe,
    [PKV_ARCH_GRANITEHYBRID] = &pkv_arch_granitehybrid,
    [PKV_ARCH_NEMOTRON_H] = &pkv_arch_nemotron_h,
    [PKV_ARCH_LFM2] = &pkv_arch_lfm2,
    [PKV_ARCH_LFM2MOE] = &pkv_arch_lfm2moe,
};

const pkv_arch_ops *pkv_arch_ops_of(pkv_arch a) { return k_archs[(unsigned)a < PKV_ARCH_COUNT ? a : 0]; }

const pkv_arch_ops *pkv_arch_ops_find(const char *name) {
    for (int a = 0; name && a < PKV_ARCH_COUNT; a++)
        if (!strcmp(name, k_archs[a]->name)) return k_archs[a];
    return NULL;
}

const char *pkv_arch_names_where(bool (*pred)(const pkv_arch_ops *ops, unsigned arg), unsigned arg, const char *last,
                                 char *buf, size_t cap) {
    int n = 0, i = 0;
    for (int a = 0; a < PKV_ARCH_COUNT; a++) n += pred(k_archs[a], arg);
    buf[0] = 0;
    for (int a = 0; a < PKV_ARCH_COUNT; a++)
        if (pred(k_archs[a], arg)) {
            size_t len = strlen(buf);
            snprintf(buf + len, cap - len, "%s%s", i == 0 ? "" : i == n - 1 ? last : ", ", k_archs[a]->name);
            i++;
        }
    return buf;
}

const char *pkv_arch_name(pkv_arch a) { return (unsigned)a < PKV_ARCH_COUNT ? k_archs[a]->name : "unknown"; }

/* "llama, qwen2, ...": the supported list for messages. */
const char *pkv_arch_list(void) {
    static char buf[256];
    if (!buf[0])
        for (int a = 0; a < PKV_ARCH_COUNT; a++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", a ? ", " : "", k_archs[a]->name);
    return buf;
}

static void key(char *buf, size_t n, const char *arch, const char *suffix) { snprintf(buf, n, "%s.%s", arch, suffix); }

/* A u32 that must be present. */
pkv_status pkv_hp_need_u32(const pkv_gguf *g, const char *arch, const char *suffix, uint32_t lo, uint32_t hi, int *out) {
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
pkv_status pkv_hp_opt_u32(const pkv_gguf *g, const char *arch, const char *suffix, uint32_t lo, uint32_t hi, int def, int *out) {
    char k[128];
    key(k, sizeof k, arch, suffix);
    if (pkv_gguf_find_key(g, k) < 0) {
        *out = def;
        return PKV_OK;
    }
    return pkv_hp_need_u32(g, arch, suffix, lo, hi, out);
}

pkv_status pkv_hp_opt_f32(const pkv_gguf *g, const char *arch, const char *suffix, float def, float *out) {
    char k[128];
    key(k, sizeof k, arch, suffix);
    if (pkv_gguf_find_key(g, k) < 0) {
        *out = def;
        return PKV_OK;
    }
    return pkv_gguf_get_f32(g, k, out);
}

pkv_status pkv_hp_ssm_keys(const pkv_gguf *g, const char *arch, pkv_hparams *hp, int *inner) {
    pkv_status s;
    if ((s = pkv_hp_need_u32(g, arch, "ssm.conv_kernel", 2, PKV_SSM_CONV_MAX, &hp->ssm.d_conv)) ||
        (s = pkv_hp_need_u32(g, arch, "ssm.inner_size", 1, 1 << 20, inner)) ||
        (s = pkv_hp_need_u32(g, arch, "ssm.state_size", 1, 4096, &hp->ssm.d_k)) ||
        (s = pkv_hp_need_u32(g, arch, "ssm.time_step_rank", 1, 4096, &hp->ssm.n_v_heads)))
        return s;
    return pkv_hp_need_u32(g, arch, "ssm.group_count", 1, 4096, &hp->ssm.n_k_heads);
}

pkv_status pkv_hp_window(const pkv_gguf *g, const char *arch, pkv_hparams *hp, bool required) {
    pkv_status s = required ? pkv_hp_need_u32(g, arch, "attention.sliding_window", 1, 1u << 30, &hp->swa.n)
                            : pkv_hp_opt_u32(g, arch, "attention.sliding_window", 1, 1u << 30, 0, &hp->swa.n);
    if (!s && hp->swa.n > hp->n_ctx_train)
        s = pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.sliding_window' %d is larger than '%s.context_length' %d",
                    pkv_gguf_label(g), arch, hp->swa.n, arch, hp->n_ctx_train);
    return s;
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
        s = pkv_hp_need_u32(g, arch, suffix, (uint32_t)lo, (uint32_t)hi, &x);
        for (int l = 0; !s && l < n_layer; l++) v[l] = x;
    }
    if (s) {
        pkv_free(v);
        return s;
    }
    *out = v;
    return PKV_OK;
}

/* The routing keys llama.cpp writes for a mixture of experts beyond its sizes, where
 * the file has them (the architecture chooses what to do with them). */
static pkv_status moe_routing(const pkv_gguf *g, const char *arch, pkv_hparams *hp) {
    const char *lab = pkv_gguf_label(g);
    const int X = hp->moe.n_expert;
    char k[128];
    pkv_status s;
    if ((s = pkv_hp_opt_u32(g, arch, "expert_shared_count", 0, 4096, 0, &hp->moe_route.n_shared)) ||
        (s = pkv_hp_opt_u32(g, arch, "expert_shared_feed_forward_length", 0, 1 << 24, 0, &hp->moe_route.n_ff_shexp)) ||
        (s = pkv_hp_opt_u32(g, arch, "expert_group_count", 0, 4096, 0, &hp->moe_route.n_group)) ||
        (s = pkv_hp_opt_u32(g, arch, "expert_group_used_count", 0, 4096, 0, &hp->moe_route.n_group_used)) ||
        (s = pkv_hp_opt_u32(g, arch, "expert_gating_func", 0, 3, 0, &hp->moe_route.gating)) ||
        (s = pkv_hp_opt_f32(g, arch, "expert_weights_scale", 0.0f, &hp->moe_route.w_scale)))
        return s;
    key(k, sizeof k, arch, "expert_weights_norm");
    if (pkv_gguf_find_key(g, k) >= 0 && (s = pkv_gguf_get_bool(g, k, &hp->moe_route.norm_w))) return s;
    if (!(hp->moe_route.w_scale >= 0 && hp->moe_route.w_scale < 1e6f))
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.expert_weights_scale' %g must be in [0, 1e6)", lab, arch,
                       (double)hp->moe_route.w_scale);
    const int G = hp->moe_route.n_group, GU = hp->moe_route.n_group_used;
    if (G > 1) {
        if (X % G)
            return pkv_err(PKV_ERR_FORMAT, "%s: '%s.expert_group_count' %d does not divide the %d experts of '%s.expert_count'",
                           lab, arch, G, X, arch);
        if (GU < 1 || GU > G)
            return pkv_err(PKV_ERR_FORMAT, "%s: '%s.expert_group_used_count' %d must be in [1, %d] ('%s.expert_group_count')",
                           lab, arch, GU, G, arch);
        if (X / G < 2)
            return pkv_err(PKV_ERR_FORMAT, "%s: '%s.expert_group_count' %d leaves %d expert per group; a group's score "
                           "is the sum of its best two", lab, arch, G, X / G);
        if ((int64_t)GU * (X / G) < hp->moe.n_used)
            return pkv_err(PKV_ERR_FORMAT, "%s: '%s.expert_group_used_count' %d groups of %d experts hold fewer than the %d "
                           "of '%s.expert_used_count'", lab, arch, GU, X / G, hp->moe.n_used, arch);
    }
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
        if (!strcmp(arch, k_archs[a]->name)) hp->arch = (pkv_arch)a;
    if (hp->arch == PKV_ARCH_COUNT)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)", lab, arch, pkv_arch_list());
    const pkv_arch_ops *ops = k_archs[hp->arch];

    if ((s = pkv_hp_need_u32(g, arch, "block_count", 1, 4096, &hp->n_layer))) return s;
    if ((s = pkv_hp_need_u32(g, arch, "embedding_length", 1, 1 << 20, &hp->n_embd))) return s;
    if ((s = pkv_hp_opt_u32(g, arch, "context_length", 1, 1u << 30, 4096, &hp->n_ctx_train))) return s;
    /* llama.cpp's enum (none 0, mean 1, cls 2, last 3, rank 4); -1 when the file says nothing */
    if ((s = pkv_hp_opt_u32(g, arch, "pooling_type", 0, 4, -1, &hp->pooling))) return s;
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
        s = per_layer(g, arch, "attention.head_count_kv", hp->n_layer, -1, ops->kv0_recurrent ? 0 : 1, 4096, &n_head_kv);
    }
    /* moe_after_dense: experts where the file has them, after its leading dense layers */
    key(k, sizeof k, arch, "expert_count");
    const bool moe = ops->moe || (ops->moe_after_dense && pkv_gguf_find_key(g, k) >= 0);
    int n_dense = 0;
    if (!s && moe && ops->moe_after_dense)
        s = pkv_hp_opt_u32(g, arch, "leading_dense_block_count", 0, 1u << 20, 0, &n_dense);
    if (!s && moe) { /* expert counts and sizes: llama.cpp's keys */
        s = pkv_hp_need_u32(g, arch, "expert_count", 1, 4096, &hp->moe.n_expert);
        if (!s) s = pkv_hp_need_u32(g, arch, "expert_used_count", 1, 4096, &hp->moe.n_used);
        if (!s) s = pkv_hp_need_u32(g, arch, "expert_feed_forward_length", 1, 1 << 24, &hp->moe.n_ff);
        if (!s && hp->moe.n_used > hp->moe.n_expert)
            s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.expert_used_count' is %d, more than the %d experts of '%s.expert_count'",
                        lab, arch, hp->moe.n_used, hp->moe.n_expert, arch);
    }
    if (!s && moe) s = moe_routing(g, arch, hp);
    /* a MoE layer's FFN is its experts: feed_forward_length (a dense size some files
     * also carry) is not used, but by leading dense layers (moe_after_dense) */
    if (!s)
        s = per_layer(g, arch, "feed_forward_length", hp->n_layer, moe ? hp->moe.n_ff : -1, ops->ff0_layers ? 0 : 1, 1 << 24,
                      &n_ff);
    /* kv0_recurrent: a layer of no KV heads is a recurrent one, or with ff0_layers and
     * FFN rows an FFN alone */
    for (int l = 0; !s && ops->kv0_recurrent && l < hp->n_layer; l++) {
        if (n_head_kv[l]) continue;
        const bool ffn = ops->ff0_layers && n_ff[l] > 0;
        if (l >= 64)
            s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: layer %d has no KV heads ('%s.attention.head_count_kv' 0); such layers "
                        "after the 64th are not supported", lab, l, arch);
        else if (ffn)
            hp->kinds.ffn_only |= 1ull << l;
        else
            hp->recurrent |= 1ull << l;
        n_head_kv[l] = n_head[l];
    }
    for (int l = n_dense; !s && moe && l < hp->n_layer; l++) n_ff[l] = hp->moe.n_ff;
    for (int l = 0; !s && l < hp->n_layer; l++)
        if (n_head[l] % n_head_kv[l])
            s = pkv_err(PKV_ERR_FORMAT, "%s: layer %d has %d attention heads, not a multiple of its %d KV heads", lab, l,
                        n_head[l], n_head_kv[l]);
    int def_hd = n_head && n_head[0] && hp->n_embd % n_head[0] == 0 ? hp->n_embd / n_head[0] : 0;
    if (!s) s = pkv_hp_opt_u32(g, arch, "attention.key_length", 1, 4096, def_hd, &hp->head_dim_k);
    if (!s) s = pkv_hp_opt_u32(g, arch, "attention.value_length", 1, 4096, hp->head_dim_k, &hp->head_dim_v);
    if (!s && hp->head_dim_k == 0)
        s = pkv_err(PKV_ERR_FORMAT, "%s: no '%s.attention.key_length' and embedding_length %d is not a multiple of head_count %d",
                    lab, arch, hp->n_embd, n_head[0]);
    if (!s) s = pkv_hp_opt_u32(g, arch, "rope.dimension_count", 2, 4096, hp->head_dim_k, &hp->n_rot);
    if (!s && (hp->n_rot > hp->head_dim_k || hp->n_rot % 2))
        s = pkv_err(PKV_ERR_FORMAT, "%s: rope.dimension_count %d must be even and at most the head size %d", lab, hp->n_rot,
                    hp->head_dim_k);
    if (!s) s = pkv_hp_opt_f32(g, arch, "rope.freq_base", 10000.0f, &hp->rope_base);
    if (!s) s = pkv_hp_opt_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps);
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
    float yarn_div = 1.0f; /* YaRN's magnitude divided by this (a log multiplier, below) */
    {
        const char *st = "linear";
        size_t sl = 6;
        if (!s && pkv_gguf_find_key(g, k) >= 0) s = pkv_gguf_get_str(g, k, &st, &sl);
        const bool yarn = !s && sl == 4 && !memcmp(st, "yarn", 4);
        if (!s && !(sl == 4 && !memcmp(st, "none", 4))) {
            /* "longrope" (a name some converters write for LongRoPE): the factors do
             * the work (an arch with pkv_arch_ops.longrope reads them); a linear factor,
             * if given, still applies, as in llama.cpp */
            const bool longrope = ops->longrope && sl == 8 && !memcmp(st, "longrope", 8);
            if ((sl == 6 && !memcmp(st, "linear", 6)) || yarn || longrope) {
                float f = 1.0f;
                char kf[128];
                key(kf, sizeof kf, arch, "rope.scaling.factor");
                const char *fk = pkv_gguf_find_key(g, kf) >= 0 ? "rope.scaling.factor" : "rope.scale_linear";
                s = pkv_hp_opt_f32(g, arch, fk, 1.0f, &f);
                if (!s && !(f > 0 && f < INFINITY))
                    s = pkv_err(PKV_ERR_FORMAT, "%s: %s.%s %g must be > 0", lab, arch, fk, (double)f);
                if (!s) hp->rope_freq_scale = 1.0f / f;
            } else {
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: RoPE scaling '%.*s' is not supported (supported: none, linear, yarn%s)",
                            lab, (int)sl, st, ops->longrope ? ", longrope" : "");
            }
        }
        /* YaRN as llama.cpp runs it: ext_factor 1, the correction range from the
         * original context and beta_fast / beta_slow, and the magnitude factor
         * 1 + 0.1 ln(factor) on cos and sin (forward.c). A zero original context
         * would put the whole range at -inf: refused, not replaced. The betas are the
         * file's (its converter copies the model's config; 32 and 1 when absent, which
         * is what the YaRN files we load have): llama.cpp reads those two keys for
         * only a few architectures and runs the others at 32 / 1, so a file with other
         * values differs there, deliberately. Its rope.scaling.yarn_ext_factor and
         * yarn_attn_factor are ignored, as llama.cpp ignores them for these
         * architectures. */
        if (!s && yarn) {
            hp->yarn.ext_factor = 1.0f;
            s = pkv_hp_opt_u32(g, arch, "rope.scaling.original_context_length", 1, 1u << 30, hp->n_ctx_train, &hp->yarn.n_ctx_orig);
            if (!s) s = pkv_hp_opt_f32(g, arch, "rope.scaling.yarn_beta_fast", 32.0f, &hp->yarn.beta_fast);
            if (!s) s = pkv_hp_opt_f32(g, arch, "rope.scaling.yarn_beta_slow", 1.0f, &hp->yarn.beta_slow);
            if (!s && !(hp->yarn.beta_fast > 0 && hp->yarn.beta_fast < INFINITY && hp->yarn.beta_slow > 0 &&
                        hp->yarn.beta_slow < INFINITY))
                s = pkv_err(PKV_ERR_FORMAT, "%s: '%s.rope.scaling.yarn_beta_fast' %g and '_slow' %g must be > 0", lab, arch,
                            (double)hp->yarn.beta_fast, (double)hp->yarn.beta_slow);
            float log_mul = 0;
            if (!s) s = pkv_hp_opt_f32(g, arch, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul);
            if (!s && log_mul != 0 && !ops->yarn_log_mul)
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: key '%s.rope.scaling.yarn_log_multiplier' (%g, YaRN's magnitude "
                            "multiplier) is not supported for '%s'", lab, arch, (double)log_mul, arch);
            if (!s && !isfinite(log_mul))
                s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.scaling.yarn_log_multiplier' is %g, must be finite", lab,
                            arch, (double)log_mul);
            /* With a log multiplier llama.cpp's magnitude on cos and sin is
             * mscale(factor, 1) / mscale(factor, log_mul), mscale(f, m) = 1 + 0.1 m ln f
             * (1 where f <= 1), instead of mscale(factor, 1); blocks.c multiplies
             * attn_factor by mscale(factor, 1), so it is divided here by the other. */
            if (!s && log_mul != 0 && hp->rope_freq_scale < 1.0f)
                yarn_div = 1.0f + 0.1f * log_mul * logf(1.0f / hp->rope_freq_scale);
        }
    }
    if (!s) s = pkv_hp_opt_f32(g, arch, "rope.scaling.attn_factor", 1.0f, &hp->yarn.attn_factor);
    if (!s && !(hp->yarn.attn_factor > 0 && hp->yarn.attn_factor < INFINITY))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.scaling.attn_factor' is %g, must be > 0", lab, arch,
                    (double)hp->yarn.attn_factor);
    if (!s && !(yarn_div > 0 && yarn_div < INFINITY))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.scaling.yarn_log_multiplier' gives YaRN a magnitude divisor of %g "
                    "(1 + 0.1 * multiplier * ln(factor)), must be > 0", lab, arch, (double)yarn_div);
    if (!s) hp->yarn.attn_factor /= yarn_div;
    /* LongRoPE's per-pair factors: read by the arch's load hooks where ops->longrope */
    if (!s && !ops->longrope &&
        (pkv_gguf_find_tensor(g, "rope_factors_long.weight") || pkv_gguf_find_tensor(g, "rope_factors_short.weight")))
        s = pkv_err(PKV_ERR_UNSUPPORTED,
                    "%s: tensors 'rope_factors_long.weight'/'rope_factors_short.weight' (LongRoPE) are not read by "
                    "architecture '%s'", lab, arch);
    if (!s && !ops->rope_freqs && pkv_gguf_find_tensor(g, "rope_freqs.weight"))
        s = pkv_err(PKV_ERR_UNSUPPORTED,
                    "%s: tensor 'rope_freqs.weight' (Llama 3.1-style RoPE frequency scaling) is not supported", lab);
    hp->rope_neox = ops->rope_neox;
    if (!s && ops->hparams) s = ops->hparams(g, arch, hp, n_head);
    /* the architecture's KV head count over the file's (hp.n_head_kv_all) */
    for (int l = 0; !s && hp->n_head_kv_all > 0 && l < hp->n_layer; l++) n_head_kv[l] = hp->n_head_kv_all;
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
