// labels: unit cuda
/* The CUDA backend's host-side logic, which runs without a GPU: the region
 * copy plan (applied on the host, it must copy exactly what the regions say),
 * the attention split count and the token ranges of the splits (every visible
 * token in exactly one split), the alignment checks, the weight-type table, the
 * kernels' dequantizers (cuda-deq.h, compiled here for the host) bit for bit
 * against the reference, the copy kernel's word layout for every alignment, and
 * what the device list and pkv_device_open say about cuda:N on this machine
 * (with no GPU or driver: nothing listed, a reason given, open refused). */
#include "testhelp.h"

#include "base/base.h"
#include "base/quant.h"
#include "device/cuda/cuda-deq.h"
#include "device/cuda/cuda-plan.h"
#include "device/cpu/ref.h"
#include "device/device.h"

#include <math.h>

#include <stdlib.h>

/* Apply a chunk list to host buffers, as the copy kernel does on the device. */
static void apply_chunks(const uint8_t *src, uint8_t *dst, const pkv_cu_chunk *c, size_t n) {
    for (size_t i = 0; i < n; i++) memcpy(dst + c[i].dst_off, src + c[i].src_off, c[i].size);
}

static void test_plan_regions(void) {
    uint64_t rng = 11;
    enum { SRC = 1 << 16, DST = 1 << 17 };
    uint8_t *src = malloc(SRC), *want = malloc(DST), *got = malloc(DST);
    for (size_t i = 0; i < SRC; i++) src[i] = (uint8_t)th_rand(&rng);
    for (int iter = 0; iter < 400; iter++) {
        /* destinations in disjoint slots; some regions continue the previous one in
         * both buffers (they merge), some empty, sizes from 0 to a few chunks */
        pkv_region r[40];
        int nr = 1 + (int)(th_rand(&rng) % 40);
        size_t max_chunk = iter % 3 == 0 ? PKV_CU_CHUNK_BYTES : 1 + th_rand(&rng) % 300;
        size_t slot = DST / (size_t)nr;
        for (int i = 0; i < nr; i++) {
            size_t sz = th_rand(&rng) % 5 == 0 ? 0 : th_rand(&rng) % PKV_MIN(slot, (size_t)2000);
            if (i > 0 && th_rand(&rng) % 3 == 0 && r[i - 1].src_off + r[i - 1].size + sz <= SRC &&
                r[i - 1].dst_off + r[i - 1].size + sz <= (size_t)(i + 1) * slot) {
                r[i].src_off = r[i - 1].src_off + r[i - 1].size; /* continues region i-1 */
                r[i].dst_off = r[i - 1].dst_off + r[i - 1].size;
            } else {
                r[i].src_off = th_rand(&rng) % (SRC - sz + 1);
                r[i].dst_off = (size_t)i * slot + th_rand(&rng) % (slot - sz + 1);
            }
            r[i].size = sz;
        }
        size_t need = pkv_cu_plan_regions(r, (size_t)nr, max_chunk, NULL, 0);
        pkv_cu_chunk *c = malloc((need + 1) * sizeof *c);
        c[need].size = 0xdead; /* must stay untouched */
        CHECK_INT(pkv_cu_plan_regions(r, (size_t)nr, max_chunk, c, need), need);
        CHECK_INT(c[need].size, 0xdead);
        size_t total = 0, bytes = 0;
        for (int i = 0; i < nr; i++) total += r[i].size;
        for (size_t i = 0; i < need; i++) {
            CHECK(c[i].size > 0 && c[i].size <= max_chunk);
            bytes += c[i].size;
        }
        CHECK_INT(bytes, total);
        memset(want, 0, DST);
        memset(got, 0, DST);
        for (int i = 0; i < nr; i++) memcpy(want + r[i].dst_off, src + r[i].src_off, r[i].size);
        apply_chunks(src, got, c, need);
        CHECK_MEM(got, want, DST);
        /* a short array gets the first chunks only, and the count of all */
        if (need > 1) {
            pkv_cu_chunk part[1];
            CHECK_INT(pkv_cu_plan_regions(r, (size_t)nr, max_chunk, part, 1), need);
            CHECK(part[0].src_off == c[0].src_off && part[0].dst_off == c[0].dst_off && part[0].size == c[0].size);
        }
        free(c);
        if (th_failures) break;
    }
    /* merging: three pages that continue each other are one chunk; a gap splits */
    pkv_region run[4] = {{100, 1000, 64}, {164, 1064, 64}, {228, 1128, 0}, {228, 1128, 64}};
    pkv_cu_chunk c[4];
    CHECK_INT(pkv_cu_plan_regions(run, 4, PKV_CU_CHUNK_BYTES, c, 4), 1);
    CHECK(c[0].src_off == 100 && c[0].dst_off == 1000 && c[0].size == 192);
    run[1].dst_off = 1065;
    CHECK_INT(pkv_cu_plan_regions(run, 2, PKV_CU_CHUNK_BYTES, c, 4), 2);
    pkv_region empty[2] = {{0, 0, 0}, {5, 5, 0}};
    CHECK_INT(pkv_cu_plan_regions(empty, 2, 0, NULL, 0), 0);
    /* one region of 1 MiB + 1 in default chunks: 17 pieces, the last of 1 byte */
    pkv_region big = {0, 0, ((size_t)1 << 20) + 1};
    pkv_cu_chunk bc[17];
    CHECK_INT(pkv_cu_plan_regions(&big, 1, 0, bc, 17), 17);
    CHECK_INT(bc[16].size, 1);
    CHECK_INT(bc[16].src_off, (size_t)1 << 20);
    free(src);
    free(want);
    free(got);
}

