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
 * expected K/V are the quantized-then-dequantized contents. */
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

static void set_layout(kt_env *e, bool quant) {
    kt_layout_sharded(e);
    if (quant) {
        e->layers[0].head_dim_k = e->layers[0].head_dim_v = 32;
        e->layers[0].dtype_k = PKV_TYPE_Q8_0;
        e->layers[0].dtype_v = PKV_TYPE_Q4_0;
        e->layers[1].head_dim_k = e->layers[1].head_dim_v = 32;
        e->layers[1].dtype_k = PKV_TYPE_Q4_0;
        e->layers[1].dtype_v = PKV_TYPE_F16;
    }
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
static long g_ops[16], g_fail_oop, g_prefix_hits, g_cow;

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

static int write_token(int32_t row, const rtok *t) {
    for (int il = 0; il < 2; il++) {
        float k[MAX_DIM], v[MAX_DIM];
        for (int i = 0; i < kdim[il]; i++) k[i] = (float)t->k[il][i];
        for (int i = 0; i < vdim[il]; i++) v[i] = t->v[il][i];
        if (kt_write_row(g_c, il, 0, row, k) || kt_write_row(g_c, il, 1, row, v)) return 0;
    }
    return 1;
}

/* Internal consistency: every page's reference count equals its holders (own
 * lists and distinct nodes), every node's count equals the sequences and child
 * nodes pointing at it, and the stats add up. */
static int node_index(kv_node **seen, int *n_seen, int32_t *refs, kv_node *n) {
    for (int j = 0; j < *n_seen; j++)
        if (seen[j] == n) return j;
    if (*n_seen == 1024) return -1;
    seen[*n_seen] = n;
    for (int64_t k = 0; k < n->n; k++) refs[n->pages[k]]++;
    return (*n_seen)++;
}

static void check_refcounts(void) {
    pkv_kv_cache *c = g_c;
    int32_t *refs = calloc((size_t)c->n_pages, sizeof *refs);
    static kv_node *seen[1024];
    static int32_t node_refs[1024];
    int n_seen = 0;
    memset(node_refs, 0, sizeof node_refs);
    for (size_t i = 0; i < c->n_seqs; i++) {
        kv_seq *s = &c->seqs[i];
        if (!s->live || s->swapped) continue;
        for (size_t k = 0; k < s->n_own; k++) refs[s->own[k]]++;
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
            TH_FAIL("node %d: refs %d, holders %d", j, seen[j]->refs, node_refs[j]);
            break;
        }
    int64_t used = 0;
    for (int64_t p = 0; p < c->n_pages; p++) {
        if (refs[p] != c->pages[p].refs) {
            TH_FAIL("page %lld: refs %d, holders %d", (long long)p, c->pages[p].refs, refs[p]);
            break;
        }
        used += refs[p] > 0;
    }
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.pages_used, used);
    CHECK_INT(st.pages_used + st.pages_free + st.pages_cached, st.n_pages);
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

static void verify(long step) {
    int fails0 = th_failures;
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
        for (int il = 0; il < 2; il++) {
            CHECK_OK(kt_read_seq(g_c, id, il, 0, g_buf));
            for (int t = 0; t < r->n; t++) {
                double kstep = dtype[il] == PKV_TYPE_F32 ? 2e-6 : dtype[il] == PKV_TYPE_F16 ? 1e-3 : dtype[il] == PKV_TYPE_Q8_0 ? 0.01 : 0.25;
                double tol = r->t[t].nshift * kstep;
                for (int i = 0; i < kdim[il]; i++) {
                    double want = r->t[t].k[il][i], got = g_buf[t * kdim[il] + i];
                    if (!(fabs(got - want) <= tol)) {
                        TH_FAIL("step %ld seq %d layer %d token %d K[%d]: %.9g, want %.9g (shifted %d times)", step, id,
                                il, t, i, got, want, r->t[t].nshift);
                        t = r->n;
                        break;
                    }
                }
            }
            CHECK_OK(kt_read_seq(g_c, id, il, 1, g_buf));
            for (int t = 0; t < r->n; t++)
                if (memcmp(&g_buf[t * vdim[il]], r->t[t].v[il], (size_t)vdim[il] * 4)) {
                    TH_FAIL("step %ld seq %d layer %d token %d: V differs", step, id, il, t);
                    break;
                }
        }
    }
    check_refcounts();
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
    int32_t seqs[3], nt[3], tok[32], pos[32], rows[32];
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
    pkv_kv_stats before;
    pkv_kv_stats_get(g_c, &before);
    pkv_status st = pkv_kv_append_batch(g_c, ns, seqs, nt, tok, explicit_pos ? pos : NULL, rows);
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
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
            CHECK(write_token(rows[at], t));
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
    g_ref[id].n = 0;
}

