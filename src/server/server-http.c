/* The HTTP layer of pagekv serve: libmicrohttpd with one thread per connection
 * (a handler may block while the worker generates), limits on connections,
 * per-connection memory (request line and headers), body size and idle time;
 * requests are answered by srv_handle (server-core.c). pkv_serve_run loads the
 * model, starts the worker (srv_start), listens and drains on SIGINT or
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
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/engine-dist.h"
#include "model/gguf.h"
#include "server/server-http.h"

/* ------------------------------------------------------------------- HTTP */

/* srv_conn's hook: the idle timeout of a libmicrohttpd connection. */
static void set_timeout(void *mhd, unsigned seconds) {
    MHD_set_connection_option((struct MHD_Connection *)mhd, MHD_CONNECTION_OPTION_TIMEOUT, seconds);
}

typedef struct conn_state {
    char *body;
    size_t len, cap;
    size_t limit; /* this request's body limit (body_limit) */
    bool too_big;
} conn_state;

/* --max-body, except for the endpoints that take media when a projector is
 * loaded: there a body may also carry one medium of --max-media-bytes (as base64
 * in JSON, 4/3 of it, or as a multipart upload). */
static size_t body_limit(const srv *s, const char *url) {
    if (!s->mm || (strcmp(url, "/v1/chat/completions") && strcmp(url, "/v1/messages") &&
                    strcmp(url, "/v1/audio/transcriptions"))) return s->o.max_body;
    size_t media = s->o.max_media_bytes / 3 * 4 + 4096;
    return s->o.max_body + media;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = srv_stream_read(cls, buf, max);
    if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return n;
}

static void stream_free(void *cls) { srv_stream_free(cls); }

static ssize_t body_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_body *b = cls;
    ssize_t n = b->read(b, buf, max);
    if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return n;
}

