// labels: vulkan device timeout=600
/* The Vulkan backend on vulkan:0: discovery, transfers at random unaligned offsets
 * against a host shadow copy (direct-mapped path and PKV_VK_FORCE_STAGING=1),
 * cross-device copies with the CPU, queue ordering, and every kernel against a
 * plain-C reference. Skipped (77) when no Vulkan device can be opened. */
#include "testhelp.h"

#include "base/base.h"
#include "base/quant.h"
#include "device/cpu/ref.h"
#include "device/device.h"
#include "device/vulkan/vulkan-impl.h"

#include <stdlib.h>

/* ------------------------------------------------------------- transfers */

typedef struct {
    pkv_buffer *buf[2];
    uint8_t *shadow[2];
    size_t size[2];
} tx_state;

/* A random region of a buffer of `size` bytes, with the edge cases weighted in. */
static void rand_region(uint64_t *rng, size_t size, size_t *off, size_t *n) {
    switch (th_rand(rng) % 8) {
    case 0: *off = th_rand(rng) % (size + 1); *n = 0; return;
    case 1: *off = th_rand(rng) % size; *n = 1; return;
    case 2: *off = size - 1; *n = 1; return;
    case 3: *off = 0; *n = size; return;
    case 4: *off = th_rand(rng) % size; *n = size - *off; return; /* to the end */
    default: break;
    }
    *off = th_rand(rng) % size;
    size_t max = size - *off;
    size_t cap = th_rand(rng) % 2 ? 16 : max;
    *n = th_rand(rng) % (PKV_MIN(cap, max) + 1);
}

static int transfer_suite(pkv_device *dev, uint64_t seed, int iters) {
    int fails0 = th_failures;
    uint64_t rng = seed;
    tx_state st;
    st.size[0] = 4099;
    st.size[1] = 1 << 13;
    for (int i = 0; i < 2; i++) {
        st.buf[i] = pkv_buffer_alloc(dev, st.size[i]);
        st.shadow[i] = malloc(st.size[i]);
        if (!st.buf[i]) {
            TH_FAIL("alloc: %s", pkv_errmsg());
            return 1;
        }
        for (size_t k = 0; k < st.size[i]; k++) st.shadow[i][k] = (uint8_t)th_rand(&rng);
        CHECK_OK(pkv_buffer_write(st.buf[i], 0, st.shadow[i], st.size[i]));
    }
    uint8_t *tmp = malloc(1 << 13);
    long counts[6] = {0};
    for (int it = 0; it < iters && th_failures == fails0; it++) {
        int b = (int)(th_rand(&rng) % 2), op = (int)(th_rand(&rng) % 6);
        size_t off, n;
        rand_region(&rng, st.size[b], &off, &n);
        counts[op]++;
        switch (op) {
        case 0: /* write */
            for (size_t k = 0; k < n; k++) tmp[k] = (uint8_t)th_rand(&rng);
            CHECK_OK(pkv_buffer_write(st.buf[b], off, tmp, n));
            memcpy(st.shadow[b] + off, tmp, n);
            memset(tmp, 0xEE, n); /* the device must have copied it already */
            break;
        case 1: { /* read */
            memset(tmp, 0xCD, n);
            CHECK_OK(pkv_buffer_read(st.buf[b], off, tmp, n));
            if (memcmp(tmp, st.shadow[b] + off, n) != 0) {
                size_t k = 0;
                while (tmp[k] == st.shadow[b][off + k]) k++;
                TH_FAIL("iter %d: read buf%d [%zu, +%zu): byte %zu is %d, want %d", it, b, off, n, off + k,
                        tmp[k], st.shadow[b][off + k]);
            }
            break;
        }
        case 2: { /* fill */
            uint8_t v = (uint8_t)th_rand(&rng);
            CHECK_OK(pkv_buffer_fill(st.buf[b], off, n, v));
            memset(st.shadow[b] + off, v, n);
            break;
        }
        case 3: { /* copy to the other buffer */
            int d = 1 - b;
            if (n > st.size[d]) n = st.size[d];
            size_t doff = th_rand(&rng) % (st.size[d] - n + 1);
            CHECK_OK(pkv_buffer_copy(st.buf[b], off, st.buf[d], doff, n));
            memcpy(st.shadow[d] + doff, st.shadow[b] + off, n);
            break;
        }
        case 4: { /* copy within one buffer, non-overlapping */
            if (n > st.size[b] / 2) n = st.size[b] / 2;
            size_t a = th_rand(&rng) % (st.size[b] - 2 * n + 1);
            size_t gap = th_rand(&rng) % (st.size[b] - 2 * n - a + 1);
            size_t s0 = a, d0 = a + n + gap;
            if (th_rand(&rng) % 2) { size_t t = s0; s0 = d0; d0 = t; }
            CHECK_OK(pkv_buffer_copy(st.buf[b], s0, st.buf[b], d0, n));
            memmove(st.shadow[b] + d0, st.shadow[b] + s0, n);
            break;
        }
        default: { /* copy_regions: disjoint destination slots, random sources */
            int d = (int)(th_rand(&rng) % 2);
            pkv_region r[24];
            int nr = (int)(th_rand(&rng) % 24) + 1;
            size_t slot = st.size[d] / (size_t)nr;
            if (b == d) slot = st.size[d] / (size_t)(2 * nr); /* sources in the upper half */
            size_t maxn = PKV_MIN(slot, st.size[b] / 2);
            uint8_t *snap = malloc(st.size[b]);
            memcpy(snap, st.shadow[b], st.size[b]);
            for (int i = 0; i < nr; i++) {
                size_t sz = th_rand(&rng) % (maxn + 1);
                r[i].size = sz;
                r[i].dst_off = (size_t)i * slot + th_rand(&rng) % (slot - sz + 1);
                if (b == d) {
                    size_t half = st.size[b] / 2 + (st.size[b] & 1);
                    r[i].src_off = half + th_rand(&rng) % (st.size[b] - half - sz + 1);
                } else {
                    r[i].src_off = th_rand(&rng) % (st.size[b] - sz + 1);
                }
            }
            CHECK_OK(pkv_buffer_copy_regions(st.buf[b], st.buf[d], r, (size_t)nr));
            for (int i = 0; i < nr; i++) memcpy(st.shadow[d] + r[i].dst_off, snap + r[i].src_off, r[i].size);
            free(snap);
            break;
        }
        }
    }
    for (int i = 0; i < 2; i++) {
        uint8_t *all = malloc(st.size[i]);
        CHECK_OK(pkv_buffer_read(st.buf[i], 0, all, st.size[i]));
        CHECK_MEM(all, st.shadow[i], st.size[i]);
        free(all);
        pkv_buffer_free(st.buf[i]);
        free(st.shadow[i]);
    }
    free(tmp);
    fprintf(stderr, "  %s: %d random transfers (w %ld r %ld f %ld c %ld c-in %ld regions %ld)\n",
            pkv_device_get_caps(dev)->description, iters, counts[0], counts[1], counts[2], counts[3], counts[4],
            counts[5]);
    return th_failures != fails0;
}

/* A transfer larger than the staging buffer's largest size goes in chunks. */
static void big_transfer(pkv_device *dev) {
    size_t n = ((size_t)65 << 20) + 3;
    pkv_buffer *b = pkv_buffer_alloc(dev, n + 8);
    CHECK(b != NULL);
    if (!b) return;
    uint8_t *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK_OK(pkv_buffer_fill(b, 0, 5, 0x11)); /* queue is busy: the write takes the staged path */
    CHECK_OK(pkv_buffer_write(b, 5, h, n));
    CHECK_OK(pkv_buffer_fill(b, n + 5, 3, 0x22));
    memset(back, 0, n);
    CHECK_OK(pkv_buffer_read(b, 5, back, n));
    CHECK_MEM(back, h, n);
    uint8_t edge[8];
    CHECK_OK(pkv_buffer_read(b, 0, edge, 5));
    CHECK(edge[0] == 0x11 && edge[4] == 0x11);
    CHECK_OK(pkv_buffer_read(b, n + 5, edge, 3));
    CHECK(edge[0] == 0x22 && edge[2] == 0x22);
    pkv_buffer_free(b);
    free(h);
    free(back);
}

/* Cross-device copies cpu <-> vulkan at unaligned offsets, through pkv_buffer_copy
 * and copy_regions. */
static void cross_device(pkv_device *vk) {
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    if (!cpu) {
        TH_FAIL("open cpu: %s", pkv_errmsg());
        return;
    }
    size_t n = 10007;
    pkv_buffer *c = pkv_buffer_alloc(cpu, n), *v = pkv_buffer_alloc(vk, n);
    uint8_t *h = malloc(n), *back = malloc(n);
    uint64_t rng = 42;
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)th_rand(&rng);
    CHECK_OK(pkv_buffer_write(c, 0, h, n));
    CHECK_OK(pkv_buffer_fill(v, 0, n, 0));
    CHECK_OK(pkv_buffer_copy(c, 3, v, 1, n - 7));
    CHECK_OK(pkv_buffer_read(v, 1, back, n - 7));
    CHECK_MEM(back, h + 3, n - 7);
    /* back to the CPU at another offset */
    CHECK_OK(pkv_buffer_fill(c, 0, n, 0));
    CHECK_OK(pkv_buffer_copy(v, 1, c, 5, n - 7));
    CHECK_OK(pkv_buffer_read(c, 5, back, n - 7));
    CHECK_MEM(back, h + 3, n - 7);
    pkv_region r[3] = {{0, 100, 17}, {999, 1, 3}, {5000, 6001, 4000}};
    CHECK_OK(pkv_buffer_write(c, 0, h, n));
    CHECK_OK(pkv_buffer_copy_regions(c, v, r, 3));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(pkv_buffer_read(v, r[i].dst_off, back, r[i].size));
        CHECK_MEM(back, h + r[i].src_off, r[i].size);
    }
    pkv_buffer_free(c);
    pkv_buffer_free(v);
    pkv_device_close(cpu);
    free(h);
    free(back);
}

/* ------------------------------------------------------------------ kernels */
/* Each kernel against a plain double-precision reference written here, on
 * random data, with arguments at nonzero (aligned) offsets, some beyond
 * minStorageBufferOffsetAlignment so the bound window starts inside the buffer. */

#define PAD 4100 /* offset of most arguments: not a multiple of 16, 64 or 256 */

static uint64_t krng = 7;

static void randv(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = th_randf(&krng) * scale;
}

/* A buffer holding `bytes` bytes of data at offset off, garbage around it. */
static pkv_buffer *up(pkv_device *d, size_t off, const void *data, size_t bytes) {
    pkv_buffer *b = pkv_buffer_alloc(d, off + bytes + 13);
    if (!b) return NULL;
    pkv_buffer_fill(b, 0, off + bytes + 13, 0xA5);
    if (data) pkv_buffer_write(b, off, data, bytes);
    return b;
}

static void down(pkv_buffer *b, size_t off, void *dst, size_t bytes) { CHECK_OK(pkv_buffer_read(b, off, dst, bytes)); }

/* NMSE check with a message naming the case. */
static void near(const char *what, const float *ref, const float *got, size_t n, double tol) {
    double e = th_nmse(ref, got, n);
    th_checks++;
    if (!(e <= tol)) {
        size_t worst = 0;
        for (size_t i = 0; i < n; i++)
            if (fabs(ref[i] - got[i]) > fabs(ref[worst] - got[worst])) worst = i;
        TH_FAIL("%s: nmse %.3g > %.3g (worst [%zu] ref %.7g got %.7g)", what, e, tol, worst, ref[worst], got[worst]);
    } else {
        fprintf(stderr, "  %-28s nmse %.2e (tol %.0e)\n", what, e, tol);
    }
}

