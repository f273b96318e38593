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
 * The drafting loop (every step at the position after the target's last token, fed
 * the previous step's h) is speculative.c's and the engine's. */
#include <math.h>
#include <string.h>

#include "model/arch/arch.h"
#include "model/arch/mk.h"

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
        (s = pkv_hp_opt_f32(g, arch, "rope.freq_base_swa", 10000.0f, &hp->swa.rope_base)))
        return s;
    if (nextn != hp->n_layer)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.nextn_predict_layers' %d must equal '%s.block_count' %d (every layer of an "
                       "assistant is a drafting layer)", lab, arch, nextn, arch, hp->n_layer);
    if (hp->swa.n < 2)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.sliding_window' %d: an assistant needs a window of at least 2 (its "
                       "queries sit after the cached tokens)", lab, arch, hp->swa.n);
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
    if (!(hp->swa.rope_base > 0 && hp->swa.rope_base < INFINITY))
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s.rope.freq_base_swa' is %g, must be > 0", lab, arch, (double)hp->swa.rope_base);
    if (hp->yarn.ext_factor != 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: YaRN RoPE scaling ('%s.rope.scaling.type') with Gemma 4's proportional RoPE "
                       "is not supported", lab, arch);
    hp->embd_scale = sqrtf((float)hp->n_embd_out); /* the target's embedding, at the target's scale */
    hp->attn_scale = 1.0f;
    hp->swa.rope_freq_scale = 1.0f;
    hp->softcap.final = 0; /* llama.cpp's assistant caps nothing */
    return pkv_gemma4_rope_freqs(g, hp);
}

/* Queries only, over a target's cache resolved at attach (kv_layer -1 until then);
 * nextn.pre_projection [Ea][2 Eb]: the embedding's columns, then h's; and
 * nextn.post_projection [Eb][Ea]. */
static pkv_status load_global(pkv_loader *L) {
    pkv_model *m = pkv_loader_model(L);
    const int64_t Ea = m->hp.n_embd, Eb = m->hp.n_embd_out;
    if (m->kv_layer)
        return pkv_err(PKV_ERR_FORMAT, "%s: key 'pagekv.shared_kv_layers' does not go with a gemma4-assistant, whose "
                       "layers read the target's last sliding and full layers", m->label);
    m->kv_layer = pkv_malloc((size_t)m->hp.n_layer * sizeof *m->kv_layer);
    if (!m->kv_layer) return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", m->label);
    for (int il = 0; il < m->hp.n_layer; il++) m->kv_layer[il] = -1, m->layers[il].kv_reuse = true;
    m->kv_draft = true;
    m->n_cache_layers = 0;
    pkv_status s;
    if ((s = pkv_load_global_cols(L, "nextn.pre_projection.weight", 2 * Eb, Ea, 0, Eb, &m->asst.pre_e)) ||
        (s = pkv_load_global_cols(L, "nextn.pre_projection.weight", 2 * Eb, Ea, Eb, Eb, &m->asst.pre_h)) ||
        (s = pkv_load_global(L, "nextn.post_projection.weight", Ea, Eb, true, false, &m->asst.post)))
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

/* x = pre_e·(the target's embedding * sqrt(Eb)) + pre_h·h, h = pkv_fwd_batch.hidden_in
 * [T][Eb]: the embedding rows are looked up where the target's table is. */
static pkv_status input(pkv_fwd *f) {
    const pkv_model *m = f->m, *t = m->embd_of;
    const pkv_fwd_batch *b = f->b;
    const int64_t T = f->T, E = m->hp.n_embd, Eb = m->hp.n_embd_out;
    pkv_device *dev = m->dev;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, dev), *tw = t ? pkv_fwd_dev(f->ws, t->dev) : NULL;
    pkv_status s = PKV_OK;
    if (!t || !b->hidden_in || !b->peek)
        s = pkv_err(PKV_ERR_INVALID, "forward: %s is a Gemma 4 assistant: it runs attached to a target (pkv_context_attach), "
                    "fed the target's hidden states, appending nothing", m->label);
    pkv_k_get_rows_args ge = {.w = pkv_tref_make(t ? t->tok_embd.buf : NULL, 0), .wtype = t ? t->tok_embd.type : PKV_TYPE_F32,
                              .n_vocab = t ? t->hp.n_vocab : 0, .cols = Eb,
                              .ids = pkv_tref_make(tw ? tw->ints : NULL, f->pl->off_ids * 4),
                              .out = pkv_tref_make(tw ? tw->emb : NULL, 0), .n = T, .scale = m->hp.embd_scale};
    if (!s) s = pkv_k_get_rows(t->dev, &ge);
    if (!s && tw != w0) s = pkv_buffer_copy(tw->emb, 0, w0->emb, 0, (size_t)(T * Eb) * 4);
    if (!s) s = pkv_buffer_write(w0->hid, 0, b->hidden_in, (size_t)(T * Eb) * 4);
    if (!s) s = pkv_blk_matmul(f, dev, &m->asst.pre_e, w0->emb, w0->x, T);
    if (!s) s = pkv_blk_matmul(f, dev, &m->asst.pre_h, w0->hid, w0->xb, T);
    pkv_k_add_args ad = {.a = pkv_tref_make(w0->x, 0), .b = pkv_tref_make(w0->xb, 0), .y = pkv_tref_make(w0->x, 0),
                         .n = T * E, .b_len = T * E};
    if (!s) s = pkv_k_add(dev, &ad);
    return s;
}

