// labels: multi timeout=300
/* Speculative decoding. Greedy speculative output equals plain greedy output
 * token for token (and the target's KV and logits afterwards are bitwise those
 * of plain decoding) for own-cache drafts on cpu and cpu:1 and for shared-KV
 * drafts; with sampling the same seed gives the same tokens and the first two
 * tokens follow the target's distribution (chi-square on a 16-token vocabulary);
 * a shared-KV draft naming a missing layer or placed on another device than the
 * target's KV fails at creation with the I6 message, and `pagekv run` exits 1
 * with it before generating anything. `pagekv run --tokens --ids-out --spec-log` on a
 * qwen35 (recurrent) target: ids equal plain greedy, the log's rounds account for
 * them. */
#include <math.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "testhelp.h"

static char g_target[512], g_tiny[512];

/* Write a model; with draft_of a draft of that target. */
static bool write_model(const char *path, const char *draft_of, int n_layer, const int32_t *kv, uint64_t seed, bool tiny) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.type = PKV_TYPE_F32;
    p.n_layer = n_layer;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 320;
    p.seed = seed;
    if (tiny) { /* a 16-token vocabulary for distribution checks */
        p.n_embd = 32;
        p.n_head = 2;
        p.n_head_kv = 1;
        p.n_ff = 64;
        p.n_vocab = 16;
        p.no_vocab = true;
    }
    p.draft_of = draft_of;
    p.shared_kv_layers = kv;
    pkv_status s = pkv_mkmodel_write(&p, path);
    if (s) TH_FAIL("mkmodel %s: %s", path, pkv_errmsg());
    return s == PKV_OK;
}

static pkv_model *load(const char *path, const char *dev, pkv_device *handle) {
    pkv_model_params mp = pkv_model_default_params();
    mp.device = dev;
    mp.device_handle = handle;
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load(path, mp);
    if (!m) TH_FAIL("load %s: %s", path, pkv_errmsg());
    return m;
}

static pkv_kv_cache *cache(pkv_model *m) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    cp.n_seq_max = 4;
    cp.page_size = 8;
    return pkv_model_cache_create(m, cp);
}

typedef struct {
    int32_t t[512];
    int n;
} toklist;

static bool collect(int32_t tok, void *user) {
    toklist *l = user;
    if (l->n < 512) l->t[l->n++] = tok;
    return true;
}

enum { NP = 13, NG = 70 };
static const int32_t k_prompt[NP] = {256, 40, 41, 77, 90, 101, 33, 58, 120, 200, 7, 99, 150};

/* Plain greedy reference: tokens, then the end state (tokens in the cache, logits). */
typedef struct {
    toklist out;
    int64_t n_tokens;
    float logits[320];
    float after[10][320]; /* logits of 10 more plain greedy steps after generation */
} reference;

static void continue_greedy(pkv_context *ctx, const int32_t *last, float (*lg)[320]) {
    int32_t t = *last;
    for (int i = 0; i < 10; i++) {
        if (pkv_context_decode(ctx, &t, 1)) {
            TH_FAIL("continue: %s", pkv_errmsg());
            return;
        }
        memcpy(lg[i], pkv_context_logits(ctx), sizeof lg[i]);
        int b = 0;
        for (int k = 1; k < 320; k++)
            if (lg[i][k] > lg[i][b]) b = k;
        t = b;
    }
}

static void plain_greedy(pkv_model *m, pkv_sampler_params sp, reference *ref) {
    pkv_kv_cache *c = cache(m);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    pkv_sampler *smp = pkv_sampler_create(sp, 320);
    REQUIRE_VOID(ctx && smp);
    memset(ref, 0, sizeof *ref);
    CHECK_OK(pkv_context_decode(ctx, k_prompt, NP));
    int n = 0;
    CHECK_OK(pkv_generate(ctx, smp, NG, collect, &ref->out, &n));
    CHECK_INT(n, ref->out.n);
    ref->n_tokens = pkv_context_n_tokens(ctx);
    memcpy(ref->logits, pkv_context_logits(ctx), sizeof ref->logits);
    continue_greedy(ctx, &ref->out.t[ref->out.n - 1], ref->after);
    pkv_sampler_free(smp);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
}

/* Greedy speculative generation of the target on its own cache with `draft`:
 * the same tokens as plain greedy, the same end state, the same KV (plain steps
 * after it give bitwise the same logits). Returns the stats. */
