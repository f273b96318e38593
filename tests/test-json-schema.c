// labels: unit
/* JSON schema to grammar, keyword by keyword (docs/engine.md, "Constrained output"):
 * for each keyword, JSON texts the compiled grammar must accept and refuse; integer
 * ranges and multiples checked against every value of a window, numbers with a
 * fraction against their value; the +-2^53 bounds zod writes compile small; what is
 * refused names its JSON pointer and the construct. Schemas and documents are written
 * with ' for ", ` for ' and % for a backslash (in a schema: the regex's backslash,
 * JSON \\; in a document: JSON's escape) to stay readable. */
#include "testhelp.h"

#include "base/base.h"
#include "engine/grammar.h"

static char *jconv(const char *t, bool schema) {
    size_t n = strlen(t);
    char *o = malloc(2 * n + 1), *q = o;
    for (; *t; t++) {
        if (*t == '\'') *q++ = '"';
        else if (*t == '`') *q++ = '\'';
        else if (*t == '%') {
            *q++ = '\\';
            if (schema) *q++ = '\\';
        } else *q++ = *t;
    }
    *q = 0;
    return o;
}

static char *jtext(const char *t) { return jconv(t, true); }

static pkv_grammar *js(const char *schema) {
    char *t = jtext(schema);
    pkv_grammar *g = pkv_grammar_from_json_schema(t, strlen(t));
    if (!g) TH_FAIL("schema failed: %s\n%s", pkv_errmsg(), t);
    free(t);
    return g;
}

static void refused(const char *schema, const char *w1, const char *w2) {
    char *t = jtext(schema);
    pkv_grammar *g = pkv_grammar_from_json_schema(t, strlen(t));
    th_checks++;
    if (g) {
        TH_FAIL("schema accepted, want an error with '%s':\n%s", w1, t);
        pkv_grammar_free(g);
    } else {
        const char *m = pkv_errmsg();
        if (!strstr(m, w1) || (w2 && !strstr(m, w2))) TH_FAIL("message '%s' lacks '%s' / '%s'", m, w1, w2 ? w2 : "");
    }
    free(t);
}

/* Documents written with ' for " too. */
static bool acc(pkv_grammar *g, const char *doc) {
    char *t = jconv(doc, false);
    bool ok = g && pkv_grammar_accepts(g, t, strlen(t));
    free(t);
    return ok;
}
#define ACC(g, d) do { th_checks++; if (!acc((g), (d))) TH_FAIL("not accepted: %s", d); } while (0)
#define REJ(g, d) do { th_checks++; if (g && acc((g), (d))) TH_FAIL("accepted: %s", d); } while (0)

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* ------------------------------------------------------------- integers */

static void test_integers(void) {
    /* random ranges and multiples against every integer of a window */
    for (int k = 0; k < 160; k++) {
        long lo = (long)(rnd() % 300) - 150, hi = lo + (long)(rnd() % 200), m = k % 4 == 0 ? 1 : 1 + (long)(rnd() % 12);
        bool exlo = rnd() % 4 == 0, exhi = rnd() % 4 == 0;
        char s[256];
        snprintf(s, sizeof s, "{'type':'integer','%s':%ld,'%s':%ld%s}", exlo ? "exclusiveMinimum" : "minimum", lo,
                 exhi ? "exclusiveMaximum" : "maximum", hi, m > 1 ? (char[32]){0} : "");
        if (m > 1) snprintf(s + strlen(s) - 1, sizeof s - strlen(s) + 1, ",'multipleOf':%ld}", m);
        char *t = jtext(s);
        pkv_grammar *g = pkv_grammar_from_json_schema(t, strlen(t));
        long first = exlo ? lo + 1 : lo, last = exhi ? hi - 1 : hi;
        bool any = false;
        for (long v = first; v <= last; v++) any |= v % m == 0;
        th_checks++;
        if (!g) {
            if (any) TH_FAIL("%s: %s", t, pkv_errmsg());
            free(t);
            continue;
        }
        int bad = 0;
        for (long v = -400; v <= 400; v++) {
            char d[32];
            snprintf(d, sizeof d, "%ld", v);
            bool want = v >= first && v <= last && v % m == 0;
            if (pkv_grammar_accepts(g, d, strlen(d)) != want && bad++ < 3) TH_FAIL("%s: %ld gives %d", t, v, !want);
        }
        free(t);
        pkv_grammar_free(g);
    }
    /* zod's z.number().int(): the safe-integer range, exactly, in a small grammar */
    pkv_grammar *g = js("{'type':'integer','minimum':-9007199254740991,'maximum':9007199254740991}");
    ACC(g, "9007199254740991"); ACC(g, "-9007199254740991"); ACC(g, "0"); ACC(g, "-1"); ACC(g, "9007199254740990");
    ACC(g, "8999999999999999"); ACC(g, "999999999999999"); ACC(g, "1000000000000000");
    REJ(g, "9007199254740992"); REJ(g, "-9007199254740992"); REJ(g, "9999999999999999"); REJ(g, "10000000000000000");
    REJ(g, "1.5"); REJ(g, "01"); REJ(g, "-0"); REJ(g, "1e3");
    size_t size = g ? strlen(pkv_grammar_gbnf(g)) : 0;
    printf("zod int range: %zu bytes of grammar\n", size);
    CHECK(size < 4096);
    pkv_grammar_free(g);
    /* .int().positive() */
    g = js("{'type':'integer','exclusiveMinimum':0,'maximum':9007199254740991}");
    ACC(g, "1"); ACC(g, "42"); REJ(g, "0"); REJ(g, "-1");
    pkv_grammar_free(g);
    /* draft 4 / OpenAPI 3.0 boolean exclusives; non-integer bounds round inwards */
    g = js("{'type':'integer','minimum':0,'exclusiveMinimum':true,'maximum':10,'exclusiveMaximum':true}");
    ACC(g, "1"); ACC(g, "9"); REJ(g, "0"); REJ(g, "10");
    pkv_grammar_free(g);
    g = js("{'type':'integer','minimum':0.5,'maximum':2.5}");
    ACC(g, "1"); ACC(g, "2"); REJ(g, "0"); REJ(g, "3");
    pkv_grammar_free(g);
    /* a multiple over the whole zod range: rules per (digits left, remainder) */
    g = js("{'type':'integer','minimum':-9007199254740991,'maximum':9007199254740991,'multipleOf':7}");
    ACC(g, "7"); ACC(g, "-14"); ACC(g, "0"); ACC(g, "9007199254740988"); REJ(g, "9007199254740989"); REJ(g, "8"); REJ(g, "-6");
    size = g ? strlen(pkv_grammar_gbnf(g)) : 0;
    printf("zod int range, multipleOf 7: %zu bytes of grammar\n", size);
    pkv_grammar_free(g);
    g = js("{'type':['integer','null'],'minimum':1,'maximum':3}");
    ACC(g, "null"); ACC(g, "2"); REJ(g, "4");
    pkv_grammar_free(g);
    refused("{'type':'integer','minimum':5,'maximum':4}", "no integer", NULL);
    refused("{'type':'integer','minimum':1,'maximum':6,'multipleOf':7}", "no integer in [1, 6] is a multiple of 7", NULL);
    /* multipleOf: a remainder automaton of at most 4096 (digit position, remainder) rules */
    refused("{'type':'integer','multipleOf':1000}", "/multipleOf", "limit of 4096 remainder states");
    refused("{'type':'integer','multipleOf':4001,'minimum':-9007199254740991,'maximum':9007199254740991}",
            "/multipleOf: 'multipleOf' 4001 within the bounds ('minimum', 'maximum')", "limit of 4096 remainder states");
    refused("{'type':'integer','multipleOf':5000}", "/multipleOf", "above the limit of 4096 remainders");
    refused("{'type':'number','multipleOf':0.0001234567}", "/multipleOf", "above the limit of 4096 remainders");
    refused("{'type':'number','multipleOf':1e300}", "/multipleOf", "above the limit of 4096 remainders");
    refused("{'type':'number','multipleOf':0}", "/multipleOf", "must be a number above 0");
    refused("{'type':'number','multipleOf':-0.5}", "/multipleOf", "must be a number above 0");
    g = js("{'type':'integer','multipleOf':1000,'minimum':0,'maximum':1000000}");
    ACC(g, "0"); ACC(g, "1000"); ACC(g, "999000"); ACC(g, "1000000"); REJ(g, "1000500"); REJ(g, "2500"); REJ(g, "-1000");
    pkv_grammar_free(g);
    g = js("{'type':'integer','multipleOf':4001,'minimum':-10000,'maximum':100000}");
    ACC(g, "4001"); ACC(g, "96024"); ACC(g, "-8002"); REJ(g, "4002"); REJ(g, "100015"); REJ(g, "-12003");
    pkv_grammar_free(g);
    refused("{'type':'integer','minimum':'1'}", "/minimum", "must be a number");
    refused("{'type':'integer','exclusiveMinimum':true}", "/exclusiveMinimum", "needs 'minimum'");
}

