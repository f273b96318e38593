// labels: model timeout=300
/* The vocabulary as a user meets it through the pagekv command:
 *  - tokenize reads a 1 MB text from a file and from standard input (-f FILE, -f -),
 *    and prints the ids (--ids, default) and JSON ids + pieces (--json), each checked
 *    against the library's own tokenization of the same bytes;
 *  - generation stops on an end-of-generation token recognised only by its text.
 *    The model: a test model, and the same file with the text of one token that
 *    greedy decoding emits renamed to "<|im_end|>" (an ordinary token in the file).
 *    Weights are unchanged, so the renamed model must produce exactly the same
 *    tokens up to that one and stop there: through pkv_generate, `pagekv run`,
 *    run --fork and run --draft (speculative). A third file names the token with
 *    tokenizer.ggml.eot_token_id instead;
 *  - the loader's defaults when tokenizer.ggml.add_bos_token is absent (BOS for
 *    llama-bpe, none for qwen2). */
#include <unistd.h>

#include "model/gguf.h"
#include "testhelp.h"

#define cli(...) th_cli("", __VA_ARGS__)

/* ----------------------------------------------------------- GGUF editing */

typedef struct {
    int32_t rename_id;      /* token whose text becomes rename_to; -1 = none */
    const char *rename_to;
    const char *drop_key;   /* key left out; NULL = none */
    const char *pre;        /* new tokenizer.ggml.pre; NULL = kept */
    const char *u32_key;    /* key added; NULL = none */
    uint32_t u32_val;
} gguf_edit;

/* Copy src to dst with the edits; every other key and every tensor as it is.
 * Handles the value types pagekv mkmodel writes. */
static pkv_status rewrite_gguf(const char *src, const char *dst, const gguf_edit *e) {
    pkv_gguf *g = NULL;
    pkv_status s = pkv_gguf_read(src, &g);
    if (s) return s;
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    if (!w) s = PKV_ERR_NOMEM;
    for (int64_t i = 0; !s && i < pkv_gguf_n_kv(g); i++) {
        const char *key = pkv_gguf_kv_key(g, i);
        pkv_gguf_type t = pkv_gguf_kv_type(g, i);
        if (e->drop_key && !strcmp(key, e->drop_key)) continue;
        if (t == PKV_GGUF_STRING) {
            const char *v;
            size_t n;
            char z[512];
            if (!(s = pkv_gguf_get_str(g, key, &v, &n))) {
                snprintf(z, sizeof z, "%.*s", (int)n, v);
                bool new_pre = e->pre && !strcmp(key, "tokenizer.ggml.pre");
                s = pkv_gguf_writer_add_str(w, key, new_pre ? e->pre : z);
            }
        } else if (t == PKV_GGUF_ARRAY) {
            pkv_gguf_array a;
            if ((s = pkv_gguf_get_arr(g, key, PKV_GGUF_TYPE_COUNT, &a))) break;
            if (a.type != PKV_GGUF_STRING) {
                s = pkv_gguf_writer_add_arr(w, key, a.type, a.data, a.count);
                continue;
            }
            const char **strs = malloc((a.count + 1) * sizeof *strs);
            size_t *lens = malloc((a.count + 1) * sizeof *lens);
            if (!strs || !lens) s = PKV_ERR_NOMEM;
            for (uint64_t k = 0; !s && k < a.count; k++) {
                s = pkv_gguf_arr_str(g, &a, k, &strs[k], &lens[k]);
                if (!s && !strcmp(key, "tokenizer.ggml.tokens") && (int64_t)k == e->rename_id) {
                    strs[k] = e->rename_to;
                    lens[k] = strlen(e->rename_to);
                }
            }
            if (!s) s = pkv_gguf_writer_add_arr_str(w, key, strs, lens, a.count);
            free(strs);
            free(lens);
        } else if (t == PKV_GGUF_BOOL) {
            bool b;
            if (!(s = pkv_gguf_get_bool(g, key, &b))) s = pkv_gguf_writer_add_bool(w, key, b);
        } else if (t == PKV_GGUF_FLOAT32) {
            float f;
            if (!(s = pkv_gguf_get_f32(g, key, &f))) s = pkv_gguf_writer_add_f32(w, key, f);
        } else if (t == PKV_GGUF_UINT32) {
            uint32_t u;
            if (!(s = pkv_gguf_get_u32(g, key, &u))) s = pkv_gguf_writer_add_u32(w, key, u);
        } else {
            fprintf(stderr, "rewrite_gguf: key %s has type %s, not handled\n", key, pkv_gguf_type_name(t));
            s = PKV_ERR_UNSUPPORTED;
        }
    }
    if (!s && e->u32_key) s = pkv_gguf_writer_add_u32(w, e->u32_key, e->u32_val);
    for (int64_t i = 0; !s && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        s = pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
    }
    if (!s) s = pkv_gguf_writer_write(w, dst);
    pkv_gguf_writer_free(w);
    pkv_gguf_close(g);
    return s;
}

