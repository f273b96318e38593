// labels: server timeout=300
/* POST /v1/responses (issue 45.2), raw HTTP against pagekv serve:
 *  1. a response: its object, output items and usage; streamed, OpenAI's events in
 *     order with increasing sequence numbers, the deltas adding up to the text and
 *     the final response equal to the one not streamed (greedy);
 *  2. a function call (tool_choice required) and its function_call_output, through
 *     previous_response_id and sent whole: the same answer;
 *  3. text.format json_schema: the output is JSON of the schema;
 *  4. previous_response_id continues the stored conversation's context, its own
 *     tokens: cached_tokens covers the conversation so far (prompt and answer), the
 *     answer is a plain completion's of the same prompt ids (return_token_ids), and
 *     where the answer's tokens are its text's, the prompt and answer are those of
 *     the whole conversation sent at once (greedy); a template that rewrites
 *     earlier turns (Qwen3 drops reasoning) or renders a tool call otherwise than the
 *     model wrote it (Qwen3, Llama 3.1 tool loops) still continues the stored tokens as
 *     generated (counted), and with --responses-history template cuts the context
 *     where they differ; store false keeps nothing; GET and DELETE /v1/responses/{id};
 *  5. the bounds: --responses-max evicts the least recently used (its context freed:
 *     pagekv_responses_contexts), --responses-ttl expires, --responses-pages keeps
 *     room for live requests; a conversation swapped to host is continued from there;
 *     a client leaving mid-answer frees its context;
 *  6. bad input: a 400 naming the field (param). */
#include "server-testlib.h"

#include <ctype.h>

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"

static int g_port;

/* POST body to /v1/responses; the answer parsed into *out (NULL when not JSON). */
static int post(const char *body, json_t **out) {
    const char *f = ts_file("resp-body.json", body, strlen(body));
    int code = ts_http(g_port, "-H 'Content-Type: application/json' -d @%s /v1/responses", f);
    if (out) *out = json_loads(ts_body, 0, NULL);
    return code;
}

static const char *jstr(json_t *j, const char *path) {
    json_t *v = jget(j, path);
    return json_is_string(v) ? json_string_value(v) : "";
}

/* The text of a response's first message item. */
static const char *out_text(json_t *r) {
    json_t *out = json_object_get(r, "output");
    size_t i;
    json_t *it;
    json_array_foreach(out, i, it) if (!strcmp(jstr(it, "type"), "message")) return jstr(it, "content.0.text");
    return "";
}

static void check_param(const char *body, const char *param) {
    json_t *r = NULL;
    int code = post(body, &r);
    CHECK_INT(code, 400);
    if (strcmp(jstr(r, "error.param"), param)) {
        fprintf(stderr, "want param %s, got: %s\n", param, ts_body);
        CHECK(0);
    }
    json_decref(r);
}

static long long metric(const char *name) {
    if (ts_http(g_port, "/metrics") != 200) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(ts_body, key);
    return p ? atoll(p + strlen(key)) : -1;
}

