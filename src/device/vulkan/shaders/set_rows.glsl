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
KV_WINDOW_STORES(dst_st, dst_and, dst_or, dst, dst1, dst2, dst3)
uint dst_off(uint w) { return w == 0u ? pc.od : w == 1u ? pc.od1 : w == 2u ? pc.od2 : pc.od3; }
#else
void dst_st(uint w, uint i, uint v) { dst.d[i] = v; }
void dst_and(uint w, uint i, uint m) { atomicAnd(dst.d[i], m); }
void dst_or(uint w, uint i, uint m) { atomicOr(dst.d[i], m); }
uint dst_off(uint w) { return pc.od; }
#endif

// Bytes [a, a + n) of window w from by[] (n <= 34), as kvq.glsl's KV_BYTE_STORER.
KV_WINDOW_BYTE_STORER(store_bytes, dst_st, dst_and, dst_or)

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
