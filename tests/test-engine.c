// labels: kv timeout=600
/* The serving engine (src/engine/engine*.c), content-checked against the same
 * request run alone and against the plain context API:
 *  - greedy through the engine equals pkv_context_decode + pkv_generate;
 *  - batch invariance: 64 mixed requests (random arrival steps, prompt lengths,
 *    shared prefixes, greedy and seeded sampling, chunked prefill) give bitwise
 *    the tokens, logprobs and top alternatives each gives alone;
 *  - preemption: a pool holding a fraction of the load, by swap, by recompute
 *    (swap off, and host pool too small), with and without the prefix cache:
 *    every request still equals its lone run; the pool ends empty;
 *  - prefix cache: a shared prefix is reused (counted, computed tokens counted)
 *    with the same tokens as with the cache off;
 *  - n = 4 by fork equals 4 requests with seeds s..s+3, the prompt computed once;
 *  - cancellation (running, waiting, n > 1) returns every page;
 *  - finish reasons: stop ids, end by callback, max_tokens; priorities;
 *  - bad input: clear errors, the engine keeps serving;
 *  - requests on a context (pkv_request_params.context): equal to the same tokens
 *    served alone, batched with others, preempted by swap and by truncate +
 *    recompute; the context keeps every token with the right KV and logits;
 *  - prefill-only requests on a context (pkv_request_params.prefill_only): the
 *    context afterwards equals a twin that pkv_context_decode'd the same tokens
 *    (tokens, bitwise logits, KV), alone, batched, preempted by swap and by
 *    recompute; cancelled: a prefix without logits; the refusals name their field.
 * Batch invariance again on qwen3 and on quantized KV pages (with preemption), and
 * the first three on qwen3moe, gemma2, gemma3, gemma4, gpt-oss, qwen35, granitehybrid, nemotron_h and lfm2 (recurrent state:
 * preemption by recompute replays it, by swap carries it; n by fork copies it), and the
 * prefix cache on gemma4 too (its last layers own no KV: its pages are still published). */
#include "base/base.h"
#include "engine-testlib.h"

static pkv_model *g_m;

static pkv_request_params greedy(const int32_t *prompt, int n_prompt, int max_tokens) {
    pkv_request_params r = pkv_request_default_params();
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    r.max_tokens = max_tokens;
    r.sampling.temp = 0;
    r.ignore_eos = true;
    return r;
}

/* ---------------------------------------------------- vs the context API */

static void test_vs_context(void) {
    int32_t prompt[37];
    uint64_t rs = 5;
    for (int i = 0; i < 37; i++) prompt[i] = (int32_t)(et_rand(&rs) % 320);
    enum { N = 24 };
    static et_rec got;
    pkv_request_params r = greedy(prompt, 37, N);
    r.ignore_eos = false;
    r.top_logprobs = 3;
    et_alone(g_m, &r, &got);

    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    cp.page_size = 8;
    pkv_kv_cache *c = pkv_model_cache_create(g_m, cp);
    pkv_context *ctx = c ? pkv_context_create(g_m, c, 256) : NULL;
    REQUIRE_VOID(ctx);
    CHECK_OK(pkv_context_decode(ctx, prompt, 37));
    int32_t want[N];
    float want_lp[N];
    int n = 0;
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.temp = 0;
    pkv_sampler *smp = pkv_sampler_create(sp, 320);
    for (; n < N; n++) { /* pkv_generate's loop, keeping each step's logits */
        const float *lg = pkv_context_logits(ctx);
        CHECK_OK(pkv_sampler_sample(smp, lg, &want[n]));
        double mx = lg[0], z = 0;
        for (int i = 1; i < 320; i++) mx = lg[i] > mx ? lg[i] : mx;
        for (int i = 0; i < 320; i++) z += exp((double)lg[i] - mx);
        want_lp[n] = (float)((double)lg[want[n]] - (mx + log(z)));
        if (pkv_model_is_eog(g_m, want[n]) || n + 1 == N) {
            n++;
            break;
        }
        CHECK_OK(pkv_context_decode(ctx, &want[n], 1));
    }
    CHECK_INT(got.s[0].n, n);
    CHECK_INT(got.s[0].finals, 1);
    CHECK_INT(got.s[0].fin, pkv_model_is_eog(g_m, want[n - 1]) ? PKV_FINISH_STOP : PKV_FINISH_LENGTH);
    for (int i = 0; i < n && i < got.s[0].n; i++) {
        CHECK_INT(got.s[0].tok[i], want[i]);
        CHECK_NEAR(got.s[0].lp[i], want_lp[i], 1e-6);
        CHECK_INT(got.s[0].top[i][0].token, want[i]); /* greedy: the chosen token is the most likely */
        CHECK(got.s[0].top[i][0].logprob >= got.s[0].top[i][1].logprob);
        CHECK(got.s[0].top[i][1].logprob >= got.s[0].top[i][2].logprob);
    }
    CHECK_INT(got.s[0].n_prompt, 37);
    CHECK_INT(got.s[0].n_cached, 0);
    pkv_sampler_free(smp);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
}

/* ------------------------------------------------------ requests on a context */

/* A context's tokens (n) and logits equal a fresh context's that decoded the same
 * tokens at once: the KV and logits a context request leaves are right. */
static void check_context_state(pkv_engine *e, pkv_context *ctx, const int32_t *want, int n, const char *what) {
    CHECK_INT(pkv_context_n_tokens(ctx), n);
    int32_t got[256];
    REQUIRE_VOID(n <= 256);
    CHECK_OK(pkv_context_tokens(ctx, 0, n, got));
    CHECK(!memcmp(got, want, (size_t)n * sizeof *got));
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    cp.page_size = 8;
    pkv_kv_cache *c = pkv_model_cache_create(g_m, cp);
    pkv_context *ref = c ? pkv_context_create(g_m, c, 256) : NULL;
    REQUIRE_VOID(ref);
    CHECK_OK(pkv_context_decode(ref, want, n));
    const float *a = pkv_context_logits(ctx), *b = pkv_context_logits(ref);
    CHECK(a && b);
    if (a && b && memcmp(a, b, 320 * sizeof *a)) TH_FAIL("%s: the context's logits differ from a fresh decode", what);
    /* one more token decoded on both (on a fork of ctx): the context's KV is the fresh one's */
    int32_t t = 7;
    pkv_context *f = pkv_context_fork(ctx);
    REQUIRE_VOID(f);
    CHECK_OK(pkv_context_decode(f, &t, 1));
    CHECK_OK(pkv_context_decode(ref, &t, 1));
    a = pkv_context_logits(f);
    b = pkv_context_logits(ref);
    if (a && b && memcmp(a, b, 320 * sizeof *a)) TH_FAIL("%s: the context's KV differs from a fresh decode", what);
    pkv_context_free(f);
    pkv_context_free(ref);
    pkv_kv_cache_free(c);
    (void)e;
}

/* pkv_request_params.context: a generation on a persistent context is an engine
 * request like any other. Its tokens equal the same prompt served alone (context
 * tokens + prompt), it shares steps with the requests in flight, it survives
 * preemption (swap, and truncate-and-recompute), and the context afterwards holds
 * every token with the right KV and logits. A second generation from the
 * context's logits (empty prompt) goes on from there. */