static void test_attention_split(void) {
    /* decode of one sequence: 32 heads on 132 SMs, 4096 tokens -> ceil(264 / 32) */
    CHECK_INT(pkv_cu_attention_splits(1, 32, 256, 16, 1, 132), 9);
    /* short contexts are not split (fewer than 256 tokens per part) */
    CHECK_INT(pkv_cu_attention_splits(1, 32, 10, 16, 1, 132), 1);
    /* 496 tokens: one part (parts hold at least 256); 512: two */
    CHECK_INT(pkv_cu_attention_splits(1, 4, 31, 16, 1, 132), 1);
    CHECK_INT(pkv_cu_attention_splits(1, 4, 32, 16, 1, 132), 2);
    /* prefill or a batch of 64 sequences fills the GPU without splitting */
    CHECK_INT(pkv_cu_attention_splits(512, 32, 256, 16, 1, 132), 1);
    CHECK_INT(pkv_cu_attention_splits(64, 32, 64 * 256, 16, 64, 132), 1);
    /* long context, few heads: capped */
    CHECK_INT(pkv_cu_attention_splits(1, 1, 100000, 16, 1, 132), PKV_CU_ATT_MAX_SPLIT);
    /* degenerate inputs never give less than 1 */
    CHECK_INT(pkv_cu_attention_splits(1, 1, 0, 16, 1, 0), 1);
    CHECK_INT(pkv_cu_attention_splits(1, 1, 100, 16, 0, 132), 1);
    uint64_t rng = 5;
    for (int it = 0; it < 2000; it++) {
        int n_q = 1 + (int)(th_rand(&rng) % 8), n_head = 1 + (int)(th_rand(&rng) % 64);
        int pages = (int)(th_rand(&rng) % 5000), ps = 1 + (int)(th_rand(&rng) % 64), n_seq = 1 + (int)(th_rand(&rng) % 4);
        int s = pkv_cu_attention_splits(n_q, n_head, pages, ps, n_seq, 1 + (int)(th_rand(&rng) % 200));
        th_checks++;
        if (s < 1 || s > PKV_CU_ATT_MAX_SPLIT) TH_FAIL("splits %d out of range", s);
    }
    /* the split ranges tile [0, len) in order */
    for (int64_t len = 0; len < 300; len += 1 + len / 7)
        for (int n = 1; n <= PKV_CU_ATT_MAX_SPLIT; n += 1 + n / 3) {
            int64_t next = 0;
            for (int sp = 0; sp < n; sp++) {
                int64_t t0, t1;
                pkv_cu_split_range(len, n, sp, &t0, &t1);
                th_checks++;
                if (t0 != next || t1 < t0 || t1 > len) {
                    TH_FAIL("len %lld, %d splits, split %d: [%lld, %lld) after %lld", (long long)len, n, sp,
                            (long long)t0, (long long)t1, (long long)next);
                    return;
                }
                next = t1;
            }
            CHECK_INT(next, len);
        }
}

