/* pkv_chat_render (include/pagekv.h): the library's entry to the chat layer, so
 * that the Python bindings (and any program) render a chat request exactly as
 * pagekv serve and run -cnv do (pkv_chat_init_model, pkv_chat_apply). Built
 * alone, without the rest of src/chat/, when jansson is missing: then it refuses
 * naming libjansson-dev. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "pagekv.h"

#ifndef PKV_HAVE_CHAT

pkv_status pkv_chat_render(const pkv_model *m, const char *template_src, const char *request_json, int64_t now,
                           char **prompt, size_t *prompt_len, size_t **spans, size_t *n_spans) {
    (void)m, (void)template_src, (void)request_json, (void)now;
    if (prompt) *prompt = NULL;
    if (prompt_len) *prompt_len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    return pkv_err(PKV_ERR_UNSUPPORTED,
                   "pkv_chat_render: this libpagekv was built without the chat layer (it needs jansson: install "
                   "libjansson-dev and rebuild)");
}

#else

#include <jansson.h>

#include "chat/chat.h"
#include "model/gguf.h"
#include "model/model-impl.h"

/* The model's tokenizer.chat_template (malloc'd), from its open file or the
 * file it was loaded from; NULL with *st set when it has none. */
static char *model_template(const pkv_model *m, pkv_status *st) {
    pkv_gguf *own = NULL, *g = m->gguf;
    if (!g && strcmp(m->label, "builtin") != 0) g = own = pkv_gguf_open(m->label);
    const char *t = NULL;
    size_t n = 0;
    char *src = NULL;
    if (g && pkv_gguf_get_str(g, "tokenizer.chat_template", &t, &n) == PKV_OK) {
        src = malloc(n + 1);
        if (src) {
            memcpy(src, t, n);
            src[n] = 0;
        } else {
            *st = pkv_err(PKV_ERR_NOMEM, "pkv_chat_render: out of memory copying the chat template (%zu bytes)", n);
        }
    } else {
        *st = pkv_err(PKV_ERR_NOT_FOUND,
                      "pkv_chat_render: %s has no chat template (tokenizer.chat_template): pass template_src (Jinja "
                      "text or a family: %s)",
                      m->label, pkv_tpl_names());
    }
    pkv_gguf_close(own);
    return src;
}

/* A status of pkv_chat_apply (HTTP-like) as a pkv_status with its message. */
static pkv_status apply_error(int status, const char *err) {
    pkv_status s = status == 500 ? PKV_ERR_NOMEM : PKV_ERR_INVALID;
    return pkv_err(s, "pkv_chat_render: the chat template: %s", err[0] ? err : "failed");
}

/* The request's optional string key (bos_token, eos_token without a model). */
static const char *opt_str(json_t *body, const char *key) {
    const char *s = json_string_value(json_object_get(body, key));
    return s ? s : "";
}

/* The template text for template_src (NULL: the model's; a family name: its
 * built-in Jinja; else the text itself), malloc'd; NULL with the error set. */
static char *template_text(const pkv_model *m, const char *template_src) {
    pkv_status st = PKV_OK;
    if (!template_src) {
        if (!m) {
            pkv_err(PKV_ERR_INVALID, "pkv_chat_render: template_src is NULL and no model is given");
            return NULL;
        }
        return model_template(m, &st);
    }
    pkv_tpl fam = pkv_tpl_from_name(template_src);
    char *src = strdup(fam != PKV_TPL_NONE ? pkv_tpl_source(fam) : template_src);
    if (!src) pkv_err(PKV_ERR_NOMEM, "pkv_chat_render: out of memory");
    return src;
}

pkv_status pkv_chat_render(const pkv_model *m, const char *template_src, const char *request_json, int64_t now,
                           char **prompt, size_t *prompt_len, size_t **spans, size_t *n_spans) {
    if (!prompt || !request_json || (spans && !n_spans))
        return pkv_err(PKV_ERR_INVALID, "pkv_chat_render: %s is NULL",
                       !prompt ? "prompt" : !request_json ? "request_json" : "n_spans (spans is given)");
    *prompt = NULL;
    if (prompt_len) *prompt_len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    json_error_t je;
    json_t *body = json_loads(request_json, 0, &je);
    if (!body || !json_is_object(body)) {
        json_decref(body);
        return body ? pkv_err(PKV_ERR_INVALID, "pkv_chat_render: request_json is not a JSON object")
                    : pkv_err(PKV_ERR_INVALID, "pkv_chat_render: request_json: line %d column %d: %s", je.line,
                              je.column, je.text);
    }
    char *src = template_text(m, template_src);
    if (!src) {
        json_decref(body);
        return pkv_errcode();
    }
    char err[600] = "";
    pkv_chat *c = m ? pkv_chat_init_model(m, src, strlen(src), err, sizeof err)
                    : pkv_chat_init(src, strlen(src), opt_str(body, "bos_token"), opt_str(body, "eos_token"), false,
                                    false, err, sizeof err);
    free(src);
    pkv_status st = PKV_OK;
    if (!c) {
        st = pkv_err(PKV_ERR_INVALID, "pkv_chat_render: the chat template does not parse: %s", err);
    } else {
        int status = 0;
        size_t len = 0;
        *prompt = pkv_chat_apply(c, body, now, &len, spans, spans ? n_spans : NULL, &status, err, sizeof err);
        if (!*prompt) st = apply_error(status, err);
        else if (prompt_len) *prompt_len = len;
    }
    pkv_chat_free(c);
    json_decref(body);
    return st;
}

#endif

void pkv_chat_render_free(char *prompt, size_t *spans) {
    free(prompt);
    free(spans);
}
