/* Gemma 4's assistant as a speculative draft, on a pair of devices (test-model-
 * gemma4-assistant on CPU devices, test-assistant-vulkan with vulkan:0): greedy
 * output with the assistant equals plain greedy output token by token, and the
 * assistant's proposals are the same on every placement and llama.cpp's. */
#ifndef PKV_ASSISTANT_TESTLIB_H
#define PKV_ASSISTANT_TESTLIB_H

#include <stdlib.h>
#include <string.h>

#include "pagekv.h"
#include "testhelp.h"

enum { AT_V = 320, AT_NP = 21, AT_NG = 28, AT_K = 3, AT_MAXR = 64 };

/* mkmodel's gemma4 (64 wide, 6 layers "fssfsf", the last two sharing KV, 8 heads;
 * KV heads 4 of 32 on sliding layers, 2 of 64 on full ones; window 8) and its
 * assistant (48 wide, 3 layers "ssf", 8 heads), f32, written under PKV_TEST_TMP. */
static inline bool at_files(const char *tag, char *tpath, char *apath, size_t n) {
    char name[96];
    snprintf(name, sizeof name, "%s-asst", tag);
    snprintf(tpath, n, "%s", th_tmp(tag));
    snprintf(apath, n, "%s", th_tmp(name));
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "gemma4";
    p.type = PKV_TYPE_F32;
    p.n_embd = 64;
    p.n_ff = 96;
    p.n_vocab = AT_V;
    p.swa_layers = "fssfsf";
    p.seed = 7;
    if (pkv_mkmodel_write(&p, tpath)) return false;
    pkv_mkmodel_params a = pkv_mkmodel_default_params();
    a.arch = "gemma4-assistant";
    a.type = PKV_TYPE_F32;
    a.draft_of = tpath;
    a.n_layer = 3;
    a.n_embd = 48;
    a.n_ff = 80;
    a.swa_layers = "ssf";
    a.seed = 11;
    return pkv_mkmodel_write(&a, apath) == PKV_OK;
}

static inline int32_t at_tok(int i) { return (int32_t)((i * 61 + 5) % AT_V); }

typedef struct at_out {
    int32_t tok[AT_NG + 8];
    int n;
} at_out;

static inline bool at_collect(int32_t t, void *user) {
    at_out *o = user;
    if (o->n < AT_NG + 8) o->tok[o->n++] = t;
    return true;
}

typedef struct at_rounds {
    int n;
    int64_t pos[AT_MAXR];
    int32_t prop[AT_MAXR][AT_K];
    int n_prop[AT_MAXR];
    int n_acc[AT_MAXR];
    int accepted;
} at_rounds;

static inline void at_on_round(const pkv_spec_round *r, void *user) {
    at_rounds *R = user;
    if (R->n >= AT_MAXR) return;
    R->pos[R->n] = r->pos;
    R->n_prop[R->n] = r->n_proposed;
    for (int i = 0; i < r->n_proposed && i < AT_K; i++) R->prop[R->n][i] = r->proposed[i];
    R->n_acc[R->n] = r->n_accepted;
    R->accepted += r->n_accepted;
    R->n++;
}

/* One placement: the target on tdevs (one device, or a comma list: tensor
 * parallelism), its cache on the host with kv_on_host, the assistant on adev (NULL:
 * the target's first device handle). Plain greedy and greedy with the assistant,
 * each from a fresh context over AT_NP prompt tokens: at_tok's, the last one `last`.
 * Returns 0, or 1 on a failure (reported). */
