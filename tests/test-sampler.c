// labels: unit
/* Sampler chain: greedy and ties, each filter on hand-made logits (which tokens
 * survive, with what probability), the chain against a naive reference on random
 * logits, seed determinism, the empirical distribution against the softmax,
 * the speculative-sampling helpers (uniform, draw from weights), repetition penalty,
 * bad params and logits, no allocation after create, allocation failure and leaks. */
#include <float.h>

#include "base/base.h"
#include "engine/sampler.h"
#include "testhelp.h"

/* REQUIRE for void test functions. */

static pkv_sampler_params plain(void) { /* temp 1, every filter off */
    pkv_sampler_params p = pkv_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    return p;
}

/* probs of the chain; expect[i] > 0 marks survivors with their expected probability. */
static void check_probs(pkv_sampler_params p, const float *logits, int n, const double *expect, double tol,
                        const char *what) {
    pkv_sampler *s = pkv_sampler_create(p, n);
    th_checks++;
    if (!s) {
        TH_FAIL("%s: create: %s", what, pkv_errmsg());
        return;
    }
    float probs[64];
    CHECK_OK(pkv_sampler_probs(s, logits, probs));
    double sum = 0;
    for (int i = 0; i < n; i++) {
        sum += probs[i];
        th_checks++;
        if ((expect[i] == 0) != (probs[i] == 0) || fabs(probs[i] - expect[i]) > tol)
            TH_FAIL("%s: token %d: prob %.7g, want %.7g", what, i, (double)probs[i], expect[i]);
    }
    CHECK_NEAR(sum, 1.0, 1e-6);
    pkv_sampler_free(s);
}

/* Expected probabilities: softmax of logits/temp over the tokens in keep (1/0). */
static void softmax_over(const float *logits, int n, double temp, const int *keep, double *out) {
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        if (keep[i] && logits[i] > m) m = logits[i];
    for (int i = 0; i < n; i++) {
        out[i] = keep[i] ? exp(((double)logits[i] - m) / temp) : 0.0;
        z += out[i];
    }
    for (int i = 0; i < n; i++) out[i] /= z;
}

static void test_defaults(void) {
    pkv_sampler_params p = pkv_sampler_default_params();
    CHECK_NEAR(p.temp, 0.8, 1e-7);
    CHECK_INT(p.top_k, 40);
    CHECK_NEAR(p.top_p, 0.95, 1e-7);
    CHECK_NEAR(p.min_p, 0.05, 1e-7);
    CHECK_NEAR(p.repeat_penalty, 1.0, 0);
    CHECK_INT(p.repeat_last_n, 64);
    CHECK_INT(p.seed, 0);
}

static void test_greedy(void) {
    float l[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 3.0f};
    pkv_sampler_params p = pkv_sampler_default_params();
    for (int k = 0; k < 2; k++) {
        p.temp = k ? -1.0f : 0.0f;
        pkv_sampler *s = pkv_sampler_create(p, 6);
        REQUIRE_VOID(s);
        int32_t tok = -1;
        for (int r = 0; r < 5; r++) {
            CHECK_OK(pkv_sampler_sample(s, l, &tok));
            CHECK_INT(tok, 1); /* first of the tied maxima */
        }
        float probs[6];
        CHECK_OK(pkv_sampler_probs(s, l, probs));
        for (int i = 0; i < 6; i++) CHECK_NEAR(probs[i], i == 1 ? 1.0 : 0.0, 0);
        pkv_sampler_free(s);
    }
    /* argmax on random rows, including a maximum at the last index */
    uint64_t rs = 7;
    float row[1000];
    pkv_sampler *s = pkv_sampler_create((pkv_sampler_params){.temp = 0, .top_p = 1, .repeat_penalty = 1}, 1000);
    REQUIRE_VOID(s);
    for (int r = 0; r < 50; r++) {
        int want = 0;
        for (int i = 0; i < 1000; i++) {
            row[i] = th_randf(&rs) * 10;
            if (row[i] > row[want]) want = i;
        }
        if (r == 0) {
            row[999] = 100;
            want = 999;
        }
        int32_t tok;
        CHECK_OK(pkv_sampler_sample(s, row, &tok));
        CHECK_INT(tok, want);
    }
    pkv_sampler_free(s);
}

static void test_temperature(void) {
    float l[5] = {1.0f, 2.0f, 0.0f, -1.0f, 0.5f};
    int all[5] = {1, 1, 1, 1, 1};
    double e[5];
    for (int k = 0; k < 4; k++) {
        double t = (double[]){1.0, 2.0, 0.5, 0.05}[k];
        pkv_sampler_params p = plain();
        p.temp = (float)t;
        softmax_over(l, 5, (double)p.temp, all, e);
        check_probs(p, l, 5, e, 1e-6, "temperature");
    }
    /* a tiny temperature does not overflow: the maximum takes all the mass */
    pkv_sampler_params p = plain();
    p.temp = 1e-30f;
    double one[5] = {0, 1, 0, 0, 0};
    check_probs(p, l, 5, one, 0, "tiny temperature");
}

