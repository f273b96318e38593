/* pagekv logits: the last position's logits of a list of token ids, computed with
 * the context API (one prefill, nothing generated), for comparing with other
 * runtimes; and the --tokens parser, which run shares. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "cli/cli-media.h"
#include "cli/commands.h"
#include "pagekv.h"

/* Comma-separated token ids into *out (malloc'd, *n of them); false, said on stderr. */
bool pkv_cli_parse_tokens(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return false;
    const char *p = s;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > INT32_MAX) {
            fprintf(stderr, "pagekv: --tokens expects comma-separated token ids, got '%s'\n", s);
            free(v);
            return false;
        }
        if (k == cap) {
            int32_t *t = realloc(v, (cap *= 2) * sizeof *v);
            if (!t) {
                free(v);
                return false;
            }
            v = t;
        }
        v[k++] = (int32_t)x;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "pagekv: unexpected '%c' in --tokens\n", *p);
            free(v);
            return false;
        }
    }
    if (!k) {
        fprintf(stderr, "pagekv: --tokens is empty\n");
        free(v);
        return false;
    }
    *out = v;
    *n = k;
    return true;
}

int pkv_cli_logits(int argc, char **argv) {
    pkv_cli_model_opts o = pkv_cli_model_defaults();
    const char *tokens = NULL, *outp = NULL;
    pkv_cli_media mo;
    memset(&mo, 0, sizeof mo);
    for (int i = 1; i < argc; i++) {
        int r = pkv_cli_model_opt(argc, argv, &i, &o);
        if (!r) r = pkv_cli_media_opt(argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: pagekv logits [-m FILE.gguf] --tokens 1,2,3,... [-o FILE] [-d DEVICE] [-t N]\n"
                   "                     [--devices A,B [--split P,Q] [--kv-on-host]]\n"
                   "Runs the token ids as one prompt and writes the last position's logits: as\n"
                   "little-endian float32 to FILE with -o, else as JSON to stdout.\n"
                   "Also: -c N, --page-size N, --kv-type f16|f32|q8_0|q4_0 (--kv-type-k, --kv-type-v),\n"
                   "--lora FILE[:SCALE] (repeatable: LoRA adapters, docs/lora.md).\n"
                   "Media (docs/multimodal.md, \"Media in the cache\"): --mmproj FILE with --audio FILE or --image FILE\n"
                   "(repeatable, in order) inserts each file's projector rows after the first K ids\n"
                   "(--media-at K, one per file in order; default 0); --embd-out FILE writes the\n"
                   "projector's rows of every file, raw little-endian float32 [rows][n_embd], no header.\n");
            return 0;
        } else if (!strcmp(argv[i], "--tokens")) {
            if (!(tokens = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (!(outp = pkv_cli_value(argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "pagekv logits: unknown option '%s' (see 'pagekv logits --help')\n", argv[i]);
            return 2;
        }
    }
    if (!tokens && !mo.n) {
        fprintf(stderr, "pagekv logits: --tokens is required (comma-separated token ids)\n");
        return 2;
    }
    if (!pkv_cli_media_check("logits", &mo)) return 2;
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokens && !pkv_cli_parse_tokens(tokens, &ids, &n)) return 2;
    pkv_cli_encoded enc;
    memset(&enc, 0, sizeof enc);
    pkv_model *m = pkv_cli_open_model("logits", &o);
    if (!m) {
        free(ids);
        return 1;
    }
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    int rc = 1;
    pkv_kv_cache *c = NULL;
    pkv_context *ctx = NULL;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= info.n_vocab) {
            fprintf(stderr, "pagekv logits: token id %d (position %zu) is outside the vocabulary of %d tokens\n", ids[i], i,
                    info.n_vocab);
            goto out;
        }
    if (mo.n && pkv_cli_media_encode("logits", m, &mo, &enc)) goto out;
    for (int i = 0; i < enc.n; i++) {
        if (enc.rows[i].at > (int32_t)n || (i && enc.rows[i].at < enc.rows[i - 1].at)) {
            fprintf(stderr, "pagekv logits: --media-at %d for file %d: must be in [%d, %zu] (non-decreasing)\n",
                    enc.rows[i].at, i + 1, i ? enc.rows[i - 1].at : 0, n);
            goto out;
        }
    }
    size_t n_all = n;
    for (int i = 0; i < enc.n; i++) n_all += (size_t)enc.rows[i].n_rows;
    if (o.n_ctx == 0 && (int64_t)n_all > 4096) o.n_ctx = (int)n_all;
    if (!(c = pkv_cli_open_cache("logits", m, &o, 1))) goto out;
    if (!(ctx = pkv_context_create(m, c, o.n_ctx))) {
        fprintf(stderr, "pagekv logits: %s\n", pkv_errmsg());
        goto out;
    }
    if ((int64_t)n_all > pkv_context_n_ctx(ctx)) {
        fprintf(stderr, "pagekv logits: %zu tokens do not fit the context of %lld (use -c)\n", n_all,
                (long long)pkv_context_n_ctx(ctx));
        goto out;
    }
    pkv_status s = enc.n ? pkv_context_decode_prompt(ctx, ids, (int32_t)n, enc.rows, enc.n)
                         : pkv_context_decode(ctx, ids, (int32_t)n);
    n = n_all;
    if (s) {
        pkv_cli_fail("logits", "decode", s);
        goto out;
    }
    const float *lg = pkv_context_logits(ctx);
    if (pkv_dist_rank() > 0) { /* under MPI ranks rank 0 alone writes */
    } else if (outp) {
        pkv_wfile wf;
        pkv_status ws = pkv_wfile_open(&wf, outp);
        if (!ws) {
            /* little-endian float32: this build only targets little-endian hosts */
            if (fwrite(lg, sizeof(float), (size_t)info.n_vocab, wf.f) != (size_t)info.n_vocab) {
                ws = pkv_err(PKV_ERR_IO, "%s: write failed", outp);
                pkv_wfile_abort(&wf);
            } else {
                ws = pkv_wfile_commit(&wf);
            }
        }
        if (ws) {
            pkv_cli_fail("logits", "-o", ws);
            goto out;
        }
        fprintf(stderr, "pagekv logits: wrote %d float32 logits to %s\n", info.n_vocab, outp);
    } else {
        printf("{\"n_tokens\": %zu, \"n_vocab\": %d, \"logits\": [", n, info.n_vocab);
        for (int i = 0; i < info.n_vocab; i++) printf("%s%.9g", i ? ", " : "", (double)lg[i]);
        printf("]}\n");
    }
    rc = 0;
out:
    free(ids);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_cli_encoded_free(&enc);
    pkv_model_free(m);
    return rc;
}
