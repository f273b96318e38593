/* Ranks (docs/distributed.md): the world, the layer split, the agreement at load
 * and a step's exchanges, over the transport of dist-mpi.c. A build without MPI
 * has a world of one rank and refuses a launch of several. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"

static int g_rank, g_size = 1;
static bool g_broken;
static uint64_t g_sent, g_received;

#ifndef PKV_HAVE_MPI
pkv_status pkv_tp_init(int *rank, int *size) {
    *rank = 0;
    *size = 1;
    return PKV_OK;
}
pkv_status pkv_tp_send(int peer, const void *p, size_t n) {
    (void)p, (void)n;
    return pkv_err(PKV_ERR_UNSUPPORTED, "sending to rank %d: this pagekv was built without MPI", peer);
}
pkv_status pkv_tp_recv(int peer, void *p, size_t n, double timeout_s) {
    (void)p, (void)n, (void)timeout_s;
    return pkv_err(PKV_ERR_UNSUPPORTED, "receiving from rank %d: this pagekv was built without MPI", peer);
}
/* Never reached without MPI (one rank: pkv_dist_finalize returns first); the library
 * does not end the process (I7). */
void pkv_tp_abort(int code) { (void)code; }
void pkv_tp_finalize(void) {}
#endif

/* The world size the launcher gives (Open MPI, MPICH/PMI, Slurm's PMIx), 0 when
 * the process was not started as one of several ranks. */
static int launched_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < PKV_ARRAY_LEN(vars); i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 0;
}

pkv_status pkv_dist_init(void) {
    int n = launched_size();
    if (n <= 1 || g_size > 1) return PKV_OK;
#ifndef PKV_HAVE_MPI
    return pkv_err(PKV_ERR_UNSUPPORTED, "started as one of %d MPI ranks, but this pagekv was built without MPI (install "
                   "libopenmpi-dev and rebuild)", n);
#else
    pkv_status s = pkv_tp_init(&g_rank, &g_size);
    if (!s && g_size > PKV_DIST_MAX_RANKS)
        s = pkv_err(PKV_ERR_UNSUPPORTED, "%d MPI ranks: at most %d are supported", g_size, PKV_DIST_MAX_RANKS);
    return s;
#endif
}

int pkv_dist_rank(void) { return g_rank; }
int pkv_dist_size(void) { return g_size; }
bool pkv_dist_broken(void) { return g_broken; }

double pkv_dist_timeout(void) {
    const char *v = getenv("PKV_DIST_TIMEOUT");
    double t = v ? atof(v) : 0;
    return t > 0 ? t : 300;
}

/* Every exchange goes through these: a failed transport breaks the world. */
static pkv_status send_b(int peer, const void *p, size_t n) {
    if (g_broken) return pkv_err(PKV_ERR_IO, "rank %d: the ranks stopped agreeing after an earlier failure", g_rank);
    pkv_status s = pkv_tp_send(peer, p, n);
    g_broken |= s != PKV_OK;
    g_sent += s ? 0 : n;
    return s ? pkv_err_prefix(s, "rank %d", g_rank) : s;
}

static pkv_status recv_b(int peer, void *p, size_t n) {
    if (g_broken) return pkv_err(PKV_ERR_IO, "rank %d: the ranks stopped agreeing after an earlier failure", g_rank);
    pkv_status s = pkv_tp_recv(peer, p, n, pkv_dist_timeout());
    g_broken |= s != PKV_OK;
    g_received += s ? 0 : n;
    return s ? pkv_err_prefix(s, "rank %d", g_rank) : s;
}

pkv_status pkv_dist_bcast(void *p, size_t n) {
    if (g_size <= 1) return PKV_OK;
    if (!p && n) return pkv_err(PKV_ERR_INVALID, "pkv_dist_bcast: NULL buffer of %zu bytes", n);
    pkv_status s = PKV_OK;
    if (g_rank != 0) return recv_b(0, p, n);
    for (int r = 1; r < g_size && !s; r++) s = send_b(r, p, n);
    return s;
}

pkv_status pkv_dist_gather(const void *p, size_t n, void *out) {
    if ((!p && n) || (g_rank == 0 && !out && n)) return pkv_err(PKV_ERR_INVALID, "pkv_dist_gather: NULL buffer");
    if (g_rank != 0) return send_b(0, p, n);
    memcpy(out, p, n);
    pkv_status s = PKV_OK;
    for (int r = 1; r < g_size && !s; r++) s = recv_b(r, (char *)out + (size_t)r * n, n);
    return s;
}

void pkv_dist_bytes(uint64_t *sent, uint64_t *received) {
    if (sent) *sent = g_sent;
    if (received) *received = g_received;
}

void pkv_dist_finalize(int failed) {
    if (g_size <= 1) return;
    if (failed || g_broken) pkv_tp_abort(failed ? failed : 1); /* a rank may wait for a message that never comes */
    pkv_tp_finalize();
    g_size = 1;
    g_rank = 0;
}