/* Quantizers for test data (any valid bytes do: the reference dequantizes them). */
static void quant_row(pkv_type t, const float *x, uint8_t *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
        if (t == PKV_TYPE_Q8_0) {
            uint8_t *blk = out + b * 34;
            float d = amax / 127.0f;
            uint16_t h = pkv_f32_to_f16(d);
            memcpy(blk, &h, 2);
            for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)lrintf(d ? v[j] / d : 0);
        } else {
            uint8_t *blk = out + b * 18;
            float d = amax / 8.0f;
            uint16_t h = pkv_f32_to_f16(d);
            memcpy(blk, &h, 2);
            for (int j = 0; j < 16; j++) {
                int q0 = (int)lrintf(d ? v[j] / d : 0) + 8, q1 = (int)lrintf(d ? v[j + 16] / d : 0) + 8;
                q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
                q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
                blk[2 + j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
    }
}

static void make_weights(pkv_type t, const float *x, uint8_t *out, int64_t rows, int64_t cols) {
    size_t rb = pkv_type_row_bytes(t, (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + r * cols;
        uint8_t *o = out + r * rb;
        for (int64_t c = 0; c < cols; c++) {
            if (t == PKV_TYPE_F32) memcpy(o + c * 4, &v[c], 4);
            if (t == PKV_TYPE_F16 || t == PKV_TYPE_BF16) {
                uint16_t h = t == PKV_TYPE_F16 ? pkv_f32_to_f16(v[c]) : pkv_f32_to_bf16(v[c]);
                memcpy(o + c * 2, &h, 2);
            }
        }
        if (t == PKV_TYPE_Q8_0 || t == PKV_TYPE_Q4_0) quant_row(t, v, o, cols);
    }
}

static float deq(pkv_type t, const uint8_t *row, int64_t c) {
    uint16_t h;
    switch (t) {
    case PKV_TYPE_F32: { float f; memcpy(&f, row + c * 4, 4); return f; }
    case PKV_TYPE_F16: memcpy(&h, row + c * 2, 2); return pkv_f16_to_f32(h);
    case PKV_TYPE_BF16: memcpy(&h, row + c * 2, 2); return pkv_bf16_to_f32(h);
    case PKV_TYPE_Q8_0: {
        const uint8_t *b = row + (c / 32) * 34;
        memcpy(&h, b, 2);
        return pkv_f16_to_f32(h) * (float)(int8_t)b[2 + c % 32];
    }
    default: {
        const uint8_t *b = row + (c / 32) * 18;
        memcpy(&h, b, 2);
        int j = (int)(c % 32);
        int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        return pkv_f16_to_f32(h) * (float)(q - 8);
    }
    }
}

static void test_matmul_getrows(pkv_device *d, pkv_type t, int64_t n) {
    const int64_t rows = 37, cols = 96, vocab = rows;
    size_t rb = pkv_type_row_bytes(t, (size_t)cols);
    float *wf = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
    uint8_t *w = malloc(rb * rows);
    randv(wf, (size_t)(rows * cols), 1.0f);
    randv(x, (size_t)(n * cols), 1.0f);
    make_weights(t, wf, w, rows, cols);
    size_t woff = t == PKV_TYPE_F32 ? PAD : PAD + 2; /* 2-aligned is enough for 16-bit data */
    pkv_buffer *bw = up(d, woff, w, rb * rows), *bx = up(d, 8, x, sizeof(float) * n * cols),
               *by = up(d, PAD, NULL, sizeof(float) * n * rows);
    float *ref = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++) s += (double)deq(t, w + r * rb, c) * x[i * cols + c];
            ref[i * rows + r] = (float)s;
        }
    pkv_k_matmul_args ma = {pkv_tref_make(bw, woff), t, rows, cols, pkv_tref_make(bx, 8), pkv_tref_make(by, PAD), n};
    CHECK_OK(pkv_k_matmul(d, &ma));
    down(by, PAD, got, sizeof(float) * n * rows);
    char what[64];
    snprintf(what, sizeof what, "matmul %s", pkv_type_name(t));
    near(what, ref, got, (size_t)(n * rows), 1e-10);
    /* n = 1 (matrix-vector) */
    ma.n = 1;
    CHECK_OK(pkv_k_matmul(d, &ma));
    down(by, PAD, got, sizeof(float) * rows);
    snprintf(what, sizeof what, "matvec %s", pkv_type_name(t));
    near(what, ref, got, (size_t)rows, 1e-10);

    /* get_rows, with two ids out of range (zeros) */
    int32_t ids[6] = {3, 0, (int32_t)vocab - 1, -1, (int32_t)vocab, 3};
    pkv_buffer *bi = up(d, 12, ids, sizeof ids), *bo = up(d, PAD, NULL, sizeof(float) * 6 * cols);
    pkv_k_get_rows_args ga = {pkv_tref_make(bw, woff), t, vocab, cols, pkv_tref_make(bi, 12), pkv_tref_make(bo, PAD), 6,
                              0.0f};
    CHECK_OK(pkv_k_get_rows(d, &ga));
    float *gr = malloc(sizeof(float) * 6 * cols), *gg = malloc(sizeof(float) * 6 * cols);
    for (int i = 0; i < 6; i++)
        for (int64_t c = 0; c < cols; c++)
            gr[i * cols + c] = ids[i] >= 0 && ids[i] < vocab ? deq(t, w + ids[i] * rb, c) : 0.0f;
    down(bo, PAD, gg, sizeof(float) * 6 * cols);
    snprintf(what, sizeof what, "get_rows %s", pkv_type_name(t));
    CHECK_MEM(gg, gr, sizeof(float) * 6 * cols); /* dequantization is exact */
    pkv_buffer_free(bw);
    pkv_buffer_free(bx);
    pkv_buffer_free(by);
    pkv_buffer_free(bi);
    pkv_buffer_free(bo);
    free(wf), free(x), free(w), free(ref), free(got), free(gr), free(gg);
}

/* Byte offsets of a block's f16 factors (-1: none). */
static void f16_fields(pkv_type t, int at[2]) {
    at[0] = at[1] = -1;
    switch (t) {
    case PKV_TYPE_Q6_K: at[0] = 208; break;
    case PKV_TYPE_Q2_K: at[0] = 80, at[1] = 82; break;
    case PKV_TYPE_Q3_K: at[0] = 108; break;
    case PKV_TYPE_TQ1_0: at[0] = 52; break;
    case PKV_TYPE_TQ2_0: at[0] = 64; break;
    case PKV_TYPE_IQ1_M: break;
    case PKV_TYPE_Q4_K: case PKV_TYPE_Q5_K: case PKV_TYPE_Q4_1: case PKV_TYPE_Q5_1: at[0] = 0, at[1] = 2; break;
    default: at[0] = 0; break; /* q5_0 and the other i-quants: d first */
    }
}

/* K-quant weights (256-element super-blocks of 144, 176 and 210 bytes: q6_k rows
 * start at 2-byte alignment, and the weights sit at an offset that is 2 mod 4)
 * against the CPU reference: matmul n and n = 1 within nmse 1e-9 (the shaders
 * take x in f32, no quantized activations), get_rows bit-exact. raw: the blocks
 * are random bytes (every bit pattern of scales, mins, high bits and negative
 * q6_k scales) with finite f16 factors, not the output of a quantizer. */
static void test_kquant(pkv_device *d, pkv_type t, int64_t rows, int64_t cols, int64_t n, bool raw) {
    size_t rb = pkv_type_row_bytes(t, (size_t)cols);
    float *wf = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
    float *ref = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
    uint8_t *w = malloc(rb * rows);
    randv(wf, (size_t)(rows * cols), 1.0f);
    randv(x, (size_t)(n * cols), 1.0f);
    for (int64_t r = 0; r < rows; r++) CHECK_OK(pkv_quantize_row(t, wf + r * cols, w + r * rb, cols));
    if (raw) {
        for (size_t i = 0; i < rb * rows; i++) w[i] = (uint8_t)th_rand(&krng);
        size_t bb = pkv_type_block_bytes(t);
        int f16_at[2];
        f16_fields(t, f16_at);
        for (size_t b = 0; b < rb * rows / bb; b++) {
            uint8_t *blk = w + b * bb;
            for (int k = 0; k < 2; k++) {
                uint16_t h = pkv_f32_to_f16((th_randf(&krng) + 1.5f) * 0.01f);
                if (f16_at[k] >= 0) memcpy(blk + f16_at[k], &h, 2);
            }
            if (t == PKV_TYPE_IQ1_M) { /* its f16 scale is the top nibbles of its four scale words */
                uint16_t h = pkv_f32_to_f16((th_randf(&krng) + 1.5f) * 0.01f);
                for (int i = 0; i < 4; i++) blk[49 + 2 * i] = (uint8_t)((blk[49 + 2 * i] & 15) | ((h >> (4 * i)) & 15) << 4);
            }
        }
    }
    size_t woff = PAD + 2;
    pkv_buffer *bw = up(d, woff, w, rb * rows), *bx = up(d, 8, x, sizeof(float) * n * cols),
               *by = up(d, PAD, NULL, sizeof(float) * n * rows);
    CHECK_OK(pkv_ref_matmul(w, t, rows, cols, x, n, ref));
    char what[96];
    pkv_k_matmul_args ma = {pkv_tref_make(bw, woff), t, rows, cols, pkv_tref_make(bx, 8), pkv_tref_make(by, PAD), n};
    CHECK_OK(pkv_k_matmul(d, &ma));
    down(by, PAD, got, sizeof(float) * n * rows);
    snprintf(what, sizeof what, "matmul %s %lldx%lld n=%lld%s", pkv_type_name(t), (long long)rows, (long long)cols,
             (long long)n, raw ? " raw" : "");
    near(what, ref, got, (size_t)(n * rows), 1e-9);
    ma.n = 1;
    CHECK_OK(pkv_k_matmul(d, &ma));
    down(by, PAD, got, sizeof(float) * rows);
    snprintf(what, sizeof what, "matvec %s %lldx%lld%s", pkv_type_name(t), (long long)rows, (long long)cols,
             raw ? " raw" : "");
    near(what, ref, got, (size_t)rows, 1e-9);

    int32_t ids[7] = {(int32_t)rows - 1, 0, -1, (int32_t)rows / 2, (int32_t)rows, (int32_t)rows - 1, 1};
    pkv_buffer *bi = up(d, 12, ids, sizeof ids), *bo = up(d, PAD, NULL, sizeof(float) * 7 * cols);
    pkv_k_get_rows_args ga = {pkv_tref_make(bw, woff), t, rows, cols, pkv_tref_make(bi, 12), pkv_tref_make(bo, PAD), 7,
                              0.0f};
    CHECK_OK(pkv_k_get_rows(d, &ga));
    float *gr = malloc(sizeof(float) * 7 * cols), *gg = malloc(sizeof(float) * 7 * cols);
    CHECK_OK(pkv_ref_get_rows(w, t, rows, cols, ids, 7, gr));
    down(bo, PAD, gg, sizeof(float) * 7 * cols);
    CHECK_MEM(gg, gr, sizeof(float) * 7 * cols); /* dequantization is exact */
    pkv_buffer_free(bw);
    pkv_buffer_free(bx);
    pkv_buffer_free(by);
    pkv_buffer_free(bi);
    pkv_buffer_free(bo);
    free(wf), free(x), free(w), free(ref), free(got), free(gr), free(gg);
}

