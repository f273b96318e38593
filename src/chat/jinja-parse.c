/* The Jinja interpreter's parser: tokens to an AST, by recursive descent, nesting
 * bounded by MAX_NEST (pkv_jinja_parse, pkv_jinja_free). */
#include "chat/jinja-impl.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ parser */

typedef struct parser {
    jerr *j;
    arena *ar;
    tok *t;
    size_t n, i;
    int depth;
} parser;

static void *ps_alloc(parser *P, size_t n) {
    void *p = pkv_jj_arena_get(P->ar, n);
    if (!p) pkv_jj_fail_at(P->j, PKV_JINJA_ELIMIT, 0, 0, "the template needs more than 256 MiB to compile (the compile memory limit)");
    return p;
}

static tok *cur(parser *P) { return &P->t[P->i]; }
static tok *peek(parser *P, size_t k) { return &P->t[P->i + k < P->n ? P->i + k : P->n - 1]; }

static _Noreturn void ps_fail(parser *P, const tok *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void ps_fail(parser *P, const tok *k, const char *fmt, ...) {
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    pkv_jj_fail_at(P->j, PKV_JINJA_ESYNTAX, k->line, k->col, "%s", m);
}

static bool is_op(const tok *k, const char *op) { return k->t == T_OP && !strcmp(k->s, op); }
static bool is_name(const tok *k, const char *nm) { return k->t == T_NAME && !strcmp(k->s, nm); }

static bool accept_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) return false;
    P->i++;
    return true;
}
static bool accept_name(parser *P, const char *nm) {
    if (!is_name(cur(P), nm)) return false;
    P->i++;
    return true;
}

static const char *tok_text(const tok *k) {
    switch (k->t) {
    case T_NAME:
    case T_OP: return k->s;
    case T_STR: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    case T_CLOSE_EXPR: return "}}";
    case T_CLOSE_STMT: return "%}";
    case T_EOF: return "the end of the template";
    default: return "text";
    }
}

static void expect_op(parser *P, const char *op) {
    if (!accept_op(P, op)) ps_fail(P, cur(P), "'%s' expected, found '%s'", op, tok_text(cur(P)));
}

static const char *expect_ident(parser *P) {
    tok *k = cur(P);
    if (k->t != T_NAME) ps_fail(P, k, "a name expected, found '%s'", tok_text(k));
    P->i++;
    return k->s;
}

static node *mk(parser *P, int k, const tok *at) {
    node *n = ps_alloc(P, sizeof *n);
    n->k = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* n's height from its operands': an expression deeper than MAX_NEST (a chain
 * like a.b.b.b..., a[0][0]..., 1+1+1... or not not not...) is refused here, as
 * the evaluator walks it recursively */
static node *fin(parser *P, node *n) {
    int h = 0;
    const node *ch[4] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++)
        if (ch[i] && ch[i]->h > h) h = ch[i]->h;
    for (int i = 0; i < n->nv; i++)
        if (n->v[i] && n->v[i]->h > h) h = n->v[i]->h;
    for (int i = 0; i < n->nw; i++)
        if (n->w[i] && n->w[i]->h > h) h = n->w[i]->h;
    n->h = h + 1;
    if (n->h > MAX_NEST)
        pkv_jj_fail_at(P->j, PKV_JINJA_ESYNTAX, n->line, n->col, "expression nested deeper than %d (the template nesting limit)", MAX_NEST);
    return n;
}

static void nv_push(parser *P, nvec *a, node *x, const char *name) {
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 4;
        node **q = ps_alloc(P, (size_t)nc * sizeof *q);
        const char **qn = ps_alloc(P, (size_t)nc * sizeof *qn);
        if (a->n) {
            memcpy(q, a->v, (size_t)a->n * sizeof *q);
            memcpy(qn, a->names, (size_t)a->n * sizeof *qn);
        }
        a->v = q;
        a->names = qn;
        a->cap = nc;
    }
    a->v[a->n] = x;
    a->names[a->n] = name;
    a->n++;
}

static node *p_expr(parser *P);
static node *p_or(parser *P);
static node *p_unary(parser *P);

static jstr *lit_str(parser *P, const char *s, size_t n) {
    jstr *x = ps_alloc(P, sizeof *x);
    x->s = s;
    x->n = n;
    return x;
}

