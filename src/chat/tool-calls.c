/* Reasoning and tool calls in the model's own output formats (tool-calls.h).
 *
 * One parser per family reads the generated text from the start. A partial parse
 * (the stream) holds back what may still turn into a marker, and reports the last
 * call with the arguments written so far; fields only ever grow, so a stream's
 * deltas are the differences between successive parses (as llama.cpp streams). */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat/tool-calls.h"

/* ------------------------------------------------------------ detection */

static bool has(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == m[0] && !memcmp(s + i, m, k)) return true;
    return false;
}

#define FW "\xef\xbd\x9c" /* ｜ */
#define SP "\xe2\x96\x81" /* ▁ */
#define DS_CALLS_BEGIN "<" FW "tool" SP "calls" SP "begin" FW ">"
#define DS_CALLS_END "<" FW "tool" SP "calls" SP "end" FW ">"
#define DS_CALL_BEGIN "<" FW "tool" SP "call" SP "begin" FW ">"
#define DS_CALL_END "<" FW "tool" SP "call" SP "end" FW ">"
#define DS_SEP "<" FW "tool" SP "sep" FW ">"

pkv_tc_format pkv_tc_detect(const char *t, size_t n, bool *think) {
    *think = t && has(t, n, "<think>");
    if (!t) return PKV_TC_NONE;
    if (has(t, n, "<|channel|>")) return PKV_TC_GPT_OSS;
    if (has(t, n, DS_CALLS_BEGIN)) return PKV_TC_DEEPSEEK;
    if (has(t, n, "[TOOL_CALLS]")) return PKV_TC_MISTRAL;
    if (has(t, n, "<tool_call>")) return PKV_TC_HERMES;
    if (has(t, n, "<|python_tag|>") || (has(t, n, "<|start_header_id|>") && has(t, n, "tools"))) return PKV_TC_LLAMA3;
    return PKV_TC_NONE;
}

const char *pkv_tc_name(pkv_tc_format f) {
    static const char *const k[] = {"none", "hermes", "llama3", "mistral", "gpt-oss", "deepseek", "json"};
    return f >= PKV_TC_NONE && f <= PKV_TC_JSON ? k[f] : "?";
}

/* ------------------------------------------------------------- helpers */

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

typedef struct P {
    const pkv_tc_opts *o;
    bool partial, oom;
    sb reasoning, content;
    pkv_tc_call *calls;
    int n_calls, cap_calls;
} P;

static void sb_put(P *p, sb *b, const char *s, size_t n) {
    if (p->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2 + 32;
        char *q = realloc(b->p, nc);
        if (!q) {
            p->oom = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && ws(s[i])) i++;
    return i;
}

static size_t rtrim(const char *s, size_t n) {
    while (n && ws(s[n - 1])) n--;
    return n;
}

static const char *find(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == m[0] && !memcmp(s + i, m, k)) return s + i;
    return NULL;
}

static bool starts(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    return n >= k && !memcmp(s, m, k);
}

/* s[0..n) is a proper, non-empty-or-empty prefix of m (more text may complete it). */
static bool is_prefix(const char *s, size_t n, const char *m) { return n < strlen(m) && !memcmp(s, m, n); }

/* The longest suffix of s[0..n) that is a proper prefix of m. */
static size_t tail(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    for (size_t l = k - 1 < n ? k - 1 : n; l > 0; l--)
        if (!memcmp(s + n - l, m, l)) return l;
    return 0;
}

static void content(P *p, const char *s, size_t n) { sb_put(p, &p->content, s, n); }

