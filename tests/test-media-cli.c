// labels: media timeout=300
/* The media options of the pagekv command (docs/multimodal.md, "Media in the cache") on a gemma3
 * model with its random-weight vision projector (mkmodel --vision --mmproj-out)
 * and a PNG the test writes:
 *   logits --image --media-at K --embd-out: the rows == pkv_mmproj_encode's and
 *   the logits == pkv_context_decode_prompt's, bit for bit (same file decoded by
 *   pkv_image_decode in this process);
 *   run with a <__media__> marker: greedy ids == the same prompt through the API
 *   (pieces tokenized with special tokens, the image wrapped in <start_of_image>
 *   ... <end_of_image>);
 *   demo --image: every media KV check passes;
 *   run --audio on a Voxtral pair (mkmodel --arch voxtral --mmproj-out) with a
 *   marker: greedy ids == the API's with the audio after [BEGIN_AUDIO], the text
 *   the projector says goes before it (pkv_mmproj_info.text_before), as mtmd;
 *   errors: media without --mmproj, more markers than files, --audio through an
 *   image projector, a file that is not an image — a message and a non-zero exit.
 * Skipped when this build has no PNG decoder. */
#include <stdlib.h>
#include <string.h>

#include "mmproj-audio-testlib.h"
#include "testhelp.h"

enum { W = 30, H = 20 };

static uint32_t crc_table[256];
static uint32_t crc32_of(const uint8_t *p, size_t n, uint32_t c) {
    if (!crc_table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t x = i;
            for (int k = 0; k < 8; k++) x = x & 1 ? 0xedb88320u ^ (x >> 1) : x >> 1;
            crc_table[i] = x;
        }
    c = ~c;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return ~c;
}

static void be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static void put_chunk(FILE *f, const char *type, const uint8_t *d, uint32_t n) {
    uint8_t h[8];
    be32(h, n);
    memcpy(h + 4, type, 4);
    fwrite(h, 1, 8, f);
    if (n) fwrite(d, 1, n, f);
    uint32_t c = crc32_of((const uint8_t *)type, 4, 0);
    if (n) c = crc32_of(d, n, c);
    be32(h, c);
    fwrite(h, 1, 4, f);
}

/* An 8-bit RGB PNG with one stored (uncompressed) deflate block. */
static void write_png(const char *path, const uint8_t *rgb) {
    static uint8_t raw[H * (1 + W * 3)], z[sizeof raw + 64];
    for (int y = 0; y < H; y++) {
        raw[y * (1 + W * 3)] = 0;
        memcpy(raw + y * (1 + W * 3) + 1, rgb + y * W * 3, W * 3);
    }
    size_t n = sizeof raw, k = 0;
    z[k++] = 0x78, z[k++] = 0x01;
    z[k++] = 1; /* final stored block */
    z[k++] = (uint8_t)n, z[k++] = (uint8_t)(n >> 8), z[k++] = (uint8_t)~n, z[k++] = (uint8_t)(~n >> 8);
    memcpy(z + k, raw, n);
    k += n;
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) a = (a + raw[i]) % 65521, b = (b + a) % 65521;
    be32(z + k, b << 16 | a);
    k += 4;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite("\x89PNG\r\n\x1a\n", 1, 8, f);
    uint8_t ih[13];
    be32(ih, W), be32(ih + 4, H);
    ih[8] = 8, ih[9] = 2, ih[10] = ih[11] = ih[12] = 0;
    put_chunk(f, "IHDR", ih, 13);
    put_chunk(f, "IDAT", z, (uint32_t)k);
    put_chunk(f, "IEND", NULL, 0);
    fclose(f);
}

static float *read_floats(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *x = malloc((size_t)sz + 4);
    *n = fread(x, 1, (size_t)sz, f) / 4;
    fclose(f);
    return x;
}

static void tok_append(pkv_model *m, const char *s, bool bos, int32_t *t, size_t *n) {
    size_t got = 0;
    CHECK_OK(pkv_model_tokenize(m, s, strlen(s), bos, true, t + *n, 256 - *n, &got));
    *n += got;
}

/* The ids_path written by run --ids-out == n greedy ids continuing ctx. */
static void expect_greedy_ids(pkv_context *ctx, int32_t n_vocab, int n, const char *ids_path, const char *what) {
    char want[256] = "[", *w = want + 1;
    for (int i = 0; i < n; i++) {
        const float *lg = pkv_context_logits(ctx);
        int32_t b = 0;
        for (int32_t v = 1; v < n_vocab; v++)
            if (lg[v] > lg[b]) b = v;
        w += snprintf(w, (size_t)(want + sizeof want - w), "%s%d", i ? ", " : "", b);
        CHECK_OK(pkv_context_decode(ctx, &b, 1));
    }
    snprintf(w, (size_t)(want + sizeof want - w), "]");
    char got[256];
    CHECK(th_read_text(ids_path, got, sizeof got) != NULL);
    char *nl = strchr(got, '\n');
    if (nl) *nl = 0;
    if (strcmp(got, want)) TH_FAIL("%s ids %s, the API's %s", what, got, want);
    th_checks++;
}

