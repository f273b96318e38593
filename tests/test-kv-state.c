// labels: kv vulkan
/* Recurrent state beside the paged KV (layers with state_per_head > 0,
 * src/kv/kv-state.c), checked by content: known patterns are written into a
 * sequence's live state slot through pkv_buffer_write at the offsets pkv_kv_shard
 * reports, and read back the same way after each operation:
 *  - a new sequence's state is zero (even in a slot a freed sequence had written);
 *  - append moves the state length; an append on a state that is behind is
 *    refused (nothing changes) and pkv_kv_state_replay moves it;
 *  - pkv_kv_state_step_done takes checkpoints per the policy (every step of more
 *    than one token, else every state_ckpt_interval tokens; at most
 *    state_ckpt_max per sequence, the oldest dropped);
 *  - truncate and shift put back the right checkpoint's bytes (or zero) and its
 *    length; fork copies the live state bit for bit and shares the checkpoints,
 *    and the child's writes do not reach the parent;
 *  - swap out / in and save / load (into a fresh cache, and into one with another
 *    shard split and devices) are bit-identical, K/V and tokens included; files
 *    of another state geometry, and of caches without recurrent layers, are
 *    refused naming what differs;
 *  - a prefix match stops at the deepest matched page boundary with a stored state
 *    and takes that state; offers die with the page (eviction);
 *  - out of slots: the globally oldest checkpoint goes first, then create, fork
 *    and swap in fail with PKV_ERR_NOMEM naming state_slots, changing nothing;
 *  - seq_clear and clear zero the state; a cache with window layers as well;
 *  - every operation with its 1st, 2nd, ... allocation failing: PKV_ERR_NOMEM and
 *    nothing changed (lengths, state lengths, live states, slot and page counts),
 *    a load into a cache with window layers too (both pools' pages);
 *  - random steps, truncates, shifts, forks, swaps, clears and frees against a
 *    reference of each sequence's live state, state length and checkpoints;
 *  - a cache without recurrent layers reports state stats 0;
 *  - a state made of parts (pkv_kv_layer_desc.state_part, a gated delta-net's
 *    layout): known slot images written in every shard save as the canonical
 *    per-head state (found byte for byte in the file), load into caches of other
 *    shardings and devices with exactly those bytes, and back; fork and swap keep
 *    them; the parts are part of the fingerprint (sharding is not, one part is no
 *    parts); bad part lists are refused naming the layer.
 * Devices: cpu; cpu + cpu:1 (heads split, tensor-parallel style); vulkan:0
 * (lavapipe) and cuda:0 when they open, else those parts are skipped with a note. */
#include "kv-testlib.h"

enum { PS = 4 };

typedef struct env {
    pkv_device *a, *b;
    pkv_kv_layer_desc L[4];
    pkv_kv_shard_desc S[4][3];
} env;

/* L0: attention, 2 heads, K 8 / V 8 f16, head 0 on a, head 1 on b.
 * L1: recurrent, 3 heads x sph1 floats; split 0: heads 0-1 on a, 2 on b; split 1: all on b;
 *     split 2: all on a, and a replica of them on b.
 * L2: attention, 1 head, K 4 / V 4 f32, on a (window > 0: a sliding-window layer).
 * L3: recurrent, 2 heads x 7 floats; split 0: head 0 on b, 1 on a; split 1: one shard on a. */
static void layout(env *e, int split, int sph1, int window) {
    memset(e->L, 0, sizeof e->L);
    e->L[0] = (pkv_kv_layer_desc){.n_kv_heads = 2, .head_dim_k = 8, .head_dim_v = 8, .dtype_k = PKV_TYPE_F16,
                                  .dtype_v = PKV_TYPE_F16, .n_shards = 2, .shards = e->S[0]};
    e->S[0][0] = (pkv_kv_shard_desc){e->a, NULL, 0, 1};
    e->S[0][1] = (pkv_kv_shard_desc){e->b, NULL, 1, 1};
    e->L[1] = (pkv_kv_layer_desc){.n_kv_heads = 3, .state_per_head = sph1, .shards = e->S[1]};
    if (split == 0) {
        e->L[1].n_shards = 2;
        e->S[1][0] = (pkv_kv_shard_desc){e->a, NULL, 0, 2};
        e->S[1][1] = (pkv_kv_shard_desc){e->b, NULL, 2, 1};
    } else if (split == 2) { /* replicas: the layer runs on a alone (pkv_layer.rec_first), b's copy is not kept */
        e->L[1].n_shards = 2;
        e->S[1][0] = (pkv_kv_shard_desc){e->a, NULL, 0, 3};
        e->S[1][1] = (pkv_kv_shard_desc){e->b, NULL, 0, 3};
    } else {
        e->L[1].n_shards = 1;
        e->S[1][0] = (pkv_kv_shard_desc){e->b, NULL, 0, 3};
    }
    e->L[2] = (pkv_kv_layer_desc){.n_kv_heads = 1, .head_dim_k = 4, .head_dim_v = 4, .dtype_k = PKV_TYPE_F32,
                                  .dtype_v = PKV_TYPE_F32, .window = window};
    e->L[3] = (pkv_kv_layer_desc){.n_kv_heads = 2, .state_per_head = 7, .shards = e->S[3]};
    if (split == 0) {
        e->L[3].n_shards = 2;
        e->S[3][0] = (pkv_kv_shard_desc){e->a, NULL, 1, 1};
        e->S[3][1] = (pkv_kv_shard_desc){e->b, NULL, 0, 1};
    } else {
        e->L[3].n_shards = 1;
        e->S[3][0] = (pkv_kv_shard_desc){e->a, NULL, 0, 2};
    }
}

static pkv_kv_params params(env *e, int64_t slots, int interval, int ckpt_max) {
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = 4;
    p.layers = e->L;
    p.device = e->a;
    p.page_size = PS;
    p.n_pages = 64;
    p.host_pages = 64;
    p.rope_n_rot = 4;
    p.state_slots = slots;
    p.state_ckpt_interval = interval;
    p.state_ckpt_max = ckpt_max;
    return p;
}

static pkv_kv_cache *make(env *e, int split, int64_t slots, int interval, int ckpt_max) {
    layout(e, split, 5, 0);
    pkv_kv_cache *c = pkv_kv_cache_create(params(e, slots, interval, ckpt_max));
    if (!c) TH_FAIL("cache: %s", pkv_errmsg());
    return c;
}

/* ------------------------------------------------------------ state I/O */

static const int k_rec[2] = {1, 3};
enum { MAXF = 64 };

static int st_floats(const pkv_kv_cache *c, int il) {
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li);
    return li.n_kv_heads * li.state_per_head;
}

/* Pattern `tag` of layer il: 0 is all zero; others distinct and not round. */
static void pattern(uint64_t tag, int il, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = tag ? (float)tag * 1000.0f + (float)il * 100.0f + (float)i + 0.25f : 0.0f;
}

/* Read or write layer il's live state of seq ([n_kv_heads][state_per_head] f32)
 * through the offsets pkv_kv_shard reports, shard by shard. */
static pkv_status st_io(pkv_kv_cache *c, int32_t seq, int il, float *vals, bool write) {
    int32_t slot;
    pkv_status st = pkv_kv_state_slots(c, 1, &seq, &slot);
    if (st) return st;
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li);
    for (int s = 0; s < li.n_shards && !st; s++) {
        pkv_kv_shard_info si;
        if ((st = pkv_kv_shard(c, il, s, &si))) return st;
        if (!si.state || si.state_slot_bytes != (size_t)si.n_heads * li.state_per_head * 4 || slot >= si.n_state_slots)
            return pkv_err(PKV_ERR_INTERNAL, "layer %d shard %d: bad state info", il, s);
        size_t off = si.state_off + (size_t)slot * si.state_slot_bytes;
        float *h = vals + (size_t)si.head_begin * li.state_per_head;
        st = write ? pkv_buffer_write(si.state, off, h, si.state_slot_bytes)
                   : pkv_buffer_read(si.state, off, h, si.state_slot_bytes);
    }
    return st;
}

static void put_state(pkv_kv_cache *c, int32_t seq, uint64_t tag) {
    for (int k = 0; k < 2; k++) {
        float v[MAXF];
        int n = st_floats(c, k_rec[k]);
        pattern(tag, k_rec[k], n, v);
        CHECK_OK(st_io(c, seq, k_rec[k], v, true));
    }
}

/* The live state of seq is pattern `tag` in every recurrent layer, bit for bit. */
static bool state_is(pkv_kv_cache *c, int32_t seq, uint64_t tag) {
    for (int k = 0; k < 2; k++) {
        float want[MAXF], got[MAXF];
        int n = st_floats(c, k_rec[k]);
        pattern(tag, k_rec[k], n, want);
        memset(got, 0xcd, sizeof got);
        if (st_io(c, seq, k_rec[k], got, false)) return false;
        if (memcmp(want, got, (size_t)n * sizeof *got)) {
            fprintf(stderr, "  seq %d layer %d: state[0] %g, pattern %llu has %g\n", seq, k_rec[k], (double)got[0],
                    (unsigned long long)tag, (double)want[0]);
            return false;
        }
    }
    return true;
}

