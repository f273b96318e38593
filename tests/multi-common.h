/* Shared by test-multi.c and test-multi-vulkan.c: a model split over several
 * devices (tensor parallelism, sharded KV, optionally on the host) against the
 * same model on one device. */
#ifndef PKV_MULTI_COMMON_H
#define PKV_MULTI_COMMON_H

#include "testhelp.h"

enum { MV = 320, MNP = 21, MNG = 8 };

static void *mc_img;
static size_t mc_size;
static int mc_n_head_kv = 8; /* KV heads of mc_make's models (fewer: replicated over the devices) */
static int mc_n_expert = 0;  /* experts of mc_make's models where optional (deepseek2's MoE layers); 0: dense */

/* A model whose heads split evenly over 2 or 4 devices and 2,1,1 over 3
 * (8 KV heads); head size 32 keeps q8_0 column slices on whole blocks. */
static inline void mc_make(pkv_type t, const char *arch) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = t;
    p.n_layer = !strcmp(arch, "lfm2") ? 3 : 2; /* lfm2: two short-conv layers, then attention */
    p.n_embd = 128;
    p.n_head = 8;
    p.n_head_kv = mc_n_head_kv;
    p.head_dim = 32;
    p.n_ff = 192;
    p.n_vocab = MV;
    p.n_expert = mc_n_expert;
    pkv_mkmodel_free_memory(mc_img);
    mc_img = NULL;
    if (pkv_mkmodel_memory(&p, &mc_img, &mc_size)) TH_FAIL("mkmodel: %s", pkv_errmsg());
}

/* qwen35: 3 gated delta-net layers and an attention layer. The delta-net layers
 * have 4 key heads with 2 value heads each (value head h reads key head h % 4), so
 * a shard's value heads are strided in every tensor; splits 1,1 and 2,1,1 give
 * shards of 2 and of 2, 1, 1 key heads. Head size 32 keeps q8_0's strided column
 * runs of ssm_out on whole blocks. granitehybrid: the same sizes, 3 Mamba-2 layers
 * (8 heads of 32 in 4 groups, a state of 32) and an attention layer; nemotron_h:
 * Mamba-2, MLP, attention, Mamba-2. */
static inline void mc_make_recurrent(pkv_type t, const char *arch) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = t;
    p.n_layer = 4;
    p.n_embd = 128;
    p.n_head = 8;
    p.n_head_kv = 8;
    p.head_dim = 32;
    p.n_ff = 192;
    p.n_vocab = MV;
    p.ssm_k_heads = 4;
    p.ssm_v_heads = 8;
    p.ssm_head_dim = 32;
    p.seed = 35;
    pkv_mkmodel_free_memory(mc_img);
    mc_img = NULL;
    if (pkv_mkmodel_memory(&p, &mc_img, &mc_size)) TH_FAIL("mkmodel: %s", pkv_errmsg());
}

static inline pkv_model *mc_load(const char *devices, const char *split, bool host) {
    pkv_model_params mp = pkv_model_default_params();
    mp.devices = devices;
    mp.split = split;
    mp.kv_on_host = host;
    mp.n_threads = 1;
    return pkv_model_load_memory(mc_img, mc_size, "multi", mp);
}

static pkv_type mc_kv_k = PKV_TYPE_F16, mc_kv_v = PKV_TYPE_F16; /* KV page types of mc_cache */

static inline pkv_kv_cache *mc_cache(pkv_model *m) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    cp.n_seq_max = 8;
    cp.page_size = 8;
    cp.kv_type = mc_kv_k;
    cp.kv_type_v = mc_kv_v;
    return pkv_model_cache_create(m, cp);
}

