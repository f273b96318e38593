/* pagekv bench server: pagekv serve as a client meets it over HTTP, for what the
 * in-process `bench serve` cannot see: the worker shared between generation and
 * the contexts API, and the server's memory under requests that ask for a lot.
 * It starts `pagekv serve` (this binary) on 127.0.0.1 on a free port, sends
 * bounded traffic only there, stops it, and prints one JSON object:
 *  - contexts: one long context forked F times; the latency of a small greedy
 *    completion alone and while P clients poll GET /v1/contexts (or another
 *    path: --poll-path /v1/kv, the web page's cache view) without pause or
 *    every --poll-ms, and the poll's own latency (medians);
 *  - memory: the server's peak RSS (VmHWM) after startup, after 8 parallel
 *    chats with n = 4, logprobs and 20 alternatives per token over the whole
 *    context, then after 8 parallel /tokenize of 1 MB of 'é' with pieces (the
 *    peak only grows: the second figure is the larger of the two loads).
 * Figures from one run; never asserted anywhere. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: pagekv bench server [-m FILE.gguf] [options]\n"
               "pagekv serve under attack-shaped load over HTTP (127.0.0.1, a free port), JSON on stdout.\n"
               "  -m FILE                the model (default: the built-in tiny model)\n"
               "  --ctx-tokens N         the long context's length in tokens (default 1800)\n"
               "  --forks F              forks of it (default 256)\n"
               "  --pollers P            clients polling GET /v1/contexts (default 2)\n"
               "  --poll-path PATH       what they poll (default /v1/contexts; /v1/kv: the web page's cache view)\n"
               "  --poll-ms MS           each poller's pause between polls (default 0: none)\n"
               "  --max-tokens N         tokens of the timed completion (default 20)\n"
               "  --runs R               completions timed per case (default 5)\n"
               "  --no-memory            skip the tokenize and logprobs loads\n"
               "  -c N                   the server's context (default 2048)\n"
               "  --serve-with PATH      run the server from another pagekv binary (before/after figures)\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One HTTP/1.0 request to 127.0.0.1:port; the answer's status, its body bytes in
 * *body_len, the body itself in *body when asked (malloc'd). -1 when it failed. */
static int http(int port, const char *method, const char *path, const char *body, size_t blen, char **out,
                size_t *out_len) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, blen);
    bool ok = write(fd, head, (size_t)hn) == hn;
    for (size_t at = 0; ok && at < blen;) {
        ssize_t k = write(fd, body + at, blen - at);
        ok = k > 0;
        at += ok ? (size_t)k : 0;
    }
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    while (ok && buf) {
        if (len + 4096 > cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) break;
            buf = b;
        }
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    int status = -1;
    if (buf && len > 12 && !strncmp(buf, "HTTP/1.", 7)) status = atoi(buf + 9);
    const char *sep = buf ? strstr(buf, "\r\n\r\n") : NULL;
    size_t off = sep ? (size_t)(sep + 4 - buf) : len;
    if (out_len) *out_len = len - off;
    if (out && buf) {
        memmove(buf, buf + off, len - off);
        buf[len - off] = 0;
        *out = buf;
    } else {
        free(buf);
    }
    return status;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

static long hwm_kib(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    const char *p = strstr(buf, "VmHWM:");
    return p ? atol(p + 6) : -1;
}

typedef struct poller {
    int port;
    volatile bool *stop;
    long lists;
    double t_sum;
    const char *path;
    long pause_ms;
    size_t bytes; /* of the last answer */
} poller;

static void *poll_main(void *arg) {
    poller *p = arg;
    while (!*p->stop) {
        double t0 = now_s();
        if (http(p->port, "GET", p->path, "", 0, NULL, &p->bytes) != 200) break;
        p->t_sum += now_s() - t0;
        p->lists++;
        for (long w = 0; w < p->pause_ms && !*p->stop; w += 10) usleep(10000);
    }
    return NULL;
}

typedef struct loader {
    int port;
    const char *path, *body;
    size_t len;
    int status;
    size_t got;
} loader;

static void *load_main(void *arg) {
    loader *l = arg;
    l->status = http(l->port, "POST", l->path, l->body, l->len, NULL, &l->got);
    return NULL;
}

