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

bool pkv_cli_kv_type(const char *opt, const char *v, int *out) {
    static const struct {
        const char *name;
        pkv_type t;
    } types[] = {{"f16", PKV_TYPE_F16}, {"f32", PKV_TYPE_F32}, {"q8_0", PKV_TYPE_Q8_0}, {"q4_0", PKV_TYPE_Q4_0}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(v, types[i].name)) {
            *out = (int)types[i].t;
            return true;
        }
    fprintf(stderr, "pagekv: %s is f16, f32, q8_0 or q4_0, got '%s'\n", opt, v);
    return false;
}

/* One page of the layers that keep every token (windowed: false) or of the
 * sliding-window layers (true), all shards. */
static double kv_page_bytes_of(const pkv_kv_cache *c, bool windowed) {
    const pkv_kv_layout *l = pkv_kv_cache_layout(c);
    double b = 0;
    for (int il = 0; il < pkv_kv_layout_n_layers(l); il++) {
        pkv_kv_layer_info li;
        if (pkv_kv_layout_layer(l, il, &li) == PKV_OK && (li.window > 0) == windowed)
            b += (double)li.k_page_bytes + (double)li.v_page_bytes;
    }
    return b;
}

static double kv_page_bytes(const pkv_kv_cache *c) { return kv_page_bytes_of(c, false); }

double pkv_cli_kv_bytes_per_token_all(const pkv_kv_cache *c) {
    return (kv_page_bytes_of(c, false) + kv_page_bytes_of(c, true)) / pkv_kv_layout_page_size(pkv_kv_cache_layout(c));
}

double pkv_cli_kv_window_bytes_per_seq(const pkv_kv_cache *c) {
    const pkv_kv_layout *l = pkv_kv_cache_layout(c);
    int ps = pkv_kv_layout_page_size(l), window = 0;
    for (int il = 0; il < pkv_kv_layout_n_layers(l); il++) {
        pkv_kv_layer_info li;
        if (pkv_kv_layout_layer(l, il, &li) == PKV_OK && li.window > window) window = li.window;
    }
    if (window == 0) return 0;
    /* the window, the page kept for rollback, and the page being filled */
    return kv_page_bytes_of(c, true) * (double)((window + ps + ps - 1) / ps + 1);
}

double pkv_cli_kv_bytes_per_token(const pkv_kv_cache *c) {
    return kv_page_bytes(c) / pkv_kv_layout_page_size(pkv_kv_cache_layout(c));
}

long long pkv_cli_kv_max_tokens(const pkv_kv_cache *c, double mem) {
    double pb = kv_page_bytes(c);
    return pb > 0 ? (long long)(mem / pb) * pkv_kv_layout_page_size(pkv_kv_cache_layout(c)) : 0;
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

/* A row's integer bound: 2^63 and beyond (INT64_MAX as a double) is INT64_MAX. */
static long long bound(double d) { return d >= 0x1p63 ? INT64_MAX : (long long)d; }

int pkv_cli_opt_parse(const pkv_cli_opt *t, size_t n, int argc, char **argv, int *i, void *opts) {
    const char *a = argv[*i];
    for (size_t k = 0; k < n; k++) {
        if (strcmp(a, t[k].name) && (!t[k].alias || strcmp(a, t[k].alias))) continue;
        char *field = (char *)opts + t[k].off;
        const char *v = NULL;
        bool takes = t[k].kind == PKV_CLI_FN ? t[k].takes : t[k].kind != PKV_CLI_FLAG && t[k].kind != PKV_CLI_UNSET;
        if (takes && !(v = pkv_cli_value(argc, argv, i))) return -1;
        long long x;
        double d;
        switch (t[k].kind) {
        case PKV_CLI_FLAG: *(bool *)(void *)field = true; break;
        case PKV_CLI_UNSET: *(bool *)(void *)field = false; break;
        case PKV_CLI_STR: *(const char **)(void *)field = v; break;
        case PKV_CLI_INT:
        case PKV_CLI_LLONG:
        case PKV_CLI_INT64:
        case PKV_CLI_SIZE:
            if (!pkv_cli_int(a, v, bound(t[k].lo), bound(t[k].hi), &x)) return -1;
            if (t[k].kind == PKV_CLI_INT) *(int *)(void *)field = (int)x;
            else if (t[k].kind == PKV_CLI_LLONG) *(long long *)(void *)field = x;
            else if (t[k].kind == PKV_CLI_INT64) *(int64_t *)(void *)field = x;
            else *(size_t *)(void *)field = (size_t)x;
            break;
        case PKV_CLI_FLOAT:
            if (!pkv_cli_float(a, v, t[k].lo, t[k].hi, &d)) return -1;
            *(float *)(void *)field = (float)d;
            break;
        case PKV_CLI_DOUBLE:
            if (!pkv_cli_float(a, v, t[k].lo, t[k].hi, &d)) return -1;
            *(double *)(void *)field = d;
            break;
        case PKV_CLI_FN:
            if (!t[k].fn(opts, a, v)) return -1;
            break;
        }
        return 1;
    }
    return 0;
}

int pkv_cli_parse(const pkv_cli_cmd *c, int argc, char **argv, void *opts) {
    const bool *help = (const bool *)(const void *)((const char *)opts + c->help_off);
    for (int i = 1; i < argc; i++) {
        int r = c->more ? c->more(argc, argv, &i, opts) : 0;
        if (!r) r = pkv_cli_opt_parse(c->opts, c->n_opts, argc, argv, &i, opts);
        if (r < 0) return 2;
        if (*help) {
            c->usage(stdout);
            return 0;
        }
        if (c->stop_off && *(const bool *)(const void *)((const char *)opts + c->stop_off)) return 0;
        if (!r) {
            if (c->see_help)
                fprintf(stderr, "pagekv %s: unknown option '%s' (see 'pagekv %s --help')\n", c->name, argv[i], c->name);
            else fprintf(stderr, "pagekv %s: unknown option '%s'\n", c->name, argv[i]);
            if (c->usage_on_unknown) c->usage(stderr);
            return 2;
        }
    }
    return -1;
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

void pkv_cli_weight_types(const pkv_device *dev, uint64_t types, pkv_weight_speed speed, bool json, char *buf,
                          size_t size) {
    size_t n = 0;
    buf[0] = 0;
    for (int t = 0; t < PKV_TYPE_COUNT && t < 64; t++) {
        const char *name = pkv_type_name((pkv_type)t);
        if (!name || (types && !(types >> t & 1))) continue;
        if (!types && (t == PKV_TYPE_I32 || t == PKV_TYPE_Q8_K)) continue; /* not weight types of GGUF files */
        if (pkv_device_weight_speed(dev, (pkv_type)t) != speed) continue;
        int w = snprintf(buf + n, size - n, json ? "%s\"%s\"" : "%s%s", n ? ", " : "", name);
        if (w < 0 || (size_t)w >= size - n) break;
        n += (size_t)w;
    }
}
