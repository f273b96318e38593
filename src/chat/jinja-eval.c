/* The Jinja interpreter's evaluator: values, their text and JSON, scopes, attribute
 * access and calls, statements and expressions walked over the AST within the
 * render's limits (pkv_jinja_render). Methods, filters and tests are in
 * jinja-builtins.c. */
#include "chat/jinja-impl.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Noreturn void pkv_jj_fail(ev *x, const node *n, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!n) n = x->at;
    pkv_jj_fail_at(&x->j, PKV_JINJA_ERUNTIME, n ? n->line : 0, n ? n->col : 0, "%s", m);
}

static _Noreturn void E_limit(ev *x, const char *what) {
    const node *n = x->at;
    pkv_jj_fail_at(&x->j, PKV_JINJA_ELIMIT, n ? n->line : 0, n ? n->col : 0, "%s", what);
}

void *pkv_jj_alloc(ev *x, size_t n) {
    void *p = pkv_jj_arena_get(&x->ar, n);
    if (!p && x->ar.shared_full) {
        const node *at = x->at;
        pkv_jj_fail_at(&x->j, PKV_JINJA_EBUDGET, at ? at->line : 0, at ? at->col : 0,
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
        pkv_jj_fail_at(&x->j, PKV_JINJA_ECANCEL, n ? n->line : 0, n ? n->col : 0, "the render was cancelled (the client went away?)");
    }
    if (now_ms() > x->deadline_ms) {
        char m[160];
        snprintf(m, sizeof m, "the template ran longer than the render time limit allows (%lld ms)", (long long)x->max_time_ms);
        E_limit(x, m);
    }
}

/* n units of work (bytes scanned, compared or copied): bounded by max_work, so a
 * render's time is bounded by what it does, not only by how many steps */
void pkv_jj_work(ev *x, size_t n) {
    x->work += n > (size_t)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)n;
    if (x->work > x->max_work) {
        char m[160];
        snprintf(m, sizeof m, "the template did more work than the render work limit allows (%lld units: bytes scanned or copied)",
                 (long long)x->max_work);
        E_limit(x, m);
    }
    if (x->work >= x->next_poll) poll_stop(x);
}

void pkv_jj_step(ev *x) {
    if (++x->steps > x->max_steps) E_limit(x, "the template ran more steps than the render limit allows (a loop that does not end?)");
    pkv_jj_work(x, 16);
}

static void sk_reserve(ev *x, sink *s, size_t more) {
    if (s->n + more + 1 > x->max_output) E_limit(x, "the rendered text is longer than the output limit");
    if (s->n + more + 1 <= s->cap) return;
    size_t nc = (s->n + more + 1) * 2;
    if (nc < 64) nc = 64;
    char *q = pkv_jj_alloc(x, nc);
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
        size_t *q = pkv_jj_alloc(x, 2 * nc * sizeof *q);
        if (s->nsp) memcpy(q, s->sp, 2 * s->nsp * sizeof *q);
        s->sp = q;
        s->capsp = nc;
    }
    s->sp[2 * s->nsp] = a;
    s->sp[2 * s->nsp + 1] = b;
    s->nsp++;
}

void pkv_jj_sk_put(ev *x, sink *s, const char *p, size_t n) {
    if (!n) return;
    pkv_jj_work(x, n);
    sk_reserve(x, s, n);
    memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = 0;
}

void pkv_jj_sk_cstr(ev *x, sink *s, const char *p) { pkv_jj_sk_put(x, s, p, strlen(p)); }

void pkv_jj_sk_jstr(ev *x, sink *s, const jstr *t) {
    size_t base = s->n;
    pkv_jj_work(x, t->nsp);
    pkv_jj_sk_put(x, s, t->s, t->n);
    for (size_t i = 0; i < t->nsp; i++) sk_span(x, s, base + t->sp[2 * i], base + t->sp[2 * i + 1]);
}

jstr *pkv_jj_sk_str(ev *x, sink *s) {
    jstr *t = pkv_jj_alloc(x, sizeof *t);
    t->s = s->p ? s->p : "";
    t->n = s->n;
    t->sp = s->sp;
    t->nsp = s->nsp;
    return t;
}

jstr *pkv_jj_mkstr(ev *x, const char *p, size_t n) {
    pkv_jj_work(x, n);
    jstr *t = pkv_jj_alloc(x, sizeof *t);
    char *c = pkv_jj_alloc(x, n + 1);
    memcpy(c, p, n);
    t->s = c;
    t->n = n;
    return t;
}

