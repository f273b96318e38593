/* The Jinja interpreter's builtins: methods of strings, lists and dicts, filters
 * and tests, each one small function found by name in a table (binary search). */
#include "chat/jinja-impl.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

jv *pkv_jj_arg(args *a, int i, const char *name) {
    if (name)
        for (int k = 0; k < a->nk; k++)
            if (!strcmp(a->kn[k], name)) return &a->kw[k];
    return i >= 0 && i < a->np ? &a->pos[i] : NULL;
}

static const jstr *arg_str(ev *x, const node *at, args *a, int i, const char *name, const char *fn) {
    jv *v = pkv_jj_arg(a, i, name);
    if (!v) pkv_jj_fail(x, at, "%s: argument %d ('%s') is missing", fn, i + 1, name ? name : "?");
    if (v->t != V_STR) pkv_jj_fail(x, at, "%s: argument '%s' must be a string, not %s", fn, name ? name : "?", tname(v));
    return v->u.s;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static jv do_strip(ev *x, const jstr *s, const jstr *chars, bool left, bool right) {
    size_t a = 0, b = s->n;
    if (left)
        while (a < b && (chars ? memchr(chars->s, s->s[a], chars->n) != NULL : is_ws(s->s[a]))) a++;
    if (right)
        while (b > a && (chars ? memchr(chars->s, s->s[b - 1], chars->n) != NULL : is_ws(s->s[b - 1]))) b--;
    return vstr(pkv_jj_substr(x, s, a, b));
}

/* The first n in h; each byte scanned and each candidate's comparison is work,
 * so a long needle against a long haystack stops at the work limit. */
const char *pkv_jj_memmem(ev *x, const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    size_t i = 0, last = hn - nn;
    while (i <= last) {
        const char *c = memchr(h + i, n[0], last - i + 1);
        size_t j = c ? (size_t)(c - h) : last + 1;
        pkv_jj_work(x, j - i + 1);
        if (!c) return NULL;
        pkv_jj_work(x, nn);
        if (!memcmp(c, n, nn)) return c;
        i = j + 1;
    }
    return NULL;
}

static jv do_split(ev *x, const jstr *s, const jstr *sep, int64_t maxsplit) {
    jlist *l = pkv_jj_mklist(x, 0);
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
            pkv_jj_lpush(x, l, vstr(pkv_jj_substr(x, s, i, j)));
            i = j;
        }
        return vlist(l);
    }
    if (!sep->n) pkv_jj_fail(x, NULL, "split: empty separator");
    size_t i = 0;
    for (;;) {
        const char *f = (maxsplit < 0 || (int64_t)l->n < maxsplit) ? pkv_jj_memmem(x, s->s + i, s->n - i, sep->s, sep->n) : NULL;
        if (!f) {
            pkv_jj_lpush(x, l, vstr(pkv_jj_substr(x, s, i, s->n)));
            break;
        }
        size_t at = (size_t)(f - s->s);
        pkv_jj_lpush(x, l, vstr(pkv_jj_substr(x, s, i, at)));
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
                pkv_jj_sk_jstr(x, &o, to);
                done++;
            }
            if (i < s->n) pkv_jj_sk_jstr(x, &o, pkv_jj_substr(x, s, i, i + 1));
        }
        return vstr(pkv_jj_sk_str(x, &o));
    }
    while (i < s->n) {
        const char *f = (count < 0 || done < count) ? pkv_jj_memmem(x, s->s + i, s->n - i, from->s, from->n) : NULL;
        if (!f) break;
        size_t at = (size_t)(f - s->s);
        pkv_jj_sk_jstr(x, &o, pkv_jj_substr(x, s, i, at));
        pkv_jj_sk_jstr(x, &o, to);
        i = at + from->n;
        done++;
        pkv_jj_step(x);
    }
    pkv_jj_sk_jstr(x, &o, pkv_jj_substr(x, s, i, s->n));
    return vstr(pkv_jj_sk_str(x, &o));
}

static jv do_case(ev *x, const jstr *s, int mode) { /* 0 upper, 1 lower, 2 title, 3 capitalize */
    char *p = pkv_jj_alloc(x, s->n + 1);
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
    jstr *r = pkv_jj_alloc(x, sizeof *r);
    *r = *s; /* same length: the spans carry over */
    r->s = p;
    r->flags = 0;
    return vstr(r);
}

