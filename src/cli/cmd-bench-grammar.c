/* pagekv bench grammar: the cost of a constrained-output token mask with a large
 * vocabulary (issue 27 item 3). The vocabulary is a model's (-m) or a synthesized
 * one of --vocab tokens shaped like a modern BPE vocabulary: every byte, English
 * words with and without a leading space, numbers, punctuation runs, whitespace
 * runs, CJK characters and pairs, accented words, emoji and split UTF-8 pieces.
 * Each grammar is driven for --tokens steps by drawing uniformly among the allowed
 * tokens (restarting when it completes); every step's mask is timed warm (the
 * sequence's own matcher, with its cache of recent states) and cold (a fresh clone,
 * no cache). JSON on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "engine/grammar.h"

typedef struct bvocab {
    char **piece;
    size_t *len;
    int32_t n, cap;
} bvocab;

static uint64_t bg_rng = 0x243f6a8885a308d3ull;
static uint64_t bg_next(void) {
    bg_rng ^= bg_rng << 13;
    bg_rng ^= bg_rng >> 7;
    bg_rng ^= bg_rng << 17;
    return bg_rng;
}

static void bv_add(bvocab *v, const char *s, size_t n) {
    if (v->n >= v->cap) return;
    v->piece[v->n] = malloc(n ? n : 1);
    if (!v->piece[v->n]) return;
    memcpy(v->piece[v->n], s, n);
    v->len[v->n++] = n;
}

static size_t utf8_put(char *o, uint32_t c) {
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xc0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3f)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xe0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 0x3f)), o[2] = (char)(0x80 | (c & 0x3f)), 3;
    o[0] = (char)(0xf0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 0x3f)), o[2] = (char)(0x80 | (c >> 6 & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

static void synth_vocab(bvocab *v, int32_t n) {
    v->cap = n;
    v->piece = calloc((size_t)n, sizeof *v->piece);
    v->len = calloc((size_t)n, sizeof *v->len);
    if (!v->piece || !v->len) return;
    char b[64];
    for (int c = 0; c < 256; c++) {
        b[0] = (char)c;
        bv_add(v, b, 1);
    }
    for (int i = 0; i < 1000; i++) bv_add(v, b, (size_t)snprintf(b, sizeof b, "%d", i));
    for (int i = 1; i <= 64; i++) { /* whitespace runs */
        memset(b, ' ', (size_t)i);
        bv_add(v, b, (size_t)i);
        if (i <= 32) {
            b[0] = '\n';
            bv_add(v, b, (size_t)i);
        }
    }
    static const char punct[] = "{}[]\":,. \n_-()'\\/";
    for (int i = 0; i < 3000; i++) {
        int k = 2 + (int)(bg_next() % 3);
        for (int j = 0; j < k; j++) b[j] = punct[bg_next() % (sizeof punct - 1)];
        bv_add(v, b, (size_t)k);
    }
    int32_t target = n - 1; /* the last id is the end-of-generation token */
    int32_t words_end = v->n + (target - v->n) * 6 / 10, cjk_end = words_end + (target - words_end) * 7 / 10;
    while (v->n < words_end) { /* words: " word", "word", "Word" */
        int k = 0, len = 2 + (int)(bg_next() % 9);
        uint64_t r = bg_next();
        if (r % 2) b[k++] = ' ';
        for (int j = 0; j < len; j++) b[k++] = (char)('a' + bg_next() % 26);
        if (r % 7 == 0) b[(r % 2)] = (char)(b[r % 2] - 32);
        if (r % 11 == 0) b[k++] = (char)".,:;\"')"[bg_next() % 7];
        bv_add(v, b, (size_t)k);
    }
    while (v->n < cjk_end) { /* CJK: one or two characters */
        size_t k = utf8_put(b, 0x4e00 + (uint32_t)(bg_next() % 20000));
        if (bg_next() % 3 == 0) k += utf8_put(b + k, 0x4e00 + (uint32_t)(bg_next() % 20000));
        bv_add(v, b, k);
    }
    while (v->n < target) { /* accented words, emoji, split UTF-8 pieces */
        uint64_t r = bg_next() % 4;
        size_t k = 0;
        if (r == 0) {
            b[k++] = ' ';
            for (int j = 0; j < 4; j++)
                k += j % 2 ? utf8_put(b + k, 0xe0 + (uint32_t)(bg_next() % 32)) : utf8_put(b + k, 'a' + (uint32_t)(bg_next() % 26));
        } else if (r == 1) {
            k = utf8_put(b, 0x1f600 + (uint32_t)(bg_next() % 80));
        } else {
            k = utf8_put(b, 0x4e00 + (uint32_t)(bg_next() % 20000));
            k = r == 2 ? 2 : k; /* the first two bytes of a character */
            if (r == 3) memmove(b, b + 1, --k); /* its last two */
        }
        bv_add(v, b, k);
    }
    bv_add(v, "</s>", 4);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Drive g for n_tok steps; prints its JSON object. */
