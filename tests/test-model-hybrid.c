// labels: model unit
/* qwen35 (gated delta-net layers with a recurrent state, gated attention, an MTP
 * head), and qwen35moe against it (test_moe), given bad input: every missing or inconsistent delta-net key, a missing
 * tensor, a missing MTP tensor, are refused naming the key or tensor; a saved
 * sequence of another model (another state shape) is refused on load; a model's
 * MTP head loads from a file that has one and is refused from one that has not.
 * Split over two CPU devices (the delta-net layers by key-head groups) it gives
 * the one-device logits; splits it cannot make are refused by name. */
#include "base/base.h"
#include "model/gguf.h"
#include "ref-gguf.h"
#include "testhelp.h"

static pkv_mkmodel_params params(int seed, int v_heads) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "qwen35";
    p.type = PKV_TYPE_F32;
    p.n_layer = 4;
    p.n_embd = 64;
    p.n_vocab = 320;
    p.ssm_v_heads = v_heads;
    p.n_mtp = 1;
    p.seed = (uint64_t)seed;
    return p;
}

static pkv_model *load_img(const void *img, size_t size, bool mtp) {
    pkv_model_params mp = pkv_model_default_params();
    mp.mtp = mtp;
    return pkv_model_load_memory(img, size, "q35", mp);
}

/* Logits of a prompt and 4 greedy steps on the model placed as mp says. */
static bool split_run(const void *img, size_t size, pkv_model_params mp, float *lg, int V) {
    pkv_model *m = pkv_model_load_memory(img, size, "q35", mp);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    const int32_t prompt[9] = {5, 17, 2, 250, 33, 8, 91, 4, 60};
    bool ok = ctx && pkv_context_decode(ctx, prompt, 9) == PKV_OK;
    for (int i = 0; ok && i < 5; i++) {
        memcpy(lg + (size_t)i * (size_t)V, pkv_context_logits(ctx), (size_t)V * sizeof(float));
        int32_t t = 0;
        for (int k = 1; k < V; k++)
            if (lg[(size_t)i * (size_t)V + k] > lg[(size_t)i * (size_t)V + t]) t = k;
        ok = i == 4 || pkv_context_decode(ctx, &t, 1) == PKV_OK;
    }
    if (!ok) TH_FAIL("split run on %s: %s", mp.devices ? mp.devices : "cpu", pkv_errmsg());
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    return ok;
}

/* The delta-net layers split by key-head groups: 2 key heads with 2 value heads
 * each (value head h reads key head h % 2), one group per device, f32: the split
 * gives the one-device logits within nmse 1e-10 (test-multi's tolerance: the same
 * products summed in another order), with the KV cache on the host too (the
 * recurrent state stays on each device). A q8_0 file whose value heads are 16
 * columns cannot split ssm_out on blocks of 32: refused naming the tensor and the
 * split; 2 key heads cannot go to 3 devices. */
static void test_split(const void *img, size_t size) {
    enum { V = 320 };
    static float ref[5 * V], lg[5 * V];
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 1;
    if (!split_run(img, size, mp, ref, V)) return;
    for (int host = 0; host < 2; host++) {
        mp.devices = "cpu,cpu:1";
        mp.kv_on_host = host;
        if (!split_run(img, size, mp, lg, V)) continue;
        double e = th_nmse(ref, lg, 5 * V);
        fprintf(stderr, "qwen35 f32 cpu,cpu:1%s: nmse %.2e (tol 1e-10)\n", host ? " --kv-on-host" : "", e);
        if (!(e <= 1e-10)) TH_FAIL("qwen35 split%s: nmse %g", host ? " (KV on host)" : "", e);
        th_checks++;
    }
    mp.kv_on_host = false;
    mp.devices = "cpu,cpu:1,cpu:2";
    pkv_model *bad = pkv_model_load_memory(img, size, "q35", mp);
    CHECK(bad == NULL);
    CHECK_MSG("layer 0 (gated delta-net) has 2 key heads, which cannot be split over 3 devices");
    pkv_model_free(bad);
    pkv_mkmodel_params p = params(4, 4);
    p.type = PKV_TYPE_Q8_0;
    p.ssm_head_dim = 16;
    p.n_embd = 128;
    void *qimg = NULL;
    size_t qsize = 0;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &qimg, &qsize) == PKV_OK);
    mp.devices = NULL;
    pkv_model *one = pkv_model_load_memory(qimg, qsize, "q35-q8", mp); /* on one device it loads */
    CHECK(one != NULL);
    pkv_model_free(one);
    mp.devices = "cpu,cpu:1";
    bad = pkv_model_load_memory(qimg, qsize, "q35-q8", mp);
    CHECK(bad == NULL);
    CHECK_MSG("tensor 'blk.0.ssm_out.weight' cannot be split over 2 devices in proportions 1,1");
    CHECK_MSG("q8_0 block of 32");
    pkv_model_free(bad);
    pkv_mkmodel_free_memory(qimg);
}

