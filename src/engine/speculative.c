/* Speculative decoding on a caller's context (pkv_spec_*): a thin wrapper over
 * the serving engine, which has the one implementation (engine-sched.c, "draft";
 * docs/speculative.md). pkv_spec_create makes a one-sequence engine over the
 * target's cache (pkv_engine_params.use_cache) with the draft, of any kind, and
 * the speculative-sampling rule; pkv_spec_generate is one request on the target
 * context, stepped on the calling thread until its final event: no prompt (the
 * engine's first round drafts from the context's last token and verifies the
 * first proposal against the context's logits), the caller's sampler, and
 * last_pending, so the context ends as pkv_generate leaves one. The engine's
 * draft follows the context by itself: an own-cache draft keeps its pages of the
 * tokens it has seen in its prefix index and decodes the rest. */
#include <string.h>

#include "base/base.h"
#include "engine/engine.h"
#include "engine/sampler.h"

enum { SPEC_MAX_DRAFT = 64 };

struct pkv_spec {
    pkv_context *target;
    pkv_engine *eng;
    int32_t V;
    void (*on_round)(const pkv_spec_round *r, void *user);
    void *round_user;
    int64_t rounds; /* of the call in progress */
};

pkv_spec_params pkv_spec_default_params(void) {
    pkv_spec_params p;
    memset(&p, 0, sizeof p);
    p.draft_max = 4;
    p.draft_cache = pkv_cache_default_params();
    p.draft_cache.n_seq_max = 1;
    return p;
}

void pkv_spec_free(pkv_spec *s) {
    if (!s) return;
    pkv_engine_free(s->eng);
    pkv_free(s);
}

static void spec_round(uint64_t id, int sample, const pkv_spec_round *r, void *user) {
    pkv_spec *s = user;
    (void)id, (void)sample;
    s->rounds++;
    if (s->on_round) s->on_round(r, s->round_user);
}

pkv_spec *pkv_spec_create(pkv_context *target, pkv_model *draft, pkv_spec_params p) {
    if (!target || !draft) {
        pkv_err(PKV_ERR_INVALID, "spec: NULL target context or draft model");
        return NULL;
    }
    int K = p.draft_max ? p.draft_max : 4;
    if (K < 1 || K > SPEC_MAX_DRAFT) {
        pkv_err(PKV_ERR_INVALID, "spec: draft_max %d is outside 1..%d", p.draft_max, SPEC_MAX_DRAFT);
        return NULL;
    }
    pkv_model_info ti, di;
    if (pkv_model_get_info(pkv_context_model(target), &ti) || pkv_model_get_info(draft, &di)) return NULL;
    if (ti.n_ranks > 1) {
        pkv_err(PKV_ERR_UNSUPPORTED, "spec: a draft model with a target split over %d MPI ranks is not supported", ti.n_ranks);
        return NULL;
    }
    if (ti.n_vocab != di.n_vocab && !di.assistant) { /* an assistant's attach says it, naming both files */
        pkv_err(PKV_ERR_MISMATCH, "spec: the draft has a vocabulary of %d tokens, the target %d: a draft needs the "
                                  "target's vocabulary (pagekv mkmodel --draft-of makes one)",
                di.n_vocab, ti.n_vocab);
        return NULL;
    }
    if (di.mtp && (di.n_embd != ti.n_embd || di.shared_kv)) {
        pkv_err(PKV_ERR_MISMATCH, "spec: the MTP head's width %d differs from the target's %d", di.n_embd, ti.n_embd);
        return NULL;
    }
    /* an MTP head takes in the target's hidden state of every token, and the first
     * round of Gemma 4's assistant the state of the token before the context's last
     * (engine-sched.c, first_rounds): kept from the prompt on */
    if ((di.mtp || di.assistant) && pkv_context_keep_hidden(target)) return NULL;
    pkv_spec *s = pkv_calloc(1, sizeof *s);
    if (!s) {
        pkv_err(PKV_ERR_NOMEM, "spec: out of memory");
        return NULL;
    }
    s->target = target;
    s->V = ti.n_vocab;
    s->on_round = p.on_round;
    s->round_user = p.round_user;
    pkv_engine_params ep = pkv_engine_default_params();
    ep.use_cache = pkv_context_cache(target);
    ep.cache = p.draft_cache; /* an own-cache draft's KV type; its pool follows the target's */
    ep.cache.n_ctx = (int)pkv_context_n_ctx(target);
    ep.cache.page_size = pkv_kv_layout_page_size(pkv_kv_cache_layout(ep.use_cache));
    ep.max_seqs = 1;
    ep.swap = false; /* one sequence: nothing to preempt it for */
    ep.draft = draft;
    ep.draft_max = K;
    ep.draft_accept = PKV_DRAFT_ACCEPT_SAMPLING;
    ep.on_draft_round = spec_round;
    ep.draft_round_user = s;
    if (!(s->eng = pkv_engine_create(pkv_context_model(target), ep))) {
        pkv_free(s);
        return NULL;
    }
    return s;
}

typedef struct {
    pkv_token_fn on_token;
    void *user;
    int64_t emitted;
    bool done;
    pkv_finish_reason fin;
    pkv_status status;
    char msg[512];
} spec_call;

