/* The transport-independent core of pagekv serve: errors, request routing
 * (srv_handle: method + path + body -> an answer), API keys, /health and
 * /metrics, waiting for the worker, and starting/stopping the model's worker
 * (srv_start/srv_stop). The HTTP layer (server-http.c, libmicrohttpd) feeds
 * requests in; the fuzz harness fuzz/fuzz-server.c feeds request bodies in
 * directly. No libmicrohttpd here. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#include "engine/engine-dist.h"
#include "model/gguf.h"
#include "server/server-http.h"

pkv_serve_opts pkv_serve_default_opts(void) {
    pkv_serve_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.parallel = 4;
    o.seed = -1;
    o.max_body = 1u << 20;
    o.max_header = 64u << 10;
    o.max_conns = 256;
    o.queue = 64;
    o.timeout_s = 30;
    o.max_contexts = 256;
    o.ctx_swap_s = 300;
    o.ctx_ttl_s = 3600;
    o.responses_max = 256;
    o.responses_ttl_s = 3600;
    o.max_tokens_default = 16;
    o.max_media_bytes = (size_t)25 << 20; /* OpenAI's limit on audio uploads */
    o.max_audio_seconds = 1800;
    o.template_time_ms = 10000;
    o.template_mem_mib = 256;
    o.template_budget_mib = 1024;
    o.max_request_audio_seconds = 1800;
    o.max_request_pixels = (int64_t)100 * 1000 * 1000;
    o.media_cache_bytes = (size_t)256 << 20;
    o.pooling = -1;
    o.embd_normalize = 2;
    o.max_embed_inputs = 2048;
    return o;
}

/* ----------------------------------------------------------------- errors */

void srv_error(srv_out *o, int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n;
    char *clean = pkv_utf8_sanitize(msg, strlen(msg), &n); /* messages may quote client bytes */
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 503 ? "server_overloaded"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    json_decref(o->json);
    o->json = json_pack("{s:{s:s%,s:s,s:n,s:n}}", "error", "message", clean ? clean : "error", clean ? n : (size_t)5,
                        "type", type, "param", "code");
    free(clean);
    o->status = status;
    if (status == 503 && !o->retry_after) o->retry_after = 1;
}

