// labels: kv model vulkan timeout=300
/* test-media-kv on vulkan:0 (skipped when no Vulkan device opens): media rows
 * in the paged cache, every operation against replay. */
#define MEDIA_DEVICE "vulkan:0"
#define MEDIA_NEEDS_DEVICE 1
#include "test-media-kv.c"
