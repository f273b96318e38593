/* LoRA adapters: loading a GGUF adapter against its base model, the sets a
 * sequence applies, and the delta a covered matrix adds in the forward pass
 * (pkv_blk_matmul calls pkv_lora_delta after the base product). docs/lora.md.
 *
 * The file's pairs "<base>.lora_a" ne [in, r] and "<base>.lora_b" ne [r, out] are
 * matrices of r rows of in and of out rows of r: x·Aᵀ then ·Bᵀ is B (A x), the same
 * product the base's x·Wᵀ is. Both are kept as f32 on the model's device; B is
 * multiplied by alpha / r at load (alpha 0: by 1), so at run time a sequence's
 * delta is B' (scale · A x) with its own user scale. */
#include <math.h>
#include <string.h>

#include "base/quant.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/lora.h"

typedef struct lora_pair {
    const pkv_weight *base; /* the model's matrix [out][in] */
    pkv_weight a;           /* f32 [r][in] */
    pkv_weight b;           /* f32 [out][r], times alpha / r */
} lora_pair;

struct pkv_lora {
    const pkv_model *m;
    char label[256];
    float alpha;
    int rank; /* the largest r */
    int n;
    lora_pair *p; /* [n] */
    uint64_t fp;
    pkv_lora *next; /* the model's list (pkv_model.loras) */
};

/* The matrix a tensor name stands for, or NULL with *why saying why not. */
static const pkv_weight *base_of(const pkv_model *m, const char *name, const char **why) {
    *why = "the model has no such matrix";
    if (!strcmp(name, "output.weight")) {
        if (m->tied) {
            *why = "the model's output matrix is the token embedding (tied): adapters on it are not supported";
            return NULL;
        }
        return &m->output;
    }
    int il, n = 0;
    char rest[64];
    if (sscanf(name, "blk.%d.%63s%n", &il, rest, &n) != 2 || name[n] || il < m->hp.layer_base ||
        il - m->hp.layer_base >= m->hp.n_layer)
        return NULL;
    const pkv_layer *ly = &m->layers[il - m->hp.layer_base];
    const pkv_shard_w *sw = &ly->sh[0];
    const bool fused = pkv_arch_ops_of(m->hp.arch)->fused_mats;
    static const char *const k_fused = "a fused or split matrix of this architecture: adapters on it are not supported";
    const pkv_weight *w = NULL;
    if (!strcmp(rest, "attn_q.weight")) {
        if (fused || sw->wq_gate.buf) *why = k_fused;
        else w = &sw->wq;
    } else if (!strcmp(rest, "attn_k.weight")) {
        if (fused) *why = k_fused;
        else w = &sw->wk;
    } else if (!strcmp(rest, "attn_v.weight")) {
        if (fused) *why = k_fused;
        else w = &sw->wv;
    } else if (!strcmp(rest, "attn_output.weight")) {
        w = &sw->wo;
    } else if (!strcmp(rest, "ffn_gate.weight")) {
        if (fused) *why = k_fused;
        else w = &sw->w_gate;
    } else if (!strcmp(rest, "ffn_up.weight")) {
        if (fused) *why = k_fused;
        else w = &sw->w_up;
    } else if (!strcmp(rest, "ffn_down.weight")) {
        w = &sw->w_down;
    } else if (strstr(rest, "_exps.") || !strncmp(rest, "ffn_gate_inp", 12)) {
        *why = "a mixture of experts' matrices are not covered by adapters";
    } else {
        *why = "adapters cover attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down and output only";
    }
    if (w && !w->buf) {
        *why = "the model's layer has no such matrix";
        return NULL;
    }
    return w;
}

/* Upload an f32 copy of t's ne1 rows of ne0, times mul. */
static pkv_status upload(const pkv_model *m, const char *lab, const pkv_gguf_tensor *t, float mul, pkv_weight *w) {
    size_t n = (size_t)t->ne[0] * (size_t)t->ne[1];
    float *tmp = pkv_malloc(n * sizeof *tmp);
    if (!tmp) return pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of memory", lab, t->name);
    pkv_status s = pkv_dequantize_row(t->type, t->data, tmp, (int64_t)n);
    for (size_t i = 0; !s && mul != 1.0f && i < n; i++) tmp[i] *= mul;
    for (size_t i = 0; !s && i < n; i++)
        if (!isfinite(tmp[i])) s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s': element %zu is not finite", lab, t->name, i);
    if (!s) {
        w->buf = pkv_buffer_alloc(m->dev, n * sizeof *tmp);
        if (!w->buf) s = pkv_err(PKV_ERR_NOMEM, "%s: tensor '%s': out of device memory", lab, t->name);
    }
    if (!s) s = pkv_buffer_write(w->buf, 0, tmp, n * sizeof *tmp);
    w->type = PKV_TYPE_F32;
    w->ne0 = t->ne[0];
    w->ne1 = t->ne[1];
    pkv_free(tmp);
    return s;
}

