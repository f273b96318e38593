/* The reference kernels (see ref.h): readable loops in double precision. */
#include "device/cpu/ref.h"

#include "base/base.h"
#include "base/quant.h"

#include <math.h>
#include <string.h>

pkv_status pkv_ref_matmul(const void *w, pkv_type wt, int64_t rows, int64_t cols, const float *x, int64_t n,
                          float *y) {
    const size_t rb = pkv_type_row_bytes(wt, (size_t)cols);
    if (rb == 0 || wt == PKV_TYPE_I32)
        return pkv_err(PKV_ERR_UNSUPPORTED, "reference matmul: weight type %s with %lld columns",
                       pkv_type_name(wt) ? pkv_type_name(wt) : "(unknown)", (long long)cols);
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++)
            y[i * rows + r] = (float)pkv_dot_ref(wt, (const uint8_t *)w + (size_t)r * rb, x + i * cols, cols);
    return PKV_OK;
}

pkv_status pkv_ref_get_rows(const void *w, pkv_type wt, int64_t n_vocab, int64_t cols, const int32_t *ids,
                            int64_t n, float *out) {
    const size_t rb = pkv_type_row_bytes(wt, (size_t)cols);
    if (rb == 0 || wt == PKV_TYPE_I32)
        return pkv_err(PKV_ERR_UNSUPPORTED, "reference get_rows: weight type %s with %lld columns",
                       pkv_type_name(wt) ? pkv_type_name(wt) : "(unknown)", (long long)cols);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            memset(out + i * cols, 0, (size_t)cols * sizeof(float));
            continue;
        }
        pkv_status s = pkv_dequantize_row(wt, (const uint8_t *)w + (size_t)ids[i] * rb, out + i * cols, cols);
        if (s) return s;
    }
    return PKV_OK;
}

void pkv_ref_rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t row_len, float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * row_len;
        double ss = 0;
        for (int64_t j = 0; j < row_len; j++) ss += (double)xr[j] * xr[j];
        const double inv = 1.0 / sqrt(ss / (double)row_len + (double)eps);
        for (int64_t j = 0; j < row_len; j++) y[r * row_len + j] = (float)((double)xr[j] * inv * (double)w[j]);
    }
}

void pkv_ref_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t row_len,
                        float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * row_len;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < row_len; j++) mean += xr[j];
        mean /= (double)row_len;
        for (int64_t j = 0; j < row_len; j++) var += ((double)xr[j] - mean) * ((double)xr[j] - mean);
        const double inv = 1.0 / sqrt(var / (double)row_len + (double)eps);
        for (int64_t j = 0; j < row_len; j++)
            y[r * row_len + j] =
                (float)(((double)xr[j] - mean) * inv * (w ? (double)w[j] : 1.0) + (b ? (double)b[j] : 0.0));
    }
}

void pkv_ref_add(const float *a, const float *b, float *y, int64_t n, int64_t b_len) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)((double)a[i] + (double)b[i % b_len]);
}

void pkv_ref_swiglu(const float *g, const float *u, float *y, int64_t n) { pkv_ref_glu(g, u, y, n, false); }

void pkv_ref_glu(const float *g, const float *u, float *y, int64_t n, bool gelu) {
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i];
        /* gelu as x * sigmoid(2t), t = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh t) without its cancellation */
        const double t = 0.7978845608028654 * (x + 0.044715 * x * x * x), e = exp(-2.0 * fabs(t));
        const double act = gelu ? (t >= 0 ? x / (1.0 + e) : x * e / (1.0 + e)) : x / (1.0 + exp(-x));
        y[i] = (float)(act * (double)u[i]);
    }
}

void pkv_ref_swiglu_oai(const float *g, const float *u, float *y, int64_t n, float alpha, float limit) {
    for (int64_t i = 0; i < n; i++) {
        const double x = fmin((double)g[i], (double)limit), v = fmax(-(double)limit, fmin((double)u[i], (double)limit));
        y[i] = (float)(x / (1.0 + exp(-(double)alpha * x)) * (v + 1.0));
    }
}

void pkv_ref_scale(float *x, int64_t n, float scale) {
    if (scale == 0) return; /* 0 means no multiply (get_rows' contract) */
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * scale;
}

/* Element i of a row of type t: f32, f16, or a quantized KV type (i counts
 * elements across blocks of 32). */
