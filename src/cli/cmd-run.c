/* pagekv run / logits: the model commands, with llama.cpp's
 * option names where they exist. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"
#include "cli/cli-media.h"
#include "cli/commands.h"
#include "pagekv.h"

pkv_model *pkv_cli_open_model(const char *cmd, const pkv_cli_model_opts *o) { return pkv_setup_open_model(cmd, o); }

/* Parse the options every model command shares. Returns 1 if argv[*i] was one of
 * them, 0 if not, -1 on a bad value. */
int pkv_cli_model_opt(int argc, char **argv, int *i, pkv_cli_model_opts *o) {
    const char *a = argv[*i], *v;
    long long x;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        o->model = v;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!(v = pkv_cli_value(argc, argv, i)) || !pkv_cli_int(a, v, 1, 1024, &x)) return -1;
        o->threads = (int)x;
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores > 0 && x > cores)
            fprintf(stderr, "pagekv: warning: -t %lld is more threads than the %ld cores here: threads will wait for "
                            "each other (slower, not faster)\n", x, cores);
    } else if (!strcmp(a, "--device") || !strcmp(a, "-d")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        o->device = v;
    } else if (!strcmp(a, "--devices")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        o->devices = v;
    } else if (!strcmp(a, "--split")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        o->split = v;
    } else if (!strcmp(a, "--rank-split")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        o->rank_split = v;
    } else if (!strcmp(a, "--kv-on-host")) {
        o->kv_on_host = true;
    } else if (!strcmp(a, "--no-mmap")) {
        o->no_mmap = true;
    } else if (!strcmp(a, "--lora")) { /* FILE[:SCALE]: a scale after the last ':' when it parses as one */
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        if (o->n_lora == PKV_MAX_LORA) {
            fprintf(stderr, "pagekv: --lora given more than %d times (PKV_MAX_LORA)\n", PKV_MAX_LORA);
            return -1;
        }
        const char *colon = strrchr(v, ':');
        char *end = NULL;
        double sc = colon && colon[1] ? strtod(colon + 1, &end) : 0;
        bool scaled = end && !*end && end != colon + 1;
        size_t len = scaled ? (size_t)(colon - v) : strlen(v);
        if (scaled && !(sc >= -1e6 && sc <= 1e6)) {
            fprintf(stderr, "pagekv: --lora %s: the scale must be a number in [-1e6, 1e6]\n", v);
            return -1;
        }
        if (!len || len >= sizeof o->lora[0]) {
            fprintf(stderr, "pagekv: --lora '%s': expected FILE[:SCALE]\n", v);
            return -1;
        }
        memcpy(o->lora[o->n_lora], v, len);
        o->lora[o->n_lora][len] = 0;
        o->lora_scale[o->n_lora++] = scaled ? (float)sc : 1.0f;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (!(v = pkv_cli_value(argc, argv, i)) || !pkv_cli_int(a, v, 1, 1 << 24, &x)) return -1;
        o->n_ctx = (int)x;
    } else if (!strcmp(a, "--page-size")) {
        if (!(v = pkv_cli_value(argc, argv, i)) || !pkv_cli_int(a, v, 1, PKV_KV_MAX_PAGE_SIZE, &x)) return -1;
        o->page_size = (int)x;
    } else if (!strcmp(a, "--kv-type") || !strcmp(a, "--kv-type-k") || !strcmp(a, "--kv-type-v")) {
        int t;
        if (!(v = pkv_cli_value(argc, argv, i)) || !pkv_cli_kv_type(a, v, &t)) return -1;
        if (strcmp(a, "--kv-type-v")) o->kv_type = t;
        if (strcmp(a, "--kv-type-k")) o->kv_type_v = t;
    } else {
        return 0;
    }
    return 1;
}

int pkv_cli_model_more(int argc, char **argv, int *i, void *opts) {
    return pkv_cli_model_opt(argc, argv, i, (pkv_cli_model_opts *)opts);
}

pkv_cli_model_opts pkv_cli_model_defaults(void) {
    pkv_cli_model_opts o;
    memset(&o, 0, sizeof o);
    o.kv_type = PKV_TYPE_F16;
    o.kv_type_v = PKV_TYPE_F16;
    return o;
}

const char *pkv_cli_kv_desc(const pkv_cli_model_opts *o) {
    static char buf[64];
    const char *k = pkv_type_name((pkv_type)o->kv_type), *v = pkv_type_name((pkv_type)o->kv_type_v);
    if (o->kv_type == o->kv_type_v) snprintf(buf, sizeof buf, "%s KV", k);
    else snprintf(buf, sizeof buf, "K %s V %s KV", k, v);
    return buf;
}

/* Says on stderr why the KV cache of n_seq sequences could not be created. */
static void cache_fail(const char *cmd, pkv_model *m, const pkv_cli_model_opts *o, int n_seq) {
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    int64_t ctx = o->n_ctx ? o->n_ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
    fprintf(stderr, "pagekv %s: cannot create the KV cache (%d sequence%s of up to %lld tokens): %s%s\n", cmd, n_seq,
            n_seq == 1 ? "" : "s", (long long)ctx, pkv_errmsg(),
            strstr(pkv_errmsg(), "memory") || strstr(pkv_errmsg(), "alloc") ? " (a smaller -c needs less memory)" : "");
}

pkv_kv_cache *pkv_cli_open_cache_pages(const char *cmd, pkv_model *m, const pkv_cli_model_opts *o, int n_seq,
                                       int64_t n_pages) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = o->n_ctx;
    cp.page_size = o->page_size;
    cp.kv_type = o->kv_type;
    cp.kv_type_v = o->kv_type_v;
    cp.n_seq_max = n_seq;
    cp.n_pages = n_pages;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    if (!c) cache_fail(cmd, m, o, n_seq);
    return c;
}

pkv_kv_cache *pkv_cli_open_cache(const char *cmd, pkv_model *m, const pkv_cli_model_opts *o, int n_seq) {
    return pkv_cli_open_cache_pages(cmd, m, o, n_seq, 0);
}

/* ------------------------------------------------------------------ run */

typedef struct {
    pkv_model *m;
    char buf[256];
    bool stream;
    bool out_failed; /* stdout could not be written: generation stops */
    int32_t last;    /* the last token generated (-1: none) */
    char *text; /* accumulated output (for --fork) */
    size_t len, cap;
    int32_t *ids; /* every generated id (for --ids-out) */
    size_t n_ids, cap_ids;
} printer;

