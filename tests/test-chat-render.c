// labels: unit
/* pkv_chat_render (include/pagekv.h): the library's chat layer, what the Python
 * bindings call (issue 44 item 4). With jansson: for models of three built-in
 * families and one with a model template that renders tools (Qwen 2.5's, from
 * tests/templates), the public call gives the prompt and the spans that the
 * chat layer's own pkv_chat_init_model + pkv_chat_apply give pagekv serve and
 * run -cnv for the same request (the model's template found from its file, its
 * BOS text left out where the tokenizer adds BOS), one rendering checked as
 * text; and each error is refused with its reason (bad JSON, a template that
 * does not parse, raise_exception's message, a model without a template).
 * Without jansson (the ARM cross build): refused, naming libjansson-dev. */
#include "testhelp.h"

#ifdef PKV_TEST_HAVE_CHAT
#include <jansson.h>

#include "chat/chat.h"
#endif

static const char *k_req =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather <|im_end|> in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"sunny\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    " \"add_generation_prompt\": true}";

#ifdef PKV_TEST_HAVE_CHAT

static pkv_model *make(const char *family, const char *text, const char *name) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.chat_template = family;
    p.chat_template_text = text;
    const char *path = th_tmp(name);
    pkv_status s = pkv_mkmodel_write(&p, path);
    if (s) {
        TH_FAIL("mkmodel %s: %s", name, pkv_errmsg());
        return NULL;
    }
    pkv_model *m = pkv_model_load(path, pkv_model_default_params());
    if (!m) TH_FAIL("load %s: %s", name, pkv_errmsg());
    return m;
}

/* The public call against the chat layer's own rendering (serve's) of tpl. */
static void same_as_serve(pkv_model *m, const char *tpl, const char *what, const char *want_in) {
    char *p = NULL;
    size_t plen = 0, *sp = NULL, nsp = 0;
    CHECK_OK(pkv_chat_render(m, NULL, k_req, 1700000000, &p, &plen, &sp, &nsp));
    char err[600] = "";
    pkv_chat *c = pkv_chat_init_model(m, tpl, strlen(tpl), err, sizeof err);
    json_t *body = json_loads(k_req, 0, NULL);
    size_t len = 0, *sp2 = NULL, nsp2 = 0;
    int status = 0;
    char *q = c && body ? pkv_chat_apply(c, body, 1700000000, &len, &sp2, &nsp2, &status, err, sizeof err) : NULL;
    if (!p || !q) {
        TH_FAIL("%s: %s", what, q ? pkv_errmsg() : err);
    } else {
        if (plen != len || memcmp(p, q, len)) TH_FAIL("%s:\n got  [%s]\n serve's [%s]", what, p, q);
        CHECK_INT(nsp, nsp2);
        if (nsp == nsp2 && nsp) CHECK(!memcmp(sp, sp2, 2 * nsp * sizeof *sp));
        if (!strstr(p, want_in)) TH_FAIL("%s: [%s] not in [%s]", what, want_in, p);
        for (size_t i = 0; i < nsp; i++) CHECK(sp[2 * i] < sp[2 * i + 1] && sp[2 * i + 1] <= plen);
    }
    pkv_chat_render_free(p, sp);
    free(q);
    free(sp2);
    json_decref(body);
    pkv_chat_free(c);
}

static char *model_template(const char *family) {
    return strdup(pkv_tpl_source(pkv_tpl_from_name(family)));
}

