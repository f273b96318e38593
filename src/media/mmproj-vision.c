/* Vision projectors: Gemma 3's (clip.projector_type "gemma3"), read from the mmproj
 * GGUF llama.cpp's convert_hf_to_gguf.py --mmproj writes.
 *
 * 1. Keys (clip.vision.*): image_size, patch_size, embedding_length, feed_forward_length,
 *    block_count, attention.head_count, attention.layer_norm_epsilon, image_mean,
 *    image_std, projection_dim (the text width), projector.scale_factor (pooling per
 *    side; absent = 4, as the converter writes it only when it differs).
 * 2. Tensors (ggml order: ne[0] innermost):
 *      v.patch_embd.weight   [n_embd][3][p][p] (ne {p, p, 3, n_embd}), v.patch_embd.bias [n_embd]
 *      v.position_embd.weight [n_patch][n_embd]
 *      v.blk.N.{ln1,ln2}.{weight,bias}               [n_embd]
 *      v.blk.N.{attn_q,attn_k,attn_v,attn_out}.{weight,bias}  [n_embd][n_embd], [n_embd]
 *      v.blk.N.ffn_up.{weight,bias} [n_ff][n_embd], [n_ff]; ffn_down [n_embd][n_ff], [n_embd]
 *      v.post_ln.{weight,bias} [n_embd]
 *      mm.soft_emb_norm.weight [n_embd]  (stored as Gemma's 1 + w: used as it is)
 *      mm.input_projection.weight ne {n_text, n_embd}: x @ W (transposed here at load)
 * 3. The encoder, on the projector's device with the device kernels:
 *      image -> preprocess (vision-image.c) -> patches @ patch_embdᵀ + bias + position
 *      -> n_layer SigLIP blocks: h += out(attn(LN1(h))); h += down(gelu_tanh(up(LN2(h))))
 *         (layer norms with bias, every projection biased, attention non-causal:
 *         the paged attention kernel with every query seeing all n_patch tokens of a
 *         temporary f32 page pool the K/V matmuls write directly)
 *      -> post LN -> average pool n_merge x n_merge over the g x g patch grid
 *         (the paged attention kernel again: a zero query scores every key 0, so each
 *         output row is the mean of the V rows its block table lists; with pages of
 *         n_merge tokens a pooled cell is n_merge pages, one per patch row)
 *      -> RMS norm * soft_emb_norm -> @ input_projection -> (g / n_merge)^2 rows. */
#include "media/media-impl.h"
#include "base/quant.h"
#include "device/device.h"
#include "media/vision-impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ENC_PAGE 16 /* tokens per page of the encoder's temporary K/V pool */

typedef struct vweight {
    pkv_buffer *buf;
    pkv_type type;
    int64_t rows, cols; /* matrices: [rows][cols]; vectors: rows = 1 */
} vweight;

typedef struct vlayer {
    vweight ln1_w, ln1_b, ln2_w, ln2_b;
    vweight q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;
    vweight up_w, up_b, down_w, down_b;
} vlayer;

typedef struct venc {
    int image_size, patch, grid, n_patch, n_merge, n_out;
    int n_embd, n_ff, n_layer, n_head, d_head, n_text;
    float eps, mean[3], std[3];
    vweight patch_w, patch_b, pos, post_w, post_b, soft_w, proj_w;
    vlayer *layers;
    /* scratch, made at the first encode */
    bool ready;
    pkv_buffer *x0;           /* f32 [n_patch][3 p p] */
    pkv_buffer *h, *t, *q, *a; /* f32 [n_patch][n_embd] */
    pkv_buffer *k, *v;        /* f32 [n_pages][ENC_PAGE][n_embd]: the encoder's K/V pool */
    pkv_buffer *u;            /* f32 [n_patch][n_ff] */
    pkv_buffer *z, *p;        /* f32 [n_out][n_embd]: zero queries, pooled rows */
    pkv_buffer *o;            /* f32 [n_out][n_text] */
    pkv_buffer *meta_enc, *meta_pool; /* i32 attention metadata */
    int n_pages;
    float *img;                /* host f32 [3][size][size] */
    float *patches;            /* host f32 [n_patch][3 p p] */
} venc;

/* ------------------------------------------------------------------ keys */

