/* pagekv — a portable LLM-inference runtime around a paged KV cache.
 *
 * Conventions of this header:
 *  - every fallible function returns pkv_status (0 = OK, negative = error) or a
 *    handle that is NULL on failure; pkv_errmsg() then gives the specifics;
 *  - unless a function says otherwise, on error nothing is changed;
 *  - params structs come from pkv_<thing>_default_params() and are passed by value;
 *  - pkv_<thing>_free(NULL) / _close(NULL) is a no-op.
 * The library never exits, aborts or prints to stdout. */
#ifndef PAGEKV_H
#define PAGEKV_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ base */

typedef enum pkv_status {
    PKV_OK = 0,
    PKV_ERR_INVALID = -1,      /* bad argument: NULL, out of bounds, overlap, bad shape */
    PKV_ERR_NOMEM = -2,        /* host or device allocation failed */
    PKV_ERR_OUT_OF_PAGES = -3, /* KV page pool exhausted; recoverable, nothing changed */
    PKV_ERR_IO = -4,           /* file could not be opened, read or written */
    PKV_ERR_FORMAT = -5,       /* malformed or mismatching file contents */
    PKV_ERR_UNSUPPORTED = -6,  /* valid request this build or device cannot do */
    PKV_ERR_DEVICE = -7,       /* a device operation failed (driver error, lost device) */
    PKV_ERR_MISMATCH = -8,     /* two objects that must agree do not (layouts, devices) */
    PKV_ERR_NOT_FOUND = -9,    /* no such device, key, tensor or sequence */
    PKV_ERR_INTERNAL = -10,    /* an internal invariant failed: a pagekv bug */
} pkv_status;

/* The library's version, e.g. "0.3.0" (the CMake project version). */
const char *pkv_version(void);

/* Static text for a status, e.g. "out of KV pages". Never NULL. */
const char *pkv_status_str(pkv_status s);

/* The message of the last failure on this thread, with specifics (which file,
 * which tensor, which layer, expected and found). "" when none. */
const char *pkv_errmsg(void);

/* The status of the failure pkv_errmsg() describes (PKV_OK when none on this
 * thread): what a function that returns NULL on failure failed with, for
 * bindings that map statuses to exceptions (python/pagekv). */
pkv_status pkv_errcode(void);

typedef enum pkv_log_level {
    PKV_LOG_DEBUG = 0,
    PKV_LOG_INFO = 1,
    PKV_LOG_WARN = 2,
    PKV_LOG_ERROR = 3,
    PKV_LOG_NONE = 4,
} pkv_log_level;

typedef void (*pkv_log_fn)(pkv_log_level level, const char *msg, void *user);

/* Route library log lines to fn (NULL restores the default: stderr). Lines below
 * min_level are dropped. Not thread-safe against concurrent logging; set it first. */
void pkv_log_set(pkv_log_fn fn, void *user, pkv_log_level min_level);

/* Allocator hooks. Every allocation of the library goes through them.
 * realloc(NULL, n) allocates; free(NULL) is a no-op. NULL fn restores libc. */
