// labels: unit
/* Block formats: dequantization of blocks built by hand byte by byte, with the
 * expected floats stated; quantize -> dequantize error bounds; dot_ref. */
#include "testhelp.h"

#include "base/quant.h"

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Dequantize one row and check it equals want exactly (bit-exact definition). */
static void check_exact(pkv_type t, const uint8_t *blk, const float *want, int n) {
    float got[512];
    CHECK_OK(pkv_dequantize_row(t, blk, got, n));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < 4) TH_FAIL("%s element %d: %.9g, want %.9g", pkv_type_name(t), i, got[i], want[i]);
    th_checks++;
}

static void test_simple_types(void) {
    /* f32: the bytes of 1.5 and -0.25 */
    uint8_t f32b[8];
    float v[2] = {1.5f, -0.25f};
    memcpy(f32b, v, 8);
    check_exact(PKV_TYPE_F32, f32b, v, 2);

    /* f16: 0x3c00 = 1, 0xc000 = -2, 0x0001 = 2^-24 (smallest subnormal), 0x7bff = 65504 */
    uint8_t f16b[8];
    put16(f16b, 0x3c00);
    put16(f16b + 2, 0xc000);
    put16(f16b + 4, 0x0001);
    put16(f16b + 6, 0x7bff);
    const float f16w[4] = {1.0f, -2.0f, 5.9604644775390625e-8f, 65504.0f};
    check_exact(PKV_TYPE_F16, f16b, f16w, 4);

    /* bf16: the top half of an f32: 0x3f80 = 1, 0xc0a0 = -5, 0x3e00 = 0.125 */
    uint8_t bfb[6];
    put16(bfb, 0x3f80);
    put16(bfb + 2, 0xc0a0);
    put16(bfb + 4, 0x3e00);
    const float bfw[3] = {1.0f, -5.0f, 0.125f};
    check_exact(PKV_TYPE_BF16, bfb, bfw, 3);

    /* q8_0: d = 0x3800 = 0.5, qs[j] = j - 16, plus -128 and 127 at the ends: x = 0.5 * q */
    uint8_t q8[34];
    float q8w[32];
    put16(q8, 0x3800);
    for (int j = 0; j < 32; j++) {
        int q = j == 0 ? -128 : j == 31 ? 127 : j - 16;
        q8[2 + j] = (uint8_t)(int8_t)q;
        q8w[j] = 0.5f * (float)q;
    }
    CHECK(q8w[0] == -64.0f && q8w[31] == 63.5f && q8w[16] == 0.0f);
    check_exact(PKV_TYPE_Q8_0, q8, q8w, 32);

    /* q4_0: d = 0x4000 = 2; byte j = (j) | (15 - j) << 4, so element j < 16 is 2*(j - 8)
     * and element j + 16 is 2*((15 - j) - 8) = 2*(7 - j). Byte 0 = 0xf0: x0 = -16, x16 = 14. */
    uint8_t q4[18];
    float q4w[32];
    put16(q4, 0x4000);
    for (int j = 0; j < 16; j++) {
        q4[2 + j] = (uint8_t)(j | (15 - j) << 4);
        q4w[j] = 2.0f * (float)(j - 8);
        q4w[j + 16] = 2.0f * (float)(7 - j);
    }
    CHECK_INT(q4[2], 0xf0);
    CHECK(q4w[0] == -16.0f && q4w[16] == 14.0f && q4w[15] == 14.0f && q4w[31] == -16.0f);
    check_exact(PKV_TYPE_Q4_0, q4, q4w, 32);
}

/* Sub-block scales and mins used for the hand-built q4_k and q5_k blocks: some
 * above 15 so the two high bits go through the packed bytes. */
static const int k_sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
static const int k_m[8] = {0, 5, 10, 63, 16, 31, 48, 7};
/* Their packing, worked out by hand from the GGUF rule (see quant.c):
 * bytes 0-3: sc[0..3] | (sc[4..7] >> 4) << 6; bytes 4-7: m[0..3] | (m[4..7] >> 4) << 6;
 * bytes 8-11: (sc[4..7] & 15) | (m[4..7] & 15) << 4. */
