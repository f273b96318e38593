// labels: unit model timeout=180
/* pagekv run as llama-cli users expect it (issue 28 item 5):
 *  - a random seed by default, printed as "pagekv run: seed N";
 *  - --ignore-eos generates exactly -n tokens where plain generation stops at an
 *    end-of-generation token;
 *  - chat mode (-cnv -sys) typed at a terminal, driven through tmux: turn 2's
 *    answer has the ids (and text) of a fresh greedy run on the token ids of the
 *    whole rendered conversation (--verbose-prompt prints them), and turn 2 reuses
 *    turn 1's tokens from the cache (reused > 0, computed < total);
 *  - /exit and end of input end a conversation read from a pipe;
 *  - a conversation longer than the context goes on (issue 50.10): oldest turns
 *    dropped, the system prompt kept and reused, a too-long message not sent.
 * Skipped (77) without tmux or without the server's chat layer (jansson). */
#include <unistd.h>

#include "testhelp.h"

static char g_sock[64]; /* our own tmux server (-L), so nothing else is touched */

/* Run a shell command line; stdout (+stderr) in th_out; the exit status. */
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(th_out, 1, sizeof th_out - 1, f);
    th_out[n] = 0;
    int st = pclose(f);
    if (WIFSIGNALED(st)) return -2;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Wait up to secs for path to contain s; false on time out. */
static bool wait_for(const char *path, const char *s, int secs) {
    static char buf[1 << 16];
    for (int i = 0; i < secs * 20; i++) {
        if (strstr(th_read_text(path, buf, sizeof buf), s)) return true;
        usleep(50000);
    }
    return false;
}

static void tmux_type(const char *text) {
    sh("tmux -L %s send-keys -t chat -l '%s' && tmux -L %s send-keys -t chat Enter", g_sock, text, g_sock);
}

/* The ids after "pagekv run: turn N WHAT: " in text, as "a,b,c" in out. */
static bool ids_line(const char *text, int turn, const char *what, char *out, size_t size) {
    char key[96];
    snprintf(key, sizeof key, "pagekv run: turn %d %s: ", turn, what);
    const char *p = strstr(text, key);
    if (!p) return false;
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    if (n + 1 > size) return false;
    memcpy(out, p, n);
    out[n] = 0;
    return true;
}

