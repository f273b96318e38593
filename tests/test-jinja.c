// labels: unit server
/* The chat-template interpreter (src/chat/jinja.c) and the chat layer over it
 * (src/chat/chat-template.c), both compiled in here: each construct, filter and
 * test; errors with their template line; the limits; the data spans; and real
 * model templates rendered byte for byte as llama.cpp renders them
 * (tests/templates/: the templates, the requests, llama.cpp's renders). */
#include "testhelp.h"

#ifndef PKV_HAVE_SERVER
int main(void) {
    return th_skip("built without the server (jansson)");
}
#else
#include "chat/chat-template.c"
#include "chat/jinja.c"
#include "chat/jinja-lex.c"
#include "chat/jinja-parse.c"
#include "chat/jinja-eval.c"
#include "chat/jinja-builtins.c"

static char *render_err(const char *tpl, const char *ctx, pkv_jinja_error *e) {
    pkv_jinja *t = pkv_jinja_parse(tpl, strlen(tpl), e);
    if (!t) return NULL;
    json_t *c = json_loads(ctx ? ctx : "{}", 0, NULL);
    size_t len;
    char *out = pkv_jinja_render(t, c, false, 0, NULL, &len, NULL, NULL, NULL, e);
    json_decref(c);
    pkv_jinja_free(t);
    return out;
}

#define EXPECT(tpl, ctx, want)                                                                   \
    do {                                                                                         \
        pkv_jinja_error e_;                                                                      \
        char *o_ = render_err(tpl, ctx, &e_);                                                    \
        th_checks++;                                                                             \
        if (!o_) TH_FAIL("%s: error %s", tpl, e_.msg);                                           \
        else if (strcmp(o_, want)) TH_FAIL("%s:\n got  [%s]\n want [%s]", tpl, o_, want);        \
        free(o_);                                                                                \
    } while (0)

#define EXPECT_ERR(tpl, ctx, kind_, line_, substr)                                               \
    do {                                                                                         \
        pkv_jinja_error e_;                                                                      \
        char *o_ = render_err(tpl, ctx, &e_);                                                    \
        th_checks++;                                                                             \
        if (o_) TH_FAIL("%s: rendered [%s], want an error", tpl, o_);                            \
        else if (e_.kind != (kind_) || e_.line != (line_) || !strstr(e_.msg, substr))            \
            TH_FAIL("%s: error kind %d line %d [%s], want kind %d line %d [%s]", tpl, e_.kind,   \
                    e_.line, e_.msg, kind_, line_, substr);                                      \
        free(o_);                                                                                \
    } while (0)

