// labels: kv
/* Context shift: after removing a range, the moved tokens' cached K (re-rotated on
 * the device by the position delta) equals K rotated from scratch at the new
 * positions by an independent double-precision RoPE, within 2e-6 absolute for f32
 * and 2e-3 for f16 (one rounding of the K dtype per rotation, values in [-1, 1]);
 * V and the tokens before the range are bit-identical. Both RoPE styles, rotary
 * dims < head size, a non-default frequency base and scale, a layer with its own
 * base and scale (gemma3), a layer with its own rotary width of which only the first
 * pair turns (Gemma 4's proportional RoPE: rope_n_rot, rope_n_pairs), two devices. */
#include "kv-testlib.h"

#define NT 40
#define HD 8
#define NROT 4

#define NL 3

static double g_raw[NT][NL][2 * HD]; /* unrotated K per token, per layer: [heads][HD] */
static float g_v[NT][NL][16];
static const int n_heads[NL] = {2, 1, 2};
static const pkv_type dt[NL] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_F32};

/* layer 2 rotates all HD dims' pairs, but only its first pair turns */
static void rotated(double *out, int il, int t, double pos, bool neox, double base, double scale) {
    for (int h = 0; h < n_heads[il]; h++) {
        const double *raw = &g_raw[t][il][h * HD];
        double *o = out + h * HD;
        memcpy(o, raw, HD * sizeof(double));
        kt_rope_ref(o, HD, il == 2 ? HD : NROT, neox, base, scale, pos);
        for (int i = 1; il == 2 && i < HD / 2; i++) { /* the pairs that stay */
            const int a = neox ? i : 2 * i, b = neox ? i + HD / 2 : 2 * i + 1;
            o[a] = raw[a];
            o[b] = raw[b];
        }
    }
}

static const double base[NL] = {500000.0, 10000.0, 500000.0}, scale[NL] = {0.5, 1.0, 0.5};

static void run(kt_env *e, bool neox) {
    pkv_kv_layer_desc L[NL];
    pkv_kv_shard_desc sh0[2] = {{e->cpu, e->cpu, 0, 1}, {e->cpu1, e->cpu1, 1, 1}};
    L[0] = (pkv_kv_layer_desc){2, HD, 4, PKV_TYPE_F32, PKV_TYPE_F32, 2, sh0, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0};
    /* layer 1 has its own RoPE (gemma3's sliding layers: base 10000, no scaling) */
    L[1] = (pkv_kv_layer_desc){1, HD, 8, PKV_TYPE_F16, PKV_TYPE_F16, 0, NULL, 0, 10000.0f, 1.0f, 0, 0, {0}, 0, 0, false, false, 0};
    /* layer 2: all HD dims in pairs, the first turning (Gemma 4's full layers) */
    L[2] = (pkv_kv_layer_desc){2, HD, 4, PKV_TYPE_F32, PKV_TYPE_F32, 0, NULL, 0, 0, 0, 0, 0, {0}, HD, 1, false, false, 0};
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = NL;
    p.layers = L;
    p.device = e->cpu1;
    p.page_size = 8;
    p.n_pages = 16;
    p.rope_n_rot = NROT;
    p.rope_neox = neox;
    p.rope_freq_base = 500000.0f;
    p.rope_freq_scale = 0.5f;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    uint64_t rng = neox ? 11 : 12;
    int32_t seq, rows[NT], pos[NT];
    for (int t = 0; t < NT; t++) pos[t] = 1000 + t;
    CHECK_OK(pkv_kv_seq_create(c, 0, &seq));
    CHECK_OK(pkv_kv_append(c, seq, NT, NULL, pos, rows));
    for (int t = 0; t < NT; t++)
        for (int il = 0; il < NL; il++) {
            double k[2 * HD];
            float kf[2 * HD];
            for (int i = 0; i < n_heads[il] * HD; i++) g_raw[t][il][i] = th_randf(&rng);
            rotated(k, il, t, pos[t], neox, base[il], scale[il]);
            for (int i = 0; i < n_heads[il] * HD; i++) kf[i] = (float)k[i];
            int dv = il == 0 ? 2 * 4 : 8;
            for (int i = 0; i < dv; i++) g_v[t][il][i] = kt_round(dt[il], th_randf(&rng));
            CHECK_OK(kt_write_row(c, il, 0, rows[t], kf));
            CHECK_OK(kt_write_row(c, il, 1, rows[t], g_v[t][il]));
        }
    float before[NL][NT * 16];
    for (int il = 0; il < NL; il++) CHECK_OK(kt_read_seq(c, seq, il, 0, before[il]));

    /* remove [5, 17): 23 tokens move down by 12; then re-position the tail by +7 */
    int start = 5, nr = 12, delta2 = 7, start2 = 20;
    CHECK_OK(pkv_kv_shift(c, seq, start, nr, -nr));
    CHECK_INT(pkv_kv_seq_len(c, seq), NT - nr);
    CHECK_OK(pkv_kv_shift(c, seq, start2, 0, delta2));
    int n = NT - nr;
    int32_t npos[NT];
    CHECK_OK(pkv_kv_seq_tokens(c, seq, 0, n, NULL, npos));
    double worst[NL] = {0, 0, 0};
    for (int il = 0; il < NL; il++) {
        float k[NT * 16], v[NT * 16];
        int kd = n_heads[il] * HD, vd = 8;
        CHECK_OK(kt_read_seq(c, seq, il, 0, k));
        CHECK_OK(kt_read_seq(c, seq, il, 1, v));
        for (int t = 0; t < n; t++) {
            int src = t < start ? t : t + nr;
            int want_pos = 1000 + src + (t >= start ? -nr : 0) + (t >= start2 ? delta2 : 0);
            CHECK_INT(npos[t], want_pos);
            if (t < start) {
                CHECK_MEM(&k[t * kd], &before[il][t * kd], (size_t)kd * 4);
            } else {
                double ref[2 * HD];
                rotated(ref, il, src, want_pos, neox, base[il], scale[il]);
                for (int i = 0; i < kd; i++) worst[il] = fmax(worst[il], fabs(ref[i] - k[t * kd + i]));
            }
            CHECK_MEM(&v[t * vd], g_v[src][il], (size_t)vd * 4);
        }
    }
    fprintf(stderr, "%s: worst |K - K_ref| f32 %.3g, f16 %.3g, f32 one pair of four turning %.3g\n",
            neox ? "neox" : "normal", worst[0], worst[1], worst[2]);
    CHECK(worst[0] <= 2e-6);
    CHECK(worst[1] <= 2e-3);
    CHECK(worst[2] <= 2e-6);
    CHECK(worst[0] > 0 || worst[1] > 0); /* something was rotated and compared */
    pkv_kv_cache_free(c);
}

int main(void) {
    kt_env e;
    if (!kt_open(&e)) return th_skip("cannot open cpu and cpu:1");
    int64_t live0 = pkv_alloc_live();
    run(&e, false);
    run(&e, true);
    CHECK_INT(pkv_alloc_live(), live0);
    kt_close(&e);
    return th_done();
}
