/* JSON schema to GBNF (docs/engine.md, "Constrained output"). The schema comes as
 * text and is parsed here (a small DOM, order of object keys kept): the engine
 * library does not link jansson, and the server passes the request's schema
 * through as it got it (json_dumps of the response_format's "schema").
 *
 * The generated grammar has fixed primitive rules (ws, string, number, ...) and
 * one rule per schema node. Every keyword is either applied, or known to be an
 * annotation (title, description, ...), or refused with its JSON pointer: a
 * schema is never silently less constrained than it says. Sections: the JSON DOM,
 * the converter's helpers, integer and number ranges (digit-range grammars),
 * patterns (ECMA regex to grammar), strings and arrays, objects, references and
 * allOf, the dispatcher, the fixed rules. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/grammar.h"

/* ------------------------------------------------------------- JSON DOM */

typedef enum { JN_NULL, JN_BOOL, JN_NUM, JN_STR, JN_ARR, JN_OBJ } jkind;

typedef struct jval jval;
struct jval {
    jkind k;
    bool b;
    double num;
    bool is_int;     /* the number's text had no fraction or exponent */
    char *s;         /* JN_STR: UTF-8 (may hold NUL: slen); JN_NUM: its text */
    size_t slen;
    jval **items;    /* JN_ARR, JN_OBJ values */
    char **keys;     /* JN_OBJ keys (NUL-terminated; a key with NUL is refused) */
    size_t n;
};

typedef struct jparse {
    const char *s, *end, *base;
    int depth;
    char err[200];
} jparse;

enum { JSON_MAX_DEPTH = 64 };

static void jfree(jval *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        jfree(v->items[i]);
        if (v->keys) pkv_free(v->keys[i]);
    }
    pkv_free(v->items);
    pkv_free(v->keys);
    pkv_free(v->s);
    pkv_free(v);
}

static void jws(jparse *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

static jval *jfail(jparse *p, const char *what) {
    if (!p->err[0]) snprintf(p->err, sizeof p->err, "invalid JSON at byte %zu: %s", (size_t)(p->s - p->base), what);
    return NULL;
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static size_t put_utf8(char *o, uint32_t c) {
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xc0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3f)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xe0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 0x3f)), o[2] = (char)(0x80 | (c & 0x3f)), 3;
    o[0] = (char)(0xf0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 0x3f));
    o[2] = (char)(0x80 | (c >> 6 & 0x3f)), o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* A string at p->s (the opening quote): decoded into *out (NUL-terminated). */
static bool jstring(jparse *p, char **out, size_t *olen) {
    p->s++;
    const char *q = p->s;
    while (q < p->end && *q != '"') q += *q == '\\' ? 2 : 1;
    if (q >= p->end) return jfail(p, "unterminated string"), false;
    char *o = pkv_malloc((size_t)(q - p->s) + 1);
    if (!o) return jfail(p, "out of memory"), false;
    size_t n = 0;
    while (*p->s != '"') {
        unsigned char c = (unsigned char)*p->s;
        if (c < 0x20) {
            pkv_free(o);
            return jfail(p, "control character in a string"), false;
        }
        if (c != '\\') {
            o[n++] = (char)c;
            p->s++;
            continue;
        }
        char e = p->s[1];
        p->s += 2;
        char simple = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b' : e == 'f' ? '\f'
                    : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
        if (simple) {
            o[n++] = simple;
            continue;
        }
        if (e != 'u' || p->end - p->s < 4) {
            pkv_free(o);
            return jfail(p, "bad escape in a string"), false;
        }
        uint32_t cp = 0;
        for (int i = 0; i < 4; i++) {
            int d = hexv(p->s[i]);
            if (d < 0) {
                pkv_free(o);
                return jfail(p, "bad \\u escape"), false;
            }
            cp = cp * 16 + (uint32_t)d;
        }
        p->s += 4;
        if (cp >= 0xd800 && cp < 0xdc00 && p->end - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u') {
            uint32_t lo = 0;
            bool ok = true;
            for (int i = 0; i < 4 && ok; i++) {
                int d = hexv(p->s[2 + i]);
                ok = d >= 0;
                lo = lo * 16 + (uint32_t)(d < 0 ? 0 : d);
            }
            if (ok && lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p->s += 6;
            }
        }
        if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd; /* a lone surrogate */
        n += put_utf8(o + n, cp); /* never longer than its escape */
    }
    p->s++;
    o[n] = 0;
    *out = o;
    *olen = n;
    return true;
}

static jval *jvalue(jparse *p);

static bool jpush(jval *v, jval *x, char *key) {
    size_t cap = v->n;
    jval **it = pkv_realloc(v->items, (cap + 1) * sizeof *it);
    if (!it) return false;
    v->items = it;
    if (v->k == JN_OBJ) {
        char **ks = pkv_realloc(v->keys, (cap + 1) * sizeof *ks);
        if (!ks) return false;
        v->keys = ks;
        v->keys[v->n] = key;
    }
    v->items[v->n++] = x;
    return true;
}

static jval *jvalue(jparse *p) {
    jws(p);
    if (p->s >= p->end) return jfail(p, "unexpected end");
    if (++p->depth > JSON_MAX_DEPTH) return jfail(p, "nested deeper than 64");
    jval *v = pkv_calloc(1, sizeof *v);
    if (!v) return jfail(p, "out of memory");
    char c = *p->s;
    if (c == '{' || c == '[') {
        v->k = c == '{' ? JN_OBJ : JN_ARR;
        char close = c == '{' ? '}' : ']';
        p->s++;
        jws(p);
        if (p->s < p->end && *p->s == close) {
            p->s++;
            goto done;
        }
        for (;;) {
            char *key = NULL;
            if (v->k == JN_OBJ) {
                jws(p);
                size_t kl;
                if (p->s >= p->end || *p->s != '"') {
                    jfail(p, "expected a key");
                    goto bad;
                }
                if (!jstring(p, &key, &kl)) goto bad;
                if (strlen(key) != kl) {
                    pkv_free(key);
                    jfail(p, "a key with a NUL character");
                    goto bad;
                }
                jws(p);
                if (p->s >= p->end || *p->s != ':') {
                    pkv_free(key);
                    jfail(p, "expected ':'");
                    goto bad;
                }
                p->s++;
            }
            jval *x = jvalue(p);
            if (!x || !jpush(v, x, key)) {
                jfree(x);
                pkv_free(key);
                if (!p->err[0]) jfail(p, "out of memory");
                goto bad;
            }
            jws(p);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                continue;
            }
            if (p->s < p->end && *p->s == close) {
                p->s++;
                goto done;
            }
            jfail(p, v->k == JN_OBJ ? "expected ',' or '}'" : "expected ',' or ']'");
            goto bad;
        }
    }
    if (c == '"') {
        v->k = JN_STR;
        if (!jstring(p, &v->s, &v->slen)) goto bad;
        goto done;
    }
    static const char *const lit[3] = {"null", "true", "false"};
    for (int i = 0; i < 3; i++) {
        size_t l = strlen(lit[i]);
        if ((size_t)(p->end - p->s) >= l && !memcmp(p->s, lit[i], l)) {
            p->s += l;
            v->k = i == 0 ? JN_NULL : JN_BOOL;
            v->b = i == 1;
            goto done;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const char *q = p->s;
        if (*q == '-') q++;
        if (q >= p->end || *q < '0' || *q > '9') goto badnum;
        if (*q == '0') q++;
        else
            while (q < p->end && *q >= '0' && *q <= '9') q++;
        v->is_int = true;
        if (q < p->end && *q == '.') {
            v->is_int = false;
            q++;
            if (q >= p->end || *q < '0' || *q > '9') goto badnum;
            while (q < p->end && *q >= '0' && *q <= '9') q++;
        }
        if (q < p->end && (*q == 'e' || *q == 'E')) {
            v->is_int = false;
            q++;
            if (q < p->end && (*q == '+' || *q == '-')) q++;
            if (q >= p->end || *q < '0' || *q > '9') goto badnum;
            while (q < p->end && *q >= '0' && *q <= '9') q++;
        }
        v->k = JN_NUM;
        v->slen = (size_t)(q - p->s);
        if (!(v->s = pkv_malloc(v->slen + 1))) goto bad;
        memcpy(v->s, p->s, v->slen);
        v->s[v->slen] = 0;
        v->num = strtod(v->s, NULL);
        p->s = q;
        goto done;
    badnum:
        jfail(p, "bad number");
        goto bad;
    }
    jfail(p, "unexpected character");
bad:
    jfree(v);
    return NULL;
done:
    p->depth--;
    return v;
}

static const jval *jget(const jval *o, const char *key) {
    if (!o || o->k != JN_OBJ) return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return o->items[i];
    return NULL;
}

/* ------------------------------------------------------------ converter */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (pkv_grow((void **)&b->p, &b->cap, b->n + n + 1, 1)) {
        b->oom = true;
        return;
    }
    if (n) memcpy(b->p + b->n, s, n); /* s may be an empty buffer's NULL */
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) PKV_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = pkv_malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    pkv_free(big);
}

typedef struct conv {
    const jval *root;
    sbuf g;            /* the grammar's rules */
    int n_rules;
    char err[512];
    /* $ref targets already given a rule: pointer text -> rule number */
    char **ref_name;
    int *ref_rule;
    int n_refs;
    int depth;
    const jval *nullable_done; /* the schema whose 'nullable' is being applied */
} conv;

/* SCHEMA_MAX_ENUM: each value is an alternative the matcher keeps a parse stack for
 * at the start, well below PKV_GRAMMAR_MAX_STACKS */
enum { SCHEMA_MAX_DEPTH = 64, SCHEMA_MAX_COUNT = 100000, SCHEMA_MAX_REFS = 4096, SCHEMA_MAX_ENUM = 4096 };
/* listed properties x key schemas (patternProperties, propertyNames) checked against each other */
enum { SCHEMA_MAX_KEY_CHECKS = 65536 };

/* Append s (n bytes) to a GBNF string literal body. */
static void gbnf_lit(sbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_add(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            char e[8];
            snprintf(e, sizeof e, "\\x%02x", c);
            sb_add(b, e, 4);
        } else {
            sb_add(b, (const char *)&c, 1);
        }
    }
}

/* The compact JSON text of v (strings escaped minimally: ", \ and controls). */
static void json_text(sbuf *b, const jval *v) {
    switch (v->k) {
    case JN_NULL: sb_add(b, "null", 4); break;
    case JN_BOOL: v->b ? sb_add(b, "true", 4) : sb_add(b, "false", 5); break;
    case JN_NUM: sb_add(b, v->s, v->slen); break;
    case JN_STR:
        sb_add(b, "\"", 1);
        for (size_t i = 0; i < v->slen; i++) {
            unsigned char c = (unsigned char)v->s[i];
            const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (esc) sb_add(b, esc, 2);
            else if (c < 0x20) sb_printf(b, "\\u%04x", c);
            else sb_add(b, (const char *)&c, 1);
        }
        sb_add(b, "\"", 1);
        break;
    case JN_ARR:
    case JN_OBJ:
        sb_add(b, v->k == JN_ARR ? "[" : "{", 1);
        for (size_t i = 0; i < v->n; i++) {
            if (i) sb_add(b, ",", 1);
            if (v->k == JN_OBJ) {
                jval k = {.k = JN_STR, .s = v->keys[i], .slen = strlen(v->keys[i])};
                json_text(b, &k);
                sb_add(b, ":", 1);
            }
            json_text(b, v->items[i]);
        }
        sb_add(b, v->k == JN_ARR ? "]" : "}", 1);
        break;
    }
}

/* A GBNF literal matching exactly the JSON text of v. */
static void lit_json(conv *c, sbuf *out, const jval *v) {
    sbuf t = {0};
    json_text(&t, v);
    sb_add(out, "\"", 1);
    if (t.p) gbnf_lit(out, t.p, t.n);
    sb_add(out, "\"", 1);
    if (t.oom) out->oom = true;
    pkv_free(t.p);
    (void)c;
}

static bool cfail(conv *c, const char *path, const char *fmt, ...) PKV_PRINTF(3, 4);
static bool cfail(conv *c, const char *path, const char *fmt, ...) {
    if (c->err[0]) return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, sizeof c->err, "%s: %s", path[0] ? path : "/ (the root)", msg);
    return false;
}

/* path + "/" + key, with ~ and / escaped as a JSON pointer asks. */
static void path_join(char *out, size_t n, const char *path, const char *key) {
    size_t k = (size_t)snprintf(out, n, "%s/", path);
    for (const char *s = key; *s && k + 3 < n; s++) {
        if (*s == '~') out[k++] = '~', out[k++] = '0';
        else if (*s == '/') out[k++] = '~', out[k++] = '1';
        else out[k++] = *s;
    }
    out[k < n ? k : n - 1] = 0;
}

static void path_index(char *out, size_t n, const char *path, const char *key, size_t i) {
    snprintf(out, n, "%s/%s/%zu", path, key, i);
}

/* Keywords: what each does here. */
static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment", "default", "examples",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
static const char *const applied[] = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties",
                                      "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
                                      "maxLength", "format", "minimum", "maximum", "exclusiveMinimum",
                                      "exclusiveMaximum", "multipleOf", "pattern", "prefixItems", "additionalItems",
                                      "propertyNames", "patternProperties", "nullable", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

static int gen(conv *c, const jval *s, const char *path);

/* A new rule number; its body is appended by the caller as "rN ::= ...\n". */
static int rule_id(conv *c) { return ++c->n_rules; }

static bool count_kw(conv *c, const jval *s, const char *key, const char *path, long *out, long dflt) {
    const jval *v = jget(s, key);
    *out = dflt;
    if (!v) return true;
    char p[1024];
    path_join(p, sizeof p, path, key);
    if (v->k != JN_NUM || !v->is_int || v->num < 0) return cfail(c, p, "'%s' must be a non-negative integer", key);
    if (v->num > SCHEMA_MAX_COUNT) return cfail(c, p, "'%s' above %d is not supported", key, SCHEMA_MAX_COUNT);
    *out = (long)v->num;
    return true;
}

/* Grammar text (into out) for {m,n} repetitions of x joined by sep: x (sep x){m-1,n-1},
 * optional when m = 0. n < 0: unbounded. */