static inline int at_pair(const char *tpath, const char *apath, const char *tdevs, bool kv_on_host, const char *adev,
                          int32_t last, at_out *plain, at_out *spec, at_rounds *rounds) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    if (strchr(tdevs, ',')) mp.devices = tdevs;
    else mp.device = tdevs;
    mp.kv_on_host = kv_on_host;
    pkv_model *m = pkv_model_load(tpath, mp);
    if (!m) {
        fprintf(stderr, "FAIL target on %s: %s\n", tdevs, pkv_errmsg());
        return 1;
    }
    pkv_model_params dp = pkv_model_default_params();
    dp.n_threads = 2;
    if (adev) dp.device = adev;
    else dp.device_handle = pkv_model_device(m);
    pkv_model *a = pkv_model_load(apath, dp);
    if (!a) {
        fprintf(stderr, "FAIL assistant on %s: %s\n", adev, pkv_errmsg());
        pkv_model_free(m);
        return 1;
    }
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    cp.page_size = 4;
    cp.kv_type = PKV_TYPE_F32;
    cp.n_seq_max = 4;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    int32_t prompt[AT_NP];
    for (int i = 0; i < AT_NP; i++) prompt[i] = at_tok(i);
    prompt[AT_NP - 1] = last;
    pkv_sampler_params gp = pkv_sampler_default_params();
    gp.temp = 0;
    int rc = 1;
    pkv_context *p0 = c ? pkv_context_create(m, c, 128) : NULL;
    pkv_sampler *smp = pkv_sampler_create(gp, AT_V);
    if (!p0 || !smp || pkv_context_decode(p0, prompt, AT_NP) || pkv_generate(p0, smp, AT_NG, at_collect, plain, NULL)) {
        fprintf(stderr, "FAIL plain on %s: %s\n", tdevs, pkv_errmsg());
        goto out;
    }
    pkv_context_free(p0);
    p0 = NULL;
    pkv_sampler_free(smp);
    smp = pkv_sampler_create(gp, AT_V);
    pkv_context *t = pkv_context_create(m, c, 128);
    pkv_spec_params sp = pkv_spec_default_params();
    sp.draft_max = AT_K;
    sp.on_round = at_on_round;
    sp.round_user = rounds;
    pkv_spec *s = t ? pkv_spec_create(t, a, sp) : NULL; /* before the prompt: the target keeps its hidden states */
    pkv_spec_stats st;
    if (!s || pkv_context_decode(t, prompt, AT_NP) || pkv_spec_generate(s, smp, AT_NG, at_collect, spec, &st)) {
        fprintf(stderr, "FAIL spec on %s%s + assistant on %s: %s\n", tdevs, kv_on_host ? " (KV on host)" : "",
                adev ? adev : tdevs, pkv_errmsg());
    } else {
        rc = 0;
        fprintf(stderr, "target %s%s, assistant %s: %d tokens, %lld drafted, %lld accepted, %lld target steps\n", tdevs,
                kv_on_host ? " (KV on host)" : "", adev ? adev : "(the target's)", spec->n, (long long)st.drafted,
                (long long)st.accepted, (long long)st.target_steps);
    }
    pkv_spec_free(s);
    pkv_context_free(t);
out:
    pkv_context_free(p0);
    pkv_sampler_free(smp);
    pkv_kv_cache_free(c);
    pkv_model_free(a);
    pkv_model_free(m);
    return rc;
}

/* llama.cpp's proposals on the same files (issue 43 item 3): node-llama-cpp 3.22.1's
 * source, llama-speculative-simple built on CPU and given at_tok's prompt as token ids
 * (a local edit of the example: the ids instead of tokenizing -p), run as
 *   llama-speculative-simple -m T -md A --spec-type draft-mtp --spec-draft-n-max 3
 *       -n 28 --temp 0 --top-k 1 -c 256 -lv 5
 * on at_files' T and A; its "draft candidate" lines give each round's proposals (top
 * candidate) and their probabilities, one round per committed position from the
 * prompt's last token (20) on, and every committed token was 265. Where its top two
 * candidates were within 0.02 of probability (a near tie, bit set in at_ll_tie) the
 * position is not pinned: 77 of the 84 below are (73 of the 81 pagekv proposes, whose
 * last rounds the budget of AT_NG tokens cuts short). */
