// labels: media
/* Gemma 3's vision projector (src/media/mmproj-vision.c) on the CPU:
 *  - the preprocessing: the bilinear resize against a double-precision Pillow-style
 *    filter (within 1 of 255, the fixed-point rounding), the aspect-keeping fit
 *    with black bands (exact geometry), normalization per channel, patch order;
 *  - the whole encoder (mkmodel's random projector, f16 and f32 blocks) against
 *    tests/vision-ref.h's double-precision encoder: nmse <= 1e-6 (f32 arithmetic
 *    against double; f16 weights are the same dequantized values on both sides);
 *  - Gemma 3's real geometry (896 pixels, 4096 patches, 256 rows) on a narrow encoder;
 *  - the geometry in info and n_rows; a second encode of one image is bit-identical;
 *  - mkmodel --arch gemma3 --vision: the pair loads together, <start_of_image> and
 *    <end_of_image> are single control tokens;
 *  - every allocation of load and encode failing in turn: an error, no leak, and
 *    the next encode unchanged;
 *  - bad files and mismatched models refused with errors that name the key,
 *    tensor or both widths. */
#include "testhelp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media/vision-impl.h"
#include "vision-ref.h"

#ifndef VISION_DEVICE
#define VISION_DEVICE NULL
#endif

/* A random RGB image. */
static uint8_t *rand_rgb(int w, int h, uint64_t seed) {
    uint8_t *p = malloc((size_t)w * h * 3);
    for (size_t i = 0; i < (size_t)w * h * 3; i++) p[i] = (uint8_t)(th_rand(&seed) >> 56);
    return p;
}

