/* A plain reference forward pass in double precision, for tests only.
 *
 * The paged forward pass is compared against this. It is written for clarity, not
 * speed: one token at a time, a contiguous KV cache per layer, every tensor
 * dequantized to double. Architectures: llama, qwen2, qwen3, qwen3moe, phi3, gemma2,
 * gemma3, gpt-oss (decoder-only, pre-norm, RMS norm, RoPE, grouped-query causal attention, gated
 * FFN; qwen3moe is qwen3 with every layer's FFN replaced by a mixture of SwiGLU experts;
 * phi3 is llama with fused Q/K/V and gate/up tensors; gemma2 and gemma3 are described
 * below).
 *
 * Tensor names and shapes are GGUF's (llama.cpp's) standard names; a matrix is
 * row-major [rows][cols] and applied as y = W·x (row r dotted with x):
 *   token_embd.weight   [n_vocab][n_embd]
 *   output_norm.weight  [n_embd]
 *   output.weight       [n_vocab][n_embd]; absent: tied to token_embd
 *   blk.N.attn_norm.weight                  [n_embd]
 *   blk.N.attn_q.weight                     [n_head*head_dim][n_embd]
 *   blk.N.attn_k.weight, blk.N.attn_v.weight [n_head_kv*head_dim][n_embd]
 *   blk.N.attn_{q,k,v}.bias                 (required for qwen2, not read for gemma2
 *                                           and gemma3, optional otherwise)
 *   blk.N.attn_q_norm.weight, attn_k_norm.weight [head_dim] (required for qwen3,
 *                                           qwen3moe and gemma3: an RMS norm of each head
 *                                           of Q and K, before RoPE; not read for gemma2)
 *   blk.N.attn_output.weight                [n_embd][n_head*head_dim]
 *   blk.N.ffn_norm.weight                   [n_embd]
 *   blk.N.post_attention_norm.weight, post_ffw_norm.weight [n_embd] (gemma2 and gemma3,
 *                                           required; not read for the others)
 * dense models (llama, qwen2, qwen3, gemma2, gemma3):
 *   blk.N.ffn_gate.weight, ffn_up.weight    [n_ff][n_embd]
 *   blk.N.ffn_down.weight                   [n_embd][n_ff]
 * qwen3moe (no ffn_gate/ffn_up/ffn_down; a 3-D tensor is n_expert matrices one after
 * another, GGUF ne = {cols, rows, n_expert}):
 *   blk.N.ffn_gate_inp.weight               [n_expert][n_embd] (the router)
 *   blk.N.ffn_gate_exps.weight, ffn_up_exps.weight [n_expert][n_ff_exp][n_embd]
 *   blk.N.ffn_down_exps.weight              [n_expert][n_embd][n_ff_exp]
 * RoPE over the whole head: normal (pairs 2i, 2i+1) when !rope_neox, neox (pairs i,
 * i + head_dim/2) otherwise; the pair i turns by pos * scale * base^(-2i/head_dim),
 * base rope_base and scale rope_freq_scale (1 / the linear scaling factor), except on
 * gemma3's sliding layers (below).
 * Attention scale 1/sqrt(head_dim) (gemma: attn_scale); query head h reads KV head
 * h / (n_head/n_head_kv). FFN: down(silu(gate(x)) * up(x)) (gemma: gelu). Residual
 * adds after attention and after FFN; then the final RMS norm and the output
 * projection give the logits.
 * MoE (llama.cpp's build_moe_ffn as qwen3moe calls it: softmax gating, top-k weights
 * normalized, no shared expert, no weight scale): with x the normed FFN input,
 * p = softmax(gate_inp·x); the n_expert_used experts of largest p are selected (ties:
 * the lower index); w_e = p_e / max(sum of the selected p, 2^-14); the FFN output is
 * sum over the selected e of w_e * FFN_e(x), FFN_e being the FFN above with expert e's
 * matrices.
 * gemma2 (llama.cpp's src/models/gemma2-iswa.cpp; no biases or Q/K norms are read,
 * RoPE is neox, the output is usually tied):
 *   x = token_embd row * sqrt(n_embd)
 *   per layer: score = softcap_a(attn_scale * q·k) over the visible keys, where
 *     softcap_c(s) = c * tanh(s / c) (the identity when c = 0) and a sliding layer
 *     (ref_layer_is_swa) at position pos sees only positions (pos - sliding_window, pos];
 *     x += rmsnorm(Wo·attention) * post_attention_norm
 *     x += rmsnorm(down(gelu(gate(h)) * up(h))) * post_ffw_norm, h = rmsnorm(x) * ffn_norm,
 *     gelu the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   logits = softcap_final(output · (rmsnorm(x) * output_norm))
 * The norm weights are used as stored (llama.cpp's converter already added Gemma's 1).
 * gemma3 (llama.cpp's src/models/gemma3.cpp): gemma2 with the Q/K norms of qwen3 (each
 * head of q and k RMS-normed before RoPE) and no soft-caps in its files (the fields
 * still apply when set); five of every six layers slide (swa_pattern 6: il % 6 < 5),
 * and those rotate with base rope_base_swa and scale 1 (llama.cpp's
 * rope_freq_base_train_swa = 10000), while the global layers use rope_base and
 * rope_freq_scale.
 * gpt-oss (llama.cpp's src/models/openai-moe-iswa.cpp, LLM_ARCH_OPENAI_MOE): no Q/K
 * norms; the biases attn_{q,k,v}.bias and attn_output.bias [n_embd] are required; each
 * query head h has a sink, blk.N.attn_sinks.weight [n_head]: one more logit in its
 * softmax whose value vector is zero, so the weights are e^{s_t} / (sum_t e^{s_t} +
 * e^{sink_h}); the even layers slide (swa_pattern 2, sliding_window required); the FFN
 * norm is named blk.N.post_attention_norm.weight (no ffn_norm); every layer's FFN is a
 * mixture of experts with biases (ffn_gate_inp.bias [n_expert], ffn_gate_exps.bias and
 * ffn_up_exps.bias [n_expert][n_ff_exp], ffn_down_exps.bias [n_expert][n_embd], expert
 * e's row e added after its matrix), routed by llama.cpp's SOFTMAX_WEIGHT gating: the
 * n_expert_used largest router logits (ties: the lower index), weights the softmax of
 * those logits alone; and each expert's activation is the clamped SwiGLU (swiglu_oai,
 * alpha 1.702, limit 7): with g = gate·x + b and u = up·x + b, x' = min(g, 7),
 * h = x' / (1 + e^{-1.702 x'}) * (clamp(u, -7, 7) + 1). Its RoPE is neox with YaRN.
 * YaRN (yarn_orig_ctx > 0, any architecture; llama.cpp's rope_yarn with ext_factor 1):
 * with s = rope_freq_scale (1 / the factor), D the head size and
 * d(b) = D ln(yarn_orig_ctx / (2 pi b)) / (2 ln base), the pairs lo = max(0,
 * floor(d(beta_fast))) .. hi = min(D - 1, ceil(d(beta_slow))) ramp from unscaled to
 * scaled: r_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), pair i turns by
 * pos * base^(-2i/D) * (s (1 - r_i) + r_i), and cos and sin are multiplied by
 * 1 + 0.1 ln(1/s) (when s < 1), so q and k each carry that magnitude.
 *
 * gemma4 (llama.cpp's src/models/gemma4.cpp): gemma3's block, with what varies by layer
 * given per layer: which layers slide (swa_layers), their head size (head_dim_swa, all
 * of it rotated, base rope_base_swa, scale 1), each layer's KV heads (layer_n_head_kv)
 * and FFN rows (layer_n_ff). The full layers rotate only their first rope_pairs_full
 * pairs (pairs (i, i + head_dim/2), angles pos * base^(-2i/head_dim); llama.cpp's
 * rope_freqs of 1e30 for the others); V is RMS-normed per head without a weight, and
 * is K's projection (before K's norm) where attn_v is absent; the score is q·k
 * (attn_scale 1); K and V exist only in the first Lkv = n_layer - n_shared_kv layers:
 * a later layer computes q only and attends over layer Lkv - 2's cache if it slides,
 * Lkv - 1's if not. Per-layer embeddings (n_embd_per_layer = P > 0), with x0 the
 * scaled embedding: ple_l = (rmsnorm(per_layer_model_proj[lP, (l+1)P) · x0 / sqrt(n_embd))
 * * per_layer_proj_norm + per_layer_token_embd[token][lP, (l+1)P) * sqrt(P)) / sqrt(2);
 * after layer l's FFN, x += rmsnorm(proj · (gelu(inp_gate · x) * ple_l)) * post_norm;
 * then x *= layer_output_scale where the layer has one. final_softcap as given (a file
 * without the key: 30).
 *
 * The cache keeps K after RoPE, entry i at position i. ref_model_eval appends;
 * ref_model_truncate, ref_model_remove (a context shift: later entries move back and
 * their K is re-rotated by the distance) and ref_model_copy_cache (a fork) are the
 * references for the KV cache operations (the shift re-rotates each layer's K with that
 * layer's base and scale, and with YaRN's angles but not its magnitude factor, which
 * the cached K already has); ref_model_k / ref_model_v expose entries.
 * A sliding layer's cache keeps every entry as well: the window is a mask by position
 * (as llama.cpp's is_masked_swa), so after a context shift it counts the new positions.
 *
 * Header-only (every test is one file): all functions are static inline. Errors are
 * printed to stderr and returned as NULL / -1; on error the model is unchanged. */
