/* The generic (plain C) row dot products; correct on every CPU. Sums use eight
 * float lanes so the compiler can vectorize them with whatever the baseline ISA
 * offers. */
#include "device/cpu/cpu-dots.h"

#include <math.h>
#include <string.h>

void pkv_cpu_quantize_q8a(const float *x, pkv_q8a *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int j = 0; j < 32; j++) {
            long q = lrintf(xb[j] * id);
            y[b].qs[j] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}

static float g_f32(const float *w, const float *x, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += w[i + l] * x[i + l];
    float s = 0;
    for (; i < n; i++) s += w[i] * x[i];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

static float g_f16(const uint16_t *w, const float *x, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += pkv_f16_to_f32(w[i + l]) * x[i + l];
    float s = 0;
    for (; i < n; i++) s += pkv_f16_to_f32(w[i]) * x[i];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

static float bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float g_bf16(const uint16_t *w, const float *x, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += bf(w[i + l]) * x[i + l];
    float s = 0;
    for (; i < n; i++) s += bf(w[i]) * x[i];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

static float rd_f16(const uint8_t *p) { return pkv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static float g_q8_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float s = 0;
    for (int64_t b = 0; b < nb; b++, w += 34) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (int8_t)w[2 + j] * x[b].qs[j];
        s += (float)sum * (rd_f16(w) * x[b].d);
    }
    return s;
}

static float g_q4_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float s = 0;
    for (int64_t b = 0; b < nb; b++, w += 18) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((w[2 + j] & 15) - 8) * x[b].qs[j] + ((w[2 + j] >> 4) - 8) * x[b].qs[j + 16];
        s += (float)sum * (rd_f16(w) * x[b].d);
    }
    return s;
}

static void g_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

const pkv_cpu_dots pkv_cpu_dots_generic = {
    .name = "generic",
    .f32 = g_f32,
    .f16 = g_f16,
    .bf16 = g_bf16,
    .q8_0 = g_q8_0,
    .q4_0 = g_q4_0,
    .axpy = g_axpy,
};
