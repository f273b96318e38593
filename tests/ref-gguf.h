/* The reference model's tensors from a GGUF file: ref_gguf_tensor is a
 * ref_get_tensor (ref-model.h) over a pkv_gguf, dequantizing each tensor to
 * doubles. Shared by the tests that hold a model to tests/ref-model.h. */
#ifndef PKV_REF_GGUF_H
#define PKV_REF_GGUF_H

#include <stdint.h>
#include <stdlib.h>

#include "base/quant.h"
#include "model/gguf.h"

static double *ref_gguf_tensor(void *user, const char *name, int64_t *n) {
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

#endif
