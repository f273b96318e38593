/* Tool calls, reasoning and constrained output for the OpenAI endpoints
 * (server-tools.h, docs/server.md "Tool calls and structured output").
 *
 * tool_choice "required" or a named function is constrained sampling: the output
 * is one JSON object {"name": ..., "arguments": ...} whose arguments follow the
 * tool's parameters schema. It is bare JSON, not the model family's wrapper,
 * because several families wrap calls in control tokens ([TOOL_CALLS],
 * <|python_tag|>, gpt-oss headers) that a grammar cannot produce (the grammar
 * vocabulary has no control tokens); the answer maps it to tool_calls the same way
 * for every family. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server-tools.h"

#define MAX_TOOLS 128

static const char *str(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool empty(json_t *v) {
    return !v || json_is_null(v) || (json_is_array(v) && !json_array_size(v));
}

/* Move a tool schema's $defs/definitions into the wrapper's root ones (refs
 * "#/$defs/X" then resolve there). false when two tools define X differently. */
static bool lift_defs(json_t *params, json_t *root, int ti, srv_out *o) {
    static const char *const keys[] = {"$defs", "definitions"};
    for (int k = 0; k < 2; k++) {
        json_t *d = json_object_get(params, keys[k]);
        if (!d) continue;
        if (!json_is_object(d)) {
            srv_error(o, 400, "'tools[%d].function.parameters.%s' must be an object", ti, keys[k]);
            return false;
        }
        json_t *rd = json_object_get(root, keys[k]);
        if (!rd) json_object_set_new(root, keys[k], rd = json_object());
        const char *name;
        json_t *v;
        json_object_foreach(d, name, v) {
            json_t *have = json_object_get(rd, name);
            if (have && !json_equal(have, v)) {
                srv_error(o, 400, "'tools[%d].function.parameters.%s.%s' differs from another tool's definition of the same name",
                          ti, keys[k], name);
                return false;
            }
            json_object_set(rd, name, v);
        }
        json_object_del(params, keys[k]);
    }
    return true;
}

static pkv_grammar *schema_grammar(json_t *schema, const char *field, srv_out *o) {
    char *t = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) {
        srv_error(o, 500, "out of memory");
        return NULL;
    }
    pkv_grammar *g = pkv_grammar_from_json_schema(t, strlen(t));
    free(t);
    if (!g) srv_error(o, 400, "'%s': %s", field, pkv_errmsg());
    return g;
}

/* The grammar of a forced call: one of the tools (only = -1) or tool `only`. */
static pkv_grammar *tool_grammar(json_t *tools, int only, srv_out *o) {
    json_t *root = json_object(), *any = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (only >= 0 && (int)i != only) continue;
        json_t *fn = json_object_get(t, "function");
        json_t *params = json_object_get(fn, "parameters");
        char field[64];
        snprintf(field, sizeof field, "tools[%zu].function.parameters", i);
        params = params && !json_is_null(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
        if (json_is_object(params) && !json_object_size(params)) json_object_set_new(params, "type", json_string("object"));
        pkv_grammar *alone = schema_grammar(params, field, o); /* errors name the tool's own path */
        if (!alone || (json_is_object(params) && !lift_defs(params, root, (int)i, o))) {
            pkv_grammar_free(alone);
            json_decref(params);
            json_decref(root);
            json_decref(any);
            return NULL;
        }
        pkv_grammar_free(alone);
        json_array_append_new(any, json_pack("{s:s,s:{s:{s:s},s:o},s:[s,s]}", "type", "object", "properties", "name", "const",
                                             str(fn, "name"), "arguments", params, "required", "name", "arguments"));
    }
    if (json_array_size(any) == 1) {
        json_t *one = json_array_get(any, 0);
        const char *k;
        json_t *v;
        json_object_foreach(one, k, v) json_object_set(root, k, v);
    } else {
        json_object_set(root, "anyOf", any);
    }
    json_decref(any);
    pkv_grammar *g = schema_grammar(root, "tools", o);
    json_decref(root);
    return g;
}