static void test_on_context(void) {
    enum { NP = 6, NC = 21, NQ = 5, MT = 20, MT2 = 12 };
    static int32_t prompt[NP][32], full[256];
    static pkv_request_params rp[NP];
    static et_rec alone[NP], got[NP], calone, cgot, calone2, cgot2;
    uint64_t rs = 77;
    for (int i = 0; i < NP; i++) {
        int n = 8 + (int)(et_rand(&rs) % 20);
        for (int k = 0; k < n; k++) prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
        rp[i] = greedy(prompt[i], n, 16 + (int)(et_rand(&rs) % 12));
        if (i % 2) {
            rp[i].sampling.temp = 0.8f;
            rp[i].sampling.seed = (uint64_t)i;
        }
        et_alone(g_m, &rp[i], &alone[i]);
    }
    for (int k = 0; k < NC + NQ; k++) full[k] = (int32_t)(et_rand(&rs) % 320);
    pkv_request_params cr = greedy(full, NC + NQ, MT); /* the context's tokens + the prompt, alone */
    cr.top_logprobs = 3;
    cr.sampling.temp = 0.7f;
    cr.sampling.seed = 5;
    et_alone(g_m, &cr, &calone);
    REQUIRE_VOID(calone.s[0].n == MT);
    memcpy(full + NC + NQ, calone.s[0].tok, MT * sizeof *full);
    pkv_request_params cr2 = greedy(full, NC + NQ + MT, MT2); /* and the second generation */
    et_alone(g_m, &cr2, &calone2);
    REQUIRE_VOID(calone2.s[0].n == MT2);

    struct {
        int64_t pages, host;
        bool swap;
        const char *name;
    } cfg[] = {{0, 0, true, "context request, room for all"},
               {30, 1000, true, "context request, preempted by swap"},
               {30, 1, false, "context request, preempted by truncate and recompute"}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        pkv_engine_params ep = et_params(128, 4, cfg[c].pages);
        ep.cache.host_pages = cfg[c].host;
        ep.swap = cfg[c].swap;
        ep.max_batch_tokens = 24;
        pkv_engine *e = pkv_engine_create(g_m, ep);
        REQUIRE_VOID(e);
        pkv_context *ctx = pkv_context_create(g_m, pkv_engine_cache(e), 128);
        REQUIRE_VOID(ctx);
        CHECK_OK(pkv_context_decode(ctx, full, NC));
        memset(&cgot, 0, sizeof cgot);
        pkv_request_params r = cr;
        r.prompt = full + NC;
        r.n_prompt = NQ;
        r.context = ctx;
        r.on_event = et_on_event;
        r.user = &cgot;
        for (int i = 0; i < NP; i++) {
            memset(&got[i], 0, sizeof got[i]);
            pkv_request_params o = rp[i];
            o.on_event = et_on_event;
            o.user = &got[i];
            o.priority = i < 2 ? 1 : 0; /* these preempt the context request when the pool is short */
            if (i == 2) {
                CHECK_OK(pkv_engine_submit(e, &r, NULL));
                CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID); /* one request per context */
            }
            CHECK_OK(pkv_engine_submit(e, &o, NULL));
            if (i % 2) CHECK_OK(pkv_engine_step(e, NULL));
        }
        et_drain(e);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        int bad = !et_same(&calone, &cgot, 1, cfg[c].name, 0);
        CHECK_INT(cgot.s[0].n_prompt, NQ);
        for (int i = 0; i < NP; i++) bad += !et_same(&alone[i], &got[i], 1, cfg[c].name, i + 1);
        uint64_t toks = 0;
        for (int i = 0; i < NP; i++) toks += (uint64_t)got[i].s[0].n;
        fprintf(stderr, "%s: %llu steps for %llu + %d tokens, %llu by swap, %llu by recompute, %d differ\n",
                cfg[c].name, (unsigned long long)st.steps, (unsigned long long)toks, cgot.s[0].n,
                (unsigned long long)st.preemptions_swap, (unsigned long long)st.preemptions_recompute, bad);
        CHECK(st.steps < toks); /* batched: the requests shared steps */
        if (c == 1) CHECK(st.preemptions_swap > 0);
        if (c == 2) CHECK(st.preemptions_recompute > 0);
        CHECK_INT(st.requests_failed, 0);
        CHECK(!pkv_kv_seq_swapped(pkv_engine_cache(e), pkv_context_seq(ctx)));
        check_context_state(e, ctx, full, NC + NQ + MT, cfg[c].name);
        /* again from the context's logits: no prompt at all */
        memset(&cgot2, 0, sizeof cgot2);
        pkv_request_params r2 = greedy(NULL, 0, MT2);
        r2.context = ctx;
        r2.on_event = et_on_event;
        r2.user = &cgot2;
        CHECK_OK(pkv_engine_submit(e, &r2, NULL));
        et_drain(e);
        et_same(&calone2, &cgot2, 1, "second generation on the context", (int)c);
        static int32_t full2[256];
        memcpy(full2, full, (NC + NQ + MT) * sizeof *full2);
        memcpy(full2 + NC + NQ + MT, cgot2.s[0].tok, MT2 * sizeof *full2);
        check_context_state(e, ctx, full2, NC + NQ + MT + MT2, "after the second generation");
        /* cancelled: the context keeps a prefix, without logits; the engine keeps serving */
        memset(&cgot2, 0, sizeof cgot2);
        uint64_t id;
        CHECK_OK(pkv_engine_submit(e, &r2, &id));
        CHECK_OK(pkv_engine_step(e, NULL));
        CHECK_OK(pkv_engine_cancel(e, id));
        et_drain(e);
        CHECK_INT(cgot2.s[0].fin, PKV_FINISH_CANCELLED);
        CHECK(pkv_context_n_tokens(ctx) >= NC + NQ + MT + MT2);
        CHECK(!pkv_context_logits(ctx));
        CHECK_INT(pkv_engine_submit(e, &r2, NULL), PKV_ERR_INVALID); /* no logits, no prompt */
        pkv_context_free(ctx);
        pkv_kv_stats ks;
        pkv_kv_stats_get(pkv_engine_cache(e), &ks);
        CHECK_INT(ks.n_seqs, 0);
        CHECK_INT(ks.pages_used, 0);
        pkv_engine_free(e);
    }
    /* refused: n > 1, a context on another cache, a swapped context */
    pkv_engine *e = pkv_engine_create(g_m, et_params(128, 4, 0));
    REQUIRE_VOID(e);
    pkv_context *ctx = pkv_context_create(g_m, pkv_engine_cache(e), 128);
    REQUIRE_VOID(ctx);
    CHECK_OK(pkv_context_decode(ctx, full, NC));
    pkv_request_params r = greedy(full, 3, 4);
    r.context = ctx;
    r.n = 2;
    CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID);
    r.n = 1;
    r.max_tokens = 128;
    CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID); /* the context's 21 tokens count */
    r.max_tokens = 4;
    CHECK_OK(pkv_context_swap_out(ctx));
    CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID);
    CHECK_OK(pkv_context_swap_in(ctx));
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    pkv_kv_cache *other = pkv_model_cache_create(g_m, cp);
    pkv_context *octx = other ? pkv_context_create(g_m, other, 128) : NULL;
    r.context = octx;
    CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID);
    pkv_context_free(octx);
    pkv_kv_cache_free(other);
    pkv_context_free(ctx);
    pkv_engine_free(e);
}

/* ------------------------------------------------- prefill-only requests */

/* ctx and twin hold the same tokens, bitwise the same logits, and the same KV (one
 * more token decoded on a fork of each gives the same logits). */
static void check_twin(pkv_context *ctx, pkv_context *twin, const char *what) {
    int64_t n = pkv_context_n_tokens(twin);
    CHECK_INT(pkv_context_n_tokens(ctx), n);
    int32_t a_t[256], b_t[256];
    REQUIRE_VOID(n <= 256);
    CHECK_OK(pkv_context_tokens(ctx, 0, n, a_t));
    CHECK_OK(pkv_context_tokens(twin, 0, n, b_t));
    if (memcmp(a_t, b_t, (size_t)n * sizeof *a_t)) TH_FAIL("%s: the context's tokens differ from its twin's", what);
    const float *a = pkv_context_logits(ctx), *b = pkv_context_logits(twin);
    if (!a || !b) TH_FAIL("%s: logits missing (context %p, twin %p)", what, (const void *)a, (const void *)b);
    else if (memcmp(a, b, 320 * sizeof *a)) TH_FAIL("%s: the context's logits differ from its twin's", what);
    int32_t t = 11;
    pkv_context *f = pkv_context_fork(ctx), *g = pkv_context_fork(twin);
    REQUIRE_VOID(f && g);
    CHECK_OK(pkv_context_decode(f, &t, 1));
    CHECK_OK(pkv_context_decode(g, &t, 1));
    a = pkv_context_logits(f);
    b = pkv_context_logits(g);
    if (a && b && memcmp(a, b, 320 * sizeof *a)) TH_FAIL("%s: the context's KV differs from its twin's", what);
    pkv_context_free(f);
    pkv_context_free(g);
}

static pkv_request_params prefill_req(pkv_context *ctx, const int32_t *t, int n, et_rec *rec) {
    pkv_request_params r = pkv_request_default_params();
    r.prompt = t;
    r.n_prompt = n;
    r.context = ctx;
    r.prefill_only = true;
    r.on_event = et_on_event;
    r.user = rec;
    return r;
}

