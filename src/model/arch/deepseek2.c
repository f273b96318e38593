/* deepseek2: DeepSeek-V2/V3/R1, Kimi K2, GLM-4.7-Flash. Multi-head latent attention
 * (MLA) over a latent KV cache, as llama.cpp runs it absorbed (pkv_blk_mla): per
 * token and layer the cache holds one row [normed latent (kv_lora_rank), rotated
 * k_pe (rope dims)], read by every head, V being the latent (no V pages); each
 * head's query is [attn_k_b_h · q_nope_h, rope(q_pe_h)], its latent output goes
 * back through attn_v_b_h. Queries from attn_q (the V2-Lite layout, q_lora_rank 0)
 * or attn_q_b · rmsnorm(attn_q_a · x) (V3, Kimi K2). RoPE on adjacent pairs.
 *
 *   x += o(mla(attn_norm(x)))
 *   x += down(silu(gate·h) * (up·h))            h = ffn_norm(x)   leading dense layers
 *   x += moe(h) + shared(h)                                        the others
 *
 * The mixture (pkv_blk_moe): expert_gating_func softmax (DeepSeek-V2; absent = softmax,
 * as llama.cpp reads V2 files) or sigmoid (V3, Kimi K2), exp_probs_b (the selection
 * bias) and expert groups where the file has them, expert_weights_norm and
 * expert_weights_scale, and the shared expert ffn_*_shexp every token goes through.
 *
 * Keys (llama.cpp's): attention.q_lora_rank, kv_lora_rank, key_length_mla (nope +
 * rope dims of a query head), value_length_mla, key_length = kv_lora_rank + rope
 * dims and value_length = kv_lora_rank (the cache row), head_count_kv 1,
 * leading_dense_block_count. Scores are scaled by mscale^2 / sqrt(key_length_mla),
 * mscale = attn_factor' (1 + 0.1 ln factor) (1 + 0.1 m ln factor) with m =
 * rope.scaling.yarn_log_multiplier / 0.1 (its converter writes 0.1 mscale_all_dim)
 * and attn_factor' llama.cpp's context factor (below), which is also RoPE's magnitude.
 * Older files with attn_kv_b (before the converter split it; key_length and
 * value_length then the query and value heads, head_count_kv the heads) run the same
 * way: attn_kv_b is split at load (pkv_load_mla). Not yet: attention temperature
 * tuning (refused), the MTP (nextn) layer. */
#include "model/arch/arch.h"
#include "model/arch/mk.h"

#include <math.h>

/* llama.cpp's YaRN magnitude for deepseek2 (its context's yarn_attn_factor): with a
 * log multiplier m != 0, mscale(f, m') / mscale(f, m), m' = m where m != 1, which is
 * 1; without, mscale(f, 1); either divided by 1 + 0.1 ln f (ggml's rope multiplies it
 * back), times rope.scaling.attn_factor. mscale(f, x) = 1 + 0.1 x ln f (1 where f <= 1). */
