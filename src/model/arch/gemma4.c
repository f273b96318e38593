/* gemma4: Gemma 4 (text), with llama.cpp's keys, tensors and arithmetic
 * (src/models/gemma4.cpp). Gemma 3's block with:
 *   - which layers slide listed per layer (attention.sliding_window_pattern), and
 *     head sizes, RoPE widths and KV head counts of their own (key_length_swa,
 *     value_length_swa, rope.dimension_count_swa, per-layer head_count_kv);
 *   - RoPE base rope.freq_base_swa on sliding layers; on full layers "proportional"
 *     RoPE: rope_freqs.weight marks the pairs that turn (1) and those that do not (1e30);
 *   - V RMS-normed per head without a weight, and V = K where attn_v is absent;
 *   - attention scale 1 (the q and k norms stand in for 1/sqrt(d)); norms stored as w;
 *   - per-layer embeddings (embedding_length_per_layer_input = P > 0): a P-wide input
 *     per layer and token from a second token table and a projection of the embedding
 *     (blocks.h: pkv_blk_ple_inputs), gated into the residual stream after the FFN;
 *   - layer_output_scale: the residual stream times a scalar after each layer;
 *   - the last attention.shared_kv_layers layers own no KV: they attend over the KV
 *     of the last sliding / full layer that does (model-load.c: share_kv), and the
 *     cache has no layers for them;
 *   - the final logits soft-capped at final_logit_softcapping, 30 where the key is
 *     absent (llama.cpp's default), 0 = off.
 *
 *   x += post_attention_norm(o(attention(prope(q_norm(q)), prope(k_norm(k)), rmsnorm(v))))   of attn_norm(x)
 *   x += post_ffw_norm(down(gelu(gate·h) * (up·h)))                                           h = ffn_norm(x)
 *     MoE layers (ffn_gate_inp): x += post_ffw_norm(post_ffw_norm_1(the FFN above, unnormed)
 *                                   + post_ffw_norm_2(sum of the top-k experts' GeGLU FFNs of
 *                                   pre_ffw_norm_2(x), each times its weight and ffn_down_exps.scale))
 *     routed by softmax(ffn_gate_inp · (rmsnorm(x) / sqrt(n_embd) * ffn_gate_inp.scale)),
 *     the top k renormalized
 *   x += post_norm(proj(gelu(inp_gate·x) * ple[layer]))                                      P > 0
 *   x *= layer_output_scale
 *
 * Not supported: YaRN scaling with proportional RoPE; a per-layer expert count or
 * expert size; NVFP4's second-level scales. MoE models run on one device. */
#include <math.h>
#include <string.h>

#include "model/arch/arch.h"
#include "model/arch/mk.h"

/* attention.sliding_window_pattern: one bool (or integer) per layer, 1 = sliding. */
pkv_status pkv_gemma4_pattern(const pkv_gguf *g, const char *arch, pkv_hparams *hp) {
    const char *lab = pkv_gguf_label(g);
    char k[128];
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", arch);
    if (pkv_gguf_find_key(g, k) < 0) return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' not found", lab, k);
    pkv_gguf_array a;
    pkv_status s = pkv_gguf_get_arr(g, k, PKV_GGUF_TYPE_COUNT, &a);
    if (s) return s;
    if (a.type == PKV_GGUF_STRING || a.type == PKV_GGUF_FLOAT32 || a.type == PKV_GGUF_FLOAT64 ||
        a.count != (uint64_t)hp->n_layer)
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' must hold one bool per layer (%d), found %llu of %s", lab, k, hp->n_layer,
                       (unsigned long long)a.count, pkv_gguf_type_name(a.type));
    hp->swa_per_layer = true;
    memset(hp->swa_layers, 0, sizeof hp->swa_layers);
    for (int l = 0; l < hp->n_layer; l++)
        if (pkv_gguf_arr_int(&a, (uint64_t)l)) hp->swa_layers[l / 64] |= 1ull << (l % 64);
    return PKV_OK;
}

