/* The reference model's tensors from a GGUF file: ref_gguf_tensor is a
 * ref_get_tensor (ref-model.h) over a pkv_gguf, dequantizing each tensor to
 * doubles. Shared by the tests that hold a model to tests/ref-model.h. */
#ifndef PKV_REF_GGUF_H
#define PKV_REF_GGUF_H

#include <stdint.h>
#include <stdbool.h>
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

/* A copy of the GGUF image g (malloc'd, *size bytes; NULL on failure) with key
 * `key` (NULL: none) set to u32 `set` (set >= 0), or to the i32 array i32[n_i32]
 * (i32 not NULL), added where g lacks the key, or else left out; and tensor
 * `drop` (NULL: none) left out. For the tests of bad files. */
static inline void *ref_gguf_variant(const pkv_gguf *g, const char *key, int64_t set, const char *drop, const int32_t *i32,
                                     int n_i32, size_t *size) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    if (!w) return NULL;
    bool ok = true, done = false;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) {
        const char *k = pkv_gguf_kv_key(g, i);
        if (!key || strcmp(k, key)) {
            ok = !pkv_gguf_writer_copy_kv(w, g, i);
            continue;
        }
        done = true;
        if (set >= 0) ok = !pkv_gguf_writer_add_u32(w, k, (uint32_t)set);
        else if (i32) ok = !pkv_gguf_writer_add_arr(w, k, PKV_GGUF_INT32, i32, (uint64_t)n_i32);
    }
    if (ok && key && !done && set >= 0) ok = !pkv_gguf_writer_add_u32(w, key, (uint32_t)set);
    else if (ok && key && !done && i32) ok = !pkv_gguf_writer_add_arr(w, key, PKV_GGUF_INT32, i32, (uint64_t)n_i32);
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        if (drop && !strcmp(t->name, drop)) continue;
        ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    pkv_gguf_writer_free(w);
    return img;
}

#endif
