/* phi3: Phi-3, Phi-3-medium, and with LongRoPE Phi-3-128k, Phi-3.5 and Phi-4-mini.
 * Fused matrices: attn_qkv holds Q's rows, then K's, then V's (separate attn_q/k/v
 * are taken too); ffn_up holds the gate's rows, then the up projection's. Partial
 * rotary through rope.dimension_count.
 *
 * LongRoPE: rope_factors_short.weight and rope_factors_long.weight, f32 [n_rot / 2]
 * each (both or neither): pair i's angle is divided by factor i. As llama.cpp, the
 * long factors serve a context above rope.scaling.original_context_length (default
 * context_length), the short ones any other: here the cache decides by its
 * per-sequence limit (pkv_model_rope_factors), so all K of a cache turns one way.
 * cos and sin are multiplied by rope.scaling.attn_factor (hparams.c; the converter
 * writes sqrt(1 + ln(context / original) / ln(original))) with either set.
 *
 *   x += o(attention(rope(q), rope(k), v))      [q; k; v] = qkv·attn_norm(x)
 *   x += down(silu(g) * u)                      [g; u] = up·ffn_norm(x)            */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

#include <math.h>
#include <string.h>

static const char *const k_factors[2] = {"rope_factors_short.weight", "rope_factors_long.weight"};

/* Both factor tensors or neither, f32 [n_rot / 2], every factor finite and > 0;
 * the original context of the choice between them. */
static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    const pkv_gguf_tensor *t[2] = {pkv_gguf_find_tensor(g, k_factors[0]), pkv_gguf_find_tensor(g, k_factors[1])};
    if (!t[0] && !t[1]) return PKV_OK;
    if (!t[0] || !t[1])
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' is present and '%s' is not: LongRoPE needs both", lab,
                       k_factors[t[0] ? 0 : 1], k_factors[t[0] ? 1 : 0]);
    const int64_t n = hp->n_rot / 2;
    for (int k = 0; k < 2; k++) {
        const pkv_gguf_tensor *x = t[k];
        if (x->ne[0] != n || x->ne[1] != 1 || x->ne[2] != 1 || x->ne[3] != 1)
            return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld] "
                           "(rope.dimension_count %d / 2)", lab, k_factors[k], (long long)x->ne[0], (long long)x->ne[1],
                           (long long)x->ne[2], (long long)x->ne[3], (long long)n, hp->n_rot);
        if (x->type != PKV_TYPE_F32)
            return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has type %s, expected f32", lab, k_factors[k],
                           pkv_type_name(x->type));
        for (int64_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, (const uint8_t *)x->data + 4 * i, 4);
            if (!(v > 0 && v < INFINITY))
                return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' entry %lld is %g, expected a finite factor > 0", lab,
                               k_factors[k], (long long)i, (double)v);
        }
    }
    return pkv_hp_opt_u32(g, arch, "rope.scaling.original_context_length", 1, 1u << 30, hp->n_ctx_train,
                          &hp->yarn.n_ctx_orig);
}

/* The factors (checked by hparams) on the host and on every device. */
static pkv_status load_global(pkv_loader *L) {
    pkv_model *m = pkv_loader_model(L);
    const int n = m->hp.n_rot / 2;
    if (!pkv_gguf_find_tensor(pkv_loader_gguf(L), k_factors[0])) return PKV_OK;
    m->longrope.host = pkv_malloc((size_t)n * 2 * sizeof(float));
    if (!m->longrope.host) return pkv_err(PKV_ERR_NOMEM, "%s: LongRoPE factors", m->label);
    for (int k = 0; k < 2; k++) {
        float *v = NULL;
        pkv_status s = pkv_load_host_f32(L, k_factors[k], n, true, &v);
        if (s) return s;
        memcpy(m->longrope.host + (size_t)k * n, v, (size_t)n * sizeof *v);
        pkv_free(v);
    }
    m->longrope.n = n;
    for (int d = 0; d < m->n_dev; d++) {
        pkv_status s = pkv_weight_host(m, m->devs[d], m->longrope.host, 2 * (int64_t)n, &m->longrope.dev[d]);
        if (s) return s;
    }
    return PKV_OK;
}

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

/* LongRoPE (rope_orig_ctx): the keys llama.cpp's converter writes for Phi-3-128k */
static pkv_status mk_keys(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    if (!p->rope_orig_ctx) return PKV_OK;
    const double orig = p->rope_orig_ctx, scale = (double)p->n_ctx / orig;
    const double attn = scale > 1 && orig > 1 ? sqrt(1 + log(scale) / log(orig)) : 1.0;
    PKV_MK_TRY(pkv_mk_u32(b, "rope.scaling.original_context_length", (uint32_t)p->rope_orig_ctx));
    return pkv_mk_f32(b, "rope.scaling.attn_factor", (float)attn);
}

/* and its factors: short ones near 1, long ones well above */
static pkv_status mk_globals(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    if (!p->rope_orig_ctx) return PKV_OK;
    PKV_MK_TRY(pkv_mk_add(b, k_factors[0], PKV_TYPE_F32, p->head_dim / 2, 1, 1.5, 0.4));
    return pkv_mk_add(b, k_factors[1], PKV_TYPE_F32, p->head_dim / 2, 1, 8.0, 6.0);
}

static const pkv_arch_mk mk = {.takes = PKV_MK_LONGROPE, .rope_base = 10000.0f, .rms_eps = 1e-5f, .keys = mk_keys,
                               .globals = mk_globals, .layer = mk_layer};

const pkv_arch_ops pkv_arch_phi3 = {.name = "phi3", .rope_neox = true, .longrope = true,
                                    .hparams = hparams, .load_global = load_global, .load_layer = load_layer,
                                    .layer = layer, .mk = &mk};
