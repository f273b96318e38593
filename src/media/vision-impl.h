/* Gemma 3's vision path (internal): the image preprocessing of vision-image.c and
 * the random-weight projector writer of mkmmproj-vision.c. The encoder itself is
 * mmproj-vision.c. docs/multimodal.md ("Images (Gemma 3)"). */
#ifndef PKV_MEDIA_VISION_IMPL_H
#define PKV_MEDIA_VISION_IMPL_H

#include "base/base.h"

/* Resample 8-bit RGB src (sw x sh) to dst (dw x dh) as Pillow's BILINEAR filter
 * does (and llama.cpp's mtmd after it): separable, horizontal pass then vertical,
 * the filter widened by the scale when shrinking, weights normalized and held in
 * fixed point with 22 fractional bits, each pass rounded to 8 bits. Sides in
 * [1, 65536]. PKV_ERR_NOMEM on allocation failure. */
pkv_status pkv_vision_resize_bilinear(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh);

/* The square input of a fixed-size encoder (llama.cpp's gemma3 preprocessing):
 * an image already size x size is taken as it is; any other is scaled by
 * min(size / w, size / h) to ceil(w * s) x ceil(h * s) (at most size) with the
 * bilinear filter above and centred on black ((size - side) / 2 rounded down).
 * out: f32 [3][size][size], each value (u8 / 255 - mean[c]) / std[c]. */
pkv_status pkv_vision_preprocess(const uint8_t *rgb, int w, int h, int size, const float mean[3],
                                 const float std[3], float *out);

/* Patches of a preprocessed image for a stride-`patch` convolution as a matmul:
 * img f32 [3][size][size] -> out f32 [g * g][3 * patch * patch], g = size / patch,
 * patch (py, px) at row py * g + px, its columns in the conv weight's order
 * (channel, ky, kx). */
void pkv_vision_patches(const float *img, int size, int patch, float *out);

/* A projector for mkmodel --vision (mkmmproj-vision.c): SigLIP with the given
 * shape and a Gemma 3 projector to n_embd_text, in the converter's layout. */
typedef struct pkv_mkmmproj_vision_params {
    int n_embd_text;  /* the text model's width (required) */
    int image_size;   /* 0 = 224 */
    int patch_size;   /* 0 = 14 */
    int n_embd;       /* 0 = 64 */
    int n_ff;         /* 0 = 128 */
    int n_layer;      /* 0 = 2 */
    int n_head;       /* 0 = 4 */
    int n_merge;      /* pooling factor per side; 0 = 4 (written only when not 4, as the converter) */
    bool f32;         /* the blocks' matrices in f32 (--outtype f32); else f16 (--outtype f16) */
    uint64_t seed;    /* 0 = 1 */
} pkv_mkmmproj_vision_params;

pkv_status pkv_mkmmproj_vision_write(const pkv_mkmmproj_vision_params *p, const char *path);
/* The text model it goes with (mkmodel --vision needs --arch of it) and its chat
 * family: the projector's own facts, so the CLI names no model family. */
#define PKV_MKMMPROJ_VISION_TEXT_ARCH "gemma3"
#define PKV_MKMMPROJ_VISION_TEMPLATE "gemma"

#endif
