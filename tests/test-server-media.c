// labels: unit server
/* The server's media parsing layers (src/server/server-media.c), without a model:
 *   - base64: round trips of every length 0..300 against an encoder written here;
 *     every invalid character, bad padding, a 4k+1 length, stray bits, the size
 *     limit (refused before allocating: too_big);
 *   - data URLs: type and payload found; http(s) URLs refused saying pagekv never
 *     fetches; no comma, no ;base64;
 *   - multipart/form-data: a body as the openai npm client (undici's FormData)
 *     and curl write it, quoted and bare boundaries, preamble and epilogue, binary
 *     data holding CR LF and "--" near the boundary; then malformed input: every
 *     prefix of a good body and every single-byte corruption of its structure is
 *     refused or parsed into parts that lie inside the body (never a crash; ASan
 *     checks the bounds), and each specific error (no boundary, too long a
 *     boundary, missing Content-Disposition, no name, duplicate names, too many
 *     parts, headers too long, unterminated part) says what is wrong;
 *   - chat content parts: input_audio (a WAV in base64) and image_url (a PNG data
 *     URL) are decoded to the exact samples and pixels, replaced by the request's
 *     marker, in order; each refusal (no projector of that kind, an http URL, an
 *     unknown format, a medium over the size limit -> 413, bad base64) with its
 *     status and message; markers found in rendered text;
 *   - limits from the headers, before anything is decoded (each refusal in under
 *     0.5 s, naming its option): 17 media whose first is no audio file; WAVs,
 *     header-only FLACs, PNGs and JPEGs over the request's audio seconds or
 *     pixels, over the per-medium ones, and media whose rows (a stand-in
 *     projector's count) do not fit the context; within the budget they decode. */
#include "testhelp.h"

#include <time.h>

#ifdef PKV_HAVE_SERVER
#include "server/server-media.h"

static uint64_t g_seed = 99;

static size_t b64_encode(const uint8_t *d, size_t n, char *out, bool pad) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        out[k++] = a[v >> 18 & 63];
        out[k++] = a[v >> 12 & 63];
        if (i + 1 < n) out[k++] = a[v >> 6 & 63];
        else if (pad) out[k++] = '=';
        if (i + 2 < n) out[k++] = a[v & 63];
        else if (pad) out[k++] = '=';
    }
    out[k] = 0;
    return k;
}

static void test_base64(void) {
    uint8_t d[300];
    char e[420], err[256];
    for (size_t i = 0; i < sizeof d; i++) d[i] = (uint8_t)th_rand(&g_seed);
    for (size_t n = 0; n <= sizeof d; n++)
        for (int pad = 0; pad < 2; pad++) {
            size_t el = b64_encode(d, n, e, pad);
            size_t on = 0;
            bool big = true;
            uint8_t *o = srv_b64_decode(e, el, 1000, &on, &big, err, sizeof err);
            th_checks++;
            if (!o || on != n || memcmp(o, d, n) || big) TH_FAIL("base64 round trip of %zu bytes (pad %d): %s", n, pad, o ? "differs" : err);
            free(o);
        }
    size_t el = b64_encode(d, 30, e, true), on;
    bool big;
    /* every position, every byte outside the alphabet */
    int bad = 0;
    for (size_t i = 0; i < el - 2; i++)
        for (int c = 0; c < 256; c++) {
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/') continue;
            char save = e[i];
            e[i] = (char)c;
            uint8_t *o = srv_b64_decode(e, el, 1000, &on, &big, err, sizeof err);
            if (o) bad++;
            free(o);
            e[i] = save;
        }
    th_checks++;
    if (bad) TH_FAIL("%d corrupted base64 strings decoded", bad);
    e[5] = '-';
    CHECK(srv_b64_decode(e, el, 1000, &on, &big, err, sizeof err) == NULL);
    CHECK(strstr(err, "character '-' at offset 5") != NULL);
    b64_encode(d, 30, e, true);
    CHECK(srv_b64_decode("QUJD=", 5, 100, &on, &big, err, sizeof err) == NULL); /* padding not ending a group */
    CHECK(srv_b64_decode("QUJDR", 5, 100, &on, &big, err, sizeof err) == NULL); /* 4k+1 */
    CHECK(strstr(err, "4k+1") != NULL);
    CHECK(srv_b64_decode("QR==", 4, 100, &on, &big, err, sizeof err) == NULL); /* stray bits */
    CHECK(srv_b64_decode("Q=B=", 4, 100, &on, &big, err, sizeof err) == NULL);
    uint8_t *o = srv_b64_decode("QQ==", 4, 100, &on, &big, err, sizeof err);
    CHECK(o && on == 1 && o[0] == 'A');
    free(o);
    el = b64_encode(d, 300, e, true);
    CHECK(srv_b64_decode(e, el, 299, &on, &big, err, sizeof err) == NULL && big);
    CHECK(strstr(err, "300 bytes, more than the limit of 299") != NULL);
}