void pkv_lora_free(pkv_lora *a) {
    if (!a) return;
    if (a->m) /* off the model's list */
        for (pkv_lora **p = &((pkv_model *)a->m)->loras; *p; p = &(*p)->next)
            if (*p == a) {
                *p = a->next;
                break;
            }
    for (int i = 0; i < a->n; i++) {
        pkv_buffer_free(a->p[i].a.buf);
        pkv_buffer_free(a->p[i].b.buf);
    }
    pkv_free(a->p);
    pkv_free(a);
}

static pkv_lora *load(pkv_model *m, pkv_gguf *g) {
    const char *lab = pkv_gguf_label(g);
    pkv_lora *a = NULL;
    pkv_status s = PKV_OK;
    const char *str;
    size_t len;
    /* the delta uses the generic matmul, unary and add kernels; tested on the CPU and
     * Vulkan (test-lora-vulkan), not on CUDA */
    const pkv_device_kind kind = pkv_device_get_caps(m->dev)->kind;
    if (m->n_dev != 1 || (kind != PKV_DEVICE_CPU && kind != PKV_DEVICE_VULKAN)) {
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: LoRA adapters run on a model on one CPU or Vulkan device; %s is on %s%s", lab,
                    m->label, pkv_device_name(m->dev), m->n_dev != 1 ? " and others" : "");
        goto fail;
    }
    if (pkv_gguf_get_str(g, "general.type", &str, &len) || len != 7 || memcmp(str, "adapter", 7)) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: not a LoRA adapter (general.type is not \"adapter\")", lab);
        goto fail;
    }
    if (pkv_gguf_get_str(g, "adapter.type", &str, &len) || len != 4 || memcmp(str, "lora", 4)) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: adapter.type is not \"lora\"", lab);
        goto fail;
    }
    if (pkv_gguf_find_key(g, "adapter.alora.invocation_tokens") >= 0) { /* applied only after those tokens: not here */
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: an activated LoRA (adapter.alora.invocation_tokens) is not supported", lab);
        goto fail;
    }
    const char *arch = pkv_arch_name(m->hp.arch);
    if (pkv_gguf_get_str(g, "general.architecture", &str, &len) || len != strlen(arch) || memcmp(str, arch, len)) {
        s = pkv_err(PKV_ERR_MISMATCH, "%s: the adapter's general.architecture is not the model's (%s)", lab, arch);
        goto fail;
    }
    a = pkv_calloc(1, sizeof *a);
    const int64_t nt = pkv_gguf_n_tensors(g);
    if (!a || !(a->p = pkv_calloc((size_t)(nt / 2 + 1), sizeof *a->p))) {
        s = pkv_err(PKV_ERR_NOMEM, "%s: out of memory", lab);
        goto fail;
    }
    snprintf(a->label, sizeof a->label, "%s", lab);
    if (pkv_gguf_find_key(g, "adapter.lora.alpha") >= 0 && (s = pkv_gguf_get_f32(g, "adapter.lora.alpha", &a->alpha))) {
        s = pkv_err_prefix(s, "%s", lab);
        goto fail;
    }
    if (!isfinite(a->alpha) || a->alpha < 0) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: adapter.lora.alpha %g is not a finite value >= 0", lab, (double)a->alpha);
        goto fail;
    }
    uint64_t h = pkv_hash64(&a->alpha, sizeof a->alpha, 0x6c6f7261ull);
    for (int64_t i = 0; i < nt; i++) {
        const pkv_gguf_tensor *ta = pkv_gguf_tensor_at(g, i), *tb;
        size_t nl = strlen(ta->name);
        char name[256];
        if (nl > 7 && !strcmp(ta->name + nl - 7, ".lora_b")) {
            snprintf(name, sizeof name, "%.*s.lora_a", (int)(nl - 7), ta->name);
            if (!pkv_gguf_find_tensor(g, name)) {
                s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has no '%s'", lab, ta->name, name);
                goto fail;
            }
            continue; /* taken with its lora_a */
        }
        if (nl <= 7 || strcmp(ta->name + nl - 7, ".lora_a") || nl - 7 >= sizeof name) {
            s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' is not a '<matrix>.lora_a' or '.lora_b'", lab, ta->name);
            goto fail;
        }
        snprintf(name, sizeof name, "%.*s.lora_b", (int)(nl - 7), ta->name);
        if (!(tb = pkv_gguf_find_tensor(g, name))) {
            s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' has no '%s'", lab, ta->name, name);
            goto fail;
        }
        name[nl - 7] = 0;
        const char *why;
        const pkv_weight *w = base_of(m, name, &why);
        if (!w) {
            s = pkv_err(PKV_ERR_MISMATCH, "%s: tensor '%s': %s (%s)", lab, ta->name, why, m->label);
            goto fail;
        }
        for (const pkv_gguf_tensor *t = ta; t; t = t == ta ? tb : NULL)
            if (t->type != PKV_TYPE_F32 && t->type != PKV_TYPE_F16 && t->type != PKV_TYPE_BF16 && t->type != PKV_TYPE_Q8_0) {
                s = pkv_err(PKV_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s; adapters may be f32, f16, bf16 or q8_0", lab,
                            t->name, pkv_type_name(t->type));
                goto fail;
            }
        const int64_t r = ta->ne[1];
        if (ta->n_dims > 2 || tb->n_dims > 2 || ta->ne[0] != w->ne0 || tb->ne[1] != w->ne1 || tb->ne[0] != r) {
            s = pkv_err(PKV_ERR_MISMATCH, "%s: tensor '%s' pair has shapes lora_a [%lld, %lld], lora_b [%lld, %lld]; the base "
                        "matrix [%lld, %lld] expects lora_a [%lld, r] and lora_b [r, %lld] (another base model?)", lab, name,
                        (long long)ta->ne[0], (long long)ta->ne[1], (long long)tb->ne[0], (long long)tb->ne[1],
                        (long long)w->ne0, (long long)w->ne1, (long long)w->ne0, (long long)w->ne1);
            goto fail;
        }
        for (int k = 0; k < a->n; k++)
            if (a->p[k].base == w) {
                s = pkv_err(PKV_ERR_FORMAT, "%s: tensor '%s' appears twice", lab, ta->name);
                goto fail;
            }
        lora_pair *p = &a->p[a->n];
        p->base = w;
        if ((s = upload(m, lab, ta, 1.0f, &p->a)) ||
            (s = upload(m, lab, tb, a->alpha != 0 ? a->alpha / (float)r : 1.0f, &p->b))) {
            a->n++; /* (its buffers are freed with the rest) */
            goto fail;
        }
        a->n++;
        a->rank = PKV_MAX(a->rank, (int)r);
        h = pkv_hash64(ta->name, nl, h);
        h = pkv_hash64_bulk(ta->data, ta->n_bytes, h);
        h = pkv_hash64_bulk(tb->data, tb->n_bytes, h);
    }
    if (!a->n) {
        s = pkv_err(PKV_ERR_FORMAT, "%s: the adapter has no tensors", lab);
        goto fail;
    }
    a->fp = h ? h : 1;
    a->m = m;
    a->next = m->loras;
    m->loras = a;
    return a;
