#version 450
#include "common.glsl"
// y[i] = op(x[i] + bias[i % bias_len]) * mul[i % mul_len] (kernel-list.h, pkv_k_unary_args);
// op: 0 id, 1 sigmoid, 2 softplus, 3 silu, 4 gelu (tanh form), 5 gelu_erf, 6 relu_sqr. Without bias or mul the host binds x in
// their place and the shader never reads it. y may alias x.
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer Y { uint d[]; } y;
layout(binding = 2) buffer Bi { uint d[]; } bias;
layout(binding = 3) buffer Mu { uint d[]; } mul;
layout(push_constant) uniform PC { uint ox, oy, ob, om, n, op, bias_len, mul_len, has_bias, has_mul; } pc;
// erfc(z), z >= 0: the Chebyshev fit of Numerical Recipes' erfcc, relative error
// below 1.2e-7 everywhere (GLSL has no erf); so the tail of gelu_erf at negative
// x stays accurate in relative terms.
float erfc_pos(float z) {
    float t = 1.0 / (1.0 + 0.5 * z);
    float p = -0.82215223 + t * 0.17087277;
    p = 1.48851587 + t * p;
    p = -1.13520398 + t * p;
    p = 0.27886807 + t * p;
    p = -0.18628806 + t * p;
    p = 0.09678418 + t * p;
    p = 0.37409196 + t * p;
    p = 1.00002368 + t * p;
    return t * exp(-z * z - 1.26551223 + t * p);
}
void main() {
    uint i = group_id() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float v = LDF(x, pc.ox + i * 4u);
    if (pc.has_bias != 0u) v += LDF(bias, pc.ob + (i % pc.bias_len) * 4u);
    if (pc.op == 1u) {
        v = 1.0 / (1.0 + exp(-v));
    } else if (pc.op == 2u) {
        v = softplus(v);
    } else if (pc.op == 3u) {
        v = v / (1.0 + exp(-v));
    } else if (pc.op == 4u) {
        // x * sigmoid(2t) = 0.5 x (1 + tanh t), without the cancellation for t < 0
        float t = 0.7978845608 * (v + 0.044715 * v * v * v), e = exp(-2.0 * abs(t));
        v = t >= 0.0 ? v / (1.0 + e) : v * e / (1.0 + e);
    } else if (pc.op == 5u) {
        // 0.5 x erfc(-x / sqrt 2)
        float z = v * 0.70710678;
        v = 0.5 * v * (z >= 0.0 ? 2.0 - erfc_pos(z) : erfc_pos(-z));
    } else if (pc.op == 6u) {
        v = v > 0.0 ? v * v : 0.0;
    }
    if (pc.has_mul != 0u) v *= LDF(mul, pc.om + (i % pc.mul_len) * 4u);
    STF(y, pc.oy + i * 4u, v);
}