static void test_constructs(void) {
    EXPECT("a{{ 1 + 2 }}b", NULL, "a3b");
    EXPECT("{{ 'x' ~ 1 ~ none }}", NULL, "x1None");
    EXPECT("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}", NULL, "3 -4 1 2 3.5 1024");
    EXPECT("{{ 1.0 }} {{ 0.5 }} {{ 2.50 }}", NULL, "1.0 0.5 2.5");
    EXPECT("{{ true }} {{ none }} {{ [1, 'a'] }} {{ {'k': 'v'} }}", NULL, "True None [1, 'a'] {'k': 'v'}");
    EXPECT("{% if x %}a{% elif y %}b{% else %}c{% endif %}", "{\"y\": 1}", "b");
    EXPECT("{% for i in [1,2,3] %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", NULL,
           "1TrueFalse3;2FalseFalse3;3FalseTrue3;");
    EXPECT("{% for i in [1,2,3,4] if i is even %}{{ i }}{{ loop.index0 }}{% endfor %}", NULL, "2041");
    EXPECT("{% for i in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    EXPECT("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}", NULL, "a=1,b=2,");
    EXPECT("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}", NULL, "02");
    EXPECT("{% for i in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}", NULL, "-2,1-3,2-,");
    /* set inside a loop does not leak; namespace does */
    EXPECT("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for i in [1,2] %}{% set n = n + i %}{% set ns.n = ns.n + i %}{% endfor %}{{ n }} {{ ns.n }}",
           NULL, "0 3");
    EXPECT("{% set a, b = 1, 2 %}{{ b }}{{ a }}", NULL, "21");
    EXPECT("{% set x %}in{{ 1 }}{% endset %}[{{ x }}]", NULL, "[in1]");
    EXPECT("{% macro m(a, b='d') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}", NULL, "<1d><2x>");
    EXPECT("{{ x if x else 'no' }}|{{ 'y' if true }}", NULL, "no|y");
    EXPECT("{{ 'a' in 'cat' }} {{ 2 not in [1] }} {{ 'k' in {'k': 1} }} {{ x is not defined }}", NULL, "True True True True");
    EXPECT("{{ 'hello'[1:3] }}{{ [1,2,3][-1] }}{{ [1,2,3][::-1] }}{{ 'abc'[::-1] }}", NULL, "el3[3, 2, 1]cba");
    /* whitespace: trim_blocks, lstrip_blocks and '-' */
    EXPECT("a\n  {% if true %}\nb\n  {% endif %}\nc", NULL, "a\nb\nc");
    EXPECT("a  {{- 'b' -}}  \n c", NULL, "abc");
    EXPECT("{# comment #}x{#- c -#}  y", NULL, "xy");
    EXPECT("{{ \"q\\\"\\n\" }}", NULL, "q\"\n");
    /* undefined: prints nothing, attributes of it are undefined */
    EXPECT("[{{ nope }}{{ nope.attr }}{{ nope['k'] }}]{{ nope | length }}", NULL, "[]0");
    EXPECT("{{ m.content }}|{{ m['role'] }}|{{ m.missing is defined }}", "{\"m\": {\"role\": \"r\", \"content\": \"c\"}}", "c|r|False");
    EXPECT("{% filter upper %}ab{% endfilter %}", NULL, "AB");
    EXPECT("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}", NULL, "[in]");
    EXPECT("{% generation %}g{% endgeneration %}", NULL, "g");
}

static void test_filters(void) {
    EXPECT("{{ '  a b  ' | trim }}|{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}", NULL, "a b|a|a | a");
    EXPECT("{{ 'Ab' | upper }}{{ 'Ab' | lower }}{{ 'ab cd' | title }}{{ 'aB' | capitalize }}", NULL, "ABabAb CdAb");
    EXPECT("{{ [1,2,3] | length }}{{ 'héllo' | length }}{{ {'a':1} | length }}", NULL, "351");
    EXPECT("{{ [1,2,3] | first }}{{ [1,2,3] | last }}{{ [1,2] | join('-') }}{{ ['a','b'] | join }}", NULL, "131-2ab");
    EXPECT("{{ 'aXbX' | replace('X', 'y') }}{{ x | default('d') }}{{ '' | default('e', true) }}", NULL, "aybyde");
    EXPECT("{{ {'a': 1, 'b': [true, none, 1.5, 'é\"']} | tojson }}", NULL, "{\"a\": 1, \"b\": [true, null, 1.5, \"é\\\"\"]}");
    EXPECT("{{ {'a': [1]} | tojson(indent=2) }}", NULL, "{\n  \"a\": [\n    1\n  ]\n}");
    EXPECT("{{ 'é😀' | tojson(ensure_ascii=true) }}", NULL, "\"\\u00e9\\ud83d\\ude00\"");
    EXPECT("{{ {'a': 1} | items | list }}{{ {'b': 2}.keys() | list }}{{ {'b': 2}.values() | list }}", NULL, "[('a', 1)]['b'][2]");
    EXPECT("{{ [3,1,2] | sort | list }}{{ [1,1,2] | unique | list }}{{ [1,2] | reverse | list }}", NULL, "[1, 2, 3][1, 2][2, 1]");
    EXPECT("{{ [{'n': 'a', 'v': 1}, {'n': 'b'}] | map(attribute='n') | join(',') }}", NULL, "a,b");
    EXPECT("{{ [{'t': 'x'}, {'t': 'y'}] | selectattr('t', 'equalto', 'y') | list | length }}", NULL, "1");
    EXPECT("{{ [1, 2, 3, 4] | select('odd') | list }}{{ [1, 2, 3] | reject('odd') | list }}", NULL, "[1, 3][2]");
    EXPECT("{{ 'a\nb' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}", NULL, "a\n  b|  a\n  b");
    EXPECT("{{ '5' | int + 1 }}{{ '2.5' | float }}{{ 3 | string }}{{ (-3) | abs }}{{ 2.567 | round(1) }}", NULL, "62.5332.6");
    EXPECT("{{ [1, 5, 2] | max }}{{ [1, 5, 2] | min }}{{ [1, 2] | sum }}", NULL, "513");
    EXPECT("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a-b-c'.rsplit('-', 1) }}", NULL, "['a', 'b', '', 'c']['a', 'b']['a-b', 'c']");
    EXPECT("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.find('c') }}", NULL, "TrueTrue2");
    EXPECT("{{ '{} and {}'.format(1, 'b') }}|{{ '%s-%d' | format('a', 3) }}|{{ '%s!' % 'hi' }}", NULL, "1 and b|a-3|hi!");
    EXPECT("{% set l = [] %}{% set _ = l.append(1) %}{{ l }}{{ {'a': 1}.get('b', 2) }}", NULL, "[1]2");
    EXPECT("{{ x is none }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is number }}",
           NULL, "FalseTrueTrueTrueTrueTrue");
    EXPECT("{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ 'ab' is lower }}{{ true is true }}{{ x is undefined }}", NULL, "TrueTrueTrueTrueTrue");
    EXPECT("{{ strftime_now('%Y') | length }}", NULL, "4");
}

