/* Media in requests: base64, data URLs, multipart/form-data and the chat content
 * parts that carry audio and images (server-media.h). */
#include "server/server-media.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#define ERR(...) (snprintf(err, err_size, __VA_ARGS__), false)

/* ----------------------------------------------------------------- base64 */

static int b64_val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

uint8_t *srv_b64_decode(const char *s, size_t n, size_t max, size_t *out_n, bool *too_big, char *err, size_t err_size) {
    *out_n = 0;
    if (too_big) *too_big = false;
    size_t pad = 0;
    while (pad < 2 && n > pad && s[n - 1 - pad] == '=') pad++;
    const size_t m = n - pad; /* data characters */
    if (m % 4 == 1) {
        snprintf(err, err_size, "invalid base64: %zu characters cannot be base64 (a length of 4k+1)", m);
        return NULL;
    }
    if (pad && (m + pad) % 4) {
        snprintf(err, err_size, "invalid base64: '=' padding does not end a group of 4 characters");
        return NULL;
    }
    const size_t bytes = m / 4 * 3 + (m % 4 ? m % 4 - 1 : 0);
    if (bytes > max) {
        if (too_big) *too_big = true;
        snprintf(err, err_size, "the medium is %zu bytes, more than the limit of %zu bytes", bytes, max);
        return NULL;
    }
    uint8_t *o = malloc(bytes ? bytes : 1);
    if (!o) {
        snprintf(err, err_size, "out of memory for %zu bytes", bytes);
        return NULL;
    }
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < m; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) {
            free(o);
            unsigned char c = (unsigned char)s[i];
            if (c >= 0x20 && c < 0x7f)
                snprintf(err, err_size, "invalid base64: character '%c' at offset %zu", c, i);
            else
                snprintf(err, err_size, "invalid base64: byte 0x%02x at offset %zu", c, i);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[k++] = (uint8_t)(acc >> bits);
        }
    }
    /* The bits a short last group leaves over must be zero (canonical encoding). */
    if (bits && (acc & ((1u << bits) - 1))) {
        free(o);
        snprintf(err, err_size, "invalid base64: the last group has stray bits");
        return NULL;
    }
    *out_n = k;
    return o;
}

/* -------------------------------------------------------------- data URLs */

bool srv_data_url_parse(const char *url, size_t n, srv_data_url *out, char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    if (n >= 5 && !strncasecmp(url, "data:", 5)) {
        const char *comma = memchr(url, ',', n);
        if (!comma) return ERR("malformed data URL: no ',' before its payload");
        const char *meta = url + 5, *end = comma;
        size_t ml = (size_t)(end - meta);
        if (ml < 7 || strncasecmp(end - 7, ";base64", 7))
            return ERR("data URL without ';base64': only base64 payloads are taken");
        const char *semi = memchr(meta, ';', ml);
        out->mime = meta;
        out->mime_len = (size_t)(semi - meta);
        out->data = comma + 1;
        out->data_len = n - (size_t)(comma + 1 - url);
        return true;
    }
    if ((n >= 7 && !strncasecmp(url, "http://", 7)) || (n >= 8 && !strncasecmp(url, "https://", 8)))
        return ERR("image URLs are not fetched: pagekv never fetches URLs; send the image inline as a data URL "
                   "(data:image/png;base64,...)");
    return ERR("not a data URL: media must come inline as 'data:<type>;base64,<data>' (pagekv never fetches URLs)");
}

/* ------------------------------------------------------ multipart/form-data */

/* A parameter's value in a header (name=value or name="value", case-insensitive
 * name) within s[0..n): its bytes in *v, *vl. Quoted values end at the first
 * unescaped quote; a backslash escapes the next character (kept as is). */
