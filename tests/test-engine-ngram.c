// labels: kv timeout=600
/* N-gram drafts (pkv_engine_params.draft_ngram: prompt lookup, no draft model) in
 * the serving engine: every request's events must be bitwise those of the same
 * request served alone by an engine without drafts (tokens, logprobs, top
 * alternatives, finish), for repetitive prompts (a passage said three times: the
 * lookup finds what follows, proposals are kept) and random ones, greedy and
 * seeded, while prefill is chunked, n > 1 forks and sequences are preempted (swap,
 * recompute); under the speculative-sampling rule too (greedy: plain decoding's
 * tokens), and for turns on a context. Then logit_bias in the engine: a biased
 * request gives the same events alone and batched with others (with and without
 * drafts), its banned token never comes and its forced one always does; bad
 * parameters refused with messages naming them; and the CLI (run, bench spec). */
#include "base/base.h"
#include "engine-testlib.h"

enum { NQ = 12, PLEN = 60 };

static pkv_model *g_m;

typedef struct work {
    int32_t prompt[NQ][PLEN];
    pkv_request_params rp[NQ];
    et_rec alone[NQ], got[NQ];
    int arrive[NQ];
} work;

/* A passage of len random tokens said three times, then its first `cut` tokens
 * again: the lookup finds the n-gram at the end twice before. Returns the length. */
static int repetitive(int32_t *p, uint64_t *rs, int len, int cut) {
    int n = 0;
    for (int i = 0; i < len; i++) p[n++] = (int32_t)(et_rand(rs) % 320);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < len; i++, n++) p[n] = p[i];
    for (int i = 0; i < cut; i++, n++) p[n] = p[i];
    return n;
}

/* NQ requests: even ones repetitive, odd ones random; greedy, a seeded one in four,
 * top logprobs in others, request 5 with n = 3, some stopping at end-of-generation.
 * greedy: all greedy to their max_tokens. */
static void make_work(work *w, uint64_t seed, bool greedy) {
    uint64_t rs = seed;
    for (int i = 0; i < NQ; i++) {
        int n;
        if (i % 2 == 0) {
            n = repetitive(w->prompt[i], &rs, 8 + (int)(et_rand(&rs) % 8), 3 + (int)(et_rand(&rs) % 4));
        } else {
            n = 1 + (int)(et_rand(&rs) % 40);
            for (int k = 0; k < n; k++) w->prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
        }
        w->rp[i] = et_mixed_request(i, w->prompt[i], n, 8 + (int)(et_rand(&rs) % 40), 700, greedy);
        w->arrive[i] = (int)(et_rand(&rs) % 10);
    }
}

static pkv_engine_params ngram_params(int64_t n_pages, bool swap, int draft_max, pkv_draft_accept rule) {
    pkv_engine_params ep = et_params(256, 8, n_pages);
    ep.cache.n_seq_max = NQ + 2;
    ep.cache.host_pages = n_pages ? 1000 : 0;
    ep.max_batch_tokens = 40;
    ep.swap = swap;
    ep.draft_ngram = true;
    ep.draft_max = draft_max;
    ep.draft_accept = rule;
    return ep;
}

/* All of w through an engine with n-gram drafts, submitted over the first steps;
 * each request's events must be those of w->alone. */
static void run_ngram(work *w, const char *what, pkv_engine_params ep, pkv_engine_stats *st) {
    pkv_engine *e = pkv_engine_create(g_m, ep);
    if (!e) {
        TH_FAIL("%s: engine: %s", what, pkv_errmsg());
        return;
    }
    et_run_arrivals(e, NQ, w->arrive, w->rp, w->got, 10, what);
    int bad = 0;
    for (int i = 0; i < NQ; i++) bad += !et_same(&w->alone[i], &w->got[i], w->rp[i].n, what, i);
    pkv_engine_stats_get(e, st);
    fprintf(stderr, "  %-40s %d of %d differ; proposed %llu, accepted %llu, %llu steps, preempted %llu swap %llu "
                    "recompute\n",
            what, bad, NQ, (unsigned long long)st->draft_proposed, (unsigned long long)st->draft_accepted,
            (unsigned long long)st->steps, (unsigned long long)st->preemptions_swap,
            (unsigned long long)st->preemptions_recompute);
    CHECK(st->draft_accepted <= st->draft_proposed);
    CHECK_INT(st->draft_steps, 0); /* no draft model runs */
    CHECK_INT(st->requests_failed, 0);
    CHECK_INT(st->pages_used, 0);
    CHECK_INT(st->n_running + st->n_swapped + st->n_recompute, 0);
    pkv_engine_free(e);
}

