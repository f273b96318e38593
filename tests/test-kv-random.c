// labels: kv timeout=600
/* Model-based randomized test of the KV cache: thousands of random operations
 * (append, batch append, fork, truncate, shift, swap out/in, clear, free, prefix
 * match, save/load, clear all) on a cache sharded over cpu and cpu:1, checked after
 * every step against a naive reference that keeps plain arrays per sequence. The
 * K/V content of every resident sequence is read back through device reads.
 *
 * Token content is a deterministic function of the token's prefix (a chained hash
 * of tokens and positions), as in a real model, so pages shared by prefix reuse
 * have a known expected content. Keys moved by a shift are compared with a
 * tolerance of n_shifts * (2e-6 for f32, 1e-3 for f16, 0.01 for q8_0, 0.25 for
 * q4_0, values in [-1, 1]): every re-rotation rounds once to the K dtype (a
 * quantized head is dequantized, rotated and quantized again: at most half a step
 * amax/127 for q8_0, one step amax/8 for q4_0, amax <= sqrt(2) after rotation);
 * everything else is compared exactly. One seed runs with every prefix hash
 * colliding, one with the host swap pool in plain host memory (the path of
 * non-host devices) instead of a buffer on the CPU device. The seeds run on a
 * float layout (f32 / f16 pages, K and V head sizes differing) and on a quantized
 * one (layer 0: K q8_0, V q4_0; layer 1: K q4_0, V f16; heads of 32), whose
 * expected K/V are the quantized-then-dequantized contents.
 *
 * Window seeds give one of the two layers a sliding window (5 or 12 tokens, pages
 * of 1, 3, 4, 8: dividing it and not, smaller and larger), so its K/V live in the
 * window pool (c->sub, kv-window.c). Appends go through pkv_kv_append_batch_w and
 * write that layer at rows_window. The reference also follows each sequence's
 * window length and released leading pages as the documented rules give them
 * (released before len + 1 - (window + page_size) at each append or replay; a
 * truncate or shift whose next query would need a released token empties the
 * window sequence; a prefix hit keeps just the window before its end; swap in
 * without room empties it too), and after every step checks: the window pool's
 * reference counts, host pool and stats like the main pool's (-1 entries are
 * holes); every sequence's window length, holes (-1 entries exactly before them,
 * resident pages after), tokens and positions, and its held pages bounded by
 * ceil((window + page_size) / page_size) + 1 + the pages of its last append; the
 * window_replays stat; and the window layer's content of every resident token of
 * every sequence whose window is complete (shifted keys with the same tolerance).
 * A sequence left behind is caught up as the model does it: pkv_kv_window_replay
 * in pieces, the reference's K/V written at the returned rows (a piece without
 * room: pkv_kv_window_reset, retried after the next operation). The reference
 * takes the prefix hit the cache gives (possibly shortened to where the window
 * before its end is cached), but asking for all of a resident sequence's tokens
 * at its positions must find at least the pages it holds and has published in
 * both pools (as long as no duplicate chain can win the match). Save/load is also
 * compared byte for byte with its source, window rows included. */
#include "kv-testlib.h"

#define MAX_SEQ 64
#define MAX_LIVE 10
#define MAX_TOK 160
#define FP 7
#define MAX_DIM 96 /* one token's K or V floats in a layer, all heads */

typedef struct rtok {
    int32_t tok, pos;
    uint64_t h; /* chained hash of (tok, pos) of the prefix up to this token */
    int nshift;
    double k[2][MAX_DIM];
    float v[2][MAX_DIM];
} rtok;

typedef struct rseq {
    bool live, swapped;
    int n;
    /* window seeds: */
    int wn;   /* tokens whose window-layer K/V the window pool holds (pkv_kv_seq_window_len) */
    int hole; /* leading window pages released (-1 in the window block table) */
    int last; /* tokens of its last append or replay piece (bounds the pages it holds) */
    rtok t[MAX_TOK + 8];
} rseq;

static rseq g_ref[MAX_SEQ];
static pkv_kv_cache *g_c;
static uint64_t g_rng;
static bool g_neox;
static int g_ps;
/* the layout of the current seed (kt_layout_sharded or the quantized one) */
static int kdim[2], vdim[2], hd[2], hdv[2], g_nrot;
static pkv_type dtype[2], vtype[2];
/* window seeds: the layer with a window (-1: none) and its window in tokens */
static int g_wl = -1, g_W;

static void set_layout(kt_env *e, bool quant, int wl, int window) {
    kt_layout_sharded(e);
    if (quant) {
        e->layers[0].head_dim_k = e->layers[0].head_dim_v = 32;
        e->layers[0].dtype_k = PKV_TYPE_Q8_0;
        e->layers[0].dtype_v = PKV_TYPE_Q4_0;
        e->layers[1].head_dim_k = e->layers[1].head_dim_v = 32;
        e->layers[1].dtype_k = PKV_TYPE_Q4_0;
        e->layers[1].dtype_v = PKV_TYPE_F16;
    }
    if (wl >= 0) e->layers[wl].window = window;
    g_wl = wl;
    g_W = wl >= 0 ? window : 0;
    for (int il = 0; il < 2; il++) {
        const pkv_kv_layer_desc *d = &e->layers[il];
        hd[il] = d->head_dim_k;
        hdv[il] = d->head_dim_v;
        kdim[il] = d->n_kv_heads * d->head_dim_k;
        vdim[il] = d->n_kv_heads * d->head_dim_v;
        dtype[il] = d->dtype_k;
        vtype[il] = d->dtype_v;
    }
    g_nrot = quant ? 16 : 4;
}

/* A row of n heads of d values as stored in pages of type t. */
static void round_row(pkv_type t, float *x, int n, int d) {
    if (t == PKV_TYPE_F32) return;
    if (t == PKV_TYPE_F16) {
        for (int i = 0; i < n * d; i++) x[i] = kt_round(t, x[i]);
        return;
    }
    uint8_t b[4096];
    kt_encode(t, x, n, d, b);
    kt_decode(t, b, n, d, x);
}
/* The last operation and its arguments, for failure messages. */
static char g_what[160];
static long g_ops[16], g_fail_oop, g_prefix_hits, g_cow;
/* window seeds: operations per kind, and what the window pool went through */
static long g_ops_w[16], g_w_oop, g_w_replayed, g_w_replay_oop, g_w_resets, g_w_hole_shifts, g_w_prefix_holes,
    g_w_swap_fallback, g_w_prefix_required;
static uint64_t g_want_replays; /* the window_replays stat the reference expects */

static uint64_t chain(uint64_t h, int32_t tok, int32_t pos) {
    uint64_t s = h ^ ((uint64_t)(uint32_t)tok << 32 | (uint32_t)pos) ^ 0x51ed;
    return th_rand(&s);
}

