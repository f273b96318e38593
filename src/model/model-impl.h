/* Model layer internals: hyper-parameters read from GGUF, weights uploaded to a
 * device, and the forward pass that reads and writes KV only through src/kv/. */
#ifndef PKV_MODEL_IMPL_H
#define PKV_MODEL_IMPL_H

#include "base/base.h"
#include "device/device.h"
#include "dist/dist.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

typedef enum pkv_arch {
    PKV_ARCH_LLAMA = 0, /* Llama 2/3, Mistral: normal RoPE, optional GQA */
    PKV_ARCH_QWEN2 = 1, /* Q/K/V biases, neox RoPE */
    PKV_ARCH_QWEN3 = 2, /* per-head Q/K RMS norms, explicit head size, neox RoPE */
    PKV_ARCH_QWEN3MOE = 3, /* qwen3 attention, a mixture of experts in place of the FFN */
    PKV_ARCH_PHI3 = 4,     /* fused QKV and gate/up matrices, neox RoPE */
    PKV_ARCH_GEMMA2 = 5,   /* embedding scale, post-norms, GeGLU, soft-caps, sliding layers */
    PKV_ARCH_GEMMA3 = 6,   /* gemma2 without soft-caps, with qwen3's Q/K norms; 5 of 6 layers slide */
    PKV_ARCH_GPT_OSS = 7,  /* QKVO biases, attention sinks, every other layer slides, YaRN, biased experts */
    PKV_ARCH_QWEN35 = 8,   /* gated delta-net layers with three of every four, gated attention in the fourth */
    PKV_ARCH_GEMMA4 = 9,   /* gemma3 with per-layer head sizes, proportional RoPE, V norm, per-layer
                              embeddings and KV shared by the last layers */
    PKV_ARCH_GEMMA4_ASSISTANT = 10, /* Gemma 4's MTP drafter: query-only layers over a gemma4 target's KV,
                                       fed the target's embedding and hidden state */
    PKV_ARCH_SMOLLM3 = 11, /* llama without RoPE on every fourth layer */
    PKV_ARCH_MISTRAL3 = 12, /* Ministral 3: llama with YaRN and attention temperature tuning */
    PKV_ARCH_QWEN35MOE = 13, /* qwen35 with experts and a gated shared expert in place of every FFN */
    PKV_ARCH_DEEPSEEK2 = 14, /* DeepSeek-V2/V3, Kimi K2: multi-head latent attention, MoE after dense layers */
    PKV_ARCH_LLAMA4 = 15,   /* chunked attention, NoPE layers with temperature tuning, interleaved
                               top-1 sigmoid experts with a shared expert */
    PKV_ARCH_GLM4MOE = 16,  /* GLM-4.5: QKV biases, partial RoPE, leading dense layers, sigmoid-routed experts */
    PKV_ARCH_GRANITEHYBRID = 17, /* Granite 4.0-H: Mamba-2 layers beside (NoPE) attention, Granite's multipliers,
                                    dense SwiGLU or experts with a shared expert */
    PKV_ARCH_NEMOTRON_H = 18, /* Nemotron-H / Nano 2: Mamba-2, NoPE attention and squared-ReLU MLP layers */
    PKV_ARCH_LFM2 = 19,     /* Liquid LFM2: gated short-convolution layers beside GQA attention with Q/K norms */
    PKV_ARCH_LFM2MOE = 20,  /* LFM2-MoE: lfm2 with sigmoid-routed experts after its leading dense layers */
    PKV_ARCH_COUNT
} pkv_arch;

const char *pkv_arch_name(pkv_arch a);
const char *pkv_arch_list(void); /* the supported names, ", "-separated */

/* A weight on the model's device. buf NULL: the tensor is absent. */
typedef struct pkv_weight {
    pkv_buffer *buf; /* [ne1][ne0] of type, rows of pkv_type_row_bytes(type, ne0) */
    pkv_type type;
    int64_t ne0, ne1;
} pkv_weight;

#define PKV_MAX_DEVICES 16

/* One device's part of a layer (tensor parallelism): whole KV-head groups with
 * their query heads, and a range of FFN rows. With one device it is the layer.
 * A recurrent (gated delta-net) layer's shard is whole key-head groups instead:
 * key heads [kv_h0, kv_h0 + n_kv) and their n_q = n_kv * Hv / Hk value heads
 * g + r * Hk (g a key head of the shard, r < Hv / Hk), ordered r-major on the
 * shard, so its value head j reads its key head j % n_kv, as the delta-net kernel
 * pairs them (grouped = false) on the whole layer. */
