// labels: device timeout=900
/* pagekv check: the conformance suite passes on cpu and cpu:1 (and across
 * them) and fails on the faulty device, naming the failing primitive — both
 * through the library and through the command a user runs. */
#include <stdlib.h>

#include "testhelp.h"

typedef struct {
    int rows, failed;
    char failures[2048];
} tally;

static void on_row(const pkv_check_result *r, void *user) {
    tally *t = user;
    t->rows++;
    if (!r->passed && !r->skipped) {
        t->failed++;
        size_t l = strlen(t->failures);
        snprintf(t->failures + l, sizeof t->failures - l, "[%s %s: %s]", r->device, r->test, r->detail);
    }
}

/* `pagekv demo -m path DEVICES` exits 0 and its summary says want. */
static void demo_passes(const char *path, const char *devices, const char *want) {
    CHECK_INT(th_cli("", true, "demo -m '%s' %s", path, devices), 0);
    if (!strstr(th_out, want)) TH_FAIL("demo -m %s %s: no '%s' in its output", path, devices, want);
    th_checks++;
}

/* A mixture-of-experts model: demo -m passes on cpu, on the tensor-parallel pair
 * (attention by heads, experts by whole experts on each device) with the cache on
 * the devices and on the host, in the default demo's pair too (nothing skipped), run
 * works split with the cache on the host, and cpu + vulkan:0. */
static void moe_model(const char *name, const char *mkargs, bool vk) {
    char path[512];
    snprintf(path, sizeof path, "%s", th_tmp(name));
    CHECK_INT(th_cli("", true, "mkmodel %s -o '%s'", mkargs, path), 0);
    demo_passes(path, "--device cpu", "5 checks, 5 passed, 0 failed");
    demo_passes(path, "--devices cpu,cpu:1", "10 checks, 10 passed, 0 failed");
    CHECK_INT(th_cli("", true, "demo -m '%s'", path), 0);
    CHECK(strstr(th_out, "cpu,cpu:1+host") != NULL && strstr(th_out, " skip ") == NULL && strstr(th_out, " 0 failed") != NULL);
    CHECK_INT(th_cli("", true, "run -m '%s' --devices cpu,cpu:1 --kv-on-host -p 'the cache' -n 4 --temp 0", path), 0);
    if (vk) demo_passes(path, "--devices cpu,vulkan:0", "10 checks, 10 passed, 0 failed");
    unlink(path);
}

