/* The building blocks of a forward step (model layer, internal): the kinds of
 * attention, FFN and mixture of experts that architectures compose, one layer at a
 * time, in src/model/arch/<arch>.c. Each block reads the residual stream x (f32
 * [T][n_embd] on the model's first device) and adds its output to it; what differs
 * between architectures is said in the block's kind, never by testing the
 * architecture inside a block.
 *
 * The workspace the blocks share (device buffers grown on demand and kept between
 * steps, so a decode step allocates nothing) is declared here too, for forward.c,
 * which plans the step, runs the embedding, calls the architecture's layers and
 * produces the logits. */
#ifndef PKV_BLOCKS_H
#define PKV_BLOCKS_H

#include "model/forward.h"

/* Workspace buffers of one device. */
typedef struct pkv_dev_ws {
    pkv_device *dev;
    int64_t cap_tokens, cap_out;
    size_t cap_ints;
    pkv_buffer *x;      /* f32 [T][E] residual stream (first device) */
    pkv_buffer *xb;     /* f32 [T][max(E, qd, od)] */
    pkv_buffer *y;      /* f32 [T][E] a shard's partial output */
    pkv_buffer *q;      /* f32 [T][qd] */
    pkv_buffer *k, *v;  /* f32 [T][kd], [T][vd] */
    pkv_buffer *att;    /* f32 [T][od] */
    pkv_buffer *hb, *hb2; /* f32 [T][F] */
    pkv_buffer *logits; /* f32 [n_out][V] (first device) */
    pkv_buffer *ints;   /* i32: ids[T] pos[T] rows[T] out[n_out] meta[...] (pkv_fwd_plan) */
    /* mixture of experts: the router's on the first device; xe and moe_ids on each
     * device that holds experts */
    pkv_buffer *router; /* f32 [T][n_expert] */
    pkv_buffer *xe;     /* f32 [T][E] the rows routed to one expert */
    pkv_buffer *moe_ids; /* i32 [T] */
    pkv_buffer *moe_sel; /* first device: i32 [T][n_used] each token's experts, then f32 [T][n_used] their weights */
    pkv_buffer *moe_wt;  /* first device: f32 [T] the weights of one expert's rows in the sum */
    pkv_buffer *moe_acc; /* first device: f32 [T][E] the experts' sum */
    pkv_buffer *gate;   /* f32 [T][od] the attention output's gate (qwen35) */
    /* gated delta-net layers (every model device; a shard uses its part of each) */
    pkv_buffer *ssm_u;  /* f32 [T][channels] */
    pkv_buffer *ssm_z;  /* f32 [T][Hv dv], then the normed, gated output */
    pkv_buffer *ssm_bg; /* f32 [2][T][Hv]: beta, then g */
    pkv_buffer *ssm_o;  /* f32 [T][Hv dv] */
    /* per-layer embeddings (gemma4; first device) */
    pkv_buffer *ple;     /* f32 [n_layer][T][P] every layer's per-layer input */
    pkv_buffer *ple_tok; /* f32 [n_layer][T][P] the tokens' rows of per_layer_token_embd, scaled */
    pkv_buffer *ple_g;   /* f32 [T][P] */
    pkv_buffer *ffn_acc; /* f32 [2][T][E]: a dense FFN's and the experts' outputs (hp.moe_dense) */
    /* a Gemma 4 assistant (hp.n_embd_out = Eb > 0): on its device, and on its target's
     * (whose token table gives the embedding) */
    pkv_buffer *emb;     /* f32 [T][Eb] the target's embedding rows, scaled */
    pkv_buffer *hid;     /* f32 [T][Eb] the target's hidden states in; the next ones out */
    /* a model reading another's tensor-parallel cache from one device: one shard's
     * query heads and their attention output (pkv_model.kv_draft) */
    pkv_buffer *qpart;   /* f32 [T][qd] */
    pkv_buffer *apart;   /* f32 [T][od] */
    /* multi-head latent attention (hp.mla.kv_lora > 0; every device): f32 [T][M] each,
     * M the widest of a layer's heads times their nope, rope, latent or value dims, and
     * q_lora; token-major or head-major as pkv_blk_mla uses them */
    pkv_buffer *mla_a, *mla_b, *mla_c;
} pkv_dev_ws;

