/* The device kernels: each kernel's arguments (its contract, with shapes and
 * types), and PKV_KERNELS, the one list of kernels from which the backend slots
 * (pkv_kernel_ops), the checked entry points pkv_k_<name> (kernels.c) and the
 * `pagekv check` rows (check-kernels.c) are made. docs/kernels.md, "Adding a
 * kernel", gives the steps. Included by device.h only. */
#ifndef PKV_KERNEL_LIST_H
#define PKV_KERNEL_LIST_H

/* y = x · Wᵀ. W: wtype [rows][cols] (rows of pkv_type_row_bytes(wtype, cols)
 * bytes; cols a multiple of the type's block). x: f32 [n][cols]. y: f32 [n][rows]. */
typedef struct pkv_k_matmul_args {
    pkv_tref w;
    pkv_type wtype;
    int64_t rows, cols;
    pkv_tref x;
    pkv_tref y;
    int64_t n;
} pkv_k_matmul_args;

/* out[i] = dequant(W[ids[i]]) * scale (scale 0 = 1: no multiply at all, so the
 * rows are exact copies). W: wtype [n_vocab][cols]. ids: i32 [n], each in
 * [0, n_vocab) (the kernel writes zeros for an id out of range). out: f32 [n][cols].
 * scale: Gemma's embedding scale sqrt(n_embd), one f32 multiply per element after
 * the dequantization. */
typedef struct pkv_k_get_rows_args {
    pkv_tref w;
    pkv_type wtype;
    int64_t n_vocab, cols;
    pkv_tref ids;
    pkv_tref out;
    int64_t n;
    float scale;
} pkv_k_get_rows_args;

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w. x, y: f32 [n_rows][row_len]; w: f32
 * [row_len]. In place ok. Used with row_len = head_dim for per-head Q/K norms. */
typedef struct pkv_k_rms_norm_args {
    pkv_tref x, w, y;
    int64_t n_rows, row_len;
    float eps;
} pkv_k_rms_norm_args;

/* Layer norm (LayerNorm with affine weight and bias: Whisper's and SigLIP's):
 * y[r] = (x[r] - mean(x[r])) / sqrt(var(x[r]) + eps) * w + b, var the biased
 * (population) variance. x, y: f32 [n_rows][row_len]; w, b: f32 [row_len], each
 * optional (buf NULL: w = 1, b = 0). In place ok. */
typedef struct pkv_k_layer_norm_args {
    pkv_tref x, y, w, b;
    int64_t n_rows, row_len;
    float eps;
} pkv_k_layer_norm_args;

/* y[i] = a[i] + b[i % b_len] for i in [0, n). a, y: f32 [n]; b: f32 [b_len];
 * b_len divides n (b_len == n: plain add; b_len == row length: bias). In place ok. */
typedef struct pkv_k_add_args {
    pkv_tref a, b, y;
    int64_t n, b_len;
} pkv_k_add_args;

/* y[i] = act(g[i]) * u[i]. f32 [n]. y may alias g. act:
 *   silu (gelu and oai false): x / (1 + exp(-x))
 *   gelu (gelu true, the tanh form, Gemma): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * oai (gpt-oss's clamped SwiGLU, llama.cpp's swiglu_oai; gelu must be false): with
 *   x = min(g[i], limit) and v = clamp(u[i], -limit, limit),
 *   y[i] = x / (1 + exp(-alpha x)) * (v + 1). */
typedef struct pkv_k_swiglu_args {
    pkv_tref g, u, y;
    int64_t n;
    bool gelu;
    bool oai;
    float alpha, limit; /* oai only: gpt-oss has 1.702 and 7; limit > 0 */
} pkv_k_swiglu_args;