#ifndef PKV_REF_MODEL_H
#define PKV_REF_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_hparams {
    const char *arch; /* "llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "gpt-oss" */
    int n_layer, n_embd, n_head, n_head_kv, head_dim;
    int n_ff; /* rows of the dense FFN; ignored by qwen3moe */
    int n_vocab;
    double rms_eps, rope_base;
    bool rope_neox;
    /* MoE, last so that positional initializers of dense models leave them 0 (they
     * must be 0 for the dense architectures; qwen3moe and gpt-oss need all three > 0). */
    int n_expert;      /* experts per layer */
    int n_expert_used; /* experts per token, <= n_expert */
    int n_ff_exp;      /* rows of each expert's FFN */
    /* gemma2 and gemma3, last for the same reason; all must be 0 for the other
     * architectures, except the window's two (required for gpt-oss: its even layers slide). */
    double attn_scale;    /* the score is attn_scale * q·k; 0 = 1/sqrt(head_dim) */
    double attn_softcap;  /* scores become c * tanh(s / c), c this; 0 = none */
    double final_softcap; /* the same on the logits; 0 = none */
    int sliding_window;   /* positions a sliding layer sees, its own included; 0 = none
                           * (gemma3 needs one, as llama.cpp does) */
    int swa_pattern;      /* layer il slides when il % swa_pattern < swa_pattern - 1 (so 1:
                           * none); 0 = 2 (gemma2: even layers), 6 (gemma3) when
                           * sliding_window > 0 */
    /* RoPE scaling and per-layer bases, last for the same reason. */
    double rope_freq_scale; /* positions times this before RoPE (1 / the linear scaling
                             * factor), every architecture; 0 = 1 */
    double rope_base_swa;   /* gemma3 only (0 elsewhere): the base of the sliding layers,
                             * which use no scaling; 0 = rope_base and rope_freq_scale */
    /* YaRN, last for the same reason: any architecture (gpt-oss has it) */
    int yarn_orig_ctx;      /* > 0: YaRN RoPE (above) over this original context; 0 = none */
    double yarn_beta_fast;  /* 0 = 32 */
    double yarn_beta_slow;  /* 0 = 1 */
    /* gemma4 (above), last for the same reason: 0 / NULL elsewhere */
    const unsigned char *swa_layers; /* [n_layer] 1 = the layer slides; required by gemma4 */
    int head_dim_swa;                /* the sliding layers' head size; 0 = head_dim */
    const int *layer_n_head_kv;      /* [n_layer] KV heads of each layer; NULL = n_head_kv */
    const int *layer_n_ff;           /* [n_layer] FFN rows of each layer; NULL = n_ff */
    int rope_pairs_full;             /* the full layers turn their first rope_pairs_full pairs; 0 = all */
    int n_shared_kv;                 /* the last layers, which reuse an earlier layer's KV */
    int n_embd_per_layer;            /* P, per-layer embeddings; 0 = none */
    /* LongRoPE (phi3), last for the same reason: pair i's angle divided by
     * rope_factors[i] ([head_dim / 2], kept by the caller while the model lives;
     * NULL = none), and cos and sin of Q and K times rope_attn_factor (0 = 1); a
     * shift turns cached K with the factors and no magnitude. Not with YaRN. */
    const double *rope_factors;
    double rope_attn_factor;
    /* NoPE layers (smollm3, with arch "llama"), last for the same reason: layer il
     * with (il + 1) % nope_step == 0 gives Q and K no RoPE, and a shift moves its K
     * without turning it; 0 = none */
    int nope_step;
    /* mistral3 (with arch "llama"), last for the same reason: YaRN's magnitude on the
     * cos and sin of q and k is yarn_mscale (0 = 1 + 0.1 ln(1 / rope_freq_scale));
     * after RoPE the query at position p is multiplied by 1 + attn_temp_scale *
     * ln(floor(p / attn_temp_floor) + 1) (attn_temp_scale 0 = none) */
    double yarn_mscale;
    double attn_temp_scale;
    int attn_temp_floor;
} ref_hparams;

/* Returns a malloc'd double array holding the dequantized tensor (the caller frees it)
 * and its element count in *n_elements, or NULL when the model has no such tensor. */
typedef double *(*ref_get_tensor)(void *user, const char *name, int64_t *n_elements);

typedef struct ref_layer {
    double *attn_norm;       /* [n_embd] */
    double *wq;              /* [n_head*head_dim][n_embd] */
    double *wk, *wv;         /* [n_head_kv*head_dim][n_embd] */
    double *bq;              /* [n_head*head_dim] or NULL */
    double *bk, *bv;         /* [n_head_kv*head_dim] or NULL */
    double *q_norm, *k_norm; /* [head_dim] or NULL */
    double *wo;              /* [n_embd][n_head*head_dim] */
    double *ffn_norm;        /* [n_embd] */
    double *post_attn_norm;  /* [n_embd], gemma2 and gemma3 (post_attention_norm); else NULL */
    double *post_ffw_norm;   /* [n_embd], gemma2 and gemma3; else NULL */
    double *gate, *up;       /* [n_ff][n_embd], dense models; NULL for MoE */
    double *down;            /* [n_embd][n_ff], dense models; NULL for MoE */
    double *bo;              /* [n_embd] attention output bias, gpt-oss; else NULL */
    double *sinks;           /* [n_head] attention sinks, gpt-oss; else NULL */
    double *gate_inp;        /* [n_expert][n_embd], the router, MoE; else NULL */
    double *gate_inp_b;      /* [n_expert], gpt-oss; else NULL */
    double *gate_exps_b, *up_exps_b; /* [n_expert][n_ff_exp], gpt-oss; else NULL */
    double *down_exps_b;     /* [n_expert][n_embd], gpt-oss; else NULL */
    double *gate_exps;       /* [n_expert][n_ff_exp][n_embd], MoE; else NULL */
    double *up_exps;         /* [n_expert][n_ff_exp][n_embd], MoE; else NULL */
    double *down_exps;       /* [n_expert][n_embd][n_ff_exp], MoE; else NULL */
    double *k_cache;         /* [cap][n_kv*D], after RoPE; NULL where the layer reuses another's */
    double *v_cache;         /* [cap][n_kv*D] */
    /* the layer's geometry: n_head_kv, head_dim, n_ff except where gemma4 varies them */
    int D, n_kv, F;
    int kv_src;              /* the layer whose cache it attends over: itself, or (gemma4) an earlier one */
    int rope_pairs;          /* pairs that turn; D / 2 = all */
    double *ple_gate;        /* [P][n_embd], gemma4 with per-layer embeddings; else NULL */
    double *ple_proj;        /* [n_embd][P] */
    double *ple_post_norm;   /* [n_embd] */
    double *out_scale;       /* [1] layer_output_scale, gemma4 where present; else NULL */
    /* gemma4's MoE layers (ffn_gate_inp present; experts beside the dense FFN); else NULL */
    double *gate_inp_s;      /* [n_embd] ffn_gate_inp.scale */
    double *down_exps_s;     /* [n_expert] ffn_down_exps.scale, or NULL */
    double *pre_ffw_norm_2, *post_ffw_norm_1, *post_ffw_norm_2; /* [n_embd] */
} ref_layer;

typedef struct ref_model {
    ref_hparams hp; /* the caller's, with attn_scale and swa_pattern resolved (never 0
                     * where 0 meant a default) */
    char arch[16];
    double embd_scale; /* the embedding row is multiplied by this: sqrt(n_embd) for gemma, else 1 */
    bool gelu;         /* the FFN's activation is gelu (gemma2, gemma3), else silu */
    bool oss;          /* gpt-oss: sinks, softmax-weight gating, clamped SwiGLU experts */
    bool g4;           /* gemma4 */
    double *ple_tok;   /* [n_vocab][n_layer*P], gemma4 with per-layer embeddings; else NULL */
    double *ple_model_proj; /* [n_layer*P][n_embd] */
    double *ple_proj_norm;  /* [P] */
    double *ple;       /* scratch [n_layer*P]: the token's per-layer inputs */
    double *pg;        /* scratch [P] */
    double *tok_embd; /* [n_vocab][n_embd] */
    double *out_norm; /* [n_embd] */
    double *output;   /* [n_vocab][n_embd]; == tok_embd when tied */
    ref_layer *layers;
    int n_past; /* cache entries = position of the next token */
    int cap;    /* cache capacity in tokens */
    /* scratch */
    double *x, *h, *tmp;  /* [n_embd] */
    double *q, *att;      /* [n_head*head_dim] */
    double *k, *v;        /* [n_head_kv*head_dim] */
    double *g, *u;        /* [n_ff] (dense) or [n_ff_exp] (MoE) */
    double *scores;       /* [cap] */
    double *probs;        /* [n_expert], the router's softmax; MoE only */
    bool *chosen;         /* [n_expert], the experts selected for this token; MoE only */
    double *ffn_out;      /* [n_embd], the weighted sum of the experts; MoE only */
} ref_model;

/* ------------------------------------------------------------- math */

/* y[r] = sum_c W[r][c] x[c] (+ b[r]) */
static inline void ref_matvec(const double *W, const double *x, const double *b, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        const double *w = W + (size_t)r * (size_t)cols;
        double s = 0;
        for (int c = 0; c < cols; c++) s += w[c] * x[c];
        y[r] = b ? s + b[r] : s;
    }
}

