// labels: multi vulkan timeout=600
/* Tensor parallelism across backends: the model split over cpu + vulkan:0, with
 * the KV cache on the devices or on the host, against the model on the CPU alone.
 * Tolerance: nmse 1e-8 for f16 weights (different kernels and summation order on
 * each backend); the same with quantized KV pages (K q8_0, V q4_0): 1e-6 (a
 * last-bit difference can move one quantized K/V value by a step). Then qwen35
 * (gated delta-net layers split by key-head groups with their recurrent state)
 * and lfm2 (short-conv layers by channel blocks with their conv state): 1e-8. Skipped when no Vulkan device can be opened. */
#include "multi-common.h"

int main(void) {
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!v) return th_skip(pkv_errmsg());
    pkv_device_close(v);
    static float ref_lg[MNG * MV];
    int32_t ref_toks[MNG];
    for (int q = 0; q < 2; q++) {
    const double tol = q ? 1e-6 : 1e-8;
    mc_kv_k = q ? PKV_TYPE_Q8_0 : PKV_TYPE_F16;
    mc_kv_v = q ? PKV_TYPE_Q4_0 : PKV_TYPE_F16;
    if (q) fprintf(stderr, "KV K q8_0, V q4_0:\n");
    pkv_model *single = NULL;
    pkv_kv_cache *sc = NULL;
    REQUIRE(mc_reference(PKV_TYPE_F16, "qwen3", &single, &sc, ref_lg, ref_toks));
    mc_compare("cpu,vulkan:0", "cpu,vulkan:0", NULL, false, ref_lg, ref_toks, tol);
    mc_compare("cpu,vulkan:0 --kv-on-host", "cpu,vulkan:0", NULL, true, ref_lg, ref_toks, tol);
    mc_compare("vulkan:0 alone", "vulkan:0", NULL, false, ref_lg, ref_toks, tol);
    mc_kv_ops("cpu,vulkan:0", false, single, sc, false);
    mc_kv_ops("cpu,vulkan:0", true, single, sc, false);
    pkv_kv_cache_free(sc);
    pkv_model_free(single);
    }
    /* qwen35 (the gated delta-net layers split by key-head groups) and lfm2 (the
     * short-conv layers by channel blocks), each shard's recurrent state in the
     * cache's state slots on its own device (also with the KV on the host); a
     * truncate replays the state (a batch on Vulkan is not bitwise one token at a
     * time: nmse 1e-8) */
    static const char *const recs[] = {"qwen35", "lfm2"};
    for (int a = 0; a < 2; a++) {
        mc_kv_k = mc_kv_v = PKV_TYPE_F16;
        fprintf(stderr, "%s f16:\n", recs[a]);
        pkv_model *single = NULL;
        pkv_kv_cache *sc = NULL;
        REQUIRE(mc_reference(PKV_TYPE_F16, recs[a], &single, &sc, ref_lg, ref_toks));
        mc_compare("cpu,vulkan:0", "cpu,vulkan:0", NULL, false, ref_lg, ref_toks, 1e-8);
        mc_compare("cpu,vulkan:0 --kv-on-host", "cpu,vulkan:0", NULL, true, ref_lg, ref_toks, 1e-8);
        mc_compare("vulkan:0,cpu --split 1,3", "vulkan:0,cpu", "1,3", false, ref_lg, ref_toks, 1e-8);
        mc_kv_ops("cpu,vulkan:0", false, single, sc, false);
        mc_kv_ops("cpu,vulkan:0", true, single, sc, false);
        pkv_kv_cache_free(sc);
        pkv_model_free(single);
    }
    /* gemma3 with one KV head over cpu and vulkan:0: the head replicated on both,
     * each device writing its own replica (the first device's K/V rows) */
    {
        mc_kv_k = mc_kv_v = PKV_TYPE_F16;
        mc_n_head_kv = 1;
        fprintf(stderr, "gemma3, one KV head (replicated):\n");
        pkv_model *single = NULL;
        pkv_kv_cache *sc = NULL;
        REQUIRE(mc_reference(PKV_TYPE_F16, "gemma3", &single, &sc, ref_lg, ref_toks));
        mc_compare("cpu,vulkan:0", "cpu,vulkan:0", NULL, false, ref_lg, ref_toks, 1e-8);
        mc_compare("cpu,vulkan:0 --kv-on-host", "cpu,vulkan:0", NULL, true, ref_lg, ref_toks, 1e-8);
        mc_kv_ops("cpu,vulkan:0", false, single, sc, false);
        pkv_kv_cache_free(sc);
        pkv_model_free(single);
    }
    /* qwen3moe with its experts over cpu and vulkan:0 (expert parallelism: experts
     * 0-1 on one device, 2-3 on the other) */
    {
        mc_kv_k = mc_kv_v = PKV_TYPE_F16;
        mc_n_head_kv = 8;
        fprintf(stderr, "qwen3moe, experts over the devices:\n");
        pkv_model *single = NULL;
        pkv_kv_cache *sc = NULL;
        REQUIRE(mc_reference(PKV_TYPE_F16, "qwen3moe", &single, &sc, ref_lg, ref_toks));
        mc_compare("cpu,vulkan:0", "cpu,vulkan:0", NULL, false, ref_lg, ref_toks, 1e-8);
        mc_compare("vulkan:0,cpu --kv-on-host", "vulkan:0,cpu", NULL, true, ref_lg, ref_toks, 1e-8);
        mc_kv_ops("cpu,vulkan:0", false, single, sc, false);
        pkv_kv_cache_free(sc);
        pkv_model_free(single);
    }
    pkv_mkmodel_free_memory(mc_img);
    return th_done();
}