static void repeat_sep(sbuf *out, const char *x, const char *sep, long m, long n) {
    if (n == 0) return;
    if (m == 0) sb_add(out, "(", 1);
    sb_printf(out, "%s (%s %s)", x, sep, x);
    long lo = m > 0 ? m - 1 : 0;
    if (n < 0) sb_printf(out, "{%ld,}", lo);
    else sb_printf(out, "{%ld,%ld}", lo, n - 1);
    if (m == 0) sb_add(out, ")?", 2);
}

/* ------------------------------------------------- integer and number ranges */

/* Integers are written with at most 16 digits and fractions with at most 16 (the
 * prelude's rules), so an integer part fits int64 and a bound whose integer part is
 * longer is no bound (or leaves no number). */
#define INT_LIMIT 9999999999999999ll
enum { INT_DIGITS = 16, FRAC_DIGITS = 16 };
/* multipleOf m / 10^d is a remainder automaton modulo m over the digits: a rule per
 * (digit position, remainder) reached, each of up to 10 alternatives (~130 bytes) */
enum { SCHEMA_MAX_MULTIPLE_STATES = 4096 };

/* A bound's exact decimal value: |v| = ip + 0.fr, or |v| >= 10^16 (big). fr: the
 * fraction's digits up to its last nonzero one, at most 17: a 17th digit '1' stands
 * for whatever nonzero digits lie past the 16th (an output has at most 16 fraction
 * digits, so only their presence matters). Zero is not negative. */
typedef struct dec {
    bool neg, big;
    int64_t ip;
    char fr[FRAC_DIGITS + 1]; /* digits, not NUL-terminated */
    int nf;
} dec;

/* The digits of a JSON number's text (checked by the parser): the mantissa's integer
 * and fraction digits, and how many mantissa digits lie before the point once the
 * exponent is applied (the exponent clamped: 10^8 digits is past any limit here). */
typedef struct mant {
    const char *ip, *fp;
    long ni, nf, point;
    bool neg;
} mant;

static void mant_read(const char *s, mant *m) {
    memset(m, 0, sizeof *m);
    if (*s == '-') m->neg = true, s++;
    m->ip = s;
    while (*s >= '0' && *s <= '9') s++, m->ni++;
    if (*s == '.')
        for (m->fp = ++s; *s >= '0' && *s <= '9'; s++) m->nf++;
    long e = 0;
    if (*s == 'e' || *s == 'E') {
        bool en = *++s == '-';
        if (*s == '-' || *s == '+') s++;
        for (; *s >= '0' && *s <= '9'; s++)
            if (e < 100000000) e = 10 * e + (*s - '0');
        if (en) e = -e;
    }
    m->point = m->ni + e;
}

/* Mantissa digit i; 0 outside the written ones. */
static int mant_digit(const mant *m, long i) {
    if (i < 0 || i >= m->ni + m->nf) return 0;
    return i < m->ni ? m->ip[i] - '0' : m->fp[i - m->ni] - '0';
}

/* The first and last nonzero mantissa digits; false for zero. */
static bool mant_span(const mant *m, long *z, long *l) {
    long n = m->ni + m->nf;
    for (*z = 0; *z < n && !mant_digit(m, *z);) (*z)++;
    if (*z == n) return false;
    for (*l = n - 1; !mant_digit(m, *l);) (*l)--;
    return true;
}

static dec dec_parse(const char *s) {
    dec x;
    memset(&x, 0, sizeof x);
    mant m;
    long z, l;
    mant_read(s, &m);
    if (!mant_span(&m, &z, &l)) return x;
    x.neg = m.neg;
    if (m.point - z > INT_DIGITS) {
        x.big = true;
        return x;
    }
    for (long i = z; i < m.point; i++) x.ip = 10 * x.ip + mant_digit(&m, i);
    if (l >= m.point) {
        long n = l - m.point + 1;
        for (x.nf = 0; x.nf < n && x.nf < FRAC_DIGITS; x.nf++) x.fr[x.nf] = (char)('0' + mant_digit(&m, m.point + x.nf));
        if (n > FRAC_DIGITS) x.fr[x.nf++] = '1';
    }
    return x;
}

static dec dec_int(int64_t v) {
    dec x;
    memset(&x, 0, sizeof x);
    x.neg = v < 0;
    x.ip = v < 0 ? -v : v;
    return x;
}

static bool dec_zero(const dec *x) { return !x->big && !x->ip && !x->nf; }

static dec dec_neg(dec x) {
    if (!dec_zero(&x)) x.neg = !x.neg;
    return x;
}

static int dec_digit(const dec *x, int i) { return i < x->nf ? x->fr[i] - '0' : 0; }

/* |a| against |b|: -1, 0, 1 (two big values compare equal: both are past the digits) */
static int dec_mag_cmp(const dec *a, const dec *b) {
    if (a->big || b->big) return (int)a->big - (int)b->big;
    if (a->ip != b->ip) return a->ip < b->ip ? -1 : 1;
    for (int i = 0; i < a->nf || i < b->nf; i++)
        if (dec_digit(a, i) != dec_digit(b, i)) return dec_digit(a, i) < dec_digit(b, i) ? -1 : 1;
    return 0;
}

static int dec_cmp(const dec *a, const dec *b) {
    if (a->neg != b->neg) return a->neg ? -1 : 1;
    int c = dec_mag_cmp(a, b);
    return a->neg ? -c : c;
}

/* Digit strings of one length between two bounds (as strings), optionally with the
 * value a multiple of m: the ranges are built digit by digit (a bound stays "tight"
 * along its own digits, everything else is free digits), so a 16-digit range takes
 * O(16^2) grammar text; the multiple adds rules "k free digits, remainder r". For a
 * number the remainder carries on into the fraction: multipleOf m / 10^d asks that
 * the value times 10^d be a multiple of m, so the first d fraction digits count and
 * the later ones are zeros. */
typedef struct digits {
    conv *c;
    long m;          /* modulus; 1: none */
    bool frac;       /* a number: a fraction may follow the integer digits */
    int d;           /* fraction digits the multiple counts; FRAC_DIGITS without one */
    int *free_rule;  /* [(INT_DIGITS + 1) * m]: rule of k free digits from remainder r, 0: not made */
    bool *ok;        /* [(INT_DIGITS + 1) * m]: k free digits (and the fraction) from remainder r can end at 0 */
    int *frac_rule;  /* [d * m]: rule of the free fraction from position i < d with remainder r */
    bool *frac_ok;   /* [(d + 1) * m]: j fraction digits left before position d from remainder r can end at 0 */
    long p10[FRAC_DIGITS + 1]; /* 10^j mod m */
    int n_states;    /* rules made for remainders */
    bool over;       /* more than SCHEMA_MAX_MULTIPLE_STATES were asked for */
    const dec *flo, *fhi; /* frac_tight's bounds (only read while tight to them) */
    bool flo_excl, fhi_excl;
} digits;

static void digit_class(sbuf *o, unsigned mask) {
    sb_add(o, "[", 1);
    for (int d = 0; d < 10;) {
        if (!(mask >> d & 1)) {
            d++;
            continue;
        }
        int e = d;
        while (e + 1 < 10 && mask >> (e + 1) & 1) e++;
        if (e == d) sb_printf(o, "%d", d);
        else sb_printf(o, "%d-%d", d, e);
        d = e + 1;
    }
    sb_add(o, "]", 1);
}

/* Digits lo..hi after remainder r grouped by the remainder each leads to, in order of
 * first appearance: n groups (next[i], mask[i]). O(10) whatever m is. */
static int dg_groups(const digits *g, long r, int lo, int hi, long *next, unsigned *mask) {
    int n = 0;
    for (int d = lo; d <= hi; d++) {
        long s = (10 * r + d) % g->m;
        int k = 0;
        while (k < n && next[k] != s) k++;
        if (k == n) next[n] = s, mask[n++] = 0;
        mask[k] |= 1u << d;
    }
    return n;
}

static bool dg_state(digits *g) {
    if (++g->n_states > SCHEMA_MAX_MULTIPLE_STATES) g->over = true;
    return !g->over;
}

/* Can the fraction from position i (i digits written) with remainder r end at
 * remainder 0, and may it end right here? */
static bool frac_can(const digits *g, int i, long r) {
    if (g->m == 1) return true;
    return i >= g->d ? r == 0 : g->frac_ok[(g->d - i) * g->m + r];
}

static bool frac_end(const digits *g, int i, long r) {
    if (g->m == 1) return true;
    return i >= g->d ? r == 0 : r * g->p10[g->d - i] % g->m == 0;
}

/* Any fraction from position i (0: before the '.') with remainder r that ends at
 * remainder 0 and has at most FRAC_DIGITS digits, those from position d on zeros.
 * Appended to o (space first); false if none. */
static bool dg_free(digits *g, sbuf *o, int k, long r);

/* Alternatives "digit-class rest" over the digits from remainder r, grouped by the
 * remainder each leads to, those where can(pos, next) holds, rest(pos, next) after
 * each; appended to b with " | " between. */
static void dg_alts(digits *g, sbuf *b, long r, int pos, bool (*can)(const digits *, int, long),
                    bool (*rest)(digits *, sbuf *, int, long)) {
    long next[10];
    unsigned mask[10];
    int n = dg_groups(g, r, 0, 9, next, mask);
    bool first = true;
    for (int k = 0; k < n; k++) {
        if (!can(g, pos, next[k])) continue;
        sb_add(b, first ? "" : " | ", first ? 0 : 3);
        first = false;
        digit_class(b, mask[k]);
        rest(g, b, pos, next[k]);
    }
}

/* k free integer digits can end from remainder r */
static bool dg_ok(const digits *g, int k, long r) { return g->ok[k * g->m + r]; }

static bool frac_free(digits *g, sbuf *o, int i, long r) {
    if (!frac_can(g, i, r)) return false;
    if (i >= g->d) { /* only zeros from here on (r is 0) */
        if (!i) sb_printf(o, " (\".\" \"0\"{1,%d})?", FRAC_DIGITS);
        else if (i < FRAC_DIGITS) sb_printf(o, " \"0\"{0,%d}", FRAC_DIGITS - i);
        return true;
    }
    if (g->m == 1) {
        if (!i) {
            sb_add(o, " (\".\" [0-9]", 11);
            frac_free(g, o, 1, 0);
            sb_add(o, ")?", 2);
            return true;
        }
        int a = g->d - i, z = FRAC_DIGITS - g->d; /* a free digits, then z zeros */
        if (!z) sb_printf(o, " [0-9]{0,%d}", a);
        else if (a == 1) sb_printf(o, " ([0-9] \"0\"{0,%d})?", z);
        else sb_printf(o, " ([0-9]{0,%d} | [0-9]{%d} \"0\"{0,%d})", a - 1, a, z);
        return true;
    }
    int *fr = &g->frac_rule[i * g->m + r];
    if (!*fr) {
        if (!dg_state(g)) return false;
        sbuf b = {0};
        dg_alts(g, &b, r, i + 1, frac_can, frac_free);
        if (!g->over) {
            bool end = frac_end(g, i, r);
            *fr = rule_id(g->c);
            if (i) sb_printf(&g->c->g, "r%d ::= (%s)%s\n", *fr, b.p ? b.p : "", end ? "?" : "");
            else sb_printf(&g->c->g, "r%d ::= %s\".\" (%s)%s\n", *fr, end ? "(" : "", b.p ? b.p : "", end ? ")?" : "");
        }
        if (b.oom) g->c->g.oom = true;
        pkv_free(b.p);
        if (g->over) return false;
    }
    sb_printf(o, " r%d", *fr);
    return true;
}

/* The fraction of a number whose integer part equals a bound's: from position i
 * (0: before the '.') with remainder r; tl/th: the digits so far equal the lower /
 * upper bound's fraction digits (g->flo, g->fhi), compared as decimals (a missing
 * digit is 0). Appended to o (space first); false if none. Each level adds a constant
 * amount of text: linear in the bound's (at most 17) fraction digits. */
static bool frac_tight(digits *g, sbuf *o, int i, long r, bool tl, bool th) {
    const dec *lo = g->flo, *hi = g->fhi;
    if (tl && !g->flo_excl && lo->nf <= i) tl = false; /* at or above the bound whatever follows */
    if (!tl && !th) return frac_free(g, o, i, r);
    if (!frac_can(g, i, r)) return false;
    if (th && !tl && hi->nf <= i) { /* only zeros stay at or below it, and equal it */
        if (g->fhi_excl || !frac_end(g, i, r)) return false;
        if (!i) sb_printf(o, " (\".\" \"0\"{1,%d})?", FRAC_DIGITS);
        else if (i < FRAC_DIGITS) sb_printf(o, " \"0\"{0,%d}", FRAC_DIGITS - i);
        return true;
    }
    /* ending here: below a tight upper bound (it has more nonzero digits); never at a
     * tight lower one (it has more nonzero digits, or is exclusive and equal) */
    bool end = !tl && frac_end(g, i, r);
    if (i == FRAC_DIGITS) return end;
    int lo_d = tl ? dec_digit(lo, i) : 0, hi_d = th ? dec_digit(hi, i) : 9, max_d = i >= g->d ? 0 : 9;
    sbuf b = {0};
    bool first = true;
    long next[10];
    unsigned mask[10];
    int n = 0;
    for (int d = lo_d; d <= hi_d && d <= max_d; d++) {
        long s = i >= g->d ? r : (10 * r + d) % g->m;
        bool ntl = tl && d == lo_d, nth = th && d == hi_d;
        if (!ntl && !nth) { /* free from here: grouped by remainder below */
            int k = 0;
            while (k < n && next[k] != s) k++;
            if (k == n) next[n] = s, mask[n++] = 0;
            mask[k] |= 1u << d;
            continue;
        }
        sbuf t = {0};
        sb_printf(&t, "\"%d\"", d);
        if (frac_tight(g, &t, i + 1, s, ntl, nth) && t.p) {
            sb_add(&b, first ? "" : " | ", first ? 0 : 3);
            first = false;
            sb_add(&b, t.p, t.n);
        }
        if (t.oom) b.oom = true;
        pkv_free(t.p);
    }
    for (int k = 0; k < n; k++) {
        sbuf t = {0};
        digit_class(&t, mask[k]);
        if (frac_free(g, &t, i + 1, next[k]) && t.p) {
            sb_add(&b, first ? "" : " | ", first ? 0 : 3);
            first = false;
            sb_add(&b, t.p, t.n);
        }
        if (t.oom) b.oom = true;
        pkv_free(t.p);
    }
    if (!first) sb_printf(o, " %s(%s)%s", i ? "" : "(\".\" ", b.p ? b.p : "", i ? (end ? "?" : "") : (end ? ")?" : ")"));
    if (b.oom) o->oom = true;
    pkv_free(b.p);
    return !first || end;
}