static void test_top_k(void) {
    float l[7] = {1, 5, 3, 5, 2, 0, 4};
    double e[7];
    pkv_sampler_params p = plain();
    p.top_k = 3;
    softmax_over(l, 7, 1.0, (int[]){0, 1, 0, 1, 0, 0, 1}, e);
    check_probs(p, l, 7, e, 1e-6, "top_k 3");
    p.top_k = 1;
    softmax_over(l, 7, 1.0, (int[]){0, 1, 0, 0, 0, 0, 0}, e); /* tie: the lower id */
    check_probs(p, l, 7, e, 0, "top_k 1");
    /* ties at the boundary keep the lower ids */
    float t[5] = {3, 1, 3, 3, 0};
    p.top_k = 2;
    softmax_over(t, 5, 1.0, (int[]){1, 0, 1, 0, 0}, e);
    check_probs(p, t, 5, e, 1e-6, "top_k ties");
    /* k >= n_vocab keeps everything */
    p.top_k = 7;
    softmax_over(l, 7, 1.0, (int[]){1, 1, 1, 1, 1, 1, 1}, e);
    check_probs(p, l, 7, e, 1e-6, "top_k 7");
    p.top_k = 100;
    check_probs(p, l, 7, e, 1e-6, "top_k 100");
    /* temperature applies before top-k: survivors then carry softmax(l/2) */
    p.top_k = 3;
    p.temp = 2.0f;
    softmax_over(l, 7, 2.0, (int[]){0, 1, 0, 1, 0, 0, 1}, e);
    check_probs(p, l, 7, e, 1e-6, "top_k 3 temp 2");
}

/* logits = log(q) so that at temp 1 the probabilities are exactly q. */
static const double Q[5] = {0.05, 0.4, 0.1, 0.3, 0.15}; /* order: 1, 3, 4, 2, 0 */

static void q_logits(float *l) {
    for (int i = 0; i < 5; i++) l[i] = (float)log(Q[i]);
}

static void test_top_p(void) {
    float l[5];
    q_logits(l);
    double e[5];
    pkv_sampler_params p = plain();
    struct {
        float top_p;
        int keep[5];
    } cases[] = {
        {0.35f, {0, 1, 0, 0, 0}}, /* the top token alone already reaches p */
        {0.05f, {0, 1, 0, 0, 0}}, /* at least one token */
        {0.69f, {0, 1, 0, 1, 0}}, {0.71f, {0, 1, 0, 1, 1}}, {0.84f, {0, 1, 0, 1, 1}},
        {0.86f, {0, 1, 1, 1, 1}}, {0.94f, {0, 1, 1, 1, 1}}, {0.96f, {1, 1, 1, 1, 1}},
        {1.0f, {1, 1, 1, 1, 1}},
    };
    for (size_t c = 0; c < PKV_ARRAY_LEN(cases); c++) {
        p.top_p = cases[c].top_p;
        softmax_over(l, 5, 1.0, cases[c].keep, e);
        char what[64];
        snprintf(what, sizeof what, "top_p %.2f", (double)p.top_p);
        check_probs(p, l, 5, e, 1e-6, what);
    }
    /* an exact boundary: four equal logits, p = 0.5 needs exactly two (the lower ids) */
    float eq[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    p.top_p = 0.5f;
    double half[4] = {0.5, 0.5, 0, 0};
    check_probs(p, eq, 4, half, 0, "top_p 0.5 on equal logits");
    p.top_p = 1.0f;
    p.min_p = 1.0f; /* every maximum has p = p_max */
    double quarter[4] = {0.25, 0.25, 0.25, 0.25};
    check_probs(p, eq, 4, quarter, 0, "min_p 1 on equal logits");
    p.min_p = 0.0f;
    /* the same on a row long enough for the bucketed top-p path: 4096 equal logits and
     * 4096 whose weights underflow to 0; p = 0.25 needs exactly the first 1024 (sums of
     * ones are exact) */
    {
        enum { LONG = 8192 };
        static float row[LONG], pr[LONG];
        for (int i = 0; i < LONG; i++) row[i] = i % 2 ? 1.0f : -1000.0f;
        pkv_sampler_params q = plain();
        q.top_p = 0.25f;
        pkv_sampler *s = pkv_sampler_create(q, LONG);
        REQUIRE_VOID(s);
        CHECK_OK(pkv_sampler_probs(s, row, pr));
        int kept = 0, wrong = 0;
        for (int i = 0; i < LONG; i++) {
            bool want = i % 2 == 1 && i < 2048;
            kept += pr[i] > 0;
            wrong += want != (pr[i] > 0) || (want && pr[i] != 1.0f / 1024);
        }
        CHECK_INT(kept, 1024);
        CHECK_INT(wrong, 0);
        pkv_sampler_free(s);
    }
    /* top-p renormalizes over the top-k survivors: {1, 3} become 4/7 and 3/7, so
     * p = 0.55 keeps only token 1, while without top-k it keeps {1, 3}. */
    p.top_p = 0.55f;
    p.top_k = 2;
    softmax_over(l, 5, 1.0, (int[]){0, 1, 0, 0, 0}, e);
    check_probs(p, l, 5, e, 1e-6, "top_k 2 top_p 0.55");
    p.top_k = 0;
    softmax_over(l, 5, 1.0, (int[]){0, 1, 0, 1, 0}, e);
    check_probs(p, l, 5, e, 1e-6, "top_p 0.55");
    /* temperature 2 flattens: sqrt(q) normalized = .098 .277 .139 .240 .170 (ids 0..4);
     * p = 0.6 needs 1, 3, 4 (.277 + .240 = .517 < .6) */
    p.temp = 2.0f;
    p.top_p = 0.6f;
    softmax_over(l, 5, 2.0, (int[]){0, 1, 0, 1, 1}, e);
    check_probs(p, l, 5, e, 1e-6, "top_p 0.6 temp 2");
}

static void test_min_p(void) {
    float l[5];
    q_logits(l);
    double e[5];
    pkv_sampler_params p = plain();
    struct {
        float min_p;
        int keep[5];
    } cases[] = {
        {0.3f, {0, 1, 0, 1, 1}},  /* p >= 0.12 */
        {0.5f, {0, 1, 0, 1, 0}},  /* p >= 0.2 */
        {0.76f, {0, 1, 0, 0, 0}}, /* p >= 0.304 */
        {1.0f, {0, 1, 0, 0, 0}},  /* only the maximum */
        {0.2f, {0, 1, 1, 1, 1}},  /* p >= 0.08 */
        {0.1f, {1, 1, 1, 1, 1}},  /* p >= 0.04 */
    };
    for (size_t c = 0; c < PKV_ARRAY_LEN(cases); c++) {
        p.min_p = cases[c].min_p;
        softmax_over(l, 5, 1.0, cases[c].keep, e);
        char what[64];
        snprintf(what, sizeof what, "min_p %.2f", (double)p.min_p);
        check_probs(p, l, 5, e, 1e-6, what);
    }
    /* with top-p: the intersection of both prefixes */
    p.top_p = 0.96f; /* keeps all */
    p.min_p = 0.3f;
    softmax_over(l, 5, 1.0, (int[]){0, 1, 0, 1, 1}, e);
    check_probs(p, l, 5, e, 1e-6, "min_p 0.3 top_p 0.96");
    p.top_p = 0.69f; /* keeps {1, 3} */
    p.min_p = 0.2f;  /* keeps {1, 3, 4, 2} */
    softmax_over(l, 5, 1.0, (int[]){0, 1, 0, 1, 0}, e);
    check_probs(p, l, 5, e, 1e-6, "min_p 0.2 top_p 0.69");
    /* min-p after temperature: at temp 2, p ∝ sqrt(q) = .224 .632 .316 .548 .387;
     * 0.45 * max keeps sqrt(q) >= 0.285 */
    p.top_p = 1.0f;
    p.temp = 2.0f;
    p.min_p = 0.45f;
    softmax_over(l, 5, 2.0, (int[]){0, 1, 1, 1, 1}, e);
    check_probs(p, l, 5, e, 1e-6, "min_p 0.5 temp 2");
}

/* ------------------------------------------- naive reference of the chain */

static const double *g_sort_key;
static int cmp_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_sort_key[i] != g_sort_key[j]) return g_sort_key[i] > g_sort_key[j] ? -1 : 1;
    return i - j;
}