static pkv_status layer(pkv_fwd *f, int il) {
    const pkv_layer *ly = &f->m->layers[il];
    pkv_status s = pkv_blk_attention(f, il, &(pkv_attn_kind){.norm = &ly->attn_norm, .qk_norm = true,
                                                               .post_norm = &ly->post_attn_norm});
    if (!s) s = pkv_blk_ffn(f, il, &(pkv_ffn_kind){.norm = &ly->ffn_norm, .act = PKV_GLU_GELU, .post_norm = &ly->post_ffn_norm});
    return s ? s : pkv_blk_scale(f, &ly->out_scale);
}

/* The output rows' final norm hn: logits = token_embd·hn (tied), and with
 * pkv_fwd_batch.hidden_out, h_next = post·hn [n_out][Eb]. */
static pkv_status output(pkv_fwd *f, float *logits) {
    const pkv_model *m = f->m;
    const pkv_fwd_plan *pl = f->pl;
    const int64_t E = m->hp.n_embd;
    pkv_device *dev = m->dev;
    pkv_dev_ws *w0 = pkv_fwd_dev(f->ws, dev);
    pkv_k_get_rows_args g = {.w = pkv_tref_make(w0->x, 0), .wtype = PKV_TYPE_F32, .n_vocab = f->T, .cols = E,
                             .ids = pkv_tref_make(w0->ints, pl->off_out * 4), .out = pkv_tref_make(w0->xb, 0), .n = pl->n_out};
    pkv_status s = pkv_k_get_rows(dev, &g);
    if (!s) s = pkv_blk_rmsnorm(dev, w0->xb, &m->output_norm, w0->xb, pl->n_out, E, m->hp.rms_eps);
    if (!s) s = pkv_blk_matmul(f, dev, &m->output, w0->xb, w0->logits, pl->n_out);
    if (!s && f->b->hidden_out) s = pkv_blk_matmul(f, dev, &m->asst.post, w0->xb, w0->hid, pl->n_out);
    if (!s && f->b->hidden_out)
        s = pkv_buffer_read(w0->hid, 0, f->b->hidden_out, (size_t)(pl->n_out * m->hp.n_embd_out) * 4);
    if (!s && logits) s = pkv_buffer_read(w0->logits, 0, logits, (size_t)pl->n_out * (size_t)m->hp.n_vocab * 4);
    return s ? s : pkv_device_sync(dev);
}

