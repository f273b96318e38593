#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
// matmul_int.comp for devices with subgroup arithmetic, laid out as matmul_sg.comp:
// each subgroup owns whole weight rows (RPW rows per workgroup), its lanes stride
// over the row's elements (each decoded once for NT x rows), subgroupAdd reduces.
#define NT 8u
#define RPW 8u
layout(binding = 0) buffer WB { uint d[]; } wbuf;
layout(binding = 1) buffer X { uint d[]; } x;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(binding = 3) buffer GR { uint d[]; } grids;
layout(push_constant) uniform PC { uint ow, ox, oy, og, rows, cols, n, row_bytes, wtype, r0, cnt; } pc;
#include "weights_int.glsl"

void main() {
    uint g = group_id();
    uint rg = g % ((pc.cnt + RPW - 1u) / RPW), tile = g / ((pc.cnt + RPW - 1u) / RPW);
    uint i0 = tile * NT;
    if (i0 >= pc.n) return;
    uint nt = min(NT, pc.n - i0);
    uint lane = gl_SubgroupInvocationID, ls = gl_SubgroupSize;
    for (uint rr = gl_SubgroupID; rr < RPW; rr += gl_NumSubgroups) {
        uint r = rg * RPW + rr;
        if (r >= pc.cnt) break;
        uint row = pc.ow + r * pc.row_bytes;
        float acc[NT];
        for (uint k = 0u; k < NT; k++) acc[k] = 0.0;
        for (uint c = lane; c < pc.cols; c += ls) {
            float wv = wint(row, c, pc.wtype);
            for (uint k = 0u; k < nt; k++) acc[k] += wv * LDF(x, pc.ox + ((i0 + k) * pc.cols + c) * 4u);
        }
        for (uint k = 0u; k < NT; k++) {
            if (k < nt) {
                float s = subgroupAdd(acc[k]);
                if (lane == 0u) STF(y, pc.oy + ((i0 + k) * pc.rows + pc.r0 + r) * 4u, s);
            }
        }
    }
}
