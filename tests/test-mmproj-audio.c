// labels: media
/* Voxtral's projector on the CPU (src/media/mmproj-audio.c): the pair mkmodel
 * writes loads and matches its text model; rows per window (375 per started 30 s:
 * 1 sample, 30 s, 30 s + 1 sample, 31 s); encoding is deterministic, finite, and
 * each window's rows depend on that window's audio; encoding in slices
 * (pkv_mmproj_encode_begin/step: a window's log-mel or encoder a step) gives the same rows; a wrong pair, a missing key,
 * a missing tensor and a wrong shape are refused with messages naming them; the
 * CLI's mkmodel --arch voxtral --mmproj-out writes a pair that loads.
 * The numbers themselves are checked against an independent numpy implementation
 * of the transformers definition by tests/voxtral-ref-check.sh, which runs this
 * program with --dump DIR (text.gguf, proj.gguf, audio.f32: 31 s, rows.f32: the
 * CPU's rows). */
#include "base/base.h"
#include "mmproj-audio-testlib.h"
#include "media/audio-mel.h"
#include "model/gguf.h"

#include <string.h>

/* proj copied to out without key `drop_key` / tensor `drop_tensor` (NULL: keep all),
 * and with tensor `reshape` (if any) written as [3, 32, ne2]. */
static pkv_status edited(const char *proj, const char *out, const char *drop_key, const char *drop_tensor,
                         const char *reshape) {
    pkv_gguf *g;
    pkv_status s = pkv_gguf_read(proj, &g);
    if (s) return s;
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    for (int64_t i = 0; i < pkv_gguf_n_kv(g) && !s; i++)
        if (!drop_key || strcmp(pkv_gguf_kv_key(g, i), drop_key)) s = pkv_gguf_writer_copy_kv(w, g, i);
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g) && !s; i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        if (drop_tensor && !strcmp(t->name, drop_tensor)) continue;
        if (reshape && !strcmp(t->name, reshape)) {
            int64_t ne[3] = {3, 32, t->ne[2]};
            s = pkv_gguf_writer_add_tensor(w, t->name, t->type, 3, ne, NULL,
                                           pkv_type_row_bytes(t->type, 3) * 32 * (size_t)t->ne[2]);
        } else {
            s = pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
        }
    }
    if (!s) s = pkv_gguf_writer_write(w, out);
    pkv_gguf_writer_free(w);
    pkv_gguf_close(g);
    return s;
}

static bool write_f32(const char *path, const float *x, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(x, sizeof(float), n, f) == n;
    return fclose(f) == 0 && ok;
}

static int dump(const char *dir) {
    char text[600], proj[600], audio[600], rows[600];
    snprintf(text, sizeof text, "%s/text.gguf", dir);
    snprintf(proj, sizeof proj, "%s/proj.gguf", dir);
    snprintf(audio, sizeof audio, "%s/audio.f32", dir);
    snprintf(rows, sizeof rows, "%s/rows.f32", dir);
    if (vox_make(text, proj, 128, 0)) {
        fprintf(stderr, "making the pair: %s\n", pkv_errmsg());
        return 1;
    }
    int64_t n;
    float *x = vox_signal(31.0, &n);
    pkv_mmproj *p = pkv_mmproj_load(proj, NULL, NULL);
    if (!x || !p) {
        fprintf(stderr, "loading %s: %s\n", proj, pkv_errmsg());
        return 1;
    }
    pkv_media m = {.kind = PKV_MEDIA_AUDIO, .samples = x, .n_samples = n, .rate = VOX_RATE};
    int64_t nr = 0;
    pkv_mmproj_info info;
    pkv_mmproj_get_info(p, &info);
    float *out = NULL;
    if (pkv_mmproj_n_rows(p, &m, &nr) || !(out = pkv_malloc((size_t)nr * (size_t)info.n_embd * 4)) ||
        pkv_mmproj_encode(p, &m, out, nr)) {
        fprintf(stderr, "encoding: %s\n", pkv_errmsg());
        return 1;
    }
    if (!write_f32(audio, x, (size_t)n) || !write_f32(rows, out, (size_t)nr * (size_t)info.n_embd)) {
        fprintf(stderr, "writing %s, %s failed\n", audio, rows);
        return 1;
    }
    fprintf(stderr, "wrote %s (%lld samples) and %s (%lld rows of %d)\n", audio, (long long)n, rows, (long long)nr,
            info.n_embd);
    pkv_free(out);
    pkv_free(x);
    pkv_mmproj_free(p);
    return 0;
}