jv pkv_jj_iter_list(ev *x, const node *at, const jv *v, const char *fn) {
    if (v->t == V_LIST) return *v;
    jlist *l = pkv_jj_mklist(x, 0);
    if (v->t == V_DICT) {
        for (size_t i = 0; i < v->u.d->n; i++) pkv_jj_lpush(x, l, v->u.d->k[i]);
    } else if (v->t == V_STR) {
        for (size_t i = 0; i < v->u.s->n;) { /* by UTF-8 character */
            size_t k = 1;
            unsigned char c = (unsigned char)v->u.s->s[i];
            if (c >= 0xF0) k = 4;
            else if (c >= 0xE0) k = 3;
            else if (c >= 0xC0) k = 2;
            if (i + k > v->u.s->n) k = v->u.s->n - i;
            pkv_jj_lpush(x, l, vstr(pkv_jj_substr(x, v->u.s, i, i + k)));
            i += k;
        }
    } else if (v->t != V_UNDEF && v->t != V_NONE) {
        pkv_jj_fail(x, at, "%s: %s is not iterable", fn, tname(v));
    } else if (v->t == V_NONE) {
        pkv_jj_fail(x, at, "%s: none is not iterable", fn);
    }
    return vlist(l);
}

/* "a.b.c" attribute paths of map/selectattr/sort/join */
static jv attr_path(ev *x, const node *at, const jv *v, const jstr *path) {
    jv cur = *v;
    size_t i = 0;
    while (i <= path->n) {
        const char *d = memchr(path->s + i, '.', path->n - i);
        size_t e = d ? (size_t)(d - path->s) : path->n;
        jstr *part = pkv_jj_substr(x, path, i, e);
        jv k = vstr(part);
        char *endp;
        char tmp[32];
        if (part->n && part->n < sizeof tmp) {
            memcpy(tmp, part->s, part->n);
            tmp[part->n] = 0;
            long long iv = strtoll(tmp, &endp, 10);
            if (*endp == 0 && cur.t == V_LIST) k = vint(iv);
        }
        cur = pkv_jj_getattr(x, at, &cur, &k);
        i = e + 1;
    }
    return cur;
}

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
    return pkv_jj_cmp(x, at, a, b);
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
            pkv_jj_step(x);
        }
        items[j] = it;
        keys[j] = k;
    }
}

jv pkv_jj_fmt_percent(ev *x, const node *at, const jstr *f, args *a) {
    sink o = {0};
    int ai = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (f->s[i] != '%' || i + 1 >= f->n) {
            pkv_jj_sk_put(x, &o, f->s + i, 1);
            continue;
        }
        char c = f->s[++i];
        if (c == '%') {
            pkv_jj_sk_put(x, &o, "%", 1);
            continue;
        }
        jv *v = pkv_jj_arg(a, ai++, NULL);
        if (!v) pkv_jj_fail(x, at, "format: not enough arguments for the format string");
        if (c == 'd' || c == 'i') {
            char b[32];
            snprintf(b, sizeof b, "%lld", (long long)numi(v));
            pkv_jj_sk_cstr(x, &o, b);
        } else {
            pkv_jj_sk_jstr(x, &o, pkv_jj_to_str(x, v));
        }
    }
    return vstr(pkv_jj_sk_str(x, &o));
}

static jv fmt_braces(ev *x, const node *at, const jstr *f, args *a) {
    sink o = {0};
    int ai = 0;
    for (size_t i = 0; i < f->n; i++) {
        char c = f->s[i];
        if (c == '{' && i + 1 < f->n && f->s[i + 1] == '{') {
            pkv_jj_sk_put(x, &o, "{", 1);
            i++;
            continue;
        }
        if (c == '}' && i + 1 < f->n && f->s[i + 1] == '}') {
            pkv_jj_sk_put(x, &o, "}", 1);
            i++;
            continue;
        }
        if (c != '{') {
            pkv_jj_sk_put(x, &o, &c, 1);
            continue;
        }
        const char *e = memchr(f->s + i, '}', f->n - i);
        if (!e) pkv_jj_fail(x, at, "format: '}' missing in the format string");
        size_t len = (size_t)(e - (f->s + i + 1));
        char key[64];
        if (len >= sizeof key) pkv_jj_fail(x, at, "format: field name too long");
        memcpy(key, f->s + i + 1, len);
        key[len] = 0;
        char *colon = strchr(key, ':');
        if (colon) *colon = 0;
        jv *v;
        if (!key[0]) v = pkv_jj_arg(a, ai++, NULL);
        else if (isdigit((unsigned char)key[0])) v = pkv_jj_arg(a, atoi(key), NULL);
        else v = pkv_jj_arg(a, -1, key);
        if (!v) pkv_jj_fail(x, at, "format: no argument for '{%s}'", key);
        pkv_jj_sk_jstr(x, &o, pkv_jj_to_str(x, v));
        i += len + 1;
    }
    return vstr(pkv_jj_sk_str(x, &o));
}

/* ---- methods and filters: one function each, found by name in the tables below
 * (sorted by name in strcmp order for binary search; aliases share a function and
 * tell themselves apart by name). */

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
    default: pkv_jj_fail(x, at, "length: %s has no length", tname(s));
    }
}

static jv filter_default(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
    jv *b = pkv_jj_arg(a, 1, "boolean");
    bool use = s->t == V_UNDEF || (b && truthy(b) && !truthy(s));
    return use ? (p0 ? *p0 : pkv_jj_vcstr(x, "")) : *s;
}

