// labels: model
/* LoRA adapters (docs/lora.md):
 *  - a model with an adapter gives the logits of the model with W' = W + s·B·A
 *    merged on the host into a copy of the file (f32 weights), for llama, qwen3
 *    and qwen3moe (attention and output: the experts are not covered), with one
 *    adapter and with two at once;
 *  - scale 0 is bitwise the base;
 *  - adapters of another base (a shape) or another architecture are refused,
 *    naming the tensor or the key, and so are bad uses (another model's adapter,
 *    too many, a NaN scale); a load whose allocations fail in turn leaves nothing;
 *  - engine: requests with different adapter sets batched together give bitwise
 *    what each gives alone, and the adapter changes the output;
 *  - prefix cache: a prompt's KV computed with adapter X is never reused by a
 *    request with another set (none, or X at another scale), and is by one with X
 *    at the same scale. */
#include <math.h>

#include "assistant-testlib.h"
#include "engine-testlib.h"
#include "base/quant.h"
#include "model/gguf.h"
#include "model/lora.h"

enum { N_TOK = 12 };

static pkv_mkmodel_params base_params(const char *arch, int n_ff) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = PKV_TYPE_F32;
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = n_ff;
    p.n_vocab = 320;
    p.seed = 7;
    return p;
}

static pkv_model *load(const char *path) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load(path, mp);
    if (!m) TH_FAIL("load %s: %s", path, pkv_errmsg());
    return m;
}

/* The base file with each covered matrix W replaced by f32 W + sum over uses of
 * scale_u · alpha_u / r · B_u A_u (computed in double). */
static bool write_merged(const char *base, const char *const *adapters, const float *scales, int n, const char *out) {
    pkv_gguf *g = pkv_gguf_open(base), *ga[4] = {0};
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = g && w;
    for (int u = 0; ok && u < n; u++) ok = (ga[u] = pkv_gguf_open(adapters[u])) != NULL;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) ok = !pkv_gguf_writer_copy_kv(w, g, i);
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        double *acc = NULL;
        for (int u = 0; ok && u < n; u++) {
            char na[128], nb[128];
            snprintf(na, sizeof na, "%s.lora_a", t->name);
            snprintf(nb, sizeof nb, "%s.lora_b", t->name);
            const pkv_gguf_tensor *ta = pkv_gguf_find_tensor(ga[u], na), *tb = pkv_gguf_find_tensor(ga[u], nb);
            if (!ta || !tb) continue;
            /* each expert's matrix (3-D: [in, out, experts]); token_embd's pair is
             * flipped (A [r, n_vocab], B [r, n_embd]): ΔW[v][e] = Σ A[v][k] B[e][k] */
            const bool embd = !strcmp(t->name, "token_embd.weight");
            const int64_t in = t->ne[0], outd = t->ne[1], X = t->n_dims == 3 ? t->ne[2] : 1,
                          r = embd ? ta->ne[0] : ta->ne[1];
            float alpha = 0;
            pkv_gguf_get_f32(ga[u], "adapter.lora.alpha", &alpha);
            const double s = scales[u] * (alpha != 0 ? alpha / (double)r : 1.0);
            const int64_t n_a = (embd ? outd : in) * r * X, n_b = (embd ? in : outd) * r * X;
            float *A = malloc((size_t)n_a * 4), *B = malloc((size_t)n_b * 4);
            if (!acc) {
                float *W = malloc((size_t)(in * outd * X) * 4);
                acc = malloc((size_t)(in * outd * X) * sizeof *acc);
                ok = W && acc && !pkv_dequantize_row(t->type, t->data, W, in * outd * X);
                for (int64_t k = 0; ok && k < in * outd * X; k++) acc[k] = W[k];
                free(W);
            }
            ok = ok && A && B && ta->n_elements == (uint64_t)n_a && tb->n_elements == (uint64_t)n_b &&
                 !pkv_dequantize_row(ta->type, ta->data, A, n_a) && !pkv_dequantize_row(tb->type, tb->data, B, n_b);
            for (int64_t x = 0; ok && x < X; x++) {
                const float *Ax = A + x * in * r, *Bx = B + x * r * outd;
                double *W = acc + x * in * outd;
                for (int64_t o = 0; o < outd; o++)
                    for (int64_t c = 0; c < in; c++) {
                        double d = 0;
                        for (int64_t k = 0; k < r; k++)
                            d += embd ? (double)Ax[o * r + k] * Bx[c * r + k] : (double)Bx[o * r + k] * Ax[k * in + c];
                        W[o * in + c] += s * d;
                    }
            }
            free(A);
            free(B);
        }
        if (!ok) break;
        if (acc) {
            const int64_t n_el = t->ne[0] * t->ne[1] * (t->n_dims == 3 ? t->ne[2] : 1);
            float *f = malloc((size_t)n_el * 4);
            for (int64_t k = 0; f && k < n_el; k++) f[k] = (float)acc[k];
            ok = f && !pkv_gguf_writer_add_tensor(w, t->name, PKV_TYPE_F32, t->n_dims, t->ne, f, (size_t)n_el * 4);
            free(f);
            free(acc);
        } else {
            ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
        }
    }
    if (ok) ok = !pkv_gguf_writer_write(w, out);
    if (!ok) TH_FAIL("merging into %s: %s", out, pkv_errmsg());
    pkv_gguf_writer_free(w);
    for (int u = 0; u < n; u++) pkv_gguf_close(ga[u]);
    pkv_gguf_close(g);
    return ok;
}

