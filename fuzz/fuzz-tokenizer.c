/* Fuzz harness: the tokenizer (src/model/tokenizer*.c).
 *
 * Input: byte 0 picks the tokenizer and the flags, the rest is the text.
 *   bits 0-2  0 BPE builtin vocabulary, pre-tokenizer llama-bpe
 *             1 the same vocabulary with pre qwen2
 *             2 ... with pre default (the GPT-2 pattern)
 *             3 ... with pre llama3 (alias of llama-bpe) and add_eos
 *             4 SPM with <0xNN> byte tokens, space prefix
 *             5 SPM with byte tokens, no space prefix
 *             6 none (no vocabulary: every call must fail with UNSUPPORTED)
 *             7 a vocabulary made from the input itself (see make_vocab)
 *   bit 3     add_special      bit 4  parse_special
 *   bit 5     render_special for the random ids
 *
 * Checked for the text: tokenize's buffer contract (too small: PKV_ERR_INVALID,
 * the count needed, out untouched), ids in range, the same count on every call;
 * detokenize's buffer contract; for the fixed vocabularies (every byte has a
 * token) the round trip detokenize(tokenize(text)) == text, with special tokens
 * parsed and rendered alike (SPM: only for text without U+2581, which SPM turns
 * into a space); for BPE, the pre-tokenizer's pieces cover the text in order.
 * Then the text's bytes, read as int32 ids (in range and out of range), go
 * through pkv_detokenize and pkv_token_piece. */
#include "fuzz-common.h"

#include "model/tokenizer.h"

#include <stdint.h>

enum { N_FIXED = 7 };
static pkv_tokenizer *g_tok[N_FIXED];
static const char *const g_pre[N_FIXED] = {"llama-bpe", "qwen2", "default", "llama3", NULL, NULL, NULL};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* SPM vocabulary: <unk> <s> </s>, the 256 byte tokens, pieces of English words
 * with scores (longer pieces rank higher), a user-defined token. */
static pkv_tokenizer *make_spm(int add_space_prefix) {
    static char bytes[256][8];
#define SP "\xe2\x96\x81" /* U+2581 */
    static const char *const words[] = {SP, SP "t", SP "th", SP "the", "he", "in", "er", SP "a", "an", "on", "re",
                                        SP "an", SP "and", "e", "t", "h", "a", "n", "d", "o", "r", "i", "\xc3\xa9",
                                        SP SP, "<tool>"};
#undef SP
    enum { NW = sizeof words / sizeof words[0], N = 3 + 256 + NW };
    static const char *toks[N];
    static float scores[N];
    static int32_t types[N];
    toks[0] = "<unk>";
    toks[1] = "<s>";
    toks[2] = "</s>";
    types[0] = PKV_TOKEN_UNKNOWN;
    types[1] = types[2] = PKV_TOKEN_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = PKV_TOKEN_BYTE;
    }
    for (int i = 0; i < NW; i++) {
        toks[259 + i] = words[i];
        scores[259 + i] = (float)strlen(words[i]) - 0.01f * (float)i;
        types[259 + i] = PKV_TOKEN_NORMAL;
    }
    types[N - 1] = PKV_TOKEN_USER_DEFINED;
    pkv_vocab_desc d = pkv_vocab_desc_default();
    d.model = "llama";
    d.n_tokens = N;
    d.tokens = toks;
    d.scores = scores;
    d.types = types;
    d.bos_id = 1;
    d.eos_id = 2;
    d.unk_id = 0;
    d.add_space_prefix = add_space_prefix;
    return pkv_tokenizer_create(&d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pkv_log_set(NULL, NULL, PKV_LOG_NONE);
    pkv_vocab_desc *b = pkv_vocab_builtin_create(600);
    FUZZ_CHECK(b);
    for (int i = 0; i < 4; i++) {
        pkv_vocab_desc d = *b;
        d.pre = g_pre[i];
        if (i == 3) d.add_eos = 1;
        g_tok[i] = pkv_tokenizer_create(&d);
        FUZZ_CHECK(g_tok[i]);
    }
    pkv_vocab_builtin_free(b);
    g_tok[4] = make_spm(-1);
    g_tok[5] = make_spm(0);
    pkv_vocab_desc d = pkv_vocab_desc_default();
    d.model = "none";
    d.n_tokens = 1000;
    g_tok[6] = pkv_tokenizer_create(&d);
    for (int i = 0; i < N_FIXED; i++) FUZZ_CHECK(g_tok[i]);
    return 0;
}

/* A vocabulary from the input: byte 0 = model and pre, bytes 1..3 = bos, eos, unk
 * (255: none), then lines up to an empty line; a line's first byte is its kind:
 * '=' a merge "left right", '!' control, '?' user-defined, '~' unused, '#' byte
 * token, anything else a normal token (the whole line). The text follows. */