static float content(uint64_t h, int il, int v, int i) {
    uint64_t s = h ^ (uint64_t)(il * 1000 + v * 100 + i) * 0x9e3779b97f4a7c15ull;
    return th_randf(&s);
}

static void fill_token(rtok *t) {
    for (int il = 0; il < 2; il++) {
        float k[MAX_DIM];
        for (int i = 0; i < kdim[il]; i++) k[i] = content(t->h, il, 0, i);
        round_row(dtype[il], k, kdim[il] / hd[il], hd[il]);
        for (int i = 0; i < kdim[il]; i++) t->k[il][i] = k[i];
        for (int i = 0; i < vdim[il]; i++) t->v[il][i] = content(t->h, il, 1, i);
        round_row(vtype[il], t->v[il], vdim[il] / hdv[il], hdv[il]);
    }
    t->nshift = 0;
}

static int write_layer(int il, int32_t row, const rtok *t) {
    float k[MAX_DIM], v[MAX_DIM];
    for (int i = 0; i < kdim[il]; i++) k[i] = (float)t->k[il][i];
    for (int i = 0; i < vdim[il]; i++) v[i] = t->v[il][i];
    return !kt_write_row(g_c, il, 0, row, k) && !kt_write_row(g_c, il, 1, row, v);
}

/* The window layer's K/V go to its row in the window pool (row_w), the other
 * layers' to row. */
static int write_token(int32_t row, int32_t row_w, const rtok *t) {
    for (int il = 0; il < 2; il++)
        if (!write_layer(il, il == g_wl ? row_w : row, t)) return 0;
    return 1;
}

/* ---------------------------------------------------- window rules (reference) */

static int npages(int64_t n) { return (int)((n + g_ps - 1) / g_ps); }
/* Pages an append (or replay) at window length len gives back first. */
static int first_page(int64_t len) {
    int64_t f = len + 1 - (g_W + g_ps);
    return f > 0 ? (int)(f / g_ps) : 0;
}
/* The most leading pages a sequence of len tokens may have released: the next
 * query (token len) sees tokens [len + 1 - window, len]. */
static int max_hole(int64_t len) {
    int64_t need = len + 1 - g_W;
    return need > 0 ? (int)(need / g_ps) : 0;
}
/* Most window pages a sequence may hold: the window plus a page, one kept for
 * rollback, and the pages of its last step. */
static int held_bound(const rseq *r) { return npages(g_W + g_ps) + 1 + npages(r->last); }

static void ref_drop(rseq *r) {
    int up = first_page(r->wn);
    if (up > npages(r->wn)) up = npages(r->wn);
    if (up > r->hole) r->hole = up;
}

/* The window sequence is emptied (to be recomputed); the stat counts it when it
 * held something (or was swapped out). */
static void ref_reset(rseq *r, bool sub_swapped) {
    g_want_replays += r->wn > 0 || sub_swapped;
    r->wn = r->hole = r->last = 0;
    g_w_resets++;
}

/* pkv_kv_shift's effect on the window sequence (the main pool's shift succeeded;
 * len: the length before it; avail_w: free + evictable window pages before it). */
static void ref_window_shift(rseq *r, int len, int start, int nr, int32_t delta, int64_t avail_w) {
    if (r->wn <= start) return; /* moves nothing the window pool holds */
    if (r->wn != len) {
        ref_reset(r, false);
        return;
    }
    int new_len = len - nr;
    if (new_len == start) { /* nothing moves: a truncate to start */
        if (r->hole > max_hole(start))
            ref_reset(r, false);
        else
            r->wn = start;
        return;
    }
    if (nr == 0 && delta == 0) return;
    int first = start / g_ps, hole = r->hole;
    if (first < r->hole) {
        /* From inside the released pages: what the new window cannot see is
         * released too, a page is kept only whole after the last token whose
         * source is gone, the rest is rebuilt from resident sources. */
        hole = PKV_MIN(first_page(new_len), npages(new_len));
        for (int d = hole * g_ps; d < new_len; d++) {
            int t = d < start ? d : d + nr;
            if (t / g_ps < r->hole) hole = d / g_ps + 1;
        }
        if (hole > max_hole(new_len)) {
            ref_reset(r, false);
            return;
        }
        first = hole;
        g_w_hole_shifts++;
    }
    if (npages(new_len) - first > avail_w || hole > max_hole(new_len)) {
        ref_reset(r, false);
        return;
    }
    r->wn = new_len;
    r->hole = hole;
}

static int64_t window_avail(void) {
    pkv_kv_stats st;
    pkv_kv_stats_get(g_c, &st);
    return st.window_free + st.window_cached;
}

/* Internal consistency: every page's reference count equals its holders (own
 * lists and distinct nodes), every node's count equals the sequences and child
 * nodes pointing at it, and the stats add up. Run on the main pool and on the
 * window pool (window: its -1 entries are released pages, held by nobody). */
static int node_index(kv_node **seen, int *n_seen, int32_t *refs, kv_node *n) {
    for (int j = 0; j < *n_seen; j++)
        if (seen[j] == n) return j;
    if (*n_seen == 1024) return -1;
    seen[*n_seen] = n;
    for (int64_t k = 0; k < n->n; k++)
        if (n->pages[k] >= 0) refs[n->pages[k]]++;
    return (*n_seen)++;
}

