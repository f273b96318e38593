/* GET /v1/kv: a JSON snapshot of the paged KV cache for live views (the web
 * page at /): every page of the device pool with how many block tables hold it
 * and whether it is in the prefix index, the host swap pool, every sequence's
 * block table with who owns it (a context, a request), and the contexts' fork
 * tree. docs/server.md describes the format.
 *
 * The cache belongs to the worker thread: the snapshot is copied there between
 * engine steps (srv_gen_call; O(pages + block table entries), no device work),
 * and the JSON is written here, on the connection thread, so a poller costs the
 * worker only the copy. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server-http.h"

typedef struct kv_ctx_rec {
    int64_t id, parent;
    int32_t seq;
    int64_t n_tokens;
    bool swapped, busy;
    bool response; /* a /v1/responses conversation (srv_ctx.internal), not the contexts API's */
} kv_ctx_rec;

typedef struct kv_owner {
    int32_t seq;
    int sample;
    bool on_context;
    char id[64]; /* the request's response id ("" for a context's generation) */
} kv_owner;

typedef struct kv_call {
    pkv_kv_snapshot *main, *win;
    kv_ctx_rec *ctxs;
    int n_ctxs;
    kv_owner *owners;
    int n_owners;
    char err[300];
} kv_call;

static bool kv_take(srv_gen *g, void *arg) {
    kv_call *k = arg;
    pkv_kv_cache *c = srv_gen_cache(g);
    k->main = pkv_kv_snapshot_take(c, 0);
    if (!k->main) {
        snprintf(k->err, sizeof k->err, "%s", pkv_errmsg());
        return true;
    }
    if (k->main->stats.window_pages > 0 && !(k->win = pkv_kv_snapshot_take(c, 1))) {
        snprintf(k->err, sizeof k->err, "%s", pkv_errmsg());
        return true;
    }
    int n = srv_ctx_count(g);
    k->ctxs = calloc((size_t)(n ? n : 1), sizeof *k->ctxs);
    if (!k->ctxs) {
        snprintf(k->err, sizeof k->err, "out of memory");
        return true;
    }
    for (int i = 0; i < n; i++) {
        srv_ctx *e = srv_ctx_at(g, i);
        kv_ctx_rec *r = &k->ctxs[k->n_ctxs++];
        r->id = e->id;
        r->parent = e->parent;
        r->seq = pkv_context_seq(e->ctx);
        r->n_tokens = pkv_context_n_tokens(e->ctx);
        r->swapped = srv_ctx_swapped(g, e);
        r->busy = e->busy;
        r->response = e->internal;
    }
    pkv_engine *eng = srv_gen_engine(g);
    int ns = 0;
    if (pkv_engine_seqs(eng, NULL, 0, &ns) == PKV_OK && ns > 0) {
        pkv_engine_seq_info *si = calloc((size_t)ns, sizeof *si);
        k->owners = calloc((size_t)ns, sizeof *k->owners);
        int got = 0;
        if (si && k->owners && pkv_engine_seqs(eng, si, ns, &got) == PKV_OK) {
            if (got > ns) got = ns;
            for (int i = 0; i < got; i++) {
                kv_owner *o = &k->owners[k->n_owners++];
                /* alive: the engine's request holds a reference. A request on a context
                 * may be a create's or an append's prefill, whose user is no srv_req: its
                 * sequence is named by its context, or, while a create runs, so. */
                const srv_req *r = si[i].on_context ? NULL : si[i].user;
                o->seq = si[i].kv_seq;
                o->sample = si[i].sample;
                o->on_context = si[i].on_context;
                snprintf(o->id, sizeof o->id, "%s", r ? r->log_id : si[i].on_context ? "context-being-created" : "");
                for (char *ch = o->id; *ch; ch++) /* written into JSON as is: ids are [A-Za-z0-9._-] */
                    if (!((*ch >= 'a' && *ch <= 'z') || (*ch >= 'A' && *ch <= 'Z') || (*ch >= '0' && *ch <= '9') ||
                          *ch == '-' || *ch == '_' || *ch == '.'))
                        *ch = '_';
            }
        }
        free(si);
    }
    return true;
}

/* ------------------------------------------------------------ JSON text */

typedef struct buf {
    char *p;
    size_t len, cap;
    bool oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)k < b->cap) {
            b->len += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
}

/* n bytes appended to b, to be filled in by the caller; NULL when out of memory. */
static char *room(buf *b, int64_t n) {
    if (b->oom) return NULL;
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t nc = (b->len + (size_t)n + 1) * 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = true;
            return NULL;
        }
        b->p = q;
        b->cap = nc;
    }
    char *at = b->p + b->len;
    b->len += (size_t)n;
    b->p[b->len] = 0;
    return at;
}

/* A block table as runs: [[first page, count], ...] (a run of -1: pages released
 * behind a sliding window). */
