/* A plain double-precision Gemma 3 vision encoder (SigLIP, 4x4 pooling, soft
 * embedding norm, projection) over a projector GGUF, written from the model's
 * definition and independent of src/media/mmproj-vision.c: every weight is read
 * from the file by name and dequantized, every step is a loop. The input is
 * pkv_vision_preprocess's output (checked on its own in test-mmproj-vision.c). */
#ifndef PKV_TEST_VISION_REF_H
#define PKV_TEST_VISION_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"
#include "model/gguf.h"

static double *vr_tensor(const pkv_gguf *g, const char *name, size_t *n_out) {
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(g, name);
    if (!t) return NULL;
    size_t n = (size_t)t->n_elements, cols = (size_t)t->ne[0];
    float *f = malloc(n * sizeof *f);
    double *d = malloc(n * sizeof *d);
    for (size_t r = 0; r < n / cols; r++)
        pkv_dequantize_row(t->type, (const uint8_t *)t->data + r * pkv_type_row_bytes(t->type, cols), f + r * cols,
                           (int64_t)cols);
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    if (n_out) *n_out = n;
    return d;
}

static double *vr_blk(const pkv_gguf *g, int l, const char *what) {
    char nm[96];
    snprintf(nm, sizeof nm, "v.blk.%d.%s", l, what);
    return vr_tensor(g, nm, NULL);
}

/* y[n][rows] = x[n][cols] W[rows][cols]^T + b */
static void vr_linear(const double *x, const double *w, const double *b, double *y, int n, int rows, int cols) {
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            double s = b ? b[r] : 0;
            for (int c = 0; c < cols; c++) s += x[(size_t)i * cols + c] * w[(size_t)r * cols + c];
            y[(size_t)i * rows + r] = s;
        }
}

static void vr_layer_norm(const double *x, double *y, const double *w, const double *b, int n, int d, double eps) {
    for (int i = 0; i < n; i++) {
        const double *r = x + (size_t)i * d;
        double m = 0, v = 0;
        for (int j = 0; j < d; j++) m += r[j];
        m /= d;
        for (int j = 0; j < d; j++) v += (r[j] - m) * (r[j] - m);
        v /= d;
        for (int j = 0; j < d; j++) y[(size_t)i * d + j] = (r[j] - m) / sqrt(v + eps) * w[j] + b[j];
    }
}

static int vr_u32(const pkv_gguf *g, const char *key, int dflt) {
    uint32_t v;
    return pkv_gguf_get_u32(g, key, &v) ? dflt : (int)v;
}

