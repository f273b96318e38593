/* Loading a GGUF model: hyper-parameters, tokenizer, and every weight checked
 * against the shape the architecture expects, then uploaded to the device. */
#include "model/arch/arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"
#include "dist/dist.h"

/* pkv_arch_names_where's test: the architecture's files carry MTP heads. */
static bool has_mtp_head(const pkv_arch_ops *ops, unsigned arg) {
    (void)arg;
    return ops->mtp_head;
}

pkv_model_params pkv_model_default_params(void) {
    pkv_model_params p;
    memset(&p, 0, sizeof p);
    p.device = NULL;
    p.n_threads = 0;
    return p;
}

struct pkv_loader {
    const pkv_gguf *g;
    pkv_model *m;
    pkv_model_params p;
    uint64_t total_bytes, done_bytes;
    int type_count[PKV_TYPE_COUNT];
    bool in_place; /* the GGUF stays open with the model: use its memory where the device can */
    int64_t ne2;   /* > 0: load_weight takes a 3-D tensor of ne2 matrices as one of ne1 rows */
    bool remote;   /* loading a layer another rank holds: shapes are checked, nothing is uploaded */
};
typedef struct pkv_loader loader;

pkv_model *pkv_loader_model(pkv_loader *L) { return L->m; }
const pkv_gguf *pkv_loader_gguf(pkv_loader *L) { return L->g; }

static void progress(loader *L, uint64_t add) {
    L->done_bytes += add;
    if (L->p.progress && L->total_bytes) L->p.progress((double)L->done_bytes / (double)L->total_bytes, L->p.progress_user);
}

/* A part of a matrix: rows [r0, r0 + nr), columns [c0, c0 + nc); nr = 0 or nc = 0
 * mean all rows or all columns. rstride > 0: the nr rows are taken rblock at a
 * time, one block every rstride rows from r0 (interleaved heads: qwen35's Q and
 * its gate); cstride > 0 likewise takes the nc columns cblock at a time, one block
 * every cstride columns from c0. more: further rows (a slice of its own rows, no
 * columns of its own: the first slice's columns apply) that follow these in the
 * weight (a gated delta-net shard's q and k channels, then its v channels). */
typedef struct slice {
    int64_t r0, nr, c0, nc;
    int64_t rblock, rstride;
    int64_t cblock, cstride;
    const struct slice *more;
} slice;

static const slice k_all = {0};

#define SLICE_MAX_PIECES 4

/* The split proportions, "1,1" style. */
static void split_text(const pkv_model *m, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int d = 0; d < m->n_dev && k + 16 < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%g", d ? "," : "", (double)m->split[d]);
}

/* Row r of a piece of rows (strided or not), as a row of the whole tensor. */
static int64_t piece_row(const slice *p, int64_t r) {
    return p->rstride > 0 ? p->r0 + (r / p->rblock) * p->rstride + r % p->rblock : p->r0 + r;
}

/* Upload tensor `name`, whose shape must be [ne1][ne0], or the slice `sl` of it, to
 * dev. f32_only: norms and biases are converted to f32 on the host (kernels take
 * them as f32). Column slices of block types must start and end on a block (so
 * must each run of strided columns). */
static pkv_status load_weight(loader *L, const char *name, int64_t ne0, int64_t ne1, bool required, bool f32_only,
                              pkv_device *dev, slice sl, pkv_weight *w) {
    const char *lab = pkv_gguf_label(L->g);
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(L->g, name);
    memset(w, 0, sizeof *w);
    if (!t) return required ? pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' not found", lab, name) : PKV_OK;
    int64_t t1 = t->ne[1] * t->ne[2] * t->ne[3];
    bool shape_ok = t->ne[0] == ne0 && t1 == ne1 &&
                    (L->ne2 > 0 ? t->ne[2] == L->ne2 && t->ne[3] == 1 : t->n_dims <= 2 || (t->ne[2] == 1 && t->ne[3] == 1));
    if (!shape_ok)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld] (ne0, ne1)", lab,
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                       (long long)ne0, (long long)ne1);
    /* the pieces of rows, each checked; a strided piece whose blocks touch is contiguous */
    slice pc[SLICE_MAX_PIECES];
    int np = 0;
    int64_t nr = 0;
    for (const slice *p = &sl; p; p = p->more) {
        if (np == SLICE_MAX_PIECES || (np > 0 && (p->c0 || p->nc || p->cstride)))
            return pkv_err(PKV_ERR_INTERNAL, "%s: tensor '%s': bad slice pieces", lab, name);
        slice q = *p;
        if (q.nr == 0) q.nr = ne1 - q.r0;
        if (q.rstride > 0 && q.rblock == q.rstride) q.rstride = 0;
        const bool strided = q.rstride > 0;
        /* the last row read: strided blocks end (nr / rblock - 1) strides on */
        int64_t r_end = strided ? q.r0 + (q.nr / PKV_MAX(q.rblock, 1) - 1) * q.rstride + q.rblock : q.r0 + q.nr;
        if (q.r0 < 0 || r_end > ne1 || q.nr <= 0 || (strided && (q.rblock <= 0 || q.nr % q.rblock || q.rblock > q.rstride)))
            return pkv_err(PKV_ERR_INTERNAL, "%s: tensor '%s': slice out of range", lab, name);
        pc[np++] = q;
        nr += q.nr;
    }
    if (sl.nc == 0) sl.nc = ne0 - sl.c0;
    if (sl.cstride > 0 && sl.cblock == sl.cstride) sl.cstride = 0;
    const bool cstrided = sl.cstride > 0;
    int64_t c_end = cstrided ? sl.c0 + (sl.nc / PKV_MAX(sl.cblock, 1) - 1) * sl.cstride + sl.cblock : sl.c0 + sl.nc;
    if (sl.c0 < 0 || sl.nc <= 0 || c_end > ne0 ||
        (cstrided && (sl.cblock <= 0 || sl.nc % sl.cblock || sl.cblock > sl.cstride)))
        return pkv_err(PKV_ERR_INTERNAL, "%s: tensor '%s': slice out of range", lab, name);
    if (L->remote) { /* another rank's layer: its shape and type only */
        w->type = f32_only ? PKV_TYPE_F32 : t->type;
        w->ne0 = sl.nc;
        w->ne1 = nr;
        return PKV_OK;
    }
    pkv_type type = t->type;
    size_t blk = pkv_type_block_elems(type);
    const uint8_t *src = t->data;
    float *tmp = NULL;
    uint8_t *packed = NULL;
    if (f32_only && type != PKV_TYPE_F32) { /* whole tensor to f32 first; then slice as f32 */
        size_t n = (size_t)ne0 * (size_t)ne1;
        tmp = pkv_malloc(n * sizeof(float));
        if (!tmp) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, name);
        pkv_status s = pkv_dequantize_row(type, src, tmp, (int64_t)n);
        if (s) {
            pkv_free(tmp);
            return pkv_err_prefix(s, "%s: tensor '%s'", lab, name);
        }
        type = PKV_TYPE_F32;
        blk = 1;
        src = (const uint8_t *)tmp;
    } else if (!f32_only && !pkv_device_supports_weight(dev, type)) {
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which device %s does not support", lab, name,
                       pkv_type_name(type), pkv_device_name(dev));
    }
    const int64_t b = (int64_t)blk;
    if (cstrided && (sl.c0 % b || sl.cblock % b || sl.cstride % b)) {
        char sp[128];
        split_text(L->m, sp, sizeof sp);
        pkv_free(tmp);
        return pkv_err(PKV_ERR_INVALID,
                       "%s: tensor '%s' cannot be split over %d devices in proportions %s: device %s needs runs of %lld "
                       "columns every %lld from column %lld (its heads), which do not start and end on a %s block of %zu: "
                       "run the model on one device, or on devices and proportions that keep the runs whole blocks",
                       lab, name, L->m->n_dev, sp, pkv_device_name(dev), (long long)sl.cblock, (long long)sl.cstride,
                       (long long)sl.c0, pkv_type_name(type), blk);
    }
    if (sl.c0 % b || sl.nc % b) {
        pkv_free(tmp);
        return pkv_err(PKV_ERR_INVALID,
                       "%s: tensor '%s': the device split needs columns [%lld, %lld), which do not start and end on a %s "
                       "block of %zu: choose split proportions that keep each device's head range a multiple of %zu columns",
                       lab, name, (long long)sl.c0, (long long)(sl.c0 + sl.nc), pkv_type_name(type), blk, blk);
    }
    size_t row_full = pkv_type_row_bytes(type, (size_t)ne0), row = pkv_type_row_bytes(type, (size_t)sl.nc);
    size_t bytes = row * (size_t)nr;
    /* one run of whole rows of the file: used as is */
    bool rows_run = true;
    const int64_t first = piece_row(&pc[0], 0);
    for (int i = 0, k = 0; i < np && rows_run; i++)
        for (int64_t r = 0; r < pc[i].nr && rows_run; r++, k++) rows_run = piece_row(&pc[i], r) == first + k;
    const uint8_t *data = src + (size_t)first * row_full;
    if (!rows_run || sl.nc != ne0) { /* a column slice or scattered rows: gather each row's part */
        packed = pkv_malloc(bytes);
        if (!packed) {
            pkv_free(tmp);
            return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, name);
        }
        const int64_t cb = cstrided ? sl.cblock : sl.nc, n_cb = sl.nc / cb;
        const size_t run = pkv_type_row_bytes(type, (size_t)cb);
        uint8_t *out = packed;
        for (int i = 0; i < np; i++)
            for (int64_t r = 0; r < pc[i].nr; r++) {
                const uint8_t *in = src + (size_t)piece_row(&pc[i], r) * row_full;
                for (int64_t k = 0; k < n_cb; k++, out += run)
                    memcpy(out, in + pkv_type_row_bytes(type, (size_t)(sl.c0 + k * (cstrided ? sl.cstride : cb))), run);
            }
        data = packed;
    }
    pkv_buffer *buf = NULL;
    pkv_status s = PKV_OK;
    /* Zero-copy: a device that reads host memory (the CPU) uses the mapped file's
     * bytes in place, when nothing had to be converted or gathered. */
    if (L->in_place && !tmp && !packed && (uintptr_t)data % 16 == 0) {
        buf = pkv_buffer_wrap_host(dev, data, bytes);
        if (buf) L->m->mapped_bytes += bytes;
    }
    if (!buf) {
        buf = pkv_buffer_alloc(dev, bytes);
        s = buf ? pkv_buffer_write(buf, 0, data, bytes) : PKV_ERR_NOMEM;
    }
    pkv_free(tmp);
    pkv_free(packed);
    if (s) {
        pkv_buffer_free(buf);
        return pkv_err_prefix(s, "%s: uploading tensor '%s' (%zu bytes) to %s", lab, name, bytes, pkv_device_name(dev));
    }
    w->buf = buf;
    w->type = type;
    w->ne0 = sl.nc;
    w->ne1 = nr;
    L->m->weight_bytes += bytes;
    if (!f32_only) L->type_count[type]++;
    progress(L, bytes);
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
        /* llama.cpp's other special-token keys (fim pre/suf/mid also under their older
         * names prefix/suffix/middle) */
        const struct { const char *key; int32_t *id; } more[] = {
            {"tokenizer.ggml.eot_token_id", &d.eot_id},         {"tokenizer.ggml.eom_token_id", &d.eom_id},
            {"tokenizer.ggml.fim_pre_token_id", &d.fim_pre_id}, {"tokenizer.ggml.fim_suf_token_id", &d.fim_suf_id},
            {"tokenizer.ggml.fim_mid_token_id", &d.fim_mid_id}, {"tokenizer.ggml.fim_pad_token_id", &d.fim_pad_id},
            {"tokenizer.ggml.fim_rep_token_id", &d.fim_rep_id}, {"tokenizer.ggml.fim_sep_token_id", &d.fim_sep_id},
            /* read last, as llama.cpp does: they win when both names are present */
            {"tokenizer.ggml.prefix_token_id", &d.fim_pre_id},  {"tokenizer.ggml.suffix_token_id", &d.fim_suf_id},
            {"tokenizer.ggml.middle_token_id", &d.fim_mid_id},
        };
        for (size_t k = 0; k < PKV_ARRAY_LEN(more); k++)
            if (!pkv_gguf_get_u32(g, more[k].key, &v)) *more[k].id = (int32_t)v;
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
    while (m->loras) pkv_lora_free(m->loras);
    if (m->layers)
        for (int l = 0; l < m->hp.n_layer; l++) {
            pkv_layer *ly = &m->layers[l];
            free_weight(&ly->attn_norm);
            free_weight(&ly->ffn_norm);
            free_weight(&ly->moe.router);
            free_weight(&ly->moe.router_b);
            for (int d = 0; d < PKV_MAX_DEVICES; d++) {
                struct pkv_moe_part *p = &ly->moe.ep[d];
                free_weight(&p->gate), free_weight(&p->up), free_weight(&p->down);
                free_weight(&p->gate_b), free_weight(&p->up_b), free_weight(&p->down_b);
            }
            free_weight(&ly->post_attn_norm);
            free_weight(&ly->post_ffn_norm);
            free_weight(&ly->ple.gate);
            free_weight(&ly->ple.proj);
            free_weight(&ly->ple.post_norm);
            free_weight(&ly->out_scale);
            free_weight(&ly->moe.router_in);
            free_weight(&ly->moe.pre_norm);
            free_weight(&ly->moe.dense_post_norm);
            free_weight(&ly->moe.post_norm);
            pkv_free(ly->moe.exp_scale);
            free_weight(&ly->moe.probs_b);
            free_weight(&ly->moe.sh_gate);
            free_weight(&ly->moe.sh_up);
            free_weight(&ly->moe.sh_down);
            free_weight(&ly->moe.sh_gate_inp);
            for (int d = 0; ly->sh && d < m->n_dev; d++)
                /* every pkv_weight field of the shard, in order */
                for (pkv_weight *e = &ly->sh[d].wq; e <= &ly->sh[d].sc.out; e++) free_weight(e);
            pkv_free(ly->sh);
        }
    pkv_free(m->layers);
    free_weight(&m->tok_embd);
    free_weight(&m->output_norm);
    pkv_free(m->cls_out);
    pkv_free(m->cls_out_b);
    free_weight(&m->asst.pre_e);
    free_weight(&m->asst.pre_h);
    free_weight(&m->asst.post);
    free_weight(&m->nextn.eh_e);
    free_weight(&m->nextn.eh_h);
    free_weight(&m->nextn.enorm);
    free_weight(&m->nextn.hnorm);
    free_weight(&m->ple.model_proj);
    free_weight(&m->ple.proj_norm);
    free_weight(&m->ple.half);
    free_weight(&m->res_scale);
    pkv_free(m->longrope.host);
    for (int d = 0; d < PKV_MAX_DEVICES; d++) free_weight(&m->longrope.dev[d]);
    pkv_free(m->ple.tok_own);
    if (!m->tied) free_weight(&m->output);
    pkv_tokenizer_free(m->tok);
    pkv_free(m->kv_layer);
    for (int d = 0; d < m->n_dev; d++)
        if (m->own_dev[d]) pkv_device_close(m->devs[d]);
    if (m->own_host) pkv_device_close(m->host);
    pkv_gguf_close(m->gguf); /* after every weight buffer that wraps its memory */
    pkv_free(m);
}

