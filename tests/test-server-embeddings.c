// labels: server timeout=300
/* POST /v1/embeddings and /v1/rerank (issue 45, item 4) on random-weight models that
 * `pagekv mkmodel --pooling` writes:
 *  1. qwen3 with last-token pooling (Qwen3-Embedding's layout), steps of 32 tokens:
 *     a batch of inputs (one of them longer than a step) gives each input the vector
 *     it gets alone, bit for bit; vectors are L2-normalised (embd_normalize -1: the
 *     raw vector, whose direction is the same); token-id inputs equal the text's
 *     tokens; base64 is the floats' bytes; a repeated input is served from the prefix
 *     cache and equals the first answer; the errors (empty, too long for the context,
 *     dimensions, encoding_format) are 400s naming the field or limit;
 *  2. llama with mean pooling: an input computed again after its pages are cached
 *     equals the first answer (mean pooling takes no prefix match: every token's
 *     hidden state counts);
 *  3. a generation model without ARCH.pooling_type: a 400 naming the pooling, and
 *     with --pooling none: /embeddings gives one row per token, /v1/embeddings a 400;
 *     The official openai npm client (whose default is base64) gets the same floats.
 *  4. a qwen3 reranker (rank pooling, cls.output yes/no, the rerank template):
 *     results sorted by relevance_score, top_n, return_documents, and each score
 *     equals p(yes) of the same prompt computed as an embedding of its tokens;
 *     without the template, llama-server's default layout (BOS query document). */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include <math.h>

#include "server-json.h"

static int g_port;

/* REQUIRE for the void test functions: a failed check ends the function */
#define NEED(x)           \
    do {                  \
        CHECK(x);         \
        if (!(x)) return; \
    } while (0)

static int post(const char *path, const char *json, json_t **out) {
    char f[512];
    snprintf(f, sizeof f, "%s", ts_file("body.json", json, strlen(json)));
    int code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
    if (out) *out = json_loads(ts_body, 0, NULL);
    return code;
}

/* POST body to path, expecting 200; the answer (caller decrefs) or NULL. */
static json_t *ok(const char *path, const char *body) {
    json_t *r = NULL;
    int code = post(path, body, &r);
    CHECK_INT(code, 200);
    if (code != 200) fprintf(stderr, "  %s %s -> %d %s\n", path, body, code, ts_body);
    if (code != 200) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* POST body to path, expecting 400 with `needle` in the message. */
static void bad(const char *path, const char *body, const char *needle) {
    int code = post(path, body, NULL);
    CHECK_INT(code, 400);
    CHECK(strstr(ts_body, needle) != NULL);
    if (!strstr(ts_body, needle)) fprintf(stderr, "  %s %s -> %s (wanted '%s')\n", path, body, ts_body, needle);
}

/* Two JSON number arrays equal exactly (the same floats printed alike). */
static bool same_vec(json_t *a, json_t *b) {
    if (!json_is_array(a) || !json_is_array(b) || json_array_size(a) != json_array_size(b) || !json_array_size(a))
        return false;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (json_number_value(json_array_get(a, i)) != json_number_value(json_array_get(b, i))) return false;
    return true;
}

static double norm2(json_t *a) {
    double s = 0;
    for (size_t i = 0; i < json_array_size(a); i++) s += json_number_value(json_array_get(a, i)) * json_number_value(json_array_get(a, i));
    return sqrt(s);
}

/* The embedding of one input (a JSON value), its data[0].embedding kept in *keep. */
static json_t *embed1(const char *input_json, const char *extra) {
    char body[16384];
    snprintf(body, sizeof body, "{\"input\":%s%s}", input_json, extra ? extra : "");
    return ok("/v1/embeddings", body);
}

static long long metric(const char *name) {
    if (ts_http(g_port, "/metrics") != 200) return -1;
    const char *p = ts_body;
    size_t n = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == ts_body || p[-1] == '\n') && p[n] == ' ') return atoll(p + n + 1);
        p += n;
    }
    return -1;
}

static const char *k_texts[] = {
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty twenty one twenty two twenty three twenty four twenty five",
    "x",
    "a somewhat longer sentence about nothing in particular",
};
enum { N_TEXTS = 5 };

