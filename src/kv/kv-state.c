/* Recurrent state beside the paged KV (gated delta-net and other recurrent layers
 * of hybrid models: pkv_kv_layer_desc.state_per_head > 0).
 *
 * Storage: every recurrent (layer, shard) has a state array of n_slots slots on
 * its storage device, f32 [n_slots][n_heads_of_shard][state_per_head] (a state of
 * parts: [n_slots][part][n_heads_of_shard][part's floats]), packed at
 * 256-byte-aligned offsets into one buffer per device (a "state arena"; another is
 * started past the device's largest buffer). Slot i means the same index in every
 * state array, so copying a state is one pkv_buffer_copy_regions per arena.
 *
 * Slots are a pool: a sequence holds one for its live state; a checkpoint (the
 * live state copied at some length) holds another, shared by reference count
 * between the sequences that took it over by fork and the prefix-index page it is
 * offered at. When no slot is free, the oldest checkpoint (in creation order) is
 * evicted: its generation changes, so every reference still held to it stops
 * matching and is dropped when next seen.
 *
 * Everything touches device memory only through pkv_buffer_* (I1), in queue order
 * with compute (I3). The recurrent-state memory kind at the end of this file
 * (kv_kind_state, run by kv-memory.c) calls the pieces here on the main cache
 * (the window sub-cache never holds states). */
#include "kv/kv-impl.h"

#include <stdio.h>
#include <string.h>

#define KV_STATE_ALIGN 256

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ---------------------------------------------------------------- storage */

pkv_status pkv_kv_state_init(pkv_kv_cache *c, const pkv_kv_params *p) {
    c->ck_head = c->ck_tail = -1;
    pkv_kv_layout *l = &c->layout;
    int n = 0, nl = 0;
    for (int il = 0; il < l->n_layers; il++)
        if (l->layers[il].state_per_head > 0) {
            nl++;
            n += l->layers[il].n_shards;
        }
    if (nl == 0) return PKV_OK;
    if (p->state_slots < 0 || p->state_ckpt_interval < 0 || p->state_ckpt_max < 0)
        return pkv_err(PKV_ERR_INVALID, "KV cache: state_slots %lld, state_ckpt_interval %d, state_ckpt_max %d "
                       "(0 = default, negative is invalid)", (long long)p->state_slots, p->state_ckpt_interval,
                       p->state_ckpt_max);
    c->ckpt_max = p->state_ckpt_max ? p->state_ckpt_max : 4;
    c->ckpt_interval = p->state_ckpt_interval ? p->state_ckpt_interval : 64;
    int64_t n_slots = p->state_slots ? p->state_slots : 4 * ((int64_t)c->ckpt_max + 1);
    if (n_slots > INT32_MAX)
        return pkv_err(PKV_ERR_INVALID, "KV cache: %lld state slots (at most 2^31 - 1)", (long long)n_slots);
    c->st_arrays = pkv_calloc((size_t)n, sizeof *c->st_arrays);
    c->st_arenas = pkv_calloc((size_t)n, sizeof *c->st_arenas); /* at most one arena per array */
    c->slots = pkv_calloc((size_t)n_slots, sizeof *c->slots);
    c->slot_free = pkv_calloc((size_t)n_slots, sizeof *c->slot_free);
    if (!c->st_arrays || !c->st_arenas || !c->slots || !c->slot_free)
        return pkv_err(PKV_ERR_NOMEM, "KV cache: out of memory for %lld state slots", (long long)n_slots);
    size_t host = 0;
    for (int il = 0; il < l->n_layers; il++) {
        kv_layer *L = &l->layers[il];
        if (L->state_per_head <= 0) continue;
        for (int is = 0; is < L->n_shards; is++) {
            kv_shard *sh = &L->shards[is];
            kv_state_array *a = &c->st_arrays[c->n_st_arrays];
            a->layer = il;
            a->shard = is;
            a->slot_bytes = (size_t)sh->n_heads * (size_t)L->state_per_head * sizeof(float);
            size_t bytes;
            if (!pkv_mul_ok(a->slot_bytes, (size_t)n_slots, &bytes) || bytes > SIZE_MAX / 2)
                return pkv_err(PKV_ERR_NOMEM, "KV cache layer %d: %lld state slots of %zu bytes overflow", il,
                               (long long)n_slots, a->slot_bytes);
            int ar = -1;
            for (int k = c->n_st_arenas - 1; k >= 0 && ar < 0; k--)
                if (c->st_arenas[k].dev == sh->storage) ar = k;
            size_t maxb = pkv_device_get_caps(sh->storage)->max_buffer_bytes;
            if (ar >= 0 && maxb && align_up(c->st_arenas[ar].size, KV_STATE_ALIGN) + bytes > maxb) ar = -1;
            if (ar < 0) {
                ar = c->n_st_arenas++;
                c->st_arenas[ar].dev = sh->storage;
            }
            a->arena = ar;
            a->off = align_up(c->st_arenas[ar].size, KV_STATE_ALIGN);
            c->st_arenas[ar].size = a->off + bytes;
            a->host_off = host;
            host += a->slot_bytes;
            sh->s_array = c->n_st_arrays++;
        }
    }
    c->state_slot_bytes = host;
    for (int k = 0; k < c->n_st_arenas; k++) {
        c->st_arenas[k].buf = pkv_buffer_alloc(c->st_arenas[k].dev, c->st_arenas[k].size);
        if (!c->st_arenas[k].buf)
            return pkv_err_prefix(PKV_ERR_NOMEM, "KV cache: %lld state slots of %zu bytes on %s (pkv_kv_params."
                                  "state_slots)", (long long)n_slots, host, pkv_device_name(c->st_arenas[k].dev));
    }
    for (int64_t i = 0; i < n_slots; i++) {
        c->slots[i].prev = c->slots[i].next = -1;
        c->slot_free[i] = (int32_t)(n_slots - 1 - i); /* ascending ids first */
    }
    c->n_slot_free = n_slots;
    c->n_state_layers = nl;
    c->n_slots = n_slots; /* from here on kv_has_state(c) */
    return PKV_OK;
}

