/* pagekv serve: the OpenAI-compatible HTTP server (src/server/, docs/server.md).
 * Built when libmicrohttpd and jansson are found; otherwise this command says
 * what to install. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"
#ifdef PKV_HAVE_SERVER
#include "chat/chat.h"
#include "setup/serve.h"
#endif

#ifndef PKV_HAVE_SERVER
int pkv_cli_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "pagekv serve: this pagekv was built without the HTTP server: it needs libmicrohttpd (HTTP) and "
                    "jansson (JSON).\n"
                    "Install them (Debian/Ubuntu: sudo apt-get install pkg-config libmicrohttpd-dev libjansson-dev) "
                    "and rebuild (make build; a fresh build folder picks them up).\n");
    return 1;
}
#else

static void serve_usage(FILE *f) {
    pkv_serve_opts d = pkv_serve_default_opts();
    fprintf(f,
            "usage: pagekv serve [-m FILE.gguf] [options]\n"
            "An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/embeddings,\n"
            "/v1/rerank, /v1/models), plus Anthropic's Messages API (/v1/messages,\n"
            "/v1/messages/count_tokens),\n"
            "/tokenize, /detokenize, /health, /metrics (Prometheus) and the contexts API (/v1/contexts:\n"
            "fork, append, truncate, generate over HTTP). See docs/server.md.\n"
            "  -m, --model FILE       GGUF model (without -m: the built-in tiny model, random weights)\n"
            "  --host ADDR            IPv4 address to listen on (default %s: this machine only)\n"
            "  --port N               port (default %d; 0 = any free port)\n"
            "  --port-file FILE       write the port there once listening\n"
            "  -c, --ctx-size N       tokens per sequence (default: min(model's, 4096))\n"
            "  --parallel N           sequences decoded together per step (default %d)\n"
            "  --batch-tokens N       tokens per engine step: decode tokens + prefill chunks (default 256)\n"
            "  --kv-pages N | --kv-mem MiB   device KV pool (default: parallel x context)\n"
            "  --swap-mem MiB         host swap pool for idle contexts (default: as large as the device pool)\n"
            "  --kv-disk DIR          keep full prefix pages in DIR too (a disk tier: they outlive eviction and\n"
            "                         restarts; one server per DIR; not for chunked attention: Llama 4)\n"
            "  --kv-disk-size MiB     the most page files DIR may hold (default 1024; least recently used go first)\n"
            "  --kv-spill MODE        a preempted sequence the swap pool cannot take, with --kv-disk: auto\n"
            "                         (default: spill its pages to DIR when that measures cheaper than\n"
            "                         recomputing them), always, never\n"
            "  --kv-remote URL        share full prefix pages with other servers of the same model through\n"
            "                         Redis: redis://[user:password@]HOST[:PORT][/DB] (a Redis tier below\n"
            "                         memory and --kv-disk; an unreachable Redis is a warning, retried;\n"
            "                         not for chunked attention: Llama 4; docs/distributed.md)\n"
            "  --kv-remote-queue N    pages waiting to be written to Redis at most; more are skipped (default 256)\n"
            "  --page-size N          KV page size in tokens (default 16)\n"
            "  --kv-type T            KV page type, K and V: f16 (default), f32, q8_0, q4_0\n"
            "  --kv-type-k T, --kv-type-v T   K and V page types separately\n"
            "  --api-key KEY          require 'Authorization: Bearer KEY' (also from PKV_API_KEY)\n"
            "  --chat-template NAME|FILE  a built-in template (%s) or a Jinja file\n"
            "                         instead of the model's tokenizer.chat_template (run by pagekv's Jinja)\n"
            "  --alias NAME           model id for /v1/models (default: the file name); also -a,\n"
            "                         --served-model-name (llama-server's and vLLM's names)\n"
            "  --seed N               sampling seed of requests that give none (default -1: a fresh one each)\n"
            "  --cors-origin ORIGIN   let browser pages from ORIGIN ('*' = any) call the server: CORS headers\n"
            "                         and preflights (default: none; OPTIONS is answered 204 either way)\n"
            "  --allowed-host NAME    answer requests with 'Host: NAME' too (repeatable, at most 16; '*' = any).\n"
            "                         Default: only IP addresses and localhost, or any with --api-key (a 403\n"
            "                         otherwise: DNS rebinding protection)\n"
            "  -np N                  as --parallel (llama-server's name); --jinja is accepted (the default)\n"
            "  --max-body BYTES       request body limit (default %zu) -> 413\n"
            "  --max-header BYTES     per-connection memory for request line + headers (default %zu) -> 431\n"
            "  --max-conns N          simultaneous connections (default %d)\n"
            "  --queue N              requests waiting for a slot before 503 (default %d)\n"
            "  --timeout S            idle connection timeout, slow clients (default %d)\n"
            "  --max-contexts N       contexts alive at once (default %d)\n"
            "  --context-swap S       swap idle contexts to host after S seconds (default %.0f; 0 = never)\n"
            "  --context-ttl S        drop idle contexts after S seconds (default %.0f; 0 = never)\n"
            "  --responses-max N      /v1/responses kept for previous_response_id, their conversations\n"
            "                         held in the KV cache (default %d; least recently used dropped first;\n"
            "                         0 = none kept)\n"
            "  --responses-ttl S      drop a stored response S seconds after its last use (default %.0f;\n"
            "                         0 = never)\n"
            "  --responses-pages N    KV pages the stored responses may hold together, device pages\n"
            "                         counted once plus host pages of swapped ones (default: a quarter\n"
            "                         of the device pool; least recently used dropped first)\n"
            "  --responses-history generated|template\n"
            "                         what a previous_response_id follow-up's model sees of the earlier\n"
            "                         turns: 'generated' (default) their tokens as the model wrote them\n"
            "                         (reasoning, tool calls), only the new input computed; 'template'\n"
            "                         the whole conversation as the chat template renders it, earlier\n"
            "                         turns recomputed from where the template rewrites them\n"
            "  --context-pages N      KV pages the contexts may hold together, device pages counted once\n"
            "                         plus host pages of swapped ones (default: half the device pool) -> 503\n"
            "  --special-in-content   let message text produce special tokens (default: message text is\n"
            "                         data; only the chat template's own markup makes special tokens)\n"
            "  --lenient-fields       ignore request fields unknown to OpenAI, llama-server and vLLM\n"
            "                         (default: a 400 naming the field, so a typo is never silently ignored)\n"
            "  --draft FILE           speculative decoding with this draft model (same vocabulary, its own\n"
            "                         cache, or a shared-KV draft over the model's): every response\n"
            "                         equals the one without (docs/engine.md)\n"
            "  --mtp                  the model's own MTP (nextn) head as the draft (qwen35, qwen35moe files with\n"
            "                         nextn layers), fed the model's hidden states\n"
            "  --spec ngram           n-gram drafts (prompt lookup): proposals from the sequence's own\n"
            "                         tokens, no draft model; for output that repeats its input (code\n"
            "                         edits, summaries, quotes). Every response equals the one without\n"
            "  --draft-max N          proposals per sequence and step (default 4, at most 64)\n"
            "  --draft-device NAME    device of a --draft model (default: the model's)\n"
            "  --mmproj FILE          a projector file (mmproj GGUF): audio (Voxtral) or images (Gemma 3) in\n"
            "                         chat content parts and POST /v1/audio/transcriptions (docs/server.md)\n"
            "  --max-media-bytes N    one medium's file size (an upload, a decoded base64 part) (default %zu) -> 413\n"
            "  --max-audio-seconds S  longer audio is refused (default %.0f) -> 400\n"
            "  --max-image-pixels N   images with more pixels are refused (default 50000000) -> 400\n"
            "  --template-time MS     one chat template render's wall-clock limit (default %lld) -> 400\n"
            "  --template-memory MiB  one chat template render's memory (default %lld) -> 400\n"
            "  --template-budget MiB  memory of all chat template renders running at once (default %lld) -> 503\n"
            "  --grammar-token-steps N    work limit of a request's grammar (grammar, response_format,\n"
            "                         tool_choice) per sampled token, in matcher steps (default 20000000,\n"
            "                         ~0.15 s); past it the request fails naming the limit\n"
            "  --grammar-request-steps N  the same for all of a request's tokens (default 1000000000)\n"
            "  --max-request-audio-seconds S  one request's audio together (default 1800) -> 400\n"
            "  --max-request-pixels N one request's images together (default 100000000) -> 400\n"
            "  --pooling TYPE         pooling of /v1/embeddings and /v1/rerank: none, mean, cls, last, rank\n"
            "                         (default: the model's ARCH.pooling_type; without one they answer 400)\n"
            "  --embd-normalize N     embeddings' normalisation: -1 none, 0 max-abs to int16 range, 2 Euclidean\n"
            "                         (default), p > 2 p-norm; a request's 'embd_normalize' overrides it\n"
            "  --max-embed-inputs N   inputs of one embeddings request, documents of one rerank (default %d) -> 400\n"
            "  --embedding, --reranking   accepted (llama-server's): the endpoints are always served;\n"
            "                         --reranking is --pooling rank\n"
            "  --media-cache-mb N     encoder outputs kept in host memory by media content, so the same\n"
            "                         file in a later request is not encoded again (default 256; 0 = off)\n"
            "  -t, --threads N, -d, --device NAME, --devices A,B, --split P,Q, --kv-on-host   as in 'pagekv run'\n"
            "  --lora FILE[:SCALE]    a LoRA adapter (repeatable, up to 8; scale default 1), id = its\n"
            "                         place on the command line: requests without 'lora' get these\n"
            "                         scales, a request's 'lora': [{\"id\": i, \"scale\": s}] its own (the\n"
            "                         others 0); GET/POST /lora-adapters list and set the scales\n"
            "  --detect-template FILE print the family a Jinja chat template file is recognised as, and exit\n"
            "SIGINT/SIGTERM: stop accepting, finish the requests in flight (at most 60 s), exit 0; during\n"
            "start-up (loading, compiling the chat template) they end the process at once.\n"
            "Under mpirun -np N the model's layers are split over the ranks: rank 0 serves HTTP and sends\n"
            "each engine step's requests to the others (not the contexts API, /v1/responses, --mmproj or\n"
            "constrained output; docs/distributed.md).\n",
            d.host, d.port, d.parallel, pkv_tpl_names(), d.max_body, d.max_header, d.max_conns, d.queue, d.timeout_s,
            d.max_contexts, d.ctx_swap_s, d.ctx_ttl_s, d.responses_max, d.responses_ttl_s, d.max_media_bytes, d.max_audio_seconds, (long long)d.template_time_ms,
            (long long)d.template_mem_mib, (long long)d.template_budget_mib, d.max_embed_inputs);
}

/* The server's startup banner, on stdout (tests and scripts read the URL there). */
static void show_banner(const char *banner, void *ud) {
    (void)ud;
    fputs(banner, stdout);
    fflush(stdout);
}