/* What follows the integer digits, from remainder r: a number's fraction, or (an
 * integer) nothing, at remainder 0. With m = 1 a number's fraction is written once
 * after all the integer digits instead (num_side). */
static bool dg_tail(digits *g, sbuf *o, long r) {
    if (g->m == 1) return true;
    return g->frac ? frac_free(g, o, 0, r) : r == 0;
}

/* k free digits from remainder r: appended to o (space first); false if none can end. */
static bool dg_free(digits *g, sbuf *o, int k, long r) {
    if (g->m == 1) {
        if (k) sb_printf(o, " [0-9]{%d}", k);
        return true;
    }
    if (!k) return dg_tail(g, o, r);
    if (!g->ok[k * g->m + r]) return false;
    int *fr = &g->free_rule[k * g->m + r];
    if (!*fr) {
        if (!dg_state(g)) return false;
        sbuf b = {0};
        dg_alts(g, &b, r, k - 1, dg_ok, dg_free);
        if (!g->over) {
            *fr = rule_id(g->c);
            sb_printf(&g->c->g, "r%d ::= %s\n", *fr, b.p ? b.p : "\"\"");
        }
        if (b.oom) g->c->g.oom = true;
        pkv_free(b.p);
        if (g->over) return false;
    }
    sb_printf(o, " r%d", *fr);
    return true;
}

/* Alternatives "d rest" for digits lo..hi at this position, grouped by the remainder
 * they lead to; appended to o with " | " between (first: nothing written yet). */
static void dg_spread(digits *g, sbuf *o, bool *first, int lo, int hi, int k, long r) {
    long next[10];
    unsigned mask[10];
    int n = g->m == 1 ? (lo <= hi) : dg_groups(g, r, lo, hi, next, mask);
    if (g->m == 1 && n) next[0] = 0, mask[0] = (2u << hi) - (1u << lo);
    for (int i = 0; i < n; i++) {
        sbuf t = {0};
        digit_class(&t, mask[i]);
        if (dg_free(g, &t, k, next[i]) && t.p) {
            sb_add(o, *first ? "" : " | ", *first ? 0 : 3);
            *first = false;
            sb_add(o, t.p, t.n);
        }
        if (t.oom) o->oom = true;
        pkv_free(t.p);
    }
}

static bool all_of(const char *s, char ch) {
    for (; *s; s++)
        if (*s != ch) return false;
    return true;
}

/* Digits of x..y (same length, as strings) from position pos with remainder r so far;
 * tl/th: still equal to x's / y's digits. Appended to o (space first); false if empty. */
static bool dg_range(digits *g, sbuf *o, const char *x, const char *y, int pos, long r, bool tl, bool th) {
    int len = (int)strlen(x), k = len - pos;
    if (!k) return dg_tail(g, o, r);
    if (!tl && !th) return dg_free(g, o, k, r);
    if (g->m == 1 && (!tl || all_of(x + pos, '0')) && (!th || all_of(y + pos, '9'))) return dg_free(g, o, k, r);
    int lo = tl ? x[pos] - '0' : 0, hi = th ? y[pos] - '0' : 9;
    if (g->m == 1 && (!tl || all_of(x + pos + 1, '0')) && (!th || all_of(y + pos + 1, '9'))) {
        /* every digit here leaves the rest free: [1-9] [0-9]{15}, not 1 | 9 | [2-8] apart */
        sb_add(o, " ", 1);
        digit_class(o, (2u << hi) - (1u << lo));
        return dg_free(g, o, k - 1, 0);
    }
    int tight[2], nt = 0;
    if (tl) tight[nt++] = lo;
    if (th && !(tl && hi == lo)) tight[nt++] = hi;
    sbuf b = {0};
    bool first = true;
    for (int i = 0; i < nt; i++) {
        int d = tight[i];
        bool ntl = tl && d == lo, nth = th && d == hi;
        sbuf t = {0};
        sb_printf(&t, "\"%d\"", d);
        if (dg_range(g, &t, x, y, pos + 1, (10 * r + d) % g->m, ntl, nth)) {
            sb_add(&b, first ? "" : " | ", first ? 0 : 3);
            first = false;
            sb_add(&b, t.p, t.n);
        }
        if (t.oom) b.oom = true;
        pkv_free(t.p);
    }
    dg_spread(g, &b, &first, tl ? lo + 1 : lo, th ? hi - 1 : hi, k - 1, r);
    if (!first) sb_printf(o, " (%s)", b.p ? b.p : "");
    if (b.oom) o->oom = true;
    pkv_free(b.p);
    return !first;
}

static int ndig(int64_t v) {
    int n = 1;
    for (; v >= 10; v /= 10) n++;
    return n;
}

static int64_t pow10i(int n) {
    int64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
}

/* Alternatives (" | " between) for the decimal digits of lo..hi, 0 <= lo <= hi <=
 * INT_LIMIT, no leading zeros, each followed by its tail (dg_tail); false if none (a
 * multiple that does not occur). */
static bool dg_uint(digits *g, sbuf *alts, int64_t lo, int64_t hi) {
    bool first = true;
    for (int len = ndig(lo); lo <= hi && len <= ndig(hi); len++) {
        int64_t x = len == ndig(lo) ? lo : pow10i(len - 1), y = len == ndig(hi) ? hi : pow10i(len) - 1;
        char xs[24], ys[24];
        snprintf(xs, sizeof xs, "%lld", (long long)x);
        snprintf(ys, sizeof ys, "%lld", (long long)y);
        sbuf t = {0};
        if (dg_range(g, &t, xs, ys, 0, 0, true, true) && t.p) {
            sb_add(alts, first ? "" : " | ", first ? 0 : 3);
            first = false;
            sb_add(alts, t.p, t.n);
        }
        if (t.oom) alts->oom = true;
        pkv_free(t.p);
    }
    return !first;
}

/* m: the modulus (1: none); frac: a number (d: the fraction digits m counts). */
static bool dg_init(digits *g, conv *c, long m, bool frac, int d) {
    memset(g, 0, sizeof *g);
    g->c = c;
    g->m = m;
    g->frac = frac;
    g->d = frac ? d : 0;
    if (m == 1) return true;
    size_t n = (size_t)(INT_DIGITS + 1) * (size_t)m, nf = (size_t)(g->d + 1) * (size_t)m;
    g->free_rule = pkv_calloc(n, sizeof *g->free_rule);
    g->ok = pkv_calloc(n, sizeof *g->ok);
    g->frac_rule = pkv_calloc(nf, sizeof *g->frac_rule);
    g->frac_ok = pkv_calloc(nf, sizeof *g->frac_ok);
    if (!g->free_rule || !g->ok || !g->frac_rule || !g->frac_ok) return false;
    g->p10[0] = 1 % m;
    for (int j = 1; j <= FRAC_DIGITS; j++) g->p10[j] = g->p10[j - 1] * 10 % m;
    g->frac_ok[0] = true;
    for (int j = 1; j <= g->d; j++)
        for (long r = 0; r < m; r++)
            for (int e = 0; e < 10 && !g->frac_ok[j * m + r]; e++)
                g->frac_ok[j * m + r] = g->frac_ok[(j - 1) * m + (10 * r + e) % m];
    for (long r = 0; r < m; r++) g->ok[r] = frac ? frac_can(g, 0, r) : r == 0;
    for (int k = 1; k <= INT_DIGITS; k++)
        for (long r = 0; r < m; r++)
            for (int e = 0; e < 10 && !g->ok[k * m + r]; e++) g->ok[k * m + r] = g->ok[(k - 1) * m + (10 * r + e) % m];
    return true;
}

static void dg_free_all(digits *g) {
    pkv_free(g->free_rule);
    pkv_free(g->ok);
    pkv_free(g->frac_rule);
    pkv_free(g->frac_ok);
}

/* One bound of a number: inclusive or exclusive, from minimum/maximum and the
 * exclusive keywords (a number since draft 6, a boolean in draft 4 and OpenAPI 3.0). */
typedef struct bound {
    bool set, excl;
    dec v;
    const char *kw; /* the keyword it came from, for messages */
} bound;

static bool read_bound(conv *c, const jval *s, const char *path, bool upper, bound *b) {
    const char *kin = upper ? "maximum" : "minimum", *kex = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    const jval *in = jget(s, kin), *ex = jget(s, kex);
    char p[1024];
    memset(b, 0, sizeof *b);
    if (in) {
        path_join(p, sizeof p, path, kin);
        if (in->k != JN_NUM) return cfail(c, p, "'%s' must be a number", kin);
        *b = (bound){.set = true, .v = dec_parse(in->s), .kw = kin};
    }
    if (ex) {
        path_join(p, sizeof p, path, kex);
        if (ex->k == JN_BOOL) {
            if (ex->b && !in) return cfail(c, p, "'%s': true needs '%s' beside it", kex, kin);
            if (ex->b) b->excl = true, b->kw = kex;
        } else if (ex->k == JN_NUM) {
            /* both given: the stricter one applies */
            dec e = dec_parse(ex->s);
            int cmp = b->set ? dec_cmp(&e, &b->v) : 0;
            if (!b->set || (upper ? cmp <= 0 : cmp >= 0)) *b = (bound){.set = true, .excl = true, .v = e, .kw = kex};
        } else {
            return cfail(c, p, "'%s' must be a number (or a boolean, draft 4)", kex);
        }
    }
    return true;
}

/* OpenAPI's number formats: int32 narrows the bounds; int64, float and double say
 * nothing the grammar's 16 digits do not already; any other is refused. */
static bool num_format(conv *c, const jval *s, const char *path, bound *lo, bound *hi) {
    const jval *f = jget(s, "format");
    if (!f) return true;
    char p[1024];
    path_join(p, sizeof p, path, "format");
    if (f->k != JN_STR) return cfail(c, p, "'format' must be a string");
    if (!strcmp(f->s, "int32")) {
        dec l = dec_int(-2147483648ll), h = dec_int(2147483647ll);
        if (!lo->set || dec_cmp(&lo->v, &l) < 0) *lo = (bound){.set = true, .v = l, .kw = "format"};
        if (!hi->set || dec_cmp(&hi->v, &h) > 0) *hi = (bound){.set = true, .v = h, .kw = "format"};
        return true;
    }
    if (!strcmp(f->s, "int64") || !strcmp(f->s, "float") || !strcmp(f->s, "double")) return true;
    return cfail(c, p, "format '%s' on a number is not supported (supported: int32, int64, float, double)", f->s);
}

static long gcd10(long m) { return m % 10 == 0 ? 10 : m % 5 == 0 ? 5 : m % 2 == 0 ? 2 : 1; }

/* multipleOf as m / 10^d, exactly from its text (m an integer): on an integer, value x
 * 10^d a multiple of m is value a multiple of m / gcd(m, 10^d) (d = 0 then); on a
 * number, d past the 16 fraction digits is folded into m the same way. text: the
 * keyword's text, for messages. */
static bool read_multiple(conv *c, const jval *s, const char *path, bool integer, long *m, int *d, const char **text) {
    const jval *v = jget(s, "multipleOf");
    *m = 1, *d = integer ? 0 : FRAC_DIGITS, *text = "1";
    if (!v) return true;
    char p[1024];
    path_join(p, sizeof p, path, "multipleOf");
    mant mt;
    long z, l;
    if (v->k == JN_NUM) mant_read(v->s, &mt);
    if (v->k != JN_NUM || mt.neg || !mant_span(&mt, &z, &l)) return cfail(c, p, "'multipleOf' must be a number above 0");
    *text = v->s;
    long e = mt.point - (l + 1), mm = 0, dd = e < 0 ? -e : 0; /* the value is digits z..l times 10^e */
    if (l - z + 1 + (e > 0 ? e : 0) <= 9) {
        for (long i = z; i <= l; i++) mm = 10 * mm + mant_digit(&mt, i);
        for (long i = 0; i < e; i++) mm *= 10;
        for (; dd > (integer ? 0 : FRAC_DIGITS) && gcd10(mm) > 1; dd--) mm /= gcd10(mm);
    }
    if (!mm || mm > SCHEMA_MAX_MULTIPLE_STATES)
        return cfail(c, p,
                     "'multipleOf' %s is above the limit of %d remainders (m in multipleOf = m / 10^d; each "
                     "remainder is a grammar rule per digit)",
                     v->s, SCHEMA_MAX_MULTIPLE_STATES);
    *m = mm;
    *d = integer ? 0 : dd < FRAC_DIGITS ? (int)dd : FRAC_DIGITS;
    return true;
}

/* The limit of remainder states was reached: refused naming multipleOf (and the bounds
 * it was intersected with). */
static int multiple_over(conv *c, const char *path, const char *text, const bound *lo, const bound *hi) {
    char p[1024];
    path_join(p, sizeof p, path, "multipleOf");
    if (lo->set || hi->set)
        return cfail(c, p,
                     "'multipleOf' %s within the bounds ('%s', '%s') needs more than the limit of %d remainder "
                     "states (a grammar rule per digit position and remainder)",
                     text, lo->kw ? lo->kw : "-", hi->kw ? hi->kw : "-", SCHEMA_MAX_MULTIPLE_STATES), -1;
    return cfail(c, p,
                 "'multipleOf' %s needs more than the limit of %d remainder states (a grammar rule per digit "
                 "position and remainder); bounds with fewer digits ('minimum', 'maximum') need fewer",
                 text, SCHEMA_MAX_MULTIPLE_STATES), -1;
}

/* The smallest (upper: largest) integer within a bound, clamped to 16 digits; false
 * if none of 16 digits is. */
