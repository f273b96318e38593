#include "common.glsl"
#include "kvq.glsl"
// Rotary embedding in place. f32/f16 rows: one invocation per (row, head, pair).
// q8_0/q4_0 rows: one invocation per (row, head): the head is dequantized,
// rotated in f32 and quantized again (head_dim <= MAX_QHEAD, checked by the host).
// Compiled twice: rope.comp rotates x through binding 0, which fits one
// storage-buffer window; rope_win.comp (KV_WINDOWED) rotates rows of a KV pool
// larger than that (the re-rotation of cached K after a shift), bound as up to
// four windows (bindings 0, 3, 4, 5) of rpw rows each, window w starting at byte
// ox/ox1/ox2/ox3 of its binding. Both take the same bindings and push constants.
// Binding 6: LongRoPE's frequency factors (f32 [n_rot/2] from byte off), when has_ff.
#define MAX_QHEAD 512u
layout(binding = 0) buffer X { uint d[]; } x;
layout(binding = 1) buffer P { uint d[]; } p;
layout(binding = 2) buffer R { uint d[]; } rw;
#ifdef KV_WINDOWED
layout(binding = 3) buffer X1 { uint d[]; } x1;
layout(binding = 4) buffer X2 { uint d[]; } x2;
layout(binding = 5) buffer X3 { uint d[]; } x3;
#endif
layout(binding = 6) buffer F { uint d[]; } ff;
layout(push_constant) uniform PC {
    uint ox, op, orw, ox1, ox2, ox3, off, n_rows, row_stride, n_heads, head_dim, n_rot, neox, t, has_rows, rpw, max_rows;
    float freq_base, freq_scale;
    float ext_factor, corr_lo, corr_hi, mscale; // YaRN (ext_factor 0: none); mscale 1 = none
    uint has_ff;
} pc;

// The angle of pair i (kernel-list.h): pos * freq_scale * base^(-2i/n_rot), or with YaRN
// the mix of that and the unscaled angle; with frequency factors base^(-2i/n_rot) / ff[i].
float rope_theta(float pos, uint i) {
    float p = pow(pc.freq_base, -2.0 * float(i) / float(pc.n_rot));
    if (pc.has_ff != 0u) p /= LDF(ff, pc.off + i * 4u); // LongRoPE: the angle over pair i's factor
    if (pc.ext_factor == 0.0) return pos * pc.freq_scale * p;
    float y = (float(i) - pc.corr_lo) / max(0.001, pc.corr_hi - pc.corr_lo);
    float mix = (1.0 - min(1.0, max(0.0, y))) * pc.ext_factor;
    return pos * p * (pc.freq_scale * (1.0 - mix) + mix);
}
// Word i of window w of x: load, store, and the atomics of a partial-word store.
#ifdef KV_WINDOWED
KV_WINDOW_WORDS(x_ld, x, x1, x2, x3)
KV_WINDOW_STORES(x_st, x_and, x_or, x, x1, x2, x3)
uint x_off(uint w) { return w == 0u ? pc.ox : w == 1u ? pc.ox1 : w == 2u ? pc.ox2 : pc.ox3; }
#else
uint x_ld(uint w, uint i) { return x.d[i]; }
void x_st(uint w, uint i, uint v) { x.d[i] = v; }
void x_and(uint w, uint i, uint m) { atomicAnd(x.d[i], m); }
void x_or(uint w, uint i, uint m) { atomicOr(x.d[i], m); }
uint x_off(uint w) { return pc.ox; }
#endif
KV_LOADER_W(xload, x_ld)
float x_half(uint w, uint a) { return half_to_float((x_ld(w, a >> 2) >> ((a & 2u) * 8u)) & 0xffffu); }
void x_sth(uint w, uint a, uint h) {
    uint s = (a & 2u) * 8u;
    x_and(w, a >> 2, ~(0xffffu << s));
    x_or(w, a >> 2, (h & 0xffffu) << s);
}
// Bytes [a, a + n) of window w from by[] (n <= 34), as kvq.glsl's KV_BYTE_STORER.
KV_WINDOW_BYTE_STORER(store_bytes, x_st, x_and, x_or)

void rope_quant(uint e) {
    if (e >= pc.n_rows * pc.n_heads) return;
    uint h = e % pc.n_heads, r = e / pc.n_heads;
    uint row = pc.has_rows != 0u ? LDW(rw, pc.orw + r * 4u) : r;
    if (row >= pc.max_rows) return; // rows outside [0, max_rows) are skipped (kernel-list.h)
    float pos = float(int(LDW(p, pc.op + r * 4u)));
    uint bb = pc.t == KVT_Q8_0 ? 34u : 18u, nb = pc.head_dim / 32u;
    uint w = row / pc.rpw;
    uint base = x_off(w) + (row - w * pc.rpw) * pc.row_stride + h * nb * bb;
    float f[MAX_QHEAD];
    for (uint c = 0u; c < pc.head_dim; c++) f[c] = xload(w, pc.t, base, c);
    uint half_rot = pc.n_rot / 2u;
    for (uint i = 0u; i < half_rot; i++) {
        float theta = rope_theta(pos, i);
        float cs = cos(theta) * pc.mscale, sn = sin(theta) * pc.mscale;
        uint e0 = pc.neox != 0u ? i : 2u * i, e1 = pc.neox != 0u ? i + half_rot : 2u * i + 1u;
        float a = f[e0], b = f[e1];
        f[e0] = a * cs - b * sn;
        f[e1] = a * sn + b * cs;
    }
    for (uint k = 0u; k < nb; k++) {
        float blk[32];
        for (uint j = 0u; j < 32u; j++) blk[j] = f[k * 32u + j];
        uint by[34];
        kv_quant_block(pc.t, blk, by);
        store_bytes(w, base + k * bb, bb, by);
    }
}

void main() {
    uint e = group_id() * WG + gl_LocalInvocationID.x;
    if (pc.t >= KVT_Q8_0) {
        rope_quant(e);
        return;
    }
    uint half_rot = pc.n_rot / 2u;
    if (e >= pc.n_rows * pc.n_heads * half_rot) return;
    uint i = e % half_rot, h = (e / half_rot) % pc.n_heads, r = e / (half_rot * pc.n_heads);
    uint row = pc.has_rows != 0u ? LDW(rw, pc.orw + r * 4u) : r;
    if (row >= pc.max_rows) return;
    float pos = float(int(LDW(p, pc.op + r * 4u)));
    float theta = rope_theta(pos, i);
    float cs = cos(theta) * pc.mscale, sn = sin(theta) * pc.mscale;
    uint e0 = pc.neox != 0u ? i : 2u * i, e1 = pc.neox != 0u ? i + half_rot : 2u * i + 1u;
    uint es = pc.t == KVT_F16 ? 2u : 4u;
    uint w = row / pc.rpw;
    uint base = x_off(w) + (row - w * pc.rpw) * pc.row_stride + h * pc.head_dim * es;
    uint a0 = base + e0 * es, a1 = base + e1 * es;
    if (pc.t == KVT_F16) {
        float a = x_half(w, a0), b = x_half(w, a1);
        x_sth(w, a0, float_to_half(a * cs - b * sn));
        x_sth(w, a1, float_to_half(a * sn + b * cs));
    } else {
        float a = uintBitsToFloat(x_ld(w, a0 >> 2)), b = uintBitsToFloat(x_ld(w, a1 >> 2));
        x_st(w, a0 >> 2, floatBitsToUint(a * cs - b * sn));
        x_st(w, a1 >> 2, floatBitsToUint(a * sn + b * cs));
    }
}
