/* Tiny assertion helpers for pagekv tests: print file, line and both values on
 * failure; count checks; exit 1 on any failure, 77 when skipped. */
#ifndef PKV_TESTHELP_H
#define PKV_TESTHELP_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pagekv.h"

static int th_failures = 0;
static long th_checks = 0;

#define TH_FAIL(...)                                                                  \
    do {                                                                              \
        fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                         \
        fprintf(stderr, __VA_ARGS__);                                                 \
        fputc('\n', stderr);                                                          \
        th_failures++;                                                                \
    } while (0)

#define CHECK(cond)                                                                   \
    do {                                                                              \
        th_checks++;                                                                  \
        if (!(cond)) TH_FAIL("%s", #cond);                                            \
    } while (0)

#define CHECK_INT(a, b)                                                               \
    do {                                                                              \
        long long _a = (long long)(a), _b = (long long)(b);                           \
        th_checks++;                                                                  \
        if (_a != _b) TH_FAIL("%s == %s: %lld != %lld", #a, #b, _a, _b);              \
    } while (0)

/* Checks a pkv_status call returns OK, printing the library's message if not. */
#define CHECK_OK(expr)                                                                \
    do {                                                                              \
        pkv_status _s = (expr);                                                       \
        th_checks++;                                                                  \
        if (_s != PKV_OK)                                                             \
            TH_FAIL("%s -> %s: %s", #expr, pkv_status_str(_s), pkv_errmsg());         \
    } while (0)

#define CHECK_STATUS(expr, want)                                                      \
    do {                                                                              \
        pkv_status _s = (expr);                                                       \
        th_checks++;                                                                  \
        if (_s != (want))                                                             \
            TH_FAIL("%s -> %s, want %s (%s)", #expr, pkv_status_str(_s),              \
                    pkv_status_str(want), pkv_errmsg());                              \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                         \
    do {                                                                              \
        double _a = (double)(a), _b = (double)(b);                                    \
        th_checks++;                                                                  \
        if (!(fabs(_a - _b) <= (tol)))                                                \
            TH_FAIL("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, _a, _b, (double)(tol)); \
    } while (0)

/* The error message contains the substring. */
#define CHECK_MSG(sub)                                                                \
    do {                                                                              \
        th_checks++;                                                                  \
        if (!strstr(pkv_errmsg(), (sub)))                                             \
            TH_FAIL("errmsg \"%s\" lacks \"%s\"", pkv_errmsg(), (sub));               \
    } while (0)

#define CHECK_MEM(a, b, n)                                                            \
    do {                                                                              \
        th_checks++;                                                                  \
        if (memcmp((a), (b), (n)) != 0) TH_FAIL("memcmp(%s, %s, %zu) differs", #a, #b, \
                                                (size_t)(n));                         \
    } while (0)

/* Abort the test early (after a failure that makes going on pointless). */
#define REQUIRE(cond)                                                                 \
    do {                                                                              \
        th_checks++;                                                                  \
        if (!(cond)) {                                                                \
            TH_FAIL("required: %s (%s)", #cond, pkv_errmsg());                        \
            return th_done();                                                         \
        }                                                                             \
    } while (0)

/* REQUIRE for functions returning void. */
#define REQUIRE_VOID(cond)                                                            \
    do {                                                                              \
        th_checks++;                                                                  \
        if (!(cond)) {                                                                \
            TH_FAIL("required: %s (%s)", #cond, pkv_errmsg());                        \
            return;                                                                   \
        }                                                                             \
    } while (0)

static inline int th_done(void) {
    /* Under PKV_VK_VALIDATE=1 (ctest sets it) any error or warning of the Vulkan
     * validation layer in this process fails the test. */
    char vmsg[1024];
    int64_t nv = pkv_vulkan_validation_messages(vmsg, sizeof vmsg);
    th_checks++;
    if (nv > 0) TH_FAIL("the Vulkan validation layer reported %" PRId64 " message(s); the first: %s", nv, vmsg);
    if (th_failures) {
        fprintf(stderr, "%d of %ld checks failed\n", th_failures, th_checks);
        return 1;
    }
    fprintf(stderr, "all %ld checks passed\n", th_checks);
    return 0;
}

/* Report a skip (ctest counts exit 77 as skipped, never as passed). */
static inline int th_skip(const char *why) {
    fprintf(stderr, "SKIP: %s\n", why);
    return 77;
}

/* Normalized mean squared error of b against reference a. */
static inline double th_nmse(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)a[i] * (double)a[i];
    }
    return den > 0 ? num / den : num;
}

/* Deterministic PRNG for tests (splitmix64). */
static inline uint64_t th_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float th_randf(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(th_rand(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A scratch path under the build tree (PKV_TEST_TMP) or /tmp, unique to this
 * process: tests run in parallel, and two of them may use the same name. */
static inline const char *th_tmp(const char *name) {
    static char buf[4][512];
    static int k = 0;
    const char *dir = getenv("PKV_TEST_TMP");
    char *out = buf[k++ & 3];
    snprintf(out, 512, "%s/%ld-%s", dir && *dir ? dir : "/tmp", (long)getpid(), name);
    return out;
}

/* Output of the last th_cli call. */
static char th_out[1 << 20];

/* The first size - 1 bytes of a file as a NUL-terminated string ("" when it
 * cannot be read); returns buf. */
static inline char *th_read_text(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, size - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
    return buf;
}

/* Run `pagekv ARGS` (the binary ctest passes in PKV_CLI) with the environment
 * assignments env ("" for none), capturing stdout, and stderr too when merge.
 * Returns the exit status, -2 when it died from a signal (a crash), -1 when it
 * could not run. */
static inline int th_cli(const char *env, bool merge, const char *fmt, ...) {
    const char *bin = getenv("PKV_CLI");
    if (!bin) return -1;
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s '%s' %s %s", env, bin, args, merge ? "2>&1" : "2>/dev/null");
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(th_out, 1, sizeof th_out - 1, f);
    th_out[n] = 0;
    int st = pclose(f);
    if (WIFSIGNALED(st)) return -2;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define HAS(s) CHECK(strstr(th_out, (s)) != NULL)

#endif