/* Every token's logits of the prompt on a fresh cache. */
static bool logits_of(pkv_model *m, const int32_t *tok, int n, float *out) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    cp.page_size = 8;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 64) : NULL;
    bool ok = ctx && !pkv_context_decode_all(ctx, tok, n, out);
    if (!ok) TH_FAIL("decode: %s", pkv_errmsg());
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    return ok;
}

static bool mk_adapter(const char *base, int rank, float alpha, pkv_type type, uint64_t seed, const char *out) {
    pkv_mklora_params lp = {.base = base, .rank = rank, .alpha = alpha, .type = type, .seed = seed};
    if (pkv_mklora_write(&lp, out)) {
        TH_FAIL("mklora: %s", pkv_errmsg());
        return false;
    }
    return true;
}

/* Damaged copies of the adapter at path (bytes flipped, the file cut): a load gives
 * an adapter or NULL with a message, never a crash (ASan), and leaves nothing
 * allocated. */
static void damaged(pkv_model *m, const char *path, uint64_t seed) {
    FILE *af = fopen(path, "rb");
    static uint8_t img[1 << 20], bad_img[1 << 20];
    size_t img_n = af ? fread(img, 1, sizeof img, af) : 0;
    if (af) fclose(af);
    CHECK(img_n > 0 && img_n < sizeof img);
    uint64_t rs = seed;
    const int64_t live0 = pkv_alloc_live();
    for (int it = 0; it < 300 && img_n; it++) {
        memcpy(bad_img, img, img_n);
        size_t n = img_n;
        if (it % 4 == 3) n = th_rand(&rs) % img_n;
        for (int k = 0; k < 1 + it % 5; k++) {
            size_t at = th_rand(&rs) % (it % 2 ? PKV_MIN(n, (size_t)2048) : n ? n : 1); /* the header often */
            if (at < n) bad_img[at] ^= (uint8_t)(1u << (th_rand(&rs) % 8));
        }
        pkv_lora *t = pkv_lora_load_memory(m, bad_img, n, "damaged");
        if (!t && !pkv_errmsg()[0]) TH_FAIL("damaged adapter %d: NULL without a message", it);
        pkv_lora_free(t);
    }
    if (pkv_alloc_live() != live0) TH_FAIL("damaged adapters left %lld allocations", (long long)(pkv_alloc_live() - live0));
    th_checks++;
}

/* Every allocation of a load of path failing in turn: NULL with a message, nothing
 * left allocated. */
static void alloc_fails(pkv_model *m, const char *path) {
    int fails = 0;
    for (uint64_t n = 1; n < 10000; n++) {
        const int64_t live = pkv_alloc_live();
        pkv_alloc_fail_at(0);
        pkv_alloc_fail_at(n);
        pkv_lora *t = pkv_lora_load(m, path);
        pkv_alloc_fail_at(0);
        if (t) {
            pkv_lora_free(t);
            break;
        }
        fails++;
        if (!pkv_errmsg()[0]) TH_FAIL("allocation %llu failed without a message", (unsigned long long)n);
        if (pkv_alloc_live() != live)
            TH_FAIL("allocation %llu failing leaves %lld allocations", (unsigned long long)n, (long long)(pkv_alloc_live() - live));
    }
    th_checks++;
    if (fails < 3) TH_FAIL("only %d allocations of a load were failed", fails);
}

