/* Internals of the paged KV cache (src/kv/). Only the kv layer and its tests include it.
 *
 * Storage: each storage device gets one "arena" buffer (more when a device's
 * largest buffer is too small) holding, at its own offset, the K array and the V
 * array of every (layer, shard) stored there. Every such array is page-major:
 *     dtype [n_pages][page_size][n_heads_of_shard][head_dim]
 * (a quantized dtype stores each head's row as head_dim / 32 blocks), so page p
 * of an array starts at off + p * page_bytes. Batched operations (COW,
 * shift, clear) therefore need one pkv_buffer_copy_regions per arena.
 *
 * Sequences: a block table is a chain of immutable, reference-counted nodes of
 * full pages (shared structurally between forks) followed by the sequence's own
 * pages (the last one may be partial). Fork freezes the parent's own full pages
 * into a node, so it is O(1) in the context length. */
#ifndef PKV_KV_IMPL_H
#define PKV_KV_IMPL_H

#include <string.h>

#include "base/base.h"
#include "device/device.h"

/* One K or V array of one (layer, shard). */
typedef struct kv_array {
    int layer, shard;
    bool is_v;
    int arena;
    size_t off;        /* bytes: page 0 inside the arena buffer */
    size_t row_bytes;  /* one token: n_heads * head_dim * element size */
    size_t page_bytes; /* page_size * row_bytes */
    size_t host_off;   /* bytes: page 0 inside the host swap pool */
} kv_array;

typedef struct kv_arena {
    pkv_device *dev;
    pkv_buffer *buf; /* [size] bytes holding several kv_arrays */
    size_t size;
    /* Host swap pool of this arena's arrays when the device's memory is host
     * memory (a CPU device): a buffer on the same device, so a swap is one
     * batched, parallel pkv_buffer_copy_regions per arena. NULL otherwise. */
    pkv_buffer *host_buf;
    size_t host_size;
} kv_arena;

typedef struct kv_shard {
    pkv_device *storage, *compute;
    int head_begin, n_heads;
    int k_array, v_array; /* indices into pkv_kv_cache.arrays */
    int s_array;          /* recurrent layer: index into pkv_kv_cache.st_arrays; -1 otherwise */
} kv_shard;

/* The state array of one recurrent (layer, shard): slot i at off + i * slot_bytes
 * of its state arena's buffer. */
typedef struct kv_state_array {
    int layer, shard;
    int arena;         /* index into pkv_kv_cache.st_arenas */
    size_t off;        /* bytes: slot 0 */
    size_t slot_bytes; /* n_heads * state_per_head * 4 */
    size_t host_off;   /* bytes: this array's part of a swapped sequence's host copy */
} kv_state_array;

/* One state slot. refs counts holders: a live state (1), or, for a checkpoint,
 * the sequences' checkpoint lists and the prefix-index page it is offered at.
 * References are (slot, gen): a checkpoint evicted for room bumps gen, so the
 * references still held elsewhere stop matching (and are pruned lazily). */
typedef struct kv_slot {
    int32_t refs;       /* 0 = free */
    uint32_t gen;       /* bumped whenever the slot is freed or evicted */
    bool ckpt;          /* holds a checkpoint: on the checkpoint list, evictable */
    int64_t pos;        /* checkpoint: tokens the state had taken in */
    int32_t prev, next; /* checkpoint list, oldest first */
} kv_slot;

/* A sequence's reference to a checkpoint. */
typedef struct kv_ckpt {
    int64_t pos;
    int32_t slot;
    uint32_t gen;
} kv_ckpt;

/* A sequence's recurrent state (main cache of a cache with recurrent layers). */
typedef struct kv_seq_state {
    int32_t slot;   /* live state slot; -1 when swapped (or no recurrent layers) */
    int64_t len;    /* tokens the live state has taken in (<= n_tokens) */
    kv_ckpt *ckpt;  /* [n_ckpt] ascending pos; may hold stale (evicted) entries */
    int n_ckpt, cap_ckpt;
    uint8_t *host;  /* swapped out: the live state, st_arrays in order, [state_slot_bytes] */
} kv_seq_state;

typedef struct kv_layer {
    int n_kv_heads, dk, dv;
    pkv_type tk, tv;  /* K and V dtypes: f32, f16, q8_0, q4_0 */
    size_t hk, hv;    /* bytes of one head's K / V row: pkv_type_row_bytes(tk, dk), (tv, dv) */
    int n_shards;
    kv_shard *shards; /* [n_shards], sorted by head_begin; k_array/v_array -1 in the
                         cache of the other pool (see `sub` below) */
    int window;       /* tokens; 0 = full attention (a chunked layer: its chunk) */
    int chunk;        /* tokens; 0 = not chunked (pkv_kv_layer_desc.chunk) */
    float freq_base, freq_scale; /* RoPE of this layer's K (re-rotation on shift) */
    float yarn_ext, yarn_corr[2]; /* YaRN's mix and correction range for it (pkv_k_rope_args); 0 = none */
    int n_rot, n_pairs;           /* rotated dims of K (0 = the cache's); pairs that turn (0 = all) */
    bool nope;                    /* K is not rotated (pkv_kv_layer_desc.rope_none): a shift leaves it */
    bool v_in_k;                  /* MLA: V is the head of each K row: no V array (hv 0, v_array -1) */
    int rope_off;                 /* K's rotated dims start here (pkv_kv_layer_desc.rope_off) */
    bool other_rank;              /* another MPI rank holds it: no K/V arrays here (pkv_kv_params.on_other_rank) */
    int state_per_head; /* > 0: recurrent layer: no K/V (dk = dv = 0), a state per sequence */
    int n_parts;        /* recurrent: parts of a head's state, 0 = one (pkv_kv_layer_desc.state_part) */
    int part[PKV_KV_STATE_MAX_PARTS]; /* floats of each part; they sum to state_per_head */
} kv_layer;

struct pkv_kv_layout {
    int n_layers, page_size;
    kv_layer *layers; /* [n_layers] */
    float *rope_ff;   /* [n_ff]: LongRoPE's frequency factors of K (pkv_kv_params.rope_factors); NULL = none */
    int n_ff;
    uint64_t fingerprint;
};

