// labels: server timeout=300
/* A transcription through the official `openai` npm client's
 * audio.transcriptions.create against pagekv serve --mmproj, compared with the
 * same request served by the C API alone: a random-weight Voxtral pair made by
 * `pagekv mkmodel --arch voxtral -o M --mmproj-out P`; the WAV files written
 * here (16 kHz, and 44.1 kHz stereo, which both sides resample); the reference
 * decodes them with pkv_audio_decode, builds Voxtral's transcription prompt
 * (<s>[INST][BEGIN_AUDIO] audio [/INST]lang:en[TRANSCRIBE]) with
 * pkv_context_decode_prompt and generates greedily until an end-of-generation
 * token or a full context; the client's text must equal it byte for byte, as
 * json and as text. tests/server/openai-transcribe.cjs also sends bad uploads
 * (a PNG, a file over --max-media-bytes, response_format srt, a bad language)
 * and checks each status and message.
 * Skipped (77), never passed, without node/npm or the npm registry, or while
 * this build's mkmodel cannot write a Voxtral pair (the encoder is issue 34's
 * branch audio). */
#include "mmproj-audio-testlib.h"
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else

#define N_CTX 480

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

static bool append(pkv_model *m, int32_t *ids, size_t *n, const char *text, bool add_special, bool parse_special) {
    size_t k = 0;
    if (pkv_model_tokenize(m, text, strlen(text), add_special, parse_special, ids + *n, 64, &k)) return false;
    *n += k;
    return true;
}

/* The reference: the transcription of the WAV at path by the C API alone. */
static bool reference(const char *model, const char *proj, const char *path, const char *out_path) {
    bool ok = false;
    pkv_model *m = pkv_model_load(model, pkv_model_default_params());
    pkv_mmproj *mm = m ? pkv_mmproj_load(proj, m, NULL) : NULL;
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = N_CTX;
    pkv_kv_cache *c = mm ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, N_CTX) : NULL;
    size_t fl = 0;
    char *file = read_file(path, &fl);
    float *smp = NULL, *embd = NULL;
    int64_t ns = 0, nr = 0;
    pkv_mmproj_info info;
    int32_t ids[256], gen[N_CTX];
    size_t n = 0;
    int ng = 0;
    if (!ctx || !file || pkv_mmproj_get_info(mm, &info)) goto out;
    if (pkv_audio_decode(file, fl, info.sample_rate, NULL, &smp, &ns)) goto out;
    pkv_media med = {.kind = PKV_MEDIA_AUDIO, .samples = smp, .n_samples = ns, .rate = info.sample_rate};
    if (pkv_mmproj_n_rows(mm, &med, &nr) || !(embd = malloc((size_t)nr * info.n_embd * sizeof(float))) ||
        pkv_mmproj_encode(mm, &med, embd, nr))
        goto out;
    if (!append(m, ids, &n, "[INST][BEGIN_AUDIO]", true, true)) goto out;
    pkv_media_rows rows = {.key = pkv_media_key(pkv_media_hash(&med), info.fingerprint), .n_rows = (int32_t)nr,
                           .embd = embd, .non_causal = info.non_causal, .at = (int32_t)n};
    if (!append(m, ids, &n, "[/INST]", false, true) || !append(m, ids, &n, "lang:en", false, false) ||
        !append(m, ids, &n, "[TRANSCRIBE]", false, true))
        goto out;
    if (pkv_context_decode_prompt(ctx, ids, (int32_t)n, &rows, 1)) goto out;
    pkv_model_info mi;
    pkv_model_get_info(m, &mi);
    for (int64_t pos = (int64_t)n + nr; pos < N_CTX; pos++) {
        const float *lg = pkv_context_logits(ctx);
        if (!lg) goto out;
        int32_t best = 0;
        for (int32_t v = 1; v < mi.n_vocab; v++)
            if (lg[v] > lg[best]) best = v;
        if (pkv_model_is_eog(m, best)) break;
        gen[ng++] = best;
        if (pos + 1 >= N_CTX || pkv_context_decode(ctx, &best, 1)) break;
    }
    static char text[1 << 16];
    size_t tl = 0;
    if (pkv_model_detokenize(m, gen, (size_t)ng, false, text, sizeof text, &tl)) goto out;
    FILE *f = fopen(out_path, "wb");
    if (!f) goto out;
    fwrite(text, 1, tl, f);
    fclose(f);
    fprintf(stderr, "reference: %lld audio rows, %zu text tokens, %d generated\n", (long long)nr, n, ng);
    ok = true;
