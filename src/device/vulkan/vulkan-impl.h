/* Vulkan backend internals shared by vulkan.c (instance, device, memory, queue,
 * transfers) and vulkan-kernels.c (pipelines and kernel dispatch). */
#ifndef PKV_VULKAN_IMPL_H
#define PKV_VULKAN_IMPL_H

#include "device/device-impl.h"

#include <vulkan/vulkan.h>

/* Command buffers cycled for submissions; a submission waits for the fence of the
 * one it reuses, so at most this many are in flight. */
#define PKV_VK_RING 4
/* Descriptor sets per command buffer when the driver lacks push descriptors. */
#define PKV_VK_POOL_SETS 1024
#define PKV_VK_POOL_DESCRIPTORS (PKV_VK_POOL_SETS * 6)

/* The pipelines, one per compute shader: the build writes PKV_VK_PIPELINES(X),
 * X(ID, name) for each src/device/vulkan/shaders/<name>.comp (cmake/shaders.cmake),
 * giving the enum value PKV_VK_K_<ID>. A pipeline's bindings are the buffers its
 * dispatches pass (vulkan-kernels.c, `dispatch`). */
#include "pkv_vk_pipelines.h"

typedef enum pkv_vk_kernel {
#define PKV_VK_ENUM(id, name) PKV_VK_K_##id,
    PKV_VK_PIPELINES(PKV_VK_ENUM)
#undef PKV_VK_ENUM
    PKV_VK_K_COUNT
} pkv_vk_kernel;

/* The embedded SPIR-V, defined by the generated pkv_shaders.c (cmake/embed.cmake). */
typedef struct {
    const char *name;
    const uint32_t *code;
    size_t bytes;
} pkv_spirv;
extern const pkv_spirv pkv_vk_shaders[];
extern const int pkv_vk_shader_count;

/* A block of device memory that buffers are placed in (vulkan-memory.c). */
typedef struct pkv_vk_block pkv_vk_block;

/* Where a buffer lives: bytes [off, off + size) of a block. */
typedef struct pkv_vk_place {
    pkv_vk_block *block;
    uint64_t off, size;
    uint8_t *map; /* the bytes in the block's mapping (direct mode), else NULL */
} pkv_vk_place;

/* A buffer handle. The VkBuffer is padded to a multiple of 4 bytes so shaders can
 * read whole 32-bit words at the end of an odd-sized buffer. */
typedef struct pkv_vk_buffer {
    VkBuffer buf;
    pkv_vk_place place;
    uint8_t *map; /* persistent mapping in direct mode, else NULL */
    size_t size;  /* requested bytes */
} pkv_vk_buffer;

/* The limits the backend honours: the driver's, or stricter ones of a limits
 * profile (PKV_VK_LIMITS=NAME; vulkan-limits.c, docs/gpu.md). */
typedef struct pkv_vk_limits {
    char name[16];            /* "driver", or the profile's name */
    uint64_t storage_align;   /* minStorageBufferOffsetAlignment, bytes */
    uint64_t max_range;       /* maxStorageBufferRange, bytes */
    uint64_t max_allocations; /* maxMemoryAllocationCount */
    uint32_t max_invocations; /* maxComputeWorkGroupInvocations */
    uint32_t max_shared;      /* maxComputeSharedMemorySize, bytes */
    uint32_t subgroup_min, subgroup_max; /* subgroup sizes of the profile's devices */
    bool int16, int8;         /* 16-bit / 8-bit storage and arithmetic in shaders */
} pkv_vk_limits;

typedef struct pkv_vk_pipeline {
    VkShaderModule module;
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipeline pipe;
    int n_bindings;
} pkv_vk_pipeline;

