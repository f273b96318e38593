// labels: kv timeout=900
/* Speculative decoding in the serving engine (pkv_engine_params.draft): every
 * request's events must be bitwise those of the same request served alone by an
 * engine without a draft — tokens, logprobs, top alternatives, finish — for
 * greedy and seeded sampling, while prompts share prefixes, prefill is chunked,
 * sequences are preempted (swap, recompute) and n > 1 forks. Drafts:
 *  - the model itself loaded a second time (its own cache): greedy proposals are
 *    all accepted, sampled ones partly, so acceptance and rejection both happen;
 *  - a different small model with the same vocabulary (mostly rejected);
 *  - qwen35's own MTP head (fed the model's hidden states), where rejecting a
 *    proposal also rolls the recurrent state back (checkpoint and replay);
 *  - glm4moe's own MTP head (a mixture layer with a shared expert; CPU);
 *  - gemma4's assistant (no cache: it reads the model's pages, fed its hidden states);
 *  - shared-KV drafts (no cache: they draft on forks of the sequences in the
 *    model's cache): the model's own layers again, and one other layer; under a
 *    pool too small to fork in every round, and under allocation failures.
 * The speculative-sampling rule (PKV_DRAFT_ACCEPT_SAMPLING): greedy requests get
 * plain decoding's tokens with every kind of draft; seeded ones are reproducible,
 * the model as its own draft (p == q) keeps every proposal, and over 3,000 seeds
 * on a 16-token model the tokens it verifies have the model's distribution.
 * Then the same on vulkan:0 when it exists, and bad drafts refused. */
#include "base/base.h"
#include "engine-testlib.h"

enum { NQ = 16 };

static pkv_model *g_m;

static pkv_model *load(const char *arch, int n_layer, int n_mtp, uint64_t seed, bool mtp) {
    return et_model_ex(arch, PKV_TYPE_Q8_0, seed, n_layer, n_mtp, mtp);
}

typedef struct work {
    int32_t prompt[NQ][48];
    pkv_request_params rp[NQ];
    et_rec alone[NQ], got[NQ];
    int arrive[NQ];
} work;

/* NQ requests: shared prefixes, greedy and seeded sampling, logprobs, some that
 * stop at end-of-generation; request 5 asks for n = 3 samples. greedy: all greedy
 * to their max_tokens. */
static void make_work(work *w, uint64_t seed, bool greedy) {
    uint64_t rs = seed;
    int32_t sys[20];
    for (int i = 0; i < 20; i++) sys[i] = (int32_t)(et_rand(&rs) % 320);
    for (int i = 0; i < NQ; i++) {
        int n = 1 + (int)(et_rand(&rs) % 44), k = 0;
        if (i % 3 == 1)
            for (; k < 20 && k < n; k++) w->prompt[i][k] = sys[k];
        for (; k < n; k++) w->prompt[i][k] = (int32_t)(et_rand(&rs) % 320);
        w->rp[i] = et_mixed_request(i, w->prompt[i], n, 4 + (int)(et_rand(&rs) % 28), 500, greedy);
        w->arrive[i] = (int)(et_rand(&rs) % 12);
    }
}

/* Each request alone, on an engine without a draft. */
static void run_alone(work *w) {
    for (int i = 0; i < NQ; i++) et_alone(g_m, &w->rp[i], &w->alone[i]);
}

/* The acceptance rule run_spec's engines use. */
static pkv_draft_accept g_rule = PKV_DRAFT_ACCEPT_MATCH;

/* All of w through an engine with draft d, submitted over the first steps; compare:
 * each request's events must be those of w->alone. */
