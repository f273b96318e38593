// labels: model dist timeout=240
/* A model over MPI ranks (docs/distributed.md): the same program of KV operations
 * and decodes (prompt, greedy steps, fork and copy-on-write, truncate, shift, swap
 * out and in, save and load, a prefix hit) run in this process and under
 * `mpirun -np 2` and `-np 3`, whose rank 0 writes every logits row it saw: the rows
 * must be bit-identical (the ranks run the same kernels on the same rows). Models:
 * llama, gemma3 (sliding-window layers), qwen35 (recurrent layers). Then the
 * failures: ranks given different model files are refused naming the rank; a rank
 * that stops answering fails rank 0's step naming it within PKV_DIST_TIMEOUT; a
 * rank killed ends the run (Open MPI ends the job) well within a bound.
 * Skips, saying so, where mpirun (openmpi-bin) or MPI in the build is missing. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "pagekv.h"
#include "testhelp.h"

#define PROMPT 40

/* Rank 0 (or the process alone) writes each row; the other ranks only compute. */
static FILE *g_out;
static int g_rows;
static int64_t g_hit; /* tokens the prefix hit shared */

static void put(const float *lg, int n_vocab) {
    g_rows++;
    if (g_out && lg) fwrite(lg, sizeof *lg, (size_t)n_vocab, g_out);
}

static int32_t argmax(const float *lg, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (lg[i] > lg[best]) best = i;
    return best;
}

/* n greedy tokens on ctx, each row written. */
static pkv_status greedy(pkv_context *ctx, int n, int V) {
    pkv_status s = PKV_OK;
    for (int i = 0; i < n && !s; i++) {
        int32_t t = argmax(pkv_context_logits(ctx), V);
        if (!(s = pkv_context_decode(ctx, &t, 1))) put(pkv_context_logits(ctx), V);
    }
    return s;
}

#define GO(x)                                                                                                           \
    do {                                                                                                                \
        if ((s = (x))) {                                                                                                \
            fprintf(stderr, "rank %d: %s: %s\n", pkv_dist_rank(), #x, pkv_errmsg());                                  \
            goto out;                                                                                                   \
        }                                                                                                               \
    } while (0)

/* The program every rank runs. stall: rank 1 stops (SIGSTOP) or dies (SIGKILL)
 * before the first decode. */
static int program(const char *model, const char *tmp, int stall) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 1;
    pkv_model *m = pkv_model_load(model, mp);
    if (!m) {
        fprintf(stderr, "rank %d: load: %s\n", pkv_dist_rank(), pkv_errmsg());
        return 3;
    }
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    const int V = info.n_vocab;
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    cp.n_seq_max = 4;
    cp.page_size = 8;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *a = NULL, *b = NULL, *l = NULL, *h = NULL;
    pkv_status s = c ? PKV_OK : PKV_ERR_NOMEM;
    int32_t prompt[PROMPT], seq = 0;
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 37 + 11) % (V - 8));
    char path[1024];
    snprintf(path, sizeof path, "%s.rank%d", tmp, pkv_dist_rank()); /* each rank saves its own layers */
    GO(c ? PKV_OK : PKV_ERR_NOMEM);
    if (!strcmp(info.arch, "llama")) { /* each rank stores K/V of its own layers only (f16, page of 8) */
        pkv_kv_stats ks;
        pkv_kv_stats_get(c, &ks);
        size_t want = (size_t)(info.layer_end - info.layer_first) * 8 * (size_t)info.n_head_kv * (size_t)info.head_dim * 2 * 2;
        if (ks.page_bytes != want) {
            fprintf(stderr, "rank %d: a page takes %zu bytes, %zu expected for layers [%d, %d)\n", pkv_dist_rank(),
                    ks.page_bytes, want, info.layer_first, info.layer_end);
            s = PKV_ERR_INTERNAL;
            goto out;
        }
    }
    GO((a = pkv_context_create(m, c, 0)) ? PKV_OK : PKV_ERR_NOMEM);
    if (stall && pkv_dist_rank() == 1) raise(stall);
    GO(pkv_context_decode(a, prompt, PROMPT));
    put(pkv_context_logits(a), V);
    GO(greedy(a, 4, V));
    /* fork: both go on from the shared pages, each with its own tokens (copy-on-write) */
    GO((b = pkv_context_fork(a)) ? PKV_OK : PKV_ERR_NOMEM);
    int32_t tb = 7;
    GO(pkv_context_decode(b, &tb, 1));
    put(pkv_context_logits(b), V);
    GO(greedy(a, 3, V));
    GO(greedy(b, 3, V));
    GO(pkv_context_truncate(a, 21)); /* inside a page */
    GO(pkv_context_decode(a, &prompt[21], 1));
    put(pkv_context_logits(a), V);
    GO(greedy(a, 3, V));
    GO(pkv_context_shift(b, 4, 10));
    GO(pkv_context_decode(b, &tb, 1));
    put(pkv_context_logits(b), V);
    GO(greedy(b, 2, V));
    GO(pkv_context_swap_out(b));
    GO(pkv_context_swap_in(b));
    GO(greedy(b, 2, V));
    GO(pkv_context_save(a, path));
    GO((l = pkv_context_load(m, c, path, 0)) ? PKV_OK : PKV_ERR_IO);
    put(pkv_context_logits(l), V);
    GO(greedy(l, 2, V));
    /* a prefix hit: the prompt's full pages (published by a) shared, the rest computed */
    GO((h = pkv_context_create(m, c, 0)) ? PKV_OK : PKV_ERR_NOMEM);
    int64_t hit = 0;
    seq = pkv_context_seq(h);
    GO(pkv_kv_prefix_match(c, seq, prompt, NULL, PROMPT - 1, &hit));
    g_hit = hit;
    GO(pkv_context_decode(h, prompt + hit, (int32_t)(PROMPT - hit)));
    put(pkv_context_logits(h), V);
    GO(greedy(h, 2, V));