/* Rotary embedding, in place, on rows of x (f32, f16, or a KV type q8_0 / q4_0).
 * Row r lives at x.off + row(r) * row_stride bytes, with row(r) = rows[r], or r when
 * rows.buf is NULL; it holds n_heads heads of head_dim elements, head h at element
 * h * head_dim (quantized: at byte h * pkv_type_row_bytes(dtype, head_dim); the
 * head is dequantized, rotated in f32 and quantized again with quant.h's
 * quantizer, so head_dim must be a multiple of 32). Only the first n_rot (even,
 * <= head_dim) dims of a head rotate.
 * With theta_i = pos[r] * freq_scale * freq_base^(-2i/n_rot), i in [0, n_rot/2):
 *   normal (llama):  pairs (2i, 2i+1);   neox (qwen2/3): pairs (i, i + n_rot/2);
 *   (a, b) -> (a cos - b sin, a sin + b cos).
 * YaRN (ext_factor != 0; llama.cpp's rope_yarn): pair i's angle mixes the scaled and
 * the unscaled angle, theta_i = pos * freq_base^(-2i/n_rot) * (freq_scale (1 - m_i) + m_i),
 * m_i = ext_factor * (1 - clamp((i - corr_lo) / max(0.001, corr_hi - corr_lo), 0, 1))
 * (corr_lo, corr_hi from pkv_rope_yarn_corr_dims). Then cos and sin are multiplied by
 * mscale (0 = 1): the forward pass passes YaRN's magnitude factor,
 * a re-rotation of cached K none, so rotations by a position delta still compose.
 * freq_scale is > 0, or 0 inside YaRN's mix (ext_factor != 0): pkv_rope_partial.
 * ff (LongRoPE's per-pair frequency factors, ggml's freq_factors): pair i's
 * unscaled angle pos * freq_base^(-2i/n_rot) is divided by ff[i] before the
 * scaling and YaRN's mix; f32 [n_rot/2], each finite and > 0 (not checked: the
 * model checks them when it loads them); buf NULL: none. CUDA refuses them.
 * Rotations compose, so rotating cached K by a position delta re-positions it.
 * pos: i32 [n_rows]. max_rows bounds row(r) for the bounds check. */
typedef struct pkv_k_rope_args {
    pkv_tref x;
    pkv_type dtype; /* f32, f16, q8_0, q4_0 */
    int64_t n_rows, max_rows;
    size_t row_stride; /* bytes */
    int n_heads, head_dim, n_rot;
    bool neox;
    float freq_base, freq_scale;
    pkv_tref pos;
    pkv_tref rows;          /* buf NULL: identity */
    float ext_factor;       /* YaRN's mix; 0 = no YaRN (the angle is pos * freq_scale * base^(-2i/n_rot)) */
    float corr_lo, corr_hi; /* YaRN's correction range, in pairs */
    float mscale;           /* cos and sin times this; 0 = 1 */
    pkv_tref ff;            /* f32 [n_rot/2] frequency factors; buf NULL = none */
} pkv_k_rope_args;

/* YaRN's correction range (ggml's ggml_rope_yarn_corr_dims, in f32 as there): the
 * pairs from floor(d(beta_fast)) to ceil(d(beta_slow)), clamped to [0, n_rot - 1], with
 * d(b) = n_rot ln(n_ctx_orig / (2 pi b)) / (2 ln freq_base), the pair that turns b
 * times over n_ctx_orig positions. dims[0] = corr_lo, dims[1] = corr_hi. */
void pkv_rope_yarn_corr_dims(int n_rot, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow,
                             float dims[2]);

/* Partial ("proportional") RoPE, Gemma 4's full-attention layers: only the first
 * n_pairs of the n_rot / 2 pairs turn, each by the angle it has when all turn
 * (pos * freq_scale * freq_base^(-2i/n_rot)); the others stay (llama.cpp's freq
 * factors of 1e30 for them, an angle of about 1e-30 rad, which is 0 in f32 here).
 * Written with YaRN's ramp, so every backend's rope kernel runs it as it is: the
 * ramp steps from 1 to 0 between pairs n_pairs - 1 and n_pairs (corr_lo = corr_hi),
 * the "scaled" angle is 0 (freq_scale 0) and the mix is the scale (ext_factor), so
 * pair i turns by pos * base^(-2i/n_rot) * ext_factor * ramp_i. a must not use YaRN;
 * n_pairs <= 0 or >= n_rot / 2 leaves a as it is (every pair turns). */
static inline void pkv_rope_partial(pkv_k_rope_args *a, int n_pairs) {
    if (n_pairs <= 0 || n_pairs >= a->n_rot / 2) return;
    a->ext_factor = a->freq_scale;
    a->freq_scale = 0.0f;
    a->corr_lo = a->corr_hi = (float)(n_pairs - 1);
}

/* dst row idx[i] = convert(src row i), i in [0, n): the KV-cache write.
 * src: f32, row i at src.off + i*src_stride, row_elems elements.
 * dst: dst_type (f32, f16, q8_0 or q4_0), row j at dst.off + j*dst_stride; idx:
 * i32 [n] in [0, dst_rows). Quantized: row_elems is a multiple of 32 and each run
 * of 32 becomes one block, quantized exactly as pkv_quantize_row does (quant.h). */