static const int32_t at_ll_prop[AT_NG][AT_K] = {
    {203, 213, 232}, {203, 271, 27}, {203, 271, 27}, {57, 237, 119}, {57, 298, 3},    {203, 271, 133}, {203, 75, 261},
    {203, 271, 27},  {203, 271, 27}, {203, 75, 246}, {203, 75, 246}, {203, 271, 27},  {203, 84, 138},  {203, 75, 246},
    {203, 75, 60},   {203, 75, 246}, {203, 75, 246}, {203, 84, 138}, {203, 84, 138},  {203, 84, 138},  {203, 84, 138},
    {203, 84, 32},   {203, 84, 138}, {203, 271, 138}, {203, 271, 138}, {203, 271, 32}, {203, 271, 27},  {203, 271, 64}};
static const unsigned char at_ll_tie[AT_NG] = {0, 2, 0, 0, 0, 0, 0, 0, 2, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 4, 0, 4, 4, 0};
enum { AT_LL_POS0 = AT_NP - 1, AT_LL_TOKEN = 265 };

/* The rounds against llama.cpp's (above): every pinned proposal the same, at the
 * same position. */
static inline void at_check_llama(const at_rounds *got) {
    int pinned = 0, same = 0;
    CHECK(got->n >= AT_NG - 2);
    for (int r = 0; r < got->n && r < AT_NG; r++) {
        CHECK_INT(got->pos[r], AT_LL_POS0 + r);
        for (int j = 0; j < got->n_prop[r] && j < AT_K; j++) {
            if (at_ll_tie[r] >> j & 1) continue;
            pinned++;
            if (got->prop[r][j] == at_ll_prop[r][j]) same++;
            else
                TH_FAIL("round %d (pos %lld) proposal %d: %d, llama.cpp proposed %d", r, (long long)got->pos[r], j,
                        got->prop[r][j], at_ll_prop[r][j]);
        }
    }
    printf("assistant proposals as llama.cpp's: %d of %d pinned positions\n", same, pinned);
    CHECK(pinned >= 70);
}

/* A second prompt on the same files, whose rounds accept proposals (the first's
 * accept none): at_tok's with the last token 221. The target's greedy output is
 * 221 x 6, 58 x 5, 39 x 5, 288 x 12; the rounds at positions 27 and 29 each keep
 * their first proposal (58), so the rounds after them must start from the target's
 * hidden state of that accepted proposal (llama.cpp's accept(): the verification
 * row of the last accepted token), not of the token before it. llama.cpp's rounds
 * come from the same build and command as at_ll_prop's (PROMPT_IDS ending in 221;
 * the same with f32 KV and -fa off), one round per line of "accepted N/3 draft
 * tokens"; near ties (< 0.02) in at_ll2_tie. pagekv's last two rounds propose 2 and
 * 1 tokens (the budget), and it has no 27th round. */
enum { AT_LL2_LAST = 221, AT_LL2_ROUNDS = 27 };
static const int32_t at_ll2_prop[AT_LL2_ROUNDS][AT_K] = {
    {36, 294, 233}, {276, 125, 134}, {276, 273, 58}, {13, 140, 218}, {13, 191, 84},  {13, 3, 25},     {13, 126, 203},
    {58, 186, 85},  {58, 246, 186},  {317, 186, 166}, {283, 276, 34}, {76, 53, 226},  {224, 317, 218}, {13, 93, 84},
    {224, 13, 93},  {30, 65, 239},   {59, 292, 59},   {59, 286, 34},  {59, 286, 49},  {130, 292, 239}, {70, 292, 206},
    {130, 292, 59}, {30, 30, 224},   {86, 283, 302},  {86, 283, 276}, {86, 283, 276}, {70, 292, 272}};
static const unsigned char at_ll2_tie[AT_LL2_ROUNDS] = {0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0,
                                                       0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0};
