#version 450
#include "common.glsl"
#include "kvq.glsl"
// Paged grouped-query causal attention; one workgroup per (query row, head).
// Tokens are processed in chunks of WG: each invocation scores one token of the
// chunk, then every invocation accumulates its own output dims (tid + WG*j) over
// the chunk with an online softmax (running max M and sum L).
// Per-layer options, all off when zero: window (a query sees its last `window`
// visible tokens; the chunks start at the window, so earlier pages are never
// read), softcap (a scaled score s becomes softcap * tanh(s / softcap)) and sinks
// (one more logit per head whose value vector is zero, added to the denominator
// at the end; binding 5, f32 [n_head], read only when has_sinks != 0, else the
// host binds a dummy window).
#define MAX_DK 512u
#define MAX_DV_PER (256u / WG)
layout(binding = 0) buffer Q { uint d[]; } q;
layout(binding = 1) buffer K { uint d[]; } kb;
layout(binding = 2) buffer V { uint d[]; } vb;
layout(binding = 3) buffer O { uint d[]; } o;
layout(binding = 4) buffer M { uint d[]; } meta;
layout(binding = 5) buffer S { uint d[]; } sinks;
layout(binding = 6) buffer W { uint d[]; } qwin; // i32 [n_q], read only when has_qwin != 0
layout(push_constant) uniform PC {
    uint oq, ok, ov, oo, om, os, ow, n_q, n_seq, n_pages, page_size, n_head, n_kv, dk, dv, kt, vt, krow, vrow;
    float scale;
    uint window;
    float softcap;
    uint has_sinks;
    uint has_qwin; // q_win: the window counted back from q_win[i] (device.h)
} pc;
shared float qv[MAX_DK];
shared float sp[WG];
shared int sslot[WG];

// K/V rows read in place (krow/vrow: bytes of one head's row; quantized blocks
// are decoded as they are read)
KV_LOADER(kload, kb)
KV_LOADER(vload, vb)
int mget(uint i) { return int(LDW(meta, pc.om + i * 4u)); }

void main() {
    uint g = group_id(), t = gl_LocalInvocationID.x;
    if (g >= pc.n_q * pc.n_head) return;
    uint qi = g / pc.n_head, h = g % pc.n_head;
    uint kvh = h / (pc.n_head / pc.n_kv);
    for (uint c = t; c < pc.dk; c += WG) qv[c] = LDF(q, pc.oq + ((qi * pc.n_head + h) * pc.dk + c) * 4u);
    int seq = mget(qi);
    int len = mget(pc.n_q + qi);
    int start = 0, npg = 0;
    if (seq >= 0 && uint(seq) < pc.n_seq) {
        start = mget(2u * pc.n_q + uint(seq));
        npg = mget(2u * pc.n_q + uint(seq) + 1u) - start;
    } else {
        len = 0;
    }
    uint pages = 2u * pc.n_q + pc.n_seq + 1u;
    int wend = pc.has_qwin != 0u ? min(int(LDW(qwin, pc.ow + qi * 4u)), len) : len;
    int lo = pc.window > 0u && wend > int(pc.window) ? wend - int(pc.window) : 0;
    barrier();
    float m = -3.402823466e38, l = 0.0;
    float acc[MAX_DV_PER];
    for (uint j = 0u; j < MAX_DV_PER; j++) acc[j] = 0.0;
    for (int c0 = lo; c0 < len; c0 += int(WG)) {
        int tok = c0 + int(t);
        int slot = -1;
        float s = 0.0;
        if (tok < len) {
            int pi = tok / int(pc.page_size);
            if (pi < npg) {
                int page = mget(pages + uint(start + pi));
                if (page >= 0 && uint(page) < pc.n_pages) {
                    slot = int((uint(page) * pc.page_size + uint(tok) % pc.page_size) * pc.n_kv + kvh);
                    uint kbase = pc.ok + uint(slot) * pc.krow;
                    for (uint c = 0u; c < pc.dk; c++) s += qv[c] * kload(pc.kt, kbase, c);
                    s *= pc.scale;
                    // tanh saturates to +-1 in f32 beyond |x| ~ 9; the clamp keeps
                    // drivers that evaluate it through exp(2x) away from inf / inf.
                    if (pc.softcap > 0.0) s = pc.softcap * tanh(clamp(s / pc.softcap, -10.0, 10.0));
                }
            }
        }
        sp[t] = s;
        sslot[t] = slot;
        barrier();
        float cm = -3.402823466e38;
        bool found = false;
        for (uint k = 0u; k < WG; k++)
            if (sslot[k] >= 0) { cm = max(cm, sp[k]); found = true; }
        barrier();
        if (found) {
            float nm = max(m, cm);
            float alpha = exp(m - nm);
            sp[t] = slot >= 0 ? exp(s - nm) : 0.0;
            barrier();
            l *= alpha;
            for (uint j = 0u; j < MAX_DV_PER; j++) acc[j] *= alpha;
            for (uint k = 0u; k < WG; k++) {
                int sl = sslot[k];
                if (sl < 0) continue;
                float pk = sp[k];
                l += pk;
                for (uint j = 0u; j < MAX_DV_PER; j++) {
                    uint dd = t + j * WG;
                    if (dd < pc.dv) acc[j] += pk * vload(pc.vt, pc.ov + uint(sl) * pc.vrow, dd);
                }
            }
            m = nm;
        }
        barrier();
    }
    if (pc.has_sinks != 0u && l > 0.0) {
        // out = acc / (l + e^{sink - m}), rescaled to max(m, sink) so a large sink
        // cannot overflow; a query that saw no token (l == 0) still writes zeros.
        float sk = LDF(sinks, pc.os + h * 4u);
        float nm = max(m, sk), alpha = exp(m - nm);
        l = l * alpha + exp(sk - nm);
        for (uint j = 0u; j < MAX_DV_PER; j++) acc[j] *= alpha;
    }
    for (uint j = 0u; j < MAX_DV_PER; j++) {
        uint dd = t + j * WG;
        if (dd < pc.dv) STF(o, pc.oo + ((qi * pc.n_head + h) * pc.dv + dd) * 4u, l > 0.0 ? acc[j] / l : 0.0);
    }
}
