/* The reference model's tensors from a GGUF file: ref_gguf_tensor is a
 * ref_get_tensor (ref-model.h) over a pkv_gguf, dequantizing each tensor to
 * doubles. Shared by the tests that hold a model to tests/ref-model.h. */
#ifndef PKV_REF_GGUF_H
#define PKV_REF_GGUF_H

#include <stdbool.h>
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
