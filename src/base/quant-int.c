/* Decoders of the block types with an integer form (quant.h, pkv_qblock):
 * element i = d[i/16] * q[i] (+ m[i/16]). Layouts (GGUF, little-endian, packed;
 * "element e" counts from the block's start):
 *
 *   q4_1  { f16 d, m; u8 qs[16] }                 32 el, 20 B: e < 16 is qs[e] & 15,
 *         e >= 16 is qs[e-16] >> 4;  x = d*q + m
 *   q5_0  { f16 d; u8 qh[4]; u8 qs[16] }          32 el, 22 B: as q4_1 plus bit e of the
 *         32-bit qh as the fifth bit;  x = d*(q - 16)
 *   q5_1  { f16 d, m; u8 qh[4]; u8 qs[16] }       32 el, 24 B: x = d*q + m
 *   q2_k  { u8 scales[16]; u8 qs[64]; f16 d, dmin }  256 el, 84 B: e = 128h + 32j + l
 *         (l < 32) is (qs[32h + l] >> 2j) & 3; group g = e/16 has scale byte
 *         s = scales[g]: x = (d*(s & 15))*q - dmin*(s >> 4)
 *   q3_k  { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }  256 el, 110 B: e = 128h +
 *         32j + l is ((qs[32h + l] >> 2j) & 3) - 4, plus 4 if hmask[l] bit 4h + j is set;
 *         group g has the 6-bit scale (scales[g % 8] >> 4(g / 8)) & 15 |
 *         ((scales[8 + g % 4] >> 2(g / 4)) & 3) << 4, minus 32: x = (d*sc)*q
 *   iq2_xxs { f16 d; u8 qs[64] }                   256 el, 66 B: per 32 elements (ib) two
 *         u32 a = qs[8ib..], b = qs[8ib+4..]: 8-value group l (0..3) is grid entry
 *         byte l of a with sign byte ksigns[(b >> 7l) & 127]; x = (d*(0.5 + (b>>28))*0.25)*q
 *   iq2_xs  { f16 d; u16 qs[32]; u8 scales[8] }    256 el, 74 B: group l of ib is
 *         qs[4ib + l]: grid index & 511, ksigns[>> 9]; scale nibble (l < 2 ? low : high)
 *         of scales[ib]: x = (d*(0.5 + s)*0.25)*q
 *   iq2_s   { f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8] }  256 el, 82 B:
 *         group l of ib: index qs[4ib + l] | ((qh[ib] >> 2l) & 3) << 8, sign byte
 *         signs[4ib + l]; scales as iq2_xs
 *   iq3_xxs { f16 d; u8 qs[64]; u8 ss[32] }        256 el, 98 B: u32 a = ss[4ib..]; group
 *         l of ib: two 4-value entries qs[8ib + 2l], qs[8ib + 2l + 1], signs
 *         ksigns[(a >> 7l) & 127]; x = (d*(0.5 + (a >> 28))*0.5)*q
 *   iq3_s   { f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4] }  256 el, 110 B:
 *         group l of ib: entries qs[8ib + 2l] | ((qh[ib] >> 2l) & 1) << 8 and
 *         qs[8ib + 2l + 1] | ((qh[ib] >> (2l+1)) & 1) << 8, signs[4ib + l];
 *         x = (d*(1 + 2*s))*q with s the nibble ib % 2 of scales[ib / 2]
 *   iq1_s   { f16 d; u8 qs[32]; u16 qh[8] }        256 el, 50 B: group l of ib is grid
 *         entry qs[4ib + l] | ((qh[ib] >> 3l) & 7) << 8 (values -1, 0, 1);
 *         x = (d*(2*((qh[ib] >> 12) & 7) + 1)) * (v + delta), delta = -1/8 if qh[ib]
 *         bit 15 is set, else 1/8. Integer form: q = 8v +- 1, scale d*(2s+1)/8 (exact)
 *   iq1_m   { u8 qs[32]; u8 qh[16]; u16 sc[4] }     256 el, 56 B: d is the f16 made of
 *         the top nibbles of sc[0..3] (sc[0] lowest); group l of ib is entry
 *         qs[4ib + l] | ((qh[2ib + l/2] >> 4(l%2)) & 7) << 8, its delta negative if
 *         bit 3 of that nibble is set; groups 0-1 of ib have scale bits
 *         (sc[ib/2] >> 6(ib%2)) & 7, groups 2-3 the next 3 bits: x = (d*(2s+1))*(v + delta)
 *   iq4_nl  { f16 d; u8 qs[16] }                    32 el, 18 B: nibbles as q4_0, each an
 *         index into pkv_iq4nl_values; x = d*value
 *   iq4_xs  { f16 d; u16 sh; u8 sl[4]; u8 qs[128] } 256 el, 136 B: group of 32 ib has
 *         scale ((sl[ib/2] >> 4(ib%2)) & 15) | ((sh >> 2ib) & 3) << 4, minus 32; its
 *         nibbles (qs[16ib..]) as iq4_nl: x = (d*sc)*value
 *   tq1_0   { u8 qs[48]; u8 qh[4]; f16 d }          256 el, 54 B: bytes hold base-3 digits
 *         as fixed-point fractions: digit n of byte b is ((u8)(b * 3^n) * 3) >> 8.
 *         e < 160: byte qs[e % 32], digit e / 32; e < 240: qs[32 + (e-160) % 16], digit
 *         (e-160) / 16; else qh[(e-240) % 4], digit (e-240) / 4. x = (digit - 1)*d
 *   tq2_0   { u8 qs[64]; f16 d }                    256 el, 66 B: e = 128h + 32l + m is
 *         (qs[32h + m] >> 2l) & 3; x = (q - 1)*d
 *
 * In the grid types each 8-value group is the grid entry's values with the signs
 * of its sign byte (bit j set: value j negated). */
