// labels: unit
/* Every public function called with NULL handles and negative or absurd sizes: it
 * must return an error status (or NULL / a neutral value), never crash, and leave
 * valid objects working. Also: a cache of another model is refused by
 * pkv_context_create, a sampler of another vocabulary by pkv_generate. */
#include "testhelp.h"

static bool count_tok(int32_t t, void *u) {
    (void)t;
    (*(int *)u)++;
    return true;
}

static void null_handles(void) {
    int32_t seq = 0, tok = 0, child = 0;
    int64_t n64 = 0;
    size_t n = 0;
    pkv_kv_stats st;
    pkv_kv_layer_info li;
    pkv_kv_shard_info si;
    pkv_model_info mi;
    char buf[64];
    float f[4] = {0};

    CHECK(pkv_status_str((pkv_status)-12345) != NULL);
    CHECK(pkv_type_name((pkv_type)9999) == NULL);
    CHECK(pkv_type_from_name(NULL, NULL) != PKV_OK);
    CHECK(pkv_type_row_bytes((pkv_type)9999, 32) == 0);
    CHECK(pkv_device_enumerate(-1, NULL, -1, NULL, NULL, 0) != PKV_OK);
    CHECK(pkv_device_open(NULL, pkv_device_default_params()) == NULL);
    pkv_device_weight_layout(NULL, PKV_TYPE_Q4_K, buf, sizeof buf);
    CHECK(strcmp(buf, "plain") == 0);
    pkv_device_weight_layout(NULL, (pkv_type)9999, NULL, 0);
    CHECK(pkv_device_open("nonsense:7", pkv_device_default_params()) == NULL);
    pkv_device_close(NULL);
    CHECK(pkv_device_get_caps(NULL) == NULL);
    CHECK(pkv_device_name(NULL) != NULL);
    CHECK(pkv_device_allocated(NULL) == 0);
    CHECK(!pkv_device_can_access(NULL, NULL));
    CHECK(pkv_buffer_alloc(NULL, 16) == NULL);
    pkv_buffer_free(NULL);
    CHECK(pkv_buffer_size(NULL) == 0);
    CHECK(pkv_buffer_device(NULL) == NULL);
    CHECK(pkv_buffer_write(NULL, 0, f, 4) != PKV_OK);
    CHECK(pkv_buffer_read(NULL, 0, f, 4) != PKV_OK);
    CHECK(pkv_buffer_fill(NULL, 0, 4, 0) != PKV_OK);
    CHECK(pkv_buffer_copy(NULL, 0, NULL, 0, 4) != PKV_OK);
    CHECK(pkv_buffer_copy_regions(NULL, NULL, NULL, 1) != PKV_OK);
    CHECK(pkv_device_flush(NULL) != PKV_OK);
    CHECK(pkv_device_sync(NULL) != PKV_OK);
    CHECK(pkv_check_transfers(NULL, pkv_check_default_params(), NULL, NULL) != PKV_OK);
    CHECK(pkv_check_cross(NULL, NULL, pkv_check_default_params(), NULL, NULL) != PKV_OK);
    CHECK(pkv_check_kernels(NULL, pkv_check_default_params(), NULL, NULL) != PKV_OK);

    pkv_kv_params kp = pkv_kv_default_params();
    CHECK(pkv_kv_cache_create(kp) == NULL); /* no layers, no device */
    kp.n_layers = -3;
    CHECK(pkv_kv_cache_create(kp) == NULL);
    pkv_kv_cache_free(NULL);
    CHECK(pkv_kv_cache_layout(NULL) == NULL);
    CHECK(pkv_kv_layout_n_layers(NULL) == 0);
    CHECK(pkv_kv_layout_page_size(NULL) == 0);
    CHECK(pkv_kv_layout_layer(NULL, 0, &li) != PKV_OK);
    CHECK(pkv_kv_shard(NULL, 0, 0, &si) != PKV_OK);
    pkv_kv_stats_get(NULL, &st);
    pkv_kv_stats_get(NULL, NULL);
    CHECK(pkv_kv_seq_create(NULL, 0, &seq) != PKV_OK);
    CHECK(pkv_kv_seq_free(NULL, 0) != PKV_OK);
    CHECK(pkv_kv_seq_len(NULL, 0) < 0);
    CHECK(!pkv_kv_seq_swapped(NULL, 0));
    CHECK(pkv_kv_seq_tokens(NULL, 0, 0, 1, &tok, NULL) != PKV_OK);
    CHECK(pkv_kv_append(NULL, 0, 1, &tok, NULL, NULL) != PKV_OK);
    CHECK(pkv_kv_append_batch(NULL, 1, &seq, &tok, &tok, NULL, NULL) != PKV_OK);
    CHECK(pkv_kv_block_table_get(NULL, 1, &seq, false, NULL) != PKV_OK);
    CHECK(pkv_kv_fork(NULL, 0, &child) != PKV_OK);
    CHECK(pkv_kv_truncate(NULL, 0, 0) != PKV_OK);
    CHECK(pkv_kv_shift(NULL, 0, 0, 1, -1) != PKV_OK);
    CHECK(pkv_kv_seq_clear(NULL, 0) != PKV_OK);
    CHECK(pkv_kv_clear(NULL) != PKV_OK);
    CHECK(pkv_kv_swap_out(NULL, 0) != PKV_OK);
    CHECK(pkv_kv_swap_in(NULL, 0) != PKV_OK);
    CHECK(pkv_kv_prefix_match(NULL, 0, &tok, NULL, 1, &n64) != PKV_OK);
    CHECK(pkv_kv_seq_save(NULL, 0, "x") != PKV_OK);
    CHECK(pkv_kv_seq_load(NULL, "x", 0, &seq) != PKV_OK);
    CHECK(pkv_kv_attach(NULL, "x", 16, NULL, 1) != PKV_OK);

    CHECK(pkv_model_load(NULL, pkv_model_default_params()) == NULL);
    CHECK(pkv_model_load_memory(NULL, 0, NULL, pkv_model_default_params()) == NULL);
    pkv_model_free(NULL);
    pkv_lora_info lo;
    CHECK(pkv_lora_load(NULL, "x.gguf") == NULL);
    CHECK(pkv_lora_load_memory(NULL, buf, sizeof buf, NULL) == NULL);
    pkv_lora_free(NULL);
    CHECK(pkv_lora_get_info(NULL, &lo) != PKV_OK);
    CHECK(pkv_model_lora_apply(NULL, NULL, 0) != PKV_OK);
    CHECK(pkv_model_lora_get(NULL, NULL, 0) == 0);
    CHECK(pkv_model_get_info(NULL, &mi) != PKV_OK);
    CHECK(pkv_model_device(NULL) == NULL);
    CHECK(pkv_model_tokenize(NULL, "a", 1, true, false, &tok, 1, &n) != PKV_OK);
    CHECK(pkv_model_detokenize(NULL, &tok, 1, false, buf, sizeof buf, &n) != PKV_OK);
    CHECK(pkv_model_token_piece(NULL, 0, false, buf, sizeof buf, &n) != PKV_OK);
    CHECK(pkv_model_bos(NULL) == -1);
    CHECK(pkv_model_eos(NULL) == -1);
    CHECK(!pkv_model_is_eog(NULL, 0));
    CHECK(pkv_mkmodel_write(NULL, "x") != PKV_OK);
    CHECK(pkv_mkmodel_memory(NULL, NULL, NULL) != PKV_OK);
    pkv_mkmodel_free_memory(NULL);
    CHECK(pkv_model_cache_create(NULL, pkv_cache_default_params()) == NULL);

    CHECK(pkv_context_create(NULL, NULL, 0) == NULL);
    pkv_context_free(NULL);
    CHECK(pkv_context_fork(NULL) == NULL);
    CHECK(pkv_context_attach(NULL, NULL) == NULL);
    CHECK(pkv_context_seq(NULL) == -1);
    CHECK(pkv_context_model(NULL) == NULL);
    CHECK(pkv_context_cache(NULL) == NULL);
    CHECK(pkv_context_n_tokens(NULL) < 0);
    CHECK(pkv_context_n_ctx(NULL) == 0);
    CHECK(pkv_context_logits(NULL) == NULL);
    const int32_t *tp = &tok;
    int32_t one = 1;
    pkv_context *nullctx = NULL;
    CHECK(pkv_decode(NULL, 1, &tp, &one) != PKV_OK);
    CHECK(pkv_decode(&nullctx, 1, &tp, &one) != PKV_OK);
    CHECK(pkv_context_decode(NULL, &tok, 1) != PKV_OK); /* was a segfault */
    CHECK(pkv_context_decode_all(NULL, &tok, 1, f) != PKV_OK);
    CHECK(pkv_context_truncate(NULL, 0) != PKV_OK);
    CHECK(pkv_context_shift(NULL, 0, 1) != PKV_OK);
    CHECK(pkv_context_swap_out(NULL) != PKV_OK);
    CHECK(pkv_context_swap_in(NULL) != PKV_OK);
    CHECK(pkv_context_save(NULL, "x") != PKV_OK);
    CHECK(pkv_context_load(NULL, NULL, "x", 0) == NULL);
    CHECK(pkv_context_tokens(NULL, 0, 1, &tok) != PKV_OK);

    CHECK(pkv_sampler_create(pkv_sampler_default_params(), 0) == NULL);
    CHECK(pkv_sampler_create(pkv_sampler_default_params(), -5) == NULL);
    pkv_sampler_free(NULL);
    CHECK(pkv_sampler_n_vocab(NULL) == 0);
    CHECK(pkv_sampler_sample(NULL, f, &tok) != PKV_OK);
    pkv_sampler_accept(NULL, 1);
    pkv_sampler_reset(NULL);
    CHECK(pkv_sampler_probs(NULL, f, f) != PKV_OK);
    CHECK(pkv_generate(NULL, NULL, 1, NULL, NULL, NULL) != PKV_OK);
    CHECK(pkv_spec_create(NULL, NULL, pkv_spec_default_params()) == NULL);
    pkv_spec_free(NULL);
    CHECK(pkv_spec_generate(NULL, NULL, 1, NULL, NULL, NULL) != PKV_OK);
}