static void run_spec_ex(work *w, pkv_model *d, const char *what, int64_t n_pages, bool swap, int draft_max,
                        pkv_engine_stats *st, bool compare) {
    pkv_engine_params ep = et_params(256, 8, n_pages);
    ep.cache.n_seq_max = NQ;
    ep.cache.host_pages = n_pages ? 1000 : 0;
    ep.max_batch_tokens = 40;
    ep.swap = swap;
    ep.draft = d;
    ep.draft_max = draft_max;
    ep.draft_accept = g_rule;
    pkv_engine *e = pkv_engine_create(g_m, ep);
    if (!e) {
        TH_FAIL("%s: engine: %s", what, pkv_errmsg());
        return;
    }
    et_run_arrivals(e, NQ, w->arrive, w->rp, w->got, 12, what);
    int bad = 0;
    for (int i = 0; compare && i < NQ; i++) bad += !et_same(&w->alone[i], &w->got[i], w->rp[i].n, what, i);
    pkv_engine_stats_get(e, st);
    fprintf(stderr, "  %-44s %d of %d differ; proposed %llu, accepted %llu, %llu steps (+%llu draft), preempted %llu "
                    "swap %llu recompute, %llu without draft, %llu rounds skipped\n",
            what, bad, NQ, (unsigned long long)st->draft_proposed, (unsigned long long)st->draft_accepted,
            (unsigned long long)st->steps, (unsigned long long)st->draft_steps, (unsigned long long)st->preemptions_swap,
            (unsigned long long)st->preemptions_recompute, (unsigned long long)st->draft_disabled,
            (unsigned long long)st->draft_skipped);
    CHECK(st->draft_proposed > 0);
    CHECK(st->draft_accepted <= st->draft_proposed);
    CHECK_INT(st->requests_failed, 0);
    CHECK_INT(st->pages_used, 0);
    CHECK_INT(st->n_running + st->n_swapped + st->n_recompute, 0);
    pkv_engine_free(e);
}

static void run_spec(work *w, pkv_model *d, const char *what, int64_t n_pages, bool swap, int draft_max,
                     pkv_engine_stats *st) {
    run_spec_ex(w, d, what, n_pages, swap, draft_max, st, true);
}

/* PKV_DRAFT_ACCEPT_SAMPLING with draft d (self: the model loaded again): greedy
 * requests get plain decoding's events; seeded requests (temperature 0.9) get the
 * same events twice from the same schedule, and a draft equal to the model
 * (p == q) keeps every proposal, where the MATCH rule keeps about half. Preempted
 * (swap), they still finish, and a draft equal to the model still keeps all; their
 * tokens may differ, as the rounds that propose depend on the schedule. */
/* false on devices other than the CPU: the rule's seeded runs (the sampling is
 * the host's, whatever the device) only once, on the CPU */
static bool g_full = true;

static void check_rule_pages(pkv_model *d, const char *name, bool self, int64_t pages) {
    static work w;
    char what[96];
    pkv_engine_stats st;
    g_rule = PKV_DRAFT_ACCEPT_SAMPLING;
    make_work(&w, 9, true);
    run_alone(&w);
    snprintf(what, sizeof what, "%s, sampling rule, greedy:", name);
    run_spec(&w, d, what, 0, true, 4, &st);
    if (self) CHECK_INT(st.draft_accepted, st.draft_proposed);
    if (!g_full) {
        g_rule = PKV_DRAFT_ACCEPT_MATCH;
        return;
    }
    make_work(&w, 7, false);
    snprintf(what, sizeof what, "%s, sampling rule, seeded:", name);
    run_spec_ex(&w, d, what, 0, true, 4, &st, false);
    if (self) CHECK_INT(st.draft_accepted, st.draft_proposed);
    for (int i = 0; i < NQ; i++) w.alone[i] = w.got[i];
    snprintf(what, sizeof what, "%s, sampling rule, seeded again:", name);
    run_spec(&w, d, what, 0, true, 4, &st);
    snprintf(what, sizeof what, "%s, sampling rule, seeded, %d pages, swap:", name, (int)pages);
    run_spec_ex(&w, d, what, pages, true, 4, &st, false);
    CHECK(st.preemptions_swap > 0);
    if (self) CHECK_INT(st.draft_accepted, st.draft_proposed);
    g_rule = PKV_DRAFT_ACCEPT_MATCH;
}