void pkv_kv_state_free(pkv_kv_cache *c) {
    for (size_t i = 0; i < c->n_seqs; i++) {
        pkv_free(c->seqs[i].st.ckpt);
        pkv_free(c->seqs[i].st.host);
        c->seqs[i].st.ckpt = NULL;
        c->seqs[i].st.host = NULL;
    }
    for (int k = 0; k < c->n_st_arenas; k++) pkv_buffer_free(c->st_arenas[k].buf);
    pkv_free(c->st_arenas);
    pkv_free(c->st_arrays);
    pkv_free(c->slots);
    pkv_free(c->slot_free);
    c->st_arenas = NULL;
    c->st_arrays = NULL;
    c->slots = NULL;
    c->slot_free = NULL;
    c->n_st_arenas = c->n_st_arrays = 0;
    c->n_slots = 0;
}

/* ------------------------------------------------------------------ slots */

static void ck_unlink(pkv_kv_cache *c, int32_t id) {
    kv_slot *s = &c->slots[id];
    if (s->prev >= 0)
        c->slots[s->prev].next = s->next;
    else
        c->ck_head = s->next;
    if (s->next >= 0)
        c->slots[s->next].prev = s->prev;
    else
        c->ck_tail = s->prev;
    s->prev = s->next = -1;
    s->ckpt = false;
    c->n_ck--;
}

static void ck_push(pkv_kv_cache *c, int32_t id, int64_t pos) {
    kv_slot *s = &c->slots[id];
    s->ckpt = true;
    s->pos = pos;
    s->next = -1;
    s->prev = c->ck_tail;
    if (c->ck_tail >= 0)
        c->slots[c->ck_tail].next = id;
    else
        c->ck_head = id;
    c->ck_tail = id;
    c->n_ck++;
}

/* Back to the free stack; every reference still held to it goes stale. */
static void slot_release(pkv_kv_cache *c, int32_t id) {
    kv_slot *s = &c->slots[id];
    if (s->ckpt) ck_unlink(c, id);
    s->refs = 0;
    s->gen++;
    c->slot_free[c->n_slot_free++] = id;
}

int64_t pkv_kv_state_available(const pkv_kv_cache *c) { return c->n_slot_free + c->n_ck; }

int32_t pkv_kv_state_slot_take(pkv_kv_cache *c) {
    if (c->n_slot_free == 0) {
        if (c->ck_head < 0) return -1;
        slot_release(c, c->ck_head); /* the oldest checkpoint, wherever it is held */
    }
    int32_t id = c->slot_free[--c->n_slot_free];
    c->slots[id].refs = 1;
    return id;
}

static bool slot_valid(const pkv_kv_cache *c, int32_t slot, uint32_t gen) {
    return slot >= 0 && slot < c->n_slots && c->slots[slot].gen == gen && c->slots[slot].refs > 0;
}

void pkv_kv_state_slot_unref(pkv_kv_cache *c, int32_t slot, uint32_t gen) {
    if (!slot_valid(c, slot, gen)) return; /* evicted meanwhile */
    if (--c->slots[slot].refs == 0) slot_release(c, slot);
}

static void live_release(pkv_kv_cache *c, kv_seq *s) {
    if (s->st.slot >= 0) pkv_kv_state_slot_unref(c, s->st.slot, c->slots[s->st.slot].gen);
    s->st.slot = -1;
}

/* ------------------------------------------------------- device transfers */

/* Copy slot src[j] to slot dst[j] in every state array: one batched region copy
 * per state arena (r: room for n_st_arrays * n regions). No dst may equal another
 * dst or any src. A single pair is copied array by array instead, which allocates
 * nothing (r may be NULL): a fork, restore or prefix hit cannot then fail for
 * memory after its slot was taken. */
static pkv_status copy_slots(pkv_kv_cache *c, const int32_t *src, const int32_t *dst, int64_t n, pkv_region *r) {
    if (n <= 0) return PKV_OK;
    pkv_status st = PKV_OK;
    if (n == 1) { /* one copy per array: the same-device copy allocates nothing */
        for (int i = 0; i < c->n_st_arrays && !st; i++) {
            const kv_state_array *a = &c->st_arrays[i];
            pkv_buffer *buf = c->st_arenas[a->arena].buf;
            st = pkv_buffer_copy(buf, a->off + (size_t)src[0] * a->slot_bytes, buf,
                                 a->off + (size_t)dst[0] * a->slot_bytes, a->slot_bytes);
        }
        if (st) return pkv_err_prefix(st, "KV state copy of slot %d to %d", src[0], dst[0]);
        c->stats.state_copies++;
        return PKV_OK;
    }
    if (!r) return pkv_err(PKV_ERR_INTERNAL, "KV state copy: no room for %lld regions", (long long)n);
    for (int ar = 0; ar < c->n_st_arenas && !st; ar++) {
        size_t k = 0;
        for (int i = 0; i < c->n_st_arrays; i++) {
            const kv_state_array *a = &c->st_arrays[i];
            if (a->arena != ar) continue;
            for (int64_t j = 0; j < n; j++) {
                r[k].src_off = a->off + (size_t)src[j] * a->slot_bytes;
                r[k].dst_off = a->off + (size_t)dst[j] * a->slot_bytes;
                r[k].size = a->slot_bytes;
                k++;
            }
        }
        st = pkv_buffer_copy_regions(c->st_arenas[ar].buf, c->st_arenas[ar].buf, r, k);
    }
    if (st) return pkv_err_prefix(st, "KV state copy of %lld slots", (long long)n);
    c->stats.state_copies += (uint64_t)n;
    return PKV_OK;
}

static pkv_status zero_slot(pkv_kv_cache *c, int32_t slot) {
    pkv_status st = PKV_OK;
    for (int i = 0; i < c->n_st_arrays && !st; i++) {
        const kv_state_array *a = &c->st_arrays[i];
        st = pkv_buffer_fill(c->st_arenas[a->arena].buf, a->off + (size_t)slot * a->slot_bytes, a->slot_bytes, 0);
    }
    return st ? pkv_err_prefix(st, "KV state: zeroing slot %d", slot) : PKV_OK;
}

pkv_status pkv_kv_state_read(pkv_kv_cache *c, int32_t slot, uint8_t *host) {
    pkv_status st = PKV_OK;
    for (int i = 0; i < c->n_st_arrays && !st; i++) {
        const kv_state_array *a = &c->st_arrays[i];
        st = pkv_buffer_read(c->st_arenas[a->arena].buf, a->off + (size_t)slot * a->slot_bytes, host + a->host_off,
                             a->slot_bytes);
    }
    return st;
}

