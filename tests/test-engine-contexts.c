// labels: kv engine timeout=300
/* Idle contexts the engine owns (pkv_engine_context_hold / _release / _drop;
 * docs/engine.md, "Idle contexts"), in a pool of 30 pages of 4 tokens:
 *  - an idle held context of 40 tokens is swapped out to the host pool when a
 *    plain request needs its pages, before any running request is preempted
 *    (no preemption counted), and the request gives its lone-run tokens;
 *  - the swapped context's tokens read back unchanged, and a request submitted
 *    on it (swapped) is admitted after the engine swaps it back in: its tokens,
 *    logprobs and the context's logits afterwards are bitwise those of a
 *    never-swapped twin context on a roomy engine;
 *  - release brings a swapped one back (counted), and fails with
 *    PKV_ERR_OUT_OF_PAGES, leaving it held and swapped, when the pool cannot hold
 *    it; drop hands it back as it is;
 *  - a context held with PKV_HOLD_UNSHARED whose pages a fork shares stays on
 *    the device (nothing to free without copying shared pages);
 *  - bad calls are refused with a status and nothing changes. */
#include "base/base.h"
#include "engine-testlib.h"

enum { NC = 40, NB = 30, MB = 60, MG = 10 };

static pkv_model *g_m;

static pkv_request_params greedy(const int32_t *prompt, int n_prompt, int max_tokens, et_rec *rec) {
    pkv_request_params r = pkv_request_default_params();
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    r.max_tokens = max_tokens;
    r.sampling.temp = 0;
    r.ignore_eos = true;
    r.top_logprobs = 2;
    r.on_event = et_on_event;
    r.user = rec;
    return r;
}

static pkv_engine *small_engine(void) {
    pkv_engine_params ep = et_params(128, 4, 30);
    ep.cache.host_pages = 200;
    ep.max_batch_tokens = 24;
    return pkv_engine_create(g_m, ep);
}

/* The twin: the same tokens on a roomy engine's context that is never swapped;
 * a generation of MG tokens on it into *gen, its logits after into logits. */
static void twin_run(const int32_t *toks, et_rec *gen, float *logits) {
    pkv_engine *e = pkv_engine_create(g_m, et_params(128, 4, 0));
    REQUIRE_VOID(e);
    pkv_context *ctx = pkv_context_create(g_m, pkv_engine_cache(e), 128);
    REQUIRE_VOID(ctx);
    CHECK_OK(pkv_context_decode(ctx, toks, NC));
    memset(gen, 0, sizeof *gen);
    pkv_request_params r = greedy(NULL, 0, MG, gen);
    r.context = ctx;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    const float *l = pkv_context_logits(ctx);
    if (l) memcpy(logits, l, 320 * sizeof *logits);
    pkv_context_free(ctx);
    pkv_engine_free(e);
}

/* A plain request of NB tokens and MB to generate: with the context's 10 pages
 * it needs more than the pool's 30. */
static void big_request(pkv_engine *e, const int32_t *prompt, const et_rec *alone, const char *what) {
    static et_rec got;
    memset(&got, 0, sizeof got);
    pkv_request_params r = greedy(prompt, NB, MB, &got);
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    et_same(alone, &got, 1, what, 0);
}

