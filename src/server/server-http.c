/* The HTTP layer of pagekv serve: libmicrohttpd with one thread per connection
 * (a handler may block while the worker generates), limits on connections,
 * per-connection memory (request line and headers), body size and idle time,
 * routing, API keys, /health and /metrics; and pkv_serve_run, which loads the
 * model, picks the chat template, starts everything and drains on SIGINT or
 * SIGTERM. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "model/gguf.h"
#include "server/server-http.h"

pkv_serve_opts pkv_serve_default_opts(void) {
    pkv_serve_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.parallel = 4;
    o.max_body = 1u << 20;
    o.max_header = 64u << 10;
    o.max_conns = 256;
    o.queue = 64;
    o.timeout_s = 30;
    o.max_contexts = 256;
    o.ctx_swap_s = 300;
    o.ctx_ttl_s = 3600;
    o.max_tokens_default = 16;
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
    char b;
    ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0) return true;
    return k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

void srv_conn_waiting(const srv_conn *c, bool waiting) {
    if (c && c->mhd)
        MHD_set_connection_option((struct MHD_Connection *)c->mhd, MHD_CONNECTION_OPTION_TIMEOUT,
                                  waiting ? 0u : c->timeout);
}

bool srv_wait_done(srv *s, srv_req *r, const srv_conn *conn) {
    pthread_mutex_lock(&r->mu);
    while (!r->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
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
    G("kv_pages_total", "Device KV pages in the pool.", st.kv.n_pages);
    G("kv_pages_used", "Device KV pages referenced by sequences.", st.kv.pages_used);
    G("kv_pages_free", "Device KV pages on the free list.", st.kv.pages_free);
    G("kv_pages_cached", "Unreferenced device KV pages kept for prefix reuse (evictable).", st.kv.pages_cached);
    G("kv_host_pages_total", "Pages of the host swap pool.", st.kv.host_pages);
    G("kv_host_pages_free", "Free pages of the host swap pool.", st.kv.host_free);
    C("prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", st.prefix_hit_tokens);
    C("preemptions_total", "Idle contexts swapped out to make room for running requests.", st.preemptions);
    C("prompt_tokens_total", "Prompt tokens of admitted requests.", st.prompt_tokens);
    C("generation_tokens_total", "Tokens generated.", st.gen_tokens);
    C("requests_finished_total", "Generation requests finished.", st.requests_done);
    C("requests_failed_total", "Generation requests failed or cancelled.", st.requests_failed);
    pthread_mutex_lock(&s->mu);
    uint64_t disc = s->disconnects;
    int inflight = s->inflight;
    uint64_t codes[600];
    memcpy(codes, s->http_count, sizeof codes);
    pthread_mutex_unlock(&s->mu);
    C("client_disconnects_total", "Requests cancelled because the client went away.", disc);
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

/* ------------------------------------------------------------------- HTTP */

typedef struct conn_state {
    char *body;
    size_t len, cap;
    bool too_big;
} conn_state;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = srv_stream_read(cls, buf, max);
    if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return n;
}

static void stream_free(void *cls) { srv_stream_free(cls); }

static enum MHD_Result send_out(srv *s, struct MHD_Connection *conn, srv_out *o) {
    struct MHD_Response *r = NULL;
    if (o->stream) {
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, o->stream, stream_free);
        if (!r) srv_stream_free(o->stream);
        o->stream = NULL;
        if (r) {
            MHD_add_response_header(r, "Content-Type", "text/event-stream");
            MHD_add_response_header(r, "Cache-Control", "no-cache");
        }
    } else if (o->json) {
        char *t = json_dumps(o->json, JSON_COMPACT);
        if (t) {
            r = MHD_create_response_from_buffer(strlen(t), t, MHD_RESPMEM_MUST_FREE);
            if (!r) free(t);
            else MHD_add_response_header(r, "Content-Type", "application/json");
        }
    } else if (o->text) {
        r = MHD_create_response_from_buffer(strlen(o->text), o->text, MHD_RESPMEM_MUST_FREE);
        if (!r) free(o->text);
        else MHD_add_response_header(r, "Content-Type", o->ctype ? o->ctype : "text/plain");
        o->text = NULL;
    }
    json_decref(o->json);
    o->json = NULL;
    if (!r) return MHD_NO;
    if (o->retry_after) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", o->retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)o->status, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&s->mu);
    if (o->status >= 100 && o->status < 600) s->http_count[o->status]++;
    pthread_mutex_unlock(&s->mu);
    return ret;
}