static void test_data_url(void) {
    srv_data_url u;
    char err[256];
    const char *a = "data:image/png;base64,iVBORw0K";
    CHECK(srv_data_url_parse(a, strlen(a), &u, err, sizeof err));
    CHECK(u.mime_len == 9 && !memcmp(u.mime, "image/png", 9));
    CHECK(u.data_len == 8 && !memcmp(u.data, "iVBORw0K", 8));
    a = "DATA:image/jpeg;name=x.jpg;BASE64,/9j/";
    CHECK(srv_data_url_parse(a, strlen(a), &u, err, sizeof err));
    CHECK(u.mime_len == 10 && u.data_len == 4);
    a = "https://example.com/cat.png";
    CHECK(!srv_data_url_parse(a, strlen(a), &u, err, sizeof err));
    CHECK(strstr(err, "pagekv never fetches URLs") != NULL);
    a = "http://127.0.0.1/x";
    CHECK(!srv_data_url_parse(a, strlen(a), &u, err, sizeof err));
    CHECK(strstr(err, "never fetches") != NULL);
    a = "data:image/png,rawbytes";
    CHECK(!srv_data_url_parse(a, strlen(a), &u, err, sizeof err));
    CHECK(strstr(err, ";base64") != NULL);
    a = "data:image/png;base64";
    CHECK(!srv_data_url_parse(a, strlen(a), &u, err, sizeof err));
    a = "file:///etc/passwd";
    CHECK(!srv_data_url_parse(a, strlen(a), &u, err, sizeof err));
    CHECK(strstr(err, "not a data URL") != NULL);
}

/* ------------------------------------------------------------- multipart */

typedef struct form {
    char *b;
    size_t n;
} form;

static void fput(form *f, const void *p, size_t k) {
    f->b = realloc(f->b, f->n + k + 1);
    memcpy(f->b + f->n, p, k);
    f->n += k;
}
static void fstr(form *f, const char *s) { fput(f, s, strlen(s)); }

/* The shape undici's FormData (the openai npm client on Node) writes. */
static form good_form(const char *bd, const uint8_t *file, size_t fl) {
    form f = {0};
    char h[512];
    snprintf(h, sizeof h, "--%s\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nvoxtral\r\n", bd);
    fstr(&f, h);
    snprintf(h, sizeof h, "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a b.wav\"\r\n"
                          "Content-Type: audio/wav\r\n\r\n", bd);
    fstr(&f, h);
    fput(&f, file, fl);
    snprintf(h, sizeof h, "\r\n--%s\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\nen\r\n--%s--\r\n", bd, bd);
    fstr(&f, h);
    return f;
}

static bool part_is(const srv_part *p, const char *name, const void *data, size_t len) {
    return p && p->name_len == strlen(name) && !memcmp(p->name, name, p->name_len) && p->len == len &&
           !memcmp(p->data, data, len);
}