typedef struct pkv_k_set_rows_args {
    pkv_tref src;
    size_t src_stride;
    pkv_tref dst;
    pkv_type dst_type;
    size_t dst_stride;
    int64_t dst_rows;
    pkv_tref idx;
    int64_t n, row_elems;
} pkv_k_set_rows_args;

/* Paged grouped-query causal attention.
 * q:   f32 [n_q][n_head][dk]
 * k:   k_type [n_pages][page_size][n_kv][dk]    (one shard's pool, page-major)
 * v:   v_type [n_pages][page_size][n_kv][dv]
 *      (types f32, f16, q8_0, q4_0; quantized: each head's row is d / 32 blocks,
 *      read as they are: no dequantized copy of the pool is made)
 * out: f32 [n_q][n_head][dv]
 * meta: i32, laid out as
 *   q_seq[n_q]   sequence of each query row, in [0, n_seq)
 *   q_len[n_q]   KV tokens visible to the query (causal limit), >= 1
 *   indptr[n_seq + 1], pages[indptr[n_seq]]   CSR block table: sequence s owns
 *                pages[indptr[s] .. indptr[s+1]), token t at page pages[indptr[s] +
 *                t / page_size], slot t % page_size.
 * Query head h reads KV head h / (n_head / n_kv). Scores are scaled by `scale`.
 * The kernel skips page ids outside [0, n_pages) (they cannot come from kv/).
 * Per-layer constants of the attention kind (0 / NULL: off), in this order:
 *   window  (sliding-window layers) query i sees only its last `window` visible
 *           tokens: [max(0, q_len[i] - window), q_len[i]);
 *   q_win   i32 [n_q]; buf NULL = none (then q_win[i] = q_len[i]): where query i's
 *           window is measured back from, so it sees
 *           [min(q_len[i], max(0, q_win[i] - window)), q_len[i]) (no effect
 *           without a window). A row of a non-causal span at position p (its own
 *           causal length p + 1) that sees the span up to q_len[i] = e gets
 *           q_win[i] = p + 1: keys [p + 1 - window, e), llama.cpp's sliding mask;
 *   softcap (Gemma 2) a score s (after `scale`) becomes softcap * tanh(s / softcap);
 *   sinks   (gpt-oss) f32 [n_head]: head h's softmax has one more logit, sinks[h],
 *           whose value vector is zero: out = sum_t e^{s_t} v_t / (sum_t e^{s_t} + e^{sinks[h]}).
 * A query that sees no token writes zeros, with or without a sink. */
typedef struct pkv_k_attention_args {
    pkv_tref q, k, v, out, meta;
    pkv_type k_type, v_type;
    int n_q, n_seq, meta_pages; /* meta_pages = indptr[n_seq], for the bounds check */
    int n_pages, page_size;
    int n_head, n_kv, dk, dv;
    float scale;
    int window;      /* tokens; 0 = all visible tokens */
    float softcap;   /* 0 = none */
    pkv_tref sinks;  /* f32 [n_head]; buf NULL = none */
    pkv_tref q_win;  /* i32 [n_q]; buf NULL = none (above) */
    bool v_in_k;     /* V is read from K (MLA's latent cache): v and v_type are ignored (the
                        dispatcher sets them to k's), the V row of a slot is the first dv
                        values of its K row (quantized: its first dv / 32 blocks); n_kv == 1,
                        dv <= dk */
    int chunk;       /* tokens; 0 = no chunks (above) */
} pkv_k_attention_args;

/* The first token query i sees (above): the window's and the chunk's start, given
 * the query's visible length len (q_len[i]) and its window end e (q_win[i] or
 * len). Shared by the reference and the host-side kernels. */
static inline int64_t pkv_att_first(int64_t len, int64_t e, int window, int chunk) {
    if (e > len) e = len;
    int64_t first = window > 0 && e > window ? e - window : 0;
    if (chunk > 0 && e > 0 && (e - 1) / chunk * chunk > first) first = (e - 1) / chunk * chunk;
    return first;
}

/* Row-wise softmax, f32 [n_rows][row_len]; in place ok. */
typedef struct pkv_k_softmax_args {
    pkv_tref x, y;
    int64_t n_rows, row_len;
} pkv_k_softmax_args;

