/* pagekv run -cnv: an interactive chat, as llama-cli's conversation mode.
 *
 * Each turn renders the whole conversation with the model's chat template through
 * the server's chat layer (src/chat/chat-template.c), so the CLI and the server
 * send a model the same text. The rendered prompt is tokenized as the server does
 * it: special tokens are parsed in the template's markup and never inside message
 * text (pkv_model_tokenize_spans with the spans pkv_chat_apply reports), so a user
 * who types "<|im_end|>" sends text, not a turn boundary.
 *
 * One context lives across the turns: the new prompt's tokens are compared with the
 * tokens the context already holds, the context is truncated to the common prefix
 * and only the rest is decoded. When the conversation outgrows the context its
 * oldest turns are dropped (the system message stays) and the chat goes on. Needs the chat layer (src/chat/, jansson); without it
 * pagekv run refuses -cnv before loading anything. */
#ifdef PKV_HAVE_SERVER
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "model/gguf.h"
#include "pagekv.h"
#include "chat/chat.h"

/* The model's template (tokenizer.chat_template), else ChatML as llama-cli and
 * pagekv serve use; *fam is its family when recognised (for the end-of-turn
 * tokens). NULL with the reason on stderr. */
static pkv_chat *open_template(pkv_model *m, const char *model_path, pkv_tpl *fam) {
    char *src = NULL;
    size_t n = 0;
    const char *what = "the model's tokenizer.chat_template";
    if (model_path) {
        pkv_gguf *gf = pkv_gguf_open(model_path);
        const char *t = NULL;
        if (gf && pkv_gguf_get_str(gf, "tokenizer.chat_template", &t, &n) == PKV_OK && (src = malloc(n + 1))) {
            memcpy(src, t, n);
            src[n] = 0;
        }
        pkv_gguf_close(gf);
    }
    if (!src) {
        src = strdup(pkv_tpl_source(PKV_TPL_CHATML));
        if (!src) return NULL;
        n = strlen(src);
        what = "the default chat template (chatml)";
        fprintf(stderr, "pagekv run: the model has no chat template (tokenizer.chat_template): using chatml\n");
    }
    char err[600];
    pkv_chat *c = pkv_chat_init_model(m, src, n, err, sizeof err);
    if (!c) fprintf(stderr, "pagekv run: %s: %s\n", what, err);
    *fam = pkv_tpl_detect(src, n);
    free(src);
    return c;
}

/* Add {"role": role, "content": text} (invalid UTF-8 replaced) to msgs. */
static bool add_message(json_t *msgs, const char *role, const char *text, size_t len) {
    size_t n = 0;
    char *clean = pkv_utf8_sanitize(text, len, &n);
    json_t *c = clean ? json_stringn(clean, n) : NULL;
    free(clean);
    json_t *msg = c ? json_pack("{s:s,s:o}", "role", role, "content", c) : NULL;
    return msg && json_array_append_new(msgs, msg) == 0;
}

/* Render the conversation and tokenize it (markup's special tokens parsed, the
 * messages' text as data). malloc'd ids in *out, NULL on failure (said). */
static int32_t *render(pkv_model *m, const pkv_chat *chat, json_t *body, size_t *n_out) {
    size_t len = 0, *spans = NULL, n_spans = 0, need = 0;
    int status = 0;
    char err[600];
    char *text = pkv_chat_apply(chat, body, 0, &len, &spans, &n_spans, &status, err, sizeof err);
    if (!text) {
        fprintf(stderr, "pagekv run: the chat template: %s\n", err);
        return NULL;
    }
    size_t cap = len + 3;
    int32_t *ids = malloc(cap * sizeof *ids);
    pkv_status s = ids ? pkv_model_tokenize_spans(m, text, len, true, spans, n_spans, ids, cap, &need) : PKV_ERR_NOMEM;
    if (s == PKV_ERR_INVALID && need > cap) {
        int32_t *b = realloc(ids, (need + 1) * sizeof *b);
        if (b) {
            ids = b;
            s = pkv_model_tokenize_spans(m, text, len, true, spans, n_spans, ids, need + 1, &need);
        }
    }
    free(text);
    free(spans);
    if (s) {
        pkv_cli_fail("run", "tokenize", s);
        free(ids);
        return NULL;
    }
    *n_out = need;
    return ids;
}

static void print_ids(const char *what, int turn, const int32_t *ids, size_t n) {
    fprintf(stderr, "pagekv run: turn %d %s:", turn, what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? "," : " ", ids[i]);
    fputc('\n', stderr);
}