static bool key_ok(srv *s, struct MHD_Connection *conn) {
    if (!s->o.api_key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t a = strlen(h), b = strlen(s->o.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(h[i] ^ s->o.api_key[i]);
    return diff == 0;
}

static void route(srv *s, struct MHD_Connection *conn, const char *url, const char *method, conn_state *cs,
                  srv_out *o) {
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    srv_conn sc = {ci ? ci->connect_fd : -1, conn, (unsigned)s->o.timeout_s};
    if (!strcmp(url, "/health")) {
        if (!get) return srv_error(o, 405, "use GET %s", url);
        o->status = 200;
        o->json = json_pack("{s:s}", "status", "ok");
        return;
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return srv_error(o, 405, "use GET %s", url);
        return api_metrics(s, o);
    }
    if (!key_ok(s, conn)) return srv_error(o, 401, "missing or incorrect API key (send 'Authorization: Bearer KEY')");
    enum { R_NONE, R_MODELS, R_CHAT, R_COMPL, R_TOK, R_DETOK, R_CTX } r = R_NONE;
    if (!strcmp(url, "/v1/models")) r = R_MODELS;
    else if (!strcmp(url, "/v1/chat/completions")) r = R_CHAT;
    else if (!strcmp(url, "/v1/completions")) r = R_COMPL;
    else if (!strcmp(url, "/tokenize")) r = R_TOK;
    else if (!strcmp(url, "/detokenize")) r = R_DETOK;
    else if (!strncmp(url, "/v1/contexts", 12) && (url[12] == 0 || url[12] == '/')) r = R_CTX;
    if (r == R_NONE) return srv_error(o, 404, "no such endpoint: %s %s", method, url);
    if (r == R_MODELS) {
        if (!get) return srv_error(o, 405, "use GET %s", url);
        return srv_api_models(s, o);
    }
    if (r != R_CTX && !post) return srv_error(o, 405, "use POST %s", url);
    if (r == R_CTX && !get && !post && !del) return srv_error(o, 405, "%s is not a method of %s", method, url);
    json_t *body = NULL;
    if (post) {
        json_error_t je;
        if (!cs->len && r != R_CTX) return srv_error(o, 400, "the request body must be a JSON object");
        body = !cs->len ? json_object() : json_loadb(cs->body, cs->len, JSON_REJECT_DUPLICATES, &je);
        if (!body) return srv_error(o, 400, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
        if (!json_is_object(body)) {
            json_decref(body);
            return srv_error(o, 400, "the request body must be a JSON object");
        }
    }
    switch (r) {
    case R_CHAT: srv_api_completions(s, body, true, &sc, o); break;
    case R_COMPL: srv_api_completions(s, body, false, &sc, o); break;
    case R_TOK: srv_api_tokenize(s, body, o); break;
    case R_DETOK: srv_api_detokenize(s, body, o); break;
    case R_CTX: srv_api_contexts(s, method, url + 12, body, &sc, o); break;
    default: break;
    }
    json_decref(body);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    (void)version;
    conn_state *cs = *con_cls;
    srv_out o = {0};
    if (!cs) {
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        *con_cls = cs;
        pthread_mutex_lock(&s->mu);
        s->inflight++;
        pthread_mutex_unlock(&s->mu);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) { /* refuse before reading it */
            cs->too_big = true;
            srv_error(&o, 413, "the request body (%s bytes) is larger than the limit of %zu bytes (--max-body)", cl,
                      s->o.max_body);
            return send_out(s, conn, &o);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_big && cs->len + *upload_size > s->o.max_body) {
            cs->too_big = true;
            free(cs->body);
            cs->body = NULL;
            cs->len = cs->cap = 0;
        }
        if (!cs->too_big) {
            if (cs->len + *upload_size + 1 > cs->cap) {
                size_t nc = (cs->len + *upload_size + 1) * 2;
                if (nc > s->o.max_body + 1) nc = s->o.max_body + 1;
                char *b = realloc(cs->body, nc);
                if (!b) return MHD_NO;
                cs->body = b;
                cs->cap = nc;
            }
            memcpy(cs->body + cs->len, upload, *upload_size);
            cs->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    srv_conn waiting = {-1, conn, (unsigned)s->o.timeout_s};
    srv_conn_waiting(&waiting, true); /* the handler may wait for the worker: not the client's idle time */
    if (cs->too_big) srv_error(&o, 413, "the request body is larger than the limit of %zu bytes (--max-body)", s->o.max_body);
    else route(s, conn, url, method, cs, &o);
    srv_conn_waiting(&waiting, false);
    if (!o.status) srv_error(&o, 500, "no response");
    return send_out(s, conn, &o);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    (void)conn;
    (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
    pthread_mutex_lock(&s->mu);
    s->inflight--;
    pthread_mutex_unlock(&s->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    (void)fmt;
    (void)ap; /* connection-level noise (resets, timeouts) is counted, not printed */
}

/* -------------------------------------------------------------- startup */

static bool pick_template(srv *s, const char *model_path) {
    if (s->o.chat_template) {
        s->tpl = pkv_tpl_from_name(s->o.chat_template);
        if (s->tpl == PKV_TPL_NONE) {
            fprintf(stderr, "pagekv serve: --chat-template '%s' is not a known family (one of: %s)\n",
                    s->o.chat_template, pkv_tpl_names());
            return false;
        }
    } else if (model_path) {
        pkv_gguf *gf = pkv_gguf_open(model_path);
        const char *t = NULL;
        size_t n = 0;
        if (gf && pkv_gguf_get_str(gf, "tokenizer.chat_template", &t, &n) == PKV_OK) {
            s->tpl = pkv_tpl_detect(t, n);
            if (s->tpl == PKV_TPL_NONE) {
                fprintf(stderr,
                        "pagekv serve: the model's chat template (tokenizer.chat_template, %zu bytes, starting "
                        "\"%.60s\") matches none of the families pagekv renders; start with --chat-template NAME "
                        "(one of: %s)\n",
                        n, t, pkv_tpl_names());
                pkv_gguf_close(gf);
                return false;
            }
        }
        pkv_gguf_close(gf);
    }
    /* End-of-turn texts that are one token of the vocabulary stop generation. */
    const char *const *ends = pkv_tpl_end_texts(s->tpl);
    for (int i = 0; ends[i] && s->n_stop_ids < 16; i++) {
        int32_t ids[4];
        size_t n = 0;
        if (pkv_model_tokenize(s->m, ends[i], strlen(ends[i]), false, true, ids, 4, &n) == PKV_OK && n == 1)
            s->stop_ids[s->n_stop_ids++] = ids[0];
    }
    return true;
}

static uint64_t page_bytes(pkv_model *m, const pkv_cli_model_opts *mo) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.page_size = mo->page_size;
    cp.kv_type = (pkv_type)mo->kv_type;
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

int pkv_serve_run(const pkv_cli_model_opts *mo, const pkv_serve_opts *so) {
    srv s;
    memset(&s, 0, sizeof s);
    s.o = *so;
    pthread_mutex_init(&s.mu, NULL);
    s.created = (int64_t)time(NULL);
    int rc = 1;
    struct MHD_Daemon *d = NULL;
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGPIPE);
    /* Every thread started from here on inherits the mask; the main thread takes
     * SIGINT/SIGTERM with sigwait, SIGPIPE is never delivered. */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)so->port);
    const char *host = !strcmp(so->host, "localhost") ? "127.0.0.1" : so->host;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "pagekv serve: --host '%s' is not an IPv4 address (IPv6 is not supported yet)\n", so->host);
        return 2;
    }
    if (!(s.m = pkv_cli_open_model("serve", mo))) return 1;
    pkv_model_get_info(s.m, &s.info);
    if (!s.info.has_vocab) {
        fprintf(stderr, "pagekv serve: the model has no vocabulary (tokenizer.ggml.model = none): the server needs text\n");
        goto out;
    }
    if (!pick_template(&s, mo->model)) goto out;
    {
        const char *base = mo->model ? strrchr(mo->model, '/') : NULL;
        snprintf(s.model_id, sizeof s.model_id, "%s",
                 so->alias ? so->alias : mo->model ? (base ? base + 1 : mo->model) : "pagekv-builtin");
    }
    uint64_t pb = page_bytes(s.m, mo);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = mo->n_ctx;
    cp.page_size = mo->page_size;
    cp.kv_type = (pkv_type)mo->kv_type;
    cp.n_seq_max = so->parallel;
    if (so->kv_pages) cp.n_pages = so->kv_pages;
    else if (so->kv_mem_mib && pb) cp.n_pages = (int64_t)(((uint64_t)so->kv_mem_mib << 20) / pb);
    if (so->swap_mem_mib && pb) cp.host_pages = (int64_t)(((uint64_t)so->swap_mem_mib << 20) / pb);
    if ((so->kv_mem_mib && cp.n_pages < 1) || (so->swap_mem_mib && cp.host_pages < 1)) {
        fprintf(stderr, "pagekv serve: --kv-mem/--swap-mem hold no page (one page is %llu bytes)\n",
                (unsigned long long)pb);
        goto out;
    }
    srv_gen_params gp = {.parallel = so->parallel, .batch_tokens = so->batch_tokens, .queue = so->queue, .max_contexts = so->max_contexts,
                         .ctx_swap_s = so->ctx_swap_s, .ctx_ttl_s = so->ctx_ttl_s};
    pkv_engine *eng = NULL;
    if (!so->simple) {
        pkv_engine_params ep = pkv_engine_default_params();
        ep.cache = cp;
        ep.max_seqs = so->parallel;
        ep.max_batch_tokens = so->batch_tokens;
        if (!(eng = pkv_engine_create(s.m, ep))) {
            fprintf(stderr, "pagekv serve: cannot create the serving engine: %s\n", pkv_errmsg());
            goto out;
        }
        s.c = pkv_engine_cache(eng);
    } else if (!(s.c = pkv_model_cache_create(s.m, cp))) {
        fprintf(stderr, "pagekv serve: cannot create the KV cache: %s\n", pkv_errmsg());
        goto out;
    }
    {
        pkv_context *probe = pkv_context_create(s.m, s.c, mo->n_ctx);
        s.n_ctx = probe ? pkv_context_n_ctx(probe) : 0;
        pkv_context_free(probe);
    }
    gp.n_ctx = s.n_ctx;
    s.g = eng ? srv_gen_create_engine(eng, gp) : srv_gen_create(s.m, s.c, gp);
    if (!s.g) {
        fprintf(stderr, "pagekv serve: cannot start the worker thread\n");
        if (!eng) pkv_kv_cache_free(s.c);
        s.c = NULL; /* srv_gen_create_engine freed the engine and its cache */
        goto out;
    }
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                             MHD_USE_ERROR_LOG,
                         0, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)so->max_conns, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)so->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, so->max_header,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                         MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "pagekv serve: cannot listen on %s:%d: %s\n", so->host, so->port, strerror(errno));
        goto out;
    }
    int port = so->port;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (di) port = di->port;
    pkv_kv_stats ks;
    pkv_kv_stats_get(s.c, &ks);
    printf("pagekv serve: %s (%s %s, %d layers, vocab %d) on %s\n", s.model_id, s.info.arch, s.info.weight_type,
           s.info.n_layer, s.info.n_vocab, pkv_device_name(pkv_model_device(s.m)));
    printf("pagekv serve: KV cache %lld pages of %d tokens (%.1f MiB), host swap pool %lld pages; context %lld tokens, "
           "%d parallel sequences; %s\n",
           (long long)ks.n_pages, pkv_kv_layout_page_size(pkv_kv_cache_layout(s.c)),
           (double)ks.n_pages * (double)pb / 1048576.0, (long long)ks.host_pages, (long long)s.n_ctx, so->parallel,
           so->simple ? "simple batching worker (--simple)" : "serving engine (continuous batching, chunked prefill, preemption)");
    printf("pagekv serve: chat template: %s\n",
           s.tpl ? pkv_tpl_name(s.tpl) : "none (the model has none: /v1/chat/completions needs --chat-template NAME)");
    printf("pagekv serve: listening on http://%s:%d (Ctrl-C stops after the requests in flight)\n", host, port);
    fflush(stdout);
    if (so->port_file) { /* written last, atomically: tests wait for it */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", so->port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) || rename(tmp, so->port_file)) {
            fprintf(stderr, "pagekv serve: cannot write %s\n", so->port_file);
            goto out;
        }
    }
    int sig = 0;
    sigset_t wait_for;
    sigemptyset(&wait_for);
    sigaddset(&wait_for, SIGINT);
    sigaddset(&wait_for, SIGTERM);
    sigwait(&wait_for, &sig);
    fprintf(stderr, "pagekv serve: %s: draining the requests in flight\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    MHD_socket lsock = MHD_quiesce_daemon(d); /* no new connections */
    for (int i = 0; i < 600; i++) { /* at most 60 s */
        pthread_mutex_lock(&s.mu);
        int n = s.inflight;
        pthread_mutex_unlock(&s.mu);
        if (n <= 0) break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d);
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    d = NULL;
    rc = 0;
    fprintf(stderr, "pagekv serve: stopped\n");
out:
    if (d) MHD_stop_daemon(d);
    srv_gen_free(s.g); /* the engine backend: frees the engine and its cache too */
    if (so->simple) pkv_kv_cache_free(s.c);
    pkv_model_free(s.m);
    pthread_mutex_destroy(&s.mu);
    return rc;
}