/* Pillow's bilinear filter in doubles, for one output sample of one channel. */
static double ref_resize_px(const uint8_t *src, int sw, int sh, int dw, int dh, int ox, int oy, int c) {
    double wx[4096], wy[4096];
    int x0, y0, nx, ny;
    for (int axis = 0; axis < 2; axis++) {
        int in = axis ? sh : sw, out = axis ? dh : dw, o = axis ? oy : ox;
        double *w = axis ? wy : wx;
        if (in == out) {
            w[0] = 1;
            if (axis) y0 = o, ny = 1;
            else x0 = o, nx = 1;
            continue;
        }
        double scale = (double)in / out, fs = scale < 1 ? 1 : scale, sup = fs, ctr = (o + 0.5) * scale, sum = 0;
        int lo = (int)(ctr - sup + 0.5), hi = (int)(ctr + sup + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        for (int i = lo; i < hi; i++) {
            double d = fabs((i - ctr + 0.5) / fs);
            sum += w[i - lo] = d < 1 ? 1 - d : 0;
        }
        for (int i = lo; i < hi; i++) w[i - lo] /= sum;
        if (axis) y0 = lo, ny = hi - lo;
        else x0 = lo, nx = hi - lo;
    }
    double s = 0;
    for (int j = 0; j < ny; j++)
        for (int i = 0; i < nx; i++) s += wy[j] * wx[i] * src[((size_t)(y0 + j) * sw + x0 + i) * 3 + c];
    return s;
}

static void test_resize(void) {
    const int sizes[][4] = {{37, 23, 224, 140}, {300, 170, 224, 127}, {64, 64, 16, 16}, {10, 50, 10, 224}, {5, 5, 7, 3}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int sw = sizes[k][0], sh = sizes[k][1], dw = sizes[k][2], dh = sizes[k][3];
        uint8_t *src = rand_rgb(sw, sh, 11 + k), *dst = malloc((size_t)dw * dh * 3);
        CHECK_OK(pkv_vision_resize_bilinear(src, sw, sh, dst, dw, dh));
        double worst = 0;
        for (int y = 0; y < dh; y++)
            for (int x = 0; x < dw; x++)
                for (int c = 0; c < 3; c++) {
                    double d = fabs(dst[((size_t)y * dw + x) * 3 + c] - ref_resize_px(src, sw, sh, dw, dh, x, y, c));
                    if (d > worst) worst = d;
                }
        /* two passes each rounded to 8 bits: at most one step off the exact value
         * per pass, carried through the second pass's convex weights */
        if (worst > 1.01) TH_FAIL("resize %dx%d -> %dx%d: %.3f off the double-precision filter", sw, sh, dw, dh, worst);
        th_checks++;
        free(src), free(dst);
    }
    uint8_t one[3] = {1, 2, 3}, big[3];
    CHECK_STATUS(pkv_vision_resize_bilinear(one, 1, 1, big, 0, 1), PKV_ERR_INVALID);
}

static void test_preprocess(void) {
    const float mean[3] = {0.25f, 0.5f, 0.75f}, sd[3] = {0.5f, 0.25f, 0.125f};
    /* 112x56 white: scaled by 2 to 224x112, centred: rows 56..167 white, the rest black */
    uint8_t *w = malloc(112 * 56 * 3);
    memset(w, 255, 112 * 56 * 3);
    float *out = malloc(3 * 224 * 224 * sizeof(float));
    CHECK_OK(pkv_vision_preprocess(w, 112, 56, 224, mean, sd, out));
    int bad = 0;
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 224; y++)
            for (int x = 0; x < 224; x++) {
                float want = y >= 56 && y < 168 ? (1.0f - mean[c]) / sd[c] : (0.0f - mean[c]) / sd[c];
                bad += out[((size_t)c * 224 + y) * 224 + x] != want;
            }
    CHECK_INT(bad, 0);
    /* an image of the input size is taken as it is: exact values, channel planes in order */
    uint8_t *r = rand_rgb(224, 224, 5);
    CHECK_OK(pkv_vision_preprocess(r, 224, 224, 224, mean, sd, out));
    bad = 0;
    for (int c = 0; c < 3; c++)
        for (size_t i = 0; i < 224 * 224; i++) bad += out[c * 224 * 224 + i] != ((float)r[i * 3 + c] / 255.0f - mean[c]) / sd[c];
    CHECK_INT(bad, 0);
    /* patches: 14x14, patch (py, px) at row py*16+px, columns (c, ky, kx) */
    float *pt = malloc((size_t)256 * 588 * sizeof(float));
    pkv_vision_patches(out, 224, 14, pt);
    bad = 0;
    for (int py = 0; py < 16; py++)
        for (int px = 0; px < 16; px++)
            for (int c = 0; c < 3; c++)
                for (int ky = 0; ky < 14; ky++)
                    for (int kx = 0; kx < 14; kx++)
                        bad += pt[(size_t)(py * 16 + px) * 588 + (c * 14 + ky) * 14 + kx] !=
                               out[((size_t)c * 224 + py * 14 + ky) * 224 + px * 14 + kx];
    CHECK_INT(bad, 0);
    free(w), free(out), free(r), free(pt);
}

/* The encoder against the reference on one image. */
static void check_encode(pkv_mmproj *pj, const pkv_gguf *g, const uint8_t *rgb, int w, int h, const char *what) {
    pkv_mmproj_info info;
    CHECK_OK(pkv_mmproj_get_info(pj, &info));
    pkv_media m = {.kind = PKV_MEDIA_IMAGE, .rgb = rgb, .width = w, .height = h};
    int64_t n = 0;
    CHECK_OK(pkv_mmproj_n_rows(pj, &m, &n));
    size_t len = (size_t)n * info.n_embd;
    float *got = malloc(len * 4), *again = malloc(len * 4), *ref = malloc(len * 4);
    float mean[3], sd[3];
    pkv_gguf_array a;
    pkv_gguf_get_arr(g, "clip.vision.image_mean", PKV_GGUF_FLOAT32, &a);
    for (int c = 0; c < 3; c++) mean[c] = (float)pkv_gguf_arr_float(&a, (uint64_t)c);
    pkv_gguf_get_arr(g, "clip.vision.image_std", PKV_GGUF_FLOAT32, &a);
    for (int c = 0; c < 3; c++) sd[c] = (float)pkv_gguf_arr_float(&a, (uint64_t)c);
    float *img = malloc((size_t)3 * info.image_size * info.image_size * 4);
    CHECK_OK(pkv_vision_preprocess(rgb, w, h, info.image_size, mean, sd, img));
    CHECK_INT(vr_encode(g, img, ref), n);
    CHECK_OK(pkv_mmproj_encode(pj, &m, got, n));
    CHECK_OK(pkv_mmproj_encode(pj, &m, again, n));
    CHECK_MEM(got, again, len * 4);
    double e = th_nmse(ref, got, len);
    fprintf(stderr, "  %s %dx%d: %lld rows, nmse against the double reference %.3g\n", what, w, h, (long long)n, e);
    th_checks++;
    if (!(e <= 1e-6)) TH_FAIL("%s %dx%d: nmse %.3g > 1e-6", what, w, h, e);
    CHECK_STATUS(pkv_mmproj_encode(pj, &m, got, n - 1), PKV_ERR_INVALID);
    free(got), free(again), free(ref), free(img);
}