static void check_workload(void) {
    static work w;
    pkv_engine_stats st;
    for (int greedy = 1; greedy >= 0; greedy--) {
        make_work(&w, greedy ? 5 : 6, greedy);
        for (int i = 0; i < NQ; i++) et_alone(g_m, &w.rp[i], &w.alone[i]);
        const char *g = greedy ? "greedy" : "mixed";
        char what[96];
        snprintf(what, sizeof what, "%s, roomy:", g);
        run_ngram(&w, what, ngram_params(0, true, 4, PKV_DRAFT_ACCEPT_MATCH), &st);
        CHECK(st.draft_proposed > 0);
        CHECK(st.draft_accepted > 0);
        snprintf(what, sizeof what, "%s, 28 pages, swap:", g);
        run_ngram(&w, what, ngram_params(28, true, 3, PKV_DRAFT_ACCEPT_MATCH), &st);
        CHECK(st.preemptions_swap > 0);
        CHECK(st.draft_accepted > 0);
        snprintf(what, sizeof what, "%s, 28 pages, recompute:", g);
        run_ngram(&w, what, ngram_params(28, false, 6, PKV_DRAFT_ACCEPT_MATCH), &st);
        CHECK(st.preemptions_recompute > 0);
        if (greedy) { /* the sampling rule keeps plain decoding's tokens for greedy requests */
            run_ngram(&w, "greedy, sampling rule:", ngram_params(0, true, 4, PKV_DRAFT_ACCEPT_SAMPLING), &st);
            CHECK(st.draft_accepted > 0);
            pkv_engine_params ep = ngram_params(0, true, 5, PKV_DRAFT_ACCEPT_MATCH);
            ep.ngram_min = 1;
            ep.ngram_max = 8;
            run_ngram(&w, "greedy, n-grams 1..8:", ep, &st);
            CHECK(st.draft_accepted > 0);
        }
    }
}

/* One repetitive prompt alone and one random one alone: acceptance on the first,
 * equality on both. */
static void check_alone(void) {
    uint64_t rs = 99;
    int32_t rep[PLEN], rnd[40];
    int n = repetitive(rep, &rs, 12, 4);
    for (int i = 0; i < 40; i++) rnd[i] = (int32_t)(et_rand(&rs) % 320);
    for (int k = 0; k < 2; k++) {
        pkv_request_params r = pkv_request_default_params();
        r.prompt = k ? rnd : rep;
        r.n_prompt = k ? 40 : n;
        r.max_tokens = 64;
        r.sampling.temp = 0;
        r.ignore_eos = true;
        r.top_logprobs = 2;
        static et_rec plain, got;
        et_alone(g_m, &r, &plain);
        pkv_engine_params ep = ngram_params(0, true, 4, PKV_DRAFT_ACCEPT_MATCH);
        pkv_engine *e = pkv_engine_create(g_m, ep);
        if (!e) {
            TH_FAIL("engine: %s", pkv_errmsg());
            return;
        }
        memset(&got, 0, sizeof got);
        r.on_event = et_on_event;
        r.user = &got;
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        et_same(&plain, &got, 1, k ? "random prompt alone" : "repetitive prompt alone", 0);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        fprintf(stderr, "  %-40s proposed %llu, accepted %llu, %llu steps for %d tokens\n",
                k ? "random prompt alone:" : "repetitive prompt alone:", (unsigned long long)st.draft_proposed,
                (unsigned long long)st.draft_accepted, (unsigned long long)st.steps, got.s[0].n);
        if (!k) {
            CHECK(st.draft_accepted > 0);
            CHECK(st.steps < 64); /* kept proposals save steps */
        }
        pkv_engine_free(e);
    }
}