static pkv_tokenizer *make_vocab(const uint8_t **pdata, size_t *psize) {
    const uint8_t *p = *pdata, *end = p + *psize;
    if (end - p < 4) return NULL;
    uint8_t cfg = p[0];
    int ids[3] = {p[1], p[2], p[3]};
    p += 4;
    enum { MAX = 512 };
    const char *toks[MAX], *merges[MAX];
    size_t tok_lens[MAX], merge_lens[MAX];
    float scores[MAX];
    int32_t types[MAX];
    int nt = 0, nm = 0;
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *le = nl ? nl : end;
        if (le == p) { /* empty line: the text starts after it */
            p++;
            break;
        }
        uint8_t k = *p;
        if (k == '=' && nm < MAX) {
            merges[nm] = (const char *)p + 1;
            merge_lens[nm++] = (size_t)(le - p - 1);
        } else if (nt < MAX) {
            bool tagged = k == '!' || k == '?' || k == '~' || k == '#';
            toks[nt] = (const char *)p + tagged;
            tok_lens[nt] = (size_t)(le - p - tagged);
            types[nt] = k == '!' ? PKV_TOKEN_CONTROL : k == '?' ? PKV_TOKEN_USER_DEFINED
                      : k == '~' ? PKV_TOKEN_UNUSED : k == '#' ? PKV_TOKEN_BYTE : PKV_TOKEN_NORMAL;
            scores[nt] = (cfg & 0x40) ? (float)(int8_t)p[le - p > 1 ? 1 : 0] : -(float)nt;
            nt++;
        }
        p = nl ? nl + 1 : end;
    }
    *pdata = p;
    *psize = (size_t)(end - p);
    static const char *const pres[] = {"llama-bpe", "qwen2", "default", "gpt2"};
    pkv_vocab_desc d = pkv_vocab_desc_default();
    d.model = (cfg & 1) ? "llama" : "gpt2";
    d.pre = pres[(cfg >> 1) & 3];
    d.n_tokens = nt;
    d.tokens = toks;
    d.token_lens = tok_lens;
    d.scores = (cfg & 0x60) ? scores : NULL;
    d.types = (cfg & 0x10) ? types : NULL;
    d.n_merges = nm;
    d.merges = merges;
    d.merge_lens = merge_lens;
    d.bos_id = ids[0] == 255 ? -1 : ids[0];
    d.eos_id = ids[1] == 255 ? -1 : ids[1];
    d.unk_id = ids[2] == 255 ? -1 : ids[2];
    d.add_space_prefix = (cfg & 8) ? 0 : -1;
    d.add_bos = (cfg & 0x80) ? 1 : -1;
    return pkv_tokenizer_create(&d);
}

static bool contains(const uint8_t *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, needle, k) == 0) return true;
    return false;
}

/* Tokenize, check the contracts, detokenize; round trip when asked. */
static void check_text(const pkv_tokenizer *tok, const uint8_t *text, size_t len, bool add_special, bool parse_special,
                       bool roundtrip) {
    const char *t = (const char *)text;
    int32_t canary[2] = {-77, -77};
    size_t need = 12345;
    pkv_status st = pkv_tokenize(tok, t, len, add_special, parse_special, canary, 0, &need);
    if (pkv_tokenizer_kind_of(tok) == PKV_TOKENIZER_NONE) {
        FUZZ_CHECK(st == PKV_ERR_UNSUPPORTED);
        return;
    }
    if (st == PKV_ERR_UNSUPPORTED) { /* a byte without a token and no unknown token */
        FUZZ_CHECK(!roundtrip);
        return;
    }
    FUZZ_CHECK(st == PKV_OK || st == PKV_ERR_INVALID);
    FUZZ_CHECK(canary[0] == -77);
    if (st == PKV_OK) FUZZ_CHECK(need == 0);
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    FUZZ_CHECK(ids);
    size_t n = 0;
    if (need > 0) {
        ids[need - 1] = -77;
        size_t n2 = 0;
        FUZZ_CHECK(pkv_tokenize(tok, t, len, add_special, parse_special, ids, need - 1, &n2) == PKV_ERR_INVALID);
        FUZZ_CHECK(n2 == need && ids[need - 1] == -77);
    }
    FUZZ_CHECK(pkv_tokenize(tok, t, len, add_special, parse_special, ids, need, &n) == PKV_OK);
    FUZZ_CHECK(n == need);
    int32_t nv = pkv_tokenizer_n_tokens(tok);
    for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv);
    size_t bytes = 0;
    char c0 = 'x';
    st = pkv_detokenize(tok, ids, n, parse_special, &c0, 0, &bytes);
    FUZZ_CHECK(st == PKV_OK || st == PKV_ERR_INVALID);
    FUZZ_CHECK(c0 == 'x');
    char *back = malloc(bytes + 1);
    FUZZ_CHECK(back);
    size_t got = 0;
    FUZZ_CHECK(pkv_detokenize(tok, ids, n, parse_special, back, bytes + 1, &got) == PKV_OK);
    FUZZ_CHECK(got == bytes && back[got] == '\0');
    if (roundtrip && !add_special) {
        if (got != len || memcmp(back, text, len) != 0) {
            fprintf(stderr, "round trip: %zu bytes in, %zu bytes out\n", len, got);
            FUZZ_CHECK(!"detokenize(tokenize(text)) == text");
        }
    }
    free(back);
    free(ids);
}