static void put_runs(buf *b, const int32_t *pg, int64_t n) {
    put(b, "[");
    for (int64_t i = 0; i < n;) {
        int64_t j = i + 1;
        while (j < n && (pg[i] < 0 ? pg[j] < 0 : pg[j] == pg[j - 1] + 1)) j++;
        put(b, "%s[%d,%lld]", i ? "," : "", pg[i] < 0 ? -1 : pg[i], (long long)(j - i));
        i = j;
    }
    put(b, "]");
}

/* A device pool as a tier: counts, refs per page and one flag character per page:
 * '.' free, 'u' held, 'p' held and in the prefix index, 'c' cached (in the index,
 * held by nobody: evictable). */
static void put_pool(buf *b, const char *name, const pkv_kv_snapshot *s, int64_t used, int64_t fr, int64_t cached) {
    put(b, "{\"name\":\"%s\",\"kind\":\"device\",\"pages\":%lld,\"used\":%lld,\"free\":%lld,\"cached\":%lld,\"refs\":[", name,
        (long long)s->n_pages, (long long)used, (long long)fr, (long long)cached);
    for (int64_t i = 0; i < s->n_pages; i++) put(b, "%s%d", i ? "," : "", s->page_refs[i]);
    put(b, "],\"flags\":\"");
    char *f = room(b, s->n_pages);
    for (int64_t i = 0; f && i < s->n_pages; i++) {
        uint8_t fl = s->page_flags[i];
        f[i] = fl & PKV_KV_PAGE_FREE ? '.' : fl & PKV_KV_PAGE_CACHED ? 'c' : fl & PKV_KV_PAGE_INDEX ? 'p' : 'u';
    }
    put(b, "\"}");
}

/* A host pool as a tier: one flag character per page, 'u' used, '.' free. */
static void put_host(buf *b, const char *name, const pkv_kv_snapshot *s) {
    int64_t used = 0;
    for (int64_t i = 0; i < s->host_pages; i++) used += s->host_used[i] != 0;
    put(b, ",{\"name\":\"%s\",\"kind\":\"host\",\"pages\":%lld,\"used\":%lld,\"free\":%lld,\"flags\":\"", name,
        (long long)s->host_pages, (long long)used, (long long)(s->host_pages - used));
    char *h = room(b, s->host_pages);
    for (int64_t i = 0; h && i < s->host_pages; i++) h[i] = s->host_used[i] ? 'u' : '.';
    put(b, "\"}");
}

static void ctx_name(int64_t id, char *out, size_t n) { snprintf(out, n, "ctx-%lld", (long long)id); }

