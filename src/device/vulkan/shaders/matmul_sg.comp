#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// y[i][r0 + r] = sum_c W[r][c] * x[i][c], as matmul.comp, for devices with
// subgroup arithmetic: each subgroup owns whole weight rows (RPW rows per
// workgroup, shared out over however many subgroups the device makes), its lanes
// stride over blocks, and subgroupAdd reduces: no shared memory, no barriers.
// Quantized blocks are decoded once per block and applied to NT x rows.
#define NT 8u
#define RPW 8u
layout(binding = 0) buffer WB { uint d[]; } wbuf;
layout(binding = 1) buffer X { uint d[]; } x;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint ow, ox, oy, rows, cols, n, row_bytes, wtype, r0, cnt; } pc;
#include "weights.glsl"

void main() {
    uint g = group_id();
    uint ntiles = (pc.n + NT - 1u) / NT;
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
        [[unroll]] for (uint k = 0u; k < NT; k++) acc[k] = 0.0;
        if (pc.wtype == T_Q8_0 || pc.wtype == T_Q4_0 || pc.wtype == T_Q4_K || pc.wtype == T_Q5_K ||
            pc.wtype == T_Q6_K || pc.wtype == T_MXFP4) {
            for (uint b = lane; b < (pc.cols >> 5); b += ls) {
                float wv[32];
                wget32(row, b, pc.wtype, wv);
                [[unroll]] for (uint k = 0u; k < NT; k++) {
                    if (k < nt) {
                        uint xa = pc.ox + ((i0 + k) * pc.cols + b * 32u) * 4u;
                        float s = 0.0;
                        [[unroll]] for (uint j = 0u; j < 32u; j++) s += wv[j] * LDF(x, xa + 4u * j);
                        acc[k] += s;
                    }
                }
            }
        } else {
            for (uint c = lane; c < pc.cols; c += ls) {
                float wv = wget(row, c, pc.wtype);
                [[unroll]] for (uint k = 0u; k < NT; k++)
                    if (k < nt) acc[k] += wv * LDF(x, pc.ox + ((i0 + k) * pc.cols + c) * 4u);
            }
        }
        [[unroll]] for (uint k = 0u; k < NT; k++) {
            if (k < nt) {
                float s = subgroupAdd(acc[k]);
                if (lane == 0u) STF(y, pc.oy + ((i0 + k) * pc.rows + pc.r0 + r) * 4u, s);
            }
        }
    }
}
