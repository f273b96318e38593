#version 450
#include "common.glsl"
// Causal depthwise conv1d with a rolling state (kernel-list.h, pkv_k_ssm_conv_args).
// One invocation per (sequence, channel) walks its sequence's tokens in order with
// the channel's last d_conv - 1 inputs in registers: the taps are summed oldest to
// newest, the token itself last, as on the CPU. x[t][c] is read before y[t][c] is
// written by the same invocation, so y may alias x.
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer W { uint d[]; } w;
layout(binding = 2) buffer Y { uint d[]; } y;
layout(binding = 3) buffer S { uint d[]; } st;
layout(binding = 4) buffer M { uint d[]; } meta;
layout(push_constant) uniform PC {
    uint ox, ow, oy, os, om;
    uint n_tok, channels, n_seq, d_conv, n_slots, state_stride, silu;
} pc;
void main() {
    uint gid = group_id() * WG + gl_LocalInvocationID.x;
    uint s = gid / pc.channels, c = gid % pc.channels;
    if (s >= pc.n_seq) return;
    int lo = int(LDW(meta, pc.om + s * 4u)), hi = int(LDW(meta, pc.om + (s + 1u) * 4u));
    int slot = int(LDW(meta, pc.om + (pc.n_seq + 1u + s) * 4u));
    if (lo < 0 || hi < lo || hi > int(pc.n_tok)) return; // a bad range: skipped
    uint C = pc.channels, K = pc.d_conv;
    if (slot < 0 || slot >= int(pc.n_slots)) { // a bad slot: zero rows, state untouched
        for (uint t = uint(lo); t < uint(hi); t++) STF(y, pc.oy + (t * C + c) * 4u, 0.0);
        return;
    }
    uint sb = pc.os + uint(slot) * pc.state_stride;
    float win[15]; // PKV_SSM_CONV_MAX - 1
    for (uint j = 0u; j + 1u < K; j++) win[j] = LDF(st, sb + (j * C + c) * 4u);
    uint wb = pc.ow + c * K * 4u;
    for (uint t = uint(lo); t < uint(hi); t++) {
        float xin = LDF(x, pc.ox + (t * C + c) * 4u);
        float acc = 0.0;
        for (uint j = 0u; j + 1u < K; j++) acc += LDF(w, wb + j * 4u) * win[j];
        acc += LDF(w, wb + (K - 1u) * 4u) * xin;
        for (uint j = 0u; j + 2u < K; j++) win[j] = win[j + 1u];
        win[K - 2u] = xin;
        STF(y, pc.oy + (t * C + c) * 4u, pc.silu != 0u ? acc / (1.0 + exp(-acc)) : acc);
    }
    for (uint j = 0u; j + 1u < K; j++) STF(st, sb + (j * C + c) * 4u, win[j]);
}
