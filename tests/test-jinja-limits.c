// labels: unit server
/* The chat-template interpreter's bounds against hostile templates and requests
 * (issues 43.4 and 50.3/50.6), each of which hung, exhausted memory or tripped
 * UBSan before:
 *  - 2 MB templates of one long expression (a.b.b.b..., a[0][0]..., 1+1+1...,
 *    not not not...) took 13-24 minutes to compile: now a syntax error naming
 *    the line and the nesting limit, within a second;
 *  - a 400 KB template of many small tags took 25 s to lex (line numbers were
 *    counted from the start for each token);
 *  - a long elif chain recursed once per branch;
 *  - 'zz' in s over a long s, 200,000 times, ran for many minutes under the step
 *    limit: the work limit counts the bytes scanned; the wall-clock limit, the
 *    cancel callback and the shared memory budget stop a render too;
 *  - 64-bit integer overflow (+, -, *, **, //, unary -, abs, sum, range, slices,
 *    string repeat, divisibleby) was undefined behaviour: an error naming the
 *    operation, or the defined result;
 *  - a rejected chat request with tools leaked its tools array. */
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

#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 4.0 /* the sanitizers' interceptors: a scan is several times slower */
#else
#define SLOW 1.0
#endif

static double secs(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* "{{ " head (unit x count) tail " }}" */
static char *repeat(const char *head, const char *unit, size_t count, const char *tail, size_t *len) {
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * count + tl + 1);
    if (!s) abort();
    memcpy(s, head, hl);
    size_t n = hl;
    for (size_t i = 0; i < count; i++, n += ul) memcpy(s + n, unit, ul);
    memcpy(s + n, tail, tl + 1);
    *len = n + tl;
    return s;
}

/* each 2 MB shape fails to compile at once, with the line and the limit */
static void test_long_expressions(void) {
    static const struct { const char *head, *unit, *tail; } shapes[] = {
        {"\n{{ x", ".y", " }}"},
        {"\n{{ x", "[0]", " }}"},
        {"\n{{ 1", "+1", " }}"},
        {"\n{{ ", "not ", "x }}"},
        {"\n{{ x", "|trim", " }}"},
        {"\n{{ 'a'", " ~ 'a'", " }}"},
        {"\n{{ -", "-", "1 }}"},
        {"\n{{ f", "()", " }}"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        size_t len, ul = strlen(shapes[i].unit);
        char *s = repeat(shapes[i].head, shapes[i].unit, ((size_t)2 << 20) / ul, shapes[i].tail, &len);
        pkv_jinja_error e;
        double t0 = secs();
        pkv_jinja *t = pkv_jinja_parse(s, len, &e);
        double dt = secs() - t0;
        th_checks++;
        if (t) TH_FAIL("shape %zu (%s): compiled", i, shapes[i].unit);
        else if (e.kind != PKV_JINJA_ESYNTAX || e.line != 2 || !strstr(e.msg, "nesting limit") || !strstr(e.msg, "200"))
            TH_FAIL("shape %zu (%s): kind %d line %d [%s]", i, shapes[i].unit, e.kind, e.line, e.msg);
        if (dt > 2.0 * SLOW) TH_FAIL("shape %zu (%s): %.1f s to refuse a 2 MB template", i, shapes[i].unit, dt);
        pkv_jinja_free(t);
        free(s);
    }
    /* 200 deep is still fine, and renders */
    size_t len;
    char *s = repeat("{{ 0", "+1", 150, " }}", &len);
    pkv_jinja_error e;
    pkv_jinja *t = pkv_jinja_parse(s, len, &e);
    REQUIRE_VOID(t != NULL);
    size_t n;
    char *o = pkv_jinja_render(t, NULL, false, 0, NULL, &n, NULL, NULL, NULL, &e);
    CHECK(o && !strcmp(o, "150"));
    free(o);
    pkv_jinja_free(t);
    free(s);
}

/* lexing is linear: a 2 MB template of small tags, and one of many strings */
static void test_lexer_linear(void) {
    static const char *const units[] = {"{{ a }}\n", "{{ 'a' }}\n", "x{# c #}\n", "{% if a %}b{% endif %}\n"};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        size_t len;
        char *s = repeat("", units[i], ((size_t)2 << 20) / strlen(units[i]), "{{ ", &len); /* ends in an error */
        pkv_jinja_error e;
        double t0 = secs();
        pkv_jinja *t = pkv_jinja_parse(s, len, &e);
        double dt = secs() - t0;
        CHECK(t == NULL && e.kind == PKV_JINJA_ESYNTAX && e.line > 1);
        if (dt > 2.0 * SLOW) TH_FAIL("unit %zu: %.1f s to lex 2 MB", i, dt);
        pkv_jinja_free(t);
        free(s);
    }
    /* line numbers stay right */
    const char *tpl = "a\nb\n{{ 1 }}\n{{ x.y }}\n\n  {{ 1 + }}";
    pkv_jinja_error e;
    CHECK(pkv_jinja_parse(tpl, strlen(tpl), &e) == NULL && e.line == 6 && e.col == 10);
}