/* What `pagekv serve` was asked (the options table below fills it). */
typedef struct serve_args {
    pkv_cli_model_opts mo; /* first: pkv_cli_model_more */
    pkv_serve_opts so;
    const char *detect; /* --detect-template FILE: say its family and stop */
    bool help, stop, jinja;
} serve_args;

static bool serve_opt_ngl(void *opts, const char *opt, const char *v) {
    (void)opts;
    (void)v;
    fprintf(stderr, "pagekv serve: %s has no meaning here: pagekv does not offload a number of layers; the "
                    "whole model runs on -d DEVICE (e.g. -d vulkan:0), or split by heads over --devices A,B, "
                    "with the KV cache beside it (see 'pagekv devices')\n", opt);
    return false;
}

static bool serve_opt_simple(void *opts, const char *opt, const char *v) {
    (void)opts;
    (void)opt;
    (void)v;
    fprintf(stderr, "pagekv serve: --simple was retired: the serving engine runs every request, the contexts "
                    "API's generations included\n");
    return false;
}

static bool serve_opt_allowed_host(void *opts, const char *opt, const char *v) {
    pkv_serve_opts *so = &((serve_args *)opts)->so;
    (void)opt;
    if (so->n_allowed_hosts == PKV_SERVE_MAX_ALLOWED_HOSTS) {
        fprintf(stderr, "pagekv serve: --allowed-host given more than %d times\n", PKV_SERVE_MAX_ALLOWED_HOSTS);
        return false;
    }
    if (!*v || strchr(v, ':') || strchr(v, '/')) {
        fprintf(stderr, "pagekv serve: --allowed-host '%s' is not a host name (no port, no scheme)\n", v);
        return false;
    }
    so->allowed_hosts[so->n_allowed_hosts++] = v;
    return true;
}