/* One architecture against the merged reference. */
static void merged_vs_adapter(const char *arch, int n_layer, int n_pairs) {
    fprintf(stderr, "-- %s\n", arch);
    const char *base = th_tmp("lora-base.gguf"), *a1 = th_tmp("lora-a1.gguf"), *a2 = th_tmp("lora-a2.gguf"),
               *merged = th_tmp("lora-merged.gguf");
    pkv_mkmodel_params p = base_params(arch, 128);
    p.n_layer = n_layer;
    if (pkv_mkmodel_write(&p, base)) {
        TH_FAIL("mkmodel: %s", pkv_errmsg());
        return;
    }
    if (!mk_adapter(base, 8, 16.0f, PKV_TYPE_F32, 1, a1) || !mk_adapter(base, 4, 0.0f, PKV_TYPE_F16, 2, a2)) return;
    int32_t tok[N_TOK];
    uint64_t rs = 11;
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)(th_rand(&rs) % 300);
    const size_t V = 320, n_l = (size_t)N_TOK * V;
    float *base_lg = malloc(n_l * 4), *lg = malloc(n_l * 4), *ref = malloc(n_l * 4);
    pkv_model *m = load(base);
    REQUIRE_VOID(m && base_lg && lg && ref);
    pkv_lora *l1 = pkv_lora_load(m, a1), *l2 = pkv_lora_load(m, a2);
    if (!l1 || !l2) TH_FAIL("pkv_lora_load: %s", pkv_errmsg());
    REQUIRE_VOID(l1 && l2);
    /* the experts' 3-D pairs, token_embd's flipped one (and the tied output's), fused matrices */
    damaged(m, a2, 5);
    alloc_fails(m, a2);
    pkv_lora_info info;
    CHECK_OK(pkv_lora_get_info(l1, &info));
    CHECK_INT(info.rank, 8);
    CHECK(info.alpha == 16.0f);
    CHECK_INT(info.n_pairs, n_pairs);
    CHECK(logits_of(m, tok, N_TOK, base_lg));

    /* scale 0: bitwise the base, and the fingerprint the base's */
    const uint64_t fp0 = m->fingerprint;
    pkv_lora_use u0 = {l1, 0.0f};
    CHECK_OK(pkv_model_lora_apply(m, &u0, 1));
    CHECK(m->fingerprint == fp0);
    CHECK(logits_of(m, tok, N_TOK, lg));
    CHECK_MEM(lg, base_lg, n_l * 4);

    /* one adapter, then two */
    const char *both[2] = {a1, a2};
    const float sc[2] = {0.75f, -1.5f};
    for (int n = 1; n <= 2; n++) {
        pkv_lora_use u[2] = {{l1, sc[0]}, {l2, sc[1]}};
        CHECK_OK(pkv_model_lora_apply(m, u, n));
        CHECK(m->fingerprint != fp0);
        CHECK(logits_of(m, tok, N_TOK, lg));
        if (!write_merged(base, both, sc, n, merged)) break;
        pkv_model *mm = load(merged);
        if (!mm) break;
        CHECK(logits_of(mm, tok, N_TOK, ref));
        pkv_model_free(mm);
        double e = th_nmse(ref, lg, n_l), effect = th_nmse(base_lg, ref, n_l);
        fprintf(stderr, "%s, %d adapter(s): NMSE vs merged %.3g; the adapters' effect (NMSE vs base) %.3g\n", arch, n, e,
                effect);
        /* f32 both ways, but W + s·B·A is rounded once merged and the runtime adds
         * s·B(A·x) to W·x: last-bit differences, measured up to 4e-10 on x86 and
         * 1.5e-9 on aarch64's i8mm path (phi3); the adapters' effect is ~1 */
        CHECK(e < 1e-7);
        CHECK(effect > 1e-4); /* the adapters do change the logits */
    }
    CHECK_OK(pkv_model_lora_apply(m, NULL, 0));
    CHECK(m->fingerprint == fp0);
    CHECK(logits_of(m, tok, N_TOK, lg));
    CHECK_MEM(lg, base_lg, n_l * 4);
    pkv_lora_free(l1);
    pkv_lora_free(l2);
    pkv_model_free(m);
    free(base_lg);
    free(lg);
    free(ref);
    remove(base);
    remove(a1);
    remove(a2);
    remove(merged);
}

