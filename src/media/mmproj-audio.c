/* Audio projectors: Voxtral (projector type "voxtral"), as Hugging Face
 * transformers' modeling_voxtral.py defines it, read from the mmproj GGUF that
 * llama.cpp's convert_hf_to_gguf.py --mmproj writes (docs/multimodal.md).
 *
 * Keys (clip.audio.*):
 *   embedding_length d, feed_forward_length n_ff, block_count, attention.head_count,
 *   attention.layer_norm_epsilon (default 1e-5), num_mel_bins, projection_dim (the text
 *   model's width), projector.stack_factor (4: frames concatenated per output row).
 * Tensors (GGUF ne, innermost first):
 *   a.conv1d.1.weight [3, n_mel, d]  a.conv1d.1.bias [1, d] (or [d])
 *   a.conv1d.2.weight [3, d, d]      a.conv1d.2.bias [1, d] (or [d])
 *   a.position_embd.weight [d, n_pos >= 1500]
 *   a.blk.N.{ln1,ln2}.{weight,bias} [d]
 *   a.blk.N.attn_q.{weight [d, d], bias [d]}  a.blk.N.attn_k.weight [d, d] (a bias optional)
 *   a.blk.N.attn_v.{weight, bias}  a.blk.N.attn_out.{weight, bias}
 *   a.blk.N.ffn_up.{weight [d, n_ff], bias [n_ff]}  a.blk.N.ffn_down.{weight [n_ff, d], bias [d]}
 *   a.post_ln.{weight,bias} [d]
 *   mm.a.mlp.1.weight [stack * d, n_embd]  mm.a.mlp.2.weight [n_embd, n_embd] (biases optional)
 *
 * The model, per 30-second window of 3000 log-mel frames (audio-mel.h):
 *   conv1d(k3, s1, pad 1) + GELU, conv1d(k3, s2, pad 1) + GELU -> 1500 frames of d,
 *   + positional embeddings, pre-LN transformer blocks (LayerNorm with bias; attention
 *   with q, v biases and none on k, every frame seeing all frames; GELU MLP), a final
 *   LayerNorm, then the projector: 4 consecutive frames concatenated (375 rows of
 *   4 d), linear, GELU, linear into the text width. GELU is the exact (erf) form.
 *
 * On the device: the first conv is a matmul over a host im2col of the mel window
 * (rows [mel(t-1) | mel(t) | mel(t+1)], the weight reordered to match); the second,
 * with stride 2, is two matmuls over the frame pairs [h(2t) | h(2t+1)] (the rows of
 * the first conv's output read two at a time): one with the taps k = 1, 2, one with
 * the tap k = 0 that reads the second frame of the previous pair, added one row down.
 * The attention is the paged attention kernel over an f32 page pool that is the K
 * and V matmul outputs themselves (pages 0, 1, ... in order), each query seeing all
 * 1500 tokens. */
#include "media/media-impl.h"

#include "base/quant.h"
#include "device/device.h"
#include "media/audio-mel.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_POS 1500 /* frames per window after the stride-2 conv */
#define PAGE 16    /* tokens per page of the encoder's K/V pool */
#define ALIGN_W 256
/* Weights go into device buffers of at most this many bytes (a tensor larger
 * than this gets a buffer of its own, as the model loader gives each tensor):
 * one buffer for all could exceed a device's maxMemoryAllocationSize. Small,
 * so the test projector (under 1 MiB) spans several buffers too. */
#define CHUNK ((size_t)256 << 10)
#define MAX_CHUNKS 4096

typedef struct {
    size_t off; /* bytes into the weight buffer */
    pkv_type type;
    bool on; /* present */
} wref;

typedef struct {
    wref ln1_w, ln1_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b;
} layer;

typedef struct {
    int n_mel, d, n_ff, n_layer, n_head, stack, n_embd;
    float eps;
    /* every weight: buffer c holds bytes [base[c], base[c + 1]) of the weight image
     * (base[n_w] = its size); a wref's off is into the image */
    pkv_buffer *w[MAX_CHUNKS];
    size_t base[MAX_CHUNKS + 1];
    int n_w;
    wref conv1_w; /* f32 [d][3][n_mel] (tap-major: matches the im2col rows) */
    wref conv1_b;
    wref conv2_w12; /* f32 [d][2][d]: taps 1, 2 over the pair [h(2t), h(2t+1)] */
    wref conv2_w0;  /* f32 [d][2][d]: zeros, then tap 0 over h(2t+1) (the next row's h(2t'-1)) */
    wref conv2_b, pos; /* pos: f32 [1500][d] */
    layer *L;
    wref post_w, post_b, mm1_w, mm1_b, mm2_w, mm2_b;
} enc;