/* Host-side record of one device page. */
typedef struct kv_page {
    int32_t refs;               /* holders: sequences' own lists and nodes */
    int32_t lru_prev, lru_next; /* cached list (refs == 0 && indexed) */
    int32_t hnext;              /* prefix-index bucket chain */
    int32_t prev_page;          /* indexed: predecessor page in its chain, -1 for the first */
    uint32_t gen;               /* bumped when the page leaves the index */
    uint32_t prev_gen;          /* gen of prev_page when this page was indexed */
    bool indexed;
    bool free;
    uint64_t key; /* chained hash */
    uint64_t fp;  /* fingerprint of the producer */
    /* Window pool: the main-pool page of the same sequence and index that was
     * indexed when this one was (its id and gen), or -1. A prefix hit in the window
     * pool is trusted through it: the main pool verified that page's whole prefix. */
    int32_t link;
    uint32_t link_gen;
    /* Main pool of a cache with recurrent layers: the checkpoint of the state after
     * this page (the last of its indexed prefix), offered to prefix matching; -1
     * none. Released when the page leaves the index. */
    int32_t st_slot;
    uint32_t st_gen;
    /* Disk tier (kv-disk.c), set when the page is indexed: the chained key of its
     * predecessor (the seed of `key`), a second chained hash with another seed, and
     * whether its file is known to be on disk. */
    uint64_t prev_key, key2;
    bool on_disk;
    bool on_remote; /* remote tier (kv-redis.c): published (or skipped) since it was indexed */
} kv_page;

typedef struct kv_node {
    int32_t refs; /* sequences and child nodes holding it */
    struct kv_node *parent; /* pages before this node, or NULL */
    int64_t n_before;       /* pages in the parent chain */
    int64_t n;              /* pages in this node */
    int32_t *pages;         /* [n] full pages; the node holds one reference on each */
} kv_node;

typedef struct kv_seq {
    bool live, swapped;
    uint64_t fp;
    int64_t n_tokens;
    kv_node *prefix;  /* shared full pages [0, n_prefix), or NULL */
    int64_t n_prefix; /* pages */
    int32_t *own;     /* pages [n_prefix, n_prefix + n_own); one reference each */
    size_t n_own, cap_own;
    int64_t pub_n;    /* leading full pages published to the prefix index */
    bool pub_stop;    /* page pub_n cannot be published (unknown tokens) */
    int64_t exact_until; /* tokens from here on were moved by a shift: their KV is not
                            what a fresh forward pass computes, so never published */
    int64_t n_hole;   /* window pool: leading pages released (their entries are -1) */
    /* swapped out: */
    int32_t *host;    /* [ceil(n_tokens / page_size)] host pool pages */
    int32_t *sw_tok, *sw_pos; /* [n_tokens] */
    kv_seq_state st; /* recurrent state; kept by pkv_kv_seq_release (kv-state.c owns it) */
    /* Media chunks (kv-media.c), main cache only: [n_media] ascending start, not
     * overlapping; their tokens hold pkv_media_token(key, row). */
    pkv_kv_media *media;
    int n_media, cap_media;
} kv_seq;

struct pkv_kv_cache {
    pkv_kv_layout layout; /* every layer; this cache has arrays only for its pool's layers */
    /* Two pools when some layers have a window (kv-window.c): the cache the user
     * holds keeps the full-attention layers and owns `sub`, a cache of the same
     * layout, page size and sequence ids holding the window layers, whose
     * sequences release pages that have left the window. */
    struct pkv_kv_cache *sub, *main; /* main: set in the sub-cache only */
    int window;                      /* sub-cache: the largest layer window; 0 in the main one */
    int64_t keep;                    /* sub-cache: tokens kept behind the end (window + page_size) */
    int page_size;
    int n_rot;
    bool neox;
    float freq_base, freq_scale;

    kv_arena *arenas;
    int n_arenas;
    kv_array *arrays; /* [n_arrays]: K and V of every (layer, shard) */
    int n_arrays;
    size_t page_bytes_all; /* one page of every array */

    /* page pool */
    int64_t n_pages;
    kv_page *pages;      /* [n_pages] */
    int32_t *tok, *pos;  /* [n_pages][page_size] token ids and positions */
    int32_t *free_stack; /* [n_pages] */
    int64_t n_free;
    int32_t lru_head, lru_tail; /* oldest first */
    int64_t n_cached;
    int32_t *buckets; /* [n_buckets] prefix index heads */
    uint64_t n_buckets;

    /* sequences */
    kv_seq *seqs;
    size_t n_seqs, cap_seqs;
    int n_live;

    /* host swap pool: every array mirrored, dtype [host_pages][page_size][...],
     * in arena host buffers (host_on_device) or in plain host memory `host` */
    bool host_on_device;
    uint8_t *host;
    int64_t host_pages, host_free;
    uint8_t *host_used; /* [host_pages] */

    /* scratch for block tables */
    int32_t *bt_indptr, *bt_pages, *bt_last, *bt_len, *bt_tok_indptr, *bt_pos;
    size_t cap_seqs_bt, cap_pages_bt, cap_pos_bt;

    /* Recurrent state (kv-state.c), in the main cache only; n_slots 0 without
     * recurrent layers. */
    int n_state_layers;
    kv_state_array *st_arrays; /* [n_st_arrays]: every recurrent (layer, shard) */
    int n_st_arrays;
    kv_arena *st_arenas;       /* [n_st_arenas] (dev, buf, size only) */
    int n_st_arenas;
    size_t state_slot_bytes;   /* one slot of every state array */
    int64_t n_slots;
    kv_slot *slots;            /* [n_slots] */
    int32_t *slot_free;        /* [n_slots] free stack */
    int64_t n_slot_free;
    int32_t ck_head, ck_tail;  /* checkpoint slots, oldest first */
    int64_t n_ck;
    int ckpt_interval, ckpt_max;

    pkv_kv_stats stats;
    struct kv_disk *disk;     /* disk tier (kv-disk.c), main cache only; NULL = none */
    struct kv_remote *remote; /* remote tier (kv-redis.c), main cache only; NULL = none */
    int64_t tier_pending; /* pages that became cached since the last flush (maybe not on disk or remote) */
};

/* Test hook (tests only): when true every prefix hash is the same value, so every
 * lookup walks one bucket and only the token comparison separates pages. */
