// Shared by every pagekv compute shader. All storage buffers are arrays of 32-bit
// words and every address is a BYTE address inside the bound window (the host
// passes each argument's byte offset in push constants), so f16, bf16 and
// quantized blocks are decoded from words without 8/16-bit storage extensions.
layout(local_size_x = 64) in;
#define WG 64u

// Workgroups are laid out on a 2D grid to exceed the 65535 limit of one axis.
uint group_id() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

#define LDW(B, a) (B.d[(a) >> 2])
#define LDF(B, a) uintBitsToFloat(B.d[(a) >> 2])
#define STF(B, a, v) B.d[(a) >> 2] = floatBitsToUint(v)
// 16-bit half at an even byte address, 8-bit byte at any byte address.
#define LDH(B, a) ((B.d[(a) >> 2] >> (((a) & 2u) * 8u)) & 0xffffu)
#define LDB(B, a) ((B.d[(a) >> 2] >> (((a) & 3u) * 8u)) & 0xffu)
// Store a half: another invocation may own the other half of the word, so the
// update is two atomics on disjoint bits (their order does not matter).
#define STH(B, a, h)                                                              \
    {                                                                             \
        uint _i = (a) >> 2, _s = ((a) & 2u) * 8u;                                 \
        atomicAnd(B.d[_i], ~(0xffffu << _s));                                     \
        atomicOr(B.d[_i], ((h) & 0xffffu) << _s);                                 \
    }

// softplus as PKV_UNARY_SOFTPLUS: v > 20 ? v : log1p(e^v). log(1 + e) with the rounding
// of 1 + e cancelled (log1p is not in GLSL): log(u) * e / (u - 1) is accurate to a few
// ulps for every e >= 0.
float softplus(float v) {
    if (v > 20.0) return v;
    float e = exp(v);
    precise float u = 1.0 + e;
    return u == 1.0 ? e : log(u) * (e / (u - 1.0));
}

float half_to_float(uint h) { return unpackHalf2x16(h).x; }
float bf16_to_float(uint h) { return uintBitsToFloat(h << 16); }

// f32 -> f16 bits, round to nearest even, exactly as pkv_f32_to_f16 (the GLSL
// packHalf2x16 leaves rounding to the implementation).
uint float_to_half(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint e8 = (x >> 23) & 0xffu;
    uint man = x & 0x7fffffu;
    if (e8 == 0xffu) return man == 0u ? (sign | 0x7c00u) : (sign | 0x7e00u | (man >> 13));
    int e = int(e8) - 127 + 15;
    if (e >= 31) return sign | 0x7c00u;
    if (e <= 0) {
        if (e < -10) return sign;
        uint m = man | 0x800000u;
        uint shift = uint(14 - e);
        uint h = m >> shift;
        uint rem = m & ((1u << shift) - 1u);
        uint mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (h & 1u) != 0u)) h++;
        return sign | h;
    }
    uint h = (uint(e) << 10) | (man >> 13);
    uint rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
    return sign | h;
}