/* y = x / sqrt(mean(x^2) + eps) * w; y may alias x. */
static inline void ref_rms_norm(const double *x, const double *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* Rotates the first n_pairs pairs of each of the n_heads heads of x (head_dim each) to
 * position pos (any real value: a negative one rotates back), at the angles they have
 * when every pair turns; the other pairs stay. */
static inline void ref_rope_pairs(double *x, int n_heads, int head_dim, double pos, double base, bool neox, int n_pairs) {
    int half = head_dim / 2;
    for (int hd = 0; hd < n_heads; hd++) {
        double *v = x + (size_t)hd * (size_t)head_dim;
        for (int i = 0; i < n_pairs && i < half; i++) {
            double theta = pos * pow(base, -2.0 * i / head_dim);
            double c = cos(theta), s = sin(theta);
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            double x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* Rotates each of the n_heads heads of x (head_dim each) to position pos. */
static inline void ref_rope(double *x, int n_heads, int head_dim, double pos, double base, bool neox) {
    ref_rope_pairs(x, n_heads, head_dim, pos, base, neox, head_dim / 2);
}

/* LongRoPE: each of the n_heads heads of x turned to position pos, pair i by
 * pos * base^(-2i/head_dim) / ff[i]; cos and sin times mscale (1: a pure rotation). */
static inline void ref_rope_factors(double *x, int n_heads, int head_dim, double pos, double base, bool neox,
                                    const double *ff, double mscale) {
    int half = head_dim / 2;
    for (int hd = 0; hd < n_heads; hd++) {
        double *v = x + (size_t)hd * (size_t)head_dim;
        for (int i = 0; i < half; i++) {
            double theta = pos * pow(base, -2.0 * i / head_dim) / ff[i];
            double c = cos(theta) * mscale, s = sin(theta) * mscale;
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            double x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* ref_rope with YaRN (the header above): each of the n_heads heads of x turned to
 * position pos (negative: back) with base, scale s and original context orig; cos and
 * sin times mscale (1: a pure rotation, the re-rotation of a shift). */
static inline void ref_rope_yarn(double *x, int n_heads, int head_dim, double pos, double base, double scale, int orig,
                                 double beta_fast, double beta_slow, bool neox, double mscale) {
    const double pi = 3.14159265358979323846, lb = 2.0 * log(base);
    double lo = floor(head_dim * log(orig / (2.0 * pi * beta_fast)) / lb);
    double hi = ceil(head_dim * log(orig / (2.0 * pi * beta_slow)) / lb);
    lo = lo > 0 ? lo : 0;
    hi = hi < head_dim - 1 ? hi : head_dim - 1;
    int half = head_dim / 2;
    for (int hd = 0; hd < n_heads; hd++) {
        double *v = x + (size_t)hd * (size_t)head_dim;
        for (int i = 0; i < half; i++) {
            double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
            double ramp = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);
            double theta = pos * pow(base, -2.0 * i / head_dim) * (scale * (1.0 - ramp) + ramp);
            double c = cos(theta) * mscale, s = sin(theta) * mscale;
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            double x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* sum (a - b)^2 / sum b^2 over n values: a runtime's f32 output against the
 * reference's doubles */
static inline double ref_nmse(const float *a, const double *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return num / den;
}

static inline double ref_silu(double x) { return x / (1.0 + exp(-x)); }

/* GELU, the tanh form (ggml_gelu's); 0.79788... = sqrt(2/pi). */
static inline double ref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* c * tanh(s / c): s squashed into (-c, c), about s where |s| << c; c = 0: s. */
static inline double ref_softcap(double s, double c) { return c > 0 ? c * tanh(s / c) : s; }

/* Gated FFN of n_ff rows: y = down · (act(gate · x) * up · x), act silu (SwiGLU) or
 * gelu (GeGLU), with gate, up [n_ff][n_embd] and down [n_embd][n_ff]; g and u are
 * scratch [n_ff]. Both the dense FFN and each expert of a MoE are this. */
static inline void ref_ffn(const double *gate, const double *up, const double *down, int n_embd, int n_ff,
                           bool gelu, const double *x, double *g, double *u, double *y) {
    ref_matvec(gate, x, NULL, n_ff, n_embd, g);
    ref_matvec(up, x, NULL, n_ff, n_embd, u);
    for (int i = 0; i < n_ff; i++) g[i] = (gelu ? ref_gelu(g[i]) : ref_silu(g[i])) * u[i];
    ref_matvec(down, g, NULL, n_embd, n_ff, y);
}

/* Whether layer il attends through the sliding window (llama.cpp's set_swa_pattern
 * with the window's size > 0); hp may be the caller's or the model's resolved one. */
static inline bool ref_layer_is_swa(const ref_hparams *hp, int il) {
    if (hp->sliding_window <= 0) return false;
    if (hp->swa_layers) return hp->swa_layers[il] != 0;
    const int p = hp->swa_pattern > 0 ? hp->swa_pattern : strcmp(hp->arch, "gemma3") == 0 ? 6 : 2; /* gpt-oss: 2 */
    return il % p < p - 1;
}

/* The RoPE base and position scale of layer il: gemma3's sliding layers have their
 * own base and no scaling, every other layer rope_base and rope_freq_scale. */
static inline void ref_layer_rope(const ref_hparams *hp, int il, double *base, double *scale) {
    const bool local = hp->rope_base_swa > 0 && ref_layer_is_swa(hp, il);
    *base = local ? hp->rope_base_swa : hp->rope_base;
    *scale = local || hp->rope_freq_scale == 0 ? 1.0 : hp->rope_freq_scale;
}

/* ------------------------------------------------------ create / free */

static inline void ref_model_free(ref_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int il = 0; il < m->hp.n_layer; il++) {
            ref_layer *L = &m->layers[il];
            double *all[] = {L->attn_norm, L->wq, L->wk, L->wv, L->bq, L->bk, L->bv, L->q_norm,
                             L->k_norm, L->wo, L->ffn_norm, L->post_attn_norm, L->post_ffw_norm, L->gate,
                             L->up, L->down, L->gate_inp, L->gate_exps, L->up_exps, L->down_exps,
                             L->k_cache, L->v_cache, L->bo, L->sinks, L->gate_inp_b, L->gate_exps_b,
                             L->up_exps_b, L->down_exps_b, L->ple_gate, L->ple_proj, L->ple_post_norm, L->out_scale,
                             L->gate_inp_s, L->down_exps_s, L->pre_ffw_norm_2, L->post_ffw_norm_1, L->post_ffw_norm_2};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
        }
        free(m->layers);
    }
    if (m->output != m->tok_embd) free(m->output);
    free(m->tok_embd);
    free(m->out_norm);
    free(m->ple_tok);
    free(m->ple_model_proj);
    free(m->ple_proj_norm);
    free(m->ple);
    free(m->pg);
    double *scratch[] = {m->x, m->h, m->tmp, m->q, m->att, m->k, m->v, m->g, m->u, m->scores, m->probs, m->ffn_out};
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) free(scratch[i]);
    free(m->chosen);
    free(m);
}

/* Loads name (expecting n elements) into *dst. Returns false (with a message) when it
 * is required and absent, or has the wrong size. */
static inline bool ref_load(ref_get_tensor get, void *user, const char *name, int64_t n, bool required,
                            double **dst) {
    int64_t got = -1;
    double *d = get(user, name, &got);
    if (!d) {
        if (required) fprintf(stderr, "ref_model: tensor %s is missing\n", name);
        *dst = NULL;
        return !required;
    }
    if (got != n) {
        fprintf(stderr, "ref_model: tensor %s has %lld elements, expected %lld\n", name, (long long)got,
                (long long)n);
        free(d);
        *dst = NULL;
        return false;
    }
    *dst = d;
    return true;
}

/* Loads every tensor through get. Returns NULL (with a message on stderr) on bad
 * hparams, a missing required tensor, a tensor of the wrong size or no memory. */
static inline ref_model *ref_model_create(const ref_hparams *hp, ref_get_tensor get, void *user) {
    if (!hp || !get || !hp->arch) return NULL;
    bool llama = strcmp(hp->arch, "llama") == 0, qwen2 = strcmp(hp->arch, "qwen2") == 0,
         qwen3 = strcmp(hp->arch, "qwen3") == 0, moe = strcmp(hp->arch, "qwen3moe") == 0,
         phi3 = strcmp(hp->arch, "phi3") == 0, gemma3 = strcmp(hp->arch, "gemma3") == 0,
         gemma2 = strcmp(hp->arch, "gemma2") == 0, gemma = gemma2 || gemma3, oss = strcmp(hp->arch, "gpt-oss") == 0,
         g4 = strcmp(hp->arch, "gemma4") == 0;
    if (!llama && !qwen2 && !qwen3 && !moe && !phi3 && !gemma && !oss && !g4) {
        fprintf(stderr, "ref_model: unknown arch %s\n", hp->arch);
        return NULL;
    }
    const bool qk_norm = qwen3 || moe || gemma3 || g4;
    const bool experts = moe || oss;
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0 ||
        hp->head_dim % 2 != 0 || (!experts && hp->n_ff <= 0) || hp->n_vocab <= 0 || hp->n_head % hp->n_head_kv != 0 ||
        !(hp->rms_eps >= 0) || !(hp->rope_base > 0)) {
        fprintf(stderr, "ref_model: bad hparams (n_layer %d n_embd %d n_head %d n_head_kv %d head_dim %d n_ff %d)\n",
                hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff);
        return NULL;
    }
    /* A dense arch with experts set is refused rather than silently run dense (gemma4:
     * experts are optional, in the layers with ffn_gate_inp) */
    const bool g4moe = g4 && (hp->n_expert || hp->n_expert_used || hp->n_ff_exp);
    if (experts || g4moe
            ? hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert || hp->n_ff_exp <= 0
            : hp->n_expert != 0 || hp->n_expert_used != 0 || hp->n_ff_exp != 0) {
        fprintf(stderr, "ref_model: bad MoE hparams for %s (n_expert %d n_expert_used %d n_ff_exp %d)\n", hp->arch,
                hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
        return NULL;
    }
    /* The gemma fields are refused on the other architectures rather than ignored;
     * Gemma's RoPE is neox, so normal RoPE there is a caller's mistake; gemma3 without
     * a window would run its sliding layers as global ones. */
    /* gpt-oss takes the window fields (a window is required) but no gemma scales */
    if (gemma ? !(hp->attn_scale >= 0 && hp->attn_scale < INFINITY) ||
                    !(hp->attn_softcap >= 0 && hp->attn_softcap < INFINITY) ||
                    !(hp->final_softcap >= 0 && hp->final_softcap < INFINITY) || hp->sliding_window < 0 ||
                    hp->swa_pattern < 0 || !hp->rope_neox || (gemma3 && hp->sliding_window == 0)
        : oss ? hp->attn_scale != 0 || hp->attn_softcap != 0 || hp->final_softcap != 0 || hp->sliding_window <= 0 ||
                    hp->swa_pattern < 0 || !hp->rope_neox
        : g4  ? !(hp->attn_scale >= 0 && hp->attn_scale < INFINITY) || hp->attn_softcap != 0 ||
                    !(hp->final_softcap >= 0 && hp->final_softcap < INFINITY) || hp->sliding_window <= 0 ||
                    hp->swa_pattern != 0 || !hp->swa_layers || !hp->rope_neox
              : hp->attn_scale != 0 || hp->attn_softcap != 0 || hp->final_softcap != 0 ||
                    hp->sliding_window != 0 || hp->swa_pattern != 0) {
        fprintf(stderr,
                "ref_model: bad gemma hparams for %s (attn_scale %g attn_softcap %g final_softcap %g "
                "sliding_window %d swa_pattern %d rope_neox %d)\n",
                hp->arch, hp->attn_scale, hp->attn_softcap, hp->final_softcap, hp->sliding_window,
                hp->swa_pattern, (int)hp->rope_neox);
        return NULL;
    }
    if (!(hp->rope_freq_scale >= 0 && hp->rope_freq_scale < INFINITY) ||
        (gemma3 || g4 ? !(hp->rope_base_swa >= 0 && hp->rope_base_swa < INFINITY) : hp->rope_base_swa != 0)) {
        fprintf(stderr, "ref_model: bad RoPE hparams for %s (rope_freq_scale %g rope_base_swa %g: gemma3's only)\n",
                hp->arch, hp->rope_freq_scale, hp->rope_base_swa);
        return NULL;
    }
    if (hp->attn_temp_scale != 0 && hp->attn_temp_floor <= 0) {
        fprintf(stderr, "ref_model: attn_temp_floor %d\n", hp->attn_temp_floor);
        return NULL;
    }
    if (hp->nope_step < 0) {
        fprintf(stderr, "ref_model: nope_step %d\n", hp->nope_step);
        return NULL;
    }
    if (hp->rope_factors && (hp->yarn_orig_ctx > 0 || !(hp->rope_attn_factor >= 0 && hp->rope_attn_factor < INFINITY))) {
        fprintf(stderr, "ref_model: LongRoPE factors with YaRN or attention factor %g\n", hp->rope_attn_factor);
        return NULL;
    }
    if (hp->yarn_orig_ctx < 0 || !(hp->yarn_beta_fast >= 0 && hp->yarn_beta_fast < INFINITY) ||
        !(hp->yarn_beta_slow >= 0 && hp->yarn_beta_slow < INFINITY)) {
        fprintf(stderr, "ref_model: bad YaRN hparams (yarn_orig_ctx %d beta_fast %g beta_slow %g)\n", hp->yarn_orig_ctx,
                hp->yarn_beta_fast, hp->yarn_beta_slow);
        return NULL;
    }
    /* gemma4's fields: refused elsewhere; on gemma4, its KV sharing as llama.cpp needs it */
    const int Lkv = hp->n_layer - hp->n_shared_kv;
    if (g4 ? hp->head_dim_swa < 0 || hp->head_dim_swa % 2 || hp->rope_pairs_full < 0 || hp->rope_pairs_full > hp->head_dim / 2 ||
                 hp->n_shared_kv < 0 || hp->n_embd_per_layer < 0 ||
                 (hp->n_shared_kv > 0 && (Lkv < 2 || hp->swa_layers[Lkv - 1] || !hp->swa_layers[Lkv - 2]))
           : hp->swa_layers || hp->head_dim_swa || hp->layer_n_head_kv || hp->layer_n_ff || hp->rope_pairs_full ||
                 hp->n_shared_kv || hp->n_embd_per_layer) {
        fprintf(stderr, "ref_model: bad gemma4 hparams for %s (head_dim_swa %d rope_pairs_full %d n_shared_kv %d "
                        "n_embd_per_layer %d)\n", hp->arch, hp->head_dim_swa, hp->rope_pairs_full, hp->n_shared_kv,
                hp->n_embd_per_layer);
        return NULL;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const int kv = hp->layer_n_head_kv ? hp->layer_n_head_kv[il] : hp->n_head_kv,
                  ff = hp->layer_n_ff ? hp->layer_n_ff[il] : hp->n_ff;
        if (kv <= 0 || hp->n_head % kv || (!experts && ff <= 0)) {
            fprintf(stderr, "ref_model: layer %d: %d KV heads for %d heads, %d FFN rows\n", il, kv, hp->n_head, ff);
            return NULL;
        }
    }
    ref_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    snprintf(m->arch, sizeof m->arch, "%s", hp->arch);
    m->hp.arch = m->arch;
    if (m->hp.attn_scale == 0) m->hp.attn_scale = g4 ? 1.0 : 1.0 / sqrt((double)hp->head_dim);
    if (m->hp.sliding_window > 0 && m->hp.swa_pattern == 0) m->hp.swa_pattern = gemma3 ? 6 : 2;
    if (m->hp.rope_freq_scale == 0) m->hp.rope_freq_scale = 1;
    if (m->hp.yarn_beta_fast == 0) m->hp.yarn_beta_fast = 32;
    if (m->hp.yarn_beta_slow == 0) m->hp.yarn_beta_slow = 1;
    m->embd_scale = gemma || g4 ? sqrt((double)hp->n_embd) : 1.0;
    m->gelu = gemma || g4;
    m->oss = oss;
    m->g4 = g4;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        free(m);
        return NULL;
    }
    /* each layer's geometry; F, Q, KV: the largest (scratch sizes) */
    int64_t Fmax = 0, Dmax = 0, KVmax = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        ref_layer *L = &m->layers[il];
        const bool swa = ref_layer_is_swa(hp, il);
        L->D = g4 && swa && hp->head_dim_swa ? hp->head_dim_swa : hp->head_dim;
        L->n_kv = hp->layer_n_head_kv ? hp->layer_n_head_kv[il] : hp->n_head_kv;
        L->F = experts ? hp->n_ff_exp : hp->layer_n_ff ? hp->layer_n_ff[il] : hp->n_ff;
        L->kv_src = il < Lkv ? il : swa ? Lkv - 2 : Lkv - 1;
        L->rope_pairs = g4 && !swa && hp->rope_pairs_full ? hp->rope_pairs_full : L->D / 2;
        Fmax = L->F > Fmax ? L->F : Fmax;
        Dmax = L->D > Dmax ? L->D : Dmax;
        KVmax = (int64_t)L->n_kv * L->D > KVmax ? (int64_t)L->n_kv * L->D : KVmax;
    }
    for (int il = Lkv; il < hp->n_layer; il++) {
        const ref_layer *L = &m->layers[il], *o = &m->layers[L->kv_src];
        if (L->D != o->D || L->n_kv != o->n_kv) {
            fprintf(stderr, "ref_model: layer %d reads layer %d's KV but its geometry differs\n", il, L->kv_src);
            ref_model_free(m);
            return NULL;
        }
    }
    /* F: rows of the FFN a token runs (each expert's, for MoE, the largest layer's for
     * gemma4); X: experts */
    const int64_t E = hp->n_embd, V = hp->n_vocab, F = g4moe && hp->n_ff_exp > Fmax ? hp->n_ff_exp : Fmax,
                  Q = (int64_t)hp->n_head * Dmax, KV = KVmax, X = hp->n_expert, P = hp->n_embd_per_layer, NL = hp->n_layer;
    bool ok = ref_load(get, user, "token_embd.weight", V * E, true, &m->tok_embd) &&
              ref_load(get, user, "output_norm.weight", E, true, &m->out_norm) &&
              ref_load(get, user, "output.weight", V * E, false, &m->output);
    if (ok && !m->output) m->output = m->tok_embd;
    if (ok && g4 && P > 0) {
        ok = ref_load(get, user, "per_layer_token_embd.weight", V * NL * P, true, &m->ple_tok) &&
             ref_load(get, user, "per_layer_model_proj.weight", NL * P * E, true, &m->ple_model_proj) &&
             ref_load(get, user, "per_layer_proj_norm.weight", P, true, &m->ple_proj_norm);
        m->ple = ok ? calloc((size_t)(NL * P), sizeof(double)) : NULL;
        m->pg = ok ? calloc((size_t)P, sizeof(double)) : NULL;
        ok = ok && m->ple && m->pg;
    }
    for (int il = 0; ok && g4 && il < hp->n_layer; il++) {
        ref_layer *L = &m->layers[il];
        char nm[96];
        const int64_t lq = (int64_t)hp->n_head * L->D, lkv = (int64_t)L->n_kv * L->D;
        const bool own = L->kv_src == il;
#define REF_LOAD(field, suffix, n, req) \
    (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), ref_load(get, user, nm, n, req, &L->field))
        ok = REF_LOAD(attn_norm, "attn_norm.weight", E, true) && REF_LOAD(wq, "attn_q.weight", lq * E, true) &&
             (!own || (REF_LOAD(wk, "attn_k.weight", lkv * E, true) && REF_LOAD(wv, "attn_v.weight", lkv * E, false) &&
                       REF_LOAD(k_norm, "attn_k_norm.weight", L->D, true))) &&
             REF_LOAD(q_norm, "attn_q_norm.weight", L->D, true) && REF_LOAD(wo, "attn_output.weight", E * lq, true) &&
             REF_LOAD(post_attn_norm, "post_attention_norm.weight", E, true) &&
             REF_LOAD(ffn_norm, "ffn_norm.weight", E, true) && REF_LOAD(gate, "ffn_gate.weight", (int64_t)L->F * E, true) &&
             REF_LOAD(up, "ffn_up.weight", (int64_t)L->F * E, true) &&
             REF_LOAD(down, "ffn_down.weight", E * L->F, true) && REF_LOAD(post_ffw_norm, "post_ffw_norm.weight", E, true) &&
             REF_LOAD(out_scale, "layer_output_scale.weight", 1, false) &&
             (P == 0 || (REF_LOAD(ple_gate, "inp_gate.weight", P * E, true) && REF_LOAD(ple_proj, "proj.weight", E * P, true) &&
                         REF_LOAD(ple_post_norm, "post_norm.weight", E, true)));
        const int64_t Fe = hp->n_ff_exp;
        if (ok && g4moe) ok = REF_LOAD(gate_inp, "ffn_gate_inp.weight", X * E, false);
        if (ok && L->gate_inp) /* a MoE layer */
            ok = REF_LOAD(gate_inp_s, "ffn_gate_inp.scale", E, true) &&
                 REF_LOAD(gate_exps, "ffn_gate_exps.weight", X * Fe * E, true) &&
                 REF_LOAD(up_exps, "ffn_up_exps.weight", X * Fe * E, true) &&
                 REF_LOAD(down_exps, "ffn_down_exps.weight", X * E * Fe, true) &&
                 REF_LOAD(down_exps_s, "ffn_down_exps.scale", X, false) &&
                 REF_LOAD(pre_ffw_norm_2, "pre_ffw_norm_2.weight", E, true) &&
                 REF_LOAD(post_ffw_norm_1, "post_ffw_norm_1.weight", E, true) &&
                 REF_LOAD(post_ffw_norm_2, "post_ffw_norm_2.weight", E, true);
    }
    for (int il = 0; ok && !g4 && il < hp->n_layer; il++) {
        ref_layer *L = &m->layers[il];
        char nm[96];
        if (phi3) { /* phi3: Q, K and V rows in one fused attn_qkv (in that order); split here */
            double *qkv = NULL;
            ok = REF_LOAD(attn_norm, "attn_norm.weight", E, true) &&
                 (snprintf(nm, sizeof nm, "blk.%d.attn_qkv.weight", il), ref_load(get, user, nm, (Q + 2 * KV) * E, true, &qkv));
            L->wq = ok ? malloc((size_t)(Q * E) * sizeof(double)) : NULL;
            L->wk = ok ? malloc((size_t)(KV * E) * sizeof(double)) : NULL;
            L->wv = ok ? malloc((size_t)(KV * E) * sizeof(double)) : NULL;
            ok = ok && L->wq && L->wk && L->wv;
            if (ok) {
                memcpy(L->wq, qkv, (size_t)(Q * E) * sizeof(double));
                memcpy(L->wk, qkv + Q * E, (size_t)(KV * E) * sizeof(double));
                memcpy(L->wv, qkv + (Q + KV) * E, (size_t)(KV * E) * sizeof(double));
            }
            free(qkv);
        }
        ok = ok && (phi3 || REF_LOAD(attn_norm, "attn_norm.weight", E, true)) &&
             (phi3 || (REF_LOAD(wq, "attn_q.weight", Q * E, true) && REF_LOAD(wk, "attn_k.weight", KV * E, true) &&
                       REF_LOAD(wv, "attn_v.weight", KV * E, true))) &&
             (gemma || /* llama.cpp's gemma2 and gemma3 have no biases */
              (REF_LOAD(bq, "attn_q.bias", Q, qwen2 || oss) && REF_LOAD(bk, "attn_k.bias", KV, qwen2 || oss) &&
               REF_LOAD(bv, "attn_v.bias", KV, qwen2 || oss))) &&
             (gemma2 || oss || /* nor gemma2's and gpt-oss's Q/K norms */
              (REF_LOAD(q_norm, "attn_q_norm.weight", hp->head_dim, qk_norm) &&
               REF_LOAD(k_norm, "attn_k_norm.weight", hp->head_dim, qk_norm))) &&
             REF_LOAD(wo, "attn_output.weight", E * Q, true) &&
             /* gpt-oss's FFN norm is its post_attention_norm */
             REF_LOAD(ffn_norm, oss ? "post_attention_norm.weight" : "ffn_norm.weight", E, true) &&
             (!gemma || (REF_LOAD(post_attn_norm, "post_attention_norm.weight", E, true) &&
                         REF_LOAD(post_ffw_norm, "post_ffw_norm.weight", E, true))) &&
             (!oss || (REF_LOAD(bo, "attn_output.bias", E, true) && REF_LOAD(sinks, "attn_sinks.weight", hp->n_head, true)));
        if (ok && phi3) { /* phi3: gate and up rows in one fused ffn_up (gate first) */
            double *gu = NULL;
            ok = (snprintf(nm, sizeof nm, "blk.%d.ffn_up.weight", il), ref_load(get, user, nm, 2 * F * E, true, &gu)) &&
                 REF_LOAD(down, "ffn_down.weight", E * F, true);
            L->gate = ok ? malloc((size_t)(F * E) * sizeof(double)) : NULL;
            L->up = ok ? malloc((size_t)(F * E) * sizeof(double)) : NULL;
            ok = ok && L->gate && L->up;
            if (ok) {
                memcpy(L->gate, gu, (size_t)(F * E) * sizeof(double));
                memcpy(L->up, gu + F * E, (size_t)(F * E) * sizeof(double));
            }
            free(gu);
        } else if (ok && !experts)
            ok = REF_LOAD(gate, "ffn_gate.weight", F * E, true) && REF_LOAD(up, "ffn_up.weight", F * E, true) &&
                 REF_LOAD(down, "ffn_down.weight", E * F, true);
        if (ok && experts)
            ok = REF_LOAD(gate_inp, "ffn_gate_inp.weight", X * E, true) &&
                 REF_LOAD(gate_exps, "ffn_gate_exps.weight", X * F * E, true) &&
                 REF_LOAD(up_exps, "ffn_up_exps.weight", X * F * E, true) &&
                 REF_LOAD(down_exps, "ffn_down_exps.weight", X * E * F, true);
        if (ok && oss)
            ok = REF_LOAD(gate_inp_b, "ffn_gate_inp.bias", X, true) &&
                 REF_LOAD(gate_exps_b, "ffn_gate_exps.bias", X * F, true) &&
                 REF_LOAD(up_exps_b, "ffn_up_exps.bias", X * F, true) &&
                 REF_LOAD(down_exps_b, "ffn_down_exps.bias", X * E, true);
#undef REF_LOAD
    }
    if (ok) {
        m->x = calloc((size_t)E, sizeof(double));
        m->h = calloc((size_t)E, sizeof(double));
        m->tmp = calloc((size_t)E, sizeof(double));
        m->q = calloc((size_t)(Q > E ? Q : E), sizeof(double)); /* gemma4's MoE layers use q and att for */
        m->att = calloc((size_t)(Q > E ? Q : E), sizeof(double)); /* vectors of n_embd */
        m->k = calloc((size_t)KV, sizeof(double));
        m->v = calloc((size_t)KV, sizeof(double));
        m->g = calloc((size_t)F, sizeof(double));
        m->u = calloc((size_t)F, sizeof(double));
        ok = m->x && m->h && m->tmp && m->q && m->att && m->k && m->v && m->g && m->u;
        if (ok && (experts || g4moe)) {
            m->probs = calloc((size_t)X, sizeof(double));
            m->chosen = calloc((size_t)X, sizeof(bool));
            m->ffn_out = calloc((size_t)E, sizeof(double));
            ok = m->probs && m->chosen && m->ffn_out;
        }
        if (!ok) fprintf(stderr, "ref_model: out of memory\n");
    }
    if (!ok) {
        ref_model_free(m);
        return NULL;
    }
    return m;
}

/* Forgets the sequence: the next token goes to position 0. */
static inline void ref_model_reset(ref_model *m) { m->n_past = 0; }

/* Number of tokens in the cache (= position of the next token). */
static inline int ref_model_n_past(const ref_model *m) { return m->n_past; }

/* Grows the cache to hold at least need tokens. */
static inline bool ref_reserve(ref_model *m, int need) {
    if (need <= m->cap) return true;
    int cap = m->cap ? m->cap : 16;
    while (cap < need) cap *= 2;
    double *sc = realloc(m->scores, (size_t)cap * sizeof(double));
    if (!sc) return false;
    m->scores = sc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        ref_layer *L = &m->layers[il];
        if (L->kv_src != il) continue; /* it reads another layer's cache */
        size_t kv = (size_t)L->n_kv * (size_t)L->D;
        double *k = realloc(L->k_cache, (size_t)cap * kv * sizeof(double));
        if (!k) return false;
        L->k_cache = k;
        double *v = realloc(L->v_cache, (size_t)cap * kv * sizeof(double));
        if (!v) return false;
        L->v_cache = v;
    }
    m->cap = cap; /* only once every array holds cap tokens */
    return true;
}

/* The mixture of experts of layer L on the normed FFN input x [n_embd], routed by
 * gate_inp · rx (rx: the router's input, x but for gemma4); the result goes to
 * m->ffn_out [n_embd]. Uses m->probs, m->chosen, m->g, m->u, m->tmp. */
static inline void ref_moe(ref_model *m, const ref_layer *L, const double *x, const double *rx) {
    const int E = m->hp.n_embd, F = m->hp.n_ff_exp, X = m->hp.n_expert, K = m->hp.n_expert_used;
    if (m->oss) { /* gpt-oss: biased router, top K logits, softmax over those K; biased clamped-SwiGLU experts */
        ref_matvec(L->gate_inp, x, L->gate_inp_b, X, E, m->probs); /* logits */
        for (int e = 0; e < X; e++) m->chosen[e] = false;
        double top = -INFINITY, z = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < X; e++)
                if (!m->chosen[e] && (best < 0 || m->probs[e] > m->probs[best])) best = e;
            m->chosen[best] = true;
            if (k == 0) top = m->probs[best];
            z += exp(m->probs[best] - top);
        }
        for (int i = 0; i < E; i++) m->ffn_out[i] = 0;
        for (int e = 0; e < X; e++) {
            if (!m->chosen[e]) continue;
            const size_t off = (size_t)e * (size_t)F * (size_t)E;
            ref_matvec(L->gate_exps + off, x, L->gate_exps_b + (size_t)e * F, F, E, m->g);
            ref_matvec(L->up_exps + off, x, L->up_exps_b + (size_t)e * F, F, E, m->u);
            for (int i = 0; i < F; i++) {
                const double g = m->g[i] < 7.0 ? m->g[i] : 7.0;
                const double u = m->u[i] < -7.0 ? -7.0 : m->u[i] > 7.0 ? 7.0 : m->u[i];
                m->g[i] = g / (1.0 + exp(-1.702 * g)) * (u + 1.0);
            }
            ref_matvec(L->down_exps + off, m->g, L->down_exps_b + (size_t)e * E, E, F, m->tmp);
            const double w = exp(m->probs[e] - top) / z;
            for (int i = 0; i < E; i++) m->ffn_out[i] += w * m->tmp[i];
        }
        return;
    }
    /* router: softmax over all experts, before the selection */
    ref_matvec(L->gate_inp, rx, NULL, X, E, m->probs);
    double mx = -INFINITY, z = 0;
    for (int e = 0; e < X; e++) mx = fmax(mx, m->probs[e]);
    for (int e = 0; e < X; e++) z += (m->probs[e] = exp(m->probs[e] - mx));
    for (int e = 0; e < X; e++) m->probs[e] /= z;
    /* top K by probability; the strict > keeps the lower index on a tie */
    double sum = 0;
    for (int e = 0; e < X; e++) m->chosen[e] = false;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < X; e++)
            if (!m->chosen[e] && (best < 0 || m->probs[e] > m->probs[best])) best = e;
        m->chosen[best] = true;
        sum += m->probs[best];
    }
    /* normalized top-K weights; llama.cpp floors the sum at 2^-14 (the smallest normal
     * f16), which a softmax's top K (sum >= K / n_expert) only reaches past 16384 experts */
    sum = fmax(sum, 6.103515625e-5);
    for (int i = 0; i < E; i++) m->ffn_out[i] = 0;
    for (int e = 0; e < X; e++) {
        if (!m->chosen[e]) continue;
        const size_t off = (size_t)e * (size_t)F * (size_t)E; /* expert e's matrix in each 3-D tensor */
        ref_ffn(L->gate_exps + off, L->up_exps + off, L->down_exps + off, E, F, m->gelu, x, m->g, m->u, m->tmp);
        const double w = m->probs[e] / sum * (L->down_exps_s ? L->down_exps_s[e] : 1.0); /* gemma4's per-expert scale */
        for (int i = 0; i < E; i++) m->ffn_out[i] += w * m->tmp[i];
    }
}