static void check_rule(pkv_model *d, const char *name, bool self) { check_rule_pages(d, name, self, 28); }

/* The workload with draft d: a roomy pool, then one that preempts by swap and one
 * that preempts by recompute (the draft's sequences go along). */
static void check_draft(work *w, pkv_model *d, const char *name, bool self, bool preemption) {
    char what[96];
    pkv_engine_stats st;
    snprintf(what, sizeof what, "%s:", name);
    run_spec(w, d, what, 0, true, 4, &st);
    if (self) CHECK(st.draft_accepted > 0);
    if (!preemption) return;
    snprintf(what, sizeof what, "%s, 28 pages, swap:", name);
    run_spec(w, d, what, 28, true, 3, &st);
    CHECK(st.preemptions_swap > 0);
    snprintf(what, sizeof what, "%s, 28 pages, recompute:", name);
    run_spec(w, d, what, 28, false, 2, &st);
    CHECK(st.preemptions_recompute > 0);
}

static void bad_drafts(void) {
    pkv_engine_params ep = et_params(256, 8, 0);
    ep.draft = g_m;
    ep.draft_max = 65;
    CHECK(!pkv_engine_create(g_m, ep));
    CHECK(strstr(pkv_errmsg(), "draft_max 65") != NULL);
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.n_vocab = 300;
    p.n_embd = 64;
    void *data = NULL;
    size_t size = 0;
    REQUIRE_VOID(!pkv_mkmodel_memory(&p, &data, &size));
    pkv_model_params mp = pkv_model_default_params();
    mp.device = et_device;
    pkv_model *other = pkv_model_load_memory(data, size, "other-vocab", mp);
    pkv_mkmodel_free_memory(data);
    REQUIRE_VOID(other);
    ep.draft = other;
    ep.draft_max = 0;
    CHECK(!pkv_engine_create(g_m, ep));
    CHECK(strstr(pkv_errmsg(), "vocabulary of 300") != NULL);
    pkv_model_free(other);
}

/* The model as its own draft on greedy requests: every proposal is the token the
 * model then samples, so every one is kept. */
static void check_self_greedy(pkv_model *self, const char *name) {
    static work w;
    make_work(&w, 9, true);
    run_alone(&w);
    pkv_engine_stats st;
    run_spec(&w, self, name, 0, true, 4, &st);
    CHECK_INT(st.draft_accepted, st.draft_proposed);
}

static void check_assistant(const char *dev, bool full);
static void check_shared(const char *dev, bool full);

static void run_device(const char *dev, bool full) {
    static work w;
    et_device = dev;
    g_full = full;
    fprintf(stderr, "%s:\n", dev);
    /* llama: itself as the draft, and another small model */
    g_m = load("llama", 2, 0, 1, false);
    pkv_model *self = g_m ? load("llama", 2, 0, 1, false) : NULL, *other = g_m ? load("llama", 1, 0, 2, false) : NULL;
    if (g_m && self && other) {
        make_work(&w, 7, false);
        run_alone(&w);
        check_draft(&w, self, "llama, itself as draft", true, full);
        check_self_greedy(self, "llama, itself as draft, greedy:");
        if (full) check_draft(&w, other, "llama, another model as draft", false, false);
        check_rule(self, "llama, itself as draft", true);
        if (full) check_rule(other, "llama, another model as draft", false);
        if (full) bad_drafts();
    }
    pkv_model_free(self);
    pkv_model_free(other);
    pkv_model_free(g_m);
    /* qwen35 and its MTP head: a rejected proposal rolls the recurrent state back */
    g_m = load("qwen35", 4, 1, 3, false);
    pkv_model *head = g_m ? load("qwen35", 4, 1, 3, true) : NULL, *self35 = g_m ? load("qwen35", 4, 1, 3, false) : NULL;
    if (g_m && head && self35) {
        make_work(&w, 8, false);
        run_alone(&w);
        check_draft(&w, head, "qwen35, its MTP head as draft", false, full);
        /* partly kept proposals: the state goes back to the last kept token */
        if (full) check_draft(&w, self35, "qwen35, itself as draft", true, false);
        check_self_greedy(self35, "qwen35, itself as draft, greedy:");
        check_rule(head, "qwen35, its MTP head as draft", false);
        if (full) check_rule(self35, "qwen35, itself as draft", true);
    }
    pkv_model_free(head);
    pkv_model_free(self35);
    pkv_model_free(g_m);
    /* glm4moe and its MTP head (a mixture layer with a shared expert), on the CPU */
    g_m = full ? load("glm4moe", 3, 1, 5, false) : NULL;
    pkv_model *head_glm = g_m ? load("glm4moe", 3, 1, 5, true) : NULL;
    if (full) CHECK(g_m && head_glm);
    if (g_m && head_glm) {
        make_work(&w, 8, false);
        run_alone(&w);
        check_draft(&w, head_glm, "glm4moe, its MTP head as draft", false, false);
    }
    pkv_model_free(head_glm);
    pkv_model_free(g_m);
    g_m = NULL;
    check_assistant(dev, full);
    check_shared(dev, full);
}

