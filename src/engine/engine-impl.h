/* The serving engine's internals, shared by engine.c (API, queue, thread, stats)
 * and engine-sched.c (the step: admission, batching, preemption, sampling).
 * docs/engine.md describes the scheduler. */
#ifndef PKV_ENGINE_IMPL_H
#define PKV_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/base.h"
#include "model/forward.h"

typedef enum eng_seq_state {
    SEQ_NONE = 0, /* not created yet (samples 1..n-1 before the fork) */
    SEQ_RUNNING,  /* holds a resident KV sequence */
    SEQ_SWAPPED,  /* preempted: its KV sequence is in the host pool */
    SEQ_DROPPED,  /* preempted: no KV; tokens are recomputed on resume */
    SEQ_DONE,     /* its final event was delivered */
} eng_seq_state;

typedef struct eng_req eng_req;

/* A context handed to the engine while idle (pkv_engine_context_hold): the
 * engine may swap it out to make room and swaps it back in itself. */
typedef struct eng_held {
    pkv_context *ctx;
    uint64_t used;      /* e->held_clock when last held or used by a request (LRU) */
    unsigned flags;     /* PKV_HOLD_* */
} eng_held;

enum { ENG_MAX_DRAFT = 64 };

/* One sample of a request: a KV sequence plus the tokens it must hold. Tokens
 * [0, n_kv) are in the cache; [n_kv, n_tok) still have to be run through the
 * model (the rest of the prompt, the last sampled token, or everything after a
 * drop). When n_kv reaches n_tok the step's logits row samples the next token. */
typedef struct eng_seq {
    eng_req *r;
    int sample;
    eng_seq_state st;
    int32_t kv;       /* KV sequence id, -1 without one */
    int32_t *tok;     /* [cap] prompt, then generated tokens */
    int32_t n_tok, cap;
    int32_t n_kv;
    int32_t n_gen;
    pkv_sampler *smp; /* seed + sample, or the request's own sampler; NULL before the sample starts */
    int32_t step_n;   /* tokens in the current step's batch (0: not in it) */
    bool dist_stop;   /* leading over MPI ranks: its callback said stop; every rank ends it at the
                         next step's start (pkv_engine_end_sample), its events are not delivered */
    /* Speculative decoding (engine-sched.c, "draft"). The draft holds a row per
     * committed token up to n_dtrue (an MTP head's row p is made from token p and
     * the target's hidden state at p - 1, so n_dtrue <= n_kv + 1), then the rows of
     * the last proposals; prop[0..n_prop) are also at tok[n_tok..). */
    int32_t dkv;      /* the draft's sequence, -1 without one */
    int32_t n_dtrue, n_dkv;
    int32_t n_prop;
    int32_t prop[ENG_MAX_DRAFT];
    float *q;         /* [K][n_vocab] f32, PKV_DRAFT_ACCEPT_SAMPLING: the draft's distribution each
                         proposal was drawn from; NULL until the first */
    int32_t h_row;    /* this step's hidden rows: row h_row is position h_pos; -1: none */
    int32_t h_pos;
    bool nodraft;     /* goes on without the draft (its pool ran out, or it failed) */
    /* A request on a context that starts from the context's logits (no prompt), with
     * a draft: its first round drafts as if the context's last token (in the KV) were
     * pending, and the step runs the proposals alone, the first verified against the
     * context's logits (engine-sched.c, first_rounds). Until that step verifies them;
     * a round that proposes nothing samples the first token from the logits. */
    bool dfirst;
    bool spilled;     /* dropped with its full pages spilled to disk (resumed by a prefix match) */
    int64_t n_shifted; /* tokens the context shift dropped (pkv_request_params.context_shift) */
    /* A request on a context (pkv_request_params.context) keeps its last token: the
     * final event waits, with what it carries, until the step that runs the token
     * into the context's KV; a prefill-only request's is held from admission until
     * its prompt's last token is in. fin_wait NONE: no final event waiting. */
    pkv_finish_reason fin_wait;
    bool lp_ok;       /* last_pending: the context holds the logits of its last token (n_tok - 1) */
    bool fin_stop;
    int32_t fin_tok;  /* -1: the final event carries no token */
    float fin_lp;
    int fin_ntop;
    pkv_token_logprob fin_top[PKV_ENGINE_MAX_TOP_LOGPROBS];
} eng_seq;

