// labels: unit
/* The GGUF block types beyond q8_0/q4_0/k-quants/mxfp4: q4_1, q5_0, q5_1, q2_k,
 * q3_k, the i-quants (iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s,
 * iq4_nl, iq4_xs) and tq1_0/tq2_0. Type ids and block geometry as GGUF states
 * them; dequantization of hand-built blocks with the values worked out here;
 * dequantization of random blocks pinned to hashes of what GGUF's reference
 * dequantizer (ggml's, run once when the test was written) gives for the same
 * bytes, bit for bit; the i-quant grids pinned the same way; quantize ->
 * dequantize error bounds; pkv_dot_ref against a double-precision sum; errors. */
#include "testhelp.h"

#include "base/quant.h"

static void put16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static const struct { pkv_type t; int f16[2]; } pin_f16[] = {
    {PKV_TYPE_Q4_1, {0, 2}},   {PKV_TYPE_Q5_0, {0, -1}},   {PKV_TYPE_Q5_1, {0, 2}},   {PKV_TYPE_Q2_K, {80, 82}},
    {PKV_TYPE_Q3_K, {108, -1}}, {PKV_TYPE_IQ2_XXS, {0, -1}}, {PKV_TYPE_IQ2_XS, {0, -1}}, {PKV_TYPE_IQ2_S, {0, -1}},
    {PKV_TYPE_IQ3_XXS, {0, -1}}, {PKV_TYPE_IQ3_S, {0, -1}},  {PKV_TYPE_IQ1_S, {0, -1}},  {PKV_TYPE_IQ1_M, {-1, -1}},
    {PKV_TYPE_IQ4_NL, {0, -1}}, {PKV_TYPE_IQ4_XS, {0, -1}}, {PKV_TYPE_TQ1_0, {52, -1}}, {PKV_TYPE_TQ2_0, {64, -1}},
};
/* Random bytes, with the f16 scales set to finite values (iq1_m keeps its in the
 * top nibbles of its four scale words). */
static void pin_block(int k, uint8_t *b, uint64_t *seed) {
    const size_t bb = pkv_type_block_bytes(pin_f16[k].t);
    for (size_t i = 0; i < bb; i++) b[i] = (uint8_t)th_rand(seed);
    for (int f = 0; f < 2; f++)
        if (pin_f16[k].f16[f] >= 0) {
            const uint16_t h = pkv_f32_to_f16(th_randf(seed) * 0.05f);
            b[pin_f16[k].f16[f]] = (uint8_t)h;
            b[pin_f16[k].f16[f] + 1] = (uint8_t)(h >> 8);
        }
    if (pin_f16[k].t == PKV_TYPE_IQ1_M) {
        const uint16_t h = pkv_f32_to_f16(th_randf(seed) * 0.05f);
        for (int i = 0; i < 4; i++) b[49 + 2 * i] = (uint8_t)((b[49 + 2 * i] & 15) | ((h >> (4 * i)) & 15) << 4);
    }
}
static uint64_t pin_hash(const float *y, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = 0;
        if (y[i] != 0) memcpy(&u, &y[i], 4);
        for (int k = 0; k < 4; k++) h = (h ^ ((u >> (8 * k)) & 255)) * 0x100000001b3ull;
    }
    return h;
}

static const uint64_t pin_want[16] = {
    0xedf51c8bf60c231dull, /* q4_1 */
    0x9bf2db896a53f630ull, /* q5_0 */
    0x066d9d341a8e891cull, /* q5_1 */
    0xa302e26940477759ull, /* q2_k */
    0xf925603743695564ull, /* q3_k */
    0x9d223f6107e2f779ull, /* iq2_xxs */
    0xa73fc4f58968ba3dull, /* iq2_xs */
    0x3b6435903eca99e1ull, /* iq2_s */
    0x2b55e8e1ac7134cfull, /* iq3_xxs */
    0xab50792a806951aaull, /* iq3_s */
    0x9794b835b51c3be6ull, /* iq1_s */
    0x5243b0ccbd911591ull, /* iq1_m */
    0x0ae0acd6db4134afull, /* iq4_nl */
    0x736b134b0fbde5ccull, /* iq4_xs */
    0xe00b35da97a457f5ull, /* tq1_0 */
    0xec2ca5cf81025923ull, /* tq2_0 */
};