static jv filter_first_last(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    jv l = pkv_jj_iter_list(x, at, s, name);
    if (!l.u.l->n) return UNDEF;
    return name[0] == 'f' ? l.u.l->a[0] : l.u.l->a[l.u.l->n - 1];
}

static jv filter_join(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = pkv_jj_iter_list(x, at, s, name);
    jv *sep = pkv_jj_arg(a, 0, "d");
    jv *attr = pkv_jj_arg(a, 1, "attribute");
    sink o = {0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i && sep) pkv_jj_sk_jstr(x, &o, pkv_jj_to_str(x, sep));
        jv e = l.u.l->a[i];
        if (attr && attr->t == V_STR) e = attr_path(x, at, &e, attr->u.s);
        pkv_jj_sk_jstr(x, &o, pkv_jj_to_str(x, &e));
    }
    return vstr(pkv_jj_sk_str(x, &o));
}

static jv filter_string(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name; (void)a;
    return vstr(pkv_jj_to_str(x, s));
}

static jv filter_safe_escape(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)a;
    if (name[0] == 's') return s->t == V_STR ? *s : vstr(pkv_jj_to_str(x, s));
    const jstr *t = pkv_jj_to_str(x, s);
    sink o = {0};
    for (size_t i = 0; i < t->n; i++) {
        switch (t->s[i]) {
        case '&': pkv_jj_sk_cstr(x, &o, "&amp;"); break;
        case '<': pkv_jj_sk_cstr(x, &o, "&lt;"); break;
        case '>': pkv_jj_sk_cstr(x, &o, "&gt;"); break;
        case '"': pkv_jj_sk_cstr(x, &o, "&#34;"); break;
        case '\'': pkv_jj_sk_cstr(x, &o, "&#39;"); break;
        default: pkv_jj_sk_put(x, &o, t->s + i, 1);
        }
    }
    return vstr(pkv_jj_derived(x, o.p ? o.p : "", o.n, t->nsp != 0));
}

static jv filter_int(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)x; (void)at; (void)name;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
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
    jv *p0 = pkv_jj_arg(a, 0, NULL);
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
    if (s->t == V_INT) return vint(s->u.i < 0 ? pkv_jj_ck_sub(x, at, 0, s->u.i, "abs") : s->u.i);
    if (s->t == V_FLOAT) return vfloat(fabs(s->u.f));
    pkv_jj_fail(x, at, "abs: %s is not a number", tname(s));
}

static jv filter_round(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)x; (void)at; (void)name;
    jv *pr = pkv_jj_arg(a, 0, "precision");
    jv *m = pkv_jj_arg(a, 1, "method");
    double f = numf(s), k = pow(10, pr ? (double)numi(pr) : 0);
    const char *meth = m && m->t == V_STR ? m->u.s->s : "common";
    double r = !strncmp(meth, "ceil", 4) ? ceil(f * k) / k : !strncmp(meth, "floor", 5) ? floor(f * k) / k : round(f * k) / k;
    return vfloat(r);
}

static jv filter_list(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    jv l = pkv_jj_iter_list(x, at, s, name);
    jlist *c = pkv_jj_mklist(x, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++) pkv_jj_lpush(x, c, l.u.l->a[i]);
    return vlist(c);
}

static jv filter_items(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)name; (void)a;
    if (s->t == V_UNDEF) return vlist(pkv_jj_mklist(x, 0));
    pkv_jj_fail(x, at, "items: %s is not a mapping", tname(s));
}