out:
    pkv_context_free(h);
    pkv_context_free(l);
    pkv_context_free(b);
    pkv_context_free(a);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    remove(path);
    return s ? 1 : 0;
}

/* Under mpirun: argv = --rank MODEL TMP OUT STALL; MODEL may be "A|B" (rank 0
 * loads A, the others B). */
static int rank_main(char **argv) {
    if (pkv_dist_init()) {
        fprintf(stderr, "SKIP: %s\n", pkv_errmsg());
        return 77;
    }
    if (pkv_dist_size() < 2) {
        fprintf(stderr, "SKIP: started as one rank: this pagekv has no MPI (libopenmpi-dev)\n");
        pkv_dist_finalize(0);
        return 77;
    }
    char model[1024];
    snprintf(model, sizeof model, "%s", argv[2]);
    char *bar = strchr(model, '|');
    if (bar) *bar = 0;
    const char *mine = bar && pkv_dist_rank() > 0 ? bar + 1 : model;
    if (pkv_dist_rank() == 0 && !(g_out = fopen(argv[4], "wb"))) return 2;
    int rc = program(mine, argv[3], atoi(argv[5]));
    if (g_out) fclose(g_out);
    pkv_dist_finalize(rc);
    return rc;
}

/* Run `mpirun -np n` of this program within `limit` seconds; its exit status, its
 * output in log. */
static int launch(int n, const char *model, const char *out, int stall, int limit, const char *log, double *secs) {
    char self[1024], cmd[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) return -1;
    self[k] = 0;
    const char *tmp = getenv("PKV_TEST_TMP") ? getenv("PKV_TEST_TMP") : "/tmp";
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d mpirun --oversubscribe --bind-to none -np %d '%s' --rank '%s' '%s/dist-kv' '%s' %d > '%s' 2>&1",
             limit, n, self, model, tmp, out, stall, log);
    double t0 = pkv_time_now();
    int st = system(cmd);
    *secs = pkv_time_now() - t0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = calloc(1, (size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) p[0] = 0;
    fclose(f);
    return p;
}

static bool same_file(const char *a, const char *b, long *len) {
    char *x = slurp(a), *y = slurp(b);
    FILE *f = fopen(a, "rb");
    *len = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        *len = ftell(f);
        fclose(f);
    }
    FILE *g = fopen(b, "rb");
    long lb = -1;
    if (g) {
        fseek(g, 0, SEEK_END);
        lb = ftell(g);
        fclose(g);
    }
    bool eq = x && y && *len == lb && *len > 0 && !memcmp(x, y, (size_t)*len);
    free(x);
    free(y);
    return eq;
}

/* The CLI under mpirun: greedy `run` text and `logits -o` equal one process's;
 * `demo` is refused naming the ranks (serve runs: test-server-dist). */
