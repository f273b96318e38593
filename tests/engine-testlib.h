/* Helpers of the engine tests: a small model, an event recorder, "run it alone"
 * references and bitwise comparison of two runs of a request. */
#ifndef PKV_ENGINE_TESTLIB_H
#define PKV_ENGINE_TESTLIB_H

#include <stdatomic.h>

#include "testhelp.h"

#define ET_MAXT 96  /* most tokens recorded per sample */
#define ET_MAXN 8   /* most samples per request in these tests */
#define ET_TOP 4    /* top logprobs recorded per token */

static const char *et_device = "cpu"; /* where et_model loads */
static int et_n_embd = 64;            /* et_model's width (128: head size 32, for quantized KV pages) */
static pkv_type et_kv_k = PKV_TYPE_F16, et_kv_v = PKV_TYPE_F16; /* et_params' KV page types */

typedef struct et_sample {
    int32_t tok[ET_MAXT];
    float lp[ET_MAXT];
    pkv_token_logprob top[ET_MAXT][ET_TOP];
    int n_top;
    int n;               /* token events (the final one included when it had a token) */
    int finals;          /* final events seen: must end at exactly 1 */
    int after_final;     /* events after the final one: must stay 0 */
    int bad_order;       /* n_generated not matching the count of tokens */
    pkv_finish_reason fin;
    bool stop_token;
    int32_t final_token;
    int32_t n_cached, n_prompt;
    pkv_status status;
} et_sample;

typedef struct et_rec {
    et_sample s[ET_MAXN];
    int stop_after;      /* the callback returns false after this many tokens of a sample; 0: never */
    atomic_int n_final;  /* samples finished (read by other threads) */
    atomic_int n_tokens; /* token events (read by other threads) */
} et_rec;

static bool et_on_event(const pkv_engine_event *ev, void *user) {
    et_rec *r = user;
    if (ev->sample < 0 || ev->sample >= ET_MAXN) {
        TH_FAIL("event for sample %d", ev->sample);
        return true;
    }
    et_sample *s = &r->s[ev->sample];
    if (s->finals) {
        s->after_final++;
        return true;
    }
    s->n_cached = ev->n_cached;
    s->n_prompt = ev->n_prompt;
    if (ev->token >= 0 && s->n < ET_MAXT) {
        s->tok[s->n] = ev->token;
        s->lp[s->n] = ev->logprob;
        s->n_top = ev->n_top;
        for (int i = 0; i < ev->n_top && i < ET_TOP; i++) s->top[s->n][i] = ev->top[i];
        s->n++;
        if (ev->n_generated != s->n) s->bad_order++;
        atomic_fetch_add(&r->n_tokens, 1);
    }
    if (ev->finish != PKV_FINISH_NONE) {
        s->finals++;
        s->fin = ev->finish;
        s->stop_token = ev->stop_token;
        s->final_token = ev->token;
        s->status = ev->status;
        atomic_fetch_add(&r->n_final, 1);
        return true;
    }
    return !(r->stop_after && s->n >= r->stop_after);
}

/* A small model made in memory (320 tokens of vocabulary) of n_layer layers (0:
 * 2; qwen35 4: three delta-net layers, then attention) and n_mtp MTP layers
 * (qwen35); mtp: load the file's MTP head instead of its trunk. */
/* The model mkmodel makes of p, loaded from memory on et_device with 2 threads
 * (mtp: with its MTP head); NULL, having failed the test, when either step fails. */
static inline pkv_model *et_load_made(const pkv_mkmodel_params *p, const char *label, bool mtp) {
    void *data = NULL;
    size_t size = 0;
    if (pkv_mkmodel_memory(p, &data, &size)) {
        TH_FAIL("mkmodel: %s", pkv_errmsg());
        return NULL;
    }
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    mp.device = et_device;
    mp.mtp = mtp;
    pkv_model *m = pkv_model_load_memory(data, size, label, mp);
    pkv_mkmodel_free_memory(data);
    if (!m) TH_FAIL("load: %s", pkv_errmsg());
    return m;
}

static pkv_model *et_model_ex(const char *arch, pkv_type type, uint64_t seed, int n_layer, int n_mtp, bool mtp) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = type;
    /* qwen35: three delta-net layers, then attention; nemotron_h: Mamba-2, MLP, attention; gemma4: mkmodel's six (full, sliding, sliding, full
     * with KV of their own, then a sliding and a full layer reusing theirs) */
    p.n_layer = n_layer ? n_layer : !strcmp(arch, "qwen35") ? 4 : !strcmp(arch, "gemma4") ? 6 : !strcmp(arch, "nemotron_h") ? 3 : 2;
    p.n_mtp = n_mtp;
    p.n_embd = et_n_embd;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 320;
    p.seed = seed;
    return et_load_made(&p, mtp ? "engine-test-mtp" : "engine-test", mtp);
}

/* A small llama-shaped model (q8_0: the quantized batched matmul path). */
static inline pkv_model *et_model(const char *arch, pkv_type type, uint64_t seed) {
    return et_model_ex(arch, type, seed, 0, 0, false);
}

