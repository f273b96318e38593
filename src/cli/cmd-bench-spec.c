/* pagekv bench spec: speculative decoding against plain decoding in the same run
 * (same target, same prompt, same sampler settings): acceptance rate, tokens
 * per target step and the speed-up in tokens/s. Without --draft the target is
 * its own draft (own cache): every proposal is accepted, so the figures show the
 * mechanics (K + 1 tokens per target step) and their cost, not a useful draft.
 * It also times one target step of 1 token and of K + 1 tokens: their ratio
 * bounds what any draft can gain on this device (ideal_speedup = (K + 1) x
 * step(1) / step(K + 1), a free draft that is always right). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

static void usage(FILE *f) {
    fprintf(f, "usage: pagekv bench spec [-m TARGET.gguf] [--draft FILE] [options] [--json]\n"
               "Speculative vs plain decoding of the same target from the same prompt.\n"
               "Without -m the built-in tiny model; without --draft the target is its own draft\n"
               "(own cache: acceptance 1, so this shows the mechanics and their overhead).\n"
               "  --draft FILE          draft model (own-cache, shared-KV or a Gemma 4 assistant,\n"
               "                        see docs/speculative.md)\n"
               "  --draft-device NAME   draft device (default: the target's)\n"
               "  --mtp                 the MTP head of -m FILE as the draft (qwen35 with nextn layers)\n"
               "  --draft-max N         tokens proposed per round (default 4)\n"
               "  -n N                  tokens to generate per run (default 128)\n"
               "  --prompt-tokens N     prompt length, random token ids (default 32)\n"
               "  --temp T              0 = greedy (default); > 0 samples (top-k/p/min-p off)\n"
               "  --reps N              runs of each, the fastest counts (default 3)\n"
               "  -d, -t, -c, --page-size, --kv-type   as for run\n"
               "  --json                one JSON object\n");
}

typedef struct {
    int32_t t[1 << 14];
    int n;
} toks;

static bool keep(int32_t tok, void *user) {
    toks *l = user;
    if (l->n < (int)(sizeof l->t / sizeof l->t[0])) l->t[l->n++] = tok;
    return true;
}

/* What `pagekv bench spec` was asked. */
typedef struct spec_opts {
    pkv_cli_model_opts o; /* first: pkv_cli_model_more */
    const char *draft_path, *draft_dev;
    bool use_mtp, json, help;
    long long K, n_gen, n_prompt, reps;
    double temp;
} spec_opts;

