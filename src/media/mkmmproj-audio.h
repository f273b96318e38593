/* A random-weight Voxtral projector file (mmproj GGUF) in the layout llama.cpp's
 * convert_hf_to_gguf.py --mmproj writes for VoxtralForConditionalGeneration: keys
 * general.architecture "clip", general.type "mmproj", clip.has_audio_encoder,
 * clip.projector_type "voxtral", clip.audio.*; tensors a.conv1d.{1,2}.*,
 * a.position_embd.weight, a.blk.N.*, a.post_ln.*, mm.a.mlp.{1,2}.weight (f16
 * matrices and convolutions, f32 vectors, the conv biases as [1, d] as the
 * converter unsqueezes them). A tiny encoder (2 blocks of width 64, 4 heads, FFN
 * 256 = 4 x 64 as Voxtral's intermediate_size = 4 x hidden_size) with the real
 * front end: 128 mel bins, 1500 positions, stack factor 4, so 30 s of audio makes
 * 375 rows of n_embd (the text model's width). */
#ifndef PKV_MEDIA_MKMMPROJ_AUDIO_H
#define PKV_MEDIA_MKMMPROJ_AUDIO_H

#include "base/base.h"

typedef struct pkv_mkmmproj_audio_params {
    int n_embd;    /* the text model's width (clip.audio.projection_dim); > 0 */
    int d;         /* encoder width; 0 = 64 */
    int n_layer;   /* 0 = 2 */
    int n_head;    /* 0 = 4 */
    uint64_t seed; /* 0 = 1 */
} pkv_mkmmproj_audio_params;

/* The pair mkmodel writes with it (mkmodel --arch PKV_MKMMPROJ_AUDIO_PAIR): a text
 * model of PKV_MKMMPROJ_AUDIO_TEXT_ARCH, as the converter writes Voxtral's (a llama
 * with the transcription prompt's special tokens), with the chat family
 * PKV_MKMMPROJ_AUDIO_TEMPLATE. The projector's own facts, so the CLI names no
 * model family. */
#define PKV_MKMMPROJ_AUDIO_PAIR "voxtral"
#define PKV_MKMMPROJ_AUDIO_TEXT_ARCH "llama"
#define PKV_MKMMPROJ_AUDIO_TEMPLATE "voxtral"

/* Write the file (atomically). */
pkv_status pkv_mkmmproj_audio_write(const pkv_mkmmproj_audio_params *p, const char *path);

#endif