extern bool pkv_kv_test_hash_collide;
/* Test hook: keep the host swap pool in plain host memory even for CPU devices
 * (the path every non-host device takes). Read at cache creation. */
extern bool pkv_kv_test_plain_host_pool;

/* layout (kv-layout.c) */
pkv_status pkv_kv_layout_init(pkv_kv_layout *l, const pkv_kv_params *p);
void pkv_kv_layout_release(pkv_kv_layout *l);
uint64_t pkv_kv_geometry_hash(int n_layers, int page_size, const int32_t *geom /* [n_layers][4] */);

/* pool (kv-pool.c) */
pkv_status pkv_kv_pool_init(pkv_kv_cache *c);
void pkv_kv_pool_release(pkv_kv_cache *c);
int64_t pkv_kv_pool_available(const pkv_kv_cache *c); /* free + evictable */
/* Take n pages (caller checked availability), each with refs = 1, sorted ascending. */
void pkv_kv_pool_take(pkv_kv_cache *c, int64_t n, int32_t *out);
void pkv_kv_page_ref(pkv_kv_cache *c, int32_t p);
/* Drop one reference; returns true when the page went back to the free list. */
bool pkv_kv_page_unref(pkv_kv_cache *c, int32_t p);
void pkv_kv_pool_reset(pkv_kv_cache *c); /* everything free, index empty */

/* prefix index (kv-prefix.c) */
void pkv_kv_index_remove(pkv_kv_cache *c, int32_t p);
/* Put page p (not indexed) into the prefix index under key, after page prev (-1: first). */
void pkv_kv_index_page(pkv_kv_cache *c, int32_t p, uint64_t key, uint64_t fp, int32_t prev);
void pkv_kv_seq_publish(pkv_kv_cache *c, kv_seq *s);
/* Publish only the full pages within the sequence's first n tokens: those whose
 * K/V is known to be written (a rollback drops the rest unwritten). */
void pkv_kv_seq_publish_upto(pkv_kv_cache *c, kv_seq *s, int64_t n);
/* media chunks (kv-media.c) */
/* n_keep, or the start of the chunk n_keep falls strictly inside. */
int64_t pkv_kv_media_cut(const kv_seq *s, int64_t n_keep);
/* Records of chunks ending after n dropped. */
void pkv_kv_media_truncate(kv_seq *s, int64_t n);
/* PKV_ERR_INVALID when removing [start, start + n_remove) and moving what follows
 * would cut a chunk. */
pkv_status pkv_kv_media_shift_check(const kv_seq *s, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta);
void pkv_kv_media_shift_apply(kv_seq *s, int64_t start, int64_t n_remove);
pkv_status pkv_kv_media_copy(kv_seq *dst, const kv_seq *src);
void pkv_kv_media_release(kv_seq *s);
/* Check records against a sequence's tokens: in range, ascending, not
 * overlapping, each row's id pkv_media_token(key, row), and every media id inside a
 * chunk. what/who name the source in messages. */
pkv_status pkv_kv_media_verify(const pkv_kv_media *m, int n_media, const int32_t *tokens, int64_t n_tokens,
                               const char *what, bool every_id);
uint64_t pkv_kv_page_key(const pkv_kv_cache *c, uint64_t seed, const int32_t *tok, const int32_t *pos);

/* sequences (kv-seq.c) */
kv_seq *pkv_kv_seq_get(pkv_kv_cache *c, int32_t id, const char *what);
kv_seq *pkv_kv_seq_resident(pkv_kv_cache *c, int32_t id, const char *what);
int64_t pkv_kv_seq_pages(const pkv_kv_cache *c, const kv_seq *s);
int32_t pkv_kv_seq_page(const kv_seq *s, int64_t i);
void pkv_kv_seq_flatten(const kv_seq *s, int64_t n, int32_t *out); /* first n pages */
void pkv_kv_node_unref(pkv_kv_cache *c, kv_node *n);
/* Make s hold only its first keep_pages pages plus tail[n_tail] (already owned),
 * with n_tokens tokens. prepare allocates (may fail, changes nothing); apply
 * cannot fail. */
typedef struct kv_keep_plan {
    int32_t *arr; /* non-NULL: a flattened own list replacing the node chain */
    size_t cap;
    int64_t keep;
} kv_keep_plan;
pkv_status pkv_kv_keep_prepare(pkv_kv_cache *c, kv_seq *s, int64_t keep_pages, int64_t n_tail, int64_t n_tokens,
                               kv_keep_plan *plan);
void pkv_kv_keep_apply(pkv_kv_cache *c, kv_seq *s, kv_keep_plan *plan, const int32_t *tail, int64_t n_tail,
                       int64_t n_tokens);
pkv_status pkv_kv_seq_alloc_slot(pkv_kv_cache *c, int32_t *id);
/* Slot id of pool c (from pkv_kv_seq_alloc_slot) becomes a live sequence owning
 * pages[n_pages] (taken over; the first n_hole of them released window pages, -1),
 * with no state slot. */
void pkv_kv_seq_adopt(pkv_kv_cache *c, int32_t id, uint64_t fp, int64_t exact_until, int64_t n_tokens, int64_t n_hole,
                      int32_t *pages, int64_t n_pages);
/* A sequence made by pkv_kv_seq_adopt goes again: its pages back, not live. */
void pkv_kv_seq_unadopt(pkv_kv_cache *c, int32_t id);
void pkv_kv_seq_release(pkv_kv_cache *c, kv_seq *s); /* drop every page and host page, keep the slot */

/* The per-pool operations behind the public ones (the memory kinds below run
 * them on the cache and on its window sub-cache). */
pkv_status kv1_seq_create(pkv_kv_cache *c, uint64_t fingerprint, int32_t *seq);
pkv_status kv1_seq_free(pkv_kv_cache *c, int32_t seq);
pkv_status kv1_append_batch(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                            const int32_t *tokens, const int32_t *pos, int32_t *rows);
pkv_status kv1_block_table_get(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, bool with_positions,
                               pkv_kv_block_table *out);