/* p[a, b) of t, its spans clipped to the piece */
jstr *pkv_jj_substr(ev *x, const jstr *t, size_t a, size_t b) {
    if (a > b) a = b;
    jstr *r = pkv_jj_alloc(x, sizeof *r);
    r->s = t->s + a;
    r->n = b - a;
    if (t->nsp) {
        pkv_jj_work(x, t->nsp);
        r->sp = pkv_jj_alloc(x, 2 * t->nsp * sizeof *r->sp);
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
jstr *pkv_jj_derived(ev *x, const char *p, size_t n, bool data) {
    jstr *r = pkv_jj_alloc(x, sizeof *r);
    r->s = p;
    r->n = n;
    if (data && n) {
        r->sp = pkv_jj_alloc(x, 2 * sizeof *r->sp);
        r->sp[0] = 0;
        r->sp[1] = n;
        r->nsp = 1;
    }
    return r;
}

jv pkv_jj_vcstr(ev *x, const char *s) { return vstr(pkv_jj_mkstr(x, s, strlen(s))); }

jlist *pkv_jj_mklist(ev *x, size_t cap) {
    jlist *l = pkv_jj_alloc(x, sizeof *l);
    if (cap) {
        l->a = pkv_jj_alloc(x, cap * sizeof *l->a);
        l->cap = cap;
    }
    return l;
}
void pkv_jj_lpush(ev *x, jlist *l, jv e) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *q = pkv_jj_alloc(x, nc * sizeof *q);
        if (l->n) memcpy(q, l->a, l->n * sizeof *q);
        l->a = q;
        l->cap = nc;
    }
    l->a[l->n++] = e;
}

static jdict *mkdict(ev *x) { return pkv_jj_alloc(x, sizeof(jdict)); }

long pkv_jj_dfind(ev *x, const jdict *d, const jv *k) {
    pkv_jj_work(x, d->n);
    for (size_t i = 0; i < d->n; i++)
        if (pkv_jj_eq(x, &d->k[i], k, 0)) return (long)i;
    return -1;
}

static long dfind_c(ev *x, const jdict *d, const char *k) {
    pkv_jj_work(x, d->n);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && streq(d->k[i].u.s, k)) return (long)i;
    return -1;
}

/* k is known not to be in d (a JSON object's keys) */
static void dappend(ev *x, jdict *d, jv k, jv v) {
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *qk = pkv_jj_alloc(x, nc * sizeof *qk), *qv = pkv_jj_alloc(x, nc * sizeof *qv);
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

void pkv_jj_dset(ev *x, jdict *d, jv k, jv v) {
    long i = pkv_jj_dfind(x, d, &k);
    if (i >= 0) {
        d->v[i] = v;
        return;
    }
    dappend(x, d, k, v);
}

void pkv_jj_dset_c(ev *x, jdict *d, const char *k, jv v) { pkv_jj_dset(x, d, pkv_jj_vcstr(x, k), v); }

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
void pkv_jj_mark(const jv *v, unsigned f) {
    unsigned *p = flags_of(v);
    if (p) *p |= f;
}

void pkv_jj_mark_deep(const jv *v, int depth) {
    if (depth > 64) return;
    pkv_jj_mark(v, PKV_JINJA_USED);
    if (v->t == V_LIST)
        for (size_t i = 0; i < v->u.l->n; i++) pkv_jj_mark_deep(&v->u.l->a[i], depth + 1);
    if (v->t == V_DICT)
        for (size_t i = 0; i < v->u.d->n; i++) {
            pkv_jj_mark_deep(&v->u.d->k[i], depth + 1);
            pkv_jj_mark_deep(&v->u.d->v[i], depth + 1);
        }
}

/* Integer arithmetic that would overflow 64 bits is an error naming the
 * operation (Python's ints would grow; a chat template has no use for that). */
static _Noreturn void E_ovf(ev *x, const node *n, const char *op) {
    pkv_jj_fail(x, n, "integer overflow in %s (the result does not fit in 64 bits)", op);
}
int64_t pkv_jj_ck_add(ev *x, const node *n, int64_t p, int64_t q, const char *op) {
    if ((q > 0 && p > INT64_MAX - q) || (q < 0 && p < INT64_MIN - q)) E_ovf(x, n, op);
    return p + q;
}
int64_t pkv_jj_ck_sub(ev *x, const node *n, int64_t p, int64_t q, const char *op) {
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

bool pkv_jj_eq(ev *x, const jv *a, const jv *b, int depth) {
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
        pkv_jj_work(x, a->u.s->n);
        return !memcmp(a->u.s->s, b->u.s->s, a->u.s->n);
    case V_LIST:
        if (a->u.l->n != b->u.l->n) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!pkv_jj_eq(x, &a->u.l->a[i], &b->u.l->a[i], depth + 1)) return false;
        return true;
    case V_DICT:
        if (a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            long j = pkv_jj_dfind(x, b->u.d, &a->u.d->k[i]);
            if (j < 0 || !pkv_jj_eq(x, &a->u.d->v[i], &b->u.d->v[j], depth + 1)) return false;
        }
        return true;
    case V_NS: return a->u.d == b->u.d;
    case V_MACRO: return a->u.m == b->u.m;
    default: return false;
    }
}

