/* GBNF grammars (llama.cpp's format) compiled to a pushdown automaton, matched
 * byte by byte, and token masks from a byte trie of the vocabulary.
 *
 * The automaton: every rule is a list of alternatives, each a run of elements
 * (a character set, or a reference to a rule) ended by an END element, all in one
 * flat array. Repetitions are rewritten into rules: x* is s ::= x s | (empty),
 * x{m,n} is m copies of x and then n - m nested optional rules, so a parse stack
 * stays small for loops and a bounded repetition stays bounded.
 *
 * The matcher: a set of parse stacks. A stack is a chain of interned nodes
 * (position, parent node), so equal stacks are one node id, a state is a sorted
 * array of top-node ids, and comparing two states is comparing arrays. A top node
 * always sits at a character set (the next thing to match), or is node 0, the
 * empty stack, which means "complete". Calling a rule whose reference ends its
 * alternative pushes no frame (tail calls), so x* loops in place: after a
 * character of a string the state is the very same node set.
 *
 * Masks walk the vocabulary's byte trie from the current state, dropping a
 * subtree as soon as its prefix is rejected. A subtree is taken whole, without
 * walking it, when every byte below it loops the state onto itself (the body of
 * a JSON string or a run of digits): that is what keeps a mask over 150k tokens
 * cheap where nearly everything is allowed. Nodes the walk interns are rolled
 * back afterwards, so a matcher's arena grows only with accepted input. */
#include "engine/grammar.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* ------------------------------------------------------------ automaton */

enum { GE_END = 0, GE_SET = 1, GE_REF = 2 };

typedef struct gelem {
    uint8_t kind;
    uint8_t neg;  /* GE_SET: the set is the complement of its ranges */
    int32_t a, b; /* GE_SET: ranges [a, a + b) of g->ranges; GE_REF: rule a */
} gelem;

struct pkv_grammar {
    atomic_int refs;
    gelem *elems;      /* [n_elems] alternatives, each ended by GE_END */
    int32_t n_elems;
    uint32_t *ranges;  /* [n_ranges][2] inclusive code-point ranges, sorted, merged per set */
    int32_t n_ranges;
    int32_t *alt_off;  /* [n_rules + 1] rule r's alternatives are alts[alt_off[r] .. alt_off[r+1]) */
    int32_t *alts;     /* element index where each alternative starts */
    int32_t n_rules;
    int32_t root;
    char *text;        /* the GBNF source, NUL-terminated */
    uint64_t work_token, work_request; /* matcher work limits in steps (pkv_grammar_set_work_limits) */
};

/* ---------------------------------------------------------------- parser */

typedef struct bseq {
    gelem *e;
    int n, cap;
} bseq;

typedef struct brule {
    char *name;       /* NULL for rules made from groups and repetitions */
    size_t name_len;
    bseq *alts;
    int n_alts, cap_alts;
    bool defined;
    int line, col;    /* definition, or first use while undefined */
} brule;

typedef struct gparser {
    const char *s, *end, *origin, *base;
    const char *line_start;
    int line;
    brule *rules;
    int n_rules, cap_rules;
    int32_t *names; /* [names_cap] named rules by name (open addressing, -1 empty): a
                       lookup per reference must not scan every rule */
    size_t names_cap, n_named;
    uint32_t *ranges;
    size_t n_ranges, cap_ranges;
    size_t n_elems; /* running total, bounded by PKV_GRAMMAR_MAX_ELEMS */
    int depth;      /* open '(' groups, bounded by PKV_GRAMMAR_MAX_NESTING (the parser recurses) */
    pkv_status err;
} gparser;

static int col_of(const gparser *p, const char *at) { return (int)(at - p->line_start) + 1; }

static pkv_status perr(gparser *p, const char *at, const char *fmt, const char *arg) {
    if (p->err) return p->err;
    int line = 1; /* counted afresh: errors are rare */
    const char *ls = p->base;
    for (const char *q = p->base; q < at; q++)
        if (*q == '\n') line++, ls = q + 1;
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    p->err = pkv_err(PKV_ERR_INVALID, "%s: line %d, column %d: %s", p->origin, line, (int)(at - ls) + 1, msg);
    return p->err;
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skip blanks and comments; newlines too when nl. */
static void skip_space(gparser *p, bool nl) {
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\r') {
            p->s++;
        } else if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else if (c == '\n' && nl) {
            p->s++;
            p->line++;
            p->line_start = p->s;
        } else {
            break;
        }
    }
}

static int rule_new(gparser *p, const char *name, size_t nlen, const char *at) {
    if (p->n_rules == p->cap_rules) {
        size_t cap = (size_t)p->cap_rules;
        if (pkv_grow((void **)&p->rules, &cap, (size_t)p->n_rules + 1, sizeof *p->rules)) return -1;
        p->cap_rules = (int)cap;
    }
    brule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = pkv_malloc(nlen + 1);
        if (!r->name) return -1;
        memcpy(r->name, name, nlen);
        r->name[nlen] = 0;
        r->name_len = nlen;
    }
    r->line = p->line;
    r->col = col_of(p, at);
    return p->n_rules++;
}

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The named rule, made (undefined) if new; -1 on NOMEM. */
static int rule_find(gparser *p, const char *name, size_t nlen, const char *at) {
    if (2 * (p->n_named + 1) > p->names_cap) {
        size_t cap = p->names_cap ? 2 * p->names_cap : 64;
        int32_t *t = pkv_malloc(cap * sizeof *t);
        if (!t) return -1;
        memset(t, 0xff, cap * sizeof *t);
        for (size_t i = 0; i < p->names_cap; i++) {
            int32_t r = p->names[i];
            if (r < 0) continue;
            size_t h = name_hash(p->rules[r].name, p->rules[r].name_len) & (cap - 1);
            while (t[h] >= 0) h = (h + 1) & (cap - 1);
            t[h] = r;
        }
        pkv_free(p->names);
        p->names = t;
        p->names_cap = cap;
    }
    size_t h = name_hash(name, nlen) & (p->names_cap - 1);
    for (int32_t r; (r = p->names[h]) >= 0; h = (h + 1) & (p->names_cap - 1))
        if (p->rules[r].name_len == nlen && !memcmp(p->rules[r].name, name, nlen)) return r;
    int r = rule_new(p, name, nlen, at);
    if (r >= 0) p->names[h] = r, p->n_named++;
    return r;
}

static bseq *alt_new(gparser *p, int rule) {
    brule *r = &p->rules[rule];
    if (r->n_alts == r->cap_alts) {
        size_t cap = (size_t)r->cap_alts;
        if (pkv_grow((void **)&r->alts, &cap, (size_t)r->n_alts + 1, sizeof *r->alts)) return NULL;
        r->cap_alts = (int)cap;
    }
    bseq *q = &r->alts[r->n_alts++];
    memset(q, 0, sizeof *q);
    return q;
}

static bool seq_push(gparser *p, bseq *q, gelem e) {
    if (++p->n_elems > PKV_GRAMMAR_MAX_ELEMS) {
        perr(p, p->s, "the grammar is too large (more than %s elements after expanding repetitions)", "2097152");
        return false;
    }
    if (q->n == q->cap) {
        size_t cap = (size_t)q->cap;
        if (pkv_grow((void **)&q->e, &cap, (size_t)q->n + 1, sizeof *q->e)) {
            p->err = PKV_ERR_NOMEM;
            return false;
        }
        q->cap = (int)cap;
    }
    q->e[q->n++] = e;
    return true;
}

static int cmp_range(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A character set from ranges (pairs, unsorted): sorted and merged into p->ranges.
 * qsort, not an insertion sort: a class written with 100k ranges in falling order
 * must not take quadratic time (found by fuzz-grammar). */
static bool set_add(gparser *p, uint32_t *rg, size_t n, bool neg, gelem *out) {
    if (n > 1) qsort(rg, n, 2 * sizeof *rg, cmp_range);
    size_t start = p->n_ranges, m = 0;
    if (pkv_grow((void **)&p->ranges, &p->cap_ranges, 2 * (start + n), sizeof *p->ranges)) {
        p->err = PKV_ERR_NOMEM;
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = rg[2 * i], hi = rg[2 * i + 1];
        uint32_t *last = m ? &p->ranges[2 * (start + m - 1)] : NULL;
        if (last && lo <= last[1] + 1) {
            if (hi > last[1]) last[1] = hi;
        } else {
            p->ranges[2 * (start + m)] = lo;
            p->ranges[2 * (start + m) + 1] = hi;
            m++;
        }
    }
    p->n_ranges = start + m;
    *out = (gelem){GE_SET, (uint8_t)neg, (int32_t)start, (int32_t)m};
    return true;
}

/* One UTF-8 code point of the source; -1 (and an error) when malformed. */
static int64_t src_utf8(gparser *p) {
    const unsigned char *u = (const unsigned char *)p->s;
    size_t left = (size_t)(p->end - p->s);
    uint32_t c = u[0];
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!n || (size_t)n > left) goto bad;
    if (n > 1) c &= 0x3fu >> (n - 1);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xc0) != 0x80) goto bad;
        c = (c << 6) | (u[i] & 0x3f);
    }
    p->s += n;
    return c;
bad:
    perr(p, p->s, "invalid UTF-8 in the grammar%s", NULL);
    return -1;
}

