/* Contexts: a sequence of the KV cache plus the logits of its last token. A fork
 * shares its parent's forward workspace, so it costs nothing beyond the cache's
 * page sharing. */
#include <string.h>

#include "engine/engine.h"
#include "kv/kv-file.h"
#include "model/blocks.h"

/* The forward workspace, shared by a context and its forks (a batch step uses
 * the first context's). */
typedef struct pkv_runner {
    int refs;
    pkv_fwd_ws *ws;
    float *lg;     /* host logits of a step, kept so a decode step allocates nothing big */
    size_t lg_cap; /* floats */
} pkv_runner;

struct pkv_context {
    pkv_model *m;
    pkv_kv_cache *c;
    pkv_runner *run;
    int32_t seq;
    int64_t n_ctx;
    float *logits;   /* [n_vocab] */
    bool has_logits;
    float *hidden;   /* pkv_context_keep_hidden: [n_ctx][n_embd], row i the final normed hidden
                        state of token i, written by every decode; NULL = not kept */
    int64_t hidden_from; /* rows [hidden_from, n_tokens) are kept: tokens decoded before keeping
                            began (or moved by a shift) have none */
};

pkv_cache_params pkv_cache_default_params(void) {
    pkv_cache_params p;
    memset(&p, 0, sizeof p);
    p.kv_type = PKV_TYPE_F16;
    p.kv_type_v = PKV_TYPE_COUNT;
    return p;
}

static int n_ctx_of(const pkv_model *m, const pkv_cache_params *p) {
    return p->n_ctx > 0 ? p->n_ctx : PKV_MIN(m->hp.n_ctx_train, 4096);
}

const float *pkv_model_rope_factors(const pkv_model *m, int64_t n_ctx) {
    if (!m->longrope.n) return NULL;
    return m->longrope.host + (n_ctx > m->hp.yarn.n_ctx_orig ? m->longrope.n : 0);
}

pkv_kv_params pkv_model_kv_params(const pkv_model *m, pkv_kv_layer_desc *layers, pkv_kv_shard_desc *shards) {
    pkv_kv_params kp = pkv_kv_default_params();
    /* the cache's layers: the model's, less the last ones where they reuse an
     * earlier layer's KV (gemma4); cache layer l is model layer l then */
    for (int l = 0; l < m->n_cache_layers; l++) {
        memset(&layers[l], 0, sizeof layers[l]);
        layers[l].n_kv_heads = m->layers[l].n_head_kv;
        layers[l].head_dim_k = m->layers[l].head_dim_k;
        layers[l].head_dim_v = m->layers[l].head_dim_v;
        layers[l].rope_n_rot = m->layers[l].n_rot; /* gemma4: sliding and full layers rotate their own widths */
        layers[l].rope_n_pairs = m->layers[l].rope_pairs;
        layers[l].rope_none = m->layers[l].nope;
        /* MLA: one row [latent, rotary part] per token, V its latent (no V pages) */
        layers[l].v_in_k = m->layers[l].latent > 0;
        layers[l].rope_off = m->layers[l].latent;
        layers[l].dtype_k = PKV_TYPE_F16;
        layers[l].dtype_v = PKV_TYPE_F16;
        /* Sliding-window layers keep their K/V in the cache's window pool. */
        layers[l].window = m->layers[l].window;
        layers[l].chunk = m->layers[l].chunk; /* chunked layers too (kept as a window of their chunk) */
        layers[l].rope_freq_base = m->layers[l].rope_base; /* gemma3: per layer */
        layers[l].rope_freq_scale = m->layers[l].rope_freq_scale;
        if (m->layers[l].recurrent) /* a state slot per sequence instead of K/V pages; key-head groups as heads */
            pkv_model_state_desc(m, l, &layers[l]);
        /* I5: shards follow the model's head split; with the cache on the host the
         * host storage is split by the same head ranges, and attention runs there. */
        layers[l].n_shards = m->n_dev;
        layers[l].shards = shards + (size_t)l * (size_t)m->n_dev;
        for (int d = 0; d < m->n_dev; d++) {
            pkv_kv_shard_desc *sd = &shards[(size_t)l * (size_t)m->n_dev + (size_t)d];
            /* a recurrent layer's state stays where its kernels run, also with --kv-on-host */
            sd->storage = m->kv_on_host && !m->layers[l].recurrent ? m->host : m->devs[d];
            sd->compute = sd->storage;
            sd->head_begin = m->layers[l].sh[d].kv_h0; /* a recurrent layer: its key-head groups */
            sd->n_heads = m->layers[l].sh[d].n_kv;
        }
    }
    kp.n_layers = m->n_cache_layers;
    kp.layers = layers;
    kp.device = m->dev;
    kp.rope_n_rot = m->hp.n_rot;
    kp.rope_neox = m->hp.rope_neox;
    kp.rope_freq_base = m->hp.rope_base;
    kp.rope_freq_scale = m->hp.rope_freq_scale;
    kp.rope_yarn_ext_factor = m->hp.yarn.ext_factor; /* gpt-oss: the shift turns K with YaRN's angles */
    kp.rope_yarn_n_ctx_orig = m->hp.yarn.n_ctx_orig;
    kp.rope_yarn_beta_fast = m->hp.yarn.beta_fast;
    kp.rope_yarn_beta_slow = m->hp.yarn.beta_slow;
    return kp;
}

