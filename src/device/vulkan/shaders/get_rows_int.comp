#version 450
#include "common.glsl"
// get_rows.comp for the weight types with an integer form (weights_int.glsl):
// out[i][c] = dequant(W[ids[i]])[c] * scale (scale 0: no multiply), zeros for an
// id outside [0, n_vocab). The bound weights are rows [r0, r0 + cnt) of W; the
// dispatch with `first` set writes the zeros.
layout(binding = 0) buffer WB { uint d[]; } wbuf;
layout(binding = 1) buffer I { uint d[]; } ids;
layout(binding = 2) buffer O { uint d[]; } o;
layout(binding = 3) buffer GR { uint d[]; } grids;
layout(push_constant) uniform PC { uint ow, oi, oo, og, n, cols, n_vocab, row_bytes, wtype, r0, cnt, first;
                                 float scale; } pc;
#include "weights_int.glsl"
void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    if (e >= pc.n * pc.cols) return;
    uint i = e / pc.cols, c = e % pc.cols;
    int id = int(LDW(ids, pc.oi + i * 4u));
    if (id < 0 || uint(id) >= pc.n_vocab) {
        if (pc.first != 0u) STF(o, pc.oo + e * 4u, 0.0);
    } else if (uint(id) >= pc.r0 && uint(id) - pc.r0 < pc.cnt) {
        float v = wint(pc.ow + (uint(id) - pc.r0) * pc.row_bytes, c, pc.wtype);
        if (pc.scale != 0.0) v *= pc.scale;
        STF(o, pc.oo + e * 4u, v);
    }
}