/* gemma4 with Gemma 4's assistant (mkmodel --arch gemma4-assistant --draft-of): no
 * cache of its own, it reads the model's pages at each sequence's next position. */
static void check_assistant(const char *dev, bool full) {
    static work w;
    char tf[512], af[512];
    snprintf(tf, sizeof tf, "%s", th_tmp("engine-spec-g4.gguf"));
    snprintf(af, sizeof af, "%s", th_tmp("engine-spec-g4-asst.gguf"));
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "gemma4";
    p.type = PKV_TYPE_Q8_0;
    p.n_embd = et_n_embd;
    p.n_ff = 128;
    p.n_vocab = 320;
    p.seed = 5;
    pkv_mkmodel_params a = pkv_mkmodel_default_params();
    a.arch = "gemma4-assistant";
    a.type = PKV_TYPE_Q8_0;
    a.draft_of = tf;
    a.seed = 6;
    REQUIRE_VOID(!pkv_mkmodel_write(&p, tf) && !pkv_mkmodel_write(&a, af));
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    mp.device = dev;
    g_m = pkv_model_load(tf, mp);
    pkv_model *asst = g_m ? pkv_model_load(af, mp) : NULL;
    if (g_m && asst) {
        make_work(&w, 10, false);
        run_alone(&w);
        check_draft(&w, asst, "gemma4, its assistant as draft", false, full);
        check_rule(asst, "gemma4, its assistant as draft", false);
    } else {
        TH_FAIL("gemma4 and its assistant on %s: %s", dev, pkv_errmsg());
    }
    pkv_model_free(asst);
    pkv_model_free(g_m);
    g_m = NULL;
    unlink(tf);
    unlink(af);
}

/* A llama file of n_layer layers; with draft_of a shared-KV draft of that target
 * whose layer j attends over the target's cache layer kv[j]. */
static bool write_llama(const char *path, const char *draft_of, int n_layer, const int32_t *kv, uint64_t seed) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.type = PKV_TYPE_Q8_0;
    p.n_layer = n_layer;
    p.n_embd = et_n_embd;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 320;
    p.seed = seed;
    p.draft_of = draft_of;
    p.shared_kv_layers = kv;
    pkv_status s = pkv_mkmodel_write(&p, path);
    if (s) TH_FAIL("mkmodel %s: %s", path, pkv_errmsg());
    return !s;
}

/* Each of w's first n requests alone on an engine with draft d: its events must be
 * those of w->alone. */
static void run_each_alone(work *w, pkv_model *d, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        pkv_engine_params ep = et_params(256, 8, 0);
        ep.draft = d;
        ep.draft_accept = g_rule;
        pkv_engine *e = pkv_engine_create(g_m, ep);
        if (!e) {
            TH_FAIL("%s: engine: %s", what, pkv_errmsg());
            return;
        }
        memset(&w->got[i], 0, sizeof w->got[i]);
        pkv_request_params r = w->rp[i];
        r.on_event = et_on_event;
        r.user = &w->got[i];
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        et_same(&w->alone[i], &w->got[i], r.n, what, i);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        CHECK_INT(st.pages_used, 0);
        pkv_engine_free(e);
    }
}