static void test_table(void) {
    static const struct {
        const char *name;
        int id;
        size_t elems, bytes;
    } want[] = {
        {"q4_1", 3, 32, 20},      {"q5_0", 6, 32, 22},      {"q5_1", 7, 32, 24},     {"q2_k", 10, 256, 84},
        {"q3_k", 11, 256, 110},   {"iq2_xxs", 16, 256, 66}, {"iq2_xs", 17, 256, 74}, {"iq3_xxs", 18, 256, 98},
        {"iq1_s", 19, 256, 50},   {"iq4_nl", 20, 32, 18},   {"iq3_s", 21, 256, 110}, {"iq2_s", 22, 256, 82},
        {"iq4_xs", 23, 256, 136}, {"iq1_m", 29, 256, 56},   {"tq1_0", 34, 256, 54},  {"tq2_0", 35, 256, 66},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        pkv_type t;
        CHECK_OK(pkv_type_from_name(want[i].name, &t));
        CHECK_INT((int)t, want[i].id);
        CHECK(strcmp(pkv_type_name(t), want[i].name) == 0);
        CHECK_INT(pkv_type_block_elems(t), want[i].elems);
        CHECK_INT(pkv_type_block_bytes(t), want[i].bytes);
        CHECK(pkv_qblock_decoder(t) != NULL);
    }
    CHECK_INT(PKV_TYPE_IQ4_XS, 23);
    CHECK_INT(PKV_TYPE_TQ2_0, 35);
    CHECK(pkv_type_name((pkv_type)9) == NULL); /* q8_1: not a weight type of GGUF files */
    CHECK(pkv_type_name((pkv_type)40) == NULL);
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_Q3_K, 512), 220);
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_Q3_K, 320), 0); /* not a whole super-block */
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_IQ4_NL, 96), 54);
}

static uint64_t fnv(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The expanded grids equal GGUF's tables (hashes of their little-endian bytes). */
static void test_grids(void) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    CHECK(fnv(t->iq2xxs, sizeof t->iq2xxs) == 0xbb4ee025b5ac6e8eull);
    CHECK(fnv(t->iq2xs, sizeof t->iq2xs) == 0xc9b1ee61e79909bdull);
    CHECK(fnv(t->iq2s, sizeof t->iq2s) == 0x123edd38a3b62b90ull);
    CHECK(fnv(t->iq3xxs, sizeof t->iq3xxs) == 0xdfa5dc83d6a155d5ull);
    CHECK(fnv(t->iq3s, sizeof t->iq3s) == 0xfa37020c25b44829ull);
    CHECK(fnv(t->iq1s, sizeof t->iq1s) == 0x6703ed863501ae2eull);
    CHECK(fnv(t->ksigns, sizeof t->ksigns) == 0xf19ba8f8c3292ba5ull);
    CHECK(t->iq2xxs[0] == 0x0808080808080808ull && t->iq2xxs[1] == 0x080808080808082bull);
    CHECK(t->iq2s[1023] == 0x2b2b2b2b2b2b2b2bull);
    CHECK(t->iq3xxs[255] == 0x3e341c04u && t->iq3s[1] == 0x01010103u);
    CHECK(t->iq1s[0] == ~0ull && t->iq1s[2047] == 0x0101010101010101ull);
    CHECK_INT(t->ksigns[1], 0x81);
    CHECK_INT(t->ksigns[3], 0x03);
}

static void test_pinned(void) {
    for (int k = 0; k < 16; k++) {
        uint64_t seed = 1000 + (uint64_t)k;
        const pkv_type t = pin_f16[k].t;
        const size_t bb = pkv_type_block_bytes(t), be = pkv_type_block_elems(t);
        uint8_t b[8 * 136];
        float y[8 * 256];
        for (int i = 0; i < 8; i++) pin_block(k, b + (size_t)i * bb, &seed);
        CHECK_OK(pkv_dequantize_row(t, b, y, (int64_t)(8 * be)));
        if (pin_hash(y, 8 * be) != pin_want[k]) TH_FAIL("%s: dequantized random blocks differ from GGUF's reference", pkv_type_name(t));
        th_checks++;
    }
}