static const uint8_t k_scale_bytes[12] = {0x41, 0x82, 0xc3, 0xc4, 0x40, 0x45, 0xca, 0x3f, 0x01, 0xf1, 0x02, 0x7f};

static void test_q4_k(void) {
    uint8_t b[144];
    float want[256];
    put16(b, 0x3c00);     /* d = 1 */
    put16(b + 2, 0x3800); /* dmin = 0.5 */
    memcpy(b + 4, k_scale_bytes, 12);
    for (int i = 0; i < 128; i++) b[16 + i] = (uint8_t)((i % 16) | (15 - i % 16) << 4);
    /* Element e: group g = e / 64 covers bytes 32g..32g+31; the first 32 elements of
     * the group take low nibbles (sub-block 2g), the next 32 the high nibbles (2g+1). */
    for (int e = 0; e < 256; e++) {
        const int g = e / 64, r = e % 64, l = r % 32, sub = 2 * g + (r >= 32);
        const int byte = b[16 + 32 * g + l];
        const int q = r < 32 ? byte & 15 : byte >> 4;
        want[e] = 1.0f * (float)k_sc[sub] * (float)q - 0.5f * (float)k_m[sub];
    }
    /* two values by hand: element 0 is q=0 in sub-block 0: 0 - 0.5*0 = 0;
     * element 32 is q = 15 in sub-block 1: 2*15 - 0.5*5 = 27.5 */
    CHECK(want[0] == 0.0f && want[32] == 27.5f);
    check_exact(PKV_TYPE_Q4_K, b, want, 256);
}

static void test_q5_k(void) {
    uint8_t b[176];
    float want[256];
    put16(b, 0x3c00);
    put16(b + 2, 0x3800);
    memcpy(b + 4, k_scale_bytes, 12);
    for (int l = 0; l < 32; l++) b[16 + l] = (uint8_t)(l * 37 + 11); /* qh: high bits */
    for (int i = 0; i < 128; i++) b[48 + i] = (uint8_t)((i * 7) & 255);
    for (int e = 0; e < 256; e++) {
        const int g = e / 64, r = e % 64, l = r % 32, sub = 2 * g + (r >= 32);
        const int byte = b[48 + 32 * g + l];
        const int q = (r < 32 ? byte & 15 : byte >> 4) + 16 * ((b[16 + l] >> sub) & 1);
        want[e] = 1.0f * (float)k_sc[sub] * (float)q - 0.5f * (float)k_m[sub];
    }
    /* element 0: qs[0] = 0, qh[0] = 11 = 0b1011 has bit 0: q = 16 -> 1*16 - 0 = 16 */
    CHECK(want[0] == 16.0f);
    check_exact(PKV_TYPE_Q5_K, b, want, 256);
}

static void test_q6_k(void) {
    uint8_t b[210];
    float want[256];
    for (int i = 0; i < 128; i++) b[i] = (uint8_t)(i * 3);
    for (int i = 0; i < 64; i++) b[128 + i] = (uint8_t)(i * 29);
    for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(int8_t)(i - 8);
    put16(b + 208, 0x3400); /* d = 0.25 */
    /* Element e: half h = e / 128; within it quarter k = (e % 128) / 32, l = e % 32.
     * Low 4 bits: quarters 0/1 take the low nibble of ql[64h + l] / ql[64h + 32 + l],
     * quarters 2/3 the high nibble of the same bytes; high 2 bits are bits 2k, 2k+1
     * of qh[32h + l]; the scale is scales[8h + 2k + l / 16]. */
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const int lb = b[64 * h + (k & 1) * 32 + l];
        const int lo = k < 2 ? lb & 15 : lb >> 4;
        const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        const int sc = (int8_t)b[192 + 8 * h + 2 * k + l / 16];
        want[e] = 0.25f * (float)sc * (float)((lo | hi << 4) - 32);
    }
    /* element 0: ql[0] = 0, qh[0] = 0 -> q = -32, scale -8: 0.25 * -8 * -32 = 64 */
    CHECK(want[0] == 64.0f);
    check_exact(PKV_TYPE_Q6_K, b, want, 256);
}