static const pkv_type ktypes[3] = {PKV_TYPE_Q4_K, PKV_TYPE_Q5_K, PKV_TYPE_Q6_K};
/* The types of matmul_int/get_rows_int (the generic shaders), tested the same way. */
static const pkv_type itypes[16] = {PKV_TYPE_Q4_1,    PKV_TYPE_Q5_0,   PKV_TYPE_Q5_1,   PKV_TYPE_Q2_K,
                                    PKV_TYPE_Q3_K,    PKV_TYPE_IQ4_NL, PKV_TYPE_IQ4_XS, PKV_TYPE_IQ3_XXS,
                                    PKV_TYPE_IQ3_S,   PKV_TYPE_IQ2_XXS, PKV_TYPE_IQ2_XS, PKV_TYPE_IQ2_S,
                                    PKV_TYPE_IQ1_S,   PKV_TYPE_IQ1_M,  PKV_TYPE_TQ1_0,  PKV_TYPE_TQ2_0};

static void test_elementwise(pkv_device *d) {
    const int64_t rows = 5, len = 200, n = rows * len;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * len);
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    randv(a, (size_t)n, 3.0f);
    randv(b, (size_t)n, 3.0f);
    randv(w, (size_t)len, 1.0f);
    pkv_buffer *ba = up(d, PAD, a, sizeof(float) * n), *bb = up(d, 4, b, sizeof(float) * n),
               *bw = up(d, 0, w, sizeof(float) * len), *by = up(d, PAD + 64, NULL, sizeof(float) * n);
    /* add, plain and as a bias of one row */
    pkv_k_add_args aa = {pkv_tref_make(ba, PAD), pkv_tref_make(bb, 4), pkv_tref_make(by, PAD + 64), n, n};
    CHECK_OK(pkv_k_add(d, &aa));
    for (int64_t i = 0; i < n; i++) ref[i] = a[i] + b[i];
    down(by, PAD + 64, got, sizeof(float) * n);
    CHECK_MEM(got, ref, sizeof(float) * n);
    aa.b_len = len;
    CHECK_OK(pkv_k_add(d, &aa));
    for (int64_t i = 0; i < n; i++) ref[i] = a[i] + b[i % len];
    down(by, PAD + 64, got, sizeof(float) * n);
    CHECK_MEM(got, ref, sizeof(float) * n);
    /* swiglu */
    pkv_k_swiglu_args sa = {pkv_tref_make(ba, PAD), pkv_tref_make(bb, 4), pkv_tref_make(by, PAD + 64), n, false, false, 0, 0};
    CHECK_OK(pkv_k_swiglu(d, &sa));
    for (int64_t i = 0; i < n; i++) ref[i] = (float)(a[i] / (1.0 + exp(-(double)a[i])) * b[i]);
    down(by, PAD + 64, got, sizeof(float) * n);
    near("swiglu", ref, got, (size_t)n, 1e-12);
    /* rms_norm into y, then in place */
    pkv_k_rms_norm_args ra = {pkv_tref_make(ba, PAD), pkv_tref_make(bw, 0), pkv_tref_make(by, PAD + 64), rows, len, 1e-5f};
    CHECK_OK(pkv_k_rms_norm(d, &ra));
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t c = 0; c < len; c++) ss += (double)a[r * len + c] * a[r * len + c];
        double sc = 1.0 / sqrt(ss / (double)len + 1e-5);
        for (int64_t c = 0; c < len; c++) ref[r * len + c] = (float)(a[r * len + c] * sc * w[c]);
    }
    down(by, PAD + 64, got, sizeof(float) * n);
    near("rms_norm", ref, got, (size_t)n, 1e-12);
    ra.y = ra.x;
    CHECK_OK(pkv_k_rms_norm(d, &ra));
    down(ba, PAD, got, sizeof(float) * n);
    near("rms_norm in place", ref, got, (size_t)n, 1e-12);
    /* softmax in place on b */
    pkv_k_softmax_args xa = {pkv_tref_make(bb, 4), pkv_tref_make(bb, 4), rows, len};
    CHECK_OK(pkv_k_softmax(d, &xa));
    for (int64_t r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < len; c++) m = fmax(m, b[r * len + c]);
        for (int64_t c = 0; c < len; c++) s += exp(b[r * len + c] - m);
        for (int64_t c = 0; c < len; c++) ref[r * len + c] = (float)(exp(b[r * len + c] - m) / s);
    }
    down(bb, 4, got, sizeof(float) * n);
    near("softmax", ref, got, (size_t)n, 1e-11);
    /* argmax with planted ties: the first wins */
    for (int64_t r = 0; r < rows; r++) {
        a[r * len + 17 + r * 3] = 100.0f;
        a[r * len + 150 - r] = 100.0f;
    }
    a[4 * len + 199] = 200.0f; /* last element of the last row */
    CHECK_OK(pkv_buffer_write(ba, PAD, a, sizeof(float) * n));
    int32_t am[5];
    pkv_k_argmax_args ma = {pkv_tref_make(ba, PAD), pkv_tref_make(by, 8), rows, len};
    CHECK_OK(pkv_k_argmax(d, &ma));
    down(by, 8, am, sizeof am);
    for (int r = 0; r < 4; r++) CHECK_INT(am[r], 17 + r * 3);
    CHECK_INT(am[4], 199);
    pkv_buffer_free(ba);
    pkv_buffer_free(bb);
    pkv_buffer_free(bw);
    pkv_buffer_free(by);
    free(a), free(b), free(w), free(ref), free(got);
}

/* GeGLU: y = gelu(g) * u, the tanh form, against a double-precision loop of the
 * formula in device.h, g over [-12, 12] with the large magnitudes planted: above
 * 9 gelu(x) is x, below -9 it is 0 to f32 precision. On [-6, 0) every element
 * keeps its relative precision (1e-4), which 0.5 x (1 + tanhf(t)) evaluated in
 * f32 does not below x = -4. Out of place, then in place (y = g), same bits. */
static void test_geglu(pkv_device *d) {
    static const float planted[] = {12.0f, -12.0f, 11.99f, -11.99f, 10.0f, -10.0f, 9.0f, -9.0f, 7.5f, -7.5f,
                                    5.0f,  -5.0f,  4.0f,   -4.0f,   3.0f,  -3.0f,  1.0f, -1.0f, 1e-3f, -1e-3f,
                                    1e-20f, -1e-20f, 0.0f, -0.0f};
    const int64_t np = (int64_t)(sizeof planted / sizeof planted[0]), n = 4099; /* not a multiple of WG */
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n),
          *got = malloc(sizeof(float) * n), *got2 = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        g[i] = i < np ? planted[i] : 12.0f * th_randf(&krng);
        u[i] = i < np ? 1.0f : 2.0f * th_randf(&krng);
    }
    const double c = sqrt(2.0 / M_PI);
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i];
        ref[i] = (float)(0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x))) * (double)u[i]);
    }
    pkv_buffer *bg = up(d, PAD, g, sizeof(float) * n), *bu = up(d, 4, u, sizeof(float) * n),
               *by = up(d, PAD + 64, NULL, sizeof(float) * n);
    pkv_k_swiglu_args sa = {.g = pkv_tref_make(bg, PAD), .u = pkv_tref_make(bu, 4), .y = pkv_tref_make(by, PAD + 64),
                            .n = n, .gelu = true};
    CHECK_OK(pkv_k_swiglu(d, &sa));
    down(by, PAD + 64, got, sizeof(float) * n);
    near("geglu [-12, 12]", ref, got, (size_t)n, 1e-10);
    /* where the curve bends, alone, so that the large values cannot hide it */
    float *rs = malloc(sizeof(float) * n), *gs = malloc(sizeof(float) * n);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(g[i]) < 6.0f) rs[m] = ref[i], gs[m] = got[i], m++;
    near("geglu |g| < 6", rs, gs, (size_t)m, 1e-10);
    free(rs), free(gs);
    int big_bad = 0, neg_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i], xu = fabs(x * u[i]);
        if (x >= 9.0) big_bad += !(fabs((double)got[i] - x * u[i]) <= 1e-6 * xu);
        if (x <= -9.0) big_bad += !(fabs((double)got[i]) <= 1e-6 * xu);
        if (x >= -6.0 && x < 0.0) neg_bad += !(fabs((double)got[i] - ref[i]) <= 1e-4 * fabs((double)ref[i]));
    }
    CHECK_INT(big_bad, 0);
    CHECK_INT(neg_bad, 0);
    sa.y = sa.g; /* in place */
    CHECK_OK(pkv_k_swiglu(d, &sa));
    down(bg, PAD, got2, sizeof(float) * n);
    CHECK_MEM(got2, got, sizeof(float) * n);
    pkv_buffer_free(bg);
    pkv_buffer_free(bu);
    pkv_buffer_free(by);
    free(g), free(u), free(ref), free(got), free(got2);
}

/* get_rows with Gemma's embedding scale. Scale 0: exact copies, bit-identical
 * to the dequantization (as before the field existed). Scale 11.3: one f32
 * multiply of the dequantized value, also bit for bit (a product of two floats
 * is correctly rounded). Ids out of range stay zeros either way. */
static void test_get_rows_scale(pkv_device *d, pkv_type t) {
    const int64_t vocab = 13, cols = 512, n = 7;
    const size_t rb = pkv_type_row_bytes(t, (size_t)cols);
    const int32_t ids[7] = {12, 0, -1, 5, 13, 12, 3};
    float *wf = malloc(sizeof(float) * vocab * cols), *deqd = malloc(sizeof(float) * vocab * cols);
    float *ref = malloc(sizeof(float) * n * cols), *got = malloc(sizeof(float) * n * cols);
    uint8_t *w = malloc(rb * vocab);
    randv(wf, (size_t)(vocab * cols), 2.0f);
    for (int64_t r = 0; r < vocab; r++) {
        CHECK_OK(pkv_quantize_row(t, wf + r * cols, w + r * rb, cols));
        CHECK_OK(pkv_dequantize_row(t, w + r * rb, deqd + r * cols, cols));
    }
    size_t woff = t == PKV_TYPE_F32 ? PAD : PAD + 2;
    pkv_buffer *bw = up(d, woff, w, rb * vocab), *bi = up(d, 12, ids, sizeof ids),
               *bo = up(d, PAD, NULL, sizeof(float) * n * cols);
    static const float scales[3] = {0.0f, 11.3f, 1.0f};
    for (int si = 0; si < 3; si++) {
        const float sc = scales[si];
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < cols; c++) {
                float v = ids[i] >= 0 && ids[i] < vocab ? deqd[ids[i] * cols + c] : 0.0f;
                ref[i * cols + c] = sc != 0.0f ? v * sc : v;
            }
        CHECK_OK(pkv_buffer_fill(bo, PAD, sizeof(float) * n * cols, 0xA5));
        pkv_k_get_rows_args ga = {.w = pkv_tref_make(bw, woff), .wtype = t, .n_vocab = vocab, .cols = cols,
                                  .ids = pkv_tref_make(bi, 12), .out = pkv_tref_make(bo, PAD), .n = n, .scale = sc};
        CHECK_OK(pkv_k_get_rows(d, &ga));
        down(bo, PAD, got, sizeof(float) * n * cols);
        CHECK_MEM(got, ref, sizeof(float) * n * cols);
        fprintf(stderr, "  get_rows %-5s scale %-4g      bit-exact: %s\n", pkv_type_name(t), (double)sc,
                memcmp(got, ref, sizeof(float) * n * cols) ? "NO" : "yes");
    }
    pkv_buffer_free(bw);
    pkv_buffer_free(bi);
    pkv_buffer_free(bo);
    free(wf), free(deqd), free(ref), free(got), free(w);
}

