/* A small Jinja interpreter for chat templates: lexer, parser to an AST and a
 * tree-walking evaluator (see jinja.h for the contract). Semantics follow
 * Python's Jinja2 as Hugging Face configures it for chat templates, and
 * llama.cpp's own interpreter where the two differ and llama.cpp's rendering is
 * what a client compares against (float text, undefined attributes, tojson).
 *
 * Errors inside the parser and the evaluator longjmp to the entry point: every
 * allocation of a parse lives in the template's arena and every allocation of a
 * render in the render's arena, so nothing leaks on the way out. */
#include "chat/jinja.h"

#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* expressions and blocks nest at most this deep (the parser's limit) */
#define MAX_NEST 200

/* ------------------------------------------------------------------ arena */

typedef struct achunk {
    struct achunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
} achunk;

typedef struct arena {
    achunk *head;
    size_t total, limit;
    pkv_jinja_budget *shared; /* also charged to this budget (concurrent renders) */
    bool shared_full;         /* the last NULL came from the shared budget */
} arena;

static void arena_free(arena *a) {
    for (achunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    if (a->shared) atomic_fetch_sub(&a->shared->used, a->total);
    a->head = NULL;
    a->total = 0;
}

/* NULL when the limit or malloc says no (the caller raises the error). */
static void *arena_get(arena *a, size_t n) {
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

/* ------------------------------------------------------------------ values */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC };

typedef struct jstr jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct node node;

typedef struct jv {
    int t;
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d; /* V_DICT, V_NS */
        const node *m; /* V_MACRO */
        struct jfunc *fn;
    } u;
} jv;

struct jstr {
    const char *s;
    size_t n;
    size_t *sp;   /* [2 * nsp]: data ranges [start, end), sorted, inside [0, n) */
    size_t nsp;
    unsigned flags;
};

struct jlist {
    jv *a;
    size_t n, cap;
    bool tuple;
    unsigned flags;
};

struct jdict {
    jv *k, *v;
    size_t n, cap;
    unsigned flags;
};

typedef struct jfunc {
    const char *name; /* builtin: a global function or a method */
    jv self;          /* bound receiver of a method; V_UNDEF for globals */
} jfunc;

static const jv UNDEF = {V_UNDEF, {0}};
static const jv NONE = {V_NONE, {0}};

/* ------------------------------------------------------------------ AST */

enum {
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_INDEX, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BIN, N_CMP, N_IN, N_COND, N_CONCAT,
    /* statements */
    S_BODY, S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_BREAK, S_CONTINUE, S_DO, S_FILTERBLOCK,
    S_CALLBLOCK,
};

struct node {
    int k, op, line, col;
    int h;               /* expressions: height of the subtree (bounded by MAX_NEST) */
    bool neg;            /* N_TEST, N_IN: "not" */
    node *a, *b, *c, *d; /* operands, or: S_IF cond/body/else, S_FOR iter/cond/body/else */
    node **v;            /* list items, call args, body statements, dict keys */
    node **w;            /* dict values, kwarg values */
    const char **kn;     /* kwarg names (N_CALL, N_FILTER, N_TEST), loop/set/macro names */
    int nv, nw, nkn;
    const char *name;    /* N_NAME, N_ATTR, N_FILTER, N_TEST, S_MACRO, S_SET target */
    jv lit;              /* N_LIT */
};

/* binary operators (N_BIN, N_CMP) */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE };

struct pkv_jinja {
    arena ar;
    node *root;
    void *toks; /* the lexer's tokens (malloc'd, outside the arena) while parsing */
};

/* what a template may take to compile: its arena, and its tokens apart */
#define COMPILE_MEMORY ((size_t)256 << 20)

/* ------------------------------------------------------------------ errors */

typedef struct jerr {
    jmp_buf jb;
    pkv_jinja_error *e;
} jerr;

static _Noreturn void fail_at(jerr *j, pkv_jinja_err kind, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static _Noreturn void fail_at(jerr *j, pkv_jinja_err kind, int line, int col, const char *fmt, ...) {
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

/* ------------------------------------------------------------------ lexer */

enum { T_TEXT, T_COMMENT, T_OPEN_EXPR, T_CLOSE_EXPR, T_OPEN_STMT, T_CLOSE_STMT, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
    int t, line, col;
    const char *s; /* T_TEXT/T_NAME/T_STR/T_OP: the text (NUL-terminated, in the arena) */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct lexer {
    jerr *j;
    struct pkv_jinja *owner; /* owner->toks: the token array, freed on any exit */
    arena *ar;
    const char *src;
    size_t len, pos;
    tok *toks;
    size_t n, cap;
    size_t wpos; /* where() has counted lines up to here */
    int wline, wcol;
} lexer;

static void *lx_alloc(lexer *L, size_t n) {
    void *p = arena_get(L->ar, n);
    if (!p) fail_at(L->j, PKV_JINJA_ELIMIT, 0, 0, "the template needs more than 256 MiB to compile (the compile memory limit)");
    return p;
}

/* Line and column of src[pos]: counted on from the last position asked for
 * (tokens come in order), so lexing stays linear in the template's size; a
 * position before it (an error's start) counts again from the beginning. */
static void where(lexer *L, size_t pos, int *line, int *col) {
    if (pos < L->wpos || !L->wline) {
        L->wpos = 0;
        L->wline = L->wcol = 1;
    }
    const char *s = L->src;
    int l = L->wline, c = L->wcol;
    size_t i = L->wpos;
    while (i < pos) {
        const char *nl = memchr(s + i, '\n', pos - i);
        if (!nl) {
            size_t add = pos - i;
            c = add > (size_t)(INT32_MAX - c) ? INT32_MAX : c + (int)add;
            break;
        }
        if (l < INT32_MAX) l++;
        c = 1;
        i = (size_t)(nl - s) + 1;
    }
    L->wpos = pos;
    L->wline = l;
    L->wcol = c;
    *line = l;
    *col = c;
}

static tok *lx_push(lexer *L, int t, size_t at) {
    if (L->n == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        if (nc * sizeof(tok) > COMPILE_MEMORY)
            fail_at(L->j, PKV_JINJA_ELIMIT, 0, 0, "the template has too many tokens to compile in 256 MiB (the compile memory limit)");
        tok *q = realloc(L->toks, nc * sizeof *q);
        if (!q) fail_at(L->j, PKV_JINJA_ENOMEM, 0, 0, "out of memory parsing the template");
        L->toks = q;
        L->owner->toks = q;
        L->cap = nc;
    }
    tok *k = &L->toks[L->n++];
    memset(k, 0, sizeof *k);
    k->t = t;
    where(L, at, &k->line, &k->col);
    return k;
}

static char *lx_copy(lexer *L, const char *s, size_t n) {
    char *p = lx_alloc(L, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static bool next_is(const lexer *L, size_t n, const char *chars) {
    if (L->pos + n >= L->len) return false;
    return strchr(chars, L->src[L->pos + n]) != NULL && L->src[L->pos + n] != 0;
}

static _Noreturn void lx_fail(lexer *L, size_t at, const char *msg) {
    int line, col;
    where(L, at, &line, &col);
    fail_at(L->j, PKV_JINJA_ESYNTAX, line, col, "%s", msg);
}

/* Text between tags, with HF's whitespace rules: lstrip_blocks (spaces before a
 * block tag on its line), trim_blocks (one newline after a block tag) and the
 * explicit '-' markers. */
static void lx_text(lexer *L) {
    const char *s = L->src;
    size_t pos = L->pos, start = pos;
    bool rstrip_prev = false, can_rm_nl = false;
    if (pos > 3) {
        char c0 = s[pos - 3], c1 = s[pos - 2], c2 = s[pos - 1];
        rstrip_prev = c0 == '-' && (c1 == '%' || c1 == '}' || c1 == '#') && c2 == '}';
        can_rm_nl = (c1 == '#' || c1 == '%' || c1 == '-') && c2 == '}';
    }
    while (L->pos < L->len && !(s[L->pos] == '{' && next_is(L, 1, "%{#"))) L->pos++;
    size_t end = L->pos;
    if (L->pos < L->len && s[L->pos] == '{' && next_is(L, 1, "%#-")) {
        size_t cur = end;
        while (cur > start) {
            char c = s[cur - 1];
            if (cur == 1) {
                end = 0;
                break;
            }
            if (c == '\n') {
                end = cur;
                break;
            }
            if (!isspace((unsigned char)c)) break;
            cur--;
        }
    }
    size_t a = start, b = end > start ? end : start;
    if (can_rm_nl && b > a && s[a] == '\n') a++;
    if (rstrip_prev)
        while (a < b && strchr(" \t\r\n", s[a])) a++;
    bool lstrip_cur = L->pos < L->len && s[L->pos] == '{' && next_is(L, 1, "{%#") && next_is(L, 2, "-");
    if (lstrip_cur)
        while (b > a && strchr(" \t\r\n", s[b - 1])) b--;
    if (b > a) {
        tok *k = lx_push(L, T_TEXT, start);
        k->s = lx_copy(L, s + a, b - a);
        k->n = b - a;
    }
}

static void lx_string(lexer *L) {
    const char *s = L->src;
    size_t at = L->pos;
    char q = s[L->pos++];
    size_t end = L->pos; /* the closing quote: the copy needs at most end - pos bytes */
    while (end < L->len && s[end] != q) end += s[end] == '\\' ? 2 : 1;
    if (end >= L->len) lx_fail(L, at, "unterminated string");
    char *out = lx_alloc(L, end - L->pos + 1);
    size_t n = 0;
    for (;;) {
        if (L->pos >= L->len) lx_fail(L, at, "unterminated string");
        char c = s[L->pos++];
        if (c == q) break;
        if (c == '\\' && L->pos < L->len) {
            char e = s[L->pos++];
            switch (e) {
            case 'n': out[n++] = '\n'; break;
            case 't': out[n++] = '\t'; break;
            case 'r': out[n++] = '\r'; break;
            case 'b': out[n++] = '\b'; break;
            case 'f': out[n++] = '\f'; break;
            case '\\': out[n++] = '\\'; break;
            case '\'': out[n++] = '\''; break;
            case '"': out[n++] = '"'; break;
            case '\n': break;
            default:
                out[n++] = '\\';
                out[n++] = e;
            }
            continue;
        }
        out[n++] = c;
    }
    out[n] = 0;
    tok *k = lx_push(L, T_STR, at);
    k->s = out;
    k->n = n;
}

static void lx_tag(lexer *L, bool expr) {
    const char *s = L->src;
    int depth = 0; /* brackets open inside the tag: '}}' there closes a dict */
    for (;;) {
        while (L->pos < L->len && isspace((unsigned char)s[L->pos])) L->pos++;
        if (L->pos >= L->len) lx_fail(L, L->len, expr ? "'}}' expected before the end of the template" : "'%}' expected before the end of the template");
        size_t at = L->pos;
        char c = s[at];
        if (depth == 0) {
            size_t p = at;
            if (c == '-' && p + 2 < L->len && s[p + 2] == '}' && (s[p + 1] == '}' || s[p + 1] == '%')) p++;
            else if (c == '+' && p + 2 < L->len && s[p + 2] == '}' && s[p + 1] == '%') p++;
            if (p + 1 < L->len && s[p + 1] == '}' && (s[p] == '}' || s[p] == '%')) {
                if ((s[p] == '}') != expr) lx_fail(L, at, expr ? "'}}' expected, found '%}'" : "'%}' expected, found '}}'");
                lx_push(L, expr ? T_CLOSE_EXPR : T_CLOSE_STMT, at);
                L->pos = p + 2;
                return;
            }
        }
        if (c == '\'' || c == '"') {
            lx_string(L);
        } else if (isdigit((unsigned char)c)) {
            size_t p = at;
            bool fl = false;
            while (p < L->len && (isdigit((unsigned char)s[p]) || s[p] == '_')) p++;
            if (p + 1 < L->len && s[p] == '.' && isdigit((unsigned char)s[p + 1])) {
                fl = true;
                p++;
                while (p < L->len && isdigit((unsigned char)s[p])) p++;
            }
            if (p < L->len && (s[p] == 'e' || s[p] == 'E')) {
                size_t q = p + 1;
                if (q < L->len && (s[q] == '+' || s[q] == '-')) q++;
                if (q < L->len && isdigit((unsigned char)s[q])) {
                    fl = true;
                    p = q;
                    while (p < L->len && isdigit((unsigned char)s[p])) p++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t i = at; i < p && m < sizeof buf - 1; i++)
                if (s[i] != '_') buf[m++] = s[i];
            buf[m] = 0;
            tok *k = lx_push(L, fl ? T_FLOAT : T_INT, at);
            if (fl) k->f = strtod(buf, NULL);
            else k->i = (int64_t)strtoll(buf, NULL, 10);
            L->pos = p;
        } else if (isalpha((unsigned char)c) || c == '_') {
            size_t p = at;
            while (p < L->len && (isalnum((unsigned char)s[p]) || s[p] == '_')) p++;
            tok *k = lx_push(L, T_NAME, at);
            k->s = lx_copy(L, s + at, p - at);
            k->n = p - at;
            L->pos = p;
        } else {
            static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
            size_t m = 1;
            for (size_t i = 0; i < sizeof two / sizeof two[0]; i++)
                if (at + 1 < L->len && s[at] == two[i][0] && s[at + 1] == two[i][1]) m = 2;
            if (m == 1 && !strchr("+-*/%~<>=()[]{}.,:|", c)) lx_fail(L, at, "unexpected character in a tag");
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            static const char ops1[] = "+-*/%~<>=()[]{}.,:|";
            static const char *const one[] = {"+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")",
                                              "[", "]", "{", "}", ".", ",", ":", "|"};
            tok *k = lx_push(L, T_OP, at);
            if (m == 2) {
                for (size_t i = 0; i < sizeof two / sizeof two[0]; i++)
                    if (s[at] == two[i][0] && s[at + 1] == two[i][1]) k->s = two[i];
            } else {
                k->s = one[strchr(ops1, c) - ops1]; /* an operator's text is shared, not copied */
            }
            k->n = m;
            L->pos = at + m;
        }
    }
}

static void lex(lexer *L) {
    const char *s = L->src;
    int last = T_CLOSE_STMT;
    while (L->pos < L->len) {
        if (last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT) {
            size_t before = L->n;
            lx_text(L);
            last = T_TEXT;
            if (L->n != before) continue;
            if (L->pos >= L->len) break;
        }
        size_t at = L->pos;
        if (s[at] == '{' && next_is(L, 1, "#")) {
            size_t p = at + 2;
            while (p + 1 < L->len && !(s[p] == '#' && s[p + 1] == '}')) p++;
            if (p + 1 >= L->len) lx_fail(L, at, "unterminated comment");
            lx_push(L, T_COMMENT, at);
            L->pos = p + 2;
            last = T_COMMENT;
            continue;
        }
        bool expr = s[at + 1] == '{';
        lx_push(L, expr ? T_OPEN_EXPR : T_OPEN_STMT, at);
        L->pos = at + 2;
        if (L->pos < L->len && (s[L->pos] == '-' || s[L->pos] == '+')) L->pos++;
        lx_tag(L, expr);
        last = expr ? T_CLOSE_EXPR : T_CLOSE_STMT;
    }
    lx_push(L, T_EOF, L->len);
}


/* ------------------------------------------------------------------ parser */

typedef struct parser {
    jerr *j;
    arena *ar;
    tok *t;
    size_t n, i;
    int depth;
} parser;

static void *ps_alloc(parser *P, size_t n) {
    void *p = arena_get(P->ar, n);
    if (!p) fail_at(P->j, PKV_JINJA_ELIMIT, 0, 0, "the template needs more than 256 MiB to compile (the compile memory limit)");
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
    fail_at(P->j, PKV_JINJA_ESYNTAX, k->line, k->col, "%s", m);
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
        fail_at(P->j, PKV_JINJA_ESYNTAX, n->line, n->col, "expression nested deeper than %d (the template nesting limit)", MAX_NEST);
    return n;
}

/* growable node arrays during parsing */
typedef struct nvec {
    node **v;
    const char **names;
    int n, cap;
} nvec;

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
        lx_fail(&L, at, "a NUL byte in the template");
    }
    lex(&L);
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
    arena_free(&t->ar);
    free(t);
}

/* ------------------------------------------------------------------ evaluator */

typedef struct scope {
    struct scope *up;
    jdict *vars;
} scope;

/* A text being built, with its data spans (output, set blocks, macro calls, strings). */
typedef struct sink {
    char *p;
    size_t n, cap;
    size_t *sp;
    size_t nsp, capsp;
} sink;

typedef struct ev {
    jerr j;
    arena ar;
    int64_t steps, max_steps;
    int64_t work, max_work, next_poll; /* work units (see pkv_jinja_limits.max_work) */
    int64_t deadline_ms;               /* CLOCK_MONOTONIC milliseconds */
    int64_t max_time_ms;
    bool (*cancel)(void *ud);
    void *cancel_ud;
    size_t max_output;
    int depth, max_depth;
    scope *globals;
    int64_t now;
    int brk; /* 1: break, 2: continue pending */
    const node *at;
} ev;

static _Noreturn void E(ev *x, const node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void E(ev *x, const node *n, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!n) n = x->at;
    fail_at(&x->j, PKV_JINJA_ERUNTIME, n ? n->line : 0, n ? n->col : 0, "%s", m);
}

static _Noreturn void E_limit(ev *x, const char *what) {
    const node *n = x->at;
    fail_at(&x->j, PKV_JINJA_ELIMIT, n ? n->line : 0, n ? n->col : 0, "%s", what);
}

static void *al(ev *x, size_t n) {
    void *p = arena_get(&x->ar, n);
    if (!p && x->ar.shared_full) {
        const node *at = x->at;
        fail_at(&x->j, PKV_JINJA_EBUDGET, at ? at->line : 0, at ? at->col : 0,
                "the renders running now use all of the shared template memory budget (%zu MiB); try again later",
                x->ar.shared->limit >> 20);
    }
    if (!p) E_limit(x, "the template used more memory than the render limit allows");
    return p;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The clock and the cancel callback, looked at about every MiB of work. */
static void poll_stop(ev *x) {
    x->next_poll = x->work + ((int64_t)1 << 20);
    if (x->cancel && x->cancel(x->cancel_ud)) {
        const node *n = x->at;
        fail_at(&x->j, PKV_JINJA_ECANCEL, n ? n->line : 0, n ? n->col : 0, "the render was cancelled (the client went away?)");
    }
    if (now_ms() > x->deadline_ms) {
        char m[160];
        snprintf(m, sizeof m, "the template ran longer than the render time limit allows (%lld ms)", (long long)x->max_time_ms);
        E_limit(x, m);
    }
}

/* n units of work (bytes scanned, compared or copied): bounded by max_work, so a
 * render's time is bounded by what it does, not only by how many steps */
static void work(ev *x, size_t n) {
    x->work += n > (size_t)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)n;
    if (x->work > x->max_work) {
        char m[160];
        snprintf(m, sizeof m, "the template did more work than the render work limit allows (%lld units: bytes scanned or copied)",
                 (long long)x->max_work);
        E_limit(x, m);
    }
    if (x->work >= x->next_poll) poll_stop(x);
}

static void step(ev *x) {
    if (++x->steps > x->max_steps) E_limit(x, "the template ran more steps than the render limit allows (a loop that does not end?)");
    work(x, 16);
}

static void sk_reserve(ev *x, sink *s, size_t more) {
    if (s->n + more + 1 > x->max_output) E_limit(x, "the rendered text is longer than the output limit");
    if (s->n + more + 1 <= s->cap) return;
    size_t nc = (s->n + more + 1) * 2;
    if (nc < 64) nc = 64;
    char *q = al(x, nc);
    if (s->n) memcpy(q, s->p, s->n);
    s->p = q;
    s->cap = nc;
}

static void sk_span(ev *x, sink *s, size_t a, size_t b) {
    if (a >= b) return;
    if (s->nsp && s->sp[2 * s->nsp - 1] >= a) { /* adjoining or overlapping: extend */
        if (b > s->sp[2 * s->nsp - 1]) s->sp[2 * s->nsp - 1] = b;
        return;
    }
    if (s->nsp == s->capsp) {
        size_t nc = s->capsp ? s->capsp * 2 : 8;
        size_t *q = al(x, 2 * nc * sizeof *q);
        if (s->nsp) memcpy(q, s->sp, 2 * s->nsp * sizeof *q);
        s->sp = q;
        s->capsp = nc;
    }
    s->sp[2 * s->nsp] = a;
    s->sp[2 * s->nsp + 1] = b;
    s->nsp++;
}

static void sk_put(ev *x, sink *s, const char *p, size_t n) {
    if (!n) return;
    work(x, n);
    sk_reserve(x, s, n);
    memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = 0;
}

static void sk_cstr(ev *x, sink *s, const char *p) { sk_put(x, s, p, strlen(p)); }

static void sk_jstr(ev *x, sink *s, const jstr *t) {
    size_t base = s->n;
    work(x, t->nsp);
    sk_put(x, s, t->s, t->n);
    for (size_t i = 0; i < t->nsp; i++) sk_span(x, s, base + t->sp[2 * i], base + t->sp[2 * i + 1]);
}

static jstr *sk_str(ev *x, sink *s) {
    jstr *t = al(x, sizeof *t);
    t->s = s->p ? s->p : "";
    t->n = s->n;
    t->sp = s->sp;
    t->nsp = s->nsp;
    return t;
}

static jstr *mkstr(ev *x, const char *p, size_t n) {
    work(x, n);
    jstr *t = al(x, sizeof *t);
    char *c = al(x, n + 1);
    memcpy(c, p, n);
    t->s = c;
    t->n = n;
    return t;
}

/* p[a, b) of t, its spans clipped to the piece */
static jstr *substr(ev *x, const jstr *t, size_t a, size_t b) {
    if (a > b) a = b;
    jstr *r = al(x, sizeof *r);
    r->s = t->s + a;
    r->n = b - a;
    if (t->nsp) {
        work(x, t->nsp);
        r->sp = al(x, 2 * t->nsp * sizeof *r->sp);
        for (size_t i = 0; i < t->nsp; i++) {
            size_t s0 = t->sp[2 * i] > a ? t->sp[2 * i] : a, s1 = t->sp[2 * i + 1] < b ? t->sp[2 * i + 1] : b;
            if (s0 < s1) {
                r->sp[2 * r->nsp] = s0 - a;
                r->sp[2 * r->nsp + 1] = s1 - a;
                r->nsp++;
            }
        }
    }
    return r;
}

/* a string made from t by a transformation (upper, replace...): all data when
 * any of t was */
static jstr *derived(ev *x, const char *p, size_t n, bool data) {
    jstr *r = al(x, sizeof *r);
    r->s = p;
    r->n = n;
    if (data && n) {
        r->sp = al(x, 2 * sizeof *r->sp);
        r->sp[0] = 0;
        r->sp[1] = n;
        r->nsp = 1;
    }
    return r;
}

static jv vstr(jstr *s) {
    jv v = {V_STR, {0}};
    v.u.s = s;
    return v;
}

static jv vcstr(ev *x, const char *s) { return vstr(mkstr(x, s, strlen(s))); }
static jv vint(int64_t i) {
    jv v = {V_INT, {0}};
    v.u.i = i;
    return v;
}

static jv vfloat(double f) {
    jv v = {V_FLOAT, {0}};
    v.u.f = f;
    return v;
}

static jv vbool(bool b) {
    jv v = {V_BOOL, {0}};
    v.u.b = b;
    return v;
}

static jlist *mklist(ev *x, size_t cap) {
    jlist *l = al(x, sizeof *l);
    if (cap) {
        l->a = al(x, cap * sizeof *l->a);
        l->cap = cap;
    }
    return l;
}

static jv vlist(jlist *l) {
    jv v = {V_LIST, {0}};
    v.u.l = l;
    return v;
}
static void lpush(ev *x, jlist *l, jv e) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *q = al(x, nc * sizeof *q);
        if (l->n) memcpy(q, l->a, l->n * sizeof *q);
        l->a = q;
        l->cap = nc;
    }
    l->a[l->n++] = e;
}

static jdict *mkdict(ev *x) { return al(x, sizeof(jdict)); }
static jv vdict(jdict *d) {
    jv v = {V_DICT, {0}};
    v.u.d = d;
    return v;
}

static bool streq(const jstr *a, const char *b) { return a->n == strlen(b) && !memcmp(a->s, b, a->n); }

static bool eq(ev *x, const jv *a, const jv *b, int depth);

static long dfind(ev *x, const jdict *d, const jv *k) {
    work(x, d->n);
    for (size_t i = 0; i < d->n; i++)
        if (eq(x, &d->k[i], k, 0)) return (long)i;
    return -1;
}

static long dfind_c(ev *x, const jdict *d, const char *k) {
    work(x, d->n);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && streq(d->k[i].u.s, k)) return (long)i;
    return -1;
}

