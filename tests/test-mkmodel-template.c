// labels: unit
/* Test models with a chat template (pkv_mkmodel_params.chat_template, `pagekv
 * mkmodel --chat-template NAME`): for each family the vocabulary has the family's
 * special tokens as single control tokens at ids 256.. (matched with parse_special,
 * plain bytes without it), the BOS/EOS/EOT/padding ids and add-BOS flag its real
 * files have, and a tokenizer.chat_template that the server's detector (compiled
 * in, as in test-chat-template) recognises as that family. The word tokens keep
 * their order, shifted; without a template nothing changes. Unknown names and
 * templates without a vocabulary or on a draft are refused. */
#include "testhelp.h"

#include "model/gguf.h"
#include "model/tokenizer.h"
#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("built without the server (jansson)"); }
#else
#include "chat/chat-template.c"
#include "chat/jinja.c"
#include "chat/jinja-lex.c"
#include "chat/jinja-parse.c"
#include "chat/jinja-eval.c"
#include "chat/jinja-builtins.c"
#include "chat-testlib.h"

#define FW "\xef\xbd\x9c"
#define SP "\xe2\x96\x81"

typedef struct {
    const char *name;
    pkv_tpl tpl;
    const char *pre;
    const char *specials[8]; /* expected at ids 256.., NULL-terminated */
    int bos, eos, eot, pad;  /* ids written to the file; -1 = key absent */
    bool add_bos;
} family;

