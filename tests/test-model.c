// labels: model timeout=600
/* The model on the paged cache, on the CPU: fork == replay (tokens and logits
 * bitwise), swap and save/load round trips, a batch of 4 sequences equals 4
 * separate runs, and bad input (files, architectures, RoPE scaling, token ids)
 * is refused with a message. All of it for f16, f32 and quantized KV pages
 * (q8_0, q4_0, and K q8_0 with V q4_0, on a model with heads of 32); a saved
 * quantized sequence loaded into a cache of other KV types is refused naming
 * both. */
#include <unistd.h>

#include "base/base.h"
#include "model/gguf.h"
#include "testhelp.h"

static int g_embd = 64; /* 128 for heads of 32 (quantized KV) */

static pkv_model *make(const char *arch, pkv_type t, int n_layer, const char *dev) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = t;
    p.n_layer = n_layer;
    p.n_embd = g_embd;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 320;
    void *img;
    size_t size;
    if (pkv_mkmodel_memory(&p, &img, &size)) return NULL;
    pkv_model_params mp = pkv_model_default_params();
    mp.device = dev;
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load_memory(img, size, arch, mp);
    pkv_mkmodel_free_memory(img);
    return m;
}

static pkv_kv_cache *cache2(pkv_model *m, int page_size, pkv_type kv, pkv_type kv_v) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 512;
    cp.n_seq_max = 12;
    cp.page_size = page_size;
    cp.kv_type = kv;
    cp.kv_type_v = kv_v;
    return pkv_model_cache_create(m, cp);
}

static pkv_kv_cache *cache(pkv_model *m, int page_size, pkv_type kv) { return cache2(m, page_size, kv, kv); }

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

enum { V = 320, NG = 10 };

/* Greedy continuation of n tokens; logits of each step into lg[n][V]. */
static void greedy(pkv_context *c, int n, int32_t *toks, float *lg) {
    for (int i = 0; i < n; i++) {
        const float *l = pkv_context_logits(c);
        if (!l) {
            TH_FAIL("no logits at step %d", i);
            return;
        }
        memcpy(lg + (size_t)i * V, l, V * sizeof(float));
        toks[i] = argmax(l, V);
        CHECK_OK(pkv_context_decode(c, &toks[i], 1));
    }
}

static void test_fork_replay(pkv_model *m, pkv_kv_cache *c) {
    int32_t prompt[37];
    for (int i = 0; i < 37; i++) prompt[i] = (i * 37 + 11) % V;
    pkv_context *a = pkv_context_create(m, c, 0);
    REQUIRE_VOID(a);
    CHECK_OK(pkv_context_decode(a, prompt, 37));
    /* forks of forks: b from a, d from b after b diverged */
    pkv_context *b = pkv_context_fork(a);
    CHECK(b != NULL);
    static float la[NG * V], lb[NG * V], lr[NG * V];
    int32_t ta[NG], tb[NG], tr[NG];
    int32_t diverge = 7;
    CHECK_OK(pkv_context_decode(b, &diverge, 1));
    pkv_context *dd = pkv_context_fork(b);
    greedy(a, NG, ta, la);
    greedy(b, NG, tb, lb);
    /* replay a */
    pkv_context *r = pkv_context_create(m, c, 0);
    CHECK_OK(pkv_context_decode(r, prompt, 37));
    greedy(r, NG, tr, lr);
    CHECK_MEM(ta, tr, sizeof ta);
    CHECK_MEM(la, lr, sizeof la);
    pkv_context_free(r);
    /* replay b */
    r = pkv_context_create(m, c, 0);
    CHECK_OK(pkv_context_decode(r, prompt, 37));
    CHECK_OK(pkv_context_decode(r, &diverge, 1));
    greedy(r, NG, tr, lr);
    CHECK_MEM(tb, tr, sizeof tb);
    CHECK_MEM(lb, lr, sizeof lb);
    /* the fork of the fork continues exactly like b did, even after b moved on */
    static float ld[NG * V];
    int32_t td[NG];
    greedy(dd, NG, td, ld);
    CHECK_MEM(td, tb, sizeof td);
    CHECK_MEM(ld, lb, sizeof ld);
    pkv_context_free(r);
    pkv_context_free(a); /* free in an order unlike creation */
    pkv_context_free(dd);
    pkv_context_free(b);
}