fail:
    pkv_lora_free(a);
    (void)s;
    return NULL;
}

pkv_lora *pkv_lora_load(pkv_model *m, const char *path) {
    if (!m || !path) {
        pkv_err(PKV_ERR_INVALID, "pkv_lora_load: NULL model or path");
        return NULL;
    }
    pkv_gguf *g = pkv_gguf_open(path);
    if (!g) return NULL;
    pkv_lora *a = load(m, g);
    pkv_gguf_close(g);
    return a;
}

pkv_lora *pkv_lora_load_memory(pkv_model *m, const void *data, size_t size, const char *label) {
    if (!m || !data) {
        pkv_err(PKV_ERR_INVALID, "pkv_lora_load_memory: NULL model or data");
        return NULL;
    }
    pkv_gguf *g = pkv_gguf_open_memory(data, size, label);
    if (!g) return NULL;
    pkv_lora *a = load(m, g);
    pkv_gguf_close(g);
    return a;
}

pkv_status pkv_lora_get_info(const pkv_lora *a, pkv_lora_info *info) {
    if (!a || !info) return pkv_err(PKV_ERR_INVALID, "pkv_lora_get_info: NULL argument");
    *info = (pkv_lora_info){.n_pairs = a->n, .rank = a->rank, .alpha = a->alpha, .fingerprint = a->fp, .label = a->label};
    return PKV_OK;
}

uint64_t pkv_lora_set_fingerprint(const pkv_model *m, const pkv_lora_set *set) {
    uint64_t h = m->fingerprint_base;
    bool any = false;
    for (int i = 0; set && i < set->n; i++) {
        if (set->u[i].scale == 0.0f) continue;
        h = pkv_hash64(&set->u[i].lora->fp, sizeof set->u[i].lora->fp, h);
        h = pkv_hash64(&set->u[i].scale, sizeof set->u[i].scale, h);
        any = true;
    }
    return !any ? m->fingerprint_base : h ? h : 1;
}

