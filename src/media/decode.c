/* Media file decoding: audio through libsndfile (WAV, FLAC) and libogg + libvorbis
 * (Ogg/Vorbis) resampled with soxr, images through libspng (PNG) and libjpeg-turbo (JPEG). Each library is
 * optional at build time (CMakeLists.txt finds it with pkg-config and defines
 * PKV_HAVE_<LIB>); without one the decoder it serves returns PKV_ERR_UNSUPPORTED
 * naming the library. Ogg/Vorbis is read here with libogg and libvorbis's
 * low-level calls, not through libsndfile or libvorbisfile: both leak on some
 * malformed Ogg files (found by fuzz-audio), which a server taking uploads cannot
 * afford (vorbis_read below).
 * Every input is a file image in memory and is treated as
 * hostile: the kind is sniffed from its magic bytes (only the formats listed are
 * handed to a library), the limits (pkv_media_limits) are checked against the
 * header before anything of the size it claims is allocated, and a failure says
 * what was wrong in which format. docs/multimodal.md, "Inputs". */
#include "media/media-impl.h"

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#ifdef PKV_HAVE_SNDFILE
#include <sndfile.h>
#endif
#ifdef PKV_HAVE_SOXR
#include <soxr.h>
#endif
#if defined(PKV_HAVE_VORBIS) && defined(PKV_HAVE_OGG)
#define PKV_HAVE_OGG_VORBIS 1
#include <ogg/ogg.h>
#include <vorbis/codec.h>
#endif
#ifdef PKV_HAVE_SPNG
#include <spng.h>
#endif
#ifdef PKV_HAVE_JPEG
#include <jerror.h>
#include <jpeglib.h>
#endif

#define PKV_MEDIA_DEFAULT_BYTES ((size_t)64 << 20)
#define PKV_MEDIA_DEFAULT_SECONDS 1800.0
#define PKV_MEDIA_DEFAULT_PIXELS ((int64_t)50 * 1000 * 1000)
/* Sample rates outside this range are refused as malformed (no real file has them). */
#define PKV_AUDIO_RATE_MAX 768000
/* Decoded samples are taken up to this magnitude (a float file may exceed 1.0 a
 * little; 1e30 is no audio, and the resampler's arithmetic would overflow on it). */
#define PKV_AUDIO_SAMPLE_MAX 1024.0f
/* A progressive JPEG may repeat scans without end, each one a pass over the whole
 * image: beyond this many the file is refused (a CPU-exhaustion guard). */
#define PKV_JPEG_MAX_SCANS 500

static pkv_media_limits limits_of(const pkv_media_limits *lim) {
    pkv_media_limits l = lim ? *lim : (pkv_media_limits){0};
    if (l.max_bytes == 0) l.max_bytes = PKV_MEDIA_DEFAULT_BYTES;
    if (!(l.max_audio_seconds > 0)) l.max_audio_seconds = PKV_MEDIA_DEFAULT_SECONDS;
    if (l.max_pixels <= 0) l.max_pixels = PKV_MEDIA_DEFAULT_PIXELS;
    return l;
}

/* The first bytes of a file that is none of the formats, for the message. */
static const char *magic_hex(const uint8_t *d, size_t n, char *buf, size_t cap) {
    size_t k = n < 4 ? n : 4, o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < k && o + 4 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%02x", i ? " " : "", d[i]);
    return n ? buf : "nothing";
}