static void add_call(P *p, const char *name, size_t nlen, const char *args, size_t alen, bool complete) {
    if (p->oom) return;
    if (p->n_calls == p->cap_calls) {
        int nc = p->cap_calls ? p->cap_calls * 2 : 4;
        pkv_tc_call *c = realloc(p->calls, (size_t)nc * sizeof *c);
        if (!c) {
            p->oom = true;
            return;
        }
        p->calls = c;
        p->cap_calls = nc;
    }
    char *nm = malloc(nlen + 1), *a = malloc(alen + 1);
    if (!nm || !a) {
        free(nm);
        free(a);
        p->oom = true;
        return;
    }
    memcpy(nm, name, nlen);
    nm[nlen] = 0;
    if (alen) memcpy(a, args, alen);
    a[alen] = 0;
    p->calls[p->n_calls++] = (pkv_tc_call){nm, a, alen, complete};
}

/* s[0..n) as a JSON string; its bytes pass unchecked (the server replaces invalid
 * UTF-8 when it writes the answer). */
static void put_jstring(P *p, sb *b, const char *s, size_t n) {
    sb_put(p, b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            sb_put(p, b, e, 2);
        } else if (c < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", c);
            sb_put(p, b, e, 6);
        } else {
            sb_put(p, b, s + i, 1);
        }
    }
    sb_put(p, b, "\"", 1);
}

/* ------------------------------------------------------------ JSON scan */

enum { SC_ERR = -1, SC_INC = 0, SC_OK = 1 };

static int scan_string(const char *s, size_t n, size_t *i) {
    for (size_t k = *i + 1; k < n; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c == '\\') k++;
        else if (c == '"') {
            *i = k + 1;
            return SC_OK;
        } else if (c < 0x20) return SC_ERR;
    }
    return SC_INC;
}

/* One JSON value from *i (leading whitespace skipped): SC_OK with *i after it,
 * SC_INC when the text ends inside it, SC_ERR when it is not JSON. Structural
 * only: brackets match and strings close; literals are runs of their letters. */
static int scan_value(const char *s, size_t n, size_t *i) {
    char stack[128];
    int d = 0;
    size_t k = *i;
    do {
        k = skip_ws(s, k, n);
        if (k >= n) return SC_INC;
        char c = s[k];
        if (c == '{' || c == '[') {
            if (d == (int)sizeof stack) return SC_ERR;
            stack[d++] = c == '{' ? '}' : ']';
            k++;
            continue;
        }
        if (c == '}' || c == ']') {
            if (!d || stack[d - 1] != c) return SC_ERR;
            d--;
            k++;
        } else if (c == '"') {
            int r = scan_string(s, n, &k);
            if (r != SC_OK) return r;
        } else if (c == ',' || c == ':') {
            if (!d) return SC_ERR;
            k++;
            continue;
        } else if (isalnum((unsigned char)c) || c == '-' || c == '+' || c == '.') {
            while (k < n && (isalnum((unsigned char)s[k]) || s[k] == '-' || s[k] == '+' || s[k] == '.')) k++;
            if (k == n) return SC_INC;
        } else {
            return SC_ERR;
        }
    } while (d > 0);
    *i = k;
    return SC_OK;
}

/* A JSON string token s[0..n) decoded; malloc'd (NULL when it is not a string). */
static char *decode_string(const char *s, size_t n, size_t *out_len) {
    json_t *j = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    char *r = NULL;
    if (json_is_string(j)) {
        *out_len = json_string_length(j);
        r = malloc(*out_len + 1);
        if (r) memcpy(r, json_string_value(j), *out_len + 1);
    }
    json_decref(j);
    return r;
}

typedef struct callscan {
    char *name;         /* decoded, malloc'd; NULL until the name string has ended */
    size_t nlen;
    size_t args_off, args_len; /* raw JSON text of the arguments */
    char *args_dec;     /* arguments written as a JSON string: decoded (complete only) */
    size_t dec_len;
    size_t end;         /* after the object (SC_OK) */
} callscan;

/* A scan's strings freed, whatever it returned. */
static void scan_drop(callscan *cs) {
    free(cs->name);
    free(cs->args_dec);
    memset(cs, 0, sizeof *cs);
}

/* {"name": "...", "arguments"|"parameters": {...}} from i; other keys are skipped,
 * and {"function": {...}} wrapping (OpenAI's own shape) is looked into. */