static bool emit_token(int32_t tok, void *user) {
    printer *p = user;
    size_t n = 0;
    p->last = tok;
    if (p->n_ids == p->cap_ids) {
        size_t nc = p->cap_ids ? 2 * p->cap_ids : 64;
        int32_t *t = realloc(p->ids, nc * sizeof *t);
        if (!t) return false;
        p->ids = t;
        p->cap_ids = nc;
    }
    p->ids[p->n_ids++] = tok;
    if (pkv_model_token_piece(p->m, tok, false, p->buf, sizeof p->buf, &n)) return true;
    if (p->stream) {
        if (fwrite(p->buf, 1, n, stdout) != n || fflush(stdout) != 0) {
            p->out_failed = true;
            return false;
        }
    } else {
        if (p->len + n + 1 > p->cap) {
            size_t nc = (p->len + n + 1) * 2;
            char *t = realloc(p->text, nc);
            if (!t) return false;
            p->text = t;
            p->cap = nc;
        }
        memcpy(p->text + p->len, p->buf, n);
        p->len += n;
        p->text[p->len] = 0;
    }
    return true;
}


/* --spec-log: one JSON object per round of the engine (one request: id and sample
 * need no saying) */
static void log_engine_round(uint64_t id, int sample, const pkv_spec_round *r, void *user) {
    FILE *f = user;
    (void)id, (void)sample;
    fprintf(f, "{\"pos\": %lld, \"proposed\": [", (long long)r->pos);
    for (int i = 0; i < r->n_proposed; i++) fprintf(f, "%s%d", i ? ", " : "", r->proposed[i]);
    fprintf(f, "], \"accepted\": %d}\n", r->n_accepted);
}

/* --ids-out: the ids as a JSON array, through the safe-output path (a temporary
 * renamed over the target); false (said on stderr) when it cannot be written */
static bool write_ids(const char *path, const int32_t *ids, size_t n) {
    pkv_wfile w;
    pkv_status s = pkv_wfile_open(&w, path);
    if (!s) {
        fputc('[', w.f);
        for (size_t i = 0; i < n; i++) fprintf(w.f, "%s%d", i ? ", " : "", ids[i]);
        fputs("]\n", w.f);
        s = pkv_wfile_commit(&w);
    }
    if (s) fprintf(stderr, "pagekv run: --ids-out: %s\n", pkv_errmsg());
    return !s;
}

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: pagekv run [-m FILE.gguf] [-p TEXT | -f FILE] [options]\n"
            "Generates text after the prompt, streaming tokens as they come, and says on stderr\n"
            "why it stopped (end-of-generation token, -n reached, context full).\n"
            "Without -m it uses a built-in tiny model with random weights (and says so).\n"
            "  -m, --model FILE     GGUF model (llama, qwen2, qwen3)\n"
            "  -p, --prompt TEXT    prompt (default \"Once upon a time\")\n"
            "  -f, --file FILE      read the prompt from FILE; '-f -' reads standard input\n"
            "  -n, --n-predict N    tokens to generate (default 64)\n"
            "  --context-shift      when the context is full, drop the older half of the tokens\n"
            "                       (after --keep N and the BOS token) and go on generating\n"
            "  --keep N             tokens at the start kept by --context-shift (default 0)\n"
            "  -t, --threads N      CPU threads (default: all cores)\n"
            "  -c, --ctx-size N     context size in tokens (default: min(model's, 4096))\n"
            "  -d, --device NAME    device (default cpu; see 'pagekv devices')\n"
            "  --devices A,B,...    tensor parallelism: split each layer's heads (whole KV groups)\n"
            "                       and FFN rows over these devices; the KV cache is sharded alike\n"
            "  --split P,Q,...      proportions for --devices (default equal)\n"
            "  --rank-split P,Q,... under mpirun: proportions of the layers each rank holds\n"
            "                       (default equal; docs/distributed.md)\n"
            "  --kv-on-host         keep every KV shard in host memory, split by the same heads;\n"
            "                       attention runs on the host\n"
            "  --no-mmap            copy the weights into memory instead of using the mapped\n"
            "                       file in place (CPU; more memory, a few %% faster here)\n"
            "  --lora FILE[:SCALE]  apply a LoRA adapter GGUF (llama.cpp's convert_lora_to_gguf.py\n"
            "                       layout) with SCALE (default 1); repeatable, up to 8 (docs/lora.md)\n"
            "  --seed S             sampling seed (default: a random seed, printed on stderr as\n"
            "                       'pagekv run: seed S' so that --seed S replays the run; -1 = random)\n"
            "  --ignore-eos         do not stop at end-of-generation tokens: generate -n tokens\n"
            "                       (unless the context is full)\n"
            "  --temp T             temperature; 0 = greedy (default 0.8)\n"
            "  --top-k K --top-p P --min-p P --repeat-penalty R   sampling filters\n"
            "  --page-size N        KV page size in tokens (default 16)\n"
            "Chat (as llama-cli's conversation mode):\n"
            "  -cnv, --conversation read user turns from standard input, a line each ('> ' when it\n"
            "                       is a terminal; /exit or end of input ends) and answer each with\n"
            "                       the model's chat template (tokenizer.chat_template; ChatML when\n"
            "                       it has none), rendered as pagekv serve renders it: special\n"
            "                       tokens parsed in the template's markup, never in message text.\n"
            "                       One context is kept across turns: each turn decodes only what\n"
            "                       the cache does not already hold (stderr says how many prompt\n"
            "                       tokens were reused and how many computed). An answer ends at\n"
            "                       an end-of-generation or end-of-turn token, or after -n tokens.\n"
            "                       When the context fills, the oldest turns are dropped (the\n"
            "                       system message stays) and the chat goes on; a message too\n"
            "                       long for the context alone is not sent (stderr says so).\n"
            "                       Needs a build with pagekv serve (jansson)\n"
            "  -sys, --system-prompt TEXT   the conversation's system message (with -cnv)\n"
            "  --verbose-prompt     with -cnv: each turn's prompt and answer token ids on stderr\n"
            "  --kv-type T          KV cache type of K and V: f16 (default), f32, q8_0, q4_0\n"
            "                       (q8_0/q4_0: GGUF blocks of 32 along each head; head sizes\n"
            "                       must be multiples of 32)\n"
            "  --kv-type-k T, --kv-type-v T   the K or the V type alone\n"
            "  --fork K             after the prompt, fork into K branches (seeds S..S+K-1),\n"
            "                       decode them together in batched steps, print each\n"
            "  --draft FILE         speculative decoding with this draft model (same vocabulary;\n"
            "                       'pagekv mkmodel --draft-of' makes one): greedy output equals\n"
            "                       plain greedy output; sampled output has the target's distribution.\n"
            "                       A gemma4-assistant file (Gemma 4's MTP drafter) drafts from the\n"
            "                       target's hidden states with no KV of its own\n"
            "  --draft-device NAME  device of the draft (default: the target's). A shared-KV draft\n"
            "                       must reach the device that stores the target's KV; an assistant\n"
            "                       runs anywhere: its attention where the target's pages are\n"
            "  --spec ngram         n-gram drafts (prompt lookup): proposals from the sequence's own\n"
            "                       tokens, no draft model; the rule of --draft (greedy output equals\n"
            "                       plain greedy output); for output that repeats the prompt\n"
            "  --draft-max N        tokens the draft proposes per round (default 4, at most 64)\n"
            "  --mtp                the model's own MTP (nextn) head as the draft (qwen35, qwen35moe files with\n"
            "                       nextn_predict_layers): fed the target's hidden states, its own\n"
            "                       one-layer KV cache on the target's device; greedy output equals\n"
            "                       plain decoding\n"
            "Media (docs/multimodal.md, \"Media in the cache\"):\n"
            "  --mmproj FILE        the projector (an mmproj GGUF) for --audio/--image\n"
            "  --audio FILE, --image FILE   media into the prompt (repeatable, in order): each\n"
            "                       <__media__> marker in the prompt places the next file; without\n"
            "                       markers every file goes before the text. The prompt is then\n"
            "                       tokenized with special tokens parsed (your own markup, as\n"
            "                       llama.cpp's mtmd-cli); each file goes between its projector's\n"
            "                       tokens as mtmd puts them (gemma3: <start_of_image> ...\n"
            "                       <end_of_image>; voxtral: [BEGIN_AUDIO] ...)\n"
            "  --media-at K         with --tokens: the next file goes after the first K ids\n"
            "  --embd-out FILE      the projector's rows, raw little-endian float32 [rows][n_embd]\n"
            "For checking against other implementations:\n"
            "  --tokens 1,2,3       the prompt as token ids (as 'pagekv logits' takes it; no -p/-f;\n"
            "                       also for models without a vocabulary)\n"
            "  --ids-out FILE       the generated ids as a JSON array, with the end-of-generation\n"
            "                       token that stopped it (not with --fork)\n"
            "  --spec-log FILE      with --draft/--mtp/--spec ngram: one JSON object per round, a line each: {\"pos\":\n"
            "                       position of the last committed token the draft went on from,\n"
            "                       \"proposed\": [ids], \"accepted\": how many kept}; rounds with\n"
            "                       nothing proposed too (the prompt's own token, the last of -n)\n"
            "Timings (load, prefill and decode tokens/s) go to stderr.\n");
}