/* k is known not to be in d (a JSON object's keys) */
static void dappend(ev *x, jdict *d, jv k, jv v) {
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *qk = al(x, nc * sizeof *qk), *qv = al(x, nc * sizeof *qv);
        if (d->n) {
            memcpy(qk, d->k, d->n * sizeof *qk);
            memcpy(qv, d->v, d->n * sizeof *qv);
        }
        d->k = qk;
        d->v = qv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

static void dset(ev *x, jdict *d, jv k, jv v) {
    long i = dfind(x, d, &k);
    if (i >= 0) {
        d->v[i] = v;
        return;
    }
    dappend(x, d, k, v);
}

static void dset_c(ev *x, jdict *d, const char *k, jv v) { dset(x, d, vcstr(x, k), v); }

/* the use flags of a heap value (strings, lists, dicts) */
static unsigned *flags_of(const jv *v) {
    switch (v->t) {
    case V_STR: return &v->u.s->flags;
    case V_LIST: return &v->u.l->flags;
    case V_DICT:
    case V_NS: return &v->u.d->flags;
    default: return NULL;
    }
}
static void mark(const jv *v, unsigned f) {
    unsigned *p = flags_of(v);
    if (p) *p |= f;
}

static void mark_deep(const jv *v, int depth) {
    if (depth > 64) return;
    mark(v, PKV_JINJA_USED);
    if (v->t == V_LIST)
        for (size_t i = 0; i < v->u.l->n; i++) mark_deep(&v->u.l->a[i], depth + 1);
    if (v->t == V_DICT)
        for (size_t i = 0; i < v->u.d->n; i++) {
            mark_deep(&v->u.d->k[i], depth + 1);
            mark_deep(&v->u.d->v[i], depth + 1);
        }
}

static bool truthy(const jv *v) {
    switch (v->t) {
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0.0;
    case V_STR: return v->u.s->n != 0;
    case V_LIST: return v->u.l->n != 0;
    case V_DICT: return v->u.d->n != 0;
    case V_NS:
    case V_MACRO:
    case V_FUNC: return true;
    default: return false;
    }
}

static const char *tname(const jv *v) {
    static const char *const names[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict", "namespace", "macro", "function"};
    if (v->t == V_LIST && v->u.l->tuple) return "tuple";
    return names[v->t];
}

static bool isnum(const jv *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }
static double numf(const jv *v) { return v->t == V_FLOAT ? v->u.f : v->t == V_INT ? (double)v->u.i : v->t == V_BOOL ? v->u.b : 0; }
/* a float out of range (or NaN) saturates instead of an undefined conversion */
static int64_t f2i(double f) {
    if (f != f) return 0;
    if (f >= 9223372036854775807.0) return INT64_MAX;
    if (f <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)f;
}
static int64_t numi(const jv *v) { return v->t == V_INT ? v->u.i : v->t == V_FLOAT ? f2i(v->u.f) : v->t == V_BOOL ? v->u.b : 0; }

/* Integer arithmetic that would overflow 64 bits is an error naming the
 * operation (Python's ints would grow; a chat template has no use for that). */
static _Noreturn void E_ovf(ev *x, const node *n, const char *op) {
    E(x, n, "integer overflow in %s (the result does not fit in 64 bits)", op);
}
static int64_t ck_add(ev *x, const node *n, int64_t p, int64_t q, const char *op) {
    if ((q > 0 && p > INT64_MAX - q) || (q < 0 && p < INT64_MIN - q)) E_ovf(x, n, op);
    return p + q;
}
static int64_t ck_sub(ev *x, const node *n, int64_t p, int64_t q, const char *op) {
    if ((q < 0 && p > INT64_MAX + q) || (q > 0 && p < INT64_MIN + q)) E_ovf(x, n, op);
    return p - q;
}
static int64_t ck_mul(ev *x, const node *n, int64_t p, int64_t q, const char *op) {
    if (p && q) {
        bool o = p > 0 ? (q > 0 ? p > INT64_MAX / q : q < INT64_MIN / p) : (q > 0 ? p < INT64_MIN / q : q < INT64_MAX / p);
        if (o) E_ovf(x, n, op);
    }
    return p * q;
}

static bool eq(ev *x, const jv *a, const jv *b, int depth) {
    if (depth > 100) return false;
    if (isnum(a) && isnum(b)) {
        if (a->t == V_INT && b->t == V_INT) return a->u.i == b->u.i;
        return numf(a) == numf(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR:
        if (a->u.s->n != b->u.s->n) return false;
        work(x, a->u.s->n);
        return !memcmp(a->u.s->s, b->u.s->s, a->u.s->n);
    case V_LIST:
        if (a->u.l->n != b->u.l->n) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!eq(x, &a->u.l->a[i], &b->u.l->a[i], depth + 1)) return false;
        return true;
    case V_DICT:
        if (a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            long j = dfind(x, b->u.d, &a->u.d->k[i]);
            if (j < 0 || !eq(x, &a->u.d->v[i], &b->u.d->v[j], depth + 1)) return false;
        }
        return true;
    case V_NS: return a->u.d == b->u.d;
    case V_MACRO: return a->u.m == b->u.m;
    default: return false;
    }
}

/* -1, 0, 1; numbers with numbers, strings with strings, lists by items */
static int cmp(ev *x, const node *at, const jv *a, const jv *b) {
    if (isnum(a) && isnum(b)) {
        if (a->t == V_INT && b->t == V_INT) return a->u.i < b->u.i ? -1 : a->u.i > b->u.i;
        double p = numf(a), q = numf(b);
        return p < q ? -1 : p > q;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->u.s->n < b->u.s->n ? a->u.s->n : b->u.s->n;
        work(x, n);
        int c = memcmp(a->u.s->s, b->u.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.s->n < b->u.s->n ? -1 : a->u.s->n > b->u.s->n;
    }
    if (a->t == V_LIST && b->t == V_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            int c = cmp(x, at, &a->u.l->a[i], &b->u.l->a[i]);
            if (c) return c;
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    E(x, at, "cannot compare %s with %s", tname(a), tname(b));
}

/* ---- text of values */

static void fmt_float(char *buf, size_t size, double f) {
    /* llama.cpp prints floats as std::to_string does (6 decimals) with the trailing
     * zeros removed but one: 0.5 -> 0.5, 2.0 -> 2.0 */
    if (isnan(f)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, size, f < 0 ? "-inf" : "inf");
        return;
    }
    snprintf(buf, size, "%f", f);
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '0') n--;
    if (n > 0 && buf[n - 1] == '.') buf[n++] = '0';
    buf[n] = 0;
}

static void put_str(ev *x, sink *s, const jv *v, int depth);

static bool has_quote(const jstr *t) { return memchr(t->s, '\'', t->n) != NULL; }

static void put_json(ev *x, sink *s, const jv *v, int lvl, int indent, const char *isep, const char *ksep);

/* Python-like repr inside lists and dicts (llama.cpp's: a string with a quote in
 * it is written as JSON) */
static void put_repr(ev *x, sink *s, const jv *v, int depth) {
    if (v->t == V_STR) {
        if (has_quote(v->u.s)) {
            put_json(x, s, v, 0, -1, ", ", ": ");
        } else {
            sk_cstr(x, s, "'");
            sk_jstr(x, s, v->u.s);
            sk_cstr(x, s, "'");
        }
        return;
    }
    put_str(x, s, v, depth);
}

static void put_str(ev *x, sink *s, const jv *v, int depth) {
    char buf[400];
    if (depth > 64) E(x, NULL, "a value nested deeper than 64 levels");
    switch (v->t) {
    case V_UNDEF: return;
    case V_NONE: sk_cstr(x, s, "None"); return;
    case V_BOOL: sk_cstr(x, s, v->u.b ? "True" : "False"); return;
    case V_INT: snprintf(buf, sizeof buf, "%lld", (long long)v->u.i); sk_cstr(x, s, buf); return;
    case V_FLOAT: fmt_float(buf, sizeof buf, v->u.f); sk_cstr(x, s, buf); return;
    case V_STR: sk_jstr(x, s, v->u.s); return;
    case V_LIST:
        sk_cstr(x, s, v->u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) sk_cstr(x, s, ", ");
            put_repr(x, s, &v->u.l->a[i], depth + 1);
        }
        if (v->u.l->tuple && v->u.l->n == 1) sk_cstr(x, s, ",");
        sk_cstr(x, s, v->u.l->tuple ? ")" : "]");
        return;
    case V_DICT:
        sk_cstr(x, s, "{");
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i) sk_cstr(x, s, ", ");
            put_repr(x, s, &v->u.d->k[i], depth + 1);
            sk_cstr(x, s, ": ");
            put_repr(x, s, &v->u.d->v[i], depth + 1);
        }
        sk_cstr(x, s, "}");
        return;
    case V_NS: sk_cstr(x, s, "Namespace"); return;
    case V_MACRO: sk_cstr(x, s, "Macro"); return;
    default: sk_cstr(x, s, "Function"); return;
    }
}