static void test_rows_and_encode(const char *text, const char *proj) {
    pkv_model *tm = pkv_model_load(text, pkv_model_default_params());
    CHECK(tm != NULL);
    if (!tm) return;
    pkv_mmproj *p = pkv_mmproj_load(proj, tm, NULL);
    if (!p) TH_FAIL("pkv_mmproj_load: %s", pkv_errmsg());
    if (!p) goto out;
    pkv_mmproj_info info;
    CHECK_OK(pkv_mmproj_get_info(p, &info));
    CHECK_INT(info.kind, PKV_MEDIA_AUDIO);
    CHECK(!strcmp(info.projector, "voxtral"));
    CHECK_INT(info.n_embd, 128);
    CHECK_INT(info.n_embd_enc, 64);
    CHECK_INT(info.n_layer, 2);
    CHECK_INT(info.sample_rate, 16000);
    CHECK(!info.non_causal);
    CHECK(info.fingerprint != 0);
    /* the text around each audio, as mtmd puts it: [BEGIN_AUDIO] before, nothing after;
     * one control token in the text model */
    CHECK(info.text_before && !strcmp(info.text_before, "[BEGIN_AUDIO]"));
    CHECK(info.text_after && !strcmp(info.text_after, ""));
    {
        int32_t ids[4];
        size_t k = 0;
        CHECK_OK(pkv_model_tokenize(tm, info.text_before, strlen(info.text_before), false, true, ids, 4, &k));
        CHECK_INT(k, 1);
    }

    int64_t n;
    float *x = vox_signal(31.0, &n);
    const struct {
        int64_t samples, rows;
    } want[] = {{1, 375}, {480000, 375}, {480001, 750}, {31 * 16000, 750}, {90 * 16000, 1125}};
    for (size_t i = 0; i < PKV_ARRAY_LEN(want); i++) {
        pkv_media m = {.kind = PKV_MEDIA_AUDIO, .samples = x, .n_samples = want[i].samples, .rate = 16000};
        int64_t nr = -1;
        if (want[i].samples <= n) {
            CHECK_OK(pkv_mmproj_n_rows(p, &m, &nr));
            CHECK_INT(nr, want[i].rows);
        }
    }
    /* a wrong rate is refused */
    pkv_media bad = {.kind = PKV_MEDIA_AUDIO, .samples = x, .n_samples = n, .rate = 44100};
    int64_t nr;
    CHECK_STATUS(pkv_mmproj_n_rows(p, &bad, &nr), PKV_ERR_INVALID);

    pkv_media m = {.kind = PKV_MEDIA_AUDIO, .samples = x, .n_samples = n, .rate = 16000};
    const size_t rows = 750, w = 128;
    float *a = pkv_malloc(rows * w * 4), *b = pkv_malloc(rows * w * 4);
    CHECK_STATUS(pkv_mmproj_encode(p, &m, a, 375), PKV_ERR_INVALID); /* wrong row count */
    CHECK_OK(pkv_mmproj_encode(p, &m, a, 750));
    CHECK_OK(pkv_mmproj_encode(p, &m, b, 750));
    CHECK_MEM(a, b, rows * w * 4); /* deterministic on one device */
    { /* the log-mel a window at a time, then floored: the whole one's, bit for bit */
        const size_t nf = 2 * PKV_MEL_WINDOW_FRAMES, nm = 80;
        float *m1 = pkv_malloc(nm * nf * 4), *m2 = pkv_malloc(nm * nf * 4);
        double gmax = -INFINITY;
        CHECK_OK(pkv_audio_log_mel(x, n, (int)nm, m1));
        for (int64_t t = 0; t < (int64_t)nf; t += PKV_MEL_WINDOW_FRAMES)
            CHECK_OK(pkv_audio_log_mel_frames(x, n, (int)nm, m2, t, t + PKV_MEL_WINDOW_FRAMES, &gmax));
        pkv_audio_log_mel_finish(n, (int)nm, m2, gmax);
        CHECK_MEM(m1, m2, nm * nf * 4);
        pkv_free(m1);
        pkv_free(m2);
    }
    { /* in slices (as the server encodes between engine steps): one step a window, the same rows */
        pkv_mmproj_job *job = NULL;
        memset(b, 0, rows * w * 4);
        CHECK_STATUS(pkv_mmproj_encode_begin(p, &m, b, 375, &job), PKV_ERR_INVALID);
        CHECK(job == NULL);
        CHECK_OK(pkv_mmproj_encode_begin(p, &m, b, 750, &job));
        int steps = 0;
        bool done = false;
        while (job && !done && steps < 10) {
            CHECK_OK(pkv_mmproj_encode_step(job, &done));
            steps++;
        }
        CHECK_INT(steps, 4); /* the log-mel of each window, then the encoder on each */
        CHECK_MEM(a, b, rows * w * 4);
        pkv_mmproj_job_free(job);
    }
    bool finite = true;
    double norm0 = 0, norm1 = 0, diff = 0;
    for (size_t i = 0; i < rows * w; i++) finite = finite && isfinite(a[i]);
    CHECK(finite);
    for (size_t i = 0; i < 375 * w; i++) {
        norm0 += (double)a[i] * a[i];
        norm1 += (double)a[375 * w + i] * a[375 * w + i];
        diff += ((double)a[i] - a[375 * w + i]) * ((double)a[i] - a[375 * w + i]);
    }
    CHECK(norm0 > 0 && norm1 > 0);
    CHECK(diff > 1e-3 * norm0); /* the two windows' rows differ */
    /* rows inside one window differ from each other (positions, audio) */
    double d01 = 0;
    for (size_t j = 0; j < w; j++) d01 += fabs((double)a[j] - a[w + j]);
    CHECK(d01 > 0);
    /* one sample changed in the second window changes that window's rows */
    x[31 * 16000 - 100] += 0.25f;
    CHECK_OK(pkv_mmproj_encode(p, &m, b, 750));
    CHECK(memcmp(a + 375 * w, b + 375 * w, 375 * w * 4) != 0);
    pkv_free(a);
    pkv_free(b);
    pkv_free(x);
    pkv_mmproj_free(p);
out:
    pkv_model_free(tm);
}

