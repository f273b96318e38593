#version 450
#include "common.glsl"
#include "kvq.glsl"
// dst row idx[i] = convert(src row i). f32/f16: one invocation per element;
// q8_0/q4_0: one invocation per block of 32 elements. Rows whose index is outside
// [0, dst_rows) are skipped.
layout(binding = 0) buffer S { uint d[]; } src;
layout(binding = 1) buffer D { uint d[]; } dst;
layout(binding = 2) buffer I { uint d[]; } idx;
layout(push_constant) uniform PC { uint os, od, oi, n, row_elems, src_stride, dst_stride, dst_rows, t; } pc;
KV_BYTE_STORER(store_bytes, dst)
void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    if (pc.t >= KVT_Q8_0) {
        uint nb = pc.row_elems / 32u;
        if (e >= pc.n * nb) return;
        uint i = e / nb, b = e % nb;
        int j = int(LDW(idx, pc.oi + i * 4u));
        if (j < 0 || uint(j) >= pc.dst_rows) return;
        float x[32];
        for (uint k = 0u; k < 32u; k++) x[k] = LDF(src, pc.os + i * pc.src_stride + (b * 32u + k) * 4u);
        uint by[34];
        uint bb = kv_quant_block(pc.t, x, by);
        store_bytes(pc.od + uint(j) * pc.dst_stride + b * bb, bb, by);
        return;
    }
    if (e >= pc.n * pc.row_elems) return;
    uint i = e / pc.row_elems, c = e % pc.row_elems;
    int j = int(LDW(idx, pc.oi + i * 4u));
    if (j < 0 || uint(j) >= pc.dst_rows) return;
    float v = LDF(src, pc.os + i * pc.src_stride + c * 4u);
    if (pc.t == KVT_F16) {
        STH(dst, pc.od + uint(j) * pc.dst_stride + c * 2u, float_to_half(v));
    } else {
        STF(dst, pc.od + uint(j) * pc.dst_stride + c * 4u, v);
    }
}