static pkv_kv_stats stats(const pkv_kv_cache *c) {
    pkv_kv_stats s;
    pkv_kv_stats_get(c, &s);
    return s;
}

/* Append n tokens (ids tok0, tok0 + 1, ...) and write K/V rows of the attention
 * layers (value f(token, element)), as a forward pass would. */
static pkv_status app(pkv_kv_cache *c, int32_t seq, int n, int32_t tok0) {
    int32_t toks[64], rows[64];
    for (int i = 0; i < n; i++) toks[i] = tok0 + i;
    pkv_status st = pkv_kv_append(c, seq, n, toks, NULL, rows);
    pkv_kv_layer_info li;
    for (int i = 0; i < n && !st; i++)
        for (int il = 0; il < 3 && !st; il += 2)
            for (int v = 0; v < 2 && !st && !pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li) && !li.window; v++) {
                float row[16];
                for (int j = 0; j < kt_dim(c, il, v); j++) row[j] = (float)((toks[i] * 7 + j * 3 + v) % 50) * 0.5f;
                st = kt_write_row(c, il, v, rows[i], row);
            }
    return st;
}

/* One forward step: append n tokens, write the state the step leaves (tag), step done. */
static void step(pkv_kv_cache *c, int32_t seq, int n, int32_t tok0, uint64_t tag) {
    CHECK_OK(app(c, seq, n, tok0));
    put_state(c, seq, tag);
    CHECK_OK(pkv_kv_state_step_done(c, 1, &seq, &n));
}

/* Both sequences hold the same tokens, positions and K/V (device reads). */
static bool same_kv(pkv_kv_cache *ca, int32_t a, pkv_kv_cache *cb, int32_t b) {
    int64_t n = pkv_kv_seq_len(ca, a);
    if (n != pkv_kv_seq_len(cb, b) || n > 64) return false;
    int32_t ta[64], tb[64], pa[64], pb[64];
    if (n && (pkv_kv_seq_tokens(ca, a, 0, n, ta, pa) || pkv_kv_seq_tokens(cb, b, 0, n, tb, pb))) return false;
    if (memcmp(ta, tb, (size_t)n * 4) || memcmp(pa, pb, (size_t)n * 4)) return false;
    for (int il = 0; il < 3; il += 2)
        for (int v = 0; v < 2; v++) {
            float xa[64 * 16], xb[64 * 16];
            if (kt_read_seq(ca, a, il, v, xa) || kt_read_seq(cb, b, il, v, xb)) return false;
            if (memcmp(xa, xb, (size_t)n * (size_t)kt_dim(ca, il, v) * 4)) return false;
        }
    return true;
}

/* -------------------------------------------------------------- layout */

