/* LoRA adapters inside the forward pass (model layer, internal; lora.c). */
#ifndef PKV_LORA_H
#define PKV_LORA_H

#include "model/blocks.h"

/* uses[0..n) may be a sequence's set: at most PKV_MAX_LORA, each m's, finite scales. */
pkv_status pkv_lora_set_check(const pkv_model *m, const pkv_lora_use *uses, int n, const char *what);
/* Before a step's layers: sets[n_seqs] (scratch) gets each sequence's set (NULL: the
 * model's default); f->lora points to it when some sequence applies an adapter,
 * else stays NULL; the scales and product buffers are made ready. */
pkv_status pkv_lora_step(pkv_fwd *f, const pkv_lora_set **sets);
/* After y = x·wᵀ over T rows (the step's tokens, or its logits rows): y's rows of
 * each sequence += its adapters' deltas of w, in the order of its set. */
pkv_status pkv_lora_delta(const pkv_fwd *f, pkv_device *dev, const pkv_weight *w, pkv_buffer *x, pkv_tref y, int64_t T);
/* After the token embedding's rows of the step's T ids went to x (f32 [T][n_embd],
 * times hp.embd_scale): each sequence's rows += its adapters' token_embd deltas. */
pkv_status pkv_lora_embed(const pkv_fwd *f, pkv_device *dev, pkv_tref ids, pkv_buffer *x);
/* After expert e's product y = x·w_eᵀ over n gathered rows, row i being token
 * rows[i] of the step (ascending): each row += its sequence's adapters' deltas of
 * expert e of w (a MoE matrix, [n_expert * out][in]). */
pkv_status pkv_lora_delta_expert(const pkv_fwd *f, pkv_device *dev, const pkv_weight *w, int64_t e, pkv_buffer *x,
                                 pkv_buffer *y, const int32_t *rows, int64_t n);

/* pagekv mkmodel --lora-of (mklora.c): an adapter for the base file with random A
 * [in, rank] and B [rank, out] for each matrix pkv_lora_load covers, as llama.cpp's
 * converter lays them out. */
typedef struct pkv_mklora_params {
    const char *base; /* the base GGUF */
    int rank;         /* r, 1..4096 */
    float alpha;      /* adapter.lora.alpha (0: none, the scale is the user's) */
    pkv_type type;    /* f32 or f16 */
    uint64_t seed;
} pkv_mklora_params;
pkv_status pkv_mklora_write(const pkv_mklora_params *p, const char *path);

#endif
