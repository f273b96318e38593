/* Internal header of the Jinja interpreter (src/chat/jinja*.c; the contract is
 * jinja.h): its arenas, values, AST, tokens and evaluator state, and the functions
 * its files share. pkv_jj_ names are the interpreter's own, used by no other file.
 * Errors inside the parser and the evaluator longjmp to the entry point (jerr). */
#ifndef PKV_JINJA_IMPL_H
#define PKV_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "chat/jinja.h"

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

#define UNDEF ((jv){V_UNDEF, {0}})
#define NONE ((jv){V_NONE, {0}})

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

/* growable node arrays during parsing */
typedef struct nvec {
    node **v;
    const char **names;
    int n, cap;
} nvec;

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

/* ---- builtins: filters, tests, methods and global functions */

typedef struct args {
    jv *pos;
    int np;
    const char **kn;
    jv *kw;
    int nk;
} args;

/* ------------------------------------------------------------------ small value helpers */

static inline jv vstr(jstr *s) {
    jv v = {V_STR, {0}};
    v.u.s = s;
    return v;
}
static inline jv vint(int64_t i) {
    jv v = {V_INT, {0}};
    v.u.i = i;
    return v;
}

static inline jv vfloat(double f) {
    jv v = {V_FLOAT, {0}};
    v.u.f = f;
    return v;
}

static inline jv vbool(bool b) {
    jv v = {V_BOOL, {0}};
    v.u.b = b;
    return v;
}

static inline jv vlist(jlist *l) {
    jv v = {V_LIST, {0}};
    v.u.l = l;
    return v;
}
static inline jv vdict(jdict *d) {
    jv v = {V_DICT, {0}};
    v.u.d = d;
    return v;
}

static inline bool streq(const jstr *a, const char *b) { return a->n == strlen(b) && !memcmp(a->s, b, a->n); }

static inline bool truthy(const jv *v) {
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

static inline const char *tname(const jv *v) {
    static const char *const names[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict", "namespace", "macro", "function"};
    if (v->t == V_LIST && v->u.l->tuple) return "tuple";
    return names[v->t];
}

static inline bool isnum(const jv *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }
static inline double numf(const jv *v) { return v->t == V_FLOAT ? v->u.f : v->t == V_INT ? (double)v->u.i : v->t == V_BOOL ? v->u.b : 0; }
/* a float out of range (or NaN) saturates instead of an undefined conversion */
static inline int64_t f2i(double f) {
    if (f != f) return 0;
    if (f >= 9223372036854775807.0) return INT64_MAX;
    if (f <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)f;
}
static inline int64_t numi(const jv *v) { return v->t == V_INT ? v->u.i : v->t == V_FLOAT ? f2i(v->u.f) : v->t == V_BOOL ? v->u.b : 0; }

/* jinja.c: arenas (NULL when the limit or malloc says no) and the error exit */
void pkv_jj_arena_free(arena *a);
void *pkv_jj_arena_get(arena *a, size_t n);
_Noreturn void pkv_jj_fail_at(jerr *j, pkv_jinja_err kind, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* jinja-lex.c: the lexer */
_Noreturn void pkv_jj_lex_fail(lexer *L, size_t at, const char *msg);
void pkv_jj_lex(lexer *L);

/* jinja-eval.c: errors and limits of a render, text sinks, values, comparison,
 * text and JSON, attributes and calls */
_Noreturn void pkv_jj_fail(ev *x, const node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *pkv_jj_alloc(ev *x, size_t n);
void pkv_jj_work(ev *x, size_t n);
void pkv_jj_step(ev *x);
void pkv_jj_sk_put(ev *x, sink *s, const char *p, size_t n);
void pkv_jj_sk_cstr(ev *x, sink *s, const char *p);
void pkv_jj_sk_jstr(ev *x, sink *s, const jstr *t);
jstr *pkv_jj_sk_str(ev *x, sink *s);
jstr *pkv_jj_mkstr(ev *x, const char *p, size_t n);
jstr *pkv_jj_substr(ev *x, const jstr *t, size_t a, size_t b);
jstr *pkv_jj_derived(ev *x, const char *p, size_t n, bool data);
jv pkv_jj_vcstr(ev *x, const char *s);
jlist *pkv_jj_mklist(ev *x, size_t cap);
void pkv_jj_lpush(ev *x, jlist *l, jv e);
long pkv_jj_dfind(ev *x, const jdict *d, const jv *k);
void pkv_jj_dset(ev *x, jdict *d, jv k, jv v);
void pkv_jj_dset_c(ev *x, jdict *d, const char *k, jv v);
void pkv_jj_mark(const jv *v, unsigned f);
void pkv_jj_mark_deep(const jv *v, int depth);
int64_t pkv_jj_ck_add(ev *x, const node *n, int64_t p, int64_t q, const char *op);
int64_t pkv_jj_ck_sub(ev *x, const node *n, int64_t p, int64_t q, const char *op);
bool pkv_jj_eq(ev *x, const jv *a, const jv *b, int depth);
int pkv_jj_cmp(ev *x, const node *at, const jv *a, const jv *b);
jstr *pkv_jj_to_str(ev *x, const jv *v);
void pkv_jj_put_json(ev *x, sink *s, const jv *v, int lvl, int indent, const char *isep, const char *ksep);
jv pkv_jj_getattr(ev *x, const node *at, const jv *obj, const jv *key);
jv pkv_jj_call_value(ev *x, const node *at, jv callee, args *a);

/* jinja-builtins.c: arguments, methods, filters and tests */
jv *pkv_jj_arg(args *a, int i, const char *name);
const char *pkv_jj_memmem(ev *x, const char *h, size_t hn, const char *n, size_t nn);
jv pkv_jj_iter_list(ev *x, const node *at, const jv *v, const char *fn);
jv pkv_jj_fmt_percent(ev *x, const node *at, const jstr *f, args *a);
jv pkv_jj_call_builtin(ev *x, const node *at, const char *name, jv self, args *a, bool filter, bool *found);
jv pkv_jj_call_test(ev *x, const node *at, const char *name, const jv *v, args *a, bool *found);

#endif