static jstr *to_str(ev *x, const jv *v) {
    if (v->t == V_STR) return v->u.s;
    sink s = {0};
    put_str(x, &s, v, 0);
    return sk_str(x, &s);
}

static void put_json_str(ev *x, sink *s, const jstr *t) {
    sk_cstr(x, s, "\"");
    size_t base = s->n;
    char tmp[8];
    for (size_t i = 0; i < t->n; i++) {
        unsigned char c = (unsigned char)t->s[i];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                e = tmp;
            }
        }
        if (e) sk_cstr(x, s, e);
        else sk_put(x, s, (const char *)&c, 1);
    }
    if (t->nsp) sk_span(x, s, base, s->n); /* escaped data stays data */
    sk_cstr(x, s, "\"");
}

static void put_indent(ev *x, sink *s, int lvl, int indent) {
    for (int i = 0; i < lvl * indent; i++) sk_put(x, s, " ", 1);
}

/* tojson as llama.cpp writes it: Python's json.dumps layout (", " and ": ",
 * or "," with an indent), keys in insertion order, non-ASCII kept */
static void put_json(ev *x, sink *s, const jv *v, int lvl, int indent, const char *isep, const char *ksep) {
    char buf[64];
    if (lvl > 64) E(x, NULL, "a value nested deeper than 64 levels");
    switch (v->t) {
    case V_BOOL: sk_cstr(x, s, v->u.b ? "true" : "false"); return;
    case V_INT: snprintf(buf, sizeof buf, "%lld", (long long)v->u.i); sk_cstr(x, s, buf); return;
    case V_FLOAT: snprintf(buf, sizeof buf, "%g", v->u.f); sk_cstr(x, s, buf); return;
    case V_STR: put_json_str(x, s, v->u.s); return;
    case V_LIST:
    case V_DICT: {
        bool list = v->t == V_LIST;
        size_t n = list ? v->u.l->n : v->u.d->n;
        sk_cstr(x, s, list ? "[" : "{");
        if (n) {
            if (indent >= 0) sk_cstr(x, s, "\n");
            for (size_t i = 0; i < n; i++) {
                put_indent(x, s, lvl + 1, indent > 0 ? indent : 0);
                if (list) {
                    put_json(x, s, &v->u.l->a[i], lvl + 1, indent, isep, ksep);
                } else {
                    jv k = v->u.d->k[i];
                    if (k.t != V_STR) k = vstr(to_str(x, &k));
                    put_json(x, s, &k, lvl + 1, indent, isep, ksep);
                    sk_cstr(x, s, ksep);
                    put_json(x, s, &v->u.d->v[i], lvl + 1, indent, isep, ksep);
                }
                if (i + 1 < n) sk_cstr(x, s, isep);
                if (indent >= 0) sk_cstr(x, s, "\n");
            }
            put_indent(x, s, lvl, indent > 0 ? indent : 0);
        }
        sk_cstr(x, s, list ? "]" : "}");
        return;
    }
    default: sk_cstr(x, s, "null"); return;
    }
}

/* ---- context from JSON */

static jv from_json(ev *x, json_t *j, bool data, int depth) {
    if (depth > 64) E(x, NULL, "the context is nested deeper than 64 levels");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = mkdict(x);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            jv kv = vstr(mkstr(x, k, strlen(k)));
            if (data && kv.u.s->n) {
                kv.u.s->sp = al(x, 2 * sizeof(size_t));
                kv.u.s->sp[1] = kv.u.s->n;
                kv.u.s->nsp = 1;
            }
            dappend(x, d, kv, from_json(x, v, data, depth + 1));
        }
        return vdict(d);
    }
    case JSON_ARRAY: {
        jlist *l = mklist(x, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) lpush(x, l, from_json(x, v, data, depth + 1));
        return vlist(l);
    }
    case JSON_STRING: {
        jstr *t = mkstr(x, json_string_value(j), json_string_length(j));
        if (data && t->n) {
            t->sp = al(x, 2 * sizeof *t->sp);
            t->sp[0] = 0;
            t->sp[1] = t->n;
            t->nsp = 1;
        }
        return vstr(t);
    }
    case JSON_INTEGER: return vint((int64_t)json_integer_value(j));
    case JSON_REAL: return vfloat(json_real_value(j));
    case JSON_TRUE: return vbool(true);
    case JSON_FALSE: return vbool(false);
    default: return NONE;
    }
}

/* ---- scopes */

static jv *lookup(ev *x, scope *sc, const char *name) {
    for (; sc; sc = sc->up) {
        long i = dfind_c(x, sc->vars, name);
        if (i >= 0) return &sc->vars->v[i];
    }
    return NULL;
}

static scope *push_scope(ev *x, scope *up) {
    scope *s = al(x, sizeof *s);
    s->up = up;
    s->vars = mkdict(x);
    return s;
}

static jv eval(ev *x, scope *sc, const node *n);
static void exec(ev *x, scope *sc, const node *n, sink *out);

/* ---- builtins: filters, tests, methods and global functions */

typedef struct args {
    jv *pos;
    int np;
    const char **kn;
    jv *kw;
    int nk;
} args;

static jv *arg(args *a, int i, const char *name) {
    if (name)
        for (int k = 0; k < a->nk; k++)
            if (!strcmp(a->kn[k], name)) return &a->kw[k];
    return i >= 0 && i < a->np ? &a->pos[i] : NULL;
}

static const jstr *arg_str(ev *x, const node *at, args *a, int i, const char *name, const char *fn) {
    jv *v = arg(a, i, name);
    if (!v) E(x, at, "%s: argument %d ('%s') is missing", fn, i + 1, name ? name : "?");
    if (v->t != V_STR) E(x, at, "%s: argument '%s' must be a string, not %s", fn, name ? name : "?", tname(v));
    return v->u.s;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static jv do_strip(ev *x, const jstr *s, const jstr *chars, bool left, bool right) {
    size_t a = 0, b = s->n;
    if (left)
        while (a < b && (chars ? memchr(chars->s, s->s[a], chars->n) != NULL : is_ws(s->s[a]))) a++;
    if (right)
        while (b > a && (chars ? memchr(chars->s, s->s[b - 1], chars->n) != NULL : is_ws(s->s[b - 1]))) b--;
    return vstr(substr(x, s, a, b));
}

/* The first n in h; each byte scanned and each candidate's comparison is work,
 * so a long needle against a long haystack stops at the work limit. */
static const char *memmem_(ev *x, const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    size_t i = 0, last = hn - nn;
    while (i <= last) {
        const char *c = memchr(h + i, n[0], last - i + 1);
        size_t j = c ? (size_t)(c - h) : last + 1;
        work(x, j - i + 1);
        if (!c) return NULL;
        work(x, nn);
        if (!memcmp(c, n, nn)) return c;
        i = j + 1;
    }
    return NULL;
}

static jv do_split(ev *x, const jstr *s, const jstr *sep, int64_t maxsplit) {
    jlist *l = mklist(x, 0);
    if (!sep) { /* runs of whitespace, none at the ends */
        size_t i = 0;
        while (i < s->n) {
            while (i < s->n && is_ws(s->s[i])) i++;
            if (i >= s->n) break;
            size_t j = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                j = s->n;
                while (j > i && is_ws(s->s[j - 1])) j--;
            } else {
                while (j < s->n && !is_ws(s->s[j])) j++;
            }
            lpush(x, l, vstr(substr(x, s, i, j)));
            i = j;
        }
        return vlist(l);
    }
    if (!sep->n) E(x, NULL, "split: empty separator");
    size_t i = 0;
    for (;;) {
        const char *f = (maxsplit < 0 || (int64_t)l->n < maxsplit) ? memmem_(x, s->s + i, s->n - i, sep->s, sep->n) : NULL;
        if (!f) {
            lpush(x, l, vstr(substr(x, s, i, s->n)));
            break;
        }
        size_t at = (size_t)(f - s->s);
        lpush(x, l, vstr(substr(x, s, i, at)));
        i = at + sep->n;
    }
    return vlist(l);
}

static jv do_replace(ev *x, const jstr *s, const jstr *from, const jstr *to, int64_t count) {
    sink o = {0};
    size_t i = 0;
    int64_t done = 0;
    if (!from->n) { /* Python: the new text between every character */
        for (; i <= s->n; i++) {
            if (count < 0 || done < count) {
                sk_jstr(x, &o, to);
                done++;
            }
            if (i < s->n) sk_jstr(x, &o, substr(x, s, i, i + 1));
        }
        return vstr(sk_str(x, &o));
    }
    while (i < s->n) {
        const char *f = (count < 0 || done < count) ? memmem_(x, s->s + i, s->n - i, from->s, from->n) : NULL;
        if (!f) break;
        size_t at = (size_t)(f - s->s);
        sk_jstr(x, &o, substr(x, s, i, at));
        sk_jstr(x, &o, to);
        i = at + from->n;
        done++;
        step(x);
    }
    sk_jstr(x, &o, substr(x, s, i, s->n));
    return vstr(sk_str(x, &o));
}

static jv do_case(ev *x, const jstr *s, int mode) { /* 0 upper, 1 lower, 2 title, 3 capitalize */
    char *p = al(x, s->n + 1);
    bool start = true;
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->s[i];
        if (c >= 0x80) {
            p[i] = (char)c;
            start = false;
            continue;
        }
        switch (mode) {
        case 0: p[i] = (char)toupper(c); break;
        case 1: p[i] = (char)tolower(c); break;
        case 2:
            p[i] = (char)(start ? toupper(c) : tolower(c));
            start = !isalnum(c);
            break;
        default: p[i] = (char)(i == 0 ? toupper(c) : tolower(c)); break;
        }
    }
    jstr *r = al(x, sizeof *r);
    *r = *s; /* same length: the spans carry over */
    r->s = p;
    r->flags = 0;
    return vstr(r);
}

