// labels: model kv vulkan
/* Llama 4 (src/model/arch/llama4.c) against a plain double-precision reference of
 * its own (below, llama.cpp's src/models/llama4.cpp written out one token at a
 * time over a contiguous KV cache), on random-weight f32 files from mkmodel:
 *   - chunked attention in layers 0..2 of every 4: a query at p sees keys
 *     [floor(p / C) * C, p]; the paged cache keeps those layers in its window pool;
 *   - NoPE in layer 3 of every 4, whose queries at p are multiplied by
 *     1 + 0.1 ln(floor((p + 1) / C) + 1) (mkmodel writes the temperature length
 *     as the chunk C, so short prompts cross both);
 *   - the RoPE layers' weightless RMS norm of q and k after RoPE, with llama3's
 *     rope_freqs factors;
 *   - experts in the odd layers (top 1 of the router's logits, the chosen expert's
 *     input times sigmoid(its logit), plus the shared expert), dense FFNs in the
 *     even ones.
 * Every position of a prompt and single steps, on pages that divide the chunk and
 * pages that do not (f32 weights and KV: nmse <= 1e-9), each also against the
 * reference without chunks and without the temperature, which must be far off; the
 * same on vulkan:0 against the CPU (nmse <= 1e-6) when present. Bad files: a chunk
 * size or temperature length of zero, an interleave step missing or above 65536
 * are refused naming the key. */
#include <math.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

enum { V = 300, E = 64, NH = 4, NKV = 2, HD = 16, F = 96, NL = 4, NX = 4 };

static pkv_mkmodel_params params(int chunk) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "llama4";
    p.type = PKV_TYPE_F32;
    p.n_layer = NL;
    p.n_embd = E;
    p.n_head = NH;
    p.n_head_kv = NKV;
    p.head_dim = HD;
    p.n_ff = F;
    p.n_vocab = V;
    p.n_expert = NX;
    p.sliding_window = chunk;
    return p;
}

/* ------------------------------------------------ the reference */

typedef struct {
    const pkv_gguf *g;
    int chunk, n_past;
    bool no_chunk, no_temp; /* contrasts: without the feature */
    double rope_base, eps;
    double *ff; /* [HD / 2] rope_freqs */
    double *kc[NL], *vc[NL]; /* [cap][NKV * HD] */
} l4ref;

static double *get(const l4ref *r, int il, const char *suffix) {
    char nm[96];
    int64_t n = 0;
    if (il >= 0) snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);
    else snprintf(nm, sizeof nm, "%s", suffix);
    return ref_gguf_tensor((void *)r->g, nm, &n);
}