/* Gemma 3's own geometry (896-pixel input, 14-pixel patches: a 64x64 grid of 4096
 * patches pooled 4x4 to 256 rows) on a narrow encoder, against the reference. */
static void test_real_geometry(void) {
    const char *mp = th_tmp("vis896.gguf");
    pkv_mkmmproj_vision_params vp = {.n_embd_text = 48, .image_size = 896, .n_embd = 8, .n_ff = 16, .n_layer = 1,
                                     .n_head = 2, .seed = 6};
    CHECK_OK(pkv_mkmmproj_vision_write(&vp, mp));
    pkv_mmproj *pj = pkv_mmproj_load(mp, NULL, NULL);
    REQUIRE_VOID(pj);
    pkv_mmproj_info info;
    CHECK_OK(pkv_mmproj_get_info(pj, &info));
    CHECK_INT(info.image_size, 896);
    pkv_gguf *g = pkv_gguf_open(mp);
    uint8_t *img = rand_rgb(640, 480, 12);
    pkv_media m = {.kind = PKV_MEDIA_IMAGE, .rgb = img, .width = 640, .height = 480};
    int64_t n = 0;
    CHECK_OK(pkv_mmproj_n_rows(pj, &m, &n));
    CHECK_INT(n, 256);
    check_encode(pj, g, img, 640, 480, "896 px");
    pkv_gguf_close(g);
    pkv_mmproj_free(pj);
    free(img);
    remove(mp);
}

/* Copy of src with one byte flipped in the middle of its largest tensor (the
 * projector's fingerprint must see all of the data, not its ends). */
static void write_flipped(const char *src, const char *dst) {
    pkv_gguf *g = pkv_gguf_open(src);
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    for (int64_t i = 0; i < pkv_gguf_n_kv(g); i++) pkv_gguf_writer_copy_kv(w, g, i);
    int64_t big = 0;
    for (int64_t i = 1; i < pkv_gguf_n_tensors(g); i++)
        if (pkv_gguf_tensor_at(g, i)->n_bytes > pkv_gguf_tensor_at(g, big)->n_bytes) big = i;
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        uint8_t *d = malloc(t->n_bytes);
        memcpy(d, t->data, t->n_bytes);
        if (i == big) d[t->n_bytes / 2] ^= 0x10;
        pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, d, t->n_bytes);
        free(d);
    }
    pkv_gguf_writer_write(w, dst);
    pkv_gguf_writer_free(w);
    pkv_gguf_close(g);
}

