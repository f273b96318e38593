#version 450
#include "common.glsl"
// The experts' weighted sum (kernel-list.h, pkv_k_moe_combine_args): element (i, c)
// of y, times w[i], into row rows[i] of out (added with add, else stored). The rows
// of one call are distinct, so no two invocations write one element.
layout(binding = 0) buffer O { uint d[]; } outp;
layout(binding = 1) buffer Y { uint d[]; } y;
layout(binding = 2) buffer R { uint d[]; } rows;
layout(binding = 3) buffer W { uint d[]; } wts;
layout(push_constant) uniform PC { uint oo, oy, orr, ow, n, cols, out_rows, add; } pc;
void main() {
    uint i = group_id() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n * pc.cols) return;
    uint r = i / pc.cols, c = i % pc.cols;
    int row = int(LDW(rows, pc.orr + r * 4u));
    if (row < 0 || uint(row) >= pc.out_rows) return;
    uint a = pc.oo + (uint(row) * pc.cols + c) * 4u;
    float v = LDF(wts, pc.ow + r * 4u) * LDF(y, pc.oy + i * 4u);
    STF(outp, a, pc.add != 0u ? LDF(outp, a) + v : v);
}