/* ----------------------------------------------------------- helpers */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0, *len = (size_t)n;
    return b;
}

/* Parse "[1, 2, 3]" or "[1,2,3]" at s; the ids into a new array (NULL on a syntax
 * error); *end after the ']'. */
static int32_t *parse_ids(const char *s, size_t *n, const char **end) {
    size_t cap = 1024, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v || *s++ != '[') goto bad;
    while (*s == ' ') s++;
    if (*s == ']') {
        s++;
    } else {
        for (;;) {
            char *e;
            long x = strtol(s, &e, 10);
            if (e == s) goto bad;
            if (k == cap) {
                int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
                if (!nv) goto bad;
                v = nv;
            }
            v[k++] = (int32_t)x;
            s = e;
            if (*s == ']') {
                s++;
                break;
            }
            if (*s++ != ',') goto bad;
            while (*s == ' ') s++;
        }
    }
    *n = k;
    if (end) *end = s;
    return v;
bad:
    free(v);
    return NULL;
}

/* The pieces array of --json, its bytes concatenated into out (strings unescaped,
 * byte arrays as bytes); the count of pieces, or -1 on a syntax error. */
static long json_pieces(const char *s, char *out, size_t cap, size_t *n_out) {
    size_t n = 0;
    long count = 0;
    if (*s++ != '[') return -1;
    if (*s == ']') {
        *n_out = 0;
        return 0;
    }
    for (;;) {
        if (*s == '"') {
            for (s++; *s != '"'; s++) {
                char c = *s;
                if (!c) return -1;
                if (c == '\\') {
                    c = *++s;
                    if (c == 'n') c = '\n';
                    else if (c == 't') c = '\t';
                    else if (c == 'r') c = '\r';
                    else if (c == 'u') {
                        unsigned x;
                        if (sscanf(s + 1, "%4x", &x) != 1 || x > 0x7F) return -1;
                        c = (char)x;
                        s += 4;
                    } else if (c != '"' && c != '\\')
                        return -1;
                } else if ((unsigned char)c < 0x20)
                    return -1; /* raw control characters are not JSON */
                if (n < cap) out[n] = c;
                n++;
            }
            s++;
        } else if (*s == '[') {
            for (s++; *s != ']';) {
                char *e;
                long b = strtol(s, &e, 10);
                if (e == s || b < 0 || b > 255) return -1;
                if (n < cap) out[n] = (char)b;
                n++;
                s = e;
                if (*s == ',') s++;
            }
            s++;
        } else
            return -1;
        count++;
        if (*s == ']') break;
        if (*s++ != ',') return -1;
    }
    *n_out = n;
    return count;
}

/* Greedy generation of up to n tokens after prompt, through pkv_generate. */
typedef struct {
    int32_t ids[64];
    int n;
} collected;

static bool collect(int32_t tok, void *user) {
    collected *c = user;
    if (c->n < 64) c->ids[c->n++] = tok;
    return true;
}

static int greedy(pkv_model *m, const int32_t *prompt, size_t n_prompt, int n, int32_t *out) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    cp.n_seq_max = 1;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 256) : NULL;
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.temp = 0;
    pkv_sampler *smp = pkv_sampler_create(sp, 400);
    collected col = {{0}, 0};
    int got = -1;
    if (ctx && smp && !pkv_context_decode(ctx, prompt, (int32_t)n_prompt) &&
        !pkv_generate(ctx, smp, n, collect, &col, NULL)) {
        memcpy(out, col.ids, (size_t)col.n * sizeof *out);
        got = col.n;
    } else {
        fprintf(stderr, "greedy: %s\n", pkv_errmsg());
    }
    pkv_sampler_free(smp);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    return got;
}

