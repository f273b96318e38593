/* Loading a GGUF model: hyper-parameters, tokenizer, and every weight checked
 * against the shape the architecture expects, then uploaded to the device. */
#include "model/model-impl.h"

#include <stdio.h>
#include <string.h>

#include "base/quant.h"

pkv_model_params pkv_model_default_params(void) {
    pkv_model_params p;
    memset(&p, 0, sizeof p);
    p.device = NULL;
    p.n_threads = 0;
    return p;
}

typedef struct loader {
    const pkv_gguf *g;
    pkv_model *m;
    pkv_model_params p;
    uint64_t total_bytes, done_bytes;
    int type_count[PKV_TYPE_COUNT];
} loader;

static void progress(loader *L, uint64_t add) {
    L->done_bytes += add;
    if (L->p.progress && L->total_bytes) L->p.progress((double)L->done_bytes / (double)L->total_bytes, L->p.progress_user);
}

/* Upload tensor `name` as a weight of shape [ne1][ne0]. f32_only: norms and biases
 * are converted to f32 on the host (kernels take them as f32). */
static pkv_status load_weight(loader *L, const char *name, int64_t ne0, int64_t ne1, bool required, bool f32_only,
                              pkv_weight *w) {
    const char *lab = pkv_gguf_label(L->g);
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(L->g, name);
    memset(w, 0, sizeof *w);
    if (!t) return required ? pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' not found", lab, name) : PKV_OK;
    int64_t t1 = t->ne[1] * t->ne[2] * t->ne[3];
    bool shape_ok = t->ne[0] == ne0 && t1 == ne1 && (t->n_dims <= 2 || (t->ne[2] == 1 && t->ne[3] == 1));
    if (!shape_ok)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld] (ne0, ne1)", lab,
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                       (long long)ne0, (long long)ne1);
    pkv_device *dev = L->m->dev;
    pkv_type type = t->type;
    const void *src = t->data;
    size_t bytes = t->n_bytes;
    float *tmp = NULL;
    if (f32_only && type != PKV_TYPE_F32) {
        size_t n = (size_t)ne0 * (size_t)ne1;
        tmp = pkv_malloc(n * sizeof(float));
        if (!tmp) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, name);
        pkv_status s = pkv_dequantize_row(type, src, tmp, (int64_t)n);
        if (s) {
            pkv_free(tmp);
            return pkv_err_prefix(s, "%s: tensor '%s'", lab, name);
        }
        type = PKV_TYPE_F32;
        src = tmp;
        bytes = n * sizeof(float);
    } else if (!f32_only && !pkv_device_supports_weight(dev, type)) {
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which device %s does not support", lab, name,
                       pkv_type_name(type), pkv_device_name(dev));
    }
    pkv_buffer *b = pkv_buffer_alloc(dev, bytes);
    pkv_status s = b ? pkv_buffer_write(b, 0, src, bytes) : PKV_ERR_NOMEM;
    pkv_free(tmp);
    if (s) {
        pkv_buffer_free(b);
        return pkv_err_prefix(s, "%s: uploading tensor '%s' (%zu bytes) to %s", lab, name, bytes, pkv_device_name(dev));
    }
    w->buf = b;
    w->type = type;
    w->ne0 = ne0;
    w->ne1 = ne1;
    L->m->weight_bytes += bytes;
    if (!f32_only) L->type_count[type]++;
    progress(L, t->n_bytes);
    return PKV_OK;
}

static void free_weight(pkv_weight *w) {
    pkv_buffer_free(w->buf);
    w->buf = NULL;
}

/* Vocabulary from tokenizer.ggml.* keys. A model without one ("none", or no
 * keys at all) gets a "none" tokenizer of n_vocab tokens. */