/* (args, kw=args): positional into n->v, keywords into n->w / n->kn */
static void p_args(parser *P, node *n) {
    nvec pos = {0}, kw = {0};
    if (!accept_op(P, ")")) {
        for (;;) {
            if (cur(P)->t == T_NAME && is_op(peek(P, 1), "=")) {
                const char *nm = cur(P)->s;
                P->i += 2;
                nv_push(P, &kw, p_expr(P), nm);
            } else {
                if (kw.n) ps_fail(P, cur(P), "a positional argument after a keyword argument");
                nv_push(P, &pos, p_expr(P), NULL);
            }
            if (accept_op(P, ")")) break;
            expect_op(P, ",");
            if (accept_op(P, ")")) break;
        }
    }
    n->v = pos.v;
    n->nv = pos.n;
    n->w = kw.v;
    n->kn = kw.names;
    n->nw = n->nkn = kw.n;
}

static node *p_primary(parser *P) {
    tok *k = cur(P);
    node *n;
    switch (k->t) {
    case T_STR: {
        /* adjacent literals concatenate, as in Python */
        size_t total = 0, j = P->i;
        while (P->t[j].t == T_STR) total += P->t[j++].n;
        char *buf = ps_alloc(P, total + 1);
        size_t o = 0;
        while (cur(P)->t == T_STR) {
            memcpy(buf + o, cur(P)->s, cur(P)->n);
            o += cur(P)->n;
            P->i++;
        }
        n = mk(P, N_LIT, k);
        n->lit.t = V_STR;
        n->lit.u.s = lit_str(P, buf, total);
        return n;
    }
    case T_INT:
        P->i++;
        n = mk(P, N_LIT, k);
        n->lit.t = V_INT;
        n->lit.u.i = k->i;
        return n;
    case T_FLOAT:
        P->i++;
        n = mk(P, N_LIT, k);
        n->lit.t = V_FLOAT;
        n->lit.u.f = k->f;
        return n;
    case T_NAME:
        P->i++;
        n = mk(P, N_LIT, k);
        if (!strcmp(k->s, "true") || !strcmp(k->s, "True")) {
            n->lit.t = V_BOOL;
            n->lit.u.b = true;
        } else if (!strcmp(k->s, "false") || !strcmp(k->s, "False")) {
            n->lit.t = V_BOOL;
        } else if (!strcmp(k->s, "none") || !strcmp(k->s, "None")) {
            n->lit.t = V_NONE;
        } else {
            n->k = N_NAME;
            n->name = k->s;
        }
        return n;
    case T_OP:
        if (is_op(k, "(")) {
            P->i++;
            if (accept_op(P, ")")) {
                n = mk(P, N_TUPLE, k);
                return n;
            }
            node *e = p_expr(P);
            if (is_op(cur(P), ",")) {
                nvec it = {0};
                nv_push(P, &it, e, NULL);
                while (accept_op(P, ",")) {
                    if (is_op(cur(P), ")")) break;
                    nv_push(P, &it, p_expr(P), NULL);
                }
                n = mk(P, N_TUPLE, k);
                n->v = it.v;
                n->nv = it.n;
                e = fin(P, n);
            }
            expect_op(P, ")");
            return e;
        }
        if (is_op(k, "[")) {
            P->i++;
            nvec it = {0};
            while (!accept_op(P, "]")) {
                nv_push(P, &it, p_expr(P), NULL);
                if (accept_op(P, "]")) break;
                expect_op(P, ",");
            }
            n = mk(P, N_LIST, k);
            n->v = it.v;
            n->nv = it.n;
            return fin(P, n);
        }
        if (is_op(k, "{")) {
            P->i++;
            nvec ks = {0}, vs = {0};
            while (!accept_op(P, "}")) {
                nv_push(P, &ks, p_expr(P), NULL);
                expect_op(P, ":");
                nv_push(P, &vs, p_expr(P), NULL);
                if (accept_op(P, "}")) break;
                expect_op(P, ",");
            }
            n = mk(P, N_DICT, k);
            n->v = ks.v;
            n->nv = ks.n;
            n->w = vs.v;
            n->nw = vs.n;
            return fin(P, n);
        }
        break;
    default: break;
    }
    ps_fail(P, k, "an expression expected, found '%s'", tok_text(k));
}