/* Applies the chain literally: full sort, each filter on renormalized probabilities. */
static void naive_chain(pkv_sampler_params p, const float *logits, int n, const int32_t *hist, int n_hist,
                        double *out) {
    double *l = malloc(sizeof(double) * (size_t)n), *pr = malloc(sizeof(double) * (size_t)n);
    int *idx = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) l[i] = logits[i];
    int from = n_hist > p.repeat_last_n ? n_hist - p.repeat_last_n : 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = from; j < n_hist; j++) seen += hist[j] == i;
        if (seen) { /* repetition penalty, then presence + count x frequency, in float */
            float v = logits[i];
            if (p.repeat_penalty != 1.0f) v = v > 0 ? v / p.repeat_penalty : v * p.repeat_penalty;
            v -= p.presence_penalty + (float)seen * p.frequency_penalty;
            l[i] = (double)v;
        }
    }
    for (int i = 0; i < n; i++) {
        idx[i] = i;
        l[i] = (double)(float)l[i];
    }
    g_sort_key = l;
    qsort(idx, (size_t)n, sizeof *idx, cmp_desc);
    int nk = n;
    if (p.temp <= 0) nk = 1;
    if (p.temp > 0 && p.top_k > 0 && p.top_k < n) nk = p.top_k;
    double t = p.temp > 0 ? p.temp : 1.0, z = 0;
    for (int j = 0; j < nk; j++) z += (pr[j] = exp((l[idx[j]] - l[idx[0]]) / t));
    for (int j = 0; j < nk; j++) pr[j] /= z;
    if (p.temp > 0 && p.top_p < 1) {
        double cum = 0;
        for (int j = 0; j < nk; j++) {
            cum += pr[j];
            if (cum >= p.top_p) {
                nk = j + 1;
                break;
            }
        }
    }
    if (p.temp > 0 && p.min_p > 0) {
        int m = 0;
        while (m < nk && pr[m] >= p.min_p * pr[0]) m++;
        nk = m;
    }
    z = 0;
    for (int j = 0; j < nk; j++) z += pr[j];
    for (int i = 0; i < n; i++) out[i] = 0;
    for (int j = 0; j < nk; j++) out[idx[j]] = pr[j] / z;
    free(l);
    free(pr);
    free(idx);
}