static float yarn_attn_factor(bool yarn, float factor, float m, float attn_factor) {
    if (!yarn) return attn_factor;
    const float ms1 = factor <= 1.0f ? 1.0f : 1.0f + 0.1f * logf(factor);
    const float cp = m != 0.0f ? 1.0f : ms1;
    return cp / (1.0f + 0.1f * logf(factor)) * attn_factor;
}

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    pkv_status s = pkv_hp_opt_u32(g, arch, "attention.q_lora_rank", 0, 1 << 20, 0, &hp->mla.q_lora);
    if (!s) s = pkv_hp_need_u32(g, arch, "attention.kv_lora_rank", 0, 1 << 20, &hp->mla.kv_lora);
    if (!s && hp->mla.kv_lora == 0)
        s = pkv_err(PKV_ERR_FORMAT, "%s: key '%s.attention.kv_lora_rank' is 0: the latent needs at least one value", lab,
                    arch);
    char k[128];
    snprintf(k, sizeof k, "%s.attention.key_length_mla", arch);
    /* an older file (attn_kv_b, converted for per-head K/V: key_length the query head,
     * value_length V): the same MLA, its latent row and one KV head set here */
    hp->mla.kv_b = !s && pkv_gguf_find_key(g, k) < 0;
    if (hp->mla.kv_b && !pkv_gguf_find_tensor(g, "blk.0.attn_kv_b.weight"))
        return pkv_err(PKV_ERR_FORMAT, "%s: no '%s' and no attn_kv_b.weight: neither MLA layout", lab, k);
    if (hp->mla.kv_b) {
        hp->n_head_kv_all = 1; /* the one latent row, whatever head_count_kv says */
        hp->mla.dk = hp->head_dim_k;
        hp->mla.dv = hp->head_dim_v;
        hp->head_dim_k = hp->mla.kv_lora + hp->n_rot;
        hp->head_dim_v = hp->mla.kv_lora;
    }
    if (!s && !hp->mla.kv_b) s = pkv_hp_need_u32(g, arch, "attention.key_length_mla", 1, 4096, &hp->mla.dk);
    if (!s && !hp->mla.kv_b) s = pkv_hp_need_u32(g, arch, "attention.value_length_mla", 1, 4096, &hp->mla.dv);
    if (!s) s = pkv_hp_opt_u32(g, arch, "leading_dense_block_count", 0, 1u << 20, 0, &hp->mla.n_dense);
    if (s) return s;
    if (hp->n_rot >= hp->mla.dk)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.rope.dimension_count' %d must be less than the query head's %d dims "
                       "('%s.attention.key_length_mla'): no dims would be left without RoPE", lab, arch, hp->n_rot,
                       hp->mla.dk, arch);
    if (hp->head_dim_k != hp->mla.kv_lora + hp->n_rot || hp->head_dim_v != hp->mla.kv_lora)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.key_length' %d and 'value_length' %d must be kv_lora_rank + rope "
                       "dims = %d and kv_lora_rank = %d (the latent cache row)", lab, arch, hp->head_dim_k,
                       hp->head_dim_v, hp->mla.kv_lora + hp->n_rot, hp->mla.kv_lora);
    if (hp->mla.n_dense < hp->n_layer && hp->moe.n_expert == 0)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.leading_dense_block_count' %d of %d layers: the others are mixtures of "
                       "experts, but the file has no '%s.expert_count'", lab, arch, hp->mla.n_dense, hp->n_layer, arch);
    if (hp->moe_route.gating == 3)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: '%s.expert_gating_func' 3 (softmax of the top k) is not deepseek2's", lab,
                       arch);
    float t = 0, log_mul = 0, attn_factor = 1;
    s = pkv_hp_opt_f32(g, arch, "attention.temperature_scale", 0.0f, &t);
    if (!s && t != 0)
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: key '%s.attention.temperature_scale' %g (attention temperature tuning) is "
                    "not supported for %s", lab, arch, (double)t, arch);
    if (!s) s = pkv_hp_opt_f32(g, arch, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul);
    if (!s) s = pkv_hp_opt_f32(g, arch, "rope.scaling.attn_factor", 1.0f, &attn_factor);
    if (s) return s;
    /* llama.cpp's rules (hparams.c's generic YaRN magnitude does not apply): the
     * file's multiplier is 0.1 mscale_all_dim */
    const float m = log_mul / 0.1f, ln_f = logf(1.0f / hp->rope_freq_scale);
    hp->yarn.attn_factor = yarn_attn_factor(hp->yarn.ext_factor != 0, 1.0f / hp->rope_freq_scale, m, attn_factor);
    const float mscale = hp->yarn.attn_factor * (1.0f + 0.1f * ln_f) * (1.0f + 0.1f * m * ln_f);
    hp->attn_scale = mscale * mscale / sqrtf((float)hp->mla.dk);
    return PKV_OK;
}

