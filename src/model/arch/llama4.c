/* llama4: Llama 4 (Scout, Maverick). Llama's layer (RoPE on adjacent pairs, SwiGLU)
 * with, as llama.cpp reads this architecture:
 *   - chunked attention: of every attention.sliding_window_pattern (4) layers the
 *     first three attend within chunks of positions only, a query at p to keys in
 *     [floor(p / chunk) * chunk, p] (llama.cpp's LLAMA_SWA_TYPE_CHUNKED); chunk 8192
 *     as llama.cpp fixes it, or pagekv's own key attention.chunk_size (llama.cpp
 *     reads none: mkmodel writes it so that tests cross chunks). The cache keeps
 *     those layers as windows of a chunk (pkv_kv_layer_desc.chunk). A file saying
 *     attention.sliding_window 0 (llama.cpp: no chunks, MobileLLM) is refused;
 *   - NoPE: every fourth layer, (il + 1) % 4 == 0 (llama.cpp's fixed
 *     n_no_rope_layer_step), turns neither Q nor K and multiplies its queries at
 *     position p by the temperature 1 + 0.1 ln(floor((p + 1) / 8192) + 1)
 *     (attention.temperature_scale and attention.temperature_length override 0.1
 *     and 8192; llama.cpp reads neither for llama4);
 *   - the RoPE layers normalize Q and K after RoPE (ggml_rms_norm with no weight,
 *     "Llama4TextL2Norm"), except in files of 128 experts (Maverick), as llama.cpp;
 *   - llama3 RoPE frequency factors, rope_freqs.weight [n_rot / 2] (optional): each
 *     pair's angle divided by its factor, in the forward pass and in a shift;
 *   - rope.freq_base_swa (optional) the chunked layers' base.
 *   - a mixture of experts on every interleave_moe_layer_step-th layer, (il + 1) %
 *     step == 0 (the others a dense FFN of feed_forward_length): the top k
 *     (expert_used_count, 1 in Llama 4) of the router's logits, each chosen
 *     expert's input times sigmoid(its logit) (llama.cpp's weight_before_ffn), the
 *     outputs summed (times expert_weights_scale where given), plus the shared
 *     expert ffn_{gate,up,down}_shexp of the same input, unweighted.
 * Every dim of a head rotates (llama.cpp asserts rope.dimension_count = head size).
 *
 *   x += o(attention(q', k', v))   q, k, v = projections of attn_norm(x);
 *                                  RoPE layer: q', k' = norm(rope(q)), norm(rope(k)), chunked
 *                                  where the pattern says; NoPE layer: q' = temp(p) q, k' = k
 *   x += down(silu(gate·h) * (up·h))                                   h = ffn_norm(x)
 *        or, on MoE layers, sum over the top k experts e of router·h of
 *           FFN_e(sigmoid(l_e) h) + FFN_shexp(h)                                      */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

#include <math.h>
#include <string.h>

enum { NOPE_STEP = 4,         /* llama.cpp's n_no_rope_layer_step (no key) */
       CHUNK = 8192,          /* llama.cpp's n_swa for llama4 (no key) */
       MAVERICK_EXPERTS = 128 /* llama.cpp's LLM_TYPE_17B_128E: no Q/K norm */ };

static bool nope(int il) { return (il + 1) % NOPE_STEP == 0; }

