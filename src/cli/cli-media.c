/* Media options of the model commands (run, logits, demo): --mmproj, --audio,
 * --image, --media-at, --embd-out; files decoded (pkv_audio_decode,
 * pkv_image_decode), encoded by the projector and turned into chunks of rows
 * (pkv_media_rows). docs/multimodal.md, "Media in the cache". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "cli/cli-media.h"

int pkv_cli_media_opt(int argc, char **argv, int *i, pkv_cli_media *o) {
    const char *a = argv[*i], *v;
    long long x;
    if (!strcmp(a, "--mmproj")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        o->mmproj = v;
    } else if (!strcmp(a, "--audio") || !strcmp(a, "--image")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        if (o->n >= PKV_CLI_MAX_MEDIA) {
            fprintf(stderr, "pagekv: at most %d --audio/--image files\n", PKV_CLI_MAX_MEDIA);
            return -1;
        }
        o->path[o->n] = v;
        o->kind[o->n] = a[2] == 'a' ? PKV_MEDIA_AUDIO : PKV_MEDIA_IMAGE;
        o->at[o->n] = -1;
        o->n++;
    } else if (!strcmp(a, "--media-at")) {
        if (!(v = pkv_cli_value(argc, argv, i)) || !pkv_cli_int(a, v, 0, INT32_MAX, &x)) return -1;
        if (o->n_at >= PKV_CLI_MAX_MEDIA) {
            fprintf(stderr, "pagekv: at most %d --media-at values\n", PKV_CLI_MAX_MEDIA);
            return -1;
        }
        o->at_arg[o->n_at++] = (int32_t)x;
    } else if (!strcmp(a, "--embd-out")) {
        if (!(v = pkv_cli_value(argc, argv, i))) return -1;
        o->embd_out = v;
    } else {
        return 0;
    }
    return 1;
}

bool pkv_cli_media_check(const char *cmd, const pkv_cli_media *o) {
    if (o->n && !o->mmproj) {
        fprintf(stderr, "pagekv %s: --audio/--image need the projector file: --mmproj FILE\n", cmd);
        return false;
    }
    if (!o->n && (o->mmproj || o->n_at || o->embd_out)) {
        fprintf(stderr, "pagekv %s: --mmproj, --media-at and --embd-out go with --audio FILE or --image FILE\n", cmd);
        return false;
    }
    if (o->n_at > o->n) {
        fprintf(stderr, "pagekv %s: %d --media-at values for %d media files\n", cmd, o->n_at, o->n);
        return false;
    }
    return true;
}

/* The whole file, at most max bytes. */
static uint8_t *read_file(const char *cmd, const char *path, size_t max, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "pagekv %s: cannot open %s\n", cmd, path);
        return NULL;
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 1 << 16;
            if (nc > max + 1) nc = max + 1;
            uint8_t *b = nc > cap ? realloc(buf, nc) : NULL;
            if (!b) {
                fprintf(stderr, "pagekv %s: %s is larger than %zu bytes (or out of memory)\n", cmd, path, max);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = b;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (!got) break;
    }
    fclose(f);
    *size = n;
    return buf;
}

pkv_status pkv_cli_media_decode(const char *cmd, const char *path, pkv_media_kind kind, int rate, pkv_cli_decoded *d) {
    memset(d, 0, sizeof *d);
    size_t size = 0;
    uint8_t *data = read_file(cmd, path, (size_t)64 << 20, &size);
    if (!data) return PKV_ERR_IO;
    pkv_status s;
    d->m.kind = kind;
    if (kind == PKV_MEDIA_AUDIO) {
        s = pkv_audio_decode(data, size, rate, NULL, &d->samples, &d->m.n_samples);
        d->m.samples = d->samples;
        d->m.rate = rate;
    } else {
        s = pkv_image_decode(data, size, NULL, &d->rgb, &d->m.width, &d->m.height);
        d->m.rgb = d->rgb;
    }
    free(data);
    if (s) fprintf(stderr, "pagekv %s: %s: %s: %s\n", cmd, path, pkv_status_str(s), pkv_errmsg());
    return s;
}

