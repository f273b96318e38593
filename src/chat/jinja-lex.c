/* The Jinja interpreter's lexer: template text to tokens (text, comments, the
 * inside of {{ }} and {% %} tags with whitespace control), positions counted for
 * error messages. */
#include "chat/jinja-impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static void *lx_alloc(lexer *L, size_t n) {
    void *p = pkv_jj_arena_get(L->ar, n);
    if (!p) pkv_jj_fail_at(L->j, PKV_JINJA_ELIMIT, 0, 0, "the template needs more than 256 MiB to compile (the compile memory limit)");
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
            pkv_jj_fail_at(L->j, PKV_JINJA_ELIMIT, 0, 0, "the template has too many tokens to compile in 256 MiB (the compile memory limit)");
        tok *q = realloc(L->toks, nc * sizeof *q);
        if (!q) pkv_jj_fail_at(L->j, PKV_JINJA_ENOMEM, 0, 0, "out of memory parsing the template");
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

_Noreturn void pkv_jj_lex_fail(lexer *L, size_t at, const char *msg) {
    int line, col;
    where(L, at, &line, &col);
    pkv_jj_fail_at(L->j, PKV_JINJA_ESYNTAX, line, col, "%s", msg);
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
    if (end >= L->len) pkv_jj_lex_fail(L, at, "unterminated string");
    char *out = lx_alloc(L, end - L->pos + 1);
    size_t n = 0;
    for (;;) {
        if (L->pos >= L->len) pkv_jj_lex_fail(L, at, "unterminated string");
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
        if (L->pos >= L->len) pkv_jj_lex_fail(L, L->len, expr ? "'}}' expected before the end of the template" : "'%}' expected before the end of the template");
        size_t at = L->pos;
        char c = s[at];
        if (depth == 0) {
            size_t p = at;
            if (c == '-' && p + 2 < L->len && s[p + 2] == '}' && (s[p + 1] == '}' || s[p + 1] == '%')) p++;
            else if (c == '+' && p + 2 < L->len && s[p + 2] == '}' && s[p + 1] == '%') p++;
            if (p + 1 < L->len && s[p + 1] == '}' && (s[p] == '}' || s[p] == '%')) {
                if ((s[p] == '}') != expr) pkv_jj_lex_fail(L, at, expr ? "'}}' expected, found '%}'" : "'%}' expected, found '}}'");
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
            if (m == 1 && !strchr("+-*/%~<>=()[]{}.,:|", c)) pkv_jj_lex_fail(L, at, "unexpected character in a tag");
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

void pkv_jj_lex(lexer *L) {
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
            if (p + 1 >= L->len) pkv_jj_lex_fail(L, at, "unterminated comment");
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
