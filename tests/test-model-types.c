// labels: model vulkan timeout=600
/* A model per weight type beyond the first ones (q4_1, q5_0, q5_1, q2_k, q3_k,
 * the i-quants, tq1_0, tq2_0) and two mixtures of the kind llama-quantize writes
 * ("q3_k_m": q3_k + q4_k + q5_k + q6_k; "iq3_m": iq3_s with the same k-quants),
 * from mkmodel: the paged forward pass on cpu and on vulkan:0 against the
 * double-precision reference (tests/ref-model.h) reading the same file,
 * dequantized exactly. Tolerance, as for the other quantized types in
 * test-model-ref.c: nmse 2e-3 of the logits of a 24-token prompt and 8 single
 * steps (the CPU rounds activations to 8 bits), and the greedy token of every
 * position agrees unless the reference's top two are within the near-tie margin.
 * A type the device does not support must be refused at load with a message
 * naming a tensor, the type and the device (counted; never wrong logits). The
 * CPU is checked on its generic path too for one type of each family. Then the
 * CLI: mkmodel --type for every type, bench model and devices name the types
 * that run on a slow fallback path. Vulkan: skipped where no device opens. */
#include "base/quant.h"
#include "model/gguf.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

#include <unistd.h>

enum { NP = 24, NS = 8, V = 300 };

static int g_refused; /* loads refused by a device for an unsupported type */

/* The model of type wt (a mixture with mix) on dev against the reference. */
static void run_case(const char *arch, pkv_type wt, bool mix, const char *dev) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = wt;
    p.k_mixture = mix;
    const bool kq = pkv_type_block_elems(wt) == 256 || mix;
    p.n_layer = 2;
    p.n_embd = kq ? 256 : 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = kq ? 64 : 16;
    p.n_ff = kq ? 256 : 96;
    p.n_vocab = V;
    const char *label = mix ? (wt == PKV_TYPE_Q3_K ? "q3_k_m" : "iq3_m") : pkv_type_name(wt);
    void *img;
    size_t size;
    if (pkv_mkmodel_memory(&p, &img, &size)) {
        TH_FAIL("%s: mkmodel: %s", label, pkv_errmsg());
        return;
    }
    pkv_gguf *g = pkv_gguf_open_memory(img, size, label);
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    mp.device = dev;
    pkv_model *m = pkv_model_load_memory(img, size, label, mp);
    if (!m) {
        /* only a device without the type may refuse, and it must say which */
        pkv_device *d = pkv_device_open(dev, pkv_device_default_params());
        const bool lacks = d && pkv_device_weight_speed(d, wt) == PKV_WEIGHT_NONE;
        pkv_device_close(d);
        const char *msg = pkv_errmsg();
        if (!lacks || !strstr(msg, "tensor '") || !strstr(msg, dev) || !strstr(msg, pkv_type_name(wt)))
            TH_FAIL("%s on %s: load failed: %s", label, dev, msg);
        else
            g_refused++;
        th_checks++;
        fprintf(stderr, "%-8s %-8s refused: %s\n", label, dev, msg);
        pkv_gguf_close(g);
        pkv_mkmodel_free_memory(img);
        return;
    }
    REQUIRE_VOID(g);
    ref_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = arch;
    hp.n_layer = p.n_layer;
    hp.n_embd = p.n_embd;
    hp.n_head = p.n_head;
    hp.n_head_kv = p.n_head_kv;
    hp.head_dim = p.head_dim;
    hp.n_ff = p.n_ff;
    hp.n_vocab = p.n_vocab;
    hp.rms_eps = !strcmp(arch, "llama") ? 1e-5 : 1e-6; /* mkmodel: Llama's norm epsilon, or Qwen's */
    hp.rope_base = !strcmp(arch, "llama") ? 1e4 : 1e6;
    hp.rope_neox = strcmp(arch, "llama") != 0;
    ref_model *r = ref_model_create(&hp, ref_gguf_tensor, g);
    REQUIRE_VOID(r);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.page_size = 5; /* pages end mid-prompt */
    cp.n_ctx = 64;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    REQUIRE_VOID(ctx);
    int32_t toks[NP + NS];
    for (int i = 0; i < NP + NS; i++) toks[i] = (i * 97 + 13) % V;
    float *got = malloc((size_t)(NP + NS) * V * sizeof *got);
    double *want = malloc((size_t)(NP + NS) * V * sizeof *want);
    REQUIRE_VOID(got && want);
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
            const double w = want[(size_t)t * V + k], x = got[(size_t)t * V + k];
            num += (w - x) * (w - x);
            den += w * w;
            if (x > got[(size_t)t * V + ag]) ag = k;
            if (w > want[(size_t)t * V + aw]) aw = k;
        }
        for (int k = 0; k < V; k++)
            if (k != aw && (second < 0 || want[(size_t)t * V + k] > want[(size_t)t * V + second])) second = k;
        worst = fmax(worst, num / den);
        const bool near_tie = want[(size_t)t * V + aw] - want[(size_t)t * V + second] < fmax(0.1, 6 * sqrt(num / V));
        if (ag != aw && !near_tie) disagree++;
    }
    fprintf(stderr, "%-8s %-8s %-5s nmse %.2e (tol 2e-03)%s\n", label, dev, arch, worst, disagree ? " ARGMAX DIFFERS" : "");
    if (!(worst <= 2e-3)) TH_FAIL("%s %s on %s: nmse %g > 2e-3", arch, label, dev, worst);
    th_checks++;
    CHECK_INT(disagree, 0);
    free(got);
    free(want);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    ref_model_free(r);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