/* A character of a literal or a class, with escapes; -1 on error. */
static int64_t parse_char(gparser *p) {
    if (p->s >= p->end) {
        perr(p, p->s, "unexpected end of the grammar inside a literal or class%s", NULL);
        return -1;
    }
    if (*p->s != '\\') return src_utf8(p);
    const char *at = p->s++;
    if (p->s >= p->end) {
        perr(p, at, "'\\' at the end of the grammar%s", NULL);
        return -1;
    }
    char c = *p->s++;
    int hex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (hex) {
        uint32_t v = 0;
        for (int i = 0; i < hex; i++) {
            char h = p->s < p->end ? *p->s : 0;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) {
                perr(p, at, "escape \\%c needs hex digits", c == 'x' ? "x" : c == 'u' ? "u" : "U");
                return -1;
            }
            v = v * 16 + (uint32_t)d;
            p->s++;
        }
        if (v > 0x10ffff) {
            perr(p, at, "escape beyond U+10FFFF%s", NULL);
            return -1;
        }
        return v;
    }
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': case '.': return c;
    default: {
        char e[2] = {c, 0};
        perr(p, at, "unknown escape \\%s", e);
        return -1;
    }
    }
}

static bool parse_alternates(gparser *p, int rule, bool nested);

/* A new rule holding one alternative that is q[from..q->n); q keeps a reference to it. */
static bool wrap_tail(gparser *p, bseq *q, int from, const char *at) {
    int r = rule_new(p, NULL, 0, at);
    if (r < 0) return (p->err = PKV_ERR_NOMEM), false;
    p->rules[r].defined = true;
    bseq *a = alt_new(p, r);
    if (!a) return (p->err = PKV_ERR_NOMEM), false;
    for (int i = from; i < q->n; i++)
        if (!seq_push(p, a, q->e[i])) return false;
    p->n_elems -= (size_t)(q->n - from);
    q->n = from;
    return seq_push(p, q, (gelem){GE_REF, 0, r, 0});
}

/* The last atom x of q (one element) repeated m..n times (n < 0: unbounded). */
static bool repeat(gparser *p, bseq *q, int m, int n, const char *at) {
    gelem x = q->e[--q->n];
    p->n_elems--;
    for (int i = 0; i < m; i++)
        if (!seq_push(p, q, x)) return false;
    if (n < 0) { /* s ::= x s | (empty) */
        int s = rule_new(p, NULL, 0, at);
        if (s < 0) return (p->err = PKV_ERR_NOMEM), false;
        p->rules[s].defined = true;
        bseq *a = alt_new(p, s);
        if (!a || !seq_push(p, a, x) || !seq_push(p, a, (gelem){GE_REF, 0, s, 0}) || !alt_new(p, s))
            return p->err ? false : ((p->err = PKV_ERR_NOMEM), false);
        return seq_push(p, q, (gelem){GE_REF, 0, s, 0});
    }
    int prev = -1; /* o_k ::= x o_{k-1} | (empty); o_1 ::= x | (empty) */
    for (int k = 1; k <= n - m; k++) {
        int o = rule_new(p, NULL, 0, at);
        if (o < 0) return (p->err = PKV_ERR_NOMEM), false;
        p->rules[o].defined = true;
        bseq *a = alt_new(p, o);
        if (!a || !seq_push(p, a, x)) return p->err ? false : ((p->err = PKV_ERR_NOMEM), false);
        if (prev >= 0 && !seq_push(p, a, (gelem){GE_REF, 0, prev, 0})) return false;
        if (!alt_new(p, o)) return (p->err = PKV_ERR_NOMEM), false;
        prev = o;
    }
    return prev < 0 || seq_push(p, q, (gelem){GE_REF, 0, prev, 0});
}

static bool parse_int(gparser *p, int *out) {
    const char *at = p->s;
    long v = 0;
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') {
        perr(p, at, "expected a number in {m,n}%s", NULL);
        return false;
    }
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        v = v * 10 + (*p->s++ - '0');
        if (v > PKV_GRAMMAR_MAX_REPEAT) {
            perr(p, at, "repetition count above %s", "100000");
            return false;
        }
    }
    *out = (int)v;
    return true;
}

/* Is the next thing on this line (or after blank lines) "name ::="? */
static bool at_rule_start(const gparser *p) {
    const char *s = p->s;
    if (s >= p->end || !is_word(*s)) return false;
    while (s < p->end && is_word(*s)) s++;
    while (s < p->end && (*s == ' ' || *s == '\t')) s++;
    return p->end - s >= 3 && !memcmp(s, "::=", 3);
}

static bool parse_sequence(gparser *p, bseq *q, bool nested) {
    int last = -1; /* where the last atom starts in q */
    for (;;) {
        skip_space(p, nested);
        if (p->s >= p->end) return true;
        const char *at = p->s;
        char c = *p->s;
        if (c == '"') {
            p->s++;
            last = q->n;
            while (p->s < p->end && *p->s != '"') {
                int64_t cp = parse_char(p);
                if (cp < 0) return false;
                uint32_t rg[2] = {(uint32_t)cp, (uint32_t)cp};
                gelem e;
                if (!set_add(p, rg, 1, false, &e) || !seq_push(p, q, e)) return false;
            }
            if (p->s >= p->end) return perr(p, at, "unterminated string literal%s", NULL), false;
            p->s++;
            if (q->n == last) last = -1; /* "" is nothing */
        } else if (c == '[') {
            p->s++;
            bool neg = p->s < p->end && *p->s == '^';
            if (neg) p->s++;
            uint32_t *rg = NULL;
            size_t n = 0, cap = 0;
            while (p->s < p->end && *p->s != ']') {
                int64_t lo = parse_char(p), hi = lo;
                if (lo < 0) break;
                if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    hi = parse_char(p);
                    if (hi < 0) break;
                    if (hi < lo) {
                        perr(p, at, "character range with its end below its start%s", NULL);
                        break;
                    }
                }
                if (pkv_grow((void **)&rg, &cap, 2 * (n + 1), sizeof *rg)) {
                    p->err = PKV_ERR_NOMEM;
                    break;
                }
                rg[2 * n] = (uint32_t)lo;
                rg[2 * n + 1] = (uint32_t)hi;
                n++;
            }
            if (!p->err && p->s >= p->end) perr(p, at, "unterminated character class%s", NULL);
            if (!p->err && !n && !neg) perr(p, at, "empty character class []%s", NULL);
            gelem e;
            bool ok = !p->err && set_add(p, rg, n, neg, &e);
            pkv_free(rg);
            if (!ok) return false;
            p->s++;
            last = q->n;
            if (!seq_push(p, q, e)) return false;
        } else if (c == '.') {
            p->s++;
            uint32_t rg[2] = {0, 0x10ffff};
            gelem e;
            last = q->n;
            if (!set_add(p, rg, 1, false, &e) || !seq_push(p, q, e)) return false;
        } else if (is_word(c)) {
            if (!nested && at_rule_start(p)) return true; /* the next rule */
            const char *w = p->s;
            while (p->s < p->end && is_word(*p->s)) p->s++;
            int r = rule_find(p, w, (size_t)(p->s - w), w);
            if (r < 0) return (p->err = PKV_ERR_NOMEM), false;
            last = q->n;
            if (!seq_push(p, q, (gelem){GE_REF, 0, r, 0})) return false;
        } else if (c == '(') {
            if (p->depth >= PKV_GRAMMAR_MAX_NESTING) {
                char lim[16];
                snprintf(lim, sizeof lim, "%d", PKV_GRAMMAR_MAX_NESTING);
                return perr(p, at, "groups '(' nested deeper than the limit of %s", lim), false;
            }
            p->s++;
            int r = rule_new(p, NULL, 0, at);
            if (r < 0) return (p->err = PKV_ERR_NOMEM), false;
            p->rules[r].defined = true;
            p->depth++;
            bool ok = parse_alternates(p, r, true);
            p->depth--;
            if (!ok) return false;
            skip_space(p, true);
            if (p->s >= p->end || *p->s != ')') return perr(p, at, "unclosed '('%s", NULL), false;
            p->s++;
            last = q->n;
            if (!seq_push(p, q, (gelem){GE_REF, 0, r, 0})) return false;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            char op[2] = {c, 0};
            if (last < 0) return perr(p, at, "'%s' with nothing before it to repeat", op), false;
            p->s++;
            int m = 0, n = -1;
            if (c == '+') m = 1;
            else if (c == '?') n = 1;
            else if (c == '{') {
                skip_space(p, false);
                if (!parse_int(p, &m)) return false;
                skip_space(p, false);
                if (p->s < p->end && *p->s == ',') {
                    p->s++;
                    skip_space(p, false);
                    if (p->s < p->end && *p->s != '}' && !parse_int(p, &n)) return false;
                } else {
                    n = m;
                }
                skip_space(p, false);
                if (p->s >= p->end || *p->s != '}') return perr(p, at, "expected '}' after {m,n}%s", NULL), false;
                p->s++;
                if (n >= 0 && n < m) return perr(p, at, "{m,n} with n below m%s", NULL), false;
            }
            if (q->n - last > 1 && !wrap_tail(p, q, last, at)) return false;
            if (!repeat(p, q, m, n, at)) return false;
            last = -1; /* x** is an error, as in llama.cpp */
        } else if (c == '\n' || c == '|' || c == ')') {
            return true;
        } else if (c == '<') {
            return perr(p, at, "token references (<...>) are not supported%s", NULL), false;
        } else {
            char e[2] = {c, 0};
            return perr(p, at, "unexpected character '%s'", e), false;
        }
    }
}

/* Alternatives of rule. At the top level a rule ends at a newline unless the next
 * line goes on with '|'. */