typedef struct pkv_allocator {
    void *(*alloc)(size_t size, void *user);
    void *(*realloc)(void *ptr, size_t size, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} pkv_allocator;

void pkv_allocator_set(const pkv_allocator *a);

/* Test hook: make the n-th allocation from now fail (1 = the next one); 0 disables.
 * Returns how many allocations were made since the last call, so a test can
 * learn how many allocations an operation makes and then fail each in turn. */
uint64_t pkv_alloc_fail_at(uint64_t n);
/* Number of live allocations made through the hooks (for leak checks in tests). */
int64_t pkv_alloc_live(void);

/* IEEE half and bfloat16, round to nearest even; NaN, Inf and subnormals exact. */
uint16_t pkv_f32_to_f16(float f);
float pkv_f16_to_f32(uint16_t h);
uint16_t pkv_f32_to_bf16(float f);
float pkv_bf16_to_f32(uint16_t h);

/* Element types. Values equal GGML's type ids so GGUF files map directly. */
typedef enum pkv_type {
    PKV_TYPE_F32 = 0,
    PKV_TYPE_F16 = 1,
    PKV_TYPE_Q4_0 = 2,
    PKV_TYPE_Q4_1 = 3,
    PKV_TYPE_Q5_0 = 6,
    PKV_TYPE_Q5_1 = 7,
    PKV_TYPE_Q8_0 = 8,
    PKV_TYPE_Q2_K = 10,
    PKV_TYPE_Q3_K = 11,
    PKV_TYPE_Q4_K = 12,
    PKV_TYPE_Q5_K = 13,
    PKV_TYPE_Q6_K = 14,
    PKV_TYPE_Q8_K = 15,
    PKV_TYPE_IQ2_XXS = 16,
    PKV_TYPE_IQ2_XS = 17,
    PKV_TYPE_IQ3_XXS = 18,
    PKV_TYPE_IQ1_S = 19,
    PKV_TYPE_IQ4_NL = 20,
    PKV_TYPE_IQ3_S = 21,
    PKV_TYPE_IQ2_S = 22,
    PKV_TYPE_IQ4_XS = 23,
    PKV_TYPE_I32 = 26,
    PKV_TYPE_IQ1_M = 29,
    PKV_TYPE_BF16 = 30,
    PKV_TYPE_TQ1_0 = 34, /* ternary weights (-1, 0, 1) times one scale per 256 */
    PKV_TYPE_TQ2_0 = 35,
    PKV_TYPE_MXFP4 = 39, /* OCP MX FP4 (gpt-oss expert weights): 32 E2M1 values, one E8M0 exponent */
    PKV_TYPE_COUNT = 40,
} pkv_type;

/* "f32", "q8_0", ... or NULL for an unknown value. */
const char *pkv_type_name(pkv_type t);
/* Parse a type name (case-insensitive). Returns PKV_ERR_NOT_FOUND for unknown names. */
pkv_status pkv_type_from_name(const char *name, pkv_type *out);
/* Elements per block and bytes per block (1 and 4 for f32; 32 and 34 for q8_0).
 * 0 for unknown types. */
size_t pkv_type_block_elems(pkv_type t);
size_t pkv_type_block_bytes(pkv_type t);
/* Bytes of a row of n elements; 0 if t is unknown or n is not a multiple of the block. */
size_t pkv_type_row_bytes(pkv_type t, size_t n);

/* ---------------------------------------------------------------- device */

/* A device: a backend instance with its own memory and in-order queue.
 * Device memory is opaque (invariant I1): it is reached only through the
 * transfer functions below, at any byte offset (I2). A device, and everything
 * using it, is driven by one thread at a time. */
typedef struct pkv_device pkv_device;
typedef struct pkv_buffer pkv_buffer;

typedef enum pkv_device_kind {
    PKV_DEVICE_CPU = 0,
    PKV_DEVICE_VULKAN = 1,
    PKV_DEVICE_CUDA = 2,
    PKV_DEVICE_TEST = 3, /* the faulty test device */
} pkv_device_kind;

typedef struct pkv_device_caps {
    char name[64];         /* "cpu", "cpu:1", "vulkan:0", "cuda:0", "faulty" */
    char description[128]; /* backend and driver, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)" */
    pkv_device_kind kind;
    uint64_t memory_bytes; /* usable device memory, bytes */
    size_t transfer_align; /* natural alignment of transfers in bytes; any offset is still
                              accepted, unaligned heads/tails just take a slower path */
    size_t max_buffer_bytes; /* largest single buffer, bytes */
    bool host_memory;      /* buffers live in this process's host memory */
    bool has_kernels;      /* the compute kernels are implemented */
    bool batch_invariant;  /* a token's results do not depend on the other rows of its batch or
                              on how a prompt is split into steps: bitwise the same alone or
                              batched (the serving engine's contract; tests/test-engine*.c) */
    char limits[160];      /* Vulkan: the limits in force, the driver's or a limits profile's
                              (PKV_VK_LIMITS=NAME, docs/gpu.md); "" for other devices */
} pkv_device_caps;

typedef struct pkv_device_params {
    int n_threads;          /* CPU worker threads; 0 = number of cores */
    uint64_t memory_limit;  /* cap on allocated bytes; 0 = no cap beyond the device's */
} pkv_device_params;

pkv_device_params pkv_device_default_params(void);

/* Names of the devices that can be opened here, in order: "cpu", then
 * "cpu:1".."cpu:<n_extra_cpu>", then "vulkan:N", then "cuda:N", then "faulty" when the
 * environment has PKV_FAULTY_DEVICE=1. Writes at most max names of up to 63
 * chars into names[i]; *n gets the total. why, when not NULL, receives a line
 * explaining missing backends (e.g. "vulkan: no loader found"). */
pkv_status pkv_device_enumerate(int n_extra_cpu, char (*names)[64], int max, int *n,
                                char *why, size_t why_size);

/* Open a device by name (see pkv_device_enumerate). Each call makes a new
 * instance with its own memory and queue. NULL on failure. */
pkv_device *pkv_device_open(const char *name, pkv_device_params params);
/* Waits for queued work, then frees the device. Buffers must be freed first. */
void pkv_device_close(pkv_device *dev);

const pkv_device_caps *pkv_device_get_caps(const pkv_device *dev);
const char *pkv_device_name(const pkv_device *dev);
/* Bytes currently allocated in buffers of this device. */
uint64_t pkv_device_allocated(const pkv_device *dev);
/* How a device runs matrix products with weights of type t: PKV_WEIGHT_FAST, a
 * kernel written for the type; PKV_WEIGHT_SLOW, a generic fallback that works
 * but is several times slower (on the CPU: blocks decoded in plain C before the
 * dot products; on Vulkan: a shader that dequantizes to f32 and then multiplies);
 * PKV_WEIGHT_NONE, not supported (a model with such tensors does not load on the
 * device). On the CPU the answer is for the instruction-set path the next call
 * takes (PKV_CPU_PATH may change it). */
typedef enum pkv_weight_speed { PKV_WEIGHT_NONE = 0, PKV_WEIGHT_SLOW = 1, PKV_WEIGHT_FAST = 2 } pkv_weight_speed;
pkv_weight_speed pkv_device_weight_speed(const pkv_device *dev, pkv_type t);
/* The weight layout the device's matmuls with weights of type t used so far, as
 * text in buf: "plain" (the file's), or on the CPU's avx2/avx512 paths for q4_k
 * "repacked8: N weights (B bytes)" (docs/kernels.md), followed by the weights
 * that kept the plain layout and why. */
void pkv_device_weight_layout(const pkv_device *dev, pkv_type t, char *buf, size_t size);
/* Can kernels running on `compute` read and write buffers of `storage`?
 * True only for the same device in this version. */
bool pkv_device_can_access(const pkv_device *compute, const pkv_device *storage);

/* Device memory as the backend holds it (docs/gpu.md): a GPU driver limits how
 * many allocations a process may make (4096 on many), so the Vulkan backend
 * places buffers inside a few large ones. */
typedef struct pkv_device_memory_stats {
    int64_t buffers, peak_buffers;         /* live buffers now, and the most at once */
    int64_t allocations, peak_allocations; /* driver allocations now (Vulkan: VkDeviceMemory objects,
                                              staging included), and the most at once; -1 when the
                                              backend does not count them (buffers are host memory) */
    uint64_t allocation_bytes;             /* bytes of those allocations now */
    uint64_t allocation_limit;             /* the most the device allows (Vulkan:
                                              maxMemoryAllocationCount, or its limits profile's);
                                              0 = no limit known */
} pkv_device_memory_stats;
pkv_status pkv_device_memory_stats_get(const pkv_device *dev, pkv_device_memory_stats *out);

/* Vulkan validation (docs/gpu.md): with PKV_VK_VALIDATE=1 in the environment
 * before the first device call, and the Khronos validation layer installed
 * (Debian: vulkan-validationlayers), every Vulkan device of the process runs
 * under VK_LAYER_KHRONOS_validation with synchronization validation and the
 * best-practices checks. Returns the number of errors and warnings the layer
 * has reported so far in this process (each is also logged at PKV_LOG_WARN),
 * or -1 when the layer is not active (or no Vulkan device was looked for in
 * this process: the call itself starts nothing). msg, when not NULL, receives
 * the first message, or why the layer is not active. The tests and `pagekv check` fail
 * on any message. */
int64_t pkv_vulkan_validation_messages(char *msg, size_t msg_size);

/* Allocate size bytes (> 0) of device memory; contents are undefined. */
pkv_buffer *pkv_buffer_alloc(pkv_device *dev, size_t size);
void pkv_buffer_free(pkv_buffer *buf);
size_t pkv_buffer_size(const pkv_buffer *buf);
pkv_device *pkv_buffer_device(const pkv_buffer *buf);

/* Transfers. All are queued in order with the device's compute work (I3).
 * write copies from src before returning (src may be reused at once).
 * read waits for all earlier work on the device and returns the bytes.
 * A zero length is valid and does nothing. Bounds are checked: an out-of-range
 * region returns PKV_ERR_INVALID naming the buffer size, offset and length. */
pkv_status pkv_buffer_write(pkv_buffer *dst, size_t off, const void *src, size_t n);
pkv_status pkv_buffer_read(pkv_buffer *src, size_t off, void *dst, size_t n);
pkv_status pkv_buffer_fill(pkv_buffer *dst, size_t off, size_t n, uint8_t value);
/* Copy n bytes. src and dst may be the same buffer but the ranges must not overlap.
 * Buffers on different devices are copied through host staging. */
pkv_status pkv_buffer_copy(pkv_buffer *src, size_t src_off, pkv_buffer *dst, size_t dst_off,
                           size_t n);

typedef struct pkv_region {
    size_t src_off;
    size_t dst_off;
    size_t size;
} pkv_region;

/* Copy many regions from src to dst in one operation (one command buffer on GPU).
 * No destination region may overlap another destination region, and when src == dst
 * no destination may overlap any source region. */
pkv_status pkv_buffer_copy_regions(pkv_buffer *src, pkv_buffer *dst, const pkv_region *regions,
                                   size_t n_regions);

/* Submit queued work without waiting. */
pkv_status pkv_device_flush(pkv_device *dev);
/* Wait until all queued work on the device has finished. */
pkv_status pkv_device_sync(pkv_device *dev);

/* Conformance suite (invariant I2). Each test reports one row through `report`.
 * The functions return PKV_OK when every test passed, PKV_ERR_DEVICE when one
 * failed (the row's detail names the primitive, offset and size of the first
 * mismatch), or another error when the suite itself could not run. */
typedef struct pkv_check_result {
    const char *device; /* "cpu", or "cpu -> cpu:1" for cross-device tests */
    const char *test;   /* "write", "read", "fill", "copy", "copy_regions", "kernel matmul q8_0"... */
    bool passed;
    bool skipped;       /* not applicable on this device; detail says why */
    long count;         /* operations checked */
    double seconds;
    char detail[256];   /* first mismatch, or tolerance and worst error for kernels */
} pkv_check_result;

typedef void (*pkv_check_report_fn)(const pkv_check_result *r, void *user);

typedef struct pkv_check_params {
    uint64_t seed;   /* 0 = a fixed default seed */
    int iterations;  /* random operations per transfer test; 0 = 2000 */
} pkv_check_params;

pkv_check_params pkv_check_default_params(void);
/* Random writes, reads, fills, copies and batched copies at random offsets and
 * sizes (zero, one byte, unaligned, last byte, whole buffer), verified against a
 * host shadow copy. */
pkv_status pkv_check_transfers(pkv_device *dev, pkv_check_params p, pkv_check_report_fn report, void *user);
/* Copies from a to b and back through the device layer's staging. */
pkv_status pkv_check_cross(pkv_device *a, pkv_device *b, pkv_check_params p, pkv_check_report_fn report,
                           void *user);
/* Every kernel on dev against the plain-C reference on random inputs, within
 * stated normalized-mean-squared-error tolerances. */
pkv_status pkv_check_kernels(pkv_device *dev, pkv_check_params p, pkv_check_report_fn report, void *user);

/* ------------------------------------------------------------- kv cache */
/* (section owned by the KV layer: src/kv/)
 *
 * A paged KV cache. Every layer's K and V live in pages of page_size tokens; a
 * page id means the same token slots in every layer and every shard, so one block
 * table serves all of them. Within a page the layout is tokens-then-heads (NHD):
 *     K of (layer l, shard s): dtype_k [n_pages][page_size][n_heads_s][head_dim_k]
 *     V of (layer l, shard s): dtype_v [n_pages][page_size][n_heads_s][head_dim_v]
 * With a quantized dtype (q8_0, q4_0) a head's row is head_dim / 32 GGUF blocks
 * (blocks of 32 along the head dimension), so a token row of n heads is
 * n * pkv_type_row_bytes(dtype, head_dim) bytes.
 * A token's "row" is page * page_size + slot: the row index a pkv_k_set_rows /
 * attention kernel uses in the (layer, shard) K or V array.
 *
 * Sequences are small integer ids (>= 0) handed out by the cache. A sequence owns a
 * block table (page ids), its tokens (id per token; -1 = unknown) and positions.
 * Full pages are immutable while shared; a sequence writing into a page that is
 * shared (forked) or published to the prefix index first copies it (copy-on-write).
 *
 * Write contract: the cache hands out rows; the caller (the forward pass) writes
 * K/V into them. When the caller next calls any cache function on a sequence
 * (other than pkv_kv_block_table and the getters), the K/V of every token the call
 * keeps must have been written; full pages are published to the prefix index at
 * that point. A failed forward step is rolled back with pkv_kv_truncate.
 *
 * All device work (copy-on-write, swap, shift, clear) is queued on the storage
 * devices in order with compute (I3) and checked; no function is fire-and-forget.
 * Not thread-safe: one thread uses a cache at a time. */

typedef struct pkv_kv_cache pkv_kv_cache;
typedef struct pkv_kv_layout pkv_kv_layout; /* geometry and placement, owned by a cache */

#define PKV_KV_MAX_PAGE_SIZE 256
#define PKV_KV_STATE_MAX_PARTS 64 /* pkv_kv_layer_desc.state_n_parts */

/* One shard of a layer: KV heads [head_begin, head_begin + n_heads) stored on
 * `storage`, attended on `compute` (which must be able to access storage). */
typedef struct pkv_kv_shard_desc {
    pkv_device *storage;
    pkv_device *compute; /* NULL = storage */
    int head_begin;
    int n_heads; /* > 0 */
} pkv_kv_shard_desc;

/* Geometry of one layer (I4): K and V head sizes may differ. */
typedef struct pkv_kv_layer_desc {
    int n_kv_heads;  /* > 0 */
    int head_dim_k;  /* elements, > 0 */
    int head_dim_v;  /* elements, > 0 */
    pkv_type dtype_k; /* K pages: PKV_TYPE_F32, F16, Q8_0 or Q4_0 (quantized: head_dim_k % 32 == 0) */
    pkv_type dtype_v; /* V pages: the same choices (quantized: head_dim_v % 32 == 0) */
    int n_shards;    /* 0 = one shard of all heads on pkv_kv_params.device */
    const pkv_kv_shard_desc *shards; /* [n_shards], covering every head; shards overlap only as
                                        replicas (the same head range, e.g. on devices sharing
                                        a KV head), each kept in the order given */
    /* Sliding-window layer: 0 = full attention (keeps every token). > 0: the layer
     * attends to the last `window` tokens only, so its K/V live in a second page
     * pool (the window pool, pkv_kv_params.window_pages) where a sequence's pages
     * go back to the pool once they have left the window (plus one page kept for
     * rollback). Every KV operation covers both pools; see docs/kv-cache.md. */
    int window;
    /* RoPE of this layer's K, for pkv_kv_shift's re-rotation (gemma3's sliding and
     * global layers differ); 0 = pkv_kv_params.rope_freq_base / rope_freq_scale. */
    float rope_freq_base, rope_freq_scale;
    /* Recurrent layer (Qwen3.5's gated delta-net): > 0 makes the layer keep, per
     * sequence, a fixed-size f32 state of n_kv_heads * state_per_head floats (its
     * "heads" shard as attention heads do) instead of K/V pages; head_dim_k,
     * head_dim_v, dtypes and window are then ignored (0 is fine). The state lives in
     * slots on each shard's storage device (pkv_kv_params.state_slots): a sequence
     * holds one for its live state, and checkpoints hold others, so truncating
     * restores the last checkpoint at or before the new end and the rest is
     * recomputed (pkv_kv_seq_state_len). See docs/kv-cache.md. */
    int state_per_head;
    /* A state made of parts (0 = one part of state_per_head floats): a head's state
     * is the concatenation of its state_n_parts parts, state_part[i] floats each
     * (each > 0, summing to state_per_head), while a shard's slot holds part 0 of
     * each of its heads in order, then part 1 of each, and so on: a kernel's
     * part-major layout (a conv window of all the shard's channels, then its delta
     * matrices) sharded by heads. Saved files, and any conversion between shardings,
     * use the per-head order. The parts are part of the layout fingerprint. */
    int state_n_parts;
    int state_part[PKV_KV_STATE_MAX_PARTS];
    /* RoPE of this layer's K beyond its base and scale (Gemma 4: sliding and full
     * layers rotate different widths, the full layers only part of theirs):
     * rope_n_rot 0 = pkv_kv_params.rope_n_rot; rope_n_pairs > 0: only the first
     * rope_n_pairs of the rope_n_rot / 2 pairs turn, at the angles they have when all
     * turn ("proportional" RoPE; not with YaRN); 0 = all. */
    int rope_n_rot, rope_n_pairs;
    /* The layer's K is not rotated at all (NoPE layers: SmolLM3's every fourth): a
     * shift moves it without turning it. Part of the layout's fingerprint. */
    bool rope_none;
    /* Latent attention (MLA: DeepSeek-V2/V3, Kimi K2): V is not stored but read as the
     * first head_dim_v values of each K row (the attention kernel's v_in_k), so the
     * layer has no V pages: nothing of V is allocated, copied, swapped, saved or
     * cached. Needs n_kv_heads 1 (the one latent "head"; under tensor parallelism
     * every shard is a replica of it) and head_dim_v <= head_dim_k; dtype_v is
     * ignored (V is K's type). Part of the layout's fingerprint. */
    bool v_in_k;
    /* Where K's rotated dims start in a head's row (MLA: K = [latent, rotary part],
     * rope_off = the latent width): a shift re-rotates only dims [rope_off, rope_off +
     * n_rot) and moves the rest unchanged. > 0 needs n_kv_heads 1 and, with quantized
     * K, a multiple of the block (32). 0 = the row's start. Part of the fingerprint. */
    int rope_off;
    /* Chunked-attention layer (Llama 4): 0 = none. > 0: a query at position p sees
     * only [floor(p / chunk) * chunk, p]; the layer's K/V live in the window pool,
     * kept as a sliding window of `chunk` tokens would be (which covers every
     * query's chunk), so pages of earlier chunks go back to the pool and a rollback
     * of up to a page needs no recompute. Not together with a window. Part of the
     * layout's fingerprint. */
    int chunk;
} pkv_kv_layer_desc;

typedef struct pkv_kv_params {
    int n_layers;                     /* > 0 */
    const pkv_kv_layer_desc *layers;  /* [n_layers]; copied by pkv_kv_cache_create */
    pkv_device *device;               /* storage and compute of layers with n_shards == 0 */
    int page_size;                    /* tokens per page, 1..256; 0 = 16 */
    int64_t n_pages;                  /* device pages; 0 = as many as budget_bytes holds */
    uint64_t budget_bytes;            /* K+V bytes of all layers and shards, used when n_pages == 0 */
    int64_t host_pages;               /* pages of the host swap pool; 0 = from host_budget_bytes */
    uint64_t host_budget_bytes;       /* host swap pool bytes when host_pages == 0; 0 = no swap pool.
                                         When every storage device's memory is host memory (CPU), the
                                         pool is a buffer on that device (swaps are batched region
                                         copies); otherwise plain host memory. */
    /* RoPE of the model, used to re-rotate cached K on pkv_kv_shift. */
    int rope_n_rot;                   /* rotated dims per head (even, <= head_dim_k); 0 = head_dim_k */
    bool rope_neox;                   /* false: pairs (2i, 2i+1) (llama); true: (i, i + n_rot/2) (qwen) */
    float rope_freq_base;             /* 0 = 10000 */
    float rope_freq_scale;            /* 0 = 1 */
    /* Pages of the window pool (layers with window > 0); 0 = n_pages. A sequence
     * holds at most ceil((window + page_size + step) / page_size) + 1 of them, where
     * step is the tokens appended in one call, so a few per sequence suffice. */
    int64_t window_pages;
    /* YaRN RoPE scaling of the model (gpt-oss), for the shift's re-rotation: it turns
     * cached K with the forward pass's per-pair angles (YaRN's mix of scaled and
     * unscaled angles, its correction range from each layer's base and rope_n_rot)
     * and no magnitude factor, which K got once when it was written. 0 = no YaRN. */
    float rope_yarn_ext_factor;       /* YaRN's mix (1 as llama.cpp runs it); 0 = none */
    int rope_yarn_n_ctx_orig;         /* the original context length; > 0 with YaRN */
    float rope_yarn_beta_fast;        /* 0 = 32 */
    float rope_yarn_beta_slow;        /* 0 = 1 */
    /* LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): the per-pair frequency factors
     * cached K was rotated with (pair i's angle divided by rope_factors[i]),
     * f32 [rope_n_rot / 2], each finite and > 0; copied, part of the layout's
     * fingerprint; the shift turns K with them. NULL = none. */
    const float *rope_factors;
    /* Recurrent layers (pkv_kv_layer_desc.state_per_head > 0; ignored without):
     * state slots on every storage device; a resident sequence holds one, each kept
     * checkpoint one (checkpoints are dropped, oldest first, when a sequence needs a
     * slot). Creating, forking, loading or swapping in a sequence when every slot
     * holds a live state is PKV_ERR_NOMEM. Not part of budget_bytes.
     * 0 = 4 * (state_ckpt_max + 1) */
    int64_t state_slots;
    /* A checkpoint of the live state at the end of every step of more than one token
     * (a prompt), and otherwise once state_ckpt_interval tokens have passed since the
     * last one; 0 = 64. */
    int state_ckpt_interval;
    /* Checkpoints kept per sequence (the oldest is dropped); 0 = 4. */
    int state_ckpt_max;
    /* Disk tier (docs/kv-cache.md): NULL = none. A directory (created when missing)
     * where full prefix pages are kept, one file per page named by its prefix chain
     * hash: a page is written when it becomes cached (no sequence holds it) or, at
     * the latest, when the LRU evicts it, and a prefix match that runs out of
     * cached pages goes on reading the next pages from disk, each verified (layout
     * and producer fingerprints, checksum, tokens, positions, chain hashes) before
     * it is used. Creating the cache fails with a message naming the directory when
     * it cannot be read or written, holds other files without pagekv's marker, or
     * another process holds its lock (one cache per directory at a time). Not for
     * caches with chunked-attention layers (Llama 4): PKV_ERR_UNSUPPORTED naming
     * the layer. Sliding-window layers' rows travel with the last pages of a
     * prefix (kv-page-image.c), so a sliding model hits too. Not part of budget_bytes. */
    const char *disk_dir;
    uint64_t disk_bytes; /* the directory's page files at most; the least recently used go first; 0 = 1 GiB */
    /* Remote tier (docs/distributed.md, "The Redis KV tier"): NULL = none. A Redis
     * server shared by many caches (replicas), "redis://[user:password@]HOST[:PORT][/DB]".
     * Full prefix pages are published there (asynchronously, the disk tier's page
     * image under "pagekv:v1:<layout fingerprint>:<prefix key>") and a prefix match
     * that runs out of pages in memory and on disk looks the next ones up there
     * (pipelined), each verified before it is used. A URL that does not parse, a
     * refused AUTH or SELECT, or a peer that is not Redis fail the creation with a
     * message naming the URL (password masked); an unreachable server is a warning
     * (the cache goes on without the tier and connects when it comes). A build
     * without hiredis refuses any URL (PKV_ERR_UNSUPPORTED naming libhiredis-dev);
     * so do caches with sliding-window or chunked layers (naming the layer). */
    const char *remote_url;
    int remote_queue_pages; /* page images waiting for the writer at most (more are skipped, counted); 0 = 256 */
    int remote_timeout_ms;  /* connect and command timeout; after an error the tier rests 1 s (doubling to 8 s); 0 = 500 */
    /* NULL, or [n_layers]: true where another process holds the layer (a model over MPI
     * ranks, docs/distributed.md): no K/V storage for it here, its attention never runs
     * on this cache, and a saved file holds nothing of it. Ignored on recurrent layers
     * (their state slots stay). Part of the layout's fingerprint. Not with disk_dir or remote_url. */
    const bool *on_other_rank;
} pkv_kv_params;

pkv_kv_params pkv_kv_default_params(void);

/* Create a cache: validates the layout (every error names the layer and what is
 * wrong: heads, head sizes, dtypes (a quantized dtype needs head sizes that are
 * multiples of 32), shards not covering every head or overlapping other than as
 * replicas of the same head range, a
 * compute device that cannot access its storage device), then allocates the pages
 * on each shard's storage device. NULL on failure (PKV_ERR_INVALID for a bad
 * layout, PKV_ERR_NOMEM when memory runs out); nothing is left allocated. */
pkv_kv_cache *pkv_kv_cache_create(pkv_kv_params p);
/* Frees every sequence, the pages and the host pool. NULL is a no-op. */
void pkv_kv_cache_free(pkv_kv_cache *c);

/* Geometry getters. Never fail for a valid cache; out-of-range layers give 0/NULL. */
const pkv_kv_layout *pkv_kv_cache_layout(const pkv_kv_cache *c);
int pkv_kv_layout_n_layers(const pkv_kv_layout *l);
int pkv_kv_layout_page_size(const pkv_kv_layout *l);
/* A hash of the geometry (layers, heads, head sizes, dtypes, page size); sharding
 * and devices are not part of it. Equal fingerprints = files are interchangeable. */
uint64_t pkv_kv_layout_fingerprint(const pkv_kv_layout *l);
/* The frequency factors K is rotated with (pkv_kv_params.rope_factors), f32
 * [*n]; NULL (and *n = 0) when none. n may be NULL. */
const float *pkv_kv_layout_rope_factors(const pkv_kv_layout *l, int *n);

typedef struct pkv_kv_layer_info {
    int n_kv_heads, head_dim_k, head_dim_v;
    pkv_type dtype_k, dtype_v;
    int n_shards;
    size_t k_page_bytes, v_page_bytes; /* one page of this layer, all shards together */
    int window;                        /* tokens the layer keeps (the window pool); 0 = all. A
                                          chunked layer's is its chunk */
    int chunk;                         /* tokens; 0 = not chunked (pkv_kv_layer_desc.chunk) */
    int state_per_head;                /* > 0: a recurrent layer (no K/V pages); see pkv_kv_layer_desc */
    int state_n_parts;                 /* its parts (0 = one), as pkv_kv_layer_desc */
    int state_part[PKV_KV_STATE_MAX_PARTS];
    bool v_in_k;                       /* V read from K (no V pages: v_page_bytes 0), as pkv_kv_layer_desc */
    int rope_off;                      /* K's rotated dims start here (pkv_kv_layer_desc) */
} pkv_kv_layer_info;
/* PKV_ERR_INVALID when il is out of range. */
pkv_status pkv_kv_layout_layer(const pkv_kv_layout *l, int il, pkv_kv_layer_info *out);

/* Where one (layer, shard) lives, for kernels: K at (k, k_off), V at (v, v_off),
 * each page-major as described at the top of this section; row r of the K array at
 * k_off + r * k_row_bytes. The buffers belong to the cache; do not free them. */
typedef struct pkv_kv_shard_info {
    pkv_device *storage, *compute;
    int head_begin, n_heads;
    pkv_buffer *k, *v;               /* v NULL (v_off, v_row_bytes, v_page_bytes 0) where V is read from K */
    size_t k_off, v_off;             /* bytes: page 0 of this layer and shard */
    size_t k_row_bytes, v_row_bytes; /* one token: n_heads * pkv_type_row_bytes(dtype, head_dim) */
    size_t k_page_bytes, v_page_bytes;
    int64_t n_pages;                 /* rows = n_pages * page_size */
    /* Recurrent layer: slot i's state, f32 [n_heads][state_per_head] (with parts:
     * [part][n_heads][that part's floats], see pkv_kv_layer_desc), is at
     * state_off + i * state_slot_bytes of `state` (on `storage`); NULL otherwise. */
    pkv_buffer *state;
    size_t state_off, state_slot_bytes;
    int64_t n_state_slots;
} pkv_kv_shard_info;
/* PKV_ERR_INVALID when il or ish is out of range. */
pkv_status pkv_kv_shard(const pkv_kv_cache *c, int il, int ish, pkv_kv_shard_info *out);

typedef struct pkv_kv_stats {
    int64_t n_pages;       /* device pages in the pool */
    int64_t pages_free;    /* on the free list */
    int64_t pages_cached;  /* unreferenced but kept for prefix reuse (LRU, evictable) */
    int64_t pages_used;    /* referenced by sequences */
    int64_t host_pages, host_free;
    int n_seqs;            /* live sequences */
    uint64_t cow_pages;    /* pages copied by copy-on-write since creation */
    uint64_t cow_bytes;    /* bytes copied by copy-on-write (all layers, shards, K and V) */
    uint64_t prefix_hit_pages; /* pages shared by pkv_kv_prefix_match since creation */
    uint64_t evicted_pages;    /* cached pages evicted for reuse */
    /* The window pool (layers with window > 0; all 0 without such layers): */
    int64_t window_pages, window_free, window_cached, window_used;
    uint64_t window_released; /* pages a sequence let go because they left the window */
    uint64_t window_replays;  /* sequences whose window layers had to be recomputed
                                 (pkv_kv_seq_window_len) after a truncate or shift into
                                 released pages */
    size_t page_bytes, window_page_bytes; /* one page of the full layers / of the window layers */
    /* Recurrent state (all 0 without recurrent layers): */
    int64_t state_slots, state_free; /* slots, and those holding neither a live state nor a checkpoint */
    int64_t state_checkpoints;       /* checkpoints held (a checkpoint shared by forks counts once) */
    size_t state_slot_bytes;         /* one slot: every recurrent layer and shard */
    uint64_t state_copies;           /* slot copies (fork, checkpoint, restore, prefix hit) since creation */
    uint64_t state_restores;         /* truncates/shifts that put a checkpoint back (a replay follows) */
    uint64_t state_prefix_hits;      /* prefix matches that took a stored state */
    uint64_t state_ckpt_skipped;     /* checkpoints pkv_kv_state_step_done skipped for lack of a slot */
    /* Disk tier (all 0 without pkv_kv_params.disk_dir): */
    bool disk_enabled;           /* false once a write failed (ENOSPC, I/O error): serving goes on from memory */
    uint64_t disk_hit_pages;     /* pages a prefix match loaded from disk */
    uint64_t disk_miss_pages;    /* prefix matches that looked for their next page on disk and found no file */
    uint64_t disk_rejected_files; /* page files that failed a check (size, magic, fingerprints, checksum, tokens) or are not regular files (a planted symlink: skipped, never followed): never used */
    uint64_t disk_written_pages; /* page files written */
    uint64_t disk_write_errors;  /* failed writes (the first one turns the tier off) */
    uint64_t disk_evicted_files; /* page files removed to stay under disk_bytes */
    uint64_t disk_bytes_read, disk_bytes_written; /* page files' bytes */
    double disk_read_seconds, disk_write_seconds; /* time in file reads / writes (with fsync and rename) */
    int64_t disk_files;          /* page files in the directory now (every layout and model) */
    uint64_t disk_bytes_used;    /* their bytes */
    uint64_t disk_bytes_max;     /* the cap */
    double disk_queue_seconds;   /* time the cache's own thread spent reading pages off the device
                                    into images for the writer thread (and waiting for room in its queue) */
    /* Remote tier (all 0 without pkv_kv_params.remote_url): */
    bool remote_configured;          /* a remote tier was given */
    bool remote_enabled;             /* connected now (false in an outage: the cache goes on without it) */
    uint64_t remote_hit_pages;       /* pages a prefix match loaded from Redis */
    uint64_t remote_miss_pages;      /* lookups whose next page was not there (never written, or evicted) */
    uint64_t remote_rejected_values; /* values that failed a check (size, magic, fingerprints, checksum, tokens): deleted, never used */
    uint64_t remote_written_pages;   /* pages published */
    uint64_t remote_dropped_pages;   /* pages not published: the queue was full, or Redis was down when their turn came */
    uint64_t remote_errors;          /* failed connects and commands (each starts a back-off) */
    uint64_t remote_lookups;         /* pipelined round trips of prefix matches */
    uint64_t remote_bytes_read, remote_bytes_written;
    double remote_read_seconds;      /* time in those round trips (latency: / remote_lookups) */
    double remote_write_seconds;     /* the writer's time in SETs */
} pkv_kv_stats;
void pkv_kv_stats_get(const pkv_kv_cache *c, pkv_kv_stats *out);

/* Page flags of a snapshot (pkv_kv_snapshot.page_flags). */
#define PKV_KV_PAGE_FREE   1u /* on the free list */
#define PKV_KV_PAGE_INDEX  2u /* in the prefix index (published full page) */
#define PKV_KV_PAGE_CACHED 4u /* in the index and held by no sequence: kept for reuse, evictable */

/* One sequence of a snapshot. Its pages are pkv_kv_snapshot.pages[first .. first + n):
 * page i holds tokens [i * page_size, min((i + 1) * page_size, n_tokens)). Resident:
 * device page ids (-1 for a window-pool page released behind the window); swapped:
 * host pool page ids. */
typedef struct pkv_kv_snapshot_seq {
    int32_t id;
    int64_t n_tokens;
    bool swapped;
    int64_t first, n;
} pkv_kv_snapshot_seq;

/* A read-only picture of one page pool of a cache, for tools and live views
 * (pagekv serve's GET /v1/kv). One allocation; free with pkv_kv_snapshot_free. */
typedef struct pkv_kv_snapshot {
    int page_size;
    int64_t n_pages;       /* device pages of the pool */
    int32_t *page_refs;    /* [n_pages] block tables of live sequences holding the page: a page
                              shared by a fork and its parent counts 2 (internally a fork's
                              shared full pages are held once, by the shared node) */
    uint8_t *page_flags;   /* [n_pages] PKV_KV_PAGE_* bits; 0 = held, not in the prefix index */
    int64_t host_pages;    /* host swap pool pages */
    uint8_t *host_used;    /* [host_pages] 1 = holds a swapped sequence's page */
    int n_seqs;
    pkv_kv_snapshot_seq *seqs; /* [n_seqs] live sequences, ascending id */
    int32_t *pages;        /* every sequence's pages, see pkv_kv_snapshot_seq */
    int64_t n_listed;      /* entries of pages */
    pkv_kv_stats stats;    /* pkv_kv_stats_get of the whole cache at the same moment */
} pkv_kv_snapshot;

/* Take a snapshot of pool `pool` of c: 0 = the main pool (full-attention layers, and
 * every layer of a cache without windows), 1 = the window pool of a cache whose
 * layers have sliding windows (PKV_ERR_INVALID without one). Reads only; not
 * thread-safe against operations on c (take it on the thread that uses the cache).
 * Cost: O(n_pages + host_pages + the pages of every block table). NULL on failure
 * (PKV_ERR_NOMEM, PKV_ERR_INVALID) with pkv_errmsg() saying why. */
pkv_kv_snapshot *pkv_kv_snapshot_take(const pkv_kv_cache *c, int pool);
/* NULL is a no-op. */
void pkv_kv_snapshot_free(pkv_kv_snapshot *s);

/* New empty sequence. `fingerprint` identifies what produced its KV (model,
 * adapter...): prefix reuse only matches pages with an equal fingerprint; 0 turns
 * publishing to the prefix index off for this sequence. On error nothing changes. */
pkv_status pkv_kv_seq_create(pkv_kv_cache *c, uint64_t fingerprint, int32_t *seq);
/* Release a sequence (resident or swapped). Its published full pages stay cached
 * for prefix reuse. PKV_ERR_NOT_FOUND for an unknown id; nothing changes then. */
pkv_status pkv_kv_seq_free(pkv_kv_cache *c, int32_t seq);
/* Number of tokens, or -1 for an unknown id. */
int64_t pkv_kv_seq_len(const pkv_kv_cache *c, int32_t seq);
/* True when the sequence is swapped out to the host pool. */
bool pkv_kv_seq_swapped(const pkv_kv_cache *c, int32_t seq);
/* Pages a sequence holds (device pages when resident, host pages when swapped) and
 * how many of them another holder also references (another sequence, directly or
 * through a fork's shared prefix): what freeing or swapping this sequence alone
 * would not release. Cost: O(fork nodes in its chain + pages outside shared nodes),
 * never a scan of other sequences. PKV_ERR_NOT_FOUND for an unknown id. */
pkv_status pkv_kv_seq_page_stats(const pkv_kv_cache *c, int32_t seq, int64_t *pages, int64_t *shared);
/* Distinct pages held by a set of sequences together: device pages of the resident
 * ones (a page shared by several counts once) and host pages of the swapped ones.
 * Cost: O(distinct pages + fork nodes); uses a bitmap of the pool (n_pages / 8
 * bytes). Unknown ids are skipped. PKV_ERR_NOMEM when the bitmap cannot be had. */
pkv_status pkv_kv_pages_held(const pkv_kv_cache *c, int n_seqs, const int32_t *seqs, int64_t *device_pages,
                             int64_t *host_pages);
/* Copy tokens [start, start + n) into tokens[] and/or pos[] (either may be NULL).
 * Works for swapped sequences too. PKV_ERR_INVALID when out of range. */
pkv_status pkv_kv_seq_tokens(const pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n, int32_t *tokens,
                             int32_t *pos);

/* Append n tokens to each of n_seqs distinct resident sequences, atomically.
 * n_tokens[i] tokens go to seqs[i]; tokens, pos and rows are concatenated in that
 * order. tokens NULL = unknown (-1: such pages are never published); pos NULL =
 * continue from the last position + 1 (0 for an empty sequence). rows[k] receives
 * page * page_size + slot of token k, the row its K and V go to in every
 * (layer, shard) array. A shared or published partial last page is first copied
 * (copy-on-write: one batched region copy per storage buffer for the whole batch).
 * Errors: PKV_ERR_OUT_OF_PAGES when the pool (free + evictable cached pages)
 * cannot hold the batch; PKV_ERR_INVALID for unknown, swapped or repeated
 * sequences; PKV_ERR_NOMEM; PKV_ERR_DEVICE. On any error no sequence changes
 * (only a device error after the checks may have evicted cached pages). */
pkv_status pkv_kv_append_batch(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                               const int32_t *tokens, const int32_t *pos, int32_t *rows);
/* pkv_kv_append_batch that also returns, in rows_window[k] (NULL = not wanted),
 * the row of token k in the window pool's arrays (layers with window > 0). Before
 * appending, each sequence gives back the window pages that no query of this or a
 * later step can see (whole pages before len + 1 - window - page_size): a failed
 * append may have released those. */
pkv_status pkv_kv_append_batch_w(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                                 const int32_t *tokens, const int32_t *pos, int32_t *rows, int32_t *rows_window);
/* pkv_kv_append_batch for one sequence. */
pkv_status pkv_kv_append(pkv_kv_cache *c, int32_t seq, int32_t n, const int32_t *tokens, const int32_t *pos,
                         int32_t *rows);

/* CSR block table of several sequences, FlashInfer's paged layout: sequence i owns
 * pages[indptr[i] .. indptr[i+1]); its last page holds last_page_len[i] tokens
 * (1..page_size; 0 for an empty sequence). With positions, positions[tok_indptr[i]
 * .. tok_indptr[i+1]) are its per-token positions. The arrays belong to the cache
 * and stay valid until the next call that changes the cache or builds a table. */
typedef struct pkv_kv_block_table {
    int n_seqs;
    const int32_t *indptr;        /* [n_seqs + 1] */
    const int32_t *pages;         /* [indptr[n_seqs]] */
    const int32_t *last_page_len; /* [n_seqs] */
    const int32_t *seq_len;       /* [n_seqs] tokens */
    const int32_t *tok_indptr;    /* [n_seqs + 1], NULL without positions */
    const int32_t *positions;     /* [tok_indptr[n_seqs]], NULL without positions */
} pkv_kv_block_table;
/* PKV_ERR_INVALID for unknown or swapped sequences; PKV_ERR_NOMEM. */
pkv_status pkv_kv_block_table_get(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, bool with_positions,
                                  pkv_kv_block_table *out);
/* The block table of the window pool (layers with window > 0): page i covers
 * tokens [i * page_size, (i + 1) * page_size) as in the main table, but pages that
 * have left the window are -1 (released; attention with a window never reads
 * them). Without positions. PKV_ERR_INVALID when the cache has no window layers. */
pkv_status pkv_kv_block_table_window(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, pkv_kv_block_table *out);
/* Tokens of the sequence whose window-layer KV is present: equal to
 * pkv_kv_seq_len except after a truncate or a shift back into pages the window
 * had released, when the window layers must be recomputed from this token on
 * (pkv_model_forward does it before its next step: pkv_kv_window_replay). Equal to
 * pkv_kv_seq_len for caches without window layers; -1 for an unknown id. */
int64_t pkv_kv_seq_window_len(const pkv_kv_cache *c, int32_t seq);
/* Append to the window pool only the next n of the sequence's tokens that are
 * already in the main pool (pkv_kv_seq_window_len .. + n): rows_window[k] gets their
 * rows, for a forward pass that recomputes the window layers. */
pkv_status pkv_kv_window_replay(pkv_kv_cache *c, int32_t seq, int32_t n, int32_t *rows_window);
/* Forget the window layers' KV of a sequence (pkv_kv_seq_window_len becomes 0, so
 * they are recomputed): what a failed replay step leaves. Nothing it held is
 * published to the prefix index (the replay's K/V was never written). No-op without
 * window layers; PKV_ERR_NOT_FOUND for an unknown id. */
pkv_status pkv_kv_window_reset(pkv_kv_cache *c, int32_t seq);

/* Recurrent state (layers with state_per_head > 0). A new sequence's state is
 * zero. pkv_kv_append_batch moves a sequence's state length along with its length
 * (the forward pass writes the state in that step); it refuses a sequence whose
 * state is behind (replay first). fork copies the live state and shares the
 * checkpoints; truncate and shift put back the last checkpoint at or before the
 * first changed token (or zero at 0); swap and save/load carry the live state;
 * a prefix match stops at the deepest matched page boundary with a stored state
 * and takes that state. */
/* The live slot of each sequence: slots[i] indexes pkv_kv_shard_info's state.
 * A slot can change on swap in, clear and load; ask before each step.
 * PKV_ERR_INVALID for unknown or swapped sequences and for a cache without
 * recurrent layers. */
pkv_status pkv_kv_state_slots(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, int32_t *slots);
/* Tokens the live state has taken in: pkv_kv_seq_len except after a truncate or
 * shift put a checkpoint back or a failed step rolled back, when the state must be
 * recomputed from here (pkv_model_forward does it: pkv_kv_state_replay).
 * pkv_kv_seq_len for caches without recurrent layers; -1 for an unknown id. */
int64_t pkv_kv_seq_state_len(const pkv_kv_cache *c, int32_t seq);
/* The next n tokens of the sequence (already in the cache, from its state length
 * on) have been run through the recurrent layers: the state length moves by n.
 * PKV_ERR_INVALID past the sequence's length, for a swapped sequence, or without
 * recurrent layers. */
pkv_status pkv_kv_state_replay(pkv_kv_cache *c, int32_t seq, int32_t n);
/* Put the last checkpoint at or before the state length back into the live slot
 * (zero when none) and set the state length to its position: what a failed replay
 * step (which may have updated part of the state) leaves. The KV is untouched. */
pkv_status pkv_kv_state_reset(pkv_kv_cache *c, int32_t seq);
/* After a forward step over these sequences (n_tokens[i] appended or replayed for
 * seqs[i]) succeeded: take the checkpoints the policy asks for (pkv_kv_params.
 * state_ckpt_interval); a checkpoint at a page boundary of published pages is
 * offered to prefix matching (the step's full pages are published first: its K/V
 * are written). Never fails for lack of slots: checkpoints are skipped then
 * (pkv_kv_stats.state_ckpt_skipped). A no-op without recurrent layers. */
pkv_status pkv_kv_state_step_done(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens);

/* New sequence sharing every page of `parent` (O(1) in the context length: no page
 * is copied and the block table is shared structurally). Either may then append:
 * the first append into the shared partial last page copies that page. Forks of
 * forks work; sequences may be freed in any order. On error nothing changes. */
pkv_status pkv_kv_fork(pkv_kv_cache *c, int32_t parent, int32_t *child);

/* Keep the first n_keep tokens (rollback after speculation or a failed step).
 * Only full pages within the kept tokens are published to the prefix index (the
 * dropped tokens' K/V may never have been written), in every pool.
 * n_keep > length is PKV_ERR_INVALID. On error nothing changes. */
pkv_status pkv_kv_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep);