/* run --audio through a Voxtral projector: the audio goes after [BEGIN_AUDIO] (as
 * llama.cpp's mtmd puts Voxtral audio), nothing after it. */
static void test_voxtral_run(void) {
    char M[512], P[512], WAV[512], IDS[512];
    snprintf(M, sizeof M, "%s", th_tmp("media-cli-vox.gguf"));
    snprintf(P, sizeof P, "%s", th_tmp("media-cli-vox-proj.gguf"));
    snprintf(WAV, sizeof WAV, "%s", th_tmp("media-cli-vox.wav"));
    snprintf(IDS, sizeof IDS, "%s", th_tmp("media-cli-vox.ids"));
    CHECK_INT(th_cli("", true, "mkmodel --arch voxtral -o %s --mmproj-out %s", M, P), 0);
    REQUIRE_VOID(vox_wav_write(WAV, VOX_RATE, 1, VOX_RATE, 5) > 0);
    CHECK_INT(th_cli("", true, "run -m %s --mmproj %s --audio %s -p '[INST]<__media__>[/INST]' -n 5 --temp 0 --seed 1 "
                     "--ignore-eos --ids-out %s", M, P, WAV, IDS), 0);
    pkv_model *m = pkv_model_load(M, pkv_model_default_params());
    REQUIRE_VOID(m);
    pkv_mmproj *pj = pkv_mmproj_load(P, m, pkv_model_device(m));
    pkv_mmproj_info info;
    CHECK(pj && !pkv_mmproj_get_info(pj, &info));
    static uint8_t file[1 << 16];
    FILE *f = fopen(WAV, "rb");
    size_t fsz = f ? fread(file, 1, sizeof file, f) : 0;
    if (f) fclose(f);
    float *smp = NULL, *rows = NULL;
    int64_t ns = 0, nr = 0;
    CHECK_OK(pkv_audio_decode(file, fsz, VOX_RATE, NULL, &smp, &ns));
    pkv_media au = {.kind = PKV_MEDIA_AUDIO, .samples = smp, .n_samples = ns, .rate = VOX_RATE};
    CHECK(pj && !pkv_mmproj_n_rows(pj, &au, &nr) && nr > 0);
    if (pj && nr > 0 && (rows = malloc((size_t)nr * (size_t)info.n_embd * sizeof *rows)))
        CHECK_OK(pkv_mmproj_encode(pj, &au, rows, nr));
    pkv_model_info mi;
    CHECK_OK(pkv_model_get_info(m, &mi));
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = (int)nr + 64;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    if (ctx && rows) {
        int32_t t[256];
        size_t n = 0;
        tok_append(m, "[INST]", true, t, &n);
        tok_append(m, "[BEGIN_AUDIO]", false, t, &n);
        pkv_media_rows r = {.key = pkv_media_key(pkv_media_hash(&au), info.fingerprint), .n_rows = (int32_t)nr,
                            .embd = rows, .non_causal = info.non_causal, .at = (int32_t)n};
        tok_append(m, "[/INST]", false, t, &n);
        CHECK_OK(pkv_context_decode_prompt(ctx, t, (int32_t)n, &r, 1));
        expect_greedy_ids(ctx, mi.n_vocab, 5, IDS, "run --audio (voxtral)");
    } else {
        TH_FAIL("voxtral reference: %s", pkv_errmsg());
    }
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    free(rows);
    pkv_media_free(smp);
    pkv_mmproj_free(pj);
    pkv_model_free(m);
    remove(M), remove(P), remove(WAV), remove(IDS);
}

