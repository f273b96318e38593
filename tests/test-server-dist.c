// labels: server dist timeout=240
/* pagekv serve under mpirun (docs/distributed.md, "pagekv serve over ranks"):
 * rank 0 answers HTTP and sends each engine step's submits and cancels to the
 * other ranks, which follow. The same requests, sent concurrently (greedy and
 * seeded completions, n = 2, a chat, embeddings), then a prefix hit, must give
 * the same text, vectors and cached_tokens under `mpirun -np 2` and `-np 3` as a
 * server in one process, also after a client left a stream (a cancel sent to the
 * other ranks). /metrics answers; the contexts API (501) and constrained output
 * (503) are refused; SIGTERM to rank 0 stops every rank (exit 0). Skips, saying
 * so, without the HTTP server, MPI in the build, or mpirun (openmpi-bin). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pagekv.h"
#include "server-json.h"
#include "server-testlib.h"

/* The requests, sent at once (the first N_CONC) then one after the other. */
static const struct {
    const char *path, *body;
} k_reqs[] = {
    {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0}"},
    {"/v1/completions", "{\"prompt\":\"the cat sat on\",\"max_tokens\":20,\"temperature\":0.9,\"seed\":7}"},
    {"/v1/completions", "{\"prompt\":\"hello world\",\"max_tokens\":12,\"temperature\":0.8,\"seed\":3,\"n\":2}"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi there, who are you?\"}],"
                             "\"max_tokens\":16,\"seed\":11}"},
    {"/v1/embeddings", "{\"input\":[\"hello world\",\"a b c d e\"]}"}, /* through the engine too */
    /* a prefix hit: the same long prompt twice, one after the other */
    {"/v1/completions", "{\"prompt\":\"%s\",\"max_tokens\":8,\"temperature\":0}"},
    {"/v1/completions", "{\"prompt\":\"%s and then\",\"max_tokens\":8,\"temperature\":0}"},
};
#define N_REQ ((int)(sizeof k_reqs / sizeof k_reqs[0]))
#define N_CONC 5

/* What a server answered: each choice's text (joined), cached_tokens. */
typedef struct answer {
    char text[N_REQ][2048];
    long long cached[N_REQ];
} answer;

static const char *long_prompt(void) {
    static char buf[1024];
    if (!buf[0])
        for (int i = 0; i < 40; i++) strcat(buf, i % 3 ? "word " : "story ");
    return buf;
}

/* The texts of a response body (choices' text or message.content, in order). */
static bool parse(const char *body, char *text, size_t size, long long *cached) {
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    json_t *ch = j ? json_object_get(j, "choices") : NULL;
    if (j && json_is_array(json_object_get(j, "data"))) { /* embeddings: their digits, hashed (FNV-1a) */
        char *d = json_dumps(json_object_get(j, "data"), JSON_COMPACT);
        uint64_t h = 1469598103934665603ull;
        for (const char *c = d ? d : ""; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
        snprintf(text, size, "embeddings %zu bytes, hash %016llx", d ? strlen(d) : 0, (unsigned long long)h);
        free(d);
        *cached = 0;
        json_decref(j);
        return true;
    }
    if (!json_is_array(ch) || !json_array_size(ch)) {
        fprintf(stderr, "no choices in: %.300s\n", body);
        json_decref(j);
        return false;
    }
    text[0] = 0;
    for (size_t i = 0; i < json_array_size(ch); i++) {
        json_t *c = json_array_get(ch, i);
        json_t *t = json_object_get(c, "text");
        if (!t) t = jget(c, "message.content");
        size_t n = strlen(text);
        snprintf(text + n, size - n, "[%s]", json_is_string(t) ? json_string_value(t) : "?");
    }
    *cached = jint(j, "usage.prompt_tokens_details.cached_tokens");
    json_decref(j);
    return true;
}

/* Send the requests to the server on port: the first N_CONC at once (curl in
 * the background), then the rest one by one. */
static bool ask(int port, answer *a) {
    char cmd[16384], body[2048];
    int k = snprintf(cmd, sizeof cmd, "cd '%s' && ", getenv("PKV_TEST_TMP") ? getenv("PKV_TEST_TMP") : "/tmp");
    for (int i = 0; i < N_REQ; i++) {
        snprintf(body, sizeof body, k_reqs[i].body, long_prompt());
        char name[64];
        snprintf(name, sizeof name, "sd-req%d", i);
        const char *path = ts_file(name, body, strlen(body));
        snprintf(name, sizeof name, "sd-out%d", i);
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "curl -sS --max-time 60 -H 'Content-Type: application/json' -d @'%s' -o '%s' "
                      "'http://127.0.0.1:%d%s' %s ", path, th_tmp(name), port, k_reqs[i].path,
                      i < N_CONC - 1 ? "&" : i == N_CONC - 1 ? "& wait;" : ";");
    }
    if (system(cmd) != 0) fprintf(stderr, "(a curl failed)\n");
    for (int i = 0; i < N_REQ; i++) {
        char name[64], body_out[1 << 14];
        snprintf(name, sizeof name, "sd-out%d", i);
        th_read_text(th_tmp(name), body_out, sizeof body_out);
        if (!parse(body_out, a->text[i], sizeof a->text[i], &a->cached[i])) return false;
    }
    return true;
}