static bool int_bound(const bound *b, bool upper, int64_t *out) {
    *out = upper ? INT_LIMIT : -INT_LIMIT;
    if (!b->set) return true;
    const dec *x = &b->v;
    if (x->big) return upper ? !x->neg : x->neg;
    int64_t v = x->neg ? -x->ip : x->ip;
    if (!x->nf) v += b->excl ? (upper ? -1 : 1) : 0;
    else if (upper) v -= x->neg; /* floor */
    else v += !x->neg;           /* ceil */
    if (upper ? v < -INT_LIMIT : v > INT_LIMIT) return false;
    if (upper ? v < INT_LIMIT : v > -INT_LIMIT) *out = v;
    return true;
}

/* The rule of the integers allowed by s's bounds and multipleOf. */
static int gen_integer(conv *c, const jval *s, const char *path) {
    bound blo, bhi;
    long m;
    int d;
    const char *mtext;
    if (!read_bound(c, s, path, false, &blo) || !read_bound(c, s, path, true, &bhi) ||
        !read_multiple(c, s, path, true, &m, &d, &mtext) || !num_format(c, s, path, &blo, &bhi))
        return -1;
    int r;
    if (!blo.set && !bhi.set && !jget(s, "multipleOf")) {
        r = rule_id(c);
        sb_printf(&c->g, "r%d ::= integer\n", r);
        return r;
    }
    /* the smallest and largest integer inside the bounds, exactly, clamped to 16 digits */
    int64_t ilo, ihi;
    if (!int_bound(&blo, false, &ilo) || !int_bound(&bhi, true, &ihi) || ilo > ihi)
        return cfail(c, path, "no integer of at most 16 digits satisfies the bounds ('%s', '%s')",
                     blo.kw ? blo.kw : "-", bhi.kw ? bhi.kw : "-"), -1;
    digits g;
    sbuf alts = {0}, neg = {0};
    r = -1;
    if (!dg_init(&g, c, m, false, 0)) {
        cfail(c, path, "out of memory");
        goto out;
    }
    bool any = ihi >= 0 && dg_uint(&g, &alts, ilo > 0 ? ilo : 0, ihi);
    if (ilo < 0 && dg_uint(&g, &neg, ihi < -1 ? -ihi : 1, -ilo) && neg.p) {
        sb_printf(&alts, "%s\"-\" (%s)", any ? " | " : "", neg.p);
        any = true;
    }
    if (g.over) {
        multiple_over(c, path, mtext, &blo, &bhi);
        goto out;
    }
    if (!any) {
        cfail(c, path, "no integer in [%lld, %lld] is a multiple of %s", (long long)ilo, (long long)ihi, mtext);
        goto out;
    }
    r = rule_id(c);
    sb_printf(&c->g, "r%d ::= %s\n", r, alts.p ? alts.p : "\"\"");
    if (alts.oom || neg.oom) c->g.oom = true;
out:
    dg_free_all(&g);
    pkv_free(alts.p);
    pkv_free(neg.p);
    return r;
}

/* A number whose integer part is the literal I (a bound's), its fraction compared
 * with the bound(s) digit by digit. */
static void num_lit(digits *g, sbuf *o, bool *first, bool neg, int64_t I, bool tl, bool th) {
    sbuf t = {0};
    sb_printf(&t, "%s\"%lld\"", neg ? "\"-\" " : "", (long long)I);
    if (frac_tight(g, &t, 0, (long)(I % g->m), tl, th) && t.p) {
        sb_printf(o, "%s%s", *first ? "" : " | ", t.p);
        *first = false;
    }
    if (t.oom) o->oom = true;
    pkv_free(t.p);
}

/* One sign's numbers u = |value| with lo <(=) u <(=) hi (lo >= 0; hi >= 0, or NULL:
 * none within 16 digits): the integer part strictly between the bounds' with any
 * fraction (the remainder automaton carrying into it), or equal to a bound's with
 * the fraction compared digit by digit. neg: written with "-". */
static void num_side(digits *g, sbuf *o, bool *first, bool neg, const dec *lo, bool lo_excl, const dec *hi,
                     bool hi_excl) {
    if (lo->big) return;
    if (hi) {
        int c = dec_mag_cmp(lo, hi);
        if (c > 0 || (c == 0 && (lo_excl || hi_excl))) return;
    }
    int64_t a = lo->ip + 1, b = hi ? hi->ip - 1 : INT_LIMIT;
    sbuf t = {0};
    if (a <= b && dg_uint(g, &t, a, b) && t.p) {
        sb_printf(o, "%s%s(%s)", *first ? "" : " | ", neg ? "\"-\" " : "", t.p);
        if (g->m == 1) frac_free(g, o, 0, 0);
        *first = false;
    }
    if (t.oom) o->oom = true;
    pkv_free(t.p);
    g->flo = lo, g->flo_excl = lo_excl, g->fhi = hi, g->fhi_excl = hi_excl;
    if (hi && hi->ip == lo->ip) {
        num_lit(g, o, first, neg, lo->ip, true, true);
    } else {
        num_lit(g, o, first, neg, lo->ip, true, false);
        if (hi) num_lit(g, o, first, neg, hi->ip, false, true);
    }
}

/* The rule of the numbers allowed by s's bounds and multipleOf, exactly: the decimal
 * text is compared with the bounds (any bound: an integer, a fraction, an exponent
 * form) and its digits run through the remainder automaton. With bounds or a multiple
 * no exponent is written, and -0 is not. */
static int gen_number(conv *c, const jval *s, const char *path) {
    bound blo, bhi;
    long m;
    int d;
    const char *mtext;
    if (!read_bound(c, s, path, false, &blo) || !read_bound(c, s, path, true, &bhi) ||
        !read_multiple(c, s, path, false, &m, &d, &mtext) || !num_format(c, s, path, &blo, &bhi))
        return -1;
    int r;
    if (!blo.set && !bhi.set && !jget(s, "multipleOf")) {
        r = rule_id(c);
        sb_printf(&c->g, "r%d ::= number\n", r);
        return r;
    }
    digits g;
    sbuf o = {0};
    bool first = true;
    r = -1;
    if (!dg_init(&g, c, m, true, d)) {
        cfail(c, path, "out of memory");
        goto out;
    }
    /* value >= 0: u = value from max(lo, 0); value < 0: u = -value from max(-hi, 0
     * exclusive) (no -0), up to -lo */
    dec zero = dec_int(0), plo = zero, nlo = zero, phi, nhi;
    bool plo_x = false, nlo_x = true, pos = true, negs = true;
    if (blo.set && !blo.v.neg) plo = blo.v, plo_x = blo.excl, negs = false;
    if (bhi.set && bhi.v.neg) nlo = dec_neg(bhi.v), nlo_x = bhi.excl, pos = false;
    if (bhi.set) phi = bhi.v;
    if (blo.set) nhi = dec_neg(blo.v);
    bool has_phi = bhi.set && !bhi.v.big, has_nhi = blo.set && !blo.v.big;
    if (pos) num_side(&g, &o, &first, false, &plo, plo_x, has_phi ? &phi : NULL, bhi.excl);
    if (negs) num_side(&g, &o, &first, true, &nlo, nlo_x, has_nhi ? &nhi : NULL, blo.excl);
    if (g.over) {
        multiple_over(c, path, mtext, &blo, &bhi);
    } else if (first) {
        if (jget(s, "multipleOf"))
            cfail(c, path,
                  "no number with at most 16 integer and 16 fraction digits satisfies the bounds ('%s', '%s') and "
                  "'multipleOf' %s",
                  blo.kw ? blo.kw : "-", bhi.kw ? bhi.kw : "-", mtext);
        else
            cfail(c, path, "no number satisfies the bounds ('%s', '%s')", blo.kw ? blo.kw : "-", bhi.kw ? bhi.kw : "-");
    } else {
        r = rule_id(c);
        sb_printf(&c->g, "r%d ::= %s\n", r, o.p ? o.p : "\"\"");
    }
out:
    if (o.oom) c->g.oom = true;
    dg_free_all(&g);
    pkv_free(o.p);
    return r;
}

/* ------------------------------------------------------------- patterns */

/* An ECMA-262 regular expression (the subset below) as a grammar over the JSON text
 * of the string: characters that JSON escapes ('"', '\' and controls) are written as
 * their escapes. A character set is a list of code point ranges. */
enum { RX_MAX_RANGES = 512, RX_MAX_REPEAT = 1000, RX_MAX_NESTING = 32 };

typedef struct cset {
    uint32_t lo[RX_MAX_RANGES], hi[RX_MAX_RANGES];
    int n;
    bool no_controls; /* made by negation (., [^...], \D \W \S): controls are not written */
} cset;

typedef struct rx {
    conv *c;
    const char *pat, *s, *end, *path;
    int depth;
} rx;

static bool rx_fail(rx *x, const char *fmt, ...) PKV_PRINTF(2, 3);
static bool rx_fail(rx *x, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cfail(x->c, x->path, "pattern at offset %zu: %s", (size_t)(x->s - x->pat), msg);
}

static void cs_add(cset *cs, uint32_t lo, uint32_t hi) {
    if (cs->n < RX_MAX_RANGES) cs->lo[cs->n] = lo, cs->hi[cs->n++] = hi;
}

/* Sorted, merged ranges. */
static void cs_norm(cset *cs) {
    for (int i = 1; i < cs->n; i++)
        for (int j = i; j > 0 && cs->lo[j] < cs->lo[j - 1]; j--) {
            uint32_t a = cs->lo[j], b = cs->hi[j];
            cs->lo[j] = cs->lo[j - 1], cs->hi[j] = cs->hi[j - 1];
            cs->lo[j - 1] = a, cs->hi[j - 1] = b;
        }
    int k = 0;
    for (int i = 0; i < cs->n; i++) {
        if (k && cs->lo[i] <= cs->hi[k - 1] + 1) {
            if (cs->hi[i] > cs->hi[k - 1]) cs->hi[k - 1] = cs->hi[i];
        } else {
            cs->lo[k] = cs->lo[i], cs->hi[k++] = cs->hi[i];
        }
    }
    cs->n = k;
}

static void cs_negate(cset *cs) {
    cs_norm(cs);
    cset o = {.no_controls = true};
    uint32_t at = 0;
    for (int i = 0; i < cs->n; i++) {
        if (cs->lo[i] > at) cs_add(&o, at, cs->lo[i] - 1);
        at = cs->hi[i] + 1;
    }
    if (at <= 0x10ffff) cs_add(&o, at, 0x10ffff);
    *cs = o;
}

/* \d \w \s (upper case: negated) into cs. */
static void cs_class(cset *cs, char e) {
    cset t = {0};
    switch (e | 0x20) {
    case 'd': cs_add(&t, '0', '9'); break;
    case 'w':
        cs_add(&t, '0', '9'), cs_add(&t, 'A', 'Z'), cs_add(&t, 'a', 'z'), cs_add(&t, '_', '_');
        break;
    default: /* ECMA's white space and line terminators */
        cs_add(&t, 9, 13), cs_add(&t, ' ', ' '), cs_add(&t, 0xa0, 0xa0), cs_add(&t, 0x1680, 0x1680);
        cs_add(&t, 0x2000, 0x200a), cs_add(&t, 0x2028, 0x2029), cs_add(&t, 0x202f, 0x202f);
        cs_add(&t, 0x205f, 0x205f), cs_add(&t, 0x3000, 0x3000), cs_add(&t, 0xfeff, 0xfeff);
        break;
    }
    if (e >= 'A' && e <= 'Z') cs_negate(&t);
    for (int i = 0; i < t.n; i++) cs_add(cs, t.lo[i], t.hi[i]);
    if (t.no_controls) cs->no_controls = true;
}

static void class_char(sbuf *o, uint32_t c) {
    if (c < 0x80) sb_printf(o, "\\x%02x", (unsigned)c);
    else if (c < 0x10000) sb_printf(o, "\\u%04x", (unsigned)c);
    else sb_printf(o, "\\U%08x", (unsigned)c);
}

/* The JSON text of code point c inside a string, as a GBNF literal. */
static void json_char_lit(sbuf *o, uint32_t c) {
    char t[8];
    size_t n;
    const char *shortesc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                         : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
    if (shortesc) memcpy(t, shortesc, n = 2);
    else if (c < 0x20) n = (size_t)snprintf(t, sizeof t, "\\u%04x", (unsigned)c);
    else n = put_utf8(t, c);
    sb_add(o, "\"", 1);
    gbnf_lit(o, t, n);
    sb_add(o, "\"", 1);
}

/* The set as a grammar expression; false if it is empty. */
static bool cs_emit(sbuf *o, cset *cs) {
    static const uint32_t cut_lo[4] = {0, 0x22, 0x5c, 0xd800}, cut_hi[4] = {0x1f, 0x22, 0x5c, 0xdfff};
    cs_norm(cs);
    sbuf cls = {0}, alt = {0};
    for (int i = 0; i < cs->n; i++) {
        uint32_t lo = cs->lo[i], hi = cs->hi[i], a = lo;
        /* '"', '\' and controls as their escapes (controls not from a negation) */
        for (uint32_t c = lo; c <= hi && c < 0x60; c++)
            if ((c < 0x20 && !cs->no_controls) || c == 0x22 || c == 0x5c) {
                sb_add(&alt, " | ", 3);
                json_char_lit(&alt, c);
            }
        for (int k = 0; k < 4 && a <= hi; k++) { /* the rest as a class, around those and the surrogates */
            if (cut_hi[k] < a) continue;
            if (cut_lo[k] > hi) break;
            if (cut_lo[k] > a) {
                class_char(&cls, a);
                if (cut_lo[k] - 1 > a) sb_add(&cls, "-", 1), class_char(&cls, cut_lo[k] - 1);
            }
            a = cut_hi[k] + 1;
        }
        if (a <= hi) {
            class_char(&cls, a);
            if (hi > a) sb_add(&cls, "-", 1), class_char(&cls, hi);
        }
    }
    bool any = cls.n || alt.n;
    if (any) {
        sb_add(o, "(", 1);
        if (cls.n) sb_printf(o, "[%s]", cls.p);
        if (alt.n) sb_add(o, cls.n ? alt.p : alt.p + 3, cls.n ? alt.n : alt.n - 3);
        sb_add(o, ")", 1);
    }
    if (cls.oom || alt.oom) o->oom = true;
    pkv_free(cls.p);
    pkv_free(alt.p);
    return any;
}