static uint32_t rd32le(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* ------------------------------------------------------------------ audio */

typedef enum { AUDIO_WAV, AUDIO_RF64, AUDIO_FLAC, AUDIO_OGG, AUDIO_NONE } audio_kind;

static audio_kind sniff_audio(const uint8_t *d, size_t n) {
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WAVE", 4)) return AUDIO_WAV;
    if (n >= 12 && !memcmp(d, "RF64", 4) && !memcmp(d + 8, "WAVE", 4)) return AUDIO_RF64;
    if (n >= 4 && !memcmp(d, "fLaC", 4)) return AUDIO_FLAC;
    if (n >= 4 && !memcmp(d, "OggS", 4)) return AUDIO_OGG;
    return AUDIO_NONE;
}

/* A chunk id: four printable ASCII characters ("fmt ", "data", "LIST", "id3 ", ...). */
static bool fourcc_ok(const uint8_t *p) {
    for (int i = 0; i < 4; i++)
        if (p[i] < 0x20 || p[i] > 0x7e) return false;
    return true;
}

static uint16_t rd16le(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* A WAV as pagekv reads it: the fmt chunk's fields (WAVE_FORMAT_EXTENSIBLE resolved
 * to its subformat) and where the samples are. libsndfile is then shown only a
 * canonical file made of these: a 44-byte RIFF header written here and the data
 * bytes (wav_canonical). It never parses the upload's own chunks: fuzz-audio found
 * libsndfile 1.2.0 reading on past the end of small files for minutes when a
 * misaligned LIST chunk claimed 4 GB, when a chunk inside a 16-byte LIST did, when
 * an RF64 ds64 chunk gave the data 4 GB, and when a streaming data size
 * (0xffffffff) was followed by audio bytes that read as chunks. */
typedef struct wav_info {
    uint16_t tag; /* 1 PCM, 3 IEEE float, 6 A-law, 7 u-law */
    uint16_t channels, block, bits;
    uint32_t rate;
    size_t data_off, data_len; /* whole frames */
    uint8_t hdr[44];           /* the canonical header */
} wav_info;

static const char *wav_tag_name(unsigned tag) {
    switch (tag) {
    case 0x0002: return "Microsoft ADPCM";
    case 0x0011: return "IMA ADPCM";
    case 0x0031: return "GSM 6.10";
    case 0x0040: return "G.721 ADPCM";
    case 0x0050: return "MPEG layer I/II";
    case 0x0055: return "MPEG layer III";
    default: return NULL;
    }
}

/* Walks the chunks up to the fmt and data chunks (each id four printable
 * characters, each chunk inside the file, odd sizes followed by their pad byte),
 * checks the format and fills *w. Data sizes 0 and 0xffffffff (written by
 * streaming writers before they know the length) run to the end of the file; in
 * RF64, 0xffffffff means the ds64 chunk's 64-bit size. A data chunk that claims
 * more than the file holds was cut short and is refused (libsndfile would read
 * what is there). What follows the data is not read. */
static pkv_status wav_parse(const uint8_t *d, size_t n, wav_info *w) {
    memset(w, 0, sizeof *w);
    const bool rf64 = !memcmp(d, "RF64", 4);
    uint64_t data64 = 0;
    if (rf64) {
        if (n < 12 + 8 + 24 || memcmp(d + 12, "ds64", 4) || rd32le(d + 16) < 24 || rd32le(d + 16) > n - 20)
            return pkv_err(PKV_ERR_FORMAT, "malformed RF64 WAV: no complete ds64 chunk after its header");
        data64 = (uint64_t)rd32le(d + 28) | (uint64_t)rd32le(d + 32) << 32;
    }
    bool fmt = false, data = false;
    size_t off = 12;
    while (off + 8 <= n && !(fmt && data)) {
        if (!fourcc_ok(d + off))
            return pkv_err(PKV_ERR_FORMAT, "malformed WAV: no chunk id at byte %zu (bytes %02x %02x %02x %02x)", off,
                           d[off], d[off + 1], d[off + 2], d[off + 3]);
        uint64_t sz = rd32le(d + off + 4);
        const size_t have = n - off - 8;
        const uint8_t *b = d + off + 8;
        if (!memcmp(d + off, "data", 4)) {
            if (data) return pkv_err(PKV_ERR_FORMAT, "malformed WAV: a second data chunk at byte %zu", off);
            if (rf64 && sz == 0xffffffffu) {
                sz = data64;
                if (sz > have)
                    return pkv_err(PKV_ERR_FORMAT, "truncated RF64 WAV: its ds64 chunk says %llu bytes of data, the "
                                                   "file holds %zu", (unsigned long long)sz, have);
            } else if (sz == 0 || sz == 0xffffffffu) {
                sz = have;
            } else if (sz > have) {
                return pkv_err(PKV_ERR_FORMAT, "truncated WAV: its data chunk says %llu bytes, the file holds %zu",
                               (unsigned long long)sz, have);
            }
            data = true;
            w->data_off = off + 8;
            w->data_len = (size_t)sz;
        } else if (sz > have) {
            return pkv_err(PKV_ERR_FORMAT, "malformed WAV: its \"%.4s\" chunk at byte %zu claims %llu bytes, the "
                                           "file holds %zu after it", (const char *)(d + off), off,
                           (unsigned long long)sz, have);
        } else if (!memcmp(d + off, "fmt ", 4)) {
            if (fmt) return pkv_err(PKV_ERR_FORMAT, "malformed WAV: a second fmt chunk at byte %zu", off);
            if (sz < 16) return pkv_err(PKV_ERR_FORMAT, "malformed WAV: a fmt chunk of %llu bytes (16 at least)",
                                        (unsigned long long)sz);
            fmt = true;
            w->tag = rd16le(b);
            w->channels = rd16le(b + 2);
            w->rate = rd32le(b + 4);
            w->block = rd16le(b + 12);
            w->bits = rd16le(b + 14);
            if (w->tag == 0xfffe) { /* WAVE_FORMAT_EXTENSIBLE: the subformat GUID's first two bytes are the tag */
                static const uint8_t base[14] = {0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80,
                                                 0x00, 0x00, 0xaa, 0x00, 0x38, 0x9b, 0x71};
                if (sz < 40 || memcmp(b + 26, base, 14))
                    return pkv_err(PKV_ERR_UNSUPPORTED, "unsupported sample format: WAV (extensible) without a "
                                                        "standard subformat");
                w->tag = rd16le(b + 24);
            }
        }
        if (data && sz == (uint64_t)have) break; /* the data runs to the end */
        off += 8 + (size_t)sz + (size_t)(sz & 1);
    }
    if (!fmt) return pkv_err(PKV_ERR_FORMAT, "malformed WAV: no fmt chunk%s", data ? " before the end of its data" : "");
    if (!data) return pkv_err(PKV_ERR_FORMAT, "malformed WAV: no data chunk");
    const unsigned t = w->tag, bits = w->bits;
    const bool ok = (t == 1 && (bits == 8 || bits == 16 || bits == 24 || bits == 32)) ||
                    (t == 3 && (bits == 32 || bits == 64)) || ((t == 6 || t == 7) && bits == 8);
    if (!ok) {
        const char *name = wav_tag_name(t);
        if (name || t == 1 || t == 3 || t == 6 || t == 7)
            return pkv_err(PKV_ERR_UNSUPPORTED, "unsupported sample format: %s%s in WAV (supported: 8/16/24/32-bit "
                           "PCM, 32/64-bit float, u-law, A-law)", name ? name : t == 3 ? "float" : t == 1 ? "PCM" : "G.711",
                           name ? "" : " of that sample size");
        return pkv_err(PKV_ERR_UNSUPPORTED, "unsupported sample format 0x%04x in WAV", t);
    }
    if (w->channels < 1 || w->channels > 256)
        return pkv_err(PKV_ERR_FORMAT, "WAV with %u channels (1 to 256 are taken)", w->channels);
    if (w->rate < 1 || w->rate > PKV_AUDIO_RATE_MAX)
        return pkv_err(PKV_ERR_FORMAT, "WAV with a sample rate of %u Hz (1 to %d are taken)", w->rate,
                       PKV_AUDIO_RATE_MAX);
    if ((unsigned)w->block != (unsigned)w->channels * bits / 8)
        return pkv_err(PKV_ERR_FORMAT, "malformed WAV: a block of %u bytes for %u channels of %u bits", w->block,
                       w->channels, bits);
    w->data_len -= w->data_len % w->block; /* a partial last frame is dropped */
    if (w->data_len > 0xffffffffu - 36)
        return pkv_err(PKV_ERR_UNSUPPORTED, "a WAV with more than 4 GB of samples is not supported");
    uint8_t *h = w->hdr;
    const uint32_t riff = (uint32_t)(36 + w->data_len), fmt16 = 16, byterate = w->rate * w->block;
    memcpy(h, "RIFF", 4), memcpy(h + 4, &riff, 4), memcpy(h + 8, "WAVEfmt ", 8), memcpy(h + 16, &fmt16, 4);
    const uint16_t f[2] = {w->tag, w->channels};
    memcpy(h + 20, f, 4), memcpy(h + 24, &w->rate, 4), memcpy(h + 28, &byterate, 4);
    const uint16_t g[2] = {w->block, w->bits};
    memcpy(h + 32, g, 4), memcpy(h + 36, "data", 4);
    const uint32_t dl = (uint32_t)w->data_len;
    memcpy(h + 40, &dl, 4);
    return PKV_OK;
}

#if defined(PKV_HAVE_SNDFILE) || defined(PKV_HAVE_OGG_VORBIS)
/* Room in *mono (*cap frames) for `more` frames after the first n, within the
 * duration limit (max_frames at `rate` Hz): the buffer doubles as it fills. */
static pkv_status mono_room(float **mono, int64_t *cap, int64_t n, int64_t more, int64_t max_frames,
                            const pkv_media_limits *l, long rate) {
    if (n + more > max_frames)
        return pkv_err(PKV_ERR_INVALID, "audio too long: more than %g s (the limit) at %ld Hz", l->max_audio_seconds,
                       rate);
    if (n + more <= *cap) return PKV_OK;
    const int64_t nc = *cap * 2 > n + more ? *cap * 2 : n + more;
    float *g = pkv_realloc(*mono, (size_t)nc * sizeof(float));
    if (!g) return pkv_err(PKV_ERR_NOMEM, "audio decode: no memory for %lld frames", (long long)nc);
    *mono = g;
    *cap = nc;
    return PKV_OK;
}
#endif

#ifdef PKV_HAVE_SNDFILE
typedef struct mem_file { /* a file made of two pieces: a header (may be empty), then a body */
    const uint8_t *h, *d;
    sf_count_t hn, n, pos; /* n: the whole length */
} mem_file;

static sf_count_t vio_len(void *u) { return ((mem_file *)u)->n; }
static sf_count_t vio_seek(sf_count_t off, int whence, void *u) {
    mem_file *m = u;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->n;
    /* as a file: a position past the end is taken (reads there return nothing) */
    if ((off > 0 && base > SF_COUNT_MAX - off) || base + off < 0) return -1;
    m->pos = base + off;
    return m->pos;
}
static sf_count_t vio_read(void *p, sf_count_t cnt, void *u) {
    mem_file *m = u;
    if (cnt <= 0 || m->pos >= m->n) return 0;
    sf_count_t k = m->n - m->pos < cnt ? m->n - m->pos : cnt, done = 0;
    if (m->pos < m->hn) {
        done = m->hn - m->pos < k ? m->hn - m->pos : k;
        memcpy(p, m->h + m->pos, (size_t)done);
    }
    if (k > done) memcpy((uint8_t *)p + done, m->d + (m->pos + done - m->hn), (size_t)(k - done));
    m->pos += k;
    return k;
}
static sf_count_t vio_write(const void *p, sf_count_t cnt, void *u) {
    (void)p, (void)cnt, (void)u;
    return 0;
}
static sf_count_t vio_tell(void *u) { return ((mem_file *)u)->pos; }

static const char *audio_kind_name(int major) {
    switch (major) {
    case SF_FORMAT_WAV: return "WAV";
    case SF_FORMAT_WAVEX: return "WAV (extensible)";
    case SF_FORMAT_RF64: return "RF64 WAV";
    case SF_FORMAT_FLAC: return "FLAC";
    case SF_FORMAT_OGG: return "Ogg";
    default: return "audio";
    }
}

/* The sample formats taken, per container; everything else libsndfile might read
 * (ADPCM, GSM, MPEG inside WAV, ...) is refused: fewer codecs, less to attack. */
static bool audio_format_ok(int major, int sub) {
    switch (major) {
    case SF_FORMAT_WAV:
    case SF_FORMAT_WAVEX:
    case SF_FORMAT_RF64:
        return sub == SF_FORMAT_PCM_U8 || sub == SF_FORMAT_PCM_16 || sub == SF_FORMAT_PCM_24 ||
               sub == SF_FORMAT_PCM_32 || sub == SF_FORMAT_FLOAT || sub == SF_FORMAT_DOUBLE ||
               sub == SF_FORMAT_ULAW || sub == SF_FORMAT_ALAW;
    case SF_FORMAT_FLAC: return sub == SF_FORMAT_PCM_S8 || sub == SF_FORMAT_PCM_16 || sub == SF_FORMAT_PCM_24;
    default: return false; /* Ogg is read by vorbis_read; libsndfile never sees it */
    }
}

static const char *audio_sub_name(int sub) {
    switch (sub) {
    case SF_FORMAT_PCM_S8: return "8-bit PCM";
    case SF_FORMAT_PCM_U8: return "8-bit unsigned PCM";
    case SF_FORMAT_PCM_16: return "16-bit PCM";
    case SF_FORMAT_PCM_24: return "24-bit PCM";
    case SF_FORMAT_PCM_32: return "32-bit PCM";
    case SF_FORMAT_FLOAT: return "32-bit float";
    case SF_FORMAT_DOUBLE: return "64-bit float";
    case SF_FORMAT_ULAW: return "u-law";
    case SF_FORMAT_ALAW: return "A-law";
    case SF_FORMAT_IMA_ADPCM: return "IMA ADPCM";
    case SF_FORMAT_MS_ADPCM: return "Microsoft ADPCM";
    case SF_FORMAT_GSM610: return "GSM 6.10";
    case SF_FORMAT_G721_32: return "G.721 ADPCM";
    case SF_FORMAT_VORBIS: return "Vorbis";
    case SF_FORMAT_OPUS: return "Opus";
    case SF_FORMAT_MPEG_LAYER_I: return "MPEG layer I";
    case SF_FORMAT_MPEG_LAYER_II: return "MPEG layer II";
    case SF_FORMAT_MPEG_LAYER_III: return "MPEG layer III";
    default: return NULL;
    }
}

/* Read every frame as float, channels averaged. On success *out (pkv_malloc) holds
 * *n mono samples at the file's rate. */
/* wav: the parsed WAV (libsndfile reads its canonical header and data), or NULL
 * for a FLAC file (read whole). */
static pkv_status sndfile_read(const uint8_t *d, size_t size, const wav_info *wav, const pkv_media_limits *l,
                               float **out, int64_t *n_out, int *rate_in) {
    mem_file m = {NULL, d, 0, (sf_count_t)size, 0};
    if (wav) {
        m.h = wav->hdr;
        m.hn = (sf_count_t)sizeof wav->hdr;
        m.d = d + wav->data_off;
        m.n = m.hn + (sf_count_t)wav->data_len;
    }
    SF_VIRTUAL_IO vio = {vio_len, vio_seek, vio_read, vio_write, vio_tell};
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &m);
    if (!sf) return pkv_err(PKV_ERR_FORMAT, "libsndfile cannot read it: %s", sf_strerror(NULL));
    pkv_status st = PKV_OK;
    float *mono = NULL, *block = NULL;
    int major = info.format & SF_FORMAT_TYPEMASK, sub = info.format & SF_FORMAT_SUBMASK;
    const char *kn = audio_kind_name(major);
    if (!audio_format_ok(major, sub)) {
        const char *sn = audio_sub_name(sub);
        if (sn)
            st = pkv_err(PKV_ERR_UNSUPPORTED, "unsupported sample format: %s in %s (supported: 8/16/24/32-bit PCM, "
                                              "float, u-law, A-law in WAV; PCM in FLAC; Vorbis in Ogg)", sn, kn);
        else
            st = pkv_err(PKV_ERR_UNSUPPORTED, "unsupported sample format 0x%04x in %s", (unsigned)sub, kn);
        goto done;
    }
    if (info.channels < 1 || info.channels > 256) {
        st = pkv_err(PKV_ERR_FORMAT, "%s with %d channels (1 to 256 are taken)", kn, info.channels);
        goto done;
    }
    if (info.samplerate < 1 || info.samplerate > PKV_AUDIO_RATE_MAX) {
        st = pkv_err(PKV_ERR_FORMAT, "%s with a sample rate of %d Hz (1 to %d are taken)", kn, info.samplerate,
                     PKV_AUDIO_RATE_MAX);
        goto done;
    }
    /* The duration the header gives, checked before anything is allocated for it. */
    const double max_frames_d = l->max_audio_seconds * info.samplerate;
    const int64_t max_frames = max_frames_d >= (double)INT64_MAX / 4 ? INT64_MAX / 4 : (int64_t)max_frames_d;
    const bool known = info.frames >= 0 && info.frames < SF_COUNT_MAX;
    if (known && info.frames > max_frames) {
        st = pkv_err(PKV_ERR_INVALID, "audio too long: %.1f s (%lld frames at %d Hz by its header) exceeds the limit of %g s",
                     (double)info.frames / info.samplerate, (long long)info.frames, info.samplerate,
                     l->max_audio_seconds);
        goto done;
    }
    const int64_t bf = (int64_t)(65536 / info.channels) > 0 ? 65536 / info.channels : 1; /* frames per read */
    block = pkv_malloc((size_t)bf * (size_t)info.channels * sizeof(float));
    int64_t cap = known ? info.frames : bf, n = 0;
    /* The header's frame count (within the limit) is only a hint for the first
     * allocation: a FLAC or Ogg header can claim far more than its bytes hold, so
     * the hint is capped by the file's size; the buffer grows if more comes. */
    if (cap > (int64_t)size * 8 + bf) cap = (int64_t)size * 8 + bf;
    if (cap < 1) cap = 1;
    mono = pkv_malloc((size_t)cap * sizeof(float));
    if (!block || !mono) {
        st = pkv_err(PKV_ERR_NOMEM, "audio decode: no memory for %lld frames", (long long)cap);
        goto done;
    }
    const float inv = 1.0f / (float)info.channels;
    for (;;) {
        sf_count_t got = sf_readf_float(sf, block, bf);
        if (got <= 0) break;
        if ((st = mono_room(&mono, &cap, n, got, max_frames, l, info.samplerate))) goto done;
        for (sf_count_t i = 0; i < got; i++) {
            const float *f = block + i * info.channels;
            float s = f[0];
            for (int c = 1; c < info.channels; c++) s += f[c];
            if (!isfinite(s) || fabsf(s) > PKV_AUDIO_SAMPLE_MAX * info.channels) {
                st = pkv_err(PKV_ERR_FORMAT, "%s: sample %lld is %s", kn, (long long)(n + i),
                             isfinite(s) ? "far outside [-1, 1]" : "not a finite number");
                goto done;
            }
            mono[n + i] = info.channels == 1 ? s : s * inv;
        }
        n += got;
    }
    if (sf_error(sf) != SF_ERR_NO_ERROR) {
        st = pkv_err(PKV_ERR_FORMAT, "%s: decoding failed after %lld frames: %s", kn, (long long)n, sf_strerror(sf));
        goto done;
    }
    if (known && n < info.frames) {
        st = pkv_err(PKV_ERR_FORMAT, "truncated %s: its header says %lld frames, only %lld could be decoded", kn,
                     (long long)info.frames, (long long)n);
        goto done;
    }
    if (n == 0) {
        st = pkv_err(PKV_ERR_FORMAT, "%s holds no samples", kn);
        goto done;
    }
    *out = mono;
    *n_out = n;
    *rate_in = info.samplerate;
    mono = NULL;
done:
    pkv_free(block);
    pkv_free(mono);
    sf_close(sf);
    return st;
}
#endif

