// labels: kv
/* The latent-attention geometry of the full pool (MLA: pkv_kv_layer_desc.v_in_k and
 * rope_off) at the KV level, beside an ordinary layer, with f16 and q8_0 K pages
 * (rows of 96 = 3 blocks, V the first 2): the layer has no V pages; fork and the
 * copy-on-write of a shared partial page, swap to the host pool and back, save and
 * load, a prefix match in memory and one from the disk tier all give the same K rows
 * bitwise (the ordinary layer's K and V too); a shift moves the latent part
 * bit-identically and re-rotates only the rotary tail, within 2e-3 of a
 * double-precision RoPE (f16; q8_0: 3e-2, one re-quantization); the fingerprint
 * changes with v_in_k and with rope_off; descriptions it cannot hold are refused. */
#include <math.h>

#include "kv-testlib.h"

enum { PS = 4, NT = 18, DK = 96, DV = 64, ROT = 32 };

static int32_t toks[NT];

static void layout(kt_env *e, pkv_type t, bool v_in_k, int rope_off) {
    e->n_layers = 2;
    e->layers[0] = (pkv_kv_layer_desc){1, DK, DV, t, t, 0, NULL, 0, 0, 0, 0, 0, {0}, ROT, 0, false, v_in_k, rope_off};
    e->layers[1] = (pkv_kv_layer_desc){2, 8, 8, PKV_TYPE_F16, PKV_TYPE_F16, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false,
                                       false, 0};
}

static pkv_kv_cache *make(kt_env *e, const char *dir) {
    pkv_kv_params p = kt_params(e, PS, 24, 24);
    p.disk_dir = dir;
    return pkv_kv_cache_create(p);
}

typedef struct {
    float k0[NT * DK], k1[NT * 16], v1[NT * 16];
} snap;

static void take(pkv_kv_cache *c, int32_t seq, snap *s) {
    memset(s, 0, sizeof *s);
    CHECK_OK(kt_read_seq(c, seq, 0, 0, s->k0));
    CHECK_OK(kt_read_seq(c, seq, 1, 0, s->k1));
    CHECK_OK(kt_read_seq(c, seq, 1, 1, s->v1));
}

static void same(const snap *a, const snap *b, int n, const char *what) {
    if (memcmp(a->k0, b->k0, (size_t)n * DK * 4) || memcmp(a->k1, b->k1, (size_t)n * 16 * 4) ||
        memcmp(a->v1, b->v1, (size_t)n * 16 * 4))
        TH_FAIL("%s: rows differ", what);
    th_checks++;
}

static void fill(pkv_kv_cache *c, int32_t seq, int n, const int32_t *tk, const int32_t *pos, uint64_t seed) {
    int32_t rows[NT];
    CHECK_OK(pkv_kv_append(c, seq, n, tk, pos, rows));
    for (int i = 0; i < n; i++) {
        float vals[DK];
        for (int k = 0; k < DK; k++) vals[k] = th_randf(&seed);
        CHECK_OK(kt_write_row(c, 0, 0, rows[i], vals));
        for (int v = 0; v < 2; v++) {
            for (int k = 0; k < 16; k++) vals[k] = th_randf(&seed);
            CHECK_OK(kt_write_row(c, 1, v, rows[i], vals));
        }
    }
}