static void test_layout(env *e) {
    layout(e, 0, 5, 0);
    pkv_kv_cache *c = pkv_kv_cache_create(params(e, 0, 0, 0));
    REQUIRE_VOID(c);
    pkv_kv_layer_info li;
    CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), 1, &li));
    CHECK_INT(li.state_per_head, 5);
    CHECK_INT(li.k_page_bytes, 0);
    CHECK_INT(li.v_page_bytes, 0);
    CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), 0, &li));
    CHECK_INT(li.state_per_head, 0);
    pkv_kv_shard_info si;
    CHECK_OK(pkv_kv_shard(c, 1, 1, &si));
    CHECK(si.state != NULL && si.k == NULL && si.v == NULL);
    CHECK_INT(si.head_begin, 2);
    CHECK_INT(si.n_heads, 1);
    CHECK_INT(si.state_slot_bytes, 5 * 4);
    CHECK_INT(si.n_state_slots, 4 * (4 + 1)); /* the defaults: 4 checkpoints per sequence */
    CHECK(pkv_buffer_device(si.state) == e->b);
    CHECK_OK(pkv_kv_shard(c, 0, 0, &si));
    CHECK(si.state == NULL && si.n_state_slots == 0 && si.k != NULL);
    pkv_kv_stats s = stats(c);
    CHECK_INT(s.state_slots, 20);
    CHECK_INT(s.state_free, 20);
    CHECK_INT(s.state_slot_bytes, (3 * 5 + 2 * 7) * 4);
    /* the page budget counts the attention layers only */
    CHECK_INT(s.page_bytes, PS * (2 * (8 + 8) * 2 + 1 * (4 + 4) * 4));
    uint64_t fp = pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c));
    pkv_kv_cache_free(c);

    /* the state size is part of the geometry */
    layout(e, 0, 6, 0);
    c = pkv_kv_cache_create(params(e, 0, 0, 0));
    REQUIRE_VOID(c);
    CHECK(pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c)) != fp);
    pkv_kv_cache_free(c);
    /* but not the sharding */
    layout(e, 1, 5, 0);
    c = pkv_kv_cache_create(params(e, 0, 0, 0));
    REQUIRE_VOID(c);
    CHECK(pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c)) == fp);
    pkv_kv_cache_free(c);

    layout(e, 0, -1, 0);
    CHECK(pkv_kv_cache_create(params(e, 0, 0, 0)) == NULL);
    CHECK_MSG("layer 1: state_per_head -1");
    layout(e, 0, 5, 0);
    e->S[1][1].head_begin = 1; /* heads 1..1 twice, head 2 in no shard */
    CHECK(pkv_kv_cache_create(params(e, 0, 0, 0)) == NULL);
    CHECK_MSG("layer 1: shards overlap");
    layout(e, 0, 5, 0);
    CHECK(pkv_kv_cache_create(params(e, -1, 0, 0)) == NULL);
    CHECK_MSG("state_slots -1");
    /* every layer recurrent: pages hold only token ids, their count must be given */
    pkv_kv_params p = params(e, 0, 0, 0);
    p.layers = &e->L[1];
    p.n_layers = 1;
    p.n_pages = 0;
    p.budget_bytes = 1 << 20;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("set n_pages");
    p.n_pages = 8;
    c = pkv_kv_cache_create(p);
    CHECK(c != NULL);
    pkv_kv_cache_free(c);

    /* attach refuses a recurrent layer */
    c = make(e, 0, 0, 0, 0);
    REQUIRE_VOID(c);
    pkv_kv_attach_layer al = {1, 3, 0, 0, PKV_TYPE_F32, PKV_TYPE_F32, NULL};
    CHECK_STATUS(pkv_kv_attach(c, "draft", PS, &al, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("which is recurrent");
    pkv_kv_cache_free(c);
}

/* A cache without recurrent layers is as before: state stats 0, the state length
 * is the length, step_done a no-op. */
static void test_no_state(env *e) {
    layout(e, 0, 5, 0);
    e->L[1] = e->L[0];
    e->L[3] = e->L[0];
    pkv_kv_cache *c = pkv_kv_cache_create(params(e, 0, 0, 0));
    REQUIRE_VOID(c);
    int32_t s;
    CHECK_OK(pkv_kv_seq_create(c, 1, &s));
    CHECK_OK(app(c, s, 5, 10));
    int32_t n = 5, slot;
    CHECK_OK(pkv_kv_state_step_done(c, 1, &s, &n));
    CHECK_INT(pkv_kv_seq_state_len(c, s), 5);
    CHECK_STATUS(pkv_kv_state_slots(c, 1, &s, &slot), PKV_ERR_INVALID);
    pkv_kv_stats st = stats(c);
    CHECK(st.state_slots == 0 && st.state_free == 0 && st.state_checkpoints == 0 && st.state_slot_bytes == 0 &&
          st.state_copies == 0 && st.state_restores == 0 && st.state_prefix_hits == 0);
    pkv_kv_shard_info si;
    CHECK_OK(pkv_kv_shard(c, 1, 0, &si));
    CHECK(si.state == NULL && si.n_state_slots == 0);
    pkv_kv_cache_free(c);
}

/* ------------------------------------------------- the basic operations */

static void test_ops(env *e, int split) {
    pkv_kv_cache *c = make(e, split, 16, 8, 3);
    REQUIRE_VOID(c);
    int32_t a, x;
    /* a new sequence is zero, even in a slot someone wrote and gave back */
    CHECK_OK(pkv_kv_seq_create(c, 0, &x));
    put_state(c, x, 99);
    CHECK(state_is(c, x, 99));
    CHECK_OK(pkv_kv_seq_free(c, x));
    CHECK_OK(pkv_kv_seq_create(c, 0, &a));
    CHECK(state_is(c, a, 0));
    CHECK_INT(stats(c).state_free, 15);

    /* a prompt of 6: a checkpoint at its end; then decode: one every 8 tokens */
    step(c, a, 6, 100, 6);
    CHECK_INT(pkv_kv_seq_state_len(c, a), 6);
    CHECK_INT(stats(c).state_checkpoints, 1);
    CHECK_INT(stats(c).state_copies, 1);
    for (int t = 7; t <= 16; t++) {
        step(c, a, 1, 100 + t, (uint64_t)t);
        CHECK_INT(stats(c).state_checkpoints, t < 14 ? 1 : 2);
    }
    CHECK_INT(stats(c).state_free, 16 - 3);
    CHECK(state_is(c, a, 16));

    /* truncate to 15: the checkpoint at 14 comes back, 15 and 16 are recomputed */
    CHECK_OK(pkv_kv_truncate(c, a, 15));
    CHECK_INT(pkv_kv_seq_len(c, a), 15);
    CHECK_INT(pkv_kv_seq_state_len(c, a), 14);
    CHECK(state_is(c, a, 14));
    CHECK_INT(stats(c).state_restores, 1);
    /* behind: an append is refused, nothing changes */
    int32_t rows[4], tok = 7;
    CHECK_STATUS(pkv_kv_append(c, a, 1, &tok, NULL, rows), PKV_ERR_INVALID);
    CHECK_MSG("has taken in 14 of its 15 tokens");
    CHECK_INT(pkv_kv_seq_len(c, a), 15);
    CHECK_STATUS(pkv_kv_state_replay(c, a, 2), PKV_ERR_INVALID);
    CHECK_OK(pkv_kv_state_replay(c, a, 1));
    CHECK_INT(pkv_kv_seq_state_len(c, a), 15);
    put_state(c, a, 15);
    /* truncating at or after the state's length keeps the live state */
    CHECK_OK(pkv_kv_truncate(c, a, 15));
    CHECK(state_is(c, a, 15));
    step(c, a, 1, 116, 16);
    /* truncate to 10: the checkpoint at 14 goes, the one at 6 comes back */
    CHECK_OK(pkv_kv_truncate(c, a, 10));
    CHECK_INT(pkv_kv_seq_state_len(c, a), 6);
    CHECK(state_is(c, a, 6));
    CHECK_INT(stats(c).state_checkpoints, 1);
    /* below every checkpoint: zero */
    CHECK_OK(pkv_kv_truncate(c, a, 5));
    CHECK_INT(pkv_kv_seq_state_len(c, a), 0);
    CHECK(state_is(c, a, 0));
    CHECK_INT(stats(c).state_checkpoints, 0);
    CHECK_INT(stats(c).state_free, 15);

    /* at most 3 checkpoints per sequence: the oldest goes */
    CHECK_OK(pkv_kv_state_replay(c, a, 5));
    for (int t = 0; t < 5; t++) step(c, a, 2, 200 + 2 * t, (uint64_t)(7 + 2 * t)); /* ends at 7, 9, ..., 15 */
    CHECK_INT(stats(c).state_checkpoints, 3);
    CHECK_OK(pkv_kv_truncate(c, a, 10)); /* 11, 13, 15 kept: none at or before 10 */
    CHECK_INT(pkv_kv_seq_state_len(c, a), 0);
    CHECK(state_is(c, a, 0));
    CHECK_OK(pkv_kv_state_replay(c, a, 10));
    for (int t = 0; t < 3; t++) step(c, a, 2, 300 + 2 * t, (uint64_t)(12 + 2 * t)); /* 12, 14, 16 */

    /* fork: a copy of the live state, the checkpoints shared */
    uint64_t copies = stats(c).state_copies;
    int32_t b;
    CHECK_OK(pkv_kv_fork(c, a, &b));
    CHECK_INT(stats(c).state_copies, copies + 1);
    CHECK_INT(pkv_kv_seq_state_len(c, b), 16);
    CHECK(state_is(c, b, 16));
    CHECK_INT(stats(c).state_checkpoints, 3);
    put_state(c, b, 77);
    CHECK(state_is(c, a, 16));
    CHECK(state_is(c, b, 77));
    step(c, b, 1, 400, 17);
    CHECK(state_is(c, a, 16));
    /* the child goes back to a shared checkpoint, the parent still has them all */
    CHECK_OK(pkv_kv_truncate(c, b, 13));
    CHECK(state_is(c, b, 12));
    CHECK_INT(pkv_kv_seq_state_len(c, b), 12);
    CHECK_OK(pkv_kv_truncate(c, a, 15));
    CHECK(state_is(c, a, 14));
    CHECK_INT(stats(c).state_checkpoints, 2); /* 12 (both), 14 (a); 16 dropped by both */

    /* shift: the state goes back to the last checkpoint at or before `start` */
    CHECK_OK(pkv_kv_state_replay(c, a, 1));
    put_state(c, a, 15);
    CHECK_OK(pkv_kv_shift(c, a, 14, 0, 0)); /* changes nothing */
    CHECK(state_is(c, a, 15));
    CHECK_OK(pkv_kv_shift(c, a, 13, 1, -1));
    CHECK_INT(pkv_kv_seq_len(c, a), 14);
    CHECK_INT(pkv_kv_seq_state_len(c, a), 12);
    CHECK(state_is(c, a, 12));

    /* swap out / in: bit-identical, the length kept, the slot freed meanwhile */
    CHECK_OK(pkv_kv_state_replay(c, a, 2));
    put_state(c, a, 55);
    int64_t free0 = stats(c).state_free;
    CHECK_OK(pkv_kv_swap_out(c, a));
    CHECK(stats(c).state_free > free0);
    CHECK_INT(pkv_kv_seq_state_len(c, a), 14);
    CHECK_STATUS(pkv_kv_state_replay(c, a, 0), PKV_ERR_INVALID); /* swapped */
    int32_t filler; /* takes the freed slot: a must come back into another one */
    CHECK_OK(pkv_kv_seq_create(c, 0, &filler));
    put_state(c, filler, 3);
    CHECK_OK(pkv_kv_swap_in(c, a));
    CHECK(state_is(c, a, 55));
    CHECK(state_is(c, filler, 3));
    CHECK_INT(pkv_kv_seq_state_len(c, a), 14);
    CHECK_OK(pkv_kv_truncate(c, a, 13)); /* its checkpoints went with the swap: zero */
    CHECK(state_is(c, a, 0));
    CHECK_INT(pkv_kv_seq_state_len(c, a), 0);

    /* seq_clear: empty and zero */
    CHECK_OK(pkv_kv_state_replay(c, a, 13));
    put_state(c, b, 5);
    CHECK_OK(pkv_kv_seq_clear(c, b));
    CHECK(state_is(c, b, 0));
    CHECK_INT(pkv_kv_seq_state_len(c, b), 0);
    CHECK_INT(pkv_kv_seq_len(c, b), 0);
    /* clear all, with a swapped sequence: every state zero, no checkpoint */
    step(c, a, 3, 500, 8);
    CHECK_OK(pkv_kv_swap_out(c, filler));
    CHECK_OK(pkv_kv_clear(c));
    CHECK(!pkv_kv_seq_swapped(c, filler));
    CHECK(state_is(c, a, 0) && state_is(c, b, 0) && state_is(c, filler, 0));
    CHECK_INT(stats(c).state_checkpoints, 0);
    CHECK_INT(stats(c).state_free, 16 - 3);
    CHECK_INT(pkv_kv_seq_state_len(c, a), 0);
    step(c, a, 3, 600, 9);
    CHECK(state_is(c, a, 9));
    pkv_kv_cache_free(c);
}

/* -------------------------------------------------------------- files */

static void test_files(env *e, pkv_device *other_a, pkv_device *other_b) {
    pkv_kv_cache *c = make(e, 0, 16, 8, 3);
    REQUIRE_VOID(c);
    int32_t a;
    CHECK_OK(pkv_kv_seq_create(c, 42, &a));
    step(c, a, 9, 10, 9);
    step(c, a, 1, 19, 10);
    step(c, a, 1, 20, 11);
    CHECK_OK(pkv_kv_truncate(c, a, 10)); /* the state is behind: 9 of 10 */
    put_state(c, a, 123);                 /* (what a replay would leave; any bytes will do) */
    const char *path = th_tmp("kv-state.seq");
    CHECK_OK(pkv_kv_seq_save(c, a, path));

    /* into the same cache, and into a fresh one of another split and devices */
    int32_t b;
    CHECK_OK(pkv_kv_seq_load(c, path, 0, &b));
    CHECK(state_is(c, b, 123));
    CHECK_INT(pkv_kv_seq_state_len(c, b), 9);
    CHECK(same_kv(c, a, c, b));
    env e2 = *e;
    e2.a = other_a;
    e2.b = other_b;
    pkv_kv_cache *c2 = make(&e2, 1, 8, 0, 0);
    REQUIRE_VOID(c2);
    int32_t x, d;
    CHECK_OK(pkv_kv_seq_create(c2, 0, &x)); /* so the loaded one takes another slot */
    CHECK_OK(pkv_kv_seq_load(c2, path, 0, &d));
    CHECK(state_is(c2, d, 123));
    CHECK_INT(pkv_kv_seq_state_len(c2, d), 9);
    CHECK_INT(pkv_kv_seq_len(c2, d), 10);
    CHECK(same_kv(c, a, c2, d));
    /* and saved again from there, byte for byte the same file */
    const char *path2 = th_tmp("kv-state2.seq");
    CHECK_OK(pkv_kv_seq_save(c2, d, path2));
    {
        static char f1[1 << 16], f2[1 << 16];
        FILE *f = fopen(path, "rb"), *g = fopen(path2, "rb");
        size_t n1 = f ? fread(f1, 1, sizeof f1, f) : 0, n2 = g ? fread(f2, 1, sizeof f2, g) : 1;
        if (f) fclose(f);
        if (g) fclose(g);
        CHECK(n1 > 0 && n1 == n2 && memcmp(f1, f2, n1) == 0);
        uint32_t version = 0;
        memcpy(&version, f1 + 8, 4);
        CHECK_INT(version, 3);
    }
    remove(path2);
    pkv_kv_cache_free(c2);

    /* other state sizes: refused, naming the layer */
    layout(&e2, 0, 6, 0);
    c2 = pkv_kv_cache_create(params(&e2, 0, 0, 0));
    REQUIRE_VOID(c2);
    pkv_kv_stats s0 = stats(c2);
    CHECK_STATUS(pkv_kv_seq_load(c2, path, 0, &d), PKV_ERR_FORMAT);
    CHECK_MSG("recurrent layer 1 has a state of 3 heads x 5 floats in the file, 3 x 6 in the cache");
    CHECK_INT(stats(c2).state_free, s0.state_free);
    CHECK_INT(stats(c2).pages_free, s0.pages_free);
    pkv_kv_cache_free(c2);
    /* a cache without recurrent layers, both ways */
    layout(&e2, 0, 5, 0);
    e2.L[1] = e2.L[0];
    e2.L[3] = e2.L[0];
    c2 = pkv_kv_cache_create(params(&e2, 0, 0, 0));
    REQUIRE_VOID(c2);
    CHECK_STATUS(pkv_kv_seq_load(c2, path, 0, &d), PKV_ERR_FORMAT);
    CHECK_MSG("saved from a cache with recurrent layers, this cache has none");
    CHECK_OK(pkv_kv_seq_create(c2, 0, &x));
    CHECK_OK(app(c2, x, 3, 1));
    const char *path3 = th_tmp("kv-nostate.seq");
    CHECK_OK(pkv_kv_seq_save(c2, x, path3));
    CHECK_STATUS(pkv_kv_seq_load(c, path3, 0, &d), PKV_ERR_FORMAT);
    CHECK_MSG("saved from a cache without recurrent layers");
    remove(path3);
    pkv_kv_cache_free(c2);
    /* a corrupt state length */
    {
        static uint8_t f1[1 << 16];
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(f1, 1, sizeof f1, f) : 0;
        if (f) fclose(f);
        size_t at = 8 + 16 + 8 + 4 * 16 + 24 + 16; /* header, geometry, n/fp/exact, w_first/w_len */
        uint64_t bad = 11;
        memcpy(f1 + at, &bad, 8);
        f = fopen(path, "wb");
        if (f) {
            fwrite(f1, 1, n, f);
            fclose(f);
        }
        CHECK_STATUS(pkv_kv_seq_load(c, path, 0, &d), PKV_ERR_FORMAT);
        CHECK_MSG("a recurrent state of 11 tokens in a sequence of 10");
    }
    remove(path);
    pkv_kv_cache_free(c);
}

/* ---------------------------------------------------------- state parts */

/* A recurrent layer whose head state is made of parts (pkv_kv_layer_desc
 * .state_part), as a gated delta-net's: 3 heads of parts {2, 3, 1} floats; a
 * shard's slot holds part 0 of each of its heads, then part 1 of each, then part 2. */
enum { P_HEADS = 3, P_SPH = 6 };
static const int k_parts[3] = {2, 3, 1};

/* Layer 0: attention (1 head on a); layer 1: the parts layer, shards (first head,
 * heads, device) as given. */
static void parts_layout(env *e, int n_shards, const int (*sh)[2], pkv_device *const *dev, int n_parts) {
    memset(e->L, 0, sizeof e->L);
    e->L[0] = (pkv_kv_layer_desc){.n_kv_heads = 1, .head_dim_k = 4, .head_dim_v = 4, .dtype_k = PKV_TYPE_F32,
                                  .dtype_v = PKV_TYPE_F32};
    e->L[1] = (pkv_kv_layer_desc){.n_kv_heads = P_HEADS, .state_per_head = P_SPH, .n_shards = n_shards,
                                  .shards = e->S[1], .state_n_parts = n_parts};
    for (int i = 0; i < n_parts; i++) e->L[1].state_part[i] = k_parts[i];
    for (int i = 0; i < n_shards; i++) e->S[1][i] = (pkv_kv_shard_desc){dev[i], NULL, sh[i][0], sh[i][1]};
}

static pkv_kv_cache *parts_cache(env *e) {
    pkv_kv_params p = params(e, 8, 0, 0);
    p.n_layers = 2;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) TH_FAIL("parts cache: %s", pkv_errmsg());
    return c;
}