/* ------------------------------------------------------------- numbers */

/* Random decimals (sign, up to 2 integer digits, up to 3 fraction digits) against
 * integer bounds; the value decides. */
static void number_window(const char *schema, bool has_lo, double lo, bool exlo, bool has_hi, double hi, bool exhi) {
    pkv_grammar *g = js(schema);
    if (!g) return;
    int bad = 0;
    for (int k = 0; k < 3000; k++) {
        char d[32];
        int ip = (int)(rnd() % (k % 2 ? 12 : 100)), nf = (int)(rnd() % 4);
        int n = snprintf(d, sizeof d, "%s%d", rnd() % 2 ? "-" : "", ip);
        if (nf) {
            n += snprintf(d + n, sizeof d - (size_t)n, ".");
            for (int i = 0; i < nf; i++) d[n++] = (char)('0' + (rnd() % 3 ? (int)(rnd() % 10) : 0));
            d[n] = 0;
        }
        double v = strtod(d, NULL);
        bool want = (!has_lo || (exlo ? v > lo : v >= lo)) && (!has_hi || (exhi ? v < hi : v <= hi));
        if (!strcmp(d, "-0") || !strncmp(d, "-0.0", 4) || !strcmp(d, "-0.")) want = want && v != 0; /* -0 is not written */
        if (v == 0 && d[0] == '-') want = false;
        th_checks++;
        if (pkv_grammar_accepts(g, d, strlen(d)) != want && bad++ < 4) TH_FAIL("%s: %s gives %d", schema, d, !want);
    }
    pkv_grammar_free(g);
}

