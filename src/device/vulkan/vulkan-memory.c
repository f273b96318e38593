/* Vulkan device memory: buffers are placed inside a few large allocations
 * (blocks) instead of one vkAllocateMemory each. Drivers cap the number of
 * allocations (maxMemoryAllocationCount: 4096 on many GPUs) and make each one
 * expensive; the validation layer's best-practices checks flag small ones.
 *
 * A block is one VkDeviceMemory of one memory type, mapped once in direct mode.
 * Its free space is a list of (offset, size) ranges sorted by offset and merged
 * with their neighbours on free; a buffer takes the first range that holds it at
 * its alignment (the driver's VkMemoryRequirements.alignment, raised to the
 * limits profile's minStorageBufferOffsetAlignment, at least 16). Blocks grow
 * from PKV_VK_BLOCK_MIN, doubling with each block held, up to PKV_VK_BLOCK_MAX;
 * a buffer of more than half of that gets an allocation of its own (dedicated),
 * as does anything when the device's maxMemoryAllocationSize is smaller. One
 * empty block is kept for the next buffers; further empty ones are freed.
 *
 * Every vkAllocateMemory of the device (blocks, dedicated buffers, staging) goes
 * through mem_raw, which counts them against the allocation limit in force. */
#include "device/vulkan/vulkan-impl.h"

#include <string.h>

#define PKV_VK_BLOCK_MIN ((uint64_t)16 << 20)
#define PKV_VK_BLOCK_MAX ((uint64_t)256 << 20)

typedef struct {
    uint64_t off, size;
} range;

struct pkv_vk_block {
    VkDeviceMemory mem;
    uint8_t *map; /* whole-block mapping in direct mode, else NULL */
    uint64_t size;
    uint32_t type;
    bool dedicated; /* holds one buffer and is freed with it */
    int n_live;     /* buffers placed in it */
    range *free;    /* free ranges, sorted by offset, never adjacent */
    int n_free, cap_free;
};

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

pkv_status pkv_vk_mem_raw(pkv_vk_ctx *c, uint32_t type, uint64_t size, VkDeviceMemory *mem) {
    if (c->limits.max_allocations && c->n_allocations >= (int64_t)c->limits.max_allocations)
        return pkv_err(PKV_ERR_NOMEM,
                       "%s: the device's limit of %llu memory allocations is reached (limits profile %s)", c->name,
                       (unsigned long long)c->limits.max_allocations, c->limits.name);
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.allocationSize = size;
    mai.memoryTypeIndex = type;
    VkResult r = vkAllocateMemory(c->dev, &mai, NULL, mem);
    if (r != VK_SUCCESS) return pkv_vk_fail(c, "vkAllocateMemory", r);
    c->n_allocations++;
    c->allocation_bytes += size;
    if (c->n_allocations > c->peak_allocations) c->peak_allocations = c->n_allocations;
    return PKV_OK;
}

void pkv_vk_mem_raw_free(pkv_vk_ctx *c, VkDeviceMemory mem, uint64_t size) {
    if (!mem) return;
    vkFreeMemory(c->dev, mem, NULL);
    c->n_allocations--;
    c->allocation_bytes -= size;
}

static void block_destroy(pkv_vk_ctx *c, pkv_vk_block *b) {
    if (b->map) vkUnmapMemory(c->dev, b->mem);
    pkv_vk_mem_raw_free(c, b->mem, b->size);
    pkv_free(b->free);
    pkv_free(b);
}