#ifdef PKV_HAVE_OGG_VORBIS
/* Ogg/Vorbis through libogg (pages, packets) and libvorbis (the codec), driven
 * here rather than through libvorbisfile: libvorbisfile 1.3.7 (Debian 12) leaks
 * its list of stream serial numbers when a file's first Vorbis header is good and
 * a later one is not (fuzz-audio found it), and libsndfile 1.2.0's Ogg reader
 * leaks on malformed files too. Every object below is cleared on every path.
 *
 * What is taken: one logical Vorbis stream (a page of any other serial number,
 * chained or multiplexed, is refused), every page intact (a checksum failure or a
 * gap is refused, not skipped), ending in its end-of-stream page (a file cut short
 * is refused, as a WAV is). The samples after the last page's granule position
 * are dropped, as the Vorbis specification defines the end of a stream; a stream
 * whose first granule position is not 0 (cut from a live stream) is decoded from
 * its first sample without that start trim. */
typedef struct ogg_dec {
    ogg_sync_state oy;
    ogg_stream_state os;
    vorbis_info vi;
    vorbis_comment vc;
    vorbis_dsp_state vd;
    vorbis_block vb;
    bool os_on, dsp_on, blk_on;
} ogg_dec;

static void ogg_dec_clear(ogg_dec *o) {
    if (o->blk_on) vorbis_block_clear(&o->vb);
    if (o->dsp_on) vorbis_dsp_clear(&o->vd);
    if (o->os_on) ogg_stream_clear(&o->os);
    vorbis_comment_clear(&o->vc);
    vorbis_info_clear(&o->vi);
    ogg_sync_clear(&o->oy);
}