static void test_last(void) {
    /* 1a. batch == alone, bitwise */
    json_t *alone[N_TEXTS];
    for (int i = 0; i < N_TEXTS; i++) {
        char in[1024];
        snprintf(in, sizeof in, "\"%s\"", k_texts[i]);
        alone[i] = embed1(in, NULL);
    }
    char all[4096] = "[";
    for (int i = 0; i < N_TEXTS; i++)
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s\"%s\"", i ? "," : "", k_texts[i]);
    strcat(all, "]");
    json_t *batch = embed1(all, NULL);
    NEED(batch != NULL);
    CHECK_INT((long long)json_array_size(jget(batch, "data")), N_TEXTS);
    long long toks = 0;
    for (int i = 0; i < N_TEXTS; i++) {
        char p[64];
        snprintf(p, sizeof p, "data.%d.embedding", i);
        CHECK(alone[i] && same_vec(jget(batch, p), jget(alone[i], "data.0.embedding")));
        snprintf(p, sizeof p, "data.%d.index", i);
        CHECK_INT(jint(batch, p), i);
        CHECK_INT((long long)json_array_size(jget(alone[i], "data.0.embedding")), 128);
        /* 1b. normalised */
        CHECK(fabs(norm2(jget(alone[i], "data.0.embedding")) - 1.0) < 1e-5);
        toks += jint(alone[i], "usage.prompt_tokens");
    }
    CHECK_INT(jint(batch, "usage.prompt_tokens"), toks);
    CHECK(jint(batch, "usage.prompt_tokens") > 30); /* one input is longer than a step */
    CHECK(!strcmp(json_string_value(jget(batch, "object")), "list"));
    CHECK(!strcmp(json_string_value(jget(batch, "data.0.object")), "embedding"));

    /* 1b. embd_normalize -1: raw; its direction is the normalised vector */
    json_t *raw = embed1("\"hello world\"", ",\"embd_normalize\":-1");
    NEED(raw != NULL);
    json_t *rv = jget(raw, "data.0.embedding"), *nv = jget(alone[0], "data.0.embedding");
    double n = norm2(rv), err = 0;
    CHECK(fabs(n - 1.0) > 1e-3); /* not normalised */
    for (size_t i = 0; i < json_array_size(rv); i++)
        err = fmax(err, fabs(json_number_value(json_array_get(rv, i)) / n - json_number_value(json_array_get(nv, i))));
    CHECK(err < 1e-6);
    json_t *vn = embed1("\"hello world\"", ",\"normalize\":false"); /* vLLM's name */
    CHECK(vn && same_vec(jget(vn, "data.0.embedding"), rv));
    json_decref(vn);
    json_decref(raw);

    /* 1c. token ids: the text's tokens give the text's vector */
    NEED(post("/tokenize", "{\"content\":\"the quick brown fox jumps over the lazy dog\",\"add_special\":true}", NULL) == 200);
    json_t *tk = json_loads(ts_body, 0, NULL);
    char *ids = json_dumps(jget(tk, "tokens"), JSON_COMPACT);
    json_t *byid = embed1(ids, NULL);
    CHECK(byid && same_vec(jget(byid, "data.0.embedding"), jget(alone[1], "data.0.embedding")));
    char two[8192];
    snprintf(two, sizeof two, "[%s,\"hello world\"]", ids); /* an array of inputs mixing both */
    json_t *mix = embed1(two, NULL);
    CHECK(mix && same_vec(jget(mix, "data.0.embedding"), jget(alone[1], "data.0.embedding")));
    CHECK(mix && same_vec(jget(mix, "data.1.embedding"), jget(alone[0], "data.0.embedding")));
    json_decref(mix);
    json_decref(byid);
    free(ids);
    json_decref(tk);

    /* 1d. base64: the little-endian floats */
    json_t *b64 = embed1("\"hello world\"", ",\"encoding_format\":\"base64\"");
    NEED(b64 != NULL);
    const char *s = json_string_value(jget(b64, "data.0.embedding"));
    CHECK(s && strlen(s) == (128 * 4 + 2) / 3 * 4);
    if (s) {
        static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        unsigned char bytes[600];
        size_t nb = 0;
        for (size_t i = 0; s[i] && s[i + 1] && s[i + 2] && s[i + 3]; i += 4) {
            unsigned v = 0;
            for (int k = 0; k < 4; k++) v = v << 6 | (s[i + k] == '=' ? 0 : (unsigned)(strchr(t, s[i + k]) - t));
            bytes[nb++] = (unsigned char)(v >> 16), bytes[nb++] = (unsigned char)(v >> 8), bytes[nb++] = (unsigned char)v;
        }
        bool eq = nb >= 512;
        for (int i = 0; i < 128 && eq; i++) {
            float f;
            memcpy(&f, bytes + 4 * i, 4);
            eq = (double)f == json_number_value(json_array_get(nv, (size_t)i));
        }
        CHECK(eq);
    }
    json_decref(b64);

    /* 1e. the same input again: from the prefix cache, the same vector */
    long long hit0 = metric("pagekv_prefix_cache_hit_tokens_total");
    char in2[1024];
    snprintf(in2, sizeof in2, "\"%s\"", k_texts[2]);
    json_t *again = embed1(in2, NULL);
    CHECK(again && same_vec(jget(again, "data.0.embedding"), jget(alone[2], "data.0.embedding")));
    long long hit1 = metric("pagekv_prefix_cache_hit_tokens_total");
    CHECK(hit0 >= 0 && hit1 >= hit0 + 16); /* at least a page of it was reused */
    json_decref(again);

    /* 1f. llama-server's /embeddings: [[...]] per input */
    json_t *ll = ok("/embeddings", "{\"content\":\"hello world\"}");
    CHECK(ll && json_is_array(ll) && same_vec(jget(ll, "0.embedding.0"), nv));
    json_decref(ll);

    /* 1g. errors */
    bad("/v1/embeddings", "{\"input\":[]}", "'input' is an empty array");
    bad("/v1/embeddings", "{\"input\":\"\"}", "'input' is empty");
    bad("/v1/embeddings", "{\"input\":[\"a\",\"\"]}", "'input[1]' is empty");
    bad("/v1/embeddings", "{\"input\":\"a\",\"dimensions\":64}", "'dimensions' is not supported");
    bad("/v1/embeddings", "{\"input\":\"a\",\"encoding_format\":\"int8\"}", "'encoding_format'");
    bad("/v1/embeddings", "{\"input\":[[1,2,999999]]}", "'input[0][2]' must be a token id");
    bad("/v1/embeddings", "{\"input\":\"a\",\"bogus\":1}", "unknown field 'bogus'");
    bad("/v1/embeddings", "{}", "'input' is missing");
    bad("/v1/embeddings", "{\"input\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
        "more than the limit of 8 (--max-embed-inputs)");
    bad("/v1/rerank", "{\"query\":\"q\",\"documents\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
        "not 'rank'");
    char longin[8192] = "[";
    for (int i = 0; i < 300; i++) snprintf(longin + strlen(longin), sizeof longin - strlen(longin), "%s%d", i ? "," : "", 5 + i % 100);
    strcat(longin, "]");
    char body[9000];
    snprintf(body, sizeof body, "{\"input\":%s}", longin);
    bad("/v1/embeddings", body, "more than the context size of 256");
    bad("/v1/rerank", "{\"query\":\"q\",\"documents\":[\"a\"]}", "not 'rank'");
    /* dimensions equal to the model's is accepted (OpenAI's clients may send it) */
    json_t *d = embed1("\"hello world\"", ",\"dimensions\":128");
    CHECK(d && same_vec(jget(d, "data.0.embedding"), nv));
    json_decref(d);
    for (int i = 0; i < N_TEXTS; i++) json_decref(alone[i]);
    json_decref(batch);
}