bool srv_conn_gone(const srv_conn *c) {
    if (!c || c->fd < 0) return false;
    /* End of input is not a disconnect: a client may shut down its sending side
     * once the request is out (legal TCP; `nc -N`, many HTTP/1.0 clients) and still
     * read the answer. Only a reset or a socket error says the peer is gone; a
     * client that closed its socket whole is found when a write to it fails (a
     * stream's next chunk, or the answer itself). */
    struct pollfd p = {.fd = c->fd, .events = 0, .revents = 0};
    if (poll(&p, 1, 0) < 0) return false;
    return (p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0;
}

void srv_conn_waiting(const srv_conn *c, bool waiting) {
    if (c && c->mhd && c->set_timeout) c->set_timeout(c->mhd, waiting ? 0u : c->timeout);
}

void srv_req_wait_200ms(srv_req *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

bool srv_wait_done(srv *s, srv_req *r, const srv_conn *conn) {
    pthread_mutex_lock(&r->mu);
    while (!r->done) {
        srv_req_wait_200ms(r);
        if (!r->done && srv_conn_gone(conn)) {
            pthread_mutex_unlock(&r->mu);
            srv_gen_cancel(s->g, r);
            pthread_mutex_lock(&s->mu);
            s->disconnects++;
            pthread_mutex_unlock(&s->mu);
            return false;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return true;
}

void srv_next_id(srv *s, const char *prefix, char *buf, size_t size) {
    pthread_mutex_lock(&s->mu);
    uint64_t k = ++s->seq;
    pthread_mutex_unlock(&s->mu);
    snprintf(buf, size, "%s-%llx%06llu", prefix, (unsigned long long)s->created, (unsigned long long)k);
}

void srv_short_id(const char *id, char out[10]) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the long id, in base 62 */
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    static const char d62[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    for (int i = 0; i < 9; i++, h /= 62) out[i] = d62[h % 62];
    out[9] = 0;
}

/* ---------------------------------------------------------------- metrics */

static void metric(char **p, size_t *len, size_t *cap, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(*p ? *p + *len : NULL, *p ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (*p && *len + (size_t)k < *cap) {
            *len += (size_t)k;
            return;
        }
        size_t nc = (*cap + (size_t)k + 1) * 2;
        char *q = realloc(*p, nc);
        if (!q) return;
        if (!*p) q[0] = 0;
        *p = q;
        *cap = nc;
    }
}

static void hist(char **p, size_t *len, size_t *cap, const char *name, const char *help, const uint64_t *h,
                 const double *b, int nb, double sum, uint64_t count) {
    metric(p, len, cap, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < nb; i++) {
        cum += h[i];
        metric(p, len, cap, "%s_bucket{le=\"%g\"} %llu\n", name, b[i], (unsigned long long)cum);
    }
    cum += h[nb];
    metric(p, len, cap, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
           sum, name, (unsigned long long)count);
}

static void api_metrics(srv *s, srv_out *o) {
    srv_stats st;
    srv_gen_stats(s->g, &st);
    char *p = NULL;
    size_t len = 0, cap = 0;
#define G(name, help, v)                                                                                          \
    metric(&p, &len, &cap, "# HELP pagekv_" name " " help "\n# TYPE pagekv_" name " gauge\npagekv_" name " %lld\n", \
           (long long)(v))
#define C(name, help, v)                                                                                            \
    metric(&p, &len, &cap, "# HELP pagekv_" name " " help "\n# TYPE pagekv_" name " counter\npagekv_" name " %llu\n", \
           (unsigned long long)(v))
    G("requests_running", "Generation requests with sequences in the running batch.", st.running);
    G("requests_waiting", "Generation requests queued for a slot.", st.waiting);
    G("requests_swapped", "Preempted sequences in the host pool, plus idle contexts swapped out there.",
      st.seqs_swapped + st.contexts_swapped);
    G("sequences_preempted_recompute", "Preempted sequences without KV, to be recomputed.", st.seqs_recompute);
    G("contexts", "Contexts of the contexts API alive.", st.contexts);
    G("responses_contexts", "Contexts of /v1/responses: stored responses' conversations and responses generating.",
      st.contexts_responses);
    G("kv_pages_total", "Device KV pages in the pool.", st.kv.n_pages);
    G("kv_pages_used", "Device KV pages referenced by sequences.", st.kv.pages_used);
    G("kv_pages_free", "Device KV pages on the free list.", st.kv.pages_free);
    G("kv_pages_cached", "Unreferenced device KV pages kept for prefix reuse (evictable).", st.kv.pages_cached);
    G("kv_host_pages_total", "Pages of the host swap pool.", st.kv.host_pages);
    G("kv_host_pages_free", "Free pages of the host swap pool.", st.kv.host_free);
    C("prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", st.prefix_hit_tokens);
    if (s->o.kv_disk) { /* the disk tier (--kv-disk) */
        const pkv_kv_stats ks = st.kv; /* the worker's copy, as for the pool gauges above */
        G("kv_disk_enabled", "1 while the disk tier is in use; 0 after a write failed (serving goes on from memory).",
          ks.disk_enabled);
        C("kv_disk_hit_pages_total", "Pages a prefix match loaded from disk.", ks.disk_hit_pages);
        C("kv_disk_miss_pages_total", "Prefix matches that looked for their next page on disk and found no file.",
          ks.disk_miss_pages);
        C("kv_disk_rejected_files_total", "Page files that failed a check (size, fingerprints, checksum, tokens) and "
          "were removed unused.", ks.disk_rejected_files);
        C("kv_disk_written_pages_total", "Page files written.", ks.disk_written_pages);
        C("kv_disk_write_errors_total", "Failed page writes (the first turns the disk tier off).", ks.disk_write_errors);
        C("kv_disk_evicted_files_total", "Page files removed to stay under --kv-disk-size.", ks.disk_evicted_files);
        C("kv_disk_read_bytes_total", "Bytes of page files read.", ks.disk_bytes_read);
        C("kv_disk_written_bytes_total", "Bytes of page files written.", ks.disk_bytes_written);
        metric(&p, &len, &cap, "# HELP pagekv_kv_disk_read_seconds_total Time spent reading page files.\n"
               "# TYPE pagekv_kv_disk_read_seconds_total counter\npagekv_kv_disk_read_seconds_total %.6f\n",
               ks.disk_read_seconds);
        metric(&p, &len, &cap, "# HELP pagekv_kv_disk_write_seconds_total Time spent writing page files (with fsync "
               "and rename).\n# TYPE pagekv_kv_disk_write_seconds_total counter\n"
               "pagekv_kv_disk_write_seconds_total %.6f\n", ks.disk_write_seconds);
        G("kv_disk_files", "Page files in the directory.", ks.disk_files);
        G("kv_disk_bytes", "Bytes of the page files in the directory.", ks.disk_bytes_used);
        G("kv_disk_bytes_max", "The directory's cap (--kv-disk-size).", ks.disk_bytes_max);
        C("kv_disk_spills_total", "Preempted sequences whose pages were spilled to disk (the swap pool was full) "
          "instead of being recomputed (--kv-spill).", st.spills);
        C("kv_disk_spill_failures_total", "Spills that failed (a write error turned the disk tier off): those "
          "sequences are recomputed.", st.spill_failed);
        C("kv_disk_spill_written_pages_total", "Page files written by spills.", st.spill_pages_written);
        C("kv_disk_spill_written_bytes_total", "Bytes of page files written by spills.", st.spill_bytes_written);
        C("kv_disk_spill_read_pages_total", "Pages resumed spilled sequences loaded back from disk.",
          st.spill_pages_read);
    }
    if (s->o.kv_remote) { /* the remote tier (--kv-remote) */
        const pkv_kv_stats ks = st.kv;
        G("kv_remote_enabled", "1 while connected to the Redis tier; 0 in an outage (serving goes on without it).",
          ks.remote_enabled);
        C("kv_remote_hit_pages_total", "Pages a prefix match loaded from Redis.", ks.remote_hit_pages);
        C("kv_remote_miss_pages_total", "Lookups whose next page Redis did not have (never written, or evicted).",
          ks.remote_miss_pages);
        C("kv_remote_rejected_values_total", "Values that failed a check (size, fingerprints, checksum, tokens): "
          "deleted, never used.", ks.remote_rejected_values);
        C("kv_remote_written_pages_total", "Pages published to Redis.", ks.remote_written_pages);
        C("kv_remote_dropped_pages_total", "Pages not published: the write queue was full (--kv-remote-queue) or "
          "Redis was down.", ks.remote_dropped_pages);
        C("kv_remote_errors_total", "Failed connects and commands (each starts a back-off of 1 s, doubling to 8 s in one outage).", ks.remote_errors);
        C("kv_remote_lookups_total", "Pipelined lookup round trips.", ks.remote_lookups);
        C("kv_remote_read_bytes_total", "Bytes of values read.", ks.remote_bytes_read);
        C("kv_remote_written_bytes_total", "Bytes of values written.", ks.remote_bytes_written);
        metric(&p, &len, &cap, "# HELP pagekv_kv_remote_lookup_seconds_total Time in lookup round trips (latency: "
               "divided by pagekv_kv_remote_lookups_total).\n# TYPE pagekv_kv_remote_lookup_seconds_total counter\n"
               "pagekv_kv_remote_lookup_seconds_total %.6f\n", ks.remote_read_seconds);
        metric(&p, &len, &cap, "# HELP pagekv_kv_remote_write_seconds_total Time the writer spent in SETs.\n"
               "# TYPE pagekv_kv_remote_write_seconds_total counter\npagekv_kv_remote_write_seconds_total %.6f\n",
               ks.remote_write_seconds);
    }
    C("preemptions_total", "Idle contexts swapped out to make room for running requests.", st.preemptions);
    C("prompt_tokens_total", "Prompt tokens of admitted requests.", st.prompt_tokens);
    C("generation_tokens_total", "Tokens generated.", st.gen_tokens);
    C("engine_steps_total", "Forward passes of the serving engine, each one batch over every running request "
      "(the contexts API's generations included).", st.steps);
    C("requests_finished_total", "Generation requests finished.", st.requests_done);
    C("draft_proposed_tokens_total", "Speculative decoding: draft proposals the model verified.", st.draft_proposed);
    C("draft_accepted_tokens_total", "Speculative decoding: proposals kept (the model sampled the same token).",
      st.draft_accepted);
    C("requests_failed_total", "Generation requests failed or cancelled.", st.requests_failed);
    if (s->mm) { /* the encoder-output cache (--media-cache-mb) */
        srv_media_cache_stats ms;
        srv_media_cache_get_stats(s->mcache, &ms);
        C("media_cache_hits_total", "Media whose encoder output came from the media cache (not encoded again).",
          ms.hits);
        C("media_cache_misses_total", "Media encoded by the projector (not in the media cache).", ms.misses);
        C("media_cache_evictions_total", "Encoder outputs dropped from the media cache to stay under its size.",
          ms.evictions);
        G("media_cache_entries", "Encoder outputs in the media cache.", ms.entries);
        G("media_cache_bytes", "Bytes of encoder outputs in the media cache.", ms.bytes);
        G("media_cache_bytes_max", "The media cache's size (--media-cache-mb).", ms.max_bytes);
    }
    pthread_mutex_lock(&s->mu);
    uint64_t disc = s->disconnects, spliced = s->resp_spliced, recut = s->resp_recut, asgen = s->resp_generated;
    int inflight = s->inflight;
    uint64_t codes[600];
    memcpy(codes, s->http_count, sizeof codes);
    pthread_mutex_unlock(&s->mu);
    C("client_disconnects_total", "Requests cancelled because the client went away.", disc);
    C("responses_followups_spliced_total", "previous_response_id follow-ups computed as the stored context's own "
      "tokens plus the new turn's.", spliced);
    C("responses_followups_recut_total", "previous_response_id follow-ups whose template re-rendered earlier turns "
      "differently: the stored context cut where the tokens first differ.", recut);
    C("responses_followups_as_generated_total", "Spliced previous_response_id follow-ups whose template renders "
      "the earlier turns otherwise (tool calls, dropped reasoning): the stored turns kept as generated.", asgen);
    G("http_requests_in_flight", "HTTP requests being received or answered.", inflight);
    metric(&p, &len, &cap, "# HELP pagekv_http_responses_total HTTP responses by status code.\n"
                           "# TYPE pagekv_http_responses_total counter\n");
    for (int i = 100; i < 600; i++)
        if (codes[i]) metric(&p, &len, &cap, "pagekv_http_responses_total{code=\"%d\"} %llu\n", i, (unsigned long long)codes[i]);
    hist(&p, &len, &cap, "pagekv_time_to_first_token_seconds", "Time from arrival to the first generated token.",
         st.ttft_hist, srv_ttft_buckets, 11, st.ttft_sum, st.ttft_count);
    hist(&p, &len, &cap, "pagekv_time_per_output_token_seconds", "Time between consecutive tokens of a sequence.",
         st.tpot_hist, srv_tpot_buckets, 10, st.tpot_sum, st.tpot_count);
#undef G
#undef C
    if (!p) {
        srv_error(o, 500, "out of memory");
        return;
    }
    o->status = 200;
    o->text = p;
    o->ctype = "text/plain; version=0.0.4; charset=utf-8";
}

static bool key_ok(srv *s, const char *h) {
    if (!s->o.api_key) return true;
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t a = strlen(h), b = strlen(s->o.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(h[i] ^ s->o.api_key[i]);
    return diff == 0;
}

/* ------------------------------------------------------------------ routes */

/* application/json, with or without parameters ("; charset=utf-8"). */
static bool json_type_ok(const char *t) {
    if (!t) return false;
    t += strspn(t, " \t");
    if (strncasecmp(t, "application/json", 16)) return false;
    t += 16;
    t += strspn(t, " \t");
    return !*t || *t == ';';
}

/* A request as the route handlers see it: body is the parsed JSON object of a
 * POST to a JSON route (NULL otherwise), rest what follows a prefix route's path. */
typedef struct route_req {
    const char *method, *url, *rest;
    const char *body_text;
    size_t body_len;
    json_t *body;
    const srv_conn *sc;
} route_req;

enum { M_GET = 1, M_POST = 2, M_DELETE = 4 };
enum {
    R_PUBLIC = 1,  /* answered without the API key */
    R_PREFIX = 2,  /* path is a prefix: anything may follow */
    R_SUBTREE = 4, /* path itself or path/... */
    R_JSON = 8,    /* a POST body is a JSON object (415 for another type) */
    R_EMPTY = 16,  /* with R_JSON: an empty POST body is {} */
    R_ANTHROPIC = 32, /* errors in Anthropic's shape (srv_error_anthropic) */
    R_ARRAY = 64,  /* with R_JSON: the body may be a JSON array instead */
    R_ONE_RANK = 128, /* a POST changes contexts or adapters outside the engine's steps, which rank 0 sends
                         the other MPI ranks: refused under ranks (501) */
};

static void rt_health(srv *s, const route_req *q, srv_out *o) {
    (void)s, (void)q;
    o->status = 200;
    o->json = json_pack("{s:s}", "status", "ok");
}
static void rt_metrics(srv *s, const route_req *q, srv_out *o) {
    (void)q;
    api_metrics(s, o);
}
static void rt_model(srv *s, const route_req *q, srv_out *o) { srv_api_model(s, q->rest, o); }
static void rt_models(srv *s, const route_req *q, srv_out *o) {
    (void)q;
    srv_api_models(s, o);
}
static void rt_props(srv *s, const route_req *q, srv_out *o) {
    (void)q;
    srv_api_props(s, o);
}
static void rt_kv(srv *s, const route_req *q, srv_out *o) {
    (void)q;
    srv_api_kv(s, o);
}
static void rt_transcribe(srv *s, const route_req *q, srv_out *o) {
    srv_api_transcriptions(s, q->body_text, q->body_len, q->sc, o);
}
static void rt_chat(srv *s, const route_req *q, srv_out *o) { srv_api_completions(s, q->body, true, q->sc, o); }
static void rt_compl(srv *s, const route_req *q, srv_out *o) { srv_api_completions(s, q->body, false, q->sc, o); }
static void rt_tokenize(srv *s, const route_req *q, srv_out *o) { srv_api_tokenize(s, q->body, o); }
static void rt_embd_oai(srv *s, const route_req *q, srv_out *o) { srv_api_embeddings(s, q->body, true, q->sc, o); }
static void rt_embd(srv *s, const route_req *q, srv_out *o) { srv_api_embeddings(s, q->body, false, q->sc, o); }
static void rt_rerank(srv *s, const route_req *q, srv_out *o) { srv_api_rerank(s, q->body, q->sc, o); }
static void rt_detokenize(srv *s, const route_req *q, srv_out *o) { srv_api_detokenize(s, q->body, o); }
static void rt_apply(srv *s, const route_req *q, srv_out *o) { srv_api_apply_template(s, q->body, o); }
static void rt_messages(srv *s, const route_req *q, srv_out *o) { srv_api_messages(s, q->body, q->sc, o); }
static void rt_count_tokens(srv *s, const route_req *q, srv_out *o) { srv_api_count_tokens(s, q->body, q->sc, o); }
static void rt_lora(srv *s, const route_req *q, srv_out *o) {
    if (!strcmp(q->method, "GET")) srv_api_lora_get(s, o);
    else srv_api_lora_post(s, q->body, o);
}
static void rt_contexts(srv *s, const route_req *q, srv_out *o) {
    srv_api_contexts(s, q->method, q->rest, q->body, q->sc, o);
}

static void rt_responses(srv *s, const route_req *q, srv_out *o) {
    srv_api_responses(s, q->method, q->rest, q->body, q->sc, o);
}

/* The endpoints (docs/server.md). A route with one method answers another with
 * 405 "use METHOD URL"; one with several, "M is not a method of URL". */
static const struct srv_route {
    const char *path;
    unsigned methods, flags;
    void (*fn)(srv *s, const route_req *q, srv_out *o);
} routes[] = {
    {"/health", M_GET, R_PUBLIC, rt_health},
    {"/metrics", M_GET, R_PUBLIC, rt_metrics},
    {"/v1/models/", M_GET, R_PREFIX, rt_model},
    {"/props", M_GET, 0, rt_props},
    {"/v1/kv", M_GET, 0, rt_kv},
    {"/v1/audio/transcriptions", M_POST, 0, rt_transcribe}, /* multipart/form-data, not JSON */
    {"/v1/models", M_GET, 0, rt_models},
    {"/v1/chat/completions", M_POST, R_JSON, rt_chat},
    {"/v1/completions", M_POST, R_JSON, rt_compl},
    {"/v1/messages", M_POST, R_JSON | R_ANTHROPIC, rt_messages},
    {"/v1/messages/count_tokens", M_POST, R_JSON | R_ANTHROPIC, rt_count_tokens},
    {"/tokenize", M_POST, R_JSON, rt_tokenize},
    {"/detokenize", M_POST, R_JSON, rt_detokenize},
    {"/apply-template", M_POST, R_JSON, rt_apply},
    {"/v1/embeddings", M_POST, R_JSON, rt_embd_oai},
    {"/embeddings", M_POST, R_JSON, rt_embd},
    {"/embedding", M_POST, R_JSON, rt_embd}, /* llama-server's legacy name */
    {"/v1/rerank", M_POST, R_JSON, rt_rerank},
    {"/rerank", M_POST, R_JSON, rt_rerank},
    {"/v1/reranking", M_POST, R_JSON, rt_rerank},
    {"/reranking", M_POST, R_JSON, rt_rerank},
    {"/v1/contexts", M_GET | M_POST | M_DELETE, R_SUBTREE | R_JSON | R_EMPTY | R_ONE_RANK, rt_contexts},
    {"/v1/responses", M_GET | M_POST | M_DELETE, R_SUBTREE | R_JSON | R_EMPTY | R_ONE_RANK, rt_responses},
    {"/lora-adapters", M_GET | M_POST, R_JSON | R_ARRAY | R_ONE_RANK, rt_lora},
};

/* The route of url (NULL: none), with what follows its path in *rest. */
static const struct srv_route *route_find(const char *url, const char **rest) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const struct srv_route *r = &routes[i];
        size_t n = strlen(r->path);
        bool hit = r->flags & R_PREFIX    ? !strncmp(url, r->path, n)
                   : r->flags & R_SUBTREE ? !strncmp(url, r->path, n) && (url[n] == 0 || url[n] == '/')
                                          : !strcmp(url, r->path);
        if (hit) {
            *rest = url + n;
            return r;
        }
    }
    return NULL;
}

/* The JSON object of a POST to a JSON route into *body; false with the error in o. */
static bool route_json(const struct srv_route *r, const route_req *q, json_t **body, srv_out *o) {
    const srv_conn *sc = q->sc;
    if (!json_type_ok(sc ? sc->content_type : NULL)) {
        /* any other type (text/plain, a form) is a "simple" request a page on
         * another site may send without a CORS preflight */
        srv_error(o, 415, "Content-Type is '%.80s': send 'Content-Type: application/json'",
                  sc && sc->content_type ? sc->content_type : "(none)");
        return false;
    }
    json_error_t je;
    if (!q->body_len && !(r->flags & R_EMPTY)) {
        srv_error(o, 400, "the request body must be a JSON object");
        return false;
    }
    *body = !q->body_len ? json_object() : json_loadb(q->body_text, q->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!*body) {
        srv_error(o, 400, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return false;
    }
    if (!json_is_object(*body) && !((r->flags & R_ARRAY) && json_is_array(*body))) {
        json_decref(*body);
        *body = NULL;
        srv_error(o, 400, "the request body must be a JSON %s", r->flags & R_ARRAY ? "array" : "object");
        return false;
    }
    return true;
}

static void handle(srv *s, const struct srv_route *r, route_req *q, const char *authorization, srv_out *o) {
    if ((!r || !(r->flags & R_PUBLIC)) && !key_ok(s, authorization))
        return srv_error(o, 401, "missing or incorrect API key (send 'Authorization: Bearer KEY')");
    if (!r) return srv_error(o, 404, "no such endpoint: %s %s", q->method, q->url);
    const char *method = q->method, *url = q->url;
    unsigned m = !strcmp(method, "GET") ? M_GET : !strcmp(method, "POST") ? M_POST : !strcmp(method, "DELETE") ? M_DELETE : 0;
    if (!(r->methods & m)) {
        if (r->methods == M_GET) return srv_error(o, 405, "use GET %s", url);
        if (r->methods == M_POST) return srv_error(o, 405, "use POST %s", url);
        return srv_error(o, 405, "%s is not a method of %s", method, url);
    }
    if (m != M_GET && (r->flags & R_ONE_RANK) && pkv_dist_size() > 1)
        return srv_error(o, 501, "%s %s is not supported under %d MPI ranks (docs/distributed.md)", method, url,
                         pkv_dist_size());
    if (m == M_POST && (r->flags & R_JSON) && !route_json(r, q, &q->body, o)) return;
    r->fn(s, q, o);
}

void srv_handle(srv *s, const char *method, const char *url, const char *body_text, size_t body_len,
                const char *authorization, const srv_conn *sc, srv_out *o) {
    if (!strcmp(method, "OPTIONS")) { /* a browser's CORS preflight: no API key is sent with it */
        o->status = 204;
        o->preflight = true;
        o->text = strdup("");
        return;
    }
    route_req q = {method, url, NULL, body_text, body_len, NULL, sc};
    const struct srv_route *r = route_find(url, &q.rest);
    handle(s, r, &q, authorization, o);
    json_decref(q.body);
    if (r && (r->flags & R_ANTHROPIC)) srv_error_anthropic(o);
}

/* A template file (at most 4 MiB); NULL when it cannot be read. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = (size_t)4 << 20;
    char *p = malloc(cap + 1);
    size_t n = p ? fread(p, 1, cap + 1, f) : 0;
    fclose(f);
    if (!p || n > cap) {
        free(p);
        return NULL;
    }
    p[n] = 0;
    *len = n;
    return p;
}

static bool pick_template(srv *s, const char *model_path) {
    char *src = NULL;
    size_t n = 0;
    const char *what = NULL;
    snprintf(s->tpl_name, sizeof s->tpl_name, "none");
    if (s->o.chat_template) {
        pkv_tpl fam = pkv_tpl_from_name(s->o.chat_template);
        if (fam != PKV_TPL_NONE) {
            src = strdup(pkv_tpl_source(fam));
            n = src ? strlen(src) : 0;
            what = "--chat-template";
        } else {
            /* not a family name: a Jinja file */
            src = read_file(s->o.chat_template, &n);
            if (!src) {
                fprintf(stderr, "pagekv serve: --chat-template '%s' is neither a family (one of: %s) nor a readable "
                                "template file\n", s->o.chat_template, pkv_tpl_names());
                return false;
            }
            what = s->o.chat_template;
        }
    } else if (model_path) {
        pkv_gguf *gf = pkv_gguf_open(model_path);
        const char *t = NULL;
        size_t rn = 0;
        if (gf && pkv_gguf_get_str(gf, "tokenizer.chat_template.rerank", &t, &rn) == PKV_OK &&
            (s->rerank_tpl = malloc(rn + 1))) { /* /v1/rerank's query/document prompt */
            memcpy(s->rerank_tpl, t, rn);
            s->rerank_tpl[rn] = 0;
        }
        if (gf && pkv_gguf_get_str(gf, "tokenizer.chat_template", &t, &n) == PKV_OK) {
            src = malloc(n + 1);
            if (src) {
                memcpy(src, t, n);
                src[n] = 0;
            }
            what = "the model's tokenizer.chat_template";
        }
        pkv_gguf_close(gf);
    }
    pkv_model_info mi;
    if (!src && pkv_model_get_info(s->m, &mi) == PKV_OK && mi.has_vocab) {
        /* as llama-server does: a model without a template is served with ChatML, and says so */
        src = strdup(pkv_tpl_source(PKV_TPL_CHATML));
        n = src ? strlen(src) : 0;
        what = "the default chat template (chatml)";
        fprintf(stderr, "pagekv serve: the model has no chat template (tokenizer.chat_template): chat requests "
                        "use chatml; --chat-template NAME|FILE picks another\n");
    }
    if (src) {
        char err[600];
        s->chat = pkv_chat_init_model(s->m, src, n, err, sizeof err);
        if (!s->chat) {
            fprintf(stderr, "pagekv serve: %s: %s\n", what, err);
            free(src);
            return false;
        }
        s->tpl = pkv_tpl_detect(src, n);
        snprintf(s->tpl_name, sizeof s->tpl_name, "%s", s->o.chat_template && pkv_tpl_from_name(s->o.chat_template) != PKV_TPL_NONE
                                                           ? pkv_tpl_name(s->tpl)
                                                           : "jinja");
        free(src);
    }
    /* End-of-turn texts that are one token of the vocabulary stop generation. */
    const char *const *ends = pkv_tpl_end_texts(s->tpl);
    for (int i = 0; ends[i] && s->n_stop_ids < 16; i++) {
        int32_t ids[4];
        size_t nt = 0;
        if (pkv_model_tokenize(s->m, ends[i], strlen(ends[i]), false, true, ids, 4, &nt) == PKV_OK && nt == 1)
            s->stop_ids[s->n_stop_ids++] = ids[0];
    }
    return true;
}

static uint64_t page_bytes(pkv_model *m, const pkv_setup_model_opts *mo) {
    pkv_cache_params cp = pkv_setup_cache_params(mo);
    cp.n_ctx = 1;
    cp.n_pages = 1;
    cp.host_pages = 1;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    if (!c) return 0;
    const pkv_kv_layout *l = pkv_kv_cache_layout(c);
    uint64_t b = 0;
    for (int i = 0; i < pkv_kv_layout_n_layers(l); i++) {
        pkv_kv_layer_info li;
        if (pkv_kv_layout_layer(l, i, &li) == PKV_OK) b += li.k_page_bytes + li.v_page_bytes;
    }
    pkv_kv_cache_free(c);
    return b;
}

/* ---------------------------------------------------------------- startup */

bool srv_start(srv *s, const char *model_path, const pkv_setup_model_opts *mo) {
    const pkv_serve_opts *so = &s->o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_cond_init(&s->tok_cv, NULL);
    s->tpl_budget.limit = (size_t)so->template_budget_mib << 20;
    s->created = (int64_t)time(NULL);
    pkv_model_get_info(s->m, &s->info);
    if (!s->info.has_vocab) {
        fprintf(stderr, "pagekv serve: the model has no vocabulary (tokenizer.ggml.model = none): the server needs text\n");
        return false;
    }
    if (!pick_template(s, model_path)) return false;
    if (so->mmproj && pkv_dist_size() > 1) { /* its encoder would run on rank 0 alone, outside the engine */
        fprintf(stderr, "pagekv serve: --mmproj under %d MPI ranks is not supported (docs/distributed.md)\n",
                pkv_dist_size());
        return false;
    }
    if (so->mmproj) {
        s->mm = pkv_mmproj_load(so->mmproj, s->m, NULL);
        if (!s->mm) {
            fprintf(stderr, "pagekv serve: --mmproj: %s\n", pkv_errmsg());
            return false;
        }
        pkv_mmproj_get_info(s->mm, &s->mm_info);
        s->mcache = srv_media_cache_new(so->media_cache_bytes);
    }
    {
        const char *base = model_path ? strrchr(model_path, '/') : NULL;
        snprintf(s->model_id, sizeof s->model_id, "%s",
                 so->alias ? so->alias : model_path ? (base ? base + 1 : model_path) : "pagekv-builtin");
        snprintf(s->model_path, sizeof s->model_path, "%s", model_path ? model_path : "(built in)");
    }
    uint64_t pb = s->page_bytes = page_bytes(s->m, mo);
    pkv_cache_params cp = pkv_setup_cache_params(mo);
    cp.n_seq_max = so->parallel;
    if (so->kv_pages) cp.n_pages = so->kv_pages;
    else if (so->kv_mem_mib && pb) cp.n_pages = (int64_t)(((uint64_t)so->kv_mem_mib << 20) / pb);
    if (so->swap_mem_mib && pb) cp.host_pages = (int64_t)(((uint64_t)so->swap_mem_mib << 20) / pb);
    if ((so->kv_mem_mib && cp.n_pages < 1) || (so->swap_mem_mib && cp.host_pages < 1)) {
        fprintf(stderr, "pagekv serve: --kv-mem/--swap-mem hold no page (one page is %llu bytes)\n",
                (unsigned long long)pb);
        return false;
    }
    srv_gen_params gp = {.parallel = so->parallel, .queue = so->queue,
                         .max_contexts = so->max_contexts,
                         /* stored responses, and one per response generating (each on its own context) */
                         .max_internal = so->responses_max + so->queue + so->parallel,
                         .ctx_swap_s = so->ctx_swap_s, .ctx_ttl_s = so->ctx_ttl_s};
    pkv_engine_params ep = pkv_engine_default_params();
    cp.disk_dir = so->kv_disk; /* here, not in page_bytes()'s probe: the directory takes one cache at a time */
    cp.disk_bytes = (uint64_t)so->kv_disk_mib << 20;
    cp.remote_url = so->kv_remote; /* likewise: the probe would connect */
    cp.remote_queue_pages = so->kv_remote_queue;
    ep.cache = cp;
    ep.max_seqs = so->parallel;
    ep.max_batch_tokens = so->batch_tokens;
    ep.draft = s->draft;
    ep.draft_max = so->draft_max;
    ep.draft_ngram = so->spec_ngram;
    ep.spill = (pkv_spill_mode)so->kv_spill;
    pkv_engine *eng = pkv_engine_create(s->m, ep);
    if (!eng) {
        fprintf(stderr, "pagekv serve: cannot create the serving engine: %s\n", pkv_errmsg());
        return false;
    }
    s->c = pkv_engine_cache(eng);
    {
        pkv_context *probe = pkv_context_create(s->m, s->c, mo->n_ctx);
        s->n_ctx = probe ? pkv_context_n_ctx(probe) : 0;
        pkv_context_free(probe);
    }
    gp.n_ctx = s->n_ctx;
    {
        pkv_kv_stats ks;
        pkv_kv_stats_get(s->c, &ks);
        gp.ctx_pages = so->context_pages > 0 ? so->context_pages : ks.n_pages / 2;
        s->ctx_pages = gp.ctx_pages;
        s->responses_pages = so->responses_pages > 0 ? so->responses_pages : (ks.n_pages + 3) / 4;
    }
    if (pkv_dist_rank() > 0) { /* it follows rank 0's engine (pkv_serve_run) */
        s->follow = eng;
        return true;
    }
    if (pkv_engine_dist_lead(eng)) { /* before the worker's first step */
        pkv_engine_free(eng);
        return false;
    }
    s->responses = srv_resp_store_new(so->responses_max, so->responses_ttl_s);
    s->g = s->responses ? srv_gen_create_engine(eng, gp) : NULL;
    if (!s->responses) pkv_engine_free(eng);
    if (!s->g) {
        fprintf(stderr, "pagekv serve: cannot start the worker thread\n");
        s->c = NULL; /* srv_gen_create_engine freed the engine and its cache */
        return false;
    }
    return true;
}

void srv_stop(srv *s) {
    srv_gen_free(s->g); /* frees the engine and its cache too */
    srv_resp_store_free(s->responses);
    s->responses = NULL;
    pkv_chat_free(s->chat);
    free(s->rerank_tpl);
    s->chat = NULL;
    pkv_mmproj_free(s->mm);
    s->mm = NULL;
    srv_media_cache_free(s->mcache);
    s->mcache = NULL;
    s->g = NULL;
    s->c = NULL;
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->tok_mu);
    pthread_cond_destroy(&s->tok_cv);
}
