/* Sampling: the public API is in include/pagekv.h (engine section). The helpers
 * below are for speculative decoding (pkv_spec in speculative.c and the serving
 * engine's PKV_DRAFT_ACCEPT_SAMPLING rule in engine-sched.c). */
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

/* The speculative-sampling rule (Leviathan et al. / Chen et al.), in two halves.
 * Propose: q = the chain over the draft's logits row [n_vocab] (written to q,
 * [n_vocab]), and a token drawn from it. Verify a proposal d drawn from q: p = the
 * chain over the target's logits row (written to the scratch p [n_vocab]); d is
 * accepted with probability min(1, p(d)/q(d)) (u * q(d) < p(d), u uniform); else
 * the correction is drawn from max(0, p - q) (from p itself where p == q up to
 * rounding), so the token has the target's distribution whatever q is. With
 * greedy sampling both are one-hot and the rule keeps d exactly when it is the
 * target's most likely token. Both draw from the sampler's PRNG stream and leave
 * its history alone (the caller accepts the tokens it keeps). Errors: as
 * pkv_sampler_probs / pkv_sampler_draw; the PRNG may have advanced. */
pkv_status pkv_sampler_spec_propose(pkv_sampler *s, const float *draft_logits, float *q, int32_t *out_token);
pkv_status pkv_sampler_spec_verify(pkv_sampler *s, const float *logits, const float *q, int32_t d, float *p,
                                   bool *accepted, int32_t *out_token);

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