static jv filter_tojson(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name;
    pkv_jj_mark_deep(s, 0);
    jv *ind = pkv_jj_arg(a, 0, "indent");
    jv *seps = pkv_jj_arg(a, -1, "separators");
    int indent = ind && ind->t == V_INT ? (int)(ind->u.i > 64 ? 64 : ind->u.i) : -1;
    const char *isep = indent < 0 ? ", " : ",", *ksep = ": ";
    if (seps && seps->t == V_LIST && seps->u.l->n == 2 && seps->u.l->a[0].t == V_STR && seps->u.l->a[1].t == V_STR) {
        isep = pkv_jj_alloc(x, seps->u.l->a[0].u.s->n + 1);
        memcpy((char *)isep, seps->u.l->a[0].u.s->s, seps->u.l->a[0].u.s->n);
        ksep = pkv_jj_alloc(x, seps->u.l->a[1].u.s->n + 1);
        memcpy((char *)ksep, seps->u.l->a[1].u.s->s, seps->u.l->a[1].u.s->n);
    }
    jv *asc = pkv_jj_arg(a, -1, "ensure_ascii");
    sink o = {0};
    pkv_jj_put_json(x, &o, s, 0, indent, isep, ksep);
    if (asc && truthy(asc)) { /* \uXXXX for every non-ASCII character (surrogate pairs above U+FFFF) */
        sink q = {0};
        const unsigned char *u = (const unsigned char *)(o.p ? o.p : "");
        for (size_t i = 0; i < o.n;) {
            unsigned c = u[i];
            if (c < 0x80) {
                pkv_jj_sk_put(x, &q, (const char *)u + i, 1);
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
            pkv_jj_sk_cstr(x, &q, b);
            i += (size_t)k;
        }
        return vstr(pkv_jj_derived(x, q.p ? q.p : "", q.n, o.nsp != 0));
    }
    return vstr(pkv_jj_sk_str(x, &o));
}

static jv filter_reverse(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    if (s->t == V_STR) {
        char *p = pkv_jj_alloc(x, s->u.s->n + 1);
        for (size_t i = 0; i < s->u.s->n; i++) p[i] = s->u.s->s[s->u.s->n - 1 - i];
        return vstr(pkv_jj_derived(x, p, s->u.s->n, s->u.s->nsp != 0));
    }
    jv l = pkv_jj_iter_list(x, at, s, name);
    jlist *c = pkv_jj_mklist(x, l.u.l->n);
    for (size_t i = l.u.l->n; i-- > 0;) pkv_jj_lpush(x, c, l.u.l->a[i]);
    return vlist(c);
}

static jv filter_sort(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = pkv_jj_iter_list(x, at, s, name);
    jv *rev = pkv_jj_arg(a, 0, "reverse");
    jv *cs = pkv_jj_arg(a, 1, "case_sensitive");
    jv *attr = pkv_jj_arg(a, 2, "attribute");
    size_t n = l.u.l->n;
    jv *items = pkv_jj_alloc(x, (n + 1) * sizeof *items), *keys = pkv_jj_alloc(x, (n + 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        items[i] = l.u.l->a[i];
        keys[i] = attr && attr->t == V_STR ? attr_path(x, at, &items[i], attr->u.s) : items[i];
    }
    sort_list(x, at, items, keys, n, rev && truthy(rev), !(cs && truthy(cs)));
    jlist *c = pkv_jj_mklist(x, n);
    for (size_t i = 0; i < n; i++) pkv_jj_lpush(x, c, items[i]);
    return vlist(c);
}

static jv filter_unique(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)a;
    jv l = pkv_jj_iter_list(x, at, s, name);
    jlist *c = pkv_jj_mklist(x, 0);
    for (size_t i = 0; i < l.u.l->n; i++) {
        bool dup = false;
        for (size_t j = 0; j < c->n && !dup; j++) dup = pkv_jj_eq(x, &c->a[j], &l.u.l->a[i], 0);
        if (!dup) pkv_jj_lpush(x, c, l.u.l->a[i]);
        pkv_jj_step(x);
    }
    return vlist(c);
}

static jv filter_min_max_sum(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = pkv_jj_iter_list(x, at, s, name);
    jv *attr = pkv_jj_arg(a, name[1] == 'u' ? 0 : 2, "attribute");
    jv best = name[1] == 'u' ? (pkv_jj_arg(a, 1, "start") ? *pkv_jj_arg(a, 1, "start") : vint(0)) : UNDEF;
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv e = l.u.l->a[i];
        if (attr && attr->t == V_STR) e = attr_path(x, at, &e, attr->u.s);
        if (name[1] == 'u') {
            if (!isnum(&e) || !isnum(&best)) pkv_jj_fail(x, at, "sum: %s is not a number", tname(&e));
            best = best.t == V_INT && e.t == V_INT ? vint(pkv_jj_ck_add(x, at, best.u.i, e.u.i, "sum")) : vfloat(numf(&best) + numf(&e));
        } else if (best.t == V_UNDEF || (pkv_jj_cmp(x, at, &e, &best) < 0) == (name[1] == 'i')) {
            if (best.t == V_UNDEF || pkv_jj_cmp(x, at, &e, &best) != 0) best = e;
        }
    }
    return best;
}

static jv filter_map(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv *p0 = pkv_jj_arg(a, 0, NULL);
    jv l = pkv_jj_iter_list(x, at, s, name);
    jv *attr = pkv_jj_arg(a, -1, "attribute");
    jv *def = pkv_jj_arg(a, -1, "default");
    jlist *c = pkv_jj_mklist(x, l.u.l->n);
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
            e = pkv_jj_call_builtin(x, at, fn, e, &sub, true, &f);
        } else {
            pkv_jj_fail(x, at, "map: a filter name or attribute= is needed");
        }
        pkv_jj_lpush(x, c, e);
    }
    return vlist(c);
}