static jv iter_list(ev *x, const node *at, const jv *v, const char *fn) {
    if (v->t == V_LIST) return *v;
    jlist *l = mklist(x, 0);
    if (v->t == V_DICT) {
        for (size_t i = 0; i < v->u.d->n; i++) lpush(x, l, v->u.d->k[i]);
    } else if (v->t == V_STR) {
        for (size_t i = 0; i < v->u.s->n;) { /* by UTF-8 character */
            size_t k = 1;
            unsigned char c = (unsigned char)v->u.s->s[i];
            if (c >= 0xF0) k = 4;
            else if (c >= 0xE0) k = 3;
            else if (c >= 0xC0) k = 2;
            if (i + k > v->u.s->n) k = v->u.s->n - i;
            lpush(x, l, vstr(substr(x, v->u.s, i, i + k)));
            i += k;
        }
    } else if (v->t != V_UNDEF && v->t != V_NONE) {
        E(x, at, "%s: %s is not iterable", fn, tname(v));
    } else if (v->t == V_NONE) {
        E(x, at, "%s: none is not iterable", fn);
    }
    return vlist(l);
}

static jv getattr_v(ev *x, const node *at, const jv *obj, const jv *key);

/* "a.b.c" attribute paths of map/selectattr/sort/join */
static jv attr_path(ev *x, const node *at, const jv *v, const jstr *path) {
    jv cur = *v;
    size_t i = 0;
    while (i <= path->n) {
        const char *d = memchr(path->s + i, '.', path->n - i);
        size_t e = d ? (size_t)(d - path->s) : path->n;
        jstr *part = substr(x, path, i, e);
        jv k = vstr(part);
        char *endp;
        char tmp[32];
        if (part->n && part->n < sizeof tmp) {
            memcpy(tmp, part->s, part->n);
            tmp[part->n] = 0;
            long long iv = strtoll(tmp, &endp, 10);
            if (*endp == 0 && cur.t == V_LIST) k = vint(iv);
        }
        cur = getattr_v(x, at, &cur, &k);
        i = e + 1;
    }
    return cur;
}

static jv call_test(ev *x, const node *at, const char *name, const jv *v, args *a, bool *found);
static jv call_value(ev *x, const node *at, jv callee, args *a);
static jv call_filter(ev *x, const node *at, const char *name, jv self, args *a);

static int cmp_for_sort(ev *x, const node *at, const jv *a, const jv *b, bool ci) {
    if (ci && a->t == V_STR && b->t == V_STR) {
        size_t n = a->u.s->n < b->u.s->n ? a->u.s->n : b->u.s->n;
        for (size_t i = 0; i < n; i++) {
            int p = tolower((unsigned char)a->u.s->s[i]), q = tolower((unsigned char)b->u.s->s[i]);
            if (p != q) return p < q ? -1 : 1;
        }
        return a->u.s->n < b->u.s->n ? -1 : a->u.s->n > b->u.s->n;
    }
    return cmp(x, at, a, b);
}

/* stable insertion sort: lists in templates are short, and cmp may raise */
static void sort_list(ev *x, const node *at, jv *items, jv *keys, size_t n, bool reverse, bool ci) {
    for (size_t i = 1; i < n; i++) {
        jv it = items[i], k = keys[i];
        size_t j = i;
        while (j > 0) {
            int c = cmp_for_sort(x, at, &keys[j - 1], &k, ci);
            if (reverse ? c >= 0 : c <= 0) break;
            items[j] = items[j - 1];
            keys[j] = keys[j - 1];
            j--;
            step(x);
        }
        items[j] = it;
        keys[j] = k;
    }
}

static jv fmt_percent(ev *x, const node *at, const jstr *f, args *a) {
    sink o = {0};
    int ai = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (f->s[i] != '%' || i + 1 >= f->n) {
            sk_put(x, &o, f->s + i, 1);
            continue;
        }
        char c = f->s[++i];
        if (c == '%') {
            sk_put(x, &o, "%", 1);
            continue;
        }
        jv *v = arg(a, ai++, NULL);
        if (!v) E(x, at, "format: not enough arguments for the format string");
        if (c == 'd' || c == 'i') {
            char b[32];
            snprintf(b, sizeof b, "%lld", (long long)numi(v));
            sk_cstr(x, &o, b);
        } else {
            sk_jstr(x, &o, to_str(x, v));
        }
    }
    return vstr(sk_str(x, &o));
}

static jv fmt_braces(ev *x, const node *at, const jstr *f, args *a) {
    sink o = {0};
    int ai = 0;
    for (size_t i = 0; i < f->n; i++) {
        char c = f->s[i];
        if (c == '{' && i + 1 < f->n && f->s[i + 1] == '{') {
            sk_put(x, &o, "{", 1);
            i++;
            continue;
        }
        if (c == '}' && i + 1 < f->n && f->s[i + 1] == '}') {
            sk_put(x, &o, "}", 1);
            i++;
            continue;
        }
        if (c != '{') {
            sk_put(x, &o, &c, 1);
            continue;
        }
        const char *e = memchr(f->s + i, '}', f->n - i);
        if (!e) E(x, at, "format: '}' missing in the format string");
        size_t len = (size_t)(e - (f->s + i + 1));
        char key[64];
        if (len >= sizeof key) E(x, at, "format: field name too long");
        memcpy(key, f->s + i + 1, len);
        key[len] = 0;
        char *colon = strchr(key, ':');
        if (colon) *colon = 0;
        jv *v;
        if (!key[0]) v = arg(a, ai++, NULL);
        else if (isdigit((unsigned char)key[0])) v = arg(a, atoi(key), NULL);
        else v = arg(a, -1, key);
        if (!v) E(x, at, "format: no argument for '{%s}'", key);
        sk_jstr(x, &o, to_str(x, v));
        i += len + 1;
    }
    return vstr(sk_str(x, &o));
}

/* ---- methods and filters: one function each, found by name in the tables below
 * (sorted by name in strcmp order for binary search; aliases share a function and
 * tell themselves apart by name). */

static jv call_builtin(ev *x, const node *at, const char *name, jv self, args *a, bool filter, bool *found);

static jv filter_length(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)name; (void)a;
    switch (s->t) {
    case V_STR: { /* characters, not bytes */
        int64_t c = 0;
        for (size_t i = 0; i < s->u.s->n; i++) c += ((unsigned char)s->u.s->s[i] & 0xC0) != 0x80;
        return vint(c);
    }
    case V_LIST: return vint((int64_t)s->u.l->n);
    case V_DICT:
    case V_NS: return vint((int64_t)s->u.d->n);
    case V_UNDEF: return vint(0);
    default: E(x, at, "length: %s has no length", tname(s));
    }
}

static jv filter_default(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name;
    jv *p0 = arg(a, 0, NULL);
    jv *b = arg(a, 1, "boolean");
    bool use = s->t == V_UNDEF || (b && truthy(b) && !truthy(s));
    return use ? (p0 ? *p0 : vcstr(x, "")) : *s;
}

static jv filter_first_last(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    jv l = iter_list(x, at, s, name);
    if (!l.u.l->n) return UNDEF;
    return name[0] == 'f' ? l.u.l->a[0] : l.u.l->a[l.u.l->n - 1];
}

static jv filter_join(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = iter_list(x, at, s, name);
    jv *sep = arg(a, 0, "d");
    jv *attr = arg(a, 1, "attribute");
    sink o = {0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i && sep) sk_jstr(x, &o, to_str(x, sep));
        jv e = l.u.l->a[i];
        if (attr && attr->t == V_STR) e = attr_path(x, at, &e, attr->u.s);
        sk_jstr(x, &o, to_str(x, &e));
    }
    return vstr(sk_str(x, &o));
}

static jv filter_string(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name; (void)a;
    return vstr(to_str(x, s));
}

static jv filter_safe_escape(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)a;
    if (name[0] == 's') return s->t == V_STR ? *s : vstr(to_str(x, s));
    const jstr *t = to_str(x, s);
    sink o = {0};
    for (size_t i = 0; i < t->n; i++) {
        switch (t->s[i]) {
        case '&': sk_cstr(x, &o, "&amp;"); break;
        case '<': sk_cstr(x, &o, "&lt;"); break;
        case '>': sk_cstr(x, &o, "&gt;"); break;
        case '"': sk_cstr(x, &o, "&#34;"); break;
        case '\'': sk_cstr(x, &o, "&#39;"); break;
        default: sk_put(x, &o, t->s + i, 1);
        }
    }
    return vstr(derived(x, o.p ? o.p : "", o.n, t->nsp != 0));
}

static jv filter_int(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)x; (void)at; (void)name;
    jv *p0 = arg(a, 0, NULL);
    if (s->t == V_STR) {
        char buf[64];
        size_t m = s->u.s->n < sizeof buf - 1 ? s->u.s->n : sizeof buf - 1;
        memcpy(buf, s->u.s->s, m);
        buf[m] = 0;
        char *e;
        long long v = strtoll(buf, &e, 10);
        if (e == buf || *e) {
            double f = strtod(buf, &e);
            if (e != buf && !*e) return vint((int64_t)f);
            return p0 ? *p0 : vint(0);
        }
        return vint(v);
    }
    if (isnum(s)) return vint(numi(s));
    return p0 ? *p0 : vint(0);
}

static jv filter_float(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)x; (void)at; (void)name;
    jv *p0 = arg(a, 0, NULL);
    if (s->t == V_STR) {
        char buf[64];
        size_t m = s->u.s->n < sizeof buf - 1 ? s->u.s->n : sizeof buf - 1;
        memcpy(buf, s->u.s->s, m);
        buf[m] = 0;
        char *e;
        double f = strtod(buf, &e);
        if (e == buf || *e) return p0 ? *p0 : vfloat(0);
        return vfloat(f);
    }
    if (isnum(s)) return vfloat(numf(s));
    return p0 ? *p0 : vfloat(0);
}

static jv filter_abs(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)name; (void)a;
    if (s->t == V_INT) return vint(s->u.i < 0 ? ck_sub(x, at, 0, s->u.i, "abs") : s->u.i);
    if (s->t == V_FLOAT) return vfloat(fabs(s->u.f));
    E(x, at, "abs: %s is not a number", tname(s));
}

static jv filter_round(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)x; (void)at; (void)name;
    jv *pr = arg(a, 0, "precision");
    jv *m = arg(a, 1, "method");
    double f = numf(s), k = pow(10, pr ? (double)numi(pr) : 0);
    const char *meth = m && m->t == V_STR ? m->u.s->s : "common";
    double r = !strncmp(meth, "ceil", 4) ? ceil(f * k) / k : !strncmp(meth, "floor", 5) ? floor(f * k) / k : round(f * k) / k;
    return vfloat(r);
}

static jv filter_list(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    jv l = iter_list(x, at, s, name);
    jlist *c = mklist(x, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++) lpush(x, c, l.u.l->a[i]);
    return vlist(c);
}

static jv filter_items(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)name; (void)a;
    if (s->t == V_UNDEF) return vlist(mklist(x, 0));
    E(x, at, "items: %s is not a mapping", tname(s));
}

static jv filter_tojson(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name;
    mark_deep(s, 0);
    jv *ind = arg(a, 0, "indent");
    jv *seps = arg(a, -1, "separators");
    int indent = ind && ind->t == V_INT ? (int)(ind->u.i > 64 ? 64 : ind->u.i) : -1;
    const char *isep = indent < 0 ? ", " : ",", *ksep = ": ";
    if (seps && seps->t == V_LIST && seps->u.l->n == 2 && seps->u.l->a[0].t == V_STR && seps->u.l->a[1].t == V_STR) {
        isep = al(x, seps->u.l->a[0].u.s->n + 1);
        memcpy((char *)isep, seps->u.l->a[0].u.s->s, seps->u.l->a[0].u.s->n);
        ksep = al(x, seps->u.l->a[1].u.s->n + 1);
        memcpy((char *)ksep, seps->u.l->a[1].u.s->s, seps->u.l->a[1].u.s->n);
    }
    jv *asc = arg(a, -1, "ensure_ascii");
    sink o = {0};
    put_json(x, &o, s, 0, indent, isep, ksep);
    if (asc && truthy(asc)) { /* \uXXXX for every non-ASCII character (surrogate pairs above U+FFFF) */
        sink q = {0};
        const unsigned char *u = (const unsigned char *)(o.p ? o.p : "");
        for (size_t i = 0; i < o.n;) {
            unsigned c = u[i];
            if (c < 0x80) {
                sk_put(x, &q, (const char *)u + i, 1);
                i++;
                continue;
            }
            int k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            unsigned cp = k == 1 ? 0xFFFD : (c & (0xFF >> (k + 1)));
            for (int j = 1; j < k && i + (size_t)j < o.n; j++) cp = (cp << 6) | (u[i + (size_t)j] & 0x3F);
            char b[16];
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(b, sizeof b, "\\u%04x", cp);
            }
            sk_cstr(x, &q, b);
            i += (size_t)k;
        }
        return vstr(derived(x, q.p ? q.p : "", q.n, o.nsp != 0));
    }
    return vstr(sk_str(x, &o));
}

static jv filter_reverse(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    if (s->t == V_STR) {
        char *p = al(x, s->u.s->n + 1);
        for (size_t i = 0; i < s->u.s->n; i++) p[i] = s->u.s->s[s->u.s->n - 1 - i];
        return vstr(derived(x, p, s->u.s->n, s->u.s->nsp != 0));
    }
    jv l = iter_list(x, at, s, name);
    jlist *c = mklist(x, l.u.l->n);
    for (size_t i = l.u.l->n; i-- > 0;) lpush(x, c, l.u.l->a[i]);
    return vlist(c);
}

static jv filter_sort(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = iter_list(x, at, s, name);
    jv *rev = arg(a, 0, "reverse");
    jv *cs = arg(a, 1, "case_sensitive");
    jv *attr = arg(a, 2, "attribute");
    size_t n = l.u.l->n;
    jv *items = al(x, (n + 1) * sizeof *items), *keys = al(x, (n + 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        items[i] = l.u.l->a[i];
        keys[i] = attr && attr->t == V_STR ? attr_path(x, at, &items[i], attr->u.s) : items[i];
    }
    sort_list(x, at, items, keys, n, rev && truthy(rev), !(cs && truthy(cs)));
    jlist *c = mklist(x, n);
    for (size_t i = 0; i < n; i++) lpush(x, c, items[i]);
    return vlist(c);
}

static jv filter_unique(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    jv l = iter_list(x, at, s, name);
    jlist *c = mklist(x, 0);
    for (size_t i = 0; i < l.u.l->n; i++) {
        bool dup = false;
        for (size_t j = 0; j < c->n && !dup; j++) dup = eq(x, &c->a[j], &l.u.l->a[i], 0);
        if (!dup) lpush(x, c, l.u.l->a[i]);
        step(x);
    }
    return vlist(c);
}

static jv filter_min_max_sum(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = iter_list(x, at, s, name);
    jv *attr = arg(a, name[1] == 'u' ? 0 : 2, "attribute");
    jv best = name[1] == 'u' ? (arg(a, 1, "start") ? *arg(a, 1, "start") : vint(0)) : UNDEF;
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv e = l.u.l->a[i];
        if (attr && attr->t == V_STR) e = attr_path(x, at, &e, attr->u.s);
        if (name[1] == 'u') {
            if (!isnum(&e) || !isnum(&best)) E(x, at, "sum: %s is not a number", tname(&e));
            best = best.t == V_INT && e.t == V_INT ? vint(ck_add(x, at, best.u.i, e.u.i, "sum")) : vfloat(numf(&best) + numf(&e));
        } else if (best.t == V_UNDEF || (cmp(x, at, &e, &best) < 0) == (name[1] == 'i')) {
            if (best.t == V_UNDEF || cmp(x, at, &e, &best) != 0) best = e;
        }
    }
    return best;
}

