// Element c of a weight row (starting at byte address `row` of wbuf) of a type
// with an integer form (src/base/quant.h, pkv_qblock; layouts in
// src/base/quant-int.c): q4_1 (3), q5_0 (6), q5_1 (7), q2_k (10), q3_k (11),
// iq2_xxs (16), iq2_xs (17), iq3_xxs (18), iq1_s (19), iq4_nl (20), iq3_s (21),
// iq2_s (22), iq4_xs (23), iq1_m (29), tq1_0 (34), tq2_0 (35). The element is
// decoded on its own (no per-block arrays: the shaders stay small enough for a
// CPU driver to compile quickly) to a small integer q with the scale d (and
// offset m) of its 16, computed in the same float operations as the C decoder,
// and the value is d*q (+ m) with `precise` (no fused multiply-add), so the
// values equal pkv_dequantize_row's bit for bit. Every block size is even, so rows start at even byte addresses and
// the f16 fields are read as halves; the rest byte by byte.
#define T_Q4_1 3u
#define T_Q5_0 6u
#define T_Q5_1 7u
#define T_Q2_K 10u
#define T_Q3_K 11u
#define T_IQ2_XXS 16u
#define T_IQ2_XS 17u
#define T_IQ3_XXS 18u
#define T_IQ1_S 19u
#define T_IQ4_NL 20u
#define T_IQ3_S 21u
#define T_IQ2_S 22u
#define T_IQ4_XS 23u
#define T_IQ1_M 29u
#define T_TQ1_0 34u
#define T_TQ2_0 35u

// The i-quant grids, bound as `grids` at byte offset pc.og: the words of
// src/base/iq-grids.h in its order (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s,
// iq1_s; pkv_vk_grids); entry i of a grid is the 16-bit code in half (i & 1) of
// its word i >> 1. (As constant arrays in the shader they took lavapipe 80 s to
// compile.)
#include "../../../base/iq-grids.h"
#define G_IQ2XXS 0u
#define G_IQ2XS (G_IQ2XXS + PKV_IQ2XXS_GRID_WORDS)
#define G_IQ2S (G_IQ2XS + PKV_IQ2XS_GRID_WORDS)
#define G_IQ3XXS (G_IQ2S + PKV_IQ2S_GRID_WORDS)
#define G_IQ3S (G_IQ3XXS + PKV_IQ3XXS_GRID_WORDS)
#define G_IQ1S (G_IQ3S + PKV_IQ3S_GRID_WORDS)
#define GCODE(G, i) ((grids.d[(pc.og >> 2) + (G) + ((i) >> 1)] >> (((i) & 1u) * 16u)) & 0xffffu)

