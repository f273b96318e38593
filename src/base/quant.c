/* Reference conversions for the GGUF block formats (see quant.h for the simple
 * blocks). The dequantizers are the definition: they compute in float in the
 * same order as GGUF's reference, so results are bit-exact. The quantizers are
 * plain nearest-rounding ones; they produce valid blocks close to the input but
 * are not tuned like the importance-weighted quantizers of other tools.
 *
 * K-quant super-blocks (256 elements, little-endian, packed):
 *   q4_k: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }             144 bytes
 *         8 sub-blocks of 32 with a 6-bit scale sc[j] and a 6-bit min m[j]:
 *           j < 4:  sc = scales[j] & 63,  m = scales[j+4] & 63
 *           j >= 4: sc = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4
 *                   m  = (scales[j+4] >> 4) | (scales[j]   >> 6) << 4
 *         element 64*g + l (l < 32) is qs[32*g + l] & 15 in sub-block 2g,
 *         element 64*g + 32 + l is qs[32*g + l] >> 4 in sub-block 2g+1;
 *         x = (d*sc) * q - (dmin*m)
 *   q5_k: { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }  176 bytes
 *         as q4_k, plus a fifth bit: element 64*g + l gets 16 if qh[l] bit 2g is set,
 *         element 64*g + 32 + l gets 16 if qh[l] bit 2g+1 is set.
 *   q6_k: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }            210 bytes
 *         per half h (128 elements; ql += 64h, qh += 32h, scales += 8h), l < 32:
 *           element 128h + l      = (ql[l] & 15)    | ((qh[l] >> 0) & 3) << 4, scale sc[l/16]
 *           element 128h + 32 + l = (ql[l+32] & 15) | ((qh[l] >> 2) & 3) << 4, scale sc[l/16 + 2]
 *           element 128h + 64 + l = (ql[l] >> 4)    | ((qh[l] >> 4) & 3) << 4, scale sc[l/16 + 4]
 *           element 128h + 96 + l = (ql[l+32] >> 4) | ((qh[l] >> 6) & 3) << 4, scale sc[l/16 + 6]
 *         x = d * sc * (q - 32)
 *   q8_k: { f32 d; i8 qs[256]; i16 bsums[16]; }                          292 bytes
 *         x = d * q; bsums[i] = sum of qs[16i .. 16i+16). */
#include "base/quant.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