out:
    if (!ok) fprintf(stderr, "reference failed: %s\n", pkv_errmsg());
    free(file);
    pkv_media_free(smp);
    free(embd);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_mmproj_free(mm);
    pkv_model_free(m);
    return ok;
}

int main(void) {
    const char *src = getenv("PKV_SOURCE_DIR"), *dir = getenv("PKV_NODE_DIR");
    if (!src || !dir) return th_skip("PKV_SOURCE_DIR/PKV_NODE_DIR not set (run through ctest)");
    char model[512], proj[512], log[512], args[2048];
    snprintf(model, sizeof model, "%s", th_tmp("voxtral.gguf"));
    snprintf(proj, sizeof proj, "%s", th_tmp("voxtral-mmproj.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("transcribe-serve.log"));
    if (th_cli("", true, "mkmodel --arch voxtral -o '%s' --mmproj-out '%s'", model, proj) != 0)
        return th_skip("this build's mkmodel cannot write a Voxtral pair (--arch voxtral --mmproj-out)");
    pkv_log_set(NULL, NULL, PKV_LOG_WARN);
    pkv_mmproj *probe = pkv_mmproj_load(proj, NULL, NULL);
    if (!probe) {
        fprintf(stderr, "%s\n", pkv_errmsg());
        return th_skip("the Voxtral projector does not load in this build (no audio encoder yet)");
    }
    pkv_mmproj_free(probe);
    if (system("node --version >/dev/null 2>&1") != 0 || system("npm --version >/dev/null 2>&1") != 0)
        return th_skip("node and npm are not installed");
    static const char *const mods[] = {"openai", NULL};
    if (!ts_npm_install(src, dir, mods)) return th_skip("npm ci failed (is the npm registry reachable?)");

    char wav16[512], wav44[512], png[512], big[512], ref16[512], ref44[512];
    snprintf(wav16, sizeof wav16, "%s", th_tmp("tr-16k.wav"));
    snprintf(wav44, sizeof wav44, "%s", th_tmp("tr-44k.wav"));
    snprintf(big, sizeof big, "%s", th_tmp("tr-big.wav"));
    snprintf(png, sizeof png, "%s", th_tmp("tr-not-audio.png"));
    snprintf(ref16, sizeof ref16, "%s", th_tmp("tr-16k.txt"));
    snprintf(ref44, sizeof ref44, "%s", th_tmp("tr-44k.txt"));
    REQUIRE(vox_wav_write(wav16, 16000, 1, 24000, 1) > 0);
    REQUIRE(vox_wav_write(wav44, 44100, 2, 44100, 2) > 0);
    REQUIRE(vox_wav_write(big, 16000, 1, 100000, 3) > 190000);
    ts_file("tr-not-audio.png", "\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
    REQUIRE(reference(model, proj, wav16, ref16));
    REQUIRE(reference(model, proj, wav44, ref44));

    snprintf(args, sizeof args, "-m '%s' --mmproj '%s' -c %d --max-media-bytes 190000 --api-key test-key", model, proj,
             N_CTX);
    int port;
    pid_t pid = ts_start(args, log, &port);
    REQUIRE(pid > 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && PKV_NODE_DIR='%s' timeout 180 node tests/server/openai-transcribe.cjs %d '%s' '%s' '%s' '%s' "
             "'%s' '%s'",
             src, dir, port, wav16, ref16, wav44, ref44, png, big);
    int rc = system(cmd);
    CHECK_INT(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);
    CHECK_INT(ts_http(port, "/health"), 200);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