static void test_swap_and_back(void) {
    static int32_t toks[NC], prompt[NB];
    static et_rec alone, twin, gen;
    static float twin_logits[320];
    uint64_t rs = 11;
    for (int i = 0; i < NC; i++) toks[i] = (int32_t)(et_rand(&rs) % 320);
    for (int i = 0; i < NB; i++) prompt[i] = (int32_t)(et_rand(&rs) % 320);
    pkv_request_params br = greedy(prompt, NB, MB, NULL);
    et_alone(g_m, &br, &alone);
    twin_run(toks, &twin, twin_logits);

    pkv_engine *e = small_engine();
    REQUIRE_VOID(e);
    pkv_kv_cache *c = pkv_engine_cache(e);
    pkv_context *ctx = pkv_context_create(g_m, c, 128);
    REQUIRE_VOID(ctx);
    CHECK_OK(pkv_context_decode(ctx, toks, NC));
    CHECK_OK(pkv_engine_context_hold(e, ctx, 0));
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.n_contexts_held, 1);
    CHECK_INT(st.n_contexts_swapped, 0);

    big_request(e, prompt, &alone, "a request that needs the idle context's pages");
    pkv_engine_stats_get(e, &st);
    CHECK(st.context_swap_outs >= 1);
    CHECK_INT(st.preemptions_swap + st.preemptions_recompute, 0); /* the idle context went first */
    CHECK_INT(st.n_contexts_swapped, 1);
    CHECK(pkv_kv_seq_swapped(c, pkv_context_seq(ctx)));
    int32_t back[NC];
    CHECK_INT(pkv_context_n_tokens(ctx), NC);
    CHECK_OK(pkv_context_tokens(ctx, 0, NC, back));
    CHECK(!memcmp(back, toks, sizeof back));

    /* a request on the swapped held context: admitted after the engine swaps it in */
    memset(&gen, 0, sizeof gen);
    pkv_request_params r = greedy(NULL, 0, MG, &gen);
    r.context = ctx;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.context_swap_ins, 1);
    CHECK(!pkv_kv_seq_swapped(c, pkv_context_seq(ctx)));
    et_same(&twin, &gen, 1, "a generation on the context swapped out and back", 0);
    const float *l = pkv_context_logits(ctx);
    CHECK(l && !memcmp(l, twin_logits, sizeof twin_logits));
    CHECK_INT(pkv_context_n_tokens(ctx), NC + MG);

    /* out again, then release: resident, counted, the caller's again */
    big_request(e, prompt, &alone, "the request again");
    CHECK(pkv_kv_seq_swapped(c, pkv_context_seq(ctx)));
    CHECK_OK(pkv_engine_context_release(e, ctx));
    CHECK(!pkv_kv_seq_swapped(c, pkv_context_seq(ctx)));
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.context_swap_ins, 2);
    CHECK_INT(st.n_contexts_held, 0);
    CHECK_INT(pkv_engine_context_release(e, ctx), PKV_ERR_NOT_FOUND);
    CHECK_INT(pkv_engine_context_drop(e, ctx), PKV_ERR_NOT_FOUND);

    /* release when the pool cannot hold it: an error, and it stays held and swapped */
    CHECK_OK(pkv_context_swap_out(ctx));
    CHECK_OK(pkv_engine_context_hold(e, ctx, 0)); /* a swapped one may be handed over */
    pkv_context *fill = pkv_context_create(g_m, c, 128);
    REQUIRE_VOID(fill);
    static int32_t many[100];
    for (int i = 0; i < 100; i++) many[i] = (int32_t)(et_rand(&rs) % 320);
    CHECK_OK(pkv_context_decode(fill, many, 100)); /* 25 pages of 30, not held */
    CHECK_INT(pkv_engine_context_release(e, ctx), PKV_ERR_OUT_OF_PAGES);
    CHECK(strstr(pkv_errmsg(), "context release") != NULL);
    CHECK(pkv_kv_seq_swapped(c, pkv_context_seq(ctx)));
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.n_contexts_held, 1);
    pkv_context_free(fill);
    CHECK_OK(pkv_engine_context_drop(e, ctx)); /* as it is: still swapped */
    CHECK(pkv_kv_seq_swapped(c, pkv_context_seq(ctx)));
    /* not held and swapped: submit refuses it, as before */
    r = greedy(NULL, 0, MG, &gen);
    r.context = ctx;
    CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID);
    pkv_context_free(ctx);
    pkv_kv_stats ks;
    pkv_kv_stats_get(c, &ks);
    CHECK_INT(ks.n_seqs, 0);
    pkv_engine_free(e);
}

/* PKV_HOLD_UNSHARED: a fork that shares 10 of its 11 pages with its parent frees
 * one page by a swap (its host copy holds all 11): without the flag it is taken
 * when a request is short of a page, with it it stays on the device. The pool is
 * filled by a context the engine does not hold (18 pages + 11 of 30). */
