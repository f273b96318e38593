// labels: kv engine timeout=300
/* The engine's embedding requests (pkv_request_params.embed, issue 45 item 4),
 * content-checked against the plain context API: a context that keeps its hidden
 * states (pkv_context_keep_hidden) decodes each prompt alone, and the test pools
 * those rows itself (none, mean, cls, last, and rank: the classification head's
 * rows over the last token, softmaxed on qwen3). Several requests of every pooling,
 * some longer than a step, run batched and chunked together, twice (the second
 * time with their pages in the prefix cache), and preempted by dropping for a
 * generation of higher priority (recomputed: the same vectors). The model reads ARCH.pooling_type
 * and cls.output as mkmodel --pooling writes them; the refusals name the field. */
#include <math.h>

#include "engine-testlib.h"

typedef struct got {
    float v[80 * 64];
    int n;
    int finals;
    pkv_finish_reason fin;
} got;

static bool on_ev(const pkv_engine_event *ev, void *user) {
    got *g = user;
    if (ev->finish == PKV_FINISH_NONE) return true;
    g->finals++;
    g->fin = ev->finish;
    g->n = ev->n_embd;
    if (ev->embd && ev->n_embd <= 80 * 64) memcpy(g->v, ev->embd, (size_t)ev->n_embd * sizeof(float));
    return false;
}

static pkv_model *model(const char *arch, const char *pooling, uint64_t seed) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 320;
    p.seed = seed;
    p.pooling = pooling;
    return et_load_made(&p, "embed-test", false);
}

/* The reference: prompt decoded alone on a context keeping hidden states, pooled here. */
static int reference(pkv_engine *e, const int32_t *tok, int n, pkv_pooling pool, float *out) {
    pkv_model *m = pkv_engine_model(e);
    pkv_model_info mi;
    pkv_model_get_info(m, &mi);
    int E = mi.n_embd;
    pkv_context *ctx = pkv_context_create(m, pkv_engine_cache(e), 0);
    if (!ctx || pkv_context_keep_hidden(ctx) || pkv_context_decode(ctx, tok, n)) {
        TH_FAIL("reference: %s", pkv_errmsg());
        pkv_context_free(ctx);
        return 0;
    }
    int k = 0;
    if (pool == PKV_POOLING_NONE) {
        for (int t = 0; t < n; t++) memcpy(out + (size_t)t * E, pkv_context_hidden(ctx, t), (size_t)E * sizeof(float));
        k = n * E;
    } else if (pool == PKV_POOLING_MEAN) {
        for (int j = 0; j < E; j++) {
            double s = 0;
            for (int t = 0; t < n; t++) s += pkv_context_hidden(ctx, t)[j];
            out[j] = (float)(s / n);
        }
        k = E;
    } else if (pool == PKV_POOLING_CLS || pool == PKV_POOLING_LAST) {
        memcpy(out, pkv_context_hidden(ctx, pool == PKV_POOLING_CLS ? 0 : n - 1), (size_t)E * sizeof(float));
        k = E;
    } else { /* qwen3's rank: the head over the last token, then a softmax; the head's rows are
                checked through their effect: p(yes) + p(no) = 1 and the logit gap below */
        k = -1;
    }
    pkv_context_free(ctx);
    return k;
}

static double max_err(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_poolings(void) {
    pkv_model *m = model("qwen3", "rank", 11);
    if (!m) return;
    pkv_model_info mi;
    pkv_model_get_info(m, &mi);
    CHECK_INT(mi.pooling, PKV_POOLING_RANK);
    CHECK_INT(mi.n_cls_out, 2);
    pkv_engine_params ep = et_params(256, 16, 256);
    ep.max_batch_tokens = 24; /* prompts longer than a step are chunked */
    pkv_engine *e = pkv_engine_create(m, ep);
    if (!e) {
        TH_FAIL("engine: %s", pkv_errmsg());
        pkv_model_free(m);
        return;
    }
    enum { NP = 4, NK = 5 };
    static int32_t prompts[NP][80];
    const int lens[NP] = {3, 40, 17, 71};
    for (int i = 0; i < NP; i++)
        for (int t = 0; t < lens[i]; t++) prompts[i][t] = (int32_t)((i * 37 + t * 11 + (t > 20 ? 0 : i)) % 300 + 1);
    static got g[2][NP][NK];
    static float ref[80 * 64];
    for (int round = 0; round < 2; round++) { /* the second round finds the pages in the prefix cache */
        for (int i = 0; i < NP; i++)
            for (int k = 0; k < NK; k++) {
                pkv_request_params r = pkv_request_default_params();
                r.prompt = prompts[i];
                r.n_prompt = lens[i];
                r.embed = true;
                r.pooling = (pkv_pooling)k;
                r.on_event = on_ev;
                r.user = &g[round][i][k];
                CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_OK);
            }
        et_drain(e);
    }
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < NK; k++) {
            got *a = &g[0][i][k], *b = &g[1][i][k];
            CHECK_INT(a->finals, 1);
            CHECK_INT(a->fin, PKV_FINISH_LENGTH);
            CHECK_INT(a->n, k == PKV_POOLING_NONE ? lens[i] * 64 : k == PKV_POOLING_RANK ? 2 : 64);
            CHECK(a->n == b->n && !memcmp(a->v, b->v, (size_t)a->n * sizeof(float))); /* batch and cache invariant */
            int nr = reference(e, prompts[i], lens[i], (pkv_pooling)k, ref);
            if (nr > 0) {
                double err = max_err(a->v, ref, nr);
                CHECK(err < 1e-4);
                if (err >= 1e-4) fprintf(stderr, "  prompt %d pooling %d: max error %g\n", i, k, err);
            }
            if (k == PKV_POOLING_RANK) {
                CHECK(fabs(a->v[0] + a->v[1] - 1.0) < 1e-6);
                CHECK(a->v[0] > 0 && a->v[0] < 1);
            }
        }
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK(st.prefix_hit_tokens > 0); /* last and rank took prefix matches in round 2 */
    pkv_engine_free(e);
    pkv_model_free(m);
}