static void test_against_naive(void) {
    uint64_t rs = 1234;
    enum { N = 300, BIG = 150000 };
    static float logits[BIG], probs[BIG];
    static double want[BIG];
    int32_t hist[100];
    int bad = 0;
    for (int it = 0; it < 400; it++) {
        /* small rows (plain sort), rows past the top-p bucketing threshold, one large */
        int n = it < 340 ? 1 + (int)(th_rand(&rs) % N)
                : it < 399 ? 2048 + (int)(th_rand(&rs) % 20000)
                           : BIG;
        /* coarse values so that ties happen */
        int levels = 1 + (int)(th_rand(&rs) % (it < 340 ? 40 : 4000));
        for (int i = 0; i < n; i++) logits[i] = (float)((int)(th_rand(&rs) % (uint64_t)levels) - levels / 2) * 0.37f;
        pkv_sampler_params p = plain();
        p.temp = (th_rand(&rs) % 8 == 0) ? 0.0f : 0.2f + (float)(th_rand(&rs) % 100) / 40.0f;
        p.top_k = th_rand(&rs) % 3 ? (int)(th_rand(&rs) % 60) : 0;
        if (n >= 2048 && it % 2) p.top_k = 0; /* the bucketed top-p path */
        p.top_p = th_rand(&rs) % 3 ? 0.05f + (float)(th_rand(&rs) % 1000) / 1053.0f : 1.0f;
        p.min_p = th_rand(&rs) % 3 ? (float)(th_rand(&rs) % 1000) / 3011.0f : 0.0f;
        p.repeat_penalty = th_rand(&rs) % 2 ? 1.0f : 0.5f + (float)(th_rand(&rs) % 100) / 50.0f;
        p.repeat_last_n = (int)(th_rand(&rs) % 20);
        p.presence_penalty = th_rand(&rs) % 2 ? 0.0f : (float)(th_rand(&rs) % 100) / 40.0f - 0.5f;
        p.frequency_penalty = th_rand(&rs) % 2 ? 0.0f : (float)(th_rand(&rs) % 100) / 60.0f - 0.3f;
        int n_hist = (int)(th_rand(&rs) % 100);
        for (int j = 0; j < n_hist; j++) hist[j] = (int32_t)(th_rand(&rs) % (uint64_t)n);
        pkv_sampler *s = pkv_sampler_create(p, n);
        REQUIRE_VOID(s);
        for (int j = 0; j < n_hist; j++) pkv_sampler_accept(s, hist[j]);
        CHECK_OK(pkv_sampler_probs(s, logits, probs));
        naive_chain(p, logits, n, hist, n_hist, want);
        for (int i = 0; i < n; i++) {
            float wf = (float)want[i]; /* probs are floats: tiny ones underflow alike */
            if ((wf == 0) != (probs[i] == 0) || fabs(probs[i] - want[i]) > 1e-5) {
                if (bad++ < 5)
                    TH_FAIL("iter %d (n %d temp %g k %d p %g min_p %g pen %g last %d): token %d: %g vs %g", it, n,
                            (double)p.temp, p.top_k, (double)p.top_p, (double)p.min_p,
                            (double)p.repeat_penalty, p.repeat_last_n, i, (double)probs[i], want[i]);
                break;
            }
        }
        /* the sampled token is one of the survivors */
        int32_t tok = -1;
        CHECK_OK(pkv_sampler_sample(s, logits, &tok));
        CHECK(tok >= 0 && tok < n && want[tok] > 0);
        pkv_sampler_free(s);
    }
    th_checks++;
}

/* ------------------------------------------------------------ draws */

static void draws(pkv_sampler *s, const float *l, int n, int32_t *out) {
    for (int i = 0; i < n; i++) CHECK_OK(pkv_sampler_sample(s, l, &out[i]));
}

static void test_determinism(void) {
    enum { V = 50, D = 1000 };
    float l[V];
    uint64_t rs = 99;
    for (int i = 0; i < V; i++) l[i] = th_randf(&rs) * 3;
    pkv_sampler_params p = pkv_sampler_default_params();
    p.top_k = 0;
    p.min_p = 0;
    p.seed = 42;
    static int32_t a[D], b[D], c[D];
    pkv_sampler *s1 = pkv_sampler_create(p, V), *s2 = pkv_sampler_create(p, V);
    p.seed = 43;
    pkv_sampler *s3 = pkv_sampler_create(p, V);
    REQUIRE_VOID(s1 && s2 && s3);
    draws(s1, l, D, a);
    draws(s2, l, D, b);
    draws(s3, l, D, c);
    CHECK_MEM(a, b, sizeof a);
    int differ = 0, distinct = 0;
    for (int i = 0; i < D; i++) differ += a[i] != c[i];
    for (int t = 0; t < V; t++)
        for (int i = 0; i < D; i++)
            if (a[i] == t) {
                distinct++;
                break;
            }
    CHECK(differ > D / 2);
    fprintf(stderr, "determinism: %d of %d draws differ between seeds, %d distinct tokens\n", differ, D, distinct);
    CHECK(distinct > 10); /* it does sample, not always the same token */
    /* reset restarts the stream; errors do not advance it */
    pkv_sampler_reset(s1);
    float badl[V];
    memcpy(badl, l, sizeof l);
    badl[7] = NAN;
    for (int i = 0; i < D; i++) {
        int32_t tok = -5;
        if (i % 100 == 3) CHECK_STATUS(pkv_sampler_sample(s1, badl, &tok), PKV_ERR_INVALID);
        CHECK_INT(tok, -5);
        CHECK_OK(pkv_sampler_sample(s1, l, &tok));
        if (tok != a[i]) {
            TH_FAIL("after reset: draw %d: %d vs %d", i, (int)tok, (int)a[i]);
            break;
        }
    }
    /* probs does not advance the PRNG */
    pkv_sampler_reset(s2);
    float pr[V];
    for (int i = 0; i < 20; i++) {
        int32_t tok;
        CHECK_OK(pkv_sampler_probs(s2, l, pr));
        CHECK_OK(pkv_sampler_sample(s2, l, &tok));
        CHECK_INT(tok, a[i]);
    }
    /* The same seed gives the same tokens on every machine: a golden sequence. */
    float g[8] = {0, 0.5f, 1, -1, 2, 0.3f, -0.5f, 1.5f};
    pkv_sampler *sg = pkv_sampler_create(
        (pkv_sampler_params){.temp = 1, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .seed = 12345}, 8);
    REQUIRE_VOID(sg);
    int32_t got[16];
    draws(sg, g, 16, got);
    static const int32_t golden[16] = {6, 1, 7, 0, 4, 0, 2, 4, 4, 7, 7, 4, 7, 7, 2, 7};
    CHECK_MEM(got, golden, sizeof golden);
    pkv_sampler_free(sg);
    pkv_sampler_free(s1);
    pkv_sampler_free(s2);
    pkv_sampler_free(s3);
}

