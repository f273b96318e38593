/* The memory read-bandwidth probe of `pagekv bench model`: the denominator of the
 * decode roofline, so it must be believable. The buffer is at least 4x the
 * last-level cache (its size read from sysfs) so no pass is served from cache,
 * every page is touched before timing, and several passes give the best and the
 * median (the median is what the roofline uses: one lucky pass cannot move it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"

typedef struct {
    const uint64_t *p;
    size_t n; /* words */
    uint64_t sums[64];
} bw_job;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* Sum 64-byte lines with 256-bit loads and 8 independent accumulators: as fast
 * as the memory system can feed one core (a scalar loop is not). */
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t a, size_t b) {
    __m256i s[8];
    for (int k = 0; k < 8; k++) s[k] = _mm256_setzero_si256();
    size_t i = a;
    for (; i + 32 <= b; i += 32)
        for (int k = 0; k < 8; k++) s[k] = _mm256_xor_si256(s[k], _mm256_loadu_si256((const __m256i *)(p + i + 4 * k)));
    for (int k = 1; k < 8; k++) s[0] = _mm256_xor_si256(s[0], s[k]);
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, s[0]);
    for (; i < b; i++) out[0] ^= p[i];
    return out[0] ^ out[1] ^ out[2] ^ out[3];
}
#elif defined(__aarch64__) && defined(__GNUC__)
#include <arm_neon.h>
/* The same with 128-bit loads, 8 accumulators (two 64-byte lines per step). */
static uint64_t read_neon(const uint64_t *p, size_t a, size_t b) {
    uint64x2_t s[8];
    for (int k = 0; k < 8; k++) s[k] = vdupq_n_u64(0);
    size_t i = a;
    for (; i + 16 <= b; i += 16)
        for (int k = 0; k < 8; k++) s[k] = veorq_u64(s[k], vld1q_u64(p + i + 2 * k));
    for (int k = 1; k < 8; k++) s[0] = veorq_u64(s[0], s[k]);
    uint64_t out = vgetq_lane_u64(s[0], 0) ^ vgetq_lane_u64(s[0], 1);
    for (; i < b; i++) out ^= p[i];
    return out;
}
#endif

static void bw_task(int i, int n_tasks, void *arg) {
    bw_job *j = arg;
    size_t a = j->n * (size_t)i / (size_t)n_tasks, b = j->n * (size_t)(i + 1) / (size_t)n_tasks;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2")) {
        j->sums[i % 64] += read_avx2(j->p, a, b);
        return;
    }
#elif defined(__aarch64__) && defined(__GNUC__)
    j->sums[i % 64] += read_neon(j->p, a, b);
    return;
#endif
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t k = a; k + 4 <= b; k += 4) {
        s0 += j->p[k];
        s1 += j->p[k + 1];
        s2 += j->p[k + 2];
        s3 += j->p[k + 3];
    }
    j->sums[i % 64] += s0 ^ s1 ^ s2 ^ s3;
}

/* Largest cache of cpu0 in bytes (sysfs), 0 when unknown. */
static uint64_t llc_bytes(void) {
    uint64_t best = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(buf, sizeof buf, f)) {
            char *end;
            uint64_t v = strtoull(buf, &end, 10);
            if (*end == 'K') v <<= 10;
            else if (*end == 'M') v <<= 20;
            else if (*end == 'G') v <<= 30;
            if (v > best) best = v;
        }
        fclose(f);
    }
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void pkv_cli_measure_bandwidth(int threads, pkv_cli_bw *r) {
    memset(r, 0, sizeof *r);
    r->llc_bytes = llc_bytes();
    uint64_t bytes = r->llc_bytes * 4;
    if (bytes < ((uint64_t)512 << 20)) bytes = (uint64_t)512 << 20; /* unknown or small caches */
    if (bytes > ((uint64_t)4 << 30)) bytes = (uint64_t)4 << 30;
    uint64_t *p = malloc(bytes);
    if (!p) return;
    for (size_t i = 0; i < bytes / 8; i++) p[i] = i; /* every page touched before timing */
    pkv_pool *pool = pkv_pool_create(threads);
    bw_job j = {p, bytes / 8, {0}};
    enum { PASSES = 9 };
    double gbps[PASSES];
    for (int k = 0; k < PASSES; k++) {
        double t0 = pkv_time_now();
        pkv_pool_run(pool, pkv_pool_threads(pool), bw_task, &j);
        double t = pkv_time_now() - t0;
        gbps[k] = t > 0 ? (double)bytes / t / 1e9 : 0;
    }
    qsort(gbps, PASSES, sizeof gbps[0], cmp_double);
    r->best_gbps = gbps[PASSES - 1];
    r->median_gbps = gbps[PASSES / 2];
    r->buffer_bytes = bytes;
    r->passes = PASSES;
    pkv_pool_free(pool);
    free(p);
}