static pkv_status load_layer(pkv_loader *L, int il) {
    const pkv_layer *ly = &pkv_loader_model(L)->layers[il];
    if (ly->n_head_kv != 1)
        return pkv_err(PKV_ERR_FORMAT, "%s: layer %d has %d KV heads: deepseek2's latent cache is one (head_count_kv 1)",
                       pkv_gguf_label(pkv_loader_gguf(L)), il, ly->n_head_kv);
    pkv_status s;
    if ((s = pkv_load_norm(L, il, "attn_norm.weight", &pkv_loader_model(L)->layers[il].attn_norm)) ||
        (s = pkv_load_mla(L, il)) ||
        (s = pkv_load_norm(L, il, "ffn_norm.weight", &pkv_loader_model(L)->layers[il].ffn_norm)))
        return s;
    return il < pkv_loader_model(L)->hp.mla.n_dense ? pkv_load_ffn(L, il, false)
                                                    : pkv_load_moe(L, il, PKV_MOE_PROBS_B | PKV_MOE_SHARED);
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_hparams *hp = &f->m->hp;
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_mla(f, il, &ly->attn_norm);
    if (s || il < hp->mla.n_dense) return s ? s : pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU});
    return pkv_blk_moe(f, il, &(pkv_moe_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_SILU,
                                              .gating = hp->moe_route.gating == 2 ? PKV_MOE_SIGMOID_TOPK : PKV_MOE_SOFTMAX_TOPK,
                                              .norm_w = hp->moe_route.norm_w, .w_scale = hp->moe_route.w_scale});
}

/* ------------------------------------------------------- pagekv mkmodel */

/* A small MLA shape: head_dim is the query head (nope + rope, rope half of it), the
 * latent kv_lora_rank (0 = 64), V heads of head_dim; one KV head. With experts the
 * layers after the first are mixtures with a shared expert of n_ff rows, routed as
 * DeepSeek-V2 (softmax, weights times 1.5) without q_lora_rank, as V3 with it
 * (sigmoid, exp_probs_b, 2 of 4 expert groups where the experts split so, the
 * weights normalised and times 2.5). */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (p->n_head_kv > 1)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: deepseek2 has one KV head (its latent), not %d", p->n_head_kv);
    p->n_head_kv = 1;
    if (!p->kv_lora_rank) p->kv_lora_rank = 64;
    if (p->kv_lora_rank < 0 || p->q_lora_rank < 0)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: q_lora_rank %d, kv_lora_rank %d must be >= 0", p->q_lora_rank,
                       p->kv_lora_rank);
    return PKV_OK;
}

static pkv_status mk_check_rows(const pkv_mkmodel_params *p, size_t blk) {
    pkv_status s = pkv_mk_row_check(p, blk, "--kv-lora-rank", p->kv_lora_rank);
    if (!s && p->q_lora_rank) s = pkv_mk_row_check(p, blk, "--q-lora-rank", p->q_lora_rank);
    if (!s) s = pkv_mk_row_check(p, blk, "--head-dim / 2 (attn_k_b's nope dims)", p->head_dim / 2);
    return s;
}

/* A draft of (a model of the shape of) a deepseek2 file: its query heads and ranks
 * (the rope dims are half the query head here, whatever the file's) */
static void mk_draft(pkv_mkmodel_params *p, const pkv_hparams *hp, const int *nh, const int *nkv) {
    (void)nh;
    (void)nkv;
    p->head_dim = hp->mla.dk;
    p->q_lora_rank = hp->mla.q_lora;
    p->kv_lora_rank = hp->mla.kv_lora;
}