/* n parallel POSTs of the same body; how many answered 200, bytes of the first. */
static int parallel(int port, int n, const char *path, const char *body, size_t len, size_t *bytes) {
    loader l[16];
    pthread_t th[16];
    int ok = 0;
    for (int i = 0; i < n; i++) {
        l[i] = (loader){port, path, body, len, 0, 0};
        pthread_create(&th[i], NULL, load_main, &l[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        ok += l[i].status == 200;
    }
    *bytes = l[0].got;
    return ok;
}

static double completion_ms(int port, long long max_tokens) {
    char req[160];
    int n = snprintf(req, sizeof req, "{\"prompt\": \"the cache of the model\", \"max_tokens\": %lld, \"temperature\": 0}",
                     max_tokens);
    double t0 = now_s();
    if (http(port, "POST", "/v1/completions", req, (size_t)n, NULL, NULL) != 200) return -1;
    return (now_s() - t0) * 1e3;
}

/* What `pagekv bench server` was asked (the options table below fills it). */
typedef struct bsrv_opts {
    const char *model, *poll_path, *serve_with;
    long long ctx_tokens, forks, pollers, runs, n_ctx, poll_ms, max_tokens;
    bool memory, help;
} bsrv_opts;

#define BSRV_OPT(...) PKV_CLI_OPT(bsrv_opts, __VA_ARGS__)
static const pkv_cli_opt bsrv_options[] = {
    BSRV_OPT("-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    BSRV_OPT("-m", "--model", PKV_CLI_STR, model, 0, 0),
    BSRV_OPT("--ctx-tokens", NULL, PKV_CLI_LLONG, ctx_tokens, 2, 1 << 20),
    BSRV_OPT("--forks", NULL, PKV_CLI_LLONG, forks, 0, 100000),
    BSRV_OPT("--pollers", NULL, PKV_CLI_LLONG, pollers, 0, 64),
    BSRV_OPT("--poll-path", NULL, PKV_CLI_STR, poll_path, 0, 0),
    BSRV_OPT("--poll-ms", NULL, PKV_CLI_LLONG, poll_ms, 0, 60000),
    BSRV_OPT("--max-tokens", NULL, PKV_CLI_LLONG, max_tokens, 1, 100000),
    BSRV_OPT("--runs", NULL, PKV_CLI_LLONG, runs, 1, 1000),
    BSRV_OPT("-c", NULL, PKV_CLI_LLONG, n_ctx, 16, 1 << 20),
    BSRV_OPT("--serve-with", NULL, PKV_CLI_STR, serve_with, 0, 0),
    BSRV_OPT("--no-memory", NULL, PKV_CLI_UNSET, memory, 0, 0),
};
#undef BSRV_OPT
static const pkv_cli_cmd bsrv_cmd = {"bench server", bsrv_options, sizeof bsrv_options / sizeof bsrv_options[0],
                                     offsetof(bsrv_opts, help), usage, NULL, true, false, 0};

/* Fill b from argv: -1 to go on, else the exit code. */
static int bsrv_parse(int argc, char **argv, bsrv_opts *b) {
    *b = (bsrv_opts){.poll_path = "/v1/contexts", .ctx_tokens = 1800, .forks = 256, .pollers = 2, .runs = 5,
                     .n_ctx = 2048, .max_tokens = 20, .memory = true};
    int rc = pkv_cli_parse(&bsrv_cmd, argc, argv, b);
    if (rc >= 0) return rc;
    if (b->poll_path[0] != '/' || strpbrk(b->poll_path, "\"\\ ")) {
        fprintf(stderr, "pagekv bench server: --poll-path must be a path such as /v1/kv\n");
        return 2;
    }
    if (b->ctx_tokens >= b->n_ctx) {
        fprintf(stderr, "pagekv bench server: --ctx-tokens %lld does not fit -c %lld\n", b->ctx_tokens, b->n_ctx);
        return 2;
    }
    return -1;
}

/* Start `pagekv serve` (this binary, or --serve-with) on a free port: its pid
 * (0 when it could not be started: said) and the port in *port (0 when it did
 * not come up: said). */
static pid_t bsrv_start(const bsrv_opts *b, int *port) {
    char pf[64], self[4096];
    *port = 0;
    snprintf(pf, sizeof pf, "/tmp/pagekv-bench-%d.port", (int)getpid());
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "pagekv bench server: cannot find this program (/proc/self/exe)\n");
        return 0;
    }
    self[sl] = 0;
    if (b->serve_with) snprintf(self, sizeof self, "%s", b->serve_with);
    unlink(pf);
    char cc[32], par[32];
    snprintf(cc, sizeof cc, "%lld", b->n_ctx);
    snprintf(par, sizeof par, "%d", 16);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 1);
        char *args[24] = {self, "serve", "--port", "0", "--port-file", pf, "-c", cc, "--parallel", par,
                          "--max-contexts", "100000", "--chat-template", "chatml", "--context-pages", "1000000", NULL};
        int k = b->serve_with ? 14 : 16; /* a binary from before --context-pages: without it */
        if (b->model) args[k++] = "-m", args[k++] = (char *)b->model;
        args[k] = NULL;
        execv(self, args);
        _exit(127);
    }
    if (pid < 0) return 0;
    for (int i = 0; i < 1200 && *port <= 0; i++) {
        FILE *f = fopen(pf, "r");
        if (f) {
            if (fscanf(f, "%d", port) != 1) *port = 0;
            fclose(f);
        }
        int st;
        if (*port <= 0 && waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "pagekv bench server: the server exited (%d) before listening\n", WEXITSTATUS(st));
            return 0;
        }
        if (*port <= 0) usleep(50000);
    }
    unlink(pf);
    if (*port <= 0) fprintf(stderr, "pagekv bench server: the server did not come up in 60 s\n");
    return pid;
}