pkv_status kv1_fork(pkv_kv_cache *c, int32_t parent, int32_t *child);
pkv_status kv1_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep);
pkv_status kv1_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta);
pkv_status kv1_seq_clear(pkv_kv_cache *c, int32_t seq);
pkv_status kv1_clear(pkv_kv_cache *c);
pkv_status kv1_swap_out(pkv_kv_cache *c, int32_t seq);
pkv_status kv1_swap_in(pkv_kv_cache *c, int32_t seq);
pkv_status kv1_prefix_match(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                            int64_t *n_matched);
void kv1_stats(const pkv_kv_cache *c, pkv_kv_stats *out);
/* Window pool: pages of a sequence of len tokens that no later query can see
 * (wholly before len + 1 - keep). */
static inline int64_t kv_window_first_page(const pkv_kv_cache *c, int64_t len) {
    int64_t first = len + 1 - c->keep;
    return first > 0 ? first / c->page_size : 0;
}
struct kv_file;
/* A saved file's window span [wf, wl) is sound (window: the cache has window
 * layers; else it must be 0, n_tokens) (kv-window.c). */
pkv_status pkv_kv_window_span_check(const struct kv_file *f, uint64_t wf, uint64_t wl, bool window);
/* Window pool: give back the pages of s before page `upto` (kv-window.c). */
pkv_status pkv_kv_window_drop(pkv_kv_cache *sub, kv_seq *s, int64_t upto);

/* recurrent state (kv-state.c). Its memory kind (kv_kind_state) calls these on
 * the main cache; each is a no-op (PKV_OK) when the cache has no recurrent layers. */
static inline bool kv_has_state(const pkv_kv_cache *c) { return c && c->n_slots > 0; }
pkv_status pkv_kv_state_init(pkv_kv_cache *c, const pkv_kv_params *p);
void pkv_kv_state_free(pkv_kv_cache *c);
/* Slots that can be had: free ones plus checkpoints that could be evicted. */
int64_t pkv_kv_state_available(const pkv_kv_cache *c);
/* A zeroed live slot for a new or emptied sequence (PKV_ERR_NOMEM naming state_slots
 * when none can be had; nothing changes then). */
pkv_status pkv_kv_state_seq_new(pkv_kv_cache *c, int32_t seq);
/* An emptied sequence (seq_clear): no checkpoint, no host copy, a zeroed live slot
 * (taken when it had none: the caller checked pkv_kv_state_available), len = 0. */
pkv_status pkv_kv_state_seq_empty(pkv_kv_cache *c, int32_t seq);
/* Drop the live slot, the checkpoints and the host copy; len = 0. */
void pkv_kv_state_seq_release(pkv_kv_cache *c, kv_seq *s);
/* Take a slot (evicting the oldest checkpoint when none is free); -1 when none. */
int32_t pkv_kv_state_slot_take(pkv_kv_cache *c);
void pkv_kv_state_slot_unref(pkv_kv_cache *c, int32_t slot, uint32_t gen);
/* The state as it was after n_keep tokens (truncate / shift from n_keep): when the
 * live state has taken in more, the last checkpoint at or before n_keep goes back
 * into the live slot (or zero), later checkpoints are dropped. */
pkv_status pkv_kv_state_rewind(pkv_kv_cache *c, int32_t seq, int64_t n_keep);
/* Fork: child (already created by the pools) gets a copy of parent's live state
 * and shares its checkpoints. */
pkv_status pkv_kv_state_fork(pkv_kv_cache *c, int32_t parent, int32_t child);
/* Swap: the live state to a host copy (nothing changes on error) and back. The
 * _commit / _abort halves run after the pools' swap succeeded / failed. */
pkv_status pkv_kv_state_swap_out_prepare(pkv_kv_cache *c, int32_t seq, uint8_t **host);
void pkv_kv_state_swap_out_commit(pkv_kv_cache *c, int32_t seq, uint8_t *host);
pkv_status pkv_kv_state_swap_in_prepare(pkv_kv_cache *c, int32_t seq, int32_t *slot);
void pkv_kv_state_swap_in_commit(pkv_kv_cache *c, int32_t seq, int32_t slot);
/* Prefix match: is the state after n_tokens tokens stored at indexed page `page`
 * (the last page of those tokens)? */
bool pkv_kv_state_stored(const pkv_kv_cache *c, int32_t page, int64_t n_tokens);
/* Take the state stored after the sequence's page m - 1 into its live slot. */
pkv_status pkv_kv_state_prefix_take(pkv_kv_cache *c, int32_t seq, int64_t m);
/* A page leaves the prefix index: release the state stored at it. */
void pkv_kv_state_page_drop(pkv_kv_cache *c, int32_t page);
/* The disk tier's states (kv-disk.c): the bytes of one sequence's states in the
 * canonical order (every recurrent layer's [n_kv_heads][state_per_head], layers in
 * order; 0 without recurrent layers); whether page offers a state to prefix
 * matching (and at which position); that state read into canon; and a state from
 * canon offered by page at pos, as a checkpoint held by the page (nothing when the
 * page has one already or no slot can be had: the match then ends earlier). */
size_t pkv_kv_state_canon_bytes(const pkv_kv_cache *c);
bool pkv_kv_state_page_offered(const pkv_kv_cache *c, int32_t page, int64_t *pos);
pkv_status pkv_kv_state_page_read(pkv_kv_cache *c, int32_t page, uint8_t *canon);
pkv_status pkv_kv_state_page_offer(pkv_kv_cache *c, int32_t page, const uint8_t *canon, int64_t pos);
/* The cache was cleared: every sequence empty with a zeroed live slot (checked
 * beforehand with pkv_kv_state_clear_check), no checkpoint. */
pkv_status pkv_kv_state_clear_check(const pkv_kv_cache *c);
pkv_status pkv_kv_state_clear(pkv_kv_cache *c);
/* Between one shard's slot image (the shard's heads [h0, h0 + nh), part-major when
 * the layer has parts) and the layer's canonical state ([n_kv_heads][state_per_head],
 * each head's parts concatenated): to_slot fills slot from canon, else canon from slot. */
void pkv_kv_state_permute(const kv_layer *L, int h0, int nh, uint8_t *slot, uint8_t *canon, bool to_slot);
/* Move slot `slot` of every state array to / from host bytes [state_slot_bytes]
 * (st_arrays in order, each its shard's slot image as the kernels see it). */
pkv_status pkv_kv_state_read(pkv_kv_cache *c, int32_t slot, uint8_t *host);
pkv_status pkv_kv_state_write(pkv_kv_cache *c, int32_t slot, const uint8_t *host);

