// labels: server timeout=300
/* Chat content parts with media through pagekv serve --mmproj, against the C API
 * alone: an input_audio part (a WAV, base64) on a random-weight Voxtral pair and
 * an image_url part (a PNG data URL) on a random-weight Gemma 3 vision pair, both
 * from `pagekv mkmodel ... --mmproj-out`. The reference renders the same messages
 * through POST /apply-template with a plain word where the medium goes, cuts the
 * prompt there, tokenizes the pieces, puts the projector's rows between the
 * model's own tokens ([BEGIN_AUDIO]; <start_of_image> ... <end_of_image>) with
 * pkv_context_decode_prompt and decodes greedily; the server's answer
 * (return_token_ids) must have the same prompt text tokens and the same generated
 * ids, usage must count the media rows (audio_tokens / image_tokens), and the
 * same request again must be a prefix-cache hit past the medium with the same ids,
 * while a request whose medium differs in one sample or pixel must not hit past
 * the medium's start; the second's medium came from the encoder-output cache
 * (pagekv_media_cache_hits_total 1, misses 2). Skipped (77), never passed, where
 * mkmodel cannot write the pairs. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"

#include "media-testlib.h"

#define N_CTX 1024
#define N_GEN 12

/* A 16-bit mono 16 kHz WAV of n samples; sample `poke` changed by one step. */
static uint8_t *wav(int n, int poke, size_t *len) {
    *len = 44 + (size_t)n * 2;
    uint8_t *w = calloc(1, *len);
    const uint32_t data = (uint32_t)n * 2, riff = 36 + data, rate = 16000, br = 32000, sixteen = 16;
    const uint16_t one = 1, ba = 2, bits = 16;
    memcpy(w, "RIFF", 4), memcpy(w + 4, &riff, 4), memcpy(w + 8, "WAVEfmt ", 8), memcpy(w + 16, &sixteen, 4);
    memcpy(w + 20, &one, 2), memcpy(w + 22, &one, 2), memcpy(w + 24, &rate, 4), memcpy(w + 28, &br, 4);
    memcpy(w + 32, &ba, 2), memcpy(w + 34, &bits, 2), memcpy(w + 36, "data", 4), memcpy(w + 40, &data, 4);
    uint64_t seed = 5;
    for (int i = 0; i < n; i++) {
        int16_t v = (int16_t)lrint(8000 * sin(2 * M_PI * 440 * i / 16000.0) + 3000 * th_randf(&seed));
        if (i == poke) v++;
        memcpy(w + 44 + 2 * i, &v, 2);
    }
    return w;
}


static int g_port;

static long long metric(const char *name) {
    if (ts_http(g_port, "/metrics") != 200) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(ts_body, key);
    return p ? atoll(p + strlen(key)) : -1;
}

static json_t *post(const char *path, const char *body, int *code) {
    const char *f = ts_file("chat-media.json", body, strlen(body));
    *code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
    return json_loads(ts_body, 0, NULL);
}

/* The messages with `part` where the medium goes. */
static char *body_with(const char *part, bool gen) {
    size_t n = strlen(part) + 512;
    char *b = malloc(n);
    snprintf(b, n,
             "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Look at this:\"},%s,"
             "{\"type\":\"text\",\"text\":\"What is it?\"}]}]%s}",
             part, gen ? ",\"max_tokens\":" "12" ",\"temperature\":0,\"return_token_ids\":true" : "");
    return b;
}

static bool tok(pkv_model *m, const char *t, size_t len, bool add, int32_t *ids, size_t *n) {
    size_t k = 0;
    if (pkv_model_tokenize(m, t, len, add, true, ids + *n, 4096 - *n, &k)) return false;
    *n += k;
    return true;
}

/* The reference ids: the rendered prompt (split at "XMEDIAX") around the medium's
 * rows, greedy N_GEN tokens. */