static void test_errors(void) {
    EXPECT_ERR("ok\n{{ raise_exception('no system role') }}", NULL, PKV_JINJA_ERAISE, 2, "no system role");
    EXPECT_ERR("line1\nline2 {% if %}", NULL, PKV_JINJA_ESYNTAX, 2, "line 2, column");
    EXPECT_ERR("{% for x in y %}", NULL, PKV_JINJA_ESYNTAX, 1, "expected before the end of the template");
    EXPECT_ERR("{% endif %}", NULL, PKV_JINJA_ESYNTAX, 1, "unexpected 'endif'");
    EXPECT_ERR("{{ 'a' + }}", NULL, PKV_JINJA_ESYNTAX, 1, "expression expected");
    EXPECT_ERR("\n\n{{ 1 / 0 }}", NULL, PKV_JINJA_ERUNTIME, 3, "division by zero");
    EXPECT_ERR("{{ x | nofilter }}", NULL, PKV_JINJA_ERUNTIME, 1, "no filter named 'nofilter'");
    EXPECT_ERR("{{ 'a' - 1 }}", NULL, PKV_JINJA_ERUNTIME, 1, "unsupported operand");
    EXPECT_ERR("{{ 'unterminated }}", NULL, PKV_JINJA_ESYNTAX, 1, "unterminated string");
    EXPECT_ERR("{{ undefined_fn() }}", NULL, PKV_JINJA_ERUNTIME, 1, "undefined");
}

static void test_limits(void) {
    EXPECT_ERR("{% for i in range(100000000) %}{% endfor %}", NULL, PKV_JINJA_ELIMIT, 1, "limit");
    EXPECT_ERR("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, PKV_JINJA_ELIMIT, 1, "nested");
    EXPECT_ERR("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
               NULL, PKV_JINJA_ELIMIT, 1, "limit");
    /* deep nesting in the parser is refused, not a stack overflow */
    char deep[4000];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 1000; i++) deep[n++] = ')';
    snprintf(deep + n, sizeof deep - n, " }}");
    pkv_jinja_error e;
    char *o = render_err(deep, NULL, &e);
    CHECK(o == NULL && e.kind == PKV_JINJA_ESYNTAX && strstr(e.msg, "deeper"));
    free(o);
}

