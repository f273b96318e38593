#version 450
#include "common.glsl"
// y[i] = silu(g[i]) * u[i]
layout(binding = 0) buffer G { uint d[]; } g;
layout(binding = 1) buffer U { uint d[]; } u;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint og, ou, oy, n; } pc;
void main() {
    uint i = group_id() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float x = LDF(g, pc.og + i * 4u);
    float v = x / (1.0 + exp(-x)) * LDF(u, pc.ou + i * 4u);
    STF(y, pc.oy + i * 4u, v);
}
