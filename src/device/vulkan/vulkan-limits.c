/* Limits profiles (docs/gpu.md): PKV_VK_LIMITS=NAME makes the backend honour
 * limits of real GPU families that are stricter than what the driver reports
 * (lavapipe is generous), so that code which would break on a phone or a
 * desktop GPU breaks here first. A profile can only tighten: each value in
 * force is the stricter of the driver's and the profile's.
 *
 * What each value changes in the backend:
 *   storage_align   descriptor windows start at multiples of it (the remainder
 *                   travels in push constants) and buffers are placed in device
 *                   memory blocks at multiples of it
 *   max_range       no kernel binds a window of more than this; matmul and
 *                   get_rows bind larger weights and batches in pieces
 *   max_allocations vkAllocateMemory is refused past it (buffers are suballocated)
 *   max_invocations, max_shared, int16, int8
 *                   every shader is inspected (SPIR-V) when its pipeline is made
 *                   and refused if its workgroup, shared memory or capabilities
 *                   exceed them
 *   subgroup sizes  shown only: lavapipe's size is fixed (8); the subgroup
 *                   shaders are written for any size that divides 64.
 *
 * The values are taken from public device reports (the Vulkan hardware
 * database, driver and project issue threads) as written in docs/gpu.md; they
 * are close to, not copies of, one device of each family. */
#include "device/vulkan/vulkan-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((uint64_t)1 << 20)

static const pkv_vk_limits k_profiles[] = {
    /* name       align range     allocs      inv   shared  sg    16/8-bit */
    {"mali", 16, 128 * MiB, 4096, 512, 32768, 16, 16, true, true},
    {"adreno", 64, 128 * MiB, 4096, 1024, 16384, 64, 64, true, true},
    {"intel-xe", 64, 1024 * MiB, 4096, 1024, 65536, 16, 32, true, true},
    {"nvidia", 16, 4095 * MiB, 4096, 1024, 49152, 32, 32, true, true},
    {"rdna", 16, 4095 * MiB, 4096, 1024, 65536, 32, 64, true, true},
    /* the tightest of each, and the Vulkan core minimums (maxComputeWorkGroup-
     * Invocations 128, maxComputeSharedMemorySize 16384, maxStorageBufferRange
     * 2^27, minStorageBufferOffsetAlignment at most 256) */
    {"strict", 256, 128 * MiB, 4096, 128, 16384, 16, 64, false, false},
};

static const char k_names[] = "mali, adreno, intel-xe, nvidia, rdna, strict";

pkv_status pkv_vk_limits_apply(pkv_vk_ctx *c) {
    const char *want = getenv("PKV_VK_LIMITS");
    if (!want || !*want || strcmp(want, "driver") == 0) return PKV_OK;
    const pkv_vk_limits *p = NULL;
    for (size_t i = 0; i < sizeof k_profiles / sizeof k_profiles[0]; i++)
        if (strcmp(k_profiles[i].name, want) == 0) p = &k_profiles[i];
    if (!p)
        return pkv_err(PKV_ERR_INVALID, "%s: PKV_VK_LIMITS=%.32s is not a limits profile (known: driver, %s)", c->name,
                       want, k_names);
    pkv_vk_limits *l = &c->limits;
    snprintf(l->name, sizeof l->name, "%s", p->name);
    l->storage_align = PKV_MAX(l->storage_align, p->storage_align);
    l->max_range = PKV_MIN(l->max_range, p->max_range);
    l->max_allocations = PKV_MIN(l->max_allocations, p->max_allocations);
    l->max_invocations = PKV_MIN(l->max_invocations, p->max_invocations);
    l->max_shared = PKV_MIN(l->max_shared, p->max_shared);
    l->subgroup_min = p->subgroup_min;
    l->subgroup_max = p->subgroup_max;
    l->int16 = l->int16 && p->int16;
    l->int8 = l->int8 && p->int8;
    return PKV_OK;
}

void pkv_vk_limits_describe(const pkv_vk_ctx *c, uint32_t driver_subgroup, char *out, size_t n) {
    const pkv_vk_limits *l = &c->limits;
    snprintf(out, n,
             "%s: storage offsets %llu, range %llu MiB, %llu allocations, %u invocations, %u KiB shared, "
             "subgroup %u-%u (runs %u), 16/8-bit %s",
             l->name, (unsigned long long)l->storage_align, (unsigned long long)(l->max_range >> 20),
             (unsigned long long)l->max_allocations, l->max_invocations, l->max_shared >> 10, l->subgroup_min,
             l->subgroup_max, driver_subgroup, l->int16 && l->int8 ? "allowed" : "off");
}

/* ---- what a shader needs, read from its SPIR-V */

enum {
    OP_CAPABILITY = 17, OP_EXECUTION_MODE = 16, OP_TYPE_INT = 21, OP_TYPE_FLOAT = 22, OP_TYPE_VECTOR = 23,
    OP_TYPE_ARRAY = 28, OP_TYPE_STRUCT = 30, OP_TYPE_POINTER = 32, OP_CONSTANT = 43, OP_VARIABLE = 59,
    MODE_LOCAL_SIZE = 17, CLASS_WORKGROUP = 4,
};

