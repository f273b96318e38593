/* Helpers for the Redis KV tier tests: a redis-server of the test's own on
 * 127.0.0.1 on a free port, nothing saved (--save '' --appendonly no), always
 * stopped (PR_SET_PDEATHSIG, and server-testlib.h's atexit kills it with the
 * servers), and redis-cli to look at it. */
#ifndef PKV_REDIS_TESTLIB_H
#define PKV_REDIS_TESTLIB_H

#include <netinet/in.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server-testlib.h"

/* NULL when redis-server and redis-cli are installed, else what is missing. */
static inline const char *rt_missing(void) {
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        return "redis-server is not installed (Debian: redis-server)";
    if (system("command -v redis-cli >/dev/null 2>&1") != 0) return "redis-cli is not installed (Debian: redis-tools)";
    return NULL;
}

/* A TCP port on 127.0.0.1 nobody listens on now. If fd_out, the socket is kept
 * bound and listening there (a peer that accepts and never answers). */
static inline int rt_free_port(int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &n)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    if (fd_out) {
        listen(fd, 4);
        *fd_out = fd;
    } else {
        close(fd);
    }
    return ntohs(a.sin_port);
}

/* Output of the last rt_cli call. */
static char rt_out[1 << 16];

/* `redis-cli -p port ARGS` (a shell command line); its exit status. */
static inline int rt_cli(int port, const char *fmt, ...) {
    char args[2048], cmd[2400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "timeout 10 redis-cli -h 127.0.0.1 -p %d %s 2>&1", port, args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(rt_out, 1, sizeof rt_out - 1, f);
    rt_out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* An integer field of INFO (e.g. "evicted_keys"), or -1. */
static inline long long rt_info(int port, const char *field) {
    if (rt_cli(port, "INFO") != 0) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s:", field);
    const char *p = strstr(rt_out, key);
    return p ? atoll(p + strlen(key)) : -1;
}

/* Start redis-server on port with extra arguments (a shell fragment, "" for none);
 * its output to log. The pid once it answers PING (within 10 s), or -1. */
static inline pid_t rt_start(int port, const char *extra, const char *log) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no %s >'%s' 2>&1",
             port, extra, log);
    if (ts_n_pids == 0) atexit(ts_kill_all);
    int slot = 0; /* a slot of server-testlib.h's registry: a stopped one's, or a new one */
    while (slot < ts_n_pids && ts_pids[slot] > 0) slot++;
    if (slot == TS_MAX_SERVERS) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    ts_pids[slot] = pid;
    if (slot == ts_n_pids) ts_n_pids++;
    for (int i = 0; i < 200; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            ts_pids[slot] = 0;
            return -1;
        }
        /* PING answered (PONG) or refused for want of AUTH (NOAUTH): it is up */
        if (rt_cli(port, "PING") == 0 && (strstr(rt_out, "PONG") || strstr(rt_out, "NOAUTH"))) return pid;
        ts_sleep_ms(50);
    }
    return -1;
}

static inline void rt_stop(pid_t pid) { (void)ts_stop(pid, SIGKILL); }

#endif
