/* Remote tier: full prefix pages in a Redis server shared by many processes (the
 * replicas of one model behind a load balancer), below the device pool, its host
 * swap pool and the disk tier. docs/distributed.md ("The Redis KV tier") and
 * docs/kv-cache.md describe it.
 *
 * What is stored: one value per page, the page image of kv-page-image.c (the disk
 * tier's page file: both fingerprints, the chain keys, tokens, positions, every
 * layer's rows, for recurrent layers the state the page offered, a checksum), under
 *     pagekv:v1:<layout fingerprint, 16 hex>:<chained prefix key, 16 hex>
 * The chained key is seeded by the producer's (the model's) fingerprint, so one
 * prefix of two models or two layouts has two keys, and the "pagekv:v1:" namespace
 * keeps other programs' keys apart. A value is used only after pkv_kv_pimg_check
 * (size, magic, version, layout, checksum, producer, chain keys, tokens, positions);
 * one that fails is counted as rejected, deleted and is a miss.
 *
 * Writes: a page is published when it becomes cached (the last sequence holding it
 * lets go) or, at the latest, when the device LRU evicts it. The cache's thread
 * reads the page off the device into an image (I1) and queues it; a writer thread
 * on its own connection seals and SETs it. The queue holds remote_queue_pages
 * images: when it is full a page is skipped and counted (dropped), never waited for.
 * Reads: a prefix match that runs out of pages in memory and on disk GETs the
 * next pages, up to PIPE of them per round trip (pipelined), and loads those that
 * verify into fresh device pages.
 *
 * Failure: connect and every command have a timeout (remote_timeout_ms). An error
 * closes the connection, is counted, logs one line per outage and starts a back-off:
 * for BACKOFF seconds the tier is skipped (a match goes on without it, a page to
 * publish is left for later), then the next use connects again; each failure of
 * the same outage doubles the wait, up to BACKOFF_MAX (a Redis that does not answer
 * at all costs a connect timeout per wait, not per request); a successful
 * connection logs that the tier is back. Redis may evict anything at any time
 * (maxmemory with allkeys-lru): a missing value is a miss. */
#include "kv/kv-impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PKV_HAVE_HIREDIS

pkv_status pkv_kv_remote_open(pkv_kv_cache *c, const pkv_kv_params *p) {
    (void)c;
    if (!p->remote_url) return PKV_OK;
    return pkv_err(PKV_ERR_UNSUPPORTED, "KV remote tier: this build of pagekv has no Redis client (install "
                   "libhiredis-dev and rebuild)"); /* (the URL is not shown: it may hold a password) */
}
void pkv_kv_remote_close(pkv_kv_cache *c) { (void)c; }
void pkv_kv_remote_put(pkv_kv_cache *c, int32_t id) {
    (void)c;
    (void)id;
}
bool pkv_kv_remote_queue(pkv_kv_cache *c) {
    (void)c;
    return true;
}
int64_t pkv_kv_remote_match(pkv_kv_cache *c, kv_seq *s, const int32_t *tokens, const int32_t *pos, int64_t m,
                            int64_t n_full, const uint64_t *keys) {
    (void)c, (void)s, (void)tokens, (void)pos, (void)n_full, (void)keys;
    return m;
}
void pkv_kv_remote_stats(const pkv_kv_cache *c, pkv_kv_stats *out) {
    (void)c;
    (void)out;
}
pkv_status pkv_kv_remote_flush(pkv_kv_cache *c) {
    (void)c;
    return PKV_OK;
}
bool pkv_kv_remote_available(void) { return false; }

#else

#include <hiredis.h>
#include <pthread.h>
#include <sys/time.h>

#define PIPE 16          /* GETs per round trip */
#define BACKOFF 1.0      /* seconds without the tier after an error */
#define BACKOFF_MAX 8.0  /* after repeated errors of one outage */
#define KEY_LEN 43       /* "pagekv:v1:" 16 hex ':' 16 hex */
#define DEFAULT_QUEUE 256
#define DEFAULT_TIMEOUT_MS 500