/* Element i of part q of head h in the canonical layout: distinct, not round. */
static float parts_value(int h, int q, int i, float tag) { return tag + (float)(h * 100 + q * 10 + i) + 0.125f; }

/* Every shard's slot image of seq's live state, gathered raw ([shard's bytes] in
 * shard order) and as the canonical state it stands for (by the parts rule). */
static pkv_status parts_io(pkv_kv_cache *c, int32_t seq, float *canon, bool write, float tag) {
    int32_t slot;
    pkv_status st = pkv_kv_state_slots(c, 1, &seq, &slot);
    pkv_kv_layer_info li;
    if (!st) st = pkv_kv_layout_layer(pkv_kv_cache_layout(c), 1, &li);
    for (int s = 0; !st && s < li.n_shards; s++) {
        pkv_kv_shard_info si;
        if ((st = pkv_kv_shard(c, 1, s, &si))) break;
        float img[P_HEADS * P_SPH];
        size_t off = si.state_off + (size_t)slot * si.state_slot_bytes;
        int at = 0;
        if (write) { /* the slot image the kernels would leave for these heads */
            for (int q = 0, in = 0; q < 3; in += k_parts[q++])
                for (int h = si.head_begin; h < si.head_begin + si.n_heads; h++)
                    for (int i = 0; i < k_parts[q]; i++) img[at++] = parts_value(h, q, i, tag);
            st = pkv_buffer_write(si.state, off, img, si.state_slot_bytes);
            continue;
        }
        if ((st = pkv_buffer_read(si.state, off, img, si.state_slot_bytes))) break;
        for (int q = 0, in = 0; q < 3; in += k_parts[q++])
            for (int h = si.head_begin; h < si.head_begin + si.n_heads; h++)
                for (int i = 0; i < k_parts[q]; i++) canon[h * P_SPH + in + i] = img[at++];
    }
    return st;
}

static void parts_canon(float *canon, float tag) {
    for (int h = 0; h < P_HEADS; h++)
        for (int q = 0, in = 0; q < 3; in += k_parts[q++])
            for (int i = 0; i < k_parts[q]; i++) canon[h * P_SPH + in + i] = parts_value(h, q, i, tag);
}

