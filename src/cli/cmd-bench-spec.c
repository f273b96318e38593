/* pagekv bench spec: speculative decoding against plain decoding in the same run,
 * as users run them (pagekv run, serve): plain = one request of the serving engine
 * without a draft, speculative = the same request (prompt, n, sampling) on an
 * engine with the draft (pkv_engine_params.draft, the rule of --accept). Reported:
 * acceptance rate, tokens per target step and the speed-up in tokens/s, all over
 * the decoding after the first token (the prefill step samples the first token and
 * is not timed). Without --draft the target is its own draft (own cache): every
 * proposal is accepted, so the figures show the mechanics (K + 1 tokens per target
 * step) and their cost, not a useful draft. It also times one target step of 1
 * token and of K + 1 tokens: their ratio bounds what any draft can gain on this
 * device (ideal_speedup = (K + 1) x step(1) / step(K + 1), a free draft that is
 * always right). --spec ngram: n-gram drafts (pkv_engine_params.draft_ngram, no
 * draft model) instead; --workload edit and echo give them prompts that repeat a
 * passage, as code editing and summarisation do. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

static void usage(FILE *f) {
    fprintf(f, "usage: pagekv bench spec [-m TARGET.gguf] [--draft FILE | --spec ngram] [options] [--json]\n"
               "Speculative vs plain decoding of the same target from the same prompt, each one\n"
               "request of the serving engine (the speculative one on an engine with the draft).\n"
               "Without -m the built-in tiny model; without --draft the target is its own draft\n"
               "(own cache: acceptance 1, so this shows the mechanics and their overhead).\n"
               "Tokens/s and steps count the decoding after the first token (sampled by the prefill).\n"
               "  --draft FILE          draft model (own-cache, shared-KV or a Gemma 4 assistant,\n"
               "                        see docs/speculative.md)\n"
               "  --spec ngram          n-gram drafts (prompt lookup: proposals from the sequence's own\n"
               "                        tokens), no draft model\n"
               "  --workload W          the prompt: random (default: random token ids); edit (a\n"
               "                        passage of half the prompt, a separator, then its first quarter\n"
               "                        again, with one token in eight changed: the output that copies\n"
               "                        it on, as code edits and summaries do, is what n-grams predict);\n"
               "                        echo (a passage P of a third of the prompt, then G, the target's\n"
               "                        own greedy continuation of P, then P again: an answer that\n"
               "                        repeats context, for a model without trained copying)\n"
               "  --draft-device NAME   draft device (default: the target's)\n"
               "  --mtp                 the MTP head of -m FILE as the draft (qwen35 with nextn layers)\n"
               "  --draft-max N         tokens proposed per round (default 4)\n"
               "  --accept RULE         which proposals are kept: sampling (the speculative-sampling\n"
               "                        rule, as run --draft; default) or match (sample, then compare,\n"
               "                        as serve --draft)\n"
               "  -n N                  tokens to generate per run (default 128)\n"
               "  --prompt-tokens N     prompt length, random token ids (default 32)\n"
               "  --temp T              0 = greedy (default); > 0 samples (top-k/p/min-p off)\n"
               "  --reps N              runs of each, the fastest counts (default 3)\n"
               "  -d, -t, -c, --page-size, --kv-type   as for run\n"
               "  --json                one JSON object\n");
}

/* What `pagekv bench spec` was asked. */
typedef struct spec_opts {
    pkv_cli_model_opts o; /* first: pkv_cli_model_more */
    const char *draft_path, *draft_dev;
    bool use_mtp, json, help, ngram;
    const char *workload; /* random, edit, echo */
    long long K, n_gen, n_prompt, reps;
    double temp;
    pkv_draft_accept accept;
} spec_opts;

static bool opt_spec(void *opts, const char *opt, const char *v) {
    if (strcmp(v, "ngram")) {
        fprintf(stderr, "pagekv bench spec: %s takes ngram (a draft model is --draft FILE or --mtp), got '%s'\n", opt, v);
        return false;
    }
    ((spec_opts *)opts)->ngram = true;
    return true;
}

static bool opt_workload(void *opts, const char *opt, const char *v) {
    spec_opts *a = opts;
    if (!strcmp(v, "edit") || !strcmp(v, "random") || !strcmp(v, "echo")) a->workload = v;
    else {
        fprintf(stderr, "pagekv bench spec: %s takes random, edit or echo, got '%s'\n", opt, v);
        return false;
    }
    return true;
}

