// labels: model vulkan timeout=600
/* LoRA adapters on vulkan:0 (docs/lora.md): a model with two adapters gives the
 * CPU's logits (f32 weights, every prompt token), scale 0 is bitwise the device's
 * base, and where the device is batch-invariant, engine requests with different
 * adapter sets batched together equal each alone. The adapters cover every matrix
 * mkmodel writes: token_embd (the tied output of gemma3), phi3's fused matrices,
 * qwen35's gated attn_q and delta-net matrices, lfm2's short-conv matrices, the
 * experts and routers of qwen3moe and gpt-oss, each against the CPU. Skipped when no Vulkan device
 * opens. */
#include "engine-testlib.h"
#include "model/lora.h"

enum { N_TOK = 12, V = 320 };

static pkv_model *load_on(const char *path, const char *dev) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    mp.device = dev;
    pkv_model *m = pkv_model_load(path, mp);
    if (!m) TH_FAIL("load %s on %s: %s", path, dev, pkv_errmsg());
    return m;
}

static bool logits_of(pkv_model *m, const int32_t *tok, float *out) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    cp.page_size = 8;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 64) : NULL;
    bool ok = ctx && !pkv_context_decode_all(ctx, tok, N_TOK, out);
    if (!ok) TH_FAIL("decode: %s", pkv_errmsg());
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    return ok;
}

/* arch's base with two adapters on vulkan:0 against the CPU. */
static void arch_vs_cpu(const char *arch, int n_layer, const int32_t *tok) {
    char base[512], a1[512], a2[512];
    snprintf(base, sizeof base, "%s", th_tmp("lora-vk-arch.gguf"));
    snprintf(a1, sizeof a1, "%s", th_tmp("lora-vk-arch-a1.gguf"));
    snprintf(a2, sizeof a2, "%s", th_tmp("lora-vk-arch-a2.gguf"));
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = PKV_TYPE_F32;
    p.n_layer = n_layer;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = V;
    p.seed = 7;
    pkv_mklora_params l1 = {.base = base, .rank = 8, .alpha = 16, .type = PKV_TYPE_F16, .seed = 1},
                      l2 = {.base = base, .rank = 4, .alpha = 0, .type = PKV_TYPE_F32, .seed = 2};
    if (pkv_mkmodel_write(&p, base) || pkv_mklora_write(&l1, a1) || pkv_mklora_write(&l2, a2)) {
        TH_FAIL("%s: mkmodel: %s", arch, pkv_errmsg());
        return;
    }
    static float cpu[N_TOK * V], vk[N_TOK * V], vk0[N_TOK * V];
    pkv_model *mc = load_on(base, "cpu"), *mv = load_on(base, "vulkan:0");
    pkv_lora *c1 = mc ? pkv_lora_load(mc, a1) : NULL, *c2 = mc ? pkv_lora_load(mc, a2) : NULL,
             *v1 = mv ? pkv_lora_load(mv, a1) : NULL, *v2 = mv ? pkv_lora_load(mv, a2) : NULL;
    if (!c1 || !c2 || !v1 || !v2) TH_FAIL("%s: pkv_lora_load: %s", arch, pkv_errmsg());
    if (c1 && c2 && v1 && v2) {
        pkv_lora_use uc[2] = {{c1, 0.75f}, {c2, -1.5f}}, uv[2] = {{v1, 0.75f}, {v2, -1.5f}};
        CHECK(logits_of(mv, tok, vk0));
        CHECK_OK(pkv_model_lora_apply(mc, uc, 2));
        CHECK_OK(pkv_model_lora_apply(mv, uv, 2));
        CHECK(logits_of(mc, tok, cpu));
        CHECK(logits_of(mv, tok, vk));
        double e = th_nmse(cpu, vk, (size_t)N_TOK * V), effect = th_nmse(cpu, vk0, (size_t)N_TOK * V);
        fprintf(stderr, "%s on vulkan:0 with two adapters vs the CPU: NMSE %.3g (the adapters' effect %.3g)\n", arch, e,
                effect);
        CHECK(e < 1e-5);
        CHECK(effect > 1e-3);
    }
    pkv_model_free(mc);
    pkv_model_free(mv);
    remove(base), remove(a1), remove(a2);
}

