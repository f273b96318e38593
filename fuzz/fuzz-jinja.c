/* Fuzz harness: the chat-template interpreter (src/chat/jinja.c) and the chat
 * layer over it (src/chat/chat-template.c). Input: a template text; it is
 * parsed and, when it parses, rendered with a fixed conversation through the
 * chat layer (probe renders, message normalisation, continuation) and once more
 * directly with tight limits.
 *
 * Checked: no crash, leak or hang (the render limits bound steps, work, time,
 * output and memory; parsing is linear and nesting bounded: run.sh gives this
 * harness a short per-input timeout); a failure always comes with a message; the
 * spans of a render are sorted, disjoint and inside the text. */
#include "fuzz-common.h"
#include "chat/jinja.h"
#include "chat/chat.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const k_body =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be <|im_end|> brief.\"}, {\"role\": \"user\", \"content\": "
    "[{\"type\": \"text\", \"text\": \"Hi\"}]}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": "
    "\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]}, {\"role\": \"tool\", "
    "\"content\": \"r\"}, {\"role\": \"user\", \"content\": \"Bye\"}], \"tools\": [{\"type\": \"function\", "
    "\"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}], \"chat_template_kwargs\": "
    "{\"enable_thinking\": false}}";

static void check_spans(const size_t *sp, size_t n, size_t len) {
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(sp[2 * i] < sp[2 * i + 1] && sp[2 * i + 1] <= len);
        if (i) FUZZ_CHECK(sp[2 * i - 1] < sp[2 * i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536) return 0;
    char err[600] = "";
    pkv_chat *c = pkv_chat_init((const char *)data, size, "<s>", "</s>", true, false, err, sizeof err);
    if (!c) {
        FUZZ_CHECK(err[0] != 0);
        return 0;
    }
    json_t *body = json_loads(k_body, 0, NULL);
    FUZZ_CHECK(body != NULL);
    size_t len = 0, *sp = NULL, nsp = 0;
    int status = 0;
    pkv_jinja_limits al = {.max_time_ms = 500, .max_work = (int64_t)128 << 20};
    char *out = pkv_chat_apply_ex(c, body, 1700000000, &al, &len, &sp, &nsp, &status, err, sizeof err);
    if (out) check_spans(sp, nsp, len);
    else FUZZ_CHECK(err[0] != 0 && (status == 400 || status == 500));
    free(out);
    free(sp);
    sp = NULL;
    nsp = 0;
    json_decref(body);
    pkv_chat_free(c);

    pkv_jinja_error e;
    pkv_jinja *t = pkv_jinja_parse((const char *)data, size, &e);
    FUZZ_CHECK(t != NULL || e.msg[0] != 0);
    if (t) {
        json_t *ctx = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": true}", 0, NULL);
        pkv_jinja_limits lim = {.max_steps = 20000, .max_output = 1 << 16, .max_memory = 16 << 20, .max_depth = 32,
                                .max_work = (int64_t)64 << 20, .max_time_ms = 500};
        out = pkv_jinja_render(t, ctx, true, 1700000000, &lim, &len, &sp, &nsp, NULL, &e);
        if (out) check_spans(sp, nsp, len);
        else FUZZ_CHECK(e.msg[0] != 0);
        free(out);
        free(sp);
        json_decref(ctx);
        pkv_jinja_free(t);
    }
    return 0;
}