/* pkv_request_params.prefill_only: a request that only computes its prompt into a
 * context (what the server's create and append submit) leaves the context as
 * pkv_context_decode of the same tokens leaves a twin: tokens, bitwise logits, KV.
 * Alone, batched with other requests (which keep their lone-run tokens), preempted
 * by swap and by truncate-and-recompute; cancelled it leaves a prefix without
 * logits; the fields that ask for generation are refused by name. */
static void test_prefill_only(void) {
    enum { NP = 4, NC = 21, NA = 70 };
    static int32_t prompt[NP][32], full[NC + NA];
    static pkv_request_params rp[NP];
    static et_rec alone[NP], got[NP], pre;
    uint64_t rs = 91;
    for (int i = 0; i < NP; i++) {
        int n = 8 + (int)(et_rand(&rs) % 20);
        for (int k = 0; k < n; k++) prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
        rp[i] = greedy(prompt[i], n, 16 + (int)(et_rand(&rs) % 12));
        et_alone(g_m, &rp[i], &alone[i]);
    }
    for (int k = 0; k < NC + NA; k++) full[k] = (int32_t)(et_rand(&rs) % 320);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    cp.page_size = 8;
    pkv_kv_cache *tc = pkv_model_cache_create(g_m, cp);
    pkv_context *twin = tc ? pkv_context_create(g_m, tc, 256) : NULL;
    REQUIRE_VOID(twin);
    CHECK_OK(pkv_context_decode(twin, full, NC));
    CHECK_OK(pkv_context_decode(twin, full + NC, NA));

    struct {
        int64_t pages, host;
        bool swap, others;
        const char *name;
    } cfg[] = {{0, 0, true, false, "prefill-only, alone"},
               {0, 0, true, true, "prefill-only, batched"},
               {26, 1000, true, true, "prefill-only, preempted by swap"},
               {26, 1, false, true, "prefill-only, preempted by truncate and recompute"}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        pkv_engine_params ep = et_params(128, 4, cfg[c].pages);
        ep.cache.host_pages = cfg[c].host;
        ep.swap = cfg[c].swap;
        ep.max_batch_tokens = 24; /* the 70 tokens take several steps */
        pkv_engine *e = pkv_engine_create(g_m, ep);
        REQUIRE_VOID(e);
        pkv_context *ctx = pkv_context_create(g_m, pkv_engine_cache(e), 128);
        REQUIRE_VOID(ctx);
        CHECK_OK(pkv_context_decode(ctx, full, NC));
        memset(&pre, 0, sizeof pre);
        pkv_request_params r = prefill_req(ctx, full + NC, NA, &pre);
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID); /* one request per context */
        CHECK_OK(pkv_engine_step(e, NULL)); /* its first chunk; then the others come (and preempt it) */
        for (int i = 0; cfg[c].others && i < NP; i++) {
            memset(&got[i], 0, sizeof got[i]);
            pkv_request_params o = rp[i];
            o.on_event = et_on_event;
            o.user = &got[i];
            o.priority = 1;
            CHECK_OK(pkv_engine_submit(e, &o, NULL));
        }
        et_drain(e);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        fprintf(stderr, "%s: %llu steps, %llu by swap, %llu by recompute\n", cfg[c].name,
                (unsigned long long)st.steps, (unsigned long long)st.preemptions_swap,
                (unsigned long long)st.preemptions_recompute);
        CHECK_INT(pre.s[0].finals, 1);
        CHECK_INT(pre.s[0].after_final, 0);
        CHECK_INT(pre.s[0].fin, PKV_FINISH_LENGTH);
        CHECK_INT(pre.s[0].n, 0); /* no token */
        CHECK_INT(pre.s[0].final_token, -1);
        CHECK_INT(pre.s[0].n_prompt, NA);
        CHECK_INT(pre.s[0].status, PKV_OK);
        CHECK(st.steps >= 3); /* chunked by the token budget */
        for (int i = 0; cfg[c].others && i < NP; i++) et_same(&alone[i], &got[i], 1, cfg[c].name, i);
        if (cfg[c].others) {
            uint64_t toks = 0;
            for (int i = 0; i < NP; i++) toks += (uint64_t)got[i].s[0].n;
            CHECK(st.steps < toks + 3); /* batched: the prefill shared steps with the decodes */
        }
        if (c == 2) CHECK(st.preemptions_swap > 0);
        if (c == 3) CHECK(st.preemptions_recompute > 0);
        CHECK_INT(st.requests_failed, 0);
        CHECK(!pkv_kv_seq_swapped(pkv_engine_cache(e), pkv_context_seq(ctx)));
        check_twin(ctx, twin, cfg[c].name);
        pkv_context_free(ctx);
        pkv_kv_stats ks;
        pkv_kv_stats_get(pkv_engine_cache(e), &ks);
        CHECK_INT(ks.pages_used, 0);
        pkv_engine_free(e);
    }

    /* cancelled after its first chunk: a prefix, without logits */
    pkv_engine_params ep = et_params(128, 4, 0);
    ep.max_batch_tokens = 24;
    pkv_engine *e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    pkv_context *ctx = pkv_context_create(g_m, pkv_engine_cache(e), 128);
    REQUIRE_VOID(ctx);
    CHECK_OK(pkv_context_decode(ctx, full, NC));
    memset(&pre, 0, sizeof pre);
    pkv_request_params r = prefill_req(ctx, full + NC, NA, &pre);
    uint64_t id;
    CHECK_OK(pkv_engine_submit(e, &r, &id));
    CHECK_OK(pkv_engine_step(e, NULL));
    CHECK_OK(pkv_engine_cancel(e, id));
    et_drain(e);
    CHECK_INT(pre.s[0].fin, PKV_FINISH_CANCELLED);
    CHECK(pkv_context_n_tokens(ctx) > NC && pkv_context_n_tokens(ctx) < NC + NA);
    CHECK(!pkv_context_logits(ctx));

    /* refused, each naming its field: the context as it was */
    CHECK_OK(pkv_context_truncate(ctx, NC));
    struct {
        const char *field;
        int what;
    } bad[] = {{"context", 0}, {"n_prompt", 1}, {"n must be 1", 2}, {"max_tokens", 3}, {"n_stop", 4},
               {"top_logprobs", 5}, {"ignore_eos", 6}, {"grammar", 7}, {"limit of 40", 8}};
    pkv_grammar *gr = pkv_grammar_from_gbnf("root ::= \"a\"", 12);
    CHECK(gr != NULL);
    pkv_context *small = pkv_context_create(g_m, pkv_engine_cache(e), 40);
    REQUIRE_VOID(small);
    CHECK_OK(pkv_context_decode(small, full, NC));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = prefill_req(ctx, full + NC, 4, &pre);
        switch (bad[i].what) {
        case 0: r.context = NULL; break;
        case 1: r.n_prompt = 0; break;
        case 2: r.n = 2; break;
        case 3: r.max_tokens = 1; break;
        case 4: r.stop_tokens = full; r.n_stop = 1; break;
        case 5: r.top_logprobs = 1; break;
        case 6: r.ignore_eos = true; break;
        case 7: r.grammar = gr; break;
        case 8: r.context = small; r.n_prompt = 40 - NC + 1; break;
        }
        CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID);
        if (!strstr(pkv_errmsg(), bad[i].field)) TH_FAIL("refusal %zu: '%s' does not name %s", i, pkv_errmsg(), bad[i].field);
    }
    CHECK_INT(pkv_context_n_tokens(ctx), NC);
    /* it may fill a context to its limit */
    memset(&pre, 0, sizeof pre);
    r = prefill_req(small, full + NC, 40 - NC, &pre);
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    CHECK_INT(pre.s[0].fin, PKV_FINISH_LENGTH);
    CHECK_INT(pkv_context_n_tokens(small), 40);
    CHECK(pkv_context_logits(small) != NULL);
    pkv_grammar_free(gr);
    pkv_context_free(small);
    pkv_context_free(ctx);
    pkv_engine_free(e);
    pkv_context_free(twin);
    pkv_kv_cache_free(tc);
}

/* ------------------------------------------------------- batch invariance */

enum { NB = 64 };
static int g_nb = NB; /* requests of the mixed load used (fewer on slow devices) */

