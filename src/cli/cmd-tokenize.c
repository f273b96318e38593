/* pagekv tokenize: token ids (and pieces) of a text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

/* ------------------------------------------------------------- tokenize */

int pkv_cli_tokenize(int argc, char **argv) {
    pkv_cli_model_opts o = pkv_cli_model_defaults();
    const char *prompt = NULL;
    bool pieces = false, bos = true, special = false;
    for (int i = 1; i < argc; i++) {
        int r = pkv_cli_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: pagekv tokenize [-m FILE.gguf] -p TEXT [--pieces] [--no-bos] [--special]\n"
                   "Prints the token ids of TEXT ([1, 2, 3]); with --pieces one 'id -> 'piece'' line each.\n"
                   "  --no-bos    do not add the BOS token the model asks for\n"
                   "  --special   parse special-token text (e.g. <|end_of_text|>) as special tokens\n");
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--pieces")) {
            pieces = true;
        } else if (!strcmp(a, "--no-bos")) {
            bos = false;
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else {
            fprintf(stderr, "pagekv tokenize: unknown option '%s' (see 'pagekv tokenize --help')\n", a);
            return 2;
        }
    }
    if (!prompt) {
        fprintf(stderr, "pagekv tokenize: -p TEXT is required\n");
        return 2;
    }
    pkv_model *m = pkv_cli_open_model("tokenize", &o);
    if (!m) return 1;
    size_t n = 0, len = strlen(prompt);
    int rc = 1;
    int32_t *ids = NULL;
    pkv_status s = pkv_model_tokenize(m, prompt, len, bos, special, NULL, 0, &n);
    if (s && s != PKV_ERR_INVALID) {
        pkv_cli_fail("tokenize", "tokenize", s);
        goto out;
    }
    ids = malloc((n + 1) * sizeof *ids);
    if (!ids || (s = pkv_model_tokenize(m, prompt, len, bos, special, ids, n + 1, &n))) {
        pkv_cli_fail("tokenize", "tokenize", s ? s : PKV_ERR_NOMEM);
        goto out;
    }
    if (pieces) {
        for (size_t i = 0; i < n; i++) {
            char buf[512];
            size_t k = 0;
            if (pkv_model_token_piece(m, ids[i], true, buf, sizeof buf, &k)) k = 0;
            printf("%6d -> '%.*s'\n", ids[i], (int)k, buf);
        }
    } else {
        printf("[");
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
    }
    rc = 0;
out:
    free(ids);
    pkv_model_free(m);
    return rc;
}
