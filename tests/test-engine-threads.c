// labels: kv timeout=600
/* The engine under concurrency: its own thread runs while 8 threads submit and
 * cancel (right after submitting, or once a token arrived) and a ninth reads the
 * statistics. Every request gets exactly one final event per sample and nothing
 * after it; requests left alone produce exactly their lone-run tokens and
 * logprobs; cancelled ones a prefix of them; afterwards every page is back and
 * nothing is leaked. Also run by `make test-asan` (labels kv). */
#include <pthread.h>
#include <sched.h>

#include "engine-testlib.h"

enum { N_THREADS = 8, PER_THREAD = 10, N_PROMPTS = 6 };

static pkv_model *g_m;
static pkv_engine *g_e;
static int32_t g_prompt[N_PROMPTS][40];
static int g_plen[N_PROMPTS];
static pkv_request_params g_rp[N_PROMPTS];
static et_rec g_ref[N_PROMPTS];
static et_rec g_rec[N_THREADS][PER_THREAD];
static int g_which[N_THREADS][PER_THREAD], g_cancelled[N_THREADS][PER_THREAD];
static atomic_int g_stop_stats;
static atomic_int g_errors;

static void *client(void *arg) {
    int t = (int)(intptr_t)arg;
    uint64_t rs = 1000 + (uint64_t)t;
    uint64_t id[PER_THREAD];
    for (int k = 0; k < PER_THREAD; k++) {
        int w = (int)(et_rand(&rs) % N_PROMPTS);
        g_which[t][k] = w;
        pkv_request_params r = g_rp[w];
        r.on_event = et_on_event;
        r.user = &g_rec[t][k];
        if (pkv_engine_submit(g_e, &r, &id[k])) {
            atomic_fetch_add(&g_errors, 1);
            id[k] = 0;
            continue;
        }
        int how = (int)(et_rand(&rs) % 4); /* 0: cancel at once, 1: after a token, else keep */
        if (how == 0) {
            g_cancelled[t][k] = pkv_engine_cancel(g_e, id[k]) == PKV_OK;
        } else if (how == 1) {
            while (atomic_load(&g_rec[t][k].n_tokens) == 0 && atomic_load(&g_rec[t][k].n_final) < g_rp[w].n)
                sched_yield();
            g_cancelled[t][k] = pkv_engine_cancel(g_e, id[k]) == PKV_OK; /* NOT_FOUND if it finished */
        }
        if (et_rand(&rs) % 3 == 0) sched_yield();
    }
    for (int k = 0; k < PER_THREAD; k++) /* wait for the final events */
        while (id[k] && atomic_load(&g_rec[t][k].n_final) < g_rp[g_which[t][k]].n) sched_yield();
    return NULL;
}

static void *stats_reader(void *arg) {
    (void)arg;
    long reads = 0;
    while (!atomic_load(&g_stop_stats)) {
        pkv_engine_stats st;
        pkv_engine_stats_get(g_e, &st);
        if (st.pages_used > st.pages_total || st.n_requests < 0) atomic_fetch_add(&g_errors, 1);
        reads++;
        sched_yield();
    }
    return (void *)(intptr_t)reads;
}