static void check_pretokenize(const char *pre, const uint8_t *text, size_t len) {
    size_t n = 0, one;
    pkv_status st = pkv_pretokenize(pre, (const char *)text, len, &one, 0, &n);
    FUZZ_CHECK(st == PKV_OK || st == PKV_ERR_INVALID);
    size_t *ends = malloc((n + 1) * sizeof *ends);
    FUZZ_CHECK(ends);
    size_t m = 0;
    FUZZ_CHECK(pkv_pretokenize(pre, (const char *)text, len, ends, n, &m) == PKV_OK && m == n);
    size_t prev = 0;
    for (size_t i = 0; i < m; i++) {
        FUZZ_CHECK(ends[i] > prev && ends[i] <= len);
        prev = ends[i];
    }
    FUZZ_CHECK(prev == len);
    free(ends);
}

/* The text's bytes as ids: every 4 bytes one id, mostly near the vocabulary. */
static void check_ids(const pkv_tokenizer *tok, const uint8_t *d, size_t len, bool render) {
    size_t n = len / 4;
    if (n > 256) n = 256;
    int32_t ids[256];
    int32_t nv = pkv_tokenizer_n_tokens(tok);
    bool all_in = true;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, d + 4 * i, 4);
        ids[i] = (u & 0x80000000u) ? (int32_t)u : (int32_t)(u % (uint32_t)(nv + 2)) - 1;
        all_in &= ids[i] >= 0 && ids[i] < nv;
    }
    size_t bytes = 0;
    char small[4] = "abc";
    pkv_status st = pkv_detokenize(tok, ids, n, render, small, sizeof small, &bytes);
    if (pkv_tokenizer_kind_of(tok) == PKV_TOKENIZER_NONE) {
        FUZZ_CHECK(st == PKV_ERR_UNSUPPORTED);
        return;
    }
    if (!all_in) FUZZ_CHECK(st == PKV_ERR_INVALID);
    if (st == PKV_ERR_INVALID && all_in) {
        FUZZ_CHECK(bytes >= sizeof small && memcmp(small, "abc", 4) == 0);
        char *buf = malloc(bytes + 1);
        FUZZ_CHECK(buf);
        size_t got = 0;
        FUZZ_CHECK(pkv_detokenize(tok, ids, n, render, buf, bytes + 1, &got) == PKV_OK && got == bytes);
        free(buf);
    }
    for (size_t i = 0; i < n && i < 64; i++) {
        char piece[8];
        size_t pn = 0;
        st = pkv_token_piece(tok, ids[i], render, piece, sizeof piece, &pn);
        if (ids[i] < 0 || ids[i] >= nv) FUZZ_CHECK(st == PKV_ERR_INVALID);
        else FUZZ_CHECK(st == PKV_OK || (st == PKV_ERR_INVALID && pn >= sizeof piece));
        (void)pkv_tokenizer_is_eog(tok, ids[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t cfg = data[0];
    int which = cfg & 7;
    bool add_special = cfg & 8, parse_special = cfg & 16, render = cfg & 32;
    const uint8_t *text = data + 1;
    size_t len = size - 1;
    int64_t live0 = pkv_alloc_live();
    pkv_tokenizer *own = NULL;
    const pkv_tokenizer *tok;
    bool roundtrip;
    if (which == 7) {
        own = make_vocab(&text, &len);
        if (!own) {
            FUZZ_CHECK(pkv_alloc_live() == live0);
            return 0;
        }
        tok = own;
        roundtrip = false;
    } else {
        tok = g_tok[which];
        roundtrip = which < 4 || (which <= 5 && !contains(text, len, "\xe2\x96\x81"));
    }
    check_text(tok, text, len, add_special, parse_special, roundtrip);
    if (which < 4) check_pretokenize(g_pre[which], text, len);
    check_ids(tok, text, len, render);
    (void)pkv_tokenizer_find(tok, (const char *)text, len);
    pkv_tokenizer_free(own);
    FUZZ_CHECK(pkv_alloc_live() == live0);
    return 0;
}