/* Context shift: remove tokens [start, start + n_remove), move the later tokens
 * down by n_remove, add pos_delta to their positions, and re-rotate their cached K
 * on the storage device by pos_delta (RoPE composes: rotating by the delta equals
 * rotating from scratch at the new position, up to rounding of the K dtype; a
 * quantized K is dequantized, rotated and quantized again on the device, one
 * more rounding per shift: see docs/kv-cache.md for the bound).
 * n_remove 0 re-positions tokens [start, len) without removing any. The moved
 * tokens are written into fresh pages (pages shared with other sequences are never
 * written), so it needs up to ceil(moved / page_size) + 1 free pages even though
 * the sequence shrinks. PKV_ERR_OUT_OF_PAGES, PKV_ERR_UNSUPPORTED (a storage
 * device without the rope kernel), PKV_ERR_INVALID; on error nothing changes. */
pkv_status pkv_kv_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta);

/* Drop every token of a sequence (it stays valid and empty; a swapped one becomes
 * resident and empty). Pages it was the last holder of are zero-filled on the
 * device, except published pages, which stay cached for prefix reuse. Its
 * recurrent state is zeroed and its checkpoints dropped (a swapped sequence needs
 * a state slot again: PKV_ERR_NOMEM, nothing changed, when none can be had). */
pkv_status pkv_kv_seq_clear(pkv_kv_cache *c, int32_t seq);
/* Empty every sequence (ids stay valid), the prefix index and the host pool, and
 * zero-fill all pages and state slots on every storage device; every checkpoint
 * goes. PKV_ERR_NOMEM (nothing changed) when the swapped sequences, becoming
 * resident, would need more state slots than there are. */
pkv_status pkv_kv_clear(pkv_kv_cache *c);

/* Swap a resident sequence out to the host pool: the content of all its pages is
 * copied to host pages in coalesced transfers (runs of adjacent pages become one
 * transfer per K/V array), then the sequence drops its device references.
 * Pages shared with other sequences (fork, prefix reuse) stay resident for their
 * other holders, unchanged: only the reference count drops; the swapped copy is
 * private. Published pages nobody else holds become cached (evictable).
 * PKV_ERR_OUT_OF_PAGES when the host pool is full; on error nothing changes. */
pkv_status pkv_kv_swap_out(pkv_kv_cache *c, int32_t seq);
/* Bring a swapped sequence back into freshly allocated device pages (possibly
 * other page ids than before; sharing with other sequences is not restored: each
 * page is private to this sequence afterwards). Contents are bit-identical.
 * PKV_ERR_OUT_OF_PAGES when the device pool cannot hold it; nothing changes then. */
pkv_status pkv_kv_swap_in(pkv_kv_cache *c, int32_t seq);

/* Prefix reuse: for an empty resident sequence, find the longest run of cached
 * full pages whose tokens and positions equal tokens[0..n) / pos[0..n) (pos NULL =
 * 0, 1, ...) and whose fingerprint equals the sequence's, and share them. Pages
 * are found by a chained hash; every candidate's tokens, positions, fingerprint and
 * predecessor page are compared, so a hash collision never returns wrong KV.
 * *n_matched gets the tokens now in the sequence (a multiple of page_size, <= n);
 * the caller computes the rest. Pass n - 1 tokens to keep one token to compute. */
pkv_status pkv_kv_prefix_match(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                               int64_t *n_matched);
/* Media rows (docs/multimodal.md, "Media in the cache"). A media chunk of n_rows rows occupies
 * n_rows tokens whose ids are pkv_media_token(key, row) (negative, <= -2), so the
 * prefix index, fork, swap and save/load key it by content; the sequence also
 * records the chunk itself. A chunk record: */