/* The model fingerprint keys everything that reuses KV across requests and
 * processes (prefix index, disk tier, saved sequences), so it covers every byte
 * that changes the KV: hparams, each tensor's name, shape and type, and all of
 * its data. The data is hashed in 4 MiB chunks on up to n_threads threads
 * (pkv_hash64_bulk: a few GB/s per thread, see docs/engine.md), the chunk
 * hashes folded in order; the result does not depend on the thread count. */
enum { FP_CHUNK = 4 << 20 };

typedef struct fp_job {
    const pkv_gguf *g;
    const int64_t *first; /* [n_tensors + 1]: index of each tensor's first chunk */
    uint64_t *h;          /* [n_chunks] */
    int64_t n_chunks;
} fp_job;

static void fp_task(int i, int n_tasks, void *arg) {
    fp_job *j = arg;
    int64_t t = 0;
    for (int64_t c = i; c < j->n_chunks; c += n_tasks) {
        while (j->first[t + 1] <= c) t++;
        const pkv_gguf_tensor *tt = pkv_gguf_tensor_at(j->g, t);
        size_t off = (size_t)(c - j->first[t]) * FP_CHUNK;
        j->h[c] = pkv_hash64_bulk((const char *)tt->data + off, PKV_MIN(tt->n_bytes - off, (size_t)FP_CHUNK), (uint64_t)c);
    }
}

static pkv_status fingerprint(pkv_model *m, const pkv_gguf *g, int n_threads) {
    double t0 = pkv_time_now();
    const int64_t nt = pkv_gguf_n_tensors(g);
    uint64_t h = pkv_hash64(&m->hp, sizeof m->hp, 0x706b76);
    int64_t *first = pkv_malloc((size_t)(nt + 1) * sizeof *first);
    if (!first) return pkv_err(PKV_ERR_NOMEM, "%s: out of memory (fingerprint)", m->label);
    size_t total = 0;
    first[0] = 0;
    for (int64_t i = 0; i < nt; i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        h = pkv_hash64(t->name, strlen(t->name), h);
        h = pkv_hash64(t->ne, sizeof t->ne, h ^ (uint64_t)t->type);
        h = pkv_hash64(&t->n_bytes, sizeof t->n_bytes, h);
        first[i + 1] = first[i] + (int64_t)((t->n_bytes + FP_CHUNK - 1) / FP_CHUNK);
        total += t->n_bytes;
    }
    fp_job j = {.g = g, .first = first, .n_chunks = first[nt]};
    j.h = pkv_malloc((size_t)(j.n_chunks ? j.n_chunks : 1) * sizeof *j.h);
    if (!j.h) {
        pkv_free(first);
        return pkv_err(PKV_ERR_NOMEM, "%s: out of memory (fingerprint)", m->label);
    }
    int threads = n_threads > 0 ? n_threads : pkv_cpu_count();
    threads = (int)PKV_MIN((int64_t)PKV_MIN(threads, 16), PKV_MAX(j.n_chunks / 4, (int64_t)1));
    pkv_pool *pool = threads > 1 ? pkv_pool_create(threads) : NULL; /* NULL (also when that fails): inline */
    const int used = pool ? pkv_pool_threads(pool) : 1;
    pkv_pool_run(pool, used, fp_task, &j);
    pkv_pool_free(pool);
    h = pkv_hash64(j.h, (size_t)j.n_chunks * sizeof *j.h, h);
    m->fingerprint = h ? h : 1; /* 0 means "no fingerprint" to the cache */
    m->fingerprint_base = m->fingerprint;
    pkv_free(j.h);
    pkv_free(first);
    PKV_INFO("%s: fingerprint %016llx over %.1f MiB of weights in %.3f s (%d threads)", m->label,
             (unsigned long long)m->fingerprint, (double)total / (1 << 20), pkv_time_now() - t0, used);
    return PKV_OK;
}

/* Boundary k of n items split in proportions split[0..S): the first item of
 * shard k, rounded to a multiple of `unit`. */
static int64_t boundary(const float *split, int S, int k, int64_t n, int64_t unit) {
    if (k == S) return n;
    double tot = 0, cum = 0;
    for (int d = 0; d < S; d++) tot += split[d];
    for (int d = 0; d < k; d++) cum += split[d];
    int64_t units = n / unit;
    return (int64_t)((double)units * cum / tot + 0.5) * unit;
}


/* Head and FFN ranges of each device for one layer (whole KV-head groups; a
 * recurrent layer: whole key-head groups with their value heads, pkv_shard_w). */
