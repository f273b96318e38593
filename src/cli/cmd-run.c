/* pagekv run / logits: the model commands, with llama.cpp's
 * option names where they exist. */
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
    } else if (!strcmp(a, "--kv-on-host")) {
        o->kv_on_host = true;
    } else if (!strcmp(a, "--no-mmap")) {
        o->no_mmap = true;
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
    if (!c) {
        pkv_model_info info;
        pkv_model_get_info(m, &info);
        int64_t ctx = o->n_ctx ? o->n_ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
        fprintf(stderr, "pagekv %s: cannot create the KV cache (%d sequence%s of up to %lld tokens): %s%s\n", cmd, n_seq,
                n_seq == 1 ? "" : "s", (long long)ctx, pkv_errmsg(),
                strstr(pkv_errmsg(), "memory") || strstr(pkv_errmsg(), "alloc") ? " (a smaller -c needs less memory)" : "");
    }
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

static bool parse_tokens(const char *s, int32_t **out, size_t *n);

/* --spec-log: one JSON object per round */
static void log_round(const pkv_spec_round *r, void *user) {
    FILE *f = user;
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
            "  --kv-on-host         keep every KV shard in host memory, split by the same heads;\n"
            "                       attention runs on the host\n"
            "  --no-mmap            copy the weights into memory instead of using the mapped\n"
            "                       file in place (CPU; more memory, a few %% faster here)\n"
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
            "  --draft-max N        tokens the draft proposes per round (default 4, at most 64)\n"
            "  --mtp                the model's own MTP (nextn) head as the draft (qwen35 files with\n"
            "                       nextn_predict_layers): fed the target's hidden states, its own\n"
            "                       one-layer KV cache on the target's device; greedy output equals\n"
            "                       plain decoding\n"
            "Media (docs/multimodal.md, \"Media in the cache\"):\n"
            "  --mmproj FILE        the projector (an mmproj GGUF) for --audio/--image\n"
            "  --audio FILE, --image FILE   media into the prompt (repeatable, in order): each\n"
            "                       <__media__> marker in the prompt places the next file; without\n"
            "                       markers every file goes before the text. The prompt is then\n"
            "                       tokenized with special tokens parsed (your own markup, as\n"
            "                       llama.cpp's mtmd-cli); a gemma3 projector's images are wrapped\n"
            "                       in <start_of_image> ... <end_of_image>\n"
            "  --media-at K         with --tokens: the next file goes after the first K ids\n"
            "  --embd-out FILE      the projector's rows, raw little-endian float32 [rows][n_embd]\n"
            "For checking against other implementations:\n"
            "  --tokens 1,2,3       the prompt as token ids (as 'pagekv logits' takes it; no -p/-f;\n"
            "                       also for models without a vocabulary)\n"
            "  --ids-out FILE       the generated ids as a JSON array, with the end-of-generation\n"
            "                       token that stopped it (not with --fork)\n"
            "  --spec-log FILE      with --draft: one JSON object per verification round, a line\n"
            "                       each: {\"pos\": position of the last committed token the draft\n"
            "                       went on from, \"proposed\": [ids], \"accepted\": how many kept}\n"
            "Timings (load, prefill and decode tokens/s) go to stderr.\n");
}