static void test_parts(env *e) {
    const int sh_a[2][2] = {{0, 2}, {2, 1}}, sh_b[3][2] = {{0, 1}, {1, 1}, {2, 1}}, sh_one[1][2] = {{0, 3}};
    pkv_device *dev_a[2] = {e->a, e->b}, *dev_b[3] = {e->b, e->a, e->b};
    parts_layout(e, 2, sh_a, dev_a, 3);
    pkv_kv_cache *c = parts_cache(e);
    REQUIRE_VOID(c);
    pkv_kv_layer_info li;
    CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), 1, &li));
    CHECK_INT(li.state_n_parts, 3);
    CHECK(li.state_part[0] == 2 && li.state_part[1] == 3 && li.state_part[2] == 1);
    uint64_t fp = pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c));
    int32_t a;
    CHECK_OK(pkv_kv_seq_create(c, 7, &a));
    CHECK_OK(app(c, a, 5, 30));
    CHECK_OK(parts_io(c, a, NULL, true, 1000.0f));
    const char *path = th_tmp("kv-parts.seq");
    CHECK_OK(pkv_kv_seq_save(c, a, path));
    /* the file holds the canonical state: each head's parts in a row, heads in order */
    float want[P_HEADS * P_SPH], got[P_HEADS * P_SPH];
    parts_canon(want, 1000.0f);
    {
        static uint8_t f1[1 << 14];
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(f1, 1, sizeof f1, f) : 0;
        if (f) fclose(f);
        bool found = false;
        for (size_t at = 0; !found && at + sizeof want <= n; at++) found = memcmp(f1 + at, want, sizeof want) == 0;
        CHECK(found);
    }
    /* into caches of other shardings (three shards; one shard) and devices: their
     * slots hold the same canonical state, bit for bit */
    for (int k = 0; k < 2; k++) {
        env e2 = *e;
        if (k == 0) parts_layout(&e2, 3, sh_b, dev_b, 3);
        else parts_layout(&e2, 1, sh_one, dev_b, 3);
        pkv_kv_cache *c2 = parts_cache(&e2);
        REQUIRE_VOID(c2);
        CHECK(pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c2)) == fp); /* sharding is not geometry */
        int32_t x, d;
        CHECK_OK(pkv_kv_seq_create(c2, 0, &x)); /* another slot than the file's sequence had */
        CHECK_OK(pkv_kv_seq_load(c2, path, 0, &d));
        memset(got, 0xcd, sizeof got);
        CHECK_OK(parts_io(c2, d, got, false, 0));
        CHECK_MEM(got, want, sizeof want);
        /* and back: written in this sharding, saved, loaded into the first cache */
        CHECK_OK(parts_io(c2, d, NULL, true, 2000.0f + (float)k * 1000.0f));
        const char *path2 = th_tmp("kv-parts2.seq");
        CHECK_OK(pkv_kv_seq_save(c2, d, path2));
        int32_t b;
        CHECK_OK(pkv_kv_seq_load(c, path2, 0, &b));
        float want2[P_HEADS * P_SPH];
        parts_canon(want2, 2000.0f + (float)k * 1000.0f);
        memset(got, 0xcd, sizeof got);
        CHECK_OK(parts_io(c, b, got, false, 0));
        CHECK_MEM(got, want2, sizeof want2);
        /* fork and swap carry the slot image as it is */
        int32_t f;
        CHECK_OK(pkv_kv_fork(c, b, &f));
        CHECK_OK(pkv_kv_swap_out(c, f));
        CHECK_OK(pkv_kv_swap_in(c, f));
        memset(got, 0xcd, sizeof got);
        CHECK_OK(parts_io(c, f, got, false, 0));
        CHECK_MEM(got, want2, sizeof want2);
        CHECK_OK(pkv_kv_seq_free(c, f));
        CHECK_OK(pkv_kv_seq_free(c, b));
        remove(path2);
        pkv_kv_cache_free(c2);
    }
    /* the parts are geometry: other parts of the same size, or none, are another
     * layout, and its files are refused */
    for (int k = 0; k < 2; k++) {
        env e2 = *e;
        parts_layout(&e2, 2, sh_a, dev_a, k ? 0 : 3);
        if (!k) e2.L[1].state_part[0] = 3, e2.L[1].state_part[1] = 2; /* {3, 2, 1} */
        pkv_kv_cache *c2 = parts_cache(&e2);
        REQUIRE_VOID(c2);
        CHECK(pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c2)) != fp);
        int32_t d;
        CHECK_STATUS(pkv_kv_seq_load(c2, path, 0, &d), PKV_ERR_FORMAT);
        CHECK_MSG("layout fingerprint");
        pkv_kv_cache_free(c2);
    }
    /* one part is the plain layout */
    {
        env e2 = *e;
        parts_layout(&e2, 2, sh_a, dev_a, 1);
        e2.L[1].state_part[0] = P_SPH;
        pkv_kv_cache *c2 = parts_cache(&e2);
        REQUIRE_VOID(c2);
        env e3 = *e;
        parts_layout(&e3, 2, sh_a, dev_a, 0);
        pkv_kv_cache *c3 = parts_cache(&e3);
        REQUIRE_VOID(c3);
        CHECK(pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c2)) == pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c3)));
        CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c2), 1, &li));
        CHECK_INT(li.state_n_parts, 0);
        pkv_kv_cache_free(c3);
        pkv_kv_cache_free(c2);
    }
    remove(path);
    pkv_kv_cache_free(c);

    /* bad descriptions are refused, naming the layer and what is wrong */
    static const struct {
        int n_parts, p0, p1, p2;
        const char *want;
    } bad[] = {
        {3, 2, 3, 2, "KV layout layer 1: its 3 state parts sum to 7 floats, state_per_head is 6"},
        {3, 2, 4, 0, "KV layout layer 1: state part 2 has 0 floats (must be > 0)"},
        {3, -1, 6, 1, "KV layout layer 1: state part 0 has -1 floats (must be > 0)"},
        {-1, 6, 0, 0, "KV layout layer 1: -1 state parts (0 = one, at most 64)"},
        {PKV_KV_STATE_MAX_PARTS + 1, 6, 0, 0, "KV layout layer 1: 65 state parts (0 = one, at most 64)"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        env e2 = *e;
        parts_layout(&e2, 2, sh_a, dev_a, 0);
        e2.L[1].state_n_parts = bad[k].n_parts;
        e2.L[1].state_part[0] = bad[k].p0;
        e2.L[1].state_part[1] = bad[k].p1;
        e2.L[1].state_part[2] = bad[k].p2;
        pkv_kv_params p = params(&e2, 8, 0, 0);
        p.n_layers = 2;
        CHECK(pkv_kv_cache_create(p) == NULL);
        CHECK_MSG(bad[k].want);
    }
    {
        env e2 = *e;
        parts_layout(&e2, 2, sh_a, dev_a, 0);
        e2.L[0].state_n_parts = 2; /* parts on an attention layer */
        e2.L[0].state_part[0] = e2.L[0].state_part[1] = 1;
        pkv_kv_params p = params(&e2, 8, 0, 0);
        p.n_layers = 2;
        CHECK(pkv_kv_cache_create(p) == NULL);
        CHECK_MSG("KV layout layer 0: 2 state parts but no state (state_per_head 0)");
    }
}

/* ------------------------------------------------------------ prefix reuse */

static void test_prefix(env *e) {
    pkv_kv_cache *c = make(e, 0, 12, 64, 4);
    REQUIRE_VOID(c);
    int32_t a, b, d;
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 50 + i;
    CHECK_OK(pkv_kv_seq_create(c, 7, &a));
    step(c, a, 8, 50, 8); /* a prompt ending at a page boundary: offered */
    for (int t = 9; t <= 13; t++) step(c, a, 1, 50 + t - 1, (uint64_t)t); /* no checkpoint at 12 */
    CHECK_INT(stats(c).state_checkpoints, 1);
    int64_t m;
    /* pages match up to 12, the state only at 8: the match stops there */
    CHECK_OK(pkv_kv_seq_create(c, 7, &b));
    CHECK_OK(pkv_kv_prefix_match(c, b, toks, NULL, 14, &m));
    CHECK_INT(m, 8);
    CHECK_INT(pkv_kv_seq_len(c, b), 8);
    CHECK_INT(pkv_kv_seq_state_len(c, b), 8);
    CHECK(state_is(c, b, 8));
    CHECK_INT(stats(c).state_prefix_hits, 1);
    CHECK(same_kv(c, b, c, b));
    /* b goes on from there; a truncate back goes to the matched state */
    step(c, b, 2, 58, 10);
    CHECK_OK(pkv_kv_truncate(c, b, 9));
    CHECK(state_is(c, b, 8));
    CHECK_INT(pkv_kv_seq_state_len(c, b), 8);
    /* a step of more than one token ending on a boundary of published pages: offered too */
    CHECK_OK(pkv_kv_state_replay(c, b, 1));
    step(c, b, 3, 59, 12);
    CHECK_OK(pkv_kv_seq_create(c, 7, &d));
    CHECK_OK(pkv_kv_prefix_match(c, d, toks, NULL, 13, &m));
    CHECK_INT(m, 12);
    CHECK(state_is(c, d, 12));
    CHECK_OK(pkv_kv_seq_free(c, d));
    /* other tokens, or a prompt taken one token at a time (no checkpoint): no hit */
    int32_t c2;
    CHECK_OK(pkv_kv_seq_create(c, 7, &c2));
    for (int t = 0; t < 9; t++) step(c, c2, 1, 900 + t, 1);
    CHECK_OK(pkv_kv_seq_create(c, 7, &d));
    int32_t other[9];
    for (int i = 0; i < 9; i++) other[i] = 900 + i;
    CHECK_OK(pkv_kv_prefix_match(c, d, other, NULL, 9, &m));
    CHECK_INT(m, 0);
    CHECK_INT(pkv_kv_seq_len(c, d), 0);
    CHECK(state_is(c, d, 0));
    CHECK_OK(pkv_kv_seq_free(c, d));
    CHECK_OK(pkv_kv_seq_free(c, c2));
    /* the offer outlives the sequences (cached pages) ... */
    CHECK_OK(pkv_kv_seq_free(c, a));
    CHECK_OK(pkv_kv_seq_free(c, b));
    CHECK(stats(c).state_checkpoints >= 2);
    CHECK_OK(pkv_kv_seq_create(c, 7, &d));
    CHECK_OK(pkv_kv_prefix_match(c, d, toks, NULL, 13, &m));
    CHECK_INT(m, 12);
    CHECK(state_is(c, d, 12));
    CHECK_OK(pkv_kv_seq_free(c, d));
    /* ... and dies with the pages: evict them all */
    CHECK_OK(pkv_kv_seq_create(c, 0, &d));
    for (int k = 0; k < PS; k++) CHECK_OK(app(c, d, 64, 2000 + 64 * k)); /* every page of the pool */
    CHECK_INT(stats(c).state_checkpoints, 0);
    CHECK_OK(pkv_kv_seq_free(c, d));
    CHECK_OK(pkv_kv_seq_create(c, 7, &d));
    CHECK_OK(pkv_kv_prefix_match(c, d, toks, NULL, 13, &m));
    CHECK_INT(m, 0);
    CHECK(state_is(c, d, 0));
    pkv_kv_cache_free(c);
}

