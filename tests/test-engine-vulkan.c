// labels: vulkan timeout=900
/* test-engine's device-dependent part on vulkan:0 (skipped without a Vulkan
 * device): greedy equals the context API, batch invariance (64 mixed requests
 * bitwise equal to each alone, llama q8_0 and qwen3 f16) and preemption by swap
 * and recompute, on a device whose kernels compute each batch row independently. */
#define ET_DEVICE "vulkan:0"
#include "test-engine.c"