struct pkv_fwd_ws {
    int n;
    pkv_dev_ws d[PKV_MAX_DEVICES + 1]; /* every device of the model, and the host */
    int32_t *host_ints;
    size_t host_cap;
    /* MoE routing and combining on the host: probs [T][n_expert], out [T][E],
     * y [T][E], rows [T] (token of each routed row), sel [T][n_expert_used],
     * wsel [T][n_expert_used] */
    float *h_probs, *h_out, *h_y, *h_wsel, *h_x; /* h_x [T][E]: the experts' input (weight_in) */
    int32_t *h_rows, *h_sel;
    int64_t h_cap_tokens;
    /* LoRA (lora.c; on the model's device): each sequence's scales f32 [n_seqs][PKV_MAX_LORA],
     * A x f32 [rows][r], B (A x) f32 [rows][out] */
    pkv_buffer *lora_s, *lora_t, *lora_d;
    size_t lora_s_cap, lora_t_cap, lora_d_cap;
    float *h_ple;      /* [n_layer][T][P] the tokens' per-layer rows, then one row [n_layer * P] */
    size_t h_ple_cap;  /* floats */
    pkv_region *regions; /* [cap_regions] pkv_blk_mla's gathers and scatters of heads */
    size_t cap_regions;
};

/* The workspace of dev (created empty on first use); NULL when there are more
 * devices than the workspace holds. */
pkv_dev_ws *pkv_fwd_dev(pkv_fwd_ws *ws, pkv_device *dev);

/* Make every device the step touches (the model's, and where the cache stores
 * KV) hold T tokens, n_out logits rows and n_ints ints; *wsp is created if NULL. */
pkv_status pkv_fwd_reserve(const pkv_model *m, pkv_kv_cache *c, pkv_fwd_ws **wsp, int64_t T, int64_t n_out, size_t n_ints);

/* One step as the blocks see it. */
typedef struct pkv_fwd {
    pkv_model *m;
    pkv_kv_cache *c;
    pkv_fwd_ws *ws;
    const pkv_fwd_plan *pl;
    const pkv_fwd_batch *b; /* the step's batch */
    int64_t T;
    /* Recomputing window layers (pkv_fwd_plan.replay) ends with an attention: the
     * FFN and expert blocks of that last layer do nothing. */
    bool attn_only;
    /* [n_seqs] each sequence's LoRA set (an entry NULL: the model's default); NULL when no
     * sequence of the step applies an adapter (pkv_lora_step) */
    const pkv_lora_set *const *lora;
} pkv_fwd;

/* The default input (pkv_arch_ops.input): x = the token embedding rows of the
 * step's tokens times hp.embd_scale, and where the batch has media rows, those
 * rows in place of their tokens', unscaled. */
pkv_status pkv_blk_embed(pkv_fwd *f);
/* The input of the architectures with an MTP head (pkv_arch_ops.input): the
 * embedding (pkv_blk_embed); an MTP head (pkv_model.mtp) then mixes it with the
 * target's hidden states h (pkv_fwd_batch.hidden_in, required):
 *   x = eh_e·enorm(x) + eh_h·hnorm(h) */
pkv_status pkv_blk_nextn_input(pkv_fwd *f);
/* The default head's work (pkv_arch_ops.output): the output rows' final norm and
 * output projection into the first device's logits buffer, then read into the host
 * array logits (NULL: not read). With pkv_fwd_batch.hidden_out every row's final
 * normed hidden state is read into it as well. No device sync. */
pkv_status pkv_blk_logits(pkv_fwd *f, float *logits);

/* y = x·wᵀ for T rows on dev (T: the step's tokens, or its logits rows), plus the
 * deltas of the LoRA adapters each sequence applies to w (lora.c). */
pkv_status pkv_blk_matmul(const pkv_fwd *f, pkv_device *dev, const pkv_weight *w, pkv_buffer *x, pkv_buffer *y, int64_t T);
/* y = rmsnorm(x) * w over rows of len. */
pkv_status pkv_blk_rmsnorm(pkv_device *dev, pkv_buffer *x, const pkv_weight *w, pkv_buffer *y, int64_t rows, int64_t len,
                           float eps);

/* Attention over the paged cache. x += post_norm(o(attn(rope(q), rope(k), v))) with
 * q, k, v the layer's projections of norm(x), each plus its bias where the file has
 * one, and o's bias likewise. Every shard on its device; attention runs where the
 * shard's KV is stored; the layer's window, RoPE base and scale are its own
 * (pkv_layer), the scale and soft-cap the model's (pkv_hparams). */
