// labels: unit engine timeout=600
/* Constrained output: GBNF parsing and matching, JSON schema conversion (every
 * supported keyword with documents it must accept and refuse, refusals naming the
 * JSON pointer), trie masks against a brute-force scan of every token, and the
 * engine end to end on a random-weight model: outputs at temperature > 0 and greedy
 * parse with jansson and satisfy the schema, bounded schemas end with EOS within the
 * bound, and a constrained request gives the same tokens alone, batched, and with
 * speculative decoding. */
#include "testhelp.h"

#include "base/base.h"
#include "engine/grammar.h"

#ifdef PKV_HAVE_JANSSON
#include <jansson.h>
#endif

static pkv_grammar *gb(const char *text) {
    pkv_grammar *g = pkv_grammar_from_gbnf(text, strlen(text));
    if (!g) TH_FAIL("grammar failed: %s\n%s", pkv_errmsg(), text);
    return g;
}

#define ACC(g, s) CHECK(pkv_grammar_accepts((g), (s), strlen(s)))
#define REJ(g, s) CHECK(!pkv_grammar_accepts((g), (s), strlen(s)))

/* The grammar is refused with a message containing each of the words. */
static void gbnf_refused(const char *text, const char *w1, const char *w2) {
    pkv_grammar *g = pkv_grammar_from_gbnf(text, strlen(text));
    th_checks++;
    if (g) {
        TH_FAIL("grammar accepted, want an error with '%s':\n%s", w1, text);
        pkv_grammar_free(g);
        return;
    }
    const char *m = pkv_errmsg();
    if (!strstr(m, w1) || (w2 && !strstr(m, w2))) TH_FAIL("message '%s' lacks '%s' / '%s'", m, w1, w2 ? w2 : "");
}

