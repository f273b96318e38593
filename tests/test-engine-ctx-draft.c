// labels: kv timeout=600
/* Speculative decoding on requests on a context (pkv_request_params.context with
 * pkv_engine_params.draft): a chat of turns on one context, each turn a request
 * on it, must give bitwise the events of the same turns on an engine without a
 * draft, and leave the context with the same tokens and bitwise the same logits.
 * Every kind of draft: the model itself (its own cache: the draft catches up with
 * the context's tokens), another small model, qwen35's MTP head (fed the
 * context's kept hidden states; without them it goes without the draft), Gemma
 * 4's assistant and a shared-KV draft. Turns end both ways: with the last token
 * in the context, and with last_pending (pkv_generate's end state: the last token
 * left out, its row the context's logits), the next turn starting with it. A turn
 * without a prompt drafts its first round from the context's last token (its
 * proposals verified against the context's logits): the round hook's first round
 * is at that token with K proposals. N-gram drafts go through the same. Last,
 * pkv_spec_generate (a wrapper over exactly this) against pkv_generate. */
#include "base/base.h"
#include "engine-testlib.h"

enum { NT = 4, TURN_N = 14 };

typedef struct chat_run {
    et_rec turn[NT];
    int32_t toks[256];
    int64_t n_tokens;
    float logits[320];
    pkv_engine_stats st;
    int cur;                 /* the turn in progress */
    int64_t base[NT];        /* the context's length before each turn */
    int64_t first_pos[NT];   /* each turn's first round (pkv_engine_params.on_draft_round): its position, */
    int first_np[NT];        /* and proposals; -1: none */
} chat_run;

static void first_round(uint64_t id, int sample, const pkv_spec_round *r, void *user) {
    chat_run *out = user;
    (void)id, (void)sample;
    if (out->first_pos[out->cur] >= 0) return;
    out->first_pos[out->cur] = r->pos;
    out->first_np[out->cur] = r->n_proposed;
}

/* The turns' prompts and sampling: turn 0 a prompt of 9, turns 1-2 prompts of 3
 * (with last_pending: the previous last token, then 2), turn 3 none (from the
 * context's logits; with last_pending its one token is the previous last). */
static pkv_request_params turn_params(int t, int32_t *prompt, int32_t prev_last, bool pending) {
    pkv_request_params r = pkv_request_default_params();
    static const int32_t k_p0[9] = {11, 40, 41, 77, 90, 101, 33, 58, 120};
    int n = 0;
    if (t == 0) {
        memcpy(prompt, k_p0, sizeof k_p0);
        n = 9;
    } else if (t < 3) {
        if (pending) prompt[n++] = prev_last;
        prompt[n++] = 200 + t;
        prompt[n++] = 7 * t;
        if (!pending) prompt[n++] = 99;
    } else if (pending) {
        prompt[n++] = prev_last;
    }
    r.prompt = n ? prompt : NULL;
    r.n_prompt = n;
    r.max_tokens = TURN_N;
    r.ignore_eos = true;
    r.sampling.temp = 0;
    r.top_logprobs = t == 1 ? 2 : 0;
    if (t == 2) { /* a seeded turn: MATCH keeps plain decoding's tokens for any seed */
        r.sampling.temp = 0.9f;
        r.sampling.seed = 77;
    }
    r.last_pending = pending;
    return r;
}

/* The chat on model m with draft d (NULL: none, or n-gram drafts); keep_hidden:
 * the context keeps its hidden states (an MTP head reads them, and the assistant's
 * first round). */
static void chat(pkv_model *m, pkv_model *d, bool ngram, bool pending, bool keep_hidden, chat_run *out,
                 const char *what) {
    memset(out, 0, sizeof *out);
    pkv_engine_params ep = et_params(256, 8, 0);
    ep.draft = d;
    ep.draft_ngram = ngram;
    ep.draft_max = 3;
    ep.on_draft_round = first_round;
    ep.draft_round_user = out;
    pkv_engine *e = pkv_engine_create(m, ep);
    pkv_context *ctx = e ? pkv_context_create(m, pkv_engine_cache(e), 256) : NULL;
    if (!ctx) {
        TH_FAIL("%s: setup: %s", what, pkv_errmsg());
        pkv_engine_free(e);
        return;
    }
    if (keep_hidden) CHECK_OK(pkv_context_keep_hidden(ctx));
    int32_t prev = -1;
    for (int t = 0; t < NT; t++) {
        int32_t prompt[16];
        pkv_request_params r = turn_params(t, prompt, prev, pending);
        r.context = ctx;
        r.on_event = et_on_event;
        r.user = &out->turn[t];
        int64_t before = pkv_context_n_tokens(ctx);
        out->cur = t;
        out->base[t] = before;
        out->first_pos[t] = out->first_np[t] = -1;
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        const et_sample *s = &out->turn[t].s[0];
        CHECK_INT(s->n, TURN_N);
        CHECK_INT(s->status, PKV_OK);
        /* the context holds the prompt and every generated token (but the last) */
        CHECK_INT(pkv_context_n_tokens(ctx), before + r.n_prompt + TURN_N - (pending ? 1 : 0));
        CHECK(pkv_context_logits(ctx) != NULL);
        prev = s->n ? s->tok[s->n - 1] : -1;
    }
    out->n_tokens = pkv_context_n_tokens(ctx);
    if (out->n_tokens <= 256) CHECK_OK(pkv_context_tokens(ctx, 0, out->n_tokens, out->toks));
    if (pkv_context_logits(ctx)) memcpy(out->logits, pkv_context_logits(ctx), sizeof out->logits);
    pkv_engine_stats_get(e, &out->st);
    CHECK_INT(out->st.requests_failed, 0);
    pkv_context_free(ctx);
    pkv_engine_free(e);
}

