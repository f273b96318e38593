// Element c of a weight row starting at byte address `row` of buffer `wbuf`, for
// the pkv_type ids f32 (0), f16 (1), q4_0 (2), q8_0 (8), bf16 (30).
// Blocks (GGUF): q8_0 {f16 d; int8 q[32]} = d*q; q4_0 {f16 d; u8 q[16]}, element
// j<16 is q[j]&15, element j+16 is q[j]>>4, value d*(q-8).
#define T_F32 0u
#define T_F16 1u
#define T_Q4_0 2u
#define T_Q8_0 8u
#define T_BF16 30u

float wget(uint row, uint c, uint wtype) {
    if (wtype == T_F32) return LDF(wbuf, row + c * 4u);
    if (wtype == T_F16) return half_to_float(LDH(wbuf, row + c * 2u));
    if (wtype == T_BF16) return bf16_to_float(LDH(wbuf, row + c * 2u));
    uint j = c & 31u;
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