/* -1, 0, 1; numbers with numbers, strings with strings, lists by items */
int pkv_jj_cmp(ev *x, const node *at, const jv *a, const jv *b) {
    if (isnum(a) && isnum(b)) {
        if (a->t == V_INT && b->t == V_INT) return a->u.i < b->u.i ? -1 : a->u.i > b->u.i;
        double p = numf(a), q = numf(b);
        return p < q ? -1 : p > q;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->u.s->n < b->u.s->n ? a->u.s->n : b->u.s->n;
        pkv_jj_work(x, n);
        int c = memcmp(a->u.s->s, b->u.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.s->n < b->u.s->n ? -1 : a->u.s->n > b->u.s->n;
    }
    if (a->t == V_LIST && b->t == V_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            int c = pkv_jj_cmp(x, at, &a->u.l->a[i], &b->u.l->a[i]);
            if (c) return c;
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    pkv_jj_fail(x, at, "cannot compare %s with %s", tname(a), tname(b));
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

/* Python-like repr inside lists and dicts (llama.cpp's: a string with a quote in
 * it is written as JSON) */
static void put_repr(ev *x, sink *s, const jv *v, int depth) {
    if (v->t == V_STR) {
        if (has_quote(v->u.s)) {
            pkv_jj_put_json(x, s, v, 0, -1, ", ", ": ");
        } else {
            pkv_jj_sk_cstr(x, s, "'");
            pkv_jj_sk_jstr(x, s, v->u.s);
            pkv_jj_sk_cstr(x, s, "'");
        }
        return;
    }
    put_str(x, s, v, depth);
}

static void put_str(ev *x, sink *s, const jv *v, int depth) {
    char buf[400];
    if (depth > 64) pkv_jj_fail(x, NULL, "a value nested deeper than 64 levels");
    switch (v->t) {
    case V_UNDEF: return;
    case V_NONE: pkv_jj_sk_cstr(x, s, "None"); return;
    case V_BOOL: pkv_jj_sk_cstr(x, s, v->u.b ? "True" : "False"); return;
    case V_INT: snprintf(buf, sizeof buf, "%lld", (long long)v->u.i); pkv_jj_sk_cstr(x, s, buf); return;
    case V_FLOAT: fmt_float(buf, sizeof buf, v->u.f); pkv_jj_sk_cstr(x, s, buf); return;
    case V_STR: pkv_jj_sk_jstr(x, s, v->u.s); return;
    case V_LIST:
        pkv_jj_sk_cstr(x, s, v->u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) pkv_jj_sk_cstr(x, s, ", ");
            put_repr(x, s, &v->u.l->a[i], depth + 1);
        }
        if (v->u.l->tuple && v->u.l->n == 1) pkv_jj_sk_cstr(x, s, ",");
        pkv_jj_sk_cstr(x, s, v->u.l->tuple ? ")" : "]");
        return;
    case V_DICT:
        pkv_jj_sk_cstr(x, s, "{");
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i) pkv_jj_sk_cstr(x, s, ", ");
            put_repr(x, s, &v->u.d->k[i], depth + 1);
            pkv_jj_sk_cstr(x, s, ": ");
            put_repr(x, s, &v->u.d->v[i], depth + 1);
        }
        pkv_jj_sk_cstr(x, s, "}");
        return;
    case V_NS: pkv_jj_sk_cstr(x, s, "Namespace"); return;
    case V_MACRO: pkv_jj_sk_cstr(x, s, "Macro"); return;
    default: pkv_jj_sk_cstr(x, s, "Function"); return;
    }
}

jstr *pkv_jj_to_str(ev *x, const jv *v) {
    if (v->t == V_STR) return v->u.s;
    sink s = {0};
    put_str(x, &s, v, 0);
    return pkv_jj_sk_str(x, &s);
}

static void put_json_str(ev *x, sink *s, const jstr *t) {
    pkv_jj_sk_cstr(x, s, "\"");
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
        if (e) pkv_jj_sk_cstr(x, s, e);
        else pkv_jj_sk_put(x, s, (const char *)&c, 1);
    }
    if (t->nsp) sk_span(x, s, base, s->n); /* escaped data stays data */
    pkv_jj_sk_cstr(x, s, "\"");
}

static void put_indent(ev *x, sink *s, int lvl, int indent) {
    for (int i = 0; i < lvl * indent; i++) pkv_jj_sk_put(x, s, " ", 1);
}

/* tojson as llama.cpp writes it: Python's json.dumps layout (", " and ": ",
 * or "," with an indent), keys in insertion order, non-ASCII kept */
void pkv_jj_put_json(ev *x, sink *s, const jv *v, int lvl, int indent, const char *isep, const char *ksep) {
    char buf[64];
    if (lvl > 64) pkv_jj_fail(x, NULL, "a value nested deeper than 64 levels");
    switch (v->t) {
    case V_BOOL: pkv_jj_sk_cstr(x, s, v->u.b ? "true" : "false"); return;
    case V_INT: snprintf(buf, sizeof buf, "%lld", (long long)v->u.i); pkv_jj_sk_cstr(x, s, buf); return;
    case V_FLOAT: snprintf(buf, sizeof buf, "%g", v->u.f); pkv_jj_sk_cstr(x, s, buf); return;
    case V_STR: put_json_str(x, s, v->u.s); return;
    case V_LIST:
    case V_DICT: {
        bool list = v->t == V_LIST;
        size_t n = list ? v->u.l->n : v->u.d->n;
        pkv_jj_sk_cstr(x, s, list ? "[" : "{");
        if (n) {
            if (indent >= 0) pkv_jj_sk_cstr(x, s, "\n");
            for (size_t i = 0; i < n; i++) {
                put_indent(x, s, lvl + 1, indent > 0 ? indent : 0);
                if (list) {
                    pkv_jj_put_json(x, s, &v->u.l->a[i], lvl + 1, indent, isep, ksep);
                } else {
                    jv k = v->u.d->k[i];
                    if (k.t != V_STR) k = vstr(pkv_jj_to_str(x, &k));
                    pkv_jj_put_json(x, s, &k, lvl + 1, indent, isep, ksep);
                    pkv_jj_sk_cstr(x, s, ksep);
                    pkv_jj_put_json(x, s, &v->u.d->v[i], lvl + 1, indent, isep, ksep);
                }
                if (i + 1 < n) pkv_jj_sk_cstr(x, s, isep);
                if (indent >= 0) pkv_jj_sk_cstr(x, s, "\n");
            }
            put_indent(x, s, lvl, indent > 0 ? indent : 0);
        }
        pkv_jj_sk_cstr(x, s, list ? "]" : "}");
        return;
    }
    default: pkv_jj_sk_cstr(x, s, "null"); return;
    }
}

