/* A small Jinja interpreter for chat templates (tokenizer.chat_template): the
 * subset real model templates use, with the whitespace rules Hugging Face
 * configures (trim_blocks, lstrip_blocks) and llama.cpp's renderings where it
 * differs from Python's Jinja2 (float printing, lenient undefined attributes).
 * Internal to src/chat/ (jinja*.c over jinja-impl.h); the chat layer over it is
 * chat-template.c (chat.h).
 *
 * Every string keeps the byte ranges that came from the render context (the
 * request: messages, tools, kwargs) through concatenation, slicing and joins, so
 * the rendered text comes with the spans the tokenizer must read as plain text
 * (pkv_model_tokenize_spans): only the template's own text makes special tokens.
 *
 * Parsing is linear in the template's size and expressions and blocks nest at
 * most 200 deep (a syntax error naming the line), so a hostile template fails
 * fast at load. A render is bounded (steps, work, wall-clock time, output bytes,
 * memory, call depth, and optionally a memory budget shared by concurrent
 * renders and a cancel callback): a hostile template fails with an error naming
 * the limit, never hangs or exhausts memory.
 * All of a render's memory is one arena freed at its end, so an error anywhere
 * leaks nothing. */
#ifndef PKV_JINJA_H
#define PKV_JINJA_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pkv_jinja pkv_jinja;

typedef enum pkv_jinja_err {
    PKV_JINJA_OK = 0,
    PKV_JINJA_ESYNTAX,  /* the template does not parse */
    PKV_JINJA_ERUNTIME, /* evaluation failed (a type error, an unknown filter...) */
    PKV_JINJA_ERAISE,   /* the template called raise_exception(msg): msg is the message */
    PKV_JINJA_ELIMIT,   /* a limit was reached (named in the message) */
    PKV_JINJA_ENOMEM,
    PKV_JINJA_EBUDGET,  /* the shared memory budget (pkv_jinja_limits.shared) is spent: retry later */
    PKV_JINJA_ECANCEL,  /* pkv_jinja_limits.cancel said stop */
} pkv_jinja_err;

/* Memory shared by concurrent renders (a server's budget): each render's arena
 * is charged to it while the render runs. */
typedef struct pkv_jinja_budget {
    _Atomic size_t used;
    size_t limit; /* bytes; 0 = unlimited (only counted) */
} pkv_jinja_budget;

typedef struct pkv_jinja_error {
    pkv_jinja_err kind;
    int line, col;  /* where in the template (1-based); 0 when not known */
    char msg[512];  /* "line L, column C: ..." except for ERAISE: the template's own text */
} pkv_jinja_error;

typedef struct pkv_jinja_limits {
    int64_t max_steps;  /* statements, loop iterations and calls per render; 0 = 10 million */
    size_t max_output;  /* bytes of rendered text; 0 = 64 MiB */
    size_t max_memory;  /* bytes of the render's arena; 0 = 512 MiB */
    int max_depth;      /* nested macro calls and expression depth; 0 = 200 */
    int64_t max_work;   /* work units: bytes scanned, compared or copied by string, list and
                         * dict operations, plus 16 per step; 0 = 1 Gi (about a second of a core) */
    int64_t max_time_ms; /* wall-clock time of the render; 0 = 10000 */
    bool (*cancel)(void *ud); /* polled during the render (about every MiB of work): true stops it */
    void *cancel_ud;
    pkv_jinja_budget *shared; /* NULL = none */
} pkv_jinja_limits;

/* Parse a template. NULL with *e set on a syntax error (or out of memory). */
pkv_jinja *pkv_jinja_parse(const char *src, size_t len, pkv_jinja_error *e);
void pkv_jinja_free(pkv_jinja *t);

/* Value-use probe flags for pkv_jinja_render's probe (llama.cpp's template
 * capability analysis watches which inputs a template touches). */
enum {
    PKV_JINJA_USED = 1,       /* read: attribute, index, test, filter or loop */
    PKV_JINJA_OP_STRING = 2,  /* tested with "is string" */
    PKV_JINJA_OP_ARRAY = 4,   /* iterated, indexed by number or given to selectattr */
};

typedef struct pkv_jinja_probe {
    const char *const *paths; /* "messages.0.content": keys and indexes split by dots */
    int n_paths;
    unsigned *flags;          /* [n_paths], out */
} pkv_jinja_probe;

/* Render with ctx (a JSON object: its members are the template's variables).
 * data: the strings of ctx count as data (spans), but for its members bos_token and
 * eos_token (the model's markup). now: strftime_now's clock (0 =
 * the current time). Returns the malloc'd text (NUL-terminated; *len its length)
 * and, when spans is not NULL, *n_spans sorted pairs [start, end) of bytes that
 * came from ctx strings (malloc'd). probe may be NULL. NULL with *e set (and
 * *spans NULL) on error. */
char *pkv_jinja_render(const pkv_jinja *t, json_t *ctx, bool data, int64_t now, const pkv_jinja_limits *lim,
                       size_t *len, size_t **spans, size_t *n_spans, pkv_jinja_probe *probe, pkv_jinja_error *e);

#endif