void pkv_cli_decoded_free(pkv_cli_decoded *d) {
    pkv_media_free(d->samples);
    pkv_media_free(d->rgb);
    memset(d, 0, sizeof *d);
}

pkv_status pkv_cli_media_rows(const char *cmd, pkv_mmproj *p, const pkv_media *m, pkv_media_rows *out, float **embd) {
    pkv_mmproj_info info;
    int64_t n = 0;
    pkv_status s = pkv_mmproj_get_info(p, &info);
    if (!s) s = pkv_mmproj_n_rows(p, m, &n);
    if (!s && (n < 1 || n > INT32_MAX)) s = pkv_err(PKV_ERR_INVALID, "the projector makes %lld rows", (long long)n);
    *embd = NULL;
    if (!s && !(*embd = malloc((size_t)n * (size_t)info.n_embd * sizeof **embd)))
        s = pkv_err(PKV_ERR_NOMEM, "%lld rows of %d", (long long)n, info.n_embd);
    if (!s) s = pkv_mmproj_encode(p, m, *embd, n);
    if (s) {
        free(*embd);
        *embd = NULL;
        fprintf(stderr, "pagekv %s: encode: %s: %s\n", cmd, pkv_status_str(s), pkv_errmsg());
        return s;
    }
    *out = (pkv_media_rows){.key = pkv_media_key(pkv_media_hash(m), info.fingerprint), .n_rows = (int32_t)n,
                            .embd = *embd, .non_causal = info.non_causal};
    return PKV_OK;
}

pkv_status pkv_cli_media_encode(const char *cmd, pkv_model *model, const pkv_cli_media *o, pkv_cli_encoded *e) {
    memset(e, 0, sizeof *e);
    if (!o->n) return PKV_OK;
    e->p = pkv_mmproj_load(o->mmproj, model, pkv_model_device(model));
    if (!e->p) {
        fprintf(stderr, "pagekv %s: --mmproj %s: %s\n", cmd, o->mmproj, pkv_errmsg());
        return PKV_ERR_INVALID;
    }
    pkv_mmproj_get_info(e->p, &e->info);
    pkv_wfile wf;
    FILE *out = NULL;
    if (o->embd_out) {
        if (pkv_wfile_open(&wf, o->embd_out)) {
            fprintf(stderr, "pagekv %s: --embd-out: %s\n", cmd, pkv_errmsg());
            return PKV_ERR_IO;
        }
        out = wf.f;
    }
    pkv_status s = PKV_OK;
    for (int i = 0; i < o->n && !s; i++) {
        if (o->kind[i] != e->info.kind) {
            fprintf(stderr, "pagekv %s: %s is %s, but the projector %s encodes %s\n", cmd, o->path[i],
                    o->kind[i] == PKV_MEDIA_AUDIO ? "audio (--audio)" : "an image (--image)", o->mmproj,
                    e->info.kind == PKV_MEDIA_AUDIO ? "audio" : "images");
            s = PKV_ERR_INVALID;
            break;
        }
        pkv_cli_decoded d;
        if ((s = pkv_cli_media_decode(cmd, o->path[i], o->kind[i], e->info.sample_rate, &d))) break;
        s = pkv_cli_media_rows(cmd, e->p, &d.m, &e->rows[i], &e->embd[i]);
        pkv_cli_decoded_free(&d);
        if (s) break;
        e->rows[i].at = i < o->n_at ? o->at_arg[i] : o->at[i] >= 0 ? o->at[i] : 0;
        e->n++;
        fprintf(stderr, "pagekv %s: %s: %d rows (%s projector, key %016llx%s)\n", cmd, o->path[i], e->rows[i].n_rows,
                e->info.projector, (unsigned long long)e->rows[i].key, e->rows[i].non_causal ? ", non-causal" : "");
        /* --embd-out: raw little-endian float32 rows [n_rows][n_embd], each file's in order */
        size_t nf = (size_t)e->rows[i].n_rows * (size_t)e->info.n_embd;
        if (out && fwrite(e->embd[i], sizeof(float), nf, out) != nf) {
            fprintf(stderr, "pagekv %s: --embd-out %s: write failed\n", cmd, o->embd_out);
            s = PKV_ERR_IO;
        }
    }
    if (out) {
        if (s) pkv_wfile_abort(&wf);
        else if (pkv_wfile_commit(&wf)) {
            fprintf(stderr, "pagekv %s: --embd-out: %s\n", cmd, pkv_errmsg());
            s = PKV_ERR_IO;
        } else {
            int64_t rows = 0;
            for (int i = 0; i < e->n; i++) rows += e->rows[i].n_rows;
            fprintf(stderr, "pagekv %s: wrote %lld rows x %d float32 (raw, little-endian, row-major) to %s\n", cmd,
                    (long long)rows, e->info.n_embd, o->embd_out);
        }
    }
    return s;
}