static void test_numbers(void) {
    number_window("{'type':'number','exclusiveMinimum':0}", true, 0, true, false, 0, false); /* z.number().positive() */
    number_window("{'type':'number','minimum':0}", true, 0, false, false, 0, false);
    number_window("{'type':'number','minimum':-2,'maximum':3}", true, -2, false, true, 3, false);
    number_window("{'type':'number','exclusiveMinimum':-2,'exclusiveMaximum':3}", true, -2, true, true, 3, true);
    number_window("{'type':'number','maximum':-1}", false, 0, false, true, -1, false);
    number_window("{'type':'number','exclusiveMaximum':0}", false, 0, false, true, 0, true);
    number_window("{'type':'number','minimum':7,'maximum':7}", true, 7, false, true, 7, false);
    number_window("{'type':'number','minimum':-5,'exclusiveMaximum':-4}", true, -5, false, true, -4, true);
    pkv_grammar *g = js("{'type':'number','exclusiveMinimum':0}");
    ACC(g, "0.5"); ACC(g, "1"); ACC(g, "0.001"); ACC(g, "3.25"); REJ(g, "0"); REJ(g, "0.000"); REJ(g, "-0.5"); REJ(g, "1e5");
    pkv_grammar_free(g);
    g = js("{'type':'number','multipleOf':5,'maximum':20}");
    ACC(g, "15"); ACC(g, "-5"); REJ(g, "21"); REJ(g, "25"); REJ(g, "7");
    pkv_grammar_free(g);
    /* zod's float32 bounds are beyond 16 digits: no bound; OpenAPI's number formats */
    g = js("{'type':'number','minimum':-3.4028234663852886e+38,'maximum':3.4028234663852886e+38}");
    ACC(g, "-12.5"); ACC(g, "9999999999999999"); REJ(g, "1e5");
    pkv_grammar_free(g);
    g = js("{'type':'integer','format':'int32'}");
    ACC(g, "2147483647"); ACC(g, "-2147483648"); REJ(g, "2147483648"); REJ(g, "-2147483649");
    pkv_grammar_free(g);
    g = js("{'type':'number','format':'double','maximum':2}");
    ACC(g, "1.5"); REJ(g, "2.5");
    pkv_grammar_free(g);
    refused("{'type':'integer','format':'int128'}", "/format", "'int128' on a number is not supported");
    /* fractional bounds: exact to the 16th fraction digit, and past it */
    g = js("{'type':'number','exclusiveMinimum':0.5}");
    REJ(g, "0.5"); REJ(g, "0.50"); REJ(g, "0.5000000000000000"); REJ(g, "0.4999999999999999"); REJ(g, "5e-1");
    ACC(g, "0.5000001"); ACC(g, "0.5000000000000001"); ACC(g, "0.51"); ACC(g, "1"); ACC(g, "9999999999999999.9999999999999999");
    REJ(g, "0.50000000000000001"); /* 17 fraction digits are never written */
    pkv_grammar_free(g);
    g = js("{'type':'number','minimum':1e-20,'maximum':2.00000000000000000001}");
    ACC(g, "0.0000000000000001"); ACC(g, "2"); ACC(g, "2.0000000000000000"); ACC(g, "1.9999999999999999");
    REJ(g, "0"); REJ(g, "0.0000000000000000"); REJ(g, "2.0000000000000001"); REJ(g, "-0.0000000000000001");
    pkv_grammar_free(g);
    g = js("{'type':'number','exclusiveMaximum':-0.3333333333333333333}");
    ACC(g, "-0.3333333333333334"); ACC(g, "-1"); REJ(g, "-0.3333333333333333"); REJ(g, "-0.33"); REJ(g, "0");
    pkv_grammar_free(g);
    /* multipleOf m/10^d: trailing zeros past d digits, at most 16 fraction digits */
    g = js("{'type':'number','multipleOf':0.25,'minimum':-1,'maximum':1}");
    ACC(g, "0.25"); ACC(g, "-0.7500000000000000"); ACC(g, "1.0"); ACC(g, "-1"); ACC(g, "0");
    REJ(g, "0.2"); REJ(g, "0.250000000000000001"); REJ(g, "1.25"); REJ(g, "-0"); REJ(g, "2.5e-1");
    pkv_grammar_free(g);
    g = js("{'type':'number','multipleOf':3e-20}"); /* x 10^16 a multiple of 3: 10^4 is prime to 3 */
    ACC(g, "0.0000000000000003"); ACC(g, "3"); ACC(g, "0.3"); REJ(g, "0.0000000000000001"); REJ(g, "1");
    pkv_grammar_free(g);
    refused("{'type':'number','multipleOf':0.5,'exclusiveMinimum':1,'exclusiveMaximum':1.5}", "no number",
            "'multipleOf' 0.5");
    refused("{'type':'number','minimum':0.5,'maximum':0.25}", "no number satisfies", NULL);
    refused("{'type':'number','exclusiveMinimum':0.25,'maximum':0.25}", "no number satisfies", NULL);
    refused("{'type':'number','minimum':3,'exclusiveMaximum':3}", "no number satisfies", NULL);
}

/* ----------------------------------------------- numbers, against every decimal */

/* A schema on numbers against every decimal of up to 3 integer and 3 fraction
 * digits, both signs (of the 3-digit integer parts, those next to a bound's and a
 * sample): the grammar (walked as a trie of prefixes, a matcher cloned
 * per prefix, a dead prefix's subtree checked without it) against the exact value in
 * int64 scaled by 10^6. Under bounds or a multiple no exponent form, no "-0" and (on
 * an integer) no fraction are written. */
#define NC_SCALE 1000000ll
typedef struct numcase {
    const char *schema;
    bool integer;
    bool has_lo, lo_x;
    int64_t lo; /* x 10^6 */
    bool has_hi, hi_x;
    int64_t hi;
    int64_t mult; /* x 10^6; 0: none */
} numcase;

static const numcase *nc_k;
static int nc_bad;
static long nc_accepted;

static bool nc_want(bool neg, int64_t ip, int64_t frac, bool has_frac) {
    const numcase *k = nc_k;
    int64_t v = ip * NC_SCALE + frac;
    if (neg && v == 0) return false;
    if (neg) v = -v;
    if (k->integer && has_frac) return false;
    if (k->has_lo && (k->lo_x ? v <= k->lo : v < k->lo)) return false;
    if (k->has_hi && (k->hi_x ? v >= k->hi : v > k->hi)) return false;
    return !k->mult || v % k->mult == 0;
}

/* Three-digit integer parts: those next to a bound's and one in 32 of the others
 * (all 900 cost 8x the time: 3 minutes under ASan) */
static bool nc_wide(int64_t ip) {
    const numcase *k = nc_k;
    int64_t l = k->lo < 0 ? -k->lo : k->lo, h = k->hi < 0 ? -k->hi : k->hi;
    if (k->has_lo && ip >= l / NC_SCALE - 1 && ip <= l / NC_SCALE + 1) return true;
    if (k->has_hi && ip >= h / NC_SCALE - 1 && ip <= h / NC_SCALE + 1) return true;
    return (uint64_t)ip * 0x9e3779b97f4a7c15ull >> 59 == 0;
}

static void nc_check(const pkv_gmatch *m, const char *txt, bool want) {
    bool got = m && pkv_gmatch_complete(m);
    th_checks++;
    nc_accepted += got;
    if (got != want && nc_bad++ < 6) TH_FAIL("%s: %s gives %d", nc_k->schema, txt, got);
}

/* m after txt's bytes and then s (NULL if refused or m is NULL; caller frees) */
static pkv_gmatch *nc_step(const pkv_gmatch *m, const char *s) {
    if (!m) return NULL;
    pkv_gmatch *c = pkv_gmatch_clone(m);
    if (c && !pkv_gmatch_accept_bytes(c, s, strlen(s))) {
        pkv_gmatch_free(c);
        c = NULL;
    }
    return c;
}

/* exponent forms of txt are never complete */
static void nc_exponents(const pkv_gmatch *m, char *txt, int n) {
    static const char *const ex[] = {"e1", "E-2", "e+0", "e0"};
    for (int i = 0; i < 4 && m; i++) {
        pkv_gmatch *c = nc_step(m, ex[i]);
        snprintf(txt + n, 8, "%s", ex[i]);
        nc_check(c, txt, false);
        pkv_gmatch_free(c);
    }
    txt[n] = 0;
}