static const char *vorbis_header_err(int e) {
    switch (e) {
    case OV_ENOTVORBIS: return "not Vorbis (only Vorbis is taken in Ogg)";
    case OV_EBADHEADER: return "a malformed Vorbis header";
    case OV_EVERSION: return "an unsupported Vorbis version";
    default: return "an undecodable Vorbis header";
    }
}

static pkv_status vorbis_read(const uint8_t *d, size_t size, const pkv_media_limits *l, float **out, int64_t *n_out,
                              int *rate_in) {
    ogg_dec o;
    memset(&o, 0, sizeof o);
    ogg_sync_init(&o.oy);
    vorbis_info_init(&o.vi);
    vorbis_comment_init(&o.vc);
    pkv_status st = PKV_OK;
    float *mono = NULL;
    int64_t n = 0, cap = 0, max_frames = 0;
    size_t fed = 0;
    int headers = 0, ch = 0;
    long serial = 0;
    bool eos = false;
    float inv = 1.0f;
    for (int64_t page = 0; !eos; page++) {
        ogg_page og;
        int r;
        while ((r = ogg_sync_pageout(&o.oy, &og)) == 0) {
            if (fed == size) {
                st = pkv_err(PKV_ERR_FORMAT, page == 0 ? "Ogg: no complete page" :
                             "truncated Ogg/Vorbis: the file ends without its end-of-stream page (after %lld frames)",
                             (long long)n);
                goto done;
            }
            size_t k = size - fed < 65536 ? size - fed : 65536;
            char *buf = ogg_sync_buffer(&o.oy, (long)k);
            if (!buf) {
                st = pkv_err(PKV_ERR_NOMEM, "Ogg: no memory for a %zu-byte read", k);
                goto done;
            }
            memcpy(buf, d + fed, k);
            ogg_sync_wrote(&o.oy, (long)k);
            fed += k;
        }
        if (r < 0) {
            st = pkv_err(PKV_ERR_FORMAT, "Ogg: a corrupt page (bad checksum or lost sync) near byte %zu", fed);
            goto done;
        }
        if (page == 0) {
            if (!ogg_page_bos(&og)) {
                st = pkv_err(PKV_ERR_FORMAT, "Ogg: the first page does not begin a stream");
                goto done;
            }
            serial = (long)ogg_page_serialno(&og);
            if (ogg_stream_init(&o.os, (int)serial)) {
                st = pkv_err(PKV_ERR_NOMEM, "Ogg: no memory for the stream");
                goto done;
            }
            o.os_on = true;
        } else if ((long)ogg_page_serialno(&og) != serial || ogg_page_bos(&og)) {
            st = pkv_err(PKV_ERR_UNSUPPORTED, "an Ogg file with more than one logical stream (chained or multiplexed) "
                                              "is not supported");
            goto done;
        }
        if (ogg_stream_pagein(&o.os, &og)) {
            st = pkv_err(PKV_ERR_FORMAT, "Ogg: page %lld does not fit its stream", (long long)page);
            goto done;
        }
        eos = ogg_page_eos(&og) != 0;
        for (;;) {
            ogg_packet op;
            r = ogg_stream_packetout(&o.os, &op);
            if (r == 0) break;
            if (r < 0) {
                st = pkv_err(PKV_ERR_FORMAT, "Ogg/Vorbis: a gap in the data before page %lld", (long long)page);
                goto done;
            }
            if (headers < 3) {
                int e = vorbis_synthesis_headerin(&o.vi, &o.vc, &op);
                if (e) {
                    st = pkv_err(PKV_ERR_FORMAT, "Ogg: %s (packet %d)", vorbis_header_err(e), headers);
                    goto done;
                }
                if (++headers < 3) continue;
                ch = o.vi.channels;
                const long rate = o.vi.rate;
                if (ch < 1 || ch > 255 || rate < 1 || rate > PKV_AUDIO_RATE_MAX) {
                    st = pkv_err(PKV_ERR_FORMAT, "Ogg/Vorbis with %d channels at %ld Hz", ch, rate);
                    goto done;
                }
                const double max_frames_d = l->max_audio_seconds * rate;
                max_frames = max_frames_d >= (double)INT64_MAX / 4 ? INT64_MAX / 4 : (int64_t)max_frames_d;
                inv = 1.0f / (float)ch;
                if (vorbis_synthesis_init(&o.vd, &o.vi)) {
                    st = pkv_err(PKV_ERR_FORMAT, "Ogg/Vorbis: its headers describe no decodable stream");
                    goto done;
                }
                o.dsp_on = true;
                if (vorbis_block_init(&o.vd, &o.vb)) {
                    st = pkv_err(PKV_ERR_NOMEM, "Ogg/Vorbis: no memory for the decoder");
                    goto done;
                }
                o.blk_on = true;
                cap = (int64_t)size * 64 + 4096; /* a first guess; the buffer grows if more comes */
                if (cap > max_frames + 1) cap = max_frames + 1;
                mono = pkv_malloc((size_t)cap * sizeof(float));
                if (!mono) {
                    st = pkv_err(PKV_ERR_NOMEM, "audio decode: no memory for %lld frames", (long long)cap);
                    goto done;
                }
                continue;
            }
            /* an audio packet; one that does not decode is skipped, as players do */
            if (vorbis_synthesis(&o.vb, &op) != 0 || vorbis_synthesis_blockin(&o.vd, &o.vb) != 0) continue;
            float **pcm;
            int got;
            while ((got = vorbis_synthesis_pcmout(&o.vd, &pcm)) > 0) {
                int take = got;
                /* the end of the stream is its last granule position */
                if (op.e_o_s && op.granulepos >= 0 && n + take > op.granulepos)
                    take = op.granulepos > n ? (int)(op.granulepos - n) : 0;
                if ((st = mono_room(&mono, &cap, n, take, max_frames, l, o.vi.rate))) goto done;
                for (int i = 0; i < take; i++) {
                    float s = pcm[0][i];
                    for (int c = 1; c < ch; c++) s += pcm[c][i];
                    if (!isfinite(s) || fabsf(s) > PKV_AUDIO_SAMPLE_MAX * ch) {
                        st = pkv_err(PKV_ERR_FORMAT, "Ogg/Vorbis: sample %lld is %s", (long long)(n + i),
                                     isfinite(s) ? "far outside [-1, 1]" : "not a finite number");
                        goto done;
                    }
                    mono[n + i] = ch == 1 ? s : s * inv;
                }
                n += take;
                vorbis_synthesis_read(&o.vd, got);
            }
        }
    }
    if (headers < 3) {
        st = pkv_err(PKV_ERR_FORMAT, "Ogg: the stream ends within its Vorbis headers (%d of 3)", headers);
        goto done;
    }
    if (n == 0) {
        st = pkv_err(PKV_ERR_FORMAT, "Ogg/Vorbis holds no samples");
        goto done;
    }
    if (fed < size || o.oy.fill > o.oy.returned) {
        /* bytes after the end-of-stream page: a second stream (chained) or junk */
        size_t rest = size - fed + (size_t)(o.oy.fill - o.oy.returned);
        st = pkv_err(PKV_ERR_UNSUPPORTED, "%zu bytes follow the Ogg stream's end (a chained Ogg file, with more than "
                                          "one logical stream, is not supported)", rest);
        goto done;
    }
    *out = mono;
    *n_out = n;
    *rate_in = (int)o.vi.rate;
    mono = NULL;
done:
    pkv_free(mono);
    ogg_dec_clear(&o);
    return st;
}
#endif

