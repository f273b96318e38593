// labels: multi vulkan timeout=600
/* Tensor parallelism across backends: the model split over cpu + vulkan:0, with
 * the KV cache on the devices or on the host, against the model on the CPU alone.
 * Tolerance: nmse 1e-8 for f16 weights (different kernels and summation order on
 * each backend). Skipped when no Vulkan device can be opened. */
#include "multi-common.h"

int main(void) {
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!v) return th_skip(pkv_errmsg());
    pkv_device_close(v);
    static float ref_lg[MNG * MV];
    int32_t ref_toks[MNG];
    mc_make(PKV_TYPE_F16, "qwen3");
    pkv_model *single = mc_load("cpu", NULL, false);
    pkv_kv_cache *sc = single ? mc_cache(single) : NULL;
    REQUIRE(sc != NULL);
    REQUIRE(mc_run(single, sc, ref_lg, ref_toks));
    mc_compare("cpu,vulkan:0", "cpu,vulkan:0", NULL, false, ref_lg, ref_toks, 1e-8);
    mc_compare("cpu,vulkan:0 --kv-on-host", "cpu,vulkan:0", NULL, true, ref_lg, ref_toks, 1e-8);
    mc_compare("vulkan:0 alone", "vulkan:0", NULL, false, ref_lg, ref_toks, 1e-8);
    mc_kv_ops("cpu,vulkan:0", false, single, sc);
    mc_kv_ops("cpu,vulkan:0", true, single, sc);
    pkv_kv_cache_free(sc);
    pkv_model_free(single);
    pkv_mkmodel_free_memory(mc_img);
    return th_done();
}
