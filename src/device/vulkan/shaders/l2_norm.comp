#version 450
#include "common.glsl"
// One workgroup per head row (t, h): y = x / sqrt(sum(x^2) + eps) (kernel-list.h,
// pkv_k_l2_norm_args). Every invocation reads its elements for the sum before the
// barrier and writes only its own elements after it, so y may equal x.
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint ox, oy, n, n_heads, head_dim, x_stride, y_stride; float eps; } pc;
shared float part[WG];
void main() {
    uint r = group_id(), t = gl_LocalInvocationID.x;
    if (r >= pc.n * pc.n_heads) return;
    uint tok = r / pc.n_heads, h = r % pc.n_heads;
    uint xb = pc.ox + tok * pc.x_stride + h * pc.head_dim * 4u, yb = pc.oy + tok * pc.y_stride + h * pc.head_dim * 4u;
    float s = 0.0;
    for (uint c = t; c < pc.head_dim; c += WG) {
        float v = LDF(x, xb + c * 4u);
        s += v * v;
    }
    part[t] = s;
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (t < k) part[t] += part[t + k];
        barrier();
    }
    float scale = 1.0 / sqrt(part[0] + pc.eps);
    for (uint c = t; c < pc.head_dim; c += WG) STF(y, yb + c * 4u, LDF(x, xb + c * 4u) * scale);
}
