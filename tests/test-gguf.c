// labels: unit model
/* GGUF reader and writer: round trips of every value type and several tensor
 * types compared byte for byte; malformed files (hand-made, and a valid file
 * truncated at every byte) rejected with a specific message, no crash and no
 * leak; allocation failures injected at every allocation of open and write. */
#include "model/gguf.h"
#include "testhelp.h"

#include <unistd.h>

/* ------------------------------------------------------------ byte builder */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_bytes(bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_bytes(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    bb_bytes(b, x, 4);
}
static void bb_u64(bb *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    bb_bytes(b, x, 8);
}
static void bb_str(bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_bytes(b, s, strlen(s));
}
static void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_bytes(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, PKV_GGUF_UINT32);
    bb_u32(b, v);
}
/* A tensor info with n_dims dims. */
static void bb_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) bb_u64(b, ne[i]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
static void bb_pad(bb *b, size_t align) {
    while (b->n % align) bb_u8(b, 0);
}
static void bb_zeros(bb *b, size_t n) {
    while (n--) bb_u8(b, 0);
}

/* ------------------------------------------------------------ helpers */

/* Open n bytes (copied into an exact-size heap block, so ASan catches any
 * read past the end) and expect rejection with status want and a message
 * containing sub and the label; nothing may stay allocated. */
static void expect_reject(const char *what, const void *data, size_t n, pkv_status want,
                          const char *sub) {
    int64_t live = pkv_alloc_live();
    void *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, data, n);
    pkv_gguf *g = (pkv_gguf *)&live; /* sentinel: must stay unchanged */
    pkv_err_clear();
    pkv_status s = pkv_gguf_read_memory(copy, n, "bad.gguf", &g);
    th_checks += 4;
    if (s != want)
        TH_FAIL("%s: status %s, want %s (%s)", what, pkv_status_str(s), pkv_status_str(want),
                pkv_errmsg());
    if (g != (pkv_gguf *)&live) {
        TH_FAIL("%s: *out changed on failure", what);
        if (s == PKV_OK) pkv_gguf_close(g);
    }
    if (!strstr(pkv_errmsg(), sub) || !strstr(pkv_errmsg(), "bad.gguf"))
        TH_FAIL("%s: errmsg \"%s\" lacks \"%s\" or the label", what, pkv_errmsg(), sub);
    if (pkv_alloc_live() != live)
        TH_FAIL("%s: %lld allocations leaked", what, (long long)(pkv_alloc_live() - live));
    free(copy);
}

static void fill_rand(void *p, size_t n, uint64_t *seed) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)th_rand(seed);
}

/* ------------------------------------------------------------ the model file */

typedef struct tdef {
    const char *name;
    pkv_type type;
    uint32_t n_dims;
    int64_t ne[4];
} tdef;

static const tdef k_tensors[] = {
    {"token_embd.weight", PKV_TYPE_F32, 2, {8, 5, 1, 1}},
    {"blk.0.attn_q.weight", PKV_TYPE_F16, 2, {16, 3, 1, 1}},
    {"blk.0.ffn_up.weight", PKV_TYPE_Q8_0, 2, {64, 2, 1, 1}},
    {"blk.0.attn_k.weight", PKV_TYPE_Q4_K, 3, {256, 1, 2, 1}},
    {"blk.0.ffn_down.weight", PKV_TYPE_Q6_K, 1, {256, 1, 1, 1}},
    {"ids", PKV_TYPE_I32, 1, {7, 1, 1, 1}},
    {"bf", PKV_TYPE_BF16, 4, {3, 2, 2, 2}},
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])

