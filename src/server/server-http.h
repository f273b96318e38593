/* Shared by the HTTP layer (server-http.c) and the endpoint handlers
 * (server-api.c: OpenAI endpoints; server-contexts.c: the contexts API). */
#ifndef PKV_SERVER_HTTP_H
#define PKV_SERVER_HTTP_H

#include <jansson.h>
#include <pthread.h>

#include "chat/jinja.h"
#include "server/server-gen.h"
#include "server/server.h"

typedef struct srv {
    pkv_serve_opts o;
    pkv_model *m;
    pkv_model *draft;      /* speculative decoding's draft (--draft, --mtp), or NULL */
    pkv_model_info draft_info; /* its info (when draft) */
    pkv_kv_cache *c;
    srv_gen *g;
    pkv_engine *follow; /* a rank > 0 under mpirun: the engine that follows rank 0's (no HTTP, no worker) */
    pkv_model_info info;
    char model_id[256];
    char model_path[1024]; /* the GGUF file served (/props) */
    pkv_tpl tpl;           /* the family the template's markers name (end-of-turn tokens); may be NONE */
    pkv_chat *chat;        /* the chat template run for /v1/chat/completions; NULL: none */
    char *rerank_tpl;      /* the file's tokenizer.chat_template.rerank (/v1/rerank); NULL: none */
    pkv_mmproj *mm;        /* --mmproj: the projector for audio or images; NULL: none */
    pkv_mmproj_info mm_info;
    struct srv_media_cache *mcache; /* encoder outputs by media key (--media-cache-mb); NULL: none */
    char tpl_name[64];     /* what /v1/models reports: a family name, "jinja" or "none" */
    int32_t stop_ids[16];  /* the template's end-of-turn tokens */
    int n_stop_ids;
    int64_t n_ctx;
    int64_t ctx_pages;     /* the contexts' page quota in force */
    int64_t responses_pages; /* the stored responses' page budget in force (--responses-pages) */
    int64_t created;       /* unix time of startup, for /v1/models */
    uint64_t page_bytes;   /* bytes of one KV page, all layers */
    pthread_mutex_t mu;    /* guards the counters below */
    uint64_t http_count[600]; /* responses by status code */
    uint64_t disconnects;  /* requests cancelled because the client went away */
    uint64_t resp_spliced; /* previous_response_id follow-ups that continued the stored context's tokens */
    uint64_t resp_recut;   /* ... that fell back to cutting it where the re-rendered prompt differs */
    uint64_t resp_generated; /* spliced ones whose template renders the earlier turns otherwise: the
                                stored turns kept as generated (--responses-history generated) */
    int inflight;          /* requests between their first byte and their completion */
    uint64_t seq;          /* for response ids */
    /* Large texts are tokenized SRV_TOK_SLOTS at a time (the tokenizer's scratch is
     * ~40 bytes per byte of text): the server's peak memory does not grow with the
     * number of connections sending them. */
    pthread_mutex_t tok_mu;
    pthread_cond_t tok_cv;
    int tok_busy;
    pkv_jinja_budget tpl_budget; /* memory of the chat template renders running now (--template-budget) */
    atomic_bool stopping;        /* shutting down: renders still running are cancelled */
    struct srv_resp_store *responses; /* stored /v1/responses (server-responses.c); NULL: none kept */
    /* --lora: the adapters (id = index) and the scales of requests without 'lora',
     * under mu; lora_set: POST /lora-adapters changed them from the model's default
     * set, so such requests name them (pkv_request_params.lora) */
    int n_lora;
    pkv_lora_use lora[PKV_MAX_LORA];
    bool lora_set;
} srv;

#define SRV_TOK_SLOTS 2
#define SRV_TOK_BIG ((size_t)64 << 10) /* texts from this size on take a slot */

typedef struct srv_stream srv_stream;

/* A response body produced piece by piece while it is sent, so a large answer
 * (logprobs of many tokens, the ids of a long text) never exists whole in memory:
 * read gives the next bytes (0 at the end, < 0 on error); free releases it. */
typedef struct srv_body {
    ssize_t (*read)(struct srv_body *b, char *buf, size_t max);
    void (*free)(struct srv_body *b);
} srv_body;

/* What a handler answers: a JSON body, a text body, or a stream. */
typedef struct srv_out {
    int status;
    bool preflight;        /* an answer to a CORS preflight (OPTIONS) */
    json_t *json;          /* owned */
    char *text;            /* owned (malloc) */
    const char *ctype;     /* for text */
    srv_stream *stream;    /* owned */
    srv_body *body;        /* owned; a lazily produced body of type ctype */
    int retry_after;       /* seconds, for 503 */
    bool no_cache;         /* a snapshot: Cache-Control: no-store */
    const void *data;      /* a static body of data_len bytes of type ctype (the web page's files) */
    size_t data_len;
} srv_out;

