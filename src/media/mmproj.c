/* Projector files: read the GGUF, find which encoder it holds, hand it to that
 * encoder's loader (media-impl.h). */
#include "media/media-impl.h"

#include <string.h>

static pkv_status get_projector(const pkv_gguf *g, const char *key, char *out, size_t cap, bool *found) {
    const char *s;
    size_t n;
    *found = false;
    if (pkv_gguf_find_key(g, key) < 0) return PKV_OK;
    pkv_status st = pkv_gguf_get_str(g, key, &s, &n);
    if (st) return st;
    if (n == 0 || n >= cap) return pkv_err(PKV_ERR_FORMAT, "'%s': projector type of %zu bytes", key, n);
    memcpy(out, s, n);
    out[n] = 0;
    *found = true;
    return PKV_OK;
}

pkv_mmproj *pkv_mmproj_load(const char *path, const pkv_model *text_model, pkv_device *dev) {
    if (!path) {
        pkv_err(PKV_ERR_INVALID, "pkv_mmproj_load: no path");
        return NULL;
    }
    pkv_mmproj *p = pkv_calloc(1, sizeof *p);
    if (!p) {
        pkv_err(PKV_ERR_NOMEM, "loading projector %s: out of memory", path);
        return NULL;
    }
    pkv_status st = pkv_gguf_read(path, &p->g);
    if (st) goto fail;
    bool audio = false, vision = false, found;
    (void)pkv_gguf_get_bool(p->g, "clip.has_audio_encoder", &audio);
    (void)pkv_gguf_get_bool(p->g, "clip.has_vision_encoder", &vision);
    if (!audio && !vision) {
        st = pkv_err(PKV_ERR_FORMAT, "not a projector file: neither 'clip.has_audio_encoder' nor "
                                     "'clip.has_vision_encoder' is true (is this the text model?)");
        goto fail;
    }
    if (audio && vision) {
        st = pkv_err(PKV_ERR_UNSUPPORTED, "a projector with both an audio and a vision encoder is not supported");
        goto fail;
    }
    /* Newer converters write the type per modality; older ones one clip.projector_type. */
    st = get_projector(p->g, audio ? "clip.audio.projector_type" : "clip.vision.projector_type", p->projector,
                       sizeof p->projector, &found);
    if (!st && !found) st = get_projector(p->g, "clip.projector_type", p->projector, sizeof p->projector, &found);
    if (st) goto fail;
    if (!found) {
        st = pkv_err(PKV_ERR_FORMAT, "no projector type ('clip.projector_type')");
        goto fail;
    }
    if (dev) {
        p->dev = dev;
    } else {
        p->dev = text_model ? pkv_model_device(text_model) : NULL;
        if (!p->dev) {
            p->dev = pkv_device_open("cpu", (pkv_device_params){0});
            if (!p->dev) {
                st = pkv_errcode();
                goto fail;
            }
            p->own_dev = true;
        }
    }
    st = audio ? pkv_mmproj_audio_open(p, p->projector, text_model)
               : pkv_mmproj_vision_open(p, p->projector, text_model);
    if (st) goto fail;
    p->info.projector = p->projector;
    /* a loader that sets no wrapping text has none */
    if (!p->info.text_before) p->info.text_before = "";
    if (!p->info.text_after) p->info.text_after = "";
    return p;
fail:
    pkv_err_prefix(st, "loading projector %s", path);
    pkv_mmproj_free(p);
    return NULL;
}

void pkv_mmproj_free(pkv_mmproj *p) {
    if (!p) return;
    if (p->free_enc) p->free_enc(p);
    if (p->own_dev) pkv_device_close(p->dev);
    if (p->g) pkv_gguf_close(p->g);
    pkv_free(p);
}

pkv_status pkv_mmproj_get_info(const pkv_mmproj *p, pkv_mmproj_info *info) {
    if (!p || !info) return pkv_err(PKV_ERR_INVALID, "pkv_mmproj_get_info: NULL argument");
    *info = p->info;
    return PKV_OK;
}