static int run_grammar(const char *name, const pkv_grammar *g, const pkv_grammar_vocab *v, int n_tok, bool first) {
    int32_t nv = pkv_grammar_vocab_n(v);
    size_t words = ((size_t)nv + 63) / 64;
    uint64_t *bits = malloc(words * sizeof *bits);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    double *warm = malloc((size_t)n_tok * sizeof *warm), *cold = malloc((size_t)n_tok * sizeof *cold);
    pkv_gmatch *m = pkv_gmatch_create(g);
    if (!bits || !allowed || !warm || !cold || !m) {
        fprintf(stderr, "pagekv bench grammar: %s\n", m ? "out of memory" : pkv_errmsg());
        return 1;
    }
    double sum_allowed = 0, bytes = 0;
    int restarts = 0;
    uint64_t steps_max = 0, steps_op = 0, steps_all = 0;
    for (int s = 0; s < n_tok; s++) {
        pkv_gmatch *c = pkv_gmatch_clone(m);
        double t0 = pkv_time_now();
        int64_t k = c ? pkv_gmatch_mask(c, v, bits) : -1;
        double t1 = pkv_time_now();
        pkv_gmatch_work(c, &steps_op, &steps_all);
        if (steps_op > steps_max) steps_max = steps_op;
        pkv_gmatch_free(c);
        k = pkv_gmatch_mask(m, v, bits);
        double t2 = pkv_time_now();
        cold[s] = (t1 - t0) * 1e6;
        warm[s] = (t2 - t1) * 1e6;
        if (k <= 0) {
            fprintf(stderr, "pagekv bench grammar: %s: no token allowed at step %d (%s)\n", name, s, pkv_errmsg());
            return 1;
        }
        sum_allowed += (double)k;
        int32_t na = 0;
        for (size_t w = 0; w < words; w++)
            for (uint64_t x = bits[w]; x; x &= x - 1) allowed[na++] = (int32_t)(w * 64 + (size_t)__builtin_ctzll(x));
        int32_t t = allowed[bg_next() % (uint64_t)na];
        if (pkv_grammar_vocab_is_eog(v, t) || !pkv_gmatch_accept_token(m, v, t)) {
            pkv_gmatch_reset(m);
            restarts++;
        }
        bytes += 1;
    }
    qsort(warm, (size_t)n_tok, sizeof *warm, cmp_d);
    qsort(cold, (size_t)n_tok, sizeof *cold, cmp_d);
    double mw = 0, mc = 0;
    for (int s = 0; s < n_tok; s++) mw += warm[s], mc += cold[s];
    printf("%s    \"%s\": {\"tokens\": %d, \"allowed_mean\": %.0f, \"restarts\": %d, "
           "\"mask_us_mean\": %.1f, \"mask_us_p50\": %.1f, \"mask_us_p99\": %.1f, \"mask_us_max\": %.1f, "
           "\"cold_mask_us_mean\": %.1f, \"cold_mask_us_p50\": %.1f, \"cold_mask_us_p99\": %.1f, \"cold_mask_us_max\": %.1f, "
           "\"cold_mask_steps_max\": %llu}",
           first ? "" : ",\n", name, n_tok, sum_allowed / n_tok, restarts, mw / n_tok, warm[n_tok / 2],
           warm[n_tok * 99 / 100], warm[n_tok - 1], mc / n_tok, cold[n_tok / 2], cold[n_tok * 99 / 100], cold[n_tok - 1],
           (unsigned long long)steps_max);
    (void)bytes;
    pkv_gmatch_free(m);
    free(bits), free(allowed), free(warm), free(cold);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: pagekv bench grammar [-m model.gguf] [--vocab N] [--tokens N] [--seed N]\n"
               "  The cost of a constrained-output token mask (JSON object, a JSON schema, a GBNF grammar):\n"
               "  microseconds per token, warm (the sequence's matcher) and cold (no cache of recent states).\n"
               "  -m FILE      use the model's vocabulary (default: a synthesized one)\n"
               "  --vocab N    tokens of the synthesized vocabulary (default 150000)\n"
               "  --tokens N   steps per grammar (default 512)\n"
               "  --seed N     token choices (default 1)\n"
               "  --gbnf FILE  also a GBNF grammar of your own (its masks' work in steps is printed too)\n"
               "  --token-steps N  the grammars' work limit per token (default 20000000)\n");
}

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"type\":\"string\",\"format\":\"uuid\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\","
    "\"blue\"]},\"maxItems\":8},\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
    "\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]},\"score\":{\"type\":\"number\"}},\"required\":[\"name\",\"age\"]}";

