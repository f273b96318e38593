/* pagekv demo --mmproj P --audio|--image FILE: every KV operation with a media
 * prefix, checked against a replay from scratch (docs/multimodal.md, "Media in the cache"). The
 * prompt is text, the file's projector rows, text; each check prints a row:
 *   media-fork   fork after the media prefix, continue == the same from scratch
 *   media-prefix a prefix-cache hit on the same media == cold
 *   media-miss   the same media with one sample/pixel changed: no hit past the text
 *   media-trunc  truncate into the chunk: back to its start; decoded again == replay
 *   media-shift  a cut through the chunk refused; every position moved by 3: the
 *                continuation within rounding of the unmoved one (RoPE is relative)
 *   media-swap   swap out and in: continuation bit for bit
 *   media-save   save and load: the chunk named in the file, continuation equal */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli-media.h"
#include "cli/cli.h"
#include "cli/commands.h"

enum { MD_GEN = 8 };

typedef struct md {
    pkv_model *m;
    pkv_kv_cache *c;
    const char *dev;
    int V;
    bool exact; /* batch-invariant device: every comparison bitwise */
    int failed, rows;
    int32_t *a, *b; /* text before and after the media */
    size_t na, nb;
    pkv_media_rows ch; /* the chunk, at = na */
} md;

static void md_row(md *d, const char *op, bool ok, const char *fmt, ...) {
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    printf("%-12s %-18s %-5s  %s\n", op, d->dev, ok ? "pass" : "FAIL", detail);
    fflush(stdout);
    d->rows++;
    if (!ok) d->failed++;
}

static double nmse(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = (double)a[i] - (double)b[i];
        num += x * x;
        den += (double)a[i] * (double)a[i];
    }
    return den > 0 ? num / den : num;
}

/* Greedy continuation: the logits before each of n steps into lg [n][V]. */
static pkv_status greedy(md *d, pkv_context *ctx, int n, float *lg) {
    for (int i = 0; i < n; i++) {
        const float *l = pkv_context_logits(ctx);
        if (!l) return pkv_err(PKV_ERR_INVALID, "no logits");
        memcpy(lg + (size_t)i * (size_t)d->V, l, (size_t)d->V * sizeof *lg);
        int32_t t = 0;
        for (int v = 1; v < d->V; v++)
            if (l[v] > l[t]) t = v;
        pkv_status s = pkv_context_decode(ctx, &t, 1);
        if (s) return s;
    }
    return PKV_OK;
}

/* Compare two continuations: bitwise, or (a device that is not batch-invariant,
 * when the steps differ in shape) within nmse 1e-6. */
static bool close_enough(md *d, const float *x, const float *y, bool same_shape, char *what, size_t wn) {
    size_t n = (size_t)MD_GEN * (size_t)d->V;
    if (!memcmp(x, y, n * sizeof *x)) {
        snprintf(what, wn, "%d steps of logits bit-identical", MD_GEN);
        return true;
    }
    double e = nmse(x, y, n);
    snprintf(what, wn, "logits differ: nmse %.3g", e);
    return !same_shape && !d->exact && e <= 1e-6;
}

/* A fresh context holding the text before the media, the chunk, and (with_b) the
 * text after it, in one step. */
static pkv_context *fresh(md *d, bool with_b, pkv_status *s) {
    pkv_context *ctx = pkv_context_create(d->m, d->c, 0);
    if (!ctx) {
        *s = PKV_ERR_NOMEM;
        return NULL;
    }
    int32_t *t = malloc((d->na + d->nb + 1) * sizeof *t);
    memcpy(t, d->a, d->na * sizeof *t);
    if (with_b) memcpy(t + d->na, d->b, d->nb * sizeof *t);
    *s = pkv_context_decode_prompt(ctx, t, (int32_t)(d->na + (with_b ? d->nb : 0)), &d->ch, 1);
    free(t);
    if (*s) {
        pkv_context_free(ctx);
        return NULL;
    }
    return ctx;
}