static int scan_call(const char *s, size_t n, size_t i, callscan *cs) {
    memset(cs, 0, sizeof *cs);
    bool have_args = false, args_str = false, args_done = false;
    i = skip_ws(s, i, n);
    if (i >= n) return SC_INC;
    if (s[i] != '{') return SC_ERR;
    i++;
    for (;;) {
        i = skip_ws(s, i, n);
        if (i >= n) goto inc;
        if (s[i] == '}') {
            i++;
            break;
        }
        if (s[i] != '"') goto err;
        size_t ks = i;
        int r = scan_string(s, n, &i);
        if (r != SC_OK) {
            if (r == SC_ERR) goto err;
            goto inc;
        }
        const char *key = s + ks + 1;
        size_t kl = i - ks - 2;
        i = skip_ws(s, i, n);
        if (i >= n) goto inc;
        if (s[i] != ':') goto err;
        i = skip_ws(s, i + 1, n);
        if (i >= n) goto inc;
        size_t vs = i;
        bool is_name = kl == 4 && !memcmp(key, "name", 4);
        bool is_args = (kl == 9 && !memcmp(key, "arguments", 9)) || (kl == 10 && !memcmp(key, "parameters", 10));
        bool is_fn = kl == 8 && !memcmp(key, "function", 8) && s[i] == '{';
        if (is_fn && !cs->name) { /* {"type":"function","function":{"name":..,"arguments":..}} */
            callscan in;
            r = scan_call(s, n, i, &in);
            if (r == SC_ERR) goto err;
            free(cs->args_dec); /* "arguments" written before "function": the inner call's win */
            *cs = in;
            if (r == SC_INC) return SC_INC;
            i = in.end;
            have_args = true;
            args_str = in.args_dec != NULL;
        } else {
            if (is_args) {
                cs->args_off = vs;
                have_args = true;
                args_str = s[vs] == '"';
            }
            r = scan_value(s, n, &i);
            if (r == SC_ERR) goto err;
            if (r == SC_INC) {
                if (is_args) cs->args_len = args_str ? 0 : rtrim(s + vs, n - vs);
                goto inc;
            }
            if (is_name) {
                if (s[vs] != '"' || cs->name) goto err;
                cs->name = decode_string(s + vs, i - vs, &cs->nlen);
                if (!cs->name) goto err;
            } else if (is_args) {
                args_done = true;
                cs->args_len = i - vs;
                if (args_str) {
                    free(cs->args_dec);
                    cs->args_dec = decode_string(s + vs, i - vs, &cs->dec_len);
                    if (!cs->args_dec) goto err;
                }
            }
        }
        i = skip_ws(s, i, n);
        if (i >= n) goto inc;
        if (s[i] == ',') {
            i++;
            continue;
        }
        if (s[i] == '}') {
            i++;
            break;
        }
        goto err;
    }
    if (!cs->name) goto err;
    if (!have_args) cs->args_len = 0;
    cs->end = i;
    return SC_OK;
inc:
    if (args_str) cs->args_len = 0;
    return SC_INC;
err:
    if (cs->name) {
        /* broken after the name: a partial parse of a prefix announced the call
         * already, so it stays a call (incomplete) with what follows as arguments */
        if (have_args && !args_done) cs->args_len = args_str ? 0 : rtrim(s + cs->args_off, n - cs->args_off);
        return SC_INC;
    }
    scan_drop(cs);
    return SC_ERR;
}

/* Record a scanned call (complete or, in a partial parse, the part so far). */
static void scan_add(P *p, const char *s, callscan *cs, bool complete) {
    if (cs->name) {
        if (cs->args_dec) add_call(p, cs->name, cs->nlen, cs->args_dec, cs->dec_len, complete);
        else if (complete && !cs->args_len) add_call(p, cs->name, cs->nlen, "{}", 2, complete);
        else add_call(p, cs->name, cs->nlen, s + cs->args_off, cs->args_len, complete);
    }
    scan_drop(cs);
}