static void test_q8_k(void) {
    uint8_t b[292];
    float want[256];
    const float d = 0.125f;
    memcpy(b, &d, 4);
    for (int j = 0; j < 256; j++) {
        b[4 + j] = (uint8_t)(int8_t)(j - 128);
        want[j] = 0.125f * (float)(j - 128);
    }
    memset(b + 260, 0, 32);
    check_exact(PKV_TYPE_Q8_K, b, want, 256);
}

/* mxfp4 (OCP Microscaling Formats v1.0, MXFP4; ggml type 39): the value of a
 * 4-bit E2M1 code as the spec defines it: sign bit 3, exponent bits 2..1 with
 * bias 1, mantissa bit 0; exponent 0 is subnormal (0.5 * m). Written from the
 * spec's formula, not from a table: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives. */
static float e2m1_spec(int code) {
    const int s = code >> 3, ex = (code >> 1) & 3, m = code & 1;
    const float mag = ex == 0 ? 0.5f * (float)m : ldexpf(1.0f + 0.5f * (float)m, ex - 1);
    return s && mag != 0 ? -mag : mag; /* code 8 (-0) reads as +0, as ggml's table has it */
}

/* Bitwise compare (the sign of zero and infinities included). */
static void check_bits(const char *what, const float *got, const float *want, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0 && bad++ < 4)
            TH_FAIL("%s element %d: %.9g, want %.9g", what, i, got[i], want[i]);
    th_checks++;
}