static double ld(const void *p, pkv_type t, size_t i) {
    if (pkv_kv_type_quant(t)) {
        float blk[32];
        const size_t bb = pkv_type_block_bytes(t);
        pkv_dequantize_row(t, (const uint8_t *)p + i / 32 * bb, blk, 32);
        return blk[i % 32];
    }
    if (t == PKV_TYPE_F16) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)p + 2 * i, 2);
        return pkv_f16_to_f32(h);
    }
    float f;
    memcpy(&f, (const uint8_t *)p + 4 * i, 4);
    return f;
}

static void st(void *p, pkv_type t, size_t i, double v) {
    if (t == PKV_TYPE_F16) {
        uint16_t h = pkv_f32_to_f16((float)v);
        memcpy((uint8_t *)p + 2 * i, &h, 2);
    } else {
        float f = (float)v;
        memcpy((uint8_t *)p + 4 * i, &f, 4);
    }
}

/* The angle of pair i at position pos (kernel-list.h), YaRN's mix included. */
static double rope_theta(const pkv_k_rope_args *a, const float *ff, int32_t pos, int i) {
    const double p = pow((double)a->freq_base, -2.0 * i / (double)a->n_rot) / (ff ? (double)ff[i] : 1.0);
    if (a->ext_factor == 0) return (double)pos * (double)a->freq_scale * p;
    const double y = ((double)i - (double)a->corr_lo) / fmax(0.001, (double)a->corr_hi - (double)a->corr_lo);
    const double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * (double)a->ext_factor;
    return (double)pos * p * ((double)a->freq_scale * (1.0 - mix) + mix);
}

static double rope_mscale(const pkv_k_rope_args *a) { return a->mscale > 0 ? (double)a->mscale : 1.0; }

/* A quantized row: each head is dequantized, rotated in double, rounded to f32
 * and quantized again (kernel-list.h). */
static void ref_rope_quant(const pkv_k_rope_args *a, const float *ff, uint8_t *xr, int32_t pos) {
    const int half = a->n_rot / 2;
    const size_t hbytes = pkv_type_row_bytes(a->dtype, (size_t)a->head_dim);
    float *f = pkv_malloc((size_t)a->head_dim * sizeof(float));
    if (!f) return; /* the reference runs on the host, outside any failure path worth testing */
    for (int h = 0; h < a->n_heads; h++) {
        uint8_t *hp = xr + (size_t)h * hbytes;
        pkv_dequantize_row(a->dtype, hp, f, a->head_dim);
        for (int i = 0; i < half; i++) {
            const double theta = rope_theta(a, ff, pos, i);
            const double c = cos(theta) * rope_mscale(a), s = sin(theta) * rope_mscale(a);
            const int i0 = a->neox ? i : 2 * i, i1 = a->neox ? i + half : 2 * i + 1;
            const double x0 = f[i0], x1 = f[i1];
            f[i0] = (float)(x0 * c - x1 * s);
            f[i1] = (float)(x0 * s + x1 * c);
        }
        pkv_quantize_row(a->dtype, f, hp, a->head_dim);
    }
    pkv_free(f);
}

void pkv_ref_rope(const pkv_k_rope_args *a, void *x, const int32_t *pos, const int32_t *rows, const float *ff) {
    const int half = a->n_rot / 2;
    if (pkv_kv_type_quant(a->dtype)) {
        const int64_t max_rows = rows ? a->max_rows : a->n_rows;
        for (int64_t r = 0; r < a->n_rows; r++) {
            const int64_t row = rows ? rows[r] : r;
            if (row >= 0 && row < max_rows) ref_rope_quant(a, ff, (uint8_t *)x + (size_t)row * a->row_stride, pos[r]);
        }
        return;
    }
    const int64_t max_rows = rows ? a->max_rows : a->n_rows;
    for (int64_t r = 0; r < a->n_rows; r++) {
        const int64_t row = rows ? rows[r] : r;
        if (row < 0 || row >= max_rows) continue;
        uint8_t *xr = (uint8_t *)x + (size_t)row * a->row_stride;
        for (int h = 0; h < a->n_heads; h++) {
            const size_t base = (size_t)h * (size_t)a->head_dim;
            for (int i = 0; i < half; i++) {
                const double theta = rope_theta(a, ff, pos[r], i);
                const double c = cos(theta) * rope_mscale(a), s = sin(theta) * rope_mscale(a);
                const size_t i0 = base + (size_t)(a->neox ? i : 2 * i);
                const size_t i1 = base + (size_t)(a->neox ? i + half : 2 * i + 1);
                const double x0 = ld(xr, a->dtype, i0), x1 = ld(xr, a->dtype, i1);
                st(xr, a->dtype, i0, x0 * c - x1 * s);
                st(xr, a->dtype, i1, x0 * s + x1 * c);
            }
        }
    }
}