static void check_refcounts(pkv_kv_cache *c, bool window) {
    int32_t *refs = calloc((size_t)c->n_pages, sizeof *refs);
    static kv_node *seen[1024];
    static int32_t node_refs[1024];
    int n_seen = 0;
    memset(node_refs, 0, sizeof node_refs);
    for (size_t i = 0; i < c->n_seqs; i++) {
        kv_seq *s = &c->seqs[i];
        if (!s->live || s->swapped) continue;
        for (size_t k = 0; k < s->n_own; k++)
            if (s->own[k] >= 0) refs[s->own[k]]++;
        if (!s->prefix) continue;
        int j = node_index(seen, &n_seen, refs, s->prefix);
        if (j >= 0) node_refs[j]++;
        for (kv_node *n = s->prefix->parent; n; n = n->parent) node_index(seen, &n_seen, refs, n);
    }
    for (int j = 0; j < n_seen; j++)
        if (seen[j]->parent)
            for (int k = 0; k < n_seen; k++)
                if (seen[k] == seen[j]->parent) node_refs[k]++;
    for (int j = 0; j < n_seen; j++)
        if (node_refs[j] != seen[j]->refs) {
            TH_FAIL("%s pool node %d: refs %d, holders %d", window ? "window" : "main", j, seen[j]->refs, node_refs[j]);
            break;
        }
    int64_t used = 0, cached = 0;
    for (int64_t p = 0; p < c->n_pages; p++) {
        if (refs[p] != c->pages[p].refs) {
            TH_FAIL("%s pool page %lld: refs %d, holders %d", window ? "window" : "main", (long long)p,
                    c->pages[p].refs, refs[p]);
            break;
        }
        used += refs[p] > 0;
        cached += refs[p] == 0 && !c->pages[p].free;
    }
    pkv_kv_stats st;
    pkv_kv_stats_get(g_c, &st);
    if (window) {
        CHECK_INT(st.window_used, used);
        CHECK_INT(st.window_cached, cached);
        CHECK_INT(st.window_pages, c->n_pages);
        CHECK_INT(st.window_used + st.window_free + st.window_cached, st.window_pages);
    } else {
        CHECK_INT(st.pages_used, used);
        CHECK_INT(st.pages_cached, cached);
        CHECK_INT(st.pages_used + st.pages_free + st.pages_cached, st.n_pages);
    }
    /* The host pool: each used host page belongs to exactly one swapped sequence. */
    uint8_t *hm = calloc((size_t)c->host_pages + 1, 1);
    int64_t held = 0;
    for (size_t i = 0; i < c->n_seqs; i++) {
        kv_seq *s = &c->seqs[i];
        if (!s->live || !s->swapped) continue;
        for (int64_t k = 0; k < pkv_kv_seq_pages(c, s); k++) {
            int32_t h = s->host[k];
            if (h < 0 && window && k < s->n_hole) continue;
            if (h < 0 || h >= c->host_pages || hm[h]++) {
                TH_FAIL("%s pool sequence %zu: host page %d (entry %lld) is out of range or held twice",
                        window ? "window" : "main", i, h, (long long)k);
                break;
            }
            held++;
        }
    }
    CHECK_INT(held, c->host_pages - c->host_free);
    for (int64_t h = 0; h < c->host_pages; h++)
        if (!!hm[h] != !!c->host_used[h]) {
            TH_FAIL("%s pool host page %lld: used %d, held %d", window ? "window" : "main", (long long)h,
                    c->host_used[h], hm[h]);
            break;
        }
    free(hm);
    free(refs);
}

/* pkv_kv_seq_page_stats and pkv_kv_pages_held against a brute force over every
 * resident sequence's block table: a page is shared when another sequence's table
 * has it too; the pages held by a set are the union of their tables (swapped ones:
 * their host pages). */
static void check_page_stats(long step) {
    pkv_kv_cache *c = g_c;
    int32_t ids[MAX_SEQ];
    int n = 0;
    for (int id = 0; id < MAX_SEQ; id++)
        if (g_ref[id].live) ids[n++] = id;
    int32_t *holders = calloc((size_t)c->n_pages, sizeof *holders); /* resident sequences holding each page */
    int32_t *tab[MAX_SEQ] = {0};
    int64_t len[MAX_SEQ] = {0};
    for (int k = 0; k < n; k++) {
        kv_seq *s = &c->seqs[ids[k]];
        len[k] = pkv_kv_seq_pages(c, s);
        if (s->swapped) continue;
        tab[k] = malloc((size_t)(len[k] + 1) * sizeof *tab[k]);
        pkv_kv_seq_flatten(s, len[k], tab[k]);
        for (int64_t i = 0; i < len[k]; i++) holders[tab[k][i]]++;
    }
    for (int k = 0; k < n; k++) {
        int64_t pages = -1, shared = -1, want = 0;
        CHECK_OK(pkv_kv_seq_page_stats(c, ids[k], &pages, &shared));
        for (int64_t i = 0; tab[k] && i < len[k]; i++) want += holders[tab[k][i]] > 1;
        if (pages != len[k] || shared != want) {
            TH_FAIL("step %ld seq %d: page stats %lld/%lld shared, want %lld/%lld", step, ids[k], (long long)shared,
                    (long long)pages, (long long)want, (long long)len[k]);
            break;
        }
    }
    /* the union of a random half and of all of them */
    for (int pass = 0; pass < 2; pass++) {
        int32_t sub[MAX_SEQ];
        int m = 0;
        int64_t dev_want = 0, host_want = 0, dev = -1, host = -1;
        uint8_t *seen = calloc((size_t)c->n_pages, 1);
        for (int k = 0; k < n; k++) {
            if (pass == 0 && (th_rand(&g_rng) & 1)) continue;
            sub[m++] = ids[k];
            if (!tab[k]) host_want += len[k];
            for (int64_t i = 0; tab[k] && i < len[k]; i++)
                if (!seen[tab[k][i]]++) dev_want++;
        }
        CHECK_OK(pkv_kv_pages_held(c, m, sub, &dev, &host));
        if (dev != dev_want || host != host_want)
            TH_FAIL("step %ld: pages held by %d sequences %lld + %lld host, want %lld + %lld", step, m, (long long)dev,
                    (long long)host, (long long)dev_want, (long long)host_want);
        free(seen);
    }
    for (int k = 0; k < n; k++) free(tab[k]);
    free(holders);
}

static float g_buf[MAX_TOK * MAX_DIM];

static double kstep_of(pkv_type t) {
    return t == PKV_TYPE_F32 ? 2e-6 : t == PKV_TYPE_F16 ? 1e-3 : t == PKV_TYPE_Q8_0 ? 0.01 : 0.25;
}

/* Compare the K (v = 0) or V (v = 1) of layer il of tokens [t0, t1) of sequence
 * id, read into g_buf ([token][all heads][dim]), with the reference: keys moved
 * by shifts within n_shifts rounding steps, everything else exactly. */
static void compare_rows(long step, int id, int il, int v, int t0, int t1, const char *pool) {
    const rseq *r = &g_ref[id];
    for (int t = t0; t < t1; t++) {
        if (v) {
            if (memcmp(&g_buf[t * vdim[il]], r->t[t].v[il], (size_t)vdim[il] * 4)) {
                TH_FAIL("step %ld seq %d layer %d%s token %d: V differs", step, id, il, pool, t);
                return;
            }
            continue;
        }
        double tol = r->t[t].nshift * kstep_of(dtype[il]);
        for (int i = 0; i < kdim[il]; i++) {
            double want = r->t[t].k[il][i], got = g_buf[t * kdim[il] + i];
            if (!(fabs(got - want) <= tol)) {
                TH_FAIL("step %ld seq %d layer %d%s token %d K[%d]: %.9g, want %.9g (shifted %d times)", step, id, il,
                        pool, t, i, got, want, r->t[t].nshift);
                return;
            }
        }
    }
}

/* Read the K (v = 0) or V (v = 1) of window layer il for tokens [t0, t1) of seq
 * into out[t][n_kv_heads * dim], through the window block table and device
 * reads. 0 when one of those pages is released (-1) or a read fails. */