typedef struct mixed {
    int32_t prompt[NB][64];
    int n_prompt[NB], max_tokens[NB], arrive[NB];
    pkv_request_params rp[NB];
    et_rec alone[NB], got[NB];
} mixed;

static void make_mixed(mixed *w, uint64_t seed) {
    uint64_t rs = seed;
    int32_t sys_a[24], sys_b[13];
    for (int i = 0; i < 24; i++) sys_a[i] = (int32_t)(et_rand(&rs) % 320);
    for (int i = 0; i < 13; i++) sys_b[i] = (int32_t)(et_rand(&rs) % 320);
    for (int i = 0; i < g_nb; i++) {
        int n = 1 + (int)(et_rand(&rs) % 48), k = 0;
        int kind = (int)(et_rand(&rs) % 3); /* 0: own prompt, 1: shares sys_a, 2: shares sys_b */
        if (kind == 1)
            for (; k < 24 && k < n; k++) w->prompt[i][k] = sys_a[k];
        if (kind == 2)
            for (; k < 13 && k < n; k++) w->prompt[i][k] = sys_b[k];
        for (; k < n; k++) w->prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
        w->n_prompt[i] = n;
        w->max_tokens[i] = 1 + (int)(et_rand(&rs) % 24);
        w->arrive[i] = (int)(et_rand(&rs) % 30);
        pkv_request_params r = greedy(w->prompt[i], n, w->max_tokens[i]);
        if (i % 4 == 3) { /* seeded sampling is batch-invariant too */
            r.sampling.temp = 0.9f;
            r.sampling.seed = 1000 + (uint64_t)i;
        }
        if (i % 5 == 0) r.top_logprobs = ET_TOP;
        if (i % 7 == 0) r.ignore_eos = false;
        w->rp[i] = r;
    }
}

/* Run w's requests through e, submitting request i before step arrive[i]. */
static void run_mixed(pkv_engine *e, mixed *w) {
    int left = 1;
    for (int step = 0; step < 30 || left > 0; step++) {
        for (int i = 0; i < g_nb; i++)
            if (w->arrive[i] == step) {
                memset(&w->got[i], 0, sizeof w->got[i]);
                pkv_request_params r = w->rp[i];
                r.on_event = et_on_event;
                r.user = &w->got[i];
                CHECK_OK(pkv_engine_submit(e, &r, NULL));
            }
        CHECK_OK(pkv_engine_step(e, &left));
        if (step > 100000) {
            TH_FAIL("not done after %d steps", step);
            break;
        }
    }
}

static void test_batch_invariance(void) {
    static mixed w;
    make_mixed(&w, 11);
    for (int i = 0; i < g_nb; i++) et_alone(g_m, &w.rp[i], &w.alone[i]);
    /* A small token budget: prompts are split in chunks and share steps with decodes. */
    pkv_engine_params ep = et_params(256, 8, 0);
    ep.cache.n_seq_max = NB;
    ep.max_batch_tokens = 40;
    pkv_engine *e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    run_mixed(e, &w);
    int bad = 0;
    for (int i = 0; i < g_nb; i++) bad += !et_same(&w.alone[i], &w.got[i], 1, "mixed request", i);
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    uint64_t total = 0;
    for (int i = 0; i < g_nb; i++) total += (uint64_t)w.n_prompt[i] + (uint64_t)w.got[i].s[0].n;
    fprintf(stderr, "batch invariance: %d of %d requests differ; %llu steps for %llu tokens, %llu prefix-hit tokens\n",
            bad, g_nb, (unsigned long long)st.steps, (unsigned long long)total,
            (unsigned long long)st.prefix_hit_tokens);
    CHECK(st.steps * 3 < total); /* it did batch */
    CHECK(st.prefix_hit_tokens > 0);
    CHECK_INT(st.requests_finished, g_nb);
    CHECK(st.batch_invariant); /* the device claims what this test checks */
    CHECK(pkv_device_get_caps(pkv_model_device(g_m))->batch_invariant);
    CHECK_INT(st.pages_used, 0);
    CHECK_INT(st.n_requests, 0);
    pkv_engine_free(e);
}

/* ------------------------------------------------------------ preemption */

static void test_preemption(void) {
    enum { NP = 12 };
    static int32_t prompt[NP][32];
    static pkv_request_params rp[NP];
    static et_rec alone[NP], got[NP];
    uint64_t rs = 21;
    int64_t sum_pages = 0;
    for (int i = 0; i < NP; i++) {
        int n = 10 + (int)(et_rand(&rs) % 21), mt = 24 + (int)(et_rand(&rs) % 17);
        for (int k = 0; k < n; k++) prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
        if (i % 3 == 1) /* some share the first page with the previous request */
            for (int k = 0; k < 4; k++) prompt[i][k] = prompt[i - 1][k];
        rp[i] = greedy(prompt[i], n, mt);
        if (i % 3 == 2) {
            rp[i].sampling.temp = 0.8f;
            rp[i].sampling.seed = (uint64_t)i;
        }
        rp[i].priority = i % 4 == 0 ? 1 : 0;
        sum_pages += (n + mt + 3) / 4;
        et_alone(g_m, &rp[i], &alone[i]);
    }
    struct {
        bool swap, prefix;
        int64_t host_pages;
        const char *name;
    } cfg[] = {
        {true, true, 1000, "swap"},
        {false, true, 0, "recompute (swap off)"},
        {false, false, 0, "recompute without prefix cache"},
        {true, true, 12, "host pool too small: swap and recompute"},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        if (g_nb < NB && (c == 1 || c == 2)) continue; /* slow device: swap, and swap + recompute */
        /* 24 pages of 4 tokens: the longest request needs 18 alone, all together ~190 */
        pkv_engine_params ep = et_params(128, 4, 24);
        ep.cache.host_pages = cfg[c].host_pages ? cfg[c].host_pages : 1;
        ep.swap = cfg[c].swap;
        ep.prefix_cache = cfg[c].prefix;
        ep.max_batch_tokens = 32;
        pkv_engine *e = pkv_engine_create(g_m, ep);
        REQUIRE_VOID(e);
        for (int i = 0; i < NP; i++) {
            memset(&got[i], 0, sizeof got[i]);
            pkv_request_params r = rp[i];
            r.on_event = et_on_event;
            r.user = &got[i];
            CHECK_OK(pkv_engine_submit(e, &r, NULL));
            if (i % 2) CHECK_OK(pkv_engine_step(e, NULL));
        }
        et_drain(e);
        int bad = 0;
        for (int i = 0; i < NP; i++) bad += !et_same(&alone[i], &got[i], 1, cfg[c].name, i);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        fprintf(stderr, "preemption, %s: %llu by swap, %llu by recompute, peak %lld of %lld pages (load %lld), %d differ\n",
                cfg[c].name, (unsigned long long)st.preemptions_swap, (unsigned long long)st.preemptions_recompute,
                (long long)st.pages_peak, (long long)st.pages_total, (long long)sum_pages, bad);
        if (cfg[c].swap) CHECK(st.preemptions_swap > 0);
        else CHECK_INT(st.preemptions_swap, 0);
        if (!cfg[c].swap || cfg[c].host_pages < 100) CHECK(st.preemptions_recompute > 0);
        else CHECK_INT(st.preemptions_recompute, 0);
        CHECK(st.pages_peak <= st.pages_total);
        CHECK_INT(st.requests_finished, NP);
        CHECK_INT(st.requests_failed, 0);
        CHECK_INT(st.pages_used, 0);
        CHECK_INT(st.host_free, st.host_pages);
        CHECK_INT(st.n_swapped + st.n_recompute + st.n_running + st.n_waiting, 0);
        pkv_kv_stats ks;
        pkv_kv_stats_get(pkv_engine_cache(e), &ks);
        CHECK_INT(ks.n_seqs, 0);
        pkv_engine_free(e);
    }
}

/* ---------------------------------------------------------- prefix cache */

/* burst: also the burst below (a request waiting for the pages another is computing).
 * Off for models with sliding-window layers: there the waiting request finds no
 * prefix while the other is still running (it computes the prompt itself, with the
 * same result), on gemma2, gemma3, gpt-oss and gemma4 alike. */