/* rope: reference rotation in double on one element pair. */
static void rope_ref(float *head, int n_rot, bool neox, double pos, double base, double scale) {
    for (int i = 0; i < n_rot / 2; i++) {
        double th = pos * scale * pow(base, -2.0 * i / n_rot);
        int e0 = neox ? i : 2 * i, e1 = neox ? i + n_rot / 2 : 2 * i + 1;
        double a = head[e0], b = head[e1];
        head[e0] = (float)(a * cos(th) - b * sin(th));
        head[e1] = (float)(a * sin(th) + b * cos(th));
    }
}

static void test_rope(pkv_device *d, pkv_type dtype, bool neox, bool with_rows) {
    const int n_heads = 3, head_dim = 16, n_rot = with_rows ? 12 : 16, n_rows = 5, max_rows = 9;
    size_t es = dtype == PKV_TYPE_F32 ? 4 : 2;
    size_t stride = (size_t)n_heads * head_dim * es + (with_rows ? (es == 2 ? 6 : 8) : 0);
    size_t total = (size_t)max_rows * stride;
    uint8_t *x = malloc(total), *got = malloc(total);
    float *v = malloc(sizeof(float) * n_heads * head_dim);
    for (size_t i = 0; i < total; i++) x[i] = (uint8_t)th_rand(&krng);
    int32_t pos[5] = {0, 1, 7, 300, 4095}, rows[5] = {8, 0, 3, 5, 2};
    for (int r = 0; r < max_rows; r++) {
        randv(v, (size_t)(n_heads * head_dim), 2.0f);
        for (int e = 0; e < n_heads * head_dim; e++) {
            if (es == 4) memcpy(x + r * stride + e * 4, &v[e], 4);
            else { uint16_t h = pkv_f32_to_f16(v[e]); memcpy(x + r * stride + e * 2, &h, 2); }
        }
    }
    size_t xoff = PAD + (es == 2 ? 2 : 0);
    pkv_buffer *bx = up(d, xoff, x, total), *bp = up(d, 4, pos, sizeof pos), *br = up(d, 8, rows, sizeof rows);
    pkv_k_rope_args ra = {pkv_tref_make(bx, xoff), dtype, n_rows, max_rows, stride, n_heads, head_dim, n_rot, neox,
                          10000.0f, 0.5f, pkv_tref_make(bp, 4), with_rows ? pkv_tref_make(br, 8) : pkv_tref_make(NULL, 0),
                          0, 0, 0, 0, pkv_tref_make(NULL, 0)};
    CHECK_OK(pkv_k_rope(d, &ra));
    down(bx, xoff, got, total);
    float *rf = malloc(sizeof(float) * max_rows * n_heads * head_dim), *gf = malloc(sizeof(float) * max_rows * n_heads * head_dim);
    int k = 0;
    bool bytes_ok = true;
    for (int r = 0; r < max_rows; r++) {
        int which = -1;
        for (int i = 0; i < n_rows; i++)
            if ((with_rows ? rows[i] : i) == r) which = i;
        for (int e = 0; e < n_heads * head_dim; e++) {
            uint16_t h;
            if (es == 4) memcpy(&v[e], x + r * stride + e * 4, 4);
            else { memcpy(&h, x + r * stride + e * 2, 2); v[e] = pkv_f16_to_f32(h); }
        }
        if (which >= 0)
            for (int hh = 0; hh < n_heads; hh++) rope_ref(v + hh * head_dim, n_rot, neox, pos[which], 10000.0, 0.5);
        for (int e = 0; e < n_heads * head_dim; e++, k++) {
            rf[k] = v[e];
            uint16_t h;
            if (es == 4) memcpy(&gf[k], got + r * stride + e * 4, 4);
            else { memcpy(&h, got + r * stride + e * 2, 2); gf[k] = pkv_f16_to_f32(h); }
        }
        /* padding bytes between rows are untouched */
        size_t rb = (size_t)n_heads * head_dim * es;
        if (memcmp(got + r * stride + rb, x + r * stride + rb, stride - rb) != 0) bytes_ok = false;
        if (which < 0 && memcmp(got + r * stride, x + r * stride, rb) != 0) bytes_ok = false;
    }
    CHECK(bytes_ok);
    char what[64];
    snprintf(what, sizeof what, "rope %s %s%s", pkv_type_name(dtype), neox ? "neox" : "normal", with_rows ? " rows" : "");
    near(what, rf, gf, (size_t)k, es == 4 ? 1e-10 : 1e-6);
    pkv_buffer_free(bx);
    pkv_buffer_free(bp);
    pkv_buffer_free(br);
    free(x), free(got), free(v), free(rf), free(gf);
}

static void test_set_rows(pkv_device *d, pkv_type dt) {
    const int n = 4, elems = 13, dst_rows = 7;
    size_t es = dt == PKV_TYPE_F32 ? 4 : 2;
    size_t sstride = elems * 4 + 12, dstride = elems * es + (es == 2 ? 2 : 4);
    float *src = malloc(sstride * n);
    randv(src, sstride * n / 4, 5.0f);
    size_t dbytes = dstride * dst_rows;
    uint8_t *dst = malloc(dbytes), *got = malloc(dbytes);
    for (size_t i = 0; i < dbytes; i++) dst[i] = (uint8_t)th_rand(&krng);
    int32_t idx[4] = {6, 0, 3, 1};
    size_t doff = PAD + (es == 2 ? 2 : 0);
    pkv_buffer *bs = up(d, 4, src, sstride * n), *bd = up(d, doff, dst, dbytes), *bi = up(d, 0, idx, sizeof idx);
    pkv_k_set_rows_args sa = {pkv_tref_make(bs, 4), sstride, pkv_tref_make(bd, doff), dt, dstride, dst_rows,
                              pkv_tref_make(bi, 0), n, elems};
    CHECK_OK(pkv_k_set_rows(d, &sa));
    for (int i = 0; i < n; i++)
        for (int e = 0; e < elems; e++) {
            float v = src[(i * sstride) / 4 + e];
            if (es == 4) memcpy(dst + idx[i] * dstride + e * 4, &v, 4);
            else { uint16_t h = pkv_f32_to_f16(v); memcpy(dst + idx[i] * dstride + e * 2, &h, 2); }
        }
    down(bd, doff, got, dbytes);
    CHECK_MEM(got, dst, dbytes); /* bit-exact, RNE like the CPU, padding untouched */
    pkv_buffer_free(bs);
    pkv_buffer_free(bd);
    pkv_buffer_free(bi);
    free(src), free(dst), free(got);
}

static void test_attention(pkv_device *d, pkv_type kvt) {
    const int n_head = 4, n_kv = 2, dk = 24, dv = 16, page_size = 4, n_pages = 40, n_seq = 2, n_q = 5;
    size_t es = kvt == PKV_TYPE_F32 ? 4 : 2;
    size_t slots = (size_t)n_pages * page_size * n_kv;
    float *kf = malloc(sizeof(float) * slots * dk), *vf = malloc(sizeof(float) * slots * dv);
    randv(kf, slots * dk, 1.0f);
    randv(vf, slots * dv, 1.0f);
    uint8_t *kb = malloc(slots * dk * es), *vb = malloc(slots * dv * es);
    for (size_t i = 0; i < slots * dk; i++) {
        if (es == 4) memcpy(kb + i * 4, &kf[i], 4);
        else { uint16_t h = pkv_f32_to_f16(kf[i]); memcpy(kb + i * 2, &h, 2); kf[i] = pkv_f16_to_f32(h); }
    }
    for (size_t i = 0; i < slots * dv; i++) {
        if (es == 4) memcpy(vb + i * 4, &vf[i], 4);
        else { uint16_t h = pkv_f32_to_f16(vf[i]); memcpy(vb + i * 2, &h, 2); vf[i] = pkv_f16_to_f32(h); }
    }
    /* seq 0: 70 tokens on 18 scattered pages; seq 1: 9 tokens on 3 pages, the
     * last page id out of range (skipped). */
    int32_t meta[2 * 5 + 3 + 21];
    int32_t q_seq[5] = {0, 0, 1, 0, 1}, q_len[5] = {70, 1, 9, 65, 4};
    memcpy(meta, q_seq, sizeof q_seq);
    memcpy(meta + n_q, q_len, sizeof q_len);
    int32_t *indptr = meta + 2 * n_q, *pages = indptr + n_seq + 1;
    indptr[0] = 0, indptr[1] = 18, indptr[2] = 21;
    for (int i = 0; i < 18; i++) pages[i] = (i * 7 + 3) % n_pages;
    pages[18] = 39, pages[19] = 5 /* shared with seq 0 */, pages[20] = n_pages + 3;
    float *q = malloc(sizeof(float) * n_q * n_head * dk), *ref = malloc(sizeof(float) * n_q * n_head * dv),
          *got = malloc(sizeof(float) * n_q * n_head * dv);
    randv(q, (size_t)(n_q * n_head * dk), 1.0f);
    float scale = 1.0f / sqrtf((float)dk);
    for (int qi = 0; qi < n_q; qi++)
        for (int h = 0; h < n_head; h++) {
            int kvh = h / (n_head / n_kv), s = q_seq[qi];
            double m = -INFINITY, l = 0, acc[16] = {0};
            double sc[80];
            int sl[80];
            for (int t = 0; t < q_len[qi]; t++) {
                int pi = t / page_size;
                sl[t] = -1;
                if (pi >= indptr[s + 1] - indptr[s]) continue;
                int page = pages[indptr[s] + pi];
                if (page < 0 || page >= n_pages) continue;
                sl[t] = (page * page_size + t % page_size) * n_kv + kvh;
                double dot = 0;
                for (int c = 0; c < dk; c++) dot += (double)q[(qi * n_head + h) * dk + c] * kf[(size_t)sl[t] * dk + c];
                sc[t] = dot * scale;
                m = fmax(m, sc[t]);
            }
            for (int t = 0; t < q_len[qi]; t++) {
                if (sl[t] < 0) continue;
                double p = exp(sc[t] - m);
                l += p;
                for (int c = 0; c < dv; c++) acc[c] += p * vf[(size_t)sl[t] * dv + c];
            }
            for (int c = 0; c < dv; c++) ref[(qi * n_head + h) * dv + c] = l > 0 ? (float)(acc[c] / l) : 0.0f;
        }
    size_t koff = PAD + (es == 2 ? 2 : 0);
    pkv_buffer *bq = up(d, 4, q, sizeof(float) * n_q * n_head * dk), *bk = up(d, koff, kb, slots * dk * es),
               *bv = up(d, 8, vb, slots * dv * es), *bo = up(d, PAD, NULL, sizeof(float) * n_q * n_head * dv),
               *bm = up(d, 12, meta, sizeof meta);
    pkv_k_attention_args aa = {.q = pkv_tref_make(bq, 4), .k = pkv_tref_make(bk, koff), .v = pkv_tref_make(bv, 8),
                               .out = pkv_tref_make(bo, PAD), .meta = pkv_tref_make(bm, 12), .k_type = kvt,
                               .v_type = kvt, .n_q = n_q, .n_seq = n_seq, .meta_pages = 21, .n_pages = n_pages,
                               .page_size = page_size, .n_head = n_head, .n_kv = n_kv, .dk = dk, .dv = dv,
                               .scale = scale};
    CHECK_OK(pkv_k_attention(d, &aa));
    down(bo, PAD, got, sizeof(float) * n_q * n_head * dv);
    char what[64];
    snprintf(what, sizeof what, "attention %s", pkv_type_name(kvt));
    near(what, ref, got, (size_t)(n_q * n_head * dv), 1e-10);
    pkv_buffer_free(bq), pkv_buffer_free(bk), pkv_buffer_free(bv), pkv_buffer_free(bo), pkv_buffer_free(bm);
    free(kf), free(vf), free(kb), free(vb), free(q), free(ref), free(got);
}

