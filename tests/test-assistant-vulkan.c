// labels: model device vulkan timeout=600
/* test-model-gemma4-assistant's placements with vulkan:0 (skipped without a Vulkan
 * device): greedy output with Gemma 4's assistant equals plain greedy output token
 * by token, and its proposals equal those of the all-CPU placement (llama.cpp's), with
 *  - the target on cpu, the assistant on vulkan:0 (its attention runs on the CPU,
 *    where the pages are; its other layers on vulkan:0);
 *  - the target on vulkan:0, the assistant on cpu (attention on vulkan:0);
 *  - the target on vulkan:0 with its cache on the host: the assistant on vulkan:0,
 *    and on cpu;
 *  - a tensor-parallel target over cpu and vulkan:0 (its cache sharded alike), the
 *    assistant on cpu, attending each shard where it is stored;
 * and llama.cpp's rounds on a prompt whose rounds keep proposals, with the target on
 * vulkan:0 and the assistant on cpu, and the other way round. */
#include "assistant-testlib.h"

int main(void) {
    pkv_device *v = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!v) return th_skip("no vulkan:0 device");
    pkv_device_close(v);
    char tpath[512], apath[512];
    REQUIRE(at_files("g4-asst-vk", tpath, apath, sizeof tpath));
    at_rounds first, r;
    REQUIRE(at_check_pair(tpath, apath, "cpu", false, NULL, &first, NULL) == 0);
    at_check_llama(&first);
    at_check_pair(tpath, apath, "cpu", false, "vulkan:0", &r, &first);
    at_check_pair(tpath, apath, "vulkan:0", false, "cpu", &r, &first);
    at_check_pair(tpath, apath, "vulkan:0", true, NULL, &r, &first);
    at_check_pair(tpath, apath, "vulkan:0", true, "cpu", &r, &first);
    at_check_pair(tpath, apath, "cpu,vulkan:0", false, "cpu", &r, &first);
    /* rounds that keep proposals (assistant-testlib.h's second prompt) */
    at_check_llama_accepting(tpath, apath, "vulkan:0", "cpu");
    at_check_llama_accepting(tpath, apath, "cpu", "vulkan:0");
    return th_done();
}