pkv_status pkv_kv_state_write(pkv_kv_cache *c, int32_t slot, const uint8_t *host) {
    pkv_status st = PKV_OK;
    for (int i = 0; i < c->n_st_arrays && !st; i++) {
        const kv_state_array *a = &c->st_arrays[i];
        st = pkv_buffer_write(c->st_arenas[a->arena].buf, a->off + (size_t)slot * a->slot_bytes, host + a->host_off,
                              a->slot_bytes);
    }
    return st;
}

void pkv_kv_state_permute(const kv_layer *L, int h0, int nh, uint8_t *slot, uint8_t *canon, bool to_slot) {
    const size_t head = (size_t)L->state_per_head * sizeof(float);
    if (L->n_parts == 0) { /* one part: the shard's heads are one contiguous range */
        if (to_slot)
            memcpy(slot, canon + (size_t)h0 * head, (size_t)nh * head);
        else
            memcpy(canon + (size_t)h0 * head, slot, (size_t)nh * head);
        return;
    }
    size_t at = 0, in_head = 0; /* bytes: into the slot, and the part's offset inside a head */
    for (int p = 0; p < L->n_parts; p++) {
        const size_t part = (size_t)L->part[p] * sizeof(float);
        for (int h = 0; h < nh; h++, at += part) {
            uint8_t *c = canon + (size_t)(h0 + h) * head + in_head;
            if (to_slot)
                memcpy(slot + at, c, part);
            else
                memcpy(c, slot + at, part);
        }
        in_head += part;
    }
}

/* ------------------------------------------------------------ checkpoints */

/* Drop the references that went stale (their checkpoint was evicted). */
static void ckpt_prune(pkv_kv_cache *c, kv_seq *s) {
    int k = 0;
    for (int i = 0; i < s->st.n_ckpt; i++)
        if (slot_valid(c, s->st.ckpt[i].slot, s->st.ckpt[i].gen)) s->st.ckpt[k++] = s->st.ckpt[i];
    s->st.n_ckpt = k;
}

/* Drop the checkpoints after `pos` tokens (all with pos < 0). */
static void ckpt_drop_after(pkv_kv_cache *c, kv_seq *s, int64_t pos) {
    int k = 0;
    for (int i = 0; i < s->st.n_ckpt; i++) {
        kv_ckpt *e = &s->st.ckpt[i];
        if (pos >= 0 && e->pos <= pos)
            s->st.ckpt[k++] = *e;
        else
            pkv_kv_state_slot_unref(c, e->slot, e->gen);
    }
    s->st.n_ckpt = k;
}

/* Drop a sequence's oldest checkpoint. */
static void ckpt_drop_first(pkv_kv_cache *c, kv_seq *s) {
    pkv_kv_state_slot_unref(c, s->st.ckpt[0].slot, s->st.ckpt[0].gen);
    memmove(s->st.ckpt, s->st.ckpt + 1, (size_t)(s->st.n_ckpt - 1) * sizeof *s->st.ckpt);
    s->st.n_ckpt--;
}

static pkv_status ckpt_reserve(kv_seq *s, int n) {
    if (n <= s->st.cap_ckpt) return PKV_OK;
    void *arr = s->st.ckpt;
    size_t cap = (size_t)s->st.cap_ckpt;
    pkv_status st = pkv_grow(&arr, &cap, (size_t)n, sizeof(kv_ckpt));
    if (st) return st;
    s->st.ckpt = arr;
    s->st.cap_ckpt = (int)PKV_MIN(cap, (size_t)INT32_MAX);
    return PKV_OK;
}

/* ------------------------------------------------------------- sequences */

pkv_status pkv_kv_state_seq_new(pkv_kv_cache *c, int32_t seq) {
    if (!kv_has_state(c)) return PKV_OK;
    kv_seq *s = &c->seqs[seq];
    int32_t slot = pkv_kv_state_slot_take(c);
    if (slot < 0)
        return pkv_err(PKV_ERR_NOMEM, "KV state: no state slot for sequence %d: all %lld slots hold the live states "
                       "of other sequences (raise pkv_kv_params.state_slots)", seq, (long long)c->n_slots);
    pkv_status st = zero_slot(c, slot);
    if (st) {
        slot_release(c, slot);
        return st;
    }
    s->st.slot = slot;
    s->st.len = 0;
    return PKV_OK;
}

void pkv_kv_state_seq_release(pkv_kv_cache *c, kv_seq *s) {
    if (!kv_has_state(c)) return;
    ckpt_drop_after(c, s, -1);
    live_release(c, s);
    pkv_free(s->st.ckpt);
    pkv_free(s->st.host);
    memset(&s->st, 0, sizeof s->st);
    s->st.slot = -1;
}

pkv_status pkv_kv_state_seq_empty(pkv_kv_cache *c, int32_t seq) {
    if (!kv_has_state(c)) return PKV_OK;
    kv_seq *s = &c->seqs[seq];
    ckpt_drop_after(c, s, -1);
    pkv_free(s->st.host);
    s->st.host = NULL;
    s->st.len = 0;
    if (s->st.slot < 0 && (s->st.slot = pkv_kv_state_slot_take(c)) < 0)
        return pkv_err(PKV_ERR_NOMEM, "KV state: no state slot for sequence %d: all %lld slots hold the live states "
                       "of other sequences (raise pkv_kv_params.state_slots)", seq, (long long)c->n_slots);
    return zero_slot(c, s->st.slot);
}

pkv_status pkv_kv_state_rewind(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    if (!kv_has_state(c)) return PKV_OK;
    kv_seq *s = &c->seqs[seq];
    if (n_keep >= s->st.len) return PKV_OK; /* the live state covers only kept tokens */
    ckpt_prune(c, s);
    ckpt_drop_after(c, s, n_keep);
    pkv_status st;
    if (s->st.n_ckpt > 0) {
        const kv_ckpt *e = &s->st.ckpt[s->st.n_ckpt - 1];
        st = copy_slots(c, &e->slot, &s->st.slot, 1, NULL);
        s->st.len = e->pos;
    } else {
        st = zero_slot(c, s->st.slot);
        s->st.len = 0;
    }
    c->stats.state_restores++;
    if (st) { /* what the live slot holds is unknown: recompute from scratch */
        ckpt_drop_after(c, s, -1);
        s->st.len = 0;
        zero_slot(c, s->st.slot);
        return pkv_err_prefix(st, "restoring the recurrent state of sequence %d", seq);
    }
    return PKV_OK;
}