static pkv_spec_stats spec_greedy(pkv_model *target, pkv_model *draft, int draft_max, pkv_sampler_params sp,
                                  const reference *ref, const char *what) {
    pkv_spec_stats st;
    memset(&st, 0, sizeof st);
    pkv_kv_cache *c = cache(target);
    pkv_context *ctx = c ? pkv_context_create(target, c, 0) : NULL;
    pkv_sampler *smp = pkv_sampler_create(sp, 320);
    if (!ctx || !smp) {
        TH_FAIL("%s: setup: %s", what, pkv_errmsg());
        return st;
    }
    CHECK_OK(pkv_context_decode(ctx, k_prompt, NP));
    pkv_spec_params p = pkv_spec_default_params();
    p.draft_max = draft_max;
    pkv_spec *s = pkv_spec_create(ctx, draft, p);
    if (!s) TH_FAIL("%s: spec_create: %s", what, pkv_errmsg());
    toklist out = {{0}, 0};
    if (s) CHECK_OK(pkv_spec_generate(s, smp, NG, collect, &out, &st));
    CHECK_INT(out.n, ref->out.n);
    CHECK_INT(st.n_tokens, out.n);
    int first_diff = -1;
    for (int i = 0; i < out.n && i < ref->out.n; i++)
        if (out.t[i] != ref->out.t[i]) {
            first_diff = i;
            break;
        }
    if (first_diff >= 0) TH_FAIL("%s (draft_max %d): token %d differs: %d, plain %d", what, draft_max, first_diff,
                                 out.t[first_diff], ref->out.t[first_diff]);
    CHECK_INT(pkv_context_n_tokens(ctx), ref->n_tokens);
    const float *lg = pkv_context_logits(ctx);
    CHECK(lg != NULL);
    if (lg) CHECK_MEM(lg, ref->logits, sizeof ref->logits);
    static float after[10][320];
    continue_greedy(ctx, &out.t[out.n - 1], after);
    CHECK_MEM(after, ref->after, sizeof after);
    CHECK(st.accepted <= st.drafted);
    CHECK(st.target_steps >= 1 && st.target_steps <= st.n_tokens);
    /* every round's tokens = accepted + 1 (the last round may stop early) */
    CHECK(st.n_tokens <= st.accepted + st.rounds && st.n_tokens >= st.accepted + st.rounds - 1);
    pkv_spec_free(s);
    pkv_sampler_free(smp);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    return st;
}

static void test_greedy(void) {
    char d_far[512], d_near[512], d_shared[512], d_shared1[512];
    snprintf(d_far, sizeof d_far, "%s", th_tmp("spec-far.gguf"));
    snprintf(d_near, sizeof d_near, "%s", th_tmp("spec-near.gguf"));
    snprintf(d_shared, sizeof d_shared, "%s", th_tmp("spec-shared.gguf"));
    snprintf(d_shared1, sizeof d_shared1, "%s", th_tmp("spec-shared1.gguf"));
    static const int32_t kv31[2] = {3, 1}, kv0[1] = {0};
    REQUIRE_VOID(write_model(d_far, g_target, 1, NULL, 99, false));  /* unrelated: few acceptances */
    REQUIRE_VOID(write_model(d_near, g_target, 3, NULL, 5, false));  /* the target's first 3 layers (same seed) */
    REQUIRE_VOID(write_model(d_shared, g_target, 2, kv31, 7, false));
    REQUIRE_VOID(write_model(d_shared1, g_target, 1, kv0, 5, false));

    pkv_model *t_cpu = load(g_target, "cpu", NULL);
    pkv_model *t_cpu1 = load(g_target, "cpu:1", NULL);
    REQUIRE_VOID(t_cpu && t_cpu1);
    pkv_device *cpu = pkv_model_device(t_cpu), *cpu1 = pkv_model_device(t_cpu1);
    pkv_sampler_params greedy = pkv_sampler_default_params();
    greedy.temp = 0;
    static reference ref, ref_pen;
    plain_greedy(t_cpu, greedy, &ref);
    CHECK(ref.out.n == NG); /* the test wants long outputs: no early end-of-generation */
    pkv_sampler_params pen = greedy;
    pen.repeat_penalty = 1.5f; /* the target's history includes the round's proposals, q's does not */
    plain_greedy(t_cpu, pen, &ref_pen);
    {
        /* the same greedy output on cpu:1 (the reference for targets there) */
        static reference r1;
        plain_greedy(t_cpu1, greedy, &r1);
        CHECK_MEM(r1.out.t, ref.out.t, sizeof ref.out.t);
    }

    /* own-cache drafts: on the target's device, on another device, target on cpu:1 */
    struct {
        const char *path;
        pkv_device *dev;
        pkv_model *target;
        const char *what;
    } own[] = {
        {d_far, cpu, t_cpu, "far draft on cpu (shared handle), target cpu"},
        {d_far, cpu1, t_cpu, "far draft on cpu:1, target cpu"},
        {d_near, cpu1, t_cpu, "near draft on cpu:1, target cpu"},
        {d_near, cpu, t_cpu1, "near draft on cpu, target cpu:1"},
        {g_target, cpu1, t_cpu, "the target itself as draft on cpu:1"},
    };
    for (size_t k = 0; k < PKV_ARRAY_LEN(own); k++) {
        pkv_model *d = load(own[k].path, NULL, own[k].dev);
        if (!d) continue;
        int maxes[3] = {1, 3, 8};
        for (int mi = 0; mi < 3; mi++) {
            pkv_spec_stats st = spec_greedy(own[k].target, d, maxes[mi], greedy, &ref, own[k].what);
            if (own[k].path == g_target) { /* a perfect draft: everything accepted, K + 1 tokens per step */
                CHECK_INT(st.accepted, st.drafted);
                CHECK(st.target_steps <= (NG + maxes[mi]) / (maxes[mi] + 1) + 1);
            }
        }
        pkv_spec_stats st = spec_greedy(own[k].target, d, 4, pen, &ref_pen, own[k].what);
        fprintf(stderr, "%s, repeat penalty: %lld of %lld accepted\n", own[k].what, (long long)st.accepted, (long long)st.drafted);
        if (own[k].path == d_near) CHECK(st.accepted > 0 && st.accepted < st.drafted); /* a mixed run */
        pkv_model_free(d);
    }

    /* shared-KV drafts on the target's device */
    const char *sh[2] = {d_shared, d_shared1};
    for (int k = 0; k < 2; k++) {
        pkv_model *d = load(sh[k], NULL, cpu);
        if (!d) continue;
        pkv_model_info di;
        CHECK_OK(pkv_model_get_info(d, &di));
        CHECK(di.shared_kv);
        for (int K = 1; K <= 6; K += 5) spec_greedy(t_cpu, d, K, greedy, &ref, "shared-KV draft");
        spec_greedy(t_cpu, d, 3, pen, &ref_pen, "shared-KV draft, repeat penalty");
        pkv_model_free(d);
    }

    /* a target split over cpu and cpu:1 (tensor parallelism, sharded KV): an
     * own-cache draft works as on one device; a shared-KV draft cannot reach
     * both shards (I6) */
    pkv_model_params sp = pkv_model_default_params();
    sp.devices = "cpu,cpu:1";
    sp.n_threads = 2;
    pkv_model *t_split = pkv_model_load(g_target, sp);
    if (!t_split) TH_FAIL("split target: %s", pkv_errmsg());
    if (t_split) {
        static reference ref_split;
        plain_greedy(t_split, greedy, &ref_split);
        pkv_model *d = load(d_far, NULL, pkv_model_device(t_split));
        if (d) {
            spec_greedy(t_split, d, 3, greedy, &ref_split, "far draft, target split over cpu and cpu:1");
            pkv_model_free(d);
        }
        d = load(d_shared, NULL, pkv_model_device(t_split));
        pkv_kv_cache *c = d ? cache(t_split) : NULL;
        pkv_context *ctx = c ? pkv_context_create(t_split, c, 0) : NULL;
        if (ctx) {
            CHECK(pkv_spec_create(ctx, d, pkv_spec_default_params()) == NULL);
            CHECK_MSG("draft layer 0 shares KV layer 3 heads");
            CHECK_MSG("place the draft on");
        }
        pkv_context_free(ctx);
        pkv_kv_cache_free(c);
        pkv_model_free(d);
        pkv_model_free(t_split);
    }
    pkv_model_free(t_cpu1);
    pkv_model_free(t_cpu);
}