#include "base/quant.h"

#include "base/base.h"
#include "base/iq-grids.h"

#include <pthread.h>
#include <string.h>

const int8_t pkv_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ------------------------------------------------------------------ tables */

static const uint32_t k_iq2xxs_words[PKV_IQ2XXS_GRID_WORDS] = {PKV_IQ2XXS_GRID};
static const uint32_t k_iq2xs_words[PKV_IQ2XS_GRID_WORDS] = {PKV_IQ2XS_GRID};
static const uint32_t k_iq2s_words[PKV_IQ2S_GRID_WORDS] = {PKV_IQ2S_GRID};
static const uint32_t k_iq3xxs_words[PKV_IQ3XXS_GRID_WORDS] = {PKV_IQ3XXS_GRID};
static const uint32_t k_iq3s_words[PKV_IQ3S_GRID_WORDS] = {PKV_IQ3S_GRID};
static const uint32_t k_iq1s_words[PKV_IQ1S_GRID_WORDS] = {PKV_IQ1S_GRID};

static pkv_iq_tables g_tables;
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

static unsigned code_of(const uint32_t *words, int i) { return (words[i / 2] >> (16 * (i & 1))) & 0xffff; }

/* Entry i of an 8-value grid of 2-bit codes into vals, as 8 little-endian bytes. */
static uint64_t expand8(const uint32_t *words, int i, const uint8_t vals[3]) {
    const unsigned c = code_of(words, i);
    uint64_t e = 0;
    for (int j = 0; j < 8; j++) e |= (uint64_t)vals[(c >> (2 * j)) & 3] << (8 * j);
    return e;
}

static uint32_t expand4(const uint32_t *words, int i, const uint8_t vals[8]) {
    const unsigned c = code_of(words, i);
    uint32_t e = 0;
    for (int j = 0; j < 4; j++) e |= (uint32_t)vals[(c >> (3 * j)) & 7] << (8 * j);
    return e;
}

static void tables_init(void) {
    static const uint8_t v2[3] = {8, 25, 43}, v1[3] = {0xff, 0, 1};
    static const uint8_t v3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62}, v3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
    pkv_iq_tables *t = &g_tables;
    for (int i = 0; i < 256; i++) t->iq2xxs[i] = expand8(k_iq2xxs_words, i, v2);
    for (int i = 0; i < 512; i++) t->iq2xs[i] = expand8(k_iq2xs_words, i, v2);
    for (int i = 0; i < 1024; i++) t->iq2s[i] = expand8(k_iq2s_words, i, v2);
    for (int i = 0; i < 256; i++) t->iq3xxs[i] = expand4(k_iq3xxs_words, i, v3xxs);
    for (int i = 0; i < 512; i++) t->iq3s[i] = expand4(k_iq3s_words, i, v3s);
    for (int i = 0; i < 2048; i++) t->iq1s[i] = expand8(k_iq1s_words, i, v1);
    for (int s = 0; s < 128; s++) t->ksigns[s] = (uint8_t)(s | (__builtin_popcount((unsigned)s) & 1) << 7);
}

