#version 450
#include "common.glsl"
// One workgroup per row: y = exp(x - max) / sum
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint ox, oy, n_rows, len; } pc;
shared float part[WG];
void main() {
    uint r = group_id(), t = gl_LocalInvocationID.x;
    if (r >= pc.n_rows) return;
    uint base = pc.ox + r * pc.len * 4u;
    float m = -3.402823466e38;
    for (uint c = t; c < pc.len; c += WG) m = max(m, LDF(x, base + c * 4u));
    part[t] = m;
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (t < k) part[t] = max(part[t], part[t + k]);
        barrier();
    }
    m = part[0];
    barrier();
    float s = 0.0;
    for (uint c = t; c < pc.len; c += WG) s += exp(LDF(x, base + c * 4u) - m);
    part[t] = s;
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (t < k) part[t] += part[t + k];
        barrier();
    }
    float inv = 1.0 / part[0];
    uint ybase = pc.oy + r * pc.len * 4u;
    for (uint c = t; c < pc.len; c += WG) STF(y, ybase + c * 4u, exp(LDF(x, base + c * 4u) - m) * inv);
}