static jv filter_map(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv *p0 = arg(a, 0, NULL);
    jv l = iter_list(x, at, s, name);
    jv *attr = arg(a, -1, "attribute");
    jv *def = arg(a, -1, "default");
    jlist *c = mklist(x, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv e = l.u.l->a[i];
        if (attr && attr->t == V_STR) {
            e = attr_path(x, at, &e, attr->u.s);
            if (e.t == V_UNDEF && def) e = *def;
        } else if (p0 && p0->t == V_STR) {
            args sub = {a->pos + 1, a->np - 1, a->kn, a->kw, a->nk};
            char fn[64];
            snprintf(fn, sizeof fn, "%.*s", (int)p0->u.s->n, p0->u.s->s);
            bool f;
            e = call_builtin(x, at, fn, e, &sub, true, &f);
        } else {
            E(x, at, "map: a filter name or attribute= is needed");
        }
        lpush(x, c, e);
    }
    return vlist(c);
}

static jv filter_select(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = iter_list(x, at, s, name);
    bool byattr = !strcmp(name + 6, "attr"), keep_true = name[0] == 's';
    int ti = byattr ? 1 : 0;
    jv *attr = byattr ? arg(a, 0, NULL) : NULL;
    if (byattr && (!attr || attr->t != V_STR)) E(x, at, "%s: an attribute name is needed", name);
    jv *tn = arg(a, ti, NULL);
    if (tn && tn->t != V_STR) E(x, at, "%s: the test name must be a string", name);
    char test[64] = "";
    if (tn) snprintf(test, sizeof test, "%.*s", (int)tn->u.s->n, tn->u.s->s);
    args sub = {a->pos + ti + 1, a->np > ti + 1 ? a->np - ti - 1 : 0, NULL, NULL, 0};
    jlist *c = mklist(x, 0);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv e = l.u.l->a[i], k = e;
        if (byattr) k = attr_path(x, at, &e, attr->u.s);
        bool ok;
        if (tn) {
            bool f;
            jv r = call_test(x, at, test, &k, &sub, &f);
            if (!f) E(x, at, "%s: no test named '%s'", name, test);
            ok = truthy(&r);
        } else {
            ok = truthy(&k);
        }
        if (ok == keep_true) lpush(x, c, e);
        step(x);
    }
    return vlist(c);
}

static jv filter_indent(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name;
    const jstr *t = to_str(x, s);
    jv *w = arg(a, 0, "width");
    jv *first = arg(a, 1, "first");
    jv *blank = arg(a, 2, "blank");
    const jstr *pad;
    if (w && w->t == V_STR) {
        pad = w->u.s;
    } else {
        int64_t k = w ? numi(w) : 4;
        if (k < 0) k = 0;
        if (k > 256) k = 256;
        char *p = al(x, (size_t)k + 1);
        memset(p, ' ', (size_t)k);
        pad = derived(x, p, (size_t)k, false);
    }
    sink o = {0};
    size_t i = 0;
    bool line_start = true, is_first = true;
    while (i <= t->n) {
        size_t j = i;
        while (j < t->n && t->s[j] != '\n') j++;
        bool empty = j == i;
        if (line_start && (!is_first || (first && truthy(first))) && (!empty || (blank && truthy(blank))) && i < t->n + (j < t->n))
            sk_jstr(x, &o, pad);
        sk_jstr(x, &o, substr(x, t, i, j < t->n ? j + 1 : j));
        is_first = false;
        if (j >= t->n) break;
        i = j + 1;
        line_start = true;
    }
    return vstr(sk_str(x, &o));
}

static jv filter_wordcount(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name; (void)a;
    const jstr *t = to_str(x, s);
    int64_t c = 0;
    bool in = false;
    for (size_t i = 0; i < t->n; i++) {
        bool w = isalnum((unsigned char)t->s[i]) || t->s[i] == '_' || ((unsigned char)t->s[i] >= 0x80);
        if (w && !in) c++;
        in = w;
    }
    return vint(c);
}

static jv filter_batch_slice(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv *p0 = arg(a, 0, NULL);
    jv l = iter_list(x, at, s, name);
    int64_t k = p0 ? numi(p0) : 1;
    if (k < 1) E(x, at, "%s: the size must be positive", name);
    jlist *c = mklist(x, 0);
    size_t n = l.u.l->n;
    if (name[0] == 'b') {
        for (size_t i = 0; i < n; i += (size_t)k) {
            jlist *b = mklist(x, 0);
            for (size_t j = i; j < n && j < i + (size_t)k; j++) lpush(x, b, l.u.l->a[j]);
            lpush(x, c, vlist(b));
        }
    } else {
        size_t per = n / (size_t)k, extra = n % (size_t)k, off = 0;
        for (int64_t g = 0; g < k && g < (int64_t)n + 1; g++) {
            size_t m = per + ((size_t)g < extra);
            jlist *b = mklist(x, 0);
            for (size_t j = 0; j < m; j++) lpush(x, b, l.u.l->a[off + j]);
            off += m;
            lpush(x, c, vlist(b));
        }
    }
    return vlist(c);
}

static jv filter_as_string(ev *x, const node *at, const char *name, const jv *s, args *a) {
    if (s->t == V_UNDEF) return vcstr(x, "");
    jv str = vstr(to_str(x, s));
    bool f;
    return call_builtin(x, at, name, str, a, true, &f);
}

static jv str_upper(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)a; (void)filter;
    const jstr *str = s->u.s;
    return do_case(x, str, 0);
}

static jv str_lower(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)a; (void)filter;
    const jstr *str = s->u.s;
    return do_case(x, str, 1);
}

static jv str_title(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)a; (void)filter;
    const jstr *str = s->u.s;
    return do_case(x, str, 2);
}

static jv str_capitalize(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)a; (void)filter;
    const jstr *str = s->u.s;
    return do_case(x, str, 3);
}

static jv str_strip(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)filter;
    const jstr *str = s->u.s;
        jv *c = arg(a, 0, "chars");
        const jstr *chars = c && c->t == V_STR ? c->u.s : NULL;
        return do_strip(x, str, chars, name[0] != 'r', name[0] != 'l');
}

static jv str_startswith(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
        jv *p = arg(a, 0, "prefix");
        if (!p) E(x, at, "%s: an argument is needed", name);
        bool end = name[0] == 'e';
        size_t cnt = p->t == V_LIST ? p->u.l->n : 1;
        for (size_t i = 0; i < cnt; i++) {
            const jv *q = p->t == V_LIST ? &p->u.l->a[i] : p;
            if (q->t != V_STR) E(x, at, "%s: the argument must be a string", name);
            const jstr *t = q->u.s;
            if (t->n <= str->n && !memcmp(str->s + (end ? str->n - t->n : 0), t->s, t->n)) return vbool(true);
        }
        return vbool(false);
}

static jv str_split(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)filter;
    const jstr *str = s->u.s;
    int64_t n_i;
        jv *sep = arg(a, 0, "sep");
        jv *mx = arg(a, 1, "maxsplit");
        n_i = mx ? numi(mx) : -1;
        if (name[0] == 'r' && n_i >= 0 && sep && sep->t == V_STR) { /* rsplit with a limit: from the right */
            jv all = do_split(x, str, sep->u.s, -1);
            jlist *l = all.u.l;
            if (n_i >= (int64_t)l->n - 1) return all;
            size_t keep = l->n - (size_t)n_i; /* the first keep pieces join back */
            size_t cut = 0;
            for (size_t i = 0; i < keep; i++) cut += l->a[i].u.s->n + (i ? sep->u.s->n : 0);
            jlist *r = mklist(x, 0);
            lpush(x, r, vstr(substr(x, str, 0, cut)));
            for (size_t i = keep; i < l->n; i++) lpush(x, r, l->a[i]);
            return vlist(r);
        }
        return do_split(x, str, sep && sep->t == V_STR ? sep->u.s : NULL, n_i);
}

static jv str_replace(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
        const jstr *from = arg_str(x, at, a, 0, "old", name), *to = arg_str(x, at, a, 1, "new", name);
        jv *c = arg(a, 2, "count");
        return do_replace(x, str, from, to, c ? numi(c) : -1);
}

static jv str_find(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
        const jstr *t = arg_str(x, at, a, 0, "sub", name);
        const char *f = NULL;
        if (name[0] == 'r') {
            for (size_t i = str->n + 1; i-- > 0;)
                if (i + t->n <= str->n && !memcmp(str->s + i, t->s, t->n)) {
                    f = str->s + i;
                    break;
                }
        } else {
            f = memmem_(x, str->s, str->n, t->s, t->n);
        }
        if (!f && name[0] == 'i') E(x, at, "index: substring not found");
        return vint(f ? (int64_t)(f - str->s) : -1);
}

static jv str_count(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
        const jstr *t = arg_str(x, at, a, 0, "sub", name);
        int64_t c = 0;
        if (!t->n) return vint((int64_t)str->n + 1);
        for (size_t i = 0; i + t->n <= str->n;)
            if (!memcmp(str->s + i, t->s, t->n)) {
                c++;
                i += t->n;
            } else {
                i++;
            }
        return vint(c);
}

static jv str_format(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name;
    const jstr *str = s->u.s;
    return filter ? fmt_percent(x, at, str, a) : fmt_braces(x, at, str, a);
}

static jv str_join(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
    jv *p0 = arg(a, 0, NULL);
        if (!p0) E(x, at, "join: an argument is needed");
        jv l = iter_list(x, at, p0, name);
        sink o = {0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i) sk_jstr(x, &o, str);
            sk_jstr(x, &o, to_str(x, &l.u.l->a[i]));
        }
        return vstr(sk_str(x, &o));
}

static jv str_is_class(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)x; (void)at; (void)filter; (void)a;
    const jstr *str = s->u.s;
        if (!str->n) return vbool(false);
        bool any_cased = false;
        for (size_t i = 0; i < str->n; i++) {
            unsigned char c = (unsigned char)str->s[i];
            bool ok;
            switch (name[2]) {
            case 'd': ok = isdigit(c); break;
            case 'a': ok = name[4] == 'p' ? isalpha(c) : isalnum(c); break;
            case 's': ok = is_ws((char)c); break;
            case 'l': ok = !isupper(c); any_cased |= islower(c) != 0; break;
            default: ok = !islower(c); any_cased |= isupper(c) != 0; break;
            }
            if (!ok) return vbool(false);
        }
        return vbool(name[2] == 'l' || name[2] == 'u' ? any_cased : true);
}

static jv str_splitlines(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)a; (void)filter;
    const jstr *str = s->u.s;
        jlist *l = mklist(x, 0);
        size_t i = 0;
        while (i < str->n) {
            size_t j = i;
            while (j < str->n && str->s[j] != '\n' && str->s[j] != '\r') j++;
            lpush(x, l, vstr(substr(x, str, i, j)));
            if (j < str->n && str->s[j] == '\r' && j + 1 < str->n && str->s[j + 1] == '\n') j++;
            i = j + 1;
        }
        return vlist(l);
}

static jv str_center(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)filter;
    const jstr *str = s->u.s;
    jv *p0 = arg(a, 0, NULL);
    int64_t n_i;
        n_i = p0 ? numi(p0) : 80;
        if (n_i > 1 << 20) n_i = 1 << 20;
        if (n_i < 0) n_i = 0;
        sink o = {0};
        int64_t pad = n_i - (int64_t)str->n;
        for (int64_t i = 0; i < pad / 2; i++) sk_put(x, &o, " ", 1);
        sk_jstr(x, &o, str);
        for (int64_t i = 0; i < pad - pad / 2; i++) sk_put(x, &o, " ", 1);
        return vstr(sk_str(x, &o));
}

static jv list_append(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = arg(a, 0, NULL);
        if (!p0) E(x, at, "append: an argument is needed");
        lpush(x, l, *p0);
        return NONE;
}

static jv list_extend(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    jlist *l = s->u.l;
    jv *p0 = arg(a, 0, NULL);
        if (!p0) E(x, at, "extend: an argument is needed");
        jv o = iter_list(x, at, p0, name);
        size_t m = o.u.l->n;
        for (size_t i = 0; i < m; i++) lpush(x, l, o.u.l->a[i]);
        return NONE;
}

static jv list_insert(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = arg(a, 0, NULL);
        jv *v = arg(a, 1, NULL);
        if (!p0 || !v) E(x, at, "insert: two arguments are needed");
        int64_t i = numi(p0);
        if (i < 0) i += (int64_t)l->n;
        if (i < 0) i = 0;
        if (i > (int64_t)l->n) i = (int64_t)l->n;
        lpush(x, l, NONE);
        memmove(&l->a[i + 1], &l->a[i], (l->n - 1 - (size_t)i) * sizeof *l->a);
        l->a[i] = *v;
        return NONE;
}

static jv list_pop(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = arg(a, 0, NULL);
        if (!l->n) E(x, at, "pop from an empty list");
        int64_t i = p0 ? numi(p0) : (int64_t)l->n - 1;
        if (i < 0) i += (int64_t)l->n;
        if (i < 0 || i >= (int64_t)l->n) E(x, at, "pop index out of range");
        jv r = l->a[i];
        memmove(&l->a[i], &l->a[i + 1], (l->n - 1 - (size_t)i) * sizeof *l->a);
        l->n--;
        return r;
}

static jv list_index(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = arg(a, 0, NULL);
        if (!p0) E(x, at, "index: an argument is needed");
        for (size_t i = 0; i < l->n; i++)
            if (eq(x, &l->a[i], p0, 0)) return vint((int64_t)i);
        E(x, at, "index: the value is not in the list");
}

