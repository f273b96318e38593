// labels: kv vulkan
/* Quantized KV pages (q8_0, q4_0) through the cache, on cpu and on vulkan:0
 * (lavapipe; that half is skipped with a note when no Vulkan device opens):
 *  - shift: every re-rotation of a quantized K (dequantize, rotate, quantize on
 *    the storage device) stays within the bound docs/kv-cache.md states, checked
 *    step by step against a double-precision rotation of what the page held before
 *    the step: per element |err| <= 0.57 * amax / 127 for q8_0 and 1.01 * amax / 8
 *    for q4_0 (amax: the largest |value| of the element's 32-block after the
 *    rotation); over several shifts the drift from rotating the original by the
 *    total stays within the sum of the steps' bounds; V and the positions before
 *    the shifted range are bit-identical;
 *  - swap out / in and save / load are bit-identical (raw page bytes compared),
 *    also loading into a cache sharded over two devices;
 *  - loading a file into a cache of other K/V types is PKV_ERR_FORMAT naming
 *    both types, and changes nothing;
 *  - a head size that is not a multiple of 32 is refused naming the layer. */
#include "kv-testlib.h"

#define NT 37
#define DK0 64
#define DK1 32
#define DV 32
#define NROT 32

typedef struct lay {
    int heads, dk, dv;
    pkv_type tk, tv;
} lay;
/* layer 0: 2 heads, K q8_0 64, V f16 32; layer 1: 1 head, K q4_0 32, V q8_0 32 */
static const lay g_lay[2] = {{2, DK0, DV, PKV_TYPE_Q8_0, PKV_TYPE_F16}, {1, DK1, DV, PKV_TYPE_Q4_0, PKV_TYPE_Q8_0}};

static pkv_kv_cache *make(pkv_device *a, pkv_device *b, bool neox, pkv_kv_shard_desc sh[2][2]) {
    pkv_kv_layer_desc L[2];
    for (int il = 0; il < 2; il++) {
        L[il] = (pkv_kv_layer_desc){g_lay[il].heads, g_lay[il].dk, g_lay[il].dv, g_lay[il].tk, g_lay[il].tv, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0};
        if (b && g_lay[il].heads == 2) { /* heads split over the two devices */
            sh[il][0] = (pkv_kv_shard_desc){a, a, 0, 1};
            sh[il][1] = (pkv_kv_shard_desc){b, b, 1, 1};
            L[il].n_shards = 2;
            L[il].shards = sh[il];
        }
    }
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = 2;
    p.layers = L;
    p.device = b ? b : a;
    p.page_size = 8;
    p.n_pages = 24;
    p.host_pages = 12;
    p.rope_n_rot = NROT;
    p.rope_neox = neox;
    return pkv_kv_cache_create(p);
}

static int dim(int il, int v) { return g_lay[il].heads * (v ? g_lay[il].dv : g_lay[il].dk); }

/* The per-element bound of one re-rotation, for a block whose rotated values
 * (exact) have largest magnitude amax; 1e-6 covers the f32 rotation itself. */
static double step_bound(pkv_type t, double amax) {
    return (t == PKV_TYPE_Q8_0 ? 0.57 * amax / 127.0 : 1.01 * amax / 8.0) + 1e-6;
}