static void check_exact(pkv_type t, const uint8_t *blk, const float *want, int n) {
    float got[256];
    CHECK_OK(pkv_dequantize_row(t, blk, got, n));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < 4) TH_FAIL("%s element %d: %.9g, want %.9g", pkv_type_name(t), i, got[i], want[i]);
    th_checks++;
}

static const float KV[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void test_hand_blocks(void) {
    uint8_t b[256];
    float w[256];
    /* q4_1: d = 0.5, m = -1; nibbles j (low) and 15 - j (high) */
    put16(b, 0x3800);
    put16(b + 2, 0xbc00);
    for (int j = 0; j < 16; j++) {
        b[4 + j] = (uint8_t)(j | (15 - j) << 4);
        w[j] = 0.5f * (float)j - 1.0f;
        w[j + 16] = 0.5f * (float)(15 - j) - 1.0f;
    }
    check_exact(PKV_TYPE_Q4_1, b, w, 32);
    /* q5_0: d = 0.25; fifth bits of elements 0 and 31 set; nibbles j, j */
    put16(b, 0x3400);
    b[2] = 1, b[3] = 0, b[4] = 0, b[5] = 0x80;
    for (int j = 0; j < 16; j++) {
        b[6 + j] = (uint8_t)(j | j << 4);
        w[j] = 0.25f * (float)(j - 16);
        w[j + 16] = 0.25f * (float)(j - 16);
    }
    w[0] = 0.0f, w[31] = 0.25f * 15.0f;
    check_exact(PKV_TYPE_Q5_0, b, w, 32);
    /* q5_1: d = 0.5, m = 2; the same quants without the -16 */
    put16(b, 0x3800);
    put16(b + 2, 0x4000);
    b[4] = 1, b[5] = 0, b[6] = 0, b[7] = 0x80;
    for (int j = 0; j < 16; j++) {
        b[8 + j] = (uint8_t)(j | j << 4);
        w[j] = 0.5f * (float)j + 2.0f;
        w[j + 16] = 0.5f * (float)j + 2.0f;
    }
    w[0] = 0.5f * 16.0f + 2.0f, w[31] = 0.5f * 31.0f + 2.0f;
    check_exact(PKV_TYPE_Q5_1, b, w, 32);
    /* q2_k: group g has scale g and min 1; d = 1, dmin = 0.5; every byte 0xe4
     * holds q = j at shift 2j, so element 128h + 32j + l is j */
    for (int g = 0; g < 16; g++) b[g] = (uint8_t)(g | 1 << 4);
    memset(b + 16, 0xe4, 64);
    put16(b + 80, 0x3c00);
    put16(b + 82, 0x3800);
    for (int e = 0; e < 256; e++) w[e] = (float)(e / 16) * (float)((e / 32) % 4) - 0.5f;
    check_exact(PKV_TYPE_Q2_K, b, w, 256);
    /* q3_k: group g has the 6-bit scale 32 + g - 8 (low nibble in byte g % 8 at
     * bit 4(g/8), high bits in byte 8 + g % 4 at bit 2(g/4)); d = 0.5; low bits
     * j as above, every high bit set (no -4) except element 128 + 32 + 3 */
    memset(b, 0xff, 32);
    b[3] = (uint8_t)~(1 << 5);
    memset(b + 32, 0xe4, 64);
    memset(b + 96, 0, 12);
    for (int g = 0; g < 16; g++) {
        const int s6 = 32 + g - 8;
        b[96 + g % 8] |= (uint8_t)((s6 & 15) << (4 * (g / 8)));
        b[96 + 8 + g % 4] |= (uint8_t)((s6 >> 4) << (2 * (g / 4)));
    }
    put16(b + 108, 0x3800);
    for (int e = 0; e < 256; e++) w[e] = 0.5f * (float)(e / 16 - 8) * (float)((e / 32) % 4);
    w[163] = 0.5f * 2.0f * -3.0f;
    check_exact(PKV_TYPE_Q3_K, b, w, 256);
    /* iq4_nl: d = 0.5, nibbles j / 15 - j */
    put16(b, 0x3800);
    for (int j = 0; j < 16; j++) {
        b[2 + j] = (uint8_t)(j | (15 - j) << 4);
        w[j] = 0.5f * KV[j];
        w[j + 16] = 0.5f * KV[15 - j];
    }
    check_exact(PKV_TYPE_IQ4_NL, b, w, 32);
    /* iq4_xs: d = 1, group ib has scale 32 + ib - 4 (low nibbles in sl, high
     * bits in sh), nibbles as iq4_nl */
    memset(b, 0, 136);
    put16(b, 0x3c00);
    unsigned sh = 0;
    for (int ib = 0; ib < 8; ib++) {
        const int ls = 32 + ib - 4;
        b[4 + ib / 2] |= (uint8_t)((ls & 15) << (4 * (ib % 2)));
        sh |= (unsigned)(ls >> 4) << (2 * ib);
        for (int j = 0; j < 16; j++) {
            b[8 + 16 * ib + j] = (uint8_t)(j | (15 - j) << 4);
            w[32 * ib + j] = (float)(ib - 4) * KV[j];
            w[32 * ib + j + 16] = (float)(ib - 4) * KV[15 - j];
        }
    }
    put16(b + 2, sh);
    check_exact(PKV_TYPE_IQ4_XS, b, w, 256);
    /* tq2_0: d = 2; byte m of half h holds (m%3, (m+1)%3, (m+2)%3, 1) */
    for (int m = 0; m < 64; m++) b[m] = (uint8_t)(m % 32 % 3 | ((m % 32 + 1) % 3) << 2 | ((m % 32 + 2) % 3) << 4 | 1 << 6);
    put16(b + 64, 0x4000);
    for (int e = 0; e < 256; e++) {
        const int l = (e / 32) % 4, m = e % 32;
        w[e] = 2.0f * (float)((l == 3 ? 1 : (m + l) % 3) - 1);
    }
    check_exact(PKV_TYPE_TQ2_0, b, w, 256);
    /* tq1_0: every 5-digit byte 184 holds digits (2, 0, 1, 1, 0) (184 =
     * ceil((2*81 + 9 + 3) * 256 / 243)); every 4-digit byte 149 holds (1, 2, 0, 2);
     * d = 0.5 */
    static const int d5[5] = {2, 0, 1, 1, 0}, d4[4] = {1, 2, 0, 2};
    memset(b, 184, 48);
    memset(b + 48, 149, 4);
    put16(b + 52, 0x3800);
    for (int e = 0; e < 256; e++)
        w[e] = 0.5f * (float)((e < 160 ? d5[e / 32] : e < 240 ? d5[(e - 160) / 16] : d4[(e - 240) / 4]) - 1);
    check_exact(PKV_TYPE_TQ1_0, b, w, 256);
    /* iq2_xxs: d = 1; every group is grid entry 0 (eight 8s); in each 32 the first
     * group stores sign bits 0000001 (the implied eighth sign makes two: values 0
     * and 7 negative), scale 3: db = (0.5 + 3) / 4, values +-7 */
    memset(b, 0, 66);
    put16(b, 0x3c00);
    for (int ib = 0; ib < 8; ib++) {
        b[2 + 8 * ib + 4] = 1;
        b[2 + 8 * ib + 7] = 3 << 4;
        for (int j = 0; j < 32; j++) w[32 * ib + j] = j == 0 || j == 7 ? -7.0f : 7.0f;
    }
    check_exact(PKV_TYPE_IQ2_XXS, b, w, 256);
    /* iq1_s: d = 1; each 32 has scale bits 2 (dl = 5), delta +1/8; group 0 is
     * entry 1 (1, -1 x 7), the rest entry 0 (-1 x 8) */
    memset(b, 0, 50);
    put16(b, 0x3c00);
    for (int ib = 0; ib < 8; ib++) {
        b[2 + 4 * ib] = 1;
        put16(b + 34 + 2 * ib, 2 << 12);
        for (int j = 0; j < 32; j++) w[32 * ib + j] = j == 0 ? 5.0f * 1.125f : 5.0f * -0.875f;
    }
    check_exact(PKV_TYPE_IQ1_S, b, w, 256);
    /* ... and with the delta bit set in the last 32: delta -1/8 */
    put16(b + 34 + 14, 2 << 12 | 0x8000);
    for (int j = 0; j < 32; j++) w[224 + j] = j == 0 ? 5.0f * 0.875f : 5.0f * -1.125f;
    check_exact(PKV_TYPE_IQ1_S, b, w, 256);
}

static const pkv_type k_types[16] = {PKV_TYPE_Q4_1,   PKV_TYPE_Q5_0,   PKV_TYPE_Q5_1,    PKV_TYPE_Q2_K,
                                     PKV_TYPE_Q3_K,   PKV_TYPE_IQ2_XXS, PKV_TYPE_IQ2_XS, PKV_TYPE_IQ2_S,
                                     PKV_TYPE_IQ3_XXS, PKV_TYPE_IQ3_S, PKV_TYPE_IQ1_S,  PKV_TYPE_IQ1_M,
                                     PKV_TYPE_IQ4_NL, PKV_TYPE_IQ4_XS, PKV_TYPE_TQ1_0,  PKV_TYPE_TQ2_0};

/* Quantize -> dequantize on uniform data: bounds about 1.5x what the
 * quantizers reach (1-2 bit types are coarse by design). */
static void test_round_trip(void) {
    static const double bound[16] = {6e-3, 1.5e-3, 1.5e-3, 0.12, 3e-2, 0.17, 0.14, 0.09,
                                     5e-2, 3e-2,   0.3,    0.26, 8e-3, 8e-3, 0.38, 0.37};
    uint64_t seed = 5;
    float x[512], y[512];
    uint8_t q[2048];
    for (int i = 0; i < 16; i++) {
        const pkv_type t = k_types[i];
        for (int j = 0; j < 512; j++) x[j] = th_randf(&seed);
        CHECK_OK(pkv_quantize_row(t, x, q, 512));
        CHECK_OK(pkv_dequantize_row(t, q, y, 512));
        const double e = th_nmse(x, y, 512);
        if (!(e <= bound[i])) TH_FAIL("%s: round trip nmse %.3g > %.3g", pkv_type_name(t), e, bound[i]);
        th_checks++;
        for (int j = 0; j < 512; j++) x[j] = 0;
        CHECK_OK(pkv_quantize_row(t, x, q, 512));
        CHECK_OK(pkv_dequantize_row(t, q, y, 512));
        int bad = 0;
        for (int j = 0; j < 512; j++) bad += y[j] != 0.0f;
        if (bad) TH_FAIL("%s: a zero row does not come back zero (%d elements)", pkv_type_name(t), bad);
        th_checks++;
    }
}

/* pkv_dot_ref against the dequantized row summed in double. */
static void test_dot(void) {
    uint64_t seed = 9;
    float w[512], x[512], d[512];
    uint8_t q[2048];
    for (int j = 0; j < 512; j++) {
        w[j] = th_randf(&seed);
        x[j] = th_randf(&seed);
    }
    for (int i = 0; i < 16; i++) {
        const pkv_type t = k_types[i];
        CHECK_OK(pkv_quantize_row(t, w, q, 512));
        CHECK_OK(pkv_dequantize_row(t, q, d, 512));
        double want = 0;
        for (int j = 0; j < 512; j++) want += (double)d[j] * (double)x[j];
        CHECK_NEAR(pkv_dot_ref(t, q, x, 512), want, 1e-9);
    }
}

static void test_errors(void) {
    float x[320] = {0};
    uint8_t q[1024];
    CHECK_STATUS(pkv_quantize_row(PKV_TYPE_Q3_K, x, q, 320), PKV_ERR_INVALID);
    CHECK_MSG("q3_k blocks of 256");
    CHECK_STATUS(pkv_dequantize_row(PKV_TYPE_IQ4_NL, q, x, 48), PKV_ERR_INVALID);
    CHECK_MSG("iq4_nl blocks of 32");
    CHECK_STATUS(pkv_dequantize_row((pkv_type)9, q, x, 32), PKV_ERR_UNSUPPORTED);
}

int main(void) {
    test_table();
    test_grids();
    test_pinned();
    test_hand_blocks();
    test_round_trip();
    test_dot();
    test_errors();
    return th_done();
}