static void test_multipart(void) {
    srv_part parts[SRV_MULTIPART_MAX_PARTS];
    int n = 0;
    char err[256];
    /* binary content with CR LF, "--" and a near-boundary inside */
    const char *bd = "----formdata-undici-0123456789";
    uint8_t file[600];
    for (size_t i = 0; i < sizeof file; i++) file[i] = (uint8_t)th_rand(&g_seed);
    memcpy(file + 100, "\r\n--", 4);
    memcpy(file + 200, "\r\n------formdata-undici-012345678", 33); /* the boundary less one character */
    form f = good_form(bd, file, sizeof file);
    char ct[200];
    snprintf(ct, sizeof ct, "multipart/form-data; boundary=%s", bd);
    CHECK(srv_multipart_parse(ct, f.b, f.n, parts, 8, &n, err, sizeof err));
    CHECK_INT(n, 3);
    CHECK(part_is(srv_part_find(parts, n, "model"), "model", "voxtral", 7));
    const srv_part *fp = srv_part_find(parts, n, "file");
    CHECK(part_is(fp, "file", file, sizeof file));
    CHECK(fp && fp->filename_len == 7 && !memcmp(fp->filename, "a b.wav", 7));
    CHECK(fp && fp->ctype_len == 9 && !memcmp(fp->ctype, "audio/wav", 9));
    CHECK(part_is(srv_part_find(parts, n, "language"), "language", "en", 2));
    CHECK(srv_part_find(parts, n, "prompt") == NULL);
    /* quoted boundary, case-insensitive type and parameter name, preamble and epilogue */
    snprintf(ct, sizeof ct, "Multipart/Form-Data; charset=utf-8; BOUNDARY=\"%s\"", bd);
    form g = {0};
    fstr(&g, "this is a preamble\r\n");
    fput(&g, f.b, f.n);
    fstr(&g, "epilogue bytes");
    CHECK(srv_multipart_parse(ct, g.b, g.n, parts, 8, &n, err, sizeof err));
    CHECK_INT(n, 3);
    free(g.b);

    /* every prefix: refused, never a crash */
    snprintf(ct, sizeof ct, "multipart/form-data; boundary=%s", bd);
    int bad = 0;
    for (size_t k = 0; k + 4 < f.n; k++) { /* the last 4 bytes ("--\r\n" minus) may go */
        char *c = malloc(k ? k : 1);
        memcpy(c, f.b, k);
        bool ok = srv_multipart_parse(ct, c, k, parts, 8, &n, err, sizeof err);
        if (ok && k < f.n - 4) bad++;
        free(c);
    }
    th_checks++;
    if (bad) TH_FAIL("%d prefixes of a multipart body parsed", bad);
    /* every single byte of the structure (not the file's data) changed: refused or
     * parts inside the body */
    bad = 0;
    for (size_t k = 0; k < f.n; k++) {
        if (k >= 180 && k < 180 + sizeof file) continue;
        for (int v = 0; v < 256; v += 17) {
            char *c = malloc(f.n);
            memcpy(c, f.b, f.n);
            c[k] = (char)v;
            if (srv_multipart_parse(ct, c, f.n, parts, 8, &n, err, sizeof err))
                for (int i = 0; i < n; i++)
                    if (parts[i].data < c || parts[i].data + parts[i].len > c + f.n || parts[i].name < c ||
                        parts[i].name + parts[i].name_len > c + f.n)
                        bad++;
            free(c);
        }
    }
    th_checks++;
    if (bad) TH_FAIL("%d corruptions gave parts outside the body", bad);

    /* specific errors */
    struct {
        const char *ct, *body, *want;
    } cases[] = {
        {"application/json", "{}", "send multipart/form-data"},
        {"multipart/form-data", "x", "without a boundary"},
        {"multipart/form-data; boundary=\"abc", "x", "unterminated quoted boundary"},
        {"multipart/form-data; boundary=12345678901234567890123456789012345678901234567890123456789012345678901", "x",
         "71 characters"},
        {"multipart/form-data; boundary=XX", "no boundary here", "no multipart boundary line"},
        {"multipart/form-data; boundary=XX", "--XX--\r\n", "has no parts"},
        {"multipart/form-data; boundary=XX", "--XX\r\n\r\nvalue\r\n--XX--", "no Content-Disposition"},
        {"multipart/form-data; boundary=XX", "--XX\r\nContent-Type: text/plain\r\n\r\nv\r\n--XX--", "no Content-Disposition"},
        {"multipart/form-data; boundary=XX", "--XX\r\nContent-Disposition: attachment; name=a\r\n\r\nv\r\n--XX--",
         "not form-data"},
        {"multipart/form-data; boundary=XX", "--XX\r\nContent-Disposition: form-data\r\n\r\nv\r\n--XX--", "has no name"},
        {"multipart/form-data; boundary=XX", "--XX\r\nContent-Disposition: form-data; name=\"\"\r\n\r\nv\r\n--XX--",
         "field name of 0 bytes"},
        {"multipart/form-data; boundary=XX",
         "--XX\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--XX\r\nContent-Disposition: form-data; name=a\r\n\r\n2\r\n--XX--",
         "'a' is given twice"},
        {"multipart/form-data; boundary=XX", "--XX\r\nContent-Disposition: form-data; name=a\r\n\r\nnever closed",
         "ends before its closing boundary"},
        {"multipart/form-data; boundary=XX", "--XX\r\nContent-Disposition: form-data; name=a", "ends inside its headers"},
        {"multipart/form-data; boundary=XX", "--XX\nContent-Disposition: form-data; name=a\n\nv\n--XX--",
         "does not end in CRLF"},
        {"multipart/form-data; boundary=XX", "--XX\r\nBroken header\r\n\r\nv\r\n--XX--", "without ':'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = srv_multipart_parse(cases[i].ct, cases[i].body, strlen(cases[i].body), parts, 8, &n, err, sizeof err);
        th_checks++;
        if (ok || !strstr(err, cases[i].want)) TH_FAIL("multipart case %zu: %s, err '%s', want '%s'", i, ok ? "parsed" : "refused", err, cases[i].want);
    }
    /* too many parts; headers too long */
    form m = {0};
    for (int i = 0; i < 9; i++) {
        char h[128];
        snprintf(h, sizeof h, "--XX\r\nContent-Disposition: form-data; name=f%d\r\n\r\nv\r\n", i);
        fstr(&m, h);
    }
    fstr(&m, "--XX--");
    CHECK(!srv_multipart_parse("multipart/form-data; boundary=XX", m.b, m.n, parts, 8, &n, err, sizeof err));
    CHECK(strstr(err, "more than 8 parts") != NULL);
    CHECK(srv_multipart_parse("multipart/form-data; boundary=XX", m.b, m.n, parts, 9, &n, err, sizeof err));
    CHECK_INT(n, 9);
    free(m.b);
    m = (form){0};
    fstr(&m, "--XX\r\nContent-Disposition: form-data; name=a\r\nX-Long: ");
    for (int i = 0; i < 9000; i++) fstr(&m, "x");
    fstr(&m, "\r\n\r\nv\r\n--XX--");
    CHECK(!srv_multipart_parse("multipart/form-data; boundary=XX", m.b, m.n, parts, 8, &n, err, sizeof err));
    CHECK(strstr(err, "headers longer than 8192 bytes") != NULL);
    free(m.b);
    free(f.b);
}

/* ------------------------------------------------------------ content parts */

static size_t wav16(uint8_t *out, const int16_t *s, int n) {
    uint32_t data = (uint32_t)n * 2, riff = 36 + data;
    uint8_t h[44] = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'A', 'V', 'E', 'f', 'm', 't', ' ', 16, 0, 0, 0, 1, 0, 1, 0,
                     0x80, 0x3e, 0, 0, 0, 0x7d, 0, 0, 2, 0, 16, 0, 'd', 'a', 't', 'a'};
    memcpy(h + 4, &riff, 4);
    memcpy(h + 40, &data, 4);
    memcpy(out, h, 44);
    memcpy(out + 44, s, data);
    return 44 + data;
}