/* qwen35moe is qwen35 with experts: from a qwen35 file g make a qwen35moe one whose
 * two experts are each layer's FFN (any router: the normalised weights sum to 1),
 * whose shared expert is that FFN with ffn_down times c and whose shared gate is 0
 * (sigmoid 0.5), so each layer's FFN output is (1 + c / 2) times the dense one's;
 * with drop, that tensor is left out. dense_scale > 0: instead the qwen35 file with
 * every ffn_down times dense_scale. */
static void *moe_of(const pkv_gguf *g, float c, float dense_scale, const char *drop, size_t *size) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = w != NULL, dense = dense_scale > 0;
    uint32_t F = 0;
    ok = ok && pkv_gguf_get_u32(g, "qwen35.feed_forward_length", &F) == PKV_OK;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) {
        const char *key = pkv_gguf_kv_key(g, i);
        char as[128];
        snprintf(as, sizeof as, "qwen35moe.%s", key + 7);
        if (dense) ok = !pkv_gguf_writer_copy_kv(w, g, i);
        else if (!strcmp(key, "general.architecture")) ok = !pkv_gguf_writer_add_str(w, key, "qwen35moe");
        else ok = !pkv_gguf_writer_copy_kv_as(w, g, i, strncmp(key, "qwen35.", 7) ? key : as);
    }
    if (!dense)
        ok = ok && !pkv_gguf_writer_add_u32(w, "qwen35moe.expert_count", 2) &&
             !pkv_gguf_writer_add_u32(w, "qwen35moe.expert_used_count", 2) &&
             !pkv_gguf_writer_add_u32(w, "qwen35moe.expert_feed_forward_length", F) &&
             !pkv_gguf_writer_add_u32(w, "qwen35moe.expert_shared_feed_forward_length", F);
    uint64_t rs = 11;
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        const char *ffn = strstr(t->name, ".ffn_");
        if (!ffn) {
            ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
            continue;
        }
        const bool down = strstr(ffn, "_down") != NULL;
        const size_t n = (size_t)t->n_elements;
        float *two = pkv_malloc(2 * n * sizeof(float));
        if (!(ok = two != NULL)) break;
        for (size_t k = 0; k < n; k++) two[k] = two[n + k] = ((const float *)t->data)[k] * (down && dense ? dense_scale : 1);
        char nm[96], base[64];
        snprintf(base, sizeof base, "%.*s", (int)(ffn - t->name), t->name); /* blk.N */
        int64_t ne3[3] = {t->ne[0], t->ne[1], 2};
        if (dense) {
            ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, two, t->n_bytes);
        } else {
            snprintf(nm, sizeof nm, "%s.%.*s_exps.weight", base, (int)(strstr(ffn, ".weight") - ffn - 1), ffn + 1);
            if (strcmp(nm + strlen(base) + 1, drop ? drop : "")) ok = !pkv_gguf_writer_add_tensor(w, nm, t->type, 3, ne3, two, 2 * t->n_bytes);
            for (size_t k = 0; down && k < n; k++) two[k] *= c;
            snprintf(nm, sizeof nm, "%s.%.*s_shexp.weight", base, (int)(strstr(ffn, ".weight") - ffn - 1), ffn + 1);
            if (ok && strcmp(nm + strlen(base) + 1, drop ? drop : ""))
                ok = !pkv_gguf_writer_add_tensor(w, nm, t->type, t->n_dims, t->ne, two, t->n_bytes);
        }
        if (ok && !dense && down) { /* the router (random) and the shared expert's gate (0) of this layer */
            const int64_t E = t->ne[1], ner[2] = {E, 2};
            for (int64_t k = 0; k < 2 * E; k++) two[k] = th_randf(&rs);
            snprintf(nm, sizeof nm, "%s.ffn_gate_inp.weight", base);
            ok = !pkv_gguf_writer_add_tensor(w, nm, PKV_TYPE_F32, 2, ner, two, (size_t)(2 * E) * 4);
            snprintf(nm, sizeof nm, "%s.ffn_gate_inp_shexp.weight", base);
            if (ok && strcmp("ffn_gate_inp_shexp.weight", drop ? drop : ""))
                ok = !pkv_gguf_writer_add_tensor(w, nm, PKV_TYPE_F32, 1, ner, NULL, (size_t)E * 4);
        }
        pkv_free(two);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    pkv_gguf_writer_free(w);
    return img;
}

