// labels: model vulkan timeout=900
/* The model on vulkan:0: fork == replay bitwise, swap and save/load round trips,
 * batches (test-model.c on that device); then whole-model logits of every
 * architecture (qwen35's delta-net layers, granitehybrid's Mamba-2 layers and lfm2's short convolutions included; gpt-oss also with mxfp4 experts; gemma4 with its shared
 * KV layers and per-layer embeddings) and weight type against the CPU. Tolerance: nmse 1e-5 for
 * f32/f16/bf16 weights (f16 KV on both); 2e-3 for q8_0/q4_0 and the k-quants
 * (the CPU rounds activations to 8 bits in blocks of 32, the Vulkan shaders do
 * not: measured 1.5e-4 to 2e-4 for all of them; qwen35 and glm4moe wider,
 * quant_tol). The k-quant models (dims of
 * 256) are also compared with the CPU running their f32 twin (the same weights
 * dequantized, so no activation rounding anywhere) within 1e-5 (measured
 * <= 1e-9). With q8_0 / q4_0 KV pages (f32 weights) the logits are within 1e-6
 * of the CPU's. Weight types the device does not support must be refused at load
 * with a message naming the tensor and the device. Skipped when no Vulkan
 * device opens. */
#define MODEL_DEVICE "vulkan:0"
#include "device/device.h"
int model_main(void);
#define main model_main
#include "test-model.c"
#undef main

#include "base/quant.h"
#include "model/gguf.h"

static pkv_type g_kv = PKV_TYPE_F16; /* KV pages of decode19 */

/* Logits of 19 tokens of a model on dev, g_kv KV. */
static void decode19(pkv_model *m, float *out, bool *ok) {
    *ok = m != NULL;
    if (!m) return;
    pkv_kv_cache *c = cache(m, 16, g_kv);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    int32_t toks[19];
    for (int i = 0; i < 19; i++) toks[i] = (i * 41 + 2) % V;
    *ok = ctx && pkv_context_decode_all(ctx, toks, 19, out) == PKV_OK;
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* gemma3 gets its first global layer (the sixth): RoPE differs by layer there;
 * gemma4 mkmodel's six (two of them reusing earlier layers' KV); smollm3 its first
 * layer without RoPE (the fourth); llama4 its NoPE layer (the fourth) after three
 * chunked ones (19 tokens: past two chunks of 8); granitehybrid its attention layer
 * between Mamba-2 layers; glm4moe a dense layer, mixtures with and without Q/K norms;
 * nemotron_h a Mamba-2, an MLP and an attention layer; lfm2 (and lfm2moe, its experts after
 * the first layer) two short-conv layers, then attention */
static int layers_of(const char *arch) {
    static const struct {
        const char *arch;
        int n;
    } t[] = {{"gemma3", 6},  {"gemma4", 6},  {"qwen35", 4},        {"qwen35moe", 4}, {"smollm3", 4},
             {"llama4", 4},  {"glm4moe", 3}, {"granitehybrid", 4}, {"nemotron_h", 3}, {"lfm2", 3},
             {"lfm2moe", 3}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(arch, t[i].arch)) return t[i].n;
    return 2;
}

/* The bound for a quantized model against the CPU, whose activations are rounded
 * to 8 bits: a recurrent state (qwen35, granitehybrid, nemotron_h) carries each
 * token's rounding on to the next ones; in qwen35moe, glm4moe and lfm2moe the rounding
 * also moves a close second or third expert (glm4moe's sigmoid scores sit close
 * together: q5_k/q6_k 3.4e-2 measured; lfm2moe q6_k 6.0e-3, its f32 twin 8e-12). The
 * exact check of those is against the f32 twin (kq_twin). */
static double quant_tol(const char *arch) {
    if (!strcmp(arch, "glm4moe")) return 1e-1;
    if (!strcmp(arch, "qwen35moe") || !strcmp(arch, "lfm2moe")) return 2e-2;
    if (!strcmp(arch, "qwen35") || !strcmp(arch, "granitehybrid") || !strcmp(arch, "nemotron_h")) return 6e-3;
    return 2e-3;
}

static void logits_of(const char *arch, pkv_type t, const char *dev, float *out, bool *ok) {
    decode19(make(arch, t, layers_of(arch), dev), out, ok);
}

#include "kq-twin.h"