static void test_content_parts(void) {
    int16_t smp[64];
    for (int i = 0; i < 64; i++) smp[i] = (int16_t)(i * 500 - 16000);
    uint8_t wav[44 + 128];
    size_t wl = wav16(wav, smp, 64);
    char b64[400];
    b64_encode(wav, wl, b64, true);
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"what is said?\"},"
             "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\",\"format\":\"wav\"}},"
             "{\"type\":\"text\",\"text\":\"and here?\"},"
             "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\"}}]}]}", b64, b64);
    json_error_t je;
    json_t *b = json_loads(body, 0, &je);
    REQUIRE_VOID(b);
    srv_media_opts mo = {.audio_rate = 16000};
    srv_media_list ml;
    int status = 0;
    char err[512];
    bool ok = srv_media_extract(b, &mo, &ml, &status, err, sizeof err);
    th_checks++;
    if (!ok) TH_FAIL("extract: %d %s", status, err);
    CHECK_INT(ml.n, 2);
    CHECK(!strncmp(ml.marker, "<__media_", 9) && strlen(ml.marker) == 9 + 32 + 3);
    for (int i = 0; i < ml.n; i++) {
        CHECK(ml.items[i].m.kind == PKV_MEDIA_AUDIO && ml.items[i].m.n_samples == 64 && ml.items[i].m.rate == 16000);
        int diff = 0;
        for (int k = 0; k < 64 && ml.items[i].m.samples; k++) diff += ml.items[i].m.samples[k] != smp[k] / 32768.0f;
        CHECK_INT(diff, 0);
    }
    CHECK_INT(ml.items[1].part, 3);
    json_t *c = json_object_get(json_array_get(json_object_get(b, "messages"), 0), "content");
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 1), "text")), ml.marker));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 3), "type")), "text"));
    /* markers in rendered text */
    char text[512];
    snprintf(text, sizeof text, "[INST]what is said?%sand here?%s[/INST]", ml.marker, ml.marker);
    size_t at[2];
    CHECK(srv_media_find_markers(text, strlen(text), ml.marker, at, 2));
    CHECK_INT(at[0], 19);
    CHECK(!srv_media_find_markers(text, strlen(text), ml.marker, at, 1));
    srv_media_list_free(&ml);
    /* another request's marker differs */
    srv_media_list ml2;
    CHECK(srv_media_extract(b, &mo, &ml2, &status, err, sizeof err));
    CHECK(strcmp(ml.marker, ml2.marker) != 0 || ml2.n == 0);
    srv_media_list_free(&ml2);
    json_decref(b);

    struct {
        const char *part;
        int audio_rate;
        bool images;
        size_t max_bytes;
        int status;
        const char *want;
    } cases[] = {
        {"{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\"}}", 0, true, 0, 400, "takes no audio"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,%s\"}}", 16000, false, 0, 400, "takes no images"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x.org/a.png\"}}%.0s", 16000, true, 0, 400, "never fetches"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x.org/a.png\"}}%.0s", 0, false, 0, 400, "never fetches"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:audio/wav;base64,%s\"}}", 16000, true, 0, 400, "not image/"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,%s\"}}", 16000, true, 0, 400, "not a PNG or JPEG"},
        {"{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\",\"format\":\"mp3\"}}", 16000, true, 0, 400, "'mp3' is not supported"},
        {"{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\"}}", 16000, true, 100, 413, "more than the limit of 100 bytes"},
        {"{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"**%s\"}}", 16000, true, 0, 400, "invalid base64"},
        {"{\"type\":\"input_audio\",\"input_audio\":\"%s\"}", 16000, true, 0, 400, "expected {\"input_audio\""},
        {"{\"type\":\"input_image\",\"x\":\"%s\"}", 16000, true, 0, 400, "'input_image' are not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char part[1024];
        snprintf(part, sizeof part, cases[i].part, b64);
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":[%s]}]}", part);
        b = json_loads(body, 0, &je);
        srv_media_opts o = {.audio_rate = cases[i].audio_rate, .images = cases[i].images, .lim.max_bytes = cases[i].max_bytes};
        status = 0;
        err[0] = 0;
        ok = srv_media_extract(b, &o, &ml, &status, err, sizeof err);
        th_checks++;
        if (ok || status != cases[i].status || !strstr(err, cases[i].want))
            TH_FAIL("content case %zu: %s, %d '%s', want %d '%s'", i, ok ? "ok" : "refused", status, err,
                    cases[i].status, cases[i].want);
        CHECK(ml.n == 0 && ml.items == NULL);
        json_decref(b);
    }
}
/* ------------------------------------------------------ limits from headers */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* An 8-bit mono WAV of `seconds` at 1000 Hz (1000 bytes a second; decoded at
 * 1000 Hz: nothing to resample, fast under ASan). */
