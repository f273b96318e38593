// labels: model timeout=600
/* The paged forward pass against the plain contiguous-KV reference in double
 * precision (tests/ref-model.h), for every architecture and weight type, on
 * models from mkmodel. The reference reads the same GGUF image, dequantized
 * exactly; the paged pass runs through the device kernels and the paged cache.
 *
 * Stated tolerances (normalized mean squared error of the logits of every
 * position of a 24-token prompt and 8 single-token steps):
 *   f32 / f16 / bf16 weights, f32 KV:  1e-9   (float accumulation only)
 *   same weights, f16 KV:              1e-5   (K and V rounded to half)
 *   q8_0 / q4_0 / k-quant weights:     2e-3   (activations quantized to 8 bits for
 *                                              the integer dot products, as ggml does;
 *                                              gpt-oss also with mxfp4 weights)
 *   the same for gpt-oss:              3e-3   (its logits carry the most of that
 *                                              error: q6_k measured 1.4e-3 on the
 *                                              avx512 path, 2.2e-3 on avx2, generic
 *                                              and the ARM paths, whose sums round
 *                                              differently; q8_0 1.5e-3 on all)
 * and the greedy token of every position must agree unless the reference's top
 * two logits are closer than a near-tie margin: the larger of 1e-3 (or 0.1 where
 * activations are quantized) and 6x the position's RMS logit error.
 * A gpt-oss file without a sink, a bias or its FFN norm, or with a YaRN original
 * context of 0, is refused with a message naming the tensor or the key. The RoPE
 * scaling keys are read as llama.cpp reads them (scaling_keys). */
#include "base/quant.h"
#include "model/gguf.h"
#include "model/model-impl.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

enum { NP = 24, NS = 8 };

static bool g_mixture; /* make the q4_k model a q4_k + q6_k mixture */

