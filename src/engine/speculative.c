/* Speculative decoding: a draft proposes, the target verifies K tokens in one
 * batched step, rejected tokens are truncated away. See docs/speculative.md.
 *
 * State between rounds. `ctoks` holds every committed token (the target's
 * tokens plus the ones emitted since). The target has decoded all of them but
 * the last emitted one (`pending`), exactly as pkv_generate leaves a context;
 * only the very first round has nothing pending and verifies its first
 * proposal against the target's current logits (saved in p0). A round:
 *   1. the draft catches up with ctoks and proposes d_1..d_K, each drawn from
 *      q_i = the sampler chain over the draft's logits;
 *   2. the target decodes [pending] + d_1..d_K in ONE step (decode_all), giving
 *      row(i) = its logits after d_1..d_i;
 *   3. for i = 0..K-1: p = chain(row(i)); accept d_{i+1} if u * q(d) < p(d),
 *      else draw the correction from max(0, p - q) and stop; if all K were
 *      accepted draw a bonus token from row(K);
 *   4. the target keeps ctoks minus the new last token (truncate) with the
 *      logits row of its new last token; the draft rolls back lazily at its
 *      next catch-up (own cache: truncate to the common prefix; shared KV:
 *      re-fork the target's sequence).
 * An MTP head (pkv_model_params.mtp) is an own-cache draft fed two rows per token:
 * its embedding and the hidden state of the previous position, the target's where
 * the target decoded that position (kept by pkv_context_keep_hidden), else the
 * head's own from its previous draft step (llama.cpp's MTP drafting). Its rows
 * computed from its own hidden states are redone from the target's at the next
 * catch-up, so its cache always holds what the target's states give.
 *
 * Gemma 4's assistant (info.assistant) has no cache and appends nothing: each round
 * it forks the target's sequence (to read its pages) and drafts with
 * pkv_context_draft_step, every step a query at the position after the target's last
 * token: step 0 fed the pending token and the target's hidden state of its last
 * token, step i the proposal d_i and the assistant's own next hidden state of step
 * i - 1 (llama.cpp's Gemma 4 MTP drafting). With nothing pending (the first round)
 * it drafts from the target's last token as if it were pending (assistant_draft). */
#include <string.h>

#include "base/base.h"
#include "engine/engine.h"
#include "engine/sampler.h"

enum { SPEC_MAX_DRAFT = 64 };

struct pkv_spec {
    pkv_context *target;
    pkv_model *draft;
    bool shared;          /* the draft attends over the target's cache */
    int K;                /* draft_max */
    void (*on_round)(const pkv_spec_round *r, void *user);
    void *round_user;
    int32_t V;            /* vocabulary size of both */
    pkv_kv_cache *dcache; /* own-cache draft: its cache; NULL when shared */
    pkv_context *dctx;    /* the draft's context */
    int32_t *dtoks;       /* own-cache draft: host mirror of the tokens in dctx [n_dtoks] */
    int64_t n_dtoks;
    size_t cap_dtoks;
    int32_t *ctoks;       /* committed tokens [cap_ctoks] */
    size_t cap_ctoks;
    float *all;           /* f32 [K + 1][V]: the target's rows of one step */
    float *q;             /* f32 [K][V]: the draft's distributions of one round */
    float *p;             /* f32 [V]: the target's distribution (then the residual) */
    float *p0;            /* f32 [V]: target logits when nothing is pending */
    /* MTP head: hidden-state rows in and out of one draft step [cap_h][n_embd], the
     * head's last output row, and how many leading draft rows came from the
     * target's states */
    bool mtp;
    int64_t E;
    float *hin, *hout, *hlast;
    size_t cap_h;
    int64_t n_true;
    /* Gemma 4's assistant: the hidden state in and out of a step [2][n_embd] */
    bool asst;
    float *ah;
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
    pkv_context_free(s->dctx);
    pkv_kv_cache_free(s->dcache);
    pkv_free(s->dtoks);
    pkv_free(s->hin);
    pkv_free(s->hout);
    pkv_free(s->ah);
    pkv_free(s->ctoks);
    pkv_free(s->all);
    pkv_free(s->q);
    pkv_free(s->p);
    pkv_free(s->p0);
    pkv_free(s);
}