static size_t tdef_bytes(const tdef *t) {
    return pkv_type_row_bytes(t->type, (size_t)t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

static const uint8_t a_u8[] = {1, 2, 255};
static const int8_t a_i8[] = {-128, 0, 127, -1};
static const uint16_t a_u16[] = {0, 65535};
static const int16_t a_i16[] = {-32768, 5};
static const uint32_t a_u32[] = {7, 0xffffffffu, 3};
static const int32_t a_i32[] = {-7, 2147483647};
static const float a_f32[] = {1.5f, -0.25f, 3e38f};
static const uint8_t a_bool[] = {1, 0, 1};
static const uint64_t a_u64[] = {0xffffffffffffffffull};
static const int64_t a_i64[] = {INT64_MIN, 42};
static const double a_f64[] = {3.141592653589793, -1e300};
static const char *const a_str[] = {"<unk>", "", "h\xc3\xa9llo", "nul\0inside", "end"};
static const size_t a_str_len[] = {5, 0, 6, 10, 3};

/* Builds the writer with every KV type and the tensors (contents from seed). */
static pkv_status build(pkv_gguf_writer **out, uint8_t **tdata, uint32_t version, uint32_t align) {
    pkv_status s;
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    if (!w) return PKV_ERR_NOMEM;
#define TRY(e)                                                                        \
    do {                                                                              \
        if ((s = (e)) != PKV_OK) goto fail;                                           \
    } while (0)
    TRY(pkv_gguf_writer_set_version(w, version));
    TRY(pkv_gguf_writer_add_str(w, "general.architecture", "llama"));
    TRY(pkv_gguf_writer_add_u32(w, "x.replaced", 1));
    if (align) TRY(pkv_gguf_writer_set_alignment(w, align));
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    double f64 = -2.5e-300;
    int64_t i64 = -5000000000ll;
    TRY(pkv_gguf_writer_add(w, "v.u8", PKV_GGUF_UINT8, &u8));
    TRY(pkv_gguf_writer_add(w, "v.i8", PKV_GGUF_INT8, &i8));
    TRY(pkv_gguf_writer_add(w, "v.u16", PKV_GGUF_UINT16, &u16));
    TRY(pkv_gguf_writer_add(w, "v.i16", PKV_GGUF_INT16, &i16));
    TRY(pkv_gguf_writer_add_u32(w, "llama.block_count", 4000000000u));
    TRY(pkv_gguf_writer_add_i32(w, "v.i32", -123456));
    TRY(pkv_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.5f));
    TRY(pkv_gguf_writer_add_bool(w, "v.true", true));
    TRY(pkv_gguf_writer_add_bool(w, "v.false", false));
    TRY(pkv_gguf_writer_add_u64(w, "v.u64", 0xfedcba9876543210ull));
    TRY(pkv_gguf_writer_add(w, "v.i64", PKV_GGUF_INT64, &i64));
    TRY(pkv_gguf_writer_add(w, "v.f64", PKV_GGUF_FLOAT64, &f64));
    TRY(pkv_gguf_writer_add_u64(w, "v.u64small", 5));
    TRY(pkv_gguf_writer_add_arr(w, "a.u8", PKV_GGUF_UINT8, a_u8, 3));
    TRY(pkv_gguf_writer_add_arr(w, "a.i8", PKV_GGUF_INT8, a_i8, 4));
    TRY(pkv_gguf_writer_add_arr(w, "a.u16", PKV_GGUF_UINT16, a_u16, 2));
    TRY(pkv_gguf_writer_add_arr(w, "a.i16", PKV_GGUF_INT16, a_i16, 2));
    TRY(pkv_gguf_writer_add_arr(w, "a.u32", PKV_GGUF_UINT32, a_u32, 3));
    TRY(pkv_gguf_writer_add_arr(w, "a.i32", PKV_GGUF_INT32, a_i32, 2));
    TRY(pkv_gguf_writer_add_arr(w, "tokenizer.ggml.scores", PKV_GGUF_FLOAT32, a_f32, 3));
    TRY(pkv_gguf_writer_add_arr(w, "a.bool", PKV_GGUF_BOOL, a_bool, 3));
    TRY(pkv_gguf_writer_add_arr(w, "a.u64", PKV_GGUF_UINT64, a_u64, 1));
    TRY(pkv_gguf_writer_add_arr(w, "a.i64", PKV_GGUF_INT64, a_i64, 2));
    TRY(pkv_gguf_writer_add_arr(w, "a.f64", PKV_GGUF_FLOAT64, a_f64, 2));
    TRY(pkv_gguf_writer_add_arr(w, "a.empty", PKV_GGUF_UINT32, NULL, 0));
    TRY(pkv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", a_str, a_str_len, 5));
    TRY(pkv_gguf_writer_add_arr_str(w, "a.strs0", NULL, NULL, 0));
    TRY(pkv_gguf_writer_add_str(w, "x.replaced", "two")); /* replaces the u32 in place */
    for (size_t i = 0; i < N_TENSORS; i++)
        TRY(pkv_gguf_writer_add_tensor(w, k_tensors[i].name, k_tensors[i].type, k_tensors[i].n_dims,
                                       k_tensors[i].ne, tdata[i], tdef_bytes(&k_tensors[i])));
#undef TRY
    *out = w;
    return PKV_OK;
fail:
    pkv_gguf_writer_free(w);
    return s;
}

static void check_contents(pkv_gguf *g, uint8_t **tdata, uint32_t version, size_t align) {
    CHECK_INT(pkv_gguf_version(g), version);
    CHECK_INT(pkv_gguf_alignment(g), align);
    CHECK_INT(pkv_gguf_n_kv(g), align != 32 ? 30 : 29);
    CHECK(strcmp(pkv_gguf_kv_key(g, 0), "general.architecture") == 0);
    CHECK(strcmp(pkv_gguf_kv_key(g, 1), "x.replaced") == 0);
    CHECK_INT(pkv_gguf_kv_type(g, 1), PKV_GGUF_STRING);
    CHECK(pkv_gguf_kv_key(g, 99) == NULL);
    CHECK_INT(pkv_gguf_kv_type(g, -1), PKV_GGUF_TYPE_COUNT);
    CHECK_INT(pkv_gguf_find_key(g, "v.u16"), align != 32 ? 5 : 4);
    CHECK_INT(pkv_gguf_find_key(g, "nope"), -1);

    const char *s;
    size_t len;
    CHECK_OK(pkv_gguf_get_str(g, "general.architecture", &s, &len));
    CHECK(len == 5 && memcmp(s, "llama", 5) == 0);
    CHECK_OK(pkv_gguf_get_str(g, "x.replaced", &s, &len));
    CHECK(len == 3 && memcmp(s, "two", 3) == 0);
    uint32_t u32 = 0;
    int64_t i64 = 0;
    float f = 0;
    bool b = false;
    CHECK_OK(pkv_gguf_get_u32(g, "v.u8", &u32));
    CHECK_INT(u32, 200);
    CHECK_OK(pkv_gguf_get_u32(g, "v.u16", &u32));
    CHECK_INT(u32, 60000);
    CHECK_OK(pkv_gguf_get_u32(g, "llama.block_count", &u32));
    CHECK_INT(u32, 4000000000u);
    CHECK_OK(pkv_gguf_get_u32(g, "v.u64small", &u32));
    CHECK_INT(u32, 5);
    CHECK_OK(pkv_gguf_get_i64(g, "v.i8", &i64));
    CHECK_INT(i64, -100);
    CHECK_OK(pkv_gguf_get_i64(g, "v.i16", &i64));
    CHECK_INT(i64, -30000);
    CHECK_OK(pkv_gguf_get_i64(g, "v.i32", &i64));
    CHECK_INT(i64, -123456);
    CHECK_OK(pkv_gguf_get_i64(g, "v.i64", &i64));
    CHECK_INT(i64, -5000000000ll);
    CHECK_OK(pkv_gguf_get_f32(g, "llama.rope.freq_base", &f));
    CHECK(f == 10000.5f);
    CHECK_OK(pkv_gguf_get_f32(g, "v.f64", &f));
    CHECK(f == (float)-2.5e-300);
    CHECK_OK(pkv_gguf_get_bool(g, "v.true", &b));
    CHECK(b == true);
    CHECK_OK(pkv_gguf_get_bool(g, "v.false", &b));
    CHECK(b == false);
    /* the raw u64 and f64 values, bit-exact */
    pkv_gguf_array arr;
    int64_t ki = pkv_gguf_find_key(g, "v.u64");
    CHECK_INT(pkv_gguf_kv_type(g, ki), PKV_GGUF_UINT64);
    CHECK_STATUS(pkv_gguf_get_i64(g, "v.u64", &i64), PKV_ERR_FORMAT);
    CHECK_MSG("does not fit in int64");

    /* every numeric array, element by element */
#define ARR(key, T, src, n, conv)                                                     \
    do {                                                                              \
        CHECK_OK(pkv_gguf_get_arr(g, key, T, &arr));                                  \
        CHECK_INT(arr.type, T);                                                       \
        CHECK_INT(arr.count, n);                                                      \
        CHECK_MEM(arr.data, src, sizeof src);                                         \
        for (size_t _i = 0; _i < (n); _i++) CHECK(conv(&arr, _i) == src[_i]);         \
    } while (0)
    ARR("a.u8", PKV_GGUF_UINT8, a_u8, 3, pkv_gguf_arr_int);
    ARR("a.i8", PKV_GGUF_INT8, a_i8, 4, pkv_gguf_arr_int);
    ARR("a.u16", PKV_GGUF_UINT16, a_u16, 2, pkv_gguf_arr_int);
    ARR("a.i16", PKV_GGUF_INT16, a_i16, 2, pkv_gguf_arr_int);
    ARR("a.u32", PKV_GGUF_UINT32, a_u32, 3, pkv_gguf_arr_int);
    ARR("a.i32", PKV_GGUF_INT32, a_i32, 2, pkv_gguf_arr_int);
    ARR("tokenizer.ggml.scores", PKV_GGUF_FLOAT32, a_f32, 3, pkv_gguf_arr_float);
    ARR("a.bool", PKV_GGUF_BOOL, a_bool, 3, pkv_gguf_arr_int);
    ARR("a.i64", PKV_GGUF_INT64, a_i64, 2, pkv_gguf_arr_int);
    ARR("a.f64", PKV_GGUF_FLOAT64, a_f64, 2, pkv_gguf_arr_float);
#undef ARR
    CHECK_OK(pkv_gguf_get_arr(g, "a.u64", PKV_GGUF_TYPE_COUNT, &arr));
    CHECK_MEM(arr.data, a_u64, 8);
    CHECK_INT(pkv_gguf_arr_int(&arr, 0), INT64_MAX); /* saturates */
    CHECK(pkv_gguf_arr_float(&arr, 0) == 18446744073709551615.0);
    CHECK_INT(pkv_gguf_arr_int(&arr, 1), 0);         /* out of range */
    CHECK_OK(pkv_gguf_get_arr(g, "a.empty", PKV_GGUF_UINT32, &arr));
    CHECK_INT(arr.count, 0);
    CHECK_OK(pkv_gguf_get_arr(g, "tokenizer.ggml.tokens", PKV_GGUF_STRING, &arr));
    CHECK_INT(arr.count, 5);
    for (uint64_t i = 0; i < 5; i++) {
        CHECK_OK(pkv_gguf_arr_str(g, &arr, i, &s, &len));
        CHECK_INT(len, a_str_len[i]);
        CHECK_MEM(s, a_str[i], a_str_len[i]);
    }
    CHECK_STATUS(pkv_gguf_arr_str(g, &arr, 5, &s, &len), PKV_ERR_INVALID);
    CHECK_MSG("index 5 out of range");
    CHECK_OK(pkv_gguf_get_arr(g, "a.strs0", PKV_GGUF_STRING, &arr));
    CHECK_INT(arr.count, 0);
    CHECK_STATUS(pkv_gguf_arr_str(g, &arr, 0, &s, &len), PKV_ERR_INVALID);

    /* tensors: metadata and contents byte for byte */
    CHECK_INT(pkv_gguf_n_tensors(g), N_TENSORS);
    for (size_t i = 0; i < N_TENSORS; i++) {
        const tdef *d = &k_tensors[i];
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, (int64_t)i);
        REQUIRE_VOID(t != NULL);
        CHECK(pkv_gguf_find_tensor(g, d->name) == t);
        CHECK(strcmp(t->name, d->name) == 0);
        CHECK_INT(t->type, d->type);
        CHECK_INT(t->n_dims, d->n_dims);
        for (int k = 0; k < 4; k++) CHECK_INT(t->ne[k], d->ne[k]);
        CHECK_INT(t->n_elements, d->ne[0] * d->ne[1] * d->ne[2] * d->ne[3]);
        CHECK_INT(t->n_bytes, tdef_bytes(d));
        CHECK_INT(t->file_offset % align, 0);
        CHECK(t->file_offset >= pkv_gguf_data_offset(g));
        CHECK_MEM(t->data, tdata[i], t->n_bytes);
    }
    CHECK(pkv_gguf_tensor_at(g, (int64_t)N_TENSORS) == NULL);
    CHECK(pkv_gguf_find_tensor(g, "missing") == NULL);
    const pkv_gguf_tensor *t = NULL;
    CHECK_STATUS(pkv_gguf_get_tensor(g, "missing.weight", &t), PKV_ERR_NOT_FOUND);
    CHECK_MSG("tensor 'missing.weight' not found");
    CHECK(t == NULL);
    CHECK_INT(pkv_gguf_data_offset(g) % align, 0);
}

static void check_getter_errors(pkv_gguf *g) {
    uint32_t u32 = 77;
    float f = 7;
    bool b = true;
    const char *s = NULL;
    size_t len = 9;
    pkv_gguf_array arr = {0};
    int64_t live = pkv_alloc_live();
    CHECK_STATUS(pkv_gguf_get_u32(g, "general.architecture", &u32), PKV_ERR_FORMAT);
    CHECK_MSG("key 'general.architecture' has type string");
    CHECK_MSG("uint32");
    CHECK_INT(u32, 77);
    CHECK_STATUS(pkv_gguf_get_u32(g, "llama.context_length", &u32), PKV_ERR_NOT_FOUND);
    CHECK_MSG("key 'llama.context_length' not found");
    CHECK_STATUS(pkv_gguf_get_u32(g, "v.i32", &u32), PKV_ERR_FORMAT);
    CHECK_MSG("key 'v.i32' is -123456 (int32), which does not fit in uint32");
    CHECK_STATUS(pkv_gguf_get_u32(g, "v.u64", &u32), PKV_ERR_FORMAT);
    CHECK_MSG("does not fit in uint32");
    CHECK_INT(u32, 77);
    CHECK_STATUS(pkv_gguf_get_u32(g, "llama.rope.freq_base", &u32), PKV_ERR_FORMAT);
    CHECK_MSG("has type float32");
    CHECK_STATUS(pkv_gguf_get_f32(g, "llama.block_count", &f), PKV_ERR_FORMAT);
    CHECK_MSG("key 'llama.block_count' has type uint32, expected float32");
    CHECK(f == 7);
    CHECK_STATUS(pkv_gguf_get_bool(g, "v.u8", &b), PKV_ERR_FORMAT);
    CHECK_MSG("has type uint8, expected bool");
    CHECK(b == true);
    CHECK_STATUS(pkv_gguf_get_str(g, "a.u8", &s, &len), PKV_ERR_FORMAT);
    CHECK_MSG("key 'a.u8' has type array, expected string");
    CHECK(s == NULL && len == 9);
    CHECK_STATUS(pkv_gguf_get_arr(g, "tokenizer.ggml.scores", PKV_GGUF_INT32, &arr), PKV_ERR_FORMAT);
    CHECK_MSG("is an array of float32, expected an array of int32");
    CHECK_STATUS(pkv_gguf_get_arr(g, "v.u8", PKV_GGUF_TYPE_COUNT, &arr), PKV_ERR_FORMAT);
    CHECK_MSG("expected array");
    CHECK_OK(pkv_gguf_get_arr(g, "a.u8", PKV_GGUF_TYPE_COUNT, &arr));
    CHECK_STATUS(pkv_gguf_arr_str(g, &arr, 0, &s, &len), PKV_ERR_INVALID);
    CHECK_MSG("key 'a.u8' is not an array of strings");
    CHECK_OK(pkv_gguf_get_arr(g, "tokenizer.ggml.tokens", PKV_GGUF_TYPE_COUNT, &arr));
    CHECK_INT(pkv_gguf_arr_int(&arr, 0), 0); /* strings are not numbers */
    CHECK_INT(pkv_alloc_live(), live);
}

static uint8_t *g_tdata[N_TENSORS];

static void make_tdata(void) {
    uint64_t seed = 1234;
    for (size_t i = 0; i < N_TENSORS; i++) {
        size_t n = tdef_bytes(&k_tensors[i]);
        g_tdata[i] = malloc(n);
        fill_rand(g_tdata[i], n, &seed);
    }
}

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*n ? *n : 1);
    if (fread(p, 1, *n, f) != *n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    return p;
}