static int read_window(int32_t seq, int il, int v, int t0, int t1, float *out) {
    pkv_kv_block_table bt;
    if (pkv_kv_block_table_window(g_c, 1, &seq, &bt)) return 0;
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(g_c), il, &li);
    int d = v ? li.head_dim_v : li.head_dim_k, H = li.n_kv_heads;
    pkv_type ty = v ? li.dtype_v : li.dtype_k;
    if (t1 > bt.seq_len[0]) return 0;
    for (int s = 0; s < li.n_shards; s++) {
        pkv_kv_shard_info si;
        if (pkv_kv_shard(g_c, il, s, &si)) return 0;
        size_t rb = v ? si.v_row_bytes : si.k_row_bytes;
        uint8_t buf[4096];
        for (int t = t0; t < t1; t++) {
            int32_t page = bt.pages[bt.indptr[0] + t / g_ps];
            if (page < 0) return 0;
            size_t off = (size_t)(page * g_ps + t % g_ps) * rb;
            if (v ? pkv_buffer_read(si.v, si.v_off + off, buf, rb) : pkv_buffer_read(si.k, si.k_off + off, buf, rb))
                return 0;
            kt_decode(ty, buf, si.n_heads, d, out + (size_t)t * H * d + (size_t)si.head_begin * d);
        }
    }
    return 1;
}

/* One token's stored K or V bytes of layer il at row `row` of its pool, every
 * shard in turn; 0 on a failed read. */
static size_t read_row_raw(int il, int v, int32_t row, uint8_t *out) {
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(g_c), il, &li);
    size_t at = 0;
    for (int s = 0; s < li.n_shards; s++) {
        pkv_kv_shard_info si;
        if (pkv_kv_shard(g_c, il, s, &si)) return 0;
        size_t rb = v ? si.v_row_bytes : si.k_row_bytes;
        if (v ? pkv_buffer_read(si.v, si.v_off + (size_t)row * rb, out + at, rb)
              : pkv_buffer_read(si.k, si.k_off + (size_t)row * rb, out + at, rb))
            return 0;
        at += rb;
    }
    return at;
}

/* The pages of seq in the main pool (window = false) or the window pool, copied
 * (block tables live until the next table is built). 0 on error. */
static int table_of(int32_t seq, bool window, int32_t *pages) {
    pkv_kv_block_table bt;
    if (window ? pkv_kv_block_table_window(g_c, 1, &seq, &bt) : pkv_kv_block_table_get(g_c, 1, &seq, false, &bt))
        return 0;
    memcpy(pages, bt.pages + bt.indptr[0], (size_t)(bt.indptr[1] - bt.indptr[0]) * sizeof *pages);
    return 1;
}

/* b was loaded from a's file: every stored byte of every resident row is equal
 * (the window layer: its resident tokens [hole * page_size, window length)). */
static void compare_raw(long step, int32_t a, int32_t b) {
    const rseq *r = &g_ref[a];
    for (int il = 0; il < 2; il++) {
        bool win = il == g_wl;
        int32_t pa[MAX_TOK + 8], pb[MAX_TOK + 8];
        if (!table_of(a, win, pa) || !table_of(b, win, pb)) {
            TH_FAIL("step %ld: block tables of %d and %d: %s", step, a, b, pkv_errmsg());
            return;
        }
        int t0 = win ? PKV_MIN(r->hole * g_ps, r->wn) : 0, t1 = win ? r->wn : r->n;
        for (int t = t0; t < t1; t++)
            for (int v = 0; v < 2; v++) {
                uint8_t x[4096], y[4096];
                int32_t ra = pa[t / g_ps] * g_ps + t % g_ps, rb = pb[t / g_ps] * g_ps + t % g_ps;
                size_t nx = pa[t / g_ps] < 0 ? 0 : read_row_raw(il, v, ra, x);
                size_t ny = pb[t / g_ps] < 0 ? 0 : read_row_raw(il, v, rb, y);
                if (!nx || nx != ny || memcmp(x, y, nx)) {
                    TH_FAIL("step %ld: sequence %d loaded from %d's file: layer %d%s token %d %s differs", step, b, a,
                            il, win ? " (window pool)" : "", t, v ? "V" : "K");
                    return;
                }
            }
    }
}

/* Every sequence's window-pool state against the reference: window length,
 * released pages (exactly the leading -1 entries, resident pages after them),
 * swap state, tokens and positions, the pages it holds; and the replay stat. */
static void check_window_seqs(long step, const char *when) {
    pkv_kv_cache *w = g_c->sub;
    CHECK_INT(w->n_live, g_c->n_live);
    for (int id = 0; id < MAX_SEQ; id++) {
        const rseq *r = &g_ref[id];
        bool wlive = (size_t)id < w->n_seqs && w->seqs[id].live;
        if (!r->live || !wlive) {
            if (r->live != wlive) TH_FAIL("step %ld seq %d: live %d in the window pool, %d in the reference", step, id, wlive, r->live);
            continue;
        }
        const kv_seq *s = &w->seqs[id];
        int64_t wl = pkv_kv_seq_window_len(g_c, id);
        if (wl != r->wn || s->n_hole != r->hole || s->swapped != r->swapped) {
            TH_FAIL("step %ld seq %d (%s): window length %lld, %lld pages released%s; want %d, %d%s (length %d)", step,
                    id, when, (long long)wl, (long long)s->n_hole, s->swapped ? ", swapped" : "", r->wn, r->hole,
                    r->swapped ? ", swapped" : "", r->n);
            continue;
        }
        int np = npages(r->wn);
        if (r->wn == r->n && r->hole > max_hole(r->n))
            TH_FAIL("step %ld seq %d: %d tokens, window %d, but pages before %d are released", step, id, r->n, g_W,
                    r->hole);
        if (np - r->hole > held_bound(r))
            TH_FAIL("step %ld seq %d: holds %d window pages (%d tokens, %d released), more than %d (last step %d tokens)",
                    step, id, np - r->hole, r->wn, r->hole, held_bound(r), r->last);
        if (r->swapped) continue;
        int32_t pages[MAX_TOK + 8];
        if (!table_of(id, true, pages)) {
            TH_FAIL("step %ld seq %d: window block table: %s", step, id, pkv_errmsg());
            continue;
        }
        for (int i = 0; i < np; i++)
            if ((i < r->hole) != (pages[i] < 0) || pages[i] >= w->n_pages) {
                TH_FAIL("step %ld seq %d: window page %d is %d (%d released)", step, id, i, pages[i], r->hole);
                break;
            }
        int t0 = PKV_MIN(r->hole * g_ps, r->wn);
        int32_t tok[MAX_TOK + 8], pos[MAX_TOK + 8];
        CHECK_OK(pkv_kv_seq_tokens(w, id, t0, r->wn - t0, tok, pos));
        for (int t = t0; t < r->wn; t++)
            if (tok[t - t0] != r->t[t].tok || pos[t - t0] != r->t[t].pos) {
                TH_FAIL("step %ld seq %d window token %d: (%d @%d), want (%d @%d)", step, id, t, tok[t - t0],
                        pos[t - t0], r->t[t].tok, r->t[t].pos);
                break;
            }
    }
    pkv_kv_stats st;
    pkv_kv_stats_get(g_c, &st);
    CHECK_INT(st.window_replays, g_want_replays);
}