/* An adapter of one pair, name.lora_a of shape ea[na] and name.lora_b of eb[nb]
 * (f32, small values), for a base of architecture arch. */
static bool write_pair(const char *arch, const char *name, const int64_t *ea, int na, const int64_t *eb, int nb,
                       const char *out) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    int64_t n_a = 1, n_b = 1;
    for (int i = 0; i < na; i++) n_a *= ea[i];
    for (int i = 0; i < nb; i++) n_b *= eb[i];
    float *x = calloc((size_t)(n_a > n_b ? n_a : n_b), 4);
    char ta[128], tb[128];
    snprintf(ta, sizeof ta, "%s.lora_a", name);
    snprintf(tb, sizeof tb, "%s.lora_b", name);
    bool ok = w && x && !pkv_gguf_writer_add_str(w, "general.architecture", arch) &&
              !pkv_gguf_writer_add_str(w, "general.type", "adapter") && !pkv_gguf_writer_add_str(w, "adapter.type", "lora") &&
              !pkv_gguf_writer_add_tensor(w, ta, PKV_TYPE_F32, na, ea, x, (size_t)n_a * 4) &&
              !pkv_gguf_writer_add_tensor(w, tb, PKV_TYPE_F32, nb, eb, x, (size_t)n_b * 4) && !pkv_gguf_writer_write(w, out);
    if (!ok) TH_FAIL("writing %s: %s", out, pkv_errmsg());
    free(x);
    pkv_gguf_writer_free(w);
    return ok;
}

/* Pairs of the kinds adapters now cover, misnamed or misshaped: refused at load
 * naming the tensor and what it expects, and nothing is loaded. */