static void basic_and_stream(void) {
    const char *req = "{\"model\":\"tiny\",\"input\":\"hello there\",\"instructions\":\"be brief\","
                      "\"max_output_tokens\":8,\"temperature\":0,\"metadata\":{\"k\":\"v\"},\"user\":\"u1\"}";
    json_t *a = NULL;
    CHECK_INT(post(req, &a), 200);
    REQUIRE_VOID(a);
    CHECK(!strncmp(jstr(a, "id"), "resp_", 5));
    CHECK(!strcmp(jstr(a, "object"), "response"));
    CHECK(json_is_integer(jget(a, "created_at")));
    const char *status = jstr(a, "status");
    CHECK(!strcmp(status, "completed") || !strcmp(status, "incomplete"));
    if (!strcmp(status, "incomplete")) CHECK(!strcmp(jstr(a, "incomplete_details.reason"), "max_output_tokens"));
    CHECK(!strcmp(jstr(a, "output.0.type"), "message"));
    CHECK(!strcmp(jstr(a, "output.0.role"), "assistant"));
    CHECK(!strcmp(jstr(a, "output.0.content.0.type"), "output_text"));
    CHECK(!strcmp(jstr(a, "instructions"), "be brief"));
    CHECK(!strcmp(jstr(a, "metadata.k"), "v"));
    CHECK(!strcmp(jstr(a, "user"), "u1"));
    CHECK(json_is_true(jget(a, "store")));
    long long in = jint(a, "usage.input_tokens"), outt = jint(a, "usage.output_tokens");
    CHECK(in > 0 && outt > 0 && outt <= 8);
    CHECK_INT(jint(a, "usage.total_tokens"), in + outt);
    CHECK(jint(a, "usage.input_tokens_details.cached_tokens") >= 0);
    CHECK_INT(jint(a, "usage.output_tokens_details.reasoning_tokens"), 0);
    CHECK(strlen(out_text(a)) > 0);

    /* streamed: the same request */
    char sreq[1024];
    snprintf(sreq, sizeof sreq, "%.*s,\"stream\":true}", (int)strlen(req) - 1, req);
    const char *f = ts_file("resp-stream.json", sreq, strlen(sreq));
    CHECK_INT(ts_http(g_port, "-N -H 'Content-Type: application/json' -d @%s /v1/responses", f), 200);
    static const char *const want_order[] = {"response.created", "response.in_progress", "response.output_item.added",
                                             "response.content_part.added", "response.output_text.delta"};
    char deltas[4096] = "", done_text[4096] = "";
    json_t *final = NULL;
    int n_ev = 0, n_delta = 0;
    bool seen_text_done = false, seen_part_done = false, seen_item_done = false;
    for (char *p = ts_body, *e; p && *p; p = e ? e + 2 : NULL) {
        e = strstr(p, "\n\n");
        if (e) *e = 0;
        char *evname = strstr(p, "event: "), *data = strstr(p, "data: ");
        if (!data) continue;
        json_t *j = json_loads(data + 6, 0, NULL);
        CHECK(j != NULL);
        if (!j) continue;
        const char *type = jstr(j, "type");
        if (evname) CHECK(!strncmp(evname + 7, type, strlen(type))); /* the event: line names it */
        CHECK_INT(jint(j, "sequence_number"), n_ev);
        if (n_ev < 5 && strcmp(type, want_order[n_ev])) {
            fprintf(stderr, "event %d is %s, want %s\n", n_ev, type, want_order[n_ev]);
            CHECK(0);
        }
        if (!strcmp(type, "response.output_text.delta")) {
            CHECK(!seen_text_done);
            strncat(deltas, jstr(j, "delta"), sizeof deltas - strlen(deltas) - 1);
            n_delta++;
        } else if (!strcmp(type, "response.output_text.done")) {
            seen_text_done = true;
            snprintf(done_text, sizeof done_text, "%s", jstr(j, "text"));
        } else if (!strcmp(type, "response.content_part.done")) {
            CHECK(seen_text_done);
            seen_part_done = true;
        } else if (!strcmp(type, "response.output_item.done")) {
            CHECK(seen_part_done);
            seen_item_done = true;
        } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete")) {
            CHECK(seen_item_done);
            final = json_incref(jget(j, "response"));
        }
        if (!strcmp(type, "response.created")) CHECK(!strcmp(jstr(j, "response.status"), "in_progress"));
        json_decref(j);
        n_ev++;
    }
    CHECK(n_delta >= 1);
    CHECK(!strcmp(deltas, done_text));
    REQUIRE_VOID(final);
    CHECK(!strcmp(deltas, out_text(final)));
    /* the final response equals the one not streamed, ids and times aside */
    CHECK(!strcmp(out_text(final), out_text(a)));
    CHECK(!strcmp(jstr(final, "status"), jstr(a, "status")));
    CHECK(json_equal(jget(final, "usage.output_tokens"), jget(a, "usage.output_tokens")));
    CHECK(json_equal(jget(final, "usage.input_tokens"), jget(a, "usage.input_tokens")));
    CHECK_INT((long long)json_array_size(jget(final, "output")), (long long)json_array_size(jget(a, "output")));
    /* and it was stored: GET gives it back */
    char path[160];
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(final, "id"));
    CHECK_INT(ts_http(g_port, "%s", path), 200);
    json_t *g = json_loads(ts_body, 0, NULL);
    CHECK(g && json_equal(g, final));
    json_decref(g);
    json_decref(final);
    json_decref(a);
}

static const char *k_tools =
    "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"the weather in a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8}},"
    "\"required\":[\"city\"],\"additionalProperties\":false},\"strict\":true}]";

static void check_follow_up(json_t *a, json_t *b, int max_tokens);

/* A forced call and its result through previous_response_id: the stored turn as the
 * model wrote it, then the tool's result (a plain completion of the prompt ids gives
 * the same answer); with --responses-history template (as_template), the same
 * conversation sent whole, the call as a function_call item, gives the same prompt
 * and answer. */
static void function_calls(bool as_template) {
    char body[4096];
    snprintf(body, sizeof body, "{\"input\":\"weather in Paris?\",\"tool_choice\":\"required\",%s,\"temperature\":0,"
                                "\"max_output_tokens\":200,\"return_token_ids\":true}", k_tools);
    json_t *a = NULL;
    CHECK_INT(post(body, &a), 200);
    REQUIRE_VOID(a);
    CHECK(!strcmp(jstr(a, "status"), "completed"));
    CHECK(!strcmp(jstr(a, "output.0.type"), "function_call"));
    CHECK(!strcmp(jstr(a, "output.0.name"), "get_weather"));
    CHECK(!strncmp(jstr(a, "output.0.call_id"), "call_", 5));
    CHECK(!strcmp(jstr(a, "tools.0.name"), "get_weather"));
    json_t *args = json_loads(jstr(a, "output.0.arguments"), 0, NULL);
    CHECK(json_is_string(json_object_get(args, "city")));
    json_decref(args);
    /* the tool's result, continuing the stored response */
    char call_id[128], name_args[200];
    snprintf(call_id, sizeof call_id, "%s", jstr(a, "output.0.call_id"));
    char *ea = json_dumps(jget(a, "output.0.arguments"), JSON_ENCODE_ANY);
    snprintf(name_args, sizeof name_args, "%s", ea ? ea : "\"\"");
    free(ea);
    snprintf(body, sizeof body, "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":\"sunny\"}],"
                                "\"previous_response_id\":\"%s\",%s,\"temperature\":0,\"max_output_tokens\":8,"
                                "\"return_token_ids\":true}",
             call_id, jstr(a, "id"), k_tools);
    json_t *b = NULL;
    CHECK_INT(post(body, &b), 200);
    CHECK(!strcmp(jstr(b, "previous_response_id"), jstr(a, "id")));
    CHECK(jint(b, "usage.input_tokens_details.cached_tokens") >= jint(a, "usage.input_tokens"));
    CHECK(jint(b, "usage.input_tokens") > jint(a, "usage.input_tokens"));
    if (!as_template) {
        check_follow_up(a, b, 8);
        json_decref(a);
        json_decref(b);
        return;
    }
    /* the same conversation sent whole, the call as a function_call item */
    snprintf(body, sizeof body,
             "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"weather in Paris?\"}]},"
             "{\"type\":\"function_call\",\"call_id\":\"%s\",\"name\":\"get_weather\",\"arguments\":%s},"
             "{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":\"sunny\"}],%s,\"temperature\":0,"
             "\"max_output_tokens\":8,\"store\":false}",
             call_id, name_args, call_id, k_tools);
    json_t *c = NULL;
    CHECK_INT(post(body, &c), 200);
    CHECK(json_equal(jget(b, "usage.input_tokens"), jget(c, "usage.input_tokens")));
    CHECK(strlen(out_text(b)) > 0);
    if (strcmp(out_text(b), out_text(c))) {
        fprintf(stderr, "continued: '%s'\nwhole:     '%s'\n", out_text(b), out_text(c));
        CHECK(0);
    }
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

static void json_schema(void) {
    json_t *a = NULL;
    CHECK_INT(post("{\"input\":\"a number\",\"temperature\":0,\"max_output_tokens\":60,\"text\":{\"format\":"
                   "{\"type\":\"json_schema\",\"name\":\"n\",\"strict\":true,\"schema\":{\"type\":\"object\","
                   "\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":5}},"
                   "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}}}}",
                   &a),
              200);
    CHECK(!strcmp(jstr(a, "status"), "completed"));
    CHECK(!strcmp(jstr(a, "text.format.type"), "json_schema"));
    json_t *v = json_loads(out_text(a), 0, NULL);
    CHECK(json_is_integer(json_object_get(v, "a")));
    CHECK(json_is_string(json_object_get(v, "b")) && json_string_length(json_object_get(v, "b")) <= 5);
    CHECK_INT((long long)json_object_size(v), 2);
    json_decref(v);
    json_decref(a);
    json_t *o = NULL;
    CHECK_INT(post("{\"input\":\"an object\",\"temperature\":0,\"max_output_tokens\":40,\"text\":{\"format\":"
                   "{\"type\":\"json_object\"}}}", &o), 200);
    v = json_loads(out_text(o), 0, NULL);
    CHECK(json_is_object(v));
    json_decref(v);
    json_decref(o);
}

