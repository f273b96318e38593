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

#endif