static void test_gbnf(void) {
    pkv_grammar *g = gb("root ::= \"a\" [b-d]+ \"e\"?");
    ACC(g, "ab"); ACC(g, "abcd"); ACC(g, "abde");
    REJ(g, "a"); REJ(g, "ae"); REJ(g, "abx"); REJ(g, "abee"); REJ(g, "");
    pkv_grammar_free(g);

    g = gb("root ::= (\"ab\" | \"c\"){2,3}");
    ACC(g, "abc"); ACC(g, "cab"); ACC(g, "ccc"); ACC(g, "ababab");
    REJ(g, "ab"); REJ(g, "cccc"); REJ(g, "abcabc");
    pkv_grammar_free(g);

    g = gb("root ::= [0-9]{2,} \"-\" \"x\"{3} [a]{0,2}");
    ACC(g, "12-xxx"); ACC(g, "12345-xxxaa");
    REJ(g, "1-xxx"); REJ(g, "12-xx"); REJ(g, "12-xxxaaa");
    pkv_grammar_free(g);

    g = gb("root ::= [^a-c]* \".\" .");
    ACC(g, "xyz.a"); ACC(g, "..."); ACC(g, ".\xe3\x81\x82");
    REJ(g, "a.b"); REJ(g, "xyz."); REJ(g, "xyz.ab");
    pkv_grammar_free(g);

    g = gb("root ::= \"\\x41\\u00e9\\n\\\"\\\\\" [\\]\\-] [\\U0001F600]");
    ACC(g, "A\xc3\xa9\n\"\\]\xf0\x9f\x98\x80"); ACC(g, "A\xc3\xa9\n\"\\-\xf0\x9f\x98\x80");
    REJ(g, "A\xc3\xa9\n\"\\x\xf0\x9f\x98\x80");
    pkv_grammar_free(g);

    /* comments, rules over several lines, '|' on the next line, forward references */
    g = gb("# a comment\n"
           "root ::= a\n"
           "  | b   # the other one\n"
           "\n"
           "a ::= \"x\" (\n"
           "  \"y\" |\n"
           "  \"z\"   # inside a group\n"
           ")\n"
           "b ::= \"w\" c*\n"
           "c ::= [0-9]\n");
    ACC(g, "xy"); ACC(g, "xz"); ACC(g, "w"); ACC(g, "w123");
    REJ(g, "x"); REJ(g, "wx"); REJ(g, "xyz");
    pkv_grammar_free(g);

    /* right recursion and nesting */
    g = gb("root ::= list\nlist ::= \"(\" (item (\",\" item)*)? \")\"\nitem ::= [a-z]+ | list");
    ACC(g, "()"); ACC(g, "(a,(b,()),c)");
    REJ(g, "(a,)"); REJ(g, "((a)"); REJ(g, "(a))");
    pkv_grammar_free(g);

    /* errors name the line and column and the problem */
    gbnf_refused("root ::= foo", "'foo'", "never defined");
    gbnf_refused("start ::= \"a\"", "no rule named 'root'", NULL);
    gbnf_refused("root ::= root \"a\" | \"b\"", "left-recursive", "'root'");
    gbnf_refused("root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"", "left-recursive", "'x'");
    gbnf_refused("root ::= \"abc", "unterminated string", "line 1");
    gbnf_refused("root ::= \"a\"\nx ::= [a-", "line 2", "unterminated character class");
    gbnf_refused("root ::= \"a\"\nroot ::= \"b\"", "defined twice", "line 2, column 1");
    gbnf_refused("root ::= \"a\"{3,1}", "n below m", NULL);
    gbnf_refused("root ::= *", "nothing before it", NULL);
    gbnf_refused("root ::= \"a\" )", "unexpected ')'", NULL);
    gbnf_refused("root ::= [z-a]", "end below its start", NULL);
    gbnf_refused("root ::= \"\\q\"", "unknown escape", NULL);
    gbnf_refused("root ::= <think>", "token references", NULL);
    gbnf_refused("root ::= \"a\"{100001}", "above 100000", NULL);
}

/* UTF-8 fed byte by byte, code points split across calls. */
static void test_utf8(void) {
    pkv_grammar *g = gb("root ::= [\\u3041-\\u309f]+ \"\xc3\xa9\"?");
    pkv_gmatch *m = pkv_gmatch_create(g);
    const char *s = "\xe3\x81\x82\xe3\x81\x84"; /* two hiragana */
    for (int i = 0; i < 6; i++) {
        CHECK(pkv_gmatch_accept_bytes(m, s + i, 1));
        CHECK_INT(pkv_gmatch_complete(m), i == 2 || i == 5);
    }
    CHECK(!pkv_gmatch_accept_bytes(m, "a", 1));
    CHECK(!pkv_gmatch_accept_bytes(m, "\xe3\x41", 2)); /* not a continuation */
    CHECK(!pkv_gmatch_accept_bytes(m, "\xf0", 1));     /* no 4-byte code point allowed */
    CHECK(!pkv_gmatch_accept_bytes(m, "\xe4", 1));     /* U+4000.. is outside the class */
    CHECK(!pkv_gmatch_accept_bytes(m, "\x80", 1));     /* a lone continuation byte */
    CHECK(pkv_gmatch_complete(m));                      /* rejections changed nothing */
    pkv_gmatch *c = pkv_gmatch_clone(m);
    CHECK(pkv_gmatch_accept_bytes(m, "\xc3", 1));
    CHECK(!pkv_gmatch_complete(m));
    CHECK(pkv_gmatch_complete(c)); /* the clone is independent */
    CHECK(pkv_gmatch_accept_bytes(m, "\xa9", 1));
    CHECK(pkv_gmatch_complete(m) && pkv_gmatch_dead(m));
    CHECK(pkv_gmatch_accept_bytes(c, "\xe3\x81", 2));
    pkv_gmatch_reset(c);
    CHECK(!pkv_gmatch_complete(c));
    CHECK(!pkv_gmatch_accept_bytes(c, "\xc3\xa9", 2)); /* needs a hiragana first */
    pkv_gmatch_free(c);
    pkv_gmatch_free(m);
    pkv_grammar_free(g);
    /* any character: a prefix that can only become a surrogate, an overlong form or a
     * value past U+10FFFF is refused at its second byte (else no byte could follow it;
     * a random model once emitted ED A5 inside a JSON string and was stuck) */
    g = gb("root ::= [^\"]*");
    m = pkv_gmatch_create(g);
    static const char *const bad[] = {"\xed\xa0", "\xed\xbf", "\xe0\x80", "\xe0\x9f", "\xf0\x80", "\xf0\x8f",
                                      "\xf4\x90", "\xc0", "\xc1", "\xf5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK(!pkv_gmatch_accept_bytes(m, bad[i], strlen(bad[i])));
    CHECK(pkv_gmatch_accept_bytes(m, "\xed\x9f\xbf", 3)); /* U+D7FF */
    CHECK(pkv_gmatch_accept_bytes(m, "\xee\x80\x80", 3)); /* U+E000 */
    CHECK(pkv_gmatch_accept_bytes(m, "\xf4\x8f\xbf\xbf", 4)); /* U+10FFFF */
    CHECK(pkv_gmatch_accept_bytes(m, "\xe0\xa0\x80", 3)); /* U+0800 */
    CHECK(pkv_gmatch_complete(m));
    pkv_gmatch_free(m);
    pkv_grammar_free(g);
}

/* ------------------------------------------------------------ JSON schema */

static pkv_grammar *js(const char *schema) {
    pkv_grammar *g = pkv_grammar_from_json_schema(schema, strlen(schema));
    if (!g) TH_FAIL("schema failed: %s\n%s", pkv_errmsg(), schema);
    return g;
}

static void schema_refused(const char *schema, const char *w1, const char *w2) {
    pkv_grammar *g = pkv_grammar_from_json_schema(schema, strlen(schema));
    th_checks++;
    if (g) {
        TH_FAIL("schema accepted, want an error with '%s':\n%s", w1, schema);
        pkv_grammar_free(g);
        return;
    }
    const char *m = pkv_errmsg();
    if (!strstr(m, w1) || (w2 && !strstr(m, w2))) TH_FAIL("message '%s' lacks '%s' / '%s'", m, w1, w2 ? w2 : "");
}

static const char *k_person =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"type\":\"string\"}},\"required\":[\"name\"]}";

static void test_schema(void) {
    pkv_grammar *g = js("{\"type\":\"object\"}");
    ACC(g, "{}"); ACC(g, "{\"a\":1,\"b\":[true,null,\"x\",-2.5e3,{}]}"); ACC(g, "{ \"a\" : { } }");
    ACC(g, "{\n  \"a\": 1\n}"); ACC(g, "{\"\\u00e9\\n\":\"\xc3\xa9\"}");
    REJ(g, "[]"); REJ(g, "{\"a\"}"); REJ(g, "{\"a\":1,}"); REJ(g, "{\"a\":01}"); REJ(g, "{\"a\":\"\x01\"}");
    REJ(g, " {}"); REJ(g, "{\"a\":  1}"); /* whitespace: none before the value, at most one space */
    ACC(g, "{\"a\":\n                1}");  /* a newline and 16 blanks */
    REJ(g, "{\"a\":\n                 1}"); /* 17 */
    pkv_grammar_free(g);

    g = js(k_person);
    ACC(g, "{\"name\":\"x\"}"); ACC(g, "{\"name\":\"x\",\"age\":3}"); ACC(g, "{\"name\":\"x\",\"email\":\"e\"}");
    ACC(g, "{\"name\":\"x\",\"age\":-3,\"email\":\"e\"}");
    REJ(g, "{\"age\":3}"); REJ(g, "{\"age\":3,\"name\":\"x\"}"); REJ(g, "{\"name\":\"x\",\"extra\":1}");
    REJ(g, "{\"name\":\"x\",\"age\":3.5}"); REJ(g, "{\"name\":1}"); REJ(g, "{}");
    pkv_grammar_free(g);

    /* only optional properties, in order */
    g = js("{\"properties\":{\"a\":{},\"b\":{\"type\":\"null\"}}}");
    ACC(g, "{}"); ACC(g, "{\"b\":null}"); ACC(g, "{\"a\":[1],\"b\":null}"); ACC(g, "{\"a\":{\"x\":\"y\"}}");
    REJ(g, "{\"b\":null,\"a\":2}"); REJ(g, "{\"b\":1}"); REJ(g, "{\"c\":1}");
    pkv_grammar_free(g);

    /* additionalProperties */
    g = js("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}");
    ACC(g, "{\"a\":1,\"z\":[]}"); ACC(g, "{\"z\":\"q\"}"); ACC(g, "{}");
    pkv_grammar_free(g);
    g = js("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}");
    ACC(g, "{\"x\":true,\"y\":false}"); ACC(g, "{}");
    REJ(g, "{\"x\":1}");
    pkv_grammar_free(g);
    g = js("{\"type\":\"object\",\"additionalProperties\":false}");
    ACC(g, "{}"); REJ(g, "{\"x\":1}");
    pkv_grammar_free(g);

    /* arrays */
    g = js("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}");
    ACC(g, "[1]"); ACC(g, "[1, 2,3]"); ACC(g, "[ 1 ]");
    REJ(g, "[]"); REJ(g, "[1,2,3,4]"); REJ(g, "[\"a\"]"); REJ(g, "[1,]");
    pkv_grammar_free(g);
    g = js("{\"type\":\"array\"}");
    ACC(g, "[]"); ACC(g, "[1,\"a\",[],{}]");
    pkv_grammar_free(g);
    g = js("{\"type\":\"array\",\"maxItems\":0}");
    ACC(g, "[]"); REJ(g, "[1]");
    pkv_grammar_free(g);

    /* strings */
    g = js("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    ACC(g, "\"ab\""); ACC(g, "\"abc\""); ACC(g, "\"a\\nb\""); ACC(g, "\"\xc3\xa9\xc3\xa9\""); ACC(g, "\"\\u00e9x\"");
    REJ(g, "\"a\""); REJ(g, "\"abcd\""); REJ(g, "\"ab"); REJ(g, "ab");
    pkv_grammar_free(g);
    g = js("{\"type\":\"string\",\"format\":\"date\"}");
    ACC(g, "\"2024-02-29\""); REJ(g, "\"2024-13-01\""); REJ(g, "\"24-01-01\"");
    pkv_grammar_free(g);
    g = js("{\"type\":\"string\",\"format\":\"date-time\"}");
    ACC(g, "\"2024-02-29T12:30:00Z\""); ACC(g, "\"2024-02-29T23:59:59.123+01:00\""); REJ(g, "\"2024-02-29 12:30:00\"");
    pkv_grammar_free(g);
    g = js("{\"type\":\"string\",\"format\":\"uuid\"}");
    ACC(g, "\"123e4567-e89b-12d3-a456-426614174000\""); REJ(g, "\"123e4567e89b12d3a456426614174000\"");
    pkv_grammar_free(g);

    /* enum, const */
    g = js("{\"enum\":[\"red\",\"gr\\\"een\",1,null,[1,2],{\"a\":true}]}");
    ACC(g, "\"red\""); ACC(g, "\"gr\\\"een\""); ACC(g, "1"); ACC(g, "null"); ACC(g, "[1,2]"); ACC(g, "{\"a\":true}");
    REJ(g, "\"blue\""); REJ(g, "2"); REJ(g, "\"re\"");
    pkv_grammar_free(g);
    g = js("{\"const\":{\"a\":[1,\"x\"]}}");
    ACC(g, "{\"a\":[1,\"x\"]}"); REJ(g, "{\"a\":[1]}");
    pkv_grammar_free(g);

    /* numbers, integers, booleans, null */
    g = js("{\"type\":\"number\"}");
    ACC(g, "0"); ACC(g, "-1.5e10"); ACC(g, "12"); ACC(g, "3.25E-3");
    REJ(g, "01"); REJ(g, "1."); REJ(g, ".5"); REJ(g, "+1"); REJ(g, "12345678901234567"); /* 17 integer digits */
    pkv_grammar_free(g);
    g = js("{\"type\":\"integer\"}");
    ACC(g, "-7"); ACC(g, "0"); REJ(g, "1.0"); REJ(g, "1e3"); REJ(g, "-0.1");
    pkv_grammar_free(g);
    g = js("{\"type\":\"boolean\"}");
    ACC(g, "true"); ACC(g, "false"); REJ(g, "True"); REJ(g, "1");
    pkv_grammar_free(g);

    /* anyOf, oneOf, type arrays, allOf of one */
    g = js("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\"}]}");
    ACC(g, "\"a\""); ACC(g, "5"); REJ(g, "\"ab\""); REJ(g, "true");
    pkv_grammar_free(g);
    g = js("{\"oneOf\":[{\"const\":1},{\"const\":2}]}");
    ACC(g, "1"); ACC(g, "2"); REJ(g, "3");
    pkv_grammar_free(g);
    g = js("{\"type\":[\"string\",\"null\"],\"maxLength\":2}");
    ACC(g, "\"ab\""); ACC(g, "null"); REJ(g, "\"abc\""); REJ(g, "0");
    pkv_grammar_free(g);
    g = js("{\"allOf\":[{\"type\":\"integer\"}]}");
    ACC(g, "3"); REJ(g, "\"3\"");
    pkv_grammar_free(g);

    /* $ref to $defs (recursive) and definitions; true and {} are any value */
    g = js("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":"
           "\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}");
    ACC(g, "{\"v\":1}"); ACC(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}");
    REJ(g, "{\"v\":1,\"kids\":[{}]}");
    pkv_grammar_free(g);
    g = js("{\"definitions\":{\"a~b/c\":{\"type\":\"boolean\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/a~0b~1c\"}}");
    ACC(g, "[true,false]"); REJ(g, "[1]");
    pkv_grammar_free(g);
    g = js("true");
    ACC(g, "[1,{\"a\":null}]"); ACC(g, "\"s\"");
    pkv_grammar_free(g);
    g = js("{\"title\":\"T\",\"description\":\"any\"}");
    ACC(g, "7");
    pkv_grammar_free(g);

    /* refusals name the JSON pointer and the keyword */
    schema_refused("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"minimum\":0,\"contains\":{}}}}",
                   "/properties/age/contains", "'contains' is not supported");
    schema_refused("{\"type\":\"object\",\"properties\":{\"a/b\":{\"type\":\"string\",\"pattern\":\"^(?=x)$\"}}}",
                   "/properties/a~1b/pattern", "lookahead");
    schema_refused("{\"not\":{\"type\":\"string\"}}", "/not", "'not'");
    schema_refused("{\"if\":{},\"then\":{}}", "/if", "'if'");
    schema_refused("{\"type\":\"object\",\"patternProperties\":[]}", "/patternProperties", "must be an object");
    schema_refused("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"iri\"}}", "/items/format", "'iri'");
    schema_refused("{\"$ref\":\"https://example.com/s.json\"}", "/$ref", "local references");
    schema_refused("{\"$ref\":\"#/$defs/missing\"}", "/$ref", "does not resolve");
    schema_refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems 2 is below minItems 3", NULL);
    schema_refused("{\"type\":\"string\",\"maxLength\":-1}", "/maxLength", "non-negative integer");
    schema_refused("{\"type\":\"strin\"}", "/type", "unknown type 'strin'");
    schema_refused("{\"anyOf\":[{\"type\":\"string\"},false]}", "/anyOf/1", "accepts nothing");
    schema_refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "/required/0", "'b'");
    schema_refused("{\"type\":\"object\",", "invalid JSON", NULL);
    schema_refused("{\"allOf\":[{},{}]}", "/allOf", "object schemas only");
    schema_refused("[1]", "must be an object or a boolean", NULL);
}

/* ------------------------------------------------------------ masks */

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A vocabulary of JSON-ish pieces, multi-byte and split UTF-8, runs that share
 * prefixes (so subtrees are large enough to be taken whole), and one EOG token. */
enum { MV_MAX = 1024 };
static char mv_buf[MV_MAX][16];
static const char *mv_piece[MV_MAX];
static size_t mv_len[MV_MAX];
static int mv_n;

static void mv_add(const char *s, size_t n) {
    if (mv_n >= MV_MAX || n > 15) return;
    memcpy(mv_buf[mv_n], s, n);
    mv_piece[mv_n] = mv_buf[mv_n];
    mv_len[mv_n++] = n;
}

static pkv_grammar_vocab *mask_vocab(int32_t *eog) {
    mv_n = 0;
    for (int c = 1; c < 256; c++) {
        char b = (char)c;
        mv_add(&b, 1);
    }
    static const char *const extra[] = {
        "{\"", "\":", "\",", "\"}", "\"]", "},", "],", "{}", "[]", "true", "false", "null", " \"", ": ", ", ",
        "\n  ", "\n    ", "  ", "12", "123", "0.", "-1", "e+", "\\n", "\\u00", "\\\"", "a\"b", "ab", "abc", "abcd",
        "abcde", "ax", "ay", "az", "a1", "a2", " a", " ab", " abc", "\xc3\xa9", "\xc3\xa9t\xc3\xa9", "\xe3\x81\x82",
        "\xe3\x81", "\x82", "\xe3\x81\x82\xe3\x81\x84", "x\xc3", "\xa9x", "name", "\"name", "\"name\":", "age", "\"age\":",
        "\"tags\":[", "red", "\"red\"", "green", "ok", "\"ok\":", "2024", "-01-", "T12", ":00", "Z\"", "\xf0\x9f\x98\x80",
        "\xf0\x9f", "\x98\x80", "aaaa", "aaaaaaaa", "bbbb", "b\"", "b\",", "x\\", "\\\\", "\"\"", "[{", "}]", "0", "00", "1e5",
    };
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) mv_add(extra[i], strlen(extra[i]));
    for (int i = 0; i < 200; i++) { /* random words with shared prefixes */
        char w[12];
        int n = 2 + (int)(rnd() % 8);
        for (int j = 0; j < n; j++) w[j] = "abcdeg \"\\:,{}[]0123."[rnd() % (j < 2 ? 6 : 20)];
        mv_add(w, (size_t)n);
    }
    *eog = mv_n;
    mv_add("</s>", 4); /* an end-of-generation token (its text is never matched) */
    mv_add("", 0);     /* a control token without text: never allowed */
    return pkv_grammar_vocab_from_pieces(mv_piece, mv_len, mv_n, eog, 1);
}

