/* A small Jinja interpreter for chat templates: lexer, parser to an AST and a
 * tree-walking evaluator (see jinja.h for the contract). Semantics follow
 * Python's Jinja2 as Hugging Face configures it for chat templates, and
 * llama.cpp's own interpreter where the two differ and llama.cpp's rendering is
 * what a client compares against (float text, undefined attributes, tojson).
 *
 * Errors inside the parser and the evaluator longjmp to the entry point: every
 * allocation of a parse lives in the template's arena and every allocation of a
 * render in the render's arena, so nothing leaks on the way out.
 *
 * The interpreter is split by stage: jinja-lex.c, jinja-parse.c, jinja-eval.c and
 * jinja-builtins.c over jinja-impl.h; this file holds what they share: the arenas
 * and the error exit. */
#include "chat/jinja-impl.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pkv_jj_arena_free(arena *a) {
    for (achunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    if (a->shared) atomic_fetch_sub(&a->shared->used, a->total);
    a->head = NULL;
    a->total = 0;
}

/* NULL when the limit or malloc says no (the caller raises the error). */
void *pkv_jj_arena_get(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->limit && a->total + cap > a->limit) return NULL;
        if (a->shared && a->shared->limit) {
            size_t was = atomic_fetch_add(&a->shared->used, cap);
            if (was + cap > a->shared->limit) {
                atomic_fetch_sub(&a->shared->used, cap);
                a->shared_full = true;
                return NULL;
            }
        } else if (a->shared) {
            atomic_fetch_add(&a->shared->used, cap);
        }
        achunk *c = malloc(sizeof *c + cap);
        if (!c) {
            if (a->shared) atomic_fetch_sub(&a->shared->used, cap);
            return NULL;
        }
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->total += cap;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

_Noreturn void pkv_jj_fail_at(jerr *j, pkv_jinja_err kind, int line, int col, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    j->e->kind = kind;
    j->e->line = line;
    j->e->col = col;
    if (kind == PKV_JINJA_ERAISE)
        snprintf(j->e->msg, sizeof j->e->msg, "%s", m);
    else if (line > 0)
        snprintf(j->e->msg, sizeof j->e->msg, "line %d, column %d: %s", line, col, m);
    else
        snprintf(j->e->msg, sizeof j->e->msg, "%s", m);
    longjmp(j->jb, 1);
}
