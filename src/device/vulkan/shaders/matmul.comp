#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// y[i][r0 + r] = sum_c W[r][c] * x[i][c] for the cnt weight rows bound (a chunk
// starting at row r0; y rows are `rows` long). One workgroup per (weight row r,
// tile of NT x rows): the weight row is decoded once per tile.
#define NT 4u
layout(binding = 0) buffer WB { uint d[]; } wbuf;
layout(binding = 1) buffer X { uint d[]; } x;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint ow, ox, oy, rows, cols, n, row_bytes, wtype, r0, cnt; } pc;
#include "weights.glsl"
shared float part[NT][WG];
void main() {
    uint g = group_id(), t = gl_LocalInvocationID.x;
    uint r = g % pc.cnt, i0 = (g / pc.cnt) * NT;
    if (i0 >= pc.n) return;
    uint nt = min(NT, pc.n - i0);
    float acc[NT];
    for (uint k = 0u; k < NT; k++) acc[k] = 0.0;
    uint row = pc.ow + r * pc.row_bytes;
    for (uint c = t; c < pc.cols; c += WG) {
        float wv = wget(row, c, pc.wtype);
        for (uint k = 0u; k < nt; k++) acc[k] += wv * LDF(x, pc.ox + ((i0 + k) * pc.cols + c) * 4u);
    }
    for (uint k = 0u; k < NT; k++) part[k][t] = acc[k];
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s)
            for (uint k = 0u; k < NT; k++) part[k][t] += part[k][t + s];
        barrier();
    }
    if (t < nt) STF(y, pc.oy + ((i0 + t) * pc.rows + pc.r0 + r) * 4u, part[t][0]);
}