pkv_kv_cache *pkv_model_cache_create(const pkv_model *m, pkv_cache_params p) {
    if (!m) {
        pkv_err(PKV_ERR_INVALID, "cache: model is NULL");
        return NULL;
    }
    const pkv_type tk = p.kv_type, tv = p.kv_type_v == PKV_TYPE_COUNT ? p.kv_type : p.kv_type_v;
    if (!pkv_kv_type_ok(tk) || !pkv_kv_type_ok(tv)) {
        pkv_type bad = pkv_kv_type_ok(tk) ? tv : tk;
        pkv_err(PKV_ERR_INVALID, "cache: %s type %s is not supported (f16, f32, q8_0 or q4_0)",
                bad == tk ? "K" : "V", pkv_type_name(bad) ? pkv_type_name(bad) : "?");
        return NULL;
    }
    if (p.n_ctx < 0 || p.n_seq_max < 0 || p.page_size < 0 || p.page_size > PKV_KV_MAX_PAGE_SIZE || p.n_pages < 0 ||
        p.host_pages < 0) {
        pkv_err(PKV_ERR_INVALID, "cache: negative size or page size above %d", PKV_KV_MAX_PAGE_SIZE);
        return NULL;
    }
    pkv_kv_layer_desc *layers = pkv_calloc((size_t)m->hp.n_layer, sizeof *layers);
    pkv_kv_shard_desc *shards = pkv_calloc((size_t)m->hp.n_layer * (size_t)m->n_dev, sizeof *shards);
    if (!layers || !shards) {
        pkv_free(layers);
        pkv_free(shards);
        pkv_err(PKV_ERR_NOMEM, "cache: out of memory");
        return NULL;
    }
    pkv_kv_params kp = pkv_model_kv_params(m, layers, shards);
    for (int l = 0; l < kp.n_layers; l++) {
        layers[l].dtype_k = tk;
        layers[l].dtype_v = tv;
    }
    kp.rope_factors = pkv_model_rope_factors(m, n_ctx_of(m, &p)); /* LongRoPE: short or long, as the cache is long */
    kp.page_size = p.page_size ? p.page_size : 16;
    int64_t per_seq = (n_ctx_of(m, &p) + kp.page_size - 1) / kp.page_size;
    kp.n_pages = p.n_pages ? p.n_pages : per_seq * (p.n_seq_max ? p.n_seq_max : 4);
    kp.host_pages = p.host_pages ? p.host_pages : kp.n_pages;
    int window = 0;
    for (int l = 0; l < m->hp.n_layer; l++) window = PKV_MAX(window, m->layers[l].window);
    if (p.n_window_pages < 0) {
        pkv_err(PKV_ERR_INVALID, "cache: %lld window pages", (long long)p.n_window_pages);
        pkv_free(layers);
        pkv_free(shards);
        return NULL;
    }
    if (window > 0) { /* what one sequence holds at most: the window, a page kept for rollback, one step */
        int64_t per_seq_w = (window + kp.page_size + 256 + kp.page_size - 1) / kp.page_size + 1;
        kp.window_pages = p.n_window_pages ? p.n_window_pages
                                           : PKV_MIN(kp.n_pages, 2 * per_seq_w * (p.n_seq_max ? p.n_seq_max : 4));
    }
    /* Recurrent layers: a live state per sequence and about two checkpoints each, so
     * a truncate usually finds one near (more are taken while slots last) */
    if (m->hp.recurrent) kp.state_slots = 3 * (int64_t)(p.n_seq_max ? p.n_seq_max : 4) + 4;
    kp.disk_dir = p.disk_dir;
    kp.disk_bytes = p.disk_bytes;
    kp.remote_url = p.remote_url;
    kp.remote_queue_pages = p.remote_queue_pages;
    /* under MPI ranks: the layers other ranks hold get no storage here */
    bool *other = m->n_ranks > 1 ? pkv_calloc((size_t)kp.n_layers, sizeof *other) : NULL;
    for (int l = 0; other && l < kp.n_layers; l++) other[l] = l < m->rank_first[m->rank] || l >= m->rank_first[m->rank + 1];
    kp.on_other_rank = other;
    pkv_kv_cache *c = m->n_ranks > 1 && !other ? NULL : pkv_kv_cache_create(kp);
    if (m->n_ranks > 1 && !other) pkv_err(PKV_ERR_NOMEM, "cache: out of memory");
    pkv_free(other);
    pkv_free(layers);
    pkv_free(shards);
    return c;
}