/* rope_freqs.weight [key_length / 2]: the full layers' pair i turns by its angle
 * divided by entry i. The converter writes 1 for the first pairs and 1e30 (never
 * turns) for the rest: that form is read into hp->rope_pairs_full; any other is
 * refused rather than run wrong. */
pkv_status pkv_gemma4_rope_freqs(const pkv_gguf *g, pkv_hparams *hp) {
    const char *lab = pkv_gguf_label(g), *name = "rope_freqs.weight";
    bool any_full = false;
    for (int l = 0; l < hp->n_layer; l++) any_full |= !(hp->swa_layers[l / 64] >> (l % 64) & 1);
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(g, name);
    if (!t) return any_full ? pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' not found (the full-attention layers' RoPE)", lab, name)
                            : PKV_OK;
    const int64_t n = hp->head_dim_k / 2, pairs = hp->n_rot / 2;
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld] (key_length / 2)", lab,
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)n);
    if (t->type != PKV_TYPE_F32 && t->type != PKV_TYPE_F16)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has type %s, expected f32", lab, name, pkv_type_name(t->type));
    int r = -1;
    for (int64_t i = 0; i < pairs; i++) {
        float v;
        if (t->type == PKV_TYPE_F32) {
            memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
            v = pkv_f16_to_f32(h);
        }
        /* >= 1e20: the angle stays below 1e-10 rad for any position a context holds */
        const bool turns = v == 1.0f, still = v >= 1e20f;
        if (r < 0 && turns) continue;
        if (r < 0 && still) r = (int)i;
        if ((r < 0 && !turns) || (r >= 0 && !still))
            return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' entry %lld is %g: only proportional RoPE is supported (1 for "
                           "the pairs that turn, then 1e30 for those that do not)", lab, name, (long long)i, (double)v);
    }
    if (r == 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' turns no pair of the full-attention layers: not supported", lab,
                       name);
    hp->rope_pairs_full = r < 0 ? 0 : r;
    return PKV_OK;
}

static pkv_status hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head) {
    (void)n_head;
    const char *lab = pkv_gguf_label(g);
    char k[128];
    pkv_status s;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->attn_scale = 1.0f; /* Gemma 4's q and k norms stand in for 1/sqrt(d) */
    hp->swa.rope_freq_scale = 1.0f;
    /* required, as llama.cpp's loader requires them (the common reader has defaults) */
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    if (pkv_gguf_find_key(g, k) < 0) return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' not found", lab, k);
    if ((s = pkv_hp_window(g, arch, hp, true)) || (s = pkv_gemma4_pattern(g, arch, hp)) ||
        (s = pkv_hp_need_u32(g, arch, "attention.key_length_swa", 1, 4096, &hp->head_dim_k_swa)) ||
        (s = pkv_hp_need_u32(g, arch, "attention.value_length_swa", 1, 4096, &hp->head_dim_v_swa)) ||
        (s = pkv_hp_need_u32(g, arch, "embedding_length_per_layer_input", 0, 1 << 16, &hp->n_embd_per_layer)) ||
        (s = pkv_hp_opt_u32(g, arch, "attention.shared_kv_layers", 0, 1u << 20, 0, &hp->n_shared_kv)) ||
        (s = pkv_hp_opt_u32(g, arch, "rope.dimension_count_swa", 2, 4096, hp->n_rot, &hp->n_rot_swa)) ||
        (s = pkv_hp_opt_f32(g, arch, "rope.freq_base_swa", 10000.0f, &hp->swa.rope_base)) ||
        (s = pkv_hp_opt_f32(g, arch, "final_logit_softcapping", 30.0f, &hp->softcap.final)))
        return s;
    if (hp->head_dim_k != hp->head_dim_v || hp->head_dim_k_swa != hp->head_dim_v_swa)
        return pkv_err(PKV_ERR_FORMAT, "%s: Gemma 4 needs '%s.attention.key_length' %d == 'value_length' %d and "
                       "'key_length_swa' %d == 'value_length_swa' %d", lab, arch, hp->head_dim_k, hp->head_dim_v,
                       hp->head_dim_k_swa, hp->head_dim_v_swa);
    if (hp->n_rot_swa % 2 || hp->n_rot_swa > hp->head_dim_k_swa)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.rope.dimension_count_swa' %d must be even and at most "
                       "'%s.attention.key_length_swa' %d", lab, arch, hp->n_rot_swa, arch, hp->head_dim_k_swa);
    if (hp->n_shared_kv >= hp->n_layer)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.shared_kv_layers' %d must be below '%s.block_count' %d", lab, arch,
                       hp->n_shared_kv, arch, hp->n_layer);
    if (!(hp->swa.rope_base > 0 && hp->swa.rope_base < INFINITY))
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch, (double)hp->swa.rope_base);
    if (!(hp->softcap.final >= 0 && hp->softcap.final < INFINITY))
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.final_logit_softcapping' is %g, must be >= 0 (0 = off)", lab, arch,
                       (double)hp->softcap.final);
    if (hp->yarn.ext_factor != 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: YaRN RoPE scaling ('%s.rope.scaling.type') with Gemma 4's proportional RoPE "
                       "is not supported", lab, arch);
    /* experts (26B-A4B): in the layers that have ffn_gate_inp, beside their dense FFN */
    snprintf(k, sizeof k, "%s.expert_count", arch);
    if (pkv_gguf_find_key(g, k) >= 0) {
        if ((s = pkv_hp_need_u32(g, arch, "expert_count", 1, 4096, &hp->moe.n_expert)) ||
            (s = pkv_hp_need_u32(g, arch, "expert_used_count", 1, (uint32_t)hp->moe.n_expert, &hp->moe.n_used)) ||
            (s = pkv_hp_need_u32(g, arch, "expert_feed_forward_length", 1, 1 << 24, &hp->moe.n_ff)))
            return s;
        hp->moe_dense = true;
    }
    return pkv_gemma4_rope_freqs(g, hp);
}