/* What pkv_model_forward does before its next step on a sequence whose window
 * layers are behind: replay the missing tokens in pieces, writing the window
 * layer's K/V (the reference's) at the rows returned. Without room for a piece
 * the window is reset, as a failed replay step leaves it. Returns the pieces. */
static int catch_up(void) {
    int pieces = 0;
    for (int id = 0; id < MAX_SEQ; id++) {
        rseq *r = &g_ref[id];
        if (!r->live || r->swapped) continue;
        while (r->wn < r->n) {
            int32_t k = 1 + (int32_t)(th_rand(&g_rng) % 12), rows_w[16];
            if (k > r->n - r->wn) k = r->n - r->wn;
            ref_drop(r);
            pkv_status st = pkv_kv_window_replay(g_c, id, k, rows_w);
            pieces++;
            if (st == PKV_ERR_OUT_OF_PAGES) {
                g_w_replay_oop++;
                CHECK_OK(pkv_kv_window_reset(g_c, id));
                ref_reset(r, false);
                break;
            }
            CHECK_OK(st);
            if (st) return pieces;
            for (int j = 0; j < k; j++) CHECK(write_layer(g_wl, rows_w[j], &r->t[r->wn + j]));
            r->wn += k;
            r->last = k;
            g_w_replayed += k;
        }
    }
    return pieces;
}

static void verify(long step) {
    int fails0 = th_failures;
    if (g_wl >= 0) {
        check_window_seqs(step, "after the operation");
        if (th_failures > fails0) { /* replaying from a wrong state would only add noise */
            fprintf(stderr, "  (after step %ld)\n", step);
            return;
        }
        if (catch_up()) check_window_seqs(step, "after the replay");
    }
    for (int id = 0; id < MAX_SEQ; id++) {
        rseq *r = &g_ref[id];
        if (!r->live) {
            CHECK_INT(pkv_kv_seq_len(g_c, id), -1);
            continue;
        }
        CHECK_INT(pkv_kv_seq_len(g_c, id), r->n);
        CHECK_INT(pkv_kv_seq_swapped(g_c, id), r->swapped);
        int32_t tok[MAX_TOK + 8], pos[MAX_TOK + 8];
        CHECK_OK(pkv_kv_seq_tokens(g_c, id, 0, r->n, tok, pos));
        for (int t = 0; t < r->n; t++)
            if (tok[t] != r->t[t].tok || pos[t] != r->t[t].pos) {
                TH_FAIL("step %ld seq %d token %d: (%d @%d), want (%d @%d)", step, id, t, tok[t], pos[t], r->t[t].tok,
                        r->t[t].pos);
                break;
            }
        if (r->swapped) continue;
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++) {
                if (il != g_wl) {
                    CHECK_OK(kt_read_seq(g_c, id, il, v, g_buf));
                    compare_rows(step, id, il, v, 0, r->n, "");
                    continue;
                }
                if (r->wn != r->n) continue; /* behind: nothing to read until it is recomputed */
                /* every resident token, which covers the last `window` (checked above) */
                int t0 = PKV_MIN(r->hole * g_ps, r->n);
                if (!read_window(id, il, v, t0, r->n, g_buf)) {
                    TH_FAIL("step %ld seq %d: reading window tokens [%d, %d) of layer %d: %s", step, id, t0, r->n, il,
                            pkv_errmsg());
                    continue;
                }
                compare_rows(step, id, il, v, t0, r->n, " (window pool)");
            }
    }
    check_refcounts(g_c, false);
    if (g_wl >= 0) check_refcounts(g_c->sub, true);
    check_page_stats(step);
    if (th_failures > fails0) fprintf(stderr, "  (after step %ld)\n", step);
}

static int pick(bool resident) {
    int ids[MAX_SEQ], n = 0;
    for (int i = 0; i < MAX_SEQ; i++)
        if (g_ref[i].live && (!resident || !g_ref[i].swapped)) ids[n++] = i;
    return n ? ids[th_rand(&g_rng) % (uint64_t)n] : -1;
}

static int n_live(void) {
    int n = 0;
    for (int i = 0; i < MAX_SEQ; i++) n += g_ref[i].live;
    return n;
}

static void op_append(void) {
    int k = 1 + (int)(th_rand(&g_rng) % 3);
    int32_t seqs[3], nt[3], tok[32], pos[32], rows[32], rows_w[32];
    int ns = 0, total = 0;
    bool explicit_pos = th_rand(&g_rng) % 4 == 0;
    for (int i = 0; i < k; i++) {
        int id = pick(true);
        if (id < 0) break;
        bool dup = false;
        for (int j = 0; j < ns; j++) dup |= seqs[j] == id;
        if (dup) continue;
        int n = (int)(th_rand(&g_rng) % 7);
        if (g_ref[id].n + n > MAX_TOK) n = 0;
        if (g_wl >= 0 && g_ref[id].wn != g_ref[id].n) continue; /* its window layers must be recomputed first */
        seqs[ns] = id;
        nt[ns] = n;
        for (int j = 0; j < n; j++) {
            tok[total + j] = (int32_t)(th_rand(&g_rng) % 3);
            int32_t last = g_ref[id].n + j > 0 ? (j ? pos[total + j - 1] : g_ref[id].t[g_ref[id].n - 1].pos) : -1;
            pos[total + j] = explicit_pos ? last + 1 + (int32_t)(th_rand(&g_rng) % 3) : last + 1;
        }
        total += n;
        ns++;
    }
    if (ns == 0) return;
    snprintf(g_what, sizeof g_what, "append of %d tokens to %d sequences", total, ns);
    pkv_kv_stats before;
    pkv_kv_stats_get(g_c, &before);
    pkv_status st;
    if (g_wl >= 0) {
        /* Each sequence first gives back what left its window, even when the append then fails. */
        for (int i = 0; i < ns && total > 0; i++) ref_drop(&g_ref[seqs[i]]);
        st = pkv_kv_append_batch_w(g_c, ns, seqs, nt, tok, explicit_pos ? pos : NULL, rows, rows_w);
    } else {
        st = pkv_kv_append_batch(g_c, ns, seqs, nt, tok, explicit_pos ? pos : NULL, rows);
    }
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
        g_w_oop += g_wl >= 0 && strstr(pkv_errmsg(), "sliding-window") != NULL;
        return;
    }
    CHECK_OK(st);
    if (st) return;
    pkv_kv_stats after;
    pkv_kv_stats_get(g_c, &after);
    g_cow += (long)(after.cow_pages - before.cow_pages);
    int at = 0;
    for (int i = 0; i < ns; i++) {
        rseq *r = &g_ref[seqs[i]];
        for (int j = 0; j < nt[i]; j++, at++) {
            rtok *t = &r->t[r->n];
            t->tok = tok[at];
            t->pos = pos[at];
            t->h = chain(r->n ? r->t[r->n - 1].h : FP, t->tok, t->pos);
            fill_token(t);
            r->n++;
            CHECK(write_token(rows[at], g_wl >= 0 ? rows_w[at] : -1, t));
        }
        if (total > 0) { /* (nothing at all is appended: nothing was given back either) */
            r->wn = r->n;
            r->last = nt[i];
        }
    }
}