static bool slides(const pkv_model *m, int il) { return m->layers[il].window > 0; }

/* It must be the target's (width, vocabulary, layer kinds and KV geometry); its
 * layers read the KV of the target's last sliding and last full layer (through the
 * target's own sharing map), and its attention runs where those layers' shards are
 * stored, so those devices need the kernels. */
static pkv_status attach(pkv_model *a, const pkv_model *t, pkv_kv_cache *c) {
    const char *an = a->label, *tn = t->label;
    if (t->hp.arch != PKV_ARCH_GEMMA4)
        return pkv_err(PKV_ERR_MISMATCH, "attach: %s is a gemma4-assistant, but the target %s is a %s model, not gemma4", an,
                       tn, pkv_arch_name(t->hp.arch));
    if (a->hp.n_embd_out != t->hp.n_embd)
        return pkv_err(PKV_ERR_MISMATCH, "attach: %s is an assistant for a model of width %d (key 'gemma4-assistant."
                       "embedding_length_out'), but the target %s has width %d (key 'gemma4.embedding_length')", an,
                       a->hp.n_embd_out, tn, t->hp.n_embd);
    if (a->hp.n_vocab != t->hp.n_vocab)
        return pkv_err(PKV_ERR_MISMATCH, "attach: the assistant %s has %d tokens in its vocabulary (token_embd.weight), the "
                       "target %s has %d", an, a->hp.n_vocab, tn, t->hp.n_vocab);
    if (a->hp.swa.n != t->hp.swa.n)
        return pkv_err(PKV_ERR_MISMATCH, "attach: the assistant %s has a sliding window of %d tokens, the target %s of %d (key "
                       "'attention.sliding_window')", an, a->hp.swa.n, tn, t->hp.swa.n);
    const int L = t->hp.n_layer;
    if (L < 2 || !slides(t, L - 2) || slides(t, L - 1))
        return pkv_err(PKV_ERR_MISMATCH, "attach: the assistant %s reads the KV of the target's last two layers, a sliding and "
                       "a full one, but %s's layers %d and %d are %s and %s (key 'gemma4.attention.sliding_window_pattern')", an,
                       tn, L - 2, L - 1, L >= 2 && slides(t, L - 2) ? "sliding" : "full", slides(t, L - 1) ? "sliding" : "full");
    const int src[2] = {L - 1, L - 2}; /* full, sliding: the target's layers, then the cache layers they read */
    for (int il = 0; il < a->hp.n_layer; il++) {
        const pkv_layer *ly = &a->layers[il];
        const int tl = src[slides(a, il)], kl = t->kv_layer ? t->kv_layer[tl] : tl;
        const pkv_layer *to = &t->layers[kl];
        if (ly->n_head_kv != to->n_head_kv || ly->head_dim_k != to->head_dim_k || ly->head_dim_v != to->head_dim_v)
            return pkv_err(PKV_ERR_MISMATCH, "attach: the assistant %s's layer %d (%s) has %d KV heads of size %d, but the "
                           "target %s's layer %d, whose KV it reads, has %d of size %d (keys 'attention.head_count_kv', "
                           "'attention.key_length%s')", an, il, slides(a, il) ? "sliding" : "full", ly->n_head_kv,
                           ly->head_dim_k, tn, kl, to->n_head_kv, to->head_dim_k, slides(a, il) ? "_swa" : "");
        if (ly->n_rot != to->n_rot || ly->rope_pairs != to->rope_pairs)
            return pkv_err(PKV_ERR_MISMATCH, "attach: the assistant %s's layer %d rotates %d dims (%d pairs turning), the "
                           "target %s's layer %d %d (%d): their queries and keys would not meet (keys 'rope.dimension_count%s', "
                           "rope_freqs.weight)", an, il, ly->n_rot, ly->rope_pairs, tn, kl, to->n_rot, to->rope_pairs,
                           slides(a, il) ? "_swa" : "");
        /* attention runs where each shard of the layer is stored */
        pkv_kv_layer_info li;
        pkv_status s = pkv_kv_layout_layer(pkv_kv_cache_layout(c), kl, &li);
        if (s) return s;
        for (int k = 0; k < li.n_shards; k++) {
            pkv_kv_shard_info sh;
            if ((s = pkv_kv_shard(c, kl, k, &sh))) return s;
            if (!pkv_device_get_caps(sh.storage)->has_kernels)
                return pkv_err(PKV_ERR_UNSUPPORTED, "attach: the assistant %s on %s attends over cache layer %d of %s, stored on "
                               "%s, which has no compute kernels (attention runs where the pages live): store the target's "
                               "cache on a device with kernels (-d, or --kv-on-host)", an, pkv_device_name(a->dev), kl, tn,
                               pkv_device_name(sh.storage));
        }
    }
    for (int il = 0; il < a->hp.n_layer; il++) {
        const int tl = src[slides(a, il)];
        a->kv_layer[il] = t->kv_layer ? t->kv_layer[tl] : tl;
    }
    a->embd_of = t;
    return PKV_OK;
}

