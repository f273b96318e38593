// labels: unit
/* base layer: status text, thread-local errmsg, logging, allocator hooks and
 * failure injection, thread pool, f16/bf16 conversions against references. */
#include <float.h>
#include <pthread.h>

#include "base/base.h"
#include "testhelp.h"

static void test_status(void) {
    pkv_status all[] = {PKV_OK, PKV_ERR_INVALID, PKV_ERR_NOMEM, PKV_ERR_OUT_OF_PAGES, PKV_ERR_IO, PKV_ERR_FORMAT,
                        PKV_ERR_UNSUPPORTED, PKV_ERR_DEVICE, PKV_ERR_MISMATCH, PKV_ERR_NOT_FOUND, PKV_ERR_INTERNAL};
    for (size_t i = 0; i < PKV_ARRAY_LEN(all); i++) {
        const char *s = pkv_status_str(all[i]);
        CHECK(s && *s && strcmp(s, "unknown status") != 0);
        for (size_t j = 0; j < i; j++) CHECK(strcmp(s, pkv_status_str(all[j])) != 0);
    }
    CHECK(strcmp(pkv_status_str((pkv_status)-999), "unknown status") == 0);
    CHECK(strcmp(pkv_status_str(PKV_ERR_OUT_OF_PAGES), "out of KV pages") == 0);
    CHECK_STATUS(pkv_err(PKV_ERR_IO, "file %s: %d", "a.gguf", 42), PKV_ERR_IO);
    CHECK(strcmp(pkv_errmsg(), "file a.gguf: 42") == 0);
    pkv_err_prefix(PKV_ERR_IO, "loading %s", "m");
    CHECK(strcmp(pkv_errmsg(), "loading m: file a.gguf: 42") == 0);
    CHECK_STATUS(pkv_errcode(), PKV_ERR_IO);
    /* a handle-returning call's status, which its NULL result does not carry */
    CHECK(pkv_model_load("/nonexistent/x.gguf", pkv_model_default_params()) == NULL);
    CHECK_STATUS(pkv_errcode(), PKV_ERR_IO);
    pkv_err_prefix(PKV_ERR_FORMAT, "again");
    CHECK_STATUS(pkv_errcode(), PKV_ERR_FORMAT);
    /* one separator, also when the prefix brings its own ("sampler: : grammar: ...") */
    pkv_err(PKV_ERR_INVALID, "grammar: x");
    pkv_err_prefix(PKV_ERR_INVALID, "sampler: ");
    CHECK(strcmp(pkv_errmsg(), "sampler: grammar: x") == 0);
    pkv_err_clear();
    pkv_err_prefix(PKV_ERR_INVALID, "engine");
    CHECK(strcmp(pkv_errmsg(), "engine") == 0);
    pkv_err_clear();
    CHECK_STATUS(pkv_errcode(), PKV_OK);
    CHECK(pkv_errmsg()[0] == 0);
}

static void *thread_err(void *arg) {
    (void)arg;
    const char *before = pkv_errmsg();
    bool empty = before[0] == 0; /* the main thread's message must not be visible */
    pkv_err(PKV_ERR_INVALID, "from the thread");
    return (void *)(uintptr_t)(empty && strcmp(pkv_errmsg(), "from the thread") == 0);
}

static void test_errmsg_thread(void) {
    pkv_err(PKV_ERR_NOMEM, "from main");
    pthread_t t;
    void *ok = NULL;
    pthread_create(&t, NULL, thread_err, NULL);
    pthread_join(t, &ok);
    CHECK(ok != NULL);
    CHECK(strcmp(pkv_errmsg(), "from main") == 0);
    CHECK_STATUS(pkv_errcode(), PKV_ERR_NOMEM); /* the thread's INVALID stayed there */
}

typedef struct {
    int n;
    pkv_log_level last;
    char msg[256];
} log_sink;

static void sink(pkv_log_level lv, const char *msg, void *user) {
    log_sink *s = user;
    s->n++;
    s->last = lv;
    snprintf(s->msg, sizeof s->msg, "%s", msg);
}