/* gemma4's per-layer inputs of the token (the header), from x0 = the scaled embedding,
 * into m->ple [n_layer][P]. */
static inline void ref_ple_inputs(ref_model *m, int32_t token, const double *x0) {
    const ref_hparams *hp = &m->hp;
    const int E = hp->n_embd, P = hp->n_embd_per_layer, NL = hp->n_layer;
    ref_matvec(m->ple_model_proj, x0, NULL, NL * P, E, m->ple);
    const double *tok = m->ple_tok + (size_t)token * (size_t)(NL * P);
    for (int l = 0; l < NL; l++) {
        double *p = m->ple + (size_t)l * P;
        for (int i = 0; i < P; i++) p[i] /= sqrt((double)E);
        ref_rms_norm(p, m->ple_proj_norm, P, hp->rms_eps, p);
        for (int i = 0; i < P; i++) p[i] = (p[i] + tok[l * P + i] * sqrt((double)P)) / sqrt(2.0);
    }
}

/* One token at position m->n_past through every layer; leaves the final hidden
 * state (before the output norm) in m->x. */
static inline void ref_forward_token(ref_model *m, int32_t token) {
    const ref_hparams *hp = &m->hp;
    const int E = hp->n_embd;
    const int pos = m->n_past;
    const double scale = hp->attn_scale; /* resolved at create */
    memcpy(m->x, m->tok_embd + (size_t)token * (size_t)E, (size_t)E * sizeof(double));
    if (m->embd_scale != 1.0)
        for (int i = 0; i < E; i++) m->x[i] *= m->embd_scale;
    if (m->ple) ref_ple_inputs(m, token, m->x);
    for (int il = 0; il < hp->n_layer; il++) {
        ref_layer *L = &m->layers[il];
        const ref_layer *S = &m->layers[L->kv_src]; /* whose cache the layer attends over */
        const int D = L->D, Q = hp->n_head * D, KV = L->n_kv * D, group = hp->n_head / L->n_kv;
        /* first visible cache entry: pos - sliding_window + 1 on a sliding layer */
        const int t0 = ref_layer_is_swa(hp, il) && pos >= hp->sliding_window ? pos - hp->sliding_window + 1 : 0;
        /* attention */
        ref_rms_norm(m->x, L->attn_norm, E, hp->rms_eps, m->h);
        ref_matvec(L->wq, m->h, L->bq, Q, E, m->q);
        const bool own = L->kv_src == il;
        if (own) {
            ref_matvec(L->wk, m->h, L->bk, KV, E, m->k);
            if (L->wv) ref_matvec(L->wv, m->h, L->bv, KV, E, m->v);
            else memcpy(m->v, m->k, (size_t)KV * sizeof(double)); /* gemma4 without attn_v: V is K's projection */
        }
        if (L->q_norm)
            for (int hd = 0; hd < hp->n_head; hd++) ref_rms_norm(m->q + hd * D, L->q_norm, D, hp->rms_eps, m->q + hd * D);
        if (own && L->k_norm)
            for (int hd = 0; hd < L->n_kv; hd++) ref_rms_norm(m->k + hd * D, L->k_norm, D, hp->rms_eps, m->k + hd * D);
        if (own && m->g4) /* V's norm without a weight */
            for (int hd = 0; hd < L->n_kv; hd++) {
                double ss = 0, *v = m->v + hd * D;
                for (int i = 0; i < D; i++) ss += v[i] * v[i];
                for (int i = 0; i < D; i++) v[i] /= sqrt(ss / D + hp->rms_eps);
            }
        double base, fscale;
        ref_layer_rope(hp, il, &base, &fscale);
        if (hp->nope_step > 0 && (il + 1) % hp->nope_step == 0) {
            /* a NoPE layer: q and k as projected */
        } else if (hp->yarn_orig_ctx > 0) { /* YaRN: its angles, and its magnitude on q and k */
            const double ms = hp->yarn_mscale > 0 ? hp->yarn_mscale : fscale < 1 ? 1.0 + 0.1 * log(1.0 / fscale) : 1.0;
            ref_rope_yarn(m->q, hp->n_head, D, pos, base, fscale, hp->yarn_orig_ctx, hp->yarn_beta_fast, hp->yarn_beta_slow,
                          hp->rope_neox, ms);
            ref_rope_yarn(m->k, L->n_kv, D, pos, base, fscale, hp->yarn_orig_ctx, hp->yarn_beta_fast, hp->yarn_beta_slow,
                          hp->rope_neox, ms);
        } else if (hp->rope_factors) { /* LongRoPE: the factors, and the attention factor on q and k */
            const double ms = hp->rope_attn_factor > 0 ? hp->rope_attn_factor : 1.0;
            ref_rope_factors(m->q, hp->n_head, D, pos * fscale, base, hp->rope_neox, hp->rope_factors, ms);
            if (own) ref_rope_factors(m->k, L->n_kv, D, pos * fscale, base, hp->rope_neox, hp->rope_factors, ms);
        } else {
            ref_rope_pairs(m->q, hp->n_head, D, pos * fscale, base, hp->rope_neox, L->rope_pairs);
            if (own) ref_rope_pairs(m->k, L->n_kv, D, pos * fscale, base, hp->rope_neox, L->rope_pairs);
        }
        if (hp->attn_temp_scale != 0) { /* Llama 4's temperature tuning of the queries */
            const double t = 1.0 + hp->attn_temp_scale * log(floor((double)pos / hp->attn_temp_floor) + 1.0);
            for (int i = 0; i < hp->n_head * D; i++) m->q[i] *= t;
        }
        if (own) {
            memcpy(L->k_cache + (size_t)pos * KV, m->k, (size_t)KV * sizeof(double));
            memcpy(L->v_cache + (size_t)pos * KV, m->v, (size_t)KV * sizeof(double));
        }
        for (int hq = 0; hq < hp->n_head; hq++) {
            const int hk = hq / group;
            const double *q = m->q + hq * D;
            double mx = -INFINITY, z = 0;
            for (int t = t0; t <= pos; t++) {
                const double *k = S->k_cache + (size_t)t * KV + hk * D;
                double s = 0;
                for (int d = 0; d < D; d++) s += q[d] * k[d];
                m->scores[t] = ref_softcap(s * scale, hp->attn_softcap);
                if (m->scores[t] > mx) mx = m->scores[t];
            }
            /* a sink (gpt-oss) is one more logit whose value is zero: it only adds to z */
            const double sink = L->sinks ? L->sinks[hq] : -INFINITY;
            if (sink > mx) mx = sink;
            if (L->sinks) z = exp(sink - mx);
            for (int t = t0; t <= pos; t++) z += (m->scores[t] = exp(m->scores[t] - mx));
            double *o = m->att + hq * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (int t = t0; t <= pos; t++) {
                const double *v = S->v_cache + (size_t)t * KV + hk * D;
                double p = m->scores[t] / z;
                for (int d = 0; d < D; d++) o[d] += p * v[d];
            }
        }
        ref_matvec(L->wo, m->att, L->bo, E, Q, m->tmp);
        if (L->post_attn_norm) ref_rms_norm(m->tmp, L->post_attn_norm, E, hp->rms_eps, m->tmp);
        for (int i = 0; i < E; i++) m->x[i] += m->tmp[i];
        /* feed-forward: dense, or a mixture of experts, or (gemma4) both */
        ref_rms_norm(m->x, L->ffn_norm, E, hp->rms_eps, m->h);
        double *ffn;
        if (L->gate_inp && m->g4) {
            /* the dense FFN normed by post_ffw_norm_1 (in tmp, then h) */
            ref_ffn(L->gate, L->up, L->down, E, L->F, true, m->h, m->g, m->u, m->tmp);
            ref_rms_norm(m->tmp, L->post_ffw_norm_1, E, hp->rms_eps, m->h);
            /* the router's input: rmsnorm(x) / sqrt(n_embd) * ffn_gate_inp.scale (in att) */
            double ss = 0;
            for (int i = 0; i < E; i++) ss += m->x[i] * m->x[i];
            for (int i = 0; i < E; i++) m->att[i] = m->x[i] / sqrt(ss / E + hp->rms_eps) / sqrt((double)E) * L->gate_inp_s[i];
            /* the experts on pre_ffw_norm_2(x) (in q), normed by post_ffw_norm_2 */
            ref_rms_norm(m->x, L->pre_ffw_norm_2, E, hp->rms_eps, m->q);
            ref_moe(m, L, m->q, m->att);
            ref_rms_norm(m->ffn_out, L->post_ffw_norm_2, E, hp->rms_eps, m->ffn_out);
            for (int i = 0; i < E; i++) m->ffn_out[i] += m->h[i];
            ffn = m->ffn_out;
        } else if (L->gate_inp) {
            ref_moe(m, L, m->h, m->h);
            ffn = m->ffn_out;
        } else {
            ref_ffn(L->gate, L->up, L->down, E, L->F, m->gelu, m->h, m->g, m->u, m->tmp);
            ffn = m->tmp;
        }
        if (L->post_ffw_norm) ref_rms_norm(ffn, L->post_ffw_norm, E, hp->rms_eps, ffn);
        for (int i = 0; i < E; i++) m->x[i] += ffn[i];
        if (L->ple_gate) { /* gemma4's per-layer embedding */
            const int P = hp->n_embd_per_layer;
            ref_matvec(L->ple_gate, m->x, NULL, P, E, m->pg);
            for (int i = 0; i < P; i++) m->pg[i] = ref_gelu(m->pg[i]) * m->ple[(size_t)il * P + i];
            ref_matvec(L->ple_proj, m->pg, NULL, E, P, m->tmp);
            ref_rms_norm(m->tmp, L->ple_post_norm, E, hp->rms_eps, m->tmp);
            for (int i = 0; i < E; i++) m->x[i] += m->tmp[i];
        }
        if (L->out_scale)
            for (int i = 0; i < E; i++) m->x[i] *= L->out_scale[0];
    }
    m->n_past++;
}