/* Start a server (launcher "" or mpirun ...), ask, check what only ranks do, stop. */
static bool serve_and_ask(const char *launcher, const char *model, int np, answer *a) {
    char args[1024], log[512];
    snprintf(args, sizeof args, "-m '%s' -t 1 --parallel 4 --pooling mean", model);
    snprintf(log, sizeof log, "%s", th_tmp(np > 1 ? "sd-ranks.log" : "sd-one.log"));
    int port = 0;
    pid_t pid = ts_start_under(launcher, args, log, &port);
    if (pid < 0) {
        char l[4096];
        fprintf(stderr, "the server (%s) did not start (exit %d):\n%s\n", launcher, port, th_read_text(log, l, sizeof l));
        CHECK(pid > 0);
        return false;
    }
    if (np > 1) { /* a cancel first: a client that leaves a long stream (the requests after must still agree) */
        const char *body = "{\"prompt\":\"x\",\"max_tokens\":1900,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}";
        ts_http(port, "--max-time 0.3 -N -H 'Content-Type: application/json' -d '%s' /v1/completions", body);
    }
    bool ok = ask(port, a);
    CHECK(ok);
    CHECK_INT(ts_http(port, "/metrics"), 200);
    CHECK(strstr(ts_body, "pagekv_requests_running") != NULL);
    if (np > 1) {
        const char *key = "\npagekv_client_disconnects_total ", *d = strstr(ts_body, key);
        CHECK(d && atoi(d + strlen(key)) >= 1);
        fprintf(stderr, "-np %d: client disconnects (cancels) %d\n", np, d ? atoi(d + strlen(key)) : -1);
        /* what runs outside the engine's steps, or cannot cross as a record, is refused, naming the ranks */
        CHECK_INT(ts_http(port, "-H 'Content-Type: application/json' -d '{}' /v1/contexts"), 501);
        CHECK(strstr(ts_body, "MPI ranks") != NULL);
        CHECK_INT(ts_http(port, "-H 'Content-Type: application/json' -d '{\"prompt\":\"hi\",\"max_tokens\":4,"
                          "\"response_format\":{\"type\":\"json_object\"}}' /v1/completions"), 503);
        CHECK(strstr(ts_body, "MPI ranks") != NULL);
    }
    /* SIGTERM to rank 0 (the process that listens): it drains, tells the other
     * ranks to stop, and the whole job exits 0 */
    int rc;
    if (np > 1) {
        pid_t ch[8], r0 = 0;
        int n = ts_children(pid, ch, 8);
        CHECK_INT(n, np);
        for (int i = 0; i < n; i++) { /* rank 0: the one with OMPI_COMM_WORLD_RANK=0 */
            char path[64], env[1 << 15];
            snprintf(path, sizeof path, "/proc/%d/environ", (int)ch[i]);
            FILE *f = fopen(path, "rb");
            size_t len = f ? fread(env, 1, sizeof env - 1, f) : 0;
            if (f) fclose(f);
            for (size_t at = 0; at < len; at += strlen(env + at) + 1)
                if (!strcmp(env + at, "OMPI_COMM_WORLD_RANK=0")) r0 = ch[i];
        }
        CHECK(r0 > 0);
        if (r0 > 0) kill(r0, SIGTERM);
        rc = ts_stop(pid, 0); /* (waits for mpirun) */
        for (int i = 0; i < n; i++) CHECK(kill(ch[i], 0) != 0); /* no rank is left */
    } else {
        rc = ts_stop(pid, SIGTERM);
    }
    CHECK_INT(rc, 0);
    return ok;
}

int main(void) {
#ifndef PKV_HAVE_SERVER
    return th_skip("this pagekv was built without the HTTP server (libmicrohttpd, jansson)");
#endif
#ifndef PKV_TEST_HAVE_MPI
    return th_skip("this pagekv was built without MPI (libopenmpi-dev)");
#endif
    if (!getenv("PKV_CLI")) return th_skip("PKV_CLI not set (run through ctest)");
    if (system("command -v mpirun > /dev/null 2>&1")) return th_skip("mpirun not found (Debian's openmpi-bin)");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1); /* CI runs as root */
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    char model[512];
    snprintf(model, sizeof model, "%s", th_tmp("sd-llama.gguf"));
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "llama";
    p.n_layer = 4;
    p.seed = 42;
    CHECK(pkv_mkmodel_write(&p, model) == PKV_OK);
    static answer one, ranks;
    if (!serve_and_ask("", model, 1, &one)) return th_done();
    CHECK(one.cached[N_REQ - 1] > 0); /* the prefix hit */
    for (int np = 2; np <= 3; np++) {
        char launcher[128];
        snprintf(launcher, sizeof launcher, "mpirun --oversubscribe --bind-to none -np %d", np);
        memset(&ranks, 0, sizeof ranks);
        if (!serve_and_ask(launcher, model, np, &ranks)) continue;
        for (int i = 0; i < N_REQ; i++) {
            bool eq = !strcmp(one.text[i], ranks.text[i]);
            if (!eq) fprintf(stderr, "request %d under %d ranks: %s\n  one process: %s\n", i, np, ranks.text[i], one.text[i]);
            CHECK(eq);
            CHECK_INT(ranks.cached[i], one.cached[i]);
        }
        fprintf(stderr, "-np %d: %d responses equal to one process's (prefix hit of %lld tokens)\n", np, N_REQ,
                ranks.cached[N_REQ - 1]);
    }
    unlink(model);
    return th_done();
}