/* Writer -> file -> reader (mmap and read paths) and writer -> memory -> reader. */
static void test_round_trip(uint32_t version, uint32_t align) {
    int64_t live = pkv_alloc_live();
    pkv_gguf_writer *w = NULL;
    CHECK_OK(build(&w, g_tdata, version, align));
    REQUIRE_VOID(w != NULL);
    size_t want_align = align ? align : 32;
    const char *path = th_tmp("test-gguf-rt.gguf");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK_OK(pkv_gguf_writer_write(w, path));
    CHECK(access(tmp, F_OK) != 0); /* the temporary file was renamed away */
    void *mem = NULL;
    size_t mem_n = 0;
    CHECK_OK(pkv_gguf_writer_write_memory(w, &mem, &mem_n));
    size_t file_n = 0;
    uint8_t *file = read_file(path, &file_n);
    REQUIRE_VOID(file != NULL && mem != NULL);
    CHECK_INT(file_n, mem_n);
    CHECK(file_n == mem_n && memcmp(file, mem, mem_n) == 0);
    CHECK_MEM(file, "GGUF", 4);
    CHECK_INT(file[4], version);
    CHECK_INT(file_n % want_align, 0); /* the last tensor is padded too */

    for (int mode = 0; mode < 3; mode++) {
        pkv_gguf *g = NULL;
        if (mode == 0) {
            CHECK_OK(pkv_gguf_read(path, &g));
        } else if (mode == 1) {
            setenv("PKV_GGUF_NO_MMAP", "1", 1);
            g = pkv_gguf_open(path);
            unsetenv("PKV_GGUF_NO_MMAP");
        } else {
            g = pkv_gguf_open_memory(mem, mem_n, "mem.gguf");
        }
        REQUIRE_VOID(g != NULL);
        CHECK(strcmp(pkv_gguf_label(g), mode == 2 ? "mem.gguf" : path) == 0);
        CHECK_INT(pkv_gguf_file_size(g), file_n);
        check_contents(g, g_tdata, version, want_align);
        if (align) {
            uint32_t a = 0;
            CHECK_OK(pkv_gguf_get_u32(g, "general.alignment", &a));
            CHECK_INT(a, align);
        } else {
            CHECK_INT(pkv_gguf_find_key(g, "general.alignment"), -1);
        }
        if (mode == 0) check_getter_errors(g);
        pkv_gguf_close(g);
    }
    pkv_gguf_close(NULL);
    pkv_free(mem);
    free(file);
    pkv_gguf_writer_free(w);
    pkv_gguf_writer_free(NULL);
    unlink(path);
    CHECK_INT(pkv_alloc_live(), live);
}