#ifdef PKV_HAVE_SOXR
static pkv_status resample(const float *in, int64_t n_in, int rate_in, int rate, const pkv_media_limits *l, float **out,
                           int64_t *n_out) {
    double want = (double)n_in * rate / rate_in;
    if (want / rate > l->max_audio_seconds + 1.0 || want > (double)(SIZE_MAX / sizeof(float) / 2))
        return pkv_err(PKV_ERR_INVALID, "audio too long after resampling (limit %g s)", l->max_audio_seconds);
    size_t olen = (size_t)llround(want);
    if (olen == 0) olen = 1;
    float *o = pkv_malloc(olen * sizeof(float));
    if (!o) return pkv_err(PKV_ERR_NOMEM, "resampling: no memory for %zu samples", olen);
    size_t idone = 0, odone = 0;
    soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
    soxr_runtime_spec_t rt = soxr_runtime_spec(1); /* one thread: no OpenMP team behind the caller's back */
    soxr_error_t e = soxr_oneshot(rate_in, rate, 1, in, (size_t)n_in, &idone, o, olen, &odone, &io, &q, &rt);
    if (e) {
        pkv_free(o);
        return pkv_err(PKV_ERR_INTERNAL, "soxr resampling %d Hz -> %d Hz failed: %s", rate_in, rate, e);
    }
    if (odone == 0) {
        pkv_free(o);
        return pkv_err(PKV_ERR_FORMAT, "audio too short to resample (%lld samples at %d Hz)", (long long)n_in, rate_in);
    }
    for (size_t i = 0; i < odone; i++)
        if (!isfinite(o[i])) { /* cannot happen with samples bounded as above; a guard */
            pkv_free(o);
            return pkv_err(PKV_ERR_FORMAT, "resampling gave a non-finite sample at %zu", i);
        }
    *out = o;
    *n_out = (int64_t)odone;
    return PKV_OK;
}
#endif