/* Final norm and output projection of m->x into logits [n_vocab], then the final
 * softcap (gemma2; gemma3 where set). */
static inline void ref_logits(ref_model *m, double *logits) {
    ref_rms_norm(m->x, m->out_norm, m->hp.n_embd, m->hp.rms_eps, m->h);
    ref_matvec(m->output, m->h, NULL, m->hp.n_vocab, m->hp.n_embd, logits);
    if (m->hp.final_softcap > 0)
        for (int i = 0; i < m->hp.n_vocab; i++) logits[i] = ref_softcap(logits[i], m->hp.final_softcap);
}

/* Appends n tokens at positions n_past .. n_past+n-1, one at a time. Writes the last
 * token's logits to logits_last [n_vocab] (if not NULL) and every token's to
 * logits_all [n][n_vocab] (if not NULL). Returns 0, or -1 (model unchanged) for a
 * token outside [0, n_vocab), n < 1 or no memory. */
static inline int ref_model_eval(ref_model *m, const int32_t *tokens, int n, double *logits_last,
                                 double *logits_all) {
    if (!m || !tokens || n < 1) return -1;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab) {
            fprintf(stderr, "ref_model: token %d at %d is outside [0, %d)\n", (int)tokens[i], i, m->hp.n_vocab);
            return -1;
        }
    }
    if (!ref_reserve(m, m->n_past + n)) {
        fprintf(stderr, "ref_model: out of memory for %d tokens\n", m->n_past + n);
        return -1;
    }
    const size_t V = (size_t)m->hp.n_vocab;
    for (int i = 0; i < n; i++) {
        ref_forward_token(m, tokens[i]);
        if (logits_all) ref_logits(m, logits_all + (size_t)i * V);
    }
    if (logits_last) {
        if (logits_all)
            memcpy(logits_last, logits_all + (size_t)(n - 1) * V, V * sizeof(double));
        else
            ref_logits(m, logits_last);
    }
    return 0;
}

