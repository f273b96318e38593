// labels: unit model kv
/* Regression tests for the defects the fuzz harnesses (fuzz/, docs/testing.md)
 * found: each case rebuilds the failing input by hand, small and readable, and
 * checks the corrected behaviour (a status and message, or exact content). */
#include "testhelp.h"

#include "model/tokenizer.h"

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

int main(void) {
    test_spm_detokenize_exact_buffer();
    CHECK_INT(pkv_alloc_live(), 0);
    return th_done();
}