int main(void) {
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!v) return th_skip("no Vulkan device opens");
    const bool invariant = pkv_device_get_caps(v)->batch_invariant;
    pkv_device_close(v);
    char base[512], a1[512], a2[512];
    snprintf(base, sizeof base, "%s", th_tmp("lora-vk-base.gguf"));
    snprintf(a1, sizeof a1, "%s", th_tmp("lora-vk-a1.gguf"));
    snprintf(a2, sizeof a2, "%s", th_tmp("lora-vk-a2.gguf"));
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.type = PKV_TYPE_F32;
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = V;
    pkv_mklora_params l1 = {.base = base, .rank = 8, .alpha = 16, .type = PKV_TYPE_F16, .seed = 1},
                      l2 = {.base = base, .rank = 4, .alpha = 0, .type = PKV_TYPE_F32, .seed = 2};
    REQUIRE(!pkv_mkmodel_write(&p, base) && !pkv_mklora_write(&l1, a1) && !pkv_mklora_write(&l2, a2));
    int32_t tok[N_TOK];
    uint64_t rs = 3;
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)(th_rand(&rs) % 300);
    static float cpu[N_TOK * V], vk[N_TOK * V], vk0[N_TOK * V];
    pkv_model *mc = load_on(base, "cpu"), *mv = load_on(base, "vulkan:0");
    REQUIRE(mc && mv);
    pkv_lora *c1 = pkv_lora_load(mc, a1), *c2 = pkv_lora_load(mc, a2), *v1 = pkv_lora_load(mv, a1), *v2 = pkv_lora_load(mv, a2);
    if (!c1 || !c2 || !v1 || !v2) TH_FAIL("pkv_lora_load: %s", pkv_errmsg());
    REQUIRE(c1 && c2 && v1 && v2);
    CHECK(logits_of(mv, tok, vk0));
    pkv_lora_use uz = {v1, 0.0f};
    CHECK_OK(pkv_model_lora_apply(mv, &uz, 1));
    CHECK(logits_of(mv, tok, vk));
    CHECK_MEM(vk, vk0, sizeof vk);
    pkv_lora_use uc[2] = {{c1, 0.75f}, {c2, -1.5f}}, uv[2] = {{v1, 0.75f}, {v2, -1.5f}};
    CHECK_OK(pkv_model_lora_apply(mc, uc, 2));
    CHECK_OK(pkv_model_lora_apply(mv, uv, 2));
    CHECK(logits_of(mc, tok, cpu));
    CHECK(logits_of(mv, tok, vk));
    double e = th_nmse(cpu, vk, (size_t)N_TOK * V), effect = th_nmse(cpu, vk0, (size_t)N_TOK * V);
    fprintf(stderr, "vulkan:0 with two adapters vs the CPU: NMSE %.3g (the adapters' effect %.3g)\n", e, effect);
    CHECK(e < 1e-5);
    CHECK(effect > 1e-3);
    CHECK_OK(pkv_model_lora_apply(mv, NULL, 0));

    if (!invariant) {
        fprintf(stderr, "vulkan:0 is not batch-invariant: the engine check is skipped\n");
    } else { /* requests with different sets batched == each alone */
        et_device = "vulkan:0";
        const pkv_lora_use sets[3][2] = {{{v1, 1.0f}}, {{v2, 0.5f}}, {{v1, 1.0f}, {v2, 0.5f}}};
        const int n_set[3] = {1, 1, 2};
        pkv_request_params rp[3];
        static et_rec alone[3], batched[3];
        for (int i = 0; i < 3; i++) {
            rp[i] = pkv_request_default_params();
            rp[i].prompt = tok;
            rp[i].n_prompt = N_TOK - i;
            rp[i].max_tokens = 8;
            rp[i].sampling.temp = 0;
            rp[i].top_logprobs = ET_TOP;
            rp[i].lora = sets[i];
            rp[i].n_lora = n_set[i];
            et_alone(mv, &rp[i], &alone[i]);
        }
        pkv_engine *eng = pkv_engine_create(mv, et_params(256, 8, 0));
        REQUIRE(eng);
        for (int i = 0; i < 3; i++) {
            pkv_request_params r = rp[i];
            r.on_event = et_on_event;
            r.user = &batched[i];
            CHECK_OK(pkv_engine_submit(eng, &r, NULL));
        }
        et_drain(eng);
        for (int i = 0; i < 3; i++) et_same(&alone[i], &batched[i], 1, "vulkan: batched with other sets: request", i);
        pkv_engine_free(eng);
    }
    pkv_model_free(mc); /* (frees its adapters) */
    pkv_model_free(mv);
    remove(base), remove(a1), remove(a2);
    arch_vs_cpu("phi3", 2, tok);
    arch_vs_cpu("qwen3moe", 2, tok);
    arch_vs_cpu("gpt-oss", 2, tok);
    arch_vs_cpu("qwen35", 4, tok);
    arch_vs_cpu("lfm2", 3, tok);
    arch_vs_cpu("gemma3", 2, tok);
    return th_done();
}
