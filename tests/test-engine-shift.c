// labels: kv engine timeout=300
/* The engine's context shift and caller's sampler (pkv_request_params.context_shift,
 * n_keep, sampler; docs/engine.md, "Context shift"), content-checked against the
 * loop pagekv run --context-shift ran before it moved onto the engine: sample,
 * accept, and when the context is full pkv_context_shift (keep n_keep tokens and a
 * leading BOS, drop half of the rest), then pkv_context_decode, same seed:
 *  - the same tokens, bitwise, and n_shifted counts what the loop dropped, with
 *    n_keep 0 (BOS kept) and 5, seeded and greedy, on a context of 32 positions
 *    under an engine of 33 (pagekv run's shape: the last token goes in unshifted)
 *    and of 32 (the last token at full shifts too: the same tokens);
 *  - the context afterwards holds the tokens the loop's does, plus the last;
 *  - a caller's sampler carried over two requests on one context (a chat's turns)
 *    draws as one loop over one sampler does;
 *  - bad combinations are refused at submit with PKV_ERR_INVALID and a message
 *    naming the field, and nothing is queued. */
#include "base/base.h"
#include "engine-testlib.h"

enum { N_CTX = 32, N_PROMPT = 12, N_GEN = 90 };

static pkv_model *g_m;

/* The old loop: *n_out tokens in out, what it dropped in *dropped, the context's
 * tokens at the end in held (*n_held). */
static void loop_ref(const int32_t *prompt, pkv_sampler_params sp, int n_keep, int32_t *out, int *n_out,
                     int64_t *dropped, int32_t *held, int64_t *n_held) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = N_CTX;
    cp.page_size = 8;
    cp.n_seq_max = 2;
    pkv_kv_cache *c = pkv_model_cache_create(g_m, cp);
    pkv_context *ctx = c ? pkv_context_create(g_m, c, N_CTX) : NULL;
    pkv_sampler *smp = pkv_sampler_create(sp, 320);
    *n_out = 0;
    *dropped = 0;
    REQUIRE_VOID(ctx && smp);
    CHECK_OK(pkv_context_decode(ctx, prompt, N_PROMPT));
    for (;;) {
        int32_t t;
        CHECK_OK(pkv_sampler_sample(smp, pkv_context_logits(ctx), &t));
        pkv_sampler_accept(smp, t);
        out[(*n_out)++] = t;
        if (*n_out >= N_GEN) break;
        if (pkv_context_n_tokens(ctx) >= N_CTX) {
            int64_t have = pkv_context_n_tokens(ctx), keep = n_keep;
            int32_t first = -1;
            if (pkv_context_tokens(ctx, 0, 1, &first) == PKV_OK && first == pkv_model_bos(g_m) && keep < 1) keep = 1;
            if (keep > have - 2) keep = have - 2;
            int64_t drop = (have - keep) / 2;
            CHECK_OK(pkv_context_shift(ctx, keep, drop));
            *dropped += drop;
        }
        CHECK_OK(pkv_context_decode(ctx, &t, 1));
    }
    *n_held = pkv_context_n_tokens(ctx);
    CHECK_OK(pkv_context_tokens(ctx, 0, *n_held, held));
    pkv_sampler_free(smp);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
}

typedef struct shift_rec {
    et_rec rec;
    int64_t n_shifted; /* of the final event */
} shift_rec;

static bool on_event(const pkv_engine_event *ev, void *user) {
    shift_rec *r = user;
    if (ev->finish != PKV_FINISH_NONE) r->n_shifted = ev->n_shifted;
    if (ev->finish == PKV_FINISH_ERROR) TH_FAIL("request failed: %s", ev->message);
    return et_on_event(ev, &r->rec);
}

/* The same through the engine: a request on a context of N_CTX positions, the
 * engine's limit n_eng. */