/* Turns on a context (the second and third with last_pending) with n-gram drafts
 * against the same without: every turn's events and the context's tokens. */
static void chat(bool ngram, et_rec *turns, int32_t *toks, int64_t *n_tokens, pkv_engine_stats *st) {
    pkv_engine_params ep = et_params(256, 8, 0);
    ep.draft_ngram = ngram;
    ep.draft_max = 3;
    pkv_engine *e = pkv_engine_create(g_m, ep);
    pkv_context *ctx = e ? pkv_context_create(g_m, pkv_engine_cache(e), 200) : NULL;
    if (!ctx) {
        TH_FAIL("chat: %s", pkv_errmsg());
        pkv_engine_free(e);
        return;
    }
    uint64_t rs = 3;
    int32_t p0[PLEN];
    int n0 = repetitive(p0, &rs, 10, 3);
    int32_t prev = -1;
    for (int t = 0; t < 3; t++) {
        int32_t prompt[PLEN];
        int n = 0;
        if (t == 0) {
            memcpy(prompt, p0, (size_t)n0 * sizeof *prompt);
            n = n0;
        } else {
            if (t == 2) prompt[n++] = prev; /* turn 1 left it pending */
            for (int i = 0; i < 5; i++) prompt[n++] = p0[i];
        }
        pkv_request_params r = pkv_request_default_params();
        r.prompt = prompt;
        r.n_prompt = n;
        r.max_tokens = 20;
        r.ignore_eos = true;
        r.sampling.temp = t == 1 ? 0.9f : 0;
        r.sampling.seed = 41;
        r.last_pending = t == 1;
        r.context = ctx;
        r.on_event = et_on_event;
        r.user = &turns[t];
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        CHECK_INT(turns[t].s[0].status, PKV_OK);
        prev = turns[t].s[0].n ? turns[t].s[0].tok[turns[t].s[0].n - 1] : 0;
    }
    *n_tokens = pkv_context_n_tokens(ctx);
    if (*n_tokens <= 200) CHECK_OK(pkv_context_tokens(ctx, 0, *n_tokens, toks));
    pkv_engine_stats_get(e, st);
    pkv_context_free(ctx);
    pkv_engine_free(e);
}

static void check_context(void) {
    static et_rec plain[3], spec[3];
    static int32_t tp[200], ts[200];
    int64_t np = 0, ns = 0;
    pkv_engine_stats a, b;
    chat(false, plain, tp, &np, &a);
    chat(true, spec, ts, &ns, &b);
    int bad = 0;
    for (int t = 0; t < 3; t++) bad += !et_same(&plain[t], &spec[t], 1, "turn on a context", t);
    CHECK_INT(ns, np);
    CHECK_MEM(ts, tp, (size_t)PKV_MIN(np, 200) * sizeof(int32_t));
    fprintf(stderr, "  %-40s %d of 3 differ; proposed %llu, accepted %llu, %llu steps (plain %llu)\n",
            "turns on a context:", bad, (unsigned long long)b.draft_proposed, (unsigned long long)b.draft_accepted,
            (unsigned long long)b.steps, (unsigned long long)a.steps);
    CHECK(b.draft_accepted > 0);
}

/* logit_bias in the engine: request 0 bans the token plain greedy decoding gives
 * first and pushes another up; its events alone and batched with 5 others (with
 * and without n-gram drafts) are the same; the ban holds in every sample. */
