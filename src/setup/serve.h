/* pagekv serve's entry point and options: the small surface the CLI
 * (src/cli/cmd-serve.c) needs from the server (src/server/, which implements it).
 * It lives beside setup.h, the model and cache setup that both share, so that
 * nothing outside src/server/ includes a server header. */
#ifndef PKV_SERVE_H
#define PKV_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pagekv.h"
#include "setup/setup.h"

#define PKV_SERVE_MAX_ALLOWED_HOSTS 16 /* --allowed-host given at most this often */

typedef struct pkv_serve_opts {
    const char *host;          /* IPv4 address to bind; default 127.0.0.1 */
    int port;                  /* 0 = any free port (printed, and written to port_file) */
    const char *port_file;     /* when set, the port is written there once listening */
    int parallel;              /* sequences decoded together per step (requests x n) */
    int64_t kv_pages;          /* device KV pages; 0 = from kv_mem_mib or the default */
    int64_t kv_mem_mib;        /* device KV budget in MiB; 0 = default */
    int64_t swap_mem_mib;      /* host swap pool in MiB; 0 = as many pages as the device pool */
    const char *kv_disk;       /* disk tier directory (pkv_cache_params.disk_dir); NULL = none */
    int64_t kv_disk_mib;       /* its cap in MiB; 0 = the library's default (1 GiB) */
    int kv_spill;              /* pkv_spill_mode of preempted sequences with a disk tier; 0 = auto */
    const char *kv_remote;     /* remote tier URL (pkv_cache_params.remote_url, redis://...); NULL = none */
    int kv_remote_queue;       /* its write queue in pages; 0 = the library's default (256) */
    const char *api_key;       /* required as "Authorization: Bearer KEY"; NULL = none */
    const char *chat_template; /* a family name forcing the chat template; NULL = detect */
    const char *alias;         /* model id reported by /v1/models; NULL = file name */
    size_t max_body;           /* request body limit in bytes */
    size_t max_header;         /* per-connection memory for the request line and headers */
    int max_conns;             /* simultaneous connections */
    int queue;                 /* requests waiting for a slot before 503 */
    int timeout_s;             /* idle connection timeout (slow clients) */
    int max_contexts;          /* contexts of the contexts API alive at once */
    double ctx_swap_s;         /* idle contexts are swapped to host after this */
    double ctx_ttl_s;          /* idle contexts are dropped after this */
    int responses_max;         /* /v1/responses kept for previous_response_id (least recently used
                                  dropped first); 0 = none kept */
    double responses_ttl_s;    /* a stored response is dropped this long after it was last used
                                  (created, read or continued); 0 = never */
    int64_t responses_pages;   /* the most KV pages stored responses may hold together (device
                                  pages counted once + host pages of swapped ones; least recently
                                  used dropped first); 0 = a quarter of the device pool */
    bool responses_template;   /* a previous_response_id follow-up is the whole conversation as the
                                  chat template renders it (--responses-history template: earlier
                                  turns recomputed where the template rewrites them); off = the
                                  stored turns as generated, then the new input (docs/server.md) */
    int max_tokens_default;    /* /v1/completions without max_tokens (OpenAI: 16) */
    int batch_tokens;          /* engine: tokens per step (decode + prefill chunks); 0 = 256 */
    bool special_in_content;   /* message text may produce special tokens (off: it is data) */
    bool lenient_fields;       /* unknown request fields are ignored (off: a 400 naming them) */
    const char *cors_origin;   /* Access-Control-Allow-Origin for browsers ("*" or an origin); NULL = none */
    /* Host header names answered besides IP literals and localhost (DNS
     * rebinding); "*" = any. Not checked when api_key is set. */
    const char *allowed_hosts[PKV_SERVE_MAX_ALLOWED_HOSTS];
    int n_allowed_hosts;
    int64_t seed;              /* sampling seed of requests without one; -1 = a fresh one each */
    /* work limits of a request's grammar (pkv_grammar_set_work_limits), in matcher
     * steps: per sampled token and per request; 0 = the library's defaults */
    int64_t grammar_token_steps, grammar_request_steps;
    /* speculative decoding in the serving engine (pkv_engine_params.draft) */
    const char *draft;         /* a draft model file with the model's vocabulary; NULL = none */
    bool mtp;                  /* the model file's own MTP head as the draft */
    const char *draft_device;  /* device of a --draft model; NULL = the model's */
    int draft_max;             /* proposals per sequence and step; 0 = 4 */
    bool spec_ngram;           /* --spec ngram: n-gram drafts (pkv_engine_params.draft_ngram), no model */
    /* media (docs/server.md "Audio and images") */
    const char *mmproj;        /* a projector file (an mmproj GGUF): audio or images in requests; NULL = none */
    size_t max_media_bytes;    /* one medium's encoded size (a file upload, a base64 payload decoded) -> 413 */
    double max_audio_seconds;  /* audio longer than this is refused (400) */
    int64_t max_image_pixels;  /* images with more pixels are refused (400); 0 = 50 megapixels */
    /* chat template renders (docs/server.md "Chat template limits") */
    int64_t template_time_ms;    /* one render's wall-clock limit -> 400 */
    int64_t template_mem_mib;    /* one render's memory -> 400 */
    int64_t template_budget_mib; /* all renders running at once -> 503 */
    double max_request_audio_seconds; /* one request's audio together (400); 0 = 1800 */
    int64_t max_request_pixels;       /* one request's images together (400); 0 = 100 megapixels */
    size_t media_cache_bytes;         /* encoder outputs kept by media key (host memory); 0 = none */
    int64_t context_pages;     /* the most KV pages the contexts API may hold (device pages
                                  counted once + host pages of swapped contexts);
                                  0 = half the device pool */
    /* embeddings and rerank (docs/server.md "Embeddings and rerank") */
    int pooling;               /* pkv_pooling of /v1/embeddings and /v1/rerank; -1 = the model's
                                  ARCH.pooling_type (none there: the endpoints answer 400) */
    int embd_normalize;        /* llama-server's --embd-normalize: -1 none, 0 max-abs (int16 range),
                                  2 Euclidean (default), p > 2 p-norm */
    int max_embed_inputs;      /* inputs of one embeddings request, documents of one rerank (default 2048) */
    /* called once, when listening, with the startup banner (what was loaded, the
     * URL; lines ending in newlines); NULL = silent */
    void (*on_ready)(const char *banner, void *ud);
    void *on_ready_ud;
} pkv_serve_opts;

pkv_serve_opts pkv_serve_default_opts(void);

/* Load the model, start serving, return the process exit code after SIGINT or
 * SIGTERM (in-flight requests are drained first). */
int pkv_serve_run(const pkv_setup_model_opts *mo, const pkv_serve_opts *so);
/* Block SIGINT, SIGTERM and SIGPIPE in this thread, and so in the threads it
 * starts after (pkv_serve_run takes the first two with sigwait). main calls it
 * before MPI starts its threads, which would otherwise take them. */
void pkv_serve_block_signals(void);

#endif