int pkv_cli_run_chat(pkv_model *m, pkv_context *ctx, const pkv_cli_chat_opts *o) {
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    pkv_tpl fam = PKV_TPL_NONE;
    pkv_chat *chat = open_template(m, o->model_path, &fam);
    if (!chat) return 1;
    /* end-of-turn texts that are one token end an answer, as in pagekv serve */
    int32_t stop_ids[16];
    int n_stop = 0;
    const char *const *ends = pkv_tpl_end_texts(fam);
    for (int i = 0; ends && ends[i] && n_stop < 16; i++) {
        int32_t ids[4];
        size_t nt = 0;
        if (pkv_model_tokenize(m, ends[i], strlen(ends[i]), false, true, ids, 4, &nt) == PKV_OK && nt == 1)
            stop_ids[n_stop++] = ids[0];
    }
    int rc = 1;
    json_t *body = json_pack("{s:[],s:b}", "messages", "add_generation_prompt", 1);
    json_t *msgs = body ? json_object_get(body, "messages") : NULL;
    pkv_sampler *smp = pkv_sampler_create(o->sp, info.n_vocab);
    int64_t n_ctx = pkv_context_n_ctx(ctx);
    int32_t *have = malloc((size_t)n_ctx * sizeof *have); /* the context's tokens */
    char *line = NULL, *answer = NULL;
    size_t line_cap = 0, ans_len = 0, ans_cap = 0;
    int32_t *gen = malloc(((size_t)o->n_predict + 1) * sizeof *gen); /* this turn's ids */
    if (!msgs || !smp || !have || !gen) {
        pkv_cli_fail("run", "chat", PKV_ERR_NOMEM);
        goto out;
    }
    if (o->system && !add_message(msgs, "system", o->system, strlen(o->system))) {
        pkv_cli_fail("run", "chat", PKV_ERR_NOMEM);
        goto out;
    }
    bool tty = isatty(STDIN_FILENO);
    fprintf(stderr, "pagekv run: chat with %s, %d layers, %s on %s, context %lld tokens; a line is a turn, "
                    "/exit or end of input ends\n",
            info.arch, info.n_layer, pkv_cli_kv_desc(o->kv), pkv_device_name(pkv_model_device(m)), (long long)n_ctx);
    for (int turn = 1;; turn++) {
        ssize_t got;
        for (;;) {
            if (tty) fputs("> ", stderr);
            if ((got = getline(&line, &line_cap, stdin)) < 0) break;
            while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
            if (got > 0) break;
        }
        if (got < 0 || !strcmp(line, "/exit")) break;
        if (!add_message(msgs, "user", line, (size_t)got)) {
            pkv_cli_fail("run", "chat", PKV_ERR_NOMEM);
            goto out;
        }
        /* A conversation that outgrows the context drops its oldest turns (the
         * system prompt stays), leaving room for an answer of up to -n tokens
         * (at most a quarter of the context); a message that does not fit even
         * alone is not sent, and the chat goes on. */
        size_t n_prompt = 0, first = o->system ? 1 : 0;
        int64_t room = o->n_predict < n_ctx / 4 ? o->n_predict : n_ctx / 4;
        int dropped = 0;
        int32_t *toks = NULL;
        json_t *gone = json_array(); /* the dropped messages, oldest first */
        if (!gone) {
            pkv_cli_fail("run", "chat", PKV_ERR_NOMEM);
            goto out;
        }
        for (;;) {
            if (!(toks = render(m, chat, body, &n_prompt))) {
                json_decref(gone);
                goto out;
            }
            if ((int64_t)n_prompt + 1 + room <= n_ctx || json_array_size(msgs) <= first + 1) break;
            free(toks); /* the oldest turn: its user message and the answer after it */
            for (int k = 0; k < 2 && json_array_size(msgs) > first + 1; k++) {
                json_array_append(gone, json_array_get(msgs, first));
                json_array_remove(msgs, first);
            }
            dropped++;
        }
        if ((int64_t)n_prompt + 1 > n_ctx) { /* the conversation is kept as it was */
            fprintf(stderr, "pagekv run: this message makes %zu tokens%s, more than the context of %lld: not sent "
                            "(a shorter one, or a larger -c)\n",
                    n_prompt, o->system ? " with the system prompt" : "", (long long)n_ctx);
            free(toks);
            json_array_remove(msgs, json_array_size(msgs) - 1);
            for (size_t k = json_array_size(gone); k-- > 0;) json_array_insert(msgs, first, json_array_get(gone, k));
            json_decref(gone);
            turn--;
            continue;
        }
        json_decref(gone);
        if (dropped)
            fprintf(stderr, "pagekv run: the context of %lld tokens is full: the oldest %d turn%s dropped (%s)\n",
                    (long long)n_ctx, dropped, dropped == 1 ? " is" : "s are",
                    o->system ? "the system prompt is kept" : "a larger -c keeps more");
        /* reuse the common prefix with what the context holds; at least the last
         * prompt token is decoded again, for its logits */
        int64_t n_have = pkv_context_n_tokens(ctx), keep = 0;
        pkv_status s = n_have ? pkv_context_tokens(ctx, 0, n_have, have) : PKV_OK;
        while (!s && keep < n_have && keep < (int64_t)n_prompt - 1 && have[keep] == toks[keep]) keep++;
        if (!s && keep < n_have) s = pkv_context_truncate(ctx, keep);
        if (!s) s = pkv_context_decode(ctx, toks + keep, (int32_t)((int64_t)n_prompt - keep));
        if (o->verbose_prompt) print_ids("prompt ids", turn, toks, n_prompt);
        free(toks);
        if (s) {
            pkv_cli_fail("run", "prefill", s);
            goto out;
        }
        fprintf(stderr, "pagekv run: turn %d: prompt %zu tokens, %lld reused from the cache, %lld computed\n", turn,
                n_prompt, (long long)keep, (long long)((int64_t)n_prompt - keep));
        /* the answer, streamed; it ends at an end-of-generation or end-of-turn token */
        ans_len = 0;
        int n_gen = 0;
        const char *why = "n";
        while (n_gen < o->n_predict) {
            int32_t t;
            if ((s = pkv_sampler_sample(smp, pkv_context_logits(ctx), &t))) break;
            pkv_sampler_accept(smp, t);
            gen[n_gen++] = t;
            bool stop = pkv_model_is_eog(m, t);
            for (int i = 0; i < n_stop; i++) stop |= t == stop_ids[i];
            if (stop) {
                why = "eog";
                break;
            }
            char piece[256];
            size_t k = 0;
            if (pkv_model_token_piece(m, t, false, piece, sizeof piece, &k)) k = 0;
            if (ans_len + k + 1 > ans_cap) {
                size_t nc = (ans_len + k + 1) * 2;
                char *b = realloc(answer, nc);
                if (!b) {
                    s = PKV_ERR_NOMEM;
                    break;
                }
                answer = b;
                ans_cap = nc;
            }
            memcpy(answer + ans_len, piece, k);
            ans_len += k;
            if (fwrite(piece, 1, k, stdout) != k || fflush(stdout) != 0) {
                fprintf(stderr, "pagekv run: stopped: standard output could not be written\n");
                goto out;
            }
            if (n_gen >= o->n_predict) break;
            if (pkv_context_n_tokens(ctx) >= n_ctx) {
                why = "full";
                break;
            }
            if ((s = pkv_context_decode(ctx, &t, 1))) break;
        }
        fputc('\n', stdout);
        fflush(stdout);
        if (s) {
            pkv_cli_fail("run", "generate", s);
            goto out;
        }
        if (o->verbose_prompt) print_ids("answer ids", turn, gen, (size_t)n_gen);
        fprintf(stderr, "pagekv run: turn %d: %d tokens, stopped: %s\n", turn, n_gen,
                !strcmp(why, "eog") ? "end-of-turn token" : !strcmp(why, "n") ? "-n reached" : "the context is full");
        if (!add_message(msgs, "assistant", answer ? answer : "", ans_len)) {
            pkv_cli_fail("run", "chat", PKV_ERR_NOMEM);
            goto out;
        }
        if (!strcmp(why, "full"))
            fprintf(stderr, "pagekv run: the context of %lld tokens is full: the answer is cut here; the next turn "
                            "drops the oldest turns to make room\n", (long long)n_ctx);
    }
    rc = 0;
out:
    free(line);
    free(answer);
    free(gen);
    free(have);
    pkv_sampler_free(smp);
    json_decref(body);
    pkv_chat_free(chat);
    return rc;
}
#else
typedef int pkv_cli_run_chat_unused; /* -cnv needs the server's chat layer (jansson) */
#endif