static void test_align_and_types(void) {
    CHECK_OK(pkv_cu_check_align("cuda:0", "rope", "x", 4100, 4));
    CHECK_OK(pkv_cu_check_align("cuda:0", "rope", "x", 7, 1));
    CHECK_STATUS(pkv_cu_check_align("cuda:0", "rope", "row_stride", 6, 4), PKV_ERR_UNSUPPORTED);
    CHECK_MSG("kernel rope on cuda:0: argument row_stride at byte offset 6");
    CHECK_MSG("multiple of 4");
    /* the CUDA kernels take exactly the weight types the CPU backend does, except the
     * ones with an integer form (q4_1 .. tq2_0: no CUDA kernels written yet), which
     * the dispatcher refuses with PKV_ERR_UNSUPPORTED naming the type and device */
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE_VOID(cpu != NULL);
    int seen[PKV_CU_W_COUNT] = {0};
    for (int t = 0; t < PKV_TYPE_COUNT; t++) {
        int w = pkv_cu_wtype((pkv_type)t);
        th_checks++;
        if ((w >= 0) != (pkv_device_supports_weight(cpu, (pkv_type)t) && !pkv_qblock_decoder((pkv_type)t)))
            TH_FAIL("type %s: cuda code %d, cpu support %d", pkv_type_name((pkv_type)t) ? pkv_type_name((pkv_type)t) : "?",
                    w, pkv_device_supports_weight(cpu, (pkv_type)t));
        if (w >= 0) {
            CHECK(w < PKV_CU_W_COUNT);
            if (w < PKV_CU_W_COUNT) seen[w]++;
        }
    }
    for (int w = 0; w < PKV_CU_W_COUNT; w++) CHECK_INT(seen[w], 1);
    pkv_device_close(cpu);
    char why[256];
    pkv_cu_why(35, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient", why, sizeof why);
    CHECK(strstr(why, "no NVIDIA driver") && strstr(why, "cudaErrorInsufficientDriver"));
    pkv_cu_why(100, "cudaErrorNoDevice", "no CUDA-capable device is detected", why, sizeof why);
    CHECK(strstr(why, "no CUDA GPU") != NULL);
    pkv_cu_why(2, "cudaErrorMemoryAllocation", "out of memory", why, sizeof why);
    CHECK(strstr(why, "protect_shadow_gap=0") != NULL);
    pkv_cu_why(999, "cudaErrorX", "something", why, sizeof why);
    CHECK(strstr(why, "cudaErrorX: something") != NULL);
}

/* cuda:N in the device list and at open, whatever this machine has. */
static void test_registry(void) {
    char names[80][64], why[512] = "";
    int n = 0, n_cuda = 0;
    CHECK_OK(pkv_device_enumerate(0, names, 80, &n, why, sizeof why));
    for (int i = 0; i < n && i < 80; i++) {
        if (strncmp(names[i], "cuda:", 5)) continue;
        char want[16];
        snprintf(want, sizeof want, "cuda:%d", n_cuda);
        CHECK(strcmp(names[i], want) == 0); /* numbered from 0, in order */
        n_cuda++;
    }
    fprintf(stderr, "  %d CUDA device(s); note: %s\n", n_cuda, why[0] ? why : "(none)");
    if (n_cuda == 0) {
        /* no GPU: the list says why, and opening refuses with that reason */
        CHECK(strstr(why, "cuda: ") != NULL);
        CHECK(pkv_device_open("cuda:0", pkv_device_default_params()) == NULL);
        CHECK_MSG("no device 'cuda:0'");
#ifdef PKV_HAVE_CUDA
        CHECK_MSG("no CUDA devices");
        /* the same reason as the list */
        const char *r = strstr(why, "cuda: ");
        if (r) CHECK(strstr(pkv_errmsg(), r + 6) != NULL);
#else
        CHECK_MSG("PKV_CUDA=OFF");
#endif
    } else {
        pkv_device *d = pkv_device_open("cuda:0", pkv_device_default_params());
        CHECK(d != NULL);
        if (d) {
            CHECK_INT(pkv_device_get_caps(d)->kind, PKV_DEVICE_CUDA);
            CHECK(strcmp(pkv_device_name(d), "cuda:0") == 0);
            pkv_device_close(d);
        }
    }
    /* malformed and out-of-range names */
    CHECK(pkv_device_open("cuda:x", pkv_device_default_params()) == NULL);
    CHECK_MSG("no device 'cuda:x'");
    CHECK(pkv_device_open("cuda:", pkv_device_default_params()) == NULL);
    CHECK(pkv_device_open("cuda:-1", pkv_device_default_params()) == NULL);
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", n_cuda);
    CHECK(pkv_device_open(name, pkv_device_default_params()) == NULL);
    CHECK_MSG("no device 'cuda:");
    /* the CLI's device list carries the note */
    if (n_cuda == 0 && th_cli("", false, "devices") == 0) {
        th_checks++;
        if (!strstr(th_out, "cuda: ")) TH_FAIL("pagekv devices does not say why there is no CUDA device:\n%s", th_out);
    }
#ifdef PKV_HAVE_CUDA
    /* PKV_CUDA_DISABLE=1 hides every CUDA device and says so */
    if (th_cli("PKV_CUDA_DISABLE=1", false, "devices") == 0) {
        th_checks++;
        if (strstr(th_out, "cuda:0") || !strstr(th_out, "disabled by PKV_CUDA_DISABLE=1"))
            TH_FAIL("PKV_CUDA_DISABLE=1 not honoured:\n%s", th_out);
    }
#endif
}

/* The dequantizers the kernels use, run on the host: equal to the reference
 * bit for bit on random blocks (random bytes everywhere but the scales, which get
 * random finite values; and blocks from the reference quantizer). */
static void test_deq(void) {
    uint64_t rng = 99;
    enum { COLS = 1024 };
    static float x[COLS], ref[COLS];
    static uint8_t row[COLS * 4];
    for (int t = 0; t < PKV_TYPE_COUNT; t++) {
        const int code = pkv_cu_wtype((pkv_type)t);
        if (code < 0) continue;
        const size_t be = pkv_type_block_elems((pkv_type)t), bb = pkv_type_block_bytes((pkv_type)t);
        const size_t rb = pkv_type_row_bytes((pkv_type)t, COLS);
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 0) {
                for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)th_rand(&rng);
                for (size_t b = 0; be > 1 && b < COLS / be; b++) { /* finite scales */
                    uint8_t *blk = row + b * bb;
                    uint16_t h1 = pkv_f32_to_f16(th_randf(&rng)), h2 = pkv_f32_to_f16(th_randf(&rng) * 0.1f);
                    size_t o = (pkv_type)t == PKV_TYPE_Q6_K ? 208 : 0;
                    blk[o] = (uint8_t)h1, blk[o + 1] = (uint8_t)(h1 >> 8);
                    if ((pkv_type)t == PKV_TYPE_Q4_K || (pkv_type)t == PKV_TYPE_Q5_K)
                        blk[2] = (uint8_t)h2, blk[3] = (uint8_t)(h2 >> 8);
                }
                if ((pkv_type)t == PKV_TYPE_F32)
                    for (int i = 0; i < COLS; i++) {
                        float f = th_randf(&rng) * 100.0f;
                        memcpy(row + 4 * i, &f, 4);
                    }
            } else {
                for (int i = 0; i < COLS; i++) x[i] = th_randf(&rng) * (float)(1 + i % 7);
                CHECK_OK(pkv_quantize_row((pkv_type)t, x, row, COLS));
            }
            CHECK_OK(pkv_dequantize_row((pkv_type)t, row, ref, COLS));
            int bad = -1, nonzero = 0;
            for (int k = 0; k < COLS; k++) {
                const float g = pkv_cu_deq(code, row, k);
                nonzero += g != 0.0f;
                if (bad < 0 && memcmp(&g, &ref[k], 4) != 0) bad = k;
            }
            th_checks++;
            if (bad >= 0)
                TH_FAIL("%s pass %d: element %d: cuda %.9g, reference %.9g", pkv_type_name((pkv_type)t), pass, bad,
                        pkv_cu_deq(code, row, bad), ref[bad]);
            /* 32 at a time (the decode kernel's unit) */
            int bad32 = -1;
            for (int sb = 0; sb < COLS / 32; sb++) {
                float y[32];
                pkv_cu_deq32(code, row, sb, y);
                for (int j = 0; j < 32 && bad32 < 0; j++)
                    if (memcmp(&y[j], &ref[32 * sb + j], 4) != 0) bad32 = 32 * sb + j;
            }
            th_checks++;
            if (bad32 >= 0)
                TH_FAIL("%s pass %d: deq32 differs from the reference at element %d", pkv_type_name((pkv_type)t), pass,
                        bad32);
            CHECK(nonzero > COLS / 2);
        }
    }
}

