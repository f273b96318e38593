/* Audio and images in requests (docs/server.md "Audio and images"): chat prompts
 * holding media (content parts input_audio and image_url, parsed by
 * server-media.c) and POST /v1/audio/transcriptions. The media are decoded on the
 * connection thread; the projector (--mmproj) encodes them on the worker thread,
 * one medium per call between engine steps (the projector shares the model's
 * device, which one thread uses at a time); the rows go to the engine as the
 * request's media chunks (pkv_request_params.media). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server-http.h"
#include "server/server-media.h"

/* The projector's rows for a medium of m's shape (arithmetic on the shape; m has
 * no samples or pixels yet: stand-ins pass pkv_mmproj_n_rows's checks, which the
 * row count does not read). */
static int64_t media_rows(const pkv_media *m, void *ud) {
    static const float no_samples[1];
    static const uint8_t no_pixels[3];
    pkv_media shape = *m;
    if (!shape.samples) shape.samples = no_samples;
    if (!shape.rgb) shape.rgb = no_pixels;
    if (shape.width < 1) shape.width = 1;
    if (shape.height < 1) shape.height = 1;
    int64_t n = 0;
    return pkv_mmproj_n_rows(((srv *)ud)->mm, &shape, &n) ? 0 : n;
}

static bool conn_gone(void *ud) { return srv_conn_gone(ud); }

void srv_media_opts_get(srv *s, srv_media_opts *mo, const srv_conn *conn) {
    memset(mo, 0, sizeof *mo);
    if (s->mm && s->mm_info.kind == PKV_MEDIA_AUDIO) mo->audio_rate = s->mm_info.sample_rate;
    if (s->mm && s->mm_info.kind == PKV_MEDIA_IMAGE) mo->images = true;
    mo->lim.max_bytes = s->o.max_media_bytes;
    mo->lim.max_audio_seconds = s->o.max_audio_seconds;
    mo->lim.max_pixels = s->o.max_image_pixels;
    mo->max_request_audio_seconds = s->o.max_request_audio_seconds;
    mo->max_request_pixels = s->o.max_request_pixels;
    if (s->mm) {
        mo->rows = media_rows;
        mo->rows_ud = s;
        mo->n_ctx = s->n_ctx;
    }
    if (conn) {
        mo->gone = conn_gone;
        mo->gone_ud = (void *)conn;
    }
}

/* ids += tokens of text (template text: special tokens parsed). */
static bool append_tokens(srv *s, int32_t **ids, int *n, int *cap, const int32_t *t, int k, srv_out *o) {
    if (*n + k > *cap) {
        int nc = (*n + k) * 2 + 16;
        int32_t *g = realloc(*ids, (size_t)nc * sizeof *g);
        if (!g) {
            srv_error(o, 500, "out of memory");
            return false;
        }
        *ids = g;
        *cap = nc;
    }
    (void)s;
    memcpy(*ids + *n, t, (size_t)k * sizeof *t);
    *n += k;
    return true;
}

static bool append_text(srv *s, int32_t **ids, int *n, int *cap, const char *text, bool add_special, bool parse_special,
                        srv_out *o) {
    int32_t *t = NULL;
    int k = 0;
    if (!srv_tokenize(s, text, strlen(text), add_special, parse_special, &t, &k, o)) return false;
    bool ok = append_tokens(s, ids, n, cap, t, k, o);
    free(t);
    return ok;
}

/* ------------------------------------------------------- encoder cache */

/* Encoder outputs by media key (pkv_media_key: the content hash and the
 * projector's fingerprint), most recently used first. Connection threads look up,
 * the worker inserts: a mutex guards it all. Rows are copied in and out, so no
 * request holds a pointer into the cache. */
typedef struct mc_entry {
    uint64_t key;
    int32_t n_rows;
    size_t bytes;
    float *rows;
    struct mc_entry *prev, *next;
} mc_entry;

struct srv_media_cache {
    pthread_mutex_t mu;
    mc_entry *head, *tail;
    size_t bytes, max_bytes;
    uint64_t hits, misses, evictions, entries;
};

struct srv_media_cache *srv_media_cache_new(size_t max_bytes) {
    struct srv_media_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->max_bytes = max_bytes;
    return c;
}

