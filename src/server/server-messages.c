/* POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API
 * (docs/server.md, "Anthropic Messages API"), as llama-server offers it to agent
 * tools that speak it. A request is checked field by field (a 400 in Anthropic's
 * error shape naming the field), converted to the OpenAI chat body the chat
 * machinery runs (server-api.c, server-tools.c, the chat template), and the
 * answer is written back as Anthropic's message object or its stream of events:
 * reasoning as thinking blocks, tool calls as tool_use blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server-http.h"
#include "server/server-stream.h"
#include "server/server-tools.h"

#define MSG_MAX_TOOLS 128
#define MSG_MAX_STOPS 16

/* ------------------------------------------------------------ request */

/* The request fields: read, accepted without effect, or known to Anthropic and
 * not implemented (they would change the output). */
static const char *const k_fields[] = {
    "model", "max_tokens", "messages", "system", "tools", "tool_choice", "stop_sequences", "temperature", "top_p",
    "top_k", "stream", "thinking", "chat_template_kwargs",
    /* accepted, no effect on the output */
    "metadata", "service_tier", NULL};
static const char *const k_unimplemented[] = {"container", "mcp_servers", "context_management", "output_format",
                                              "output_config", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], k)) return true;
    return false;
}


/* The keys of a block other than its own and those that change nothing
 * (cache_control: a hint for Anthropic's prompt cache; the prefix cache here is
 * automatic; citations). */
static bool block_keys(json_t *blk, const char *const *own, const char *where, srv_out *o) {
    const char *k;
    json_t *v;
    json_object_foreach(blk, k, v) {
        if (!strcmp(k, "type") || !strcmp(k, "cache_control") || !strcmp(k, "citations") || in_list(own, k)) continue;
        srv_error(o, 400, "'%s.%s' is not a field of a '%s' block", where, k, srv_jstr(blk, "type"));
        return false;
    }
    return true;
}

/* A text block's text (a string); NULL with a 400 naming it. */
static json_t *text_part(json_t *blk, const char *where, srv_out *o) {
    static const char *const own[] = {"text", NULL};
    json_t *t = json_object_get(blk, "text");
    if (!json_is_string(t)) {
        srv_error(o, 400, "'%s.text' must be a string", where);
        return NULL;
    }
    if (!block_keys(blk, own, where, o)) return NULL;
    return json_pack("{s:s,s:O}", "type", "text", "text", t);
}

/* An image block as an OpenAI image_url part: only with a vision projector. */
static json_t *image_part(srv *s, json_t *blk, const char *where, srv_out *o) {
    static const char *const own[] = {"source", NULL};
    if (!s->mm || s->mm_info.kind != PKV_MEDIA_IMAGE) {
        srv_error(o, 400, "'%s': image blocks need a vision projector (start the server with --mmproj)", where);
        return NULL;
    }
    json_t *src = json_object_get(blk, "source");
    const char *type = srv_jstr(src, "type");
    if (!json_is_object(src) || !type || !block_keys(blk, own, where, o)) {
        if (!o->status) srv_error(o, 400, "'%s.source' must be an object with a 'type'", where);
        return NULL;
    }
    if (!strcmp(type, "base64")) {
        const char *mt = srv_jstr(src, "media_type"), *data = srv_jstr(src, "data");
        if (!mt || !data) {
            srv_error(o, 400, "'%s.source': a base64 source needs 'media_type' and 'data' strings", where);
            return NULL;
        }
        size_t n = strlen(mt) + strlen(data) + 16;
        char *url = malloc(n);
        if (!url) {
            srv_error(o, 500, "out of memory");
            return NULL;
        }
        snprintf(url, n, "data:%s;base64,%s", mt, data);
        json_t *p = json_pack("{s:s,s:{s:s}}", "type", "image_url", "image_url", "url", url);
        free(url);
        return p;
    }
    if (!strcmp(type, "url")) {
        if (!srv_jstr(src, "url")) {
            srv_error(o, 400, "'%s.source.url' must be a string", where);
            return NULL;
        }
        return json_pack("{s:s,s:{s:s}}", "type", "image_url", "image_url", "url", srv_jstr(src, "url"));
    }
    srv_error(o, 400, "'%s.source.type' must be \"base64\" or \"url\", got \"%s\"", where, type);
    return NULL;
}

