#version 450
#include "common.glsl"
// Mixture-of-experts routing, one invocation per token (kernel-list.h,
// pkv_k_moe_route_args): softmax's max and sum, the group mask, then k passes of
// selection over the experts. The scores are recomputed from the logits on each pass
// (no per-expert array), in float. Without a bias the host binds the logits in its
// place and the shader never reads it.
layout(binding = 0) buffer L { uint d[]; } logits;
layout(binding = 1) buffer B { uint d[]; } bias;
layout(binding = 2) buffer S { uint d[]; } sel;
layout(binding = 3) buffer W { uint d[]; } wts;
layout(push_constant) uniform PC {
    uint ol, ob, os, ow, n, n_expert, k, n_group, n_group_used, gating, norm_w, sel_logits, has_bias, w_scale;
} pc;

float prob(uint row, uint e, float mx, float sum) {
    float l = LDF(logits, row + e * 4u);
    return pc.gating == 0u ? exp(l - mx) / sum : pc.gating == 2u ? 1.0 / (1.0 + exp(-l)) : l;
}

float score(uint row, uint e, float mx, float sum) {
    if (pc.sel_logits != 0u) return LDF(logits, row + e * 4u);
    return prob(row, e, mx, sum) + (pc.has_bias != 0u ? LDF(bias, pc.ob + e * 4u) : 0.0);
}

void main() {
    uint t = group_id() * WG + gl_LocalInvocationID.x;
    if (t >= pc.n) return;
    uint row = pc.ol + t * pc.n_expert * 4u, so = pc.os + t * pc.k * 4u, wo = pc.ow + t * pc.k * 4u;
    float mx = LDF(logits, row), sum = 0.0;
    for (uint e = 1u; e < pc.n_expert; e++) mx = max(mx, LDF(logits, row + e * 4u));
    if (pc.gating == 0u)
        for (uint e = 0u; e < pc.n_expert; e++) sum += exp(LDF(logits, row + e * 4u) - mx);
    uint G = pc.n_group > 1u ? pc.n_group : 1u, per = pc.n_expert / G;
    uint keep0 = 0xffffffffu, keep1 = 0xffffffffu; // groups that may be chosen (64 bits)
    if (pc.n_group > 1u) {
        float gs[64];
        for (uint g = 0u; g < G; g++) {
            int b0 = -1, b1 = -1;
            float v0 = 0.0, v1 = 0.0;
            for (uint e = g * per; e < (g + 1u) * per; e++) {
                float v = score(row, e, mx, sum);
                if (b0 < 0 || v > v0) {
                    b1 = b0, v1 = v0, b0 = int(e), v0 = v;
                } else if (b1 < 0 || v > v1) {
                    b1 = int(e), v1 = v;
                }
            }
            gs[g] = v0 + v1;
        }
        keep0 = 0u, keep1 = 0u;
        for (uint i = 0u; i < pc.n_group_used; i++) {
            int best = -1;
            for (uint g = 0u; g < G; g++) {
                bool kept = g < 32u ? ((keep0 >> g) & 1u) != 0u : ((keep1 >> (g - 32u)) & 1u) != 0u;
                if (!kept && (best < 0 || gs[g] > gs[best])) best = int(g);
            }
            if (best < 32) keep0 |= 1u << uint(best); else keep1 |= 1u << uint(best - 32);
        }
    }
    for (uint k = 0u; k < pc.k; k++) {
        int best = -1;
        float bv = 0.0;
        for (uint e = 0u; e < pc.n_expert; e++) {
            uint g = e / per;
            bool kept = g < 32u ? ((keep0 >> g) & 1u) != 0u : ((keep1 >> (g - 32u)) & 1u) != 0u;
            if (!kept) continue;
            bool taken = false;
            for (uint j = 0u; j < k && !taken; j++) taken = LDW(sel, so + j * 4u) == e;
            if (taken) continue;
            float v = score(row, e, mx, sum);
            if (best < 0 || v > bv) {
                best = int(e);
                bv = v;
            }
        }
        sel.d[(so + k * 4u) >> 2] = uint(best);
    }
    float ws = 0.0;
    uint e0 = LDW(sel, so);
    for (uint k = 0u; k < pc.k; k++) {
        uint e = LDW(sel, so + k * 4u);
        float p = prob(row, e, mx, sum);
        float w = pc.gating == 1u ? exp(p - LDF(logits, row + e0 * 4u)) : p;
        STF(wts, wo + k * 4u, w);
        ws += w;
    }
    if (pc.gating == 1u || pc.norm_w != 0u) {
        if (pc.gating != 1u) ws = max(ws, 6.103515625e-5);
        for (uint k = 0u; k < pc.k; k++) STF(wts, wo + k * 4u, LDF(wts, wo + k * 4u) / ws);
    }
    float sc = uintBitsToFloat(pc.w_scale);
    if (sc != 0.0)
        for (uint k = 0u; k < pc.k; k++) STF(wts, wo + k * 4u, LDF(wts, wo + k * 4u) * sc);
}