/* The whole prompt's token ids of a response asked with return_token_ids, as a JSON text. */
static char *prompt_ids(json_t *r) {
    json_t *ids = json_object_get(r, "prompt_token_ids");
    CHECK(json_is_array(ids) && (long long)json_array_size(ids) == jint(r, "usage.input_tokens"));
    return json_dumps(ids ? ids : json_null(), JSON_ENCODE_ANY);
}

/* A follow-up b of a computes the context's own tokens: cached_tokens covers the
 * conversation so far (a's prompt and every token of its answer), b's prompt starts
 * with a's, and b's answer is that of a plain greedy completion of b's prompt ids. */
static void check_follow_up(json_t *a, json_t *b, int max_tokens) {
    long long so_far = jint(a, "usage.input_tokens") + jint(a, "usage.output_tokens");
    long long cached = jint(b, "usage.input_tokens_details.cached_tokens");
    fprintf(stderr, "previous prompt %lld + output %lld tokens; the follow-up's %lld tokens, %lld cached\n",
            jint(a, "usage.input_tokens"), jint(a, "usage.output_tokens"), jint(b, "usage.input_tokens"), cached);
    CHECK(cached >= so_far);
    CHECK(jint(b, "usage.input_tokens") > so_far);
    json_t *pa = json_object_get(a, "prompt_token_ids"), *pb = json_object_get(b, "prompt_token_ids");
    for (size_t i = 0; i < json_array_size(pa); i++) CHECK(json_equal(json_array_get(pa, i), json_array_get(pb, i)));
    char *ids = prompt_ids(b), body[16384];
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0}", ids, max_tokens);
    free(ids);
    const char *f = ts_file("resp-compl.json", body, strlen(body));
    CHECK_INT(ts_http(g_port, "-H 'Content-Type: application/json' -d @%s /v1/completions", f), 200);
    json_t *c = json_loads(ts_body, 0, NULL);
    CHECK(!strcmp(jstr(c, "choices.0.text"), out_text(b)));
    CHECK_INT(jint(c, "usage.prompt_tokens"), jint(b, "usage.input_tokens"));
    CHECK_INT(jint(c, "usage.completion_tokens"), jint(b, "usage.output_tokens"));
    json_decref(c);
}

/* The whole conversation (user q, the assistant's text t, user q2) in one request,
 * not stored: its answer in *out. */
static void whole(const char *q, const char *t, const char *q2, int max_tokens, json_t **out) {
    json_t *esc = json_string(t);
    char *at = json_dumps(esc, JSON_ENCODE_ANY), body[4096];
    json_decref(esc);
    snprintf(body, sizeof body,
             "{\"input\":[{\"role\":\"user\",\"content\":\"%s\"},{\"type\":\"message\",\"role\":"
             "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":%s}]},{\"role\":\"user\",\"content\":"
             "\"%s\"}],\"max_output_tokens\":%d,\"temperature\":0,\"store\":false,\"return_token_ids\":true}",
             q, at, q2, max_tokens);
    free(at);
    CHECK_INT(post(body, out), 200);
}