static uint8_t *wav8(int seconds, size_t *len) {
    const uint32_t data = (uint32_t)seconds * 1000, riff = 36 + data, rate = 1000, sixteen = 16;
    const uint16_t one = 1, bits = 8;
    *len = 44 + data;
    uint8_t *w = malloc(*len);
    memcpy(w, "RIFF", 4), memcpy(w + 4, &riff, 4), memcpy(w + 8, "WAVEfmt ", 8), memcpy(w + 16, &sixteen, 4);
    memcpy(w + 20, &one, 2), memcpy(w + 22, &one, 2), memcpy(w + 24, &rate, 4), memcpy(w + 28, &rate, 4);
    memcpy(w + 32, &one, 2), memcpy(w + 34, &bits, 2), memcpy(w + 36, "data", 4), memcpy(w + 40, &data, 4);
    for (uint32_t i = 0; i < data; i++) w[44 + i] = (uint8_t)(128 + (i % 7) * 3);
    return w;
}

/* A FLAC holding only its STREAMINFO: `total` samples at `rate` Hz claimed, no frames. */
static size_t flac_head(uint8_t *f, uint32_t rate, uint64_t total) {
    memset(f, 0, 42);
    memcpy(f, "fLaC", 4);
    f[4] = 0x80, f[7] = 34; /* last block, STREAMINFO, 34 bytes */
    uint8_t *b = f + 8;
    b[0] = 0x10, b[2] = 0x10; /* block sizes 4096 */
    uint8_t *r = b + 10;
    r[0] = (uint8_t)(rate >> 12), r[1] = (uint8_t)(rate >> 4), r[2] = (uint8_t)((rate & 15) << 4 | 0 << 1 | 0);
    r[3] = (uint8_t)(15 << 4 | (total >> 32 & 15)); /* 16 bits a sample */
    r[4] = (uint8_t)(total >> 24), r[5] = (uint8_t)(total >> 16), r[6] = (uint8_t)(total >> 8), r[7] = (uint8_t)total;
    return 42;
}