void pkv_ref_set_rows(const pkv_k_set_rows_args *a, const void *src, void *dst, const int32_t *idx) {
    for (int64_t i = 0; i < a->n; i++) {
        if (idx[i] < 0 || idx[i] >= a->dst_rows) continue;
        const uint8_t *s = (const uint8_t *)src + (size_t)i * a->src_stride;
        uint8_t *d = (uint8_t *)dst + (size_t)idx[i] * a->dst_stride;
        if (pkv_kv_type_quant(a->dst_type)) {
            float *f = pkv_malloc((size_t)a->row_elems * sizeof(float));
            if (!f) continue;
            memcpy(f, s, (size_t)a->row_elems * sizeof(float));
            pkv_quantize_row(a->dst_type, f, d, a->row_elems);
            pkv_free(f);
            continue;
        }
        for (int64_t j = 0; j < a->row_elems; j++) st(d, a->dst_type, (size_t)j, ld(s, PKV_TYPE_F32, (size_t)j));
    }
}

/* The first d elements of row `slot` (rows of `stride` bytes) of a K or V pool of
 * type t, as floats. */
static void ref_row(const void *pool, pkv_type t, size_t slot, size_t stride, int d, float *out) {
    const uint8_t *r = (const uint8_t *)pool + slot * stride;
    if (pkv_kv_type_quant(t)) {
        pkv_dequantize_row(t, r, out, d);
        return;
    }
    for (int i = 0; i < d; i++) out[i] = (float)ld(r, t, (size_t)i);
}

void pkv_ref_attention(const pkv_k_attention_args *a, const float *q, const void *k, const void *v,
                       const int32_t *meta, float *out) {
    pkv_ref_attention_sinks(a, q, k, v, meta, NULL, out);
}

void pkv_ref_attention_sinks(const pkv_k_attention_args *a, const float *q, const void *k, const void *v,
                             const int32_t *meta, const float *sinks, float *out) {
    pkv_ref_attention_win(a, q, k, v, meta, sinks, NULL, out);
}