pkv_context *pkv_spec_draft_context(pkv_spec *s) { return s ? s->dctx : NULL; }

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
    if (ti.n_vocab != di.n_vocab && !di.assistant) { /* an assistant's attach says it, naming both files */
        pkv_err(PKV_ERR_MISMATCH, "spec: the draft has a vocabulary of %d tokens, the target %d: a draft needs the "
                                  "target's vocabulary (pagekv mkmodel --draft-of makes one)",
                di.n_vocab, ti.n_vocab);
        return NULL;
    }
    pkv_spec *s = pkv_calloc(1, sizeof *s);
    if (!s) {
        pkv_err(PKV_ERR_NOMEM, "spec: out of memory");
        return NULL;
    }
    s->target = target;
    s->draft = draft;
    s->shared = di.shared_kv;
    s->K = K;
    s->on_round = p.on_round;
    s->round_user = p.round_user;
    s->V = ti.n_vocab;
    s->mtp = di.mtp;
    s->E = ti.n_embd;
    if (s->mtp && (di.n_embd != ti.n_embd || s->shared)) {
        pkv_err(PKV_ERR_MISMATCH, "spec: the MTP head's width %d differs from the target's %d", di.n_embd, ti.n_embd);
        goto fail;
    }
    if (s->mtp && pkv_context_keep_hidden(target)) goto fail;
    size_t V = (size_t)s->V;
    s->asst = di.assistant;
    if (s->asst) { /* pkv_context_attach checks that it is the target's (width, vocabulary, layers, devices) */
        if (pkv_context_keep_hidden(target) || !(s->dctx = pkv_context_attach(draft, target)) ||
            pkv_context_truncate(s->dctx, 0))
            goto fail;
        if (!(s->ah = pkv_malloc(2 * (size_t)ti.n_embd * sizeof *s->ah))) {
            pkv_err(PKV_ERR_NOMEM, "spec: out of memory");
            goto fail;
        }
    } else if (s->shared) {
        s->dctx = pkv_context_attach(draft, target); /* the I6 check */
        /* it re-forks every round: hold no pages until then */
        if (!s->dctx || pkv_context_truncate(s->dctx, 0)) goto fail;
    } else {
        pkv_cache_params cp = p.draft_cache;
        int64_t n_ctx = pkv_context_n_ctx(target);
        if (!cp.n_ctx) cp.n_ctx = (int)n_ctx;
        if (!cp.n_seq_max) cp.n_seq_max = 1;
        if (!(s->dcache = pkv_model_cache_create(draft, cp))) goto fail;
        if (!(s->dctx = pkv_context_create(draft, s->dcache, PKV_MIN(n_ctx, (int64_t)cp.n_ctx)))) goto fail;
    }
    s->all = pkv_malloc((size_t)(K + 1) * V * sizeof(float));
    s->q = pkv_malloc((size_t)K * V * sizeof(float));
    s->p = pkv_malloc(V * sizeof(float));
    s->p0 = pkv_malloc(V * sizeof(float));
    if (!s->all || !s->q || !s->p || !s->p0) {
        pkv_err(PKV_ERR_NOMEM, "spec: out of memory for %d rows of %d logits", 2 * K + 3, s->V);
        goto fail;
    }
    return s;
fail:
    pkv_spec_free(s);
    return NULL;
}

/* An MTP head's input rows for draft tokens [n_dtoks, n_dtoks + n): catching up,
 * the target's hidden state of the previous position (zero before the first
 * token); proposing (drafting), the head's own last output, as llama.cpp drafts
 * (also where the target's state exists: its first round). */
