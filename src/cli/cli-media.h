/* Media options of the model commands (cli-media.c): --mmproj FILE, --audio FILE,
 * --image FILE (several, in order), --media-at K, --embd-out FILE. */
#ifndef PKV_CLI_MEDIA_H
#define PKV_CLI_MEDIA_H

#include <stdbool.h>
#include <stdint.h>

#include "pagekv.h"

#define PKV_CLI_MAX_MEDIA 16

typedef struct pkv_cli_media {
    const char *mmproj, *embd_out;
    const char *path[PKV_CLI_MAX_MEDIA];
    pkv_media_kind kind[PKV_CLI_MAX_MEDIA];
    int32_t at[PKV_CLI_MAX_MEDIA];     /* -1: not set */
    int32_t at_arg[PKV_CLI_MAX_MEDIA]; /* --media-at values, for the files in order */
    int n, n_at;
} pkv_cli_media;

/* 1: argv[*i] was a media option (consumed); 0: not one; -1: bad value (printed). */
int pkv_cli_media_opt(int argc, char **argv, int *i, pkv_cli_media *o);
/* The options go together (printed error otherwise). */
bool pkv_cli_media_check(const char *cmd, const pkv_cli_media *o);

/* A decoded file: the pkv_media and what it borrows. */
typedef struct pkv_cli_decoded {
    pkv_media m;
    float *samples;
    uint8_t *rgb;
} pkv_cli_decoded;
pkv_status pkv_cli_media_decode(const char *cmd, const char *path, pkv_media_kind kind, int rate, pkv_cli_decoded *d);
void pkv_cli_decoded_free(pkv_cli_decoded *d);
/* Encode m: *out a chunk (key, rows, non_causal; at 0) whose rows *embd the caller frees. */
pkv_status pkv_cli_media_rows(const char *cmd, pkv_mmproj *p, const pkv_media *m, pkv_media_rows *out, float **embd);

/* Every file of o encoded by the projector, in order. */
typedef struct pkv_cli_encoded {
    pkv_mmproj *p;
    pkv_mmproj_info info;
    pkv_media_rows rows[PKV_CLI_MAX_MEDIA]; /* .at from --media-at (0 when not given) */
    float *embd[PKV_CLI_MAX_MEDIA];
    int n;
} pkv_cli_encoded;
/* Load the projector for model, decode and encode every file (printed errors);
 * --embd-out: the rows of every file in order, raw little-endian float32
 * [n_rows][n_embd], no header (the shape goes to stderr). */
pkv_status pkv_cli_media_encode(const char *cmd, pkv_model *model, const pkv_cli_media *o, pkv_cli_encoded *e);
void pkv_cli_encoded_free(pkv_cli_encoded *e);
/* A text prompt with media: split at the <__media__> markers (one per file; none:
 * every file goes before the text, after BOS), each piece tokenized with special
 * tokens parsed; sets e->rows[i].at. Each medium goes between the projector's
 * e->info.text_before and text_after (gemma3: <start_of_image> ... <end_of_image>;
 * voxtral: [BEGIN_AUDIO] ...), as llama.cpp's mtmd puts them. *toks: malloc'd. */
pkv_status pkv_cli_media_prompt(pkv_model *m, const char *prompt, pkv_cli_encoded *e, int32_t **toks, size_t *n);

/* pagekv demo with a media file (cmd-demo-media.c): the media KV checks on each device. */
int pkv_cli_demo_media(const char *model_path, const char *const *devices, int n_dev, const pkv_cli_media *mo);

#endif