static pkv_status key_u32(const pkv_gguf *g, const char *key, uint32_t lo, uint32_t hi, int *out) {
    uint32_t v;
    pkv_status st = pkv_gguf_get_u32(g, key, &v);
    if (st) return st;
    if (v < lo || v > hi) return pkv_err(PKV_ERR_FORMAT, "key '%s' is %u, expected %u..%u", key, v, lo, hi);
    *out = (int)v;
    return PKV_OK;
}

static pkv_status key_rgb(const pkv_gguf *g, const char *key, float out[3]) {
    pkv_gguf_array a;
    pkv_status st = pkv_gguf_get_arr(g, key, PKV_GGUF_TYPE_COUNT, &a);
    if (st) return st;
    if (a.count != 3 || (a.type != PKV_GGUF_FLOAT32 && a.type != PKV_GGUF_FLOAT64))
        return pkv_err(PKV_ERR_FORMAT, "key '%s': expected 3 floats (R, G, B), found %llu of type %s", key,
                       (unsigned long long)a.count, pkv_gguf_type_name(a.type));
    for (int i = 0; i < 3; i++) out[i] = (float)pkv_gguf_arr_float(&a, (uint64_t)i);
    return PKV_OK;
}

/* --------------------------------------------------------------- tensors */

/* Upload tensor `name` with the shape ne (ggml order, n_dims given) to dev.
 * Vectors and the embeddings become f32 (f32_only); matrices keep their type
 * when the device's matmul takes it. */
static pkv_status load_tensor(pkv_mmproj *p, const char *name, int n_dims, const int64_t *ne, bool f32_only,
                              vweight *w) {
    const pkv_gguf_tensor *t;
    pkv_status st = pkv_gguf_get_tensor(p->g, name, &t);
    if (st) return st;
    bool ok = true;
    for (int i = 0; i < PKV_GGUF_MAX_DIMS; i++) ok = ok && t->ne[i] == (i < n_dims ? ne[i] : 1);
    if (!ok) {
        char want[96], got[96];
        int a = snprintf(want, sizeof want, "{"), b = snprintf(got, sizeof got, "{");
        for (int i = 0; i < n_dims; i++) a += snprintf(want + a, sizeof want - (size_t)a, i ? ", %lld" : "%lld", (long long)ne[i]);
        for (uint32_t i = 0; i < t->n_dims; i++)
            b += snprintf(got + b, sizeof got - (size_t)b, i ? ", %lld" : "%lld", (long long)t->ne[i]);
        snprintf(want + a, sizeof want - (size_t)a, "}");
        snprintf(got + b, sizeof got - (size_t)b, "}");
        return pkv_err(PKV_ERR_FORMAT, "tensor '%s' has shape %s, expected %s", name, got, want);
    }
    int64_t cols = t->ne[0], rows = (int64_t)(t->n_elements / (uint64_t)cols);
    bool conv = f32_only && t->type != PKV_TYPE_F32;
    if (!f32_only && !pkv_device_supports_weight(p->dev, t->type)) {
        conv = true; /* dequantized to f32 (pkv_dequantize_row refuses what it cannot) */
    }
    float *tmp = NULL;
    const void *data = t->data;
    size_t bytes = t->n_bytes;
    if (conv) {
        tmp = pkv_malloc(t->n_elements * sizeof(float));
        if (!tmp) return pkv_err(PKV_ERR_NOMEM, "tensor '%s': no memory to convert it to f32", name);
        for (int64_t r = 0; r < rows; r++) {
            st = pkv_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * pkv_type_row_bytes(t->type, (size_t)cols),
                                    tmp + r * cols, cols);
            if (st) {
                pkv_free(tmp);
                return pkv_err_prefix(st, "tensor '%s' (%s)", name, pkv_type_name(t->type));
            }
        }
        data = tmp;
        bytes = t->n_elements * sizeof(float);
    }
    pkv_buffer *buf = NULL;
    if ((uintptr_t)data % 16 == 0 && !tmp) {
        buf = pkv_buffer_wrap_host(p->dev, data, bytes); /* the CPU uses the mapped file in place */
        if (!buf && pkv_errcode() != PKV_ERR_UNSUPPORTED)
            return pkv_err_prefix(pkv_errcode(), "tensor '%s' on %s", name, pkv_device_name(p->dev));
    }
    if (!buf) {
        pkv_err_clear();
        buf = pkv_buffer_alloc(p->dev, bytes);
        st = buf ? pkv_buffer_write(buf, 0, data, bytes) : pkv_errcode();
        if (st) {
            pkv_buffer_free(buf);
            pkv_free(tmp);
            return pkv_err_prefix(st ? st : PKV_ERR_NOMEM, "uploading tensor '%s' (%zu bytes) to %s", name, bytes,
                                  pkv_device_name(p->dev));
        }
    }
    pkv_free(tmp);
    w->buf = buf;
    w->type = conv ? PKV_TYPE_F32 : t->type;
    w->rows = rows;
    w->cols = cols;
    return PKV_OK;
}