/* A small valid file cut at every byte: each prefix is rejected, except the
 * ones that still hold all tensor data (only trailing padding is missing). */
static void test_truncation(void) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    REQUIRE_VOID(w != NULL);
    const char *toks[] = {"a", "bc", ""};
    float sc[] = {0.5f, -1, 2};
    float t0[6] = {1, 2, 3, 4, 5, 6};
    uint16_t t1[4] = {1, 2, 3, 4};
    CHECK_OK(pkv_gguf_writer_add_str(w, "general.architecture", "llama"));
    CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.block_count", 2));
    CHECK_OK(pkv_gguf_writer_add_bool(w, "b", true));
    CHECK_OK(pkv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3));
    CHECK_OK(pkv_gguf_writer_add_arr(w, "tokenizer.ggml.scores", PKV_GGUF_FLOAT32, sc, 3));
    CHECK_OK(pkv_gguf_writer_add_tensor(w, "t0", PKV_TYPE_F32, 2, (int64_t[]){3, 2}, t0, sizeof t0));
    CHECK_OK(pkv_gguf_writer_add_tensor(w, "t1", PKV_TYPE_F16, 1, (int64_t[]){4}, t1, sizeof t1));
    void *mem = NULL;
    size_t n = 0;
    CHECK_OK(pkv_gguf_writer_write_memory(w, &mem, &n));
    pkv_gguf_writer_free(w);
    REQUIRE_VOID(mem != NULL);
    pkv_gguf *g = pkv_gguf_open_memory(mem, n, "full.gguf");
    REQUIRE_VOID(g != NULL);
    const pkv_gguf_tensor *last = pkv_gguf_tensor_at(g, 1);
    size_t data_end = last->file_offset + last->n_bytes;
    CHECK_INT(data_end, n - 24); /* 8 bytes of f16 data, then 24 bytes of padding */
    size_t data_off = pkv_gguf_data_offset(g);
    pkv_gguf_close(g);
    int rejected = 0;
    for (size_t cut = 0; cut < n; cut++) {
        char what[64];
        snprintf(what, sizeof what, "truncated at %zu of %zu", cut, n);
        if (cut < data_end) {
            const char *sub = cut < 4 ? "too short" : cut < 24 ? "truncated header"
                            : cut < data_off ? "" : "runs past the end";
            expect_reject(what, mem, cut, PKV_ERR_FORMAT, sub);
            rejected++;
        } else {
            void *copy = malloc(cut);
            memcpy(copy, mem, cut);
            pkv_gguf *h = pkv_gguf_open_memory(copy, cut, "cut.gguf");
            CHECK(h != NULL);
            if (h) CHECK_MEM(pkv_gguf_tensor_at(h, 1)->data, t1, sizeof t1);
            pkv_gguf_close(h);
            free(copy);
        }
    }
    CHECK(rejected > 200);
    pkv_free(mem);
}