pkv_status pkv_lora_set_check(const pkv_model *m, const pkv_lora_use *uses, int n, const char *what) {
    if (n < 0 || n > PKV_MAX_LORA || (n && !uses))
        return pkv_err(PKV_ERR_INVALID, "%s: %d LoRA adapters (at most %d, PKV_MAX_LORA)", what, n, PKV_MAX_LORA);
    for (int i = 0; i < n; i++) {
        if (!uses[i].lora || uses[i].lora->m != m)
            return pkv_err(PKV_ERR_INVALID, "%s: LoRA adapter %d is %s", what, i, uses[i].lora ? "another model's" : "NULL");
        if (!isfinite(uses[i].scale))
            return pkv_err(PKV_ERR_INVALID, "%s: LoRA adapter %d's scale is not finite", what, i);
    }
    return PKV_OK;
}

pkv_status pkv_model_lora_apply(pkv_model *m, const pkv_lora_use *uses, int n) {
    if (!m) return pkv_err(PKV_ERR_INVALID, "pkv_model_lora_apply: NULL model");
    pkv_status s = pkv_lora_set_check(m, uses, n, "pkv_model_lora_apply");
    if (s) return s;
    pkv_lora_set set = {.n = n};
    if (n) memcpy(set.u, uses, (size_t)n * sizeof *uses);
    m->n_lora = n;
    memcpy(m->lora, set.u, sizeof m->lora);
    m->fingerprint = pkv_lora_set_fingerprint(m, &set);
    return PKV_OK;
}

int pkv_model_lora_get(const pkv_model *m, pkv_lora_use *out, int max) {
    if (!m) return 0;
    for (int i = 0; out && i < m->n_lora && i < max; i++) out[i] = m->lora[i];
    return m->n_lora;
}

/* The pair of a covering w, or NULL. */
static const lora_pair *pair_of(const pkv_lora *a, const pkv_weight *w) {
    for (int i = 0; i < a->n; i++)
        if (a->p[i].base == w) return &a->p[i];
    return NULL;
}

static pkv_status grow(pkv_device *dev, pkv_buffer **b, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return PKV_OK;
    size_t c = PKV_MAX(bytes, *cap * 2);
    pkv_buffer *nb = pkv_buffer_alloc(dev, c);
    if (!nb) return pkv_err(PKV_ERR_NOMEM, "forward: LoRA workspace of %zu bytes", c);
    pkv_buffer_free(*b);
    *b = nb;
    *cap = c;
    return PKV_OK;
}

pkv_status pkv_lora_step(pkv_fwd *f, const pkv_lora_set **sets) {
    const pkv_fwd_batch *b = f->b;
    const pkv_model *m = f->m;
    f->lora = NULL;
    bool any = false;
    for (int i = 0; i < b->n_seqs; i++) {
        const pkv_lora_set *s = b->lora && b->lora[i] ? b->lora[i] : NULL;
        sets[i] = s ? s : NULL;
        int n = s ? s->n : m->n_lora;
        const pkv_lora_use *u = s ? s->u : m->lora;
        for (int j = 0; j < n; j++) any |= u[j].scale != 0.0f;
    }
    if (!any) return PKV_OK;
    if (m->n_dev != 1) return pkv_err(PKV_ERR_UNSUPPORTED, "forward: LoRA adapters on a model split over devices");
    /* every sequence's scales, [n_seqs][PKV_MAX_LORA], and room for the products */
    pkv_fwd_ws *ws = f->ws;
    const size_t ns = (size_t)b->n_seqs;
    float *sc = pkv_calloc(ns * PKV_MAX_LORA, sizeof *sc);
    if (!sc) return pkv_err(PKV_ERR_NOMEM, "forward: LoRA scales");
    int64_t rmax = 1, omax = 1;
    for (size_t i = 0; i < ns; i++) {
        int n = sets[i] ? sets[i]->n : m->n_lora;
        const pkv_lora_use *u = sets[i] ? sets[i]->u : m->lora;
        for (int j = 0; j < n; j++) {
            sc[i * PKV_MAX_LORA + (size_t)j] = u[j].scale;
            rmax = PKV_MAX(rmax, u[j].lora->rank);
            for (int k = 0; k < u[j].lora->n; k++) omax = PKV_MAX(omax, u[j].lora->p[k].b.ne1);
        }
    }
    const int64_t rows = PKV_MAX(f->T, f->pl->n_out);
    pkv_status s;
    if ((s = grow(m->dev, &ws->lora_s, &ws->lora_s_cap, ns * PKV_MAX_LORA * sizeof *sc)) ||
        (s = grow(m->dev, &ws->lora_t, &ws->lora_t_cap, (size_t)rows * (size_t)rmax * 4)) ||
        (s = grow(m->dev, &ws->lora_d, &ws->lora_d_cap, (size_t)rows * (size_t)omax * 4)) ||
        (s = pkv_buffer_write(ws->lora_s, 0, sc, ns * PKV_MAX_LORA * sizeof *sc))) {
        pkv_free(sc);
        return s;
    }
    pkv_free(sc);
    f->lora = sets;
    return PKV_OK;
}