pkv_status pkv_audio_decode(const void *data, size_t size, int rate, const pkv_media_limits *lim, float **samples,
                            int64_t *n_samples) {
    if (samples) *samples = NULL;
    if (n_samples) *n_samples = 0;
    if (!samples || !n_samples || (!data && size))
        return pkv_err(PKV_ERR_INVALID, "pkv_audio_decode: NULL argument");
    if (rate < 1000 || rate > PKV_AUDIO_RATE_MAX)
        return pkv_err(PKV_ERR_INVALID, "pkv_audio_decode: output rate %d Hz out of range (1000 to %d)", rate,
                       PKV_AUDIO_RATE_MAX);
    const pkv_media_limits l = limits_of(lim);
    if (size > l.max_bytes)
        return pkv_err(PKV_ERR_INVALID, "audio file too large: %zu bytes exceeds the limit of %zu bytes", size,
                       l.max_bytes);
    const uint8_t *d = data;
    audio_kind k = sniff_audio(d, size);
    if (k == AUDIO_NONE) {
        char hex[32];
        return pkv_err(PKV_ERR_FORMAT, "not a WAV, FLAC or Ogg file (%zu bytes, starting with %s)", size,
                       magic_hex(d, size, hex, sizeof hex));
    }
    wav_info wav;
    if (k == AUDIO_WAV || k == AUDIO_RF64) {
        pkv_status st = wav_parse(d, size, &wav);
        if (st) return st;
    }
    float *mono = NULL;
    int64_t n = 0;
    int rate_in = 0;
    pkv_status st;
    if (k == AUDIO_OGG) {
#ifdef PKV_HAVE_OGG_VORBIS
        st = vorbis_read(d, size, &l, &mono, &n, &rate_in);
#else
        return pkv_err(PKV_ERR_UNSUPPORTED, "Ogg/Vorbis decoding needs libvorbis and libogg, which this build lacks "
                                            "(install libvorbis-dev and rebuild)");
#endif
    } else {
#ifdef PKV_HAVE_SNDFILE
        st = sndfile_read(d, size, k == AUDIO_FLAC ? NULL : &wav, &l, &mono, &n, &rate_in);
#else
        return pkv_err(PKV_ERR_UNSUPPORTED, "WAV and FLAC decoding needs libsndfile, which this build lacks "
                                            "(install libsndfile1-dev and rebuild)");
#endif
    }
    if (st) return st;
    if (rate_in == rate) {
        *samples = mono;
        *n_samples = n;
        return PKV_OK;
    }
#ifdef PKV_HAVE_SOXR
    st = resample(mono, n, rate_in, rate, &l, samples, n_samples);
    pkv_free(mono);
    return st;
#else
    pkv_free(mono);
    return pkv_err(PKV_ERR_UNSUPPORTED, "resampling from %d Hz to %d Hz needs libsoxr, which this build lacks "
                                        "(install libsoxr-dev and rebuild)", rate_in, rate);
#endif
}

/* ------------------------------------------------------------------ images */

static const uint8_t k_png_magic[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};

#if defined(PKV_HAVE_SPNG) || defined(PKV_HAVE_JPEG)
static pkv_status pixel_limit(const char *kind, uint32_t w, uint32_t h, const pkv_media_limits *l) {
    if (w == 0 || h == 0) return pkv_err(PKV_ERR_FORMAT, "%s of %u x %u pixels", kind, w, h);
    if ((int64_t)w * (int64_t)h > l->max_pixels)
        return pkv_err(PKV_ERR_INVALID, "image too large: %s of %u x %u = %lld pixels exceeds the limit of %lld pixels",
                       kind, w, h, (long long)w * h, (long long)l->max_pixels);
    return PKV_OK;
}
#endif

#ifdef PKV_HAVE_SPNG
/* libspng (and the zlib inside it) allocate through pagekv's hooks, so
 * allocation-failure tests reach them; a failure is noted here because zlib's
 * running out of memory mid-stream reaches libspng's caller as a stream error. */
static _Thread_local bool g_spng_oom;
static void *spng_note(void *p) {
    if (!p) g_spng_oom = true;
    return p;
}
static void *spng_m(size_t n) { return spng_note(pkv_malloc(n)); }
static void *spng_r(void *p, size_t n) { return spng_note(pkv_realloc(p, n)); }
static void *spng_c(size_t c, size_t n) { return spng_note(pkv_calloc(c, n)); }
static void spng_f(void *p) { pkv_free(p); }

/* IEND with its CRC (always the same 12 bytes). */
static const uint8_t k_png_iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};

static pkv_status png_error(int e, const char *what, size_t size) {
    if (g_spng_oom) return pkv_err(PKV_ERR_NOMEM, "PNG %s: out of memory", what);
    if (e == SPNG_IO_EOF || e == SPNG_IO_ERROR || e == SPNG_EOF || e == SPNG_EIDAT_TOO_SHORT)
        return pkv_err(PKV_ERR_FORMAT, "truncated PNG (%zu bytes): the file ends inside its %s", size, what);
    if (e == SPNG_EMEM || e == SPNG_EZLIB_INIT) return pkv_err(PKV_ERR_NOMEM, "PNG %s: out of memory", what);
    return pkv_err(PKV_ERR_FORMAT, "malformed PNG %s: %s (libspng error %d)", what, spng_strerror(e), e);
}