static void test_swap_save(pkv_model *m, pkv_kv_cache *c) {
    int32_t prompt[29];
    for (int i = 0; i < 29; i++) prompt[i] = (i * 13 + 5) % V;
    pkv_context *a = pkv_context_create(m, c, 0), *ref = pkv_context_create(m, c, 0);
    REQUIRE_VOID(a && ref);
    CHECK_OK(pkv_context_decode(a, prompt, 29));
    CHECK_OK(pkv_context_decode(ref, prompt, 29));
    CHECK_OK(pkv_context_swap_out(a));
    pkv_context *noise = pkv_context_create(m, c, 0);
    CHECK_OK(pkv_context_decode(noise, prompt + 3, 20)); /* takes the freed pages */
    CHECK_OK(pkv_context_swap_in(a));
    static float la[NG * V], lr[NG * V];
    int32_t ta[NG], tr[NG];
    greedy(a, NG, ta, la);
    greedy(ref, NG, tr, lr);
    CHECK_MEM(ta, tr, sizeof ta);
    CHECK_MEM(la, lr, sizeof la);

    const char *path = th_tmp("test-model.kv");
    CHECK_OK(pkv_context_save(a, path));
    pkv_context *l = pkv_context_load(m, c, path, 0);
    CHECK(l != NULL);
    if (l) {
        CHECK_INT(pkv_context_n_tokens(l), pkv_context_n_tokens(a));
        greedy(l, NG, tr, lr);
        greedy(a, NG, ta, la);
        CHECK_MEM(ta, tr, sizeof ta);
        CHECK_MEM(la, lr, sizeof la);
    }
    /* a file from another model (other geometry) is refused */
    pkv_model *other = make("llama", PKV_TYPE_F32, 3, "cpu");
    pkv_kv_cache *oc = other ? cache(other, 16, PKV_TYPE_F16) : NULL;
    if (oc) {
        CHECK(pkv_context_load(other, oc, path, 0) == NULL);
        CHECK(strlen(pkv_errmsg()) > 0);
        pkv_kv_cache_free(oc);
    }
    pkv_model_free(other);
    unlink(path);
    pkv_context_free(l);
    pkv_context_free(noise);
    pkv_context_free(a);
    pkv_context_free(ref);
}

/* Batched vs alone: float rounding (f16/f32 pages); a quantized page can round a
 * K or V value that differs in its last bit to the neighbouring step. */
static double g_batch_tol = 1e-10;

/* 4 sequences of different lengths in one batch == each alone. */
static void test_batch(pkv_model *m, pkv_kv_cache *c) {
    pkv_context *ctx[4];
    int32_t toks[4][20];
    int32_t lens[4] = {5, 20, 1, 11};
    const int32_t *tp[4];
    for (int s = 0; s < 4; s++) {
        ctx[s] = pkv_context_create(m, c, 0);
        REQUIRE_VOID(ctx[s]);
        for (int i = 0; i < 20; i++) toks[s][i] = (s * 53 + i * 7 + 1) % V;
        tp[s] = toks[s];
    }
    CHECK_OK(pkv_decode(ctx, 4, tp, lens));
    int32_t one[4] = {1, 1, 1, 1}, nxt[4] = {3, 4, 5, 6};
    const int32_t *np[4] = {&nxt[0], &nxt[1], &nxt[2], &nxt[3]};
    CHECK_OK(pkv_decode(ctx, 4, np, one)); /* a batched decode step */
    for (int s = 0; s < 4; s++) {
        pkv_context *r = pkv_context_create(m, c, 0);
        CHECK_OK(pkv_context_decode(r, toks[s], lens[s]));
        CHECK_OK(pkv_context_decode(r, &nxt[s], 1));
        const float *x = pkv_context_logits(ctx[s]), *y = pkv_context_logits(r);
        /* The same tokens through a different batch composition: the matmul may
         * block rows differently, so equal within float rounding, not bitwise. */
        double e = th_nmse(y, x, V);
        if (!(e < g_batch_tol)) TH_FAIL("sequence %d: batched vs alone nmse %g", s, e);
        CHECK_INT(argmax(x, V), argmax(y, V));
        pkv_context_free(r);
    }
    for (int s = 0; s < 4; s++) pkv_context_free(ctx[s]);
}