/* At each step: the trie mask equals a scan of every token through a clone; then a
 * random allowed token is taken. Ends at EOG. */
static void mask_walk(pkv_grammar *g, const pkv_grammar_vocab *v, int32_t eog, int steps, bool *ended) {
    pkv_gmatch *m = pkv_gmatch_create(g);
    int n = pkv_grammar_vocab_n(v);
    uint64_t bits[(MV_MAX + 63) / 64];
    *ended = false;
    for (int s = 0; s < steps; s++) {
        int64_t cnt = pkv_gmatch_mask(m, v, bits), brute = 0;
        int32_t allowed[MV_MAX];
        int bad = 0;
        for (int32_t t = 0; t < n; t++) {
            pkv_gmatch *c = pkv_gmatch_clone(m);
            bool ok = pkv_gmatch_accept_token(c, v, t);
            pkv_gmatch_free(c);
            bool in = bits[t >> 6] >> (t & 63) & 1;
            if (ok != in && bad++ < 3)
                TH_FAIL("step %d token %d (%.*s): brute force says %d, mask %d", s, t, (int)mv_len[t], mv_piece[t], ok, in);
            if (ok) allowed[brute++] = t;
        }
        th_checks++;
        CHECK_INT(cnt, brute);
        if (!brute) {
            TH_FAIL("no token allowed at step %d", s);
            break;
        }
        int32_t t = allowed[rnd() % (uint64_t)brute];
        if (s > steps / 2 && (bits[eog >> 6] >> (eog & 63) & 1)) t = eog; /* end when it may */
        CHECK(pkv_gmatch_accept_token(m, v, t));
        if (t == eog) {
            *ended = true;
            break;
        }
    }
    pkv_gmatch_free(m);
}

