// labels: unit model
/* Weights used in place from the mapped GGUF file on the CPU (no copy): the model
 * loaded from a file wraps the mapping, the one loaded from memory copies (the
 * caller may free its memory), and both give bitwise the same logits, for float
 * and quantized types. A wrapped buffer refuses every transfer into it. */
#include "testhelp.h"
#include "device/device.h"

static void logits_of(pkv_model *m, const int32_t *toks, int n, float *out, int V) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    REQUIRE_VOID(ctx);
    CHECK_OK(pkv_context_decode(ctx, toks, n));
    const float *lg = pkv_context_logits(ctx);
    REQUIRE_VOID(lg);
    memcpy(out, lg, (size_t)V * sizeof(float));
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
}

int main(void) {
    const pkv_type types[] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        pkv_mkmodel_params kp = pkv_mkmodel_default_params();
        kp.type = types[ti];
        kp.arch = "qwen3";
        const char *path = th_tmp("mapped.gguf");
        CHECK_OK(pkv_mkmodel_write(&kp, path));
        void *data = NULL;
        size_t size = 0;
        CHECK_OK(pkv_mkmodel_memory(&kp, &data, &size));
        pkv_model_params mp = pkv_model_default_params();
        mp.n_threads = 1;
        pkv_model_params cp = mp;
        cp.no_mmap = true;
        pkv_model *mc = pkv_model_load(path, cp); /* --no-mmap: copied */
        REQUIRE(mc);
        pkv_model_info ci;
        CHECK_OK(pkv_model_get_info(mc, &ci));
        CHECK_INT(ci.weight_bytes_mapped, 0);
        pkv_model_free(mc);
        pkv_model *mf = pkv_model_load(path, mp);
        pkv_model *mm = data ? pkv_model_load_memory(data, size, "memory", mp) : NULL;
        pkv_mkmodel_free_memory(data); /* the memory-loaded model must not need it */
        REQUIRE(mf && mm);
        pkv_model_info fi, mi;
        CHECK_OK(pkv_model_get_info(mf, &fi));
        CHECK_OK(pkv_model_get_info(mm, &mi));
        /* every matrix is used in place; only norms (converted to f32) are copied */
        CHECK(fi.weight_bytes_mapped > fi.weight_bytes / 2);
        CHECK(fi.weight_bytes_mapped <= fi.weight_bytes);
        CHECK_INT(mi.weight_bytes_mapped, 0);
        CHECK_INT(fi.weight_bytes, mi.weight_bytes);
        /* the device holds only what was copied */
        CHECK(pkv_device_allocated(pkv_model_device(mf)) + fi.weight_bytes_mapped <=
              pkv_device_allocated(pkv_model_device(mm)) + 4096);

        int V = fi.n_vocab;
        float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        int32_t toks[6] = {1, 17, 42, 99, 3, 250};
        logits_of(mf, toks, 6, a, V);
        logits_of(mm, toks, 6, b, V);
        CHECK_MEM(a, b, (size_t)V * sizeof *a);
        /* q4_k: the mapped model's matmuls ran on the repacked layout (docs/kernels.md)
         * on the avx2/avx512 paths, the copied one's on the plain layout */
        char lay[256];
        pkv_device_weight_layout(pkv_model_device(mf), types[ti], lay, sizeof lay);
        const char *cpu_path = pkv_device_get_caps(pkv_model_device(mf))->description;
        const bool rp = types[ti] == PKV_TYPE_Q4_K && (strstr(cpu_path, "avx2 kernels") || strstr(cpu_path, "avx512 kernels"));
        if (rp != (strncmp(lay, "repacked8: ", 11) == 0)) fprintf(stderr, "%s: layout %s on %s\n", pkv_type_name(types[ti]), lay, cpu_path);
        CHECK(rp == (strncmp(lay, "repacked8: ", 11) == 0));
        free(a);
        free(b);
        pkv_model_free(mf);
        pkv_model_free(mm);
        unlink(path);
    }

    /* a wrapped buffer is read-only for every transfer */
    pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE(dev);
    static uint8_t host[256];
    for (int i = 0; i < 256; i++) host[i] = (uint8_t)i;
    pkv_buffer *w = pkv_buffer_wrap_host(dev, host, sizeof host);
    REQUIRE(w);
    uint8_t rd[16];
    CHECK_OK(pkv_buffer_read(w, 100, rd, 16));
    CHECK_MEM(rd, host + 100, 16);
    CHECK_STATUS(pkv_buffer_write(w, 0, rd, 16), PKV_ERR_INVALID);
    CHECK_MSG("read-only");
    CHECK_STATUS(pkv_buffer_fill(w, 0, 16, 0), PKV_ERR_INVALID);
    pkv_buffer *o = pkv_buffer_alloc(dev, 256);
    REQUIRE(o);
    CHECK_STATUS(pkv_buffer_copy(o, 0, w, 0, 16), PKV_ERR_INVALID);
    pkv_region r = {.src_off = 0, .dst_off = 0, .size = 16};
    CHECK_STATUS(pkv_buffer_copy_regions(o, w, &r, 1), PKV_ERR_INVALID);
    CHECK_OK(pkv_buffer_copy(w, 0, o, 0, 256)); /* reading out of it is fine */
    CHECK_OK(pkv_buffer_read(o, 0, rd, 16));
    CHECK_MEM(rd, host, 16);
    for (int i = 0; i < 256; i++)
        if (host[i] != (uint8_t)i) TH_FAIL("wrapped memory changed at %d", i);
    CHECK_INT(pkv_device_allocated(dev), 256); /* the wrapped bytes are not the device's */
    pkv_buffer_free(o);
    pkv_buffer_free(w);
    pkv_device_close(dev);
    return th_done();
}