static void test_encoder(bool f32) {
    const char *mp = th_tmp(f32 ? "vis32.gguf" : "vis16.gguf");
    pkv_mkmmproj_vision_params vp = {.n_embd_text = 96, .f32 = f32, .seed = 3};
    CHECK_OK(pkv_mkmmproj_vision_write(&vp, mp));
    pkv_mmproj *pj = pkv_mmproj_load(mp, NULL, NULL);
    REQUIRE_VOID(pj);
    pkv_mmproj_info info;
    CHECK_OK(pkv_mmproj_get_info(pj, &info));
    CHECK_INT(info.kind, PKV_MEDIA_IMAGE);
    CHECK(!strcmp(info.projector, "gemma3"));
    /* the text around each image, as mtmd puts it (the CLI and server read these) */
    CHECK(info.text_before && !strcmp(info.text_before, "<start_of_image>"));
    CHECK(info.text_after && !strcmp(info.text_after, "<end_of_image>"));
    CHECK_INT(info.n_embd, 96);
    CHECK_INT(info.n_embd_enc, 64);
    CHECK_INT(info.n_layer, 2);
    CHECK_INT(info.image_size, 224);
    CHECK(info.non_causal);
    pkv_gguf *g = pkv_gguf_open(mp);
    REQUIRE_VOID(g);
    uint8_t *sq = rand_rgb(224, 224, 7), *wide = rand_rgb(300, 170, 8);
    check_encode(pj, g, sq, 224, 224, f32 ? "f32" : "f16");
    check_encode(pj, g, wide, 300, 170, f32 ? "f32" : "f16");
    pkv_gguf_close(g);
    pkv_mmproj_free(pj);
    /* another seed: another fingerprint */
    const char *mp2 = th_tmp("vis-other.gguf");
    vp.seed = 4;
    CHECK_OK(pkv_mkmmproj_vision_write(&vp, mp2));
    pkv_mmproj *p2 = pkv_mmproj_load(mp2, NULL, NULL);
    pkv_mmproj_info i2;
    CHECK(p2 && !pkv_mmproj_get_info(p2, &i2) && i2.fingerprint != info.fingerprint);
    pkv_mmproj_free(p2);
    /* one byte in the middle of one tensor: another fingerprint too (media keys and
     * the encoder-output cache are keyed on it) */
    const char *mp3 = th_tmp("vis-flipped.gguf");
    write_flipped(mp, mp3);
    pkv_mmproj *p3 = pkv_mmproj_load(mp3, NULL, NULL);
    pkv_mmproj_info i3;
    CHECK(p3 && !pkv_mmproj_get_info(p3, &i3) && i3.fingerprint != info.fingerprint);
    pkv_mmproj_free(p3);
    free(sq), free(wide);
    remove(mp), remove(mp2), remove(mp3);
}

/* Copy of src with tensor `drop` left out, or with `reshape` written one row short;
 * key `key` replaced by u32 `val` when given. */
static void write_altered(const char *src, const char *dst, const char *drop, const char *reshape, const char *key,
                          uint32_t val) {
    pkv_gguf *g = pkv_gguf_open(src);
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    for (int64_t i = 0; i < pkv_gguf_n_kv(g); i++) pkv_gguf_writer_copy_kv(w, g, i);
    if (key) pkv_gguf_writer_add_u32(w, key, val);
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        if (drop && !strcmp(t->name, drop)) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        size_t bytes = t->n_bytes;
        if (reshape && !strcmp(t->name, reshape)) {
            bytes -= bytes / (size_t)ne[t->n_dims - 1];
            ne[t->n_dims - 1]--;
        }
        pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, bytes);
    }
    pkv_gguf_writer_write(w, dst);
    pkv_gguf_writer_free(w);
    pkv_gguf_close(g);
}

