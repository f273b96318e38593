#version 450
#include "common.glsl"
// Rotary embedding in place; one invocation per (row, head, pair).
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer P { uint d[]; } p;
layout(binding = 2) buffer R { uint d[]; } rw;
layout(push_constant) uniform PC {
    uint ox, op, orw, n_rows, row_stride, n_heads, head_dim, n_rot, neox, f16, has_rows;
    float freq_base, freq_scale;
} pc;
void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    uint half_rot = pc.n_rot / 2u;
    if (e >= pc.n_rows * pc.n_heads * half_rot) return;
    uint i = e % half_rot, h = (e / half_rot) % pc.n_heads, r = e / (half_rot * pc.n_heads);
    uint row = pc.has_rows != 0u ? LDW(rw, pc.orw + r * 4u) : r;
    float pos = float(int(LDW(p, pc.op + r * 4u)));
    float theta = pos * pc.freq_scale * pow(pc.freq_base, -2.0 * float(i) / float(pc.n_rot));
    float cs = cos(theta), sn = sin(theta);
    uint e0 = pc.neox != 0u ? i : 2u * i, e1 = pc.neox != 0u ? i + half_rot : 2u * i + 1u;
    uint es = pc.f16 != 0u ? 2u : 4u;
    uint base = pc.ox + row * pc.row_stride + h * pc.head_dim * es;
    uint a0 = base + e0 * es, a1 = base + e1 * es;
    if (pc.f16 != 0u) {
        float a = half_to_float(LDH(x, a0)), b = half_to_float(LDH(x, a1));
        STH(x, a0, float_to_half(a * cs - b * sn));
        STH(x, a1, float_to_half(a * sn + b * cs));
    } else {
        float a = LDF(x, a0), b = LDF(x, a1);
        STF(x, a0, a * cs - b * sn);
        STF(x, a1, a * sn + b * cs);
    }
}
