/* pagekv serve: an OpenAI-compatible HTTP server (libmicrohttpd + jansson).
 * Internal header shared by the files of src/server/ and src/cli/cmd-serve.c.
 *
 * Threads: libmicrohttpd runs one thread per connection; those threads parse
 * requests, tokenize (the tokenizer is read-only after load) and format
 * responses. Everything that touches the model or the KV cache (prefill,
 * decode, fork, truncate, swap, cache statistics) runs on ONE worker thread
 * (server-gen.c), because a model and its cache are used by one thread at a
 * time. Connection threads hand work to it and wait on a condition variable. */
#ifndef PKV_SERVER_H
#define PKV_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pagekv.h"
#include "setup/setup.h" /* model and cache setup, shared with the CLI below both */

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
    /* called once, when listening, with the startup banner (what was loaded, the
     * URL; lines ending in newlines); NULL = silent */
    void (*on_ready)(const char *banner, void *ud);
    void *on_ready_ud;
} pkv_serve_opts;

pkv_serve_opts pkv_serve_default_opts(void);

/* Load the model, start serving, return the process exit code after SIGINT or
 * SIGTERM (in-flight requests are drained first). */
int pkv_serve_run(const pkv_setup_model_opts *mo, const pkv_serve_opts *so);

/* ---------------------------------------------------------- chat templates */

typedef enum pkv_tpl {
    PKV_TPL_NONE = 0,
    PKV_TPL_CHATML,   /* <|im_start|>role ... <|im_end|> (Qwen, many fine-tunes) */
    PKV_TPL_LLAMA3,   /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
    PKV_TPL_LLAMA2,   /* [INST] <<SYS>> ... <</SYS>> ... [/INST] */
    PKV_TPL_MISTRAL,  /* [INST] ... [/INST] without <<SYS>> */
    PKV_TPL_GEMMA,    /* <start_of_turn>user ... <end_of_turn> */
    PKV_TPL_PHI3,     /* <|user|> ... <|end|> */
    PKV_TPL_DEEPSEEK, /* <｜User｜> ... <｜Assistant｜> (DeepSeek V2/V3/R1) */
    PKV_TPL_COUNT
} pkv_tpl;

/* Family by name ("chatml", "qwen", "llama3", ...); PKV_TPL_NONE when unknown. */
pkv_tpl pkv_tpl_from_name(const char *name);
const char *pkv_tpl_name(pkv_tpl t);
/* The names accepted by --chat-template, comma separated. */
const char *pkv_tpl_names(void);
/* Recognise a Jinja chat template (tokenizer.chat_template) by its markers.
 * PKV_TPL_NONE when no family's markers are present. */
pkv_tpl pkv_tpl_detect(const char *tmpl, size_t len);
/* The Jinja source of a built-in family's template (--chat-template NAME). */
const char *pkv_tpl_source(pkv_tpl t);

/* A chat template ready to render requests (chat-template.c over jinja.c). */
typedef struct pkv_chat pkv_chat;
struct json_t;
/* Parse src and find what it does with its inputs (system role, content parts,
 * tool calls, object arguments), as llama.cpp does. bos/eos: the vocabulary's
 * BOS/EOS text (bos_token, eos_token); add_bos/add_eos: the tokenizer adds them,
 * so a rendered prompt's leading BOS / trailing EOS text is taken off. NULL with
 * a reason in err when the template does not parse. */
pkv_chat *pkv_chat_init(const char *src, size_t len, const char *bos, const char *eos, bool add_bos, bool add_eos,
                        char *err, size_t err_size);
void pkv_chat_free(pkv_chat *c);
/* Whether the template renders a system message (else llama.cpp's rule: the
 * first system text is joined to the next message). */
bool pkv_chat_system_role(const pkv_chat *c);
/* The template's Jinja source (NUL-terminated), e.g. for its tool-call markers. */
const char *pkv_chat_source(const pkv_chat *c);
/* Render a chat request body (messages, tools, add_generation_prompt,
 * continue_final_message, chat_template_kwargs, reasoning_effort) the way
 * llama.cpp's server does. now: the clock for dates (0 = now). Returns the
 * malloc'd prompt (*len bytes) and, when spans is not NULL, *n_spans sorted
 * [start, end) pairs in *spans that came from the request, for
 * pkv_model_tokenize_spans. NULL with *status (400, or 500 for out of memory)
 * and err: a template's raise_exception gives its own message. */
char *pkv_chat_apply(const pkv_chat *c, struct json_t *body, int64_t now, size_t *len, size_t **spans, size_t *n_spans,
                     int *status, char *err, size_t err_size);
/* The same within lim (jinja.h: time, work, memory, a shared memory budget, a
 * cancel callback; NULL = the interpreter's defaults). A limit reached is a 400
 * naming it, the shared budget spent a 503, a cancel 499. */
struct pkv_jinja_limits;
char *pkv_chat_apply_ex(const pkv_chat *c, struct json_t *body, int64_t now, const struct pkv_jinja_limits *lim, size_t *len,
                        size_t **spans, size_t *n_spans, int *status, char *err, size_t err_size);
/* Texts that end an assistant turn in this family (special tokens); the server
 * stops on each that is one token of the vocabulary. NULL-terminated. */
const char *const *pkv_tpl_end_texts(pkv_tpl t);

/* ------------------------------------------------------------------ utf-8 */

/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8
 * sequence that could still be completed by more bytes. */
size_t pkv_utf8_stable(const char *s, size_t n);
/* s[0..n) with every invalid byte replaced by U+FFFD; malloc'd, *out_len set. */
char *pkv_utf8_sanitize(const char *s, size_t n, size_t *out_len);
/* True when s[0..n) is valid UTF-8 without NUL bytes. */
bool pkv_utf8_valid(const char *s, size_t n);

#endif