/* A tool_result block as an OpenAI tool message: its content a string or text
 * blocks (joined); is_error marks the text as an error for the model. */
static json_t *tool_result(json_t *blk, const char *where, srv_out *o) {
    static const char *const own[] = {"tool_use_id", "content", "is_error", NULL};
    const char *id = srv_jstr(blk, "tool_use_id");
    json_t *c = json_object_get(blk, "content"), *err = json_object_get(blk, "is_error");
    if (!id) {
        srv_error(o, 400, "'%s.tool_use_id' must be a string", where);
        return NULL;
    }
    if (err && !json_is_null(err) && !json_is_boolean(err)) {
        srv_error(o, 400, "'%s.is_error' must be true or false", where);
        return NULL;
    }
    if (!block_keys(blk, own, where, o)) return NULL;
    size_t total = 0;
    if (c && !json_is_null(c) && !json_is_string(c) && !json_is_array(c)) {
        srv_error(o, 400, "'%s.content' must be a string or an array of text blocks", where);
        return NULL;
    }
    size_t i;
    json_t *e;
    json_array_foreach(json_is_array(c) ? c : NULL, i, e) {
        const char *t = srv_jstr(e, "type");
        if (!json_is_object(e) || !t || strcmp(t, "text") || !json_is_string(json_object_get(e, "text"))) {
            srv_error(o, 400, "'%s.content[%zu]' must be a text block ({\"type\": \"text\", \"text\": ...}); %s", where, i,
                      t && !strcmp(t, "image") ? "images in tool results are not supported" : "other blocks are not supported");
            return NULL;
        }
        total += json_string_length(json_object_get(e, "text")) + 1;
    }
    const bool is_err = json_is_true(err);
    if (json_is_string(c)) total = json_string_length(c);
    char *text = malloc(total + 8);
    if (!text) {
        srv_error(o, 500, "out of memory");
        return NULL;
    }
    size_t n = 0;
    if (is_err) n = (size_t)sprintf(text, "Error: ");
    if (json_is_string(c)) {
        memcpy(text + n, json_string_value(c), json_string_length(c));
        n += json_string_length(c);
    }
    json_array_foreach(json_is_array(c) ? c : NULL, i, e) {
        json_t *t = json_object_get(e, "text");
        if (i) text[n++] = '\n';
        memcpy(text + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    json_t *m = json_pack("{s:s,s:s,s:s%}", "role", "tool", "tool_call_id", id, "content", text, n);
    free(text);
    return m;
}

/* A tool_use block as an OpenAI tool call (arguments: the input as JSON text). */
static json_t *tool_use(json_t *blk, const char *where, srv_out *o) {
    static const char *const own[] = {"id", "name", "input", NULL};
    const char *id = srv_jstr(blk, "id"), *name = srv_jstr(blk, "name");
    json_t *in = json_object_get(blk, "input");
    if (!id || !name || !json_is_object(in)) {
        srv_error(o, 400, "'%s' must have 'id' and 'name' strings and an 'input' object", where);
        return NULL;
    }
    if (!block_keys(blk, own, where, o)) return NULL;
    char *args = json_dumps(in, JSON_COMPACT);
    json_t *c = args ? json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name", name,
                                 "arguments", args)
                     : NULL;
    free(args);
    if (!c) srv_error(o, 500, "out of memory");
    return c;
}

/* messages[i] appended to out as OpenAI messages: a user turn's tool results
 * first (as tool messages, in order), then its text and images; an assistant
 * turn's text, thinking (reasoning_content) and tool_use blocks (tool_calls) as
 * one message. */
static bool convert_message(srv *s, json_t *m, size_t mi, json_t *out, srv_out *o) {
    char where[96];
    snprintf(where, sizeof where, "messages[%zu]", mi);
    const char *role = srv_jstr(m, "role");
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
        srv_error(o, 400, "'%s.role' must be \"user\" or \"assistant\"", where);
        return false;
    }
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) if (strcmp(k, "role") && strcmp(k, "content")) {
        srv_error(o, 400, "'%s.%s' is not a field of a message (role, content)", where, k);
        return false;
    }
    const bool user = !strcmp(role, "user");
    json_t *c = json_object_get(m, "content");
    if (json_is_string(c)) {
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", role, "content", c));
        return true;
    }
    if (!json_is_array(c)) {
        srv_error(o, 400, "'%s.content' must be a string or an array of content blocks", where);
        return false;
    }
    json_t *parts = json_array(), *calls = json_array(), *tools = json_array();
    char *reasoning = NULL;
    size_t rlen = 0;
    bool ok = true;
    size_t i;
    json_t *blk;
    json_array_foreach(c, i, blk) {
        char bw[128];
        snprintf(bw, sizeof bw, "%s.content[%zu]", where, i);
        const char *t = srv_jstr(blk, "type");
        json_t *p = NULL;
        if (!json_is_object(blk) || !t) {
            srv_error(o, 400, "'%s' must be a content block (an object with a 'type')", bw);
            ok = false;
        } else if (!strcmp(t, "text")) {
            ok = (p = text_part(blk, bw, o)) && !json_array_append_new(parts, p);
        } else if (!strcmp(t, "image") && user) {
            ok = (p = image_part(s, blk, bw, o)) && !json_array_append_new(parts, p);
        } else if (!strcmp(t, "tool_result") && user) {
            ok = (p = tool_result(blk, bw, o)) && !json_array_append_new(tools, p);
        } else if (!strcmp(t, "tool_use") && !user) {
            ok = (p = tool_use(blk, bw, o)) && !json_array_append_new(calls, p);
        } else if (!strcmp(t, "thinking") && !user) {
            static const char *const own[] = {"thinking", "signature", NULL};
            json_t *th = json_object_get(blk, "thinking");
            if (!json_is_string(th)) {
                srv_error(o, 400, "'%s.thinking' must be a string", bw);
                ok = false;
            } else if ((ok = block_keys(blk, own, bw, o))) {
                size_t n = json_string_length(th);
                char *r = realloc(reasoning, rlen + n + 2);
                if (!r) {
                    srv_error(o, 500, "out of memory");
                    ok = false;
                } else {
                    reasoning = r;
                    if (rlen) reasoning[rlen++] = '\n';
                    memcpy(reasoning + rlen, json_string_value(th), n);
                    rlen += n;
                }
            }
        } else if (!strcmp(t, "redacted_thinking") && !user) {
            /* encrypted by Anthropic: nothing a local model can read */
        } else {
            srv_error(o, 400, "'%s': content blocks of type '%s' are not supported in %s messages (%s)", bw, t, role,
                      user ? "text, image, tool_result" : "text, thinking, redacted_thinking, tool_use");
            ok = false;
        }
        if (!ok) break;
    }
    if (ok) {
        json_array_extend(out, tools);
        if (json_array_size(parts) || (!user && (json_array_size(calls) || rlen)) || (!json_array_size(tools) && user)) {
            json_t *msg = json_pack("{s:s}", "role", role);
            json_object_set_new(msg, "content", json_array_size(parts) ? json_incref(parts) : json_string(""));
            if (json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
            if (rlen) json_object_set_new(msg, "reasoning_content", json_stringn(reasoning, rlen));
            json_array_append_new(out, msg);
        }
    }
    free(reasoning);
    json_decref(parts);
    json_decref(calls);
    json_decref(tools);
    return ok;
}

