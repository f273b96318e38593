#version 450
#include "common.glsl"
#include "kvq.glsl"
// Rotary embedding in place. f32/f16 rows: one invocation per (row, head, pair).
// q8_0/q4_0 rows: one invocation per (row, head): the head is dequantized,
// rotated in f32 and quantized again (head_dim <= MAX_QHEAD, checked by the host).
#define MAX_QHEAD 512u
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer P { uint d[]; } p;
layout(binding = 2) buffer R { uint d[]; } rw;
layout(push_constant) uniform PC {
    uint ox, op, orw, n_rows, row_stride, n_heads, head_dim, n_rot, neox, t, has_rows;
    float freq_base, freq_scale;
    float ext_factor, corr_lo, corr_hi, mscale; // YaRN (ext_factor 0: none); mscale 1 = none
} pc;

// The angle of pair i (device.h): pos * freq_scale * base^(-2i/n_rot), or with YaRN
// the mix of that and the unscaled angle.
float rope_theta(float pos, uint i) {
    float p = pow(pc.freq_base, -2.0 * float(i) / float(pc.n_rot));
    if (pc.ext_factor == 0.0) return pos * pc.freq_scale * p;
    float y = (float(i) - pc.corr_lo) / max(0.001, pc.corr_hi - pc.corr_lo);
    float mix = (1.0 - min(1.0, max(0.0, y))) * pc.ext_factor;
    return pos * p * (pc.freq_scale * (1.0 - mix) + mix);
}
KV_LOADER(xload, x)
KV_BYTE_STORER(store_bytes, x)

void rope_quant(uint e) {
    if (e >= pc.n_rows * pc.n_heads) return;
    uint h = e % pc.n_heads, r = e / pc.n_heads;
    uint row = pc.has_rows != 0u ? LDW(rw, pc.orw + r * 4u) : r;
    float pos = float(int(LDW(p, pc.op + r * 4u)));
    uint bb = pc.t == KVT_Q8_0 ? 34u : 18u, nb = pc.head_dim / 32u;
    uint base = pc.ox + row * pc.row_stride + h * nb * bb;
    float f[MAX_QHEAD];
    for (uint c = 0u; c < pc.head_dim; c++) f[c] = xload(pc.t, base, c);
    uint half_rot = pc.n_rot / 2u;
    for (uint i = 0u; i < half_rot; i++) {
        float theta = rope_theta(pos, i);
        float cs = cos(theta) * pc.mscale, sn = sin(theta) * pc.mscale;
        uint e0 = pc.neox != 0u ? i : 2u * i, e1 = pc.neox != 0u ? i + half_rot : 2u * i + 1u;
        float a = f[e0], b = f[e1];
        f[e0] = a * cs - b * sn;
        f[e1] = a * sn + b * cs;
    }
    for (uint k = 0u; k < nb; k++) {
        float blk[32];
        for (uint j = 0u; j < 32u; j++) blk[j] = f[k * 32u + j];
        uint by[34];
        kv_quant_block(pc.t, blk, by);
        store_bytes(base + k * bb, bb, by);
    }
}

void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    if (pc.t >= KVT_Q8_0) {
        rope_quant(e);
        return;
    }
    uint half_rot = pc.n_rot / 2u;
    if (e >= pc.n_rows * pc.n_heads * half_rot) return;
    uint i = e % half_rot, h = (e / half_rot) % pc.n_heads, r = e / (half_rot * pc.n_heads);
    uint row = pc.has_rows != 0u ? LDW(rw, pc.orw + r * 4u) : r;
    float pos = float(int(LDW(p, pc.op + r * 4u)));
    float theta = rope_theta(pos, i);
    float cs = cos(theta) * pc.mscale, sn = sin(theta) * pc.mscale;
    uint e0 = pc.neox != 0u ? i : 2u * i, e1 = pc.neox != 0u ? i + half_rot : 2u * i + 1u;
    uint es = pc.t == KVT_F16 ? 2u : 4u;
    uint base = pc.ox + row * pc.row_stride + h * pc.head_dim * es;
    uint a0 = base + e0 * es, a1 = base + e1 * es;
    if (pc.t == KVT_F16) {
        float a = half_to_float(LDH(x, a0)), b = half_to_float(LDH(x, a1));
        STH(x, a0, float_to_half(a * cs - b * sn));
        STH(x, a1, float_to_half(a * sn + b * cs));
    } else {
        float a = LDF(x, a0), b = LDF(x, a1);
        STF(x, a0, a * cs - b * sn);
        STF(x, a1, a * sn + b * cs);
    }
}