static const pkv_type k_types[16] = {PKV_TYPE_Q4_1,    PKV_TYPE_Q5_0,   PKV_TYPE_Q5_1,   PKV_TYPE_Q2_K,
                                     PKV_TYPE_Q3_K,    PKV_TYPE_IQ4_NL, PKV_TYPE_IQ4_XS, PKV_TYPE_IQ3_XXS,
                                     PKV_TYPE_IQ3_S,   PKV_TYPE_IQ2_XXS, PKV_TYPE_IQ2_XS, PKV_TYPE_IQ2_S,
                                     PKV_TYPE_IQ1_S,   PKV_TYPE_IQ1_M,  PKV_TYPE_TQ1_0,  PKV_TYPE_TQ2_0};

/* The CLI: mkmodel --type for every type (and a mixture), bench model's JSON
 * names the slow ones among the model's types, devices lists them, and a row
 * length a type cannot tile is refused naming the block. */
static void cli(void) {
    if (!getenv("PKV_CLI")) {
        printf("note: PKV_CLI not set (not run through ctest): CLI checks skipped\n");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s", th_tmp("types.gguf"));
    for (int i = 0; i < 16; i++) {
        const char *n = pkv_type_name(k_types[i]);
        if (th_cli("", true, "mkmodel --type %s --layers 1 --vocab 300 -o %s", n, path)) TH_FAIL("mkmodel --type %s: %s", n, th_out);
        if (!strstr(th_out, n)) TH_FAIL("mkmodel --type %s: '%s'", n, th_out);
        th_checks++;
    }
    CHECK_INT(th_cli("", true, "mkmodel --type q3_k_m --layers 2 --vocab 300 -o %s", path), 0);
    HAS("q3_k_m mixture");
    CHECK_INT(th_cli("", true, "mkmodel --type q3_k --dim 64 -o %s", path), 1);
    HAS("multiples of 256");
    /* iq2_xxs has no kernel of its own on any CPU path; iq4_xs has on avx2/avx512 and the ARM paths */
    CHECK_INT(th_cli("", true, "mkmodel --type iq2_xxs --layers 1 --vocab 300 -o %s", path), 0);
    CHECK_INT(th_cli("", false, "bench model -m %s --prefill 4 --decode 2 --depth 0 --json", path), 0);
    HAS("\"slow_weight_types\": [\"iq2_xxs\"]");
    CHECK_INT(th_cli("", false, "bench model -m %s --prefill 4 --decode 2 --depth 0", path), 0);
    HAS("note: weight types on a slow fallback path on cpu: iq2_xxs");
    CHECK_INT(th_cli("PKV_CPU_PATH=generic", false, "devices"), 0);
    HAS("weight types on a slow fallback path: q4_1, q5_0, q5_1, q2_k, q3_k");
    unlink(path);
}

int main(void) {
    /* the CPU's best path, all types; the generic path for one type of each family */
    for (int i = 0; i < 16; i++) run_case("llama", k_types[i], false, "cpu");
    run_case("qwen3", PKV_TYPE_Q3_K, true, "cpu");
    run_case("llama", PKV_TYPE_IQ3_S, true, "cpu");
    setenv("PKV_CPU_PATH", "generic", 1);
    static const pkv_type fam[] = {PKV_TYPE_Q5_1, PKV_TYPE_Q3_K, PKV_TYPE_IQ4_XS, PKV_TYPE_IQ2_S, PKV_TYPE_IQ1_M, PKV_TYPE_TQ1_0};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) run_case("llama", fam[i], false, "cpu");
    unsetenv("PKV_CPU_PATH");
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (v) {
        pkv_device_close(v);
        for (int i = 0; i < 16; i++) run_case("llama", k_types[i], false, "vulkan:0");
        run_case("qwen3", PKV_TYPE_Q3_K, true, "vulkan:0");
        run_case("llama", PKV_TYPE_IQ3_S, true, "vulkan:0");
        if (g_refused) printf("note: vulkan:0 refused %d of the models (types it lacks), each naming the type\n", g_refused);
    } else {
        printf("note: no vulkan:0 here (%s): the Vulkan half is not run\n", pkv_errmsg());
    }
    cli();
    return th_done();
}
