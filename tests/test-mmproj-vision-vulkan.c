// labels: media vulkan
/* Gemma 3's vision projector on vulkan:0 against the CPU: mkmodel's random
 * projectors (f16 and f32 blocks; the 224-pixel default, and 112 pixels with 2x2
 * pooling), square and letterboxed images. Every kernel it uses (matmul, add,
 * layer norm, GELU, paged attention as the encoder's bidirectional attention and
 * as the average pooling, RMS norm) runs on the device; the rows must agree with
 * the CPU's within nmse 1e-6 (measured: see the output), and a second encode on
 * the device is bit-identical. Skipped when no Vulkan device opens. */
#include "testhelp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media/vision-impl.h"

static uint8_t *rand_rgb(int w, int h, uint64_t seed) {
    uint8_t *p = malloc((size_t)w * h * 3);
    for (size_t i = 0; i < (size_t)w * h * 3; i++) p[i] = (uint8_t)(th_rand(&seed) >> 56);
    return p;
}

int main(void) {
    pkv_device *vk = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!vk) return th_skip("no Vulkan device opens");
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE(cpu);
    const struct {
        bool f32;
        int size, merge, first, last; /* which of the two images: square, letterboxed */
    } shapes[] = {{false, 224, 4, 0, 1}, {true, 224, 4, 0, 0}, {false, 112, 2, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const char *path = th_tmp("visvk.gguf");
        pkv_mkmmproj_vision_params vp = {.n_embd_text = 96, .image_size = shapes[s].size, .n_merge = shapes[s].merge,
                                         .f32 = shapes[s].f32, .seed = 9 + s};
        CHECK_OK(pkv_mkmmproj_vision_write(&vp, path));
        pkv_mmproj *pc = pkv_mmproj_load(path, NULL, cpu), *pv = pkv_mmproj_load(path, NULL, vk);
        REQUIRE(pc && pv);
        const int dims[][2] = {{shapes[s].size, shapes[s].size}, {300, 170}};
        for (int k = shapes[s].first; k <= shapes[s].last; k++) {
            uint8_t *rgb = rand_rgb(dims[k][0], dims[k][1], 100 + s * 2 + k);
            pkv_media m = {.kind = PKV_MEDIA_IMAGE, .rgb = rgb, .width = dims[k][0], .height = dims[k][1]};
            int64_t n;
            CHECK_OK(pkv_mmproj_n_rows(pv, &m, &n));
            size_t len = (size_t)n * 96;
            float *a = malloc(len * 4), *b = malloc(len * 4), *b2 = malloc(len * 4);
            CHECK_OK(pkv_mmproj_encode(pc, &m, a, n));
            CHECK_OK(pkv_mmproj_encode(pv, &m, b, n));
            CHECK_OK(pkv_mmproj_encode(pv, &m, b2, n));
            CHECK_MEM(b, b2, len * 4);
            double e = th_nmse(a, b, len);
            fprintf(stderr, "  %s %d px, pooling %d, image %dx%d: %lld rows, nmse vulkan:0 vs cpu %.3g\n",
                    shapes[s].f32 ? "f32" : "f16", shapes[s].size, shapes[s].merge, dims[k][0], dims[k][1], (long long)n, e);
            th_checks++;
            if (!(e <= 1e-6)) TH_FAIL("nmse %.3g > 1e-6", e);
            free(a), free(b), free(b2), free(rgb);
        }
        pkv_mmproj_free(pc);
        pkv_mmproj_free(pv);
        remove(path);
    }
    pkv_device_close(cpu);
    pkv_device_close(vk);
    return th_done();
}