typedef struct pkv_shard_w {
    int dev;                   /* index into pkv_model.devs */
    int kv_h0, n_kv;           /* KV heads [kv_h0, kv_h0 + n_kv) (recurrent: key heads) */
    int q_h0, n_q;             /* query heads (n_kv groups of n_head / n_head_kv); recurrent: n_q value
                                  heads (q_h0 = kv_h0 * Hv / Hk, not a range) */
    int ff0, n_ff;             /* FFN rows [ff0, ff0 + n_ff) */
    pkv_weight wq, wk, wv;     /* [n_q*hd_k][n_embd], [n_kv*hd_k][n_embd], [n_kv*hd_v][n_embd] */
    pkv_weight wq_gate;        /* [n_q*hd_v][n_embd]: the attention output's gate (qwen35), else absent */
    pkv_weight bq, bk, bv;     /* f32 bias slices (qwen2, gpt-oss), else absent */
    pkv_weight q_norm, k_norm; /* f32 [hd_k] (qwen3), else absent; replicated */
    pkv_weight v_norm;         /* f32 [hd_v] of ones: V's weightless RMS norm (gemma4), else absent */
    pkv_weight wo;             /* [n_embd][n_q*hd_v]: the columns of this shard's heads */
    pkv_weight bo;             /* f32 [n_embd] output bias (gpt-oss), on shard 0 only (added once) */
    pkv_weight sinks;          /* f32 [n_q] attention sinks of this shard's query heads (gpt-oss), on the
                                  device that stores the shard's KV (attention runs there) */
    pkv_weight w_gate, w_up;   /* [n_ff][n_embd] row slices */
    pkv_weight w_down;         /* [n_embd][n_ff]: column slice */
    /* Multi-head latent attention (deepseek2; pkv_layer.latent = R > 0) in place of wq/wk/wv,
     * D = hp.mla.dk (nope + rope dims of a head), P = its rope dims (n_rot), V = hp.mla.dv,
     * N = nope dims = D - P, Lq = hp.mla.q_lora: this shard's n_q heads; the latent
     * projections replicated on every shard (each device writes its replica of the cache) */
    struct {
        pkv_weight q_a;            /* attn_q_a [Lq][n_embd], whole; absent without q_lora_rank */
        pkv_weight q_a_norm;       /* attn_q_a_norm f32 [Lq] */
        pkv_weight q_nope, q_pe;   /* attn_q_b [n_q N][Lq] and [n_q P][Lq] (or attn_q's, of n_embd cols) */
        pkv_weight kv_lat, kv_pe;  /* attn_kv_a_mqa's rows: [R][n_embd] (the latent), [P][n_embd] (k_pe) */
        pkv_weight kv_norm;        /* attn_kv_a_norm f32 [R] */
        pkv_weight k_b;            /* attn_k_b [n_q R][N]: head h's [R][N] at rows h R */
        pkv_weight v_b;            /* attn_v_b [n_q V][R]: head h's [V][R] at rows h V */
    } mla;
    /* A recurrent layer (qwen35's gated delta-net) in place of attention, this
     * shard's key heads (n_kv) and value heads (n_q, in the shard's order); f32 where
     * marked. Its state lives in the cache's state slots of the same shard. Last in
     * the struct: the weights from wq to ssm.out are freed as one run.
     * A Mamba-2 layer (granitehybrid; pkv_blk_mamba2) uses the same fields: n_kv its
     * groups, n_q = n_kv * H / G its heads (contiguous, q_h0 = kv_h0 * H / G), dk the
     * state size N, dv the head size P; qkv = ssm_in's rows of its x, B and C channels,
     * z = its z rows, beta = its dt rows (no alpha). */
    struct {
        pkv_weight qkv;         /* [2 n_kv dk + n_q dv][n_embd]: its q, k, v channels before the conv
                                   (Mamba-2: x of its heads, B, C of its groups) */
        pkv_weight z;           /* [n_q dv][n_embd]: the output gate */
        pkv_weight beta, alpha; /* [n_q][n_embd] */
        pkv_weight conv;        /* f32 [its channels][d_conv] */
        pkv_weight conv_b;      /* Mamba-2: f32 [its channels], ssm_conv1d.bias (absent: zeros) */
        pkv_weight dt, a;       /* f32 [n_q]: dt bias, -exp(A_log) */
        pkv_weight d;           /* Mamba-2: f32 [n_q], ssm_d (the skip) */
        pkv_weight norm;        /* f32 [dv], replicated (Mamba-2: ones [P * H / G], the group norm's) */
        pkv_weight gnorm;       /* Mamba-2: f32 [n_q dv], ssm_norm's entries of its groups */
        pkv_weight out;         /* [n_embd][n_q dv]: the columns of its value heads */
    } ssm;
    /* A gated short-convolution layer (lfm2) in place of attention: this shard's
     * channels [kv_h0 c, (kv_h0 + n_kv) c), c = n_embd / hp.shortconv.n_unit (the
     * conv is depthwise, a channel needs only its own rows). Its conv state lives in
     * the cache's state slots of the same shard. Last in the struct (freed with the
     * run from wq). */
    struct {
        pkv_weight in_b, in_c, in_x; /* shortconv.in_proj's B, C and x rows of its channels: [n_kv c][n_embd] each */
        pkv_weight conv;             /* shortconv.conv f32 [n_kv c][l_cache] */
        pkv_weight out;              /* shortconv.out_proj [n_embd][n_kv c]: the columns of its channels */
    } sc;
} pkv_shard_w;