static void nc_frac(const pkv_gmatch *m, char *txt, int n, bool neg, int64_t ip, int64_t frac, int nfd) {
    nc_check(m, txt, nc_want(neg, ip, frac, true));
    if (nfd == 1) nc_exponents(m, txt, n);
    if (nfd == 3) return;
    int64_t w = NC_SCALE;
    for (int i = 0; i <= nfd; i++) w /= 10;
    for (int d = 0; d < 10; d++) {
        char s[2] = {(char)('0' + d), 0};
        txt[n] = s[0], txt[n + 1] = 0;
        pkv_gmatch *c = nc_step(m, s);
        nc_frac(c, txt, n + 1, neg, ip, frac + d * w, nfd + 1);
        pkv_gmatch_free(c);
    }
    txt[n] = 0;
}

static void nc_int(const pkv_gmatch *m, char *txt, int n, bool neg, int64_t ip, int nd) {
    nc_check(m, txt, nc_want(neg, ip, 0, false));
    nc_exponents(m, txt, n);
    pkv_gmatch *dot = nc_step(m, ".");
    txt[n] = '.', txt[n + 1] = 0;
    nc_check(dot, txt, false); /* "1." is not JSON */
    for (int d = 0; d < 10; d++) {
        char s[2] = {(char)('0' + d), 0};
        txt[n + 1] = s[0], txt[n + 2] = 0;
        pkv_gmatch *c = nc_step(dot, s);
        nc_frac(c, txt, n + 2, neg, ip, d * (NC_SCALE / 10), 1);
        pkv_gmatch_free(c);
    }
    pkv_gmatch_free(dot);
    txt[n] = 0;
    if (ip == 0 || nd == 3) return;
    for (int d = 0; d < 10; d++) {
        if (nd == 2 && !nc_wide(ip * 10 + d)) continue;
        char s[2] = {(char)('0' + d), 0};
        txt[n] = s[0], txt[n + 1] = 0;
        pkv_gmatch *c = nc_step(m, s);
        nc_int(c, txt, n + 1, neg, ip * 10 + d, nd + 1);
        pkv_gmatch_free(c);
    }
    txt[n] = 0;
}

static void number_brute(const numcase *k) {
    char *t = jtext(k->schema);
    pkv_grammar *g = pkv_grammar_from_json_schema(t, strlen(t));
    free(t);
    th_checks++;
    if (!g) {
        TH_FAIL("%s: %s", k->schema, pkv_errmsg());
        return;
    }
    nc_k = k;
    nc_bad = 0;
    nc_accepted = 0;
    pkv_gmatch *m0 = pkv_gmatch_create(g);
    char txt[32];
    for (int neg = 0; neg < 2; neg++) {
        pkv_gmatch *ms = neg ? nc_step(m0, "-") : pkv_gmatch_clone(m0);
        for (int d = 0; d < 10; d++) {
            int n = snprintf(txt, sizeof txt, "%s%d", neg ? "-" : "", d);
            char s[2] = {(char)('0' + d), 0};
            pkv_gmatch *c = nc_step(ms, s);
            nc_int(c, txt, n, neg, d, 1);
            pkv_gmatch_free(c);
        }
        pkv_gmatch_free(ms);
    }
    pkv_gmatch_free(m0);
    if (getenv("PKV_TEST_VERBOSE"))
        printf("%s: %ld of the decimals accepted, %zu bytes of grammar\n", k->schema, nc_accepted,
               strlen(pkv_grammar_gbnf(g)));
    pkv_grammar_free(g);
}

#define LO(v) .has_lo = true, .lo = (v)
#define XLO(v) .has_lo = true, .lo_x = true, .lo = (v)
#define HI(v) .has_hi = true, .hi = (v)
#define XHI(v) .has_hi = true, .hi_x = true, .hi = (v)