/* A pool that runs out mid-generation: a recoverable status, the tokens emitted
 * so far are plain greedy's, the target stays usable. */
static void test_out_of_pages(void) {
    static const int32_t kv31[2] = {3, 1};
    char d_shared[512];
    snprintf(d_shared, sizeof d_shared, "%s", th_tmp("spec-shared-oop.gguf"));
    REQUIRE_VOID(write_model(d_shared, g_target, 2, kv31, 7, false));
    pkv_model *t = load(g_target, "cpu", NULL);
    REQUIRE_VOID(t);
    pkv_model *drafts[2] = {t, load(d_shared, NULL, pkv_model_device(t))};
    pkv_sampler_params greedy = pkv_sampler_default_params();
    greedy.temp = 0;
    static reference ref;
    plain_greedy(t, greedy, &ref);
    int64_t live = pkv_alloc_live();
    for (int k = 0; k < 2 && drafts[1]; k++) {
        pkv_cache_params cp = pkv_cache_default_params();
        cp.n_ctx = 256;
        cp.page_size = 8;
        cp.n_pages = 5; /* 40 tokens: the prompt and about 25 more */
        pkv_kv_cache *c = pkv_model_cache_create(t, cp);
        pkv_context *ctx = c ? pkv_context_create(t, c, 0) : NULL;
        pkv_sampler *smp = pkv_sampler_create(greedy, 320);
        REQUIRE_VOID(ctx && smp);
        CHECK_OK(pkv_context_decode(ctx, k_prompt, NP));
        pkv_spec *s = pkv_spec_create(ctx, drafts[k], pkv_spec_default_params());
        REQUIRE_VOID(s);
        toklist o = {{0}, 0};
        pkv_spec_stats st;
        CHECK_STATUS(pkv_spec_generate(s, smp, NG, collect, &o, &st), PKV_ERR_OUT_OF_PAGES);
        CHECK(o.n > 10 && o.n < NG);
        CHECK_MEM(o.t, ref.out.t, (size_t)o.n * sizeof(int32_t));
        int64_t n = pkv_context_n_tokens(ctx);
        CHECK_INT(n, NP + o.n - 1); /* as after pkv_generate: every emitted token but the last */
        const float *lg = pkv_context_logits(ctx); /* and the logits of its last token */
        CHECK(lg != NULL);
        if (lg) {
            int b = 0;
            for (int i = 1; i < 320; i++)
                if (lg[i] > lg[b]) b = i;
            CHECK_INT(b, o.t[o.n - 1]);
        }
        /* still usable: roll back, decode, continue */
        CHECK_OK(pkv_context_truncate(ctx, NP));
        CHECK_OK(pkv_context_decode(ctx, &ref.out.t[0], 1));
        CHECK_INT(pkv_context_n_tokens(ctx), NP + 1);
        pkv_spec_free(s);
        pkv_sampler_free(smp);
        pkv_context_free(ctx);
        pkv_kv_cache_free(c);
    }
    CHECK_INT(pkv_alloc_live(), live);
    pkv_model_free(drafts[1]);
    pkv_model_free(t);
}