static void run_case(const char *name, pkv_type wt, pkv_type kv, double tol, double tie, int *cases) {
    /* "gemma4+moe": gemma4 with experts beside every layer's dense FFN */
    const bool g4moe = !strcmp(name, "gemma4+moe");
    const char *arch = g4moe ? "gemma4" : name;
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = wt;
    bool gemma3 = !strcmp(arch, "gemma3"), gemma = gemma3 || !strcmp(arch, "gemma2"), oss = !strcmp(arch, "gpt-oss"),
         g4 = !strcmp(arch, "gemma4");
    p.n_layer = gemma3 || g4 ? 6 : 2; /* gemma3: five sliding layers, then a global one; gemma4: 4 with KV, 2 sharing */
    bool kq = pkv_type_block_elems(wt) == 256;
    p.n_embd = kq ? 256 : 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = kq ? 64 : 16;
    p.n_ff = kq ? 256 : 96;
    p.n_vocab = 300;
    p.tied = wt == PKV_TYPE_F32; /* tied embeddings once */
    p.k_mixture = g_mixture;
    bool moe = !strcmp(arch, "qwen3moe") || oss || g4moe, llama_like = !strcmp(arch, "llama") || !strcmp(arch, "phi3");
    p.sliding_window = gemma || g4 || oss ? 3 : 0;
    if (g4moe) p.n_ff = kq ? 512 : 128; /* experts of n_ff / 2 rows, whole blocks of the weight type */
    if (g4) { /* sliding head size half the full one's, rows in whole blocks of the weight type */
        p.head_dim_swa = kq ? 64 : 8;
        p.n_embd_per_layer = kq ? 256 : 32;
    }
    p.n_expert = moe ? 4 : 0; /* n_ff is then one expert's rows */
    /* Top-2 of 4 with exact weights (f32, f16, bf16: the router sees what the
     * reference sees, within 1e-13). With quantized weights the CPU rounds the
     * activations to 8 bits, which moves router logits enough to swap a close second
     * and third expert for some tokens: a discontinuity of top-k routing, not an
     * error. There every expert is used (k = 4): the weights and the experts' sum are
     * compared without the selection. gemma4's router reads the residual stream after
     * six layers of rounded K/V with f16 pages: there too (measured: one swapped pair
     * of experts gives 2.8e-2), while f32 pages check its top 2 of 4 at 1e-13. */
    p.n_expert_used = moe ? (pkv_type_block_elems(wt) > 1 || (g4moe && kv != PKV_TYPE_F32) ? 4 : 2) : 0;
    void *img;
    size_t size;
    if (pkv_mkmodel_memory(&p, &img, &size)) {
        TH_FAIL("%s %s: mkmodel: %s", arch, pkv_type_name(wt), pkv_errmsg());
        return;
    }
    pkv_gguf *g = pkv_gguf_open_memory(img, size, arch);
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load_memory(img, size, arch, mp);
    REQUIRE_VOID(g && m);
    ref_hparams hp = {arch,
                      p.n_layer,
                      p.n_embd,
                      p.n_head,
                      p.n_head_kv,
                      p.head_dim,
                      p.n_ff,
                      p.n_vocab,
                      llama_like || oss ? 1e-5 : 1e-6, /* mkmodel: Llama's, Phi-3's and gpt-oss's norm epsilon, or Qwen's */
                      oss ? 1.5e5 : llama_like || (gemma && !gemma3) ? 1e4 : 1e6, /* gemma3: its global layers' base */
                      strcmp(arch, "llama") != 0,
                      p.n_expert,
                      p.n_expert_used,
                      moe ? (g4moe ? p.n_ff / 2 : p.n_ff) : 0, /* gemma4's experts: half the dense FFN */
                      gemma ? 1.0 / sqrt((double)p.head_dim) : 0, /* llama.cpp's rule below 46 (62) layers */
                      gemma && !gemma3 ? 50.0 : 0,               /* mkmodel's Gemma 2 soft-caps; Gemma 3 has none */
                      gemma && !gemma3 ? 30.0 : 0,
                      gemma || oss ? 3 : 0, /* window of the sliding layers: the prompt crosses it */
                      gemma3 ? 6 : gemma || oss ? 2 : 0,
                      gemma3 || oss ? 0.25 : 0, /* mkmodel's gemma3: linear RoPE scaling by 4 on the global layers;
                                                   gpt-oss: YaRN by 4 */
                      gemma3 ? 1e4 : 0, /* and base 10000 unscaled on the sliding ones */
                      oss ? 256 : 0,    /* gpt-oss: YaRN over mkmodel's original context of 256 */
                      0,
                      0,
                      NULL, 0, NULL, NULL, 0, 0, 0, NULL, 0, 0, 0, 0, 0};
    unsigned char swa[16];
    int kvh[16], ff[16];
    if (g4) { /* mkmodel's Gemma 4 shape, per layer as the loaded model has it */
        hp.final_softcap = 30;
        hp.sliding_window = 3;
        hp.rope_base_swa = 1e4;
        for (int l = 0; l < p.n_layer; l++) {
            swa[l] = m->layers[l].window > 0;
            kvh[l] = m->layers[l].n_head_kv;
            ff[l] = m->layers[l].n_ff;
        }
        hp.swa_layers = swa;
        hp.head_dim_swa = p.head_dim_swa;
        hp.layer_n_head_kv = kvh;
        hp.layer_n_ff = ff;
        hp.rope_pairs_full = p.head_dim / 8; /* mkmodel's proportional RoPE: a quarter of the pairs */
        hp.n_shared_kv = 2;
        hp.n_embd_per_layer = p.n_embd_per_layer;
        /* what mkmodel's Gemma 4 is: full layers 0 and 3 with one KV head, sliding ones with two; 4 and 5
         * share the KV of 2 (sliding) and 3 (full) with an FFN twice as wide */
        static const unsigned char want_swa[6] = {0, 1, 1, 0, 1, 0};
        CHECK(!memcmp(swa, want_swa, 6));
        CHECK(kvh[0] == 1 && kvh[1] == 2 && kvh[5] == 1 && ff[3] == p.n_ff && ff[4] == 2 * p.n_ff);
        CHECK(m->n_cache_layers == 4 && m->kv_layer && m->kv_layer[4] == 2 && m->kv_layer[5] == 3);
    }
    ref_model *r = ref_model_create(&hp, ref_gguf_tensor, g);
    REQUIRE_VOID(r);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = kv;
    cp.page_size = 5; /* pages end mid-prompt */
    cp.n_ctx = 64;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    REQUIRE_VOID(ctx);

    int V = p.n_vocab;
    int32_t toks[NP + NS];
    for (int i = 0; i < NP + NS; i++) toks[i] = (i * 97 + 13) % V;
    float *got = malloc((size_t)(NP + NS) * V * sizeof *got);
    double *want = malloc((size_t)(NP + NS) * V * sizeof *want);
    CHECK_OK(pkv_context_decode_all(ctx, toks, NP, got));
    for (int i = 0; i < NS; i++) {
        CHECK_OK(pkv_context_decode(ctx, &toks[NP + i], 1));
        memcpy(got + (size_t)(NP + i) * V, pkv_context_logits(ctx), V * sizeof(float));
    }
    CHECK_INT(ref_model_eval(r, toks, NP + NS, NULL, want), 0);
    double worst = 0;
    int disagree = 0;
    for (int t = 0; t < NP + NS; t++) {
        double num = 0, den = 0;
        int ag = 0, aw = 0, second = -1;
        for (int k = 0; k < V; k++) {
            double w = want[(size_t)t * V + k], x = got[(size_t)t * V + k];
            num += (w - x) * (w - x);
            den += w * w;
            if (x > got[(size_t)t * V + ag]) ag = k;
            if (w > want[(size_t)t * V + aw]) aw = k;
        }
        for (int k = 0; k < V; k++)
            if (k != aw && (second < 0 || want[(size_t)t * V + k] > want[(size_t)t * V + second])) second = k;
        double e = num / den;
        if (e > worst) worst = e;
        double rms_err = sqrt(num / V);
        bool near_tie = want[(size_t)t * V + aw] - want[(size_t)t * V + second] < fmax(tie, 6 * rms_err);
        if (ag != aw && !near_tie) disagree++;
    }
    fprintf(stderr, "%-6s %-5s kv %-4s nmse %.2e (tol %.0e)%s\n", name, pkv_type_name(wt), pkv_type_name(kv), worst, tol,
            disagree ? " ARGMAX DIFFERS" : "");
    if (!(worst <= tol)) TH_FAIL("%s %s kv %s: nmse %g > %g", name, pkv_type_name(wt), pkv_type_name(kv), worst, tol);
    CHECK_INT(disagree, 0);
    (*cases)++;
    free(got);
    free(want);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    ref_model_free(r);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* A gpt-oss image with one tensor renamed (the same length, so the file stays
 * valid), or its YaRN original context set to 0, must be refused naming it. */
static void bad_gpt_oss(void) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "gpt-oss";
    p.n_embd = 64;
    p.n_ff = 64;
    p.n_vocab = 300;
    static const struct {
        const char *find, *patch, *expect;
    } cases[] = {
        {"blk.1.attn_sinks.weight", "blk.1.attn_sinks.weighX", "tensor 'blk.1.attn_sinks.weight' not found"},
        {"blk.0.attn_output.bias", "blk.0.attn_output.biaX", "tensor 'blk.0.attn_output.bias' not found"},
        {"blk.1.attn_k.bias", "blk.1.attn_k.biaX", "tensor 'blk.1.attn_k.bias' not found"},
        {"blk.0.ffn_gate_inp.bias", "blk.0.ffn_gate_inp.biaX", "tensor 'blk.0.ffn_gate_inp.bias' not found"},
        {"blk.1.ffn_down_exps.bias", "blk.1.ffn_down_exps.biaX", "tensor 'blk.1.ffn_down_exps.bias' not found"},
        {"blk.0.post_attention_norm.weight", "blk.0.post_attention_norm.weighX",
         "tensor 'blk.0.post_attention_norm.weight' not found"},
        {"gpt-oss.rope.scaling.original_context_length", NULL,
         "key 'gpt-oss.rope.scaling.original_context_length' is 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        void *img;
        size_t size;
        REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
        uint8_t *b = img, *hit = NULL;
        const size_t n = strlen(cases[k].find);
        for (size_t i = 0; !hit && i + n <= size; i++)
            if (!memcmp(b + i, cases[k].find, n)) hit = b + i;
        CHECK(hit != NULL);
        if (hit && cases[k].patch) memcpy(hit, cases[k].patch, n);
        if (hit && !cases[k].patch) memset(hit + n + 4, 0, 4); /* after the key: u32 type, u32 value */
        pkv_model *m = hit ? pkv_model_load_memory(img, size, "bad gpt-oss", pkv_model_default_params()) : NULL;
        CHECK(m == NULL);
        if (hit && !strstr(pkv_errmsg(), cases[k].expect))
            TH_FAIL("%s: message '%s' lacks '%s'", cases[k].find, pkv_errmsg(), cases[k].expect);
        pkv_model_free(m);
        pkv_mkmodel_free_memory(img);
    }
}

/* RoPE scaling keys, as llama.cpp reads them: without rope.scaling.type the scaling is
 * linear, by rope.scaling.factor or the older rope.scale_linear (files converted
 * before the type key existed); "none" scales nothing; YaRN's betas are the file's
 * (32 and 1 when absent). A loader that needed the type key ran such files unscaled. */
static void scaling_keys(void) {
    static const struct {
        const char *type, *fkey;
        float factor, want_scale;
        const char *beta_key;
        float beta, want_fast, want_slow;
    } cases[] = {
        {NULL, NULL, 0, 1.0f, NULL, 0, 0, 0},
        {NULL, "rope.scaling.factor", 4, 0.25f, NULL, 0, 0, 0},
        {NULL, "rope.scale_linear", 2, 0.5f, NULL, 0, 0, 0},
        {"linear", "rope.scaling.factor", 4, 0.25f, NULL, 0, 0, 0},
        {"none", "rope.scaling.factor", 4, 1.0f, NULL, 0, 0, 0},
        {"yarn", "rope.scaling.factor", 8, 0.125f, NULL, 0, 32, 1},
        {"yarn", "rope.scaling.factor", 8, 0.125f, "rope.scaling.yarn_beta_slow", 4, 32, 4},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        pkv_gguf_writer *w = pkv_gguf_writer_create();
        REQUIRE_VOID(w);
        CHECK_OK(pkv_gguf_writer_add_str(w, "general.architecture", "llama"));
        CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.block_count", 1));
        CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.embedding_length", 64));
        CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.attention.head_count", 4));
        CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.feed_forward_length", 96));
        if (cases[k].type) CHECK_OK(pkv_gguf_writer_add_str(w, "llama.rope.scaling.type", cases[k].type));
        char key[96];
        if (cases[k].fkey) {
            snprintf(key, sizeof key, "llama.%s", cases[k].fkey);
            CHECK_OK(pkv_gguf_writer_add_f32(w, key, cases[k].factor));
        }
        if (cases[k].beta_key) {
            snprintf(key, sizeof key, "llama.%s", cases[k].beta_key);
            CHECK_OK(pkv_gguf_writer_add_f32(w, key, cases[k].beta));
        }
        void *data = NULL;
        size_t n = 0;
        CHECK_OK(pkv_gguf_writer_write_memory(w, &data, &n));
        pkv_gguf *g = data ? pkv_gguf_open_memory(data, n, "scaling") : NULL;
        pkv_hparams hp;
        int *nh = NULL, *nkv = NULL, *nff = NULL;
        CHECK(g != NULL);
        if (g && pkv_hparams_read(g, &hp, &nh, &nkv, &nff) == PKV_OK) {
            CHECK_NEAR(hp.rope_freq_scale, cases[k].want_scale, 0);
            CHECK_NEAR(hp.yarn.ext_factor, cases[k].type && !strcmp(cases[k].type, "yarn") ? 1.0 : 0.0, 0);
            if (cases[k].want_fast > 0) {
                CHECK_NEAR(hp.yarn.beta_fast, cases[k].want_fast, 0);
                CHECK_NEAR(hp.yarn.beta_slow, cases[k].want_slow, 0);
            }
        } else {
            TH_FAIL("case %zu: %s", k, pkv_errmsg());
        }
        pkv_free(nh);
        pkv_free(nkv);
        pkv_free(nff);
        pkv_gguf_close(g);
        pkv_free(data);
        pkv_gguf_writer_free(w);
    }
}

int main(void) {
    static const char *archs[] = {"llama", "qwen2",   "qwen3",  "qwen3moe", "phi3",
                                  "gemma2", "gemma3", "gpt-oss", "gemma4", "gemma4+moe"};
    enum { N_ARCHS = sizeof archs / sizeof archs[0] };
    static const pkv_type exact[] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_BF16};
    static const pkv_type quant[] = {PKV_TYPE_Q8_0, PKV_TYPE_Q4_0, PKV_TYPE_Q4_K, PKV_TYPE_Q5_K, PKV_TYPE_Q6_K};
    int cases = 0;
    for (int a = 0; a < N_ARCHS; a++) {
        for (size_t t = 0; t < sizeof exact / sizeof exact[0]; t++) {
            run_case(archs[a], exact[t], PKV_TYPE_F32, 1e-9, 1e-3, &cases);
            run_case(archs[a], exact[t], PKV_TYPE_F16, 1e-5, 1e-3, &cases);
        }
        const double qtol = !strcmp(archs[a], "gpt-oss") ? 3e-3 : 2e-3;
        for (size_t t = 0; t < sizeof quant / sizeof quant[0]; t++) run_case(archs[a], quant[t], PKV_TYPE_F16, qtol, 0.1, &cases);
    }
    run_case("gpt-oss", PKV_TYPE_MXFP4, PKV_TYPE_F16, 3e-3, 0.1, &cases); /* gpt-oss's own expert type */
    g_mixture = true; /* a "Q4_K_M"-style file: q4_k and q6_k tensors mixed */
    run_case("qwen3", PKV_TYPE_Q4_K, PKV_TYPE_F16, 2e-3, 0.1, &cases);
    CHECK_INT(cases, N_ARCHS * (2 * 3 + 5) + 2);
    bad_gpt_oss();
    scaling_keys();
    return th_done();
}