/* filter/test name with optional dotted parts and arguments */
static node *p_filter(parser *P, node *x, int kind) {
    tok *k = cur(P);
    node *f = mk(P, kind, k);
    f->a = x;
    f->name = expect_ident(P);
    if (accept_op(P, "(")) {
        p_args(P, f);
    } else if (kind == N_TEST) {
        /* "is divisibleby 3", "is sameas x": one argument without parentheses */
        tok *c = cur(P);
        bool arg = c->t == T_STR || c->t == T_INT || c->t == T_FLOAT ||
                   (c->t == T_NAME && !is_name(c, "and") && !is_name(c, "or") && !is_name(c, "else") &&
                    !is_name(c, "if") && !is_name(c, "in") && !is_name(c, "is") && !is_name(c, "not"));
        if (arg) {
            node *a = p_primary(P);
            f->v = ps_alloc(P, sizeof *f->v);
            f->v[0] = a;
            f->nv = 1;
        }
    }
    return fin(P, f);
}

static node *p_postfix(parser *P, node *x) {
    for (;;) {
        tok *k = cur(P);
        if (is_op(k, ".")) {
            P->i++;
            tok *nm = cur(P);
            node *n = mk(P, N_ATTR, k);
            n->a = x;
            if (nm->t == T_INT) {
                P->i++;
                n->k = N_INDEX;
                n->b = mk(P, N_LIT, nm);
                n->b->lit.t = V_INT;
                n->b->lit.u.i = nm->i;
            } else {
                n->name = expect_ident(P);
            }
            x = fin(P, n);
        } else if (is_op(k, "[")) {
            P->i++;
            node *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (is_op(cur(P), ":")) {
                    P->i++;
                    slice = true;
                    if (++np > 2) ps_fail(P, cur(P), "a slice takes at most 3 parts");
                    continue;
                }
                if (accept_op(P, "]")) break;
                if (parts[np]) ps_fail(P, cur(P), "']' expected");
                parts[np] = p_expr(P);
            }
            node *n = mk(P, slice ? N_SLICE : N_INDEX, k);
            n->a = x;
            if (slice) {
                n->b = parts[0];
                n->c = parts[1];
                n->d = parts[2];
            } else {
                if (!parts[0]) ps_fail(P, k, "an index expected");
                n->b = parts[0];
            }
            x = fin(P, n);
        } else if (is_op(k, "(")) {
            P->i++;
            node *n = mk(P, N_CALL, k);
            n->a = x;
            p_args(P, n);
            x = fin(P, n);
        } else if (is_op(k, "|")) {
            P->i++;
            x = p_filter(P, x, N_FILTER);
        } else if (is_name(k, "is")) {
            P->i++;
            bool neg = accept_name(P, "not");
            x = p_filter(P, x, N_TEST);
            x->neg = neg;
        } else {
            return x;
        }
    }
}

static node *p_unary(parser *P) {
    tok *k = cur(P);
    if (++P->depth > MAX_NEST) ps_fail(P, k, "expression nested deeper than %d (the template nesting limit)", MAX_NEST);
    node *n;
    if (is_op(k, "-") || is_op(k, "+")) {
        P->i++;
        n = mk(P, is_op(k, "-") ? N_NEG : N_POS, k);
        n->a = p_unary(P);
        fin(P, n);
    } else {
        n = p_postfix(P, p_primary(P));
    }
    P->depth--;
    return n;
}

static node *bin(parser *P, int kind, int op, node *a, node *b, const tok *k) {
    node *n = mk(P, kind, k);
    n->op = op;
    n->a = a;
    n->b = b;
    return fin(P, n);
}

static node *p_pow(parser *P) {
    node *a = p_unary(P);
    while (is_op(cur(P), "**")) {
        tok *k = cur(P);
        P->i++;
        a = bin(P, N_BIN, OP_POW, a, p_unary(P), k);
    }
    return a;
}

static node *p_mul(parser *P) {
    node *a = p_pow(P);
    for (;;) {
        tok *k = cur(P);
        int op = is_op(k, "*") ? OP_MUL : is_op(k, "/") ? OP_DIV : is_op(k, "//") ? OP_FDIV : is_op(k, "%") ? OP_MOD : -1;
        if (op < 0) return a;
        P->i++;
        a = bin(P, N_BIN, op, a, p_pow(P), k);
    }
}

static node *p_concat(parser *P) {
    node *a = p_mul(P);
    while (is_op(cur(P), "~")) {
        tok *k = cur(P);
        P->i++;
        a = bin(P, N_CONCAT, 0, a, p_mul(P), k);
    }
    return a;
}