/* a long elif chain renders without a recursion per branch */
static void test_elif_chain(void) {
    size_t len;
    char *s = repeat("{% if x == 0 %}0", "{% elif x == 1 %}1", 100000, "{% else %}e{% endif %}", &len);
    pkv_jinja_error e;
    pkv_jinja *t = pkv_jinja_parse(s, len, &e);
    REQUIRE_VOID(t != NULL);
    json_t *ctx = json_pack("{s:i}", "x", 7);
    size_t n;
    char *o = pkv_jinja_render(t, ctx, false, 0, NULL, &n, NULL, NULL, NULL, &e);
    CHECK(o && !strcmp(o, "e"));
    free(o);
    json_decref(ctx);
    pkv_jinja_free(t);
    free(s);
}

static char *run(const char *tpl, json_t *ctx, const pkv_jinja_limits *lim, pkv_jinja_error *e, double *dt) {
    pkv_jinja *t = pkv_jinja_parse(tpl, strlen(tpl), e);
    if (!t) return NULL;
    size_t n;
    double t0 = secs();
    char *o = pkv_jinja_render(t, ctx, true, 0, lim, &n, NULL, NULL, NULL, e);
    if (dt) *dt = secs() - t0;
    pkv_jinja_free(t);
    return o;
}

static bool cancel_after(void *ud) { return --*(int *)ud <= 0; }

