/* Token sampling over one row of logits on the host.
 *
 * The chain, in this order:
 *   1. repetition penalty over the last repeat_last_n accepted tokens (each distinct
 *      token once: a positive logit is divided by the penalty, a negative or zero one
 *      multiplied — llama.cpp's semantics);
 *   2. temperature: temp <= 0 means greedy (argmax, the lowest index on ties) and the
 *      remaining steps are skipped; otherwise logits are divided by temp;
 *   3. top-k: keep the k largest (ties broken by the lower token id);
 *   4. top-p: over the softmax of the top-k survivors, keep the smallest prefix (by
 *      descending probability) whose probability sum is >= top_p; at least one token;
 *   5. min-p: keep tokens with p >= min_p * p_max;
 *   6. draw from the renormalized survivors with the sampler's own PRNG
 *      (xoshiro256** seeded through splitmix64): the same seed gives the same tokens
 *      on every machine.
 * The sampler does not allocate after pkv_sampler_create. Not thread-safe: one
 * sampler per sequence.
 * (The public parts move to include/pagekv.h's engine section later.) */
#ifndef PKV_SAMPLER_H
#define PKV_SAMPLER_H

#include "pagekv.h"

typedef struct pkv_sampler_params {
    float temp;           /* temperature; <= 0: greedy (argmax) */
    int top_k;            /* keep the k most likely tokens; 0: off; must be >= 0 */
    float top_p;          /* nucleus threshold in (0, 1]; 1: off */
    float min_p;          /* keep p >= min_p * p_max; in [0, 1]; 0: off */
    float repeat_penalty; /* > 0; 1: off */
    int repeat_last_n;    /* how many accepted tokens the penalty looks back; 0: off; >= 0 */
    uint64_t seed;        /* PRNG seed; every value (0 included) is a fixed, reproducible seed */
} pkv_sampler_params;

typedef struct pkv_sampler pkv_sampler;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0 (off),
 * repeat_last_n 64, seed 0. */
pkv_sampler_params pkv_sampler_default_params(void);

/* A sampler for rows of n_vocab logits. Returns NULL with a message naming the field
 * on bad params (top_k < 0, top_p outside (0, 1], min_p outside [0, 1],
 * repeat_penalty <= 0, repeat_last_n < 0, NaN anywhere, n_vocab <= 0), or on
 * allocation failure. */
pkv_sampler *pkv_sampler_create(pkv_sampler_params p, int32_t n_vocab);
void pkv_sampler_free(pkv_sampler *s);

/* Samples one token from logits [n_vocab] (not modified) into *out_token. Does not
 * add the token to the history: call pkv_sampler_accept for that.
 * Errors: PKV_ERR_INVALID for NULL arguments or a NaN/inf logit (the message names
 * the first such index). On error nothing is changed (the PRNG does not advance). */
pkv_status pkv_sampler_sample(pkv_sampler *s, const float *logits, int32_t *out_token);

/* Appends token to the repetition-penalty history (the last repeat_last_n are kept).
 * Tokens outside [0, n_vocab) are kept in the history but never penalize anything. */
void pkv_sampler_accept(pkv_sampler *s, int32_t token);

/* Forgets the history and restarts the PRNG from the seed. */
void pkv_sampler_reset(pkv_sampler *s);

/* The probabilities the next pkv_sampler_sample would draw from, after the whole
 * chain: writes n_vocab floats, zero for filtered tokens, summing to 1 (greedy: a
 * one-hot row). Does not advance the PRNG.
 * Errors: as pkv_sampler_sample; on error probs is not written. */
pkv_status pkv_sampler_probs(pkv_sampler *s, const float *logits, float *probs);

/* For speculative sampling, both from the sampler's PRNG stream:
 * a uniform double in [0, 1) (e.g. the acceptance test u < p/q), and a draw of a token
 * from explicit weights [n_vocab] (e.g. the residual max(0, p - q)): non-negative,
 * finite, not all zero; they need not sum to 1.
 * pkv_sampler_draw errors: PKV_ERR_INVALID for NULL arguments or bad weights (the
 * message names the index); nothing changed. */
double pkv_sampler_uniform(pkv_sampler *s); /* s must not be NULL */
pkv_status pkv_sampler_draw(pkv_sampler *s, const float *weights, int32_t *out_token);

#endif /* PKV_SAMPLER_H */