bool srv_output_request(srv *s, json_t *b, bool chat, srv_req *r, srv_outfmt *of, srv_out *o) {
    memset(of, 0, sizeof *of);
    json_t *tools = json_object_get(b, "tools"), *choice = json_object_get(b, "tool_choice");
    json_t *rf = json_object_get(b, "response_format"), *gram = json_object_get(b, "grammar");
    bool have_tools = !empty(tools);
    if (!chat && (have_tools || !empty(choice))) {
        srv_error(o, 400, "'tools' and 'tool_choice' are for /v1/chat/completions");
        return false;
    }
    if (have_tools) {
        if (!json_is_array(tools) || json_array_size(tools) > MAX_TOOLS) {
            srv_error(o, 400, "'tools' must be an array of at most %d tools", MAX_TOOLS);
            return false;
        }
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            json_t *fn = json_object_get(t, "function");
            const char *type = str(t, "type");
            if (!json_is_object(t) || (json_object_get(t, "type") && (!type || strcmp(type, "function")))) {
                srv_error(o, 400, "'tools[%zu]' must be an object with \"type\": \"function\"", i);
                return false;
            }
            if (!json_is_object(fn) || !str(fn, "name") || !*str(fn, "name")) {
                srv_error(o, 400, "'tools[%zu].function.name' must be a non-empty string", i);
                return false;
            }
            json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params)) {
                srv_error(o, 400, "'tools[%zu].function.parameters' must be a JSON schema object", i);
                return false;
            }
        }
    }
    /* tool_choice: "none" (tools stay in the prompt, the output is text), "auto"
     * (the default with tools), "required", {"type":"function","function":{"name":N}} */
    int forced = -2; /* -2: none/auto; -1: required (any tool); i: that tool */
    bool calls = have_tools;
    if (!empty(choice)) {
        if (json_is_string(choice)) {
            const char *c = json_string_value(choice);
            if (!strcmp(c, "none")) calls = false;
            else if (!strcmp(c, "required")) forced = -1;
            else if (strcmp(c, "auto")) {
                srv_error(o, 400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}, got \"%s\"", c);
                return false;
            }
        } else {
            const char *name = str(json_object_get(choice, "function"), "name");
            if (!json_is_object(choice) || !name || (str(choice, "type") && strcmp(str(choice, "type"), "function"))) {
                srv_error(o, 400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}");
                return false;
            }
            size_t i;
            json_t *t;
            json_array_foreach(have_tools ? tools : NULL, i, t) if (!strcmp(str(json_object_get(t, "function"), "name"), name)) {
                forced = (int)i;
                break;
            }
            if (forced < 0) {
                srv_error(o, 400, "'tool_choice' names the function '%s', which is not in 'tools'", name);
                return false;
            }
        }
        if (forced == -1 && !have_tools) {
            srv_error(o, 400, "'tool_choice': \"required\" needs 'tools'");
            return false;
        }
    }
    json_t *pv = json_object_get(b, "parallel_tool_calls");
    if (pv && !json_is_null(pv) && !json_is_boolean(pv)) {
        srv_error(o, 400, "'parallel_tool_calls' must be true or false");
        return false;
    }
    /* response_format and grammar */
    json_t *schema = NULL;
    const char *schema_field = NULL;
    if (!empty(rf)) {
        const char *type = json_is_object(rf) ? str(rf, "type") : NULL;
        if (!type) {
            srv_error(o, 400, "'response_format' must be an object with a 'type'");
            return false;
        }
        if (!strcmp(type, "json_object")) {
            schema = json_object_get(rf, "schema"); /* llama.cpp's extension */
            schema_field = "response_format.schema";
            if (!schema || json_is_null(schema)) schema = json_pack("{s:s}", "type", "object");
            else json_incref(schema);
        } else if (!strcmp(type, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            if (!json_is_object(js)) {
                srv_error(o, 400, "'response_format.json_schema' must be an object with a 'schema'");
                return false;
            }
            json_t *st = json_object_get(js, "strict"), *nm = json_object_get(js, "name");
            if ((st && !json_is_null(st) && !json_is_boolean(st)) || (nm && !json_is_string(nm))) {
                srv_error(o, 400, "'response_format.json_schema': 'strict' must be true or false and 'name' a string");
                return false;
            }
            schema = json_object_get(js, "schema");
            schema_field = "response_format.json_schema.schema";
            if (!json_is_object(schema) && !json_is_boolean(schema)) {
                srv_error(o, 400, "'response_format.json_schema.schema' must be a JSON schema (an object)");
                return false;
            }
            json_incref(schema);
        } else if (strcmp(type, "text")) {
            srv_error(o, 400, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"%s\"", type);
            return false;
        }
    }
    if (!empty(gram) && !json_is_string(gram)) {
        json_decref(schema);
        srv_error(o, 400, "'grammar' must be a string (GBNF)");
        return false;
    }
    bool has_gram = json_is_string(gram) && json_string_length(gram);
    int constraints = (schema != NULL) + has_gram + (forced != -2 && calls);
    if (constraints > 1) {
        json_decref(schema);
        srv_error(o, 400, "only one of 'response_format' (json_object, json_schema), 'grammar' and 'tool_choice' "
                          "(required or a function) may constrain the output");
        return false;
    }
    pkv_grammar *g = NULL;
    if (schema) {
        g = schema_grammar(schema, schema_field, o);
        json_decref(schema);
        if (!g) return false;
    } else if (has_gram) {
        g = pkv_grammar_from_gbnf(json_string_value(gram), json_string_length(gram));
        if (!g) {
            srv_error(o, 400, "'grammar': %s", pkv_errmsg());
            return false;
        }
    } else if (forced != -2 && calls) {
        if (!(g = tool_grammar(tools, forced, o))) return false;
    }
    if (g) pkv_grammar_set_work_limits(g, (uint64_t)s->o.grammar_token_steps, (uint64_t)s->o.grammar_request_steps);
    r->grammar = g;
    if (!chat) return true;
    bool think = false;
    const char *src = pkv_chat_source(s->chat);
    pkv_tc_format fmt = src ? pkv_tc_detect(src, strlen(src), &think) : PKV_TC_NONE;
    if (forced != -2 && calls) {
        of->tc = (pkv_tc_opts){PKV_TC_JSON, false, false, true};
        of->parse = true;
    } else if (!schema_field && (fmt != PKV_TC_NONE || think)) { /* a GBNF grammar may write the family's format */
        of->tc = (pkv_tc_opts){fmt, think, false, calls};
        of->parse = true;
        /* these families write their markers as control tokens, whose text a plain
         * answer leaves out; Qwen/Hermes markers and <think> are ordinary tokens */
        r->special_text = fmt == PKV_TC_GPT_OSS || (calls && (fmt == PKV_TC_LLAMA3 || fmt == PKV_TC_MISTRAL || fmt == PKV_TC_DEEPSEEK));
    }
    return true;
}