/* The copy kernel's split of a chunk into a byte head, aligned words and a byte
 * tail covers every byte once, with words aligned at both ends. */
static void test_copy_layout(void) {
    static const uint64_t sizes[] = {0, 1, 2, 3, 4, 5, 15, 16, 17, 31, 32, 33, 63, 64, 100, 4096, 65536 + 7};
    for (uint64_t sa = 0; sa < 32; sa++)
        for (uint64_t da = 0; da < 32; da++)
            for (size_t si = 0; si < PKV_ARRAY_LEN(sizes); si++) {
                const uint64_t s = 0x10000 + sa, d = 0x7f0000 + da, n = sizes[si];
                unsigned wb;
                uint64_t head, words;
                pkv_cu_copy_layout(s, d, n, &wb, &head, &words);
                const uint64_t tail0 = head + words * wb;
                const unsigned want = (s ^ d) % 16 == 0 ? 16 : (s ^ d) % 4 == 0 ? 4 : 1;
                th_checks++;
                /* head < one word, tail < one word, words aligned in both buffers */
                bool ok = wb == want && head <= n && tail0 <= n && n - tail0 < wb + (wb == 1 ? n : 0);
                if (ok && wb == 1) ok = head == 0 && words == 0;
                if (ok && wb > 1) ok = head < wb && (words == 0 || ((s + head) % wb == 0 && (d + head) % wb == 0));
                if (ok && wb > 1 && n >= 2 * wb) ok = words > 0; /* a chunk of two words uses words */
                if (!ok) {
                    TH_FAIL("copy layout s%%32 %llu d%%32 %llu n %llu: wb %u head %llu words %llu", (unsigned long long)sa,
                            (unsigned long long)da, (unsigned long long)n, wb, (unsigned long long)head,
                            (unsigned long long)words);
                    return;
                }
            }
}