struct eng_req {
    uint64_t id;
    uint64_t order;     /* submission order: ties of priority go to the earlier */
    pkv_request_params p; /* prompt and stop_tokens point at the copies below */
    int32_t *prompt;    /* [n_prompt] */
    int32_t *stop;      /* [n_stop] */
    pkv_logit_bias *bias; /* [p.sampling.n_logit_bias]: the sampling's logit_bias, copied */
    int32_t max_tokens; /* resolved: > 0 */
    int n;
    int32_t n_cached;   /* prompt tokens reused from the prefix cache at admission */
    int32_t n_base;     /* with a context: its length at admission (a drop truncates back to it) */
    bool started;       /* sample 0 has been admitted once */
    bool forked;        /* samples 1..n-1 exist */
    bool cancel;        /* engine-thread copy of cancel_flag */
    bool cancel_flag;   /* set by pkv_engine_cancel under the mutex */
    atomic_bool stop_grammar; /* set with cancel_flag: a grammar mask in progress stops at once */
    bool failed;
    int n_final;        /* samples whose final event was delivered */
    eng_seq *seqs;      /* [n] */
    eng_req *next;      /* incoming queue link */
    /* Media chunks (pkv_request_params.media): records with start = the index in
     * the expanded prompt (r->prompt holds their media ids), and their rows in
     * order, f32 [n_media_rows][n_embd]. */
    pkv_kv_media *media;
    int n_media;
    float *embd;
    int64_t n_media_rows;
    /* An embedding request (pkv_request_params.embed): the pooled result, f32
     * [n_pool], and MEAN's running sum over the tokens computed so far, [n_embd]
     * (in position order, so chunking and batching do not change it) */
    float *pool;
    double *acc;
    int32_t n_pool;
    /* its LoRA set (pkv_request_params.lora, copied), when it names one */
    bool has_lora;
    pkv_lora_set lora;
    uint64_t fp;        /* fingerprint of its KV sequences: e->fp, or with its LoRA set; 0 without prefix caching */
};

struct pkv_engine {
    pkv_model *m;
    pkv_kv_cache *c;
    pkv_kv_cache *own_cache; /* c when the engine made it; NULL on the caller's (use_cache) */
    pkv_engine_params p;
    int32_t n_vocab;
    int64_t n_ctx;
    int ps;             /* page size */
    int64_t n_pages;    /* device pool */
    uint64_t fp;        /* fingerprint of new KV sequences: the model's, or 0 without prefix caching */
    bool invariant;     /* every device of the model is batch-invariant */

    /* engine-thread state */
    pkv_fwd_ws *ws;
    float *logits;      /* [cap_logits][n_vocab] rows of the last step */
    size_t cap_logits;
    int32_t *b_nl;      /* [max_seqs] logits rows per sequence of the step */
    /* speculative decoding: the draft, its own cache and workspace */
    pkv_model *dm;
    pkv_kv_cache *dc;
    pkv_fwd_ws *dws;
    bool dmtp;          /* an MTP head: fed the target's hidden states */
    bool dasst;         /* Gemma 4's assistant: no cache (dc NULL), reads the model's pages, fed
                           its hidden states; dh_in/dh_out rows are n_embd wide too */
    bool dshared;       /* a shared-KV draft: no cache (dc NULL), its layers attend over the model's
                           cache layers; it drafts on forks of the model's sequences */
    bool dngram;        /* n-gram drafts (pkv_engine_params.draft_ngram): no draft model */
    int ng_min, ng_max; /* the n-gram lengths looked up */
    int32_t *d_pos;     /* [max_seqs]: an assistant step's query positions */
    int K;
    uint64_t dfp;
    float *hid;         /* [cap_hid][n_embd]: the target step's hidden states (MTP) */
    float *dh_in, *dh_out; /* [cap_hid][n_embd]: a draft step's */
    size_t cap_hid, cap_hid_d, cap_hid_o;
    float *dlogits;     /* [max_seqs][n_vocab]: a draft step's */
    float *vp;          /* [n_vocab] f32, PKV_DRAFT_ACCEPT_SAMPLING: the model's distribution
                           of the row being verified, then the residual */
    float *vfirst;      /* [cap_vfirst][n_vocab]: a first round's rows (the context's logits, the step's) */
    size_t cap_vfirst;
    int32_t *d_seq, *d_n, *d_tok; /* [max_seqs], [max_seqs], [cap_dtok]: a draft step's batch */
    size_t cap_dtok;
    eng_seq **d_who;    /* [max_seqs] */
    uint64_t d_proposed, d_accepted, d_steps, d_disabled, d_skipped;
    uint64_t g_masks;   /* constrained output: token masks computed, and their seconds */
    double g_mask_s;
    pkv_grammar_vocab *gvocab; /* the model's token trie, made at the first request with a grammar */
    eng_req **reqs;     /* [n_reqs] admitted and waiting requests, priority order */
    int n_reqs, reqs_cap;
    eng_seq **batch;    /* [max_seqs] this step's sequences */
    int32_t *b_kv, *b_n, *b_tok; /* [max_seqs], [max_seqs], [max_batch_tokens] */
    const pkv_lora_set **b_lora; /* [max_seqs]: the step's sequences' LoRA sets (pkv_fwd_batch.lora) */
    int32_t *b_span;    /* [max_batch_tokens]: the step's non-causal spans (pkv_fwd_batch.span_end) */
    float *b_embd;      /* [cap_embd][n_embd]: the step's media rows */
    size_t cap_embd;
    pkv_token_logprob top[PKV_ENGINE_MAX_TOP_LOGPROBS];
    uint64_t hit_tokens, prompt_tokens, computed, generated, pre_swap, pre_drop, steps;
    uint64_t finished, cancelled, failed;
    /* spilling to disk (engine-sched.c, preempt): counts, and the measures the
     * PKV_SPILL_AUTO rule compares (seconds over pages or tokens) */
    uint64_t sp_n, sp_failed, sp_written, sp_bytes, sp_read, sp_resumed;
    double sp_write_s, sp_read_s;
    double pf_s;        /* forward seconds of steps of at least a page of tokens */
    uint64_t pf_tok;    /* and their tokens */
    int64_t pages_peak;
    eng_held *held;     /* [n_held] idle contexts the engine owns (engine-contexts.c) */
    int n_held, held_cap;
    uint64_t held_clock;
    uint64_t ctx_out, ctx_in; /* held contexts swapped out to make room; contexts swapped back in */
    bool short_of_pages; /* the last admit() stopped for want of pages (stats.waiting_for_pages) */
    double busy;