static pkv_context *ctx_new(pkv_model *m, pkv_kv_cache *c, pkv_runner *run, int32_t seq, int64_t n_ctx) {
    pkv_context *ctx = pkv_calloc(1, sizeof *ctx);
    float *lg = pkv_malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (!ctx || !lg) {
        pkv_free(ctx);
        pkv_free(lg);
        pkv_err(PKV_ERR_NOMEM, "context: out of memory");
        return NULL;
    }
    ctx->m = m;
    ctx->c = c;
    ctx->seq = seq;
    ctx->logits = lg;
    ctx->n_ctx = n_ctx > 0 ? n_ctx : PKV_MIN(m->hp.n_ctx_train, 4096);
    if (run) {
        run->refs++;
        ctx->run = run;
    }
    return ctx;
}

/* A context with its own workspace on sequence seq, which it takes over (freed
 * here on failure). */
static pkv_context *ctx_own(pkv_model *m, pkv_kv_cache *c, int32_t seq, int64_t n_ctx) {
    pkv_runner *run = pkv_calloc(1, sizeof *run);
    pkv_context *ctx = run ? ctx_new(m, c, run, seq, n_ctx) : NULL;
    if (!ctx) {
        if (!run) pkv_err(PKV_ERR_NOMEM, "context: out of memory");
        pkv_kv_seq_free(c, seq);
        pkv_free(run);
    }
    return ctx;
}

/* A cache made for another model (other layers, heads, head sizes or devices) is
 * refused here, not at the first decode. */
static pkv_status cache_fits_model(const pkv_model *m, const pkv_kv_cache *c) {
    const pkv_kv_layout *lay = pkv_kv_cache_layout(c);
    int nl = pkv_kv_layout_n_layers(lay);
    if (nl != m->n_cache_layers)
        return pkv_err(PKV_ERR_MISMATCH, "context: the cache has %d layers, model %s has %d with KV of their own (make the "
                                         "cache with pkv_model_cache_create for this model)", nl, m->label, m->n_cache_layers);
    for (int l = 0; l < nl; l++) {
        pkv_kv_layer_info li;
        pkv_status s = pkv_kv_layout_layer(lay, l, &li);
        if (s) return s;
        if (m->layers[l].recurrent || li.state_per_head > 0) { /* a state slot, not K/V pages */
            pkv_kv_layer_desc want; /* the architecture's description of the state */
            memset(&want, 0, sizeof want);
            if (m->layers[l].recurrent) pkv_model_state_desc(m, l, &want);
            const int64_t total = want.state_per_head;
            if (li.state_per_head != total)
                return pkv_err(PKV_ERR_MISMATCH, "context: cache layer %d keeps a recurrent state of %d floats, model %s %s "
                               "%lld", l, li.state_per_head, m->label, m->layers[l].recurrent ? "needs" : "has attention there, not",
                               (long long)total);
            continue;
        }
        if (li.n_kv_heads != m->layers[l].n_head_kv || li.head_dim_k != m->layers[l].head_dim_k ||
            li.head_dim_v != m->layers[l].head_dim_v)
            return pkv_err(PKV_ERR_MISMATCH, "context: cache layer %d has %d KV heads of sizes %d/%d, model %s expects "
                                             "%d of %d/%d", l, li.n_kv_heads, li.head_dim_k, li.head_dim_v, m->label,
                           m->layers[l].n_head_kv, m->layers[l].head_dim_k, m->layers[l].head_dim_v);
        if (li.n_shards != m->n_dev)
            return pkv_err(PKV_ERR_MISMATCH, "context: cache layer %d has %d shards, model %s is split over %d devices",
                           l, li.n_shards, m->label, m->n_dev);
        for (int d = 0; d < m->n_dev; d++) {
            pkv_kv_shard_info si;
            if ((s = pkv_kv_shard(c, l, d, &si))) return s;
            const pkv_device *want = m->kv_on_host ? m->host : m->devs[d];
            if (si.head_begin != m->layers[l].sh[d].kv_h0 || si.n_heads != m->layers[l].sh[d].n_kv ||
                si.compute != want)
                return pkv_err(PKV_ERR_MISMATCH, "context: cache layer %d shard %d holds heads %d..%d on %s, model %s "
                                                 "computes heads %d..%d on %s", l, d, si.head_begin,
                               si.head_begin + si.n_heads - 1, pkv_device_name(si.compute), m->label,
                               m->layers[l].sh[d].kv_h0, m->layers[l].sh[d].kv_h0 + m->layers[l].sh[d].n_kv - 1,
                               pkv_device_name(want));
        }
    }
    return PKV_OK;
}

pkv_context *pkv_context_create(pkv_model *m, pkv_kv_cache *c, int64_t n_ctx) {
    if (!m || !c) {
        pkv_err(PKV_ERR_INVALID, "context: model or cache is NULL");
        return NULL;
    }
    if (n_ctx < 0) {
        pkv_err(PKV_ERR_INVALID, "context: n_ctx %lld is negative (0 = the model's default)", (long long)n_ctx);
        return NULL;
    }
    if (cache_fits_model(m, c)) return NULL;
    int32_t seq;
    if (pkv_kv_seq_create(c, m->fingerprint, &seq)) return NULL;
    return ctx_own(m, c, seq, n_ctx);
}

static void runner_release(pkv_runner *r) {
    if (r && --r->refs == 0) {
        pkv_fwd_ws_free(r->ws);
        pkv_free(r->lg);
        pkv_free(r);
    }
}

