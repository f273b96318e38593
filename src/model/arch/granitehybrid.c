/* granitehybrid: IBM Granite 4.0-H (and Bamba-style files): Mamba-2 layers beside
 * attention layers, as llama.cpp's granite-hybrid reads them. A layer whose
 * attention.head_count_kv entry is 0 is a Mamba-2 layer (its state in the cache's
 * state slots), the others attend; attention has no RoPE where rope.scaling.finetuned
 * is false (Granite 4.0-H), normal RoPE otherwise. Every layer has a SwiGLU FFN, or
 * (expert_count) softmax-routed experts, renormalised, plus an ungated shared expert
 * where expert_shared_feed_forward_length is given. Granite's multipliers: the token
 * embeddings times embedding_scale, the scores times attention.scale (in place of
 * 1/sqrt(head size)), each block's output times residual_scale before its add, the
 * logits divided by logit_scale.
 *
 *   Mamba-2:    x += s * mamba2(attn_norm(x))                  (blocks.h: pkv_blk_mamba2)
 *   attention:  x += s * o(attention(q, k, v))                 of attn_norm(x)
 *   both:       x += s * down(silu(gate·h) * (up·h))           h = ffn_norm(x)
 *               (experts: the top k of softmax(router·h), renormalised, plus the shared expert)
 *
 * Split over several devices, a Mamba-2 layer goes by SSM groups (each device its
 * groups' heads, B and C, and that part of the state); with fewer groups than
 * devices (Granite 4.0-H has one) it runs whole on the first device (rec_first)
 * while attention and the FFN split. */
#include <math.h>
#include <string.h>

#include "model/arch/arch.h"
#include "model/arch/mk.h"

pkv_status pkv_mamba2_hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp) {
    const char *lab = pkv_gguf_label(g);
    int inner = 0;
    pkv_status s;
    if ((s = pkv_hp_ssm_keys(g, arch, hp, &inner))) return s;
    if (hp->ssm.n_v_heads % hp->ssm.n_k_heads)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.ssm.group_count' %d does not divide the %d heads of '%s.ssm.time_step_rank'",
                       lab, arch, hp->ssm.n_k_heads, hp->ssm.n_v_heads, arch);
    if (inner % hp->ssm.n_v_heads)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.ssm.inner_size' %d is not a multiple of the %d heads of "
                       "'%s.ssm.time_step_rank'", lab, arch, inner, hp->ssm.n_v_heads, arch);
    hp->ssm.d_v = inner / hp->ssm.n_v_heads;
    if (!hp->recurrent)
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.attention.head_count_kv' marks no layer as Mamba-2 (0 KV heads)", lab,
                       arch);
    if (hp->head_dim_k != hp->head_dim_v)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.key_length' %d and 'value_length' %d differ", lab, arch,
                       hp->head_dim_k, hp->head_dim_v);
    float as = 0;
    if ((s = pkv_hp_opt_f32(g, arch, "attention.scale", 0.0f, &as))) return s;
    if (!(as >= 0 && as < 1e6f))
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.attention.scale' is %g, expected a value in [0, 1e6) (0: none)", lab,
                       arch, (double)as);
    hp->attn_scale = as;
    return PKV_OK;
}

/* Granite's multipliers beside the Mamba-2 sizes and attention.scale. */
static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    pkv_status s = pkv_mamba2_hparams(g, arch, hp);
    if (s) return s;
    float es = 0;
    if ((s = pkv_hp_opt_f32(g, arch, "embedding_scale", 0.0f, &es)) ||
        (s = pkv_hp_opt_f32(g, arch, "residual_scale", 0.0f, &hp->mults.residual_scale)) ||
        (s = pkv_hp_opt_f32(g, arch, "logit_scale", 0.0f, &hp->mults.logit_scale)))
        return s;
    const float sc[3] = {es, hp->mults.residual_scale, hp->mults.logit_scale};
    static const char *const names[3] = {"embedding_scale", "residual_scale", "logit_scale"};
    for (int i = 0; i < 3; i++)
        if (!(sc[i] >= 0 && sc[i] < 1e6f))
            return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.%s' is %g, expected a value in [0, 1e6) (0: none)", lab, arch,
                           names[i], (double)sc[i]);
    hp->embd_scale = es;
    /* Granite uses rope.scaling.finetuned as its RoPE switch (llama.cpp: default on) */
    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.finetuned", arch);
    bool rope = true;
    if (pkv_gguf_find_key(g, k) >= 0 && (s = pkv_gguf_get_bool(g, k, &rope))) return s;
    hp->mults.nope = !rope;
    return PKV_OK;
}