static void op_create(void) {
    if (n_live() >= MAX_LIVE) return;
    int32_t id;
    CHECK_OK(pkv_kv_seq_create(g_c, FP, &id));
    if (id < 0 || id >= MAX_SEQ || g_ref[id].live) {
        TH_FAIL("create gave id %d", id);
        return;
    }
    g_ref[id].live = true;
    g_ref[id].swapped = false;
    g_ref[id].n = g_ref[id].wn = g_ref[id].hole = g_ref[id].last = 0;
}

/* Window seeds: asking for all of resident sequence src's tokens at its own
 * positions, the hit the cache must give at least. The main pool finds src's
 * published pages as long as each is the only indexed page that can follow the
 * previous one (a duplicate chain may win the match instead: nothing is required
 * from there on); the window pool then has, for a boundary m whose window
 * [m + 1 - window, m) src still holds and has published, src's window pages
 * published beside exactly those main pages. */
static int must_match(int src) {
    const rseq *r = &g_ref[src];
    if (r->swapped || r->wn != r->n) return 0;
    kv_seq *ms = &g_c->seqs[src], *ws = &g_c->sub->seqs[src];
    int64_t lim = PKV_MIN(PKV_MIN(ms->pub_n, ws->pub_n), (int64_t)(r->n / g_ps));
    size_t bytes = (size_t)g_ps * sizeof(int32_t);
    int best = 0;
    for (int64_t m = 1; m <= lim; m++) {
        int32_t p = pkv_kv_seq_page(ms, m - 1), prev = m > 1 ? pkv_kv_seq_page(ms, m - 2) : -1;
        int count = 0;
        for (int32_t q = 0; q < g_c->n_pages; q++) {
            const kv_page *P = &g_c->pages[q];
            if (!P->indexed || P->fp != FP || P->prev_page != prev) continue;
            if (prev >= 0 && P->prev_gen != g_c->pages[prev].gen) continue;
            if (memcmp(&g_c->tok[(size_t)q * g_ps], &g_c->tok[(size_t)p * g_ps], bytes) ||
                memcmp(&g_c->pos[(size_t)q * g_ps], &g_c->pos[(size_t)p * g_ps], bytes))
                continue;
            count++;
        }
        if (count != 1) break;
        if (max_hole(m * g_ps) >= r->hole) best = (int)m;
    }
    return best * g_ps;
}

static void op_prefix(void) {
    if (n_live() >= MAX_LIVE) return;
    int32_t id;
    CHECK_OK(pkv_kv_seq_create(g_c, FP, &id));
    if (id < 0 || id >= MAX_SEQ) return;
    /* Tokens of an existing sequence (unshifted ones match) plus a random tail. */
    int32_t tok[MAX_TOK + 16], pos[MAX_TOK + 16];
    int n = 0, src = pick(false);
    /* window seeds: half of them ask for all of it, with its positions, so hits are
     * long enough to start past released window pages */
    bool whole = g_wl >= 0 && th_rand(&g_rng) % 2;
    if (src >= 0 && src != id) {
        n = whole ? g_ref[src].n : (int)(th_rand(&g_rng) % (uint64_t)(g_ref[src].n + 1));
        for (int i = 0; i < n; i++) {
            tok[i] = g_ref[src].t[i].tok;
            pos[i] = whole ? g_ref[src].t[i].pos : i;
        }
    }
    int n_src = n, extra = (int)(th_rand(&g_rng) % 6);
    for (int i = 0; i < extra && n < MAX_TOK; i++, n++) {
        tok[n] = (int32_t)(th_rand(&g_rng) % 3);
        pos[n] = n ? pos[n - 1] + 1 : 0;
    }
    int64_t m = -1;
    int must = whole && src >= 0 && src != id ? must_match(src) : 0;
    CHECK_OK(pkv_kv_prefix_match(g_c, id, tok, whole ? pos : NULL, n, &m));
    snprintf(g_what, sizeof g_what, "prefix match into seq %d of %d tokens (%d from seq %d%s): %lld matched", id, n,
             n_src, src, whole ? ", its positions" : "", (long long)m);
    CHECK(m >= 0 && m <= n && m % g_ps == 0);
    if (m < must)
        TH_FAIL("prefix match of seq %d's %d tokens: %lld matched, but it holds and has published the main pages and "
                "the window of the first %d", src, n_src, (long long)m, must);
    g_w_prefix_required += must > 0;
    rseq *r = &g_ref[id];
    r->live = true;
    r->swapped = false;
    r->n = 0;
    for (int i = 0; i < m; i++) {
        rtok *t = &r->t[i];
        t->tok = tok[i];
        t->pos = whole ? pos[i] : i;
        t->h = chain(i ? r->t[i - 1].h : FP, t->tok, t->pos);
        fill_token(t);
    }
    r->n = (int)m;
    /* A window hit holds just the window before its end (the rest is released). */
    r->wn = (int)m;
    r->hole = m > 0 ? max_hole(m) : 0;
    r->last = 0;
    g_prefix_hits += m > 0;
    g_w_prefix_holes += g_wl >= 0 && r->hole > 0;
}

static void op_fork(void) {
    if (n_live() >= MAX_LIVE) return;
    int p = pick(true);
    if (p < 0) return;
    int32_t child;
    snprintf(g_what, sizeof g_what, "fork of seq %d (%d tokens)", p, g_ref[p].n);
    CHECK_OK(pkv_kv_fork(g_c, p, &child));
    if (child < 0 || child >= MAX_SEQ) return;
    g_ref[child] = g_ref[p];
}

static void op_truncate(void) {
    int id = pick(true);
    if (id < 0) return;
    rseq *r = &g_ref[id];
    int keep = (int)(th_rand(&g_rng) % (uint64_t)(r->n + 1));
    snprintf(g_what, sizeof g_what, "truncate of seq %d (%d tokens, window %d, %d pages released) to %d", id, r->n, r->wn,
             r->hole, keep);
    CHECK_OK(pkv_kv_truncate(g_c, id, keep));
    r->n = keep;
    if (g_wl >= 0 && keep < r->wn) { /* back into released pages: recomputed */
        if (r->hole > max_hole(keep))
            ref_reset(r, false);
        else
            r->wn = keep;
    }
}

