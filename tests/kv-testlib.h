/* Shared helpers of the KV tests: a small two-device sharded layout, writing
 * token rows into every (layer, shard) and reading a sequence's K/V back through
 * real device reads, gathered to [token][all heads][dim] floats per layer. */
#ifndef PKV_KV_TESTLIB_H
#define PKV_KV_TESTLIB_H

#include "testhelp.h"
#include "kv/kv-impl.h"
#include "base/quant.h"

#define KT_MAX_LAYERS 4

typedef struct kt_env {
    pkv_device *cpu, *cpu1;
    pkv_kv_layer_desc layers[KT_MAX_LAYERS];
    pkv_kv_shard_desc shards[KT_MAX_LAYERS][4];
    int n_layers;
} kt_env;

/* Layer 0: 3 heads, K 8 / V 4, f32, heads 0-1 on cpu, head 2 on cpu:1.
 * Layer 1: 2 heads, K 4 / V 6, f16, head 0 on cpu:1, head 1 on cpu. */
static inline void kt_layout_sharded(kt_env *e) {
    e->n_layers = 2;
    e->layers[0] = (pkv_kv_layer_desc){3, 8, 4, PKV_TYPE_F32, PKV_TYPE_F32, 2, e->shards[0], 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0, 0};
    e->shards[0][0] = (pkv_kv_shard_desc){e->cpu, e->cpu, 0, 2};
    e->shards[0][1] = (pkv_kv_shard_desc){e->cpu1, e->cpu1, 2, 1};
    e->layers[1] = (pkv_kv_layer_desc){2, 4, 6, PKV_TYPE_F16, PKV_TYPE_F16, 2, e->shards[1], 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0, 0};
    e->shards[1][0] = (pkv_kv_shard_desc){e->cpu1, NULL, 0, 1};
    e->shards[1][1] = (pkv_kv_shard_desc){e->cpu, e->cpu, 1, 1};
}

/* Open the two devices the sharded layout uses ("cpu" and "cpu:1" by default);
 * the same name twice means one device holds every shard. */
static inline int kt_open_names(kt_env *e, const char *a, const char *b) {
    memset(e, 0, sizeof *e);
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = 1;
    e->cpu = pkv_device_open(a, dp);
    e->cpu1 = strcmp(a, b) ? pkv_device_open(b, dp) : e->cpu;
    return e->cpu && e->cpu1;
}

static inline int kt_open(kt_env *e) { return kt_open_names(e, "cpu", "cpu:1"); }

/* Two sharded layouts of the same geometry, e's shards on cpu and cpu:1, e2's each
 * on the other device (a cache of e2 reads what one of e wrote through another
 * split). 0 when the devices do not open. */
static inline int kt_open_twins(kt_env *e, kt_env *e2) {
    if (!kt_open(e) || !kt_open_names(e2, "cpu:1", "cpu")) return 0;
    kt_layout_sharded(e);
    kt_layout_sharded(e2);
    return 1;
}

static inline void kt_close(kt_env *e) {
    if (e->cpu1 != e->cpu) pkv_device_close(e->cpu1);
    pkv_device_close(e->cpu);
}

static inline pkv_kv_params kt_params(kt_env *e, int page_size, int64_t n_pages, int64_t host_pages) {
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = e->n_layers;
    p.layers = e->layers;
    p.device = e->cpu;
    p.page_size = page_size;
    p.n_pages = n_pages;
    p.host_pages = host_pages;
    p.rope_n_rot = 4;
    return p;
}

static inline int kt_dim(const pkv_kv_cache *c, int il, int v) {
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li);
    return li.n_kv_heads * (v ? li.head_dim_v : li.head_dim_k);
}

static inline float kt_round(pkv_type t, float x) { return t == PKV_TYPE_F16 ? pkv_f16_to_f32(pkv_f32_to_f16(x)) : x; }

/* n heads of d floats <-> bytes of KV type t (rows of pkv_type_row_bytes(t, d)). */
static inline void kt_encode(pkv_type t, const float *x, int n, int d, uint8_t *out) {
    const size_t hb = pkv_type_row_bytes(t, (size_t)d);
    for (int h = 0; h < n; h++) pkv_quantize_row(t, x + (size_t)h * d, out + (size_t)h * hb, d);
}
static inline void kt_decode(pkv_type t, const uint8_t *in, int n, int d, float *x) {
    const size_t hb = pkv_type_row_bytes(t, (size_t)d);
    for (int h = 0; h < n; h++) pkv_dequantize_row(t, in + (size_t)h * hb, x + (size_t)h * d, d);
}