/* Biases the blocks do not add are refused by name, never dropped. */
static pkv_status refuse_bias(pkv_loader *L, int il, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    if (!pkv_gguf_find_tensor(pkv_loader_gguf(L), name)) return PKV_OK;
    return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' (an FFN bias) is not supported for granitehybrid",
                   pkv_loader_model(L)->label, name);
}

pkv_status pkv_load_hybrid_attention(pkv_loader *L, int il) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_q.bias", il);
    const bool qkv_bias = pkv_gguf_find_tensor(pkv_loader_gguf(L), name) != NULL;
    snprintf(name, sizeof name, "blk.%d.attn_output.bias", il);
    const bool out_bias = pkv_gguf_find_tensor(pkv_loader_gguf(L), name) != NULL;
    return pkv_load_attention(L, il, &(pkv_attn_tensors){.qkv_bias = qkv_bias, .out_bias = out_bias});
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_model *m = pkv_loader_model(L);
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    pkv_status s;
    ly->recurrent = hp->recurrent >> il & 1;
    ly->nope = hp->mults.nope != 0;
    if ((s = pkv_load_norm(L, il, "attn_norm.weight", &ly->attn_norm)) ||
        (s = ly->recurrent ? pkv_load_mamba2(L, il) : pkv_load_hybrid_attention(L, il)) ||
        (s = pkv_load_norm(L, il, "ffn_norm.weight", &ly->ffn_norm)))
        return s;
    if (hp->moe.n_expert) return pkv_load_moe(L, il, hp->moe_route.n_ff_shexp ? PKV_MOE_SHARED : 0);
    if ((s = refuse_bias(L, il, "ffn_gate.bias")) || (s = refuse_bias(L, il, "ffn_up.bias")) ||
        (s = refuse_bias(L, il, "ffn_down.bias")))
        return s;
    return pkv_load_ffn(L, il, false);
}

/* The residual multiplier on the device (blocks.c multiplies each block's output). */
static pkv_status load_global(pkv_loader *L) {
    pkv_model *m = pkv_loader_model(L);
    const float r = m->hp.mults.residual_scale;
    return r != 0 && r != 1 ? pkv_weight_fill(m, m->dev, 1, r, &m->res_scale) : PKV_OK;
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_hparams *hp = &f->m->hp;
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = ly->recurrent ? pkv_blk_mamba2(f, il, &(pkv_mamba2_kind){.norm = &ly->attn_norm})
                                 : pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm});
    if (s) return s;
    if (hp->moe.n_expert)
        return pkv_blk_moe(f, il, &(pkv_moe_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU, .gating = PKV_MOE_SOFTMAX_TOPK,
                                                  .norm_w = true, .w_scale = hp->moe_route.w_scale});
    return pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
}

/* The logits divided by logit_scale, on the host copy. */
static pkv_status output(pkv_fwd *f, float *logits) {
    pkv_status s = pkv_blk_logits(f, logits);
    const float ls = f->m->hp.mults.logit_scale;
    if (!s && logits && ls != 0 && ls != 1) {
        const size_t n = (size_t)f->pl->n_out * (size_t)f->m->hp.n_vocab;
        for (size_t i = 0; i < n; i++) logits[i] /= ls;
    } else if (!s)
        s = pkv_device_sync(f->m->dev);
    return s;
}

void pkv_mamba2_layer_state(const pkv_model *m, int il, pkv_kv_layer_desc *d) {
    (void)il;
    pkv_mamba2_state_desc(&m->hp, d);
}