/* out[r] = index of the largest x[r][*] (first on ties). x: f32 [n_rows][row_len];
 * out: i32 [n_rows]. */
typedef struct pkv_k_argmax_args {
    pkv_tref x, out;
    int64_t n_rows, row_len;
} pkv_k_argmax_args;

/* ---- Recurrent (gated delta-net, Mamba-style) layers: Qwen3.5's linear attention.
 *
 * State slots. A recurrent kernel keeps one fixed-size state per sequence in a
 * pool: slot i lives at state.off + i * state_stride bytes, i in [0, n_slots), and
 * is updated in place. The tokens of a call are grouped by sequence, consecutively,
 * and described by meta, i32 laid out as
 *   indptr[n_seq + 1]   sequence s owns token rows [indptr[s], indptr[s+1]), in order
 *   slot[n_seq]         the state slot of sequence s
 * (the same meta serves the conv and the delta-net kernels of a layer). A token's
 * result depends only on its sequence's state and earlier tokens of that sequence
 * in the call: running a sequence's tokens in one call or in several consecutive
 * calls gives the same bits on one device. The token ranges of one call must not
 * overlap and its slots must be distinct (not checkable on the host). The kernels
 * guard what only device memory holds: a sequence whose range is not inside
 * [0, n_tok) in order is skipped (nothing written); one whose slot is outside
 * [0, n_slots) gets zero output rows and no state change. */

/* Causal depthwise conv1d with a rolling state (ggml_ssm_conv), SiLU optional.
 * x, y: f32 [n_tok][channels]; y may alias x.
 * w:    f32 [channels][d_conv] (GGUF ssm_conv1d, ne {d_conv, channels}).
 * slot: f32 [d_conv - 1][channels], the sequence's last d_conv - 1 input rows,
 *       oldest first (zeros for a new sequence).
 * For a sequence, let u = its slot's rows followed by its x rows; its i-th token gets
 *   y[c] = act(sum_{j < d_conv} w[c][j] * u[i + j][c])   (w[c][d_conv-1]: the token itself)
 * and its slot becomes the last d_conv - 1 rows of u. act: silu (x / (1 + e^-x)) or none. */
typedef struct pkv_k_ssm_conv_args {
    pkv_tref x, w, y;
    pkv_tref state;      /* the slot pool */
    size_t state_stride; /* bytes between slots, >= (d_conv - 1) * channels * 4, a multiple of 4 */
    int64_t n_slots;
    pkv_tref meta; /* i32 [2 n_seq + 1]: indptr, slot (above) */
    int64_t n_tok, channels;
    int n_seq, d_conv; /* d_conv in [2, PKV_SSM_CONV_MAX] */
    bool silu;
} pkv_k_ssm_conv_args;
#define PKV_SSM_CONV_MAX 16

/* Gated delta rule (Qwen3-Next / Qwen3.5; ggml_gated_delta_net with a scalar gate).
 * q, k: f32, token t's head h (of n_k_heads) at q.off + t * q_stride + h * d_k * 4;
 * v:    f32, token t's head h (of n_v_heads) at v.off + t * v_stride + h * d_v * 4;
 *       (strides in bytes, multiples of 4; 0 = packed rows) — so q, k, v may be
 *       column ranges of one conv output row.
 * g, beta: f32 [n_tok][n_v_heads] (log-decay, usually <= 0, and the write strength).
 * out:  f32 [n_tok][n_v_heads][d_v]; may not alias any input.
 * slot: f32 [n_v_heads][d_k][d_v]: S_h[i][j] at (h * d_k + i) * d_v + j (i: key dim,
 *       j: value dim; the per-head transpose of llama.cpp's layout). Zeros when new.
 * V head h reads q/k head hk = h % n_k_heads (grouped false: llama.cpp's tiled order,
 * what GGUF files hold) or h / (n_v_heads / n_k_heads) (grouped true: HF order).
 * For each token of a sequence, in order, per v head (S = S_h, k = k_hk, q = q_hk):
 *   S[i][j] <- S[i][j] * exp(g)
 *   d_j = beta * (v_j - sum_i S[i][j] k_i)
 *   S[i][j] <- S[i][j] + k_i d_j
 *   out_j = scale * sum_i S[i][j] q_i          (scale 0 = 1/sqrt(d_k))
 * The state is f32 between tokens (rounded after every token, also inside a call).
 * q and k are used as given: the caller L2-normalizes them (pkv_k_l2_norm). */