/* The chat with draft d against the chat without one: every turn's events, the
 * context's tokens and logits. drafts: proposals are expected. */
static void check_kind(pkv_model *m, pkv_model *d, bool ngram, const char *name, bool keep_hidden, bool drafts) {
    static chat_run plain, spec;
    for (int pending = 0; pending < 2; pending++) {
        char what[128];
        snprintf(what, sizeof what, "%s%s", name, pending ? ", last_pending" : "");
        chat(m, NULL, false, pending, keep_hidden, &plain, what);
        chat(m, d, ngram, pending, keep_hidden, &spec, what);
        int bad = 0;
        for (int t = 0; t < NT; t++) bad += !et_same(&plain.turn[t], &spec.turn[t], 1, what, t);
        CHECK_INT(spec.n_tokens, plain.n_tokens);
        CHECK_MEM(spec.toks, plain.toks, (size_t)PKV_MIN(plain.n_tokens, 256) * sizeof(int32_t));
        CHECK_MEM(spec.logits, plain.logits, sizeof plain.logits);
        fprintf(stderr, "  %-44s %d of %d turns differ; proposed %llu, kept %llu, %llu steps (plain %llu), %llu "
                        "without the draft\n",
                what, bad, NT, (unsigned long long)spec.st.draft_proposed, (unsigned long long)spec.st.draft_accepted,
                (unsigned long long)spec.st.steps, (unsigned long long)plain.st.steps,
                (unsigned long long)spec.st.draft_disabled);
        if (drafts) {
            CHECK(spec.st.draft_proposed > 0);
            CHECK_INT(spec.st.draft_disabled, 0);
            /* turn 3 has no prompt (without last_pending): its first round drafts K from
             * the context's last token (n-grams: when the lookup finds one) */
            if (!pending) CHECK_INT(spec.first_pos[3], spec.base[3] - 1);
            if (!pending && !ngram) CHECK_INT(spec.first_np[3], 3);
        } else {
            CHECK(spec.st.draft_disabled > 0); /* an MTP head without the context's hidden states */
        }
    }
}

static bool write_model(const char *path, const char *arch, const char *draft_of, const int32_t *kv, uint64_t seed) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = PKV_TYPE_Q8_0;
    if (!draft_of || kv) { /* (an assistant has a width of its own) */
        p.n_embd = et_n_embd;
        p.n_ff = 128;
        p.n_vocab = 320;
    }
    p.seed = seed;
    p.draft_of = draft_of;
    if (!strcmp(arch, "llama")) {
        p.n_layer = 2;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.shared_kv_layers = kv;
    }
    pkv_status s = pkv_mkmodel_write(&p, path);
    if (s) TH_FAIL("mkmodel %s: %s", path, pkv_errmsg());
    return !s;
}

/* on = the model whose device handle it shares (a draft attached to its cache) */
static pkv_model *load_file(const char *path, pkv_model *on) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    if (on) mp.device_handle = pkv_model_device(on);
    pkv_model *m = pkv_model_load(path, mp);
    if (!m) TH_FAIL("load %s: %s", path, pkv_errmsg());
    return m;
}

static bool collect(int32_t tok, void *user) {
    et_sample *s = user;
    if (s->n < ET_MAXT) s->tok[s->n++] = tok;
    return true;
}

/* pkv_spec_generate (greedy, every turn from the context's logits) against
 * pkv_generate on a context of the caller's cache: tokens, end state. */
