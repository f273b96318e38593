/* Helpers for the server tests: start `pagekv serve` on 127.0.0.1 on a free
 * port, always stop it (it dies with the test process: PR_SET_PDEATHSIG, and
 * atexit kills it), and talk to it with curl (bounded: --max-time). */
#ifndef PKV_SERVER_TESTLIB_H
#define PKV_SERVER_TESTLIB_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include "testhelp.h"

#define TS_MAX_SERVERS 8
static pid_t ts_pids[TS_MAX_SERVERS];
static int ts_n_pids;

static bool ts_groups[TS_MAX_SERVERS]; /* started under a launcher (mpirun), whose children are the servers */

/* The children of pid (a launcher's: mpirun's ranks, each in its own process
 * group), at most max; how many. */
static inline int ts_children(pid_t pid, pid_t *out, int max) {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "pgrep -P %d", (int)pid);
    FILE *f = popen(cmd, "r");
    int n = 0, c;
    while (f && n < max && fscanf(f, "%d", &c) == 1) out[n++] = (pid_t)c;
    if (f) pclose(f);
    return n;
}

/* SIGKILL to pid, and first to its children when it is a launcher. */
static inline void ts_kill_tree(pid_t pid, bool launcher) {
    pid_t ch[64];
    for (int i = 0, n = launcher ? ts_children(pid, ch, 64) : 0; i < n; i++) kill(ch[i], SIGKILL);
    kill(pid, SIGKILL);
}

static inline void ts_kill_all(void) {
    for (int i = 0; i < ts_n_pids; i++)
        if (ts_pids[i] > 0) {
            ts_kill_tree(ts_pids[i], ts_groups[i]); /* mpirun and every rank */
            waitpid(ts_pids[i], NULL, 0);
            ts_pids[i] = 0;
        }
}

static inline void ts_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Start `LAUNCHER pagekv serve ARGS --host 127.0.0.1 --port 0 --port-file ...`
 * (launcher: e.g. "mpirun -np 2", whose children ts_kill_all kills with it; ""
 * for none); its output goes to log (a file). Returns the pid
 * (> 0) and the port in *port, or -1 when it did not come up within 30 s (its
 * exit status in *port then). */
static inline pid_t ts_start_under(const char *launcher, const char *args, const char *log, int *port) {
    static int k = 0;
    const char *bin = getenv("PKV_CLI");
    char pf[512], cmd[4096];
    snprintf(pf, sizeof pf, "%s", th_tmp(k++ % 2 ? "port-b" : "port-a"));
    unlink(pf);
    snprintf(cmd, sizeof cmd, "exec %s '%s' serve %s --host 127.0.0.1 --port 0 --port-file '%s' >'%s' 2>&1", launcher, bin,
             args, pf, log);
    if (ts_n_pids == 0) atexit(ts_kill_all);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (ts_n_pids < TS_MAX_SERVERS) ts_groups[ts_n_pids] = *launcher, ts_pids[ts_n_pids++] = pid;
    for (int i = 0; i < 600; i++) {
        FILE *f = fopen(pf, "r");
        if (f) {
            int p = 0;
            int ok = fscanf(f, "%d", &p);
            fclose(f);
            if (ok == 1 && p > 0) {
                *port = p;
                return pid;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            for (int j = 0; j < ts_n_pids; j++)
                if (ts_pids[j] == pid) ts_pids[j] = 0;
            *port = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            return -1;
        }
        ts_sleep_ms(50);
    }
    *port = -1;
    return -1;
}

static inline pid_t ts_start(const char *args, const char *log, int *port) { return ts_start_under("", args, log, port); }

/* Send sig and wait (at most 30 s, then SIGKILL). Returns the exit status, or
 * -2 when it had to be killed or died from a signal. */
static inline int ts_stop(pid_t pid, int sig) {
    if (pid <= 0) return -1;
    kill(pid, sig);
    int st = 0;
    for (int i = 0; i < 600; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            for (int j = 0; j < ts_n_pids; j++)
                if (ts_pids[j] == pid) ts_pids[j] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -2;
        }
        ts_sleep_ms(50);
    }
    bool launcher = false;
    for (int j = 0; j < ts_n_pids; j++) launcher |= ts_pids[j] == pid && ts_groups[j];
    ts_kill_tree(pid, launcher);
    waitpid(pid, &st, 0);
    for (int j = 0; j < ts_n_pids; j++)
        if (ts_pids[j] == pid) ts_pids[j] = 0;
    return -2;
}

/* Body of the last ts_http call (NUL-terminated) and its length. */
static char ts_body[1 << 22];
static size_t ts_len;

/* curl ARGS against http://127.0.0.1:port (ARGS includes the path, e.g.
 * "/health" or "-d @file /v1/completions"). Returns the HTTP status (0 when
 * curl got no response). */