static void continuation(void) {
    json_t *a = NULL, *b = NULL, *c = NULL;
    long long spliced0 = metric("pagekv_responses_followups_spliced_total");
    CHECK_INT(post("{\"input\":\"tell me about the sea\",\"max_output_tokens\":10,\"temperature\":0,"
                   "\"return_token_ids\":true}", &a), 200);
    char body[4096];
    snprintf(body, sizeof body, "{\"input\":\"and the river\",\"previous_response_id\":\"%s\",\"max_output_tokens\":10,"
                                "\"temperature\":0,\"return_token_ids\":true}", jstr(a, "id"));
    CHECK_INT(post(body, &b), 200);
    /* this answer's sampled tokens (a stray <|im_start|> among them) are not its
     * text's: the follow-up still computes only the new turn */
    check_follow_up(a, b, 10);
    CHECK_INT(metric("pagekv_responses_followups_spliced_total"), spliced0 + 1);
    /* an answer ended by the model's own end of turn (<|endoftext|> here; chatml
     * writes <|im_end|>): it stands in for the template's */
    json_t *g1 = NULL, *g2 = NULL;
    CHECK_INT(post("{\"input\":\"hi\",\"max_output_tokens\":10,\"temperature\":0,\"return_token_ids\":true,"
                   "\"grammar\":\"root ::= \\\"hello there\\\"\"}", &g1), 200);
    CHECK(!strcmp(jstr(g1, "status"), "completed"));
    snprintf(body, sizeof body, "{\"input\":\"and the river\",\"previous_response_id\":\"%s\",\"max_output_tokens\":6,"
                                "\"temperature\":0,\"return_token_ids\":true}", jstr(g1, "id"));
    CHECK_INT(post(body, &g2), 200);
    check_follow_up(g1, g2, 6);
    json_decref(g1);
    json_decref(g2);
    /* an answer whose sampled tokens are its text's: the follow-up's prompt is that of
     * sending the whole conversation at once, token for token, and so is the answer */
    json_t *k1 = NULL, *k2 = NULL, *k3 = NULL;
    CHECK_INT(post("{\"input\":\"a b c\",\"max_output_tokens\":3,\"temperature\":0,\"return_token_ids\":true}", &k1),
              200);
    snprintf(body, sizeof body, "{\"input\":\"and the river\",\"previous_response_id\":\"%s\",\"max_output_tokens\":10,"
                                "\"temperature\":0,\"return_token_ids\":true}", jstr(k1, "id"));
    CHECK_INT(post(body, &k2), 200);
    check_follow_up(k1, k2, 10);
    whole("a b c", out_text(k1), "and the river", 10, &k3);
    char *ids2 = prompt_ids(k2), *ids3 = prompt_ids(k3);
    CHECK(ids2 && ids3 && !strcmp(ids2, ids3));
    free(ids2);
    free(ids3);
    CHECK(!strcmp(out_text(k2), out_text(k3)));
    json_decref(k1);
    json_decref(k2);
    json_decref(k3);
    /* the whole conversation at once (not continued, not stored) */
    whole("tell me about the sea", out_text(a), "and the river", 10, &c);
    CHECK(jint(c, "usage.input_tokens") > 0);
    CHECK(json_is_false(jget(c, "store")));
    /* store false kept nothing */
    char path[160];
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(c, "id"));
    CHECK_INT(ts_http(g_port, "%s", path), 404);
    snprintf(body, sizeof body, "{\"input\":\"more\",\"previous_response_id\":\"%s\"}", jstr(c, "id"));
    json_t *e = NULL;
    CHECK_INT(post(body, &e), 400);
    CHECK(!strcmp(jstr(e, "error.param"), "previous_response_id"));
    CHECK(!strcmp(jstr(e, "error.code"), "previous_response_not_found"));
    CHECK(!strcmp(jstr(e, "error.type"), "invalid_request_error"));
    char want[200];
    snprintf(want, sizeof want, "Previous response with id '%s' not found.", jstr(c, "id"));
    CHECK(!strcmp(jstr(e, "error.message"), want));
    json_decref(e);
    /* a continued response continues too (three turns) */
    snprintf(body, sizeof body, "{\"input\":\"and the lake\",\"previous_response_id\":\"%s\",\"max_output_tokens\":4,"
                                "\"temperature\":0}", jstr(b, "id"));
    json_t *d = NULL;
    CHECK_INT(post(body, &d), 200);
    CHECK(jint(d, "usage.input_tokens_details.cached_tokens") >= jint(b, "usage.input_tokens") + jint(b, "usage.output_tokens"));
    json_decref(d);
    /* instructions are this turn's only (OpenAI's rule): the same instructions again
     * keep the whole conversation cached; none renders without the system turn */
    json_t *i1 = NULL, *i2 = NULL, *i3 = NULL;
    CHECK_INT(post("{\"input\":\"tell me about the sea\",\"instructions\":\"be brief\",\"max_output_tokens\":6,"
                   "\"temperature\":0}", &i1), 200);
    snprintf(body, sizeof body, "{\"input\":\"more\",\"instructions\":\"be brief\",\"previous_response_id\":\"%s\","
                                "\"max_output_tokens\":4,\"temperature\":0}", jstr(i1, "id"));
    CHECK_INT(post(body, &i2), 200);
    CHECK(jint(i2, "usage.input_tokens_details.cached_tokens") >= jint(i1, "usage.input_tokens") + jint(i1, "usage.output_tokens"));
    CHECK(!strcmp(jstr(i2, "instructions"), "be brief"));
    snprintf(body, sizeof body, "{\"input\":\"more\",\"previous_response_id\":\"%s\",\"max_output_tokens\":4,"
                                "\"temperature\":0,\"store\":false}", jstr(i1, "id"));
    CHECK_INT(post(body, &i3), 200);
    CHECK(jget(i3, "instructions") && json_is_null(jget(i3, "instructions")));
    CHECK(jint(i3, "usage.input_tokens") < jint(i2, "usage.input_tokens")); /* no system turn */
    json_decref(i1);
    json_decref(i2);
    json_decref(i3);
    /* DELETE, then it is gone */
    snprintf(path, sizeof path, "-X DELETE /v1/responses/%s", jstr(a, "id"));
    CHECK_INT(ts_http(g_port, "%s", path), 200);
    CHECK(strstr(ts_body, "\"deleted\":true") != NULL);
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(a, "id"));
    CHECK_INT(ts_http(g_port, "%s", path), 404);
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", jstr(a, "id"));
    CHECK_INT(post(body, NULL), 400);
    /* the responses' contexts are not the contexts API's */
    CHECK_INT(ts_http(g_port, "/v1/contexts"), 200);
    CHECK(strstr(ts_body, "\"data\":[]") != NULL);
    CHECK_INT(metric("pagekv_contexts"), 0);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

