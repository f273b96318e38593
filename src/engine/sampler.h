/* Sampling: the public API is in include/pagekv.h (engine section). The helpers
 * below are for speculative sampling; they move there when the engine uses them. */
#ifndef PKV_SAMPLER_H
#define PKV_SAMPLER_H

#include <stdatomic.h>

#include "pagekv.h"

/* Both from the sampler's PRNG stream (so reset replays them):
 * a uniform double in [0, 1) (e.g. the acceptance test u < p/q; s must not be NULL),
 * and a token drawn from explicit weights [n_vocab] (e.g. the residual max(0, p - q)):
 * non-negative, finite, not all zero; they need not sum to 1.
 * pkv_sampler_draw errors: PKV_ERR_INVALID for NULL arguments or bad weights (the
 * message names the index); on error nothing is changed. */
double pkv_sampler_uniform(pkv_sampler *s);
pkv_status pkv_sampler_draw(pkv_sampler *s, const float *weights, int32_t *out_token);

/* The checks of pkv_sampler_create on its params alone (no allocation):
 * PKV_ERR_INVALID with a message naming the field. */
pkv_status pkv_sampler_check_params(const pkv_sampler_params *p);

/* The sampler has a grammar (pkv_sampler_set_grammar). */
bool pkv_sampler_has_grammar(const pkv_sampler *s);
/* Masks of allowed tokens computed so far and the seconds they took (0 without a grammar). */
void pkv_sampler_grammar_cost(const pkv_sampler *s, uint64_t *n_masks, double *seconds);
/* A flag that stops the grammar's work in progress (a cancelled request); the flag
 * must outlive the sampler's grammar. */
void pkv_sampler_grammar_cancel(pkv_sampler *s, const atomic_bool *flag);

#endif /* PKV_SAMPLER_H */