static void check_shift(const int32_t *prompt, pkv_sampler_params sp, int n_keep, int n_eng) {
    int32_t want[N_GEN], held[N_CTX];
    int n_want = 0;
    int64_t dropped = 0, n_held = 0;
    loop_ref(prompt, sp, n_keep, want, &n_want, &dropped, held, &n_held);
    CHECK(dropped > 0); /* the loop did shift */

    pkv_engine_params ep = et_params(n_eng, 8, 0);
    ep.cache.n_seq_max = 2; /* the shift moves the pages after the cut into fresh ones */
    ep.prefix_cache = false;
    pkv_engine *e = pkv_engine_create(g_m, ep);
    pkv_context *ctx = e ? pkv_context_create(g_m, pkv_engine_cache(e), N_CTX) : NULL;
    REQUIRE_VOID(ctx);
    static shift_rec got;
    memset(&got, 0, sizeof got);
    pkv_request_params rp = pkv_request_default_params();
    rp.context = ctx;
    rp.prompt = prompt;
    rp.n_prompt = N_PROMPT;
    rp.sampling = sp;
    rp.ignore_eos = true;
    rp.max_tokens = N_GEN;
    rp.context_shift = true;
    rp.n_keep = n_keep;
    rp.on_event = on_event;
    rp.user = &got;
    CHECK_OK(pkv_engine_submit(e, &rp, NULL));
    et_drain(e);
    const et_sample *s = &got.rec.s[0];
    CHECK_INT(s->n, n_want);
    CHECK_INT(s->finals, 1);
    CHECK_INT(s->fin, PKV_FINISH_LENGTH);
    CHECK_MEM(s->tok, want, (size_t)n_want * sizeof *want);
    if (n_eng == N_CTX + 1) { /* pagekv run's shape: the same count, the last token in unshifted */
        CHECK_INT(got.n_shifted, dropped);
        CHECK_INT(pkv_context_n_tokens(ctx), n_held + 1);
        int32_t have[N_CTX + 1];
        CHECK_OK(pkv_context_tokens(ctx, 0, n_held + 1, have));
        CHECK_MEM(have, held, (size_t)n_held * sizeof *held);
        CHECK_INT(have[n_held], want[n_want - 1]);
    } else {
        CHECK(got.n_shifted >= dropped);
        CHECK(pkv_context_n_tokens(ctx) <= N_CTX);
    }
    CHECK(pkv_context_logits(ctx) != NULL);
    pkv_context_free(ctx);
    pkv_engine_free(e);
}

/* Two requests on one context with one sampler of the caller's: the tokens a loop
 * over one sampler gives (its draws go on across the requests). */
static void test_caller_sampler(void) {
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.temp = 1.5f;
    sp.seed = 11;
    sp.repeat_penalty = 1.3f;
    int32_t p1[6] = {5, 9, 17, 33, 65, 129}, p2[4] = {7, 3, 99, 200};
    enum { G = 10 };
    int32_t want[2 * G];
    {
        pkv_cache_params cp = pkv_cache_default_params();
        cp.n_ctx = 64;
        cp.page_size = 8;
        pkv_kv_cache *c = pkv_model_cache_create(g_m, cp);
        pkv_context *ctx = c ? pkv_context_create(g_m, c, 64) : NULL;
        pkv_sampler *smp = pkv_sampler_create(sp, 320);
        REQUIRE_VOID(ctx && smp);
        int k = 0;
        for (int turn = 0; turn < 2; turn++) {
            CHECK_OK(turn ? pkv_context_decode(ctx, p2, 4) : pkv_context_decode(ctx, p1, 6));
            for (int i = 0; i < G; i++) {
                CHECK_OK(pkv_sampler_sample(smp, pkv_context_logits(ctx), &want[k]));
                pkv_sampler_accept(smp, want[k]);
                CHECK_OK(pkv_context_decode(ctx, &want[k], 1)); /* a request on a context runs its last token in */
                k++;
            }
        }
        pkv_sampler_free(smp);
        pkv_context_free(ctx);
        pkv_kv_cache_free(c);
    }
    pkv_engine *e = pkv_engine_create(g_m, et_params(64, 8, 0));
    pkv_context *ctx = e ? pkv_context_create(g_m, pkv_engine_cache(e), 64) : NULL;
    pkv_sampler *smp = pkv_sampler_create(sp, 320);
    REQUIRE_VOID(ctx && smp);
    static et_rec got[2];
    memset(got, 0, sizeof got);
    for (int turn = 0; turn < 2; turn++) {
        pkv_request_params rp = pkv_request_default_params();
        rp.context = ctx;
        rp.prompt = turn ? p2 : p1;
        rp.n_prompt = turn ? 4 : 6;
        rp.sampler = smp;
        rp.sampling.seed = 999; /* ignored: the caller's sampler draws */
        rp.max_tokens = G;
        rp.ignore_eos = true;
        rp.on_event = et_on_event;
        rp.user = &got[turn];
        CHECK_OK(pkv_engine_submit(e, &rp, NULL));
        et_drain(e);
        CHECK_INT(got[turn].s[0].n, G);
        CHECK_MEM(got[turn].s[0].tok, want + turn * G, G * sizeof *want);
    }
    pkv_context_free(ctx);
    pkv_engine_free(e);
    pkv_sampler_free(smp); /* the engine did not free it */
}