static void test_masks(void) {
    int32_t eog;
    pkv_grammar_vocab *v = mask_vocab(&eog);
    CHECK(v != NULL);
    if (!v) return;
    const char *schemas[] = {
        "{\"type\":\"object\"}",
        k_person,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"tags\":{\"type\":\"array\","
        "\"items\":{\"enum\":[\"red\",\"green\"]},\"maxItems\":2},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"ok\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"date-time\"}}",
    };
    for (size_t k = 0; k < sizeof schemas / sizeof *schemas; k++) {
        pkv_grammar *g = js(schemas[k]);
        if (!g) continue;
        int ended = 0;
        for (int seed = 0; seed < 6; seed++) {
            rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1 + 10 * (int)k);
            bool e;
            mask_walk(g, v, eog, 60, &e);
            ended += e;
        }
        if (k == 2) CHECK(ended > 0); /* the bounded one ends */
        pkv_grammar_free(g);
    }
    /* a hand-written grammar with UTF-8 classes and split code points */
    pkv_grammar *g = gb("root ::= ([\\u00e0-\\u00ff] | [\\u3041-\\u309f] | [a-c])+ \"!\"? | [\\U0001F600-\\U0001F64F]{1,3}");
    for (int seed = 0; seed < 6; seed++) {
        rng_state = 1234567ull * (uint64_t)(seed + 1);
        bool e;
        mask_walk(g, v, eog, 30, &e);
    }
    pkv_grammar_free(g);
    pkv_grammar_vocab_free(v);
}


/* Sampling under number bounds and decimal multiples (issue 45): random walks through
 * the masks of a vocabulary with digit runs, each output's numbers checked exactly
 * (the decimal text scaled by 10^16 in int64) against the schema's bounds and
 * multiple; the walks end at EOG (the array and its numbers are bounded). */
static bool dec16(const char *s, size_t n, int64_t *out) {
    size_t i = 0;
    bool neg = i < n && s[i] == '-';
    i += neg;
    int64_t ip = 0, fr = 0, w = 1000000000000000ll; /* 10^15: the first fraction digit's weight at 10^16 */
    if (i == n) return false;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        if (ip > 100) return false;
        ip = 10 * ip + (s[i] - '0');
    }
    if (i < n && s[i] == '.')
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++, w /= 10) {
            if (!w) return false;
            fr += (s[i] - '0') * w;
        }
    if (i != n) return false;
    int64_t v = ip * 10000000000000000ll + fr;
    *out = neg ? -v : v;
    return true;
}

/* The numbers of an output "[n, n ...]" (any whitespace) checked against lo < x <= hi,
 * x a multiple of mult (all x 10^16); how many there were. */
static int check_numbers(const char *schema, const char *text, size_t len, int64_t lo, int64_t hi, int64_t mult) {
    int numbers = 0;
    for (size_t i = 1; i < len;) {
        while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == ',')) i++;
        size_t j = i;
        while (j < len && (text[j] == '-' || text[j] == '.' || (text[j] >= '0' && text[j] <= '9'))) j++;
        if (j == i) break;
        int64_t x;
        th_checks++;
        numbers++;
        if (!dec16(text + i, j - i, &x)) TH_FAIL("%s: not a plain decimal: %.*s", schema, (int)(j - i), text + i);
        else if (!(x > lo && x <= hi && x % mult == 0) || (x == 0 && text[i] == '-'))
            TH_FAIL("%s: %.*s is outside the schema", schema, (int)(j - i), text + i);
        i = j;
    }
    return numbers;
}

static const struct {
    const char *schema;
    int64_t lo, hi, mult; /* x 10^16; lo exclusive, hi inclusive */
} k_num_cases[] = {
    {"{\"type\":\"array\",\"items\":{\"type\":\"number\",\"exclusiveMinimum\":-2.25,\"maximum\":99.5,\"multipleOf\":0.25},"
     "\"minItems\":1,\"maxItems\":4}", -22500000000000000ll, 995000000000000000ll, 2500000000000000ll},
    {"{\"type\":\"array\",\"items\":{\"type\":\"number\",\"exclusiveMinimum\":0.5,\"maximum\":1.5},\"minItems\":1,"
     "\"maxItems\":4}", 5000000000000000ll, 15000000000000000ll, 1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"number\",\"exclusiveMinimum\":-0.001,\"maximum\":0.01,\"multipleOf\":0.001},"
     "\"minItems\":1,\"maxItems\":4}", -10000000000000ll, 100000000000000ll, 10000000000000ll},
};

static void test_number_samples(void) {
    int32_t eog;
    pkv_grammar_vocab *v = mask_vocab(&eog);
    int n = pkv_grammar_vocab_n(v);
    uint64_t *bits = calloc((size_t)(n + 63) / 64, sizeof *bits);
    int numbers = 0;
    for (size_t k = 0; k < sizeof k_num_cases / sizeof *k_num_cases; k++) {
        pkv_grammar *g = js(k_num_cases[k].schema);
        if (!g) continue;
        for (int seed = 0; seed < 40; seed++) {
            rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1 + 100 * (int)k);
            pkv_gmatch *m = pkv_gmatch_create(g);
            char text[1024];
            size_t len = 0;
            bool ended = false;
            for (int s = 0; s < 400 && !ended; s++) {
                if (pkv_gmatch_mask(m, v, bits) <= 0) {
                    TH_FAIL("%s: no token allowed after %.*s", k_num_cases[k].schema, (int)len, text);
                    break;
                }
                int32_t allowed[MV_MAX], na = 0;
                for (int32_t t = 0; t < n; t++)
                    if (bits[t >> 6] >> (t & 63) & 1) allowed[na++] = t;
                int32_t t = allowed[rnd() % (uint64_t)na];
                if (s > 30 && (bits[eog >> 6] >> (eog & 63) & 1)) t = eog; /* end when it may */
                CHECK(pkv_gmatch_accept_token(m, v, t));
                if (t == eog) ended = true;
                else if (len + mv_len[t] < sizeof text) memcpy(text + len, mv_piece[t], mv_len[t]), len += mv_len[t];
            }
            pkv_gmatch_free(m);
            CHECK(ended);
            if (ended)
                numbers += check_numbers(k_num_cases[k].schema, text, len, k_num_cases[k].lo, k_num_cases[k].hi,
                                         k_num_cases[k].mult);
            if (getenv("PKV_TEST_VERBOSE")) fprintf(stderr, "  %.*s\n", (int)len, text);
        }
        pkv_grammar_free(g);
    }
    CHECK(numbers > 100);
    free(bits);
    pkv_grammar_vocab_free(v);
}

/* ------------------------------------------------------------ end to end */