static void media_checks(md *d, const pkv_media *med, uint64_t fp) {
    const size_t L = (size_t)MD_GEN * (size_t)d->V;
    float *want = malloc(L * sizeof *want), *got = malloc(L * sizeof *got);
    char what[160] = "";
    pkv_status s;
    pkv_context *cold = fresh(d, true, &s), *twin = NULL;
    if (!cold || !want || !got) {
        md_row(d, "media-prompt", false, "%s", pkv_errmsg());
        goto out;
    }
    md_row(d, "media-prompt", true, "%zu text + %d media rows (%s) + %zu text tokens", d->na, d->ch.n_rows,
           d->ch.non_causal ? "non-causal" : "causal", d->nb);
    twin = pkv_context_fork(cold);
    if (!twin || greedy(d, twin, MD_GEN, want)) {
        md_row(d, "media-cont", false, "%s", pkv_errmsg());
        goto out;
    }
    pkv_context_free(twin);
    twin = NULL;
    const int64_t n_all = pkv_context_n_tokens(cold);
    int32_t *toks = malloc((size_t)n_all * sizeof *toks);
    pkv_context_tokens(cold, 0, n_all, toks);
    pkv_kv_media rec;
    pkv_kv_media_get(d->c, pkv_context_seq(cold), 0, &rec);

    { /* fork after the media prefix == replay */
        pkv_context *p = fresh(d, false, &s), *q = fresh(d, false, &s), *child = p ? pkv_context_fork(p) : NULL;
        float *rep = malloc(L * sizeof *rep);
        bool ok = p && q && child && rep && !pkv_context_decode(child, d->b, (int32_t)d->nb) &&
                  !pkv_context_decode(q, d->b, (int32_t)d->nb) && !greedy(d, child, MD_GEN, got) && !greedy(d, q, MD_GEN, rep);
        ok = ok && close_enough(d, got, rep, true, what, sizeof what); /* same step shapes: bitwise */
        md_row(d, "media-fork", ok, "%s", what[0] ? what : pkv_errmsg());
        free(rep);
        pkv_context_free(child);
        pkv_context_free(p);
        pkv_context_free(q);
    }
    { /* a prefix-cache hit on the same media == cold */
        pkv_context *h = pkv_context_create(d->m, d->c, 0);
        int64_t hit = 0;
        bool ok = h && !pkv_kv_prefix_match_media(d->c, pkv_context_seq(h), toks, NULL, n_all - 1, &rec, 1, &hit);
        int64_t end = rec.start + rec.n_rows;
        if (ok && hit >= end) { /* the text after the media */
            ok = !pkv_context_decode(h, toks + hit, (int32_t)(n_all - hit));
        } else if (ok) { /* the hit stopped before the chunk: the chunk and the rest */
            pkv_media_rows r = d->ch;
            r.at = (int32_t)(rec.start - hit);
            int32_t *t = malloc((size_t)(n_all - hit) * sizeof *t);
            size_t k = 0;
            for (int64_t i = hit; i < n_all; i++)
                if (i < rec.start || i >= end) t[k++] = toks[i];
            ok = !pkv_context_decode_prompt(h, t, (int32_t)k, &r, 1);
            free(t);
        }
        ok = ok && !greedy(d, h, MD_GEN, got) && close_enough(d, got, want, false, what, sizeof what);
        md_row(d, "media-prefix", ok && hit > 0, "%lld of %lld tokens from the cache; %s", (long long)hit, (long long)n_all,
               ok ? what : pkv_errmsg());
        pkv_context_free(h);
    }
    { /* one sample or pixel changed: another key, no hit into the chunk */
        pkv_media m2 = *med;
        float *s2 = NULL;
        uint8_t *p2 = NULL;
        if (med->kind == PKV_MEDIA_AUDIO && med->n_samples > 0) {
            s2 = malloc((size_t)med->n_samples * sizeof *s2);
            memcpy(s2, med->samples, (size_t)med->n_samples * sizeof *s2);
            s2[med->n_samples / 2] += s2[med->n_samples / 2] > 0 ? -1e-3f : 1e-3f;
            m2.samples = s2;
        } else if (med->kind == PKV_MEDIA_IMAGE) {
            size_t nb = (size_t)med->width * (size_t)med->height * 3;
            p2 = malloc(nb);
            memcpy(p2, med->rgb, nb);
            p2[nb / 2] ^= 1;
            m2.rgb = p2;
        }
        uint64_t k2 = pkv_media_key(pkv_media_hash(&m2), fp);
        int32_t *t2 = malloc((size_t)n_all * sizeof *t2);
        memcpy(t2, toks, (size_t)n_all * sizeof *t2);
        for (int32_t r = 0; r < rec.n_rows; r++) t2[rec.start + r] = pkv_media_token(k2, r);
        pkv_kv_media rec2 = rec;
        rec2.key = k2;
        pkv_context *h = pkv_context_create(d->m, d->c, 0);
        int64_t hit = -1, ps = pkv_kv_layout_page_size(pkv_kv_cache_layout(d->c)), limit = rec.start / ps * ps;
        bool ok = k2 != rec.key && h && !pkv_kv_prefix_match_media(d->c, pkv_context_seq(h), t2, NULL, n_all - 1, &rec2, 1, &hit) &&
                  hit <= limit;
        md_row(d, "media-miss", ok, "one %s changed: key %016llx -> %016llx, %lld tokens from the cache (the text before it: "
               "at most %lld)", med->kind == PKV_MEDIA_AUDIO ? "sample" : "pixel byte", (unsigned long long)rec.key,
               (unsigned long long)k2, (long long)hit, (long long)limit);
        pkv_context_free(h);
        free(t2);
        free(s2);
        free(p2);
    }
    { /* truncate into the chunk */
        pkv_context *f = pkv_context_fork(cold), *r = pkv_context_create(d->m, d->c, 0);
        pkv_media_rows ch0 = d->ch;
        ch0.at = 0;
        bool ok = f && r && !pkv_context_truncate(f, rec.start + rec.n_rows / 2 + (rec.n_rows > 1 ? 0 : 0));
        int64_t len = f ? pkv_context_n_tokens(f) : -1;
        int nm = f ? pkv_kv_media_count(d->c, pkv_context_seq(f)) : -1;
        ok = ok && len == rec.start && nm == 0;
        ok = ok && !pkv_context_decode_prompt(f, d->b, (int32_t)d->nb, &ch0, 1) && !greedy(d, f, MD_GEN, got);
        ok = ok && !pkv_context_decode(r, d->a, (int32_t)d->na) && !pkv_context_decode_prompt(r, d->b, (int32_t)d->nb, &ch0, 1) &&
             !greedy(d, r, MD_GEN, want) && close_enough(d, got, want, true, what, sizeof what);
        md_row(d, "media-trunc", ok, "truncate to %lld kept %lld tokens, %d chunks; decoded again: %s",
               (long long)(rec.start + rec.n_rows / 2), (long long)len, nm, what);
        pkv_context_free(f);
        pkv_context_free(r);
        twin = pkv_context_fork(cold);
        if (!twin || greedy(d, twin, MD_GEN, want)) goto out;
        pkv_context_free(twin);
        twin = NULL;
    }
    { /* shift */
        pkv_context *f = pkv_context_fork(cold);
        bool refused = f && rec.n_rows > 1 && pkv_context_shift(f, rec.start + 1, 1) == PKV_ERR_INVALID &&
                       pkv_context_n_tokens(f) == n_all;
        bool ok = refused && !pkv_kv_shift(d->c, pkv_context_seq(f), 0, 0, 3) && !greedy(d, f, MD_GEN, got);
        double e = ok ? nmse(want, got, L) : -1;
        md_row(d, "media-shift", ok && e <= 1e-3, "a cut through the chunk %s; positions +3: nmse %.3g against the unmoved "
               "continuation (f16 K re-rotated; bound 1e-3)", refused ? "refused" : "NOT refused", e);
        pkv_context_free(f);
    }
    { /* swap */
        pkv_context *f = pkv_context_fork(cold);
        bool ok = f && !pkv_context_swap_out(f) && !pkv_context_swap_in(f) && pkv_kv_media_count(d->c, pkv_context_seq(f)) == 1 &&
                  !greedy(d, f, MD_GEN, got) && close_enough(d, got, want, true, what, sizeof what);
        md_row(d, "media-swap", ok, "%s", what);
        pkv_context_free(f);
    }
    { /* save / load */
        char path[64];
        snprintf(path, sizeof path, "/tmp/pagekv-demo-media-%d.seq", (int)getpid());
        pkv_context *l = NULL;
        bool ok = !pkv_context_save(cold, path) && (l = pkv_context_load(d->m, d->c, path, 0)) != NULL;
        pkv_kv_media lr;
        ok = ok && pkv_kv_media_count(d->c, pkv_context_seq(l)) == 1 && !pkv_kv_media_get(d->c, pkv_context_seq(l), 0, &lr) &&
             lr.key == rec.key && lr.start == rec.start && lr.n_rows == rec.n_rows;
        ok = ok && !greedy(d, l, MD_GEN, got) && close_enough(d, got, want, false, what, sizeof what);
        md_row(d, "media-save", ok, "the file names chunk %016llx (%d rows at %lld); %s", (unsigned long long)rec.key,
               rec.n_rows, (long long)rec.start, ok ? what : pkv_errmsg());
        pkv_context_free(l);
        unlink(path);
    }
    free(toks);
out:
    pkv_context_free(twin);
    pkv_context_free(cold);
    free(want);
    free(got);
}