void pkv_context_free(pkv_context *ctx) {
    if (!ctx) return;
    pkv_kv_seq_free(ctx->c, ctx->seq);
    runner_release(ctx->run);
    pkv_free(ctx->logits);
    pkv_free(ctx->hidden);
    pkv_free(ctx);
}

pkv_status pkv_context_keep_hidden(pkv_context *ctx) {
    if (!ctx) return pkv_err(PKV_ERR_INVALID, "keep_hidden: context is NULL");
    if (ctx->hidden) return PKV_OK;
    ctx->hidden = pkv_calloc((size_t)ctx->n_ctx * (size_t)ctx->m->hp.n_embd, sizeof(float));
    ctx->hidden_from = pkv_kv_seq_len(ctx->c, ctx->seq);
    return ctx->hidden ? PKV_OK
                       : pkv_err(PKV_ERR_NOMEM, "keep_hidden: %lld x %d floats", (long long)ctx->n_ctx, ctx->m->hp.n_embd);
}

const float *pkv_context_hidden(const pkv_context *ctx, int64_t i) {
    if (!ctx || !ctx->hidden || i < ctx->hidden_from || i < 0 || i >= pkv_kv_seq_len(ctx->c, ctx->seq)) return NULL;
    return ctx->hidden + (size_t)i * (size_t)ctx->m->hp.n_embd;
}

pkv_context *pkv_context_fork(pkv_context *ctx) {
    if (!ctx) {
        pkv_err(PKV_ERR_INVALID, "fork: context is NULL");
        return NULL;
    }
    int32_t child;
    if (pkv_kv_fork(ctx->c, ctx->seq, &child)) return NULL;
    pkv_context *k = ctx_new(ctx->m, ctx->c, ctx->run, child, ctx->n_ctx);
    if (!k) {
        pkv_kv_seq_free(ctx->c, child);
        return NULL;
    }
    memcpy(k->logits, ctx->logits, (size_t)ctx->m->hp.n_vocab * sizeof(float));
    k->has_logits = ctx->has_logits;
    return k;
}

pkv_context *pkv_context_attach(pkv_model *draft, pkv_context *target) {
    if (!draft || !target) {
        pkv_err(PKV_ERR_INVALID, "attach: NULL draft or target");
        return NULL;
    }
    if (!draft->kv_draft) { /* (an assistant is one: it reads the target's pages) */
        pkv_err(PKV_ERR_INVALID, "attach: %s is not a shared-KV draft (no pagekv.shared_kv_layers key)", draft->label);
        return NULL;
    }
    int32_t child; /* the I6 check (and an assistant's layers pointed at the target's cache layers) */
    if (pkv_model_attach(draft, target->m, target->c) || pkv_kv_fork(target->c, target->seq, &child)) return NULL;
    return ctx_own(draft, target->c, child, target->n_ctx);
}

int32_t pkv_context_seq(const pkv_context *ctx) { return ctx ? ctx->seq : -1; }
pkv_model *pkv_context_model(const pkv_context *ctx) { return ctx ? ctx->m : NULL; }
pkv_kv_cache *pkv_context_cache(const pkv_context *ctx) { return ctx ? ctx->c : NULL; }
int64_t pkv_context_n_tokens(const pkv_context *ctx) { return ctx ? pkv_kv_seq_len(ctx->c, ctx->seq) : -1; }
int64_t pkv_context_n_ctx(const pkv_context *ctx) { return ctx ? ctx->n_ctx : 0; }
const float *pkv_context_logits(const pkv_context *ctx) { return ctx && ctx->has_logits ? ctx->logits : NULL; }

/* One batched step; all_logits (host) receives every token's logits for a single
 * context, else each context gets its last token's logits. pos: the tokens'
 * positions (concatenated), NULL = each sequence's last position + 1. */
/* Media rows of a step (pkv_fwd_batch.media_embd, n_media_rows, span_end). */
typedef struct media_in {
    const float *embd;
    int64_t n_rows;
    const int32_t *span_end;
} media_in;

static pkv_status decode_h(pkv_context *const *ctxs, int n, const int32_t *const *tokens, const int32_t *n_tokens,
                           const int32_t *pos, float *all_logits, const float *h_in, float *h_out, const media_in *mi);

static pkv_status decode(pkv_context *const *ctxs, int n, const int32_t *const *tokens, const int32_t *n_tokens,
                         const int32_t *pos, float *all_logits) {
    return decode_h(ctxs, n, tokens, n_tokens, pos, all_logits, NULL, NULL, NULL);
}

pkv_status pkv_context_decode_mtp(pkv_context *ctx, const int32_t *tokens, int32_t n, const float *h_in, float *h_out) {
    if (!ctx || !h_in || !h_out) return pkv_err(PKV_ERR_INVALID, "decode_mtp: NULL argument");
    return decode_h(&ctx, 1, &tokens, &n, NULL, NULL, h_in, h_out, NULL);
}

