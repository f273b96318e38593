#version 450
#include "common.glsl"
// y[i][r0 + r] = sum_c W[r][c] * x[i][c] for the weight types with an integer
// form (weights_int.glsl): the generic path for them, each weight dequantized to
// f32 (exactly as pkv_dequantize_row) and then multiplied. One workgroup per
// (weight row r, tile of NT x rows), as matmul.comp: its invocations stride over
// the row, and a shared-memory tree sums their parts.
#define NT 4u
layout(binding = 0) buffer WB { uint d[]; } wbuf;
layout(binding = 1) buffer X { uint d[]; } x;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(binding = 3) buffer GR { uint d[]; } grids;
layout(push_constant) uniform PC { uint ow, ox, oy, og, rows, cols, n, row_bytes, wtype, r0, cnt; } pc;
#include "weights_int.glsl"
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
        float wv = wint(row, c, pc.wtype);
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