/* Pearson's chi-square of counts against probabilities. */
static double chi_square(const long *count, const double *prob, int n, long total) {
    double x = 0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)total;
        if (e > 0) x += ((double)count[i] - e) * ((double)count[i] - e) / e;
    }
    return x;
}

static void test_distribution(void) {
    enum { V = 8, DRAWS = 200000 };
    float l[V] = {0, 0.5f, 1, -1, 2, 0.3f, -0.5f, 1.5f};
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    double e[V];
    softmax_over(l, V, 1.0, all, e);
    for (int seed = 0; seed < 2; seed++) {
        pkv_sampler_params p = plain();
        p.seed = (uint64_t)seed * 0x1234567ull;
        pkv_sampler *s = pkv_sampler_create(p, V);
        REQUIRE_VOID(s);
        long count[V] = {0};
        for (int i = 0; i < DRAWS; i++) {
            int32_t tok;
            pkv_sampler_sample(s, l, &tok);
            count[tok]++;
        }
        /* 7 degrees of freedom: P(chi2 > 29.9) = 1e-4 */
        double x = chi_square(count, e, V, DRAWS);
        fprintf(stderr, "chi-square (7 dof), seed %d: %.2f\n", seed, x);
        CHECK(x < 29.9);
        pkv_sampler_free(s);
    }
    /* with top-k 3 at temp 0.7, only the three best appear, in softmax(l/0.7) proportions */
    pkv_sampler_params p = plain();
    p.top_k = 3;
    p.temp = 0.7f;
    int keep[V] = {0, 0, 1, 0, 1, 0, 0, 1};
    softmax_over(l, V, 0.7, keep, e);
    pkv_sampler *s = pkv_sampler_create(p, V);
    REQUIRE_VOID(s);
    long count[V] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t tok;
        pkv_sampler_sample(s, l, &tok);
        count[tok]++;
    }
    for (int i = 0; i < V; i++)
        if (!keep[i]) CHECK_INT(count[i], 0);
    double x = chi_square(count, e, V, DRAWS); /* 2 dof: P(chi2 > 18.4) = 1e-4 */
    fprintf(stderr, "chi-square (2 dof), top-k 3: %.2f\n", x);
    CHECK(x < 18.4);
    pkv_sampler_free(s);
}

/* The speculative-sampling helpers: uniform numbers and draws from explicit weights. */
static void test_draw(void) {
    enum { V = 6, DRAWS = 200000 };
    pkv_sampler *s = pkv_sampler_create(plain(), V);
    REQUIRE_VOID(s);
    float w[V] = {0.5f, 0, 2.0f, 1.0f, 0, 0.25f}; /* unnormalized */
    double e[V];
    for (int i = 0; i < V; i++) e[i] = w[i] / 3.75;
    long count[V] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t tok = -1;
        pkv_sampler_draw(s, w, &tok);
        if (tok >= 0 && tok < V) count[tok]++;
    }
    CHECK_INT(count[0] + count[1] + count[2] + count[3] + count[4] + count[5], DRAWS);
    CHECK_INT(count[1], 0);
    CHECK_INT(count[4], 0);
    double x = chi_square(count, e, V, DRAWS); /* 3 dof: P(chi2 > 21.1) = 1e-4 */
    fprintf(stderr, "chi-square (3 dof), draw: %.2f\n", x);
    CHECK(x < 21.1);
    /* uniform: in [0, 1), mean 1/2, variance 1/12 */
    double sum = 0, sq = 0, lo = 1, hi = 0;
    for (int i = 0; i < DRAWS; i++) {
        double u = pkv_sampler_uniform(s);
        sum += u, sq += u * u;
        lo = fmin(lo, u), hi = fmax(hi, u);
    }
    CHECK(lo >= 0 && hi < 1);
    CHECK_NEAR(sum / DRAWS, 0.5, 0.005);
    CHECK_NEAR(sq / DRAWS - (sum / DRAWS) * (sum / DRAWS), 1.0 / 12, 0.002);
    /* both come from the seeded stream: reset replays them */
    pkv_sampler_reset(s);
    double u1 = pkv_sampler_uniform(s);
    int32_t t1;
    CHECK_OK(pkv_sampler_draw(s, w, &t1));
    pkv_sampler_reset(s);
    CHECK_NEAR(pkv_sampler_uniform(s), u1, 0);
    int32_t t2;
    CHECK_OK(pkv_sampler_draw(s, w, &t2));
    CHECK_INT(t1, t2);
    /* a single non-zero weight, at the end */
    float one[V] = {0, 0, 0, 0, 0, 3};
    for (int i = 0; i < 100; i++) {
        CHECK_OK(pkv_sampler_draw(s, one, &t1));
        CHECK_INT(t1, 5);
    }
    /* bad weights */
    float bad[V] = {0, 0, 0, 0, 0, 0};
    t1 = -7;
    CHECK_STATUS(pkv_sampler_draw(s, bad, &t1), PKV_ERR_INVALID);
    CHECK_MSG("all 6 weights are zero");
    bad[2] = -1;
    CHECK_STATUS(pkv_sampler_draw(s, bad, &t1), PKV_ERR_INVALID);
    CHECK_MSG("index 2");
    bad[2] = NAN;
    CHECK_STATUS(pkv_sampler_draw(s, bad, &t1), PKV_ERR_INVALID);
    bad[2] = INFINITY;
    CHECK_STATUS(pkv_sampler_draw(s, bad, &t1), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_sampler_draw(s, NULL, &t1), PKV_ERR_INVALID);
    CHECK_INT(t1, -7);
    pkv_sampler_free(s);
}

