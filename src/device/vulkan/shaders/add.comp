#version 450
#include "common.glsl"
// y[i] = a[i] + b[i % b_len]
layout(binding = 0) buffer A { uint d[]; } a;
layout(binding = 1) buffer B { uint d[]; } b;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint oa, ob, oy, n, b_len; } pc;
void main() {
    uint i = group_id() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float v = LDF(a, pc.oa + i * 4u) + LDF(b, pc.ob + (i % pc.b_len) * 4u);
    STF(y, pc.oy + i * 4u, v);
}
