/* Media files for the server tests, written in memory: base64 text, and (with
 * libspng, PKV_HAVE_SPNG) a small PNG. */
#ifndef PKV_MEDIA_TESTLIB_H
#define PKV_MEDIA_TESTLIB_H

#include <stdint.h>
#include <stdlib.h>

#ifdef PKV_HAVE_SPNG
#include <spng.h>
#endif

/* Base64 of n bytes (malloc'd, NUL-terminated). */
static inline char *tm_b64(const uint8_t *d, size_t n) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(n / 3 * 4 + 8);
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        o[k++] = a[v >> 18 & 63], o[k++] = a[v >> 12 & 63];
        o[k++] = i + 1 < n ? a[v >> 6 & 63] : '=';
        o[k++] = i + 2 < n ? a[v & 63] : '=';
    }
    o[k] = 0;
    return o;
}

#ifdef PKV_HAVE_SPNG
/* A 40 x 30 RGB PNG; pixel byte `poke` changed by one. */
static inline uint8_t *tm_png(int poke, size_t *len) {
    uint8_t px[40 * 30 * 3];
    for (int i = 0; i < (int)sizeof px; i++) px[i] = (uint8_t)(i * 7 + (i / 120) * 13);
    if (poke >= 0) px[poke] ^= 1;
    spng_ctx *c = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(c, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {.width = 40, .height = 30, .bit_depth = 8, .color_type = 2};
    int e = spng_set_ihdr(c, &ih);
    if (!e) e = spng_encode_image(c, px, sizeof px, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    uint8_t *out = e ? NULL : spng_get_png_buffer(c, len, &e);
    spng_ctx_free(c);
    return out;
}
#endif

#endif