/* A UTF-8 character of the pattern; -1 if malformed. */
static int64_t rx_utf8(rx *x) {
    const unsigned char *s = (const unsigned char *)x->s;
    size_t left = (size_t)(x->end - x->s);
    int n = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (!n || (size_t)n > left) return -1;
    uint32_t c = n == 1 ? s[0] : n == 2 ? s[0] & 0x1fu : n == 3 ? s[0] & 0x0fu : s[0] & 0x07u;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return -1;
        c = c << 6 | (s[i] & 0x3fu);
    }
    x->s += n;
    return c;
}

static int64_t rx_hex(rx *x, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        int d = x->s + i < x->end ? hexv(x->s[i]) : -1;
        if (d < 0) return -1;
        v = v * 16 + (uint32_t)d;
    }
    x->s += n;
    return v;
}

/* An escape after '\' (x->s at the letter): a code point, or -2 with a class added to
 * cs (\d \w \s and negations), or -1 after an error. in_class: '\b' is backspace. */
static int64_t rx_escape(rx *x, cset *cs, bool in_class) {
    if (x->s >= x->end) return rx_fail(x, "'\\' at the end"), -1;
    char e = *x->s;
    if (strchr("dDwWsS", e)) {
        x->s++;
        cs_class(cs, e);
        return -2;
    }
    if (e == 'b' && in_class) return x->s++, '\b';
    if (e == 'b' || e == 'B') return rx_fail(x, "word boundary '\\%c' is not supported", e), -1;
    if (e >= '1' && e <= '9') return rx_fail(x, "backreference '\\%c' is not supported", e), -1;
    if (e == 'k') return rx_fail(x, "named backreference '\\k' is not supported"), -1;
    if (e == 'p' || e == 'P') return rx_fail(x, "Unicode property escape '\\%c' is not supported", e), -1;
    if (e == 'c') return rx_fail(x, "control escape '\\c' is not supported"), -1;
    x->s++;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': {
        int64_t v = rx_hex(x, 2);
        return v < 0 ? (rx_fail(x, "'\\x' needs 2 hex digits"), -1) : v;
    }
    case 'u': {
        if (x->s < x->end && *x->s == '{') return rx_fail(x, "'\\u{...}' (the u flag) is not supported"), -1;
        int64_t v = rx_hex(x, 4);
        if (v < 0) return rx_fail(x, "'\\u' needs 4 hex digits"), -1;
        if (v >= 0xd800 && v < 0xdc00 && x->end - x->s >= 6 && x->s[0] == '\\' && x->s[1] == 'u') {
            const char *at = x->s;
            x->s += 2;
            int64_t lo = rx_hex(x, 4);
            if (lo >= 0xdc00 && lo < 0xe000) return 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
            x->s = at;
        }
        if (v >= 0xd800 && v < 0xe000) return rx_fail(x, "a lone surrogate '\\u%04x' is not supported", (unsigned)v), -1;
        return v;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
            return x->s--, rx_fail(x, "unknown escape '\\%c'", e), -1;
        x->s--;
        return rx_utf8(x); /* an escaped punctuation character is itself */
    }
}

/* [...] at x->s (after '['). */
static bool rx_class(rx *x, sbuf *o) {
    cset cs = {0};
    bool neg = x->s < x->end && *x->s == '^';
    if (neg) x->s++;
    bool first = true;
    for (;;) {
        if (x->s >= x->end) return rx_fail(x, "'[' without ']'");
        if (*x->s == ']' && !first) break;
        if (*x->s == ']') return rx_fail(x, neg ? "'[^]' is not supported" : "'[]' matches nothing");
        first = false;
        int64_t a;
        if (*x->s == '\\') {
            x->s++;
            if ((a = rx_escape(x, &cs, true)) == -1) return false;
            if (a == -2) continue;
        } else if ((a = rx_utf8(x)) < 0) {
            return rx_fail(x, "malformed UTF-8");
        }
        int64_t b = a;
        if (x->end - x->s >= 2 && *x->s == '-' && x->s[1] != ']') {
            x->s++;
            if (*x->s == '\\') {
                x->s++;
                if ((b = rx_escape(x, &cs, true)) == -1) return false;
                if (b == -2) return rx_fail(x, "a class escape as the end of a range");
            } else if ((b = rx_utf8(x)) < 0) {
                return rx_fail(x, "malformed UTF-8");
            }
            if (b < a) return rx_fail(x, "range out of order in a character class");
        }
        cs_add(&cs, (uint32_t)a, (uint32_t)b);
        if (cs.n >= RX_MAX_RANGES) return rx_fail(x, "more than %d ranges in a character class", RX_MAX_RANGES);
    }
    x->s++;
    if (neg) cs_negate(&cs);
    if (!cs_emit(o, &cs)) return rx_fail(x, "a character class that matches no character");
    return true;
}

/* The lengths (in characters) of the strings a pattern matches; hi < 0: unbounded. */
typedef struct rlen {
    long lo, hi;
} rlen;

#define RLEN_CAP 1000000000L

static rlen rlen_times(rlen a, long m, long n) {
    rlen r = {a.lo * m > RLEN_CAP ? RLEN_CAP : a.lo * m, 0};
    if (n == 0 || a.hi == 0) r.hi = 0;
    else if (n < 0 || a.hi < 0) r.hi = -1;
    else r.hi = a.hi * n > RLEN_CAP ? RLEN_CAP : a.hi * n;
    return r;
}

static bool rx_alt(rx *x, sbuf *o, bool top, rlen *len);

/* A quantifier after an atom, if any: written after it, its counts in *qm, *qn (n < 0:
 * unbounded; 1, 1 without one); false after an error. */
static bool rx_quant(rx *x, sbuf *o, long *qm, long *qn) {
    *qm = *qn = 1;
    if (x->s >= x->end) return true;
    char q = *x->s;
    long m, n;
    if (q == '*' || q == '+' || q == '?') {
        x->s++;
        sb_add(o, &q, 1);
        *qm = q == '+', *qn = q == '?' ? 1 : -1;
    } else if (q == '{') {
        const char *at = x->s++;
        char *e;
        if (x->s >= x->end || *x->s < '0' || *x->s > '9') return x->s = at, rx_fail(x, "'{' is not a quantifier (write '\\{')");
        m = strtol(x->s, &e, 10);
        if (e >= x->end) return x->s = at, rx_fail(x, "'{' is not a quantifier (write '\\{')");
        n = m;
        x->s = e;
        if (*x->s == ',') {
            x->s++;
            n = -1;
            if (x->s < x->end && *x->s >= '0' && *x->s <= '9') n = strtol(x->s, &e, 10), x->s = e;
        }
        if (x->s >= x->end || *x->s != '}') return x->s = at, rx_fail(x, "'{' is not a quantifier (write '\\{')");
        x->s++;
        if (m > RX_MAX_REPEAT || n > RX_MAX_REPEAT)
            return rx_fail(x, "a repetition count above the limit of %d", RX_MAX_REPEAT);
        if (n >= 0 && n < m) return rx_fail(x, "{%ld,%ld}: the maximum is below the minimum", m, n);
        if (n < 0) sb_printf(o, "{%ld,}", m);
        else sb_printf(o, "{%ld,%ld}", m, n);
        *qm = m, *qn = n;
    } else {
        return true;
    }
    if (x->s < x->end && *x->s == '?') x->s++; /* lazy: the same strings */
    if (x->s < x->end && strchr("*+?{", *x->s))
        return rx_fail(x, "a quantifier after a quantifier");
    return true;
}

/* A sequence up to '|', ')' or the end. */
static bool rx_seq(rx *x, sbuf *o, bool top, bool *end_anchor, rlen *len) {
    bool any = false;
    *len = (rlen){0, 0};
    while (x->s < x->end && *x->s != '|' && *x->s != ')') {
        sbuf a = {0};
        bool ok = true;
        rlen al = {1, 1}; /* a character, or the group's */
        char ch = *x->s;
        if (ch == '$' && top && (x->s + 1 == x->end || x->s[1] == '|')) {
            x->s++; /* the end anchor */
            *end_anchor = true;
            break;
        }
        if (ch == '^' || ch == '$') {
            ok = rx_fail(x, "anchor '%c' inside the pattern is not supported (only at the start or end)", ch);
        } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
            ok = rx_fail(x, "quantifier '%c' with nothing to repeat", ch);
        } else if (ch == '(') {
            x->s++;
            if (x->s < x->end && *x->s == '?') {
                if (x->end - x->s >= 2 && x->s[1] == ':') x->s += 2;
                else if (x->end - x->s >= 2 && (x->s[1] == '=' || x->s[1] == '!'))
                    x->s--, ok = rx_fail(x, "lookahead '(?%c' is not supported", x->s[2]);
                else if (x->end - x->s >= 3 && x->s[1] == '<' && (x->s[2] == '=' || x->s[2] == '!'))
                    x->s--, ok = rx_fail(x, "lookbehind '(?<%c' is not supported", x->s[3]);
                else if (x->end - x->s >= 2 && x->s[1] == '<') {
                    const char *e = memchr(x->s, '>', (size_t)(x->end - x->s));
                    if (!e) ok = rx_fail(x, "named group without '>'");
                    else x->s = e + 1;
                } else {
                    char m = x->end - x->s >= 2 ? x->s[1] : ' ';
                    x->s--, ok = rx_fail(x, "group modifier '(?%c' is not supported", m);
                }
            }
            if (ok) {
                if (++x->depth > RX_MAX_NESTING) ok = rx_fail(x, "groups nested deeper than %d", RX_MAX_NESTING);
                else ok = rx_alt(x, &a, false, &al);
                x->depth--;
                if (ok && (x->s >= x->end || *x->s != ')')) ok = rx_fail(x, "'(' without ')'");
                if (ok) x->s++;
            }
        } else if (ch == '[') {
            x->s++;
            ok = rx_class(x, &a);
        } else if (ch == '.') {
            x->s++;
            cset cs = {0};
            cs_add(&cs, '\n', '\n'), cs_add(&cs, '\r', '\r'), cs_add(&cs, 0x2028, 0x2029);
            cs_negate(&cs);
            cs_emit(&a, &cs);
        } else if (ch == '\\') {
            x->s++;
            cset cs = {0};
            int64_t v = rx_escape(x, &cs, false);
            if (v == -1) ok = false;
            else if (v == -2) cs_emit(&a, &cs);
            else json_char_lit(&a, (uint32_t)v);
        } else {
            int64_t v = rx_utf8(x);
            if (v < 0) ok = rx_fail(x, "malformed UTF-8");
            else json_char_lit(&a, (uint32_t)v);
        }
        if (ok) {
            sb_printf(o, "%s(%s)", any ? " " : "", a.p ? a.p : "\"\"");
            any = true;
            long qm, qn;
            ok = rx_quant(x, o, &qm, &qn);
            al = rlen_times(al, qm, qn);
            len->lo = len->lo + al.lo > RLEN_CAP ? RLEN_CAP : len->lo + al.lo;
            len->hi = len->hi < 0 || al.hi < 0 ? -1 : len->hi + al.hi > RLEN_CAP ? RLEN_CAP : len->hi + al.hi;
        }
        if (a.oom) o->oom = true;
        pkv_free(a.p);
        if (!ok) return false;
    }
    if (!any) sb_add(o, "\"\"", 2);
    return true;
}

/* Alternatives. top: the whole pattern, where each alternative may be anchored with
 * '^' and '$' and is unanchored otherwise (a JSON schema pattern matches anywhere in
 * the string: an unanchored side may hold any characters). */
static bool rx_alt(rx *x, sbuf *o, bool top, rlen *len) {
    sb_add(o, "(", 1);
    for (bool first = true;; first = false) {
        if (!first) sb_add(o, " | ", 3);
        bool start = false;
        if (top && x->s < x->end && *x->s == '^') x->s++, start = true;
        sbuf seq = {0};
        rlen sl;
        bool end = false, ok = rx_seq(x, &seq, top, &end, &sl);
        if (top && (!start || !end)) sl.hi = -1; /* any characters around */
        if (first) *len = sl;
        else len->lo = sl.lo < len->lo ? sl.lo : len->lo, len->hi = sl.hi < 0 || len->hi < 0 ? -1 : sl.hi > len->hi ? sl.hi : len->hi;
        if (ok) sb_printf(o, "%s%s%s", start || !top ? "" : "char* ", seq.p, end || !top ? "" : " char*");
        if (seq.oom) o->oom = true;
        pkv_free(seq.p);
        if (!ok) return false;
        if (x->s >= x->end || *x->s != '|') break;
        x->s++;
    }
    sb_add(o, ")", 1);
    if (top && x->s < x->end) return rx_fail(x, "')' without '('");
    return true;
}

/* The grammar (inside the quotes of a JSON string) of pattern p at path, and the
 * lengths of the strings it matches (len may be NULL). */
static bool gen_pattern_body(conv *c, sbuf *o, const jval *p, const char *path, rlen *len) {
    if (p->k != JN_STR) return cfail(c, path, "'pattern' must be a string");
    if (strlen(p->s) != p->slen) return cfail(c, path, "a pattern with a NUL character is not supported");
    rx x = {.c = c, .pat = p->s, .s = p->s, .end = p->s + p->slen, .path = path};
    rlen l;
    bool ok = rx_alt(&x, o, true, &l);
    if (len) *len = l;
    return ok;
}

/* ---------------------------------------------------------- strings, arrays */

/* The formats: rules of the prelude (docs/engine.md says what each admits). */
static const struct {
    const char *name, *rule;
    long lo, hi; /* the lengths of the strings it admits, in characters */
} formats[] = {
    {"date", "date", 10, 10},       {"time", "time", 9, 24},        {"date-time", "datetime", 20, 35},
    {"uuid", "uuid", 36, 36},       {"email", "email", 6, 239},     {"uri", "uri", 5, 1760},
    {"ipv4", "ipv4", 7, 15},        {"ipv6", "ipv6", 15, 39},       {"hostname", "hostname", 1, 191},
};

/* A format with a pattern beside it is one grammar only where one of the two admits
 * only strings the other admits too: the patterns zod 4 writes with its formats.
 * use_format: the format's grammar is inside the pattern (else the pattern is inside
 * the format). Any other pair is refused. */