/* ------------------------------------------------------- pagekv mkmodel */


/* The file llama.cpp's converter writes for a Gemma 4 assistant checkpoint, with
 * random weights, for the gemma4 target p.draft_of. Width n_embd (0 = half the
 * target's), n_layer layers (0 = 4; swa_layers, or every layer sliding but the
 * last), n_head query heads (0 = the target's full layers'), n_ff (0 = 2 n_embd);
 * each layer's KV heads and head size are those of the target layer it reads (its
 * last sliding / full layer), RoPE and norms the target's, rope_freqs.weight
 * copied from it. */
static pkv_status mk_build(pkv_mkmodel_params p, pkv_gguf_writer **out) {
    if (!p.draft_of)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: a gemma4-assistant drafts for a gemma4 model: give its target (draft_of)");
    if (p.chat_template || p.no_vocab || p.shared_kv_layers || p.n_expert || p.n_mtp)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4-assistant: chat_template, no_vocab, shared_kv_layers, experts and MTP "
                       "layers do not apply (it takes its target's vocabulary and reads its target's KV)");
    pkv_gguf *tg = NULL;
    pkv_status s = pkv_gguf_read(p.draft_of, &tg);
    if (s) return s;
    pkv_hparams hp;
    int *nh = NULL, *nkv = NULL, *nff = NULL;
    pkv_mk b;
    memset(&b, 0, sizeof b);
    b.p = &p;
    if ((s = pkv_hparams_read(tg, &hp, &nh, &nkv, &nff))) goto done;
    if (pkv_arch_ops_of(hp.arch) != &pkv_arch_gemma4) {
        s = pkv_err(PKV_ERR_INVALID, "mkmodel: %s is a %s model: a gemma4-assistant drafts for a gemma4 model", p.draft_of,
                    pkv_arch_name(hp.arch));
        goto done;
    }
#define SLIDES(l) (hp.swa_layers[(l) / 64] >> ((l) % 64) & 1)
    const int TL = hp.n_layer, Lkv = TL - hp.n_shared_kv;
    if (TL < 2 || !SLIDES(TL - 2) || SLIDES(TL - 1) || Lkv < 2) {
        s = pkv_err(PKV_ERR_INVALID, "mkmodel: %s's last two layers must be sliding then full (the assistant reads their KV)",
                    p.draft_of);
        goto done;
    }