/* llama.cpp's use_kq_norm: every file but Maverick's */
static bool kq_norm(const pkv_hparams *hp) { return hp->moe.n_expert != MAVERICK_EXPERTS; }

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    if (hp->n_rot != hp->head_dim_k || hp->head_dim_k != hp->head_dim_v)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.rope.dimension_count' %d, key and value heads %d/%d: %s rotates every "
                       "dim of a head and its K and V heads have one size", lab, arch, hp->n_rot, hp->head_dim_k,
                       hp->head_dim_v, arch);
    int swa = -1;
    pkv_status s = pkv_hp_opt_u32(g, arch, "attention.sliding_window", 0, 1u << 30, -1, &swa);
    if (!s && swa == 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: '%s.attention.sliding_window' is 0 (Llama 4 without chunked attention, "
                       "MobileLLM's layout) is not supported", lab, arch);
    if (!s) s = pkv_hp_need_u32(g, arch, "interleave_moe_layer_step", 0, 1u << 16, &hp->moe_step);
    if (!s && (hp->moe_route.n_group > 1 || hp->moe_route.norm_w || (hp->moe_route.gating && hp->moe_route.gating != 2)))
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: '%s.expert_group_count' %d, expert_weights_norm %d and "
                       "expert_gating_func %d: %s routes by a sigmoid of the logits, without groups or normalisation", lab,
                       arch, hp->moe_route.n_group, hp->moe_route.norm_w, hp->moe_route.gating, arch);
    if (!s) s = pkv_hp_opt_u32(g, arch, "attention.chunk_size", 1, 1u << 30, CHUNK, &hp->n_chunk);
    if (!s) s = pkv_hp_opt_u32(g, arch, "attention.sliding_window_pattern", 1, 1u << 16, NOPE_STEP, &hp->swa.pattern);
    if (!s) s = pkv_hp_opt_f32(g, arch, "rope.freq_base_swa", 0.0f, &hp->swa.rope_base);
    if (!s && !(hp->swa.rope_base >= 0 && hp->swa.rope_base < INFINITY))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch, (double)hp->swa.rope_base);
    hp->swa.rope_freq_scale = hp->rope_freq_scale; /* llama.cpp's rope_freq_scale_train_swa */
    /* temperature tuning of the NoPE layers: llama.cpp's constants */
    hp->attn_temp.offset = 1.0f;
    if (!s) s = pkv_hp_opt_f32(g, arch, "attention.temperature_scale", 0.1f, &hp->attn_temp.scale);
    if (!s && !isfinite(hp->attn_temp.scale))
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.attention.temperature_scale' is %g, must be finite", lab, arch,
                    (double)hp->attn_temp.scale);
    if (!s) s = pkv_hp_opt_u32(g, arch, "attention.temperature_length", 1, 1u << 30, CHUNK, &hp->attn_temp.floor_len);
    return s;
}

/* rope_freqs.weight: llama3's factors, the same for every context length (the
 * frequency-factor sets of pkv_model.longrope, both equal). */
static pkv_status load_global(pkv_loader *L) {
    pkv_model *m = pkv_loader_model(L);
    const int n = m->hp.n_rot / 2;
    const char *name = "rope_freqs.weight";
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(pkv_loader_gguf(L), name);
    if (!t) return PKV_OK;
    if (t->type != PKV_TYPE_F32)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has type %s, expected f32", m->label, name, pkv_type_name(t->type));
    float *v = NULL;
    pkv_status s = pkv_load_host_f32(L, name, n, true, &v);
    if (s) return s;
    for (int i = 0; i < n && !s; i++)
        if (!(v[i] > 0 && v[i] < INFINITY))
            s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' entry %d is %g, expected a finite factor > 0", m->label, name, i,
                        (double)v[i]);
    m->longrope.host = s ? NULL : pkv_malloc((size_t)n * 2 * sizeof(float));
    if (!s && !m->longrope.host) s = pkv_err(PKV_ERR_NOMEM, "%s: %s", m->label, name);
    if (!s) {
        memcpy(m->longrope.host, v, (size_t)n * sizeof *v);
        memcpy(m->longrope.host + n, v, (size_t)n * sizeof *v);
        m->longrope.n = n;
    }
    pkv_free(v);
    for (int d = 0; d < m->n_dev && !s; d++) s = pkv_weight_host(m, m->devs[d], m->longrope.host, 2 * (int64_t)n, &m->longrope.dev[d]);
    return s;
}