static pkv_status plan_layer(pkv_model *m, int l, int64_t ffn_block) {
    pkv_layer *ly = &m->layers[l];
    const pkv_hparams *hp = &m->hp;
    const bool rec = l < 64 && (hp->recurrent >> l & 1);
    /* a recurrent layer goes by its state's shard unit (the cache's "heads"): a
     * delta-net's key heads, each with its Hv / Hk value heads (as n_q); other states
     * (lfm2's channel blocks) one unit each */
    pkv_kv_layer_desc sd;
    memset(&sd, 0, sizeof sd);
    if (rec) pkv_model_state_desc(m, l, &sd);
    const int n_groups = rec ? sd.n_kv_heads : ly->n_head_kv;
    int S = m->n_dev, group = !rec ? ly->n_head / ly->n_head_kv
                              : hp->ssm.n_k_heads ? hp->ssm.n_v_heads / hp->ssm.n_k_heads : 1;
    char sp[128];
    /* More devices than KV heads (Gemma 3 with one KV head over two devices): each
     * KV head is replicated on the devices that share it, and those devices split
     * its group of query heads (vLLM's scheme). The cache holds one shard per
     * device, replicas with the same head range, each written by its own device. */
    const bool replicate = !rec && S > n_groups;
    ly->rec_first = rec && S > n_groups && pkv_arch_ops_of(hp->arch)->rec_first;
    for (int d = 0; d < S; d++) {
        pkv_shard_w *w = &ly->sh[d];
        w->dev = d;
        if (replicate) {
            int g = (int)((int64_t)d * n_groups / S), a = 0, b = S; /* devices [a, b) share KV head g */
            while ((int64_t)a * n_groups / S < g) a++;
            while ((int64_t)(b - 1) * n_groups / S > g) b--;
            w->kv_h0 = g;
            w->n_kv = 1;
            w->q_h0 = g * group + (int)boundary(m->split + a, b - a, d - a, group, 1);
            w->n_q = g * group + (int)boundary(m->split + a, b - a, d - a + 1, group, 1) - w->q_h0;
        } else if (ly->rec_first) { /* every shard names all groups; shard 0 runs them */
            w->kv_h0 = w->q_h0 = 0;
            w->n_kv = n_groups;
            w->n_q = n_groups * group;
        } else {
            w->kv_h0 = (int)boundary(m->split, S, d, n_groups, 1);
            w->n_kv = (int)boundary(m->split, S, d + 1, n_groups, 1) - w->kv_h0;
            w->q_h0 = w->kv_h0 * group;
            w->n_q = w->n_kv * group;
        }
        w->ff0 = (int)boundary(m->split, S, d, ly->n_ff, ffn_block);
        w->n_ff = (int)boundary(m->split, S, d + 1, ly->n_ff, ffn_block) - w->ff0;
    }
    for (int d = 0; d < S && replicate; d++)
        if (ly->sh[d].n_q <= 0) {
            split_text(m, sp, sizeof sp);
            return pkv_err(PKV_ERR_INVALID,
                           "%s: layer %d has %d KV heads of %d query heads each; over %d devices in proportions %s each KV "
                           "head is replicated and its query heads split, but device %s would get no query head of KV "
                           "head %d: use at most %d devices or other proportions",
                           m->label, l, n_groups, group, S, sp, pkv_device_name(m->devs[d]), ly->sh[d].kv_h0,
                           n_groups * group);
        }
    for (int d = 0; d < S; d++)
        if (ly->sh[d].n_kv <= 0) {
            split_text(m, sp, sizeof sp);
            if (rec) /* the delta-net's state_desc is the default; Mamba-2 has its own */
                return pkv_err(PKV_ERR_INVALID,
                               "%s: layer %d (%s) has %d %s, which cannot be split over %d devices in proportions %s with "
                               "whole groups (device %s would get none): use at most %d devices or other proportions",
                               m->label, l,
                               hp->shortconv.l_cache ? "short-conv" : pkv_arch_ops_of(hp->arch)->state_desc ? "Mamba-2"
                                                                                                           : "gated delta-net",
                               n_groups,
                               hp->shortconv.l_cache ? "channel blocks" : pkv_arch_ops_of(hp->arch)->state_desc ? "SSM groups"
                                                                                                              : "key heads",
                               S, sp, pkv_device_name(m->devs[d]), n_groups);
            return pkv_err(PKV_ERR_INVALID,
                           "%s: layer %d has %d KV heads, which cannot be split over %d devices in proportions %s with whole "
                           "KV-head groups (device %s would get none): use fewer devices or other proportions",
                           m->label, l, ly->n_head_kv, S, sp, pkv_device_name(m->devs[d]));
        }
    for (int d = 0; d < S && ly->n_ff > 0; d++) /* (a layer of no FFN: nemotron_h's attention and Mamba-2) */
        if (ly->sh[d].n_ff <= 0) {
            split_text(m, sp, sizeof sp);
            return pkv_err(PKV_ERR_INVALID,
                           "%s: layer %d: FFN of %d rows cannot be split over %d devices in proportions %s in blocks of %lld "
                           "(device %s would get none)",
                           m->label, l, ly->n_ff, S, sp, (long long)ffn_block, pkv_device_name(m->devs[d]));
        }
    return PKV_OK;
}

/* The experts of a MoE layer: 3-D tensors of n_expert matrices of [rows][cols],
 * read as one matrix of n_expert * rows rows: the rows of slice sl onto dev. */
static pkv_status load_experts_at(loader *L, const char *name, int64_t cols, int64_t rows, slice sl, pkv_device *dev,
                                  pkv_weight *w) {
    L->ne2 = L->m->hp.moe.n_expert;
    pkv_status s = load_weight(L, name, cols, rows * L->m->hp.moe.n_expert, true, false, dev, sl, w);
    L->ne2 = 0;
    if (s == PKV_ERR_FORMAT && !pkv_gguf_find_tensor(L->g, name)) return s;
    if (s == PKV_ERR_FORMAT) /* name the shape a MoE tensor must have */
        return pkv_err(s, "%s: tensor '%s' must have shape [%lld, %lld, %d] (ne0, ne1, experts)", pkv_gguf_label(L->g), name,
                       (long long)cols, (long long)rows, L->m->hp.moe.n_expert);
    return s;
}


#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", il + L->m->hp.layer_base, suffix), name)

pkv_status pkv_load_norm(pkv_loader *L, int il, const char *suffix, pkv_weight *w) {
    char name[96];
    return load_weight(L, NAME(suffix), L->m->hp.n_embd, 1, true, true, L->m->dev, k_all, w);
}

pkv_status pkv_load_attention(pkv_loader *L, int il, const pkv_attn_tensors *t) {
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    char name[96];
    pkv_status s;
    const int64_t E = hp->n_embd, hk = ly->head_dim_k, hv = ly->head_dim_v;
    const int64_t qd = (int64_t)ly->n_head * hk, kd = (int64_t)ly->n_head_kv * hk, vd = (int64_t)ly->n_head_kv * hv,
                  od = (int64_t)ly->n_head * hv;
    const bool fused = t->fused_qkv && pkv_gguf_find_tensor(L->g, NAME("attn_qkv.weight"));
    ly->fused_qkv = fused;
    /* a layer that reuses another's KV computes only its queries: K and V tensors
     * the file may still have are not read */
    const bool kv = !ly->kv_reuse;
    /* no attn_v where allowed: V is K's projection (before K's norm and RoPE) */
    const bool v_is_k = kv && !fused && t->v_optional && !pkv_gguf_find_tensor(L->g, NAME("attn_v.weight"));
    if (v_is_k && hk != hv)
        return pkv_err(PKV_ERR_FORMAT, "%s: layer %d has no attn_v.weight (V = K) but key and value head sizes %lld and %lld "
                       "differ", m->label, il, (long long)hk, (long long)hv);
    /* q_gate: attn_q holds, per head, its q rows then its gate rows */
    const int64_t qrows = t->q_gate ? 2 * qd : qd;
    for (int d = 0; d < m->n_dev; d++) {
        pkv_shard_w *w = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        slice q_rows = {.r0 = w->q_h0 * hk, .nr = w->n_q * hk}, k_rows = {.r0 = w->kv_h0 * hk, .nr = w->n_kv * hk},
              v_rows = {.r0 = w->kv_h0 * hv, .nr = w->n_kv * hv}, o_cols = {.c0 = w->q_h0 * hv, .nc = w->n_q * hv};
        /* biases are vectors [1][n]: a slice of columns */
        slice qb = {.c0 = q_rows.r0, .nc = q_rows.nr}, kb = {.c0 = k_rows.r0, .nc = k_rows.nr},
              vb = {.c0 = v_rows.r0, .nc = v_rows.nr};
        if (fused) { /* one matrix of qd + kd + vd rows: Q, then K, then V; each shard takes its rows */
            slice fk = k_rows, fv = v_rows;
            fk.r0 += qd;
            fv.r0 += qd + kd;
            if ((s = load_weight(L, NAME("attn_qkv.weight"), E, qd + kd + vd, true, false, dev, q_rows, &w->wq)) ||
                (kv && (s = load_weight(L, NAME("attn_qkv.weight"), E, qd + kd + vd, true, false, dev, fk, &w->wk))) ||
                (kv && (s = load_weight(L, NAME("attn_qkv.weight"), E, qd + kd + vd, true, false, dev, fv, &w->wv))))
                return s;
        } else if (t->q_gate) {
            slice qs = {.r0 = w->q_h0 * 2 * hk, .nr = w->n_q * hk, .rblock = hk, .rstride = 2 * hk}, gs = qs;
            gs.r0 += hk;
            if ((s = load_weight(L, NAME("attn_q.weight"), E, qrows, true, false, dev, qs, &w->wq)) ||
                (s = load_weight(L, NAME("attn_q.weight"), E, qrows, true, false, dev, gs, &w->wq_gate)) ||
                (s = load_weight(L, NAME("attn_k.weight"), E, kd, true, false, dev, k_rows, &w->wk)) ||
                (s = load_weight(L, NAME("attn_v.weight"), E, vd, true, false, dev, v_rows, &w->wv)))
                return s;
        } else if ((s = load_weight(L, NAME("attn_q.weight"), E, qd, true, false, dev, q_rows, &w->wq)) ||
                   (kv && (s = load_weight(L, NAME("attn_k.weight"), E, kd, true, false, dev, k_rows, &w->wk))) ||
                   (kv && !v_is_k && (s = load_weight(L, NAME("attn_v.weight"), E, vd, true, false, dev, v_rows, &w->wv)))) {
            return s;
        }
        if ((s = load_weight(L, NAME("attn_q.bias"), qd, 1, t->qkv_bias, true, dev, qb, &w->bq)) ||
            (kv && (s = load_weight(L, NAME("attn_k.bias"), kd, 1, t->qkv_bias, true, dev, kb, &w->bk))) ||
            (kv && (s = load_weight(L, NAME("attn_v.bias"), vd, 1, t->qkv_bias, true, dev, vb, &w->bv))) ||
            (t->qk_norm && (s = load_weight(L, NAME("attn_q_norm.weight"), hk, 1, true, true, dev, k_all, &w->q_norm))) ||
            (t->qk_norm && kv && (s = load_weight(L, NAME("attn_k_norm.weight"), hk, 1, true, true, dev, k_all, &w->k_norm))) ||
            (t->v_norm && kv && (s = pkv_weight_fill(m, dev, hv, 1.0f, &w->v_norm))) ||
            (t->qk_unit && (s = pkv_weight_fill(m, dev, hk, 1.0f, &w->q_norm))) ||
            (t->qk_unit && kv && (s = pkv_weight_fill(m, dev, hk, 1.0f, &w->k_norm))) ||
            (s = load_weight(L, NAME("attn_output.weight"), od, E, true, false, dev, o_cols, &w->wo)))
            return s;
        /* the output's bias is added once (by the first shard); a sink per query head
         * lives where the shard's attention runs (the host with the KV there) */
        slice sinks = {.c0 = w->q_h0, .nc = w->n_q};
        if ((t->out_bias && d == 0 && (s = load_weight(L, NAME("attn_output.bias"), E, 1, true, true, dev, k_all, &w->bo))) ||
            (t->sinks && (s = load_weight(L, NAME("attn_sinks.weight"), ly->n_head, 1, true, true, m->kv_on_host ? m->host : dev,
                                          sinks, &w->sinks))))
            return s;
    }
    return PKV_OK;
}

/* Rows of a 3-D tensor [n][rows][cols] (attn_k_b, attn_v_b: one matrix per head),
 * loaded as one matrix of n * rows rows, or the slice sl of those. */
static pkv_status load_per_head(loader *L, const char *name, int64_t cols, int64_t rows, int64_t n, pkv_device *dev,
                                slice sl, pkv_weight *w) {
    L->ne2 = n;
    pkv_status s = load_weight(L, name, cols, rows * n, true, false, dev, sl, w);
    L->ne2 = 0;
    if (s == PKV_ERR_FORMAT && pkv_gguf_find_tensor(L->g, name))
        return pkv_err(s, "%s: tensor '%s' must have shape [%lld, %lld, %lld] (ne0, ne1, heads)", pkv_gguf_label(L->g), name,
                       (long long)cols, (long long)rows, (long long)n);
    return s;
}