/* Claude Code starts its system prompt with a billing line,
 * "x-anthropic-billing-header: cc_version=...; cc_entrypoint=cli; cch=a5145;You
 * are ...", whose cch stamp changes with every request: the prefix cache could
 * never get past it. The stamp means nothing to the model, so it is written as
 * f's, as llama-server does. */
static void billing_stamp(char *t, size_t n) {
    static const char head[] = "x-anthropic-billing-header:";
    if (n < sizeof head || memcmp(t, head, sizeof head - 1)) return;
    const char *line_end = memchr(t, '\n', n);
    size_t end = line_end ? (size_t)(line_end - t) : n;
    for (size_t i = sizeof head - 1; i + 4 <= end; i++) {
        if (memcmp(t + i, "cch=", 4)) continue;
        size_t k = i + 4;
        while (k < end && k < i + 4 + 64 && t[k] != ';') k++;
        if (k < end && t[k] == ';') memset(t + i + 4, 'f', k - i - 4);
        return;
    }
}

/* system: a string or text blocks (joined by blank lines). */
static bool convert_system(json_t *sys, json_t *out, srv_out *o) {
    if (!sys || json_is_null(sys)) return true;
    if (json_is_string(sys)) {
        size_t n = json_string_length(sys);
        char *t = malloc(n + 1);
        if (!t) {
            srv_error(o, 500, "out of memory");
            return false;
        }
        memcpy(t, json_string_value(sys), n + 1);
        billing_stamp(t, n);
        json_array_append_new(out, json_pack("{s:s,s:s%}", "role", "system", "content", t, n));
        free(t);
        return true;
    }
    if (!json_is_array(sys)) {
        srv_error(o, 400, "'system' must be a string or an array of text blocks");
        return false;
    }
    size_t total = 0, i;
    json_t *e;
    json_array_foreach(sys, i, e) {
        char where[48];
        snprintf(where, sizeof where, "system[%zu]", i);
        const char *t = srv_jstr(e, "type");
        if (!json_is_object(e) || !t || strcmp(t, "text")) {
            srv_error(o, 400, "'%s' must be a text block ({\"type\": \"text\", \"text\": ...})", where);
            return false;
        }
        json_t *p = text_part(e, where, o);
        if (!p) return false;
        json_decref(p);
        total += json_string_length(json_object_get(e, "text")) + 2;
    }
    char *text = malloc(total + 1);
    if (!text) {
        srv_error(o, 500, "out of memory");
        return false;
    }
    size_t n = 0;
    json_array_foreach(sys, i, e) {
        json_t *t = json_object_get(e, "text");
        if (i) n += (size_t)sprintf(text + n, "\n\n");
        memcpy(text + n, json_string_value(t), json_string_length(t));
        billing_stamp(text + n, json_string_length(t));
        n += json_string_length(t);
    }
    json_array_append_new(out, json_pack("{s:s,s:s%}", "role", "system", "content", text, n));
    free(text);
    return true;
}