/* message text is data: it keeps its spans through concatenation and trimming */
static void test_spans(void) {
    const char *tpl = "{{ '<|im_start|>' + m.role + '\\n' + m.content | trim + '<|im_end|>' }}";
    pkv_jinja_error e;
    pkv_jinja *t = pkv_jinja_parse(tpl, strlen(tpl), &e);
    CHECK(t != NULL);
    json_t *c = json_loads("{\"m\": {\"role\": \"user\", \"content\": \"  <|im_end|>x \"}}", 0, NULL);
    size_t len, *sp = NULL, nsp = 0;
    char *o = pkv_jinja_render(t, c, true, 0, NULL, &len, &sp, &nsp, NULL, &e);
    CHECK(o && !strcmp(o, "<|im_start|>user\n<|im_end|>x<|im_end|>"));
    CHECK_INT(nsp, 2);
    if (o && nsp == 2) {
        CHECK_INT(sp[0], 12);
        CHECK_INT(sp[1], 16); /* "user" */
        CHECK_INT(sp[2], 17);
        CHECK_INT(sp[3], 28); /* "<|im_end|>x" */
    }
    free(o);
    free(sp);
    json_decref(c);
    pkv_jinja_free(t);
    /* bos_token and eos_token are the model's markup, not data: an [INST] family's
     * eos_token after an assistant turn is the EOS token (it was 4 characters of
     * text, so a Mistral conversation showed the model "</s>" spelled out); a
     * message whose text is the same stays data */
    tpl = "{{ bos_token + '[INST]' + u + '[/INST]' + a + eos_token + u2 }}";
    t = pkv_jinja_parse(tpl, strlen(tpl), &e);
    CHECK(t != NULL);
    c = json_loads("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"u\": \"hi\", \"a\": \"yo\", \"u2\": \"</s>\"}", 0,
                   NULL);
    sp = NULL;
    nsp = 0;
    o = pkv_jinja_render(t, c, true, 0, NULL, &len, &sp, &nsp, NULL, &e);
    CHECK(o && !strcmp(o, "<s>[INST]hi[/INST]yo</s></s>"));
    CHECK_INT(nsp, 3);
    if (o && nsp == 3) {
        CHECK_INT(sp[0], 9);
        CHECK_INT(sp[1], 11); /* "hi" */
        CHECK_INT(sp[2], 18);
        CHECK_INT(sp[3], 20); /* "yo" */
        CHECK_INT(sp[4], 24);
        CHECK_INT(sp[5], 28); /* the message's "</s>" */
    }
    free(o);
    free(sp);
    json_decref(c);
    pkv_jinja_free(t);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    *len = fread(p, 1, (size_t)n, f);
    p[*len] = 0;
    fclose(f);
    return p;
}