/* An older file's attn_kv_b [heads][N + V][R] (each head's nope rows, then its value
 * rows) as shard w's k_b and v_b: v_b its heads' value rows as they are, k_b each
 * head's nope rows transposed to [R][N] (f32, made on the host), as llama.cpp's
 * converter splits it now. */
static pkv_status load_kv_b(loader *L, int il, pkv_shard_w *w, pkv_device *dev) {
    const pkv_hparams *hp = &L->m->hp;
    const int64_t H = L->m->layers[il].n_head, R = hp->mla.kv_lora, N = hp->mla.dk - L->m->layers[il].n_rot,
                  V = hp->mla.dv;
    char name[96];
    slice vs = {.r0 = w->q_h0 * (N + V) + N, .nr = w->n_q * V, .rblock = V, .rstride = N + V};
    pkv_status s = load_weight(L, NAME("attn_kv_b.weight"), R, H * (N + V), true, false, dev, vs, &w->mla.v_b);
    float *kv = NULL, *kb = s ? NULL : pkv_malloc((size_t)(w->n_q * R * N) * sizeof *kb);
    if (!s && !kb) s = pkv_err(PKV_ERR_NOMEM, "%s: splitting '%s'", L->m->label, name);
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(L->g, name); /* its shape checked by load_weight */
    if (!s && !(kv = pkv_malloc((size_t)(H * (N + V) * R) * sizeof *kv)))
        s = pkv_err(PKV_ERR_NOMEM, "%s: splitting '%s'", L->m->label, name);
    if (!s && (s = pkv_dequantize_row(t->type, t->data, kv, H * (N + V) * R)))
        s = pkv_err_prefix(s, "%s: tensor '%s'", L->m->label, name);
    for (int64_t h = 0; !s && h < w->n_q; h++) /* kb[h][r][n] = kv_b[q_h0 + h][n][r] */
        for (int64_t r = 0; r < R; r++)
            for (int64_t n = 0; n < N; n++) kb[(h * R + r) * N + n] = kv[((w->q_h0 + h) * (N + V) + n) * R + r];
    if (!s) s = pkv_weight_host(L->m, dev, kb, w->n_q * R * N, &w->mla.k_b);
    if (!s) {
        w->mla.k_b.ne0 = N;
        w->mla.k_b.ne1 = w->n_q * R;
    }
    pkv_free(kv);
    pkv_free(kb);
    return s;
}

pkv_status pkv_load_mla(pkv_loader *L, int il) {
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    char name[96];
    pkv_status s;
    const int64_t E = hp->n_embd, H = ly->n_head, R = hp->mla.kv_lora, D = hp->mla.dk, V = hp->mla.dv, P = ly->n_rot,
                  N = D - P, Lq = hp->mla.q_lora;
    if (hp->mla.q_lora > 0 && pkv_gguf_find_tensor(L->g, NAME("attn_q.weight")))
        return pkv_err(PKV_ERR_FORMAT, "%s: layer %d has attn_q.weight (the lite layout) but q_lora_rank is %d (attn_q_a/_b)",
                       m->label, il, hp->mla.q_lora);
    if (hp->mla.kv_b != !pkv_gguf_find_tensor(L->g, NAME("attn_k_b.weight")))
        return pkv_err(PKV_ERR_FORMAT, "%s: layer %d: %s", m->label, il,
                       hp->mla.kv_b ? "attn_k_b.weight in a file without key_length_mla (the older layout has attn_kv_b)"
                                    : "no attn_k_b.weight (a file with key_length_mla has attn_k_b and attn_v_b)");
    ly->latent = (int)R;
    for (int d = 0; d < m->n_dev; d++) {
        pkv_shard_w *w = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        /* per head: N nope rows, then P rope rows of Q */
        slice qn = {.r0 = w->q_h0 * D, .nr = w->n_q * N, .rblock = N, .rstride = D}, qp = qn;
        qp.r0 += N;
        qp.nr = w->n_q * P;
        qp.rblock = P;
        slice lat = {.r0 = 0, .nr = R}, pe = {.r0 = R, .nr = P}, heads_k = {.r0 = w->q_h0 * R, .nr = w->n_q * R},
              heads_v = {.r0 = w->q_h0 * V, .nr = w->n_q * V}, o_cols = {.c0 = w->q_h0 * V, .nc = w->n_q * V};
        const char *qname = Lq > 0 ? "attn_q_b.weight" : "attn_q.weight";
        const int64_t qin = Lq > 0 ? Lq : E;
        if ((Lq > 0 && ((s = load_weight(L, NAME("attn_q_a.weight"), E, Lq, true, false, dev, k_all, &w->mla.q_a)) ||
                        (s = load_weight(L, NAME("attn_q_a_norm.weight"), Lq, 1, true, true, dev, k_all, &w->mla.q_a_norm)))) ||
            (s = load_weight(L, NAME(qname), qin, H * D, true, false, dev, qn, &w->mla.q_nope)) ||
            (s = load_weight(L, NAME(qname), qin, H * D, true, false, dev, qp, &w->mla.q_pe)) ||
            (s = load_weight(L, NAME("attn_kv_a_mqa.weight"), E, R + P, true, false, dev, lat, &w->mla.kv_lat)) ||
            (s = load_weight(L, NAME("attn_kv_a_mqa.weight"), E, R + P, true, false, dev, pe, &w->mla.kv_pe)) ||
            (s = load_weight(L, NAME("attn_kv_a_norm.weight"), R, 1, true, true, dev, k_all, &w->mla.kv_norm)) ||
            (!hp->mla.kv_b && (s = load_per_head(L, NAME("attn_k_b.weight"), N, R, H, dev, heads_k, &w->mla.k_b))) ||
            (!hp->mla.kv_b && (s = load_per_head(L, NAME("attn_v_b.weight"), R, V, H, dev, heads_v, &w->mla.v_b))) ||
            (hp->mla.kv_b && (s = load_kv_b(L, il, w, dev))) ||
            (s = load_weight(L, NAME("attn_output.weight"), H * V, E, true, false, dev, o_cols, &w->wo)))
            return s;
    }
    return PKV_OK;
}

pkv_status pkv_load_delta_net(pkv_loader *L, int il) {
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    char name[96];
    pkv_status s;
    const int64_t E = hp->n_embd, Hk = hp->ssm.n_k_heads, Hv = hp->ssm.n_v_heads, dk = hp->ssm.d_k, dv = hp->ssm.d_v;
    const int64_t C = 2 * Hk * dk + Hv * dv, R = Hv / Hk;
    for (int d = 0; d < m->n_dev; d++) {
        pkv_shard_w *w = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        const int64_t g0 = w->kv_h0, ng = w->n_kv;
        /* its conv channels: q of its key heads, k of them (Hk dk further), then v of
         * its value heads (r-major: ng dv of every Hk dv) */
        slice v_ch = {.r0 = 2 * Hk * dk + g0 * dv, .nr = R * ng * dv, .rblock = ng * dv, .rstride = Hk * dv};
        slice ch = {.r0 = g0 * dk, .nr = 2 * ng * dk, .rblock = ng * dk, .rstride = Hk * dk, .more = &v_ch};
        /* per value head: rows of dv (the gate), rows of 1 (beta, alpha), entries of
         * vectors (dt, a), columns of dv (the output) */
        slice z_rows = {.r0 = g0 * dv, .nr = R * ng * dv, .rblock = ng * dv, .rstride = Hk * dv};
        slice h_rows = {.r0 = g0, .nr = R * ng, .rblock = ng, .rstride = Hk};
        slice h_cols = {.c0 = g0, .nc = R * ng, .cblock = ng, .cstride = Hk};
        slice o_cols = {.c0 = g0 * dv, .nc = R * ng * dv, .cblock = ng * dv, .cstride = Hk * dv};
        if ((s = load_weight(L, NAME("attn_qkv.weight"), E, C, true, false, dev, ch, &w->ssm.qkv)) ||
            (s = load_weight(L, NAME("attn_gate.weight"), E, Hv * dv, true, false, dev, z_rows, &w->ssm.z)) ||
            (s = load_weight(L, NAME("ssm_beta.weight"), E, Hv, true, false, dev, h_rows, &w->ssm.beta)) ||
            (s = load_weight(L, NAME("ssm_alpha.weight"), E, Hv, true, false, dev, h_rows, &w->ssm.alpha)) ||
            (s = load_weight(L, NAME("ssm_conv1d.weight"), hp->ssm.d_conv, C, true, true, dev, ch, &w->ssm.conv)) ||
            (s = load_weight(L, NAME("ssm_dt.bias"), Hv, 1, true, true, dev, h_cols, &w->ssm.dt)) ||
            (s = load_weight(L, NAME("ssm_a"), Hv, 1, true, true, dev, h_cols, &w->ssm.a)) ||
            (s = load_weight(L, NAME("ssm_norm.weight"), dv, 1, true, true, dev, k_all, &w->ssm.norm)) ||
            (s = load_weight(L, NAME("ssm_out.weight"), Hv * dv, E, true, false, dev, o_cols, &w->ssm.out)))
            return s;
    }
    return PKV_OK;
}

/* A shard's conv bias: the whole ssm_conv1d.bias [C] on the host, its channels
 * (x of heads [h0, h0 + nh), B and C of groups [g0, g0 + ng)) onto dev; absent: zeros. */
static pkv_status load_mamba2_conv_b(loader *L, int il, const pkv_shard_w *sw, pkv_device *dev, pkv_weight *w) {
    const pkv_hparams *hp = &L->m->hp;
    const int64_t G = hp->ssm.n_k_heads, N = hp->ssm.d_k, P = hp->ssm.d_v, DI = (int64_t)hp->ssm.n_v_heads * P;
    const int64_t C = DI + 2 * G * N, nh = sw->n_q, ng = sw->n_kv, h0 = (int64_t)sw->kv_h0 * (nh / ng), g0 = sw->kv_h0;
    char name[96];
    float *all = NULL, *part = NULL;
    memset(w, 0, sizeof *w);
    pkv_status s = pkv_load_host_f32(L, NAME("ssm_conv1d.bias"), C, false, &all);
    if (s || !all) return s;
    const int64_t n = nh * P + 2 * ng * N;
    if (!(part = pkv_malloc((size_t)n * sizeof *part))) s = pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s'", L->m->label, name);
    if (!s) {
        memcpy(part, all + h0 * P, (size_t)(nh * P) * sizeof *part);
        memcpy(part + nh * P, all + DI + g0 * N, (size_t)(ng * N) * sizeof *part);
        memcpy(part + nh * P + ng * N, all + DI + G * N + g0 * N, (size_t)(ng * N) * sizeof *part);
        s = pkv_weight_host(L->m, dev, part, n, w);
    }
    pkv_free(part);
    pkv_free(all);
    return s;
}