static const unsigned char at_ll2_acc[AT_LL2_ROUNDS] = {0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0,
                                                       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

/* The second prompt on one placement: greedy output and every round (position,
 * pinned proposals, how many kept) as llama.cpp's. */
static inline void at_check_llama_accepting(const char *tpath, const char *apath, const char *tdevs, const char *adev) {
    at_out plain = {.n = 0}, spec = {.n = 0};
    at_rounds got;
    memset(&got, 0, sizeof got);
    if (at_pair(tpath, apath, tdevs, false, adev, AT_LL2_LAST, &plain, &spec, &got)) {
        TH_FAIL("placement target %s, assistant %s failed", tdevs, adev ? adev : "(the target's)");
        return;
    }
    static const int32_t want[AT_NG] = {221, 221, 221, 221, 221, 221, 58,  58,  58,  58,  58,  39,  39,  39,
                                        39,  39,  288, 288, 288, 288, 288, 288, 288, 288, 288, 288, 288, 288};
    CHECK_INT(spec.n, AT_NG);
    CHECK_INT(plain.n, AT_NG);
    CHECK_MEM(plain.tok, want, sizeof want);
    CHECK_MEM(spec.tok, want, sizeof want);
    CHECK_INT(got.n, AT_LL2_ROUNDS - 1);
    CHECK_INT(got.accepted, 2);
    int pinned = 0, same = 0;
    int64_t pos = AT_NP - 1;
    for (int r = 0; r < got.n && r < AT_LL2_ROUNDS; r++) {
        CHECK_INT(got.pos[r], pos);
        CHECK_INT(got.n_acc[r], at_ll2_acc[r]);
        for (int j = 0; j < got.n_prop[r] && j < AT_K; j++) {
            if (at_ll2_tie[r] >> j & 1) continue;
            pinned++;
            if (got.prop[r][j] == at_ll2_prop[r][j]) same++;
            else
                TH_FAIL("second prompt, round %d (pos %lld) proposal %d: %d, llama.cpp proposed %d", r, (long long)got.pos[r],
                        j, got.prop[r][j], at_ll2_prop[r][j]);
        }
        pos += at_ll2_acc[r] + 1;
    }
    printf("target %s, assistant %s: proposals after accepted ones as llama.cpp's: %d of %d pinned positions\n", tdevs,
           adev ? adev : "(the target's)", same, pinned);
    CHECK(pinned >= 65);
}

/* Checks one placement against plain greedy output and the first placement's
 * proposals (want NULL: it is the first). Returns at_pair's code. Proposals are
 * compared exactly: argmax over f32 logits that agree within ~1e-6 between devices. */
static inline int at_check_pair(const char *tpath, const char *apath, const char *tdevs, bool kv_on_host, const char *adev,
                                at_rounds *got, const at_rounds *want) {
    at_out plain = {.n = 0}, spec = {.n = 0};
    memset(got, 0, sizeof *got);
    int rc = at_pair(tpath, apath, tdevs, kv_on_host, adev, at_tok(AT_NP - 1), &plain, &spec, got);
    if (rc) {
        TH_FAIL("placement target %s, assistant %s failed", tdevs, adev ? adev : "(the target's)");
        return rc;
    }
    CHECK_INT(spec.n, AT_NG);
    CHECK_INT(plain.n, AT_NG);
    CHECK_MEM(spec.tok, plain.tok, (size_t)AT_NG * sizeof(int32_t));
    for (int i = 0; i < plain.n; i++) CHECK_INT(plain.tok[i], AT_LL_TOKEN); /* llama.cpp's greedy output */
    CHECK(got->n >= AT_NG / (AT_K + 1));
    CHECK(got->n_prop[0] == AT_K); /* the first round drafts too (from the prompt's last token) */
    if (want) {
        CHECK_INT(got->n, want->n);
        for (int r = 0; r < got->n && r < want->n; r++) {
            CHECK_INT(got->pos[r], want->pos[r]);
            CHECK_INT(got->n_prop[r], want->n_prop[r]);
            CHECK_MEM(got->prop[r], want->prop[r], (size_t)got->n_prop[r] * sizeof(int32_t));
        }
    }
    return 0;
}

#endif