    /* shared state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    eng_req *in_head, *in_tail; /* submitted, not yet taken by a step */
    eng_req **live;             /* [n_live] every unfinished request (for cancel) */
    int n_live, live_cap;
    bool cancel_pending;
    uint64_t next_id, submitted;
    pkv_engine_stats snap;      /* as of the last step boundary */
    pthread_t th;
    bool running, stop;
    int in_step;                /* guards pkv_engine_step against the thread */
    /* over MPI ranks (engine-dist.c): rank 0 leads, the others follow its calls */
    int dist;                   /* ENG_DIST_* */
    uint64_t *dist_cancel;      /* [n_dist_cancel] leading: ids cancelled since the last step, in order */
    int n_dist_cancel, dist_cancel_cap;
};

enum { ENG_DIST_NONE = 0, ENG_DIST_LEAD, ENG_DIST_FOLLOW };
/* An entry of the step message's cancel list that ends one sample of a request
 * (its callback said stop on rank 0), not the whole request (a plain id). */
#define ENG_SAMPLE_STOP(id, sample) ((uint64_t)(id) | ((uint64_t)(sample) + 1) << 48)
#define ENG_STOP_ID(v) ((v) & ((UINT64_C(1) << 48) - 1))
#define ENG_STOP_SAMPLE(v) ((int)((v) >> 48) - 1) /* -1: the whole request */
/* End sample `sample` of request id now (a final STOP event), if it is still running. */
void pkv_engine_end_sample(pkv_engine *e, uint64_t id, int sample);

/* engine-sched.c */
pkv_status pkv_engine_step_locked_out(pkv_engine *e, bool *did_work); /* one step; mu not held */
/* Final CANCELLED events for everything still unfinished; frees the requests. */
void pkv_engine_cancel_all(pkv_engine *e);
void pkv_engine_req_free(pkv_engine *e, eng_req *r);
/* engine-dist.c. Leading: send the other ranks this step's calls, the requests
 * head.. (in order, just taken from the queue) and the cancels; mu not held. */
pkv_status pkv_engine_dist_send(const eng_req *head, const uint64_t *cancel, int n_cancel);
/* Leading: pkv_engine_cancel's part (mu held): id is logged for the next step. */
pkv_status pkv_engine_dist_log_cancel(pkv_engine *e, uint64_t id);
/* Leading: what submit cannot send to the other ranks, refused (PKV_ERR_UNSUPPORTED). */
pkv_status pkv_engine_dist_check(const pkv_engine *e, const pkv_request_params *rp);
/* Leading: tell the other ranks to stop (pkv_engine_free); leading ends. */
void pkv_engine_dist_stop(pkv_engine *e);
/* engine-contexts.c: swap out the least recently used idle held context (other
 * than keep) whose swap frees device pages. false when none could go. */
bool pkv_engine_ctx_evict(pkv_engine *e, const pkv_context *keep);
/* A request on ctx ran or ended: it is the most recently used held context. */
void pkv_engine_ctx_touch(pkv_engine *e, const pkv_context *ctx);
bool pkv_engine_ctx_held(const pkv_engine *e, const pkv_context *ctx);
/* Held contexts, and how many of them are in the host pool. */
void pkv_engine_ctx_counts(const pkv_engine *e, int *held, int *swapped);
/* Refresh the statistics snapshot (takes the mutex). */
void pkv_engine_snapshot(pkv_engine *e);

#endif