/* ------------------------------------------------------------- loading */

typedef struct {
    const pkv_gguf *g;
    enc *e;
    uint8_t *host; /* staging image of the weight buffer (NULL: first pass, sizes only) */
    size_t size;
    pkv_device *dev;
    uint64_t fp; /* fingerprint */
    bool too_many; /* more than MAX_CHUNKS buffers needed */
} loader;

static pkv_status key_u32(const pkv_gguf *g, const char *key, int lo, int hi, int *out) {
    uint32_t v;
    if (pkv_gguf_find_key(g, key) < 0) return pkv_err(PKV_ERR_FORMAT, "voxtral projector: key '%s' is missing", key);
    pkv_status s = pkv_gguf_get_u32(g, key, &v);
    if (s) return pkv_err_prefix(s, "voxtral projector: key '%s'", key);
    if ((int64_t)v < lo || (int64_t)v > hi)
        return pkv_err(PKV_ERR_FORMAT, "voxtral projector: key '%s' is %u, expected %d..%d", key, v, lo, hi);
    *out = (int)v;
    return PKV_OK;
}

static size_t reserve(loader *ld, size_t bytes) {
    enc *e = ld->e;
    size_t off = (ld->size + ALIGN_W - 1) / ALIGN_W * ALIGN_W;
    if (e->n_w == 0 || (off + bytes - e->base[e->n_w - 1] > CHUNK && off > e->base[e->n_w - 1])) {
        if (e->n_w == MAX_CHUNKS)
            ld->too_many = true;
        else
            e->base[e->n_w++] = off;
    }
    ld->size = off + bytes;
    return off;
}

/* The tensor `name` with ne == (n0, n1, n2) (n2 0: 2-D; n1 0: a vector of n0, also
 * accepted as [1, n0] or [n0, 1]); NULL when missing and optional. */
static pkv_status find3(loader *ld, const char *name, int64_t n0, int64_t n1, int64_t n2, bool optional,
                        const pkv_gguf_tensor **out) {
    *out = pkv_gguf_find_tensor(ld->g, name);
    if (!*out) {
        if (optional) return PKV_OK;
        return pkv_err(PKV_ERR_FORMAT, "voxtral projector: tensor '%s' is missing", name);
    }
    const pkv_gguf_tensor *t = *out;
    bool ok;
    if (n1 == 0)
        ok = t->n_elements == (uint64_t)n0 && (t->ne[0] == n0 || t->ne[1] == n0) && t->ne[2] == 1 && t->ne[3] == 1;
    else
        ok = t->ne[0] == n0 && t->ne[1] == n1 && t->ne[2] == (n2 ? n2 : 1) && t->ne[3] == 1;
    if (!ok) {
        char want[96];
        if (n1 == 0)
            snprintf(want, sizeof want, "%lld elements", (long long)n0);
        else if (n2 == 0)
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)n0, (long long)n1);
        else
            snprintf(want, sizeof want, "[%lld, %lld, %lld]", (long long)n0, (long long)n1, (long long)n2);
        return pkv_err(PKV_ERR_FORMAT, "voxtral projector: tensor '%s' has shape [%lld, %lld, %lld], expected %s", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], want);
    }
    ld->fp = pkv_hash64(name, strlen(name), ld->fp);
    ld->fp = pkv_hash64(t->ne, sizeof t->ne, ld->fp);
    ld->fp = pkv_hash64(&t->type, sizeof t->type, ld->fp);
    if (ld->host) ld->fp = pkv_hash64_bulk(t->data, t->n_bytes, ld->fp); /* all of it (see the vision projector) */
    return PKV_OK;
}

static pkv_status find(loader *ld, const char *name, int64_t n0, int64_t n1, bool optional,
                       const pkv_gguf_tensor **out) {
    return find3(ld, name, n0, n1, 0, optional, out);
}

/* The whole tensor as f32 (any type the dequantizer knows). */
static pkv_status to_f32(const pkv_gguf_tensor *t, float *dst) {
    pkv_status s = pkv_dequantize_row(t->type, t->data, dst, (int64_t)t->n_elements);
    if (s) return pkv_err_prefix(s, "voxtral projector: tensor '%s' of type %s", t->name, pkv_type_name(t->type));
    return PKV_OK;
}

/* A vector (norm weight, bias), stored as f32. */
static pkv_status vec(loader *ld, wref *r, const char *name, int64_t n, bool optional) {
    const pkv_gguf_tensor *t;
    pkv_status s = find(ld, name, n, 0, optional, &t);
    if (s || !t) return s;
    r->on = true;
    r->type = PKV_TYPE_F32;
    r->off = reserve(ld, (size_t)n * 4);
    return ld->host ? to_f32(t, (float *)(void *)(ld->host + r->off)) : PKV_OK;
}

