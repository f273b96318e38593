#include "cli/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pagekv.h"

bool pkv_cli_int(const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "pagekv: %s expects an integer in [%lld, %lld], got '%s'\n", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool pkv_cli_float(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "pagekv: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

const char *pkv_cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "pagekv: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int pkv_cli_fail(const char *cmd, const char *what, int status) {
    fprintf(stderr, "pagekv %s: %s: %s: %s\n", cmd, what, pkv_status_str((pkv_status)status), pkv_errmsg());
    return 1;
}

int pkv_cli_extra_cpus(void) {
    const char *e = getenv("PKV_CPU_DEVICES");
    if (!e) return 1;
    long v = strtol(e, NULL, 10);
    return v < 0 ? 0 : v > 64 ? 64 : (int)v;
}

double pkv_time_now_cli(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *pkv_cli_read_text(const char *cmd, const char *path, size_t *len) {
    bool std_in = !strcmp(path, "-");
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "pagekv %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            if (cap >= ((size_t)1 << 30)) {
                fprintf(stderr, "pagekv %s: %s is larger than 1 GiB\n", cmd, std_in ? "standard input" : path);
                free(buf);
                buf = NULL;
                break;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (buf && ferror(f)) {
        fprintf(stderr, "pagekv %s: cannot read %s: %s\n", cmd, std_in ? "standard input" : path, strerror(errno));
        free(buf);
        buf = NULL;
    } else if (!buf && errno == ENOMEM) {
        fprintf(stderr, "pagekv %s: out of memory reading %s\n", cmd, std_in ? "standard input" : path);
    }
    if (!std_in) fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    *len = n;
    return buf;
}