/* A replica's state slot (the same heads on a second device; the model computes
 * the first shard's only) is never what a file or a disk page keeps: saved with
 * junk in the replica, the file still holds the first shard's state. */
static void test_replica(env *e) {
    layout(e, 2, 5, 0);
    pkv_kv_cache *c = pkv_kv_cache_create(params(e, 8, 64, 4));
    REQUIRE_VOID(c);
    int32_t a;
    CHECK_OK(pkv_kv_seq_create(c, 5, &a));
    step(c, a, 6, 10, 31);
    int32_t slot;
    CHECK_OK(pkv_kv_state_slots(c, 1, &a, &slot));
    pkv_kv_shard_info si;
    CHECK_OK(pkv_kv_shard(c, 1, 1, &si));
    CHECK_INT(si.head_begin, 0);
    float junk[3 * 5];
    for (int i = 0; i < 15; i++) junk[i] = -7.5f - (float)i;
    CHECK_OK(pkv_buffer_write(si.state, si.state_off + (size_t)slot * si.state_slot_bytes, junk, sizeof junk));
    const char *path = th_tmp("kv-state-replica.seq");
    CHECK_OK(pkv_kv_seq_save(c, a, path));
    pkv_kv_cache *c2 = make(e, 1, 8, 64, 4);
    REQUIRE_VOID(c2);
    int32_t b;
    CHECK_OK(pkv_kv_seq_load(c2, path, 0, &b));
    CHECK(state_is(c2, b, 31));
    remove(path);
    pkv_kv_cache_free(c2);
    pkv_kv_cache_free(c);
}

/* ------------------------------------------------------------- disk tier */

/* The disk tier keeps the state a page offers: a fresh cache (another process),
 * here of another sharding, matches through the files and gets the state at the
 * deepest page that had one, bit for bit. */
static void test_disk(env *e) {
    char dir[600], cmd[700];
    snprintf(dir, sizeof dir, "%s", th_tmp("kv-state-disk"));
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_INT(system(cmd), 0);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 50 + i;
    layout(e, 0, 5, 0);
    pkv_kv_params p = params(e, 12, 64, 4);
    p.disk_dir = dir;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) TH_FAIL("cache with a disk tier: %s", pkv_errmsg());
    REQUIRE_VOID(c);
    int32_t a, d;
    CHECK_OK(pkv_kv_seq_create(c, 7, &a));
    step(c, a, 8, 50, 8);  /* offered at the end of page 1 */
    step(c, a, 4, 58, 12); /* and of page 2 */
    step(c, a, 1, 62, 13);
    CHECK_OK(pkv_kv_seq_free(c, a)); /* cached: its full pages go to disk, with their states */
    CHECK_OK(pkv_kv_disk_flush(c));
    pkv_kv_stats st = stats(c);
    CHECK_INT(st.disk_written_pages, 3);
    pkv_kv_cache_free(c);
    for (int split = 1; split >= 0; split--) {
        layout(e, split, 5, 0);
        p = params(e, 12, 64, 4);
        p.disk_dir = dir;
        c = pkv_kv_cache_create(p);
        REQUIRE_VOID(c);
        int64_t m;
        CHECK_OK(pkv_kv_seq_create(c, 7, &d));
        CHECK_OK(pkv_kv_prefix_match(c, d, toks, NULL, split ? 13 : 9, &m));
        CHECK_INT(m, split ? 12 : 8);
        CHECK_INT(pkv_kv_seq_state_len(c, d), m);
        CHECK(state_is(c, d, (uint64_t)m));
        st = stats(c);
        CHECK_INT(st.disk_hit_pages, split ? 3 : 2);
        CHECK_INT(st.state_prefix_hits, 1);
        /* the matched sequence goes on as any other */
        step(c, d, 1, 50 + (int32_t)m, 99);
        CHECK(state_is(c, d, 99));
        CHECK_OK(pkv_kv_truncate(c, d, m));
        CHECK(state_is(c, d, (uint64_t)m));
        CHECK_OK(pkv_kv_seq_free(c, d));
        pkv_kv_cache_free(c);
    }
    /* a chunked layer still refuses the tier, naming it (a window layer no longer
     * does: its rows travel in the page image's window section) */
    layout(e, 0, 5, 0);
    e->L[2].chunk = 8;
    p = params(e, 12, 64, 4);
    p.disk_dir = dir;
    c = pkv_kv_cache_create(p);
    CHECK(c == NULL);
    CHECK_MSG("layer 2 is a chunked-attention layer");
    pkv_kv_cache_free(c);
    CHECK_INT(system(cmd), 0);
}

/* -------------------------------------------------------- slot exhaustion */

static void test_slots(env *e) {
    pkv_kv_cache *c = make(e, 0, 6, 64, 4);
    REQUIRE_VOID(c);
    int32_t a, s[8];
    CHECK_OK(pkv_kv_seq_create(c, 0, &a));
    step(c, a, 4, 1, 4);
    step(c, a, 4, 5, 8);
    step(c, a, 4, 9, 12); /* checkpoints 4, 8, 12: 4 slots in use */
    CHECK_INT(stats(c).state_free, 2);
    CHECK_OK(pkv_kv_seq_create(c, 0, &s[0]));
    CHECK_OK(pkv_kv_seq_create(c, 0, &s[1]));
    CHECK_INT(stats(c).state_free, 0);
    /* a checkpoint with no slot free: the oldest checkpoint (a's at 4) makes room */
    step(c, s[0], 2, 20, 2);
    CHECK_INT(stats(c).state_ckpt_skipped, 0);
    CHECK_INT(stats(c).state_checkpoints, 3);
    CHECK_OK(pkv_kv_truncate(c, a, 6)); /* a's checkpoint at 4 is gone: zero */
    CHECK(state_is(c, a, 0));
    CHECK_INT(stats(c).state_checkpoints, 1); /* 8 and 12 dropped by the truncate */
    CHECK_INT(stats(c).state_free, 2);
    CHECK_OK(pkv_kv_state_replay(c, a, 6));
    step(c, s[1], 2, 30, 2); /* s[1]'s checkpoint is newer than s[0]'s */
    step(c, s[0], 1, 22, 3);
    step(c, s[1], 1, 32, 3);
    CHECK_OK(pkv_kv_seq_create(c, 0, &s[2]));
    CHECK_INT(stats(c).state_checkpoints, 2);
    /* creating a sequence evicts the globally oldest checkpoint: s[0]'s */
    CHECK_OK(pkv_kv_seq_create(c, 0, &s[3]));
    CHECK_INT(stats(c).state_checkpoints, 1);
    CHECK(state_is(c, s[3], 0));
    CHECK_OK(pkv_kv_truncate(c, s[0], 2));
    CHECK(state_is(c, s[0], 0));
    CHECK_OK(pkv_kv_truncate(c, s[1], 2));
    CHECK(state_is(c, s[1], 2));
    CHECK_OK(pkv_kv_state_replay(c, s[0], 2));
    CHECK_OK(pkv_kv_seq_create(c, 0, &s[4])); /* evicts s[1]'s */
    CHECK_INT(stats(c).state_checkpoints, 0);
    CHECK_INT(stats(c).state_free, 0);
    /* and then: no slot at all. A checkpoint is skipped; create and fork fail,
     * changing nothing */
    pkv_kv_stats s0 = stats(c);
    step(c, s[2], 2, 40, 2);
    CHECK_INT(stats(c).state_ckpt_skipped, 1);
    int32_t x = -5;
    CHECK_STATUS(pkv_kv_seq_create(c, 0, &x), PKV_ERR_NOMEM);
    CHECK_MSG("pkv_kv_params.state_slots");
    CHECK_INT(x, -5);
    CHECK_STATUS(pkv_kv_fork(c, a, &x), PKV_ERR_NOMEM);
    CHECK_INT(a, 0);
    CHECK_MSG("fork of sequence 0: no recurrent-state slot can be had: all 6 state slots hold the live states");
    CHECK_INT(x, -5);
    CHECK_INT(stats(c).n_seqs, s0.n_seqs);
    CHECK_INT(stats(c).pages_used, s0.pages_used + 1); /* s[2]'s step */
    /* swap in without a slot: stays swapped, then comes back whole */
    put_state(c, s[3], 31);
    CHECK_OK(pkv_kv_swap_out(c, s[3]));
    CHECK_OK(pkv_kv_seq_create(c, 0, &x));
    CHECK_STATUS(pkv_kv_swap_in(c, s[3]), PKV_ERR_NOMEM);
    CHECK_MSG("state_slots");
    CHECK(pkv_kv_seq_swapped(c, s[3]));
    CHECK_STATUS(pkv_kv_seq_clear(c, s[3]), PKV_ERR_NOMEM); /* would need a slot too */
    CHECK(pkv_kv_seq_swapped(c, s[3]));
    CHECK_STATUS(pkv_kv_clear(c), PKV_ERR_NOMEM);
    CHECK(state_is(c, s[2], 2));
    CHECK_OK(pkv_kv_seq_free(c, x));
    CHECK_OK(pkv_kv_swap_in(c, s[3]));
    CHECK(state_is(c, s[3], 31));
    pkv_kv_cache_free(c);
}