static bool opt_accept(void *opts, const char *opt, const char *v) {
    spec_opts *a = opts;
    if (!strcmp(v, "sampling")) a->accept = PKV_DRAFT_ACCEPT_SAMPLING;
    else if (!strcmp(v, "match")) a->accept = PKV_DRAFT_ACCEPT_MATCH;
    else {
        fprintf(stderr, "pagekv bench spec: %s takes match or sampling, got '%s'\n", opt, v);
        return false;
    }
    return true;
}

#define SPEC_OPT(...) PKV_CLI_OPT(spec_opts, __VA_ARGS__)
static const pkv_cli_opt spec_options[] = {
    SPEC_OPT("-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    SPEC_OPT("--draft", NULL, PKV_CLI_STR, draft_path, 0, 0),
    SPEC_OPT("--mtp", NULL, PKV_CLI_FLAG, use_mtp, 0, 0),
    SPEC_OPT("--draft-device", NULL, PKV_CLI_STR, draft_dev, 0, 0),
    SPEC_OPT("--draft-max", NULL, PKV_CLI_LLONG, K, 1, 64),
    {"--accept", NULL, PKV_CLI_FN, 0, 0, 0, opt_accept, true},
    {"--spec", NULL, PKV_CLI_FN, 0, 0, 0, opt_spec, true},
    {"--workload", NULL, PKV_CLI_FN, 0, 0, 0, opt_workload, true},
    SPEC_OPT("-n", NULL, PKV_CLI_LLONG, n_gen, 1, 1 << 14),
    SPEC_OPT("--prompt-tokens", NULL, PKV_CLI_LLONG, n_prompt, 1, 1 << 16),
    SPEC_OPT("--reps", NULL, PKV_CLI_LLONG, reps, 1, 100),
    SPEC_OPT("--temp", NULL, PKV_CLI_DOUBLE, temp, 0, 100),
    SPEC_OPT("--json", NULL, PKV_CLI_FLAG, json, 0, 0),
};
#undef SPEC_OPT
static const pkv_cli_cmd spec_cmd = {"bench spec", spec_options, sizeof spec_options / sizeof spec_options[0],
                                     offsetof(spec_opts, help), usage, pkv_cli_model_more, true, false, 0};

/* One request's tokens and times, filled by its events. */
typedef struct gen {
    int32_t t[1 << 14]; /* the tokens, in order [n] (-n is at most 1 << 14) */
    int n;
    double t_first, t_end; /* seconds: the first token's event, the final event */
    bool done;
    pkv_status status; /* the final event's, with its message */
    char message[256];
} gen;

static bool on_event(const pkv_engine_event *ev, void *user) {
    gen *g = user;
    double now = pkv_time_now_cli();
    if (ev->token >= 0) {
        if (!g->n) g->t_first = now;
        if (g->n < (int)(sizeof g->t / sizeof g->t[0])) g->t[g->n++] = ev->token;
    }
    if (ev->finish != PKV_FINISH_NONE) {
        g->t_end = now;
        g->done = true;
        g->status = ev->status;
        snprintf(g->message, sizeof g->message, "%s", ev->message ? ev->message : "");
    }
    return true;
}

/* What one request cost: the engine steps after the one that sampled its first
 * token (the target steps of the decoding) and the engine's draft counters over it. */
typedef struct run_cost {
    int64_t target_steps, drafted, accepted, draft_steps;
} run_cost;

/* Submit rp (its on_event/user set to g) to e and step e here until its final
 * event. On error the status, with the message of the failure. */
static pkv_status run_request(pkv_engine *e, pkv_request_params rp, gen *g, run_cost *cost) {
    memset(g, 0, sizeof *g);
    memset(cost, 0, sizeof *cost);
    rp.on_event = on_event;
    rp.user = g;
    pkv_engine_stats a, b;
    pkv_engine_stats_get(e, &a);
    pkv_status s = pkv_engine_submit(e, &rp, NULL);
    while (!s && !g->done) {
        bool after = g->n > 0; /* a step after the first token's: one of the decoding */
        if ((s = pkv_engine_step(e, NULL))) break;
        cost->target_steps += after;
    }
    if (!s && g->status) s = pkv_err(g->status, "%s", g->message);
    pkv_engine_stats_get(e, &b);
    cost->drafted = (int64_t)(b.draft_proposed - a.draft_proposed);
    cost->accepted = (int64_t)(b.draft_accepted - a.draft_accepted);
    cost->draft_steps = (int64_t)(b.draft_steps - a.draft_steps);
    return s;
}

/* The one-sequence engine of run for o (draft NULL and not ngram: plain); NULL with
 * the error said. */
static pkv_engine *open_engine(pkv_model *m, const pkv_cli_model_opts *o, pkv_model *draft, bool ngram,
                               const char *draft_name, int K, pkv_draft_accept accept) {
    pkv_engine_params ep = pkv_engine_default_params();
    ep.cache.n_ctx = o->n_ctx;
    ep.cache.page_size = o->page_size;
    ep.cache.kv_type = o->kv_type;
    ep.cache.kv_type_v = o->kv_type_v;
    ep.cache.n_seq_max = 1;
    ep.max_seqs = 1;
    /* as run: the prompt in one step without a draft, the default chunks with one */
    ep.max_batch_tokens = draft || ngram ? 0 : o->n_ctx;
    ep.prefix_cache = false; /* every rep computes its prompt, as the first did */
    ep.draft = draft;
    ep.draft_ngram = ngram;
    ep.draft_max = K;
    ep.draft_accept = accept;
    pkv_engine *e = pkv_engine_create(m, ep);
    if (!e) {
        if (draft || ngram) fprintf(stderr, "pagekv bench spec: draft %s: %s\n", draft_name, pkv_errmsg());
        else pkv_cli_fail("bench spec", "engine", PKV_ERR_NOMEM);
    }
    return e;
}

int pkv_cli_bench_spec(int argc, char **argv) {
    spec_opts a = {.K = 4, .n_gen = 128, .n_prompt = 32, .reps = 3, .accept = PKV_DRAFT_ACCEPT_SAMPLING};
    a.o = pkv_cli_model_defaults();
    int parsed = pkv_cli_parse(&spec_cmd, argc, argv, &a);
    if (parsed >= 0) return parsed;
    pkv_cli_model_opts o = a.o;
    const char *draft_path = a.draft_path, *draft_dev = a.draft_dev;
    bool use_mtp = a.use_mtp, json = a.json;
    long long K = a.K, n_gen = a.n_gen, n_prompt = a.n_prompt, reps = a.reps;
    double temp = a.temp;
    if (use_mtp && (draft_path || !o.model)) {
        fprintf(stderr, "pagekv bench spec: --mtp takes the MTP head of -m FILE (not with --draft)\n");
        return 2;
    }
    if (a.ngram && (draft_path || use_mtp || draft_dev)) {
        fprintf(stderr, "pagekv bench spec: --spec ngram needs no draft model (not with --draft, --mtp or --draft-device)\n");
        return 2;
    }
    if (use_mtp) draft_path = o.model;
    if (!o.n_ctx) o.n_ctx = (int)(n_prompt + n_gen + 64);
    pkv_model *m = pkv_cli_open_model("bench spec", &o);
    if (!m) return 1;
    int rc = 1;
    pkv_model *draft = NULL;
    pkv_engine *plain_e = NULL, *spec_e = NULL;
    pkv_kv_cache *c = NULL;
    pkv_context *ctx = NULL;
    int32_t *prompt = NULL;
    static gen plain_out, spec_out;
    pkv_model_info info, di;
    pkv_model_get_info(m, &info);
    pkv_device *tdev = pkv_model_device(m);
    pkv_model_params dp = pkv_model_default_params();
    if (!draft_dev || !strcmp(draft_dev, pkv_device_name(tdev))) dp.device_handle = tdev;
    else dp.device = draft_dev;
    dp.n_threads = o.threads;
    dp.mtp = use_mtp;
    if (draft_path && !(draft = pkv_model_load(draft_path, dp))) {
        fprintf(stderr, "pagekv bench spec: cannot load the draft %s: %s\n", draft_path, pkv_errmsg());
        goto out;
    }
    pkv_model *dm = a.ngram ? NULL : draft ? draft : m; /* without --draft the target drafts for itself */
    if (dm) pkv_model_get_info(dm, &di);
    else memset(&di, 0, sizeof di);
    const char *draft_name = a.ngram ? "ngram" : draft_path ? draft_path : "(target)";
    /* an engine for each request, made before it and freed after it: an engine's
     * model may not be used by anything else while it lives (the first engine with
     * the draft is made before anything runs: a draft it refuses ends the command) */
    if (!(spec_e = open_engine(m, &o, dm, a.ngram, draft_name, (int)K, a.accept))) goto out;
    pkv_engine_free(spec_e);
    spec_e = NULL;
    prompt = malloc((size_t)n_prompt * sizeof *prompt);
    if (!prompt) {
        pkv_cli_fail("bench spec", "prompt", PKV_ERR_NOMEM);
        goto out;
    }
    uint64_t x = 42;
    for (long long i = 0; i < n_prompt; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)info.n_vocab);
    }
    const char *workload = a.workload ? a.workload : "random";
    if (!strcmp(workload, "edit")) { /* passage [0, h), a separator at h, then the passage again from its start, edited */
        long long h = n_prompt / 2;
        for (long long i = h + 1, j = 0; i < n_prompt; i++, j++)
            prompt[i] = j % 8 == 7 ? prompt[i] : prompt[j % (h ? h : 1)];
    }
    if (!strcmp(workload, "echo") && n_prompt >= 3) { /* P, G = the target's greedy continuation of P, P */
        long long t = n_prompt / 3;
        pkv_request_params gp = pkv_request_default_params();
        gp.prompt = prompt;
        gp.n_prompt = (int32_t)t;
        gp.max_tokens = (int32_t)(n_prompt - 2 * t);
        gp.sampling.temp = 0;
        gp.ignore_eos = true;
        run_cost gc;
        pkv_status es = PKV_OK;
        if (!(plain_e = open_engine(m, &o, NULL, false, NULL, (int)K, a.accept))) goto out;
        es = run_request(plain_e, gp, &plain_out, &gc);
        pkv_engine_free(plain_e);
        plain_e = NULL;
        if (es) {
            pkv_cli_fail("bench spec", "the echo workload's continuation", es);
            goto out;
        }
        memcpy(prompt + t, plain_out.t, (size_t)plain_out.n * sizeof *prompt);
        memcpy(prompt + t + plain_out.n, prompt, (size_t)t * sizeof *prompt);
        n_prompt = 2 * t + plain_out.n;
    }
    /* one request each, the same for both: the prompt, n tokens, the sampling */
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = prompt;
    rp.n_prompt = (int32_t)n_prompt;
    rp.max_tokens = (int32_t)n_gen;
    rp.sampling.temp = (float)temp;
    rp.sampling.top_k = 0;
    rp.sampling.top_p = 1;
    rp.sampling.min_p = 0;
    rp.sampling.seed = 1;
    /* the decoding after the first token, timed from its event to the final one */
    double best_plain = 1e30, best_spec = 1e30;
    run_cost plain_cost, st = {0};
    pkv_status s = PKV_OK;
    for (long long r = 0; r < reps && !s; r++) {
        if (!(plain_e = open_engine(m, &o, NULL, false, NULL, (int)K, a.accept))) goto out;
        if ((s = run_request(plain_e, rp, &plain_out, &plain_cost))) break;
        pkv_engine_free(plain_e);
        plain_e = NULL;
        double t = plain_out.t_end - plain_out.t_first;
        if (t < best_plain) best_plain = t;
        if (!(spec_e = open_engine(m, &o, dm, a.ngram, draft_name, (int)K, a.accept))) goto out;
        if ((s = run_request(spec_e, rp, &spec_out, &st))) break;
        pkv_engine_free(spec_e);
        spec_e = NULL;
        t = spec_out.t_end - spec_out.t_first;
        if (t < best_spec) best_spec = t;
    }
    /* The batching the speed-up rests on: one target step of K + 1 tokens vs one of
     * 1 token, at the end of the prompt. This measures the model (a forward pass of
     * either size), not generation, so it stays on the context API, on a cache of
     * its own once the engines are gone (their model may not be shared). */
    pkv_engine_free(spec_e); /* after an error: the engine it came from */
    pkv_engine_free(plain_e);
    spec_e = plain_e = NULL;
    double step1 = 1e30, stepK = 1e30;
    float *all = NULL;
    if (!s && !(c = pkv_cli_open_cache("bench spec", m, &o, 1))) goto out;
    if (!s && !(ctx = pkv_context_create(m, c, o.n_ctx))) s = PKV_ERR_NOMEM;
    if (!s) s = pkv_context_decode(ctx, prompt, (int32_t)n_prompt);
    if (!s && !(all = malloc((size_t)(K + 1) * (size_t)info.n_vocab * sizeof(float)))) s = PKV_ERR_NOMEM;
    for (int r = 0; r < 5 && !s; r++) {
        int64_t n0 = pkv_context_n_tokens(ctx);
        double t0 = pkv_time_now_cli();
        if ((s = pkv_context_decode(ctx, prompt, 1))) break;
        double t1 = pkv_time_now_cli();
        if ((s = pkv_context_truncate(ctx, n0)) || (s = pkv_context_decode_all(ctx, prompt, (int32_t)K + 1, all))) break;
        double t2 = pkv_time_now_cli();
        if ((s = pkv_context_truncate(ctx, n0))) break;
        if (t1 - t0 < step1) step1 = t1 - t0;
        if (t2 - t1 < stepK) stepK = t2 - t1;
    }
    free(all);
    if (s) {
        pkv_cli_fail("bench spec", "generate", s);
        goto out;
    }
    /* the decoding's tokens: all but the first, which the prefill step sampled */
    double plain_tps = plain_out.n > 1 ? (plain_out.n - 1) / best_plain : 0;
    double spec_tps = spec_out.n > 1 ? (spec_out.n - 1) / best_spec : 0;
    double acc = st.drafted ? (double)st.accepted / (double)st.drafted : 0;
    double per_step = st.target_steps ? (double)(spec_out.n - 1) / (double)st.target_steps : 0;
    bool same = plain_out.n == spec_out.n && !memcmp(plain_out.t, spec_out.t, (size_t)plain_out.n * sizeof(int32_t));
    const char *kind = a.ngram ? "ngram" : di.assistant ? "assistant" : di.shared_kv ? "shared-kv" : "own-cache";
    const char *accept = a.accept == PKV_DRAFT_ACCEPT_MATCH ? "match" : "sampling";
    if (json) {
        printf("{\"target\": \"%s\", \"draft\": \"%s\", \"draft_kind\": \"%s\", \"device\": \"%s\", \"draft_device\": \"%s\", "
               "\"target_layers\": %d, \"draft_layers\": %d, \"draft_max\": %lld, \"accept\": \"%s\", \"temp\": %g, "
               "\"workload\": \"%s\", \"prompt_tokens\": %lld, "
               "\"n_tokens\": %d, \"acceptance_rate\": %.4f, \"tokens_per_target_step\": %.3f, \"target_steps\": %lld, "
               "\"draft_steps\": %lld, \"plain_tok_s\": %.1f, \"spec_tok_s\": %.1f, \"speedup\": %.3f, \"greedy_match\": %s, "
               "\"step_ms_1_token\": %.3f, \"step_ms_k1_tokens\": %.3f, \"ideal_speedup\": %.3f}\n",
               o.model ? o.model : "builtin", draft_name, kind, pkv_device_name(tdev),
               dm ? pkv_device_name(pkv_model_device(dm)) : "none", info.n_layer, di.n_layer, K, accept, temp, workload,
               n_prompt, spec_out.n, acc,
               per_step, (long long)st.target_steps, (long long)st.draft_steps, plain_tps, spec_tps,
               plain_tps > 0 ? spec_tps / plain_tps : 0, temp == 0 ? (same ? "true" : "false") : "null", 1e3 * step1,
               1e3 * stepK, (double)(K + 1) * step1 / stepK);
    } else {
        printf("target %s (%d layers) on %s, draft %s (%s, %d layers) on %s, draft-max %lld, accept %s, workload %s\n",
               o.model ? o.model : "builtin", info.n_layer, pkv_device_name(tdev), draft_name, kind, di.n_layer,
               dm ? pkv_device_name(pkv_model_device(dm)) : "none", K, accept, workload);
        printf("acceptance %.1f%%, %.2f tokens per target step, plain %.1f tok/s, speculative %.1f tok/s, speed-up %.2fx%s\n",
               100 * acc, per_step, plain_tps, spec_tps, plain_tps > 0 ? spec_tps / plain_tps : 0,
               temp == 0 ? (same ? " (greedy outputs identical)" : " (greedy outputs DIFFER)") : "");
        printf("target step: 1 token %.3f ms, %lld tokens %.3f ms: a free draft accepted always would give %.2fx\n",
               1e3 * step1, K + 1, 1e3 * stepK, (double)(K + 1) * step1 / stepK);
    }
    rc = temp == 0 && !same ? 1 : 0;
out:
    free(prompt);
    pkv_engine_free(spec_e); /* the engines before their models */
    pkv_engine_free(plain_e);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(draft);
    pkv_model_free(m);
    return rc;
}