int pkv_cli_run(int argc, char **argv) {
    pkv_cli_model_opts o = pkv_cli_model_defaults();
    const char *prompt = NULL, *prompt_file = NULL;
    char *prompt_buf = NULL;
    bool ctx_shift = false;
    long long n_keep = 0;
    long long n_predict = 64, n_fork = 0, draft_max = 4;
    const char *draft_path = NULL, *draft_dev = NULL;
    const char *tokens_arg = NULL, *ids_out = NULL, *spec_log = NULL;
    bool use_mtp = false;
    FILE *spec_f = NULL; /* spec_w.f while --spec-log is open */
    pkv_wfile spec_w = {0};
    pkv_sampler_params sp = pkv_sampler_default_params();
    bool random_seed = true; /* as llama-cli: a random seed unless --seed N, printed */
    bool ignore_eos = false, chat = false, verbose_prompt = false;
    const char *system_prompt = NULL;
    pkv_cli_media mo;
    memset(&mo, 0, sizeof mo);
    for (int i = 1; i < argc; i++) {
        int r = pkv_cli_model_opt(argc, argv, &i, &o);
        if (!r) r = pkv_cli_media_opt(argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        long long x;
        double d;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(prompt_file = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--context-shift")) {
            ctx_shift = true;
        } else if (!strcmp(a, "--keep")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, 1 << 24, &n_keep)) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, 1 << 24, &n_predict)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, -1, INT64_MAX, &x)) return 2;
            random_seed = x < 0;
            sp.seed = (uint64_t)x;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (!strcmp(a, "-cnv") || !strcmp(a, "--conversation")) {
            chat = true;
        } else if (!strcmp(a, "-sys") || !strcmp(a, "--system-prompt")) {
            if (!(system_prompt = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--verbose-prompt")) {
            verbose_prompt = true;
        } else if (!strcmp(a, "--temp")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 0, 100, &d)) return 2;
            sp.temp = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, 1 << 24, &x)) return 2;
            sp.top_k = (int)x;
        } else if (!strcmp(a, "--top-p")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 1e-6, 1, &d)) return 2;
            sp.top_p = (float)d;
        } else if (!strcmp(a, "--min-p")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 0, 1, &d)) return 2;
            sp.min_p = (float)d;
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 1e-3, 100, &d)) return 2;
            sp.repeat_penalty = (float)d;
        } else if (!strcmp(a, "--fork")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 64, &n_fork)) return 2;
        } else if (!strcmp(a, "--draft")) {
            if (!(draft_path = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--draft-device")) {
            if (!(draft_dev = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--mtp")) {
            use_mtp = true;
        } else if (!strcmp(a, "--tokens")) {
            if (!(tokens_arg = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids-out")) {
            if (!(ids_out = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--spec-log")) {
            if (!(spec_log = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--draft-max")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 64, &draft_max)) return 2;
        } else {
            fprintf(stderr, "pagekv run: unknown option '%s' (see 'pagekv run --help')\n", a);
            return 2;
        }
    }
    if (use_mtp && draft_path) {
        fprintf(stderr, "pagekv run: give --mtp (the model's own MTP head) or --draft FILE, not both\n");
        return 2;
    }
    if (use_mtp && !o.model) {
        fprintf(stderr, "pagekv run: --mtp needs -m FILE with MTP layers (qwen35; 'pagekv mkmodel --arch qwen35 --mtp 1')\n");
        return 2;
    }
    if (use_mtp) draft_path = o.model; /* the same file, loaded as its MTP head */
    if (draft_path && n_fork) {
        fprintf(stderr, "pagekv run: --draft and --fork cannot be combined\n");
        return 2;
    }
    if (!draft_path && (draft_dev || draft_max != 4)) {
        fprintf(stderr, "pagekv run: --draft-device and --draft-max need --draft FILE\n");
        return 2;
    }
    if ((prompt != NULL) + (prompt_file != NULL) + (tokens_arg != NULL) > 1) {
        fprintf(stderr, "pagekv run: give the prompt with one of -p, -f or --tokens\n");
        return 2;
    }
    if (ids_out && n_fork) {
        fprintf(stderr, "pagekv run: --ids-out writes one sequence's ids: not with --fork\n");
        return 2;
    }
    if (spec_log && !draft_path) {
        fprintf(stderr, "pagekv run: --spec-log logs the rounds of speculative decoding: it needs --draft FILE\n");
        return 2;
    }
    if (ctx_shift && (draft_path || n_fork)) {
        fprintf(stderr, "pagekv run: --context-shift works with plain generation (not with --draft or --fork)\n");
        return 2;
    }
    if (ignore_eos && draft_path) {
        fprintf(stderr, "pagekv run: --ignore-eos works with plain generation and --fork, not with --draft/--mtp\n");
        return 2;
    }
    if (!pkv_cli_media_check("run", &mo)) return 2;
    if (mo.n && (chat || draft_path || ctx_shift)) {
        fprintf(stderr, "pagekv run: --audio/--image work with plain generation and --fork (not with -cnv, --draft, --mtp "
                        "or --context-shift)\n");
        return 2;
    }
    if (mo.n_at && !tokens_arg) {
        fprintf(stderr, "pagekv run: --media-at places media among --tokens ids; in a text prompt write <__media__>\n");
        return 2;
    }
    if (system_prompt && !chat) {
        fprintf(stderr, "pagekv run: -sys (the system message) needs -cnv (chat mode)\n");
        return 2;
    }
    if (chat) {
#ifndef PKV_HAVE_SERVER
        (void)verbose_prompt;
        fprintf(stderr, "pagekv run: -cnv needs the chat templates of 'pagekv serve', and this pagekv was built without "
                        "them: install libmicrohttpd-dev and libjansson-dev (scripts/deps.sh) and build again\n");
        return 2;
#else
        const char *bad = prompt || prompt_file ? "-p/-f (the turns come from standard input)"
                          : tokens_arg          ? "--tokens"
                          : n_fork              ? "--fork"
                          : draft_path          ? "--draft/--mtp"
                          : ctx_shift           ? "--context-shift"
                          : ignore_eos          ? "--ignore-eos (an answer ends at the end-of-turn token)"
                          : ids_out             ? "--ids-out (--verbose-prompt prints each turn's ids)"
                                                : NULL;
        if (bad) {
            fprintf(stderr, "pagekv run: -cnv does not take %s\n", bad);
            return 2;
        }
#endif
    }
    if (prompt_file) {
        size_t plen = 0;
        if (!(prompt_buf = pkv_cli_read_text("run", prompt_file, &plen))) return 1;
        if (strlen(prompt_buf) != plen) {
            fprintf(stderr, "pagekv run: %s contains a NUL byte; the prompt must be text\n", prompt_file);
            free(prompt_buf);
            return 1;
        }
        prompt = prompt_buf;
    } else if (tokens_arg) {
        prompt = ""; /* ids, not text */
    } else if (!prompt) {
        prompt = "Once upon a time";
        if (!isatty(STDIN_FILENO) && !chat)
            fprintf(stderr, "pagekv run: no -p or -f given: using the default prompt \"%s\" (standard input is not a "
                            "terminal: to read the prompt from it, use -f -)\n", prompt);
    }
    if (random_seed) {
        sp.seed = (uint64_t)time(NULL) * 6364136223846793005ull ^ (uint64_t)getpid() * 1442695040888963407ull ^
                  (uint64_t)(pkv_time_now_cli() * 1e9);
        sp.seed &= (uint64_t)INT64_MAX; /* printable and reusable with --seed */
        fprintf(stderr, "pagekv run: seed %llu\n", (unsigned long long)sp.seed);
    }
    double t_start = pkv_time_now_cli();
    pkv_model *m = pkv_cli_open_model("run", &o);
    if (!m) return 1;
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    double t_loaded = pkv_time_now_cli();
    int rc = 1;
    pkv_kv_cache *c = NULL;
    pkv_context *ctx = NULL;
    pkv_context *br[64] = {0};
    pkv_sampler *smp[64] = {0};
    int32_t *toks = NULL;
    pkv_model *draft = NULL;
    pkv_spec *spec = NULL;
    printer pr[64];
    memset(pr, 0, sizeof pr);
    pkv_cli_encoded enc;
    memset(&enc, 0, sizeof enc);
    size_t n_text = 0; /* with media: the prompt's text tokens (n_prompt counts the media rows too) */
#ifdef PKV_HAVE_SERVER
    if (chat) {
        if (!info.has_vocab) {
            fprintf(stderr, "pagekv run: -cnv needs a model with a vocabulary (tokenizer.ggml.model is none)\n");
            goto out;
        }
        if (!(c = pkv_cli_open_cache("run", m, &o, 1)) || !(ctx = pkv_context_create(m, c, o.n_ctx))) {
            if (c) fprintf(stderr, "pagekv run: %s\n", pkv_errmsg());
            goto out;
        }
        pkv_cli_chat_opts co = {.model_path = o.model, .system = system_prompt, .kv = &o, .sp = sp,
                                .n_predict = n_predict, .verbose_prompt = verbose_prompt};
        rc = pkv_cli_run_chat(m, ctx, &co);
        goto out;
    }
#endif
    if (!info.has_vocab && !tokens_arg) {
        fprintf(stderr, "pagekv run: this model has no vocabulary (tokenizer.ggml.model = none): "
                        "give the prompt as token ids with --tokens 1,2,3\n");
        goto out;
    }
    size_t n_prompt = 0, len = strlen(prompt);
    pkv_status s = PKV_OK;
    if (tokens_arg) {
        if (!parse_tokens(tokens_arg, &toks, &n_prompt)) goto out;
        for (size_t k = 0; k < n_prompt; k++)
            if (toks[k] >= info.n_vocab) {
                fprintf(stderr, "pagekv run: --tokens: id %d is outside the vocabulary [0, %d)\n", toks[k], info.n_vocab);
                goto out;
            }
    } else if (mo.n) {
        if (pkv_cli_media_encode("run", m, &mo, &enc)) goto out;
        if ((s = pkv_cli_media_prompt(m, prompt, &enc, &toks, &n_prompt))) {
            pkv_cli_fail("run", "prompt", s);
            goto out;
        }
    } else {
        s = pkv_model_tokenize(m, prompt, len, true, false, NULL, 0, &n_prompt);
        if (s && s != PKV_ERR_INVALID) {
            pkv_cli_fail("run", "tokenize", s);
            goto out;
        }
        toks = malloc((n_prompt + 1) * sizeof *toks);
        if (!toks || (s = pkv_model_tokenize(m, prompt, len, true, false, toks, n_prompt + 1, &n_prompt))) {
            pkv_cli_fail("run", "tokenize", s ? s : PKV_ERR_NOMEM);
            goto out;
        }
    }
    if (mo.n && tokens_arg) {
        if (pkv_cli_media_encode("run", m, &mo, &enc)) goto out;
        for (int i = 0; i < enc.n; i++)
            if (enc.rows[i].at > (int32_t)n_prompt || (i && enc.rows[i].at < enc.rows[i - 1].at)) {
                fprintf(stderr, "pagekv run: --media-at %d for file %d: must be in [%d, %zu] (non-decreasing)\n",
                        enc.rows[i].at, i + 1, i ? enc.rows[i - 1].at : 0, n_prompt);
                goto out;
            }
    }
    n_text = n_prompt;
    for (int i = 0; i < enc.n; i++) n_prompt += (size_t)enc.rows[i].n_rows;
    if (spec_log) {
        if (pkv_wfile_open(&spec_w, spec_log)) {
            fprintf(stderr, "pagekv run: --spec-log: %s\n", pkv_errmsg());
            goto out;
        }
        spec_f = spec_w.f;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "pagekv run: the prompt is empty and the model adds no BOS token\n");
        goto out;
    }
    if (n_fork) {
        /* K branches share the prompt's pages; each needs pages only for what it
         * generates (plus its copy of the shared partial page) */
        int ps = o.page_size ? o.page_size : 16;
        int64_t n_ctx = o.n_ctx ? o.n_ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
        int64_t n_gen = n_predict < n_ctx - (int64_t)n_prompt ? n_predict : n_ctx - (int64_t)n_prompt;
        if (n_gen < 0) n_gen = 0;
        int64_t shared = ((int64_t)n_prompt + ps - 1) / ps;
        int64_t per = ((int64_t)n_prompt + n_gen + ps - 1) / ps - (int64_t)n_prompt / ps;
        c = pkv_cli_open_cache_pages("run", m, &o, (int)n_fork + 1, shared + n_fork * per);
        if (c)
            fprintf(stderr, "pagekv run: KV pool of %lld pages: the prompt's %lld shared by %lld branches, %lld more each\n",
                    (long long)(shared + n_fork * per), (long long)shared, n_fork, (long long)per);
    } else {
        /* a shared-KV draft forks; a context shift rewrites the pages after the cut */
        c = pkv_cli_open_cache("run", m, &o, 1 + (draft_path || ctx_shift ? 1 : 0));
    }
    if (!c || !(ctx = pkv_context_create(m, c, o.n_ctx))) {
        if (c) fprintf(stderr, "pagekv run: %s\n", pkv_errmsg());
        goto out;
    }
    if (draft_path) { /* load and attach the draft before anything is generated (I6 fails here) */
        pkv_model_params dp = pkv_model_default_params();
        pkv_device *tdev = pkv_model_device(m);
        if (!draft_dev || !strcmp(draft_dev, pkv_device_name(tdev))) dp.device_handle = tdev;
        else dp.device = draft_dev;
        dp.n_threads = o.threads;
        dp.mtp = use_mtp;
        if (!(draft = pkv_model_load(draft_path, dp))) {
            fprintf(stderr, "pagekv run: cannot load the draft %s: %s\n", draft_path, pkv_errmsg());
            goto out;
        }
        pkv_spec_params spp = pkv_spec_default_params();
        spp.draft_max = (int)draft_max;
        spp.draft_cache.page_size = o.page_size;
        spp.draft_cache.kv_type = o.kv_type;
        spp.draft_cache.kv_type_v = o.kv_type_v;
        if (spec_f) {
            spp.on_round = log_round;
            spp.round_user = spec_f;
        }
        if (!(spec = pkv_spec_create(ctx, draft, spp))) {
            fprintf(stderr, "pagekv run: draft %s: %s\n", draft_path, pkv_errmsg());
            goto out;
        }
        pkv_model_info di;
        pkv_model_get_info(draft, &di);
        if (di.assistant) { /* where each part runs: docs/speculative.md */
            pkv_kv_shard_info sh;
            pkv_model_info ti;
            pkv_model_get_info(m, &ti);
            const char *kv_dev = pkv_kv_shard(pkv_context_cache(ctx), 0, 0, &sh) ? "?" : pkv_device_name(sh.storage);
            fprintf(stderr, "pagekv run: draft %s (Gemma 4 assistant): %d layers on %s, no KV of its own: its attention runs "
                            "over the target's pages where they are stored (%s%s), its input embedding is the target's (on %s); "
                            "up to %lld tokens per round\n",
                    draft_path, di.n_layer, pkv_device_name(pkv_model_device(draft)), kv_dev,
                    ti.n_devices > 1 ? " and the target's other shards" : "", pkv_device_name(tdev), draft_max);
        } else {
            fprintf(stderr, "pagekv run: draft %s%s: %d layers on %s, %s, up to %lld tokens per round\n", draft_path,
                    di.mtp ? " (its MTP head)" : "", di.n_layer, pkv_device_name(pkv_model_device(draft)),
                    di.shared_kv ? "shares the target's KV cache" : "own KV cache", draft_max);
        }
    }
    if ((int64_t)n_prompt + (n_predict > 0 ? 1 : 0) > pkv_context_n_ctx(ctx)) {
        fprintf(stderr, "pagekv run: the prompt has %zu tokens, more than the context of %lld (use -c)\n", n_prompt,
                (long long)pkv_context_n_ctx(ctx));
        goto out;
    }
    fprintf(stderr, "pagekv run: %s %s, %d layers, %s on %s, prompt %zu tokens\n", info.arch, info.weight_type, info.n_layer,
            pkv_cli_kv_desc(&o), pkv_device_name(pkv_model_device(m)), n_prompt);
    double t0 = pkv_time_now_cli();
    if ((s = enc.n ? pkv_context_decode_prompt(ctx, toks, (int32_t)n_text, enc.rows, enc.n)
                   : pkv_context_decode(ctx, toks, (int32_t)n_prompt))) {
        pkv_cli_fail("run", "prefill", s);
        goto out;
    }
    double t_prefill = pkv_time_now_cli() - t0;
    fwrite(prompt, 1, len, stdout);
    fflush(stdout);
    int generated = 0;
    t0 = pkv_time_now_cli();
    if (!n_fork) {
        smp[0] = pkv_sampler_create(sp, info.n_vocab);
        if (!smp[0]) {
            pkv_cli_fail("run", "sampler", PKV_ERR_INVALID);
            goto out;
        }
        pr[0].m = m;
        pr[0].stream = true;
        pr[0].last = -1;
        pkv_spec_stats st;
        const char *why = NULL;
        int64_t n_ctx = pkv_context_n_ctx(ctx), shifted = 0;
        if (spec) {
            /* the last sampled token needs no room in the cache */
            int64_t room = n_ctx - (int64_t)n_prompt + 1;
            s = pkv_spec_generate(spec, smp[0], (int)(n_predict < room ? n_predict : room), emit_token, &pr[0], &st);
            generated = (int)st.n_tokens;
            why = pr[0].out_failed                                  ? "output"
                  : pr[0].last >= 0 && pkv_model_is_eog(m, pr[0].last) ? "eog"
                  : generated >= n_predict                          ? "n"
                                                                    : "full";
        } else {
            /* the generation loop, here rather than pkv_generate, so that it can
             * shift the context and say why it stopped */
            s = PKV_OK;
            while (!s) {
                if (generated >= n_predict) {
                    why = "n";
                    break;
                }
                int32_t t;
                if ((s = pkv_sampler_sample(smp[0], pkv_context_logits(ctx), &t))) break;
                pkv_sampler_accept(smp[0], t);
                generated++;
                if (!emit_token(t, &pr[0])) {
                    why = "output";
                    break;
                }
                if (!ignore_eos && pkv_model_is_eog(m, t)) {
                    why = "eog";
                    break;
                }
                if (generated >= n_predict) {
                    why = "n";
                    break;
                }
                if (pkv_context_n_tokens(ctx) >= n_ctx) {
                    if (!ctx_shift) {
                        why = "full";
                        break;
                    }
                    /* keep --keep tokens (and a leading BOS), drop half of the rest */
                    int64_t have = pkv_context_n_tokens(ctx), keep = n_keep;
                    int32_t first = -1;
                    if (pkv_context_tokens(ctx, 0, 1, &first) == PKV_OK && first == pkv_model_bos(m) && keep < 1) keep = 1;
                    if (keep > have - 2) keep = have - 2;
                    int64_t drop = (have - keep) / 2;
                    if (drop < 1 || (s = pkv_context_shift(ctx, keep, drop))) {
                        if (!s) s = pkv_err(PKV_ERR_INVALID, "nothing to drop: --keep %lld holds the whole context", n_keep);
                        break;
                    }
                    shifted += drop;
                }
                s = pkv_context_decode(ctx, &t, 1);
            }
        }
        fputc('\n', stdout);
        if (s) {
            pkv_cli_fail("run", "generate", s);
            goto out;
        }
        if (!strcmp(why, "output")) {
            fprintf(stderr, "pagekv run: stopped: standard output could not be written\n");
            goto out;
        } else if (!strcmp(why, "eog")) {
            char piece[128];
            size_t k = 0;
            if (pkv_model_token_piece(m, pr[0].last, true, piece, sizeof piece, &k)) k = 0;
            fprintf(stderr, "pagekv run: stopped: end-of-generation token %d '%.*s' after %d tokens\n", pr[0].last,
                    (int)k, piece, generated);
        } else if (!strcmp(why, "n")) {
            fprintf(stderr, "pagekv run: stopped: -n %lld tokens generated\n", n_predict);
        } else {
            fprintf(stderr, "pagekv run: stopped: the context of %lld tokens is full after %d tokens (a larger -c, or "
                            "--context-shift, goes on)\n", (long long)n_ctx, generated);
        }
        if (shifted)
            fprintf(stderr, "pagekv run: context shift dropped %lld tokens in all\n", (long long)shifted);
        if (spec)
            fprintf(stderr, "pagekv run: speculative: %lld drafted, %lld accepted (%.1f%%), %lld tokens in %lld target steps "
                            "(%.2f per step), %lld draft steps\n",
                    (long long)st.drafted, (long long)st.accepted, st.drafted ? 100.0 * (double)st.accepted / (double)st.drafted : 0.0,
                    (long long)st.n_tokens, (long long)st.target_steps,
                    st.target_steps ? (double)st.n_tokens / (double)st.target_steps : 0.0, (long long)st.draft_steps);
    } else {
        /* K branches decoded together: one batched step per token. */
        int K = (int)n_fork;
        bool alive[64];
        const char *why[64];
        for (int b = 0; b < K; b++) {
            pkv_sampler_params bp = sp;
            bp.seed = sp.seed + (uint64_t)b;
            br[b] = pkv_context_fork(ctx);
            smp[b] = pkv_sampler_create(bp, info.n_vocab);
            if (!br[b] || !smp[b]) {
                pkv_cli_fail("run", "fork", PKV_ERR_INVALID);
                goto out;
            }
            pr[b].m = m;
            alive[b] = true;
            why[b] = "-n reached";
        }
        fputc('\n', stdout);
        for (int step = 0; step < n_predict; step++) {
            pkv_context *batch[64];
            int32_t next[64], ones[64];
            const int32_t *tp[64];
            int nb = 0;
            for (int b = 0; b < K; b++) {
                if (!alive[b]) continue;
                int32_t t;
                if ((s = pkv_sampler_sample(smp[b], pkv_context_logits(br[b]), &t))) {
                    pkv_cli_fail("run", "sample", s);
                    goto out;
                }
                pkv_sampler_accept(smp[b], t);
                emit_token(t, &pr[b]);
                generated++;
                bool eog = !ignore_eos && pkv_model_is_eog(m, t);
                if (eog || step + 1 == n_predict || pkv_context_n_tokens(br[b]) >= pkv_context_n_ctx(br[b])) {
                    alive[b] = false;
                    if (eog) why[b] = "end-of-generation token";
                    else if (step + 1 < n_predict) why[b] = "context full";
                    continue;
                }
                next[nb] = t;
                ones[nb] = 1;
                tp[nb] = &next[nb];
                batch[nb++] = br[b];
            }
            if (nb == 0) break;
            if ((s = pkv_decode(batch, nb, tp, ones))) {
                pkv_cli_fail("run", "batched decode", s);
                goto out;
            }
        }
        for (int b = 0; b < K; b++)
            printf("--- branch %d (seed %llu, stopped: %s) ---\n%s%s\n", b, (unsigned long long)(sp.seed + (uint64_t)b),
                   why[b], prompt, pr[b].text ? pr[b].text : "");
    }
    if (ids_out && !write_ids(ids_out, pr[0].ids, pr[0].n_ids)) goto out;
    if (spec_f) {
        spec_f = NULL;
        if (pkv_wfile_commit(&spec_w)) {
            fprintf(stderr, "pagekv run: --spec-log: %s\n", pkv_errmsg());
            goto out;
        }
    }
    double t_decode = pkv_time_now_cli() - t0;
    fprintf(stderr, "pagekv run: load %.2f s, prefill %zu tokens in %.3f s (%.1f tok/s), decode %d tokens in %.3f s (%.1f tok/s)\n",
            t_loaded - t_start, n_prompt, t_prefill, (double)n_prompt / (t_prefill > 0 ? t_prefill : 1e-9), generated, t_decode,
            generated / (t_decode > 0 ? t_decode : 1e-9));
    rc = 0;
out:
    for (int b = 0; b < 64; b++) {
        pkv_context_free(br[b]);
        pkv_sampler_free(smp[b]);
        free(pr[b].text);
        free(pr[b].ids);
    }
    if (spec_f) pkv_wfile_abort(&spec_w); /* an error before the log was complete */
    free(toks);
    pkv_cli_encoded_free(&enc);
    free(prompt_buf);
    pkv_spec_free(spec); /* before the target's context and cache: a shared-KV draft lives in them */
    pkv_model_free(draft); /* before the target model: it may use the target's device */
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    return rc;
}

/* --------------------------------------------------------------- logits */

static bool parse_tokens(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return false;
    const char *p = s;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > INT32_MAX) {
            fprintf(stderr, "pagekv: --tokens expects comma-separated token ids, got '%s'\n", s);
            free(v);
            return false;
        }
        if (k == cap) {
            int32_t *t = realloc(v, (cap *= 2) * sizeof *v);
            if (!t) {
                free(v);
                return false;
            }
            v = t;
        }
        v[k++] = (int32_t)x;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "pagekv: unexpected '%c' in --tokens\n", *p);
            free(v);
            return false;
        }
    }
    if (!k) {
        fprintf(stderr, "pagekv: --tokens is empty\n");
        free(v);
        return false;
    }
    *out = v;
    *n = k;
    return true;
}

int pkv_cli_logits(int argc, char **argv) {
    pkv_cli_model_opts o = pkv_cli_model_defaults();
    const char *tokens = NULL, *outp = NULL;
    pkv_cli_media mo;
    memset(&mo, 0, sizeof mo);
    for (int i = 1; i < argc; i++) {
        int r = pkv_cli_model_opt(argc, argv, &i, &o);
        if (!r) r = pkv_cli_media_opt(argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: pagekv logits [-m FILE.gguf] --tokens 1,2,3,... [-o FILE] [-d DEVICE] [-t N]\n"
                   "                     [--devices A,B [--split P,Q] [--kv-on-host]]\n"
                   "Runs the token ids as one prompt and writes the last position's logits: as\n"
                   "little-endian float32 to FILE with -o, else as JSON to stdout.\n"
                   "Also: -c N, --page-size N, --kv-type f16|f32|q8_0|q4_0 (--kv-type-k, --kv-type-v).\n"
                   "Media (docs/multimodal.md, \"Media in the cache\"): --mmproj FILE with --audio FILE or --image FILE\n"
                   "(repeatable, in order) inserts each file's projector rows after the first K ids\n"
                   "(--media-at K, one per file in order; default 0); --embd-out FILE writes the\n"
                   "projector's rows of every file, raw little-endian float32 [rows][n_embd], no header.\n");
            return 0;
        } else if (!strcmp(argv[i], "--tokens")) {
            if (!(tokens = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (!(outp = pkv_cli_value(argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "pagekv logits: unknown option '%s' (see 'pagekv logits --help')\n", argv[i]);
            return 2;
        }
    }
    if (!tokens && !mo.n) {
        fprintf(stderr, "pagekv logits: --tokens is required (comma-separated token ids)\n");
        return 2;
    }
    if (!pkv_cli_media_check("logits", &mo)) return 2;
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokens && !parse_tokens(tokens, &ids, &n)) return 2;
    pkv_cli_encoded enc;
    memset(&enc, 0, sizeof enc);
    pkv_model *m = pkv_cli_open_model("logits", &o);
    if (!m) {
        free(ids);
        return 1;
    }
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    int rc = 1;
    pkv_kv_cache *c = NULL;
    pkv_context *ctx = NULL;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= info.n_vocab) {
            fprintf(stderr, "pagekv logits: token id %d (position %zu) is outside the vocabulary of %d tokens\n", ids[i], i,
                    info.n_vocab);
            goto out;
        }
    if (mo.n && pkv_cli_media_encode("logits", m, &mo, &enc)) goto out;
    for (int i = 0; i < enc.n; i++) {
        if (enc.rows[i].at > (int32_t)n || (i && enc.rows[i].at < enc.rows[i - 1].at)) {
            fprintf(stderr, "pagekv logits: --media-at %d for file %d: must be in [%d, %zu] (non-decreasing)\n",
                    enc.rows[i].at, i + 1, i ? enc.rows[i - 1].at : 0, n);
            goto out;
        }
    }
    size_t n_all = n;
    for (int i = 0; i < enc.n; i++) n_all += (size_t)enc.rows[i].n_rows;
    if (o.n_ctx == 0 && (int64_t)n_all > 4096) o.n_ctx = (int)n_all;
    if (!(c = pkv_cli_open_cache("logits", m, &o, 1))) goto out;
    if (!(ctx = pkv_context_create(m, c, o.n_ctx))) {
        fprintf(stderr, "pagekv logits: %s\n", pkv_errmsg());
        goto out;
    }
    if ((int64_t)n_all > pkv_context_n_ctx(ctx)) {
        fprintf(stderr, "pagekv logits: %zu tokens do not fit the context of %lld (use -c)\n", n_all,
                (long long)pkv_context_n_ctx(ctx));
        goto out;
    }
    pkv_status s = enc.n ? pkv_context_decode_prompt(ctx, ids, (int32_t)n, enc.rows, enc.n)
                         : pkv_context_decode(ctx, ids, (int32_t)n);
    n = n_all;
    if (s) {
        pkv_cli_fail("logits", "decode", s);
        goto out;
    }
    const float *lg = pkv_context_logits(ctx);
    if (outp) {
        pkv_wfile wf;
        pkv_status ws = pkv_wfile_open(&wf, outp);
        if (!ws) {
            /* little-endian float32: this build only targets little-endian hosts */
            if (fwrite(lg, sizeof(float), (size_t)info.n_vocab, wf.f) != (size_t)info.n_vocab) {
                ws = pkv_err(PKV_ERR_IO, "%s: write failed", outp);
                pkv_wfile_abort(&wf);
            } else {
                ws = pkv_wfile_commit(&wf);
            }
        }
        if (ws) {
            pkv_cli_fail("logits", "-o", ws);
            goto out;
        }
        fprintf(stderr, "pagekv logits: wrote %d float32 logits to %s\n", info.n_vocab, outp);
    } else {
        printf("{\"n_tokens\": %zu, \"n_vocab\": %d, \"logits\": [", n, info.n_vocab);
        for (int i = 0; i < info.n_vocab; i++) printf("%s%.9g", i ? ", " : "", (double)lg[i]);
        printf("]}\n");
    }
    rc = 0;
out:
    free(ids);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_cli_encoded_free(&enc);
    pkv_model_free(m);
    return rc;
}