/* ---- context from JSON */

static jv from_json(ev *x, json_t *j, bool data, int depth) {
    if (depth > 64) pkv_jj_fail(x, NULL, "the context is nested deeper than 64 levels");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = mkdict(x);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            jv kv = vstr(pkv_jj_mkstr(x, k, strlen(k)));
            if (data && kv.u.s->n) {
                kv.u.s->sp = pkv_jj_alloc(x, 2 * sizeof(size_t));
                kv.u.s->sp[1] = kv.u.s->n;
                kv.u.s->nsp = 1;
            }
            /* the model's own BOS and EOS texts are markup, not request data: a
             * template's eos_token after a turn ([INST] families) is the token */
            bool markup = depth == 0 && (!strcmp(k, "bos_token") || !strcmp(k, "eos_token"));
            dappend(x, d, kv, from_json(x, v, data && !markup, depth + 1));
        }
        return vdict(d);
    }
    case JSON_ARRAY: {
        jlist *l = pkv_jj_mklist(x, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) pkv_jj_lpush(x, l, from_json(x, v, data, depth + 1));
        return vlist(l);
    }
    case JSON_STRING: {
        jstr *t = pkv_jj_mkstr(x, json_string_value(j), json_string_length(j));
        if (data && t->n) {
            t->sp = pkv_jj_alloc(x, 2 * sizeof *t->sp);
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
    scope *s = pkv_jj_alloc(x, sizeof *s);
    s->up = up;
    s->vars = mkdict(x);
    return s;
}

static jv eval(ev *x, scope *sc, const node *n);
static void exec(ev *x, scope *sc, const node *n, sink *out);

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
    jfunc *f = pkv_jj_alloc(x, sizeof *f);
    f->name = name;
    f->self = self;
    jv v = {V_FUNC, {0}};
    v.u.fn = f;
    return v;
}

/* obj.key / obj[key]: a missing key is undefined; attributes of undefined and
 * none are undefined too (llama.cpp's lenient rule) */
jv pkv_jj_getattr(ev *x, const node *at, const jv *obj, const jv *key) {
    (void)at;
    pkv_jj_mark(obj, PKV_JINJA_USED);
    jv r = UNDEF;
    if (obj->t == V_DICT || obj->t == V_NS) {
        long i = pkv_jj_dfind(x, obj->u.d, key);
        if (i >= 0) r = obj->u.d->v[i];
        else if (obj->t == V_DICT && key->t == V_STR) {
            char nm[32];
            if (key->u.s->n < sizeof nm) {
                memcpy(nm, key->u.s->s, key->u.s->n);
                nm[key->u.s->n] = 0;
                if (method_name(V_DICT, nm)) r = bound(x, pkv_jj_mkstr(x, nm, strlen(nm))->s, *obj);
            }
        }
    } else if ((obj->t == V_LIST || obj->t == V_STR) && (key->t == V_INT || key->t == V_BOOL)) {
        pkv_jj_mark(obj, PKV_JINJA_OP_ARRAY);
        int64_t i = numi(key), n = obj->t == V_LIST ? (int64_t)obj->u.l->n : (int64_t)obj->u.s->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) r = obj->t == V_LIST ? obj->u.l->a[i] : vstr(pkv_jj_substr(x, obj->u.s, (size_t)i, (size_t)i + 1));
    } else if ((obj->t == V_LIST || obj->t == V_STR) && key->t == V_STR) {
        char nm[32];
        if (key->u.s->n < sizeof nm) {
            memcpy(nm, key->u.s->s, key->u.s->n);
            nm[key->u.s->n] = 0;
            if (method_name(obj->t, nm)) r = bound(x, pkv_jj_mkstr(x, nm, strlen(nm))->s, *obj);
        }
    }
    pkv_jj_mark(&r, PKV_JINJA_USED);
    return r;
}

static const char *const k_globals[] = {"range", "namespace", "raise_exception", "strftime_now", "dict", "joiner", NULL};