static inline int mc_argmax(const float *x) {
    int b = 0;
    for (int i = 1; i < MV; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Logits of every step: the prompt, then MNG greedy tokens (tokens to toks). */
static inline bool mc_run(pkv_model *m, pkv_kv_cache *c, float *lg, int32_t *toks) {
    pkv_context *ctx = pkv_context_create(m, c, 0);
    if (!ctx) return false;
    int32_t prompt[MNP];
    for (int i = 0; i < MNP; i++) prompt[i] = (i * 31 + 7) % MV;
    bool ok = pkv_context_decode(ctx, prompt, MNP) == PKV_OK;
    for (int i = 0; ok && i < MNG; i++) {
        memcpy(lg + (size_t)i * MV, pkv_context_logits(ctx), MV * sizeof(float));
        toks[i] = mc_argmax(lg + (size_t)i * MV);
        ok = pkv_context_decode(ctx, &toks[i], 1) == PKV_OK;
    }
    pkv_context_free(ctx);
    return ok;
}

/* The reference: the model of `arch` (mc_make; qwen35, granitehybrid: mc_make_recurrent) on one
 * CPU device, its cache, and its logits and tokens (mc_run); false on failure. */
static inline bool mc_reference(pkv_type t, const char *arch, pkv_model **single, pkv_kv_cache **sc, float *lg, int32_t *toks) {
    if (!strcmp(arch, "qwen35") || !strcmp(arch, "granitehybrid") || !strcmp(arch, "nemotron_h")) mc_make_recurrent(t, arch);
    else mc_make(t, arch);
    *single = mc_load("cpu", NULL, false);
    *sc = *single ? mc_cache(*single) : NULL;
    return *sc && mc_run(*single, *sc, lg, toks);
}

/* Split logits against single-device logits within tol (nmse); greedy tokens equal. */
static inline void mc_compare(const char *what, const char *devices, const char *split, bool host, const float *ref_lg,
                       const int32_t *ref_toks, double tol) {
    pkv_model *m = mc_load(devices, split, host);
    pkv_kv_cache *c = m ? mc_cache(m) : NULL;
    if (!c) {
        TH_FAIL("%s: %s", what, pkv_errmsg());
        pkv_model_free(m);
        return;
    }
    static float lg[MNG * MV];
    int32_t toks[MNG];
    CHECK(mc_run(m, c, lg, toks));
    double e = th_nmse(ref_lg, lg, (size_t)MNG * MV);
    fprintf(stderr, "%-40s nmse %.2e (tol %.0e)\n", what, e, tol);
    if (!(e <= tol)) TH_FAIL("%s: nmse %g > %g", what, e, tol);
    CHECK_MEM(toks, ref_toks, sizeof toks);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* On a split model: fork == replay bitwise, swap and save/load round trips,
 * truncate (a recurrent state goes back to a checkpoint and the rest is replayed)
 * then the same tokens again: the same logits (bitwise where the devices compute a
 * batch of tokens as they compute each alone, bitwise_batches: the CPU), and a file
 * saved from the sharded cache loads into a single-device cache and one saved
 * there loads into the sharded cache, continuing alike. */
static inline void mc_kv_ops(const char *devices, bool host, pkv_model *single, pkv_kv_cache *single_c, bool bitwise_batches) {
    pkv_model *m = mc_load(devices, NULL, host);
    pkv_kv_cache *c = m ? mc_cache(m) : NULL;
    REQUIRE_VOID(c);
    int32_t prompt[MNP];
    for (int i = 0; i < MNP; i++) prompt[i] = (i * 17 + 3) % MV;
    pkv_context *a = pkv_context_create(m, c, 0);
    REQUIRE_VOID(a);
    CHECK_OK(pkv_context_decode(a, prompt, MNP));
    pkv_context *b = pkv_context_fork(a);
    REQUIRE_VOID(b);
    static float la[MNG * MV], lb[MNG * MV];
    int32_t ta[MNG], tb[MNG];
    /* b: swap out and back in, then both continue: identical */
    CHECK_OK(pkv_context_swap_out(b));
    pkv_context *noise = pkv_context_create(m, c, 0);
    CHECK_OK(pkv_context_decode(noise, prompt + 5, 12));
    CHECK_OK(pkv_context_swap_in(b));
    for (int i = 0; i < MNG; i++) {
        memcpy(la + (size_t)i * MV, pkv_context_logits(a), MV * 4);
        memcpy(lb + (size_t)i * MV, pkv_context_logits(b), MV * 4);
        ta[i] = mc_argmax(la + (size_t)i * MV);
        tb[i] = mc_argmax(lb + (size_t)i * MV);
        CHECK_OK(pkv_context_decode(a, &ta[i], 1));
        CHECK_OK(pkv_context_decode(b, &tb[i], 1));
    }
    CHECK_MEM(ta, tb, sizeof ta);
    CHECK_MEM(la, lb, sizeof la); /* fork + swap round trip: bitwise */
    /* b: back to MNP + 2 tokens, then the same tokens again one at a time */
    CHECK_OK(pkv_context_truncate(b, MNP + 2));
    CHECK_INT(pkv_context_n_tokens(b), MNP + 2);
    for (int i = 2; i + 1 < MNG; i++) { /* la[i + 1]: the logits after ta[i] */
        CHECK_OK(pkv_context_decode(b, &ta[i], 1));
        const float *got = pkv_context_logits(b), *want = la + (size_t)(i + 1) * MV;
        if (bitwise_batches) {
            CHECK_MEM(got, want, MV * 4);
        } else {
            double e = th_nmse(want, got, MV);
            if (!(e < 1e-8)) TH_FAIL("%s: truncate and decode again, step %d: nmse %g", devices, i, e);
        }
    }
    /* replay from scratch: bitwise */
    pkv_context *r = pkv_context_create(m, c, 0);
    CHECK_OK(pkv_context_decode(r, prompt, MNP));
    for (int i = 0; i < MNG; i++) {
        CHECK_MEM(pkv_context_logits(r), la + (size_t)i * MV, MV * 4);
        CHECK_OK(pkv_context_decode(r, &ta[i], 1));
    }
    /* save/load on the sharded cache, and into the single-device cache */
    const char *path = th_tmp("multi.kv");
    CHECK_OK(pkv_context_save(a, path));
    pkv_context *l = pkv_context_load(m, c, path, 0);
    CHECK(l != NULL);
    if (l) {
        CHECK_INT(pkv_context_n_tokens(l), MNP + MNG);
        CHECK_MEM(pkv_context_logits(l), pkv_context_logits(a), MV * 4);
    }
    pkv_context *ls = pkv_context_load(single, single_c, path, 0);
    CHECK(ls != NULL);
    if (ls) { /* same KV, other summation order in the single-device model: close */
        double e = th_nmse(pkv_context_logits(a), pkv_context_logits(ls), MV);
        if (!(e < 1e-8)) TH_FAIL("%s: sharded save -> single load: nmse %g", devices, e);
    }
    /* the other way: saved on the single device, loaded into the sharded cache; both
     * continue with the same tokens alike */
    const char *path1 = th_tmp("multi-single.kv");
    pkv_context *l1 = NULL;
    if (ls && pkv_context_save(ls, path1) == PKV_OK) l1 = pkv_context_load(m, c, path1, 0);
    CHECK(l1 != NULL);
    for (int i = 0; l1 && ls && i < 4; i++) {
        double e = th_nmse(pkv_context_logits(ls), pkv_context_logits(l1), MV);
        if (!(e < 1e-8)) TH_FAIL("%s: single save -> sharded load, step %d: nmse %g", devices, i, e);
        int32_t t = mc_argmax(pkv_context_logits(ls));
        CHECK_INT(mc_argmax(pkv_context_logits(l1)), t);
        CHECK_OK(pkv_context_decode(ls, &t, 1));
        CHECK_OK(pkv_context_decode(l1, &t, 1));
    }
    pkv_context_free(l1);
    unlink(path1);
    pkv_context_free(ls);
    pkv_context_free(l);
    pkv_context_free(r);
    pkv_context_free(noise);
    pkv_context_free(b);
    pkv_context_free(a);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

#endif