int pkv_cli_demo_media(const char *model_path, const char *const *devices, int n_dev, const pkv_cli_media *mo) {
    printf("%-12s %-18s %-5s  %s\n", "operation", "device", "result", "detail");
    int failed = 0, rows = 0;
    for (int i = 0; i < n_dev; i++) {
        md d = {0};
        d.dev = devices[i];
        pkv_model_params mp = pkv_model_default_params();
        mp.device = devices[i];
        d.m = pkv_model_load(model_path, mp);
        pkv_cli_decoded dec = {0};
        pkv_mmproj_info info = {0};
        float *embd = NULL;
        pkv_status s = d.m ? PKV_OK : PKV_ERR_INVALID;
        pkv_mmproj *p = d.m ? pkv_mmproj_load(mo->mmproj, d.m, pkv_model_device(d.m)) : NULL;
        if (!s && !p) s = PKV_ERR_INVALID;
        if (!s) pkv_mmproj_get_info(p, &info);
        if (!s && (s = pkv_cli_media_decode("demo", mo->path[0], mo->kind[0], info.sample_rate, &dec))) s = PKV_ERR_INVALID;
        if (!s) s = pkv_cli_media_rows("demo", p, &dec.m, &d.ch, &embd);
        pkv_model_info mi;
        if (!s) pkv_model_get_info(d.m, &mi);
        if (!s) {
            d.V = mi.n_vocab;
            d.exact = !strncmp(devices[i], "cpu", 3);
            pkv_cache_params cp = pkv_cache_default_params();
            cp.n_ctx = d.ch.n_rows + 128;
            cp.n_seq_max = 10;
            cp.page_size = 4; /* pages of text before the media, so a changed picture still hits them */
            if (!(d.c = pkv_model_cache_create(d.m, cp))) s = PKV_ERR_INVALID;
        }
        static const char ta[] = "Here is the input:", tb[] = " Describe it in one sentence.";
        size_t cap = 64;
        d.a = malloc(cap * sizeof *d.a);
        d.b = malloc(cap * sizeof *d.b);
        if (!s && mi.has_vocab) {
            if (pkv_model_tokenize(d.m, ta, strlen(ta), true, false, d.a, cap, &d.na) ||
                pkv_model_tokenize(d.m, tb, strlen(tb), false, false, d.b, cap, &d.nb))
                s = PKV_ERR_INVALID;
        } else if (!s) {
            for (d.na = 0; d.na < 7; d.na++) d.a[d.na] = (int32_t)((d.na * 7919 + 1) % (size_t)d.V);
            for (d.nb = 0; d.nb < 5; d.nb++) d.b[d.nb] = (int32_t)((d.nb * 104729 + 3) % (size_t)d.V);
        }
        if (!s && (d.na == 0 || d.nb == 0)) s = pkv_err(PKV_ERR_INVALID, "the demo's text tokenizes to nothing");
        d.ch.at = (int32_t)d.na;
        if (s) {
            printf("%-12s %-18s %-5s  %s\n", "load", devices[i], "FAIL", pkv_errmsg());
            d.failed++;
            d.rows++;
        } else {
            media_checks(&d, &dec.m, info.fingerprint);
        }
        failed += d.failed;
        rows += d.rows;
        free(d.a);
        free(d.b);
        free(embd);
        pkv_cli_decoded_free(&dec);
        pkv_mmproj_free(p);
        pkv_kv_cache_free(d.c);
        pkv_model_free(d.m);
    }
    printf("\ndemo: %d checks, %d passed, %d failed\n", rows, rows - failed, failed);
    return failed ? 1 : 0;
}