/* The cached K (after RoPE) and V of layer il at position pos, each
 * [n_head_kv][head_dim], for comparing a KV cache's content; NULL when out of range. */
static inline const double *ref_model_k(const ref_model *m, int il, int pos) {
    if (il < 0 || il >= m->hp.n_layer || pos < 0 || pos >= m->n_past) return NULL;
    const ref_layer *S = &m->layers[m->layers[il].kv_src]; /* gemma4's sharing layers: the owner's */
    return S->k_cache + (size_t)pos * (size_t)(S->n_kv * S->D);
}
static inline const double *ref_model_v(const ref_model *m, int il, int pos) {
    if (il < 0 || il >= m->hp.n_layer || pos < 0 || pos >= m->n_past) return NULL;
    const ref_layer *S = &m->layers[m->layers[il].kv_src];
    return S->v_cache + (size_t)pos * (size_t)(S->n_kv * S->D);
}

/* Makes dst's sequence a copy of src's (the reference for a fork): the same cache
 * content and position. Both must come from the same hparams. Returns -1 (dst
 * unchanged) on a geometry mismatch or no memory. */
static inline int ref_model_copy_cache(ref_model *dst, const ref_model *src) {
    const ref_hparams *a = &dst->hp, *b = &src->hp;
    bool same = a->n_layer == b->n_layer;
    for (int il = 0; same && il < b->n_layer; il++)
        same = dst->layers[il].n_kv == src->layers[il].n_kv && dst->layers[il].D == src->layers[il].D &&
               dst->layers[il].kv_src == src->layers[il].kv_src;
    if (!same) {
        fprintf(stderr, "ref_model: copy_cache between different geometries\n");
        return -1;
    }
    if (!ref_reserve(dst, src->n_past)) return -1;
    for (int il = 0; il < b->n_layer && src->n_past; il++) {
        const ref_layer *L = &src->layers[il];
        if (L->kv_src != il) continue;
        size_t bytes = (size_t)src->n_past * (size_t)(L->n_kv * L->D) * sizeof(double);
        memcpy(dst->layers[il].k_cache, L->k_cache, bytes);
        memcpy(dst->layers[il].v_cache, L->v_cache, bytes);
    }
    dst->n_past = src->n_past;
    return 0;
}

