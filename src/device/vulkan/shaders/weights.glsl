// Element c of a weight row starting at byte address `row` of buffer `wbuf`, for
// the pkv_type ids f32 (0), f16 (1), q4_0 (2), q8_0 (8), q4_k (12), q5_k (13),
// q6_k (14), bf16 (30), mxfp4 (39). Rows start at even byte addresses (q6_k rows
// are 210 bytes), so blocks are read as bytes, halves or straddling words
// (word_at); mxfp4 rows (17-byte blocks) at any byte address, so they are read
// as bytes or as words from any address (word_any).
// Blocks (GGUF): q8_0 {f16 d; int8 q[32]} = d*q; q4_0 {f16 d; u8 q[16]}, element
// j<16 is q[j]&15, element j+16 is q[j]>>4, value d*(q-8); mxfp4 {u8 e; u8 q[16]},
// the same nibble order, value KV_MXFP4[q] * 2^(e-128) (an exact product). The k-quant
// super-blocks of 256 are laid out as src/base/quant.c states; values are
// computed in the same float operations and order as pkv_dequantize_row, and
// `precise` keeps the compiler from fusing d*q - m into an fma, so get_rows is
// bit-exact.
#define T_F32 0u
#define T_F16 1u
#define T_Q4_0 2u
#define T_Q8_0 8u
#define T_Q4_K 12u
#define T_Q5_K 13u
#define T_Q6_K 14u
#define T_BF16 30u
#define T_MXFP4 39u

// The E2M1 values doubled (src/base/quant.h, pkv_mxfp4_kvalues).
const float KV_MXFP4[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);

// The mxfp4 scale 2^(e - 128) from the E8M0 byte e (subnormal for e < 2).
float e8m0_half(uint e) { return uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23)); }

// The 32-bit word at an even byte address a (2 halves straddling two words when a % 4 == 2).
uint word_at(uint a) {
    uint lo = wbuf.d[a >> 2];
    if ((a & 2u) == 0u) return lo;
    return (lo >> 16) | (wbuf.d[(a >> 2) + 1u] << 16);
}

// 6-bit scale (x) and min (y) of sub-block j (0..7) of a q4_k/q5_k super-block
// whose 12 packed scale bytes start at byte address s.
uvec2 kq_scale_min(uint s, uint j) {
    if (j < 4u) return uvec2(LDB(wbuf, s + j) & 63u, LDB(wbuf, s + j + 4u) & 63u);
    uint a = LDB(wbuf, s + j + 4u);
    return uvec2((a & 15u) | ((LDB(wbuf, s + j - 4u) >> 6) << 4), (a >> 4) | ((LDB(wbuf, s + j) >> 6) << 4));
}

// The 32-bit word at any byte address a (bytes a .. a+3 must lie in the buffer).
uint word_any(uint a) {
    uint s = (a & 3u) * 8u, lo = wbuf.d[a >> 2];
    if (s == 0u) return lo;
    return (lo >> s) | (wbuf.d[(a >> 2) + 1u] << (32u - s));
}

int sbyte(uint b) { return b >= 128u ? int(b) - 256 : int(b); }

float wget_k(uint row, uint c, uint wtype) {
    uint i = c & 255u, j = i >> 5, l = i & 31u;
    if (wtype == T_Q6_K) {
        // group j of 32: half h = j/4, quarter k = j%4; scale sc[8h + 2k + l/16]
        uint blk = row + (c >> 8) * 210u, h = j >> 2, k = j & 3u;
        uint lo = (LDB(wbuf, blk + 64u * h + 32u * (k & 1u) + l) >> (4u * (k >> 1))) & 15u;
        uint hi = (LDB(wbuf, blk + 128u + 32u * h + l) >> (2u * k)) & 3u;
        float d = half_to_float(LDH(wbuf, blk + 208u));
        float ds = d * float(sbyte(LDB(wbuf, blk + 192u + 8u * h + 2u * k + (l >> 4))));
        precise float v = ds * float(int(lo | (hi << 4)) - 32);
        return v;
    }
    uint blk = row + (c >> 8) * (wtype == T_Q4_K ? 144u : 176u);
    uvec2 sm = kq_scale_min(blk + 4u, j);
    float d1 = half_to_float(LDH(wbuf, blk)) * float(sm.x);
    float m1 = half_to_float(LDH(wbuf, blk + 2u)) * float(sm.y);
    uint qs = blk + (wtype == T_Q4_K ? 16u : 48u) + 32u * (j >> 1);
    uint q = (LDB(wbuf, qs + l) >> (4u * (j & 1u))) & 15u;
    if (wtype == T_Q5_K) q += ((LDB(wbuf, blk + 16u + l) >> j) & 1u) << 4;
    precise float v = d1 * float(q) - m1;
    return v;
}