/* A matrix [rows][cols] (GGUF ne [cols, rows]) used by matmul in its own type. */
static pkv_status mat(loader *ld, wref *r, const char *name, int64_t cols, int64_t rows, bool optional) {
    const pkv_gguf_tensor *t;
    pkv_status s = find(ld, name, cols, rows, optional, &t);
    if (s || !t) return s;
    if (!pkv_device_supports_weight(ld->dev, t->type))
        return pkv_err(PKV_ERR_UNSUPPORTED, "voxtral projector: tensor '%s' has type %s, which %s cannot multiply", name,
                       pkv_type_name(t->type), pkv_device_name(ld->dev));
    r->on = true;
    r->type = t->type;
    r->off = reserve(ld, t->n_bytes);
    if (ld->host) memcpy(ld->host + r->off, t->data, t->n_bytes);
    return PKV_OK;
}

static pkv_status convs(loader *ld) {
    enc *e = ld->e;
    const int d = e->d, nm = e->n_mel;
    const pkv_gguf_tensor *c1, *c2;
    pkv_status s;
    if ((s = find3(ld, "a.conv1d.1.weight", 3, nm, d, false, &c1))) return s;
    if ((s = find3(ld, "a.conv1d.2.weight", 3, d, d, false, &c2))) return s;
    e->conv1_w = (wref){reserve(ld, (size_t)d * 3 * nm * 4), PKV_TYPE_F32, true};
    e->conv2_w12 = (wref){reserve(ld, (size_t)d * 2 * d * 4), PKV_TYPE_F32, true};
    e->conv2_w0 = (wref){reserve(ld, (size_t)d * 2 * d * 4), PKV_TYPE_F32, true};
    if ((s = vec(ld, &e->conv1_b, "a.conv1d.1.bias", d, false))) return s;
    if ((s = vec(ld, &e->conv2_b, "a.conv1d.2.bias", d, false))) return s;
    if (!ld->host) return PKV_OK;
    /* HF's Conv1d weight [out][in][tap] -> [out][tap][in] */
    size_t big = (size_t)d * 3 * (size_t)(nm > d ? nm : d);
    float *tmp = pkv_malloc(big * 4);
    if (!tmp) return pkv_err(PKV_ERR_NOMEM, "voxtral projector: out of memory");
    if ((s = to_f32(c1, tmp))) goto out;
    float *w1 = (float *)(void *)(ld->host + e->conv1_w.off);
    for (int o = 0; o < d; o++)
        for (int c = 0; c < nm; c++)
            for (int k = 0; k < 3; k++) w1[((size_t)o * 3 + k) * nm + c] = tmp[((size_t)o * nm + c) * 3 + k];
    if ((s = to_f32(c2, tmp))) goto out;
    float *w12 = (float *)(void *)(ld->host + e->conv2_w12.off), *w0 = (float *)(void *)(ld->host + e->conv2_w0.off);
    for (int o = 0; o < d; o++)
        for (int c = 0; c < d; c++) {
            const float *src = tmp + ((size_t)o * d + c) * 3;
            w12[((size_t)o * 2 + 0) * d + c] = src[1];
            w12[((size_t)o * 2 + 1) * d + c] = src[2];
            w0[((size_t)o * 2 + 0) * d + c] = 0.0f;
            w0[((size_t)o * 2 + 1) * d + c] = src[0];
        }
out:
    pkv_free(tmp);
    return s;
}