/* What `pagekv run` was asked (the options table below fills it). */
typedef struct run_opts {
    pkv_cli_model_opts o; /* first: pkv_cli_model_more */
    pkv_cli_media mo;
    pkv_sampler_params sp;
    const char *prompt, *prompt_file, *system_prompt;
    const char *draft_path, *draft_dev;
    const char *tokens_arg, *ids_out, *spec_log;
    int n_keep, n_predict, n_fork, draft_max;
    bool ctx_shift, use_mtp, ignore_eos, chat, verbose_prompt;
    bool spec_ngram; /* --spec ngram */
    bool random_seed; /* as llama-cli: a random seed unless --seed N, printed */
    bool help;
} run_opts;

static bool run_opt_spec(void *opts, const char *opt, const char *v) {
    if (strcmp(v, "ngram")) {
        fprintf(stderr, "pagekv run: %s %s: the only kind is ngram (a draft model is --draft FILE or --mtp)\n", opt, v);
        return false;
    }
    ((run_opts *)opts)->spec_ngram = true;
    return true;
}

static bool run_opt_seed(void *opts, const char *opt, const char *v) {
    run_opts *r = opts;
    long long x;
    if (!pkv_cli_int(opt, v, -1, INT64_MAX, &x)) return false;
    r->random_seed = x < 0;
    r->sp.seed = (uint64_t)x;
    return true;
}