static bool parse_alternates(gparser *p, int rule, bool nested) {
    for (;;) {
        bseq *q = alt_new(p, rule);
        if (!q) return (p->err = PKV_ERR_NOMEM), false;
        /* q may move when rule's alternative array grows inside: work on a copy */
        bseq tmp = *q;
        memset(q, 0, sizeof *q);
        bool ok = parse_sequence(p, &tmp, nested);
        p->rules[rule].alts[p->rules[rule].n_alts - 1] = tmp; /* the slot index is stable */
        if (!ok) return false;
        skip_space(p, nested);
        if (!nested && p->s < p->end && *p->s == '\n') { /* a '|' on a following line goes on */
            const char *save = p->s, *save_ls = p->line_start;
            int save_line = p->line;
            skip_space(p, true);
            if (p->s < p->end && *p->s == '|') goto bar;
            p->s = save;
            p->line_start = save_ls;
            p->line = save_line;
            return true;
        }
        if (p->s >= p->end || *p->s != '|') return true;
    bar:
        p->s++;
        skip_space(p, true);
    }
}

static bool parse_grammar(gparser *p) {
    for (;;) {
        skip_space(p, true);
        if (p->s >= p->end) return true;
        const char *at = p->s;
        if (!is_word(*p->s)) return perr(p, at, "expected a rule name%s", NULL), false;
        while (p->s < p->end && is_word(*p->s)) p->s++;
        size_t nlen = (size_t)(p->s - at);
        skip_space(p, false);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3)) return perr(p, p->s, "expected '::=' after the rule name%s", NULL), false;
        p->s += 3;
        int r = rule_find(p, at, nlen, at);
        if (r < 0) return (p->err = PKV_ERR_NOMEM), false;
        if (p->rules[r].defined) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)PKV_MIN(nlen, 60), at);
            return perr(p, at, "rule '%s' is defined twice", name), false;
        }
        p->rules[r].defined = true;
        p->rules[r].line = p->line;
        p->rules[r].col = col_of(p, at);
        skip_space(p, true);
        if (!parse_alternates(p, r, false)) return false;
        skip_space(p, false);
        if (p->s < p->end && *p->s != '\n' && !at_rule_start(p)) { /* an empty body ends at the next rule */
            char e[2] = {*p->s, 0};
            return perr(p, p->s, "unexpected '%s'", e), false;
        }
    }
}

static void parser_free(gparser *p) {
    for (int i = 0; i < p->n_rules; i++) {
        for (int j = 0; j < p->rules[i].n_alts; j++) pkv_free(p->rules[i].alts[j].e);
        pkv_free(p->rules[i].alts);
        pkv_free(p->rules[i].name);
    }
    pkv_free(p->rules);
    pkv_free(p->names);
    pkv_free(p->ranges);
}

static const char *rule_label(const gparser *p, int r, char *buf, size_t n) {
    if (p->rules[r].name) return p->rules[r].name;
    snprintf(buf, n, "(a group or repetition at line %d, column %d)", p->rules[r].line, p->rules[r].col);
    return buf;
}

/* Refuse left recursion (a rule reaching itself before consuming a character):
 * the matcher's expansion would not end. Linear in the grammar's size: a text of
 * 1 MiB may hold ~100k rules, and a chain of them must not cost their square. */
static pkv_status check_left_recursion(gparser *p) {
    int n = p->n_rules;
    size_t n_alts = 0, n_refs = 0;
    for (int r = 0; r < n; r++) {
        n_alts += (size_t)p->rules[r].n_alts;
        for (int a = 0; a < p->rules[r].n_alts; a++) n_refs += (size_t)p->rules[r].alts[a].n;
    }
    bool *nullable = pkv_calloc((size_t)n, sizeof *nullable);
    uint8_t *color = pkv_calloc((size_t)n, 1);
    int32_t *stk = pkv_calloc((size_t)n + 1, 3 * sizeof *stk);       /* [n + 1][3] DFS: rule, alt, element */
    int32_t *pending = pkv_calloc(n_alts + 1, sizeof *pending);      /* [n_alts] elements not yet nullable */
    int32_t *alt_rule = pkv_calloc(n_alts + 1, sizeof *alt_rule);    /* [n_alts] the alternative's rule */
    int32_t *use_off = pkv_calloc((size_t)n + 2, sizeof *use_off);   /* [n + 1] CSR offsets into use */
    int32_t *use = pkv_calloc(n_refs + 1, sizeof *use);              /* [n_refs] alternatives using a rule */
    int32_t *queue = pkv_calloc((size_t)n + 1, sizeof *queue);       /* [n] rules found nullable */
    int32_t *fill = pkv_calloc((size_t)n + 1, sizeof *fill);         /* [n] uses of a rule written so far */
    pkv_status st = PKV_OK;
    if (!nullable || !color || !stk || !pending || !alt_rule || !use_off || !use || !queue || !fill) {
        st = pkv_err(PKV_ERR_NOMEM, "grammar: out of memory");
        goto done;
    }
    /* nullable rules: an alternative of references only is nullable once each
     * referenced rule is; each reference is visited once when its rule turns nullable */
    int qn = 0;
    size_t id = 0;
    for (int r = 0; r < n; r++) {
        for (int a = 0; a < p->rules[r].n_alts; a++, id++) {
            bseq *q = &p->rules[r].alts[a];
            bool refs = true;
            for (int i = 0; i < q->n && refs; i++) refs = q->e[i].kind == GE_REF;
            alt_rule[id] = r;
            pending[id] = refs ? q->n : -1; /* -1: a character in it, never nullable */
            if (!refs) continue;
            for (int i = 0; i < q->n; i++) use_off[q->e[i].a + 1]++;
            if (q->n == 0 && !nullable[r]) nullable[r] = true, queue[qn++] = r;
        }
    }
    for (int r = 0; r < n; r++) use_off[r + 1] += use_off[r];
    id = 0;
    for (int r = 0; r < n; r++) {
        for (int a = 0; a < p->rules[r].n_alts; a++, id++) {
            if (pending[id] < 0) continue;
            bseq *q = &p->rules[r].alts[a];
            for (int i = 0; i < q->n; i++) use[use_off[q->e[i].a] + fill[q->e[i].a]++] = (int32_t)id;
        }
    }
    for (int qi = 0; qi < qn; qi++) {
        int s = queue[qi];
        for (int32_t k = use_off[s]; k < use_off[s + 1]; k++) {
            int32_t alt = use[k], r = alt_rule[alt];
            if (--pending[alt] == 0 && !nullable[r]) nullable[r] = true, queue[qn++] = r;
        }
    }
    /* DFS over "r can start with s" edges, iterative; a frame resumes at (alt, element),
     * so each reference is looked at once */
    for (int r0 = 0; r0 < n && !st; r0++) {
        if (color[r0]) continue;
        stk[0] = r0, stk[1] = 0, stk[2] = 0;
        color[r0] = 1;
        int sp = 1;
        while (sp > 0 && !st) {
            int32_t *f = &stk[3 * (sp - 1)];
            const brule *rr = &p->rules[f[0]];
            int s = -1;
            while (s < 0 && f[1] < rr->n_alts) {
                const bseq *q = &rr->alts[f[1]];
                if (f[2] >= q->n || q->e[f[2]].kind != GE_REF) {
                    f[1]++, f[2] = 0;
                    continue;
                }
                s = q->e[f[2]].a;
                if (nullable[s]) f[2]++; /* the next element may start the rule too */
                else f[1]++, f[2] = 0;
            }
            if (s < 0) {
                color[f[0]] = 2;
                sp--;
            } else if (color[s] == 1) {
                /* name the nearest named rule on the cycle */
                int named = s;
                for (int j = sp - 1; j >= 0 && !p->rules[named].name; j--) named = stk[3 * j];
                char buf[96];
                const brule *nr = &p->rules[named];
                st = pkv_err(PKV_ERR_INVALID, "%s: line %d, column %d: rule '%s' is left-recursive (it can reach itself "
                             "before matching a character); write the recursion on the right",
                             p->origin, nr->line, nr->col, rule_label(p, named, buf, sizeof buf));
            } else if (color[s] == 0) {
                color[s] = 1;
                stk[3 * sp] = s, stk[3 * sp + 1] = 0, stk[3 * sp + 2] = 0;
                sp++;
            }
        }
    }
done:
    pkv_free(nullable), pkv_free(color), pkv_free(stk), pkv_free(pending);
    pkv_free(alt_rule), pkv_free(use_off), pkv_free(use), pkv_free(queue), pkv_free(fill);
    return st;
}

