/* Fuzz harness: constrained output. GBNF grammars (pkv_grammar_from_gbnf) and JSON
 * schemas (pkv_grammar_from_json_schema) are parsed, and a grammar that parses is
 * matched token by token over a small fixed vocabulary (every byte, JSON and UTF-8
 * pieces, an end-of-generation token) through the matcher the sampler uses
 * (src/engine/grammar.h), under low work limits.
 *
 * Input: a flags byte, an ops-length byte, the text, then that many op bytes.
 *   flags bit 0: a JSON schema, else GBNF
 *   flags bit 1: the text is expanded: a u24 count n (at most 200000), then
 *                PRE NUL OPEN NUL MID NUL CLOSE, giving PRE + OPEN x n + MID +
 *                CLOSE x n (deep nesting from a small input: '(' 100000 deep,
 *                'items' chains)
 *   flags bit 2: work limits of 2000 steps per token and 20000 per request (the
 *                failure path), else 500k and 4M
 *   flags bit 3: fail the n-th allocation of the parse (n = the ops-length byte)
 *   ops, one byte each (at most 32): 0 mask and accept an allowed token (the
 *   byte's high bits pick which), 1 a refused token must change nothing, 2 feed
 *   one byte (the next op byte), 3 a clone gives the same mask, then reset.
 *
 * Checked: a refused grammar has a message and leaves no allocation; a schema's
 * generated GBNF parses again; a mask is -1 only with the matcher's failure
 * recorded, else its count equals its bits; an allowed token is accepted (unless a
 * work limit stops it) and an end-of-generation token is allowed only where the
 * input is complete; a refused token leaves the mask as it was; no operation passes
 * the per-token limit by more than one batch of stacks, nor the request by more
 * than one operation; no input is slow (the work limits bound matching; parsing is
 * linear with nesting bounded); no leak. */
#include "fuzz-common.h"

#include "engine/grammar.h"

#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_OPS = 32, MAX_EXPAND = 200000, MAX_TEXT = 2 << 20 };

static pkv_grammar_vocab *g_vocab;
static int32_t g_nv, g_eog;

static const char *const k_pieces[] = {
    "{\"", "\":", "\",\"", "\"}", "true", "false", "null", "[]", "{}", "[", "]}", "},{", "  ", "\n", "\t",
    "ab", "abc", "aaaa", "a\"", "\":\"", "0.5", "-1", "1e5", "123", "\\u00e9", "\\n", "\\\"", "\xc3\xa9",
    "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xe2\x82", "\xa9", " \"", "\": ", ", ", "xyz", "</s>",
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pkv_log_set(NULL, NULL, PKV_LOG_NONE);
    enum { NP = sizeof k_pieces / sizeof k_pieces[0] };
    static char bytes[256];
    static const char *pieces[256 + NP];
    static size_t lens[256 + NP];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, pieces[i] = &bytes[i], lens[i] = 1;
    for (int i = 0; i < NP; i++) pieces[256 + i] = k_pieces[i], lens[256 + i] = strlen(k_pieces[i]);
    g_nv = 256 + NP;
    g_eog = g_nv - 1; /* "</s>" */
    g_vocab = pkv_grammar_vocab_from_pieces(pieces, lens, g_nv, &g_eog, 1);
    if (!g_vocab) {
        fprintf(stderr, "fuzz-grammar: vocabulary: %s\n", pkv_errmsg());
        abort();
    }
    return 0;
}

static uint32_t u24_at(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16; }