static void test_families(void) {
    static const struct {
        const char *family, *want_in;
    } fams[] = {{"chatml", "<|im_start|>user\nWeather <|im_end|> in Paris?<|im_end|>"},
                {"llama3", "<|start_header_id|>user<|end_header_id|>\n\nWeather"},
                {"gemma", "<start_of_turn>user\nBe brief.\n\nWeather"}};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        pkv_model *m = make(fams[i].family, NULL, fams[i].family);
        char *tpl = model_template(fams[i].family);
        if (m && tpl) same_as_serve(m, tpl, fams[i].family, fams[i].want_in);
        /* the family by name renders the same as the model's copy of it */
        char *a = NULL, *b = NULL;
        if (m) {
            CHECK_OK(pkv_chat_render(m, NULL, k_req, 1, &a, NULL, NULL, NULL));
            CHECK_OK(pkv_chat_render(m, fams[i].family, k_req, 1, &b, NULL, NULL, NULL));
            CHECK(a && b && !strcmp(a, b));
        }
        pkv_chat_render_free(a, NULL);
        pkv_chat_render_free(b, NULL);
        free(tpl);
        pkv_model_free(m);
    }
    /* llama3's tokenizer adds BOS: its text is left out, as serve does */
    pkv_model *m = make("llama3", NULL, "llama3-bos");
    char *p = NULL;
    if (m) CHECK_OK(pkv_chat_render(m, NULL, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 1, &p,
                                    NULL, NULL, NULL));
    CHECK(p && !strcmp(p, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    pkv_chat_render_free(p, NULL);
    pkv_model_free(m);
}

static void test_tools_template(void) {
    char path[1024];
    const char *src = getenv("PKV_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/templates/Qwen-Qwen2.5-7B-Instruct.jinja", src ? src : PKV_TEST_SRC);
    static char copy[1 << 16];
    if (!th_read_text(path, copy, sizeof copy)[0]) {
        TH_FAIL("cannot read %s", path);
        return;
    }
    pkv_model *m = make("chatml", copy, "qwen25");
    if (m) same_as_serve(m, copy, "Qwen 2.5 with tools", "\"name\": \"get_weather\"");
    pkv_model_free(m);
}

static void test_errors(void) {
    char *p = (char *)1;
    CHECK_STATUS(pkv_chat_render(NULL, "chatml", "{\"messages\": [", 0, &p, NULL, NULL, NULL), PKV_ERR_INVALID);
    CHECK(p == NULL && strstr(pkv_errmsg(), "request_json: line 1"));
    CHECK_STATUS(pkv_chat_render(NULL, "{% for %}", "{\"messages\": []}", 0, &p, NULL, NULL, NULL), PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "does not parse"));
    CHECK_STATUS(pkv_chat_render(NULL, "{{ raise_exception('no system role here') }}", "{\"messages\": []}", 0, &p,
                                 NULL, NULL, NULL),
                 PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "no system role here"));
    CHECK_STATUS(pkv_chat_render(NULL, NULL, "{\"messages\": []}", 0, &p, NULL, NULL, NULL), PKV_ERR_INVALID);
    /* without a model, bos_token and eos_token come from the request */
    CHECK_OK(pkv_chat_render(NULL, "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"bos_token\": \"<s>\", "
                             "\"eos_token\": \"</s>\"}",
                             0, &p, NULL, NULL, NULL));
    CHECK(p && !strcmp(p, "<s>x</s>"));
    pkv_chat_render_free(p, NULL);
    /* a model without tokenizer.chat_template: NULL template is refused naming the key */
    pkv_model *m = pkv_model_builtin(pkv_model_default_params());
    CHECK(m != NULL);
    if (m) {
        CHECK_STATUS(pkv_chat_render(m, NULL, "{\"messages\": []}", 0, &p, NULL, NULL, NULL), PKV_ERR_NOT_FOUND);
        CHECK(strstr(pkv_errmsg(), "tokenizer.chat_template"));
    }
    pkv_model_free(m);
}

int main(void) {
    test_families();
    test_tools_template();
    test_errors();
    return th_done();
}

#else

int main(void) {
    char *p = (char *)1;
    CHECK_STATUS(pkv_chat_render(NULL, "chatml", k_req, 0, &p, NULL, NULL, NULL), PKV_ERR_UNSUPPORTED);
    CHECK(p == NULL && strstr(pkv_errmsg(), "libjansson-dev"));
    return th_done();
}

#endif