#define PKV_MEDIA_NON_CAUSAL 1u /* the chunk's rows attend to each other both ways */
typedef struct pkv_kv_media {
    uint64_t key;   /* pkv_media_key(pkv_media_hash(media), projector fingerprint) */
    int64_t start;  /* index of its first token in the sequence */
    int32_t n_rows; /* tokens it occupies */
    uint32_t flags; /* PKV_MEDIA_NON_CAUSAL */
} pkv_kv_media;
/* Chunks recorded in a sequence (in order of start; -1 when seq does not exist). */
int pkv_kv_media_count(const pkv_kv_cache *c, int32_t seq);
pkv_status pkv_kv_media_get(const pkv_kv_cache *c, int32_t seq, int i, pkv_kv_media *out);
/* Record a chunk whose rows are in the sequence already: tokens [start, start +
 * n_rows) must hold pkv_media_token(key, 0..n_rows-1) and start must be at or after
 * the end of the last recorded chunk. The forward pass's callers (context, engine)
 * do this; PKV_ERR_INVALID names what does not match. On error nothing changes.
 * The operations then keep the records: fork copies them; truncate into a chunk
 * drops the whole chunk (keeps only the tokens before it: pkv_kv_seq_len says how
 * many); a shift that would cut a chunk is refused (one that removes whole chunks
 * drops them, later chunks move down); swap keeps them; save/load carry them (the
 * file names each chunk's key and rows); clear drops them. */
pkv_status pkv_kv_media_add(pkv_kv_cache *c, int32_t seq, const pkv_kv_media *m);
/* pkv_kv_prefix_match for a prompt holding media chunks (tokens hold their media
 * ids; media[0..n_media) their records with start = index in tokens): the match
 * never ends inside a chunk (it is cut back to the chunk's start), and the chunks
 * it covers are recorded in seq. pkv_kv_prefix_match without media cuts a match at
 * the first media id it would cover. */
pkv_status pkv_kv_prefix_match_media(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                                     const pkv_kv_media *media, int n_media, int64_t *n_matched);
/* Disk tier: write every published page that no sequence holds (cached) and that
 * is not on disk yet, and wait until the tier's writer thread has written all it
 * was given (pages are written in the background: pkv_kv_seq_free queues its
 * pages, an eviction queues the page it takes; pkv_kv_cache_free flushes). A
 * failed write turns the tier off (pkv_kv_stats.disk_enabled, a warning in the
 * log) and is not an error of this call. PKV_OK, and a no-op without a disk tier. */
pkv_status pkv_kv_disk_flush(pkv_kv_cache *c);
/* Queue every cached page not yet published to the remote tier and wait until the
 * writer has sent them (or dropped them: Redis down). PKV_OK, and a no-op without
 * a remote tier. */
pkv_status pkv_kv_remote_flush(pkv_kv_cache *c);

/* Save a resident sequence to a file: header (format version, layout
 * fingerprint and geometry, tokens, positions), K/V payload per layer in
 * [token][head][dim] order (independent of sharding and devices), checksum.
 * PKV_ERR_IO when the file cannot be written (a partial file is removed). */
pkv_status pkv_kv_seq_save(pkv_kv_cache *c, int32_t seq, const char *path);
/* Load a saved sequence into a new sequence of this cache (any devices and
 * sharding of the same geometry). PKV_ERR_FORMAT names what differs: layer
 * count, a layer's heads, head sizes or K/V dtypes, the page size, a truncated file,
 * a bad checksum; PKV_ERR_IO, PKV_ERR_OUT_OF_PAGES. On error nothing changes.
 * `fingerprint` 0: the new sequence gets the saved one; else the saved one must
 * equal it (PKV_ERR_FORMAT naming both: KV of another model or other weights). */
pkv_status pkv_kv_seq_load(pkv_kv_cache *c, const char *path, uint64_t fingerprint, int32_t *seq);

/* Attach validation (I6): a second consumer (draft model, multi-token-prediction
 * head) maps its layer j onto cache layer layers[j].kv_layer. Checks the layer
 * exists, equal heads, head sizes, K and V dtypes and page size, and that the consumer's
 * compute device can access each shard's storage device. The error names the
 * consumer layer, the cache layer, both devices and the fix. Changes nothing. */
typedef struct pkv_kv_attach_layer {
    int kv_layer;                /* cache layer this consumer layer shares */
    int n_kv_heads, head_dim_k, head_dim_v;
    pkv_type dtype_k, dtype_v;
    pkv_device *compute;         /* where the consumer layer runs; NULL = each shard's compute device */
} pkv_kv_attach_layer;
pkv_status pkv_kv_attach(const pkv_kv_cache *c, const char *consumer, int page_size,
                         const pkv_kv_attach_layer *layers, int n_layers);

/* ---------------------------------------------------------------- model */
/* (section owned by the model layer: src/model/) */

typedef struct pkv_model pkv_model;

/* Called during loading with the fraction of weight bytes uploaded so far. */
typedef void (*pkv_progress_fn)(double fraction, void *user);

typedef struct pkv_model_params {
    const char *device;          /* device to load onto; NULL = "cpu" */
    pkv_device *device_handle;   /* an already opened device (overrides device); the
                                    model does not close it */
    const char *devices;         /* tensor parallelism: a comma list of devices ("cpu:1,cpu:2",
                                    "cpu,vulkan:0"); each layer's attention heads (whole KV-head
                                    groups) and FFN rows are split over them; overrides device */
    const char *split;           /* proportions for devices, e.g. "2,1,1"; NULL = equal */
    bool kv_on_host;             /* store every KV shard in host memory (device "cpu"), split by
                                    the same head ranges; attention runs on the host */
    int n_threads;               /* CPU threads when the model opens a CPU device; 0 = all cores */
    pkv_progress_fn progress;    /* may be NULL */
    void *progress_user;
    bool no_mmap;                /* CPU devices: copy the weights instead of using them in place
                                    from the mapped file (more memory; the copies may get huge
                                    pages: measured ~5% faster decode on this project's machine) */
    bool mtp;                    /* load the file's MTP ("nextn") head as a model of its own: its
                                    first MTP layer, fed the token's embedding and the target's
                                    hidden state (qwen35 files with nextn_predict_layers > 0), a
                                    draft for pkv_spec_create ('pagekv run --mtp') */
    const char *rank_split;      /* under several MPI ranks (pkv_dist_init): proportions of the layers
                                    each rank holds, e.g. "2,1"; NULL = equal */
} pkv_model_params;

pkv_model_params pkv_model_default_params(void);

/* Load a GGUF model (llama, qwen2, qwen3). Every count, offset and tensor shape
 * is checked against the file and the architecture before use; errors name the
 * key or tensor. NULL on failure (nothing stays allocated). */
pkv_model *pkv_model_load(const char *path, pkv_model_params p);
/* The same from a GGUF image in memory (copied to the device; may be freed after). */
pkv_model *pkv_model_load_memory(const void *data, size_t size, const char *label, pkv_model_params p);
void pkv_model_free(pkv_model *m);
/* The built-in tiny model (a `pkv_mkmodel_default_params()` llama model made in
 * memory): what `pagekv run` and `demo` use without -m. */
pkv_model *pkv_model_builtin(pkv_model_params p);

typedef struct pkv_model_info {
    const char *arch;        /* "llama", "qwen2", "qwen3", ... (pkv_arch_list) */
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train; /* layer 0's heads/ffn/head size */
    const char *weight_type; /* the most common matrix type, e.g. "q8_0" */
    uint64_t weight_types;   /* every matrix type the model's devices hold: bit t set for pkv_type t
                                (with pkv_device_weight_speed: which ones run on a slow path) */
    uint64_t weight_bytes;   /* bytes of weights on the devices */
    uint64_t decode_bytes_per_token; /* weight bytes one decode step reads: all but the
                                        embedding table, of which it reads one row, and of a
                                        mixture of experts only the experts used per token */
    bool has_vocab;          /* false for tokenizer.ggml.model = none */
    int n_devices;           /* devices the layers are split over */
    bool kv_on_host;
    bool shared_kv;          /* a draft whose layers attend over a target's cache layers
                                (GGUF key pagekv.shared_kv_layers): see pkv_context_attach */
    double load_seconds;
    uint64_t weight_bytes_mapped; /* of weight_bytes, used in place from the mapped GGUF file
                                     (CPU devices, pkv_model_load): not copied, so they take
                                     no memory beyond the file's page cache */
    int n_expert, n_expert_used; /* mixture of experts (0 for a dense model); such models run
                                    on one device (a tensor-parallel split is refused) */
    int n_recurrent;             /* recurrent layers (qwen35's gated delta-net): each sequence keeps a
                                    fixed-size state per such layer in the cache's state slots;
                                    such models run on one device for now */
    bool mtp;                    /* an MTP head (pkv_model_params.mtp): a draft fed the target's hidden states */
    int n_nextn;                 /* MTP layers the file has after its trunk (0: none) */
    int n_kv_layers;             /* layers with KV of their own: the layers of its cache. n_layer,
                                    or fewer where the last layers reuse an earlier layer's KV
                                    (gemma4's attention.shared_kv_layers) */
    bool assistant;              /* Gemma 4's assistant (arch gemma4-assistant): a draft with no KV of its
                                    own, fed its target's embedding and hidden states, whose layers attend
                                    over the target's cache (pkv_context_attach, pkv_context_draft_step) */
    int n_embd_out;              /* an assistant: the width of the target it drafts for (its
                                    embedding_length_out); 0 otherwise */
    int pooling;                 /* the file's ARCH.pooling_type (pkv_pooling), -1 when it has none */
    int n_cls_out;               /* rows of its classification head (cls.output.weight, rank
                                    pooling's scores); 0 = none */
    int rank, n_ranks;           /* this process's MPI rank of n_ranks (1: no ranks) */
    int layer_first, layer_end;  /* the layers [first, end) this rank holds the weights of and runs */
} pkv_model_info;

/* How an embedding request (pkv_request_params.embed) reduces the final normed
 * hidden states of its prompt's tokens: llama.cpp's pooling_type values. */
typedef enum pkv_pooling {
    PKV_POOLING_NONE = 0, /* every token's hidden state, n_prompt rows */
    PKV_POOLING_MEAN = 1, /* their mean */
    PKV_POOLING_CLS = 2,  /* the first token's */
    PKV_POOLING_LAST = 3, /* the last token's */
    PKV_POOLING_RANK = 4, /* the classification head (pkv_model_info.n_cls_out rows) over the last
                             token's hidden state, then a softmax over the rows: Qwen3-Reranker
                             (yes / no), as llama.cpp scores it; qwen3 only */
} pkv_pooling;

pkv_status pkv_model_get_info(const pkv_model *m, pkv_model_info *info);
pkv_device *pkv_model_device(const pkv_model *m);
/* The layers [*first, *end) rank `rank` holds (placement as data; docs/distributed.md). */
pkv_status pkv_model_rank_layers(const pkv_model *m, int rank, int *first, int *end);

/* ---------------------------------------------------------------- ranks */
/* A model over several processes (docs/distributed.md): under `mpirun -np N`
 * every rank runs the same program on the same inputs (rank 0 alone prints);
 * each loaded model is split into N contiguous layer ranges (pkv_model_params.
 * rank_split), each rank holding its range's weights; a forward step runs the
 * ranges in order, the activations going rank r -> r + 1, and the last rank's
 * logits going back to every rank, so every rank samples, allocates pages and
 * runs every KV operation alike. Each step's digest (batch and cache rows) is
 * compared on every rank: ranks that diverge fail the step naming the rank. */
/* Start the ranks when the process was launched as one of several (mpirun:
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE), else nothing (one rank). A build without MPI
 * launched as several: PKV_ERR_UNSUPPORTED naming libopenmpi-dev. Call once,
 * before loading models, from the thread that will make the calls. */
pkv_status pkv_dist_init(void);
int pkv_dist_rank(void); /* 0 without ranks */
int pkv_dist_size(void); /* 1 without ranks */
/* Rank 0's n bytes at p copied to p on every other rank (a random seed, a line
 * read from the terminal). A rank that does not answer within PKV_DIST_TIMEOUT
 * seconds (default 300) fails the call naming it. */
pkv_status pkv_dist_bcast(void *p, size_t n);
/* Every rank's n bytes at p, in rank order, into rank 0's out [size][n] (the
 * others' out is not touched and may be NULL). */
pkv_status pkv_dist_gather(const void *p, size_t n, void *out);
/* Bytes this rank has sent and received to and from the other ranks so far. */
void pkv_dist_bytes(uint64_t *sent, uint64_t *received);
/* End the ranks: MPI_Finalize, or, when failed != 0 or an exchange failed (a
 * rank may be waiting for a message that never comes), MPI_Abort of every rank
 * with exit status `failed` (1 if 0). No-op without ranks. */
void pkv_dist_finalize(int failed);

/* LoRA adapters (docs/lora.md): GGUF files as llama.cpp's convert_lora_to_gguf.py
 * writes them (general.type "adapter", adapter.type "lora", adapter.lora.alpha,
 * general.architecture the base's; tensor pairs "<base tensor>.lora_a" [in, r] and
 * ".lora_b" [r, out] in GGUF order, f32, f16, bf16 or q8_0, kept as f32). A matrix W
 * an adapter covers computes y = W x + s * B (A x) with s = scale * alpha / r
 * (alpha 0: s = scale). Covered: attn_q, attn_k, attn_v, attn_output, ffn_gate,
 * ffn_up, ffn_down of every layer and output (untied); not a MoE's experts nor
 * fused or split matrices (phi3's attn_qkv and ffn_up, qwen35's gated attn_q). A model
 * on one CPU or Vulkan device (not CUDA, not split); the model must outlive its adapters. */
typedef struct pkv_lora pkv_lora;
#define PKV_MAX_LORA 8 /* adapters one sequence applies at once */
typedef struct pkv_lora_use {
    const pkv_lora *lora;
    float scale; /* the user scale; 0: the adapter is skipped (bitwise the base) */
} pkv_lora_use;
typedef struct pkv_lora_info {
    int n_pairs;          /* its pairs: the matrices of the file it covers (a fused one counts once) */
    int rank;             /* the largest r of its pairs */
    float alpha;          /* adapter.lora.alpha (0: none) */
    uint64_t fingerprint; /* hash of its tensors and alpha: keys prefix reuse (never 0) */
    const char *label;    /* the path or label it was loaded from (valid while it lives) */
} pkv_lora_info;
/* Load an adapter for m. Refused (NULL, pkv_errmsg naming the file and tensor):
 * not an adapter, another architecture, a tensor without its pair, a pair whose
 * base matrix m does not have or does not cover (above), shapes that do not fit
 * the base matrix (both shapes), an unsupported type, a model on several devices or
 * on CUDA. Nothing changes on error. */
pkv_lora *pkv_lora_load(pkv_model *m, const char *path);
pkv_lora *pkv_lora_load_memory(pkv_model *m, const void *data, size_t size, const char *label);
/* Not while a forward pass or the model's default set (pkv_model_lora_apply) uses
 * it. NULL: no-op. pkv_model_free frees the model's adapters that are left. */
void pkv_lora_free(pkv_lora *a);
pkv_status pkv_lora_get_info(const pkv_lora *a, pkv_lora_info *info);
/* The adapters every forward pass of m applies to sequences that do not name their
 * own (pkv_request_params.lora; n 0: none, the default). At most PKV_MAX_LORA, each
 * loaded for m. The model's fingerprint (new sequences, saved KV) changes with the
 * set, so call it before making caches, contexts or engines. On error nothing changes. */
pkv_status pkv_model_lora_apply(pkv_model *m, const pkv_lora_use *uses, int n);
/* The model's default set into out[0..max): returns its size (may exceed max). */
int pkv_model_lora_get(const pkv_model *m, pkv_lora_use *out, int max);

/* Text to token ids with the model's vocabulary. add_special: BOS/EOS as the model
 * asks; parse_special: special-token text becomes the special token. When max is
 * too small: PKV_ERR_INVALID and *n_out = the count needed. A model without a
 * vocabulary: PKV_ERR_UNSUPPORTED ("use token ids"). */
pkv_status pkv_model_tokenize(const pkv_model *m, const char *text, size_t len, bool add_special,
                              bool parse_special, int32_t *out, size_t max, size_t *n_out);
/* pkv_model_tokenize with special tokens parsed only outside the data spans:
 * data_spans holds n_spans sorted pairs [start, end) of byte offsets into text
 * (e.g. the message contents inside a rendered chat prompt); special-token text
 * that touches a span is tokenized as plain text. The rest of the contract, and
 * the ids of text without such markers, are those of pkv_model_tokenize. */
pkv_status pkv_model_tokenize_spans(const pkv_model *m, const char *text, size_t len, bool add_special,
                                    const size_t *data_spans, size_t n_spans, int32_t *out, size_t max,
                                    size_t *n_out);
/* The bytes of token ids (pieces concatenated); buffer contract as tokenize. */
pkv_status pkv_model_detokenize(const pkv_model *m, const int32_t *ids, size_t n, bool render_special,
                                char *buf, size_t size, size_t *n_out);
pkv_status pkv_model_token_piece(const pkv_model *m, int32_t id, bool render_special, char *buf,
                                 size_t size, size_t *n_out);
int32_t pkv_model_bos(const pkv_model *m); /* -1 when none */
int32_t pkv_model_eos(const pkv_model *m);
/* True when id ends generation, as llama.cpp decides it: the EOS/EOT/EOM ids, the FIM
 * pad/repo/file-separator tokens, and tokens recognised by their text (<|im_end|>,
 * <|eot_id|>, </s>, ...: docs/tokenizer.md). pkv_generate and pkv_spec_generate stop
 * after such a token. False for a NULL model or an id out of range. */