static const struct {
    const char *format, *pattern;
    bool use_format;
} format_patterns[] = {
    {"email", "^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$", true},
    {"uuid", "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-"
             "0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$", false},
    {"date-time", "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:"
                  "0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))"
                  "T(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:Z))$", false},
    {"date", "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|"
             "1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$", false},
    {"ipv4", "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|"
             "[0-9])$", false},
    {"ipv6", "^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|("
             "[0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:)"
             "{1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:((:[0-9a-fA-F]{1,4})"
             "{1,6})|:((:[0-9a-fA-F]{1,4}){1,7}|:))$", false},
};

/* minLength/maxLength beside a pattern or format: accepted when every string the
 * pattern or format admits already has such a length (zod's .email().max(255)),
 * else refused: a grammar of both is not made. */
static bool lengths_implied(conv *c, const char *path, const char *what, rlen l, long mn, long mx) {
    if (mx >= 0 && mx < mn) return cfail(c, path, "maxLength %ld is below minLength %ld", mx, mn);
    if (l.lo >= mn && (mx < 0 || (l.hi >= 0 && l.hi <= mx))) return true;
    char hi[32], lim[32];
    if (l.hi < 0) snprintf(hi, sizeof hi, "any number of");
    else snprintf(hi, sizeof hi, "%ld", l.hi);
    if (mx < 0) snprintf(lim, sizeof lim, "none");
    else snprintf(lim, sizeof lim, "%ld", mx);
    return cfail(c, path, "minLength %ld / maxLength %s with '%s' is not supported: its strings are %ld to %s characters "
                          "long (a length is enforced beside a pattern or format only when they imply it)", mn, lim, what, l.lo, hi);
}

static int gen_string(conv *c, const jval *s, const char *path) {
    long mn, mx;
    if (!count_kw(c, s, "minLength", path, &mn, 0) || !count_kw(c, s, "maxLength", path, &mx, -1)) return -1;
    const jval *f = jget(s, "format"), *pat = jget(s, "pattern");
    const char *frule = NULL;
    rlen flen = {0, -1};
    char p[1024];
    if (f) {
        path_join(p, sizeof p, path, "format");
        if (f->k != JN_STR) return cfail(c, p, "'format' must be a string"), -1;
        for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
            if (!strcmp(f->s, formats[i].name)) frule = formats[i].rule, flen = (rlen){formats[i].lo, formats[i].hi};
        if (!frule)
            return cfail(c, p, "format '%s' is not supported (supported: date, time, date-time, uuid, email, uri, ipv4, "
                               "ipv6, hostname)", f->s), -1;
    }
    if (f && pat) {
        size_t i = 0, n = sizeof format_patterns / sizeof *format_patterns;
        while (i < n && (strcmp(f->s, format_patterns[i].format) || pat->k != JN_STR || strcmp(pat->s, format_patterns[i].pattern)))
            i++;
        if (i == n)
            return cfail(c, path, "'format' '%s' together with a 'pattern' is not supported (only the pairs zod 4 writes, "
                                  "docs/engine.md)", f->s), -1;
        if (format_patterns[i].use_format) pat = NULL;
        else frule = NULL;
    }
    bool lens = jget(s, "minLength") || jget(s, "maxLength");
    if (pat) {
        sbuf b = {0};
        path_join(p, sizeof p, path, "pattern");
        rlen pl = {0, -1};
        bool ok = gen_pattern_body(c, &b, pat, p, &pl);
        if (ok && lens && !lengths_implied(c, path, "pattern", pl, mn, mx)) ok = false;
        int r = -1;
        if (ok) {
            r = rule_id(c);
            sb_printf(&c->g, "r%d ::= \"\\\"\" %s \"\\\"\"\n", r, b.p);
        }
        if (b.oom) c->g.oom = true;
        pkv_free(b.p);
        return r;
    }
    if (frule && lens && !lengths_implied(c, path, "format", flen, mn, mx)) return -1;
    int r = rule_id(c);
    if (frule) {
        sb_printf(&c->g, "r%d ::= \"\\\"\" %s \"\\\"\"\n", r, frule);
        return r;
    }
    if (mx >= 0 && mx < mn) return cfail(c, path, "maxLength %ld is below minLength %ld", mx, mn), -1;
    if (mn == 0 && mx < 0) sb_printf(&c->g, "r%d ::= string\n", r);
    else if (mx < 0) sb_printf(&c->g, "r%d ::= \"\\\"\" char{%ld,} \"\\\"\"\n", r, mn);
    else sb_printf(&c->g, "r%d ::= \"\\\"\" char{%ld,%ld} \"\\\"\"\n", r, mn, mx);
    return r;
}

/* Arrays: a tuple (prefixItems, or items as an array with additionalItems, draft 7)
 * then the rest (items / additionalItems: a schema, true or absent = any, false =
 * none), between minItems and maxItems. */
static int gen_array(conv *c, const jval *s, const char *path) {
    long mn, mx;
    if (!count_kw(c, s, "minItems", path, &mn, 0) || !count_kw(c, s, "maxItems", path, &mx, -1)) return -1;
    if (mx >= 0 && mx < mn) return cfail(c, path, "maxItems %ld is below minItems %ld", mx, mn), -1;
    const jval *pre = jget(s, "prefixItems"), *rest = jget(s, "items"), *add = jget(s, "additionalItems");
    const char *pkw = "prefixItems", *rkw = "items";
    char p[1024];
    if (rest && rest->k == JN_ARR) {
        if (pre) return path_join(p, sizeof p, path, "items"), cfail(c, p, "'items' as an array beside 'prefixItems'"), -1;
        pre = rest, pkw = "items";
        rest = add, rkw = "additionalItems";
    } else if (add) {
        path_join(p, sizeof p, path, "additionalItems");
        return cfail(c, p, "'additionalItems' applies only beside 'items' as an array"), -1;
    }
    if (pre && pre->k != JN_ARR) return path_join(p, sizeof p, path, pkw), cfail(c, p, "'%s' must be an array", pkw), -1;
    size_t n = pre ? pre->n : 0;
    if (n > SCHEMA_MAX_ENUM) return path_join(p, sizeof p, path, pkw), cfail(c, p, "more than %d tuple items", SCHEMA_MAX_ENUM), -1;
    char item[32] = "value";
    bool none = false;
    if (rest) {
        path_join(p, sizeof p, path, rkw);
        if (rest->k == JN_BOOL) none = !rest->b;
        else {
            int ir = gen(c, rest, p);
            if (ir < 0) return -1;
            snprintf(item, sizeof item, "r%d", ir);
        }
    }
    int r;
    if (!n) {
        if (none && mn > 0) return cfail(c, path, "minItems %ld with no items allowed ('%s': false)", mn, rkw), -1;
        r = rule_id(c);
        char x[64];
        snprintf(x, sizeof x, "%s ws", item);
        sb_printf(&c->g, "r%d ::= \"[\" ws ", r);
        repeat_sep(&c->g, x, "\",\" ws", mn, none ? 0 : mx);
        sb_add(&c->g, " \"]\"\n", 5);
        return r;
    }
    if (none && (size_t)mn > n)
        return cfail(c, path, "minItems %ld is more than the %zu tuple items ('%s': false)", mn, n, rkw), -1;
    size_t ne = mx >= 0 && (size_t)mx < n ? (size_t)mx : n; /* tuple items that may appear */
    int *pr = pkv_calloc(n, sizeof *pr);
    if (!pr) return cfail(c, path, "out of memory"), -1;
    for (size_t i = 0; i < n; i++) {
        char pi[1024];
        path_index(pi, sizeof pi, path, pkw, i);
        if ((pr[i] = gen(c, pre->items[i], pi)) < 0) {
            pkv_free(pr);
            return -1;
        }
    }
    /* t_i: the items from i on, each behind a comma; t_ne: the rest */
    int t0 = c->n_rules;
    for (size_t i = 1; i <= ne; i++) (void)rule_id(c);
    for (size_t i = ne; i >= 1; i--) {
        sb_printf(&c->g, "r%d ::= ", t0 + (int)i);
        if (i == ne) {
            long rmin = mn > (long)n ? mn - (long)n : 0, rmax = none || ne < n ? 0 : mx < 0 ? -1 : mx - (long)n;
            if (rmax) {
                sb_printf(&c->g, "(\",\" ws %s ws)", item);
                if (rmax < 0) sb_printf(&c->g, "{%ld,}", rmin);
                else sb_printf(&c->g, "{%ld,%ld}", rmin, rmax);
            } else {
                sb_add(&c->g, "\"\"", 2);
            }
        } else {
            sb_printf(&c->g, "(\",\" ws r%d ws r%d)%s", pr[i], t0 + (int)i + 1, (long)i >= mn ? "?" : "");
        }
        sb_add(&c->g, "\n", 1);
    }
    r = rule_id(c);
    if (!ne) sb_printf(&c->g, "r%d ::= \"[\" ws \"]\"\n", r);
    else sb_printf(&c->g, "r%d ::= \"[\" ws (r%d ws r%d)%s \"]\"\n", r, pr[0], t0 + 1, mn == 0 ? "?" : "");
    pkv_free(pr);
    return r;
}

/* The schema sub compiled alone (NULL with pkv_errmsg: a reference, a keyword refused). */
static pkv_grammar *sub_compile(const jval *sub) {
    sbuf b = {0};
    json_text(&b, sub);
    pkv_grammar *g = b.oom ? NULL : pkv_grammar_from_json_schema(b.p, b.n);
    if (b.oom) pkv_err(PKV_ERR_NOMEM, "out of memory");
    pkv_free(b.p);
    return g;
}

/* The rule of the keys propertyNames allows (a string schema); 0: any string. */
static int gen_key(conv *c, const jval *pn, const char *path) {
    if (pn->k == JN_BOOL && pn->b) return 0;
    if (pn->k != JN_OBJ) return cfail(c, path, "'propertyNames' must be a string schema (or true)"), -1;
    const jval *t = jget(pn, "type");
    if (t && !(t->k == JN_STR && !strcmp(t->s, "string"))) return cfail(c, path, "'propertyNames' must describe strings"), -1;
    static const char *const ok[] = {"type", "pattern", "minLength", "maxLength", "format", "enum", "const", NULL};
    for (size_t i = 0; i < pn->n; i++)
        if (!in_list(annotations, pn->keys[i]) && !in_list(ok, pn->keys[i])) {
            char p[1024];
            path_join(p, sizeof p, path, pn->keys[i]);
            return cfail(c, p, "keyword '%s' in 'propertyNames' is not supported", pn->keys[i]), -1;
        }
    const jval *e = jget(pn, "enum"), *k = jget(pn, "const");
    if (e || k) {
        if (k && k->k != JN_STR) return cfail(c, path, "'propertyNames' 'const' must be a string"), -1;
        for (size_t i = 0; e && e->k == JN_ARR && i < e->n; i++)
            if (e->items[i]->k != JN_STR) return cfail(c, path, "'propertyNames' 'enum' values must be strings"), -1;
        return gen(c, pn, path);
    }
    int r = gen_string(c, pn, path);
    return r;
}

