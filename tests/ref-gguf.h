/* The reference model's tensors from a GGUF file: ref_gguf_tensor is a
 * ref_get_tensor (ref-model.h) over a pkv_gguf, dequantizing each tensor to
 * doubles. Shared by the tests that hold a model to tests/ref-model.h. */
#ifndef PKV_REF_GGUF_H
#define PKV_REF_GGUF_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"
#include "model/gguf.h"

static inline double *ref_gguf_tensor(void *user, const char *name, int64_t *n) {
    const pkv_gguf *g = user;
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(g, name);
    if (!t) return NULL;
    float *f = malloc(t->n_elements * sizeof *f);
    double *d = malloc(t->n_elements * sizeof *d);
    if (!f || !d || pkv_dequantize_row(t->type, t->data, f, (int64_t)t->n_elements)) {
        free(f);
        free(d);
        return NULL;
    }
    for (uint64_t i = 0; i < t->n_elements; i++) d[i] = f[i];
    free(f);
    *n = (int64_t)t->n_elements;
    return d;
}

/* Tensor blk.<l>.<suffix> of g as doubles (malloc'd; l < 0: the tensor named suffix);
 * NULL when absent. */
static inline double *ref_gguf_blk(const pkv_gguf *g, int l, const char *suffix) {
    char name[96];
    int64_t n = 0;
    if (l >= 0) snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    else snprintf(name, sizeof name, "%s", suffix);
    return ref_gguf_tensor((void *)g, name, &n);
}

/* y = W·x (+ b) with layer l's tensors w [rows][cols] and b (NULL or absent: none). */
static inline void ref_gguf_mv(const pkv_gguf *g, int l, const char *w, const char *b, const double *x, int rows, int cols,
                               double *y) {
    double *W = ref_gguf_blk(g, l, w), *B = b ? ref_gguf_blk(g, l, b) : NULL;
    for (int r = 0; r < rows; r++) {
        double a = B ? B[r] : 0;
        for (int c = 0; c < cols; c++) a += W[(size_t)r * cols + c] * x[c];
        y[r] = a;
    }
    free(W);
    free(B);
}

/* y = x / sqrt(mean(x^2) + eps) * w, w layer l's tensor (l < 0: a global one). */
static inline void ref_gguf_norm(const pkv_gguf *g, int l, const char *w, const double *x, int n, double eps, double *y) {
    double *W = ref_gguf_blk(g, l, w), ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * W[i];
    free(W);
}

/* Causal grouped-query attention of one query row q [nh][hd] over n cached rows
 * k, v (row t at k + t * stride, [nkv][hd]): out [nh][hd], scores times scale. */
static inline void ref_attend(const double *q, const double *k, const double *v, size_t stride, int n, int nh, int nkv,
                              int hd, double scale, double *out) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return;
    for (int h = 0; h < nh; h++) {
        const int kh = h / (nh / nkv);
        double mx = -1e300, sum = 0;
        for (int t = 0; t < n; t++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += q[h * hd + i] * k[t * stride + (size_t)(kh * hd + i)];
            s[t] = d * scale;
            mx = fmax(mx, s[t]);
        }
        for (int t = 0; t < n; t++) sum += s[t] = exp(s[t] - mx);
        for (int i = 0; i < hd; i++) {
            double a = 0;
            for (int t = 0; t < n; t++) a += s[t] / sum * v[t * stride + (size_t)(kh * hd + i)];
            out[h * hd + i] = a;
        }
    }
    free(s);
}

/* A copy of the GGUF image g (pkv_free it) with key `key` set to u32 `set` (left
 * out where set < 0), tensor `drop` left out, and tensors `swap_a` and `swap_b`
 * trading names (swap_b absent from g: swap_a is renamed to it). NULL on failure. */
static inline void *ref_gguf_variant(const pkv_gguf *g, const char *key, int64_t set, const char *drop, const char *swap_a,
                                     const char *swap_b, size_t *size) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = w != NULL;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) {
        const char *k = pkv_gguf_kv_key(g, i);
        if (key && !strcmp(k, key)) {
            if (set >= 0) ok = !pkv_gguf_writer_add_u32(w, k, (uint32_t)set);
            continue;
        }
        ok = !pkv_gguf_writer_copy_kv(w, g, i);
    }
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        if (drop && !strcmp(t->name, drop)) continue;
        const char *name = swap_a && !strcmp(t->name, swap_a) ? swap_b : swap_a && !strcmp(t->name, swap_b) ? swap_a : t->name;
        ok = !pkv_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    pkv_gguf_writer_free(w);
    return img;
}

#endif