static void test_mxfp4(void) {
    CHECK_INT(PKV_TYPE_MXFP4, 39);
    CHECK(PKV_TYPE_COUNT > PKV_TYPE_MXFP4);
    CHECK(strcmp(pkv_type_name(PKV_TYPE_MXFP4), "mxfp4") == 0);
    pkv_type t;
    CHECK_OK(pkv_type_from_name("MXFP4", &t));
    CHECK_INT(t, PKV_TYPE_MXFP4);
    CHECK_INT(pkv_type_block_elems(PKV_TYPE_MXFP4), 32);
    CHECK_INT(pkv_type_block_bytes(PKV_TYPE_MXFP4), 17);
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_MXFP4, 96), 51);
    /* the spec's code values, spelled out */
    static const float codes[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++) CHECK(e2m1_spec(c) == codes[c]);

    /* Blocks { u8 e; u8 qs[16]; }: qs[j] = j | (15 - j) << 4 puts every code in
     * the low nibbles (elements 0..15: code j) and in the high ones (elements
     * 16..31: code 15 - j). x = e2m1 * 2^(e - 127): ldexpf is exact here, and
     * overflows to infinity where the product is past FLT_MAX, as the float
     * multiply of the dequantizer does. */
    static const int exps[] = {0, 1, 127, 128, 200, 254};
    uint8_t row[6 * 17];
    float want[6 * 32], got[6 * 32];
    for (int b = 0; b < 6; b++) {
        uint8_t *blk = row + 17 * b;
        blk[0] = (uint8_t)exps[b];
        for (int j = 0; j < 16; j++) {
            blk[1 + j] = (uint8_t)(j | (15 - j) << 4);
            want[32 * b + j] = ldexpf(e2m1_spec(j), exps[b] - 127);
            want[32 * b + 16 + j] = ldexpf(e2m1_spec(15 - j), exps[b] - 127);
        }
    }
    /* a few by hand: e = 127 is scale 1 (element 7: code 7 = 6; element 16:
     * code 15 = -6); e = 128 doubles; e = 0 is 2^-127 (element 1: 0.5 * 2^-127 =
     * 2^-128, a subnormal; element 16: -6 * 2^-127); e = 200: code 6 is 4 * 2^73,
     * element 17 (code 14) its negative; e = 254: code 3 is 1.5 * 2^127, code 4
     * (and element 19, code 12) 2 * 2^127, past FLT_MAX */
    CHECK(want[2 * 32 + 7] == 6.0f && want[2 * 32 + 16] == -6.0f && want[2 * 32 + 31] == 0.0f);
    CHECK(want[3 * 32 + 5] == 6.0f && want[3 * 32 + 6] == 8.0f && want[3 * 32 + 9] == -1.0f);
    CHECK(want[0 * 32 + 1] == 0x1p-128f && want[0 * 32 + 7] == 0x1.8p-125f && want[0 * 32 + 16] == -0x1.8p-125f);
    CHECK(want[1 * 32 + 1] == 0x1p-127f);
    CHECK(want[4 * 32 + 6] == 0x1p75f && want[4 * 32 + 17] == -0x1p75f);
    CHECK(want[5 * 32 + 3] == 0x1.8p127f && isinf(want[5 * 32 + 4]) && want[5 * 32 + 19] < 0 && isinf(want[5 * 32 + 19]));
    CHECK_OK(pkv_dequantize_row(PKV_TYPE_MXFP4, row, got, 6 * 32));
    check_bits("mxfp4", got, want, 6 * 32);
    /* e = 255 (NaN in the spec) reads as the scale 2^127 (ggml's E8M0 decode) */
    uint8_t b255[17] = {255, 0x01};
    CHECK_OK(pkv_dequantize_row(PKV_TYPE_MXFP4, b255, got, 32));
    CHECK(got[0] == 0x1p127f && got[16] == 0.0f);

    /* The quantizer on a block worked out by hand: amax 7, floor(log2 7) = 2,
     * so e = 2 - 2 + 127 = 127 (scale 1). On-grid values keep their code; 7
     * saturates to 6; ties go to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
     * 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); a negative that rounds to zero is
     * code 0. */
    static const float qx[32] = {0,     0.5f,  1,     1.5f,  2,    3,     4,  6,  -0.5f, -1,   -1.5f,
                                 -2,    -3,    -4,    -6,    7,    0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f,
                                 5,     -0.25f, -0.75f, -5,  -7,   0.1f,  -2.2f, 4.9f, 5.1f,  -0.0f};
    static const int qc[32] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 7,
                               0, 2, 2, 4, 4, 6, 6, 0, 10, 14, 15, 0, 12, 6, 7, 0};
    uint8_t qb[17], qwant[17];
    qwant[0] = 127;
    for (int j = 0; j < 16; j++) qwant[1 + j] = (uint8_t)(qc[j] | qc[j + 16] << 4);
    CHECK_OK(pkv_quantize_row(PKV_TYPE_MXFP4, qx, qb, 32));
    CHECK_MEM(qb, qwant, 17);
    /* tiny and huge blocks clamp the exponent to [0, 254] */
    float tiny[32] = {0x1p-140f}, huge[32] = {0x1p127f};
    CHECK_OK(pkv_quantize_row(PKV_TYPE_MXFP4, tiny, qb, 32));
    CHECK_INT(qb[0], 0);
    CHECK_OK(pkv_dequantize_row(PKV_TYPE_MXFP4, qb, got, 32));
    CHECK(got[0] == 0.0f); /* 2^-140 is below half of the smallest step 2^-128 */
    CHECK_OK(pkv_quantize_row(PKV_TYPE_MXFP4, huge, qb, 32));
    CHECK_INT(qb[0], 252);
    CHECK_OK(pkv_dequantize_row(PKV_TYPE_MXFP4, qb, got, 32));
    CHECK(got[0] == 0x1p127f);
}

/* The KV quantizers (q8_0, q4_0 pages) on blocks whose result is worked out by
 * hand, rounding ties included. Shared with test-kv-quant.c through these tables. */
static const float kq8_v[32] = {-127, 3.5f, 4.5f, -2.5f, 10.25f, -10.75f, 126.9f, 0,    0.49f, -0.51f, 1,
                                -1,   2,    -2,   64,    -64,    100.5f,  101.5f, -100.5f, 50.4f, 50.6f, -50.4f,
                                -50.6f, 7,  8,    9,     -7,     -8,      -9,     120,    -120,  33};
/* x = 0.125 * v: amax 15.875 = 127 * 0.125, so d = 0.125 (f16 0x3000) and 1/d = 8
 * exactly; q = v rounded to nearest, ties to even (3.5 -> 4, 4.5 -> 4, -2.5 -> -2,
 * 100.5 -> 100, 101.5 -> 102), 126.9 -> 127. */
static const int kq8_q[32] = {-127, 4, 4, -2, 10, -11, 127, 0, 0, -1, 1, -1, 2, -2, 64, -64,
                              100, 102, -100, 50, 51, -50, -51, 7, 8, 9, -7, -8, -9, 120, -120, 33};