static void bad_input(void) {
    check_param("{\"input\":[{\"type\":\"web_search_call\",\"id\":\"x\"}]}", "input[0].type");
    check_param("{\"input\":[{\"role\":\"robot\",\"content\":\"hi\"}]}", "input[0].role");
    check_param("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}",
                "input[0].content[0].type");
    check_param("{\"input\":[{\"role\":\"user\",\"content\":\"hi\"},{\"type\":\"function_call_output\",\"output\":\"x\"}]}",
                "input[1].call_id");
    check_param("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}", "input[0].arguments");
    check_param("{\"input\":42}", "input");
    check_param("{\"model\":\"tiny\"}", "input");
    check_param("{\"input\":\"hi\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type");
    check_param("{\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"parameters\":{}}]}", "tools[0].name");
    check_param("{\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":3}]}",
                "tools[0].parameters");
    check_param("{\"input\":\"hi\",\"tool_choice\":{\"type\":\"allowed_tools\"}}", "tool_choice");
    check_param("{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\"}}}", "text.format.schema");
    check_param("{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type");
    check_param("{\"input\":\"hi\",\"max_output_tokens\":0}", "max_output_tokens");
    /* the chat layer's schema errors, in the Responses names (a format pagekv does not
     * constrain: patterns, even unanchored, are constrained since the schema merge) */
    check_param("{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":"
                "{\"type\":\"string\",\"format\":\"color\"}}}}", "text.format.schema");
    CHECK(strstr(ts_body, "response_format") == NULL);
    check_param("{\"input\":\"hi\",\"tool_choice\":\"required\",\"tools\":[{\"type\":\"function\",\"name\":\"f\","
                "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"color\"}}}}]}",
                "tools[0].parameters");
    check_param("{\"input\":\"hi\",\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"},\"tools\":"
                "[{\"type\":\"function\",\"name\":\"f\"}]}", "tool_choice");
    check_param("{\"input\":\"hi\",\"temperature\":3}", "temperature");
    check_param("{\"input\":\"hi\",\"frobnicate\":1}", "frobnicate");
    check_param("{\"input\":\"hi\",\"background\":true}", "background");
    check_param("{\"input\":\"hi\",\"previous_response_id\":7}", "previous_response_id");
    check_param("{\"input\":\"hi\",\"metadata\":{\"k\":1}}", "metadata");
    check_param("{\"input\":\"hi\",\"return_token_ids\":1}", "return_token_ids");
    check_param("{\"input\":\"hi\",\"return_token_ids\":true,\"stream\":true}", "return_token_ids");
    CHECK_INT(ts_http(g_port, "-X PUT /v1/responses"), 405);
    CHECK_INT(ts_http(g_port, "/v1/responses/resp_nope"), 404);
    /* nothing of these reached the store or the cache */
    CHECK_INT(ts_http(g_port, "/health"), 200);
}

/* Qwen3's own template splits <think> reasoning: a reasoning item before the
 * message, whole and streamed (a grammar makes the random model write one). */