pkv_status pkv_context_draft_step(pkv_context *ctx, const int32_t *tokens, int32_t n, const float *h_in, float *h_out) {
    if (!ctx || !tokens || n <= 0 || !h_in) return pkv_err(PKV_ERR_INVALID, "draft_step: NULL argument or n <= 0");
    pkv_model *m = ctx->m;
    if (!m->assistant || !m->embd_of)
        return pkv_err(PKV_ERR_INVALID, "draft_step: %s is not a query-only draft (pkv_model_info.assistant) attached to a target", m->label);
    const int64_t len = pkv_kv_seq_len(ctx->c, ctx->seq);
    if (len < 1) return pkv_err(PKV_ERR_INVALID, "draft_step: the target's sequence is empty: nothing to draft from");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return pkv_err(PKV_ERR_INVALID, "draft_step: token id %d is outside the vocabulary [0, %d)", tokens[i], m->hp.n_vocab);
    /* every query at the position after the sequence's last token */
    int32_t stack_pos[16], *pos = n <= 16 ? stack_pos : pkv_malloc((size_t)n * sizeof *pos);
    pkv_runner *run = ctx->run;
    void *p = run->lg;
    pkv_status s = pos ? pkv_grow(&p, &run->lg_cap, (size_t)m->hp.n_vocab, sizeof(float)) : pkv_err(PKV_ERR_NOMEM, "draft_step");
    run->lg = p;
    if (!s) {
        int32_t last;
        s = pkv_kv_seq_tokens(ctx->c, ctx->seq, len - 1, 1, NULL, &last);
        for (int32_t i = 0; i < n; i++) pos[i] = last + 1;
    }
    if (!s) {
        pkv_fwd_batch b = {.n_seqs = 1, .seqs = &ctx->seq, .n_tokens = &n, .tokens = tokens, .pos = pos,
                           .hidden_in = h_in, .hidden_out = h_out, .peek = true};
        s = pkv_model_forward(m, ctx->c, &run->ws, &b, run->lg);
    }
    if (!s) {
        memcpy(ctx->logits, run->lg, (size_t)m->hp.n_vocab * sizeof(float));
        ctx->has_logits = true;
    }
    if (pos != stack_pos) pkv_free(pos);
    return s;
}

/* decode, with an MTP head's hidden-state input rows h_in and every token's final
 * normed hidden state in h_out (both f32 [T][n_embd], may be NULL); contexts that
 * keep their hidden states get their rows. */
static pkv_status decode_h(pkv_context *const *ctxs, int n, const int32_t *const *tokens, const int32_t *n_tokens,
                           const int32_t *pos, float *all_logits, const float *h_in, float *h_out, const media_in *mi) {
    if (!ctxs || n <= 0 || !tokens || !n_tokens || !ctxs[0])
        return pkv_err(PKV_ERR_INVALID, "decode: NULL context, tokens or counts, or n_ctxs <= 0");
    pkv_model *m = ctxs[0]->m;
    pkv_kv_cache *c = ctxs[0]->c;
    int64_t T = 0;
    for (int i = 0; i < n; i++) {
        if (!ctxs[i] || ctxs[i]->m != m || ctxs[i]->c != c)
            return pkv_err(PKV_ERR_INVALID, "decode: context %d is NULL or on another model or cache", i);
        for (int j = 0; j < i; j++)
            if (ctxs[j] == ctxs[i]) return pkv_err(PKV_ERR_INVALID, "decode: context %d appears twice in the batch", i);
        if (n_tokens[i] <= 0 || !tokens[i]) return pkv_err(PKV_ERR_INVALID, "decode: context %d has no tokens", i);
        int64_t have = pkv_kv_seq_len(c, ctxs[i]->seq);
        if (have + n_tokens[i] > ctxs[i]->n_ctx)
            return pkv_err(PKV_ERR_INVALID, "decode: context %d would hold %lld tokens, more than its limit of %lld", i,
                           (long long)(have + n_tokens[i]), (long long)ctxs[i]->n_ctx);
        T += n_tokens[i];
    }
    int32_t *seqs = pkv_malloc((size_t)n * sizeof *seqs), *tok = pkv_malloc((size_t)T * sizeof *tok);
    pkv_runner *run = ctxs[0]->run;
    pkv_status s = PKV_OK;
    if (!all_logits) { /* the step's logits land here first: on error no context changes */
        void *p = run->lg;
        s = pkv_grow(&p, &run->lg_cap, (size_t)n * (size_t)m->hp.n_vocab, sizeof(float));
        run->lg = p;
    }
    float *lg = all_logits ? NULL : run->lg;
    if (!s && (!seqs || !tok)) s = pkv_err(PKV_ERR_NOMEM, "decode: %lld tokens", (long long)T);
    int64_t k = 0;
    for (int i = 0; !s && i < n; i++) {
        seqs[i] = ctxs[i]->seq;
        memcpy(tok + k, tokens[i], (size_t)n_tokens[i] * sizeof *tok);
        k += n_tokens[i];
    }
    bool keep = false;
    int64_t *before = NULL;
    float *hid = h_out;
    for (int i = 0; i < n; i++) keep |= ctxs[i]->hidden != NULL;
    if (!s && keep) { /* where each context's rows go */
        before = pkv_malloc((size_t)n * sizeof *before);
        if (!hid) hid = pkv_malloc((size_t)T * (size_t)m->hp.n_embd * sizeof *hid);
        if (!before || !hid) s = pkv_err(PKV_ERR_NOMEM, "decode: hidden states of %lld tokens", (long long)T);
        for (int i = 0; !s && i < n; i++) before[i] = pkv_kv_seq_len(c, ctxs[i]->seq);
    }
    if (!s) {
        pkv_fwd_batch b = {.n_seqs = n, .seqs = seqs, .n_tokens = n_tokens, .tokens = tok, .pos = pos,
                           .all_logits = all_logits != NULL, .hidden_in = h_in, .hidden_out = hid,
                           .media_embd = mi ? mi->embd : NULL, .n_media_rows = mi ? mi->n_rows : 0,
                           .span_end = mi ? mi->span_end : NULL};
        s = pkv_model_forward(m, c, &ctxs[0]->run->ws, &b, all_logits ? all_logits : lg);
    }
    if (!s && keep) {
        const size_t E = (size_t)m->hp.n_embd;
        size_t row = 0;
        for (int i = 0; i < n; row += (size_t)n_tokens[i], i++)
            if (ctxs[i]->hidden)
                memcpy(ctxs[i]->hidden + (size_t)before[i] * E, hid + row * E, (size_t)n_tokens[i] * E * sizeof(float));
    }
    pkv_free(before);
    if (hid != h_out) pkv_free(hid);
    if (!s) {
        size_t V = (size_t)m->hp.n_vocab;
        for (int i = 0; i < n; i++) {
            const float *src = all_logits ? all_logits + (size_t)(n_tokens[0] - 1) * V : lg + (size_t)i * V;
            memcpy(ctxs[i]->logits, src, V * sizeof(float));
            ctxs[i]->has_logits = true;
        }
    }
    pkv_free(seqs);
    pkv_free(tok);
    return s;
}