/* A stored page (kv-page-image.c): the disk tier's page file and the remote
 * tier's value are one image format, described there. */
#define PKV_PIMG_HEADER 72
typedef struct kv_pimg {
    size_t base_bytes;  /* an image without a window or state section */
    size_t win_bytes;   /* a window section (the window pool's layers); 0 without sliding-window layers */
    size_t state_bytes; /* a state section (u64 pos, the canonical states); 0 without recurrent layers */
    size_t max_bytes;   /* with every section */
    int page_size, n_sect;
    size_t *sect;     /* [n_sect]: bytes of each layer's K and V section in the main pool, in image order */
    size_t *wsect;    /* [n_sect]: the same in the window pool (its section) */
    size_t tmp_bytes; /* one page of the largest array: the scratch of encode and install */
} kv_pimg;
/* The image geometry of cache c; what names the tier in the message. */
pkv_status pkv_kv_pimg_supported(const pkv_kv_cache *c, const char *what);
pkv_status pkv_kv_pimg_init(kv_pimg *g, const pkv_kv_cache *c, const char *what);
void pkv_kv_pimg_release(kv_pimg *g);
/* What page id's image will carry: the window pool's page beside it (win, -1 =
 * none) and the state the page offers to prefix matching (has_state, at spos). */
typedef struct kv_pimg_plan {
    int32_t win;
    bool has_state;
    int64_t spos;
    size_t bytes; /* the image's */
} kv_pimg_plan;
kv_pimg_plan pkv_kv_pimg_plan(const pkv_kv_cache *c, const kv_pimg *g, int32_t id);
/* Page id (indexed) into img [plan.bytes], its rows read off the device through
 * tmp [tmp_bytes]; the checksum is left to pkv_kv_pimg_seal (a writer thread's work). */
pkv_status pkv_kv_pimg_encode(pkv_kv_cache *c, const kv_pimg *g, int32_t id, kv_pimg_plan plan, uint8_t *img,
                              uint8_t *tmp);
void pkv_kv_pimg_seal(const kv_pimg *g, uint8_t *img, size_t bytes);
/* NULL when image b[n] is the page of producer fp with these chain keys, tokens
 * and positions (and is whole: size, magic, version, layout, checksum); else why not. */
const char *pkv_kv_pimg_check(const pkv_kv_cache *c, const kv_pimg *g, const uint8_t *b, size_t n, uint64_t fp,
                              uint64_t key, uint64_t prev_key, uint64_t key2, const int32_t *tk, const int32_t *pp);
/* A checked image's state section when it holds the state after `end` tokens, else NULL. */
const uint8_t *pkv_kv_pimg_state(const kv_pimg *g, const uint8_t *b, size_t n, int64_t end);
/* A checked image as page dep of s's match (s holds pages [0, dep)): a page taken
 * from the pool, its rows written through tmp, indexed under keys[dep]; with a
 * window section also a window-pool page beside it (cached, linked to it: what a
 * hit on a sliding model needs; skipped when that pool has no page to spare). On
 * error (PKV_ERR_OUT_OF_PAGES without a page to take) nothing is changed. */
pkv_status pkv_kv_pimg_install(pkv_kv_cache *c, const kv_pimg *g, kv_seq *s, const uint8_t *b, int64_t dep,
                               const uint64_t *keys, uint64_t key2, uint8_t *tmp, int32_t *out);

/* The window pool's page published beside main-pool page mp (kv-window.c), or -1. */
int32_t pkv_kv_window_linked(const pkv_kv_cache *c, int32_t mp);

/* disk tier (kv-disk.c) */
extern bool pkv_kv_test_disk_fail_write; /* test hook: every page write fails as a full disk would */
/* Open the directory (lock, marker, index of its page files); PKV_OK and nothing
 * done when p->disk_dir is NULL. On error c->disk stays NULL. */
pkv_status pkv_kv_disk_open(pkv_kv_cache *c, const pkv_kv_params *p);
void pkv_kv_disk_close(pkv_kv_cache *c); /* flushes first */
/* Queue every cached page not on disk for the writer thread (pkv_kv_disk_flush
 * without the wait); false when the queue filled first (the rest at the next call). */
bool pkv_kv_disk_queue(pkv_kv_cache *c);
/* Page `id` (indexed) is about to be evicted or has become cached: write it unless on disk. */
void pkv_kv_disk_put(pkv_kv_cache *c, int32_t id);
/* Prefix match continued on disk: s holds m matched pages (own list, referenced);
 * keys[0..n_full) are the request's chained keys. Loads pages m, m+1, ... while
 * their files exist and verify; returns the new count of matched pages. */
int64_t pkv_kv_disk_match(pkv_kv_cache *c, kv_seq *s, const int32_t *tokens, const int32_t *pos, int64_t m,
                          int64_t n_full, const uint64_t *keys);
void pkv_kv_disk_stats(const pkv_kv_cache *c, pkv_kv_stats *out);
/* Spilling a preempted sequence (the engine, when the host pool is full): its
 * leading full pages that are in the prefix index are written to the disk tier and
 * waited for, so that after the sequence is freed a prefix match finds every one
 * again, in memory or on disk. *n_pages: those pages now on disk (from the first);
 * *n_written / *bytes: the files this call wrote. PKV_ERR_IO when the tier is off
 * or a write failed (the tier is then off: the caller recomputes instead);
 * PKV_ERR_INVALID without a disk tier, for a swapped sequence or one without a
 * fingerprint. The sequence itself is not changed (its pages stay resident). */
pkv_status pkv_kv_disk_spill(pkv_kv_cache *c, int32_t seq, int64_t *n_pages, int64_t *n_written, uint64_t *bytes);
/* What a spill of seq would cover (0 without a usable disk tier) and, in
 * *n_unwritten, how many of those pages are not on disk yet. Publishes its pages. */
int64_t pkv_kv_disk_spill_plan(pkv_kv_cache *c, int32_t seq, int64_t *n_unwritten);
bool pkv_kv_disk_on(const pkv_kv_cache *c); /* a disk tier that has not been turned off */
extern int64_t pkv_kv_test_disk_fail_after; /* test hook: -1, or writes fail once that many pages were written */
/* remote tier (kv-redis.c; without hiredis every call is a no-op and open
 * refuses a remote_url naming libhiredis-dev) */