void pkv_ref_attention_win(const pkv_k_attention_args *a, const float *q, const void *k, const void *v,
                           const int32_t *meta, const float *sinks, const int32_t *q_win, float *out) {
    const int32_t *q_seq = meta, *q_len = meta + a->n_q, *indptr = meta + 2 * a->n_q;
    const int32_t *pages = indptr + a->n_seq + 1;
    const int group = a->n_head / a->n_kv;
    /* v_in_k (MLA): each V row is the head of its K row */
    const void *vp = a->v_in_k ? k : v;
    const pkv_type vt = a->v_in_k ? a->k_type : a->v_type;
    const size_t krow = pkv_type_row_bytes(a->k_type, (size_t)a->dk),
                 vrow = a->v_in_k ? krow : pkv_type_row_bytes(vt, (size_t)a->dv);
    int64_t max_len = 0;
    for (int i = 0; i < a->n_q; i++) max_len = PKV_MAX(max_len, (int64_t)q_len[i]);
    /* The reference may allocate: it runs on the host, outside any failure path
     * worth testing; without memory it writes zeros. */
    double *score = pkv_malloc((size_t)PKV_MAX(max_len, 1) * sizeof(double));
    double *acc = pkv_malloc((size_t)a->dv * sizeof(double));
    float *row = pkv_malloc((size_t)PKV_MAX(a->dk, a->dv) * sizeof(float));
    for (int i = 0; i < a->n_q; i++) {
        for (int h = 0; h < a->n_head; h++) {
            float *o = out + ((size_t)i * a->n_head + h) * (size_t)a->dv;
            for (int d = 0; d < a->dv; d++) o[d] = 0;
            const int s = q_seq[i];
            if (!score || !acc || !row || s < 0 || s >= a->n_seq) continue;
            const int32_t lo = indptr[s], hi = indptr[s + 1];
            if (lo < 0 || hi < lo || hi > a->meta_pages) continue;
            const int kvh = h / group;
            const float *qh = q + ((size_t)i * a->n_head + h) * (size_t)a->dk;
            double mx = -INFINITY;
            /* a sliding window sees the last `window` tokens only, counted back
             * from q_win[i] when given; a chunked layer its own chunk (kernel-list.h) */
            const int64_t t_lo = pkv_att_first(q_len[i], q_win ? q_win[i] : q_len[i], a->window, a->chunk);
            for (int64_t t = 0; t < q_len[i]; t++) {
                score[t] = NAN; /* NAN marks a skipped token */
                if (t < t_lo) continue;
                const int64_t pi = t / a->page_size;
                if (pi >= hi - lo) continue;
                const int32_t page = pages[lo + pi];
                if (page < 0 || page >= a->n_pages) continue;
                const size_t slot = ((size_t)page * a->page_size + (size_t)(t % a->page_size)) * a->n_kv + kvh;
                ref_row(k, a->k_type, slot, krow, a->dk, row);
                double dot = 0;
                for (int d = 0; d < a->dk; d++) dot += (double)qh[d] * (double)row[d];
                score[t] = dot * (double)a->scale;
                if (a->softcap > 0) score[t] = (double)a->softcap * tanh(score[t] / (double)a->softcap);
                if (score[t] > mx) mx = score[t];
            }
            if (mx == -INFINITY) continue; /* no token seen: zeros, sink or not */
            /* a sink is one more logit whose value is zero: it only adds to the sum */
            const double sink = sinks ? (double)sinks[h] : -INFINITY;
            if (sink > mx) mx = sink;
            double sum = sinks ? exp(sink - mx) : 0;
            for (int64_t t = 0; t < q_len[i]; t++)
                if (!isnan(score[t])) sum += exp(score[t] - mx);
            for (int d = 0; d < a->dv; d++) acc[d] = 0;
            for (int64_t t = 0; t < q_len[i]; t++) {
                if (isnan(score[t])) continue;
                const int32_t page = pages[lo + t / a->page_size];
                const size_t slot = ((size_t)page * a->page_size + (size_t)(t % a->page_size)) * a->n_kv + kvh;
                ref_row(vp, vt, slot, vrow, a->dv, row);
                const double p = exp(score[t] - mx);
                for (int d = 0; d < a->dv; d++) acc[d] += p * (double)row[d];
            }
            for (int d = 0; d < a->dv; d++) o[d] = (float)(acc[d] / sum);
        }
    }
    pkv_free(score);
    pkv_free(acc);
    pkv_free(row);
}

void pkv_ref_softmax(const float *x, float *y, int64_t n_rows, int64_t row_len) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * row_len;
        double mx = -INFINITY, sum = 0;
        /* a compare, not fmax: GCC 12 for aarch64 fails (internal compiler
         * error) vectorizing an fmax reduction; NaNs are skipped either way */
        for (int64_t j = 0; j < row_len; j++) mx = (double)xr[j] > mx ? (double)xr[j] : mx;
        for (int64_t j = 0; j < row_len; j++) sum += exp((double)xr[j] - mx);
        for (int64_t j = 0; j < row_len; j++) y[r * row_len + j] = (float)(exp((double)xr[j] - mx) / sum);
    }
}

void pkv_ref_argmax(const float *x, int32_t *out, int64_t n_rows, int64_t row_len) {
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t best = 0;
        for (int64_t j = 1; j < row_len; j++)
            if (x[r * row_len + j] > x[r * row_len + best]) best = j;
        out[r] = (int32_t)best;
    }
}

/* ------------------------------------------------------ recurrent layers */

/* Sequence s of a recurrent kernel's meta: its token range [*lo, *hi) and slot.
 * Returns 0 when the range is bad (skip), 1 when the slot is bad (zero rows), 2
 * when both are good. */
static int ref_seq(const int32_t *meta, int n_seq, int64_t n_tok, int64_t n_slots, int s, int64_t *lo, int64_t *hi,
                   int64_t *slot) {
    *lo = meta[s];
    *hi = meta[s + 1];
    *slot = meta[n_seq + 1 + s];
    if (*lo < 0 || *hi < *lo || *hi > n_tok) return 0;
    return *slot >= 0 && *slot < n_slots ? 2 : 1;
}