static pkv_status tensors(loader *ld) {
    enc *e = ld->e;
    const int d = e->d;
    pkv_status s;
    char n[96];
    if ((s = convs(ld))) return s;
    const pkv_gguf_tensor *pe = pkv_gguf_find_tensor(ld->g, "a.position_embd.weight");
    if (!pe) return pkv_err(PKV_ERR_FORMAT, "voxtral projector: tensor 'a.position_embd.weight' is missing");
    if (pe->ne[0] != d || pe->ne[1] < N_POS || pe->ne[2] != 1)
        return pkv_err(PKV_ERR_FORMAT, "voxtral projector: tensor 'a.position_embd.weight' has shape [%lld, %lld], expected [%d, >= %d]",
                       (long long)pe->ne[0], (long long)pe->ne[1], d, N_POS);
    if ((s = find(ld, "a.position_embd.weight", d, pe->ne[1], false, &pe))) return s;
    e->pos = (wref){reserve(ld, (size_t)N_POS * d * 4), PKV_TYPE_F32, true};
    if (ld->host) {
        float *all = pkv_malloc((size_t)pe->n_elements * 4);
        if (!all) return pkv_err(PKV_ERR_NOMEM, "voxtral projector: out of memory");
        s = to_f32(pe, all);
        if (!s) memcpy(ld->host + e->pos.off, all, (size_t)N_POS * d * 4);
        pkv_free(all);
        if (s) return s;
    }
    for (int i = 0; i < e->n_layer; i++) {
        layer *l = &e->L[i];
#define V(field, suffix, len, opt)                                                                  \
    snprintf(n, sizeof n, "a.blk.%d." suffix, i);                                                   \
    if ((s = vec(ld, &l->field, n, len, opt))) return s;
#define M(field, suffix, cols, rows)                                                                \
    snprintf(n, sizeof n, "a.blk.%d." suffix, i);                                                   \
    if ((s = mat(ld, &l->field, n, cols, rows, false))) return s;
        V(ln1_w, "ln1.weight", d, false)
        V(ln1_b, "ln1.bias", d, false)
        M(q_w, "attn_q.weight", d, d)
        V(q_b, "attn_q.bias", d, false)
        M(k_w, "attn_k.weight", d, d)
        V(k_b, "attn_k.bias", d, true)
        M(v_w, "attn_v.weight", d, d)
        V(v_b, "attn_v.bias", d, false)
        M(o_w, "attn_out.weight", d, d)
        V(o_b, "attn_out.bias", d, false)
        V(ln2_w, "ln2.weight", d, false)
        V(ln2_b, "ln2.bias", d, false)
        M(up_w, "ffn_up.weight", d, e->n_ff)
        V(up_b, "ffn_up.bias", e->n_ff, false)
        M(down_w, "ffn_down.weight", e->n_ff, d)
        V(down_b, "ffn_down.bias", d, false)
#undef V
#undef M
    }
    if ((s = vec(ld, &e->post_w, "a.post_ln.weight", d, false))) return s;
    if ((s = vec(ld, &e->post_b, "a.post_ln.bias", d, false))) return s;
    if ((s = mat(ld, &e->mm1_w, "mm.a.mlp.1.weight", (int64_t)e->stack * d, e->n_embd, false))) return s;
    if ((s = vec(ld, &e->mm1_b, "mm.a.mlp.1.bias", e->n_embd, true))) return s;
    if ((s = mat(ld, &e->mm2_w, "mm.a.mlp.2.weight", e->n_embd, e->n_embd, false))) return s;
    return vec(ld, &e->mm2_b, "mm.a.mlp.2.bias", e->n_embd, true);
}

static void enc_free(pkv_mmproj *p) {
    enc *e = p->enc;
    if (!e) return;
    for (int c = 0; c < e->n_w; c++) pkv_buffer_free(e->w[c]);
    pkv_free(e->L);
    pkv_free(e);
    p->enc = NULL;
}

/* ------------------------------------------------------------- encoding */

static pkv_status n_rows(const pkv_mmproj *p, const pkv_media *m, int64_t *out) {
    const enc *e = p->enc;
    *out = pkv_mel_n_windows(m->n_samples) * (N_POS / e->stack);
    return PKV_OK;
}

typedef struct {
    pkv_buffer *x1, *h1, *h, *xn, *q, *k, *v, *a, *t, *f, *p1, *out, *meta;
    int n_pages;
} scratch;

static void scratch_free(scratch *s) {
    pkv_buffer *all[] = {s->x1, s->h1, s->h, s->xn, s->q, s->k, s->v, s->a, s->t, s->f, s->p1, s->out, s->meta};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pkv_buffer_free(all[i]);
}

#define TRY(x)                                                                                      \
    do {                                                                                            \
        pkv_status _s = (x);                                                                        \
        if (_s) return _s;                                                                          \
    } while (0)

static pkv_tref W(const enc *e, wref r) {
    int c = e->n_w - 1;
    while (c > 0 && e->base[c] > r.off) c--;
    return pkv_tref_make(e->w[c], r.off - e->base[c]);
}
static pkv_tref B0(pkv_buffer *b) { return pkv_tref_make(b, 0); }

static pkv_status mm(pkv_device *dev, const enc *e, wref w, int64_t rows, int64_t cols, pkv_buffer *x, size_t xoff,
                     int64_t n, pkv_buffer *y) {
    pkv_k_matmul_args a = {W(e, w), w.type, rows, cols, pkv_tref_make(x, xoff), B0(y), n};
    return pkv_k_matmul(dev, &a);
}