static void test_prefix_cache(bool burst) {
    int32_t a[40], b[42];
    uint64_t rs = 33;
    for (int i = 0; i < 40; i++) a[i] = (int32_t)(et_rand(&rs) % 320);
    memcpy(b, a, 32 * sizeof *b);
    for (int i = 32; i < 42; i++) b[i] = (int32_t)(et_rand(&rs) % 320);
    static et_rec ra, rb, rc, nb, nc;
    for (int cached = 1; cached >= 0; cached--) {
        pkv_engine_params ep = et_params(256, 8, 0);
        ep.prefix_cache = cached;
        pkv_engine *e = pkv_engine_create(g_m, ep);
        REQUIRE_VOID(e);
        et_rec *out_b = cached ? &rb : &nb, *out_c = cached ? &rc : &nc;
        memset(&ra, 0, sizeof ra);
        memset(out_b, 0, sizeof *out_b);
        memset(out_c, 0, sizeof *out_c);
        pkv_request_params r = greedy(a, 40, 8);
        r.on_event = et_on_event;
        r.user = &ra;
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        pkv_engine_stats s0, s1, s2;
        pkv_engine_stats_get(e, &s0);
        CHECK_INT(s0.pages_used, 0);
        /* the finished request's full pages stay cached: 47 tokens in KV, 5 full pages */
        CHECK_INT(s0.pages_cached, cached ? 5 : 0);
        r = greedy(b, 42, 8);
        r.on_event = et_on_event;
        r.user = out_b;
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        pkv_engine_stats_get(e, &s1);
        /* the same prompt again: everything but the last page holding token 39 */
        r = greedy(a, 40, 8);
        r.on_event = et_on_event;
        r.user = out_c;
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        pkv_engine_stats_get(e, &s2);
        CHECK_INT(out_b->s[0].n_cached, cached ? 32 : 0);
        CHECK_INT(s1.prefix_hit_tokens - s0.prefix_hit_tokens, cached ? 32 : 0);
        /* prompt tokens computed: only the new ones; plus 7 decode steps */
        CHECK_INT(s1.computed_tokens - s0.computed_tokens, (cached ? 10 : 42) + 7);
        CHECK_INT(out_c->s[0].n_cached, cached ? 32 : 0);
        CHECK_INT(s2.computed_tokens - s1.computed_tokens, (cached ? 8 : 40) + 7);
        CHECK_INT(s2.prompt_tokens, 40 + 42 + 40);
        pkv_engine_free(e);
    }
    et_same(&rb, &nb, 1, "prefix-cached vs uncached request", 1);
    et_same(&rc, &nc, 1, "prefix-cached vs uncached request", 2);
    et_same(&ra, &rc, 1, "repeated prompt", 0);
    if (!burst) return;
    /* A burst: both arrive before the first step. B waits for the pages A is
     * computing instead of computing them too, then reuses them. */
    static et_rec xa, xb;
    memset(&xa, 0, sizeof xa);
    memset(&xb, 0, sizeof xb);
    pkv_engine_params ep = et_params(256, 8, 0);
    ep.max_batch_tokens = 64; /* room for both prompts in one step */
    pkv_engine *e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    pkv_request_params r = greedy(a, 40, 8);
    r.on_event = et_on_event;
    r.user = &xa;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    r = greedy(b, 42, 8);
    r.on_event = et_on_event;
    r.user = &xb;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK_INT(xb.s[0].n_cached, 32);
    CHECK_INT(st.computed_tokens, 40 + 10 + 2 * 7);
    et_same(&ra, &xa, 1, "burst request", 0);
    et_same(&nb, &xb, 1, "burst request", 1);
    pkv_engine_free(e);
}

/* ------------------------------------------------------------- n by fork */

static void test_n_fork(void) {
    int32_t prompt[29];
    uint64_t rs = 44;
    for (int i = 0; i < 29; i++) prompt[i] = (int32_t)(et_rand(&rs) % 320);
    pkv_request_params r = pkv_request_default_params();
    r.prompt = prompt;
    r.n_prompt = 29;
    r.max_tokens = 20;
    r.sampling.temp = 1.0f;
    r.sampling.top_k = 0;
    r.sampling.min_p = 0;
    r.sampling.presence_penalty = 0.5f;
    r.sampling.frequency_penalty = 0.25f;
    r.sampling.seed = 9000;
    r.ignore_eos = true;
    r.top_logprobs = 2;
    static et_rec sep[4], fork;
    for (int i = 0; i < 4; i++) {
        pkv_request_params q = r;
        q.sampling.seed = 9000 + (uint64_t)i;
        et_alone(g_m, &q, &sep[i]);
    }
    pkv_engine *e = pkv_engine_create(g_m, et_params(256, 8, 0));
    REQUIRE_VOID(e);
    memset(&fork, 0, sizeof fork);
    r.n = 4;
    r.on_event = et_on_event;
    r.user = &fork;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    for (int i = 0; i < 4; i++) {
        et_rec one;
        memset(&one, 0, sizeof one);
        one.s[0] = fork.s[i];
        et_same(&sep[i], &one, 1, "fork sample vs separate request with seed s+i", i);
    }
    int differ = 0;
    for (int i = 1; i < 4; i++) differ += memcmp(fork.s[0].tok, fork.s[i].tok, sizeof fork.s[0].tok) != 0;
    CHECK(differ > 0); /* the seeds do make different samples */
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.computed_tokens, 29 + 4 * 19); /* the prompt once, then 19 decode tokens each */
    CHECK_INT(st.generated_tokens, 80);
    CHECK_INT(st.pages_used, 0);
    pkv_engine_free(e);
}

/* ----------------------------------------------------------- cancellation */

static void test_cancel(void) {
    int32_t prompt[6][20];
    uint64_t rs = 55;
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 20; k++) prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
    static et_rec got[6], alone[6];
    for (int cached = 0; cached < 2; cached++) {
        pkv_engine_params ep = et_params(256, 8, 64);
        ep.prefix_cache = cached;
        pkv_engine *e = pkv_engine_create(g_m, ep);
        REQUIRE_VOID(e);
        pkv_engine_stats base;
        pkv_engine_stats_get(e, &base);
        CHECK_INT(base.pages_free, 64);
        uint64_t id[6];
        for (int i = 0; i < 6; i++) {
            memset(&got[i], 0, sizeof got[i]);
            pkv_request_params r = greedy(prompt[i], 20, 40);
            if (i == 3) r.n = 3;
            if (!cached) et_alone(g_m, &r, &alone[i]);
            r.on_event = et_on_event;
            r.user = &got[i];
            CHECK_OK(pkv_engine_submit(e, &r, &id[i]));
            CHECK(id[i] > 0);
        }
        CHECK_OK(pkv_engine_cancel(e, id[5])); /* still waiting */
        for (int k = 0; k < 6; k++) CHECK_OK(pkv_engine_step(e, NULL));
        CHECK(got[1].s[0].n > 0 && got[1].s[0].n < 40); /* mid-generation */
        CHECK(got[3].s[2].n > 0);
        CHECK_OK(pkv_engine_cancel(e, id[1]));
        CHECK_OK(pkv_engine_cancel(e, id[3]));
        int n1 = got[1].s[0].n;
        et_drain(e);
        CHECK_STATUS(pkv_engine_cancel(e, id[1]), PKV_ERR_NOT_FOUND);
        CHECK_STATUS(pkv_engine_cancel(e, 999999), PKV_ERR_NOT_FOUND);
        CHECK_INT(got[1].s[0].n, n1); /* nothing after the cancel */
        CHECK_INT(got[1].s[0].fin, PKV_FINISH_CANCELLED);
        CHECK_INT(got[1].s[0].final_token, -1);
        for (int j = 0; j < 3; j++) {
            CHECK_INT(got[3].s[j].finals, 1);
            CHECK_INT(got[3].s[j].fin, PKV_FINISH_CANCELLED);
            CHECK(!memcmp(got[3].s[j].tok, alone[3].s[j].tok, (size_t)got[3].s[j].n * 4)); /* a prefix of its run */
        }
        CHECK(!memcmp(got[1].s[0].tok, alone[1].s[0].tok, (size_t)n1 * 4));
        CHECK_INT(got[5].s[0].finals, 1);
        CHECK_INT(got[5].s[0].n, 0);
        CHECK_INT(got[5].s[0].fin, PKV_FINISH_CANCELLED);
        for (int i = 0; i < 6; i++)
            if (i != 1 && i != 3 && i != 5) et_same(&alone[i], &got[i], 1, "request beside cancelled ones", i);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        CHECK_INT(st.requests_cancelled, 3);
        CHECK_INT(st.pages_used, 0);
        /* every page back: free, or (with the prefix cache) cached and evictable */
        CHECK_INT(st.pages_free + st.pages_cached, 64);
        if (!cached) CHECK_INT(st.pages_free, 64);
        pkv_kv_stats ks;
        pkv_kv_stats_get(pkv_engine_cache(e), &ks);
        CHECK_INT(ks.n_seqs, 0);
        pkv_engine_free(e);
    }
}