void pkv_ref_ssm_conv(const pkv_k_ssm_conv_args *a, const float *x, const float *w, float *y, void *state,
                      const int32_t *meta) {
    const int64_t C = a->channels;
    const int K = a->d_conv;
    for (int s = 0; s < a->n_seq; s++) {
        int64_t lo, hi, slot;
        const int ok = ref_seq(meta, a->n_seq, a->n_tok, a->n_slots, s, &lo, &hi, &slot);
        if (ok == 0) continue;
        if (ok == 1) {
            memset(y + lo * C, 0, (size_t)((hi - lo) * C) * sizeof(float));
            continue;
        }
        float *st = (float *)(void *)((uint8_t *)state + (size_t)slot * a->state_stride); /* [K-1][C] */
        for (int64_t c = 0; c < C; c++) {
            /* win: the last K-1 inputs of this channel, oldest first; x[t][c] is read
             * before y[t][c] is written, so y may alias x */
            float win[PKV_SSM_CONV_MAX];
            for (int j = 0; j < K - 1; j++) win[j] = st[(size_t)j * C + c];
            const float *wc = w + c * K;
            for (int64_t t = lo; t < hi; t++) {
                const float xin = x[t * C + c];
                double acc = (double)wc[K - 1] * xin;
                for (int j = 0; j < K - 1; j++) acc += (double)wc[j] * win[j];
                for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
                win[K - 2] = xin;
                y[t * C + c] = (float)(a->silu ? acc / (1.0 + exp(-acc)) : acc);
            }
            for (int j = 0; j < K - 1; j++) st[(size_t)j * C + c] = win[j];
        }
    }
}

void pkv_ref_delta_net(const pkv_k_delta_net_args *a, const void *q, const void *k, const void *v, const float *g,
                       const float *beta, float *out, void *state, const int32_t *meta) {
    const int dk = a->d_k, dv = a->d_v, hv = a->n_v_heads, hk = a->n_k_heads;
    const size_t qs = a->q_stride ? a->q_stride : (size_t)hk * dk * 4, ks = a->k_stride ? a->k_stride : (size_t)hk * dk * 4;
    const size_t vs = a->v_stride ? a->v_stride : (size_t)hv * dv * 4;
    const double scale = a->scale != 0 ? (double)a->scale : 1.0 / sqrt((double)dk);
    /* Columns j of a head's state evolve independently given the token's k, q, g,
     * beta and v_j: one column at a time, in double within a token. */
    double *col = pkv_malloc((size_t)dk * sizeof(double));
    if (!col) return; /* the reference runs on the host, outside any failure path worth testing */
    for (int s = 0; s < a->n_seq; s++) {
        int64_t lo, hi, slot;
        const int ok = ref_seq(meta, a->n_seq, a->n_tok, a->n_slots, s, &lo, &hi, &slot);
        if (ok == 0) continue;
        if (ok == 1) {
            memset(out + lo * hv * dv, 0, (size_t)((hi - lo) * hv * dv) * sizeof(float));
            continue;
        }
        for (int h = 0; h < hv; h++) {
            const int kh = a->grouped ? h / (hv / hk) : h % hk;
            float *S = (float *)(void *)((uint8_t *)state + (size_t)slot * a->state_stride) + (size_t)h * dk * dv;
            for (int64_t t = lo; t < hi; t++) {
                const float *qt = (const float *)(const void *)((const uint8_t *)q + (size_t)t * qs) + (size_t)kh * dk;
                const float *kt = (const float *)(const void *)((const uint8_t *)k + (size_t)t * ks) + (size_t)kh * dk;
                const float *vt = (const float *)(const void *)((const uint8_t *)v + (size_t)t * vs) + (size_t)h * dv;
                const double decay = exp((double)g[t * hv + h]), b = beta[t * hv + h];
                for (int j = 0; j < dv; j++) {
                    double kv = 0;
                    for (int i = 0; i < dk; i++) {
                        col[i] = (double)S[(size_t)i * dv + j] * decay;
                        kv += col[i] * kt[i];
                    }
                    const double d = b * ((double)vt[j] - kv);
                    double o = 0;
                    for (int i = 0; i < dk; i++) {
                        col[i] += (double)kt[i] * d;
                        o += col[i] * qt[i];
                        S[(size_t)i * dv + j] = (float)col[i];
                    }
                    out[(t * hv + h) * dv + j] = (float)(o * scale);
                }
            }
        }
    }
    pkv_free(col);
}