static const family k_families[] = {
    {"chatml", PKV_TPL_CHATML, "qwen2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 256, 258, 258, 256, false},
    {"llama3",
     PKV_TPL_LLAMA3,
     "llama-bpe",
     {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>"},
     256,
     261,
     261,
     -1,
     true},
    {"llama2", PKV_TPL_LLAMA2, "default", {"<s>", "</s>"}, 256, 257, -1, -1, true},
    {"mistral", PKV_TPL_MISTRAL, "default", {"<s>", "</s>", "[INST]", "[/INST]"}, 256, 257, -1, -1, true},
    /* Voxtral's text model: mistral's turns, the tekken pre-tokenizer, the transcription prompt's tokens */
    {"voxtral",
     PKV_TPL_MISTRAL,
     "tekken",
     {"<s>", "</s>", "[INST]", "[/INST]", "[BEGIN_AUDIO]", "[TRANSCRIBE]"},
     256,
     257,
     -1,
     -1,
     true},
    {"gemma",
     PKV_TPL_GEMMA,
     "default",
     {"<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"},
     258,
     257,
     260,
     256,
     true},
    {"phi3",
     PKV_TPL_PHI3,
     "llama-bpe",
     {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>", "<|system|>"},
     256,
     258,
     258,
     256,
     false},
    {"deepseek",
     PKV_TPL_DEEPSEEK,
     "deepseek-r1-qwen",
     {"<" FW "end" SP "of" SP "sentence" FW ">", "<" FW "User" FW ">", "<" FW "Assistant" FW ">",
      "<" FW "begin" SP "of" SP "sentence" FW ">"},
     259,
     256,
     -1,
     -1,
     true},
};

/* The GGUF image of a default-size model of family name (NULL: no template). */
static void *make(const char *name, int n_vocab, size_t *size) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.chat_template = name;
    p.n_vocab = n_vocab;
    p.n_layer = 1;
    p.n_embd = 32;
    p.n_ff = 64;
    void *data = NULL;
    pkv_status s = pkv_mkmodel_memory(&p, &data, size);
    if (s) TH_FAIL("mkmodel %s: %s", name ? name : "(none)", pkv_errmsg());
    return s ? NULL : data;
}

static void check_key_u32(const pkv_gguf *g, const char *fam, const char *key, int want) {
    uint32_t v = 0;
    pkv_status s = pkv_gguf_get_u32(g, key, &v);
    th_checks++;
    if (want < 0 && s != PKV_ERR_NOT_FOUND) TH_FAIL("%s: %s is present (%u), want absent", fam, key, v);
    if (want >= 0 && (s || (int)v != want)) TH_FAIL("%s: %s = %d (%s), want %d", fam, key, s ? -1 : (int)v, pkv_status_str(s), want);
}

/* The piece of id as the tokenizer renders it with/without specials. */
static size_t piece(const pkv_model *m, int32_t id, bool special, char *buf, size_t size) {
    size_t n = 0;
    if (pkv_model_token_piece(m, id, special, buf, size, &n)) return (size_t)-1;
    return n;
}

static void check_family(const family *f) {
    size_t size = 0;
    void *data = make(f->name, 0, &size);
    if (!data) return;
    int ns = 0;
    while (ns < 8 && f->specials[ns]) ns++;

    /* the file's keys */
    pkv_gguf *g = pkv_gguf_open_memory(data, size, f->name);
    REQUIRE_VOID(g);
    const char *s;
    size_t n;
    CHECK_OK(pkv_gguf_get_str(g, "tokenizer.ggml.pre", &s, &n));
    if (!pkv_gguf_get_str(g, "tokenizer.ggml.pre", &s, &n) && (n != strlen(f->pre) || memcmp(s, f->pre, n)))
        TH_FAIL("%s: pre '%.*s', want '%s'", f->name, (int)n, s, f->pre);
    check_key_u32(g, f->name, "tokenizer.ggml.bos_token_id", f->bos);
    check_key_u32(g, f->name, "tokenizer.ggml.eos_token_id", f->eos);
    check_key_u32(g, f->name, "tokenizer.ggml.eot_token_id", f->eot);
    check_key_u32(g, f->name, "tokenizer.ggml.padding_token_id", f->pad);
    bool ab = !f->add_bos;
    CHECK_OK(pkv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &ab));
    if (ab != f->add_bos) TH_FAIL("%s: add_bos_token %d, want %d", f->name, ab, f->add_bos);
    /* the template: present, recognised as the family, and it leaves the BOS to the tokenizer */
    s = NULL;
    n = 0;
    CHECK_OK(pkv_gguf_get_str(g, "tokenizer.chat_template", &s, &n));
    pkv_tpl t = pkv_tpl_detect(s, n);
    if (t != f->tpl) TH_FAIL("%s: template detected as %s: %.*s", f->name, pkv_tpl_name(t), (int)n, s ? s : "");
    CHECK(s && n > 0 && !memchr(s, 0, n));
    char *tz = malloc(n + 1);
    if (tz && n) memcpy(tz, s, n);
    if (tz) tz[n] = 0;
    CHECK(tz && strstr(tz, "messages") && !strstr(tz, "bos_token"));
    /* the [INST] families end the prompt with the user's turn; the others open the assistant's */
    if (f->tpl != PKV_TPL_LLAMA2 && f->tpl != PKV_TPL_MISTRAL) CHECK(tz && strstr(tz, "add_generation_prompt"));
    free(tz);
    pkv_gguf_close(g);

    pkv_model *m = pkv_model_load_memory(data, size, f->name, pkv_model_default_params());
    pkv_mkmodel_free_memory(data);
    REQUIRE_VOID(m);
    CHECK_INT(pkv_model_bos(m), f->bos);
    CHECK_INT(pkv_model_eos(m), f->eos);
    if (f->eot >= 0) CHECK(pkv_model_is_eog(m, f->eot));
    CHECK(pkv_model_is_eog(m, f->eos));

    int32_t ids[64];
    char buf[128];
    for (int i = 0; i < ns; i++) {
        const char *sp = f->specials[i];
        size_t len = strlen(sp), nt = 0;
        /* parse_special: one control token, at its place */
        CHECK_OK(pkv_model_tokenize(m, sp, len, false, true, ids, 64, &nt));
        if (nt != 1 || ids[0] != 256 + i) TH_FAIL("%s: '%s' -> %zu tokens, first %d, want [%d]", f->name, sp, nt, nt ? ids[0] : -1, 256 + i);
        /* a control token renders only with render_special */
        CHECK_INT(piece(m, 256 + i, false, buf, sizeof buf), 0);
        size_t pn = piece(m, 256 + i, true, buf, sizeof buf);
        if (pn != len || memcmp(buf, sp, len)) TH_FAIL("%s: piece of %d is '%.*s', want '%s'", f->name, 256 + i, (int)pn, buf, sp);
        /* without parse_special: its bytes, several normal tokens, no special among them */
        CHECK_OK(pkv_model_tokenize(m, sp, len, false, false, ids, 64, &nt));
        if (nt < 2) TH_FAIL("%s: '%s' without parse_special -> %zu token(s)", f->name, sp, nt);
        for (size_t k = 0; k < nt; k++)
            if (ids[k] >= 256 && ids[k] < 256 + ns) TH_FAIL("%s: '%s' as text gave special %d", f->name, sp, ids[k]);
        size_t dn = 0;
        CHECK_OK(pkv_model_detokenize(m, ids, nt, true, buf, sizeof buf, &dn));
        if (dn != len || memcmp(buf, sp, len)) TH_FAIL("%s: '%s' as text round-trips to '%.*s'", f->name, sp, (int)dn, buf);
    }
    /* a turn as the server renders it: each marker in it is its one control token */
    pkv_chat_msg msg[2] = {{"system", "be brief"}, {"user", "hello"}};
    char err[128];
    char *prompt = pkv_tpl_render(f->tpl, msg, 2, err, sizeof err);
    REQUIRE_VOID(prompt);
    int32_t pids[256];
    size_t nt = 0;
    CHECK_OK(pkv_model_tokenize(m, prompt, strlen(prompt), false, true, pids, 256, &nt));
    for (int i = 0; i < ns; i++) {
        if (!strstr(prompt, f->specials[i])) continue;
        bool found = false;
        for (size_t k = 0; k < nt && !found; k++) found = pids[k] == 256 + i;
        if (!found) TH_FAIL("%s: '%s' in the rendered turn is not token %d", f->name, f->specials[i], 256 + i);
    }
    free(prompt);
    size_t nplain = 0;
    CHECK_OK(pkv_model_tokenize(m, "hello", 5, true, false, ids, 64, &nplain));
    CHECK(nplain >= 1 && (ids[0] == f->bos) == f->add_bos);
    pkv_model_free(m);
}

/* The word tokens after the specials are the default vocabulary's, in order. */
static void check_shift(const family *f, int n_vocab) {
    size_t sd = 0, sf = 0;
    void *dd = make(NULL, n_vocab, &sd), *df = make(f->name, n_vocab, &sf);
    pkv_model *md = dd ? pkv_model_load_memory(dd, sd, "default", pkv_model_default_params()) : NULL;
    pkv_model *mf = df ? pkv_model_load_memory(df, sf, f->name, pkv_model_default_params()) : NULL;
    pkv_mkmodel_free_memory(dd);
    pkv_mkmodel_free_memory(df);
    CHECK(md && mf);
    int ns = 0;
    while (ns < 8 && f->specials[ns]) ns++;
    char a[128], b[128];
    for (int k = 0; md && mf && k < 100; k++) {
        size_t na = piece(md, 258 + k, true, a, sizeof a), nb = piece(mf, 256 + ns + k, true, b, sizeof b);
        if (na != nb || na == (size_t)-1 || memcmp(a, b, na)) {
            TH_FAIL("%s/%d: token %d is '%.*s', default %d is '%.*s'", f->name, n_vocab, 256 + ns + k, (int)nb, b, 258 + k,
                    (int)na, a);
            break;
        }
    }
    /* the specials keep their ids whatever the size */
    size_t nt = 0;
    int32_t id = -1;
    if (mf) CHECK_OK(pkv_model_tokenize(mf, f->specials[ns - 1], strlen(f->specials[ns - 1]), false, true, &id, 1, &nt));
    CHECK_INT(id, 256 + ns - 1);
    pkv_model_free(md);
    pkv_model_free(mf);
}

/* pkv_vocab_builtin_create_specials: bad lists refused; allocation failures at every
 * step of a family model leak nothing. */
static void check_errors(void) {
    const char *dup[] = {"<a>", "<b>", "<a>"}, *word[] = {"<a>", "the"}, *null[] = {"<a>", NULL}, *one[] = {"<"};
    CHECK(pkv_vocab_builtin_create_specials(512, dup, 3) == NULL);
    CHECK_MSG("appear once");
    CHECK(pkv_vocab_builtin_create_specials(512, word, 2) == NULL);
    CHECK(pkv_vocab_builtin_create_specials(512, null, 2) == NULL);
    CHECK(pkv_vocab_builtin_create_specials(512, one, 1) == NULL);
    CHECK(pkv_vocab_builtin_create_specials(512, dup, 0) == NULL);
    CHECK(pkv_vocab_builtin_create_specials(512, dup, PKV_VOCAB_BUILTIN_MAX_SPECIALS + 1) == NULL);
    CHECK(pkv_vocab_builtin_create_specials(299, dup, 2) == NULL);
    pkv_vocab_desc *d = pkv_vocab_builtin_create_specials(300, dup, 2);
    CHECK(d && d->n_tokens == 300 && d->bos_id == -1 && d->eos_id == -1 && d->add_bos == 0);
    pkv_vocab_builtin_free(d);

    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.chat_template = "deepseek";
    p.n_layer = 1;
    p.n_embd = 32;
    p.n_ff = 64;
    int64_t live0 = pkv_alloc_live();
    int fails = 0;
    for (uint64_t k = 1; k < 100000; k++) {
        void *data = NULL;
        size_t size = 0;
        pkv_alloc_fail_at(k);
        pkv_status s = pkv_mkmodel_memory(&p, &data, &size);
        uint64_t made = pkv_alloc_fail_at(0);
        if (!s) {
            CHECK(made < k);
            pkv_mkmodel_free_memory(data);
            break;
        }
        fails++;
        CHECK_INT(s, PKV_ERR_NOMEM);
        CHECK_INT(pkv_alloc_live(), live0);
    }
    CHECK(fails > 10);
}

/* pre (`mkmodel --pre`) replaces the family's tokenizer.ggml.pre; an unknown name, or
 * one without a vocabulary of the model's own, is refused naming the option. */
static void check_pre(void) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.n_layer = 1;
    p.n_embd = 32;
    p.n_ff = 64;
    p.pre = "deepseek-v3";
    void *data = NULL;
    size_t size = 0;
    CHECK_OK(pkv_mkmodel_memory(&p, &data, &size));
    REQUIRE_VOID(data);
    pkv_gguf *g = pkv_gguf_open_memory(data, size, "pre");
    REQUIRE_VOID(g);
    const char *v = NULL;
    size_t n = 0;
    CHECK_OK(pkv_gguf_get_str(g, "tokenizer.ggml.pre", &v, &n));
    CHECK(n == 11 && !memcmp(v, "deepseek-v3", 11));
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(data);

    data = NULL;
    p.pre = "gpt-5";
    CHECK_STATUS(pkv_mkmodel_memory(&p, &data, &size), PKV_ERR_INVALID);
    CHECK_MSG("unknown pre-tokenizer (pre) 'gpt-5'");
    CHECK_MSG("deepseek-v3");
    CHECK(data == NULL);
    p.pre = "qwen2";
    p.no_vocab = true;
    CHECK_STATUS(pkv_mkmodel_memory(&p, &data, &size), PKV_ERR_INVALID);
    CHECK_MSG("needs a vocabulary");
}