/* ------------------------------------------------- finish reasons, priority */

static void test_finish(void) {
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = (int32_t)(i * 17 % 320);
    static et_rec ref, got;
    pkv_request_params r = greedy(prompt, 16, 12);
    et_alone(g_m, &r, &ref);
    CHECK_INT(ref.s[0].n, 12);
    CHECK_INT(ref.s[0].fin, PKV_FINISH_LENGTH);
    CHECK_INT(ref.s[0].final_token, ref.s[0].tok[11]); /* the last token comes with the final event */

    /* a stop id: the sample ends at its first occurrence, which is delivered flagged */
    int32_t stop = ref.s[0].tok[4];
    int first = 0;
    while (ref.s[0].tok[first] != stop) first++;
    r.stop_tokens = &stop;
    r.n_stop = 1;
    et_alone(g_m, &r, &got);
    CHECK_INT(got.s[0].n, first + 1);
    CHECK_INT(got.s[0].fin, PKV_FINISH_STOP);
    CHECK(got.s[0].stop_token);
    CHECK_INT(got.s[0].final_token, stop);
    CHECK(!memcmp(got.s[0].tok, ref.s[0].tok, (size_t)(first + 1) * 4));

    /* the callback says stop after 3 tokens: a final STOP event without a token follows */
    pkv_engine *e = pkv_engine_create(g_m, et_params(256, 8, 0));
    REQUIRE_VOID(e);
    memset(&got, 0, sizeof got);
    got.stop_after = 3;
    r = greedy(prompt, 16, 12);
    r.on_event = et_on_event;
    r.user = &got;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    CHECK_INT(got.s[0].n, 3);
    CHECK_INT(got.s[0].fin, PKV_FINISH_STOP);
    CHECK_INT(got.s[0].final_token, -1);
    CHECK(!got.s[0].stop_token);
    CHECK_INT(got.s[0].finals, 1);

    /* priority: with room for one sequence at a time the higher priority, submitted
     * last, finishes first */
    pkv_engine_free(e);
    pkv_engine_params ep = et_params(64, 8, 0);
    ep.max_seqs = 1;
    e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    static et_rec lo, hi;
    memset(&lo, 0, sizeof lo);
    memset(&hi, 0, sizeof hi);
    r = greedy(prompt, 16, 4);
    r.on_event = et_on_event;
    r.user = &lo;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    r.user = &hi;
    r.priority = 5;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    int left = 2;
    while (left == 2) CHECK_OK(pkv_engine_step(e, &left));
    CHECK_INT(hi.s[0].finals, 1);
    CHECK_INT(lo.s[0].finals, 0);
    et_drain(e);
    et_same(&hi, &lo, 1, "same request at two priorities", 0);
    pkv_engine_free(e);

    /* A high-priority request arriving at a full pool preempts running ones of
     * lower priority at admission, finishes before them, and nobody's tokens change. */
    ep = et_params(128, 4, 18);
    e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    static et_rec low[2], high, low_ref[2], high_ref;
    int32_t long_prompt[2][28];
    for (int i = 0; i < 28; i++) long_prompt[0][i] = long_prompt[1][i] = (int32_t)(i * 31 % 320);
    long_prompt[1][0] = 5; /* no shared pages between the two */
    /* after 3 steps two lows hold 16 of the 18 pages; the high one needs 4 */
    pkv_request_params lr[2] = {greedy(long_prompt[0], 28, 20), greedy(long_prompt[1], 28, 20)};
    pkv_request_params hr = greedy(prompt + 2, 14, 12);
    hr.priority = 3;
    et_alone(g_m, &hr, &high_ref);
    for (int i = 0; i < 2; i++) {
        et_alone(g_m, &lr[i], &low_ref[i]);
        memset(&low[i], 0, sizeof low[i]);
        pkv_request_params q = lr[i];
        q.on_event = et_on_event;
        q.user = &low[i];
        CHECK_OK(pkv_engine_submit(e, &q, NULL));
    }
    for (int k = 0; k < 3; k++) CHECK_OK(pkv_engine_step(e, NULL));
    memset(&high, 0, sizeof high);
    hr.on_event = et_on_event;
    hr.user = &high;
    CHECK_OK(pkv_engine_submit(e, &hr, NULL));
    pkv_engine_stats before, after;
    pkv_engine_stats_get(e, &before);
    CHECK_INT(before.pages_used, 16);
    CHECK_INT(before.preemptions_swap + before.preemptions_recompute, 0);
    CHECK_OK(pkv_engine_step(e, NULL)); /* admission preempts a low one for the high one */
    pkv_engine_stats_get(e, &after);
    CHECK(after.preemptions_swap + after.preemptions_recompute > before.preemptions_swap + before.preemptions_recompute);
    CHECK_INT(high.s[0].n, 1);
    left = 3;
    while (high.s[0].finals == 0 && left > 0) CHECK_OK(pkv_engine_step(e, &left));
    for (int i = 0; i < 2; i++) CHECK_INT(low[i].s[0].finals, 0); /* the high one finished first */
    et_drain(e);
    et_same(&high_ref, &high, 1, "high-priority request", 0);
    for (int i = 0; i < 2; i++) et_same(&low_ref[i], &low[i], 1, "preempted low-priority request", i);
    pkv_engine_free(e);
}

/* -------------------------------------------------------------- bad input */