typedef struct pkv_k_delta_net_args {
    pkv_tref q, k, v;
    size_t q_stride, k_stride, v_stride;
    pkv_tref g, beta, out;
    pkv_tref state;      /* the slot pool */
    size_t state_stride; /* bytes between slots, >= n_v_heads * d_k * d_v * 4, a multiple of 4 */
    int64_t n_slots;
    pkv_tref meta; /* i32 [2 n_seq + 1]: indptr, slot (above) */
    int64_t n_tok;
    int n_seq;
    int n_k_heads, n_v_heads, d_k, d_v; /* n_v_heads a multiple of n_k_heads */
    bool grouped;
    float scale;
} pkv_k_delta_net_args;

/* Mamba-2's selective scan (ggml_ssm_scan with one scalar decay per head), over the
 * recurrent kernels' state slots and meta (above).
 * x:    f32, token t's head h (of n_head, head_dim each) at x.off + t * x_stride + h * head_dim * 4;
 * B, C: f32, token t's group g (of n_group, d_state each) at B.off + t * B_stride + g * d_state * 4
 *       (C likewise); strides in bytes, multiples of 4, 0 = packed rows, so x, B and C may be
 *       column ranges of one conv output row [x | B | C].
 * dt:   f32 [n_tok][n_head], before the bias and softplus.
 * dt_bias, A: f32 [n_head] (GGUF ssm_dt.bias; ssm_a = -exp(A_log)); D: f32 [n_head] (ssm_d),
 *       optional (buf NULL: no skip term).
 * y:    f32 [n_tok][n_head][head_dim]; may not alias any input.
 * slot: f32 [n_head][head_dim][d_state]: S_h[i][n] at (h * head_dim + i) * d_state + n
 *       (ggml's layout {d_state, head_dim, n_head}); zeros for a new sequence.
 * Head h reads group h / (n_head / n_group) (n_head a multiple of n_group). For each token of a
 * sequence, in order, per head h:
 *   d = softplus(dt[h] + dt_bias[h])         (softplus as PKV_UNARY_SOFTPLUS: x > 20 ? x : log1p(e^x))
 *   a = exp(d * A[h])
 *   S[i][n] <- S[i][n] * a + d * x_i * B_n
 *   y_i = sum_n S[i][n] * C_n + D[h] * x_i
 * The state is f32 between tokens (rounded after every token, also inside a call), so a
 * sequence's tokens in one call or in several give the same bits on one device. */
typedef struct pkv_k_ssm_scan_args {
    pkv_tref x, B, C;
    size_t x_stride, B_stride, C_stride;
    pkv_tref dt, dt_bias, A, D, y;
    pkv_tref state;      /* the slot pool */
    size_t state_stride; /* bytes between slots, >= n_head * head_dim * d_state * 4, a multiple of 4 */
    int64_t n_slots;
    pkv_tref meta;       /* i32 [2 n_seq + 1]: indptr, slot */
    int64_t n_tok;
    int n_seq;
    int n_head, head_dim, n_group, d_state;
} pkv_k_ssm_scan_args;

/* y = x / sqrt(sum(x^2) + eps) over every head: row (t, h), t < n, h < n_heads, of
 * head_dim f32 at x.off + t * x_stride + h * head_dim * 4 (y likewise with y_stride;
 * strides in bytes, multiples of 4, 0 = packed). In place ok (y == x, same stride).
 * The gated delta-net's q/k norm: llama.cpp's rms_norm(eps / d) / sqrt(d), which is
 * this (not ggml_l2_norm's max(|x|, eps)). */
typedef struct pkv_k_l2_norm_args {
    pkv_tref x, y;
    int64_t n, n_heads, head_dim;
    size_t x_stride, y_stride;
    float eps;
} pkv_k_l2_norm_args;

/* y[i] = op(x[i] + bias[i % bias_len]) * mul[i % mul_len], i in [0, n); bias and mul
 * are optional (buf NULL: none) and their lengths divide n. f32; in place ok (y == x).
 * op: id (none), sigmoid 1 / (1 + e^-x), softplus (x > 20 ? x : log(1 + e^x), as
 * ggml), silu x / (1 + e^-x). Qwen3.5: beta = sigmoid(b); g = softplus(a + dt_bias) *
 * ssm_a; the attention output gate o * sigmoid(gate) (mul = o).
 * gelu: the tanh approximation (ggml_gelu, PyTorch's gelu(approximate="tanh"), SigLIP)
 *   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
 * gelu_erf: the exact form (PyTorch's default gelu, Whisper and Voxtral)
 *   0.5 x (1 + erf(x / sqrt(2)));
 * relu_sqr: max(x, 0)^2 (Nemotron-H's MLP, llama.cpp's LLM_FFN_RELU_SQR). */