static void cli_checks(const char *model, const char *tmp, const char *log) {
    const char *cli = getenv("PKV_CLI");
    if (!cli) {
        fprintf(stderr, "PKV_CLI not set (run through ctest): the CLI checks are skipped\n");
        return;
    }
    for (int k = 0; k < 2; k++) {
        char out[2][1024], cmd[8192];
        for (int np = 1; np <= 2; np++) {
            char *o = out[np - 1];
            snprintf(o, sizeof out[0], "%s/dist-cli%d.out", tmp, np);
            const char *mpi = np > 1 ? "timeout -k 5 60 mpirun --oversubscribe --bind-to none -np 2 " : "";
            if (k == 0) /* greedy text on stdout */
                snprintf(cmd, sizeof cmd, "%s'%s' run -m '%s' -p 'Once upon a time' -n 24 --temp 0 -t 1 > '%s' 2> '%s'", mpi,
                         cli, model, o, log);
            else /* logits into a file */
                snprintf(cmd, sizeof cmd, "%s'%s' logits -m '%s' --tokens 5,9,22,100,3,7,8,9,10,11 -t 1 -o '%s' > '%s' 2>&1",
                         mpi, cli, model, o, log);
            remove(o);
            int rc = system(cmd);
            if (rc) {
                char *l = slurp(log);
                fprintf(stderr, "%s: exit %d\n%s", cmd, rc, l ? l : "");
                free(l);
            }
            CHECK(rc == 0);
        }
        long len;
        bool eq = same_file(out[0], out[1], &len);
        CHECK(eq);
        fprintf(stderr, "pagekv %s under 2 ranks: %ld bytes, %s one process's\n", k ? "logits -o" : "run (greedy text)", len,
                eq ? "equal to" : "NOT equal to");
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 mpirun --oversubscribe -np 2 '%s' demo -m '%s' > '%s' 2>&1", cli, model, log);
    int rc = system(cmd);
    char *l = slurp(log);
    CHECK(rc != 0 && l && strstr(l, "pagekv demo: not supported under 2 MPI ranks"));
    free(l);
}

int main(int argc, char **argv) {
    if (argc > 5 && !strcmp(argv[1], "--rank")) return rank_main(argv);
#ifndef PKV_TEST_HAVE_MPI
    return th_skip("this pagekv was built without MPI (libopenmpi-dev)");
#endif
    if (system("command -v mpirun > /dev/null 2>&1")) return th_skip("mpirun not found (Debian's openmpi-bin)");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1); /* CI runs as root */
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    const char *tmp = getenv("PKV_TEST_TMP") ? getenv("PKV_TEST_TMP") : "/tmp";
    static const struct {
        const char *arch;
        int layers;
    } models[] = {{"llama", 4}, {"gemma3", 6}, {"qwen35", 4}};
    char path[3][1024], ref[1024], out[1024], log[1024];
    snprintf(log, sizeof log, "%s/dist.log", tmp);
    for (int i = 0; i < 3; i++) {
        pkv_mkmodel_params p = pkv_mkmodel_default_params();
        p.arch = models[i].arch;
        p.n_layer = models[i].layers;
        p.seed = 100 + (uint64_t)i;
        snprintf(path[i], sizeof path[i], "%s/dist-%s.gguf", tmp, models[i].arch);
        CHECK(pkv_mkmodel_write(&p, path[i]) == PKV_OK);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(ref, sizeof ref, "%s/dist-%s.ref", tmp, models[i].arch);
        g_out = fopen(ref, "wb");
        CHECK(g_out != NULL);
        g_rows = 0;
        char kv[1024];
        snprintf(kv, sizeof kv, "%s/dist-kv", tmp);
        CHECK(program(path[i], kv, 0) == 0);
        fclose(g_out);
        g_out = NULL;
        CHECK_INT(g_rows, 27);
        if (i < 2) CHECK(g_hit >= 32); /* the recurrent model keeps no state at those page boundaries */
        for (int n = 2; n <= 3; n++) {
            snprintf(out, sizeof out, "%s/dist-%s.np%d", tmp, models[i].arch, n);
            remove(out);
            double secs;
            int rc = launch(n, path[i], out, 0, 60, log, &secs);
            if (rc == 77) {
                char *l = slurp(log);
                fprintf(stderr, "%s", l ? l : "");
                free(l);
                return th_skip("this pagekv was built without MPI (libopenmpi-dev)");
            }
            long len;
            bool eq = same_file(ref, out, &len);
            if (rc || !eq) {
                char *l = slurp(log);
                fprintf(stderr, "%s -np %d: exit %d\n%s", models[i].arch, n, rc, l ? l : "");
                free(l);
            }
            CHECK(rc == 0);
            CHECK(eq);
            fprintf(stderr, "%s over %d ranks: %ld bytes of logits (27 rows) equal to one process (%.1f s)\n",
                    models[i].arch, n, len, secs);
        }
    }
    cli_checks(path[1], tmp, log);
    /* different files on different ranks: refused at load, naming the rank */
    {
        char two[2100];
        snprintf(two, sizeof two, "%s|%s", path[0], path[2]);
        double secs;
        int rc = launch(2, two, out, 0, 60, log, &secs);
        char *l = slurp(log);
        CHECK(rc != 0 && l && strstr(l, "rank 1 loaded a different model"));
        if (l && !strstr(l, "rank 1 loaded a different model")) fprintf(stderr, "%s", l);
        free(l);
    }
    /* rank 1 stops answering: rank 0 fails the step naming it (the timeout), then
     * aborts the job */
    {
        setenv("PKV_DIST_TIMEOUT", "3", 1);
        double secs;
        int rc = launch(2, path[0], out, SIGSTOP, 60, log, &secs);
        char *l = slurp(log);
        bool named = l && strstr(l, "rank 1: no answer within 3 s");
        if (!named) fprintf(stderr, "%s", l ? l : "");
        CHECK(rc != 0 && rc != 124 && named);
        fprintf(stderr, "a stopped rank: exit %d after %.1f s\n", rc, secs);
        free(l);
        unsetenv("PKV_DIST_TIMEOUT");
    }
    /* rank 1 killed: the job ends, naming it (Open MPI's report), well within the bound */
    {
        double secs;
        int rc = launch(2, path[0], out, SIGKILL, 60, log, &secs);
        char *l = slurp(log);
        bool named = l && strstr(l, "process rank 1");
        if (!named) fprintf(stderr, "%s", l ? l : "");
        CHECK(rc != 0 && rc != 124 && named && secs < 30);
        fprintf(stderr, "a killed rank: exit %d after %.1f s\n", rc, secs);
        free(l);
    }
    return th_done();
}