static pkv_status png_decode(const uint8_t *d, size_t size, const pkv_media_limits *l, uint8_t **rgb, int *w, int *h) {
    struct spng_alloc a = {spng_m, spng_r, spng_c, spng_f};
    g_spng_oom = false;
    spng_ctx *ctx = spng_ctx_new2(&a, 0);
    if (!ctx) return pkv_err(PKV_ERR_NOMEM, "PNG: out of memory");
    pkv_status st = PKV_OK;
    uint8_t *out = NULL;
    struct spng_ihdr ih;
    int e;
    /* Ancillary chunks are not used: bound what libspng keeps of them (text,
     * profiles) to the file itself and a few MiB, whatever their headers say. */
    if ((e = spng_set_chunk_limits(ctx, size, (size_t)4 << 20)) || (e = spng_set_png_buffer(ctx, d, size)) ||
        (e = spng_set_image_limits(ctx, 1u << 24, 1u << 24))) {
        st = png_error(e, "setup", size);
        goto done;
    }
    if ((e = spng_get_ihdr(ctx, &ih))) {
        st = png_error(e, "header", size);
        goto done;
    }
    if ((st = pixel_limit("PNG", ih.width, ih.height, l))) goto done;
    size_t n;
    if ((e = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &n))) {
        st = png_error(e, "header", size);
        goto done;
    }
    if (n != (size_t)ih.width * ih.height * 3) {
        st = pkv_err(PKV_ERR_INTERNAL, "PNG: libspng's RGB8 size %zu is not %u x %u x 3", n, ih.width, ih.height);
        goto done;
    }
    out = pkv_malloc(n);
    if (!out) {
        st = pkv_err(PKV_ERR_NOMEM, "PNG: no memory for %u x %u pixels", ih.width, ih.height);
        goto done;
    }
    /* RGB8: gray expanded, palettes looked up, 16-bit samples cut to their high
     * byte, alpha (and tRNS) dropped, no gamma applied. */
    if ((e = spng_decode_image(ctx, out, n, SPNG_FMT_RGB8, 0))) {
        st = png_error(e, "image data", size);
        goto done;
    }
    /* The chunks after the image, up to IEND: a file cut after its last IDAT (or
     * inside that chunk's CRC, which libspng does not wait for) is refused too. */
    if ((e = spng_decode_chunks(ctx))) {
        st = png_error(e, "chunks after the image", size);
        goto done;
    }
    /* libspng stops at IEND's type without its CRC */
    if (!memmem(d, size, k_png_iend, sizeof k_png_iend)) {
        st = pkv_err(PKV_ERR_FORMAT, "truncated PNG (%zu bytes): the file ends inside its IEND chunk", size);
        goto done;
    }
    *rgb = out;
    *w = (int)ih.width;
    *h = (int)ih.height;
    out = NULL;
done:
    pkv_free(out);
    spng_ctx_free(ctx);
    return st;
}
#endif

#ifdef PKV_HAVE_JPEG
typedef struct jpeg_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    bool eof; /* the data ended before the image (libjpeg only warns, padding with gray) */
} jpeg_err;

static void jpeg_on_error(j_common_ptr c) { longjmp(((jpeg_err *)c->err)->jb, 1); }
/* Never printed (the library does not write to stderr on its own): warnings are
 * noted, the truncation one makes the decode fail. */
static void jpeg_on_message(j_common_ptr c, int level) {
    jpeg_err *e = (jpeg_err *)c->err;
    if (level < 0 && e->pub.msg_code == JWRN_JPEG_EOF) e->eof = true;
    if (level < 0) e->pub.num_warnings++;
}
static void jpeg_on_output(j_common_ptr c) { (void)c; }
static void jpeg_on_progress(j_common_ptr c) {
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->is_decompressor && d->progressive_mode && d->input_scan_number > PKV_JPEG_MAX_SCANS)
        longjmp(((jpeg_err *)c->err)->jb, 2);
}

typedef struct jpeg_job {
    struct jpeg_decompress_struct ci;
    jpeg_err err;
    struct jpeg_progress_mgr prog;
    uint8_t *out;
    bool started;
} jpeg_job;

static pkv_status jpeg_decode(const uint8_t *d, size_t size, const pkv_media_limits *l, uint8_t **rgb, int *w, int *h) {
    /* Everything the error path reads lives in *j, outside this frame's registers
     * (longjmp would leave locals changed after setjmp undefined). */
    jpeg_job *j = pkv_calloc(1, sizeof *j);
    if (!j) return pkv_err(PKV_ERR_NOMEM, "JPEG: out of memory");
    pkv_status st = PKV_OK;
    j->ci.err = jpeg_std_error(&j->err.pub);
    j->err.pub.error_exit = jpeg_on_error;
    j->err.pub.emit_message = jpeg_on_message;
    j->err.pub.output_message = jpeg_on_output;
    int jr = setjmp(j->err.jb);
    if (jr) {
        char msg[JMSG_LENGTH_MAX];
        if (jr == 2)
            snprintf(msg, sizeof msg, "more than %d progressive scans", PKV_JPEG_MAX_SCANS);
        else
            j->err.pub.format_message((j_common_ptr)&j->ci, msg);
        if (j->err.eof)
            st = pkv_err(PKV_ERR_FORMAT, "truncated JPEG (%zu bytes): %s", size, msg);
        else
            st = pkv_err(PKV_ERR_FORMAT, "malformed JPEG: %s", msg);
        goto done;
    }
    jpeg_create_decompress(&j->ci);
    j->started = true;
    j->prog.progress_monitor = jpeg_on_progress;
    j->ci.progress = &j->prog;
    jpeg_mem_src(&j->ci, d, (unsigned long)size);
    jpeg_read_header(&j->ci, TRUE);
    if (j->err.eof) {
        st = pkv_err(PKV_ERR_FORMAT, "truncated JPEG (%zu bytes): the data ends inside its header", size);
        goto done;
    }
    if ((st = pixel_limit("JPEG", j->ci.image_width, j->ci.image_height, l))) goto done;
    switch (j->ci.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB: break;
    case JCS_CMYK:
    case JCS_YCCK:
        st = pkv_err(PKV_ERR_UNSUPPORTED, "CMYK JPEG (%s) is not supported: convert it to RGB first",
                     j->ci.jpeg_color_space == JCS_CMYK ? "CMYK" : "YCCK");
        goto done;
    default:
        st = pkv_err(PKV_ERR_UNSUPPORTED, "JPEG with %d components in an unknown color space is not supported",
                     j->ci.num_components);
        goto done;
    }
    j->ci.out_color_space = JCS_RGB;
    jpeg_start_decompress(&j->ci);
    if (j->ci.output_components != 3 || j->ci.output_width != j->ci.image_width ||
        j->ci.output_height != j->ci.image_height) {
        st = pkv_err(PKV_ERR_INTERNAL, "JPEG: libjpeg gives %d components of %u x %u", j->ci.output_components,
                     j->ci.output_width, j->ci.output_height);
        goto done;
    }
    const size_t stride = (size_t)j->ci.output_width * 3;
    j->out = pkv_malloc(stride * j->ci.output_height);
    if (!j->out) {
        st = pkv_err(PKV_ERR_NOMEM, "JPEG: no memory for %u x %u pixels", j->ci.output_width, j->ci.output_height);
        goto done;
    }
    while (j->ci.output_scanline < j->ci.output_height) {
        JSAMPROW row = j->out + stride * j->ci.output_scanline;
        if (jpeg_read_scanlines(&j->ci, &row, 1) != 1) break;
    }
    if (j->err.eof || j->ci.output_scanline < j->ci.output_height) {
        st = pkv_err(PKV_ERR_FORMAT, "truncated JPEG (%zu bytes): the data ends before the image does", size);
        goto done;
    }
    jpeg_finish_decompress(&j->ci);
    if (j->err.eof) {
        st = pkv_err(PKV_ERR_FORMAT, "truncated JPEG (%zu bytes): the data ends before the image does", size);
        goto done;
    }
    *rgb = j->out;
    *w = (int)j->ci.output_width;
    *h = (int)j->ci.output_height;
    j->out = NULL;
done:
    if (j->started) jpeg_destroy_decompress(&j->ci);
    pkv_free(j->out);
    pkv_free(j);
    return st;
}
#endif