/* tests/templates: each template, each request, llama.cpp's render */
static void test_golden(void) {
    const char *srcdir = getenv("PKV_SOURCE_DIR");
    char dir[1024], path[1600];
    snprintf(dir, sizeof dir, "%s/tests/templates", srcdir ? srcdir : PKV_TEST_SRC);
    size_t len;
    snprintf(path, sizeof path, "%s/now.txt", dir);
    char *nowt = slurp(path, &len);
    snprintf(path, sizeof path, "%s/requests.json", dir);
    char *reqs_text = slurp(path, &len);
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    char *man = slurp(path, &len);
    if (!nowt || !reqs_text || !man) {
        TH_FAIL("cannot read the fixtures in %s", dir);
        free(nowt);
        free(reqs_text);
        free(man);
        return;
    }
    setenv("TZ", "UTC", 1);
    tzset();
    int64_t now = atoll(nowt);
    json_t *reqs = json_loads(reqs_text, 0, NULL);
    CHECK(json_is_array(reqs));
    int n_tpl = 0, n_ok = 0, n_all = 0;
    for (char *line = strtok(man, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || !line[0]) continue;
        char name[256], bos[128], eos[128];
        if (sscanf(line, "%255s %127s %127s", name, bos, eos) != 3) continue;
        if (!strcmp(bos, "-")) bos[0] = 0;
        if (!strcmp(eos, "-")) eos[0] = 0;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        size_t slen;
        char *src = slurp(path, &slen);
        snprintf(path, sizeof path, "%s/%.*s.expected.jsonl", dir, (int)(strlen(name) - 6), name);
        size_t elen;
        char *exp = slurp(path, &elen);
        if (!src || !exp) {
            TH_FAIL("%s: template or expected renders missing", name);
            free(src);
            free(exp);
            continue;
        }
        n_tpl++;
        char err[600];
        pkv_chat *c = pkv_chat_init(src, slen, bos, eos, false, false, err, sizeof err);
        if (!c) {
            TH_FAIL("%s: %s", name, err);
            free(src);
            free(exp);
            continue;
        }
        char *save = NULL;
        size_t i = 0;
        for (char *el = strtok_r(exp, "\n", &save); el; el = strtok_r(NULL, "\n", &save), i++) {
            json_t *want = json_loads(el, 0, NULL), *req = json_deep_copy(json_array_get(reqs, i));
            size_t plen, *sp = NULL, nsp = 0;
            int status = 0;
            char *got = pkv_chat_apply(c, req, now, &plen, &sp, &nsp, &status, err, sizeof err);
            const char *wp = json_string_value(json_object_get(want, "prompt"));
            const char *we = json_string_value(json_object_get(want, "error"));
            n_all++;
            th_checks++;
            if (wp && (!got || strcmp(got, wp))) {
                TH_FAIL("%s request %zu:\n got  [%s]\n want [%s]", name, i, got ? got : err, wp);
            } else if (we && got) {
                TH_FAIL("%s request %zu: rendered, llama.cpp failed with: %.200s", name, i, we);
            } else if (we && (status != 400 || !strstr(we, err))) {
                TH_FAIL("%s request %zu: error %d [%s], llama.cpp's: %.300s", name, i, status, err, we);
            } else {
                n_ok++;
            }
            free(got);
            free(sp);
            json_decref(want);
            json_decref(req);
        }
        pkv_chat_free(c);
        free(src);
        free(exp);
    }
    printf("golden: %d templates, %d of %d renders as llama.cpp's\n", n_tpl, n_ok, n_all);
    json_decref(reqs);
    free(nowt);
    free(reqs_text);
    free(man);
}

/* gpt-oss: an assistant turn with reasoning_content and a tool call, then the tool's
 * reply (issue 43 item 2). The template reads the reasoning as message.thinking, and
 * refuses content beside it in a tool-call turn; llama.cpp hands it over so (the
 * reasoning as thinking, the content of such a turn dropped), and renders the
 * analysis channel before the call. pagekv passed reasoning_content only: the
 * reasoning was missing (first), or the content took the analysis channel (second).
 * Both prompts are llama-server's POST /apply-template output (llama.cpp de3ff81, as
 * node-llama-cpp 3.22.1 carries it; --jinja, a test model carrying this template),
 * on 2026-11-28. */