/* img: f32 [3][S][S] (preprocessed). out: f32 [n_out][n_text]. Returns n_out, or -1. */
static int vr_encode(const pkv_gguf *g, const float *img, float *out) {
    const int S = vr_u32(g, "clip.vision.image_size", 0), P = vr_u32(g, "clip.vision.patch_size", 0);
    const int D = vr_u32(g, "clip.vision.embedding_length", 0), F = vr_u32(g, "clip.vision.feed_forward_length", 0);
    const int L = vr_u32(g, "clip.vision.block_count", 0), H = vr_u32(g, "clip.vision.attention.head_count", 0);
    const int K = vr_u32(g, "clip.vision.projector.scale_factor", 4);
    float epsf = 1e-6f;
    pkv_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &epsf);
    const double eps = epsf;
    const int Gs = S / P, N = Gs * Gs, dh = D / H, Go = Gs / K, NO = Go * Go;
    const pkv_gguf_tensor *pt = pkv_gguf_find_tensor(g, "mm.input_projection.weight");
    if (!pt || !S || !P || !D || !F || !L || !H) return -1;
    const int T = (int)pt->ne[0];
    double *h = calloc((size_t)N * D, sizeof *h), *t = calloc((size_t)N * D, sizeof *t);
    double *q = calloc((size_t)N * D, sizeof *q), *k = calloc((size_t)N * D, sizeof *k);
    double *v = calloc((size_t)N * D, sizeof *v), *a = calloc((size_t)N * D, sizeof *a);
    double *u = calloc((size_t)N * F, sizeof *u), *sc = calloc((size_t)N, sizeof *sc);
    /* patch embedding: the stride-P convolution, weight [D][3][P][P] */
    double *pw = vr_tensor(g, "v.patch_embd.weight", NULL), *pb = vr_tensor(g, "v.patch_embd.bias", NULL);
    double *pos = vr_tensor(g, "v.position_embd.weight", NULL);
    for (int py = 0; py < Gs; py++)
        for (int px = 0; px < Gs; px++)
            for (int d = 0; d < D; d++) {
                double s = pb[d];
                for (int c = 0; c < 3; c++)
                    for (int ky = 0; ky < P; ky++)
                        for (int kx = 0; kx < P; kx++)
                            s += pw[(((size_t)d * 3 + c) * P + ky) * P + kx] *
                                 img[((size_t)c * S + py * P + ky) * S + px * P + kx];
                int p = py * Gs + px;
                h[(size_t)p * D + d] = s + pos[(size_t)p * D + d];
            }
    free(pw), free(pb), free(pos);
    for (int l = 0; l < L; l++) {
        double *ln1w = vr_blk(g, l, "ln1.weight"), *ln1b = vr_blk(g, l, "ln1.bias");
        double *ln2w = vr_blk(g, l, "ln2.weight"), *ln2b = vr_blk(g, l, "ln2.bias");
        double *qw = vr_blk(g, l, "attn_q.weight"), *qb = vr_blk(g, l, "attn_q.bias");
        double *kw = vr_blk(g, l, "attn_k.weight"), *kb = vr_blk(g, l, "attn_k.bias");
        double *vw = vr_blk(g, l, "attn_v.weight"), *vb = vr_blk(g, l, "attn_v.bias");
        double *ow = vr_blk(g, l, "attn_out.weight"), *ob = vr_blk(g, l, "attn_out.bias");
        double *uw = vr_blk(g, l, "ffn_up.weight"), *ub = vr_blk(g, l, "ffn_up.bias");
        double *dw = vr_blk(g, l, "ffn_down.weight"), *db = vr_blk(g, l, "ffn_down.bias");
        vr_layer_norm(h, t, ln1w, ln1b, N, D, eps);
        vr_linear(t, qw, qb, q, N, D, D);
        vr_linear(t, kw, kb, k, N, D, D);
        vr_linear(t, vw, vb, v, N, D, D);
        /* bidirectional attention: every patch sees every patch */
        for (int hd = 0; hd < H; hd++)
            for (int i = 0; i < N; i++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int e = 0; e < dh; e++) s += q[(size_t)i * D + hd * dh + e] * k[(size_t)j * D + hd * dh + e];
                    sc[j] = s / sqrt((double)dh);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < N; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int e = 0; e < dh; e++) {
                    double s = 0;
                    for (int j = 0; j < N; j++) s += sc[j] * v[(size_t)j * D + hd * dh + e];
                    a[(size_t)i * D + hd * dh + e] = s / sum;
                }
            }
        vr_linear(a, ow, ob, t, N, D, D);
        for (size_t i = 0; i < (size_t)N * D; i++) h[i] += t[i];
        vr_layer_norm(h, t, ln2w, ln2b, N, D, eps);
        vr_linear(t, uw, ub, u, N, F, D);
        for (size_t i = 0; i < (size_t)N * F; i++) {
            double x = u[i];
            u[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
        }
        vr_linear(u, dw, db, t, N, D, F);
        for (size_t i = 0; i < (size_t)N * D; i++) h[i] += t[i];
        double *fr[] = {ln1w, ln1b, ln2w, ln2b, qw, qb, kw, kb, vw, vb, ow, ob, uw, ub, dw, db};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) free(fr[i]);
    }
    double *plw = vr_tensor(g, "v.post_ln.weight", NULL), *plb = vr_tensor(g, "v.post_ln.bias", NULL);
    vr_layer_norm(h, t, plw, plb, N, D, eps);
    free(plw), free(plb);
    /* K x K average pooling of the Gs x Gs grid, then RMS norm with the stored (1 + w) */
    double *sw = vr_tensor(g, "mm.soft_emb_norm.weight", NULL), *wp = vr_tensor(g, "mm.input_projection.weight", NULL);
    for (int oy = 0; oy < Go; oy++)
        for (int ox = 0; ox < Go; ox++) {
            double *r = a + ((size_t)oy * Go + ox) * D, ms = 0;
            for (int d = 0; d < D; d++) {
                double s = 0;
                for (int dy = 0; dy < K; dy++)
                    for (int dx = 0; dx < K; dx++) s += t[((size_t)(oy * K + dy) * Gs + ox * K + dx) * D + d];
                r[d] = s / (K * K);
                ms += r[d] * r[d];
            }
            ms = 1.0 / sqrt(ms / D + eps);
            for (int d = 0; d < D; d++) r[d] *= ms * sw[d];
            for (int j = 0; j < T; j++) { /* x @ W, W [D][T] as the file holds it */
                double s = 0;
                for (int d = 0; d < D; d++) s += r[d] * wp[(size_t)d * T + j];
                out[((size_t)oy * Go + ox) * T + j] = (float)s;
            }
        }
    free(sw), free(wp);
    free(h), free(t), free(q), free(k), free(v), free(a), free(u), free(sc);
    return NO;
}

#endif