/* A PNG signature and IHDR of w x h (8-bit RGB), no image data. */
static size_t png_head(uint8_t *p, uint32_t w, uint32_t h) {
    static const uint8_t sig[16] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10, 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
    memcpy(p, sig, 16);
    for (int i = 0; i < 4; i++) p[16 + i] = (uint8_t)(w >> (24 - 8 * i)), p[20 + i] = (uint8_t)(h >> (24 - 8 * i));
    p[24] = 8, p[25] = 2, p[26] = p[27] = p[28] = 0;
    memset(p + 29, 0, 4); /* (no valid CRC: only the header is read) */
    return 33;
}

/* A JPEG's SOI, an APP0 and a baseline SOF of w x h, no scan. */
static size_t jpeg_head(uint8_t *j, int w, int h) {
    static const uint8_t app0[20] = {0xff, 0xd8, 0xff, 0xe0, 0, 16, 'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0};
    memcpy(j, app0, 20);
    uint8_t sof[19] = {0xff, 0xc0, 0, 17, 8, (uint8_t)(h >> 8), (uint8_t)h, (uint8_t)(w >> 8), (uint8_t)w, 3,
                       1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1};
    memcpy(j + 20, sof, 19);
    return 39;
}

/* body.messages[0].content: n parts of one file each. */
static json_t *media_body(bool audio, uint8_t *const *files, const size_t *lens, int n) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        char *e = malloc(lens[i] / 3 * 4 + 8 + 32);
        const size_t off = audio ? 0 : (size_t)sprintf(e, "data:image/png;base64,");
        b64_encode(files[i], lens[i], e + off, true);
        json_array_append_new(content, audio ? json_pack("{s:s,s:{s:s}}", "type", "input_audio", "input_audio", "data", e)
                                             : json_pack("{s:s,s:{s:s}}", "type", "image_url", "image_url", "url", e));
        free(e);
    }
    return json_pack("{s:[{s:s,s:o}]}", "messages", "role", "user", "content", content);
}