const int IQ4NL[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
const int V2[4] = int[4](8, 25, 43, 0);
const int V3XXS[8] = int[8](4, 12, 20, 28, 36, 44, 52, 62);

// Bytes a .. a+3 as a little-endian word (a even).
uint u32_at(uint a) { return LDH(wbuf, a) | (LDH(wbuf, a + 2u) << 16); }

// 7 stored sign bits and the implied eighth (an even count of negatives).
uint ksigns(uint s) { return s | ((uint(bitCount(s)) & 1u) << 7); }

int signed_v(int v, uint signs, uint k) { return ((signs >> k) & 1u) != 0u ? -v : v; }

// Digit n of a tq1_0 byte: ((u8)(b * 3^n) * 3) >> 8.
int trit(uint b, uint n) {
    uint p = n == 0u ? 1u : n == 1u ? 3u : n == 2u ? 9u : n == 3u ? 27u : 81u;
    return int((((b * p) & 255u) * 3u) >> 8);
}

float wint(uint row, uint c, uint wtype) {
    int q;
    float d, m = 0.0;
    bool has_min = false;
    uint l = c & 31u;
    if (wtype == T_Q4_1 || wtype == T_Q5_0 || wtype == T_Q5_1 || wtype == T_IQ4_NL) {
        uint bb = wtype == T_Q4_1 ? 20u : wtype == T_Q5_0 ? 22u : wtype == T_Q5_1 ? 24u : 18u;
        uint blk = row + (c >> 5) * bb, sh = l < 16u ? 0u : 4u;
        d = half_to_float(LDH(wbuf, blk));
        if (wtype == T_IQ4_NL) {
            q = IQ4NL[(LDB(wbuf, blk + 2u + (l & 15u)) >> sh) & 15u];
        } else if (wtype == T_Q4_1) {
            has_min = true;
            m = half_to_float(LDH(wbuf, blk + 2u));
            q = int((LDB(wbuf, blk + 4u + (l & 15u)) >> sh) & 15u);
        } else {
            bool q51 = wtype == T_Q5_1;
            uint p = blk + (q51 ? 4u : 2u);
            uint hi = (LDB(wbuf, p + (l >> 3)) >> (l & 7u)) & 1u;
            q = int(((LDB(wbuf, p + 4u + (l & 15u)) >> sh) & 15u) | (hi << 4)) - (q51 ? 0 : 16);
            if (q51) {
                has_min = true;
                m = half_to_float(LDH(wbuf, blk + 2u));
            }
        }
    } else {
        uint bb = wtype == T_Q2_K ? 84u : wtype == T_Q3_K ? 110u : wtype == T_IQ2_XXS ? 66u : wtype == T_IQ2_XS ? 74u
                : wtype == T_IQ3_XXS ? 98u : wtype == T_IQ1_S ? 50u : wtype == T_IQ3_S ? 110u : wtype == T_IQ2_S ? 82u
                : wtype == T_IQ4_XS ? 136u : wtype == T_IQ1_M ? 56u : wtype == T_TQ1_0 ? 54u : 66u;
        // element e of the block: group of 32 j, its group of 8 l8 and place k, 16-group g16
        uint blk = row + (c >> 8) * bb, e = c & 255u, j = e >> 5, l8 = (e >> 3) & 3u, k = e & 7u, g16 = e >> 4;
        if (wtype == T_Q2_K) {
            float dd = half_to_float(LDH(wbuf, blk + 80u)), dmin = half_to_float(LDH(wbuf, blk + 82u));
            q = int((LDB(wbuf, blk + 16u + 32u * (e >> 7) + l) >> (2u * (j & 3u))) & 3u);
            uint sc = LDB(wbuf, blk + g16);
            d = dd * float(sc & 15u);
            m = -(dmin * float(sc >> 4));
            has_min = true;
        } else if (wtype == T_Q3_K) {
            float dd = half_to_float(LDH(wbuf, blk + 108u));
            int lo = int((LDB(wbuf, blk + 32u + 32u * (e >> 7) + l) >> (2u * (j & 3u))) & 3u);
            q = lo - (((LDB(wbuf, blk + l) >> (4u * (e >> 7) + (j & 3u))) & 1u) != 0u ? 0 : 4);
            uint sc = ((LDB(wbuf, blk + 96u + (g16 & 7u)) >> (4u * (g16 >> 3))) & 15u) |
                      (((LDB(wbuf, blk + 104u + (g16 & 3u)) >> (2u * (g16 >> 2))) & 3u) << 4);
            d = dd * float(int(sc) - 32);
        } else if (wtype == T_IQ2_XXS) {
            float dd = half_to_float(LDH(wbuf, blk));
            uint p = blk + 2u + 8u * j, s = u32_at(p + 4u);
            uint code = GCODE(G_IQ2XXS, LDB(wbuf, p + l8));
            q = signed_v(V2[(code >> (2u * k)) & 3u], ksigns((s >> (7u * l8)) & 127u), k);
            d = dd * (0.5 + float(s >> 28)) * 0.25;
        } else if (wtype == T_IQ2_XS || wtype == T_IQ2_S) {
            float dd = half_to_float(LDH(wbuf, blk));
            bool xs = wtype == T_IQ2_XS;
            uint code, signs;
            if (xs) {
                uint v = LDH(wbuf, blk + 2u + 2u * (4u * j + l8));
                code = GCODE(G_IQ2XS, v & 511u);
                signs = ksigns(v >> 9);
            } else {
                uint idx = LDB(wbuf, blk + 2u + 4u * j + l8) | (((LDB(wbuf, blk + 66u + j) >> (2u * l8)) & 3u) << 8);
                code = GCODE(G_IQ2S, idx);
                signs = LDB(wbuf, blk + 34u + 4u * j + l8);
            }
            q = signed_v(V2[(code >> (2u * k)) & 3u], signs, k);
            uint sc = (LDB(wbuf, blk + (xs ? 66u : 74u) + j) >> (4u * (l8 >> 1))) & 15u;
            d = dd * (0.5 + float(sc)) * 0.25;
        } else if (wtype == T_IQ3_XXS) {
            float dd = half_to_float(LDH(wbuf, blk));
            uint a = u32_at(blk + 66u + 4u * j);
            uint code = GCODE(G_IQ3XXS, LDB(wbuf, blk + 2u + 8u * j + 2u * l8 + (k >> 2)));
            q = signed_v(V3XXS[(code >> (3u * (k & 3u))) & 7u], ksigns((a >> (7u * l8)) & 127u), k);
            d = dd * (0.5 + float(a >> 28)) * 0.5;
        } else if (wtype == T_IQ3_S) {
            float dd = half_to_float(LDH(wbuf, blk));
            uint h = k >> 2; // which of the group's two 4-value entries
            uint idx = LDB(wbuf, blk + 2u + 8u * j + 2u * l8 + h) |
                       (((LDB(wbuf, blk + 66u + j) >> (2u * l8 + h)) & 1u) << 8);
            uint code = GCODE(G_IQ3S, idx);
            q = signed_v(int(2u * ((code >> (3u * (k & 3u))) & 7u) + 1u), LDB(wbuf, blk + 74u + 4u * j + l8), k);
            d = dd * float(1u + 2u * ((LDB(wbuf, blk + 106u + (j >> 1)) >> (4u * (j & 1u))) & 15u));
        } else if (wtype == T_IQ1_S) {
            float dd = half_to_float(LDH(wbuf, blk));
            uint h = LDH(wbuf, blk + 34u + 2u * j);
            uint code = GCODE(G_IQ1S, LDB(wbuf, blk + 2u + 4u * j + l8) | (((h >> (3u * l8)) & 7u) << 8));
            q = 8 * (int((code >> (2u * k)) & 3u) - 1) + ((h & 0x8000u) != 0u ? -1 : 1);
            d = dd * float(2u * ((h >> 12) & 7u) + 1u) * 0.125;
        } else if (wtype == T_IQ1_M) {
            uint sc0 = LDH(wbuf, blk + 48u), sc1 = LDH(wbuf, blk + 50u), sc2 = LDH(wbuf, blk + 52u),
                 sc3 = LDH(wbuf, blk + 54u);
            float dd = half_to_float((sc0 >> 12) | ((sc1 >> 8) & 0xf0u) | ((sc2 >> 4) & 0xf00u) | (sc3 & 0xf000u));
            uint nib = (LDB(wbuf, blk + 32u + 2u * j + (l8 >> 1)) >> (4u * (l8 & 1u))) & 15u;
            uint code = GCODE(G_IQ1S, LDB(wbuf, blk + 4u * j + l8) | ((nib & 7u) << 8));
            q = 8 * (int((code >> (2u * k)) & 3u) - 1) + ((nib & 8u) != 0u ? -1 : 1);
            uint s = LDH(wbuf, blk + 48u + 2u * (j >> 1)) >> (6u * (j & 1u) + 3u * (l8 >> 1));
            d = dd * float(2u * (s & 7u) + 1u) * 0.125;
        } else if (wtype == T_IQ4_XS) {
            float dd = half_to_float(LDH(wbuf, blk));
            uint sh = LDH(wbuf, blk + 2u);
            uint ls = ((LDB(wbuf, blk + 4u + (j >> 1)) >> (4u * (j & 1u))) & 15u) | (((sh >> (2u * j)) & 3u) << 4);
            q = IQ4NL[(LDB(wbuf, blk + 8u + 16u * j + (l & 15u)) >> (l < 16u ? 0u : 4u)) & 15u];
            d = dd * float(int(ls) - 32);
        } else if (wtype == T_TQ1_0) {
            int v;
            if (e < 160u) v = trit(LDB(wbuf, blk + (e & 31u)), e >> 5);
            else if (e < 240u) v = trit(LDB(wbuf, blk + 32u + (e - 160u) % 16u), (e - 160u) / 16u);
            else v = trit(LDB(wbuf, blk + 48u + (e - 240u) % 4u), (e - 240u) / 4u);
            q = v - 1;
            d = half_to_float(LDH(wbuf, blk + 52u));
        } else { // tq2_0
            q = int((LDB(wbuf, blk + 32u * (e >> 7) + l) >> (2u * (j & 3u))) & 3u) - 1;
            d = half_to_float(LDH(wbuf, blk + 64u));
        }
    }
    if (has_min) {
        precise float v = d * float(q) + m;
        return v;
    }
    precise float v = d * float(q);
    return v;
}