typedef struct pkv_layer {
    int n_head, n_head_kv, n_ff; /* per layer (I4); a MoE layer: n_ff = the experts' rows */
    pkv_weight attn_norm;        /* f32 [n_embd], on devs[0] */
    pkv_weight ffn_norm;         /* f32 [n_embd], on devs[0] */
    pkv_shard_w *sh;             /* [n_dev] */
    /* Mixture of experts (hp.moe.n_expert > 0), on devs[0]; used in place from the file
     * where the device reads host memory. Expert e's matrix is the e-th block of rows. */
    struct {
        pkv_weight router;   /* [n_expert][n_embd] */
        pkv_weight router_b; /* gpt-oss's router bias f32 [n_expert] (absent elsewhere) */
        /* The experts by parts, part d on m->devs[d]: experts [e0, e0 + n) of the file's
         * 3-D tensors, expert e's matrix the (e - e0)-th block of rows of the part's. One
         * part of all the experts on one device; over a split, the experts in the split's
         * proportions (expert parallelism: each token's rows go to its experts' devices). */
        struct pkv_moe_part {
            int e0, n;
            pkv_weight gate, up;     /* [n * n_ff][n_embd] */
            pkv_weight down;         /* [n * n_embd][n_ff] */
            pkv_weight gate_b, up_b; /* gpt-oss's biases, f32 (absent elsewhere): [n][n_ff] */
            pkv_weight down_b;       /* [n][n_embd] */
        } ep[PKV_MAX_DEVICES];
        /* Gemma 4's MoE layers (ffn_gate_inp present): the experts beside the dense FFN */
        pkv_weight router_in;       /* f32 [n_embd]: ffn_gate_inp.scale / sqrt(n_embd), the router input norm's weight */
        pkv_weight pre_norm;        /* pre_ffw_norm_2 f32 [n_embd]: the experts' input norm */
        pkv_weight dense_post_norm; /* post_ffw_norm_1 f32 [n_embd]: the dense FFN's output norm */
        pkv_weight post_norm;       /* post_ffw_norm_2 f32 [n_embd]: the experts' output norm */
        float *exp_scale;           /* host [n_expert]: ffn_down_exps.scale, expert e's output times it; NULL: none */
        /* The routing kinds' tensors (pkv_load_moe's flags; absent elsewhere) */
        pkv_weight probs_b;         /* exp_probs_b.bias f32 [n_expert]: added to the scores that choose the
                                       experts, not to their weights (DeepSeek-V3, GLM-4.5) */
        pkv_weight sh_gate, sh_up;  /* ffn_{gate,up}_shexp [n_ff_sh][n_embd]: the shared expert, every token's */
        pkv_weight sh_down;         /* ffn_down_shexp [n_embd][n_ff_sh] */
        pkv_weight sh_gate_inp;     /* ffn_gate_inp_shexp f32 [n_embd]: the shared expert's output times
                                       sigmoid(sh_gate_inp · xb) (Qwen2-MoE, Qwen3.5-MoE); absent: ungated */
    } moe;
    /* Gemma: RMS norms of the attention's and the FFN's outputs before the residual
     * adds, f32 [n_embd] on devs[0]; absent elsewhere */
    pkv_weight post_attn_norm, post_ffn_norm;
    int window;                  /* attention over the last `window` tokens; 0 = all (I4: per layer) */
    int chunk;                   /* attention within chunks of `chunk` positions (llama4); 0 = none */
    /* A recurrent layer (qwen35's gated delta-net) in place of attention: its state
     * lives in the cache's state slots, its weights in the shards (pkv_shard_w) */
    bool recurrent;
    /* A recurrent layer with fewer state groups than devices (pkv_arch_ops.rec_first):
     * shard 0 holds all of it and runs it; every other shard names the same groups (a
     * replica in the cache) and holds no weights */
    bool rec_first;
    /* RoPE of this layer: hp.rope_base / hp.rope_freq_scale, except sliding layers with
     * their own (gemma3: base 10000, scale 1, as llama.cpp's rope_freq_base_train_swa) */
    float rope_base, rope_freq_scale;
    /* Geometry of this layer's heads (I4): hp.head_dim_k / _v / n_rot, or the sliding
     * layers' own (gemma4's key_length_swa, value_length_swa, rope.dimension_count_swa) */
    int head_dim_k, head_dim_v, n_rot;
    bool nope;       /* no RoPE on the layer's Q and K (smollm3's every fourth layer) */
    int rope_pairs;  /* > 0: only the first rope_pairs of the n_rot / 2 pairs turn (gemma4's
                        proportional RoPE, from rope_freqs.weight); 0 = all */
    /* KV shared between layers (gemma4): the layer computes no K/V of its own and
     * attends over cache layer pkv_model.kv_layer[il], which an earlier layer writes */
    bool kv_reuse;
    /* Multi-head latent attention (deepseek2): the layer's one KV "head" is a row
     * [latent (latent values), rotary part (n_rot)], V its first latent values (the
     * cache's v_in_k, rope_off = latent); 0 = none */
    int latent;
    /* Matrices the file holds fused, loaded split (LoRA maps an adapter of the fused
     * matrix onto the parts): attn_qkv (phi3), ffn_up = gate then up (phi3),
     * ffn_gate_up_exps (each expert's gate rows, then its up rows) */
    bool fused_qkv, fused_up, fused_exps;
    /* Gemma 4's per-layer embeddings (hp.n_embd_per_layer > 0), on devs[0]: */
    struct {
        pkv_weight gate;      /* inp_gate [P][n_embd] */
        pkv_weight proj;      /* proj [n_embd][P] */
        pkv_weight post_norm; /* post_norm f32 [n_embd] */
    } ple;
    pkv_weight out_scale;     /* layer_output_scale f32 [1]: the residual stream times it; absent: none */
} pkv_layer;