static int gen_object(conv *c, const jval *s, const char *path) {
    const jval *props = jget(s, "properties"), *req = jget(s, "required"), *add = jget(s, "additionalProperties");
    char p[1024];
    if (props && props->k != JN_OBJ) {
        path_join(p, sizeof p, path, "properties");
        return cfail(c, p, "'properties' must be an object"), -1;
    }
    if (req && req->k != JN_ARR) {
        path_join(p, sizeof p, path, "required");
        return cfail(c, p, "'required' must be an array of strings"), -1;
    }
    const jval *pprops = jget(s, "patternProperties"), *pnames = jget(s, "propertyNames");
    if (pprops) {
        path_join(p, sizeof p, path, "patternProperties");
        if (pprops->k != JN_OBJ) return cfail(c, p, "'patternProperties' must be an object"), -1;
        if (add && !(add->k == JN_BOOL && !add->b)) {
            path_join(p, sizeof p, path, "additionalProperties");
            return cfail(c, p, "'additionalProperties' other than false beside 'patternProperties' is not supported (keys "
                               "that match no pattern cannot be told apart)"), -1;
        }
        if (pnames) return path_join(p, sizeof p, path, "propertyNames"),
                           cfail(c, p, "'propertyNames' beside 'patternProperties' is not supported"), -1;
        if (!pprops->n) pprops = NULL;
        else add = NULL; /* the patterns are the only extras */
    }
    size_t np = props ? props->n : 0;
    bool *isreq = pkv_calloc(np + 1, sizeof *isreq);
    int *vr = pkv_calloc(np + 1, sizeof *vr);
    int r = -1;
    if (!isreq || !vr) {
        cfail(c, path, "out of memory");
        goto out;
    }
    for (size_t i = 0; req && i < req->n; i++) {
        const jval *k = req->items[i];
        path_join(p, sizeof p, path, "required");
        if (k->k != JN_STR) {
            path_index(p, sizeof p, path, "required", i);
            cfail(c, p, "'required' entries must be strings");
            goto out;
        }
        size_t j = 0;
        while (j < np && strcmp(props->keys[j], k->s)) j++;
        if (j == np) {
            path_index(p, sizeof p, path, "required", i);
            cfail(c, p, "required property '%s' is not in 'properties' (with a closed object it could never appear)", k->s);
            goto out;
        }
        isreq[j] = true;
    }
    /* additional properties: absent = none when properties are given, any when not
     * (llama.cpp's choice); true = any value; a schema = values of that schema */
    int extra = 0; /* 0 none, -1 any value, > 0 rule */
    if (add) {
        path_join(p, sizeof p, path, "additionalProperties");
        if (add->k == JN_BOOL) extra = add->b ? -1 : 0;
        else if (add->k == JN_OBJ) {
            if ((extra = gen(c, add, p)) < 0) goto out;
        } else {
            cfail(c, p, "'additionalProperties' must be a boolean or a schema");
            goto out;
        }
    } else if (!props && !pprops) {
        extra = -1;
    }
    for (size_t i = 0; i < np; i++) {
        path_join(p, sizeof p, path, "properties");
        char pp[1024];
        path_join(pp, sizeof pp, p, props->keys[i]);
        if ((vr[i] = gen(c, props->items[i], pp)) < 0) goto out;
    }
    /* kv_i ::= "\"key\"" ws ":" ws value ws; extras: string ws ":" ws value ws */
    int kv0 = c->n_rules + 1;
    for (size_t i = 0; i < np; i++) {
        int k = rule_id(c);
        jval key = {.k = JN_STR, .s = props->keys[i], .slen = strlen(props->keys[i])};
        sb_printf(&c->g, "r%d ::= ", k);
        lit_json(c, &c->g, &key);
        sb_printf(&c->g, " ws \":\" ws r%d ws\n", vr[i]);
    }
    /* extras: one alternative per pattern property, else the additional properties
     * (keys of propertyNames, or any string) */
    int xr = 0;
    sbuf xb = {0};
    if (pprops) {
        for (size_t i = 0; i < pprops->n; i++) {
            char pk[1024];
            path_join(p, sizeof p, path, "patternProperties");
            path_join(pk, sizeof pk, p, pprops->keys[i]);
            jval pat = {.k = JN_STR, .s = pprops->keys[i], .slen = strlen(pprops->keys[i])};
            int vr2 = gen(c, pprops->items[i], pk);
            if (vr2 < 0) break;
            sb_printf(&xb, "%s\"\\\"\" ", i ? " | " : "");
            if (!gen_pattern_body(c, &xb, &pat, pk, NULL)) break;
            sb_printf(&xb, " \"\\\"\" ws \":\" ws r%d ws", vr2);
        }
    } else if (extra) {
        int kr = 0;
        if (pnames) {
            path_join(p, sizeof p, path, "propertyNames");
            kr = gen_key(c, pnames, p);
        }
        if (kr >= 0) {
            if (kr) sb_printf(&xb, "r%d", kr);
            else sb_add(&xb, "string", 6);
            if (extra < 0) sb_add(&xb, " ws \":\" ws value ws", 19);
            else sb_printf(&xb, " ws \":\" ws r%d ws", extra);
        }
    }
    if (xb.oom) c->g.oom = true;
    if (!c->err[0] && xb.n) {
        xr = rule_id(c);
        sb_printf(&c->g, "r%d ::= %s\n", xr, xb.p);
    }
    pkv_free(xb.p);
    if (c->err[0]) goto out;
    /* a named property that a pattern (or propertyNames) would give another schema (or
     * refuse) is refused: the grammar could not keep the two apart. Each key schema is
     * compiled alone once; the checks are bounded. */
    if (np && (pprops || pnames)) {
        size_t nk = (pprops ? pprops->n : 0) + (pnames ? 1 : 0);
        if (np * nk > SCHEMA_MAX_KEY_CHECKS) {
            cfail(c, path, "%zu properties beside %zu key patterns: more than the limit of %d checks", np, nk,
                  SCHEMA_MAX_KEY_CHECKS);
            goto out;
        }
        pkv_grammar **kg = pkv_calloc(nk, sizeof *kg);
        if (!kg) {
            cfail(c, path, "out of memory");
            goto out;
        }
        for (size_t j = 0; j < nk && !c->err[0]; j++) {
            bool is_pn = pnames && j == nk - 1;
            jval pat = {.k = JN_STR, .s = is_pn ? NULL : pprops->keys[j], .slen = is_pn ? 0 : strlen(pprops->keys[j])};
            jval ty = {.k = JN_STR, .s = (char *)"string", .slen = 6};
            jval *its[2] = {&ty, &pat};
            char *ks[2] = {(char *)"type", (char *)"pattern"};
            jval sub = {.k = JN_OBJ, .items = its, .keys = ks, .n = 2};
            if (!(kg[j] = sub_compile(is_pn ? pnames : &sub))) {
                path_join(p, sizeof p, path, is_pn ? "propertyNames" : "patternProperties");
                cfail(c, p, "the key schema does not compile alone (it is checked against the listed properties): %s",
                      pkv_errmsg());
            }
        }
        for (size_t i = 0; i < np && !c->err[0]; i++) {
            sbuf kt = {0};
            jval key = {.k = JN_STR, .s = props->keys[i], .slen = strlen(props->keys[i])};
            json_text(&kt, &key);
            for (size_t j = 0; j < nk && !c->err[0] && kt.p; j++) {
                bool is_pn = pnames && j == nk - 1, ok = pkv_grammar_accepts(kg[j], kt.p, kt.n);
                if (is_pn && !ok) {
                    path_join(p, sizeof p, path, "propertyNames");
                    cfail(c, p, "property '%s' is not allowed by 'propertyNames'", props->keys[i]);
                } else if (!is_pn && ok) {
                    path_join(p, sizeof p, path, "patternProperties");
                    cfail(c, p, "property '%s' also matches the pattern '%s': not supported", props->keys[i],
                          pprops->keys[j]);
                }
            }
            if (kt.oom) cfail(c, path, "out of memory");
            pkv_free(kt.p);
        }
        for (size_t j = 0; j < nk; j++) pkv_grammar_free(kg[j]);
        pkv_free(kg);
        if (c->err[0]) goto out;
    }
    /* tail_i: properties i.. after something was written, each behind a comma */
    int tail0 = c->n_rules + 1;
    for (size_t i = 0; i <= np; i++) (void)rule_id(c);
    for (size_t i = 0; i <= np; i++) {
        sb_printf(&c->g, "r%d ::= ", tail0 + (int)i);
        if (i == np) {
            if (xr) sb_printf(&c->g, "(\",\" ws r%d)*", xr);
        } else {
            sb_printf(&c->g, isreq[i] ? "\",\" ws r%d r%d" : "(\",\" ws r%d)? r%d", kv0 + (int)i, tail0 + (int)i + 1);
        }
        sb_add(&c->g, "\n", 1);
    }
    /* the first property written: any optional one up to the first required one */
    r = rule_id(c);
    sb_printf(&c->g, "r%d ::= \"{\" ws (", r);
    bool any_req = false;
    for (size_t i = 0; i < np; i++) {
        sb_printf(&c->g, "%sr%d r%d", i ? " | " : "", kv0 + (int)i, tail0 + (int)i + 1);
        if (isreq[i]) {
            any_req = true;
            break;
        }
    }
    if (!any_req) {
        if (xr) sb_printf(&c->g, "%sr%d r%d", np ? " | " : "", xr, tail0 + (int)np);
        sb_add(&c->g, np || xr ? " | " : "", np || xr ? 3 : 0);
    }
    sb_add(&c->g, ") \"}\"\n", 6);
out:
    pkv_free(isreq);
    pkv_free(vr);
    return r;
}

/* The schema a local reference "#/$defs/x" (any JSON pointer in the document) points at;
 * NULL with c->err. p: the path of the '$ref' for messages. */
static const jval *resolve_ref(conv *c, const char *t, const char *p) {
    if (strcmp(t, "#") && strncmp(t, "#/", 2))
        return cfail(c, p, "only local references (#, #/$defs/..., #/definitions/...) are supported, got '%s'", t), NULL;
    /* a URI fragment: percent-decoded to the JSON pointer, which is split at '/'
     * and has ~1 and ~0 undone in each segment (RFC 6901, sections 4 and 6) */
    size_t tl = strlen(t), n = 0;
    char *ptr = pkv_malloc(tl + 1);
    if (!ptr) return cfail(c, p, "out of memory"), NULL;
    for (size_t i = 1; i < tl; i++) {
        char ch = t[i];
        if (ch == '%') {
            int hi = i + 2 < tl ? hexv(t[i + 1]) : -1, lo = hi >= 0 ? hexv(t[i + 2]) : -1;
            if (hi < 0 || lo < 0 || !(hi | lo)) {
                pkv_free(ptr);
                return cfail(c, p, "reference '%s' has a bad percent escape", t), NULL;
            }
            ch = (char)(hi * 16 + lo);
            i += 2;
        }
        ptr[n++] = ch;
    }
    ptr[n] = 0;
    const jval *at = c->root;
    const char *q = n ? ptr + 1 : ptr; /* after the leading '/' */
    while (*q && at) {
        const char *e = strchr(q, '/');
        size_t l = e ? (size_t)(e - q) : strlen(q), k = 0;
        char key[256];
        if (l >= sizeof key) {
            pkv_free(ptr);
            return cfail(c, p, "reference '%s' has a segment over 255 bytes", t), NULL;
        }
        for (size_t i = 0; i < l; i++) {
            if (q[i] != '~') {
                key[k++] = q[i];
            } else if (i + 1 < l && (q[i + 1] == '0' || q[i + 1] == '1')) {
                key[k++] = q[++i] == '0' ? '~' : '/';
            } else {
                pkv_free(ptr);
                return cfail(c, p, "reference '%s': '~' must be followed by 0 or 1", t), NULL;
            }
        }
        key[k] = 0;
        at = jget(at, key);
        q = e ? e + 1 : q + l;
    }
    pkv_free(ptr);
    if (!at) return cfail(c, p, "reference '%s' does not resolve", t), NULL;
    return at;
}

/* The rule of a local reference "#/$defs/x" or "#/definitions/x" (made on first use). */
static int gen_ref(conv *c, const jval *s, const char *path) {
    const jval *ref = jget(s, "$ref");
    char p[1024];
    path_join(p, sizeof p, path, "$ref");
    if (ref->k != JN_STR) return cfail(c, p, "'$ref' must be a string"), -1;
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->ref_name[i], ref->s)) return c->ref_rule[i];
    const char *t = ref->s;
    const jval *at = resolve_ref(c, t, p);
    if (!at) return -1;
    if (c->n_refs >= SCHEMA_MAX_REFS) return cfail(c, p, "more than %d references", SCHEMA_MAX_REFS), -1;
    char **rn = pkv_realloc(c->ref_name, ((size_t)c->n_refs + 1) * sizeof *rn);
    if (rn) c->ref_name = rn;
    int *rr = pkv_realloc(c->ref_rule, ((size_t)c->n_refs + 1) * sizeof *rr);
    if (rr) c->ref_rule = rr;
    char *name = pkv_strdup(t);
    if (!rn || !rr || !name) {
        pkv_free(name);
        return cfail(c, p, "out of memory"), -1;
    }
    /* the rule number is fixed before the body is made, so recursion refers to it */
    int r = rule_id(c);
    c->ref_name[c->n_refs] = name;
    c->ref_rule[c->n_refs++] = r;
    int body = gen(c, at, t + 1);
    if (body < 0) return -1;
    sb_printf(&c->g, "r%d ::= r%d\n", r, body);
    return r;
}

static int gen_type(conv *c, const jval *s, const char *type, const char *path) {
    int r;
    if (!strcmp(type, "object")) return gen_object(c, s, path);
    if (!strcmp(type, "array")) return gen_array(c, s, path);
    if (!strcmp(type, "string")) return gen_string(c, s, path);
    if (!strcmp(type, "integer")) return gen_integer(c, s, path);
    if (!strcmp(type, "number")) return gen_number(c, s, path);
    const char *prim = !strcmp(type, "number") ? "number" : !strcmp(type, "integer") ? "integer"
                     : !strcmp(type, "boolean") ? "boolean" : !strcmp(type, "null") ? "null" : NULL;
    if (!prim) {
        char p[1024];
        path_join(p, sizeof p, path, "type");
        return cfail(c, p, "unknown type '%s'", type), -1;
    }
    r = rule_id(c);
    sb_printf(&c->g, "r%d ::= %s\n", r, prim);
    return r;
}

/* A borrowed view: an object jval whose keys and items belong to other values. */
static bool view_push(jval *v, const char *key, const jval *x) {
    return jpush(v, (jval *)x, (char *)key);
}

static void view_free(jval *v) {
    pkv_free(v->items);
    pkv_free(v->keys);
}

/* allOf: one subschema is that subschema (with nothing else beside it); several are
 * merged when every one (after references) is an object schema: the union of the
 * properties and of the required names, closed if any member is closed (what a
 * merged object means; JSON Schema's own reading of several closed members would
 * admit only objects without properties). Anything else is refused. */
static int gen_allof(conv *c, const jval *s, const jval *list, const char *path) {
    char p[1024];
    path_join(p, sizeof p, path, "allOf");
    if (list->k != JN_ARR || !list->n) return cfail(c, p, "'allOf' must be a non-empty array"), -1;
    bool others = false;
    for (size_t i = 0; i < s->n; i++) others |= !in_list(annotations, s->keys[i]) && strcmp(s->keys[i], "allOf") &&
                                                strcmp(s->keys[i], "nullable");
    if (list->n == 1 && !others) {
        path_index(p, sizeof p, path, "allOf", 0);
        return gen(c, list->items[0], p);
    }
    static const char *const ok[] = {"type", "properties", "required", "additionalProperties", "allOf", "nullable", NULL};
    jval props = {.k = JN_OBJ}, req = {.k = JN_ARR}, merged = {.k = JN_OBJ};
    jval ty = {.k = JN_STR, .s = (char *)"object", .slen = 6}, closed = {.k = JN_BOOL, .b = false};
    bool any_closed = false, any_open = false, oom = false, saw_object = false;
    int r = -1;
    for (size_t m = 0; m <= list->n && !c->err[0]; m++) {
        const jval *x = m ? list->items[m - 1] : s; /* s itself: its own keywords beside allOf */
        char pm[1024];
        if (m) path_index(pm, sizeof pm, path, "allOf", m - 1);
        else snprintf(pm, sizeof pm, "%s", path);
        const jval *ref = x->k == JN_OBJ ? jget(x, "$ref") : NULL;
        if (m && ref) {
            char pr[1024];
            path_join(pr, sizeof pr, pm, "$ref");
            if (ref->k != JN_STR) {
                cfail(c, pr, "'$ref' must be a string");
                break;
            }
            if (!(x = resolve_ref(c, ref->s, pr))) break;
        }
        if (x->k != JN_OBJ) {
            cfail(c, pm, "'allOf' of several members is supported for object schemas only");
            break;
        }
        for (size_t i = 0; i < x->n && !c->err[0]; i++) {
            const char *k = x->keys[i];
            if (in_list(annotations, k) || (!m && !strcmp(k, "allOf"))) continue;
            char pk[1024];
            path_join(pk, sizeof pk, pm, k);
            if (!in_list(ok, k) || (m && (!strcmp(k, "allOf") || !strcmp(k, "nullable")))) {
                cfail(c, pk, "'%s' in an 'allOf' of object schemas is not supported (only type object, properties, "
                             "required, additionalProperties)", k);
            } else if (!strcmp(k, "type") && !(x->items[i]->k == JN_STR && !strcmp(x->items[i]->s, "object"))) {
                cfail(c, pk, "'allOf' of several members is supported for object schemas only");
            } else if (!strcmp(k, "type")) {
                saw_object = true;
            } else if (!strcmp(k, "properties") && x->items[i]->k == JN_OBJ) {
                const jval *pp = x->items[i];
                for (size_t j = 0; j < pp->n && !c->err[0]; j++) {
                    if (jget(&props, pp->keys[j]))
                        cfail(c, pk, "property '%s' in two 'allOf' members is not supported", pp->keys[j]);
                    else oom |= !view_push(&props, pp->keys[j], pp->items[j]);
                }
            } else if (!strcmp(k, "required") && x->items[i]->k == JN_ARR) {
                for (size_t j = 0; j < x->items[i]->n; j++) oom |= !view_push(&req, NULL, x->items[i]->items[j]);
            } else if (!strcmp(k, "additionalProperties")) {
                const jval *a = x->items[i];
                if (a->k == JN_BOOL) {
                    any_closed |= !a->b;
                    any_open |= a->b;
                } else {
                    cfail(c, pk, "'additionalProperties' as a schema inside 'allOf' is not supported");
                }
            } else if (strcmp(k, "type") && strcmp(k, "nullable")) {
                cfail(c, pk, "'%s' must be %s", k, !strcmp(k, "required") ? "an array" : "an object");
            }
        }
    }
    if (!c->err[0] && !props.n && !req.n && !any_closed && !any_open && !saw_object)
        cfail(c, p, "'allOf' of several members is supported for object schemas only");
    if (!c->err[0]) {
        if (oom) {
            cfail(c, path, "out of memory");
        } else {
            view_push(&merged, "type", &ty);
            view_push(&merged, "properties", &props);
            if (req.n) view_push(&merged, "required", &req);
            closed.b = any_open && !any_closed;
            if (any_closed || any_open) view_push(&merged, "additionalProperties", &closed);
            r = gen_object(c, &merged, path);
        }
    }
    view_free(&props);
    view_free(&req);
    view_free(&merged);
    return c->err[0] ? -1 : r;
}