/* Whether FILE has tokenizer.chat_template containing NEEDLE (NULL: any). */
static bool gguf_has_template(const char *file, const char *needle) {
    pkv_gguf *g = pkv_gguf_open(file);
    const char *t = NULL;
    size_t n = 0;
    bool has = g && pkv_gguf_get_str(g, "tokenizer.chat_template", &t, &n) == PKV_OK;
    if (has && needle) {
        size_t k = strlen(needle);
        has = false;
        for (size_t i = 0; i + k <= n && !has; i++) has = !memcmp(t + i, needle, k);
    }
    pkv_gguf_close(g);
    return has;
}

int main(void) {
    check_errors();
    check_pre();
    for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++) {
        check_family(&k_families[i]);
        check_shift(&k_families[i], 512);
    }
    check_shift(&k_families[0], 4000);

    /* no template: the default specials, no chat_template key */
    size_t size = 0;
    void *data = make(NULL, 0, &size);
    REQUIRE(data);
    pkv_gguf *g = pkv_gguf_open_memory(data, size, "default");
    REQUIRE(g);
    CHECK_INT(pkv_gguf_find_key(g, "tokenizer.chat_template"), -1);
    CHECK_INT(pkv_gguf_find_key(g, "tokenizer.ggml.eot_token_id"), -1);
    CHECK_INT(pkv_gguf_find_key(g, "tokenizer.ggml.padding_token_id"), -1);
    pkv_gguf_close(g);
    pkv_model *m = pkv_model_load_memory(data, size, "default", pkv_model_default_params());
    pkv_mkmodel_free_memory(data);
    REQUIRE(m);
    CHECK_INT(pkv_model_bos(m), 256);
    CHECK_INT(pkv_model_eos(m), 257);
    int32_t ids[32];
    size_t nt = 0;
    CHECK_OK(pkv_model_tokenize(m, "<|im_start|>", 12, false, true, ids, 32, &nt));
    CHECK(nt > 1);
    pkv_model_free(m);

    /* refused: an unknown family (the message lists the known ones), no vocabulary, a draft */
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.chat_template = "chatml2";
    data = NULL;
    CHECK_STATUS(pkv_mkmodel_memory(&p, &data, &size), PKV_ERR_INVALID);
    CHECK_MSG("unknown chat template 'chatml2'");
    CHECK_MSG("chatml, llama3, llama2, mistral, gemma, phi3, deepseek");
    CHECK(data == NULL);
    p.chat_template = "chatml";
    p.no_vocab = true;
    CHECK_STATUS(pkv_mkmodel_memory(&p, &data, &size), PKV_ERR_INVALID);
    CHECK_MSG("vocabulary");
    p.no_vocab = false;
    const char *target = th_tmp("mkt-target.gguf");
    pkv_mkmodel_params tp = pkv_mkmodel_default_params();
    tp.chat_template = "llama3";
    CHECK_OK(pkv_mkmodel_write(&tp, target));
    p.draft_of = target;
    CHECK_STATUS(pkv_mkmodel_memory(&p, &data, &size), PKV_ERR_INVALID);
    CHECK_MSG("draft");
    /* a draft of a chat model copies its vocabulary and template */
    p.chat_template = NULL;
    CHECK_OK(pkv_mkmodel_memory(&p, &data, &size));
    g = data ? pkv_gguf_open_memory(data, size, "draft") : NULL;
    CHECK(g && pkv_gguf_find_key(g, "tokenizer.chat_template") >= 0);
    uint32_t eot = 0;
    if (g) CHECK_OK(pkv_gguf_get_u32(g, "tokenizer.ggml.eot_token_id", &eot));
    CHECK_INT(eot, 261);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(data);

    /* the command line: documented, the error lists the names, combinations refused */
    const char *out = th_tmp("mkt-cli.gguf");
    if (getenv("PKV_CLI")) {
        CHECK_INT(th_cli("", true, "mkmodel --help"), 0);
        HAS("--chat-template NAME");
        HAS("--no-template");
        CHECK_INT(th_cli("", true, "mkmodel --chat-template qwen9 -o %s", out), 2);
        HAS("'qwen9' is neither a family");
        HAS("chatml, llama3");
        CHECK_INT(th_cli("", true, "mkmodel --chat-template chatml --no-template -o %s", out), 2);
        HAS("contradict");
        /* the default is chatml; --no-template writes none; a FILE is written as the template */
        CHECK_INT(th_cli("", true, "mkmodel -o %s", out), 0);
        HAS("chat template chatml");
        CHECK(gguf_has_template(out, "<|im_start|>"));
        CHECK_INT(th_cli("", true, "mkmodel --no-template -o %s", out), 0);
        CHECK(!gguf_has_template(out, NULL));
        const char *tf = th_tmp("mkt-cli.jinja");
        FILE *f = fopen(tf, "w");
        CHECK(f);
        if (f) {
            fputs("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", f);
            fclose(f);
        }
        CHECK_INT(th_cli("", true, "mkmodel --chat-template %s -o %s", tf, out), 0);
        CHECK(gguf_has_template(out, "[{{ m.role }}]"));
        CHECK_INT(th_cli("", true, "mkmodel --chat-template chatml --no-vocab -o %s", out), 2);
        HAS("--no-vocab");
        CHECK_INT(th_cli("", true, "mkmodel --chat-template chatml --draft-of %s -o %s", target, out), 2);
        HAS("--draft-of");
        CHECK_INT(th_cli("", true, "mkmodel --arch qwen2 --layers 1 --dim 32 --ffn 64 --chat-template chatml -o %s", out), 0);
        HAS("chat template chatml");
        CHECK_INT(th_cli("", false, "tokenize -m %s -p '<|im_start|>' --special --ids", out), 0);
        HAS("[257]");
        unlink(out);
    }
    unlink(target);
    return th_done();
}
#endif
