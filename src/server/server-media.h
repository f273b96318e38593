/* Media in requests (server-media.c; docs/server.md "Audio and images"): the
 * parsing layers under the chat content parts input_audio and image_url and under
 * POST /v1/audio/transcriptions. Plain C and jansson, no HTTP and no model: the
 * unit test (tests/test-server-media.c) and the handlers share them. Everything
 * here treats its input as hostile: sizes are checked before anything of that size
 * is allocated, and every refusal says what was wrong. */
#ifndef PKV_SERVER_MEDIA_H
#define PKV_SERVER_MEDIA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pagekv.h"

/* ----------------------------------------------------------------- base64 */

/* Decode standard base64 (RFC 4648: A-Z a-z 0-9 + /, '=' padding at the end only,
 * optional; no whitespace, no URL-safe alphabet). At most max decoded bytes: more
 * sets *too_big and fails before allocating. Returns malloc'd bytes (*out_n of
 * them), or NULL with the reason in err (which character, at which offset). */
uint8_t *srv_b64_decode(const char *s, size_t n, size_t max, size_t *out_n, bool *too_big, char *err, size_t err_size);

/* -------------------------------------------------------------- data URLs */

typedef struct srv_data_url {
    const char *mime; /* the media type as given ("image/png"), not NUL-terminated */
    size_t mime_len;
    const char *data; /* the payload after the comma */
    size_t data_len;
} srv_data_url;

/* Parse "data:<mediatype>[;param=value]*;base64,<payload>" (RFC 2397; only base64
 * payloads). An http(s) or any other URL is refused: the message says pagekv never
 * fetches URLs. false with err. */
bool srv_data_url_parse(const char *url, size_t n, srv_data_url *out, char *err, size_t err_size);

/* ------------------------------------------------------ multipart/form-data */

typedef struct srv_part {
    const char *name; /* the form field's name (Content-Disposition name=), NUL-free */
    size_t name_len;
    const char *filename; /* NULL when the part has no filename */
    size_t filename_len;
    const char *ctype; /* its Content-Type value, NULL when absent */
    size_t ctype_len;
    const char *data; /* the part's bytes, pointing into the body */
    size_t len;
} srv_part;

#define SRV_MULTIPART_MAX_PARTS 32
#define SRV_MULTIPART_MAX_HEADER 8192 /* bytes of one part's header block */

/* Parse a multipart/form-data body (RFC 7578 over RFC 2046): content_type is the
 * request's Content-Type header (its boundary parameter, quoted or not, 1 to 70
 * characters). Parts point into body (nothing is copied). Lines end in CRLF; a
 * preamble before the first boundary and an epilogue after the last are ignored;
 * every part needs Content-Disposition: form-data with a name; field names must
 * not repeat. At most max_parts parts (<= SRV_MULTIPART_MAX_PARTS). false with
 * err naming what is wrong (which part, what was expected). */
bool srv_multipart_parse(const char *content_type, const char *body, size_t len, srv_part *parts, int max_parts,
                         int *n_parts, char *err, size_t err_size);
/* The part named name (NUL-terminated) or NULL. */
const srv_part *srv_part_find(const srv_part *parts, int n, const char *name);

/* ---------------------------------------------------- media in chat requests */

typedef struct srv_media_opts {
    int audio_rate;       /* the audio projector's sample rate; 0 = no audio projector loaded */
    bool images;          /* an image projector is loaded */
    pkv_media_limits lim; /* per medium (max_bytes: the decoded file's size) */
    int max_items;        /* media per request; 0 = 16 */
    double max_request_audio_seconds; /* all the request's audio together; 0 = 1800 */
    int64_t max_request_pixels;       /* all the request's images together; 0 = 100 megapixels */
    /* the context's room: rows(m, rows_ud) is the projector's row count for a
     * medium of m's shape (no samples or pixels in m: it is read from the header);
     * the media together must leave room below n_ctx. rows NULL = no check. */
    int64_t (*rows)(const pkv_media *m, void *rows_ud);
    void *rows_ud;
    int64_t n_ctx;
    /* true when the client went away: checked before each medium is decoded (then
     * the extraction stops, status 499); NULL = never */
    bool (*gone)(void *gone_ud);
    void *gone_ud;
} srv_media_opts;

typedef struct srv_media_item {
    pkv_media m;    /* decoded; m.samples / m.rgb owned (pkv_media_free) */
    int msg, part;  /* where it was: messages[msg].content[part] */
    /* (srv_media_extract's own, between its checks and the decoding) */
    uint8_t *raw;   /* the file image */
    size_t raw_n;
    pkv_media_probe_info pi; /* what its header says */
    char where[96];
} srv_media_item;

typedef struct srv_media_list {
    srv_media_item *items;
    int n;
    char marker[48]; /* the text that stands for a medium in the rendered prompt */
} srv_media_list;

/* Find the input_audio ({"input_audio": {"data": BASE64, "format": "wav"}}) and
 * image_url ({"image_url": {"url": "data:image/...;base64,..."}} or the URL as a
 * string) parts in body.messages[].content, check them all from their headers
 * (the count, each medium's and the request's audio seconds and pixels, the rows
 * against the context) before decoding any, then decode each (in order), and replace
 * each by a text part holding ml->marker: a string made per request with a random
 * nonce, so no client text can pose as one. The body is changed in place. false
 * with *status (400, 413 for a medium over the size limit, 500 out of memory) and
 * err; ml is then empty. A request without media leaves ml->n == 0. */
bool srv_media_extract(json_t *body, const srv_media_opts *o, srv_media_list *ml, int *status, char *err,
                       size_t err_size);
void srv_media_list_free(srv_media_list *ml);

/* Offsets of marker in text[0..len): exactly n of them, in order, none
 * overlapping, or false (the template dropped or repeated a part). */
bool srv_media_find_markers(const char *text, size_t len, const char *marker, size_t *at, int n);

#endif