static void test_bad_input(void) {
    pkv_engine_params ep = et_params(64, 4, 20);
    pkv_engine *e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    int32_t ok_prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8}, long_prompt[80] = {0}, bad_tok[3] = {5, 320, 7}, neg_tok[2] = {-1, 4};
    static et_rec good, ref, before;
    pkv_request_params g = greedy(ok_prompt, 8, 10);
    et_alone(g_m, &g, &ref);
    memset(&good, 0, sizeof good);
    memset(&before, 0, sizeof before);
    g.on_event = et_on_event;
    g.user = &before;
    CHECK_OK(pkv_engine_submit(e, &g, NULL)); /* running while the bad ones arrive */
    CHECK_OK(pkv_engine_step(e, NULL));
    struct {
        pkv_request_params r;
        const char *msg;
    } bad[16];
    int nbad = 0;
    for (int i = 0; i < 16; i++) bad[i].r = greedy(ok_prompt, 8, 10);
    bad[nbad].r.n_prompt = 0, bad[nbad++].msg = "empty";
    bad[nbad].r.prompt = NULL, bad[nbad++].msg = "empty";
    bad[nbad].r.prompt = long_prompt, bad[nbad].r.n_prompt = 80, bad[nbad++].msg = "the context limit is 64 tokens";
    bad[nbad].r.n = 0, bad[nbad++].msg = "n = 0";
    bad[nbad].r.n = 65, bad[nbad++].msg = "n = 65";
    bad[nbad].r.max_tokens = 1000000000, bad[nbad++].msg = "exceed the context limit of 64";
    bad[nbad].r.max_tokens = -1, bad[nbad++].msg = "max_tokens = -1";
    bad[nbad].r.prompt = bad_tok, bad[nbad].r.n_prompt = 3, bad[nbad++].msg = "prompt token 1 is 320";
    bad[nbad].r.prompt = neg_tok, bad[nbad].r.n_prompt = 2, bad[nbad++].msg = "prompt token 0 is -1";
    bad[nbad].r.top_logprobs = 21, bad[nbad++].msg = "top_logprobs";
    bad[nbad].r.sampling.top_p = 2, bad[nbad++].msg = "top_p";
    bad[nbad].r.n_stop = 2, bad[nbad++].msg = "stop_tokens is NULL";
    bad[nbad].r.stop_tokens = bad_tok, bad[nbad].r.n_stop = 3, bad[nbad++].msg = "stop token 1 is 320";
    int64_t live = pkv_alloc_live();
    for (int i = 0; i < nbad; i++) {
        uint64_t id = 77;
        pkv_err_clear();
        CHECK_STATUS(pkv_engine_submit(e, &bad[i].r, &id), PKV_ERR_INVALID);
        CHECK_MSG(bad[i].msg);
        CHECK(strstr(pkv_errmsg(), ": :") == NULL); /* "submit: : sampler: top_p ..." before */
        CHECK_INT(id, 0);
    }
    CHECK_INT(pkv_alloc_live(), live);
    CHECK_STATUS(pkv_engine_submit(e, NULL, NULL), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_engine_submit(NULL, &g, NULL), PKV_ERR_INVALID);
    g.user = &good;
    CHECK_OK(pkv_engine_submit(e, &g, NULL));
    et_drain(e);
    et_same(&ref, &good, 1, "request after bad ones", 0);
    et_same(&ref, &before, 1, "request running while bad ones came", 0);
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.requests_submitted, 2);
    CHECK_INT(st.requests_finished, 2);
    pkv_engine_free(e);

    /* a request that could never fit the pool, though it fits the context */
    ep = et_params(64, 4, 10);
    e = pkv_engine_create(g_m, ep);
    REQUIRE_VOID(e);
    pkv_request_params big = greedy(ok_prompt, 8, 50);
    pkv_err_clear();
    CHECK_STATUS(pkv_engine_submit(e, &big, NULL), PKV_ERR_INVALID);
    CHECK_MSG("needs 15 KV pages of 4 tokens");
    CHECK_MSG("only 10 pages");
    big.max_tokens = 33; /* 8 + 33 - 1 = 40 tokens = 10 pages: fits exactly, alone */
    CHECK_OK(pkv_engine_submit(e, &big, NULL));
    et_drain(e);

    /* thread misuse */
    CHECK_OK(pkv_engine_start(e));
    CHECK_STATUS(pkv_engine_start(e), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_engine_step(e, NULL), PKV_ERR_INVALID);
    CHECK_OK(pkv_engine_stop(e));
    CHECK_OK(pkv_engine_stop(e));
    CHECK_OK(pkv_engine_step(e, NULL));
    pkv_engine_free(e);

    /* bad engine params */
    ep = pkv_engine_default_params();
    ep.max_batch_tokens = -1;
    CHECK(pkv_engine_create(g_m, ep) == NULL);
    CHECK_MSG("max_batch_tokens");
    CHECK(pkv_engine_create(NULL, pkv_engine_default_params()) == NULL);
    pkv_engine_free(NULL);
    CHECK_STATUS(pkv_engine_cancel(NULL, 1), PKV_ERR_INVALID);
    CHECK(!strcmp(pkv_finish_reason_str(PKV_FINISH_LENGTH), "length"));
}

/* Freeing an engine with work left gives every sample its CANCELLED event. */
static void test_free_pending(void) {
    pkv_engine *e = pkv_engine_create(g_m, et_params(128, 8, 0));
    REQUIRE_VOID(e);
    int32_t p[5] = {3, 1, 4, 1, 5};
    static et_rec r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++) {
        pkv_request_params q = greedy(p, 5, 20);
        q.n = i + 1;
        q.on_event = et_on_event;
        q.user = &r[i];
        CHECK_OK(pkv_engine_submit(e, &q, NULL));
        if (i == 1) CHECK_OK(pkv_engine_step(e, NULL));
    }
    pkv_engine_free(e);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j <= i; j++) {
            CHECK_INT(r[i].s[j].finals, 1);
            CHECK_INT(r[i].s[j].fin, PKV_FINISH_CANCELLED);
        }
}

/* The n-th allocation failing, for n spread over a whole run (engine creation,
 * submit, admission, prefix match, fork, forward, sampling): no crash, no leak,
 * every accepted request still gets exactly one final event per sample, a request
 * that fails fails with PKV_ERR_NOMEM, and a request that completes has exactly
 * its tokens. (Request 0 failing in its prompt's step must leave nothing in the
 * prefix cache for request 1: pages whose K/V was never computed would give it
 * wrong tokens or NaN logits, unless the recycled memory under them happens to
 * hold an earlier run's same K/V; test-kv-faults checks the rollback directly.) */
static void test_alloc_failures(void) {
    int32_t a[20], b[20];
    for (int i = 0; i < 20; i++) a[i] = b[i] = (int32_t)(i * 7 + 3);
    b[19] = 1;
    static et_rec ref[2], got[2];
    pkv_request_params rp[2] = {greedy(a, 20, 6), greedy(b, 20, 5)};
    rp[1].n = 2;
    rp[1].sampling.temp = 0.8f;
    for (int i = 0; i < 2; i++) et_alone(g_m, &rp[i], &ref[i]);
    int64_t live = pkv_alloc_live();
    pkv_alloc_fail_at(0);
    uint64_t total = 0;
    for (uint64_t n = 0, k = 0; n == 0 || n <= total; k++) {
        pkv_alloc_fail_at(n);
        pkv_engine *e = pkv_engine_create(g_m, et_params(128, 8, 0));
        bool accepted[2] = {false, false};
        for (int i = 0; e && i < 2; i++) {
            memset(&got[i], 0, sizeof got[i]);
            pkv_request_params r = rp[i];
            r.on_event = et_on_event;
            r.user = &got[i];
            pkv_status s = pkv_engine_submit(e, &r, NULL);
            if (s) CHECK_INT(s, PKV_ERR_NOMEM);
            accepted[i] = s == PKV_OK;
            if (i == 0) CHECK_OK(pkv_engine_step(e, NULL)); /* the second shares a page with the first */
        }
        if (e) et_drain(e);
        pkv_engine_free(e);
        uint64_t used = pkv_alloc_fail_at(0);
        if (n == 0) total = used; /* the run without a failure counts the allocations */
        CHECK_INT(pkv_alloc_live(), live);
        for (int i = 0; i < 2; i++) {
            if (!accepted[i]) continue;
            bool err = false;
            for (int j = 0; j < rp[i].n; j++) {
                CHECK_INT(got[i].s[j].finals, 1);
                err |= got[i].s[j].fin == PKV_FINISH_ERROR;
                /* the only error an allocation failure may cause (a NaN logit from K/V
                 * never computed would be another) */
                if (got[i].s[j].fin == PKV_FINISH_ERROR) CHECK_INT(got[i].s[j].status, PKV_ERR_NOMEM);
            }
            if (!err) et_same(&ref[i], &got[i], rp[i].n, "request under allocation failure", (int)n);
        }
        n++; /* every allocation of the run fails once */
    }
    fprintf(stderr, "allocation failures: a run makes %llu allocations\n", (unsigned long long)total);
}

/* `pagekv bench serve` runs the load: a pool too small preempts, a 90% shared
 * prefix is served from the cache, no request fails. */
static double json_num(const char *key) {
    const char *p = strstr(th_out, key);
    return p ? atof(p + strlen(key)) : -1;
}

static void test_bench_cli(void) {
    const char *base = "bench serve --tiny -t 2 -n 8 --clients 4 --prompt-tokens 20 --output-tokens 6 --page-size 8 --json";
    int rc = th_cli("", false, "%s --pool-pages 6", base);
    if (rc == -1) {
        fprintf(stderr, "bench serve: no CLI (PKV_CLI unset), not checked\n");
        return;
    }
    CHECK_INT(rc, 0);
    HAS("\"failed\": 0,");
    HAS("\"draft\": null");
    CHECK(json_num("\"preemptions\": {\"swap\": ") + json_num("\"recompute\": ") > 0);
    CHECK(json_num("\"peak_pages\": ") <= 6);
    double gen = json_num("\"generated_tokens\": ");
    CHECK(gen >= 8 * 3 && gen <= 8 * 9); /* every request its 3..9 tokens */
    /* one client, no preemption: computed = prompt tokens - prefix hits + (generated - 1) per request */
    CHECK_INT(th_cli("", false, "%s --shared-prefix 0.9 --clients 1 --prompt-tokens 40", base), 0);
    double hit = json_num("\"prefix_hit_tokens\": ");
    CHECK(json_num("\"prefix_hit_fraction\": ") > 0.4); /* ~36 of 20..60 tokens shared, whole pages of 8 */
    CHECK_INT(json_num("\"computed_tokens\": "),
              json_num("\"prompt_tokens\": ") - hit + json_num("\"generated_tokens\": ") - 8);
    CHECK_INT(th_cli("", false, "%s --rate 1000", base), 0);
    HAS("\"arrivals\": \"poisson\"");
    CHECK_INT(th_cli("", false, "bench serve --tiny --shared-prefix 2"), 2);
}