int main(void) {
    char M[512], P[512], IMG[512], L[512], EO[512], IDS[512], BAD[512];
    snprintf(M, sizeof M, "%s", th_tmp("media-cli.gguf"));
    snprintf(P, sizeof P, "%s", th_tmp("media-cli-proj.gguf"));
    snprintf(IMG, sizeof IMG, "%s", th_tmp("media-cli.png"));
    snprintf(L, sizeof L, "%s", th_tmp("media-cli.logits"));
    snprintf(EO, sizeof EO, "%s", th_tmp("media-cli.embd"));
    snprintf(IDS, sizeof IDS, "%s", th_tmp("media-cli.ids"));
    snprintf(BAD, sizeof BAD, "%s", th_tmp("media-cli.bad"));
    static uint8_t rgb[W * H * 3];
    for (size_t i = 0; i < sizeof rgb; i++) rgb[i] = (uint8_t)(i * 29 + i / 7);
    write_png(IMG, rgb);
    FILE *f = fopen(IMG, "rb");
    static uint8_t file[1 << 16];
    size_t fsz = f ? fread(file, 1, sizeof file, f) : 0;
    if (f) fclose(f);
    uint8_t *dec = NULL;
    int dw = 0, dh = 0;
    pkv_status ds = pkv_image_decode(file, fsz, NULL, &dec, &dw, &dh);
    if (ds == PKV_ERR_UNSUPPORTED) return th_skip("this build has no PNG decoder (libspng)");
    CHECK_OK(ds);
    REQUIRE(dec && dw == W && dh == H);
    CHECK_MEM(dec, rgb, sizeof rgb);

    CHECK_INT(th_cli("", true, "mkmodel --arch gemma3 --vision -o %s --mmproj-out %s", M, P), 0);
    /* logits with the image after 2 ids, and the projector's rows */
    CHECK_INT(th_cli("", true, "logits -m %s --mmproj %s --image %s --media-at 2 --tokens 2,10,20,30 -o %s --embd-out %s", M, P,
                     IMG, L, EO), 0);
    HAS("raw, little-endian");
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load(M, mp);
    REQUIRE(m);
    pkv_mmproj *pj = pkv_mmproj_load(P, m, pkv_model_device(m));
    REQUIRE(pj);
    pkv_mmproj_info info;
    CHECK_OK(pkv_mmproj_get_info(pj, &info));
    pkv_media im = {.kind = PKV_MEDIA_IMAGE, .rgb = dec, .width = dw, .height = dh};
    int64_t nr = 0;
    CHECK_OK(pkv_mmproj_n_rows(pj, &im, &nr));
    float *rows = malloc((size_t)nr * (size_t)info.n_embd * sizeof *rows);
    CHECK_OK(pkv_mmproj_encode(pj, &im, rows, nr));
    size_t ne = 0, nl = 0;
    float *eo = read_floats(EO, &ne), *lo = read_floats(L, &nl);
    REQUIRE(eo && lo);
    CHECK_INT(ne, (size_t)nr * (size_t)info.n_embd);
    if (ne == (size_t)nr * (size_t)info.n_embd) CHECK_MEM(eo, rows, ne * sizeof *rows);
    pkv_model_info mi;
    CHECK_OK(pkv_model_get_info(m, &mi));
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    REQUIRE(c);
    pkv_context *ctx = pkv_context_create(m, c, 0);
    const int32_t ids[4] = {2, 10, 20, 30};
    pkv_media_rows r = {.key = pkv_media_key(pkv_media_hash(&im), info.fingerprint), .n_rows = (int32_t)nr, .embd = rows,
                        .non_causal = info.non_causal, .at = 2};
    CHECK_OK(pkv_context_decode_prompt(ctx, ids, 4, &r, 1));
    CHECK_INT(nl, (size_t)mi.n_vocab);
    if (nl == (size_t)mi.n_vocab) CHECK_MEM(lo, pkv_context_logits(ctx), nl * sizeof *lo);
    pkv_context_free(ctx);

    /* run: a marker, greedy ids == the API's */
    CHECK_INT(th_cli("", true, "run -m %s --mmproj %s --image %s -p 'Look: <__media__> what?' -n 5 --temp 0 --seed 1 "
                     "--ignore-eos --ids-out %s", M, P, IMG, IDS), 0);
    int32_t t[256];
    size_t n = 0;
    tok_append(m, "Look: ", true, t, &n);
    tok_append(m, "<start_of_image>", false, t, &n);
    r.at = (int32_t)n;
    tok_append(m, "<end_of_image>", false, t, &n);
    tok_append(m, " what?", false, t, &n);
    ctx = pkv_context_create(m, c, 0);
    CHECK_OK(pkv_context_decode_prompt(ctx, t, (int32_t)n, &r, 1));
    expect_greedy_ids(ctx, mi.n_vocab, 5, IDS, "run --image");
    pkv_context_free(ctx);

    /* demo */
    CHECK_INT(th_cli("", false, "demo -m %s --mmproj %s --image %s --device cpu", M, P, IMG), 0);
    HAS("media-save");
    HAS("8 passed, 0 failed");

    /* errors */
    CHECK_INT(th_cli("", true, "logits -m %s --image %s --tokens 1,2", M, IMG), 2);
    HAS("--mmproj FILE");
    CHECK_INT(th_cli("", true, "run -m %s --mmproj %s --image %s -p '<__media__> <__media__>' -n 1", M, P, IMG), 1);
    HAS("2 <__media__> markers for 1 media files");
    CHECK_INT(th_cli("", true, "logits -m %s --mmproj %s --audio %s --tokens 1,2", M, P, IMG), 1);
    HAS("encodes images");
    FILE *bf = fopen(BAD, "wb");
    if (bf) {
        fputs("not an image", bf);
        fclose(bf);
    }
    CHECK_INT(th_cli("", true, "logits -m %s --mmproj %s --image %s --tokens 1,2", M, P, BAD), 1);
    CHECK(strstr(th_out, BAD) != NULL);
    CHECK_INT(th_cli("", true, "logits -m %s --mmproj %s --image %s --media-at 9 --tokens 1,2", M, P, IMG), 1);
    HAS("--media-at 9");

    free(rows);
    free(eo);
    free(lo);
    pkv_media_free(dec);
    pkv_kv_cache_free(c);
    pkv_mmproj_free(pj);
    pkv_model_free(m);
    remove(M), remove(P), remove(IMG), remove(L), remove(EO), remove(IDS), remove(BAD);

    test_voxtral_run();
    return th_done();
}