const pkv_iq_tables *pkv_iq_tables_get(void) {
    pthread_once(&g_tables_once, tables_init);
    return &g_tables;
}

/* ---------------------------------------------------------------- helpers */

static float rd_f16(const uint8_t *p) { return pkv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static unsigned rd16(const uint8_t *p) { return (unsigned)(p[0] | p[1] << 8); }

static void set_d(pkv_qblock *o, int g0, int n, float d) {
    for (int g = g0; g < g0 + n; g++) o->d[g] = d;
}
static void no_min(pkv_qblock *o, int n) { memset(o->m, 0, (size_t)n * sizeof(float)); }

/* 8 values of a grid entry (bytes of e) with the signs of byte s. */
static void signed8(int8_t *q, uint64_t e, unsigned s) {
    for (int j = 0; j < 8; j++) {
        const int v = (int)((e >> (8 * j)) & 0xff);
        q[j] = (int8_t)(s >> j & 1 ? -v : v);
    }
}
static void signed4x2(int8_t *q, uint32_t e0, uint32_t e1, unsigned s) {
    signed8(q, (uint64_t)e0 | (uint64_t)e1 << 32, s);
}

/* ---------------------------------------------------------- 32-elem types */

static void dec_q4_1(const uint8_t *b, pkv_qblock *o) {
    const float d = rd_f16(b), m = rd_f16(b + 2);
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(b[4 + j] & 15);
        o->q[j + 16] = (int8_t)(b[4 + j] >> 4);
    }
    set_d(o, 0, 2, d);
    o->m[0] = o->m[1] = m;
}

static void dec_q5(const uint8_t *b, pkv_qblock *o, bool with_min) {
    const float d = rd_f16(b);
    const uint8_t *p = b + (with_min ? 4 : 2);
    const uint32_t qh = rd32(p);
    const int off = with_min ? 0 : 16;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(((p[4 + j] & 15) | ((qh >> j) & 1) << 4) - off);
        o->q[j + 16] = (int8_t)(((p[4 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - off);
    }
    set_d(o, 0, 2, d);
    if (with_min)
        o->m[0] = o->m[1] = rd_f16(b + 2);
    else
        no_min(o, 2);
}
static void dec_q5_0(const uint8_t *b, pkv_qblock *o) { dec_q5(b, o, false); }
static void dec_q5_1(const uint8_t *b, pkv_qblock *o) { dec_q5(b, o, true); }

static void dec_iq4_nl(const uint8_t *b, pkv_qblock *o) {
    for (int j = 0; j < 16; j++) {
        o->q[j] = pkv_iq4nl_values[b[2 + j] & 15];
        o->q[j + 16] = pkv_iq4nl_values[b[2 + j] >> 4];
    }
    set_d(o, 0, 2, rd_f16(b));
    no_min(o, 2);
}

/* ---------------------------------------------------------------- k-quants */

static void dec_q2_k(const uint8_t *b, pkv_qblock *o) {
    const uint8_t *sc = b, *qs = b + 16;
    const float d = rd_f16(b + 80), dmin = rd_f16(b + 82);
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, j = (e / 32) % 4, l = e % 32;
        o->q[e] = (int8_t)((qs[32 * h + l] >> (2 * j)) & 3);
    }
    for (int g = 0; g < 16; g++) {
        o->d[g] = d * (float)(sc[g] & 15);
        o->m[g] = -(dmin * (float)(sc[g] >> 4));
    }
}

static void dec_q3_k(const uint8_t *b, pkv_qblock *o) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    const float d = rd_f16(b + 108);
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, j = (e / 32) % 4, l = e % 32;
        const int lo = (qs[32 * h + l] >> (2 * j)) & 3, hi = (hm[l] >> (4 * h + j)) & 1;
        o->q[e] = (int8_t)(lo - (hi ? 0 : 4));
    }
    for (int g = 0; g < 16; g++) {
        const int s = ((sc[g % 8] >> (4 * (g / 8))) & 15) | ((sc[8 + g % 4] >> (2 * (g / 4))) & 3) << 4;
        o->d[g] = d * (float)(s - 32);
    }
    no_min(o, 16);
}

