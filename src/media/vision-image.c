/* Image preprocessing for fixed-size vision encoders (Gemma 3): the resize that
 * llama.cpp's mtmd applies (Pillow's bilinear filter in fixed point, the aspect
 * ratio kept and the rest padded black), normalization and patch extraction.
 * Written from Pillow's documented Resample.c behaviour; vision-impl.h. */
#include "media/vision-impl.h"

#include <math.h>
#include <string.h>

#define PREC_BITS 22 /* 32 - 8 (pixels) - 2 (headroom) */

/* One dimension's filter: for output pixel i, its first input pixel bounds[2i],
 * how many bounds[2i+1], and their fixed-point weights w[i * ksize ..]. */
typedef struct filt {
    int ksize;
    int *bounds;
    int32_t *w;
} filt;

static double tent(double x) {
    if (x < 0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static pkv_status filt_make(filt *f, int in, int out) {
    double scale = (double)in / out, fscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * fscale; /* bilinear's support is 1 */
    f->ksize = (int)ceil(support) * 2 + 1;
    f->bounds = pkv_calloc((size_t)out * 2, sizeof(int));
    f->w = pkv_calloc((size_t)out * f->ksize, sizeof(int32_t));
    double *pre = pkv_calloc((size_t)f->ksize, sizeof(double));
    if (!f->bounds || !f->w || !pre) {
        pkv_free(pre);
        return pkv_err(PKV_ERR_NOMEM, "image resize: no memory for the filter of %d -> %d", in, out);
    }
    for (int i = 0; i < out; i++) {
        double center = (i + 0.5) * scale, ss = 1.0 / fscale, ww = 0;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        int n = hi - lo;
        if (n > f->ksize) n = f->ksize; /* cannot happen: the support bounds it */
        for (int x = 0; x < n; x++) ww += pre[x] = tent((x + lo - center + 0.5) * ss);
        for (int x = 0; x < n; x++) {
            double v = ww != 0.0 ? pre[x] / ww : pre[x];
            /* half away from zero, then truncation: Pillow's rounding */
            f->w[(size_t)i * f->ksize + x] = (int32_t)(v * (double)(1 << PREC_BITS) + (v < 0 ? -0.5 : 0.5));
        }
        f->bounds[2 * i] = lo;
        f->bounds[2 * i + 1] = n;
    }
    pkv_free(pre);
    return PKV_OK;
}

static void filt_free(filt *f) {
    pkv_free(f->bounds);
    pkv_free(f->w);
}

static uint8_t clip8(int32_t v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

/* rows x (in_w -> out_w), 3 channels */
static void pass_h(const uint8_t *src, int in_w, int rows, uint8_t *dst, int out_w, const filt *f) {
    for (int y = 0; y < rows; y++) {
        const uint8_t *s = src + (size_t)y * in_w * 3;
        uint8_t *d = dst + (size_t)y * out_w * 3;
        for (int x = 0; x < out_w; x++) {
            const int32_t *k = f->w + (size_t)x * f->ksize;
            const uint8_t *p = s + (size_t)f->bounds[2 * x] * 3;
            int32_t a0 = 1 << (PREC_BITS - 1), a1 = a0, a2 = a0;
            for (int j = 0; j < f->bounds[2 * x + 1]; j++, p += 3) {
                a0 += p[0] * k[j];
                a1 += p[1] * k[j];
                a2 += p[2] * k[j];
            }
            d[3 * x] = clip8(a0 >> PREC_BITS);
            d[3 * x + 1] = clip8(a1 >> PREC_BITS);
            d[3 * x + 2] = clip8(a2 >> PREC_BITS);
        }
    }
}

/* (in_h -> out_h) rows of w pixels */
static void pass_v(const uint8_t *src, int w, uint8_t *dst, int out_h, const filt *f) {
    size_t row = (size_t)w * 3;
    for (int y = 0; y < out_h; y++) {
        const int32_t *k = f->w + (size_t)y * f->ksize;
        const uint8_t *s = src + (size_t)f->bounds[2 * y] * row;
        uint8_t *d = dst + (size_t)y * row;
        for (size_t i = 0; i < row; i++) {
            int32_t a = 1 << (PREC_BITS - 1);
            for (int j = 0; j < f->bounds[2 * y + 1]; j++) a += s[(size_t)j * row + i] * k[j];
            d[i] = clip8(a >> PREC_BITS);
        }
    }
}

pkv_status pkv_vision_resize_bilinear(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh) {
    if (!src || !dst || sw < 1 || sh < 1 || dw < 1 || dh < 1 || sw > 65536 || sh > 65536 || dw > 65536 || dh > 65536)
        return pkv_err(PKV_ERR_INVALID, "image resize %dx%d -> %dx%d: sides must be in [1, 65536]", sw, sh, dw, dh);
    bool hor = dw != sw, ver = dh != sh;
    if (!hor && !ver) {
        memcpy(dst, src, (size_t)sw * sh * 3);
        return PKV_OK;
    }
    filt fh = {0}, fv = {0};
    uint8_t *tmp = NULL;
    pkv_status st = PKV_OK;
    if (hor && (st = filt_make(&fh, sw, dw))) goto done;
    if (ver && (st = filt_make(&fv, sh, dh))) goto done;
    if (hor && ver) {
        if (!(tmp = pkv_malloc((size_t)dw * sh * 3))) {
            st = pkv_err(PKV_ERR_NOMEM, "image resize: no memory for %dx%d pixels", dw, sh);
            goto done;
        }
        pass_h(src, sw, sh, tmp, dw, &fh);
        pass_v(tmp, dw, dst, dh, &fv);
    } else if (hor) {
        pass_h(src, sw, sh, dst, dw, &fh);
    } else {
        pass_v(src, sw, dst, dh, &fv);
    }
done:
    pkv_free(tmp);
    filt_free(&fh);
    filt_free(&fv);
    return st;
}

pkv_status pkv_vision_preprocess(const uint8_t *rgb, int w, int h, int size, const float mean[3],
                                 const float std[3], float *out) {
    if (!rgb || !out || w < 1 || h < 1 || size < 1)
        return pkv_err(PKV_ERR_INVALID, "image preprocessing: a %dx%d image to %d pixels square", w, h, size);
    size_t n = (size_t)size * size;
    uint8_t *sq = pkv_malloc(n * 3), *fit = NULL;
    if (!sq) return pkv_err(PKV_ERR_NOMEM, "image preprocessing: no memory for %dx%d pixels", size, size);
    pkv_status st = PKV_OK;
    if (w == size && h == size) {
        memcpy(sq, rgb, n * 3);
    } else {
        /* single precision, as llama.cpp computes the fitted size */
        float sx = (float)size / (float)w, sy = (float)size / (float)h, s = sx < sy ? sx : sy;
        int nw = (int)ceilf((float)w * s), nh = (int)ceilf((float)h * s);
        if (nw > size) nw = size;
        if (nh > size) nh = size;
        if (nw < 1) nw = 1;
        if (nh < 1) nh = 1;
        if (!(fit = pkv_malloc((size_t)nw * nh * 3))) {
            st = pkv_err(PKV_ERR_NOMEM, "image preprocessing: no memory for %dx%d pixels", nw, nh);
            goto done;
        }
        if ((st = pkv_vision_resize_bilinear(rgb, w, h, fit, nw, nh))) goto done;
        memset(sq, 0, n * 3);
        int ox = (size - nw) / 2, oy = (size - nh) / 2;
        for (int y = 0; y < nh; y++) memcpy(sq + ((size_t)(y + oy) * size + ox) * 3, fit + (size_t)y * nw * 3, (size_t)nw * 3);
    }
    for (int c = 0; c < 3; c++)
        for (size_t i = 0; i < n; i++) out[(size_t)c * n + i] = ((float)sq[i * 3 + c] / 255.0f - mean[c]) / std[c];
done:
    pkv_free(fit);
    pkv_free(sq);
    return st;
}

void pkv_vision_patches(const float *img, int size, int patch, float *out) {
    int g = size / patch;
    size_t cols = (size_t)3 * patch * patch, plane = (size_t)size * size;
    for (int py = 0; py < g; py++)
        for (int px = 0; px < g; px++) {
            float *o = out + ((size_t)py * g + px) * cols;
            for (int c = 0; c < 3; c++)
                for (int ky = 0; ky < patch; ky++)
                    memcpy(o + ((size_t)c * patch + ky) * patch,
                           img + c * plane + (size_t)(py * patch + ky) * size + (size_t)px * patch,
                           (size_t)patch * sizeof(float));
        }
}