static bool serve_opt_kv_spill(void *opts, const char *opt, const char *v) {
    pkv_serve_opts *so = &((serve_args *)opts)->so;
    (void)opt;
    if (!strcmp(v, "auto")) so->kv_spill = PKV_SPILL_AUTO;
    else if (!strcmp(v, "never")) so->kv_spill = PKV_SPILL_NEVER;
    else if (!strcmp(v, "always")) so->kv_spill = PKV_SPILL_ALWAYS;
    else {
        fprintf(stderr, "pagekv serve: --kv-spill %s: give auto, always or never\n", v);
        return false;
    }
    return true;
}

static bool serve_opt_spec(void *opts, const char *opt, const char *v) {
    pkv_serve_opts *so = &((serve_args *)opts)->so;
    (void)opt;
    if (strcmp(v, "ngram")) {
        fprintf(stderr, "pagekv serve: --spec %s: the only kind is ngram (a draft model is --draft FILE or --mtp)\n", v);
        return false;
    }
    so->spec_ngram = true;
    return true;
}

/* llama-server's --embedding: nothing to switch on here */
static bool serve_opt_accept(void *opts, const char *opt, const char *v) {
    (void)opts, (void)opt, (void)v;
    return true;
}

static bool serve_opt_rerank(void *opts, const char *opt, const char *v) {
    (void)opt, (void)v;
    ((serve_args *)opts)->so.pooling = PKV_POOLING_RANK;
    return true;
}

