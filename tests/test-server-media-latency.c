// labels: media timeout=180
/* Media encoding shares the worker with other requests (issues 43.5 and 50.5):
 * pagekv serve --mmproj on mkmodel's random-weight Voxtral pair, one request with
 * 600 s of audio (20 encoder windows, about a second of work on the CPU) and
 * max_tokens 2 (--media-cache-mb 0: each time encoded).
 *   - a 4-token completion sent once that request's encoding has started (its
 *     media-cache miss is counted just before) answers in under a third of the
 *     big request's time, and with the same text as when served alone (before:
 *     it waited for the whole medium's encoding);
 *   - a FLAC whose header claims 30 minutes (18000 rows) is refused at once
 *     saying the context holds 16384 (the projector's rows from the header);
 *   - the same big request from a client that resets its connection once the
 *     encoding has started is given up: pagekv_client_disconnects_total counts it
 *     in under a third of the encoding's time (before: the encoding ran on).
 * Skipped (77) where mkmodel cannot write the pair. Not under ASan (labels):
 * the encoder's seconds would be minutes there. */
#include "testhelp.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include "server-testlib.h"

#define SECONDS 600

static int g_port;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static long long metric(const char *name) {
    if (ts_http(g_port, "/metrics") != 200) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(ts_body, key);
    return p ? atoll(p + strlen(key)) : -1;
}

/* Poll name until it reaches want (at most max_s seconds): the seconds it took, or -1. */
static double wait_metric(const char *name, long long want, double max_s) {
    const double t0 = now_s();
    while (now_s() - t0 < max_s) {
        if (metric(name) >= want) return now_s() - t0;
        ts_sleep_ms(5);
    }
    return -1;
}

/* The chat body with one input_audio part: a 16-bit 16 kHz WAV of SECONDS, base64. */
static char *big_body(void) {
    const int n = SECONDS * 16000;
    const size_t len = 44 + (size_t)n * 2;
    uint8_t *w = malloc(len);
    const uint32_t data = (uint32_t)n * 2, riff = 36 + data, rate = 16000, br = 32000, sixteen = 16;
    const uint16_t one = 1, ba = 2, bits = 16;
    memcpy(w, "RIFF", 4), memcpy(w + 4, &riff, 4), memcpy(w + 8, "WAVEfmt ", 8), memcpy(w + 16, &sixteen, 4);
    memcpy(w + 20, &one, 2), memcpy(w + 22, &one, 2), memcpy(w + 24, &rate, 4), memcpy(w + 28, &br, 4);
    memcpy(w + 32, &ba, 2), memcpy(w + 34, &bits, 2), memcpy(w + 36, "data", 4), memcpy(w + 40, &data, 4);
    uint64_t seed = 7;
    for (int i = 0; i < n; i++) {
        int16_t v = (int16_t)lrint(8000 * sin(2 * M_PI * 330 * i / 16000.0) + 3000 * th_randf(&seed));
        memcpy(w + 44 + 2 * (size_t)i, &v, 2);
    }
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *b = malloc(len / 3 * 4 + 512);
    size_t k = (size_t)sprintf(b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"},"
                                  "{\"type\":\"input_audio\",\"input_audio\":{\"format\":\"wav\",\"data\":\"");
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)w[i] << 16 | (i + 1 < len ? (uint32_t)w[i + 1] << 8 : 0) | (i + 2 < len ? w[i + 2] : 0);
        b[k++] = a[v >> 18 & 63], b[k++] = a[v >> 12 & 63];
        b[k++] = i + 1 < len ? a[v >> 6 & 63] : '=';
        b[k++] = i + 2 < len ? a[v & 63] : '=';
    }
    strcpy(b + k, "\"}}]}],\"max_tokens\":2}");
    free(w);
    return b;
}

static const char *k_small = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}],\"max_tokens\":4,"
                             "\"temperature\":0}";

/* The small request: its status, its text in out, its time in *dt. */
static int small(char *out, size_t cap, double *dt) {
    const char *f = ts_file("lat-small.json", k_small, strlen(k_small));
    const double t0 = now_s();
    int code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s /v1/chat/completions", f);
    *dt = now_s() - t0;
    const char *c = strstr(ts_body, "\"content\"");
    snprintf(out, cap, "%.*s", c ? 200 : 0, c ? c : "");
    char *q = strstr(out, "\"}");
    if (q) *q = 0;
    return code;
}