/* q4_0: the signed extreme is -16, so d = -16 / -8 = 2 (f16 0x4000), 1/d = 0.5, and
 * q = trunc(x / 2 + 8.5) clamped to [0, 15]: -16 -> 0, 15.9 -> 16 -> 15, -1 -> 8,
 * -1.1 -> 7 (7.95), 2 -> 9 (9.5 truncates), -2 -> 7 (7.5). */
static const float kq4_x[32] = {-16, 14,   15.9f, 0,  1,  0.9f, -1, -1.1f, 3, -3, -15, -14.5f, 7, -7, 5,  -5,
                                2,   -2,   4,     -4, 6,  -6,   8,  -8,    10, -10, 12, -12,   0.5f, -0.5f, 13, -13};
static const int kq4_q[32] = {0, 15, 15, 8, 9, 8, 8, 7, 10, 7, 1, 1, 12, 5, 11, 6,
                              9, 7,  10, 6, 11, 5, 12, 4, 13, 3, 14, 2, 8, 8, 15, 2};

static void test_kv_quantize_blocks(void) {
    float x[32];
    uint8_t got[34], want[34];
    for (int j = 0; j < 32; j++) x[j] = 0.125f * kq8_v[j];
    put16(want, 0x3000);
    for (int j = 0; j < 32; j++) want[2 + j] = (uint8_t)(int8_t)kq8_q[j];
    CHECK_OK(pkv_quantize_row(PKV_TYPE_Q8_0, x, got, 32));
    CHECK_MEM(got, want, 34);
    put16(want, 0x4000);
    for (int j = 0; j < 16; j++) want[2 + j] = (uint8_t)(kq4_q[j] | kq4_q[j + 16] << 4);
    CHECK_INT(want[2], 0x90); /* element 0 (q 0) low, element 16 (q 9) high */
    CHECK_OK(pkv_quantize_row(PKV_TYPE_Q4_0, kq4_x, got, 32));
    CHECK_MEM(got, want, 18);
    /* an all-zero block: d = 0 / -8 = -0 (f16 0x8000), every q the zero point */
    memset(x, 0, sizeof x);
    CHECK_OK(pkv_quantize_row(PKV_TYPE_Q4_0, x, got, 32));
    for (int j = 0; j < 16; j++) CHECK_INT(got[2 + j], 0x88);
    CHECK_INT(got[0] | got[1] << 8, 0x8000);
}

static double row_nmse(pkv_type t, const float *x, int n, float *y) {
    uint8_t q[4096];
    CHECK_OK(pkv_quantize_row(t, x, q, n));
    CHECK_OK(pkv_dequantize_row(t, q, y, n));
    return th_nmse(x, y, (size_t)n);
}

/* mxfp4's grid is coarse at the top of a block (steps of a quarter of the
 * largest value, which may saturate to 6/8 of itself). */
#define MXFP4_NMSE 3e-2