static bool convert_tools(json_t *b, json_t *chat, srv_out *o) {
    json_t *tools = json_object_get(b, "tools"), *tc = json_object_get(b, "tool_choice");
    size_t n_tools = 0;
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) > MSG_MAX_TOOLS) {
            srv_error(o, 400, "'tools' must be an array of at most %d tools", MSG_MAX_TOOLS);
            return false;
        }
        json_t *out = json_array();
        json_object_set_new(chat, "tools", out);
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *type = srv_jstr(t, "type"), *name = srv_jstr(t, "name");
            json_t *desc = json_object_get(t, "description"), *schema = json_object_get(t, "input_schema");
            if (!json_is_object(t)) {
                srv_error(o, 400, "'tools[%zu]' must be an object", i);
                return false;
            }
            if (type && strcmp(type, "custom")) {
                srv_error(o, 400, "'tools[%zu].type': Anthropic's server tools ('%s') are not supported; only client "
                                  "tools (name, description, input_schema)", i, type);
                return false;
            }
            if (!name || !*name) {
                srv_error(o, 400, "'tools[%zu].name' must be a non-empty string", i);
                return false;
            }
            if (desc && !json_is_null(desc) && !json_is_string(desc)) {
                srv_error(o, 400, "'tools[%zu].description' must be a string", i);
                return false;
            }
            if (!json_is_object(schema)) {
                srv_error(o, 400, "'tools[%zu].input_schema' must be a JSON schema (an object)", i);
                return false;
            }
            const char *k;
            json_t *v;
            json_object_foreach(t, k, v) if (strcmp(k, "type") && strcmp(k, "name") && strcmp(k, "description") &&
                                             strcmp(k, "input_schema") && strcmp(k, "cache_control")) {
                srv_error(o, 400, "'tools[%zu].%s' is not a field of a tool (name, description, input_schema)", i, k);
                return false;
            }
            json_t *fn = json_pack("{s:s,s:O}", "name", name, "parameters", schema);
            if (json_is_string(desc)) json_object_set(fn, "description", desc);
            json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
        n_tools = json_array_size(tools);
    }
    if (!tc || json_is_null(tc)) return true;
    const char *type = srv_jstr(tc, "type");
    if (!json_is_object(tc) || !type) {
        srv_error(o, 400, "'tool_choice' must be an object with a 'type' (auto, any, tool, none)");
        return false;
    }
    json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp)) {
        srv_error(o, 400, "'tool_choice.disable_parallel_tool_use' must be true or false");
        return false;
    }
    if (dp) json_object_set_new(chat, "parallel_tool_calls", json_boolean(!json_is_true(dp)));
    if (!strcmp(type, "auto") || !strcmp(type, "none")) {
        json_object_set_new(chat, "tool_choice", json_string(type));
    } else if (!strcmp(type, "any") || !strcmp(type, "tool")) {
        if (!n_tools) {
            srv_error(o, 400, "'tool_choice': \"%s\" needs 'tools'", type);
            return false;
        }
        if (!strcmp(type, "any")) {
            json_object_set_new(chat, "tool_choice", json_string("required"));
        } else {
            const char *name = srv_jstr(tc, "name");
            if (!name) {
                srv_error(o, 400, "'tool_choice.name' must be a string (the tool to call)");
                return false;
            }
            size_t i;
            json_t *t;
            bool found = false;
            json_array_foreach(tools, i, t) found = found || !strcmp(srv_jstr(t, "name"), name);
            if (!found) {
                srv_error(o, 400, "'tool_choice.name' names the tool '%s', which is not in 'tools'", name);
                return false;
            }
            json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", name));
        }
    } else {
        srv_error(o, 400, "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", got \"%s\"", type);
        return false;
    }
    return true;
}