/* Keeps the first n tokens of the cache (rollback). Returns -1 when n is outside
 * [0, n_past]. */
static inline int ref_model_truncate(ref_model *m, int n) {
    if (n < 0 || n > m->n_past) return -1;
    m->n_past = n;
    return 0;
}

/* Context shift: drops cache entries [p0, p1) and moves the later ones back by
 * p1 - p0, re-rotating their K by -(p1 - p0) so each is at its new position. Their
 * V and their K content otherwise stay as computed (they attended to the dropped
 * tokens), exactly what a KV cache shift does. Returns -1 on a bad range. */
static inline int ref_model_remove(ref_model *m, int p0, int p1) {
    if (p0 < 0 || p1 < p0 || p1 > m->n_past) return -1;
    const int d = p1 - p0;
    if (d == 0) return 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        ref_layer *L = &m->layers[il];
        if (L->kv_src != il) continue; /* gemma4's sharing layers have no cache */
        const int KV = L->n_kv * L->D;
        double base, fscale;
        ref_layer_rope(&m->hp, il, &base, &fscale);
        const bool nope = m->hp.nope_step > 0 && (il + 1) % m->hp.nope_step == 0;
        for (int t = p1; t < m->n_past; t++) {
            double *k = L->k_cache + (size_t)(t - d) * KV;
            memcpy(k, L->k_cache + (size_t)t * KV, (size_t)KV * sizeof(double));
            memcpy(L->v_cache + (size_t)(t - d) * KV, L->v_cache + (size_t)t * KV, (size_t)KV * sizeof(double));
            if (nope) /* no angle to change */
                continue;
            if (m->hp.yarn_orig_ctx > 0) /* YaRN's angles; the magnitude is in k already */
                ref_rope_yarn(k, L->n_kv, L->D, -(double)d, base, fscale, m->hp.yarn_orig_ctx, m->hp.yarn_beta_fast,
                              m->hp.yarn_beta_slow, m->hp.rope_neox, 1.0);
            else if (m->hp.rope_factors) /* LongRoPE's angles; the attention factor is in k already */
                ref_rope_factors(k, L->n_kv, L->D, -(double)d * fscale, base, m->hp.rope_neox, m->hp.rope_factors, 1.0);
            else
                ref_rope_pairs(k, L->n_kv, L->D, -(double)d * fscale, base, m->hp.rope_neox, L->rope_pairs);
        }
    }
    m->n_past -= d;
    return 0;
}

/* ------------------------------------------- Gemma 4's assistant (MTP drafter) */

/* The target's final normed hidden state of its last evaluated token (what its
 * output matrix multiplies), out [n_embd]. */