/* Hand-made malformed files. */
static void test_malformed(void) {
    bb b = {0};
    uint64_t ne16[] = {16}, ne33[] = {33};
#define CASE(what, status, sub)                                                       \
    do {                                                                              \
        expect_reject(what, b.p, b.n, status, sub);                                   \
        b.n = 0;                                                                      \
    } while (0)

    expect_reject("empty file", "", 0, PKV_ERR_FORMAT, "too short");
    bb_bytes(&b, "GGUX", 4), bb_u32(&b, 3), bb_u64(&b, 0), bb_u64(&b, 0);
    CASE("wrong magic", PKV_ERR_FORMAT, "magic is 'GGUX', expected 'GGUF'");
    bb_header(&b, 1, 0, 0);
    CASE("version 1", PKV_ERR_FORMAT, "version 1 is not supported");
    bb_header(&b, 99, 0, 0);
    CASE("version 99", PKV_ERR_FORMAT, "unsupported GGUF version 99, expected 2 or 3");
    bb_header(&b, 0x03000000u, 0, 0);
    CASE("big-endian", PKV_ERR_FORMAT, "big-endian");
    bb_header(&b, 3, 1ull << 62, 0);
    CASE("tensor_count 2^62", PKV_ERR_FORMAT, "tensor_count 4611686018427387904 is impossible");
    bb_header(&b, 3, 0, 1ull << 62);
    CASE("kv_count 2^62", PKV_ERR_FORMAT, "kv_count 4611686018427387904 is impossible");
    bb_header(&b, 3, 0, ~0ull);
    CASE("kv_count 2^64-1", PKV_ERR_FORMAT, "is impossible");
    /* tensor_count fits the header check but not what follows the key-value pairs */
    bb_header(&b, 3, 2, 1), bb_kv_u32(&b, "k", 1), bb_zeros(&b, 50);
    CASE("tensor_count after kvs", PKV_ERR_FORMAT, "follow the key-value pairs");

    bb_header(&b, 3, 0, 1), bb_u64(&b, 1ull << 63), bb_bytes(&b, "abcdefghijklmnop", 16);
    CASE("key length 2^63", PKV_ERR_FORMAT, "key at offset 24 has length 9223372036854775808");
    bb_header(&b, 3, 0, 1), bb_str(&b, "s"), bb_u32(&b, PKV_GGUF_STRING), bb_u64(&b, 1ull << 63);
    CASE("string length 2^63", PKV_ERR_FORMAT, "key 's': string value at offset");
    bb_header(&b, 3, 0, 1), bb_str(&b, "a"), bb_u32(&b, PKV_GGUF_ARRAY), bb_u32(&b, PKV_GGUF_UINT32);
    bb_u64(&b, 1ull << 62), bb_zeros(&b, 64);
    CASE("u32 array count 2^62", PKV_ERR_FORMAT, "key 'a': array of 4611686018427387904 uint32");
    bb_header(&b, 3, 0, 1), bb_str(&b, "a"), bb_u32(&b, PKV_GGUF_ARRAY), bb_u32(&b, PKV_GGUF_STRING);
    bb_u64(&b, ~0ull), bb_zeros(&b, 64);
    CASE("string array count 2^64-1", PKV_ERR_FORMAT, "array of 18446744073709551615 strings");
    bb_header(&b, 3, 0, 1), bb_str(&b, "a"), bb_u32(&b, PKV_GGUF_ARRAY), bb_u32(&b, PKV_GGUF_STRING);
    bb_u64(&b, 2), bb_str(&b, "x"), bb_u64(&b, 1000), bb_zeros(&b, 8);
    CASE("string array element too long", PKV_ERR_FORMAT, "string 1 of 2 at offset");
    bb_header(&b, 3, 0, 1), bb_str(&b, "nest"), bb_u32(&b, PKV_GGUF_ARRAY), bb_u32(&b, PKV_GGUF_ARRAY);
    bb_u64(&b, 1), bb_u32(&b, PKV_GGUF_UINT8), bb_u64(&b, 1), bb_u8(&b, 1);
    CASE("array of arrays", PKV_ERR_FORMAT, "key 'nest': arrays of arrays are not supported");
    bb_header(&b, 3, 0, 1), bb_str(&b, "a"), bb_u32(&b, PKV_GGUF_ARRAY), bb_u32(&b, 77), bb_u64(&b, 0);
    CASE("unknown array element type", PKV_ERR_FORMAT, "unknown array element type 77");
    bb_header(&b, 3, 0, 1), bb_str(&b, "weird"), bb_u32(&b, 13), bb_u64(&b, 0);
    CASE("unknown value type", PKV_ERR_FORMAT, "key 'weird': unknown value type 13");
    bb_header(&b, 3, 0, 1), bb_str(&b, "flag"), bb_u32(&b, PKV_GGUF_BOOL), bb_u8(&b, 2);
    CASE("bool 2", PKV_ERR_FORMAT, "key 'flag': bool value at offset 40 is 2, expected 0 or 1");
    bb_header(&b, 3, 0, 1), bb_str(&b, "ab"), bb_u32(&b, PKV_GGUF_ARRAY), bb_u32(&b, PKV_GGUF_BOOL);
    bb_u64(&b, 2), bb_u8(&b, 1), bb_u8(&b, 9);
    CASE("bool array", PKV_ERR_FORMAT, "bool array element 1 is 9");
    bb_header(&b, 3, 0, 1), bb_u64(&b, 3), bb_bytes(&b, "a\0b", 3), bb_u32(&b, 4), bb_u32(&b, 0);
    CASE("NUL in key", PKV_ERR_FORMAT, "contains a NUL byte");
    bb_header(&b, 3, 0, 3), bb_kv_u32(&b, "a.b", 1), bb_kv_u32(&b, "c", 2), bb_kv_u32(&b, "a.b", 3);
    CASE("duplicate key", PKV_ERR_FORMAT, "duplicate key 'a.b' (entries #0 and #2)");
    bb_header(&b, 3, 0, 1), bb_str(&b, "general.alignment"), bb_u32(&b, PKV_GGUF_STRING), bb_str(&b, "32");
    CASE("alignment as string", PKV_ERR_FORMAT, "key 'general.alignment' has type string, expected uint32");
    bb_header(&b, 3, 0, 1), bb_kv_u32(&b, "general.alignment", 48);
    CASE("alignment 48", PKV_ERR_FORMAT, "'general.alignment' is 48, expected a power of two");
    bb_header(&b, 3, 0, 1), bb_kv_u32(&b, "general.alignment", 0);
    CASE("alignment 0", PKV_ERR_FORMAT, "is 0, expected a power of two");

    /* tensor infos */
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w", 1, ne16, 99, 0), bb_pad(&b, 32), bb_zeros(&b, 64);
    CASE("unknown tensor type", PKV_ERR_FORMAT, "tensor 'w': unknown or unsupported tensor type 99");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w", 1, ne16, 9, 0), bb_pad(&b, 32), bb_zeros(&b, 64);
    CASE("tensor type q8_1", PKV_ERR_FORMAT, "tensor 'w': unknown or unsupported tensor type 9 (ggml q8_1) (this build reads");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w", 1, ne16, 40, 0), bb_pad(&b, 32), bb_zeros(&b, 64);
    CASE("tensor type nvfp4", PKV_ERR_FORMAT, "tensor 'w': unknown or unsupported tensor type 40 (ggml nvfp4)");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w", 1, (uint64_t[]){32}, 11, 0), bb_pad(&b, 32), bb_zeros(&b, 128);
    CASE("q3_k row of 32", PKV_ERR_FORMAT, "tensor 'w': row length ne[0] = 32 is not a multiple of the q3_k block size 256");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w", 2, (uint64_t[]){256, 2}, 23, 0), bb_pad(&b, 32), bb_zeros(&b, 271);
    CASE("iq4_xs data cut short", PKV_ERR_FORMAT, "tensor 'w': data [offset");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w", 1, ne16, 4, 0), bb_pad(&b, 32), bb_zeros(&b, 64);
    CASE("removed tensor type 4", PKV_ERR_FORMAT, "unsupported tensor type 4 (this build");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w5", 5, (uint64_t[]){1, 1, 1, 1, 1}, 0, 0);
    bb_pad(&b, 32), bb_zeros(&b, 32);
    CASE("n_dims 5", PKV_ERR_FORMAT, "tensor 'w5': n_dims is 5, expected 1 to 4");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "w0", 0, NULL, 0, 0), bb_pad(&b, 32), bb_zeros(&b, 32);
    CASE("n_dims 0", PKV_ERR_FORMAT, "n_dims is 0");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "z", 2, (uint64_t[]){4, 0}, 0, 0), bb_pad(&b, 32);
    bb_zeros(&b, 32);
    CASE("zero dim", PKV_ERR_FORMAT, "tensor 'z': dimension 1 is 0");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "big", 1, (uint64_t[]){1ull << 63}, 0, 0), bb_zeros(&b, 32);
    CASE("dim 2^63", PKV_ERR_FORMAT, "dimension 0 is 9223372036854775808");
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "ovf", 3, (uint64_t[]){1ull << 32, 1ull << 32, 1ull << 32}, 0, 0), bb_zeros(&b, 32);
    CASE("element count overflow", PKV_ERR_FORMAT, "tensor 'ovf': dims [4294967296, 4294967296, 4294967296, 1] overflow");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "bytes", 1, (uint64_t[]){1ull << 62}, 0, 0), bb_zeros(&b, 32);
    CASE("byte size overflow", PKV_ERR_FORMAT, "tensor 'bytes': dims [4611686018427387904, 1, 1, 1] overflow");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "q", 1, ne33, PKV_TYPE_Q8_0, 0), bb_pad(&b, 32), bb_zeros(&b, 64);
    CASE("row not a block multiple", PKV_ERR_FORMAT, "tensor 'q': row length ne[0] = 33 is not a multiple of the q8_0 block size 32");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "mis", 1, ne16, 0, 4), bb_pad(&b, 32), bb_zeros(&b, 96);
    CASE("misaligned offset", PKV_ERR_FORMAT, "tensor 'mis': data offset 4 is not a multiple of the alignment 32");
    bb_header(&b, 3, 2, 0), bb_tensor(&b, "a", 1, ne16, 0, 0), bb_tensor(&b, "b", 1, ne16, 0, 32);
    bb_pad(&b, 32), bb_zeros(&b, 128);
    CASE("overlapping tensors", PKV_ERR_FORMAT, "tensor 'a': data [offset 96, +64) overlaps tensor 'b' at offset 128");
    bb_header(&b, 3, 2, 0), bb_tensor(&b, "b", 1, ne16, 0, 64), bb_tensor(&b, "a", 1, ne16, 0, 64);
    bb_pad(&b, 32), bb_zeros(&b, 128);
    CASE("same offset", PKV_ERR_FORMAT, "overlaps tensor");
    bb_header(&b, 3, 2, 0), bb_tensor(&b, "dup", 1, ne16, 0, 0), bb_tensor(&b, "dup", 1, ne16, 0, 64);
    bb_pad(&b, 32), bb_zeros(&b, 128);
    CASE("duplicate tensor", PKV_ERR_FORMAT, "duplicate tensor name 'dup'");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "x.gguf.w", 1, ne16, 0, 0), bb_pad(&b, 32), bb_zeros(&b, 60);
    CASE("data past EOF", PKV_ERR_FORMAT, "tensor 'x.gguf.w': data [offset 64, +64) runs past the end of the file (124 bytes)");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "far", 1, ne16, 0, 1ull << 63), bb_pad(&b, 32), bb_zeros(&b, 64);
    CASE("offset 2^63", PKV_ERR_FORMAT, "tensor 'far': data [offset 9223372036854775872, +64) runs past the end");
    bb_header(&b, 3, 1, 0), bb_tensor(&b, "wrap", 1, ne16, 0, ~0ull - 31), bb_pad(&b, 32), bb_zeros(&b, 64);
    CASE("offset wraps", PKV_ERR_FORMAT, "runs past the end");
    bb_header(&b, 3, 1, 0), bb_u64(&b, 2), bb_bytes(&b, "\x01'", 2), bb_u32(&b, 9);
    bb_zeros(&b, 40);
    CASE("odd name bytes", PKV_ERR_FORMAT, "tensor '\\x01\\x27': n_dims is 9");
    for (int fill = 0; fill < 2; fill++) { /* long names are cut with "..." in messages */
        char key[301];
        memset(key, fill ? 1 : 'k', 300);
        key[300] = 0;
        bb_header(&b, 3, 0, 1), bb_str(&b, key), bb_u32(&b, 13), bb_u64(&b, 0);
        CASE("long key", PKV_ERR_FORMAT, fill ? "\\x01\\x01...': unknown value type 13"
                                               : "kkkk...': unknown value type 13");
    }

    /* A valid hand-made file with alignment 64 (the data section starts at 64*k). */
    bb_header(&b, 2, 1, 1), bb_kv_u32(&b, "general.alignment", 64), bb_tensor(&b, "w", 1, ne16, 0, 0);
    size_t info_end = b.n;
    bb_pad(&b, 64);
    for (int i = 0; i < 16; i++) {
        float v = (float)i;
        bb_bytes(&b, &v, 4);
    }
    pkv_gguf *g = pkv_gguf_open_memory(b.p, b.n, "ok.gguf");
    CHECK(g != NULL);
    if (g) {
        CHECK_INT(pkv_gguf_version(g), 2);
        CHECK_INT(pkv_gguf_data_offset(g), (info_end + 63) / 64 * 64);
        const pkv_gguf_tensor *t = pkv_gguf_find_tensor(g, "w");
        CHECK(t && ((const float *)t->data)[15] == 15.0f);
        pkv_gguf_close(g);
    }
    /* the same file with the data one byte short */
    b.n--;
    CASE("alignment 64, one byte short", PKV_ERR_FORMAT, "tensor 'w': data [offset 128, +64) runs past the end of the file (191 bytes)");
    free(b.p);