/* The per-layer embeddings' tensors outside the layers. */
static pkv_status load_global(pkv_loader *L) {
    pkv_model *m = pkv_loader_model(L);
    const pkv_hparams *hp = &m->hp;
    const int64_t P = hp->n_embd_per_layer, NL = hp->n_layer, E = hp->n_embd;
    if (P == 0) return PKV_OK;
    pkv_status s;
    if ((s = pkv_load_host_table(L, "per_layer_token_embd.weight", P * NL, hp->n_vocab)) ||
        (s = pkv_load_global(L, "per_layer_model_proj.weight", E, P * NL, true, false, &m->ple.model_proj)) ||
        (s = pkv_load_global(L, "per_layer_proj_norm.weight", P, 1, true, true, &m->ple.proj_norm)))
        return s;
    return pkv_weight_fill(m, m->dev, 1, 1.0f / sqrtf(2.0f), &m->ple.half);
}

static pkv_status load_layer(pkv_loader *L, int il) {
    pkv_model *m = pkv_loader_model(L);
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    const int64_t P = hp->n_embd_per_layer, E = hp->n_embd;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
    const bool moe = pkv_gguf_find_tensor(pkv_loader_gguf(L), name) != NULL;
    if (moe && hp->moe.n_expert == 0)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' makes layer %d a mixture of experts, but key 'gemma4.expert_count' "
                       "is absent", m->label, name, il);
    pkv_status s = pkv_load_prenorm(L, il,
                                    &(pkv_attn_tensors){.qk_norm = true, .fused_qkv = true, .v_optional = true, .v_norm = true},
                                    NULL, PKV_FFN_GATED);
    if (!s) s = pkv_load_norm(L, il, "post_attention_norm.weight", &ly->post_attn_norm);
    if (!s) s = pkv_load_norm(L, il, "post_ffw_norm.weight", &ly->post_ffn_norm);
    if (!s && moe) { /* the experts, their norms, the router's input scale and each expert's output scale */
        float *in = NULL;
        s = pkv_load_moe(L, il, 0);
        if (!s) s = pkv_load_norm(L, il, "pre_ffw_norm_2.weight", &ly->moe.pre_norm);
        if (!s) s = pkv_load_norm(L, il, "post_ffw_norm_1.weight", &ly->moe.dense_post_norm);
        if (!s) s = pkv_load_norm(L, il, "post_ffw_norm_2.weight", &ly->moe.post_norm);
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.scale", il);
        if (!s) s = pkv_load_host_f32(L, name, E, true, &in);
        for (int64_t i = 0; !s && i < E; i++) in[i] *= 1.0f / sqrtf((float)E); /* llama.cpp: rmsnorm(x) / sqrt(E) * scale */
        if (!s) s = pkv_weight_host(m, m->dev, in, E, &ly->moe.router_in);
        pkv_free(in);
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.scale", il);
        if (!s) s = pkv_load_host_f32(L, name, hp->moe.n_expert, false, &ly->moe.exp_scale);
    }
    snprintf(name, sizeof name, "blk.%d.layer_output_scale.weight", il);
    if (!s) s = pkv_load_global(L, name, 1, 1, false, true, &ly->out_scale);
    if (!s && P > 0) {
        s = pkv_load_tensor(L, il, "inp_gate.weight", E, P, false, &ly->ple.gate);
        if (!s) s = pkv_load_tensor(L, il, "proj.weight", P, E, false, &ly->ple.proj);
        if (!s) s = pkv_load_norm(L, il, "post_norm.weight", &ly->ple.post_norm);
    }
    return s;
}