static pkv_grammar *compile(gparser *p) {
    int root = -1;
    for (int i = 0; i < p->n_rules; i++) {
        brule *r = &p->rules[i];
        if (!r->defined) {
            pkv_err(PKV_ERR_INVALID, "%s: line %d, column %d: rule '%s' is used but never defined", p->origin, r->line,
                    r->col, r->name);
            return NULL;
        }
        if (r->name && !strcmp(r->name, "root")) root = i;
    }
    if (root < 0) {
        pkv_err(PKV_ERR_INVALID, "%s: no rule named 'root' (where the output starts)", p->origin);
        return NULL;
    }
    if (check_left_recursion(p)) return NULL;
    pkv_grammar *g = pkv_calloc(1, sizeof *g);
    if (!g) goto nomem;
    atomic_init(&g->refs, 1);
    size_t n_alts = 0, n_el = 0;
    for (int i = 0; i < p->n_rules; i++) {
        n_alts += (size_t)p->rules[i].n_alts;
        for (int j = 0; j < p->rules[i].n_alts; j++) n_el += (size_t)p->rules[i].alts[j].n + 1;
    }
    g->elems = pkv_malloc((n_el + 1) * sizeof *g->elems);
    g->alts = pkv_malloc((n_alts + 1) * sizeof *g->alts);
    g->alt_off = pkv_malloc(((size_t)p->n_rules + 1) * sizeof *g->alt_off);
    g->ranges = pkv_malloc((2 * p->n_ranges + 2) * sizeof *g->ranges);
    if (!g->elems || !g->alts || !g->alt_off || !g->ranges) goto nomem;
    if (p->n_ranges) memcpy(g->ranges, p->ranges, 2 * p->n_ranges * sizeof *g->ranges);
    g->n_ranges = (int32_t)p->n_ranges;
    size_t e = 0, a = 0;
    for (int i = 0; i < p->n_rules; i++) {
        g->alt_off[i] = (int32_t)a;
        for (int j = 0; j < p->rules[i].n_alts; j++) {
            g->alts[a++] = (int32_t)e;
            bseq *q = &p->rules[i].alts[j];
            if (q->n) memcpy(g->elems + e, q->e, (size_t)q->n * sizeof *q->e);
            e += (size_t)q->n;
            g->elems[e++] = (gelem){GE_END, 0, 0, 0};
        }
    }
    g->alt_off[p->n_rules] = (int32_t)a;
    g->n_elems = (int32_t)e;
    g->n_rules = p->n_rules;
    g->root = root;
    g->work_token = PKV_GRAMMAR_WORK_TOKEN;
    g->work_request = PKV_GRAMMAR_WORK_REQUEST;
    return g;
nomem:
    pkv_grammar_free(g);
    pkv_err(PKV_ERR_NOMEM, "%s: out of memory compiling the grammar", p->origin);
    return NULL;
}

pkv_grammar *pkv_grammar_parse(const char *text, size_t len, const char *origin) {
    if (!text) {
        pkv_err(PKV_ERR_INVALID, "%s: NULL text", origin);
        return NULL;
    }
    if (len > PKV_GRAMMAR_MAX_TEXT) {
        pkv_err(PKV_ERR_INVALID, "%s: %zu bytes, more than the limit of %d", origin, len, PKV_GRAMMAR_MAX_TEXT);
        return NULL;
    }
    gparser p;
    memset(&p, 0, sizeof p);
    p.s = p.line_start = p.base = text;
    p.end = text + len;
    p.origin = origin;
    p.line = 1;
    pkv_grammar *g = NULL;
    if (parse_grammar(&p)) g = compile(&p);
    else if (p.err == PKV_ERR_NOMEM) pkv_err(PKV_ERR_NOMEM, "%s: out of memory parsing the grammar", origin);
    parser_free(&p);
    if (g) {
        g->text = pkv_malloc(len + 1);
        if (!g->text) {
            pkv_grammar_free(g);
            pkv_err(PKV_ERR_NOMEM, "%s: out of memory", origin);
            return NULL;
        }
        memcpy(g->text, text, len);
        g->text[len] = 0;
        /* refuse here, not at the first sample, a grammar whose start state is over a
         * matcher limit (20000 alternatives of root) */
        pkv_gmatch *m = pkv_gmatch_create(g);
        if (!m) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", pkv_errmsg());
            pkv_grammar_free(g);
            pkv_err(PKV_ERR_INVALID, "%s: at its start: %s", origin, msg);
            return NULL;
        }
        pkv_gmatch_free(m);
    }
    return g;
}

pkv_grammar *pkv_grammar_from_gbnf(const char *text, size_t len) { return pkv_grammar_parse(text, len, "grammar"); }

pkv_grammar *pkv_grammar_retain(const pkv_grammar *cg) {
    pkv_grammar *g = (pkv_grammar *)cg;
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void pkv_grammar_free(pkv_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    pkv_free(g->elems);
    pkv_free(g->ranges);
    pkv_free(g->alt_off);
    pkv_free(g->alts);
    pkv_free(g->text);
    pkv_free(g);
}

const char *pkv_grammar_gbnf(const pkv_grammar *g) { return g ? g->text : NULL; }

pkv_status pkv_grammar_set_work_limits(pkv_grammar *g, uint64_t per_token, uint64_t per_request) {
    if (!g) return pkv_err(PKV_ERR_INVALID, "grammar: NULL");
    g->work_token = per_token ? per_token : PKV_GRAMMAR_WORK_TOKEN;
    g->work_request = per_request ? per_request : PKV_GRAMMAR_WORK_REQUEST;
    return PKV_OK;
}

static bool set_has(const pkv_grammar *g, const gelem *e, uint32_t c) {
    const uint32_t *r = g->ranges + 2 * e->a;
    int lo = 0, hi = e->b; /* first range with r.hi >= c */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (r[2 * mid + 1] < c) lo = mid + 1;
        else hi = mid;
    }
    bool in = lo < e->b && r[2 * lo] <= c;
    return in != (bool)e->neg;
}