pkv_status pkv_decode(pkv_context *const *ctxs, int n, const int32_t *const *tokens, const int32_t *n_tokens) {
    return decode(ctxs, n, tokens, n_tokens, NULL, NULL);
}

pkv_status pkv_context_decode(pkv_context *ctx, const int32_t *tokens, int32_t n) {
    return decode(&ctx, 1, &tokens, &n, NULL, NULL);
}

pkv_status pkv_context_decode_all(pkv_context *ctx, const int32_t *tokens, int32_t n, float *all_logits) {
    if (!all_logits) return pkv_err(PKV_ERR_INVALID, "decode_all: all_logits is NULL");
    return decode(&ctx, 1, &tokens, &n, NULL, all_logits);
}

pkv_status pkv_context_truncate(pkv_context *ctx, int64_t n_keep) {
    if (!ctx) return pkv_err(PKV_ERR_INVALID, "truncate: context is NULL");
    pkv_status s = pkv_kv_truncate(ctx->c, ctx->seq, n_keep);
    if (!s) ctx->has_logits = false;
    if (!s && ctx->hidden_from > n_keep) ctx->hidden_from = n_keep; /* decoded again from there */
    return s;
}

pkv_status pkv_context_shift(pkv_context *ctx, int64_t start, int64_t n_remove) {
    if (!ctx) return pkv_err(PKV_ERR_INVALID, "shift: context is NULL");
    if (n_remove < 0 || n_remove > INT32_MAX) return pkv_err(PKV_ERR_INVALID, "shift: n_remove %lld", (long long)n_remove);
    pkv_status s = pkv_kv_shift(ctx->c, ctx->seq, start, n_remove, -(int32_t)n_remove);
    if (!s) ctx->has_logits = false;
    if (!s && ctx->hidden) ctx->hidden_from = pkv_kv_seq_len(ctx->c, ctx->seq); /* the rows moved: none kept */
    return s;
}

pkv_status pkv_context_swap_out(pkv_context *ctx) {
    return ctx ? pkv_kv_swap_out(ctx->c, ctx->seq) : pkv_err(PKV_ERR_INVALID, "swap: context is NULL");
}

pkv_status pkv_context_swap_in(pkv_context *ctx) {
    return ctx ? pkv_kv_swap_in(ctx->c, ctx->seq) : pkv_err(PKV_ERR_INVALID, "swap: context is NULL");
}

pkv_status pkv_context_save(pkv_context *ctx, const char *path) {
    return ctx ? pkv_kv_seq_save(ctx->c, ctx->seq, path) : pkv_err(PKV_ERR_INVALID, "save: context is NULL");
}

pkv_status pkv_context_tokens(const pkv_context *ctx, int64_t start, int64_t n, int32_t *out) {
    if (!ctx || !out) return pkv_err(PKV_ERR_INVALID, "tokens: context or output is NULL");
    return pkv_kv_seq_tokens(ctx->c, ctx->seq, start, n, out, NULL);
}