static void run(kt_env *e, pkv_type t, const char *dir) {
    layout(e, t, true, DV);
    pkv_kv_cache *c = make(e, dir);
    REQUIRE_VOID(c);
    pkv_kv_layer_info li;
    CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), 0, &li));
    CHECK(li.v_in_k && li.rope_off == DV && li.v_page_bytes == 0);
    CHECK_INT(li.k_page_bytes, PS * pkv_type_row_bytes(t, DK));
    pkv_kv_shard_info sh;
    CHECK_OK(pkv_kv_shard(c, 0, 0, &sh));
    CHECK(sh.v == NULL && sh.v_row_bytes == 0);
    int32_t a, b;
    static snap s0, s1;
    CHECK_OK(pkv_kv_seq_create(c, 7, &a));
    fill(c, a, NT - 2, toks, NULL, 3); /* a partial last page */
    take(c, a, &s0);
    /* fork; the child's append copies the shared partial page: the parent keeps its rows */
    CHECK_OK(pkv_kv_fork(c, a, &b));
    fill(c, b, 1, toks + NT - 2, NULL, 9);
    take(c, a, &s1);
    same(&s0, &s1, NT - 2, "parent after the child's append");
    take(c, b, &s1);
    same(&s0, &s1, NT - 2, "child's shared rows");
    /* swap to the host pool and back */
    CHECK_OK(pkv_kv_swap_out(c, a));
    CHECK_OK(pkv_kv_swap_in(c, a));
    take(c, a, &s1);
    same(&s0, &s1, NT - 2, "swap round trip");
    /* save and load */
    const char *path = th_tmp("kv-mla.kv");
    int32_t l;
    CHECK_OK(pkv_kv_seq_save(c, a, path));
    CHECK_OK(pkv_kv_seq_load(c, path, 7, &l));
    take(c, l, &s1);
    same(&s0, &s1, NT - 2, "save/load");
    /* a prefix match in memory: the published full pages */
    int32_t m;
    int64_t got = 0;
    CHECK_OK(pkv_kv_seq_create(c, 7, &m));
    CHECK_OK(pkv_kv_prefix_match(c, m, toks, NULL, NT - 2, &got));
    CHECK_INT(got, (NT - 2) / PS * PS);
    take(c, m, &s1);
    same(&s0, &s1, (int)got, "prefix match");
    /* a shift: the latent moves as it is, the rotary tail turns back by 5 */
    CHECK_OK(pkv_kv_shift(c, l, 3, 5, -5));
    CHECK_OK(kt_read_seq(c, l, 0, 0, s1.k0));
    double worst = 0;
    for (int i = 3; i < NT - 2 - 5; i++) {
        const float *was = s0.k0 + (size_t)(i + 5) * DK, *now = s1.k0 + (size_t)i * DK;
        if (memcmp(was, now, DV * 4)) TH_FAIL("shift: the latent of token %d changed", i);
        double r[ROT];
        for (int k = 0; k < ROT; k++) r[k] = was[DV + k];
        kt_rope_ref(r, ROT, ROT, false, 10000.0, 1.0, -5);
        for (int k = 0; k < ROT; k++) worst = fmax(worst, fabs(r[k] - now[DV + k]));
    }
    fprintf(stderr, "%s: shift, worst |k_pe - ref| %.2e\n", pkv_type_name(t), worst);
    CHECK(worst > 0 && worst <= (t == PKV_TYPE_F16 ? 2e-3 : 3e-2));
    const int32_t held[] = {a, b, l, m};
    for (int i = 0; i < 4; i++) CHECK_OK(pkv_kv_seq_free(c, held[i]));
    CHECK_OK(pkv_kv_disk_flush(c));
    pkv_kv_cache_free(c);
    /* the disk tier: another cache on the directory reads the pages back */
    c = make(e, dir);
    REQUIRE_VOID(c);
    CHECK_OK(pkv_kv_seq_create(c, 7, &m));
    CHECK_OK(pkv_kv_prefix_match(c, m, toks, NULL, NT - 2, &got));
    CHECK_INT(got, (NT - 2) / PS * PS);
    take(c, m, &s1);
    same(&s0, &s1, (int)got, "prefix match from disk");
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    CHECK(st.disk_hit_pages == (uint64_t)(got / PS));
    pkv_kv_cache_free(c);
    unlink(path);
}

static uint64_t fingerprint(kt_env *e, bool v_in_k, int rope_off) {
    layout(e, PKV_TYPE_F16, v_in_k, rope_off);
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, PS, 8, 0));
    uint64_t fp = c ? pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c)) : 0;
    CHECK(c != NULL);
    pkv_kv_cache_free(c);
    return fp;
}

static void refused(kt_env *e, pkv_kv_layer_desc d, const char *expect) {
    layout(e, PKV_TYPE_Q8_0, true, DV);
    e->layers[0] = d;
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, PS, 8, 0));
    CHECK(c == NULL);
    CHECK_MSG(expect);
    pkv_kv_cache_free(c);
}

int main(void) {
    kt_env e;
    if (!kt_open(&e)) return th_skip("no cpu devices");
    for (int i = 0; i < NT; i++) toks[i] = (i * 7 + 1) % 50;
    int64_t live0 = pkv_alloc_live();
    char dir[512];
    for (int k = 0; k < 2; k++) {
        snprintf(dir, sizeof dir, "%s", th_tmp(k ? "kv-mla-disk-q8" : "kv-mla-disk-f16"));
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) TH_FAIL("%s", cmd);
        run(&e, k ? PKV_TYPE_Q8_0 : PKV_TYPE_F16, dir);
        if (system(cmd) != 0) TH_FAIL("%s", cmd);
    }
    const uint64_t f_mla = fingerprint(&e, true, DV), f_plain = fingerprint(&e, false, 0),
                   f_off = fingerprint(&e, true, 0);
    CHECK(f_mla != f_plain && f_mla != f_off && f_off != f_plain);
    const pkv_kv_layer_desc d = {1, DK, DV, PKV_TYPE_Q8_0, PKV_TYPE_Q8_0, 0, NULL, 0, 0, 0, 0, 0, {0}, ROT, 0, false,
                                 true, DV};
    pkv_kv_layer_desc x = d;
    x.n_kv_heads = 2;
    refused(&e, x, "V read from K (v_in_k) needs 1 KV head (got 2)");
    x = d;
    x.head_dim_v = 100;
    refused(&e, x, "head_dim_v 100 <= head_dim_k 96");
    x = d;
    x.rope_off = 48;
    refused(&e, x, "rope_off 48 must be >= 0 with rope_off + n_rot (32) <= head_dim_k 96, a multiple of 32");
    x = d;
    x.rope_off = 80;
    x.dtype_k = PKV_TYPE_F16;
    refused(&e, x, "rope_off 80 must be >= 0 with rope_off + n_rot (32) <= head_dim_k 96");
    CHECK_INT(pkv_alloc_live(), live0);
    kt_close(&e);
    return th_done();
}