typedef struct pkv_attn_kind {
    const pkv_weight *norm;      /* RMS norm of the input */
    bool qk_norm;                /* per-head RMS norms of q and k before RoPE (qwen3, gemma3) */
    bool sinks;                  /* a learned logit per head in each softmax (gpt-oss) */
    const pkv_weight *post_norm; /* RMS norm of the output before the residual add (gemma); NULL: none */
    bool out_gate;               /* attention output times sigmoid(wq_gate·xb) before o (qwen35) */
    bool v_norm;                 /* a weightless RMS norm of each V head (gemma4) */
    bool temp;                   /* queries times hp.attn_temp's factor of their position after RoPE (mistral3;
                                    llama4's NoPE layers: in place of RoPE) */
    bool qk_norm_roped;          /* weightless RMS norms of q and k heads after RoPE (llama4's "L2 norm";
                                    pkv_attn_tensors.qk_unit) */
} pkv_attn_kind;
/* Where the file has no V projection, V is K's (before K's norm and RoPE). A layer
 * that reuses an earlier layer's KV (pkv_layer.kv_reuse) computes only q and attends
 * over that layer's cache. */
pkv_status pkv_blk_attention(pkv_fwd *f, int il, const pkv_attn_kind *k);

/* Multi-head latent attention (deepseek2) in place of pkv_blk_attention, as llama.cpp
 * runs it absorbed; R = pkv_layer.latent, P = n_rot, N = hp.mla.dk - P, per token:
 *   xb = norm(x)
 *   c = rmsnorm_{kv_norm}(kv_lat·xb) [R];  k_pe = rope(kv_pe·xb) [P]   cache row [c, k_pe]
 *   q = q_b·rmsnorm_{q_a_norm}(q_a·xb), or q = wq·xb: per head [q_nope (N), q_pe (P)]
 *   per head h: query [k_b_h·q_nope_h (R), rope(q_pe_h)] over the one latent head
 *   (MQA, V = the rows' first R values, the cache's v_in_k) gives o_h [R]
 *   x += wo·[v_b_h·o_h for each head]
 * scores times hp.attn_scale. Each device its query heads over its replica of the
 * latent cache (it writes the replica itself); partial outputs summed as attention's. */
pkv_status pkv_blk_mla(pkv_fwd *f, int il, const pkv_weight *norm);

/* The gated activations: act(g) * u. */
typedef enum pkv_glu {
    PKV_GLU_SILU,     /* SwiGLU */
    PKV_GLU_GELU,     /* GeGLU, the tanh form */
    PKV_GLU_SILU_OAI, /* gpt-oss's clamped SwiGLU (alpha 1.702, limit 7) */
} pkv_glu;

/* A gated FFN: x += post_norm(down(act(gate·xb) * (up·xb))), xb = norm(x); each
 * device computes its rows of the FFN. ungated: x += post_norm(down(up_act(up·xb)))
 * (Nemotron-H's MLP: relu_sqr; no ffn_gate, pkv_load_ffn_up). */
typedef struct pkv_ffn_kind {
    const pkv_weight *norm;
    pkv_glu act;
    const pkv_weight *post_norm; /* NULL: none */
    bool ungated;
    pkv_unary_op up_act;         /* ungated: the activation of up·xb */
} pkv_ffn_kind;
pkv_status pkv_blk_ffn(pkv_fwd *f, int il, const pkv_ffn_kind *k);

/* Gemma 4's per-layer embeddings, P = hp.n_embd_per_layer floats per layer and
 * token. Once per step, after the embedding (x = the scaled embedding rows), every
 * layer's input (llama.cpp's project_per_layer_inputs):
 *   tok[l][t]  = per_layer_token_embd[token t][l P, (l + 1) P) * sqrt(P)   (the
 *                step's rows only, read on the host: the table stays in the file)
 *   proj[l][t] = rmsnorm(per_layer_model_proj[l P, (l + 1) P) · x[t] / sqrt(n_embd)) * per_layer_proj_norm
 *   ple[l][t]  = (proj[l][t] + tok[l][t]) / sqrt(2)                      f32 [n_layer][T][P]
 * (the 1/sqrt(n_embd) goes into the norm as eps * n_embd: rmsnorm(c v, eps) =
 * rmsnorm(v, eps / c^2)). */