#ifdef PKV_HAVE_JANSSON
static size_t utf8_count(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* Does doc satisfy schema (the supported subset; $ref to root defs)? */
static bool validate(json_t *doc, json_t *schema, json_t *root) {
    json_t *k;
    if ((k = json_object_get(schema, "$ref"))) {
        const char *r = json_string_value(k);
        const char *name = strrchr(r, '/') + 1;
        json_t *defs = json_object_get(root, "$defs");
        return validate(doc, json_object_get(defs, name), root);
    }
    if ((k = json_object_get(schema, "const"))) return json_equal(doc, k);
    if ((k = json_object_get(schema, "enum"))) {
        size_t i;
        json_t *e;
        json_array_foreach(k, i, e) if (json_equal(doc, e)) return true;
        return false;
    }
    if ((k = json_object_get(schema, "anyOf"))) {
        size_t i;
        json_t *e;
        json_array_foreach(k, i, e) if (validate(doc, e, root)) return true;
        return false;
    }
    const char *t = json_string_value(json_object_get(schema, "type"));
    if (!t) return true;
    if (!strcmp(t, "integer")) return json_is_integer(doc);
    if (!strcmp(t, "number")) return json_is_number(doc);
    if (!strcmp(t, "boolean")) return json_is_boolean(doc);
    if (!strcmp(t, "null")) return json_is_null(doc);
    if (!strcmp(t, "string")) {
        if (!json_is_string(doc)) return false;
        size_t n = utf8_count(json_string_value(doc));
        json_t *mn = json_object_get(schema, "minLength"), *mx = json_object_get(schema, "maxLength");
        return (!mn || n >= (size_t)json_integer_value(mn)) && (!mx || n <= (size_t)json_integer_value(mx));
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(doc)) return false;
        size_t n = json_array_size(doc), i;
        json_t *mn = json_object_get(schema, "minItems"), *mx = json_object_get(schema, "maxItems"), *e;
        if ((mn && n < (size_t)json_integer_value(mn)) || (mx && n > (size_t)json_integer_value(mx))) return false;
        json_t *items = json_object_get(schema, "items");
        json_array_foreach(doc, i, e) if (items && !validate(e, items, root)) return false;
        return true;
    }
    if (!strcmp(t, "object")) {
        if (!json_is_object(doc)) return false;
        json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required"), *e;
        size_t i;
        const char *key;
        json_array_foreach(req, i, e) if (!json_object_get(doc, json_string_value(e))) return false;
        json_object_foreach(doc, key, e) {
            json_t *ps = json_object_get(props, key);
            if (ps && !validate(e, ps, root)) return false;
            if (!ps && props && !json_is_true(json_object_get(schema, "additionalProperties"))) return false;
        }
        return true;
    }
    return false;
}
#endif

typedef struct run_rec {
    int32_t tok[1024];
    int n;
    pkv_finish_reason fin;
    bool stop_token;
    pkv_status status;
    char msg[256];
} run_rec;

static bool on_ev(const pkv_engine_event *ev, void *user) {
    run_rec *r = (run_rec *)user + ev->sample;
    if (ev->token >= 0 && r->n < 1024) r->tok[r->n++] = ev->token;
    if (ev->finish != PKV_FINISH_NONE) {
        r->fin = ev->finish;
        r->stop_token = ev->stop_token;
        r->status = ev->status;
        snprintf(r->msg, sizeof r->msg, "%s", ev->message ? ev->message : "");
    }
    return true;
}

static pkv_model *e2e_model(void) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.type = PKV_TYPE_Q8_0;
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 512;
    p.seed = 7;
    void *data = NULL;
    size_t size = 0;
    if (pkv_mkmodel_memory(&p, &data, &size)) {
        TH_FAIL("mkmodel: %s", pkv_errmsg());
        return NULL;
    }
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load_memory(data, size, "grammar-test", mp);
    pkv_mkmodel_free_memory(data);
    if (!m) TH_FAIL("load: %s", pkv_errmsg());
    return m;
}

static pkv_engine *e2e_engine(pkv_model *m, pkv_model *draft) {
    pkv_engine_params ep = pkv_engine_default_params();
    ep.cache.n_ctx = 1024;
    ep.cache.page_size = 16;
    ep.draft = draft;
    pkv_engine *e = pkv_engine_create(m, ep);
    if (!e) TH_FAIL("engine: %s", pkv_errmsg());
    return e;
}

static void drain(pkv_engine *e) {
    int left = 1;
    for (long i = 0; left > 0 && i < 100000; i++)
        if (pkv_engine_step(e, &left)) {
            TH_FAIL("step: %s", pkv_errmsg());
            return;
        }
    if (left) TH_FAIL("%d requests pending", left);
}

static const int32_t k_prompt[] = {10, 20, 30, 40, 50, 60, 70};

static pkv_request_params e2e_req(const pkv_grammar *g, float temp, uint64_t seed, int max_tokens, int n, run_rec *rec) {
    pkv_request_params r = pkv_request_default_params();
    r.prompt = k_prompt;
    r.n_prompt = 7;
    r.sampling.temp = temp;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    r.sampling.seed = seed;
    r.max_tokens = max_tokens;
    r.n = n;
    r.grammar = g;
    r.on_event = on_ev;
    r.user = rec;
    return r;
}

/* Check one finished sample: bounded ones end with EOS and parse; others are a valid prefix. */
static void check_output(pkv_model *m, const pkv_grammar *g, const char *schema, const run_rec *r, bool bounded,
                         const char *what) {
    if (r->fin == PKV_FINISH_ERROR) {
        TH_FAIL("%s: error %s", what, r->msg);
        return;
    }
    bool eos = r->fin == PKV_FINISH_STOP && r->stop_token && r->n > 0 && pkv_model_is_eog(m, r->tok[r->n - 1]);
    if (bounded && !eos) TH_FAIL("%s: a bounded schema must end with EOS (finish %s after %d tokens)", what,
                                 pkv_finish_reason_str(r->fin), r->n);
    th_checks++;
    static char text[1 << 14];
    size_t len = 0;
    int n = eos ? r->n - 1 : r->n;
    if (pkv_model_detokenize(m, r->tok, (size_t)n, false, text, sizeof text - 1, &len)) {
        TH_FAIL("%s: detokenize: %s", what, pkv_errmsg());
        return;
    }
    text[len] = 0;
    for (int i = 0; i < n; i++) CHECK(!pkv_model_is_eog(m, r->tok[i]));
    if (!eos) {
        pkv_gmatch *gm = pkv_gmatch_create(g);
        if (!pkv_gmatch_accept_bytes(gm, text, len)) TH_FAIL("%s: not a valid prefix: %s", what, text);
        th_checks++;
        pkv_gmatch_free(gm);
        return;
    }
    if (getenv("PKV_TEST_VERBOSE")) fprintf(stderr, "  %s (%d tokens): %s\n", what, r->n, text);
    if (!pkv_grammar_accepts(g, text, len)) TH_FAIL("%s: the grammar refuses its own output: %s", what, text);
    th_checks++;
#ifdef PKV_HAVE_JANSSON
    if (schema) {
        json_error_t err;
        json_t *doc = json_loadb(text, len, JSON_DECODE_ANY, &err), *sch = json_loads(schema, 0, &err);
        th_checks += 2;
        if (!doc) TH_FAIL("%s: jansson cannot parse the output (%s): %s", what, err.text, text);
        else if (!validate(doc, sch, sch)) TH_FAIL("%s: the output does not satisfy the schema: %s", what, text);
        json_decref(doc);
        json_decref(sch);
    }
#else
    (void)schema;
#endif
}

static const char *k_bounded =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"maxItems\":3},\"ok\":{\"type\":\"boolean\"},\"kind\":{\"anyOf\":[{\"const\":\"a\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"name\",\"age\"]}";
/* The most bytes k_bounded's grammar admits (17 per whitespace slot, 6 per string
 * character, 17 digits per integer): every sample must end before this many tokens. */