/* SIGTERM, a minute to exit, then SIGKILL. */
static void bsrv_stop(pid_t pid) {
    kill(pid, SIGTERM);
    int wst;
    for (int i = 0; i < 600; i++) {
        if (waitpid(pid, &wst, WNOHANG) == pid) return;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &wst, 0);
}

/* The long context and its forks: create and fork times in ms (each fork's
 * average); false (said) when the server refused. */
static bool bsrv_contexts(const bsrv_opts *b, int port, double *create_ms, double *fork_ms) {
    size_t cap = (size_t)b->ctx_tokens * 8 + 64, at = 0;
    char *body = malloc(cap);
    at += (size_t)snprintf(body, cap, "{\"tokens\": [");
    for (long long i = 0; i < b->ctx_tokens; i++)
        at += (size_t)snprintf(body + at, cap - at, "%s%lld", i ? "," : "", 260 + (i * 37) % 240);
    at += (size_t)snprintf(body + at, cap - at, "]}");
    double t0 = now_s();
    int st = http(port, "POST", "/v1/contexts", body, at, NULL, NULL);
    *create_ms = (now_s() - t0) * 1e3;
    free(body);
    if (st != 200) {
        fprintf(stderr, "pagekv bench server: creating the context answered %d\n", st);
        return false;
    }
    t0 = now_s();
    for (long long i = 0; i < b->forks; i++)
        if ((st = http(port, "POST", "/v1/contexts/ctx-1/fork", "", 0, NULL, NULL)) != 200) {
            fprintf(stderr, "pagekv bench server: fork %lld answered %d\n", i, st);
            return false;
        }
    *fork_ms = (now_s() - t0) * 1e3 / (double)(b->forks ? b->forks : 1);
    return true;
}

/* Completion latency alone and while polled, and the poll's own latency. */
typedef struct bsrv_polled {
    double list_alone, alone, polled; /* medians, ms */
    long lists;                       /* polls while timed */
    double list_sum, polled_s;        /* their total seconds; seconds timed */
    size_t poll_bytes;
} bsrv_polled;

static void bsrv_poll(const bsrv_opts *b, int port, double *t, double *ta, bsrv_polled *p) {
    int runs = (int)b->runs;
    for (int i = 0; i < runs; i++) {
        double t0 = now_s();
        http(port, "GET", b->poll_path, "", 0, NULL, NULL);
        t[i] = (now_s() - t0) * 1e3;
    }
    p->list_alone = median(t, runs);
    /* alone and polled alternate, run by run, so a machine whose load drifts
     * (other processes) weighs on both the same; the pollers start 100 ms
     * before each polled run and stop after it */
    volatile bool stop = false;
    poller pl[64];
    pthread_t pth[64];
    for (int r = 0; r < runs; r++) {
        usleep(100000); /* as before a polled run */
        ta[r] = completion_ms(port, b->max_tokens);
        stop = false;
        for (int i = 0; i < b->pollers; i++) {
            pl[i] = (poller){port, &stop, 0, 0, b->poll_path, (long)b->poll_ms, 0};
            pthread_create(&pth[i], NULL, poll_main, &pl[i]);
        }
        usleep(100000);
        double tp0 = now_s();
        t[r] = completion_ms(port, b->max_tokens);
        p->polled_s += now_s() - tp0;
        stop = true;
        for (int i = 0; i < b->pollers; i++) {
            pthread_join(pth[i], NULL);
            p->lists += pl[i].lists;
            p->list_sum += pl[i].t_sum;
            p->poll_bytes = pl[i].bytes;
        }
    }
    p->alone = median(ta, runs);
    p->polled = median(t, runs);
}