static pkv_status load_tokenizer(const pkv_gguf *g, int n_vocab, pkv_tokenizer **out) {
    const char *lab = pkv_gguf_label(g);
    pkv_vocab_desc d = pkv_vocab_desc_default();
    char model[32] = "none", pre[64] = "default";
    const char *s;
    size_t n;
    if (pkv_gguf_find_key(g, "tokenizer.ggml.model") >= 0) {
        pkv_status st = pkv_gguf_get_str(g, "tokenizer.ggml.model", &s, &n);
        if (st) return st;
        snprintf(model, sizeof model, "%.*s", (int)PKV_MIN(n, sizeof model - 1), s);
    }
    if (pkv_gguf_find_key(g, "tokenizer.ggml.pre") >= 0 && !pkv_gguf_get_str(g, "tokenizer.ggml.pre", &s, &n))
        snprintf(pre, sizeof pre, "%.*s", (int)PKV_MIN(n, sizeof pre - 1), s);
    d.model = model;
    d.pre = pre;
    d.n_tokens = n_vocab;
    const char **toks = NULL, **merges = NULL;
    size_t *tok_lens = NULL, *merge_lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    pkv_status st = PKV_OK;
    if (strcmp(model, "none") != 0) {
        pkv_gguf_array a;
        if ((st = pkv_gguf_get_arr(g, "tokenizer.ggml.tokens", PKV_GGUF_STRING, &a))) return st;
        if (a.count != (uint64_t)n_vocab)
            return pkv_err(PKV_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries but token_embd.weight has %d rows", lab,
                           (unsigned long long)a.count, n_vocab);
        toks = pkv_calloc((size_t)n_vocab, sizeof *toks);
        tok_lens = pkv_calloc((size_t)n_vocab, sizeof *tok_lens);
        if (!toks || !tok_lens) st = pkv_err(PKV_ERR_NOMEM, "%s: vocabulary", lab);
        for (int i = 0; !st && i < n_vocab; i++) st = pkv_gguf_arr_str(g, &a, (uint64_t)i, &toks[i], &tok_lens[i]);
        d.tokens = toks;
        d.token_lens = tok_lens;
        if (!st && !pkv_gguf_get_arr(g, "tokenizer.ggml.scores", PKV_GGUF_TYPE_COUNT, &a) && a.count == (uint64_t)n_vocab) {
            scores = pkv_malloc((size_t)n_vocab * sizeof *scores);
            if (!scores) st = pkv_err(PKV_ERR_NOMEM, "%s: scores", lab);
            for (int i = 0; !st && i < n_vocab; i++) scores[i] = (float)pkv_gguf_arr_float(&a, (uint64_t)i);
            d.scores = scores;
        }
        if (!st && !pkv_gguf_get_arr(g, "tokenizer.ggml.token_type", PKV_GGUF_TYPE_COUNT, &a) && a.count == (uint64_t)n_vocab) {
            types = pkv_malloc((size_t)n_vocab * sizeof *types);
            if (!types) st = pkv_err(PKV_ERR_NOMEM, "%s: token types", lab);
            for (int i = 0; !st && i < n_vocab; i++) types[i] = (int32_t)pkv_gguf_arr_int(&a, (uint64_t)i);
            d.types = types;
        }
        if (!st && !pkv_gguf_get_arr(g, "tokenizer.ggml.merges", PKV_GGUF_STRING, &a) && a.count > 0) {
            if (a.count > (uint64_t)INT32_MAX) st = pkv_err(PKV_ERR_FORMAT, "%s: too many merges", lab);
            merges = st ? NULL : pkv_calloc((size_t)a.count, sizeof *merges);
            merge_lens = st ? NULL : pkv_calloc((size_t)a.count, sizeof *merge_lens);
            if (!st && (!merges || !merge_lens)) st = pkv_err(PKV_ERR_NOMEM, "%s: merges", lab);
            for (uint64_t i = 0; !st && i < a.count; i++) st = pkv_gguf_arr_str(g, &a, i, &merges[i], &merge_lens[i]);
            d.n_merges = (int32_t)a.count;
            d.merges = merges;
            d.merge_lens = merge_lens;
        }
        uint32_t v;
        bool b;
        if (!pkv_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v)) d.bos_id = (int32_t)v;
        if (!pkv_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v)) d.eos_id = (int32_t)v;
        if (!pkv_gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &v)) d.unk_id = (int32_t)v;
        if (!pkv_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &v)) d.pad_id = (int32_t)v;
        if (!pkv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) d.add_bos = b;
        if (!pkv_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b)) d.add_eos = b;
        if (!pkv_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) d.add_space_prefix = b;
    }
    if (!st) {
        *out = pkv_tokenizer_create(&d);
        if (!*out) st = pkv_err_prefix(PKV_ERR_FORMAT, "%s: tokenizer", lab);
    }
    pkv_free(toks);
    pkv_free(tok_lens);
    pkv_free(scores);
    pkv_free(types);
    pkv_free(merges);
    pkv_free(merge_lens);
    return st;
}