#undef CASE
}

static void test_open_errors(void) {
    int64_t live = pkv_alloc_live();
    pkv_gguf *g = NULL;
    CHECK_STATUS(pkv_gguf_read("/nonexistent/dir/model.gguf", &g), PKV_ERR_IO);
    CHECK_MSG("/nonexistent/dir/model.gguf: cannot open");
    CHECK(g == NULL);
    CHECK(pkv_gguf_open("/") == NULL);
    CHECK_MSG("/: not a regular file");
    const char *path = th_tmp("test-gguf-empty.gguf");
    FILE *f = fopen(path, "wb");
    if (f) fclose(f);
    CHECK_STATUS(pkv_gguf_read(path, &g), PKV_ERR_FORMAT);
    CHECK_MSG("file is 0 bytes, too short");
    unlink(path);
    CHECK_INT(pkv_alloc_live(), live);
}

static void test_writer_errors(void) {
    int64_t live = pkv_alloc_live();
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    REQUIRE_VOID(w != NULL);
    float d[32] = {0};
    CHECK_OK(pkv_gguf_writer_add_str(w, "general.architecture", "qwen2"));
    CHECK_OK(pkv_gguf_writer_add_tensor(w, "w", PKV_TYPE_F32, 1, (int64_t[]){32}, d, sizeof d));
    void *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    CHECK_OK(pkv_gguf_writer_write_memory(w, &before, &nb));

    CHECK_STATUS(pkv_gguf_writer_set_version(w, 1), PKV_ERR_INVALID);
    CHECK_MSG("version 1, expected 2 or 3");
    CHECK_STATUS(pkv_gguf_writer_set_alignment(w, 48), PKV_ERR_INVALID);
    CHECK_MSG("alignment 48 is not a power of two");
    CHECK_STATUS(pkv_gguf_writer_add_u32(w, "", 1), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_gguf_writer_add(w, "k", PKV_GGUF_STRING, "x"), PKV_ERR_INVALID);
    CHECK_MSG("not a fixed-size type");
    CHECK_STATUS(pkv_gguf_writer_add_arr(w, "k", PKV_GGUF_ARRAY, d, 1), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_gguf_writer_add_tensor(w, "w", PKV_TYPE_F32, 1, (int64_t[]){32}, d, sizeof d),
                 PKV_ERR_INVALID);
    CHECK_MSG("tensor 'w' was already added");
    CHECK_STATUS(pkv_gguf_writer_add_tensor(w, "v", PKV_TYPE_F32, 1, (int64_t[]){31}, d, sizeof d),
                 PKV_ERR_INVALID);
    CHECK_MSG("tensor 'v': f32 [31, 1, 1, 1] is 124 bytes, got 128");
    CHECK_STATUS(pkv_gguf_writer_add_tensor(w, "q", PKV_TYPE_Q8_0, 1, (int64_t[]){33}, NULL, 0),
                 PKV_ERR_INVALID);
    CHECK_MSG("ne[0] = 33 is not a multiple of the q8_0 block size 32");
    CHECK_STATUS(pkv_gguf_writer_add_tensor(w, "t", (pkv_type)5, 1, (int64_t[]){32}, NULL, 0),
                 PKV_ERR_INVALID);
    CHECK_MSG("unknown type 5");
    CHECK_STATUS(pkv_gguf_writer_add_tensor(w, "t", PKV_TYPE_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, NULL, 4),
                 PKV_ERR_INVALID);
    CHECK_STATUS(pkv_gguf_writer_add_tensor(w, "t", PKV_TYPE_F32, 2, (int64_t[]){4, 0}, NULL, 0),
                 PKV_ERR_INVALID);
    CHECK_MSG("ne[1] = 0");
    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = 0;
    CHECK_STATUS(pkv_gguf_writer_add_tensor(w, longname, PKV_TYPE_F32, 1, (int64_t[]){1}, NULL, 4),
                 PKV_ERR_INVALID);
    CHECK_MSG("at most 63");
    CHECK_STATUS(pkv_gguf_writer_write(w, "/nonexistent/dir/out.gguf"), PKV_ERR_IO);
    CHECK_MSG("/nonexistent/dir/out.gguf: cannot create");
    /* nothing changed by the failures */
    CHECK_OK(pkv_gguf_writer_write_memory(w, &after, &na));
    CHECK(na == nb && before && after && memcmp(before, after, na) == 0);
    pkv_free(after);

    /* a general.alignment of the wrong type makes write fail, and the key can be fixed */
    CHECK_OK(pkv_gguf_writer_add_str(w, "general.alignment", "64"));
    CHECK_STATUS(pkv_gguf_writer_write_memory(w, &after, &na), PKV_ERR_INVALID);
    CHECK_MSG("general.alignment must be a uint32 power of two");
    CHECK_OK(pkv_gguf_writer_add_u32(w, "general.alignment", 16));
    CHECK_OK(pkv_gguf_writer_write_memory(w, &after, &na));
    pkv_gguf *g = pkv_gguf_open_memory(after, na, "a16.gguf");
    CHECK(g && pkv_gguf_alignment(g) == 16 && pkv_gguf_data_offset(g) % 16 == 0);
    pkv_gguf_close(g);
    pkv_free(after);
    pkv_free(before);
    pkv_gguf_writer_free(w);
    CHECK_INT(pkv_alloc_live(), live);
}