/* A shared-KV draft (pagekv.shared_kv_layers: no cache of its own, its layers attend
 * over the model's cache layers): each round it drafts on a fork of the sequence in
 * the model's cache. "Itself": the model's two layers again (same seed), over their
 * own cache layers, so greedy proposals are the model's tokens; "another": one
 * layer of other weights over the model's layer 1. Alone, batched, with a pool
 * that preempts (its forks sit rounds out when the pool is short); a draft naming
 * a layer the model does not have is refused, naming both files. */
static void check_shared(const char *dev, bool full) {
    static work w;
    static const int32_t kv01[2] = {0, 1}, kv1[1] = {1}, kv17[2] = {1, 7};
    char tf[512], sf[512], of[512], bf[512];
    snprintf(tf, sizeof tf, "%s", th_tmp("engine-spec-sh.gguf"));
    snprintf(sf, sizeof sf, "%s", th_tmp("engine-spec-sh-self.gguf"));
    snprintf(of, sizeof of, "%s", th_tmp("engine-spec-sh-other.gguf"));
    snprintf(bf, sizeof bf, "%s", th_tmp("engine-spec-sh-bad.gguf"));
    REQUIRE_VOID(write_llama(tf, NULL, 2, NULL, 21) && write_llama(sf, tf, 2, kv01, 21) && write_llama(of, tf, 1, kv1, 22) &&
                 write_llama(bf, tf, 2, kv17, 23));
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    mp.device = dev;
    g_m = pkv_model_load(tf, mp);
    mp.device = NULL;
    mp.device_handle = g_m ? pkv_model_device(g_m) : NULL;
    pkv_model *self = g_m ? pkv_model_load(sf, mp) : NULL, *other = g_m ? pkv_model_load(of, mp) : NULL;
    pkv_model *bad = g_m ? pkv_model_load(bf, mp) : NULL;
    if (g_m && self && other && bad) {
        pkv_engine_stats st;
        make_work(&w, 9, true);
        run_alone(&w);
        run_each_alone(&w, self, 4, "llama, shared-KV draft of itself, alone");
        run_spec(&w, self, "llama, shared-KV draft of itself, greedy:", 0, true, 4, &st);
        CHECK(st.draft_accepted > 0);
        CHECK_INT(st.draft_accepted, st.draft_proposed);
        make_work(&w, 7, false);
        run_alone(&w);
        check_draft(&w, self, "llama, shared-KV draft of itself", true, full);
        if (full) check_draft(&w, other, "llama, another shared-KV draft", false, false);
        run_spec(&w, self, "llama, shared-KV draft, 12 pages, swap:", 12, true, 4, &st);
        CHECK(st.preemptions_swap > 0);
        CHECK(st.draft_skipped > 0);
        check_rule_pages(self, "llama, shared-KV draft of itself", true, 12); /* (28 pages do not preempt it) */
        pkv_engine_params ep = et_params(256, 8, 0);
        /* every allocation of the creation failing in turn: NULL, nothing leaked */
        ep.draft = self;
        ep.draft_max = 3;
        int64_t live = pkv_alloc_live();
        for (uint64_t k = 1;; k++) {
            pkv_alloc_fail_at(k);
            pkv_engine *e = pkv_engine_create(g_m, ep);
            pkv_alloc_fail_at(0);
            if (e) {
                pkv_engine_free(e);
                break;
            }
            CHECK_INT(pkv_alloc_live(), live);
            if (k > 500) {
                TH_FAIL("engine_create with a shared-KV draft never succeeded");
                break;
            }
        }
        CHECK_INT(pkv_alloc_live(), live);
        /* the k-th allocation of a run failing, for about 64 k spread over the run's
         * allocations (the forks, the draft's rows and workspace among them; every k
         * took minutes on 2 cores): the requests end (some failed), nothing is left held */
        uint64_t n_alloc = 0;
        for (uint64_t k = 0; k == 0 || (full && k <= n_alloc); k += k ? PKV_MAX(1, n_alloc / 64) : 1) {
            pkv_alloc_fail_at(k);
            pkv_engine *e = pkv_engine_create(g_m, ep);
            et_rec rec[3];
            for (int i = 0; e && i < 3; i++) {
                memset(&rec[i], 0, sizeof rec[i]);
                pkv_request_params r = w.rp[i];
                r.on_event = et_on_event;
                r.user = &rec[i];
                if (pkv_engine_submit(e, &r, NULL)) rec[i].s[0].n = -1;
            }
            int left = 1;
            for (int step = 0; e && left > 0 && step < 2000; step++) CHECK_OK(pkv_engine_step(e, &left));
            uint64_t made = pkv_alloc_fail_at(0);
            if (!k) n_alloc = made;
            if (e) {
                CHECK_INT(left, 0);
                pkv_engine_stats_get(e, &st);
                CHECK_INT(st.pages_used, 0);
                if (!k) CHECK(st.draft_proposed > 0 && st.requests_failed == 0);
            }
            pkv_engine_free(e);
            CHECK_INT(pkv_alloc_live(), live);
        }
        fprintf(stderr, "  llama, shared-KV draft: the k-th of %llu allocations failing, k from 1 in steps of %llu: "
                        "no leak\n", (unsigned long long)n_alloc, (unsigned long long)PKV_MAX(1, n_alloc / 64));
        ep.draft = bad;
        CHECK(!pkv_engine_create(g_m, ep));
        CHECK(strstr(pkv_errmsg(), "engine: shared-KV draft ") != NULL);
        CHECK(strstr(pkv_errmsg(), "engine-spec-sh-bad.gguf on the cache of ") != NULL);
        CHECK(strstr(pkv_errmsg(), "engine-spec-sh.gguf: draft layer 1 shares KV layer 7, but the cache has 2 layers") != NULL);
    } else {
        TH_FAIL("llama and its shared-KV drafts on %s: %s", dev, pkv_errmsg());
    }
    pkv_model_free(bad);
    pkv_model_free(other);
    pkv_model_free(self);
    pkv_model_free(g_m);
    g_m = NULL;
    unlink(tf), unlink(sf), unlink(of), unlink(bf);
    /* qwen35: a one-layer draft's layer 0 is a delta-net layer, which has no K/V to
     * share (it failed at its first draft step before) */
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "qwen35";
    p.n_layer = 4;
    p.n_embd = et_n_embd;
    p.n_vocab = 320;
    pkv_mkmodel_params q = pkv_mkmodel_default_params();
    q.draft_of = tf;
    q.n_layer = 1;
    static const int32_t kv3[1] = {3};
    q.shared_kv_layers = kv3;
    REQUIRE_VOID(!pkv_mkmodel_write(&p, tf) && !pkv_mkmodel_write(&q, bf));
    mp.device = dev;
    mp.device_handle = NULL;
    g_m = pkv_model_load(tf, mp);
    mp.device = NULL;
    mp.device_handle = g_m ? pkv_model_device(g_m) : NULL;
    bad = g_m ? pkv_model_load(bf, mp) : NULL;
    if (g_m && bad) {
        pkv_engine_params ep = et_params(256, 8, 0);
        ep.draft = bad;
        CHECK(!pkv_engine_create(g_m, ep));
        CHECK(strstr(pkv_errmsg(), "layer 0 is recurrent (qwen35), so it cannot attend over target ") != NULL);
    } else {
        TH_FAIL("qwen35 and a shared-KV draft on %s: %s", dev, pkv_errmsg());
    }
    pkv_model_free(bad);
    pkv_model_free(g_m);
    g_m = NULL;
    unlink(tf), unlink(bf);
}

