// KV page element types shared by set_rows, rope and attention. Type codes (push
// constants): 0 f32, 1 f16, 2 q8_0, 3 q4_0. Quantized rows are GGUF blocks of 32
// along a head (base/quant.h): q8_0 { f16 d; i8 q[32]; } 34 bytes, x = d * q;
// q4_0 { f16 d; u8 qs[16]; } 18 bytes, element j < 16 is qs[j] & 15, element
// j + 16 is qs[j] >> 4, x = d * (q - 8). Blocks start at even bytes.
#define KVT_F32 0u
#define KVT_F16 1u
#define KVT_Q8_0 2u
#define KVT_Q4_0 3u

// Element c of the row starting at byte rb of buffer B, type t: one exact product
// d * q, as the CPU's dequantizers compute it.
#define KV_LOADER(NAME, B)                                                         \
    float NAME(uint t, uint rb, uint c) {                                          \
        if (t == KVT_F32) return LDF(B, rb + c * 4u);                              \
        if (t == KVT_F16) return half_to_float(LDH(B, rb + c * 2u));               \
        if (t == KVT_Q8_0) {                                                       \
            uint b = rb + (c >> 5) * 34u;                                          \
            int q = int(LDB(B, b + 2u + (c & 31u)));                               \
            return half_to_float(LDH(B, b)) * float(q >= 128 ? q - 256 : q);       \
        }                                                                          \
        uint b = rb + (c >> 5) * 18u, j = c & 31u;                                 \
        uint by = LDB(B, b + 2u + (j & 15u));                                      \
        return half_to_float(LDH(B, b)) * float(int(j < 16u ? (by & 15u) : (by >> 4)) - 8); \
    }

// A KV pool larger than one storage-buffer window (maxStorageBufferRange) is
// bound as up to KV_WINDOWS windows of whole pages, each a binding of its own
// (four separate bindings, chosen by a branch on the window index, need no
// descriptor-indexing feature). WORDS(w, i) is word i of window w; the loader
// reads element c of the row at byte rb of window w, as KV_LOADER does.
#define KV_WINDOWS 4u
#define KV_WINDOW_WORDS(NAME, B0, B1, B2, B3)                                      \
    uint NAME(uint w, uint i) {                                                    \
        if (w == 0u) return B0.d[i];                                               \
        if (w == 1u) return B1.d[i];                                               \
        if (w == 2u) return B2.d[i];                                               \
        return B3.d[i];                                                            \
    }
#define KV_LOADER_W(NAME, WORDS)                                                   \
    float NAME(uint w, uint t, uint rb, uint c) {                                  \
        if (t == KVT_F32) return uintBitsToFloat(WORDS(w, (rb + c * 4u) >> 2));    \
        if (t == KVT_F16) {                                                        \
            uint a = rb + c * 2u;                                                  \
            return half_to_float((WORDS(w, a >> 2) >> ((a & 2u) * 8u)) & 0xffffu);  \
        }                                                                          \
        uint b = rb + (c >> 5) * (t == KVT_Q8_0 ? 34u : 18u);                      \
        float d = half_to_float((WORDS(w, b >> 2) >> ((b & 2u) * 8u)) & 0xffffu);  \
        uint j = c & 31u, a = b + 2u + (t == KVT_Q8_0 ? j : (j & 15u));            \
        uint by = (WORDS(w, a >> 2) >> ((a & 3u) * 8u)) & 0xffu;                   \
        if (t == KVT_Q8_0) return d * float(int(by) >= 128 ? int(by) - 256 : int(by)); \
        return d * float(int(j < 16u ? (by & 15u) : (by >> 4)) - 8);               \
    }

// Store bytes [a, a + n) of B from by[] (n <= 34). Words wholly inside the range
// are stored; the words at its ends may hold another invocation's bytes, so they
// are updated with two atomics on disjoint bits.
#define KV_BYTE_STORER(NAME, B)                                                    \
    void NAME(uint a, uint n, uint by[34]) {                                       \
        uint w0 = a >> 2, w1 = (a + n - 1u) >> 2;                                  \
        for (uint w = w0; w <= w1; w++) {                                          \
            uint val = 0u, mask = 0u;                                              \
            for (uint k = 0u; k < 4u; k++) {                                       \
                uint ad = w * 4u + k;                                              \
                if (ad >= a && ad < a + n) {                                       \
                    val |= (by[ad - a] & 0xffu) << (8u * k);                       \
                    mask |= 0xffu << (8u * k);                                     \
                }                                                                  \
            }                                                                      \
            if (mask == 0xffffffffu) {                                             \
                B.d[w] = val;                                                      \
            } else {                                                               \
                atomicAnd(B.d[w], ~mask);                                          \
                atomicOr(B.d[w], val);                                             \
            }                                                                      \
        }                                                                          \
    }

