#version 450
#include "common.glsl"
// One workgroup per row: y = x / sqrt(mean(x^2) + eps) * w
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer W { uint d[]; } w;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint ox, ow, oy, n_rows, len; float eps; } pc;
shared float part[WG];
void main() {
    uint r = group_id(), t = gl_LocalInvocationID.x;
    if (r >= pc.n_rows) return;
    uint base = pc.ox + r * pc.len * 4u;
    float s = 0.0;
    for (uint c = t; c < pc.len; c += WG) {
        float v = LDF(x, base + c * 4u);
        s += v * v;
    }
    part[t] = s;
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (t < k) part[t] += part[t + k];
        barrier();
    }
    float scale = 1.0 / sqrt(part[0] / float(pc.len) + pc.eps);
    uint ybase = pc.oy + r * pc.len * 4u;
    for (uint c = t; c < pc.len; c += WG)
        STF(y, ybase + c * 4u, LDF(x, base + c * 4u) * scale * LDF(w, pc.ow + c * 4u));
}