bool pkv_kv_remote_available(void) { return true; }

typedef struct remote_job {
    uint8_t *img; /* [bytes], sealed by the writer */
    size_t bytes;
    uint64_t key;
    struct remote_job *next;
} remote_job;

typedef struct kv_remote {
    char *url;   /* as shown: the password masked */
    char *host, *user, *pass;
    int port, db;
    struct timeval tv;
    uint64_t lfp;
    kv_pimg g;
    redisContext *rd; /* the cache's thread's connection (matches) */
    redisContext *wr; /* the writer's */
    uint8_t *wtmp, *rtmp; /* one page of the largest array: encode (cache thread), install */
    uint8_t *sbuf;        /* [g.state_bytes]: the deepest state a match has read */
    /* mu guards the queue, the outage state and st */
    pthread_t th;
    bool th_on, quit, busy;
    pthread_mutex_t mu;
    pthread_cond_t cv, cv_idle;
    remote_job *q_head, *q_tail;
    int q_n, q_max;
    bool down;         /* in an outage (logged once) */
    double down_until; /* no connection attempt before then */
    double backoff;    /* the outage's current wait */
    pkv_kv_stats st;   /* the remote_ fields */
} kv_remote;

static void key_of(const kv_remote *r, uint64_t key, char out[KEY_LEN + 1]) {
    snprintf(out, KEY_LEN + 1, "pagekv:v1:%016llx:%016llx", (unsigned long long)r->lfp, (unsigned long long)key);
}

/* ------------------------------------------------------------ the URL */

/* redis://[user:pass@]HOST[:PORT][/DB] (user may be empty: the default user). */
static pkv_status parse_url(kv_remote *r, const char *url) {
    const char *p = url, *what = NULL;
    if (strncmp(p, "redis://", 8)) what = "it does not start with redis://";
    p += what ? 0 : 8;
    const char *at = what ? NULL : strchr(p, '@'), *slash = NULL;
    if (at && (slash = strchr(p, '/')) && slash < at) at = NULL; /* an '@' after the path is no userinfo */
    if (!what && at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon) what = "the user information has no ':' (write user:password@ or :password@)";
        else if (!(r->user = pkv_strndup(p, (size_t)(colon - p))) ||
                 !(r->pass = pkv_strndup(colon + 1, (size_t)(at - colon - 1))))
            return pkv_err(PKV_ERR_NOMEM, "KV remote tier: out of memory");
        p = at + 1;
    }
    size_t hl = what ? 0 : strcspn(p, ":/");
    if (!what && hl == 0) what = "no host";
    if (!what && !(r->host = pkv_strndup(p, hl))) return pkv_err(PKV_ERR_NOMEM, "KV remote tier: out of memory");
    p += hl;
    r->port = 6379;
    if (!what && *p == ':') {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || v < 1 || v > 65535 || (*end && *end != '/')) what = "the port is not a number in 1..65535";
        r->port = (int)v;
        p = end;
    }
    if (!what && *p == '/' && p[1]) {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || v < 0 || v > 1000000) what = "the database is not a number";
        r->db = (int)v;
    } else if (!what && *p && strcmp(p, "/")) {
        what = "unexpected text after the host";
    }
    /* shown in messages and the log: the password masked */
    char shown[600];
    if (at && !what)
        snprintf(shown, sizeof shown, "redis://%s:***@%s:%d/%d", r->user, r->host, r->port, r->db);
    else if (!what)
        snprintf(shown, sizeof shown, "redis://%s:%d/%d", r->host, r->port, r->db);
    else if (strrchr(url, '@'))
        snprintf(shown, sizeof shown, "redis://***%.500s", strrchr(url, '@'));
    else
        snprintf(shown, sizeof shown, "%.500s", url);
    if (!(r->url = pkv_strdup(shown))) return pkv_err(PKV_ERR_NOMEM, "KV remote tier: out of memory");
    if (what)
        return pkv_err(PKV_ERR_INVALID, "KV remote tier: the URL %s does not parse: %s (expected "
                       "redis://[user:password@]HOST[:PORT][/DB])", shown, what);
    return PKV_OK;
}

