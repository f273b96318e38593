/* pagekv run -cnv: an interactive chat, as llama-cli's conversation mode.
 *
 * Each turn renders the whole conversation with the model's chat template through
 * the server's chat layer (src/chat/chat-template.c), so the CLI and the server
 * send a model the same text. The rendered prompt is tokenized as the server does
 * it: special tokens are parsed in the template's markup and never inside message
 * text (pkv_model_tokenize_spans with the spans pkv_chat_apply reports), so a user
 * who types "<|im_end|>" sends text, not a turn boundary.
 *
 * One context, on the serving engine's cache, lives across the turns: the new
 * prompt's tokens are compared with the tokens the context already holds, the
 * context is truncated to the common prefix and the rest is submitted as an engine
 * request on the context, whose events stream the answer (docs/engine.md, "pagekv
 * run on the engine"). When the conversation outgrows the context its oldest turns
 * are dropped (the system message stays) and the chat goes on. Needs the chat
 * layer (src/chat/, jansson); without it pagekv run refuses -cnv before loading
 * anything. */
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

/* One answer: its events (chat_event) fill it. */
typedef struct chat_turn {
    pkv_model *m;
    int32_t *gen;      /* [n_predict + 1] this turn's ids, the end-of-turn token's too */
    int n_gen;
    char *answer;      /* its text, without the end-of-turn token (realloc'd here) */
    size_t len, cap;
    const char *why;   /* "n", "eog", "full" */
    long long n_predict;
    int turn;
    int64_t n_prompt, keep; /* for the turn's line, said when its prompt is in */
    bool discard;      /* -n 0: no answer; the request stops at its first token */
    bool started, done, out_failed, nomem;
    pkv_status status; /* of a final event with finish ERROR */
    char message[512];
} chat_turn;

/* Show token tok of the answer and keep its text; false when it cannot be. */
static bool chat_piece(chat_turn *t, int32_t tok) {
    char piece[256];
    size_t k = 0;
    if (pkv_model_token_piece(t->m, tok, false, piece, sizeof piece, &k)) k = 0;
    if (t->len + k + 1 > t->cap) {
        size_t nc = (t->len + k + 1) * 2;
        char *b = realloc(t->answer, nc);
        if (!b) {
            t->nomem = true;
            return false;
        }
        t->answer = b;
        t->cap = nc;
    }
    memcpy(t->answer + t->len, piece, k);
    t->len += k;
    if (fwrite(piece, 1, k, stdout) != k || fflush(stdout) != 0) {
        t->out_failed = true;
        return false;
    }
    return true;
}

static bool chat_event(const pkv_engine_event *ev, void *user) {
    chat_turn *t = user;
    bool go = true;
    if (ev->token >= 0 && !t->started) { /* the prompt is in */
        t->started = true;
        fprintf(stderr, "pagekv run: turn %d: prompt %lld tokens, %lld reused from the cache, %lld computed\n", t->turn,
                (long long)t->n_prompt, (long long)t->keep, (long long)(t->n_prompt - t->keep));
    }
    if (ev->token >= 0 && !t->discard) {
        t->gen[t->n_gen++] = ev->token;
        if (ev->stop_token) t->why = "eog";
        else go = chat_piece(t, ev->token);
    }
    if (ev->finish == PKV_FINISH_NONE) return go && !t->discard;
    t->done = true;
    if (ev->finish == PKV_FINISH_ERROR) {
        t->status = ev->status ? ev->status : PKV_ERR_INVALID;
        snprintf(t->message, sizeof t->message, "%s", ev->message ? ev->message : "");
    } else if (ev->finish == PKV_FINISH_LENGTH && t->n_gen < t->n_predict) {
        t->why = "full";
    }
    return false;
}

int pkv_cli_run_chat(pkv_engine *e, pkv_context *ctx, const pkv_cli_chat_opts *o) {
    pkv_model *m = pkv_engine_model(e);
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
    int64_t n_ctx = o->n_ctx;
    int32_t *have = malloc((size_t)(n_ctx + 1) * sizeof *have); /* the context's tokens */
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
         * prompt token is computed again, for its logits */
        int64_t n_have = pkv_context_n_tokens(ctx), keep = 0;
        pkv_status s = n_have ? pkv_context_tokens(ctx, 0, n_have, have) : PKV_OK;
        while (!s && keep < n_have && keep < (int64_t)n_prompt - 1 && have[keep] == toks[keep]) keep++;
        if (!s && keep < n_have) s = pkv_context_truncate(ctx, keep);
        if (o->verbose_prompt) print_ids("prompt ids", turn, toks, n_prompt);
        /* the rest of the prompt and the answer: one request on the context, the
         * answer streamed from its events; it ends at an end-of-generation or
         * end-of-turn token, after -n tokens, or where the context is full */
        chat_turn t = {.m = m, .gen = gen, .answer = answer, .cap = ans_cap, .why = "n", .n_predict = o->n_predict,
                       .turn = turn, .n_prompt = (int64_t)n_prompt, .keep = keep, .discard = o->n_predict == 0};
        pkv_request_params rp = pkv_request_default_params();
        rp.context = ctx;
        rp.prompt = toks + keep;
        rp.n_prompt = (int32_t)((int64_t)n_prompt - keep);
        rp.sampler = smp; /* one sampler across the turns, as one loop had */
        rp.stop_tokens = stop_ids;
        rp.n_stop = n_stop;
        int64_t left = n_ctx - (int64_t)n_prompt + 1; /* up to -c tokens held, and one more sampled */
        rp.max_tokens = (int32_t)(o->n_predict == 0 ? 1 : o->n_predict < left ? o->n_predict : left);
        rp.on_event = chat_event;
        rp.user = &t;
        if (!s) s = pkv_engine_submit(e, &rp, NULL);
        free(toks);
        while (!s && !t.done) s = pkv_engine_step(e, NULL);
        if (!s && t.status) s = pkv_err(t.status, "%s", t.message);
        answer = t.answer;
        ans_cap = t.cap;
        ans_len = t.len;
        int n_gen = t.n_gen;
        const char *why = t.why;
        if (t.out_failed) {
            fprintf(stderr, "pagekv run: stopped: standard output could not be written\n");
            goto out;
        }
        if (!t.started) {
            pkv_cli_fail("run", "prefill", s ? s : PKV_ERR_INVALID);
            goto out;
        }
        /* the request ran its last token into the context; as before, the next
         * turn finds the answer without it (its reuse count stays the same) */
        int64_t held = (int64_t)n_prompt + (n_gen > 0 ? n_gen - 1 : 0);
        if (!s && pkv_context_n_tokens(ctx) > held) s = pkv_context_truncate(ctx, held);
        if (!s && t.nomem) s = pkv_err(PKV_ERR_NOMEM, "out of memory for the answer");
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