static jv call_global(ev *x, const node *at, const char *name, args *a) {
    jv *p0 = pkv_jj_arg(a, 0, NULL);
    if (!strcmp(name, "raise_exception")) {
        const jstr *m = p0 ? pkv_jj_to_str(x, p0) : pkv_jj_mkstr(x, "raise_exception called", 22);
        pkv_jj_fail_at(&x->j, PKV_JINJA_ERAISE, at->line, at->col, "%.*s", (int)(m->n > 500 ? 500 : m->n), m->s);
    }
    if (!strcmp(name, "range")) {
        int64_t lo = 0, hi, st = 1;
        if (a->np == 0) pkv_jj_fail(x, at, "range: an argument is needed");
        if (a->np == 1) hi = numi(p0);
        else {
            lo = numi(p0);
            hi = numi(&a->pos[1]);
            if (a->np > 2) st = numi(&a->pos[2]);
        }
        if (st == 0) pkv_jj_fail(x, at, "range: the step must not be zero");
        jlist *l = pkv_jj_mklist(x, 0);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
            pkv_jj_step(x);
            pkv_jj_lpush(x, l, vint(i));
            if (st > 0 ? i > INT64_MAX - st : i < INT64_MIN - st) break; /* the next one is past hi anyway */
            i += st;
        }
        return vlist(l);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jdict *d = mkdict(x);
        if (p0 && p0->t == V_DICT)
            for (size_t i = 0; i < p0->u.d->n; i++) pkv_jj_dset(x, d, p0->u.d->k[i], p0->u.d->v[i]);
        for (int k = 0; k < a->nk; k++) pkv_jj_dset_c(x, d, a->kn[k], a->kw[k]);
        jv v = vdict(d);
        if (name[0] == 'n') v.t = V_NS;
        return v;
    }
    if (!strcmp(name, "strftime_now")) {
        const jstr *f = p0 && p0->t == V_STR ? p0->u.s : NULL;
        if (!f) pkv_jj_fail(x, at, "strftime_now: a format string is needed");
        time_t tt = x->now ? (time_t)x->now : time(NULL);
        struct tm tm;
        localtime_r(&tt, &tm);
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(f->n > 255 ? 255 : f->n), f->s);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        return vstr(pkv_jj_mkstr(x, buf, n));
    }
    pkv_jj_fail(x, at, "'%s' cannot be called here", name);
}

static jv call_macro(ev *x, const node *at, const node *m, args *a, const node *caller);

jv pkv_jj_call_value(ev *x, const node *at, jv callee, args *a) {
    pkv_jj_step(x);
    if (callee.t == V_MACRO) return call_macro(x, at, callee.u.m, a, NULL);
    if (callee.t != V_FUNC) pkv_jj_fail(x, at, "%s is not callable", tname(&callee));
    jfunc *f = callee.u.fn;
    if (f->self.t == V_UNDEF) return call_global(x, at, f->name, a);
    bool found;
    jv r = pkv_jj_call_builtin(x, at, f->name, f->self, a, false, &found);
    if (!found) pkv_jj_fail(x, at, "%s has no method '%s'", tname(&f->self), f->name);
    return r;
}

static jv call_macro(ev *x, const node *at, const node *m, args *a, const node *caller) {
    if (++x->depth > x->max_depth) E_limit(x, "macro calls nested deeper than the render limit allows");
    scope *sc = push_scope(x, x->globals);
    for (int i = 0; i < m->nkn; i++) {
        jv *v = pkv_jj_arg(a, i, m->kn[i]);
        jv val = v ? *v : m->w[i] ? eval(x, sc, m->w[i]) : UNDEF;
        pkv_jj_dset_c(x, sc->vars, m->kn[i], val);
    }
    if (a->np > m->nkn) pkv_jj_fail(x, at, "macro '%s' takes %d arguments, %d given", m->name, m->nkn, a->np);
    if (caller) {
        jv c = {V_MACRO, {0}};
        c.u.m = caller;
        pkv_jj_dset_c(x, sc->vars, "caller", c);
    }
    sink o = {0};
    exec(x, sc, m->b, &o);
    x->brk = 0;
    x->depth--;
    return vstr(pkv_jj_sk_str(x, &o));
}

static void eval_args(ev *x, scope *sc, const node *n, args *a, int skip_first) {
    (void)skip_first;
    a->np = n->nv;
    a->nk = n->nw;
    a->pos = pkv_jj_alloc(x, ((size_t)n->nv + 1) * sizeof *a->pos);
    a->kw = pkv_jj_alloc(x, ((size_t)n->nw + 1) * sizeof *a->kw);
    a->kn = n->kn;
    for (int i = 0; i < n->nv; i++) a->pos[i] = eval(x, sc, n->v[i]);
    for (int i = 0; i < n->nw; i++) a->kw[i] = eval(x, sc, n->w[i]);
}

