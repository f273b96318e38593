/* JSON schema to GBNF (docs/engine.md, "Constrained output"). The schema comes as
 * text and is parsed here (a small DOM, order of object keys kept): the engine
 * library does not link jansson, and the server passes the request's schema
 * through as it got it (json_dumps of the response_format's "schema").
 *
 * The generated grammar has fixed primitive rules (ws, string, number, ...) and
 * one rule per schema node. Every keyword is either applied, or known to be an
 * annotation (title, description, ...), or refused with its JSON pointer: a
 * schema is never silently less constrained than it says. */
#include <math.h>
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
    memcpy(b->p + b->n, s, n);
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
} conv;

/* SCHEMA_MAX_ENUM: each value is an alternative the matcher keeps a parse stack for
 * at the start, well below PKV_GRAMMAR_MAX_STACKS */
enum { SCHEMA_MAX_DEPTH = 64, SCHEMA_MAX_COUNT = 100000, SCHEMA_MAX_REFS = 4096, SCHEMA_MAX_ENUM = 4096 };

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
                                      "maxLength", "format", NULL};

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

static int gen_string(conv *c, const jval *s, const char *path) {
    long mn, mx;
    if (!count_kw(c, s, "minLength", path, &mn, 0) || !count_kw(c, s, "maxLength", path, &mx, -1)) return -1;
    const jval *f = jget(s, "format");
    int r = rule_id(c);
    if (f) {
        char p[1024];
        path_join(p, sizeof p, path, "format");
        if (f->k != JN_STR) return cfail(c, p, "'format' must be a string"), -1;
        const char *body = !strcmp(f->s, "date")        ? "\"\\\"\" date \"\\\"\""
                           : !strcmp(f->s, "time")      ? "\"\\\"\" time \"\\\"\""
                           : !strcmp(f->s, "date-time") ? "\"\\\"\" date \"T\" time \"\\\"\""
                           : !strcmp(f->s, "uuid")      ? "\"\\\"\" uuid \"\\\"\""
                                                        : NULL;
        if (!body)
            return cfail(c, p, "format '%s' is not supported (supported: date, time, date-time, uuid)", f->s), -1;
        if (jget(s, "minLength") || jget(s, "maxLength"))
            return cfail(c, path, "'format' with minLength/maxLength is not supported"), -1;
        sb_printf(&c->g, "r%d ::= %s\n", r, body);
        return r;
    }
    if (mx >= 0 && mx < mn) return cfail(c, path, "maxLength %ld is below minLength %ld", mx, mn), -1;
    if (mn == 0 && mx < 0) sb_printf(&c->g, "r%d ::= string\n", r);
    else if (mx < 0) sb_printf(&c->g, "r%d ::= \"\\\"\" char{%ld,} \"\\\"\"\n", r, mn);
    else sb_printf(&c->g, "r%d ::= \"\\\"\" char{%ld,%ld} \"\\\"\"\n", r, mn, mx);
    return r;
}