bool pkv_model_is_eog(const pkv_model *m, int32_t id);

/* Render a chat request to a prompt exactly as pagekv serve (/apply-template,
 * /v1/chat/completions) and run -cnv do: the same Jinja interpreter, built-in
 * families and request handling (docs/python.md, docs/server.md).
 * request_json: an OpenAI chat body, e.g. {"messages": [...], "tools": [...],
 * "add_generation_prompt": true, "continue_final_message": false,
 * "chat_template_kwargs": {...}, "reasoning_effort": "low"}.
 * template_src: Jinja text, a built-in family's name ("chatml", "llama3", ...), or
 * NULL for m's tokenizer.chat_template (PKV_ERR_NOT_FOUND when it has none).
 * m gives the bos_token/eos_token text and whether its tokenizer adds BOS (a
 * leading BOS text is then taken off); m may be NULL with a template_src, the
 * request's "bos_token"/"eos_token" strings then stand in ("" when absent).
 * now: the clock for dates (Unix seconds; 0 = now). On success *prompt (NUL-
 * terminated, *prompt_len bytes when prompt_len is not NULL) and, when spans is
 * not NULL, *n_spans sorted [start, end) byte pairs in *spans (2 * n_spans values)
 * covering the message texts, for pkv_model_tokenize_spans; free both with
 * pkv_chat_render_free. Errors: PKV_ERR_INVALID for bad JSON, a template that
 * does not parse or fails (raise_exception's message in pkv_errmsg()), a bad
 * request; PKV_ERR_UNSUPPORTED when libpagekv was built without jansson. */
pkv_status pkv_chat_render(const pkv_model *m, const char *template_src, const char *request_json, int64_t now,
                           char **prompt, size_t *prompt_len, size_t **spans, size_t *n_spans);
void pkv_chat_render_free(char *prompt, size_t *spans);

/* Test models with random weights (`pagekv mkmodel`). Weights are scaled so
 * activations stay in a sane range; the vocabulary is a small byte-level BPE of
 * printable words (or none). */
typedef struct pkv_mkmodel_params {
    const char *arch;    /* "llama" (default), "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3",
                            "gpt-oss" (YaRN factor 4 over an original context of 256, base 150000),
                            "qwen35", "gemma4" (its fields below), "smollm3" (no RoPE on every fourth
                            layer), "mistral3" (YaRN by 16 over min(256, n_ctx), its log multiplier 1
                            and temperature scale 0.1), "deepseek2" (fields q_lora_rank,
                            kv_lora_rank below), "llama4" (4 layers, chunks of
                            sliding_window tokens),
                            "glm4moe" (GLM-4.5: n_layer 0 = 3 trunk layers, the
                            first dense, Q/K norms on the odd ones; experts of n_ff rows with a shared
                            one and the exp_probs_b bias; half of each head rotated),
                            "granitehybrid" (Granite 4.0-H: n_layer 0 = 4, layer l % 4 == 1
                            attends (no RoPE), the others Mamba-2 with ssm_v_heads heads
                            (0 = 2 n_embd / ssm_head_dim) of ssm_head_dim (0 = 16) in ssm_k_heads
                            groups (0 = 2), state size ssm_head_dim, conv kernel 4; n_expert > 0:
                            experts and a shared expert of n_ff rows),
                            "nemotron_h" (Nemotron-H: n_layer 0 = 6, layer l by l % 3 a Mamba-2
                            layer (granitehybrid's sizes), an MLP of n_ff rows (up, squared ReLU,
                            down) or attention without RoPE) */
    pkv_type type;       /* matrix type: f32, f16 (default), bf16, q8_0, q4_0, q4_k, q5_k, q6_k, mxfp4 */
    int n_layer;         /* 0 = 2 */
    int n_embd;          /* 0 = 128 */
    int n_head;          /* 0 = 4 */
    int n_head_kv;       /* 0 = 2 */
    int head_dim;        /* 0 = n_embd / n_head */
    int n_ff;            /* 0 = 256; qwen3moe, gpt-oss: the rows of one expert's FFN */
    int n_expert;        /* qwen3moe, gpt-oss, glm4moe: experts per layer; 0 = 4; gemma4: 0 = none (dense), else every
                            layer a MoE layer (26B-A4B's layout: experts of n_ff / 2 rows beside the dense
                            FFN); other architectures: must be 0 */
    int n_expert_used;   /* qwen3moe, gpt-oss, gemma4 with experts: experts each token goes to; 0 = 2 */
    int sliding_window;  /* gemma2, gemma3, gemma4, gpt-oss: tokens their sliding layers see; llama4:
                            its chunk; 0 = 8 */
    int n_vocab;         /* 0 = 512 */
    int n_ctx;           /* 0 = 2048 */
    uint64_t seed;       /* 0 = 1 */
    bool no_vocab;       /* tokenizer.ggml.model = none, only <arch>.vocab_size */
    bool tied;           /* no output.weight: tied embeddings */
    bool k_mixture;      /* a mixture of `type` with k-quants, as llama-quantize's _M files: q6_k
                            for the output matrix; with type q4_k ("Q4_K_M") q6_k for attn_v and
                            ffn_down of every other layer; with any other quantized type ("Q3_K_M",
                            "IQ3_M", ...) q4_k for those and q5_k for attn_k of the odd layers.
                            Row lengths must then be multiples of 256 */
    const char *draft_of; /* a target GGUF: make a draft model for it. Copies the target's
                             vocabulary (every tokenizer.* key), architecture, n_embd, heads,
                             KV heads, head size, n_ff, context, RoPE and norm settings (the
                             fields above for those are ignored); n_layer, type, seed stay.
                             NULL: a normal model */
    const int32_t *shared_kv_layers; /* [n_layer] or NULL: write the key pagekv.shared_kv_layers
                             (draft layer j attends over target cache layer [j]; heads are
                             taken from the first listed layer the target has). Indices are
                             not checked against a target here: attaching checks them (I6) */
    const char *chat_template; /* a chat-template family: "chatml", "llama3", "llama2", "mistral",
                             "gemma", "phi3", "deepseek", "voxtral" (mistral's turns, with
                             [BEGIN_AUDIO] and [TRANSCRIBE]); NULL = none. The vocabulary gets the
                             family's special tokens as control tokens at ids 256.. (in place of
                             <|begin_of_text|> 256 and <|end_of_text|> 257; the word tokens follow
                             them), that family's BOS/EOS/EOT ids, add-BOS flag and pre-tokenizer
                             name, and tokenizer.chat_template a Jinja template of the family's turn
                             format. Not with no_vocab or draft_of */
    /* qwen35's gated delta-net layers (every layer but each 4th; n_layer 0 = 4):
     * value heads (0 = 4), key heads (0 = 2; a divisor of the value heads) and the
     * head size of both (0 = 16); the conv kernel is 4 */
    int ssm_v_heads, ssm_k_heads, ssm_head_dim;
    int ssm_state;       /* Mamba-2 (granitehybrid, nemotron_h): the state size (0 = ssm_head_dim) */
    int n_mtp;           /* qwen35: MTP ("nextn") layers after the trunk (nextn_predict_layers), 0..4;
                            glm4moe: 0 = 1, < 0 = none */
    /* gemma4 (every field 0 = a test shape with each Gemma 4 feature; n_layer 0 = 6,
     * n_head 0 = 8, head_dim 0 = 64 for the full layers, the window 0 = 8). Tied
     * embeddings, the sharing layers' FFN twice n_ff wide (use_double_wide_mlp), full
     * layers without attn_v (V = K), proportional RoPE turning a quarter of the full
     * layers' pairs, layer_output_scale on every layer. */
    int head_dim_swa;     /* head size of the sliding layers; 0 = head_dim / 2 (head_dim where
                             n_head of those are not whole blocks of the weight type) */
    int n_head_kv_full;   /* KV heads of the full layers (head_count_kv an array where it
                             differs from n_head_kv); 0 = n_head / 4 */
    int n_embd_per_layer; /* per-layer embedding size; 0 = 16 (the weight type's block where
                             larger), < 0 = none */
    int n_shared_kv;      /* the last layers, reusing an earlier layer's KV; 0 = 2, < 0 = none */
    const char *swa_layers; /* one 's' (sliding) or 'f' (full) per layer; NULL = a full layer every
                             third counting back from the last layer with KV of its own, which is
                             full and follows a sliding one, and the sharing layers alternate
                             sliding and full */
    const char *chat_template_text; /* a Jinja template written as tokenizer.chat_template in place of
                             the family's (chat_template names the family whose special tokens the
                             vocabulary gets; NULL there = chatml); NULL = the family's own */
    const char *const *extra_specials; /* NULL-terminated: more control tokens, after the family's
                             (Gemma 3 vision's <start_of_image>, <end_of_image>); needs chat_template */
    const char *pre;     /* tokenizer.ggml.pre of the vocabulary, any name pagekv knows ("deepseek-v3",
                            "gpt-4o", ...: docs/tokenizer.md), to compare pre-tokenizers with another
                            implementation on one file; NULL = the chat family's (llama-bpe without
                            one). Not with no_vocab or draft_of */
    /* ARCH.pooling_type (an embedding model): "none", "mean", "cls", "last" or "rank";
     * NULL = no key. "rank" writes a reranker as llama.cpp's converter writes
     * Qwen3-Reranker: classifier.output_labels ["yes", "no"], cls.output.weight
     * [2][n_embd] (random rows here; the converter takes the lm_head rows of the two
     * words) and tokenizer.chat_template.rerank (Qwen3-Reranker's) beside a chat
     * template; qwen3 only. Not for the architectures with their own writer
     * (gemma3 vision, gemma4, qwen35, ...) */
    const char *pooling;
    /* phi3: LongRoPE over an original context of this many tokens (Phi-3-128k's
     * layout): rope_factors_short.weight (random factors in [1.1, 1.9]) and
     * rope_factors_long.weight (in [2, 14]), rope.scaling.original_context_length and
     * rope.scaling.attn_factor sqrt(1 + ln(n_ctx / it) / ln(it)) (1 where n_ctx is
     * not larger), as llama.cpp's converter writes them; 0 = none */
    int rope_orig_ctx;
    /* deepseek2 (multi-head latent attention; head_dim is a query head's nope + rope dims,
     * rope half of it; one KV head; YaRN by 4 over min(256, n_ctx) with V2-Lite's log
     * multiplier; every layer dense): q_lora_rank 0 = the lite layout (attn_q), else
     * attn_q_a [q_lora_rank][n_embd] and attn_q_b; kv_lora_rank 0 = 64 */
    int q_lora_rank, kv_lora_rank;
} pkv_mkmodel_params;

pkv_mkmodel_params pkv_mkmodel_default_params(void);
/* Write the model to path (atomically). */
pkv_status pkv_mkmodel_write(const pkv_mkmodel_params *p, const char *path);
/* The GGUF image in a new buffer (*data, *size); free it with pkv_mkmodel_free_memory. */
pkv_status pkv_mkmodel_memory(const pkv_mkmodel_params *p, void **data, size_t *size);
void pkv_mkmodel_free_memory(void *data);

/* --------------------------------------------------------------- engine */
/* (section owned by the engine layer: src/engine/) */

/* A context is one sequence of a model in a KV cache, with the logits of its last
 * decoded token. Contexts of one cache share pages: a fork costs the same for
 * 10 tokens as for 100,000. A model, its caches and contexts are used by one
 * thread at a time. */
typedef struct pkv_context pkv_context;
typedef struct pkv_mmproj pkv_mmproj; /* the media section's projector */
typedef struct pkv_media pkv_media;   /* the media section's decoded media */

typedef struct pkv_cache_params {
    int n_ctx;               /* most tokens of one sequence; 0 = min(training context, 4096) */
    int n_seq_max;           /* sequences (contexts, forks) to size the pool for; 0 = 4 */
    int page_size;           /* tokens per page, 1..256; 0 = 16 */
    pkv_type kv_type;        /* K pages, and V pages unless kv_type_v is set: PKV_TYPE_F16 (default),
                                F32, Q8_0 or Q4_0 (quantized: head sizes must be multiples of 32) */
    pkv_type kv_type_v;      /* V pages; PKV_TYPE_COUNT (the default) = kv_type */
    int64_t n_pages;         /* device pages; 0 = n_seq_max * ceil(n_ctx / page_size) */
    int64_t host_pages;      /* host swap pool pages; 0 = as many as the device pool */
    /* Models with sliding-window layers: pages of the window pool (their K/V; a
     * sequence holds about (window + page_size + 256) / page_size + 1 of them). 0 =
     * that times 2 * n_seq_max, at most n_pages. */
    int64_t n_window_pages;
    /* Disk tier below the device pool: pkv_kv_params.disk_dir / disk_bytes (NULL = none). */
    const char *disk_dir;
    uint64_t disk_bytes;
    /* Remote tier (Redis): pkv_kv_params.remote_url / remote_queue_pages (NULL = none). */
    const char *remote_url;
    int remote_queue_pages;
} pkv_cache_params;

pkv_cache_params pkv_cache_default_params(void);
/* A KV cache with the model's per-layer geometry on the model's device, RoPE set up
 * for context shift. NULL on failure: e.g. a KV type other than f16, f32, q8_0,
 * q4_0, or a quantized type for head sizes that are not multiples of 32 (the
 * message names the type or the layer). */
pkv_kv_cache *pkv_model_cache_create(const pkv_model *m, pkv_cache_params p);

/* New empty context (a new sequence of c) holding at most n_ctx tokens (0 =
 * min(training context, 4096)). NULL on failure. */
pkv_context *pkv_context_create(pkv_model *m, pkv_kv_cache *c, int64_t n_ctx);
/* Frees the context and its sequence (published pages stay cached). NULL: no-op. */
void pkv_context_free(pkv_context *ctx);
/* Keep every decoded token's final normed hidden state (what the output matrix
 * multiplies) from now on: n_ctx x n_embd floats of host memory. An MTP draft
 * (pkv_model_params.mtp) needs the target's: pkv_spec_create turns it on, but a
 * prompt decoded before that has none, and the head drafts worse over it. */
pkv_status pkv_context_keep_hidden(pkv_context *ctx);
/* Token i's kept hidden state (n_embd floats), or NULL (not kept, i out of range, or
 * token i decoded before keeping began or moved by a shift since). */
const float *pkv_context_hidden(const pkv_context *ctx, int64_t i);
/* A child sharing every page and the logits of ctx. NULL on failure. */
pkv_context *pkv_context_fork(pkv_context *ctx);
/* A context of a shared-KV draft model (info.shared_kv) on the target context's
 * cache: its layer j reads and writes cache layer pagekv.shared_kv_layers[j].
 * Checked first (I6): every mapped layer exists with the same KV heads, head
 * sizes and dtype, and the draft's device can reach where each shard is stored;
 * the error names the draft layer, the cache layer, both devices and the fix.
 * The draft context starts as a fork of the target's sequence (sharing its
 * pages; its own tokens go to copied pages, never into the target's) and its
 * appends are never published for prefix reuse. Re-sync it with
 * pkv_context_attach again (cheap) after the target moves on. NULL on failure. */
pkv_context *pkv_context_attach(pkv_model *draft, pkv_context *target);
/* Gemma 4's assistant (info.assistant) attaches the same way, and more is checked
 * first: the target is a gemma4 model of the assistant's embedding_length_out, with
 * its vocabulary, and each assistant layer's KV heads and head sizes are those of the
 * target layer it reads (a sliding layer: the target's last sliding layer that owns
 * KV; a full layer: its last full one); the error names both files and the key or
 * the two values. Its layers' attention runs on the device that stores each shard
 * of those layers (any device with the attention kernel for the cache's KV type; a
 * device without is refused here, naming both devices and the fix), the rest on the
 * assistant's device. Its context holds a fork of the target's sequence, from which
 * pkv_context_draft_step only reads. The assistant model follows the target it was
 * last attached to (its layers point at that target's cache layers): attach one
 * assistant model to one target model at a time. */

/* One drafting step of an assistant context (pkv_context_attach): n queries, token
 * tokens[i] with the target's hidden state h_in[i] (f32 [n][info.n_embd_out]), each
 * at the position after the sequence's last token and seeing every token of it.
 * Nothing is appended to any cache. The logits of the last query become the
 * context's logits; h_out (f32 [n][n_embd_out], may be NULL) receives each query's
 * next hidden state (the assistant's post_projection). On error nothing changes. */
pkv_status pkv_context_draft_step(pkv_context *ctx, const int32_t *tokens, int32_t n, const float *h_in, float *h_out);

int32_t pkv_context_seq(const pkv_context *ctx);      /* the KV sequence id */
pkv_model *pkv_context_model(const pkv_context *ctx);
pkv_kv_cache *pkv_context_cache(const pkv_context *ctx);
int64_t pkv_context_n_tokens(const pkv_context *ctx); /* tokens in the cache */
int64_t pkv_context_n_ctx(const pkv_context *ctx);    /* the cache's per-sequence limit */
/* Logits f32 [n_vocab] of the last decoded token, or NULL when there are none
 * (nothing decoded yet, or after truncate/shift/load without a decode). */
const float *pkv_context_logits(const pkv_context *ctx);

/* Decode n_tokens[i] tokens for ctxs[i], all in one batched step (the contexts
 * must share one model and cache and be distinct). Afterwards each context's
 * logits are those of its last token. Errors: PKV_ERR_OUT_OF_PAGES (recoverable),
 * PKV_ERR_INVALID (token id out of range, context full). On error nothing changes. */
pkv_status pkv_decode(pkv_context *const *ctxs, int n_ctxs, const int32_t *const *tokens, const int32_t *n_tokens);
/* pkv_decode for one context. */
pkv_status pkv_context_decode(pkv_context *ctx, const int32_t *tokens, int32_t n);
/* Like pkv_context_decode but writes the logits of every token to all_logits
 * (f32 [n][n_vocab], host). */