static jv arith(ev *x, const node *n, int op, const jv *a, const jv *b) {
    if (op == OP_ADD && a->t == V_STR && b->t == V_STR) {
        sink o = {0};
        pkv_jj_sk_jstr(x, &o, a->u.s);
        pkv_jj_sk_jstr(x, &o, b->u.s);
        return vstr(pkv_jj_sk_str(x, &o));
    }
    if (op == OP_ADD && a->t == V_LIST && b->t == V_LIST) {
        jlist *l = pkv_jj_mklist(x, a->u.l->n + b->u.l->n);
        for (size_t i = 0; i < a->u.l->n; i++) pkv_jj_lpush(x, l, a->u.l->a[i]);
        for (size_t i = 0; i < b->u.l->n; i++) pkv_jj_lpush(x, l, b->u.l->a[i]);
        return vlist(l);
    }
    if (op == OP_MUL && ((a->t == V_STR && b->t == V_INT) || (a->t == V_INT && b->t == V_STR))) {
        const jstr *s = a->t == V_STR ? a->u.s : b->u.s;
        int64_t k = a->t == V_INT ? a->u.i : b->u.i;
        sink o = {0};
        if (k > 0 && s->n && (uint64_t)k > x->max_output / s->n) E_limit(x, "a string repeated (*) beyond the output limit");
        for (int64_t i = 0; i < k; i++) {
            pkv_jj_step(x);
            pkv_jj_sk_jstr(x, &o, s);
        }
        return vstr(pkv_jj_sk_str(x, &o));
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
        return pkv_jj_fmt_percent(x, n, a->u.s, &fa);
    }
    if (!isnum(a) || !isnum(b)) {
        static const char *const ops[] = {"+", "-", "*", "/", "//", "%", "**"};
        pkv_jj_fail(x, n, "unsupported operand types for %s: %s and %s", ops[op], tname(a), tname(b));
    }
    bool ints = a->t != V_FLOAT && b->t != V_FLOAT;
    int64_t p = numi(a), q = numi(b);
    double f = numf(a), g = numf(b);
    switch (op) {
    case OP_ADD: return ints ? vint(pkv_jj_ck_add(x, n, p, q, "+")) : vfloat(f + g);
    case OP_SUB: return ints ? vint(pkv_jj_ck_sub(x, n, p, q, "-")) : vfloat(f - g);
    case OP_MUL: return ints ? vint(ck_mul(x, n, p, q, "*")) : vfloat(f * g);
    case OP_DIV:
        if (g == 0) pkv_jj_fail(x, n, "division by zero");
        return vfloat(f / g);
    case OP_FDIV:
    case OP_MOD:
        if (ints) {
            if (q == 0) pkv_jj_fail(x, n, "division by zero");
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
        if (g == 0) pkv_jj_fail(x, n, "division by zero");
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
        if (a->t != V_STR) pkv_jj_fail(x, n, "'in <string>' needs a string on the left, not %s", tname(a));
        return vbool(pkv_jj_memmem(x, b->u.s->s, b->u.s->n, a->u.s->s, a->u.s->n) != NULL);
    }
    if (b->t == V_LIST) {
        for (size_t i = 0; i < b->u.l->n; i++)
            if (pkv_jj_eq(x, &b->u.l->a[i], a, 0)) return vbool(true);
        return vbool(false);
    }
    if (b->t == V_DICT || b->t == V_NS) return vbool(pkv_jj_dfind(x, b->u.d, a) >= 0);
    if (b->t == V_UNDEF || b->t == V_NONE) return vbool(false);
    pkv_jj_fail(x, n, "'in' needs a string, list or dict on the right, not %s", tname(b));
}

static jv slice(ev *x, const node *n, const jv *o, const jv *va, const jv *vb, const jv *vc) {
    int64_t len = o->t == V_LIST ? (int64_t)o->u.l->n : o->t == V_STR ? (int64_t)o->u.s->n : -1;
    if (len < 0) {
        if (o->t == V_UNDEF) return UNDEF;
        pkv_jj_fail(x, n, "cannot slice %s", tname(o));
    }
    pkv_jj_mark(o, PKV_JINJA_USED | PKV_JINJA_OP_ARRAY);
    int64_t st = vc && vc->t != V_NONE && vc->t != V_UNDEF ? numi(vc) : 1;
    if (st == 0) pkv_jj_fail(x, n, "slice step cannot be zero");
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
    if (o->t == V_STR && st == 1) return vstr(pkv_jj_substr(x, o->u.s, (size_t)lo, (size_t)(hi > lo ? hi : lo)));
    sink s = {0};
    jlist *l = pkv_jj_mklist(x, 0);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
        pkv_jj_step(x);
        if (o->t == V_LIST) pkv_jj_lpush(x, l, o->u.l->a[i]);
        else pkv_jj_sk_put(x, &s, o->u.s->s + i, 1);
        if (st > 0 ? i > INT64_MAX - st : i < INT64_MIN - st) break; /* the next one is out of range anyway */
        i += st;
    }
    if (o->t == V_STR) return vstr(pkv_jj_derived(x, s.p ? s.p : "", s.n, o->u.s->nsp != 0));
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
            jstr *t = pkv_jj_alloc(x, sizeof *t);
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
        jlist *l = pkv_jj_mklist(x, (size_t)n->nv);
        for (int i = 0; i < n->nv; i++) pkv_jj_lpush(x, l, eval(x, sc, n->v[i]));
        l->tuple = n->k == N_TUPLE;
        r = vlist(l);
        break;
    }
    case N_DICT: {
        jdict *d = mkdict(x);
        for (int i = 0; i < n->nv; i++) {
            jv k = eval(x, sc, n->v[i]);
            pkv_jj_dset(x, d, k, eval(x, sc, n->w[i]));
        }
        r = vdict(d);
        break;
    }
    case N_ATTR: {
        a = eval(x, sc, n->a);
        jv k = vstr(pkv_jj_mkstr(x, n->name, strlen(n->name)));
        if ((a.t == V_STR || a.t == V_LIST || a.t == V_DICT) && method_name(a.t, n->name)) {
            pkv_jj_mark(&a, PKV_JINJA_USED);
            r = bound(x, n->name, a); /* a method wins over a key of the same name, as in Jinja2 */
        } else {
            r = pkv_jj_getattr(x, n, &a, &k);
        }
        break;
    }
    case N_INDEX:
        a = eval(x, sc, n->a);
        b = eval(x, sc, n->b);
        r = pkv_jj_getattr(x, n, &a, &b);
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
        if (callee.t == V_UNDEF) pkv_jj_fail(x, n, "'%s' is undefined and cannot be called", n->a->k == N_NAME ? n->a->name : n->a->k == N_ATTR ? n->a->name : "the callee");
        r = pkv_jj_call_value(x, n, callee, &ar);
        break;
    }
    case N_FILTER: {
        args ar;
        a = eval(x, sc, n->a);
        eval_args(x, sc, n, &ar, 0);
        x->at = n;
        pkv_jj_step(x);
        bool found;
        r = pkv_jj_call_builtin(x, n, n->name, a, &ar, true, &found);
        break;
    }
    case N_TEST: {
        args ar;
        a = eval(x, sc, n->a);
        eval_args(x, sc, n, &ar, 0);
        x->at = n;
        bool found;
        r = pkv_jj_call_test(x, n, n->name, &a, &ar, &found);
        if (!found) pkv_jj_fail(x, n, "no test named '%s'", n->name);
        if (n->neg) r = vbool(!truthy(&r));
        break;
    }
    case N_NEG:
    case N_POS:
        a = eval(x, sc, n->a);
        if (!isnum(&a)) pkv_jj_fail(x, n, "bad operand type for unary %c: %s", n->k == N_NEG ? '-' : '+', tname(&a));
        r = n->k == N_POS ? a : a.t == V_FLOAT ? vfloat(-a.u.f) : vint(pkv_jj_ck_sub(x, n, 0, numi(&a), "unary -"));
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
        pkv_jj_sk_jstr(x, &o, pkv_jj_to_str(x, &a));
        pkv_jj_sk_jstr(x, &o, pkv_jj_to_str(x, &b));
        r = vstr(pkv_jj_sk_str(x, &o));
        break;
    }
    case N_CMP:
        a = eval(x, sc, n->a);
        b = eval(x, sc, n->b);
        x->at = n;
        if (n->op == OP_EQ) r = vbool(pkv_jj_eq(x, &a, &b, 0));
        else if (n->op == OP_NE) r = vbool(!pkv_jj_eq(x, &a, &b, 0));
        else {
            int c = pkv_jj_cmp(x, n, &a, &b);
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
    default: pkv_jj_fail(x, n, "internal: not an expression");
    }
    x->depth--;
    x->at = saved;
    return r;
}

