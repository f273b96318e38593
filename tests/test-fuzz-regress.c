// labels: unit model kv
/* Regression tests for the defects the fuzz harnesses (fuzz/, docs/testing.md)
 * found: each case rebuilds the failing input by hand, small and readable, and
 * checks the corrected behaviour (a status and message, or exact content). */
#include "testhelp.h"

#include "device/cpu/cpu-dots.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

#define SP "\xe2\x96\x81" /* U+2581 */

/* SPM vocabulary: <unk> <s> </s>, "▁hi", "h", "i", "▁". */
static pkv_tokenizer *spm(void) {
    static const char *toks[] = {"<unk>", "<s>", "</s>", SP "hi", "h", "i", SP};
    static const int32_t types[] = {PKV_TOKEN_UNKNOWN, PKV_TOKEN_CONTROL, PKV_TOKEN_CONTROL, PKV_TOKEN_NORMAL,
                                    PKV_TOKEN_NORMAL,  PKV_TOKEN_NORMAL,  PKV_TOKEN_NORMAL};
    pkv_vocab_desc d = pkv_vocab_desc_default();
    d.model = "llama";
    d.n_tokens = 7;
    d.tokens = toks;
    d.types = types;
    d.bos_id = 1;
    d.eos_id = 2;
    d.unk_id = 0;
    return pkv_tokenizer_create(&d);
}

/* fuzz-tokenizer: pkv_detokenize of SPM ids wrote the whole piece "▁hi" (3
 * bytes, " hi") into the buffer and then moved it down over the dummy space, so
 * a buffer of exactly the text's size ("hi", 2 bytes) got one byte written past
 * its end (stack-buffer-overflow under ASan). */
static void test_spm_detokenize_exact_buffer(void) {
    pkv_tokenizer *tok = spm();
    REQUIRE_VOID(tok);
    const int32_t one[] = {3};
    char *exact = malloc(2); /* ASan sees a write past it; the canary below the rest */
    size_t n = 0;
    REQUIRE_VOID(exact);
    CHECK_OK(pkv_detokenize(tok, one, 1, false, exact, 2, &n));
    CHECK(n == 2 && memcmp(exact, "hi", 2) == 0);
    free(exact);
    char buf[8];
    memset(buf, '#', sizeof buf);
    CHECK_OK(pkv_detokenize(tok, one, 1, false, buf, 2, &n));
    CHECK(n == 2 && memcmp(buf, "hi##", 4) == 0);
    /* after a special token the next piece loses its dummy space too */
    const int32_t two[] = {3, 1, 3};
    memset(buf, '#', sizeof buf);
    CHECK_OK(pkv_detokenize(tok, two, 3, true, buf, 7, &n));
    CHECK(n == 7 && memcmp(buf, "hi<s>hi#", 8) == 0);
    /* "▁" alone: the piece is only the dummy space, nothing is written */
    const int32_t sp[] = {6};
    memset(buf, '#', sizeof buf);
    CHECK_OK(pkv_detokenize(tok, sp, 1, false, buf, 0, &n));
    CHECK(n == 0 && buf[0] == '#');
    pkv_tokenizer_free(tok);
}

/* fuzz-gguf: a model with an infinite weight made the AVX2 activation quantizer
 * convert NaN lanes to 0x80000000 and add them as int (signed overflow, UBSan);
 * the bytes were also outside the format (-128, sums wrapped). Every path now
 * clamps: quants in [-127, 127] and s[h] their sums, whatever the input. */
static void check_q8a(const char *path, const pkv_q8a *y, int nb) {
    for (int b = 0; b < nb; b++)
        for (int h = 0; h < 2; h++) {
            int sum = 0;
            th_checks += 2;
            for (int j = 16 * h; j < 16 * h + 16; j++) {
                if (y[b].qs[j] < -127) TH_FAIL("%s: block %d quant %d is %d", path, b, j, y[b].qs[j]);
                sum += y[b].qs[j];
            }
            if (sum != y[b].s[h]) TH_FAIL("%s: block %d s[%d] = %d, the quants sum to %d", path, b, h, y[b].s[h], sum);
        }
}

static void test_q8a_non_finite(void) {
    enum { NB = 4 };
    float x[NB * 32];
    for (int i = 0; i < NB * 32; i++) x[i] = (float)(i % 7) - 3.0f;
    x[3] = INFINITY;       /* block 0: amax inf, every other lane inf * 0 */
    x[32 + 5] = NAN;       /* block 1: one NaN */
    x[64 + 1] = -INFINITY; /* block 2 */
    for (int j = 0; j < 32; j++) x[96 + j] = NAN; /* block 3: all NaN */
    pkv_q8a y[NB];
    pkv_cpu_quantize_q8a(x, y, NB);
    check_q8a("generic", y, NB);
#ifdef PKV_CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        memset(y, 0x55, sizeof y);
        pkv_cpu_dots_avx2.q8a(x, y, NB);
        check_q8a("avx2", y, NB);
    }
