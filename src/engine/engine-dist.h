/* The serving engine over MPI ranks (docs/distributed.md, "pagekv serve over
 * ranks"): rank 0's engine takes requests and sends, before each step, the
 * calls that changed it since the last (submits with their parameters and
 * prompts, cancels); the other ranks' engines apply the same calls and step, so
 * every rank makes the same library calls in the same order (SPMD) and the
 * model's exchanges between ranks line up. */
#ifndef PKV_ENGINE_DIST_H
#define PKV_ENGINE_DIST_H

#include "pagekv.h"

/* Rank 0 of several: from now on every step first sends the calls since the
 * last one to the other ranks, and pkv_engine_free tells them to stop. Submits
 * that carry what cannot cross (a context, a caller's sampler, a grammar, media,
 * LoRA adapters) are refused with PKV_ERR_UNSUPPORTED. Call before the first step;
 * a no-op in a world of one rank. */
pkv_status pkv_engine_dist_lead(pkv_engine *e);
/* A rank > 0: apply rank 0's calls and step, until rank 0 says stop (PKV_OK).
 * Events are discarded. An error names the rank that failed or stopped
 * answering (rank 0 dead, or diverged). e must not be started. */
pkv_status pkv_engine_dist_follow(pkv_engine *e);

#endif