static void check_bias(void) {
    uint64_t rs = 17;
    int32_t prompts[6][24];
    pkv_request_params rp[6];
    static et_rec alone[6], got[6];
    for (int i = 0; i < 6; i++) {
        for (int k = 0; k < 24; k++) prompts[i][k] = (int32_t)(et_rand(&rs) % 320);
        rp[i] = pkv_request_default_params();
        rp[i].prompt = prompts[i];
        rp[i].n_prompt = 10 + 2 * i;
        rp[i].max_tokens = 24;
        rp[i].ignore_eos = true;
        rp[i].sampling.temp = i % 2 ? 0.8f : 0;
        rp[i].sampling.seed = 5 + (uint64_t)i;
        rp[i].top_logprobs = 2;
    }
    et_alone(g_m, &rp[0], &alone[0]);
    const int32_t first = alone[0].s[0].tok[0];
    pkv_logit_bias bias[3] = {{first, -INFINITY}, {(first + 1) % 320, 2.5f}, {(first + 7) % 320, -100.0f}};
    rp[0].sampling.logit_bias = bias;
    rp[0].sampling.n_logit_bias = 3;
    rp[3].sampling.logit_bias = bias; /* a seeded one too */
    rp[3].sampling.n_logit_bias = 3;
    rp[4].n = 3;
    rp[4].sampling.temp = 1.5f;
    rp[4].sampling.logit_bias = bias;
    rp[4].sampling.n_logit_bias = 3;
    for (int i = 0; i < 6; i++) et_alone(g_m, &rp[i], &alone[i]);
    CHECK(alone[0].s[0].tok[0] != first);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < rp[i].n; j++)
            for (int t = 0; rp[i].sampling.n_logit_bias && t < alone[i].s[j].n; t++)
                if (alone[i].s[j].tok[t] == first) TH_FAIL("request %d sample %d: banned token %d at %d", i, j, first, t);
    for (int ng = 0; ng < 3; ng++) { /* plain, n-gram drafts (MATCH), n-gram drafts (SAMPLING: greedy ones equal) */
        pkv_engine_params ep = et_params(256, 8, 0);
        ep.draft_ngram = ng > 0;
        ep.draft_accept = ng == 2 ? PKV_DRAFT_ACCEPT_SAMPLING : PKV_DRAFT_ACCEPT_MATCH;
        pkv_engine *e = pkv_engine_create(g_m, ep);
        if (!e) {
            TH_FAIL("engine: %s", pkv_errmsg());
            return;
        }
        for (int i = 0; i < 6; i++) {
            memset(&got[i], 0, sizeof got[i]);
            pkv_request_params r = rp[i];
            r.on_event = et_on_event;
            r.user = &got[i];
            CHECK_OK(pkv_engine_submit(e, &r, NULL));
        }
        bias[0].token = 0; /* the engine copied the list at submit */
        et_drain(e);
        bias[0].token = first;
        static const char *const what[3] = {"logit_bias, batched", "logit_bias, batched, n-gram drafts",
                                            "logit_bias, batched, n-gram drafts, sampling rule"};
        for (int i = 0; i < 6; i++)
            if (ng < 2 || rp[i].sampling.temp == 0) et_same(&alone[i], &got[i], rp[i].n, what[ng], i);
        for (int i = 0; ng == 2 && i < 6; i++) /* the seeded ones: the ban holds under the rule's draws */
            for (int j = 0; j < rp[i].n; j++)
                for (int t = 0; rp[i].sampling.n_logit_bias && t < got[i].s[j].n; t++)
                    if (got[i].s[j].tok[t] == first) TH_FAIL("sampling rule: request %d: banned token %d", i, first);
        pkv_engine_free(e);
    }
    /* +100 forces: every token is the pushed one */
    pkv_logit_bias force = {123, 100.0f};
    pkv_request_params r = rp[1];
    r.sampling.logit_bias = &force;
    r.sampling.n_logit_bias = 1;
    static et_rec forced;
    et_alone(g_m, &r, &forced);
    CHECK_INT(forced.s[0].n, 24);
    for (int t = 0; t < forced.s[0].n; t++) CHECK_INT(forced.s[0].tok[t], 123);
    /* refused at submit: a token outside the vocabulary, a NaN bias */
    pkv_engine *e = pkv_engine_create(g_m, et_params(256, 8, 0));
    pkv_logit_bias bad = {320, 1.0f};
    r.sampling.logit_bias = &bad;
    CHECK(pkv_engine_submit(e, &r, NULL) == PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "logit_bias entry 0 has token 320") != NULL);
    bad = (pkv_logit_bias){3, NAN};
    CHECK(pkv_engine_submit(e, &r, NULL) == PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "logit_bias entry 0 (token 3)") != NULL);
    pkv_engine_free(e);
}