enum { BOUNDED_MAX = 640 };

static void test_engine(void) {
    pkv_model *m = e2e_model();
    if (!m) return;
    pkv_grammar *gb_ = js(k_bounded), *go = js("{\"type\":\"object\"}");
    pkv_grammar *gg = gb("root ::= \"The answer is \" [0-9]{1,3} \".\"");
    if (!gb_ || !go || !gg) return;
    static run_rec rec[8][4];
    pkv_engine *e = e2e_engine(m, NULL);
    if (!e) return;
    /* many seeds at temperature 1 (top-k, top-p, min-p off) and greedy; n = 2 forks */
    for (int round = 0; round < 3; round++) {
        memset(rec, 0, sizeof rec);
        for (int i = 0; i < 8; i++) {
            float temp = i == 0 ? 0.0f : 1.0f;
            const pkv_grammar *g = i < 5 ? gb_ : i < 7 ? go : gg;
            pkv_request_params r = e2e_req(g, temp, (uint64_t)(100 * round + i), g == go ? 48 : BOUNDED_MAX, i == 1 ? 2 : 1,
                                           rec[i]);
            CHECK_OK(pkv_engine_submit(e, &r, NULL));
        }
        drain(e);
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < (i == 1 ? 2 : 1); j++) {
                char what[64];
                snprintf(what, sizeof what, "round %d request %d sample %d", round, i, j);
                const pkv_grammar *g = i < 5 ? gb_ : i < 7 ? go : gg;
                check_output(m, g, i < 5 ? k_bounded : i < 7 ? "{\"type\":\"object\"}" : NULL, &rec[i][j], g != go, what);
            }
    }
    pkv_engine_free(e);

    /* batch invariance: the same constrained request alone, batched with others, and
     * with speculative decoding (the model as its own draft) gives the same tokens */
    static run_rec alone[1], batched[4][2], spec[1];
    memset(alone, 0, sizeof alone), memset(batched, 0, sizeof batched), memset(spec, 0, sizeof spec);
    e = e2e_engine(m, NULL);
    pkv_request_params ra = e2e_req(gb_, 0.9f, 4242, BOUNDED_MAX, 1, alone);
    CHECK_OK(pkv_engine_submit(e, &ra, NULL));
    drain(e);
    pkv_engine_stats gst;
    pkv_engine_stats_get(e, &gst); /* one mask per sampled token, timed (bench serve reports it) */
    CHECK_INT((long long)gst.grammar_masks, alone[0].n);
    CHECK(gst.grammar_mask_seconds > 0);
    pkv_engine_free(e);
    e = e2e_engine(m, NULL);
    for (int i = 0; i < 4; i++) {
        pkv_request_params r = i == 2 ? e2e_req(gb_, 0.9f, 4242, BOUNDED_MAX, 1, batched[i])
                                      : e2e_req(i == 1 ? go : i == 3 ? NULL : gg, 1.0f, (uint64_t)i, 40, 2, batched[i]);
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
    }
    drain(e);
    pkv_engine_free(e);
    e = e2e_engine(m, m);
    pkv_request_params rs = e2e_req(gb_, 0.9f, 4242, BOUNDED_MAX, 1, spec);
    CHECK_OK(pkv_engine_submit(e, &rs, NULL));
    drain(e);
    pkv_engine_stats st;
    pkv_engine_stats_get(e, &st);
    fprintf(stderr, "  speculative: proposed %llu, accepted %llu\n", (unsigned long long)st.draft_proposed,
            (unsigned long long)st.draft_accepted);
    CHECK(st.draft_proposed > 0);
    pkv_engine_free(e);
    CHECK_INT(batched[2][0].n, alone[0].n);
    CHECK_INT(spec[0].n, alone[0].n);
    CHECK(!memcmp(batched[2][0].tok, alone[0].tok, (size_t)alone[0].n * sizeof(int32_t)));
    CHECK(!memcmp(spec[0].tok, alone[0].tok, (size_t)alone[0].n * sizeof(int32_t)));
    check_output(m, gb_, k_bounded, &alone[0], true, "alone");

    /* refusals at submit */
    e = e2e_engine(m, NULL);
    pkv_request_params rb = e2e_req(gg, 0.0f, 0, 10, 1, alone);
    rb.ignore_eos = true;
    CHECK_STATUS(pkv_engine_submit(e, &rb, NULL), PKV_ERR_INVALID);
    pkv_engine_free(e);

    /* pkv_generate with a constrained sampler; pkv_spec_generate refuses it */
    pkv_kv_cache *c = pkv_model_cache_create(m, pkv_cache_default_params());
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    pkv_grammar_vocab *v = pkv_grammar_vocab_create(m);
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.seed = 5;
    pkv_sampler *smp = pkv_sampler_create(sp, 512);
    CHECK(ctx && v && smp);
    if (ctx && v && smp) {
        CHECK_OK(pkv_sampler_set_grammar(smp, gg, v));
        CHECK_OK(pkv_context_decode(ctx, k_prompt, 7));
        int n = 0;
        CHECK_OK(pkv_generate(ctx, smp, 64, NULL, NULL, &n));
        CHECK(pkv_sampler_grammar_complete(smp));
        pkv_spec *spc = pkv_spec_create(ctx, m, pkv_spec_default_params());
        if (spc) {
            CHECK_STATUS(pkv_spec_generate(spc, smp, 4, NULL, NULL, NULL), PKV_ERR_UNSUPPORTED);
            pkv_spec_free(spc);
        }
        pkv_sampler *s2 = pkv_sampler_create(sp, 300);
        CHECK_STATUS(pkv_sampler_set_grammar(s2, gg, v), PKV_ERR_MISMATCH);
        pkv_sampler_free(s2);
    }
    pkv_sampler_free(smp);
    pkv_grammar_vocab_free(v);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_grammar_free(gb_);
    pkv_grammar_free(go);
    pkv_grammar_free(gg);
    pkv_model_free(m);
}

/* The engine under decimal bounds and multiples: each sample (greedy and at
 * temperature 1, top-k/p and min-p off) ends with EOS within the bound and its
 * numbers are inside the schema, exactly. */
static void test_engine_numbers(void) {
    pkv_model *m = e2e_model();
    if (!m) return;
    pkv_engine *e = e2e_engine(m, NULL);
    enum { NS = 4 };
    static run_rec rec[3][NS][1];
    memset(rec, 0, sizeof rec);
    pkv_grammar *g[3] = {0};
    for (int k = 0; k < 3 && e; k++) {
        if (!(g[k] = js(k_num_cases[k].schema))) continue;
        for (int i = 0; i < NS; i++) {
            /* the longest output: 4 numbers of 3 + 1 + 16 digits and a sign, whitespace of 17 */
            pkv_request_params r = e2e_req(g[k], i ? 1.0f : 0.0f, (uint64_t)(77 + 10 * k + i), 320, 1, rec[k][i]);
            CHECK_OK(pkv_engine_submit(e, &r, NULL));
        }
    }
    if (e) drain(e);
    int numbers = 0;
    for (int k = 0; k < 3 && e; k++)
        for (int i = 0; g[k] && i < NS; i++) {
            char what[64];
            snprintf(what, sizeof what, "numbers %d sample %d", k, i);
            const run_rec *r = &rec[k][i][0];
            check_output(m, g[k], NULL, r, true, what);
            if (r->fin != PKV_FINISH_STOP || r->n < 1) continue;
            static char text[4096];
            size_t len = 0;
            CHECK_OK(pkv_model_detokenize(m, r->tok, (size_t)(r->n - 1), false, text, sizeof text - 1, &len));
            numbers += check_numbers(k_num_cases[k].schema, text, len, k_num_cases[k].lo, k_num_cases[k].hi,
                                     k_num_cases[k].mult);
            if (getenv("PKV_TEST_VERBOSE")) fprintf(stderr, "  %s: %.*s\n", what, (int)len, text);
        }
    CHECK(numbers >= 3 * NS);
    for (int k = 0; k < 3; k++) pkv_grammar_free(g[k]);
    pkv_engine_free(e);
    pkv_model_free(m);
}