static bool tokenize_lib(pkv_model *m, const char *t, size_t len, bool bos, bool special, int32_t **ids, size_t *n) {
    size_t need = 0;
    pkv_status s = pkv_model_tokenize(m, t, len, bos, special, NULL, 0, &need);
    if (s && s != PKV_ERR_INVALID) return false;
    *ids = malloc((need + 1) * sizeof **ids);
    return *ids && !pkv_model_tokenize(m, t, len, bos, special, *ids, need + 1, n);
}

/* ----------------------------------------------------------- tokenize -f */

static void test_tokenize_files(const char *model) {
    char txt[512], o1[512], o2[512], o3[512], o4[512];
    snprintf(txt, sizeof txt, "%s", th_tmp("vocab-1mb.txt"));
    snprintf(o1, sizeof o1, "%s", th_tmp("vocab-ids.out"));
    snprintf(o2, sizeof o2, "%s", th_tmp("vocab-stdin.out"));
    snprintf(o3, sizeof o3, "%s", th_tmp("vocab-default.out"));
    snprintf(o4, sizeof o4, "%s", th_tmp("vocab-json.out"));
    /* 1 MB of words, numbers, punctuation, UTF-8 (whole and split characters do not
     * occur: the text is valid UTF-8, but byte tokens of emoji are not), newlines,
     * a NUL byte and special-token text */
    static const char *const words[] = {"the", " cat", " sat", " on", " mat", ",", ".", "\n", " 12345",
                                        " caf\xc3\xa9", " \xe4\xbd\xa0\xe5\xa5\xbd", " \xf0\x9f\x98\x80", "  ",
                                        "\t", " \"quoted\"", " back\\slash", "<|end_of_text|>", " x"};
    const size_t size = 1 << 20;
    char *text = malloc(size + 64);
    REQUIRE_VOID(text);
    size_t len = 0;
    uint64_t rng = 12345;
    while (len < size) {
        const char *w = words[th_rand(&rng) % PKV_ARRAY_LEN(words)];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
    }
    text[100] = '\0'; /* any bytes: a NUL in the middle */
    FILE *f = fopen(txt, "wb");
    REQUIRE_VOID(f && fwrite(text, 1, len, f) == len);
    fclose(f);

    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 1;
    pkv_model *m = pkv_model_load(model, mp);
    REQUIRE_VOID(m);
    int32_t *ref = NULL, *ref_sp = NULL;
    size_t n_ref = 0, n_ref_sp = 0;
    REQUIRE_VOID(tokenize_lib(m, text, len, true, false, &ref, &n_ref));
    REQUIRE_VOID(tokenize_lib(m, text, len, true, true, &ref_sp, &n_ref_sp));
    CHECK(n_ref > 100000);
    CHECK(n_ref_sp < n_ref); /* <|end_of_text|> became one token */

    /* -f FILE --ids, -f - (stdin), and the default output: the same list */
    CHECK_INT(cli(false, "tokenize -m %s -f %s --ids > %s", model, txt, o1), 0);
    CHECK_INT(cli(false, "tokenize -m %s -f - --ids < %s > %s", model, txt, o2), 0);
    CHECK_INT(cli(false, "tokenize -m %s -f %s > %s", model, txt, o3), 0);
    size_t l1 = 0, l2 = 0, l3 = 0;
    char *b1 = read_file(o1, &l1), *b2 = read_file(o2, &l2), *b3 = read_file(o3, &l3);
    REQUIRE_VOID(b1 && b2 && b3);
    size_t n = 0;
    const char *end = NULL;
    int32_t *ids = parse_ids(b1, &n, &end);
    CHECK(ids != NULL);
    CHECK(end && !strcmp(end, "\n"));
    CHECK_INT(n, n_ref);
    if (ids && n == n_ref) CHECK_MEM(ids, ref, n * sizeof *ids);
    CHECK(l1 == l2 && !memcmp(b1, b2, l1));
    CHECK(l1 == l3 && !memcmp(b1, b3, l1));
    free(ids);
    free(b2);
    free(b3);

    /* --special and --no-bos from a file */
    CHECK_INT(cli(false, "tokenize -m %s -f %s --special > %s", model, txt, o2), 0);
    b2 = read_file(o2, &l2);
    ids = b2 ? parse_ids(b2, &n, NULL) : NULL;
    CHECK(ids && n == n_ref_sp && !memcmp(ids, ref_sp, n * sizeof *ids));
    free(ids);
    free(b2);
    CHECK_INT(cli(false, "tokenize -m %s -f - --no-bos < %s > %s", model, txt, o2), 0);
    b2 = read_file(o2, &l2);
    ids = b2 ? parse_ids(b2, &n, NULL) : NULL;
    CHECK(ids && n == n_ref - 1 && !memcmp(ids, ref + 1, n * sizeof *ids));
    free(ids);
    free(b2);

    /* --json: the same ids, and the pieces put together give back BOS + the text */
    CHECK_INT(cli(false, "tokenize -m %s -f %s --json > %s", model, txt, o4), 0);
    size_t l4 = 0;
    char *b4 = read_file(o4, &l4);
    REQUIRE_VOID(b4);
    CHECK(!strncmp(b4, "{\"ids\":[", 8));
    ids = parse_ids(b4 + 7, &n, &end);
    CHECK(ids && n == n_ref && !memcmp(ids, ref, n * sizeof *ids));
    free(ids);
    REQUIRE_VOID(end && !strncmp(end, ",\"pieces\":", 10));
    char *joined = malloc(len + 64);
    size_t nj = 0;
    long np = json_pieces(end + 10, joined, len + 64, &nj);
    CHECK_INT(np, (long)n_ref);
    const char *bos = "<|begin_of_text|>";
    CHECK_INT(nj, strlen(bos) + len);
    CHECK(nj == strlen(bos) + len && !memcmp(joined, bos, strlen(bos)) && !memcmp(joined + strlen(bos), text, len));
    CHECK(l4 > 2 && !strcmp(b4 + l4 - 2, "}\n"));
    free(joined);
    free(b4);
    free(b1);

    /* a small --json exactly, with a piece that is part of a character */
    CHECK_INT(cli(false, "tokenize -m %s -p '\"a\\\"' --json --no-bos", model), 0);
    CHECK(!strcmp(th_out, "{\"ids\":[34,97,92,34],\"pieces\":[\"\\\"\",\"a\",\"\\\\\",\"\\\"\"]}\n"));
    CHECK_INT(cli(false, "tokenize -m %s -p '\xc3\xa9' --json --no-bos", model), 0);
    CHECK(!strcmp(th_out, "{\"ids\":[195,169],\"pieces\":[[195],[169]]}\n"));

    /* errors: a clear message and a non-zero exit */
    CHECK_INT(cli(true, "tokenize -m %s -f %s/no-such-file.txt", model, txt), 1);
    HAS("cannot open");
    HAS("no-such-file.txt");
    CHECK_INT(cli(true, "tokenize -m %s -p x -f %s", model, txt), 2);
    HAS("-p TEXT or -f FILE");
    CHECK_INT(cli(true, "tokenize -m %s", model), 2);
    HAS("-p TEXT or -f FILE");
    CHECK_INT(cli(true, "tokenize -m %s -p x --ids --json", model), 2);
    HAS("give one");
    CHECK_INT(cli(true, "tokenize -m %s -f", model), 2);

    pkv_model_free(m);
    free(ref);
    free(ref_sp);
    free(text);
    unlink(txt);
    unlink(o1);
    unlink(o2);
    unlink(o3);
    unlink(o4);
}