pkv_status pkv_load_mamba2(pkv_loader *L, int il) {
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    char name[96];
    pkv_status s;
    const int64_t E = hp->n_embd, G = hp->ssm.n_k_heads, H = hp->ssm.n_v_heads, N = hp->ssm.d_k, P = hp->ssm.d_v;
    const int64_t DI = H * P, C = DI + 2 * G * N, R = H / G, in_rows = 2 * DI + 2 * G * N + H;
    for (int d = 0; d < (ly->rec_first ? 1 : m->n_dev); d++) {
        pkv_shard_w *w = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        const int64_t g0 = w->kv_h0, ng = w->n_kv, h0 = g0 * R, nh = ng * R;
        /* ssm_in's rows: z [DI], x [DI], B [G N], C [G N], dt [H]; the conv's channels: x, B, C */
        slice in_c = {.r0 = 2 * DI + G * N + g0 * N, .nr = ng * N}, in_b = {.r0 = 2 * DI + g0 * N, .nr = ng * N, .more = &in_c};
        slice in_xbc = {.r0 = DI + h0 * P, .nr = nh * P, .more = &in_b};
        slice cv_c = {.r0 = DI + G * N + g0 * N, .nr = ng * N}, cv_b = {.r0 = DI + g0 * N, .nr = ng * N, .more = &cv_c};
        slice cv = {.r0 = h0 * P, .nr = nh * P, .more = &cv_b};
        slice z_rows = {.r0 = h0 * P, .nr = nh * P}, dt_rows = {.r0 = 2 * DI + 2 * G * N + h0, .nr = nh};
        slice h_rows = {.r0 = h0, .nr = nh}, h_cols = {.c0 = h0, .nc = nh}, g_rows = {.r0 = g0, .nr = ng};
        slice o_cols = {.c0 = h0 * P, .nc = nh * P};
        if ((s = load_weight(L, NAME("ssm_in.weight"), E, in_rows, true, false, dev, in_xbc, &w->ssm.qkv)) ||
            (s = load_weight(L, NAME("ssm_in.weight"), E, in_rows, true, false, dev, z_rows, &w->ssm.z)) ||
            (s = load_weight(L, NAME("ssm_in.weight"), E, in_rows, true, false, dev, dt_rows, &w->ssm.beta)) ||
            (s = load_weight(L, NAME("ssm_conv1d.weight"), hp->ssm.d_conv, C, true, true, dev, cv, &w->ssm.conv)) ||
            (s = load_mamba2_conv_b(L, il, w, dev, &w->ssm.conv_b)) ||
            (s = load_weight(L, NAME("ssm_dt.bias"), H, 1, true, true, dev, h_cols, &w->ssm.dt)) ||
            (s = load_weight(L, NAME("ssm_a"), 1, H, true, true, dev, h_rows, &w->ssm.a)) ||
            (s = load_weight(L, NAME("ssm_d"), 1, H, true, true, dev, h_rows, &w->ssm.d)) ||
            (s = load_weight(L, NAME("ssm_norm.weight"), DI / G, G, true, true, dev, g_rows, &w->ssm.gnorm)) ||
            (s = pkv_weight_fill(m, dev, DI / G, 1.0f, &w->ssm.norm)) ||
            (s = load_weight(L, NAME("ssm_out.weight"), DI, E, true, false, dev, o_cols, &w->ssm.out)))
            return s;
    }
    return PKV_OK;
}

pkv_status pkv_load_short_conv(pkv_loader *L, int il) {
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    char name[96];
    pkv_status s;
    const int64_t E = hp->n_embd, c = E / hp->shortconv.n_unit;
    for (int d = 0; d < m->n_dev; d++) {
        pkv_shard_w *w = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        const int64_t c0 = w->kv_h0 * c, nc = w->n_kv * c;
        /* in_proj's rows: B's E, then C's, then x's; its channels' rows of each */
        slice b_rows = {.r0 = c0, .nr = nc}, c_rows = {.r0 = E + c0, .nr = nc}, x_rows = {.r0 = 2 * E + c0, .nr = nc};
        slice cols = {.c0 = c0, .nc = nc};
        if ((s = load_weight(L, NAME("shortconv.in_proj.weight"), E, 3 * E, true, false, dev, b_rows, &w->sc.in_b)) ||
            (s = load_weight(L, NAME("shortconv.in_proj.weight"), E, 3 * E, true, false, dev, c_rows, &w->sc.in_c)) ||
            (s = load_weight(L, NAME("shortconv.in_proj.weight"), E, 3 * E, true, false, dev, x_rows, &w->sc.in_x)) ||
            (s = load_weight(L, NAME("shortconv.conv.weight"), hp->shortconv.l_cache, E, true, true, dev, b_rows,
                             &w->sc.conv)) ||
            (s = load_weight(L, NAME("shortconv.out_proj.weight"), E, E, true, false, dev, cols, &w->sc.out)))
            return s;
    }
    return PKV_OK;
}

pkv_status pkv_load_tensor(pkv_loader *L, int il, const char *suffix, int64_t ne0, int64_t ne1, bool f32, pkv_weight *w) {
    char name[96];
    return load_weight(L, NAME(suffix), ne0, ne1, true, f32, L->m->dev, k_all, w);
}

pkv_status pkv_load_global(pkv_loader *L, const char *name, int64_t ne0, int64_t ne1, bool required, bool f32, pkv_weight *w) {
    return load_weight(L, name, ne0, ne1, required, f32, L->m->dev, k_all, w);
}

pkv_status pkv_load_global_cols(pkv_loader *L, const char *name, int64_t ne0, int64_t ne1, int64_t c0, int64_t nc,
                                pkv_weight *w) {
    slice sl = {.c0 = c0, .nc = nc};
    return load_weight(L, name, ne0, ne1, true, false, L->m->dev, sl, w);
}

pkv_status pkv_load_nextn(pkv_loader *L) {
    pkv_model *m = L->m;
    if (!m->mtp) return PKV_OK;
    char nh[96], nen[96], nhn[96];
    const int b = m->hp.layer_base;
    snprintf(nh, sizeof nh, "blk.%d.nextn.eh_proj.weight", b);
    snprintf(nen, sizeof nen, "blk.%d.nextn.enorm.weight", b);
    snprintf(nhn, sizeof nhn, "blk.%d.nextn.hnorm.weight", b);
    const int64_t E = m->hp.n_embd;
    pkv_status s;
    if ((s = pkv_load_global_cols(L, nh, 2 * E, E, 0, E, &m->nextn.eh_e)) ||
        (s = pkv_load_global_cols(L, nh, 2 * E, E, E, E, &m->nextn.eh_h)) ||
        (s = pkv_load_global(L, nen, E, 1, true, true, &m->nextn.enorm)) ||
        (s = pkv_load_global(L, nhn, E, 1, true, true, &m->nextn.hnorm)))
        return s;
    return PKV_OK;
}

pkv_status pkv_weight_host(pkv_model *m, pkv_device *dev, const float *data, int64_t n, pkv_weight *w) {
    memset(w, 0, sizeof *w);
    pkv_buffer *b = pkv_buffer_alloc(dev, (size_t)n * sizeof *data);
    pkv_status s = b ? pkv_buffer_write(b, 0, data, (size_t)n * sizeof *data) : PKV_ERR_NOMEM;
    if (s) {
        pkv_buffer_free(b);
        return pkv_err_prefix(s, "%s: a vector of %lld floats on %s", m->label, (long long)n, pkv_device_name(dev));
    }
    *w = (pkv_weight){.buf = b, .type = PKV_TYPE_F32, .ne0 = n, .ne1 = 1};
    m->weight_bytes += (uint64_t)n * sizeof *data;
    return PKV_OK;
}

pkv_status pkv_weight_fill(pkv_model *m, pkv_device *dev, int64_t n, float value, pkv_weight *w) {
    float *h = pkv_malloc((size_t)n * sizeof *h);
    if (!h) return pkv_err(PKV_ERR_NOMEM, "%s: a constant vector of %lld floats", m->label, (long long)n);
    for (int64_t i = 0; i < n; i++) h[i] = value;
    pkv_status s = pkv_weight_host(m, dev, h, n, w);
    pkv_free(h);
    return s;
}

pkv_status pkv_load_host_f32(pkv_loader *L, const char *name, int64_t n, bool required, float **out) {
    const char *lab = pkv_gguf_label(L->g);
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(L->g, name);
    *out = NULL;
    if (!t) return required ? pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' not found", lab, name) : PKV_OK;
    if ((int64_t)t->n_elements != n || t->ne[0] != n)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld]", lab, name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)n);
    float *h = pkv_malloc((size_t)n * sizeof *h);
    if (!h) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s'", lab, name);
    pkv_status s = pkv_dequantize_row(t->type, t->data, h, n);
    if (s) {
        pkv_free(h);
        return pkv_err_prefix(s, "%s: tensor '%s'", lab, name);
    }
    *out = h;
    progress(L, t->n_bytes);
    return PKV_OK;
}

pkv_status pkv_load_host_table(pkv_loader *L, const char *name, int64_t ne0, int64_t ne1) {
    pkv_model *m = L->m;
    const char *lab = pkv_gguf_label(L->g);
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(L->g, name);
    if (!t) return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' not found", lab, name);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld] (ne0, ne1)", lab,
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                       (long long)ne0, (long long)ne1);
    if (!pkv_type_row_bytes(t->type, (size_t)ne0))
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which cannot be read row by row", lab, name,
                       pkv_type_name(t->type));
    m->ple.tok_type = t->type;
    if (L->in_place) { /* the mapping stays with the model (pkv_model_load) */
        m->ple.tok = t->data;
        m->mapped_bytes += t->n_bytes;
    } else {
        m->ple.tok_own = pkv_malloc(t->n_bytes);
        if (!m->ple.tok_own) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s' (%zu bytes)", lab, name, (size_t)t->n_bytes);
        memcpy(m->ple.tok_own, t->data, t->n_bytes);
        m->ple.tok = m->ple.tok_own;
    }
    m->weight_bytes += t->n_bytes;
    progress(L, t->n_bytes);
    return PKV_OK;
}

/* The FFN's rows of each shard; gated false: ffn_up and ffn_down only. */
static pkv_status load_ffn(pkv_loader *L, int il, bool fused_up, bool gated) {
    pkv_model *m = L->m;
    pkv_layer *ly = &m->layers[il];
    char name[96];
    pkv_status s;
    const int64_t E = m->hp.n_embd, F = ly->n_ff;
    ly->fused_up = fused_up;
    for (int d = 0; d < m->n_dev; d++) {
        pkv_shard_w *w = &ly->sh[d];
        pkv_device *dev = m->devs[d];
        slice f_rows = {.r0 = w->ff0, .nr = w->n_ff}, f_cols = {.c0 = w->ff0, .nc = w->n_ff};
        if (fused_up) {
            slice fu = f_rows;
            fu.r0 += F;
            if ((s = load_weight(L, NAME("ffn_up.weight"), E, 2 * F, true, false, dev, f_rows, &w->w_gate)) ||
                (s = load_weight(L, NAME("ffn_up.weight"), E, 2 * F, true, false, dev, fu, &w->w_up)))
                return s;
        } else if ((gated && (s = load_weight(L, NAME("ffn_gate.weight"), E, F, true, false, dev, f_rows, &w->w_gate))) ||
                   (s = load_weight(L, NAME("ffn_up.weight"), E, F, true, false, dev, f_rows, &w->w_up))) {
            return s;
        }
        if ((s = load_weight(L, NAME("ffn_down.weight"), F, E, true, false, dev, f_cols, &w->w_down))) return s;
    }
    return PKV_OK;
}

