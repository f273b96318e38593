// labels: unit
/* The mixture-of-experts routing kinds (the reference of the pkv_k_moe_route kernel,
 * whose device forms `pagekv check` holds to it) against a
 * reference written differently here: every candidate list sorted (qsort, by value
 * then index) instead of repeated selection, in double precision. Covers softmax
 * with and without normalised weights (Qwen3-MoE, DeepSeek-V2), the top k's own
 * softmax (gpt-oss), sigmoid with a selection bias, expert groups, normalisation and
 * a routed scale (DeepSeek-V3, GLM-4.5), selection on the raw logits (Llama 4), and
 * a few hand-made cases whose answer is known without either implementation. */
#include "device/cpu/ref.h"
#include "model/blocks.h"
#include "testhelp.h"

typedef struct {
    double v;
    int i;
} vi;

/* by value, descending; ties: the lower index first */
static int vi_cmp(const void *a, const void *b) {
    const vi *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i - y->i;
}

static void ref_route(const pkv_hparams *hp, const pkv_moe_kind *k, const float *logits, const float *bias, int *sel,
                      double *w) {
    const int X = hp->moe.n_expert, K = hp->moe.n_used, G = hp->moe_route.n_group;
    double p[256], s[256];
    bool allowed[256];
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < X; e++) mx = fmax(mx, logits[e]);
    for (int e = 0; e < X; e++) sum += exp(logits[e] - mx);
    for (int e = 0; e < X; e++) {
        p[e] = k->gating == PKV_MOE_SOFTMAX_TOPK   ? exp(logits[e] - mx) / sum
               : k->gating == PKV_MOE_SIGMOID_TOPK ? 1 / (1 + exp(-(double)logits[e]))
                                                   : logits[e];
        s[e] = k->sel_logits ? logits[e] : p[e] + (bias ? bias[e] : 0);
        allowed[e] = true;
    }
    if (G > 1) {
        const int per = X / G;
        vi gs[64];
        for (int g = 0; g < G; g++) {
            vi m[256];
            for (int j = 0; j < per; j++) m[j] = (vi){s[g * per + j], j};
            qsort(m, (size_t)per, sizeof m[0], vi_cmp);
            gs[g] = (vi){m[0].v + m[1].v, g};
        }
        qsort(gs, (size_t)G, sizeof gs[0], vi_cmp);
        for (int e = 0; e < X; e++) allowed[e] = false;
        for (int j = 0; j < hp->moe_route.n_group_used; j++)
            for (int e = 0; e < per; e++) allowed[gs[j].i * per + e] = true;
    }
    vi c[256];
    int n = 0;
    for (int e = 0; e < X; e++)
        if (allowed[e]) c[n++] = (vi){s[e], e};
    qsort(c, (size_t)n, sizeof c[0], vi_cmp);
    double wsum = 0;
    for (int j = 0; j < K; j++) {
        sel[j] = c[j].i;
        w[j] = p[sel[j]];
    }
    if (k->gating == PKV_MOE_TOPK_SOFTMAX) {
        double m0 = w[0], z = 0;
        for (int j = 0; j < K; j++) z += exp(w[j] - m0);
        for (int j = 0; j < K; j++) w[j] = exp(w[j] - m0) / z;
    } else if (k->norm_w) {
        for (int j = 0; j < K; j++) wsum += w[j];
        for (int j = 0; j < K; j++) w[j] /= fmax(wsum, 6.103515625e-5);
    }
    if (k->w_scale != 0) /* 1 or not: the same */
        for (int j = 0; j < K; j++) w[j] *= k->w_scale;
}

/* One token through the reference kernel with the kind's arguments (as blocks.c's moe_to). */
static void route_one(const pkv_hparams *hp, const pkv_moe_kind *k, float *p, const float *bias, int32_t *sel, float *w) {
    pkv_k_moe_route_args a = {.n = 1, .n_expert = hp->moe.n_expert, .k = hp->moe.n_used, .n_group = hp->moe_route.n_group,
                              .n_group_used = hp->moe_route.n_group_used, .gating = (int)k->gating, .norm_w = k->norm_w,
                              .sel_logits = k->sel_logits, .w_scale = k->w_scale};
    pkv_ref_moe_route(&a, p, bias, sel, w, 0, 1);
}

static pkv_hparams hp_of(int X, int K, int G, int GU) {
    pkv_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.moe.n_expert = X, hp.moe.n_used = K;
    hp.moe_route.n_group = G, hp.moe_route.n_group_used = GU;
    return hp;
}

/* n random tokens of kind k against the reference: the same experts in the same
 * order, weights within 1e-6 relative. Logits are drawn from a few values so that
 * ties occur. */