#define SPEC_OPT(...) PKV_CLI_OPT(spec_opts, __VA_ARGS__)
static const pkv_cli_opt spec_options[] = {
    SPEC_OPT("-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    SPEC_OPT("--draft", NULL, PKV_CLI_STR, draft_path, 0, 0),
    SPEC_OPT("--mtp", NULL, PKV_CLI_FLAG, use_mtp, 0, 0),
    SPEC_OPT("--draft-device", NULL, PKV_CLI_STR, draft_dev, 0, 0),
    SPEC_OPT("--draft-max", NULL, PKV_CLI_LLONG, K, 1, 64),
    SPEC_OPT("-n", NULL, PKV_CLI_LLONG, n_gen, 1, 1 << 14),
    SPEC_OPT("--prompt-tokens", NULL, PKV_CLI_LLONG, n_prompt, 1, 1 << 16),
    SPEC_OPT("--reps", NULL, PKV_CLI_LLONG, reps, 1, 100),
    SPEC_OPT("--temp", NULL, PKV_CLI_DOUBLE, temp, 0, 100),
    SPEC_OPT("--json", NULL, PKV_CLI_FLAG, json, 0, 0),
};
#undef SPEC_OPT
static const pkv_cli_cmd spec_cmd = {"bench spec", spec_options, sizeof spec_options / sizeof spec_options[0],
                                     offsetof(spec_opts, help), usage, pkv_cli_model_more, true, false, 0};

int pkv_cli_bench_spec(int argc, char **argv) {
    spec_opts a = {.K = 4, .n_gen = 128, .n_prompt = 32, .reps = 3};
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
    if (use_mtp) draft_path = o.model;
    if (!o.n_ctx) o.n_ctx = (int)(n_prompt + n_gen + 64);
    pkv_model *m = pkv_cli_open_model("bench spec", &o);
    if (!m) return 1;
    int rc = 1;
    pkv_model *draft = NULL;
    pkv_kv_cache *c = NULL;
    pkv_context *ctx = NULL;
    pkv_spec *spec = NULL;
    pkv_sampler *smp = NULL;
    int32_t *prompt = NULL;
    static toks plain_out, spec_out;
    pkv_model_info info, di;
    pkv_model_get_info(m, &info);
    pkv_device *tdev = pkv_model_device(m);
    if (draft_path) {
        pkv_model_params dp = pkv_model_default_params();
        if (!draft_dev || !strcmp(draft_dev, pkv_device_name(tdev))) dp.device_handle = tdev;
        else dp.device = draft_dev;
        dp.n_threads = o.threads;
        dp.mtp = use_mtp;
        if (!(draft = pkv_model_load(draft_path, dp))) {
            fprintf(stderr, "pagekv bench spec: cannot load the draft %s: %s\n", draft_path, pkv_errmsg());
            goto out;
        }
    }
    pkv_model *dm = draft ? draft : m;
    pkv_model_get_info(dm, &di);
    if (!(c = pkv_cli_open_cache("bench spec", m, &o, 2))) goto out;
    if (!(ctx = pkv_context_create(m, c, o.n_ctx))) {
        pkv_cli_fail("bench spec", "context", PKV_ERR_NOMEM);
        goto out;
    }
    pkv_spec_params spp = pkv_spec_default_params();
    spp.draft_max = (int)K;
    spp.draft_cache.page_size = o.page_size;
    spp.draft_cache.kv_type = o.kv_type;
    spp.draft_cache.kv_type_v = o.kv_type_v;
    if (!(spec = pkv_spec_create(ctx, dm, spp))) {
        fprintf(stderr, "pagekv bench spec: draft %s: %s\n", draft_path ? draft_path : "(the target)", pkv_errmsg());
        goto out;
    }
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.temp = (float)temp;
    sp.top_k = 0;
    sp.top_p = 1;
    sp.min_p = 0;
    sp.seed = 1;
    if (!(smp = pkv_sampler_create(sp, info.n_vocab))) {
        pkv_cli_fail("bench spec", "sampler", PKV_ERR_INVALID);
        goto out;
    }
    prompt = malloc((size_t)n_prompt * sizeof *prompt);
    if (!prompt) goto out;
    uint64_t x = 42;
    for (long long i = 0; i < n_prompt; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)info.n_vocab);
    }
    double best_plain = 1e30, best_spec = 1e30;
    pkv_spec_stats st = {0};
    pkv_status s = PKV_OK;
    for (long long r = 0; r < reps && !s; r++) {
        /* plain: the prompt, then one token per step */
        if ((s = pkv_context_truncate(ctx, 0)) || (s = pkv_context_decode(ctx, prompt, (int32_t)n_prompt))) break;
        pkv_sampler_reset(smp);
        plain_out.n = 0;
        double t0 = pkv_time_now_cli();
        if ((s = pkv_generate(ctx, smp, (int)n_gen, keep, &plain_out, NULL))) break;
        double t = pkv_time_now_cli() - t0;
        if (t < best_plain) best_plain = t;
        /* speculative, from the same state (the draft catches up untimed) */
        if ((s = pkv_context_truncate(ctx, 0)) || (s = pkv_context_decode(ctx, prompt, (int32_t)n_prompt))) break;
        pkv_sampler_reset(smp);
        spec_out.n = 0;
        t0 = pkv_time_now_cli();
        if ((s = pkv_spec_generate(spec, smp, (int)n_gen, keep, &spec_out, &st))) break;
        t = pkv_time_now_cli() - t0;
        if (t < best_spec) best_spec = t;
    }
    /* the batching the speed-up rests on: one target step of K + 1 tokens vs one of 1 token */
    double step1 = 1e30, stepK = 1e30;
    float *all = s ? NULL : malloc((size_t)(K + 1) * (size_t)info.n_vocab * sizeof(float));
    if (!s && !all) s = PKV_ERR_NOMEM;
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
    double plain_tps = plain_out.n / best_plain, spec_tps = spec_out.n / best_spec;
    double acc = st.drafted ? (double)st.accepted / (double)st.drafted : 0;
    double per_step = st.target_steps ? (double)st.n_tokens / (double)st.target_steps : 0;
    bool same = plain_out.n == spec_out.n && !memcmp(plain_out.t, spec_out.t, (size_t)plain_out.n * sizeof(int32_t));
    const char *kind = di.assistant ? "assistant" : di.shared_kv ? "shared-kv" : "own-cache";
    if (json) {
        printf("{\"target\": \"%s\", \"draft\": \"%s\", \"draft_kind\": \"%s\", \"device\": \"%s\", \"draft_device\": \"%s\", "
               "\"target_layers\": %d, \"draft_layers\": %d, \"draft_max\": %lld, \"temp\": %g, \"prompt_tokens\": %lld, "
               "\"n_tokens\": %d, \"acceptance_rate\": %.4f, \"tokens_per_target_step\": %.3f, \"target_steps\": %lld, "
               "\"draft_steps\": %lld, \"plain_tok_s\": %.1f, \"spec_tok_s\": %.1f, \"speedup\": %.3f, \"greedy_match\": %s, "
               "\"step_ms_1_token\": %.3f, \"step_ms_k1_tokens\": %.3f, \"ideal_speedup\": %.3f}\n",
               o.model ? o.model : "builtin", draft_path ? draft_path : "(target)", kind, pkv_device_name(tdev),
               pkv_device_name(pkv_model_device(dm)), info.n_layer, di.n_layer, K, temp, n_prompt, spec_out.n, acc, per_step,
               (long long)st.target_steps, (long long)st.draft_steps, plain_tps, spec_tps, spec_tps / plain_tps,
               temp == 0 ? (same ? "true" : "false") : "null", 1e3 * step1, 1e3 * stepK, (double)(K + 1) * step1 / stepK);
    } else {
        printf("target %s (%d layers) on %s, draft %s (%s, %d layers) on %s, draft-max %lld\n", o.model ? o.model : "builtin",
               info.n_layer, pkv_device_name(tdev), draft_path ? draft_path : "(target)", kind, di.n_layer,
               pkv_device_name(pkv_model_device(dm)), K);
        printf("acceptance %.1f%%, %.2f tokens per target step, plain %.1f tok/s, speculative %.1f tok/s, speed-up %.2fx%s\n",
               100 * acc, per_step, plain_tps, spec_tps, spec_tps / plain_tps,
               temp == 0 ? (same ? " (greedy outputs identical)" : " (greedy outputs DIFFER)") : "");
        printf("target step: 1 token %.3f ms, %lld tokens %.3f ms: a free draft accepted always would give %.2fx\n",
               1e3 * step1, K + 1, 1e3 * stepK, (double)(K + 1) * step1 / stepK);
    }
    rc = temp == 0 && !same ? 1 : 0;
out:
    free(prompt);
    pkv_sampler_free(smp);
    pkv_spec_free(spec);
    pkv_model_free(draft);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    return rc;
}