static void op_prefix(void) {
    if (n_live() >= MAX_LIVE) return;
    int32_t id;
    CHECK_OK(pkv_kv_seq_create(g_c, FP, &id));
    if (id < 0 || id >= MAX_SEQ) return;
    /* Tokens of an existing sequence (unshifted ones match) plus a random tail. */
    int32_t tok[MAX_TOK + 16];
    int n = 0, src = pick(false);
    if (src >= 0 && src != id) {
        n = (int)(th_rand(&g_rng) % (uint64_t)(g_ref[src].n + 1));
        for (int i = 0; i < n; i++) tok[i] = g_ref[src].t[i].tok;
    }
    int extra = (int)(th_rand(&g_rng) % 6);
    for (int i = 0; i < extra && n < MAX_TOK; i++) tok[n++] = (int32_t)(th_rand(&g_rng) % 3);
    int64_t m = -1;
    CHECK_OK(pkv_kv_prefix_match(g_c, id, tok, NULL, n, &m));
    CHECK(m >= 0 && m <= n && m % g_ps == 0);
    rseq *r = &g_ref[id];
    r->live = true;
    r->swapped = false;
    r->n = 0;
    for (int i = 0; i < m; i++) {
        rtok *t = &r->t[i];
        t->tok = tok[i];
        t->pos = i;
        t->h = chain(i ? r->t[i - 1].h : FP, t->tok, t->pos);
        fill_token(t);
    }
    r->n = (int)m;
    g_prefix_hits += m > 0;
}

static void op_fork(void) {
    if (n_live() >= MAX_LIVE) return;
    int p = pick(true);
    if (p < 0) return;
    int32_t child;
    CHECK_OK(pkv_kv_fork(g_c, p, &child));
    if (child < 0 || child >= MAX_SEQ) return;
    g_ref[child] = g_ref[p];
}

static void op_truncate(void) {
    int id = pick(true);
    if (id < 0) return;
    int keep = (int)(th_rand(&g_rng) % (uint64_t)(g_ref[id].n + 1));
    CHECK_OK(pkv_kv_truncate(g_c, id, keep));
    g_ref[id].n = keep;
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
    pkv_status st = pkv_kv_swap_out(g_c, id);
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
        return;
    }
    CHECK_OK(st);
    if (!st) g_ref[id].swapped = true;
}

static void op_swap_in(void) {
    int ids[MAX_SEQ], n = 0;
    for (int i = 0; i < MAX_SEQ; i++)
        if (g_ref[i].live && g_ref[i].swapped) ids[n++] = i;
    if (!n) return;
    int id = ids[th_rand(&g_rng) % (uint64_t)n];
    pkv_status st = pkv_kv_swap_in(g_c, id);
    if (st == PKV_ERR_OUT_OF_PAGES) {
        g_fail_oop++;
        return;
    }
    CHECK_OK(st);
    if (!st) g_ref[id].swapped = false;
}

static void op_clear(void) {
    int id = pick(false);
    if (id < 0) return;
    CHECK_OK(pkv_kv_seq_clear(g_c, id));
    g_ref[id].n = 0;
    g_ref[id].swapped = false;
}

static void op_free(void) {
    int id = pick(false);
    if (id < 0) return;
    CHECK_OK(pkv_kv_seq_free(g_c, id));
    g_ref[id].live = false;
}

