/* Helpers shared by the device-vs-CPU model tests (test-model-vulkan.c,
 * test-cuda.c): k-quant test models and their f32 twins. Include after
 * test-model.c (which defines V, the vocabulary size). */
#ifndef PKV_KQ_TWIN_H
#define PKV_KQ_TWIN_H

#include "base/quant.h"
#include "model/gguf.h"

/* A model of k-quant matrices: every matrix row is a multiple of 256. */
static pkv_mkmodel_params kq_params(const char *arch, pkv_type t) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = t;
    p.n_layer = 2;
    p.n_embd = 256;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_vocab = V;
    /* qwen35: the delta-net output rows (value heads x head size) a block of 256, and
     * the same in the f32 twin */
    if (!strncmp(arch, "qwen35", 6)) p.ssm_head_dim = 64; /* and qwen35moe */
    /* gemma4: sliding heads and per-layer embeddings of whole blocks, given here so the
     * f32 twin (whose defaults would be smaller) has the same shape */
    if (!strcmp(arch, "gemma4")) p.head_dim_swa = 64, p.n_embd_per_layer = 256;
    return p;
}

/* The f32 twin of a k-quant model image: the same model (same params and seed)
 * written in f32, every tensor then overwritten in place with the k-quant
 * model's tensor dequantized. The CPU's f32 path takes activations in f32, as
 * the GPU k-quant kernels do, so the two must agree as f32 models do. */
static bool kq_twin(const pkv_mkmodel_params *p, const void *kq, size_t kq_size, void **img, size_t *size) {
    pkv_mkmodel_params p32 = *p;
    p32.type = PKV_TYPE_F32;
    if (pkv_mkmodel_memory(&p32, img, size)) return false;
    pkv_gguf *gq = pkv_gguf_open_memory(kq, kq_size, "kq"), *g32 = pkv_gguf_open_memory(*img, *size, "f32");
    bool ok = gq && g32 && pkv_gguf_n_tensors(gq) == pkv_gguf_n_tensors(g32);
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(gq); i++) {
        const pkv_gguf_tensor *tq = pkv_gguf_tensor_at(gq, i), *t32 = pkv_gguf_find_tensor(g32, tq->name);
        ok = t32 && t32->type == PKV_TYPE_F32 && t32->n_elements == tq->n_elements;
        if (ok) ok = pkv_dequantize_row(tq->type, tq->data, (float *)(void *)((uint8_t *)*img + t32->file_offset),
                                        (int64_t)tq->n_elements) == PKV_OK;
    }
    pkv_gguf_close(gq);
    pkv_gguf_close(g32);
    if (!ok) pkv_mkmodel_free_memory(*img);
    return ok;
}

static pkv_model *kq_load(const void *img, size_t size, const char *dev) {
    pkv_model_params mp = pkv_model_default_params();
    mp.device = dev;
    return pkv_model_load_memory(img, size, "kq", mp);
}

#endif
