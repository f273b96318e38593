/* Fuzz harness: GGUF images from memory.
 *
 * Input: a GGUF image (the seeds are `mkmodel` models of every architecture and
 * weight type, and a file with one tensor of every type and keys of every value
 * type; fuzz/gguf.dict holds the keys and tensor names).
 *
 * 1. The reader (pkv_gguf_read_memory): after a successful open every accessor
 *    is called on every key, array element (the first 4096 of each array) and
 *    tensor, and every tensor's bytes are read: the reader promises that nothing
 *    reachable after open lies outside the image. Checked besides: each tensor's
 *    byte size is its type's row size times the rows, its data lies inside the
 *    image, find_key / find_tensor find what the index gives.
 * 2. The model loader (pkv_model_load_memory, CPU device, one thread): on success
 *    the model must tokenize and detokenize a text, and decode two tokens in a
 *    small cache; on failure nothing may stay allocated. */
#include "fuzz-common.h"

#include "model/gguf.h"

#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pkv_log_set(NULL, NULL, PKV_LOG_NONE); /* bad input is expected: no log lines */
    return 0;
}

static volatile uint64_t g_sink;

static void walk_array(const pkv_gguf *g, const pkv_gguf_array *a, int64_t kv) {
    FUZZ_CHECK(a->kv == kv && a->type != PKV_GGUF_ARRAY && a->type < PKV_GGUF_TYPE_COUNT);
    uint64_t n = a->count < 4096 ? a->count : 4096;
    for (uint64_t i = 0; i < n; i++) {
        if (a->type == PKV_GGUF_STRING) {
            const char *s = NULL;
            size_t len = 0;
            FUZZ_CHECK(pkv_gguf_arr_str(g, a, i, &s, &len) == PKV_OK);
            g_sink += len ? (uint8_t)s[0] + (uint8_t)s[len - 1] : 0;
        } else {
            g_sink += (uint64_t)pkv_gguf_arr_int(a, i);
            double d = pkv_gguf_arr_float(a, i);
            g_sink += d == d;
        }
    }
    if (a->type == PKV_GGUF_STRING) {
        const char *s = "unchanged";
        size_t len = 9;
        FUZZ_CHECK(pkv_gguf_arr_str(g, a, a->count, &s, &len) == PKV_ERR_INVALID);
        FUZZ_CHECK(len == 9 && strcmp(s, "unchanged") == 0);
    }
}

static void walk_reader(const pkv_gguf *g, const uint8_t *data, size_t size) {
    FUZZ_CHECK(pkv_gguf_file_size(g) == size);
    size_t align = pkv_gguf_alignment(g);
    FUZZ_CHECK(align && (align & (align - 1)) == 0);
    FUZZ_CHECK(pkv_gguf_data_offset(g) <= size);
    int64_t nkv = pkv_gguf_n_kv(g);
    for (int64_t i = 0; i < nkv; i++) {
        const char *key = pkv_gguf_kv_key(g, i);
        FUZZ_CHECK(key != NULL);
        FUZZ_CHECK(pkv_gguf_find_key(g, key) == i);
        pkv_gguf_type t = pkv_gguf_kv_type(g, i);
        FUZZ_CHECK(t < PKV_GGUF_TYPE_COUNT);
        uint32_t u32;
        int64_t i64;
        float f32;
        bool b;
        const char *s;
        size_t len;
        pkv_gguf_array a;
        if (!pkv_gguf_get_u32(g, key, &u32)) g_sink += u32;
        if (!pkv_gguf_get_i64(g, key, &i64)) g_sink += (uint64_t)i64;
        if (!pkv_gguf_get_f32(g, key, &f32)) g_sink += f32 == f32;
        if (!pkv_gguf_get_bool(g, key, &b)) g_sink += b;
        if (!pkv_gguf_get_str(g, key, &s, &len)) g_sink += len ? (uint8_t)s[len - 1] : 0;
        pkv_status st = pkv_gguf_get_arr(g, key, PKV_GGUF_TYPE_COUNT, &a);
        FUZZ_CHECK((st == PKV_OK) == (t == PKV_GGUF_ARRAY));
        if (!st) walk_array(g, &a, i);
    }
    FUZZ_CHECK(pkv_gguf_kv_key(g, nkv) == NULL && pkv_gguf_kv_type(g, nkv) == PKV_GGUF_TYPE_COUNT);
    int64_t nt = pkv_gguf_n_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        FUZZ_CHECK(t && t->name);
        FUZZ_CHECK(pkv_gguf_find_tensor(g, t->name) == t);
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= PKV_GGUF_MAX_DIMS);
        size_t row = pkv_type_row_bytes(t->type, (size_t)t->ne[0]);
        FUZZ_CHECK(row > 0);
        uint64_t rows = 1;
        for (int d = 1; d < PKV_GGUF_MAX_DIMS; d++) {
            FUZZ_CHECK(t->ne[d] >= 1);
            rows *= (uint64_t)t->ne[d];
        }
        FUZZ_CHECK((uint64_t)row * rows == t->n_bytes);
        FUZZ_CHECK(t->file_offset <= size && t->n_bytes <= size - t->file_offset);
        FUZZ_CHECK((const uint8_t *)t->data == data + t->file_offset);
        g_sink += pkv_hash64(t->data, t->n_bytes, 0);
    }
    FUZZ_CHECK(pkv_gguf_tensor_at(g, nt) == NULL);
}