static pkv_status block_create(pkv_vk_ctx *c, uint32_t type, uint64_t size, bool dedicated, bool mapped,
                               pkv_vk_block **out) {
    if (c->n_blocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 8;
        pkv_vk_block **nb = pkv_realloc(c->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return pkv_err(PKV_ERR_NOMEM, "%s: out of host memory for the block list", c->name);
        c->blocks = nb;
        c->cap_blocks = cap;
    }
    pkv_vk_block *b = pkv_calloc(1, sizeof *b);
    if (!b) return pkv_err(PKV_ERR_NOMEM, "%s: out of host memory for a memory block", c->name);
    b->size = size;
    b->type = type;
    b->dedicated = dedicated;
    if (!dedicated) {
        b->free = pkv_malloc(8 * sizeof *b->free);
        if (!b->free) {
            pkv_free(b);
            return pkv_err(PKV_ERR_NOMEM, "%s: out of host memory for a memory block", c->name);
        }
        b->cap_free = 8;
        b->n_free = 1;
        b->free[0] = (range){0, size};
    }
    pkv_status s = pkv_vk_mem_raw(c, type, size, &b->mem);
    if (s) {
        pkv_free(b->free);
        pkv_free(b);
        return s;
    }
    if (mapped) {
        VkResult r = vkMapMemory(c->dev, b->mem, 0, VK_WHOLE_SIZE, 0, (void **)&b->map);
        if (r != VK_SUCCESS) {
            b->map = NULL;
            block_destroy(c, b);
            return pkv_vk_fail(c, "vkMapMemory", r);
        }
    }
    c->blocks[c->n_blocks++] = b;
    *out = b;
    return PKV_OK;
}

static void block_remove(pkv_vk_ctx *c, pkv_vk_block *b) {
    for (int i = 0; i < c->n_blocks; i++)
        if (c->blocks[i] == b) {
            c->blocks[i] = c->blocks[--c->n_blocks];
            break;
        }
    block_destroy(c, b);
}

/* First fit of size bytes at alignment a; false when no free range holds it. */
static bool block_take(pkv_vk_block *b, uint64_t size, uint64_t a, uint64_t *off) {
    for (int i = 0; i < b->n_free; i++) {
        range f = b->free[i];
        uint64_t start = align_up(f.off, a);
        if (start + size > f.off + f.size || start < f.off) continue;
        uint64_t head = start - f.off, tail = f.off + f.size - (start + size);
        if (head && tail) {
            /* split: needs one more slot (room was made by the caller) */
            memmove(&b->free[i + 2], &b->free[i + 1], (size_t)(b->n_free - i - 1) * sizeof *b->free);
            b->free[i] = (range){f.off, head};
            b->free[i + 1] = (range){start + size, tail};
            b->n_free++;
        } else if (head) {
            b->free[i].size = head;
        } else if (tail) {
            b->free[i] = (range){start + size, tail};
        } else {
            memmove(&b->free[i], &b->free[i + 1], (size_t)(b->n_free - i - 1) * sizeof *b->free);
            b->n_free--;
        }
        *off = start;
        b->n_live++;
        return true;
    }
    return false;
}

/* Gives [off, off + size) back, merged with the free neighbours. The caller made
 * room for one more range. */
static void block_give(pkv_vk_block *b, uint64_t off, uint64_t size) {
    int i = 0;
    while (i < b->n_free && b->free[i].off < off) i++;
    bool left = i > 0 && b->free[i - 1].off + b->free[i - 1].size == off;
    bool right = i < b->n_free && off + size == b->free[i].off;
    if (left && right) {
        b->free[i - 1].size += size + b->free[i].size;
        memmove(&b->free[i], &b->free[i + 1], (size_t)(b->n_free - i - 1) * sizeof *b->free);
        b->n_free--;
    } else if (left) {
        b->free[i - 1].size += size;
    } else if (right) {
        b->free[i].off = off;
        b->free[i].size += size;
    } else {
        memmove(&b->free[i + 1], &b->free[i], (size_t)(b->n_free - i) * sizeof *b->free);
        b->free[i] = (range){off, size};
        b->n_free++;
    }
    b->n_live--;
}

static bool room_for_one_more(pkv_vk_block *b) {
    if (b->n_free < b->cap_free) return true;
    range *nf = pkv_realloc(b->free, (size_t)(2 * b->cap_free) * sizeof *nf);
    if (!nf) return false;
    b->free = nf;
    b->cap_free *= 2;
    return true;
}

pkv_status pkv_vk_mem_place(pkv_vk_ctx *c, VkBuffer buf, uint32_t type, bool mapped, pkv_vk_place *out) {
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(c->dev, buf, &req);
    if (!(req.memoryTypeBits & (1u << type)))
        return pkv_err(PKV_ERR_DEVICE, "%s: a buffer of %llu bytes cannot use memory type %u (allowed mask 0x%x)",
                       c->name, (unsigned long long)req.size, type, req.memoryTypeBits);
    uint64_t a = PKV_MAX(PKV_MAX(req.alignment, c->limits.storage_align), 16);
    uint64_t bmax = PKV_MIN(PKV_VK_BLOCK_MAX, c->max_allocation_bytes);
    pkv_vk_block *b = NULL;
    uint64_t off = 0;
    pkv_status s;
    if (req.size > bmax / 2) {
        if ((s = block_create(c, type, req.size, true, mapped, &b))) return s;
        b->n_live = 1;
    } else {
        for (int i = 0; i < c->n_blocks && !b; i++) {
            pkv_vk_block *k = c->blocks[i];
            if (k->dedicated || k->type != type || !room_for_one_more(k)) continue;
            if (block_take(k, req.size, a, &off)) b = k;
        }
        if (!b) {
            int held = 0;
            for (int i = 0; i < c->n_blocks; i++) held += !c->blocks[i]->dedicated && c->blocks[i]->type == type;
            uint64_t size = PKV_VK_BLOCK_MIN << PKV_MIN(held, 8);
            size = PKV_MIN(PKV_MAX(size, align_up(req.size, a)), bmax);
            if ((s = block_create(c, type, size, false, mapped, &b))) return s;
            if (!block_take(b, req.size, a, &off)) { /* cannot happen: a fresh block holds it */
                block_remove(c, b);
                return pkv_err(PKV_ERR_INTERNAL, "%s: a new memory block does not hold its buffer", c->name);
            }
        }
    }
    VkResult r = vkBindBufferMemory(c->dev, buf, b->mem, off);
    if (r != VK_SUCCESS) {
        pkv_vk_place p = {b, off, req.size, NULL};
        pkv_vk_mem_release(c, &p);
        return pkv_vk_fail(c, "vkBindBufferMemory", r);
    }
    *out = (pkv_vk_place){b, off, req.size, NULL};
    out->map = b->map ? b->map + off : NULL;
    return PKV_OK;
}

void pkv_vk_mem_release(pkv_vk_ctx *c, pkv_vk_place *p) {
    pkv_vk_block *b = p->block;
    if (!b) return;
    p->block = NULL;
    if (b->dedicated) {
        block_remove(c, b);
        return;
    }
    if (!room_for_one_more(b)) {
        /* No host memory to record the range: the space stays lost until the
         * block is empty or the device closes, nothing worse. */
        b->n_live--;
    } else {
        block_give(b, p->off, p->size);
    }
    if (b->n_live > 0) return;
    /* Keep one empty block of this type for the next buffers. */
    for (int i = 0; i < c->n_blocks; i++) {
        pkv_vk_block *k = c->blocks[i];
        if (k != b && !k->dedicated && k->type == b->type && k->n_live == 0) {
            block_remove(c, b);
            return;
        }
    }
    b->n_free = 1;
    b->free[0] = (range){0, b->size};
}

void pkv_vk_mem_destroy(pkv_vk_ctx *c) {
    while (c->n_blocks > 0) block_remove(c, c->blocks[c->n_blocks - 1]);
    pkv_free(c->blocks);
    c->blocks = NULL;
    c->cap_blocks = 0;
}