static void test_mean(void) {
    /* computed, then again with its pages in the prefix cache: the same mean */
    char in[1024];
    snprintf(in, sizeof in, "\"%s\"", k_texts[2]);
    json_t *a = embed1(in, NULL);
    json_t *b = embed1(in, NULL);
    CHECK(a && b && same_vec(jget(a, "data.0.embedding"), jget(b, "data.0.embedding")));
    /* a batch with a shorter input that shares its first pages: still the same */
    char two[2048];
    snprintf(two, sizeof two, "[\"%s\",\"%.60s\"]", k_texts[2], k_texts[2]);
    json_t *c = embed1(two, NULL);
    CHECK(c && same_vec(jget(c, "data.0.embedding"), jget(a, "data.0.embedding")));
    CHECK(fabs(norm2(jget(a, "data.0.embedding")) - 1.0) < 1e-5);
    /* more inputs than the server's queue (--queue 4): submitted as earlier ones finish */
    char many[4096] = "[";
    for (int i = 0; i < 20; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%s\"word %d\"", i ? "," : "", i);
    strcat(many, "]");
    json_t *m = embed1(many, NULL);
    json_t *one = embed1("\"word 13\"", NULL);
    CHECK(m && json_array_size(jget(m, "data")) == 20);
    CHECK(m && one && same_vec(jget(m, "data.13.embedding"), jget(one, "data.0.embedding")));
    json_decref(m);
    json_decref(one);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

static void test_rerank(void) {
    const char *docs[] = {"the fox is an animal", "dogs bark", "a red fox in the snow", "tax forms", "x"};
    json_t *r = ok("/v1/rerank", "{\"query\":\"what is a fox\",\"documents\":[\"the fox is an animal\",\"dogs bark\","
                                 "\"a red fox in the snow\",\"tax forms\",\"x\"],\"return_documents\":true}");
    NEED(r != NULL);
    json_t *res = jget(r, "results");
    CHECK_INT((long long)json_array_size(res), 5);
    bool seen[5] = {false};
    double prev = 2;
    for (size_t k = 0; k < json_array_size(res); k++) {
        json_t *e = json_array_get(res, k);
        long long i = json_integer_value(json_object_get(e, "index"));
        double sc = json_number_value(json_object_get(e, "relevance_score"));
        CHECK(i >= 0 && i < 5 && !seen[i]);
        if (i < 0 || i >= 5) continue;
        seen[i] = true;
        CHECK(sc <= prev && sc > 0 && sc < 1); /* sorted; a softmax probability */
        prev = sc;
        CHECK(!strcmp(json_string_value(jget(e, "document.text")), docs[i]));
        /* the score is p(yes) of the rerank prompt's tokens, computed as an embedding */
        char text[2048], body[4096];
        snprintf(text, sizeof text,
                 "<|im_start|>system\\nJudge whether the Document meets the requirements based on the Query and the "
                 "Instruct provided. Note that the answer can only be \\\"yes\\\" or \\\"no\\\".<|im_end|>\\n"
                 "<|im_start|>user\\n<Instruct>: Given a web search query, retrieve relevant passages that answer the "
                 "query\\n<Query>: what is a fox\\n<Document>: %s<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n"
                 "</think>\\n\\n", docs[i]);
        snprintf(body, sizeof body, "{\"content\":\"%s\"}", text);
        NEED(post("/tokenize", body, NULL) == 200);
        json_t *tk = json_loads(ts_body, 0, NULL);
        char *ids = json_dumps(jget(tk, "tokens"), JSON_COMPACT);
        json_t *em = embed1(ids, ",\"embd_normalize\":-1");
        CHECK(em && json_array_size(jget(em, "data.0.embedding")) == 2);
        if (em) {
            double y = json_number_value(jget(em, "data.0.embedding.0")), n = json_number_value(jget(em, "data.0.embedding.1"));
            CHECK(y == sc);
            CHECK(fabs(y + n - 1) < 1e-6);
        }
        json_decref(em);
        free(ids);
        json_decref(tk);
    }
    CHECK(jint(r, "usage.prompt_tokens") > 5 * 40);
    /* top_n; TEI's texts/return_text */
    json_t *t = ok("/v1/rerank", "{\"query\":\"what is a fox\",\"documents\":[\"the fox is an animal\",\"dogs bark\","
                                 "\"a red fox in the snow\",\"tax forms\",\"x\"],\"top_n\":2}");
    CHECK(t && json_array_size(jget(t, "results")) == 2);
    CHECK(t && jint(t, "results.0.index") == jint(r, "results.0.index") && jint(t, "results.1.index") == jint(r, "results.1.index"));
    CHECK(t && !jget(t, "results.0.document"));
    json_decref(t);
    json_t *tei = ok("/rerank", "{\"query\":\"what is a fox\",\"texts\":[\"dogs bark\",\"the fox is an animal\"],\"return_text\":true}");
    CHECK(tei && json_is_array(tei) && json_array_size(tei) == 2 && json_is_number(jget(tei, "0.score")) &&
          json_is_string(jget(tei, "0.text")));
    json_decref(tei);
    bad("/v1/rerank", "{\"query\":\"q\",\"documents\":[]}", "'documents' must be a non-empty array");
    bad("/v1/rerank", "{\"documents\":[\"a\"]}", "'query' must be a string");
    bad("/v1/rerank", "{\"query\":\"q\",\"documents\":[\"a\",3]}", "'documents[1]' must be a string");
    json_decref(r);
}

/* A reranker without tokenizer.chat_template.rerank: llama-server's default layout,
 * BOS query document (this vocabulary adds a BOS and no EOS). */
static void test_rerank_default(void) {
    json_t *r = ok("/v1/rerank", "{\"query\":\"what is a fox\",\"documents\":[\"dogs bark\"]}");
    NEED(r != NULL);
    double sc = json_number_value(jget(r, "results.0.relevance_score"));
    NEED(post("/tokenize", "{\"content\":\"what is a fox\",\"add_special\":true}", NULL) == 200);
    json_t *q = json_loads(ts_body, 0, NULL);
    NEED(post("/tokenize", "{\"content\":\"dogs bark\"}", NULL) == 200);
    json_t *d = json_loads(ts_body, 0, NULL);
    json_t *ids = json_copy(jget(q, "tokens"));
    json_array_extend(ids, jget(d, "tokens"));
    CHECK(json_array_size(ids) > 1 && jint(q, "tokens.0") == 256); /* the BOS */
    char *t = json_dumps(ids, JSON_COMPACT);
    json_t *em = embed1(t, ",\"embd_normalize\":-1");
    CHECK(em && json_number_value(jget(em, "data.0.embedding.0")) == sc);
    CHECK_INT(jint(r, "usage.prompt_tokens"), (long long)json_array_size(ids));
    free(t);
    json_decref(em);
    json_decref(ids);
    json_decref(q);
    json_decref(d);
    json_decref(r);
}

static pid_t serve(const char *model, const char *more) {
    char log[512], cmd[1024];
    snprintf(log, sizeof log, "%s", th_tmp("embd.log"));
    snprintf(cmd, sizeof cmd, "-m '%s' -c 256 --parallel 4 --batch-tokens 32 %s", model, more);
    return ts_start(cmd, log, &g_port);
}

int main(void) {
    if (!getenv("PKV_CLI")) return th_skip("PKV_CLI is not set");
    char last[512], mean[512], gen[512], rank[512];
    snprintf(last, sizeof last, "%s", th_tmp("embd-last.gguf"));
    snprintf(mean, sizeof mean, "%s", th_tmp("embd-mean.gguf"));
    snprintf(gen, sizeof gen, "%s", th_tmp("embd-gen.gguf"));
    snprintf(rank, sizeof rank, "%s", th_tmp("embd-rank.gguf"));
    REQUIRE(th_cli("", true, "mkmodel --arch qwen3 --pooling last --seed 3 -o '%s'", last) == 0);
    REQUIRE(th_cli("", true, "mkmodel --arch llama --pooling mean --seed 4 -o '%s'", mean) == 0);
    REQUIRE(th_cli("", true, "mkmodel --arch llama --seed 5 -o '%s'", gen) == 0);
    REQUIRE(th_cli("", true, "mkmodel --arch qwen3 --pooling rank --seed 6 -o '%s'", rank) == 0);
    CHECK(th_cli("", true, "mkmodel --pooling average -o '%s'", th_tmp("x.gguf")) != 0);
    CHECK(th_cli("", true, "mkmodel --arch llama --pooling rank -o '%s'", th_tmp("x.gguf")) != 0); /* qwen3 only */

    pid_t pid = serve(last, "--max-embed-inputs 8");
    REQUIRE(pid > 0);
    test_last();
    /* the official openai client (its default is base64, decoded by the client) */
    const char *src = getenv("PKV_SOURCE_DIR"), *dir = getenv("PKV_NODE_DIR");
    static const char *const mods[] = {"openai", NULL};
    if (!src || !dir || system("node --version >/dev/null 2>&1") != 0 || system("npm --version >/dev/null 2>&1") != 0 ||
        !ts_npm_install(src, dir, mods)) {
        printf("test-server-embeddings: the openai client part is skipped (no node/npm, or npm ci failed)\n");
    } else {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "cd '%s' && PKV_NODE_DIR='%s' timeout 120 node tests/server/openai-embeddings.cjs %d", src,
                 dir, g_port);
        int rc = system(cmd);
        CHECK_INT(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);
    }
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    pid = serve(mean, "--queue 4");
    REQUIRE(pid > 0);
    test_mean();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    pid = serve(gen, "");
    REQUIRE(pid > 0);
    bad("/v1/embeddings", "{\"input\":\"hello\"}", "no pooling type");
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    pid = serve(gen, "--pooling none");
    REQUIRE(pid > 0);
    bad("/v1/embeddings", "{\"input\":\"hello\"}", "pooling 'none'");
    json_t *rows = ok("/embeddings", "{\"content\":\"hello world\"}");
    REQUIRE(post("/tokenize", "{\"content\":\"hello world\",\"add_special\":true}", NULL) == 200);
    json_t *tk = json_loads(ts_body, 0, NULL);
    CHECK(rows && json_array_size(jget(rows, "0.embedding")) == json_array_size(jget(tk, "tokens")));
    CHECK(rows && json_array_size(jget(rows, "0.embedding.0")) == 128);
    json_decref(tk);
    json_decref(rows);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    pid = serve(rank, "--reranking");
    REQUIRE(pid > 0);
    test_rerank();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    REQUIRE(th_cli("", true, "mkmodel --arch qwen3 --pooling rank --no-template --seed 6 -o '%s'", rank) == 0);
    pid = serve(rank, "");
    REQUIRE(pid > 0);
    test_rerank_default();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    printf("test-server-embeddings: %ld checks, %d failures\n", th_checks, th_failures);
    return th_failures ? 1 : 0;
}
#endif