bool pkv_kv_remote_available(void); /* built with hiredis */
/* Parse the URL, connect (unreachable: a warning, retried later; a URL that does
 * not parse, a refused AUTH/SELECT or a peer that is not Redis: an error naming
 * the URL, password masked), start the writer. PKV_OK and nothing done when
 * p->remote_url is NULL. On error c->remote stays NULL. */
pkv_status pkv_kv_remote_open(pkv_kv_cache *c, const pkv_kv_params *p);
void pkv_kv_remote_close(pkv_kv_cache *c); /* publishes the cached pages first */
/* Page id (indexed) leaves memory: publish it unless it was (skipped when the queue is full). */
void pkv_kv_remote_put(pkv_kv_cache *c, int32_t id);
/* Queue every cached page not published yet; false when the queue filled first. */
bool pkv_kv_remote_queue(pkv_kv_cache *c);
/* Prefix match continued in Redis, as pkv_kv_disk_match. */
int64_t pkv_kv_remote_match(pkv_kv_cache *c, kv_seq *s, const int32_t *tokens, const int32_t *pos, int64_t m,
                            int64_t n_full, const uint64_t *keys);
void pkv_kv_remote_stats(const pkv_kv_cache *c, pkv_kv_stats *out);
/* The seeds of the prefix chains (kv-prefix.c): key's and key2's for producer fp. */
uint64_t pkv_kv_fp_seed(uint64_t fp);
uint64_t pkv_kv_fp_seed2(uint64_t fp);
uint64_t pkv_kv_page_key2(const pkv_kv_cache *c, uint64_t seed, const int32_t *tok, const int32_t *pos);

/* host pool (kv-swap.c) */
void pkv_kv_host_release_pages(pkv_kv_cache *c, const int32_t *h, int64_t n);

/* Helpers for batched device work (kv-ops.c). A row run copies n rows (tokens)
 * from src_row to dst_row in every array. */
typedef struct kv_run {
    int64_t src, dst, n;
} kv_run;
pkv_status pkv_kv_copy_runs(pkv_kv_cache *c, const kv_run *runs, size_t n_runs);
/* Zero-fill pages (sorted in place, coalesced into runs) in every array. */
pkv_status pkv_kv_fill_pages(pkv_kv_cache *c, int32_t *pages, int64_t n);

/* ------------------------------------------------------------- memory kinds
 *
 * What a sequence holds is split into memory kinds, each behind this table of
 * hooks (one file each): the full-attention page pool (kv-full.c), the
 * sliding-window pool (kv-window.c), media chunk records (kv-media.c) and the
 * recurrent state (kv-state.c). The public operations (kv-memory.c) run the hooks
 * of the kinds present in a cache (kv_kinds[], in that order: a later kind may
 * rely on an earlier one having done its part) and never name a kind.
 *
 * Contracts. Every hook may be NULL (nothing to do for that kind). A *_check
 * or *_prepare hook may fail and changes nothing that can be seen. The hooks
 * of one phase run in table order, unless noted "reverse"; the first error
 * stops the phase, and the kinds that already did their part are undone by the
 * hook named for it, so that on error nothing has changed (where today's
 * contract says so: see each public function). A hook that "cannot fail"
 * returns void. seq is a live sequence id of the main cache unless noted; the
 * first kind (the full pool) owns kv_seq and validates ids and arguments. */
typedef union kv_pending { /* what a prepare hook hands to its commit or abort */
    void *ptr;
    int64_t i;
} kv_pending;

/* Saved sequences (kv-file.c frames the file and walks it in file order, asking
 * the kinds for their parts; the format is described there). */
typedef enum kv_file_at {
    KV_FILE_ROW,     /* layer il's geometry row, 4 x u32 (the kind holding the layer) */
    KV_FILE_HEADER,  /* the kind's fields after exact_until (every kind, table order) */
    KV_FILE_LAYER,   /* layer il's payload sections (the kind holding the layer) */
    KV_FILE_TAIL,    /* after the checksum (every kind, table order) */
    KV_FILE_FIT,     /* load: what was read fits this cache and it has room (table order) */
    KV_FILE_STAGING, /* file_bytes only: [0] staging bytes the kind's moves need, [1] bytes
                        of part->ptr the framing allocates for it before a save changes anything */
} kv_file_at;

/* What a kind read (load) or found (save) for its later hooks. ptr is the
 * kind's allocation (pkv_malloc), freed by the framing at the end unless the
 * kind took it (set it to NULL). */
typedef struct kv_file_part {
    int64_t a, b;
    void *ptr;
} kv_file_part;

typedef struct kv_file {
    pkv_kv_cache *cache;
    const char *path;    /* in messages */
    bool load;
    int32_t seq;         /* save: the sequence; load: the new one (the first kind's load sets it) */
    int64_t n_tokens;
    uint64_t fp;         /* load: the fingerprint the sequence gets */
    int64_t exact_until; /* load: as in the file */
    uint8_t *put;        /* save: where the next header field goes (pkv_kv_file_put*) */
    const uint8_t *get;  /* load: the next header field (pkv_kv_file_get*) */
    const uint8_t *data; /* load: the file image [size] */
    size_t size;
    size_t tok_off;      /* load: i32 tokens[n_tokens], then i32 positions[n_tokens], in data */
    size_t *layer_off;   /* load: [n_layers] where each layer's payload starts in data */
    size_t end;          /* load: bytes checked so far; a kind's tail moves it on */
    uint64_t h;          /* the checksum (save: so far; load: the file's, verified) */
    FILE *out;           /* save */
    uint8_t *canon;      /* save: [the largest payload section] */
    uint8_t *tmp;        /* [the largest KV_FILE_STAGING of the kinds] */
} kv_file;

/* The dtypes word of a recurrent layer's geometry row. */
#define KV_FILE_RECURRENT 0x80000000u

/* Framing helpers for the kinds' file hooks (kv-file.c). */
void pkv_kv_file_put32(kv_file *f, uint32_t v);
void pkv_kv_file_put64(kv_file *f, uint64_t v);
uint32_t pkv_kv_file_get32(kv_file *f);
uint64_t pkv_kv_file_get64(kv_file *f);
/* A payload section of layer il: into the checksum and the file. */
pkv_status pkv_kv_file_write(kv_file *f, const void *bytes, size_t n, int il);
/* An attention layer held by a page pool (the full and the window pool): its
 * geometry row, the row's check, its K and V section bytes for n_tokens, and its
 * sections of the sequence's pages (tokens [t0, t1); pages[0] holds t0) saved
 * from / loaded into the pool. */
