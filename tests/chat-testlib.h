/* Render a conversation with a built-in family template through the server's chat
 * layer (chat-template.c and jinja.c, compiled in by the including test). */
#ifndef PKV_CHAT_TESTLIB_H
#define PKV_CHAT_TESTLIB_H

#include <jansson.h>

typedef struct pkv_chat_msg {
    const char *role;
    const char *content;
} pkv_chat_msg;

/* malloc'd prompt with the generation prompt, or NULL with err set */
static char *pkv_tpl_render(pkv_tpl t, const pkv_chat_msg *m, int n, char *err, size_t err_size) {
    const char *src = pkv_tpl_source(t);
    if (!src) {
        snprintf(err, err_size, "no chat template");
        return NULL;
    }
    pkv_chat *c = pkv_chat_init(src, strlen(src), "", "", false, false, err, err_size);
    if (!c) return NULL;
    json_t *msgs = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", m[i].role, "content", m[i].content));
    json_t *body = json_pack("{s:o}", "messages", msgs);
    size_t len;
    int status;
    char *out = pkv_chat_apply(c, body, 0, &len, NULL, NULL, &status, err, err_size);
    json_decref(body);
    pkv_chat_free(c);
    return out;
}

#endif