/* Fail each allocation of an operation in turn: each must fail cleanly with
 * PKV_ERR_NOMEM and no leak; the run after the last one succeeds. */
static void test_alloc_failures(void) {
    pkv_gguf_writer *w = NULL;
    CHECK_OK(build(&w, g_tdata, 3, 0));
    REQUIRE_VOID(w != NULL);
    void *mem = NULL;
    size_t n = 0;
    CHECK_OK(pkv_gguf_writer_write_memory(w, &mem, &n));
    const char *path = th_tmp("test-gguf-oom.gguf");
    CHECK_OK(pkv_gguf_writer_write(w, path));
    pkv_gguf_writer_free(w);

    for (int mode = 0; mode < 4; mode++) {
        const char *names[] = {"open_memory", "open (mmap)", "open (read)", "build + write_memory"};
        if (mode == 2) setenv("PKV_GGUF_NO_MMAP", "1", 1);
        int failures = 0;
        for (uint64_t k = 1;; k++) {
            int64_t live = pkv_alloc_live();
            pkv_alloc_fail_at(k);
            pkv_gguf *g = NULL;
            pkv_status s;
            if (mode == 0) s = pkv_gguf_read_memory(mem, n, "oom.gguf", &g);
            else if (mode <= 2) s = pkv_gguf_read(path, &g);
            else {
                pkv_gguf_writer *w2 = NULL;
                s = build(&w2, g_tdata, 3, 64);
                if (!s) {
                    void *m2 = NULL;
                    size_t n2 = 0;
                    s = pkv_gguf_writer_write_memory(w2, &m2, &n2);
                    pkv_free(m2);
                }
                pkv_gguf_writer_free(w2);
            }
            uint64_t made = pkv_alloc_fail_at(0);
            if (s == PKV_OK) {
                if (g) check_contents(g, g_tdata, 3, 32);
                pkv_gguf_close(g);
                CHECK_INT(pkv_alloc_live(), live);
                CHECK(made < k); /* succeeded only once k passed all allocations */
                break;
            }
            failures++;
            th_checks += 2;
            if (s != PKV_ERR_NOMEM || !*pkv_errmsg())
                TH_FAIL("%s, allocation %llu failed: %s (%s)", names[mode], (unsigned long long)k,
                        pkv_status_str(s), pkv_errmsg());
            if (pkv_alloc_live() != live)
                TH_FAIL("%s, allocation %llu failed: %lld leaked", names[mode],
                        (unsigned long long)k, (long long)(pkv_alloc_live() - live));
            if (k > 10000) {
                TH_FAIL("%s never succeeds", names[mode]);
                break;
            }
        }
        if (mode == 2) unsetenv("PKV_GGUF_NO_MMAP");
        CHECK(failures >= 5);
        fprintf(stderr, "%s: %d allocation failures injected, all clean\n", names[mode], failures);
    }
    pkv_free(mem);
    unlink(path);
}

