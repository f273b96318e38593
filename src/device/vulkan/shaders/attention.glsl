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
// host binds a dummy window). q_win (binding 6, i32 [n_q], read only when has_qwin
// != 0): the window is counted back from min(q_win[i], len) instead of len.
// chunk (Llama 4's chunked layers): the query sees [floor((e - 1) / chunk) *
// chunk, len) only, e that end (kernel-list.h).
// Compiled twice: attention.comp reads K and V from bindings 1 and 2, each a pool
// that fits one storage-buffer window; attention_win.comp (KV_WINDOWED) reads
// pools larger than that, bound as up to four windows each (bindings 1, 7, 8, 9
// for K; 2, 10, 11, 12 for V; kvq.glsl's KV_WINDOWS): window w holds pages
// [w * ppw, (w + 1) * ppw) and starts at byte offset ok/ok1/ok2/ok3 (ov..) of its
// binding; windows the pool does not need are dummies it never reads. Both take
// the same bindings and push constants. (One shader with a branch on the window
// count ran at half speed on llvmpipe even when the branch was never taken.)
// Head sizes up to DeepSeek's latent row (MLA: dk 576 = 512 + 64 rotary dims, dv 512)
#define MAX_DK 576u
#define MAX_DV_PER (512u / WG)
layout(binding = 0) buffer Q { uint d[]; } q;
layout(binding = 1) buffer K { uint d[]; } kb;
layout(binding = 2) buffer V { uint d[]; } vb;
layout(binding = 3) buffer O { uint d[]; } o;
layout(binding = 4) buffer M { uint d[]; } meta;
layout(binding = 5) buffer S { uint d[]; } sinks;
layout(binding = 6) buffer W { uint d[]; } qwin; // i32 [n_q], read only when has_qwin != 0
#ifdef KV_WINDOWED
layout(binding = 7) buffer K1 { uint d[]; } kb1;
layout(binding = 8) buffer K2 { uint d[]; } kb2;
layout(binding = 9) buffer K3 { uint d[]; } kb3;
layout(binding = 10) buffer V1 { uint d[]; } vb1;
layout(binding = 11) buffer V2 { uint d[]; } vb2;
layout(binding = 12) buffer V3 { uint d[]; } vb3;
#endif
layout(push_constant) uniform PC {
    uint oq, ok, ov, oo, om, os, ow, ok1, ok2, ok3, ov1, ov2, ov3;
    uint n_q, n_seq, n_pages, page_size, n_head, n_kv, dk, dv, kt, vt, krow, vrow;
    float scale;
    uint window;
    float softcap;
    uint has_sinks;
    uint has_qwin; // q_win: the window counted back from q_win[i] (kernel-list.h)
    uint ppw;
    uint chunk;    // chunked layers: a query sees its own chunk only (kernel-list.h)
} pc;
shared float qv[MAX_DK];
shared float sp[WG];
shared int sslot[WG];

// K/V rows read in place (krow/vrow: bytes of one head's row; quantized blocks
// are decoded as they are read)
#ifdef KV_WINDOWED
KV_WINDOW_WORDS(kword, kb, kb1, kb2, kb3)
KV_WINDOW_WORDS(vword, vb, vb1, vb2, vb3)
KV_LOADER_W(kloadw, kword)
KV_LOADER_W(vloadw, vword)
#define KLOAD(w, t, rb, c) kloadw(w, t, rb, c)
#define VLOAD(w, t, rb, c) vloadw(w, t, rb, c)
uint koff(uint w) { return w == 0u ? pc.ok : w == 1u ? pc.ok1 : w == 2u ? pc.ok2 : pc.ok3; }
uint voff(uint w) { return w == 0u ? pc.ov : w == 1u ? pc.ov1 : w == 2u ? pc.ov2 : pc.ov3; }
#else
KV_LOADER(kload1, kb)
KV_LOADER(vload1, vb)
#define KLOAD(w, t, rb, c) kload1(t, rb, c)
#define VLOAD(w, t, rb, c) vload1(t, rb, c)
uint koff(uint w) { return pc.ok; }
uint voff(uint w) { return pc.ov; }
#endif
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
    if (pc.chunk > 0u && wend > 0) lo = max(lo, (wend - 1) / int(pc.chunk) * int(pc.chunk));
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
                    uint in_page = (uint(tok) % pc.page_size) * pc.n_kv + kvh, w = uint(page) / pc.ppw;
                    slot = int(uint(page) * pc.page_size * pc.n_kv + in_page);
                    uint kbase = koff(w) + ((uint(page) - w * pc.ppw) * pc.page_size * pc.n_kv + in_page) * pc.krow;
                    for (uint c = 0u; c < pc.dk; c++) s += qv[c] * KLOAD(w, pc.kt, kbase, c);
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
                uint wslots = pc.ppw * pc.page_size * pc.n_kv, w = uint(sl) / wslots;
                uint vbase = voff(w) + (uint(sl) - w * wslots) * pc.vrow;
                for (uint j = 0u; j < MAX_DV_PER; j++) {
                    uint dd = t + j * WG;
                    if (j * WG >= pc.dv) break; // uniform: the usual heads use the first few
                    if (dd < pc.dv) acc[j] += pk * VLOAD(w, pc.vt, vbase, dd);
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