/* The server's peak RSS under 8 parallel logprobs chats, then 8 parallel
 * /tokenize of 1 MB: the "memory" member. */
static void bsrv_memory(int port, pid_t pid, long hwm_start) {
    /* chats with n = 4, logprobs and 20 alternatives per token (the whole context), 8 at once */
    static const char lp[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"tell me a long story\"}], "
                             "\"n\": 4, \"logprobs\": true, \"top_logprobs\": 20, \"temperature\": 0, "
                             "\"ignore_eos\": true}";
    size_t tok_bytes = 0, lp_bytes = 0;
    int lp_ok = parallel(port, 8, "/v1/chat/completions", lp, sizeof lp - 1, &lp_bytes);
    long hwm_lp = hwm_kib(pid);
    /* ~1 MB of 'é' (under the default 1 MiB body limit) with pieces, 8 at once */
    size_t n = 1000000;
    char *big = malloc(n + 64);
    size_t bl = (size_t)sprintf(big, "{\"content\": \"");
    for (size_t i = 0; i < n / 2; i++) big[bl++] = '\xc3', big[bl++] = '\xa9';
    bl += (size_t)sprintf(big + bl, "\", \"with_pieces\": true}");
    int tok_ok = parallel(port, 8, "/tokenize", big, bl, &tok_bytes);
    free(big);
    long hwm_tok = hwm_kib(pid);
    printf(",\n  \"memory\": {\"peak_rss_kib_start\": %ld, \"logprobs_parallel\": 8, \"logprobs_ok\": %d, "
           "\"logprobs_answer_bytes\": %zu, \"peak_rss_kib_after_logprobs\": %ld, \"tokenize_parallel\": 8, "
           "\"tokenize_ok\": %d, \"tokenize_answer_bytes\": %zu, \"peak_rss_kib_after_tokenize\": %ld}",
           hwm_start, lp_ok, lp_bytes, hwm_lp, tok_ok, tok_bytes, hwm_tok);
}

/* Everything measured against the running server; the exit code. */
static int bsrv_measure(const bsrv_opts *b, int port, pid_t pid) {
    long hwm_start = hwm_kib(pid);
    fprintf(stderr, "pagekv bench server: serving on 127.0.0.1:%d; a %lld-token context and %lld forks\n", port,
            b->ctx_tokens, b->forks);
    double create_ms, fork_ms;
    if (!bsrv_contexts(b, port, &create_ms, &fork_ms)) return 1;
    double *t = calloc((size_t)b->runs, sizeof *t), *ta = calloc((size_t)b->runs, sizeof *ta);
    bsrv_polled p = {0};
    bsrv_poll(b, port, t, ta, &p);
    free(ta);
    free(t);
    printf("{\n  \"server\": {\"port\": %d, \"model\": \"%s\", \"n_ctx\": %lld},\n", port, b->model ? b->model : "built-in",
           b->n_ctx);
    printf("  \"contexts\": {\"ctx_tokens\": %lld, \"forks\": %lld, \"create_ms\": %.2f, \"fork_ms_each\": %.3f, "
           "\"completion_tokens\": %lld, \"completion_ms_alone\": %.2f, \"completion_ms_while_polled\": %.2f, "
           "\"pollers\": %lld, \"poll_path\": \"%s\", \"poll_ms\": %lld, \"poll_bytes\": %zu, "
           "\"lists_while_timed\": %ld, \"lists_per_s\": %.1f, \"list_ms_alone\": %.2f, \"list_ms_while_polled\": %.2f}",
           b->ctx_tokens, b->forks, create_ms, fork_ms, b->max_tokens, p.alone, p.polled, b->pollers, b->poll_path,
           b->poll_ms, p.poll_bytes, p.lists, p.lists / (p.polled_s > 0 ? p.polled_s : 1), p.list_alone,
           p.lists ? p.list_sum * 1e3 / (double)p.lists : 0.0);
    if (b->memory) bsrv_memory(port, pid, hwm_start);
    printf("\n}\n");
    return 0;
}

int pkv_cli_bench_server(int argc, char **argv) {
    bsrv_opts b;
    int rc = bsrv_parse(argc, argv, &b), port;
    if (rc >= 0) return rc;
    pid_t pid = bsrv_start(&b, &port);
    if (!pid) return 1;
    rc = port > 0 ? bsrv_measure(&b, port, pid) : 1;
    bsrv_stop(pid);
    return rc;
}
