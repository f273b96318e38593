/* Ranks: one model over several processes (distributed layer, internal;
 * docs/distributed.md). The transport (dist-mpi.c, built when CMake finds MPI;
 * otherwise a world of one rank) moves byte buffers between ranks; dist.c holds
 * what the model layer needs on top of it: the layer split, the agreement at load
 * (fingerprints and versions), and the step's activations, statuses and logits. */
#ifndef PKV_DIST_H
#define PKV_DIST_H

#include "base/base.h"

#define PKV_DIST_MAX_RANKS 64

/* ---- transport (dist-mpi.c; the stubs in dist.c without MPI) ---- */
/* Start MPI (threads: any one at a time); *rank, *size of the world. */
pkv_status pkv_tp_init(int *rank, int *size);
/* n bytes to / from rank `peer`. recv waits at most timeout_s seconds (0: forever)
 * and fails naming the rank; a transport error (a rank that died) fails naming it. */
pkv_status pkv_tp_send(int peer, const void *p, size_t n);
pkv_status pkv_tp_recv(int peer, void *p, size_t n, double timeout_s);
/* End every rank (a rank failed or stopped answering). */
void pkv_tp_abort(int code);
void pkv_tp_finalize(void);

/* ---- what the model layer uses (dist.c) ---- */
/* Seconds a rank waits for another before it fails naming it (PKV_DIST_TIMEOUT,
 * default 300). */
double pkv_dist_timeout(void);
/* After a transport failure every later exchange fails at once (the ranks no
 * longer agree on what comes next): pkv_dist_finalize then aborts them all. */
bool pkv_dist_broken(void);

/* The layers [first[r], first[r + 1]) of each rank r of n in proportions split
 * (a comma list, NULL = equal), each rank at least one layer. */
pkv_status pkv_dist_split_layers(const char *label, const char *split, int n_layer, int n, int *first);

/* Load-time agreement: every rank sends rank 0 its status, model fingerprint,
 * layer count and the pagekv version; rank 0 compares and every rank returns
 * the same verdict, naming the rank that differs or failed. */
pkv_status pkv_dist_agree(const char *label, pkv_status local, uint64_t fingerprint, int n_layer);

/* A step's header between ranks: the first failure (status and rank) and the
 * step's digest, which every rank compares with its own (the ranks diverged). */
typedef struct pkv_dist_hdr {
    int32_t status, rank;
    uint64_t digest;
    char msg[496];
} pkv_dist_hdr;
/* The header of status s (its message, this rank) and digest. */
pkv_dist_hdr pkv_dist_hdr_make(pkv_status s, uint64_t digest);
/* Receive a header, then (when it says OK and local is OK) n bytes into p; the
 * step's status: local's, else the sender's, else a digest mismatch. */
pkv_status pkv_dist_recv_step(int from, pkv_status local, uint64_t digest, void *p, size_t n);
/* Send status s's header, then (s OK) n bytes from p. */
pkv_status pkv_dist_send_step(int to, pkv_status s, uint64_t digest, const void *p, size_t n);

#endif