/* The per-layer options of attention (window, softcap, sinks) against
 * pkv_ref_attention_sinks, GQA group 4, in a prefill batch (six queries of one
 * sequence) and a decode batch (one query per sequence and edge queries). Each
 * option must change the reference's output (so ignoring it fails), a window
 * larger than every q_len must give the bits of no window, and a query that sees
 * no token (q_len 0, or a window on a skipped page or past its sequence's pages)
 * must write exact zeros, sink or not. */
static void test_attention_opts(pkv_device *d, pkv_type kvt) {
    enum { H = 8, KV = 2, DK = 64, DV = 32, PS = 16, NP = 48, NSEQ = 3, NPAGES = 14, MAXQ = 7 };
    const size_t slots = (size_t)NP * PS * KV, krow = pkv_type_row_bytes(kvt, DK), vrow = pkv_type_row_bytes(kvt, DV);
    float *kf = malloc(sizeof(float) * slots * DK), *vf = malloc(sizeof(float) * slots * DV);
    uint8_t *kb = malloc(slots * krow), *vb = malloc(slots * vrow);
    randv(kf, slots * DK, 1.0f);
    randv(vf, slots * DV, 1.0f);
    make_weights(kvt, kf, kb, (int64_t)slots, DK);
    make_weights(kvt, vf, vb, (int64_t)slots, DV);
    /* seq 0: 150 tokens on 10 scattered pages (more than two 64-token chunks);
     * seq 1: 40 tokens on 3 pages, the last id out of range (tokens 32..39
     * skipped); seq 2: 20 tokens with one page listed (tokens 16..19 have none). */
    const int32_t indptr[NSEQ + 1] = {0, 10, 13, 14};
    int32_t pages[NPAGES];
    for (int i = 0; i < 10; i++) pages[i] = (i * 7 + 3) % NP;
    pages[10] = 40, pages[11] = 41, pages[12] = NP + 3, pages[13] = 10 /* shared with seq 0 */;
    static const struct {
        const char *name;
        int n_q;
        int32_t q_seq[MAXQ], q_len[MAXQ];
    } batches[2] = {
        {"prefill", 6, {0, 0, 0, 0, 0, 0}, {145, 146, 147, 148, 149, 150}},
        {"decode", 7, {0, 1, 2, 1, 0, 0, 2}, {150, 40, 20, 17, 0, 1, 15}},
    };
    static const struct {
        int window;
        float softcap;
        bool sinks;
    } cases[] = {
        {0, 0, false},  {1, 0, false}, {5, 0, false}, {20, 0, false}, {70, 0, false},
        {1000, 0, false}, {0, 5, false}, {0, 0, true}, {20, 5, true}, {1, 5, true},
    };
    enum { NCASE = sizeof cases / sizeof cases[0] };
    /* q of 12x the usual size: scaled scores up to ~15, so a softcap of 5 bites */
    float q[MAXQ * H * DK], sinks[H];
    randv(q, MAXQ * H * DK, 12.0f);
    for (int h = 0; h < H; h++) sinks[h] = 2.0f * th_randf(&krng);
    sinks[1] = 20.0f; /* dominates its head's softmax */
    pkv_buffer *bk = up(d, PAD + 2, kb, slots * krow), *bv = up(d, 8, vb, slots * vrow),
               *bq = up(d, 4, q, sizeof q), *bs = up(d, PAD + 4, sinks, sizeof sinks);
    for (int bi = 0; bi < 2; bi++) {
        const int n_q = batches[bi].n_q;
        const size_t n_out = (size_t)n_q * H * DV;
        int32_t meta[2 * MAXQ + NSEQ + 1 + NPAGES];
        memcpy(meta, batches[bi].q_seq, sizeof(int32_t) * n_q);
        memcpy(meta + n_q, batches[bi].q_len, sizeof(int32_t) * n_q);
        memcpy(meta + 2 * n_q, indptr, sizeof indptr);
        memcpy(meta + 2 * n_q + NSEQ + 1, pages, sizeof pages);
        pkv_buffer *bm = up(d, 12, meta, sizeof meta), *bo = up(d, PAD, NULL, n_out * 4);
        float *ref = malloc(sizeof(float) * n_out * NCASE), *got = malloc(sizeof(float) * n_out * NCASE);
        float ref1[MAXQ * DV], got1[MAXQ * DV];
        for (int ci = 0; ci < NCASE; ci++) {
            float *r = ref + ci * n_out, *g = got + ci * n_out;
            pkv_k_attention_args a = {.q = pkv_tref_make(bq, 4), .k = pkv_tref_make(bk, PAD + 2),
                                      .v = pkv_tref_make(bv, 8), .out = pkv_tref_make(bo, PAD),
                                      .meta = pkv_tref_make(bm, 12), .k_type = kvt, .v_type = kvt, .n_q = n_q,
                                      .n_seq = NSEQ, .meta_pages = NPAGES, .n_pages = NP, .page_size = PS,
                                      .n_head = H, .n_kv = KV, .dk = DK, .dv = DV, .scale = 1.0f / 8.0f,
                                      .window = cases[ci].window, .softcap = cases[ci].softcap,
                                      .sinks = cases[ci].sinks ? pkv_tref_make(bs, PAD + 4) : (pkv_tref){0}};
            CHECK_OK(pkv_buffer_fill(bo, PAD, n_out * 4, 0xFF)); /* NaN: every output must be written */
            CHECK_OK(pkv_k_attention(d, &a));
            down(bo, PAD, g, n_out * 4);
            pkv_ref_attention_sinks(&a, q, kb, vb, meta, cases[ci].sinks ? sinks : NULL, r);
            char what[96];
            snprintf(what, sizeof what, "attn %s %s w%d c%g%s", pkv_type_name(kvt), batches[bi].name,
                     cases[ci].window, (double)cases[ci].softcap, cases[ci].sinks ? " sinks" : "");
            near(what, r, g, n_out, 1e-8);
            if (cases[ci].sinks) { /* the head whose sink dominates, on its own */
                for (int qi = 0; qi < n_q; qi++) {
                    memcpy(ref1 + qi * DV, r + ((size_t)qi * H + 1) * DV, sizeof(float) * DV);
                    memcpy(got1 + qi * DV, g + ((size_t)qi * H + 1) * DV, sizeof(float) * DV);
                }
                strncat(what, " h1=20", sizeof what - strlen(what) - 1);
                near(what, ref1, got1, (size_t)n_q * DV, 1e-8);
            }
            if (ci == 0) continue;
            if (cases[ci].window >= 150) CHECK_MEM(g, got, n_out * 4); /* the path of no window */
            else CHECK(th_nmse(ref, r, n_out) > 1e-4);                  /* the option matters here */
            /* rows that see no token: exact zeros, with or without a sink */
            for (size_t row = 0; row < (size_t)n_q * H; row++) {
                bool zero = true;
                for (int c = 0; c < DV; c++) zero &= r[row * DV + c] == 0.0f;
                if (zero)
                    for (int c = 0; c < DV; c++) CHECK(g[row * DV + c] == 0.0f);
            }
        }
        if (bi == 1) /* q_len 0 everywhere; window 1 also on seq 1's skipped page and past seq 2's pages */
            for (int h = 0; h < H; h++) {
                CHECK(got[((size_t)4 * H + h) * DV] == 0.0f && got[(9 * n_out) + ((size_t)4 * H + h) * DV] == 0.0f);
                CHECK(got[(9 * n_out) + ((size_t)1 * H + h) * DV] == 0.0f);
                CHECK(got[(9 * n_out) + ((size_t)2 * H + h) * DV] == 0.0f);
            }
        pkv_buffer_free(bm), pkv_buffer_free(bo);
        free(ref), free(got);
    }
    pkv_buffer_free(bq), pkv_buffer_free(bk), pkv_buffer_free(bv), pkv_buffer_free(bs);
    free(kf), free(vf), free(kb), free(vb);
}

/* K/V pools larger than the storage-buffer range, bound as several windows of
 * whole pages (issue 30): PKV_VK_MAX_RANGE (a test-only knob) shrinks the range so
 * that 40 pages of 8 tokens need four windows of 12 pages, for every K and V type
 * and a mix of them, with and without window/softcap/sinks. The result must equal
 * the reference (nmse) and, bit for bit, the same call on a device whose range
 * holds the pools whole (the shader's arithmetic does not depend on the windows).
 * Pages of the sequences are scattered over all four windows, one shared by two
 * sequences, one id out of range. A pool that needs five windows is refused. */