#endif
#ifdef PKV_CPU_ARM
    memset(y, 0x55, sizeof y);
    pkv_cpu_dots_neon.q8a(x, y, NB); /* Advanced SIMD: every aarch64 CPU */
    check_q8a("neon", y, NB);
#endif
}

static pkv_model *tiny_model(void) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.type = PKV_TYPE_F32;
    p.n_layer = 2;
    p.n_embd = 32;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 64;
    p.n_vocab = 300;
    p.n_ctx = 128;
    void *img = NULL;
    size_t n = 0;
    if (pkv_mkmodel_memory(&p, &img, &n)) return NULL;
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 1;
    pkv_model *m = pkv_model_load_memory(img, n, "tiny", mp);
    pkv_mkmodel_free_memory(img);
    return m;
}

/* fuzz-kvfile: pkv_context_load re-decodes the saved last token to get logits,
 * and did so at "previous position + 1": a sequence whose positions have a gap
 * (pkv_kv_shift re-positions tokens) came back with its last position changed.
 * Now it is decoded at its saved position: tokens and positions equal the
 * saved ones. */
static void test_context_load_keeps_positions(void) {
    pkv_model *m = tiny_model();
    REQUIRE_VOID(m);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    cp.page_size = 4;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    REQUIRE_VOID(ctx);
    const int32_t toks[6] = {10, 20, 30, 40, 50, 60};
    CHECK_OK(pkv_context_decode(ctx, toks, 6));
    CHECK_OK(pkv_kv_shift(c, pkv_context_seq(ctx), 5, 0, 5)); /* positions 0 1 2 3 4 10 */
    int32_t want_pos[6], got_tok[6], got_pos[6];
    CHECK_OK(pkv_kv_seq_tokens(c, pkv_context_seq(ctx), 0, 6, NULL, want_pos));
    CHECK(want_pos[4] == 4 && want_pos[5] == 10);
    const char *path = th_tmp("fuzz-regress-gap.seq");
    CHECK_OK(pkv_context_save(ctx, path));
    pkv_context *back = pkv_context_load(m, c, path, 0);
    REQUIRE_VOID(back);
    CHECK_INT(pkv_context_n_tokens(back), 6);
    CHECK_OK(pkv_kv_seq_tokens(c, pkv_context_seq(back), 0, 6, got_tok, got_pos));
    CHECK_MEM(got_tok, toks, sizeof toks);
    CHECK_MEM(got_pos, want_pos, sizeof want_pos);
    CHECK(pkv_context_logits(back) != NULL);
    pkv_context_free(back);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    remove(path);
}

/* fuzz-gguf: a GGUF with no tensors that ends before the alignment padding
 * (29 bytes: header, no keys, 5 stray bytes) opened with data_offset 32, past
 * the end of the file. Still accepted (there is no tensor data to miss), with
 * the empty data section at the end of the file. */
static void test_gguf_data_offset_in_file(void) {
    static const uint8_t img[29] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, /* version 3 */
                                    0, 0, 0, 0, 0, 0, 0, 0,          /* tensor_count 0 */
                                    0, 0, 0, 0, 0, 0, 0, 0,          /* kv_count 0 */
                                    0xff, '1', '.', 'c', 0x16};
    pkv_gguf *g = NULL;
    CHECK_OK(pkv_gguf_read_memory(img, sizeof img, "short", &g));
    REQUIRE_VOID(g);
    CHECK_INT(pkv_gguf_n_tensors(g), 0);
    CHECK_INT(pkv_gguf_file_size(g), 29);
    CHECK_INT(pkv_gguf_data_offset(g), 29);
    pkv_gguf_close(g);
    /* with the padding present the data section starts at the alignment, as before */
    uint8_t padded[40] = {0};
    memcpy(padded, img, 24);
    CHECK_OK(pkv_gguf_read_memory(padded, sizeof padded, "padded", &g));
    REQUIRE_VOID(g);
    CHECK_INT(pkv_gguf_data_offset(g), 32);
    pkv_gguf_close(g);
}

int main(void) {
    test_spm_detokenize_exact_buffer();
    test_q8a_non_finite();
    test_context_load_keeps_positions();
    test_gguf_data_offset_in_file();
    CHECK_INT(pkv_alloc_live(), 0);
    return th_done();
}