static void check_spec_wrapper(pkv_model *m, pkv_model *d) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    cp.page_size = 8;
    cp.n_seq_max = 2;
    pkv_kv_cache *c1 = pkv_model_cache_create(m, cp), *c2 = pkv_model_cache_create(m, cp);
    pkv_context *a = c1 ? pkv_context_create(m, c1, 0) : NULL, *b = c2 ? pkv_context_create(m, c2, 0) : NULL;
    pkv_sampler_params sp = pkv_sampler_default_params();
    sp.temp = 0;
    pkv_sampler *sa = pkv_sampler_create(sp, 320), *sb = pkv_sampler_create(sp, 320);
    REQUIRE_VOID(a && b && sa && sb);
    pkv_spec_params p = pkv_spec_default_params();
    p.draft_max = 3;
    pkv_spec *s = pkv_spec_create(b, d, p);
    REQUIRE_VOID(s);
    static const int32_t prompt[5] = {3, 60, 61, 62, 9};
    CHECK_OK(pkv_context_decode(a, prompt, 5));
    CHECK_OK(pkv_context_decode(b, prompt, 5));
    for (int call = 0; call < 3; call++) {
        et_sample x, y;
        memset(&x, 0, sizeof x);
        memset(&y, 0, sizeof y);
        pkv_spec_stats st;
        CHECK_OK(pkv_generate(a, sa, 10, collect, &x, NULL));
        CHECK_OK(pkv_spec_generate(s, sb, 10, collect, &y, &st));
        CHECK_INT(y.n, x.n);
        CHECK_INT((int)st.n_tokens, y.n);
        CHECK_MEM(y.tok, x.tok, (size_t)x.n * sizeof x.tok[0]);
        CHECK_INT(pkv_context_n_tokens(b), pkv_context_n_tokens(a));
        CHECK_MEM(pkv_context_logits(b), pkv_context_logits(a), 320 * sizeof(float));
        CHECK(st.drafted > 0);
        /* the caller's turn: its last token and one more, as a chat would */
        int32_t next[2] = {x.tok[x.n - 1], 17 + call};
        CHECK_OK(pkv_context_decode(a, next, 2));
        CHECK_OK(pkv_context_decode(b, next, 2));
    }
    /* the context's limit: pkv_generate's decode fails past it, and so does this */
    pkv_spec_free(s);
    pkv_sampler_free(sa);
    pkv_sampler_free(sb);
    pkv_context_free(a);
    pkv_context_free(b);
    pkv_kv_cache_free(c1);
    pkv_kv_cache_free(c2);
}

/* A target file of arch and a draft of it (darch; kv: a shared-KV draft of those
 * cache layers), the draft loaded on the target's device handle: check_kind. */
static void check_files(const char *arch, const char *darch, const int32_t *kv, uint64_t seed, const char *name) {
    char tf[512], df[512];
    snprintf(tf, sizeof tf, "%s", th_tmp("ctx-draft-target.gguf"));
    snprintf(df, sizeof df, "%s", th_tmp("ctx-draft-draft.gguf"));
    if (write_model(tf, arch, NULL, NULL, seed) && write_model(df, darch, tf, kv, kv ? seed : seed + 1)) {
        pkv_model *m = load_file(tf, NULL), *d = m ? load_file(df, m) : NULL;
        if (m && d) check_kind(m, d, false, name, !strcmp(darch, "gemma4-assistant"), true);
        pkv_model_free(d);
        pkv_model_free(m);
    }
    unlink(tf);
    unlink(df);
}

int main(void) {
    fprintf(stderr, "requests on a context with a draft (MATCH), against the same without one:\n");
    pkv_model *m = et_model("llama", PKV_TYPE_Q8_0, 1), *self = et_model("llama", PKV_TYPE_Q8_0, 1),
              *other = et_model_ex("llama", PKV_TYPE_Q8_0, 2, 1, 0, false);
    if (m && self && other) {
        check_kind(m, self, false, "llama, itself as draft", false, true);
        check_kind(m, other, false, "llama, another model as draft", false, true);
        check_kind(m, NULL, true, "llama, n-gram drafts", false, true);
        check_spec_wrapper(m, self);
    }
    pkv_model_free(other);
    pkv_model_free(self);
    pkv_model_free(m);

    m = et_model_ex("qwen35", PKV_TYPE_Q8_0, 3, 4, 1, false);
    pkv_model *head = m ? et_model_ex("qwen35", PKV_TYPE_Q8_0, 3, 4, 1, true) : NULL;
    if (m && head) {
        check_kind(m, head, false, "qwen35, its MTP head, hidden kept", true, true);
        check_kind(m, head, false, "qwen35, its MTP head, hidden not kept", false, false);
    }
    pkv_model_free(head);
    pkv_model_free(m);

    static const int32_t kv01[2] = {0, 1};
    check_files("gemma4", "gemma4-assistant", NULL, 5, "gemma4, its assistant");
    check_files("llama", "llama", kv01, 7, "llama, a shared-KV draft of its layers");
    return th_done();
}