void pkv_ref_ssm_scan(const pkv_k_ssm_scan_args *a, const void *x, const void *B, const void *C, const float *dt,
                      const float *dt_bias, const float *A, const float *D, float *y, void *state, const int32_t *meta) {
    const int nh = a->n_head, hd = a->head_dim, ng = a->n_group, ds = a->d_state;
    const size_t xs = a->x_stride ? a->x_stride : (size_t)nh * hd * 4;
    const size_t bs = a->B_stride ? a->B_stride : (size_t)ng * ds * 4, cs = a->C_stride ? a->C_stride : (size_t)ng * ds * 4;
    for (int s = 0; s < a->n_seq; s++) {
        int64_t lo, hi, slot;
        const int ok = ref_seq(meta, a->n_seq, a->n_tok, a->n_slots, s, &lo, &hi, &slot);
        if (ok == 0) continue;
        if (ok == 1) {
            memset(y + lo * nh * hd, 0, (size_t)((hi - lo) * nh * hd) * sizeof(float));
            continue;
        }
        for (int h = 0; h < nh; h++) {
            const int g = h / (nh / ng);
            float *S = (float *)(void *)((uint8_t *)state + (size_t)slot * a->state_stride) + (size_t)h * hd * ds;
            for (int64_t t = lo; t < hi; t++) {
                const float *xt = (const float *)(const void *)((const uint8_t *)x + (size_t)t * xs) + (size_t)h * hd;
                const float *Bt = (const float *)(const void *)((const uint8_t *)B + (size_t)t * bs) + (size_t)g * ds;
                const float *Ct = (const float *)(const void *)((const uint8_t *)C + (size_t)t * cs) + (size_t)g * ds;
                const double v = (double)dt[t * nh + h] + dt_bias[h];
                const double d = v > 20.0 ? v : log1p(exp(v)), decay = exp(d * A[h]);
                for (int i = 0; i < hd; i++) {
                    const double dx = d * xt[i];
                    double o = 0;
                    for (int n = 0; n < ds; n++) {
                        const double sv = (double)S[(size_t)i * ds + n] * decay + dx * Bt[n];
                        S[(size_t)i * ds + n] = (float)sv;
                        o += sv * Ct[n];
                    }
                    if (D) o += (double)D[h] * xt[i];
                    y[(t * nh + h) * hd + i] = (float)o;
                }
            }
        }
    }
}

void pkv_ref_l2_norm(const pkv_k_l2_norm_args *a, const void *x, void *y) {
    const size_t row = (size_t)(a->n_heads * a->head_dim) * 4;
    const size_t xs = a->x_stride ? a->x_stride : row, ys = a->y_stride ? a->y_stride : row;
    for (int64_t t = 0; t < a->n; t++)
        for (int64_t h = 0; h < a->n_heads; h++) {
            const float *xr = (const float *)(const void *)((const uint8_t *)x + (size_t)t * xs) + h * a->head_dim;
            float *yr = (float *)(void *)((uint8_t *)y + (size_t)t * ys) + h * a->head_dim;
            double ss = 0;
            for (int64_t i = 0; i < a->head_dim; i++) ss += (double)xr[i] * xr[i];
            const double inv = 1.0 / sqrt(ss + (double)a->eps);
            for (int64_t i = 0; i < a->head_dim; i++) yr[i] = (float)((double)xr[i] * inv);
        }
}

void pkv_ref_unary(pkv_unary_op op, const float *x, float *y, int64_t n, const float *bias, int64_t bias_len,
                   const float *mul, int64_t mul_len) {
    for (int64_t i = 0; i < n; i++) {
        double v = (double)x[i] + (bias ? (double)bias[i % bias_len] : 0.0);
        switch (op) {
        case PKV_UNARY_SIGMOID: v = 1.0 / (1.0 + exp(-v)); break;
        case PKV_UNARY_SOFTPLUS: v = v > 20.0 ? v : log1p(exp(v)); break;
        case PKV_UNARY_SILU: v = v / (1.0 + exp(-v)); break;
        case PKV_UNARY_GELU: {
            /* x * sigmoid(2t) = 0.5 x (1 + tanh t), without tanh's cancellation for t < 0 */
            const double t = 0.7978845608028654 * (v + 0.044715 * v * v * v), e = exp(-2.0 * fabs(t));
            v = t >= 0 ? v / (1.0 + e) : v * e / (1.0 + e);
            break;
        }
        case PKV_UNARY_GELU_ERF: v = 0.5 * v * erfc(-v * 0.7071067811865476); break;
        case PKV_UNARY_RELU_SQR: v = v > 0 ? v * v : 0.0; break;
        case PKV_UNARY_ID: break;
        }
        y[i] = (float)(mul ? v * (double)mul[i % mul_len] : v);
    }
}