static void test_log(void) {
    log_sink s = {0};
    pkv_log_set(sink, &s, PKV_LOG_INFO);
    pkv_log(PKV_LOG_DEBUG, "dropped %d", 1);
    CHECK_INT(s.n, 0);
    pkv_log(PKV_LOG_WARN, "kept %d", 2);
    CHECK_INT(s.n, 1);
    CHECK_INT(s.last, PKV_LOG_WARN);
    CHECK(strcmp(s.msg, "kept 2") == 0);
    pkv_log_set(NULL, NULL, PKV_LOG_WARN);
}

static int64_t g_hook_allocs;
static void *hook_alloc(size_t n, void *u) { (void)u; g_hook_allocs++; return malloc(n); }
static void *hook_realloc(void *p, size_t n, void *u) { (void)u; return realloc(p, n); }
static void hook_free(void *p, void *u) { (void)u; g_hook_allocs--; free(p); }

static void test_alloc(void) {
    int64_t live0 = pkv_alloc_live();
    pkv_allocator a = {hook_alloc, hook_realloc, hook_free, NULL};
    pkv_allocator_set(&a);
    void *p = pkv_malloc(10);
    CHECK(p != NULL);
    CHECK_INT(g_hook_allocs, 1);
    CHECK_INT(pkv_alloc_live(), live0 + 1);
    pkv_free(p);
    CHECK_INT(g_hook_allocs, 0);
    pkv_allocator_set(NULL);
    CHECK_INT(pkv_alloc_live(), live0);

    /* fail the 3rd allocation from now */
    pkv_alloc_fail_at(3);
    void *a1 = pkv_malloc(1), *a2 = pkv_malloc(1), *a3 = pkv_malloc(1), *a4 = pkv_malloc(1);
    CHECK(a1 && a2 && !a3 && a4);
    CHECK_INT(pkv_alloc_fail_at(0), 4);
    pkv_free(a1);
    pkv_free(a2);
    pkv_free(a4);
    CHECK(pkv_calloc(SIZE_MAX / 2, 4) == NULL); /* overflow is refused */
    void *arr = NULL;
    size_t cap = 0;
    CHECK_OK(pkv_grow(&arr, &cap, 100, 8));
    CHECK(cap >= 100);
    size_t cap_before = cap;
    pkv_alloc_fail_at(1);
    CHECK_STATUS(pkv_grow(&arr, &cap, 1000, 8), PKV_ERR_NOMEM);
    pkv_alloc_fail_at(0);
    CHECK_INT(cap, cap_before); /* unchanged on failure */
    pkv_free(arr);
    CHECK_INT(pkv_alloc_live(), live0);
}

typedef struct {
    int64_t *slots;
    int n;
} pool_job;

static void pool_task(int i, int n, void *arg) {
    pool_job *j = arg;
    (void)n;
    j->slots[i] += (int64_t)i * i + 1;
}

static void test_pool(void) {
    for (int threads = 1; threads <= 4; threads++) {
        pkv_pool *pool = pkv_pool_create(threads);
        if (!pool) {
            TH_FAIL("pool of %d threads: %s", threads, pkv_errmsg());
            continue;
        }
        CHECK_INT(pkv_pool_threads(pool), threads);
        int64_t slots[257];
        memset(slots, 0, sizeof slots);
        pool_job j = {slots, 257};
        for (int rep = 0; rep < 200; rep++) pkv_pool_run(pool, 1 + rep % 257, pool_task, &j);
        /* task i ran once for every rep with 1 + rep%257 > i */
        for (int i = 0; i < 257; i++) {
            int64_t runs = 0;
            for (int rep = 0; rep < 200; rep++) runs += (1 + rep % 257) > i;
            CHECK_INT(slots[i], runs * ((int64_t)i * i + 1));
        }
        pkv_pool_free(pool);
    }
    pkv_pool_free(NULL);
}

