// labels: server timeout=300
/* LoRA adapters in pagekv serve (docs/lora.md, docs/server.md): a server started
 * with --lora A --lora B:0.5 lists them (GET /lora-adapters), serves requests
 * without 'lora' with those scales (equal to naming them explicitly), a request's
 * 'lora' with its own scales (the adapters it does not list at 0: all 0 equals a
 * server without adapters, bitwise), takes new default scales from POST
 * /lora-adapters, answers a mixed concurrent burst as each request alone, and
 * refuses bad entries with a 400 naming the field. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"
#include "model/lora.h"

static int post(int port, const char *path, const char *json, json_t **out) {
    char f[512];
    snprintf(f, sizeof f, "%s", ts_file("lora-body.json", json, strlen(json)));
    int code = ts_http(port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
    if (out) *out = json_loads(ts_body, 0, NULL);
    return code;
}

/* A completion's text and token logprobs as one string (caller frees); NULL on error. */
static char *complete(int port, const char *lora) {
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"logprobs\":2%s%s}", lora ? ",\"lora\":" : "",
             lora ? lora : "");
    json_t *r = NULL;
    int code = post(port, "/v1/completions", body, &r);
    if (code != 200 || !r) {
        TH_FAIL("completion with lora %s: HTTP %d %s", lora ? lora : "(none)", code, ts_body);
        json_decref(r);
        return NULL;
    }
    json_t *both = json_pack("[O,O]", jget(r, "choices.0.text"), jget(r, "choices.0.logprobs.token_logprobs"));
    char *s = json_dumps(both, JSON_COMPACT);
    json_decref(both);
    json_decref(r);
    return s;
}

static void same(const char *a, const char *b, const char *what) {
    th_checks++;
    if (!a || !b || strcmp(a, b)) TH_FAIL("%s: %s vs %s", what, a ? a : "(none)", b ? b : "(none)");
}