static void test_shift(pkv_device *dev, bool neox) {
    pkv_kv_shard_desc sh[2][2];
    pkv_kv_cache *c = make(dev, NULL, neox, sh);
    if (!c) {
        TH_FAIL("%s: %s", pkv_device_name(dev), pkv_errmsg());
        return;
    }
    uint64_t rng = neox ? 21 : 22;
    int32_t seq, rows[NT], pos[NT];
    for (int t = 0; t < NT; t++) pos[t] = 1000 + t;
    CHECK_OK(pkv_kv_seq_create(c, 0, &seq));
    CHECK_OK(pkv_kv_append(c, seq, NT, NULL, pos, rows));
    static float k0[2][NT * DK0 * 2], v0[2][NT * DK0 * 2], prev[NT * DK0 * 2], cur[NT * DK0 * 2];
    static double drift_bound[2][NT * DK0 * 2];
    memset(drift_bound, 0, sizeof drift_bound);
    for (int t = 0; t < NT; t++)
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++) {
                float x[128];
                for (int i = 0; i < dim(il, v); i++) x[i] = th_randf(&rng);
                CHECK_OK(kt_write_row(c, il, v, rows[t], x));
            }
    for (int il = 0; il < 2; il++) {
        CHECK_OK(kt_read_seq(c, seq, il, 0, k0[il])); /* what the pages hold: the quantized K */
        CHECK_OK(kt_read_seq(c, seq, il, 1, v0[il]));
    }
    /* four re-positionings of tokens [start, NT); the tokens before stay put */
    const int start = 5;
    const int32_t deltas[4] = {-7, 13, -300, 5};
    int32_t total = 0;
    double worst_ratio[2] = {0, 0};
    for (int s = 0; s < 4; s++) {
        float before[2][NT * DK0 * 2];
        for (int il = 0; il < 2; il++) CHECK_OK(kt_read_seq(c, seq, il, 0, before[il]));
        CHECK_OK(pkv_kv_shift(c, seq, start, 0, deltas[s]));
        total += deltas[s];
        for (int il = 0; il < 2; il++) {
            const int d = g_lay[il].dk, kd = dim(il, 0);
            memcpy(prev, before[il], sizeof prev);
            CHECK_OK(kt_read_seq(c, seq, il, 0, cur));
            CHECK_MEM(cur, prev, (size_t)start * kd * 4);
            for (int t = start; t < NT; t++)
                for (int h = 0; h < g_lay[il].heads; h++) {
                    double want[DK0], orig[DK0];
                    for (int i = 0; i < d; i++) {
                        want[i] = prev[(size_t)t * kd + h * d + i];
                        orig[i] = k0[il][(size_t)t * kd + h * d + i];
                    }
                    kt_rope_ref(want, d, NROT, neox, 10000.0, 1.0, deltas[s]);
                    kt_rope_ref(orig, d, NROT, neox, 10000.0, 1.0, total);
                    for (int b = 0; b < d / 32; b++) {
                        double amax = 0;
                        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(want[32 * b + i]));
                        const double bound = step_bound(g_lay[il].tk, amax);
                        for (int i = 32 * b; i < 32 * b + 32; i++) {
                            const size_t e = (size_t)t * kd + h * d + i;
                            const double err = fabs((double)cur[e] - want[i]);
                            worst_ratio[il] = fmax(worst_ratio[il], err / bound);
                            drift_bound[il][e] += bound;
                            if (!(err <= bound) || !(fabs((double)cur[e] - orig[i]) <= drift_bound[il][e])) {
                                TH_FAIL("%s layer %d shift %d token %d head %d K[%d]: %.6g, step ref %.6g (bound %.3g), "
                                        "rotated original %.6g (bound %.3g)",
                                        pkv_device_name(dev), il, s, t, h, i, cur[e], want[i], bound, orig[i],
                                        drift_bound[il][e]);
                                t = NT;
                                h = 2;
                                b = d;
                                break;
                            }
                        }
                    }
                }
            CHECK_OK(kt_read_seq(c, seq, il, 1, cur));
            CHECK_MEM(cur, v0[il], (size_t)NT * dim(il, 1) * 4);
        }
    }
    int32_t npos[NT];
    CHECK_OK(pkv_kv_seq_tokens(c, seq, 0, NT, NULL, npos));
    for (int t = 0; t < NT; t++) CHECK_INT(npos[t], 1000 + t + (t >= start ? total : 0));
    fprintf(stderr, "%s %s: worst re-rotation error / bound: q8_0 %.3f, q4_0 %.3f\n", pkv_device_name(dev),
            neox ? "neox" : "normal", worst_ratio[0], worst_ratio[1]);
    CHECK(worst_ratio[0] > 0 && worst_ratio[1] > 0); /* something was rotated and compared */
    pkv_kv_cache_free(c);
}

