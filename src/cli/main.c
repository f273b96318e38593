/* The pagekv command: dispatches to one subcommand per file (cmd-*.c). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pagekv.h"
#ifdef PKV_HAVE_SERVER
#include "setup/serve.h"
#endif

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command k_commands[] = {
    {"devices", pkv_cli_devices, "list the devices pagekv can use"},
    {"check", pkv_cli_check, "run the device conformance suite (transfers, cross-device copies, kernels)"},
    {"run", pkv_cli_run, "generate text from a prompt (streams tokens; --fork K for branches)"},
    {"logits", pkv_cli_logits, "last-position logits of a list of token ids (JSON or float32 file)"},
    {"tokenize", pkv_cli_tokenize, "token ids (and pieces) of a text"},
    {"mkmodel", pkv_cli_mkmodel, "write a GGUF test model with random weights"},
    {"demo", pkv_cli_demo, "every KV operation on every device, checked against replay"},
    {"bench", pkv_cli_bench, "measure speed: bench kv | model | spec | serve | server | all | kv-accuracy | kv-speed | grammar"},
    {"serve", pkv_cli_serve, "OpenAI-compatible HTTP server with a contexts API (docs/server.md)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: pagekv <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(f, "\n'pagekv <command> --help' describes each command; 'pagekv --version' the build.\n");
}

/* A command's exit code, or 1 when what it printed could not be written (a full
 * disk, a closed pipe): output that did not arrive is a failure. */
static int finish(int rc) {
    /* Under PKV_VK_VALIDATE=1 a command that made the validation layer speak
     * fails (the tests that run the CLI rely on it). */
    char vmsg[1024];
    int64_t nv = pkv_vulkan_validation_messages(vmsg, sizeof vmsg);
    if (nv > 0) {
        fprintf(stderr, "pagekv: the Vulkan validation layer reported %lld message(s); the first: %s\n",
                (long long)nv, vmsg);
        if (!rc) rc = 1;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "pagekv: writing to standard output failed: %s\n", strerror(errno ? errno : EIO));
        return rc ? rc : 1;
    }
    return rc;
}

/* Under mpirun (docs/distributed.md): every rank runs the same command on the
 * same arguments, each model split over the ranks; rank 0 alone prints. The
 * commands that load a model to run it are the ones that may run so. 0: go on. */
static int g_stderr = -1; /* a rank > 0's own stderr, kept while its messages are silenced */
#define PKV_CLI_MIN(a, b) ((a) < (b) ? (a) : (b))

static int start_ranks(int argc, char **argv) {
#ifdef PKV_HAVE_SERVER
    if (!strcmp(argv[1], "serve")) pkv_serve_block_signals(); /* before MPI's threads, which must not take them */
#endif
    if (pkv_dist_init()) {
        fprintf(stderr, "pagekv %s: %s\n", argv[1], pkv_errmsg());
        return 1;
    }
    const int n = pkv_dist_size();
    if (n <= 1) return 0;
    static const char *const ok[] = {"run", "logits", "devices", "tokenize", "serve"};
    bool allowed = !strcmp(argv[1], "bench") && argc > 2 && !strcmp(argv[2], "model");
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) allowed |= !strcmp(argv[1], ok[i]);
    if (!allowed) {
        if (pkv_dist_rank() == 0)
            fprintf(stderr, "pagekv %s%s%s: not supported under %d MPI ranks (run, logits, serve, bench model, devices "
                    "and tokenize are; docs/distributed.md)\n", argv[1], argc > 2 && !strcmp(argv[1], "bench") ? " " : "",
                    argc > 2 && !strcmp(argv[1], "bench") ? argv[2] : "", n);
        pkv_dist_finalize(0);
        return 2;
    }
    /* the other ranks compute alike and stay silent (PKV_DIST_STDERR=1 keeps their
     * stderr): rank 0 says what a failure in a step was */
    if (pkv_dist_rank() == 0) return 0;
    const char *keep = getenv("PKV_DIST_STDERR");
    g_stderr = dup(STDERR_FILENO);
    if (!freopen("/dev/null", "w", stdout) || (!(keep && !strcmp(keep, "1")) && !freopen("/dev/null", "w", stderr))) return 1;
    return 0;
}

/* A rank other than 0 that fails says so on its own stderr, whose messages were
 * silenced; then every rank ends (an abort after a failure). */
static int end_ranks(int rc) {
    if (rc && pkv_dist_rank() > 0 && g_stderr >= 0) {
        char line[1400];
        int n = snprintf(line, sizeof line, "pagekv: rank %d failed (exit %d)%s%s; PKV_DIST_STDERR=1 shows every rank's "
                         "messages\n", pkv_dist_rank(), rc, pkv_errmsg()[0] ? ": " : "", pkv_errmsg());
        if (write(g_stderr, line, (size_t)PKV_CLI_MIN(n, (int)sizeof line - 1)) < 0) rc = rc ? rc : 1;
    }
    pkv_dist_finalize(rc);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return finish(0);
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("pagekv %s\n", pkv_version());
        return finish(0);
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(argv[1], k_commands[i].name)) {
            int rc = start_ranks(argc, argv);
            if (rc) return rc;
            return end_ranks(finish(k_commands[i].fn(argc - 1, argv + 1)));
        }
    fprintf(stderr, "pagekv: unknown command '%s' (see 'pagekv --help')\n", argv[1]);
    return 2;
}