/* ------------------------------------------------------------ connections */

/* A command on conn; NULL and *err set when it failed (the connection is then unusable). */
static redisReply *command(redisContext *conn, char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(conn, fmt, ap);
    va_end(ap);
    if (!rep) snprintf(err, n, "%s", conn->err == REDIS_ERR_IO && !conn->errstr[0] ? "I/O error" : conn->errstr);
    return rep;
}

/* Connect, AUTH, SELECT and PING. NULL with *err on failure; *fatal when the peer
 * answered but refused us or is not Redis (a wrong password, a bad database, a peer
 * that does not speak RESP), as opposed to one that cannot be reached. */
static redisContext *connect_peer(kv_remote *r, char *err, size_t n, bool *fatal) {
    *fatal = false;
    redisContext *conn = redisConnectWithTimeout(r->host, r->port, r->tv);
    if (!conn || conn->err) {
        snprintf(err, n, "cannot connect: %s", conn ? conn->errstr : "out of memory");
        redisFree(conn);
        return NULL;
    }
    (void)redisSetTimeout(conn, r->tv);
    redisReply *rep = NULL;
    char e[256] = "";
    if (r->pass) {
        rep = r->user && *r->user ? command(conn, e, sizeof e, "AUTH %s %s", r->user, r->pass)
                                  : command(conn, e, sizeof e, "AUTH %s", r->pass);
        if (rep && rep->type == REDIS_REPLY_ERROR) snprintf(e, sizeof e, "AUTH refused (%s)", rep->str);
        *fatal = true;
        if (!rep || rep->type == REDIS_REPLY_ERROR) goto fail;
        freeReplyObject(rep);
    }
    if (r->db) {
        rep = command(conn, e, sizeof e, "SELECT %d", r->db);
        if (rep && rep->type == REDIS_REPLY_ERROR) snprintf(e, sizeof e, "SELECT %d refused (%s)", r->db, rep->str);
        *fatal = true;
        if (!rep || rep->type == REDIS_REPLY_ERROR) goto fail;
        freeReplyObject(rep);
    }
    rep = command(conn, e, sizeof e, "PING");
    *fatal = true;
    if (rep && rep->type == REDIS_REPLY_ERROR) snprintf(e, sizeof e, "PING refused (%s)", rep->str);
    else if (rep && (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "PONG")))
        snprintf(e, sizeof e, "PING was not answered with PONG");
    if (!rep || rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "PONG")) goto fail;
    freeReplyObject(rep);
    return conn;
fail:
    if (rep) freeReplyObject(rep);
    snprintf(err, n, "%s%s", e, rep ? "" : " (the peer does not answer as a Redis server: RESP)");
    redisFree(conn);
    return NULL;
}

/* An error on *conn (may be NULL: a failed connect): closed, counted, one log line
 * per outage, and the back-off starts. */
static void fail_conn(kv_remote *r, redisContext **conn, const char *what) {
    if (*conn) redisFree(*conn);
    *conn = NULL;
    pthread_mutex_lock(&r->mu);
    r->st.remote_errors++;
    r->st.remote_enabled = false;
    if (!r->down)
        PKV_WARN("KV remote tier %s: %s; going on without it (retrying after %.0f s, then up to every %.0f s)", r->url,
                 what, BACKOFF, BACKOFF_MAX);
    r->backoff = r->down ? PKV_MIN(2 * r->backoff, BACKOFF_MAX) : BACKOFF;
    r->down = true;
    r->down_until = pkv_time_now() + r->backoff;
    pthread_mutex_unlock(&r->mu);
}