static inline void ref_model_hidden(const ref_model *m, double *out) {
    ref_rms_norm(m->x, m->out_norm, m->hp.n_embd, m->hp.rms_eps, out);
}

/* The assistant's sizes: Ea = n_embd, its target's width Eb = n_embd_out; each layer
 * slides or not (swa_layers) with the target's head sizes and KV heads of the target
 * layer it reads; RoPE as the target's (the full layers turn rope_pairs_full pairs). */
typedef struct ref_asst_hparams {
    int n_layer, n_embd, n_embd_out, n_head, n_ff, n_vocab;
    double rms_eps, rope_base, rope_base_swa;
    const unsigned char *swa_layers; /* [n_layer] */
} ref_asst_hparams;

typedef struct ref_asst {
    ref_asst_hparams hp;
    double *tok_embd;   /* [n_vocab][Ea]: the tied head only */
    double *out_norm;   /* [Ea] */
    double *pre;        /* [Ea][2 Eb]: the target's scaled embedding, then h */
    double *post;       /* [Eb][Ea] */
    struct {
        double *attn_norm, *wq, *q_norm, *wo, *post_attn_norm, *ffn_norm, *gate, *up, *down, *post_ffw_norm, *out_scale;
    } *L;
    double *x, *h, *tmp, *in, *q, *att, *g, *u, *scores; /* scratch */
} ref_asst;

static inline void ref_asst_free(ref_asst *a) {
    if (!a) return;
    for (int il = 0; a->L && il < a->hp.n_layer; il++) {
        free(a->L[il].attn_norm), free(a->L[il].wq), free(a->L[il].q_norm), free(a->L[il].wo), free(a->L[il].post_attn_norm);
        free(a->L[il].ffn_norm), free(a->L[il].gate), free(a->L[il].up), free(a->L[il].down), free(a->L[il].post_ffw_norm);
        free(a->L[il].out_scale);
    }
    free(a->L), free(a->tok_embd), free(a->out_norm), free(a->pre), free(a->post);
    free(a->x), free(a->h), free(a->tmp), free(a->in), free(a->q), free(a->att), free(a->g), free(a->u), free(a->scores);
    free(a);
}

/* The assistant for target t (whose layer geometry its layers take): NULL (with a
 * message) on a missing or misshapen tensor. */
static inline ref_asst *ref_asst_create(const ref_asst_hparams *hp, const ref_model *t, ref_get_tensor get, void *user) {
    ref_asst *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->hp = *hp;
    const int Ea = hp->n_embd, Eb = hp->n_embd_out, TL = t->hp.n_layer;
    const int Dmax = t->layers[TL - 1].D > t->layers[TL - 2].D ? t->layers[TL - 1].D : t->layers[TL - 2].D;
    const int64_t cap = 1 << 16;
    a->L = calloc((size_t)hp->n_layer, sizeof *a->L);
    a->x = calloc((size_t)Ea, 8), a->h = calloc((size_t)Ea, 8), a->tmp = calloc((size_t)(Ea > Eb ? Ea : Eb), 8);
    a->in = calloc(2 * (size_t)Eb, 8), a->q = calloc((size_t)hp->n_head * Dmax, 8), a->att = calloc((size_t)hp->n_head * Dmax, 8);
    a->g = calloc((size_t)hp->n_ff, 8), a->u = calloc((size_t)hp->n_ff, 8), a->scores = calloc((size_t)cap, 8);
    bool ok = a->L && a->x && a->h && a->tmp && a->in && a->q && a->att && a->g && a->u && a->scores &&
              ref_load(get, user, "token_embd.weight", (int64_t)hp->n_vocab * Ea, true, &a->tok_embd) &&
              ref_load(get, user, "output_norm.weight", Ea, true, &a->out_norm) &&
              ref_load(get, user, "nextn.pre_projection.weight", (int64_t)Ea * 2 * Eb, true, &a->pre) &&
              ref_load(get, user, "nextn.post_projection.weight", (int64_t)Eb * Ea, true, &a->post);
    for (int il = 0; ok && il < hp->n_layer; il++) {
        const ref_layer *S = &t->layers[hp->swa_layers[il] ? TL - 2 : TL - 1];
        const int64_t D = S->D, Q = (int64_t)hp->n_head * D, F = hp->n_ff;
        char n[96];
#define REF_ALOAD(field, suffix, cnt) \
    (snprintf(n, sizeof n, "blk.%d.%s", il, suffix), ref_load(get, user, n, (cnt), true, &a->L[il].field))
        ok = REF_ALOAD(attn_norm, "attn_norm.weight", Ea) && REF_ALOAD(wq, "attn_q.weight", Q * Ea) &&
             REF_ALOAD(q_norm, "attn_q_norm.weight", D) && REF_ALOAD(wo, "attn_output.weight", Ea * Q) &&
             REF_ALOAD(post_attn_norm, "post_attention_norm.weight", Ea) && REF_ALOAD(ffn_norm, "ffn_norm.weight", Ea) &&
             REF_ALOAD(gate, "ffn_gate.weight", F * Ea) && REF_ALOAD(up, "ffn_up.weight", F * Ea) &&
             REF_ALOAD(down, "ffn_down.weight", Ea * F) && REF_ALOAD(post_ffw_norm, "post_ffw_norm.weight", Ea) &&
             REF_ALOAD(out_scale, "layer_output_scale.weight", 1);
#undef REF_ALOAD
    }
    if (!ok) {
        ref_asst_free(a);
        return NULL;
    }
    return a;
}

/* One drafting step over target t's cache, as llama.cpp's gemma4-assistant graph:
 * token `token` with the target's hidden state h [Eb], a query at position pos that
 * sees the target's cached positions < pos (sliding layers: > pos - window); a
 * sliding layer reads the KV of the target's layer n_layer - 2, a full one of
 * n_layer - 1 (each resolved to its owner). logits [n_vocab] (tied, no soft-cap) and
 * h_next [Eb] = post_projection of the final normed x. Returns -1 on bad arguments. */
static inline int ref_asst_step(ref_asst *a, const ref_model *t, int32_t token, const double *h, int pos, double *logits,
                                double *h_next) {
    const ref_asst_hparams *hp = &a->hp;
    const int Ea = hp->n_embd, Eb = hp->n_embd_out, TL = t->hp.n_layer;
    if (token < 0 || token >= hp->n_vocab || pos < 1 || pos > t->n_past || Eb != t->hp.n_embd) return -1;
    /* x = pre · [embd_target(token) * sqrt(Eb); h] */
    for (int i = 0; i < Eb; i++) a->in[i] = t->tok_embd[(size_t)token * Eb + i] * sqrt((double)Eb);
    memcpy(a->in + Eb, h, (size_t)Eb * sizeof(double));
    ref_matvec(a->pre, a->in, NULL, Ea, 2 * Eb, a->x);
    for (int il = 0; il < hp->n_layer; il++) {
        const bool swa = hp->swa_layers[il] != 0;
        const ref_layer *S = &t->layers[t->layers[swa ? TL - 2 : TL - 1].kv_src];
        const int D = S->D, Q = hp->n_head * D, KV = S->n_kv * D, group = hp->n_head / S->n_kv;
        const int t0 = swa && pos >= t->hp.sliding_window ? pos - t->hp.sliding_window + 1 : 0;
        ref_rms_norm(a->x, a->L[il].attn_norm, Ea, hp->rms_eps, a->h);
        ref_matvec(a->L[il].wq, a->h, NULL, Q, Ea, a->q);
        for (int hd = 0; hd < hp->n_head; hd++) ref_rms_norm(a->q + hd * D, a->L[il].q_norm, D, hp->rms_eps, a->q + hd * D);
        ref_rope_pairs(a->q, hp->n_head, D, pos, swa ? hp->rope_base_swa : hp->rope_base, true, S->rope_pairs);
        for (int hq = 0; hq < hp->n_head; hq++) {
            const int hk = hq / group;
            const double *q = a->q + hq * D;
            double mx = -INFINITY, z = 0;
            for (int u = t0; u < pos; u++) {
                const double *k = S->k_cache + (size_t)u * KV + hk * D;
                double sc = 0;
                for (int d = 0; d < D; d++) sc += q[d] * k[d];
                a->scores[u] = sc; /* scale 1 */
                if (sc > mx) mx = sc;
            }
            for (int u = t0; u < pos; u++) z += (a->scores[u] = exp(a->scores[u] - mx));
            double *o = a->att + hq * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (int u = t0; u < pos; u++) {
                const double *v = S->v_cache + (size_t)u * KV + hk * D;
                for (int d = 0; d < D; d++) o[d] += a->scores[u] / z * v[d];
            }
        }
        ref_matvec(a->L[il].wo, a->att, NULL, Ea, Q, a->tmp);
        ref_rms_norm(a->tmp, a->L[il].post_attn_norm, Ea, hp->rms_eps, a->tmp);
        for (int i = 0; i < Ea; i++) a->x[i] += a->tmp[i];
        ref_rms_norm(a->x, a->L[il].ffn_norm, Ea, hp->rms_eps, a->h);
        ref_ffn(a->L[il].gate, a->L[il].up, a->L[il].down, Ea, hp->n_ff, true, a->h, a->g, a->u, a->tmp);
        ref_rms_norm(a->tmp, a->L[il].post_ffw_norm, Ea, hp->rms_eps, a->tmp);
        for (int i = 0; i < Ea; i++) a->x[i] = (a->x[i] + a->tmp[i]) * a->L[il].out_scale[0];
    }
    ref_rms_norm(a->x, a->out_norm, Ea, hp->rms_eps, a->h);
    ref_matvec(a->tok_embd, a->h, NULL, hp->n_vocab, Ea, logits);
    ref_matvec(a->post, a->h, NULL, Eb, Ea, h_next);
    return 0;
}

#endif /* PKV_REF_MODEL_H */