#define RUN_OPT(...) PKV_CLI_OPT(run_opts, __VA_ARGS__)
static const pkv_cli_opt run_options[] = {
    RUN_OPT("-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    RUN_OPT("-p", "--prompt", PKV_CLI_STR, prompt, 0, 0),
    RUN_OPT("-f", "--file", PKV_CLI_STR, prompt_file, 0, 0),
    RUN_OPT("--context-shift", NULL, PKV_CLI_FLAG, ctx_shift, 0, 0),
    RUN_OPT("--keep", NULL, PKV_CLI_INT, n_keep, 0, 1 << 24),
    RUN_OPT("-n", "--n-predict", PKV_CLI_INT, n_predict, 0, 1 << 24),
    {"--seed", NULL, PKV_CLI_FN, 0, 0, 0, run_opt_seed, true},
    RUN_OPT("--ignore-eos", NULL, PKV_CLI_FLAG, ignore_eos, 0, 0),
    RUN_OPT("-cnv", "--conversation", PKV_CLI_FLAG, chat, 0, 0),
    RUN_OPT("-sys", "--system-prompt", PKV_CLI_STR, system_prompt, 0, 0),
    RUN_OPT("--verbose-prompt", NULL, PKV_CLI_FLAG, verbose_prompt, 0, 0),
    RUN_OPT("--temp", NULL, PKV_CLI_FLOAT, sp.temp, 0, 100),
    RUN_OPT("--top-k", NULL, PKV_CLI_INT, sp.top_k, 0, 1 << 24),
    RUN_OPT("--top-p", NULL, PKV_CLI_FLOAT, sp.top_p, 1e-6, 1),
    RUN_OPT("--min-p", NULL, PKV_CLI_FLOAT, sp.min_p, 0, 1),
    RUN_OPT("--repeat-penalty", NULL, PKV_CLI_FLOAT, sp.repeat_penalty, 1e-3, 100),
    RUN_OPT("--fork", NULL, PKV_CLI_INT, n_fork, 1, 64),
    RUN_OPT("--draft", NULL, PKV_CLI_STR, draft_path, 0, 0),
    RUN_OPT("--draft-device", NULL, PKV_CLI_STR, draft_dev, 0, 0),
    RUN_OPT("--mtp", NULL, PKV_CLI_FLAG, use_mtp, 0, 0),
    {"--spec", NULL, PKV_CLI_FN, 0, 0, 0, run_opt_spec, true},
    RUN_OPT("--tokens", NULL, PKV_CLI_STR, tokens_arg, 0, 0),
    RUN_OPT("--ids-out", NULL, PKV_CLI_STR, ids_out, 0, 0),
    RUN_OPT("--spec-log", NULL, PKV_CLI_STR, spec_log, 0, 0),
    RUN_OPT("--draft-max", NULL, PKV_CLI_INT, draft_max, 1, 64),
};
#undef RUN_OPT

/* The shared model and media options. */
static int run_more(int argc, char **argv, int *i, void *opts) {
    run_opts *r = opts;
    int k = pkv_cli_model_more(argc, argv, i, r);
    return k ? k : pkv_cli_media_opt(argc, argv, i, &r->mo);
}

static const pkv_cli_cmd run_cmd = {"run", run_options, sizeof run_options / sizeof run_options[0],
                                    offsetof(run_opts, help), run_usage, run_more, true, false, 0};

/* Fill r from argv: -1 to go on, else the exit code (help printed: 0; a bad
 * option: 2). */
static int run_parse(int argc, char **argv, run_opts *r) {
    memset(r, 0, sizeof *r);
    r->o = pkv_cli_model_defaults();
    r->sp = pkv_sampler_default_params();
    r->n_predict = 64;
    r->draft_max = 4;
    r->random_seed = true;
    return pkv_cli_parse(&run_cmd, argc, argv, r);
}

/* The options -cnv cannot take, or NULL. */
static const char *run_chat_conflict(const run_opts *r) {
    return r->prompt || r->prompt_file ? "-p/-f (the turns come from standard input)"
           : r->tokens_arg             ? "--tokens"
           : r->n_fork                 ? "--fork"
           : r->draft_path || r->spec_ngram ? "--draft/--mtp/--spec ngram"
           : r->ctx_shift              ? "--context-shift"
           : r->ignore_eos             ? "--ignore-eos (an answer ends at the end-of-turn token)"
           : r->ids_out                ? "--ids-out (--verbose-prompt prints each turn's ids)"
                                       : NULL;
}

/* The combinations of options that do not go together: 0 when they do, else the
 * exit code 2 (said on stderr). --mtp becomes --draft of the model's own file. */
static int run_check(run_opts *r) {
    const char *why = NULL;
    if (r->use_mtp && r->draft_path) why = "give --mtp (the model's own MTP head) or --draft FILE, not both";
    else if (r->spec_ngram && (r->use_mtp || r->draft_path || r->draft_dev))
        why = "--spec ngram needs no draft model (not with --draft, --mtp or --draft-device)";
    else if (r->use_mtp && !r->o.model)
        why = "--mtp needs -m FILE with MTP layers (qwen35; 'pagekv mkmodel --arch qwen35 --mtp 1')";
    if (why) {
        fprintf(stderr, "pagekv run: %s\n", why);
        return 2;
    }
    if (pkv_dist_size() > 1) { /* every rank runs the same program: its inputs must be every rank's */
        if (r->chat || r->use_mtp || r->draft_path || r->mo.n || (r->prompt_file && !strcmp(r->prompt_file, "-")))
            why = "-cnv, --draft, --mtp, --audio/--image and '-f -' (standard input) are not supported under MPI ranks";
        if (pkv_dist_rank() > 0) r->ids_out = r->spec_log = NULL; /* rank 0 alone writes */
    }
    if (why) {
        fprintf(stderr, "pagekv run: %s\n", why);
        return 2;
    }
    if (r->use_mtp) r->draft_path = r->o.model; /* the same file, loaded as its MTP head */
    const bool spec = r->draft_path || r->spec_ngram; /* speculative decoding */
    if (spec && r->n_fork) why = "--draft/--spec ngram and --fork cannot be combined";
    else if (!spec && (r->draft_dev || r->draft_max != 4))
        why = "--draft-device and --draft-max need --draft FILE (--draft-max: or --spec ngram)";
    else if ((r->prompt != NULL) + (r->prompt_file != NULL) + (r->tokens_arg != NULL) > 1)
        why = "give the prompt with one of -p, -f or --tokens";
    else if (r->ids_out && r->n_fork) why = "--ids-out writes one sequence's ids: not with --fork";
    else if (r->spec_log && !spec)
        why = "--spec-log logs the rounds of speculative decoding: it needs --draft FILE, --mtp or --spec ngram";
    else if (r->ctx_shift && (spec || r->n_fork))
        why = "--context-shift works with plain generation (not with --draft, --spec ngram or --fork)";
    else if (r->ignore_eos && spec)
        why = "--ignore-eos works with plain generation and --fork, not with --draft/--mtp/--spec ngram";
    if (why) {
        fprintf(stderr, "pagekv run: %s\n", why);
        return 2;
    }
    if (!pkv_cli_media_check("run", &r->mo)) return 2;
    if (r->mo.n && (r->chat || spec || r->ctx_shift))
        why = "--audio/--image work with plain generation and --fork (not with -cnv, --draft, --mtp, --spec ngram or "
              "--context-shift)";
    else if (r->mo.n_at && !r->tokens_arg)
        why = "--media-at places media among --tokens ids; in a text prompt write <__media__>";
    else if (r->system_prompt && !r->chat) why = "-sys (the system message) needs -cnv (chat mode)";
    if (why) {
        fprintf(stderr, "pagekv run: %s\n", why);
        return 2;
    }
    if (r->chat) {
#ifndef PKV_HAVE_SERVER
        fprintf(stderr, "pagekv run: -cnv needs the chat templates of 'pagekv serve', and this pagekv was built without "
                        "them: install libmicrohttpd-dev and libjansson-dev (scripts/deps.sh) and build again\n");
        return 2;
#else
        const char *bad = run_chat_conflict(r);
        if (bad) {
            fprintf(stderr, "pagekv run: -cnv does not take %s\n", bad);
            return 2;
        }
#endif
    }
    return 0;
}

/* r->prompt from -f (into *buf, freed by the caller), the default, or "" for
 * --tokens; false (said on stderr) when the file cannot be the prompt. */
static bool run_prompt_text(run_opts *r, char **buf) {
    if (r->prompt_file) {
        size_t plen = 0;
        if (!(*buf = pkv_cli_read_text("run", r->prompt_file, &plen))) return false;
        if (strlen(*buf) != plen) {
            fprintf(stderr, "pagekv run: %s contains a NUL byte; the prompt must be text\n", r->prompt_file);
            return false;
        }
        r->prompt = *buf;
    } else if (r->tokens_arg) {
        r->prompt = ""; /* ids, not text */
    } else if (!r->prompt) {
        r->prompt = "Once upon a time";
        if (!isatty(STDIN_FILENO) && !r->chat)
            fprintf(stderr, "pagekv run: no -p or -f given: using the default prompt \"%s\" (standard input is not a "
                            "terminal: to read the prompt from it, use -f -)\n", r->prompt);
    }
    return true;
}

/* pkv_cli_fail for the steps of run that return false on error. */
static bool run_fail(const char *what, pkv_status s) {
    pkv_cli_fail("run", what, s);
    return false;
}

/* What a run holds; run_state_free releases it all. */
typedef struct run_state {
    pkv_model *m;
    pkv_model_info info;
    pkv_engine *eng;   /* every other mode generates through it (run_engine) */
    pkv_context *ctx;  /* --draft/--mtp, --context-shift and -cnv: on c or the engine's cache */
    int64_t n_ctx;     /* the run's context limit (-c) */
    pkv_sampler *smp[1]; /* --draft/--mtp's */
    printer pr[64];    /* one per --fork branch; [0] without --fork */
    double t_first;    /* when the first token came: the prompt is in (the prefill's end) */
    int32_t *toks; /* [n_text] prompt ids */
    pkv_model *draft;
    uint64_t draft_steps_after; /* --draft on the engine: the steps after the first token's */
    pkv_cli_encoded enc;
    size_t n_text;   /* with media: the prompt's text tokens (n_prompt counts the media rows too) */
    size_t n_prompt;
    FILE *spec_f; /* spec_w.f while --spec-log is open */
    pkv_wfile spec_w;
    int generated;
} run_state;

static void run_state_free(run_state *st) {
    pkv_sampler_free(st->smp[0]);
    for (int b = 0; b < 64; b++) {
        free(st->pr[b].text);
        free(st->pr[b].ids);
    }
    if (st->spec_f) pkv_wfile_abort(&st->spec_w); /* an error before the log was complete */
    free(st->toks);
    pkv_cli_encoded_free(&st->enc);
    if (!st->ctx) { /* --draft on the engine (no context): the engine goes before its draft */
        pkv_engine_free(st->eng);
        st->eng = NULL;
    }
    pkv_model_free(st->draft); /* before the target model: it may use the target's device */
    pkv_context_free(st->ctx);
    pkv_engine_free(st->eng); /* after the context: it is on the engine's cache */
    pkv_model_free(st->m);
}

/* The prompt as ids (st->toks), media encoded and placed; false said on stderr. */
static bool run_tokenize(const run_opts *r, run_state *st) {
    pkv_model *m = st->m;
    pkv_status s;
    if (!st->info.has_vocab && !r->tokens_arg) {
        fprintf(stderr, "pagekv run: this model has no vocabulary (tokenizer.ggml.model = none): "
                        "give the prompt as token ids with --tokens 1,2,3\n");
        return false;
    }
    size_t n = 0, len = strlen(r->prompt);
    if (r->tokens_arg) {
        if (!pkv_cli_parse_tokens(r->tokens_arg, &st->toks, &n)) return false;
        for (size_t k = 0; k < n; k++)
            if (st->toks[k] >= st->info.n_vocab) {
                fprintf(stderr, "pagekv run: --tokens: id %d is outside the vocabulary [0, %d)\n", st->toks[k],
                        st->info.n_vocab);
                return false;
            }
    } else if (r->mo.n) {
        if (pkv_cli_media_encode("run", m, &r->mo, &st->enc)) return false;
        if ((s = pkv_cli_media_prompt(m, r->prompt, &st->enc, &st->toks, &n))) return run_fail("prompt", s);
    } else {
        s = pkv_model_tokenize(m, r->prompt, len, true, false, NULL, 0, &n);
        if (s && s != PKV_ERR_INVALID) return run_fail("tokenize", s);
        st->toks = malloc((n + 1) * sizeof *st->toks);
        if (!st->toks || (s = pkv_model_tokenize(m, r->prompt, len, true, false, st->toks, n + 1, &n)))
            return run_fail("tokenize", s ? s : PKV_ERR_NOMEM);
    }
    if (r->mo.n && r->tokens_arg) {
        pkv_cli_encoded *e = &st->enc;
        if (pkv_cli_media_encode("run", m, &r->mo, e)) return false;
        for (int i = 0; i < e->n; i++)
            if (e->rows[i].at > (int32_t)n || (i && e->rows[i].at < e->rows[i - 1].at)) {
                fprintf(stderr, "pagekv run: --media-at %d for file %d: must be in [%d, %zu] (non-decreasing)\n",
                        e->rows[i].at, i + 1, i ? e->rows[i - 1].at : 0, n);
                return false;
            }
    }
    st->n_text = n;
    for (int i = 0; i < st->enc.n; i++) n += (size_t)st->enc.rows[i].n_rows;
    st->n_prompt = n;
    return true;
}

/* The context limit a run gives its requests: -c, else the model's up to 4096. */
static int64_t run_n_ctx(const run_opts *r, const run_state *st) {
    return r->o.n_ctx ? r->o.n_ctx : (st->info.n_ctx_train < 4096 ? st->info.n_ctx_train : 4096);
}

/* Every mode generates through the serving engine (docs/engine.md, "pagekv
 * run"). Its cache holds n_seq sequences (n_pages: 0 =
 * enough for all) of up to -c tokens and one more: the loops run before never
 * decoded the last token they sampled, the engine does on a context, so one
 * position more lets a request generate as many tokens as they did (st->n_ctx
 * stays the limit the user gave). */
static bool run_engine_open(const run_opts *r, run_state *st, int n_seq, int64_t n_pages) {
    const pkv_cli_model_opts *o = &r->o;
    pkv_engine_params ep = pkv_engine_default_params();
    ep.cache.n_ctx = (int)run_n_ctx(r, st) + 1;
    ep.cache.page_size = o->page_size;
    ep.cache.kv_type = o->kv_type;
    ep.cache.kv_type_v = o->kv_type_v;
    ep.cache.n_seq_max = n_seq;
    ep.cache.n_pages = n_pages;
    ep.max_seqs = n_seq;
    /* one request: its prompt in one step, as a pkv_context_decode of it was (and a
     * non-causal media chunk must fit one); with a draft the engine's default, as
     * run --draft has had on the engine (the chunks decide which rounds propose) */
    ep.max_batch_tokens = st->draft || r->spec_ngram ? 0 : ep.cache.n_ctx;
    ep.prefix_cache = false; /* one request at a time: nothing to share */
    if (st->draft || r->spec_ngram) { /* the speculative-sampling rule: pkv_spec's, which run used before the engine */
        ep.draft = st->draft;
        ep.draft_ngram = r->spec_ngram;
        ep.draft_max = r->draft_max;
        ep.draft_accept = PKV_DRAFT_ACCEPT_SAMPLING;
        if (st->spec_f) {
            ep.on_draft_round = log_engine_round;
            ep.draft_round_user = st->spec_f;
        }
    }
    if (!(st->eng = pkv_engine_create(st->m, ep))) {
        if (st->draft || r->spec_ngram)
            fprintf(stderr, "pagekv run: draft %s: %s\n", r->spec_ngram ? "ngram" : r->draft_path, pkv_errmsg());
        else cache_fail("run", st->m, o, n_seq);
        return false;
    }
    st->n_ctx = run_n_ctx(r, st);
    return true;
}

/* The engine (with --fork a pool sized for the branches; with --context-shift a
 * context on it; with --draft/--mtp the draft, of any kind). */
static bool run_open_context(const run_opts *r, run_state *st) {
    const pkv_cli_model_opts *o = &r->o;
    size_t n_prompt = st->n_prompt;
    if (r->n_fork) {
        /* K branches share the prompt's pages; each needs pages only for what it
         * generates (plus its copy of the shared partial page) */
        int ps = o->page_size ? o->page_size : 16;
        int64_t n_ctx = run_n_ctx(r, st);
        int64_t n_gen = r->n_predict < n_ctx - (int64_t)n_prompt ? r->n_predict : n_ctx - (int64_t)n_prompt;
        if (n_gen < 0) n_gen = 0;
        int64_t shared = ((int64_t)n_prompt + ps - 1) / ps;
        int64_t per = ((int64_t)n_prompt + n_gen + ps - 1) / ps - (int64_t)n_prompt / ps;
        if (!run_engine_open(r, st, r->n_fork + 1, shared + r->n_fork * per)) return false;
        fprintf(stderr, "pagekv run: KV pool of %lld pages: the prompt's %lld shared by %d branches, %lld more each\n",
                (long long)(shared + r->n_fork * per), (long long)shared, r->n_fork, (long long)per);
        return true;
    }
    /* a context shift writes the pages after the cut into fresh ones first */
    if (!run_engine_open(r, st, r->ctx_shift ? 2 : 1, 0)) return false;
    if (r->ctx_shift && !(st->ctx = pkv_context_create(st->m, pkv_engine_cache(st->eng), st->n_ctx))) {
        fprintf(stderr, "pagekv run: %s\n", pkv_errmsg());
        return false;
    }
    return true;
}

#ifdef PKV_HAVE_SERVER
/* -cnv: hand the engine and a context on it to the chat loop (cmd-run-chat.c);
 * the context has the engine's one position more (its requests run their last
 * token in), the chat keeps to -c. Returns the exit code. */
static int run_chat(const run_opts *r, run_state *st) {
    if (!st->info.has_vocab) {
        fprintf(stderr, "pagekv run: -cnv needs a model with a vocabulary (tokenizer.ggml.model is none)\n");
        return 1;
    }
    if (!run_engine_open(r, st, 1, 0)) return 1;
    if (!(st->ctx = pkv_context_create(st->m, pkv_engine_cache(st->eng), st->n_ctx + 1))) {
        fprintf(stderr, "pagekv run: %s\n", pkv_errmsg());
        return 1;
    }
    pkv_cli_chat_opts co = {.model_path = r->o.model, .system = r->system_prompt, .kv = &r->o, .sp = r->sp,
                            .n_predict = r->n_predict, .verbose_prompt = r->verbose_prompt, .n_ctx = st->n_ctx};
    return pkv_cli_run_chat(st->eng, st->ctx, &co);
}
#endif

/* --draft/--mtp: load the draft (before the cache: the engine takes it). */
static bool run_load_draft(const run_opts *r, run_state *st) {
    pkv_model_params dp = pkv_model_default_params();
    pkv_device *tdev = pkv_model_device(st->m);
    if (!r->draft_dev || !strcmp(r->draft_dev, pkv_device_name(tdev))) dp.device_handle = tdev;
    else dp.device = r->draft_dev;
    dp.n_threads = r->o.threads;
    dp.mtp = r->use_mtp;
    if (!(st->draft = pkv_model_load(r->draft_path, dp))) {
        fprintf(stderr, "pagekv run: cannot load the draft %s: %s\n", r->draft_path, pkv_errmsg());
        return false;
    }
    return true;
}

/* --draft/--mtp: say where the draft's parts run (pkv_engine_create attached it:
 * I6 failed there, before anything was generated). */
static bool run_attach_draft(const run_opts *r, run_state *st) {
    pkv_device *tdev = pkv_model_device(st->m);
    pkv_model_info di;
    pkv_model_get_info(st->draft, &di);
    if (di.assistant) { /* where each part runs: docs/speculative.md */
        pkv_kv_shard_info sh;
        const char *kv_dev = pkv_kv_shard(pkv_engine_cache(st->eng), 0, 0, &sh) ? "?" : pkv_device_name(sh.storage);
        fprintf(stderr, "pagekv run: draft %s (Gemma 4 assistant): %d layers on %s, no KV of its own: its attention runs "
                        "over the target's pages where they are stored (%s%s), its input embedding is the target's (on %s); "
                        "up to %d tokens per round\n",
                r->draft_path, di.n_layer, pkv_device_name(pkv_model_device(st->draft)), kv_dev,
                st->info.n_devices > 1 ? " and the target's other shards" : "", pkv_device_name(tdev), r->draft_max);
    } else {
        fprintf(stderr, "pagekv run: draft %s%s: %d layers on %s, %s, up to %d tokens per round\n", r->draft_path,
                di.mtp ? " (its MTP head)" : "", di.n_layer, pkv_device_name(pkv_model_device(st->draft)),
                di.shared_kv ? "shares the target's KV cache" : "own KV cache", r->draft_max);
    }
    return true;
}

/* The engine's events of run_engine's request: each sample's tokens to its
 * printer as they come. */
typedef struct run_gen {
    const run_opts *r;
    run_state *st;
    bool started;      /* a token came: the prompt is in, and echoed */
    bool emit_failed;  /* standard output could not be written */
    bool discard;      /* -n 0: the prompt alone; its first token is not shown */
    int n_final;
    const char *why[64]; /* each sample's reason to stop: "n", "output", "eog", "full" */
    int64_t shifted;   /* tokens the context shift dropped */
    pkv_status status; /* of a final event with finish ERROR */
    char message[512];
} run_gen;

static bool run_event(const pkv_engine_event *ev, void *user) {
    run_gen *g = user;
    run_state *st = g->st;
    if (ev->token >= 0 && !g->started) { /* the prefill is done: the prompt is echoed, as it was after it */
        g->started = true;
        st->t_first = pkv_time_now_cli();
        fwrite(g->r->prompt, 1, strlen(g->r->prompt), stdout);
        fflush(stdout);
        if (g->r->n_fork) fputc('\n', stdout);
    }
    printer *pr = &st->pr[ev->sample];
    bool go = !g->discard;
    if (ev->token >= 0 && go && !g->emit_failed) {
        st->generated++;
        /* (a branch's text is only collected: --fork goes on as it did) */
        if (!emit_token(ev->token, pr) && pr->stream) g->emit_failed = true;
        go = !g->emit_failed;
    }
    if (ev->finish == PKV_FINISH_NONE) return go;
    g->n_final++;
    g->shifted = ev->n_shifted;
    const char *why = "n";
    if (ev->finish == PKV_FINISH_ERROR) {
        g->status = ev->status ? ev->status : PKV_ERR_INVALID;
        snprintf(g->message, sizeof g->message, "%s", ev->message ? ev->message : "");
    } else if (g->emit_failed) {
        why = "output";
    } else if (ev->finish == PKV_FINISH_STOP && ev->stop_token) {
        why = "eog";
    } else if (ev->finish == PKV_FINISH_LENGTH && ev->n_generated < g->r->n_predict) {
        why = "full"; /* the context's room ran out before -n */
    }
    g->why[ev->sample] = why;
    return go;
}

/* The run as one engine request, stepped here until its final events: plain,
 * --draft/--mtp (the engine's draft) and --fork on a fresh sequence (the prompt
 * with its media; --fork's K samples are forks of it, sample i seeded seed + i),
 * --context-shift on st->ctx with the engine's shift. The tokens are those of the loops that ran before (the engine's
 * samplers are seeded alike and see the same rows). */
static pkv_status run_engine(const run_opts *r, run_state *st, run_gen *g) {
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = st->toks;
    rp.n_prompt = (int32_t)st->n_text;
    rp.media = st->enc.n ? st->enc.rows : NULL;
    rp.n_media = st->enc.n;
    rp.sampling = r->sp;
    rp.ignore_eos = r->ignore_eos;
    rp.n = r->n_fork ? r->n_fork : 1;
    /* up to -c tokens in the cache and one more sampled */
    int64_t room = st->n_ctx - (int64_t)st->n_prompt + 1;
    rp.max_tokens = (int32_t)(r->n_predict < room ? r->n_predict : room);
    if (r->ctx_shift) { /* (no media with it) */
        rp.context = st->ctx;
        rp.context_shift = true;
        rp.n_keep = r->n_keep;
        rp.max_tokens = r->n_predict;
    }
    if (r->n_predict == 0) { /* the prompt alone: the request stops at its first token, unshown */
        g->discard = true;
        rp.max_tokens = 1;
        rp.n = 1;
    }
    rp.on_event = run_event;
    rp.user = g;
    pkv_status s = pkv_engine_submit(st->eng, &rp, NULL);
    while (!s && g->n_final < rp.n) {
        bool after = st->generated > 0; /* a verification step (--draft's "target steps") */
        if ((s = pkv_engine_step(st->eng, NULL))) break;
        st->draft_steps_after += after;
    }
    if (!s && g->status) s = pkv_err(g->status, "%s", g->message);
    return s;
}

/* One sequence, plain or speculative (--draft/--mtp), streamed; says on stderr
 * why it stopped. */
static bool run_plain(const run_opts *r, run_state *st) {
    pkv_model *m = st->m;
    printer *pr = &st->pr[0];
    if (!(st->smp[0] = pkv_sampler_create(r->sp, st->info.n_vocab))) return run_fail("sampler", PKV_ERR_INVALID);
    pr->m = m;
    pr->stream = true;
    pr->last = -1;
    pkv_engine_stats es; /* --draft/--mtp: the speculative figures */
    const char *why = NULL;
    int64_t n_ctx = st->n_ctx, shifted = 0;
    pkv_status s;
    memset(&es, 0, sizeof es);
    {
        run_gen g = {.r = r, .st = st, .why = {"n"}};
        s = run_engine(r, st, &g);
        if (s && !g.started) return run_fail("prefill", s); /* nothing printed yet */
        why = g.why[0];
        shifted = g.shifted;
        if (!s && (st->draft || r->spec_ngram)) pkv_engine_stats_get(st->eng, &es);
    }
    fputc('\n', stdout);
    if (s) return run_fail("generate", s);
    if (!strcmp(why, "output")) {
        fprintf(stderr, "pagekv run: stopped: standard output could not be written\n");
        return false;
    } else if (!strcmp(why, "eog")) {
        char piece[128];
        size_t k = 0;
        if (pkv_model_token_piece(m, pr->last, true, piece, sizeof piece, &k)) k = 0;
        fprintf(stderr, "pagekv run: stopped: end-of-generation token %d '%.*s' after %d tokens\n", pr->last, (int)k, piece,
                st->generated);
    } else if (!strcmp(why, "n")) {
        fprintf(stderr, "pagekv run: stopped: -n %d tokens generated\n", r->n_predict);
    } else {
        fprintf(stderr, "pagekv run: stopped: the context of %lld tokens is full after %d tokens (a larger -c, or "
                        "--context-shift, goes on)\n", (long long)n_ctx, st->generated);
    }
    if (shifted) fprintf(stderr, "pagekv run: context shift dropped %lld tokens in all\n", (long long)shifted);
    if (st->draft || r->spec_ngram)
        fprintf(stderr, "pagekv run: speculative: %llu drafted, %llu accepted (%.1f%%), %d tokens in %llu target steps "
                        "(%.2f per step), %llu draft steps\n",
                (unsigned long long)es.draft_proposed, (unsigned long long)es.draft_accepted,
                es.draft_proposed ? 100.0 * (double)es.draft_accepted / (double)es.draft_proposed : 0.0, st->generated,
                (unsigned long long)st->draft_steps_after,
                st->draft_steps_after ? (double)st->generated / (double)st->draft_steps_after : 0.0,
                (unsigned long long)es.draft_steps);
    return true;
}

/* --fork K: one request of K samples, forks of the prompt decoded together in
 * batched steps (sample i seeded seed + i); each printed whole at the end. */
static bool run_fork(const run_opts *r, run_state *st) {
    int K = r->n_fork;
    run_gen g = {.r = r, .st = st};
    for (int b = 0; b < K; b++) {
        st->pr[b].m = st->m;
        g.why[b] = "n";
    }
    pkv_status s = run_engine(r, st, &g);
    if (s) return run_fail(g.started ? "batched decode" : "prefill", s);
    for (int b = 0; b < K; b++) {
        const char *why = !strcmp(g.why[b], "eog") ? "end-of-generation token" : !strcmp(g.why[b], "full") ? "context full"
                                                                                                          : "-n reached";
        printf("--- branch %d (seed %llu, stopped: %s) ---\n%s%s\n", b, (unsigned long long)(r->sp.seed + (uint64_t)b),
               why, r->prompt, st->pr[b].text ? st->pr[b].text : "");
    }
    return true;
}

/* Everything after the model is loaded: prompt, cache, draft, prefill, the mode,
 * the logs. Returns the exit code. */
static int run_model(const run_opts *r, run_state *st, double t_load) {
#ifdef PKV_HAVE_SERVER
    if (r->chat) return run_chat(r, st);
#endif
    if (!run_tokenize(r, st)) return 1;
    if (r->spec_log) {
        if (pkv_wfile_open(&st->spec_w, r->spec_log)) {
            fprintf(stderr, "pagekv run: --spec-log: %s\n", pkv_errmsg());
            return 1;
        }
        st->spec_f = st->spec_w.f;
    }
    if (st->n_prompt == 0) {
        fprintf(stderr, "pagekv run: the prompt is empty and the model adds no BOS token\n");
        return 1;
    }
    if ((r->draft_path && !run_load_draft(r, st)) || !run_open_context(r, st) || (r->draft_path && !run_attach_draft(r, st)))
        return 1;
    size_t n_prompt = st->n_prompt;
    if ((int64_t)n_prompt + (r->n_predict > 0 ? 1 : 0) > st->n_ctx) {
        fprintf(stderr, "pagekv run: the prompt has %zu tokens, more than the context of %lld (use -c)\n", n_prompt,
                (long long)st->n_ctx);
        return 1;
    }
    fprintf(stderr, "pagekv run: %s %s, %d layers, %s on %s, prompt %zu tokens\n", st->info.arch, st->info.weight_type,
            st->info.n_layer, pkv_cli_kv_desc(&r->o), pkv_device_name(pkv_model_device(st->m)), n_prompt);
    /* the prefill: until the first token (the engine's request computes the prompt
     * and samples it) */
    double t0 = pkv_time_now_cli();
    if (!(r->n_fork ? run_fork(r, st) : run_plain(r, st))) return 1;
    if (r->ids_out && !write_ids(r->ids_out, st->pr[0].ids, st->pr[0].n_ids)) return 1;
    if (st->spec_f) {
        st->spec_f = NULL;
        if (pkv_wfile_commit(&st->spec_w)) {
            fprintf(stderr, "pagekv run: --spec-log: %s\n", pkv_errmsg());
            return 1;
        }
    }
    double t_prefill = st->t_first - t0, t_decode = pkv_time_now_cli() - st->t_first;
    int gen = st->generated;
    fprintf(stderr, "pagekv run: load %.2f s, prefill %zu tokens in %.3f s (%.1f tok/s), decode %d tokens in %.3f s (%.1f tok/s)\n",
            t_load, n_prompt, t_prefill, (double)n_prompt / (t_prefill > 0 ? t_prefill : 1e-9), gen, t_decode,
            gen / (t_decode > 0 ? t_decode : 1e-9));
    return 0;
}

int pkv_cli_run(int argc, char **argv) {
    run_opts r;
    int rc = run_parse(argc, argv, &r);
    if (rc >= 0) return rc;
    if ((rc = run_check(&r))) return rc;
    char *prompt_buf = NULL;
    if (!run_prompt_text(&r, &prompt_buf)) {
        free(prompt_buf);
        return 1;
    }
    if (r.random_seed) {
        r.sp.seed = (uint64_t)time(NULL) * 6364136223846793005ull ^ (uint64_t)getpid() * 1442695040888963407ull ^
                    (uint64_t)(pkv_time_now_cli() * 1e9);
        r.sp.seed &= (uint64_t)INT64_MAX; /* printable and reusable with --seed */
        if (pkv_dist_bcast(&r.sp.seed, sizeof r.sp.seed)) { /* every rank samples alike */
            fprintf(stderr, "pagekv run: %s\n", pkv_errmsg());
            free(prompt_buf);
            return 1;
        }
        fprintf(stderr, "pagekv run: seed %llu\n", (unsigned long long)r.sp.seed);
    }
    double t_start = pkv_time_now_cli();
    run_state st;
    memset(&st, 0, sizeof st);
    if (!(st.m = pkv_cli_open_model("run", &r.o))) {
        free(prompt_buf);
        return 1;
    }
    pkv_model_get_info(st.m, &st.info);
    rc = run_model(&r, &st, pkv_time_now_cli() - t_start);
    run_state_free(&st);
    free(prompt_buf);
    return rc;
}