/* The context of a freshly loaded sequence; label names the source in messages. */
static pkv_context *ctx_loaded(pkv_model *m, pkv_kv_cache *c, int32_t seq, const char *label, int64_t n_ctx) {
    pkv_context *ctx = ctx_own(m, c, seq, n_ctx);
    if (!ctx) return NULL;
    /* Recompute the last token so the context has logits, as it had when saved:
     * at its saved position, which need not follow the one before (a shift with
     * n_remove 0 re-positions tokens; found by fuzz-kvfile). */
    int64_t n = pkv_kv_seq_len(c, seq);
    if (n > 0) {
        int32_t last, last_pos, one = 1;
        const int32_t *lastp = &last;
        pkv_status s = pkv_kv_seq_tokens(c, seq, n - 1, 1, &last, &last_pos);
        if (!s && pkv_token_is_media(last)) return ctx; /* a media row: no logits until the next decode */
        if (!s && last < 0) s = pkv_err(PKV_ERR_FORMAT, "load %s: the saved sequence has no token ids", label);
        if (!s) s = pkv_kv_truncate(c, seq, n - 1);
        if (!s) s = decode(&ctx, 1, &lastp, &one, &last_pos, NULL);
        if (s) {
            pkv_context_free(ctx);
            return NULL;
        }
    }
    return ctx;
}

pkv_context *pkv_context_load(pkv_model *m, pkv_kv_cache *c, const char *path, int64_t n_ctx) {
    if (!m || !c || !path) {
        pkv_err(PKV_ERR_INVALID, "load: NULL argument");
        return NULL;
    }
    if (n_ctx < 0) {
        pkv_err(PKV_ERR_INVALID, "load: n_ctx %lld is negative (0 = the model's default)", (long long)n_ctx);
        return NULL;
    }
    if (cache_fits_model(m, c)) return NULL;
    int32_t seq;
    if (pkv_kv_seq_load(c, path, m->fingerprint, &seq)) return NULL;
    return ctx_loaded(m, c, seq, path, n_ctx);
}

pkv_context *pkv_context_load_memory(pkv_model *m, pkv_kv_cache *c, const char *label, const void *data, size_t size,
                                     int64_t n_ctx) {
    if (!m || !c) {
        pkv_err(PKV_ERR_INVALID, "load: NULL argument");
        return NULL;
    }
    if (!label) label = "<memory>";
    int32_t seq;
    if (pkv_kv_seq_load_memory(c, label, data, size, m->fingerprint, &seq)) return NULL;
    return ctx_loaded(m, c, seq, label, n_ctx);
}

pkv_status pkv_context_reattach(pkv_context *draft, pkv_context *target) {
    if (!draft || !target || draft->c != target->c)
        return pkv_err(PKV_ERR_INVALID, "reattach: the draft context is not on the target's cache");
    int32_t child;
    pkv_status s = pkv_kv_fork(target->c, target->seq, &child);
    if (s) return s;
    pkv_kv_seq_free(draft->c, draft->seq);
    draft->seq = child;
    draft->n_ctx = target->n_ctx;
    draft->has_logits = false;
    return PKV_OK;
}

void pkv_context_set_logits(pkv_context *ctx, const float *logits) {
    if (logits && logits != ctx->logits) memcpy(ctx->logits, logits, (size_t)ctx->m->hp.n_vocab * sizeof(float));
    ctx->has_logits = logits != NULL;
}

void pkv_context_put_hidden(pkv_context *ctx, int64_t pos, const float *rows, int64_t n) {
    if (!ctx->hidden || pos < ctx->hidden_from || pos >= ctx->n_ctx) return;
    if (n > ctx->n_ctx - pos) n = ctx->n_ctx - pos; /* (rows of proposals past the limit) */
    memcpy(ctx->hidden + (size_t)pos * (size_t)ctx->m->hp.n_embd, rows,
           (size_t)n * (size_t)ctx->m->hp.n_embd * sizeof(float));
}

/* ------------------------------------------------------------------ media */

