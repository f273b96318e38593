// labels: kv vulkan timeout=900
/* The randomized KV test with its cache on vulkan:0, and sharded over cpu +
 * vulkan:0 (skipped when no Vulkan device opens). Fewer operations per seed
 * than on the CPU: lavapipe reads are slow, and every step reads every sequence. */
#define KV_RANDOM_DEVICES {{"vulkan:0", "vulkan:0"}, {"cpu", "vulkan:0"}}
#define KV_RANDOM_OPS 10000
#include "test-kv-random.c"