/* The index of the largest v[e] over e < n with ok[e] (ties: the lowest e); -1: none. */
static int32_t moe_best(const double *v, const bool *ok, int32_t n) {
    int32_t best = -1;
    for (int32_t e = 0; e < n; e++)
        if (ok[e] && (best < 0 || v[e] > v[best])) best = e;
    return best;
}

/* One token: l [X] in, sel and w [K] out. */
static void moe_route_row(const pkv_k_moe_route_args *a, const float *l, const float *bias, int32_t *sel, float *w) {
    const int32_t X = a->n_expert, K = a->k, G = a->n_group;
    double p[4096], sv[4096];
    bool ok[4096];
    float mxf = l[0]; /* (a compare, not fmax into a double: aarch64 gcc 12 -O3 failed to vectorize that) */
    for (int32_t e = 1; e < X; e++)
        if (l[e] > mxf) mxf = l[e];
    const double mx = mxf;
    double sum = 0;
    if (a->gating == 0)
        for (int32_t e = 0; e < X; e++) sum += exp((double)l[e] - mx);
    for (int32_t e = 0; e < X; e++) {
        p[e] = a->gating == 0 ? exp((double)l[e] - mx) / sum : a->gating == 2 ? 1.0 / (1.0 + exp(-(double)l[e])) : l[e];
        p[e] = (float)p[e]; /* the probabilities as f32, as a device holds them */
        sv[e] = a->sel_logits ? (double)l[e] : (double)(float)(p[e] + (bias ? bias[e] : 0.0f));
        ok[e] = true;
    }
    if (G > 1) { /* group-limited: mask every expert outside the best n_group_used groups */
        const int32_t per = X / G;
        double gs[64];
        bool gok[64], keep[64];
        for (int32_t g = 0; g < G; g++) {
            const int32_t b0 = moe_best(sv + g * per, ok + g * per, per);
            ok[g * per + b0] = false;
            const int32_t b1 = moe_best(sv + g * per, ok + g * per, per);
            ok[g * per + b0] = true;
            gs[g] = sv[g * per + b0] + sv[g * per + b1];
            gok[g] = true, keep[g] = false;
        }
        for (int32_t i = 0; i < a->n_group_used; i++) {
            const int32_t g = moe_best(gs, gok, G);
            gok[g] = false, keep[g] = true;
        }
        for (int32_t e = 0; e < X; e++) ok[e] = keep[e / per];
    }
    for (int32_t k = 0; k < K; k++) {
        sel[k] = moe_best(sv, ok, X);
        ok[sel[k]] = false;
    }
    double wd[64], ws = 0;
    for (int32_t k = 0; k < K; k++) /* gating 1: exp relative to the best, a softmax over the chosen */
        wd[k] = a->gating == 1 ? exp(p[sel[k]] - p[sel[0]]) : p[sel[k]];
    if (a->gating == 1 || a->norm_w) {
        for (int32_t k = 0; k < K; k++) ws += wd[k];
        if (a->gating != 1) ws = fmax(ws, 6.103515625e-5); /* llama.cpp's floor: the smallest normal f16 */
        for (int32_t k = 0; k < K; k++) wd[k] /= ws;
    }
    const double sc = a->w_scale != 0.0f ? a->w_scale : 1.0;
    for (int32_t k = 0; k < K; k++) w[k] = (float)(wd[k] * sc);
}

void pkv_ref_moe_route(const pkv_k_moe_route_args *a, const float *logits, const float *bias, int32_t *sel, float *w,
                       int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; t++)
        moe_route_row(a, logits + t * a->n_expert, bias, sel + t * a->k, w + t * a->k);
}

void pkv_ref_moe_combine(const pkv_k_moe_combine_args *a, float *out, const float *y, const int32_t *rows, const float *w) {
    for (int64_t i = 0; i < a->n; i++) {
        if (rows[i] < 0 || rows[i] >= a->out_rows) continue;
        float *o = out + (int64_t)rows[i] * a->cols;
        const float *yi = y + i * a->cols;
        for (int64_t c = 0; c < a->cols; c++) o[c] = (a->add ? o[c] : 0.0f) + w[i] * yi[c];
    }
}