/* The usable connection in *conn, connecting when the back-off allows; NULL when none. */
static redisContext *conn_get(kv_remote *r, redisContext **conn) {
    if (*conn) return *conn;
    pthread_mutex_lock(&r->mu);
    bool wait = r->down && pkv_time_now() < r->down_until;
    pthread_mutex_unlock(&r->mu);
    if (wait) return NULL;
    char err[400];
    bool fatal;
    *conn = connect_peer(r, err, sizeof err, &fatal);
    if (!*conn) {
        fail_conn(r, conn, err);
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    if (r->down) /* the outage's end, at its level */
        PKV_WARN("KV remote tier %s: connected again; the tier is used again", r->url);
    r->down = false;
    r->st.remote_enabled = true;
    pthread_mutex_unlock(&r->mu);
    return *conn;
}

static bool is_down(kv_remote *r) {
    pthread_mutex_lock(&r->mu);
    bool d = r->down && pkv_time_now() < r->down_until;
    pthread_mutex_unlock(&r->mu);
    return d;
}

/* ------------------------------------------------------------ the writer */

static void *writer_main(void *arg) {
    kv_remote *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->q_head && !r->quit) pthread_cond_wait(&r->cv, &r->mu);
        if (!r->q_head) break;
        remote_job *j = r->q_head;
        r->q_head = j->next;
        if (!r->q_head) r->q_tail = NULL;
        r->q_n--;
        r->busy = true;
        pthread_mutex_unlock(&r->mu);
        double t0 = pkv_time_now();
        bool ok = false;
        redisContext *conn = conn_get(r, &r->wr);
        if (conn) {
            pkv_kv_pimg_seal(&r->g, j->img, j->bytes);
            char k[KEY_LEN + 1], err[256];
            key_of(r, j->key, k);
            redisReply *rep = command(conn, err, sizeof err, "SET %b %b", k, (size_t)KEY_LEN, j->img, j->bytes);
            ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep && !ok) snprintf(err, sizeof err, "SET refused (%s)", rep->type == REDIS_REPLY_ERROR ? rep->str : "?");
            if (rep) freeReplyObject(rep);
            if (!ok) fail_conn(r, &r->wr, err);
        }
        pthread_mutex_lock(&r->mu);
        r->busy = false;
        if (ok) {
            r->st.remote_written_pages++;
            r->st.remote_bytes_written += j->bytes;
            r->st.remote_write_seconds += pkv_time_now() - t0;
        } else {
            r->st.remote_dropped_pages++; /* Redis down: this page is not published */
        }
        pkv_free(j->img);
        pkv_free(j);
        pthread_cond_broadcast(&r->cv_idle);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Queue page id's image. False (and nothing done) when the queue is full. */
static bool put(pkv_kv_cache *c, int32_t id) {
    kv_remote *r = c->remote;
    kv_page *pg = &c->pages[id];
    if (!pg->indexed || pg->on_remote || !pg->fp) return true;
    if (is_down(r)) return true; /* left for later: published when it is cached again or evicted */
    pthread_mutex_lock(&r->mu);
    bool full = r->q_n >= r->q_max;
    pthread_mutex_unlock(&r->mu);
    if (full) return false;
    const kv_pimg_plan plan = pkv_kv_pimg_plan(c, &r->g, id);
    const size_t bytes = plan.bytes;
    remote_job *j = pkv_malloc(sizeof *j);
    uint8_t *img = pkv_malloc(bytes);
    pkv_status st = j && img ? pkv_kv_pimg_encode(c, &r->g, id, plan, img, r->wtmp) : PKV_ERR_NOMEM;
    if (st) {
        PKV_WARN("KV remote tier %s: page %d not published (%s)", r->url, id,
                 st == PKV_ERR_NOMEM ? "out of memory" : pkv_errmsg());
        pkv_free(j);
        pkv_free(img);
        pg->on_remote = true;
        return true;
    }
    *j = (remote_job){img, bytes, pg->key, NULL};
    pthread_mutex_lock(&r->mu);
    if (r->q_tail) r->q_tail->next = j;
    else r->q_head = j;
    r->q_tail = j;
    r->q_n++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pg->on_remote = true;
    return true;
}