static jv filter_select(ev *x, const node *at, const char *name, const jv *s, args *a) {
    jv l = pkv_jj_iter_list(x, at, s, name);
    bool byattr = !strcmp(name + 6, "attr"), keep_true = name[0] == 's';
    int ti = byattr ? 1 : 0;
    jv *attr = byattr ? pkv_jj_arg(a, 0, NULL) : NULL;
    if (byattr && (!attr || attr->t != V_STR)) pkv_jj_fail(x, at, "%s: an attribute name is needed", name);
    jv *tn = pkv_jj_arg(a, ti, NULL);
    if (tn && tn->t != V_STR) pkv_jj_fail(x, at, "%s: the test name must be a string", name);
    char test[64] = "";
    if (tn) snprintf(test, sizeof test, "%.*s", (int)tn->u.s->n, tn->u.s->s);
    args sub = {a->pos + ti + 1, a->np > ti + 1 ? a->np - ti - 1 : 0, NULL, NULL, 0};
    jlist *c = pkv_jj_mklist(x, 0);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv e = l.u.l->a[i], k = e;
        if (byattr) k = attr_path(x, at, &e, attr->u.s);
        bool ok;
        if (tn) {
            bool f;
            jv r = pkv_jj_call_test(x, at, test, &k, &sub, &f);
            if (!f) pkv_jj_fail(x, at, "%s: no test named '%s'", name, test);
            ok = truthy(&r);
        } else {
            ok = truthy(&k);
        }
        if (ok == keep_true) pkv_jj_lpush(x, c, e);
        pkv_jj_step(x);
    }
    return vlist(c);
}

static jv filter_indent(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name;
    const jstr *t = pkv_jj_to_str(x, s);
    jv *w = pkv_jj_arg(a, 0, "width");
    jv *first = pkv_jj_arg(a, 1, "first");
    jv *blank = pkv_jj_arg(a, 2, "blank");
    const jstr *pad;
    if (w && w->t == V_STR) {
        pad = w->u.s;
    } else {
        int64_t k = w ? numi(w) : 4;
        if (k < 0) k = 0;
        if (k > 256) k = 256;
        char *p = pkv_jj_alloc(x, (size_t)k + 1);
        memset(p, ' ', (size_t)k);
        pad = pkv_jj_derived(x, p, (size_t)k, false);
    }
    sink o = {0};
    size_t i = 0;
    bool line_start = true, is_first = true;
    while (i <= t->n) {
        size_t j = i;
        while (j < t->n && t->s[j] != '\n') j++;
        bool empty = j == i;
        if (line_start && (!is_first || (first && truthy(first))) && (!empty || (blank && truthy(blank))) && i < t->n + (j < t->n))
            pkv_jj_sk_jstr(x, &o, pad);
        pkv_jj_sk_jstr(x, &o, pkv_jj_substr(x, t, i, j < t->n ? j + 1 : j));
        is_first = false;
        if (j >= t->n) break;
        i = j + 1;
        line_start = true;
    }
    return vstr(pkv_jj_sk_str(x, &o));
}

static jv filter_wordcount(ev *x, const node *at, const char *name, const jv *s, args *a) {
    (void)at; (void)name; (void)a;
    const jstr *t = pkv_jj_to_str(x, s);
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
    jv *p0 = pkv_jj_arg(a, 0, NULL);
    jv l = pkv_jj_iter_list(x, at, s, name);
    int64_t k = p0 ? numi(p0) : 1;
    if (k < 1) pkv_jj_fail(x, at, "%s: the size must be positive", name);
    jlist *c = pkv_jj_mklist(x, 0);
    size_t n = l.u.l->n;
    if (name[0] == 'b') {
        for (size_t i = 0; i < n; i += (size_t)k) {
            jlist *b = pkv_jj_mklist(x, 0);
            for (size_t j = i; j < n && j < i + (size_t)k; j++) pkv_jj_lpush(x, b, l.u.l->a[j]);
            pkv_jj_lpush(x, c, vlist(b));
        }
    } else {
        size_t per = n / (size_t)k, extra = n % (size_t)k, off = 0;
        for (int64_t g = 0; g < k && g < (int64_t)n + 1; g++) {
            size_t m = per + ((size_t)g < extra);
            jlist *b = pkv_jj_mklist(x, 0);
            for (size_t j = 0; j < m; j++) pkv_jj_lpush(x, b, l.u.l->a[off + j]);
            off += m;
            pkv_jj_lpush(x, c, vlist(b));
        }
    }
    return vlist(c);
}

static jv filter_as_string(ev *x, const node *at, const char *name, const jv *s, args *a) {
    if (s->t == V_UNDEF) return pkv_jj_vcstr(x, "");
    jv str = vstr(pkv_jj_to_str(x, s));
    bool f;
    return pkv_jj_call_builtin(x, at, name, str, a, true, &f);
}

/* upper, lower, title, capitalize: do_case's mode from the name */
static jv str_case(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)a; (void)filter;
    int mode = name[0] == 'u' ? 0 : name[0] == 'l' ? 1 : name[0] == 't' ? 2 : 3;
    return do_case(x, s->u.s, mode);
}