/* Raw bytes of every page array of sequence seq: [layer][K/V] rows in token order. */
static size_t raw_bytes(pkv_kv_cache *c, int32_t seq, uint8_t *out) {
    pkv_kv_block_table bt;
    if (pkv_kv_block_table_get(c, 1, &seq, false, &bt)) return 0;
    size_t n = 0;
    for (int il = 0; il < 2; il++) {
        pkv_kv_layer_info li;
        pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li);
        for (int v = 0; v < 2; v++)
            for (int64_t t = 0; t < bt.seq_len[0]; t++)
                for (int s = 0; s < li.n_shards; s++) {
                    pkv_kv_shard_info si;
                    pkv_kv_shard(c, il, s, &si);
                    const size_t rb = v ? si.v_row_bytes : si.k_row_bytes;
                    const int32_t row = bt.pages[t / 8] * 8 + (int32_t)(t % 8);
                    if (v ? pkv_buffer_read(si.v, si.v_off + (size_t)row * rb, out + n, rb)
                          : pkv_buffer_read(si.k, si.k_off + (size_t)row * rb, out + n, rb))
                        return 0;
                    n += rb;
                }
    }
    return n;
}

static void test_swap_save(pkv_device *dev, pkv_device *other) {
    pkv_kv_shard_desc sh[2][2];
    pkv_kv_cache *c = make(dev, NULL, true, sh);
    if (!c) {
        TH_FAIL("%s: %s", pkv_device_name(dev), pkv_errmsg());
        return;
    }
    uint64_t rng = 5;
    int32_t seq, rows[NT], tok[NT];
    for (int t = 0; t < NT; t++) tok[t] = t * 3;
    CHECK_OK(pkv_kv_seq_create(c, 9, &seq));
    CHECK_OK(pkv_kv_append(c, seq, NT, tok, NULL, rows));
    for (int t = 0; t < NT; t++)
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++) {
                float x[128];
                for (int i = 0; i < dim(il, v); i++) x[i] = th_randf(&rng) * 3.0f;
                CHECK_OK(kt_write_row(c, il, v, rows[t], x));
            }
    static uint8_t a[1 << 16], b[1 << 16];
    const size_t n = raw_bytes(c, seq, a);
    CHECK(n > 0);
    CHECK_OK(pkv_kv_swap_out(c, seq));
    CHECK_OK(pkv_kv_swap_in(c, seq));
    CHECK_INT(raw_bytes(c, seq, b), n);
    CHECK_MEM(a, b, n);
    const char *path = th_tmp("kvq-seq.bin");
    CHECK_OK(pkv_kv_seq_save(c, seq, path));
    /* into another cache of the same types, sharded over dev and `other` */
    pkv_kv_cache *c2 = make(dev, other, true, sh);
    if (!c2) {
        TH_FAIL("%s", pkv_errmsg());
    } else {
        int32_t s2;
        CHECK_OK(pkv_kv_seq_load(c2, path, 0, &s2));
        CHECK_INT(raw_bytes(c2, s2, b), n);
        CHECK_MEM(a, b, n);
        pkv_kv_cache_free(c2);
    }
    /* into caches of other types: a clear error, nothing changed */
    static const struct {
        int layer;
        pkv_type tk, tv;
        const char *msg;
    } cases[] = {
        {0, PKV_TYPE_Q4_0, PKV_TYPE_F16, "layer 0 stores K q8_0, V f16 in the file, K q4_0, V f16 in the cache"},
        {1, PKV_TYPE_Q4_0, PKV_TYPE_Q4_0, "layer 1 stores K q4_0, V q8_0 in the file, K q4_0, V q4_0 in the cache"},
        {0, PKV_TYPE_F16, PKV_TYPE_F16, "layer 0 stores K q8_0, V f16 in the file, K f16, V f16 in the cache"},
    };
    for (size_t k = 0; k < PKV_ARRAY_LEN(cases); k++) {
        pkv_kv_layer_desc L[2];
        for (int il = 0; il < 2; il++)
            L[il] = (pkv_kv_layer_desc){g_lay[il].heads, g_lay[il].dk, g_lay[il].dv, g_lay[il].tk, g_lay[il].tv, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0};
        L[cases[k].layer].dtype_k = cases[k].tk;
        L[cases[k].layer].dtype_v = cases[k].tv;
        pkv_kv_params p = pkv_kv_default_params();
        p.n_layers = 2;
        p.layers = L;
        p.device = dev;
        p.page_size = 8;
        p.n_pages = 24;
        p.rope_n_rot = NROT;
        pkv_kv_cache *c3 = pkv_kv_cache_create(p);
        if (!c3) {
            TH_FAIL("case %zu: %s", k, pkv_errmsg());
            continue;
        }
        int32_t s3 = -5;
        pkv_kv_stats st0, st1;
        pkv_kv_stats_get(c3, &st0);
        CHECK_STATUS(pkv_kv_seq_load(c3, path, 0, &s3), PKV_ERR_FORMAT);
        CHECK_MSG(cases[k].msg);
        CHECK_INT(s3, -5);
        pkv_kv_stats_get(c3, &st1);
        CHECK_INT(st1.n_seqs, st0.n_seqs);
        CHECK_INT(st1.pages_used, 0);
        pkv_kv_cache_free(c3);
    }
    remove(path);
    pkv_kv_cache_free(c);
}