/* Embedding requests preempted by dropping (no swap) for a higher-priority
 * generation: recomputed from their first token, they give the same vectors. */
static void test_preempt(void) {
    pkv_model *m = model("llama", "mean", 13);
    if (!m) return;
    pkv_engine_params ep = et_params(256, 16, 8);
    ep.max_batch_tokens = 24;
    ep.swap = false;
    pkv_engine *e = pkv_engine_create(m, ep);
    if (!e) {
        TH_FAIL("engine: %s", pkv_errmsg());
        pkv_model_free(m);
        return;
    }
    static int32_t tok[2][71], gen[60];
    for (int t = 0; t < 71; t++) tok[0][t] = (int32_t)(t * 7 % 300 + 1), tok[1][t] = (int32_t)(t * 13 % 300 + 2);
    for (int t = 0; t < 60; t++) gen[t] = (int32_t)(t * 3 % 300 + 5);
    static got g[2][2];
    for (int k = 0; k < 2; k++) { /* mean and none */
        for (int i = 0; i < 2; i++) {
            pkv_request_params r = pkv_request_default_params();
            r.prompt = tok[i];
            r.n_prompt = 71;
            r.embed = true;
            r.pooling = k ? PKV_POOLING_NONE : PKV_POOLING_MEAN;
            r.on_event = on_ev;
            r.user = &g[k][i];
            CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_OK);
        }
        CHECK_INT(pkv_engine_step(e, NULL), PKV_OK); /* both admitted, a chunk computed */
        pkv_request_params r = pkv_request_default_params();
        r.prompt = gen;
        r.n_prompt = 60;
        r.max_tokens = 60;
        r.priority = 10;
        r.sampling.temp = 0;
        CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_OK);
        et_drain(e);
    }
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    CHECK(st.preemptions_recompute > 0);
    static float ref[71 * 64];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 2; i++) {
            CHECK_INT(g[k][i].finals, 1);
            int nr = reference(e, tok[i], 71, k ? PKV_POOLING_NONE : PKV_POOLING_MEAN, ref);
            CHECK_INT(g[k][i].n, nr);
            if (nr > 0 && g[k][i].n == nr) CHECK(max_err(g[k][i].v, ref, nr) < 1e-4);
        }
    pkv_engine_free(e);
    pkv_model_free(m);
}

static void test_refusals(void) {
    pkv_model *m = model("llama", NULL, 12);
    if (!m) return;
    pkv_model_info mi;
    pkv_model_get_info(m, &mi);
    CHECK_INT(mi.pooling, -1);
    CHECK_INT(mi.n_cls_out, 0);
    pkv_engine *e = pkv_engine_create(m, et_params(64, 16, 64));
    if (!e) {
        pkv_model_free(m);
        return;
    }
    int32_t tok[70] = {1, 2, 3};
    got g;
    memset(&g, 0, sizeof g);
    struct {
        const char *field;
        int what;
    } cases[] = {{"pooling RANK needs a classification head", 0}, {"n must be 1", 1}, {"max_tokens must be 0", 2},
                 {"more than the context limit", 3}, {"not a pkv_pooling value", 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pkv_request_params r = pkv_request_default_params();
        r.prompt = tok;
        r.n_prompt = 3;
        r.embed = true;
        r.pooling = PKV_POOLING_MEAN;
        r.on_event = on_ev;
        r.user = &g;
        if (cases[c].what == 0) r.pooling = PKV_POOLING_RANK;
        if (cases[c].what == 1) r.n = 2;
        if (cases[c].what == 2) r.max_tokens = 4;
        if (cases[c].what == 3) r.n_prompt = 70;
        if (cases[c].what == 4) r.pooling = (pkv_pooling)9;
        CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_ERR_INVALID);
        CHECK(strstr(pkv_errmsg(), cases[c].field) != NULL);
    }
    CHECK_INT(g.finals, 0);
    /* the prompt may fill the context: 64 tokens in a 64-token context */
    for (int i = 0; i < 64; i++) tok[i] = (int32_t)(i + 1);
    pkv_request_params r = pkv_request_default_params();
    r.prompt = tok;
    r.n_prompt = 64;
    r.embed = true;
    r.pooling = PKV_POOLING_MEAN;
    r.on_event = on_ev;
    r.user = &g;
    CHECK_INT(pkv_engine_submit(e, &r, NULL), PKV_OK);
    et_drain(e);
    CHECK_INT(g.finals, 1);
    CHECK_INT(g.n, mi.n_embd);
    pkv_engine_free(e);
    pkv_model_free(m);
}

int main(void) {
    test_poolings();
    test_refusals();
    test_preempt();
    printf("test-engine-embed: %ld checks, %d failures\n", th_checks, th_failures);
    return th_failures ? 1 : 0;
}
