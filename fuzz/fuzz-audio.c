/* Fuzz harness: audio files through pkv_audio_decode (libsndfile from memory,
 * soxr resampling; src/media/decode.c).
 *
 * Input: one flags byte, then the file image.
 *   bits 0-1  the output rate: 16000, 8000, 22050 or 48000 Hz (most seeds are
 *             16 kHz, so the other three resample)
 *   bit 2     a duration limit of 1 s instead of 10 s
 *   bit 3     fail the n-th allocation of the decode, n = the high nibble + 1
 *
 * Checked: no crash, leak or undefined behaviour; on success a non-empty buffer of
 * finite samples no longer than the limit allows; on failure nothing returned, a
 * message set, nothing left allocated. */
#include "fuzz-common.h"

#include <math.h>
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
    static const int rates[4] = {16000, 8000, 22050, 48000};
    const uint8_t flags = data[0];
    const int rate = rates[flags & 3];
    pkv_media_limits lim = {.max_bytes = 1 << 20, .max_audio_seconds = (flags & 4) ? 1.0 : 10.0};
    /* a copy of exactly the input's size, so ASan sees any read past its end */
    uint8_t *f = malloc(size - 1 ? size - 1 : 1);
    FUZZ_CHECK(f);
    memcpy(f, data + 1, size - 1);
    int64_t live = pkv_alloc_live();
    /* the header probe the server runs first: no allocation, sane values */
    pkv_media_probe_info pi;
    if (pkv_media_probe(f, size - 1, PKV_MEDIA_AUDIO, &pi) == PKV_OK)
        FUZZ_CHECK(pi.rate >= 0 && pi.rate <= 768000 && (pi.seconds < 0 || (pi.rate > 0 && pi.seconds < 1e16)));
    FUZZ_CHECK(pkv_alloc_live() == live);
    if (flags & 8) pkv_alloc_fail_at((uint64_t)(flags >> 4) + 1);
    float *s = (float *)f;
    int64_t n = -1;
    pkv_status st = pkv_audio_decode(f, size - 1, rate, &lim, &s, &n);
    pkv_alloc_fail_at(0);
    if (st == PKV_OK) {
        FUZZ_CHECK(s != NULL && n > 0);
        FUZZ_CHECK((double)n <= lim.max_audio_seconds * rate + rate + 1);
        for (int64_t i = 0; i < n; i++) FUZZ_CHECK(isfinite(s[i]));
        pkv_media_free(s);
    } else {
        FUZZ_CHECK(s == NULL && n == 0);
        FUZZ_CHECK(pkv_errmsg()[0] != 0);
    }
    FUZZ_CHECK(pkv_alloc_live() == live);
    free(f);
    return 0;
}