/* --------------------------------------------------------------- formats */

/* Text between or after calls: whitespace alone is dropped. */
static void segment(P *p, const char *s, size_t n, bool after_call) {
    if (after_call && skip_ws(s, 0, n) == n) return;
    content(p, s, n);
}

/* Qwen3.5/Qwen3-Coder's XML form inside <tool_call>:
 * <function=NAME>\n<parameter=K>\nVALUE\n</parameter>...</function>. A value that
 * is JSON (a number, true, an object...) stays JSON, else it is a string. The
 * arguments grow one whole parameter at a time. Returns where it ended (after
 * </function>), or 0 when the text ended first. */
static size_t p_xml_function(P *p, const char *s, size_t n, size_t k) {
    k += 10; /* <function= */
    const char *gt = find(s + k, n - k, ">");
    if (!gt) return 0;
    size_t ns = k, nl = (size_t)(gt - s) - k;
    k = (size_t)(gt - s) + 1;
    sb args = {0};
    sb_put(p, &args, "{", 1);
    bool first = true, done = false;
    for (;;) {
        k = skip_ws(s, k, n);
        if (starts(s + k, n - k, "</function>")) {
            k += 11;
            done = true;
            break;
        }
        if (!starts(s + k, n - k, "<parameter=")) break;
        const char *pg = find(s + k + 11, n - k - 11, ">");
        if (!pg) break;
        const char *pe = find(pg + 1, (size_t)(s + n - pg - 1), "</parameter>");
        if (!pe) break;
        const char *v = pg + 1;
        size_t vl = (size_t)(pe - v);
        if (vl && v[0] == '\n') v++, vl--;
        if (vl && v[vl - 1] == '\n') vl--;
        if (!first) sb_put(p, &args, ", ", 2);
        put_jstring(p, &args, s + k + 11, (size_t)(pg - s) - k - 11);
        sb_put(p, &args, ": ", 2);
        json_t *val = json_loadb(v, vl, JSON_DECODE_ANY, NULL);
        char *vt = val ? json_dumps(val, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(val);
        if (vt) sb_put(p, &args, vt, strlen(vt));
        else put_jstring(p, &args, v, vl); /* not JSON: a string */
        free(vt);
        first = false;
        k = (size_t)(pe - s) + 12;
    }
    if (done) sb_put(p, &args, "}", 1);
    add_call(p, s + ns, nl, args.p ? args.p : "", args.n, done);
    free(args.p);
    return done ? k : 0;
}

static void p_hermes(P *p, const char *s, size_t n) {
    size_t pos = 0;
    bool after = false;
    for (;;) {
        const char *m = find(s + pos, n - pos, "<tool_call>");
        size_t at = m ? (size_t)(m - s) : n;
        size_t hold = !m && p->partial ? tail(s + pos, n - pos, "<tool_call>") : 0;
        segment(p, s + pos, at - pos - hold, after);
        if (!m) return;
        size_t k = skip_ws(s, at + 11, n);
        if (p->partial && is_prefix(s + k, n - k, "<function=")) return;
        if (starts(s + k, n - k, "<function=")) {
            k = p_xml_function(p, s, n, k);
            if (!k) return;
        } else {
            callscan cs;
            int r = scan_call(s, n, k, &cs);
            if (r == SC_ERR || (r == SC_INC && !p->partial && !cs.name)) {
                segment(p, s + at, n - at, after); /* not a call: text */
                scan_drop(&cs);
                return;
            }
            if (r == SC_INC) {
                scan_add(p, s, &cs, false);
                return;
            }
            k = cs.end;
            scan_add(p, s, &cs, true);
        }
        k = skip_ws(s, k, n);
        if (starts(s + k, n - k, "</tool_call>")) k += 12;
        else if (p->partial && (k == n || is_prefix(s + k, n - k, "</tool_call>"))) return;
        pos = k;
        after = true;
    }
}

static void p_json_calls(P *p, const char *s, size_t n, size_t k) {
    for (;;) {
        callscan cs;
        int r = scan_call(s, n, k, &cs);
        if (r == SC_INC && (cs.name || p->partial)) {
            scan_add(p, s, &cs, false);
            return;
        }
        if (r != SC_OK) {
            scan_drop(&cs); /* an incomplete scan without a name can hold decoded arguments */
            segment(p, s + k, n - k, true);
            return;
        }
        k = cs.end;
        scan_add(p, s, &cs, true);
        k = skip_ws(s, k, n);
        if (k < n && s[k] == ';') k = skip_ws(s, k + 1, n); /* Llama 3.2: several, ';' between */
        if (k >= n || s[k] != '{') {
            segment(p, s + k, n - k, true);
            return;
        }
    }
}

static void p_llama3(P *p, const char *s, size_t n) {
    const char *m = find(s, n, "<|python_tag|>");
    size_t k = skip_ws(s, 0, n);
    if (k < n && s[k] == '{' && (!m || (size_t)(m - s) > k)) {
        /* a call written as JSON from the start; text if it is not one. Tried
         * before a later <|python_tag|>: a stream that has not seen the tag yet
         * takes this branch, and a call it announced must stay in the whole parse */
        callscan cs;
        int r = scan_call(s, n, k, &cs);
        bool named = cs.name != NULL;
        scan_drop(&cs);
        if (r == SC_OK || (r == SC_INC && (named || p->partial))) {
            p_json_calls(p, s, n, k);
            return;
        }
    }
    if (!m) {
        if (p->partial && k == n) return; /* whitespace: a call may follow */
        content(p, s, n - (p->partial ? tail(s, n, "<|python_tag|>") : 0));
        return;
    }
    content(p, s, (size_t)(m - s));
    k = skip_ws(s, (size_t)(m - s) + 14, n);
    if (k < n && s[k] == '{') {
        p_json_calls(p, s, n, k);
        return;
    }
    if (p->partial) return; /* code for the python tool: sent whole at the end */
    sb a = {0};
    sb_put(p, &a, "{\"code\":", 8);
    put_jstring(p, &a, s + k, rtrim(s + k, n - k));
    sb_put(p, &a, "}", 1);
    if (!p->oom) add_call(p, "python", 6, a.p, a.n, true);
    free(a.p);
}

static void p_mistral(P *p, const char *s, size_t n) {
    const char *m = find(s, n, "[TOOL_CALLS]");
    if (!m) {
        content(p, s, n - (p->partial ? tail(s, n, "[TOOL_CALLS]") : 0));
        return;
    }
    content(p, s, (size_t)(m - s));
    size_t k = (size_t)(m - s) + 12;
    for (;;) {
        k = skip_ws(s, k, n);
        if (k >= n) return;
        if (s[k] == '[') { /* [{"name":..,"arguments":..}, ...] */
            k++;
            for (;;) {
                k = skip_ws(s, k, n);
                if (k >= n) return;
                if (s[k] == ']') {
                    k++;
                    break;
                }
                callscan cs;
                int r = scan_call(s, n, k, &cs);
                if (r == SC_INC) {
                    scan_add(p, s, &cs, false);
                    return;
                }
                if (r == SC_ERR) {
                    segment(p, s + k, n - k, true);
                    return;
                }
                k = skip_ws(s, cs.end, n);
                scan_add(p, s, &cs, true);
                if (k < n && s[k] == ',') k++;
            }
        } else { /* name[ARGS]{...} (Mistral Small 3.2, Magistral, Devstral) */
            const char *a = find(s + k, n - k, "[ARGS]");
            if (!a) {
                if (!p->partial) segment(p, s + k, n - k, true);
                return;
            }
            size_t nl = (size_t)(a - s) - k;
            const char *cid = find(s + k, nl, "[CALL_ID]");
            if (cid) nl = (size_t)(cid - s) - k;
            size_t ns = k;
            k = (size_t)(a - s) + 6;
            size_t vs = skip_ws(s, k, n);
            int r = scan_value(s, n, &k);
            if (r == SC_OK) add_call(p, s + ns, rtrim(s + ns, nl), s + vs, k - vs, true);
            else {
                add_call(p, s + ns, rtrim(s + ns, nl), s + vs, vs < n ? rtrim(s + vs, n - vs) : 0, false);
                return;
            }
        }
        k = skip_ws(s, k, n);
        if (starts(s + k, n - k, "[TOOL_CALLS]")) k += 12;
        else if (p->partial && is_prefix(s + k, n - k, "[TOOL_CALLS]")) return;
        else {
            segment(p, s + k, n - k, true);
            return;
        }
    }
}

static void p_deepseek(P *p, const char *s, size_t n) {
    const char *m = find(s, n, DS_CALLS_BEGIN), *m1 = find(s, n, DS_CALL_BEGIN);
    if (!m || (m1 && m1 < m)) m = m1;
    if (!m) {
        size_t h = p->partial ? tail(s, n, DS_CALLS_BEGIN) : 0, h1 = p->partial ? tail(s, n, DS_CALL_BEGIN) : 0;
        content(p, s, n - (h > h1 ? h : h1));
        return;
    }
    content(p, s, (size_t)(m - s));
    size_t k = (size_t)(m - s);
    if (starts(s + k, n - k, DS_CALLS_BEGIN)) k += strlen(DS_CALLS_BEGIN);
    for (;;) {
        k = skip_ws(s, k, n);
        if (k >= n) return;
        if (p->partial && (is_prefix(s + k, n - k, DS_CALLS_END) || is_prefix(s + k, n - k, DS_CALL_BEGIN) ||
                           is_prefix(s + k, n - k, DS_CALL_END) || is_prefix(s + k, n - k, "```")))
            return;
        if (starts(s + k, n - k, DS_CALLS_END)) {
            k += strlen(DS_CALLS_END);
            segment(p, s + k, n - k, true);
            return;
        }
        if (!starts(s + k, n - k, DS_CALL_BEGIN)) {
            if (!(p->partial && is_prefix(s + k, n - k, DS_CALL_BEGIN))) segment(p, s + k, n - k, true);
            return;
        }
        k += strlen(DS_CALL_BEGIN);
        const char *sep = find(s + k, n - k, DS_SEP);
        if (!sep) return;
        size_t ns = k, nl = (size_t)(sep - s) - k;
        k = (size_t)(sep - s) + strlen(DS_SEP);
        if (nl == 8 && !memcmp(s + ns, "function", 8)) { /* R1: function<sep>NAME\n```json\n{..}\n``` */
            const char *eol = find(s + k, n - k, "\n");
            if (!eol) return;
            ns = k;
            nl = (size_t)(eol - s) - k;
            k = skip_ws(s, (size_t)(eol - s), n);
            if (starts(s + k, n - k, "```json")) k += 7;
            else if (p->partial && is_prefix(s + k, n - k, "```json")) return;
        }
        size_t vs = skip_ws(s, k, n);
        int r = scan_value(s, n, &k);
        if (r != SC_OK) { /* cut, or broken: a call with what follows as arguments */
            add_call(p, s + ns, rtrim(s + ns, nl), s + vs, vs < n ? rtrim(s + vs, n - vs) : 0, false);
            return;
        }
        add_call(p, s + ns, rtrim(s + ns, nl), s + vs, k - vs, true);
        k = skip_ws(s, k, n);
        if (p->partial && is_prefix(s + k, n - k, "```")) return;
        if (starts(s + k, n - k, "```")) k = skip_ws(s, k + 3, n);
        if (starts(s + k, n - k, DS_CALL_END)) k += strlen(DS_CALL_END);
    }
}

static const char *const k_harmony_ends[] = {"<|end|>", "<|call|>", "<|return|>", NULL};

const char *const *pkv_tc_message_ends(pkv_tc_format fmt) {
    static const char *const none[] = {NULL};
    return fmt == PKV_TC_GPT_OSS ? k_harmony_ends : none;
}

/* gpt-oss (harmony): messages "<|channel|>C[ to=functions.NAME][ <|constrain|>json]<|message|>BODY"
 * ended by <|end|>, <|call|> or <|return|> (k_harmony_ends), the next starting with <|start|>assistant. */
static void p_gpt_oss(P *p, const char *s, size_t n) {
    static const char *const ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
    size_t k = 0;
    while (k < n) {
        const char *msg = find(s + k, n - k, "<|message|>");
        if (!msg) {
            /* plain text with no header at all: content */
            if (!p->partial && !find(s + k, n - k, "<|channel|>") && !find(s + k, n - k, "<|start|>")) content(p, s + k, n - k);
            return;
        }
        const char *h = s + k;
        size_t hl = (size_t)(msg - h);
        size_t b = (size_t)(msg - s) + 11, e = n, next = n;
        bool ended = false;
        for (int i = 0; i < 4; i++) {
            const char *x = find(s + b, e - b, ends[i]);
            if (x) {
                e = (size_t)(x - s);
                next = i == 3 ? e : e + strlen(ends[i]);
                ended = true;
            }
        }
        if (!ended && p->partial) {
            size_t hold = 0;
            for (int i = 0; i < 4; i++) {
                size_t t = tail(s + b, e - b, ends[i]);
                if (t > hold) hold = t;
            }
            e -= hold;
        }
        const char *to = find(h, hl, "to=functions.");
        if (to) {
            size_t ns = (size_t)(to - s) + 13, ne = ns;
            while (ne < (size_t)(msg - s) && !ws(s[ne]) && s[ne] != '<') ne++;
            size_t as = skip_ws(s, b, e);
            add_call(p, s + ns, ne - ns, s + as, rtrim(s + as, e - as), ended || !p->partial);
        } else if (find(h, hl, "analysis")) {
            sb_put(p, &p->reasoning, s + b, e - b);
        } else {
            content(p, s + b, e - b);
        }
        k = next;
    }
}

/* ----------------------------------------------------------------- parse */

bool pkv_tc_parse(const pkv_tc_opts *o, const char *s, size_t n, bool partial, pkv_tc_result *res) {
    P p = {.o = o, .partial = partial};
    size_t i = 0;
    bool rest = true;
    if (o->think && o->fmt != PKV_TC_GPT_OSS) {
        bool inside = o->in_think;
        if (!inside) {
            size_t k = skip_ws(s, 0, n);
            if (starts(s + k, n - k, "<think>")) {
                inside = true;
                i = k + 7;
            } else if (partial && is_prefix(s + k, n - k, "<think>")) {
                rest = false; /* nothing to say yet */
            }
        }
        if (inside) {
            i = skip_ws(s, i, n);
            const char *e = find(s + i, n - i, "</think>");
            if (!e) {
                size_t m = n - i - (partial ? tail(s + i, n - i, "</think>") : 0);
                sb_put(&p, &p.reasoning, s + i, m);
                rest = false;
            } else {
                sb_put(&p, &p.reasoning, s + i, (size_t)(e - s) - i);
                i = skip_ws(s, (size_t)(e - s) + 8, n);
            }
        }
    }
    if (rest) {
        const char *t = s + i;
        size_t m = n - i;
        if (o->fmt == PKV_TC_GPT_OSS) p_gpt_oss(&p, t, m);
        else if (!o->calls || o->fmt == PKV_TC_NONE) content(&p, t, m);
        else if (o->fmt == PKV_TC_HERMES) p_hermes(&p, t, m);
        else if (o->fmt == PKV_TC_LLAMA3) p_llama3(&p, t, m);
        else if (o->fmt == PKV_TC_MISTRAL) p_mistral(&p, t, m);
        else if (o->fmt == PKV_TC_DEEPSEEK) p_deepseek(&p, t, m);
        else p_json_calls(&p, t, m, skip_ws(t, 0, m));
    }
    sb_put(&p, &p.reasoning, "", 0);
    sb_put(&p, &p.content, "", 0);
    res->reasoning = p.reasoning.p;
    res->reasoning_len = p.reasoning.n;
    res->content = p.content.p;
    res->content_len = p.content.n;
    res->calls = p.calls;
    res->n_calls = p.n_calls;
    if (p.oom) {
        pkv_tc_result_free(res);
        return false;
    }
    return true;
}

void pkv_tc_result_free(pkv_tc_result *r) {
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].args);
    }
    free(r->calls);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------- streaming */