/* y[n][len] += bias (when present) */
static pkv_status bias(pkv_device *dev, const enc *e, wref b, pkv_buffer *y, int64_t n, int64_t len) {
    if (!b.on) return PKV_OK;
    pkv_k_add_args a = {B0(y), W(e, b), B0(y), n * len, len};
    return pkv_k_add(dev, &a);
}

/* y = gelu_erf(y + bias) in place */
static pkv_status gelu_bias(pkv_device *dev, const enc *e, wref b, pkv_buffer *y, int64_t n, int64_t len) {
    pkv_k_unary_args a = {.x = B0(y), .y = B0(y), .n = n * len, .op = PKV_UNARY_GELU_ERF};
    if (b.on) {
        a.bias = W(e, b);
        a.bias_len = len;
    }
    return pkv_k_unary(dev, &a);
}

static pkv_status lnorm(pkv_device *dev, const enc *e, wref w, wref b, pkv_buffer *x, pkv_buffer *y, int64_t n) {
    pkv_k_layer_norm_args a = {B0(x), B0(y), W(e, w), W(e, b), n, e->d, e->eps};
    return pkv_k_layer_norm(dev, &a);
}

static pkv_status add_to(pkv_device *dev, pkv_buffer *y, pkv_buffer *b, int64_t n) {
    pkv_k_add_args a = {B0(y), B0(b), B0(y), n, n};
    return pkv_k_add(dev, &a);
}

static pkv_status window(pkv_mmproj *p, scratch *S, const float *x1host, float *out) {
    const enc *e = p->enc;
    pkv_device *dev = p->dev;
    const int64_t d = e->d, nm = e->n_mel, T = PKV_MEL_WINDOW_FRAMES, n_out = N_POS / e->stack;
    TRY(pkv_buffer_write(S->x1, 0, x1host, (size_t)T * 3 * nm * 4));
    /* conv1 + GELU: h1 [3000][d] */
    TRY(mm(dev, e, e->conv1_w, d, 3 * nm, S->x1, 0, T, S->h1));
    TRY(gelu_bias(dev, e, e->conv1_b, S->h1, T, d));
    /* conv2 (stride 2) + GELU: the pairs [h1(2t), h1(2t+1)] are the rows of h1 read as [1500][2d] */
    TRY(mm(dev, e, e->conv2_w12, d, 2 * d, S->h1, 0, N_POS, S->q));
    TRY(mm(dev, e, e->conv2_w0, d, 2 * d, S->h1, 0, N_POS, S->t));
    {
        pkv_k_add_args a = {pkv_tref_make(S->q, (size_t)d * 4), B0(S->t), pkv_tref_make(S->q, (size_t)d * 4),
                            (N_POS - 1) * d, (N_POS - 1) * d};
        TRY(pkv_k_add(dev, &a));
    }
    TRY(gelu_bias(dev, e, e->conv2_b, S->q, N_POS, d));
    {
        pkv_k_add_args a = {B0(S->q), W(e, e->pos), B0(S->h), N_POS * d, N_POS * d};
        TRY(pkv_k_add(dev, &a));
    }
    const int dh = (int)(d / e->n_head);
    for (int i = 0; i < e->n_layer; i++) {
        const layer *l = &e->L[i];
        TRY(lnorm(dev, e, l->ln1_w, l->ln1_b, S->h, S->xn, N_POS));
        TRY(mm(dev, e, l->q_w, d, d, S->xn, 0, N_POS, S->q));
        TRY(bias(dev, e, l->q_b, S->q, N_POS, d));
        TRY(mm(dev, e, l->k_w, d, d, S->xn, 0, N_POS, S->k));
        TRY(bias(dev, e, l->k_b, S->k, N_POS, d));
        TRY(mm(dev, e, l->v_w, d, d, S->xn, 0, N_POS, S->v));
        TRY(bias(dev, e, l->v_b, S->v, N_POS, d));
        pkv_k_attention_args at = {.q = B0(S->q), .k = B0(S->k), .v = B0(S->v), .out = B0(S->a), .meta = B0(S->meta),
                                   .k_type = PKV_TYPE_F32, .v_type = PKV_TYPE_F32, .n_q = N_POS, .n_seq = 1,
                                   .meta_pages = S->n_pages, .n_pages = S->n_pages, .page_size = PAGE,
                                   .n_head = e->n_head, .n_kv = e->n_head, .dk = dh, .dv = dh,
                                   .scale = 1.0f / sqrtf((float)dh)};
        TRY(pkv_k_attention(dev, &at));
        TRY(mm(dev, e, l->o_w, d, d, S->a, 0, N_POS, S->t));
        TRY(bias(dev, e, l->o_b, S->t, N_POS, d));
        TRY(add_to(dev, S->h, S->t, N_POS * d));
        TRY(lnorm(dev, e, l->ln2_w, l->ln2_b, S->h, S->xn, N_POS));
        TRY(mm(dev, e, l->up_w, e->n_ff, d, S->xn, 0, N_POS, S->f));
        TRY(gelu_bias(dev, e, l->up_b, S->f, N_POS, e->n_ff));
        TRY(mm(dev, e, l->down_w, d, e->n_ff, S->f, 0, N_POS, S->t));
        TRY(bias(dev, e, l->down_b, S->t, N_POS, d));
        TRY(add_to(dev, S->h, S->t, N_POS * d));
    }
    TRY(lnorm(dev, e, e->post_w, e->post_b, S->h, S->h, N_POS));
    /* projector: stack consecutive frames (h read as [375][4d]), linear, GELU, linear */
    TRY(mm(dev, e, e->mm1_w, e->n_embd, (int64_t)e->stack * d, S->h, 0, n_out, S->p1));
    TRY(gelu_bias(dev, e, e->mm1_b, S->p1, n_out, e->n_embd));
    TRY(mm(dev, e, e->mm2_w, e->n_embd, e->n_embd, S->p1, 0, n_out, S->out));
    TRY(bias(dev, e, e->mm2_b, S->out, n_out, e->n_embd));
    return pkv_buffer_read(S->out, 0, out, (size_t)n_out * (size_t)e->n_embd * 4);
}

