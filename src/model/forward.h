/* The forward pass over the paged KV cache (model layer, internal). */
#ifndef PKV_FORWARD_H
#define PKV_FORWARD_H

#include "model/model-impl.h"

typedef struct pkv_fwd_ws pkv_fwd_ws; /* device workspace, reused across steps */
void pkv_fwd_ws_free(pkv_fwd_ws *ws);

/* One step: n_tokens[i] tokens for sequence seqs[i] (distinct, resident), tokens
 * concatenated in that order. pos NULL: positions continue each sequence. */
/* The LoRA adapters one sequence applies (pkv_lora_use, scale 0 skipped). */
typedef struct pkv_lora_set {
    int n;
    pkv_lora_use u[PKV_MAX_LORA];
} pkv_lora_set;

/* Its fingerprint over the model's base fingerprint: the base's when no adapter has
 * a nonzero scale. */
uint64_t pkv_lora_set_fingerprint(const pkv_model *m, const pkv_lora_set *set);

typedef struct pkv_fwd_batch {
    int n_seqs;
    const int32_t *seqs;
    const int32_t *n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    bool all_logits; /* logits for every token, else for the last token of each sequence */
    /* NULL, or logits for the last n_logits[i] tokens of sequence i (1..n_tokens[i];
     * overrides all_logits): rows in batch order (a speculative verification next
     * to prefill chunks that need one row) */
    const int32_t *n_logits;
    bool no_publish; /* append without token ids: pages never enter the prefix index */
    /* An MTP head's second input (pkv_model.mtp): f32 [T][n_embd] host rows, the
     * target's final normed hidden state of each token's previous position */
    const float *hidden_in;
    /* f32 [T][n_embd] host rows (NULL = not wanted): every token's final normed
     * hidden state (what the output matrix multiplies; an MTP head's next input).
     * A Gemma 4 assistant: f32 [n_out][n_embd_out], each logits row's next hidden
     * state (post_projection of its final normed row). An assistant's hidden_in is
     * f32 [T][n_embd_out]: the target's hidden state each query starts from. */
    float *hidden_out;
    /* Queries that append nothing (a Gemma 4 assistant, whose layers only read a
     * target's KV): token k of sequence i is a query at position pos[k] (required)
     * that sees every cached token of the sequence; no cache changes. */
    bool peek;
    /* Media rows (docs/multimodal.md, "Media in the cache"): the input embeddings of the batch's
     * tokens whose id is a media id (pkv_token_is_media), f32 [n_media_rows][n_embd]
     * host rows in batch order, used as they are (no embedding scale), instead of
     * rows of the embedding table. */
    const float *media_embd;
    int64_t n_media_rows;
    /* NULL, or per token (batch order): 0 for a causal query, else the query sees
     * its sequence's tokens up to the one at index span_end - 1 of this batch's
     * tokens of that sequence (1-based end): the rows of a non-causal media chunk
     * all get the chunk's end. A span is never split across steps. */
    const int32_t *span_end;
    /* NULL, or [n_seqs]: sequence i's LoRA adapters (an entry NULL: the model's
     * default set, pkv_model_lora_apply); NULL: every sequence the default set */
    const pkv_lora_set *const *lora;
} pkv_fwd_batch;

/* Offsets (in int32 elements) of the step's integer block on the device. */
typedef struct pkv_fwd_plan {
    int64_t T, n_out;
    int n_seqs, meta_pages;
    size_t off_ids, off_pos, off_rows, off_out, off_meta;
    /* The window pool (layers whose cache layer has a window): its rows and meta. */
    bool window;
    int meta_pages_w;
    size_t off_rows_w, off_meta_w;
    bool replay; /* recomputing window layers or recurrent state: full layers' KV is already cached */
    bool peek;   /* pkv_fwd_batch.peek: queries see all cached tokens; a window of W shows the last
                    W - 1 of them (the query's own position would be the W-th) */
    /* Recurrent layers: the kernels' meta, indptr[n_seqs + 1] then each sequence's
     * state slot[n_seqs] */
    bool state;
    size_t off_smeta;
    /* A step with non-causal spans (media chunks): each row's own causal length
     * (its position in the sequence + 1) at off_qwin, the attention's q_win for
     * sliding-window layers (device.h): a chunk's row at position p sees keys
     * [p + 1 - window, chunk end), llama.cpp's sliding mask. 0: none. */
    size_t off_qwin;
} pkv_fwd_plan;

/* Run one step. logits (host, may be NULL) receives f32 [n_out][n_vocab] with
 * n_out = the sum of n_logits, else total tokens when all_logits, else n_seqs. *ws is created or grown as
 * needed. On error the cache is as before the call (appended tokens truncated). */
pkv_status pkv_model_forward(pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **ws, const pkv_fwd_batch *b, float *logits);

/* KV cache parameters matching the model's geometry and head split (I5).
 * layers: [n_layer] and shards: [n_layer * n_dev] scratch the params point into. */
pkv_kv_params pkv_model_kv_params(const pkv_model *m, pkv_kv_layer_desc *layers, pkv_kv_shard_desc *shards);
/* LongRoPE's factors for a cache holding at most n_ctx tokens per sequence, as
 * llama.cpp chooses them: the long ones when n_ctx is above the original context
 * (rope.scaling.original_context_length), else the short ones; f32 [n_rot / 2]
 * (pkv_kv_params.rope_factors). NULL: the model has none. */
const float *pkv_model_rope_factors(const pkv_model *m, int64_t n_ctx);

#endif