pkv_status pkv_blk_ple_inputs(pkv_fwd *f);
/* Layer il's per-layer embedding, after its FFN:
 *   x += rmsnorm(proj · (gelu(inp_gate · x) * ple[il])) * post_norm */
pkv_status pkv_blk_ple(pkv_fwd *f, int il);
/* x *= s[0] (gemma4's layer_output_scale, f32 [1]); s absent: nothing. */
pkv_status pkv_blk_scale(pkv_fwd *f, const pkv_weight *s);

/* A gated delta-net layer (qwen35) in place of attention, its state in the cache's
 * state slots (conv window, then the delta rule's matrices; see pkv_fwd_state_desc):
 *   xb = norm(x); u = qkv·xb (q, k, v channels); z = z·xb
 *   beta = sigmoid(beta·xb); g = softplus(alpha·xb + dt) * a       per value head
 *   c = silu(conv(u)) over the last d_conv inputs; q, k = l2norm(c's q and k heads)
 *   o = delta_rule(q, k, c's v, g, beta)                         (pkv_k_delta_net)
 *   x += out·(rmsnorm(o) * silu(z))                                per value head
 * Each shard (its key-head groups, pkv_shard_w) on its device with its state; the
 * partial outputs are summed as attention's are. */
pkv_status pkv_blk_delta_net(pkv_fwd *f, int il, const pkv_weight *norm);

/* A Mamba-2 layer (granitehybrid) in place of attention, its state in the cache's
 * state slots (pkv_mamba2_state_desc), H heads of size P in G groups with a state
 * of size N (hp.ssm: n_v_heads, d_v, n_k_heads, d_k):
 *   xb = norm(x); u = ssm_in's x, B, C rows · xb; z = its z rows · xb; dt = its dt rows · xb
 *   u = silu(conv(u) + conv bias) over the last d_conv inputs
 *   y = ssm_scan(u's x, B, C, dt, dt bias, A, D)                     (pkv_k_ssm_scan)
 *   x += out·(group_rmsnorm(y * silu(z)) * ssm_norm)                 over each group's P H / G
 * Each shard (whole groups: its heads' x, z and dt, its groups' B and C) on its
 * device with its state; the partial outputs are summed as attention's are. A
 * rec_first layer (fewer groups than devices) runs whole on the first device. */
typedef struct pkv_mamba2_kind {
    const pkv_weight *norm; /* the input norm */
} pkv_mamba2_kind;
pkv_status pkv_blk_mamba2(pkv_fwd *f, int il, const pkv_mamba2_kind *kind);
/* The cache's description of a Mamba-2 layer's state: per group ("head" of the
 * cache, the shard unit) a conv window of d_conv - 1 rows, each [its heads' x (H / G
 * P) | its B (N) | its C (N)], then its heads' SSM states [H / G][P][N]. */
void pkv_mamba2_state_desc(const pkv_hparams *hp, pkv_kv_layer_desc *d);

/* One key-head group's state (floats): *conv of conv window (d_conv - 1 rows of
 * its q (dk), k (dk) and Hv / Hk value heads (dv each)), *total with its delta
 * matrices (Hv / Hk of [dk][dv]): pkv_kv_layer_desc.state_per_head. A shard of g
 * groups keeps, in a slot, its conv window [d_conv - 1][its channels] (g * *conv
 * floats), then its delta matrices [its value heads][dk][dv]. */
void pkv_fwd_state_layout(const pkv_hparams *hp, int64_t *conv, int64_t *total);
/* The cache's description of a recurrent layer: ssm.n_k_heads "heads" (key-head
 * groups) of pkv_fwd_state_layout's total, in parts: per conv row the group's q, k
 * and value heads, then its delta matrices, so a shard's slot, part-major, is the
 * layout above (pkv_kv_layer_desc.state_part). Sets n_kv_heads, state_per_head,
 * state_n_parts and state_part; the shards are the model's key-head ranges. */
void pkv_fwd_state_desc(const pkv_hparams *hp, pkv_kv_layer_desc *d);
/* Recurrent layer il's state as the cache must keep it: the architecture's
 * description (pkv_arch_ops.state_desc), else the gated delta-net's. */
void pkv_model_state_desc(const pkv_model *m, int il, pkv_kv_layer_desc *d);
/* The cache's shard d of recurrent layer il, checked against the model: the layer's
 * state as pkv_model_state_desc describes it, sharded as the model is split, shard
 * d's heads those of pkv_layer.sh[d] (kv_h0, n_kv), a slot of at least slot_bytes,
 * kept on the device the shard runs on. Errors name the layer and both sides. */