static pkv_status scratch_alloc(pkv_device *dev, const enc *e, scratch *S) {
    const size_t d = (size_t)e->d, n_out = (size_t)(N_POS / e->stack);
    S->n_pages = (N_POS + PAGE - 1) / PAGE;
    const size_t kv_rows = (size_t)S->n_pages * PAGE;
    struct {
        pkv_buffer **b;
        size_t bytes;
    } want[] = {
        {&S->x1, (size_t)PKV_MEL_WINDOW_FRAMES * 3 * (size_t)e->n_mel * 4},
        {&S->h1, (size_t)PKV_MEL_WINDOW_FRAMES * d * 4},
        {&S->h, N_POS * d * 4},
        {&S->xn, N_POS * d * 4},
        {&S->q, N_POS * d * 4},
        {&S->k, kv_rows * d * 4},
        {&S->v, kv_rows * d * 4},
        {&S->a, N_POS * d * 4},
        {&S->t, N_POS * d * 4},
        {&S->f, N_POS * (size_t)e->n_ff * 4},
        {&S->p1, n_out * (size_t)e->n_embd * 4},
        {&S->out, n_out * (size_t)e->n_embd * 4},
        {&S->meta, (size_t)(2 * N_POS + 2 + S->n_pages) * 4},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].b = pkv_buffer_alloc(dev, want[i].bytes);
        if (!*want[i].b)
            return pkv_err_prefix(pkv_errcode(), "voxtral encoder: %zu bytes of scratch on %s", want[i].bytes,
                                  pkv_device_name(dev));
    }
    /* the pool's rows past the last token are never visible; zeros all the same */
    TRY(pkv_buffer_fill(S->k, 0, kv_rows * d * 4, 0));
    TRY(pkv_buffer_fill(S->v, 0, kv_rows * d * 4, 0));
    /* one sequence owning pages 0..n_pages-1 in order; every query sees all N_POS tokens */
    int32_t *meta = pkv_malloc((size_t)(2 * N_POS + 2 + S->n_pages) * 4);
    if (!meta) return pkv_err(PKV_ERR_NOMEM, "voxtral encoder: out of memory");
    for (int i = 0; i < N_POS; i++) {
        meta[i] = 0;
        meta[N_POS + i] = N_POS;
    }
    meta[2 * N_POS] = 0;
    meta[2 * N_POS + 1] = S->n_pages;
    for (int i = 0; i < S->n_pages; i++) meta[2 * N_POS + 2 + i] = i;
    pkv_status s = pkv_buffer_write(S->meta, 0, meta, (size_t)(2 * N_POS + 2 + S->n_pages) * 4);
    pkv_free(meta);
    return s;
}

/* An encoding in slices: the log-mel one window a step (its floor is relative to
 * the loudest frame of all of it, so every window's comes first), then one
 * 30-second window of the encoder a step. */
typedef struct job {
    const pkv_media *m;
    float *mel, *x1, *out;
    scratch S;
    int64_t n_win, n_frames, w, mel_w;
    double gmax;
} job;