static void test_penalty(void) {
    float l[4] = {2.0f, -1.0f, 1.0f, 0.5f};
    pkv_sampler_params p = plain();
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 3;
    pkv_sampler *s = pkv_sampler_create(p, 4);
    REQUIRE_VOID(s);
    float pr[4];
    double e[4];
    int all[4] = {1, 1, 1, 1};
    /* token 0 twice: penalized once (2 / 2 = 1); token 1: -1 * 2 = -2; out-of-range ignored */
    pkv_sampler_accept(s, 0);
    pkv_sampler_accept(s, 1);
    pkv_sampler_accept(s, 0);
    CHECK_OK(pkv_sampler_probs(s, l, pr));
    float pen[4] = {1.0f, -2.0f, 1.0f, 0.5f};
    softmax_over(pen, 4, 1.0, all, e);
    for (int i = 0; i < 4; i++) CHECK_NEAR(pr[i], e[i], 1e-6);
    /* only the last 3 count: history 1, 0, 99, 2 -> tokens 0 and 2 */
    pkv_sampler_accept(s, 99);
    pkv_sampler_accept(s, 2);
    CHECK_OK(pkv_sampler_probs(s, l, pr));
    float pen2[4] = {1.0f, -1.0f, 0.5f, 0.5f};
    softmax_over(pen2, 4, 1.0, all, e);
    for (int i = 0; i < 4; i++) CHECK_NEAR(pr[i], e[i], 1e-6);
    /* the caller's logits are untouched */
    CHECK_NEAR(l[0], 2.0, 0);
    CHECK_NEAR(l[2], 1.0, 0);
    /* reset forgets the history */
    pkv_sampler_reset(s);
    CHECK_OK(pkv_sampler_probs(s, l, pr));
    softmax_over(l, 4, 1.0, all, e);
    for (int i = 0; i < 4; i++) CHECK_NEAR(pr[i], e[i], 1e-6);
    pkv_sampler_free(s);

    /* greedy with a penalty: token 0 drops to 2 / 3 and token 2 wins */
    p.temp = 0;
    p.repeat_penalty = 3.0f;
    s = pkv_sampler_create(p, 4);
    REQUIRE_VOID(s);
    int32_t tok;
    CHECK_OK(pkv_sampler_sample(s, l, &tok));
    CHECK_INT(tok, 0);
    pkv_sampler_accept(s, 0);
    CHECK_OK(pkv_sampler_sample(s, l, &tok));
    CHECK_INT(tok, 2);
    pkv_sampler_free(s);

    /* repeat_last_n 0 and penalty 1 are off */
    p.repeat_last_n = 0;
    s = pkv_sampler_create(p, 4);
    REQUIRE_VOID(s);
    pkv_sampler_accept(s, 0);
    CHECK_OK(pkv_sampler_sample(s, l, &tok));
    CHECK_INT(tok, 0);
    pkv_sampler_free(s);
    p.repeat_last_n = 8;
    p.repeat_penalty = 1.0f;
    s = pkv_sampler_create(p, 4);
    REQUIRE_VOID(s);
    pkv_sampler_accept(s, 0);
    CHECK_OK(pkv_sampler_sample(s, l, &tok));
    CHECK_INT(tok, 0);
    pkv_sampler_free(s);
    /* a penalty below 1 that would overflow float stays finite */
    float huge[2] = {FLT_MAX, 0};
    p.repeat_penalty = 0.5f;
    p.temp = 1;
    s = pkv_sampler_create(p, 2);
    REQUIRE_VOID(s);
    pkv_sampler_accept(s, 0);
    CHECK_OK(pkv_sampler_probs(s, huge, pr));
    CHECK_NEAR(pr[0], 1.0, 0);
    CHECK_NEAR(pr[1], 0.0, 0);
    pkv_sampler_free(s);
}