/* On a Vulkan device (when there is one) the verification step batches K + 1
 * tokens where plain decoding runs one: kernels may round differently. Greedy
 * outputs must agree; a difference is accepted only at a near-tie of plain
 * decoding's top two logits (then the rest legitimately diverges), and reported. */
static void test_vulkan(void) {
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!v) {
        fprintf(stderr, "no vulkan:0 (%s): the Vulkan checks are skipped\n", pkv_errmsg());
        return;
    }
    enum { NV = 20 };
    static const int32_t kv31[2] = {3, 1};
    char d_shared[512], d_far[512];
    snprintf(d_shared, sizeof d_shared, "%s", th_tmp("spec-shared-vk.gguf"));
    snprintf(d_far, sizeof d_far, "%s", th_tmp("spec-far-vk.gguf"));
    pkv_model *t = write_model(d_shared, g_target, 2, kv31, 7, false) && write_model(d_far, g_target, 1, NULL, 99, false)
                       ? load(g_target, NULL, v)
                       : NULL;
    pkv_kv_cache *c = t ? cache(t) : NULL;
    pkv_context *ctx = c ? pkv_context_create(t, c, 0) : NULL;
    int32_t ref[NV];
    float gap[NV];
    if (ctx && !pkv_context_decode(ctx, k_prompt, NP)) {
        for (int i = 0; i < NV; i++) { /* plain greedy, one token per step, with the top-2 gap of each step */
            const float *lg = pkv_context_logits(ctx);
            int b = 0, b2 = -1;
            for (int k = 1; k < 320; k++)
                if (lg[k] > lg[b]) b = k;
            for (int k = 0; k < 320; k++)
                if (k != b && (b2 < 0 || lg[k] > lg[b2])) b2 = k;
            ref[i] = b;
            gap[i] = lg[b] - lg[b2];
            if (i + 1 < NV) CHECK_OK(pkv_context_decode(ctx, &ref[i], 1));
        }
        const char *paths[2] = {d_far, d_shared};
        for (int k = 0; k < 2; k++) {
            pkv_model *d = load(paths[k], NULL, v);
            pkv_context *sc = d ? pkv_context_create(t, c, 0) : NULL;
            pkv_sampler_params gp = pkv_sampler_default_params();
            gp.temp = 0;
            pkv_sampler *smp = pkv_sampler_create(gp, 320);
            pkv_spec_params p = pkv_spec_default_params();
            p.draft_max = 3;
            pkv_spec *s = sc && smp && !pkv_context_decode(sc, k_prompt, NP) ? pkv_spec_create(sc, d, p) : NULL;
            toklist o = {{0}, 0};
            if (!s) TH_FAIL("vulkan spec setup: %s", pkv_errmsg());
            else CHECK_OK(pkv_spec_generate(s, smp, NV, collect, &o, NULL));
            CHECK_INT(o.n, NV);
            for (int i = 0; i < o.n && i < NV; i++) {
                if (o.t[i] == ref[i]) continue;
                if (gap[i] < 1e-3f) fprintf(stderr, "vulkan: token %d flips at a near-tie (gap %g): accepted\n", i, (double)gap[i]);
                else TH_FAIL("vulkan, %s draft: token %d is %d, plain greedy %d (top-2 gap %g)", k ? "shared-KV" : "own-cache", i,
                             o.t[i], ref[i], (double)gap[i]);
                break;
            }
            fprintf(stderr, "vulkan, %s draft: %d greedy tokens checked against plain greedy\n", k ? "shared-KV" : "own-cache", o.n);
            pkv_spec_free(s);
            pkv_sampler_free(smp);
            pkv_context_free(sc);
            pkv_model_free(d);
        }
    }
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(t);
    pkv_device_close(v);
}

/* ---------------------------------------------------------------- sampling */

static void softmax(const float *l, double temp, double *p) {
    double mx = -1e300, sum = 0;
    for (int i = 0; i < 16; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < 16; i++) sum += p[i] = exp(((double)l[i] - mx) / temp);
    for (int i = 0; i < 16; i++) p[i] /= sum;
}

/* Pearson chi-square of counts against probabilities (bins with expectation
 * below 5 are merged into one). */
static double chi2(const int *cnt, const double *p, int n, int *df) {
    double x = 0, rest_e = 0, rest_o = 0;
    int bins = 0;
    for (int i = 0; i < 16; i++) {
        double e = p[i] * n;
        if (e < 5) {
            rest_e += e;
            rest_o += cnt[i];
            continue;
        }
        x += (cnt[i] - e) * (cnt[i] - e) / e;
        bins++;
    }
    if (rest_e > 0) {
        x += (rest_o - rest_e) * (rest_o - rest_e) / PKV_MAX(rest_e, 1e-9);
        bins++;
    }
    *df = bins - 1;
    return x;
}