void pkv_kv_remote_put(pkv_kv_cache *c, int32_t id) {
    if (!c->remote || put(c, id)) return;
    c->pages[id].on_remote = true; /* leaving memory with the queue full: skipped, never waited for */
    pthread_mutex_lock(&c->remote->mu);
    c->remote->st.remote_dropped_pages++;
    pthread_mutex_unlock(&c->remote->mu);
}

bool pkv_kv_remote_queue(pkv_kv_cache *c) {
    if (!c->remote) return true;
    for (int32_t q = c->lru_head; q >= 0; q = c->pages[q].lru_next)
        if (!c->pages[q].on_remote && !put(c, q)) return false; /* the rest at the next call */
    return true;
}

pkv_status pkv_kv_remote_flush(pkv_kv_cache *c) {
    kv_remote *r = c ? c->remote : NULL;
    if (!r) return PKV_OK;
    for (int32_t q = c->lru_head; q >= 0; q = c->pages[q].lru_next)
        while (!c->pages[q].on_remote && !put(c, q)) { /* full: wait for the writer */
            pthread_mutex_lock(&r->mu);
            while (r->q_n >= r->q_max) pthread_cond_wait(&r->cv_idle, &r->mu);
            pthread_mutex_unlock(&r->mu);
        }
    pthread_mutex_lock(&r->mu);
    while (r->q_head || r->busy) pthread_cond_wait(&r->cv_idle, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return PKV_OK;
}

/* ------------------------------------------------------------ read */

/* One value of a pipelined batch: used as page dep (true) or the match ends here. */
static bool take_value(pkv_kv_cache *c, kv_seq *s, redisReply *rep, int64_t dep, const int32_t *tk,
                       const int32_t *pp, const uint64_t *keys, uint64_t key2, int32_t *st_page) {
    kv_remote *r = c->remote;
    const int ps = c->page_size;
    if (!rep || rep->type != REDIS_REPLY_STRING) { /* nil: never written, or evicted by Redis */
        pthread_mutex_lock(&r->mu);
        r->st.remote_miss_pages++;
        pthread_mutex_unlock(&r->mu);
        return false;
    }
    const uint8_t *b = (const uint8_t *)rep->str;
    const char *why = pkv_kv_pimg_check(c, &r->g, b, rep->len, s->fp, keys[dep],
                                        dep ? keys[dep - 1] : pkv_kv_fp_seed(s->fp), key2, tk, pp);
    pthread_mutex_lock(&r->mu);
    r->st.remote_bytes_read += rep->len;
    if (why) r->st.remote_rejected_values++;
    pthread_mutex_unlock(&r->mu);
    if (why) {
        char k[KEY_LEN + 1], err[256];
        key_of(r, keys[dep], k);
        PKV_WARN("KV remote tier %s: the value of %s rejected (%s); ignored and deleted", r->url, k, why);
        redisReply *del = command(r->rd, err, sizeof err, "DEL %s", k);
        if (del) freeReplyObject(del);
        else fail_conn(r, &r->rd, err);
        return false;
    }
    int32_t id;
    if (pkv_kv_pimg_install(c, &r->g, s, b, dep, keys, key2, r->rtmp, &id)) return false; /* no page: ends here */
    c->pages[id].on_remote = true;
    c->pages[id].on_disk = false; /* the disk tier keeps it when it leaves memory */
    const uint8_t *state = pkv_kv_pimg_state(&r->g, b, rep->len, (dep + 1) * ps);
    if (state) {
        memcpy(r->sbuf, state, r->g.state_bytes - 8);
        *st_page = id;
    }
    pthread_mutex_lock(&r->mu);
    r->st.remote_hit_pages++;
    pthread_mutex_unlock(&r->mu);
    return true;
}

/* Pages [m, n_full) from Redis, PIPE GETs per round trip; the new count of pages. */
static int64_t match_pages(pkv_kv_cache *c, kv_seq *s, const int32_t *tokens, const int32_t *pos, int64_t m,
                           int64_t n_full, const uint64_t *keys, int32_t *st_page) {
    kv_remote *r = c->remote;
    const int ps = c->page_size;
    uint64_t key2 = pkv_kv_fp_seed2(s->fp);
    for (int64_t i = 0; i < m; i++) key2 = pkv_kv_page_key2(c, key2, tokens + i * ps, pos + i * ps);
    redisReply *reps[PIPE];
    while (m < n_full) {
        redisContext *conn = conn_get(r, &r->rd);
        if (!conn) return m;
        int nb = (int)PKV_MIN((int64_t)PIPE, n_full - m), got = 0;
        char k[KEY_LEN + 1];
        for (int i = 0; i < nb; i++) {
            key_of(r, keys[m + i], k);
            redisAppendCommand(conn, "GET %b", k, (size_t)KEY_LEN);
        }
        double t0 = pkv_time_now();
        for (; got < nb; got++)
            if (redisGetReply(conn, (void **)&reps[got]) != REDIS_OK) break;
        pthread_mutex_lock(&r->mu);
        r->st.remote_lookups++;
        r->st.remote_read_seconds += pkv_time_now() - t0;
        pthread_mutex_unlock(&r->mu);
        if (got < nb) {
            char err[200];
            snprintf(err, sizeof err, "GET failed: %s", conn->errstr[0] ? conn->errstr : "I/O error");
            for (int i = 0; i < got; i++) freeReplyObject(reps[i]);
            fail_conn(r, &r->rd, err);
            return m;
        }
        bool on = true;
        int64_t next = m;
        for (int i = 0; i < nb; i++) {
            const int32_t *tk = tokens + (m + i) * ps, *pp = pos + (m + i) * ps;
            if (on) key2 = pkv_kv_page_key2(c, key2, tk, pp);
            on = on && take_value(c, s, reps[i], m + i, tk, pp, keys, key2, st_page);
            freeReplyObject(reps[i]);
            if (on) next = m + i + 1;
        }
        m = next;
        if (!on) break;
    }
    return m;
}

int64_t pkv_kv_remote_match(pkv_kv_cache *c, kv_seq *s, const int32_t *tokens, const int32_t *pos, int64_t m,
                            int64_t n_full, const uint64_t *keys) {
    kv_remote *r = c->remote;
    if (!r || !s->fp) return m;
    int32_t st_page = -1;
    m = match_pages(c, s, tokens, pos, m, n_full, keys, &st_page);
    /* A hit needs the state at its end (the memory kinds narrow the match to the
     * deepest page offering one): only the deepest remote page's is installed. */
    if (st_page >= 0) {
        int64_t at = 0;
        for (int64_t i = 0; i < m; i++) at = s->own[i] == st_page ? (i + 1) * c->page_size : at; /* its end */
        pkv_status st = pkv_kv_state_page_offer(c, st_page, r->sbuf, at);
        if (st) PKV_WARN("KV remote tier %s: installing a page's recurrent state failed (%s); matched without it",
                         r->url, pkv_errmsg());
    }
    return m;
}

/* ------------------------------------------------------------ open, close, stats */

static void remote_free(kv_remote *r) {
    if (r->rd) redisFree(r->rd);
    if (r->wr) redisFree(r->wr);
    pkv_kv_pimg_release(&r->g);
    pkv_free(r->url);
    pkv_free(r->host);
    pkv_free(r->user);
    pkv_free(r->pass);
    pkv_free(r->wtmp);
    pkv_free(r->rtmp);
    pkv_free(r->sbuf);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    pthread_cond_destroy(&r->cv_idle);
    pkv_free(r);
}

pkv_status pkv_kv_remote_open(pkv_kv_cache *c, const pkv_kv_params *p) {
    if (!p->remote_url) return PKV_OK;
    pkv_status us = pkv_kv_pimg_supported(c, "KV remote tier");
    if (us) return us;
    if (p->remote_queue_pages < 0 || p->remote_timeout_ms < 0)
        return pkv_err(PKV_ERR_INVALID, "KV remote tier: a queue of %d pages, a timeout of %d ms", p->remote_queue_pages,
                       p->remote_timeout_ms);
    kv_remote *r = pkv_calloc(1, sizeof *r);
    if (!r) return pkv_err(PKV_ERR_NOMEM, "KV remote tier: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pthread_cond_init(&r->cv_idle, NULL);
    pkv_status st = parse_url(r, p->remote_url);
    if (st) goto fail;
    int ms = p->remote_timeout_ms ? p->remote_timeout_ms : DEFAULT_TIMEOUT_MS;
    r->tv = (struct timeval){ms / 1000, (ms % 1000) * 1000};
    r->q_max = p->remote_queue_pages ? p->remote_queue_pages : DEFAULT_QUEUE;
    r->lfp = c->layout.fingerprint;
    if ((st = pkv_kv_pimg_init(&r->g, c, "KV remote tier"))) goto fail;
    r->wtmp = pkv_malloc(r->g.tmp_bytes);
    r->rtmp = pkv_malloc(r->g.tmp_bytes);
    r->sbuf = r->g.state_bytes ? pkv_malloc(r->g.state_bytes) : NULL;
    if (!r->wtmp || !r->rtmp || (r->g.state_bytes && !r->sbuf)) {
        st = pkv_err(PKV_ERR_NOMEM, "KV remote tier: out of memory for page buffers");
        goto fail;
    }
    /* Unreachable at startup is a warning (Redis may come later: the back-off
     * retries); a peer that answers but refuses us or is not Redis is an error. */
    char err[400];
    bool fatal;
    r->rd = connect_peer(r, err, sizeof err, &fatal);
    if (!r->rd && fatal) {
        st = pkv_err(PKV_ERR_IO, "KV remote tier %s: %s", r->url, err);
        goto fail;
    }
    if (!r->rd) {
        PKV_WARN("KV remote tier %s: %s; starting without it (retrying after %.0f s, then up to every %.0f s)", r->url,
                 err, BACKOFF, BACKOFF_MAX);
        r->down = true;
        r->backoff = BACKOFF;
        r->down_until = pkv_time_now() + BACKOFF;
        r->st.remote_errors = 1;
    } else {
        r->st.remote_enabled = true;
        PKV_INFO("KV remote tier %s: connected (pages of this cache: %zu bytes each)", r->url, r->g.base_bytes);
    }
    if (pthread_create(&r->th, NULL, writer_main, r) != 0) {
        st = pkv_err(PKV_ERR_NOMEM, "KV remote tier: cannot start its writer thread");
        goto fail;
    }
    r->th_on = true;
    c->remote = r;
    return PKV_OK;
fail:
    remote_free(r);
    return st;
}

void pkv_kv_remote_close(pkv_kv_cache *c) {
    kv_remote *r = c ? c->remote : NULL;
    if (!r) return;
    pkv_kv_remote_flush(c); /* the cached pages not published yet, while they exist */
    pthread_mutex_lock(&r->mu);
    r->quit = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->th, NULL);
    remote_free(r);
    c->remote = NULL;
}

void pkv_kv_remote_stats(const pkv_kv_cache *c, pkv_kv_stats *out) {
    kv_remote *r = c->remote;
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    out->remote_configured = true;
    out->remote_enabled = r->st.remote_enabled;
    out->remote_hit_pages = r->st.remote_hit_pages;
    out->remote_miss_pages = r->st.remote_miss_pages;
    out->remote_rejected_values = r->st.remote_rejected_values;
    out->remote_written_pages = r->st.remote_written_pages;
    out->remote_dropped_pages = r->st.remote_dropped_pages;
    out->remote_errors = r->st.remote_errors;
    out->remote_lookups = r->st.remote_lookups;
    out->remote_bytes_read = r->st.remote_bytes_read;
    out->remote_bytes_written = r->st.remote_bytes_written;
    out->remote_read_seconds = r->st.remote_read_seconds;
    out->remote_write_seconds = r->st.remote_write_seconds;
    pthread_mutex_unlock(&r->mu);
}

#endif