static void test_render_bounds(void) {
    /* 50.6: 'zz' in s over 16 MiB, 200,000 times (was ~18 minutes) */
    size_t big = (size_t)16 << 20;
    char *buf = malloc(big + 1);
    REQUIRE_VOID(buf != NULL);
    memset(buf, 'z', big);
    for (size_t i = 0; i < big; i += 2) buf[i] = 'a';
    buf[big] = 0;
    json_t *ctx = json_pack("{s:s}", "s", buf);
    free(buf);
    const char *tpl = "{% for i in range(200000) %}{% if 'zz' in s %}x{% endif %}{% endfor %}";
    pkv_jinja_error e;
    double dt;
    /* the default work limit (about 1.5 s here); under the sanitizers a quarter of
     * it, and a slow machine may reach the 10 s time limit first: either bounds it */
    pkv_jinja_limits san = {.max_work = (int64_t)256 << 20};
    char *o = run(tpl, ctx, SLOW > 1 ? &san : NULL, &e, &dt);
    CHECK(o == NULL && e.kind == PKV_JINJA_ELIMIT && (strstr(e.msg, "work limit") || (SLOW > 1 && strstr(e.msg, "time limit"))));
    if (dt > 10.0 * SLOW) TH_FAIL("the work limit took %.1f s", dt);
    printf("the default work limit stopped 200,000 'zz' in s (16 MiB) in %.2f s\n", dt);
    free(o);
    /* a smaller work limit stops sooner */
    pkv_jinja_limits lim = {.max_work = 64 << 20};
    o = run(tpl, ctx, &lim, &e, &dt);
    CHECK(o == NULL && e.kind == PKV_JINJA_ELIMIT && strstr(e.msg, "work limit") && dt < 2.0 * SLOW);
    free(o);
    /* the wall clock: cheap steps, many of them */
    pkv_jinja_limits tl = {.max_steps = (int64_t)1 << 40, .max_time_ms = 200};
    o = run("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, &tl, &e, &dt);
    CHECK(o == NULL && e.kind == PKV_JINJA_ELIMIT && strstr(e.msg, "time limit") && strstr(e.msg, "200 ms"));
    if (dt > 3.0 * SLOW) TH_FAIL("the time limit took %.1f s", dt);
    free(o);
    /* cancelled: the callback is polled while the render runs */
    int polls = 3;
    pkv_jinja_limits cl = {.cancel = cancel_after, .cancel_ud = &polls};
    o = run(tpl, ctx, &cl, &e, &dt);
    CHECK(o == NULL && e.kind == PKV_JINJA_ECANCEL && strstr(e.msg, "cancelled") && dt < 2.0 * SLOW);
    free(o);
    /* the shared budget: a render that needs more than what is left gets EBUDGET,
     * and every render gives back what it took */
    pkv_jinja_budget b = {.limit = (size_t)8 << 20};
    pkv_jinja_limits bl = {.shared = &b};
    o = run("{{ s|length }}", ctx, &bl, &e, &dt); /* s itself is 16 MiB */
    CHECK(o == NULL && e.kind == PKV_JINJA_EBUDGET && strstr(e.msg, "budget") && strstr(e.msg, "8 MiB"));
    free(o);
    CHECK(atomic_load(&b.used) == 0);
    b.limit = (size_t)64 << 20;
    o = run("{{ s|length }}", ctx, &bl, &e, &dt);
    CHECK(o && !strcmp(o, "16777216"));
    free(o);
    CHECK(atomic_load(&b.used) == 0);
    json_decref(ctx);
}

#define EXPECT(tpl, want)                                                                        \
    do {                                                                                         \
        pkv_jinja_error e_;                                                                      \
        char *o_ = run(tpl, NULL, NULL, &e_, NULL);                                              \
        th_checks++;                                                                             \
        if (!o_) TH_FAIL("%s: error %s", tpl, e_.msg);                                           \
        else if (strcmp(o_, want)) TH_FAIL("%s:\n got  [%s]\n want [%s]", tpl, o_, want);        \
        free(o_);                                                                                \
    } while (0)

#define EXPECT_ERR(tpl, kind_, substr)                                                           \
    do {                                                                                         \
        pkv_jinja_error e_;                                                                      \
        char *o_ = run(tpl, NULL, NULL, &e_, NULL);                                              \
        th_checks++;                                                                             \
        if (o_) TH_FAIL("%s: rendered [%s], want an error", tpl, o_);                            \
        else if (e_.kind != (kind_) || !strstr(e_.msg, substr))                                  \
            TH_FAIL("%s: error kind %d [%s], want kind %d [%s]", tpl, e_.kind, e_.msg, kind_, substr); \
        free(o_);                                                                                \
    } while (0)

#define MIN "(-9223372036854775807 - 1)"

static void test_overflow(void) {
    EXPECT_ERR("{{ 9223372036854775807 + 1 }}", PKV_JINJA_ERUNTIME, "integer overflow in +");
    EXPECT_ERR("{{ " MIN " - 1 }}", PKV_JINJA_ERUNTIME, "integer overflow in -");
    EXPECT_ERR("{{ 4611686018427387904 * 2 }}", PKV_JINJA_ERUNTIME, "integer overflow in *");
    EXPECT_ERR("{{ -3037000500 * 3037000500 }}", PKV_JINJA_ERUNTIME, "integer overflow in *");
    EXPECT_ERR("{{ 2 ** 63 }}", PKV_JINJA_ERUNTIME, "integer overflow in **");
    EXPECT_ERR("{{ 3 ** 1000000 }}", PKV_JINJA_ERUNTIME, "integer overflow in **");
    EXPECT_ERR("{{ -" MIN " }}", PKV_JINJA_ERUNTIME, "integer overflow in unary -");
    EXPECT_ERR("{{ " MIN " // -1 }}", PKV_JINJA_ERUNTIME, "integer overflow in //");
    EXPECT_ERR("{{ " MIN "|abs }}", PKV_JINJA_ERUNTIME, "integer overflow in abs");
    EXPECT_ERR("{{ [9223372036854775807, 1]|sum }}", PKV_JINJA_ERUNTIME, "integer overflow in sum");
    EXPECT_ERR("{{ 'ab' * 9223372036854775807 }}", PKV_JINJA_ELIMIT, "output limit");
    /* defined results where Python has them in 64 bits */
    EXPECT("{{ 9223372036854775806 + 1 }} {{ " MIN " % -1 }} {{ 2 ** 62 }} {{ (-2) ** 63 }} {{ (-1) ** 1000000001 }} {{ 1 ** 99999999999 }}",
           "9223372036854775807 0 4611686018427387904 -9223372036854775808 -1 1");
    EXPECT("{{ range(9223372036854775800, 9223372036854775807, 5)|list }} {{ range(" MIN " + 5, " MIN ", -3)|list }}",
           "[9223372036854775800, 9223372036854775805] [-9223372036854775803, -9223372036854775806]");
    EXPECT("{{ 'abc'[::9223372036854775807] }} {{ 'abc'[::" MIN "] }} {{ [1, 2, 3][::-9223372036854775807] }} "
           "[{{ 'abc'[" MIN "] }}] {{ 'abc'[" MIN ":] }} {{ 'abc'[:" MIN "] }}|",
           "a c [3] [] abc |");
    EXPECT("{{ 7 is divisibleby(-1) }} {{ " MIN " is divisibleby(-1) }} [{{ 'a'|center(" MIN ") }}] {{ 'a b c'.rsplit(' ', 9223372036854775807) }}",
           "True True [a] ['a', 'b', 'c']");
    EXPECT("{{ 1e300|int }} {{ -1e300|int }} {{ [1,2,3][1e300|int:] }}", "9223372036854775807 -9223372036854775807 []");
}

/* 50.3: the tools array of a request refused after it was built was not freed */
static long live;
static void *count_malloc(size_t n) {
    size_t *p = malloc(n + 16);
    if (!p) return NULL;
    live++;
    return (char *)p + 16;
}
static void count_free(void *p) {
    if (!p) return;
    live--;
    free((char *)p - 16);
}

static void test_tools_leak(void) {
    json_set_alloc_funcs(count_malloc, count_free);
    char err[256];
    const char *tpl = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools|length }}";
    pkv_chat *c = pkv_chat_init(tpl, strlen(tpl), "", "", false, false, err, sizeof err);
    REQUIRE_VOID(c != NULL);
    static const char *const bodies[] = {
        /* two assistant messages at the end */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"a\"},"
        " {\"role\": \"assistant\", \"content\": \"b\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
        /* both add_generation_prompt and continue_final_message */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": true, \"continue_final_message\": true,"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
        /* continuing a message with tool calls */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\","
        " \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
        /* a bad enable_thinking */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": {\"enable_thinking\": \"yes\"},"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
        /* a bad tool after good ones */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, 1]}",
        /* and one that renders */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        json_t *b = json_loads(bodies[i], 0, NULL);
        REQUIRE_VOID(b != NULL);
        long before = live;
        size_t len;
        int status = 0;
        char *o = pkv_chat_apply(c, b, 1, &len, NULL, NULL, &status, err, sizeof err);
        th_checks++;
        if (i + 1 < sizeof bodies / sizeof bodies[0] ? o != NULL || status != 400 : o == NULL || strcmp(o, "hi1"))
            TH_FAIL("body %zu: [%s] status %d %s", i, o ? o : "", status, err);
        if (live != before) TH_FAIL("body %zu: %ld JSON values leaked (%s)", i, live - before, err);
        free(o);
        json_decref(b);
    }
    pkv_chat_free(c);
    json_set_alloc_funcs(malloc, free);
}

int main(void) {
    test_tools_leak();
    test_long_expressions();
    test_lexer_linear();
    test_elif_chain();
    test_overflow();
    test_render_bounds();
    return th_done();
}
#endif
