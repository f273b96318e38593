// labels: kv cuda timeout=900
/* The randomized KV test with its cache on cuda:0, and sharded over cpu +
 * cuda:0. Skipped (77) when no CUDA device opens, so it never passes without a
 * GPU. */
#define KV_RANDOM_DEVICES {{"cuda:0", "cuda:0"}, {"cpu", "cuda:0"}}
#define KV_RANDOM_OPS 10000
#include "test-kv-random.c"
