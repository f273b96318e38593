/* Shared by the Voxtral projector tests: a random-weight text model and projector
 * pair (what `pagekv mkmodel --arch voxtral --mmproj-out` writes) and a test
 * signal. */
#ifndef PKV_MMPROJ_AUDIO_TESTLIB_H
#define PKV_MMPROJ_AUDIO_TESTLIB_H

#include "media/mkmmproj-audio.h"
#include "pagekv.h"
#include "testhelp.h"

#include <math.h>

#define VOX_RATE 16000

/* Write the pair; text width n_embd, encoder blocks n_layer (0 = mkmodel's 2). */
static inline pkv_status vox_make(const char *text_path, const char *proj_path, int n_embd, int n_layer) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.n_embd = n_embd;
    p.chat_template = "voxtral";
    pkv_status s = pkv_mkmodel_write(&p, text_path);
    if (s) return s;
    pkv_mkmmproj_audio_params mp = {.n_embd = n_embd, .n_layer = n_layer, .seed = 7};
    return pkv_mkmmproj_audio_write(&mp, proj_path);
}

/* seconds of a test signal at 16 kHz: a chirp, two tones and a little noise, with
 * a pause (silence) in the middle; *n receives the sample count. pkv_free it. */
static inline float *vox_signal(double seconds, int64_t *n) {
    *n = (int64_t)(seconds * VOX_RATE);
    float *x = pkv_malloc((size_t)*n * sizeof(float));
    if (!x) return NULL;
    uint64_t rs = 42;
    for (int64_t i = 0; i < *n; i++) {
        const double t = (double)i / VOX_RATE;
        double v = 0.3 * sin(2 * M_PI * (200 + 150 * t) * t) + 0.2 * sin(2 * M_PI * 440 * t) +
                   0.1 * sin(2 * M_PI * 3150 * t) + 0.02 * th_randf(&rs);
        if (t > 10 && t < 12) v = 0;
        x[i] = (float)v;
    }
    return x;
}

/* A 16-bit PCM WAV of n frames at rate with ch channels (a tone per channel and a
 * little noise); returns the file's size, 0 when it cannot be written. */
static inline size_t vox_wav_write(const char *path, int rate, int ch, int n, uint64_t seed) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    const uint32_t data = (uint32_t)(n * ch * 2), riff = 36 + data, br = (uint32_t)(rate * ch * 2);
    const uint16_t fmt[4] = {1, (uint16_t)ch, 0, 0};
    fwrite("RIFF", 1, 4, f), fwrite(&riff, 4, 1, f), fwrite("WAVEfmt ", 1, 8, f);
    const uint32_t sixteen = 16;
    fwrite(&sixteen, 4, 1, f), fwrite(fmt, 2, 2, f);
    const uint32_t r = (uint32_t)rate;
    fwrite(&r, 4, 1, f), fwrite(&br, 4, 1, f);
    const uint16_t ba = (uint16_t)(ch * 2), bits = 16;
    fwrite(&ba, 2, 1, f), fwrite(&bits, 2, 1, f), fwrite("data", 1, 4, f), fwrite(&data, 4, 1, f);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < ch; c++) {
            double t = (double)i / rate;
            int16_t v = (int16_t)lrint(9000 * sin(2 * M_PI * (300 + 200 * c) * t) + 2000 * th_randf(&seed));
            fwrite(&v, 2, 1, f);
        }
    fclose(f);
    return 44 + data;
}

#endif