/* A 16-token llama (no vocabulary) for distribution checks. */
static pkv_model *tiny(uint64_t seed) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.type = PKV_TYPE_F32;
    p.n_layer = 2;
    p.n_embd = 32;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 64;
    p.n_vocab = 16;
    p.no_vocab = true;
    p.seed = seed;
    return et_load_made(&p, "engine-spec-tiny", false);
}

/* softmax(row / temp) over 16 tokens, added to p with weight w. */
static void add_softmax(const float *row, double temp, double w, double *p) {
    double mx = -1e300, sum = 0, e[16];
    for (int i = 0; i < 16; i++) mx = fmax(mx, row[i]);
    for (int i = 0; i < 16; i++) sum += e[i] = exp(((double)row[i] - mx) / temp);
    for (int i = 0; i < 16; i++) p[i] += w * e[i] / sum;
}

/* Pearson chi-square of counts against probabilities (bins expecting fewer than 5
 * merged into one); *df its degrees of freedom. */
static double chi2(const int *cnt, const double *p, int n, int *df) {
    double x = 0, rest_e = 0, rest_o = 0;
    int bins = 0;
    for (int i = 0; i < 16; i++) {
        double e = p[i] * n;
        if (e < 5) {
            rest_e += e, rest_o += cnt[i];
            continue;
        }
        x += (cnt[i] - e) * (cnt[i] - e) / e;
        bins++;
    }
    if (rest_e > 0) x += (rest_o - rest_e) * (rest_o - rest_e) / fmax(rest_e, 1e-9), bins++;
    *df = bins - 1;
    return x;
}