static void assign(ev *x, scope *sc, const node *n, const char **names, int nn, jv v) {
    if (nn <= 1) {
        pkv_jj_dset_c(x, sc->vars, names[0], v);
        return;
    }
    if (v.t != V_LIST || (int)v.u.l->n != nn) pkv_jj_fail(x, n, "cannot unpack %s into %d names", tname(&v), nn);
    for (int i = 0; i < nn; i++) pkv_jj_dset_c(x, sc->vars, names[i], v.u.l->a[i]);
}

static void exec_for(ev *x, scope *sc, const node *n, sink *out) {
    jv it = eval(x, sc, n->a);
    x->at = n;
    pkv_jj_mark(&it, PKV_JINJA_USED | (it.t == V_LIST ? PKV_JINJA_OP_ARRAY : 0));
    jlist *src;
    if (it.t == V_DICT && n->nkn == 2) { /* for k, v in dict: its items */
        bool f;
        args none = {0};
        src = pkv_jj_call_builtin(x, n, "items", it, &none, false, &f).u.l;
    } else if (it.t == V_UNDEF || it.t == V_NONE) {
        if (it.t == V_NONE) pkv_jj_fail(x, n, "for loop over none");
        src = pkv_jj_mklist(x, 0);
    } else {
        if (it.t != V_LIST && it.t != V_DICT && it.t != V_STR) pkv_jj_fail(x, n, "cannot loop over %s", tname(&it));
        src = pkv_jj_iter_list(x, n, &it, "for").u.l;
    }
    /* the loop filter runs first: loop.length counts what passes it */
    jlist *items = src;
    if (n->b) {
        items = pkv_jj_mklist(x, 0);
        for (size_t i = 0; i < src->n; i++) {
            pkv_jj_step(x);
            scope *fs = push_scope(x, sc);
            assign(x, fs, n, n->kn, n->nkn, src->a[i]);
            jv c = eval(x, fs, n->b);
            if (truthy(&c)) pkv_jj_lpush(x, items, src->a[i]);
        }
    }
    size_t len = items->n;
    if (!len) {
        if (n->d) exec(x, sc, n->d, out);
        return;
    }
    for (size_t i = 0; i < len; i++) {
        pkv_jj_step(x);
        scope *ls = push_scope(x, sc);
        jdict *loop = mkdict(x);
        pkv_jj_dset_c(x, loop, "index", vint((int64_t)i + 1));
        pkv_jj_dset_c(x, loop, "index0", vint((int64_t)i));
        pkv_jj_dset_c(x, loop, "revindex", vint((int64_t)(len - i)));
        pkv_jj_dset_c(x, loop, "revindex0", vint((int64_t)(len - i - 1)));
        pkv_jj_dset_c(x, loop, "first", vbool(i == 0));
        pkv_jj_dset_c(x, loop, "last", vbool(i + 1 == len));
        pkv_jj_dset_c(x, loop, "length", vint((int64_t)len));
        pkv_jj_dset_c(x, loop, "previtem", i ? items->a[i - 1] : UNDEF);
        pkv_jj_dset_c(x, loop, "nextitem", i + 1 < len ? items->a[i + 1] : UNDEF);
        pkv_jj_dset_c(x, ls->vars, "loop", vdict(loop));
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
    case S_TEXT: pkv_jj_sk_jstr(x, out, n->lit.u.s); return;
    default: break;
    }
    pkv_jj_step(x);
    x->at = n;
    switch (n->k) {
    case S_OUT: {
        jv v = eval(x, sc, n->a);
        if (v.t == V_STR) pkv_jj_sk_jstr(x, out, v.u.s);
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
            pkv_jj_step(x);
            x->at = n;
        }
    case S_FOR: exec_for(x, sc, n, out); return;
    case S_SET: {
        jv v = eval(x, sc, n->b);
        x->at = n;
        if (n->a->k == N_ATTR) {
            jv *t = lookup(x, sc, n->a->a->name);
            if (!t || (t->t != V_NS && t->t != V_DICT)) pkv_jj_fail(x, n, "cannot set an attribute of '%s': it is not a namespace", n->a->a->name);
            pkv_jj_dset_c(x, t->u.d, n->a->name, v);
        } else {
            assign(x, sc, n, n->kn, n->nkn, v);
        }
        return;
    }
    case S_SETBLOCK: {
        sink o = {0};
        exec(x, sc, n->b, &o);
        pkv_jj_dset_c(x, sc->vars, n->name, vstr(pkv_jj_sk_str(x, &o)));
        return;
    }
    case S_MACRO: {
        jv m = {V_MACRO, {0}};
        m.u.m = n;
        pkv_jj_dset_c(x, sc->vars, n->name, m);
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
        ph->lit = vstr(pkv_jj_sk_str(x, &o));
        jv v = eval(x, sc, n->a);
        ph->lit = saved;
        put_str(x, out, &v, 0);
        return;
    }
    case S_CALLBLOCK: {
        const node *c = n->a;
        jv callee = eval(x, sc, c->a);
        if (callee.t != V_MACRO) pkv_jj_fail(x, n, "'call' needs a macro");
        args ar;
        eval_args(x, sc, c, &ar, 0);
        node *caller = pkv_jj_alloc(x, sizeof *caller);
        caller->k = S_MACRO;
        caller->name = "caller";
        caller->b = n->b;
        caller->line = n->line;
        caller->col = n->col;
        jv r = call_macro(x, n, callee.u.m, &ar, caller);
        pkv_jj_sk_jstr(x, out, r.u.s);
        return;
    }
    default: pkv_jj_fail(x, n, "internal: not a statement");
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
        else k = vstr(pkv_jj_mkstr(x, tmp, strlen(tmp)));
        if (cur.t == V_DICT) {
            long i = pkv_jj_dfind(x, cur.u.d, &k);
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
        pkv_jj_arena_free(&x->ar);
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
    for (size_t i = 0; i < x->globals->vars->n; i++) pkv_jj_dset(x, given, x->globals->vars->k[i], x->globals->vars->v[i]);
    sink out = {0};
    exec(x, x->globals, t->root, &out);
    if (probe)
        for (int i = 0; i < probe->n_paths; i++) probe->flags[i] = probe_path(x, given, probe->paths[i]);
    res = malloc(out.n + 1);
    if (!res) pkv_jj_fail_at(&x->j, PKV_JINJA_ENOMEM, 0, 0, "out of memory");
    if (out.n) memcpy(res, out.p, out.n);
    res[out.n] = 0;
    if (spans) {
        sp = malloc((2 * out.nsp + 1) * sizeof *sp);
        if (!sp) pkv_jj_fail_at(&x->j, PKV_JINJA_ENOMEM, 0, 0, "out of memory");
        if (out.nsp) memcpy(sp, out.sp, 2 * out.nsp * sizeof *sp);
        *spans = sp;
        *n_spans = out.nsp;
    }
    *len = out.n;
    pkv_jj_arena_free(&x->ar);
    free(x);
    return res;
}