static void random_case(const char *what, const pkv_hparams *hp, const pkv_moe_kind *k, bool with_bias, uint64_t seed) {
    const int X = hp->moe.n_expert, K = hp->moe.n_used;
    uint64_t rs = seed;
    float bias[256];
    for (int e = 0; e < X; e++) bias[e] = 0.1f * th_randf(&rs);
    int bad = 0;
    for (int t = 0; t < 500 && bad < 3; t++) {
        float logits[256], p[256], w[64];
        int32_t sel[64];
        int rsel[64];
        double rw[64];
        const bool coarse = t % 3 == 0; /* ties */
        for (int e = 0; e < X; e++) logits[e] = coarse ? (float)(th_rand(&rs) % 4) : 3.0f * th_randf(&rs);
        memcpy(p, logits, sizeof(float) * (size_t)X);
        route_one(hp, k, p, with_bias ? bias : NULL, sel, w);
        ref_route(hp, k, logits, with_bias ? bias : NULL, rsel, rw);
        for (int j = 0; j < K; j++) {
            th_checks++;
            if (sel[j] != rsel[j] || fabs(w[j] - rw[j]) > 1e-6 * fmax(1, fabs(rw[j]))) {
                TH_FAIL("%s, token %d, choice %d: expert %d weight %.9g, reference expert %d weight %.9g", what, t, j, sel[j],
                        (double)w[j], rsel[j], rw[j]);
                bad++;
                break;
            }
        }
    }
}

/* Cases whose answer is known by hand. */
static void known_cases(void) {
    int32_t sel[4];
    float w[4];
    /* sigmoid: a bias moves the choice, the weight stays the unbiased probability */
    pkv_hparams hp = hp_of(4, 1, 0, 0);
    pkv_moe_kind sig = {.gating = PKV_MOE_SIGMOID_TOPK};
    float l1[4] = {0.0f, 1.0f, 0.5f, -1.0f}, b1[4] = {0, 0, 0.5f, 0};
    route_one(&hp, &sig, l1, b1, sel, w);
    CHECK_INT(sel[0], 2);
    CHECK_NEAR(w[0], 1 / (1 + exp(-0.5)), 1e-6);
    /* groups: the best expert (5) is in group 1 of {0..3}, {4..7}; group 0's two best
     * sum higher, so with one group used expert 5 cannot be chosen */
    hp = hp_of(8, 2, 2, 1);
    pkv_moe_kind sm = {.gating = PKV_MOE_SOFTMAX_TOPK, .norm_w = true, .w_scale = 2.5f};
    float l2[8] = {2.5f, 2.5f, -5, -5, -5, 3.0f, -5, -5}; /* e^2.5 + e^2.5 > e^3 */
    route_one(&hp, &sm, l2, NULL, sel, w);
    CHECK_INT(sel[0], 0);
    CHECK_INT(sel[1], 1);
    CHECK_NEAR(w[0], 1.25, 1e-6); /* normalised to 1/2 each, times 2.5 */
    CHECK_NEAR(w[1], 1.25, 1e-6);
    /* Llama 4: chosen on the logits, weighted by their sigmoid */
    hp = hp_of(3, 1, 0, 0);
    pkv_moe_kind l4 = {.gating = PKV_MOE_SIGMOID_TOPK, .sel_logits = true};
    float l3[3] = {-2.0f, 0.0f, 1.0f}, b3[3] = {5, 0, 0};
    route_one(&hp, &l4, l3, b3, sel, w); /* a bias does not enter a choice on logits */
    CHECK_INT(sel[0], 2);
    CHECK_NEAR(w[0], 1 / (1 + exp(-1.0)), 1e-6);
}

int main(void) {
    known_cases();
    const pkv_hparams flat = hp_of(16, 4, 0, 0), grouped = hp_of(64, 6, 8, 3), one = hp_of(16, 1, 0, 0);
    random_case("softmax, normalised (Qwen3-MoE)", &flat, &(pkv_moe_kind){.gating = PKV_MOE_SOFTMAX_TOPK, .norm_w = true}, false, 1);
    random_case("softmax, scaled (DeepSeek-V2)", &flat, &(pkv_moe_kind){.gating = PKV_MOE_SOFTMAX_TOPK, .w_scale = 16.0f}, false, 2);
    random_case("top k's softmax (gpt-oss)", &flat, &(pkv_moe_kind){.gating = PKV_MOE_TOPK_SOFTMAX}, false, 3);
    random_case("sigmoid, bias, groups, normalised, scaled (DeepSeek-V3)", &grouped,
                &(pkv_moe_kind){.gating = PKV_MOE_SIGMOID_TOPK, .norm_w = true, .w_scale = 2.5f}, true, 4);
    random_case("sigmoid, bias, normalised (GLM-4.5)", &flat,
                &(pkv_moe_kind){.gating = PKV_MOE_SIGMOID_TOPK, .norm_w = true, .w_scale = 1.0f}, true, 5);
    random_case("softmax, groups (DeepSeek-V2 group-limited)", &grouped, &(pkv_moe_kind){.gating = PKV_MOE_SOFTMAX_TOPK}, false, 6);
    random_case("sigmoid on the logits' top 1 (Llama 4)", &one,
                &(pkv_moe_kind){.gating = PKV_MOE_SIGMOID_TOPK, .sel_logits = true}, false, 7);
    return th_done();
}