static void mc_unlink(struct srv_media_cache *c, mc_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void mc_push_front(struct srv_media_cache *c, mc_entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

void srv_media_cache_free(struct srv_media_cache *c) {
    if (!c) return;
    for (mc_entry *e = c->head, *n; e; e = n) {
        n = e->next;
        free(e->rows);
        free(e);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void srv_media_cache_get_stats(struct srv_media_cache *c, srv_media_cache_stats *st) {
    memset(st, 0, sizeof *st);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    *st = (srv_media_cache_stats){.hits = c->hits, .misses = c->misses, .evictions = c->evictions, .bytes = c->bytes,
                                  .max_bytes = c->max_bytes, .entries = c->entries};
    pthread_mutex_unlock(&c->mu);
}

/* A copy of the rows under key (malloc'd) or NULL: not there, or no memory for
 * the copy (then encoded again). Counts a hit or a miss (with max_bytes 0 every
 * medium is a miss: the counters still count the media encoded). */
static float *mc_get(struct srv_media_cache *c, uint64_t key, int32_t n_rows, size_t bytes) {
    if (!c) return NULL;
    float *out = NULL;
    pthread_mutex_lock(&c->mu);
    mc_entry *e = c->head;
    while (e && !(e->key == key && e->n_rows == n_rows && e->bytes == bytes)) e = e->next;
    if (e && (out = malloc(bytes ? bytes : 1))) {
        memcpy(out, e->rows, bytes);
        mc_unlink(c, e);
        mc_push_front(c, e);
        c->hits++;
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->mu);
    return out;
}

/* Keep a copy of rows under key, dropping the least recently used past the size
 * (rows larger than the whole cache are not kept). Out of memory: not kept. */
static void mc_put(struct srv_media_cache *c, uint64_t key, int32_t n_rows, const float *rows, size_t bytes) {
    if (!c || bytes > c->max_bytes) return; /* (max_bytes 0: none kept) */
    mc_entry *e = calloc(1, sizeof *e);
    float *copy = malloc(bytes ? bytes : 1);
    if (!e || !copy) {
        free(e);
        free(copy);
        return;
    }
    memcpy(copy, rows, bytes);
    *e = (mc_entry){.key = key, .n_rows = n_rows, .bytes = bytes, .rows = copy};
    pthread_mutex_lock(&c->mu);
    for (mc_entry *x = c->head; x; x = x->next)
        if (x->key == key && x->n_rows == n_rows) { /* put by another request meanwhile */
            pthread_mutex_unlock(&c->mu);
            free(copy);
            free(e);
            return;
        }
    while (c->tail && c->bytes + bytes > c->max_bytes) {
        mc_entry *old = c->tail;
        mc_unlink(c, old);
        c->bytes -= old->bytes;
        c->entries--;
        c->evictions++;
        free(old->rows);
        free(old);
    }
    mc_push_front(c, e);
    c->bytes += bytes;
    c->entries++;
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------- encoding */

typedef struct enc_call {
    srv *s;
    const srv_conn *conn; /* its client: gone = stop */
    bool gone;
    const srv_media_list *ml;
    srv_req *r;
    int i;
    pkv_mmproj_job *job; /* medium i's encoding under way */
    double resume_at;    /* while the engine has work, no slice before this (monotonic seconds) */
    float *e;            /* its rows */
    pkv_status st;
    char err[512];
} enc_call;

static void enc_drop(enc_call *k) {
    pkv_mmproj_job_free(k->job);
    free(k->e);
    k->job = NULL;
    k->e = NULL;
}

/* On the worker: one slice of the media's encoding per call (an audio window, an
 * image), so engine steps of other requests go on between slices; media that
 * came from the cache are skipped. */
static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static bool enc_run(srv_gen *g, void *arg) {
    enc_call *k = arg;
    /* while other requests run, the encoder takes at most half the worker's time:
     * after a slice of dt seconds, engine steps alone for dt */
    const double t0 = mono_s();
    if (t0 < k->resume_at && srv_gen_busy(g)) return false;
    if (srv_conn_gone(k->conn)) { /* nobody waits for the rest */
        enc_drop(k);
        k->gone = true;
        return true;
    }
    if (!k->job) {
        while (k->i < k->ml->n && k->r->media[k->i].embd) k->i++; /* from the cache */
        if (k->i >= k->ml->n) return true;
        const pkv_media_rows *mr = &k->r->media[k->i];
        const size_t bytes = (size_t)mr->n_rows * (size_t)k->s->mm_info.n_embd * sizeof(float);
        if (!(k->e = malloc(bytes ? bytes : 1))) {
            k->st = PKV_ERR_NOMEM;
            snprintf(k->err, sizeof k->err, "out of memory for %d rows of the projector's output", mr->n_rows);
            return true;
        }
        k->st = pkv_mmproj_encode_begin(k->s->mm, &k->ml->items[k->i].m, k->e, mr->n_rows, &k->job);
        if (k->st) {
            snprintf(k->err, sizeof k->err, "encoding medium %d failed: %s", k->i + 1, pkv_errmsg());
            enc_drop(k);
            return true;
        }
    }
    bool done = false;
    k->st = pkv_mmproj_encode_step(k->job, &done);
    const double t1 = mono_s();
    k->resume_at = t1 + (t1 - t0);
    if (k->st) {
        snprintf(k->err, sizeof k->err, "encoding medium %d failed: %s", k->i + 1, pkv_errmsg());
        enc_drop(k);
        return true;
    }
    if (!done) return false; /* the next slice after an engine step */
    pkv_mmproj_job_free(k->job);
    k->job = NULL;
    pkv_media_rows *mr = &k->r->media[k->i];
    const size_t bytes = (size_t)mr->n_rows * (size_t)k->s->mm_info.n_embd * sizeof(float);
    mc_put(k->s->mcache, mr->key, mr->n_rows, k->e, bytes);
    mr->embd = k->e;
    k->e = NULL;
    k->i++;
    while (k->i < k->ml->n && k->r->media[k->i].embd) k->i++;
    return k->i >= k->ml->n;
}

/* Row counts and keys of every medium (on this thread: pkv_mmproj_n_rows is
 * arithmetic), then the encoding on the worker. */
static bool encode_media(srv *s, const srv_media_list *ml, srv_req *r, const int32_t *at, const srv_conn *conn,
                         srv_out *o) {
    r->media = calloc((size_t)ml->n, sizeof *r->media);
    if (!r->media) {
        srv_error(o, 500, "out of memory");
        return false;
    }
    r->n_media = ml->n;
    int64_t total = r->n_prompt;
    for (int i = 0; i < ml->n; i++) {
        int64_t nr = 0;
        pkv_status st = pkv_mmproj_n_rows(s->mm, &ml->items[i].m, &nr);
        if (st || nr < 1 || nr > INT32_MAX) {
            srv_error(o, 400, "medium %d: %s", i + 1, st ? pkv_errmsg() : "the projector makes no rows for it");
            return false;
        }
        pkv_media_rows *mr = &r->media[i];
        mr->n_rows = (int32_t)nr;
        mr->key = pkv_media_key(pkv_media_hash(&ml->items[i].m), s->mm_info.fingerprint);
        mr->non_causal = s->mm_info.non_causal;
        mr->at = at[i];
        if (ml->items[i].m.kind == PKV_MEDIA_AUDIO) r->media_rows_audio += (int)nr;
        else r->media_rows_image += (int)nr;
        total += nr;
    }
    if (total >= s->n_ctx) {
        srv_error(o, 400, "the prompt has %lld positions (%d text tokens, %d audio and %d image rows); the context "
                          "holds %lld (start the server with a larger -c)",
                  (long long)total, r->n_prompt, r->media_rows_audio, r->media_rows_image, (long long)s->n_ctx);
        return false;
    }
    /* media encoded before (by content) come from the cache: not encoded again */
    bool all = true;
    for (int i = 0; i < ml->n; i++) {
        pkv_media_rows *mr = &r->media[i];
        mr->embd = mc_get(s->mcache, mr->key, mr->n_rows, (size_t)mr->n_rows * (size_t)s->mm_info.n_embd * sizeof(float));
        all = all && mr->embd;
    }
    if (all) return true;
    enc_call k = {.s = s, .conn = conn, .ml = ml, .r = r};
    srv_gen_call(s->g, enc_run, &k);
    if (k.gone) {
        pthread_mutex_lock(&s->mu);
        s->disconnects++;
        pthread_mutex_unlock(&s->mu);
        srv_error(o, 499, "the client went away while its media were encoded");
        return false;
    }
    if (k.st) {
        srv_error(o, k.st == PKV_ERR_NOMEM ? 500 : 400, "%s", k.err);
        return false;
    }
    return true;
}

/* ------------------------------------------------------------ chat */

bool srv_media_chat_prompt(srv *s, const char *text, size_t len, const size_t *spans, size_t n_spans,
                           srv_media_list *ml, srv_req *r, const srv_conn *conn, srv_out *o) {
    size_t *at_text = malloc((size_t)ml->n * sizeof *at_text);
    int32_t *at = malloc((size_t)ml->n * sizeof *at), *ids = NULL, *t = NULL;
    size_t *sp = malloc((n_spans ? n_spans : 1) * 2 * sizeof *sp);
    int n = 0, cap = 0;
    bool ok = false;
    if (!at_text || !at || !sp) {
        srv_error(o, 500, "out of memory");
        goto out;
    }
    if (!srv_media_find_markers(text, len, ml->marker, at_text, ml->n)) {
        srv_error(o, 400, "the chat template did not render each of the %d media parts once: this model's template "
                          "cannot place them", ml->n);
        goto out;
    }
    /* the text the projector's model puts around a medium's rows (pkv_mmproj_info) */
    const char *before = s->mm_info.text_before, *after = s->mm_info.text_after;
    const size_t mlen = strlen(ml->marker);
    size_t pos = 0;
    for (int i = 0; i <= ml->n; i++) {
        const size_t end = i < ml->n ? at_text[i] : len;
        /* the data spans inside [pos, end), moved to the piece's offsets */
        size_t ns = 0;
        for (size_t j = 0; j < n_spans; j++) {
            size_t a = spans[2 * j], b = spans[2 * j + 1];
            if (b <= pos || a >= end) continue;
            sp[2 * ns] = (a < pos ? pos : a) - pos;
            sp[2 * ns + 1] = (b > end ? end : b) - pos;
            ns++;
        }
        int k = 0;
        if (!srv_tokenize_part(s, text + pos, end - pos, i == 0, sp, ns, &t, &k, o)) goto out;
        if (!append_tokens(s, &ids, &n, &cap, t, k, o)) goto out;
        free(t);
        t = NULL;
        if (i == ml->n) break;
        if (*before && !append_text(s, &ids, &n, &cap, before, false, true, o)) goto out;
        at[i] = n;
        if (*after && !append_text(s, &ids, &n, &cap, after, false, true, o)) goto out;
        pos = end + mlen;
    }
    r->prompt = ids;
    r->n_prompt = n;
    ids = NULL;
    ok = encode_media(s, ml, r, at, conn, o);
out:
    free(t);
    free(ids);
    free(at);
    free(at_text);
    free(sp);
    return ok;
}

/* ------------------------------------------------------ transcriptions */

/* The form fields taken, as OpenAI's endpoint names them. */
static const char *const k_tr_fields[] = {"file", "model", "language", "prompt", "response_format", "temperature",
                                          "stream", NULL};

/* A form field's value as a NUL-terminated string (at most cap - 1 bytes). */
static bool field_str(const srv_part *p, char *buf, size_t cap, srv_out *o) {
    if (p->len >= cap || memchr(p->data, 0, p->len)) {
        srv_error(o, 400, "the form field '%.*s' is too long or holds a NUL byte", (int)p->name_len, p->name);
        return false;
    }
    memcpy(buf, p->data, p->len);
    buf[p->len] = 0;
    return true;
}

/* The special token text must be one token of the vocabulary. */
static bool one_token(srv *s, const char *text) {
    int32_t ids[4];
    size_t n = 0;
    return pkv_model_tokenize(s->m, text, strlen(text), false, true, ids, 4, &n) == PKV_OK && n == 1;
}

void srv_api_transcriptions(srv *s, const char *body, size_t len, const srv_conn *conn, srv_out *o) {
    if (!s->mm || s->mm_info.kind != PKV_MEDIA_AUDIO)
        return srv_error(o, 400, "this server takes no audio: start it with --mmproj FILE, an audio projector such as "
                                 "Voxtral's");
    static const char *const need[] = {"[INST]", "[/INST]", "[BEGIN_AUDIO]", "[TRANSCRIBE]"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!one_token(s, need[i]))
            return srv_error(o, 400, "the model cannot transcribe: its vocabulary has no %s token (the transcription "
                                     "prompt is Voxtral's: [INST][BEGIN_AUDIO] audio [/INST]lang:xx[TRANSCRIBE])",
                             need[i]);
    srv_part parts[SRV_MULTIPART_MAX_PARTS];
    int np = 0;
    char err[512];
    if (!srv_multipart_parse(conn ? conn->content_type : NULL, body, len, parts, SRV_MULTIPART_MAX_PARTS, &np, err,
                             sizeof err))
        return srv_error(o, 400, "malformed upload: %s", err);
    for (int i = 0; i < np; i++) {
        bool known = false;
        for (int k = 0; k_tr_fields[k]; k++)
            known |= parts[i].name_len == strlen(k_tr_fields[k]) && !memcmp(parts[i].name, k_tr_fields[k], parts[i].name_len);
        if (!known && !s->o.lenient_fields)
            return srv_error(o, 400, "unsupported form field '%.*s' (taken: file, model, language, prompt, "
                                     "response_format json|text, temperature)",
                             (int)(parts[i].name_len > 64 ? 64 : parts[i].name_len), parts[i].name);
    }
    const srv_part *file = srv_part_find(parts, np, "file"), *p;
    if (!file) return srv_error(o, 400, "no 'file' field: upload the audio as the form's file");
    if (file->len > s->o.max_media_bytes)
        return srv_error(o, 413, "the uploaded file is %zu bytes, more than the limit of %zu bytes (--max-media-bytes)",
                         file->len, s->o.max_media_bytes);
    char lang[8] = "", fmt[16] = "json", v[64];
    if ((p = srv_part_find(parts, np, "language")) && p->len) {
        if (p->len < 2 || p->len > 3) return srv_error(o, 400, "'language' must be an ISO-639-1 code such as 'en'");
        for (size_t i = 0; i < p->len; i++)
            if (!islower((unsigned char)p->data[i])) return srv_error(o, 400, "'language' must be an ISO-639-1 code such as 'en'");
        memcpy(lang, p->data, p->len);
        lang[p->len] = 0;
    }
    if ((p = srv_part_find(parts, np, "response_format"))) {
        if (!field_str(p, fmt, sizeof fmt, o)) return;
        if (strcmp(fmt, "json") && strcmp(fmt, "text"))
            return srv_error(o, 400, "response_format '%s' is not supported (json, text)", fmt);
    }
    double temp = 0;
    if ((p = srv_part_find(parts, np, "temperature"))) {
        char *e;
        if (!field_str(p, v, sizeof v, o)) return;
        temp = strtod(v, &e);
        if (e == v || *e || !(temp >= 0 && temp <= 2)) return srv_error(o, 400, "'temperature' must be a number in [0, 2]");
    }
    if ((p = srv_part_find(parts, np, "stream"))) {
        if (!field_str(p, v, sizeof v, o)) return;
        if (strcmp(v, "false")) return srv_error(o, 400, "streamed transcriptions are not supported ('stream' must be false)");
    }
    /* 'model' names the model as elsewhere (any value is served by this model);
     * 'prompt' is taken and not used: Voxtral's transcription prompt has no place
     * for one (as in vLLM). */

    srv_media_opts mo;
    srv_media_opts_get(s, &mo, conn);
    srv_media_list ml = {0};
    ml.items = calloc(1, sizeof *ml.items);
    if (!ml.items) return srv_error(o, 500, "out of memory");
    float *smp = NULL;
    int64_t ns = 0;
    /* the header's length against the limits first: nothing decoded over them */
    pkv_media_probe_info pi;
    pkv_status st = pkv_media_probe(file->data, file->len, PKV_MEDIA_AUDIO, &pi);
    const bool by_request = mo.max_request_audio_seconds > 0 && mo.max_request_audio_seconds < mo.lim.max_audio_seconds;
    const double max_s = by_request ? mo.max_request_audio_seconds : mo.lim.max_audio_seconds;
    const char *opt = by_request ? "--max-request-audio-seconds" : "--max-audio-seconds";
    if (!st && max_s > 0 && pi.seconds > max_s) {
        free(ml.items);
        return srv_error(o, 400, "the uploaded file: its header says %.1f s of audio, more than the limit of %g s (%s)",
                         pi.seconds, max_s, opt);
    }
    if (!st && pi.seconds > 0) {
        pkv_media shape = {.kind = PKV_MEDIA_AUDIO, .rate = mo.audio_rate, .n_samples = (int64_t)(pi.seconds * mo.audio_rate)};
        const int64_t rows = media_rows(&shape, s);
        if (rows >= s->n_ctx) {
            free(ml.items);
            return srv_error(o, 400, "the uploaded file takes at least %lld positions; the context holds %lld (start "
                             "the server with a larger -c, or send less)", (long long)rows, (long long)s->n_ctx);
        }
    }
    if (max_s > 0) mo.lim.max_audio_seconds = max_s;
    if (!st) st = pkv_audio_decode(file->data, file->len, mo.audio_rate, &mo.lim, &smp, &ns);
    if (st) {
        free(ml.items);
        return srv_error(o, st == PKV_ERR_NOMEM ? 500 : 400, "the uploaded file: %s", pkv_errmsg());
    }
    ml.items[0].m = (pkv_media){.kind = PKV_MEDIA_AUDIO, .samples = smp, .n_samples = ns, .rate = mo.audio_rate};
    ml.n = 1;

    srv_req *r = srv_req_new(1);
    int32_t *ids = NULL;
    int n = 0, cap = 0;
    if (!r) {
        srv_error(o, 500, "out of memory");
        goto out;
    }
    /* mistral-common's instruct transcription: <s>[INST][BEGIN_AUDIO] audio [/INST]lang:xx[TRANSCRIBE]
     * (lang:xx only with a language; its text tokenized as text) */
    if (!append_text(s, &ids, &n, &cap, "[INST][BEGIN_AUDIO]", true, true, o)) goto out;
    int32_t at = n;
    if (!append_text(s, &ids, &n, &cap, "[/INST]", false, true, o)) goto out;
    if (*lang) {
        char lt[16];
        snprintf(lt, sizeof lt, "lang:%s", lang);
        if (!append_text(s, &ids, &n, &cap, lt, false, false, o)) goto out;
    }
    if (!append_text(s, &ids, &n, &cap, "[TRANSCRIBE]", false, true, o)) goto out;
    r->prompt = ids;
    r->n_prompt = n;
    ids = NULL;
    r->sp = pkv_sampler_default_params();
    r->sp.temp = (float)temp;
    r->sp.seed = s->o.seed >= 0 ? (uint64_t)s->o.seed : (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)(uintptr_t)r;
    r->max_tokens = (int)(s->n_ctx > INT32_MAX ? INT32_MAX : s->n_ctx); /* cut to the room left by the worker */
    /* no chat template here: it ends at the model's end-of-generation tokens */
    if (!encode_media(s, &ml, r, &at, conn, o)) goto out;
    char id[64];
    srv_next_id(s, "trsc", id, sizeof id);
    if (!srv_submit_and_wait(s, r, -1, false, false, id, conn, o)) goto out;
    const srv_choice *c = &r->ch[0];
    size_t tl = 0;
    char *txt = pkv_utf8_sanitize(c->text ? c->text : "", c->len, &tl);
    if (!txt) {
        srv_error(o, 500, "out of memory");
        goto out;
    }
    /* leading/trailing whitespace the model put around the text is not part of it */
    size_t a = 0, b = tl;
    while (a < b && isspace((unsigned char)txt[a])) a++;
    while (b > a && isspace((unsigned char)txt[b - 1])) b--;
    if (!strcmp(fmt, "text")) {
        o->text = malloc(b - a + 2);
        if (!o->text) {
            free(txt);
            srv_error(o, 500, "out of memory");
            goto out;
        }
        memcpy(o->text, txt + a, b - a);
        o->text[b - a] = '\n';
        o->text[b - a + 1] = 0;
        o->ctype = "text/plain; charset=utf-8";
        o->status = 200;
    } else {
        const int in = r->n_prompt + r->media_rows_audio;
        o->json = json_pack("{s:s%,s:{s:s,s:i,s:{s:i,s:i},s:i,s:i}}", "text", txt + a, b - a, "usage", "type",
                            "tokens", "input_tokens", in, "input_token_details", "text_tokens", r->n_prompt,
                            "audio_tokens", r->media_rows_audio, "output_tokens", c->n_toks, "total_tokens",
                            in + c->n_toks);
        if (!o->json) srv_error(o, 500, "out of memory");
        else o->status = 200;
    }
    free(txt);
out:
    free(ids);
    srv_req_release(r);
    srv_media_list_free(&ml);
}
