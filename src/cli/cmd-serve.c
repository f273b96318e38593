/* pagekv serve: the OpenAI-compatible HTTP server (src/server/, docs/server.md).
 * Built when libmicrohttpd and jansson are found; otherwise this command says
 * what to install. */
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
            "An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models), plus\n"
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
            "                         restarts; one server per DIR; full-attention models only)\n"
            "  --kv-disk-size MiB     the most page files DIR may hold (default 1024; least recently used go first)\n"
            "  --kv-spill MODE        a preempted sequence the swap pool cannot take, with --kv-disk: auto\n"
            "                         (default: spill its pages to DIR when that measures cheaper than\n"
            "                         recomputing them), always, never\n"
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
            "  --context-pages N      KV pages the contexts may hold together, device pages counted once\n"
            "                         plus host pages of swapped ones (default: half the device pool) -> 503\n"
            "  --special-in-content   let message text produce special tokens (default: message text is\n"
            "                         data; only the chat template's own markup makes special tokens)\n"
            "  --lenient-fields       ignore request fields unknown to OpenAI, llama-server and vLLM\n"
            "                         (default: a 400 naming the field, so a typo is never silently ignored)\n"
            "  --draft FILE           speculative decoding with this draft model (same vocabulary, its own\n"
            "                         cache): every response equals the one without (docs/engine.md)\n"
            "  --mtp                  the model's own MTP (nextn) head as the draft (qwen35 files with\n"
            "                         nextn layers), fed the model's hidden states\n"
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
            "  --media-cache-mb N     encoder outputs kept in host memory by media content, so the same\n"
            "                         file in a later request is not encoded again (default 256; 0 = off)\n"
            "  -t, --threads N, -d, --device NAME, --devices A,B, --split P,Q, --kv-on-host   as in 'pagekv run'\n"
            "  --detect-template FILE print the family a Jinja chat template file is recognised as, and exit\n"
            "SIGINT/SIGTERM: stop accepting, finish the requests in flight (at most 60 s), exit 0; during\n"
            "start-up (loading, compiling the chat template) they end the process at once.\n",
            d.host, d.port, d.parallel, pkv_tpl_names(), d.max_body, d.max_header, d.max_conns, d.queue, d.timeout_s,
            d.max_contexts, d.ctx_swap_s, d.ctx_ttl_s, d.max_media_bytes, d.max_audio_seconds, (long long)d.template_time_ms,
            (long long)d.template_mem_mib, (long long)d.template_budget_mib);
}

/* The server's startup banner, on stdout (tests and scripts read the URL there). */
static void show_banner(const char *banner, void *ud) {
    (void)ud;
    fputs(banner, stdout);
    fflush(stdout);
}