pkv_status pkv_context_decode_all(pkv_context *ctx, const int32_t *tokens, int32_t n, float *all_logits);

/* KV operations on the context's sequence (see the kv section). truncate, shift
 * and load leave no logits: decode next, or re-decode the last token. */
pkv_status pkv_context_truncate(pkv_context *ctx, int64_t n_keep);
/* Remove tokens [start, start + n_remove); later tokens move down and their
 * positions (and cached K) shift by -n_remove. */
pkv_status pkv_context_shift(pkv_context *ctx, int64_t start, int64_t n_remove);
pkv_status pkv_context_swap_out(pkv_context *ctx);
pkv_status pkv_context_swap_in(pkv_context *ctx);
pkv_status pkv_context_save(pkv_context *ctx, const char *path);
/* A new context from a file written by pkv_context_save (any device, same
 * geometry). Its last token is decoded again so that logits are available.
 * NULL on failure with the reason (what differs) in pkv_errmsg(). */
pkv_context *pkv_context_load(pkv_model *m, pkv_kv_cache *c, const char *path, int64_t n_ctx);
/* Token ids of the context [start, start + n). */
pkv_status pkv_context_tokens(const pkv_context *ctx, int64_t start, int64_t n, int32_t *out);

/* Media into a context (docs/multimodal.md, "Media in the cache"). A chunk of rows made by a
 * projector (pkv_mmproj_encode) or by the caller. */
typedef struct pkv_media_rows {
    uint64_t key;       /* pkv_media_key(pkv_media_hash(m), projector fingerprint); any
                           caller-chosen 64-bit content key for rows made otherwise */
    int32_t n_rows;     /* >= 1 */
    const float *embd;  /* f32 [n_rows][n_embd] host rows, the text model's input width */
    bool non_causal;    /* its rows attend to each other both ways (gemma3 images) */
    int32_t at;         /* in a prompt of tokens + chunks (pkv_context_decode_prompt,
                           pkv_request_params.media): text tokens before this chunk;
                           ignored by pkv_context_decode_media */
} pkv_media_rows;
/* Decode one chunk: its n_rows rows enter the cache at the next positions, in one
 * forward step (a non-causal chunk is never split), and are recorded in the
 * sequence. The rows are used as the model's input embeddings as they are (no
 * embedding scale: Gemma's sqrt(n_embd) applies to token embeddings only). The
 * context's logits are then those of the last row. On error nothing changes. */
pkv_status pkv_context_decode_media(pkv_context *ctx, const pkv_media_rows *m);
/* A prompt of text tokens and media chunks, in order (media[i].at non-decreasing,
 * <= n): the context's logits are those of the prompt's last token or row. */
pkv_status pkv_context_decode_prompt(pkv_context *ctx, const int32_t *tokens, int32_t n, const pkv_media_rows *media,
                                     int n_media);
/* Encode m with projector p and decode its rows (pkv_context_decode_media); *key and
 * *n_rows (may be NULL) receive the chunk's key and length. */
pkv_status pkv_context_decode_mmproj(pkv_context *ctx, pkv_mmproj *p, const pkv_media *m, uint64_t *key, int32_t *n_rows);

/* Token sampling over one row of logits on the host.
 *
 * The chain, in this order:
 *   0. logit bias (logit_bias): each entry's bias is added to its token's logit
 *      (entries for the same token add up; -INFINITY bans the token: it is never
 *      drawn, greedy included), before every other step and before a grammar's mask;
 *   1. repetition penalty over the last repeat_last_n accepted tokens (each distinct
 *      token once: a positive logit is divided by the penalty, a negative or zero one
 *      multiplied — llama.cpp's semantics);
 *   2. temperature: temp <= 0 means greedy (argmax, the lowest index on ties) and the
 *      remaining steps are skipped; otherwise logits are divided by temp;
 *   3. top-k: keep the k largest (ties broken by the lower token id);
 *   4. top-p: over the softmax of the top-k survivors, keep the smallest prefix (by
 *      descending probability) whose probability sum is >= top_p; at least one token;
 *   5. min-p: keep tokens with p >= min_p * p_max;
 *   6. draw from the renormalized survivors with the sampler's own PRNG
 *      (xoshiro256** seeded through splitmix64): the same seed gives the same tokens
 *      on every machine.
 * The sampler does not allocate after pkv_sampler_create (but a grammar's parse
 * state does: pkv_sampler_set_grammar). Not thread-safe: one
 * sampler per sequence.
 * (The public parts move to include/pagekv.h's engine section later.) */

/* One entry of pkv_sampler_params.logit_bias. */
typedef struct pkv_logit_bias {
    int32_t token; /* token id, [0, n_vocab) */
    float bias;    /* added to its logit: finite, or -INFINITY (never drawn) */
} pkv_logit_bias;

#define PKV_SAMPLER_MAX_LOGIT_BIAS 65536 /* entries of pkv_sampler_params.logit_bias */

typedef struct pkv_sampler_params {
    float temp;           /* temperature; <= 0: greedy (argmax) */
    int top_k;            /* keep the k most likely tokens; 0: off; must be >= 0 */
    float top_p;          /* nucleus threshold in (0, 1]; 1: off */
    float min_p;          /* keep p >= min_p * p_max; in [0, 1]; 0: off */
    float repeat_penalty; /* > 0; 1: off */
    int repeat_last_n;    /* how many accepted tokens the penalty looks back; 0: off; >= 0 */
    uint64_t seed;        /* PRNG seed; every value (0 included) is a fixed, reproducible seed */
    /* OpenAI-style additive penalties, applied with the repetition penalty (step 1)
     * over the same last repeat_last_n accepted tokens: a token seen c > 0 times
     * there gets logit -= presence_penalty + c * frequency_penalty. Finite; 0: off. */
    float presence_penalty;
    float frequency_penalty;
    /* Step 0 of the chain (OpenAI's logit_bias): [n_logit_bias] entries, copied by
     * pkv_sampler_create (and by pkv_engine_submit); each token in [0, n_vocab), each
     * bias finite or -INFINITY (a ban); not every token banned. NULL / 0 = none. */
    const pkv_logit_bias *logit_bias;
    int32_t n_logit_bias; /* 0..PKV_SAMPLER_MAX_LOGIT_BIAS */
} pkv_sampler_params;

typedef struct pkv_sampler pkv_sampler;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0 (off),
 * repeat_last_n 64, seed 0, presence and frequency penalties 0 (off), no logit bias. */
pkv_sampler_params pkv_sampler_default_params(void);

/* A sampler for rows of n_vocab logits. Returns NULL with a message naming the field
 * on bad params (top_k < 0, top_p outside (0, 1], min_p outside [0, 1],
 * repeat_penalty <= 0, repeat_last_n < 0, non-finite presence or frequency
 * penalty, NaN anywhere, n_vocab <= 0, a logit_bias entry with a token outside
 * [0, n_vocab) or a NaN or +infinite bias, every token banned), or on
 * allocation failure. */
pkv_sampler *pkv_sampler_create(pkv_sampler_params p, int32_t n_vocab);
void pkv_sampler_free(pkv_sampler *s);
/* The vocabulary size the sampler was made for (0 for NULL). pkv_sampler_sample and
 * pkv_sampler_probs read exactly that many logits: the caller passes a row of that
 * size. pkv_generate and pkv_spec_generate check it against the model's vocabulary
 * (PKV_ERR_MISMATCH naming both sizes) before reading anything. */
int32_t pkv_sampler_n_vocab(const pkv_sampler *s);

/* Samples one token from logits [n_vocab] (not modified) into *out_token. Does not
 * add the token to the history: call pkv_sampler_accept for that.
 * Errors: PKV_ERR_INVALID for NULL arguments or a NaN/inf logit (the message names
 * the first such index). On error nothing is changed (the PRNG does not advance). */
pkv_status pkv_sampler_sample(pkv_sampler *s, const float *logits, int32_t *out_token);

/* Appends token to the repetition-penalty history (the last repeat_last_n are kept).
 * Tokens outside [0, n_vocab) are kept in the history but never penalize anything. */
void pkv_sampler_accept(pkv_sampler *s, int32_t token);

/* Forgets the history and restarts the PRNG from the seed. */
void pkv_sampler_reset(pkv_sampler *s);

/* The probabilities the next pkv_sampler_sample would draw from, after the whole
 * chain: writes n_vocab floats, zero for filtered tokens, summing to 1 (greedy: a
 * one-hot row). Does not advance the PRNG.
 * Errors: as pkv_sampler_sample; on error probs is not written. */
pkv_status pkv_sampler_probs(pkv_sampler *s, const float *logits, float *probs);

/* Constrained output (docs/engine.md, "Constrained output"): a grammar limits the
 * tokens a sampler may draw to those that keep the output a valid prefix of the
 * grammar's language; end-of-generation tokens are allowed only where the output is
 * complete. Masks come from a byte trie of the vocabulary walked with the parse
 * state, never from scanning every token's text.
 *
 * A grammar is immutable once made and reference-counted: one may serve any number
 * of samplers and requests on any threads; pkv_grammar_free drops the caller's
 * reference (the engine and samplers keep their own). */
typedef struct pkv_grammar pkv_grammar;
/* Token pieces of a model's vocabulary in a byte trie, for masks. Immutable. */
typedef struct pkv_grammar_vocab pkv_grammar_vocab;

/* A GBNF grammar (llama.cpp's format: `name ::= ...` rules, `|`, groups, `*` `+` `?`
 * `{m}` `{m,}` `{m,n}`, "literals" with \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH
 * escapes, [a-z] and [^...] classes, `.`, # comments; output starts at rule root),
 * len bytes of text. NULL on error, with pkv_errmsg() naming line and column and the
 * problem: a syntax error, an undefined rule, no root rule, a left-recursive rule
 * (refused: write the recursion on the right), token references (<...>, not
 * supported), a grammar above the size limits (1 MiB of text, 2M elements after
 * expanding repetitions, counts up to 100000). */
pkv_grammar *pkv_grammar_from_gbnf(const char *text, size_t len);
/* A JSON schema (JSON text of len bytes) as a grammar for JSON documents it
 * accepts: OpenAI's response_format json_schema and tool parameters. The subset,
 * what is refused and the whitespace bound are in docs/engine.md. Errors name the
 * JSON pointer of the offending place and the construct, e.g. "json schema:
 * /properties/code/pattern: pattern at offset 1: lookahead '(?=' is not
 * supported". {"type":"object"} is any JSON object
 * (response_format json_object); {} (or true) is any JSON value. */
pkv_grammar *pkv_grammar_from_json_schema(const char *schema, size_t len);
void pkv_grammar_free(pkv_grammar *g);
/* The grammar's GBNF text (a schema's generated grammar); valid while g lives. */
const char *pkv_grammar_gbnf(const pkv_grammar *g);
/* Bound the work of matching g (call before g is given to a sampler or a request;
 * samplers read the limits when they take it): per_token steps for one token's mask
 * or for accepting it, per_request steps since the sampler's grammar started (a
 * step is one parse stack expanded or tested against a character). Passing either
 * fails sampling with PKV_ERR_INVALID and a message naming the limit, and the
 * grammar's state stays failed until reset. 0 = the default (20M per token, 1G per
 * request: a JSON schema over a 150k-token vocabulary needs well under 1M a token). */
pkv_status pkv_grammar_set_work_limits(pkv_grammar *g, uint64_t per_token, uint64_t per_request);
/* Is text (len bytes) a complete sentence of the grammar? */
bool pkv_grammar_accepts(const pkv_grammar *g, const char *text, size_t len);

/* The vocabulary of m for masks (its pieces as pkv_model_token_piece gives them
 * without special rendering; control tokens have none and are never allowed; the
 * end-of-generation tokens of pkv_model_is_eog are allowed where the grammar is
 * complete). PKV_ERR_UNSUPPORTED for a model without a vocabulary. Costs about a
 * second per million tokens; build it once per model. NULL on failure. */
pkv_grammar_vocab *pkv_grammar_vocab_create(const pkv_model *m);
void pkv_grammar_vocab_free(pkv_grammar_vocab *v);

/* Constrain s with g over vocabulary v (v must outlive s and have s's vocabulary
 * size; g is retained). From then on pkv_sampler_sample and pkv_sampler_probs only
 * give tokens g allows (greedy and stochastic alike: others are removed before the
 * chain's filters), pkv_sampler_accept advances the grammar by the token, and
 * pkv_sampler_reset starts it over. g NULL removes the constraint. With a grammar
 * the sampler allocates as the parse grows. A token accepted that the grammar does
 * not allow, or a state where nothing is allowed, makes the next sample fail with
 * PKV_ERR_INVALID naming it. Not for pkv_spec_generate (PKV_ERR_UNSUPPORTED there);
 * the engine's speculative decoding verifies proposals against it.
 * Errors: PKV_ERR_MISMATCH for a vocabulary of another size, PKV_ERR_NOMEM; on
 * error the sampler is unchanged. */
pkv_status pkv_sampler_set_grammar(pkv_sampler *s, const pkv_grammar *g, const pkv_grammar_vocab *v);
/* Is the sampler's grammar complete (its output may end here)? True without one. */
bool pkv_sampler_grammar_complete(const pkv_sampler *s);


/* Generate up to n_max tokens from the context's logits: sample, call on_token,
 * decode the token, repeat. Stops early at an end-of-generation token (which is
 * passed to on_token but not decoded) or when on_token returns false. *n_out (may
 * be NULL) gets the number of tokens passed to on_token. Needs logits (decode a
 * prompt first). On error the tokens generated so far stay in the context. */
typedef bool (*pkv_token_fn)(int32_t token, void *user);
pkv_status pkv_generate(pkv_context *ctx, pkv_sampler *smp, int n_max, pkv_token_fn on_token, void *user,
                        int *n_out);

/* Speculative decoding on a context of the caller's (docs/speculative.md): a
 * thin wrapper over the serving engine's speculative decoding (pkv_engine_params.
 * draft), which is the one implementation. A draft proposes up to draft_max
 * tokens; the target checks them all in one batched step and keeps the longest
 * acceptable run plus one token of its own; rejected tokens are rolled back with
 * truncate. Acceptance follows the speculative-sampling rule
 * (PKV_DRAFT_ACCEPT_SAMPLING: accept a proposal t drawn from the draft's q with
 * probability min(1, p(t)/q(t)); on rejection draw from max(0, p - q)
 * renormalized; after a fully accepted run draw a bonus token from p), so the
 * output has exactly the target sampler's distribution; with a greedy sampler
 * the output is the target's own greedy output, token for token (on a device
 * whose kernels compute each batch row independently, as the CPU's do; see the
 * doc for other devices). p and q both go through the sampler's whole chain.
 *
 * Any kind of draft the engine takes: a normal model (its own KV cache, on its
 * own device: pkv_model_device(draft)), a shared-KV draft (info.shared_kv: it has
 * no cache and drafts on copy-on-write forks of the target's sequence; attached
 * and checked, I6, by pkv_spec_create), the model's MTP head, or Gemma 4's
 * assistant. The target's cache needs a free sequence slot for a shared-KV
 * draft's fork. */
typedef struct pkv_spec pkv_spec;

/* One propose-verify round of pkv_spec_generate or of a request of the serving
 * engine (pkv_engine_params.on_draft_round), for logs and cross-checks. */
typedef struct pkv_spec_round {
    int64_t pos;             /* position of the last committed token, from which the draft went on */
    const int32_t *proposed; /* the draft's tokens, in order [n_proposed] (valid during the call) */
    int n_proposed;
    int n_accepted;          /* of those, how many the target kept */
} pkv_spec_round;

typedef struct pkv_spec_params {
    int draft_max;                /* most tokens proposed per round, 1..64; 0 = 4 */
    pkv_cache_params draft_cache; /* own-cache drafts: kv_type / kv_type_v of the draft's
                                     cache (default f16); its pool follows the target's
                                     cache, its n_ctx the target context's */
    /* Called after each round's verification (NULL = none). */
    void (*on_round)(const pkv_spec_round *r, void *user);
    void *round_user;
} pkv_spec_params;

pkv_spec_params pkv_spec_default_params(void);

/* Counters of one pkv_spec_generate call. */
typedef struct pkv_spec_stats {
    int64_t n_tokens;     /* tokens passed to on_token */
    int64_t drafted;      /* tokens the draft proposed */
    int64_t accepted;     /* proposals the target accepted (acceptance rate = accepted / drafted) */
    int64_t target_steps; /* target decode steps (tokens per target step = n_tokens / target_steps) */
    int64_t draft_steps;  /* draft decode steps, catching up included */
    int64_t rounds;       /* propose-verify rounds */
} pkv_spec_stats;

/* Speculative decoding of target (a context) with draft: a one-sequence engine
 * over the target's cache. The draft must have the target's vocabulary size. A
 * shared-KV draft or an assistant is validated here (pkv_model_attach, I6): a
 * layer the target's cache lacks, other KV heads, head sizes or dtype, or a device
 * that cannot reach where the target's KV is stored is an error naming the draft
 * layer, the cache layer, both devices and the fix. An MTP head turns on
 * pkv_context_keep_hidden for the target: create it before decoding the prompt,
 * else the first call drafts nothing (the head needs the target's hidden state of
 * every token); so does Gemma 4's assistant (its first round of a call starts from
 * the state of the token before the target's last; without it that round proposes
 * nothing). Both models, the target context and its cache must outlive the
 * result. NULL on failure (nothing stays allocated). */
pkv_spec *pkv_spec_create(pkv_context *target, pkv_model *draft, pkv_spec_params p);
/* Frees the engine and the draft's cache; the target context stays. NULL: no-op. */
void pkv_spec_free(pkv_spec *s);