static bool moe_layer(const pkv_hparams *hp, int il) { return hp->moe_step > 0 && (il + 1) % hp->moe_step == 0; }

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_model *m = pkv_loader_model(L);
    m->layers[il].nope = nope(il);
    const pkv_attn_tensors attn = {.qk_unit = !nope(il) && kq_norm(&m->hp)};
    if (!moe_layer(&m->hp, il)) return pkv_load_prenorm(L, il, &attn, NULL, PKV_FFN_GATED);
    pkv_layer *ly = &m->layers[il]; /* pkv_load_prenorm's layer, with the shared expert */
    pkv_status s;
    if ((s = pkv_load_norm(L, il, "attn_norm.weight", &ly->attn_norm)) || (s = pkv_load_attention(L, il, &attn)) ||
        (s = pkv_load_norm(L, il, "ffn_norm.weight", &ly->ffn_norm)))
        return s;
    return pkv_load_moe(L, il, PKV_MOE_SHARED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_hparams *hp = &f->m->hp;
    const pkv_layer *ly = &f->m->layers[il];
    const pkv_attn_kind attn = {.norm = &ly->attn_norm, .temp = ly->nope, .qk_norm_roped = !ly->nope && kq_norm(hp)};
    pkv_status s = pkv_blk_attention(f, il, &attn);
    if (s || !moe_layer(hp, il)) return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
    const pkv_moe_kind moe = {.norm = &ly->ffn_norm, .act = PKV_GLU_SILU, .gating = PKV_MOE_SIGMOID_TOPK,
                              .w_scale = hp->moe_route.w_scale, .sel_logits = true, .weight_in = true};
    return pkv_blk_moe(f, il, &moe);
}

/* ------------------------------------------------------- pagekv mkmodel */

enum { MK_MOE_STEP = 2 }; /* Llama 4 Maverick's interleave_moe_layer_step */

/* four layers (three chunked, one NoPE; MoE in the odd ones) and top-1 routing
 * unless asked otherwise */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (!p->n_layer) p->n_layer = 4;
    if (!p->n_expert_used) p->n_expert_used = 1;
    return PKV_OK;
}

/* the experts, the MoE step, the chunk (--sliding-window, 0 = 8) as pagekv's chunk
 * key and the NoPE layers' temperature length the same, so that short tests cross
 * both */
static pkv_status mk_keys(pkv_mk *b) {
    PKV_MK_TRY(pkv_mk_expert_keys(b, b->p->n_ff));
    PKV_MK_TRY(pkv_mk_u32(b, "interleave_moe_layer_step", MK_MOE_STEP));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.chunk_size", (uint32_t)b->p->sliding_window));
    return pkv_mk_u32(b, "attention.temperature_length", (uint32_t)b->p->sliding_window);
}

/* llama3-like frequency factors in [1, 8] */
static pkv_status mk_globals(pkv_mk *b) {
    const int64_t hd = b->p->head_dim ? b->p->head_dim : b->E / b->p->n_head;
    return pkv_mk_add(b, "rope_freqs.weight", PKV_TYPE_F32, hd / 2, 1, 4.5, 3.5);
}

static pkv_status mk_layer(pkv_mk *b, int l) {
    const bool moe = (l + 1) % MK_MOE_STEP == 0;
    PKV_MK_TRY(pkv_mk_layer(b, l, &(pkv_attn_tensors){0}, NULL, moe ? PKV_FFN_EXPERTS : PKV_FFN_GATED, false));
    return moe ? pkv_mk_moe_extras(b, l, PKV_MOE_SHARED, b->p->n_ff) : PKV_OK;
}

/* Llama 4 Scout's RoPE base and norm epsilon */
static const pkv_arch_mk mk = {.takes = PKV_MK_WINDOW | PKV_MK_EXPERTS, .rope_base = 500000.0f, .rms_eps = 1e-5f, .check = mk_check,
                               .keys = mk_keys, .globals = mk_globals, .layer = mk_layer};

const pkv_arch_ops pkv_arch_llama4 = {.name = "llama4", .moe = true, .rope_freqs = true, .hparams = hparams, .load_global = load_global,
                                      .load_layer = load_layer, .layer = layer, .mk = &mk};