pkv_status pkv_load_ffn(pkv_loader *L, int il, bool fused_up) { return load_ffn(L, il, fused_up, true); }

pkv_status pkv_load_ffn_up(pkv_loader *L, int il) { return load_ffn(L, il, false, false); }

/* Part p of a layer's experts (p->e0, p->n set; none: nothing) onto dev. */
static pkv_status load_moe_part(pkv_loader *L, int il, bool biases, struct pkv_moe_part *p, pkv_device *dev) {
    pkv_model *m = L->m;
    const int64_t E = m->hp.n_embd, X = m->hp.moe.n_expert, F = m->hp.moe.n_ff, e0 = p->e0, n = p->n;
    char name[96];
    pkv_status s;
    if (n <= 0) return PKV_OK;
    if (m->layers[il].fused_exps) { /* merged (llama.cpp's gate_up_exps): expert e's 2F rows are its gate's F, then its up's F */
        slice gate = {.r0 = e0 * 2 * F, .nr = n * F, .rblock = F, .rstride = 2 * F},
              up = {.r0 = e0 * 2 * F + F, .nr = n * F, .rblock = F, .rstride = 2 * F};
        if ((s = load_experts_at(L, NAME("ffn_gate_up_exps.weight"), E, 2 * F, gate, dev, &p->gate)) ||
            (s = load_experts_at(L, NAME("ffn_gate_up_exps.weight"), E, 2 * F, up, dev, &p->up)))
            return s;
    } else if ((s = load_experts_at(L, NAME("ffn_gate_exps.weight"), E, F, (slice){.r0 = e0 * F, .nr = n * F}, dev, &p->gate)) ||
               (s = load_experts_at(L, NAME("ffn_up_exps.weight"), E, F, (slice){.r0 = e0 * F, .nr = n * F}, dev, &p->up))) {
        return s;
    }
    if ((s = load_experts_at(L, NAME("ffn_down_exps.weight"), F, E, (slice){.r0 = e0 * E, .nr = n * E}, dev, &p->down)))
        return s;
    const slice rows = {.r0 = e0, .nr = n};
    if (biases && ((s = load_weight(L, NAME("ffn_gate_exps.bias"), F, X, true, true, dev, rows, &p->gate_b)) ||
                   (s = load_weight(L, NAME("ffn_up_exps.bias"), F, X, true, true, dev, rows, &p->up_b)) ||
                   (s = load_weight(L, NAME("ffn_down_exps.bias"), E, X, true, true, dev, rows, &p->down_b))))
        return s;
    return PKV_OK;
}

/* The shared expert: a gated FFN on the first device whose row count the file's
 * ffn_gate_shexp gives (llama.cpp sizes it per architecture: expert_shared_count
 * experts of expert_feed_forward_length, or expert_shared_feed_forward_length), and
 * with PKV_MOE_SHARED_GATE its sigmoid gate ffn_gate_inp_shexp. */
static pkv_status load_shared_expert(pkv_loader *L, int il, unsigned what) {
    pkv_model *m = L->m;
    pkv_layer *ly = &m->layers[il];
    const int64_t E = m->hp.n_embd;
    char name[96];
    pkv_status s;
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(L->g, NAME("ffn_gate_shexp.weight"));
    if (!t) return pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' not found (the shared expert)", m->label, name);
    const int64_t F = t->ne[1];
    if ((s = load_weight(L, name, E, F, true, false, m->dev, k_all, &ly->moe.sh_gate)) ||
        (s = load_weight(L, NAME("ffn_up_shexp.weight"), E, F, true, false, m->dev, k_all, &ly->moe.sh_up)) ||
        (s = load_weight(L, NAME("ffn_down_shexp.weight"), F, E, true, false, m->dev, k_all, &ly->moe.sh_down)))
        return s;
    if (!(what & PKV_MOE_SHARED_GATE)) return PKV_OK;
    /* [n_embd] (llama.cpp's converters) or [n_embd][1] */
    return load_weight(L, NAME("ffn_gate_inp_shexp.weight"), E, 1, true, true, m->dev, k_all, &ly->moe.sh_gate_inp);
}

pkv_status pkv_load_moe(pkv_loader *L, int il, unsigned what) {
    const bool biases = what & PKV_MOE_BIASES;
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    pkv_layer *ly = &m->layers[il];
    char name[96];
    pkv_status s;
    const int64_t E = hp->n_embd, X = hp->moe.n_expert;
    if (X <= 0) return pkv_err(PKV_ERR_INTERNAL, "%s: layer %d: experts without an expert count", m->label, il);
    if ((s = load_weight(L, NAME("ffn_gate_inp.weight"), E, X, true, false, m->dev, k_all, &ly->moe.router)) ||
        (biases && (s = load_weight(L, NAME("ffn_gate_inp.bias"), X, 1, true, true, m->dev, k_all, &ly->moe.router_b))))
        return s;
    ly->fused_exps = !pkv_gguf_find_tensor(L->g, NAME("ffn_gate_exps.weight")) &&
                     pkv_gguf_find_tensor(L->g, NAME("ffn_gate_up_exps.weight"));
    for (int d = 0; d < m->n_dev; d++) { /* each device its experts (all of them on one) */
        struct pkv_moe_part *p = &ly->moe.ep[d];
        p->e0 = (int)boundary(m->split, m->n_dev, d, X, 1);
        p->n = (int)boundary(m->split, m->n_dev, d + 1, X, 1) - p->e0;
        if ((s = load_moe_part(L, il, biases, p, m->devs[d]))) return s;
    }
    if ((what & PKV_MOE_PROBS_B) &&
        (s = load_weight(L, NAME("exp_probs_b.bias"), X, 1, false, true, m->dev, k_all, &ly->moe.probs_b)))
        return s;
    return what & (PKV_MOE_SHARED | PKV_MOE_SHARED_GATE) ? load_shared_expert(L, il, what) : PKV_OK;
}

pkv_status pkv_load_prenorm(pkv_loader *L, int il, const pkv_attn_tensors *attn, const char *ffn_norm, pkv_ffn_tensors ffn) {
    pkv_layer *ly = &L->m->layers[il];
    pkv_status s;
    if ((s = pkv_load_norm(L, il, "attn_norm.weight", &ly->attn_norm)) || (s = pkv_load_attention(L, il, attn)) ||
        (s = pkv_load_norm(L, il, ffn_norm ? ffn_norm : "ffn_norm.weight", &ly->ffn_norm)))
        return s;
    return ffn == PKV_FFN_EXPERTS || ffn == PKV_FFN_EXPERTS_BIASED
               ? pkv_load_moe(L, il, ffn == PKV_FFN_EXPERTS_BIASED ? PKV_MOE_BIASES : 0)
                                                                   : pkv_load_ffn(L, il, ffn == PKV_FFN_FUSED_UP);
}

/* Which layers slide: gemma4 lists them (swa_layers), the others repeat swa_pattern. */
static bool layer_slides(const pkv_hparams *hp, int il) {
    if (hp->swa_per_layer) return hp->swa_layers[il / 64] >> (il % 64) & 1;
    return hp->swa.pattern > 0 && il % hp->swa.pattern < hp->swa.pattern - 1;
}

/* KV shared between layers (gemma4, llama.cpp's rule): the last n_shared_kv layers own
 * no KV; each attends over the cache of the last layer of its kind that does: layer
 * Lkv - 2 for a sliding layer, Lkv - 1 for a full one (Lkv = the layers that own KV).
 * Those two must be of those kinds and the sharing layer's KV geometry the owner's. */
static pkv_status share_kv(pkv_model *m) {
    const pkv_hparams *hp = &m->hp;
    const int L = hp->n_layer, Lkv = L - hp->n_shared_kv;
    m->n_cache_layers = L;
    if (hp->n_shared_kv == 0) return PKV_OK;
    const char *arch = pkv_arch_name(hp->arch);
    if (Lkv < 2)
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.shared_kv_layers' %d of %d layers leaves %d with KV of their own: the "
                       "sharing layers read the KV of the last sliding and the last full layer that have it, so at least two "
                       "must", m->label, arch, hp->n_shared_kv, L, Lkv);
    if (layer_slides(hp, Lkv - 1) || !layer_slides(hp, Lkv - 2))
        return pkv_err(PKV_ERR_FORMAT, "%s: '%s.attention.shared_kv_layers' %d: the last two layers with KV of their own (layers "
                       "%d and %d) must be a sliding and a full layer, whose KV the sharing layers read; key '%s.attention."
                       "sliding_window_pattern' makes them %s and %s", m->label, arch, hp->n_shared_kv, Lkv - 2, Lkv - 1, arch,
                       layer_slides(hp, Lkv - 2) ? "sliding" : "full", layer_slides(hp, Lkv - 1) ? "sliding" : "full");
    if (m->kv_layer)
        return pkv_err(PKV_ERR_FORMAT, "%s: key 'pagekv.shared_kv_layers' (a draft's map into a target's cache) and '%s."
                       "attention.shared_kv_layers' (KV shared inside the model) cannot both be set", m->label, arch);
    m->kv_layer = pkv_malloc((size_t)L * sizeof *m->kv_layer);
    if (!m->kv_layer) return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", m->label);
    for (int il = 0; il < L; il++) {
        pkv_layer *ly = &m->layers[il];
        m->kv_layer[il] = il < Lkv ? il : layer_slides(hp, il) ? Lkv - 2 : Lkv - 1;
        ly->kv_reuse = il >= Lkv;
        const pkv_layer *o = &m->layers[m->kv_layer[il]];
        if (ly->kv_reuse && (ly->n_head_kv != o->n_head_kv || ly->head_dim_k != o->head_dim_k || ly->head_dim_v != o->head_dim_v))
            return pkv_err(PKV_ERR_FORMAT, "%s: layer %d reads the KV of layer %d, but has %d KV heads of %d/%d where layer %d "
                           "has %d of %d/%d (key '%s.attention.head_count_kv')", m->label, il, m->kv_layer[il], ly->n_head_kv,
                           ly->head_dim_k, ly->head_dim_v, m->kv_layer[il], o->n_head_kv, o->head_dim_k, o->head_dim_v, arch);
    }
    m->n_cache_layers = Lkv;
    return PKV_OK;
}

/* Under several ranks: the layers each holds, a layer's KV on its own rank (a layer
 * that reads another layer's KV must be on the same rank). */