/* The embedding, then (P > 0) every layer's per-layer input. */
static pkv_status input(pkv_fwd *f) {
    pkv_status s = pkv_blk_embed(f);
    return !s && f->m->hp.n_embd_per_layer > 0 ? pkv_blk_ple_inputs(f) : s;
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(
        f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true, .v_norm = true, .post_norm = &ly->post_attn_norm});
    if (!s && ly->moe.router.buf) /* a MoE layer: the dense FFN and the experts, each normed, summed, normed */
        s = pkv_blk_ffn_moe(f, il,
                            &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_GELU, .post_norm = &ly->moe.dense_post_norm},
                            &(pkv_moe_kind){.norm = &ly->moe.pre_norm, .act = PKV_GLU_GELU, .gating = PKV_MOE_SOFTMAX_TOPK, .norm_w = true,
                                            .router_norm = &ly->moe.router_in, .exp_scale = ly->moe.exp_scale,
                                            .post_norm = &ly->moe.post_norm},
                            &ly->post_ffn_norm);
    else if (!s)
        s = pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_GELU, .post_norm = &ly->post_ffn_norm});
    if (!s && f->m->hp.n_embd_per_layer > 0) s = pkv_blk_ple(f, il);
    return s ? s : pkv_blk_scale(f, &ly->out_scale);
}

/* ------------------------------------------------------- pagekv mkmodel */


/* A test shape with each Gemma 4 feature (pkv_mkmodel_params): 6 layers, 8 heads
 * (KV heads 4 sliding, 2 full, so the shape splits over two devices), per-layer
 * embeddings, two sharing layers. */