static jv str_strip(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)filter;
    const jstr *str = s->u.s;
        jv *c = pkv_jj_arg(a, 0, "chars");
        const jstr *chars = c && c->t == V_STR ? c->u.s : NULL;
        return do_strip(x, str, chars, name[0] != 'r', name[0] != 'l');
}

static jv str_startswith(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
        jv *p = pkv_jj_arg(a, 0, "prefix");
        if (!p) pkv_jj_fail(x, at, "%s: an argument is needed", name);
        bool end = name[0] == 'e';
        size_t cnt = p->t == V_LIST ? p->u.l->n : 1;
        for (size_t i = 0; i < cnt; i++) {
            const jv *q = p->t == V_LIST ? &p->u.l->a[i] : p;
            if (q->t != V_STR) pkv_jj_fail(x, at, "%s: the argument must be a string", name);
            const jstr *t = q->u.s;
            if (t->n <= str->n && !memcmp(str->s + (end ? str->n - t->n : 0), t->s, t->n)) return vbool(true);
        }
        return vbool(false);
}

static jv str_split(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)filter;
    const jstr *str = s->u.s;
    int64_t n_i;
        jv *sep = pkv_jj_arg(a, 0, "sep");
        jv *mx = pkv_jj_arg(a, 1, "maxsplit");
        n_i = mx ? numi(mx) : -1;
        if (name[0] == 'r' && n_i >= 0 && sep && sep->t == V_STR) { /* rsplit with a limit: from the right */
            jv all = do_split(x, str, sep->u.s, -1);
            jlist *l = all.u.l;
            if (n_i >= (int64_t)l->n - 1) return all;
            size_t keep = l->n - (size_t)n_i; /* the first keep pieces join back */
            size_t cut = 0;
            for (size_t i = 0; i < keep; i++) cut += l->a[i].u.s->n + (i ? sep->u.s->n : 0);
            jlist *r = pkv_jj_mklist(x, 0);
            pkv_jj_lpush(x, r, vstr(pkv_jj_substr(x, str, 0, cut)));
            for (size_t i = keep; i < l->n; i++) pkv_jj_lpush(x, r, l->a[i]);
            return vlist(r);
        }
        return do_split(x, str, sep && sep->t == V_STR ? sep->u.s : NULL, n_i);
}

static jv str_replace(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
        const jstr *from = arg_str(x, at, a, 0, "old", name), *to = arg_str(x, at, a, 1, "new", name);
        jv *c = pkv_jj_arg(a, 2, "count");
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
            f = pkv_jj_memmem(x, str->s, str->n, t->s, t->n);
        }
        if (!f && name[0] == 'i') pkv_jj_fail(x, at, "index: substring not found");
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
    return filter ? pkv_jj_fmt_percent(x, at, str, a) : fmt_braces(x, at, str, a);
}

static jv str_join(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    const jstr *str = s->u.s;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!p0) pkv_jj_fail(x, at, "join: an argument is needed");
        jv l = pkv_jj_iter_list(x, at, p0, name);
        sink o = {0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i) pkv_jj_sk_jstr(x, &o, str);
            pkv_jj_sk_jstr(x, &o, pkv_jj_to_str(x, &l.u.l->a[i]));
        }
        return vstr(pkv_jj_sk_str(x, &o));
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
        jlist *l = pkv_jj_mklist(x, 0);
        size_t i = 0;
        while (i < str->n) {
            size_t j = i;
            while (j < str->n && str->s[j] != '\n' && str->s[j] != '\r') j++;
            pkv_jj_lpush(x, l, vstr(pkv_jj_substr(x, str, i, j)));
            if (j < str->n && str->s[j] == '\r' && j + 1 < str->n && str->s[j + 1] == '\n') j++;
            i = j + 1;
        }
        return vlist(l);
}

static jv str_center(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)filter;
    const jstr *str = s->u.s;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
    int64_t n_i;
        n_i = p0 ? numi(p0) : 80;
        if (n_i > 1 << 20) n_i = 1 << 20;
        if (n_i < 0) n_i = 0;
        sink o = {0};
        int64_t pad = n_i - (int64_t)str->n;
        for (int64_t i = 0; i < pad / 2; i++) pkv_jj_sk_put(x, &o, " ", 1);
        pkv_jj_sk_jstr(x, &o, str);
        for (int64_t i = 0; i < pad - pad / 2; i++) pkv_jj_sk_put(x, &o, " ", 1);
        return vstr(pkv_jj_sk_str(x, &o));
}

static jv list_append(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!p0) pkv_jj_fail(x, at, "append: an argument is needed");
        pkv_jj_lpush(x, l, *p0);
        return NONE;
}