static inline int ts_http(int port, const char *fmt, ...) {
    char args[4096], cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    /* the path is the last word of args */
    char *path = strrchr(args, ' ');
    char pre[4096] = "";
    if (path) {
        *path++ = 0;
        snprintf(pre, sizeof pre, "%s", args);
    } else {
        path = args;
    }
    snprintf(cmd, sizeof cmd, "curl -sS --max-time 60 -o - -w '\\n%%{http_code}' %s 'http://127.0.0.1:%d%s' 2>/dev/null", pre,
             port, path);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    ts_len = fread(ts_body, 1, sizeof ts_body - 1, f);
    ts_body[ts_len] = 0;
    pclose(f);
    char *nl = strrchr(ts_body, '\n');
    if (!nl) return 0;
    int code = atoi(nl + 1);
    *nl = 0;
    ts_len = (size_t)(nl - ts_body);
    return code;
}

/* Write text to a scratch file (for curl -d @file); returns its path. */
static inline const char *ts_file(const char *name, const char *text, size_t n) {
    const char *p = th_tmp(name);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(text, 1, n, f);
        fclose(f);
    }
    return p;
}

/* Install tests/package.json's pinned npm packages (package-lock.json, `npm ci`)
 * into dir, once: kept while the lock file is unchanged and every module of
 * mods (NULL-terminated) is there. Serialized with flock, so tests running in
 * parallel never install into the same folder at once. false when npm failed
 * (the registry unreachable): the caller skips. */
static inline bool ts_npm_install(const char *src, const char *dir, const char *const *mods) {
    char have[1024] = "", cmd[8192];
    for (int i = 0; mods[i]; i++) {
        size_t l = strlen(have);
        snprintf(have + l, sizeof have - l, " && [ -f '%s/node_modules/%s/package.json' ]", dir, mods[i]);
    }
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && flock '%s/.npm.lock' sh -c \"cmp -s '%s/tests/package-lock.json' '%s/package-lock.json'%s || "
             "{ cd '%s' && cp '%s/tests/package.json' '%s/tests/package-lock.json' . && "
             "timeout 240 npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1 || "
             "{ tail -5 npm.log >&2; rm -f package-lock.json; exit 1; }; }\"",
             dir, dir, src, dir, have, dir, src, src);
    return system(cmd) == 0;
}

/* The Node client tests' start: ctest's PKV_SOURCE_DIR and PKV_NODE_DIR in *src and
 * *dir, node and npm present, and mods installed (ts_npm_install). -1 when ready;
 * otherwise th_skip's exit status (naming what is missing: `what` is the clients). */
static inline int ts_node_ready(const char *const *mods, const char *what, const char **src, const char **dir) {
    *src = getenv("PKV_SOURCE_DIR");
    *dir = getenv("PKV_NODE_DIR");
    if (!*src || !*dir) return th_skip("PKV_SOURCE_DIR/PKV_NODE_DIR not set (run through ctest)");
    if (system("node --version >/dev/null 2>&1") != 0 || system("npm --version >/dev/null 2>&1") != 0)
        return th_skip("node and npm are not installed");
    if (!ts_npm_install(*src, *dir, mods)) {
        char m[256];
        snprintf(m, sizeof m, "npm ci failed (is the npm registry reachable?): %s not installed", what);
        return th_skip(m);
    }
    return -1;
}

/* `node tests/server/SCRIPT PORT` from the source folder, within timeout_s: its
 * exit status (-1 when it did not exit). */
static inline int ts_node_run(const char *src, const char *dir, const char *script, int port, int timeout_s) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && PKV_NODE_DIR='%s' timeout %d node tests/server/%s %d", src, dir, timeout_s, script,
             port);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The SDK tests (tests/server/SCRIPT, a .cjs): mods installed, a model with an
 * 8192-token context (for the tool schemas Qwen2.5's template renders into the
 * prompt) served with that template, the script run against it (150 s), the server
 * healthy after and stopped cleanly. tag names the temporary files. */
static inline int ts_sdk_main(const char *const *mods, const char *tag, const char *script) {
    const char *src, *dir;
    int ready = ts_node_ready(mods, "the SDKs are", &src, &dir);
    if (ready >= 0) return ready;
    char model[512], log[512], args[1024], name[128];
    snprintf(name, sizeof name, "%s.gguf", tag);
    snprintf(model, sizeof model, "%s", th_tmp(name));
    snprintf(name, sizeof name, "%s-serve.log", tag);
    snprintf(log, sizeof log, "%s", th_tmp(name));
    REQUIRE(th_cli("", true, "mkmodel --ctx 8192 -o '%s'", model) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 8192 --chat-template '%s/tests/templates/Qwen-Qwen2.5-7B-Instruct.jinja' "
                                "--api-key test-key --alias tiny", model, src);
    int port;
    pid_t pid = ts_start(args, log, &port);
    REQUIRE(pid > 0);
    CHECK_INT(ts_node_run(src, dir, script, port, 150), 0);
    CHECK_INT(ts_http(port, "/health"), 200);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}

#endif