static void put_json(buf *b, srv *s, const kv_call *k) {
    const pkv_kv_snapshot *m = k->main;
    const pkv_kv_stats *st = &m->stats;
    /* each sequence id's context, request and window-pool entry (-1: none), so
     * writing costs O(sequences), not sequences x contexts */
    int32_t max_id = 0;
    for (int i = 0; i < m->n_seqs; i++) max_id = m->seqs[i].id > max_id ? m->seqs[i].id : max_id;
    int *ix = malloc((size_t)(max_id + 1) * 3 * sizeof *ix);
    if (!ix) {
        b->oom = true;
        return;
    }
    int *ctx_of = ix, *own_of = ix + max_id + 1, *win_of = ix + 2 * (max_id + 1);
    for (int32_t i = 0; i <= max_id; i++) ctx_of[i] = own_of[i] = win_of[i] = -1;
    for (int j = 0; j < k->n_ctxs; j++)
        if (k->ctxs[j].seq >= 0 && k->ctxs[j].seq <= max_id) ctx_of[k->ctxs[j].seq] = j;
    for (int j = 0; j < k->n_owners; j++)
        if (k->owners[j].seq >= 0 && k->owners[j].seq <= max_id && own_of[k->owners[j].seq] < 0)
            own_of[k->owners[j].seq] = j;
    for (int j = 0; k->win && j < k->win->n_seqs; j++)
        if (k->win->seqs[j].id <= max_id) win_of[k->win->seqs[j].id] = j;
    put(b, "{\"object\":\"kv\",\"page_size\":%d,\"page_bytes\":%llu,\"n_ctx\":%lld,\"tiers\":[", m->page_size,
        (unsigned long long)st->page_bytes, (long long)s->n_ctx);
    put_pool(b, "device", m, st->pages_used, st->pages_free, st->pages_cached);
    if (k->win) put(b, ","), put_pool(b, "window", k->win, st->window_used, st->window_free, st->window_cached);
    put_host(b, "host", m);
    if (k->win) put_host(b, "window-host", k->win);
    if (st->disk_bytes_max) /* the disk tier (serve --kv-disk): files, not pages of a pool */
        put(b, ",{\"name\":\"disk\",\"kind\":\"disk\",\"enabled\":%s,\"files\":%lld,\"bytes\":%llu,"
               "\"bytes_max\":%llu,\"hit_pages\":%llu,\"written_pages\":%llu,\"rejected_files\":%llu}",
            st->disk_enabled ? "true" : "false", (long long)st->disk_files, (unsigned long long)st->disk_bytes_used,
            (unsigned long long)st->disk_bytes_max, (unsigned long long)st->disk_hit_pages,
            (unsigned long long)st->disk_written_pages, (unsigned long long)st->disk_rejected_files);
    if (st->remote_configured) /* the remote tier (serve --kv-remote): a shared store, not pages of a pool */
        put(b, ",{\"name\":\"remote\",\"kind\":\"redis\",\"enabled\":%s,\"hit_pages\":%llu,\"miss_pages\":%llu,"
               "\"written_pages\":%llu,\"dropped_pages\":%llu,\"rejected_values\":%llu,\"errors\":%llu}",
            st->remote_enabled ? "true" : "false", (unsigned long long)st->remote_hit_pages,
            (unsigned long long)st->remote_miss_pages, (unsigned long long)st->remote_written_pages,
            (unsigned long long)st->remote_dropped_pages, (unsigned long long)st->remote_rejected_values,
            (unsigned long long)st->remote_errors);
    put(b, "],\"sequences\":[");
    for (int i = 0; i < m->n_seqs; i++) {
        const pkv_kv_snapshot_seq *q = &m->seqs[i];
        put(b, "%s{\"seq\":%d,\"n_tokens\":%lld,\"tier\":\"%s\",\"pages\":", i ? "," : "", q->id, (long long)q->n_tokens,
            q->swapped ? "host" : "device");
        put_runs(b, m->pages + q->first, q->n);
        if (win_of[q->id] >= 0) { /* the same sequence id in the window pool (its host pool when swapped) */
            const pkv_kv_snapshot_seq *w = &k->win->seqs[win_of[q->id]];
            put(b, ",\"window_pages\":");
            put_runs(b, k->win->pages + w->first, w->n);
        }
        /* owner: a context (also while a generation runs on it), else a request's sample */
        const kv_ctx_rec *cr = ctx_of[q->id] >= 0 ? &k->ctxs[ctx_of[q->id]] : NULL;
        const kv_owner *ow = own_of[q->id] >= 0 ? &k->owners[own_of[q->id]] : NULL;
        char name[32];
        if (cr) {
            ctx_name(cr->id, name, sizeof name);
            put(b, ",\"owner\":{\"kind\":\"context\",\"id\":\"%s\",\"generating\":%s}}", name, ow ? "true" : "false");
        } else if (ow) {
            put(b, ",\"owner\":{\"kind\":\"request\",\"id\":\"%s\",\"sample\":%d}}", ow->id, ow->sample);
        } else {
            put(b, ",\"owner\":null}");
        }
    }
    put(b, "],\"contexts\":[");
    for (int i = 0; i < k->n_ctxs; i++) {
        const kv_ctx_rec *r = &k->ctxs[i];
        char name[32], parent[40] = "null";
        ctx_name(r->id, name, sizeof name);
        if (r->parent) snprintf(parent, sizeof parent, "\"ctx-%lld\"", (long long)r->parent);
        put(b, "%s{\"id\":\"%s\",\"parent\":%s,\"seq\":%d,\"n_tokens\":%lld,\"swapped\":%s,\"busy\":%s%s}", i ? "," : "",
            name, parent, r->seq, (long long)r->n_tokens, r->swapped ? "true" : "false", r->busy ? "true" : "false",
            r->response ? ",\"response\":true" : "");
    }
    free(ix);
    put(b, "],\"stats\":{\"sequences\":%d,\"cow_pages\":%llu,\"prefix_hit_pages\":%llu,\"evicted_pages\":%llu}}",
        st->n_seqs, (unsigned long long)st->cow_pages, (unsigned long long)st->prefix_hit_pages,
        (unsigned long long)st->evicted_pages);
}

void srv_api_kv(srv *s, srv_out *o) {
    kv_call k;
    memset(&k, 0, sizeof k);
    srv_gen_call(s->g, kv_take, &k);
    if (!k.main) {
        srv_error(o, k.err[0] ? 500 : 503, "%s", k.err[0] ? k.err : "the server is shutting down");
    } else if (k.err[0]) {
        srv_error(o, 500, "%s", k.err);
    } else {
        buf b = {0};
        put_json(&b, s, &k);
        if (b.oom) {
            free(b.p);
            srv_error(o, 500, "out of memory writing the KV snapshot");
        } else {
            o->status = 200;
            o->text = b.p;
            o->ctype = "application/json";
            o->no_cache = true;
        }
    }
    pkv_kv_snapshot_free(k.main);
    pkv_kv_snapshot_free(k.win);
    free(k.ctxs);
    free(k.owners);
}