static void reasoning(const char *model, const char *log) {
    const char *src = getenv("PKV_SOURCE_DIR");
    if (!src) return;
    char args[1024];
    snprintf(args, sizeof args, "-m '%s' -c 512 --alias tiny --chat-template '%s/tests/templates/Qwen-Qwen3-0.6B.jinja'",
             model, src);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    const char *req = "{\"input\":\"hi\",\"reasoning\":{\"effort\":\"low\"},\"max_output_tokens\":60,"
                      "\"grammar\":\"root ::= \\\"<think>\\\\nplan\\\\n</think>\\\\n\\\\nhello\\\"\"";
    char body[1024];
    snprintf(body, sizeof body, "%s}", req);
    json_t *a = NULL;
    CHECK_INT(post(body, &a), 200);
    CHECK(!strcmp(jstr(a, "output.0.type"), "reasoning"));
    CHECK(!strcmp(jstr(a, "output.0.content.0.type"), "reasoning_text"));
    CHECK(!strcmp(jstr(a, "output.0.content.0.text"), "plan\n"));
    CHECK(!strcmp(jstr(a, "output.1.type"), "message"));
    CHECK(!strcmp(out_text(a), "hello"));
    CHECK(!strcmp(jstr(a, "reasoning.effort"), "low"));
    long long rt = jint(a, "usage.output_tokens_details.reasoning_tokens");
    CHECK(rt > 0 && rt < jint(a, "usage.output_tokens"));
    snprintf(body, sizeof body, "%s,\"stream\":true}", req);
    const char *f = ts_file("resp-stream.json", body, strlen(body));
    CHECK_INT(ts_http(g_port, "-N -H 'Content-Type: application/json' -d @%s /v1/responses", f), 200);
    CHECK(strstr(ts_body, "\"type\":\"response.reasoning_text.delta\"") != NULL);
    CHECK(strstr(ts_body, "\"type\":\"response.output_text.delta\"") != NULL);
    CHECK(strstr(ts_body, "\"type\":\"response.reasoning_text.done\",\"sequence_number\"") != NULL);
    json_decref(a);
    /* a follow-up continues past the turn with reasoning: the template drops it from
     * history, yet the model sees its turn as it wrote it (--responses-history
     * generated, the default): the stored context's tokens, reasoning included, then
     * only the new turn is computed */
    snprintf(body, sizeof body, "%s,\"return_token_ids\":true}", req);
    CHECK_INT(post(body, &a), 200);
    CHECK(!strcmp(jstr(a, "output.0.type"), "reasoning"));
    long long spliced0 = metric("pagekv_responses_followups_spliced_total");
    long long recut0 = metric("pagekv_responses_followups_recut_total");
    long long asgen0 = metric("pagekv_responses_followups_as_generated_total");
    snprintf(body, sizeof body, "{\"input\":\"and then?\",\"previous_response_id\":\"%s\",\"max_output_tokens\":4,"
                                "\"temperature\":0,\"return_token_ids\":true}", jstr(a, "id"));
    json_t *b = NULL;
    CHECK_INT(post(body, &b), 200);
    check_follow_up(a, b, 4);
    CHECK_INT(metric("pagekv_responses_followups_recut_total"), recut0);
    CHECK_INT(metric("pagekv_responses_followups_spliced_total"), spliced0 + 1);
    CHECK_INT(metric("pagekv_responses_followups_as_generated_total"), asgen0 + 1);
    json_decref(a);
    json_decref(b);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    /* --responses-history template: the conversation as the template renders it, so
     * the context is cut where the tokens differ (counted), keeping the earlier prompt */
    snprintf(args, sizeof args, "-m '%s' -c 512 --alias tiny --chat-template '%s/tests/templates/Qwen-Qwen3-0.6B.jinja' "
                                "--responses-history template", model, src);
    pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    snprintf(body, sizeof body, "%s}", req);
    CHECK_INT(post(body, &a), 200);
    snprintf(body, sizeof body, "{\"input\":\"and then?\",\"previous_response_id\":\"%s\",\"max_output_tokens\":4}",
             jstr(a, "id"));
    CHECK_INT(post(body, &b), 200);
    CHECK(jint(b, "usage.input_tokens_details.cached_tokens") >= jint(a, "usage.input_tokens"));
    CHECK(jint(b, "usage.input_tokens_details.cached_tokens") < jint(a, "usage.input_tokens") + jint(a, "usage.output_tokens"));
    CHECK_INT(metric("pagekv_responses_followups_recut_total"), 1);
    CHECK_INT(metric("pagekv_responses_followups_spliced_total"), 0);
    json_decref(a);
    json_decref(b);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}

/* A tool loop on a real template (tests/templates/TPL.jinja) over model: a forced
 * function_call, then its function_call_output through previous_response_id, then a
 * user turn. The templates render the call otherwise than the model wrote it
 * (reformatted JSON, Qwen3's <tool_call> block, Llama 3.1's "parameters", gpt-oss's
 * commentary channel, Mistral's [TOOL_CALLS] with an id), so the prompt as rendered
 * does not continue the stored tokens: each follow-up still computes only its new
 * input (cached_tokens covers the whole conversation so far), its answer is a plain
 * completion's of its prompt ids, and nothing is recut (moves_tools: Mistral's user
 * turn is, the tool list moving to it). reasoning_gbnf (may be NULL): a grammar
 * writing an answer with reasoning the template drops from history; its follow-up
 * is continued as generated too. */
static void tool_loop(const char *model, const char *tpl, bool moves_tools, const char *reasoning_gbnf, const char *log) {
    const char *src = getenv("PKV_SOURCE_DIR");
    if (!src) return;
    char args[1024], body[4096];
    snprintf(args, sizeof args, "-m '%s' -c 2048 --alias tiny --chat-template '%s/tests/templates/%s.jinja'", model, src, tpl);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    fprintf(stderr, "tool loop, %s\n", tpl);
    snprintf(body, sizeof body, "{\"input\":\"weather in Paris?\",\"tool_choice\":\"required\",%s,\"temperature\":0,"
                                "\"max_output_tokens\":200,\"return_token_ids\":true}", k_tools);
    json_t *a = NULL, *b = NULL, *c = NULL;
    CHECK_INT(post(body, &a), 200);
    REQUIRE_VOID(a);
    CHECK(!strcmp(jstr(a, "output.0.type"), "function_call"));
    CHECK(!strcmp(jstr(a, "status"), "completed"));
    if (moves_tools) { /* Mistral's call ids */
        const char *id = jstr(a, "output.0.call_id");
        CHECK_INT((long long)strlen(id), 9);
        for (const char *p = id; *p; p++) CHECK(isalnum((unsigned char)*p));
    }
    long long spliced0 = metric("pagekv_responses_followups_spliced_total");
    long long recut0 = metric("pagekv_responses_followups_recut_total");
    long long asgen0 = metric("pagekv_responses_followups_as_generated_total");
    snprintf(body, sizeof body, "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":\"sunny\"}],"
                                "\"previous_response_id\":\"%s\",%s,\"temperature\":0,\"max_output_tokens\":8,"
                                "\"return_token_ids\":true}", jstr(a, "output.0.call_id"), jstr(a, "id"), k_tools);
    CHECK_INT(post(body, &b), 200);
    if (jint(b, "usage.input_tokens") <= 0) fprintf(stderr, "%s\n", ts_body);
    check_follow_up(a, b, 8);
    CHECK_INT(metric("pagekv_responses_followups_recut_total"), recut0);
    CHECK_INT(metric("pagekv_responses_followups_spliced_total"), spliced0 + 1);
    CHECK_INT(metric("pagekv_responses_followups_as_generated_total"), asgen0 + 1);
    /* and a user turn after the tool's answer */
    snprintf(body, sizeof body, "{\"input\":\"and tomorrow?\",\"previous_response_id\":\"%s\",%s,\"temperature\":0,"
                                "\"max_output_tokens\":8,\"return_token_ids\":true}", jstr(b, "id"), k_tools);
    CHECK_INT(post(body, &c), 200);
    if (moves_tools) { /* Mistral's: the tools move to the last user turn; the earlier turns are recut */
        CHECK_INT(metric("pagekv_responses_followups_recut_total"), recut0 + 1);
    } else {
        check_follow_up(b, c, 8);
        CHECK_INT(metric("pagekv_responses_followups_recut_total"), recut0);
        CHECK_INT(metric("pagekv_responses_followups_spliced_total"), spliced0 + 2);
    }
    json_decref(a);
    json_decref(b);
    json_decref(c);
    if (reasoning_gbnf) { /* an answer with reasoning (a grammar writes it), which the template drops from history */
        snprintf(body, sizeof body, "{\"input\":\"hi\",\"max_output_tokens\":200,\"return_token_ids\":true,\"grammar\":"
                                    "\"%s\"}", reasoning_gbnf);
        CHECK_INT(post(body, &a), 200);
        CHECK(!strcmp(jstr(a, "output.0.type"), "reasoning"));
        CHECK(!strcmp(out_text(a), "hello"));
        recut0 = metric("pagekv_responses_followups_recut_total");
        asgen0 = metric("pagekv_responses_followups_as_generated_total");
        snprintf(body, sizeof body, "{\"input\":\"and then?\",\"previous_response_id\":\"%s\",\"max_output_tokens\":4,"
                                    "\"temperature\":0,\"return_token_ids\":true}", jstr(a, "id"));
        CHECK_INT(post(body, &b), 200);
        check_follow_up(a, b, 4);
        CHECK_INT(metric("pagekv_responses_followups_recut_total"), recut0);
        CHECK_INT(metric("pagekv_responses_followups_as_generated_total"), asgen0 + 1);
        json_decref(a);
        json_decref(b);
    }
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}