static pkv_status load_vec(pkv_mmproj *p, const char *name, int64_t n, vweight *w) {
    return load_tensor(p, name, 1, &n, true, w);
}

static pkv_status load_mat(pkv_mmproj *p, const char *name, int64_t rows, int64_t cols, vweight *w) {
    int64_t ne[2] = {cols, rows};
    return load_tensor(p, name, 2, ne, false, w);
}

/* mm.input_projection.weight: the file holds W as x @ W (ne {n_text, n_embd});
 * the matmul kernel takes [rows = n_text][cols = n_embd], so it is transposed here,
 * keeping f16/bf16 as they are (the converter always writes f16). */
static pkv_status load_proj(pkv_mmproj *p, venc *e, vweight *w) {
    const char *name = "mm.input_projection.weight";
    const pkv_gguf_tensor *t;
    pkv_status st = pkv_gguf_get_tensor(p->g, name, &t);
    if (st) return st;
    if (t->n_dims != 2 || t->ne[1] != e->n_embd)
        return pkv_err(PKV_ERR_FORMAT, "tensor '%s' has %u dims {%lld, %lld}, expected {n_text, %d} (the encoder width)",
                       name, t->n_dims, (long long)t->ne[0], (long long)t->ne[1], e->n_embd);
    int64_t nt = t->ne[0], ne = e->n_embd;
    size_t es = t->type == PKV_TYPE_F32 ? 4 : (t->type == PKV_TYPE_F16 || t->type == PKV_TYPE_BF16) ? 2 : 0;
    if (!es)
        return pkv_err(PKV_ERR_UNSUPPORTED, "tensor '%s' is %s: only f32, f16 and bf16 are supported (the converter "
                       "writes f16)", name, pkv_type_name(t->type));
    pkv_type ty = t->type;
    if (!pkv_device_supports_weight(p->dev, ty)) ty = PKV_TYPE_F32;
    size_t os = ty == PKV_TYPE_F32 ? 4 : 2, bytes = (size_t)nt * (size_t)ne * os;
    uint8_t *tr = pkv_malloc(bytes);
    if (!tr) return pkv_err(PKV_ERR_NOMEM, "tensor '%s': no memory to transpose it", name);
    const uint8_t *src = t->data;
    for (int64_t i = 0; i < ne; i++)      /* source row i: n_text values */
        for (int64_t j = 0; j < nt; j++) { /* -> dest row j, column i */
            const uint8_t *s = src + ((size_t)i * nt + j) * es;
            uint8_t *d = tr + ((size_t)j * ne + i) * os;
            if (os == es) {
                memcpy(d, s, es);
            } else {
                uint16_t hv;
                memcpy(&hv, s, 2);
                float f = t->type == PKV_TYPE_F16 ? pkv_f16_to_f32(hv) : pkv_bf16_to_f32(hv);
                memcpy(d, &f, 4);
            }
        }
    pkv_buffer *buf = pkv_buffer_alloc(p->dev, bytes);
    st = buf ? pkv_buffer_write(buf, 0, tr, bytes) : pkv_errcode();
    pkv_free(tr);
    if (st) {
        pkv_buffer_free(buf);
        return pkv_err_prefix(st ? st : PKV_ERR_NOMEM, "uploading tensor '%s'", name);
    }
    w->buf = buf;
    w->type = ty;
    w->rows = nt;
    w->cols = ne;
    return PKV_OK;
}

static void free_w(vweight *w) {
    pkv_buffer_free(w->buf);
    w->buf = NULL;
}