static pkv_status check_media(const pkv_mmproj *p, const pkv_media *m) {
    if (!p || !m) return pkv_err(PKV_ERR_INVALID, "projector: NULL argument");
    if (m->kind != p->info.kind)
        return pkv_err(PKV_ERR_MISMATCH, "projector '%s' encodes %s, given %s", p->projector,
                       p->info.kind == PKV_MEDIA_AUDIO ? "audio" : "images",
                       m->kind == PKV_MEDIA_AUDIO ? "audio" : m->kind == PKV_MEDIA_IMAGE ? "an image" : "unknown media");
    if (m->kind == PKV_MEDIA_AUDIO && (!m->samples || m->n_samples <= 0 || m->rate != p->info.sample_rate))
        return pkv_err(PKV_ERR_INVALID, "projector '%s': audio must be %d Hz mono with samples (given %d Hz, %lld samples)",
                       p->projector, p->info.sample_rate, m->rate, (long long)m->n_samples);
    if (m->kind == PKV_MEDIA_IMAGE && (!m->rgb || m->width <= 0 || m->height <= 0))
        return pkv_err(PKV_ERR_INVALID, "projector '%s': empty image", p->projector);
    return PKV_OK;
}

pkv_status pkv_mmproj_n_rows(const pkv_mmproj *p, const pkv_media *m, int64_t *n_rows) {
    pkv_status st = check_media(p, m);
    if (st) return st;
    if (!n_rows) return pkv_err(PKV_ERR_INVALID, "pkv_mmproj_n_rows: NULL n_rows");
    return p->n_rows(p, m, n_rows);
}

pkv_status pkv_mmproj_encode(pkv_mmproj *p, const pkv_media *m, float *out, int64_t n_rows) {
    pkv_status st = check_media(p, m);
    if (st) return st;
    int64_t need;
    if ((st = p->n_rows(p, m, &need))) return st;
    if (!out || n_rows != need)
        return pkv_err(PKV_ERR_INVALID, "pkv_mmproj_encode: %lld rows given, the media makes %lld", (long long)n_rows,
                       (long long)need);
    return p->encode(p, m, out, n_rows);
}

struct pkv_mmproj_job {
    pkv_mmproj *p;
    const pkv_media *m;
    float *out;
    int64_t n_rows;
    void *state; /* the encoder's (p->begin), or NULL */
    bool done;
};

pkv_status pkv_mmproj_encode_begin(pkv_mmproj *p, const pkv_media *m, float *out, int64_t n_rows, pkv_mmproj_job **job) {
    if (!job) return pkv_err(PKV_ERR_INVALID, "pkv_mmproj_encode_begin: NULL job");
    *job = NULL;
    pkv_status st = check_media(p, m);
    if (st) return st;
    int64_t need;
    if ((st = p->n_rows(p, m, &need))) return st;
    if (!out || n_rows != need)
        return pkv_err(PKV_ERR_INVALID, "pkv_mmproj_encode_begin: %lld rows given, the media makes %lld",
                       (long long)n_rows, (long long)need);
    pkv_mmproj_job *j = pkv_calloc(1, sizeof *j);
    if (!j) return pkv_err(PKV_ERR_NOMEM, "pkv_mmproj_encode_begin: out of memory");
    *j = (pkv_mmproj_job){.p = p, .m = m, .out = out, .n_rows = n_rows};
    if (p->begin && (st = p->begin(p, m, out, &j->state))) {
        pkv_free(j);
        return st;
    }
    *job = j;
    return PKV_OK;
}

pkv_status pkv_mmproj_encode_step(pkv_mmproj_job *j, bool *done) {
    if (!j || !done) return pkv_err(PKV_ERR_INVALID, "pkv_mmproj_encode_step: NULL argument");
    if (j->done) return *done = true, PKV_OK;
    pkv_status st;
    if (j->p->step) st = j->p->step(j->p, j->state, &j->done);
    else if (!(st = j->p->encode(j->p, j->m, j->out, j->n_rows))) j->done = true;
    if (st) j->done = true; /* a failed encoding is over */
    *done = j->done;
    return st;
}

void pkv_mmproj_job_free(pkv_mmproj_job *j) {
    if (!j) return;
    if (j->state && j->p->end) j->p->end(j->p, j->state);
    pkv_free(j);
}

uint64_t pkv_media_hash(const pkv_media *m) {
    if (!m) return 0;
    uint64_t h = pkv_hash64("pagekv-media-1", 14, (uint64_t)m->kind);
    if (m->kind == PKV_MEDIA_AUDIO) {
        int64_t hdr[2] = {m->n_samples, m->rate};
        h = pkv_hash64(hdr, sizeof hdr, h);
        if (m->samples && m->n_samples > 0) h = pkv_hash64(m->samples, (size_t)m->n_samples * sizeof(float), h);
    } else {
        int64_t hdr[2] = {m->width, m->height};
        h = pkv_hash64(hdr, sizeof hdr, h);
        if (m->rgb && m->width > 0 && m->height > 0) h = pkv_hash64(m->rgb, (size_t)m->width * m->height * 3, h);
    }
    return h;
}