/* --responses-max 2: the least recently used goes, and its context with it. */
static void cap(const char *model, const char *log) {
    char args[1024];
    snprintf(args, sizeof args, "-m '%s' -c 4096 --alias tiny --responses-max 2", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    char ids[3][80];
    json_t *r = NULL;
    for (int i = 0; i < 3; i++) {
        if (i == 2) { /* touch the first: the second is now the least recently used */
            char path[120];
            snprintf(path, sizeof path, "/v1/responses/%s", ids[0]);
            CHECK_INT(ts_http(g_port, "%s", path), 200);
        }
        char body[256];
        snprintf(body, sizeof body, "{\"input\":\"turn %d\",\"max_output_tokens\":4,\"temperature\":0}", i);
        CHECK_INT(post(body, &r), 200);
        snprintf(ids[i], sizeof ids[i], "%s", jstr(r, "id"));
        json_decref(r);
    }
    static const int want[3] = {200, 400, 200};
    for (int i = 0; i < 3; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"input\":\"again\",\"previous_response_id\":\"%s\",\"max_output_tokens\":2,"
                                    "\"store\":false}", ids[i]);
        CHECK_INT(post(body, NULL), want[i]);
    }
    /* two stored, each holding one context; the evicted one's is freed */
    CHECK_INT(metric("pagekv_responses_contexts"), 2);
    /* a client that leaves mid-answer, streamed or not: its context is freed too (the
     * non-streamed one once it has run to its end) */
    const char *lb = "{\"input\":\"a long story\",\"max_output_tokens\":1500,\"temperature\":0}";
    const char *lf = ts_file("resp-leave.json", lb, strlen(lb));
    const char *sb = "{\"input\":\"a long story\",\"max_output_tokens\":1500,\"temperature\":0,\"stream\":true}";
    const char *sf = ts_file("resp-leave-stream.json", sb, strlen(sb));
    ts_http(g_port, "--max-time 0.3 -H 'Content-Type: application/json' -d @%s /v1/responses", lf);
    { /* the streamed client leaves once the answer has begun (a fixed --max-time could
       * end it before a busy machine's server saw the request at all) */
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "curl -s -N --max-time 60 -H 'Content-Type: application/json' -d @'%s' "
                 "http://127.0.0.1:%d/v1/responses | head -c 1 >/dev/null", sf, g_port);
        CHECK_INT(system(cmd), 0);
    }
    long long n = -1;
    for (int i = 0; i < 600 && (n = metric("pagekv_responses_contexts")) != 2; i++) ts_sleep_ms(100);
    CHECK_INT(n, 2);
    /* the stream's end is noticed at its next write; a non-streamed answer's client that
     * closed cleanly is only noticed when the answer is written (docs/server.md) */
    long long gone = -1;
    for (int i = 0; i < 600 && (gone = metric("pagekv_client_disconnects_total")) < 1; i++) ts_sleep_ms(100);
    CHECK(gone >= 1);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}

/* Stored responses yield to live requests: on a pool of 40 device and 40 host pages,
 * 40 stored conversations of 3-4 pages each would fill both (every request then
 * failed with 503: found by hand); past --responses-pages (default a quarter of
 * the pool: 10) the least recently used go. */
