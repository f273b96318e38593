/* Status text, the thread's last error message, and logging. */
#include "base/base.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static _Thread_local char tl_msg[1024];
static _Thread_local pkv_status tl_status; /* of the failure tl_msg describes */

const char *pkv_status_str(pkv_status s) {
    switch (s) {
    case PKV_OK: return "ok";
    case PKV_ERR_INVALID: return "invalid argument";
    case PKV_ERR_NOMEM: return "out of memory";
    case PKV_ERR_OUT_OF_PAGES: return "out of KV pages";
    case PKV_ERR_IO: return "I/O error";
    case PKV_ERR_FORMAT: return "bad file format";
    case PKV_ERR_UNSUPPORTED: return "unsupported";
    case PKV_ERR_DEVICE: return "device error";
    case PKV_ERR_MISMATCH: return "mismatch";
    case PKV_ERR_NOT_FOUND: return "not found";
    case PKV_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *pkv_errmsg(void) { return tl_msg; }

pkv_status pkv_errcode(void) { return tl_status; }

void pkv_err_clear(void) {
    tl_msg[0] = 0;
    tl_status = PKV_OK;
}

pkv_status pkv_err(pkv_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
    va_end(ap);
    tl_status = s;
    return s;
}

pkv_status pkv_err_prefix(pkv_status s, const char *fmt, ...) {
    char old[sizeof tl_msg], pre[512];
    memcpy(old, tl_msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    /* one ": " between the parts, whether or not the caller's prefix ends with one */
    size_t n = strlen(pre);
    while (n && (pre[n - 1] == ' ' || pre[n - 1] == ':')) pre[--n] = 0;
    if (old[0])
        snprintf(tl_msg, sizeof tl_msg, "%s: %s", pre, old);
    else
        snprintf(tl_msg, sizeof tl_msg, "%s", pre);
    tl_status = s;
    return s;
}

static pkv_log_fn g_log_fn;
static void *g_log_user;
static pkv_log_level g_log_min = PKV_LOG_WARN;

void pkv_log_set(pkv_log_fn fn, void *user, pkv_log_level min_level) {
    g_log_fn = fn;
    g_log_user = user;
    g_log_min = min_level;
}

void pkv_log(pkv_log_level level, const char *fmt, ...) {
    if (level < g_log_min || level >= PKV_LOG_NONE) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (g_log_fn) {
        g_log_fn(level, line, g_log_user);
        return;
    }
    static const char *names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "pagekv %s: %s\n", names[level], line);
}

double pkv_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#ifndef PKV_VERSION_STRING
#define PKV_VERSION_STRING "unknown"
#endif
const char *pkv_version(void) { return PKV_VERSION_STRING; }