struct pkv_tc_stream {
    pkv_tc_opts o;
    pkv_tc_result last; /* what has been sent: the previous parse */
    pkv_tc_result now;
    pkv_tc_delta *d;
    int n_d, cap_d;
    bool ended;
};

pkv_tc_stream *pkv_tc_stream_new(const pkv_tc_opts *o) {
    pkv_tc_stream *s = calloc(1, sizeof *s);
    if (s) s->o = *o;
    return s;
}

void pkv_tc_stream_free(pkv_tc_stream *s) {
    if (!s) return;
    pkv_tc_result_free(&s->last);
    pkv_tc_result_free(&s->now);
    free(s->d);
    free(s);
}

int pkv_tc_stream_calls(const pkv_tc_stream *s) { return s->last.n_calls; }

static bool push(pkv_tc_stream *s, pkv_tc_dkind k, int index, const char *t, size_t n) {
    if (s->n_d == s->cap_d) {
        int nc = s->cap_d ? s->cap_d * 2 : 8;
        pkv_tc_delta *d = realloc(s->d, (size_t)nc * sizeof *d);
        if (!d) return false;
        s->d = d;
        s->cap_d = nc;
    }
    s->d[s->n_d++] = (pkv_tc_delta){k, index, t, n};
    return true;
}

/* new[0..nn) extends old[0..on): the delta is new[on..nn). */
static bool grow(pkv_tc_stream *s, pkv_tc_dkind k, int index, const char *old, size_t on, const char *nw, size_t nn) {
    if (nn <= on || (on && memcmp(old, nw, on))) return true;
    return push(s, k, index, nw + on, nn - on);
}