static const numcase k_numcases[] = {
    {"{'type':'number','minimum':0.5}", LO(500000)},
    {"{'type':'number','exclusiveMinimum':0.5}", XLO(500000)},
    {"{'type':'number','maximum':-2.25}", HI(-2250000)},
    {"{'type':'number','exclusiveMaximum':-2.25}", XHI(-2250000)},
    {"{'type':'number','minimum':1e-3,'maximum':3.0e2}", LO(1000), HI(300000000)},
    {"{'type':'number','exclusiveMinimum':-2.25,'exclusiveMaximum':0.5}", XLO(-2250000), XHI(500000)},
    {"{'type':'number','minimum':0.5,'maximum':99.5}", LO(500000), HI(99500000)}, /* zod .min(0.5).max(99.5) */
    {"{'type':'number','exclusiveMinimum':0}", XLO(0)},                           /* zod .positive() */
    {"{'type':'number','minimum':0.125,'maximum':0.25}", LO(125000), HI(250000)},
    {"{'type':'number','minimum':-0.75,'exclusiveMaximum':-0.5}", LO(-750000), XHI(-500000)},
    {"{'type':'number','exclusiveMinimum':12.345,'exclusiveMaximum':12.346}", XLO(12345000), XHI(12346000)},
    {"{'type':'number','minimum':-12.3456,'maximum':7.0015}", LO(-12345600), HI(7001500)},
    {"{'type':'number','minimum':-5e-1,'exclusiveMaximum':25E-1}", LO(-500000), XHI(2500000)},
    {"{'type':'number','minimum':0,'maximum':0}", LO(0), HI(0)},
    {"{'type':'number','minimum':-999.999,'maximum':999.999}", LO(-999999000), HI(999999000)},
    /* past the 3 fraction digits enumerated here: equivalent to > 2 and <= 0 for them */
    {"{'type':'number','minimum':2.0000000000000001}", XLO(2000000)},
    {"{'type':'number','maximum':1e-20}", HI(0)},
    {"{'type':'number','exclusiveMaximum':-1e-20}", XHI(0)},
    /* draft 4 booleans; both keywords: the stricter applies */
    {"{'type':'number','minimum':1.5,'exclusiveMinimum':true,'maximum':2.5,'exclusiveMaximum':true}", XLO(1500000), XHI(2500000)},
    {"{'type':'number','minimum':1.5,'exclusiveMinimum':1.5,'maximum':3.25,'exclusiveMaximum':3.5}", XLO(1500000), HI(3250000)},
    /* integers: fractional bounds round inwards */
    {"{'type':'integer','minimum':0.5,'maximum':7.5}", .integer = true, LO(500000), HI(7500000)},
    {"{'type':'integer','exclusiveMinimum':-2.5,'exclusiveMaximum':2}", .integer = true, XLO(-2500000), XHI(2000000)},
    {"{'type':'integer','minimum':-1.001,'maximum':-1e-9}", .integer = true, LO(-1001000), HI(-1)},
    /* multipleOf: decimals, and integers above the old limit of 100 */
    {"{'type':'number','multipleOf':0.5}", .mult = 500000},
    {"{'type':'number','multipleOf':0.01}", .mult = 10000}, /* zod .multipleOf(0.01) */
    {"{'type':'number','multipleOf':0.25}", .mult = 250000},
    {"{'type':'number','multipleOf':2.5}", .mult = 2500000},
    {"{'type':'number','multipleOf':0.3,'minimum':-5.5,'maximum':5.5}", LO(-5500000), HI(5500000), .mult = 300000},
    {"{'type':'number','multipleOf':0.25,'minimum':-1.3,'maximum':7.6}", LO(-1300000), HI(7600000), .mult = 250000},
    {"{'type':'number','multipleOf':2.5,'exclusiveMinimum':-10,'exclusiveMaximum':12.5}", XLO(-10000000), XHI(12500000), .mult = 2500000},
    {"{'type':'number','multipleOf':0.01,'minimum':0.005,'maximum':1.999}", LO(5000), HI(1999000), .mult = 10000},
    {"{'type':'number','multipleOf':0.007,'exclusiveMinimum':0.5}", XLO(500000), .mult = 7000},
    {"{'type':'number','multipleOf':7,'minimum':0.5,'maximum':50}", LO(500000), HI(50000000), .mult = 7000000},
    {"{'type':'number','multipleOf':125,'maximum':-0.5}", HI(-500000), .mult = 125000000},
    {"{'type':'number','multipleOf':1e-9}", .mult = 1},
    {"{'type':'number','multipleOf':1,'exclusiveMaximum':5.5}", XHI(5500000), .mult = 1000000},
    {"{'type':'number','multipleOf':0.125,'exclusiveMinimum':0,'exclusiveMaximum':0.5}", XLO(0), XHI(500000), .mult = 125000},
    {"{'type':'integer','multipleOf':250,'minimum':-1000,'maximum':900}", .integer = true, LO(-1000000000), HI(900000000), .mult = 250000000},
    {"{'type':'integer','multipleOf':2.5,'minimum':-20,'maximum':20}", .integer = true, LO(-20000000), HI(20000000), .mult = 2500000},
    {"{'type':'integer','multipleOf':0.5}", .integer = true, .mult = 500000},
    {"{'type':'integer','multipleOf':1000,'minimum':-900000,'maximum':900000}", .integer = true, LO(-900000000000), HI(900000000000), .mult = 1000000000},
};

static void test_number_brute(void) {
    double t0 = pkv_time_now();
    for (size_t i = 0; i < sizeof k_numcases / sizeof *k_numcases; i++) number_brute(&k_numcases[i]);
    printf("numbers against the decimals of 3+3 digits: %zu schemas, %.1f s\n", sizeof k_numcases / sizeof *k_numcases,
           pkv_time_now() - t0);
}

/* ------------------------------------------------------------- strings */

static void test_patterns(void) {
    pkv_grammar *g = js("{'type':'string','pattern':'^[A-Z]{2}-%d{3}$'}");
    ACC(g, "'AB-123'"); REJ(g, "'AB-12'"); REJ(g, "'ab-123'"); REJ(g, "'AB-1234'"); REJ(g, "'xAB-123'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'ab'}"); /* unanchored: anywhere in the string */
    ACC(g, "'ab'"); ACC(g, "'xxabyy'"); ACC(g, "'%n ab %''"); REJ(g, "'a b'"); REJ(g, "''");
    pkv_grammar_free(g);
    g = js("{'pattern':'^a|b$'}"); /* each alternative anchored on its own side */
    ACC(g, "'ax'"); ACC(g, "'xb'"); ACC(g, "'a'"); REJ(g, "'xa'"); REJ(g, "'bx'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^(foo|bar)+(?:!|%?)?$'}");
    ACC(g, "'foobar'"); ACC(g, "'bar!'"); ACC(g, "'foo?'"); REJ(g, "''"); REJ(g, "'fo'"); REJ(g, "'foo!!'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^[^a]$'}");
    ACC(g, "'b'"); ACC(g, "'%''"); ACC(g, "'%%'"); ACC(g, "'\xc3\xa9'"); REJ(g, "'a'"); REJ(g, "'%n'"); REJ(g, "'bb'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^%s%S%w%W%D$'}");
    ACC(g, "' x_-a'"); ACC(g, "'%txa.b'"); REJ(g, "'xx_-a'"); REJ(g, "' x_-1'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^.{2,3}$'}");
    ACC(g, "'ab'"); ACC(g, "'abc'"); ACC(g, "'\xc3\xa9\xc3\xa9'"); REJ(g, "'a'"); REJ(g, "'abcd'"); REJ(g, "'a%n'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^%d+(%.%d{1,2})?$'}");
    ACC(g, "'1.25'"); ACC(g, "'10'"); REJ(g, "'1.234'"); REJ(g, "'1.'"); REJ(g, "'.5'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^(?<n>x)y*?z{2,}$'}");
    ACC(g, "'xzz'"); ACC(g, "'xyyzzz'"); REJ(g, "'xz'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^a`b%%%.%*[%]-]%u00e9%x41[à-ÿ]$'}");
    ACC(g, "'a`b%%.*]\xc3\xa9" "A\xc3\xbf'"); ACC(g, "'a`b%%.*-\xc3\xa9" "A\xc3\xa0'"); REJ(g, "'a`b%%x*]\xc3\xa9" "A\xc3\xa0'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^[%t%n ]+$'}"); /* controls written as their escapes */
    ACC(g, "'%t%n '"); REJ(g, "'\t'");
    pkv_grammar_free(g);
    refused("{'type':'string','pattern':'^(?=a)a$'}", "/pattern", "lookahead '(?='");
    refused("{'type':'string','pattern':'(?<!a)b'}", "/pattern", "lookbehind");
    refused("{'type':'string','pattern':'^(a)%1$'}", "/pattern", "backreference");
    refused("{'type':'string','pattern':'%bword'}", "/pattern", "word boundary");
    refused("{'type':'string','pattern':'%p{L}'}", "/pattern", "Unicode property");
    refused("{'type':'string','pattern':'[]'}", "/pattern", "matches nothing");
    refused("{'type':'string','pattern':'a**'}", "/pattern", "quantifier after a quantifier");
    refused("{'type':'string','pattern':'(a'}", "/pattern", "without ')'");
    refused("{'type':'string','pattern':'a)'}", "/pattern", "without '('");
    refused("{'type':'string','pattern':'a^b'}", "/pattern", "anchor '^'");
    refused("{'type':'string','pattern':'a{1001}'}", "/pattern", "limit of 1000");
    refused("{'type':'string','pattern':'*a'}", "/pattern", "nothing to repeat");
    refused("{'type':'string','pattern':'a{-1}'}", "/pattern", "not a quantifier");
    refused("{'type':'string','pattern':'a{2,1}'}", "/pattern", "maximum is below the minimum");
    refused("{'type':'string','pattern':'%q'}", "/pattern", "unknown escape");
    /* lengths beside a pattern: accepted where the pattern implies them */
    g = js("{'type':'string','pattern':'^[A-Z]{2}-%d{3}$','minLength':6,'maxLength':6}");
    ACC(g, "'AB-123'"); REJ(g, "'AB-12'");
    pkv_grammar_free(g);
    g = js("{'type':'string','pattern':'^(ab|c)x?$','maxLength':3}");
    ACC(g, "'abx'"); ACC(g, "'c'");
    pkv_grammar_free(g);
    refused("{'type':'string','pattern':'^a$','minLength':2}", "minLength 2 / maxLength none with 'pattern' is not supported",
            "1 to 1 characters");
    refused("{'type':'string','pattern':'^a+$','maxLength':5}", "'pattern' is not supported", "1 to any number of");
    refused("{'type':'string','pattern':'^a{2}','maxLength':9}", "any number of", NULL); /* unanchored end */
    refused("{'properties':{'k':{'pattern':'(?i)x'}}}", "/properties/k/pattern", "'(?i'");
}

