/* Fuzz harness: image files through pkv_image_decode (libspng, libjpeg-turbo;
 * src/media/decode.c).
 *
 * Input: one flags byte, then the file image.
 *   bit 0     a pixel limit of 4096 instead of 4 megapixels
 *   bit 3     fail the n-th allocation of the decode, n = the high nibble + 1
 *
 * Checked: no crash, leak or undefined behaviour; on success width x height within
 * the limit and every byte of the RGB buffer readable (ASan would see a short
 * buffer); on failure nothing returned, a message set, nothing left allocated. */
#include "fuzz-common.h"

#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pkv_log_set(NULL, NULL, PKV_LOG_NONE);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t flags = data[0];
    pkv_media_limits lim = {.max_bytes = 1 << 20, .max_pixels = (flags & 1) ? 4096 : 4 << 20};
    uint8_t *f = malloc(size - 1 ? size - 1 : 1);
    FUZZ_CHECK(f);
    memcpy(f, data + 1, size - 1);
    int64_t live = pkv_alloc_live();
    /* the header probe the server runs first: no allocation; a size it finds is the
     * decoded one */
    pkv_media_probe_info pi;
    const bool probed = pkv_media_probe(f, size - 1, PKV_MEDIA_IMAGE, &pi) == PKV_OK;
    FUZZ_CHECK(!probed || (pi.width >= 0 && pi.height >= 0));
    FUZZ_CHECK(pkv_alloc_live() == live);
    if (flags & 8) pkv_alloc_fail_at((uint64_t)(flags >> 4) + 1);
    uint8_t *rgb = f;
    int w = -1, h = -1;
    pkv_status st = pkv_image_decode(f, size - 1, &lim, &rgb, &w, &h);
    pkv_alloc_fail_at(0);
    if (st == PKV_OK) {
        FUZZ_CHECK(rgb != NULL && w > 0 && h > 0 && (int64_t)w * h <= lim.max_pixels);
        FUZZ_CHECK(!probed || pi.width == 0 || (pi.width == w && pi.height == h));
        unsigned sum = 0;
        for (size_t i = 0; i < (size_t)w * h * 3; i++) sum += rgb[i];
        (void)sum;
        pkv_media_free(rgb);
    } else {
        FUZZ_CHECK(rgb == NULL && w == 0 && h == 0);
        FUZZ_CHECK(pkv_errmsg()[0] != 0);
    }
    FUZZ_CHECK(pkv_alloc_live() == live);
    free(f);
    return 0;
}