void pkv_kv_file_attn_row(kv_file *f, int il);
pkv_status pkv_kv_file_attn_row_check(kv_file *f, int il);
int pkv_kv_file_attn_bytes(const pkv_kv_cache *c, int il, int64_t n_tokens, size_t bytes[2]);
pkv_status pkv_kv_file_attn_save(kv_file *f, pkv_kv_cache *pool, int il, const int32_t *pages, int64_t t0,
                                 int64_t t1);
pkv_status pkv_kv_file_attn_load(kv_file *f, pkv_kv_cache *pool, int il, const int32_t *pages, int64_t t0,
                                 int64_t t1);
/* Staging bytes pkv_kv_file_attn_save / _load need in pool for n_tokens. */
size_t pkv_kv_file_attn_staging(const pkv_kv_cache *pool, int64_t n_tokens);
/* "layer il is recurrent in the file, an attention layer in the cache" (or the
 * other way round) when the row's dtypes word dt says otherwise than the cache. */
pkv_status pkv_kv_file_row_kind(const kv_file *f, int il, uint32_t dt, bool recurrent);
/* Does this pool hold layer il's K/V arrays (kv-cache.c)? */
bool pkv_kv_pool_holds(const pkv_kv_cache *pool, int il);

typedef struct pkv_mem_kind {
    const char *name;
    bool (*present)(const pkv_kv_cache *c); /* c may be NULL */
    /* Bytes one more token costs (0: none), and bytes a sequence costs whatever
     * its length (0: none). */
    size_t (*token_bytes)(const pkv_kv_cache *c);
    size_t (*seq_bytes)(const pkv_kv_cache *c);
    /* The page pool holding this kind's pages (its prefix-hit counter), or NULL. */
    pkv_kv_cache *(*pool)(pkv_kv_cache *c);

    /* A resident sequence is about to change (fork, truncate, shift, swap out):
     * check it is resident and publish what must be published first, but only
     * full pages within the first `written` tokens (a truncate's kept tokens: the
     * dropped ones' K/V may never have been computed; INT64_MAX: all). */
    pkv_status (*prepare)(pkv_kv_cache *c, int32_t seq, int64_t written, const char *what);

    /* New sequences. new_check: a sequence can be had (a child of parent for a fork).
     * create / fork: the first kind picks the id (*id / *child), later kinds
     * must take the same one; drop undoes a create or fork of an earlier kind
     * after a later one failed (the first kind's drop releases the kv_seq, and
     * with it what the other kinds keep in it). seq_free (reverse) cannot fail
     * but in the first kind, which reports a bad id. */
    pkv_status (*new_check)(pkv_kv_cache *c, bool fork, int32_t parent, const char *what);
    pkv_status (*create)(pkv_kv_cache *c, uint64_t fingerprint, int32_t *id);
    pkv_status (*fork)(pkv_kv_cache *c, int32_t parent, int32_t *child);
    void (*drop)(pkv_kv_cache *c, int32_t id);
    pkv_status (*seq_free)(pkv_kv_cache *c, int32_t seq);

    /* Append (seqs as given to pkv_kv_append_batch, not yet checked).
     * append_check: this kind can take the tokens (the first kind checks the
     * arguments only in its append). append_prepare: after every check, before
     * any kind appends (may change only what no query can see). append: after
     * the earlier kinds appended;
     * len[i]: seqs[i]'s length before, NULL when no later kind needs an undo.
     * append_undo: back to len after a later kind failed. appended: after all
     * succeeded, cannot fail. */
    pkv_status (*append_check)(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens);
    pkv_status (*append_prepare)(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens);
    pkv_status (*append)(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens,
                         const int32_t *tokens, const int32_t *pos, int32_t *rows, int32_t *rows_window,
                         const int64_t *len);
    void (*append_undo)(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int64_t *len);
    void (*appended)(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens);

    /* Truncate: cut moves n_keep back to where this kind can cut (run on a valid
     * sequence only). truncate: keep the first n_keep tokens; only the first kind
     * may fail before changing anything. */
    int64_t (*cut)(const pkv_kv_cache *c, int32_t seq, int64_t n_keep);
    pkv_status (*truncate)(pkv_kv_cache *c, int32_t seq, int64_t n_keep);

    /* Shift: remove [start, start + n_remove) and move what follows by pos_delta
     * positions. shift_check runs on a valid sequence only. */
    pkv_status (*shift_check)(const pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta);
    pkv_status (*shift)(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta);

    /* Clear one sequence / the whole cache: the checks, then seq_clear / clear
     * in reverse, then seq_cleared / cleared in table order. */
    pkv_status (*seq_clear_check)(pkv_kv_cache *c, int32_t seq);
    pkv_status (*seq_clear)(pkv_kv_cache *c, int32_t seq);
    pkv_status (*seq_cleared)(pkv_kv_cache *c, int32_t seq);
    pkv_status (*clear_check)(const pkv_kv_cache *c);
    pkv_status (*clear)(pkv_kv_cache *c);
    pkv_status (*cleared)(pkv_kv_cache *c);

    /* Swap out: swap_out_prepare (before prepare), swap_out in reverse (a
     * failure is undone by swap_out_undo of the kinds after it), then
     * swap_out_commit, or swap_out_abort after any failure. Swap in:
     * swap_in_prepare, swap_in in table order (only the first kind's may fail),
     * then swap_in_commit, or swap_in_abort. */
    pkv_status (*swap_out_prepare)(pkv_kv_cache *c, int32_t seq, kv_pending *p);
    pkv_status (*swap_out)(pkv_kv_cache *c, int32_t seq);
    void (*swap_out_undo)(pkv_kv_cache *c, int32_t seq);
    void (*swap_out_commit)(pkv_kv_cache *c, int32_t seq, kv_pending p);
    void (*swap_out_abort)(pkv_kv_cache *c, int32_t seq, kv_pending p);
    pkv_status (*swap_in_prepare)(pkv_kv_cache *c, int32_t seq, kv_pending *p);
    pkv_status (*swap_in)(pkv_kv_cache *c, int32_t seq);
    void (*swap_in_commit)(pkv_kv_cache *c, int32_t seq, kv_pending p);
    void (*swap_in_abort)(pkv_kv_cache *c, int32_t seq, kv_pending p);

    /* Prefix reuse on an empty sequence. prefix_match (the first kind) finds the
     * longest run of cached full pages: *n_matched tokens, taken into seq. The
     * others then narrow it to the longest m pages (m <= n_pages) that every
     * kind can serve: prefix_begin (may fail), prefix_ok(m), prefix_take(m) (may
     * fail; earlier kinds are undone by prefix_undo, which empties seq),
     * prefix_end (always, frees what begin took). */
    pkv_status (*prefix_match)(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                               int64_t *n_matched);
    pkv_status (*prefix_begin)(pkv_kv_cache *c, int32_t seq, int64_t n_pages, kv_pending *p);
    bool (*prefix_ok)(pkv_kv_cache *c, int32_t seq, int64_t m, kv_pending p);
    pkv_status (*prefix_take)(pkv_kv_cache *c, int32_t seq, int64_t m, kv_pending p);
    void (*prefix_undo)(pkv_kv_cache *c, int32_t seq);
    void (*prefix_end)(kv_pending p);

    /* Save / load of one sequence. kv-file.c writes and checks the frame (magic,
     * version, layer count, page size, layout fingerprint, n_tokens, fingerprint,
     * exact_until, tokens, positions, checksum) and walks the file in its order,
     * asking a kind for each of its parts (kv_file_at; il: the layer, -1 for the
     * others); part is the kind's own, kept across the hooks of one save or load.
     * file_version: the format version that brought this kind's parts (a cache
     * writes the highest of its kinds', and reads only that one); 0: none.
     * file_what: what a file of that version holds ("recurrent layers"), in
     * messages. holds_layer: layer il's geometry row and payload are this
     * kind's (exactly one kind holds each layer). file_bytes: bytes of the
     * kind's part at KV_FILE_HEADER (bytes[0]) or KV_FILE_LAYER (its sections:
     * returns how many, 1 or 2), or its needs at KV_FILE_STAGING; returns 0 when
     * it has nothing there. save: write the part at `at` (ROW and HEADER with
     * pkv_kv_file_put*, LAYER and TAIL with pkv_kv_file_write / fwrite);
     * may fail only at LAYER and TAIL (the file is then not written).
     * load_check: read and check the part at `at` (ROW and HEADER with
     * pkv_kv_file_get*, TAIL from f->end, which it moves on; FIT: the cache
     * can take it); changes nothing. load: after every check, in table order,
     * take what the sequence needs and write the kind's parts into the cache
     * (the first kind makes the sequence: f->seq); load_undo (reverse) takes
     * it back when a later kind's load failed. */
    uint32_t file_version;
    const char *file_what;
    bool (*holds_layer)(const pkv_kv_cache *c, int il);
    int (*file_bytes)(const pkv_kv_cache *c, const kv_file *f, const kv_file_part *part, kv_file_at at, int il,
                      size_t bytes[2]);
    pkv_status (*save)(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il);
    pkv_status (*load_check)(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il);
    pkv_status (*load)(pkv_kv_cache *c, kv_file *f, kv_file_part *part);
    void (*load_undo)(pkv_kv_cache *c, kv_file *f, kv_file_part *part);

    void (*stats)(const pkv_kv_cache *c, pkv_kv_stats *out); /* add this kind's numbers */
} pkv_mem_kind;