static bool g_rope_ok = true;

static void op_shift(void) {
    if (!g_rope_ok) return;
    int id = pick(true);
    if (id < 0 || g_ref[id].n == 0) return;
    rseq *r = &g_ref[id];
    int start = (int)(th_rand(&g_rng) % (uint64_t)r->n);
    int nr = (int)(th_rand(&g_rng) % (uint64_t)(r->n - start + 1));
    int32_t delta = th_rand(&g_rng) % 2 ? -nr : (int32_t)(th_rand(&g_rng) % 11) - 5;
    int64_t avail_w = g_wl >= 0 ? window_avail() : 0;
    snprintf(g_what, sizeof g_what, "shift of seq %d (%d tokens, window %d, %d pages released): start %d, remove %d, delta %d",
             id, r->n, r->wn, r->hole, start, nr, delta);
    pkv_status st = pkv_kv_shift(g_c, id, start, nr, delta);
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
        return;
    }
    if (st == PKV_ERR_UNSUPPORTED) {
        fprintf(stderr, "note: shift unsupported here (%s); shifts skipped\n", pkv_errmsg());
        g_rope_ok = false;
        return;
    }
    CHECK_OK(st);
    if (st) return;
    if (g_wl >= 0) ref_window_shift(r, r->n, start, nr, delta, avail_w);
    int moved = r->n - start - nr;
    for (int i = 0; i < moved; i++) r->t[start + i] = r->t[start + nr + i];
    r->n -= nr;
    if (moved == 0 || (nr == 0 && delta == 0)) return;
    for (int i = start; i < r->n; i++) {
        rtok *t = &r->t[i];
        t->pos += delta;
        if (delta == 0) continue;
        t->nshift++;
        for (int il = 0; il < 2; il++)
            for (int h = 0; h < kdim[il] / hd[il]; h++)
                kt_rope_ref(&t->k[il][h * hd[il]], hd[il], g_nrot, g_neox, 10000.0, 1.0, delta);
    }
}

static void op_swap_out(void) {
    int id = pick(true);
    if (id < 0) return;
    rseq *r = &g_ref[id];
    /* The window pool goes first; when the main pool then has no host room, the
     * window sequence comes back in, or is emptied when its pages are gone. */
    bool window_full = g_wl >= 0 && npages(r->wn) - r->hole > g_c->sub->host_free;
    snprintf(g_what, sizeof g_what, "swap out of seq %d (%d tokens, window %d, %d pages released)", id, r->n, r->wn,
             r->hole);
    pkv_status st = pkv_kv_swap_out(g_c, id);
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
        if (g_wl >= 0 && !window_full && r->wn > 0 && pkv_kv_seq_window_len(g_c, id) == 0) {
            ref_reset(r, true);
            g_w_swap_fallback++;
        }
        return;
    }
    CHECK_OK(st);
    if (!st) r->swapped = true;
}

static void op_swap_in(void) {
    int ids[MAX_SEQ], n = 0;
    for (int i = 0; i < MAX_SEQ; i++)
        if (g_ref[i].live && g_ref[i].swapped) ids[n++] = i;
    if (!n) return;
    int id = ids[th_rand(&g_rng) % (uint64_t)n];
    rseq *r = &g_ref[id];
    int64_t avail_w = g_wl >= 0 ? window_avail() : 0;
    snprintf(g_what, sizeof g_what, "swap in of seq %d (%d tokens, window %d, %d pages released, %lld window pages free "
             "or evictable)", id, r->n, r->wn, r->hole, (long long)avail_w);
    pkv_status st = pkv_kv_swap_in(g_c, id);
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
        return;
    }
    CHECK_OK(st);
    if (st) return;
    r->swapped = false;
    if (g_wl >= 0 && npages(r->wn) - r->hole > avail_w) ref_reset(r, true); /* no room: recomputed instead */
}

static void op_clear(void) {
    int id = pick(false);
    if (id < 0) return;
    CHECK_OK(pkv_kv_seq_clear(g_c, id));
    g_ref[id].n = g_ref[id].wn = g_ref[id].hole = g_ref[id].last = 0;
    g_ref[id].swapped = false;
}

static void op_free(void) {
    int id = pick(false);
    if (id < 0) return;
    CHECK_OK(pkv_kv_seq_free(g_c, id));
    g_ref[id].live = false;
}

static void op_save_load(long step) {
    if (n_live() >= MAX_LIVE) return;
    int id = pick(true);
    if (id < 0) return;
    const char *path = th_tmp("kv-random.seq");
    snprintf(g_what, sizeof g_what, "save/load of seq %d (%d tokens, window %d, %d pages released)", id, g_ref[id].n,
             g_ref[id].wn, g_ref[id].hole);
    CHECK_OK(pkv_kv_seq_save(g_c, id, path));
    int32_t nid = -1;
    pkv_status st = pkv_kv_seq_load(g_c, path, 0, &nid);
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
        return;
    }
    CHECK_OK(st);
    if (st || nid < 0 || nid >= MAX_SEQ) return;
    g_ref[nid] = g_ref[id];
    compare_raw(step, id, nid);
}

static void op_clear_all(void) {
    CHECK_OK(pkv_kv_clear(g_c));
    for (int i = 0; i < MAX_SEQ; i++) {
        g_ref[i].n = g_ref[i].wn = g_ref[i].hole = g_ref[i].last = 0;
        g_ref[i].swapped = false;
    }
}

static const char *const op_names[12] = {"append", "create", "fork", "truncate", "shift", "swap-out",
                                         "swap-in", "clear", "free", "prefix", "save/load", "clear-all"};

/* wl: the layer given a window of `window` tokens (-1: none); window_pages: the
 * window pool's pages (0 = as many as the main pool). */