/* A raw client: connect, send the whole request. The socket, or -1. */
static int send_raw(const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) return fd >= 0 ? close(fd), -1 : -1;
    char hdr[256];
    const size_t bl = strlen(body);
    int hl = snprintf(hdr, sizeof hdr, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                      "application/json\r\nContent-Length: %zu\r\n\r\n", g_port, bl);
    if (write(fd, hdr, (size_t)hl) != hl) return close(fd), -1;
    for (size_t off = 0; off < bl;) {
        ssize_t k = write(fd, body + off, bl - off);
        if (k <= 0) return close(fd), -1;
        off += (size_t)k;
    }
    return fd;
}

int main(void) {
    char model[512], proj[512], log[512], args[2048];
    snprintf(model, sizeof model, "%s", th_tmp("lat-voxtral.gguf"));
    snprintf(proj, sizeof proj, "%s", th_tmp("lat-voxtral-mmproj.gguf"));
    if (th_cli("", true, "mkmodel --arch voxtral -o '%s' --mmproj-out '%s'", model, proj) != 0)
        return th_skip("this build's mkmodel cannot write a Voxtral pair");
    snprintf(log, sizeof log, "%s", th_tmp("lat-serve.log"));
    snprintf(args, sizeof args, "-m '%s' --mmproj '%s' -c 16384 --media-cache-mb 0 --max-media-bytes 40000000", model,
             proj);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    char alone[256], during[256];
    double t_alone, t_during;
    CHECK_INT(small(alone, sizeof alone, &t_alone), 200);
    CHECK(alone[0] != 0);
    { /* a FLAC whose header says 30 minutes: 48 windows of 375 rows, more than the context, refused from its
       * header (a 42-byte file: before, the decoder's "truncated FLAC") */
        static const char *flac = "ZkxhQ4AAACIQABAAAAAAAAAAA+gA8AG3dAAAAAAAAAAAAAAAAAAAAAAA"; /* 16 kHz, 28800000 */
        char body[512];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\","
                 "\"input_audio\":{\"format\":\"flac\",\"data\":\"%s\"}}]}]}", flac);
        const char *f = ts_file("lat-flac.json", body, strlen(body));
        const double t0 = now_s();
        CHECK_INT(ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s /v1/chat/completions", f), 400);
        CHECK(strstr(ts_body, "the context holds 16384") != NULL);
        th_checks++;
        if (now_s() - t0 > 1.0) TH_FAIL("the 30-minute FLAC took %.3f s to refuse", now_s() - t0);
    }
    char *big = big_body();
    const char *bf = ts_file("lat-big.json", big, strlen(big));

    /* 1. a small request while the big one is encoded */
    const double t0 = now_s();
    pid_t child = fork();
    if (child == 0) {
        int code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s /v1/chat/completions", bf);
        _exit(code == 200 ? 0 : 1);
    }
    REQUIRE(child > 0);
    CHECK(wait_metric("pagekv_media_cache_misses_total", 1, 60) >= 0);
    CHECK_INT(small(during, sizeof during, &t_during), 200);
    int st = 0;
    waitpid(child, &st, 0);
    const double t_big = now_s() - t0;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(!strcmp(alone, during));
    fprintf(stderr, "small request alone %.3f s, during the %d s medium %.3f s; the medium's request %.3f s\n",
            t_alone, SECONDS, t_during, t_big);
    th_checks++;
    if (!(t_during < t_big / 3)) TH_FAIL("the small request took %.3f s during a %.3f s media request", t_during, t_big);

    /* 2. the big one again from a client that resets the connection once its encoding started */
    long long disc0 = metric("pagekv_client_disconnects_total");
    int fd = send_raw(big);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(wait_metric("pagekv_media_cache_misses_total", 2, 60) >= 0);
        struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* close sends RST */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(fd);
        const double t_gone = wait_metric("pagekv_client_disconnects_total", disc0 + 1, 60);
        fprintf(stderr, "a reset client's media request given up after %.3f s (the whole request: %.3f s)\n", t_gone,
                t_big);
        th_checks++;
        if (!(t_gone >= 0 && t_gone < t_big / 3)) TH_FAIL("the disconnect was seen after %.3f s", t_gone);
        CHECK_INT(small(during, sizeof during, &t_during), 200); /* the server goes on */
        CHECK(!strcmp(alone, during));
    }
    free(big);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