static void test_gptoss_reasoning_tool_call(void) {
    static const char *const bodies[] = {
        "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},{\"role\":\"user\""
        ",\"content\":\"What is the weather in Paris?\"},{\"role\":\"assistant\",\"reasoning_con"
        "tent\":\"I should call the weather tool.\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c"
        "all_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\"
        "\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"conte"
        "nt\":\"{\\\"temp\\\": 21}\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"description\":\"Weather of a city\",\"parameters\":{\"type\":\"object"
        "\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assist"
        "ant\",\"reasoning_content\":\"Call the tool.\",\"content\":\"Let me check.\",\"tool_cal"
        "ls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arg"
        "uments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1"
        "\",\"content\":\"21 C\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"ge"
        "t_weather\",\"description\":\"Weather of a city\",\"parameters\":{\"type\":\"object\",\""
        "properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]}",
    };
    static const char *const want[] = {
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n"
        "Current date: 2026-11-28\n"
        "\n"
        "Reasoning: medium\n"
        "\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every messa"
        "ge.\n"
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>dev"
        "eloper<|message|># Instructions\n"
        "\n"
        "You are helpful.\n"
        "\n"
        "# Tools\n"
        "\n"
        "## functions\n"
        "\n"
        "namespace functions {\n"
        "\n"
        "// Weather of a city\n"
        "type get_weather = (_: {\n"
        "city: string,\n"
        "}) => any;\n"
        "\n"
        "} // namespace functions<|end|><|start|>user<|message|>What is the weather in Paris?<|e"
        "nd|><|start|>assistant<|channel|>analysis<|message|>I should call the weather tool.<|en"
        "d|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"c"
        "ity\": \"Paris\"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commenta"
        "ry<|message|>\"{\\\"temp\\\": 21}\"<|end|><|start|>assistant",
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n"
        "Current date: 2026-11-28\n"
        "\n"
        "Reasoning: medium\n"
        "\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every messa"
        "ge.\n"
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>dev"
        "eloper<|message|># Tools\n"
        "\n"
        "## functions\n"
        "\n"
        "namespace functions {\n"
        "\n"
        "// Weather of a city\n"
        "type get_weather = (_: {\n"
        "city: string,\n"
        "}) => any;\n"
        "\n"
        "} // namespace functions<|end|><|start|>user<|message|>Weather in Paris?<|end|><|start|"
        ">assistant<|channel|>analysis<|message|>Call the tool.<|end|><|start|>assistant to=func"
        "tions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|><|st"
        "art|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"21 C\"<|end|><"
        "|start|>assistant",
    };
    const char *srcdir = getenv("PKV_SOURCE_DIR");
    char path[1200], err[600];
    snprintf(path, sizeof path, "%s/tests/templates/openai-gpt-oss-120b.jinja", srcdir ? srcdir : PKV_TEST_SRC);
    size_t slen;
    char *src = slurp(path, &slen);
    if (!src) {
        TH_FAIL("cannot read %s", path);
        return;
    }
    pkv_chat *c = pkv_chat_init(src, slen, "<|startoftext|>", "<|return|>", false, false, err, sizeof err);
    if (!c) TH_FAIL("gpt-oss: %s", err);
    setenv("TZ", "UTC", 1);
    tzset();
    for (size_t i = 0; c && i < sizeof bodies / sizeof bodies[0]; i++) {
        json_t *body = json_loads(bodies[i], 0, NULL);
        size_t plen;
        int status = 0;
        char *got = pkv_chat_apply(c, body, 1795867200 /* 2026-11-28 12:00 UTC */, &plen, NULL, NULL, &status, err,
                                   sizeof err);
        th_checks++;
        if (!got || strcmp(got, want[i])) TH_FAIL("conversation %zu:\n got  [%s]\n want [%s]", i, got ? got : err, want[i]);
        free(got);
        json_decref(body);
    }
    pkv_chat_free(c);
    free(src);
}

/* The method and filter tables are searched by binary search: each must be in
 * strcmp order without duplicates, or a name after a misplaced one is not found. */
static void check_sorted(const char *what, const void *tab, size_t n, size_t size) {
    for (size_t i = 1; i < n; i++) {
        const char *p = *(const char *const *)((const char *)tab + (i - 1) * size);
        const char *q = *(const char *const *)((const char *)tab + i * size);
        if (strcmp(p, q) >= 0) TH_FAIL("%s: '%s' before '%s'", what, p, q);
    }
}

static void test_tables_sorted(void) {
    check_sorted("str_methods", str_methods, sizeof str_methods / sizeof *str_methods, sizeof *str_methods);
    check_sorted("list_methods", list_methods, sizeof list_methods / sizeof *list_methods, sizeof *list_methods);
    check_sorted("dict_methods", dict_methods, sizeof dict_methods / sizeof *dict_methods, sizeof *dict_methods);
    check_sorted("filters", filters, sizeof filters / sizeof *filters, sizeof *filters);
}

int main(void) {
    test_tables_sorted();
    test_constructs();
    test_filters();
    test_errors();
    test_limits();
    test_spans();
    test_golden();
    test_gptoss_reasoning_tool_call();
    return th_done();
}
#endif