static int gen_array(conv *c, const jval *s, const char *path) {
    long mn, mx;
    if (!count_kw(c, s, "minItems", path, &mn, 0) || !count_kw(c, s, "maxItems", path, &mx, -1)) return -1;
    if (mx >= 0 && mx < mn) return cfail(c, path, "maxItems %ld is below minItems %ld", mx, mn), -1;
    const jval *it = jget(s, "items");
    char item[32] = "value";
    if (it) {
        char p[1024];
        path_join(p, sizeof p, path, "items");
        if (it->k == JN_ARR) return cfail(c, p, "'items' as an array (tuples) is not supported"), -1;
        int ir = gen(c, it, p);
        if (ir < 0) return -1;
        snprintf(item, sizeof item, "r%d", ir);
    }
    int r = rule_id(c);
    char x[64];
    snprintf(x, sizeof x, "%s ws", item);
    sb_printf(&c->g, "r%d ::= \"[\" ws ", r);
    repeat_sep(&c->g, x, "\",\" ws", mn, mx);
    sb_add(&c->g, " \"]\"\n", 5);
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
    } else if (!props) {
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
    int xr = 0;
    if (extra) {
        xr = rule_id(c);
        if (extra < 0) sb_printf(&c->g, "r%d ::= string ws \":\" ws value ws\n", xr);
        else sb_printf(&c->g, "r%d ::= string ws \":\" ws r%d ws\n", xr, extra);
    }
    /* tail_i: properties i.. after something was written, each behind a comma */
    int tail0 = c->n_rules + 1;
    for (size_t i = 0; i <= np; i++) (void)rule_id(c);
    for (size_t i = 0; i <= np; i++) {
        sb_printf(&c->g, "r%d ::= ", tail0 + (int)i);
        if (i == np) {
            if (extra) sb_printf(&c->g, "(\",\" ws r%d)*", xr);
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
        if (extra) sb_printf(&c->g, "%sr%d r%d", np ? " | " : "", xr, tail0 + (int)np);
        sb_add(&c->g, np || extra ? " | " : "", np || extra ? 3 : 0);
    }
    sb_add(&c->g, ") \"}\"\n", 6);
out:
    pkv_free(isreq);
    pkv_free(vr);
    return r;
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
    if (strcmp(t, "#") && strncmp(t, "#/", 2))
        return cfail(c, p, "only local references (#, #/$defs/..., #/definitions/...) are supported, got '%s'", t), -1;
    /* a URI fragment: percent-decoded to the JSON pointer, which is split at '/'
     * and has ~1 and ~0 undone in each segment (RFC 6901, sections 4 and 6) */
    size_t tl = strlen(t), n = 0;
    char *ptr = pkv_malloc(tl + 1);
    if (!ptr) return cfail(c, p, "out of memory"), -1;
    for (size_t i = 1; i < tl; i++) {
        char ch = t[i];
        if (ch == '%') {
            int hi = i + 2 < tl ? hexv(t[i + 1]) : -1, lo = hi >= 0 ? hexv(t[i + 2]) : -1;
            if (hi < 0 || lo < 0 || !(hi | lo)) {
                pkv_free(ptr);
                return cfail(c, p, "reference '%s' has a bad percent escape", t), -1;
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
            return cfail(c, p, "reference '%s' has a segment over 255 bytes", t), -1;
        }
        for (size_t i = 0; i < l; i++) {
            if (q[i] != '~') {
                key[k++] = q[i];
            } else if (i + 1 < l && (q[i + 1] == '0' || q[i + 1] == '1')) {
                key[k++] = q[++i] == '0' ? '~' : '/';
            } else {
                pkv_free(ptr);
                return cfail(c, p, "reference '%s': '~' must be followed by 0 or 1", t), -1;
            }
        }
        key[k] = 0;
        at = jget(at, key);
        q = e ? e + 1 : q + l;
    }
    pkv_free(ptr);
    if (!at) return cfail(c, p, "reference '%s' does not resolve", t), -1;
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
static int gen(conv *c, const jval *s, const char *path) {
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
                if (!in_list(annotations, s->keys[i]) && strcmp(s->keys[i], "$ref")) {
                    char p[1024];
                    path_join(p, sizeof p, path, s->keys[i]);
                    cfail(c, p, "'%s' beside '$ref' is not supported", s->keys[i]);
                    goto out;
                }
        r = gen_ref(c, s, path);
        goto out;
    }
    if ((v = jget(s, "allOf"))) {
        char p[1024];
        path_join(p, sizeof p, path, "allOf");
        if (v->k != JN_ARR || v->n != 1) {
            cfail(c, p, "'allOf' is supported with exactly one subschema");
            goto out;
        }
        path_index(p, sizeof p, path, "allOf", 0);
        r = gen(c, v->items[0], p);
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
        const char *ty = jget(s, "properties") || jget(s, "additionalProperties") || jget(s, "required") ? "object"
                         : jget(s, "items") || jget(s, "minItems") || jget(s, "maxItems")         ? "array"
                         : jget(s, "minLength") || jget(s, "maxLength") || jget(s, "format")      ? "string"
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
 * at most 16 integer digits, 16 fraction digits and a 3-digit exponent. */
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
    "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])\n"
    "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,9})? "
    "(\"Z\" | [-+] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "hex ::= [0-9a-fA-F]\n"
    "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n";

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