static void test_unshared(void) {
    static int32_t toks[NC], fill_toks[72], prompt[3] = {1, 2, 3};
    uint64_t rs = 23;
    for (int i = 0; i < NC; i++) toks[i] = (int32_t)(et_rand(&rs) % 320);
    for (int i = 0; i < 72; i++) fill_toks[i] = (int32_t)(et_rand(&rs) % 320);
    for (int flag = 0; flag < 2; flag++) {
        pkv_engine *e = small_engine();
        REQUIRE_VOID(e);
        pkv_kv_cache *c = pkv_engine_cache(e);
        pkv_context *ctx = pkv_context_create(g_m, c, 128), *f = NULL, *fill = pkv_context_create(g_m, c, 128);
        REQUIRE_VOID(ctx && fill);
        CHECK_OK(pkv_context_decode(ctx, toks, NC));
        f = pkv_context_fork(ctx);
        REQUIRE_VOID(f);
        int32_t one = 5;
        CHECK_OK(pkv_context_decode(f, &one, 1)); /* its 11th page is its own */
        int64_t pages = 0, shared = 0;
        CHECK_OK(pkv_kv_seq_page_stats(c, pkv_context_seq(f), &pages, &shared));
        CHECK(pages == 11 && shared == 10);
        CHECK_OK(pkv_context_decode(fill, fill_toks, 72));
        CHECK_OK(pkv_engine_context_hold(e, f, flag ? PKV_HOLD_UNSHARED : 0));
        static et_rec got;
        memset(&got, 0, sizeof got);
        pkv_request_params r = greedy(prompt, 3, 4, &got); /* 7 tokens: a second page */
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        CHECK_INT(got.s[0].finals, 1);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        CHECK_INT(st.context_swap_outs, flag ? 0 : 1);
        CHECK(pkv_kv_seq_swapped(c, pkv_context_seq(f)) == !flag);
        if (!flag) CHECK_INT(got.s[0].n, 4);
        CHECK_OK(pkv_engine_context_drop(e, f));
        pkv_context_free(fill);
        pkv_context_free(f);
        pkv_context_free(ctx);
        pkv_engine_free(e);
    }
}

static void test_bad_calls(void) {
    pkv_engine *e = small_engine();
    REQUIRE_VOID(e);
    pkv_context *ctx = pkv_context_create(g_m, pkv_engine_cache(e), 128);
    REQUIRE_VOID(ctx);
    CHECK_INT(pkv_engine_context_hold(NULL, ctx, 0), PKV_ERR_INVALID);
    CHECK_INT(pkv_engine_context_hold(e, NULL, 0), PKV_ERR_INVALID);
    CHECK_INT(pkv_engine_context_hold(e, ctx, 4), PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "flags") != NULL);
    CHECK_OK(pkv_engine_context_hold(e, ctx, 0));
    CHECK_INT(pkv_engine_context_hold(e, ctx, 0), PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "held already") != NULL);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    pkv_kv_cache *other = pkv_model_cache_create(g_m, cp);
    pkv_context *octx = other ? pkv_context_create(g_m, other, 128) : NULL;
    REQUIRE_VOID(octx);
    CHECK_INT(pkv_engine_context_hold(e, octx, 0), PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "not on the engine's cache") != NULL);
    CHECK_INT(pkv_engine_context_release(e, octx), PKV_ERR_NOT_FOUND);
    CHECK_OK(pkv_engine_start(e)); /* the thread runs: hold, release and drop are refused */
    CHECK_INT(pkv_engine_context_release(e, ctx), PKV_ERR_INVALID);
    CHECK_OK(pkv_engine_stop(e));
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.n_contexts_held, 1);
    pkv_context_free(octx);
    pkv_kv_cache_free(other);
    CHECK_OK(pkv_engine_context_drop(e, ctx));
    pkv_context_free(ctx);
    pkv_engine_free(e);
}

int main(void) {
    int64_t live0 = pkv_alloc_live();
    g_m = et_model("llama", PKV_TYPE_Q8_0, 7);
    if (!g_m) return th_done();
    int64_t live1 = pkv_alloc_live();
    test_swap_and_back();
    test_unshared();
    test_bad_calls();
    CHECK_INT(pkv_alloc_live(), live1);
    pkv_model_free(g_m);
    (void)live0;
    return th_done();
}
