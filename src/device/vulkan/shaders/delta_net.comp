#version 450
#include "common.glsl"
// Gated delta rule (kernel-list.h, pkv_k_delta_net_args). One invocation per (sequence,
// v head, value column j): column j of a head's state evolves independently given
// the token's k, q, g, beta and v_j, so the invocation keeps it in registers for
// all of its sequence's tokens and writes it back once. Sums over the key dim go in
// ascending order, as on the CPU; nothing depends on the other sequences of the
// call, so results are batch-invariant. d_k <= 256 (DK_MAX).
layout(binding = 0) buffer Q { uint d[]; } q;
layout(binding = 1) buffer K { uint d[]; } k;
layout(binding = 2) buffer V { uint d[]; } v;
layout(binding = 3) buffer G { uint d[]; } g;
layout(binding = 4) buffer B { uint d[]; } beta;
layout(binding = 5) buffer O { uint d[]; } o;
layout(binding = 6) buffer S { uint d[]; } st;
layout(binding = 7) buffer M { uint d[]; } meta;
layout(push_constant) uniform PC {
    uint oq, ok, ov, og, ob, oo, os, om;
    uint q_stride, k_stride, v_stride, n_tok, n_seq, n_slots, state_stride;
    uint hk, hv, dk, dv, grouped;
    float scale;
} pc;
#define DK_MAX 256
void main() {
    uint nb = (pc.dv + WG - 1u) / WG, gid = group_id();
    uint h = (gid / nb) % pc.hv, s = gid / nb / pc.hv;
    uint j = (gid % nb) * WG + gl_LocalInvocationID.x;
    if (s >= pc.n_seq || j >= pc.dv) return;
    int lo = int(LDW(meta, pc.om + s * 4u)), hi = int(LDW(meta, pc.om + (s + 1u) * 4u));
    int slot = int(LDW(meta, pc.om + (pc.n_seq + 1u + s) * 4u));
    if (lo < 0 || hi < lo || hi > int(pc.n_tok)) return; // a bad range: skipped
    if (slot < 0 || slot >= int(pc.n_slots)) { // a bad slot: zero rows, state untouched
        for (uint t = uint(lo); t < uint(hi); t++) STF(o, pc.oo + ((t * pc.hv + h) * pc.dv + j) * 4u, 0.0);
        return;
    }
    uint kh = pc.grouped != 0u ? h / (pc.hv / pc.hk) : h % pc.hk;
    uint sb = pc.os + uint(slot) * pc.state_stride + (h * pc.dk * pc.dv + j) * 4u, srow = pc.dv * 4u;
    float col[DK_MAX];
    for (uint i = 0u; i < pc.dk; i++) col[i] = LDF(st, sb + i * srow);
    for (uint t = uint(lo); t < uint(hi); t++) {
        uint qb = pc.oq + t * pc.q_stride + kh * pc.dk * 4u, kb = pc.ok + t * pc.k_stride + kh * pc.dk * 4u;
        float decay = exp(LDF(g, pc.og + (t * pc.hv + h) * 4u)), b = LDF(beta, pc.ob + (t * pc.hv + h) * 4u);
        float kv = 0.0;
        for (uint i = 0u; i < pc.dk; i++) {
            col[i] = col[i] * decay;
            kv += col[i] * LDF(k, kb + i * 4u);
        }
        float dj = b * (LDF(v, pc.ov + t * pc.v_stride + (h * pc.dv + j) * 4u) - kv);
        float acc = 0.0;
        for (uint i = 0u; i < pc.dk; i++) {
            col[i] = col[i] + LDF(k, kb + i * 4u) * dj;
            acc += col[i] * LDF(q, qb + i * 4u);
        }
        STF(o, pc.oo + ((t * pc.hv + h) * pc.dv + j) * 4u, acc * pc.scale);
    }
    for (uint i = 0u; i < pc.dk; i++) STF(st, sb + i * srow, col[i]);
}