/* A model that loaded must work: tokenize, detokenize and decode two tokens. */
static void use_model(pkv_model *m) {
    pkv_model_info info;
    FUZZ_CHECK(pkv_model_get_info(m, &info) == PKV_OK);
    FUZZ_CHECK(info.n_vocab > 0 && info.n_layer > 0);
    int32_t ids[64];
    size_t n = 0;
    pkv_status st = pkv_model_tokenize(m, "Hello world 123", 15, true, true, ids, 64, &n);
    if (info.has_vocab) {
        FUZZ_CHECK(st == PKV_OK || st == PKV_ERR_INVALID || st == PKV_ERR_UNSUPPORTED);
        if (!st) {
            for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < info.n_vocab);
            char buf[256];
            size_t m_out = 0;
            st = pkv_model_detokenize(m, ids, n, true, buf, sizeof buf, &m_out);
            FUZZ_CHECK(st == PKV_OK || st == PKV_ERR_INVALID);
        }
    } else {
        FUZZ_CHECK(st == PKV_ERR_UNSUPPORTED);
    }
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 8;
    cp.n_seq_max = 1;
    cp.page_size = 4;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    if (!c) return;
    pkv_context *ctx = pkv_context_create(m, c, 0);
    if (ctx) {
        int32_t toks[2] = {0, info.n_vocab - 1};
        st = pkv_context_decode(ctx, toks, 2);
        if (st == PKV_OK) {
            FUZZ_CHECK(pkv_context_n_tokens(ctx) == 2 && pkv_context_logits(ctx) != NULL);
        } else {
            FUZZ_CHECK(pkv_context_n_tokens(ctx) == 0);
        }
        pkv_context_free(ctx);
    }
    pkv_kv_cache_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t live0 = pkv_alloc_live();
    pkv_gguf *g = NULL;
    if (pkv_gguf_read_memory(data, size, "fuzz-input", &g) == PKV_OK) {
        walk_reader(g, data, size);
        pkv_gguf_close(g);
    } else {
        FUZZ_CHECK(g == NULL);
    }
    FUZZ_CHECK(pkv_alloc_live() == live0);

    pkv_model *m = pkv_model_load_memory(data, size, "fuzz-input", fuzz_model_params());
    if (m) {
        use_model(m);
        pkv_model_free(m);
    } else {
        FUZZ_CHECK(pkv_errmsg()[0] != '\0');
    }
    FUZZ_CHECK(pkv_alloc_live() == live0);
    return 0;
}