typedef enum pkv_unary_op {
    PKV_UNARY_ID = 0,
    PKV_UNARY_SIGMOID,
    PKV_UNARY_SOFTPLUS,
    PKV_UNARY_SILU,
    PKV_UNARY_GELU,
    PKV_UNARY_GELU_ERF,
    PKV_UNARY_RELU_SQR,
} pkv_unary_op;
#define PKV_UNARY_LAST PKV_UNARY_RELU_SQR
typedef struct pkv_k_unary_args {
    pkv_tref x, y;
    int64_t n;
    pkv_unary_op op;
    pkv_tref bias;
    int64_t bias_len;
    pkv_tref mul;
    int64_t mul_len;
} pkv_k_unary_args;

/* Mixture-of-experts routing, a token per row (llama.cpp's build_moe_ffn; blocks.h
 * pkv_blk_moe):
 *   logits f32 [n][n_expert]: the router's output (plus its bias)
 *   p = softmax(l) (gating 0) | l (1: softmax over the chosen after) | sigmoid(l) (2)
 *   s = l (sel_logits) or p + bias[e] (bias f32 [n_expert]; buf NULL = none)
 *   n_group > 1: a group (n_expert / n_group consecutive experts) scores the sum of its
 *     two best s; only the experts of the n_group_used best groups can be chosen (ties:
 *     the lower group)
 *   sel i32 [n][k]: the k best s, best first (ties: the lower expert)
 *   w f32 [n][k] = p[sel]; gating 1: softmax over them; norm_w: / max(their sum, 2^-14);
 *     times w_scale (0: 1)
 * n_expert <= 4096, k <= 64, n_group <= 64 dividing n_expert into groups of 2 or more,
 * n_group_used * (n_expert / n_group) >= k. The reference works in double. */
typedef struct pkv_k_moe_route_args {
    pkv_tref logits, bias, sel, w;
    int64_t n;
    int n_expert, k, n_group, n_group_used;
    int gating; /* 0 softmax, 1 softmax of the chosen, 2 sigmoid */
    bool norm_w, sel_logits;
    float w_scale;
} pkv_k_moe_route_args;

/* The experts' weighted sum: for i < n, c < cols
 *   out[rows[i]][c] = (add ? out[rows[i]][c] : 0) + w[i] * y[i][c]
 * out f32 [out_rows][cols]; y f32 [n][cols]; rows i32 [n], distinct and in
 * [0, out_rows) (rows outside are skipped); w f32 [n]. */
typedef struct pkv_k_moe_combine_args {
    pkv_tref out, y, rows, w;
    int64_t n, cols, out_rows;
    bool add;
} pkv_k_moe_combine_args;

/* The kernels. X(name) for each: its arguments are pkv_k_<name>_args above, and
 * from this entry come
 *   - the backend slot      pkv_kernel_ops.<name>              (device.h),
 *   - the checked entry     pkv_k_<name>(dev, args), which runs start() and
 *                           check_<name>() of kernels.c, then the slot,
 *   - the `pagekv check` rows: rows_<name>() of check-kernels.c, which compares
 *                           the device against the reference pkv_ref_<name>
 *                           (cpu/ref.h), run in this order,
 *   - each backend's table entry .<name> = <prefix>_<name> (cpu_, vk_, cu_).
 * A kernel missing any of those functions does not compile. */
#define PKV_KERNELS(X)                                                                     \
    X(matmul)                                                                              \
    X(get_rows)                                                                            \
    X(rms_norm)                                                                            \
    X(add)                                                                                 \
    X(swiglu)                                                                              \
    X(rope)                                                                                \
    X(set_rows)                                                                            \
    X(attention)                                                                           \
    X(softmax)                                                                             \
    X(argmax)                                                                              \
    X(ssm_conv)                                                                            \
    X(delta_net)                                                                           \
    X(ssm_scan)                                                                            \
    X(l2_norm)                                                                             \
    X(unary)                                                                               \
    X(layer_norm)                                                                          \
    X(moe_route)                                                                           \
    X(moe_combine)

#endif /* PKV_KERNEL_LIST_H */