int pkv_cli_serve(int argc, char **argv) {
    pkv_cli_model_opts mo = pkv_cli_model_defaults();
    pkv_serve_opts so = pkv_serve_default_opts();
    so.api_key = getenv("PKV_API_KEY");
    if (so.api_key && !*so.api_key) so.api_key = NULL;
    for (int i = 1; i < argc; i++) {
        int r = pkv_cli_model_opt(argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        long long x;
        double dd;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--host")) {
            if (!(so.host = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--port")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, 65535, &x)) return 2;
            so.port = (int)x;
        } else if (!strcmp(a, "--port-file")) {
            if (!(so.port_file = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--jinja")) {
            /* llama-server's flag: the GGUF's Jinja template is what pagekv runs anyway */
        } else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "--gpu-layers")) {
            fprintf(stderr, "pagekv serve: %s has no meaning here: pagekv does not offload a number of layers; the "
                            "whole model runs on -d DEVICE (e.g. -d vulkan:0), or split by heads over --devices A,B, "
                            "with the KV cache beside it (see 'pagekv devices')\n", a);
            return 2;
        } else if (!strcmp(a, "--cors-origin")) {
            if (!(so.cors_origin = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--allowed-host")) {
            if (!(v = pkv_cli_value(argc, argv, &i))) return 2;
            if (so.n_allowed_hosts == PKV_SERVE_MAX_ALLOWED_HOSTS) {
                fprintf(stderr, "pagekv serve: --allowed-host given more than %d times\n", PKV_SERVE_MAX_ALLOWED_HOSTS);
                return 2;
            }
            if (!*v || strchr(v, ':') || strchr(v, '/')) {
                fprintf(stderr, "pagekv serve: --allowed-host '%s' is not a host name (no port, no scheme)\n", v);
                return 2;
            }
            so.allowed_hosts[so.n_allowed_hosts++] = v;
        } else if (!strcmp(a, "--grammar-token-steps")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1000, INT64_MAX, &x)) return 2;
            so.grammar_token_steps = x;
        } else if (!strcmp(a, "--grammar-request-steps")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1000, INT64_MAX, &x)) return 2;
            so.grammar_request_steps = x;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, -1, INT64_MAX, &x)) return 2;
            so.seed = x;
        } else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 256, &x)) return 2;
            so.parallel = (int)x;
        } else if (!strcmp(a, "--batch-tokens")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1 << 20, &x)) return 2;
            so.batch_tokens = (int)x;
        } else if (!strcmp(a, "--simple")) {
            fprintf(stderr, "pagekv serve: --simple was retired: the serving engine runs every request, the contexts "
                            "API's generations included\n");
            return 2;
        } else if (!strcmp(a, "--lenient-fields")) {
            so.lenient_fields = true;
        } else if (!strcmp(a, "--special-in-content")) {
            so.special_in_content = true;
        } else if (!strcmp(a, "--context-pages")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1ll << 40, &x)) return 2;
            so.context_pages = x;
        } else if (!strcmp(a, "--kv-pages")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1ll << 32, &x)) return 2;
            so.kv_pages = x;
        } else if (!strcmp(a, "--kv-mem")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1 << 24, &x)) return 2;
            so.kv_mem_mib = x;
        } else if (!strcmp(a, "--swap-mem")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1 << 24, &x)) return 2;
            so.swap_mem_mib = x;
        } else if (!strcmp(a, "--kv-disk")) {
            if (!(so.kv_disk = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--kv-disk-size")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1ll << 30, &x)) return 2;
            so.kv_disk_mib = x;
        } else if (!strcmp(a, "--kv-spill")) {
            if (!(v = pkv_cli_value(argc, argv, &i))) return 2;
            if (!strcmp(v, "auto")) so.kv_spill = PKV_SPILL_AUTO;
            else if (!strcmp(v, "never")) so.kv_spill = PKV_SPILL_NEVER;
            else if (!strcmp(v, "always")) so.kv_spill = PKV_SPILL_ALWAYS;
            else {
                fprintf(stderr, "pagekv serve: --kv-spill %s: give auto, always or never\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--api-key")) {
            if (!(so.api_key = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--chat-template")) {
            if (!(so.chat_template = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--alias") || !strcmp(a, "-a") || !strcmp(a, "--served-model-name")) {
            if (!(so.alias = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-body")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1024, 1ll << 30, &x)) return 2;
            so.max_body = (size_t)x;
        } else if (!strcmp(a, "--max-header")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 16384, 1 << 24, &x)) return 2;
            so.max_header = (size_t)x;
        } else if (!strcmp(a, "--max-conns")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 65536, &x)) return 2;
            so.max_conns = (int)x;
        } else if (!strcmp(a, "--queue")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, 1 << 20, &x)) return 2;
            so.queue = (int)x;
        } else if (!strcmp(a, "--timeout")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 86400, &x)) return 2;
            so.timeout_s = (int)x;
        } else if (!strcmp(a, "--max-contexts")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1 << 20, &x)) return 2;
            so.max_contexts = (int)x;
        } else if (!strcmp(a, "--context-swap")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 0, 1e9, &dd)) return 2;
            so.ctx_swap_s = dd;
        } else if (!strcmp(a, "--context-ttl")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 0, 1e9, &dd)) return 2;
            so.ctx_ttl_s = dd;
        } else if (!strcmp(a, "--mmproj")) {
            if (!(so.mmproj = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-media-bytes")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1024, 1ll << 30, &x)) return 2;
            so.max_media_bytes = (size_t)x;
        } else if (!strcmp(a, "--max-audio-seconds")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 0.1, 86400, &dd)) return 2;
            so.max_audio_seconds = dd;
        } else if (!strcmp(a, "--max-image-pixels")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1ll << 32, &x)) return 2;
            so.max_image_pixels = x;
        } else if (!strcmp(a, "--template-time")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 3600000, &x)) return 2;
            so.template_time_ms = x;
        } else if (!strcmp(a, "--template-memory")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1 << 20, &x)) return 2;
            so.template_mem_mib = x;
        } else if (!strcmp(a, "--template-budget")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1 << 24, &x)) return 2;
            so.template_budget_mib = x;
        } else if (!strcmp(a, "--max-request-audio-seconds")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_float(a, v, 0.1, 864000, &dd)) return 2;
            so.max_request_audio_seconds = dd;
        } else if (!strcmp(a, "--max-request-pixels")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 1ll << 36, &x)) return 2;
            so.max_request_pixels = x;
        } else if (!strcmp(a, "--media-cache-mb")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, 1 << 20, &x)) return 2;
            so.media_cache_bytes = (size_t)x << 20;
        } else if (!strcmp(a, "--draft")) {
            if (!(so.draft = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--draft-device")) {
            if (!(so.draft_device = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--draft-max")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 64, &x)) return 2;
            so.draft_max = (int)x;
        } else if (!strcmp(a, "--mtp")) {
            so.mtp = true;
        } else if (!strcmp(a, "--detect-template")) {
            if (!(v = pkv_cli_value(argc, argv, &i))) return 2;
            size_t len = 0;
            char *t = pkv_cli_read_text("serve", v, &len);
            if (!t) return 1;
            pkv_tpl tp = pkv_tpl_detect(t, len);
            free(t);
            if (tp == PKV_TPL_NONE) {
                fprintf(stderr, "pagekv serve: %s matches no known chat template family (%s)\n", v, pkv_tpl_names());
                return 1;
            }
            printf("%s\n", pkv_tpl_name(tp));
            return 0;
        } else {
            fprintf(stderr, "pagekv serve: unknown option '%s'\n", a);
            serve_usage(stderr);
            return 2;
        }
    }
    if (so.mtp && so.draft) {
        fprintf(stderr, "pagekv serve: give --mtp (the model's own MTP head) or --draft FILE, not both\n");
        return 2;
    }
    if (so.mtp && !mo.model) {
        fprintf(stderr, "pagekv serve: --mtp needs -m FILE with MTP layers (qwen35; 'pagekv mkmodel --arch qwen35 --mtp 1')\n");
        return 2;
    }
    if (!so.draft && !so.mtp && (so.draft_device || so.draft_max)) {
        fprintf(stderr, "pagekv serve: --draft-device and --draft-max need --draft FILE or --mtp\n");
        return 2;
    }
    if (so.mtp && so.draft_device) {
        fprintf(stderr, "pagekv serve: --draft-device is for a --draft model; the MTP head runs where the model runs\n");
        return 2;
    }
    so.on_ready = show_banner;
    return pkv_serve_run(&mo, &so);
}
#endif