/* ----------------------------------------------------------- EOG by text */

static void test_run_stops(const char *model) {
    char mb[512], me[512], md[512];
    snprintf(mb, sizeof mb, "%s", th_tmp("vocab-imend.gguf"));
    snprintf(me, sizeof me, "%s", th_tmp("vocab-eotkey.gguf"));
    snprintf(md, sizeof md, "%s", th_tmp("vocab-draft.gguf"));
    const char *prompt = "the cat";
    enum { N = 24 };
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 1;
    pkv_model *a = pkv_model_load(model, mp);
    REQUIRE_VOID(a);
    int32_t *pa = NULL;
    size_t npa = 0;
    REQUIRE_VOID(tokenize_lib(a, prompt, strlen(prompt), true, false, &pa, &npa));
    int32_t ga[N];
    int nga = greedy(a, pa, npa, N, ga);
    CHECK_INT(nga, N); /* the test model never ends on its own EOS here */
    REQUIRE_VOID(nga == N);
    /* the first generated token from position 4 on that is new and an ordinary word */
    int k = -1;
    for (int i = 4; i < N && k < 0; i++) {
        bool seen = ga[i] < 258; /* bytes and the BOS/EOS: not renamed */
        for (int j = 0; j < i; j++) seen |= ga[j] == ga[i];
        for (size_t j = 0; j < npa; j++) seen |= pa[j] == ga[i];
        if (!seen) k = i;
    }
    fprintf(stderr, "greedy tokens:");
    for (int i = 0; i < N; i++) fprintf(stderr, " %d", ga[i]);
    fprintf(stderr, "; renaming token %d (position %d) to <|im_end|>\n", k >= 0 ? ga[k] : -1, k);
    REQUIRE_VOID(k >= 4);
    const int32_t T = ga[k];
    gguf_edit e = {T, "<|im_end|>", NULL, NULL, NULL, 0};
    REQUIRE_VOID(rewrite_gguf(model, mb, &e) == PKV_OK);
    gguf_edit e2 = {-1, NULL, NULL, NULL, "tokenizer.ggml.eot_token_id", (uint32_t)T};
    REQUIRE_VOID(rewrite_gguf(model, me, &e2) == PKV_OK);

    /* the library: same prompt ids, EOG by text, generation stops right there */
    pkv_model *b = pkv_model_load(mb, mp);
    REQUIRE_VOID(b);
    int32_t *pb = NULL;
    size_t npb = 0;
    REQUIRE_VOID(tokenize_lib(b, prompt, strlen(prompt), true, false, &pb, &npb));
    CHECK(npb == npa && !memcmp(pa, pb, npa * sizeof *pa));
    CHECK(pkv_model_is_eog(b, T));
    CHECK(!pkv_model_is_eog(a, T));
    CHECK(pkv_model_eos(b) != T);
    int32_t gb[N];
    int ngb = greedy(b, pb, npb, N, gb);
    CHECK_INT(ngb, k + 1);
    if (ngb == k + 1) CHECK_MEM(gb, ga, (size_t)ngb * sizeof *gb);
    /* --special parses the renamed token's text: it is a control token now */
    CHECK_INT(cli(false, "tokenize -m %s -p '<|im_end|>' --special --no-bos", mb), 0);
    char want_ids[32];
    snprintf(want_ids, sizeof want_ids, "[%d]\n", T);
    CHECK(!strcmp(th_out, want_ids));

    /* the text run prints with the renamed model: prompt + pieces before T */
    char expect[4096];
    size_t ne = 0;
    CHECK_OK(pkv_model_detokenize(b, ga, (size_t)k, false, expect, sizeof expect, &ne));
    char want[4200];
    snprintf(want, sizeof want, "%s%.*s\n", prompt, (int)ne, expect);
    char full[4096];
    size_t nf = 0;
    CHECK_OK(pkv_model_detokenize(a, ga, N, false, full, sizeof full, &nf));
    char want_a[4200];
    snprintf(want_a, sizeof want_a, "%s%.*s\n", prompt, (int)nf, full);
    char decoded[64];
    snprintf(decoded, sizeof decoded, "decode %d tokens", k + 1);

    CHECK_INT(cli(false, "run -m %s -p '%s' -n %d --temp 0 -t 1", model, prompt, N), 0);
    CHECK(!strcmp(th_out, want_a)); /* the unmodified model runs on */
    CHECK_INT(cli(false, "run -m %s -p '%s' -n %d --temp 0 -t 1", mb, prompt, N), 0);
    CHECK(!strcmp(th_out, want));
    CHECK_INT(cli(true, "run -m %s -p '%s' -n %d --temp 0 -t 1", mb, prompt, N), 0);
    HAS(decoded);
    /* named by tokenizer.ggml.eot_token_id instead of by text: the same stop */
    CHECK_INT(cli(false, "run -m %s -p '%s' -n %d --temp 0 -t 1", me, prompt, N), 0);
    CHECK(!strncmp(th_out, want, strlen(want) - 1));
    CHECK_INT(cli(true, "run -m %s -p '%s' -n %d --temp 0 -t 1", me, prompt, N), 0);
    HAS(decoded);
    /* batched forks: each branch stops on it */
    CHECK_INT(cli(false, "run -m %s -p '%s' -n %d --temp 0 -t 1 --fork 2 --seed 0", mb, prompt, N), 0);
    char branch[4400];
    snprintf(branch, sizeof branch, "--- branch 0 (seed 0, stopped: end-of-generation token) ---\n%s", want);
    HAS(branch);
    snprintf(branch, sizeof branch, "--- branch 1 (seed 1, stopped: end-of-generation token) ---\n%s", want);
    HAS(branch);
    /* speculative decoding with a draft of the renamed model (its vocabulary) */
    CHECK_INT(cli(true, "mkmodel --draft-of %s --layers 1 -o %s", mb, md), 0);
    CHECK_INT(cli(false, "run -m %s -p '%s' -n %d --temp 0 -t 1 --draft %s", mb, prompt, N, md), 0);
    CHECK(!strcmp(th_out, want));
    CHECK_INT(cli(true, "run -m %s -p '%s' -n %d --temp 0 -t 1 --draft %s", mb, prompt, N, md), 0);
    HAS(decoded);

    pkv_model_free(a);
    pkv_model_free(b);
    free(pa);
    free(pb);
    unlink(mb);
    unlink(me);
    unlink(md);
}