static bool reference(const char *model, const char *proj, const char *prompt, const pkv_media *med,
                      const char *before, const char *after, int32_t *text_ids, size_t *n_text, int32_t *gen, int *n_gen,
                      int64_t *rows_out, int32_t *at_out) {
    bool ok = false;
    pkv_model *m = pkv_model_load(model, pkv_model_default_params());
    pkv_mmproj *mm = m ? pkv_mmproj_load(proj, m, NULL) : NULL;
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = N_CTX;
    pkv_kv_cache *c = mm ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, N_CTX) : NULL;
    pkv_mmproj_info info;
    float *embd = NULL;
    int64_t nr = 0;
    const char *cut = strstr(prompt, "XMEDIAX");
    size_t n = 0;
    if (!ctx || !cut || pkv_mmproj_get_info(mm, &info) || pkv_mmproj_n_rows(mm, med, &nr)) goto out;
    if (!(embd = malloc((size_t)nr * info.n_embd * sizeof(float))) || pkv_mmproj_encode(mm, med, embd, nr)) goto out;
    if (!tok(m, prompt, (size_t)(cut - prompt), true, text_ids, &n) || !tok(m, before, strlen(before), false, text_ids, &n))
        goto out;
    pkv_media_rows rows = {.key = pkv_media_key(pkv_media_hash(med), info.fingerprint), .n_rows = (int32_t)nr,
                           .embd = embd, .non_causal = info.non_causal, .at = (int32_t)n};
    if (!tok(m, after, strlen(after), false, text_ids, &n) || !tok(m, cut + 7, strlen(cut + 7), false, text_ids, &n))
        goto out;
    if (pkv_context_decode_prompt(ctx, text_ids, (int32_t)n, &rows, 1)) goto out;
    pkv_model_info mi;
    pkv_model_get_info(m, &mi);
    *n_gen = 0;
    for (int g = 0; g < N_GEN; g++) {
        const float *lg = pkv_context_logits(ctx);
        int32_t best = 0;
        for (int32_t v = 1; v < mi.n_vocab; v++)
            if (lg[v] > lg[best]) best = v;
        gen[(*n_gen)++] = best;
        if (pkv_model_is_eog(m, best)) break;
        if (pkv_context_decode(ctx, &best, 1)) goto out;
    }
    *n_text = n;
    *rows_out = nr;
    *at_out = rows.at;
    ok = true;
out:
    if (!ok) fprintf(stderr, "reference failed: %s\n", pkv_errmsg());
    free(embd);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_mmproj_free(mm);
    pkv_model_free(m);
    return ok;
}

/* One pair: start the server, compare, cache hit and miss. part_fmt has one %s
 * for the base64 payload. */
static void run_case(const char *what, const char *model, const char *proj, const char *part_fmt, const uint8_t *file,
                     size_t flen, const uint8_t *file2, size_t flen2, const pkv_media *med, const char *before,
                     const char *after, const char *usage_field) {
    char log[512], args[2048];
    snprintf(log, sizeof log, "%s", th_tmp("chat-media-serve.log"));
    snprintf(args, sizeof args, "-m '%s' --mmproj '%s' -c %d --page-size 4", model, proj, N_CTX);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    int code;
    /* the prompt as the template renders it, a word where the medium goes */
    char *b = body_with("{\"type\":\"text\",\"text\":\"XMEDIAX\"}", false);
    json_t *j = post("/apply-template", b, &code);
    free(b);
    CHECK_INT(code, 200);
    const char *prompt = json_string_value(jget(j, "prompt"));
    static int32_t text_ids[4096], gen[N_GEN];
    size_t n_text = 0;
    int64_t nr = 0;
    int ng = 0;
    int32_t at = 0;
    bool have = prompt && reference(model, proj, prompt, med, before, after, text_ids, &n_text, gen, &ng, &nr, &at);
    json_decref(j);
    CHECK(have);
    char *e1 = tm_b64(file, flen), *e2 = tm_b64(file2, flen2);
    size_t pl = strlen(part_fmt) + (strlen(e1) > strlen(e2) ? strlen(e1) : strlen(e2)) + 8;
    char *p1 = malloc(pl), *p2 = malloc(pl);
    snprintf(p1, pl, part_fmt, e1);
    snprintf(p2, pl, part_fmt, e2);
    char *b1 = body_with(p1, true), *b2 = body_with(p2, true);
    long long cached[3] = {-1, -1, -1};
    for (int round = 0; round < 3 && have; round++) {
        j = post("/v1/chat/completions", round == 2 ? b2 : b1, &code);
        th_checks++;
        if (code != 200) {
            TH_FAIL("%s round %d: %d %s", what, round, code, ts_body);
            json_decref(j);
            continue;
        }
        json_t *pt = jget(j, "prompt_token_ids"), *gt = jget(j, "choices.0.token_ids");
        CHECK_INT(json_array_size(pt), n_text);
        int bad = 0;
        for (size_t i = 0; i < n_text && i < json_array_size(pt); i++)
            bad += json_integer_value(json_array_get(pt, i)) != text_ids[i];
        CHECK_INT(bad, 0);
        if (round < 2) {
            bad = (int)json_array_size(gt) != ng;
            for (int i = 0; i < ng && !bad; i++) bad += json_integer_value(json_array_get(gt, i)) != gen[i];
            th_checks++;
            if (bad) TH_FAIL("%s round %d: generated ids differ from the C API's", what, round);
        }
        char f[96];
        snprintf(f, sizeof f, "usage.prompt_tokens_details.%s", usage_field);
        CHECK_INT(jint(j, f), nr);
        CHECK_INT(jint(j, "usage.prompt_tokens"), (long long)n_text + nr);
        cached[round] = jint(j, "usage.prompt_tokens_details.cached_tokens");
        json_decref(j);
    }
    /* the same medium again: a hit past its rows; another one: not past its start */
    CHECK(cached[1] > at + nr);
    CHECK(cached[2] >= 0 && cached[2] <= at);
    /* and the encoder ran for the first and the third only: the second's rows came
     * from the media cache (its ids equal the reference's, checked above) */
    CHECK_INT(metric("pagekv_media_cache_hits_total"), 1);
    CHECK_INT(metric("pagekv_media_cache_misses_total"), 2);
    CHECK_INT(metric("pagekv_media_cache_entries"), 2);
    fprintf(stderr, "%s: %lld rows, %zu text tokens; cached %lld, %lld, %lld\n", what, (long long)nr, n_text, cached[0],
            cached[1], cached[2]);
    free(e1), free(e2), free(p1), free(p2), free(b1), free(b2);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}

