// labels: multi cuda timeout=600
/* Tensor parallelism with the CUDA backend: the model split over cpu + cuda:0
 * (and cuda:0 + vulkan:0 when a Vulkan device opens too), with the KV cache on
 * the devices or on the host, against the model on the CPU alone; KV operations
 * on the sharded cache; the same for qwen35 (gated delta-net layers split by
 * key-head groups with their recurrent state). Tolerance: nmse 1e-8 for f16
 * weights, as for Vulkan.
 * Skipped (77) when no CUDA device opens, so it never passes without a GPU. */
#include "multi-common.h"

int main(void) {
    pkv_device *g = pkv_device_open("cuda:0", pkv_device_default_params());
    if (!g) return th_skip(pkv_errmsg());
    pkv_device_close(g);
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    bool vulkan = v != NULL;
    pkv_device_close(v);
    static float ref_lg[MNG * MV];
    int32_t ref_toks[MNG];
    pkv_model *single = NULL;
    pkv_kv_cache *sc = NULL;
    REQUIRE(mc_reference(PKV_TYPE_F16, "qwen3", &single, &sc, ref_lg, ref_toks));
    mc_compare("cuda:0 alone", "cuda:0", NULL, false, ref_lg, ref_toks, 1e-8);
    mc_compare("cpu,cuda:0", "cpu,cuda:0", NULL, false, ref_lg, ref_toks, 1e-8);
    mc_compare("cpu,cuda:0 --kv-on-host", "cpu,cuda:0", NULL, true, ref_lg, ref_toks, 1e-8);
    mc_compare("cuda:0,cpu --kv-on-host", "cuda:0,cpu", NULL, true, ref_lg, ref_toks, 1e-8);
    mc_kv_ops("cpu,cuda:0", false, single, sc, false);
    mc_kv_ops("cpu,cuda:0", true, single, sc, false);
    if (vulkan) {
        mc_compare("cuda:0,vulkan:0", "cuda:0,vulkan:0", NULL, false, ref_lg, ref_toks, 1e-8);
        mc_compare("cuda:0,vulkan:0 --kv-on-host", "cuda:0,vulkan:0", NULL, true, ref_lg, ref_toks, 1e-8);
        mc_kv_ops("cuda:0,vulkan:0", false, single, sc, false);
    }
    pkv_kv_cache_free(sc);
    pkv_model_free(single);
    /* qwen35: gated delta-net layers split by key-head groups with their recurrent state */
    REQUIRE(mc_reference(PKV_TYPE_F16, "qwen35", &single, &sc, ref_lg, ref_toks));
    mc_compare("qwen35 cpu,cuda:0", "cpu,cuda:0", NULL, false, ref_lg, ref_toks, 1e-8);
    mc_compare("qwen35 cuda:0,cpu --kv-on-host", "cuda:0,cpu", NULL, true, ref_lg, ref_toks, 1e-8);
    mc_kv_ops("cpu,cuda:0", true, single, sc, false);
    pkv_kv_cache_free(sc);
    pkv_model_free(single);
    pkv_mkmodel_free_memory(mc_img);
    return th_done();
}