int main(void) {
    int rc = model_main();
    if (rc) return rc; /* skipped (77) or failed */
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "gpt-oss", "qwen35",
                                  "gemma4", "smollm3", "mistral3", "qwen35moe", "llama4", "glm4moe", "granitehybrid",
                                  "nemotron_h", "lfm2", "lfm2moe"};
    static const pkv_type types[] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_BF16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0,
                                     PKV_TYPE_Q4_K, PKV_TYPE_Q5_K, PKV_TYPE_Q6_K};
    static float a[19 * V], b[19 * V];
    for (int ai = 0; ai < (int)(sizeof archs / sizeof archs[0]); ai++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            pkv_type t = types[ti];
            if (pkv_type_block_elems(t) == 256) continue; /* needs dims of 256: checked below */
            bool ok_c, ok_v;
            logits_of(archs[ai], t, "cpu", a, &ok_c);
            logits_of(archs[ai], t, "vulkan:0", b, &ok_v);
            if (!ok_c || !ok_v) {
                TH_FAIL("%s %s: %s", archs[ai], pkv_type_name(t), pkv_errmsg());
                continue;
            }
            /* quantized: quant_tol's bound here, and the exact check against the f32 twin below */
            double e = th_nmse(a, b, 19 * V), tol = pkv_type_block_elems(t) == 1 ? 1e-5 : quant_tol(archs[ai]);
            fprintf(stderr, "%-6s %-5s vulkan:0 vs cpu nmse %.2e (tol %.0e)\n", archs[ai], pkv_type_name(t), e, tol);
            if (!(e <= tol)) TH_FAIL("%s %s: nmse %g > %g", archs[ai], pkv_type_name(t), e, tol);
        }
    /* gemma4 with experts beside every layer's dense FFN (f32: top 2 of 4; q8_0: all 4,
     * as the CPU's 8-bit activations can swap a close second and third expert) */
    for (int k = 0; k < 2; k++) {
        pkv_mkmodel_params p = pkv_mkmodel_default_params();
        p.arch = "gemma4";
        p.type = k ? PKV_TYPE_Q8_0 : PKV_TYPE_F32;
        p.n_embd = g_embd;
        p.n_head = 4;
        p.n_ff = 128;
        p.n_vocab = V;
        p.n_expert = 4;
        p.n_expert_used = k ? 4 : 2;
        void *img = NULL;
        size_t size = 0;
        bool ok_c = false, ok_v = false;
        if (!pkv_mkmodel_memory(&p, &img, &size)) {
            decode19(kq_load(img, size, "cpu"), a, &ok_c);
            decode19(kq_load(img, size, "vulkan:0"), b, &ok_v);
        }
        pkv_mkmodel_free_memory(img);
        if (!ok_c || !ok_v) {
            TH_FAIL("gemma4 experts %s: %s", pkv_type_name(p.type), pkv_errmsg());
            continue;
        }
        double e = th_nmse(a, b, 19 * V), tol = k ? 2e-3 : 1e-5;
        fprintf(stderr, "gemma4 experts %-5s vulkan:0 vs cpu nmse %.2e (tol %.0e)\n", pkv_type_name(p.type), e, tol);
        if (!(e <= tol)) TH_FAIL("gemma4 experts %s: nmse %g > %g", pkv_type_name(p.type), e, tol);
    }
    /* qwen35 and qwen35moe q8_0 / q4_0 on the device against the CPU running the same
     * weights dequantized to f32 (no activation rounding on either side) */
    for (int k = 0; k < 4; k++) {
        const char *arch = k < 2 ? "qwen35" : "qwen35moe";
        pkv_mkmodel_params p = kq_params(arch, k % 2 ? PKV_TYPE_Q4_0 : PKV_TYPE_Q8_0);
        p.n_layer = 4;
        p.n_embd = g_embd;
        void *img = NULL, *twin = NULL;
        size_t size, twin_size;
        bool ok_v = false, ok_t = false;
        if (!pkv_mkmodel_memory(&p, &img, &size)) {
            decode19(kq_load(img, size, "vulkan:0"), b, &ok_v);
            ok_t = kq_twin(&p, img, size, &twin, &twin_size);
            if (ok_t) decode19(kq_load(twin, twin_size, "cpu"), a, &ok_t);
        }
        pkv_mkmodel_free_memory(img);
        pkv_mkmodel_free_memory(twin);
        if (!ok_v || !ok_t) {
            TH_FAIL("%s %s twin: %s", arch, pkv_type_name(p.type), pkv_errmsg());
            continue;
        }
        double e = th_nmse(a, b, 19 * V);
        fprintf(stderr, "%s %-5s vulkan:0 vs its f32 twin on cpu nmse %.2e (tol 1e-05)\n", arch, pkv_type_name(p.type), e);
        if (!(e <= 1e-5)) TH_FAIL("%s %s vs twin: nmse %g", arch, pkv_type_name(p.type), e);
    }
    /* gpt-oss with its own expert type, mxfp4 (as the q8_0/q4_0 models: the CPU rounds
     * activations to 8 bits, the shaders do not) */
    if (pkv_device_supports_weight(v, PKV_TYPE_MXFP4)) {
        bool ok_c, ok_v;
        logits_of("gpt-oss", PKV_TYPE_MXFP4, "cpu", a, &ok_c);
        logits_of("gpt-oss", PKV_TYPE_MXFP4, "vulkan:0", b, &ok_v);
        if (!ok_c || !ok_v) {
            TH_FAIL("gpt-oss mxfp4: %s", pkv_errmsg());
        } else {
            double e = th_nmse(a, b, 19 * V), tol = 2e-3;
            fprintf(stderr, "%-6s %-5s vulkan:0 vs cpu nmse %.2e (tol %.0e)\n", "gpt-oss", "mxfp4", e, tol);
            if (!(e <= tol)) TH_FAIL("gpt-oss mxfp4: nmse %g > %g", e, tol);
        }
    }
    /* quantized KV pages (heads of 32, f32 weights): the two devices' K/V differ in
     * the last bits before quantization, which can move a value to the
     * neighbouring step; the logits stay close */
    g_embd = 128;
    for (int ai = 0; ai < (int)(sizeof archs / sizeof archs[0]); ai++)
        for (int k = 0; k < 2; k++) {
            g_kv = k ? PKV_TYPE_Q4_0 : PKV_TYPE_Q8_0;
            bool ok_c, ok_v;
            logits_of(archs[ai], PKV_TYPE_F32, "cpu", a, &ok_c);
            logits_of(archs[ai], PKV_TYPE_F32, "vulkan:0", b, &ok_v);
            if (!ok_c || !ok_v) {
                TH_FAIL("%s KV %s: %s", archs[ai], pkv_type_name(g_kv), pkv_errmsg());
                continue;
            }
            /* llama4's RoPE layers cache RMS-normed K (entries about 1, so one moved
             * q8_0 step is a larger part of a score; measured 1.1e-6 once, q4_0 1e-13) */
            double e = th_nmse(a, b, 19 * V), tol = !strcmp(archs[ai], "llama4") ? 1e-5 : 1e-6;
            fprintf(stderr, "%-6s f32, KV %s: vulkan:0 vs cpu nmse %.2e (tol %.0e)\n", archs[ai], pkv_type_name(g_kv), e, tol);
            if (!(e <= tol)) TH_FAIL("%s KV %s: nmse %g > %g", archs[ai], pkv_type_name(g_kv), e, tol);
        }
    g_kv = PKV_TYPE_F16;
    g_embd = 64;
    /* k-quants: supported on the device and close to the CPU (which rounds
     * activations to 8 bits in blocks of 32, the Vulkan shaders do not), or
     * refused with a clear message */
    for (int ai = 0; ai < (int)(sizeof archs / sizeof archs[0]); ai++)
        for (int k = 5; k < 8; k++) {
            pkv_mkmodel_params p = kq_params(archs[ai], types[k]);
            p.n_layer = layers_of(archs[ai]);
            void *img;
            size_t size;
            if (pkv_mkmodel_memory(&p, &img, &size)) {
                TH_FAIL("mkmodel %s %s: %s", archs[ai], pkv_type_name(types[k]), pkv_errmsg());
                continue;
            }
            if (pkv_device_supports_weight(v, types[k])) {
                bool ok_c, ok_v, ok_t;
                void *twin;
                size_t twin_size;
                static float t32[19 * V];
                decode19(kq_load(img, size, "cpu"), a, &ok_c);
                decode19(kq_load(img, size, "vulkan:0"), b, &ok_v);
                ok_t = kq_twin(&p, img, size, &twin, &twin_size);
                if (ok_t) {
                    decode19(kq_load(twin, twin_size, "cpu"), t32, &ok_t);
                    pkv_mkmodel_free_memory(twin);
                }
                if (!ok_c || !ok_v || !ok_t) {
                    TH_FAIL("%s %s: %s", archs[ai], pkv_type_name(types[k]), pkv_errmsg());
                } else {
                    /* vs the CPU on the k-quant model: its activations are rounded (quant_tol) */
                    double e = th_nmse(a, b, 19 * V), tol = quant_tol(archs[ai]);
                    /* vs the CPU on the f32 twin: the same arithmetic up to f32 rounding */
                    double e32 = th_nmse(t32, b, 19 * V), tol32 = 1e-5;
                    th_checks += 2;
                    fprintf(stderr, "%-6s %-5s vulkan:0 vs cpu nmse %.2e (tol %.0e), vs cpu on the f32 twin %.2e (tol %.0e)\n",
                            archs[ai], pkv_type_name(types[k]), e, tol, e32, tol32);
                    if (!(e <= tol)) TH_FAIL("%s %s: nmse %g > %g", archs[ai], pkv_type_name(types[k]), e, tol);
                    if (!(e32 <= tol32))
                        TH_FAIL("%s %s vs f32 twin: nmse %g > %g", archs[ai], pkv_type_name(types[k]), e32, tol32);
                }
            } else {
                pkv_model *m = kq_load(img, size, "vulkan:0");
                CHECK(m == NULL);
                CHECK_MSG("which device vulkan:0 does not support");
                pkv_model_free(m);
            }
            pkv_mkmodel_free_memory(img);
        }
    pkv_device_close(v);
    return th_done();
}