static void free_scratch(venc *e) {
    pkv_buffer *b[] = {e->x0, e->h, e->t, e->q, e->a, e->k, e->v, e->u, e->z, e->p, e->o, e->meta_enc, e->meta_pool};
    for (size_t i = 0; i < PKV_ARRAY_LEN(b); i++) pkv_buffer_free(b[i]);
    pkv_free(e->img);
    pkv_free(e->patches);
    e->x0 = e->h = e->t = e->q = e->a = e->k = e->v = e->u = e->z = e->p = e->o = e->meta_enc = e->meta_pool = NULL;
    e->img = e->patches = NULL;
    e->ready = false;
}

static void vision_free(pkv_mmproj *p) {
    venc *e = p->enc;
    if (!e) return;
    free_scratch(e);
    vweight *ws[] = {&e->patch_w, &e->patch_b, &e->pos, &e->post_w, &e->post_b, &e->soft_w, &e->proj_w};
    for (size_t i = 0; i < PKV_ARRAY_LEN(ws); i++) free_w(ws[i]);
    if (e->layers)
        for (int l = 0; l < e->n_layer; l++) {
            vlayer *L = &e->layers[l];
            vweight *lw[] = {&L->ln1_w, &L->ln1_b, &L->ln2_w, &L->ln2_b, &L->q_w, &L->q_b, &L->k_w, &L->k_b,
                             &L->v_w,   &L->v_b,   &L->o_w,   &L->o_b,   &L->up_w, &L->up_b, &L->down_w, &L->down_b};
            for (size_t i = 0; i < PKV_ARRAY_LEN(lw); i++) free_w(lw[i]);
        }
    pkv_free(e->layers);
    pkv_free(e);
    p->enc = NULL;
}

/* ---------------------------------------------------------------- encode */

static pkv_status vision_n_rows(const pkv_mmproj *p, const pkv_media *m, int64_t *n_rows) {
    (void)m; /* every image is resized to the one square input */
    *n_rows = ((const venc *)p->enc)->n_out;
    return PKV_OK;
}

static pkv_buffer *scratch(pkv_device *dev, size_t bytes, pkv_status *st) {
    if (*st) return NULL;
    pkv_buffer *b = pkv_buffer_alloc(dev, bytes);
    if (!b) *st = pkv_errcode() ? pkv_errcode() : PKV_ERR_NOMEM;
    return b;
}

static pkv_status make_scratch(pkv_mmproj *p, venc *e) {
    pkv_status st = PKV_OK;
    pkv_device *d = p->dev;
    size_t np = (size_t)e->n_patch, ne = (size_t)e->n_embd, cols = (size_t)3 * e->patch * e->patch;
    e->n_pages = (e->n_patch + ENC_PAGE - 1) / ENC_PAGE;
    e->x0 = scratch(d, np * cols * 4, &st);
    e->h = scratch(d, np * ne * 4, &st);
    e->t = scratch(d, np * ne * 4, &st);
    e->q = scratch(d, np * ne * 4, &st);
    e->a = scratch(d, np * ne * 4, &st);
    e->k = scratch(d, (size_t)e->n_pages * ENC_PAGE * ne * 4, &st);
    e->v = scratch(d, (size_t)e->n_pages * ENC_PAGE * ne * 4, &st);
    e->u = scratch(d, np * (size_t)e->n_ff * 4, &st);
    e->z = scratch(d, (size_t)e->n_out * ne * 4, &st);
    e->p = scratch(d, (size_t)e->n_out * ne * 4, &st);
    e->o = scratch(d, (size_t)e->n_out * (size_t)e->n_text * 4, &st);
    /* encoder attention: one sequence of every page; each query sees all n_patch tokens */
    size_t n_me = np * 2 + 2 + (size_t)e->n_pages;
    /* pooling: output r is its own sequence of n_merge pages of n_merge tokens */
    size_t n_mp = (size_t)e->n_out * 2 + (size_t)e->n_out + 1 + (size_t)e->n_out * e->n_merge;
    e->meta_enc = scratch(d, n_me * 4, &st);
    e->meta_pool = scratch(d, n_mp * 4, &st);
    if (st) goto fail;
    int32_t *m = pkv_malloc((n_me > n_mp ? n_me : n_mp) * 4);
    e->img = pkv_malloc((size_t)3 * e->image_size * e->image_size * sizeof(float));
    e->patches = pkv_malloc(np * cols * sizeof(float));
    if (!m || !e->img || !e->patches) {
        pkv_free(m);
        st = pkv_err(PKV_ERR_NOMEM, "vision encoder: no host memory for the image");
        goto fail;
    }
    size_t i = 0;
    for (size_t r = 0; r < np; r++) m[i++] = 0;              /* q_seq */
    for (size_t r = 0; r < np; r++) m[i++] = e->n_patch;     /* q_len */
    m[i++] = 0;
    m[i++] = e->n_pages;                                     /* indptr */
    for (int pg = 0; pg < e->n_pages; pg++) m[i++] = pg;     /* pages */
    st = pkv_buffer_write(e->meta_enc, 0, m, n_me * 4);
    if (!st) {
        int G = e->grid / e->n_merge; /* pooled side; pages of n_merge tokens: G per patch row */
        i = 0;
        for (int r = 0; r < e->n_out; r++) m[i++] = r;
        for (int r = 0; r < e->n_out; r++) m[i++] = e->n_merge * e->n_merge;
        for (int r = 0; r <= e->n_out; r++) m[i++] = r * e->n_merge;
        for (int oy = 0; oy < G; oy++)
            for (int ox = 0; ox < G; ox++)
                for (int dy = 0; dy < e->n_merge; dy++) m[i++] = (oy * e->n_merge + dy) * G + ox;
        st = pkv_buffer_write(e->meta_pool, 0, m, n_mp * 4);
    }
    pkv_free(m);
    if (!st) st = pkv_buffer_fill(e->z, 0, (size_t)e->n_out * ne * 4, 0);
    if (st) goto fail;
    e->ready = true;
    return PKV_OK;
fail:
    free_scratch(e);
    return pkv_err_prefix(st, "vision encoder: scratch memory on %s", pkv_device_name(p->dev));
}