static void test_sampling(void) {
    char d_far[512];
    snprintf(d_far, sizeof d_far, "%s", th_tmp("spec-tiny-draft.gguf"));
    REQUIRE_VOID(write_model(d_far, g_tiny, 1, NULL, 1234, true));
    pkv_model *t = load(g_tiny, "cpu", NULL);
    REQUIRE_VOID(t);
    pkv_model *drafts[2] = {load(d_far, NULL, pkv_model_device(t)), t};
    REQUIRE_VOID(drafts[0]);
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.temp = 1.5f;
    sp.top_k = 0;
    sp.top_p = 1;
    sp.min_p = 0;
    sp.seed = 4242;
    const int32_t prompt[3] = {1, 2, 3};

    /* the target's own distribution of token 1 and (marginally) token 2 */
    double p1[16], p2[16] = {0}, cond[16];
    pkv_kv_cache *c = cache(t);
    pkv_context *ref = c ? pkv_context_create(t, c, 0) : NULL;
    REQUIRE_VOID(ref);
    CHECK_OK(pkv_context_decode(ref, prompt, 3));
    softmax(pkv_context_logits(ref), sp.temp, p1);
    for (int a = 0; a < 16; a++) {
        pkv_context *f = pkv_context_fork(ref);
        int32_t tok = a;
        CHECK_OK(pkv_context_decode(f, &tok, 1));
        softmax(pkv_context_logits(f), sp.temp, cond);
        for (int b = 0; b < 16; b++) p2[b] += p1[a] * cond[b];
        pkv_context_free(f);
    }
    pkv_context_free(ref);

    for (int k = 0; k < 2; k++) {
        pkv_context *ctx = pkv_context_create(t, c, 0);
        pkv_sampler *smp = pkv_sampler_create(sp, 16);
        pkv_spec_params p = pkv_spec_default_params();
        p.draft_max = 2;
        pkv_spec *s = ctx ? pkv_spec_create(ctx, drafts[k], p) : NULL;
        REQUIRE_VOID(s && smp);
        CHECK_OK(pkv_context_decode(ctx, prompt, 3));

        /* the same seed gives the same tokens */
        toklist a = {{0}, 0}, b = {{0}, 0};
        CHECK_OK(pkv_spec_generate(s, smp, 30, collect, &a, NULL));
        CHECK_OK(pkv_context_truncate(ctx, 2));
        CHECK_OK(pkv_context_decode(ctx, &prompt[2], 1));
        pkv_sampler_reset(smp);
        CHECK_OK(pkv_spec_generate(s, smp, 30, collect, &b, NULL));
        CHECK_INT(a.n, 30);
        CHECK_MEM(a.t, b.t, sizeof a.t);

        /* N runs of 3 tokens from the prompt, one sampler stream */
        enum { N = 4000 };
        int c1[16] = {0}, c2[16] = {0};
        int64_t drafted = 0, accepted = 0;
        for (int r = 0; r < N; r++) {
            CHECK_OK(pkv_context_truncate(ctx, 2)); /* the draft follows by itself */
            CHECK_OK(pkv_context_decode(ctx, &prompt[2], 1));
            toklist o = {{0}, 0};
            pkv_spec_stats st;
            if (pkv_spec_generate(s, smp, 3, collect, &o, &st) || o.n != 3) {
                TH_FAIL("run %d: %s", r, pkv_errmsg());
                break;
            }
            c1[o.t[0]]++;
            c2[o.t[1]]++;
            drafted += st.drafted;
            accepted += st.accepted;
        }
        int df1, df2;
        double x1 = chi2(c1, p1, N, &df1), x2 = chi2(c2, p2, N, &df2);
        fprintf(stderr, "%s draft: acceptance %.3f, chi2 token 1 = %.1f (df %d), token 2 = %.1f (df %d)\n",
                k ? "perfect" : "unrelated", (double)accepted / (double)drafted, x1, df1, x2, df2);
        /* df <= 15: the 0.999 quantile is 37.7 */
        CHECK(x1 < 37.7);
        CHECK(x2 < 37.7);
        if (k == 1) CHECK_INT(accepted, drafted); /* q == p: every proposal is accepted */
        else CHECK(accepted > 0 && accepted < drafted);
        pkv_spec_free(s);
        pkv_sampler_free(smp);
        pkv_context_free(ctx);
    }
    pkv_kv_cache_free(c);
    pkv_model_free(drafts[0]);
    pkv_model_free(t);
}

/* ------------------------------------------------------------------ errors */

#define cli(...) th_cli("", __VA_ARGS__)
#define out th_out


