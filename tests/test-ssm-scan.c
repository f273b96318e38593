// labels: unit kernels vulkan
/* Mamba-2's selective scan, kernel ssm_scan (kernel-list.h).
 *   1. The reference (cpu/ref.c) and the CPU device (every path) against the scan's "matrix"
 *      (SSD) form computed naively in double here: for a head, with L_t the sum of
 *      d_r A over the sequence's tokens r <= t,
 *        y_t = sum_n C_t[n] (e^{L_t} S0[n] + sum_{s<=t} e^{L_t - L_s} d_s x_s B_s[n]) + D x_t
 *      and the final state likewise: no recurrence, so an error in the kernels'
 *      update order or decay shows. Several sequences of different lengths in
 *      scrambled slots (random start states), 1 and several groups, with and
 *      without D, x/B/C as column ranges of one row.
 *   2. On the CPU (every instruction-set path this CPU has), bitwise: a sequence's
 *      tokens in one call equal the same tokens cut into chunks over several calls (mixed with the other sequences in
 *      another order each call); 1 thread equals 3.
 *   3. Guards: a bad slot gives zero rows and leaves the pool alone, a bad range
 *      writes nothing; bad shapes are refused with a message naming the problem.
 *   4. vulkan:0 against the CPU (tolerance), and its own chunking bitwise.
 * Exit 77 (skipped) when everything on the CPU passed but no Vulkan device opens. */
#include "recurrent-testlib.h"

#include "cpu-paths.h"

#include "base/base.h"
#include "device/cpu/ref.h"
#include "device/device.h"

#define MAX_SEQ 4

static uint64_t g_rng = 4747;

typedef struct {
    int nh, hd, ng, ds, n_seq;
    int len[MAX_SEQ];
    bool skip; /* with D */
    /* made by problem_make */
    int64_t n, start[MAX_SEQ];
    int n_slots, slot_of[MAX_SEQ];
    size_t row, xd, bd, slot, stride; /* floats: row [x | B | C | 2 pad], a slot, between slots */
    float *in, *dt, *par, *pool;       /* in [n][row], dt [n][nh], par: dt_bias | A | D, pool */
} problem;

static const problem cases[] = {
    {.nh = 4, .hd = 16, .ng = 2, .ds = 32, .n_seq = 3, .len = {6, 1, 17}, .skip = true},
    {.nh = 3, .hd = 8, .ng = 1, .ds = 13, .n_seq = 2, .len = {33, 4}, .skip = false},
    {.nh = 6, .hd = 12, .ng = 3, .ds = 24, .n_seq = 4, .len = {2, 9, 1, 5}, .skip = true},
    {.nh = 2, .hd = 64, .ng = 1, .ds = 128, .n_seq = 2, .len = {12, 3}, .skip = true},
    /* head_dim above the CPU's 64 rows a call and Vulkan's 64 invocations a group */
    {.nh = 2, .hd = 70, .ng = 2, .ds = 20, .n_seq = 2, .len = {9, 2}, .skip = false},
};
#define N_CASES ((int)PKV_ARRAY_LEN(cases))