typedef struct pkv_vk_ctx {
    char name[64];
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    PFN_vkCmdPushDescriptorSetKHR push_descriptor; /* NULL: extension missing */

    /* Direct mode: device-local memory is host-visible and coherent (lavapipe,
     * integrated GPUs), so idle-queue writes/reads/fills use the mapping. */
    bool direct;
    uint32_t type_local;   /* memory type for buffers */
    uint32_t type_staging; /* host-visible coherent memory type for staging */

    /* One command pool per ring slot, reset whole when its command buffer is
     * reused (cheaper on drivers than resetting single command buffers). */
    VkCommandPool cmd_pool[PKV_VK_RING];
    VkCommandBuffer cb[PKV_VK_RING];
    VkFence fence[PKV_VK_RING];
    bool in_flight[PKV_VK_RING];
    VkDescriptorPool desc_pool[PKV_VK_RING]; /* only without push descriptors */
    /* Sets and descriptors taken from desc_pool[cur] since its reset: a pool is
     * never asked for more than it holds (the validation layer's best
     * practices flag allocating from an exhausted pool). */
    int desc_sets, desc_count;
    int cur;        /* ring slot being recorded or next to record */
    bool recording; /* cb[cur] is begun */
    int n_cmds;     /* commands in cb[cur]; a barrier precedes all but the first */
    /* PKV_VK_TEST_NO_BARRIER=1: record no barriers, a deliberate hazard that the
     * tests use to prove synchronization validation is live. Never for real use. */
    bool test_no_barrier;

    pkv_vk_limits limits;
    uint64_t max_allocation_bytes; /* maxMemoryAllocationSize */
    /* Device memory blocks (vulkan-memory.c) and every allocation's count. */
    pkv_vk_block **blocks;
    int n_blocks, cap_blocks;
    int64_t n_allocations, peak_allocations, n_buffers, peak_buffers;
    uint64_t allocation_bytes;

    /* Host-visible staging, a bump allocator reset when the queue is idle. */
    VkBuffer stage_buf;
    VkDeviceMemory stage_mem;
    uint64_t stage_mem_size;
    uint8_t *stage_map;
    size_t stage_cap, stage_used;

    pkv_vk_pipeline pipes[PKV_VK_K_COUNT]; /* created lazily */
    /* Largest window of a buffer one kernel argument may bind: the device's
     * maxStorageBufferRange, or less with PKV_VK_MAX_RANGE (to test chunking). */
    uint64_t max_range;
    /* Subgroup arithmetic in compute shaders (matmul_sg); PKV_VK_NO_SUBGROUP=1
     * turns it off so the portable matmul can be tested. */
    bool subgroup_arith;
    /* The i-quant grids for matmul_int/get_rows_int (pkv_vk_grids); NULL until used. */
    pkv_vk_buffer *grids;
    pkv_buffer grids_ref; /* a device-layer view of it, for kernel arguments */
} pkv_vk_ctx;

/* Error for a failed Vulkan call: "vulkan:0: vkQueueSubmit: VK_ERROR_DEVICE_LOST". */
pkv_status pkv_vk_fail(const pkv_vk_ctx *c, const char *call, VkResult r);
const char *pkv_vk_result_str(VkResult r);
/* Make sure cb[cur] is recording, and add a full memory barrier when it already
 * holds commands, so every command sees the effects of the ones before it (I3). */
pkv_status pkv_vk_begin(pkv_vk_ctx *c);
/* Submit what is recorded (no wait). */
pkv_status pkv_vk_submit(pkv_vk_ctx *c);
/* Submit and wait for all work. */
pkv_status pkv_vk_sync(pkv_vk_ctx *c);

/* vkAllocateMemory / vkFreeMemory, counted against limits.max_allocations. */
pkv_status pkv_vk_mem_raw(pkv_vk_ctx *c, uint32_t type, uint64_t size, VkDeviceMemory *mem);
void pkv_vk_mem_raw_free(pkv_vk_ctx *c, VkDeviceMemory mem, uint64_t size);
/* Place buf in memory of the type (a block, or an allocation of its own when
 * large) and bind it; mapped: the memory is mapped (direct mode). On error
 * nothing is placed. */
pkv_status pkv_vk_mem_place(pkv_vk_ctx *c, VkBuffer buf, uint32_t type, bool mapped, pkv_vk_place *out);
void pkv_vk_mem_release(pkv_vk_ctx *c, pkv_vk_place *p);
/* Frees every block (at close, after the buffers). */
void pkv_vk_mem_destroy(pkv_vk_ctx *c);

/* Limits profiles (vulkan-limits.c): tighten c->limits to PKV_VK_LIMITS's
 * profile; an unknown name is PKV_ERR_INVALID naming the known ones. */
pkv_status pkv_vk_limits_apply(pkv_vk_ctx *c);
/* One line for caps.limits / `pagekv devices`. */
void pkv_vk_limits_describe(const pkv_vk_ctx *c, uint32_t driver_subgroup, char *out, size_t n);
/* What a shader needs, read from its SPIR-V. */
typedef struct pkv_vk_shader_needs_t {
    uint64_t invocations;  /* workgroup size (LocalSize x*y*z) */
    uint64_t shared_bytes; /* Workgroup-storage variables, bytes */
    bool uses_16bit, uses_8bit; /* declares a 16-bit / 8-bit capability */
} pkv_vk_shader_needs_t;
pkv_status pkv_vk_shader_needs(const uint32_t *code, size_t words, pkv_vk_shader_needs_t *out);
/* PKV_ERR_UNSUPPORTED when the shader exceeds the limits in force. */
pkv_status pkv_vk_shader_admit(const pkv_vk_ctx *c, const char *kernel, const uint32_t *code, size_t bytes);

void pkv_vk_pipelines_destroy(pkv_vk_ctx *c);
/* The i-quant grids (src/base/iq-grids.h: iq2_xxs, iq2_xs, iq2_s, iq3_xxs,
 * iq3_s, iq1_s, in that order, packed words) in a device buffer of their own,
 * made and filled on first use (the fill is queued before the caller's next
 * command). In the shaders as constant arrays they took lavapipe 80 s to compile. */
pkv_status pkv_vk_grids(pkv_vk_ctx *c, pkv_buffer **out);
extern const pkv_kernel_ops pkv_vk_kernel_ops;

#endif