/* Write one token's full K or V row (vals: [n_kv_heads][dim] floats) of layer il
 * at cache row `row`, split over the shards. */
static inline pkv_status kt_write_row(pkv_kv_cache *c, int il, int v, int32_t row, const float *vals) {
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li);
    int d = v ? li.head_dim_v : li.head_dim_k;
    pkv_type t = v ? li.dtype_v : li.dtype_k;
    for (int s = 0; s < li.n_shards; s++) {
        pkv_kv_shard_info si;
        pkv_kv_shard(c, il, s, &si);
        uint8_t buf[4096];
        size_t bytes = (size_t)si.n_heads * pkv_type_row_bytes(t, (size_t)d);
        kt_encode(t, vals + (size_t)si.head_begin * d, si.n_heads, d, buf);
        pkv_status st = v ? pkv_buffer_write(si.v, si.v_off + (size_t)row * si.v_row_bytes, buf, bytes)
                          : pkv_buffer_write(si.k, si.k_off + (size_t)row * si.k_row_bytes, buf, bytes);
        if (st) return st;
    }
    return PKV_OK;
}

/* Append tokens tk[0..n) (rows at most 256) to seq and write seeded random K and V
 * rows for them into every layer. */
static inline void kt_fill(pkv_kv_cache *c, int32_t seq, int n, const int32_t *tk, uint64_t seed) {
    int32_t rows[256];
    pkv_status st = n <= 256 ? pkv_kv_append(c, seq, n, tk, NULL, rows) : PKV_ERR_INVALID;
    CHECK_OK(st);
    const int nl = pkv_kv_layout_n_layers(pkv_kv_cache_layout(c));
    for (int i = 0; i < n && !st; i++)
        for (int il = 0; il < nl; il++)
            for (int v = 0; v < 2; v++) {
                float vals[64];
                for (int k = 0; k < kt_dim(c, il, v); k++) vals[k] = th_randf(&seed);
                CHECK_OK(kt_write_row(c, il, v, rows[i], vals));
            }
}

/* Read the K (v = 0) or V (v = 1) of layer il for tokens [0, n) of seq into
 * out[n][n_kv_heads * dim], through the block table and device reads. */
static inline pkv_status kt_read_seq(pkv_kv_cache *c, int32_t seq, int il, int v, float *out) {
    pkv_kv_block_table bt;
    pkv_status st = pkv_kv_block_table_get(c, 1, &seq, false, &bt);
    if (st) return st;
    int ps = pkv_kv_layout_page_size(pkv_kv_cache_layout(c));
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li);
    int d = v ? li.head_dim_v : li.head_dim_k, H = li.n_kv_heads;
    pkv_type ty = v ? li.dtype_v : li.dtype_k;
    int64_t n = bt.seq_len[0];
    for (int s = 0; s < li.n_shards; s++) {
        pkv_kv_shard_info si;
        pkv_kv_shard(c, il, s, &si);
        size_t rb = v ? si.v_row_bytes : si.k_row_bytes;
        uint8_t buf[4096];
        for (int64_t t = 0; t < n; t++) {
            int32_t row = bt.pages[t / ps] * ps + (int32_t)(t % ps);
            st = v ? pkv_buffer_read(si.v, si.v_off + (size_t)row * rb, buf, rb)
                   : pkv_buffer_read(si.k, si.k_off + (size_t)row * rb, buf, rb);
            if (st) return st;
            kt_decode(ty, buf, si.n_heads, d, out + (size_t)t * H * d + (size_t)si.head_begin * d);
        }
    }
    return PKV_OK;
}

/* Double-precision RoPE of one head vector x[head_dim] by `pos` (reference). */
static inline void kt_rope_ref(double *x, int head_dim, int n_rot, bool neox, double base, double scale, double pos) {
    (void)head_dim;
    for (int i = 0; i < n_rot / 2; i++) {
        double theta = pos * scale * pow(base, -2.0 * i / n_rot);
        int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        double xa = x[a], xb = x[b];
        x[a] = xa * cos(theta) - xb * sin(theta);
        x[b] = xa * sin(theta) + xb * cos(theta);
    }
}

#endif
