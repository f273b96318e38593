#version 450
#include "common.glsl"
// y[i] = act(g[i]) * u[i]; act = silu, or with `gelu` set the tanh form of gelu
// (Gemma's GeGLU); `oai` (gpt-oss): min(g, limit) * sigmoid(alpha min(g, limit)) times
// clamp(u, -limit, limit) + 1. y may alias g.
layout(binding = 0) buffer G { uint d[]; } g;
layout(binding = 1) buffer U { uint d[]; } u;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(push_constant) uniform PC { uint og, ou, oy, n, gelu, oai; float alpha, limit; } pc;
void main() {
    uint i = group_id() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float x = LDF(g, pc.og + i * 4u);
    float a;
    if (pc.oai != 0u) {
        float xc = min(x, pc.limit), v = clamp(LDF(u, pc.ou + i * 4u), -pc.limit, pc.limit);
        STF(y, pc.oy + i * 4u, xc / (1.0 + exp(-pc.alpha * xc)) * (v + 1.0));
        return;
    }
    if (pc.gelu != 0u) {
        // 0.5 x (1 + tanh(t)) evaluated as x * sigmoid(2t), with exp of a
        // non-positive argument only: nothing overflows (tanh through exp(2t) does
        // on some drivers), and there is no 1 + tanh(t) that cancels where tanh is
        // near -1 (in f32 that loses every digit below x = -5). The clamp keeps
        // exp's argument finite when x^3 overflows; past |t| = 50 the sigmoid is
        // 0 or 1 to f32 precision.
        float t = clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -50.0, 50.0);
        float e = exp(-2.0 * abs(t));
        a = t >= 0.0 ? x / (1.0 + e) : x * e / (1.0 + e);
    } else {
        a = x / (1.0 + exp(-x));
    }
    STF(y, pc.oy + i * 4u, a * LDF(u, pc.ou + i * 4u));
}