bool pkv_tc_stream_update(pkv_tc_stream *s, const char *text, size_t len, bool final, const pkv_tc_delta **d, int *n) {
    s->n_d = 0;
    *d = NULL;
    *n = 0;
    if (s->ended) return true;
    pkv_tc_result_free(&s->now);
    if (!pkv_tc_parse(&s->o, text, len, !final, &s->now)) return false;
    pkv_tc_result *a = &s->last, *b = &s->now;
    if (b->n_calls < a->n_calls) return true; /* never: fields only grow */
    bool ok = grow(s, PKV_TC_D_REASONING, 0, a->reasoning, a->reasoning_len, b->reasoning, b->reasoning_len) &&
              grow(s, PKV_TC_D_CONTENT, 0, a->content, a->content_len, b->content, b->content_len);
    for (int i = 0; ok && i < b->n_calls; i++) {
        if (i >= a->n_calls) {
            ok = push(s, PKV_TC_D_CALL, i, b->calls[i].name, strlen(b->calls[i].name)) &&
                 grow(s, PKV_TC_D_ARGS, i, "", 0, b->calls[i].args, b->calls[i].args_len);
        } else {
            ok = grow(s, PKV_TC_D_ARGS, i, a->calls[i].args, a->calls[i].args_len, b->calls[i].args, b->calls[i].args_len);
        }
    }
    if (!ok) return false;
    pkv_tc_result t = s->last;
    s->last = s->now;
    s->now = t;
    s->ended = final;
    *d = s->d;
    *n = s->n_d;
    return true;
}