/* The OpenAI chat body of an Anthropic request; NULL with a 400 in o. counting:
 * for count_tokens (max_tokens not needed, nothing generated). */
static json_t *to_chat(srv *s, json_t *b, bool counting, srv_out *o) {
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        if (in_list(k_fields, k)) continue;
        if (in_list(k_unimplemented, k)) {
            if (json_is_null(v)) continue;
            srv_error(o, 400, "'%s' is not implemented by pagekv serve (it would change the output; docs/server.md "
                              "lists what /v1/messages takes)", k);
            return NULL;
        }
        if (s->o.lenient_fields) continue;
        srv_error(o, 400, "unknown field '%s' (not a field of Anthropic's Messages API; start the server with "
                          "--lenient-fields to ignore unknown fields)", k);
        return NULL;
    }
    json_t *model = json_object_get(b, "model"), *mt = json_object_get(b, "max_tokens");
    if (model && !json_is_string(model)) {
        srv_error(o, 400, "'model' must be a string");
        return NULL;
    }
    if (!counting && (!json_is_integer(mt) || json_integer_value(mt) < 1)) {
        srv_error(o, 400, "'max_tokens' is required: an integer >= 1 (the most tokens to generate)");
        return NULL;
    }
    if (srv_jpresent(b, "metadata") && !json_is_object(json_object_get(b, "metadata"))) {
        srv_error(o, 400, "'metadata' must be an object");
        return NULL;
    }
    json_t *msgs = json_object_get(b, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs) || json_array_size(msgs) > 4096) {
        srv_error(o, 400, "'messages' must be a non-empty array of at most 4096 messages");
        return NULL;
    }
    json_t *chat = json_object(), *out = json_array();
    json_object_set_new(chat, "messages", out);
    if (!convert_system(json_object_get(b, "system"), out, o)) goto fail;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) if (!convert_message(s, m, i, out, o)) goto fail;
    if (!convert_tools(b, chat, o)) goto fail;
    /* sampling: Anthropic's ranges; the chat path reads the same names */
    json_t *t = json_object_get(b, "temperature"), *tp = json_object_get(b, "top_p"), *tk = json_object_get(b, "top_k");
    if (t && !json_is_null(t) && (!json_is_number(t) || json_number_value(t) < 0 || json_number_value(t) > 1)) {
        srv_error(o, 400, "'temperature' must be a number in [0, 1]");
        goto fail;
    }
    if (tp && !json_is_null(tp) && (!json_is_number(tp) || json_number_value(tp) <= 0 || json_number_value(tp) > 1)) {
        srv_error(o, 400, "'top_p' must be a number in (0, 1]");
        goto fail;
    }
    if (tk && !json_is_null(tk) && (!json_is_integer(tk) || json_integer_value(tk) < 0)) {
        srv_error(o, 400, "'top_k' must be an integer >= 0");
        goto fail;
    }
    static const char *const pass[] = {"model", "temperature", "top_p", "top_k", "stream", "max_tokens",
                                       "chat_template_kwargs", NULL};
    for (int p = 0; pass[p]; p++)
        if (srv_jpresent(b, pass[p]) && !(counting && strcmp(pass[p], "chat_template_kwargs")))
            json_object_set(chat, pass[p], json_object_get(b, pass[p]));
    json_t *st = json_object_get(b, "stop_sequences");
    if (st && !json_is_null(st)) {
        if (!json_is_array(st) || json_array_size(st) > MSG_MAX_STOPS) {
            srv_error(o, 400, "'stop_sequences' must be an array of at most %d strings", MSG_MAX_STOPS);
            goto fail;
        }
        json_array_foreach(st, i, m) if (!json_is_string(m) || json_string_length(m) > 256) {
            srv_error(o, 400, "'stop_sequences[%zu]' must be a string of at most 256 bytes", i);
            goto fail;
        }
        if (!counting) json_object_set(chat, "stop", st);
    }
    /* thinking: {"type": "enabled", "budget_tokens": N} or {"type": "disabled"};
     * a template with a thinking switch (enable_thinking) gets it set */
    json_t *th = json_object_get(b, "thinking");
    if (th && !json_is_null(th)) {
        const char *tt = srv_jstr(th, "type");
        json_t *bt = json_object_get(th, "budget_tokens");
        if (!json_is_object(th) || !tt || (strcmp(tt, "enabled") && strcmp(tt, "disabled"))) {
            srv_error(o, 400, "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
            goto fail;
        }
        if (!strcmp(tt, "enabled") && (!json_is_integer(bt) || json_integer_value(bt) < 1)) {
            srv_error(o, 400, "'thinking.budget_tokens' must be an integer >= 1");
            goto fail;
        }
        json_t *kw = json_object_get(chat, "chat_template_kwargs");
        if (kw && !json_is_object(kw)) {
            srv_error(o, 400, "'chat_template_kwargs' must be an object");
            goto fail;
        }
        if (!kw) json_object_set_new(chat, "chat_template_kwargs", kw = json_object());
        else json_object_set_new(chat, "chat_template_kwargs", kw = json_deep_copy(kw));
        if (!json_object_get(kw, "enable_thinking"))
            json_object_set_new(kw, "enable_thinking", json_boolean(!strcmp(tt, "enabled")));
    }
    return chat;
fail:
    json_decref(chat);
    return NULL;
}