pkv_status pkv_blk_state_shard(pkv_fwd *f, int il, int d, size_t slot_bytes, pkv_kv_shard_info *sh);

/* A gated short-convolution layer (lfm2) in place of attention, per token:
 *   xb = norm(x); B, C, u = the three row blocks of in_proj·xb      (n_embd each)
 *   v = conv(B * u): causal depthwise over the last l_cache inputs  (pkv_k_ssm_conv, no SiLU)
 *   x += out_proj·(C * v)
 * with hp.shortconv's sizes; the conv's rolling state (l_cache - 1 inputs of every
 * channel) in the cache's state slots (pkv_short_conv_state_desc). Each shard (its
 * channel blocks, pkv_shard_w.sc) on its device with its part of the state; the
 * partial outputs are summed as attention's are. */
typedef struct pkv_short_conv_kind {
    const pkv_weight *norm; /* RMS norm of the input */
} pkv_short_conv_kind;
pkv_status pkv_blk_short_conv(pkv_fwd *f, int il, const pkv_short_conv_kind *k);
/* The cache's description of a short-conv layer's state: hp.shortconv.n_unit "heads"
 * (channel blocks of c = n_embd / n_unit), each l_cache - 1 parts of c floats (one per
 * kept input), so a shard's slot, part-major, is the conv's [l_cache - 1][its channels]. */
void pkv_short_conv_state_desc(const pkv_hparams *hp, pkv_kv_layer_desc *d);

/* How a token's experts are chosen and weighted. */
typedef enum pkv_moe_gating {
    PKV_MOE_SOFTMAX_TOPK, /* probs = softmax(router·xb); the top k; weights = those probs (Qwen3-MoE, DeepSeek-V2) */
    PKV_MOE_TOPK_SOFTMAX, /* the top k of the router's logits; weights = softmax over those k (gpt-oss) */
    PKV_MOE_SIGMOID_TOPK, /* probs = sigmoid(router·xb); the top k; weights = those probs (DeepSeek-V3, GLM-4.5, Llama 4) */
} pkv_moe_gating;

/* A mixture of experts in place of the FFN: x += sum over the token's experts e of
 * w_e * down_e(act(gate_e·xb) * (up_e·xb)), xb = norm(x), each matmul plus expert
 * e's bias row where the file has them (and the router's bias), plus the shared
 * expert where the layer has one (pkv_layer.moe.sh_*: an FFN every token goes
 * through, times sigmoid(sh_gate_inp · xb) where that gate is present). Where the
 * layer has exp_probs_b, the experts are chosen on probs + that bias and weighted by
 * the unbiased probs; with hp.moe_route.n_group > 1, only among the experts of the
 * n_group_used groups whose two best scores sum highest (DeepSeek-V3). */
typedef struct pkv_moe_kind {
    const pkv_weight *norm;
    pkv_glu act;
    pkv_moe_gating gating;
    bool norm_w;                   /* weights divided by their sum (at least 2^-14) (Qwen3-MoE; expert_weights_norm) */
    float w_scale;                 /* weights times this (expert_weights_scale); 0 = 1 */
    bool sel_logits;               /* choose on the router's logits, weight by the probs (Llama 4) */
    bool weight_in;                /* scale each expert's input rows by the weight, not its output (Llama 4) */
    const pkv_weight *router_norm; /* the router's input norm where it has its own (gemma4); NULL: norm */
    const float *exp_scale;        /* [n_expert] host: expert e's output times exp_scale[e] (gemma4); NULL: none */
    const pkv_weight *post_norm;   /* RMS norm of the experts' sum (gemma4); NULL: none */
} pkv_moe_kind;
pkv_status pkv_blk_moe(pkv_fwd *f, int il, const pkv_moe_kind *k);
/* The routing: pkv_k_moe_route (kernel-list.h), its arguments from hp and the kind. */

/* A dense FFN and a mixture of experts side by side (gemma4's MoE layers):
 *   x += post_norm(dense's output + the experts' output)
 * each branch with its own input norm and post-norm (in its kind). */
pkv_status pkv_blk_ffn_moe(pkv_fwd *f, int il, const pkv_ffn_kind *dense, const pkv_moe_kind *moe,
                           const pkv_weight *post_norm);

#endif