static pkv_device *open_vk(void);
static void test_attention_windows(pkv_device *whole) {
    enum { H = 4, KV = 2, DK = 64, DV = 32, PS = 8, NP = 40, NSEQ = 2, NQ = 5, NPAGES = 19 + 5 };
    static const pkv_type combos[6][2] = {{PKV_TYPE_F32, PKV_TYPE_F32},   {PKV_TYPE_F16, PKV_TYPE_F16},
                                          {PKV_TYPE_Q8_0, PKV_TYPE_Q8_0}, {PKV_TYPE_Q4_0, PKV_TYPE_Q4_0},
                                          {PKV_TYPE_F16, PKV_TYPE_Q4_0},  {PKV_TYPE_Q8_0, PKV_TYPE_F32}};
    const size_t slots = (size_t)NP * PS * KV;
    float *kf = malloc(sizeof(float) * slots * DK), *vf = malloc(sizeof(float) * slots * DV);
    randv(kf, slots * DK, 1.0f);
    randv(vf, slots * DV, 1.0f);
    int32_t meta[2 * NQ + NSEQ + 1 + NPAGES];
    const int32_t q_seq[NQ] = {0, 0, 1, 0, 1}, q_len[NQ] = {150, 1, 40, 77, 9};
    memcpy(meta, q_seq, sizeof q_seq);
    memcpy(meta + NQ, q_len, sizeof q_len);
    int32_t *indptr = meta + 2 * NQ, *pages = indptr + NSEQ + 1;
    indptr[0] = 0, indptr[1] = 19, indptr[2] = NPAGES;
    for (int i = 0; i < 19; i++) pages[i] = (i * 7 + 3) % NP; /* 3, 10, 17, ..., every window */
    pages[19] = 39, pages[20] = 10 /* shared with seq 0 */, pages[21] = 20, pages[22] = NP + 3, pages[23] = 0;
    float q[NQ * H * DK], sinks[H];
    randv(q, NQ * H * DK, 4.0f);
    for (int h = 0; h < H; h++) sinks[h] = 2.0f * th_randf(&krng);
    const size_t n_out = (size_t)NQ * H * DV;
    float ref[NQ * H * DV], got[NQ * H * DV], got_whole[NQ * H * DV];
    for (int ci = 0; ci < 6; ci++) {
        const pkv_type kt = combos[ci][0], vt = combos[ci][1];
        const size_t krow = pkv_type_row_bytes(kt, DK), vrow = pkv_type_row_bytes(vt, DV);
        const size_t page = PS * KV * PKV_MAX(krow, vrow);
        uint8_t *kb = malloc(slots * krow), *vb = malloc(slots * vrow);
        make_weights(kt, kf, kb, (int64_t)slots, DK);
        make_weights(vt, vf, vb, (int64_t)slots, DV);
        /* 12 pages of the larger type per window: the range less the alignment
         * slack (<= 260 bytes) holds 12 pages and not 13 (pages >= 576 bytes). */
        char range[32];
        snprintf(range, sizeof range, "%zu", 12 * page + 512);
        setenv("PKV_VK_MAX_RANGE", range, 1);
        pkv_device *d = open_vk();
        REQUIRE_VOID(d != NULL);
        const size_t koff = kt == PKV_TYPE_F32 ? PAD : PAD + 2;
        pkv_device *devs[2] = {d, whole};
        for (int opt = 0; opt < 2; opt++) {
            for (int di = 0; di < 2; di++) {
                pkv_device *dv = devs[di];
                pkv_buffer *bk = up(dv, koff, kb, slots * krow), *bv = up(dv, 8, vb, slots * vrow),
                           *bq = up(dv, 4, q, sizeof q), *bs = up(dv, PAD + 4, sinks, sizeof sinks),
                           *bm = up(dv, 12, meta, sizeof meta), *bo = up(dv, PAD, NULL, n_out * 4);
                pkv_k_attention_args a = {.q = pkv_tref_make(bq, 4), .k = pkv_tref_make(bk, koff),
                                          .v = pkv_tref_make(bv, 8), .out = pkv_tref_make(bo, PAD),
                                          .meta = pkv_tref_make(bm, 12), .k_type = kt, .v_type = vt, .n_q = NQ,
                                          .n_seq = NSEQ, .meta_pages = NPAGES, .n_pages = NP, .page_size = PS,
                                          .n_head = H, .n_kv = KV, .dk = DK, .dv = DV, .scale = 1.0f / 8.0f,
                                          .window = opt ? 30 : 0, .softcap = opt ? 5.0f : 0.0f,
                                          .sinks = opt ? pkv_tref_make(bs, PAD + 4) : (pkv_tref){0}};
                CHECK_OK(pkv_buffer_fill(bo, PAD, n_out * 4, 0xFF)); /* NaN: every output must be written */
                CHECK_OK(pkv_k_attention(dv, &a));
                down(bo, PAD, di ? got_whole : got, n_out * 4);
                if (di == 0) {
                    pkv_ref_attention_sinks(&a, q, kb, vb, meta, opt ? sinks : NULL, ref);
                    char what[96];
                    snprintf(what, sizeof what, "attn windows K %s V %s%s", pkv_type_name(kt), pkv_type_name(vt),
                             opt ? " w/c/s" : "");
                    near(what, ref, got, n_out, 1e-8);
                }
                if (di == 0 && opt == 0) {
                    /* 5 windows needed (8 pages per window): refused, naming the limit */
                    snprintf(range, sizeof range, "%zu", 8 * page + 512);
                    setenv("PKV_VK_MAX_RANGE", range, 1);
                    pkv_device *d5 = open_vk();
                    REQUIRE_VOID(d5 != NULL);
                    pkv_buffer *k5 = up(d5, koff, kb, slots * krow), *v5 = up(d5, 8, vb, slots * vrow),
                               *q5 = up(d5, 4, q, sizeof q), *m5 = up(d5, 12, meta, sizeof meta),
                               *o5 = up(d5, PAD, NULL, n_out * 4);
                    pkv_k_attention_args a5 = a;
                    a5.q = pkv_tref_make(q5, 4), a5.k = pkv_tref_make(k5, koff), a5.v = pkv_tref_make(v5, 8);
                    a5.out = pkv_tref_make(o5, PAD), a5.meta = pkv_tref_make(m5, 12);
                    CHECK_INT(pkv_k_attention(d5, &a5), PKV_ERR_UNSUPPORTED);
                    CHECK(strstr(pkv_errmsg(), "5 windows") != NULL);
                    pkv_buffer_free(k5), pkv_buffer_free(v5), pkv_buffer_free(q5), pkv_buffer_free(m5), pkv_buffer_free(o5);
                    pkv_device_close(d5);
                }
                pkv_buffer_free(bk), pkv_buffer_free(bv), pkv_buffer_free(bq), pkv_buffer_free(bs);
                pkv_buffer_free(bm), pkv_buffer_free(bo);
            }
            CHECK_MEM(got, got_whole, n_out * 4);
        }
        pkv_device_close(d);
        free(kb), free(vb);
    }
    unsetenv("PKV_VK_MAX_RANGE");
    free(kf), free(vf);
}

/* set_rows into a KV pool larger than the storage-buffer range (issue 30): the
 * pool bound as up to four windows of whole rows. PKV_VK_MAX_RANGE shrinks the
 * range so 50 rows of 1 KiB (at an odd offset) need four windows of 13 rows;
 * every KV type, rows written in every window and one index out of range; the
 * whole pool (padding and untouched rows included) must equal pkv_ref_set_rows'
 * bit for bit. Five windows are refused. */
static void test_set_rows_windows(void) {
    static const pkv_type types[4] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0};
    enum { N = 12, ELEMS = 64, ROWS = 50, DSTRIDE = 1024 };
    for (int ti = 0; ti < 4; ti++) {
        const pkv_type dt = types[ti];
        const size_t es = dt == PKV_TYPE_F32 ? 4 : 2, rb = pkv_type_row_bytes(dt, ELEMS);
        const size_t sstride = ELEMS * 4 + 8, dstride = DSTRIDE; /* rows padded to 1 KiB, as a page stride */
        /* 13 rows per window whatever the offset alignment in force (<= 256): a
         * window of (K - 1) strides + a row + 260 bytes holds K rows */
        char range[32];
        snprintf(range, sizeof range, "%zu", 12 * dstride + rb + 260);
        setenv("PKV_VK_MAX_RANGE", range, 1);
        pkv_device *d = open_vk();
        REQUIRE_VOID(d != NULL);
        float *src = malloc(sstride * N);
        randv(src, sstride * N / 4, 3.0f);
        const size_t dbytes = dstride * ROWS;
        uint8_t *want = malloc(dbytes), *got = malloc(dbytes);
        for (size_t i = 0; i < dbytes; i++) want[i] = (uint8_t)th_rand(&krng);
        const int32_t idx[N] = {0, 12, 13, 25, 26, 38, 39, 49, 7, 35, ROWS + 2, 20}; /* both ends of each window */
        const size_t doff = PAD + (es == 2 ? 2 : 0);
        pkv_buffer *bs = up(d, 4, src, sstride * N), *bd = up(d, doff, want, dbytes), *bi = up(d, 8, idx, sizeof idx);
        pkv_k_set_rows_args sa = {pkv_tref_make(bs, 4), sstride, pkv_tref_make(bd, doff), dt, dstride, ROWS,
                                  pkv_tref_make(bi, 8), N, ELEMS};
        CHECK_OK(pkv_k_set_rows(d, &sa));
        pkv_ref_set_rows(&sa, src, want, idx);
        down(bd, doff, got, dbytes);
        char what[64];
        snprintf(what, sizeof what, "set_rows windows %s", pkv_type_name(dt));
        th_checks++;
        if (memcmp(got, want, dbytes) != 0) TH_FAIL("%s: pool differs from the reference", what);
        else fprintf(stderr, "  %-28s bit-exact\n", what);
        pkv_buffer_free(bs), pkv_buffer_free(bd), pkv_buffer_free(bi);
        pkv_device_close(d);
        /* 10 rows per window: 5 windows, refused */
        snprintf(range, sizeof range, "%zu", 9 * dstride + rb + 260);
        setenv("PKV_VK_MAX_RANGE", range, 1);
        d = open_vk();
        REQUIRE_VOID(d != NULL);
        pkv_buffer *bs5 = up(d, 4, src, sstride * N), *bd5 = up(d, doff, want, dbytes), *bi5 = up(d, 8, idx, sizeof idx);
        pkv_k_set_rows_args s5 = {pkv_tref_make(bs5, 4), sstride, pkv_tref_make(bd5, doff), dt, dstride, ROWS,
                                  pkv_tref_make(bi5, 8), N, ELEMS};
        CHECK_INT(pkv_k_set_rows(d, &s5), PKV_ERR_UNSUPPORTED);
        CHECK(strstr(pkv_errmsg(), "5 windows") != NULL);
        pkv_buffer_free(bs5), pkv_buffer_free(bd5), pkv_buffer_free(bi5);
        pkv_device_close(d);
        free(src), free(want), free(got);
    }
    unsetenv("PKV_VK_MAX_RANGE");
}

/* rope over rows of a KV pool larger than the storage-buffer range (the
 * re-rotation of cached K after a shift): 50 rows of 1 KiB bound as four windows
 * of 13 rows, rows listed in every window (both ends of each) and one out of
 * range. The pool must equal, bit for bit, the same call on a device whose range
 * holds it whole (the same arithmetic), the listed rows must have changed and no
 * other byte; five windows are refused. Every KV type. */
static void test_rope_windows(pkv_device *whole) {
    static const pkv_type types[4] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0};
    enum { N = 12, HEADS = 2, HD = 64, ROWS = 50, STRIDE = 1024 };
    const int32_t rows[N] = {0, 12, 13, 25, 26, 38, 39, 49, 7, 35, ROWS + 2, 20};
    int32_t pos[N];
    for (int i = 0; i < N; i++) pos[i] = 1 + (int32_t)(th_rand(&krng) % 4000);
    const size_t total = (size_t)STRIDE * ROWS;
    uint8_t *init = malloc(total), *got = malloc(total), *want = malloc(total);
    float v[HEADS * HD];
    for (int ti = 0; ti < 4; ti++) {
        const pkv_type dt = types[ti];
        const size_t es = dt == PKV_TYPE_F32 ? 4 : 2, hb = HEADS * pkv_type_row_bytes(dt, HD);
        for (size_t i = 0; i < total; i++) init[i] = (uint8_t)th_rand(&krng);
        for (int r = 0; r < ROWS; r++) {
            randv(v, HEADS * HD, 2.0f);
            for (int hh = 0; hh < HEADS; hh++) make_weights(dt, v + hh * HD, init + (size_t)r * STRIDE + hh * (hb / HEADS), 1, HD);
        }
        const size_t xoff = PAD + (es == 2 ? 2 : 0);
        for (int pass = 0; pass < 3; pass++) { /* 0: whole, 1: four windows, 2: five (refused) */
            char range[32];
            snprintf(range, sizeof range, "%zu", (size_t)(pass == 1 ? 12 : 9) * STRIDE + hb + 260);
            if (pass) setenv("PKV_VK_MAX_RANGE", range, 1);
            pkv_device *d = pass ? open_vk() : whole;
            REQUIRE_VOID(d != NULL);
            pkv_buffer *bx = up(d, xoff, init, total), *bp = up(d, 4, pos, sizeof pos), *br = up(d, 8, rows, sizeof rows);
            pkv_k_rope_args ra = {.x = pkv_tref_make(bx, xoff), .dtype = dt, .n_rows = N, .max_rows = ROWS,
                                  .row_stride = STRIDE, .n_heads = HEADS, .head_dim = HD, .n_rot = HD, .neox = ti % 2 == 1,
                                  .freq_base = 10000.0f, .freq_scale = 1.0f, .pos = pkv_tref_make(bp, 4),
                                  .rows = pkv_tref_make(br, 8)};
            if (pass == 2) {
                CHECK_INT(pkv_k_rope(d, &ra), PKV_ERR_UNSUPPORTED);
                CHECK(strstr(pkv_errmsg(), "5 windows") != NULL);
            } else {
                CHECK_OK(pkv_k_rope(d, &ra));
                down(bx, xoff, pass ? got : want, total);
            }
            pkv_buffer_free(bx), pkv_buffer_free(bp), pkv_buffer_free(br);
            if (pass) pkv_device_close(d);
        }
        unsetenv("PKV_VK_MAX_RANGE");
        char what[64];
        snprintf(what, sizeof what, "rope windows %s", pkv_type_name(dt));
        th_checks++;
        if (memcmp(got, want, total) != 0) TH_FAIL("%s: pool differs from the one-window rotation", what);
        else fprintf(stderr, "  %-28s bit-exact\n", what);
        for (int r = 0; r < ROWS; r++) { /* the listed rows rotated, nothing else touched */
            bool listed = false;
            for (int i = 0; i < N; i++) listed |= rows[i] == r;
            const uint8_t *a = init + (size_t)r * STRIDE, *b = got + (size_t)r * STRIDE;
            CHECK(memcmp(a, b, hb) != 0 || !listed);
            CHECK(memcmp(a, b, hb) == 0 || listed);
            CHECK(memcmp(a + hb, b + hb, STRIDE - hb) == 0);
        }
    }
    free(init), free(got), free(want);
}

