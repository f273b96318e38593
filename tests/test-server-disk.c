// labels: server timeout=240
/* pagekv serve --kv-disk: a long prompt answered by a server that was killed
 * (kill -9) after answering it once is answered by the next server on the same
 * directory from disk (cached_tokens > 0, the disk hit counter moves) with text
 * identical to the cold run; a second server on a directory in use, a foreign
 * directory and a model with chunked-attention layers are refused at startup with
 * a clear message; a sliding-window model (gemma3) hits from disk too, with the
 * text of its cold run; a server whose page writes fail (a file-size limit: EFBIG,
 * the way a full disk fails) goes on serving the same text and says so in its log
 * and /metrics. */
#include "testhelp.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"
#include "server-testlib.h"

#include <sys/resource.h>

static const char *jstr(json_t *j, const char *path) {
    json_t *v = jget(j, path);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int g_port;
static char g_model[512];

static int post(const char *json, json_t **out) {
    char f[512];
    snprintf(f, sizeof f, "%s", ts_file("body.json", json, strlen(json)));
    int code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s /v1/completions", f);
    *out = json_loads(ts_body, 0, NULL);
    return code;
}

static long long metric(const char *name) {
    if (ts_http(g_port, "/metrics") != 200) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(ts_body, key);
    return p ? atoll(p + strlen(key)) : -1;
}

static bool log_has(const char *log, const char *needle) {
    static char buf[1 << 16];
    return strstr(th_read_text(log, buf, sizeof buf), needle) != NULL;
}

/* The completion of the long prompt: its text (static) and cached_tokens. */
static const char *ask(const char *body, long long *cached) {
    static char text[4][4096];
    static int k;
    char *out = text[k++ & 3];
    json_t *j = NULL;
    out[0] = 0;
    *cached = -1;
    CHECK_INT(post(body, &j), 200);
    if (j && jstr(j, "choices.0.text")) {
        snprintf(out, 4096, "%s", jstr(j, "choices.0.text"));
        *cached = jint(j, "usage.prompt_tokens_details.cached_tokens");
    } else {
        fprintf(stderr, "response: %.300s\n", ts_body);
    }
    json_decref(j);
    return out;
}

int main(void) {
    if (th_cli("", true, "serve --help") != 0) return th_skip("pagekv serve is not available");
    snprintf(g_model, sizeof g_model, "%s", th_tmp("disk.gguf"));
    REQUIRE(th_cli("", true, "mkmodel --no-template -o '%s'", g_model) == 0);
    char dir[512], log[512], args[2048], body[8192] = "{\"prompt\": \"";
    snprintf(dir, sizeof dir, "%s", th_tmp("kvdisk-srv"));
    snprintf(log, sizeof log, "%s", th_tmp("disk-serve.log"));
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    REQUIRE(system(cmd) == 0);
    for (int i = 0; i < 12; i++) strcat(body, "a long shared system prompt that every request repeats word for word ");
    strcat(body, "\", \"max_tokens\": 12, \"temperature\": 0}");

    /* cold: the first server computes the prompt and writes its pages */
    snprintf(args, sizeof args, "-m '%s' -c 1024 --kv-disk '%s' --kv-disk-size 64", g_model, dir);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    long long cached = 0;
    char cold[4096];
    snprintf(cold, sizeof cold, "%s", ask(body, &cached));
    CHECK_INT(cached, 0);
    CHECK(cold[0] != 0);
    long long written = -1;
    /* the writes are asynchronous: wait until the count has held still for 1 s */
    for (int i = 0, still = 0; i < 600 && still < 20; i++) {
        long long w = metric("pagekv_kv_disk_written_pages_total");
        still = (w > 0 && w == written) ? still + 1 : 0;
        written = w;
        ts_sleep_ms(50);
    }
    CHECK(written > 10);
    CHECK_INT(metric("pagekv_kv_disk_enabled"), 1);
    CHECK(log_has(log, "KV disk tier"));
    { /* a second server on the directory in use: refused, naming it */
        int rc = th_cli("", true, "serve -m '%s' --kv-disk '%s' --port 0", g_model, dir);
        CHECK_INT(rc, 1);
        HAS("is in use by another process");
    }
    CHECK_INT(ts_stop(pid, SIGKILL), -2); /* no shutdown: what is on disk must stand alone */

    /* warm from disk: a new process answers from the files, the same text */
    pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    const char *warm = ask(body, &cached);
    CHECK(cached > 0 && cached % 16 == 0);
    CHECK(cached >= written * 16 - 16);
    if (strcmp(warm, cold)) TH_FAIL("warm-from-disk text differs:\n cold: %s\n warm: %s", cold, warm);
    th_checks++;
    CHECK(metric("pagekv_kv_disk_hit_pages_total") * 16 == cached);
    CHECK_INT(metric("pagekv_kv_disk_rejected_files_total"), 0);
    CHECK_INT(metric("pagekv_kv_disk_spills_total"), 0); /* exported (one request: nothing preempted) */
    CHECK_INT(metric("pagekv_kv_disk_spill_read_pages_total"), 0);
    CHECK(metric("pagekv_kv_disk_files") >= written);
    { /* the web page's /v1/kv names the disk tier with the same counters */
        REQUIRE(ts_http(g_port, "/v1/kv") == 200);
        json_t *kv = json_loads(ts_body, 0, NULL);
        json_t *tiers = kv ? json_object_get(kv, "tiers") : NULL, *disk = NULL;
        for (size_t i = 0; json_is_array(tiers) && i < json_array_size(tiers); i++) {
            const char *nm = json_string_value(json_object_get(json_array_get(tiers, i), "name"));
            if (nm && !strcmp(nm, "disk")) disk = json_array_get(tiers, i);
        }
        CHECK(disk != NULL);
        if (disk) {
            CHECK(json_is_true(json_object_get(disk, "enabled")));
            CHECK(jint(disk, "files") >= written);
            CHECK_INT(jint(disk, "bytes_max"), 64ll << 20);
            CHECK(jint(disk, "hit_pages") * 16 == cached);
            CHECK_INT(jint(disk, "rejected_files"), 0);
        }
        json_decref(kv);
    }
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    /* startup refusals with a clear message */
    {
        char foreign[600];
        snprintf(foreign, sizeof foreign, "%s-foreign", dir);
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && echo data > '%s/report.txt'", foreign, foreign, foreign);
        REQUIRE(system(cmd) == 0);
        CHECK_INT(th_cli("", true, "serve -m '%s' --kv-disk '%s' --port 0", g_model, foreign), 1);
        HAS("is not a pagekv disk cache");
        char gm[512];
        snprintf(gm, sizeof gm, "%s", th_tmp("disk-llama4.gguf"));
        REQUIRE(th_cli("", true, "mkmodel --arch llama4 --no-template -o '%s'", gm) == 0);
        CHECK_INT(th_cli("", true, "serve -m '%s' --kv-disk '%s-g' --port 0", gm, dir), 1);
        HAS("chunked-attention layer");
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s-g'", foreign, dir);
        if (system(cmd) != 0) fprintf(stderr, "could not clean up\n");
    }

    /* a sliding-window model: the window layers' rows travel in the last pages' files */
    {
        char gm[512], dg[600];
        snprintf(gm, sizeof gm, "%s", th_tmp("disk-gemma3.gguf"));
        snprintf(dg, sizeof dg, "%s-gemma3", dir);
        REQUIRE(th_cli("", true, "mkmodel --arch gemma3 --layers 6 --no-template -o '%s'", gm) == 0);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dg);
        REQUIRE(system(cmd) == 0);
        snprintf(args, sizeof args, "-m '%s' -c 1024 --kv-disk '%s'", gm, dg);
        pid = ts_start(args, log, &g_port);
        REQUIRE(pid > 0);
        char gcold[4096];
        snprintf(gcold, sizeof gcold, "%s", ask(body, &cached));
        CHECK_INT(cached, 0);
        CHECK_INT(ts_stop(pid, SIGTERM), 0); /* an orderly stop writes what is cached */
        pid = ts_start(args, log, &g_port);
        REQUIRE(pid > 0);
        const char *gwarm = ask(body, &cached);
        CHECK(cached > 0);
        if (strcmp(gwarm, gcold)) TH_FAIL("gemma3 warm-from-disk text differs:\n cold: %s\n warm: %s", gcold, gwarm);
        th_checks++;
        CHECK(metric("pagekv_kv_disk_hit_pages_total") * 16 == cached);
        CHECK_INT(ts_stop(pid, SIGTERM), 0);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dg);
        if (system(cmd) != 0) fprintf(stderr, "could not clean up\n");
    }

    /* page writes fail (files limited to 4 KiB, SIGXFSZ ignored: write() gets EFBIG): serving goes on */
    {
        char d2[600];
        snprintf(d2, sizeof d2, "%s-full", dir);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d2);
        REQUIRE(system(cmd) == 0);
        snprintf(args, sizeof args, "-m '%s' -c 1024 --kv-disk '%s'", g_model, d2);
        signal(SIGXFSZ, SIG_IGN); /* inherited by the server through exec */
        struct rlimit old, lim;
        getrlimit(RLIMIT_FSIZE, &old);
        lim = old;
        lim.rlim_cur = 4096;
        setrlimit(RLIMIT_FSIZE, &lim);
        pid = ts_start(args, log, &g_port);
        setrlimit(RLIMIT_FSIZE, &old);
        signal(SIGXFSZ, SIG_DFL);
        REQUIRE(pid > 0);
        const char *t1 = ask(body, &cached);
        CHECK(!strcmp(t1, cold));
        long long en = -1;
        for (int i = 0; i < 200 && (en = metric("pagekv_kv_disk_enabled")) != 0; i++) ts_sleep_ms(50);
        CHECK_INT(en, 0);
        CHECK_INT(metric("pagekv_kv_disk_write_errors_total"), 1);
        CHECK_INT(metric("pagekv_kv_disk_written_pages_total"), 0);
        const char *t2 = ask(body, &cached); /* from memory */
        CHECK(cached > 0);
        CHECK(!strcmp(t2, cold));
        CHECK_INT(ts_stop(pid, SIGTERM), 0);
        CHECK(log_has(log, "the disk tier is off from now on"));
        CHECK(log_has(log, "File too large"));
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d2);
        if (system(cmd) != 0) fprintf(stderr, "could not clean up\n");
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not clean up\n");
    return th_done();
}
#endif
