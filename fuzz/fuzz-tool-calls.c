/* Fuzz harness: the tool-call and reasoning parser (src/chat/tool-calls.c).
 * Input: one byte of options (format, think, in_think, calls), one byte seeding
 * the chunk sizes, then the model's output text. It is parsed whole, then fed to
 * the streaming parser in those chunks.
 *
 * Checked: no crash, leak or hang; the streamed deltas, concatenated, equal the
 * whole parse (reasoning, content, each call's name and arguments), calls are
 * announced in index order before their arguments. */
#include "fuzz-common.h"
#include "chat/tool-calls.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct cat {
    char *p;
    size_t n;
} cat;

static void put(cat *c, const char *s, size_t n) {
    char *q = realloc(c->p, c->n + n + 1);
    FUZZ_CHECK(q != NULL);
    c->p = q;
    if (n) memcpy(c->p + c->n, s, n);
    c->n += n;
    c->p[c->n] = 0;
}

static void same(const cat *c, const char *s, size_t n) {
    FUZZ_CHECK(c->n == n && (!n || !memcmp(c->p, s, n)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 16384) return 0;
    pkv_tc_opts o = {(pkv_tc_format)(data[0] % 7), (data[0] >> 3) & 1, (data[0] >> 4) & 1, !((data[0] >> 5) & 1)};
    unsigned step = data[1];
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    pkv_tc_result whole;
    FUZZ_CHECK(pkv_tc_parse(&o, text, n, false, &whole));
    pkv_tc_stream *s = pkv_tc_stream_new(&o);
    FUZZ_CHECK(s != NULL);
    cat reasoning = {0}, content = {0}, names[8] = {{0}}, args[8] = {{0}};
    int calls = 0;
    size_t at = 0;
    for (;;) {
        bool final = at >= n;
        const pkv_tc_delta *d;
        int nd;
        FUZZ_CHECK(pkv_tc_stream_update(s, text, final ? n : at, final, &d, &nd));
        for (int i = 0; i < nd; i++) {
            if (d[i].kind == PKV_TC_D_REASONING) put(&reasoning, d[i].text, d[i].len);
            else if (d[i].kind == PKV_TC_D_CONTENT) put(&content, d[i].text, d[i].len);
            else if (d[i].kind == PKV_TC_D_CALL) {
                FUZZ_CHECK(d[i].index == calls);
                if (calls < 8) put(&names[calls], d[i].text, d[i].len);
                calls++;
            } else {
                FUZZ_CHECK(d[i].index < calls);
                if (d[i].index < 8) put(&args[d[i].index], d[i].text, d[i].len);
            }
        }
        if (final) break;
        step = step * 1103515245u + 12345u;
        at += 1 + (step >> 16) % 9;
    }
    same(&reasoning, whole.reasoning, whole.reasoning_len);
    same(&content, whole.content, whole.content_len);
    FUZZ_CHECK(calls == whole.n_calls);
    for (int i = 0; i < calls && i < 8; i++) {
        same(&names[i], whole.calls[i].name, strlen(whole.calls[i].name));
        same(&args[i], whole.calls[i].args, whole.calls[i].args_len);
    }
    free(reasoning.p);
    free(content.p);
    for (int i = 0; i < 8; i++) {
        free(names[i].p);
        free(args[i].p);
    }
    pkv_tc_stream_free(s);
    pkv_tc_result_free(&whole);
    return 0;
}