int main(void) {
    pkv_check_params p = pkv_check_default_params();
    p.iterations = 1500;
    pkv_device *a = pkv_device_open("cpu", pkv_device_default_params());
    pkv_device *b = pkv_device_open("cpu:1", pkv_device_default_params());
    REQUIRE(a && b);
    tally t = {0};
    CHECK_OK(pkv_check_transfers(a, p, on_row, &t));
    CHECK_OK(pkv_check_transfers(b, p, on_row, &t));
    CHECK_OK(pkv_check_cross(a, b, p, on_row, &t));
    CHECK_INT(t.failed, 0);
    CHECK(t.rows >= 14);
    if (t.failed) fprintf(stderr, "%s\n", t.failures);

    setenv("PKV_FAULTY_DEVICE", "1", 1);
    pkv_device *f = pkv_device_open("faulty", pkv_device_default_params());
    REQUIRE(f != NULL);
    tally tf = {0};
    CHECK_STATUS(pkv_check_transfers(f, p, on_row, &tf), PKV_ERR_DEVICE);
    CHECK(tf.failed >= 1);
    CHECK(strstr(tf.failures, "faulty read:") != NULL); /* the failing primitive is named */
    tally tc = {0};
    CHECK_STATUS(pkv_check_cross(f, a, p, on_row, &tc), PKV_ERR_DEVICE); /* staging reads at offsets */
    /* Outside the suite the runtime never uses the broken primitive: the open-time
     * self-check routed offset reads through whole-prefix reads, so data is right. */
    {
        pkv_buffer *fb = pkv_buffer_alloc(f, 1000);
        uint8_t w[1000], r[300];
        for (int i = 0; i < 1000; i++) w[i] = (uint8_t)(i * 7 + 3);
        CHECK_OK(pkv_buffer_write(fb, 0, w, 1000));
        CHECK_OK(pkv_buffer_read(fb, 613, r, 300));
        CHECK_MEM(r, w + 613, 300);
        pkv_buffer_free(fb);
    }
    pkv_device_close(f);
    unsetenv("PKV_FAULTY_DEVICE");
    CHECK(pkv_device_open("faulty", pkv_device_default_params()) == NULL); /* only with the variable */
    CHECK_MSG("PKV_FAULTY_DEVICE=1");
    pkv_device_close(b);
    pkv_device_close(a);

    const char *out = th_out;
    int rc = th_cli("PKV_FAULTY_DEVICE=1", true, "check --device faulty --iterations 500");
    if (rc == -1) return th_skip("PKV_CLI not set: run through ctest");
    CHECK(rc == 1);
    CHECK(strstr(out, "read") && strstr(out, "FAIL"));
    CHECK(strstr(out, "pagekv check: FAILED: faulty: read") != NULL);
    /* ... so every KV operation on the faulty device still equals replay (fork,
     * swap, shift, save/load are not corrupted by the bad reads) */
    rc = th_cli("PKV_FAULTY_DEVICE=1", true, "demo --device faulty");
    CHECK_INT(rc, 0);
    CHECK(strstr(out, "5 checks, 5 passed, 0 failed") != NULL);
    CHECK(strstr(out, "using whole-prefix transfers") != NULL); /* and it says so */
    rc = th_cli("", true, "check --device cpu,cpu:1 --iterations 500");
    CHECK_INT(rc, 0);
    CHECK(strstr(out, "cpu -> cpu:1") != NULL && strstr(out, "FAIL") == NULL);
    rc = th_cli("", true, "check --device nosuch");
    CHECK_INT(rc, 2);
    CHECK(strstr(out, "no device 'nosuch'") != NULL);
    /* demo --devices A,B: only that pair, sharded, with the cache on the devices and on the host */
    rc = th_cli("", true, "demo --devices cpu,cpu:1");
    CHECK_INT(rc, 0);
    CHECK(strstr(out, "cpu,cpu:1+host") != NULL && strstr(out, "FAIL") == NULL);
    CHECK(strstr(out, "10 checks, 10 passed, 0 failed") != NULL);
    rc = th_cli("", true, "demo --devices cpu");
    CHECK_INT(rc, 2);
    CHECK(strstr(out, "two device names") != NULL);

    /* demo -m FILE: the same checks on a model file (issue 23: a user checks their
     * own model on their own device): a qwen3 q8_0 model with a vocabulary, a qwen2
     * model without one (token ids) as a tensor-parallel pair, and on vulkan:0 when
     * there is one; a file that does not load fails (exit 1), a missing one is exit 2 */
    char q3[512], nv[512], bad[512];
    snprintf(q3, sizeof q3, "%s", th_tmp("demo-q3.gguf"));
    snprintf(nv, sizeof nv, "%s", th_tmp("demo-nv.gguf"));
    snprintf(bad, sizeof bad, "%s", th_tmp("demo-bad.gguf"));
    CHECK_INT(th_cli("", true, "mkmodel --arch qwen3 --type q8_0 --chat-template chatml -o '%s'", q3), 0);
    CHECK_INT(th_cli("", true, "mkmodel --arch qwen2 --no-vocab -o '%s'", nv), 0);
    const bool vk = th_cli("", true, "devices") == 0 && strstr(out, "vulkan:0");
    if (!vk) printf("note: no vulkan:0 here; demo -m on Vulkan not run\n");
    demo_passes(q3, "--device cpu", "5 checks, 5 passed, 0 failed");
    CHECK(strstr(out, "model: ") != NULL);
    demo_passes(nv, "--devices cpu,cpu:1", "10 checks, 10 passed, 0 failed");
    CHECK(strstr(out, "cpu,cpu:1+host") != NULL);
    if (vk) demo_passes(q3, "--device vulkan:0", "5 checks, 5 passed, 0 failed");
    if (vk) {
        /* check runs Vulkan under the validation layer when it is installed (a row
         * for it, passed: no messages); with the barriers between commands left
         * out on purpose, synchronization validation reports the hazards and
         * check fails, so the layer is shown to be live, not just loaded */
        rc = th_cli("", true, "check --device vulkan:0 --no-kernels --iterations 50");
        CHECK_INT(rc, 0);
        CHECK(strstr(out, "validation layer") != NULL);
        if (strstr(out, "validation layer           pass")) {
            rc = th_cli("PKV_VK_TEST_NO_BARRIER=1 PKV_VK_FORCE_STAGING=1", true,
                        "check --device vulkan:0 --no-kernels --iterations 50");
            CHECK_INT(rc, 1);
            CHECK(strstr(out, "SYNC-HAZARD") != NULL);
        } else {
            printf("note: the Vulkan validation layer is not active here (%s)\n",
                   strstr(out, "validation layer") ? strstr(out, "validation layer") : "?");
        }
    }
    {
        FILE *src = fopen(q3, "rb"), *dst = fopen(bad, "wb"); /* the file cut after 4 KiB */
        char buf[4096];
        size_t n = src ? fread(buf, 1, sizeof buf, src) : 0;
        if (dst) fwrite(buf, 1, n, dst);
        if (src) fclose(src);
        if (dst) fclose(dst);
    }
    /* mixture-of-experts models: every KV operation == replay on one device and split */
    moe_model("moe", "--arch qwen3moe --type q8_0 --experts 4 --experts-used 2", vk);
    moe_model("glm4moe", "--arch glm4moe --type q8_0", vk); /* a dense layer, a shared expert, an MTP layer */
    /* a qwen35 model (gated delta-net layers: a recurrent state per sequence in the
     * cache's state slots): every KV operation == replay on cpu, on the
     * tensor-parallel pair (delta-net layers by key-head groups, each shard's state on
     * its device) with the cache on the devices and on the host, in the default
     * demo's pair too, with `run` split and the KV on the host, and cpu + vulkan:0;
     * value heads of 16 columns cannot be split on q8_0's blocks of 32: refused,
     * naming the tensor and the split */
    {
        char q35[512];
        snprintf(q35, sizeof q35, "%s", th_tmp("demo-q35.gguf"));
        CHECK_INT(th_cli("", true, "mkmodel --arch qwen35 --type q8_0 --ssm-head-dim 32 -o '%s'", q35), 0);
        demo_passes(q35, "--device cpu", "5 checks, 5 passed, 0 failed");
        demo_passes(q35, "--devices cpu,cpu:1", "10 checks, 10 passed, 0 failed");
        CHECK(strstr(out, "cpu,cpu:1+host") != NULL);
        CHECK_INT(th_cli("", true, "demo -m '%s'", q35), 0);
        CHECK(strstr(out, "cpu,cpu:1+host") != NULL && strstr(out, " skip ") == NULL && strstr(out, " 0 failed") != NULL);
        CHECK_INT(th_cli("", true, "run -m '%s' --devices cpu,cpu:1 --kv-on-host -p 'the cache' -n 4 --temp 0", q35), 0);
        if (vk) demo_passes(q35, "--devices cpu,vulkan:0", "10 checks, 10 passed, 0 failed");
        CHECK_INT(th_cli("", true, "mkmodel --arch qwen35 --type q8_0 --ssm-head-dim 16 -o '%s'", q35), 0);
        CHECK_INT(th_cli("", true, "demo -m '%s' --devices cpu,cpu:1", q35), 1);
        if (!strstr(out, "tensor 'blk.0.ssm_out.weight' cannot be split over 2 devices in proportions 1,1") ||
            !strstr(out, "q8_0 block of 32"))
            TH_FAIL("qwen35 q8_0, head size 16: the split is not refused naming ssm_out: %s", out);
        th_checks++;
        unlink(q35);
    }
    /* an lfm2 model (gated short convolutions: a conv state per sequence in the
     * cache's state slots, beside attention layers): every KV operation == replay on
     * cpu, on the tensor-parallel pair (conv layers by channel blocks, each shard's
     * state on its device) with the cache on the devices and on the host, on
     * vulkan:0 and on cpu + vulkan:0 */
    {
        char lf[512];
        snprintf(lf, sizeof lf, "%s", th_tmp("demo-lfm2.gguf"));
        CHECK_INT(th_cli("", true, "mkmodel --arch lfm2 --type q8_0 -o '%s'", lf), 0);
        demo_passes(lf, "--device cpu", "5 checks, 5 passed, 0 failed");
        demo_passes(lf, "--devices cpu,cpu:1", "10 checks, 10 passed, 0 failed");
        CHECK(strstr(out, "cpu,cpu:1+host") != NULL);
        if (vk) demo_passes(lf, "--device vulkan:0", "5 checks, 5 passed, 0 failed");
        if (vk) demo_passes(lf, "--devices cpu,vulkan:0", "10 checks, 10 passed, 0 failed");
        unlink(lf);
    }
    moe_model("lfm2moe", "--arch lfm2moe --type q8_0", vk); /* a dense layer, then sigmoid-routed experts */
    moe_model("g4moe", "--arch gemma4 --type q8_0 --experts 4 --experts-used 2", vk);
    moe_model("ds2moe", "--arch deepseek2 --type q8_0 --head-dim 64 --experts 4 --experts-used 2", vk);
    /* replicated KV (one KV head of Gemma 3; MLA's latent row) over cpu and vulkan:0:
     * each replica holds the first one's bytes, so a sequence saved and loaded back
     * continues bitwise (each device computing its own replica did not) */
    if (vk) {
        static const char *const reps[] = {"--arch gemma3 --kv-heads 1 --layers 6", "--arch deepseek2"};
        for (int r = 0; r < 2; r++) {
            char rp[512];
            snprintf(rp, sizeof rp, "%s", th_tmp("demo-rep.gguf"));
            CHECK_INT(th_cli("", true, "mkmodel %s -o '%s'", reps[r], rp), 0);
            demo_passes(rp, "--devices cpu,vulkan:0", "10 checks, 10 passed, 0 failed");
            unlink(rp);
        }
    }
    moe_model("q35moe", "--arch qwen35moe --type q8_0 --ssm-head-dim 32 --experts 4 --experts-used 2", vk);
    /* granitehybrid (Mamba-2 layers: conv window and SSM state per sequence in the
     * state slots, split by SSM groups), dense and with experts and a shared expert:
     * every KV operation == replay on cpu, split with the cache on the devices and on
     * the host, and cpu + vulkan:0 (the plain `demo -m` runs vulkan:0 alone too) */
    moe_model("granitehybrid", "--arch granitehybrid --type q8_0", vk);
    moe_model("granitemoe", "--arch granitehybrid --type q8_0 --experts 4 --experts-used 2", vk);
    moe_model("nemotron_h", "--arch nemotron_h --type q8_0", vk); /* Mamba-2, MLP and attention layers */
    moe_model("granite1", "--arch granitehybrid --type q8_0 --ssm-k-heads 1", vk); /* one group: Mamba-2 on the first device */
    /* Gemma 2 (sliding layers of 8 tokens, soft-caps, post-norms): every KV operation
     * == replay across the window, on the tensor-parallel pair with the cache on the
     * devices and on the host too, and on vulkan:0 */
    char g2[512];
    snprintf(g2, sizeof g2, "%s", th_tmp("demo-g2.gguf"));
    CHECK_INT(th_cli("", true, "mkmodel --arch gemma2 --type q8_0 --sliding-window 8 -o '%s'", g2), 0);
    demo_passes(g2, "--devices cpu,cpu:1", "10 checks, 10 passed, 0 failed");
    if (vk) demo_passes(g2, "--device vulkan:0", "5 checks, 5 passed, 0 failed");
    unlink(g2);
    /* Gemma 4 (per-layer head sizes and KV heads, proportional RoPE, per-layer
     * embeddings, the last two layers reusing earlier layers' KV; window 8, pages of
     * 16 by default): the same, and q8_0 weights */
    char g4[512];
    snprintf(g4, sizeof g4, "%s", th_tmp("demo-g4.gguf"));
    CHECK_INT(th_cli("", true, "mkmodel --arch gemma4 --type q8_0 --per-layer-embd 32 -o '%s'", g4), 0);
    demo_passes(g4, "--devices cpu,cpu:1", "10 checks, 10 passed, 0 failed");
    demo_passes(g4, "--device cpu", "5 checks, 5 passed, 0 failed");
    if (vk) demo_passes(g4, "--device vulkan:0", "5 checks, 5 passed, 0 failed");
    unlink(g4);
    rc = th_cli("", true, "demo -m '%s' --device cpu", bad);
    CHECK_INT(rc, 1);
    CHECK(strstr(out, "load") != NULL && strstr(out, "FAIL") != NULL);
    rc = th_cli("", true, "demo -m '%s.missing' --device cpu", bad);
    CHECK_INT(rc, 2);
    CHECK(strstr(out, "cannot read") != NULL);
    unlink(q3), unlink(nv), unlink(bad);
    return th_done();
}