/* Touch every value and every tensor byte of an opened file (ASan checks the
 * reads stay inside the buffer); returns a checksum so nothing is optimized out. */
static uint64_t walk(pkv_gguf *g) {
    uint64_t h = 0;
    for (int64_t i = 0; i < pkv_gguf_n_kv(g); i++) {
        const char *key = pkv_gguf_kv_key(g, i);
        h += strlen(key);
        pkv_gguf_array arr;
        const char *s;
        size_t len;
        uint32_t u;
        float f;
        bool b;
        int64_t v;
        if (pkv_gguf_get_arr(g, key, PKV_GGUF_TYPE_COUNT, &arr) == PKV_OK) {
            for (uint64_t j = 0; j < arr.count; j++) {
                if (arr.type == PKV_GGUF_STRING) {
                    if (pkv_gguf_arr_str(g, &arr, j, &s, &len) == PKV_OK)
                        for (size_t k = 0; k < len; k++) h += (uint8_t)s[k];
                } else {
                    h += (uint64_t)pkv_gguf_arr_int(&arr, j);
                    double d = pkv_gguf_arr_float(&arr, j);
                    h += d == d;
                }
            }
        }
        if (pkv_gguf_get_str(g, key, &s, &len) == PKV_OK)
            for (size_t k = 0; k < len; k++) h += (uint8_t)s[k];
        if (pkv_gguf_get_u32(g, key, &u) == PKV_OK) h += u;
        if (pkv_gguf_get_i64(g, key, &v) == PKV_OK) h += (uint64_t)v;
        if (pkv_gguf_get_f32(g, key, &f) == PKV_OK) h += f == f;
        if (pkv_gguf_get_bool(g, key, &b) == PKV_OK) h += b;
    }
    for (int64_t i = 0; i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        h += strlen(t->name);
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->n_bytes; k++) h += p[k];
    }
    return h;
}

/* Random byte mutations of a small valid file: never a crash, an out-of-bounds
 * read or a leak; a rejection always comes with a message. */
static void test_mutations(void) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    REQUIRE_VOID(w != NULL);
    const char *toks[] = {"a", "bc", "", "def"};
    int32_t ty[] = {1, 2, 3, 6};
    float t0[6] = {1, 2, 3, 4, 5, 6};
    uint8_t q[34 * 2] = {0};
    CHECK_OK(pkv_gguf_writer_add_str(w, "general.architecture", "llama"));
    CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.block_count", 2));
    CHECK_OK(pkv_gguf_writer_add_f32(w, "llama.rope.freq_base", 1e4f));
    CHECK_OK(pkv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 4));
    CHECK_OK(pkv_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", PKV_GGUF_INT32, ty, 4));
    CHECK_OK(pkv_gguf_writer_add_tensor(w, "t0", PKV_TYPE_F32, 2, (int64_t[]){3, 2}, t0, sizeof t0));
    CHECK_OK(pkv_gguf_writer_add_tensor(w, "q", PKV_TYPE_Q8_0, 2, (int64_t[]){32, 2}, q, sizeof q));
    void *mem = NULL;
    size_t n = 0;
    CHECK_OK(pkv_gguf_writer_write_memory(w, &mem, &n));
    pkv_gguf_writer_free(w);
    REQUIRE_VOID(mem != NULL);
    uint64_t seed = 99, sum = 0;
    int opened = 0, rejected = 0;
    uint8_t *copy = malloc(n);
    for (int it = 0; it < 20000; it++) {
        memcpy(copy, mem, n);
        int flips = 1 + (int)(th_rand(&seed) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(th_rand(&seed) % n);
            uint64_t r = th_rand(&seed);
            /* mostly small values and all-ones bytes: they hit counts and lengths */
            copy[at] = r % 3 == 0 ? (uint8_t)(r >> 8) : r % 3 == 1 ? 0xff : (uint8_t)((r >> 8) & 7);
        }
        size_t len = th_rand(&seed) % 8 == 0 ? (size_t)(th_rand(&seed) % n) : n;
        uint8_t *exact = malloc(len ? len : 1);
        memcpy(exact, copy, len);
        int64_t live = pkv_alloc_live();
        pkv_err_clear();
        pkv_gguf *g = NULL;
        pkv_status s = pkv_gguf_read_memory(exact, len, "fuzz.gguf", &g);
        if (s == PKV_OK) {
            opened++;
            sum += walk(g);
            pkv_gguf_close(g);
        } else {
            rejected++;
            th_checks++;
            if (s != PKV_ERR_FORMAT || !strstr(pkv_errmsg(), "fuzz.gguf: "))
                TH_FAIL("mutation %d: %s (%s)", it, pkv_status_str(s), pkv_errmsg());
        }
        th_checks++;
        if (pkv_alloc_live() != live) TH_FAIL("mutation %d leaked", it);
        free(exact);
    }
    fprintf(stderr, "mutations: %d opened, %d rejected (checksum %llu)\n", opened, rejected,
            (unsigned long long)sum);
    CHECK(opened > 100 && rejected > 100);
    free(copy);
    pkv_free(mem);
}

int main(void) {
    int64_t live = pkv_alloc_live();
    make_tdata();
    test_round_trip(3, 0);
    test_round_trip(2, 0);
    test_round_trip(3, 64);
    test_round_trip(2, 128);
    test_truncation();
    test_malformed();
    test_mutations();
    test_open_errors();
    test_writer_errors();
    test_alloc_failures();
    for (size_t i = 0; i < N_TENSORS; i++) free(g_tdata[i]);
    CHECK_INT(pkv_alloc_live(), live);
    return th_done();
}