/* The pattern zod 4 writes for its email and uuid formats (test data: what the node
 * SDK test sends). */
static const char *zod_email = "^(?:[A-Za-z0-9_`+%-]+%.)*[A-Za-z0-9_`+%-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9%-]*%.)+[A-Za-z]{2,}$";

static void test_formats(void) {
    pkv_grammar *g = js("{'type':'string','format':'email'}");
    ACC(g, "'a.b@c.io'"); ACC(g, "'x_1+y@mail-2.example.com'"); REJ(g, "'a@b'"); REJ(g, "'@b.io'"); REJ(g, "'a@-b.io'");
    REJ(g, "'a@b-.io'"); REJ(g, "'.a@b.io'"); REJ(g, "'a..b@c.io'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'uri'}");
    ACC(g, "'https://example.com/a/b'"); CHECK(g && pkv_grammar_accepts(g, "\"ftp://h:21/x%20y\"", strlen("\"ftp://h:21/x%20y\""))); REJ(g, "'example.com'"); REJ(g, "'http://'");
    /* a port WHATWG URL parsers (zod's .url()) take: 0..65535 (found by sdk-responses.cjs) */
    ACC(g, "'x://h:65535'"); ACC(g, "'x://h:0080/a'"); ACC(g, "'x://h:59999'"); REJ(g, "'x://h:65536'");
    REJ(g, "'x://h:68700'"); REJ(g, "'x://h:99999'");
    /* hosts and schemes WHATWG URL parsers refuse: a last label that reads as a number
     * but is no IPv4 address on a special scheme, a port on a file: URL */
    ACC(g, "'http://10.0.0.1:8080/a'"); ACC(g, "'http://a-b.c1'"); ACC(g, "'file://h/x'"); ACC(g, "'files://h:1'");
    ACC(g, "'fil://h:1'"); ACC(g, "'f://h:1'"); ACC(g, "'fi://h:1'"); ACC(g, "'fire://h:1'");
    REJ(g, "'http://a.123'"); REJ(g, "'http://999.1'"); REJ(g, "'http://10.0.0.256'"); REJ(g, "'ws://0x1'");
    REJ(g, "'file://h:80'"); REJ(g, "'http://1.2.3'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'ipv4'}");
    ACC(g, "'192.168.0.1'"); ACC(g, "'255.0.10.9'"); REJ(g, "'256.1.1.1'"); REJ(g, "'1.2.3'"); REJ(g, "'01.2.3.4'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'ipv6'}");
    ACC(g, "'2001:db8:0:0:0:ff00:42:8329'"); REJ(g, "'2001:db8::1'"); REJ(g, "'1:2:3:4:5:6:7'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'hostname'}");
    ACC(g, "'a-b.example'"); ACC(g, "'localhost'"); REJ(g, "'-a'"); REJ(g, "'a-'"); REJ(g, "'a..b'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'date'}");
    ACC(g, "'2024-02-29'"); ACC(g, "'2000-02-29'"); ACC(g, "'2023-04-30'"); ACC(g, "'2023-12-31'");
    REJ(g, "'2023-02-29'"); REJ(g, "'1900-02-29'"); REJ(g, "'2023-04-31'"); REJ(g, "'2023-13-01'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'date-time'}");
    ACC(g, "'2024-02-29T12:30:00Z'"); ACC(g, "'2024-02-28T23:59:59.5+01:00'"); REJ(g, "'2023-02-29T12:30:00Z'");
    pkv_grammar_free(g);
    /* a format with the pattern zod writes beside it */
    char s[512];
    snprintf(s, sizeof s, "{'type':'string','format':'email','pattern':'%s'}", zod_email);
    g = js(s);
    ACC(g, "'a.b@c.io'"); REJ(g, "'a@b-.io'"); REJ(g, "'a@b'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'uuid','pattern':'^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-"
           "[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$'}");
    ACC(g, "'123e4567-e89b-12d3-a456-426614174000'"); REJ(g, "'123e4567-e89b-02d3-a456-426614174000'");
    ACC(g, "'00000000-0000-0000-0000-000000000000'");
    pkv_grammar_free(g);
    refused("{'type':'string','format':'email','pattern':'^x$'}", "'format' 'email' together with a 'pattern'", NULL);
    g = js("{'type':'string','format':'email','maxLength':255}"); /* zod's .email().max(255): implied */
    ACC(g, "'a@b.io'");
    pkv_grammar_free(g);
    g = js("{'type':'string','format':'uuid','minLength':36,'maxLength':36}");
    ACC(g, "'123e4567-e89b-12d3-a456-426614174000'");
    pkv_grammar_free(g);
    refused("{'type':'string','format':'email','maxLength':20}", "maxLength 20 with 'format' is not supported", "6 to 239");
    refused("{'type':'string','format':'idn-email'}", "/format", "'idn-email' is not supported");
}