static void rms(double *x, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    for (int i = 0; i < n; i++) x[i] /= sqrt(ss / n + eps);
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* x += the attention of layer il for the token at r->n_past */
static void ref_attention(l4ref *r, int il, double *x) {
    const int pos = r->n_past, Q = NH * HD, KV = NKV * HD;
    const bool nope = (il + 1) % 4 == 0;
    double h[E], q[NH * HD], k[NKV * HD], v[NKV * HD], att[NH * HD], o[E], sc[1024];
    double *an = get(r, il, "attn_norm.weight"), *wq = get(r, il, "attn_q.weight"), *wk = get(r, il, "attn_k.weight"),
           *wv = get(r, il, "attn_v.weight"), *wo = get(r, il, "attn_output.weight");
    ref_rms_norm(x, an, E, r->eps, h);
    ref_matvec(wq, h, NULL, Q, E, q);
    ref_matvec(wk, h, NULL, KV, E, k);
    ref_matvec(wv, h, NULL, KV, E, v);
    if (nope) { /* no RoPE; the queries' temperature */
        const double t = 1.0 + 0.1 * log(floor((pos + 1.0) / r->chunk) + 1.0);
        for (int i = 0; i < Q && !r->no_temp; i++) q[i] *= t;
    } else { /* RoPE with the factors, then the weightless norm of every head */
        ref_rope_factors(q, NH, HD, pos, r->rope_base, false, r->ff, 1.0);
        ref_rope_factors(k, NKV, HD, pos, r->rope_base, false, r->ff, 1.0);
        for (int hd = 0; hd < NH; hd++) rms(q + hd * HD, HD, r->eps);
        for (int hd = 0; hd < NKV; hd++) rms(k + hd * HD, HD, r->eps);
    }
    memcpy(r->kc[il] + (size_t)pos * KV, k, sizeof k);
    memcpy(r->vc[il] + (size_t)pos * KV, v, sizeof v);
    const int t0 = !nope && !r->no_chunk ? pos / r->chunk * r->chunk : 0; /* the query's chunk */
    for (int hq = 0; hq < NH; hq++) {
        const int hk = hq / (NH / NKV);
        double mx = -INFINITY, z = 0;
        for (int t = t0; t <= pos; t++) {
            double s = 0;
            for (int d = 0; d < HD; d++) s += q[hq * HD + d] * r->kc[il][(size_t)t * KV + hk * HD + d];
            sc[t] = s / sqrt((double)HD);
            mx = fmax(mx, sc[t]);
        }
        for (int t = t0; t <= pos; t++) z += (sc[t] = exp(sc[t] - mx));
        for (int d = 0; d < HD; d++) {
            double a = 0;
            for (int t = t0; t <= pos; t++) a += sc[t] / z * r->vc[il][(size_t)t * KV + hk * HD + d];
            att[hq * HD + d] = a;
        }
    }
    ref_matvec(wo, att, NULL, E, Q, o);
    for (int i = 0; i < E; i++) x[i] += o[i];
    free(an), free(wq), free(wk), free(wv), free(wo);
}

/* x += the FFN of layer il: dense, or top-1 sigmoid expert on its weighted input
 * plus the shared expert */
static void ref_ffn_layer(l4ref *r, int il, double *x) {
    double h[E], y[E], g[F], u[F], xin[E];
    double *fn = get(r, il, "ffn_norm.weight");
    ref_rms_norm(x, fn, E, r->eps, h);
    if (il % 2 == 0) {
        double *wg = get(r, il, "ffn_gate.weight"), *wu = get(r, il, "ffn_up.weight"), *wd = get(r, il, "ffn_down.weight");
        ref_ffn(wg, wu, wd, E, F, false, h, g, u, y);
        for (int i = 0; i < E; i++) x[i] += y[i];
        free(wg), free(wu), free(wd), free(fn);
        return;
    }
    double *router = get(r, il, "ffn_gate_inp.weight"), *eg = get(r, il, "ffn_gate_exps.weight"),
           *eu = get(r, il, "ffn_up_exps.weight"), *ed = get(r, il, "ffn_down_exps.weight"),
           *sg = get(r, il, "ffn_gate_shexp.weight"), *su = get(r, il, "ffn_up_shexp.weight"),
           *sd = get(r, il, "ffn_down_shexp.weight");
    double logit[NX];
    ref_matvec(router, h, NULL, NX, E, logit);
    int best = 0;
    for (int e = 1; e < NX; e++)
        if (logit[e] > logit[best]) best = e;
    const size_t off = (size_t)best * F * E;
    for (int i = 0; i < E; i++) xin[i] = h[i] * sigm(logit[best]);
    ref_ffn(eg + off, eu + off, ed + off, E, F, false, xin, g, u, y);
    for (int i = 0; i < E; i++) x[i] += y[i];
    ref_ffn(sg, su, sd, E, F, false, h, g, u, y);
    for (int i = 0; i < E; i++) x[i] += y[i];
    free(fn), free(router), free(eg), free(eu), free(ed), free(sg), free(su), free(sd);
}

/* logits [V] of token at r->n_past, which it then advances */
static void ref_step(l4ref *r, int32_t tok, double *logits) {
    double x[E], h[E];
    double *emb = get(r, -1, "token_embd.weight"), *on = get(r, -1, "output_norm.weight"), *out = get(r, -1, "output.weight");
    memcpy(x, emb + (size_t)tok * E, sizeof x);
    for (int il = 0; il < NL; il++) {
        ref_attention(r, il, x);
        ref_ffn_layer(r, il, x);
    }
    ref_rms_norm(x, on, E, r->eps, h);
    ref_matvec(out ? out : emb, h, NULL, V, E, logits);
    r->n_past++;
    free(emb), free(on), free(out);
}

static l4ref *ref_open(const pkv_gguf *g, int chunk, int cap, bool no_chunk, bool no_temp) {
    l4ref *r = calloc(1, sizeof *r);
    r->g = g;
    r->chunk = chunk;
    r->no_chunk = no_chunk;
    r->no_temp = no_temp;
    r->rope_base = 500000.0;
    r->eps = 1e-5;
    r->ff = get(r, -1, "rope_freqs.weight");
    for (int il = 0; il < NL; il++) {
        r->kc[il] = calloc((size_t)cap * NKV * HD, sizeof(double));
        r->vc[il] = calloc((size_t)cap * NKV * HD, sizeof(double));
    }
    return r;
}

static void ref_close(l4ref *r) {
    for (int il = 0; il < NL; il++) free(r->kc[il]), free(r->vc[il]);
    free(r->ff);
    free(r);
}

/* ------------------------------------------------ the tests */

/* np prompt tokens at once, then 6 single steps, on pages of ps; every position
 * against the reference, and against the contrasts. The logits into *out (NT * V). */
static void run(const void *img, size_t size, int chunk, int ps, const char *dev, float *out) {
    enum { NP = 30, NT = NP + 6 };
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "llama4");
    pkv_model_params mp = pkv_model_default_params();
    mp.device = dev;
    pkv_model *m = pkv_model_load_memory(img, size, "llama4", mp);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = PKV_TYPE_F32;
    cp.page_size = ps;
    cp.n_ctx = 64;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    REQUIRE_VOID(g && ctx);
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (i * 97 + 13) % V;
    CHECK_OK(pkv_context_decode_all(ctx, toks, NP, out));
    for (int i = NP; i < NT; i++) {
        CHECK_OK(pkv_context_decode(ctx, &toks[i], 1));
        memcpy(out + (size_t)i * V, pkv_context_logits(ctx), V * sizeof(float));
    }
    if (!strcmp(dev, "cpu")) {
        double worst = 0, contrast[2] = {1e30, 1e30}, want[V];
        float wantf[V]; /* rounded to f32 for th_nmse: far below the tolerance */
        l4ref *r[3] = {ref_open(g, chunk, NT, false, false), ref_open(g, chunk, NT, true, false),
                       ref_open(g, chunk, NT, false, true)};
        for (int t = 0; t < NT; t++)
            for (int k = 0; k < 3; k++) {
                ref_step(r[k], toks[t], want);
                for (int i = 0; i < V; i++) wantf[i] = (float)want[i];
                const double e = th_nmse(wantf, out + (size_t)t * V, V);
                if (k == 0) worst = fmax(worst, e);
                else if (t >= chunk + 1) contrast[k - 1] = fmin(contrast[k - 1], e); /* past the first chunk and temperature */
            }
        for (int k = 0; k < 3; k++) ref_close(r[k]);
        fprintf(stderr, "llama4 chunk %d pages of %d: nmse %.2e; without chunks >= %.2e, without temperature >= %.2e\n", chunk,
                ps, worst, contrast[0], contrast[1]);
        if (!(worst <= 1e-9)) TH_FAIL("chunk %d pages of %d: nmse %g > 1e-9", chunk, ps, worst);
        if (!(contrast[0] > 1e-5 && contrast[1] > 1e-7))
            TH_FAIL("chunk %d pages of %d: the contrasts are as close (%g, %g): the case does not test them", chunk, ps,
                    contrast[0], contrast[1]);
        th_checks += 2;
    }
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    pkv_gguf_close(g);
}