#undef SLIDES
    const int ksw = hp.n_shared_kv ? Lkv - 2 : TL - 2, kfu = hp.n_shared_kv ? Lkv - 1 : TL - 1; /* the KV they own */
    const pkv_gguf_tensor *te = pkv_gguf_find_tensor(tg, "token_embd.weight"), *rf = pkv_gguf_find_tensor(tg, "rope_freqs.weight");
    if (!te || !rf || rf->type != PKV_TYPE_F32) {
        s = pkv_err(PKV_ERR_FORMAT, "mkmodel: %s: no token_embd.weight or f32 rope_freqs.weight", p.draft_of);
        goto done;
    }
    const int64_t Eb = hp.n_embd, V = te->ne[1];
    const int64_t E = p.n_embd ? p.n_embd : Eb / 2, L = p.n_layer ? p.n_layer : 4, H = p.n_head ? p.n_head : nh[TL - 1];
    const int64_t F = p.n_ff ? p.n_ff : 2 * E, Dfull = hp.head_dim_k, Dswa = hp.head_dim_k_swa;
    if (E == Eb || L > 256 || (p.swa_layers && (int64_t)strlen(p.swa_layers) != L) || H % nkv[ksw] || H % nkv[kfu]) {
        s = pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4-assistant: width %lld must differ from the target's %lld, at most 256 "
                    "layers, swa_layers one letter per layer, %lld heads a multiple of the target's KV heads (%d, %d)",
                    (long long)E, (long long)Eb, (long long)H, nkv[ksw], nkv[kfu]);
        goto done;
    }
    bool slides[256];
    for (int64_t l = 0; l < L; l++) slides[l] = p.swa_layers ? p.swa_layers[l] == 's' : l < L - 1;
    if ((s = pkv_mk_begin(&b, p.seed ? p.seed : 1,
                          (size_t)PKV_MAX(PKV_MAX(E * V, 2 * Eb * E), PKV_MAX(E * H * PKV_MAX(Dfull, Dswa), E * F)))))
        goto done;