void srv_output_prompt(srv_outfmt *of, const char *p, size_t n) {
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\n')) n--;
    of->tc.in_think = of->parse && of->tc.think && n >= 7 && !memcmp(p + n - 7, "<think>", 7);
}

static json_t *call_json(srv *s, bool short_id, int index, const char *name, const char *args, size_t alen,
                         bool with_index) {
    char id[64];
    srv_next_id(s, "call", id, sizeof id);
    id[4] = '_';
    if (short_id) srv_short_id(id, id); /* Mistral Nemo's template refuses other ids coming back */
    json_t *c = json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", id, "type", "function", "function", "name", srv_text_json(name, strlen(name)),
                          "arguments", srv_text_json(args, alen));
    if (c && with_index) json_object_set_new(c, "index", json_integer(index));
    return c;
}

json_t *srv_output_message(srv *s, const srv_outfmt *of, const char *text, size_t len, int *n_calls) {
    *n_calls = 0;
    if (!of->parse)
        return json_pack("{s:s,s:o}", "role", "assistant", "content", srv_text_json(text, len));
    pkv_tc_result r;
    if (!pkv_tc_parse(&of->tc, text, len, false, &r)) return NULL;
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_object_set_new(m, "content", r.n_calls && !r.content_len ? json_null() : srv_text_json(r.content, r.content_len));
    if (r.reasoning_len) json_object_set_new(m, "reasoning_content", srv_text_json(r.reasoning, r.reasoning_len));
    if (r.n_calls) {
        json_t *a = json_array();
        for (int i = 0; i < r.n_calls; i++)
            json_array_append_new(a, call_json(s, of->tc.fmt == PKV_TC_MISTRAL, i, r.calls[i].name, r.calls[i].args, r.calls[i].args_len, false));
        json_object_set_new(m, "tool_calls", a);
    }
    *n_calls = r.n_calls;
    pkv_tc_result_free(&r);
    return m;
}

json_t *srv_output_delta(srv *s, const pkv_tc_delta *d, bool short_ids) {
    switch (d->kind) {
    case PKV_TC_D_REASONING: return json_pack("{s:o}", "reasoning_content", srv_text_json(d->text, d->len));
    case PKV_TC_D_CONTENT: return json_pack("{s:o}", "content", srv_text_json(d->text, d->len));
    case PKV_TC_D_CALL: {
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)(d->len < 511 ? d->len : 511), d->text);
        return json_pack("{s:[o]}", "tool_calls", call_json(s, short_ids, d->index, name, "", 0, true));
    }
    default:
        return json_pack("{s:[{s:i,s:{s:o}}]}", "tool_calls", "index", d->index, "function", "arguments",
                         srv_text_json(d->text, d->len));
    }
}