/* ------------------------------------------------------------------ i-quants */

static void dec_iq2_xxs(const uint8_t *b, pkv_qblock *o) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    const float d = rd_f16(b);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *p = b + 2 + 8 * ib;
        const uint32_t s = rd32(p + 4);
        for (int l = 0; l < 4; l++) signed8(o->q + 32 * ib + 8 * l, t->iq2xxs[p[l]], t->ksigns[(s >> (7 * l)) & 127]);
        set_d(o, 2 * ib, 2, d * (0.5f + (float)(s >> 28)) * 0.25f);
    }
    no_min(o, 16);
}

static void dec_iq2_xs(const uint8_t *b, pkv_qblock *o) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    const float d = rd_f16(b);
    for (int ib = 0; ib < 8; ib++) {
        for (int l = 0; l < 4; l++) {
            const unsigned v = rd16(b + 2 + 2 * (4 * ib + l));
            signed8(o->q + 32 * ib + 8 * l, t->iq2xs[v & 511], t->ksigns[v >> 9]);
        }
        const unsigned sc = b[66 + ib];
        o->d[2 * ib] = d * (0.5f + (float)(sc & 15)) * 0.25f;
        o->d[2 * ib + 1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    }
    no_min(o, 16);
}

static void dec_iq2_s(const uint8_t *b, pkv_qblock *o) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    const float d = rd_f16(b);
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
    for (int ib = 0; ib < 8; ib++) {
        for (int l = 0; l < 4; l++) {
            const unsigned idx = qs[4 * ib + l] | ((qh[ib] >> (2 * l)) & 3u) << 8;
            signed8(o->q + 32 * ib + 8 * l, t->iq2s[idx], signs[4 * ib + l]);
        }
        o->d[2 * ib] = d * (0.5f + (float)(scales[ib] & 15)) * 0.25f;
        o->d[2 * ib + 1] = d * (0.5f + (float)(scales[ib] >> 4)) * 0.25f;
    }
    no_min(o, 16);
}

static void dec_iq3_xxs(const uint8_t *b, pkv_qblock *o) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    const float d = rd_f16(b);
    const uint8_t *qs = b + 2, *ss = b + 66;
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t a = rd32(ss + 4 * ib);
        for (int l = 0; l < 4; l++)
            signed4x2(o->q + 32 * ib + 8 * l, t->iq3xxs[qs[8 * ib + 2 * l]], t->iq3xxs[qs[8 * ib + 2 * l + 1]],
                      t->ksigns[(a >> (7 * l)) & 127]);
        set_d(o, 2 * ib, 2, d * (0.5f + (float)(a >> 28)) * 0.5f);
    }
    no_min(o, 16);
}

static void dec_iq3_s(const uint8_t *b, pkv_qblock *o) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    const float d = rd_f16(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
    for (int ib = 0; ib < 8; ib++) {
        for (int l = 0; l < 4; l++) {
            const unsigned i0 = qs[8 * ib + 2 * l] | ((qh[ib] >> (2 * l)) & 1u) << 8;
            const unsigned i1 = qs[8 * ib + 2 * l + 1] | ((qh[ib] >> (2 * l + 1)) & 1u) << 8;
            signed4x2(o->q + 32 * ib + 8 * l, t->iq3s[i0], t->iq3s[i1], signs[4 * ib + l]);
        }
        set_d(o, 2 * ib, 2, d * (float)(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 15)));
    }
    no_min(o, 16);
}

/* iq1: value v in {-1, 0, 1} plus delta = +-1/8 as the integer 8v +- 1 (the
 * scale carries the 1/8, an exact division). */
static void iq1_group(int8_t *q, uint64_t e, bool neg) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * (int8_t)(e >> (8 * j)) + (neg ? -1 : 1));
}

static void dec_iq1_s(const uint8_t *b, pkv_qblock *o) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    const float d = rd_f16(b);
    for (int ib = 0; ib < 8; ib++) {
        const unsigned h = rd16(b + 34 + 2 * ib);
        for (int l = 0; l < 4; l++) iq1_group(o->q + 32 * ib + 8 * l, t->iq1s[b[2 + 4 * ib + l] | ((h >> (3 * l)) & 7) << 8], h & 0x8000);
        set_d(o, 2 * ib, 2, d * (float)(2 * ((h >> 12) & 7) + 1) * 0.125f);
    }
    no_min(o, 16);
}