pkv_status pkv_image_decode(const void *data, size_t size, const pkv_media_limits *lim, uint8_t **rgb, int *width,
                            int *height) {
    if (rgb) *rgb = NULL;
    if (width) *width = 0;
    if (height) *height = 0;
    if (!rgb || !width || !height || (!data && size)) return pkv_err(PKV_ERR_INVALID, "pkv_image_decode: NULL argument");
    const pkv_media_limits l = limits_of(lim);
    if (size > l.max_bytes)
        return pkv_err(PKV_ERR_INVALID, "image file too large: %zu bytes exceeds the limit of %zu bytes", size,
                       l.max_bytes);
    const uint8_t *d = data;
    if (size >= 8 && !memcmp(d, k_png_magic, 8)) {
#ifdef PKV_HAVE_SPNG
        return png_decode(d, size, &l, rgb, width, height);
#else
        return pkv_err(PKV_ERR_UNSUPPORTED, "PNG decoding needs libspng, which this build lacks "
                                            "(install libspng-dev and rebuild)");
#endif
    }
    if (size >= 3 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff) {
#ifdef PKV_HAVE_JPEG
        return jpeg_decode(d, size, &l, rgb, width, height);
#else
        return pkv_err(PKV_ERR_UNSUPPORTED, "JPEG decoding needs libjpeg-turbo, which this build lacks "
                                            "(install libjpeg62-turbo-dev and rebuild)");
#endif
    }
    char hex[32];
    if (size > 0 && size < 8 && !memcmp(d, k_png_magic, size))
        return pkv_err(PKV_ERR_FORMAT, "truncated PNG (%zu bytes): the file ends inside its signature", size);
    if (size > 0 && size < 3 && d[0] == 0xff && (size < 2 || d[1] == 0xd8))
        return pkv_err(PKV_ERR_FORMAT, "truncated JPEG (%zu bytes): the file ends inside its signature", size);
    return pkv_err(PKV_ERR_FORMAT, "not a PNG or JPEG file (%zu bytes, starting with %s)", size,
                   magic_hex(d, size, hex, sizeof hex));
}

/* ------------------------------------------------------------------ probe */

static uint32_t rd32be(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* FLAC: the STREAMINFO block that must come first holds the rate (20 bits) and
 * the total of samples per channel (36 bits; 0 = not known). */
static void flac_probe(const uint8_t *d, size_t n, pkv_media_probe_info *o) {
    if (n < 8 + 34 || (d[4] & 0x7f) != 0) return;
    const uint8_t *b = d + 8 + 10;
    const uint32_t rate = (uint32_t)b[0] << 12 | (uint32_t)b[1] << 4 | b[2] >> 4;
    const uint64_t total = (uint64_t)(b[3] & 0x0f) << 32 | rd32be(b + 4);
    if (rate < 1 || rate > PKV_AUDIO_RATE_MAX) return;
    o->rate = (int)rate;
    if (total) o->seconds = (double)total / rate;
}

/* Ogg/Vorbis: the rate from the identification header in the first page; the
 * length from the granule position (samples) of the last page in the file. */
static void ogg_probe(const uint8_t *d, size_t n, pkv_media_probe_info *o) {
    if (n < 27 || d[4] != 0) return;
    const size_t segs = d[26];
    if (n < 27 + segs + 16) return;
    const uint8_t *pk = d + 27 + segs;
    if (pk[0] != 1 || memcmp(pk + 1, "vorbis", 6)) return;
    const uint32_t rate = rd32le(pk + 12);
    if (rate < 1 || rate > PKV_AUDIO_RATE_MAX) return;
    o->rate = (int)rate;
    /* the last "OggS" page header whose granule is set, searched back from the end */
    for (size_t i = n - 27 + 1; i-- > 0;) {
        if (d[i] != 'O' || memcmp(d + i, "OggS", 4) || d[i + 4] != 0) continue;
        const uint64_t g = (uint64_t)rd32le(d + i + 6) | (uint64_t)rd32le(d + i + 10) << 32;
        if (g == UINT64_MAX) continue; /* no packet ends on that page */
        if (g > 0 && g < ((uint64_t)1 << 53)) o->seconds = (double)g / rate;
        return;
    }
}

/* JPEG: walk the markers up to the first start of frame (SOF0..SOF15 but DHT,
 * JPG and DAC) and read its height and width; stop at the start of scan. */
static void jpeg_probe(const uint8_t *d, size_t n, pkv_media_probe_info *o) {
    size_t i = 2;
    while (i + 4 <= n) {
        if (d[i] != 0xff) return;
        const uint8_t m = d[i + 1];
        if (m == 0xff) { /* fill byte */
            i++;
            continue;
        }
        if (m == 0x01 || (m >= 0xd0 && m <= 0xd8)) { /* no length */
            i += 2;
            continue;
        }
        if (m == 0xd9 || m == 0xda) return;
        const size_t len = (size_t)d[i + 2] << 8 | d[i + 3];
        if (len < 2) return;
        if (m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc) {
            if (len < 7 || i + 9 > n) return;
            o->height = d[i + 5] << 8 | d[i + 6];
            o->width = d[i + 7] << 8 | d[i + 8];
            return;
        }
        i += 2 + len;
    }
}

pkv_status pkv_media_probe(const void *data, size_t size, pkv_media_kind kind, pkv_media_probe_info *out) {
    if (!out || (!data && size)) return pkv_err(PKV_ERR_INVALID, "pkv_media_probe: NULL argument");
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->seconds = -1;
    const uint8_t *d = data;
    if (kind == PKV_MEDIA_AUDIO) {
        const audio_kind k = sniff_audio(d, size);
        if (k == AUDIO_WAV || k == AUDIO_RF64) {
            wav_info w;
            pkv_status st = wav_parse(d, size, &w);
            if (st) return st;
            out->rate = (int)w.rate;
            out->seconds = (double)(w.data_len / w.block) / w.rate;
        } else if (k == AUDIO_FLAC) {
            flac_probe(d, size, out);
        } else if (k == AUDIO_OGG) {
            ogg_probe(d, size, out);
        }
        return PKV_OK;
    }
    if (kind != PKV_MEDIA_IMAGE) return pkv_err(PKV_ERR_INVALID, "pkv_media_probe: unknown media kind %d", (int)kind);
    if (size >= 8 + 8 + 8 && !memcmp(d, k_png_magic, 8) && !memcmp(d + 12, "IHDR", 4)) {
        const uint32_t w = rd32be(d + 16), h = rd32be(d + 20);
        if (w > INT_MAX || h > INT_MAX) /* the PNG limit is 2^31 - 1 */
            return pkv_err(PKV_ERR_FORMAT, "malformed PNG header: %u x %u pixels", w, h);
        out->width = (int)w, out->height = (int)h;
    } else if (size >= 3 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff) {
        jpeg_probe(d, size, out);
    }
    return PKV_OK;
}

void pkv_media_free(void *p) { pkv_free(p); }