extern const pkv_mem_kind kv_kind_full;   /* kv-full.c */
extern const pkv_mem_kind kv_kind_window; /* kv-window.c */
extern const pkv_mem_kind kv_kind_media;  /* kv-media.c */
extern const pkv_mem_kind kv_kind_state;  /* kv-state.c */

/* The state-slot check of a new or re-emptied sequence (kv-state.c; seq -1: a new one). */
pkv_status pkv_kv_state_slot_check(const pkv_kv_cache *c, const char *what, int32_t seq);
/* Device bytes a sequence of n_tokens tokens costs: each kind present's
 * token_bytes * n_tokens + seq_bytes (pages not rounded up; kv-memory.c). */
uint64_t pkv_kv_seq_bytes(const pkv_kv_cache *c, int64_t n_tokens);
/* The kinds present in c, in table order (out: up to PKV_MEM_KINDS); returns their count. */
enum { PKV_MEM_KINDS = 4 };
int pkv_kv_kinds(const pkv_kv_cache *c, const pkv_mem_kind *out[PKV_MEM_KINDS]);
/* Every kind of the table, present or not (a file names what it was saved with). */
int pkv_kv_kinds_all(const pkv_mem_kind *out[PKV_MEM_KINDS]);

/* Geometry-hash / file word of a layer's dtypes: K type in bits 0-7, and when V
 * differs, V type + 1 in bits 8-15 (so caches with K == V hash and save as before). */
static inline uint32_t kv_dtype_word(pkv_type k, pkv_type v) {
    return (uint32_t)k | (k == v ? 0u : ((uint32_t)v + 1u) << 8);
}
static inline pkv_type kv_word_k(uint32_t w) { return (pkv_type)(w & 0xffu); }
static inline pkv_type kv_word_v(uint32_t w) { return (w >> 8) ? (pkv_type)((w >> 8) - 1u) : (pkv_type)(w & 0xffu); }

/* Little-endian-as-stored fields of the sequence file (kv-file.c, kv-media.c's
 * trailer), written and read at a cursor that moves past them. */
static inline void kv_put32(uint8_t **p, uint32_t v) {
    memcpy(*p, &v, 4);
    *p += 4;
}
static inline void kv_put64(uint8_t **p, uint64_t v) {
    memcpy(*p, &v, 8);
    *p += 8;
}
static inline uint32_t kv_get32(const uint8_t **p) {
    uint32_t v;
    memcpy(&v, *p, 4);
    *p += 4;
    return v;
}
static inline uint64_t kv_get64(const uint8_t **p) {
    uint64_t v;
    memcpy(&v, *p, 8);
    *p += 8;
    return v;
}

static inline pkv_buffer *kv_array_buf(const pkv_kv_cache *c, const kv_array *a) { return c->arenas[a->arena].buf; }

#endif