/* qwen35moe against qwen35 (moe_of): a prompt and 4 greedy steps equal within
 * nmse 1e-10 (f32: the same products, the expert sum in another order); its MTP
 * head (MoE too) loads; a file without the shared expert's gate or an expert
 * matrix is refused naming the tensor. */
static void test_moe(const pkv_gguf *g) {
    enum { V = 320 };
    static float ref[5 * V], lg[5 * V];
    size_t ms = 0, ds = 0;
    void *mi = moe_of(g, 1.0f, 0, NULL, &ms), *di = moe_of(g, 0, 1.5f, NULL, &ds);
    REQUIRE_VOID(mi && di);
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 1;
    if (split_run(di, ds, mp, ref, V) && split_run(mi, ms, mp, lg, V)) {
        double e = th_nmse(ref, lg, 5 * V);
        fprintf(stderr, "qwen35moe (2 experts + gated shared expert) vs qwen35 (ffn_down x 1.5): nmse %.2e (tol 1e-10)\n", e);
        if (!(e <= 1e-10)) TH_FAIL("qwen35moe vs qwen35: nmse %g", e);
        th_checks++;
    }
    pkv_model *h = load_img(mi, ms, true);
    CHECK(h != NULL);
    pkv_model_info hi;
    if (h && !pkv_model_get_info(h, &hi)) CHECK_INT(hi.n_layer, 1);
    pkv_model_free(h);
    static const char *const drops[] = {"ffn_gate_inp_shexp.weight", "ffn_up_exps.weight", "ffn_down_shexp.weight"};
    for (size_t k = 0; k < sizeof drops / sizeof drops[0]; k++) {
        size_t bs = 0;
        void *bi = moe_of(g, 1.0f, 0, drops[k], &bs);
        pkv_model *bad = bi ? load_img(bi, bs, false) : NULL;
        CHECK(bi && bad == NULL);
        char want[96];
        snprintf(want, sizeof want, "tensor 'blk.0.%s' not found", drops[k]);
        if (!strstr(pkv_errmsg(), want)) TH_FAIL("qwen35moe without %s: message '%s'", drops[k], pkv_errmsg());
        pkv_model_free(bad);
        pkv_free(bi);
    }
    pkv_free(mi);
    pkv_free(di);
}