static void test_round_trip(void) {
    static const struct {
        pkv_type t;
        double bound;
    } bounds[] = {
        /* uniform data: error variance step^2/12 against signal variance amax^2/3 */
        {PKV_TYPE_F32, 0},       {PKV_TYPE_F16, 1e-7},    {PKV_TYPE_BF16, 2e-5},   {PKV_TYPE_Q8_0, 1e-4},
        {PKV_TYPE_Q4_0, 1.5e-2}, {PKV_TYPE_Q4_K, 1.5e-2}, {PKV_TYPE_Q5_K, 4e-3},   {PKV_TYPE_Q6_K, 1e-3},
        {PKV_TYPE_Q8_K, 1e-4},   {PKV_TYPE_MXFP4, MXFP4_NMSE},
    };
    uint64_t seed = 42;
    float x[512], y[512];
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        const pkv_type t = bounds[i].t;
        for (int trial = 0; trial < 4; trial++) {
            /* trial 1 adds an offset (k-quant mins), 2 scales down, 3 has an outlier */
            for (int j = 0; j < 512; j++) x[j] = th_randf(&seed) * (trial == 2 ? 1e-3f : 1.0f) + (trial == 1 ? 0.7f : 0.0f);
            if (trial == 3) x[100] = -9.0f;
            const double e = row_nmse(t, x, 512, y);
            const double bound = bounds[i].bound * (trial == 3 ? 5 : 1); /* an outlier coarsens its block */
            if (!(e <= bound)) TH_FAIL("%s trial %d: nmse %.3g > %.3g", pkv_type_name(t), trial, e, bound);
            th_checks++;
        }
        /* an all-zero row stays zero, no NaN */
        for (int j = 0; j < 512; j++) x[j] = 0;
        row_nmse(t, x, 512, y);
        int bad = 0;
        for (int j = 0; j < 512; j++) bad += y[j] != 0.0f;
        CHECK_INT(bad, 0);
    }
    /* values on the q8_0 grid come back exactly: amax = 63.5 -> d = 0.5 */
    for (int j = 0; j < 32; j++) x[j] = 0.5f * (float)((j * 11) % 255 - 127);
    x[0] = 63.5f;
    row_nmse(PKV_TYPE_Q8_0, x, 32, y);
    CHECK_MEM(x, y, 32 * sizeof(float));
    /* q4_0 maps the signed extreme to -8 exactly: block of (-8..7) * 0.25 and max -2 */
    for (int j = 0; j < 32; j++) x[j] = 0.25f * (float)(j % 16 - 8);
    row_nmse(PKV_TYPE_Q4_0, x, 32, y);
    CHECK_MEM(x, y, 32 * sizeof(float));
    /* f16 rounds to nearest even: 1 + 2^-11 is a tie -> 1; 1 + 3*2^-11 -> 1 + 2^-9 */
    x[0] = 1.0f + 0x1p-11f;
    x[1] = 1.0f + 3 * 0x1p-11f;
    uint8_t h[4];
    CHECK_OK(pkv_quantize_row(PKV_TYPE_F16, x, h, 2));
    CHECK_INT(h[0] | h[1] << 8, 0x3c00);
    CHECK_INT(h[2] | h[3] << 8, 0x3c02);
    CHECK_OK(pkv_quantize_row(PKV_TYPE_BF16, x, h, 2));
    CHECK_INT(h[0] | h[1] << 8, 0x3f80);
}

static void test_dot_and_errors(void) {
    uint64_t seed = 7;
    float w[512], x[512], d[512];
    uint8_t q[2048];
    for (int j = 0; j < 512; j++) {
        w[j] = th_randf(&seed);
        x[j] = th_randf(&seed);
    }
    const pkv_type types[] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_BF16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0, PKV_TYPE_Q4_K,
                              PKV_TYPE_Q5_K, PKV_TYPE_Q6_K, PKV_TYPE_Q8_K, PKV_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        CHECK_OK(pkv_quantize_row(types[i], w, q, 512));
        CHECK_OK(pkv_dequantize_row(types[i], q, d, 512));
        double want = 0;
        for (int j = 0; j < 512; j++) want += (double)d[j] * (double)x[j];
        CHECK_NEAR(pkv_dot_ref(types[i], q, x, 512), want, 1e-9);
    }
    CHECK_STATUS(pkv_dequantize_row(PKV_TYPE_Q8_0, q, d, 33), PKV_ERR_INVALID);
    CHECK_MSG("q8_0");
    CHECK_STATUS(pkv_quantize_row(PKV_TYPE_Q4_K, w, q, 128), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_dequantize_row(PKV_TYPE_I32, q, d, 4), PKV_ERR_UNSUPPORTED);
    CHECK_STATUS(pkv_dequantize_row((pkv_type)9, q, d, 32), PKV_ERR_UNSUPPORTED); /* q8_1: not a weight type */
    CHECK_STATUS(pkv_dequantize_row(PKV_TYPE_MXFP4, q, d, 16), PKV_ERR_INVALID);
    CHECK(isnan(pkv_dot_ref(PKV_TYPE_Q8_0, q, x, 31)));
}

int main(void) {
    test_simple_types();
    test_q4_k();
    test_q5_k();
    test_q6_k();
    test_q8_k();
    test_mxfp4();
    test_kv_quantize_blocks();
    test_round_trip();
    test_dot_and_errors();
    return th_done();
}
