#version 450
#include "common.glsl"
// One workgroup per row: y = (x - mean) / sqrt(var + eps) * w + b (kernel-list.h,
// pkv_k_layer_norm_args), mean and variance in two passes. Without w or b the host
// binds x in their place and the shader never reads it. y may alias x.
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer Y { uint d[]; } y;
layout(binding = 2) buffer W { uint d[]; } w;
layout(binding = 3) buffer B { uint d[]; } b;
layout(push_constant) uniform PC { uint ox, oy, ow, ob, n_rows, len, has_w, has_b; float eps; } pc;
shared float part[WG];
float reduce_sum(float s, uint t) {
    part[t] = s;
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (t < k) part[t] += part[t + k];
        barrier();
    }
    float r = part[0];
    barrier(); // part is reused by the next reduction
    return r;
}
void main() {
    uint r = group_id(), t = gl_LocalInvocationID.x;
    if (r >= pc.n_rows) return;
    uint base = pc.ox + r * pc.len * 4u;
    float s = 0.0;
    for (uint c = t; c < pc.len; c += WG) s += LDF(x, base + c * 4u);
    float mean = reduce_sum(s, t) / float(pc.len);
    s = 0.0;
    for (uint c = t; c < pc.len; c += WG) {
        float d = LDF(x, base + c * 4u) - mean;
        s += d * d;
    }
    float scale = 1.0 / sqrt(reduce_sum(s, t) / float(pc.len) + pc.eps);
    uint ybase = pc.oy + r * pc.len * 4u;
    for (uint c = t; c < pc.len; c += WG) {
        float v = (LDF(x, base + c * 4u) - mean) * scale;
        if (pc.has_w != 0u) v *= LDF(w, pc.ow + c * 4u);
        if (pc.has_b != 0u) v += LDF(b, pc.ob + c * 4u);
        STF(y, ybase + c * 4u, v);
    }
}
