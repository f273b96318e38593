/* pagekv tokenize: token ids (and pieces) of a text given with -p, or read from a
 * file or standard input with -f, as llama.cpp's tokenize tool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t need;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) need = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 4, min = 0x10000;
    else return 0;
    if (n < need) return 0;
    unsigned v = c & (0x7F >> need);
    for (size_t k = 1; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    return need;
}

static bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len((const unsigned char *)s + i, n - i);
        if (!l) return false;
        i += l;
    }
    return true;
}

/* A piece as a JSON value: a string when its bytes are valid UTF-8, else the array
 * of its byte values (a byte-level token can hold part of a character), as
 * llama.cpp's server does for pieces. */
static void json_piece(FILE *f, const char *s, size_t n) {
    if (!utf8_valid(s, n)) {
        fputc('[', f);
        for (size_t i = 0; i < n; i++) fprintf(f, "%s%u", i ? "," : "", (unsigned char)s[i]);
        fputc(']', f);
        return;
    }
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* The piece of id into *buf (grown as needed); its length, 0 on error. */
static size_t piece(const pkv_model *m, int32_t id, char **buf, size_t *cap) {
    size_t k = 0;
    pkv_status s = pkv_model_token_piece(m, id, true, *buf, *cap, &k);
    if (s == PKV_ERR_INVALID && k > *cap) {
        char *nb = realloc(*buf, k + 1);
        if (!nb) return 0;
        *buf = nb;
        *cap = k + 1;
        s = pkv_model_token_piece(m, id, true, *buf, *cap, &k);
    }
    return s ? 0 : k;
}

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: pagekv tokenize [-m FILE.gguf] (-p TEXT | -f FILE) [--ids | --pieces | --json]\n"
               "                       [--no-bos] [--special]\n"
               "Prints the token ids of the text.\n"
               "  -p, --prompt TEXT  the text\n"
               "  -f, --file FILE    read the text from FILE ('-' = standard input), any size and bytes\n"
               "  --ids              only the id list, [1, 2, 3] (the default output)\n"
               "  --pieces           one line per token: id -> 'piece'\n"
               "  --json             {\"ids\":[...],\"pieces\":[...]}; a piece that is not valid UTF-8\n"
               "                     (part of a character) is the array of its byte values\n"
               "  --no-bos           do not add the BOS (or EOS) token the model asks for\n"
               "  --special          parse special-token text (e.g. <|end_of_text|>) as special tokens\n");
}

int pkv_cli_tokenize(int argc, char **argv) {
    pkv_cli_model_opts o = pkv_cli_model_defaults();
    const char *prompt = NULL, *file = NULL;
    enum { OUT_IDS, OUT_PIECES, OUT_JSON } mode = OUT_IDS;
    int n_modes = 0;
    bool bos = true, special = false;
    for (int i = 1; i < argc; i++) {
        int r = pkv_cli_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids")) {
            mode = OUT_IDS, n_modes++;
        } else if (!strcmp(a, "--pieces")) {
            mode = OUT_PIECES, n_modes++;
        } else if (!strcmp(a, "--json")) {
            mode = OUT_JSON, n_modes++;
        } else if (!strcmp(a, "--no-bos")) {
            bos = false;
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else {
            fprintf(stderr, "pagekv tokenize: unknown option '%s' (see 'pagekv tokenize --help')\n", a);
            return 2;
        }
    }
    if (!prompt == !file) {
        fprintf(stderr, "pagekv tokenize: give the text with -p TEXT or -f FILE (one of them)\n");
        return 2;
    }
    if (n_modes > 1) {
        fprintf(stderr, "pagekv tokenize: --ids, --pieces and --json are different outputs: give one\n");
        return 2;
    }
    size_t len = 0;
    char *text = NULL;
    if (file) {
        if (!(text = pkv_cli_read_text("tokenize", file, &len))) return 1;
    } else {
        len = strlen(prompt);
    }
    const char *t = file ? text : prompt;
    pkv_model *m = pkv_cli_open_model("tokenize", &o);
    if (!m) {
        free(text);
        return 1;
    }
    size_t n = 0, cap = 256;
    int rc = 1;
    /* one pass in the usual case: a token per byte plus BOS/EOS is room enough for
     * byte-level BPE; otherwise the first call tells the count needed */
    size_t n_ids = len + 16;
    int32_t *ids = malloc(n_ids * sizeof *ids);
    char *buf = malloc(cap);
    pkv_status s = ids && buf ? pkv_model_tokenize(m, t, len, bos, special, ids, n_ids, &n) : PKV_ERR_NOMEM;
    if (s == PKV_ERR_INVALID && n > n_ids) {
        free(ids);
        n_ids = n;
        ids = malloc(n_ids * sizeof *ids);
        s = ids ? pkv_model_tokenize(m, t, len, bos, special, ids, n_ids, &n) : PKV_ERR_NOMEM;
    }
    if (s) {
        pkv_cli_fail("tokenize", "tokenize", s);
        goto out;
    }
    if (mode == OUT_PIECES) {
        for (size_t i = 0; i < n; i++) {
            size_t k = piece(m, ids[i], &buf, &cap);
            printf("%6d -> '%.*s'\n", ids[i], (int)k, buf);
        }
    } else if (mode == OUT_JSON) {
        printf("{\"ids\":[");
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("],\"pieces\":[");
        for (size_t i = 0; i < n; i++) {
            if (i) putchar(',');
            size_t k = piece(m, ids[i], &buf, &cap); /* may move buf */
            json_piece(stdout, buf, k);
        }
        printf("]}\n");
    } else {
        printf("[");
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "pagekv tokenize: cannot write the output\n");
        goto out;
    }
    rc = 0;
out:
    free(ids);
    free(buf);
    free(text);
    pkv_model_free(m);
    return rc;
}
