// labels: unit model timeout=300
/* What a new user met (issue 17), each a regression test: output write errors,
 * bench help and partial JSON, prompts from files and stdin, why generation
 * stopped, context shift, --seed -1, --version, one-line errors, device errors
 * that name the real devices and not the model file, the --fork pool size, mkmodel
 * defaults and success lines. */
#include <unistd.h>

#include "testhelp.h"

#define cli(...) th_cli("", __VA_ARGS__)
#define out th_out

/* Run a whole shell command line with the CLI as $PKV; stdout+stderr in out. */
static int sh(const char *fmt, ...) {
    char line[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "PKV='%s'; %s", getenv("PKV_CLI"), line);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    int st = pclose(f);
    if (WIFSIGNALED(st)) return -2;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

int main(void) {
    if (!getenv("PKV_CLI")) return th_skip("PKV_CLI not set: run through ctest");
    char m[512], prompt[512], t3[512], d3[512];
    snprintf(m, sizeof m, "%s", th_tmp("user-model.gguf"));
    snprintf(prompt, sizeof prompt, "%s", th_tmp("user-prompt.txt"));
    snprintf(t3, sizeof t3, "%s", th_tmp("user-qwen3.gguf"));
    snprintf(d3, sizeof d3, "%s", th_tmp("user-draft.gguf"));
    CHECK_INT(cli(true, "mkmodel --arch llama --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 -o %s", m), 0);

    /* output that cannot be written is a failure (run > /dev/full exited 0) */
    CHECK_INT(sh("\"$PKV\" run -m %s -p hi -n 3 -t 1 > /dev/full 2>/dev/null", m), 1);
    CHECK_INT(sh("\"$PKV\" tokenize -m %s -p hi > /dev/full 2>/dev/null", m), 1);
    CHECK_INT(sh("\"$PKV\" --help > /dev/full 2>/dev/null"), 1);
    CHECK_INT(sh("\"$PKV\" run -m %s -p hi -n 3 -t 1 2>&1 > /dev/full", m), 1);
    HAS("standard output");

    /* bench help runs nothing and exits 0; errors print no partial JSON */
    CHECK_INT(sh("\"$PKV\" bench all --help"), 0);
    HAS("usage: pagekv bench all");
    CHECK(strchr(out, '{') == NULL || strstr(out, "{\"kv\": ...") != NULL);
    CHECK(strstr(out, "\"fork_us\"") == NULL && strstr(out, "tok_s") == NULL);
    CHECK_INT(sh("\"$PKV\" bench kv --help"), 0);
    HAS("usage: pagekv bench kv");
    CHECK_INT(sh("\"$PKV\" bench model --help"), 0);
    /* every bench the top-level help names has its own help */
    {
        static const char *const benches[] = {"kv", "model", "spec", "serve", "server", "all", "kv-accuracy", "kv-speed", "grammar"};
        CHECK_INT(sh("\"$PKV\" --help"), 0);
        char top[8192];
        snprintf(top, sizeof top, "%.8000s", out);
        for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) {
            char word[32];
            snprintf(word, sizeof word, " %s ", benches[i]);
            char *line = strstr(top, "  bench ");
            if (!line || !strstr(line, word)) { /* the last one ends the line */
                snprintf(word, sizeof word, " %s\n", benches[i]);
                if (!line || !strstr(line, word)) TH_FAIL("pagekv --help does not name bench %s", benches[i]);
            }
            if (sh("\"$PKV\" bench %s --help > /dev/null 2>&1", benches[i]) != 0) TH_FAIL("bench %s --help failed", benches[i]);
            else th_checks++;
        }
    }
    CHECK_INT(sh("\"$PKV\" bench all -m /nonexistent-model.gguf --json 2>/dev/null"), 1);
    CHECK_INT((long long)strlen(out), 0);
    CHECK_INT(sh("\"$PKV\" bench kv --bogus 2>&1"), 2);
    CHECK_INT(count_lines(out), 1);
    HAS("see 'pagekv bench kv --help'");

    /* --version */
    CHECK_INT(sh("\"$PKV\" --version"), 0);
    char want[64];
    snprintf(want, sizeof want, "pagekv %s\n", pkv_version());
    CHECK(strcmp(out, want) == 0);

    /* unknown options: one line, pointing at --help */
    const char *cmds[] = {"run", "tokenize", "logits", "mkmodel", "check", "demo", "devices", "bench spec"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        CHECK_INT(sh("\"$PKV\" %s --no-such-option 2>&1", cmds[i]), 2);
        if (count_lines(out) != 1) TH_FAIL("%s: %d lines for an unknown option: %s", cmds[i], count_lines(out), out);
        HAS("--help");
    }

    /* the prompt from a file, from stdin, and a warning for a pipe without -f */
    FILE *f = fopen(prompt, "wb");
    REQUIRE(f);
    fputs("the cat sat on the mat", f);
    fclose(f);
    CHECK_INT(sh("\"$PKV\" run -m %s -f %s -n 4 --temp 0 -t 1 2>/dev/null", m, prompt), 0);
    char from_file[4096];
    snprintf(from_file, sizeof from_file, "%s", out);
    CHECK(strncmp(from_file, "the cat sat on the mat", 22) == 0);
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat sat on the mat' -n 4 --temp 0 -t 1 2>/dev/null", m), 0);
    CHECK(strcmp(out, from_file) == 0);
    CHECK_INT(sh("cat %s | \"$PKV\" run -m %s -f - -n 4 --temp 0 -t 1 2>/dev/null", prompt, m), 0);
    CHECK(strcmp(out, from_file) == 0);
    CHECK_INT(sh("echo hi | \"$PKV\" run -m %s -n 2 -t 1 2>&1 >/dev/null", m), 0);
    HAS("default prompt");
    HAS("-f -");
    CHECK_INT(sh("\"$PKV\" run -m %s -f /nonexistent/prompt.txt 2>&1", m), 1);
    HAS("/nonexistent/prompt.txt");
    CHECK_INT(sh("\"$PKV\" run -m %s -p x -f %s 2>&1", m, prompt), 2);
    /* generated text ends with a newline */
    CHECK(from_file[0] && from_file[strlen(from_file) - 1] == '\n');

    /* why generation stopped; --context-shift goes on where the context is full */
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat' -n 5 --temp 0 -t 1 2>&1 >/dev/null", m), 0);
    HAS("stopped: -n 5 tokens generated");
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat sat on the mat' -n 100 -c 16 --temp 0 -t 1 2>&1 >/dev/null", m), 0);
    if (!strstr(out, "end-of-generation")) HAS("the context of 16 tokens is full");
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat sat on the mat' -n 40 -c 16 --temp 1 --seed 3 --context-shift -t 1 "
                 "2>&1 >/dev/null", m), 0);
    if (!strstr(out, "end-of-generation")) {
        HAS("stopped: -n 40 tokens generated");
        HAS("context shift dropped");
    }

    /* --seed -1: a random seed, printed, and the printed seed replays the text */
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat' -n 12 --temp 1 --seed -1 -t 1 2>&1", m), 0);
    const char *sp = strstr(out, "pagekv run: seed ");
    REQUIRE(sp != NULL);
    unsigned long long seed = strtoull(sp + strlen("pagekv run: seed "), NULL, 10);
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat' -n 12 --temp 1 --seed -1 -t 1 2>/dev/null", m), 0);
    char r1[4096];
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat' -n 12 --temp 1 --seed %llu -t 1 2>/dev/null", m, seed), 0);
    snprintf(r1, sizeof r1, "%s", out);
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat' -n 12 --temp 1 --seed -1 -t 1 2>&1 | grep -v '^pagekv'", m), 0);
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'the cat' -n 12 --temp 1 --seed %llu -t 1 2>/dev/null", m, seed), 0);
    CHECK(strcmp(out, r1) == 0);

    /* -t above the core count warns */
    CHECK_INT(sh("\"$PKV\" run -m %s -p x -n 1 -t 1000 2>&1 >/dev/null", m), 0);
    HAS("more threads than");
    /* -c beyond the training context warns (and runs); within it, no word */
    CHECK_INT(sh("\"$PKV\" run -m %s -p x -n 1 -t 1 -c 100000 2>&1 >/dev/null", m), 0);
    HAS("is beyond the model's training context");
    CHECK_INT(sh("\"$PKV\" run -m %s -p x -n 1 -t 1 -c 64 2>&1 >/dev/null", m), 0);
    CHECK(strstr(th_out, "training context") == NULL);

    /* --fork K: the pool holds the prompt's pages once (7 tokens incl. BOS at page
     * size 4: 2 shared pages; 7 + 6 generated = 13 -> pages 1..3, 3 more each) */
    CHECK_INT(sh("\"$PKV\" run -m %s -p 'a b c d e f' --page-size 4 --fork 3 -n 6 -t 1 2>&1 >/dev/null", m), 0);
    int n_tok = 0;
    {
        pkv_model_params mp = pkv_model_default_params();
        mp.n_threads = 1;
        pkv_model *mm = pkv_model_load(m, mp);
        REQUIRE(mm);
        size_t nt = 0;
        int32_t ids[64];
        CHECK_OK(pkv_model_tokenize(mm, "a b c d e f", 11, true, false, ids, 64, &nt));
        n_tok = (int)nt;
        pkv_model_free(mm);
    }
    int shared = (n_tok + 3) / 4, per = (n_tok + 6 + 3) / 4 - n_tok / 4;
    char pool[128];
    snprintf(pool, sizeof pool, "KV pool of %d pages: the prompt's %d shared by 3 branches, %d more each",
             shared + 3 * per, shared, per);
    HAS(pool);

    /* device errors list the devices and do not blame the model; no doubled path */
    CHECK_INT(sh("\"$PKV\" run -m %s -p x -d vulkan:77 2>&1", m), 1);
    HAS("no device 'vulkan:77'");
    HAS("the devices here are cpu");
    CHECK(strstr(out, "cannot load") == NULL);
    CHECK_INT(sh("\"$PKV\" run -m /nonexistent/model.gguf -p x 2>&1"), 1);
    const char *first = strstr(out, "/nonexistent/model.gguf");
    CHECK(first && !strstr(first + 1, "/nonexistent/model.gguf"));

    CHECK_INT(cli(true, "mkmodel --arch gpt-j -o %s", th_tmp("user-x.gguf")), 1);
    first = strstr(out, "mkmodel");
    CHECK(first && !strstr(first + 1, "mkmodel"));

    /* mkmodel: k-quant defaults work; the success line says what the file holds */
    CHECK_INT(cli(true, "mkmodel --type q4_k_m -o %s", th_tmp("user-q4km.gguf")), 0);
    HAS("q4_k_m");
    CHECK_INT(cli(true, "mkmodel --arch qwen3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 -o %s", t3), 0);
    CHECK_INT(cli(true, "mkmodel --draft-of %s -o %s", t3, d3), 0);
    HAS("(qwen3,");
    unlink(th_tmp("user-q4km.gguf"));
    unlink(t3);
    unlink(d3);
    unlink(prompt);
    unlink(m);
    return th_done();
}