int main(void) {
    const char *bin = getenv("PKV_CLI");
    if (!bin) return th_skip("PKV_CLI not set: run through ctest");
    char m[512], outp[512], errp[512], rcp[512], ids[512];
    snprintf(m, sizeof m, "%s", th_tmp("chat-model.gguf"));
    snprintf(outp, sizeof outp, "%s", th_tmp("chat-out.txt"));
    snprintf(errp, sizeof errp, "%s", th_tmp("chat-err.txt"));
    snprintf(rcp, sizeof rcp, "%s", th_tmp("chat-rc.txt"));
    snprintf(ids, sizeof ids, "%s", th_tmp("chat-ids.json"));
    /* a ChatML template by default */
    CHECK_INT(th_cli("", true, "mkmodel --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 -o '%s'", m), 0);

    /* the seed: random by default and printed; --seed N prints none and replays */
    CHECK_INT(sh("'%s' run -m '%s' -p hi -n 12 --temp 1 -t 1 2>&1 >/dev/null", bin, m), 0);
    const char *sp = strstr(th_out, "pagekv run: seed ");
    REQUIRE(sp != NULL);
    unsigned long long seed = strtoull(sp + strlen("pagekv run: seed "), NULL, 10);
    CHECK_INT(sh("'%s' run -m '%s' -p hi -n 12 --temp 1 -t 1 2>/dev/null", bin, m), 0);
    CHECK_INT(sh("'%s' run -m '%s' -p hi -n 12 --temp 1 -t 1 --seed %llu 2>&1", bin, m, seed), 0);
    CHECK(strstr(th_out, "pagekv run: seed") == NULL);

    /* --ignore-eos: where sampling meets an end-of-generation token (seed 1 at
     * temperature 3 does on this model), it goes on to -n */
    CHECK_INT(sh("'%s' run -m '%s' -p hi -n 1500 --temp 3 --seed 1 -t 1 2>&1 >/dev/null", bin, m), 0);
    HAS("stopped: end-of-generation token");
    CHECK_INT(sh("'%s' run -m '%s' -p hi -n 1500 --temp 3 --seed 1 --ignore-eos -t 1 2>&1 >/dev/null", bin, m), 0);
    HAS("stopped: -n 1500 tokens generated");
    CHECK_INT(sh("'%s' run -m '%s' -sys x 2>&1", bin, m), 2);
    HAS("-sys (the system message) needs -cnv");

    /* chat needs the server's chat layer */
    int rc = sh("'%s' run -m '%s' -cnv -p x 2>&1", bin, m);
    if (strstr(th_out, "built without")) {
        printf("%s", th_out);
        return th_skip("this pagekv has no chat templates (built without jansson): -cnv refused as it should be");
    }
    CHECK_INT(rc, 2);
    HAS("-cnv does not take -p/-f");

    /* from a pipe: no "> " prompt; /exit ends before the next line */
    CHECK_INT(sh("printf 'hi\\n\\n/exit\\nnever read\\n' | '%s' run -m '%s' -cnv --temp 0 -n 4 -t 1 2>&1", bin, m), 0);
    HAS("pagekv run: turn 1: prompt ");
    HAS("pagekv run: turn 1: 4 tokens, stopped: -n reached");
    CHECK(strstr(th_out, "turn 2") == NULL);
    CHECK(strstr(th_out, "> ") == NULL);

    /* a conversation longer than the context (issue 50.10) goes on: the oldest
     * turns are dropped (the system prompt stays, so its tokens are reused), a
     * message too long even alone is not sent, an answer the context cuts is
     * said so and the next turn makes room */
    {
        static char longmsg[2048], t1[8192], t4[8192];
        for (int i = 0; i < 120; i++) strcat(longmsg, "word ");
        CHECK_INT(sh("printf 'hello there\\nsecond one\\n%s\\nthird one\\nfourth one\\n' | '%s' run -m '%s' -cnv "
                     "-sys 'You are terse' -c 96 --temp 0 -n 30 -t 1 --verbose-prompt 2>&1 >/dev/null",
                     longmsg, bin, m),
                  0);
        HAS("the oldest 1 turn is dropped (the system prompt is kept)");
        HAS("more than the context of 96: not sent");
        HAS("pagekv run: turn 4: prompt ");
        CHECK(strstr(th_out, "conversation ends") == NULL && strstr(th_out, "turn 5") == NULL);
        REQUIRE(ids_line(th_out, 1, "prompt ids", t1, sizeof t1) && ids_line(th_out, 4, "prompt ids", t4, sizeof t4));
        char *cut = t1;
        for (int i = 0; i < 8 && cut; i++) cut = strchr(cut + 1, ',');
        REQUIRE(cut != NULL);
        *cut = 0; /* the system prompt's first tokens */
        CHECK(!strncmp(t4, t1, strlen(t1)));
        const char *r4 = strstr(th_out, "pagekv run: turn 4: prompt ");
        CHECK(r4 && strstr(r4, " 0 reused") == NULL);
        CHECK_INT(sh("printf 'hello there\\nsecond one\\nthird\\n' | '%s' run -m '%s' -cnv -c 96 --temp 0 -n 80 -t 1 "
                     "2>&1 >/dev/null",
                     bin, m),
                  0);
        HAS("the answer is cut here; the next turn drops the oldest turns to make room");
        HAS("pagekv run: turn 3: prompt ");
    }

    /* at a terminal, under tmux */
    if (sh("command -v tmux >/dev/null 2>&1") != 0) return th_skip("tmux is not installed (apt-get install tmux)");
    snprintf(g_sock, sizeof g_sock, "pkv-chat-%ld", (long)getpid());
    CHECK_INT(sh("tmux -L %s new-session -d -s chat -x 160 -y 40 \"'%s' run -m '%s' -cnv -sys 'You are a test.' "
                 "--temp 0 -n 16 -t 1 --verbose-prompt > '%s' 2> '%s'; echo rc=\\$? > '%s'\" 2>&1",
                 g_sock, bin, m, outp, errp, rcp), 0);
    static char err[1 << 16], out[1 << 16];
    bool ok = wait_for(errp, "a line is a turn", 30);
    CHECK(ok);
    if (ok) {
        tmux_type("hello there");
        ok = wait_for(errp, "turn 1 answer ids", 30);
        CHECK(ok);
        sh("tmux -L %s capture-pane -p -t chat", g_sock); /* the terminal echoed the typed line */
        HAS("hello there");
    }
    if (ok) {
        tmux_type("how are you");
        ok = wait_for(errp, "turn 2 answer ids", 30);
        CHECK(ok);
        tmux_type("/exit");
        CHECK(wait_for(rcp, "rc=", 30));
    }
    sh("tmux -L %s kill-session -t chat 2>/dev/null; tmux -L %s kill-server 2>/dev/null", g_sock, g_sock);
    th_read_text(errp, err, sizeof err);
    th_read_text(outp, out, sizeof out);
    printf("--- stderr of the chat ---\n%s--- stdout ---\n%s---\n", err, out);
    CHECK(strstr(th_read_text(rcp, th_out, sizeof th_out), "rc=0") != NULL);
    CHECK(strstr(err, "ends\n> ") != NULL); /* the "> " prompt: standard input is a terminal */
    if (!ok) return th_done();

    /* (b) turn 2 reused turn 1's tokens */
    long long t2 = -1, reused = -1, computed = -1;
    const char *p2 = strstr(err, "pagekv run: turn 2: prompt ");
    REQUIRE(p2 != NULL);
    CHECK_INT(sscanf(p2, "pagekv run: turn 2: prompt %lld tokens, %lld reused from the cache, %lld computed", &t2,
                     &reused, &computed), 3);
    CHECK(reused > 0);
    CHECK(computed > 0 && computed < t2);
    CHECK_INT(reused + computed, t2);
    const char *p1 = strstr(err, "pagekv run: turn 1: prompt ");
    long long t1 = -1, r1 = -1;
    REQUIRE(p1 != NULL);
    CHECK_INT(sscanf(p1, "pagekv run: turn 1: prompt %lld tokens, %lld reused", &t1, &r1), 2);
    CHECK_INT(r1, 0);
    CHECK(t2 > t1);

    /* (a) turn 2's answer = a fresh greedy run on the whole conversation's ids */
    static char prompt2[1 << 15], ans2[4096], fresh[4096];
    REQUIRE(ids_line(err, 2, "prompt ids", prompt2, sizeof prompt2));
    REQUIRE(ids_line(err, 2, "answer ids", ans2, sizeof ans2));
    CHECK_INT(sh("'%s' run -m '%s' --tokens %s --temp 0 -n 16 -t 1 --ids-out '%s' 2>/dev/null", bin, m, prompt2, ids), 0);
    static char text2[sizeof th_out];
    memcpy(text2, th_out, sizeof th_out);
    th_read_text(ids, fresh, sizeof fresh);
    /* "[1, 2, 3]\n" -> "1,2,3" */
    size_t k = 0;
    for (const char *q = fresh; *q; q++)
        if (*q >= '0' && *q <= '9') fresh[k++] = *q;
        else if (*q == ',') fresh[k++] = ',';
    fresh[k] = 0;
    CHECK(strcmp(fresh, ans2) == 0);
    if (strcmp(fresh, ans2)) fprintf(stderr, "fresh run's ids %s, turn 2's %s\n", fresh, ans2);
    /* the fresh run prints no prompt (ids), then the text and a newline: the
     * chat's stdout ends with the same */
    size_t lo = strlen(out), lt = strlen(text2);
    CHECK(lt > 1 && lo > lt && strcmp(out + lo - lt, text2) == 0);
    unlink(m);
    unlink(outp);
    unlink(errp);
    unlink(rcp);
    unlink(ids);
    return th_done();
}