static void test_layout_errors(pkv_device *dev) {
    pkv_kv_layer_desc L[3] = {{2, 64, 64, PKV_TYPE_Q8_0, PKV_TYPE_Q8_0, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0},
                              {2, 64, 64, PKV_TYPE_F16, PKV_TYPE_F16, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0},
                              {2, 80, 64, PKV_TYPE_Q4_0, PKV_TYPE_F16, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0}};
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = 3;
    p.layers = L;
    p.device = dev;
    p.n_pages = 4;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("KV layout layer 2: K head size 80 is not a multiple of 32, the block of q4_0 pages: use f16 or f32 for K");
    L[2].dtype_k = PKV_TYPE_F16; /* f16 K, q4_0 V of 64: fine */
    L[2].dtype_v = PKV_TYPE_Q4_0;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    CHECK(c != NULL);
    if (!c) return;
    /* page bytes follow each layer's types (I4): 16 tokens x 2 heads x row bytes */
    pkv_kv_layer_info li;
    CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), 0, &li));
    CHECK_INT(li.dtype_k, PKV_TYPE_Q8_0);
    CHECK_INT(li.k_page_bytes, 16 * 2 * 68);
    CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), 2, &li));
    CHECK_INT(li.k_page_bytes, 16 * 2 * 80 * 2);
    CHECK_INT(li.v_page_bytes, 16 * 2 * 36);
    CHECK_INT(li.dtype_v, PKV_TYPE_Q4_0);
    pkv_kv_cache_free(c);
    /* a layer's own rotary width and turning pairs (Gemma 4): bounded by its head size */
    L[1].rope_n_rot = 80;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("KV layout layer 1: rope_n_rot 80 must be even and <= head_dim_k 64");
    L[1].rope_n_rot = 32;
    L[1].rope_n_pairs = 17;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("KV layout layer 1: rope_n_pairs 17 must be in [0, 16] (rope_n_rot / 2) and 0 with YaRN");
    L[1].rope_n_pairs = 4;
    p.rope_yarn_ext_factor = 1.0f;
    p.rope_yarn_n_ctx_orig = 256;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("rope_n_pairs 4 must be in [0, 16] (rope_n_rot / 2) and 0 with YaRN");
    p.rope_yarn_ext_factor = 0;
    c = pkv_kv_cache_create(p);
    CHECK(c != NULL);
    pkv_kv_cache_free(c);
}

int main(void) {
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = 1;
    const char *names[2] = {"cpu", "vulkan:0"};
    pkv_device *cpu1 = pkv_device_open("cpu:1", dp);
    if (!cpu1) return th_skip("cannot open cpu:1");
    int64_t live0 = pkv_alloc_live();
    for (int i = 0; i < 2; i++) {
        pkv_device *dev = pkv_device_open(names[i], dp);
        if (!dev) {
            fprintf(stderr, "note: %s does not open (%s): its half is skipped\n", names[i], pkv_errmsg());
            continue;
        }
        test_shift(dev, false);
        test_shift(dev, true);
        test_swap_save(dev, cpu1);
        if (i == 0) test_layout_errors(dev);
        pkv_device_close(dev);
    }
    CHECK_INT(pkv_alloc_live(), live0);
    pkv_device_close(cpu1);
    return th_done();
}