pkv_status pkv_kv_state_fork(pkv_kv_cache *c, int32_t parent, int32_t child) {
    if (!kv_has_state(c)) return PKV_OK;
    kv_seq *p = &c->seqs[parent], *s = &c->seqs[child];
    ckpt_prune(c, p);
    pkv_status st = ckpt_reserve(s, p->st.n_ckpt);
    if (st) return pkv_err_prefix(st, "fork of sequence %d: its state checkpoints", parent);
    int32_t slot = pkv_kv_state_slot_take(c);
    if (slot < 0)
        return pkv_err(PKV_ERR_NOMEM, "fork of sequence %d: no state slot for the child: all %lld slots hold live "
                       "states (raise pkv_kv_params.state_slots)", parent, (long long)c->n_slots);
    ckpt_prune(c, p); /* taking the slot may have evicted one of p's */
    if ((st = copy_slots(c, &p->st.slot, &slot, 1, NULL))) {
        slot_release(c, slot);
        return pkv_err_prefix(st, "fork of sequence %d", parent);
    }
    s->st.slot = slot;
    s->st.len = p->st.len;
    for (int i = 0; i < p->st.n_ckpt; i++) {
        s->st.ckpt[i] = p->st.ckpt[i];
        c->slots[p->st.ckpt[i].slot].refs++;
    }
    s->st.n_ckpt = p->st.n_ckpt;
    return PKV_OK;
}

pkv_status pkv_kv_state_swap_out_prepare(pkv_kv_cache *c, int32_t seq, uint8_t **host) {
    *host = NULL;
    if (!kv_has_state(c)) return PKV_OK;
    uint8_t *h = pkv_malloc(c->state_slot_bytes);
    if (!h) return pkv_err(PKV_ERR_NOMEM, "swap out of sequence %d: out of memory for its state (%zu bytes)", seq,
                           c->state_slot_bytes);
    pkv_status st = pkv_kv_state_read(c, c->seqs[seq].st.slot, h);
    if (st) {
        pkv_free(h);
        return pkv_err_prefix(st, "swap out of sequence %d: its recurrent state", seq);
    }
    *host = h;
    return PKV_OK;
}

void pkv_kv_state_swap_out_commit(pkv_kv_cache *c, int32_t seq, uint8_t *host) {
    if (!kv_has_state(c)) return;
    kv_seq *s = &c->seqs[seq];
    ckpt_drop_after(c, s, -1);
    live_release(c, s);
    s->st.host = host;
}

pkv_status pkv_kv_state_swap_in_prepare(pkv_kv_cache *c, int32_t seq, int32_t *slot) {
    *slot = -1;
    if (!kv_has_state(c)) return PKV_OK;
    int32_t id = pkv_kv_state_slot_take(c);
    if (id < 0)
        return pkv_err(PKV_ERR_NOMEM, "swap in of sequence %d: no state slot: all %lld hold the live states of "
                       "resident sequences (raise pkv_kv_params.state_slots)", seq, (long long)c->n_slots);
    pkv_status st = pkv_kv_state_write(c, id, c->seqs[seq].st.host);
    if (st) {
        slot_release(c, id);
        return pkv_err_prefix(st, "swap in of sequence %d: its recurrent state", seq);
    }
    *slot = id;
    return PKV_OK;
}

void pkv_kv_state_swap_in_commit(pkv_kv_cache *c, int32_t seq, int32_t slot) {
    if (!kv_has_state(c)) return;
    kv_seq *s = &c->seqs[seq];
    pkv_free(s->st.host);
    s->st.host = NULL;
    s->st.slot = slot;
}

/* ------------------------------------------------------------ prefix reuse */

bool pkv_kv_state_stored(const pkv_kv_cache *c, int32_t page, int64_t n_tokens) {
    int64_t pos;
    return pkv_kv_state_page_offered(c, page, &pos) && c->pages[page].indexed && pos == n_tokens;
}

pkv_status pkv_kv_state_prefix_take(pkv_kv_cache *c, int32_t seq, int64_t m) {
    if (!kv_has_state(c) || m <= 0) return PKV_OK;
    kv_seq *s = &c->seqs[seq];
    const kv_page *p = &c->pages[pkv_kv_seq_page(s, m - 1)];
    int32_t src = p->st_slot;
    pkv_status st = copy_slots(c, &src, &s->st.slot, 1, NULL);
    if (st) return pkv_err_prefix(st, "prefix match of sequence %d: its recurrent state", seq);
    s->st.len = m * c->page_size;
    c->stats.state_prefix_hits++;
    /* The sequence keeps the checkpoint too (a truncate may go back to it). */
    ckpt_prune(c, s);
    if (!ckpt_reserve(s, s->st.n_ckpt + 1)) {
        s->st.ckpt[s->st.n_ckpt++] = (kv_ckpt){s->st.len, src, p->st_gen};
        c->slots[src].refs++;
    }
    return PKV_OK;
}

void pkv_kv_state_page_drop(pkv_kv_cache *c, int32_t page) {
    kv_page *p = &c->pages[page];
    if (kv_has_state(c)) pkv_kv_state_slot_unref(c, p->st_slot, p->st_gen);
    p->st_slot = -1;
}

/* ------------------------------------------------------------------ clear */

pkv_status pkv_kv_state_clear_check(const pkv_kv_cache *c) {
    if (!kv_has_state(c)) return PKV_OK;
    int64_t held = 0, need = 0;
    for (size_t i = 0; i < c->n_seqs; i++)
        if (c->seqs[i].live) {
            held += c->seqs[i].st.slot >= 0;
            need += c->seqs[i].st.slot < 0;
        }
    if (need > c->n_slots - held)
        return pkv_err(PKV_ERR_NOMEM, "clear: %lld swapped sequences need a state slot each, %lld of %lld are not "
                       "live states (raise pkv_kv_params.state_slots)", (long long)need,
                       (long long)(c->n_slots - held), (long long)c->n_slots);
    return PKV_OK;
}