/* pkv_generate with speculation: same contract and same end state (up to n_max
 * tokens passed to on_token, stopping after an end-of-generation token or when
 * on_token returns false; afterwards the target holds every emitted token but the
 * last, with the logits of its last token). Needs target logits; the first round
 * drafts from the target's last token and verifies its first proposal against
 * them (a round that proposes nothing samples the first token from them). The draft
 * catches up with the target's tokens by itself (the target may be changed
 * between calls: an own-cache draft reuses its pages of the common prefix and
 * decodes the rest). A context holding media rows is refused
 * (PKV_ERR_UNSUPPORTED). *stats (may be NULL) gets this call's counters. On an
 * error of the target's step (e.g. PKV_ERR_OUT_OF_PAGES, recoverable; also past
 * the context's limit, PKV_ERR_INVALID, as pkv_generate's decode) the tokens
 * emitted so far stay committed: the target holds all of them but the last, with
 * its logits, as on success. */
pkv_status pkv_spec_generate(pkv_spec *s, pkv_sampler *smp, int n_max, pkv_token_fn on_token, void *user,
                             pkv_spec_stats *stats);

/* -------------------------------------------------------- serving engine */
/* (section owned by the engine layer: src/engine/engine*.c; docs/engine.md)
 *
 * Many requests over one model and one paged KV cache: continuous batching with
 * chunked prefill, automatic prefix caching across requests, preemption by swap
 * (or recompute) instead of failure, n > 1 samples by fork, cancellation.
 *
 * Threads: pkv_engine_submit, pkv_engine_cancel and pkv_engine_stats_get may be
 * called from any thread at any time (also from inside a token callback). Device
 * work and callbacks run on ONE thread: the engine thread (pkv_engine_start), or,
 * when it is not running, the thread calling pkv_engine_step. The model given to
 * the engine must not be used by anything else while the engine lives.
 *
 * Batch invariance: with greedy sampling (or a fixed seed) a request's tokens and
 * logprobs are bitwise identical whether it runs alone, in any batch, after a
 * preemption, or with its prompt from the prefix cache, on devices whose kernels
 * compute each batch row independently (the CPU's). */

typedef struct pkv_engine pkv_engine;

typedef enum pkv_finish_reason {
    PKV_FINISH_NONE = 0,      /* the sample goes on */
    PKV_FINISH_STOP = 1,      /* an end-of-generation token, a stop token id, or the callback returned false */
    PKV_FINISH_LENGTH = 2,    /* max_tokens generated */
    PKV_FINISH_CANCELLED = 3, /* pkv_engine_cancel, or the engine was freed first */
    PKV_FINISH_ERROR = 4,     /* the event's status and message say why */
} pkv_finish_reason;

/* "none", "stop", "length", "cancelled", "error"; "?" for other values. */
const char *pkv_finish_reason_str(pkv_finish_reason r);

#define PKV_ENGINE_MAX_TOP_LOGPROBS 20
#define PKV_ENGINE_MAX_N 64     /* most parallel samples of one request */
#define PKV_ENGINE_MAX_STOP 64  /* most stop token ids of one request */

typedef struct pkv_token_logprob {
    int32_t token;
    float logprob; /* natural log of the probability */
} pkv_token_logprob;

/* One event of one sample, passed to the request's callback. Pointers are valid
 * during the callback only.
 * Every sample gets events in order: zero or more token events (finish NONE),
 * then exactly one final event (finish != NONE), which may carry the last token
 * (stop token, max_tokens reached) or none (token -1: cancelled, error, or the
 * callback returned false on the previous event). Nothing comes after the final
 * event; the request is finished when all its n samples had theirs. */
typedef struct pkv_engine_event {
    uint64_t request;        /* id from pkv_engine_submit */
    int sample;              /* 0..n-1: which of the request's n samples */
    int32_t token;           /* the sampled token, or -1 when the event carries none */
    float logprob;           /* its log-probability under the model's own distribution
                                (log-softmax of the raw logits: before penalties,
                                temperature and filters); 0 without a token */
    int n_top;               /* entries in top (the request's top_logprobs; 0 without a token) */
    const pkv_token_logprob *top; /* [n_top] the most likely tokens under the same
                                distribution, most likely first (lower id on ties) */
    pkv_finish_reason finish;
    bool stop_token;         /* finish == STOP because token is an end-of-generation
                                token or one of stop_tokens (a server leaves its text out) */
    int32_t n_prompt;        /* prompt tokens of the request */
    int32_t n_cached;        /* prompt tokens reused from the prefix cache (not computed) */
    int32_t n_generated;     /* tokens of this sample so far, this event's included */
    int64_t n_shifted;       /* tokens the request's context shift dropped so far
                                (pkv_request_params.context_shift); 0 without */
    pkv_status status;       /* PKV_OK unless finish == ERROR */
    const char *message;     /* with ERROR: what failed; otherwise "" */
    /* An embedding request's final event (finish LENGTH, pkv_request_params.embed):
     * n_embd floats, the pooled hidden state (n_prompt rows of the model's n_embd
     * with PKV_POOLING_NONE; the classification head's n_cls_out scores with RANK).
     * NULL / 0 otherwise. */
    const float *embd;
    int32_t n_embd;
} pkv_engine_event;

/* Called on the engine thread for every event. Must not call pkv_engine_step,
 * _start, _stop or _free; may call submit, cancel and stats_get. Returning false
 * on a token event ends that sample: its final event follows (token -1, finish
 * STOP). The return value of a final event is ignored. */
typedef bool (*pkv_engine_event_fn)(const pkv_engine_event *ev, void *user);

typedef struct pkv_request_params {
    const int32_t *prompt;   /* [n_prompt] token ids, copied by submit */
    int32_t n_prompt;        /* >= 1 */
    pkv_sampler_params sampling; /* sample i of n uses seed sampling.seed + i; the penalties
                                    look at generated tokens only */
    int32_t max_tokens;      /* most tokens generated per sample, >= 0; 0 = up to the
                                context limit (n_ctx - n_prompt) */
    const int32_t *stop_tokens; /* [n_stop] ids that end a sample (finish STOP), copied */
    int n_stop;              /* 0..PKV_ENGINE_MAX_STOP */
    bool ignore_eos;         /* do not stop at the model's end-of-generation tokens */
    int n;                   /* parallel samples, 1..PKV_ENGINE_MAX_N: the prompt is computed
                                once and forked (copy-on-write) */
    int priority;            /* larger runs first and is preempted last; ties: earlier
                                submission first; default 0 */
    int top_logprobs;        /* alternatives per token event, 0..PKV_ENGINE_MAX_TOP_LOGPROBS */
    pkv_engine_event_fn on_event; /* may be NULL (then tokens are only counted) */
    void *user;
    /* Constrained output: every sample's tokens keep the output a valid prefix of
     * the grammar, and it ends (finish STOP, stop_token) only where the grammar is
     * complete. NULL = unconstrained. Retained by submit (the caller may free its
     * reference right after). The engine builds its model's pkv_grammar_vocab at the
     * first such request. ignore_eos is refused with a grammar. */
    const pkv_grammar *grammar;
    /* Generate on a persistent context instead of a fresh sequence (docs/engine.md,
     * "Requests on a context"); NULL = a fresh sequence. ctx must be on the
     * engine's cache (pkv_context_create(pkv_engine_model(e), pkv_engine_cache(e), ..)),
     * resident or held by the engine (pkv_engine_context_hold: a held one swapped
     * out comes back at admission); n must be 1. The request extends it: the prompt (n_prompt may be 0
     * when ctx has logits: the first token is sampled from them) and then every
     * generated token, the last included, go into its KV, so when the final event
     * comes ctx holds them all and the logits of the last. n_ctx - len(ctx) -
     * n_prompt bounds max_tokens (n_ctx: the smaller of the engine's and ctx's;
     * not with context_shift, below; n_ctx - len(ctx) + 1 with last_pending).
     * No prefix matching for it. A draft (pkv_engine_params.draft) proposes for it as
     * for any request once the draft has caught up with the context's tokens (an
     * own-cache draft decodes them, reusing its published pages; an MTP head needs
     * the model's hidden state of each of them: from this request's steps or kept by
     * the context, pkv_context_keep_hidden, else the request goes without the
     * draft); not for a context holding media rows. With n_prompt 0 and a draft, the
     * first round drafts from ctx's last token and verifies the first proposal
     * against ctx's logits (as llama.cpp's first round from a prompt's last token;
     * the assistant needs ctx's kept hidden states for it). It is batched, and preempted by swap
     * (or by truncating ctx back to its length at admission and recomputing), like
     * any other. After a cancelled or failed request ctx holds a prefix of
     * prompt + generated tokens, without logits, and may be left swapped
     * (pkv_kv_seq_swapped). Not owned; until the final event nothing else may use
     * ctx, and the request must be submitted from the stepping thread (or while no
     * step runs): submit reads ctx's length. One request per context at a time. */
    pkv_context *context;
    /* With context: only compute the prompt into ctx, as pkv_context_decode would,
     * and sample nothing. ctx then holds its tokens + the prompt and the logits of
     * the prompt's last token, and the final event (finish LENGTH, token -1,
     * n_generated 0) comes from the step that ran that token. The prompt is chunked
     * by the token budget, batched with the other requests and preempted like them;
     * it may fill ctx to its limit (len(ctx) + n_prompt <= n_ctx). A cancelled or
     * failed one leaves a prefix without logits, as above. Refused (PKV_ERR_INVALID,
     * the message naming the field) without a context, with an empty prompt, with
     * n != 1, max_tokens != 0, a grammar, stop tokens, top_logprobs or ignore_eos;
     * sampling is not used. */
    bool prefill_only;
    /* Media chunks in the prompt (docs/multimodal.md, "Media in the cache"): chunk i is inserted
     * after the first media[i].at prompt tokens (0 <= at <= n_prompt, non-decreasing),
     * taking media[i].n_rows positions; the rows (embd) are copied by submit. The
     * prompt then is n_prompt + the sum of n_rows tokens (n_prompt may be 0 with
     * media). Prefix caching keys the chunks by their media key; a non-causal chunk
     * is never split across prefill steps. NULL / 0 = none. Not with context. */
    const pkv_media_rows *media;
    int n_media;
    /* Context shift (docs/engine.md, "Context shift"; pagekv run --context-shift): on a
     * request on a context, a token the sample goes on from that finds the context
     * full (len(ctx) = n_ctx, the smaller of the engine's and ctx's) does not end the
     * request: the engine keeps the first n_keep tokens (at least 1 when the first is
     * the model's BOS; at most len - 2), drops half of the rest (pkv_kv_shift: the
     * later tokens move down and their K is rotated anew) and runs the token after
     * them. The request's last token goes in without a shift while the sequence is
     * below the engine's n_ctx. Events count the dropped tokens (n_shifted). Needs
     * context, max_tokens >= 1 (nothing else bounds it; n_ctx - len(ctx) - n_prompt
     * does not), n_keep >= 0 and no grammar; n_keep != 0 needs context_shift. */
    bool context_shift;
    int32_t n_keep;
    /* A sampler of the caller's to draw sample 0's tokens with instead of one made
     * from sampling (whose seed and filters are then ignored): its draws and history
     * go on from where the caller left them, so a chat's turns, each a request on its
     * context, sample as one loop over one sampler would. Not owned; nothing else may
     * use it until the final event. Needs n = 1 and no grammar. NULL: the request
     * makes its own. */
    pkv_sampler *sampler;
    /* With context: the request ends as pkv_generate leaves a context: its last
     * generated token is delivered but not run into ctx, which then holds the prompt
     * and every generated token but the last, with the logits that token was
     * sampled from (the final event comes from the step that sampled it). A next
     * request gives that token as its prompt. Needs a context, no context_shift and
     * no prefill_only. */
    bool last_pending;
    /* An embedding request: compute the prompt on a fresh sequence and sample
     * nothing; the final event (finish LENGTH, token -1, n_generated 0) carries the
     * prompt's final normed hidden states reduced by `pooling` (pkv_engine_event.embd),
     * unnormalised. Batched, chunked and preempted like any prompt; its pages go to the
     * prefix cache like any other's. A prefix match serves it only where the pooling
     * needs no hidden state of the matched tokens (LAST and RANK read the last token's,
     * which the prefix match always leaves to compute): NONE, MEAN and CLS compute
     * every token. The prompt may fill
     * n_ctx. Refused (PKV_ERR_INVALID, naming the field) with a context,
     * prefill_only, n != 1, max_tokens != 0, a grammar, stop tokens, top_logprobs,
     * ignore_eos, media, a sampler, context_shift or last_pending, and RANK without a
     * classification head (pkv_model_info.n_cls_out 0) or on another architecture
     * than qwen3. */
    bool embed;
    pkv_pooling pooling;
    /* LoRA adapters (docs/lora.md): NULL = the model's default set
     * (pkv_model_lora_apply); else exactly these n_lora (0..PKV_MAX_LORA, 0 = none),
     * each loaded for the engine's model, scales finite; copied by submit. A request
     * reuses cached prefixes only of requests with the same set (adapters and
     * scales); adapters with scale 0 count as absent. Not with context (refused,
     * PKV_ERR_UNSUPPORTED) unless the set is empty of nonzero scales. */
    const pkv_lora_use *lora;
    int n_lora;
} pkv_request_params;

/* prompt NULL, n 1, max_tokens 0, sampling = pkv_sampler_default_params(),
 * no stop tokens, priority 0, top_logprobs 0, no callback, no context. */
pkv_request_params pkv_request_default_params(void);

typedef enum pkv_spill_mode {
    PKV_SPILL_AUTO = 0,   /* spill when the measured disk write + read of its pages costs less
                             than recomputing their tokens (the engine's own prefill timing) */
    PKV_SPILL_NEVER = 1,  /* drop and recompute, as without a disk tier */
    PKV_SPILL_ALWAYS = 2, /* spill whenever there is a page to spill */
} pkv_spill_mode;

/* Which proposals of the draft a step keeps (pkv_engine_params.draft_accept). */
typedef enum pkv_draft_accept {
    /* Sample-then-compare: the draft proposes its most likely tokens; the model's
     * row of each is sampled as plain decoding would sample it (the request's own
     * sampler, seeded), and a proposal is kept while the sample equals it. Every
     * request's tokens and log-probabilities are those of plain decoding, for any
     * sampler and seed. */
    PKV_DRAFT_ACCEPT_MATCH = 0,
    /* The speculative-sampling rule (pkv_spec's): each proposal d is drawn from q =
     * the request's sampler chain over the draft's logits, with the sample's own
     * sampler (seed + sample index); the model keeps d with probability
     * min(1, p(d)/q(d)), p = the chain over its row, else samples the residual
     * max(0, p - q) and the round ends; all kept: one more token sampled from the
     * next row. Each token has the distribution plain decoding gives it, and more
     * proposals are kept than by MATCH at temperature > 0, but the tokens for a
     * seed are not plain decoding's (they are reproducible for the same requests
     * and draft). With greedy sampling the tokens are plain decoding's. A request
     * with a grammar is verified by MATCH. */
    PKV_DRAFT_ACCEPT_SAMPLING = 1,
} pkv_draft_accept;

typedef struct pkv_engine_params {
    pkv_cache_params cache;  /* the engine's own KV cache: n_ctx is the per-sequence limit
                                (prompt + max_tokens <= n_ctx), n_pages the device pool,
                                host_pages the swap pool; n_seq_max 0 = 8 here */
    int max_batch_tokens;    /* tokens per step (decode tokens + prefill chunks); 0 = 256 */
    int max_seqs;            /* sequences per step; 0 = 64 */
    bool prefix_cache;       /* reuse cached prompt pages across requests (default true) */
    bool swap;               /* preempt by swapping to the host pool when it has room
                                (default true); false: always drop and recompute */
    /* Speculative decoding (docs/engine.md): a draft proposes up to draft_max tokens
     * per sequence and step, the step verifies them with the others' tokens, and
     * draft_accept says which are kept.
     * draft: NULL (off), an MTP head of the model (pkv_model_params.mtp: fed the
     * target's hidden states), Gemma 4's assistant, a draft model with the
     * model's vocabulary and its own cache, or a shared-KV draft (info.shared_kv:
     * attached to the model's cache, checked (I6) by pkv_engine_create; it drafts
     * on forks of the sequences); not owned, must outlive the engine. */
    pkv_model *draft;
    int draft_max;           /* proposals per sequence and step, 1..64; 0 = 4 */
    /* Preemption when the sequence cannot be swapped (the host pool is full, or swap
     * is off) and the cache has a disk tier (cache.disk_dir) and prefix_cache is on:
     * spill its full pages to disk before dropping it, so the resume loads them back
     * instead of recomputing them (docs/engine.md, "Spilling to disk"). */
    pkv_spill_mode spill;    /* default PKV_SPILL_AUTO */
    /* The acceptance rule of speculative decoding (with draft set). */
    pkv_draft_accept draft_accept; /* default PKV_DRAFT_ACCEPT_MATCH */
    /* Called on the stepping thread for every sampling round of a sequence while a
     * draft is set (NULL = none): r->pos is the position of the last committed
     * token the round went on from, r->proposed what the draft proposed after it
     * (n_proposed may be 0: a round with nothing proposed, such as the prompt's
     * first token or the last token of max_tokens) and r->n_accepted how many the
     * model kept; the round then commits those and one token of the model's own,
     * unless the request ended inside them. request_id is submit's id, sample the
     * sample's index. */
    void (*on_draft_round)(uint64_t request_id, int sample, const pkv_spec_round *r, void *user);
    void *draft_round_user;
    /* Run on this cache of the caller's (made for the model; not owned, must outlive
     * the engine) instead of making one: requests on contexts the caller made on it
     * (pkv_spec_* is such an engine over its target's cache). Its other sequences
     * stay the caller's; cache.n_ctx still sets the engine's per-sequence limit
     * (0 = min(training context, 4096)) and an own-cache draft's cache takes the
     * rest of `cache` (kv_type, page size) with this cache's pool sizes. NULL = make
     * one from `cache`. */
    pkv_kv_cache *use_cache;
    /* N-gram drafts (prompt-lookup decoding; docs/engine.md, "N-gram drafts"): no
     * draft model; a sequence whose next step decodes one pending token proposes
     * up to draft_max tokens: those that followed the most recent earlier
     * occurrence in its own tokens (prompt and generated) of its last n tokens,
     * the longest n from ngram_max down to ngram_min that occurs. Verified and
     * counted (draft_proposed / draft_accepted) as any draft's, by draft_accept's
     * rule. Not with draft. */
    bool draft_ngram;
    int ngram_min;           /* shortest n-gram looked up, 1..ngram_max; 0 = 2 */
    int ngram_max;           /* longest, ngram_min..PKV_ENGINE_MAX_NGRAM; 0 = 4 */
} pkv_engine_params;

