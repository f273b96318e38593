/* Sampler chain: logit bias, repetition penalty, temperature, top-k, top-p, min-p, seeded draw.
 * See sampler.h for the semantics. Everything runs in preallocated scratch. At most
 * one sort per call: top-k sorts its k survivors (heap selection, O(n log k)); top-p
 * without top-k buckets the candidates by log-probability, takes the buckets above
 * the nucleus boundary whole and sorts only the boundary bucket. */
#include "engine/sampler.h"
#include "engine/grammar.h"

#include "base/base.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    N_BUCKETS = 1024,       /* top-p buckets over [0, BUCKET_SPAN] of -log(p / p_max) */
    BUCKET_MIN_N = 2048,    /* below this many candidates a plain sort is as fast */
};
#define BUCKET_SPAN 40.0 /* beyond e^-40 of the maximum everything shares the last bucket */

typedef struct cand {
    double w;    /* unnormalized probability exp((logit - max) / temp); the max has w = 1 */
    float logit; /* after the repetition penalty */
    int32_t id;
} cand;

struct pkv_sampler {
    pkv_sampler_params par;
    int32_t n_vocab;
    float *work;   /* [n_vocab] logits after the repetition penalty */
    cand *cand;    /* [n_vocab] candidates of the current call */
    int32_t *cnt;  /* [n_vocab] all zero between calls; occurrences in the history */
    int32_t *hist; /* [repeat_last_n] ring of accepted tokens */
    double *mass;  /* [N_BUCKETS] top-p bucket masses */
    pkv_logit_bias *bias; /* [par.n_logit_bias] the params' logit_bias, copied (par.logit_bias points here) */
    int n_hist;    /* valid entries in hist, <= repeat_last_n */
    int hist_next; /* ring slot the next accepted token goes to */
    uint64_t rng[4]; /* xoshiro256** state */
    /* constrained output (pkv_sampler_set_grammar) */
    pkv_gmatch *gm;               /* the grammar's parse state; NULL: unconstrained */
    const pkv_grammar_vocab *gv;
    uint64_t *gmask;              /* [ceil(n_vocab / 64)] allowed tokens of the current state */
    bool gmask_ok;                /* gmask is that of the current state */
    int32_t gbad;                 /* a token accepted that the grammar refused, -1: none */
    uint64_t gmask_n;             /* masks computed, and the seconds they took (bench serve) */
    double gmask_s;
};

pkv_sampler_params pkv_sampler_default_params(void) {
    pkv_sampler_params p = {
        .temp = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .seed = 0,
    };
    return p;
}