static pkv_tref R(pkv_buffer *b) { return pkv_tref_make(b, 0); }

/* y[n][w.rows] = x[n][w.cols] @ wᵀ (+ bias) */
static pkv_status linear(pkv_device *d, const vweight *w, const vweight *b, pkv_buffer *x, pkv_buffer *y, int64_t n) {
    pkv_k_matmul_args m = {.w = R(w->buf), .wtype = w->type, .rows = w->rows, .cols = w->cols, .x = R(x), .y = R(y), .n = n};
    pkv_status st = pkv_k_matmul(d, &m);
    if (st || !b) return st;
    pkv_k_add_args a = {.a = R(y), .b = R(b->buf), .y = R(y), .n = n * w->rows, .b_len = w->rows};
    return pkv_k_add(d, &a);
}

static pkv_status layer_norm(pkv_device *d, pkv_buffer *x, pkv_buffer *y, const vweight *w, const vweight *b, int64_t n,
                             int64_t len, float eps) {
    pkv_k_layer_norm_args a = {.x = R(x), .y = R(y), .w = R(w->buf), .b = R(b->buf), .n_rows = n, .row_len = len, .eps = eps};
    return pkv_k_layer_norm(d, &a);
}

static pkv_status add(pkv_device *d, pkv_buffer *a, pkv_buffer *b, pkv_buffer *y, int64_t n, int64_t b_len) {
    pkv_k_add_args k = {.a = R(a), .b = R(b), .y = R(y), .n = n, .b_len = b_len};
    return pkv_k_add(d, &k);
}