/* The text of an expanded input into *out (malloc'd); false when malformed. */
static bool expand(const uint8_t *d, size_t n, char **out, size_t *len) {
    if (n < 3) return false;
    uint32_t reps = u24_at(d) % (MAX_EXPAND + 1);
    d += 3, n -= 3;
    const uint8_t *end = d + n, *part[4];
    size_t plen[4];
    for (int k = 0; k < 4; k++) {
        const uint8_t *z = k < 3 ? memchr(d, 0, (size_t)(end - d)) : end;
        if (!z) return false;
        part[k] = d, plen[k] = (size_t)(z - d);
        d = z < end ? z + 1 : end;
    }
    const uint8_t *open = part[1], *mid = part[2], *close = part[3];
    size_t lp = plen[0], lo = plen[1], lm = plen[2], lc = plen[3];
    size_t total = lp + lm + (size_t)reps * (lo + lc);
    if (total > MAX_TEXT) return false;
    char *t = malloc(total + 1), *w = t;
    FUZZ_CHECK(t);
    memcpy(w, part[0], lp), w += lp;
    for (uint32_t i = 0; i < reps; i++, w += lo) memcpy(w, open, lo);
    memcpy(w, mid, lm), w += lm;
    for (uint32_t i = 0; i < reps; i++, w += lc) memcpy(w, close, lc);
    *out = t, *len = total;
    return true;
}

static int64_t popcount_bits(const uint64_t *b, int32_t n) {
    int64_t c = 0;
    for (int32_t i = 0; i < (n + 63) / 64; i++) c += __builtin_popcountll(b[i]);
    return c;
}

/* The k-th (mod count) token whose bit is set (want) or clear (!want); -1: none. */
static int32_t pick(const uint64_t *b, int32_t n, bool want, uint32_t k) {
    int64_t cnt = 0;
    for (int32_t t = 0; t < n; t++) cnt += ((b[t / 64] >> (t % 64)) & 1) == want;
    if (!cnt) return -1;
    k %= (uint32_t)cnt;
    for (int32_t t = 0; t < n; t++)
        if (((b[t / 64] >> (t % 64)) & 1) == want && k-- == 0) return t;
    return -1;
}

/* The work of m's last operation and in all stays within the limits (the per-token
 * check runs after each batch of at most MAX_STACKS stacks; the request's after each
 * operation's batch). */
static void check_work(const pkv_gmatch *m, uint64_t lim_tok, uint64_t lim_req) {
    uint64_t last, total;
    pkv_gmatch_work(m, &last, &total);
    FUZZ_CHECK(last <= lim_tok + 2 * PKV_GRAMMAR_MAX_STACKS);
    FUZZ_CHECK(total <= lim_req + lim_tok + 2 * PKV_GRAMMAR_MAX_STACKS);
}

/* Mask of m into bits; -1 only with a failure recorded. */
static int64_t mask(pkv_gmatch *m, uint64_t *bits, uint64_t lt, uint64_t lr) {
    int64_t n = pkv_gmatch_mask(m, g_vocab, bits);
    check_work(m, lt, lr);
    if (n < 0) {
        FUZZ_CHECK(pkv_errmsg()[0] != 0);
        return -1;
    }
    FUZZ_CHECK(popcount_bits(bits, g_nv) == n);
    if ((bits[g_eog / 64] >> (g_eog % 64)) & 1) FUZZ_CHECK(pkv_gmatch_complete(m));
    return n;
}