/* ------------------------------------------------- allocation failures */

enum { NSNAP = 8 };
typedef struct snap {
    pkv_kv_stats st;
    int64_t len[NSNAP], slen[NSNAP];
    bool swapped[NSNAP];
    float state[NSNAP][2][MAXF];
} snap;

static void take_snap(pkv_kv_cache *c, const int32_t *ids, snap *o) {
    memset(o, 0, sizeof *o);
    o->st = stats(c);
    for (int i = 0; i < NSNAP; i++) {
        if (ids[i] < 0) continue;
        o->len[i] = pkv_kv_seq_len(c, ids[i]);
        o->slen[i] = pkv_kv_seq_state_len(c, ids[i]);
        o->swapped[i] = pkv_kv_seq_swapped(c, ids[i]);
        if (o->len[i] < 0 || o->swapped[i]) continue;
        for (int k = 0; k < 2; k++) st_io(c, ids[i], k_rec[k], o->state[i][k], false);
    }
}

static bool snap_equal(const snap *a, const snap *b) {
    if (getenv("KV_STATE_VERBOSE"))
        fprintf(stderr, "  seqs %d/%d free %lld/%lld cached %lld/%lld host %lld/%lld slots %lld/%lld ckpts %lld/%lld "
                "len0 %lld/%lld slen0 %lld/%lld len1 %lld/%lld slen1 %lld/%lld state %d\n", a->st.n_seqs, b->st.n_seqs,
                (long long)a->st.pages_free, (long long)b->st.pages_free, (long long)a->st.pages_cached,
                (long long)b->st.pages_cached, (long long)a->st.host_free, (long long)b->st.host_free,
                (long long)a->st.state_free, (long long)b->st.state_free, (long long)a->st.state_checkpoints,
                (long long)b->st.state_checkpoints, (long long)a->len[0], (long long)b->len[0], (long long)a->slen[0],
                (long long)b->slen[0], (long long)a->len[1], (long long)b->len[1], (long long)a->slen[1],
                (long long)b->slen[1], memcmp(a->state, b->state, sizeof a->state));
    return a->st.n_seqs == b->st.n_seqs && a->st.pages_free == b->st.pages_free &&
           a->st.pages_cached == b->st.pages_cached && a->st.host_free == b->st.host_free &&
           a->st.state_free == b->st.state_free && a->st.state_checkpoints == b->st.state_checkpoints &&
           a->st.window_free + a->st.window_cached == b->st.window_free + b->st.window_cached &&
           !memcmp(a->len, b->len, sizeof a->len) && !memcmp(a->slen, b->slen, sizeof a->slen) &&
           !memcmp(a->swapped, b->swapped, sizeof a->swapped) && !memcmp(a->state, b->state, sizeof a->state);
}

/* Run expr with the 1st, 2nd, ... allocation failing until it succeeds: every
 * failure must leave the tracked sequences and the counts as they were. */