/* ----------------------------------------------------------- BOS defaults */

static void test_bos_keys(const char *model) {
    char m1[512], m2[512];
    snprintf(m1, sizeof m1, "%s", th_tmp("vocab-nobos-llama.gguf"));
    snprintf(m2, sizeof m2, "%s", th_tmp("vocab-nobos-qwen.gguf"));
    /* the test model is llama-bpe with add_bos_token = true: without the key, llama-bpe
     * still adds BOS (llama.cpp's default), qwen2 does not */
    gguf_edit e1 = {-1, NULL, "tokenizer.ggml.add_bos_token", NULL, NULL, 0};
    REQUIRE_VOID(rewrite_gguf(model, m1, &e1) == PKV_OK);
    gguf_edit e2 = {-1, NULL, "tokenizer.ggml.add_bos_token", "qwen2", NULL, 0};
    REQUIRE_VOID(rewrite_gguf(model, m2, &e2) == PKV_OK);
    CHECK_INT(cli(false, "tokenize -m %s -p 'the cat'", model), 0);
    char with_bos[256];
    snprintf(with_bos, sizeof with_bos, "%.200s", th_out);
    CHECK(!strncmp(with_bos, "[256, ", 6));
    CHECK_INT(cli(false, "tokenize -m %s -p 'the cat'", m1), 0);
    CHECK(!strcmp(th_out, with_bos));
    CHECK_INT(cli(false, "tokenize -m %s -p ''", m1), 0);
    CHECK(!strcmp(th_out, "[256]\n"));
    char no_bos[256];
    snprintf(no_bos, sizeof no_bos, "[%s", with_bos + 6);
    CHECK_INT(cli(false, "tokenize -m %s -p 'the cat'", m2), 0);
    CHECK(!strcmp(th_out, no_bos));
    CHECK_INT(cli(false, "tokenize -m %s -p ''", m2), 0);
    CHECK(!strcmp(th_out, "[]\n"));
    unlink(m1);
    unlink(m2);
}

int main(void) {
    if (!getenv("PKV_CLI")) return th_skip("PKV_CLI not set: run through ctest");
    char m[512];
    snprintf(m, sizeof m, "%s", th_tmp("vocab-model.gguf"));
    CHECK_INT(cli(true, "mkmodel --arch qwen2 --type f16 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 "
                        "--vocab 400 --seed 3 --no-template -o %s", m), 0);
    test_tokenize_files(m);
    test_run_stops(m);
    test_bos_keys(m);
    unlink(m);
    return th_done();
}