#define TRY(x)                                                                                      \
    do {                                                                                            \
        if ((s = (x))) goto done;                                                                   \
    } while (0)
    TRY(pkv_gguf_writer_add_str(b.w, "general.architecture", p.arch));
    TRY(pkv_gguf_writer_add_str(b.w, "general.name", "pagekv random test assistant"));
    TRY(pkv_gguf_writer_add_u32(b.w, "general.file_type", p.type == PKV_TYPE_F32 ? 0 : p.type == PKV_TYPE_BF16 ? 32 : 1));
    TRY(pkv_mk_u32(&b, "block_count", (uint32_t)L));
    TRY(pkv_mk_u32(&b, "nextn_predict_layers", (uint32_t)L));
    TRY(pkv_mk_u32(&b, "context_length", (uint32_t)hp.n_ctx_train));
    TRY(pkv_mk_u32(&b, "embedding_length", (uint32_t)E));
    TRY(pkv_mk_u32(&b, "embedding_length_out", (uint32_t)Eb));
    TRY(pkv_mk_u32(&b, "feed_forward_length", (uint32_t)F));
    TRY(pkv_mk_u32(&b, "attention.head_count", (uint32_t)H));
    {
        int32_t kv[256];
        uint8_t pat[256];
        for (int64_t l = 0; l < L; l++) kv[l] = nkv[slides[l] ? ksw : kfu], pat[l] = slides[l];
        TRY(pkv_mk_arr(&b, "attention.head_count_kv", PKV_GGUF_INT32, kv, (uint64_t)L));
        TRY(pkv_mk_arr(&b, "attention.sliding_window_pattern", PKV_GGUF_BOOL, pat, (uint64_t)L));
    }
    TRY(pkv_mk_u32(&b, "attention.key_length", (uint32_t)Dfull));
    TRY(pkv_mk_u32(&b, "attention.value_length", (uint32_t)Dfull));
    TRY(pkv_mk_u32(&b, "attention.key_length_swa", (uint32_t)Dswa));
    TRY(pkv_mk_u32(&b, "attention.value_length_swa", (uint32_t)Dswa));
    TRY(pkv_mk_u32(&b, "rope.dimension_count", (uint32_t)hp.n_rot));
    TRY(pkv_mk_u32(&b, "rope.dimension_count_swa", (uint32_t)hp.n_rot_swa));
    TRY(pkv_mk_f32(&b, "rope.freq_base", hp.rope_base));
    TRY(pkv_mk_f32(&b, "rope.freq_base_swa", hp.swa.rope_base));
    TRY(pkv_mk_u32(&b, "attention.sliding_window", (uint32_t)hp.swa.n));
    TRY(pkv_mk_f32(&b, "attention.layer_norm_rms_epsilon", hp.rms_eps));
    TRY(pkv_mk_u32(&b, "attention.shared_kv_layers", 0)); /* read by llama.cpp, unused */
    TRY(pkv_mk_u32(&b, "vocab_size", (uint32_t)V));
    for (int64_t i = 0; i < pkv_gguf_n_kv(tg); i++)
        if (!strncmp(pkv_gguf_kv_key(tg, i), "tokenizer.", 10)) TRY(pkv_gguf_writer_copy_kv(b.w, tg, i));
    const double lin_e = sqrt(3.0 / (double)E);
    TRY(pkv_mk_add(&b, "token_embd.weight", p.type, E, V, 0.0, 1.0));
    TRY(pkv_mk_add(&b, "output_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1));
    TRY(pkv_mk_add(&b, "nextn.pre_projection.weight", p.type, 2 * Eb, E, 0.0, sqrt(3.0 / (double)(2 * Eb))));
    TRY(pkv_mk_add(&b, "nextn.post_projection.weight", p.type, E, Eb, 0.0, 3.0 * lin_e));
    {
        int64_t ne[1] = {rf->ne[0]};
        TRY(pkv_gguf_writer_add_tensor(b.w, "rope_freqs.weight", PKV_TYPE_F32, 1, ne, rf->data, (size_t)rf->ne[0] * 4));
    }
    for (int l = 0; l < (int)L; l++) { /* queries only: the KV is the target's */
        const int64_t D = slides[l] ? Dswa : Dfull, lq = H * D;
        TRY(pkv_mk_norm(&b, l, "attn_norm.weight", E));
        TRY(pkv_mk_blk(&b, l, "attn_q.weight", p.type, E, lq, 0.0, lin_e));
        TRY(pkv_mk_norm(&b, l, "attn_q_norm.weight", D));
        TRY(pkv_mk_blk(&b, l, "attn_output.weight", p.type, lq, E, 0.0, sqrt(3.0 / (double)lq)));
        TRY(pkv_mk_norm(&b, l, "post_attention_norm.weight", E));
        TRY(pkv_mk_norm(&b, l, "ffn_norm.weight", E));
        TRY(pkv_mk_blk(&b, l, "ffn_gate.weight", p.type, E, F, 0.0, lin_e));
        TRY(pkv_mk_blk(&b, l, "ffn_up.weight", p.type, E, F, 0.0, lin_e));
        TRY(pkv_mk_blk(&b, l, "ffn_down.weight", p.type, F, E, 0.0, sqrt(3.0 / (double)F)));
        TRY(pkv_mk_norm(&b, l, "post_ffw_norm.weight", E));
        TRY(pkv_mk_blk(&b, l, "layer_output_scale.weight", PKV_TYPE_F32, 1, 1, 1.0, 0.5));
    }
#undef TRY
done:
    pkv_free(nh);
    pkv_free(nkv);
    pkv_free(nff);
    return pkv_mk_end(&b, tg, s, out);
}

/* Made whole by mk_build (it is a draft of a gemma4 target, never one made from options). */
static const pkv_arch_mk mk = {.build = mk_build};

const pkv_arch_ops pkv_arch_gemma4_assistant = {.name = "gemma4-assistant",
                                                .rope_neox = true,
                                                .rope_freqs = true,
                                                .foreign_embd = true,
                                                .hparams = hparams,
                                                .load_layer = load_layer,
                                                .layer = layer,
                                                .load_global = load_global,
                                                .input = input,
                                                .output = output,
                                                .attach = attach,
                                                .mk = &mk};