static jv list_extend(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    jlist *l = s->u.l;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!p0) pkv_jj_fail(x, at, "extend: an argument is needed");
        jv o = pkv_jj_iter_list(x, at, p0, name);
        size_t m = o.u.l->n;
        for (size_t i = 0; i < m; i++) pkv_jj_lpush(x, l, o.u.l->a[i]);
        return NONE;
}

static jv list_insert(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        jv *v = pkv_jj_arg(a, 1, NULL);
        if (!p0 || !v) pkv_jj_fail(x, at, "insert: two arguments are needed");
        int64_t i = numi(p0);
        if (i < 0) i += (int64_t)l->n;
        if (i < 0) i = 0;
        if (i > (int64_t)l->n) i = (int64_t)l->n;
        pkv_jj_lpush(x, l, NONE);
        memmove(&l->a[i + 1], &l->a[i], (l->n - 1 - (size_t)i) * sizeof *l->a);
        l->a[i] = *v;
        return NONE;
}

static jv list_pop(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!l->n) pkv_jj_fail(x, at, "pop from an empty list");
        int64_t i = p0 ? numi(p0) : (int64_t)l->n - 1;
        if (i < 0) i += (int64_t)l->n;
        if (i < 0 || i >= (int64_t)l->n) pkv_jj_fail(x, at, "pop index out of range");
        jv r = l->a[i];
        memmove(&l->a[i], &l->a[i + 1], (l->n - 1 - (size_t)i) * sizeof *l->a);
        l->n--;
        return r;
}

static jv list_index(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!p0) pkv_jj_fail(x, at, "index: an argument is needed");
        for (size_t i = 0; i < l->n; i++)
            if (pkv_jj_eq(x, &l->a[i], p0, 0)) return vint((int64_t)i);
        pkv_jj_fail(x, at, "index: the value is not in the list");
}

static jv list_count(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jlist *l = s->u.l;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!p0) pkv_jj_fail(x, at, "count: an argument is needed");
        int64_t c = 0;
        for (size_t i = 0; i < l->n; i++) c += pkv_jj_eq(x, &l->a[i], p0, 0);
        return vint(c);
}

static jv dict_items(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)a; (void)filter;
    jdict *d = s->u.d;
        jlist *l = pkv_jj_mklist(x, d->n);
        for (size_t i = 0; i < d->n; i++) {
            if (name[0] == 'i') {
                jlist *pair = pkv_jj_mklist(x, 2);
                pair->tuple = true;
                pkv_jj_lpush(x, pair, d->k[i]);
                pkv_jj_lpush(x, pair, d->v[i]);
                pkv_jj_lpush(x, l, vlist(pair));
            } else {
                pkv_jj_lpush(x, l, name[0] == 'k' ? d->k[i] : d->v[i]);
            }
        }
        return vlist(l);
}

static jv dict_get(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)name; (void)filter;
    jdict *d = s->u.d;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!p0) pkv_jj_fail(x, at, "get: a key is needed");
        long i = pkv_jj_dfind(x, d, p0);
        jv *def = pkv_jj_arg(a, 1, "default");
        return i >= 0 ? d->v[i] : def ? *def : NONE;
}

static jv dict_update(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)at; (void)name; (void)filter;
    jdict *d = s->u.d;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (p0 && (p0->t == V_DICT || p0->t == V_NS))
            for (size_t i = 0; i < p0->u.d->n; i++) pkv_jj_dset(x, d, p0->u.d->k[i], p0->u.d->v[i]);
        for (int k = 0; k < a->nk; k++) pkv_jj_dset_c(x, d, a->kn[k], a->kw[k]);
        return NONE;
}