static void test_errors(void) {
    const char *mp = th_tmp("vis-err.gguf"), *bad = th_tmp("vis-bad.gguf");
    pkv_mkmmproj_vision_params vp = {.n_embd_text = 96, .seed = 5};
    CHECK_OK(pkv_mkmmproj_vision_write(&vp, mp));
    struct {
        const char *drop, *reshape, *key;
        uint32_t val;
        const char *msg;
    } cases[] = {
        {"v.blk.1.attn_v.bias", NULL, NULL, 0, "'v.blk.1.attn_v.bias' not found"},
        {"mm.soft_emb_norm.weight", NULL, NULL, 0, "'mm.soft_emb_norm.weight' not found"},
        {NULL, "v.blk.0.ffn_down.weight", NULL, 0, "tensor 'v.blk.0.ffn_down.weight' has shape {128, 63}, expected {128, 64}"},
        {NULL, "v.position_embd.weight", NULL, 0, "'v.position_embd.weight' has shape {64, 255}, expected {64, 256}"},
        {NULL, NULL, "clip.vision.patch_size", 15, "clip.vision.image_size 224 is not a multiple of clip.vision.patch_size 15"},
        {NULL, NULL, "clip.vision.projector.scale_factor", 3, "not a multiple of the pooling factor 3"},
        {NULL, NULL, "clip.vision.attention.head_count", 5, "not a multiple of the 5 heads"},
        {NULL, NULL, "clip.vision.projection_dim", 97, "'clip.vision.projection_dim' is 97"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_altered(mp, bad, cases[i].drop, cases[i].reshape, cases[i].key, cases[i].val);
        pkv_mmproj *p = pkv_mmproj_load(bad, NULL, NULL);
        CHECK(p == NULL);
        CHECK_MSG(cases[i].msg);
        pkv_mmproj_free(p);
    }
    /* the text model: its width and its architecture */
    pkv_mkmodel_params mp3 = pkv_mkmodel_default_params();
    mp3.arch = "gemma3";
    mp3.n_embd = 128;
    const char *tm = th_tmp("vis-g3.gguf"), *lm = th_tmp("vis-llama.gguf");
    CHECK_OK(pkv_mkmodel_write(&mp3, tm));
    mp3.arch = "llama";
    mp3.n_embd = 96;
    CHECK_OK(pkv_mkmodel_write(&mp3, lm));
    pkv_model *g3 = pkv_model_load(tm, (pkv_model_params){0}), *ll = pkv_model_load(lm, (pkv_model_params){0});
    REQUIRE_VOID(g3 && ll);
    pkv_mmproj *p = pkv_mmproj_load(mp, g3, NULL);
    CHECK(p == NULL);
    CHECK_MSG("makes rows of width 96, the gemma3 model's n_embd is 128");
    p = pkv_mmproj_load(mp, ll, NULL);
    CHECK(p == NULL);
    CHECK_MSG("projector 'gemma3' is for a gemma3 text model, the model is llama");
    vp.n_embd_text = 128;
    CHECK_OK(pkv_mkmmproj_vision_write(&vp, mp));
    p = pkv_mmproj_load(mp, g3, NULL);
    CHECK(p != NULL);
    /* audio given to an image projector */
    float s[16] = {0};
    pkv_media au = {.kind = PKV_MEDIA_AUDIO, .samples = s, .n_samples = 16, .rate = 16000};
    int64_t n;
    CHECK_STATUS(pkv_mmproj_n_rows(p, &au, &n), PKV_ERR_MISMATCH);
    pkv_mmproj_free(p);
    pkv_model_free(g3);
    pkv_model_free(ll);
    remove(mp), remove(bad), remove(tm), remove(lm);
}

/* `pagekv mkmodel --arch gemma3 --vision`: the pair loads together, the image
 * tokens are single control tokens, and the options that do not fit are refused. */
static void test_cli(void) {
    if (!getenv("PKV_CLI")) {
        fprintf(stderr, "  (no PKV_CLI: the mkmodel --vision checks need the CLI; run under ctest)\n");
        return;
    }
    char m[512], pj[512];
    snprintf(m, sizeof m, "%s", th_tmp("cli-g3.gguf"));
    snprintf(pj, sizeof pj, "%s", th_tmp("cli-g3-mmproj.gguf"));
    CHECK_INT(th_cli("", true, "mkmodel --arch gemma3 --vision --image-size 112 -o '%s' --mmproj-out '%s'", m, pj), 0);
    HAS("112x112 images, f16, 4 rows of width 128");
    pkv_model *md = pkv_model_load(m, (pkv_model_params){0});
    REQUIRE_VOID(md);
    pkv_mmproj *p = pkv_mmproj_load(pj, md, NULL);
    CHECK(p != NULL);
    pkv_mmproj_info info;
    CHECK(p && !pkv_mmproj_get_info(p, &info) && info.image_size == 112 && info.n_embd == 128);
    int32_t ids[8] = {0};
    size_t n = 0;
    /* the projector's wrapping text is one control token each in its text model */
    char t[64];
    snprintf(t, sizeof t, "%s%s", p ? info.text_before : "", p ? info.text_after : "");
    CHECK(!strcmp(t, "<start_of_image><end_of_image>"));
    CHECK_OK(pkv_model_tokenize(md, t, strlen(t), false, true, ids, 8, &n));
    CHECK_INT(n, 2);
    char piece[64];
    size_t pn = 0;
    CHECK_OK(pkv_model_token_piece(md, ids[0], true, piece, sizeof piece, &pn));
    CHECK(pn == 16 && !memcmp(piece, "<start_of_image>", 16));
    pkv_mmproj_free(p);
    pkv_model_free(md);
    CHECK_INT(th_cli("", true, "mkmodel --arch llama --vision -o '%s' --mmproj-out '%s'", m, pj), 2);
    HAS("--vision makes a Gemma 3 pair");
    CHECK_INT(th_cli("", true, "mkmodel --arch gemma3 --mmproj-out '%s' -o '%s'", pj, m), 2);
    HAS("--mmproj-out is for --arch voxtral (or --arch gemma3 --vision)");
    CHECK_INT(th_cli("", true, "mkmodel --arch gemma3 --image-size 448 -o '%s'", m), 2);
    HAS("--image-size go with --vision");
    CHECK_INT(th_cli("", true, "mkmodel --arch gemma3 --vision --image-size 100 -o '%s' --mmproj-out '%s'", m, pj), 1);
    HAS("the patch grid must be a multiple of the pooling");
    remove(m), remove(pj);
}

/* Every allocation of load and encode failing in turn (I7): a clear error, nothing
 * leaked, and a projector whose encode failed encodes the next time to the same bits. */
static void test_oom(void) {
    const char *mp = th_tmp("vis-oom.gguf");
    pkv_mkmmproj_vision_params vp = {.n_embd_text = 32, .image_size = 112, .n_merge = 2, .n_embd = 32, .n_ff = 32,
                                     .n_layer = 1, .n_head = 2, .seed = 8};
    CHECK_OK(pkv_mkmmproj_vision_write(&vp, mp));
    pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE_VOID(dev);
    uint8_t *rgb = rand_rgb(90, 60, 13);
    pkv_media m = {.kind = PKV_MEDIA_IMAGE, .rgb = rgb, .width = 90, .height = 60};
    float want[16 * 32], got[16 * 32];
    pkv_mmproj *p = pkv_mmproj_load(mp, NULL, dev);
    REQUIRE_VOID(p);
    CHECK_OK(pkv_mmproj_encode(p, &m, want, 16));
    pkv_mmproj_free(p);
    int fails = 0;
    for (uint64_t k = 1; k < 100000; k++) {
        int64_t live = pkv_alloc_live();
        pkv_alloc_fail_at(k);
        p = pkv_mmproj_load(mp, NULL, dev);
        pkv_status s = p ? pkv_mmproj_encode(p, &m, got, 16) : pkv_errcode();
        uint64_t made = pkv_alloc_fail_at(0);
        if (p && !s) {
            CHECK_MEM(got, want, sizeof want);
            if (made >= k) TH_FAIL("allocation %llu of %llu failed unseen", (unsigned long long)k, (unsigned long long)made);
            th_checks++;
            pkv_mmproj_free(p);
            CHECK_INT(pkv_alloc_live(), live);
            break;
        }
        fails++;
        th_checks++;
        if (s == PKV_OK || !*pkv_errmsg())
            TH_FAIL("allocation %llu failed: %s without a message", (unsigned long long)k, pkv_status_str(s));
        if (p) { /* the encode failed: the projector is as it was */
            CHECK_OK(pkv_mmproj_encode(p, &m, got, 16));
            CHECK_MEM(got, want, sizeof want);
        }
        pkv_mmproj_free(p);
        th_checks++;
        if (pkv_alloc_live() != live) {
            TH_FAIL("allocation %llu failed: %lld allocations leaked", (unsigned long long)k,
                    (long long)(pkv_alloc_live() - live));
            break;
        }
    }
    fprintf(stderr, "  out of memory: each of %d allocations of load + encode failed in turn\n", fails);
    pkv_device_close(dev);
    free(rgb);
    remove(mp);
}

int main(void) {
    test_resize();
    test_preprocess();
    test_encoder(false);
    test_encoder(true);
    test_real_geometry();
    test_errors();
    test_cli();
    test_oom();
    return th_done();
}