static pkv_status mk_check(pkv_mkmodel_params *p) {
    if (!p->n_layer) p->n_layer = p->swa_layers ? (int)strlen(p->swa_layers) : 6;
    if (!p->n_head) p->n_head = 8;
    if (!p->head_dim) p->head_dim = 64;
    /* rows of the weight type's blocks: the sliding heads and per-layer embeddings too */
    const int blk = (int)pkv_type_block_elems(p->type);
    if (!p->head_dim_swa) p->head_dim_swa = blk && (p->n_head * p->head_dim / 2) % blk ? p->head_dim : p->head_dim / 2;
    if (!p->n_head_kv_full) p->n_head_kv_full = p->n_head >= 4 ? p->n_head / 4 : 1;
    if (!p->n_embd_per_layer) p->n_embd_per_layer = blk > 16 ? blk : 16;
    if (p->n_embd_per_layer < 0) p->n_embd_per_layer = 0;
    if (!p->n_shared_kv) p->n_shared_kv = 2;
    if (p->n_shared_kv < 0) p->n_shared_kv = 0;
    const int L = p->n_layer, Lkv = L - p->n_shared_kv;
    if (p->head_dim_swa < 2 || p->head_dim_swa % 2 || p->n_embd_per_layer > 4096)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: sliding head size %d (even, >= 2), per-layer embedding size %d "
                       "(<= 4096)", p->head_dim_swa, p->n_embd_per_layer);
    if (p->swa_layers && (int)strlen(p->swa_layers) != L)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: the sliding pattern '%s' has %zu layers, the model %d",
                       p->swa_layers, strlen(p->swa_layers), L);
    for (int l = 0; p->swa_layers && l < L; l++)
        if (p->swa_layers[l] != 's' && p->swa_layers[l] != 'f')
            return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: sliding pattern '%s': one 's' (sliding) or 'f' (full) per "
                           "layer", p->swa_layers);
    /* what the loader checks (model-load.c: share_kv), refused here before a file is written */
    if (p->n_shared_kv > 0 && (Lkv < 2 || (p->swa_layers && (p->swa_layers[Lkv - 1] != 'f' || p->swa_layers[Lkv - 2] != 's'))))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: %d shared KV layers of %d leave %d with KV of their own, the last "
                       "two of which (%d, %d) must be sliding and full", p->n_shared_kv, L, Lkv, Lkv - 2, Lkv - 1);
    return PKV_OK;
}

static pkv_status mk_check_rows(const pkv_mkmodel_params *p, size_t blk) {
    if (((int64_t)p->n_head * p->head_dim_swa) % (int64_t)blk || p->n_embd_per_layer % (int64_t)blk)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: type %s needs row lengths that are multiples of %zu: --heads x --head-dim-swa "
                       "is %lld, --per-layer-embd %d", pkv_type_name(p->type), blk, (long long)p->n_head * p->head_dim_swa,
                       p->n_embd_per_layer);
    return PKV_OK;
}

/* A draft of a gemma4 target: its sliding and full layers' shapes; no KV sharing,
 * the last layer full. */
static void mk_draft(pkv_mkmodel_params *p, const pkv_hparams *hp, const int *nh, const int *nkv) {
    int ls = -1, lf = -1;
    for (int l = 0; l < hp->n_layer; l++) {
        bool sl = hp->swa_layers[l / 64] >> (l % 64) & 1;
        if (sl && ls < 0) ls = l;
        if (!sl && lf < 0) lf = l;
    }
    p->n_head = nh[lf >= 0 ? lf : ls];
    p->n_head_kv = nkv[ls >= 0 ? ls : lf];
    p->n_head_kv_full = nkv[lf >= 0 ? lf : ls];
    p->head_dim_swa = hp->head_dim_k_swa;
    p->n_embd_per_layer = hp->n_embd_per_layer ? hp->n_embd_per_layer : -1;
    p->n_shared_kv = -1;
}

/* Which layers slide: swa_layers, else a full layer every third counting back from
 * the last that owns KV, the sharing layers alternating sliding and full. */
static bool mk_slides(const pkv_mkmodel_params *p, int l) {
    const int Lkv = p->n_layer - p->n_shared_kv;
    return p->swa_layers ? p->swa_layers[l] == 's' : l < Lkv ? (Lkv - 1 - l) % 3 != 0 : (l - Lkv) % 2 == 0;
}

/* The sharing layers' FFN is twice as wide; the sliding layers' heads and KV heads */
static int mk_ff(const pkv_mkmodel_params *p, int l) { return l >= p->n_layer - p->n_shared_kv ? 2 * p->n_ff : p->n_ff; }
static int mk_hd(const pkv_mkmodel_params *p, int l) { return mk_slides(p, l) ? p->head_dim_swa : p->head_dim; }
static int mk_kv(const pkv_mkmodel_params *p, int l) { return mk_slides(p, l) ? p->n_head_kv : p->n_head_kv_full; }

/* llama.cpp's keys: per-layer arrays where the layers differ; Gemma 4's own, as its
 * converter writes them. */