static void test_errors(void) {
    char d_shared[512], d_missing[512], d_small[512];
    snprintf(d_shared, sizeof d_shared, "%s", th_tmp("spec-shared.gguf"));
    snprintf(d_missing, sizeof d_missing, "%s", th_tmp("spec-missing.gguf"));
    snprintf(d_small, sizeof d_small, "%s", th_tmp("spec-small.gguf"));
    static const int32_t kv17[2] = {1, 7};
    REQUIRE_VOID(write_model(d_missing, g_target, 2, kv17, 3, false));
    pkv_model *t = load(g_target, "cpu", NULL);
    REQUIRE_VOID(t);
    pkv_kv_cache *c = cache(t);
    pkv_context *ctx = c ? pkv_context_create(t, c, 0) : NULL;
    REQUIRE_VOID(ctx);
    CHECK_OK(pkv_context_decode(ctx, k_prompt, NP));
    pkv_spec_params p = pkv_spec_default_params();
    int64_t live = pkv_alloc_live();

    /* a layer the target does not have */
    pkv_model *d = load(d_missing, NULL, pkv_model_device(t));
    if (d) {
        CHECK(pkv_spec_create(ctx, d, p) == NULL);
        CHECK_MSG("draft layer 1 shares KV layer 7, but the cache has 4 layers");
        pkv_model_free(d);
    }
    /* the target's KV is stored on cpu, the draft computes on cpu:1 */
    d = load(d_shared, "cpu:1", NULL);
    if (d) {
        CHECK(pkv_spec_create(ctx, d, p) == NULL);
        CHECK_MSG("draft layer 0 shares KV layer 3, stored on cpu, but computes on cpu:1: place the draft on cpu");
        pkv_model_free(d);
    }
    /* another vocabulary */
    pkv_mkmodel_params mp = pkv_mkmodel_default_params();
    mp.n_vocab = 400;
    mp.n_embd = 64;
    if (!pkv_mkmodel_write(&mp, d_small) && (d = load(d_small, NULL, pkv_model_device(t)))) {
        CHECK(pkv_spec_create(ctx, d, p) == NULL);
        CHECK_MSG("vocabulary of 400 tokens, the target 320");
        p.draft_max = 65;
        CHECK(pkv_spec_create(ctx, t, p) == NULL);
        CHECK_MSG("draft_max 65 is outside 1..64");
        p.draft_max = 4;
        pkv_model_free(d);
    }
    /* allocation failures: NULL with nothing leaked, then success */
    for (uint64_t k = 1;; k++) {
        pkv_alloc_fail_at(k);
        pkv_spec *s = pkv_spec_create(ctx, t, p);
        pkv_alloc_fail_at(0);
        if (s) {
            pkv_spec_free(s);
            break;
        }
        CHECK_INT(pkv_alloc_live(), live);
        if (k > 200) {
            TH_FAIL("spec_create never succeeded");
            break;
        }
    }
    CHECK_INT(pkv_alloc_live(), live);
    /* bad arguments */
    CHECK(pkv_spec_create(NULL, t, p) == NULL);
    CHECK_STATUS(pkv_spec_generate(NULL, NULL, 3, NULL, NULL, NULL), PKV_ERR_INVALID);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(t);

    /* the command line: the I6 message and exit 1 before generating anything */
    if (!getenv("PKV_CLI")) {
        fprintf(stderr, "PKV_CLI not set: CLI checks skipped\n");
        return;
    }
    CHECK_INT(cli(true, "run -m %s --draft %s --draft-device cpu:1 -n 8 --temp 0", g_target, d_shared), 1);
    HAS("draft layer 0 shares KV layer 3, stored on cpu, but computes on cpu:1: place the draft on cpu");
    CHECK_INT(cli(false, "run -m %s --draft %s --draft-device cpu:1 -n 8 --temp 0", g_target, d_shared), 1);
    CHECK_INT((int)strlen(out), 0); /* nothing was generated (not even the prompt echoed) */
    CHECK_INT(cli(true, "run -m %s --draft %s -n 8", g_target, d_missing), 1);
    HAS("draft layer 1 shares KV layer 7, but the cache has 4 layers");
    CHECK_INT(cli(true, "mkmodel --shared-kv-layers 1,x -o %s", d_small), 2);
    HAS("--shared-kv-layers expects");
    CHECK_INT(cli(true, "mkmodel --shared-kv-layers 1 -o %s", d_small), 2);
    HAS("needs --draft-of");
    /* greedy run with a draft prints what plain greedy prints */
    static char plain[1 << 16];
    CHECK_INT(cli(false, "run -m %s -n 40 --temp 0", g_target), 0);
    snprintf(plain, sizeof plain, "%s", out);
    CHECK(strlen(plain) > 20);
    CHECK_INT(cli(false, "run -m %s -n 40 --temp 0 --draft %s --draft-max 3", g_target, d_shared), 0);
    CHECK(strcmp(out, plain) == 0);
    CHECK_INT(cli(false, "run -m %s -n 40 --temp 0 --draft %s --draft-device cpu:1", g_target, g_target), 0);
    CHECK(strcmp(out, plain) == 0);
    CHECK_INT(cli(true, "run -m %s -n 40 --temp 0 --draft %s", g_target, g_target), 0);
    HAS("accepted (100.0%)");
    /* bench spec (engine requests): the built-in model as its own draft accepts
     * everything; of 16 tokens at K = 4 the prefill step samples the first, and
     * the decoding's 15 are 5 + 5 + 5 in 3 target steps, by either rule */
    CHECK_INT(cli(false, "bench spec --json -n 16 --reps 1"), 0);
    HAS("\"accept\": \"sampling\"");
    HAS("\"acceptance_rate\": 1.0000");
    HAS("\"tokens_per_target_step\": 5.000");
    HAS("\"target_steps\": 3,");
    HAS("\"greedy_match\": true");
    CHECK_INT(cli(false, "bench spec --json -n 16 --reps 1 --accept match"), 0);
    HAS("\"accept\": \"match\"");
    HAS("\"acceptance_rate\": 1.0000");
    HAS("\"target_steps\": 3,");
    HAS("\"greedy_match\": true");
    CHECK_INT(cli(true, "bench spec --accept greedy"), 2);
    HAS("--accept takes match or sampling, got 'greedy'");
    CHECK_INT(cli(false, "bench spec -m %s --draft %s --json -n 24 --reps 1 --draft-max 2", g_target, d_shared), 0);
    HAS("\"draft_kind\": \"shared-kv\"");
    HAS("\"greedy_match\": true");
    CHECK_INT(cli(true, "bench spec -m %s --draft %s --draft-device cpu:1", g_target, d_shared), 1);
    HAS("place the draft on cpu");
}