pkv_status pkv_context_decode_prompt(pkv_context *ctx, const int32_t *tokens, int32_t n, const pkv_media_rows *media,
                                     int n_media) {
    if (!ctx || n < 0 || (n && !tokens) || n_media < 0 || (n_media && !media))
        return pkv_err(PKV_ERR_INVALID, "decode prompt: NULL context, tokens or media, or a negative count");
    int64_t T = n;
    for (int i = 0; i < n_media; i++) {
        const pkv_media_rows *r = &media[i];
        if (r->n_rows < 1 || !r->embd)
            return pkv_err(PKV_ERR_INVALID, "decode prompt: media chunk %d has %d rows%s", i, r->n_rows,
                           r->embd ? "" : " and no embeddings");
        if (r->at < 0 || r->at > n || (i && r->at < media[i - 1].at))
            return pkv_err(PKV_ERR_INVALID, "decode prompt: media chunk %d is placed after %d tokens: at must be in [%d, %d]",
                           i, r->at, i ? media[i - 1].at : 0, n);
        T += r->n_rows;
    }
    if (T < 1) return pkv_err(PKV_ERR_INVALID, "decode prompt: no tokens and no media");
    if (T > INT32_MAX) return pkv_err(PKV_ERR_INVALID, "decode prompt: %lld tokens", (long long)T);
    const size_t E = (size_t)ctx->m->hp.n_embd;
    int64_t n_rows = T - n;
    int32_t *tok = pkv_malloc((size_t)T * sizeof *tok), *span = pkv_malloc((size_t)T * sizeof *span);
    float *embd = n_rows ? pkv_malloc((size_t)n_rows * E * sizeof *embd) : NULL;
    pkv_kv_media *rec = pkv_malloc((size_t)(n_media ? n_media : 1) * sizeof *rec);
    pkv_status s = PKV_OK;
    if (!tok || !span || (n_rows && !embd) || !rec) s = pkv_err(PKV_ERR_NOMEM, "decode prompt: %lld tokens", (long long)T);
    const int64_t len0 = pkv_kv_seq_len(ctx->c, ctx->seq);
    bool nc = false;
    for (int64_t k = 0, t = 0, r = 0, i = 0; !s && k < T;) { /* text up to the next chunk, then the chunk */
        int32_t upto = i < n_media ? media[i].at : n;
        while (t < upto) {
            tok[k] = tokens[t++];
            span[k++] = 0;
        }
        if (i == n_media) break;
        const pkv_media_rows *m = &media[i];
        rec[i] = (pkv_kv_media){.key = m->key, .start = len0 + k, .n_rows = m->n_rows,
                                .flags = m->non_causal ? PKV_MEDIA_NON_CAUSAL : 0};
        nc |= m->non_causal;
        for (int32_t j = 0; j < m->n_rows; j++) {
            tok[k + j] = pkv_media_token(m->key, j);
            span[k + j] = m->non_causal ? (int32_t)(k + m->n_rows) : 0;
        }
        memcpy(embd + (size_t)r * E, m->embd, (size_t)m->n_rows * E * sizeof *embd);
        k += m->n_rows;
        r += m->n_rows;
        i++;
    }
    for (int64_t k = 0; !s && k < T; k++)
        if (!pkv_token_is_media(tok[k]) && (tok[k] < 0 || tok[k] >= ctx->m->hp.n_vocab))
            s = pkv_err(PKV_ERR_INVALID, "decode prompt: token id %d is outside the vocabulary [0, %d)", tok[k],
                        ctx->m->hp.n_vocab);
    if (!s) {
        media_in mi = {.embd = embd, .n_rows = n_rows, .span_end = nc ? span : NULL};
        const int32_t *tp = tok;
        int32_t nt = (int32_t)T;
        s = decode_h(&ctx, 1, &tp, &nt, NULL, NULL, NULL, NULL, &mi);
    }
    for (int i = 0; !s && i < n_media; i++)
        if ((s = pkv_kv_media_add(ctx->c, ctx->seq, &rec[i]))) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", pkv_errmsg());
            pkv_kv_truncate(ctx->c, ctx->seq, len0);
            ctx->has_logits = false;
            s = pkv_err(s, "%s", msg);
        }
    pkv_free(tok);
    pkv_free(span);
    pkv_free(embd);
    pkv_free(rec);
    return s;
}

pkv_status pkv_context_decode_media(pkv_context *ctx, const pkv_media_rows *m) {
    if (!m) return pkv_err(PKV_ERR_INVALID, "decode media: NULL chunk");
    pkv_media_rows one = *m;
    one.at = 0;
    return pkv_context_decode_prompt(ctx, NULL, 0, &one, 1);
}

pkv_status pkv_context_decode_mmproj(pkv_context *ctx, pkv_mmproj *p, const pkv_media *m, uint64_t *key, int32_t *n_rows) {
    if (!ctx || !p || !m) return pkv_err(PKV_ERR_INVALID, "decode mmproj: NULL argument");
    pkv_mmproj_info info;
    int64_t rows = 0;
    pkv_status s = pkv_mmproj_get_info(p, &info);
    if (!s && info.n_embd != ctx->m->hp.n_embd)
        return pkv_err(PKV_ERR_INVALID, "decode mmproj: the projector makes rows of %d, the model %s takes %d", info.n_embd,
                       ctx->m->label, (int)ctx->m->hp.n_embd);
    if (!s) s = pkv_mmproj_n_rows(p, m, &rows);
    if (s) return s;
    if (rows < 1 || rows > INT32_MAX) return pkv_err(PKV_ERR_INVALID, "decode mmproj: %lld rows", (long long)rows);
    float *embd = pkv_malloc((size_t)rows * (size_t)info.n_embd * sizeof *embd);
    if (!embd) return pkv_err(PKV_ERR_NOMEM, "decode mmproj: %lld rows", (long long)rows);
    s = pkv_mmproj_encode(p, m, embd, rows);
    pkv_media_rows r = {.key = pkv_media_key(pkv_media_hash(m), info.fingerprint), .n_rows = (int32_t)rows, .embd = embd,
                        .non_causal = info.non_causal};
    if (!s) s = pkv_context_decode_media(ctx, &r);
    pkv_free(embd);
    if (!s && key) *key = r.key;
    if (!s && n_rows) *n_rows = r.n_rows;
    return s;
}
