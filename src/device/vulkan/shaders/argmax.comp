#version 450
#include "common.glsl"
// One workgroup per row: index of the largest element, first on ties.
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer O { uint d[]; } o;
layout(push_constant) uniform PC { uint ox, oo, n_rows, len; } pc;
shared float bv[WG];
shared uint bi[WG];
void main() {
    uint r = group_id(), t = gl_LocalInvocationID.x;
    if (r >= pc.n_rows) return;
    uint base = pc.ox + r * pc.len * 4u;
    float best = 0.0;
    uint idx = 0xffffffffu;
    for (uint c = t; c < pc.len; c += WG) {
        float v = LDF(x, base + c * 4u);
        if (idx == 0xffffffffu || v > best) { best = v; idx = c; }
    }
    bv[t] = best;
    bi[t] = idx;
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (t < k) {
            uint j = bi[t + k];
            if (j != 0xffffffffu &&
                (bi[t] == 0xffffffffu || bv[t + k] > bv[t] || (bv[t + k] == bv[t] && j < bi[t]))) {
                bv[t] = bv[t + k];
                bi[t] = j;
            }
        }
        barrier();
    }
    if (t == 0u) o.d[(pc.oo >> 2) + r] = bi[0];
}