static void run_seed(kt_env *e, uint64_t seed, int page_size, bool collide, bool plain_host, long n_ops, bool quant,
                     int wl, int window, int64_t window_pages) {
    memset(g_ref, 0, sizeof g_ref);
    set_layout(e, quant, wl, window);
    g_rng = seed;
    g_ps = page_size;
    g_neox = seed & 1;
    g_want_replays = 0;
    pkv_kv_test_hash_collide = collide;
    pkv_kv_test_plain_host_pool = plain_host;
    pkv_kv_params p = kt_params(e, page_size, 40, 24);
    p.rope_neox = g_neox;
    p.rope_n_rot = g_nrot;
    p.window_pages = window_pages;
    g_c = pkv_kv_cache_create(p);
    if (!g_c || (wl >= 0) != (g_c->sub != NULL)) {
        TH_FAIL("create: %s", g_c ? "window pool missing or unexpected" : pkv_errmsg());
        pkv_kv_cache_free(g_c);
        return;
    }
    int f0 = th_failures;
    long *ops = wl >= 0 ? g_ops_w : g_ops, step = 0;
    for (; step < n_ops && th_failures == f0; step++) {
        int r = (int)(th_rand(&g_rng) % 100);
        int kind = r < 30   ? 0
                   : r < 37 ? 1
                   : r < 45 ? 2
                   : r < 54 ? 3
                   : r < 62 ? 4
                   : r < 67 ? 5
                   : r < 73 ? 6
                   : r < 76 ? 7
                   : r < 81 ? 8
                   : r < 89 ? 9
                   : r < 93 ? 10
                   : r == 93 && th_rand(&g_rng) % 8 == 0 ? 11
                              : 0;
        ops[kind]++;
        g_what[0] = 0;
        switch (kind) {
        case 0: op_append(); break;
        case 1: op_create(); break;
        case 2: op_fork(); break;
        case 3: op_truncate(); break;
        case 4: op_shift(); break;
        case 5: op_swap_out(); break;
        case 6: op_swap_in(); break;
        case 7: op_clear(); break;
        case 8: op_free(); break;
        case 9: op_prefix(); break;
        case 10: op_save_load(step); break;
        case 11: op_clear_all(); break;
        }
        verify(step);
        if (th_failures != f0)
            fprintf(stderr, "  seed %llu: the failing step was operation kind %d (%s%s%s)\n", (unsigned long long)seed,
                    kind, op_names[kind], g_what[0] ? ": " : "", g_what);
    }
    pkv_kv_stats st;
    pkv_kv_stats_get(g_c, &st);
    pkv_kv_cache_free(g_c);
    pkv_kv_test_hash_collide = false;
    pkv_kv_test_plain_host_pool = false;
    char win[64] = "";
    if (wl >= 0)
        snprintf(win, sizeof win, ", window %d on layer %d (%lld pages)", window, wl, (long long)st.window_pages);
    fprintf(stderr, "seed %llu page_size %d %s%s%s%s: %ld ops, %ld out-of-pages, %ld prefix hits, %ld cow pages\n",
            (unsigned long long)seed, page_size, quant ? "quantized KV" : "f32/f16 KV", win,
            collide ? " (all hashes collide)" : "", plain_host ? " (host pool in plain memory)" : "", step, g_fail_oop,
            g_prefix_hits, g_cow);
    if (wl >= 0)
        fprintf(stderr,
                "  window pool: %llu pages released, %ld emptied (replays stat %llu: %ld after an out-of-pages replay, "
                "%ld swap-out fallbacks), %ld tokens replayed, %ld appends out of window pages, %ld shifts from inside "
                "released pages kept the window, %ld prefix hits with released pages (%ld with a required minimum)\n",
                (unsigned long long)st.window_released, g_w_resets, (unsigned long long)st.window_replays,
                g_w_replay_oop, g_w_swap_fallback, g_w_replayed, g_w_oop, g_w_hole_shifts, g_w_prefix_holes,
                g_w_prefix_required);
    g_fail_oop = g_prefix_hits = g_cow = 0;
    g_w_oop = g_w_replayed = g_w_replay_oop = g_w_resets = g_w_hole_shifts = g_w_prefix_holes = g_w_swap_fallback = 0;
    g_w_prefix_required = 0;
    g_wl = -1;
    g_W = 0;
}

/* The devices of the two shard groups; test-kv-random-vulkan.c includes this file
 * with other devices (vulkan:0 alone, and cpu + vulkan:0). */
#ifndef KV_RANDOM_DEVICES
#define KV_RANDOM_DEVICES {{"cpu", "cpu:1"}}
#define KV_RANDOM_OPS 10000 /* per seed; about 2 s in Release, 20 s with ASan+UBSan on 2 cores */
#endif
/* Operations per window seed: every step also replays, reads and checks the window pool. */
#ifndef KV_RANDOM_WINDOW_OPS
#define KV_RANDOM_WINDOW_OPS (KV_RANDOM_OPS * 2 / 5)
#endif

int main(void) {
    static const char *const devs[][2] = KV_RANDOM_DEVICES;
    for (size_t dv = 0; dv < sizeof devs / sizeof devs[0]; dv++) {
    kt_env e;
    if (!kt_open_names(&e, devs[dv][0], devs[dv][1])) return th_skip(pkv_errmsg());
    fprintf(stderr, "cache sharded over %s and %s\n", devs[dv][0], devs[dv][1]);
    int64_t live0 = pkv_alloc_live();
    long n_ops = KV_RANDOM_OPS, n_wops = KV_RANDOM_WINDOW_OPS;
    const char *env = getenv("PKV_KV_RANDOM_OPS");
    if (env) n_wops = (n_ops = atol(env)) * 2 / 5;
    if ((env = getenv("PKV_KV_RANDOM_WINDOW_OPS"))) n_wops = atol(env);
    run_seed(&e, 1, 4, false, false, n_ops, false, -1, 0, 0);
    run_seed(&e, 2, 3, false, true, n_ops, false, -1, 0, 0);
    run_seed(&e, 3, 1, false, false, n_ops, false, -1, 0, 0);
    run_seed(&e, 4, 4, true, false, n_ops, false, -1, 0, 0);
    run_seed(&e, 5, 8, false, false, n_ops, false, -1, 0, 0);
    run_seed(&e, 6, 4, false, false, n_ops, true, -1, 0, 0);
    run_seed(&e, 7, 3, false, true, n_ops, true, -1, 0, 0);
    run_seed(&e, 8, 8, true, false, n_ops, true, -1, 0, 0);
    /* window seeds: seed, page size, collide, plain host, ops, quantized, layer, window, window pages */
    run_seed(&e, 9, 4, false, false, n_wops, false, 1, 12, 0);
    run_seed(&e, 10, 3, false, true, n_wops, false, 1, 5, 30);
    run_seed(&e, 11, 4, true, false, n_wops, true, 0, 5, 32);
    run_seed(&e, 12, 1, false, false, n_wops, false, 1, 5, 0);
    run_seed(&e, 13, 8, false, false, n_wops, true, 1, 5, 16);
    run_seed(&e, 14, 3, true, false, n_wops, false, 0, 12, 0);
    CHECK_INT(pkv_alloc_live(), live0);
    fprintf(stderr, "ops:");
    for (int i = 0; i < 12; i++) fprintf(stderr, " %ld", g_ops[i]);
    fprintf(stderr, "\nwindow seeds, ops per kind:");
    for (int i = 0; i < 12; i++) fprintf(stderr, " %s %ld", op_names[i], g_ops_w[i]);
    fprintf(stderr, "\n");
    memset(g_ops, 0, sizeof g_ops);
    memset(g_ops_w, 0, sizeof g_ops_w);
    kt_close(&e);
    }
    return th_done();
}