// A pool bound as up to four windows B0..B3 (the KV_WINDOWED shaders): ST, AND
// and OR store word i of window w, and apply the two atomics of a partial-word
// store; KV_WINDOW_BYTE_STORER(NAME, ST, AND, OR) is KV_BYTE_STORER over them,
// NAME(w, a, n, by) storing bytes [a, a + n) of window w.
#define KV_WINDOW_STORES(ST, AND, OR, B0, B1, B2, B3)                             \
    void ST(uint w, uint i, uint v) {                                              \
        if (w == 0u) B0.d[i] = v;                                                  \
        else if (w == 1u) B1.d[i] = v;                                             \
        else if (w == 2u) B2.d[i] = v;                                             \
        else B3.d[i] = v;                                                          \
    }                                                                              \
    void AND(uint w, uint i, uint m) {                                             \
        if (w == 0u) atomicAnd(B0.d[i], m);                                        \
        else if (w == 1u) atomicAnd(B1.d[i], m);                                   \
        else if (w == 2u) atomicAnd(B2.d[i], m);                                   \
        else atomicAnd(B3.d[i], m);                                                \
    }                                                                              \
    void OR(uint w, uint i, uint m) {                                              \
        if (w == 0u) atomicOr(B0.d[i], m);                                         \
        else if (w == 1u) atomicOr(B1.d[i], m);                                    \
        else if (w == 2u) atomicOr(B2.d[i], m);                                    \
        else atomicOr(B3.d[i], m);                                                 \
    }
#define KV_WINDOW_BYTE_STORER(NAME, ST, AND, OR)                                   \
    void NAME(uint w, uint a, uint n, uint by[34]) {                               \
        uint w0 = a >> 2, w1 = (a + n - 1u) >> 2;                                  \
        for (uint wi = w0; wi <= w1; wi++) {                                       \
            uint val = 0u, mask = 0u;                                              \
            for (uint k = 0u; k < 4u; k++) {                                       \
                uint ad = wi * 4u + k;                                             \
                if (ad >= a && ad < a + n) {                                       \
                    val |= (by[ad - a] & 0xffu) << (8u * k);                       \
                    mask |= 0xffu << (8u * k);                                     \
                }                                                                  \
            }                                                                      \
            if (mask == 0xffffffffu) {                                             \
                ST(w, wi, val);                                                    \
            } else {                                                               \
                AND(w, wi, ~mask);                                                 \
                OR(w, wi, val);                                                    \
            }                                                                      \
        }                                                                          \
    }

// One block of 32 floats x quantized as quant.h's reference quantizers do, into
// by[0..block bytes). Returns the block's byte count.
uint kv_quant_block(uint t, float x[32], out uint by[34]) {
    if (t == KVT_Q8_0) {
        float amax = 0.0;
        for (uint j = 0u; j < 32u; j++) amax = max(amax, abs(x[j]));
        precise float d = amax / 127.0;
        precise float id = d != 0.0 ? 1.0 / d : 0.0;
        uint h = float_to_half(d);
        by[0] = h & 0xffu;
        by[1] = h >> 8;
        for (uint j = 0u; j < 32u; j++) {
            precise float s = x[j] * id;
            int q = clamp(int(roundEven(s)), -127, 127);
            by[2u + j] = uint(q) & 0xffu;
        }
        return 34u;
    }
    float amax = 0.0, mx = 0.0;
    for (uint j = 0u; j < 32u; j++)
        if (abs(x[j]) > amax) {
            amax = abs(x[j]);
            mx = x[j];
        }
    precise float d = mx / -8.0;
    precise float id = d != 0.0 ? 1.0 / d : 0.0;
    uint h = float_to_half(d);
    by[0] = h & 0xffu;
    by[1] = h >> 8;
    for (uint j = 0u; j < 16u; j++) {
        precise float s0 = x[j] * id;
        precise float t0 = s0 + 8.5;
        precise float s1 = x[j + 16u] * id;
        precise float t1 = s1 + 8.5;
        int q0 = clamp(int(t0), 0, 15), q1 = clamp(int(t1), 0, 15);
        by[2u + j] = uint(q0) | (uint(q1) << 4);
    }
    for (uint j = 18u; j < 34u; j++) by[j] = 0u;
    return 18u;
}