static void op_save_load(void) {
    if (n_live() >= MAX_LIVE) return;
    int id = pick(true);
    if (id < 0) return;
    const char *path = th_tmp("kv-random.seq");
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
}

static void op_clear_all(void) {
    CHECK_OK(pkv_kv_clear(g_c));
    for (int i = 0; i < MAX_SEQ; i++) {
        g_ref[i].n = 0;
        g_ref[i].swapped = false;
    }
}

static void run_seed(kt_env *e, uint64_t seed, int page_size, bool collide, bool plain_host, long n_ops, bool quant) {
    memset(g_ref, 0, sizeof g_ref);
    set_layout(e, quant);
    g_rng = seed;
    g_ps = page_size;
    g_neox = seed & 1;
    pkv_kv_test_hash_collide = collide;
    pkv_kv_test_plain_host_pool = plain_host;
    pkv_kv_params p = kt_params(e, page_size, 40, 24);
    p.rope_neox = g_neox;
    p.rope_n_rot = g_nrot;
    g_c = pkv_kv_cache_create(p);
    if (!g_c) {
        TH_FAIL("create: %s", pkv_errmsg());
        return;
    }
    int f0 = th_failures;
    for (long step = 0; step < n_ops && th_failures == f0; step++) {
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
        g_ops[kind]++;
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
        case 10: op_save_load(); break;
        case 11: op_clear_all(); break;
        }
        verify(step);
        if (th_failures != f0) fprintf(stderr, "  seed %llu: the failing step was operation kind %d\n", (unsigned long long)seed, kind);
    }
    pkv_kv_cache_free(g_c);
    pkv_kv_test_hash_collide = false;
    pkv_kv_test_plain_host_pool = false;
    fprintf(stderr, "seed %llu page_size %d %s%s%s: %ld ops, %ld out-of-pages, %ld prefix hits, %ld cow pages\n",
            (unsigned long long)seed, page_size, quant ? "quantized KV" : "f32/f16 KV", collide ? " (all hashes collide)" : "",
            plain_host ? " (host pool in plain memory)" : "", n_ops, g_fail_oop,
            g_prefix_hits, g_cow);
    g_fail_oop = g_prefix_hits = g_cow = 0;
}

/* The devices of the two shard groups; test-kv-random-vulkan.c includes this file
 * with other devices (vulkan:0 alone, and cpu + vulkan:0). */
#ifndef KV_RANDOM_DEVICES
#define KV_RANDOM_DEVICES {{"cpu", "cpu:1"}}
#define KV_RANDOM_OPS 10000 /* per seed; about 2 s in Release, 20 s with ASan+UBSan on 2 cores */
#endif

int main(void) {
    static const char *const devs[][2] = KV_RANDOM_DEVICES;
    for (size_t dv = 0; dv < sizeof devs / sizeof devs[0]; dv++) {
    kt_env e;
    if (!kt_open_names(&e, devs[dv][0], devs[dv][1])) return th_skip(pkv_errmsg());
    fprintf(stderr, "cache sharded over %s and %s\n", devs[dv][0], devs[dv][1]);
    int64_t live0 = pkv_alloc_live();
    long n_ops = KV_RANDOM_OPS;
    const char *env = getenv("PKV_KV_RANDOM_OPS");
    if (env) n_ops = atol(env);
    run_seed(&e, 1, 4, false, false, n_ops, false);
    run_seed(&e, 2, 3, false, true, n_ops, false);
    run_seed(&e, 3, 1, false, false, n_ops, false);
    run_seed(&e, 4, 4, true, false, n_ops, false);
    run_seed(&e, 5, 8, false, false, n_ops, false);
    run_seed(&e, 6, 4, false, false, n_ops, true);
    run_seed(&e, 7, 3, false, true, n_ops, true);
    run_seed(&e, 8, 8, true, false, n_ops, true);
    CHECK_INT(pkv_alloc_live(), live0);
    fprintf(stderr, "ops:");
    for (int i = 0; i < 12; i++) fprintf(stderr, " %ld", g_ops[i]);
    fprintf(stderr, "\n");
    kt_close(&e);
    }
    return th_done();
}