/* Parse a JSON array of ints ("[1, 2]") into v; the count, or -1. */
static int parse_ids(const char *t, int32_t *v, int cap) {
    while (*t == ' ') t++;
    if (*t++ != '[') return -1;
    int n = 0;
    while (*t && *t != ']') {
        char *e;
        long x = strtol(t, &e, 10);
        if (e == t || n == cap) return -1;
        v[n++] = (int32_t)x;
        t = e;
        while (*t == ',' || *t == ' ') t++;
    }
    return *t == ']' ? n : -1;
}

/* `pagekv run --tokens --ids-out --spec-log` on a hybrid (qwen35) target with a
 * qwen35 draft: every round's rollback truncates the target's recurrent state back
 * to a checkpoint; the ids equal plain greedy decoding's, and the log's rounds
 * account for them: round r starts at the position of the last committed token,
 * and its accepted proposals are the next generated ids. */
/* The file's own MTP head as the draft (--mtp: fed the target's hidden states,
 * its own one-layer cache), on the target's device, on another one, with a split
 * target, and on vulkan:0 when there is one: ids equal plain greedy's. */
static void mtp_greedy(const char *mtp, const char *prompt, const char *ids_a, const char *ids_b, const char *log) {
    static char ta[8192], tb[8192], tl[1 << 16];
    int32_t a[64], b[64];
    int na = 0;
    pkv_device *vk = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (vk) pkv_device_close(vk);
    else printf("note: no vulkan:0 here; run --mtp on Vulkan not run\n");
    /* the target's devices, then the draft's (the head runs on the target's first
     * device unless --draft-device): one device, another device for the head, a
     * tensor-parallel target (cache sharded, and on the host), vulkan */
    const struct {
        const char *tgt, *dft;
        bool vulkan;
    } where[] = {
        {"", "", false},
        {"", "--draft-device cpu:1", false},
        {"--devices cpu,cpu:1", "", false},
        {"--devices cpu,cpu:1 --kv-on-host", "", false},
        {"-d vulkan:0", "", true},
        {"--devices cpu,vulkan:0", "", true},
    };
    for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
        if (where[w].vulkan && !vk) continue;
        CHECK_INT(th_cli("", true, "run -m '%s' %s -n 24 --temp 0 %s --ids-out '%s'", mtp, prompt, where[w].tgt, ids_a), 0);
        na = parse_ids(th_read_text(ids_a, ta, sizeof ta), a, 64);
        CHECK_INT(th_cli("", true, "run -m '%s' %s -n 24 --temp 0 --mtp --draft-max 3 %s %s --ids-out '%s' --spec-log '%s'",
                         mtp, prompt, where[w].tgt, where[w].dft, ids_b, log), 0);
        HAS("(its MTP head)");
        int nb = parse_ids(th_read_text(ids_b, tb, sizeof tb), b, 64);
        CHECK(na > 0);
        CHECK_INT(nb, na);
        for (int i = 0; i < na && i < nb; i++)
            if (a[i] != b[i]) {
                TH_FAIL("--mtp %s %s: id %d is %d, plain greedy %d", where[w].tgt, where[w].dft, i, b[i], a[i]);
                break;
            }
        CHECK(strstr(th_read_text(log, tl, sizeof tl), "\"proposed\": [") != NULL);
    }
}