static pkv_status rank_layers(pkv_model *m, const char *split) {
    const int n = pkv_dist_size(), L = m->hp.n_layer;
    m->rank = pkv_dist_rank();
    m->n_ranks = n;
    m->rank_first[0] = 0;
    m->rank_first[1] = L;
    if (n <= 1 && split)
        return pkv_err(PKV_ERR_INVALID, "%s: rank split '%s' given, but this process is not one of several MPI ranks (start "
                       "it with mpirun -np N%s)", m->label, split,
#ifdef PKV_HAVE_MPI
                       ""
#else
                       "; this pagekv was built without MPI: install libopenmpi-dev and rebuild"
#endif
        );
    if (n <= 1) return PKV_OK;
    if (m->mtp || m->kv_draft || m->assistant)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: a draft, an MTP head or an assistant under %d MPI ranks is not supported "
                       "(only the main model is split over ranks)", m->label, n);
    pkv_status s = pkv_dist_split_layers(m->label, split, L, n, m->rank_first);
    for (int il = 0; !s && m->kv_layer && il < L; il++) {
        int r = 0, o = m->kv_layer[il];
        while (m->rank_first[r + 1] <= il) r++;
        if (o < m->rank_first[r] || o >= m->rank_first[r + 1])
            s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: layer %d (rank %d) reads the KV of layer %d, which rank split puts on "
                        "another rank: choose proportions (--rank-split) that keep them together", m->label, il, r, o);
    }
    return s;
}

/* Every layer: its attention kind (window, RoPE, head sizes) and the KV it reads,
 * then its shards' ranges and the architecture's tensors. */
static pkv_status load_layers(loader *L) {
    pkv_model *m = L->m;
    const pkv_hparams *hp = &m->hp;
    const pkv_arch_ops *ops = pkv_arch_ops_of(hp->arch);
    char name[96];
    pkv_status s = PKV_OK;
    for (int il = 0; il < hp->n_layer; il++) {
        pkv_layer *ly = &m->layers[il];
        /* the attention kind of the layer: sliding layers see the last n_swa tokens */
        bool sliding = layer_slides(hp, il);
        ly->window = sliding && hp->swa.n > 0 ? hp->swa.n : 0;
        ly->chunk = sliding && hp->n_chunk > 0 ? hp->n_chunk : 0; /* llama4: its "sliding" layers are chunked */
        /* sliding layers with a base of their own (gemma3: and no scaling) */
        bool local_rope = sliding && hp->swa.rope_base > 0;
        ly->rope_base = local_rope ? hp->swa.rope_base : hp->rope_base;
        ly->rope_freq_scale = local_rope ? hp->swa.rope_freq_scale : hp->rope_freq_scale;
        /* and head sizes of their own (gemma4) */
        ly->head_dim_k = sliding && hp->head_dim_k_swa ? hp->head_dim_k_swa : hp->head_dim_k;
        ly->head_dim_v = sliding && hp->head_dim_v_swa ? hp->head_dim_v_swa : hp->head_dim_v;
        ly->n_rot = sliding && hp->n_rot_swa ? hp->n_rot_swa : hp->n_rot;
        ly->rope_pairs = sliding ? 0 : hp->rope_pairs_full;
    }
    if ((s = share_kv(m))) return s;
    if (ops->load_global && (s = ops->load_global(L))) return s;
    if ((s = rank_layers(m, L->p.rank_split))) return s;
    for (int il = 0; il < hp->n_layer; il++) {
        pkv_layer *ly = &m->layers[il];
        ly->sh = pkv_calloc((size_t)m->n_dev, sizeof *ly->sh);
        if (!ly->sh) return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", m->label);
        /* FFN rows are split in whole blocks of the down projection's type */
        const pkv_gguf_tensor *down = pkv_gguf_find_tensor(L->g, NAME("ffn_down.weight"));
        if (!down) down = pkv_gguf_find_tensor(L->g, NAME("ffn_down_exps.weight")); /* not split: experts go whole */
        int64_t fblk = down ? (int64_t)pkv_type_block_elems(down->type) : 1;
        if ((s = plan_layer(m, il, fblk ? fblk : 1))) return s;
        L->remote = il < m->rank_first[m->rank] || il >= m->rank_first[m->rank + 1];
        s = ops->load_layer(L, il);
        L->remote = false;
        if (s) return s;
    }
    return s;
}
#undef NAME

/* Open the devices of p: one (device / device_handle) or a comma list (devices)
 * with proportions (split), and the host device for kv_on_host. */
static pkv_status open_devices(pkv_model *m, pkv_model_params p) {
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = p.n_threads;
    if (p.n_threads < 0)
        return pkv_err(PKV_ERR_INVALID, "%s: n_threads %d is negative (0 = all cores)", m->label, p.n_threads);
    if (p.devices && p.device_handle)
        return pkv_err(PKV_ERR_INVALID, "%s: give either a device handle or a device list, not both", m->label);
    if (p.devices) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", p.devices);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (m->n_dev == PKV_MAX_DEVICES) return pkv_err(PKV_ERR_INVALID, "%s: more than %d devices", m->label, PKV_MAX_DEVICES);
            for (int d = 0; d < m->n_dev; d++)
                if (!strcmp(pkv_device_name(m->devs[d]), tok))
                    return pkv_err(PKV_ERR_INVALID, "%s: device %s is listed twice in '%s'", m->label, tok, p.devices);
            m->devs[m->n_dev] = pkv_device_open(tok, dp);
            if (!m->devs[m->n_dev]) return PKV_ERR_NOT_FOUND; /* the device's own message: not the file's fault */
            m->own_dev[m->n_dev++] = true;
        }
        if (m->n_dev == 0) return pkv_err(PKV_ERR_INVALID, "%s: the device list '%s' is empty", m->label, p.devices);
    } else if (p.device_handle) {
        m->devs[0] = p.device_handle;
        m->n_dev = 1;
    } else {
        m->devs[0] = pkv_device_open(p.device ? p.device : "cpu", dp);
        if (!m->devs[0]) return PKV_ERR_NOT_FOUND;
        m->own_dev[0] = true;
        m->n_dev = 1;
    }
    m->dev = m->devs[0];
    for (int d = 0; d < m->n_dev; d++) {
        m->split[d] = 1.0f;
        if (!pkv_device_get_caps(m->devs[d])->has_kernels)
            return pkv_err(PKV_ERR_UNSUPPORTED, "%s: device %s has no compute kernels", m->label, pkv_device_name(m->devs[d]));
    }
    if (p.split) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", p.split);
        int k = 0;
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), k++) {
            char *end;
            double v = strtod(tok, &end);
            if (*end || !(v > 0) || k >= m->n_dev) {
                return pkv_err(PKV_ERR_INVALID, "%s: split '%s' must be %d positive numbers, one per device", m->label, p.split,
                               m->n_dev);
            }
            m->split[k] = (float)v;
        }
        if (k != m->n_dev)
            return pkv_err(PKV_ERR_INVALID, "%s: split '%s' has %d numbers for %d devices", m->label, p.split, k, m->n_dev);
    }
    if (p.kv_on_host) {
        m->kv_on_host = true;
        for (int d = 0; d < m->n_dev; d++)
            if (!strcmp(pkv_device_name(m->devs[d]), "cpu")) m->host = m->devs[d];
        if (!m->host) {
            m->host = pkv_device_open("cpu", dp);
            if (!m->host) return pkv_err_prefix(PKV_ERR_NOT_FOUND, "host device for --kv-on-host");
            m->own_host = true;
        }
    }
    return PKV_OK;
}

/* A draft that attends over another model's KV (multi-token-prediction style)
 * names, for each of its layers, the target layer whose cache it reads:
 *   pagekv.shared_kv_layers: array of int32, one per layer, each >= 0.
 * Such a model has no cache of its own; see pkv_context_attach. */
/* The classification head of rank pooling, where the file has one: cls.output.weight
 * [n_cls][n_embd] (ne0 n_embd) and its optional bias, as host f32 rows (a score is
 * n_cls dot products per sequence). The label count (classifier.output_labels),
 * when given, must match the rows. */
static pkv_status load_cls(const pkv_gguf *g, pkv_model *m) {
    const char *lab = pkv_gguf_label(g);
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(g, "cls.output.weight");
    if (!t) return PKV_OK;
    int64_t E = m->hp.n_embd;
    if (t->ne[0] != E || t->ne[1] < 1 || t->ne[1] > 1024 || t->ne[2] != 1 || t->ne[3] != 1)
        return pkv_err(PKV_ERR_FORMAT, "%s: tensor 'cls.output.weight' has shape [%lld, %lld, %lld, %lld], expected [%lld, 1..1024]",
                       lab, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)E);
    int n = (int)t->ne[1];
    char k[128];
    snprintf(k, sizeof k, "%s.classifier.output_labels", pkv_arch_name(m->hp.arch));
    int64_t ki = pkv_gguf_find_key(g, k);
    if (ki >= 0) {
        pkv_gguf_array a;
        if (pkv_gguf_get_arr(g, k, PKV_GGUF_STRING, &a) || a.count != (uint64_t)n)
            return pkv_err(PKV_ERR_FORMAT, "%s: '%s' must be %d strings, one per row of 'cls.output.weight'", lab, k, n);
    }
    float *w = pkv_malloc((size_t)n * (size_t)E * sizeof *w);
    if (!w) return pkv_err(PKV_ERR_NOMEM, "%s: tensor 'cls.output.weight'", lab);
    pkv_status s = PKV_OK;
    size_t rb = pkv_type_row_bytes(t->type, (size_t)E);
    for (int i = 0; i < n && !s; i++)
        s = rb ? pkv_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)i * rb, w + (size_t)i * (size_t)E, E)
               : pkv_err(PKV_ERR_FORMAT, "%s: tensor 'cls.output.weight': type cannot hold rows of %lld", lab, (long long)E);
    const pkv_gguf_tensor *tb = s ? NULL : pkv_gguf_find_tensor(g, "cls.output.bias");
    float *b = NULL;
    if (tb) {
        if ((int64_t)tb->n_elements != n || tb->ne[0] != n)
            s = pkv_err(PKV_ERR_FORMAT, "%s: tensor 'cls.output.bias' has %lld elements, expected %d", lab,
                        (long long)tb->n_elements, n);
        else if (!(b = pkv_malloc((size_t)n * sizeof *b)))
            s = pkv_err(PKV_ERR_NOMEM, "%s: tensor 'cls.output.bias'", lab);
        else
            s = pkv_dequantize_row(tb->type, tb->data, b, n);
    }
    if (s) {
        pkv_free(w);
        pkv_free(b);
        return pkv_err_prefix(s, "%s: classification head", lab);
    }
    m->cls_out = w;
    m->cls_out_b = b;
    m->n_cls_out = n;
    return PKV_OK;
}

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
    m->kv_draft = true;
    return PKV_OK;
}