pkv_status pkv_kv_state_clear(pkv_kv_cache *c) {
    if (!kv_has_state(c)) return PKV_OK;
    /* The pages' offers went with the index (kv1_clear). Every slot is freed (its
     * references go stale) except the resident sequences' live ones; allocates
     * nothing, so it cannot fail halfway. */
    c->ck_head = c->ck_tail = -1;
    c->n_ck = 0;
    for (int64_t i = 0; i < c->n_slots; i++) {
        kv_slot *sl = &c->slots[i];
        if (sl->refs > 0) sl->gen++;
        sl->refs = 0;
        sl->ckpt = false;
        sl->prev = sl->next = -1;
    }
    for (size_t i = 0; i < c->n_seqs; i++) {
        kv_seq *s = &c->seqs[i];
        if (!s->live) continue;
        s->st.n_ckpt = 0;
        s->st.len = 0;
        pkv_free(s->st.host);
        s->st.host = NULL;
        if (s->st.slot >= 0) c->slots[s->st.slot].refs = 1;
    }
    c->n_slot_free = 0;
    for (int64_t i = c->n_slots - 1; i >= 0; i--)
        if (c->slots[i].refs == 0) c->slot_free[c->n_slot_free++] = (int32_t)i;
    for (size_t i = 0; i < c->n_seqs; i++) /* swapped sequences became resident and empty */
        if (c->seqs[i].live && c->seqs[i].st.slot < 0) c->seqs[i].st.slot = pkv_kv_state_slot_take(c);
    pkv_status st = PKV_OK;
    for (int k = 0; k < c->n_st_arenas && !st; k++)
        st = pkv_buffer_fill(c->st_arenas[k].buf, 0, c->st_arenas[k].size, 0);
    return st;
}

/* ------------------------------------------------------------- public API */

pkv_status pkv_kv_state_slots(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, int32_t *slots) {
    if (!c || n_seqs < 0 || (n_seqs > 0 && (!seqs || !slots)))
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_state_slots: NULL argument or negative count");
    if (!kv_has_state(c))
        return pkv_err(PKV_ERR_INVALID, "state slots: the cache has no recurrent layers (state_per_head)");
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = pkv_kv_seq_resident(c, seqs[i], "state slots");
        if (!s) return PKV_ERR_INVALID;
        slots[i] = s->st.slot;
    }
    return PKV_OK;
}

int64_t pkv_kv_seq_state_len(const pkv_kv_cache *c, int32_t seq) {
    int64_t n = pkv_kv_seq_len(c, seq);
    if (n < 0 || !kv_has_state(c)) return n;
    return c->seqs[seq].st.len;
}

pkv_status pkv_kv_state_replay(pkv_kv_cache *c, int32_t seq, int32_t n) {
    if (!c) return pkv_err(PKV_ERR_INVALID, "state replay: cache is NULL");
    if (!kv_has_state(c)) return pkv_err(PKV_ERR_INVALID, "state replay: the cache has no recurrent layers");
    kv_seq *s = pkv_kv_seq_resident(c, seq, "state replay");
    if (!s) return PKV_ERR_INVALID;
    if (n < 0 || s->st.len + n > s->n_tokens)
        return pkv_err(PKV_ERR_INVALID, "state replay: %d tokens from %lld of sequence %d, which has %lld", n,
                       (long long)s->st.len, seq, (long long)s->n_tokens);
    s->st.len += n;
    return PKV_OK;
}

pkv_status pkv_kv_state_step_done(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens) {
    if (!c || n_seqs < 0 || (n_seqs > 0 && (!seqs || !n_tokens)))
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_state_step_done: NULL argument or negative count");
    for (int i = 0; i < n_seqs; i++) {
        if (!pkv_kv_seq_resident(c, seqs[i], "state step done")) return PKV_ERR_INVALID;
        if (n_tokens[i] < 0)
            return pkv_err(PKV_ERR_INVALID, "state step done: %d tokens for sequence %d", n_tokens[i], seqs[i]);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return pkv_err(PKV_ERR_INVALID, "state step done: sequence %d appears twice", seqs[i]);
    }
    if (!kv_has_state(c) || n_seqs == 0) return PKV_OK;
    /* Everything allocated first: after the slots are taken, only a device error
     * can fail (and then gives them back). */
    int32_t stack[48];
    int32_t *take = n_seqs <= 16 ? stack : pkv_malloc((size_t)n_seqs * 3 * sizeof *take); /* [3][n_seqs] */
    pkv_region *r = pkv_malloc((size_t)c->n_st_arrays * (size_t)n_seqs * sizeof *r);
    if (!take || !r) {
        if (take != stack) pkv_free(take);
        pkv_free(r);
        return pkv_err(PKV_ERR_NOMEM, "state step done: out of memory for %d sequences", n_seqs);
    }
    int32_t *src = take + n_seqs, *dst = src + n_seqs;
    pkv_status st = PKV_OK;
    int ps = c->page_size;
    /* Which sequences take a checkpoint; reserve their lists (nothing changed if
     * that fails), then take the slots: fresh slots are on no list, so taking one
     * never evicts another taken here. */
    for (int i = 0; i < n_seqs; i++) {
        kv_seq *s = &c->seqs[seqs[i]];
        pkv_kv_seq_publish(c, s); /* the step's K/V are written: offer its full pages */
        ckpt_prune(c, s);
        int64_t last = s->st.n_ckpt ? s->st.ckpt[s->st.n_ckpt - 1].pos : 0;
        bool want = s->st.len > last && (n_tokens[i] > 1 || s->st.len - last >= c->ckpt_interval);
        take[i] = want ? -2 : -1;
        if (want && (st = ckpt_reserve(s, s->st.n_ckpt + 1))) goto done;
    }
    int64_t k = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (take[i] != -2) continue;
        kv_seq *s = &c->seqs[seqs[i]];
        /* Its oldest goes once the new one is in (below); first when no slot is
         * free, so its slot may serve the new one before another's is evicted. */
        if (s->st.n_ckpt >= c->ckpt_max && c->n_slot_free == 0) ckpt_drop_first(c, s);
        take[i] = pkv_kv_state_slot_take(c);
        if (take[i] < 0) {
            c->stats.state_ckpt_skipped++;
            continue;
        }
        src[k] = s->st.slot;
        dst[k++] = take[i];
    }
    /* One batched copy per state arena: the live slots into the fresh ones. */
    st = copy_slots(c, src, dst, k, r);
    for (int i = 0; i < n_seqs; i++) {
        if (take[i] < 0) continue;
        if (st) { /* nothing was kept: the fresh slots go back */
            slot_release(c, take[i]);
            continue;
        }
        kv_seq *s = &c->seqs[seqs[i]];
        int32_t slot = take[i];
        int64_t pos = s->st.len;
        ck_push(c, slot, pos);
        ckpt_prune(c, s); /* a take above may have evicted one of its checkpoints */
        if (s->st.n_ckpt >= c->ckpt_max) ckpt_drop_first(c, s);
        s->st.ckpt[s->st.n_ckpt++] = (kv_ckpt){pos, slot, c->slots[slot].gen};
        /* At a page boundary of indexed pages: offer it to prefix matching (the
         * page holds a reference; it lets go when the page leaves the index). */
        int64_t m = pos / ps;
        if (pos % ps == 0 && m >= 1 && s->pub_n >= m && m <= pkv_kv_seq_pages(c, s)) {
            kv_page *p = &c->pages[pkv_kv_seq_page(s, m - 1)];
            if (p->indexed && !(p->st_slot >= 0 && slot_valid(c, p->st_slot, p->st_gen))) {
                p->st_slot = slot;
                p->st_gen = c->slots[slot].gen;
                c->slots[slot].refs++;
            }
        }
    }