/* Sequence i's set: its own, or the model's default. */
static const pkv_lora_use *uses_of(const pkv_fwd *f, int i, int *n) {
    const pkv_lora_set *set = f->lora[i];
    *n = set ? set->n : f->m->n_lora;
    return set ? set->u : f->m->lora;
}

static bool same_uses(const pkv_lora_use *a, int na, const pkv_lora_use *b, int nb) {
    if (na != nb) return false;
    for (int j = 0; j < na; j++)
        if (a[j].lora != b[j].lora || memcmp(&a[j].scale, &b[j].scale, sizeof a[j].scale)) return false;
    return true;
}

pkv_status pkv_lora_delta(const pkv_fwd *f, pkv_device *dev, const pkv_weight *w, pkv_buffer *x, pkv_buffer *y, int64_t T) {
    const pkv_fwd_batch *b = f->b;
    const bool out_rows = T != f->T; /* the head's: each sequence's logits rows */
    if (out_rows && T != f->pl->n_out) return PKV_OK; /* (no other row sets take adapters) */
    pkv_fwd_ws *ws = f->ws;
    const size_t in = (size_t)w->ne0, out = (size_t)w->ne1;
    int64_t r0 = 0;
    /* runs of consecutive sequences with the same set take their deltas together
     * (the kernels are batch-invariant: a row's result does not depend on the run) */
    for (int i = 0; i < b->n_seqs;) {
        int nu, k = i;
        const pkv_lora_use *u = uses_of(f, i, &nu);
        int64_t n = 0;
        for (;;) {
            const int64_t nt = b->n_tokens[k];
            n += !out_rows ? nt : b->n_logits ? b->n_logits[k] : b->all_logits ? nt : 1;
            if (++k == b->n_seqs) break;
            int nk;
            const pkv_lora_use *uk = uses_of(f, k, &nk);
            if (!same_uses(u, nu, uk, nk)) break;
        }
        for (int j = 0; j < nu; j++) {
            const lora_pair *p;
            if (u[j].scale == 0.0f || !(p = pair_of(u[j].lora, w))) continue;
            const int64_t r = p->a.ne1;
            pkv_k_matmul_args ma = {.w = pkv_tref_make(p->a.buf, 0), .wtype = PKV_TYPE_F32, .rows = r, .cols = p->a.ne0,
                                    .x = pkv_tref_make(x, (size_t)r0 * in * 4), .y = pkv_tref_make(ws->lora_t, 0), .n = n};
            pkv_k_unary_args sa = {.x = pkv_tref_make(ws->lora_t, 0), .y = pkv_tref_make(ws->lora_t, 0), .n = n * r,
                                   .op = PKV_UNARY_ID, .mul = pkv_tref_make(ws->lora_s, ((size_t)i * PKV_MAX_LORA + (size_t)j) * 4),
                                   .mul_len = 1};
            pkv_k_matmul_args mb = {.w = pkv_tref_make(p->b.buf, 0), .wtype = PKV_TYPE_F32, .rows = p->b.ne1, .cols = r,
                                    .x = pkv_tref_make(ws->lora_t, 0), .y = pkv_tref_make(ws->lora_d, 0), .n = n};
            pkv_k_add_args ad = {.a = pkv_tref_make(y, (size_t)r0 * out * 4), .b = pkv_tref_make(ws->lora_d, 0),
                                 .y = pkv_tref_make(y, (size_t)r0 * out * 4), .n = n * (int64_t)out, .b_len = n * (int64_t)out};
            pkv_status s;
            if ((s = pkv_k_matmul(dev, &ma)) || (s = pkv_k_unary(dev, &sa)) || (s = pkv_k_matmul(dev, &mb)) ||
                (s = pkv_k_add(dev, &ad)))
                return s;
        }
        r0 += n;
        i = k;
    }
    return PKV_OK;
}