int main(void) {
    char base[512], a1[512], a2[512], log[512];
    snprintf(base, sizeof base, "%s", th_tmp("lora-srv-base.gguf"));
    snprintf(a1, sizeof a1, "%s", th_tmp("lora-srv-a1.gguf"));
    snprintf(a2, sizeof a2, "%s", th_tmp("lora-srv-a2.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("lora-srv.log"));
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.type = PKV_TYPE_F32;
    p.seed = 5;
    pkv_mklora_params l1 = {.base = base, .rank = 8, .alpha = 16, .type = PKV_TYPE_F16, .seed = 1},
                      l2 = {.base = base, .rank = 4, .alpha = 0, .type = PKV_TYPE_F32, .seed = 2};
    if (pkv_mkmodel_write(&p, base) || pkv_mklora_write(&l1, a1) || pkv_mklora_write(&l2, a2)) {
        TH_FAIL("mkmodel: %s", pkv_errmsg());
        return th_done();
    }
    char args[2048];
    int port0, port;
    snprintf(args, sizeof args, "-m '%s' --parallel 4", base);
    pid_t plain = ts_start(args, log, &port0);
    REQUIRE(plain > 0);
    char *b_base = complete(port0, NULL);
    ts_stop(plain, SIGTERM);
    snprintf(args, sizeof args, "-m '%s' --lora '%s' --lora '%s:0.5' --parallel 4", base, a1, a2);
    pid_t pid = ts_start(args, log, &port);
    REQUIRE(pid > 0);

    /* the list */
    CHECK_INT(ts_http(port, "/lora-adapters"), 200);
    json_t *l = json_loads(ts_body, 0, NULL);
    CHECK(json_is_array(l) && json_array_size(l) == 2);
    CHECK_INT(jint(l, "0.id"), 0);
    CHECK_INT(jint(l, "1.id"), 1);
    CHECK(json_is_string(jget(l, "1.path")) && !strcmp(json_string_value(jget(l, "1.path")), a2));
    CHECK(json_number_value(jget(l, "0.scale")) == 1.0 && json_number_value(jget(l, "1.scale")) == 0.5);
    CHECK_INT(jint(l, "0.rank"), 8);
    json_decref(l);

    /* the default scales, the same named; none; one */
    char *b_def = complete(port, NULL), *b_named = complete(port, "[{\"id\":0,\"scale\":1},{\"id\":1,\"scale\":0.5}]"),
         *b_zero = complete(port, "[{\"id\":0,\"scale\":0}]"), *b_one = complete(port, "[{\"id\":1,\"scale\":2}]"),
         *b_empty = complete(port, "[]");
    same(b_def, b_named, "no 'lora' vs the startup scales named");
    same(b_zero, b_base, "every scale 0 vs a server without adapters");
    same(b_empty, b_def, "an empty 'lora' vs none (llama-server: the server's scales)");
    th_checks++;
    if (b_def && b_base && !strcmp(b_def, b_base)) TH_FAIL("the adapters changed nothing: %s", b_def);
    th_checks++;
    if (b_one && b_def && !strcmp(b_one, b_def)) TH_FAIL("the request's own scales changed nothing: %s", b_one);

    /* a burst mixing the sets, each as alone (bitwise: the engine is batch-invariant) */
    const char *sets[4] = {"[{\"id\":1,\"scale\":2}]", "[{\"id\":0,\"scale\":0}]", NULL, "[{\"id\":0,\"scale\":1},{\"id\":1,\"scale\":0.5}]"};
    const char *want[4] = {b_one, b_base, b_def, b_def};
    char cmd[8192] = "", outs[4][512];
    for (int i = 0; i < 4; i++) {
        char body[1024], bf[512];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"logprobs\":2%s%s}",
                 sets[i] ? ",\"lora\":" : "", sets[i] ? sets[i] : "");
        char name[32];
        snprintf(name, sizeof name, "lora-burst-%d.json", i);
        snprintf(bf, sizeof bf, "%s", ts_file(name, body, strlen(body)));
        snprintf(name, sizeof name, "lora-burst-%d.out", i);
        snprintf(outs[i], sizeof outs[i], "%s", th_tmp(name));
        size_t n = strlen(cmd);
        snprintf(cmd + n, sizeof cmd - n,
                 "curl -sS --max-time 60 -H 'Content-Type: application/json' --data-binary @%s -o '%s' "
                 "http://127.0.0.1:%d/v1/completions & ", bf, outs[i], port);
    }
    strncat(cmd, "wait", sizeof cmd - strlen(cmd) - 1);
    CHECK(system(cmd) == 0);
    for (int i = 0; i < 4; i++) {
        json_t *r = json_load_file(outs[i], 0, NULL);
        json_t *both = r ? json_pack("[O,O]", jget(r, "choices.0.text"), jget(r, "choices.0.logprobs.token_logprobs")) : NULL;
        char *s = both ? json_dumps(both, JSON_COMPACT) : NULL;
        same(s, want[i], "a burst request vs the same alone");
        free(s);
        json_decref(both);
        json_decref(r);
    }

    /* new default scales */
    CHECK_INT(post(port, "/lora-adapters", "[{\"id\":1,\"scale\":2}]", NULL), 200);
    CHECK(strstr(ts_body, "\"success\": true") || strstr(ts_body, "\"success\":true"));
    char *b_after = complete(port, NULL);
    same(b_after, b_one, "no 'lora' after POST /lora-adapters vs the same scales named");
    CHECK_INT(ts_http(port, "/lora-adapters"), 200);
    l = json_loads(ts_body, 0, NULL);
    CHECK(json_number_value(jget(l, "0.scale")) == 0.0 && json_number_value(jget(l, "1.scale")) == 2.0);
    json_decref(l);

    /* refusals */
    CHECK_INT(post(port, "/v1/completions", "{\"prompt\":\"x\",\"lora\":[{\"id\":2,\"scale\":1}]}", NULL), 400);
    CHECK(strstr(ts_body, "lora[0]") != NULL);
    CHECK_INT(post(port, "/v1/completions", "{\"prompt\":\"x\",\"lora\":{\"id\":0}}", NULL), 400);
    CHECK(strstr(ts_body, "'lora' must be an array") != NULL);
    CHECK_INT(post(port, "/v1/chat/completions",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"lora\":[{\"id\":0,\"scale\":\"big\"}]}", NULL),
              400);
    CHECK(strstr(ts_body, "lora[0].scale") != NULL);
    CHECK_INT(post(port, "/lora-adapters", "{\"id\":0}", NULL), 400);
    CHECK_INT(post(port, "/lora-adapters", "[{\"id\":-1,\"scale\":1}]", NULL), 400);
    CHECK(strstr(ts_body, "body[0]") != NULL);
    CHECK_INT(ts_http(port, "/health"), 200); /* alive */
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    free(b_base), free(b_def), free(b_named), free(b_zero), free(b_one), free(b_empty), free(b_after);
    remove(base), remove(a1), remove(a2);
    return th_done();
}
#endif