done:
    if (take != stack) pkv_free(take);
    pkv_free(r);
    return st;
}

pkv_status pkv_kv_state_reset(pkv_kv_cache *c, int32_t seq) {
    if (!c) return pkv_err(PKV_ERR_INVALID, "state reset: cache is NULL");
    if (!kv_has_state(c)) return PKV_OK;
    kv_seq *s = pkv_kv_seq_resident(c, seq, "state reset");
    if (!s) return PKV_ERR_INVALID;
    /* as a rewind to the state's own length: a checkpoint there is kept and put back */
    int64_t len = s->st.len;
    s->st.len = len + 1;
    return pkv_kv_state_rewind(c, seq, len);
}

/* ------------------------------------------------------------------ kind */

/* A new live state slot can be had (checked before anything changes). */
pkv_status pkv_kv_state_slot_check(const pkv_kv_cache *c, const char *what, int32_t seq) {
    if (!kv_has_state(c) || pkv_kv_state_available(c) > 0) return PKV_OK;
    char who[48] = "";
    if (seq >= 0) snprintf(who, sizeof who, " of sequence %d", seq);
    return pkv_err(PKV_ERR_NOMEM, "%s%s: no recurrent-state slot can be had: all %lld state slots hold the live "
                   "states of other sequences (raise pkv_kv_params.state_slots)", what, who, (long long)c->n_slots);
}

static bool state_present(const pkv_kv_cache *c) { return kv_has_state(c); }

static size_t state_seq_bytes(const pkv_kv_cache *c) { return c->state_slot_bytes; }

static pkv_status state_new_check(pkv_kv_cache *c, bool fork, int32_t parent, const char *what) {
    if (fork && !pkv_kv_seq_resident(c, parent, what)) return PKV_ERR_INVALID;
    return pkv_kv_state_slot_check(c, what, fork ? parent : -1);
}

static pkv_status state_create(pkv_kv_cache *c, uint64_t fingerprint, int32_t *id) {
    (void)fingerprint;
    pkv_status st = pkv_kv_state_seq_new(c, *id);
    return st ? pkv_err_prefix(st, "create sequence") : PKV_OK;
}

/* The child's live state is a copy of the parent's; the checkpoints are shared. */
static pkv_status state_fork(pkv_kv_cache *c, int32_t parent, int32_t *child) {
    return pkv_kv_state_fork(c, parent, *child);
}

/* The recurrent state moves along with the tokens: the forward pass writes it in
 * the step that appends them, so it must hold every earlier token. */
static pkv_status state_append_check(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens) {
    for (int i = 0; n_seqs > 0 && seqs && n_tokens && i < n_seqs; i++) {
        if (seqs[i] < 0 || (size_t)seqs[i] >= c->n_seqs || !c->seqs[seqs[i]].live || c->seqs[seqs[i]].swapped)
            continue; /* the pools report it */
        const kv_seq *s = &c->seqs[seqs[i]];
        if (n_tokens[i] > 0 && s->st.len < s->n_tokens)
            return pkv_err(PKV_ERR_INVALID,
                           "append: the recurrent state of sequence %d has taken in %lld of its %lld tokens: run the "
                           "rest through the recurrent layers first (pkv_kv_state_replay; pkv_model_forward does it)",
                           seqs[i], (long long)s->st.len, (long long)s->n_tokens);
    }
    return PKV_OK;
}

static void state_appended(pkv_kv_cache *c, int n_seqs, const int32_t *seqs, const int32_t *n_tokens) {
    for (int i = 0; n_seqs > 0 && seqs && n_tokens && i < n_seqs; i++)
        if (n_tokens[i] > 0) c->seqs[seqs[i]].st.len += n_tokens[i];
}

/* The recurrent state goes back to the last checkpoint at or before n_keep. */
static pkv_status state_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    return pkv_kv_state_rewind(c, seq, n_keep);
}

static pkv_status state_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    if (n_remove == 0 && pos_delta == 0) return PKV_OK;
    return pkv_kv_state_rewind(c, seq, start);
}

/* A swapped sequence becomes resident: it needs a live state slot again. */
static pkv_status state_seq_clear_check(pkv_kv_cache *c, int32_t seq) {
    return c->seqs[seq].swapped ? pkv_kv_state_slot_check(c, "clear", seq) : PKV_OK;
}

static pkv_status state_seq_cleared(pkv_kv_cache *c, int32_t seq) { return pkv_kv_state_seq_empty(c, seq); }

/* The live state goes to a host copy with the pages (its slot is freed, its
 * checkpoints dropped) and comes back into a fresh slot. */
static pkv_status state_swap_out_prepare(pkv_kv_cache *c, int32_t seq, kv_pending *p) {
    if (!pkv_kv_seq_resident(c, seq, "swap out")) return PKV_ERR_INVALID;
    uint8_t *host = NULL;
    pkv_status st = pkv_kv_state_swap_out_prepare(c, seq, &host);
    p->ptr = host;
    return st;
}

static void state_swap_out_commit(pkv_kv_cache *c, int32_t seq, kv_pending p) {
    pkv_kv_state_swap_out_commit(c, seq, p.ptr);
}

static void state_swap_out_abort(pkv_kv_cache *c, int32_t seq, kv_pending p) {
    (void)c;
    (void)seq;
    pkv_free(p.ptr);
}

static pkv_status state_swap_in_prepare(pkv_kv_cache *c, int32_t seq, kv_pending *p) {
    int32_t slot = -1;
    kv_seq *s = pkv_kv_seq_get(c, seq, "swap in");
    pkv_status st = s && s->swapped ? pkv_kv_state_swap_in_prepare(c, seq, &slot) : PKV_OK;
    p->i = slot;
    return st;
}

