// labels: model timeout=300
/* The pagekv command as a user runs it: mkmodel, tokenize, logits, run and their
 * errors — every bad input a clear message and a non-zero exit, never a crash. */
#include <unistd.h>

#include "testhelp.h"

/* th_cli without environment; the output is in th_out (alias out). */
#define cli(...) th_cli("", __VA_ARGS__)
#define out th_out


int main(void) {
    if (!getenv("PKV_CLI")) return th_skip("PKV_CLI not set: run through ctest");
    char m[512], nv[512], lg[512], trunc[512]; /* th_tmp's buffers rotate: keep copies */
    snprintf(m, sizeof m, "%s", th_tmp("cli-model.gguf"));
    snprintf(nv, sizeof nv, "%s", th_tmp("cli-novocab.gguf"));
    snprintf(lg, sizeof lg, "%s", th_tmp("cli-logits.bin"));
    snprintf(trunc, sizeof trunc, "%s", th_tmp("cli-truncated.gguf"));

    CHECK_INT(cli(true, "mkmodel --arch qwen2 --type q8_0 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 400 --no-template -o %s", m), 0);
    CHECK_INT(cli(true, "mkmodel --arch llama --type f16 --no-vocab --vocab 50 -o %s", nv), 0);
    CHECK_INT(cli(true, "mkmodel --arch gpt-j -o %s", th_tmp("x.gguf")), 1);
    HAS("architecture 'gpt-j' is not supported");
    CHECK_INT(cli(true, "mkmodel --type q4_0 --dim 48 -o %s", th_tmp("x.gguf")), 1);
    HAS("multiples of 32");
    CHECK_INT(cli(true, "mkmodel"), 2);
    HAS("-o FILE.gguf is required");

    /* tokenize: BOS by default, --no-bos drops it, --special parses special text */
    CHECK_INT(cli(false, "tokenize -m %s -p 'the cat'", m), 0);
    CHECK(out[0] == '[' && strncmp(out, "[256, ", 6) == 0);
    CHECK_INT(cli(false, "tokenize -m %s -p 'the cat' --no-bos", m), 0);
    CHECK(strncmp(out, "[256", 4) != 0);
    CHECK_INT(cli(false, "tokenize -m %s -p '<|end_of_text|>' --no-bos --special", m), 0);
    CHECK(strcmp(out, "[257]\n") == 0);
    CHECK_INT(cli(false, "tokenize -m %s -p '<|end_of_text|>' --no-bos", m), 0);
    CHECK(strcmp(out, "[257]\n") != 0); /* without --special it is plain text */
    CHECK_INT(cli(false, "tokenize -m %s -p 'hi there' --pieces", m), 0);
    HAS("-> '<|begin_of_text|>'");
    CHECK_INT(cli(true, "tokenize -m %s -p 'x'", nv), 1);
    HAS("no vocabulary");

    /* logits: JSON and the binary file hold the same numbers */
    CHECK_INT(cli(false, "logits -m %s --tokens 1,2,3,300 -t 2", m), 0);
    CHECK(strncmp(out, "{\"n_tokens\": 4, \"n_vocab\": 400, \"logits\": [", 43) == 0);
    float json_first = strtof(strstr(out, "[") + 1, NULL);
    CHECK_INT(cli(true, "logits -m %s --tokens 1,2,3,300 -t 2 -o %s", m, lg), 0);
    FILE *f = fopen(lg, "rb");
    float bin[400];
    CHECK(f && fread(bin, 4, 400, f) == 400 && fgetc(f) == EOF);
    if (f) fclose(f);
    CHECK_NEAR(bin[0], json_first, fabs(json_first) * 1e-6 + 1e-6);
    CHECK_INT(cli(true, "logits -m %s --tokens 1,2,400", m), 1);
    HAS("token id 400");
    CHECK_INT(cli(true, "logits -m %s --tokens 1,x", m), 2);
    CHECK_INT(cli(true, "logits -m %s --tokens 1,2,3", nv), 0); /* ids work without a vocabulary */

    /* quantized KV pages: K and V types apart; a head size of 16 is refused naming
     * the layer; bench kv reports what a token costs (28 layers x 8 heads x 128:
     * q4_0 rows of 4 blocks of 18 bytes, K and V: 28 * 8 * 2 * 72 = 32256 bytes)
     * and the whole pages that fit 1 GiB (2080 pages of 16 tokens) */
    CHECK_INT(cli(true, "run -p 'the cat' -n 4 --temp 0 --kv-type-k q8_0 --kv-type-v q4_0"), 0);
    HAS("K q8_0 V q4_0 KV on cpu");
    CHECK_INT(cli(true, "run -m %s -p 'the cat' -n 4 --kv-type q8_0", m), 1);
    HAS("KV layout layer 0: K head size 16 is not a multiple of 32, the block of q8_0 pages");
    CHECK_INT(cli(true, "run -p 'the cat' --kv-type q5_0"), 2);
    HAS("--kv-type is f16, f32, q8_0 or q4_0, got 'q5_0'");
    CHECK_INT(cli(false, "bench kv --kv-type q4_0 --kv-memory 1024 --json"), 0);
    HAS("\"dtype_k\": \"q4_0\", \"dtype_v\": \"q4_0\"}, \"kv_bytes_per_token\": 32256, \"kv_memory_mib\": 1024, \"max_context\": 33280");

    /* run: greedy is deterministic; forks print branches; errors exit non-zero */
    CHECK_INT(cli(false, "run -m %s -p 'the cat' -n 8 --temp 0", m), 0);
    char first[4096];
    snprintf(first, sizeof first, "%.4000s", out);
    CHECK_INT(cli(false, "run -m %s -p 'the cat' -n 8 --temp 0", m), 0);
    CHECK(strcmp(first, out) == 0);
    CHECK(strncmp(out, "the cat", 7) == 0);
    CHECK_INT(cli(false, "run -m %s -p 'the cat' -n 8 --seed 5 --fork 3", m), 0);
    HAS("--- branch 0 (seed 5, stopped: -n reached) ---");
    HAS("--- branch 2 (seed 7, stopped: ");
    CHECK_INT(cli(true, "run -m %s -p 'the cat sat on the mat' -c 4", m), 1);
    HAS("more than the context of 4");
    CHECK_INT(cli(true, "run -m %s -p 'x'", nv), 1);
    HAS("no vocabulary");
    CHECK_INT(cli(true, "run -m /nonexistent.gguf -p 'x'"), 1);
    HAS("/nonexistent.gguf");
    CHECK_INT(cli(true, "run -p hi -n 4 --top-p 0"), 2);
    CHECK_INT(cli(true, "run --bogus"), 2);
    HAS("unknown option '--bogus'");
    CHECK_INT(cli(true, "run -p hi -n 4"), 0);
    HAS("built-in tiny model");
    HAS("decode");

    /* a truncated copy of the model file: refused with a message at every cut */
    FILE *src = fopen(m, "rb");
    REQUIRE(src != NULL);
    static unsigned char buf[1 << 20];
    size_t size = fread(buf, 1, sizeof buf, src);
    fclose(src);
    size_t cuts[] = {0, 3, 10, 24, 100, size / 3, size / 2, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        FILE *t = fopen(trunc, "wb");
        fwrite(buf, 1, cuts[i], t);
        fclose(t);
        int rc = cli(true, "logits -m %s --tokens 1", trunc);
        if (rc != 1) TH_FAIL("truncated at %zu: exit %d (%s)", cuts[i], rc, out);
        HAS(trunc);
    }
    unlink(trunc);
    /* bench model's roofline: the host's read bandwidth on the CPU; on a device whose
     * memory is not the host's (a GPU; here Vulkan forced to staging), its own */
    CHECK_INT(cli(false, "bench model -m %s --prefill 4 --decode 2 --depth 0 --json", m), 0);
    HAS("\"bandwidth_kind\": \"host read\"");
    {
        int rc = th_cli("PKV_VK_FORCE_STAGING=1", false, "bench model -m %s -d vulkan:0 --prefill 4 --decode 2 --depth 0 --json", m);
        if (rc == 0) HAS("\"bandwidth_kind\": \"device copy\"");
    }
    unlink(lg);
    unlink(m);
    unlink(nv);
    return th_done();
}
