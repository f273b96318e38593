/* Host-side planning for the CUDA backend: everything that decides what the GPU
 * will be asked to do, in plain C with no CUDA dependency. It is built in every
 * configuration (with or without PKV_CUDA) so tests/test-cuda-plan.c checks it
 * on machines without a GPU. */
#ifndef PKV_CUDA_PLAN_H
#define PKV_CUDA_PLAN_H

#include "base/base.h"
#include "device/cuda/cuda-launch.h"

/* Bytes of one chunk of a batched region copy (one thread block each). */
#define PKV_CU_CHUNK_BYTES ((size_t)64 << 10)

/* The kernels' code for weight type t (PKV_CU_W_*), or -1 when the CUDA
 * kernels do not handle it. */
int pkv_cu_wtype(pkv_type t);

/* Cut a region list into the chunks of one copy kernel launch: empty regions
 * dropped, consecutive regions that continue each other in both source and
 * destination merged, then every region cut into pieces of at most max_chunk
 * bytes. Writes at most cap chunks to out (out may be NULL when cap is 0) and
 * returns how many the list needs, so a first call with cap 0 sizes the array. */
size_t pkv_cu_plan_regions(const pkv_region *r, size_t n, size_t max_chunk, pkv_cu_chunk *out, size_t cap);

/* How many parts the decode attention splits each query's tokens into: 1 when
 * the (query, head) pairs alone fill the GPU (two blocks per SM), else enough
 * parts to fill it, each of at least 256 tokens of an average sequence
 * (meta_pages * page_size / n_seq), at most PKV_CU_ATT_MAX_SPLIT. */
int pkv_cu_attention_splits(int n_q, int n_head, int meta_pages, int page_size, int n_seq, int n_sm);

/* PKV_ERR_UNSUPPORTED naming the device, kernel and argument unless off is a
 * multiple of align (the kernels read f32 words and f16 halves in place). */
pkv_status pkv_cu_check_align(const char *dev, const char *kernel, const char *arg, size_t off, size_t align);

/* The line `pagekv devices` prints when no CUDA device can be used, from the
 * cudaError_t of cudaGetDeviceCount (code, name and text), e.g. for a machine
 * without a driver. */
void pkv_cu_why(int code, const char *name, const char *text, char *why, size_t why_size);

#endif /* PKV_CUDA_PLAN_H */
