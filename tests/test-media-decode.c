// labels: unit media
/* The media decoders (src/media/decode.c): audio through libsndfile + soxr, images
 * through libspng + libjpeg-turbo. Every file is written here, in memory, by the
 * same libraries' encoders from known samples and pixels, and the decode is checked
 * against them:
 *   - 16-bit PCM WAV and FLAC decode to exactly v / 32768; stereo to the exact mean
 *     of the two channels; Ogg/Vorbis (decoded by libogg + libvorbis) within a
 *     lossy-codec tolerance (max error 0.05 on a 0.5 sine);
 *   - a 44.1 kHz sine resampled to 16 kHz keeps its frequency and amplitude
 *     (against the analytic sine at 16 kHz: max error < 2e-3 away from the ends);
 *   - PNG in every color type and bit depth (gray 1/2/4/8/16, gray+alpha 8/16,
 *     palette 1/2/4/8 with tRNS, RGB 8/16, RGBA 8/16, interlaced) decodes to the
 *     exact pixels (alpha dropped, 16-bit cut to the high byte, low depths scaled
 *     by bit replication);
 *   - JPEG (baseline, progressive, gray) decodes close to the source (mean absolute
 *     error < 2, max < 24 on a smooth image at quality 95); CMYK is refused;
 * and bad input: every prefix of a WAV, FLAC, PNG and JPEG file, wrong magic, an
 * unsupported sample format, audio longer than the limit (by the header), images
 * with more pixels than the limit (by the header: nothing of that size allocated),
 * NaN samples, failed allocations: the right status, a message naming the problem,
 * nothing leaked. Without the libraries (the ARM cross build) each decoder must
 * return PKV_ERR_UNSUPPORTED naming the missing library. */
#include "testhelp.h"

#ifdef PKV_HAVE_SNDFILE
#include <sndfile.h>
#endif
#ifdef PKV_HAVE_SPNG
#include <spng.h>
#endif
#if defined(PKV_HAVE_VORBIS) && defined(PKV_HAVE_OGG)
#include <ogg/ogg.h>
#endif
#ifdef PKV_HAVE_JPEG
#include <jpeglib.h>
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

static uint64_t g_seed = 12345;

/* ------------------------------------------------------------------ writers */

typedef struct membuf {
    uint8_t *d;
    size_t n, cap, pos;
} membuf;

static void mb_put(membuf *m, const void *p, size_t k) {
    if (m->pos + k > m->cap) {
        size_t c = (m->pos + k) * 2;
        m->d = realloc(m->d, c);
        m->cap = c;
    }
    memcpy(m->d + m->pos, p, k);
    m->pos += k;
    if (m->pos > m->n) m->n = m->pos;
}

#ifdef PKV_HAVE_SNDFILE
static sf_count_t w_len(void *u) { return (sf_count_t)((membuf *)u)->n; }
static sf_count_t w_seek(sf_count_t off, int wh, void *u) {
    membuf *m = u;
    sf_count_t b = wh == SEEK_SET ? 0 : wh == SEEK_CUR ? (sf_count_t)m->pos : (sf_count_t)m->n;
    if (b + off < 0) return -1;
    m->pos = (size_t)(b + off);
    return (sf_count_t)m->pos;
}
static sf_count_t w_read(void *p, sf_count_t c, void *u) {
    membuf *m = u;
    if (m->pos >= m->n) return 0;
    size_t k = m->n - m->pos < (size_t)c ? m->n - m->pos : (size_t)c;
    memcpy(p, m->d + m->pos, k);
    m->pos += k;
    return (sf_count_t)k;
}
static sf_count_t w_write(const void *p, sf_count_t c, void *u) {
    membuf *m = u;
    if (m->pos > m->n) { /* a seek past the end: zero the gap */
        size_t gap = m->pos - m->n, at = m->pos;
        m->pos = m->n;
        uint8_t z[256] = {0};
        while (gap) {
            size_t k = gap < sizeof z ? gap : sizeof z;
            mb_put(m, z, k);
            gap -= k;
        }
        m->pos = at;
    }
    mb_put(m, p, (size_t)c);
    return c;
}
static sf_count_t w_tell(void *u) { return (sf_count_t)((membuf *)u)->pos; }

/* An audio file of `frames` frames (interleaved `ch` channels) in `format`: either
 * 16-bit samples (i16) or floats (f32). */
static membuf write_audio(int format, int rate, int ch, int64_t frames, const int16_t *i16, const float *f32) {
    membuf m = {0};
    SF_VIRTUAL_IO vio = {w_len, w_seek, w_read, w_write, w_tell};
    SF_INFO info = {.samplerate = rate, .channels = ch, .format = format};
    SNDFILE *sf = sf_open_virtual(&vio, SFM_WRITE, &info, &m);
    if (!sf) {
        TH_FAIL("sf_open_virtual(write 0x%x): %s", format, sf_strerror(NULL));
        return m;
    }
    sf_count_t w = i16 ? sf_writef_short(sf, i16, frames) : sf_writef_float(sf, f32, frames);
    if (w != frames) TH_FAIL("sf_writef wrote %lld of %lld frames", (long long)w, (long long)frames);
    sf_close(sf);
    return m;
}
#endif

/* ------------------------------------------------------------------ audio: no library */

/* A 44-byte header of a 16-bit mono 16 kHz WAV with n samples after it. */
static size_t wav16_by_hand(uint8_t *out, const int16_t *s, int n) {
    uint32_t data = (uint32_t)n * 2;
    uint8_t h[44] = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'A', 'V', 'E', 'f', 'm', 't', ' ', 16, 0, 0, 0, 1, 0, 1, 0,
                     0x80, 0x3e, 0, 0, 0, 0x7d, 0, 0, 2, 0, 16, 0, 'd', 'a', 't', 'a'};
    uint32_t riff = 36 + data;
    memcpy(h + 4, &riff, 4);
    memcpy(h + 40, &data, 4);
    memcpy(out, h, 44);
    memcpy(out + 44, s, data);
    return 44 + data;
}

