#version 450
#include "common.glsl"
// Mamba-2's selective scan (kernel-list.h, pkv_k_ssm_scan_args). One invocation per
// (sequence, head, state row i): row i of a head's state evolves independently given
// the token's decay, x_i, B and C, so the invocation keeps it in registers for all of
// its sequence's tokens and writes it back once; the invocations of a workgroup share
// the head's B and C rows through the cache. Sums over the state dim go in ascending
// order, as on the CPU; nothing depends on the other sequences of the call, so
// results are batch-invariant. d_state <= 256 (DS_MAX). Without D the host binds A
// in its place and the shader never reads it.
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer Bm { uint d[]; } bb;
layout(binding = 2) buffer Cm { uint d[]; } cc;
layout(binding = 3) buffer Dt { uint d[]; } dt;
layout(binding = 4) buffer Db { uint d[]; } dtb;
layout(binding = 5) buffer Am { uint d[]; } aa;
layout(binding = 6) buffer Dm { uint d[]; } dd;
layout(binding = 7) buffer Y { uint d[]; } y;
layout(binding = 8) buffer S { uint d[]; } st;
layout(binding = 9) buffer M { uint d[]; } meta;
layout(push_constant) uniform PC {
    uint ox, ob, oc, odt, odb, oa, od, oy, os, om;
    uint x_stride, b_stride, c_stride, n_tok, n_seq, n_slots, state_stride;
    uint nh, hd, ng, ds, has_d;
} pc;
#define DS_MAX 256
void main() {
    uint nb = (pc.hd + WG - 1u) / WG, gid = group_id();
    uint h = (gid / nb) % pc.nh, s = gid / nb / pc.nh;
    uint i = (gid % nb) * WG + gl_LocalInvocationID.x;
    if (s >= pc.n_seq || i >= pc.hd) return;
    int lo = int(LDW(meta, pc.om + s * 4u)), hi = int(LDW(meta, pc.om + (s + 1u) * 4u));
    int slot = int(LDW(meta, pc.om + (pc.n_seq + 1u + s) * 4u));
    if (lo < 0 || hi < lo || hi > int(pc.n_tok)) return; // a bad range: skipped
    uint yrow = pc.nh * pc.hd;
    if (slot < 0 || slot >= int(pc.n_slots)) { // a bad slot: zero rows, state untouched
        for (uint t = uint(lo); t < uint(hi); t++) STF(y, pc.oy + (t * yrow + h * pc.hd + i) * 4u, 0.0);
        return;
    }
    uint g = h / (pc.nh / pc.ng);
    uint sb = pc.os + uint(slot) * pc.state_stride + (h * pc.hd + i) * pc.ds * 4u;
    float row[DS_MAX];
    for (uint n = 0u; n < pc.ds; n++) row[n] = LDF(st, sb + n * 4u);
    float bias = LDF(dtb, pc.odb + h * 4u), A = LDF(aa, pc.oa + h * 4u);
    float skip = pc.has_d != 0u ? LDF(dd, pc.od + h * 4u) : 0.0;
    for (uint t = uint(lo); t < uint(hi); t++) {
        float d = softplus(LDF(dt, pc.odt + (t * pc.nh + h) * 4u) + bias), decay = exp(d * A);
        float xi = LDF(x, pc.ox + t * pc.x_stride + (h * pc.hd + i) * 4u), dx = d * xi;
        uint bo = pc.ob + t * pc.b_stride + g * pc.ds * 4u, co = pc.oc + t * pc.c_stride + g * pc.ds * 4u;
        float acc = 0.0;
        for (uint n = 0u; n < pc.ds; n++) {
            row[n] = row[n] * decay + dx * LDF(bb, bo + n * 4u);
            acc += row[n] * LDF(cc, co + n * 4u);
        }
        STF(y, pc.oy + (t * yrow + h * pc.hd + i) * 4u, acc + skip * xi);
    }
    for (uint n = 0u; n < pc.ds; n++) STF(st, sb + n * 4u, row[n]);
}