int main(void) {
    char model[512], proj[512];
    pkv_log_set(NULL, NULL, PKV_LOG_WARN);
    snprintf(model, sizeof model, "%s", th_tmp("cm-voxtral.gguf"));
    snprintf(proj, sizeof proj, "%s", th_tmp("cm-voxtral-mmproj.gguf"));
    if (th_cli("", true, "mkmodel --arch voxtral -o '%s' --mmproj-out '%s'", model, proj) != 0)
        return th_skip("this build's mkmodel cannot write a Voxtral pair");
    size_t l1, l2;
    uint8_t *w1 = wav(16000, -1, &l1), *w2 = wav(16000, 8000, &l2);
    float *smp = NULL;
    int64_t ns = 0;
    REQUIRE(pkv_audio_decode(w1, l1, 16000, NULL, &smp, &ns) == PKV_OK);
    pkv_media am = {.kind = PKV_MEDIA_AUDIO, .samples = smp, .n_samples = ns, .rate = 16000};
    run_case("audio", model, proj, "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\",\"format\":\"wav\"}}", w1, l1,
             w2, l2, &am, "[BEGIN_AUDIO]", "", "audio_tokens");
    pkv_media_free(smp);
    free(w1), free(w2);
#ifdef PKV_HAVE_SPNG
    snprintf(model, sizeof model, "%s", th_tmp("cm-gemma3.gguf"));
    snprintf(proj, sizeof proj, "%s", th_tmp("cm-gemma3-mmproj.gguf"));
    if (th_cli("", true, "mkmodel --arch gemma3 --vision -o '%s' --mmproj-out '%s'", model, proj) == 0) {
        size_t n1, n2;
        uint8_t *p1 = tm_png(-1, &n1), *p2 = tm_png(1234, &n2), *rgb = NULL;
        int w = 0, h = 0;
        REQUIRE(p1 && p2 && pkv_image_decode(p1, n1, NULL, &rgb, &w, &h) == PKV_OK);
        pkv_media im = {.kind = PKV_MEDIA_IMAGE, .rgb = rgb, .width = w, .height = h};
        run_case("image", model, proj, "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,%s\"}}", p1,
                 n1, p2, n2, &im, "<start_of_image>", "<end_of_image>", "image_tokens");
        pkv_media_free(rgb);
        free(p1), free(p2);
    } else {
        fprintf(stderr, "no gemma3 vision pair from mkmodel: the image case is not run\n");
    }
#endif
    return th_done();
}
#endif