static void body_free(void *cls) {
    srv_body *b = cls;
    b->free(b);
}

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
    } else if (o->body) {
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 << 10, body_reader, o->body, body_free);
        if (!r) o->body->free(o->body);
        o->body = NULL;
        if (r) MHD_add_response_header(r, "Content-Type", o->ctype ? o->ctype : "application/json");
    } else if (o->json) {
        char *t = json_dumps(o->json, JSON_COMPACT);
        if (t) {
            r = MHD_create_response_from_buffer(strlen(t), t, MHD_RESPMEM_MUST_FREE);
            if (!r) free(t);
            else MHD_add_response_header(r, "Content-Type", "application/json");
        }
    } else if (o->data) { /* the web page's files: static, never freed */
        r = MHD_create_response_from_buffer(o->data_len, (void *)o->data, MHD_RESPMEM_PERSISTENT);
        if (r) {
            MHD_add_response_header(r, "Content-Type", o->ctype ? o->ctype : "application/octet-stream");
            /* its own files only: no inline script, nothing from elsewhere, not framed */
            MHD_add_response_header(r, "Content-Security-Policy",
                                    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
            MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
            MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
            MHD_add_response_header(r, "Cache-Control", "no-cache");
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
    if (o->no_cache) MHD_add_response_header(r, "Cache-Control", "no-store");
    if (s->o.cors_origin) { /* browsers may read the answer from that origin (--cors-origin) */
        MHD_add_response_header(r, "Access-Control-Allow-Origin", s->o.cors_origin);
        if (strcmp(s->o.cors_origin, "*")) MHD_add_response_header(r, "Vary", "Origin");
        if (o->preflight) {
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        }
    }
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

/* Whether a request with this Host header is answered. A page on evil.example
 * whose name is made to resolve to this machine (DNS rebinding) reaches the
 * server as a same-origin page, with Host: evil.example; an IP literal or
 * localhost cannot be such a name. A request without Host (HTTP/1.0) is not
 * from a browser. With --api-key the key protects the API instead. */
static bool host_ok(const srv *s, const char *h) {
    if (!h || s->o.api_key) return true;
    char name[256];
    size_t n;
    const char *rest;
    if (h[0] == '[') { /* [v6]:port */
        const char *e = strchr(h, ']');
        if (!e || (size_t)(e - h - 1) >= sizeof name) return false;
        n = (size_t)(e - h - 1);
        memcpy(name, h + 1, n);
        name[n] = 0;
        rest = e + 1;
        struct in6_addr a6;
        if (inet_pton(AF_INET6, name, &a6) != 1) return false;
        if (*rest && *rest != ':') return false;
        return true;
    }
    n = strcspn(h, ":");
    if (n == 0 || n >= sizeof name) return false;
    memcpy(name, h, n);
    name[n] = 0;
    rest = h + n;
    if (*rest == ':' && strspn(rest + 1, "0123456789") != strlen(rest + 1)) return false;
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1 || !strcasecmp(name, "localhost") || !strcasecmp(name, "localhost."))
        return true;
    for (int i = 0; i < s->o.n_allowed_hosts; i++)
        if (!strcmp(s->o.allowed_hosts[i], "*") || !strcasecmp(s->o.allowed_hosts[i], name)) return true;
    return false;
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
        cs->limit = body_limit(s, url);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > cs->limit) { /* refuse before reading it */
            cs->too_big = true;
            srv_error(&o, 413, "the request body (%s bytes) is larger than the limit of %zu bytes (%s)", cl, cs->limit,
                      cs->limit > s->o.max_body ? "--max-body + --max-media-bytes" : "--max-body");
            return send_out(s, conn, &o);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_big && cs->len + *upload_size > cs->limit) {
            cs->too_big = true;
            free(cs->body);
            cs->body = NULL;
            cs->len = cs->cap = 0;
        }
        if (!cs->too_big) {
            if (cs->len + *upload_size + 1 > cs->cap) {
                size_t nc = (cs->len + *upload_size + 1) * 2;
                if (nc > cs->limit + 1) nc = cs->limit + 1;
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
    srv_conn waiting = {-1, conn, (unsigned)s->o.timeout_s, set_timeout, NULL};
    srv_conn_waiting(&waiting, true); /* the handler may wait for the worker: not the client's idle time */
    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!host_ok(s, host))
        srv_error(&o, 403, "Host '%.200s' is not a name this server answers to (DNS rebinding protection: IP "
                           "addresses and localhost are): start it with --allowed-host NAME to allow a name",
                  host);
    else if (cs->too_big) srv_error(&o, 413, "the request body is larger than the limit of %zu bytes (%s)", cs->limit,
                               cs->limit > s->o.max_body ? "--max-body + --max-media-bytes" : "--max-body");
    else {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        srv_conn sc = {ci ? ci->connect_fd : -1, conn, (unsigned)s->o.timeout_s, set_timeout,
                       MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE)};
        if ((!strcmp(method, "GET") || !strcmp(method, "HEAD")) &&
            srv_web_asset(url, &o.data, &o.data_len, &o.ctype)) /* the page: no API key (it asks for one) */
            o.status = 200;
        else {
            /* Anthropic's clients send the key as x-api-key */
            const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
            const char *xk = auth ? NULL : MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
            char *bearer = xk ? malloc(strlen(xk) + 8) : NULL;
            if (bearer) {
                memcpy(bearer, "Bearer ", 7);
                memcpy(bearer + 7, xk, strlen(xk) + 1);
                auth = bearer;
            }
            srv_handle(s, method, url, cs->body, cs->len, auth, &sc, &o);
            free(bearer);
        }
    }
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

/* SIGINT/SIGTERM are taken by one thread from the start. Before the server
 * listens (loading the model, compiling and analysing its chat template: work
 * that cannot be interrupted, with no request in flight) a signal ends the
 * process at once by its default action; once listening, it is handed to the
 * main thread, which drains the requests in flight. */
typedef struct sig_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ready; /* listening */
    int sig;    /* the signal taken once ready; 0 = none yet */
} sig_watch;

static void *watch_signals(void *ud) {
    sig_watch *w = ud;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    while (sigwait(&set, &sig) != 0 || (sig != SIGINT && sig != SIGTERM)) {
    }
    pthread_mutex_lock(&w->mu);
    if (!w->ready) {
        pthread_mutex_unlock(&w->mu);
        fprintf(stderr, "pagekv serve: %s during start-up: exiting\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, NULL);
        raise(sig); /* the default action: the process ends here */
        pthread_mutex_lock(&w->mu);
    }
    w->sig = sig;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void pkv_serve_block_signals(void) {
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGPIPE);
    /* Every thread started from here on inherits the mask; a thread takes
     * SIGINT/SIGTERM with sigwait, SIGPIPE is never delivered. */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
}

int pkv_serve_run(const pkv_setup_model_opts *mo, const pkv_serve_opts *so) {
    srv s;
    memset(&s, 0, sizeof s);
    s.o = *so;
    int rc = 1;
    bool started = false;
    struct MHD_Daemon *d = NULL;
    pkv_serve_block_signals();

    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)so->port);
    const char *host = !strcmp(so->host, "localhost") ? "127.0.0.1" : so->host;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "pagekv serve: --host '%s' is not an IPv4 address (IPv6 is not supported yet)\n", so->host);
        return 2;
    }
    if (so->port_file && pkv_file_check_output(so->port_file)) { /* before minutes of loading */
        fprintf(stderr, "pagekv serve: --port-file: %s\n", pkv_errmsg());
        return 2;
    }
    sig_watch sw = {.ready = false, .sig = 0};
    pthread_mutex_init(&sw.mu, NULL);
    pthread_cond_init(&sw.cv, NULL);
    pthread_t watcher;
    if (pthread_create(&watcher, NULL, watch_signals, &sw)) {
        fprintf(stderr, "pagekv serve: cannot start the signal thread\n");
        return 1;
    }
    if (!(s.m = pkv_setup_open_model("serve", mo))) goto out;
    s.n_lora = pkv_model_lora_get(s.m, s.lora, PKV_MAX_LORA);
    if (so->draft || so->mtp) { /* the draft, before the engine that runs it */
        pkv_model_params dp = pkv_model_default_params();
        pkv_device *tdev = pkv_model_device(s.m);
        if (!so->draft_device || !strcmp(so->draft_device, pkv_device_name(tdev))) dp.device_handle = tdev;
        else dp.device = so->draft_device;
        dp.n_threads = mo->threads;
        dp.mtp = so->mtp;
        const char *path = so->mtp ? mo->model : so->draft;
        if (!(s.draft = pkv_model_load(path, dp))) {
            fprintf(stderr, "pagekv serve: cannot load the draft%s %s: %s\n", so->mtp ? " (the MTP head of)" : "", path,
                    pkv_errmsg());
            goto out;
        }
        pkv_model_get_info(s.draft, &s.draft_info);
    }
    if (!srv_start(&s, mo->model, mo)) goto out;
    started = true;
    if (s.follow) { /* a rank > 0 under mpirun: no HTTP; rank 0's steps until it stops (docs/distributed.md) */
        pthread_mutex_lock(&sw.mu);
        sw.ready = true; /* SIGINT/SIGTERM: rank 0 drains, then says stop */
        pthread_mutex_unlock(&sw.mu);
        pkv_status fs = pkv_engine_dist_follow(s.follow);
        if (fs) fprintf(stderr, "pagekv serve: %s\n", pkv_errmsg());
        pkv_engine_free(s.follow);
        s.follow = NULL;
        s.c = NULL;
        rc = fs ? 1 : 0;
        goto out;
    }
    uint64_t pb = s.page_bytes;
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
    pkv_kv_layer_info kv0; /* the types the cache really has (layer 0) */
    memset(&kv0, 0, sizeof kv0);
    pkv_kv_layout_layer(pkv_kv_cache_layout(s.c), 0, &kv0);
    char banner[2048]; /* what was loaded and where it listens: the caller shows it (so->on_ready) */
    char where[512]; /* one device, or the tensor-parallel split (--devices, --split, --kv-on-host) */
    if (s.info.n_devices > 1)
        snprintf(where, sizeof where, "split over %d devices %s (proportions %s)%s", s.info.n_devices,
                 mo->devices ? mo->devices : "?", mo->split ? mo->split : "equal",
                 s.info.kv_on_host ? ", every KV shard in host memory" : ", each KV shard on its device");
    else
        snprintf(where, sizeof where, "on %s%s", pkv_device_name(pkv_model_device(s.m)),
                 s.info.kv_on_host ? ", KV cache in host memory" : "");
    int bl = snprintf(banner, sizeof banner, "pagekv serve: %s (%s %s, %d layers, vocab %d) %s\n", s.model_id,
                      s.info.arch, s.info.weight_type, s.info.n_layer, s.info.n_vocab, where);
    bl += snprintf(banner + bl, sizeof banner - (size_t)bl,
                   "pagekv serve: KV cache %lld pages of %d tokens (K %s, V %s, %.1f MiB), host swap pool %lld pages; "
                   "context %lld tokens, %d parallel sequences; %s\n",
                   (long long)ks.n_pages, pkv_kv_layout_page_size(pkv_kv_cache_layout(s.c)), pkv_type_name(kv0.dtype_k),
                   pkv_type_name(kv0.dtype_v), (double)ks.n_pages * (double)pb / 1048576.0, (long long)ks.host_pages,
                   (long long)s.n_ctx, so->parallel, "serving engine (continuous batching, chunked prefill, preemption)");
    if (so->kv_disk)
        bl += snprintf(banner + bl, sizeof banner - (size_t)bl,
                       "pagekv serve: KV disk tier %s: %lld page files, %.1f of %.1f MiB (--kv-disk-size)\n", so->kv_disk,
                       (long long)ks.disk_files, (double)ks.disk_bytes_used / 1048576.0,
                       (double)ks.disk_bytes_max / 1048576.0);
    if (so->kv_remote)
        bl += snprintf(banner + bl, sizeof banner - (size_t)bl, "pagekv serve: KV remote tier (Redis): %s\n",
                       ks.remote_enabled ? "connected" : "not reachable yet; retried (see the log)");
    if (s.draft)
        bl += snprintf(banner + bl, sizeof banner - (size_t)bl,
                       "pagekv serve: speculative decoding: %s on %s%s, up to %d proposals per sequence and step\n",
                       so->mtp ? "the model's MTP head" : so->draft, pkv_device_name(pkv_model_device(s.draft)),
                       s.draft_info.assistant ? " (Gemma 4 assistant: no KV of its own, its attention over the model's pages "
                                                "where they are stored)" : "",
                       so->draft_max ? so->draft_max : 4);
    if (so->spec_ngram)
        bl += snprintf(banner + bl, sizeof banner - (size_t)bl,
                       "pagekv serve: speculative decoding: n-gram drafts (prompt lookup), up to %d proposals per "
                       "sequence and step\n", so->draft_max ? so->draft_max : 4);
    bl += snprintf(banner + bl, sizeof banner - (size_t)bl,
                   "pagekv serve: contexts API: up to %d contexts holding up to %lld KV pages (--context-pages)\n",
                   so->max_contexts, (long long)s.ctx_pages);
    bl += snprintf(banner + bl, sizeof banner - (size_t)bl,
                   "pagekv serve: /v1/responses: up to %d stored responses holding up to %lld KV pages, each kept "
                   "%.0f s after its last use (--responses-max, --responses-pages, --responses-ttl)\n",
                   so->responses_max, (long long)s.responses_pages, so->responses_ttl_s);
    bl += snprintf(banner + bl, sizeof banner - (size_t)bl, "pagekv serve: chat template: %s%s\n",
                   s.chat ? s.tpl_name
                          : "none (the model has none: /v1/chat/completions needs --chat-template NAME|FILE)",
                   s.chat && so->special_in_content ? " (message text may produce special tokens: --special-in-content)"
                                                   : "");
    snprintf(banner + bl, sizeof banner - (size_t)bl,
             "pagekv serve: listening on http://%s:%d (Ctrl-C stops after the requests in flight)\n", host, port);
    if (so->on_ready) so->on_ready(banner, so->on_ready_ud);
    if (so->port_file) { /* written last, atomically (tests wait for it), through the safe-output path */
        pkv_wfile w;
        pkv_status ws = pkv_wfile_open(&w, so->port_file);
        if (!ws && fprintf(w.f, "%d\n", port) < 0) {
            pkv_wfile_abort(&w);
            ws = pkv_err(PKV_ERR_IO, "%s: write failed", so->port_file);
        } else if (!ws) {
            ws = pkv_wfile_commit(&w);
        }
        if (ws) {
            fprintf(stderr, "pagekv serve: --port-file: %s\n", pkv_errmsg());
            goto out;
        }
    }
    pthread_mutex_lock(&sw.mu);
    sw.ready = true;
    while (!sw.sig) pthread_cond_wait(&sw.cv, &sw.mu);
    int sig = sw.sig;
    pthread_mutex_unlock(&sw.mu);
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
    atomic_store(&s.stopping, true); /* a template render still running stops at its next check */
    MHD_stop_daemon(d);
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    d = NULL;
    rc = 0;
    fprintf(stderr, "pagekv serve: stopped\n");
out:
    atomic_store(&s.stopping, true);
    if (d) MHD_stop_daemon(d);
    if (started) srv_stop(&s);
    pkv_model_free(s.draft);
    pkv_model_free(s.m);
    pthread_mutex_lock(&sw.mu);
    bool taken = sw.sig != 0;
    pthread_mutex_unlock(&sw.mu);
    if (!taken) pthread_cancel(watcher); /* still in sigwait */
    pthread_join(watcher, NULL);
    pthread_mutex_destroy(&sw.mu);
    pthread_cond_destroy(&sw.cv);
    return rc;
}
