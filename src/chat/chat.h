/* The chat layer (src/chat/): chat templates (chat-template.c over the Jinja
 * interpreter, jinja.h), the built-in families, and UTF-8 helpers for streamed
 * text. Used alike by pagekv serve, run -cnv, pkv_chat_render (chat-api.c: the
 * Python bindings) and the tests; in libpagekv when jansson is found; plain C and jansson,
 * no HTTP. */
#ifndef PKV_CHAT_H
#define PKV_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pagekv.h"

/* ---------------------------------------------------------- chat templates */

typedef enum pkv_tpl {
    PKV_TPL_NONE = 0,
    PKV_TPL_CHATML,   /* <|im_start|>role ... <|im_end|> (Qwen, many fine-tunes) */
    PKV_TPL_LLAMA3,   /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
    PKV_TPL_LLAMA2,   /* [INST] <<SYS>> ... <</SYS>> ... [/INST] */
    PKV_TPL_MISTRAL,  /* [INST] ... [/INST] without <<SYS>> */
    PKV_TPL_GEMMA,    /* <start_of_turn>user ... <end_of_turn> */
    PKV_TPL_PHI3,     /* <|user|> ... <|end|> */
    PKV_TPL_DEEPSEEK, /* <｜User｜> ... <｜Assistant｜> (DeepSeek V2/V3/R1) */
    PKV_TPL_COUNT
} pkv_tpl;

/* Family by name ("chatml", "qwen", "llama3", ...); PKV_TPL_NONE when unknown. */
pkv_tpl pkv_tpl_from_name(const char *name);
const char *pkv_tpl_name(pkv_tpl t);
/* The names accepted by --chat-template, comma separated. */
const char *pkv_tpl_names(void);
/* Recognise a Jinja chat template (tokenizer.chat_template) by its markers.
 * PKV_TPL_NONE when no family's markers are present. */
pkv_tpl pkv_tpl_detect(const char *tmpl, size_t len);
/* The Jinja source of a built-in family's template (--chat-template NAME). */
const char *pkv_tpl_source(pkv_tpl t);

/* A chat template ready to render requests (chat-template.c over jinja.c). */
typedef struct pkv_chat pkv_chat;
struct json_t;
/* Parse src and find what it does with its inputs (system role, content parts,
 * tool calls, object arguments), as llama.cpp does. bos/eos: the vocabulary's
 * BOS/EOS text (bos_token, eos_token); add_bos/add_eos: the tokenizer adds them,
 * so a rendered prompt's leading BOS / trailing EOS text is taken off. NULL with
 * a reason in err when the template does not parse. */
pkv_chat *pkv_chat_init(const char *src, size_t len, const char *bos, const char *eos, bool add_bos, bool add_eos,
                        char *err, size_t err_size);
/* pkv_chat_init over a model's vocabulary: its BOS/EOS text (special tokens
 * rendered; "" where it has none) and whether its tokenizer adds BOS. */
pkv_chat *pkv_chat_init_model(const pkv_model *m, const char *src, size_t len, char *err, size_t err_size);
void pkv_chat_free(pkv_chat *c);
/* Whether the template renders a system message (else llama.cpp's rule: the
 * first system text is joined to the next message). */
bool pkv_chat_system_role(const pkv_chat *c);
/* The template's Jinja source (NUL-terminated), e.g. for its tool-call markers. */
const char *pkv_chat_source(const pkv_chat *c);
/* Render a chat request body (messages, tools, add_generation_prompt,
 * continue_final_message, chat_template_kwargs, reasoning_effort) the way
 * llama.cpp's server does. now: the clock for dates (0 = now). Returns the
 * malloc'd prompt (*len bytes) and, when spans is not NULL, *n_spans sorted
 * [start, end) pairs in *spans that came from the request, for
 * pkv_model_tokenize_spans. NULL with *status (400, or 500 for out of memory)
 * and err: a template's raise_exception gives its own message. */
char *pkv_chat_apply(const pkv_chat *c, struct json_t *body, int64_t now, size_t *len, size_t **spans, size_t *n_spans,
                     int *status, char *err, size_t err_size);
/* The same within lim (jinja.h: time, work, memory, a shared memory budget, a
 * cancel callback; NULL = the interpreter's defaults). A limit reached is a 400
 * naming it, the shared budget spent a 503, a cancel 499. */
struct pkv_jinja_limits;
char *pkv_chat_apply_ex(const pkv_chat *c, struct json_t *body, int64_t now, const struct pkv_jinja_limits *lim, size_t *len,
                        size_t **spans, size_t *n_spans, int *status, char *err, size_t err_size);
/* Texts that end an assistant turn in this family (special tokens); the server
 * stops on each that is one token of the vocabulary. NULL-terminated. */
const char *const *pkv_tpl_end_texts(pkv_tpl t);

/* ------------------------------------------------------------------ utf-8 */

/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8
 * sequence that could still be completed by more bytes. */
size_t pkv_utf8_stable(const char *s, size_t n);
/* s[0..n) with every invalid byte replaced by U+FFFD; malloc'd, *out_len set. */
char *pkv_utf8_sanitize(const char *s, size_t n, size_t *out_len);
/* True when s[0..n) is valid UTF-8 without NUL bytes. */
bool pkv_utf8_valid(const char *s, size_t n);

#endif