static void test_refusals(const char *proj) {
    /* a text model of another width */
    const char *text64 = th_tmp("vox-text64.gguf"), *proj64 = th_tmp("vox-proj64.gguf");
    CHECK_OK(vox_make(text64, proj64, 64, 0));
    pkv_model *tm = pkv_model_load(text64, pkv_model_default_params());
    CHECK(tm != NULL);
    pkv_mmproj *p = pkv_mmproj_load(proj, tm, NULL);
    CHECK(p == NULL);
    CHECK_MSG("projection_dim");
    CHECK_MSG("128");
    CHECK_MSG("64");
    /* the text model is not a projector */
    p = pkv_mmproj_load(text64, NULL, NULL);
    CHECK(p == NULL);
    CHECK_MSG("not a projector file");
    pkv_model_free(tm);
    remove(text64);
    remove(proj64);

    const char *bad = th_tmp("vox-bad.gguf");
    CHECK_OK(edited(proj, bad, "clip.audio.num_mel_bins", NULL, NULL));
    CHECK(pkv_mmproj_load(bad, NULL, NULL) == NULL);
    CHECK_MSG("clip.audio.num_mel_bins");
    CHECK_OK(edited(proj, bad, NULL, "a.blk.1.ffn_up.bias", NULL));
    CHECK(pkv_mmproj_load(bad, NULL, NULL) == NULL);
    CHECK_MSG("a.blk.1.ffn_up.bias");
    CHECK_OK(edited(proj, bad, NULL, NULL, "a.conv1d.2.weight"));
    CHECK(pkv_mmproj_load(bad, NULL, NULL) == NULL);
    CHECK_MSG("a.conv1d.2.weight");
    CHECK_MSG("[3, 32, 64]");
    remove(bad);
}