/* The attention kernel's algorithm on the host with its index code
 * (pkv_cu_att_len, pkv_cu_att_slot, pkv_cu_split_range): per (query, head,
 * split) PKV_CU_ATT_WARPS online softmaxes over interleaved tokens, merged as
 * the block merges its warps, then the splits merged as k_att_combine does;
 * against the reference on tables with forks, bad page ids, bad sequences and
 * lengths past the pages. What it cannot check is the GPU code around it. */
static void emulate_attention(const pkv_k_attention_args *a, const float *q, const float *k, const float *v,
                              const int32_t *meta, int n_split, float *out) {
    enum { W = PKV_CU_ATT_WARPS, MAXS = PKV_CU_ATT_MAX_SPLIT };
    static float acc[W][PKV_CU_ATT_MAX_D], part[MAXS][PKV_CU_ATT_MAX_D + 2];
    for (int i = 0; i < a->n_q; i++)
        for (int h = 0; h < a->n_head; h++) {
            int32_t lo;
            const int64_t len = pkv_cu_att_len(meta, a->n_q, a->n_seq, a->meta_pages, a->page_size, i, &lo);
            const int kvh = h / (a->n_head / a->n_kv);
            const float *qh = q + ((size_t)i * a->n_head + h) * a->dk;
            for (int sp = 0; sp < n_split; sp++) {
                int64_t t0, t1;
                pkv_cu_split_range(len, n_split, sp, &t0, &t1);
                float m[W], l[W];
                for (int w = 0; w < W; w++) {
                    m[w] = -INFINITY, l[w] = 0;
                    memset(acc[w], 0, sizeof acc[w]);
                    for (int64_t t = t0 + w; t < t1; t += W) {
                        const int64_t sl = pkv_cu_att_slot(meta, a->n_q, a->n_seq, lo, t, a->page_size, a->n_pages,
                                                           a->n_kv, kvh);
                        if (sl < 0) continue;
                        float dot = 0;
                        for (int d = 0; d < a->dk; d++) dot += qh[d] * k[sl * a->dk + d];
                        const float score = dot * a->scale, mn = fmaxf(m[w], score);
                        const float corr = expf(m[w] - mn), p = expf(score - mn);
                        l[w] = l[w] * corr + p;
                        for (int d = 0; d < a->dv; d++) acc[w][d] = acc[w][d] * corr + p * v[sl * a->dv + d];
                        m[w] = mn;
                    }
                }
                float M = -INFINITY, L = 0, f[W];
                for (int w = 0; w < W; w++) M = fmaxf(M, m[w]);
                for (int w = 0; w < W; w++) {
                    f[w] = m[w] == -INFINITY ? 0.0f : expf(m[w] - M);
                    L += l[w] * f[w];
                }
                part[sp][0] = M;
                part[sp][1] = L;
                for (int d = 0; d < a->dv; d++) {
                    float x = 0;
                    for (int w = 0; w < W; w++) x += acc[w][d] * f[w];
                    part[sp][2 + d] = x;
                }
            }
            float *o = out + ((size_t)i * a->n_head + h) * a->dv;
            float M = -INFINITY, L = 0;
            for (int sp = 0; sp < n_split; sp++) M = fmaxf(M, part[sp][0]);
            for (int sp = 0; sp < n_split; sp++)
                if (part[sp][0] != -INFINITY) L += part[sp][1] * expf(part[sp][0] - M);
            for (int d = 0; d < a->dv; d++) {
                float x = 0;
                for (int sp = 0; sp < n_split; sp++)
                    if (part[sp][0] != -INFINITY) x += part[sp][2 + d] * expf(part[sp][0] - M);
                o[d] = M == -INFINITY ? 0.0f : x / L;
            }
        }
}