static void refusals_fused(void) {
    char base[512], ad[512];
    snprintf(base, sizeof base, "%s", th_tmp("lora-f-base.gguf"));
    snprintf(ad, sizeof ad, "%s", th_tmp("lora-f-ad.gguf"));
    static const struct {
        const char *arch, *name;
        int na, nb;
        int64_t ea[3], eb[3];
        const char *msg, *msg2;
    } k[] = {
        /* phi3 holds Q, K, V in attn_qkv: an adapter of attn_q alone has no product to add to */
        {"phi3", "blk.0.attn_q.weight", 2, 2, {64, 4}, {4, 64}, "'blk.0.attn_q.weight.lora_a'", "fused"},
        {"phi3", "blk.1.ffn_gate.weight", 2, 2, {64, 4}, {4, 128}, "'blk.1.ffn_gate.weight.lora_a'", "fused"},
        /* phi3's fused attn_qkv has 64 + 32 + 32 rows */
        {"phi3", "blk.0.attn_qkv.weight", 2, 2, {64, 4}, {4, 64}, "blk.0.attn_qkv.weight", "lora_b [r, 128]"},
        /* a tied model has no output.weight */
        {"gemma3", "output.weight", 2, 2, {64, 4}, {4, 320}, "'output.weight.lora_a'", "token_embd.weight"},
        /* token_embd's pair is flipped: A [r, n_vocab], B [r, n_embd] */
        {"llama", "token_embd.weight", 2, 2, {64, 4}, {4, 320}, "token_embd.weight", "lora_a [r, 320] and lora_b [r, 64]"},
        /* the experts' pairs are 3-D, one matrix per expert */
        {"qwen3moe", "blk.0.ffn_up_exps.weight", 2, 2, {64, 4}, {4, 128}, "blk.0.ffn_up_exps.weight", "[64, 128, 4 experts] expects lora_a [64, r, 4]"},
        {"qwen3moe", "blk.0.ffn_gate_up_exps.weight", 3, 3, {64, 4, 4}, {4, 256, 4}, "'blk.0.ffn_gate_up_exps.weight.lora_a'",
         "not ffn_gate_up_exps"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        pkv_mkmodel_params p = base_params(k[i].arch, 128);
        if (pkv_mkmodel_write(&p, base)) {
            TH_FAIL("mkmodel %s: %s", k[i].arch, pkv_errmsg());
            continue;
        }
        if (!write_pair(k[i].arch, k[i].name, k[i].ea, k[i].na, k[i].eb, k[i].nb, ad)) continue;
        pkv_model *m = load(base);
        if (!m) continue;
        const int64_t live = pkv_alloc_live();
        CHECK(pkv_lora_load(m, ad) == NULL);
        fprintf(stderr, "%s %s: %s\n", k[i].arch, k[i].name, pkv_errmsg());
        CHECK_MSG(k[i].msg);
        CHECK_MSG(k[i].msg2);
        CHECK(pkv_alloc_live() == live && m->loras == NULL);
        pkv_model_free(m);
    }
    /* Gemma 4's assistant reads its target's embedding rows: its own token_embd
     * (its tied head) takes no adapter */
    char tpath[512], apath[512];
    if (at_files("lora-f-target.gguf", tpath, apath, sizeof tpath)) {
        const int64_t ea[2] = {4, AT_V}, eb[2] = {4, 48};
        pkv_model *m = write_pair("gemma4-assistant", "token_embd.weight", ea, 2, eb, 2, ad) ? load(apath) : NULL;
        if (m) {
            CHECK(pkv_lora_load(m, ad) == NULL);
            CHECK_MSG("'token_embd.weight.lora_a': the model's input rows are its target's token embedding");
            pkv_model_free(m);
        }
    } else {
        TH_FAIL("assistant files: %s", pkv_errmsg());
    }
    remove(tpath);
    remove(apath);
    remove(base);
    remove(ad);
}

static void refusals(void) {
    char base[512], other[512], qw[512], a_other[512], a_qw[512], a_ok[512]; /* (th_tmp keeps 4 names) */
    snprintf(base, sizeof base, "%s", th_tmp("lora-r-base.gguf"));
    snprintf(other, sizeof other, "%s", th_tmp("lora-r-other.gguf"));
    snprintf(qw, sizeof qw, "%s", th_tmp("lora-r-qwen3.gguf"));
    snprintf(a_other, sizeof a_other, "%s", th_tmp("lora-r-a1.gguf"));
    snprintf(a_qw, sizeof a_qw, "%s", th_tmp("lora-r-a2.gguf"));
    snprintf(a_ok, sizeof a_ok, "%s", th_tmp("lora-r-a3.gguf"));
    pkv_mkmodel_params p = base_params("llama", 128), po = base_params("llama", 96), pq = base_params("qwen3", 128);
    REQUIRE_VOID(!pkv_mkmodel_write(&p, base) && !pkv_mkmodel_write(&po, other) && !pkv_mkmodel_write(&pq, qw));
    REQUIRE_VOID(mk_adapter(other, 4, 8, PKV_TYPE_F16, 3, a_other) && mk_adapter(qw, 4, 8, PKV_TYPE_F16, 3, a_qw) &&
                 mk_adapter(base, 4, 8, PKV_TYPE_F16, 3, a_ok));
    pkv_model *m = load(base), *m2 = load(base);
    REQUIRE_VOID(m && m2);
    /* another base: the first pair whose shape differs (ffn_gate's rows) is named */
    CHECK(pkv_lora_load(m, a_other) == NULL);
    CHECK_MSG("blk.0.ffn_gate.weight");
    CHECK_MSG("lora_b [r, 128]");
    CHECK(pkv_lora_load(m, a_qw) == NULL);
    CHECK_MSG("general.architecture");
    CHECK(pkv_lora_load(m, base) == NULL); /* a model is not an adapter */
    CHECK_MSG("general.type");
    damaged(m, a_ok, 77);
    /* a model split over devices refuses adapters, naming the devices */
    pkv_model_params mp = pkv_model_default_params();
    mp.devices = "cpu:1,cpu:2";
    pkv_model *ms = pkv_model_load(base, mp);
    if (ms) {
        CHECK(pkv_lora_load(ms, a_ok) == NULL);
        CHECK_MSG("one CPU or Vulkan device");
        CHECK_MSG("cpu:1 and others");
        pkv_model_free(ms);
    } else {
        fprintf(stderr, "no cpu:1,cpu:2 (%s): the split-model refusal is not checked\n", pkv_errmsg());
    }
    alloc_fails(m, a_ok);
    pkv_lora *l = pkv_lora_load(m, a_ok), *l2 = pkv_lora_load(m2, a_ok);
    REQUIRE_VOID(l && l2);
    pkv_lora_use bad[PKV_MAX_LORA + 1];
    for (int i = 0; i <= PKV_MAX_LORA; i++) bad[i] = (pkv_lora_use){l, 1.0f};
    const uint64_t fp = m->fingerprint;
    CHECK_STATUS(pkv_model_lora_apply(m, bad, PKV_MAX_LORA + 1), PKV_ERR_INVALID);
    CHECK_MSG("at most 8");
    bad[0].lora = l2;
    CHECK_STATUS(pkv_model_lora_apply(m, bad, 1), PKV_ERR_INVALID);
    CHECK_MSG("another model's");
    bad[0] = (pkv_lora_use){l, NAN};
    CHECK_STATUS(pkv_model_lora_apply(m, bad, 1), PKV_ERR_INVALID);
    CHECK_MSG("not finite");
    CHECK(m->fingerprint == fp && m->n_lora == 0); /* nothing changed */
    /* an engine request likewise */
    pkv_engine *e = pkv_engine_create(m, et_params(128, 8, 0));
    REQUIRE_VOID(e);
    int32_t tok[4] = {1, 2, 3, 4};
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = tok;
    rp.n_prompt = 4;
    rp.max_tokens = 2;
    rp.lora = bad;
    rp.n_lora = 1;
    CHECK_STATUS(pkv_engine_submit(e, &rp, NULL), PKV_ERR_INVALID);
    CHECK_MSG("scale is not finite");
    pkv_engine_free(e);
    pkv_lora_free(l);
    pkv_lora_free(l2);
    pkv_model_free(m);
    pkv_model_free(m2);
    remove(base);
    remove(other);
    remove(qw);
    remove(a_other);
    remove(a_qw);
    remove(a_ok);
}

/* Requests with different adapter sets batched together == each alone; and the
 * prefix cache keyed by the set. */
/* arch's requests with different sets batched == each alone (the experts' deltas
 * run per run of rows that share a set, the embedding's per sequence); prefix: the
 * prefix-cache checks too. */
static void engine_sets(const char *arch, bool prefix) {
    fprintf(stderr, "-- engine sets: %s\n", arch);
    const char *base = th_tmp("lora-e-base.gguf"), *a1 = th_tmp("lora-e-a1.gguf"), *a2 = th_tmp("lora-e-a2.gguf");
    pkv_mkmodel_params p = base_params(arch, 128);
    p.type = PKV_TYPE_Q8_0; /* the quantized batched matmul path */
    REQUIRE_VOID(!pkv_mkmodel_write(&p, base));
    REQUIRE_VOID(mk_adapter(base, 8, 16, PKV_TYPE_F16, 5, a1) && mk_adapter(base, 4, 0, PKV_TYPE_F32, 6, a2));
    pkv_model *m = load(base);
    REQUIRE_VOID(m);
    pkv_lora *l1 = pkv_lora_load(m, a1), *l2 = pkv_lora_load(m, a2);
    REQUIRE_VOID(l1 && l2);
    const pkv_lora_use sets[5][2] = {{{l1, 1.0f}}, {{l2, 0.5f}}, {{0}}, {{l1, 1.0f}, {l2, 0.5f}}, {{l1, 0.25f}}};
    const int n_set[5] = {1, 1, -1, 2, 1}; /* -1: lora NULL (the model's default: none) */
    enum { NR = 5 };
    int32_t prompts[NR][20];
    uint64_t rs = 99;
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < 20; j++) prompts[i][j] = (int32_t)(th_rand(&rs) % 300);
    pkv_request_params rp[NR];
    static et_rec alone[NR], batched[NR];
    for (int i = 0; i < NR; i++) {
        rp[i] = pkv_request_default_params();
        rp[i].prompt = prompts[i % 2]; /* shared prompts: prefix matches across sets must not happen */
        rp[i].n_prompt = 10 + 5 * (i % 2);
        rp[i].max_tokens = 12;
        rp[i].sampling.temp = 0;
        rp[i].top_logprobs = ET_TOP;
        rp[i].lora = n_set[i] < 0 ? NULL : sets[i];
        rp[i].n_lora = n_set[i] < 0 ? 0 : n_set[i];
        et_alone(m, &rp[i], &alone[i]);
    }
    /* the adapters change what comes out: request 0 (adapter 1) vs request 2 (none), same prompt */
    CHECK(memcmp(alone[0].s[0].lp, alone[2].s[0].lp, sizeof alone[0].s[0].lp) != 0);
    pkv_engine *e = pkv_engine_create(m, et_params(256, 8, 0));
    REQUIRE_VOID(e);
    for (int i = 0; i < NR; i++) {
        memset(&batched[i], 0, sizeof batched[i]);
        pkv_request_params r = rp[i];
        r.on_event = et_on_event;
        r.user = &batched[i];
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
    }
    et_drain(e);
    for (int i = 0; i < NR; i++) et_same(&alone[i], &batched[i], 1, "batched with other adapter sets: request", i);
    pkv_engine_free(e);
    e = NULL;

    /* prefix cache: X computes a 24-token prompt; then the same prompt with no set,
     * X at another scale, another adapter: nothing cached, each equal to alone;
     * X at the same scale again: its full pages are reused */
    if (prefix) e = pkv_engine_create(m, et_params(256, 8, 0));
    REQUIRE_VOID(e || !prefix);
    int32_t pr[25];
    for (int j = 0; j < 25; j++) pr[j] = (int32_t)(th_rand(&rs) % 300);
    const pkv_lora_use x = {l1, 1.0f}, x2 = {l1, 0.5f}, y = {l2, 1.0f};
    const pkv_lora_use *order[5] = {&x, NULL, &x2, &y, &x};
    const int32_t want_cached[5] = {0, 0, 0, 0, 24};
    for (int k = 0; prefix && k < 5; k++) {
        pkv_request_params r = pkv_request_default_params();
        r.prompt = pr;
        r.n_prompt = 25;
        r.max_tokens = 4;
        r.sampling.temp = 0;
        r.top_logprobs = ET_TOP;
        r.lora = order[k];
        r.n_lora = order[k] ? 1 : 0;
        et_rec ref, got;
        et_alone(m, &r, &ref);
        memset(&got, 0, sizeof got);
        r.on_event = et_on_event;
        r.user = &got;
        CHECK_OK(pkv_engine_submit(e, &r, NULL));
        et_drain(e);
        if (got.s[0].n_cached != want_cached[k])
            TH_FAIL("prefix request %d: %d tokens cached, expected %d", k, got.s[0].n_cached, want_cached[k]);
        th_checks++;
        et_same(&ref, &got, 1, "after another set's prefix: request", k);
    }
    pkv_engine_free(e);
    pkv_lora_free(l1);
    pkv_lora_free(l2);
    pkv_model_free(m);
    remove(base);
    remove(a1);
    remove(a2);
}