static jv list_count(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = arg(a, 0, NULL);
        if (!p0) E(x, at, "count: an argument is needed");
        int64_t c = 0;
        for (size_t i = 0; i < l->n; i++) c += eq(x, &l->a[i], p0, 0);
        return vint(c);
}

static jv dict_items(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)a; (void)filter;
    jdict *d = s->u.d;
        jlist *l = mklist(x, d->n);
        for (size_t i = 0; i < d->n; i++) {
            if (name[0] == 'i') {
                jlist *pair = mklist(x, 2);
                pair->tuple = true;
                lpush(x, pair, d->k[i]);
                lpush(x, pair, d->v[i]);
                lpush(x, l, vlist(pair));
            } else {
                lpush(x, l, name[0] == 'k' ? d->k[i] : d->v[i]);
            }
        }
        return vlist(l);
}

static jv dict_get(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jdict *d = s->u.d;
    jv *p0 = arg(a, 0, NULL);
        if (!p0) E(x, at, "get: a key is needed");
        long i = dfind(x, d, p0);
        jv *def = arg(a, 1, "default");
        return i >= 0 ? d->v[i] : def ? *def : NONE;
}

static jv dict_update(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)filter;
    jdict *d = s->u.d;
    jv *p0 = arg(a, 0, NULL);
        if (p0 && (p0->t == V_DICT || p0->t == V_NS))
            for (size_t i = 0; i < p0->u.d->n; i++) dset(x, d, p0->u.d->k[i], p0->u.d->v[i]);
        for (int k = 0; k < a->nk; k++) dset_c(x, d, a->kn[k], a->kw[k]);
        return NONE;
}

static jv dict_pop(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    jdict *d = s->u.d;
    jv *p0 = arg(a, 0, NULL);
        if (!p0) E(x, at, "%s: a key is needed", name);
        long i = dfind(x, d, p0);
        jv *def = arg(a, 1, "default");
        if (name[0] == 's') {
            if (i >= 0) return d->v[i];
            dset(x, d, *p0, def ? *def : NONE);
            return def ? *def : NONE;
        }
        if (i < 0) {
            if (def) return *def;
            E(x, at, "pop: the key is not in the dict");
        }
        jv r = d->v[i];
        memmove(&d->k[i], &d->k[i + 1], (d->n - 1 - (size_t)i) * sizeof *d->k);
        memmove(&d->v[i], &d->v[i + 1], (d->n - 1 - (size_t)i) * sizeof *d->v);
        d->n--;
        return r;
}

static jv dict_dictsort(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jdict *d = s->u.d;
        jv *by = arg(a, 2, "by");
        jv *rev = arg(a, 3, "reverse");
        jv *cs = arg(a, 1, "case_sensitive");
        bool byval = by && by->t == V_STR && streq(by->u.s, "value");
        jv *items = al(x, (d->n + 1) * sizeof *items), *keys = al(x, (d->n + 1) * sizeof *keys);
        for (size_t i = 0; i < d->n; i++) {
            jlist *pair = mklist(x, 2);
            pair->tuple = true;
            lpush(x, pair, d->k[i]);
            lpush(x, pair, d->v[i]);
            items[i] = vlist(pair);
            keys[i] = byval ? d->v[i] : d->k[i];
        }
        sort_list(x, at, items, keys, d->n, rev && truthy(rev), !(cs && truthy(cs)));
        jlist *l = mklist(x, d->n);
        for (size_t i = 0; i < d->n; i++) lpush(x, l, items[i]);
        return vlist(l);
}

/* A method of one receiver type, or a filter taking the receiver first: filter
 * says how it was called (PKV_JJ_METHOD entries answer only methods, PKV_JJ_FILTER
 * only filters). */
typedef jv (*method_fn)(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter);
enum { PKV_JJ_METHOD = 1, PKV_JJ_FILTER = 2, PKV_JJ_BOTH = 3 };
typedef struct method_entry {
    const char *name;
    method_fn fn;
    int when;
} method_entry;

/* The rest of the filters, for any receiver. */
typedef jv (*filter_fn)(ev *x, const node *at, const char *name, const jv *s, args *a);
typedef struct filter_entry {
    const char *name;
    filter_fn fn;
} filter_entry;

static const method_entry str_methods[] = {
    {"capitalize", str_capitalize, PKV_JJ_BOTH},
    {"center", str_center, PKV_JJ_FILTER},
    {"count", str_count, PKV_JJ_METHOD},
    {"endswith", str_startswith, PKV_JJ_BOTH},
    {"find", str_find, PKV_JJ_BOTH},
    {"format", str_format, PKV_JJ_BOTH},
    {"index", str_find, PKV_JJ_BOTH},
    {"isalnum", str_is_class, PKV_JJ_BOTH},
    {"isalpha", str_is_class, PKV_JJ_BOTH},
    {"isdigit", str_is_class, PKV_JJ_BOTH},
    {"islower", str_is_class, PKV_JJ_BOTH},
    {"isspace", str_is_class, PKV_JJ_BOTH},
    {"isupper", str_is_class, PKV_JJ_BOTH},
    {"join", str_join, PKV_JJ_METHOD},
    {"lower", str_lower, PKV_JJ_BOTH},
    {"lstrip", str_strip, PKV_JJ_BOTH},
    {"replace", str_replace, PKV_JJ_BOTH},
    {"rfind", str_find, PKV_JJ_BOTH},
    {"rsplit", str_split, PKV_JJ_BOTH},
    {"rstrip", str_strip, PKV_JJ_BOTH},
    {"split", str_split, PKV_JJ_BOTH},
    {"splitlines", str_splitlines, PKV_JJ_BOTH},
    {"startswith", str_startswith, PKV_JJ_BOTH},
    {"strip", str_strip, PKV_JJ_BOTH},
    {"title", str_title, PKV_JJ_BOTH},
    {"trim", str_strip, PKV_JJ_BOTH},
    {"upper", str_upper, PKV_JJ_BOTH},
};

static const method_entry list_methods[] = {
    {"append", list_append, PKV_JJ_METHOD},
    {"count", list_count, PKV_JJ_METHOD},
    {"extend", list_extend, PKV_JJ_METHOD},
    {"index", list_index, PKV_JJ_METHOD},
    {"insert", list_insert, PKV_JJ_METHOD},
    {"pop", list_pop, PKV_JJ_METHOD},
};

static const method_entry dict_methods[] = {
    {"dictsort", dict_dictsort, PKV_JJ_FILTER},
    {"get", dict_get, PKV_JJ_METHOD},
    {"items", dict_items, PKV_JJ_BOTH},
    {"keys", dict_items, PKV_JJ_BOTH},
    {"pop", dict_pop, PKV_JJ_METHOD},
    {"setdefault", dict_pop, PKV_JJ_METHOD},
    {"update", dict_update, PKV_JJ_METHOD},
    {"values", dict_items, PKV_JJ_BOTH},
};

static const filter_entry filters[] = {
    {"abs", filter_abs},
    {"batch", filter_batch_slice},
    {"capitalize", filter_as_string},
    {"count", filter_length},
    {"d", filter_default},
    {"default", filter_default},
    {"e", filter_safe_escape},
    {"escape", filter_safe_escape},
    {"first", filter_first_last},
    {"float", filter_float},
    {"forceescape", filter_safe_escape},
    {"indent", filter_indent},
    {"int", filter_int},
    {"items", filter_items},
    {"join", filter_join},
    {"last", filter_first_last},
    {"length", filter_length},
    {"list", filter_list},
    {"lower", filter_as_string},
    {"map", filter_map},
    {"max", filter_min_max_sum},
    {"min", filter_min_max_sum},
    {"reject", filter_select},
    {"rejectattr", filter_select},
    {"replace", filter_as_string},
    {"reverse", filter_reverse},
    {"round", filter_round},
    {"safe", filter_safe_escape},
    {"select", filter_select},
    {"selectattr", filter_select},
    {"slice", filter_batch_slice},
    {"sort", filter_sort},
    {"split", filter_as_string},
    {"string", filter_string},
    {"strip", filter_as_string},
    {"sum", filter_min_max_sum},
    {"title", filter_as_string},
    {"tojson", filter_tojson},
    {"trim", filter_as_string},
    {"unique", filter_unique},
    {"upper", filter_as_string},
    {"wordcount", filter_wordcount},
};

/* Both entry types start with their name. */
static int by_name(const void *key, const void *entry) { return strcmp(key, *(const char *const *)entry); }

#define LOOKUP(tab, name) ((const void *)bsearch(name, tab, sizeof tab / sizeof tab[0], sizeof tab[0], by_name))

/* Methods and filters that take their receiver first. *found says whether name
 * is one for the receiver's type. */
static jv call_builtin(ev *x, const node *at, const char *name, jv self, args *a, bool filter, bool *found) {
    *found = true;
    const jv *s = &self;
    mark(s, PKV_JINJA_USED);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr")) mark(s, PKV_JINJA_OP_ARRAY);
    const method_entry *m = NULL;
    if (s->t == V_STR) m = LOOKUP(str_methods, name);
    else if (s->t == V_LIST) m = LOOKUP(list_methods, name);
    else if (s->t == V_DICT || s->t == V_NS) m = LOOKUP(dict_methods, name);
    if (m && (m->when & (filter ? PKV_JJ_FILTER : PKV_JJ_METHOD))) return m->fn(x, at, name, s, a, filter);
    if (!filter) {
        *found = false;
        return UNDEF;
    }
    return call_filter(x, at, name, self, a);
}

static jv call_filter(ev *x, const node *at, const char *name, jv self, args *a) {
    const filter_entry *f = LOOKUP(filters, name);
    if (!f) E(x, at, "no filter named '%s'", name);
    return f->fn(x, at, name, &self, a);
}

static jv call_test(ev *x, const node *at, const char *name, const jv *v, args *a, bool *found) {
    *found = true;
    jv *p0 = arg(a, 0, NULL);
    mark(v, PKV_JINJA_USED);
    if (!strcmp(name, "string")) mark(v, PKV_JINJA_OP_STRING);
    if (!strcmp(name, "defined")) return vbool(v->t != V_UNDEF);
    if (!strcmp(name, "undefined")) return vbool(v->t == V_UNDEF);
    if (!strcmp(name, "none")) return vbool(v->t == V_NONE);
    if (!strcmp(name, "string")) return vbool(v->t == V_STR);
    if (!strcmp(name, "number")) return vbool(v->t == V_INT || v->t == V_FLOAT);
    if (!strcmp(name, "integer")) return vbool(v->t == V_INT);
    if (!strcmp(name, "float")) return vbool(v->t == V_FLOAT);
    if (!strcmp(name, "boolean")) return vbool(v->t == V_BOOL);
    if (!strcmp(name, "true")) return vbool(v->t == V_BOOL && v->u.b);
    if (!strcmp(name, "false")) return vbool(v->t == V_BOOL && !v->u.b);
    if (!strcmp(name, "mapping")) return vbool(v->t == V_DICT);
    if (!strcmp(name, "iterable")) return vbool(v->t == V_LIST || v->t == V_DICT || v->t == V_STR);
    if (!strcmp(name, "sequence")) return vbool(v->t == V_LIST || v->t == V_DICT || v->t == V_STR);
    if (!strcmp(name, "callable")) return vbool(v->t == V_MACRO || v->t == V_FUNC);
    if (!strcmp(name, "escaped")) return vbool(false);
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v->t != V_INT) E(x, at, "test '%s' needs an integer, not %s", name, tname(v));
        return vbool((v->u.i % 2 != 0) == (name[0] == 'o'));
    }
    if (!strcmp(name, "divisibleby")) {
        if (!p0 || numi(p0) == 0) E(x, at, "divisibleby: a non-zero number is needed");
        if (numi(p0) == -1) return vbool(true); /* INT64_MIN % -1 would trap */
        return vbool(numi(v) % numi(p0) == 0);
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->t != V_STR) return vbool(false);
        bool f;
        args none = {0};
        return call_builtin(x, at, name[0] == 'l' ? "islower" : "isupper", *v, &none, false, &f);
    }
    if (!p0 && (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "in") || !strcmp(name, "sameas")))
        E(x, at, "test '%s' needs an argument", name);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==") || !strcmp(name, "sameas")) {
        if (!p0) E(x, at, "test '%s' needs an argument", name);
        return vbool(eq(x, v, p0, 0));
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        if (!p0) E(x, at, "test '%s' needs an argument", name);
        return vbool(!eq(x, v, p0, 0));
    }
    static const char *const cmps[][2] = {{"lt", "<"}, {"le", "<="}, {"gt", ">"}, {"ge", ">="}, {"lessthan", "<"}, {"greaterthan", ">"}};
    for (size_t i = 0; i < sizeof cmps / sizeof cmps[0]; i++)
        if (!strcmp(name, cmps[i][0]) || !strcmp(name, cmps[i][1])) {
            if (!p0) E(x, at, "test '%s' needs an argument", name);
            int c = cmp(x, at, v, p0);
            const char *o = cmps[i][1];
            return vbool(o[0] == '<' ? (o[1] ? c <= 0 : c < 0) : (o[1] ? c >= 0 : c > 0));
        }
    if (!strcmp(name, "in")) {
        if (p0->t == V_STR && v->t == V_STR) return vbool(memmem_(x, p0->u.s->s, p0->u.s->n, v->u.s->s, v->u.s->n) != NULL);
        if (p0->t == V_LIST) {
            for (size_t i = 0; i < p0->u.l->n; i++)
                if (eq(x, &p0->u.l->a[i], v, 0)) return vbool(true);
            return vbool(false);
        }
        if (p0->t == V_DICT) return vbool(dfind(x, p0->u.d, v) >= 0);
        return vbool(false);
    }
    *found = false;
    return UNDEF;
}

/* ---- attributes, calls */

static bool method_name(int t, const char *name) {
    static const char *const str_m[] = {"upper", "lower", "title", "capitalize", "strip", "lstrip", "rstrip", "startswith",
                                        "endswith", "split", "rsplit", "replace", "find", "rfind", "index", "count",
                                        "format", "join", "isdigit", "isalpha", "isspace", "isalnum", "islower",
                                        "isupper", "splitlines", NULL};
    static const char *const list_m[] = {"append", "extend", "insert", "pop", "index", "count", NULL};
    static const char *const dict_m[] = {"items", "keys", "values", "get", "update", "pop", "setdefault", NULL};
    const char *const *m = t == V_STR ? str_m : t == V_LIST ? list_m : t == V_DICT ? dict_m : NULL;
    for (; m && *m; m++)
        if (!strcmp(*m, name)) return true;
    return false;
}