pkv_status pkv_dist_split_layers(const char *label, const char *split, int n_layer, int n, int *first) {
    double w[PKV_DIST_MAX_RANKS], tot = 0;
    int k = 0;
    for (int r = 0; r < n; r++) w[r] = 1;
    if (split) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", split);
        char *save = NULL, *end;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), k++) {
            double v = strtod(tok, &end);
            if (*end || !(v > 0) || k >= n)
                return pkv_err(PKV_ERR_INVALID, "%s: rank split '%s' must be %d positive numbers, one per rank", label, split, n);
            w[k] = v;
        }
        if (k != n) return pkv_err(PKV_ERR_INVALID, "%s: rank split '%s' has %d numbers for %d ranks", label, split, k, n);
    }
    if (n_layer < n)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: %d layers cannot be split over %d ranks (each rank holds at least one layer)",
                       label, n_layer, n);
    for (int r = 0; r < n; r++) tot += w[r];
    double cum = 0;
    first[0] = 0;
    for (int r = 1; r <= n; r++) {
        cum += w[r - 1];
        int b = r == n ? n_layer : (int)((double)n_layer * cum / tot + 0.5);
        /* at least one layer each, and room for one for each rank after */
        first[r] = PKV_MIN(PKV_MAX(b, first[r - 1] + 1), n_layer - (n - r));
    }
    return PKV_OK;
}

typedef struct agree_msg {
    int32_t status, n_layer;
    uint64_t fingerprint;
    char version[32];
    char msg[464];
} agree_msg;

/* Rank 0's verdict over every rank's message. */
static pkv_status verdict(const char *label, const agree_msg *all, int n) {
    for (int r = 0; r < n; r++)
        if (all[r].status) return pkv_err((pkv_status)all[r].status, "rank %d: %s", r, all[r].msg);
    for (int r = 1; r < n; r++) {
        if (strcmp(all[r].version, all[0].version))
            return pkv_err(PKV_ERR_MISMATCH, "%s: rank %d runs pagekv %s, rank 0 pagekv %s: every rank must run the same "
                           "version", label, r, all[r].version, all[0].version);
        if (all[r].fingerprint != all[0].fingerprint || all[r].n_layer != all[0].n_layer)
            return pkv_err(PKV_ERR_MISMATCH, "%s: rank %d loaded a different model (fingerprint %016llx, %d layers) than "
                           "rank 0 (%016llx, %d layers): every rank must load the same file", label, r,
                           (unsigned long long)all[r].fingerprint, all[r].n_layer, (unsigned long long)all[0].fingerprint,
                           all[0].n_layer);
    }
    return PKV_OK;
}

pkv_status pkv_dist_agree(const char *label, pkv_status local, uint64_t fingerprint, int n_layer) {
    if (g_size <= 1) return local;
    agree_msg me;
    memset(&me, 0, sizeof me);
    me.status = local;
    me.n_layer = n_layer;
    me.fingerprint = fingerprint;
    snprintf(me.version, sizeof me.version, "%s", pkv_version());
    if (local) snprintf(me.msg, sizeof me.msg, "%s", pkv_errmsg());
    pkv_dist_hdr v;
    memset(&v, 0, sizeof v);
    pkv_status s = PKV_OK;
    if (g_rank == 0) {
        agree_msg *all = pkv_calloc((size_t)g_size, sizeof *all);
        if (!all) return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", label);
        all[0] = me;
        for (int r = 1; r < g_size && !s; r++) s = recv_b(r, &all[r], sizeof all[r]);
        if (!s) {
            v.status = verdict(label, all, g_size);
            if (v.status) snprintf(v.msg, sizeof v.msg, "%s", pkv_errmsg());
            for (int r = 1; r < g_size && !s; r++) s = send_b(r, &v, sizeof v);
        }
        pkv_free(all);
    } else if (!(s = send_b(0, &me, sizeof me))) {
        s = recv_b(0, &v, sizeof v);
    }
    if (s) return s;
    return v.status ? pkv_err((pkv_status)v.status, "%s", v.msg) : PKV_OK;
}

pkv_dist_hdr pkv_dist_hdr_make(pkv_status s, uint64_t digest) {
    pkv_dist_hdr h;
    memset(&h, 0, sizeof h);
    h.status = s;
    h.rank = g_rank;
    h.digest = digest;
    /* a failure that came from another rank already names it */
    if (s && !strncmp(pkv_errmsg(), "rank ", 5)) snprintf(h.msg, sizeof h.msg, "%s", pkv_errmsg());
    else if (s) snprintf(h.msg, sizeof h.msg, "rank %d: %s", g_rank, pkv_errmsg());
    return h;
}

pkv_status pkv_dist_recv_step(int from, pkv_status local, uint64_t digest, void *p, size_t n) {
    pkv_dist_hdr h;
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", local ? pkv_errmsg() : "");
    pkv_status s = recv_b(from, &h, sizeof h);
    if (!s && !h.status && n) s = recv_b(from, p, n);
    if (local) return pkv_err(local, "%s", keep); /* the first failure is the one to name */
    if (s) return s;
    if (h.status) return pkv_err((pkv_status)h.status, "%s", h.msg);
    if (h.digest != digest)
        return pkv_err(PKV_ERR_INTERNAL, "rank %d: its step differs from rank %d's (digest %016llx, not %016llx): the ranks "
                       "diverged (a call made on one rank only?)", g_rank, h.rank, (unsigned long long)digest,
                       (unsigned long long)h.digest);
    return PKV_OK;
}

pkv_status pkv_dist_send_step(int to, pkv_status s, uint64_t digest, const void *p, size_t n) {
    pkv_dist_hdr h = pkv_dist_hdr_make(s, digest);
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", s ? pkv_errmsg() : "");
    pkv_status t = send_b(to, &h, sizeof h);
    if (!t && !s && n) t = send_b(to, p, n);
    if (s) return pkv_err(s, "%s", keep);
    return t;
}