/* Every allocation of a load and an encode failed in turn: a clear status, no
 * crash, nothing left allocated. */
static void test_alloc_failures(const char *proj) {
    int64_t n;
    float *x = vox_signal(1.0, &n);
    float *out = pkv_malloc(375 * 128 * 4);
    pkv_media m = {.kind = PKV_MEDIA_AUDIO, .samples = x, .n_samples = n, .rate = VOX_RATE};
    const int64_t live0 = pkv_alloc_live();
    pkv_alloc_fail_at(0);
    pkv_mmproj *p = pkv_mmproj_load(proj, NULL, NULL);
    CHECK(p != NULL);
    CHECK_OK(pkv_mmproj_encode(p, &m, out, 375));
    pkv_mmproj_free(p);
    const uint64_t total = pkv_alloc_fail_at(0);
    CHECK_INT(pkv_alloc_live(), live0);
    int failed_load = 0, failed_encode = 0;
    for (uint64_t k = 1; k <= total; k++) {
        pkv_alloc_fail_at(k);
        p = pkv_mmproj_load(proj, NULL, NULL);
        if (!p) {
            failed_load++;
        } else {
            pkv_status s = pkv_mmproj_encode(p, &m, out, 375);
            if (s) {
                failed_encode++;
                if (s != PKV_ERR_NOMEM) TH_FAIL("allocation %llu failed: encode returned %s: %s", (unsigned long long)k,
                                                pkv_status_str(s), pkv_errmsg());
            }
            pkv_mmproj_free(p);
        }
        pkv_alloc_fail_at(0);
        if (pkv_alloc_live() != live0)
            TH_FAIL("allocation %llu failed: %lld allocations left", (unsigned long long)k,
                    (long long)(pkv_alloc_live() - live0));
        th_checks++;
    }
    fprintf(stderr, "%llu allocations: %d failed loads, %d failed encodes\n", (unsigned long long)total, failed_load,
            failed_encode);
    CHECK(failed_load > 0 && failed_encode > 0);
    pkv_free(out);
    pkv_free(x);
}

static void test_cli(void) {
    const char *text = th_tmp("vox-cli.gguf"), *proj = th_tmp("vox-cli-proj.gguf");
    int rc = th_cli("", true, "mkmodel --arch voxtral -o '%s' --mmproj-out '%s'", text, proj);
    if (rc == -1) {
        fprintf(stderr, "no PKV_CLI: the CLI part is not run\n");
        return;
    }
    CHECK_INT(rc, 0);
    HAS("voxtral projector");
    pkv_model *tm = pkv_model_load(text, pkv_model_default_params());
    CHECK(tm != NULL);
    pkv_mmproj *p = tm ? pkv_mmproj_load(proj, tm, NULL) : NULL;
    if (!p) TH_FAIL("loading the CLI's pair: %s", pkv_errmsg());
    if (tm) {
        /* the transcription prompt's special tokens are single tokens */
        const char *specials[] = {"[INST]", "[/INST]", "[BEGIN_AUDIO]", "[TRANSCRIBE]"};
        for (size_t i = 0; i < PKV_ARRAY_LEN(specials); i++) {
            int32_t ids[8];
            size_t n = 0;
            CHECK_OK(pkv_model_tokenize(tm, specials[i], strlen(specials[i]), false, true, ids, 8, &n));
            if (n != 1) TH_FAIL("%s tokenizes to %zu tokens", specials[i], n);
            th_checks++;
        }
    }
    pkv_mmproj_free(p);
    pkv_model_free(tm);
    rc = th_cli("", true, "mkmodel --arch llama -o '%s' --mmproj-out '%s'", text, proj);
    CHECK_INT(rc, 2);
    HAS("--mmproj-out is for --arch voxtral");
    remove(text);
    remove(proj);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--dump")) return dump(argv[2]);
    const char *text = th_tmp("vox-text.gguf"), *proj = th_tmp("vox-proj.gguf");
    CHECK_OK(vox_make(text, proj, 128, 0));
    test_rows_and_encode(text, proj);
    test_refusals(proj);
    test_alloc_failures(proj);
    test_cli();
    remove(text);
    remove(proj);
    return th_done();
}