#define PKV_ENGINE_MAX_NGRAM 16 /* pkv_engine_params.ngram_max */

pkv_engine_params pkv_engine_default_params(void);

/* An engine over model m (not owned; must outlive the engine) with its own cache.
 * Does not start a thread. NULL on failure (bad params, cache allocation). */
pkv_engine *pkv_engine_create(pkv_model *m, pkv_engine_params p);
/* Stops the engine thread if running, gives every unfinished sample its final
 * event (finish CANCELLED) on the calling thread, frees everything. NULL: no-op. */
void pkv_engine_free(pkv_engine *e);

/* Queue a request; *id (may be NULL) gets its id (> 0). Thread-safe. Checked here,
 * synchronously: NULL/empty prompt, a token id outside [0, n_vocab) (the message
 * names the index and value), n outside 1..64, max_tokens < 0, n_prompt +
 * max_tokens above the context limit, a request whose one sequence could never
 * fit the device pool (pages needed vs pages in the pool), bad sampling params,
 * top_logprobs or n_stop out of range: PKV_ERR_INVALID with a message naming the
 * sizes; PKV_ERR_NOMEM. On error nothing is queued and no callback is called.
 * Once accepted, the request always ends with final events (see
 * pkv_engine_event), never by a silent drop; lack of pages only delays it. */
pkv_status pkv_engine_submit(pkv_engine *e, const pkv_request_params *r, uint64_t *id);

/* Cancel a request from any thread. Its final events (finish CANCELLED) come from
 * the engine thread at the next step boundary, and its pages are freed then (full
 * pages stay in the prefix cache). PKV_ERR_NOT_FOUND when the id is unknown or
 * the request has finished already (its final events have been or are being
 * delivered). */
pkv_status pkv_engine_cancel(pkv_engine *e, uint64_t id);

/* One scheduling step on the calling thread: admit, cancel, preempt, run one
 * batched forward pass, sample, deliver events. *n_pending (may be NULL) gets the
 * requests not yet finished afterwards. PKV_ERR_INVALID while the engine thread
 * runs. Request failures go to the requests' final events, not to the return
 * value: it is an error only for misuse or an internal failure. */
pkv_status pkv_engine_step(pkv_engine *e, int *n_pending);

/* Start the engine thread: it steps while there is work and sleeps otherwise.
 * PKV_ERR_INVALID when already running. */
pkv_status pkv_engine_start(pkv_engine *e);
/* Stop the engine thread after its current step (requests stay queued; step or
 * start again to go on). No-op when not running. Not from a callback. */
pkv_status pkv_engine_stop(pkv_engine *e);

typedef struct pkv_engine_stats {
    int n_waiting;           /* requests submitted, not yet started */
    int n_running;           /* sequences (samples) holding device pages */
    int n_swapped;           /* sequences preempted to the host pool */
    int n_recompute;         /* sequences preempted by dropping their pages, to be recomputed */
    int n_requests;          /* requests not yet finished (waiting or started) */
    int64_t pages_total, pages_used, pages_free, pages_cached; /* device pool */
    int64_t pages_peak;      /* most pages used at once since creation */
    int64_t host_pages, host_free;
    uint64_t requests_submitted, requests_finished, requests_cancelled, requests_failed;
    uint64_t prompt_tokens;      /* prompt tokens of started requests */
    uint64_t prefix_hit_tokens;  /* of those, reused from the prefix cache */
    uint64_t computed_tokens;    /* tokens run through the model (prefill, decode, recompute) */
    uint64_t generated_tokens;   /* tokens sampled */
    uint64_t preemptions_swap, preemptions_recompute;
    uint64_t steps;              /* forward passes */
    double busy_seconds;         /* time spent in steps */
    double tokens_per_second;    /* generated tokens / busy_seconds (0 before any) */
    bool batch_invariant;        /* every device of the model claims caps.batch_invariant: a
                                    request's tokens do not depend on what it is batched with */
    uint64_t draft_proposed;     /* speculative decoding: proposals the model verified */
    uint64_t draft_accepted;     /* of those, kept (by the rule pkv_engine_params.draft_accept) */
    uint64_t draft_steps;        /* the draft's forward passes */
    uint64_t draft_disabled;     /* sequences that went on without the draft (its pool ran out) */
    uint64_t grammar_masks;      /* constrained output: masks of allowed tokens computed (one per
                                    sampled token of a request with a grammar) */
    double grammar_mask_seconds; /* the time those masks took (on the stepping thread) */
    /* Spilling preempted sequences to the disk tier (pkv_engine_params.spill); a
     * spilled sequence is also counted in preemptions_recompute (it is dropped and
     * resumed by a prefix match) and in n_recompute while it waits. */
    uint64_t preemptions_spill;    /* preemptions that spilled the sequence's pages */
    uint64_t spill_failed;         /* spills that failed (a write error, the tier off): recomputed */
    uint64_t spill_pages_written;  /* page files those spills wrote (pages already on disk are not) */
    uint64_t spill_bytes_written;
    uint64_t spill_pages_read;     /* pages resumed spilled sequences loaded back from disk */
    uint64_t spill_pages_resumed;  /* pages resumed spilled sequences found again (memory or disk) */
    double spill_write_seconds;    /* time the spills took (device read, file write, fsync, rename) */
    double spill_read_seconds;     /* time the resumed spilled sequences' prefix matches took */
    double prefill_seconds_per_token; /* the engine's measure of recompute: forward time per token of
                                     steps of at least a page of tokens (0 before one) */
    bool waiting_for_pages;  /* the last step's admission stopped at a waiting or preempted sequence
                                the pool had no room for (not at max_seqs or the token budget):
                                pages freed outside the engine would let it go on */
    uint64_t draft_skipped;  /* a shared-KV draft: rounds a sequence went without proposals because
                                the pool had no room for its fork's pages (it drafts again next round) */
    /* Idle contexts the engine owns (pkv_engine_context_hold) */
    uint64_t context_swap_outs; /* held idle contexts swapped out to the host pool to make room */
    uint64_t context_swap_ins;  /* contexts the engine swapped back in (at admission or release) */
    int n_contexts_held;        /* contexts held now */
    int n_contexts_swapped;     /* of them, in the host pool now */
} pkv_engine_stats;

/* A consistent snapshot, from any thread (as of the last step boundary for the
 * pool and sequence figures). Never fails; NULL arguments are ignored. */
void pkv_engine_stats_get(pkv_engine *e, pkv_engine_stats *out);

/* One KV sequence of an unfinished request (pkv_engine_seqs). */
typedef struct pkv_engine_seq_info {
    uint64_t request;  /* the request's id */
    void *user;        /* its pkv_request_params.user */
    int sample;        /* 0..n-1 */
    int32_t kv_seq;    /* its sequence in pkv_engine_cache(e) (resident or swapped) */
    bool on_context;   /* the request generates on a context (pkv_request_params.context) */
} pkv_engine_seq_info;
/* The KV sequences the engine's requests hold now (waiting samples and samples
 * dropped for recompute hold none), for live views of the cache: up to max
 * entries into out, the total into *n. Only from the thread that steps the engine
 * (pkv_engine_step), between steps, or while its thread is stopped: PKV_ERR_INVALID
 * while the engine thread runs. */
pkv_status pkv_engine_seqs(pkv_engine *e, pkv_engine_seq_info *out, int max, int *n);

/* Idle contexts the engine owns. A context on the engine's cache handed to it
 * with pkv_engine_context_hold is the engine's while idle: when admission or a
 * step is short of device pages, the engine swaps held contexts with no
 * unfinished request on them out to the host pool (pkv_kv_swap_out of the
 * context's sequence), least recently used first, before it preempts any
 * running request (of any priority); a context is taken only when its swap
 * frees device pages (pages shared with another sequence stay on the device and
 * get a host copy besides). A request submitted on a held context that is
 * swapped out is admitted after the engine swaps it back in (pkv_kv_swap_in),
 * waiting for pages like a preempted sequence. While held, the caller may read
 * the context (pkv_context_n_tokens, pkv_context_tokens, pkv_kv_seq_swapped,
 * pkv_kv_seq_page_stats) and submit requests on it, and must change it (free
 * it included: the engine's statistics read it) only after
 * pkv_engine_context_release or pkv_engine_context_drop. docs/engine.md,
 * "Idle contexts".
 *
 * Threads: like submit on a context, from the thread that steps the engine
 * between steps (not from an event callback), or while the engine thread is
 * stopped: PKV_ERR_INVALID while the engine thread runs or a step is in
 * progress. Each function: on error nothing is changed. */
enum {
    PKV_HOLD_UNSHARED = 1, /* swap it out only while none of its pages is shared: its host copy then never
                              holds a page twice (a page quota that counts device and host pages) */
};
/* Hand ctx (idle or with a request running on it) to the engine. flags: 0 or
 * PKV_HOLD_UNSHARED. PKV_ERR_INVALID: NULL, not on the engine's cache, held
 * already, an unknown flag; PKV_ERR_NOMEM. */
pkv_status pkv_engine_context_hold(pkv_engine *e, pkv_context *ctx, unsigned flags);
/* Take ctx back, resident: a swapped-out one is swapped in, the engine swapping
 * other idle held contexts out (least recently used first) when the pool is
 * short. PKV_ERR_OUT_OF_PAGES when the pool cannot hold it even then (it stays
 * held and swapped, though idle contexts swapped out trying stay out);
 * PKV_ERR_NOT_FOUND when ctx is not held. */
pkv_status pkv_engine_context_release(pkv_engine *e, pkv_context *ctx);
/* Take ctx back as it is, resident or swapped (to free it, or to swap it out
 * yourself). PKV_ERR_NOT_FOUND when ctx is not held. */
pkv_status pkv_engine_context_drop(pkv_engine *e, pkv_context *ctx);

/* The engine's cache and model, for tests and tools: use only from the stepping
 * thread while the engine thread is stopped. */
pkv_kv_cache *pkv_engine_cache(pkv_engine *e);
pkv_model *pkv_engine_model(pkv_engine *e);

/* ---------------------------------------------------------------- media */
/* (section owned by the media layer: src/media/; docs/multimodal.md) Audio and
 * images into the text model: decoded media, a projector file (an "mmproj" GGUF as
 * llama.cpp's convert_hf_to_gguf.py --mmproj writes it) whose encoder turns them
 * into rows of the text model's width, and those rows in the paged cache. */

typedef enum pkv_media_kind { PKV_MEDIA_AUDIO = 1, PKV_MEDIA_IMAGE = 2 } pkv_media_kind;

/* Decoded media (borrowed pointers): audio as mono float samples in [-1, 1] at
 * rate Hz; an image as 8-bit RGB, rows top to bottom, width * 3 bytes each. */
struct pkv_media {
    pkv_media_kind kind;
    const float *samples;
    int64_t n_samples;
    int rate;
    const uint8_t *rgb;
    int width, height;
};

/* Limits on input media; 0 in a field = its default. */
typedef struct pkv_media_limits {
    size_t max_bytes;         /* encoded file size; default 64 MiB */
    double max_audio_seconds; /* default 1800 (30 minutes) */
    int64_t max_pixels;       /* width * height; default 50 megapixels */
} pkv_media_limits;

/* Decode a WAV, FLAC or Ogg file image to mono float at rate Hz (channels averaged,
 * resampled with soxr when the file's rate differs). *samples is freed with
 * pkv_media_free. lim may be NULL (defaults). Errors name what is wrong (truncated
 * header, unsupported sample format, too long). */
pkv_status pkv_audio_decode(const void *data, size_t size, int rate, const pkv_media_limits *lim,
                            float **samples, int64_t *n_samples);
/* Decode a PNG or JPEG file image to 8-bit RGB (alpha dropped, gray expanded).
 * *rgb is freed with pkv_media_free. */
pkv_status pkv_image_decode(const void *data, size_t size, const pkv_media_limits *lim, uint8_t **rgb,
                            int *width, int *height);
void pkv_media_free(void *p);

/* What a file's header says, read without decoding it (cheap: checked against the
 * limits before any decode). */
typedef struct pkv_media_probe_info {
    pkv_media_kind kind;
    double seconds;    /* audio: the length the header gives (WAV: its data size; FLAC:
                          STREAMINFO's total; Ogg: the last page's granule); < 0 = not known */
    int rate;          /* audio: the file's sample rate; 0 = not known */
    int width, height; /* images: from the PNG IHDR or the JPEG start of frame; 0 = not known */
} pkv_media_probe_info;
/* Probe a file image of the given kind. Headers only: a length or size the header
 * does not give is left "not known" (decoding still enforces the limits). A WAV's
 * chunk errors are those pkv_audio_decode reports. */
pkv_status pkv_media_probe(const void *data, size_t size, pkv_media_kind kind, pkv_media_probe_info *out);

/* A content hash of decoded media (its kind, shape and every sample or pixel): the
 * key under which its rows enter the prefix cache. */
uint64_t pkv_media_hash(const pkv_media *m);
/* The key of a chunk's rows: the media's content hash mixed with the projector's
 * fingerprint (pkv_mmproj_info.fingerprint), so the same picture through another
 * projector is other rows. */
uint64_t pkv_media_key(uint64_t media_hash, uint64_t projector_fingerprint);
/* The token id standing for row `row` of the chunk with this key in a sequence:
 * negative and <= -2 (-1 means "no token id"), derived from the key and the row.
 * Such ids never reach the tokenizer, sampler or grammar. */
int32_t pkv_media_token(uint64_t key, int32_t row);
/* true for ids made by pkv_media_token. */
bool pkv_token_is_media(int32_t id);

typedef struct pkv_mmproj pkv_mmproj;

typedef struct pkv_mmproj_info {
    pkv_media_kind kind;   /* what it encodes */
    const char *projector; /* clip.projector_type: "voxtral", "gemma3" */
    int n_embd;            /* width of its output rows: the text model's n_embd */
    int n_embd_enc;        /* the encoder's width */
    int n_layer;           /* encoder blocks */
    int sample_rate;       /* audio: the rate it takes (16000); 0 for images */
    int image_size;        /* images: the square side it takes; 0 for audio */
    bool non_causal;       /* its rows attend to each other both ways in the text model (gemma3 images) */
    uint64_t fingerprint;  /* identifies the file's weights and parameters (part of every media key) */
    /* The text the model expects before / after each medium's rows in a prompt, as
     * llama.cpp's mtmd puts it (special tokens: tokenize it with them parsed); ""
     * = none, never NULL. Voxtral: "[BEGIN_AUDIO]" and ""; gemma3:
     * "<start_of_image>" and "<end_of_image>". Static text, valid for the process. */
    const char *text_before, *text_after;
} pkv_mmproj_info;

/* Load a projector file onto dev (NULL = the CPU). With text_model given, the two
 * are checked to fit (output width == the model's n_embd, the projector type meant
 * for the model's architecture): the error names both values. NULL on failure with
 * the reason in pkv_errmsg(). */
pkv_mmproj *pkv_mmproj_load(const char *path, const pkv_model *text_model, pkv_device *dev);
void pkv_mmproj_free(pkv_mmproj *p);
pkv_status pkv_mmproj_get_info(const pkv_mmproj *p, pkv_mmproj_info *info);
/* Rows the encoder makes for m (audio: 375 per started 30-second window for voxtral;
 * images: 256 for gemma3). */
pkv_status pkv_mmproj_n_rows(const pkv_mmproj *p, const pkv_media *m, int64_t *n_rows);
/* Encode m: out receives f32 [n_rows][info.n_embd] (n_rows from pkv_mmproj_n_rows). */
pkv_status pkv_mmproj_encode(pkv_mmproj *p, const pkv_media *m, float *out, int64_t n_rows);
/* pkv_mmproj_encode in slices, so a caller can do other work between them (the
 * server runs one slice between engine steps): begin checks as encode does and
 * allocates; each step does one slice (audio: the log-mel of one 30-second
 * window, and once all have theirs, the encoder on one window; an image: all of
 * it) and sets *done after the last. m and out must stay valid until the job is freed. The rows equal
 * pkv_mmproj_encode's. After a failed step the job is over (free it). */
typedef struct pkv_mmproj_job pkv_mmproj_job;
pkv_status pkv_mmproj_encode_begin(pkv_mmproj *p, const pkv_media *m, float *out, int64_t n_rows, pkv_mmproj_job **job);
pkv_status pkv_mmproj_encode_step(pkv_mmproj_job *job, bool *done);
void pkv_mmproj_job_free(pkv_mmproj_job *job);

#ifdef __cplusplus
}
#endif

#endif /* PAGEKV_H */