/* text of n copies of a, then mid, then n copies of b (caller frees) */
static char *nest(const char *pre, const char *a, const char *mid, const char *b, int n) {
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid), lp = strlen(pre);
    char *t = malloc(lp + (size_t)n * (la + lb) + lm + 1), *o = t;
    memcpy(o, pre, lp), o += lp;
    for (int i = 0; i < n; i++) memcpy(o, a, la), o += la;
    memcpy(o, mid, lm), o += lm;
    for (int i = 0; i < n; i++) memcpy(o, b, lb), o += lb;
    *o = 0;
    return t;
}

/* No parser recurses without a bound (issue 50.1): deep nesting is an error naming
 * the limit, never a stack overflow. */
static void test_nesting(void) {
    char *t = nest("root ::= ", "(", "\"a\"", ")", PKV_GRAMMAR_MAX_NESTING);
    pkv_grammar *g = gb(t);
    ACC(g, "a"); REJ(g, "aa");
    pkv_grammar_free(g);
    free(t);
    int deep[] = {PKV_GRAMMAR_MAX_NESTING + 1, 30000, 100000};
    for (int i = 0; i < 3; i++) {
        t = nest("root ::= ", "(", "\"a\"", ")", deep[i]);
        gbnf_refused(t, "nested deeper than the limit of 256", "line 1");
        free(t);
        t = nest("root ::= ", "(\"x\" | ", "\"a\"", ")", deep[i]);
        gbnf_refused(t, "nested deeper than the limit of 256", NULL);
        free(t);
        if (deep[i] > 30000) continue; /* schemas of 100000 levels are over the 1 MiB text limit */
        /* schemas: nested arrays, anyOf, objects; the JSON text itself too */
        t = nest("", "{\"type\":\"array\",\"items\":", "{}", "}", deep[i]);
        schema_refused(t, "deeper than 64", NULL);
        free(t);
        t = nest("", "{\"anyOf\":[", "{}", "]}", deep[i]);
        schema_refused(t, "deeper than 64", NULL);
        free(t);
        t = nest("", "[", "1", "]", deep[i]);
        schema_refused(t, "deeper than 64", NULL);
        free(t);
    }
    /* a $ref chain a0 -> a1 -> ... -> a999 */
    size_t cap = 64 * 1000 + 64, n = 0;
    t = malloc(cap);
    n += (size_t)snprintf(t + n, cap - n, "{\"$ref\":\"#/$defs/a0\",\"$defs\":{");
    for (int i = 0; i < 999; i++) n += (size_t)snprintf(t + n, cap - n, "\"a%d\":{\"$ref\":\"#/$defs/a%d\"},", i, i + 1);
    n += (size_t)snprintf(t + n, cap - n, "\"a999\":{\"type\":\"null\"}}}");
    schema_refused(t, "deeper than 64", NULL);
    free(t);
}

/* A grammar of many rules parses in time linear in its size (found by fuzz-grammar's
 * seeds): the rule lookup scanned every rule per reference, the nullable rules took a
 * pass per rule of a chain, and the left-recursion search re-enumerated a rule's
 * references from its first on every step: 30000 chained rules took 5-15 s, a root
 * of 30000 nullable references 0.3 s (12 s under ASan). */
static void test_parse_cost(void) {
    enum { N = 50000 };
    size_t cap = 20 * (size_t)N + 64, n = 0;
    char *t = malloc(cap);
    struct {
        const char *what, *last; /* the chain's last rule */
        bool ok;
    } chains[] = {
        {"a chain", "\"a\"", true},
        {"a nullable chain (defined first to last)", "\"a\"?", true},
        {"a chain that returns to its start", "\"b\"? r0 \"a\"", false},
    };
    for (int c = 0; c < 3; c++) {
        n = (size_t)snprintf(t, cap, "root ::= r0 \"z\"\n");
        for (int i = 0; i < N; i++) n += (size_t)snprintf(t + n, cap - n, "r%d ::= r%d\n", i, i + 1);
        n += (size_t)snprintf(t + n, cap - n, "r%d ::= %s\n", N, chains[c].last);
        double t0 = pkv_time_now();
        pkv_grammar *g = pkv_grammar_from_gbnf(t, n);
        double dt = pkv_time_now() - t0;
        if (dt > 2.0) TH_FAIL("%s of %d rules took %.2f s to parse", chains[c].what, N, dt);
        th_checks++;
        if (chains[c].ok) {
            CHECK(g != NULL);
            ACC(g, "az");
            if (c == 1) ACC(g, "z");
            else REJ(g, "z");
        } else {
            CHECK(g == NULL);
            CHECK_MSG("rule 'r0' is left-recursive");
        }
        pkv_grammar_free(g);
    }
    /* a root of N nullable references: refused at its start (too many stacks), quickly */
    n = (size_t)snprintf(t, cap, "root ::= ");
    for (int i = 0; i < N; i++) n += (size_t)snprintf(t + n, cap - n, "x ");
    n += (size_t)snprintf(t + n, cap - n, "\nx ::= \"a\"?\n");
    double t0 = pkv_time_now();
    CHECK(pkv_grammar_from_gbnf(t, n) == NULL);
    CHECK_MSG("parse stacks");
    double dt = pkv_time_now() - t0;
    if (dt > 2.0) TH_FAIL("a root of %d nullable references took %.2f s to refuse", N, dt);
    th_checks++;
    /* a class of ~6.7N ranges out of order ("[baba...a-b...]"): sorted in n log n, and
     * the merged set is exactly {a, b} (fuzz-grammar found the quadratic sort) */
    n = (size_t)snprintf(t, cap, "root ::= [");
    for (int i = 0; i < 4 * N; i++) n += (size_t)snprintf(t + n, cap - n, "%s", i % 3 == 2 ? "a-b" : "ba");
    n += (size_t)snprintf(t + n, cap - n, "]+\n");
    t0 = pkv_time_now();
    pkv_grammar *gc = pkv_grammar_from_gbnf(t, n);
    dt = pkv_time_now() - t0;
    if (dt > 2.0) TH_FAIL("a class of %d ranges took %.2f s to parse", 4 * N / 3 * 5, dt);
    th_checks++;
    CHECK(gc != NULL);
    if (gc) {
        ACC(gc, "abba");
        REJ(gc, "abc");
        REJ(gc, "`");
        pkv_grammar_free(gc);
    }
    /* left recursion behind a long nullable prefix is still found, and named */
    n = (size_t)snprintf(t, cap, "root ::= ");
    for (int i = 0; i < 1000; i++) n += (size_t)snprintf(t + n, cap - n, "x ");
    n += (size_t)snprintf(t + n, cap - n, "y | \"b\"\nx ::= \"a\"?\ny ::= x x root\n");
    gbnf_refused(t, "left-recursive", "'root'");
    free(t);
}

/* Local JSON pointers (issue 50.10): the root "#", percent-encoded segments, ~0 and
 * ~1; a big enum is a 400-class error naming the limit, not a failure later. */