static pkv_status run_encoder(pkv_mmproj *p, venc *e) {
    pkv_device *d = p->dev;
    const int64_t n = e->n_patch, D = e->n_embd;
    pkv_status st;
    /* patch embedding (the stride-p convolution as a matmul) + position embedding */
    if ((st = linear(d, &e->patch_w, &e->patch_b, e->x0, e->h, n))) return st;
    if ((st = add(d, e->h, e->pos.buf, e->h, n * D, n * D))) return st;
    for (int l = 0; l < e->n_layer; l++) {
        const vlayer *L = &e->layers[l];
        if ((st = layer_norm(d, e->h, e->t, &L->ln1_w, &L->ln1_b, n, D, e->eps))) return st;
        if ((st = linear(d, &L->q_w, &L->q_b, e->t, e->q, n))) return st;
        if ((st = linear(d, &L->k_w, &L->k_b, e->t, e->k, n))) return st;
        if ((st = linear(d, &L->v_w, &L->v_b, e->t, e->v, n))) return st;
        pkv_k_attention_args at = {.q = R(e->q), .k = R(e->k), .v = R(e->v), .out = R(e->a), .meta = R(e->meta_enc),
                                   .k_type = PKV_TYPE_F32, .v_type = PKV_TYPE_F32, .n_q = (int)n, .n_seq = 1,
                                   .meta_pages = e->n_pages, .n_pages = e->n_pages, .page_size = ENC_PAGE,
                                   .n_head = e->n_head, .n_kv = e->n_head, .dk = e->d_head, .dv = e->d_head,
                                   .scale = 1.0f / sqrtf((float)e->d_head)};
        if ((st = pkv_k_attention(d, &at))) return st;
        if ((st = linear(d, &L->o_w, &L->o_b, e->a, e->t, n))) return st;
        if ((st = add(d, e->h, e->t, e->h, n * D, n * D))) return st;
        if ((st = layer_norm(d, e->h, e->t, &L->ln2_w, &L->ln2_b, n, D, e->eps))) return st;
        if ((st = linear(d, &L->up_w, NULL, e->t, e->u, n))) return st;
        pkv_k_unary_args g = {.x = R(e->u), .y = R(e->u), .n = n * e->n_ff, .op = PKV_UNARY_GELU,
                              .bias = R(L->up_b.buf), .bias_len = e->n_ff};
        if ((st = pkv_k_unary(d, &g))) return st;
        if ((st = linear(d, &L->down_w, &L->down_b, e->u, e->t, n))) return st;
        if ((st = add(d, e->h, e->t, e->h, n * D, n * D))) return st;
    }
    if ((st = layer_norm(d, e->h, e->t, &e->post_w, &e->post_b, n, D, e->eps))) return st;
    /* n_merge x n_merge average pooling: zero queries over pages of n_merge tokens of t */
    pkv_k_attention_args pool = {.q = R(e->z), .k = R(e->t), .v = R(e->t), .out = R(e->p), .meta = R(e->meta_pool),
                                 .k_type = PKV_TYPE_F32, .v_type = PKV_TYPE_F32, .n_q = e->n_out, .n_seq = e->n_out,
                                 .meta_pages = e->n_out * e->n_merge, .n_pages = e->n_patch / e->n_merge,
                                 .page_size = e->n_merge, .n_head = e->n_head, .n_kv = e->n_head, .dk = e->d_head,
                                 .dv = e->d_head, .scale = 1.0f};
    if ((st = pkv_k_attention(d, &pool))) return st;
    pkv_k_rms_norm_args rn = {.x = R(e->p), .w = R(e->soft_w.buf), .y = R(e->p), .n_rows = e->n_out, .row_len = D,
                              .eps = e->eps};
    if ((st = pkv_k_rms_norm(d, &rn))) return st;
    return linear(d, &e->proj_w, NULL, e->p, e->o, e->n_out);
}

static pkv_status vision_encode(pkv_mmproj *p, const pkv_media *m, float *out, int64_t n_rows) {
    venc *e = p->enc;
    pkv_status st = PKV_OK;
    if (!e->ready && (st = make_scratch(p, e))) return st;
    st = pkv_vision_preprocess(m->rgb, m->width, m->height, e->image_size, e->mean, e->std, e->img);
    if (st) return st;
    pkv_vision_patches(e->img, e->image_size, e->patch, e->patches);
    size_t cols = (size_t)3 * e->patch * e->patch;
    st = pkv_buffer_write(e->x0, 0, e->patches, (size_t)e->n_patch * cols * 4);
    if (!st) st = run_encoder(p, e);
    if (!st) st = pkv_buffer_read(e->o, 0, out, (size_t)n_rows * (size_t)e->n_text * 4);
    if (st) return pkv_err_prefix(st, "encoding a %dx%d image on %s", m->width, m->height, pkv_device_name(p->dev));
    return PKV_OK;
}

/* ------------------------------------------------------------------ open */

static uint64_t fingerprint(const pkv_gguf *g, const venc *e) {
    int hp[12] = {e->image_size, e->patch, e->n_merge, e->n_embd, e->n_ff, e->n_layer, e->n_head, e->n_text};
    uint64_t h = pkv_hash64(hp, sizeof hp, 0x766973696f6e); /* "vision" */
    float f[7] = {e->eps, e->mean[0], e->mean[1], e->mean[2], e->std[0], e->std[1], e->std[2]};
    h = pkv_hash64(f, sizeof f, h);
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        h = pkv_hash64(t->name, strlen(t->name), h);
        h = pkv_hash64(t->ne, sizeof t->ne, h ^ (uint64_t)t->type);
        /* all of the data: media ids and the server's encoder-output cache are keyed
         * on this, so two projectors that differ anywhere must differ here */
        h = pkv_hash64_bulk(t->data, t->n_bytes, h);
    }
    return h;
}