static void test_attention_emulated(void) {
    uint64_t rng = 23;
    for (int it = 0; it < 60; it++) {
        pkv_k_attention_args a;
        memset(&a, 0, sizeof a);
        a.k_type = a.v_type = PKV_TYPE_F32;
        a.n_kv = 1 + (int)(th_rand(&rng) % 3);
        a.n_head = a.n_kv * (1 + (int)(th_rand(&rng) % 3));
        a.dk = 1 + (int)(th_rand(&rng) % 70);
        a.dv = 1 + (int)(th_rand(&rng) % 70);
        a.page_size = 1 + (int)(th_rand(&rng) % 40);
        a.n_pages = 2 + (int)(th_rand(&rng) % 30);
        a.n_seq = 1 + (int)(th_rand(&rng) % 4);
        a.n_q = 1 + (int)(th_rand(&rng) % 5);
        a.scale = 1.0f / sqrtf((float)a.dk);
        int32_t meta[256];
        int m = 0;
        for (int i = 0; i < a.n_q; i++) /* mostly valid sequences, sometimes not */
            meta[m++] = th_rand(&rng) % 9 == 0 ? a.n_seq + 1 : (int32_t)(th_rand(&rng) % (uint64_t)a.n_seq);
        int32_t *q_len = meta + m;
        m += a.n_q;
        int32_t *indptr = meta + m;
        indptr[0] = 0;
        for (int s = 0; s < a.n_seq; s++) indptr[s + 1] = indptr[s] + (int32_t)(th_rand(&rng) % 8);
        m += a.n_seq + 1;
        a.meta_pages = indptr[a.n_seq];
        for (int p = 0; p < a.meta_pages; p++) /* shared pages (forks) and a few bad ids */
            meta[m++] = th_rand(&rng) % 13 == 0 ? a.n_pages + 5 : (int32_t)(th_rand(&rng) % (uint64_t)a.n_pages);
        for (int i = 0; i < a.n_q; i++) {
            int s = meta[i] < a.n_seq ? meta[i] : 0;
            int cap = (indptr[s + 1] - indptr[s]) * a.page_size;
            q_len[i] = th_rand(&rng) % 7 == 0 ? cap + 5 : th_rand(&rng) % 11 == 0 ? -3 : (int32_t)(th_rand(&rng) % (uint64_t)(cap + 1));
        }
        const size_t slots = (size_t)a.n_pages * a.page_size * a.n_kv;
        float *q = malloc((size_t)a.n_q * a.n_head * a.dk * 4), *k = malloc(slots * a.dk * 4),
              *v = malloc(slots * a.dv * 4), *ref = malloc((size_t)a.n_q * a.n_head * a.dv * 4),
              *got = malloc((size_t)a.n_q * a.n_head * a.dv * 4);
        for (size_t i = 0; i < (size_t)a.n_q * a.n_head * a.dk; i++) q[i] = th_randf(&rng) * 2;
        for (size_t i = 0; i < slots * a.dk; i++) k[i] = th_randf(&rng);
        for (size_t i = 0; i < slots * a.dv; i++) v[i] = th_randf(&rng);
        pkv_ref_attention(&a, q, k, v, meta, ref);
        static const int splits[] = {1, 2, 3, 7, 64};
        for (size_t si = 0; si < PKV_ARRAY_LEN(splits); si++) {
            emulate_attention(&a, q, k, v, meta, splits[si], got);
            const size_t no = (size_t)a.n_q * a.n_head * a.dv;
            double e = th_nmse(ref, got, no), worst = 0;
            for (size_t i = 0; i < no; i++) worst = fmax(worst, fabs((double)ref[i] - got[i]));
            th_checks++;
            /* zeros must be zeros (skipped queries); the rest within f32 rounding */
            if (!(e <= 1e-10) || worst > 1e-4)
                TH_FAIL("attention emulation, case %d, %d splits: nmse %g, worst %g", it, splits[si], e, worst);
        }
        free(q);
        free(k);
        free(v);
        free(ref);
        free(got);
        if (th_failures) return;
    }
}

int main(void) {
    test_plan_regions();
    test_deq();
    test_copy_layout();
    test_attention_split();
    test_attention_emulated();
    test_align_and_types();
    test_registry();
    CHECK_INT(pkv_alloc_live(), 0);
    return th_done();
}