/* logit_bias (step 0): the probabilities are the softmax of the biased logits; a
 * -inf ban is never drawn (greedy, top-k wider than the allowed tokens, top-p,
 * penalties) and a +100 bias wins every draw; entries for one token add up; the
 * list is copied; bad entries are refused naming them. */
static void test_logit_bias(void) {
    float l[6] = {3.0f, 1.0f, 0.5f, -1.0f, 2.0f, 0.0f};
    pkv_logit_bias b[3] = {{4, -1.5f}, {1, 0.75f}, {1, 0.25f}};
    pkv_sampler_params p = plain();
    p.logit_bias = b;
    p.n_logit_bias = 3;
    float biased[6] = {3.0f, 2.0f, 0.5f, -1.0f, 0.5f, 0.0f};
    double e[6];
    int all[6] = {1, 1, 1, 1, 1, 1};
    softmax_over(biased, 6, 1.0, all, e);
    check_probs(p, l, 6, e, 1e-6, "logit_bias");

    pkv_logit_bias ban[2] = {{0, -INFINITY}, {4, -INFINITY}};
    for (int k = 0; k < 6; k++) { /* greedy, plain, top-k 5 (more than allowed), top-p, min-p, penalties */
        pkv_sampler_params q = plain();
        q.temp = k == 0 ? 0.0f : 1.5f;
        if (k == 2) q.top_k = 5;
        if (k == 3) q.top_p = 0.9f;
        if (k == 4) q.min_p = 0.01f;
        if (k == 5) q.repeat_penalty = 1.5f, q.presence_penalty = 1.0f;
        q.logit_bias = ban;
        q.n_logit_bias = 2;
        q.seed = (uint64_t)k;
        pkv_sampler *s = pkv_sampler_create(q, 6);
        REQUIRE_VOID(s);
        ban[0].token = 3; /* copied at create: this changes nothing */
        for (int i = 0; i < 400; i++) {
            int32_t tok = -1;
            CHECK_OK(pkv_sampler_sample(s, l, &tok));
            if (tok == 0 || tok == 4) {
                TH_FAIL("variant %d draw %d: banned token %d", k, i, tok);
                break;
            }
            pkv_sampler_accept(s, tok);
        }
        ban[0].token = 0;
        float pr[6];
        CHECK_OK(pkv_sampler_probs(s, l, pr));
        CHECK(pr[0] == 0 && pr[4] == 0);
        pkv_sampler_free(s);
    }
    pkv_logit_bias force = {3, 100.0f};
    pkv_sampler_params q = pkv_sampler_default_params();
    q.temp = 1.0f;
    q.logit_bias = &force;
    q.n_logit_bias = 1;
    pkv_sampler *s = pkv_sampler_create(q, 6);
    REQUIRE_VOID(s);
    for (int i = 0; i < 200; i++) {
        int32_t tok = -1;
        CHECK_OK(pkv_sampler_sample(s, l, &tok));
        CHECK_INT(tok, 3);
    }
    pkv_sampler_free(s);

    /* refused: token outside the vocabulary, negative, NaN or +inf bias, too many, NULL list, all banned */
    int64_t live = pkv_alloc_live();
    pkv_logit_bias bad = {6, 1.0f};
    q.logit_bias = &bad;
    CHECK(pkv_sampler_create(q, 6) == NULL);
    CHECK_MSG("logit_bias entry 0 has token 6, outside the vocabulary [0, 6)");
    bad.token = -1;
    CHECK(pkv_sampler_create(q, 6) == NULL);
    CHECK_MSG("logit_bias entry 0 has token -1");
    bad = (pkv_logit_bias){2, NAN};
    CHECK(pkv_sampler_create(q, 6) == NULL);
    CHECK_MSG("logit_bias entry 0 (token 2) has bias nan");
    bad.bias = INFINITY;
    CHECK(pkv_sampler_create(q, 6) == NULL);
    CHECK_MSG("(token 2) has bias inf");
    q.n_logit_bias = PKV_SAMPLER_MAX_LOGIT_BIAS + 1;
    CHECK(pkv_sampler_create(q, 6) == NULL);
    CHECK_MSG("logit_bias has 65537 entries");
    q.logit_bias = NULL;
    q.n_logit_bias = 1;
    CHECK(pkv_sampler_create(q, 6) == NULL);
    CHECK_MSG("but is NULL");
    pkv_logit_bias every[7];
    for (int i = 0; i < 6; i++) every[i] = (pkv_logit_bias){i, -INFINITY};
    every[6] = (pkv_logit_bias){2, -INFINITY};
    q.logit_bias = every;
    q.n_logit_bias = 7;
    CHECK(pkv_sampler_create(q, 6) == NULL);
    CHECK_MSG("bans all 6 tokens");
    q.n_logit_bias = 6; /* 0..4 banned (2 twice): token 5 only */
    every[5] = every[6];
    s = pkv_sampler_create(q, 6);
    REQUIRE_VOID(s);
    int32_t tok = -1;
    CHECK_OK(pkv_sampler_sample(s, l, &tok));
    CHECK_INT(tok, 5);
    pkv_sampler_free(s);
    CHECK_INT(pkv_alloc_live(), live);
}