static void job_end(pkv_mmproj *p, void *state) {
    (void)p;
    job *j = state;
    if (!j) return;
    scratch_free(&j->S);
    pkv_free(j->mel);
    pkv_free(j->x1);
    pkv_free(j);
}

static pkv_status job_begin(pkv_mmproj *p, const pkv_media *m, float *out, void **state) {
    const enc *e = p->enc;
    *state = NULL;
    job *j = pkv_calloc(1, sizeof *j);
    if (!j) return pkv_err(PKV_ERR_NOMEM, "voxtral encoder: out of memory");
    const int64_t T = PKV_MEL_WINDOW_FRAMES, nm = e->n_mel;
    j->n_win = pkv_mel_n_windows(m->n_samples);
    j->n_frames = j->n_win * T;
    j->out = out;
    j->m = m;
    j->gmax = -INFINITY;
    j->mel = pkv_malloc((size_t)nm * (size_t)j->n_frames * 4);
    j->x1 = pkv_malloc((size_t)T * 3 * (size_t)nm * 4);
    pkv_status s = PKV_OK;
    if (!j->mel || !j->x1)
        s = pkv_err(PKV_ERR_NOMEM, "voxtral encoder: out of memory for %lld mel frames", (long long)j->n_frames);
    if (!s) s = scratch_alloc(p->dev, e, &j->S);
    if (s) {
        pkv_err_prefix(s, "voxtral encoder on %s", pkv_device_name(p->dev));
        job_end(p, j);
        return s;
    }
    *state = j;
    return PKV_OK;
}

static pkv_status job_step(pkv_mmproj *p, void *state, bool *done) {
    const enc *e = p->enc;
    job *j = state;
    const int64_t T = PKV_MEL_WINDOW_FRAMES, nm = e->n_mel, n_out = N_POS / e->stack, w = j->w;
    *done = false;
    if (j->mel_w < j->n_win) { /* the log-mel of one window */
        pkv_status s = pkv_audio_log_mel_frames(j->m->samples, j->m->n_samples, (int)nm, j->mel, j->mel_w * T,
                                                (j->mel_w + 1) * T, &j->gmax);
        if (s) return pkv_err_prefix(s, "voxtral encoder");
        if (++j->mel_w == j->n_win) pkv_audio_log_mel_finish(j->m->n_samples, (int)nm, j->mel, j->gmax);
        return PKV_OK;
    }
    /* im2col: row t = [mel(t-1) | mel(t) | mel(t+1)] of this window, zeros outside it */
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < 3; k++) {
            const int64_t tt = t + k - 1;
            float *dst = j->x1 + ((size_t)t * 3 + (size_t)k) * (size_t)nm;
            for (int64_t c = 0; c < nm; c++)
                dst[c] = tt < 0 || tt >= T ? 0.0f : j->mel[(size_t)c * (size_t)j->n_frames + (size_t)(w * T + tt)];
        }
    pkv_status s = window(p, &j->S, j->x1, j->out + (size_t)w * (size_t)n_out * (size_t)e->n_embd);
    if (s) return pkv_err_prefix(s, "voxtral encoder on %s", pkv_device_name(p->dev));
    *done = ++j->w >= j->n_win;
    return PKV_OK;
}

static pkv_status encode(pkv_mmproj *p, const pkv_media *m, float *out, int64_t n_rows_) {
    (void)n_rows_;
    void *st = NULL;
    pkv_status s = job_begin(p, m, out, &st);
    for (bool done = false; !s && !done;) s = job_step(p, st, &done);
    job_end(p, st);
    return s;
}

/* ------------------------------------------------------------- open */

static pkv_status hparams(const pkv_gguf *g, enc *e) {
    TRY(key_u32(g, "clip.audio.embedding_length", 1, 1 << 16, &e->d));
    TRY(key_u32(g, "clip.audio.feed_forward_length", 1, 1 << 18, &e->n_ff));
    TRY(key_u32(g, "clip.audio.block_count", 1, 1024, &e->n_layer));
    TRY(key_u32(g, "clip.audio.attention.head_count", 1, 1024, &e->n_head));
    TRY(key_u32(g, "clip.audio.num_mel_bins", 1, 1024, &e->n_mel));
    TRY(key_u32(g, "clip.audio.projection_dim", 1, 1 << 18, &e->n_embd));
    TRY(key_u32(g, "clip.audio.projector.stack_factor", 1, N_POS, &e->stack));
    e->eps = 1e-5f; /* the converter's default when the config has none */
    if (pkv_gguf_find_key(g, "clip.audio.attention.layer_norm_epsilon") >= 0) {
        pkv_status s = pkv_gguf_get_f32(g, "clip.audio.attention.layer_norm_epsilon", &e->eps);
        if (s) return pkv_err_prefix(s, "voxtral projector: key 'clip.audio.attention.layer_norm_epsilon'");
        if (!(e->eps >= 0 && e->eps < 1))
            return pkv_err(PKV_ERR_FORMAT, "voxtral projector: key 'clip.audio.attention.layer_norm_epsilon' is %g",
                           (double)e->eps);
    }
    if (e->d % e->n_head)
        return pkv_err(PKV_ERR_FORMAT, "voxtral projector: embedding_length %d is not a multiple of head_count %d", e->d,
                       e->n_head);
    if (N_POS % e->stack)
        return pkv_err(PKV_ERR_FORMAT, "voxtral projector: stack_factor %d does not divide the %d frames of a window",
                       e->stack, N_POS);
    return PKV_OK;
}