static void state_swap_in_commit(pkv_kv_cache *c, int32_t seq, kv_pending p) {
    if (p.i >= 0) pkv_kv_state_swap_in_commit(c, seq, (int32_t)p.i);
}

static void state_swap_in_abort(pkv_kv_cache *c, int32_t seq, kv_pending p) {
    (void)seq;
    if (p.i >= 0) pkv_kv_state_slot_unref(c, (int32_t)p.i, c->slots[p.i].gen);
}

/* A prefix hit needs the state stored at its end. */
static bool state_prefix_ok(pkv_kv_cache *c, int32_t seq, int64_t m, kv_pending p) {
    (void)p;
    return pkv_kv_state_stored(c, pkv_kv_seq_page(&c->seqs[seq], m - 1), m * c->page_size);
}

static pkv_status state_prefix_take(pkv_kv_cache *c, int32_t seq, int64_t m, kv_pending p) {
    (void)p;
    return m > 0 ? pkv_kv_state_prefix_take(c, seq, m) : PKV_OK;
}

/* ---------------------------------------------------------- save / load */

/* The recurrent layers' part of a file (version 3): their geometry rows
 * {n_kv_heads, 0, state_per_head, KV_FILE_RECURRENT}; after the window span
 * (which this kind writes, 0 and n_tokens, when the cache has no window layers:
 * version 3 always has one) u64 state_len; and per recurrent layer one section,
 * its live state f32 [n_kv_heads][state_per_head], each head's parts
 * concatenated (the canonical order, whatever the sharding). part (load): a =
 * state_len. */
static bool state_holds_layer(const pkv_kv_cache *c, int il) { return c->layout.layers[il].state_per_head > 0; }

static size_t state_layer_bytes(const kv_layer *L) {
    return (size_t)L->n_kv_heads * (size_t)L->state_per_head * sizeof(float);
}

/* Move a recurrent layer's state in slot `slot` between its shards and the
 * canonical section canon: a shard's heads are one contiguous range of it,
 * permuted through tmp (a slot of the shard) where the layer's state has parts.
 * canon is only read when to_device. */
static pkv_status move_state(pkv_kv_cache *c, int il, int32_t slot, uint8_t *canon, uint8_t *tmp, bool to_device) {
    const kv_layer *L = &c->layout.layers[il];
    pkv_status st = PKV_OK;
    for (int ish = 0; ish < L->n_shards && !st; ish++) {
        const kv_shard *sh = &L->shards[ish];
        /* a replica (the heads of the shard before it) is written too but never read:
         * its slot need not hold the state (granitehybrid's one-group layers run on
         * the first shard's device alone, pkv_layer.rec_first) */
        if (!to_device && ish > 0 && sh->head_begin == sh[-1].head_begin && sh->n_heads == sh[-1].n_heads) continue;
        const kv_state_array *a = &c->st_arrays[sh->s_array];
        pkv_buffer *buf = c->st_arenas[a->arena].buf;
        size_t off = a->off + (size_t)slot * a->slot_bytes;
        uint8_t *h = L->n_parts ? tmp : canon + (size_t)sh->head_begin * (size_t)L->state_per_head * sizeof(float);
        if (to_device && L->n_parts) pkv_kv_state_permute(L, sh->head_begin, sh->n_heads, tmp, canon, true);
        st = to_device ? pkv_buffer_write(buf, off, h, a->slot_bytes) : pkv_buffer_read(buf, off, h, a->slot_bytes);
        if (!st && !to_device && L->n_parts) pkv_kv_state_permute(L, sh->head_begin, sh->n_heads, tmp, canon, false);
    }
    return st;
}

/* ---------------------------------------------------- the disk tier's states */

size_t pkv_kv_state_canon_bytes(const pkv_kv_cache *c) {
    size_t n = 0;
    for (int il = 0; kv_has_state(c) && il < c->layout.n_layers; il++)
        if (state_holds_layer(c, il)) n += state_layer_bytes(&c->layout.layers[il]);
    return n;
}

/* Every recurrent layer's state in slot between the device and canon (the layers'
 * canonical sections in order), through a staging slot of the largest array. */
static pkv_status canon_move(pkv_kv_cache *c, int32_t slot, uint8_t *canon, bool to_device) {
    size_t tb = 1;
    for (int a = 0; a < c->n_st_arrays; a++) tb = PKV_MAX(tb, c->st_arrays[a].slot_bytes);
    uint8_t *tmp = pkv_malloc(tb);
    if (!tmp) return pkv_err(PKV_ERR_NOMEM, "recurrent state: no memory for a staging slot of %zu bytes", tb);
    pkv_status st = PKV_OK;
    for (int il = 0; il < c->layout.n_layers && !st; il++) {
        if (!state_holds_layer(c, il)) continue;
        st = move_state(c, il, slot, canon, tmp, to_device);
        canon += state_layer_bytes(&c->layout.layers[il]);
    }
    pkv_free(tmp);
    return st;
}

bool pkv_kv_state_page_offered(const pkv_kv_cache *c, int32_t page, int64_t *pos) {
    if (!kv_has_state(c) || page < 0) return false;
    const kv_page *p = &c->pages[page];
    if (p->st_slot < 0 || !slot_valid(c, p->st_slot, p->st_gen) || !c->slots[p->st_slot].ckpt) return false;
    *pos = c->slots[p->st_slot].pos;
    return true;
}

pkv_status pkv_kv_state_page_read(pkv_kv_cache *c, int32_t page, uint8_t *canon) {
    int64_t pos;
    if (!pkv_kv_state_page_offered(c, page, &pos))
        return pkv_err(PKV_ERR_INTERNAL, "page %d offers no recurrent state", page);
    return canon_move(c, c->pages[page].st_slot, canon, false);
}

pkv_status pkv_kv_state_page_offer(pkv_kv_cache *c, int32_t page, const uint8_t *canon, int64_t pos) {
    int64_t had;
    if (!kv_has_state(c) || pkv_kv_state_page_offered(c, page, &had)) return PKV_OK;
    int32_t slot = pkv_kv_state_slot_take(c); /* may evict the oldest checkpoint */
    if (slot < 0) { /* every slot holds a live state: the page is matched without one */
        c->stats.state_ckpt_skipped++;
        return PKV_OK;
    }
    pkv_status st = canon_move(c, slot, (uint8_t *)canon, true);
    if (st) {
        slot_release(c, slot);
        return st;
    }
    ck_push(c, slot, pos);
    kv_page *p = &c->pages[page];
    p->st_slot = slot; /* the taker's reference is the page's */
    p->st_gen = c->slots[slot].gen;
    return PKV_OK;
}