static void test_bad_input(void) {
    struct {
        pkv_sampler_params p;
        int32_t n_vocab;
        const char *msg;
    } bad[10];
    for (int i = 0; i < 10; i++) {
        bad[i].p = pkv_sampler_default_params();
        bad[i].n_vocab = 10;
    }
    bad[0].p.top_k = -1, bad[0].msg = "top_k";
    bad[1].p.top_p = 0, bad[1].msg = "top_p";
    bad[2].p.top_p = 1.01f, bad[2].msg = "top_p";
    bad[3].p.min_p = -0.1f, bad[3].msg = "min_p";
    bad[4].p.repeat_penalty = 0, bad[4].msg = "repeat_penalty";
    bad[5].p.repeat_last_n = -1, bad[5].msg = "repeat_last_n";
    bad[6].p.temp = NAN, bad[6].msg = "temp";
    bad[7].n_vocab = 0, bad[7].msg = "n_vocab";
    bad[8].p.presence_penalty = INFINITY, bad[8].msg = "presence_penalty";
    bad[9].p.frequency_penalty = NAN, bad[9].msg = "frequency_penalty";
    int64_t live = pkv_alloc_live();
    for (int i = 0; i < 10; i++) {
        pkv_err_clear();
        pkv_sampler *s = pkv_sampler_create(bad[i].p, bad[i].n_vocab);
        CHECK(s == NULL);
        CHECK_MSG(bad[i].msg);
        pkv_sampler_free(s);
    }
    pkv_sampler_params nanp = pkv_sampler_default_params();
    nanp.top_p = NAN;
    CHECK(pkv_sampler_create(nanp, 10) == NULL);
    CHECK_MSG("top_p");
    CHECK_INT(pkv_alloc_live(), live);

    pkv_sampler *s = pkv_sampler_create(pkv_sampler_default_params(), 10);
    REQUIRE_VOID(s);
    float l[10] = {0}, pr[10];
    int32_t tok = -3;
    l[3] = INFINITY;
    CHECK_STATUS(pkv_sampler_sample(s, l, &tok), PKV_ERR_INVALID);
    CHECK_MSG("index 3");
    CHECK_INT(tok, -3);
    l[3] = 0;
    l[9] = -INFINITY;
    for (int i = 0; i < 10; i++) pr[i] = 7;
    CHECK_STATUS(pkv_sampler_probs(s, l, pr), PKV_ERR_INVALID);
    CHECK_MSG("index 9");
    CHECK_NEAR(pr[0], 7, 0); /* not written */
    l[9] = NAN;
    CHECK_STATUS(pkv_sampler_sample(s, l, &tok), PKV_ERR_INVALID);
    CHECK_MSG("NaN");
    CHECK_STATUS(pkv_sampler_sample(NULL, l, &tok), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_sampler_sample(s, NULL, &tok), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_sampler_sample(s, l, NULL), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_sampler_probs(s, l, NULL), PKV_ERR_INVALID);
    pkv_sampler_accept(NULL, 1);
    pkv_sampler_reset(NULL);
    pkv_sampler_free(NULL);
    pkv_sampler_free(s);
}

static void test_alloc(void) {
    enum { V = 5000 };
    static float l[V], pr[V];
    uint64_t rs = 5;
    for (int i = 0; i < V; i++) l[i] = th_randf(&rs) * 5;
    int64_t live = pkv_alloc_live();
    pkv_sampler_params p = pkv_sampler_default_params();
    pkv_alloc_fail_at(0);
    pkv_sampler *s = pkv_sampler_create(p, V);
    uint64_t n_allocs = pkv_alloc_fail_at(0);
    REQUIRE_VOID(s);
    CHECK(n_allocs >= 1);
    /* sampling, probs, accept and reset never allocate, whatever the filters */
    for (int k = 0; k < 4; k++) {
        pkv_sampler_params q = p;
        q.top_k = k & 1 ? 0 : 40;
        q.min_p = k & 2 ? 0 : 0.05f;
        q.repeat_penalty = 1.3f;
        pkv_sampler *t = pkv_sampler_create(q, V);
        REQUIRE_VOID(t);
        pkv_alloc_fail_at(0);
        for (int i = 0; i < 50; i++) {
            int32_t tok;
            CHECK_OK(pkv_sampler_sample(t, l, &tok));
            pkv_sampler_accept(t, tok);
            CHECK_OK(pkv_sampler_probs(t, l, pr));
        }
        pkv_sampler_reset(t);
        CHECK_INT(pkv_alloc_fail_at(0), 0);
        pkv_sampler_free(t);
    }
    pkv_sampler_free(s);
    CHECK_INT(pkv_alloc_live(), live);
    /* each allocation of create failing in turn: NULL, NOMEM message, nothing leaked */
    for (uint64_t f = 1; f <= n_allocs; f++) {
        pkv_alloc_fail_at(f);
        s = pkv_sampler_create(p, V);
        pkv_alloc_fail_at(0);
        CHECK(s == NULL);
        CHECK_MSG("out of memory");
        CHECK_INT(pkv_alloc_live(), live);
        pkv_sampler_free(s);
    }
}

int main(void) {
    test_defaults();
    test_greedy();
    test_temperature();
    test_top_k();
    test_top_p();
    test_min_p();
    test_against_naive();
    test_determinism();
    test_distribution();
    test_draw();
    test_penalty();
    test_logit_bias();
    test_bad_input();
    test_alloc();
    return th_done();
}
