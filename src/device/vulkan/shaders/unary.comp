#version 450
#include "common.glsl"
// y[i] = op(x[i] + bias[i % bias_len]) * mul[i % mul_len] (device.h, pkv_k_unary_args);
// op: 0 id, 1 sigmoid, 2 softplus, 3 silu. Without bias or mul the host binds x in
// their place and the shader never reads it. y may alias x.
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer Y { uint d[]; } y;
layout(binding = 2) buffer Bi { uint d[]; } bias;
layout(binding = 3) buffer Mu { uint d[]; } mul;
layout(push_constant) uniform PC { uint ox, oy, ob, om, n, op, bias_len, mul_len, has_bias, has_mul; } pc;
void main() {
    uint i = group_id() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float v = LDF(x, pc.ox + i * 4u);
    if (pc.has_bias != 0u) v += LDF(bias, pc.ob + (i % pc.bias_len) * 4u);
    if (pc.op == 1u) {
        v = 1.0 / (1.0 + exp(-v));
    } else if (pc.op == 2u) {
        if (v <= 20.0) {
            // log(1 + e) with the rounding of 1 + e cancelled (log1p is not in GLSL):
            // log(u) * e / (u - 1) is accurate to a few ulps for every e >= 0
            float e = exp(v);
            precise float u = 1.0 + e;
            v = u == 1.0 ? e : log(u) * (e / (u - 1.0));
        }
    } else if (pc.op == 3u) {
        v = v / (1.0 + exp(-v));
    }
    if (pc.has_mul != 0u) v *= LDF(mul, pc.om + (i % pc.mul_len) * 4u);
    STF(y, pc.oy + i * 4u, v);
}