static pkv_status read_keys(const pkv_gguf *g, venc *e) {
    pkv_status st;
    if ((st = key_u32(g, "clip.vision.image_size", 1, 8192, &e->image_size))) return st;
    if ((st = key_u32(g, "clip.vision.patch_size", 1, 1024, &e->patch))) return st;
    if ((st = key_u32(g, "clip.vision.embedding_length", 1, 65536, &e->n_embd))) return st;
    if ((st = key_u32(g, "clip.vision.feed_forward_length", 1, 1 << 20, &e->n_ff))) return st;
    if ((st = key_u32(g, "clip.vision.block_count", 1, 1024, &e->n_layer))) return st;
    if ((st = key_u32(g, "clip.vision.attention.head_count", 1, 1024, &e->n_head))) return st;
    if ((st = pkv_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &e->eps))) return st;
    if (!(e->eps > 0.0f && e->eps < 1.0f))
        return pkv_err(PKV_ERR_FORMAT, "key 'clip.vision.attention.layer_norm_epsilon' is %g, expected in (0, 1)",
                       (double)e->eps);
    if ((st = key_rgb(g, "clip.vision.image_mean", e->mean))) return st;
    if ((st = key_rgb(g, "clip.vision.image_std", e->std))) return st;
    for (int c = 0; c < 3; c++)
        if (!(e->std[c] > 0.0f) || !isfinite(e->mean[c]))
            return pkv_err(PKV_ERR_FORMAT, "key 'clip.vision.image_std' (%g) or image_mean (%g) of channel %d is not usable",
                           (double)e->std[c], (double)e->mean[c], c);
    e->n_merge = 4; /* Gemma 3's pooling; the converter writes the key only for other values */
    if (pkv_gguf_find_key(g, "clip.vision.projector.scale_factor") >= 0 &&
        (st = key_u32(g, "clip.vision.projector.scale_factor", 1, 64, &e->n_merge)))
        return st;
    if (e->image_size % e->patch)
        return pkv_err(PKV_ERR_FORMAT, "clip.vision.image_size %d is not a multiple of clip.vision.patch_size %d",
                       e->image_size, e->patch);
    e->grid = e->image_size / e->patch;
    if (e->grid % e->n_merge)
        return pkv_err(PKV_ERR_FORMAT, "the %dx%d patch grid (image_size %d / patch_size %d) is not a multiple of the "
                       "pooling factor %d (clip.vision.projector.scale_factor)", e->grid, e->grid, e->image_size,
                       e->patch, e->n_merge);
    if (e->n_embd % e->n_head)
        return pkv_err(PKV_ERR_FORMAT, "clip.vision.embedding_length %d is not a multiple of the %d heads "
                       "(clip.vision.attention.head_count)", e->n_embd, e->n_head);
    e->d_head = e->n_embd / e->n_head;
    e->n_patch = e->grid * e->grid;
    e->n_out = (e->grid / e->n_merge) * (e->grid / e->n_merge);
    return PKV_OK;
}