/* Errors the chat path writes name its OpenAI fields: name Anthropic's. */
static void rename_fields(srv_out *o) {
    json_t *e = json_object_get(o->json, "error");
    const char *msg = srv_jstr(e, "message");
    if (!msg || !strstr(msg, ".function.parameters")) return;
    size_t n = strlen(msg);
    char *t = malloc(n + 1), *w = t;
    if (!t) return;
    for (const char *p = msg; *p;) {
        if (!strncmp(p, ".function.parameters", 20)) {
            w += sprintf(w, ".input_schema");
            p += 20;
        } else {
            *w++ = *p++;
        }
    }
    *w = 0;
    json_object_set_new(e, "message", json_string(t));
    free(t);
}

void srv_api_messages(srv *s, json_t *b, const srv_conn *conn, srv_out *o) {
    json_t *chat = to_chat(s, b, false, o);
    if (!chat) return;
    srv_api_generate(s, chat, SRV_FMT_MESSAGES, conn, o);
    json_decref(chat);
    if (o->status >= 400) rename_fields(o);
}

void srv_api_count_tokens(srv *s, json_t *b, const srv_conn *conn, srv_out *o) {
    json_t *chat = to_chat(s, b, true, o);
    if (!chat) return;
    size_t len = 0, *spans = NULL, n_spans = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    int n = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(chat, "messages"), i, m) {
        size_t k;
        json_t *p;
        json_array_foreach(json_is_array(json_object_get(m, "content")) ? json_object_get(m, "content") : NULL, k, p)
            if (!strcmp(srv_jstr(p, "type"), "image_url")) {
                srv_error(o, 400, "count_tokens does not count image blocks (an image's tokens are known once it is encoded)");
                goto out;
            }
    }
    if (!(text = srv_chat_prompt(s, chat, conn, &len, &spans, &n_spans, o))) goto out;
    if (!srv_tokenize_spans(s, text, len, spans, n_spans, &ids, &n, o)) goto out;
    o->status = 200;
    o->json = json_pack("{s:i}", "input_tokens", n);
out:
    free(ids);
    free(text);
    free(spans);
    json_decref(chat);
}

/* ------------------------------------------------------------ answer */

static const char *err_type(int status) {
    return status == 401   ? "authentication_error"
           : status == 403 ? "permission_error"
           : status == 404 ? "not_found_error"
           : status == 413 ? "request_too_large"
           : status == 429 ? "rate_limit_error"
           : status == 503 ? "overloaded_error"
           : status >= 500 ? "api_error"
                           : "invalid_request_error";
}

