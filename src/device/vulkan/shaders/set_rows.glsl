#include "common.glsl"
#include "kvq.glsl"
// dst row idx[i] = convert(src row i). f32/f16: one invocation per element;
// q8_0/q4_0: one invocation per block of 32 elements. Rows whose index is outside
// [0, dst_rows) are skipped.
// Compiled twice: set_rows.comp writes dst through binding 1, a pool that fits one
// storage-buffer window; set_rows_win.comp (KV_WINDOWED) writes a pool larger than
// that, bound as up to four windows (bindings 1, 3, 4, 5) of rpw rows each, window
// w starting at byte od/od1/od2/od3 of its binding. Both take the same bindings and
// push constants; windows the pool does not need are dummies never written.
layout(binding = 0) buffer S { uint d[]; } src;
layout(binding = 1) buffer D { uint d[]; } dst;
layout(binding = 2) buffer I { uint d[]; } idx;
#ifdef KV_WINDOWED
layout(binding = 3) buffer D1 { uint d[]; } dst1;
layout(binding = 4) buffer D2 { uint d[]; } dst2;
layout(binding = 5) buffer D3 { uint d[]; } dst3;
#endif
layout(push_constant) uniform PC {
    uint os, od, oi, od1, od2, od3, n, row_elems, src_stride, dst_stride, dst_rows, t, rpw;
} pc;

// Word i of window w of dst: store, and the two atomics of a partial-word store.
#ifdef KV_WINDOWED
void dst_st(uint w, uint i, uint v) {
    if (w == 0u) dst.d[i] = v;
    else if (w == 1u) dst1.d[i] = v;
    else if (w == 2u) dst2.d[i] = v;
    else dst3.d[i] = v;
}
void dst_and(uint w, uint i, uint m) {
    if (w == 0u) atomicAnd(dst.d[i], m);
    else if (w == 1u) atomicAnd(dst1.d[i], m);
    else if (w == 2u) atomicAnd(dst2.d[i], m);
    else atomicAnd(dst3.d[i], m);
}
void dst_or(uint w, uint i, uint m) {
    if (w == 0u) atomicOr(dst.d[i], m);
    else if (w == 1u) atomicOr(dst1.d[i], m);
    else if (w == 2u) atomicOr(dst2.d[i], m);
    else atomicOr(dst3.d[i], m);
}
uint dst_off(uint w) { return w == 0u ? pc.od : w == 1u ? pc.od1 : w == 2u ? pc.od2 : pc.od3; }
#else
void dst_st(uint w, uint i, uint v) { dst.d[i] = v; }
void dst_and(uint w, uint i, uint m) { atomicAnd(dst.d[i], m); }
void dst_or(uint w, uint i, uint m) { atomicOr(dst.d[i], m); }
uint dst_off(uint w) { return pc.od; }
#endif

// Store bytes [a, a + n) of window w from by[] (n <= 34): words wholly inside the
// range are stored; the words at its ends may hold another invocation's bytes,
// so they are updated with two atomics on disjoint bits (kvq.glsl's KV_BYTE_STORER).
void store_bytes(uint w, uint a, uint n, uint by[34]) {
    uint w0 = a >> 2, w1 = (a + n - 1u) >> 2;
    for (uint wi = w0; wi <= w1; wi++) {
        uint val = 0u, mask = 0u;
        for (uint k = 0u; k < 4u; k++) {
            uint ad = wi * 4u + k;
            if (ad >= a && ad < a + n) {
                val |= (by[ad - a] & 0xffu) << (8u * k);
                mask |= 0xffu << (8u * k);
            }
        }
        if (mask == 0xffffffffu) {
            dst_st(w, wi, val);
        } else {
            dst_and(w, wi, ~mask);
            dst_or(w, wi, val);
        }
    }
}

void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    if (pc.t >= KVT_Q8_0) {
        uint nb = pc.row_elems / 32u;
        if (e >= pc.n * nb) return;
        uint i = e / nb, b = e % nb;
        int j = int(LDW(idx, pc.oi + i * 4u));
        if (j < 0 || uint(j) >= pc.dst_rows) return;
        uint w = uint(j) / pc.rpw, row = dst_off(w) + (uint(j) - w * pc.rpw) * pc.dst_stride;
        float x[32];
        for (uint k = 0u; k < 32u; k++) x[k] = LDF(src, pc.os + i * pc.src_stride + (b * 32u + k) * 4u);
        uint by[34];
        uint bb = kv_quant_block(pc.t, x, by);
        store_bytes(w, row + b * bb, bb, by);
        return;
    }
    if (e >= pc.n * pc.row_elems) return;
    uint i = e / pc.row_elems, c = e % pc.row_elems;
    int j = int(LDW(idx, pc.oi + i * 4u));
    if (j < 0 || uint(j) >= pc.dst_rows) return;
    uint w = uint(j) / pc.rpw, row = dst_off(w) + (uint(j) - w * pc.rpw) * pc.dst_stride;
    float v = LDF(src, pc.os + i * pc.src_stride + c * 4u);
    if (pc.t == KVT_F16) {
        uint a = row + c * 2u, s = (a & 2u) * 8u;
        dst_and(w, a >> 2, ~(0xffffu << s));
        dst_or(w, a >> 2, (float_to_half(v) & 0xffffu) << s);
    } else {
        dst_st(w, (row + c * 4u) >> 2, floatBitsToUint(v));
    }
}