/* Kernel arguments at offsets the shaders cannot address are refused with a
 * message, and nothing is written. */
static void test_alignment(pkv_device *d) {
    pkv_buffer *b = up(d, 0, NULL, 4096);
    CHECK_OK(pkv_buffer_fill(b, 0, 4096, 0));
    pkv_k_add_args aa = {pkv_tref_make(b, 2), pkv_tref_make(b, 1000), pkv_tref_make(b, 2000), 16, 16};
    CHECK_STATUS(pkv_k_add(d, &aa), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("argument a at byte offset 2 is not a multiple of 4");
    pkv_k_matmul_args ma = {pkv_tref_make(b, 1), PKV_TYPE_Q8_0, 2, 32, pkv_tref_make(b, 1024), pkv_tref_make(b, 2048), 1};
    CHECK_STATUS(pkv_k_matmul(d, &ma), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("argument w at byte offset 1");
    uint8_t z[4096], got[4096];
    memset(z, 0, sizeof z);
    down(b, 0, got, 4096);
    CHECK_MEM(got, z, 4096);
    pkv_buffer_free(b);
}

/* I3: transfers and kernels recorded back to back (one submission) see each
 * other's effects in order. */
static void test_ordering(pkv_device *d) {
    const int n = 256;
    float a[256], b[256], got[256], ref[256];
    randv(a, n, 1.0f);
    randv(b, n, 1.0f);
    pkv_buffer *buf = up(d, 0, NULL, 4 * 4 * n);
    CHECK_OK(pkv_buffer_fill(buf, 0, 4 * 4 * n, 0)); /* queued */
    CHECK_OK(pkv_buffer_write(buf, 0, a, 4 * n));    /* staged: queue not idle */
    CHECK_OK(pkv_buffer_write(buf, 4 * n, b, 4 * n));
    pkv_k_add_args aa = {pkv_tref_make(buf, 0), pkv_tref_make(buf, 4 * n), pkv_tref_make(buf, 8 * n), n, n};
    CHECK_OK(pkv_k_add(d, &aa));                                     /* c = a + b */
    CHECK_OK(pkv_buffer_copy(buf, 8 * n, buf, 12 * n, 4 * n));       /* d = c */
    pkv_k_add_args ab = {pkv_tref_make(buf, 12 * n), pkv_tref_make(buf, 0), pkv_tref_make(buf, 12 * n), n, n};
    CHECK_OK(pkv_k_add(d, &ab));                                     /* d += a */
    CHECK_OK(pkv_buffer_fill(buf, 12 * n + 6, 5, 0));                /* bytes 6..10 of d zeroed */
    CHECK_OK(pkv_buffer_write(buf, 0, b, 4 * n));                    /* a = b after its use */
    CHECK_OK(pkv_k_add(d, &ab));                                     /* d += new a */
    CHECK_OK(pkv_device_flush(d));
    for (int i = 0; i < n; i++) ref[i] = (a[i] + b[i]) + a[i];
    uint8_t *rb = (uint8_t *)ref;
    memset(rb + 6, 0, 5);
    for (int i = 0; i < n; i++) ref[i] += b[i];
    down(buf, 12 * n, got, 4 * n);
    CHECK_MEM(got, ref, 4 * n);
    pkv_buffer_free(buf);
}

/* Thousands of kernels recorded without a sync (more than one descriptor pool
 * holds on the non-push path) still run in order. */
static void test_long_chain(pkv_device *d) {
    enum { N = 64, K = 2500 };
    float x[N], b[N], got[N];
    for (int i = 0; i < N; i++) x[i] = 0, b[i] = (float)(i % 7 + 1);
    pkv_buffer *bx = up(d, 0, x, sizeof x), *bb = up(d, 0, b, sizeof b);
    pkv_k_add_args aa = {pkv_tref_make(bx, 0), pkv_tref_make(bb, 0), pkv_tref_make(bx, 0), N, N};
    for (int k = 0; k < K; k++) CHECK_OK(pkv_k_add(d, &aa));
    down(bx, 0, got, sizeof got);
    for (int i = 0; i < N; i++) CHECK_INT((long)got[i], (long)(K * b[i]));
    pkv_buffer_free(bx);
    pkv_buffer_free(bb);
}

static void test_kernels(pkv_device *d) {
    CHECK(pkv_device_get_caps(d)->has_kernels);
    pkv_type wt[5] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_BF16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0};
    for (int i = 0; i < 5; i++) {
        CHECK(pkv_device_supports_weight(d, wt[i]));
        test_matmul_getrows(d, wt[i], 6);
    }
    CHECK(!pkv_device_supports_weight(d, PKV_TYPE_Q8_K)); /* activations only, never a weight */
    for (int i = 0; i < 3; i++) {
        CHECK(pkv_device_supports_weight(d, ktypes[i]));
        test_kquant(d, ktypes[i], 37, 256, 11, false);
        test_kquant(d, ktypes[i], 5, 768, 3, true);
        test_kquant(d, ktypes[i], 3, 512, 9, true);
    }
    for (int i = 0; i < 16; i++) {
        const int64_t c0 = pkv_type_block_elems(itypes[i]) == 32 ? 96 : 256; /* 32-blocks: not a whole 256 */
        CHECK(pkv_device_supports_weight(d, itypes[i]));
        CHECK_INT(pkv_device_weight_speed(d, itypes[i]), PKV_WEIGHT_SLOW);
        test_kquant(d, itypes[i], 9, c0, 5, false);
        test_kquant(d, itypes[i], 5, 512, 3, true);
    }
    CHECK_INT(pkv_device_weight_speed(d, PKV_TYPE_Q4_K), PKV_WEIGHT_FAST);
    test_elementwise(d);
    test_geglu(d);
    static const pkv_type st[4] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_K};
    for (int i = 0; i < 4; i++) test_get_rows_scale(d, st[i]);
    test_rope(d, PKV_TYPE_F32, false, false);
    test_rope(d, PKV_TYPE_F32, true, true);
    test_rope(d, PKV_TYPE_F16, false, true);
    test_rope(d, PKV_TYPE_F16, true, false);
    test_set_rows(d, PKV_TYPE_F32);
    test_set_rows(d, PKV_TYPE_F16);
    test_attention(d, PKV_TYPE_F32);
    test_attention(d, PKV_TYPE_F16);
    test_attention_opts(d, PKV_TYPE_F16);
    test_attention_opts(d, PKV_TYPE_Q8_0);
    test_alignment(d);
    test_ordering(d);
    test_long_chain(d);
}

/* ------------------------------------------------------- conformance suite */

static void report_row(const pkv_check_result *r, void *user) {
    (void)user;
    th_checks++;
    fprintf(stderr, "  [%s] %-30s %-5s %6ld ops  %s\n", r->device, r->test,
            r->skipped ? "skip" : r->passed ? "ok" : "FAIL", r->count, r->detail);
    /* Only weight types the backend does not claim may be skipped. */
    bool allowed_skip = r->skipped && strstr(r->test, "q8_k");
    if (!r->passed && !r->skipped) TH_FAIL("conformance %s on %s: %s", r->test, r->device, r->detail);
    if (r->skipped && !allowed_skip) TH_FAIL("conformance %s on %s skipped: %s", r->test, r->device, r->detail);
}

static void conformance(pkv_device *vk) {
    pkv_check_params p = pkv_check_default_params();
    CHECK_OK(pkv_check_transfers(vk, p, report_row, NULL));
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    if (cpu) {
        CHECK_OK(pkv_check_cross(cpu, vk, p, report_row, NULL));
        CHECK_OK(pkv_check_cross(vk, cpu, p, report_row, NULL));
        pkv_device_close(cpu);
    }
    pkv_status s = pkv_check_kernels(vk, p, report_row, NULL);
    th_checks++;
    if (s != PKV_OK) TH_FAIL("pkv_check_kernels: %s: %s", pkv_status_str(s), pkv_errmsg());
}

/* ----------------------------------------------------- allocation failures */

static pkv_device *open_vk(void) { return pkv_device_open("vulkan:0", pkv_device_default_params()); }

/* Suballocation: hundreds of buffers of odd sizes live in a handful of device
 * memory allocations, each keeps its own bytes (written, others freed and
 * reallocated into the holes, read back), and freeing them all gives the
 * memory back but one cached block (and the staging buffer). */
static void test_suballocation(pkv_device *d) {
    enum { N = 600 };
    pkv_buffer **b = calloc(N + 1, sizeof *b);
    uint8_t **want = calloc(N + 1, sizeof *want);
    size_t *sz = calloc(N + 1, sizeof *sz);
    uint64_t rng = 77;
    pkv_device_memory_stats ms;
    CHECK_OK(pkv_device_memory_stats_get(d, &ms));
    const int64_t buffers0 = ms.buffers;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            if (b[i]) continue;
            sz[i] = 1 + th_rand(&rng) % (th_rand(&rng) % 8 ? 3000 : 70000);
            b[i] = pkv_buffer_alloc(d, sz[i]);
            REQUIRE_VOID(b[i] != NULL);
            want[i] = realloc(want[i], sz[i]);
            for (size_t k = 0; k < sz[i]; k++) want[i][k] = (uint8_t)th_rand(&rng);
            CHECK_OK(pkv_buffer_write(b[i], 0, want[i], sz[i]));
        }
        CHECK_OK(pkv_device_memory_stats_get(d, &ms));
        CHECK_INT(ms.buffers, buffers0 + N);
        fprintf(stderr, "suballocation round %d: %lld buffers in %lld allocations (%llu MiB)\n", round,
                (long long)ms.buffers, (long long)ms.allocations, (unsigned long long)(ms.allocation_bytes >> 20));
        CHECK(ms.allocations >= 1 && ms.allocations <= 4);
        CHECK(ms.allocation_limit >= 4096 || ms.allocation_limit == 0);
        for (int i = 0; i < N; i++) {
            uint8_t *got = malloc(sz[i]);
            CHECK_OK(pkv_buffer_read(b[i], 0, got, sz[i]));
            CHECK_MEM(got, want[i], sz[i]);
            free(got);
        }
        /* free every third buffer: the next round refills the holes */
        for (int i = round; i < N; i += 3) {
            pkv_buffer_free(b[i]);
            b[i] = NULL;
        }
    }
    /* a buffer of more than half the largest block gets an allocation of its own */
    CHECK_OK(pkv_device_memory_stats_get(d, &ms));
    const int64_t before = ms.allocations;
    const size_t big = ((size_t)129 << 20) + 5;
    pkv_buffer *huge = pkv_buffer_alloc(d, big);
    if (huge) {
        const uint8_t tail[5] = {1, 2, 3, 4, 5};
        uint8_t got[5] = {0};
        CHECK_OK(pkv_buffer_write(huge, big - 5, tail, 5));
        CHECK_OK(pkv_buffer_read(huge, big - 5, got, 5));
        CHECK_MEM(got, tail, 5);
        CHECK_OK(pkv_device_memory_stats_get(d, &ms));
        CHECK_INT(ms.allocations, before + 1);
        pkv_buffer_free(huge);
        CHECK_OK(pkv_device_memory_stats_get(d, &ms));
        CHECK_INT(ms.allocations, before);
    }
    for (int i = 0; i < N; i++) {
        if (b[i]) pkv_buffer_free(b[i]);
        free(want[i]);
    }
    CHECK_OK(pkv_device_memory_stats_get(d, &ms));
    CHECK_INT(ms.buffers, buffers0);
    CHECK(ms.peak_allocations <= 5);
    free(b);
    free(want);
    free(sz);
}