static node *p_add(parser *P) {
    node *a = p_concat(P);
    for (;;) {
        tok *k = cur(P);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : -1;
        if (op < 0) return a;
        P->i++;
        a = bin(P, N_BIN, op, a, p_concat(P), k);
    }
}

static node *p_cmp(parser *P) {
    node *a = p_add(P);
    for (;;) {
        tok *k = cur(P);
        int op = is_op(k, "==") ? OP_EQ : is_op(k, "!=") ? OP_NE : is_op(k, "<") ? OP_LT : is_op(k, "<=") ? OP_LE
                 : is_op(k, ">") ? OP_GT : is_op(k, ">=") ? OP_GE : -1;
        if (op >= 0) {
            P->i++;
            a = bin(P, N_CMP, op, a, p_add(P), k);
        } else if (is_name(k, "in")) {
            P->i++;
            a = bin(P, N_IN, 0, a, p_add(P), k);
        } else if (is_name(k, "not") && is_name(peek(P, 1), "in")) {
            P->i += 2;
            a = bin(P, N_IN, 0, a, p_add(P), k);
            a->neg = true;
        } else {
            return a;
        }
    }
}

static node *p_not(parser *P) {
    tok *k = cur(P);
    if (is_name(k, "not")) {
        P->i++;
        if (++P->depth > MAX_NEST) ps_fail(P, k, "expression nested deeper than %d (the template nesting limit)", MAX_NEST);
        node *n = mk(P, N_NOT, k);
        n->a = p_not(P);
        fin(P, n);
        P->depth--;
        return n;
    }
    return p_cmp(P);
}

static node *p_and(parser *P) {
    node *a = p_not(P);
    while (is_name(cur(P), "and")) {
        tok *k = cur(P);
        P->i++;
        a = bin(P, N_AND, 0, a, p_not(P), k);
    }
    return a;
}

static node *p_or(parser *P) {
    node *a = p_and(P);
    while (is_name(cur(P), "or")) {
        tok *k = cur(P);
        P->i++;
        a = bin(P, N_OR, 0, a, p_and(P), k);
    }
    return a;
}

static node *p_expr(parser *P) {
    if (++P->depth > MAX_NEST) ps_fail(P, cur(P), "expression nested deeper than %d (the template nesting limit)", MAX_NEST);
    node *a = p_or(P);
    while (is_name(cur(P), "if")) {
        tok *k = cur(P);
        P->i++;
        node *n = mk(P, N_COND, k);
        n->b = a;
        n->a = p_or(P);
        if (accept_name(P, "else")) n->c = p_expr(P);
        a = fin(P, n);
    }
    P->depth--;
    return a;
}

/* an expression that may be an unparenthesised tuple: "a, b" */
static node *p_tuple_expr(parser *P) {
    tok *k = cur(P);
    node *e = p_expr(P);
    if (!is_op(cur(P), ",")) return e;
    nvec it = {0};
    nv_push(P, &it, e, NULL);
    while (accept_op(P, ",")) nv_push(P, &it, p_expr(P), NULL);
    node *n = mk(P, N_TUPLE, k);
    n->v = it.v;
    n->nv = it.n;
    return fin(P, n);
}

static void expect_close(parser *P) {
    if (cur(P)->t != T_CLOSE_STMT) ps_fail(P, cur(P), "'%%}' expected, found '%s'", tok_text(cur(P)));
    P->i++;
}

/* statements until one of the end names ("endif", "elif", ...); the name found
 * is left as the current token, after its "{%" */
static node *p_body(parser *P, const char *const *ends, const char **found);