static bool serve_opt_pooling(void *opts, const char *opt, const char *v) {
    static const char *const names[] = {"none", "mean", "cls", "last", "rank"};
    pkv_serve_opts *so = &((serve_args *)opts)->so;
    (void)opt;
    for (int i = 0; i < 5; i++)
        if (!strcmp(v, names[i])) {
            so->pooling = i;
            return true;
        }
    fprintf(stderr, "pagekv serve: --pooling %s: give none, mean, cls, last or rank\n", v);
    return false;
}

static bool serve_opt_resp_history(void *opts, const char *opt, const char *v) {
    (void)opt;
    bool tpl = !strcmp(v, "template");
    if (!tpl && strcmp(v, "generated")) {
        fprintf(stderr, "pagekv serve: --responses-history %s: give generated or template\n", v);
        return false;
    }
    ((serve_args *)opts)->so.responses_template = tpl;
    return true;
}

static bool serve_opt_media_cache(void *opts, const char *opt, const char *v) {
    long long x;
    if (!pkv_cli_int(opt, v, 0, 1 << 20, &x)) return false;
    ((serve_args *)opts)->so.media_cache_bytes = (size_t)x << 20;
    return true;
}

static bool serve_opt_detect(void *opts, const char *opt, const char *v) {
    serve_args *a = opts;
    (void)opt;
    a->detect = v;
    a->stop = true;
    return true;
}