static void test_errors(void) {
    CHECK(pkv_model_load("/nonexistent/model.gguf", pkv_model_default_params()) == NULL);
    CHECK_MSG("/nonexistent/model.gguf");
    /* a file that is not GGUF */
    const char *bad = th_tmp("not-a-model.gguf");
    FILE *f = fopen(bad, "wb");
    fputs("this is not a gguf file at all", f);
    fclose(f);
    CHECK(pkv_model_load(bad, pkv_model_default_params()) == NULL);
    CHECK(strlen(pkv_errmsg()) > 0);
    unlink(bad);

    /* Build variants with the writer: unsupported arch, missing tensor, wrong shape,
     * unsupported RoPE scaling, YaRN with an original context of 0. */
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.n_layer = 1;
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "base");
    REQUIRE_VOID(g);
    struct {
        const char *what, *expect;
        int mode;
    } cases[] = {{"arch gpt-j", "architecture 'gptj' is not supported", 0},
                 {"no attn_q", "tensor 'blk.0.attn_q.weight' not found", 1},
                 {"wrong shape", "blk.0.ffn_up.weight", 2},
                 {"longrope", "RoPE scaling 'longrope' is not supported", 3},
                 {"rope_freqs", "rope_freqs.weight", 4},
                 {"yarn without context", "key 'llama.rope.scaling.original_context_length' is 0", 5}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        pkv_gguf_writer *w = pkv_gguf_writer_create();
        for (int64_t i = 0; i < pkv_gguf_n_kv(g); i++) {
            const char *key = pkv_gguf_kv_key(g, i);
            if (!strcmp(key, "general.architecture")) {
                CHECK_OK(pkv_gguf_writer_add_str(w, key, cases[k].mode == 0 ? "gptj" : "llama"));
            } else {
                CHECK_OK(pkv_gguf_writer_copy_kv(w, g, i));
            }
        }
        if (cases[k].mode == 0) { /* keys are renamed for the new arch name too */
            /* rename llama.* keys to gptj.* is unnecessary: the arch check comes first */
        }
        if (cases[k].mode == 3 || cases[k].mode == 5) { /* YaRN loads; with an original context of 0 it does not */
            CHECK_OK(pkv_gguf_writer_add_str(w, "llama.rope.scaling.type", cases[k].mode == 3 ? "longrope" : "yarn"));
            CHECK_OK(pkv_gguf_writer_add_f32(w, "llama.rope.scaling.factor", 4.0f));
        }
        if (cases[k].mode == 5) CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.rope.scaling.original_context_length", 0));
        for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) {
            const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
            if (cases[k].mode == 1 && !strcmp(t->name, "blk.0.attn_q.weight")) continue;
            int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
            if (cases[k].mode == 2 && !strcmp(t->name, "blk.0.ffn_up.weight")) {
                ne[1] = t->ne[1] / 2; /* half the rows: data still consistent in size */
                CHECK_OK(pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, t->n_bytes / 2));
                continue;
            }
            CHECK_OK(pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, t->n_bytes));
        }
        if (cases[k].mode == 4) {
            float freqs[32] = {0};
            int64_t ne[1] = {32};
            CHECK_OK(pkv_gguf_writer_add_tensor(w, "rope_freqs.weight", PKV_TYPE_F32, 1, ne, freqs, sizeof freqs));
        }
        void *data;
        size_t n;
        CHECK_OK(pkv_gguf_writer_write_memory(w, &data, &n));
        int64_t live = pkv_alloc_live();
        pkv_model *m = pkv_model_load_memory(data, n, cases[k].what, pkv_model_default_params());
        CHECK(m == NULL);
        if (!strstr(pkv_errmsg(), cases[k].expect)) TH_FAIL("%s: message '%s' lacks '%s'", cases[k].what, pkv_errmsg(), cases[k].expect);
        CHECK_INT(pkv_alloc_live(), live); /* nothing leaked */
        pkv_model_free(m);
        pkv_free(data);
        pkv_gguf_writer_free(w);
    }
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);

    /* token id out of range; context too small */
    pkv_model *m = make("llama", PKV_TYPE_F32, 1, "cpu");
    pkv_kv_cache *c = m ? cache(m, 16, PKV_TYPE_F16) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 8) : NULL;
    REQUIRE_VOID(ctx);
    int32_t badtok = V + 5;
    CHECK_STATUS(pkv_context_decode(ctx, &badtok, 1), PKV_ERR_INVALID);
    CHECK_MSG("outside the vocabulary");
    CHECK_INT(pkv_context_n_tokens(ctx), 0); /* nothing changed */
    int32_t nine[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK_STATUS(pkv_context_decode(ctx, nine, 9), PKV_ERR_INVALID);
    CHECK_MSG("limit of 8");
    CHECK_INT(pkv_context_n_tokens(ctx), 0);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* A model without vocabulary loads; text refuses, ids work. */
static void test_no_vocab(void) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.no_vocab = true;
    p.n_vocab = 100;
    p.n_layer = 1;
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_model *m = pkv_model_load_memory(img, size, "novocab", pkv_model_default_params());
    pkv_mkmodel_free_memory(img);
    REQUIRE_VOID(m);
    pkv_model_info info;
    CHECK_OK(pkv_model_get_info(m, &info));
    CHECK(!info.has_vocab);
    CHECK_INT(info.n_vocab, 100);
    size_t n;
    int32_t ids[8];
    CHECK_STATUS(pkv_model_tokenize(m, "hi", 2, true, false, ids, 8, &n), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("no vocabulary");
    pkv_kv_cache *c = cache(m, 16, PKV_TYPE_F16);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    int32_t t[3] = {1, 2, 99};
    if (ctx) CHECK_OK(pkv_context_decode(ctx, t, 3));
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

/* test-model-vulkan.c includes this file with the device set to vulkan:0. */
#ifndef MODEL_DEVICE
#define MODEL_DEVICE "cpu"
#endif

/* A sequence saved from c (K q8_0, V q4_0) does not load into caches of other
 * KV types of the same model: PKV_ERR_FORMAT naming both, nothing changed. */
static void test_load_other_types(pkv_model *m, pkv_kv_cache *c) {
    int32_t prompt[21];
    for (int i = 0; i < 21; i++) prompt[i] = (i * 5 + 2) % V;
    pkv_context *a = pkv_context_create(m, c, 0);
    REQUIRE_VOID(a);
    CHECK_OK(pkv_context_decode(a, prompt, 21));
    const char *path = th_tmp("test-model-kvq.kv");
    CHECK_OK(pkv_context_save(a, path));
    static const pkv_type other[3][2] = {{PKV_TYPE_F16, PKV_TYPE_F16}, {PKV_TYPE_Q8_0, PKV_TYPE_Q8_0}, {PKV_TYPE_Q4_0, PKV_TYPE_Q4_0}};
    for (int k = 0; k < 3; k++) {
        pkv_kv_cache *oc = cache2(m, 16, other[k][0], other[k][1]);
        REQUIRE_VOID(oc);
        pkv_context *l = pkv_context_load(m, oc, path, 0);
        CHECK(l == NULL);
        char want[128];
        snprintf(want, sizeof want, "layer 0 stores K q8_0, V q4_0 in the file, K %s, V %s in the cache",
                 pkv_type_name(other[k][0]), pkv_type_name(other[k][1]));
        CHECK_MSG(want);
        pkv_kv_stats st;
        pkv_kv_stats_get(oc, &st);
        CHECK_INT(st.pages_used, 0);
        pkv_context_free(l);
        pkv_kv_cache_free(oc);
    }
    unlink(path);
    pkv_context_free(a);
}

/* Whether the device runs c's KV pages: false only where its kernels refuse the
 * page type as unsupported (CUDA has no quantized KV pages yet: README); any other
 * failure fails the test. */
static bool kv_pages_run(pkv_model *m, pkv_kv_cache *c) {
    pkv_context *x = pkv_context_create(m, c, 0);
    REQUIRE(x != NULL);
    const int32_t t = 1;
    pkv_status s = pkv_context_decode(x, &t, 1);
    pkv_context_free(x);
    if (s == PKV_ERR_UNSUPPORTED && strstr(pkv_errmsg(), "KV pages of type")) return false;
    CHECK_OK(s);
    return true;
}

int main(void) {
    static const char *archs[] = {"llama", "qwen2", "qwen3"};
    pkv_device *probe = pkv_device_open(MODEL_DEVICE, pkv_device_default_params());
    if (!probe) return th_skip(pkv_errmsg());
    pkv_device_close(probe);
    for (int a = 0; a < 3; a++) {
        pkv_model *m = make(archs[a], a == 1 ? PKV_TYPE_Q8_0 : PKV_TYPE_F16, 2, MODEL_DEVICE);
        REQUIRE(m != NULL);
        for (int ps = 0; ps < 2; ps++) {
            pkv_kv_cache *c = cache(m, ps ? 1 : 16, ps ? PKV_TYPE_F32 : PKV_TYPE_F16);
            REQUIRE(c != NULL);
            test_fork_replay(m, c);
            test_swap_save(m, c);
            test_batch(m, c);
            pkv_kv_cache_free(c);
        }
        pkv_model_free(m);
    }
    /* quantized KV pages: heads of 32 */
    g_embd = 128;
    static const pkv_type kt[3][2] = {{PKV_TYPE_Q8_0, PKV_TYPE_Q8_0}, {PKV_TYPE_Q4_0, PKV_TYPE_Q4_0}, {PKV_TYPE_Q8_0, PKV_TYPE_Q4_0}};
    for (int a = 0; a < 3; a++) {
        pkv_model *m = make(archs[a], a == 1 ? PKV_TYPE_Q8_0 : PKV_TYPE_F16, 2, MODEL_DEVICE);
        REQUIRE(m != NULL);
        for (int k = 0; k < 3; k++) {
            pkv_kv_cache *c = cache2(m, k == 1 ? 7 : 16, kt[k][0], kt[k][1]);
            if (!c) TH_FAIL("%s K %s V %s: %s", archs[a], pkv_type_name(kt[k][0]), pkv_type_name(kt[k][1]), pkv_errmsg());
            REQUIRE(c != NULL);
            if (!kv_pages_run(m, c)) { /* CUDA: quantized KV pages are refused by its kernels (README) */
                fprintf(stderr, "%s on %s, KV K %s V %s: skipped: %s\n", archs[a], MODEL_DEVICE,
                        pkv_type_name(kt[k][0]), pkv_type_name(kt[k][1]), pkv_errmsg());
                pkv_kv_cache_free(c);
                continue;
            }
            fprintf(stderr, "%s on %s, KV K %s V %s\n", archs[a], MODEL_DEVICE, pkv_type_name(kt[k][0]), pkv_type_name(kt[k][1]));
            test_fork_replay(m, c);
            test_swap_save(m, c);
            g_batch_tol = 1e-6;
            test_batch(m, c);
            g_batch_tol = 1e-10;
            if (k == 2) test_load_other_types(m, c);
            pkv_kv_cache_free(c);
        }
        pkv_model_free(m);
    }
    g_embd = 64;
    if (!strcmp(MODEL_DEVICE, "cpu")) { /* device-independent checks: once */
        test_errors();
        test_no_vocab();
    }
    return th_done();
}