static void test_schema_refs(void) {
    /* recursion through the root: a tree of nodes */
    pkv_grammar *g = js("{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}},\"required\":[\"v\"]}");
    ACC(g, "{\"v\":1}"); ACC(g, "{\"v\":1,\"kids\":[]}"); ACC(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}");
    REJ(g, "{\"v\":1,\"kids\":[{}]}"); REJ(g, "{\"v\":1,\"kids\":[{\"v\":\"x\"}]}");
    pkv_grammar_free(g);
    g = js("{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2}]}");
    ACC(g, "null"); ACC(g, "[]"); ACC(g, "[null,[[],null]]"); REJ(g, "[1]"); REJ(g, "[null,null,null]");
    pkv_grammar_free(g);
    /* percent-encoded and ~-escaped segments */
    g = js("{\"$ref\":\"#/$defs/a%20b\",\"$defs\":{\"a b\":{\"type\":\"integer\"}}}");
    ACC(g, "12"); REJ(g, "\"x\"");
    pkv_grammar_free(g);
    g = js("{\"$ref\":\"#/$defs/x~1y~0z\",\"$defs\":{\"x/y~z\":{\"type\":\"boolean\"}}}");
    ACC(g, "true"); REJ(g, "1");
    pkv_grammar_free(g);
    /* %2F is a separator: percent-decoding comes before the pointer is split */
    schema_refused("{\"$ref\":\"#/%24defs/%7e0%2Fq\",\"$defs\":{\"~/q\":{\"const\":\"k\"}}}", "does not resolve", NULL);
    schema_refused("{\"$ref\":\"#/$defs/a%00\",\"$defs\":{}}", "bad percent escape", NULL);
    g = js("{\"$ref\":\"#/%24defs/%7e0q\",\"$defs\":{\"~q\":{\"const\":\"k\"}}}");
    ACC(g, "\"k\""); REJ(g, "\"q\"");
    pkv_grammar_free(g);
    schema_refused("{\"$ref\":\"#/$defs/a%2\",\"$defs\":{}}", "bad percent escape", NULL);
    schema_refused("{\"$ref\":\"#/$defs/a~2\",\"$defs\":{}}", "'~' must be followed by 0 or 1", NULL);
    schema_refused("{\"$ref\":\"#x\"}", "local references", NULL);

    /* enum: 4096 values are fine, 20000 are refused naming the limit */
    size_t cap = 20000 * 16 + 64, n = 0;
    char *t = malloc(cap);
    for (int k = 0; k < 2; k++) {
        int cnt = k ? 20000 : 4096;
        n = (size_t)snprintf(t, cap, "{\"enum\":[");
        for (int i = 0; i < cnt; i++) n += (size_t)snprintf(t + n, cap - n, "%s\"v%d\"", i ? "," : "", i);
        snprintf(t + n, cap - n, "]}");
        if (k) {
            schema_refused(t, "/enum", "more than the limit of 4096");
        } else {
            g = js(t);
            ACC(g, "\"v4095\""); REJ(g, "\"v4096\"");
            pkv_grammar_free(g);
        }
    }
    /* the same in GBNF: refused when parsed, naming the stack limit */
    cap = 20000 * 12 + 64;
    t = realloc(t, cap);
    n = (size_t)snprintf(t, cap, "root ::= ");
    for (int i = 0; i < 20000; i++) n += (size_t)snprintf(t + n, cap - n, "%s\"v%d\"", i ? " | " : "", i);
    gbnf_refused(t, "at its start", "more than 16384 parse stacks");
    free(t);
}

/* Work limits (issues 43.6, 50.2): a grammar whose matching costs more than its
 * limit per token, or per request, fails with a message naming the limit, and
 * stays failed; equal stacks met on several paths are expanded once. */
static void test_work_limits(void) {
    int32_t eog;
    pkv_grammar_vocab *v = mask_vocab(&eog);
    uint64_t *bits = calloc((size_t)(pkv_grammar_vocab_n(v) + 63) / 64, sizeof *bits);
    const char *atk = "root ::= x{0,60}\nx ::= y{0,60}\ny ::= [a-z ]\n";
    pkv_grammar *g = gb(atk);
    /* the default allows this small vocabulary; count the work of a few tokens */
    pkv_gmatch *m = pkv_gmatch_create(g);
    uint64_t op = 0, total = 0, first = 0;
    for (int i = 0; i < 6; i++) {
        CHECK(pkv_gmatch_mask(m, v, bits) > 0);
        pkv_gmatch_work(m, &op, &total);
        if (!i) first = op;
        CHECK(pkv_gmatch_accept_bytes(m, "ab", 2));
    }
    CHECK(pkv_gmatch_failure(m) == NULL);
    /* 3600 distinct stacks after a few characters; expanding every path (60 ways to
     * return to each parent) would be ~60x that per character: the dedup keeps it near */
    pkv_gmatch_work(m, &op, &total);
    CHECK(op < 200000);
    pkv_gmatch_free(m);

    /* per token: the first mask already passes 1000 steps */
    CHECK(first > 1000);
    CHECK_OK(pkv_grammar_set_work_limits(g, 1000, 0));
    m = pkv_gmatch_create(g);
    CHECK(pkv_gmatch_mask(m, v, bits) < 0);
    CHECK_MSG("work limit of 1000 steps per token");
    CHECK(pkv_gmatch_failure(m) && strstr(pkv_gmatch_failure(m), "steps per token"));
    CHECK(pkv_gmatch_dead(m));
    CHECK(!pkv_gmatch_accept_bytes(m, "a", 1));
    CHECK(pkv_gmatch_mask(m, v, bits) < 0); /* stays failed */
    pkv_gmatch_reset(m);                     /* until reset */
    CHECK(pkv_gmatch_failure(m) == NULL);
    pkv_gmatch_free(m);

    /* per request: tokens are fine alone, their sum is not */
    CHECK_OK(pkv_grammar_set_work_limits(g, 0, 20 * first));
    m = pkv_gmatch_create(g);
    int ok = 0;
    for (int i = 0; i < 1000 && pkv_gmatch_mask(m, v, bits) > 0 && pkv_gmatch_accept_bytes(m, "a", 1); i++) ok++;
    CHECK(ok > 2);
    CHECK(ok < 1000);
    CHECK(pkv_gmatch_failure(m) && strstr(pkv_gmatch_failure(m), "work limit of"));
    CHECK(pkv_gmatch_failure(m) && strstr(pkv_gmatch_failure(m), "steps per request"));
    pkv_gmatch_free(m);

    /* a sampler reports it as the reason, not as a refused token */
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.temp = 0;
    pkv_sampler *s = pkv_sampler_create(sp, pkv_grammar_vocab_n(v));
    CHECK_OK(pkv_grammar_set_work_limits(g, 1000, 0));
    CHECK_OK(pkv_sampler_set_grammar(s, g, v));
    float *logits = calloc((size_t)pkv_grammar_vocab_n(v), sizeof *logits);
    int32_t tok = -1;
    CHECK(pkv_sampler_sample(s, logits, &tok) == PKV_ERR_INVALID);
    CHECK_MSG("steps per token");
    /* one separator between the parts (it read "sampler: : grammar: ...") */
    CHECK(strncmp(pkv_errmsg(), "sampler: grammar: the work limit", 32) == 0);
    CHECK(pkv_sampler_sample(s, logits, &tok) == PKV_ERR_INVALID); /* stays failed, same words */
    CHECK(strncmp(pkv_errmsg(), "sampler: grammar: the work limit", 32) == 0);
    free(logits);
    pkv_sampler_free(s);
    CHECK(pkv_grammar_set_work_limits(NULL, 0, 0) == PKV_ERR_INVALID);
    pkv_grammar_free(g);
    free(bits);
    pkv_grammar_vocab_free(v);
}

int main(void) {
    test_gbnf();
    test_nesting();
    test_parse_cost();
    test_utf8();
    test_schema();
    test_schema_refs();
    test_masks();
    test_number_samples();
    test_work_limits();
    test_engine();
    test_engine_numbers();
    printf("test-grammar: %ld checks, %d failures\n", th_checks, th_failures);
    return th_failures ? 1 : 0;
}