static bool header_param(const char *s, size_t n, const char *name, const char **v, size_t *vl, char *err,
                         size_t err_size, bool *bad) {
    const size_t nl = strlen(name);
    size_t i = 0;
    *bad = false;
    while (i < n) {
        /* next ';' outside quotes */
        while (i < n && s[i] != ';') {
            if (s[i] == '"') {
                i++;
                while (i < n && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
            }
            i++;
        }
        if (i >= n) return false;
        i++;
        while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
        if (n - i > nl && !strncasecmp(s + i, name, nl) && s[i + nl] == '=') {
            i += nl + 1;
            if (i < n && s[i] == '"') {
                size_t st = ++i;
                while (i < n && s[i] != '"') {
                    if (s[i] == '\\') i++;
                    i++;
                }
                if (i >= n) {
                    *bad = true;
                    snprintf(err, err_size, "unterminated quoted %s", name);
                    return false;
                }
                *v = s + st;
                *vl = i - st;
            } else {
                size_t st = i;
                while (i < n && s[i] != ';' && s[i] != ' ' && s[i] != '\t') i++;
                *v = s + st;
                *vl = i - st;
            }
            return true;
        }
    }
    return false;
}

const srv_part *srv_part_find(const srv_part *parts, int n, const char *name) {
    size_t l = strlen(name);
    for (int i = 0; i < n; i++)
        if (parts[i].name_len == l && !memcmp(parts[i].name, name, l)) return &parts[i];
    return NULL;
}

static const char *find_bytes(const char *h, size_t hl, const char *n, size_t nl) {
    return nl <= hl ? memmem(h, hl, n, nl) : NULL;
}

/* One part's header block [h, h + hl) (CRLF-separated lines, no final blank line). */
static bool part_headers(const char *h, size_t hl, srv_part *p, int idx, char *err, size_t err_size) {
    bool disp = false;
    size_t i = 0;
    while (i < hl) {
        const char *eol = find_bytes(h + i, hl - i, "\r\n", 2);
        size_t ll = eol ? (size_t)(eol - (h + i)) : hl - i;
        const char *line = h + i;
        const char *colon = memchr(line, ':', ll);
        if (!colon) return ERR("part %d: header line without ':'", idx + 1);
        size_t kl = (size_t)(colon - line);
        const char *val = colon + 1;
        size_t vl = ll - kl - 1;
        while (vl && (*val == ' ' || *val == '\t')) val++, vl--;
        while (vl && (val[vl - 1] == ' ' || val[vl - 1] == '\t')) vl--;
        for (size_t k = 0; k < ll; k++)
            if ((unsigned char)line[k] < 0x20 && line[k] != '\t') return ERR("part %d: control character in a header", idx + 1);
        if (kl == 19 && !strncasecmp(line, "Content-Disposition", 19)) {
            if (disp) return ERR("part %d: two Content-Disposition headers", idx + 1);
            disp = true;
            if (vl < 9 || strncasecmp(val, "form-data", 9) || (vl > 9 && val[9] != ';' && val[9] != ' '))
                return ERR("part %d: Content-Disposition is not form-data", idx + 1);
            bool bad;
            if (!header_param(val, vl, "name", &p->name, &p->name_len, err, err_size, &bad)) {
                if (bad) return false;
                return ERR("part %d: Content-Disposition has no name", idx + 1);
            }
            if (p->name_len == 0 || p->name_len > 256 || memchr(p->name, 0, p->name_len) || memchr(p->name, '\\', p->name_len))
                return ERR("part %d: a field name of %zu bytes (1 to 256, no NUL or backslash)", idx + 1, p->name_len);
            if (header_param(val, vl, "filename", &p->filename, &p->filename_len, err, err_size, &bad)) {
                if (p->filename_len > 1024) return ERR("part %d: a file name of %zu bytes (at most 1024)", idx + 1, p->filename_len);
            } else if (bad) {
                return false;
            }
        } else if (kl == 12 && !strncasecmp(line, "Content-Type", 12)) {
            p->ctype = val;
            p->ctype_len = vl;
        }
        /* other headers (Content-Transfer-Encoding is deprecated for form-data) are ignored */
        i += ll + 2;
    }
    if (!disp) return ERR("part %d has no Content-Disposition header", idx + 1);
    return true;
}

bool srv_multipart_parse(const char *content_type, const char *body, size_t len, srv_part *parts, int max_parts,
                         int *n_parts, char *err, size_t err_size) {
    *n_parts = 0;
    if (!content_type) return ERR("no Content-Type: send multipart/form-data");
    size_t cl = strlen(content_type);
    if (cl < 19 || strncasecmp(content_type, "multipart/form-data", 19) ||
        (cl > 19 && content_type[19] != ';' && content_type[19] != ' '))
        return ERR("Content-Type is '%.80s': send multipart/form-data", content_type);
    const char *b;
    size_t bl;
    bool bad;
    if (!header_param(content_type + 19, cl - 19, "boundary", &b, &bl, err, err_size, &bad))
        return bad ? false : ERR("multipart/form-data without a boundary parameter");
    if (bl < 1 || bl > 70) return ERR("a multipart boundary of %zu characters (1 to 70)", bl);
    for (size_t i = 0; i < bl; i++)
        if ((unsigned char)b[i] < 0x20 || (unsigned char)b[i] > 0x7e) return ERR("a multipart boundary with byte 0x%02x", (unsigned char)b[i]);
    if (max_parts > SRV_MULTIPART_MAX_PARTS) max_parts = SRV_MULTIPART_MAX_PARTS;
    /* delim = CRLF "--" boundary; the first may start the body without the CRLF */
    char delim[2 + 2 + 70];
    memcpy(delim, "\r\n--", 4);
    memcpy(delim + 4, b, bl);
    const size_t dl = 4 + bl;
    size_t pos;
    if (len >= dl - 2 && !memcmp(body, delim + 2, dl - 2)) {
        pos = dl - 2;
    } else {
        const char *f = find_bytes(body, len, delim, dl);
        if (!f) return ERR("the body has no multipart boundary line ('--%.*s')", (int)bl, b);
        pos = (size_t)(f - body) + dl;
    }
    for (int idx = 0;; idx++) {
        /* after a delimiter: "--" closes, else optional padding and CRLF */
        if (len - pos >= 2 && body[pos] == '-' && body[pos + 1] == '-') {
            if (idx == 0) return ERR("the multipart body has no parts");
            break;
        }
        while (pos < len && (body[pos] == ' ' || body[pos] == '\t')) pos++;
        if (len - pos < 2 || body[pos] != '\r' || body[pos + 1] != '\n')
            return ERR("part %d: the boundary line does not end in CRLF", idx + 1);
        pos += 2;
        if (idx >= max_parts) return ERR("more than %d parts in the form", max_parts);
        srv_part *p = &parts[idx];
        memset(p, 0, sizeof *p);
        /* headers up to the blank line (a part with no headers starts with CRLF) */
        size_t hl;
        if (len - pos >= 2 && body[pos] == '\r' && body[pos + 1] == '\n') {
            hl = 0;
            pos += 2;
        } else {
            size_t lim = len - pos < SRV_MULTIPART_MAX_HEADER + 4 ? len - pos : SRV_MULTIPART_MAX_HEADER + 4;
            const char *e = find_bytes(body + pos, lim, "\r\n\r\n", 4);
            if (!e) {
                if (lim < len - pos) return ERR("part %d: headers longer than %d bytes", idx + 1, SRV_MULTIPART_MAX_HEADER);
                return ERR("part %d: the body ends inside its headers", idx + 1);
            }
            hl = (size_t)(e - (body + pos));
            if (!part_headers(body + pos, hl, p, idx, err, err_size)) return false;
            pos += hl + 4;
        }
        if (hl == 0) return ERR("part %d has no Content-Disposition header", idx + 1);
        const char *f = find_bytes(body + pos, len - pos, delim, dl);
        if (!f) return ERR("part %d ('%.*s'): the body ends before its closing boundary", idx + 1, (int)(p->name_len > 64 ? 64 : p->name_len), p->name);
        p->data = body + pos;
        p->len = (size_t)(f - (body + pos));
        for (int j = 0; j < idx; j++)
            if (parts[j].name_len == p->name_len && !memcmp(parts[j].name, p->name, p->name_len))
                return ERR("the field '%.*s' is given twice", (int)(p->name_len > 64 ? 64 : p->name_len), p->name);
        *n_parts = idx + 1;
        pos = (size_t)(f - body) + dl;
    }
    return true;
}

/* ---------------------------------------------------- media in chat requests */

static void make_marker(char *out, size_t size) {
    uint64_t r[2] = {0, 0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) { /* no entropy source: still unguessable enough per process */
        static uint64_t k;
        r[0] = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&r ^ (++k * 0x9e3779b97f4a7c15ull);
        r[1] = (uint64_t)clock() * 0xbf58476d1ce4e5b9ull ^ k;
    }
    snprintf(out, size, "<__media_%016llx%016llx__>", (unsigned long long)r[0], (unsigned long long)r[1]);
}

void srv_media_list_free(srv_media_list *ml) {
    if (!ml) return;
    for (int i = 0; i < ml->n; i++) {
        pkv_media_free((void *)ml->items[i].m.samples);
        pkv_media_free((void *)ml->items[i].m.rgb);
        free(ml->items[i].raw);
    }
    free(ml->items);
    ml->items = NULL;
    ml->n = 0;
}

static bool fail(int *status, int st, char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static bool fail(int *status, int st, char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    *status = st;
    return false;
}

#define SRV_DEFAULT_REQUEST_SECONDS 1800.0
#define SRV_DEFAULT_REQUEST_PIXELS ((int64_t)100 * 1000 * 1000)
#define SRV_DEFAULT_MEDIUM_PIXELS ((int64_t)50 * 1000 * 1000) /* pkv_media_limits' default */

/* The file image of one part (base64 decoded, size checked) and what its header
 * says, into it->raw and it->pi. */
static bool load_one(const char *b64, size_t n, bool audio, const srv_media_opts *o, srv_media_item *it, int *status,
                     char *err, size_t err_size) {
    char e2[256];
    bool too_big = false;
    const size_t max = o->lim.max_bytes ? o->lim.max_bytes : ((size_t)64 << 20);
    it->raw = srv_b64_decode(b64, n, max, &it->raw_n, &too_big, e2, sizeof e2);
    if (!it->raw) return fail(status, too_big ? 413 : 400, err, err_size, "%s: %s", it->where, e2);
    if (pkv_media_probe(it->raw, it->raw_n, audio ? PKV_MEDIA_AUDIO : PKV_MEDIA_IMAGE, &it->pi))
        return fail(status, 400, err, err_size, "%s: %s", it->where, pkv_errmsg());
    return true;
}

/* Decode one medium's file image into it->m under the limits l. */
static pkv_status decode_one(const srv_media_opts *o, const pkv_media_limits *l, srv_media_item *it) {
    pkv_status st;
    memset(&it->m, 0, sizeof it->m);
    if (it->pi.kind == PKV_MEDIA_AUDIO) {
        float *s = NULL;
        int64_t ns = 0;
        st = pkv_audio_decode(it->raw, it->raw_n, o->audio_rate, l, &s, &ns);
        it->m.kind = PKV_MEDIA_AUDIO;
        it->m.samples = s;
        it->m.n_samples = ns;
        it->m.rate = o->audio_rate;
    } else {
        uint8_t *rgb = NULL;
        int w = 0, h = 0;
        st = pkv_image_decode(it->raw, it->raw_n, l, &rgb, &w, &h);
        it->m.kind = PKV_MEDIA_IMAGE;
        it->m.rgb = rgb;
        it->m.width = w;
        it->m.height = h;
    }
    free(it->raw);
    it->raw = NULL;
    return st;
}

/* The per-medium and per-request limits and the context's room, from the headers
 * alone (it->pi): the totals so far in *sec, *pix, *rows. */
static bool check_one(const srv_media_opts *o, const srv_media_item *it, double *sec, int64_t *pix, int64_t *rows,
                      int *status, char *err, size_t err_size) {
    const pkv_media_probe_info *pi = &it->pi;
    const double max_sec = o->lim.max_audio_seconds > 0 ? o->lim.max_audio_seconds : 1800.0;
    const double req_sec = o->max_request_audio_seconds > 0 ? o->max_request_audio_seconds : SRV_DEFAULT_REQUEST_SECONDS;
    const int64_t max_pix = o->lim.max_pixels > 0 ? o->lim.max_pixels : SRV_DEFAULT_MEDIUM_PIXELS;
    const int64_t req_pix = o->max_request_pixels > 0 ? o->max_request_pixels : SRV_DEFAULT_REQUEST_PIXELS;
    pkv_media shape = {.kind = pi->kind};
    if (pi->kind == PKV_MEDIA_AUDIO) {
        if (pi->seconds > max_sec)
            return fail(status, 400, err, err_size, "%s: its header says %.1f s of audio, more than the limit of %g s "
                        "per medium (--max-audio-seconds)", it->where, pi->seconds, max_sec);
        if (pi->seconds > 0) *sec += pi->seconds;
        if (*sec > req_sec)
            return fail(status, 400, err, err_size, "the request's audio is %.1f s (up to %s), more than the limit of "
                        "%g s per request (--max-request-audio-seconds)", *sec, it->where, req_sec);
        shape.rate = o->audio_rate;
        shape.n_samples = pi->seconds > 0 ? (int64_t)(pi->seconds * o->audio_rate) : 0;
    } else {
        const int64_t p = (int64_t)pi->width * pi->height;
        if (p > max_pix)
            return fail(status, 400, err, err_size, "%s: an image of %d x %d = %lld pixels, more than the limit of "
                        "%lld per image (--max-image-pixels)", it->where, pi->width, pi->height, (long long)p,
                        (long long)max_pix);
        *pix += p;
        if (*pix > req_pix)
            return fail(status, 400, err, err_size, "the request's images have %lld pixels (up to %s), more than the "
                        "limit of %lld per request (--max-request-pixels)", (long long)*pix, it->where,
                        (long long)req_pix);
        shape.width = pi->width, shape.height = pi->height;
    }
    if (o->rows && (pi->kind == PKV_MEDIA_IMAGE || shape.n_samples > 0)) {
        *rows += o->rows(&shape, o->rows_ud);
        if (*rows >= o->n_ctx)
            return fail(status, 400, err, err_size, "the media take at least %lld positions (up to %s); the context "
                        "holds %lld (start the server with a larger -c, or send less)", (long long)*rows, it->where,
                        (long long)o->n_ctx);
    }
    return true;
}

/* Decode every medium, each under its own limits narrowed to what the request's
 * budgets leave: a header that gave no length (or a false one) cannot take the
 * request past them. */
static bool decode_all(const srv_media_opts *o, srv_media_list *ml, int *status, char *err, size_t err_size) {
    const double req_sec = o->max_request_audio_seconds > 0 ? o->max_request_audio_seconds : SRV_DEFAULT_REQUEST_SECONDS;
    const int64_t req_pix = o->max_request_pixels > 0 ? o->max_request_pixels : SRV_DEFAULT_REQUEST_PIXELS;
    const double max_sec = o->lim.max_audio_seconds > 0 ? o->lim.max_audio_seconds : 1800.0;
    const int64_t max_pix = o->lim.max_pixels > 0 ? o->lim.max_pixels : SRV_DEFAULT_MEDIUM_PIXELS;
    double used_sec = 0, rest_sec = 0;
    int64_t used_pix = 0, rest_pix = 0;
    for (int i = 0; i < ml->n; i++) {
        const pkv_media_probe_info *pi = &ml->items[i].pi;
        if (pi->kind == PKV_MEDIA_AUDIO && pi->seconds > 0) rest_sec += pi->seconds;
        if (pi->kind == PKV_MEDIA_IMAGE) rest_pix += (int64_t)pi->width * pi->height;
    }
    for (int i = 0; i < ml->n; i++) {
        srv_media_item *it = &ml->items[i];
        if (o->gone && o->gone(o->gone_ud))
            return fail(status, 499, err, err_size, "the client went away: %d of %d media decoded", i, ml->n);
        const bool audio = it->pi.kind == PKV_MEDIA_AUDIO;
        if (audio && it->pi.seconds > 0) rest_sec -= it->pi.seconds;
        if (!audio) rest_pix -= (int64_t)it->pi.width * it->pi.height;
        pkv_media_limits l = o->lim;
        const double left_sec = req_sec - used_sec - rest_sec + 1e-6; /* (a file at the limit: no rounding refusal) */
        const int64_t left_pix = req_pix - used_pix - rest_pix;
        const bool by_request = audio ? left_sec < max_sec : left_pix < max_pix;
        if (audio) l.max_audio_seconds = by_request ? left_sec : max_sec;
        else l.max_pixels = by_request ? left_pix : max_pix;
        /* (nothing left of a budget: refused as a decode over it would be) */
        pkv_status st = (audio ? l.max_audio_seconds < 1e-3 : l.max_pixels < 1) ? PKV_ERR_INVALID : decode_one(o, &l, it);
        if (st == PKV_ERR_NOMEM) return fail(status, 500, err, err_size, "%s: out of memory decoding it", it->where);
        if (st == PKV_ERR_INVALID && by_request)
            return fail(status, 400, err, err_size, audio ? "%s: the request's audio is more than the limit of %g s per "
                        "request (--max-request-audio-seconds)" : "%s: the request's images have more than the limit "
                        "of %.0f pixels per request (--max-request-pixels)", it->where,
                        audio ? req_sec : (double)req_pix);
        if (st) return fail(status, 400, err, err_size, "%s: %s", it->where, pkv_errmsg());
        if (audio) used_sec += (double)it->m.n_samples / (o->audio_rate > 0 ? o->audio_rate : 1);
        else used_pix += (int64_t)it->m.width * it->m.height;
    }
    return true;
}

bool srv_media_extract(json_t *body, const srv_media_opts *o, srv_media_list *ml, int *status, char *err,
                       size_t err_size) {
    memset(ml, 0, sizeof *ml);
    *status = 0;
    make_marker(ml->marker, sizeof ml->marker);
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) return true; /* the template layer says what is wrong */
    const int max_items = o->max_items > 0 ? o->max_items : 16;
    size_t i, k;
    json_t *msg, *part;
    /* the count first: a request of too many media is refused before any is read */
    int count = 0;
    json_array_foreach(msgs, i, msg) {
        json_t *content = json_object_get(msg, "content");
        if (!json_is_array(content)) continue;
        json_array_foreach(content, k, part) {
            const char *ty = json_string_value(json_object_get(part, "type"));
            if (ty && (!strcmp(ty, "input_audio") || !strcmp(ty, "image_url")) && ++count > max_items)
                return fail(status, 400, err, err_size, "more than %d media in one request "
                            "('messages[%zu].content[%zu]' is number %d; nothing was decoded)", max_items, i, k, count);
        }
    }
    double sec = 0;
    int64_t pix = 0, rows = 0;
    json_array_foreach(msgs, i, msg) {
        json_t *content = json_object_get(msg, "content");
        if (!json_is_array(content)) continue;
        json_array_foreach(content, k, part) {
            const char *ty = json_string_value(json_object_get(part, "type"));
            if (!ty) continue;
            const bool audio = !strcmp(ty, "input_audio"), image = !strcmp(ty, "image_url");
            if (!audio && !image) {
                if (!strcmp(ty, "image") || !strcmp(ty, "audio") || !strcmp(ty, "audio_url") || !strcmp(ty, "file") ||
                    !strcmp(ty, "input_image") || !strcmp(ty, "video_url"))
                    goto unsupported;
                continue;
            }
            char where[96];
            snprintf(where, sizeof where, "'messages[%zu].content[%zu]' (%s)", i, k, ty);
            const char *b64 = NULL;
            size_t n = 0;
            if (audio) {
                json_t *ia = json_object_get(part, "input_audio");
                json_t *data = json_object_get(ia, "data"), *fmt = json_object_get(ia, "format");
                if (!json_is_object(ia) || !json_is_string(data))
                    return fail(status, 400, err, err_size, "%s: expected {\"input_audio\": {\"data\": BASE64, "
                                                           "\"format\": \"wav\"}}", where),
                           srv_media_list_free(ml), false;
                const char *f = json_string_value(fmt);
                if (fmt && !f)
                    return fail(status, 400, err, err_size, "%s: 'format' must be a string", where), srv_media_list_free(ml), false;
                if (f && strcmp(f, "wav") && strcmp(f, "flac") && strcmp(f, "ogg"))
                    return fail(status, 400, err, err_size, "%s: audio format '%.32s' is not supported (wav, flac, ogg)",
                                where, f),
                           srv_media_list_free(ml), false;
                b64 = json_string_value(data);
                n = json_string_length(data);
            } else {
                json_t *iu = json_object_get(part, "image_url");
                json_t *url = json_is_object(iu) ? json_object_get(iu, "url") : iu;
                if (!json_is_string(url))
                    return fail(status, 400, err, err_size, "%s: expected {\"image_url\": {\"url\": "
                                                           "\"data:image/png;base64,...\"}}", where),
                           srv_media_list_free(ml), false;
                srv_data_url du;
                char e2[256];
                if (!srv_data_url_parse(json_string_value(url), json_string_length(url), &du, e2, sizeof e2))
                    return fail(status, 400, err, err_size, "%s: %s", where, e2), srv_media_list_free(ml), false;
                if (du.mime_len < 6 || strncasecmp(du.mime, "image/", 6))
                    return fail(status, 400, err, err_size, "%s: the data URL's type is '%.*s', not image/...", where,
                                (int)(du.mime_len > 64 ? 64 : du.mime_len), du.mime),
                           srv_media_list_free(ml), false;
                b64 = du.data;
                n = du.data_len;
            }
            /* (after the URL check: an http URL is refused as such whatever is loaded) */
            if (audio && !o->audio_rate)
                return fail(status, 400, err, err_size, "%s: this server takes no audio (start it with --mmproj of an "
                                                       "audio projector, e.g. Voxtral's)", where),
                       srv_media_list_free(ml), false;
            if (image && !o->images)
                return fail(status, 400, err, err_size, "%s: this server takes no images (start it with --mmproj of "
                                                       "an image projector, e.g. Gemma 3's)", where),
                       srv_media_list_free(ml), false;
            srv_media_item *g = realloc(ml->items, (size_t)(ml->n + 1) * sizeof *g);
            if (!g) return fail(status, 500, err, err_size, "out of memory"), srv_media_list_free(ml), false;
            ml->items = g;
            srv_media_item *it = &ml->items[ml->n++];
            memset(it, 0, sizeof *it);
            it->msg = (int)i, it->part = (int)k;
            snprintf(it->where, sizeof it->where, "%s", where);
            if (!load_one(b64, n, audio, o, it, status, err, err_size) ||
                !check_one(o, it, &sec, &pix, &rows, status, err, err_size))
                return srv_media_list_free(ml), false;
            json_t *txt = json_pack("{s:s,s:s}", "type", "text", "text", ml->marker);
            if (!txt || json_array_set_new(content, k, txt))
                return fail(status, 500, err, err_size, "out of memory"), srv_media_list_free(ml), false;
            continue;
        unsupported:
            return fail(status, 400, err, err_size,
                        "'messages[%zu].content[%zu]': content parts of type '%.32s' are not supported (text, "
                        "image_url with a data URL, input_audio)", i, k, ty),
                   srv_media_list_free(ml), false;
        }
    }
    if (!decode_all(o, ml, status, err, err_size)) return srv_media_list_free(ml), false;
    return true;
}

bool srv_media_find_markers(const char *text, size_t len, const char *marker, size_t *at, int n) {
    const size_t ml = strlen(marker);
    size_t pos = 0;
    int found = 0;
    for (;;) {
        const char *f = ml <= len - pos ? memmem(text + pos, len - pos, marker, ml) : NULL;
        if (!f) break;
        if (found >= n) return false;
        at[found++] = (size_t)(f - text);
        pos = (size_t)(f - text) + ml;
    }
    return found == n;
}
