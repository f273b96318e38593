#version 450
#include "common.glsl"
// out[i][c] = dequant(W[ids[i]])[c]; zeros for an id outside [0, n_vocab).
layout(binding = 0) buffer WB { uint d[]; } wbuf;
layout(binding = 1) buffer I { uint d[]; } ids;
layout(binding = 2) buffer O { uint d[]; } o;
layout(push_constant) uniform PC { uint ow, oi, oo, n, cols, n_vocab, row_bytes, wtype; } pc;
#include "weights.glsl"
void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    if (e >= pc.n * pc.cols) return;
    uint i = e / pc.cols, c = e % pc.cols;
    int id = int(LDW(ids, pc.oi + i * 4u));
    float v = 0.0;
    if (id >= 0 && uint(id) < pc.n_vocab) v = wget(pc.ow + uint(id) * pc.row_bytes, c, pc.wtype);
    STF(o, pc.oo + e * 4u, v);
}