/* What each embedded shader needs, read from its SPIR-V, is what its source
 * says, and within the strictest profile: 64 invocations, little shared
 * memory, no 16-bit or 8-bit types (f16, bf16 and quantized data are decoded
 * from 32-bit words). */

static void test_shader_needs(void) {
#ifdef PKV_HAVE_VULKAN /* the embedded shaders exist only in a Vulkan build (main skips without one) */
    int seen = 0;
    for (int i = 0; i < pkv_vk_shader_count; i++) {
        const pkv_spirv *sp = &pkv_vk_shaders[i];
        if (!sp->name) continue;
        pkv_vk_shader_needs_t n;
        CHECK_OK(pkv_vk_shader_needs(sp->code, sp->bytes / 4, &n));
        if (n.invocations != 64) TH_FAIL("shader %s: %llu invocations, not 64", sp->name, (unsigned long long)n.invocations);
        if (n.shared_bytes > 16384) TH_FAIL("shader %s: %llu bytes shared", sp->name, (unsigned long long)n.shared_bytes);
        if (n.uses_16bit || n.uses_8bit) TH_FAIL("shader %s declares 16/8-bit capabilities", sp->name);
        th_checks += 3;
        /* the sizes of the shared arrays in the sources */
        if (!strcmp(sp->name, "attention") || !strcmp(sp->name, "attention_win"))
            CHECK_INT(n.shared_bytes, 576 * 4 + 64 * 4 + 64 * 4); /* q of up to 576 (MLA), scores, slots */
        if (!strcmp(sp->name, "matmul")) CHECK_INT(n.shared_bytes, 4 * 64 * 4);
        if (!strcmp(sp->name, "argmax")) CHECK_INT(n.shared_bytes, 64 * 4 * 2);
        if (!strcmp(sp->name, "matmul_sg")) CHECK_INT(n.shared_bytes, 0);
        seen++;
    }
    CHECK(seen >= 19);
    uint32_t junk[6] = {0x12345678u, 0, 0, 10, 0, 0};
    pkv_vk_shader_needs_t n;
    CHECK(pkv_vk_shader_needs(junk, 6, &n) != PKV_OK);
#endif
}

/* Every limits profile: the device says which is in force, and transfers and
 * every kernel pass under it; an unknown name is refused, naming the known. */
static void test_profiles(void) {
    static const char *profiles[] = {"mali", "adreno", "intel-xe", "nvidia", "rdna", "strict"};
    for (int i = 0; i < 6; i++) {
        setenv("PKV_VK_LIMITS", profiles[i], 1);
        pkv_device *d = open_vk();
        if (!d) {
            TH_FAIL("profile %s: %s", profiles[i], pkv_errmsg());
            continue;
        }
        const char *l = pkv_device_get_caps(d)->limits;
        CHECK(strncmp(l, profiles[i], strlen(profiles[i])) == 0 && l[strlen(profiles[i])] == ':');
        fprintf(stderr, "limits %s\n", l);
        pkv_device_memory_stats ms;
        CHECK_OK(pkv_device_memory_stats_get(d, &ms));
        CHECK_INT(ms.allocation_limit, 4096);
        transfer_suite(d, 10 + (uint64_t)i, 300);
        test_kernels(d);
        if (!strcmp(profiles[i], "strict")) CHECK(strstr(l, "storage offsets 256,") != NULL);
        pkv_device_close(d);
    }
    setenv("PKV_VK_LIMITS", "nosuch", 1);
    CHECK(open_vk() == NULL);
    CHECK_MSG("not a limits profile");
    CHECK_MSG("strict");
    unsetenv("PKV_VK_LIMITS");
}

/* Failing each host allocation in turn while opening the device, allocating a
 * buffer and copying regions: each call fails cleanly or succeeds, never leaks. */
static void test_alloc_failures(void) {
    int64_t live0 = pkv_alloc_live();
    int failed_open = 0;
    for (uint64_t n = 1; n < 64; n++) {
        pkv_alloc_fail_at(n);
        pkv_device *d = open_vk();
        uint64_t made = pkv_alloc_fail_at(0);
        if (!d) {
            failed_open++;
            CHECK(strstr(pkv_errmsg(), "memory") != NULL);
            CHECK_INT(pkv_alloc_live(), live0);
            continue;
        }
        pkv_device_close(d);
        if (n > made) break;
    }
    CHECK(failed_open >= 1);
    pkv_device *d = open_vk();
    if (!d) return;
    pkv_buffer *src = up(d, 0, NULL, 1000);
    CHECK_OK(pkv_buffer_fill(src, 0, 1000, 7));
    int failures = 0;
    for (uint64_t n = 1; n < 64; n++) {
        pkv_alloc_fail_at(n);
        pkv_buffer *b = pkv_buffer_alloc(d, 1000);
        pkv_status s = PKV_OK;
        if (b) {
            pkv_region r[3] = {{0, 0, 10}, {100, 500, 50}, {900, 999, 1}};
            s = pkv_buffer_copy_regions(src, b, r, 3);
        }
        uint64_t made = pkv_alloc_fail_at(0);
        if (!b || s) {
            failures++;
            CHECK_STATUS(b ? s : PKV_ERR_NOMEM, PKV_ERR_NOMEM);
        } else {
            uint8_t got[50];
            down(b, 500, got, 50);
            CHECK(got[0] == 7 && got[49] == 7);
        }
        pkv_buffer_free(b);
        if (n > made) break;
    }
    CHECK(failures >= 2);
    pkv_buffer_free(src);
    pkv_device_close(d);
    CHECK_INT(pkv_alloc_live(), live0);
}

/* ------------------------------------------------------------------- main */

int main(void) {
    char names[16][64], why[256] = "";
    int n = 0;
    CHECK_OK(pkv_device_enumerate(0, names, 16, &n, why, sizeof why));
    bool listed = false;
    for (int i = 0; i < n && i < 16; i++) listed |= strcmp(names[i], "vulkan:0") == 0;
    pkv_device *dev = open_vk();
    if (!dev) {
        CHECK(!listed); /* listed devices must open */
        if (th_failures) return th_done();
        char msg[600];
        snprintf(msg, sizeof msg, "no Vulkan device: %s (%s)", pkv_errmsg(), why);
        return th_skip(msg);
    }
    CHECK(listed);
    const pkv_device_caps *caps = pkv_device_get_caps(dev);
    fprintf(stderr, "vulkan:0 = %s, %llu MiB, max buffer %zu, host_memory %d\n", caps->description,
            (unsigned long long)(caps->memory_bytes >> 20), caps->max_buffer_bytes, caps->host_memory);
    CHECK_INT(caps->kind, PKV_DEVICE_VULKAN);
    CHECK(strcmp(caps->name, "vulkan:0") == 0);
    CHECK(caps->description[0] != 0);
    CHECK(caps->memory_bytes > 0);
    CHECK_INT(caps->transfer_align, 4);

    CHECK(strncmp(caps->limits, getenv("PKV_VK_LIMITS") ? getenv("PKV_VK_LIMITS") : "driver", 4) == 0);
    test_shader_needs();
    test_suballocation(dev);
    transfer_suite(dev, 1, 3000);
    big_transfer(dev);
    cross_device(dev);
    test_kernels(dev);
    conformance(dev);
    pkv_device_close(dev);

    /* The same on the staging path (on lavapipe the default is direct mapping). */
    setenv("PKV_VK_FORCE_STAGING", "1", 1);
    dev = open_vk();
    REQUIRE(dev != NULL);
    CHECK(!pkv_device_get_caps(dev)->host_memory);
    transfer_suite(dev, 2, 3000);
    big_transfer(dev);
    cross_device(dev);
    test_kernels(dev);
    conformance(dev);
    pkv_device_close(dev);
    unsetenv("PKV_VK_FORCE_STAGING");

    /* Weights and batches larger than one storage-buffer window go in chunks:
     * shrink the window to 2 KiB so 37 weight rows and 20 x rows need several. */
    setenv("PKV_VK_MAX_RANGE", "2048", 1);
    dev = open_vk();
    REQUIRE(dev != NULL);
    pkv_type wt[5] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_BF16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0};
    for (int i = 0; i < 5; i++) test_matmul_getrows(dev, wt[i], 20);
    /* 37 rows of 144..210 bytes: 9 to 14 rows (whole super-blocks) per chunk */
    for (int i = 0; i < 3; i++) test_kquant(dev, ktypes[i], 37, 256, 5, i == 1);
    pkv_device_close(dev);
    /* 768 columns: 432..630-byte rows, x rows of 3 KiB, in an 8 KiB window */
    setenv("PKV_VK_MAX_RANGE", "8192", 1);
    dev = open_vk();
    REQUIRE(dev != NULL);
    for (int i = 0; i < 3; i++) test_kquant(dev, ktypes[i], 37, 768, 5, i != 1);
    pkv_device_close(dev);
    /* The generic shaders of the other types also bind the 9 KiB i-quant grid
     * table (a real device's window is at least 128 MiB): a 16 KiB window, which
     * 100 rows of 330 (q3_k) to 576 (q5_1) bytes and 9 x rows of 3 KiB exceed */
    setenv("PKV_VK_MAX_RANGE", "16384", 1);
    dev = open_vk();
    REQUIRE(dev != NULL);
    test_kquant(dev, PKV_TYPE_Q3_K, 100, 768, 9, true);
    test_kquant(dev, PKV_TYPE_IQ2_S, 100, 768, 9, true);
    test_kquant(dev, PKV_TYPE_Q5_1, 100, 768, 9, false);
    pkv_device_close(dev);
    unsetenv("PKV_VK_MAX_RANGE");
    dev = open_vk();
    REQUIRE(dev != NULL);
    test_attention_windows(dev);
    test_rope_windows(dev);
    pkv_device_close(dev);
    test_set_rows_windows();

    test_alloc_failures();
    if (!getenv("PKV_VK_LIMITS")) test_profiles();

    /* The portable paths: descriptor sets from pools (drivers without
     * VK_KHR_push_descriptor) and the matmul without subgroup arithmetic. */
    setenv("PKV_VK_NO_PUSH_DESCRIPTOR", "1", 1);
    setenv("PKV_VK_NO_SUBGROUP", "1", 1);
    dev = open_vk();
    REQUIRE(dev != NULL);
    test_kernels(dev);
    conformance(dev);
    pkv_device_close(dev);
    unsetenv("PKV_VK_NO_PUSH_DESCRIPTOR");
    unsetenv("PKV_VK_NO_SUBGROUP");
    CHECK_INT(pkv_alloc_live(), 0);
    return th_done();
}
