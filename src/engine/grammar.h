/* Constrained sampling: a GBNF grammar compiled to a pushdown automaton over
 * Unicode code points, a matcher per sequence fed with bytes, and token masks
 * computed by walking a byte trie of the vocabulary (docs/engine.md,
 * "Constrained output"). The public API is in include/pagekv.h; these are the
 * pieces the sampler, the JSON-schema converter and the tests use. */
#ifndef PKV_GRAMMAR_H
#define PKV_GRAMMAR_H

#include <stdatomic.h>

#include "pagekv.h"

/* Limits on what a grammar may ask for (bounded before it is allocated for). */
enum {
    PKV_GRAMMAR_MAX_TEXT = 1 << 20,   /* bytes of GBNF */
    PKV_GRAMMAR_MAX_ELEMS = 1 << 21,  /* automaton elements after expanding repetitions */
    PKV_GRAMMAR_MAX_REPEAT = 100000,  /* m and n of {m,n} */
    PKV_GRAMMAR_MAX_STACKS = 1 << 14, /* live parse stacks of one matcher state */
    PKV_GRAMMAR_MAX_NESTING = 256,    /* '(' groups inside each other (the parser recurses on them) */
};

/* Default work limits of a matcher, in steps (one parse stack expanded or tested
 * against a character): per token (one mask, or accepting one token's bytes) and
 * per request (everything since the matcher started). A JSON schema's mask over a
 * 150k-token vocabulary takes well under a tenth of the per-token limit. */
#define PKV_GRAMMAR_WORK_TOKEN 20000000ull
#define PKV_GRAMMAR_WORK_REQUEST 1000000000ull

/* GBNF text (len bytes, need not be NUL-terminated) to a grammar; origin names the
 * source in messages ("grammar", "json schema"). NULL with pkv_errmsg() naming
 * line:column and the problem. */
pkv_grammar *pkv_grammar_parse(const char *text, size_t len, const char *origin);
/* Another reference (pkv_grammar_free drops one). Thread-safe. */
pkv_grammar *pkv_grammar_retain(const pkv_grammar *g);

/* A matcher: the parse state of one sequence. */
typedef struct pkv_gmatch pkv_gmatch;

pkv_gmatch *pkv_gmatch_create(const pkv_grammar *g);
void pkv_gmatch_free(pkv_gmatch *m);
/* Back to the grammar's start. */
void pkv_gmatch_reset(pkv_gmatch *m);
/* A flag another thread may set to stop m's current operation (a long mask) with
 * an error; NULL: none. The flag must outlive m. */
void pkv_gmatch_set_cancel(pkv_gmatch *m, const atomic_bool *flag);
/* Why m stopped for good (a work limit passed, cancelled), or NULL. */
const char *pkv_gmatch_failure(const pkv_gmatch *m);
/* Steps of the last operation and since the start (benchmarks, tests). */
void pkv_gmatch_work(const pkv_gmatch *m, uint64_t *last_op, uint64_t *total);
/* A copy of m's current state (its own node arena). NULL on NOMEM. */
pkv_gmatch *pkv_gmatch_clone(const pkv_gmatch *m);
/* Feed bytes. False (and m unchanged) when they do not continue a valid prefix,
 * or the matcher's state limits were hit (pkv_errmsg says which). */
bool pkv_gmatch_accept_bytes(pkv_gmatch *m, const void *bytes, size_t n);
/* The input so far is a complete sentence (end of generation allowed). */
bool pkv_gmatch_complete(const pkv_gmatch *m);
/* No continuation at all is possible (complete and nothing may follow, or dead). */
bool pkv_gmatch_dead(const pkv_gmatch *m);

/* Feed a token: its bytes, or an end-of-generation token (only when complete).
 * False when the token is not allowed (m unchanged). */
bool pkv_gmatch_accept_token(pkv_gmatch *m, const pkv_grammar_vocab *v, int32_t token);
/* The allowed tokens of m's state as a bitset of ceil(n_vocab / 64) words (bit t
 * of word t / 64): tokens whose bytes keep the input a valid prefix, and the
 * vocabulary's end-of-generation tokens when the input is complete. Returns the
 * number allowed; -1 on an internal limit (pkv_errmsg). */
int64_t pkv_gmatch_mask(pkv_gmatch *m, const pkv_grammar_vocab *v, uint64_t *bits);

/* A vocabulary from explicit token pieces (tests, benchmarks): pieces[i] of
 * lens[i] bytes for i < n; eog[0..n_eog) the end-of-generation ids. */
pkv_grammar_vocab *pkv_grammar_vocab_from_pieces(const char *const *pieces, const size_t *lens, int32_t n,
                                                 const int32_t *eog, int n_eog);
int32_t pkv_grammar_vocab_n(const pkv_grammar_vocab *v);
bool pkv_grammar_vocab_is_eog(const pkv_grammar_vocab *v, int32_t token);

#endif