pkv_status pkv_mmproj_audio_open(pkv_mmproj *p, const char *projector, const pkv_model *text_model) {
    if (strcmp(projector, "voxtral") != 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "audio projector '%s' is not supported (only 'voxtral')", projector);
    enc *e = pkv_calloc(1, sizeof *e);
    if (!e) return pkv_err(PKV_ERR_NOMEM, "voxtral projector: out of memory");
    p->enc = e;
    p->free_enc = enc_free;
    pkv_status s = hparams(p->g, e);
    if (s) return s;
    if (text_model) {
        pkv_model_info mi;
        if ((s = pkv_model_get_info(text_model, &mi))) return s;
        if (mi.n_embd != e->n_embd)
            return pkv_err(PKV_ERR_MISMATCH,
                           "voxtral projector: its rows are %d wide (clip.audio.projection_dim), the text model's "
                           "n_embd is %d: this projector is not for this model",
                           e->n_embd, mi.n_embd);
        if (strcmp(mi.arch, "llama") != 0)
            return pkv_err(PKV_ERR_MISMATCH,
                           "voxtral projector: the text model's architecture is '%s'; Voxtral's text model is 'llama'",
                           mi.arch);
    }
    e->L = pkv_calloc((size_t)e->n_layer, sizeof *e->L);
    if (!e->L) return pkv_err(PKV_ERR_NOMEM, "voxtral projector: out of memory");
    /* pass 1: check every tensor and lay the buffer out; pass 2: fill a host image */
    loader ld = {p->g, e, NULL, 0, p->dev, 0, false};
    if ((s = tensors(&ld))) return s;
    if (ld.too_many) return pkv_err(PKV_ERR_UNSUPPORTED, "voxtral projector: weights of %zu bytes", ld.size);
    const size_t size = ld.size;
    ld.host = pkv_calloc(1, size);
    if (!ld.host) return pkv_err(PKV_ERR_NOMEM, "voxtral projector: %zu bytes of host memory", size);
    ld.size = 0;
    e->n_w = 0; /* pass 2 lays the buffers out again, the same way */
    ld.fp = pkv_hash64("pagekv-voxtral-1", 16, 0);
    s = tensors(&ld);
    e->base[e->n_w] = size;
    for (int c = 0; c < e->n_w && !s; c++) {
        const size_t bytes = e->base[c + 1] - e->base[c];
        e->w[c] = pkv_buffer_alloc(p->dev, bytes);
        if (!e->w[c])
            s = pkv_err_prefix(pkv_errcode(), "voxtral projector: %zu bytes of weights on %s", bytes,
                               pkv_device_name(p->dev));
        else
            s = pkv_buffer_write(e->w[c], 0, ld.host + e->base[c], bytes);
    }
    pkv_free(ld.host);
    if (s) return s;
    int hp[8] = {e->n_mel, e->d, e->n_ff, e->n_layer, e->n_head, e->stack, e->n_embd, 0};
    memcpy(&hp[7], &e->eps, 4);
    p->info.kind = PKV_MEDIA_AUDIO;
    p->info.n_embd = e->n_embd;
    p->info.n_embd_enc = e->d;
    p->info.n_layer = e->n_layer;
    p->info.sample_rate = PKV_MEL_RATE;
    p->info.image_size = 0;
    p->info.non_causal = false;
    p->info.text_before = "[BEGIN_AUDIO]"; /* as mtmd: [BEGIN_AUDIO] rows, nothing after */
    p->info.text_after = "";
    p->info.fingerprint = pkv_hash64(hp, sizeof hp, ld.fp);
    p->n_rows = n_rows;
    p->begin = job_begin;
    p->step = job_step;
    p->end = job_end;
    p->encode = encode;
    return PKV_OK;
}