/* ---------------------------------------------------------------- PRNG */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t st[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) st[i] = splitmix64(&x);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t st[4]) {
    uint64_t result = rotl64(st[1] * 5, 7) * 9;
    uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl64(st[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_double(uint64_t st[4]) { return (double)(rng_next(st) >> 11) * 0x1.0p-53; }

/* ------------------------------------------------------- create / free */

int32_t pkv_sampler_n_vocab(const pkv_sampler *s) { return s ? s->n_vocab : 0; }

pkv_status pkv_sampler_check_params(const pkv_sampler_params *pp) {
    pkv_sampler_params p = *pp;
    if (isnan(p.temp)) return pkv_err(PKV_ERR_INVALID, "sampler: temp is NaN");
    if (p.top_k < 0) return pkv_err(PKV_ERR_INVALID, "sampler: top_k must be >= 0 (0 = off), got %d", p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        return pkv_err(PKV_ERR_INVALID, "sampler: top_p must be in (0, 1] (1 = off), got %g", (double)p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        return pkv_err(PKV_ERR_INVALID, "sampler: min_p must be in [0, 1] (0 = off), got %g", (double)p.min_p);
    if (!(p.repeat_penalty > 0.0f && isfinite(p.repeat_penalty)))
        return pkv_err(PKV_ERR_INVALID, "sampler: repeat_penalty must be finite and > 0 (1 = off), got %g",
                       (double)p.repeat_penalty);
    if (!isfinite(p.presence_penalty) || !isfinite(p.frequency_penalty))
        return pkv_err(PKV_ERR_INVALID, "sampler: presence_penalty and frequency_penalty must be finite, got %g and %g",
                       (double)p.presence_penalty, (double)p.frequency_penalty);
    if (p.repeat_last_n < 0)
        return pkv_err(PKV_ERR_INVALID, "sampler: repeat_last_n must be >= 0 (0 = off), got %d", p.repeat_last_n);
    if (p.n_logit_bias < 0 || p.n_logit_bias > PKV_SAMPLER_MAX_LOGIT_BIAS || (p.n_logit_bias && !p.logit_bias))
        return pkv_err(PKV_ERR_INVALID, "sampler: logit_bias has %d entries%s (at most %d)", (int)p.n_logit_bias,
                       p.n_logit_bias > 0 && !p.logit_bias ? " but is NULL" : "", PKV_SAMPLER_MAX_LOGIT_BIAS);
    for (int32_t i = 0; i < p.n_logit_bias; i++) {
        const pkv_logit_bias *b = &p.logit_bias[i];
        if (b->token < 0)
            return pkv_err(PKV_ERR_INVALID, "sampler: logit_bias entry %d has token %d (must be >= 0)", (int)i,
                           (int)b->token);
        if (isnan(b->bias) || b->bias == INFINITY)
            return pkv_err(PKV_ERR_INVALID, "sampler: logit_bias entry %d (token %d) has bias %g: it must be finite or "
                           "-infinity (a ban)", (int)i, (int)b->token, (double)b->bias);
    }
    return PKV_OK;
}

pkv_sampler *pkv_sampler_create(pkv_sampler_params p, int32_t n_vocab) {
    if (n_vocab <= 0) {
        pkv_err(PKV_ERR_INVALID, "sampler: n_vocab must be > 0, got %d", (int)n_vocab);
        return NULL;
    }
    if (pkv_sampler_check_params(&p)) return NULL;
    pkv_sampler *s = pkv_calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->par = p;
    s->n_vocab = n_vocab;
    s->work = pkv_calloc((size_t)n_vocab, sizeof *s->work);
    s->cand = pkv_calloc((size_t)n_vocab, sizeof *s->cand);
    s->cnt = pkv_calloc((size_t)n_vocab, sizeof *s->cnt);
    s->hist = pkv_calloc((size_t)p.repeat_last_n, sizeof *s->hist);
    s->mass = pkv_calloc(N_BUCKETS, sizeof *s->mass);
    s->bias = pkv_malloc((size_t)(p.n_logit_bias ? p.n_logit_bias : 1) * sizeof *s->bias);
    if (!s->work || !s->cand || !s->cnt || !s->hist || !s->mass || !s->bias) goto nomem;
    if (p.n_logit_bias) memcpy(s->bias, p.logit_bias, (size_t)p.n_logit_bias * sizeof *s->bias);
    s->par.logit_bias = s->bias;
    int32_t n_banned = 0; /* distinct tokens, counted with cnt (all zero again after) */
    for (int32_t i = 0; i < p.n_logit_bias; i++) {
        int32_t t = s->bias[i].token;
        if (t >= n_vocab) {
            pkv_sampler_free(s);
            pkv_err(PKV_ERR_INVALID, "sampler: logit_bias entry %d has token %d, outside the vocabulary [0, %d)", (int)i,
                    (int)t, (int)n_vocab);
            return NULL;
        }
        if (s->bias[i].bias == -INFINITY && !s->cnt[t]++) n_banned++;
    }
    for (int32_t i = 0; i < p.n_logit_bias; i++) s->cnt[s->bias[i].token] = 0;
    if (n_banned == n_vocab) {
        pkv_sampler_free(s);
        pkv_err(PKV_ERR_INVALID, "sampler: logit_bias bans all %d tokens of the vocabulary", (int)n_vocab);
        return NULL;
    }
    rng_seed(s->rng, p.seed);
    return s;
nomem:
    pkv_sampler_free(s);
    pkv_err(PKV_ERR_NOMEM, "sampler: out of memory for scratch of %d tokens", (int)n_vocab);
    return NULL;
}

void pkv_sampler_free(pkv_sampler *s) {
    if (!s) return;
    pkv_free(s->work);
    pkv_free(s->cand);
    pkv_free(s->cnt);
    pkv_free(s->hist);
    pkv_free(s->mass);
    pkv_free(s->bias);
    pkv_gmatch_free(s->gm);
    pkv_free(s->gmask);
    pkv_free(s);
}

pkv_status pkv_sampler_set_grammar(pkv_sampler *s, const pkv_grammar *g, const pkv_grammar_vocab *v) {
    if (!s) return pkv_err(PKV_ERR_INVALID, "sampler: NULL argument");
    if (!g) {
        pkv_gmatch_free(s->gm);
        pkv_free(s->gmask);
        s->gm = NULL, s->gmask = NULL, s->gv = NULL;
        return PKV_OK;
    }
    if (!v) return pkv_err(PKV_ERR_INVALID, "sampler: a grammar needs a vocabulary (pkv_grammar_vocab_create)");
    if (pkv_grammar_vocab_n(v) != s->n_vocab)
        return pkv_err(PKV_ERR_MISMATCH, "sampler: the grammar's vocabulary has %d tokens, the sampler %d",
                       (int)pkv_grammar_vocab_n(v), (int)s->n_vocab);
    pkv_gmatch *gm = pkv_gmatch_create(g);
    uint64_t *mask = pkv_malloc(((size_t)s->n_vocab + 63) / 64 * sizeof *mask);
    if (!gm || !mask) {
        pkv_gmatch_free(gm);
        pkv_free(mask);
        return pkv_err(PKV_ERR_NOMEM, "sampler: out of memory for the grammar's state");
    }
    pkv_gmatch_free(s->gm);
    pkv_free(s->gmask);
    s->gm = gm, s->gmask = mask, s->gv = v;
    s->gmask_ok = false;
    s->gbad = -1;
    return PKV_OK;
}

bool pkv_sampler_has_grammar(const pkv_sampler *s) { return s && s->gm; }

void pkv_sampler_grammar_cancel(pkv_sampler *s, const atomic_bool *flag) {
    if (s) pkv_gmatch_set_cancel(s->gm, flag);
}

void pkv_sampler_grammar_cost(const pkv_sampler *s, uint64_t *n_masks, double *seconds) {
    *n_masks = s ? s->gmask_n : 0;
    *seconds = s ? s->gmask_s : 0;
}

bool pkv_sampler_grammar_complete(const pkv_sampler *s) { return !s || !s->gm || pkv_gmatch_complete(s->gm); }

/* The sampler's grammar: the constraint of this state, or an error. */
static pkv_status grammar_mask(pkv_sampler *s) {
    const char *why = pkv_gmatch_failure(s->gm);
    if (why) return pkv_err(PKV_ERR_INVALID, "sampler: %s", why);
    if (s->gbad >= 0)
        return pkv_err(PKV_ERR_INVALID, "sampler: token %d was accepted but the grammar does not allow it there",
                       (int)s->gbad);
    if (s->gmask_ok) return PKV_OK;
    const double t0 = pkv_time_now();
    int64_t n = pkv_gmatch_mask(s->gm, s->gv, s->gmask);
    s->gmask_s += pkv_time_now() - t0;
    s->gmask_n++;
    if (n < 0) return pkv_err_prefix(PKV_ERR_INVALID, "sampler");
    if (n == 0)
        return pkv_err(PKV_ERR_INVALID, "sampler: the grammar allows no token here (%s)",
                       pkv_gmatch_complete(s->gm) ? "it is complete but the vocabulary has no end-of-generation token"
                                                  : "no token of the vocabulary continues it");
    s->gmask_ok = true;
    return PKV_OK;
}

void pkv_sampler_accept(pkv_sampler *s, int32_t token) {
    if (!s) return;
    if (s->gm && s->gbad < 0) {
        if (!pkv_gmatch_accept_token(s->gm, s->gv, token)) s->gbad = token;
        s->gmask_ok = false;
    }
    if (s->par.repeat_last_n == 0) return;
    s->hist[s->hist_next] = token;
    s->hist_next = (s->hist_next + 1) % s->par.repeat_last_n;
    if (s->n_hist < s->par.repeat_last_n) s->n_hist++;
}

void pkv_sampler_reset(pkv_sampler *s) {
    if (!s) return;
    s->n_hist = 0;
    s->hist_next = 0;
    rng_seed(s->rng, s->par.seed);
    if (s->gm) {
        pkv_gmatch_reset(s->gm);
        s->gmask_ok = false;
        s->gbad = -1;
    }
}

/* --------------------------------------------------------------- chain */

/* The candidate order: higher logit first, the lower token id on ties. A total order,
 * so selection and sorting give the same result on every libc. */
static bool cand_better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (cand_better(a, b)) return -1;
    if (cand_better(b, a)) return 1;
    return 0;
}

/* Heap with the worst candidate at the root. */
static void heap_sift_down(cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_better(&h[w], &h[l])) w = l;
        if (r < n && cand_better(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Leaves the k best of work[0..n) in out[0..k), sorted best first: O(n log k). */
static void select_top_k(const float *work, int n, int k, cand *out) {
    for (int i = 0; i < k; i++) out[i] = (cand){0, work[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(out, k, i);
    for (int i = k; i < n; i++) {
        cand c = {0, work[i], i};
        if (cand_better(&c, &out[0])) {
            out[0] = c;
            heap_sift_down(out, k, 0);
        }
    }
    for (int end = k - 1; end > 0; end--) { /* heap sort: worst goes to the back */
        cand t = out[0];
        out[0] = out[end];
        out[end] = t;
        heap_sift_down(out, end, 0);
    }
}

/* The smallest prefix of the sorted order of c[0..nc) whose weights sum to >= need:
 * returns its length, with that prefix (in no particular order but a deterministic
 * one) in c[0..len). The bucket of a candidate is monotone in its logit, so every
 * bucket before the boundary bucket is wholly inside the prefix, every one after it
 * wholly outside, and only the boundary bucket needs sorting. */
static int top_p_bucketed(pkv_sampler *s, int nc, double need, float maxl, double inv_t) {
    cand *c = s->cand;
    float minl = maxl;
    for (int j = 0; j < nc; j++)
        if (c[j].logit < minl) minl = c[j].logit;
    double span = ((double)maxl - (double)minl) * inv_t;
    if (span > BUCKET_SPAN) span = BUCKET_SPAN;
    double scale = span > 0 ? inv_t * (N_BUCKETS / span) : 0.0;
#define BUCKET_OF(x)                                                                   \
    (((double)maxl - (double)(x).logit) * scale >= N_BUCKETS - 1                       \
         ? N_BUCKETS - 1                                                               \
         : (int)(((double)maxl - (double)(x).logit) * scale))
    memset(s->mass, 0, N_BUCKETS * sizeof *s->mass);
    for (int j = 0; j < nc; j++) s->mass[BUCKET_OF(c[j])] += c[j].w;
    double cum = 0.0;
    int b = 0;
    for (; b < N_BUCKETS; b++) {
        if (cum + s->mass[b] >= need) break;
        cum += s->mass[b];
    }
    if (b == N_BUCKETS) return nc; /* rounding kept the sum below need: keep all */
    /* three-way partition: [before b][bucket b][after b] */
    int lo = 0, mid = 0, hi = nc;
    while (mid < hi) {
        int bm = BUCKET_OF(c[mid]);
        cand t = c[mid];
        if (bm < b) {
            c[mid++] = c[lo];
            c[lo++] = t;
        } else if (bm == b) {
            mid++;
        } else {
            c[mid] = c[--hi];
            c[hi] = t;
        }
    }
#undef BUCKET_OF
    qsort(c + lo, (size_t)(mid - lo), sizeof *c, cand_cmp);
    for (int j = lo; j < mid; j++) {
        cum += c[j].w;
        if (cum >= need) return j + 1;
    }
    return mid;
}

static pkv_status check_args(const pkv_sampler *s, const float *logits, const void *out) {
    if (!s || !logits || !out) return pkv_err(PKV_ERR_INVALID, "sampler: NULL argument");
    for (int32_t i = 0; i < s->n_vocab; i++) {
        if (!isfinite(logits[i]))
            return pkv_err(PKV_ERR_INVALID, "sampler: logit at index %d is %s", (int)i,
                           isnan(logits[i]) ? "NaN" : "infinite");
    }
    return PKV_OK;
}

/* Copies logits into work, adding the logit bias, then applying the repetition
 * penalty and the presence and frequency penalties, once per distinct token of the
 * history. Results are clamped to finite values, except a ban's -infinity. */
static void apply_penalty(pkv_sampler *s, const float *logits) {
    memcpy(s->work, logits, (size_t)s->n_vocab * sizeof *s->work);
    for (int32_t i = 0; i < s->par.n_logit_bias; i++) {
        int32_t t = s->bias[i].token;
        float v = s->work[t] + s->bias[i].bias;
        if (v > FLT_MAX) v = FLT_MAX;
        if (v < -FLT_MAX && v != -INFINITY) v = -FLT_MAX;
        s->work[t] = v;
    }
    float pen = s->par.repeat_penalty, pres = s->par.presence_penalty, freq = s->par.frequency_penalty;
    if ((pen == 1.0f && pres == 0.0f && freq == 0.0f) || s->n_hist == 0) return;
    for (int j = 0; j < s->n_hist; j++) {
        int32_t t = s->hist[j];
        if (t >= 0 && t < s->n_vocab) s->cnt[t]++;
    }
    for (int j = 0; j < s->n_hist; j++) {
        int32_t t = s->hist[j];
        if (t < 0 || t >= s->n_vocab || s->cnt[t] == 0) continue;
        float v = s->work[t];
        if (v == -INFINITY) { /* banned: stays so */
            s->cnt[t] = 0;
            continue;
        }
        if (pen != 1.0f) v = v > 0.0f ? v / pen : v * pen;
        v -= pres + (float)s->cnt[t] * freq;
        if (v > FLT_MAX) v = FLT_MAX;
        if (v < -FLT_MAX) v = -FLT_MAX;
        s->work[t] = v;
        s->cnt[t] = 0; /* once per distinct token */
    }
}

/* Every token is out: the logit bias banned what the grammar allows (create
 * refuses a bias that bans the whole vocabulary). */
static pkv_status banned_all(void) {
    return pkv_err(PKV_ERR_INVALID, "sampler: logit_bias bans every token the grammar allows here");
}

/* Runs the chain on validated logits: leaves the survivors in s->cand[0..*n_out) with
 * unnormalized weights w summing to *total. */
static pkv_status run_chain(pkv_sampler *s, const float *logits, int *n_out, double *total) {
    const pkv_sampler_params *p = &s->par;
    int n = (int)s->n_vocab;
    apply_penalty(s, logits);
    if (s->gm) { /* constrained: disallowed tokens leave before every filter */
        const uint64_t *mk = s->gmask;
        for (int w = 0; w < (n + 63) / 64; w++) {
            uint64_t b = mk[w];
            if (b == ~0ull) continue;
            int hi = PKV_MIN(n, 64 * w + 64);
            for (int i = 64 * w; i < hi; i++)
                if (!(b >> (i & 63) & 1)) s->work[i] = -INFINITY;
        }
    }
    const float *work = s->work;
    cand *c = s->cand;

    if (p->temp <= 0.0f) { /* greedy: the lowest index among the maxima */
        int best = 0;
        for (int i = 1; i < n; i++)
            if (work[i] > work[best]) best = i;
        if (work[best] == -INFINITY) return banned_all();
        c[0] = (cand){1.0, work[best], best};
        *n_out = 1;
        *total = 1.0;
        return PKV_OK;
    }

    int nc;
    bool sorted;
    float maxl;
    if (p->top_k > 0 && p->top_k < n) {
        select_top_k(work, n, p->top_k, c);
        nc = p->top_k;
        sorted = true;
        maxl = c[0].logit;
        if (maxl == -INFINITY) return banned_all();
        /* fewer allowed tokens (grammar, bans) than k: the rest are -inf */
        while (nc > 1 && c[nc - 1].logit == -INFINITY) nc--;
    } else if (s->gm || s->par.n_logit_bias) { /* only the allowed tokens: a ban's or mask's -inf never drawn */
        nc = 0;
        maxl = -INFINITY;
        for (int i = 0; i < n; i++) {
            if (work[i] == -INFINITY) continue;
            c[nc++] = (cand){0, work[i], i};
            if (work[i] > maxl) maxl = work[i];
        }
        sorted = false;
        if (!nc) return banned_all();
    } else {
        maxl = work[0];
        for (int i = 0; i < n; i++) {
            c[i] = (cand){0, work[i], i};
            if (work[i] > maxl) maxl = work[i];
        }
        nc = n;
        sorted = false;
    }

    /* Differences are taken in double so that a tiny temperature cannot overflow. */
    double inv_t = 1.0 / (double)p->temp, z = 0.0;
    for (int j = 0; j < nc; j++) {
        c[j].w = exp(((double)c[j].logit - (double)maxl) * inv_t);
        z += c[j].w;
    }

    /* min-p before top-p: both keep a prefix of the sorted order, so the result is the
     * shorter prefix whichever runs first, and doing min-p first (it needs no sort)
     * shrinks what top-p sorts. top-p still normalizes over the top-k set (z). In
     * weights, p_max corresponds to w = 1. */
    if (p->min_p > 0.0f) {
        int m = 0;
        for (int j = 0; j < nc; j++)
            if (c[j].w >= (double)p->min_p) c[m++] = c[j];
        nc = m; /* the maximum has w = 1 >= min_p, so m >= 1 */
    }
    if (p->top_p < 1.0f && !sorted && nc >= BUCKET_MIN_N) {
        nc = top_p_bucketed(s, nc, (double)p->top_p * z, maxl, inv_t);
    } else if (p->top_p < 1.0f) {
        if (!sorted) qsort(c, (size_t)nc, sizeof *c, cand_cmp);
        double need = (double)p->top_p * z, cum = 0.0;
        for (int j = 0; j < nc; j++) {
            cum += c[j].w;
            if (cum >= need) {
                nc = j + 1;
                break;
            }
        }
    }
    double sum = 0.0;
    for (int j = 0; j < nc; j++) sum += c[j].w;
    *n_out = nc;
    *total = sum;
    return PKV_OK;
}

pkv_status pkv_sampler_sample(pkv_sampler *s, const float *logits, int32_t *out_token) {
    pkv_status st = check_args(s, logits, out_token);
    if (st == PKV_OK && s->gm) st = grammar_mask(s);
    if (st != PKV_OK) return st;
    int nc;
    double total;
    if ((st = run_chain(s, logits, &nc, &total))) return st;
    if (nc == 1) { /* one draw per non-greedy call even so: the stream follows the call count */
        if (s->par.temp > 0.0f) (void)rng_next(s->rng);
        *out_token = s->cand[0].id;
        return PKV_OK;
    }
    double u = rng_double(s->rng) * total, acc = 0.0;
    for (int j = 0; j < nc; j++) {
        acc += s->cand[j].w;
        if (u < acc) {
            *out_token = s->cand[j].id;
            return PKV_OK;
        }
    }
    *out_token = s->cand[nc - 1].id; /* u rounded up to total */
    return PKV_OK;
}

pkv_status pkv_sampler_probs(pkv_sampler *s, const float *logits, float *probs) {
    pkv_status st = check_args(s, logits, probs);
    if (st == PKV_OK && s->gm) st = grammar_mask(s);
    if (st != PKV_OK) return st;
    int nc;
    double total;
    if ((st = run_chain(s, logits, &nc, &total))) return st;
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    for (int j = 0; j < nc; j++) probs[s->cand[j].id] = (float)(s->cand[j].w / total);
    return PKV_OK;
}

double pkv_sampler_uniform(pkv_sampler *s) { return rng_double(s->rng); }

pkv_status pkv_sampler_draw(pkv_sampler *s, const float *weights, int32_t *out_token) {
    if (!s || !weights || !out_token) return pkv_err(PKV_ERR_INVALID, "sampler: NULL argument");
    double total = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        if (!(weights[i] >= 0.0f) || !isfinite(weights[i]))
            return pkv_err(PKV_ERR_INVALID, "sampler: weight at index %d is %g (must be finite and >= 0)", (int)i,
                           (double)weights[i]);
        total += weights[i];
        if (weights[i] > 0.0f) last = i;
    }
    if (last < 0) return pkv_err(PKV_ERR_INVALID, "sampler: all %d weights are zero", (int)s->n_vocab);
    double u = rng_double(s->rng) * total, acc = 0.0;
    for (int32_t i = 0; i < last; i++) {
        acc += weights[i];
        if (u < acc) {
            *out_token = i;
            return PKV_OK;
        }
    }
    *out_token = last;
    return PKV_OK;
}

pkv_status pkv_sampler_spec_propose(pkv_sampler *s, const float *draft_logits, float *q, int32_t *out_token) {
    pkv_status st = pkv_sampler_probs(s, draft_logits, q);
    return st ? st : pkv_sampler_draw(s, q, out_token);
}

pkv_status pkv_sampler_spec_verify(pkv_sampler *s, const float *logits, const float *q, int32_t d, float *p,
                                   bool *accepted, int32_t *out_token) {
    if (!q || !accepted || !out_token) return pkv_err(PKV_ERR_INVALID, "sampler: NULL argument");
    pkv_status st = pkv_sampler_probs(s, logits, p);
    if (st) return st;
    if (d < 0 || d >= s->n_vocab) return pkv_err(PKV_ERR_INVALID, "sampler: proposal %d outside [0, %d)", (int)d, (int)s->n_vocab);
    double u = rng_double(s->rng);
    if (u * (double)q[d] < (double)p[d]) {
        *accepted = true;
        *out_token = d;
        return PKV_OK;
    }
    bool any = false;
    for (int32_t t = 0; t < s->n_vocab; t++) {
        float w = p[t] - q[t];
        p[t] = w > 0 ? w : 0;
        any |= w > 0;
    }
    if (!any && (st = pkv_sampler_probs(s, logits, p))) return st; /* p == q up to rounding */
    if ((st = pkv_sampler_draw(s, p, out_token))) return st;
    *accepted = false;
    return PKV_OK;
}