static bool cap_16bit(uint32_t cap) {
    /* Float16, Int16, StorageBuffer16BitAccess, UniformAndStorageBuffer16BitAccess,
     * StoragePushConstant16, StorageInputOutput16 */
    return cap == 9 || cap == 22 || (cap >= 4433 && cap <= 4436);
}
static bool cap_8bit(uint32_t cap) {
    /* Int8, StorageBuffer8BitAccess, UniformAndStorageBuffer8BitAccess, StoragePushConstant8 */
    return cap == 39 || (cap >= 4448 && cap <= 4450);
}

pkv_status pkv_vk_shader_needs(const uint32_t *code, size_t words, pkv_vk_shader_needs_t *out) {
    memset(out, 0, sizeof *out);
    if (words < 5 || code[0] != 0x07230203u) return pkv_err(PKV_ERR_INTERNAL, "not SPIR-V");
    uint32_t bound = code[3];
    if (bound == 0 || bound > (1u << 22)) return pkv_err(PKV_ERR_INTERNAL, "SPIR-V id bound %u", bound);
    /* bytes of each type id (0 = unknown or not sized), the value of each
     * 32-bit constant, the pointee of each Workgroup pointer type */
    uint64_t *size = pkv_calloc(bound, sizeof *size);
    uint32_t *cval = pkv_calloc(bound, sizeof *cval);
    uint32_t *wg_ptr = pkv_calloc(bound, sizeof *wg_ptr);
    if (!size || !cval || !wg_ptr) {
        pkv_free(size);
        pkv_free(cval);
        pkv_free(wg_ptr);
        return pkv_err(PKV_ERR_NOMEM, "reading a shader");
    }
    pkv_status s = PKV_OK;
    for (size_t i = 5; i < words;) {
        uint32_t op = code[i] & 0xffffu, len = code[i] >> 16;
        if (len == 0 || i + len > words) {
            s = pkv_err(PKV_ERR_INTERNAL, "malformed SPIR-V at word %zu", i);
            break;
        }
        const uint32_t *a = code + i + 1;
        uint32_t na = len - 1;
#define ID_OK(x) ((x) < bound)
        switch (op) {
        case OP_CAPABILITY:
            if (na >= 1) {
                out->uses_16bit |= cap_16bit(a[0]);
                out->uses_8bit |= cap_8bit(a[0]);
            }
            break;
        case OP_EXECUTION_MODE:
            if (na >= 5 && a[1] == MODE_LOCAL_SIZE) out->invocations = (uint64_t)a[2] * a[3] * a[4];
            break;
        case OP_TYPE_INT:
        case OP_TYPE_FLOAT:
            if (na >= 2 && ID_OK(a[0])) size[a[0]] = a[1] / 8;
            break;
        case OP_TYPE_VECTOR:
            if (na >= 3 && ID_OK(a[0]) && ID_OK(a[1])) size[a[0]] = size[a[1]] * a[2];
            break;
        case OP_CONSTANT:
            if (na >= 3 && ID_OK(a[1])) cval[a[1]] = a[2];
            break;
        case OP_TYPE_ARRAY:
            if (na >= 3 && ID_OK(a[0]) && ID_OK(a[1]) && ID_OK(a[2])) size[a[0]] = size[a[1]] * cval[a[2]];
            break;
        case OP_TYPE_STRUCT:
            if (na >= 1 && ID_OK(a[0])) {
                uint64_t t = 0;
                for (uint32_t k = 1; k < na; k++) t += ID_OK(a[k]) ? size[a[k]] : 0;
                size[a[0]] = t;
            }
            break;
        case OP_TYPE_POINTER:
            if (na >= 3 && ID_OK(a[0]) && a[1] == CLASS_WORKGROUP) wg_ptr[a[0]] = a[2];
            break;
        case OP_VARIABLE:
            if (na >= 3 && a[2] == CLASS_WORKGROUP && ID_OK(a[0]) && ID_OK(wg_ptr[a[0]]))
                out->shared_bytes += size[wg_ptr[a[0]]];
            break;
        default:
            break;
        }
#undef ID_OK
        i += len;
    }
    pkv_free(size);
    pkv_free(cval);
    pkv_free(wg_ptr);
    return s;
}

pkv_status pkv_vk_shader_admit(const pkv_vk_ctx *c, const char *kernel, const uint32_t *code, size_t bytes) {
    pkv_vk_shader_needs_t n;
    pkv_status s = pkv_vk_shader_needs(code, bytes / 4, &n);
    if (s) return pkv_err_prefix(s, "%s: kernel %s", c->name, kernel);
    const pkv_vk_limits *l = &c->limits;
    if (n.invocations > l->max_invocations)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: kernel %s has workgroups of %llu invocations, more than %u (limits %s)",
                       c->name, kernel, (unsigned long long)n.invocations, l->max_invocations, l->name);
    if (n.shared_bytes > l->max_shared)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: kernel %s needs %llu bytes of shared memory, more than %u (limits %s)",
                       c->name, kernel, (unsigned long long)n.shared_bytes, l->max_shared, l->name);
    if ((n.uses_16bit && !l->int16) || (n.uses_8bit && !l->int8))
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: kernel %s uses %s-bit storage or arithmetic, which limits %s lacks",
                       c->name, kernel, n.uses_16bit && !l->int16 ? "16" : "8", l->name);
    return PKV_OK;
}