static node *p_stmt(parser *P, tok *open) {
    tok *k = cur(P);
    if (k->t != T_NAME) ps_fail(P, k, "a statement name expected, found '%s'", tok_text(k));
    const char *kw = k->s;
    P->i++;
    if (!strcmp(kw, "if")) {
        node *n = mk(P, S_IF, k);
        n->a = p_expr(P);
        expect_close(P);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        const char *f;
        n->b = p_body(P, ends, &f);
        node *tail = n;
        while (!strcmp(f, "elif")) {
            tok *ek = cur(P);
            P->i++;
            node *e = mk(P, S_IF, ek);
            e->a = p_expr(P);
            expect_close(P);
            e->b = p_body(P, ends, &f);
            tail->c = e;
            tail = e;
        }
        if (!strcmp(f, "else")) {
            P->i++;
            expect_close(P);
            static const char *const endif[] = {"endif", NULL};
            tail->c = p_body(P, endif, &f);
        }
        P->i++;
        expect_close(P);
        return n;
    }
    if (!strcmp(kw, "for")) {
        node *n = mk(P, S_FOR, k);
        nvec names = {0};
        do {
            accept_op(P, "(");
            nv_push(P, &names, NULL, expect_ident(P));
            accept_op(P, ")");
        } while (accept_op(P, ","));
        n->kn = names.names;
        n->nkn = names.n;
        if (!accept_name(P, "in")) ps_fail(P, cur(P), "'in' expected in a for loop");
        /* the iterable stops before "if" (the loop filter), so no ternary here */
        n->a = p_or(P);
        if (accept_name(P, "if")) n->b = p_expr(P);
        accept_name(P, "recursive");
        expect_close(P);
        static const char *const ends[] = {"else", "endfor", NULL};
        const char *f;
        n->c = p_body(P, ends, &f);
        if (!strcmp(f, "else")) {
            P->i++;
            expect_close(P);
            static const char *const endfor[] = {"endfor", NULL};
            n->d = p_body(P, endfor, &f);
        }
        P->i++;
        expect_close(P);
        return n;
    }
    if (!strcmp(kw, "set")) {
        tok *tk = cur(P);
        node *target;
        nvec names = {0};
        const char *first = expect_ident(P);
        if (is_op(cur(P), ".")) {
            P->i++;
            target = mk(P, N_ATTR, tk);
            target->a = mk(P, N_NAME, tk);
            target->a->name = first;
            target->name = expect_ident(P);
        } else {
            nv_push(P, &names, NULL, first);
            while (accept_op(P, ",")) nv_push(P, &names, NULL, expect_ident(P));
            target = mk(P, N_NAME, tk);
            target->name = first;
        }
        if (cur(P)->t == T_CLOSE_STMT && target->k == N_NAME && names.n == 1) {
            P->i++;
            node *n = mk(P, S_SETBLOCK, k);
            n->name = first;
            static const char *const ends[] = {"endset", NULL};
            const char *f;
            n->b = p_body(P, ends, &f);
            P->i++;
            expect_close(P);
            return n;
        }
        expect_op(P, "=");
        node *n = mk(P, S_SET, k);
        n->a = target;
        n->kn = names.names;
        n->nkn = names.n;
        n->b = p_tuple_expr(P);
        expect_close(P);
        return n;
    }
    if (!strcmp(kw, "macro")) {
        node *n = mk(P, S_MACRO, k);
        n->name = expect_ident(P);
        expect_op(P, "(");
        nvec ps = {0};
        while (!accept_op(P, ")")) {
            const char *pn = expect_ident(P);
            node *def = NULL;
            if (accept_op(P, "=")) def = p_expr(P);
            nv_push(P, &ps, def, pn);
            if (accept_op(P, ")")) break;
            expect_op(P, ",");
        }
        n->w = ps.v;
        n->kn = ps.names;
        n->nw = n->nkn = ps.n;
        expect_close(P);
        static const char *const ends[] = {"endmacro", NULL};
        const char *f;
        n->b = p_body(P, ends, &f);
        P->i++;
        if (cur(P)->t == T_NAME) P->i++; /* {% endmacro name %} */
        expect_close(P);
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        expect_close(P);
        return mk(P, kw[0] == 'b' ? S_BREAK : S_CONTINUE, k);
    }
    if (!strcmp(kw, "do")) {
        node *n = mk(P, S_DO, k);
        n->a = p_expr(P);
        expect_close(P);
        return n;
    }
    if (!strcmp(kw, "filter")) {
        node *n = mk(P, S_FILTERBLOCK, k);
        node *ph = mk(P, N_LIT, k); /* placeholder for the body's text */
        node *f = p_filter(P, ph, N_FILTER);
        while (accept_op(P, "|")) f = p_filter(P, f, N_FILTER);
        n->a = f;
        n->c = ph;
        expect_close(P);
        static const char *const ends[] = {"endfilter", NULL};
        const char *fd;
        n->b = p_body(P, ends, &fd);
        P->i++;
        expect_close(P);
        return n;
    }
    if (!strcmp(kw, "generation")) { /* HF's assistant-mask marker: renders its body */
        expect_close(P);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *f;
        node *b = p_body(P, ends, &f);
        P->i++;
        expect_close(P);
        return b;
    }
    if (!strcmp(kw, "call")) {
        node *n = mk(P, S_CALLBLOCK, k);
        if (accept_op(P, "(")) { /* {% call(args) macro(...) %}: caller arguments are not supported */
            ps_fail(P, k, "'call' with caller arguments is not supported");
        }
        n->a = p_expr(P);
        if (n->a->k != N_CALL) ps_fail(P, k, "'call' needs a macro call");
        expect_close(P);
        static const char *const ends[] = {"endcall", NULL};
        const char *f;
        n->b = p_body(P, ends, &f);
        P->i++;
        expect_close(P);
        return n;
    }
    (void)open;
    ps_fail(P, k, "unknown statement '%s'", kw);
}