void pkv_cli_encoded_free(pkv_cli_encoded *e) {
    for (int i = 0; i < PKV_CLI_MAX_MEDIA; i++) free(e->embd[i]);
    pkv_mmproj_free(e->p);
    memset(e, 0, sizeof *e);
}

/* Tokenize one piece of the prompt (special tokens parsed: the prompt of a media
 * run is the user's own markup, as llama.cpp's mtmd-cli takes it), appending. */
static pkv_status tok_piece(pkv_model *m, const char *s, size_t len, bool bos, int32_t **toks, size_t *n, size_t *cap) {
    size_t need = 0;
    pkv_status st = pkv_model_tokenize(m, s, len, bos, true, NULL, 0, &need);
    if (st && st != PKV_ERR_INVALID) return st;
    if (*n + need + 1 > *cap) {
        size_t nc = (*n + need + 1) * 2;
        int32_t *t = realloc(*toks, nc * sizeof *t);
        if (!t) return pkv_err(PKV_ERR_NOMEM, "tokenize");
        *toks = t;
        *cap = nc;
    }
    size_t got = 0;
    if ((st = pkv_model_tokenize(m, s, len, bos, true, *toks + *n, *cap - *n, &got))) return st;
    *n += got;
    return PKV_OK;
}

pkv_status pkv_cli_media_prompt(pkv_model *m, const char *prompt, pkv_cli_encoded *e, int32_t **toks, size_t *n) {
    static const char marker[] = "<__media__>";
    const size_t ml = sizeof marker - 1;
    size_t cap = 0;
    *toks = NULL;
    *n = 0;
    int markers = 0;
    for (const char *p = strstr(prompt, marker); p; p = strstr(p + ml, marker)) markers++;
    if (markers && markers != e->n)
        return pkv_err(PKV_ERR_INVALID, "the prompt has %d %s markers for %d media files", markers, marker, e->n);
    /* each medium between the text its projector's model expects, as llama.cpp's mtmd
     * puts it (pkv_mmproj_info: gemma3 <start_of_image> ... <end_of_image>; voxtral
     * [BEGIN_AUDIO] ...) */
    const char *before = e->info.text_before ? e->info.text_before : "";
    const char *after = e->info.text_after ? e->info.text_after : "";
    const char *p = prompt;
    pkv_status st = PKV_OK;
    for (int i = 0; i <= e->n && !st; i++) {
        const char *q = i < e->n && markers ? strstr(p, marker) : i < e->n ? p : p + strlen(p);
        /* without markers every file goes before the text, in order (after BOS) */
        st = tok_piece(m, p, (size_t)(q - p), i == 0, toks, n, &cap);
        if (!st && i < e->n && *before) st = tok_piece(m, before, strlen(before), false, toks, n, &cap);
        if (st || i == e->n) break;
        e->rows[i].at = (int32_t)*n;
        if (*after) st = tok_piece(m, after, strlen(after), false, toks, n, &cap);
        p = markers ? q + ml : p;
    }
    if (st) {
        free(*toks);
        *toks = NULL;
    }
    return st;
}