static jv bound(ev *x, const char *name, jv self) {
    jfunc *f = al(x, sizeof *f);
    f->name = name;
    f->self = self;
    jv v = {V_FUNC, {0}};
    v.u.fn = f;
    return v;
}

/* obj.key / obj[key]: a missing key is undefined; attributes of undefined and
 * none are undefined too (llama.cpp's lenient rule) */
static jv getattr_v(ev *x, const node *at, const jv *obj, const jv *key) {
    (void)at;
    mark(obj, PKV_JINJA_USED);
    jv r = UNDEF;
    if (obj->t == V_DICT || obj->t == V_NS) {
        long i = dfind(x, obj->u.d, key);
        if (i >= 0) r = obj->u.d->v[i];
        else if (obj->t == V_DICT && key->t == V_STR) {
            char nm[32];
            if (key->u.s->n < sizeof nm) {
                memcpy(nm, key->u.s->s, key->u.s->n);
                nm[key->u.s->n] = 0;
                if (method_name(V_DICT, nm)) r = bound(x, mkstr(x, nm, strlen(nm))->s, *obj);
            }
        }
    } else if ((obj->t == V_LIST || obj->t == V_STR) && (key->t == V_INT || key->t == V_BOOL)) {
        mark(obj, PKV_JINJA_OP_ARRAY);
        int64_t i = numi(key), n = obj->t == V_LIST ? (int64_t)obj->u.l->n : (int64_t)obj->u.s->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) r = obj->t == V_LIST ? obj->u.l->a[i] : vstr(substr(x, obj->u.s, (size_t)i, (size_t)i + 1));
    } else if ((obj->t == V_LIST || obj->t == V_STR) && key->t == V_STR) {
        char nm[32];
        if (key->u.s->n < sizeof nm) {
            memcpy(nm, key->u.s->s, key->u.s->n);
            nm[key->u.s->n] = 0;
            if (method_name(obj->t, nm)) r = bound(x, mkstr(x, nm, strlen(nm))->s, *obj);
        }
    }
    mark(&r, PKV_JINJA_USED);
    return r;
}

static const char *const k_globals[] = {"range", "namespace", "raise_exception", "strftime_now", "dict", "joiner", NULL};

static jv call_global(ev *x, const node *at, const char *name, args *a) {
    jv *p0 = arg(a, 0, NULL);
    if (!strcmp(name, "raise_exception")) {
        const jstr *m = p0 ? to_str(x, p0) : mkstr(x, "raise_exception called", 22);
        fail_at(&x->j, PKV_JINJA_ERAISE, at->line, at->col, "%.*s", (int)(m->n > 500 ? 500 : m->n), m->s);
    }
    if (!strcmp(name, "range")) {
        int64_t lo = 0, hi, st = 1;
        if (a->np == 0) E(x, at, "range: an argument is needed");
        if (a->np == 1) hi = numi(p0);
        else {
            lo = numi(p0);
            hi = numi(&a->pos[1]);
            if (a->np > 2) st = numi(&a->pos[2]);
        }
        if (st == 0) E(x, at, "range: the step must not be zero");
        jlist *l = mklist(x, 0);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
            step(x);
            lpush(x, l, vint(i));
            if (st > 0 ? i > INT64_MAX - st : i < INT64_MIN - st) break; /* the next one is past hi anyway */
            i += st;
        }
        return vlist(l);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jdict *d = mkdict(x);
        if (p0 && p0->t == V_DICT)
            for (size_t i = 0; i < p0->u.d->n; i++) dset(x, d, p0->u.d->k[i], p0->u.d->v[i]);
        for (int k = 0; k < a->nk; k++) dset_c(x, d, a->kn[k], a->kw[k]);
        jv v = vdict(d);
        if (name[0] == 'n') v.t = V_NS;
        return v;
    }
    if (!strcmp(name, "strftime_now")) {
        const jstr *f = p0 && p0->t == V_STR ? p0->u.s : NULL;
        if (!f) E(x, at, "strftime_now: a format string is needed");
        time_t tt = x->now ? (time_t)x->now : time(NULL);
        struct tm tm;
        localtime_r(&tt, &tm);
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(f->n > 255 ? 255 : f->n), f->s);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        return vstr(mkstr(x, buf, n));
    }
    E(x, at, "'%s' cannot be called here", name);
}

static jv call_macro(ev *x, const node *at, const node *m, args *a, const node *caller);

static jv call_value(ev *x, const node *at, jv callee, args *a) {
    step(x);
    if (callee.t == V_MACRO) return call_macro(x, at, callee.u.m, a, NULL);
    if (callee.t != V_FUNC) E(x, at, "%s is not callable", tname(&callee));
    jfunc *f = callee.u.fn;
    if (f->self.t == V_UNDEF) return call_global(x, at, f->name, a);
    bool found;
    jv r = call_builtin(x, at, f->name, f->self, a, false, &found);
    if (!found) E(x, at, "%s has no method '%s'", tname(&f->self), f->name);
    return r;
}

static jv call_macro(ev *x, const node *at, const node *m, args *a, const node *caller) {
    if (++x->depth > x->max_depth) E_limit(x, "macro calls nested deeper than the render limit allows");
    scope *sc = push_scope(x, x->globals);
    for (int i = 0; i < m->nkn; i++) {
        jv *v = arg(a, i, m->kn[i]);
        jv val = v ? *v : m->w[i] ? eval(x, sc, m->w[i]) : UNDEF;
        dset_c(x, sc->vars, m->kn[i], val);
    }
    if (a->np > m->nkn) E(x, at, "macro '%s' takes %d arguments, %d given", m->name, m->nkn, a->np);
    if (caller) {
        jv c = {V_MACRO, {0}};
        c.u.m = caller;
        dset_c(x, sc->vars, "caller", c);
    }
    sink o = {0};
    exec(x, sc, m->b, &o);
    x->brk = 0;
    x->depth--;
    return vstr(sk_str(x, &o));
}

static void eval_args(ev *x, scope *sc, const node *n, args *a, int skip_first) {
    (void)skip_first;
    a->np = n->nv;
    a->nk = n->nw;
    a->pos = al(x, ((size_t)n->nv + 1) * sizeof *a->pos);
    a->kw = al(x, ((size_t)n->nw + 1) * sizeof *a->kw);
    a->kn = n->kn;
    for (int i = 0; i < n->nv; i++) a->pos[i] = eval(x, sc, n->v[i]);
    for (int i = 0; i < n->nw; i++) a->kw[i] = eval(x, sc, n->w[i]);
}

static jv arith(ev *x, const node *n, int op, const jv *a, const jv *b) {
    if (op == OP_ADD && a->t == V_STR && b->t == V_STR) {
        sink o = {0};
        sk_jstr(x, &o, a->u.s);
        sk_jstr(x, &o, b->u.s);
        return vstr(sk_str(x, &o));
    }
    if (op == OP_ADD && a->t == V_LIST && b->t == V_LIST) {
        jlist *l = mklist(x, a->u.l->n + b->u.l->n);
        for (size_t i = 0; i < a->u.l->n; i++) lpush(x, l, a->u.l->a[i]);
        for (size_t i = 0; i < b->u.l->n; i++) lpush(x, l, b->u.l->a[i]);
        return vlist(l);
    }
    if (op == OP_MUL && ((a->t == V_STR && b->t == V_INT) || (a->t == V_INT && b->t == V_STR))) {
        const jstr *s = a->t == V_STR ? a->u.s : b->u.s;
        int64_t k = a->t == V_INT ? a->u.i : b->u.i;
        sink o = {0};
        if (k > 0 && s->n && (uint64_t)k > x->max_output / s->n) E_limit(x, "a string repeated (*) beyond the output limit");
        for (int64_t i = 0; i < k; i++) {
            step(x);
            sk_jstr(x, &o, s);
        }
        return vstr(sk_str(x, &o));
    }
    if (op == OP_MOD && a->t == V_STR) {
        args fa = {0};
        jv one[1] = {*b};
        if (b->t == V_LIST) {
            fa.pos = b->u.l->a;
            fa.np = (int)b->u.l->n;
        } else {
            fa.pos = one;
            fa.np = 1;
        }
        return fmt_percent(x, n, a->u.s, &fa);
    }
    if (!isnum(a) || !isnum(b)) {
        static const char *const ops[] = {"+", "-", "*", "/", "//", "%", "**"};
        E(x, n, "unsupported operand types for %s: %s and %s", ops[op], tname(a), tname(b));
    }
    bool ints = a->t != V_FLOAT && b->t != V_FLOAT;
    int64_t p = numi(a), q = numi(b);
    double f = numf(a), g = numf(b);
    switch (op) {
    case OP_ADD: return ints ? vint(ck_add(x, n, p, q, "+")) : vfloat(f + g);
    case OP_SUB: return ints ? vint(ck_sub(x, n, p, q, "-")) : vfloat(f - g);
    case OP_MUL: return ints ? vint(ck_mul(x, n, p, q, "*")) : vfloat(f * g);
    case OP_DIV:
        if (g == 0) E(x, n, "division by zero");
        return vfloat(f / g);
    case OP_FDIV:
    case OP_MOD:
        if (ints) {
            if (q == 0) E(x, n, "division by zero");
            if (q == -1 && p == INT64_MIN) {
                if (op == OP_FDIV) E_ovf(x, n, "//");
                return vint(0);
            }
            int64_t d = p / q, r = p % q;
            if (r != 0 && ((r < 0) != (q < 0))) {
                d--;
                r += q;
            }
            return vint(op == OP_FDIV ? d : r);
        }
        if (g == 0) E(x, n, "division by zero");
        if (op == OP_FDIV) return vfloat(floor(f / g));
        {
            double r = fmod(f, g);
            if (r != 0 && ((r < 0) != (g < 0))) r += g;
            return vfloat(r);
        }
    default: /* OP_POW */
        if (ints && q >= 0) {
            int64_t r = 1;
            if (p == 0 || p == 1) return vint(q == 0 ? 1 : p);
            if (p == -1) return vint(q % 2 ? -1 : 1);
            for (int64_t i = 0; i < q; i++) r = ck_mul(x, n, r, p, "**"); /* |p| >= 2: overflows within 64 rounds */
            return vint(r);
        }
        return vfloat(pow(f, g));
    }
}

static jv in_op(ev *x, const node *n, const jv *a, const jv *b) {
    if (b->t == V_STR) {
        if (a->t != V_STR) E(x, n, "'in <string>' needs a string on the left, not %s", tname(a));
        return vbool(memmem_(x, b->u.s->s, b->u.s->n, a->u.s->s, a->u.s->n) != NULL);
    }
    if (b->t == V_LIST) {
        for (size_t i = 0; i < b->u.l->n; i++)
            if (eq(x, &b->u.l->a[i], a, 0)) return vbool(true);
        return vbool(false);
    }
    if (b->t == V_DICT || b->t == V_NS) return vbool(dfind(x, b->u.d, a) >= 0);
    if (b->t == V_UNDEF || b->t == V_NONE) return vbool(false);
    E(x, n, "'in' needs a string, list or dict on the right, not %s", tname(b));
}

static jv slice(ev *x, const node *n, const jv *o, const jv *va, const jv *vb, const jv *vc) {
    int64_t len = o->t == V_LIST ? (int64_t)o->u.l->n : o->t == V_STR ? (int64_t)o->u.s->n : -1;
    if (len < 0) {
        if (o->t == V_UNDEF) return UNDEF;
        E(x, n, "cannot slice %s", tname(o));
    }
    mark(o, PKV_JINJA_USED | PKV_JINJA_OP_ARRAY);
    int64_t st = vc && vc->t != V_NONE && vc->t != V_UNDEF ? numi(vc) : 1;
    if (st == 0) E(x, n, "slice step cannot be zero");
    int64_t lo, hi;
    bool has_a = va && va->t != V_NONE && va->t != V_UNDEF, has_b = vb && vb->t != V_NONE && vb->t != V_UNDEF;
    if (st > 0) {
        lo = has_a ? numi(va) : 0;
        hi = has_b ? numi(vb) : len;
        if (lo < 0) lo = lo + len < 0 ? 0 : lo + len;
        if (hi < 0) hi = hi + len < 0 ? 0 : hi + len;
        if (lo > len) lo = len;
        if (hi > len) hi = len;
    } else {
        lo = has_a ? numi(va) : len - 1;
        hi = has_b ? numi(vb) : -1;
        if (has_a && lo < 0) lo = lo + len < -1 ? -1 : lo + len;
        if (has_b && hi < 0) hi = hi + len < -1 ? -1 : hi + len;
        if (lo >= len) lo = len - 1;
        if (hi >= len) hi = len - 1;
    }
    if (o->t == V_STR && st == 1) return vstr(substr(x, o->u.s, (size_t)lo, (size_t)(hi > lo ? hi : lo)));
    sink s = {0};
    jlist *l = mklist(x, 0);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
        step(x);
        if (o->t == V_LIST) lpush(x, l, o->u.l->a[i]);
        else sk_put(x, &s, o->u.s->s + i, 1);
        if (st > 0 ? i > INT64_MAX - st : i < INT64_MIN - st) break; /* the next one is out of range anyway */
        i += st;
    }
    if (o->t == V_STR) return vstr(derived(x, s.p ? s.p : "", s.n, o->u.s->nsp != 0));
    return vlist(l);
}