/* The rule's distribution: N requests of 4 tokens from one prompt, seeds 0..N-1,
 * temperature 1.5 (no top-k/p), draft_max 2. Token 1 is sampled from the prompt's
 * row; tokens 2 and 3 are those of the round that verifies the draft's two
 * proposals (kept, or the residual's after a rejection): each must have the model's
 * marginal distribution (p2 = sum_a p1(a) p(.|a), p3 likewise), with an unrelated
 * draft (rejections) and with the model itself (all kept). */
static void check_rule_distribution(void) {
    enum { N = 3000 };
    const double temp = 1.5;
    pkv_model *t = tiny(11), *drafts[2] = {tiny(12), tiny(11)};
    pkv_kv_cache *c = t ? pkv_model_cache_create(t, pkv_cache_default_params()) : NULL;
    REQUIRE_VOID(t && drafts[0] && drafts[1] && c);
    const int32_t prompt[3] = {1, 2, 3};
    double p1[16] = {0}, p2[16] = {0}, p3[16] = {0};
    pkv_context *ref = pkv_context_create(t, c, 0);
    REQUIRE_VOID(ref);
    CHECK_OK(pkv_context_decode(ref, prompt, 3));
    add_softmax(pkv_context_logits(ref), temp, 1, p1);
    for (int a = 0; a < 16; a++) {
        pkv_context *f = pkv_context_fork(ref);
        REQUIRE_VOID(f);
        double pa[16] = {0};
        CHECK_OK(pkv_context_decode(f, &(int32_t){a}, 1));
        add_softmax(pkv_context_logits(f), temp, 1, pa);
        for (int b = 0; b < 16; b++) {
            p2[b] += p1[a] * pa[b];
            pkv_context *g = pkv_context_fork(f);
            REQUIRE_VOID(g);
            CHECK_OK(pkv_context_decode(g, &(int32_t){b}, 1));
            add_softmax(pkv_context_logits(g), temp, p1[a] * pa[b], p3);
            pkv_context_free(g);
        }
        pkv_context_free(f);
    }
    pkv_context_free(ref);
    pkv_kv_cache_free(c);
    static et_rec rec[N];
    for (int k = 0; k < 2; k++) {
        pkv_engine_params ep = et_params(64, 8, 0);
        ep.cache.n_seq_max = 64;
        ep.draft = drafts[k];
        ep.draft_max = 2;
        ep.draft_accept = PKV_DRAFT_ACCEPT_SAMPLING;
        pkv_engine *e = pkv_engine_create(t, ep);
        REQUIRE_VOID(e);
        for (int i = 0; i < N; i++) {
            memset(&rec[i], 0, sizeof rec[i]);
            pkv_request_params r = pkv_request_default_params();
            r.prompt = prompt;
            r.n_prompt = 3;
            r.max_tokens = 4;
            r.ignore_eos = true;
            r.sampling.temp = (float)temp;
            r.sampling.top_k = 0;
            r.sampling.top_p = 1;
            r.sampling.min_p = 0;
            r.sampling.seed = (uint64_t)i;
            r.on_event = et_on_event;
            r.user = &rec[i];
            CHECK_OK(pkv_engine_submit(e, &r, NULL));
        }
        et_drain(e);
        pkv_engine_stats st;
        pkv_engine_stats_get(e, &st);
        pkv_engine_free(e);
        int c1[16] = {0}, c2[16] = {0}, c3[16] = {0}, df1, df2, df3;
        for (int i = 0; i < N; i++) {
            if (rec[i].s[0].n != 4) {
                TH_FAIL("request %d: %d tokens", i, rec[i].s[0].n);
                break;
            }
            c1[rec[i].s[0].tok[0]]++, c2[rec[i].s[0].tok[1]]++, c3[rec[i].s[0].tok[2]]++;
        }
        double x1 = chi2(c1, p1, N, &df1), x2 = chi2(c2, p2, N, &df2), x3 = chi2(c3, p3, N, &df3);
        fprintf(stderr, "  16-token model, sampling rule, %s draft: kept %llu of %llu; chi2 token 1 = %.1f (df %d), "
                        "token 2 = %.1f (df %d), token 3 = %.1f (df %d)\n",
                k ? "itself as" : "an unrelated", (unsigned long long)st.draft_accepted,
                (unsigned long long)st.draft_proposed, x1, df1, x2, df2, x3, df3);
        /* df <= 15: the 0.999 quantile is 37.7 */
        CHECK(x1 < 37.7);
        CHECK(x2 < 37.7);
        CHECK(x3 < 37.7);
        if (k) CHECK_INT(st.draft_accepted, st.draft_proposed);
        else CHECK(st.draft_accepted > 0 && st.draft_accepted < st.draft_proposed);
    }
    pkv_model_free(drafts[0]);
    pkv_model_free(drafts[1]);
    pkv_model_free(t);
}

