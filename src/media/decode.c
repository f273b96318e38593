/* Media file decoding (libsndfile + soxr, libspng + libjpeg-turbo). Not built yet: issue 34. */
#include "media/media-impl.h"

pkv_status pkv_audio_decode(const void *data, size_t size, int rate, const pkv_media_limits *lim, float **samples,
                            int64_t *n_samples) {
    (void)data, (void)size, (void)rate, (void)lim, (void)samples, (void)n_samples;
    return pkv_err(PKV_ERR_UNSUPPORTED, "audio decoding is not built in yet");
}

pkv_status pkv_image_decode(const void *data, size_t size, const pkv_media_limits *lim, uint8_t **rgb, int *width,
                            int *height) {
    (void)data, (void)size, (void)lim, (void)rgb, (void)width, (void)height;
    return pkv_err(PKV_ERR_UNSUPPORTED, "image decoding is not built in yet");
}

void pkv_media_free(void *p) { pkv_free(p); }