static pkv_status mk_sizes(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    const uint64_t L = (uint64_t)p->n_layer;
    int32_t ff[256], kv[256];
    uint8_t pat[256];
    for (int l = 0; l < p->n_layer; l++) ff[l] = mk_ff(p, l), kv[l] = mk_kv(p, l), pat[l] = mk_slides(p, l);
    if (p->n_shared_kv > 0) PKV_MK_TRY(pkv_mk_arr(b, "feed_forward_length", PKV_GGUF_INT32, ff, L));
    else PKV_MK_TRY(pkv_mk_u32(b, "feed_forward_length", (uint32_t)p->n_ff));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.head_count", (uint32_t)p->n_head));
    if (p->n_head_kv_full != p->n_head_kv) PKV_MK_TRY(pkv_mk_arr(b, "attention.head_count_kv", PKV_GGUF_INT32, kv, L));
    else PKV_MK_TRY(pkv_mk_u32(b, "attention.head_count_kv", (uint32_t)p->n_head_kv));
    PKV_MK_TRY(pkv_mk_arr(b, "attention.sliding_window_pattern", PKV_GGUF_BOOL, pat, L));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.key_length_swa", (uint32_t)p->head_dim_swa));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.value_length_swa", (uint32_t)p->head_dim_swa));
    PKV_MK_TRY(pkv_mk_u32(b, "rope.dimension_count_swa", (uint32_t)p->head_dim_swa));
    PKV_MK_TRY(pkv_mk_f32(b, "rope.freq_base_swa", 10000.0f));
    PKV_MK_TRY(pkv_mk_u32(b, "attention.shared_kv_layers", (uint32_t)p->n_shared_kv));
    PKV_MK_TRY(pkv_mk_u32(b, "embedding_length_per_layer_input", (uint32_t)p->n_embd_per_layer));
    return pkv_mk_f32(b, "final_logit_softcapping", 30.0f);
}

/* Experts of n_ff / 2 rows (26B-A4B's layout), and the window. */
static pkv_status mk_keys(pkv_mk *b) {
    if (b->p->n_expert > 0) PKV_MK_TRY(pkv_mk_expert_keys(b, b->p->n_ff / 2));
    return pkv_mk_window_key(b);
}

static pkv_status mk_globals(pkv_mk *b) {
    const pkv_mkmodel_params *p = b->p;
    /* proportional RoPE: a quarter of the full layers' pairs turn (partial_rotary_factor 0.25) */
    const int half = p->head_dim / 2, turn = PKV_MAX(1, p->head_dim / 8);
    for (int i = 0; i < half; i++) b->f[i] = i < turn ? 1.0f : 1e30f;
    int64_t ne[1] = {half};
    PKV_MK_TRY(pkv_gguf_writer_add_tensor(b->w, "rope_freqs.weight", PKV_TYPE_F32, 1, ne, b->f, (size_t)half * 4));
    const int64_t PL = (int64_t)p->n_embd_per_layer * p->n_layer;
    if (!PL) return PKV_OK;
    /* per-layer embeddings: a second token table, the embedding's projection and its norm */
    PKV_MK_TRY(pkv_mk_add(b, "per_layer_token_embd.weight", p->type, PL, p->n_vocab, 0.0, 1.0));
    PKV_MK_TRY(pkv_mk_add(b, "per_layer_model_proj.weight", p->type, b->E, PL, 0.0, b->lin_e));
    return pkv_mk_add(b, "per_layer_proj_norm.weight", PKV_TYPE_F32, p->n_embd_per_layer, 1, 1.0, 0.1);
}