static void problem_make(problem *p) {
    p->n = 0;
    for (int s = 0; s < p->n_seq; s++) {
        p->start[s] = p->n;
        p->n += p->len[s];
    }
    p->n_slots = p->n_seq + 2;
    /* scrambled distinct slots: 3 s + 1 mod n_slots when 3 does not divide n_slots */
    for (int s = 0; s < p->n_seq; s++) p->slot_of[s] = (s * 3 + 1) % p->n_slots;
    if (p->n_slots % 3 == 0)
        for (int s = 0; s < p->n_seq; s++) p->slot_of[s] = p->n_slots - 1 - s;
    p->xd = (size_t)p->nh * p->hd;
    p->bd = (size_t)p->ng * p->ds;
    p->row = p->xd + 2 * p->bd + 2;
    p->slot = p->xd * p->ds;
    p->stride = p->slot + 3;
    const size_t pool = (size_t)(p->n_slots - 1) * p->stride + p->slot;
    p->in = malloc(sizeof(float) * (size_t)p->n * p->row);
    p->dt = malloc(sizeof(float) * (size_t)(p->n * p->nh));
    p->par = malloc(sizeof(float) * 3 * (size_t)p->nh);
    p->pool = malloc(sizeof(float) * pool);
    for (size_t i = 0; i < (size_t)p->n * p->row; i++) p->in[i] = th_randf(&g_rng);
    for (int64_t i = 0; i < p->n * p->nh; i++) /* every 5th above 20: softplus's identity branch */
        p->dt[i] = i % 5 == 2 ? 21.0f + th_randf(&g_rng) : 3.0f * th_randf(&g_rng);
    for (int h = 0; h < p->nh; h++) {
        p->par[h] = th_randf(&g_rng);
        p->par[p->nh + h] = -expf(th_randf(&g_rng));
        p->par[2 * p->nh + h] = th_randf(&g_rng);
    }
    for (size_t i = 0; i < pool; i++) p->pool[i] = 0.5f * th_randf(&g_rng);
}

static void problem_free(problem *p) {
    free(p->in);
    free(p->dt);
    free(p->par);
    free(p->pool);
}

static size_t pool_floats(const problem *p) { return (size_t)(p->n_slots - 1) * p->stride + p->slot; }

/* ----------------------------------------------------------- naive math */

/* The matrix form over the whole problem in double: y [n][xd], the final pool. */
static void naive(const problem *p, double *y, double *pool) {
    const size_t pf = pool_floats(p);
    for (size_t i = 0; i < pf; i++) pool[i] = p->pool[i];
    double *L = malloc(sizeof(double) * (size_t)(p->n + 1)), *d = malloc(sizeof(double) * (size_t)p->n);
    for (int s = 0; s < p->n_seq; s++)
        for (int h = 0; h < p->nh; h++) {
            const int g = h / (p->nh / p->ng), len = p->len[s];
            const float *A = p->par + p->nh, *D = p->par + 2 * p->nh;
            double *S0 = pool + (size_t)p->slot_of[s] * p->stride + (size_t)h * p->hd * p->ds;
            L[0] = 0; /* L[t + 1]: the log-decay through the sequence's token t */
            for (int t = 0; t < len; t++) {
                const double v = (double)p->dt[(p->start[s] + t) * p->nh + h] + p->par[h];
                d[t] = v > 20 ? v : log(1 + exp(v));
                L[t + 1] = L[t] + d[t] * A[h];
            }
            for (int t = 0; t <= len; t++) /* t == len: the final state */
                for (int i = 0; i < p->hd; i++) {
                    double yi = 0;
                    for (int n = 0; n < p->ds; n++) {
                        const int tt = t < len ? t : len - 1;
                        double st = exp(L[tt + 1]) * S0[(size_t)i * p->ds + n];
                        for (int u = 0; u <= tt; u++) {
                            const float *r = p->in + (size_t)(p->start[s] + u) * p->row;
                            const double xu = r[(size_t)h * p->hd + i], bu = r[p->xd + (size_t)g * p->ds + n];
                            st += exp(L[tt + 1] - L[u + 1]) * d[u] * xu * bu;
                        }
                        if (t == len) {
                            S0[(size_t)i * p->ds + n] = st; /* after the last output row was made */
                            continue;
                        }
                        const float *r = p->in + (size_t)(p->start[s] + t) * p->row;
                        yi += r[p->xd + p->bd + (size_t)g * p->ds + n] * st;
                    }
                    if (t < len) {
                        const float xi = p->in[(size_t)(p->start[s] + t) * p->row + (size_t)h * p->hd + i];
                        y[(size_t)(p->start[s] + t) * p->xd + (size_t)h * p->hd + i] = yi + (p->skip ? D[h] * xi : 0);
                    }
                }
        }
    free(L);
    free(d);
}