static void check_bad_params(void) {
    pkv_engine_params ep = et_params(256, 8, 0);
    ep.draft_ngram = true;
    ep.ngram_min = 5;
    ep.ngram_max = 3;
    CHECK(!pkv_engine_create(g_m, ep));
    CHECK(strstr(pkv_errmsg(), "ngram_min 5 and ngram_max 3") != NULL);
    ep.ngram_min = 0;
    ep.ngram_max = PKV_ENGINE_MAX_NGRAM + 1;
    CHECK(!pkv_engine_create(g_m, ep));
    CHECK(strstr(pkv_errmsg(), "ngram_max") != NULL);
    ep.ngram_max = 0;
    ep.draft = g_m;
    CHECK(!pkv_engine_create(g_m, ep));
    CHECK(strstr(pkv_errmsg(), "draft_ngram and draft are exclusive") != NULL);
}

/* The CLI: run --spec ngram prints what plain greedy run prints and logs rounds
 * that propose; bench spec --spec ngram --workload edit reports its figures with
 * the greedy outputs identical; the combinations it refuses. */
static void check_cli(void) {
    char f[512], log[512];
    snprintf(f, sizeof f, "%s", th_tmp("ngram.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("ngram-rounds.jsonl"));
    int rc = th_cli("", true, "mkmodel --seed 3 -o '%s'", f);
    if (rc == -1) {
        printf("note: no CLI (PKV_CLI unset): run/bench spec --spec ngram not checked\n");
        return;
    }
    CHECK_INT(rc, 0);
    static char plain[sizeof th_out];
    const char *p = "-p 'one two three four one two three four one two three four one two' -n 48 --temp 0";
    CHECK_INT(th_cli("", false, "run -m '%s' %s", f, p), 0);
    memcpy(plain, th_out, sizeof plain);
    CHECK_INT(th_cli("", false, "run -m '%s' %s --spec ngram --draft-max 6 --spec-log '%s'", f, p, log), 0);
    th_checks++;
    if (strcmp(th_out, plain)) TH_FAIL("run --spec ngram printed '%s', plain run '%s'", th_out, plain);
    static char rounds[1 << 16];
    th_read_text(log, rounds, sizeof rounds);
    CHECK(strstr(rounds, "\"proposed\": [") != NULL && strstr(rounds, "\"accepted\": 1") != NULL);
    CHECK_INT(th_cli("", false, "bench spec -m '%s' --spec ngram --workload edit --prompt-tokens 64 -n 64 --reps 1 --json", f),
              0);
    HAS("\"draft_kind\": \"ngram\"");
    HAS("\"workload\": \"edit\"");
    HAS("\"greedy_match\": true");
    CHECK(strstr(th_out, "\"acceptance_rate\": 0.0000") == NULL);
    CHECK_INT(th_cli("", true, "run -m '%s' -p hi --spec ngram --fork 2", f), 2);
    HAS("--fork cannot be combined");
    CHECK_INT(th_cli("", true, "run -m '%s' -p hi --spec trigram", f), 2);
    CHECK_INT(th_cli("", true, "bench spec --spec ngram --draft '%s'", f), 2);
    HAS("--spec ngram needs no draft model");
    unlink(f);
    unlink(log);
}

int main(void) {
    g_m = et_model("llama", PKV_TYPE_Q8_0, 1);
    if (!g_m) return th_done();
    fprintf(stderr, "n-gram drafts against plain decoding:\n");
    check_alone();
    check_workload();
    check_context();
    fprintf(stderr, "logit_bias in the engine:\n");
    check_bias();
    check_bad_params();
    check_cli();
    pkv_model_free(g_m);
    return th_done();
}