static jv dict_pop(ev *x, const node *at, const char *name, const jv *s, args *a, bool filter) {
    (void)filter;
    jdict *d = s->u.d;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
        if (!p0) pkv_jj_fail(x, at, "%s: a key is needed", name);
        long i = pkv_jj_dfind(x, d, p0);
        jv *def = pkv_jj_arg(a, 1, "default");
        if (name[0] == 's') {
            if (i >= 0) return d->v[i];
            pkv_jj_dset(x, d, *p0, def ? *def : NONE);
            return def ? *def : NONE;
        }
        if (i < 0) {
            if (def) return *def;
            pkv_jj_fail(x, at, "pop: the key is not in the dict");
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
        jv *by = pkv_jj_arg(a, 2, "by");
        jv *rev = pkv_jj_arg(a, 3, "reverse");
        jv *cs = pkv_jj_arg(a, 1, "case_sensitive");
        bool byval = by && by->t == V_STR && streq(by->u.s, "value");
        jv *items = pkv_jj_alloc(x, (d->n + 1) * sizeof *items), *keys = pkv_jj_alloc(x, (d->n + 1) * sizeof *keys);
        for (size_t i = 0; i < d->n; i++) {
            jlist *pair = pkv_jj_mklist(x, 2);
            pair->tuple = true;
            pkv_jj_lpush(x, pair, d->k[i]);
            pkv_jj_lpush(x, pair, d->v[i]);
            items[i] = vlist(pair);
            keys[i] = byval ? d->v[i] : d->k[i];
        }
        sort_list(x, at, items, keys, d->n, rev && truthy(rev), !(cs && truthy(cs)));
        jlist *l = pkv_jj_mklist(x, d->n);
        for (size_t i = 0; i < d->n; i++) pkv_jj_lpush(x, l, items[i]);
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
    {"capitalize", str_case, PKV_JJ_BOTH},
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
    {"lower", str_case, PKV_JJ_BOTH},
    {"lstrip", str_strip, PKV_JJ_BOTH},
    {"replace", str_replace, PKV_JJ_BOTH},
    {"rfind", str_find, PKV_JJ_BOTH},
    {"rsplit", str_split, PKV_JJ_BOTH},
    {"rstrip", str_strip, PKV_JJ_BOTH},
    {"split", str_split, PKV_JJ_BOTH},
    {"splitlines", str_splitlines, PKV_JJ_BOTH},
    {"startswith", str_startswith, PKV_JJ_BOTH},
    {"strip", str_strip, PKV_JJ_BOTH},
    {"title", str_case, PKV_JJ_BOTH},
    {"trim", str_strip, PKV_JJ_BOTH},
    {"upper", str_case, PKV_JJ_BOTH},
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
jv pkv_jj_call_builtin(ev *x, const node *at, const char *name, jv self, args *a, bool filter, bool *found) {
    *found = true;
    const jv *s = &self;
    pkv_jj_mark(s, PKV_JINJA_USED);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr")) pkv_jj_mark(s, PKV_JINJA_OP_ARRAY);
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
    if (!f) pkv_jj_fail(x, at, "no filter named '%s'", name);
    return f->fn(x, at, name, &self, a);
}

jv pkv_jj_call_test(ev *x, const node *at, const char *name, const jv *v, args *a, bool *found) {
    *found = true;
    jv *p0 = pkv_jj_arg(a, 0, NULL);
    pkv_jj_mark(v, PKV_JINJA_USED);
    if (!strcmp(name, "string")) pkv_jj_mark(v, PKV_JINJA_OP_STRING);
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
        if (v->t != V_INT) pkv_jj_fail(x, at, "test '%s' needs an integer, not %s", name, tname(v));
        return vbool((v->u.i % 2 != 0) == (name[0] == 'o'));
    }
    if (!strcmp(name, "divisibleby")) {
        if (!p0 || numi(p0) == 0) pkv_jj_fail(x, at, "divisibleby: a non-zero number is needed");
        if (numi(p0) == -1) return vbool(true); /* INT64_MIN % -1 would trap */
        return vbool(numi(v) % numi(p0) == 0);
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->t != V_STR) return vbool(false);
        bool f;
        args none = {0};
        return pkv_jj_call_builtin(x, at, name[0] == 'l' ? "islower" : "isupper", *v, &none, false, &f);
    }
    if (!p0 && (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "in") || !strcmp(name, "sameas")))
        pkv_jj_fail(x, at, "test '%s' needs an argument", name);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==") || !strcmp(name, "sameas")) {
        if (!p0) pkv_jj_fail(x, at, "test '%s' needs an argument", name);
        return vbool(pkv_jj_eq(x, v, p0, 0));
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        if (!p0) pkv_jj_fail(x, at, "test '%s' needs an argument", name);
        return vbool(!pkv_jj_eq(x, v, p0, 0));
    }
    static const char *const cmps[][2] = {{"lt", "<"}, {"le", "<="}, {"gt", ">"}, {"ge", ">="}, {"lessthan", "<"}, {"greaterthan", ">"}};
    for (size_t i = 0; i < sizeof cmps / sizeof cmps[0]; i++)
        if (!strcmp(name, cmps[i][0]) || !strcmp(name, cmps[i][1])) {
            if (!p0) pkv_jj_fail(x, at, "test '%s' needs an argument", name);
            int c = pkv_jj_cmp(x, at, v, p0);
            const char *o = cmps[i][1];
            return vbool(o[0] == '<' ? (o[1] ? c <= 0 : c < 0) : (o[1] ? c >= 0 : c > 0));
        }
    if (!strcmp(name, "in")) {
        if (p0->t == V_STR && v->t == V_STR) return vbool(pkv_jj_memmem(x, p0->u.s->s, p0->u.s->n, v->u.s->s, v->u.s->n) != NULL);
        if (p0->t == V_LIST) {
            for (size_t i = 0; i < p0->u.l->n; i++)
                if (pkv_jj_eq(x, &p0->u.l->a[i], v, 0)) return vbool(true);
            return vbool(false);
        }
        if (p0->t == V_DICT) return vbool(pkv_jj_dfind(x, p0->u.d, v) >= 0);
        return vbool(false);
    }
    *found = false;
    return UNDEF;
}
