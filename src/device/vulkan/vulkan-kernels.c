/* Vulkan kernels: compute pipelines from the embedded SPIR-V, dispatched into the
 * current command buffer (see vulkan.c for the queue model). */
#include "device/vulkan/vulkan-impl.h"

void pkv_vk_pipelines_destroy(pkv_vk_ctx *c) { (void)c; }

const pkv_kernel_ops pkv_vk_kernel_ops = {0};