static pkv_engine_params et_params(int n_ctx, int page_size, int64_t n_pages) {
    pkv_engine_params ep = pkv_engine_default_params();
    ep.cache.n_ctx = n_ctx;
    ep.cache.page_size = page_size;
    ep.cache.n_pages = n_pages;
    ep.cache.kv_type = et_kv_k;
    ep.cache.kv_type_v = et_kv_v;
    return ep;
}

/* Request i of a mixed workload over prompt[0..n): greedy mostly, every 4th (i % 4
 * == 3) sampled at 0.9 with seed seed_base + i, every 4th (== 2) with top logprobs,
 * request 5 with n = 3 choices, every 5th stopping at EOS; greedy: all greedy,
 * none stopping. */
static inline pkv_request_params et_mixed_request(int i, const int32_t *prompt, int n, int max_tokens,
                                                  uint64_t seed_base, bool greedy) {
    pkv_request_params r = pkv_request_default_params();
    r.prompt = prompt;
    r.n_prompt = n;
    r.max_tokens = max_tokens;
    r.sampling.temp = 0;
    r.ignore_eos = i % 5 != 4;
    if (i % 4 == 3) {
        r.sampling.temp = 0.9f;
        r.sampling.seed = seed_base + (uint64_t)i;
    }
    if (i % 4 == 2) r.top_logprobs = ET_TOP;
    if (i == 5) r.n = 3;
    if (greedy) {
        r.sampling.temp = 0;
        r.ignore_eos = true;
    }
    return r;
}

/* n requests rp[i], each submitted at step arrive[i] with its events recorded in
 * got[i], stepped until all finished (at least min_steps steps; bounded, so a
 * scheduler bug fails rather than hangs). */
static inline void et_run_arrivals(pkv_engine *e, int n, const int *arrive, const pkv_request_params *rp, et_rec *got,
                                   int min_steps, const char *what) {
    int left = 1;
    for (int step = 0; step < min_steps || left > 0; step++) {
        for (int i = 0; i < n; i++)
            if (arrive[i] == step) {
                memset(&got[i], 0, sizeof got[i]);
                pkv_request_params r = rp[i];
                r.on_event = et_on_event;
                r.user = &got[i];
                CHECK_OK(pkv_engine_submit(e, &r, NULL));
            }
        CHECK_OK(pkv_engine_step(e, &left));
        if (step > 100000) {
            TH_FAIL("%s: not done after %d steps", what, step);
            break;
        }
    }
}

/* Step until every request finished (bounded, so a scheduler bug fails rather than hangs). */
static void et_drain(pkv_engine *e) {
    int left = 1;
    for (long i = 0; left > 0 && i < 1000000; i++) {
        pkv_status s = pkv_engine_step(e, &left);
        if (s) {
            TH_FAIL("step: %s", pkv_errmsg());
            return;
        }
    }
    if (left) TH_FAIL("%d requests still pending", left);
}

/* The request run alone: a fresh engine with a pool large enough for it. */
static inline void et_alone(pkv_model *m, const pkv_request_params *rp, et_rec *out) {
    memset(out, 0, sizeof *out);
    out->stop_after = 0;
    pkv_engine *e = pkv_engine_create(m, et_params(256, 8, 0));
    if (!e) {
        TH_FAIL("engine: %s", pkv_errmsg());
        return;
    }
    pkv_request_params r = *rp;
    r.on_event = et_on_event;
    r.user = out;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    pkv_engine_free(e);
}

/* Same tokens, bitwise the same logprobs and top alternatives, same finish. */
static inline bool et_same(const et_rec *a, const et_rec *b, int n, const char *what, int idx) {
    for (int j = 0; j < n; j++) {
        const et_sample *x = &a->s[j], *y = &b->s[j];
        bool ok = x->n == y->n && x->fin == y->fin && x->finals == 1 && y->finals == 1 && !x->after_final &&
                  !y->after_final && !x->bad_order && !y->bad_order && x->n > 0;
        ok = ok && !memcmp(x->tok, y->tok, (size_t)x->n * sizeof x->tok[0]) &&
             !memcmp(x->lp, y->lp, (size_t)x->n * sizeof x->lp[0]);
        for (int t = 0; ok && t < x->n && t < ET_MAXT; t++)
            for (int k = 0; k < x->n_top && k < ET_TOP; k++)
                ok = ok && x->top[t][k].token == y->top[t][k].token &&
                     !memcmp(&x->top[t][k].logprob, &y->top[t][k].logprob, sizeof(float));
        if (!ok) {
            int first = 0;
            while (first < x->n && first < y->n && x->tok[first] == y->tok[first] &&
                   !memcmp(&x->lp[first], &y->lp[first], sizeof(float)))
                first++;
            TH_FAIL("%s %d sample %d: %d tokens (finish %s, %d finals) vs %d (finish %s, %d finals); first "
                    "difference at token %d",
                    what, idx, j, x->n, pkv_finish_reason_str(x->fin), x->finals, y->n,
                    pkv_finish_reason_str(y->fin), y->finals, first);
            return false;
        }
    }
    th_checks++;
    return true;
}

static inline uint64_t et_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#endif