static void test_audio_common(void) {
    float *s = (float *)1;
    int64_t n = 5;
    CHECK_STATUS(pkv_audio_decode("hello world!", 12, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
    CHECK_MSG("not a WAV, FLAC or Ogg file");
    CHECK(s == NULL && n == 0);
    CHECK_STATUS(pkv_audio_decode(NULL, 0, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
    CHECK_MSG("0 bytes");
    uint8_t wav[44 + 8];
    int16_t smp[4] = {1, 2, 3, 4};
    size_t wn = wav16_by_hand(wav, smp, 4);
    CHECK_STATUS(pkv_audio_decode(wav, wn, 0, NULL, &s, &n), PKV_ERR_INVALID);
    CHECK_MSG("rate");
    CHECK_STATUS(pkv_audio_decode(wav, wn, 16000, NULL, NULL, &n), PKV_ERR_INVALID);
    pkv_media_limits lim = {.max_bytes = 40};
    CHECK_STATUS(pkv_audio_decode(wav, wn, 16000, &lim, &s, &n), PKV_ERR_INVALID);
    CHECK_MSG("too large");
    /* the data chunk says more than the file holds */
    CHECK_STATUS(pkv_audio_decode(wav, wn - 1, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
    CHECK_MSG("truncated WAV");
#ifndef PKV_HAVE_SNDFILE
    CHECK_STATUS(pkv_audio_decode(wav, wn, 16000, NULL, &s, &n), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("libsndfile");
#endif
}

#ifdef PKV_HAVE_SNDFILE
/* Decode expecting success with exactly want[] (n samples). */
static void check_exact(const membuf *m, int rate, const float *want, int64_t nw, const char *what) {
    float *s = NULL;
    int64_t n = 0;
    int64_t live = pkv_alloc_live();
    pkv_status st = pkv_audio_decode(m->d, m->n, rate, NULL, &s, &n);
    th_checks++;
    if (st) {
        TH_FAIL("%s: %s: %s", what, pkv_status_str(st), pkv_errmsg());
        return;
    }
    CHECK_INT(n, nw);
    int64_t bad = 0;
    for (int64_t i = 0; i < n && i < nw; i++) bad += s[i] != want[i];
    th_checks++;
    if (bad) TH_FAIL("%s: %lld samples differ", what, (long long)bad);
    pkv_media_free(s);
    CHECK_INT(pkv_alloc_live(), live);
}

static void test_audio_exact(void) {
    enum { N = 4000 };
    int16_t *mono = malloc(N * 2), *st = malloc(N * 4);
    float *want = malloc(N * 4), *want_st = malloc(N * 4);
    for (int i = 0; i < N; i++) {
        mono[i] = (int16_t)(th_rand(&g_seed) & 0xffff);
        st[2 * i] = (int16_t)(th_rand(&g_seed) & 0xffff);
        st[2 * i + 1] = (int16_t)(th_rand(&g_seed) & 0xffff);
    }
    mono[0] = -32768, mono[1] = 32767, mono[2] = 0, mono[3] = -1;
    for (int i = 0; i < N; i++) {
        want[i] = mono[i] / 32768.0f;
        want_st[i] = (st[2 * i] / 32768.0f + st[2 * i + 1] / 32768.0f) * 0.5f;
    }
    membuf m = write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, N, mono, NULL);
    check_exact(&m, 16000, want, N, "16-bit mono WAV");
    /* and every prefix of it is refused (header prefixes by the magic or libsndfile,
     * data prefixes by the data chunk's size), never decoded short */
    int bad = 0;
    for (size_t k = 0; k < m.n; k += k < 64 ? 1 : 997) {
        float *s = NULL;
        int64_t n = 0;
        pkv_status r = pkv_audio_decode(m.d, k, 16000, NULL, &s, &n);
        if (r != PKV_ERR_FORMAT || s) {
            if (!bad++) TH_FAIL("WAV prefix of %zu bytes: %s (%s)", k, pkv_status_str(r), pkv_errmsg());
        }
        pkv_media_free(s);
    }
    th_checks++;
    free(m.d);
    m = write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 2, N, st, NULL);
    check_exact(&m, 16000, want_st, N, "16-bit stereo WAV, channels averaged");
    free(m.d);
    m = write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, N, mono, NULL);
    check_exact(&m, 16000, want, N, "16-bit FLAC");
    bad = 0;
    for (size_t k = 0; k < m.n; k += k < 128 ? 1 : 61) {
        float *s = NULL;
        int64_t n = 0;
        pkv_status r = pkv_audio_decode(m.d, k, 16000, NULL, &s, &n);
        if (r != PKV_ERR_FORMAT || s) {
            if (!bad++) TH_FAIL("FLAC prefix of %zu bytes: %s (%s)", k, pkv_status_str(r), pkv_errmsg());
        }
        pkv_media_free(s);
    }
    th_checks++;
    free(m.d);
    m = write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, N, NULL, want);
    check_exact(&m, 16000, want, N, "float WAV");
    free(m.d);
    free(mono), free(st), free(want), free(want_st);
}

/* Amplitude and frequency of s[lo, hi) against a*sin(2 pi f i / rate): the max
 * error against that sine. */
static double sine_err(const float *s, int64_t lo, int64_t hi, double a, double f, int rate) {
    double e = 0;
    for (int64_t i = lo; i < hi; i++) {
        double d = fabs(s[i] - a * sin(2 * M_PI * f * (double)i / rate));
        if (d > e) e = d;
    }
    return e;
}

static void test_audio_resample_and_lossy(void) {
    /* 1 kHz at amplitude 0.5, 1 s at 44.1 kHz, float WAV -> 16 kHz */
    const int R = 44100;
    float *x = malloc(R * sizeof(float));
    for (int i = 0; i < R; i++) x[i] = (float)(0.5 * sin(2 * M_PI * 1000.0 * i / R));
    membuf m = write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, R, 1, R, NULL, x);
    float *s = NULL;
    int64_t n = 0;
    CHECK_OK(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n));
    CHECK_INT(n, 16000);
    if (s && n == 16000) {
        /* away from the ends (the filter's ramp in and out): the analytic sine at
         * 16 kHz, same phase (soxr compensates its delay), within 2e-3 */
        double e = sine_err(s, 200, n - 200, 0.5, 1000.0, 16000);
        CHECK(e < 2e-3);
        if (e >= 2e-3) fprintf(stderr, "resampled sine: max error %g\n", e);
        /* a sine at another frequency is far off (the check can fail) */
        CHECK(sine_err(s, 200, n - 200, 0.5, 1010.0, 16000) > 0.1);
    }
    pkv_media_free(s);
    free(m.d);
    /* the same at 16 kHz in, stereo 16-bit at 48 kHz: another rate pair */
    int16_t *st = malloc(48000 * 4);
    for (int i = 0; i < 48000; i++) st[2 * i] = st[2 * i + 1] = (int16_t)lrint(16384 * sin(2 * M_PI * 440.0 * i / 48000));
    m = write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 48000, 2, 48000, st, NULL);
    CHECK_OK(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n));
    CHECK_INT(n, 16000);
    if (s && n == 16000) CHECK(sine_err(s, 200, n - 200, 0.5, 440.0, 16000) < 2e-3);
    pkv_media_free(s);
    free(m.d);
    free(st);

    /* Ogg/Vorbis (lossy): 440 Hz at 0.5, 16 kHz, 1 s: same length; within 0.05 of
     * the sine away from the ends (Vorbis at its default quality) */
    float *y = malloc(16000 * sizeof(float));
    for (int i = 0; i < 16000; i++) y[i] = (float)(0.5 * sin(2 * M_PI * 440.0 * i / 16000));
    m = write_audio(SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, 16000, NULL, y);
    CHECK_OK(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n));
    CHECK_INT(n, 16000);
    if (s && n == 16000) {
        double e = sine_err(s, 500, n - 500, 0.5, 440.0, 16000);
        CHECK(e < 0.05);
        if (e >= 0.05) fprintf(stderr, "vorbis sine: max error %g\n", e);
    }
    pkv_media_free(s);
    /* prefixes of an Ogg file: either refused or decoded (shorter: Ogg pages carry
     * their own length, so a cut at a page boundary is a valid shorter stream);
     * never a crash, never longer */
    int bad = 0;
    for (size_t k = 0; k < m.n; k += 37) {
        float *t = NULL;
        int64_t nt = 0;
        pkv_status r = pkv_audio_decode(m.d, k, 16000, NULL, &t, &nt);
        if ((r == PKV_OK && (nt <= 0 || nt > 16000 || !t)) || (r != PKV_OK && r != PKV_ERR_FORMAT)) {
            if (!bad++) TH_FAIL("Ogg prefix of %zu bytes: %s, %lld samples (%s)", k, pkv_status_str(r), (long long)nt, pkv_errmsg());
        }
        pkv_media_free(t);
    }
    th_checks++;
    /* whole-file variants: the same stream twice (chained) and junk after the end
     * of the stream are refused; a good first header followed by a malformed
     * second one, its page checksum made valid so the codec reads it (fuzz-audio
     * found libsndfile 1.2.0 and libvorbisfile 1.3.7 leaking on malformed Ogg
     * files: Ogg is now read with libogg + libvorbis; ASan's leak check, in make
     * test-asan, covers these refusals) */
    {
        membuf c = {malloc(2 * m.n), 2 * m.n, 2 * m.n, 0};
        memcpy(c.d, m.d, m.n);
        memcpy(c.d + m.n, m.d, m.n);
        CHECK_STATUS(pkv_audio_decode(c.d, c.n, 16000, NULL, &s, &n), PKV_ERR_UNSUPPORTED);
        CHECK_MSG("more than one logical stream");
        memcpy(c.d + m.n, "junk", 4);
        CHECK_STATUS(pkv_audio_decode(c.d, m.n + 4, 16000, NULL, &s, &n), PKV_ERR_UNSUPPORTED);
        CHECK_MSG("follow the Ogg stream's end");
        memcpy(c.d, m.d, m.n);
        size_t at = 0;
        for (size_t i = 0; i + 11 < c.n && !at; i++)
            if (!memcmp(c.d + i, "\x03vorbis", 7)) at = i;
        CHECK(at > 0);
        size_t pg = at;
        while (pg > 0 && memcmp(c.d + pg, "OggS", 4)) pg--;
        if (at > 0 && !memcmp(c.d + pg, "OggS", 4)) {
            c.d[at + 7] = 0xff, c.d[at + 8] = 0xff, c.d[at + 9] = 0xff, c.d[at + 10] = 0x7f; /* vendor length */
            ogg_page og;
            og.header = c.d + pg;
            og.header_len = 27 + c.d[pg + 26];
            og.body = og.header + og.header_len;
            og.body_len = 0;
            for (int k = 0; k < c.d[pg + 26]; k++) og.body_len += c.d[pg + 27 + k];
            ogg_page_checksum_set(&og);
            CHECK_STATUS(pkv_audio_decode(c.d, m.n, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
            CHECK_MSG("malformed Vorbis header (packet 1)");
            CHECK(s == NULL && n == 0);
        }
        free(c.d);
    }
    /* a corrupted header page: its checksum fails */
    for (size_t i = 0; i + 7 < m.n; i++)
        if (!memcmp(m.d + i, "\x05vorbis", 7)) {
            m.d[i + 20] ^= 0x5a;
            break;
        }
    CHECK_STATUS(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
    CHECK_MSG("Ogg: a corrupt page");
    memcpy(m.d, "OggS\0\0\0\0", 8); /* a page header wrecked */
    CHECK_STATUS(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
    free(m.d);
    free(x), free(y);
}

static void test_audio_bad(void) {
    float *s = NULL;
    int64_t n = 0;
    int16_t z[3200] = {0};
    /* too long, by the header: 2 s against a 1 s limit */
    membuf m = write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1600, 1, 3200, z, NULL);
    pkv_media_limits lim = {.max_audio_seconds = 1.0};
    CHECK_STATUS(pkv_audio_decode(m.d, m.n, 1600 * 10, &lim, &s, &n), PKV_ERR_INVALID);
    CHECK_MSG("audio too long: 2.0 s");
    CHECK_MSG("limit of 1 s");
    lim.max_audio_seconds = 2.5;
    CHECK_OK(pkv_audio_decode(m.d, m.n, 1600, &lim, &s, &n));
    CHECK_INT(n, 3200);
    pkv_media_free(s);
    free(m.d);
    /* a header that claims 10 hours of FLAC in a tiny file: refused before any
     * allocation of that size */
    m = write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, 3200, z, NULL);
    /* STREAMINFO's total samples: 36 bits ending 18 bytes into the block (bytes 8+ of the file) */
    uint64_t total = 16000ull * 36000;
    uint8_t *si = m.d + 8;
    si[13] = (uint8_t)((si[13] & 0xf0) | ((total >> 32) & 0x0f));
    si[14] = (uint8_t)(total >> 24), si[15] = (uint8_t)(total >> 16), si[16] = (uint8_t)(total >> 8), si[17] = (uint8_t)total;
    CHECK_STATUS(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n), PKV_ERR_INVALID);
    CHECK_MSG("audio too long: 36000.0 s");
    free(m.d);
    /* an unsupported sample format that libsndfile itself could read */
    m = write_audio(SF_FORMAT_WAV | SF_FORMAT_IMA_ADPCM, 16000, 1, 3200, z, NULL);
    CHECK_STATUS(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("unsupported sample format: IMA ADPCM in WAV");
    free(m.d);
    /* a format tag nobody knows */
    uint8_t wav[44 + 8];
    int16_t four[4] = {1, 2, 3, 4};
    size_t wn = wav16_by_hand(wav, four, 4);
    CHECK_OK(pkv_audio_decode(wav, wn, 16000, NULL, &s, &n));
    CHECK_INT(n, 4);
    if (s && n == 4) CHECK(s[3] == 4 / 32768.0f);
    pkv_media_free(s);
    wav[20] = 0x34, wav[21] = 0x12;
    CHECK_STATUS(pkv_audio_decode(wav, wn, 16000, NULL, &s, &n), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("unsupported sample format 0x1234 in WAV");
    /* the chunk structure (wav_parse; libsndfile is shown only a canonical header
     * and the data): fuzz-audio found libsndfile reading on for minutes past the
     * end of small files whose chunks, or chunks inside a LIST, claimed 4 GB.
     * Chunks before the data are walked (ids four printable characters, each inside
     * the file, odd sizes followed by their pad byte); what follows the data is not
     * read; a malformed chunk before the data is refused. */
    {
        uint8_t w[128];
        wav[20] = 1, wav[21] = 0; /* PCM again */
        memcpy(w, wav, wn);
        memcpy(w + wn, "LIST\4\0\0\0INFO", 12);
        CHECK_OK(pkv_audio_decode(w, wn + 12, 16000, NULL, &s, &n));
        CHECK_INT(n, 4);
        pkv_media_free(s);
        w[wn + 7] = 0xff; /* LIST of 0xff000004 bytes, after the data: not read */
        CHECK_OK(pkv_audio_decode(w, wn + 12, 16000, NULL, &s, &n));
        CHECK_INT(n, 4);
        pkv_media_free(s);
        /* before the data: refused */
        memcpy(w, wav, 36);
        memcpy(w + 36, "LIST\4\0\0\xffINFO", 12);
        memcpy(w + 48, wav + 36, wn - 36);
        CHECK_STATUS(pkv_audio_decode(w, wn + 12, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
        CHECK_MSG("malformed WAV: its \"LIST\" chunk at byte 36 claims 4278190084 bytes");
        CHECK(s == NULL && n == 0);
        /* the fuzzer's (CI's) file: a 16-byte LIST whose sub-chunks claim 4 GB, before
         * fmt: libsndfile never sees it */
        memcpy(w, wav, 12);
        memcpy(w + 12, "LIST\x10\0\0\0\0\x01\x00\x30\x2b\xf7\xff\xff\xff\x08\x00\x61\x74\0\0\0", 24);
        memcpy(w + 36, wav + 12, wn - 12);
        CHECK_OK(pkv_audio_decode(w, wn + 24, 16000, NULL, &s, &n));
        CHECK_INT(n, 4);
        if (s && n == 4) CHECK(s[3] == 4 / 32768.0f);
        pkv_media_free(s);
        CHECK_STATUS(pkv_audio_decode(w, 38, 16000, NULL, &s, &n), PKV_ERR_FORMAT); /* and nothing else */
        CHECK_MSG("malformed WAV: no fmt chunk");
        /* a block align that does not match the channels and sample size */
        memcpy(w, wav, wn);
        w[32] = 3;
        CHECK_STATUS(pkv_audio_decode(w, wn, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
        CHECK_MSG("a block of 3 bytes for 1 channels of 16 bits");
        /* "junk" of 3 bytes between fmt and data, padded and not */
        for (int pad = 0; pad < 2; pad++) {
            memcpy(w, wav, 36);
            memcpy(w + 36, "junk\3\0\0\0abc", 11);
            size_t o = 47;
            if (pad) w[o++] = 0;
            memcpy(w + o, wav + 36, wn - 36);
            if (pad) {
                CHECK_OK(pkv_audio_decode(w, o + wn - 36, 16000, NULL, &s, &n));
                CHECK_INT(n, 4);
                pkv_media_free(s);
            } else {
                CHECK_STATUS(pkv_audio_decode(w, o + wn - 36, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
                CHECK_MSG("malformed WAV: no chunk id at byte 48");
            }
        }
        /* RF64 (libsndfile writes it): decoded; its ds64 data size is checked like a
         * data chunk's (fuzz-audio: 4 GB claimed, libsndfile read on past the end) */
        membuf r = write_audio(SF_FORMAT_RF64 | SF_FORMAT_PCM_16, 16000, 1, 4, four, NULL);
        CHECK(r.n > 48 && !memcmp(r.d, "RF64", 4) && !memcmp(r.d + 12, "ds64", 4));
        if (r.n > 48 && !memcmp(r.d + 12, "ds64", 4)) {
            CHECK_OK(pkv_audio_decode(r.d, r.n, 16000, NULL, &s, &n));
            CHECK_INT(n, 4);
            if (s && n == 4) CHECK(s[3] == 4 / 32768.0f);
            pkv_media_free(s);
            /* every data chunk of this file says 0xffffffff: the ds64 size counts */
            uint8_t *dc = NULL;
            for (size_t i = 12; i + 8 <= r.n && !dc; i++)
                if (!memcmp(r.d + i, "data", 4)) dc = r.d + i;
            CHECK(dc && !memcmp(dc + 4, "\xff\xff\xff\xff", 4));
            if (dc && !memcmp(dc + 4, "\xff\xff\xff\xff", 4)) {
                r.d[12 + 8 + 8 + 4] = 1; /* ds64's data size + 4 GB */
                CHECK_STATUS(pkv_audio_decode(r.d, r.n, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
                CHECK_MSG("truncated RF64 WAV: its ds64 chunk says 4294967304 bytes of data");
            }
            memcpy(r.d + 12, "junk", 4);
            CHECK_STATUS(pkv_audio_decode(r.d, r.n, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
            CHECK_MSG("no complete ds64 chunk");
        }
        free(r.d);
        /* a streaming writer's data size (0 or 0xffffffff): the data runs to the end
         * of the file, whatever its bytes look like (fuzz-audio: libsndfile parsed
         * such audio bytes as chunks, a 4 GB "LIST" among them) */
        for (int ff = 0; ff < 2; ff++) {
            memcpy(w, wav, wn);
            memset(w + 40, ff ? 0xff : 0, 4);
            CHECK_OK(pkv_audio_decode(w, wn, 16000, NULL, &s, &n));
            CHECK_INT(n, 4);
            if (s && n == 4) CHECK(s[3] == 4 / 32768.0f);
            pkv_media_free(s);
            memcpy(w + wn, "dataLIST\xff\xff\xff\xff\xff", 13); /* 6 more samples */
            CHECK_OK(pkv_audio_decode(w, wn + 12, 16000, NULL, &s, &n));
            CHECK_INT(n, 10);
            pkv_media_free(s);
            /* the fuzzer's file: audio bytes that read as a "data" and a 4 GB "LIST"
             * chunk, and an odd number of them (libsndfile, told the data's size,
             * seeks past the end of the file for the pad byte: a seek the virtual
             * file must take, or libsndfile walks the audio as chunks for minutes) */
            memcpy(w + 44, "data\xff\xff\xff\xffLIST\x6d\xf2\x80\x00", 16);
            memset(w + 60, 0xff, 19);
            CHECK_OK(pkv_audio_decode(w, 79, 16000, NULL, &s, &n));
            CHECK_INT(n, 17);
            pkv_media_free(s);
        }
        /* the fuzzer's file, rebuilt: a misaligned id after the fmt chunk */
        memcpy(w, wav, 36);
        memcpy(w + 36, "\xffLIST\0\0\0\xff", 9);
        memset(w + 45, 0xff, 60);
        CHECK_STATUS(pkv_audio_decode(w, 105, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
        CHECK_MSG("malformed WAV: no chunk id at byte 36");
    }
    /* float samples that are not numbers */
    float nan4[4] = {0, NAN, 0, 0};
    m = write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, 4, NULL, nan4);
    CHECK_STATUS(pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n), PKV_ERR_FORMAT);
    CHECK_MSG("sample 1 is not a finite number");
    free(m.d);
    /* allocation failures: NOMEM or success, nothing leaked */
    int16_t *v = malloc(20000 * 2);
    for (int i = 0; i < 20000; i++) v[i] = (int16_t)(i * 7);
    m = write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 22050, 1, 20000, v, NULL);
    int64_t live = pkv_alloc_live();
    for (uint64_t k = 1; k < 8; k++) {
        pkv_alloc_fail_at(k);
        pkv_status r = pkv_audio_decode(m.d, m.n, 16000, NULL, &s, &n);
        pkv_alloc_fail_at(0);
        CHECK(r == PKV_OK || r == PKV_ERR_NOMEM);
        if (r == PKV_OK) pkv_media_free(s);
        CHECK_INT(pkv_alloc_live(), live);
    }
    free(m.d);
    free(v);
}
#endif

/* ------------------------------------------------------------------ images */

static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void be32(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v; }

/* Set a PNG's IHDR width and height (and its CRC). */
static void png_set_dims(uint8_t *png, uint32_t w, uint32_t h) {
    be32(png + 16, w);
    be32(png + 20, h);
    be32(png + 29, crc32_png(png + 12, 17));
}

static void test_image_common(void) {
    uint8_t *rgb = (uint8_t *)1;
    int w = 1, h = 1;
    CHECK_STATUS(pkv_image_decode("GIF89a....", 10, NULL, &rgb, &w, &h), PKV_ERR_FORMAT);
    CHECK_MSG("not a PNG or JPEG file (10 bytes, starting with 47 49 46 38)");
    CHECK(rgb == NULL && w == 0 && h == 0);
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    for (size_t k = 1; k < 8; k++) {
        CHECK_STATUS(pkv_image_decode(sig, k, NULL, &rgb, &w, &h), PKV_ERR_FORMAT);
        CHECK_MSG("truncated PNG");
    }
    const uint8_t soi[2] = {0xff, 0xd8};
    CHECK_STATUS(pkv_image_decode(soi, 2, NULL, &rgb, &w, &h), PKV_ERR_FORMAT);
    CHECK_MSG("truncated JPEG");
    pkv_media_limits lim = {.max_bytes = 4};
    CHECK_STATUS(pkv_image_decode(sig, 8, &lim, &rgb, &w, &h), PKV_ERR_INVALID);
    CHECK_MSG("too large");
#ifndef PKV_HAVE_SPNG
    uint8_t png[64] = {0};
    memcpy(png, sig, 8);
    CHECK_STATUS(pkv_image_decode(png, sizeof png, NULL, &rgb, &w, &h), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("libspng");
#endif
#ifndef PKV_HAVE_JPEG
    const uint8_t jpg[8] = {0xff, 0xd8, 0xff, 0xe0, 0, 16, 'J', 'F'};
    CHECK_STATUS(pkv_image_decode(jpg, sizeof jpg, NULL, &rgb, &w, &h), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("libjpeg-turbo");
#endif
}

#ifdef PKV_HAVE_SPNG
/* Encode a PNG with libspng from raw PNG-layout rows (host-order 16-bit, packed
 * low depths); palette/trns for indexed. Returns a malloc'd file. */
static uint8_t *png_encode(int ct, int depth, uint32_t w, uint32_t h, const uint8_t *raw, size_t raw_n, int interlace,
                           const struct spng_plte *plte, const struct spng_trns *trns, size_t *len) {
    spng_ctx *c = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(c, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {.width = w, .height = h, .bit_depth = (uint8_t)depth, .color_type = (uint8_t)ct,
                           .interlace_method = (uint8_t)interlace};
    int e = spng_set_ihdr(c, &ih);
    if (!e && plte) e = spng_set_plte(c, (struct spng_plte *)plte);
    if (!e && trns) e = spng_set_trns(c, (struct spng_trns *)trns);
    if (!e) e = spng_encode_image(c, raw, raw_n, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    uint8_t *out = NULL;
    if (!e) out = spng_get_png_buffer(c, len, &e);
    spng_ctx_free(c);
    if (e) {
        TH_FAIL("spng encode (type %d, depth %d, interlace %d): %s", ct, depth, interlace, spng_strerror(e));
        free(out);
        return NULL;
    }
    return out;
}

static int channels_of(int ct) { return ct == 0 ? 1 : ct == 2 ? 3 : ct == 3 ? 1 : ct == 4 ? 2 : 4; }

/* One color type and depth: random samples, the RGB they must decode to. */
static void png_case(int ct, int depth, int interlace) {
    const uint32_t W = 13, H = 7;
    const int ch = channels_of(ct);
    const size_t stride = ((size_t)W * ch * depth + 7) / 8;
    uint8_t *raw = calloc(stride * H, 1), *want = malloc(W * H * 3);
    const int maxv = (1 << depth) - 1;
    struct spng_plte plte = {.n_entries = (uint32_t)(1 << (depth < 8 ? depth : 8))};
    struct spng_trns trns = {.n_type3_entries = plte.n_entries};
    for (uint32_t i = 0; i < plte.n_entries; i++) {
        plte.entries[i].red = (uint8_t)th_rand(&g_seed), plte.entries[i].green = (uint8_t)th_rand(&g_seed);
        plte.entries[i].blue = (uint8_t)th_rand(&g_seed);
        trns.type3_alpha[i] = (uint8_t)th_rand(&g_seed);
    }
    for (uint32_t y = 0; y < H; y++)
        for (uint32_t x = 0; x < W; x++) {
            uint32_t v[4];
            for (int c = 0; c < ch; c++) {
                v[c] = (uint32_t)(th_rand(&g_seed) % (uint64_t)(maxv + 1));
                if (ct == 3 && v[c] >= plte.n_entries) v[c] %= plte.n_entries;
                size_t bit = ((size_t)x * ch + c) * depth;
                uint8_t *row = raw + y * stride;
                if (depth == 16) { /* libspng's SPNG_FMT_PNG takes 16-bit samples in host order */
                    uint16_t u = (uint16_t)v[c];
                    memcpy(row + bit / 8, &u, 2);
                } else {
                    row[bit / 8] |= (uint8_t)(v[c] << (8 - depth - bit % 8));
                }
            }
            uint8_t *o = want + ((size_t)y * W + x) * 3;
            /* to 8 bits: 16-bit keeps its high byte; 1/2/4-bit gray scales up */
            uint8_t e[4];
            for (int c = 0; c < ch; c++) e[c] = depth == 16 ? (uint8_t)(v[c] >> 8) : (uint8_t)(v[c] * 255 / maxv);
            if (ct == 3) {
                o[0] = plte.entries[v[0]].red, o[1] = plte.entries[v[0]].green, o[2] = plte.entries[v[0]].blue;
            } else if (ch <= 2) {
                o[0] = o[1] = o[2] = e[0];
            } else {
                o[0] = e[0], o[1] = e[1], o[2] = e[2];
            }
        }
    size_t n = 0;
    uint8_t *png = png_encode(ct, depth, W, H, raw, stride * H, interlace, ct == 3 ? &plte : NULL,
                              ct == 3 ? &trns : NULL, &n);
    if (png) {
        uint8_t *rgb = NULL;
        int w = 0, h = 0;
        int64_t live = pkv_alloc_live();
        pkv_status st = pkv_image_decode(png, n, NULL, &rgb, &w, &h);
        th_checks++;
        if (st) {
            TH_FAIL("PNG type %d depth %d interlace %d: %s", ct, depth, interlace, pkv_errmsg());
        } else {
            CHECK_INT(w, W);
            CHECK_INT(h, H);
            th_checks++;
            if (memcmp(rgb, want, W * H * 3)) {
                size_t i = 0;
                while (rgb[i] == want[i]) i++;
                TH_FAIL("PNG type %d depth %d interlace %d: byte %zu is %u, want %u", ct, depth, interlace, i, rgb[i],
                        want[i]);
            }
        }
        pkv_media_free(rgb);
        CHECK_INT(pkv_alloc_live(), live);
        free(png);
    }
    free(raw);
    free(want);
}

static void test_png(void) {
    const int gray[] = {1, 2, 4, 8, 16}, idx[] = {1, 2, 4, 8};
    for (int i = 0; i < 5; i++) png_case(0, gray[i], 0);
    for (int i = 0; i < 4; i++) png_case(3, idx[i], 0);
    png_case(4, 8, 0), png_case(4, 16, 0);
    png_case(2, 8, 0), png_case(2, 16, 0);
    png_case(6, 8, 0), png_case(6, 16, 0);
    png_case(2, 8, 1), png_case(0, 2, 1), png_case(6, 16, 1);

    /* bad PNGs, from a good RGB one */
    const uint32_t W = 9, H = 5;
    uint8_t raw[9 * 5 * 3];
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)th_rand(&g_seed);
    size_t n = 0;
    uint8_t *png = png_encode(2, 8, W, H, raw, sizeof raw, 0, NULL, NULL, &n);
    if (!png) return;
    uint8_t *rgb = NULL;
    int w = 0, h = 0;
    int64_t live = pkv_alloc_live();
    /* every prefix is refused as malformed, IEND included */
    int bad = 0;
    for (size_t k = 0; k < n; k++) {
        pkv_status r = pkv_image_decode(png, k, NULL, &rgb, &w, &h);
        if (r != PKV_ERR_FORMAT || rgb) {
            if (!bad++) TH_FAIL("PNG prefix of %zu of %zu bytes: %s (%s)", k, n, pkv_status_str(r), pkv_errmsg());
        }
        if (r == PKV_OK) pkv_media_free(rgb);
        rgb = NULL;
    }
    th_checks++;
    CHECK_STATUS(pkv_image_decode(png, 30, NULL, &rgb, &w, &h), PKV_ERR_FORMAT);
    CHECK_MSG("truncated PNG (30 bytes)");
    /* too many pixels, by the limit and by a header that claims 60000 x 60000 */
    pkv_media_limits lim = {.max_pixels = 44};
    CHECK_STATUS(pkv_image_decode(png, n, &lim, &rgb, &w, &h), PKV_ERR_INVALID);
    CHECK_MSG("image too large: PNG of 9 x 5 = 45 pixels exceeds the limit of 44 pixels");
    lim.max_pixels = 45;
    CHECK_OK(pkv_image_decode(png, n, &lim, &rgb, &w, &h));
    if (rgb) CHECK_MEM(rgb, raw, sizeof raw);
    pkv_media_free(rgb);
    uint8_t *big = malloc(n);
    memcpy(big, png, n);
    png_set_dims(big, 60000, 60000);
    CHECK_STATUS(pkv_image_decode(big, n, NULL, &rgb, &w, &h), PKV_ERR_INVALID);
    CHECK_MSG("60000 x 60000 = 3600000000 pixels exceeds the limit of 50000000");
    /* a bad CRC and a corrupted image stream */
    memcpy(big, png, n);
    big[17] ^= 1;
    CHECK_STATUS(pkv_image_decode(big, n, NULL, &rgb, &w, &h), PKV_ERR_FORMAT);
    CHECK_MSG("malformed PNG");
    memcpy(big, png, n);
    big[n - 20] ^= 0x55; /* inside IDAT's zlib stream */
    CHECK(pkv_image_decode(big, n, NULL, &rgb, &w, &h) == PKV_ERR_FORMAT);
    CHECK(rgb == NULL);
    /* allocation failures inside libspng (it allocates through pagekv's hooks) */
    for (uint64_t k = 1; k < 16; k++) {
        pkv_alloc_fail_at(k);
        pkv_status r = pkv_image_decode(png, n, NULL, &rgb, &w, &h);
        pkv_alloc_fail_at(0);
        th_checks++;
        if (r != PKV_OK && r != PKV_ERR_NOMEM) TH_FAIL("PNG, allocation %d failing: %s", (int)k, pkv_errmsg());
        if (r == PKV_OK) pkv_media_free(rgb);
        rgb = NULL;
    }
    CHECK_INT(pkv_alloc_live(), live);
    free(big);
    free(png);
}
#endif

#ifdef PKV_HAVE_JPEG
/* JPEG from w x h pixels of `comp` components in color space cs. */
static uint8_t *jpeg_encode(const uint8_t *px, int w, int h, int comp, J_COLOR_SPACE cs, bool progressive,
                            size_t *len) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    unsigned char *buf = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &buf, &n);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h;
    c.input_components = comp;
    c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)c.next_scanline * w * comp);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    *len = n;
    return buf;
}

static void jpeg_close(const uint8_t *src, int comp, const uint8_t *jpg, size_t n, int W, int H, const char *what) {
    uint8_t *rgb = NULL;
    int w = 0, h = 0;
    pkv_status st = pkv_image_decode(jpg, n, NULL, &rgb, &w, &h);
    th_checks++;
    if (st) {
        TH_FAIL("%s: %s", what, pkv_errmsg());
        return;
    }
    CHECK_INT(w, W);
    CHECK_INT(h, H);
    double sum = 0;
    int mx = 0;
    for (int i = 0; i < W * H; i++)
        for (int c = 0; c < 3; c++) {
            int d = abs((int)rgb[i * 3 + c] - (int)src[i * comp + (comp == 1 ? 0 : c)]);
            sum += d;
            if (d > mx) mx = d;
        }
    double mae = sum / (W * H * 3);
    if (comp == 1)
        for (int i = 0; i < W * H; i++) CHECK(rgb[i * 3] == rgb[i * 3 + 1] && rgb[i * 3] == rgb[i * 3 + 2]);
    th_checks++;
    if (!(mae < 2.0 && mx < 24)) TH_FAIL("%s: mean abs error %.3f (< 2), max %d (< 24)", what, mae, mx);
    pkv_media_free(rgb);
}

static void test_jpeg(void) {
    const int W = 45, H = 31;
    uint8_t *px = malloc(W * H * 4), *gray = malloc(W * H);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *p = px + (y * W + x) * 3;
            p[0] = (uint8_t)(40 + 4 * x), p[1] = (uint8_t)(30 + 5 * y), p[2] = (uint8_t)(128 + 60 * sin(x * 0.2 + y * 0.1));
            gray[y * W + x] = (uint8_t)(20 + 3 * x + 2 * y);
        }
    size_t n = 0;
    uint8_t *j = jpeg_encode(px, W, H, 3, JCS_RGB, false, &n);
    jpeg_close(px, 3, j, n, W, H, "baseline JPEG");
    uint8_t *jp = NULL;
    size_t np = 0;
    jp = jpeg_encode(px, W, H, 3, JCS_RGB, true, &np);
    jpeg_close(px, 3, jp, np, W, H, "progressive JPEG");
    size_t ng = 0;
    uint8_t *jg = jpeg_encode(gray, W, H, 1, JCS_GRAYSCALE, false, &ng);
    jpeg_close(gray, 1, jg, ng, W, H, "grayscale JPEG");

    uint8_t *rgb = NULL;
    int w = 0, h = 0;
    int64_t live = pkv_alloc_live();
    /* CMYK is refused, not guessed at */
    uint8_t *cmyk = malloc(W * H * 4);
    for (int i = 0; i < W * H * 4; i++) cmyk[i] = (uint8_t)(i * 3);
    size_t nc = 0;
    uint8_t *jc = jpeg_encode(cmyk, W, H, 4, JCS_CMYK, false, &nc);
    CHECK_STATUS(pkv_image_decode(jc, nc, NULL, &rgb, &w, &h), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("CMYK JPEG (CMYK) is not supported");
    /* every prefix of the baseline and the progressive file is refused */
    const uint8_t *files[2] = {j, jp};
    const size_t lens[2] = {n, np};
    for (int f = 0; f < 2; f++) {
        int bad = 0;
        for (size_t k = 0; k < lens[f]; k++) {
            pkv_status r = pkv_image_decode(files[f], k, NULL, &rgb, &w, &h);
            if (r != PKV_ERR_FORMAT || rgb) {
                if (!bad++) TH_FAIL("JPEG %d prefix of %zu of %zu bytes: %s (%s)", f, k, lens[f], pkv_status_str(r), pkv_errmsg());
            }
            if (r == PKV_OK) pkv_media_free(rgb);
            rgb = NULL;
        }
        th_checks++;
    }
    CHECK_STATUS(pkv_image_decode(j, n / 2, NULL, &rgb, &w, &h), PKV_ERR_FORMAT);
    CHECK_MSG("truncated JPEG");
    /* the pixel limit, from the frame header */
    pkv_media_limits lim = {.max_pixels = W * H - 1};
    CHECK_STATUS(pkv_image_decode(j, n, &lim, &rgb, &w, &h), PKV_ERR_INVALID);
    CHECK_MSG("image too large: JPEG of 45 x 31");
    /* a frame header claiming 60000 x 60000 */
    uint8_t *big = malloc(n);
    memcpy(big, j, n);
    for (size_t i = 2; i + 9 < n; i++)
        if (big[i] == 0xff && big[i + 1] == 0xc0) { /* SOF0: len(2) precision(1) height(2) width(2) */
            big[i + 5] = 0xea, big[i + 6] = 0x60, big[i + 7] = 0xea, big[i + 8] = 0x60;
            break;
        }
    CHECK_STATUS(pkv_image_decode(big, n, NULL, &rgb, &w, &h), PKV_ERR_INVALID);
    CHECK_MSG("60000 x 60000");
    /* garbage after the header: an error, not a crash */
    memcpy(big, j, n);
    for (size_t i = 0; i < n; i++)
        if (big[i] == 0xff && big[i + 1] == 0xc4) { /* a Huffman table: wreck it */
            memset(big + i + 4, 0xff, 20);
            break;
        }
    pkv_status r = pkv_image_decode(big, n, NULL, &rgb, &w, &h);
    CHECK(r == PKV_ERR_FORMAT || r == PKV_OK);
    if (r == PKV_OK) pkv_media_free(rgb);
    rgb = NULL;
    CHECK_INT(pkv_alloc_live(), live);
    free(big);
    free(px), free(gray), free(cmyk);
    free(j), free(jp), free(jg), free(jc);
}
#endif

int main(void) {
    pkv_log_set(NULL, NULL, PKV_LOG_NONE);
    test_audio_common();
    test_image_common();
#ifdef PKV_HAVE_SNDFILE
    test_audio_exact();
    test_audio_bad();
#else
    fprintf(stderr, "built without libsndfile: only its refusal is checked\n");
#endif
#if defined(PKV_HAVE_SNDFILE) && defined(PKV_HAVE_SOXR) && defined(PKV_HAVE_VORBIS) && defined(PKV_HAVE_OGG)
    test_audio_resample_and_lossy();
#endif
#ifdef PKV_HAVE_SPNG
    test_png();
#else
    fprintf(stderr, "built without libspng: only its refusal is checked\n");
#endif
#ifdef PKV_HAVE_JPEG
    test_jpeg();
#else
    fprintf(stderr, "built without libjpeg-turbo: only its refusal is checked\n");
#endif
    return th_done();
}