void srv_error_anthropic(srv_out *o) {
    if (o->status < 400 || !o->json) return;
    const char *msg = srv_jstr(json_object_get(o->json, "error"), "message");
    json_t *j = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", err_type(o->status), "message",
                          msg ? msg : "error");
    if (!j) return;
    json_decref(o->json);
    o->json = j;
}

static void tool_id(srv *s, char *id, size_t size) {
    srv_next_id(s, "toolu", id, size);
    id[5] = '_';
}

static const char *stop_reason(const srv_req *r, int n_calls) {
    const srv_choice *c = &r->ch[0];
    if (!c->finish || !strcmp(c->finish, "length")) return "max_tokens";
    if (c->stop_hit > 0) return "stop_sequence";
    return n_calls ? "tool_use" : "end_turn";
}

/* Anthropic counts input_tokens apart from the tokens read from its cache. */
static json_t *usage(const srv_req *r, bool input) {
    const int prompt = r->n_prompt + r->media_rows_audio + r->media_rows_image;
    if (!input) return json_pack("{s:i}", "output_tokens", r->ch[0].n_toks);
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", prompt - r->cached_tokens, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", r->cached_tokens, "output_tokens", r->ch[0].n_toks);
}

json_t *srv_messages_body(srv *s, srv_req *r, const srv_outfmt *of, const char *id) {
    srv_choice *c = &r->ch[0];
    pkv_tc_result tr = {0};
    if (of->parse) {
        if (!pkv_tc_parse(&of->tc, c->text, c->len, false, &tr)) return NULL;
    } else {
        tr.content = c->text;
        tr.content_len = c->len;
    }
    json_t *content = json_array();
    if (tr.reasoning_len)
        json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                                                 srv_text_json(tr.reasoning, tr.reasoning_len), "signature", ""));
    if (tr.content_len)
        json_array_append_new(content, json_pack("{s:s,s:o}", "type", "text", "text", srv_text_json(tr.content, tr.content_len)));
    for (int i = 0; i < tr.n_calls; i++) {
        char tid[64];
        tool_id(s, tid, sizeof tid);
        /* an input cut short by max_tokens is not JSON: {} (stop_reason says max_tokens) */
        json_t *in = json_loadb(tr.calls[i].args, tr.calls[i].args_len, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(in)) {
            json_decref(in);
            in = json_object();
        }
        json_array_append_new(content, json_pack("{s:s,s:s,s:o,s:o}", "type", "tool_use", "id", tid, "name",
                                                 srv_text_json(tr.calls[i].name, strlen(tr.calls[i].name)), "input", in));
    }
    const char *reason = stop_reason(r, tr.n_calls);
    json_t *seq = c->stop_hit > 0 ? json_string(r->stop[c->stop_hit - 1]) : json_null();
    if (of->parse) pkv_tc_result_free(&tr);
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:o}", "id", id, "type", "message", "role", "assistant", "model",
                     s->model_id, "content", content, "stop_reason", reason, "stop_sequence", seq, "usage", usage(r, true));
}

/* ------------------------------------------------------------ stream */

static void put(srv_stream *st, const char *p, size_t n) {
    char *q = realloc(st->pend, st->pend_len + n);
    if (!q) return;
    st->pend = q;
    memcpy(q + st->pend_len, p, n);
    st->pend_len += n;
}

/* One server-sent event: "event: NAME" and its data, the type named again in it. */
static void event(srv_stream *st, const char *name, json_t *data) {
    json_t *j = data ? json_pack("{s:s}", "type", name) : NULL;
    if (j) json_object_update(j, data);
    json_decref(data);
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!t) return;
    put(st, "event: ", 7);
    put(st, name, strlen(name));
    put(st, "\ndata: ", 7);
    put(st, t, strlen(t));
    put(st, "\n\n", 2);
    free(t);
}

enum { BLK_NONE, BLK_THINKING, BLK_TEXT, BLK_TOOL };

static void block_stop(srv_stream *st) {
    if (st->blk < 0) return;
    if (st->blk_kind == BLK_THINKING) /* Anthropic's signature of the thinking: none here */
        event(st, "content_block_delta",
              json_pack("{s:i,s:{s:s,s:s}}", "index", st->blk, "delta", "type", "signature_delta", "signature", ""));
    event(st, "content_block_stop", json_pack("{s:i}", "index", st->blk));
    st->blk = -1;
    st->blk_kind = BLK_NONE;
}