/* Does the set hold any code point of [lo, hi]? */
static bool set_meets(const pkv_grammar *g, const gelem *e, uint32_t lo, uint32_t hi) {
    const uint32_t *r = g->ranges + 2 * e->a;
    if (!e->neg) {
        for (int i = 0; i < e->b; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
        return false;
    }
    /* complement: some point of [lo, hi] outside every range */
    uint32_t c = lo;
    for (int i = 0; i < e->b && c <= hi; i++) {
        if (r[2 * i + 1] < c) continue;
        if (r[2 * i] > c) return true;
        if (r[2 * i + 1] == UINT32_MAX) return false;
        c = r[2 * i + 1] + 1;
    }
    return c <= hi;
}

/* The set is the same for every code point of [lo, hi] (all in or all out). */
static bool set_uniform(const pkv_grammar *g, const gelem *e, uint32_t lo, uint32_t hi) {
    const uint32_t *r = g->ranges + 2 * e->a;
    for (int i = 0; i < e->b; i++) {
        if (r[2 * i + 1] < lo || r[2 * i] > hi) continue;
        return r[2 * i] <= lo && r[2 * i + 1] >= hi; /* overlapping: uniform only if it covers */
    }
    return true;
}

/* ----------------------------------------------------------------- matcher */

typedef struct gnode {
    int32_t pos, parent;
} gnode;

struct pkv_gmatch {
    const pkv_grammar *g;
    gnode *nodes;        /* [n_nodes] node 0 is the empty stack */
    size_t n_nodes, cap_nodes;
    int32_t *ht;         /* [ht_cap] node ids, -1 empty; open addressing */
    size_t ht_cap;
    int32_t *cur;        /* [n_cur] the state: sorted top-node ids */
    size_t n_cur, cap_cur;
    uint32_t pval;       /* partial UTF-8 code point: bits so far */
    int pleft;           /* continuation bytes still expected (0: at a boundary) */
    int pmin;            /* smallest code point the sequence may encode (overlong check) */
    bool dead;           /* no valid continuation (a state limit was hit) */
    /* work: steps (a stack expanded or tested against a character) of the current
     * operation (a mask, a token's bytes) and since the start, bounded by the
     * grammar's limits; over sets failed and err, and the matcher stays dead */
    uint64_t steps, steps_total, lim_op, lim_total;
    const atomic_bool *cancel; /* set by another thread: stop at the next check */
    bool failed;
    char err[256];
    /* (position, parent) pairs already expanded while computing one state: stacks
     * that meet there (alternatives ending in the same rule, repetitions returning to
     * one parent) are expanded once, so the work is the distinct stacks' count, not
     * the paths' */
    struct vslot *vis;   /* [vis_cap] open addressing; a slot is live when its gen is vis_gen */
    size_t vis_cap, vis_n;
    uint32_t vis_gen;
    bool ended;          /* an end-of-generation token was accepted: complete, nothing may follow */
    /* scratch */
    int32_t *work;       /* [cap_work][2] closure worklist */
    size_t cap_work;
    int32_t *out;        /* [cap_out] closure output */
    size_t n_out, cap_out;
    /* mask walk */
    int32_t *sbuf;       /* states along the trie path, concatenated */
    size_t cap_sbuf;
    struct gcache *cache;
};

static uint64_t node_hash(int32_t pos, int32_t parent) {
    uint64_t x = ((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static bool ht_rehash(pkv_gmatch *m, size_t cap) {
    int32_t *ht = pkv_malloc(cap * sizeof *ht);
    if (!ht) return false;
    memset(ht, 0xff, cap * sizeof *ht);
    for (size_t i = 1; i < m->n_nodes; i++) {
        size_t h = node_hash(m->nodes[i].pos, m->nodes[i].parent) & (cap - 1);
        while (ht[h] >= 0) h = (h + 1) & (cap - 1);
        ht[h] = (int32_t)i;
    }
    pkv_free(m->ht);
    m->ht = ht;
    m->ht_cap = cap;
    return true;
}

/* The node (pos, parent), made if new; -1 on NOMEM. */
static int32_t intern(pkv_gmatch *m, int32_t pos, int32_t parent) {
    size_t h = node_hash(pos, parent) & (m->ht_cap - 1);
    for (int32_t id; (id = m->ht[h]) >= 0; h = (h + 1) & (m->ht_cap - 1))
        if (m->nodes[id].pos == pos && m->nodes[id].parent == parent) return id;
    if (m->n_nodes >= INT32_MAX / 2) return -1;
    if (pkv_grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes)) return -1;
    int32_t id = (int32_t)m->n_nodes++;
    m->nodes[id] = (gnode){pos, parent};
    m->ht[h] = id;
    if (2 * m->n_nodes > m->ht_cap && !ht_rehash(m, 2 * m->ht_cap)) {
        m->n_nodes--; /* the table still has it: take it out again */
        m->ht[h] = -1;
        return -1;
    }
    return id;
}

/* Drop the nodes made since n (newest first, which keeps linear probing valid). */
static void rollback(pkv_gmatch *m, size_t n) {
    while (m->n_nodes > n) {
        int32_t id = (int32_t)--m->n_nodes;
        size_t h = node_hash(m->nodes[id].pos, m->nodes[id].parent) & (m->ht_cap - 1);
        while (m->ht[h] != id) h = (h + 1) & (m->ht_cap - 1);
        m->ht[h] = -1;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

typedef struct vslot {
    uint64_t key;
    uint32_t gen;
} vslot;

static void visit_begin(pkv_gmatch *m) {
    m->vis_n = 0;
    if (++m->vis_gen == 0) { /* wrapped: old stamps could read as live */
        if (m->vis) memset(m->vis, 0, m->vis_cap * sizeof *m->vis);
        m->vis_gen = 1;
    }
}

/* 1 when (pos, parent) is new in this state's computation (and now recorded), 0
 * when it was expanded already, -1 on NOMEM. */
static int visit(pkv_gmatch *m, int32_t pos, int32_t parent) {
    if (2 * (m->vis_n + 1) > m->vis_cap) {
        size_t cap = m->vis_cap ? 2 * m->vis_cap : 1024;
        vslot *t = pkv_calloc(cap, sizeof *t);
        if (!t) return -1;
        for (size_t i = 0; i < m->vis_cap; i++) {
            if (m->vis[i].gen != m->vis_gen) continue;
            size_t h = node_hash((int32_t)(m->vis[i].key >> 32), (int32_t)m->vis[i].key) & (cap - 1);
            while (t[h].gen == m->vis_gen) h = (h + 1) & (cap - 1);
            t[h] = m->vis[i];
        }
        pkv_free(m->vis);
        m->vis = t;
        m->vis_cap = cap;
    }
    uint64_t key = ((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent;
    size_t h = node_hash(pos, parent) & (m->vis_cap - 1);
    for (; m->vis[h].gen == m->vis_gen; h = (h + 1) & (m->vis_cap - 1))
        if (m->vis[h].key == key) return 0;
    m->vis[h] = (vslot){key, m->vis_gen};
    m->vis_n++;
    return 1;
}

/* Count n steps of work; false (with the error recorded) when a limit is passed or
 * the operation was cancelled. */
static bool work_add(pkv_gmatch *m, uint64_t n) {
    uint64_t before = m->steps;
    m->steps += n, m->steps_total += n;
    if (m->failed) return false;
    if (m->steps > m->lim_op) {
        snprintf(m->err, sizeof m->err, "grammar: the work limit of %llu steps per token was passed (the grammar is "
                 "too ambiguous or too deeply repeated for this vocabulary; see --grammar-token-steps)",
                 (unsigned long long)m->lim_op);
    } else if (m->steps_total > m->lim_total) {
        snprintf(m->err, sizeof m->err, "grammar: the work limit of %llu steps per request was passed (the grammar "
                 "is too costly to match for this vocabulary; see --grammar-request-steps)",
                 (unsigned long long)m->lim_total);
    } else if (m->cancel && (before >> 14) != (m->steps >> 14) && atomic_load_explicit(m->cancel, memory_order_relaxed)) {
        snprintf(m->err, sizeof m->err, "grammar: cancelled");
    } else {
        return true;
    }
    m->failed = true;
    pkv_err(PKV_ERR_INVALID, "%s", m->err);
    return false;
}

/* Add to m->out the top nodes of every stack reached from "at element pos, then
 * continue with stack parent" without consuming input. False on a limit/NOMEM. */
static bool closure(pkv_gmatch *m, int32_t pos0, int32_t parent0) {
    const pkv_grammar *g = m->g;
    size_t sp = 0, steps = 0;
    if (pkv_grow((void **)&m->work, &m->cap_work, 16, 2 * sizeof *m->work)) return false;
    m->work[0] = pos0, m->work[1] = parent0;
    sp = 1;
    while (sp) {
        if (!work_add(m, 1)) return false;
        if (++steps > 8 * (size_t)PKV_GRAMMAR_MAX_STACKS) {
            pkv_err(PKV_ERR_INVALID, "grammar: more than %d parse stacks at once (an ambiguous grammar)",
                    PKV_GRAMMAR_MAX_STACKS);
            return false;
        }
        sp--;
        int32_t pos = m->work[2 * sp], parent = m->work[2 * sp + 1];
        int fresh = visit(m, pos, parent);
        if (fresh < 0) return false;
        if (!fresh) continue;
        const gelem *e = &g->elems[pos];
        if (e->kind == GE_END) {
            if (parent == 0) {
                if (pkv_grow((void **)&m->out, &m->cap_out, m->n_out + 1, sizeof *m->out)) return false;
                m->out[m->n_out++] = 0;
            } else {
                m->work[2 * sp] = m->nodes[parent].pos, m->work[2 * sp + 1] = m->nodes[parent].parent;
                sp++;
            }
        } else if (e->kind == GE_SET) {
            int32_t id = intern(m, pos, parent);
            if (id < 0 || pkv_grow((void **)&m->out, &m->cap_out, m->n_out + 1, sizeof *m->out)) return false;
            m->out[m->n_out++] = id;
        } else {
            int32_t cont = parent;
            if (g->elems[pos + 1].kind != GE_END && (cont = intern(m, pos + 1, parent)) < 0) return false;
            int32_t a0 = g->alt_off[e->a], a1 = g->alt_off[e->a + 1];
            if (pkv_grow((void **)&m->work, &m->cap_work, sp + (size_t)(a1 - a0) + 1, 2 * sizeof *m->work)) return false;
            for (int32_t a = a1 - 1; a >= a0; a--) {
                m->work[2 * sp] = g->alts[a], m->work[2 * sp + 1] = cont;
                sp++;
            }
        }
    }
    return true;
}

/* Sort and dedupe m->out; false when it exceeds the stack limit. */
static bool out_finish(pkv_gmatch *m) {
    if (m->n_out > 1) {
        qsort(m->out, m->n_out, sizeof *m->out, cmp_i32);
        size_t k = 1;
        for (size_t i = 1; i < m->n_out; i++)
            if (m->out[i] != m->out[k - 1]) m->out[k++] = m->out[i];
        m->n_out = k;
    }
    if (m->n_out > PKV_GRAMMAR_MAX_STACKS) {
        pkv_err(PKV_ERR_INVALID, "grammar: more than %d parse stacks at once (an ambiguous grammar)",
                PKV_GRAMMAR_MAX_STACKS);
        return false;
    }
    return true;
}

/* m->out = the state after code point c from the state st[0..n). False on a limit. */
static bool step_cp(pkv_gmatch *m, const int32_t *st, size_t n, uint32_t c) {
    m->n_out = 0;
    visit_begin(m);
    if (!work_add(m, n)) return false;
    for (size_t i = 0; i < n; i++) {
        if (st[i] == 0) continue;
        const gnode nd = m->nodes[st[i]];
        if (set_has(m->g, &m->g->elems[nd.pos], c) && !closure(m, nd.pos + 1, nd.parent)) return false;
    }
    return out_finish(m);
}

/* Partial UTF-8 state: value so far, bytes left, minimum code point. */
typedef struct utf8p {
    uint32_t val;
    int left, min;
} utf8p;

/* One byte from state (st, u): 1 ok with m->out / *nu the new state (m->out is
 * only set when a code point completed: *completed), 0 rejected, -1 limit. */
static int step_byte(pkv_gmatch *m, const int32_t *st, size_t n, utf8p u, uint8_t b, utf8p *nu, bool *completed) {
    *completed = false;
    uint32_t c;
    if (u.left == 0) {
        if (b < 0x80) {
            c = b;
            *nu = (utf8p){0, 0, 0};
            goto full;
        }
        if (b < 0xc2 || b > 0xf4) return 0;
        int left = b < 0xe0 ? 1 : b < 0xf0 ? 2 : 3;
        *nu = (utf8p){b & (0x3fu >> left), left, left == 1 ? 0x80 : left == 2 ? 0x800 : 0x10000};
    } else {
        if ((b & 0xc0) != 0x80) return 0;
        *nu = (utf8p){(u.val << 6) | (b & 0x3f), u.left - 1, u.min};
        if (nu->left == 0) {
            c = nu->val;
            if ((int)c < u.min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
            *nu = (utf8p){0, 0, 0};
            goto full;
        }
    }
    /* still partial: is some code point it may become allowed by a top? */
    uint32_t lo = nu->val << (6 * nu->left), hi = lo | ((1u << (6 * nu->left)) - 1);
    if (lo < (uint32_t)nu->min) lo = (uint32_t)nu->min;
    if (hi > 0x10ffff) hi = 0x10ffff;
    /* the surrogates D800..DFFF are no code points: a prefix that can only become one
     * (ED A0..BF) is rejected here, or nothing could follow it */
    uint32_t r[2][2] = {{lo, hi}, {1, 0}};
    if (lo <= 0xdfff && hi >= 0xd800) {
        r[0][1] = 0xd7ff, r[1][0] = 0xe000, r[1][1] = hi;
        if (lo >= 0xd800) r[0][0] = 1, r[0][1] = 0; /* empty */
    }
    if (!work_add(m, n)) return -1;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; r[k][0] <= r[k][1] && i < n; i++)
            if (st[i] != 0 && set_meets(m->g, &m->g->elems[m->nodes[st[i]].pos], r[k][0], r[k][1])) return 1;
    return 0;
full:
    *completed = true;
    if (!step_cp(m, st, n, c)) return -1;
    return m->n_out ? 1 : 0;
}

static bool set_cur(pkv_gmatch *m, const int32_t *st, size_t n) {
    if (pkv_grow((void **)&m->cur, &m->cap_cur, n ? n : 1, sizeof *m->cur)) return false;
    memmove(m->cur, st, n * sizeof *st);
    m->n_cur = n;
    return true;
}

static void cache_free(pkv_gmatch *m);

void pkv_gmatch_reset(pkv_gmatch *m) {
    if (!m) return;
    cache_free(m); /* its states name nodes that the rollback below recycles */
    rollback(m, 1);
    m->pval = 0, m->pleft = 0, m->pmin = 0;
    m->dead = m->ended = false;
    m->n_out = 0;
    m->steps = m->steps_total = 0;
    m->failed = false;
    m->err[0] = 0;
    int32_t root = m->g->root;
    bool ok = true;
    visit_begin(m);
    for (int32_t a = m->g->alt_off[root]; ok && a < m->g->alt_off[root + 1]; a++) ok = closure(m, m->g->alts[a], 0);
    if (!ok || !out_finish(m) || !set_cur(m, m->out, m->n_out)) m->dead = true;
}

void pkv_gmatch_free(pkv_gmatch *m) {
    if (!m) return;
    pkv_free(m->nodes);
    pkv_free(m->ht);
    pkv_free(m->cur);
    pkv_free(m->work);
    pkv_free(m->out);
    pkv_free(m->sbuf);
    pkv_free(m->vis);
    cache_free(m);
    pkv_grammar_free((pkv_grammar *)m->g);
    pkv_free(m);
}

pkv_gmatch *pkv_gmatch_create(const pkv_grammar *g) {
    if (!g) {
        pkv_err(PKV_ERR_INVALID, "grammar: NULL");
        return NULL;
    }
    pkv_gmatch *m = pkv_calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->g = pkv_grammar_retain(g);
    m->lim_op = g->work_token, m->lim_total = g->work_request;
    m->cap_nodes = 256;
    m->nodes = pkv_malloc(m->cap_nodes * sizeof *m->nodes);
    if (!m->nodes || !ht_rehash(m, 512)) goto nomem;
    m->nodes[0] = (gnode){-1, -1};
    m->n_nodes = 1;
    pkv_gmatch_reset(m);
    if (m->dead) {
        pkv_gmatch_free(m);
        return NULL;
    }
    return m;
nomem:
    pkv_gmatch_free(m);
    pkv_err(PKV_ERR_NOMEM, "grammar: out of memory for a matcher");
    return NULL;
}

pkv_gmatch *pkv_gmatch_clone(const pkv_gmatch *src) {
    pkv_gmatch *m = pkv_calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->g = pkv_grammar_retain(src->g);
    m->nodes = pkv_malloc(src->cap_nodes * sizeof *m->nodes);
    m->ht = pkv_malloc(src->ht_cap * sizeof *m->ht);
    m->cur = pkv_malloc((src->n_cur ? src->n_cur : 1) * sizeof *m->cur);
    if (!m->nodes || !m->ht || !m->cur) goto nomem;
    memcpy(m->nodes, src->nodes, src->n_nodes * sizeof *m->nodes);
    memcpy(m->ht, src->ht, src->ht_cap * sizeof *m->ht);
    memcpy(m->cur, src->cur, src->n_cur * sizeof *m->cur);
    m->n_nodes = src->n_nodes, m->cap_nodes = src->cap_nodes, m->ht_cap = src->ht_cap;
    m->n_cur = m->cap_cur = src->n_cur ? src->n_cur : 1;
    m->n_cur = src->n_cur;
    m->pval = src->pval, m->pleft = src->pleft, m->pmin = src->pmin, m->dead = src->dead;
    m->ended = src->ended;
    m->steps_total = src->steps_total, m->lim_op = src->lim_op, m->lim_total = src->lim_total;
    m->cancel = src->cancel, m->failed = src->failed;
    memcpy(m->err, src->err, sizeof m->err);
    return m;
nomem:
    pkv_gmatch_free(m);
    pkv_err(PKV_ERR_NOMEM, "grammar: out of memory cloning a matcher");
    return NULL;
}

bool pkv_gmatch_accept_bytes(pkv_gmatch *m, const void *bytes, size_t n) {
    if (!m || m->dead || m->ended) return false;
    m->steps = 0;
    const uint8_t *b = bytes;
    size_t mark = m->n_nodes;
    utf8p u = {m->pval, m->pleft, m->pmin};
    /* work on a private copy of the state so a rejection changes nothing */
    int32_t *st = pkv_malloc((m->n_cur ? m->n_cur : 1) * sizeof *st);
    if (!st) return false;
    memcpy(st, m->cur, m->n_cur * sizeof *st);
    size_t ns = m->n_cur;
    for (size_t i = 0; i < n; i++) {
        utf8p nu;
        bool full;
        int r = step_byte(m, st, ns, u, b[i], &nu, &full);
        if (r <= 0) {
            pkv_free(st);
            rollback(m, mark);
            if (m->failed) m->dead = true; /* a work limit: no later token would fare better */
            return false;
        }
        if (full) {
            int32_t *t = pkv_realloc(st, (m->n_out ? m->n_out : 1) * sizeof *st);
            if (!t) {
                pkv_free(st);
                rollback(m, mark);
                return false;
            }
            st = t;
            memcpy(st, m->out, m->n_out * sizeof *st);
            ns = m->n_out;
        }
        u = nu;
    }
    if (!set_cur(m, st, ns)) {
        pkv_free(st);
        rollback(m, mark);
        return false;
    }
    pkv_free(st);
    m->pval = u.val, m->pleft = u.left, m->pmin = u.min;
    return true;
}

bool pkv_gmatch_complete(const pkv_gmatch *m) {
    if (m && m->ended) return true;
    return m && !m->dead && m->pleft == 0 && m->n_cur > 0 && m->cur[0] == 0;
}

bool pkv_gmatch_dead(const pkv_gmatch *m) {
    return !m || m->dead || m->ended || m->n_cur == 0 || (m->n_cur == 1 && m->cur[0] == 0 && m->pleft == 0);
}

bool pkv_grammar_accepts(const pkv_grammar *g, const char *text, size_t len) {
    pkv_gmatch *m = pkv_gmatch_create(g);
    bool ok = m && pkv_gmatch_accept_bytes(m, text, len) && pkv_gmatch_complete(m);
    pkv_gmatch_free(m);
    return ok;
}

/* ------------------------------------------------------------- vocabulary */

enum { TRIE_BIG = 4 }; /* subtrees with at least this many tokens keep their byte set */

typedef struct tnode {
    uint32_t end;     /* preorder index after this node's subtree */
    uint32_t lo, mid, hi; /* tokens ord[lo, mid) end here, ord[mid, hi) below */
    int32_t bits;     /* index into bset (subtrees of >= TRIE_BIG tokens), -1 otherwise */
    uint8_t byte;     /* the edge from the parent */
} tnode;

typedef struct tbits {
    uint64_t ascii[2]; /* ASCII bytes on edges below the node */
    bool high;         /* some byte >= 0x80 below */
    bool utf8_ok;      /* every token below is valid UTF-8 (a prefix of it) on its own */
} tbits;

struct pkv_grammar_vocab {
    int32_t n_vocab;
    tnode *nodes;     /* [n_nodes] preorder; node 0 the root (empty prefix) */
    size_t n_nodes;
    tbits *bset;
    size_t n_bset;
    int32_t *ord;     /* [n_ord] token ids in trie order */
    size_t n_ord;
    uint8_t **piece;  /* [n_vocab] bytes of each token (NULL: never allowed) */
    uint32_t *plen;   /* [n_vocab] */
    uint8_t *eog;     /* [n_vocab] end-of-generation token */
    int32_t *eog_ids;
    int n_eog;
};

static bool utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        int k = b < 0x80 ? 0 : b >= 0xc2 && b < 0xe0 ? 1 : b >= 0xe0 && b < 0xf0 ? 2 : b >= 0xf0 && b <= 0xf4 ? 3 : -1;
        if (k < 0) return false;
        for (int j = 1; j <= k; j++)
            if (i + (size_t)j < n && (s[i + (size_t)j] & 0xc0) != 0x80) return false;
        /* the second byte's narrower ranges: no overlong forms, surrogates or > U+10FFFF */
        if (k > 1 && i + 1 < n) {
            uint8_t c = s[i + 1];
            if ((b == 0xe0 && c < 0xa0) || (b == 0xed && c > 0x9f) || (b == 0xf0 && c < 0x90) || (b == 0xf4 && c > 0x8f))
                return false;
        }
        i += (size_t)k + 1;
    }
    return true;
}

static _Thread_local const pkv_grammar_vocab *g_sort_vocab; /* qsort has no context argument; building is single-threaded per call */

static int cmp_piece(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const pkv_grammar_vocab *v = g_sort_vocab;
    size_t lx = v->plen[x], ly = v->plen[y];
    int c = memcmp(v->piece[x], v->piece[y], PKV_MIN(lx, ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (y > x);
}

/* Preorder trie of ord[lo, hi) (sorted, sharing the first depth bytes). */
static bool trie_build(pkv_grammar_vocab *v, size_t *cap, size_t lo, size_t hi, size_t depth, uint8_t byte,
                       size_t *cap_b, tbits *acc) {
    if (pkv_grow((void **)&v->nodes, cap, v->n_nodes + 1, sizeof *v->nodes)) return false;
    size_t me = v->n_nodes++;
    size_t mid = lo;
    while (mid < hi && v->plen[v->ord[mid]] == depth) mid++;
    v->nodes[me] = (tnode){0, (uint32_t)lo, (uint32_t)mid, (uint32_t)hi, -1, byte};
    tbits mine = {{0, 0}, false, true};
    for (size_t i = lo; i < mid; i++)
        if (!utf8_valid_prefix(v->piece[v->ord[i]], v->plen[v->ord[i]])) mine.utf8_ok = false;
    for (size_t i = mid; i < hi;) {
        uint8_t b = v->piece[v->ord[i]][depth];
        size_t j = i;
        while (j < hi && v->piece[v->ord[j]][depth] == b) j++;
        tbits sub;
        if (!trie_build(v, cap, i, j, depth + 1, b, cap_b, &sub)) return false;
        if (b < 0x80) mine.ascii[b >> 6] |= 1ull << (b & 63);
        else mine.high = true;
        mine.ascii[0] |= sub.ascii[0], mine.ascii[1] |= sub.ascii[1];
        mine.high |= sub.high;
        mine.utf8_ok &= sub.utf8_ok;
        i = j;
    }
    v->nodes[me].end = (uint32_t)v->n_nodes;
    if (hi - mid >= TRIE_BIG) {
        if (pkv_grow((void **)&v->bset, cap_b, v->n_bset + 1, sizeof *v->bset)) return false;
        v->nodes[me].bits = (int32_t)v->n_bset;
        v->bset[v->n_bset++] = mine;
    }
    *acc = mine;
    return true;
}

void pkv_grammar_vocab_free(pkv_grammar_vocab *v) {
    if (!v) return;
    if (v->piece)
        for (int32_t i = 0; i < v->n_vocab; i++) pkv_free(v->piece[i]);
    pkv_free(v->piece);
    pkv_free(v->plen);
    pkv_free(v->eog);
    pkv_free(v->eog_ids);
    pkv_free(v->nodes);
    pkv_free(v->bset);
    pkv_free(v->ord);
    pkv_free(v);
}

/* Fill v->ord and the trie from v->piece/plen/eog. */
static pkv_grammar_vocab *vocab_finish(pkv_grammar_vocab *v) {
    v->ord = pkv_malloc(((size_t)v->n_vocab + 1) * sizeof *v->ord);
    v->eog_ids = pkv_malloc(((size_t)v->n_vocab + 1) * sizeof *v->eog_ids);
    if (!v->ord || !v->eog_ids) goto nomem;
    for (int32_t i = 0; i < v->n_vocab; i++) {
        if (v->eog[i]) v->eog_ids[v->n_eog++] = i;
        else if (v->plen[i]) v->ord[v->n_ord++] = i;
    }
    g_sort_vocab = v;
    qsort(v->ord, v->n_ord, sizeof *v->ord, cmp_piece);
    size_t cap = 0, cap_b = 0;
    tbits acc;
    if (!trie_build(v, &cap, 0, v->n_ord, 0, 0, &cap_b, &acc)) goto nomem;
    return v;
nomem:
    pkv_grammar_vocab_free(v);
    pkv_err(PKV_ERR_NOMEM, "grammar: out of memory for the vocabulary trie");
    return NULL;
}

static pkv_grammar_vocab *vocab_alloc(int32_t n) {
    pkv_grammar_vocab *v = pkv_calloc(1, sizeof *v);
    if (!v) return NULL;
    v->n_vocab = n;
    v->piece = pkv_calloc((size_t)n + 1, sizeof *v->piece);
    v->plen = pkv_calloc((size_t)n + 1, sizeof *v->plen);
    v->eog = pkv_calloc((size_t)n + 1, 1);
    if (!v->piece || !v->plen || !v->eog) {
        pkv_grammar_vocab_free(v);
        return NULL;
    }
    return v;
}

pkv_grammar_vocab *pkv_grammar_vocab_from_pieces(const char *const *pieces, const size_t *lens, int32_t n,
                                                 const int32_t *eog, int n_eog) {
    if (n <= 0 || !pieces || !lens) {
        pkv_err(PKV_ERR_INVALID, "grammar vocabulary: no tokens");
        return NULL;
    }
    pkv_grammar_vocab *v = vocab_alloc(n);
    if (!v) goto nomem;
    for (int i = 0; i < n_eog; i++)
        if (eog[i] >= 0 && eog[i] < n) v->eog[eog[i]] = 1;
    for (int32_t i = 0; i < n; i++) {
        if (!lens[i] || v->eog[i]) continue;
        if (!(v->piece[i] = pkv_malloc(lens[i]))) goto nomem;
        memcpy(v->piece[i], pieces[i], lens[i]);
        v->plen[i] = (uint32_t)lens[i];
    }
    return vocab_finish(v);
nomem:
    pkv_grammar_vocab_free(v);
    pkv_err(PKV_ERR_NOMEM, "grammar: out of memory for the vocabulary");
    return NULL;
}

pkv_grammar_vocab *pkv_grammar_vocab_create(const pkv_model *m) {
    pkv_model_info info;
    if (!m || pkv_model_get_info(m, &info)) {
        pkv_err(PKV_ERR_INVALID, "grammar vocabulary: NULL model");
        return NULL;
    }
    if (!info.has_vocab) {
        pkv_err(PKV_ERR_UNSUPPORTED, "grammar vocabulary: the model has no vocabulary (tokenizer.ggml.model = none): "
                "constrained output needs each token's text");
        return NULL;
    }
    int32_t n = info.n_vocab;
    pkv_grammar_vocab *v = vocab_alloc(n);
    char buf[1024];
    if (!v) goto nomem;
    for (int32_t i = 0; i < n; i++) {
        if (pkv_model_is_eog(m, i)) {
            v->eog[i] = 1;
            continue;
        }
        size_t len = 0;
        /* control tokens have no text without render_special: never allowed */
        pkv_status s = pkv_model_token_piece(m, i, false, buf, sizeof buf, &len);
        if (s != PKV_OK && len <= sizeof buf) continue; /* beyond the tokenizer's ids */
        if (!len) continue;
        if (!(v->piece[i] = pkv_malloc(len))) goto nomem;
        if (len > sizeof buf) {
            if (pkv_model_token_piece(m, i, false, (char *)v->piece[i], len, &len)) continue;
        } else {
            memcpy(v->piece[i], buf, len);
        }
        v->plen[i] = (uint32_t)len;
    }
    return vocab_finish(v);
nomem:
    pkv_grammar_vocab_free(v);
    pkv_err(PKV_ERR_NOMEM, "grammar: out of memory for the vocabulary of %d tokens", (int)n);
    return NULL;
}

int32_t pkv_grammar_vocab_n(const pkv_grammar_vocab *v) { return v ? v->n_vocab : 0; }

bool pkv_grammar_vocab_is_eog(const pkv_grammar_vocab *v, int32_t t) {
    return v && t >= 0 && t < v->n_vocab && v->eog[t];
}

bool pkv_gmatch_accept_token(pkv_gmatch *m, const pkv_grammar_vocab *v, int32_t t) {
    if (!m || !v || t < 0 || t >= v->n_vocab || m->dead || m->ended) return false;
    if (v->eog[t]) {
        if (!pkv_gmatch_complete(m)) return false;
        m->ended = true;
        return true;
    }
    if (!v->plen[t]) return false;
    return pkv_gmatch_accept_bytes(m, v->piece[t], v->plen[t]);
}

/* --------------------------------------------------------------- masks */

enum { MEMO_MAX = 256, CACHE_N = 8 };

/* Loop sets of states met during one mask walk: which bytes take the state back
 * to itself. */
typedef struct memo {
    uint64_t hash;
    size_t off, n;         /* the state's tops in walk->marena */
    uint64_t known[2], yes[2];
    int8_t high;           /* -1 unknown, 0 no, 1 every code point >= 0x80 loops */
} memo;

typedef struct walk {
    pkv_gmatch *m;
    const pkv_grammar_vocab *v;
    uint64_t *bits;
    int64_t n_set;
    memo memo[MEMO_MAX];
    int n_memo;
    int32_t *marena;
    size_t n_marena, cap_marena;
    bool fail;
} walk;

typedef struct gcache {
    bool valid[CACHE_N];
    uint64_t hash[CACHE_N];
    int32_t *tops[CACHE_N];
    size_t n_tops[CACHE_N];
    utf8p u[CACHE_N];
    bool complete[CACHE_N];
    uint64_t *bits[CACHE_N];
    int64_t count[CACHE_N];
    int next;
    size_t words;
} gcache;

static void cache_free(pkv_gmatch *m) {
    gcache *c = m->cache;
    if (!c) return;
    for (int i = 0; i < CACHE_N; i++) {
        pkv_free(c->tops[i]);
        pkv_free(c->bits[i]);
    }
    pkv_free(c);
    m->cache = NULL;
}

static uint64_t state_hash(const int32_t *st, size_t n, utf8p u) {
    return pkv_hash64(st, n * sizeof *st, ((uint64_t)u.val << 8) ^ (uint64_t)u.left);
}

static void set_tokens(walk *w, uint32_t lo, uint32_t hi) {
    for (uint32_t i = lo; i < hi; i++) {
        int32_t t = w->v->ord[i];
        w->bits[t >> 6] |= 1ull << (t & 63);
    }
    w->n_set += hi - lo;
}

static bool same_state(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && !memcmp(a, b, na * sizeof *a);
}

/* The memo entry of state st (at a boundary); NULL when full. */
static memo *memo_get(walk *w, const int32_t *st, size_t n) {
    uint64_t h = state_hash(st, n, (utf8p){0, 0, 0});
    for (int i = 0; i < w->n_memo; i++)
        if (w->memo[i].hash == h && same_state(w->marena + w->memo[i].off, w->memo[i].n, st, n)) return &w->memo[i];
    if (w->n_memo == MEMO_MAX) return NULL;
    if (pkv_grow((void **)&w->marena, &w->cap_marena, w->n_marena + n + 1, sizeof *w->marena)) return NULL;
    memo *e = &w->memo[w->n_memo++];
    memset(e, 0, sizeof *e);
    e->hash = h;
    e->off = w->n_marena;
    e->n = n;
    e->high = -1;
    memcpy(w->marena + w->n_marena, st, n * sizeof *st);
    w->n_marena += n;
    return e;
}

/* Does byte b (ASCII) take the memo's state back to itself? */
static bool memo_byte(walk *w, memo *e, uint32_t b) {
    int k = (int)(b >> 6);
    uint64_t bit = 1ull << (b & 63);
    if (!(e->known[k] & bit)) {
        pkv_gmatch *m = w->m;
        const int32_t *es = w->marena + e->off;
        if (!step_cp(m, es, e->n, b)) {
            w->fail = true;
            return false;
        }
        e->known[k] |= bit;
        if (same_state(m->out, m->n_out, es, e->n)) e->yes[k] |= bit;
    }
    return (e->yes[k] & bit) != 0;
}

/* Does every code point >= 0x80 take the memo's state back to itself? */
static bool memo_high(walk *w, memo *e) {
    if (e->high < 0) {
        pkv_gmatch *m = w->m;
        const int32_t *es = w->marena + e->off;
        bool uni = true;
        for (size_t i = 0; i < e->n && uni; i++)
            if (es[i] != 0) uni = set_uniform(m->g, &m->g->elems[m->nodes[es[i]].pos], 0x80, 0x10ffff);
        e->high = 0;
        if (uni) {
            if (!step_cp(m, es, e->n, 0x80)) {
                w->fail = true;
                return false;
            }
            e->high = same_state(m->out, m->n_out, es, e->n);
        }
    }
    return e->high == 1;
}

/* Does every byte string of a subtree with byte set tb keep the memo's state (at a
 * boundary) and come back to it? Then all its tokens are allowed. */
static bool subtree_loops(walk *w, memo *e, const tbits *tb) {
    if (!tb->utf8_ok) return false;
    for (int k = 0; k < 2; k++)
        for (uint64_t need = tb->ascii[k]; need; need &= need - 1)
            if (!memo_byte(w, e, (uint32_t)(k * 64 + __builtin_ctzll(need)))) return false;
    return !tb->high || memo_high(w, e);
}

/* Walk the children of trie node ni from state (st at sbuf offset so, n tops, u);
 * me: the state's memo entry when known (at a boundary), else NULL. */
static void walk_node(walk *w, size_t ni, size_t so, size_t n, utf8p u, memo *me) {
    const pkv_grammar_vocab *v = w->v;
    pkv_gmatch *m = w->m;
    const tnode *pn = &v->nodes[ni];
    if (!me && u.left == 0 && pn->bits >= 0 && !(n == 1 && m->sbuf[so] == 0)) me = memo_get(w, m->sbuf + so, n);
    for (size_t ci = ni + 1; ci < pn->end && !w->fail; ci = v->nodes[ci].end) {
        const tnode *c = &v->nodes[ci];
        const tbits *cb = c->bits >= 0 ? &v->bset[c->bits] : NULL;
        if (me) { /* the state loops on some bytes: children along them need no step */
            if (c->byte < 0x80 && memo_byte(w, me, c->byte)) {
                set_tokens(w, c->lo, c->mid);
                if (c->mid == c->hi) continue;
                if (cb && subtree_loops(w, me, cb)) set_tokens(w, c->mid, c->hi);
                else walk_node(w, ci, so, n, u, me);
                continue;
            }
            /* a lead byte of a code point the state loops on, over a subtree that loops */
            if (c->byte >= 0xc2 && cb && memo_high(w, me) && subtree_loops(w, me, cb)) {
                set_tokens(w, c->lo, c->hi);
                continue;
            }
            if (w->fail) return;
        }
        utf8p nu;
        bool full;
        int r = step_byte(m, m->sbuf + so, n, u, c->byte, &nu, &full);
        if (r < 0) {
            w->fail = true;
            return;
        }
        if (r == 0) continue;
        /* the child's state goes after ours in sbuf */
        size_t no = so + n, nn = full ? m->n_out : n;
        if (pkv_grow((void **)&m->sbuf, &m->cap_sbuf, no + nn + 1, sizeof *m->sbuf)) {
            w->fail = true;
            return;
        }
        memcpy(m->sbuf + no, full ? m->out : m->sbuf + so, nn * sizeof *m->sbuf);
        set_tokens(w, c->lo, c->mid);
        if (c->mid == c->hi) continue;
        memo *ce = NULL;
        if (cb && nu.left == 0 && !(nn == 1 && m->sbuf[no] == 0)) {
            ce = memo_get(w, m->sbuf + no, nn);
            if (ce && subtree_loops(w, ce, cb)) {
                set_tokens(w, c->mid, c->hi);
                continue;
            }
        }
        if (w->fail) return;
        walk_node(w, ci, no, nn, nu, ce);
    }
}

int64_t pkv_gmatch_mask(pkv_gmatch *m, const pkv_grammar_vocab *v, uint64_t *bits) {
    size_t words = ((size_t)v->n_vocab + 63) / 64;
    memset(bits, 0, words * sizeof *bits);
    if (m->failed) {
        pkv_err(PKV_ERR_INVALID, "%s", m->err);
        return -1;
    }
    if (m->dead || m->ended) return 0;
    m->steps = 0;
    utf8p u = {m->pval, m->pleft, m->pmin};
    bool complete = pkv_gmatch_complete(m);
    uint64_t h = state_hash(m->cur, m->n_cur, u);
    gcache *c = m->cache;
    if (!c) {
        c = m->cache = pkv_calloc(1, sizeof *c);
        if (c) c->words = words;
    }
    if (c && c->words == words)
        for (int i = 0; i < CACHE_N; i++)
            if (c->valid[i] && c->hash[i] == h && c->complete[i] == complete && c->u[i].val == u.val &&
                c->u[i].left == u.left && same_state(c->tops[i], c->n_tops[i], m->cur, m->n_cur)) {
                memcpy(bits, c->bits[i], words * sizeof *bits);
                return c->count[i];
            }
    walk w;
    memset(&w, 0, sizeof w);
    w.m = m, w.v = v, w.bits = bits;
    size_t mark = m->n_nodes;
    if (pkv_grow((void **)&m->sbuf, &m->cap_sbuf, m->n_cur + 1, sizeof *m->sbuf)) {
        pkv_err(PKV_ERR_NOMEM, "grammar: out of memory for a mask");
        return -1;
    }
    memcpy(m->sbuf, m->cur, m->n_cur * sizeof *m->sbuf);
    walk_node(&w, 0, 0, m->n_cur, u, NULL);
    rollback(m, mark);
    pkv_free(w.marena);
    if (w.fail) {
        if (m->failed) m->dead = true;
        return -1;
    }
    if (complete)
        for (int i = 0; i < v->n_eog; i++) {
            int32_t t = v->eog_ids[i];
            bits[t >> 6] |= 1ull << (t & 63);
            w.n_set++;
        }
    if (c && c->words == words) { /* remember it (round robin) */
        int i = c->next;
        c->next = (c->next + 1) % CACHE_N;
        int32_t *tops = pkv_realloc(c->tops[i], (m->n_cur ? m->n_cur : 1) * sizeof *tops);
        uint64_t *b = c->bits[i] ? c->bits[i] : pkv_malloc(words * sizeof *b);
        if (tops) c->tops[i] = tops;
        if (b) c->bits[i] = b;
        c->valid[i] = tops && b;
        if (c->valid[i]) {
            memcpy(tops, m->cur, m->n_cur * sizeof *tops);
            c->n_tops[i] = m->n_cur;
            memcpy(b, bits, words * sizeof *b);
            c->hash[i] = h, c->u[i] = u, c->complete[i] = complete, c->count[i] = w.n_set;
        }
    }
    return w.n_set;
}

void pkv_gmatch_set_cancel(pkv_gmatch *m, const atomic_bool *flag) {
    if (m) m->cancel = flag;
}

const char *pkv_gmatch_failure(const pkv_gmatch *m) { return m && m->failed ? m->err : NULL; }

void pkv_gmatch_work(const pkv_gmatch *m, uint64_t *last_op, uint64_t *total) {
    *last_op = m ? m->steps : 0;
    *total = m ? m->steps_total : 0;
}