static void test_forward(void) {
    static const int cases[][2] = {{8, 4}, {8, 3}, {12, 5}, {12, 16}}; /* chunk, page size */
    char names[16][64], why[256] = "";
    int n = 0;
    bool vk = false;
    if (!pkv_device_enumerate(0, names, 16, &n, why, sizeof why))
        for (int i = 0; i < n && i < 16; i++) vk |= !strcmp(names[i], "vulkan:0");
    if (!vk) fprintf(stderr, "vulkan:0 not present (%s): its cases are skipped\n", why);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        pkv_mkmodel_params p = params(cases[k][0]);
        void *img;
        size_t size;
        REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
        float *cpu = malloc(36 * V * sizeof *cpu), *gpu = malloc(36 * V * sizeof *gpu);
        run(img, size, cases[k][0], cases[k][1], "cpu", cpu);
        if (vk && k < 2) { /* vulkan:0 against the CPU */
            run(img, size, cases[k][0], cases[k][1], "vulkan:0", gpu);
            const double e = th_nmse(cpu, gpu, 36 * V);
            fprintf(stderr, "llama4 chunk %d pages of %d: vulkan:0 against cpu nmse %.2e\n", cases[k][0], cases[k][1], e);
            if (!(e <= 1e-6)) TH_FAIL("vulkan:0: nmse %g > 1e-6", e);
            th_checks++;
        }
        free(cpu);
        free(gpu);
        pkv_mkmodel_free_memory(img);
    }
}