int pkv_cli_bench_grammar(int argc, char **argv) {
    const char *model = NULL, *own = NULL;
    unsigned long long token_steps = 0;
    long n_vocab = 150000, n_tok = 512;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) goto bad;
        if (!strcmp(a, "-m")) model = argv[++i];
        else if (!strcmp(a, "--vocab")) n_vocab = strtol(argv[++i], NULL, 10);
        else if (!strcmp(a, "--tokens")) n_tok = strtol(argv[++i], NULL, 10);
        else if (!strcmp(a, "--seed")) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--gbnf")) own = argv[++i];
        else if (!strcmp(a, "--token-steps")) token_steps = strtoull(argv[++i], NULL, 10);
        else goto bad;
    }
    if (n_vocab < 600 || n_vocab > (1 << 21) || n_tok < 1 || n_tok > 1000000) goto bad;
    bg_rng ^= seed * 0x9e3779b97f4a7c15ull;
    double t0 = pkv_time_now();
    pkv_grammar_vocab *v = NULL;
    pkv_model *m = NULL;
    bvocab sv = {0};
    if (model) {
        pkv_model_params mp = pkv_model_default_params();
        if (!(m = pkv_model_load(model, mp))) {
            fprintf(stderr, "pagekv bench grammar: %s\n", pkv_errmsg());
            return 1;
        }
        v = pkv_grammar_vocab_create(m);
    } else {
        synth_vocab(&sv, (int32_t)n_vocab);
        int32_t eog = sv.n - 1;
        t0 = pkv_time_now();
        v = pkv_grammar_vocab_from_pieces((const char *const *)sv.piece, sv.len, sv.n, &eog, 1);
    }
    double t_vocab = pkv_time_now() - t0;
    if (!v) {
        fprintf(stderr, "pagekv bench grammar: %s\n", pkv_errmsg());
        return 1;
    }
    const char *gbnf = "root ::= \"Answer: \" [A-Za-z ,.]{1,200} \"\\n\" item{1,5}\nitem ::= \"- \" [0-9]+ \" \" [a-z]+ \"\\n\"";
    char *own_text = NULL;
    size_t own_len = 0;
    if (own && !(own_text = pkv_cli_read_text("bench grammar", own, &own_len))) return 1;
    pkv_grammar *gs[4] = {pkv_grammar_from_json_schema("{\"type\":\"object\"}", 17),
                          pkv_grammar_from_json_schema(k_schema, strlen(k_schema)), pkv_grammar_from_gbnf(gbnf, strlen(gbnf)),
                          own ? pkv_grammar_from_gbnf(own_text, own_len) : NULL};
    free(own_text);
    const char *names[4] = {"json_object", "json_schema", "gbnf", "own"};
    int n_g = own ? 4 : 3;
    for (int i = 0; i < n_g; i++)
        if (gs[i]) pkv_grammar_set_work_limits(gs[i], token_steps, 0);
    int rc = 0;
    printf("{\n  \"vocab\": {\"source\": \"%s\", \"tokens\": %d, \"build_ms\": %.1f},\n  \"grammars\": {\n",
           model ? model : "synthesized", (int)pkv_grammar_vocab_n(v), t_vocab * 1e3);
    for (int i = 0; i < n_g && !rc; i++) {
        if (!gs[i]) {
            fprintf(stderr, "pagekv bench grammar: %s\n", pkv_errmsg());
            rc = 1;
            break;
        }
        rc = run_grammar(names[i], gs[i], v, (int)n_tok, i == 0);
    }
    printf("\n  }\n}\n");
    for (int i = 0; i < 4; i++) pkv_grammar_free(gs[i]);
    pkv_grammar_vocab_free(v);
    pkv_model_free(m);
    for (int32_t i = 0; i < sv.n; i++) free(sv.piece[i]);
    free(sv.piece), free(sv.len);
    return rc;
bad:
    fprintf(stderr, "pagekv bench grammar: bad arguments; see 'pagekv bench grammar --help'\n");
    return 2;
}