/* bench serve --mtp: the engine's figures with the MTP head drafting. */
static void bench_cli(void) {
    char f[512];
    snprintf(f, sizeof f, "%s", th_tmp("engine-spec-q35.gguf"));
    int rc = th_cli("", true, "mkmodel --arch qwen35 --layers 4 --mtp 1 --seed 4 -o '%s'", f);
    if (rc == -1) {
        printf("note: no CLI (PKV_CLI unset): bench serve --mtp not checked\n");
        return;
    }
    CHECK_INT(rc, 0);
    CHECK_INT(th_cli("", false, "bench serve -m '%s' --mtp --draft-max 3 -t 2 -n 6 --clients 3 --prompt-tokens 16 "
                     "--output-tokens 8 --json", f), 0);
    CHECK(strstr(th_out, "\"draft\": \"mtp\"") != NULL);
    CHECK(strstr(th_out, "\"draft_proposed\": 0,") == NULL);
    CHECK(strstr(th_out, "\"failed\": 0,") != NULL);
    CHECK_INT(th_cli("", true, "bench serve --tiny --mtp"), 2); /* no file with MTP layers */
    unlink(f);
}

int main(void) {
    bench_cli();
    check_rule_distribution();
    run_device("cpu", true);
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (v) {
        pkv_device_close(v);
        run_device("vulkan:0", false);
    } else {
        printf("note: no vulkan:0 here; the engine's speculative decoding on Vulkan was not run\n");
    }
    return th_done();
}