/* A file with key `key` (u32) set to value: the load fails naming it. */
static void bad_key(const char *key, uint32_t value, const char *expect) {
    pkv_mkmodel_params p = params(8);
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "patch");
    REQUIRE_VOID(g);
    int64_t ki = pkv_gguf_find_key(g, key);
    /* the u32 value sits right after the key's name and type in the image */
    uint8_t *b = img, *hit = NULL;
    const size_t n = strlen(key);
    for (size_t i = 0; !hit && i + n + 8 <= size; i++)
        if (!memcmp(b + i, key, n)) hit = b + i;
    pkv_gguf_close(g);
    CHECK(ki >= 0 && hit);
    if (hit) memcpy(hit + n + 4, &value, 4);
    pkv_model *m = hit ? pkv_model_load_memory(img, size, "bad llama4", pkv_model_default_params()) : NULL;
    CHECK(m == NULL);
    if (!strstr(pkv_errmsg(), expect)) TH_FAIL("%s = %u: message '%s' lacks '%s'", key, value, pkv_errmsg(), expect);
    th_checks++;
    pkv_model_free(m);
    pkv_mkmodel_free_memory(img);
}

static void test_bad_files(void) {
    bad_key("llama4.attention.chunk_size", 0, "'llama4.attention.chunk_size'");
    bad_key("llama4.interleave_moe_layer_step", 100000, "'llama4.interleave_moe_layer_step'");
    bad_key("llama4.attention.temperature_length", 0, "'llama4.attention.temperature_length'");
    /* the chunk key renamed: llama.cpp's 8192, which mkmodel's context of 2048 never reaches,
     * still loads; the interleave step renamed: required */
    pkv_mkmodel_params p = params(8);
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    uint8_t *b = img;
    const char *k = "llama4.interleave_moe_layer_step";
    for (size_t i = 0; i + strlen(k) <= size; i++)
        if (!memcmp(b + i, k, strlen(k))) {
            b[i + strlen(k) - 1] = 'X';
            break;
        }
    CHECK(pkv_model_load_memory(img, size, "no step", pkv_model_default_params()) == NULL);
    CHECK(strstr(pkv_errmsg(), "llama4.interleave_moe_layer_step") != NULL);
    pkv_mkmodel_free_memory(img);
}

int main(void) {
    test_bad_files();
    test_forward();
    return th_done();
}