typedef struct pkv_hparams {
    pkv_arch arch;
    int n_layer, n_embd, n_vocab, n_ctx_train;
    int head_dim_k, head_dim_v; /* key_length / value_length */
    int n_rot;                  /* rope.dimension_count (<= head_dim_k) */
    bool rope_neox;
    float rope_base, rope_freq_scale; /* freq_scale = 1 / linear scaling factor */
    float rms_eps;
    struct {
        int n_expert, n_used;    /* experts, and experts per token; n_expert 0 = a dense FFN */
        int n_ff;                /* rows of one expert's FFN */
    } moe;
    /* Gemma 2 and 3 (0 = off elsewhere) */
    float embd_scale;            /* token embeddings times this (sqrt(n_embd)) */
    float attn_scale;            /* scores times this; 0 = 1/sqrt(head_dim_k) */
    struct {
        float attn, final; /* scores and final logits become cap * tanh(x / cap); 0 = none */
    } softcap;
    /* The groups keep the flat fields' offsets (no padding between or inside them):
     * the fingerprint hashes this struct's bytes (static asserts in hparams.c) */
    struct {
        int n, pattern;          /* sliding window; layer il slides when il % pattern < pattern - 1 */
        float rope_base;         /* the sliding layers' RoPE base (gemma3: 10000; gpt-oss: rope.freq_base_swa
                                    where the file has it) with rope_freq_scale; 0 = hp.rope_base and
                                    hp.rope_freq_scale on every layer */
        float rope_freq_scale;   /* with rope_base: gemma3 1, gpt-oss hp.rope_freq_scale */
    } swa;
    /* YaRN RoPE scaling (rope.scaling.type "yarn", llama.cpp's keys; any architecture) */
    struct {
        float ext_factor;        /* 1 with YaRN; 0 = none */
        int n_ctx_orig;          /* rope.scaling.original_context_length (default context_length) */
        float beta_fast, beta_slow; /* rope.scaling.yarn_beta_fast/_slow (32, 1) */
        float attn_factor;       /* rope.scaling.attn_factor (1): times YaRN's 1 + 0.1 ln(factor) */
    } yarn;
    /* Gated delta-net layers (qwen35; 0 elsewhere): ssm.* keys */
    struct {
        int d_conv;                      /* conv kernel */
        int n_k_heads, n_v_heads, d_k, d_v; /* group_count, time_step_rank, state_size, inner/Hv */
    } ssm;
    int n_nextn;                 /* MTP layers after the n_layer trunk layers (nextn_predict_layers) */
    uint64_t recurrent;          /* bit l: layer l is recurrent (n_layer <= 64 then) */
    /* Gemma 4 (0 elsewhere) */
    bool swa_per_layer;          /* swa_layers says which layers slide (in place of swa_pattern) */
    uint64_t swa_layers[4096 / 64]; /* bit l of word l / 64: layer l slides (attention.sliding_window_pattern) */
    int head_dim_k_swa, head_dim_v_swa, n_rot_swa; /* the sliding layers' head sizes and rotated dims;
                                                      0 = head_dim_k, head_dim_v, n_rot */
    int rope_pairs_full;         /* > 0: the full layers turn only their first rope_pairs_full pairs
                                    (rope_freqs.weight: 1 for those, 1e30 for the rest); 0 = all */
    int n_shared_kv;             /* attention.shared_kv_layers: the last layers attend over the KV of
                                    an earlier layer and own none */
    int n_embd_per_layer;        /* embedding_length_per_layer_input: per-layer embeddings; 0 = none */
    bool moe_dense;              /* MoE layers keep their dense FFN beside the experts (gemma4) */
    int layer_base;              /* the file's index of layer 0 (an MTP head: the trunk's layer count) */
    int pooling;                 /* pooling_type (pkv_pooling: llama.cpp's enum); -1 = not given */
    int n_embd_out;              /* gemma4-assistant: embedding_length_out, its target's width (the hidden
                                    state it reads and writes); 0 elsewhere */
    /* Llama 4-style attention temperature tuning (mistral3's attention.temperature_scale;
     * scale 0 = none): after RoPE the queries at position p are multiplied by
     * 1 + scale * ln(floor((p + offset) / floor_len) + 1), floor_len the original context
     * (rope.scaling.original_context_length, default context_length); llama4: 0.1,
     * 8192 and offset 1, on its NoPE layers */
    struct {
        float scale;
        int floor_len;
        float offset;
    } attn_temp;
    /* A mixture of experts' routing beyond its sizes (llama.cpp's generic expert_* keys,
     * read for every MoE architecture where the file has them; 0 / false when absent) */
    struct {
        int n_shared;            /* expert_shared_count: shared experts (their rows are one FFN) */
        int n_ff_shexp;          /* expert_shared_feed_forward_length: one shared expert's rows */
        int n_group, n_group_used; /* expert_group_count / _used_count: group-limited top k (> 1: on) */
        int gating;              /* expert_gating_func: 0 not given, 1 softmax, 2 sigmoid, 3 softmax of the top k */
        float w_scale;           /* expert_weights_scale: the weights times it (0: 1) */
        bool norm_w;             /* expert_weights_norm: the chosen weights divided by their sum */
    } moe_route;
    /* Multi-head latent attention (deepseek2; 0 elsewhere): attention.q_lora_rank (0: the
     * lite layout, attn_q), kv_lora_rank, key_length_mla (a head's nope + rope dims),
     * value_length_mla, leading_dense_block_count */
    struct {
        int q_lora, kv_lora, dk, dv, n_dense;
        int kv_b; /* 1: an older file with attn_kv_b and per-head K/V sizes (key_length = dk,
                     head_count_kv = heads): run as MLA all the same, one latent KV head */
    } mla;
    int n_chunk;                 /* llama4: tokens of an attention chunk on the layers swa.pattern makes
                                    "sliding" (those attend within their chunk only); 0 = none */
    int moe_step;                /* llama4: interleave_moe_layer_step, layer il has experts when
                                    (il + 1) % moe_step == 0 (0: none), the others a dense FFN */
    int n_head_kv_all;           /* > 0: every layer has this many KV heads, whatever head_count_kv says
                                    (an architecture's hparams hook: deepseek2's older latent files,
                                    whose key sizes are per head but whose cache is one latent row) */
    /* Multipliers of the residual stream and the logits (an architecture's hparams hook
     * sets them, granitehybrid's from Granite's keys; 0 elsewhere): every block's output
     * is added to the residual stream times residual_scale (0: 1); the logits are
     * divided by logit_scale (0: 1). nope: no RoPE on the attention layers. The
     * embedding and attention multipliers are embd_scale and attn_scale. */
    struct {
        float residual_scale, logit_scale;
        int nope;
    } mults;
    /* Layers that are an FFN alone (nemotron_h's MLP layers: head_count_kv 0 and
     * feed_forward_length > 0, pkv_arch_ops.ff0_layers); bit l: layer l */
    struct {
        uint64_t ffn_only;
    } kinds;
    /* Gated short convolutions (lfm2; 0 elsewhere): shortconv.l_cache, the conv's taps
     * (its state keeps l_cache - 1 inputs), and the layer's shard unit: n_unit blocks of
     * n_embd / n_unit channels (the attention's head count); lfm2moe: n_dense, its
     * leading_dense_block_count (the layers after it are mixtures of experts) */
    struct {
        int l_cache, n_unit, n_dense;
        int pad_; /* (no padding after the 8-byte kinds: the fingerprint hashes these bytes) */
    } shortconv;
} pkv_hparams;