static pkv_status mk_keys(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    const int P = p->head_dim / 2, Rl = p->kv_lora_rank;
    PKV_MK_TRY(pkv_mk_u32(b, "attention.q_lora_rank", (uint32_t)p->q_lora_rank));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.kv_lora_rank", (uint32_t)Rl));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.key_length", (uint32_t)(Rl + P)));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.value_length", (uint32_t)Rl));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.key_length_mla", (uint32_t)p->head_dim));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.value_length_mla", (uint32_t)p->head_dim));
    PKV_MK_TRY(pkv_mk_u32(b, "rope.dimension_count", (uint32_t)P));
    PKV_MK_TRY(pkv_mk_u32(b, "leading_dense_block_count", (uint32_t)(p->n_expert ? 1 : p->n_layer)));
    /* keys llama.cpp reads for every deepseek2 file, experts or not */
    PKV_MK_TRY(pkv_mk_u32(b, "expert_shared_count", 1));
    if (!p->n_expert) PKV_MK_TRY(pkv_mk_u32(b, "expert_feed_forward_length", (uint32_t)p->n_ff));
    if (p->n_expert) {
        const bool v3 = p->q_lora_rank > 0;
        PKV_MK_TRY(pkv_mk_expert_keys(b, p->n_ff));
        PKV_MK_TRY(pkv_mk_u32(b, "expert_gating_func", v3 ? 2 : 1));
        PKV_MK_TRY(pkv_mk_f32(b, "expert_weights_scale", v3 ? 2.5f : 1.5f));
        PKV_MK_TRY(pkv_gguf_writer_add_bool(b->w, pkv_mk_key(b, "expert_weights_norm"), v3));
        if (v3 && p->n_expert % 4 == 0 && p->n_expert >= 8 && p->n_expert_used <= p->n_expert / 2) {
            PKV_MK_TRY(pkv_mk_u32(b, "expert_group_count", 4));
            PKV_MK_TRY(pkv_mk_u32(b, "expert_group_used_count", 2));
        }
    }
    /* DeepSeek-V2-Lite's YaRN magnitude: 0.1 mscale_all_dim (0.707) */
    return pkv_mk_f32(b, "rope.scaling.yarn_log_multiplier", 0.1f * 0.707f);
}

static pkv_status mk_layer(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E, H = p->n_head, D = p->head_dim, P = D / 2, N = D - P, Rl = p->kv_lora_rank,
                  V = p->head_dim, Lq = p->q_lora_rank;
    const pkv_type t = p->type;
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
    if (Lq > 0) {
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_q_a.weight", t, E, Lq, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_norm(b, l, "attn_q_a_norm.weight", Lq));
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_q_b.weight", t, Lq, H * D, 0.0, sqrt(3.0 / (double)Lq)));
    } else {
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_q.weight", t, E, H * D, 0.0, b->lin_e));
    }
    PKV_MK_TRY(pkv_mk_blk(b, l, "attn_kv_a_mqa.weight", t, E, Rl + P, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_kv_a_norm.weight", Rl));
    char name[64];
    snprintf(name, sizeof name, "blk.%d.attn_k_b.weight", l);
    PKV_MK_TRY(pkv_mk_add3(b, name, t, N, Rl, H, sqrt(3.0 / (double)N)));
    snprintf(name, sizeof name, "blk.%d.attn_v_b.weight", l);
    PKV_MK_TRY(pkv_mk_add3(b, name, t, Rl, V, H, sqrt(3.0 / (double)Rl)));
    PKV_MK_TRY(pkv_mk_blk(b, l, "attn_output.weight", t, H * V, E, 0.0, sqrt(3.0 / (double)(H * V))));
    PKV_MK_TRY(pkv_mk_norm(b, l, "ffn_norm.weight", E));
    if (!p->n_expert || l == 0) return pkv_mk_ffn(b, l, PKV_FFN_GATED);
    PKV_MK_TRY(pkv_mk_ffn(b, l, PKV_FFN_EXPERTS));
    return pkv_mk_moe_extras(b, l, (p->q_lora_rank > 0 ? PKV_MOE_PROBS_B : 0) | PKV_MOE_SHARED, p->n_ff);
}

/* YaRN by 4 over min(256, context) original positions, base 10000, as DeepSeek-V2 */
static const pkv_arch_mk mk = {.takes = PKV_MK_MLA | PKV_MK_EXPERTS, .rope_base = 10000.0f, .rope_factor = 4.0f, .rope_yarn = true,
                               .rms_eps = 1e-6f, .own_head_keys = true, .check = mk_check,
                               .check_rows = mk_check_rows, .draft = mk_draft, .keys = mk_keys, .layer = mk_layer};

const pkv_arch_ops pkv_arch_deepseek2 = {.name = "deepseek2", .moe_after_dense = true, .yarn_log_mul = true, .hparams = hparams,
                                         .load_layer = load_layer, .layer = layer, .mk = &mk};