#define SV(name, alias, kind, field, lo, hi) PKV_CLI_OPT(serve_args, name, alias, kind, so.field, lo, hi)
#define SV_FN(name, fn) {name, NULL, PKV_CLI_FN, 0, 0, 0, fn, true}
static const pkv_cli_opt serve_options[] = {
    PKV_CLI_OPT(serve_args, "-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    SV("--host", NULL, PKV_CLI_STR, host, 0, 0),
    SV("--port", NULL, PKV_CLI_INT, port, 0, 65535),
    SV("--port-file", NULL, PKV_CLI_STR, port_file, 0, 0),
    /* llama-server's flag: the GGUF's Jinja template is what pagekv runs anyway */
    PKV_CLI_OPT(serve_args, "--jinja", NULL, PKV_CLI_FLAG, jinja, 0, 0),
    {"-ngl", "--n-gpu-layers", PKV_CLI_FN, 0, 0, 0, serve_opt_ngl, false},
    {"--gpu-layers", NULL, PKV_CLI_FN, 0, 0, 0, serve_opt_ngl, false},
    SV("--cors-origin", NULL, PKV_CLI_STR, cors_origin, 0, 0),
    SV_FN("--allowed-host", serve_opt_allowed_host),
    SV("--grammar-token-steps", NULL, PKV_CLI_INT64, grammar_token_steps, 1000, (double)INT64_MAX),
    SV("--grammar-request-steps", NULL, PKV_CLI_INT64, grammar_request_steps, 1000, (double)INT64_MAX),
    SV("--seed", NULL, PKV_CLI_INT64, seed, -1, (double)INT64_MAX),
    SV("--parallel", "-np", PKV_CLI_INT, parallel, 1, 256),
    SV("--batch-tokens", NULL, PKV_CLI_INT, batch_tokens, 1, 1 << 20),
    {"--simple", NULL, PKV_CLI_FN, 0, 0, 0, serve_opt_simple, false},
    SV("--lenient-fields", NULL, PKV_CLI_FLAG, lenient_fields, 0, 0),
    SV("--special-in-content", NULL, PKV_CLI_FLAG, special_in_content, 0, 0),
    SV("--context-pages", NULL, PKV_CLI_INT64, context_pages, 1, (double)(1ll << 40)),
    SV("--kv-pages", NULL, PKV_CLI_INT64, kv_pages, 1, (double)(1ll << 32)),
    SV("--kv-mem", NULL, PKV_CLI_INT64, kv_mem_mib, 1, 1 << 24),
    SV("--swap-mem", NULL, PKV_CLI_INT64, swap_mem_mib, 1, 1 << 24),
    SV("--kv-disk", NULL, PKV_CLI_STR, kv_disk, 0, 0),
    SV("--kv-disk-size", NULL, PKV_CLI_INT64, kv_disk_mib, 1, (double)(1ll << 30)),
    SV_FN("--kv-spill", serve_opt_kv_spill),
    SV("--kv-remote", NULL, PKV_CLI_STR, kv_remote, 0, 0),
    SV("--kv-remote-queue", NULL, PKV_CLI_INT, kv_remote_queue, 1, 1 << 20),
    SV_FN("--pooling", serve_opt_pooling),
    SV("--embd-normalize", NULL, PKV_CLI_INT, embd_normalize, -1, 64),
    SV("--max-embed-inputs", NULL, PKV_CLI_INT, max_embed_inputs, 1, 1 << 20),
    {"--embedding", "--embeddings", PKV_CLI_FN, 0, 0, 0, serve_opt_accept, false},
    {"--reranking", "--rerank", PKV_CLI_FN, 0, 0, 0, serve_opt_rerank, false},
    SV("--api-key", NULL, PKV_CLI_STR, api_key, 0, 0),
    SV("--chat-template", NULL, PKV_CLI_STR, chat_template, 0, 0),
    SV("--alias", "-a", PKV_CLI_STR, alias, 0, 0),
    SV("--served-model-name", NULL, PKV_CLI_STR, alias, 0, 0),
    SV("--max-body", NULL, PKV_CLI_SIZE, max_body, 1024, (double)(1ll << 30)),
    SV("--max-header", NULL, PKV_CLI_SIZE, max_header, 16384, 1 << 24),
    SV("--max-conns", NULL, PKV_CLI_INT, max_conns, 1, 65536),
    SV("--queue", NULL, PKV_CLI_INT, queue, 0, 1 << 20),
    SV("--timeout", NULL, PKV_CLI_INT, timeout_s, 1, 86400),
    SV("--max-contexts", NULL, PKV_CLI_INT, max_contexts, 1, 1 << 20),
    SV("--context-swap", NULL, PKV_CLI_DOUBLE, ctx_swap_s, 0, 1e9),
    SV("--context-ttl", NULL, PKV_CLI_DOUBLE, ctx_ttl_s, 0, 1e9),
    SV("--responses-max", NULL, PKV_CLI_INT, responses_max, 0, 1 << 20),
    SV("--responses-ttl", NULL, PKV_CLI_DOUBLE, responses_ttl_s, 0, 1e9),
    SV("--responses-pages", NULL, PKV_CLI_INT64, responses_pages, 1, (double)(1ll << 40)),
    SV_FN("--responses-history", serve_opt_resp_history),
    SV("--mmproj", NULL, PKV_CLI_STR, mmproj, 0, 0),
    SV("--max-media-bytes", NULL, PKV_CLI_SIZE, max_media_bytes, 1024, (double)(1ll << 30)),
    SV("--max-audio-seconds", NULL, PKV_CLI_DOUBLE, max_audio_seconds, 0.1, 86400),
    SV("--max-image-pixels", NULL, PKV_CLI_INT64, max_image_pixels, 1, (double)(1ll << 32)),
    SV("--template-time", NULL, PKV_CLI_INT64, template_time_ms, 1, 3600000),
    SV("--template-memory", NULL, PKV_CLI_INT64, template_mem_mib, 1, 1 << 20),
    SV("--template-budget", NULL, PKV_CLI_INT64, template_budget_mib, 1, 1 << 24),
    SV("--max-request-audio-seconds", NULL, PKV_CLI_DOUBLE, max_request_audio_seconds, 0.1, 864000),
    SV("--max-request-pixels", NULL, PKV_CLI_INT64, max_request_pixels, 1, (double)(1ll << 36)),
    SV_FN("--media-cache-mb", serve_opt_media_cache),
    SV("--draft", NULL, PKV_CLI_STR, draft, 0, 0),
    SV("--draft-device", NULL, PKV_CLI_STR, draft_device, 0, 0),
    SV("--draft-max", NULL, PKV_CLI_INT, draft_max, 1, 64),
    SV("--mtp", NULL, PKV_CLI_FLAG, mtp, 0, 0),
    SV_FN("--spec", serve_opt_spec),
    SV_FN("--detect-template", serve_opt_detect),
};
#undef SV_FN
#undef SV
static const pkv_cli_cmd serve_cmd = {"serve", serve_options, sizeof serve_options / sizeof serve_options[0],
                                      offsetof(serve_args, help), serve_usage, pkv_cli_model_more, false, true,
                                      offsetof(serve_args, stop)};

/* --detect-template FILE: its family on stdout; the exit code. */
static int detect_template(const char *path) {
    size_t len = 0;
    char *t = pkv_cli_read_text("serve", path, &len);
    if (!t) return 1;
    pkv_tpl tp = pkv_tpl_detect(t, len);
    free(t);
    if (tp == PKV_TPL_NONE) {
        fprintf(stderr, "pagekv serve: %s matches no known chat template family (%s)\n", path, pkv_tpl_names());
        return 1;
    }
    printf("%s\n", pkv_tpl_name(tp));
    return 0;
}

/* The draft options that do not go together: 0, or the exit code 2 (said). */
static int serve_check(const pkv_cli_model_opts *mo, const pkv_serve_opts *so) {
    const char *why = NULL;
    if (so->mtp && so->draft) why = "give --mtp (the model's own MTP head) or --draft FILE, not both";
    else if (so->mtp && !mo->model) why = "--mtp needs -m FILE with MTP layers (qwen35; 'pagekv mkmodel --arch qwen35 --mtp 1')";
    else if (so->spec_ngram && (so->draft || so->mtp))
        why = "--spec ngram needs no draft model: give it or --draft FILE / --mtp, not both";
    else if (so->spec_ngram && so->draft_device) why = "--draft-device is for a --draft model, not --spec ngram";
    else if (!so->draft && !so->mtp && !so->spec_ngram && (so->draft_device || so->draft_max))
        why = "--draft-device and --draft-max need --draft FILE, --mtp or --spec ngram";
    else if (so->mtp && so->draft_device)
        why = "--draft-device is for a --draft model; the MTP head runs where the model runs";
    if (!why) return 0;
    fprintf(stderr, "pagekv serve: %s\n", why);
    return 2;
}

static int serve_parse(int argc, char **argv, serve_args *a) {
    memset(a, 0, sizeof *a);
    a->mo = pkv_cli_model_defaults();
    a->so = pkv_serve_default_opts();
    a->so.api_key = getenv("PKV_API_KEY");
    if (a->so.api_key && !*a->so.api_key) a->so.api_key = NULL;
    int rc = pkv_cli_parse(&serve_cmd, argc, argv, a);
    if (rc == 0 && a->detect) return detect_template(a->detect);
    if (rc >= 0) return rc;
    return serve_check(&a->mo, &a->so) ? 2 : -1;
}

int pkv_cli_serve(int argc, char **argv) {
    serve_args a;
    int rc = serve_parse(argc, argv, &a);
    if (rc >= 0) return rc;
    a.so.on_ready = show_banner;
    return pkv_serve_run(&a.mo, &a.so);
}
#endif