/* An OpenAI error object: {"error": {"message", "type", "param", "code"}}. */
void srv_error(srv_out *o, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The connection's socket, to notice a client that went away while waiting. */
typedef struct srv_conn {
    int fd;           /* -1: no socket (never "gone") */
    void *mhd;        /* struct MHD_Connection; NULL outside the HTTP layer */
    unsigned timeout; /* --timeout, seconds */
    void (*set_timeout)(void *mhd, unsigned seconds); /* the HTTP layer's; may be NULL */
    const char *content_type; /* the request's Content-Type header; NULL when absent */
} srv_conn;
/* True when the peer closed the connection. */
bool srv_conn_gone(const srv_conn *c);
/* The idle timeout is for the client: while the server itself is busy (waiting
 * for the worker) it is off, and switching it back on restarts its timer. */
void srv_conn_waiting(const srv_conn *c, bool waiting);

/* Wait on r->cv (r->mu held) for at most 200 ms: the waits below check the
 * client between wake-ups. */
void srv_req_wait_200ms(srv_req *r);
/* Wait for r to finish (checking every 200 ms that the client is still there;
 * if not, cancel it). Returns false when the client went away. */
bool srv_wait_done(srv *s, srv_req *r, const srv_conn *conn);

/* Streams (server-api.c): next bytes of the SSE body. Blocks until there are
 * some; 0 at the end. < 0 on error. */
ssize_t srv_stream_read(srv_stream *st, char *buf, size_t max);
void srv_stream_free(srv_stream *st); /* cancels the request if unfinished */

/* Start serving model s->m with options s->o (the caller set both): the chat
 * template (forced, or detected in model_path's GGUF; NULL = none), the KV cache
 * or serving engine and the worker thread. false with a message on stderr. */
bool srv_start(srv *s, const char *model_path, const pkv_setup_model_opts *mo);
/* Stop the worker, free the cache/engine (not the model). */
void srv_stop(srv *s);
/* Answer one request: method, path, body bytes (may be empty), the value of
 * the Authorization header (NULL when absent) and the connection. Sets o. */
void srv_handle(srv *s, const char *method, const char *url, const char *body, size_t len,
                const char *authorization, const srv_conn *sc, srv_out *o);

/* Handlers. body is the parsed JSON (NULL for GET/DELETE). */
void srv_api_models(srv *s, srv_out *o);
void srv_api_lora_get(srv *s, srv_out *o);                 /* GET /lora-adapters */
void srv_api_lora_post(srv *s, json_t *body, srv_out *o);  /* POST /lora-adapters */
void srv_api_model(srv *s, const char *id, srv_out *o); /* GET /v1/models/{id} */
void srv_api_props(srv *s, srv_out *o);                 /* GET /props */
void srv_api_completions(srv *s, json_t *body, bool chat, const srv_conn *conn, srv_out *o);
/* A completion (api SRV_FMT_COMPLETION) or a chat completion of an OpenAI body,
 * answered as api says: SRV_FMT_CHAT (OpenAI's chat answer), SRV_FMT_MESSAGES
 * (Anthropic's, the body converted by server-messages.c). */
void srv_api_generate(srv *s, json_t *body, int api, const srv_conn *conn, srv_out *o);
/* POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over
 * the chat machinery (server-messages.c). */
void srv_api_messages(srv *s, json_t *body, const srv_conn *conn, srv_out *o);
void srv_api_count_tokens(srv *s, json_t *body, const srv_conn *conn, srv_out *o);
/* An error answer of OpenAI's shape turned into Anthropic's:
 * {"type": "error", "error": {"type", "message"}}. */
void srv_error_anthropic(srv_out *o);
void srv_api_tokenize(srv *s, json_t *body, srv_out *o);
/* server-embed.c: POST /v1/embeddings (oai) and llama-server's /embeddings; /v1/rerank */
void srv_api_embeddings(srv *s, json_t *body, bool oai, const srv_conn *conn, srv_out *o);
void srv_api_rerank(srv *s, json_t *body, const srv_conn *conn, srv_out *o);
void srv_api_detokenize(srv *s, json_t *body, srv_out *o);
/* POST /apply-template: the chat body in, {"prompt": "..."} out (llama-server's). */
void srv_api_apply_template(srv *s, json_t *body, srv_out *o);
/* The chat prompt of an OpenAI chat body, rendered by the template (malloc'd,
 * *len bytes; *spans: its data spans); NULL with the error in o. */
char *srv_chat_prompt(srv *s, json_t *body, const srv_conn *conn, size_t *len, size_t **spans, size_t *n_spans,
                      srv_out *o);
/* GET /v1/kv: the KV cache's pages, sequences and contexts as JSON (server-kv.c) */
void srv_api_kv(srv *s, srv_out *o);
/* The web page's files, compiled in (server-web.c and the generated
 * web-assets.c): true with the body and its type for GET of "/" and its files. */
bool srv_web_asset(const char *url, const void **data, size_t *len, const char **ctype);
/* /v1/contexts[/...]: rest is what follows "/v1/contexts" */
void srv_api_contexts(srv *s, const char *method, const char *rest, json_t *body, const srv_conn *conn, srv_out *o);

/* /v1/responses[/...] (server-responses.c): rest is what follows "/v1/responses". */
void srv_api_responses(srv *s, const char *method, const char *rest, json_t *body, const srv_conn *conn, srv_out *o);
/* The store of responses kept for previous_response_id (--responses-max, --responses-ttl):
 * new returns NULL out of memory; free drops the entries (not their contexts: the
 * worker frees those with the rest). */
struct srv_resp_store *srv_resp_store_new(int max, double ttl_s);
void srv_resp_store_free(struct srv_resp_store *st);

/* Helpers shared by the handlers. */
/* Tokenize text; malloc'd ids in *out. false with an error in o. */
bool srv_tokenize(srv *s, const char *text, size_t len, bool add_special, bool parse_special, int32_t **out,
                  int *n, srv_out *o);
/* srv_tokenize of a rendered chat prompt: special tokens only outside the data
 * spans (the messages' text; pkv_model_tokenize_spans), unless the server allows
 * them in content (--special-in-content). */
bool srv_tokenize_spans(srv *s, const char *text, size_t len, const size_t *spans, size_t n_spans, int32_t **out,
                        int *n, srv_out *o);
/* srv_tokenize_spans with add_special chosen (a prompt cut in pieces around media:
 * only the first piece gets the BOS). */
bool srv_tokenize_part(srv *s, const char *text, size_t len, bool add_special, const size_t *spans, size_t n_spans,
                       int32_t **out, int *n, srv_out *o);
/* Media (server-api-media.c; docs/server.md "Audio and images"). */
struct srv_media_list;
struct srv_media_opts;
/* The limits and kinds this server takes (from --mmproj and the --max-media-* options). */
void srv_media_opts_get(srv *s, struct srv_media_opts *mo, const srv_conn *conn);
/* The encoder-output cache (server-api-media.c): rows of media already encoded,
 * by media key, least recently used dropped past max_bytes (0: nothing kept, the
 * counters still count). new returns NULL out of memory; free takes NULL. */
struct srv_media_cache *srv_media_cache_new(size_t max_bytes);
void srv_media_cache_free(struct srv_media_cache *c);
typedef struct srv_media_cache_stats {
    uint64_t hits, misses, evictions, bytes, max_bytes, entries;
} srv_media_cache_stats;
void srv_media_cache_get_stats(struct srv_media_cache *c, srv_media_cache_stats *st);
/* A chat prompt holding media: text is the rendered prompt (spans: its data spans)
 * with ml->marker where each medium goes. Sets r->prompt (the text tokens, the
 * projector's begin/end tokens around each medium included), r->media (each
 * medium encoded by the projector on the worker thread, one medium per call
 * between engine steps, stopping when conn's client went away) and the row
 * counts. false with the answer in o. */
bool srv_media_chat_prompt(srv *s, const char *text, size_t len, const size_t *spans, size_t n_spans,
                           struct srv_media_list *ml, srv_req *r, const srv_conn *conn, srv_out *o);
/* POST /v1/audio/transcriptions (multipart/form-data; conn->content_type). */
void srv_api_transcriptions(srv *s, const char *body, size_t len, const srv_conn *conn, srv_out *o);
/* A token array from JSON (every element an integer in [0, n_vocab)). */
bool srv_json_tokens(srv *s, json_t *a, const char *field, int32_t **out, int *n, srv_out *o);
enum { SRV_FMT_CHAT, SRV_FMT_COMPLETION, SRV_FMT_CONTEXT, SRV_FMT_MESSAGES };
/* Sampling, length, n, logprobs and stop parameters shared by completions and
 * contexts/generate (fmt selects the defaults and the logprobs syntax). */
bool srv_parse_sampling(srv *s, json_t *body, srv_req *r, int fmt, bool *logprobs, srv_out *o);
/* The bytes of token id, sanitized to UTF-8, as a JSON string. */
json_t *srv_token_string(srv *s, int32_t id);
/* A finished or streaming request's text segment as a JSON string (UTF-8 sanitized). */
json_t *srv_text_json(const char *p, size_t n);
/* A streaming response over r; fmt selects the chunk format. */
srv_stream *srv_stream_new(srv *s, srv_req *r, int fmt, bool logprobs, bool include_usage, const char *id,
                           const srv_conn *conn);
void srv_next_id(srv *s, const char *prefix, char *buf, size_t size);
/* A tool call's id of 9 letters and digits (a hash of the long id `id`): Mistral
 * Nemo's template refuses any other id when the call comes back. */
void srv_short_id(const char *id, char out[10]);
/* Submit r and answer: a stream (o->stream set, status 200), or wait for it to
 * finish. Returns true when r finished without error and the caller writes the
 * body; false when o already holds the answer (stream or error: 503 queue full,
 * 499 client gone, 500, or r's own error). id: "chatcmpl-…" or a context id. */
bool srv_submit_and_wait(srv *s, srv_req *r, int fmt, bool logprobs, bool include_usage, const char *id,
                         const srv_conn *conn, srv_out *o);

/* A JSON object's string member k, or NULL (absent or not a string). */
static inline const char *srv_jstr(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Whether a JSON object has member k with a value other than null. */
static inline bool srv_jpresent(json_t *b, const char *k) {
    json_t *v = json_object_get(b, k);
    return v && !json_is_null(v);
}

#endif