#ifndef ET_DEVICE
#define ET_DEVICE "cpu"
#endif

int main(void) {
    et_device = ET_DEVICE;
    if (strcmp(ET_DEVICE, "cpu")) g_nb = 24; /* the mixed load is 64 requests on the CPU */
    pkv_device *probe = pkv_device_open(ET_DEVICE, pkv_device_default_params());
    if (!probe) return th_skip(pkv_errmsg());
    pkv_device_close(probe);
    int64_t live0 = pkv_alloc_live();
    g_m = et_model("llama", PKV_TYPE_Q8_0, 7);
    if (!g_m) return th_done();
    int64_t live1 = pkv_alloc_live();
    {   /* what a model load leaves behind (process-wide caches) is not the engine's */
        pkv_engine *e = pkv_engine_create(g_m, et_params(64, 8, 0));
        pkv_engine_free(e);
        CHECK_INT(pkv_alloc_live(), live1);
    }
    test_vs_context();
    test_batch_invariance();
    test_preemption();
    test_on_context();
    test_prefill_only();
    if (!strcmp(ET_DEVICE, "cpu")) { /* device-independent scheduling checks: once */
        test_prefix_cache(true);
        test_n_fork();
        test_cancel();
        test_finish();
        test_bad_input();
        test_free_pending();
        test_alloc_failures();
        test_bench_cli();
    }
    CHECK_INT(pkv_alloc_live(), live1); /* every engine freed everything */
    pkv_model_free(g_m);
    /* qwen3 (its own norms) in f16: batch invariance again */
    g_m = et_model("qwen3", PKV_TYPE_F16, 8);
    if (g_m) test_batch_invariance();
    pkv_model_free(g_m);
    /* a mixture of experts (qwen3moe): routing is per token, each expert runs on the
     * rows routed to it, so a request's tokens are the same alone or batched, and
     * preemption (swap, recompute) changes nothing */
    g_m = et_model("qwen3moe", PKV_TYPE_Q8_0, 10);
    if (g_m) {
        fprintf(stderr, "mixture of experts (qwen3moe, 4 experts, 2 per token):\n");
        test_vs_context();
        test_batch_invariance();
        test_preemption();
    }
    pkv_model_free(g_m);
    /* Gemma 2 (sliding layers of 8 tokens, soft-caps, GeGLU, post-norms): the window
     * is cut at absolute positions, so batching and preemption change nothing */
    g_m = et_model("gemma2", PKV_TYPE_F16, 11);
    if (g_m) {
        fprintf(stderr, "gemma2 (sliding window 8 on even layers):\n");
        test_vs_context();
        test_batch_invariance();
        test_preemption();
        /* a failed step's rollback with a window pool: none of its pages, whose K/V
         * was never computed, may serve the next request's prefix; its row scratch (UBSan) */
        test_alloc_failures();
    }
    pkv_model_free(g_m);
    /* Gemma 3 (Q/K norms, no soft-caps, sliding layers of 8 with their own RoPE base;
     * et_model's two layers are both sliding ones: test-model-ref covers the global
     * layers' RoPE): the same invariances */
    g_m = et_model("gemma3", PKV_TYPE_F16, 12);
    if (g_m) {
        fprintf(stderr, "gemma3 (sliding window 8, five of six layers):\n");
        test_vs_context();
        test_batch_invariance();
        test_preemption();
        test_alloc_failures();
    }
    pkv_model_free(g_m);
    /* gpt-oss (attention sinks, even layers sliding over 8 tokens, YaRN, biased experts
     * with the clamped SwiGLU and softmax-after-top-k routing): the same invariances */
    g_m = et_model("gpt-oss", PKV_TYPE_Q8_0, 13);
    if (g_m) {
        fprintf(stderr, "gpt-oss (sinks, sliding window 8 on even layers, YaRN, 4 experts, 2 per token):\n");
        test_vs_context();
        test_batch_invariance();
        test_preemption();
        test_alloc_failures();
    }
    pkv_model_free(g_m);
    /* Gemma 4 (per-layer head sizes, proportional RoPE, per-layer embeddings, the last two
     * layers reusing the KV of earlier ones): the same invariances, and the prefix cache
     * publishes its pages (every cache layer is written by its own layer) */
    g_m = et_model("gemma4", PKV_TYPE_F16, 15);
    if (g_m) {
        fprintf(stderr, "gemma4 (6 layers, 2 of them sharing KV; sliding window 8):\n");
        test_vs_context();
        test_batch_invariance();
        test_preemption();
        test_prefix_cache(false);
        test_alloc_failures();
    }
    pkv_model_free(g_m);
    /* Qwen3.5 (gated delta-net layers with a recurrent state per sequence in the
     * cache's state slots, and a gated attention layer): a sequence's state depends
     * only on its own tokens, so batching changes nothing; preemption swaps the state
     * with the pages or recomputes it */
    g_m = et_model("qwen35", PKV_TYPE_Q8_0, 14);
    if (g_m) {
        fprintf(stderr, "qwen35 (3 delta-net layers, 1 attention layer):\n");
        test_vs_context();
        test_batch_invariance();
        test_preemption();
        test_n_fork(); /* n = 4 by fork: the state is copied, the prompt computed once */
        test_on_context(); /* a drop truncates the context back: its state from a checkpoint */
        if (!strcmp(ET_DEVICE, "cpu")) test_prefill_only(); /* (llama's run covers the device) */
        test_alloc_failures();
    }
    pkv_model_free(g_m);
    /* granitehybrid (Mamba-2 layers: a conv window and SSM state per sequence in the
     * state slots, and an attention layer): the same as qwen35 (batch invariance
     * includes prefix hits at the boundaries whose state the cache stored) */
    static const char *const mambas[] = {"granitehybrid", "nemotron_h"};
    /* (on a device: granitehybrid's invariances only; nemotron_h's Mamba-2 is the same
     * block, on vulkan:0 in test-model-vulkan and test-check; the allocation-failure
     * sweeps are the host's bookkeeping. test-engine-vulkan stays inside its time.) */
    const bool on_cpu = !strcmp(ET_DEVICE, "cpu");
    for (int k = 0; k < (on_cpu ? 2 : 1); k++) {
        g_m = et_model(mambas[k], PKV_TYPE_Q8_0, 16);
        if (g_m) {
            fprintf(stderr, "%s (a Mamba-2 layer, an attention layer%s):\n", mambas[k], k ? ", an MLP layer" : "");
            test_vs_context();
            test_batch_invariance();
            test_preemption();
            test_n_fork();
            test_on_context();
            if (on_cpu) test_alloc_failures();
        }
        pkv_model_free(g_m);
    }
    /* LFM2 (gated short convolutions, their conv state per sequence in the state
     * slots, beside an attention layer): the same invariances (batch invariance with
     * prefix hits, which restore the state kept at a published page boundary) */
    g_m = et_model_ex("lfm2", PKV_TYPE_Q8_0, 16, 3, 0, false);
    if (g_m) {
        fprintf(stderr, "lfm2 (2 short-conv layers, 1 attention layer):\n");
        test_vs_context();
        test_batch_invariance();
        test_preemption();
        test_n_fork();
        test_on_context();
    }
    pkv_model_free(g_m);
    /* quantized KV pages (K q8_0, V q4_0): batch invariance and preemption hold on them too */
    et_n_embd = 128;
    et_kv_k = PKV_TYPE_Q8_0;
    et_kv_v = PKV_TYPE_Q4_0;
    g_m = et_model("qwen3", PKV_TYPE_Q8_0, 9);
    if (g_m) {
        fprintf(stderr, "quantized KV pages (K q8_0, V q4_0):\n");
        test_batch_invariance();
        test_preemption();
    }
    pkv_model_free(g_m);
    fprintf(stderr, "allocations left by the model loads: %lld\n", (long long)(pkv_alloc_live() - live0));
    return th_done();
}
