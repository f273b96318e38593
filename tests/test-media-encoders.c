// labels: media timeout=300
/* Media rows from the real encoders through the paged cache (docs/multimodal.md, "Media in the cache"):
 * branch vision's gemma3 projector (16 non-causal rows) and branch audio's Voxtral
 * projector on a llama text model (one second of audio: 375 causal rows), both with
 * random weights as mkmodel writes them, on the CPU. Label "media" (not model/kv):
 * the Voxtral encoder's 30-second window is heavy under qemu, so make test-arm
 * (and test-asan) leave it to make test. */
int media_kv_main(void);
#define main media_kv_main
#include "test-media-kv.c"
#undef main

#include "media/mkmmproj-audio.h"
#include "media/vision-impl.h"

/* A real encoder: gemma3 with branch vision's projector, or a llama (Voxtral's
 * text model) with branch audio's Voxtral projector (random weights, as mkmodel
 * writes them): pkv_context_decode_mmproj == encode + decode_media by hand (same
 * key, rows and logits); fork after the media == replay; the media with one
 * pixel or sample changed is another key and a prefix miss after the text page;
 * the same media again a hit past it, with its record. */
static void run_encoder(bool audio) {
    arch_name = audio ? "llama+voxtral" : "gemma3+vision";
    nc = !audio;
    pkv_model *m = make(audio ? "llama" : "gemma3");
    REQUIRE_VOID(m);
    const char *mp = th_tmp(audio ? "media-kv-audio.gguf" : "media-kv-vision.gguf");
    if (audio) {
        pkv_mkmmproj_audio_params ap = {.n_embd = E, .seed = 5};
        CHECK_OK(pkv_mkmmproj_audio_write(&ap, mp));
    } else {
        pkv_mkmmproj_vision_params vp = {.n_embd_text = E, .seed = 5};
        CHECK_OK(pkv_mkmmproj_vision_write(&vp, mp));
    }
    /* The encoders run on the CPU: their own tests (test-mmproj-*-vulkan) run them on
     * vulkan:0; here the rows go into the model on MEDIA_DEVICE. */
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE_VOID(cpu);
    pkv_mmproj *pj = pkv_mmproj_load(mp, m, cpu);
    REQUIRE_VOID(pj);
    pkv_mmproj_info info;
    CHECK_OK(pkv_mmproj_get_info(pj, &info));
    CHECK(info.non_causal == !audio);
    static uint8_t rgb[60 * 40 * 3];
    for (size_t i = 0; i < sizeof rgb; i++) rgb[i] = (uint8_t)(i * 31 + (i >> 7));
    enum { NS = 16000 };
    static float pcm[NS];
    for (int i = 0; i < NS; i++) pcm[i] = 0.3f * sinf(0.05f * (float)i) + 0.1f * sinf(0.31f * (float)i);
    pkv_media im = audio ? (pkv_media){.kind = PKV_MEDIA_AUDIO, .samples = pcm, .n_samples = NS, .rate = 16000}
                         : (pkv_media){.kind = PKV_MEDIA_IMAGE, .rgb = rgb, .width = 60, .height = 40};
    int64_t n = 0;
    CHECK_OK(pkv_mmproj_n_rows(pj, &im, &n));
    float *embd = malloc((size_t)(n > 0 ? n : 1) * E * sizeof *embd);
    REQUIRE_VOID(embd && n > 0);
    CHECK_OK(pkv_mmproj_encode(pj, &im, embd, n));
    pkv_kv_cache *c = cache(m, PKV_TYPE_F16);
    REQUIRE_VOID(c);
    pkv_context *a = pkv_context_create(m, c, 0), *b = pkv_context_create(m, c, 0);
    REQUIRE_VOID(a && b);
    uint64_t k = 0;
    int32_t nr = 0;
    CHECK_OK(pkv_context_decode(a, A, NA));
    CHECK_OK(pkv_context_decode_mmproj(a, pj, &im, &k, &nr));
    CHECK(k == pkv_media_key(pkv_media_hash(&im), info.fingerprint));
    CHECK_INT(nr, n);
    pkv_media_rows r = {.key = k, .n_rows = (int32_t)n, .embd = embd, .non_causal = !audio};
    CHECK_OK(pkv_context_decode(b, A, NA));
    CHECK_OK(pkv_context_decode_media(b, &r));
    float l1[V], l2[V];
    copy_logits(a, l1);
    copy_logits(b, l2);
    same(l1, l2, true, "decode_mmproj == encode + decode_media");
    pkv_context *f = pkv_context_fork(a);
    REQUIRE_VOID(f);
    CHECK_OK(pkv_context_decode(f, B, NB));
    CHECK_OK(pkv_context_decode(b, B, NB));
    copy_logits(f, l1);
    copy_logits(b, l2);
    same(l1, l2, true, "fork after encoded media == replay");
    for (int i = 0; i < 4; i++) { /* text after the media to a page boundary past it and beyond */
        CHECK_OK(pkv_context_decode(f, &X, 1));
        CHECK_OK(pkv_context_decode(b, &X, 1));
    }
    /* one pixel or sample changed: another key; a prefix miss after the text page */
    int64_t total = pkv_context_n_tokens(f);
    int32_t *t = malloc((size_t)total * sizeof *t);
    CHECK_OK(pkv_context_tokens(f, 0, total, t));
    if (audio) pcm[NS / 2] += 1e-3f;
    else rgb[100] ^= 1;
    uint64_t k2 = pkv_media_key(pkv_media_hash(&im), info.fingerprint);
    CHECK(k2 != k);
    for (int64_t j = 0; j < n; j++) t[NA + j] = pkv_media_token(k2, (int32_t)j);
    pkv_kv_media rec = {.key = k2, .start = NA, .n_rows = (int32_t)n, .flags = audio ? 0 : PKV_MEDIA_NON_CAUSAL};
    pkv_context *h = pkv_context_create(m, c, 0);
    int64_t matched = -1;
    CHECK_OK(pkv_kv_prefix_match_media(c, pkv_context_seq(h), t, NULL, total - 1, &rec, 1, &matched));
    CHECK_INT(matched, 4);
    if (audio) pcm[NS / 2] -= 1e-3f; /* and back: a hit past the media */
    else rgb[100] ^= 1;
    CHECK(pkv_media_key(pkv_media_hash(&im), info.fingerprint) == k);
    for (int64_t j = 0; j < n; j++) t[NA + j] = pkv_media_token(k, (int32_t)j);
    rec.key = k;
    CHECK_OK(pkv_context_truncate(h, 0));
    pkv_context_free(b); /* its pages published */
    b = NULL;
    CHECK_OK(pkv_kv_prefix_match_media(c, pkv_context_seq(h), t, NULL, total - 1, &rec, 1, &matched));
    CHECK_INT(matched, (total - 1) / 4 * 4);
    CHECK(matched >= NA + n);
    CHECK_INT(pkv_kv_media_count(c, pkv_context_seq(h)), 1);
    CHECK_OK(pkv_context_decode(h, t + matched, (int32_t)(total - matched)));
    CHECK_OK(pkv_context_decode(f, &X, 1));
    CHECK_OK(pkv_context_decode(h, &X, 1));
    copy_logits(f, l1);
    copy_logits(h, l2);
    same(l1, l2, false, "a prefix hit on the same encoded media == cold");
    free(t);
    pkv_context_free(h);
    pkv_context_free(f);
    pkv_context_free(a);
    pkv_kv_cache_free(c);
    free(embd);
    pkv_mmproj_free(pj);
    pkv_device_close(cpu);
    remove(mp);
    pkv_model_free(m);
}

int main(void) {
    uint64_t rs = 7;
    for (int i = 0; i < NR * E; i++) rows[i] = 0.5f * th_randf(&rs);
    run_encoder(false);
    run_encoder(true);
    return th_done();
}