void pkv_model_free(pkv_model *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->hp.n_layer; l++) {
            pkv_weight *w = &m->layers[l].attn_norm;
            /* every pkv_weight field of the layer, in order */
            for (pkv_weight *e = w; e <= &m->layers[l].w_down; e++) free_weight(e);
        }
    pkv_free(m->layers);
    free_weight(&m->tok_embd);
    free_weight(&m->output_norm);
    if (!m->tied) free_weight(&m->output);
    pkv_tokenizer_free(m->tok);
    pkv_free(m->kv_layer);
    if (m->own_dev) pkv_device_close(m->dev);
    pkv_free(m);
}

static uint64_t fingerprint(const pkv_gguf *g, const pkv_hparams *hp) {
    uint64_t h = pkv_hash64(hp, sizeof *hp, 0x706b76);
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        h = pkv_hash64(t->name, strlen(t->name), h);
        h = pkv_hash64(t->ne, sizeof t->ne, h ^ (uint64_t)t->type);
        /* a sample of the data, so two random models of one shape differ */
        h = pkv_hash64(t->data, PKV_MIN(t->n_bytes, (size_t)64), h);
    }
    return h;
}

static pkv_status load_layers(loader *L) {
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    char name[96];
    pkv_status s = PKV_OK;
#define W(field, suffix, ne0, ne1, req, f32)                                                          \
    do {                                                                                              \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                          \
        if ((s = load_weight(L, name, (ne0), (ne1), (req), (f32), &ly->field))) return s;             \
    } while (0)
    for (int l = 0; l < hp->n_layer; l++) {
        pkv_layer *ly = &m->layers[l];
        int64_t E = hp->n_embd, qd = (int64_t)ly->n_head * hp->head_dim_k, kd = (int64_t)ly->n_head_kv * hp->head_dim_k,
                vd = (int64_t)ly->n_head_kv * hp->head_dim_v, od = (int64_t)ly->n_head * hp->head_dim_v;
        bool qwen2 = hp->arch == PKV_ARCH_QWEN2, qwen3 = hp->arch == PKV_ARCH_QWEN3;
        W(attn_norm, "attn_norm.weight", E, 1, true, true);
        W(wq, "attn_q.weight", E, qd, true, false);
        W(wk, "attn_k.weight", E, kd, true, false);
        W(wv, "attn_v.weight", E, vd, true, false);
        W(bq, "attn_q.bias", qd, 1, qwen2, true);
        W(bk, "attn_k.bias", kd, 1, qwen2, true);
        W(bv, "attn_v.bias", vd, 1, qwen2, true);
        W(q_norm, "attn_q_norm.weight", hp->head_dim_k, 1, qwen3, true);
        W(k_norm, "attn_k_norm.weight", hp->head_dim_k, 1, qwen3, true);
        W(wo, "attn_output.weight", od, E, true, false);
        W(ffn_norm, "ffn_norm.weight", E, 1, true, true);
        W(w_gate, "ffn_gate.weight", E, ly->n_ff, true, false);
        W(w_up, "ffn_up.weight", E, ly->n_ff, true, false);
        W(w_down, "ffn_down.weight", ly->n_ff, E, true, false);
    }
#undef W
    return s;
}

