#version 450
#include "common.glsl"
// dst row idx[i] = convert(src row i); one invocation per element. Rows whose
// index is outside [0, dst_rows) are skipped.
layout(binding = 0) buffer S { uint d[]; } src;
layout(binding = 1) buffer D { uint d[]; } dst;
layout(binding = 2) buffer I { uint d[]; } idx;
layout(push_constant) uniform PC { uint os, od, oi, n, row_elems, src_stride, dst_stride, dst_rows, f16; } pc;
void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    if (e >= pc.n * pc.row_elems) return;
    uint i = e / pc.row_elems, c = e % pc.row_elems;
    int j = int(LDW(idx, pc.oi + i * 4u));
    if (j < 0 || uint(j) >= pc.dst_rows) return;
    float v = LDF(src, pc.os + i * pc.src_stride + c * 4u);
    if (pc.f16 != 0u) {
        STH(dst, pc.od + uint(j) * pc.dst_stride + c * 2u, float_to_half(v));
    } else {
        STF(dst, pc.od + uint(j) * pc.dst_stride + c * 4u, v);
    }
}