/* Valid handles, bad other arguments: errors, and the objects still work. */
static void bad_args(void) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = -4;
    CHECK(pkv_model_builtin(mp) == NULL);
    CHECK_MSG("thread");
    mp.n_threads = 1;
    pkv_model *m = pkv_model_builtin(mp);
    REQUIRE_VOID(m);
    pkv_model_info info;
    CHECK_OK(pkv_model_get_info(m, &info));

    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = -1;
    CHECK(pkv_model_cache_create(m, cp) == NULL);
    cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    REQUIRE_VOID(c);
    CHECK(pkv_context_create(m, c, -8) == NULL);
    CHECK_MSG("negative");
    CHECK(pkv_context_create(m, NULL, 0) == NULL);
    pkv_context *ctx = pkv_context_create(m, c, 0);
    REQUIRE_VOID(ctx);

    int32_t toks[3] = {1, 2, 3};
    CHECK(pkv_context_decode(ctx, NULL, 3) != PKV_OK);
    CHECK(pkv_context_decode(ctx, toks, 0) != PKV_OK);
    CHECK(pkv_context_decode(ctx, toks, -2) != PKV_OK);
    int32_t badtok = info.n_vocab + 7;
    CHECK(pkv_context_decode(ctx, &badtok, 1) != PKV_OK);
    badtok = -1;
    CHECK(pkv_context_decode(ctx, &badtok, 1) != PKV_OK);
    CHECK(pkv_context_decode_all(ctx, toks, 3, NULL) != PKV_OK);
    CHECK_INT(pkv_context_n_tokens(ctx), 0);
    CHECK(pkv_decode(&ctx, 0, NULL, NULL) != PKV_OK);
    CHECK(pkv_decode(&ctx, -1, NULL, NULL) != PKV_OK);
    CHECK_OK(pkv_context_decode(ctx, toks, 3));
    CHECK(pkv_context_truncate(ctx, -1) != PKV_OK);
    CHECK(pkv_context_truncate(ctx, 99) != PKV_OK);
    CHECK(pkv_context_shift(ctx, -1, 1) != PKV_OK);
    CHECK(pkv_context_shift(ctx, 0, -1) != PKV_OK);
    CHECK(pkv_context_tokens(ctx, -1, 1, toks) != PKV_OK);
    CHECK(pkv_context_tokens(ctx, 0, 4, toks) != PKV_OK);
    CHECK(pkv_context_tokens(ctx, 0, 1, NULL) != PKV_OK);
    CHECK(pkv_context_save(ctx, NULL) != PKV_OK);
    CHECK(pkv_model_tokenize(m, NULL, 3, true, false, toks, 3, NULL) != PKV_OK);
    CHECK_INT(pkv_context_n_tokens(ctx), 3);

    /* a sampler for another vocabulary: refused before any logits are read (it used
     * to read past the logits row, or sample from a prefix of it) */
    pkv_sampler_params sp = pkv_sampler_default_params();
    int nt = 0;
    for (int delta = -1; delta <= 1; delta += 2) {
        pkv_sampler *bad = pkv_sampler_create(sp, info.n_vocab + delta * 100);
        REQUIRE_VOID(bad);
        CHECK_STATUS(pkv_generate(ctx, bad, 4, count_tok, &nt, NULL), PKV_ERR_MISMATCH);
        CHECK_MSG("vocabulary");
        CHECK_INT(nt, 0);
        pkv_sampler_free(bad);
    }
    pkv_sampler *smp = pkv_sampler_create(sp, info.n_vocab);
    REQUIRE_VOID(smp);
    CHECK(pkv_generate(ctx, smp, -1, NULL, NULL, NULL) != PKV_OK);
    CHECK_OK(pkv_generate(ctx, smp, 2, count_tok, &nt, NULL));
    CHECK(nt >= 1);

    /* a cache made for another model: refused when the context is made */
    pkv_mkmodel_params kp = pkv_mkmodel_default_params();
    kp.n_layer = 3;
    kp.n_head_kv = 1;
    void *data = NULL;
    size_t size = 0;
    CHECK_OK(pkv_mkmodel_memory(&kp, &data, &size));
    pkv_model *other = data ? pkv_model_load_memory(data, size, "other", mp) : NULL;
    REQUIRE_VOID(other);
    CHECK(pkv_context_create(other, c, 0) == NULL);
    CHECK_MSG("layers");
    pkv_kv_cache *oc = pkv_model_cache_create(other, cp);
    REQUIRE_VOID(oc);
    CHECK(pkv_context_create(m, oc, 0) == NULL);
    pkv_kv_cache_free(oc);
    kp.n_layer = 2;
    kp.n_head_kv = 1;
    pkv_mkmodel_free_memory(data);
    CHECK_OK(pkv_mkmodel_memory(&kp, &data, &size));
    pkv_model *heads = data ? pkv_model_load_memory(data, size, "heads", mp) : NULL;
    REQUIRE_VOID(heads);
    pkv_model_info hi;
    CHECK_OK(pkv_model_get_info(heads, &hi));
    if (hi.n_layer == info.n_layer) {
        CHECK(pkv_context_create(heads, c, 0) == NULL);
        CHECK_MSG("KV heads");
    }
    pkv_model_free(heads);
    pkv_model_free(other);
    pkv_mkmodel_free_memory(data);

    /* everything still works after all that */
    pkv_context *k = pkv_context_fork(ctx);
    REQUIRE_VOID(k);
    CHECK_INT(pkv_context_n_tokens(k), pkv_context_n_tokens(ctx));
    pkv_context_free(k);
    pkv_sampler_free(smp);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

int main(void) {
    null_handles();
    bad_args();
    return th_done();
}