struct pkv_model {
    char label[256]; /* file path, or "builtin" */
    pkv_hparams hp;
    pkv_layer *layers; /* [n_layer] */
    pkv_weight tok_embd;    /* [n_vocab][n_embd] */
    pkv_weight output_norm; /* f32 [n_embd] */
    pkv_weight output;      /* [n_vocab][n_embd]; same buffer as tok_embd when tied */
    bool tied;
    pkv_type main_type;     /* the most common matrix type, for display */
    uint64_t weight_types;  /* bit t: some matrix on a device has type t */
    pkv_tokenizer *tok;
    pkv_device *dev;        /* devs[0]: embeddings, norms, output, the residual stream */
    int n_dev;              /* devices the heads and FFN rows are split over (1 = no split) */
    pkv_device *devs[PKV_MAX_DEVICES];
    bool own_dev[PKV_MAX_DEVICES]; /* opened by the model (closed with it) */
    float split[PKV_MAX_DEVICES];  /* proportions */
    bool kv_on_host;        /* KV shards stored (and attended) on `host` */
    pkv_device *host;       /* the host CPU device when kv_on_host */
    bool own_host;
    int *kv_layer;          /* [n_layer] the cache layer each layer attends over; NULL = layer il
                               uses cache layer il. A shared-KV draft (kv_draft): layers of the
                               target's cache (GGUF key pagekv.shared_kv_layers). A model whose
                               last layers reuse an earlier layer's KV (gemma4): its own cache */
    bool kv_draft;          /* kv_layer maps into another model's cache (pagekv.shared_kv_layers) */
    /* Ranks (src/dist/, docs/distributed.md): this process's rank of n_ranks holds and runs
     * layers [rank_first[rank], rank_first[rank + 1]); rank_first[n_ranks] = n_layer. Every
     * rank holds the embeddings and the head; a layer of another rank has no weights here */
    int rank, n_ranks;
    int rank_first[PKV_DIST_MAX_RANKS + 1];
    int n_cache_layers;     /* layers of the model's own cache (pkv_model_kv_params): n_layer, or
                               n_layer - hp.n_shared_kv where the last layers own no KV */
    /* Gemma 4's per-layer embeddings (hp.n_embd_per_layer = P > 0): */
    struct {
        const uint8_t *tok;    /* per_layer_token_embd [n_vocab][P * n_layer] of tok_type on the host
                                  (the mapped file, or tok_own): only the step's rows are read */
        uint8_t *tok_own;      /* the table's copy when the file is not kept mapped */
        pkv_type tok_type;
        pkv_weight model_proj; /* per_layer_model_proj [P * n_layer][n_embd] */
        pkv_weight proj_norm;  /* per_layer_proj_norm f32 [P] */
        pkv_weight half;       /* f32 [1] = 1/sqrt(2) (the mean of the two per-layer inputs) */
    } ple;
    uint64_t fingerprint;   /* hash of hparams and tensor metadata, and the default LoRA set's:
                               keys prefix reuse and saved KV */
    uint64_t fingerprint_base; /* the same without adapters */
    int n_lora;             /* the default LoRA set (pkv_model_lora_apply) */
    pkv_lora_use lora[PKV_MAX_LORA];
    pkv_lora *loras;        /* every adapter loaded for it (a list through pkv_lora.next), freed with it */
    uint64_t weight_bytes;  /* bytes of all weights on the device */
    uint64_t mapped_bytes;  /* of those, used in place from the mapped file (CPU), not copied */
    pkv_gguf *gguf;         /* the open file while weights wrap its mapping, else NULL */
    /* An MTP head (pkv_model_params.mtp): x = eh_e·enorm(embed(token)) + eh_h·hnorm(h),
     * h the target's final normed hidden state of the previous position; eh_e, eh_h
     * are nextn.eh_proj's two column halves (pkv_load_nextn) */
    bool mtp;
    struct {
        pkv_weight eh_e, eh_h; /* [n_embd][n_embd] each */
        pkv_weight enorm, hnorm; /* f32 [n_embd] */
    } nextn;
    /* Gemma 4's assistant (hp.arch PKV_ARCH_GEMMA4_ASSISTANT, Ea = n_embd, Eb = n_embd_out):
     *   x = pre_e·(target's token_embd[token] * sqrt(Eb)) + pre_h·h     h: the target's hidden state
     *   logits = token_embd·hn (tied), h_next = post·hn                 hn: the final normed x
     * Its layers attend over the target's cache (kv_layer, resolved by pkv_context_attach
     * from the target: -1 until then) and write none. */
    bool assistant;
    struct {
        pkv_weight pre_e, pre_h; /* nextn.pre_projection's column halves [Ea][Eb] each */
        pkv_weight post;         /* nextn.post_projection [Eb][Ea] */
    } asst;
    /* A classification head (rank pooling; llama.cpp's cls.output, which its converter
     * writes for Qwen3-Reranker from the lm_head rows of "yes" and "no"): host f32 */
    int n_cls_out;          /* rows of cls_out (classifier.output_labels); 0 = no head */
    float *cls_out;         /* [n_cls_out][n_embd] */
    float *cls_out_b;       /* [n_cls_out] or NULL */
    /* LongRoPE (phi3's rope_factors_short / rope_factors_long, n = hp.n_rot / 2 each;
     * n = 0: none): pair i's angle divided by factor i. Host f32 [2][n], the short
     * factors then the long ones, and the same on each device of devs (RoPE runs
     * where a shard's heads are). A cache takes one set (pkv_model_rope_factors) and
     * the forward pass turns Q and K with the set of the cache it writes. */
    struct {
        int n;
        float *host;
        pkv_weight dev[PKV_MAX_DEVICES];
    } longrope;
    pkv_weight res_scale;   /* f32 [1] on dev: hp.mults.residual_scale, each block's output times it
                               before its residual add; absent: none */
    const pkv_model *embd_of;          /* the target whose token_embd feeds it (set by attach), else NULL */
    double load_seconds;
};

/* Attach draft d, a model with no cache of its own that reads target t's cache c:
 * its architecture's attach hook (Gemma 4's assistant: checks that d fits t and
 * points d's layers at t's cache layers), else, for a shared-KV draft
 * (pagekv.shared_kv_layers), the check that its layers fit the cache layers they
 * name (I6). On error nothing is changed. */
pkv_status pkv_model_attach(pkv_model *d, const pkv_model *t, pkv_kv_cache *c);

/* Read and validate hyper-parameters (and per-layer head counts) from g. */
pkv_status pkv_hparams_read(const pkv_gguf *g, pkv_hparams *hp, int **n_head, int **n_head_kv, int **n_ff);

#endif