static void test_cli_logs(void) {
    char tgt[512], dft[512], ids_a[512], ids_b[512], log[512];
    snprintf(tgt, sizeof tgt, "%s", th_tmp("spec-q35.gguf"));
    snprintf(dft, sizeof dft, "%s", th_tmp("spec-q35-draft.gguf"));
    snprintf(ids_a, sizeof ids_a, "%s", th_tmp("spec-ids-a.json"));
    snprintf(ids_b, sizeof ids_b, "%s", th_tmp("spec-ids-b.json"));
    snprintf(log, sizeof log, "%s", th_tmp("spec-log.jsonl"));
    CHECK_INT(th_cli("", true, "mkmodel --arch qwen35 --type f32 --layers 8 --dim 64 --vocab 320 --seed 21 -o '%s'", tgt), 0);
    CHECK_INT(th_cli("", true, "mkmodel --draft-of '%s' --layers 1 --seed 4 -o '%s'", tgt, dft), 0);
    const char *prompt = "--tokens 5,17,33,2,9,101,7";
    CHECK_INT(th_cli("", true, "run -m '%s' %s -n 24 --temp 0 --ids-out '%s'", tgt, prompt, ids_a), 0);
    static char ta[8192], tb[8192], tl[1 << 16];
    int32_t a[64], b[64];
    int na = parse_ids(th_read_text(ids_a, ta, sizeof ta), a, 64);
    CHECK(na > 0 && na <= 24);
    /* the target as its own draft (every proposal accepted) and a random one-layer
     * draft (rejections: the target's state is rolled back every round) */
    for (int w = 0; w < 2; w++) {
        CHECK_INT(th_cli("", true, "run -m '%s' %s -n 24 --temp 0 --draft '%s' --draft-max 3 --ids-out '%s' --spec-log '%s'",
                         tgt, prompt, w ? dft : tgt, ids_b, log), 0);
        int nb = parse_ids(th_read_text(ids_b, tb, sizeof tb), b, 64);
        CHECK_INT(nb, na);
        for (int i = 0; i < na && i < nb; i++)
            if (a[i] != b[i]) {
                TH_FAIL("%s draft: speculative id %d is %d, plain greedy %d", w ? "random" : "self", i, b[i], a[i]);
                break;
            }
        /* the rounds: {"pos": P, "proposed": [...], "accepted": A} */
        th_read_text(log, tl, sizeof tl);
        int64_t pos_expect = 7 - 1, emitted = 0, rounds = 0, accepted = 0, proposed = 0;
        for (char *line = tl; *line; rounds++) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = 0;
            long long pos = -1;
            int acc = -1;
            int32_t prop[64];
            char *pp = strstr(line, "\"proposed\": "), *pa = strstr(line, "\"accepted\": ");
            int np = pp ? parse_ids(pp + 12, prop, 64) : -1;
            if (sscanf(line, "{\"pos\": %lld", &pos) != 1 || np < 0 || !pa || sscanf(pa + 12, "%d", &acc) != 1) {
                TH_FAIL("spec log line %lld: '%s'", (long long)rounds, line);
                break;
            }
            CHECK_INT(pos, pos_expect);
            CHECK(acc >= 0 && acc <= np);
            for (int k = 0; k < acc && emitted + k < nb; k++) CHECK_INT(prop[k], b[emitted + k]);
            emitted += acc + 1; /* the accepted proposals and the target's own token */
            pos_expect += acc + 1;
            accepted += acc;
            proposed += np;
            line = nl ? nl + 1 : line + strlen(line);
        }
        CHECK(rounds > 0);
        CHECK(emitted >= nb); /* the last round may stop inside its proposals */
        if (w == 0) CHECK_INT(accepted, proposed); /* a draft equal to the target is always right */
    }
    /* the file's own MTP head as the draft: a qwen35 file and a glm4moe one */
    char mtp[512], mtp_glm[512];
    snprintf(mtp, sizeof mtp, "%s", th_tmp("spec-q35-mtp.gguf"));
    snprintf(mtp_glm, sizeof mtp_glm, "%s", th_tmp("spec-glm-mtp.gguf"));
    CHECK_INT(th_cli("", true, "mkmodel --arch qwen35 --type f32 --layers 8 --dim 64 --vocab 320 --seed 21 --mtp 1 -o '%s'", mtp),
              0);
    CHECK_INT(th_cli("", true, "mkmodel --arch glm4moe --type f32 --layers 4 --dim 64 --vocab 320 --seed 21 -o '%s'", mtp_glm),
              0);
    mtp_greedy(mtp, prompt, ids_a, ids_b, log);
    mtp_greedy(mtp_glm, prompt, ids_a, ids_b, log);
    unlink(mtp_glm);
    CHECK_INT(th_cli("", true, "run -m '%s' %s --mtp -n 4", tgt, prompt), 1); /* no MTP layers */
    HAS("nextn_predict_layers");
    CHECK_INT(th_cli("", true, "run -m '%s' %s --mtp --draft '%s' -n 4", mtp, prompt, dft), 2);
    CHECK_INT(th_cli("", true, "mkmodel --arch qwen3 --mtp 1 -o '%s'", log), 1);
    HAS("MTP layers");
    unlink(mtp);
    /* bad use */
    CHECK_INT(th_cli("", true, "run -m '%s' %s --spec-log '%s'", tgt, prompt, log), 2);
    HAS("--spec-log");
    CHECK_INT(th_cli("", true, "run -m '%s' %s --fork 2 --ids-out '%s'", tgt, prompt, ids_a), 2);
    CHECK_INT(th_cli("", true, "run -m '%s' --tokens 1,99999 -n 2", tgt), 1);
    HAS("outside the vocabulary");
    CHECK_INT(th_cli("", true, "run -m '%s' --tokens 1,x -n 2", tgt), 1);
    HAS("--tokens");
    /* the outputs go through the safe-output path: a device or a directory is refused */
    CHECK_INT(th_cli("", true, "run -m '%s' %s -n 2 --ids-out /dev/null", tgt, prompt), 1);
    HAS("--ids-out: /dev/null is a character device");
    CHECK_INT(th_cli("", true, "run -m '%s' %s -n 2 --draft '%s' --spec-log /tmp", tgt, prompt, dft), 1);
    HAS("--spec-log: /tmp is a directory");
    unlink(tgt), unlink(dft), unlink(ids_a), unlink(ids_b), unlink(log);
}

int main(void) {
    snprintf(g_target, sizeof g_target, "%s", th_tmp("spec-target.gguf"));
    snprintf(g_tiny, sizeof g_tiny, "%s", th_tmp("spec-tiny.gguf"));
    if (!write_model(g_target, NULL, 4, NULL, 5, false) || !write_model(g_tiny, NULL, 2, NULL, 11, true)) return th_done();
    pkv_device *probe = pkv_device_open("cpu:1", pkv_device_default_params());
    if (!probe) return th_skip("cannot open cpu:1");
    pkv_device_close(probe);
    test_greedy();
    test_out_of_pages();
    test_vulkan();
    test_sampling();
    test_errors();
    test_cli_logs();
    return th_done();
}