static pkv_status mtp_rows(pkv_spec *s, int64_t n, bool drafting) {
    const size_t E = (size_t)s->E;
    if ((size_t)n + 1 > s->cap_h) {
        size_t cap = (size_t)n + 1 > 2 * s->cap_h ? (size_t)n + 1 : 2 * s->cap_h;
        float *a = pkv_malloc(cap * E * sizeof *a), *b = pkv_malloc((cap + 1) * E * sizeof *b);
        if (!a || !b) {
            pkv_free(a), pkv_free(b);
            return pkv_err(PKV_ERR_NOMEM, "spec: MTP rows of %lld tokens", (long long)n);
        }
        if (s->hout) memcpy(b + cap * E, s->hlast, E * sizeof *b); /* keep the last output */
        else memset(b + cap * E, 0, E * sizeof *b);
        pkv_free(s->hin), pkv_free(s->hout);
        s->hin = a, s->hout = b, s->hlast = b + cap * E, s->cap_h = cap;
    }
    const int64_t have = pkv_context_n_tokens(s->target);
    for (int64_t k = 0; k < n; k++) {
        int64_t prev = s->n_dtoks + k - 1;
        const bool own = drafting || prev >= have;
        const float *h = own ? s->hlast : prev < 0 ? NULL : pkv_context_hidden(s->target, prev);
        if (h) memcpy(s->hin + (size_t)k * E, h, E * sizeof(float));
        else memset(s->hin + (size_t)k * E, 0, E * sizeof(float));
        if (!own && s->n_true == s->n_dtoks + k) s->n_true++; /* still from the target's states */
    }
    return PKV_OK;
}

/* Decode n tokens in the own-cache draft, mirroring them on the host; drafting:
 * proposals (an MTP head then feeds itself its own hidden state). */
static pkv_status draft_decode(pkv_spec *s, const int32_t *toks, int64_t n, bool drafting, pkv_spec_stats *st) {
    if (!s->shared) {
        void *d = s->dtoks;
        pkv_status g = pkv_grow(&d, &s->cap_dtoks, (size_t)(s->n_dtoks + n), sizeof(int32_t));
        if (g) return g;
        s->dtoks = d;
    }
    pkv_status r;
    if (s->mtp) {
        int64_t n_true = s->n_true;
        if ((r = mtp_rows(s, n, drafting)) || (r = pkv_context_decode_mtp(s->dctx, toks, (int32_t)n, s->hin, s->hout))) {
            s->n_true = n_true;
            return r;
        }
        memcpy(s->hlast, s->hout + (size_t)(n - 1) * (size_t)s->E, (size_t)s->E * sizeof(float));
    } else if ((r = pkv_context_decode(s->dctx, toks, (int32_t)n))) {
        return r;
    }
    st->draft_steps++;
    if (!s->shared) {
        memcpy(s->dtoks + s->n_dtoks, toks, (size_t)n * sizeof *toks);
        s->n_dtoks += n;
    }
    return PKV_OK;
}

/* Bring the draft to hold exactly toks[0..n) (n >= 1) with logits. Own cache:
 * keep the common prefix, decode the rest in one step. Shared KV: fork the
 * target's sequence (all of toks but the last `pending` ones) and decode those. */
static pkv_status draft_catch_up(pkv_spec *s, const int32_t *toks, int64_t n, int pending, pkv_spec_stats *st) {
    pkv_status r;
    if (s->shared) {
        if ((r = pkv_context_reattach(s->dctx, s->target))) return r;
        if (!pending) { /* re-decode the target's last token for the draft's own logits */
            if ((r = pkv_context_truncate(s->dctx, n - 1))) return r;
            pending = 1;
        }
        return draft_decode(s, toks + n - pending, pending, false, st);
    }
    int64_t L = 0, nd = s->n_dtoks;
    while (L < nd && L < n && s->dtoks[L] == toks[L]) L++;
    if (s->mtp && L > s->n_true) L = s->n_true; /* rows made from the head's own states are redone */
    if (L == n && nd == n && pkv_context_logits(s->dctx)) return PKV_OK;
    if (L == n) L = n - 1; /* everything is there but the logits: decode the last token again */
    if (L < nd) {
        if ((r = pkv_context_truncate(s->dctx, L))) return r;
        s->n_dtoks = L;
        if (s->n_true > L) s->n_true = L;
    }
    return draft_decode(s, toks + L, n - L, false, st);
}