int main(void) {
    g_m = et_model("llama", PKV_TYPE_Q8_0, 3);
    if (!g_m) return th_done();
    int64_t live0 = pkv_alloc_live();
    uint64_t rs = 77;
    for (int w = 0; w < N_PROMPTS; w++) {
        g_plen[w] = 4 + (int)(et_rand(&rs) % 36);
        for (int k = 0; k < g_plen[w]; k++) g_prompt[w][k] = (int32_t)(et_rand(&rs) % 320);
        if (w % 2) /* half share their first 16 tokens with prompt 0 */
            for (int k = 0; k < 16 && k < g_plen[w]; k++) g_prompt[w][k] = g_prompt[0][k];
        pkv_request_params r = pkv_request_default_params();
        r.prompt = g_prompt[w];
        r.n_prompt = g_plen[w];
        r.max_tokens = 6 + w * 2;
        r.ignore_eos = true;
        r.sampling.temp = w % 3 ? 0.0f : 0.7f;
        r.sampling.seed = (uint64_t)w;
        r.n = w == 4 ? 3 : 1;
        r.top_logprobs = w == 2 ? 2 : 0;
        g_rp[w] = r;
        et_alone(g_m, &r, &g_ref[w]);
    }
    /* A pool too small for everything at once: preemption happens under the threads too. */
    pkv_engine_params ep = et_params(128, 4, 40);
    ep.max_batch_tokens = 48;
    g_e = pkv_engine_create(g_m, ep);
    REQUIRE(g_e);
    CHECK_OK(pkv_engine_start(g_e));
    pthread_t th[N_THREADS], sr;
    pthread_create(&sr, NULL, stats_reader, NULL);
    for (int t = 0; t < N_THREADS; t++) pthread_create(&th[t], NULL, client, (void *)(intptr_t)t);
    for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
    atomic_store(&g_stop_stats, 1);
    void *reads;
    pthread_join(sr, &reads);
    pkv_engine_stats st;
    pkv_engine_stats_get(g_e, &st);
    CHECK_OK(pkv_engine_stop(g_e));
    CHECK_INT(atomic_load(&g_errors), 0);

    int n_cancelled = 0, n_full = 0, bad = 0;
    for (int t = 0; t < N_THREADS; t++)
        for (int k = 0; k < PER_THREAD; k++) {
            int w = g_which[t][k];
            et_rec *r = &g_rec[t][k];
            bool cancelled = false;
            for (int j = 0; j < g_rp[w].n; j++) {
                et_sample *s = &r->s[j], *ref = &g_ref[w].s[j];
                CHECK_INT(s->finals, 1);
                CHECK_INT(s->after_final, 0);
                CHECK_INT(s->bad_order, 0);
                cancelled |= s->fin == PKV_FINISH_CANCELLED;
                if (s->fin == PKV_FINISH_CANCELLED) { /* a prefix of the lone run */
                    CHECK(g_cancelled[t][k]);
                    CHECK(s->n <= ref->n);
                    bad += memcmp(s->tok, ref->tok, (size_t)s->n * 4) || memcmp(s->lp, ref->lp, (size_t)s->n * 4);
                }
            }
            if (cancelled) n_cancelled++;
            else {
                bad += !et_same(&g_ref[w], r, g_rp[w].n, "threaded request", t * PER_THREAD + k);
                n_full++;
            }
        }
    CHECK_INT(bad, 0);
    fprintf(stderr,
            "threads: %d requests completed, %d cancelled; %llu steps, preemptions %llu swap + %llu recompute, "
            "%ld statistics reads\n",
            n_full, n_cancelled, (unsigned long long)st.steps, (unsigned long long)st.preemptions_swap,
            (unsigned long long)st.preemptions_recompute, (long)(intptr_t)reads);
    CHECK(n_cancelled > 0 && n_full > 0);
    CHECK_INT(st.requests_finished, N_THREADS * PER_THREAD);
    CHECK_INT(st.requests_cancelled, n_cancelled);
    CHECK_INT(st.n_requests, 0);
    CHECK_INT(st.pages_used, 0);
    pkv_kv_stats ks;
    pkv_kv_stats_get(pkv_engine_cache(g_e), &ks);
    CHECK_INT(ks.n_seqs, 0);
    CHECK_INT(ks.pages_free + ks.pages_cached, 40);

    /* start, submit, stop with work left, free: the rest is cancelled, nothing leaks */
    CHECK_OK(pkv_engine_start(g_e));
    static et_rec last;
    pkv_request_params r = g_rp[1];
    r.max_tokens = 60;
    r.on_event = et_on_event;
    r.user = &last;
    CHECK_OK(pkv_engine_submit(g_e, &r, NULL));
    while (atomic_load(&last.n_tokens) < 2) sched_yield();
    CHECK_OK(pkv_engine_stop(g_e));
    pkv_engine_free(g_e);
    CHECK_INT(last.s[0].finals, 1);
    CHECK(last.s[0].fin == PKV_FINISH_CANCELLED || last.s[0].fin == PKV_FINISH_LENGTH);
    CHECK_INT(pkv_alloc_live(), live0);
    pkv_model_free(g_m);
    return th_done();
}