static int64_t fake_rows(const pkv_media *m, void *ud) {
    (void)ud; /* 10 rows a second of audio, 256 an image */
    return m->kind == PKV_MEDIA_AUDIO ? m->n_samples / m->rate * 10 : 256;
}

/* One extraction that must be refused with status and want in the message, in
 * under max_s seconds. */
static void refused(const char *what, json_t *b, const srv_media_opts *o, int status, const char *want, double max_s) {
    srv_media_list ml;
    int st = 0;
    char err[600] = "";
    const double t0 = now_s();
    bool ok = srv_media_extract(b, o, &ml, &st, err, sizeof err);
    const double dt = now_s() - t0;
    th_checks++;
    if (ok || st != status || !strstr(err, want))
        TH_FAIL("%s: %s, %d '%s', want %d '%s'", what, ok ? "accepted" : "refused", st, err, status, want);
    th_checks++;
    if (dt > max_s) TH_FAIL("%s: refused after %.3f s (more than %.1f s: decoded?)", what, dt, max_s);
    if (ok) srv_media_list_free(&ml);
    CHECK(ml.n == 0 && ml.items == NULL);
    json_decref(b);
}

static void test_limits(void) {
    uint8_t *files[17];
    size_t lens[17];
    const srv_media_opts au = {.audio_rate = 16000}, img = {.images = true};
    /* 17 media: refused before any is read (the first is no audio file at all) */
    for (int i = 0; i < 17; i++) files[i] = (uint8_t *)"not audio", lens[i] = 9;
    refused("17 media", media_body(true, files, lens, 17), &au, 400, "more than 16 media", 0.5);
    /* three WAVs of 700 s: 2100 s over the request's 1800 (the default), from their headers */
    size_t wl;
    uint8_t *w = wav8(700, &wl);
    for (int i = 0; i < 3; i++) files[i] = w, lens[i] = wl;
    refused("2100 s of WAV", media_body(true, files, lens, 3), &au, 400, "(--max-request-audio-seconds)", 0.5);
    free(w);
    w = wav8(70, &wl);
    for (int i = 0; i < 3; i++) files[i] = w, lens[i] = wl;
    srv_media_opts o = au;
    o.audio_rate = 1000;
    o.max_request_audio_seconds = 100;
    refused("140 s of WAV", media_body(true, files, lens, 2), &o, 400, "limit of 100 s per request", 0.5);
    o.max_request_audio_seconds = 140;
    { /* within the budget (to the second): decoded */
        srv_media_list ml;
        int st = 0;
        char err[600] = "";
        json_t *b = media_body(true, files, lens, 2);
        th_checks++;
        if (!srv_media_extract(b, &o, &ml, &st, err, sizeof err)) TH_FAIL("140 s of 140: %d %s", st, err);
        else CHECK(ml.n == 2 && ml.items[1].m.n_samples == 70 * 1000 && !ml.items[1].raw);
        srv_media_list_free(&ml);
        json_decref(b);
    }
    free(w);
    /* FLAC: STREAMINFO's length; two of 30 minutes at 16 kHz, one of 30 minutes over a per-medium 600 */
    uint8_t fl[42];
    flac_head(fl, 16000, 1800ull * 16000);
    files[0] = files[1] = fl, lens[0] = lens[1] = 42;
    refused("two 30-minute FLACs", media_body(true, files, lens, 2), &au, 400, "3600.0 s", 0.5);
    o = au;
    o.lim.max_audio_seconds = 600;
    refused("a 30-minute FLAC over 600 s", media_body(true, files, lens, 1), &o, 400, "(--max-audio-seconds)", 0.5);
    /* the context's room from the rows the headers imply: 300 s at 10 rows a second */
    flac_head(fl, 44100, 300ull * 44100);
    o = au;
    o.rows = fake_rows, o.n_ctx = 2048;
    refused("3000 rows in 2048", media_body(true, files, lens, 1), &o, 400, "the context holds 2048", 0.5);
    /* images: 7071 x 7071 (50 megapixels, the per-image limit) three times = over 100 megapixels */
    uint8_t png[33], jpg[39];
    png_head(png, 7071, 7071);
    for (int i = 0; i < 16; i++) files[i] = png, lens[i] = 33;
    refused("16 PNGs of 50 MP", media_body(false, files, lens, 16), &img, 400, "(--max-request-pixels)", 0.5);
    png_head(png, 8000, 8000);
    refused("a PNG of 64 MP", media_body(false, files, lens, 1), &img, 400, "(--max-image-pixels)", 0.5);
    jpeg_head(jpg, 7071, 7071);
    for (int i = 0; i < 3; i++) files[i] = jpg, lens[i] = 39;
    refused("3 JPEGs of 50 MP", media_body(false, files, lens, 3), &img, 400, "(--max-request-pixels)", 0.5);
    o = img;
    o.max_request_pixels = 1000;
    jpeg_head(jpg, 40, 30);
    refused("a JPEG of 1200 px over 1000", media_body(false, files, lens, 1), &o, 400, "1200 pixels", 0.5);
    /* the probe itself; an Ogg: a first page with the Vorbis identification header
     * (16 kHz), a last page whose granule says 90 s */
    uint8_t ogg[27 + 1 + 30 + 27 + 1 + 1];
    memset(ogg, 0, sizeof ogg);
    memcpy(ogg, "OggS", 4), ogg[5] = 2, ogg[26] = 1, ogg[27] = 30;
    memcpy(ogg + 28, "\x01vorbis", 7), ogg[28 + 11] = 1;
    const uint32_t r16 = 16000;
    memcpy(ogg + 28 + 12, &r16, 4);
    uint8_t *last = ogg + 58;
    memcpy(last, "OggS", 4), last[5] = 4, last[26] = 1, last[27] = 1;
    const uint64_t gran = 90ull * 16000;
    memcpy(last + 6, &gran, 8);
    pkv_media_probe_info pi;
    CHECK(!pkv_media_probe(ogg, sizeof ogg, PKV_MEDIA_AUDIO, &pi) && pi.rate == 16000 && pi.seconds == 90);
    /* every prefix and every byte set to 0x00 or 0xff of each header: no read outside
     * (ASan), a status or a length within what the bytes can say */
    struct {
        const uint8_t *d;
        size_t n;
        pkv_media_kind k;
    } hs[] = {{fl, 42, PKV_MEDIA_AUDIO}, {ogg, sizeof ogg, PKV_MEDIA_AUDIO}, {png, 33, PKV_MEDIA_IMAGE},
              {jpg, 39, PKV_MEDIA_IMAGE}};
    int odd = 0;
    for (size_t h = 0; h < sizeof hs / sizeof hs[0]; h++)
        for (size_t cut = 0; cut <= hs[h].n; cut++)
            for (size_t at = 0; at <= cut; at++)
                for (int v = 0; v < 2; v++) {
                    uint8_t *c = malloc(cut ? cut : 1);
                    memcpy(c, hs[h].d, cut);
                    if (at < cut) c[at] = v ? 0xff : 0x00;
                    if (!pkv_media_probe(c, cut, hs[h].k, &pi))
                        odd += pi.width < 0 || pi.height < 0 || pi.rate < 0 || !(pi.seconds < 1e12);
                    free(c);
                }
    CHECK_INT(odd, 0);
    CHECK(!pkv_media_probe(jpg, 39, PKV_MEDIA_IMAGE, &pi) && pi.width == 40 && pi.height == 30);
    CHECK(!pkv_media_probe(fl, 42, PKV_MEDIA_AUDIO, &pi) && pi.rate == 44100 && pi.seconds == 300);
    CHECK(!pkv_media_probe("xyz", 3, PKV_MEDIA_AUDIO, &pi) && pi.seconds < 0);
}
#endif

int main(void) {
#ifndef PKV_HAVE_SERVER
    return th_skip("built without the server (libmicrohttpd, jansson)");
#else
    pkv_log_set(NULL, NULL, PKV_LOG_NONE);
    test_base64();
    test_data_url();
    test_multipart();
    test_content_parts();
    test_limits();
    return th_done();
#endif
}