/* Refused at submit, nothing queued. */
static void test_bad(void) {
    pkv_engine *e = pkv_engine_create(g_m, et_params(64, 8, 0));
    pkv_context *ctx = e ? pkv_context_create(g_m, pkv_engine_cache(e), 64) : NULL;
    pkv_sampler *other = pkv_sampler_create(pkv_sampler_default_params(), 100);
    REQUIRE_VOID(ctx && other);
    int32_t p[3] = {1, 2, 3};
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = p;
    rp.n_prompt = 3;
    rp.max_tokens = 4;
    rp.context_shift = true;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID); /* no context */
    CHECK_MSG("context_shift needs a request on a context");
    rp.context = ctx;
    rp.max_tokens = 0;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
    CHECK_MSG("max_tokens >= 1");
    rp.max_tokens = 4;
    rp.n_keep = -1;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
    CHECK_MSG("n_keep = -1");
    rp.n_keep = 2;
    rp.context_shift = false;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
    CHECK_MSG("set context_shift too");
    rp.n_keep = 0;
    rp.context_shift = true;
    rp.n = 2;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID); /* one sample on a context */
    CHECK_MSG("n = 2");
    rp.n = 1;
    rp.context_shift = false;
    rp.sampler = other;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
    CHECK_MSG("another vocabulary size");
    rp.context = NULL;
    rp.sampler = other;
    rp.n = 2;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
    CHECK_MSG("needs n = 1");
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK_INT(st.requests_submitted, 0);
    pkv_sampler_free(other);
    pkv_context_free(ctx);
    pkv_engine_free(e);
}

int main(void) {
    pkv_device *probe = pkv_device_open("cpu", pkv_device_default_params());
    if (!probe) return th_skip(pkv_errmsg());
    pkv_device_close(probe);
    g_m = et_model("llama", PKV_TYPE_Q8_0, 7);
    if (!g_m) return th_done();
    int32_t prompt[N_PROMPT];
    uint64_t rs = 3;
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(et_rand(&rs) % 320);
    int32_t bos = pkv_model_bos(g_m);
    if (bos >= 0) prompt[0] = bos; /* n_keep 0 keeps it */
    pkv_sampler_params seeded = pkv_sampler_default_params(), greedy = seeded;
    seeded.temp = 1.2f;
    seeded.seed = 5;
    greedy.temp = 0;
    check_shift(prompt, seeded, 0, N_CTX + 1);
    check_shift(prompt, seeded, 5, N_CTX + 1);
    check_shift(prompt, greedy, 0, N_CTX + 1);
    check_shift(prompt, seeded, 5, N_CTX);
    test_caller_sampler();
    test_bad();
    pkv_model_free(g_m);
    return th_done();
}