static pkv_status load_weights(pkv_mmproj *p, venc *e) {
    pkv_status st;
    const int64_t D = e->n_embd, F = e->n_ff, P = e->patch;
    int64_t pe[4] = {P, P, 3, D}, pos[2] = {D, e->n_patch};
    if ((st = load_tensor(p, "v.patch_embd.weight", 4, pe, false, &e->patch_w))) return st;
    e->patch_w.rows = D; /* as a matmul: [n_embd][3 p p] */
    e->patch_w.cols = 3 * P * P;
    if ((st = load_vec(p, "v.patch_embd.bias", D, &e->patch_b))) return st;
    if ((st = load_tensor(p, "v.position_embd.weight", 2, pos, true, &e->pos))) return st;
    if (!(e->layers = pkv_calloc((size_t)e->n_layer, sizeof *e->layers)))
        return pkv_err(PKV_ERR_NOMEM, "no memory for %d layers", e->n_layer);
    for (int l = 0; l < e->n_layer; l++) {
        vlayer *L = &e->layers[l];
        char nm[96];
#define VEC(field, what, n)                                                   \
    snprintf(nm, sizeof nm, "v.blk.%d.%s", l, what);                          \
    if ((st = load_vec(p, nm, n, &L->field))) return st;
#define MAT(field, what, r, c)                                                \
    snprintf(nm, sizeof nm, "v.blk.%d.%s", l, what);                          \
    if ((st = load_mat(p, nm, r, c, &L->field))) return st;
        VEC(ln1_w, "ln1.weight", D) VEC(ln1_b, "ln1.bias", D) VEC(ln2_w, "ln2.weight", D) VEC(ln2_b, "ln2.bias", D)
        MAT(q_w, "attn_q.weight", D, D) VEC(q_b, "attn_q.bias", D)
        MAT(k_w, "attn_k.weight", D, D) VEC(k_b, "attn_k.bias", D)
        MAT(v_w, "attn_v.weight", D, D) VEC(v_b, "attn_v.bias", D)
        MAT(o_w, "attn_out.weight", D, D) VEC(o_b, "attn_out.bias", D)
        MAT(up_w, "ffn_up.weight", F, D) VEC(up_b, "ffn_up.bias", F)
        MAT(down_w, "ffn_down.weight", D, F) VEC(down_b, "ffn_down.bias", D)
#undef VEC
#undef MAT
    }
    if ((st = load_vec(p, "v.post_ln.weight", D, &e->post_w))) return st;
    if ((st = load_vec(p, "v.post_ln.bias", D, &e->post_b))) return st;
    if ((st = load_vec(p, "mm.soft_emb_norm.weight", D, &e->soft_w))) return st;
    return load_proj(p, e, &e->proj_w);
}

pkv_status pkv_mmproj_vision_open(pkv_mmproj *p, const char *projector, const pkv_model *text_model) {
    if (strcmp(projector, "gemma3") != 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "vision projector '%s' is not supported (supported: gemma3)", projector);
    venc *e = pkv_calloc(1, sizeof *e);
    if (!e) return pkv_err(PKV_ERR_NOMEM, "no memory for the vision encoder");
    p->enc = e;
    p->free_enc = vision_free;
    pkv_status st = read_keys(p->g, e);
    if (st) return st;
    /* the text width: the projection's rows (checked against the key and the model) */
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(p->g, "mm.input_projection.weight");
    if (!t) return pkv_err(PKV_ERR_FORMAT, "tensor 'mm.input_projection.weight' not found");
    e->n_text = (int)t->ne[0];
    uint32_t pd;
    if (!pkv_gguf_get_u32(p->g, "clip.vision.projection_dim", &pd) && (int64_t)pd != t->ne[0])
        return pkv_err(PKV_ERR_FORMAT, "key 'clip.vision.projection_dim' is %u but tensor 'mm.input_projection.weight' "
                       "makes rows of %lld", pd, (long long)t->ne[0]);
    pkv_err_clear();
    if (text_model) {
        pkv_model_info mi;
        if ((st = pkv_model_get_info(text_model, &mi))) return st;
        if (!mi.arch || strcmp(mi.arch, "gemma3") != 0)
            return pkv_err(PKV_ERR_MISMATCH, "projector 'gemma3' is for a gemma3 text model, the model is %s",
                           mi.arch ? mi.arch : "(unknown)");
        if (mi.n_embd != e->n_text)
            return pkv_err(PKV_ERR_MISMATCH, "projector 'gemma3' makes rows of width %d, the gemma3 model's n_embd is %d",
                           e->n_text, mi.n_embd);
    }
    if ((st = load_weights(p, e))) return st;
    p->info.kind = PKV_MEDIA_IMAGE;
    p->info.n_embd = e->n_text;
    p->info.n_embd_enc = e->n_embd;
    p->info.n_layer = e->n_layer;
    p->info.sample_rate = 0;
    p->info.image_size = e->image_size;
    p->info.non_causal = true; /* llama.cpp's mtmd decodes gemma3 images without the causal mask */
    p->info.fingerprint = fingerprint(p->g, e);
    p->info.text_before = "<start_of_image>"; /* as mtmd: nothing else, no "\n\n" */
    p->info.text_after = "<end_of_image>";
    p->n_rows = vision_n_rows;
    p->encode = vision_encode;
    return PKV_OK;
}