/* A draft that attends over another model's KV (multi-token-prediction style)
 * names, for each of its layers, the target layer whose cache it reads:
 *   pagekv.shared_kv_layers: array of int32, one per layer, each >= 0.
 * Such a model has no cache of its own; see pkv_context_attach. */
static pkv_status load_shared_kv(const pkv_gguf *g, pkv_model *m) {
    const char *key = "pagekv.shared_kv_layers";
    if (pkv_gguf_find_key(g, key) < 0) return PKV_OK;
    pkv_gguf_array a;
    pkv_status s = pkv_gguf_get_arr(g, key, PKV_GGUF_TYPE_COUNT, &a);
    if (s) return s;
    if (a.type == PKV_GGUF_STRING || a.type == PKV_GGUF_FLOAT32 || a.type == PKV_GGUF_FLOAT64 || a.count != (uint64_t)m->hp.n_layer)
        return pkv_err(PKV_ERR_FORMAT, "%s: key '%s' must be an integer array with one entry per layer (%d), found %llu of %s",
                       m->label, key, m->hp.n_layer, (unsigned long long)a.count, pkv_gguf_type_name(a.type));
    m->kv_layer = pkv_malloc((size_t)m->hp.n_layer * sizeof *m->kv_layer);
    if (!m->kv_layer) return pkv_err(PKV_ERR_NOMEM, "%s: %s", m->label, key);
    for (int l = 0; l < m->hp.n_layer; l++) {
        int64_t v = pkv_gguf_arr_int(&a, (uint64_t)l);
        if (v < 0 || v > 4096) return pkv_err(PKV_ERR_FORMAT, "%s: %s[%d] = %lld is not a layer index", m->label, key, l, (long long)v);
        m->kv_layer[l] = (int)v;
    }
    return PKV_OK;
}

/* Load from an opened GGUF. On failure everything is freed. */
static pkv_model *load(const pkv_gguf *g, pkv_model_params p) {
    double t0 = pkv_time_now();
    pkv_model *m = pkv_calloc(1, sizeof *m);
    if (!m) {
        pkv_err(PKV_ERR_NOMEM, "%s: out of memory", pkv_gguf_label(g));
        return NULL;
    }
    snprintf(m->label, sizeof m->label, "%s", pkv_gguf_label(g));
    int *n_head = NULL, *n_head_kv = NULL, *n_ff = NULL;
    pkv_status s = pkv_hparams_read(g, &m->hp, &n_head, &n_head_kv, &n_ff);
    if (s) goto fail;
    const pkv_gguf_tensor *te = pkv_gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: tensor 'token_embd.weight' not found", m->label);
        goto fail;
    }
    if (te->ne[1] < 1 || te->ne[1] > INT32_MAX) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: token_embd.weight has %lld rows", m->label, (long long)te->ne[1]);
        goto fail;
    }
    m->hp.n_vocab = (int)te->ne[1];
    {
        char k[96];
        snprintf(k, sizeof k, "%s.vocab_size", pkv_arch_name(m->hp.arch));
        uint32_t vs;
        if (pkv_gguf_find_key(g, k) >= 0 && !pkv_gguf_get_u32(g, k, &vs) && vs != (uint32_t)m->hp.n_vocab) {
            s = pkv_err(PKV_ERR_FORMAT, "%s: %s is %u but token_embd.weight has %d rows", m->label, k, vs, m->hp.n_vocab);
            goto fail;
        }
    }
    m->layers = pkv_calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) {
        s = pkv_err(PKV_ERR_NOMEM, "%s: out of memory", m->label);
        goto fail;
    }
    for (int l = 0; l < m->hp.n_layer; l++) {
        m->layers[l].n_head = n_head[l];
        m->layers[l].n_head_kv = n_head_kv[l];
        m->layers[l].n_ff = n_ff[l];
    }
    if ((s = load_tokenizer(g, m->hp.n_vocab, &m->tok))) goto fail;
    if ((s = load_shared_kv(g, m))) goto fail;

    if (p.device_handle) {
        m->dev = p.device_handle;
    } else {
        pkv_device_params dp = pkv_device_default_params();
        dp.n_threads = p.n_threads;
        m->dev = pkv_device_open(p.device ? p.device : "cpu", dp);
        if (!m->dev) {
            s = pkv_err_prefix(PKV_ERR_NOT_FOUND, "%s", m->label);
            goto fail;
        }
        m->own_dev = true;
    }
    if (!pkv_device_get_caps(m->dev)->has_kernels) {
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: device %s has no compute kernels", m->label, pkv_device_name(m->dev));
        goto fail;
    }
    loader L = {.g = g, .m = m, .p = p};
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) L.total_bytes += pkv_gguf_tensor_at(g, i)->n_bytes;
    if ((s = load_weight(&L, "token_embd.weight", m->hp.n_embd, m->hp.n_vocab, true, false, &m->tok_embd))) goto fail;
    if ((s = load_weight(&L, "output_norm.weight", m->hp.n_embd, 1, true, true, &m->output_norm))) goto fail;
    if ((s = load_weight(&L, "output.weight", m->hp.n_embd, m->hp.n_vocab, false, false, &m->output))) goto fail;
    if (!m->output.buf) { /* tied embeddings */
        m->output = m->tok_embd;
        m->tied = true;
    }
    if ((s = load_layers(&L))) goto fail;
    int best = 0;
    for (int t = 0; t < PKV_TYPE_COUNT; t++)
        if (L.type_count[t] > L.type_count[best]) best = t;
    m->main_type = (pkv_type)best;
    m->fingerprint = fingerprint(g, &m->hp);
    pkv_free(n_head);
    pkv_free(n_head_kv);
    pkv_free(n_ff);
    if ((s = pkv_device_sync(m->dev))) goto fail_nofree;
    m->load_seconds = pkv_time_now() - t0;
    return m;