static void pages(const char *model, const char *log) {
    char args[1024];
    snprintf(args, sizeof args, "-m '%s' -c 512 --kv-pages 40 --chat-template chatml --alias tiny", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    char first[80] = "", last[80] = "";
    int ok = 0;
    for (int i = 0; i < 40; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"input\":\"tell me a story number %d about the sea and the ships\","
                                    "\"max_output_tokens\":20}", i);
        json_t *r = NULL;
        int code = post(body, &r);
        ok += code == 200;
        if (code != 200 && ok == i) fprintf(stderr, "response %d: %d %s\n", i, code, ts_body);
        snprintf(i ? last : first, 80, "%s", jstr(r, "id"));
        json_decref(r);
    }
    CHECK_INT(ok, 40);
    long long n = metric("pagekv_responses_contexts");
    CHECK(n >= 1 && n <= 5);
    char path[160];
    snprintf(path, sizeof path, "/v1/responses/%s", first);
    CHECK_INT(ts_http(g_port, "%s", path), 404); /* dropped for room */
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"go on\",\"previous_response_id\":\"%s\",\"max_output_tokens\":4}", last);
    json_t *r = NULL;
    CHECK_INT(post(body, &r), 200);
    CHECK(jint(r, "usage.input_tokens_details.cached_tokens") > 0);
    json_decref(r);
    const char *cb = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":200}";
    const char *cf = ts_file("resp-chat.json", cb, strlen(cb));
    CHECK_INT(ts_http(g_port, "-H 'Content-Type: application/json' -d @%s /v1/chat/completions", cf), 200);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}

/* A stored conversation swapped to host while idle (--context-swap 1) is
 * continued from there: swapped back in, its tokens still cached. */
static void swapped(const char *model, const char *log) {
    char args[1024];
    snprintf(args, sizeof args, "-m '%s' -c 512 --chat-template chatml --alias tiny --context-swap 1", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    json_t *a = NULL, *b = NULL;
    CHECK_INT(post("{\"input\":\"hello there my friend, a story\",\"max_output_tokens\":8,\"temperature\":0}", &a), 200);
    long long sw = 0;
    for (int i = 0; i < 100 && (sw = metric("pagekv_requests_swapped")) < 1; i++) ts_sleep_ms(100);
    CHECK_INT(sw, 1);
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"and more\",\"previous_response_id\":\"%s\",\"max_output_tokens\":8,"
                                "\"temperature\":0}", jstr(a, "id"));
    CHECK_INT(post(body, &b), 200);
    CHECK(jint(b, "usage.input_tokens_details.cached_tokens") >= jint(a, "usage.input_tokens") + jint(a, "usage.output_tokens"));
    json_decref(a);
    json_decref(b);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}

/* --responses-ttl 1: a response unused for longer is gone. */
static void ttl(const char *model, const char *log) {
    char args[1024];
    snprintf(args, sizeof args, "-m '%s' -c 512 --alias tiny --responses-ttl 1", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    json_t *r = NULL;
    CHECK_INT(post("{\"input\":\"soon gone\",\"max_output_tokens\":4}", &r), 200);
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"again\",\"previous_response_id\":\"%s\",\"max_output_tokens\":2}", jstr(r, "id"));
    ts_sleep_ms(2500);
    json_t *e = NULL;
    CHECK_INT(post(body, &e), 400);
    CHECK(!strcmp(jstr(e, "error.code"), "previous_response_not_found"));
    CHECK_INT(metric("pagekv_responses_contexts"), 0);
    json_decref(e);
    json_decref(r);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}

int main(void) {
    char model[512], log[512], args[1024];
    snprintf(model, sizeof model, "%s", th_tmp("resp.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("resp-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel --vocab 2048 --seed 5 -o '%s'", model) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 512 --chat-template chatml --alias tiny --seed 3", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    basic_and_stream();
    function_calls(false);
    json_schema();
    continuation();
    bad_input();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    snprintf(args, sizeof args, "-m '%s' -c 512 --chat-template chatml --alias tiny --seed 3 --responses-history template",
             model);
    pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    function_calls(true);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    reasoning(model, th_tmp("resp-serve-qwen3.log"));
    tool_loop(model, "Qwen-Qwen3-0.6B", false, NULL, th_tmp("resp-serve-loop-qwen3.log"));
    /* gpt-oss's markup over chatml's vocabulary (its message ends are text here); the
     * template drops the analysis channel of earlier turns */
    tool_loop(model, "openai-gpt-oss-120b", false,
              "root ::= \\\"<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>final<|message|>"
              "hello\\\"", th_tmp("resp-serve-loop-gptoss.log"));
    /* the families' vocabularies: their end-of-turn texts are tokens */
    char model_fam[512];
    snprintf(model_fam, sizeof model_fam, "%s", th_tmp("resp-llama3.gguf"));
    REQUIRE(th_cli("", true, "mkmodel --vocab 2048 --seed 5 --chat-template llama3 -o '%s'", model_fam) == 0);
    tool_loop(model_fam, "meta-llama-Llama-3.1-8B-Instruct", false, NULL, th_tmp("resp-serve-loop-llama3.log"));
    /* Mistral Nemo's template takes call ids of 9 letters and digits only, and writes
     * eos_token (</s>, the EOS token) after a call */
    snprintf(model_fam, sizeof model_fam, "%s", th_tmp("resp-mistral.gguf"));
    REQUIRE(th_cli("", true, "mkmodel --vocab 2048 --seed 5 --chat-template mistral -o '%s'", model_fam) == 0);
    tool_loop(model_fam, "mistralai-Mistral-Nemo-Instruct-2407", true, NULL, th_tmp("resp-serve-loop-mistral.log"));
    cap(model, th_tmp("resp-serve-cap.log"));
    ttl(model, th_tmp("resp-serve-ttl.log"));
    pages(model, th_tmp("resp-serve-pages.log"));
    swapped(model, th_tmp("resp-serve-swap.log"));
    return th_done();
}
#endif