/* Gemma 4's assistant proposes D[0..K) after the last committed token `last`,
 * reading the target's pages through a fork it gives back after. pending: `last` is
 * not in the target's cache, and the assistant starts from the target's hidden state
 * of its last token; else (the first round) `last` is the target's last token, and
 * the fork drops it so the assistant starts as if it were pending, from the state
 * before it (llama.cpp's first round, whose target has not decoded the prompt's last
 * token yet). */
static pkv_status assistant_draft(pkv_spec *s, int32_t last, bool pending, int K, int32_t *D, pkv_sampler *smp,
                                  pkv_spec_stats *st) {
    const size_t V = (size_t)s->V, E = (size_t)s->E;
    const int64_t n = pkv_context_n_tokens(s->target) - (pending ? 0 : 1);
    const float *h = pkv_context_hidden(s->target, n - 1);
    if (!h) return pkv_err(PKV_ERR_INVALID, "spec: the target kept no hidden state of its token %lld for the assistant "
                           "(create the pkv_spec before decoding the prompt)", (long long)(n - 1));
    memcpy(s->ah, h, E * sizeof *s->ah);
    pkv_status r = pkv_context_reattach(s->dctx, s->target);
    if (!r && !pending) r = pkv_context_truncate(s->dctx, n);
    int32_t tok = last;
    for (int i = 0; !r && i < K; i++) {
        float *hin = s->ah + (size_t)(i % 2) * E, *hout = s->ah + (size_t)((i + 1) % 2) * E, *qi = s->q + (size_t)i * V;
        if ((r = pkv_context_draft_step(s->dctx, &tok, 1, hin, hout))) break;
        st->draft_steps++;
        if ((r = pkv_sampler_spec_propose(smp, pkv_context_logits(s->dctx), qi, &D[i]))) break;
        st->drafted++;
        tok = D[i];
    }
    pkv_status r2 = pkv_context_truncate(s->dctx, 0); /* its pages back before the target needs some */
    return r ? r : r2;
}

typedef struct {
    pkv_sampler *smp;
    pkv_token_fn on_token;
    void *user;
    const pkv_model *m;
    int n_max, emitted;
} emitter;