static node *p_body(parser *P, const char *const *ends, const char **found) {
    tok *start = cur(P);
    nvec items = {0};
    for (;;) {
        tok *k = cur(P);
        if (k->t == T_EOF) {
            if (!ends) break;
            ps_fail(P, start, "'%s' expected before the end of the template (the block opened here)", ends[0]);
        }
        if (k->t == T_TEXT) {
            node *n = mk(P, S_TEXT, k);
            n->lit.t = V_STR;
            n->lit.u.s = lit_str(P, k->s, k->n);
            nv_push(P, &items, n, NULL);
            P->i++;
        } else if (k->t == T_COMMENT) {
            P->i++;
        } else if (k->t == T_OPEN_EXPR) {
            P->i++;
            node *n = mk(P, S_OUT, k);
            n->a = p_tuple_expr(P);
            if (cur(P)->t != T_CLOSE_EXPR) ps_fail(P, cur(P), "'}}' expected, found '%s'", tok_text(cur(P)));
            P->i++;
            nv_push(P, &items, n, NULL);
        } else if (k->t == T_OPEN_STMT) {
            tok *nm = peek(P, 1);
            if (ends && nm->t == T_NAME)
                for (int e = 0; ends[e]; e++)
                    if (!strcmp(nm->s, ends[e])) {
                        P->i++;
                        *found = ends[e];
                        goto done;
                    }
            if (nm->t == T_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "elif") || !strcmp(nm->s, "else")))
                ps_fail(P, nm, "unexpected '%s'%s%s", nm->s, ends ? ", expected " : "", ends ? ends[0] : "");
            P->i++;
            if (++P->depth > MAX_NEST) ps_fail(P, k, "blocks nested deeper than %d (the template nesting limit)", MAX_NEST);
            nv_push(P, &items, p_stmt(P, k), NULL);
            P->depth--;
        } else {
            ps_fail(P, k, "unexpected '%s'", tok_text(k));
        }
    }
done:;
    node *b = mk(P, S_BODY, start);
    b->v = items.v;
    b->nv = items.n;
    return b;
}

pkv_jinja *pkv_jinja_parse(const char *src, size_t len_, pkv_jinja_error *e) {
    memset(e, 0, sizeof *e);
    const size_t len = len_;
    pkv_jinja *volatile t = calloc(1, sizeof *t);
    if (!t) {
        e->kind = PKV_JINJA_ENOMEM;
        snprintf(e->msg, sizeof e->msg, "out of memory");
        return NULL;
    }
    t->ar.limit = COMPILE_MEMORY;
    jerr j;
    j.e = e;
    lexer L = {.j = &j, .owner = t, .ar = &t->ar, .src = src, .len = len};
    parser P = {.j = &j, .ar = &t->ar};
    if (setjmp(j.jb)) {
        pkv_jinja_free(t);
        return NULL;
    }
    if (memchr(src, 0, len)) {
        size_t at = (size_t)((const char *)memchr(src, 0, len) - src);
        pkv_jj_lex_fail(&L, at, "a NUL byte in the template");
    }
    pkv_jj_lex(&L);
    P.t = L.toks;
    P.n = L.n;
    t->root = p_body(&P, NULL, NULL);
    free(t->toks); /* the tree keeps no token */
    t->toks = NULL;
    return t;
}

void pkv_jinja_free(pkv_jinja *t) {
    if (!t) return;
    free(t->toks);
    pkv_jj_arena_free(&t->ar);
    free(t);
}