static void run_ops(pkv_gmatch *m, const uint8_t *ops, size_t n_ops, uint64_t lt, uint64_t lr) {
    enum { W = (256 + sizeof k_pieces / sizeof k_pieces[0] + 63) / 64 };
    uint64_t bits[W], again[W];
    size_t i = 0;
    for (int k = 0; k < MAX_OPS && i < n_ops; k++) {
        uint8_t op = ops[i++];
        if (pkv_gmatch_failure(m)) break; /* stays failed until reset */
        switch (op & 3) {
        case 0: {
            int64_t n = mask(m, bits, lt, lr);
            if (n <= 0) break;
            int32_t t = pick(bits, g_nv, true, op >> 2);
            FUZZ_CHECK(t >= 0);
            bool ok = pkv_gmatch_accept_token(m, g_vocab, t);
            check_work(m, lt, lr);
            FUZZ_CHECK(ok || pkv_gmatch_failure(m));
            break;
        }
        case 1: {
            if (mask(m, bits, lt, lr) < 0) break;
            int32_t t = pick(bits, g_nv, false, op >> 2);
            if (t < 0) break;
            FUZZ_CHECK(!pkv_gmatch_accept_token(m, g_vocab, t));
            check_work(m, lt, lr);
            if (pkv_gmatch_failure(m)) break;
            if (mask(m, again, lt, lr) < 0) break;
            FUZZ_CHECK(memcmp(bits, again, sizeof bits) == 0);
            break;
        }
        case 2: {
            uint8_t b = i < n_ops ? ops[i++] : 0;
            (void)pkv_gmatch_accept_bytes(m, &b, 1);
            check_work(m, lt, lr);
            break;
        }
        default: {
            pkv_gmatch *c = pkv_gmatch_clone(m);
            FUZZ_CHECK(c);
            int64_t a = mask(m, bits, lt, lr);
            int64_t b = mask(c, again, lt, lr);
            if (a >= 0 && b >= 0) FUZZ_CHECK(a == b && memcmp(bits, again, sizeof bits) == 0);
            pkv_gmatch_free(c);
            pkv_gmatch_reset(m); /* may fail again at once under the low limits */
            break;
        }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint8_t flags = data[0], n_ops = data[1];
    if ((size_t)n_ops > size - 2) n_ops = (uint8_t)(size - 2);
    const uint8_t *body = data + 2, *ops = data + size - n_ops;
    size_t body_len = size - 2 - n_ops;
    bool schema = flags & 1;
    uint64_t lt = (flags & 4) ? 2000 : 500000, lr = (flags & 4) ? 20000 : 4000000;

    char *text = NULL;
    size_t len = body_len;
    if (flags & 2) {
        if (!expand(body, body_len, &text, &len)) return 0;
    } else {
        text = malloc(len + 1);
        FUZZ_CHECK(text);
        memcpy(text, body, len);
    }
    int64_t live0 = pkv_alloc_live();
    if (flags & 8) pkv_alloc_fail_at(n_ops ? n_ops : 1);
    pkv_grammar *g = schema ? pkv_grammar_from_json_schema(text, len) : pkv_grammar_from_gbnf(text, len);
    pkv_alloc_fail_at(0);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz-grammar: %s of %zu bytes: %s\n", schema ? "schema" : "gbnf", len,
                g ? "parsed" : pkv_errmsg());
    free(text);
    if (!g) {
        FUZZ_CHECK(pkv_errmsg()[0] != 0);
        FUZZ_CHECK(pkv_alloc_live() == live0);
        return 0;
    }
    if (flags & 8) { /* the allocation failure came after the parse: nothing to match */
        pkv_grammar_free(g);
        FUZZ_CHECK(pkv_alloc_live() == live0);
        return 0;
    }
    const char *gbnf = pkv_grammar_gbnf(g);
    FUZZ_CHECK(gbnf && gbnf[0]);
    if (schema) {
        pkv_grammar *again = pkv_grammar_from_gbnf(gbnf, strlen(gbnf));
        FUZZ_CHECK(again != NULL);
        pkv_grammar_free(again);
    }
    FUZZ_CHECK(pkv_grammar_set_work_limits(g, lt, lr) == PKV_OK);
    pkv_gmatch *m = pkv_gmatch_create(g);
    if (!m) FUZZ_CHECK(pkv_errmsg()[0] != 0); /* its start state alone passes the limits */
    if (m) run_ops(m, ops, n_ops, lt, lr);
    pkv_gmatch_free(m);
    /* the op bytes as a whole document (the same limits apply) */
    (void)pkv_grammar_accepts(g, (const char *)ops, n_ops);
    pkv_grammar_free(g);
    FUZZ_CHECK(pkv_alloc_live() == live0);
    return 0;
}