/* Commit one token; true when generation stops after it. */
static bool emit(emitter *e, pkv_spec *s, int64_t *nc, int32_t tok, pkv_spec_stats *st) {
    pkv_sampler_accept(e->smp, tok);
    s->ctoks[(*nc)++] = tok;
    e->emitted++;
    st->n_tokens++;
    bool go = e->on_token ? e->on_token(tok, e->user) : true;
    return !go || pkv_model_is_eog(e->m, tok) || e->emitted == e->n_max;
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
    const float *lg0 = pkv_context_logits(tg);
    if (!lg0) return pkv_err(PKV_ERR_INVALID, "spec: the target context has no logits (decode a prompt first)");
    const size_t V = (size_t)s->V;
    int64_t base = pkv_context_n_tokens(tg), n_ctx = pkv_context_n_ctx(tg);
    void *ct = s->ctoks;
    pkv_status r = pkv_grow(&ct, &s->cap_ctoks, (size_t)base + (size_t)n_max + 1, sizeof(int32_t));
    if (r) return r;
    s->ctoks = ct;
    if ((r = pkv_context_tokens(tg, 0, base, s->ctoks))) return r;
    for (int64_t i = 0; i < base; i++)
        if (s->ctoks[i] < 0)
            return pkv_err(PKV_ERR_UNSUPPORTED, "spec: token %lld of the target context %s: the draft cannot follow it",
                           (long long)i, pkv_token_is_media(s->ctoks[i]) ? "is a media row (a draft takes no media rows)"
                                                                          : "has no id (appended without ids)");
    memcpy(s->p0, lg0, V * sizeof(float));
    emitter e = {smp, on_token, user, pkv_context_model(tg), n_max, 0};
    int64_t nc = base; /* committed tokens */
    int pending = 0;   /* the last committed token is not decoded in the target */
    bool stop = false;
    while (!stop) {
        int64_t room = n_ctx - base - pending;
        int K = (int)PKV_MIN((int64_t)PKV_MIN(s->K, n_max - e.emitted - 1), PKV_MAX(room, 0));
        int32_t D[SPEC_MAX_DRAFT], B[SPEC_MAX_DRAFT + 1];
        const int64_t from = nc - 1, acc0 = st.accepted;
        st.rounds++;
        if (s->asst && !pending && nc < 2) K = 0; /* nothing for the assistant to start from */
        /* 1. proposals */
        if (K > 0 && s->asst) {
            if ((r = assistant_draft(s, s->ctoks[nc - 1], pending, K, D, smp, &st))) goto out;
        } else if (K > 0) {
            if ((r = draft_catch_up(s, s->ctoks, nc, pending, &st))) goto out;
            for (int i = 0; i < K; i++) {
                float *qi = s->q + (size_t)i * V;
                if ((r = pkv_sampler_spec_propose(smp, pkv_context_logits(s->dctx), qi, &D[i]))) goto out;
                st.drafted++;
                if (i + 1 < K && (r = draft_decode(s, &D[i], 1, true, &st))) goto out;
            }
            /* a shared-KV draft gives its pages back before the target needs some */
            if (s->shared && (r = pkv_context_truncate(s->dctx, 0))) goto out;
        }
        /* 2. one target step over [pending] + proposals */
        int nb = pending + K;
        if (pending) B[0] = s->ctoks[nc - 1];
        memcpy(B + pending, D, (size_t)K * sizeof *D);
        if (nb > 0) {
            if ((r = pkv_context_decode_all(tg, B, nb, s->all))) goto out;
            st.target_steps++;
        }
#define ROW(i) (pending ? s->all + (size_t)(i)*V : (i) == 0 ? s->p0 : s->all + (size_t)((i)-1) * V)
        /* 3. verify */
        int j = 0, i = 0;
        int32_t y = -1;
        for (; i < K && !stop; i++) {
            bool acc;
            if ((r = pkv_sampler_spec_verify(smp, ROW(i), s->q + (size_t)i * V, D[i], s->p, &acc, &y))) goto out;
            if (acc) {
                st.accepted++;
                j++;
                stop = emit(&e, s, &nc, y, &st);
                y = -1;
                continue;
            }
            break;
        }
        if (!stop) {
            if (y < 0 && (r = pkv_sampler_sample(smp, ROW(K), &y))) goto out; /* all accepted: the bonus token */
            j++;
            stop = emit(&e, s, &nc, y, &st);
        }
        if (s->on_round) {
            pkv_spec_round rd = {.pos = from, .proposed = D, .n_proposed = K, .n_accepted = (int)(st.accepted - acc0)};
            s->on_round(&rd, s->round_user);
        }
        /* 4. the target keeps all committed tokens but the newest (j emitted this round) */
        int64_t keep = base + pending + j - 1;
        if (keep < base + nb) {
            if ((r = pkv_context_truncate(tg, keep))) goto out;
            pkv_context_set_logits(tg, ROW(j - 1));
        }
#undef ROW
        base = keep;
        pending = 1;
    }
out:
    if (stats) *stats = st;
    return r;
}
