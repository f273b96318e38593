/* Engine internals shared between context.c and speculative.c. */
#ifndef PKV_ENGINE_H
#define PKV_ENGINE_H

#include "pagekv.h"

/* Re-sync a context made by pkv_context_attach with the target's current
 * sequence: its sequence becomes a fresh fork of the target's (O(1)), keeping
 * its forward workspace; the attach validation is not repeated (the cache's
 * geometry and devices cannot change). It has no logits afterwards.
 * PKV_ERR_INVALID when the two are not on one cache; on error nothing changes. */
pkv_status pkv_context_reattach(pkv_context *draft, pkv_context *target);

/* Set the context's logits (f32 [n_vocab], copied): the caller computed them for
 * the context's last token (speculative decoding keeps every verified row; the
 * serving engine a context request's last row). NULL: the context has none. */
void pkv_context_set_logits(pkv_context *ctx, const float *logits);
/* The serving engine ran tokens [pos, pos + n) of the context's sequence: their
 * final normed hidden states (f32 [n][n_embd]) are kept when the context keeps
 * them (pkv_context_keep_hidden) and the rows are after where keeping began. */
void pkv_context_put_hidden(pkv_context *ctx, int64_t pos, const float *rows, int64_t n);
/* Decode n tokens of an MTP head's context: h_in f32 [n][n_embd] the target's hidden
 * state of each token's previous position; h_out f32 [n][n_embd] receives the head's
 * own (its next input when it drafts on). The last token's logits are kept. */
pkv_status pkv_context_decode_mtp(pkv_context *ctx, const int32_t *tokens, int32_t n, const float *h_in, float *h_out);

/* pkv_context_load on a sequence file image in memory (only read during the
 * call); label names it in messages (NULL = "<memory>"). Same checks and failure
 * contract. The fuzz harnesses use it. */
pkv_context *pkv_context_load_memory(pkv_model *m, pkv_kv_cache *c, const char *label, const void *data, size_t size,
                                     int64_t n_ctx);

#endif