static int state_file_bytes(const pkv_kv_cache *c, const kv_file *f, const kv_file_part *part, kv_file_at at, int il,
                            size_t bytes[2]) {
    (void)f;
    (void)part;
    if (at == KV_FILE_HEADER) bytes[0] = c->sub ? 8 : 24;
    if (at == KV_FILE_LAYER) bytes[0] = state_layer_bytes(&c->layout.layers[il]);
    if (at == KV_FILE_STAGING)
        for (int a = 0; a < c->n_st_arrays; a++) bytes[0] = PKV_MAX(bytes[0], c->st_arrays[a].slot_bytes);
    return at == KV_FILE_HEADER || at == KV_FILE_LAYER;
}

static pkv_status state_save(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    (void)part;
    const kv_seq *s = &c->seqs[f->seq];
    if (at == KV_FILE_ROW) {
        const kv_layer *L = &c->layout.layers[il];
        pkv_kv_file_put32(f, (uint32_t)L->n_kv_heads);
        pkv_kv_file_put32(f, 0);
        pkv_kv_file_put32(f, (uint32_t)L->state_per_head);
        pkv_kv_file_put32(f, KV_FILE_RECURRENT);
    }
    if (at == KV_FILE_HEADER) {
        if (!c->sub) { /* the window span of a cache without window layers */
            pkv_kv_file_put64(f, 0);
            pkv_kv_file_put64(f, (uint64_t)f->n_tokens);
        }
        pkv_kv_file_put64(f, (uint64_t)s->st.len);
    }
    if (at == KV_FILE_LAYER) {
        pkv_status st = move_state(c, il, s->st.slot, f->canon, f->tmp, false);
        return st ? st : pkv_kv_file_write(f, f->canon, state_layer_bytes(&c->layout.layers[il]), il);
    }
    return PKV_OK;
}

static pkv_status state_load_check(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    if (at == KV_FILE_ROW) {
        const kv_layer *L = &c->layout.layers[il];
        uint32_t h = pkv_kv_file_get32(f), dk = pkv_kv_file_get32(f), dv = pkv_kv_file_get32(f),
                 dt = pkv_kv_file_get32(f);
        pkv_status st = pkv_kv_file_row_kind(f, il, dt, true);
        if (st) return st;
        if (h != (uint32_t)L->n_kv_heads || dk != 0 || dv != (uint32_t)L->state_per_head)
            return pkv_err(PKV_ERR_FORMAT, "%s: recurrent layer %d has a state of %u heads x %u floats in the file, "
                           "%d x %d in the cache", f->path, il, h, dv, L->n_kv_heads, L->state_per_head);
        return PKV_OK;
    }
    if (at == KV_FILE_HEADER) {
        pkv_status st = PKV_OK;
        if (!c->sub) {
            uint64_t wf = pkv_kv_file_get64(f), wl = pkv_kv_file_get64(f);
            if ((st = pkv_kv_window_span_check(f, wf, wl, false))) return st;
        }
        uint64_t sl = pkv_kv_file_get64(f);
        if (sl > (uint64_t)f->n_tokens)
            return pkv_err(PKV_ERR_FORMAT, "%s is corrupt: a recurrent state of %llu tokens in a sequence of %llu",
                           f->path, (unsigned long long)sl, (unsigned long long)f->n_tokens);
        part->a = (int64_t)sl;
        return PKV_OK;
    }
    if (at == KV_FILE_FIT && pkv_kv_state_available(c) < 1)
        return pkv_err(PKV_ERR_NOMEM, "load of %s: no recurrent-state slot can be had: all %lld state slots hold the "
                       "live states of other sequences (raise pkv_kv_params.state_slots)", f->path,
                       (long long)c->n_slots);
    return PKV_OK;
}

/* A live slot holding the file's states. */
static pkv_status state_load(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    int32_t slot = pkv_kv_state_slot_take(c); /* available: checked at KV_FILE_FIT */
    if (slot < 0) return pkv_err(PKV_ERR_INTERNAL, "no recurrent-state slot after the check");
    pkv_status st = PKV_OK;
    for (int il = 0; il < c->layout.n_layers && !st; il++)
        if (c->layout.layers[il].state_per_head > 0)
            st = move_state(c, il, slot, (uint8_t *)f->data + f->layer_off[il], f->tmp, true);
    if (st) {
        pkv_kv_state_slot_unref(c, slot, c->slots[slot].gen);
        return st;
    }
    kv_seq *s = &c->seqs[f->seq];
    s->st.slot = slot;
    s->st.len = part->a;
    return PKV_OK;
}

static void state_load_undo(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    (void)part;
    kv_seq *s = &c->seqs[f->seq];
    if (s->st.slot >= 0) pkv_kv_state_slot_unref(c, s->st.slot, c->slots[s->st.slot].gen);
    s->st.slot = -1;
    s->st.len = 0;
}

const pkv_mem_kind kv_kind_state = {
    .name = "recurrent state",
    .present = state_present,
    .seq_bytes = state_seq_bytes,
    .new_check = state_new_check,
    .create = state_create,
    .fork = state_fork,
    .append_check = state_append_check,
    .appended = state_appended,
    .truncate = state_truncate,
    .shift = state_shift,
    .seq_clear_check = state_seq_clear_check,
    .seq_cleared = state_seq_cleared,
    .clear_check = pkv_kv_state_clear_check,
    .cleared = pkv_kv_state_clear,
    .swap_out_prepare = state_swap_out_prepare,
    .swap_out_commit = state_swap_out_commit,
    .swap_out_abort = state_swap_out_abort,
    .swap_in_prepare = state_swap_in_prepare,
    .swap_in_commit = state_swap_in_commit,
    .swap_in_abort = state_swap_in_abort,
    .prefix_ok = state_prefix_ok,
    .prefix_take = state_prefix_take,
    .file_version = 3,
    .file_what = "recurrent layers",
    .holds_layer = state_holds_layer,
    .file_bytes = state_file_bytes,
    .save = state_save,
    .load_check = state_load_check,
    .load = state_load,
    .load_undo = state_load_undo,
};