static double nmse_d(const double *ref, const float *got, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (ref[i] - got[i]) * (ref[i] - got[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

/* ------------------------------------------------------ running on a device */

typedef struct {
    int s;
    int64_t t0, t1; /* the sequence's tokens [t0, t1) */
} piece;

static pkv_k_ssm_scan_args scan_args(const problem *p, pkv_buffer *bin, pkv_buffer *bdt, pkv_buffer *bpar,
                                     pkv_buffer *by, pkv_buffer *bpool, pkv_buffer *bm, int64_t n, int n_seq) {
    const size_t rs = p->row * 4;
    return (pkv_k_ssm_scan_args){.x = pkv_tref_make(bin, 0),
                                 .B = pkv_tref_make(bin, p->xd * 4),
                                 .C = pkv_tref_make(bin, (p->xd + p->bd) * 4),
                                 .x_stride = rs,
                                 .B_stride = rs,
                                 .C_stride = rs,
                                 .dt = pkv_tref_make(bdt, 0),
                                 .dt_bias = pkv_tref_make(bpar, 0),
                                 .A = pkv_tref_make(bpar, (size_t)p->nh * 4),
                                 .D = p->skip ? pkv_tref_make(bpar, (size_t)p->nh * 8) : (pkv_tref){0},
                                 .y = pkv_tref_make(by, 0),
                                 .state = pkv_tref_make(bpool, 0),
                                 .state_stride = p->stride * 4,
                                 .n_slots = p->n_slots,
                                 .meta = pkv_tref_make(bm, 0),
                                 .n_tok = n,
                                 .n_seq = n_seq,
                                 .n_head = p->nh,
                                 .head_dim = p->hd,
                                 .n_group = p->ng,
                                 .d_state = p->ds};
}

/* Run the problem on dev as a series of calls; call c holds calls[c][0 .. n_pieces[c]).
 * Inputs of a call are gathered in piece order, outputs scattered back. y [n][xd] and
 * pool (the final pool) are the caller's. */
static bool run_calls(pkv_device *dev, const problem *p, piece (*calls)[MAX_SEQ], const int *n_pieces, int n_calls,
                      float *y_all, float *pool) {
    const size_t pf = pool_floats(p);
    pkv_buffer *bpool = up(dev, p->pool, pf * 4), *bpar = up(dev, p->par, (size_t)p->nh * 12);
    bool ok = bpool && bpar;
    for (int c = 0; ok && c < n_calls; c++) {
        const int ns = n_pieces[c];
        int64_t n = 0;
        int32_t meta[2 * MAX_SEQ + 1];
        meta[0] = 0;
        for (int i = 0; i < ns; i++) {
            n += calls[c][i].t1 - calls[c][i].t0;
            meta[i + 1] = (int32_t)n;
            meta[ns + 1 + i] = p->slot_of[calls[c][i].s];
        }
        float *in = malloc(sizeof(float) * (size_t)n * p->row), *dt = malloc(sizeof(float) * (size_t)(n * p->nh));
        float *y = malloc(sizeof(float) * (size_t)n * p->xd);
        int64_t r = 0;
        for (int i = 0; i < ns; i++)
            for (int64_t t = calls[c][i].t0; t < calls[c][i].t1; t++, r++) {
                const int64_t src = p->start[calls[c][i].s] + t;
                memcpy(in + r * (int64_t)p->row, p->in + src * (int64_t)p->row, sizeof(float) * p->row);
                memcpy(dt + r * p->nh, p->dt + src * p->nh, sizeof(float) * (size_t)p->nh);
            }
        pkv_buffer *bin = up(dev, in, (size_t)n * p->row * 4), *bdt = up(dev, dt, (size_t)(n * p->nh) * 4);
        pkv_buffer *by = up(dev, NULL, (size_t)n * p->xd * 4), *bm = up(dev, meta, (size_t)(2 * ns + 1) * 4);
        ok = bin && bdt && by && bm;
        if (ok) {
            pkv_k_ssm_scan_args a = scan_args(p, bin, bdt, bpar, by, bpool, bm, n, ns);
            pkv_status s = pkv_k_ssm_scan(dev, &a);
            if (s) TH_FAIL("ssm_scan on %s: %s", pkv_device_name(dev), pkv_errmsg());
            ok = !s && down(by, y, (size_t)n * p->xd * 4);
        }
        r = 0;
        for (int i = 0; ok && i < ns; i++)
            for (int64_t t = calls[c][i].t0; t < calls[c][i].t1; t++, r++)
                memcpy(y_all + (p->start[calls[c][i].s] + t) * (int64_t)p->xd, y + r * (int64_t)p->xd,
                       sizeof(float) * p->xd);
        pkv_buffer_free(bin);
        pkv_buffer_free(bdt);
        pkv_buffer_free(by);
        pkv_buffer_free(bm);
        free(in);
        free(dt);
        free(y);
    }
    ok = ok && down(bpool, pool, pf * 4);
    pkv_buffer_free(bpool);
    pkv_buffer_free(bpar);
    if (!ok) TH_FAIL("run on %s failed: %s", pkv_device_name(dev), pkv_errmsg());
    return ok;
}

/* Every sequence whole in one call, in order. */
static bool run_whole(pkv_device *dev, const problem *p, float *y, float *pool) {
    piece calls[1][MAX_SEQ];
    int np = p->n_seq;
    for (int s = 0; s < p->n_seq; s++) calls[0][s] = (piece){s, 0, p->len[s]};
    return run_calls(dev, p, calls, &np, 1, y, pool);
}

/* Each sequence cut at pseudo-random points into up to 4 calls, the sequences of a
 * call in reverse order on odd calls. */
static bool run_chunked(pkv_device *dev, const problem *p, float *y, float *pool) {
    piece calls[4][MAX_SEQ];
    int np[4] = {0, 0, 0, 0};
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < p->n_seq; k++) {
            const int s = c % 2 ? p->n_seq - 1 - k : k, len = p->len[s];
            const int64_t t0 = (int64_t)len * c / 4 + (c > 0 && len > 4 ? 1 : 0);
            const int64_t t1 = c == 3 ? len : (int64_t)len * (c + 1) / 4 + (len > 4 ? 1 : 0);
            if (t1 > t0) calls[c][np[c]++] = (piece){s, t0, t1};
        }
    return run_calls(dev, p, calls, np, 4, y, pool);
}

/* ------------------------------------------------------------------ tests */

static void test_cpu(pkv_device *cpu, pkv_device *cpu3) {
    for (int ci = 0; ci < N_CASES; ci++) {
        problem p = cases[ci];
        problem_make(&p);
        const size_t ny = (size_t)p.n * p.xd, pf = pool_floats(&p);
        double *wy = malloc(sizeof(double) * ny), *wpool = malloc(sizeof(double) * pf);
        float *ry = malloc(sizeof(float) * ny), *rpool = malloc(sizeof(float) * pf);
        float *y = malloc(sizeof(float) * ny), *pool = malloc(sizeof(float) * pf);
        float *y2 = malloc(sizeof(float) * ny), *pool2 = malloc(sizeof(float) * pf);
        naive(&p, wy, wpool);
        /* the reference, whole */
        int32_t meta[2 * MAX_SEQ + 1];
        meta[0] = 0;
        for (int s = 0; s < p.n_seq; s++) {
            meta[s + 1] = (int32_t)(p.start[s] + p.len[s]);
            meta[p.n_seq + 1 + s] = p.slot_of[s];
        }
        memcpy(rpool, p.pool, pf * 4);
        pkv_k_ssm_scan_args a = scan_args(&p, NULL, NULL, NULL, NULL, NULL, NULL, p.n, p.n_seq);
        pkv_ref_ssm_scan(&a, p.in, p.in + p.xd, p.in + p.xd + p.bd, p.dt, p.par, p.par + p.nh,
                         p.skip ? p.par + 2 * p.nh : NULL, ry, rpool, meta);
        const double e_ry = nmse_d(wy, ry, ny), e_rs = nmse_d(wpool, rpool, pf);
        fprintf(stderr, "  case %d: ref vs matrix form: y %.3g, state %.3g\n", ci, e_ry, e_rs);
        CHECK(e_ry < 1e-13 && e_rs < 1e-13);
        if (run_whole(cpu, &p, y, pool)) {
            const double e_y = nmse_d(wy, y, ny), e_s = nmse_d(wpool, pool, pf);
            fprintf(stderr, "  case %d: cpu vs matrix form: y %.3g, state %.3g\n", ci, e_y, e_s);
            CHECK(e_y < 1e-12 && e_s < 1e-12); /* f32 rounding: ~1e-14 */
            if (run_chunked(cpu, &p, y2, pool2)) {
                CHECK(bits_equal(y, y2, ny));
                CHECK(bits_equal(pool, pool2, pf));
            }
            if (run_whole(cpu3, &p, y2, pool2)) {
                CHECK(bits_equal(y, y2, ny));
                CHECK(bits_equal(pool, pool2, pf));
            }
        }
        free(wy);
        free(wpool);
        free(ry);
        free(rpool);
        free(y);
        free(pool);
        free(y2);
        free(pool2);
        problem_free(&p);
    }
}

static void test_guards(pkv_device *dev) {
    problem p = cases[0];
    problem_make(&p);
    /* sequence 0 valid, sequence 1 with a slot past the pool, sequence 2 with a range
     * past n_tok (not run at all) */
    const int64_t n = p.n, s1 = p.start[1], s2 = p.start[2];
    int32_t meta[7] = {0, (int32_t)s1, (int32_t)s2, (int32_t)n + 5, p.slot_of[0], p.n_slots + 1, p.slot_of[2]};
    const size_t ny = (size_t)n * p.xd, pf = pool_floats(&p);
    float *y = malloc(sizeof(float) * ny), *pool = malloc(sizeof(float) * pf);
    for (size_t i = 0; i < ny; i++) y[i] = 42.0f; /* so that zeros and untouched rows both show */
    pkv_buffer *bin = up(dev, p.in, (size_t)n * p.row * 4), *bdt = up(dev, p.dt, (size_t)(n * p.nh) * 4);
    pkv_buffer *bpar = up(dev, p.par, (size_t)p.nh * 12), *by = up(dev, y, ny * 4);
    pkv_buffer *bpool = up(dev, p.pool, pf * 4), *bm = up(dev, meta, sizeof meta);
    REQUIRE_VOID(bin && bdt && bpar && by && bpool && bm);
    pkv_k_ssm_scan_args a = scan_args(&p, bin, bdt, bpar, by, bpool, bm, n, 3);
    CHECK_OK(pkv_k_ssm_scan(dev, &a));
    if (down(by, y, ny * 4) && down(bpool, pool, pf * 4)) {
        bool zeros = true, untouched = true;
        for (size_t i = (size_t)s1 * p.xd; i < (size_t)s2 * p.xd; i++) zeros &= y[i] == 0.0f;
        for (size_t i = (size_t)s2 * p.xd; i < ny; i++) untouched &= y[i] == 42.0f;
        CHECK(zeros);     /* the bad slot's token */
        CHECK(untouched); /* the bad range's tokens */
        for (int sl = 0; sl < p.n_slots; sl++) /* only sequence 0's slot changed */
            CHECK(bits_equal(pool + (size_t)sl * p.stride, p.pool + (size_t)sl * p.stride, p.slot) ==
                  (sl != p.slot_of[0]));
    } else {
        TH_FAIL("guards: read back: %s", pkv_errmsg());
    }
    /* shapes the dispatcher refuses, each with a message naming the problem */
    pkv_k_ssm_scan_args bad[6] = {a, a, a, a, a, a};
    bad[0].n_group = 3;
    bad[1].d_state = 0;
    bad[2].B_stride = 6;
    bad[3].state_stride = p.slot * 4 - 4;
    bad[4].n_slots = p.n_slots + 1;
    bad[5].D = pkv_tref_make(bpar, (size_t)p.nh * 8 + 4);
    static const char *const msg[6] = {"n_head 4 is not a multiple of n_group 3", "d_state 0", "B stride 6",
                                       "state stride", "argument state needs", "argument D needs"};
    for (int i = 0; i < 6; i++) {
        CHECK_STATUS(pkv_k_ssm_scan(dev, &bad[i]), PKV_ERR_INVALID);
        CHECK_MSG(msg[i]);
    }
    pkv_buffer *all[] = {bin, bdt, bpar, by, bpool, bm};
    for (size_t i = 0; i < PKV_ARRAY_LEN(all); i++) pkv_buffer_free(all[i]);
    free(y);
    free(pool);
    problem_free(&p);
}

static void test_device_vs_cpu(pkv_device *dev, pkv_device *cpu) {
    for (int ci = 0; ci < N_CASES; ci++) {
        problem p = cases[ci];
        problem_make(&p);
        const size_t ny = (size_t)p.n * p.xd, pf = pool_floats(&p);
        float *yc = malloc(sizeof(float) * ny), *pc = malloc(sizeof(float) * pf);
        float *yd = malloc(sizeof(float) * ny), *pd = malloc(sizeof(float) * pf);
        float *y2 = malloc(sizeof(float) * ny), *p2 = malloc(sizeof(float) * pf);
        if (run_whole(cpu, &p, yc, pc) && run_whole(dev, &p, yd, pd)) {
            const double e1 = th_nmse(yc, yd, ny), e2 = th_nmse(pc, pd, pf);
            fprintf(stderr, "  case %d: %s vs cpu: y %.3g, state %.3g\n", ci, pkv_device_name(dev), e1, e2);
            CHECK(e1 < 1e-10 && e2 < 1e-10);
            if (run_chunked(dev, &p, y2, p2)) {
                CHECK(bits_equal(yd, y2, ny));
                CHECK(bits_equal(pd, p2, pf));
            }
        }
        free(yc);
        free(pc);
        free(yd);
        free(pd);
        free(y2);
        free(p2);
        problem_free(&p);
    }
}

int main(void) {
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    pkv_device_params dp3 = pkv_device_default_params();
    dp3.n_threads = 3;
    pkv_device *cpu3 = pkv_device_open("cpu", dp3);
    REQUIRE(cpu && cpu3);
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    for (int i = 0; i < np; i++) { /* read by the CPU device at each kernel call */
        setenv("PKV_CPU_PATH", paths[i], 1);
        fprintf(stderr, "cpu path %s\n", paths[i]);
        test_cpu(cpu, cpu3);
    }
    unsetenv("PKV_CPU_PATH");
    test_guards(cpu);

    pkv_device *vk = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!vk) {
        char msg[512];
        snprintf(msg, sizeof msg, "no Vulkan device (vulkan:0: %s); the CPU parts passed", pkv_errmsg());
        pkv_device_close(cpu);
        pkv_device_close(cpu3);
        return th_failures ? th_done() : th_skip(msg);
    }
    fprintf(stderr, "vulkan:0 = %s\n", pkv_device_get_caps(vk)->description);
    test_device_vs_cpu(vk, cpu);
    test_guards(vk);
    pkv_device_close(vk);
    pkv_device_close(cpu);
    pkv_device_close(cpu3);
    return th_done();
}