static bool spec_event(const pkv_engine_event *ev, void *user) {
    spec_call *c = user;
    bool go = true;
    if (ev->token >= 0) {
        c->emitted++;
        if (c->on_token) go = c->on_token(ev->token, c->user);
    }
    if (ev->finish != PKV_FINISH_NONE) {
        c->done = true;
        c->fin = ev->finish;
        c->status = ev->status;
        snprintf(c->msg, sizeof c->msg, "%s", ev->message ? ev->message : "");
    }
    return go;
}

pkv_status pkv_spec_generate(pkv_spec *s, pkv_sampler *smp, int n_max, pkv_token_fn on_token, void *user,
                             pkv_spec_stats *stats) {
    pkv_spec_stats st;
    memset(&st, 0, sizeof st);
    if (stats) *stats = st;
    if (!s || !smp || n_max < 0) return pkv_err(PKV_ERR_INVALID, "spec: NULL spec or sampler, or n_max < 0");
    if (pkv_sampler_n_vocab(smp) != s->V)
        return pkv_err(PKV_ERR_MISMATCH, "spec: the sampler was made for a vocabulary of %d tokens, the model has %d",
                       (int)pkv_sampler_n_vocab(smp), s->V);
    if (pkv_sampler_has_grammar(smp))
        return pkv_err(PKV_ERR_UNSUPPORTED, "spec: the sampler has a grammar; speculative sampling draws from the "
                       "draft's distribution, which the grammar would have to follow too: use pkv_generate, or the "
                       "engine (its speculative decoding verifies every proposal against the grammar)");
    if (n_max == 0) return PKV_OK;
    pkv_context *tg = s->target;
    if (!pkv_context_logits(tg))
        return pkv_err(PKV_ERR_INVALID, "spec: the target context has no logits (decode a prompt first)");
    const int64_t base = pkv_context_n_tokens(tg), n_ctx = pkv_context_n_ctx(tg);
    for (int64_t i = 0; i < base; i++) {
        int32_t t;
        pkv_status r = pkv_context_tokens(tg, i, 1, &t);
        if (r) return r;
        if (t < 0)
            return pkv_err(PKV_ERR_UNSUPPORTED, "spec: token %lld of the target context %s: the draft cannot follow it",
                           (long long)i, pkv_token_is_media(t) ? "is a media row (a draft takes no media rows)"
                                                               : "has no id (appended without ids)");
    }
    /* The request may hold at most the context's limit and the device pool: past
     * them it ends there, and the call fails as pkv_generate's decode would. */
    pkv_kv_cache *c = pkv_context_cache(tg);
    pkv_kv_stats ks;
    pkv_kv_stats_get(c, &ks);
    const int64_t ps = pkv_kv_layout_page_size(pkv_kv_cache_layout(c));
    const int64_t by_ctx = n_ctx - base + 1, by_pool = ks.n_pages * ps - base + 1;
    const int64_t max = PKV_MIN((int64_t)n_max, PKV_MIN(by_ctx, by_pool));
    if (max < 1) return pkv_err(PKV_ERR_OUT_OF_PAGES, "spec: the target's %lld tokens fill the pool of %lld pages",
                                (long long)base, (long long)ks.n_pages);
    spec_call call;
    memset(&call, 0, sizeof call);
    call.on_token = on_token;
    call.user = user;
    pkv_request_params rq = pkv_request_default_params();
    rq.context = tg;
    rq.sampler = smp;
    rq.max_tokens = (int32_t)max;
    rq.last_pending = true;
    rq.on_event = spec_event;
    rq.user = &call;
    pkv_engine_stats e0, e1;
    pkv_engine_stats_get(s->eng, &e0);
    s->rounds = 0;
    pkv_status r = pkv_engine_submit(s->eng, &rq, NULL);
    while (!r && !call.done) r = pkv_engine_step(s->eng, NULL);
    pkv_engine_stats_get(s->eng, &e1);
    st.n_tokens = call.emitted;
    st.drafted = (int64_t)(e1.draft_proposed - e0.draft_proposed);
    st.accepted = (int64_t)(e1.draft_accepted - e0.draft_accepted);
    st.target_steps = (int64_t)(e1.steps - e0.steps);
    st.draft_steps = (int64_t)(e1.draft_steps - e0.draft_steps);
    st.rounds = s->rounds;
    if (stats) *stats = st;
    if (r) return r;
    if (call.fin == PKV_FINISH_ERROR || call.fin == PKV_FINISH_CANCELLED)
        return pkv_err(call.status ? call.status : PKV_ERR_INVALID, "%s", call.msg);
    if (call.fin == PKV_FINISH_LENGTH && call.emitted == max && max < n_max) /* a limit, not n_max, ended it */
        return max == by_ctx ? pkv_err(PKV_ERR_INVALID, "spec: the context would hold %lld tokens, more than its "
                                       "limit of %lld", (long long)(n_ctx + 1), (long long)n_ctx)
                             : pkv_err(PKV_ERR_OUT_OF_PAGES, "spec: the target's tokens fill the pool of %lld pages",
                                       (long long)ks.n_pages);
    return PKV_OK;
}
