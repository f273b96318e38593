/* The ranks' transport over MPI (Open MPI here; compiled only when CMake finds
 * MPI: PKV_HAVE_MPI). Errors are returned (MPI_ERRORS_RETURN), and every wait
 * polls with a deadline, so a rank that stops answering fails the call naming
 * it instead of hanging (Open MPI itself ends the job when a rank dies; see
 * docs/distributed.md). Large buffers go in pieces of at most 1 GiB (MPI counts
 * are ints). */
#include <limits.h>
#include <mpi.h>
#include <time.h>

#include "dist/dist.h"

#define TP_TAG 0x706b
#define TP_PIECE ((size_t)1 << 30)

static pkv_status tp_fail(int rc, const char *what, int peer) {
    char m[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, m, &n) != MPI_SUCCESS) snprintf(m, sizeof m, "MPI error %d", rc);
    return pkv_err(PKV_ERR_IO, "%s rank %d failed: %s", what, peer, m);
}

pkv_status pkv_tp_init(int *rank, int *size) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    /* the engine's thread runs the steps, the main thread loads: one at a time */
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return pkv_err(PKV_ERR_IO, "MPI_Init_thread failed");
    if (!inited && provided < MPI_THREAD_SERIALIZED)
        return pkv_err(PKV_ERR_UNSUPPORTED, "this MPI library gives thread level %d; pagekv needs MPI_THREAD_SERIALIZED (%d)",
                       provided, MPI_THREAD_SERIALIZED);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return PKV_OK;
}

/* Wait for r, at most timeout_s seconds (0: forever): spinning first, then
 * sleeping 50 µs between polls. */
static pkv_status tp_wait(MPI_Request *r, const char *what, int peer, double timeout_s) {
    struct timespec t0, now, nap = {0, 50000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0;; i++) {
        int done = 0, rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return tp_fail(rc, what, peer);
        if (done) return PKV_OK;
        if (i < 20000) continue;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double dt = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (timeout_s > 0 && dt > timeout_s) {
            MPI_Cancel(r);
            return pkv_err(PKV_ERR_IO, "%s rank %d: no answer within %.0f s (the rank stopped or cannot be reached; "
                           "PKV_DIST_TIMEOUT sets the limit)", what, peer, timeout_s);
        }
        nanosleep(&nap, NULL);
    }
}

pkv_status pkv_tp_send(int peer, const void *p, size_t n) {
    const char *c = p;
    do {
        size_t k = PKV_MIN(n, TP_PIECE);
        MPI_Request r;
        int rc = MPI_Isend(c, (int)k, MPI_BYTE, peer, TP_TAG, MPI_COMM_WORLD, &r);
        if (rc != MPI_SUCCESS) return tp_fail(rc, "sending to", peer);
        pkv_status s = tp_wait(&r, "sending to", peer, pkv_dist_timeout());
        if (s) return s;
        c += k;
        n -= k;
    } while (n > 0);
    return PKV_OK;
}

pkv_status pkv_tp_recv(int peer, void *p, size_t n, double timeout_s) {
    char *c = p;
    do {
        size_t k = PKV_MIN(n, TP_PIECE);
        MPI_Request r;
        int rc = MPI_Irecv(c, (int)k, MPI_BYTE, peer, TP_TAG, MPI_COMM_WORLD, &r);
        if (rc != MPI_SUCCESS) return tp_fail(rc, "receiving from", peer);
        pkv_status s = tp_wait(&r, "receiving from", peer, timeout_s);
        if (s) return s;
        c += k;
        n -= k;
    } while (n > 0);
    return PKV_OK;
}

void pkv_tp_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void pkv_tp_finalize(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}