int main(void) {
    /* the adapters cover every matrix mkmodel writes: token_embd, and output where untied */
    merged_vs_adapter("llama", 2, 2 * 7 + 2);
    merged_vs_adapter("qwen3", 2, 2 * 7 + 2);
    /* attention, the router and the experts' gate, up and down */
    merged_vs_adapter("qwen3moe", 2, 2 * 8 + 2);
    merged_vs_adapter("gpt-oss", 2, 2 * 8 + 2);
    /* fused attn_qkv and ffn_up (gate then up), attn_output, ffn_down */
    merged_vs_adapter("phi3", 2, 2 * 4 + 2);
    /* three delta-net layers (attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out and
     * the FFN's 3), then an attention layer whose attn_q holds the gate too */
    merged_vs_adapter("qwen35", 4, 3 * 8 + 7 + 2);
    /* lfm2: two short-conv layers (in_proj's three row blocks, out_proj) and an attention layer */
    merged_vs_adapter("lfm2", 3, 2 * 5 + 7 + 2);
    /* tied: token_embd's pair is the input rows' delta and the output's */
    merged_vs_adapter("gemma3", 2, 2 * 7 + 1);
    refusals();
    refusals_fused();
    engine_sets("llama", true);
    engine_sets("qwen3moe", false);
    engine_sets("gemma3", false);
    engine_sets("phi3", false);
    return th_done();
}