float wget(uint row, uint c, uint wtype) {
    if (wtype == T_F32) return LDF(wbuf, row + c * 4u);
    if (wtype == T_F16) return half_to_float(LDH(wbuf, row + c * 2u));
    if (wtype == T_BF16) return bf16_to_float(LDH(wbuf, row + c * 2u));
    if (wtype == T_Q4_K || wtype == T_Q5_K || wtype == T_Q6_K) return wget_k(row, c, wtype);
    uint j = c & 31u;
    if (wtype == T_MXFP4) {
        uint blk = row + (c >> 5) * 17u;
        uint b = LDB(wbuf, blk + 1u + (j & 15u));
        return KV_MXFP4[j < 16u ? (b & 15u) : (b >> 4)] * e8m0_half(LDB(wbuf, blk));
    }
    if (wtype == T_Q8_0) {
        uint blk = row + (c >> 5) * 34u;
        float d = half_to_float(LDH(wbuf, blk));
        int q = int(LDB(wbuf, blk + 2u + j));
        if (q >= 128) q -= 256;
        return d * float(q);
    }
    // q4_0
    uint blk = row + (c >> 5) * 18u;
    float d = half_to_float(LDH(wbuf, blk));
    uint b = LDB(wbuf, blk + 2u + (j & 15u));
    uint q = j < 16u ? (b & 15u) : (b >> 4);
    return d * (float(q) - 8.0);
}

// Elements 32g .. 32g+31 of a row of a block-quantized type (q8_0, q4_0, mxfp4,
// k-quants), decoded from whole words: the scales once per group.
void wget32(uint row, uint g, uint wtype, out float wv[32]) {
    if (wtype == T_MXFP4) {
        uint blk = row + g * 17u;
        float d = e8m0_half(LDB(wbuf, blk));
        [[unroll]] for (uint w = 0u; w < 4u; w++) {
            uint wd = word_any(blk + 1u + 4u * w);
            [[unroll]] for (uint q = 0u; q < 4u; q++) {
                uint by = (wd >> (8u * q)) & 0xffu;
                wv[4u * w + q] = KV_MXFP4[by & 15u] * d;
                wv[4u * w + q + 16u] = KV_MXFP4[by >> 4] * d;
            }
        }
        return;
    }
    if (wtype == T_Q8_0 || wtype == T_Q4_0) {
        uint blk = row + g * (wtype == T_Q8_0 ? 34u : 18u);
        float dq = half_to_float(LDH(wbuf, blk));
        if (wtype == T_Q8_0) {
            [[unroll]] for (uint w = 0u; w < 8u; w++) {
                int wd = int(word_at(blk + 2u + 4u * w));
                [[unroll]] for (uint q = 0u; q < 4u; q++) wv[4u * w + q] = dq * float(bitfieldExtract(wd, int(8u * q), 8));
            }
        } else {
            [[unroll]] for (uint w = 0u; w < 4u; w++) {
                uint wd = word_at(blk + 2u + 4u * w);
                [[unroll]] for (uint q = 0u; q < 4u; q++) {
                    uint by = (wd >> (8u * q)) & 0xffu;
                    wv[4u * w + q] = dq * (float(by & 15u) - 8.0);
                    wv[4u * w + q + 16u] = dq * (float(by >> 4) - 8.0);
                }
            }
        }
        return;
    }
    uint j = g & 7u;
    if (wtype == T_Q6_K) {
        uint blk = row + (g >> 3) * 210u, h = j >> 2, k = j & 3u;
        uint ql = blk + 64u * h + 32u * (k & 1u), qh = blk + 128u + 32u * h, sl = 4u * (k >> 1), sh = 2u * k;
        float d = half_to_float(LDH(wbuf, blk + 208u));
        uint sc = blk + 192u + 8u * h + 2u * k;
        float ds0 = d * float(sbyte(LDB(wbuf, sc))), ds1 = d * float(sbyte(LDB(wbuf, sc + 1u)));
        [[unroll]] for (uint w = 0u; w < 8u; w++) {
            uint lw = word_at(ql + 4u * w) >> sl, hw = word_at(qh + 4u * w) >> sh;
            [[unroll]] for (uint q = 0u; q < 4u; q++) {
                uint v = ((lw >> (8u * q)) & 15u) | (((hw >> (8u * q)) & 3u) << 4);
                wv[4u * w + q] = (w < 4u ? ds0 : ds1) * float(int(v) - 32);
            }
        }
        return;
    }
    bool q5 = wtype == T_Q5_K;
    uint blk = row + (g >> 3) * (q5 ? 176u : 144u);
    uvec2 sm = kq_scale_min(blk + 4u, j);
    float d1 = half_to_float(LDH(wbuf, blk)) * float(sm.x);
    float m1 = half_to_float(LDH(wbuf, blk + 2u)) * float(sm.y);
    uint qs = blk + (q5 ? 48u : 16u) + 32u * (j >> 1), sl = 4u * (j & 1u);
    [[unroll]] for (uint w = 0u; w < 8u; w++) {
        uint lw = word_at(qs + 4u * w) >> sl, hw = q5 ? word_at(blk + 16u + 4u * w) >> j : 0u;
        [[unroll]] for (uint q = 0u; q < 4u; q++) {
            uint v = ((lw >> (8u * q)) & 15u) | (((hw >> (8u * q)) & 1u) << 4);
            wv[4u * w + q] = d1 * float(v) - m1;
        }
    }
}