fail:
    pkv_free(n_head);
    pkv_free(n_head_kv);
    pkv_free(n_ff);
fail_nofree:
    pkv_model_free(m);
    (void)s;
    return NULL;
}

pkv_model *pkv_model_load(const char *path, pkv_model_params p) {
    if (!path) {
        pkv_err(PKV_ERR_INVALID, "pkv_model_load: path is NULL");
        return NULL;
    }
    pkv_gguf *g = pkv_gguf_open(path);
    if (!g) return NULL;
    pkv_model *m = load(g, p);
    pkv_gguf_close(g); /* weights were copied to the device */
    return m;
}

pkv_model *pkv_model_load_memory(const void *data, size_t size, const char *label, pkv_model_params p) {
    pkv_gguf *g = pkv_gguf_open_memory(data, size, label);
    if (!g) return NULL;
    pkv_model *m = load(g, p);
    pkv_gguf_close(g);
    return m;
}

pkv_status pkv_model_get_info(const pkv_model *m, pkv_model_info *info) {
    if (!m || !info) return pkv_err(PKV_ERR_INVALID, "pkv_model_get_info: NULL argument");
    memset(info, 0, sizeof *info);
    info->arch = pkv_arch_name(m->hp.arch);
    info->n_layer = m->hp.n_layer;
    info->n_embd = m->hp.n_embd;
    info->n_head = m->layers[0].n_head;
    info->n_head_kv = m->layers[0].n_head_kv;
    info->head_dim = m->hp.head_dim_k;
    info->n_ff = m->layers[0].n_ff;
    info->n_vocab = m->hp.n_vocab;
    info->n_ctx_train = m->hp.n_ctx_train;
    info->weight_type = pkv_type_name(m->main_type);
    info->weight_bytes = m->weight_bytes;
    info->has_vocab = pkv_tokenizer_kind_of(m->tok) != PKV_TOKENIZER_NONE;
    info->load_seconds = m->load_seconds;
    info->shared_kv = m->kv_layer != NULL;
    return PKV_OK;
}

pkv_device *pkv_model_device(const pkv_model *m) { return m ? m->dev : NULL; }
