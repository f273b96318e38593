// labels: media vulkan timeout=900
/* Voxtral's projector on vulkan:0 against the CPU: the rows of 20 s of audio (one
 * window, 375 rows) from the same random-weight projector with one encoder block,
 * within nmse 1e-9 (both run the encoder in f32 with the same weights; they sum in
 * other orders; measured 2e-13 with two blocks and two windows). One block and
 * one window run every kernel of the encoder (conv matmuls, layer norm, GELU,
 * 1500-token bidirectional attention, projector) and keep the test cheap on
 * lavapipe, whose attention over 1500 tokens takes tens of seconds per block.
 * The mel front end runs on the host for both. Skipped when no Vulkan device opens. */
#include "base/base.h"
#include "mmproj-audio-testlib.h"

static float *encode_on(const char *proj, pkv_device *dev, const pkv_media *m, int64_t *nr) {
    pkv_mmproj *p = pkv_mmproj_load(proj, NULL, dev);
    if (!p) {
        TH_FAIL("loading on %s: %s", pkv_device_name(dev), pkv_errmsg());
        return NULL;
    }
    float *out = NULL;
    pkv_mmproj_info info;
    CHECK_OK(pkv_mmproj_get_info(p, &info));
    CHECK_OK(pkv_mmproj_n_rows(p, m, nr));
    out = pkv_malloc((size_t)*nr * (size_t)info.n_embd * 4);
    if (out) {
        pkv_status s = pkv_mmproj_encode(p, m, out, *nr);
        if (s) {
            TH_FAIL("encoding on %s: %s", pkv_device_name(dev), pkv_errmsg());
            pkv_free(out);
            out = NULL;
        }
    }
    pkv_mmproj_free(p);
    return out;
}

int main(void) {
    pkv_device *vk = pkv_device_open("vulkan:0", (pkv_device_params){0});
    if (!vk) return th_skip("no vulkan:0");
    pkv_device *cpu = pkv_device_open("cpu", (pkv_device_params){0});
    CHECK(cpu != NULL);
    const char *text = th_tmp("voxvk-text.gguf"), *proj = th_tmp("voxvk-proj.gguf");
    CHECK_OK(vox_make(text, proj, 128, 1));
    int64_t n;
    float *x = vox_signal(20.0, &n);
    pkv_media m = {.kind = PKV_MEDIA_AUDIO, .samples = x, .n_samples = n, .rate = VOX_RATE};
    int64_t nc = 0, nv = 0;
    float *rc = encode_on(proj, cpu, &m, &nc), *rv = encode_on(proj, vk, &m, &nv);
    CHECK_INT(nc, 375);
    CHECK_INT(nv, 375);
    if (rc && rv && nc == nv) {
        const double e = th_nmse(rc, rv, (size_t)nc * 128);
        fprintf(stderr, "vulkan:0 vs cpu: nmse %.3g over %lld rows\n", e, (long long)nc);
        if (!(e <= 1e-9)) TH_FAIL("vulkan:0 rows differ from the cpu's: nmse %g > 1e-9", e);
        th_checks++;
    }
    pkv_free(rc);
    pkv_free(rv);
    pkv_free(x);
    remove(text);
    remove(proj);
    pkv_device_close(cpu);
    pkv_device_close(vk);
    return th_done();
}