/* ------------------------------------------------------------- arrays, objects */

static void test_containers(void) {
    /* zod's z.tuple (2020-12, then draft 7) */
    pkv_grammar *g = js("{'type':'array','prefixItems':[{'type':'string'},{'type':'number'}],'items':false,'minItems':2,'maxItems':2}");
    ACC(g, "['a',1]"); ACC(g, "[ 'a', 1.5 ]"); REJ(g, "['a']"); REJ(g, "['a',1,2]"); REJ(g, "[1,'a']"); REJ(g, "[]");
    pkv_grammar_free(g);
    g = js("{'type':'array','items':[{'type':'string'},{'type':'number'}],'additionalItems':false,'minItems':2,'maxItems':2}");
    ACC(g, "['a',1]"); REJ(g, "['a',1,2]"); REJ(g, "['a']");
    pkv_grammar_free(g);
    g = js("{'prefixItems':[{'type':'integer'}],'items':{'type':'string'}}");
    ACC(g, "[]"); ACC(g, "[1]"); ACC(g, "[1,'a','b']"); REJ(g, "[1,2]"); REJ(g, "['a']");
    pkv_grammar_free(g);
    g = js("{'prefixItems':[{'const':1},{'const':2},{'const':3}],'minItems':1,'maxItems':2}");
    ACC(g, "[1]"); ACC(g, "[1,2]"); REJ(g, "[]"); REJ(g, "[1,2,3]");
    pkv_grammar_free(g);
    g = js("{'type':'array','items':[{'type':'null'}],'additionalItems':{'type':'boolean'},'minItems':3}");
    ACC(g, "[null,true,false]"); REJ(g, "[null,true]"); REJ(g, "[null,1,true]");
    pkv_grammar_free(g);
    refused("{'prefixItems':[{}],'items':false,'minItems':2}", "minItems 2 is more than the 1 tuple items", NULL);
    refused("{'type':'array','additionalItems':false}", "/additionalItems", "only beside 'items' as an array");

    /* zod's z.record */
    g = js("{'type':'object','propertyNames':{'type':'string'},'additionalProperties':{'type':'number'}}");
    ACC(g, "{}"); ACC(g, "{'x':1,'y':2.5}"); REJ(g, "{'x':'a'}");
    pkv_grammar_free(g);
    g = js("{'type':'object','propertyNames':{'pattern':'^[a-z]+$'},'additionalProperties':{'type':'integer'}}");
    ACC(g, "{'ab':1}"); REJ(g, "{'Ab':1}"); REJ(g, "{'':1}");
    pkv_grammar_free(g);
    g = js("{'type':'object','propertyNames':{'enum':['a','b']},'additionalProperties':true}");
    ACC(g, "{'a':[],'b':1}"); REJ(g, "{'c':1}");
    pkv_grammar_free(g);
    g = js("{'type':'object','properties':{'id':{'type':'integer'}},'propertyNames':{'maxLength':3},'additionalProperties':true}");
    ACC(g, "{'id':1,'abc':2}"); REJ(g, "{'id':1,'abcd':2}");
    pkv_grammar_free(g);
    refused("{'type':'object','properties':{'long':{}},'propertyNames':{'maxLength':3},'additionalProperties':true}",
            "/propertyNames", "property 'long' is not allowed");
    g = js("{'type':'object','patternProperties':{'^s_':{'type':'string'},'^n_':{'type':'number'}}}");
    ACC(g, "{}"); ACC(g, "{'s_a':'x','n_b':2}"); REJ(g, "{'s_a':1}"); REJ(g, "{'x':1}");
    pkv_grammar_free(g);
    g = js("{'type':'object','properties':{'id':{'type':'integer'}},'required':['id'],'patternProperties':{'^x-':{}},"
           "'additionalProperties':false}");
    ACC(g, "{'id':1}"); ACC(g, "{'id':1,'x-a':[1]}"); REJ(g, "{'id':1,'y':1}");
    pkv_grammar_free(g);
    refused("{'properties':{'s_a':{}},'patternProperties':{'^s_':{}}}", "property 's_a' also matches", NULL);
    refused("{'patternProperties':{'^a':{}},'additionalProperties':true}", "/additionalProperties", "patternProperties");

    /* allOf of objects merged (zod's .and()), through references too */
    g = js("{'allOf':[{'type':'object','properties':{'a':{'type':'integer'}},'required':['a'],'additionalProperties':false},"
           "{'$ref':'#/$defs/b'}],'$defs':{'b':{'type':'object','properties':{'b':{'type':'string'}},'required':['b'],"
           "'additionalProperties':false}}}");
    ACC(g, "{'a':1,'b':'x'}"); REJ(g, "{'a':1}"); REJ(g, "{'b':'x'}"); REJ(g, "{'a':1,'b':'x','c':1}");
    pkv_grammar_free(g);
    g = js("{'type':'object','properties':{'z':{'type':'null'}},'allOf':[{'properties':{'a':{'type':'boolean'}}}]}");
    ACC(g, "{'z':null,'a':true}"); ACC(g, "{}"); REJ(g, "{'a':1}");
    pkv_grammar_free(g);
    refused("{'allOf':[{'properties':{'a':{}}},{'properties':{'a':{}}}]}", "property 'a' in two 'allOf' members", NULL);
    refused("{'allOf':[{'type':'string'},{'minLength':1}]}", "/allOf/0/type", "object schemas only");

    /* nullable (OpenAPI 3.0) */
    g = js("{'type':'string','nullable':true}");
    ACC(g, "'x'"); ACC(g, "null"); REJ(g, "1");
    pkv_grammar_free(g);
    g = js("{'type':'object','properties':{'n':{'type':'integer','minimum':1,'nullable':true}},'required':['n']}");
    ACC(g, "{'n':null}"); ACC(g, "{'n':3}"); REJ(g, "{'n':0}");
    pkv_grammar_free(g);
    g = js("{'type':'integer','nullable':false}");
    REJ(g, "null"); ACC(g, "1");
    pkv_grammar_free(g);
    refused("{'type':'integer','nullable':1}", "/nullable", "boolean");
}

