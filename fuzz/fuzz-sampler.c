/* Fuzz harness: the sampler (pkv_sampler_*), random params and logits.
 *
 * Input: a 31-byte header, then operations.
 *   header: f32 temp, i16 top_k, f32 top_p, f32 min_p, f32 repeat_penalty,
 *           i16 repeat_last_n, u64 seed, u16 n_vocab, u8 mode
 *   mode bit 0: params as raw bits (NaN, inf, negative: mostly invalid), else
 *               mapped into their usual ranges (temp in [-1, 64), top_k < 600,
 *               top_p and min_p in [0, 1], penalty in [0, 4), last_n < 300)
 *   mode bit 1: logits as raw f32 bits (NaN and inf included), else small
 *               multiples of 1/4 (many ties)
 *   mode bit 2: n_vocab modulo 3000 (2048 and up reaches the bucketed top-p
 *               path), else modulo 300 (faster); 0 must be refused
 *   operations (at most 24), one byte each: 0 sample, 1 probs then sample,
 *   2 accept (next byte: a token, some out of range), 3 reset, 4 set one logit
 *   (next 3 bytes), 5 replace the logits from the next bytes.
 * repeat_last_n is an i16: the history is allocated up front, so INT32_MAX asks
 * for 8 GB by design (a caller's choice, refused only by the allocator).
 *
 * Checked: create refuses exactly the invalid params of its contract; sample
 * fails exactly when a logit is NaN or inf, else gives a token in range; probs
 * are >= 0 and sum to 1, the token sampled next has probability > 0, greedy
 * rows are one-hot at the sampled token; after pkv_sampler_reset the same
 * operations give the same tokens (no state outside the seed and history). */
#include "fuzz-common.h"

#include <math.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pkv_log_set(NULL, NULL, PKV_LOG_NONE);
    return 0;
}

enum { HDR = 31, MAX_OPS = 24, MAX_TOK = MAX_OPS };

static float f32_at(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
static uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static bool params_valid(pkv_sampler_params p, int32_t n_vocab) {
    return n_vocab > 0 && !isnan(p.temp) && p.top_k >= 0 && p.top_p > 0.0f && p.top_p <= 1.0f && p.min_p >= 0.0f &&
           p.min_p <= 1.0f && isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f && p.repeat_last_n >= 0;
}

static void fill_logits(float *lg, int32_t n, const uint8_t *src, size_t len, bool raw) {
    for (int32_t i = 0; i < n; i++) {
        if (!len) {
            lg[i] = 0.0f;
        } else if (raw) {
            uint8_t b[4];
            for (int k = 0; k < 4; k++) b[k] = src[((size_t)i * 4 + (size_t)k) % len];
            memcpy(&lg[i], b, 4);
        } else {
            lg[i] = (float)(int8_t)src[(size_t)i % len] * 0.25f;
        }
    }
}

static bool all_finite(const float *lg, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!isfinite(lg[i])) return false;
    return true;
}