static float rd_f16(const uint8_t *p) { return pkv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static void wr_f16(uint8_t *p, float f) {
    uint16_t h = pkv_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* ---------------------------------------------------------------- dequantize */

static void deq_q8_0(const uint8_t *b, float *y) {
    const float d = rd_f16(b);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
}

static void deq_q4_0(const uint8_t *b, float *y) {
    const float d = rd_f16(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((b[2 + j] & 15) - 8);
        y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

const int8_t pkv_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Every product is exact: a small integer times a power of two (or an
 * overflow to infinity for e >= 254 and the largest codes, as in ggml). */
static void deq_mxfp4(const uint8_t *b, float *y) {
    const float d = pkv_e8m0_half(b[0]);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)pkv_mxfp4_kvalues[b[1 + j] & 15] * d;
        y[j + 16] = (float)pkv_mxfp4_kvalues[b[1 + j] >> 4] * d;
    }
}

static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void deq_q4_k(const uint8_t *b, float *y) {
    const float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int g = 0; g < 4; g++) {
        int sc, m;
        scale_min_k4(2 * g, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(2 * g + 1, scales, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) y[64 * g + l] = d1 * (float)(q[32 * g + l] & 15) - m1;
        for (int l = 0; l < 32; l++) y[64 * g + 32 + l] = d2 * (float)(q[32 * g + l] >> 4) - m2;
    }
}

static void deq_q5_k(const uint8_t *b, float *y) {
    const float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *q = b + 48;
    for (int g = 0; g < 4; g++) {
        int sc, m;
        scale_min_k4(2 * g, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(2 * g + 1, scales, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        const int u1 = 1 << (2 * g), u2 = 2 << (2 * g);
        for (int l = 0; l < 32; l++)
            y[64 * g + l] = d1 * (float)((q[32 * g + l] & 15) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            y[64 * g + 32 + l] = d2 * (float)((q[32 * g + l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    const float d = rd_f16(b + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
        float *yy = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
            const int q2 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
            const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            yy[l] = d * (float)sc[is] * (float)q1;
            yy[l + 32] = d * (float)sc[is + 2] * (float)q2;
            yy[l + 64] = d * (float)sc[is + 4] * (float)q3;
            yy[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

static void deq_q8_k(const uint8_t *b, float *y) {
    float d;
    memcpy(&d, b, 4);
    for (int j = 0; j < 256; j++) y[j] = d * (float)(int8_t)b[4 + j];
}

/* Dequantize one block of type t (block_elems elements) into y. */
static bool deq_block(pkv_type t, const uint8_t *b, float *y) {
    switch (t) {
    case PKV_TYPE_F32: memcpy(y, b, 4); return true;
    case PKV_TYPE_F16: y[0] = rd_f16(b); return true;
    case PKV_TYPE_BF16: y[0] = pkv_bf16_to_f32((uint16_t)(b[0] | b[1] << 8)); return true;
    case PKV_TYPE_Q8_0: deq_q8_0(b, y); return true;
    case PKV_TYPE_Q4_0: deq_q4_0(b, y); return true;
    case PKV_TYPE_Q4_K: deq_q4_k(b, y); return true;
    case PKV_TYPE_Q5_K: deq_q5_k(b, y); return true;
    case PKV_TYPE_Q6_K: deq_q6_k(b, y); return true;
    case PKV_TYPE_Q8_K: deq_q8_k(b, y); return true;
    case PKV_TYPE_MXFP4: deq_mxfp4(b, y); return true;
    default: break;
    }
    const pkv_qblock_fn dec = pkv_qblock_decoder(t);
    if (!dec) return false;
    pkv_qblock o;
    dec(b, &o);
    const int n = (int)pkv_type_block_elems(t);
    if (pkv_qblock_has_min(t))
        for (int i = 0; i < n; i++) y[i] = o.d[i / 16] * (float)o.q[i] + o.m[i / 16];
    else
        for (int i = 0; i < n; i++) y[i] = o.d[i / 16] * (float)o.q[i];
    return true;
}

static pkv_status check_row(const char *what, pkv_type t, int64_t n) {
    if (t == PKV_TYPE_I32 || pkv_type_block_elems(t) == 0)
        return pkv_err(PKV_ERR_UNSUPPORTED, "%s: type %s (%d) is not a weight type", what,
                       pkv_type_name(t) ? pkv_type_name(t) : "(unknown)", (int)t);
    if (n < 0 || (size_t)n % pkv_type_block_elems(t))
        return pkv_err(PKV_ERR_INVALID, "%s: %lld elements is not a whole number of %s blocks of %zu", what,
                       (long long)n, pkv_type_name(t), pkv_type_block_elems(t));
    return PKV_OK;
}

pkv_status pkv_dequantize_row(pkv_type t, const void *src, float *dst, int64_t n) {
    pkv_status s = check_row("dequantize", t, n);
    if (s) return s;
    const size_t be = pkv_type_block_elems(t), bb = pkv_type_block_bytes(t);
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / (int64_t)be; i++) deq_block(t, p + (size_t)i * bb, dst + (size_t)i * be);
    return PKV_OK;
}

double pkv_dot_ref(pkv_type t, const void *w, const float *x, int64_t n) {
    if (check_row("dot", t, n)) return NAN;
    const size_t be = pkv_type_block_elems(t), bb = pkv_type_block_bytes(t);
    const uint8_t *p = w;
    float tmp[256];
    double acc = 0;
    for (int64_t i = 0; i < n / (int64_t)be; i++) {
        deq_block(t, p + (size_t)i * bb, tmp);
        for (size_t j = 0; j < be; j++) acc += (double)tmp[j] * (double)x[(size_t)i * be + j];
    }
    return acc;
}

/* ------------------------------------------------------------------ quantize */

static int nearest(float f) { return (int)lrintf(f); }
static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void q_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr_f16(b, d);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)clampi(nearest(x[j] * id), -127, 127);
}

static void q_q4_0(const float *x, uint8_t *b) {
    float amax = 0, max = 0; /* max: the signed value of largest magnitude */
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr_f16(b, d);
    for (int j = 0; j < 16; j++) {
        const int q0 = clampi((int)(x[j] * id + 8.5f), 0, 15);
        const int q1 = clampi((int)(x[j + 16] * id + 8.5f), 0, 15);
        b[2 + j] = (uint8_t)(q0 | q1 << 4);
    }
}

/* mxfp4 as the MX spec converts: the shared exponent is floor(log2(amax)) minus
 * E2M1's largest exponent (2), so amax / 2^(e - 127) lies in [4, 8); each element
 * is then rounded to the nearest E2M1 value, ties to the even code, and
 * magnitudes past 6 saturate to 6. Works in the doubled units of
 * pkv_mxfp4_kvalues: v = x / 2^(e - 128) by ldexpf (exact for every x that can
 * round to a non-zero code). */
static int mxfp4_code(float x, int e) {
    const float v = fabsf(ldexpf(x, 128 - e));
    /* midpoints between 0, 1, 2, 3, 4, 6, 8, 12; at a tie the even code wins */
    const int m = v <= 0.5f ? 0 : v < 1.5f ? 1 : v <= 2.5f ? 2 : v < 3.5f ? 3 : v <= 5.0f ? 4 : v < 7.0f ? 5
                : v <= 10.0f ? 6 : 7;
    return m == 0 ? 0 : x < 0 ? m | 8 : m;
}

static void q_mxfp4(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    int e = 0;
    if (!isfinite(amax)) { /* no meaningful scale: the largest finite one */
        e = 254;
    } else if (amax > 0) {
        int ex;
        frexpf(amax, &ex); /* amax = f * 2^ex, f in [0.5, 1): floor(log2(amax)) = ex - 1 */
        e = clampi(ex - 1 - 2 + 127, 0, 254);
    }
    b[0] = (uint8_t)e;
    for (int j = 0; j < 16; j++) b[1 + j] = (uint8_t)(mxfp4_code(x[j], e) | mxfp4_code(x[j + 16], e) << 4);
}

/* q4_k / q5_k: per sub-block of 32, x ≈ scale*q - min with q in [0, qmax]. */
static void q_kmin(const float *x, uint8_t *b, int qmax, bool five) {
    float scale[8], mn[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float lo = x[32 * j], hi = x[32 * j];
        for (int l = 1; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        if (lo > 0) lo = 0;
        scale[j] = (hi - lo) / (float)qmax;
        mn[j] = -lo;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, mn[j]);
    }
    memset(b, 0, pkv_type_block_bytes(five ? PKV_TYPE_Q5_K : PKV_TYPE_Q4_K));
    wr_f16(b, max_scale / 63.0f);
    wr_f16(b + 2, max_min / 63.0f);
    const float d = rd_f16(b), dmin = rd_f16(b + 2); /* what a reader will see */
    uint8_t *sc = b + 4, *qh = b + 16, *qs = five ? b + 48 : b + 16;
    int ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = d > 0 ? clampi(nearest(scale[j] / d), 0, 63) : 0;
        lm[j] = dmin > 0 ? clampi(nearest(mn[j] / dmin), 0, 63) : 0;
        if (j < 4) {
            sc[j] = (uint8_t)ls[j];
            sc[j + 4] = (uint8_t)lm[j];
        } else {
            sc[j + 4] = (uint8_t)((ls[j] & 15) | (lm[j] & 15) << 4);
            sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    for (int j = 0; j < 8; j++) {
        const float ds = d * (float)ls[j], dm = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++) {
            const int q = ds > 0 ? clampi(nearest((x[32 * j + l] + dm) / ds), 0, qmax) : 0;
            const int g = j / 2, byte = 32 * g + l;
            if (j & 1)
                qs[byte] |= (uint8_t)((q & 15) << 4);
            else
                qs[byte] |= (uint8_t)(q & 15);
            if (five && q > 15) qh[l] |= (uint8_t)(1 << j);
        }
    }
}

static void q_q6_k(const float *x, uint8_t *b) {
    float scale[16], amax_scale = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0, max = 0;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * j + l]) > amax) {
                amax = fabsf(x[16 * j + l]);
                max = x[16 * j + l];
            }
        scale[j] = max / -32.0f; /* the extreme value maps to q = -32 */
        amax_scale = fmaxf(amax_scale, fabsf(scale[j]));
    }
    memset(b, 0, 210);
    wr_f16(b + 208, amax_scale / 127.0f);
    const float d = rd_f16(b + 208);
    int8_t *sc = (int8_t *)(b + 192);
    int q[256];
    for (int j = 0; j < 16; j++) {
        sc[j] = (int8_t)(d > 0 ? clampi(nearest(scale[j] / d), -127, 127) : 0);
        const float ds = d * (float)sc[j];
        for (int l = 0; l < 16; l++)
            q[16 * j + l] = ds != 0 ? clampi(nearest(x[16 * j + l] / ds), -32, 31) + 32 : 32;
    }
    for (int h = 0; h < 2; h++) {
        uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int *qq = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((qq[l] & 15) | (qq[l + 64] & 15) << 4);
            ql[l + 32] = (uint8_t)((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
            qh[l] = (uint8_t)((qq[l] >> 4) | (qq[l + 32] >> 4) << 2 | (qq[l + 64] >> 4) << 4 | (qq[l + 96] >> 4) << 6);
        }
    }
}

static void q_q8_k(const float *x, uint8_t *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 256; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    memset(b, 0, 292);
    if (amax == 0) return;
    const float iscale = -127.0f / max, d = 1.0f / iscale;
    memcpy(b, &d, 4);
    for (int i = 0; i < 16; i++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) {
            const int v = clampi(nearest(iscale * x[16 * i + l]), -128, 127);
            b[4 + 16 * i + l] = (uint8_t)(int8_t)v;
            sum += v;
        }
        b[260 + 2 * i] = (uint8_t)(uint16_t)(int16_t)sum;
        b[261 + 2 * i] = (uint8_t)((uint16_t)(int16_t)sum >> 8);
    }
}

pkv_status pkv_quantize_row(pkv_type t, const float *src, void *dst, int64_t n) {
    pkv_status s = check_row("quantize", t, n);
    if (s) return s;
    const size_t be = pkv_type_block_elems(t), bb = pkv_type_block_bytes(t);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n / (int64_t)be; i++) {
        const float *x = src + (size_t)i * be;
        uint8_t *b = p + (size_t)i * bb;
        switch (t) {
        case PKV_TYPE_F32: memcpy(b, x, 4); break;
        case PKV_TYPE_F16: wr_f16(b, x[0]); break;
        case PKV_TYPE_BF16: {
            uint16_t h = pkv_f32_to_bf16(x[0]);
            b[0] = (uint8_t)h;
            b[1] = (uint8_t)(h >> 8);
            break;
        }
        case PKV_TYPE_Q8_0: q_q8_0(x, b); break;
        case PKV_TYPE_Q4_0: q_q4_0(x, b); break;
        case PKV_TYPE_Q4_K: q_kmin(x, b, 15, false); break;
        case PKV_TYPE_Q5_K: q_kmin(x, b, 31, true); break;
        case PKV_TYPE_Q6_K: q_q6_k(x, b); break;
        case PKV_TYPE_Q8_K: q_q8_k(x, b); break;
        case PKV_TYPE_MXFP4: q_mxfp4(x, b); break;
        default:
            if (!pkv_quantize_block_int(t, x, b)) return pkv_err(PKV_ERR_UNSUPPORTED, "quantize: type %s", pkv_type_name(t));
        }
    }
    return PKV_OK;
}