static jv eval(ev *x, scope *sc, const node *n) {
    const node *saved = x->at;
    x->at = n;
    if (++x->depth > x->max_depth + 200) E_limit(x, "expressions nested deeper than the render limit allows");
    jv r = UNDEF, a, b;
    switch (n->k) {
    case N_LIT:
        r = n->lit;
        if (r.t == V_STR) { /* a fresh string object: use flags are per value */
            jstr *t = al(x, sizeof *t);
            *t = *n->lit.u.s;
            r.u.s = t;
        }
        break;
    case N_NAME: {
        jv *v = lookup(x, sc, n->name);
        if (v) r = *v;
        else
            for (int i = 0; k_globals[i]; i++)
                if (!strcmp(k_globals[i], n->name)) r = bound(x, k_globals[i], UNDEF);
        break;
    }
    case N_LIST:
    case N_TUPLE: {
        jlist *l = mklist(x, (size_t)n->nv);
        for (int i = 0; i < n->nv; i++) lpush(x, l, eval(x, sc, n->v[i]));
        l->tuple = n->k == N_TUPLE;
        r = vlist(l);
        break;
    }
    case N_DICT: {
        jdict *d = mkdict(x);
        for (int i = 0; i < n->nv; i++) {
            jv k = eval(x, sc, n->v[i]);
            dset(x, d, k, eval(x, sc, n->w[i]));
        }
        r = vdict(d);
        break;
    }
    case N_ATTR: {
        a = eval(x, sc, n->a);
        jv k = vstr(mkstr(x, n->name, strlen(n->name)));
        if ((a.t == V_STR || a.t == V_LIST || a.t == V_DICT) && method_name(a.t, n->name)) {
            mark(&a, PKV_JINJA_USED);
            r = bound(x, n->name, a); /* a method wins over a key of the same name, as in Jinja2 */
        } else {
            r = getattr_v(x, n, &a, &k);
        }
        break;
    }
    case N_INDEX:
        a = eval(x, sc, n->a);
        b = eval(x, sc, n->b);
        r = getattr_v(x, n, &a, &b);
        break;
    case N_SLICE: {
        a = eval(x, sc, n->a);
        jv p = n->b ? eval(x, sc, n->b) : NONE, q = n->c ? eval(x, sc, n->c) : NONE, s = n->d ? eval(x, sc, n->d) : NONE;
        r = slice(x, n, &a, &p, &q, &s);
        break;
    }
    case N_CALL: {
        args ar;
        jv callee = eval(x, sc, n->a);
        eval_args(x, sc, n, &ar, 0);
        x->at = n;
        if (callee.t == V_UNDEF) E(x, n, "'%s' is undefined and cannot be called", n->a->k == N_NAME ? n->a->name : n->a->k == N_ATTR ? n->a->name : "the callee");
        r = call_value(x, n, callee, &ar);
        break;
    }
    case N_FILTER: {
        args ar;
        a = eval(x, sc, n->a);
        eval_args(x, sc, n, &ar, 0);
        x->at = n;
        step(x);
        bool found;
        r = call_builtin(x, n, n->name, a, &ar, true, &found);
        break;
    }
    case N_TEST: {
        args ar;
        a = eval(x, sc, n->a);
        eval_args(x, sc, n, &ar, 0);
        x->at = n;
        bool found;
        r = call_test(x, n, n->name, &a, &ar, &found);
        if (!found) E(x, n, "no test named '%s'", n->name);
        if (n->neg) r = vbool(!truthy(&r));
        break;
    }
    case N_NEG:
    case N_POS:
        a = eval(x, sc, n->a);
        if (!isnum(&a)) E(x, n, "bad operand type for unary %c: %s", n->k == N_NEG ? '-' : '+', tname(&a));
        r = n->k == N_POS ? a : a.t == V_FLOAT ? vfloat(-a.u.f) : vint(ck_sub(x, n, 0, numi(&a), "unary -"));
        break;
    case N_NOT:
        a = eval(x, sc, n->a);
        r = vbool(!truthy(&a));
        break;
    case N_AND:
        a = eval(x, sc, n->a);
        r = truthy(&a) ? eval(x, sc, n->b) : a;
        break;
    case N_OR:
        a = eval(x, sc, n->a);
        r = truthy(&a) ? a : eval(x, sc, n->b);
        break;
    case N_BIN:
        a = eval(x, sc, n->a);
        b = eval(x, sc, n->b);
        x->at = n;
        r = arith(x, n, n->op, &a, &b);
        break;
    case N_CONCAT: {
        a = eval(x, sc, n->a);
        b = eval(x, sc, n->b);
        sink o = {0};
        sk_jstr(x, &o, to_str(x, &a));
        sk_jstr(x, &o, to_str(x, &b));
        r = vstr(sk_str(x, &o));
        break;
    }
    case N_CMP:
        a = eval(x, sc, n->a);
        b = eval(x, sc, n->b);
        x->at = n;
        if (n->op == OP_EQ) r = vbool(eq(x, &a, &b, 0));
        else if (n->op == OP_NE) r = vbool(!eq(x, &a, &b, 0));
        else {
            int c = cmp(x, n, &a, &b);
            r = vbool(n->op == OP_LT ? c < 0 : n->op == OP_LE ? c <= 0 : n->op == OP_GT ? c > 0 : c >= 0);
        }
        break;
    case N_IN:
        a = eval(x, sc, n->a);
        b = eval(x, sc, n->b);
        x->at = n;
        r = in_op(x, n, &a, &b);
        if (n->neg) r = vbool(!truthy(&r));
        break;
    case N_COND:
        a = eval(x, sc, n->a);
        r = truthy(&a) ? eval(x, sc, n->b) : n->c ? eval(x, sc, n->c) : UNDEF;
        break;
    default: E(x, n, "internal: not an expression");
    }
    x->depth--;
    x->at = saved;
    return r;
}

static void assign(ev *x, scope *sc, const node *n, const char **names, int nn, jv v) {
    if (nn <= 1) {
        dset_c(x, sc->vars, names[0], v);
        return;
    }
    if (v.t != V_LIST || (int)v.u.l->n != nn) E(x, n, "cannot unpack %s into %d names", tname(&v), nn);
    for (int i = 0; i < nn; i++) dset_c(x, sc->vars, names[i], v.u.l->a[i]);
}

static void exec_for(ev *x, scope *sc, const node *n, sink *out) {
    jv it = eval(x, sc, n->a);
    x->at = n;
    mark(&it, PKV_JINJA_USED | (it.t == V_LIST ? PKV_JINJA_OP_ARRAY : 0));
    jlist *src;
    if (it.t == V_DICT && n->nkn == 2) { /* for k, v in dict: its items */
        bool f;
        args none = {0};
        src = call_builtin(x, n, "items", it, &none, false, &f).u.l;
    } else if (it.t == V_UNDEF || it.t == V_NONE) {
        if (it.t == V_NONE) E(x, n, "for loop over none");
        src = mklist(x, 0);
    } else {
        if (it.t != V_LIST && it.t != V_DICT && it.t != V_STR) E(x, n, "cannot loop over %s", tname(&it));
        src = iter_list(x, n, &it, "for").u.l;
    }
    /* the loop filter runs first: loop.length counts what passes it */
    jlist *items = src;
    if (n->b) {
        items = mklist(x, 0);
        for (size_t i = 0; i < src->n; i++) {
            step(x);
            scope *fs = push_scope(x, sc);
            assign(x, fs, n, n->kn, n->nkn, src->a[i]);
            jv c = eval(x, fs, n->b);
            if (truthy(&c)) lpush(x, items, src->a[i]);
        }
    }
    size_t len = items->n;
    if (!len) {
        if (n->d) exec(x, sc, n->d, out);
        return;
    }
    for (size_t i = 0; i < len; i++) {
        step(x);
        scope *ls = push_scope(x, sc);
        jdict *loop = mkdict(x);
        dset_c(x, loop, "index", vint((int64_t)i + 1));
        dset_c(x, loop, "index0", vint((int64_t)i));
        dset_c(x, loop, "revindex", vint((int64_t)(len - i)));
        dset_c(x, loop, "revindex0", vint((int64_t)(len - i - 1)));
        dset_c(x, loop, "first", vbool(i == 0));
        dset_c(x, loop, "last", vbool(i + 1 == len));
        dset_c(x, loop, "length", vint((int64_t)len));
        dset_c(x, loop, "previtem", i ? items->a[i - 1] : UNDEF);
        dset_c(x, loop, "nextitem", i + 1 < len ? items->a[i + 1] : UNDEF);
        dset_c(x, ls->vars, "loop", vdict(loop));
        assign(x, ls, n, n->kn, n->nkn, items->a[i]);
        exec(x, ls, n->c, out);
        if (x->brk == 1) {
            x->brk = 0;
            break;
        }
        x->brk = 0;
    }
}

static void exec(ev *x, scope *sc, const node *n, sink *out) {
    switch (n->k) {
    case S_BODY:
        for (int i = 0; i < n->nv && !x->brk; i++) exec(x, sc, n->v[i], out);
        return;
    case S_TEXT: sk_jstr(x, out, n->lit.u.s); return;
    default: break;
    }
    step(x);
    x->at = n;
    switch (n->k) {
    case S_OUT: {
        jv v = eval(x, sc, n->a);
        if (v.t == V_STR) sk_jstr(x, out, v.u.s);
        else put_str(x, out, &v, 0);
        return;
    }
    case S_IF: /* an elif chain is walked in a loop, not by recursion: it may be long */
        for (;;) {
            jv c = eval(x, sc, n->a);
            if (truthy(&c)) {
                exec(x, sc, n->b, out);
                return;
            }
            if (!n->c) return;
            if (n->c->k != S_IF) {
                exec(x, sc, n->c, out);
                return;
            }
            n = n->c;
            step(x);
            x->at = n;
        }
    case S_FOR: exec_for(x, sc, n, out); return;
    case S_SET: {
        jv v = eval(x, sc, n->b);
        x->at = n;
        if (n->a->k == N_ATTR) {
            jv *t = lookup(x, sc, n->a->a->name);
            if (!t || (t->t != V_NS && t->t != V_DICT)) E(x, n, "cannot set an attribute of '%s': it is not a namespace", n->a->a->name);
            dset_c(x, t->u.d, n->a->name, v);
        } else {
            assign(x, sc, n, n->kn, n->nkn, v);
        }
        return;
    }
    case S_SETBLOCK: {
        sink o = {0};
        exec(x, sc, n->b, &o);
        dset_c(x, sc->vars, n->name, vstr(sk_str(x, &o)));
        return;
    }
    case S_MACRO: {
        jv m = {V_MACRO, {0}};
        m.u.m = n;
        dset_c(x, sc->vars, n->name, m);
        return;
    }
    case S_BREAK: x->brk = 1; return;
    case S_CONTINUE: x->brk = 2; return;
    case S_DO: (void)eval(x, sc, n->a); return;
    case S_FILTERBLOCK: {
        sink o = {0};
        exec(x, sc, n->b, &o);
        /* the placeholder literal stands for the body's text */
        node *ph = (node *)n->c;
        jv saved = ph->lit;
        ph->lit = vstr(sk_str(x, &o));
        jv v = eval(x, sc, n->a);
        ph->lit = saved;
        put_str(x, out, &v, 0);
        return;
    }
    case S_CALLBLOCK: {
        const node *c = n->a;
        jv callee = eval(x, sc, c->a);
        if (callee.t != V_MACRO) E(x, n, "'call' needs a macro");
        args ar;
        eval_args(x, sc, c, &ar, 0);
        node *caller = al(x, sizeof *caller);
        caller->k = S_MACRO;
        caller->name = "caller";
        caller->b = n->b;
        caller->line = n->line;
        caller->col = n->col;
        jv r = call_macro(x, n, callee.u.m, &ar, caller);
        sk_jstr(x, out, r.u.s);
        return;
    }
    default: E(x, n, "internal: not a statement");
    }
}

/* ---- entry */

static unsigned probe_path(ev *x, jdict *root, const char *path) {
    jv cur = vdict(root);
    const char *p = path;
    while (*p) {
        const char *d = strchr(p, '.');
        size_t n = d ? (size_t)(d - p) : strlen(p);
        jv k;
        char *end;
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.*s", (int)(n < 63 ? n : 63), p);
        long iv = strtol(tmp, &end, 10);
        if (cur.t == V_LIST && *tmp && !*end) k = vint(iv);
        else k = vstr(mkstr(x, tmp, strlen(tmp)));
        if (cur.t == V_DICT) {
            long i = dfind(x, cur.u.d, &k);
            cur = i >= 0 ? cur.u.d->v[i] : UNDEF;
        } else if (cur.t == V_LIST && k.t == V_INT && k.u.i >= 0 && (size_t)k.u.i < cur.u.l->n) {
            cur = cur.u.l->a[k.u.i];
        } else {
            return 0;
        }
        p += n;
        if (*p == '.') p++;
    }
    unsigned *f = flags_of(&cur);
    return f ? *f : 0;
}

char *pkv_jinja_render(const pkv_jinja *t, json_t *ctx, bool data, int64_t now, const pkv_jinja_limits *lim,
                       size_t *len, size_t **spans, size_t *n_spans, pkv_jinja_probe *probe, pkv_jinja_error *e) {
    memset(e, 0, sizeof *e);
    if (spans) { /* nothing to free on error */
        *spans = NULL;
        *n_spans = 0;
    }
    ev *volatile x = calloc(1, sizeof *x);
    if (!x) {
        e->kind = PKV_JINJA_ENOMEM;
        snprintf(e->msg, sizeof e->msg, "out of memory");
        return NULL;
    }
    x->j.e = e;
    x->max_steps = lim && lim->max_steps ? lim->max_steps : 10000000;
    x->max_output = lim && lim->max_output ? lim->max_output : (size_t)64 << 20;
    x->ar.limit = lim && lim->max_memory ? lim->max_memory : (size_t)512 << 20;
    x->max_depth = lim && lim->max_depth ? lim->max_depth : 200;
    x->max_work = lim && lim->max_work ? lim->max_work : (int64_t)1 << 30;
    x->max_time_ms = lim && lim->max_time_ms ? lim->max_time_ms : 10000;
    x->deadline_ms = now_ms() + x->max_time_ms;
    x->next_poll = (int64_t)1 << 20;
    if (lim) {
        x->cancel = lim->cancel;
        x->cancel_ud = lim->cancel_ud;
        x->ar.shared = lim->shared;
    }
    x->now = now;
    char *volatile res = NULL;
    size_t *volatile sp = NULL;
    if (setjmp(x->j.jb)) {
        free(res);
        free(sp);
        arena_free(&x->ar);
        free(x);
        return NULL;
    }
    x->globals = push_scope(x, NULL);
    if (ctx && json_is_object(ctx)) {
        jv g = from_json(x, ctx, data, 0);
        x->globals->vars = g.u.d;
    }
    /* the inputs as given: a template may rebind "messages" (set messages = messages[1:]) */
    jdict *given = mkdict(x);
    for (size_t i = 0; i < x->globals->vars->n; i++) dset(x, given, x->globals->vars->k[i], x->globals->vars->v[i]);
    sink out = {0};
    exec(x, x->globals, t->root, &out);
    if (probe)
        for (int i = 0; i < probe->n_paths; i++) probe->flags[i] = probe_path(x, given, probe->paths[i]);
    res = malloc(out.n + 1);
    if (!res) fail_at(&x->j, PKV_JINJA_ENOMEM, 0, 0, "out of memory");
    if (out.n) memcpy(res, out.p, out.n);
    res[out.n] = 0;
    if (spans) {
        sp = malloc((2 * out.nsp + 1) * sizeof *sp);
        if (!sp) fail_at(&x->j, PKV_JINJA_ENOMEM, 0, 0, "out of memory");
        if (out.nsp) memcpy(sp, out.sp, 2 * out.nsp * sizeof *sp);
        *spans = sp;
        *n_spans = out.nsp;
    }
    *len = out.n;
    arena_free(&x->ar);
    free(x);
    return res;
}