static void block_start(srv_stream *st, int kind, json_t *block) {
    block_stop(st);
    st->blk = st->n_blk++;
    st->blk_kind = kind;
    event(st, "content_block_start", json_pack("{s:i,s:o}", "index", st->blk, "content_block", block));
}

static void delta(srv_stream *st, const pkv_tc_delta *d) {
    static const int kinds[] = {[PKV_TC_D_REASONING] = BLK_THINKING, [PKV_TC_D_CONTENT] = BLK_TEXT,
                                [PKV_TC_D_CALL] = BLK_TOOL, [PKV_TC_D_ARGS] = BLK_TOOL};
    const int kind = kinds[d->kind];
    if (d->kind == PKV_TC_D_CALL) {
        char tid[64];
        tool_id(st->s, tid, sizeof tid);
        block_start(st, kind, json_pack("{s:s,s:s,s:o,s:{}}", "type", "tool_use", "id", tid, "name",
                                        srv_text_json(d->text, d->len), "input"));
        return;
    }
    if (!d->len) return;
    if (st->blk_kind != kind) {
        if (kind == BLK_THINKING) block_start(st, kind, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""));
        else if (kind == BLK_TEXT) block_start(st, kind, json_pack("{s:s,s:s}", "type", "text", "text", ""));
        else return; /* arguments without their call: not produced by the parser */
    }
    json_t *dj = kind == BLK_THINKING ? json_pack("{s:s,s:o}", "type", "thinking_delta", "thinking", srv_text_json(d->text, d->len))
                 : kind == BLK_TEXT   ? json_pack("{s:s,s:o}", "type", "text_delta", "text", srv_text_json(d->text, d->len))
                                      : json_pack("{s:s,s:o}", "type", "input_json_delta", "partial_json",
                                                  srv_text_json(d->text, d->len));
    event(st, "content_block_delta", json_pack("{s:i,s:o}", "index", st->blk, "delta", dj));
}

void srv_messages_events(srv_stream *st) {
    srv_req *r = st->r;
    srv_choice *c = &r->ch[0];
    if (!st->role_sent) {
        json_t *u = usage(r, true);
        json_object_set_new(u, "output_tokens", json_integer(0));
        event(st, "message_start",
              json_pack("{s:{s:s,s:s,s:s,s:[],s:s,s:n,s:n,s:o}}", "message", "id", st->id, "type", "message", "role",
                        "assistant", "content", "model", st->s->model_id, "stop_reason", "stop_sequence", "usage", u));
        st->role_sent = true;
    }
    if (r->http_status) { /* failed mid-stream: an error event ends it */
        event(st, "error", json_pack("{s:{s:s,s:s}}", "error", "type", err_type(r->http_status), "message", r->err));
        st->ended = true;
        return;
    }
    if (!st->fin_sent[0]) {
        const bool final = c->finish && c->stable == c->len;
        const size_t upto = final ? c->len : c->stable;
        if (upto > st->sent[0] || final) {
            if (st->tcs) {
                const pkv_tc_delta *d = NULL;
                int nd = 0;
                if (!pkv_tc_stream_update(st->tcs[0], c->text, upto, final, &d, &nd)) nd = 0;
                for (int k = 0; k < nd; k++) delta(st, &d[k]);
            } else {
                pkv_tc_delta d = {PKV_TC_D_CONTENT, 0, c->text + st->sent[0], upto - st->sent[0]};
                delta(st, &d);
            }
            st->sent[0] = upto;
            st->sent_toks[0] = c->n_toks;
        }
        if (final) {
            block_stop(st);
            st->fin_sent[0] = true;
        }
    }
    if (r->done && st->fin_sent[0]) {
        const int calls = st->tcs ? pkv_tc_stream_calls(st->tcs[0]) : 0;
        json_t *seq = c->stop_hit > 0 ? json_string(r->stop[c->stop_hit - 1]) : json_null();
        event(st, "message_delta", json_pack("{s:{s:s,s:o},s:o}", "delta", "stop_reason", stop_reason(r, calls),
                                             "stop_sequence", seq, "usage", usage(r, true)));
        event(st, "message_stop", json_object());
        st->ended = true;
    }
}