int main(void) {
    pkv_mkmodel_params p = params(3, 4);
    void *img = NULL;
    size_t size = 0;
    REQUIRE(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "q35");
    REQUIRE(g);
    /* the unchanged image, and its MTP head, load */
    pkv_model *m = load_img(img, size, false), *h = load_img(img, size, true);
    CHECK(m != NULL && h != NULL);
    pkv_model_info mi, hi;
    if (m && h && !pkv_model_get_info(m, &mi) && !pkv_model_get_info(h, &hi)) {
        CHECK_INT(mi.n_layer, 4);
        CHECK_INT(mi.n_recurrent, 3);
        CHECK_INT(mi.n_nextn, 1);
        CHECK(!mi.mtp && hi.mtp);
        CHECK_INT(hi.n_layer, 1);
    }
    pkv_model_free(h);
    static const struct {
        const char *key;
        int64_t set;
        const char *tensor;
        bool mtp;
        const char *want;
    } cases[] = {
        {"qwen35.ssm.conv_kernel", -1, NULL, false, "key 'qwen35.ssm.conv_kernel' not found"},
        {"qwen35.ssm.conv_kernel", 40, NULL, false, "key 'qwen35.ssm.conv_kernel' is 40"},
        {"qwen35.ssm.state_size", -1, NULL, false, "key 'qwen35.ssm.state_size' not found"},
        {"qwen35.ssm.group_count", 3, NULL, false, "is not a multiple of 'qwen35.ssm.group_count' 3"},
        {"qwen35.ssm.inner_size", 100, NULL, false, "'qwen35.ssm.inner_size' 100 must be"},
        {"qwen35.ssm.time_step_rank", -1, NULL, false, "key 'qwen35.ssm.time_step_rank' not found"},
        {"qwen35.rope.dimension_sections", -1, NULL, false, "qwen35.rope.dimension_sections"},
        {"qwen35.nextn_predict_layers", 5, NULL, false, "key 'qwen35.nextn_predict_layers' is 5"},
        {NULL, -1, "blk.0.ssm_a", false, "tensor 'blk.0.ssm_a' not found"},
        {NULL, -1, "blk.1.ssm_conv1d.weight", false, "tensor 'blk.1.ssm_conv1d.weight' not found"},
        {NULL, -1, "blk.3.attn_q_norm.weight", false, "tensor 'blk.3.attn_q_norm.weight' not found"},
        {NULL, -1, "blk.4.nextn.eh_proj.weight", true, "tensor 'blk.4.nextn.eh_proj.weight' not found"},
        {NULL, -1, "blk.4.attn_q.weight", true, "tensor 'blk.4.attn_q.weight' not found"},
        {"qwen35.nextn_predict_layers", -1, NULL, true, "key 'qwen35.nextn_predict_layers' is absent or 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t vs = 0;
        void *v = ref_gguf_variant(g, cases[k].key, cases[k].set, cases[k].tensor, NULL, NULL, &vs);
        if (!v) {
            TH_FAIL("case %zu: could not write the variant", k);
            continue;
        }
        pkv_model *bad = load_img(v, vs, cases[k].mtp);
        if (bad) TH_FAIL("case %zu (%s%s): loaded", k, cases[k].key ? cases[k].key : "", cases[k].tensor ? cases[k].tensor : "");
        else if (!strstr(pkv_errmsg(), cases[k].want))
            TH_FAIL("case %zu: message '%s' lacks '%s'", k, pkv_errmsg(), cases[k].want);
        th_checks++;
        pkv_model_free(bad);
        pkv_free(v);
    }
    /* an MTP head asked of an architecture whose files have none names those that do */
    {
        pkv_mkmodel_params pl = pkv_mkmodel_default_params();
        pl.type = PKV_TYPE_F32;
        void *li = NULL;
        size_t ls = 0;
        CHECK_OK(pkv_mkmodel_memory(&pl, &li, &ls));
        pkv_model *lm = li ? load_img(li, ls, true) : NULL;
        CHECK(lm == NULL && strstr(pkv_errmsg(), "MTP heads are read for qwen35, qwen35moe and glm4moe files only"));
        pkv_model_free(lm);
        pkv_mkmodel_free_memory(li);
    }
    /* a saved sequence of another model (another state shape) is refused on load */
    pkv_mkmodel_params p2 = params(3, 2);
    void *img2 = NULL;
    size_t size2 = 0;
    pkv_model *m2 = pkv_mkmodel_memory(&p2, &img2, &size2) ? NULL : load_img(img2, size2, false);
    CHECK(m2 != NULL);
    if (m && m2) {
        pkv_cache_params cp = pkv_cache_default_params();
        cp.n_ctx = 128;
        pkv_kv_cache *c = pkv_model_cache_create(m, cp), *c2 = pkv_model_cache_create(m2, cp);
        pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
        const int32_t toks[5] = {3, 1, 4, 1, 5};
        const char *path = th_tmp("hybrid.pkvseq");
        CHECK(ctx && pkv_context_decode(ctx, toks, 5) == PKV_OK && pkv_context_save(ctx, path) == PKV_OK);
        pkv_context *back = c2 ? pkv_context_load(m2, c2, path, 0) : NULL;
        CHECK(back == NULL);
        pkv_context *same = c ? pkv_context_load(m, c, path, 0) : NULL; /* and into its own model it loads */
        CHECK(same != NULL);
        if (same && ctx) CHECK_INT(pkv_context_n_tokens(same), 5);
        pkv_context_free(same);
        pkv_context_free(back);
        pkv_context_free(ctx);
        pkv_kv_cache_free(c);
        pkv_kv_cache_free(c2);
        unlink(path);
    }
    pkv_model_free(m2);
    pkv_mkmodel_free_memory(img2);
    test_split(img, size);
    test_moe(g);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
    return th_done();
}
