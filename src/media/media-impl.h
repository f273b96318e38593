/* The media layer (internal): projector files and their encoders. mmproj.c reads
 * the file and dispatches on its projector type to an encoder: mmproj-audio.c
 * (voxtral: log-mel front end, Whisper-style encoder, projector) and
 * mmproj-vision.c (gemma3: SigLIP encoder, pooling, projector). decode-*.c turn
 * file images into pkv_media. docs/multimodal.md. */
#ifndef PKV_MEDIA_IMPL_H
#define PKV_MEDIA_IMPL_H

#include "base/base.h"
#include "model/gguf.h"

struct pkv_mmproj {
    pkv_mmproj_info info;
    char projector[32];   /* info.projector points here */
    pkv_device *dev;      /* where the encoder runs */
    bool own_dev;         /* opened by pkv_mmproj_load (closed by free) */
    pkv_gguf *g;          /* the file (tensor data stays mapped while loaded) */
    void *enc;            /* the encoder's own state */
    pkv_status (*n_rows)(const pkv_mmproj *p, const pkv_media *m, int64_t *n_rows);
    pkv_status (*encode)(pkv_mmproj *p, const pkv_media *m, float *out, int64_t n_rows);
    void (*free_enc)(pkv_mmproj *p);
    /* encoding in slices (pkv_mmproj_encode_begin); NULL: one step encodes it all */
    pkv_status (*begin)(pkv_mmproj *p, const pkv_media *m, float *out, void **state);
    pkv_status (*step)(pkv_mmproj *p, void *state, bool *done);
    void (*end)(pkv_mmproj *p, void *state);
};

/* Fill p (info, enc, the three functions) from g for a projector of the given
 * type: info.text_before/text_after are the loader's to say (NULL = ""). p->g
 * and p->dev are set before the call. text_model may be NULL. */
pkv_status pkv_mmproj_audio_open(pkv_mmproj *p, const char *projector, const pkv_model *text_model);
pkv_status pkv_mmproj_vision_open(pkv_mmproj *p, const char *projector, const pkv_model *text_model);

#endif