/* The object zod 4 writes for a schema using every common type (z.toJSONSchema):
 * compiles, its grammar stays small, and a hand-written valid document passes. */
static void test_zod_object(void) {
    char s[4096];
    snprintf(s, sizeof s,
             "{'$schema':'https://json-schema.org/draft/2020-12/schema','type':'object','properties':{"
             "'n':{'type':'integer','minimum':-9007199254740991,'maximum':9007199254740991},"
             "'p':{'type':'integer','exclusiveMinimum':0,'maximum':9007199254740991},'f':{'type':'number','exclusiveMinimum':0},"
             "'e':{'type':'string','format':'email','pattern':'%s'},'url':{'type':'string','format':'uri'},"
             "'re':{'type':'string','pattern':'^[A-Z]{2}-%%d{3}$'},"
             "'t':{'type':'array','prefixItems':[{'type':'string'},{'type':'number'}],'items':false,'minItems':2,'maxItems':2},"
             "'r':{'type':'object','propertyNames':{'type':'string'},'additionalProperties':{'type':'number'}},"
             "'en':{'type':'string','enum':['a','b']},'o':{'type':'string'},'nl':{'type':['string','null']}},"
             "'required':['n','p','f','e','url','re','t','r','en','nl'],'additionalProperties':false}",
             zod_email);
    pkv_grammar *g = js(s);
    size_t size = g ? strlen(pkv_grammar_gbnf(g)) : 0;
    printf("zod object with every common type: %zu bytes of grammar\n", size);
    CHECK(size < 32768);
    ACC(g, "{'n':-5,'p':3,'f':0.25,'e':'a@b.io','url':'https://x.io/y','re':'AB-123','t':['s',1],'r':{'k':2},'en':'b',"
           "'nl':null}");
    REJ(g, "{'n':-5,'p':0,'f':0.25,'e':'a@b.io','url':'https://x.io/y','re':'AB-123','t':['s',1],'r':{'k':2},'en':'b',"
           "'nl':null}");
    pkv_grammar_free(g);
}

/* A small schema asking for a large grammar is refused while it is made. */
static void test_limits(void) {
    char *big = malloc(200000);
    size_t n = (size_t)snprintf(big, 200000, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(big + n, 200000 - n, "%s\"p%d\":{\"type\":\"integer\",\"multipleOf\":97}", i ? "," : "", i);
    snprintf(big + n, 200000 - n, "}}");
    pkv_grammar *g = pkv_grammar_from_json_schema(big, strlen(big));
    th_checks++;
    if (g) TH_FAIL("a 100 x multipleOf 97 schema compiled (%zu bytes)", strlen(pkv_grammar_gbnf(g)));
    else if (!strstr(pkv_errmsg(), "over the limit of 1048576 bytes")) TH_FAIL("message: %s", pkv_errmsg());
    pkv_grammar_free(g);
    /* listed properties against key patterns: the checks are bounded */
    n = (size_t)snprintf(big, 200000, "{\"properties\":{");
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(big + n, 200000 - n, "%s\"p%d\":{}", i ? "," : "", i);
    n += (size_t)snprintf(big + n, 200000 - n, "},\"patternProperties\":{");
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(big + n, 200000 - n, "%s\"^q%d$\":{}", i ? "," : "", i);
    snprintf(big + n, 200000 - n, "}}");
    g = pkv_grammar_from_json_schema(big, strlen(big));
    th_checks++;
    if (g || !strstr(pkv_errmsg(), "limit of 65536 checks")) TH_FAIL("300 x 300 key checks: %s", g ? "compiled" : pkv_errmsg());
    pkv_grammar_free(g);
    free(big);
}

/* Every allocation of a rich schema's conversion failing in turn: an error, no leak
 * (the ASan build checks), no crash. */
static void test_alloc_failures(void) {
    char *t = jtext("{'type':'object','properties':{'a':{'type':'integer','minimum':-100,'maximum':100000,'multipleOf':3},"
                    "'b':{'pattern':'^[a-c]+(x|y){2}$'},'c':{'prefixItems':[{'type':'number','exclusiveMinimum':0}]},"
                    "'d':{'propertyNames':{'pattern':'^k'},'additionalProperties':{'nullable':true,'type':'boolean'}},"
                    "'e':{'allOf':[{'properties':{'x':{}}},{'properties':{'y':{}}}]},"
                    "'f':{'type':'number','exclusiveMinimum':-2.25,'maximum':7.5,'multipleOf':0.25},"
                    "'g':{'type':'number','minimum':0.125,'exclusiveMaximum':0.5}}}");
    int64_t live = pkv_alloc_live();
    pkv_alloc_fail_at(0);
    pkv_grammar *g = pkv_grammar_from_json_schema(t, strlen(t));
    uint64_t total = pkv_alloc_fail_at(0);
    CHECK(g != NULL);
    pkv_grammar_free(g);
    int failed = 0;
    for (uint64_t n = 1; n <= total; n++) {
        pkv_alloc_fail_at(n);
        g = pkv_grammar_from_json_schema(t, strlen(t));
        pkv_alloc_fail_at(0);
        failed += !g;
        pkv_grammar_free(g);
        th_checks++;
        if (pkv_alloc_live() != live) {
            TH_FAIL("allocation %llu failing leaks %lld", (unsigned long long)n, (long long)(pkv_alloc_live() - live));
            break;
        }
    }
    CHECK(failed > 10);
    free(t);
}

int main(void) {
    test_integers();
    test_numbers();
    test_number_brute();
    test_patterns();
    test_formats();
    test_containers();
    test_zod_object();
    test_limits();
    test_alloc_failures();
    printf("test-json-schema: %ld checks, %d failures\n", th_checks, th_failures);
    return th_failures ? 1 : 0;
}