/* ------------------------------------------------------- pagekv mkmodel */

/* Layer l attends when l % 4 == 1 (four layers: Mamba-2, attention, Mamba-2, Mamba-2). */
static bool mk_attends(int l) { return l % 4 == 1; }

/* Four layers; Mamba-2 sizes: pkv_mk_mamba2_check (mk.h). */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (!p->n_layer) p->n_layer = 4;
    return pkv_mk_mamba2_check(p);
}

/* head_count_kv per layer: 0 marks a Mamba-2 layer. */
static pkv_status mk_sizes(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    PKV_MK_TRY(pkv_mk_u32(b, "feed_forward_length", (uint32_t)p->n_ff));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.head_count", (uint32_t)p->n_head));
    int32_t kv[64];
    for (int l = 0; l < p->n_layer; l++) kv[l] = mk_attends(l) ? p->n_head_kv : 0;
    return pkv_mk_arr(b, "attention.head_count_kv", PKV_GGUF_INT32, kv, (uint64_t)p->n_layer);
}

/* The SSM keys, Granite's multipliers (not 1, so a test sees each) and no RoPE. */
static pkv_status mk_keys(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    if (p->n_expert) {
        PKV_MK_TRY(pkv_mk_expert_keys(b, p->n_ff));
        PKV_MK_TRY(pkv_mk_u32(b, "expert_shared_feed_forward_length", (uint32_t)p->n_ff));
    }
    PKV_MK_TRY(pkv_mk_ssm_keys(b, 4, p->ssm_state, p->ssm_k_heads, p->ssm_v_heads, p->ssm_v_heads * p->ssm_head_dim));
    PKV_MK_TRY(pkv_mk_f32(b, "embedding_scale", 3.0f));
    PKV_MK_TRY(pkv_mk_f32(b, "residual_scale", 0.5f));
    PKV_MK_TRY(pkv_mk_f32(b, "attention.scale", 1.0f / (float)p->head_dim));
    PKV_MK_TRY(pkv_mk_f32(b, "logit_scale", 2.0f));
    return pkv_gguf_writer_add_bool(b->w, pkv_mk_key(b, "rope.scaling.finetuned"), false);
}

/* A Mamba-2 layer: the mixer, then the FFN. */
static pkv_status mk_mamba2(pkv_mk *b, int l) {
    PKV_MK_TRY(pkv_mk_mamba2(b, l));
    PKV_MK_TRY(pkv_mk_norm(b, l, "ffn_norm.weight", b->E));
    return pkv_mk_ffn(b, l, b->p->n_expert ? PKV_FFN_EXPERTS : PKV_FFN_GATED);
}

static pkv_status mk_layer(pkv_mk *b, int l) {
    if (mk_attends(l))
        PKV_MK_TRY(pkv_mk_layer(b, l, &(pkv_attn_tensors){0}, "ffn_norm.weight",
                                b->p->n_expert ? PKV_FFN_EXPERTS : PKV_FFN_GATED, false));
    else
        PKV_MK_TRY(mk_mamba2(b, l));
    return b->p->n_expert ? pkv_mk_moe_extras(b, l, PKV_MOE_SHARED, b->p->n_ff) : PKV_OK;
}

static const pkv_arch_mk mk = {.takes = PKV_MK_DELTANET | PKV_MK_EXPERTS,
                               .rope_base = 10000.0f,
                               .rms_eps = 1e-5f,
                               .check = mk_check,
                               .check_rows = pkv_mk_ssm_rows,
                               .sizes = mk_sizes,
                               .keys = mk_keys,
                               .layer = mk_layer};

const pkv_arch_ops pkv_arch_granitehybrid = {.name = "granitehybrid",
                                             .moe_after_dense = true,
                                             .kv0_recurrent = true,
                                             .rec_first = true,
                                             .hparams = hparams,
                                             .load_layer = load_layer,
                                             .layer = layer,
                                             .load_global = load_global,
                                             .output = output,
                                             .state_desc = pkv_mamba2_layer_state,
                                             .mk = &mk};