/* f16: the compiler's _Float16 (IEEE, round to nearest even) is the reference. */
static void test_f16(void) {
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 ref;
        uint16_t hb = (uint16_t)h;
        memcpy(&ref, &hb, 2);
        float want = (float)ref, got = pkv_f16_to_f32(hb);
        if (isnan(want)) {
            if (!isnan(got)) bad++;
            /* round trip keeps NaN-ness and sign */
            uint16_t back = pkv_f32_to_f16(got);
            if ((back & 0x7c00) != 0x7c00 || !(back & 0x3ff) || (back & 0x8000) != (hb & 0x8000)) bad++;
            continue;
        }
        if (memcmp(&want, &got, 4) != 0) bad++;
        if (pkv_f32_to_f16(got) != hb) bad++; /* exact round trip */
    }
    CHECK_INT(bad, 0);
    /* f32 -> f16 on values between halves: random bits plus the edges. */
    uint64_t seed = 7;
    bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t bits = (uint32_t)th_rand(&seed);
        if (i < 65536) bits = ((uint32_t)i << 13) | 0x1000u | (i & 1); /* ties and near-ties */
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f)) continue;
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        if (pkv_f32_to_f16(f) != rb) {
            if (bad < 5) TH_FAIL("f32 0x%08x -> f16 0x%04x, want 0x%04x", bits, pkv_f32_to_f16(f), rb);
            bad++;
        }
    }
    CHECK_INT(bad, 0);
    CHECK_INT(pkv_f32_to_f16(65520.0f), 0x7c00);  /* rounds to Inf */
    CHECK_INT(pkv_f32_to_f16(65519.99f), 0x7bff); /* max half */
    CHECK_INT(pkv_f32_to_f16(5.960464477539063e-08f), 0x0001);
    CHECK_INT(pkv_f32_to_f16(2.98023223876953125e-08f), 0x0000); /* exact tie to even: 0 */
    CHECK_INT(pkv_f32_to_f16(-0.0f), 0x8000);
}

/* bf16 reference: choose the nearer of the two neighbouring bf16 values in double,
 * ties to the even one. */
static uint16_t bf16_ref(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if (isnan(f)) return 0;
    uint16_t lo = (uint16_t)(x >> 16), hi = (uint16_t)(lo + 1);
    if ((x & 0xffff) == 0) return lo;
    double dl = fabs((double)pkv_bf16_to_f32(lo) - (double)f);
    float fh = pkv_bf16_to_f32(hi);
    double dh = fabs((isinf(fh) ? copysign(ldexp(1.0, 128), (double)f) : (double)fh) - (double)f);
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1) ? hi : lo;
}

static void test_bf16(void) {
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pkv_bf16_to_f32((uint16_t)h);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        if (bits != h << 16) bad++;
        if (!isnan(f) && pkv_f32_to_bf16(f) != h) bad++;
        if (isnan(f) && !isnan(pkv_bf16_to_f32(pkv_f32_to_bf16(f)))) bad++;
    }
    CHECK_INT(bad, 0);
    uint64_t seed = 11;
    bad = 0;
    for (int i = 0; i < 1000000; i++) {
        uint32_t bits = (uint32_t)th_rand(&seed);
        if (i < 65536) bits = ((uint32_t)i << 16) | 0x8000u; /* exact ties */
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f)) continue;
        if (pkv_f32_to_bf16(f) != bf16_ref(f)) {
            if (bad < 5) TH_FAIL("f32 0x%08x -> bf16 0x%04x, want 0x%04x", bits, pkv_f32_to_bf16(f), bf16_ref(f));
            bad++;
        }
    }
    CHECK_INT(bad, 0);
}

static void test_types(void) {
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_Q8_0, 64), 68);
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_Q4_0, 32), 18);
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_Q4_K, 512), 288);
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_Q6_K, 256), 210);
    CHECK_INT(pkv_type_row_bytes(PKV_TYPE_Q8_0, 33), 0); /* not whole blocks */
    CHECK_INT(pkv_type_row_bytes((pkv_type)5, 32), 0);   /* unknown type */
    pkv_type t;
    CHECK_OK(pkv_type_from_name("Q8_0", &t));
    CHECK_INT(t, PKV_TYPE_Q8_0);
    CHECK_STATUS(pkv_type_from_name("q3_xyz", &t), PKV_ERR_NOT_FOUND);
    CHECK_MSG("q3_xyz");
    CHECK(pkv_hash64("abc", 3, 1) != pkv_hash64("abd", 3, 1));
    CHECK(pkv_hash64("abc", 3, 1) != pkv_hash64("abc", 3, 2));
    CHECK(pkv_hash64("abc", 3, 1) == pkv_hash64("abc", 3, 1));
}

int main(void) {
    test_status();
    test_errmsg_thread();
    test_log();
    test_alloc();
    test_pool();
    test_f16();
    test_bf16();
    test_types();
    return th_done();
}