static void dec_iq1_m(const uint8_t *b, pkv_qblock *o) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    const uint8_t *qs = b, *qh = b + 32;
    unsigned sc[4];
    for (int i = 0; i < 4; i++) sc[i] = rd16(b + 48 + 2 * i);
    const float d = pkv_f16_to_f32((uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000)));
    for (int ib = 0; ib < 8; ib++) {
        for (int l = 0; l < 4; l++) {
            const unsigned nib = (qh[2 * ib + l / 2] >> (4 * (l % 2))) & 15;
            iq1_group(o->q + 32 * ib + 8 * l, t->iq1s[qs[4 * ib + l] | (nib & 7) << 8], nib & 8);
        }
        const unsigned s = sc[ib / 2] >> (6 * (ib % 2));
        o->d[2 * ib] = d * (float)(2 * (s & 7) + 1) * 0.125f;
        o->d[2 * ib + 1] = d * (float)(2 * ((s >> 3) & 7) + 1) * 0.125f;
    }
    no_min(o, 16);
}

static void dec_iq4_xs(const uint8_t *b, pkv_qblock *o) {
    const float d = rd_f16(b);
    const unsigned sh = rd16(b + 2);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *qs = b + 8 + 16 * ib;
        for (int j = 0; j < 16; j++) {
            o->q[32 * ib + j] = pkv_iq4nl_values[qs[j] & 15];
            o->q[32 * ib + j + 16] = pkv_iq4nl_values[qs[j] >> 4];
        }
        const int ls = (int)(((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4);
        set_d(o, 2 * ib, 2, d * (float)(ls - 32));
    }
    no_min(o, 16);
}

/* ------------------------------------------------------------------ ternary */

static int trit(uint8_t byte, int n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return (((uint8_t)(byte * pow3[n])) * 3) >> 8;
}

static void dec_tq1_0(const uint8_t *b, pkv_qblock *o) {
    for (int e = 0; e < 256; e++) {
        int v;
        if (e < 160)
            v = trit(b[e % 32], e / 32);
        else if (e < 240)
            v = trit(b[32 + (e - 160) % 16], (e - 160) / 16);
        else
            v = trit(b[48 + (e - 240) % 4], (e - 240) / 4);
        o->q[e] = (int8_t)(v - 1);
    }
    set_d(o, 0, 16, rd_f16(b + 52));
    no_min(o, 16);
}

static void dec_tq2_0(const uint8_t *b, pkv_qblock *o) {
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, l = (e / 32) % 4, m = e % 32;
        o->q[e] = (int8_t)(((b[32 * h + m] >> (2 * l)) & 3) - 1);
    }
    set_d(o, 0, 16, rd_f16(b + 64));
    no_min(o, 16);
}

pkv_qblock_fn pkv_qblock_decoder(pkv_type t) {
    switch (t) {
    case PKV_TYPE_Q4_1: return dec_q4_1;
    case PKV_TYPE_Q5_0: return dec_q5_0;
    case PKV_TYPE_Q5_1: return dec_q5_1;
    case PKV_TYPE_Q2_K: return dec_q2_k;
    case PKV_TYPE_Q3_K: return dec_q3_k;
    case PKV_TYPE_IQ2_XXS: return dec_iq2_xxs;
    case PKV_TYPE_IQ2_XS: return dec_iq2_xs;
    case PKV_TYPE_IQ2_S: return dec_iq2_s;
    case PKV_TYPE_IQ3_XXS: return dec_iq3_xxs;
    case PKV_TYPE_IQ3_S: return dec_iq3_s;
    case PKV_TYPE_IQ1_S: return dec_iq1_s;
    case PKV_TYPE_IQ1_M: return dec_iq1_m;
    case PKV_TYPE_IQ4_NL: return dec_iq4_nl;
    case PKV_TYPE_IQ4_XS: return dec_iq4_xs;
    case PKV_TYPE_TQ1_0: return dec_tq1_0;
    case PKV_TYPE_TQ2_0: return dec_tq2_0;
    default: return NULL;
    }
}

bool pkv_qblock_has_min(pkv_type t) { return t == PKV_TYPE_Q4_1 || t == PKV_TYPE_Q5_1 || t == PKV_TYPE_Q2_K; }