/* Runs the operations; writes the tokens sampled (-1 for a failed sample). */
static int run_ops(pkv_sampler *s, const pkv_sampler_params *p, int32_t nv, bool raw, const uint8_t *ops, size_t n_ops,
                   float *lg, float *probs, int32_t *out) {
    int n_out = 0;
    size_t i = 0;
    for (int k = 0; k < MAX_OPS && i < n_ops; k++) {
        uint8_t op = ops[i++] % 6;
        if (op == 0 || op == 1) {
            bool finite = all_finite(lg, nv);
            int32_t tok = -5;
            if (op == 1) {
                pkv_status st = pkv_sampler_probs(s, lg, probs);
                FUZZ_CHECK((st == PKV_OK) == finite);
                if (st == PKV_OK) {
                    double sum = 0;
                    for (int32_t j = 0; j < nv; j++) {
                        FUZZ_CHECK(probs[j] >= 0.0f && isfinite(probs[j]));
                        sum += probs[j];
                    }
                    FUZZ_CHECK(fabs(sum - 1.0) < 1e-3);
                }
            }
            pkv_status st = pkv_sampler_sample(s, lg, &tok);
            FUZZ_CHECK((st == PKV_OK) == finite);
            if (st == PKV_OK) {
                FUZZ_CHECK(tok >= 0 && tok < nv);
                if (op == 1) {
                    FUZZ_CHECK(probs[tok] > 0.0f);
                    if (p->temp <= 0.0f) FUZZ_CHECK(probs[tok] == 1.0f);
                }
            } else {
                FUZZ_CHECK(tok == -5);
                tok = -1;
            }
            out[n_out++] = tok;
        } else if (op == 2) {
            uint8_t b = i < n_ops ? ops[i++] : 0;
            int32_t tok = b >= 250 ? (b == 255 ? INT32_MIN : nv + (b - 250)) : (int32_t)((int64_t)b * nv / 250);
            pkv_sampler_accept(s, tok);
        } else if (op == 3) {
            pkv_sampler_reset(s);
            out[n_out++] = -2;
        } else if (op == 4) {
            if (i + 3 > n_ops) break;
            int32_t j = (int32_t)(u16_at(ops + i) % (uint32_t)nv);
            lg[j] = raw ? (float)(int8_t)ops[i + 2] * 1e37f : (float)(int8_t)ops[i + 2] * 0.25f;
            i += 3;
        } else {
            size_t take = n_ops - i < 64 ? n_ops - i : 64;
            fill_logits(lg, nv, ops + i, take, raw);
            i += take;
        }
    }
    return n_out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < HDR) return 0;
    uint8_t mode = data[30];
    bool raw_params = mode & 1, raw_logits = mode & 2;
    pkv_sampler_params p = pkv_sampler_default_params();
    if (raw_params) {
        p.temp = f32_at(data);
        p.top_k = (int16_t)u16_at(data + 4);
        p.top_p = f32_at(data + 6);
        p.min_p = f32_at(data + 10);
        p.repeat_penalty = f32_at(data + 14);
        p.repeat_last_n = (int16_t)u16_at(data + 18);
    } else {
        p.temp = (float)u16_at(data) / 1000.0f - 1.0f;
        p.top_k = u16_at(data + 4) % 600;
        p.top_p = (float)(u16_at(data + 6) % 1001) / 1000.0f;
        p.min_p = (float)(u16_at(data + 10) % 1001) / 1000.0f;
        p.repeat_penalty = (float)(u16_at(data + 14) % 4000) / 1000.0f;
        p.repeat_last_n = u16_at(data + 18) % 300;
    }
    memcpy(&p.seed, data + 20, 8);
    int32_t nv = u16_at(data + 28) % ((mode & 4) ? 3000 : 300);
    int64_t live0 = pkv_alloc_live();
    pkv_sampler *s = pkv_sampler_create(p, nv);
    FUZZ_CHECK((s != NULL) == params_valid(p, nv));
    if (!s) {
        FUZZ_CHECK(pkv_alloc_live() == live0);
        return 0;
    }
    const uint8_t *ops = data + HDR;
    size_t n_ops = size - HDR;
    float *lg = malloc((size_t)nv * sizeof *lg), *lg0 = malloc((size_t)nv * sizeof *lg);
    float *probs = malloc((size_t)nv * sizeof *probs);
    FUZZ_CHECK(lg && lg0 && probs);
    fill_logits(lg0, nv, ops, n_ops, raw_logits);
    memcpy(lg, lg0, (size_t)nv * sizeof *lg);
    int32_t t1[MAX_TOK], t2[MAX_TOK];
    int n1 = run_ops(s, &p, nv, raw_logits, ops, n_ops, lg, probs, t1);
    pkv_sampler_reset(s);
    memcpy(lg, lg0, (size_t)nv * sizeof *lg);
    int n2 = run_ops(s, &p, nv, raw_logits, ops, n_ops, lg, probs, t2);
    FUZZ_CHECK(n1 == n2 && memcmp(t1, t2, (size_t)n1 * sizeof *t1) == 0);
    pkv_sampler_free(s);
    free(lg);
    free(lg0);
    free(probs);
    FUZZ_CHECK(pkv_alloc_live() == live0);
    return 0;
}