/* A layer, llama.cpp's tensors. */
static pkv_status mk_layer(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E, D = mk_hd(p, l), lq = (int64_t)p->n_head * D, lk = (int64_t)mk_kv(p, l) * D, F = mk_ff(p, l);
    const int64_t P = p->n_embd_per_layer;
    const double lin_e = b->lin_e;
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
    PKV_MK_TRY(pkv_mk_blk(b, l, "attn_q.weight", p->type, E, lq, 0.0, lin_e));
    if (l < p->n_layer - p->n_shared_kv) { /* the layers that own KV; the full ones have no attn_v (V = K) */
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_k.weight", p->type, E, lk, 0.0, lin_e));
        if (mk_slides(p, l)) PKV_MK_TRY(pkv_mk_blk(b, l, "attn_v.weight", pkv_mk_type(p, "attn_v", l), E, lk, 0.0, lin_e));
        PKV_MK_TRY(pkv_mk_norm(b, l, "attn_k_norm.weight", D));
    }
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_q_norm.weight", D));
    PKV_MK_TRY(pkv_mk_blk(b, l, "attn_output.weight", p->type, lq, E, 0.0, sqrt(3.0 / (double)lq)));
    PKV_MK_TRY(pkv_mk_norm(b, l, "post_attention_norm.weight", E));
    PKV_MK_TRY(pkv_mk_norm(b, l, "ffn_norm.weight", E));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate.weight", p->type, E, F, 0.0, lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_up.weight", p->type, E, F, 0.0, lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_down.weight", pkv_mk_type(p, "ffn_down", l), F, E, 0.0, sqrt(3.0 / (double)F)));
    PKV_MK_TRY(pkv_mk_norm(b, l, "post_ffw_norm.weight", E));
    PKV_MK_TRY(pkv_mk_blk(b, l, "layer_output_scale.weight", PKV_TYPE_F32, 1, 1, 1.0, 0.5));
    if (p->n_expert > 0) { /* experts of n_ff / 2 rows beside the dense FFN, their norms and scales */
        const int64_t Fe = p->n_ff / 2;
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate_inp.weight", p->type, E, p->n_expert, 0.0, 4.0 * lin_e));
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate_inp.scale", PKV_TYPE_F32, E, 1, 1.0, 0.5));
        PKV_MK_TRY(pkv_mk_blk3(b, l, "ffn_gate_exps.weight", p->type, E, Fe, lin_e));
        PKV_MK_TRY(pkv_mk_blk3(b, l, "ffn_up_exps.weight", p->type, E, Fe, lin_e));
        PKV_MK_TRY(pkv_mk_blk3(b, l, "ffn_down_exps.weight", pkv_mk_type(p, "ffn_down", l), Fe, E, sqrt(3.0 / (double)Fe)));
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_down_exps.scale", PKV_TYPE_F32, p->n_expert, 1, 1.0, 0.5));
        PKV_MK_TRY(pkv_mk_norm(b, l, "pre_ffw_norm_2.weight", E));
        PKV_MK_TRY(pkv_mk_norm(b, l, "post_ffw_norm_1.weight", E));
        PKV_MK_TRY(pkv_mk_norm(b, l, "post_ffw_norm_2.weight", E));
    }
    if (!P) return PKV_OK;
    PKV_MK_TRY(pkv_mk_blk(b, l, "inp_gate.weight", p->type, E, P, 0.0, lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "proj.weight", p->type, P, E, 0.0, sqrt(3.0 / (double)P)));
    return pkv_mk_norm(b, l, "post_norm.weight", E);
}

/* Tied embeddings (no output.weight). */
static const pkv_arch_mk mk = {.takes = PKV_MK_WINDOW | PKV_MK_EXPERTS | PKV_MK_LAYERS,
                               .tied = true,
                               .rope_base = 1000000.0f,
                               .rms_eps = 1e-6f,
                               .head_keys = true,
                               .check = mk_check,
                               .check_rows = mk_check_rows,
                               .draft = mk_draft,
                               .sizes = mk_sizes,
                               .keys = mk_keys,
                               .globals = mk_globals,
                               .layer = mk_layer};

const pkv_arch_ops pkv_arch_gemma4 = {.name = "gemma4",
                                      .rope_neox = true,
                                      .rope_freqs = true,
                                      .hparams = hparams,
                                      .load_layer = load_layer,
                                      .layer = layer,
                                      .load_global = load_global,
                                      .input = input,
                                      .output = pkv_gemma_output,
                                      .mk = &mk};