/* Alternatives of a list of subschemas (anyOf, oneOf, type arrays handled by the caller). */
static int gen_union(conv *c, const jval *list, const char *path, const char *kw) {
    char p[1024];
    path_join(p, sizeof p, path, kw);
    if (list->k != JN_ARR || !list->n) return cfail(c, p, "'%s' must be a non-empty array", kw), -1;
    int *sub = pkv_calloc(list->n, sizeof *sub);
    if (!sub) return cfail(c, p, "out of memory"), -1;
    for (size_t i = 0; i < list->n; i++) {
        char pi[1024];
        path_index(pi, sizeof pi, path, kw, i);
        if ((sub[i] = gen(c, list->items[i], pi)) < 0) {
            pkv_free(sub);
            return -1;
        }
    }
    int r = rule_id(c);
    sb_printf(&c->g, "r%d ::= ", r);
    for (size_t i = 0; i < list->n; i++) sb_printf(&c->g, "%sr%d", i ? " | " : "", sub[i]);
    sb_add(&c->g, "\n", 1);
    pkv_free(sub);
    return r;
}

/* The rule number of schema s at path (JSON pointer), or -1 with c->err. */
static int gen_inner(conv *c, const jval *s, const char *path);
static int gen_nullable(conv *c, const jval *s, const char *path);
static int gen(conv *c, const jval *s, const char *path) {
    int r = gen_nullable(c, s, path);
    /* bounded while it is made, not only when parsed: a small schema can ask for a
     * lot of grammar (multipleOf rules, many references to large definitions) */
    if (r >= 0 && c->g.n > PKV_GRAMMAR_MAX_TEXT)
        return cfail(c, path, "the generated grammar is over the limit of %d bytes", PKV_GRAMMAR_MAX_TEXT), -1;
    return r;
}

static int gen_nullable(conv *c, const jval *s, const char *path) {
    const jval *nl = s->k == JN_OBJ ? jget(s, "nullable") : NULL;
    if (!nl || s == c->nullable_done) return gen_inner(c, s, path);
    char p[1024];
    path_join(p, sizeof p, path, "nullable");
    if (nl->k != JN_BOOL) return cfail(c, p, "'nullable' must be a boolean"), -1;
    if (!nl->b) return gen_inner(c, s, path);
    /* OpenAPI 3.0: the schema or null */
    const jval *prev = c->nullable_done;
    c->nullable_done = s;
    int a = gen_inner(c, s, path);
    c->nullable_done = prev;
    if (a < 0) return -1;
    int r = rule_id(c);
    sb_printf(&c->g, "r%d ::= r%d | null\n", r, a);
    return r;
}

static int gen_inner(conv *c, const jval *s, const char *path) {
    if (++c->depth > SCHEMA_MAX_DEPTH) return cfail(c, path, "schema nested deeper than %d", SCHEMA_MAX_DEPTH), -1;
    int r = -1;
    if (s->k == JN_BOOL) {
        if (!s->b) {
            cfail(c, path, "schema false accepts nothing");
            goto out;
        }
        r = rule_id(c);
        sb_printf(&c->g, "r%d ::= value\n", r);
        goto out;
    }
    if (s->k != JN_OBJ) {
        cfail(c, path, "a schema must be an object or a boolean");
        goto out;
    }
    for (size_t i = 0; i < s->n; i++) {
        const char *k = s->keys[i];
        if (in_list(annotations, k) || in_list(applied, k)) continue;
        char p[1024];
        path_join(p, sizeof p, path, k);
        cfail(c, p, "keyword '%s' is not supported (the output would not be constrained by it)", k);
        goto out;
    }
    const jval *v;
    if ((v = jget(s, "$ref"))) {
        if (s->n > 1)
            for (size_t i = 0; i < s->n; i++)
                if (!in_list(annotations, s->keys[i]) && strcmp(s->keys[i], "$ref") && strcmp(s->keys[i], "nullable")) {
                    char p[1024];
                    path_join(p, sizeof p, path, s->keys[i]);
                    cfail(c, p, "'%s' beside '$ref' is not supported", s->keys[i]);
                    goto out;
                }
        r = gen_ref(c, s, path);
        goto out;
    }
    if ((v = jget(s, "allOf"))) {
        r = gen_allof(c, s, v, path);
        goto out;
    }
    if ((v = jget(s, "const"))) {
        r = rule_id(c);
        sb_printf(&c->g, "r%d ::= ", r);
        lit_json(c, &c->g, v);
        sb_add(&c->g, "\n", 1);
        goto out;
    }
    if ((v = jget(s, "enum"))) {
        char p[1024];
        path_join(p, sizeof p, path, "enum");
        if (v->k != JN_ARR || !v->n) {
            cfail(c, p, "'enum' must be a non-empty array");
            goto out;
        }
        if (v->n > SCHEMA_MAX_ENUM) {
            cfail(c, p, "'enum' has %zu values, more than the limit of %d", v->n, SCHEMA_MAX_ENUM);
            goto out;
        }
        r = rule_id(c);
        sb_printf(&c->g, "r%d ::= ", r);
        for (size_t i = 0; i < v->n; i++) {
            if (i) sb_add(&c->g, " | ", 3);
            lit_json(c, &c->g, v->items[i]);
        }
        sb_add(&c->g, "\n", 1);
        goto out;
    }
    if ((v = jget(s, "anyOf")) || (v = jget(s, "oneOf"))) {
        r = gen_union(c, v, path, jget(s, "anyOf") ? "anyOf" : "oneOf");
        goto out;
    }
    const jval *t = jget(s, "type");
    if (!t) { /* inferred from the keywords present, else any value */
        const char *ty = jget(s, "properties") || jget(s, "additionalProperties") || jget(s, "required") ||
                                 jget(s, "patternProperties") || jget(s, "propertyNames")
                             ? "object"
                         : jget(s, "items") || jget(s, "minItems") || jget(s, "maxItems") || jget(s, "prefixItems") ? "array"
                         : jget(s, "minLength") || jget(s, "maxLength") || jget(s, "format") || jget(s, "pattern") ? "string"
                         : jget(s, "minimum") || jget(s, "maximum") || jget(s, "exclusiveMinimum") ||
                                 jget(s, "exclusiveMaximum") || jget(s, "multipleOf")
                             ? "number"
                             : NULL;
        if (ty) r = gen_type(c, s, ty, path);
        else {
            r = rule_id(c);
            sb_printf(&c->g, "r%d ::= value\n", r);
        }
        goto out;
    }
    if (t->k == JN_STR) {
        r = gen_type(c, s, t->s, path);
        goto out;
    }
    char p[1024];
    path_join(p, sizeof p, path, "type");
    if (t->k != JN_ARR || !t->n) {
        cfail(c, p, "'type' must be a string or a non-empty array of strings");
        goto out;
    }
    int sub[8];
    if (t->n > 8) {
        cfail(c, p, "more than 8 types");
        goto out;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (t->items[i]->k != JN_STR) {
            path_index(p, sizeof p, path, "type", i);
            cfail(c, p, "types must be strings");
            goto out;
        }
        if ((sub[i] = gen_type(c, s, t->items[i]->s, path)) < 0) goto out;
    }
    r = rule_id(c);
    sb_printf(&c->g, "r%d ::= ", r);
    for (size_t i = 0; i < t->n; i++) sb_printf(&c->g, "%sr%d", i ? " | " : "", sub[i]);
    sb_add(&c->g, "\n", 1);
out:
    c->depth--;
    return c->err[0] ? -1 : r;
}

/* The fixed rules. ws: at most one space, or a newline and up to 16 blanks of
 * indentation, between JSON tokens, so bounded schemas give bounded output. Numbers:
 * at most 16 integer digits, 16 fraction digits and a 3-digit exponent. A uri is
 * the part of RFC 3986 that WHATWG URL parsers (zod's .url(), `new URL`) also take:
 * a port of at most 65535, none on a file: URL, and a host that is an IPv4 address
 * or whose last label starts with a letter (for http, ws, ftp and file a last label
 * that reads as a number makes the parser take the host as an IPv4 address, and
 * 999.1 or a.123 then fail). */
static const char json_prelude[] =
    "ws ::= (\" \" | \"\\n\" [ \\t]{0,16})?\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws (string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)*)? \"}\"\n"
    "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "date ::= leapyear \"-02-29\" | [0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) "
    "| (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))\n"
    "leapyear ::= [0-9]{2} (\"0\" [48] | [2468] [048] | [13579] [26]) | ([02468] [048] | [13579] [26]) \"00\"\n"
    "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,9})? "
    "(\"Z\" | [-+] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "hex ::= [0-9a-fA-F]\n"
    "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n"
    "datetime ::= date \"T\" time\n"
    "ipv4 ::= dec8 (\".\" dec8){3}\n"
    "dec8 ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]\n"
    "ipv6 ::= hex{1,4} (\":\" hex{1,4}){7}\n"
    "hostname ::= hlabel (\".\" hlabel){0,2}\n"
    "hlabel ::= [a-zA-Z0-9] ([a-zA-Z0-9\\x2d]{0,61} [a-zA-Z0-9])?\n"
    "email ::= elocal (\".\" elocal){0,2} \"@\" (hlabel \".\"){1,2} [a-zA-Z]{2,12}\n"
    "elocal ::= [a-zA-Z0-9_+\\x2d]{1,32}\n"
    "uri ::= (uscheme \"://\" uhost (\":\" port)? | \"file://\" uhost) (\"/\" upchar{0,64}){0,8}\n"
    "uscheme ::= [a-eg-z] usc{0,15} | \"f\" ([a-hj-z0-9+.\\x2d] usc{0,14} | \"i\" ([a-km-z0-9+.\\x2d] usc{0,13} "
    "| \"l\" ([a-df-z0-9+.\\x2d] usc{0,12} | \"e\" usc{1,12})?)?)?\n"
    "usc ::= [a-z0-9+.\\x2d]\n"
    "uhost ::= ipv4 | (hlabel \".\"){0,2} [a-zA-Z] ([a-zA-Z0-9\\x2d]{0,61} [a-zA-Z0-9])?\n"
    "port ::= [0-9]{1,4} | [1-5] [0-9]{4} | \"6\" [0-4] [0-9]{3} | \"65\" [0-4] [0-9]{2} | \"655\" [0-2] [0-9] "
    "| \"6553\" [0-5]\n"
    "upchar ::= [a-zA-Z0-9._~!$&'()*+,;=:@\\x2d] | \"%\" hex hex\n";

pkv_grammar *pkv_grammar_from_json_schema(const char *text, size_t len) {
    if (!text) {
        pkv_err(PKV_ERR_INVALID, "json schema: NULL");
        return NULL;
    }
    if (len > PKV_GRAMMAR_MAX_TEXT) {
        pkv_err(PKV_ERR_INVALID, "json schema: %zu bytes, more than the limit of %d", len, PKV_GRAMMAR_MAX_TEXT);
        return NULL;
    }
    jparse jp = {.s = text, .end = text + len, .base = text};
    jval *root = jvalue(&jp);
    if (root) {
        jws(&jp);
        if (jp.s != jp.end) {
            jfail(&jp, "text after the schema");
            jfree(root);
            root = NULL;
        }
    }
    if (!root) {
        pkv_err(PKV_ERR_INVALID, "json schema: %s", jp.err);
        return NULL;
    }
    conv c;
    memset(&c, 0, sizeof c);
    c.root = root;
    int r = gen(&c, root, "");
    pkv_grammar *g = NULL;
    if (r >= 0) {
        sbuf all = {0};
        sb_printf(&all, "root ::= r%d\n", r);
        sb_add(&all, json_prelude, sizeof json_prelude - 1);
        if (c.g.p) sb_add(&all, c.g.p, c.g.n);
        if (all.oom || c.g.oom) pkv_err(PKV_ERR_NOMEM, "json schema: out of memory");
        else g = pkv_grammar_parse(all.p, all.n, "json schema (the generated grammar)");
        pkv_free(all.p);
    } else {
        pkv_err(PKV_ERR_INVALID, "json schema: %s", c.err);
    }
    pkv_free(c.g.p);
    for (int i = 0; i < c.n_refs; i++) pkv_free(c.ref_name[i]);
    pkv_free(c.ref_name);
    pkv_free(c.ref_rule);
    jfree(root);
    return g;
}