#define FAULTS(expr)                                                                        \
    do {                                                                                    \
        int fails_ = 0;                                                                     \
        for (uint64_t k_ = 1; k_ < 500; k_++) {                                             \
            snap b_, a_;                                                                    \
            take_snap(c, ids, &b_);                                                         \
            pkv_alloc_fail_at(k_);                                                          \
            pkv_status s_ = (expr);                                                         \
            pkv_alloc_fail_at(0);                                                           \
            if (s_ == PKV_OK) break;                                                        \
            fails_++;                                                                       \
            take_snap(c, ids, &a_);                                                         \
            if (s_ != PKV_ERR_NOMEM || !snap_equal(&b_, &a_))                               \
                TH_FAIL("%s with allocation %llu failing: %s, %s", #expr, (unsigned long long)k_, \
                        pkv_status_str(s_), snap_equal(&b_, &a_) ? "nothing changed" : "something changed"); \
        }                                                                                   \
        if (!fails_) TH_FAIL("%s: no allocation failed", #expr);                           \
    } while (0)

static void test_faults(env *e) {
    pkv_kv_cache *c = make(e, 0, 24, 64, 3);
    REQUIRE_VOID(c);
    int32_t ids[NSNAP] = {-1, -1, -1, -1, -1, -1, -1, -1};
    int32_t toks[16];
    for (int i = 0; i < 16; i++) toks[i] = 50 + i;
    FAULTS(pkv_kv_seq_create(c, 7, &ids[0]));
    int32_t a = ids[0], n8 = 8;
    CHECK_OK(app(c, a, 8, 50));
    put_state(c, a, 8);
    FAULTS(pkv_kv_state_step_done(c, 1, &a, &n8));
    CHECK_INT(stats(c).state_checkpoints, 1);
    step(c, a, 2, 58, 10);
    FAULTS(pkv_kv_fork(c, a, &ids[1]));
    CHECK(state_is(c, ids[1], 10));
    CHECK_OK(pkv_kv_truncate(c, ids[1], 9)); /* allocates nothing here */
    CHECK(state_is(c, ids[1], 8));
    FAULTS(pkv_kv_swap_out(c, a));
    FAULTS(pkv_kv_swap_in(c, a));
    CHECK(state_is(c, a, 10));
    const char *path = th_tmp("kv-state-faults.seq");
    CHECK_OK(pkv_kv_seq_save(c, a, path));
    FAULTS(pkv_kv_seq_load(c, path, 0, &ids[2]));
    CHECK(state_is(c, ids[2], 10));
    remove(path);
    CHECK_OK(pkv_kv_seq_create(c, 7, &ids[3]));
    int64_t m = -1;
    FAULTS(pkv_kv_prefix_match(c, ids[3], toks, NULL, 10, &m));
    CHECK_INT(m, 8);
    CHECK(state_is(c, ids[3], 8));
    FAULTS(pkv_kv_shift(c, a, 2, 2, -2));
    CHECK(state_is(c, a, 0));
    FAULTS(pkv_kv_seq_clear(c, ids[3]));
    CHECK(state_is(c, ids[3], 0));
    CHECK_OK(pkv_kv_swap_out(c, ids[2]));
    CHECK_OK(pkv_kv_seq_clear(c, ids[2])); /* allocates nothing */
    CHECK(state_is(c, ids[2], 0));
    CHECK_OK(pkv_kv_swap_out(c, ids[1]));
    CHECK_OK(pkv_kv_clear(c)); /* allocates nothing */
    CHECK(state_is(c, ids[1], 0));
    pkv_kv_cache_free(c);
}

/* --------------------------------------------- with sliding-window layers */

static void test_window(env *e) {
    layout(e, 0, 5, 6); /* layer 2: a window of 6 tokens */
    pkv_kv_params p = params(e, 12, 64, 4);
    p.window_pages = 16;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    REQUIRE_VOID(c);
    CHECK(stats(c).window_pages == 16 && stats(c).state_slots == 12);
    int32_t a, b;
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 50 + i;
    CHECK_OK(pkv_kv_seq_create(c, 7, &a));
    step(c, a, 8, 50, 8);
    for (int t = 9; t <= 20; t++) step(c, a, 1, 50 + t - 1, (uint64_t)t); /* window pages released */
    CHECK(stats(c).window_released > 0);
    CHECK(state_is(c, a, 20));
    int64_t m;
    CHECK_OK(pkv_kv_seq_create(c, 7, &b));
    CHECK_OK(pkv_kv_prefix_match(c, b, toks, NULL, 20, &m));
    CHECK_INT(m, 8); /* the state at 8; the window pages before it are still cached */
    CHECK_INT(pkv_kv_seq_state_len(c, b), m);
    CHECK(state_is(c, b, 8));
    CHECK_INT(pkv_kv_seq_window_len(c, b), m);
    /* save / load carries window tokens and state */
    const char *path = th_tmp("kv-state-window.seq");
    CHECK_OK(pkv_kv_seq_save(c, a, path));
    int32_t ids[NSNAP] = {a, b, -1, -1, -1, -1, -1, -1};
    /* a later kind's failure (the window pool's, the state's) gives back what the
     * earlier ones took: nothing changes, in either pool */
    FAULTS(pkv_kv_seq_load(c, path, 0, &ids[2]));
    int32_t d = ids[2];
    CHECK(state_is(c, d, 20));
    CHECK_INT(pkv_kv_seq_window_len(c, d), pkv_kv_seq_window_len(c, a));
    remove(path);
    /* truncate, fork, swap: the state in the main cache, the windows in theirs */
    CHECK_OK(pkv_kv_truncate(c, a, 10));
    CHECK(state_is(c, a, 8));
    int32_t f;
    CHECK_OK(pkv_kv_fork(c, a, &f));
    CHECK(state_is(c, f, 8));
    CHECK_OK(pkv_kv_swap_out(c, f));
    CHECK_OK(pkv_kv_swap_in(c, f));
    CHECK(state_is(c, f, 8));
    CHECK_INT(pkv_kv_seq_state_len(c, f), 8);
    pkv_kv_cache_free(c);
}

/* ------------------------------------------------------ random operations */

/* A reference of what each sequence's state must be, without slot pressure (so
 * nothing is evicted): the live pattern, its length and the checkpoints (pos,
 * pattern), under the policy of pkv_kv_params (interval, ckpt_max). */
enum { RSEQ = 6, RCK = 8 };
typedef struct rseq {
    bool live, swapped;
    int32_t id;
    int64_t len, slen;
    uint64_t tag;
    int n_ck;
    int64_t ck_pos[RCK];
    uint64_t ck_tag[RCK];
} rseq;

static void ref_rewind(rseq *r, int64_t n_keep) {
    if (n_keep >= r->slen) return;
    while (r->n_ck > 0 && r->ck_pos[r->n_ck - 1] > n_keep) r->n_ck--;
    r->slen = r->n_ck ? r->ck_pos[r->n_ck - 1] : 0;
    r->tag = r->n_ck ? r->ck_tag[r->n_ck - 1] : 0;
}

static void ref_step(rseq *r, int32_t n, int interval, int ckpt_max) {
    int64_t last = r->n_ck ? r->ck_pos[r->n_ck - 1] : 0;
    if (!(r->slen > last && (n > 1 || r->slen - last >= interval))) return;
    if (r->n_ck >= ckpt_max) {
        memmove(r->ck_pos, r->ck_pos + 1, (size_t)(r->n_ck - 1) * sizeof *r->ck_pos);
        memmove(r->ck_tag, r->ck_tag + 1, (size_t)(r->n_ck - 1) * sizeof *r->ck_tag);
        r->n_ck--;
    }
    r->ck_pos[r->n_ck] = r->slen;
    r->ck_tag[r->n_ck++] = r->tag;
}

static void test_random(env *e, uint64_t seed, int n_ops) {
    const int interval = 5, ckpt_max = 3;
    layout(e, 0, 5, 0);
    pkv_kv_params p = params(e, 64, interval, ckpt_max);
    p.n_pages = 128;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    REQUIRE_VOID(c);
    rseq r[RSEQ];
    memset(r, 0, sizeof r);
    uint64_t rng = seed, tag = 1;
    int f0 = th_failures;
    for (int op = 0; op < n_ops && th_failures == f0; op++) {
        int k = (int)(th_rand(&rng) % RSEQ), what = (int)(th_rand(&rng) % 10);
        rseq *q = &r[k];
        if (!q->live) { /* create, or fork another live one into this place */
            int from = (int)(th_rand(&rng) % RSEQ);
            if (r[from].live && !r[from].swapped && what < 4) {
                CHECK_OK(pkv_kv_fork(c, r[from].id, &q->id));
                int32_t id = q->id;
                *q = r[from];
                q->id = id;
            } else {
                memset(q, 0, sizeof *q);
                CHECK_OK(pkv_kv_seq_create(c, 0, &q->id));
                q->live = true;
            }
        } else if (q->swapped) {
            CHECK_OK(pkv_kv_swap_in(c, q->id));
            q->swapped = false;
        } else if (what < 4 && q->len < 40) { /* a forward step: replay what is behind, then append */
            if (q->slen < q->len) {
                int32_t nb = (int32_t)(q->len - q->slen);
                CHECK_OK(pkv_kv_state_replay(c, q->id, nb));
                q->slen = q->len;
                q->tag = tag++;
                put_state(c, q->id, q->tag);
                CHECK_OK(pkv_kv_state_step_done(c, 1, &q->id, &nb));
                ref_step(q, nb, interval, ckpt_max);
            }
            int32_t n = 1 + (int32_t)(th_rand(&rng) % (what < 2 ? 1 : 6)), rows[8];
            CHECK_OK(pkv_kv_append(c, q->id, n, NULL, NULL, rows));
            q->len += n;
            q->slen += n;
            q->tag = tag++;
            put_state(c, q->id, q->tag);
            CHECK_OK(pkv_kv_state_step_done(c, 1, &q->id, &n));
            ref_step(q, n, interval, ckpt_max);
        } else if (what < 6) {
            int64_t keep = q->len ? (int64_t)(th_rand(&rng) % (uint64_t)(q->len + 1)) : 0;
            CHECK_OK(pkv_kv_truncate(c, q->id, keep));
            ref_rewind(q, keep);
            q->len = keep;
        } else if (what == 6 && q->len > 2) {
            int64_t start = (int64_t)(th_rand(&rng) % (uint64_t)(q->len - 1)), nr = 1;
            CHECK_OK(pkv_kv_shift(c, q->id, start, nr, -1));
            ref_rewind(q, start);
            q->len -= nr;
        } else if (what == 7) {
            CHECK_OK(pkv_kv_swap_out(c, q->id));
            q->swapped = true;
            q->n_ck = 0;
        } else if (what == 8) {
            CHECK_OK(pkv_kv_seq_free(c, q->id));
            q->live = false;
        } else {
            CHECK_OK(pkv_kv_seq_clear(c, q->id));
            q->len = q->slen = 0;
            q->tag = 0;
            q->n_ck = 0;
        }
        for (int i = 0; i < RSEQ; i++) {
            if (!r[i].live) continue;
            CHECK_INT(pkv_kv_seq_len(c, r[i].id), r[i].len);
            CHECK_INT(pkv_kv_seq_state_len(c, r[i].id), r[i].slen);
            if (!r[i].swapped && !state_is(c, r[i].id, r[i].tag))
                TH_FAIL("op %d: sequence %d's state is not pattern %llu", op, r[i].id, (unsigned long long)r[i].tag);
        }
        CHECK(stats(c).state_free > 0);
    }
    pkv_kv_stats st = stats(c);
    CHECK(st.state_restores > 0 && st.state_copies > st.state_restores); /* it went back to checkpoints */
    if (th_failures > f0) fprintf(stderr, "   random operations, seed %llu\n", (unsigned long long)seed);
    pkv_kv_cache_free(c);
}

static void run(const char *na, const char *nb) {
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = 1;
    env e;
    memset(&e, 0, sizeof e);
    e.a = pkv_device_open(na, dp);
    e.b = strcmp(na, nb) ? pkv_device_open(nb, dp) : e.a;
    if (!e.a || !e.b) {
        fprintf(stderr, "note: %s / %s do not open (%s): that part is skipped\n", na, nb, pkv_errmsg());
        if (e.b && e.b != e.a) pkv_device_close(e.b);
        if (e.a) pkv_device_close(e.a);
        return;
    }
    fprintf(stderr, "== %s + %s\n", na, nb);
    int f0 = th_failures;
    test_layout(&e);
    test_no_state(&e);
    test_ops(&e, 0);
    test_ops(&e, 1);
    pkv_device *o = pkv_device_open("cpu:2", dp);
    if (o) {
        test_files(&e, o, o);
        pkv_device_close(o);
    } else {
        TH_FAIL("cpu:2 does not open: %s", pkv_errmsg());
    }
    test_parts(&e);
    test_prefix(&e);
    test_disk(&e);
    test_replica(&e);
    test_slots(&e);
    test_window(&e);
    if (!strcmp(na, "cpu") && !strcmp(nb, "cpu:1")) {
        test_faults(&e);
        for (uint64_t seed = 1; seed <= 4; seed++) test_random(&e, seed, 4000);
    } else {
        test_random(&e, 11, 200);
    }
    if (th_failures > f0) fprintf(stderr, "   %d failures on %s + %s\n", th_failures - f0, na, nb);
    if (e.b != e.a) pkv_device_close(e.b);
    pkv_device_close(e.a);
}

int main(void) {
    int64_t live0 = pkv_alloc_live();
    run("cpu", "cpu");
    run("cpu", "cpu:1");
    run("vulkan:0", "vulkan:0");
    run("cuda:0", "cuda:0");
    CHECK_INT(pkv_alloc_live(), live0);
    return th_done();
}