/* Load from an opened GGUF. On failure everything is freed. */
static pkv_model *load(const pkv_gguf *g, pkv_model_params p, bool in_place) {
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
    if (p.mtp) { /* the MTP head: the first layer after the trunk, alone */
        if (!pkv_arch_ops_of(m->hp.arch)->mtp_head || m->hp.n_nextn < 1) {
            char with[128]; /* the architectures whose files have MTP heads */
            if (!pkv_arch_ops_of(m->hp.arch)->mtp_head)
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: no MTP head: MTP heads are read for %s files only", m->label,
                            pkv_arch_names_where(has_mtp_head, 0, " and ", with, sizeof with));
            else
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: no MTP head: key '%s.nextn_predict_layers' is absent or 0", m->label,
                            pkv_arch_name(m->hp.arch));
            goto fail;
        }
        m->mtp = true;
        n_head[0] = n_head[m->hp.n_layer];
        n_head_kv[0] = n_head_kv[m->hp.n_layer];
        n_ff[0] = n_ff[m->hp.n_layer];
        m->hp.layer_base = m->hp.n_layer;
        m->hp.n_layer = 1;
        m->hp.recurrent = 0;
    }
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
    if ((s = load_cls(g, m))) goto fail;

    if ((s = open_devices(m, p))) goto fail;
    loader L = {.g = g, .m = m, .p = p, .in_place = in_place};
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) L.total_bytes += pkv_gguf_tensor_at(g, i)->n_bytes;
    {
        /* an MTP head takes its own embedding, final norm and output matrix where the
         * file has them (nextn.embed_tokens, .shared_head_norm, .shared_head_head) */
        char ne[96], nn[96], no[96];
        int b = m->hp.layer_base;
        snprintf(ne, sizeof ne, "blk.%d.nextn.embed_tokens.weight", b);
        snprintf(nn, sizeof nn, "blk.%d.nextn.shared_head_norm.weight", b);
        snprintf(no, sizeof no, "blk.%d.nextn.shared_head_head.weight", b);
        bool own_e = m->mtp && pkv_gguf_find_tensor(g, ne), own_n = m->mtp && pkv_gguf_find_tensor(g, nn),
             own_o = m->mtp && pkv_gguf_find_tensor(g, no);
        if ((s = load_weight(&L, own_e ? ne : "token_embd.weight", m->hp.n_embd, m->hp.n_vocab, true, false, m->dev, k_all,
                             &m->tok_embd)))
            goto fail;
        const char *on = pkv_arch_ops_of(m->hp.arch)->output_norm;
        if ((s = load_weight(&L, own_n ? nn : on ? on : "output_norm.weight", m->hp.n_embd, 1, true, true, m->dev, k_all, &m->output_norm)))
            goto fail;
        if ((s = load_weight(&L, own_o ? no : "output.weight", m->hp.n_embd, m->hp.n_vocab, false, false, m->dev, k_all,
                             &m->output)))
            goto fail;
    }
    if (!m->output.buf) { /* tied embeddings */
        m->output = m->tok_embd;
        m->tied = true;
    }
    if ((s = load_layers(&L))) goto fail;
    int best = 0;
    for (int t = 0; t < PKV_TYPE_COUNT; t++) {
        if (L.type_count[t] > L.type_count[best]) best = t;
        if (L.type_count[t]) m->weight_types |= 1ull << t;
    }
    m->main_type = (pkv_type)best;
    if ((s = fingerprint(m, g, p.n_threads))) goto fail;
    pkv_free(n_head);
    pkv_free(n_head_kv);
    pkv_free(n_ff);
    for (int d = 0; d < m->n_dev; d++)
        if ((s = pkv_device_sync(m->devs[d]))) goto fail_nofree;
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

/* Under several ranks every rank's load ends here: the ranks agree (the same file
 * and version everywhere, every load succeeded) or all fail, naming the rank. */
static pkv_model *join_ranks(pkv_model *m, const char *label) {
    if (pkv_dist_size() <= 1) return m;
    pkv_status local = m ? PKV_OK : pkv_errcode() ? pkv_errcode() : PKV_ERR_INVALID;
    pkv_status s = pkv_dist_agree(label, local, m ? m->fingerprint_base : 0, m ? m->hp.n_layer : 0);
    if (s && m) {
        pkv_model_free(m);
        m = NULL;
    }
    return m;
}

pkv_model *pkv_model_load(const char *path, pkv_model_params p) {
    if (!path) {
        pkv_err(PKV_ERR_INVALID, "pkv_model_load: path is NULL");
        return NULL;
    }
    pkv_gguf *g = pkv_gguf_open(path);
    if (!g) return NULL;
    pkv_model *m = load(g, p, !p.no_mmap);
    if (m && m->mapped_bytes)
        m->gguf = g; /* weights (or gemma4's per-layer token table) are used in place from the mapping: it
                        lives as long as the model */
    else
        pkv_gguf_close(g); /* weights were copied to the device */
    return join_ranks(m, path);
}

pkv_model *pkv_model_load_memory(const void *data, size_t size, const char *label, pkv_model_params p) {
    pkv_gguf *g = pkv_gguf_open_memory(data, size, label);
    if (!g) return NULL;
    pkv_model *m = load(g, p, false); /* the caller's memory: copied, the caller may free it */
    pkv_gguf_close(g);
    return join_ranks(m, label);
}

/* A shared-KV draft (pagekv.shared_kv_layers, any architecture): t's vocabulary,
 * attention layers only, and each fits the cache layer it names (I6:
 * pkv_kv_attach). The draft computes in whatever dtype the cache stores. Changes
 * nothing. */
static pkv_status attach_shared_kv(const pkv_model *d, const pkv_model *t, const pkv_kv_cache *c) {
    if (d->hp.n_vocab != t->hp.n_vocab)
        return pkv_err(PKV_ERR_MISMATCH, "attach: draft %s has %d tokens in its vocabulary, target %s has %d", d->label,
                       d->hp.n_vocab, t->label, t->hp.n_vocab);
    const pkv_kv_layout *lay = pkv_kv_cache_layout(c);
    pkv_kv_attach_layer *al = pkv_calloc((size_t)d->hp.n_layer, sizeof *al);
    if (!al) return pkv_err(PKV_ERR_NOMEM, "attach: out of memory");
    for (int l = 0; l < d->hp.n_layer; l++) {
        pkv_kv_layer_info li;
        if (d->layers[l].recurrent) { /* it would need a state of its own, which no target layer keeps for it */
            pkv_free(al);
            return pkv_err(PKV_ERR_MISMATCH, "attach: draft %s layer %d is recurrent (%s), so it cannot attend over "
                           "target %s's KV layer %d: a shared-KV draft's layers must be attention layers", d->label, l,
                           pkv_arch_name(d->hp.arch), t->label, d->kv_layer[l]);
        }
        al[l].kv_layer = d->kv_layer[l];
        al[l].n_kv_heads = d->layers[l].n_head_kv;
        al[l].head_dim_k = d->layers[l].head_dim_k;
        al[l].head_dim_v = d->layers[l].head_dim_v;
        bool have = pkv_kv_layout_layer(lay, d->kv_layer[l], &li) == PKV_OK;
        al[l].dtype_k = have ? li.dtype_k : PKV_TYPE_F16;
        al[l].dtype_v = have ? li.dtype_v : PKV_TYPE_F16;
        al[l].compute = d->dev;
    }
    pkv_status s = pkv_kv_attach(c, "draft", pkv_kv_layout_page_size(lay), al, d->hp.n_layer);
    pkv_free(al);
    return s;
}

pkv_status pkv_model_attach(pkv_model *d, const pkv_model *t, pkv_kv_cache *c) {
    if (!d || !t || !c) return pkv_err(PKV_ERR_INVALID, "attach: NULL argument");
    const pkv_arch_ops *ops = pkv_arch_ops_of(d->hp.arch);
    if (ops->attach) return ops->attach(d, t, c);
    if (d->kv_draft) return attach_shared_kv(d, t, c);
    return pkv_err(PKV_ERR_INVALID, "attach: %s (%s) is not a draft that reads a target's cache", d->label,
                   pkv_arch_name(d->hp.arch));
}

pkv_status pkv_model_get_info(const pkv_model *m, pkv_model_info *info) {
    if (!m || !info) return pkv_err(PKV_ERR_INVALID, "pkv_model_get_info: NULL argument");
    memset(info, 0, sizeof *info);
    info->arch = pkv_arch_name(m->hp.arch);
    info->n_layer = m->hp.n_layer;
    info->rank = m->rank;
    info->n_ranks = m->n_ranks;
    info->layer_first = m->rank_first[m->rank];
    info->layer_end = m->rank_first[m->rank + 1];
    info->n_embd = m->hp.n_embd;
    info->n_head = m->layers[0].n_head;
    info->n_head_kv = m->layers[0].n_head_kv;
    info->head_dim = m->hp.head_dim_k;
    info->n_ff = m->layers[0].n_ff;
    info->n_devices = m->n_dev;
    info->kv_on_host = m->kv_on_host;
    info->n_vocab = m->hp.n_vocab;
    info->n_ctx_train = m->hp.n_ctx_train;
    info->weight_type = pkv_type_name(m->main_type);
    info->weight_types = m->weight_types;
    info->weight_bytes = m->weight_bytes;
    {
        size_t embd = pkv_buffer_size(m->tok_embd.buf), row = pkv_type_row_bytes(m->tok_embd.type, (size_t)m->hp.n_embd);
        info->decode_bytes_per_token = m->tied ? m->weight_bytes : m->weight_bytes - embd + row;
        /* a mixture of experts reads only the experts a token is routed to */
        for (int l = 0; l < m->hp.n_layer && m->hp.moe.n_expert > 0; l++) {
            const pkv_layer *ly = &m->layers[l];
            uint64_t experts = 0;
            for (int d = 0; d < m->n_dev; d++)
                experts += (uint64_t)pkv_buffer_size(ly->moe.ep[d].gate.buf) + pkv_buffer_size(ly->moe.ep[d].up.buf) +
                           pkv_buffer_size(ly->moe.ep[d].down.buf);
            info->decode_bytes_per_token -= experts / (uint64_t)m->hp.moe.n_expert * (uint64_t)(m->hp.moe.n_expert - m->hp.moe.n_used);
        }
    }
    info->has_vocab = pkv_tokenizer_kind_of(m->tok) != PKV_TOKENIZER_NONE;
    info->load_seconds = m->load_seconds;
    info->weight_bytes_mapped = m->mapped_bytes;
    info->shared_kv = m->kv_draft && !m->assistant;
    info->assistant = m->assistant;
    info->n_embd_out = m->hp.n_embd_out;
    info->pooling = m->hp.pooling;
    info->n_cls_out = m->n_cls_out;
    info->n_kv_layers = m->n_cache_layers;
    info->n_expert = m->hp.moe.n_expert;
    info->n_expert_used = m->hp.moe.n_used;
    info->mtp = m->mtp;
    info->n_nextn = m->hp.n_nextn;
    info->n_recurrent = 0;
    for (int l = 0; l < m->hp.n_layer; l++) info->n_recurrent += m->layers[l].recurrent;
    return PKV_OK;
}

pkv_device *pkv_model_device(const pkv_model *m) { return m ? m->dev : NULL; }

pkv_status pkv_model_rank_layers(const pkv_model *m, int rank, int *first, int *end) {
    if (!m || !first || !end) return pkv_err(PKV_ERR_INVALID, "pkv_model_rank_layers: NULL argument");
    if (rank < 0 || rank >= m->n_ranks)
        return pkv_err(PKV_ERR_INVALID, "%s: rank %d: the model is split over %d rank(s)", m->label, rank, m->n_ranks);
    *first = m->rank_first[rank];
    *end = m->rank_first[rank + 1];
    return PKV_OK;
}
