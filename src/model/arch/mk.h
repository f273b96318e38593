/* What `pagekv mkmodel` writes for an architecture (model layer, internal). The
 * writer (mkmodel.c) makes the keys and tensors every file has: general.*, the
 * sizes, RoPE and norm keys, the vocabulary, token_embd, output_norm and output.
 * Each architecture's file ends with a pkv_arch_mk (pkv_arch_ops.mk) saying what
 * it adds: the options it takes, its defaults and rules for them, its keys, the
 * tensors outside the layers and the tensors of a layer, written with the helpers
 * below. mkmodel.c itself names no architecture. */
#ifndef PKV_MK_H
#define PKV_MK_H

#include "model/load.h"
#include "model/model-impl.h"

/* One file being written. */
typedef struct pkv_mk {
    pkv_mkmodel_params *p;          /* completed by the checks */
    pkv_gguf_writer *w;
    const struct pkv_mk_target *tgt; /* a draft's target (mkmodel.c); NULL: none */
    int64_t E, qd, kd;              /* n_embd; n_head, n_head_kv times head_dim */
    double lin_e, lin_q, lin_f;     /* uniform ranges sqrt(3 / fan-in) of E, qd, n_ff: activations stay sane */
    /* the writer's own */
    uint64_t rng; /* splitmix64 state */
    float *f;     /* scratch f32 [cap] */
    void *q;      /* scratch, quantized [cap * 4 bytes] */
    size_t cap;   /* elements */
    char k[96];   /* pkv_mk_key's */
} pkv_mk;

/* The options beyond the common ones an architecture takes (pkv_arch_mk.takes);
 * elsewhere they are refused with a message naming the architectures that take them. */
enum {
    PKV_MK_WINDOW = 1 << 0,   /* sliding_window (0 = 8); the key attention.sliding_window */
    PKV_MK_EXPERTS = 1 << 1,  /* n_expert, n_expert_used (required where pkv_arch_ops.moe, else optional) */
    PKV_MK_DELTANET = 1 << 2, /* ssm_v_heads, ssm_k_heads, ssm_head_dim */
    PKV_MK_MTP = 1 << 3,      /* n_mtp */
    PKV_MK_LAYERS = 1 << 4,   /* per-layer shapes: head_dim_swa, n_head_kv_full, n_embd_per_layer, n_shared_kv,
                                 swa_layers */
    PKV_MK_LONGROPE = 1 << 5, /* rope_orig_ctx: LongRoPE's factor tensors and keys */
    PKV_MK_MLA = 1 << 6,      /* q_lora_rank, kv_lora_rank: multi-head latent attention's sizes */
};

typedef struct pkv_arch_mk {
    unsigned takes; /* PKV_MK_* */
    bool tied;      /* no output.weight whatever the options say */
    /* The keys every file has (a draft: its target's). */
    float rope_base;   /* rope.freq_base */
    float rope_factor; /* rope.scaling.factor; 0: no scaling */
    bool rope_yarn;    /* the scaling is YaRN's over min(256, n_ctx) original positions, else linear */
    bool rope_half;    /* rope.dimension_count is half the head, else the head */
    float rms_eps;     /* attention.layer_norm_rms_epsilon */
    bool head_keys;    /* attention.key_length, value_length even where n_head * head_dim = n_embd */
    bool own_head_keys; /* its keys hook writes attention.key_length, value_length and
                           rope.dimension_count (deepseek2: the latent cache row's) */
    /* Its options' defaults and rules, before the common defaults (n_layer 0 = 2,
     * n_embd ...). NULL: none. */
    pkv_status (*check)(pkv_mkmodel_params *p);
    /* Rows of its own that must be whole blocks of blk elements (the weight type's,
     * or 256 for a mixture), after the common ones. NULL: none. */
    pkv_status (*check_rows)(const pkv_mkmodel_params *p, size_t blk);
    /* A draft of a target of this architecture (--draft-of): what it takes from the
     * target beyond the common sizes; nh, nkv: the target's per-layer head counts. */
    void (*draft)(pkv_mkmodel_params *p, const pkv_hparams *hp, const int *nh, const int *nkv);
    /* feed_forward_length, attention.head_count, attention.head_count_kv and the
     * keys that go with them. NULL: the three as u32. */
    pkv_status (*sizes)(pkv_mk *b);
    /* Its keys, after the sizes and before RoPE's. NULL: the experts' where it has them. */
    pkv_status (*keys)(pkv_mk *b);
    /* Tensors outside the layers beyond token_embd, output_norm and output. NULL: none. */
    pkv_status (*globals)(pkv_mk *b);
    /* The tensors of layer l (of n_layer + n_mtp). */
    pkv_status (*layer)(pkv_mk *b, int l);
    /* The whole file, in place of all of the above (gemma4-assistant). NULL: those. */
    pkv_status (*build)(pkv_mkmodel_params p, pkv_gguf_writer **out);
} pkv_arch_mk;

#define PKV_MK_TRY(x)                                                                                \
    do {                                                                                             \
        pkv_status s_ = (x);                                                                         \
        if (s_) return s_;                                                                           \
    } while (0)

/* Scratch for cap elements, a writer and the random stream at seed. On error
 * (PKV_ERR_NOMEM) what was made is left for pkv_mk_end to free. */
pkv_status pkv_mk_begin(pkv_mk *b, uint64_t seed, size_t cap);
/* The end of a build: the target tg (may be NULL) and the scratch freed; the writer
 * to *out, or freed when s is an error. Returns s. */
pkv_status pkv_mk_end(pkv_mk *b, pkv_gguf *tg, pkv_status s, pkv_gguf_writer **out);

/* "<arch>.<suffix>" in b->k (valid until the next call). */
const char *pkv_mk_key(pkv_mk *b, const char *suffix);
pkv_status pkv_mk_u32(pkv_mk *b, const char *suffix, uint32_t v);
pkv_status pkv_mk_f32(pkv_mk *b, const char *suffix, float v);
pkv_status pkv_mk_arr(pkv_mk *b, const char *suffix, pkv_gguf_type type, const void *data, uint64_t n);

/* Tensor name [rows][cols] of type with values center + scale * U(-1, 1); a 3-D
 * tensor of n such matrices (experts) with values scale * U(-1, 1). */
pkv_status pkv_mk_add(pkv_mk *b, const char *name, pkv_type type, int64_t cols, int64_t rows, double center, double scale);
pkv_status pkv_mk_add3(pkv_mk *b, const char *name, pkv_type type, int64_t cols, int64_t rows, int64_t n, double scale);
/* The same for "blk.<l>.<suffix>"; pkv_mk_blk3 has n_expert matrices. */
pkv_status pkv_mk_blk(pkv_mk *b, int l, const char *suffix, pkv_type type, int64_t cols, int64_t rows, double center,
                      double scale);
pkv_status pkv_mk_blk3(pkv_mk *b, int l, const char *suffix, pkv_type type, int64_t cols, int64_t rows, double scale);
/* A norm's weight blk.<l>.<suffix> [n], f32 about 1. */
pkv_status pkv_mk_norm(pkv_mk *b, int l, const char *suffix, int64_t n);
/* The type of matrix `what` ("output", "attn_k", "attn_v", "ffn_down", else any) of
 * layer l: p->type, or the mixture's (p->k_mixture). */
pkv_type pkv_mk_type(const pkv_mkmodel_params *p, const char *what, int l);

/* expert_count, expert_used_count, and expert_feed_forward_length n_ff_exp. */
pkv_status pkv_mk_expert_keys(pkv_mk *b, int n_ff_exp);
/* The FFN tensors of kind ffn of layer l (as pkv_load_prenorm reads them). */
pkv_status pkv_mk_ffn(pkv_mk *b, int l, pkv_ffn_tensors ffn);
/* What a mixture of experts adds beyond pkv_mk_layer's experts (load.h's PKV_MOE_*
 * flags): exp_probs_b.bias (PKV_MOE_PROBS_B), a shared expert of n_ff_sh rows
 * (PKV_MOE_SHARED) and its gate ffn_gate_inp_shexp (PKV_MOE_SHARED_GATE). */
pkv_status pkv_mk_moe_extras(pkv_mk *b, int l, unsigned what, int64_t n_ff_sh);
/* An MTP layer's nextn tensors (llama.cpp's): eh_proj [E][2 E] (x = eh_proj
 * [enorm(embedding); hnorm(h)]), enorm, hnorm and its own final norm shared_head_norm. */
pkv_status pkv_mk_nextn(pkv_mk *b, int l);
/* The recurrent layers' ssm.* keys (llama.cpp's): conv_kernel, state_size,
 * group_count, time_step_rank and inner_size. */
pkv_status pkv_mk_ssm_keys(pkv_mk *b, int d_conv, int state, int groups, int heads, int inner);
/* The recurrent layers' option rules (heads ssm_v_heads a multiple of groups
 * ssm_k_heads, a head size of 1 to 256, at most 64 layers), named for p->arch; and
 * their rows (heads x head size) on whole blocks of blk. */
pkv_status pkv_mk_ssm_check(const pkv_mkmodel_params *p);
pkv_status pkv_mk_ssm_rows(const pkv_mkmodel_params *p, size_t blk);
/* Mamba-2's defaults, then pkv_mk_ssm_check: heads of ssm_head_dim (0 = 16) channels,
 * ssm_v_heads 0 = 2 n_embd / head size (llama.cpp's granitehybrid takes an inner size
 * of twice n_embd only), groups 0 = 2. */
pkv_status pkv_mk_mamba2_check(pkv_mkmodel_params *p);
/* attention.sliding_window (small, so tests cross it). */
pkv_status pkv_mk_window_key(pkv_mk *b);
/* A pre-norm layer as pkv_load_prenorm reads it: attn_norm; Q, K, V (or as attn
 * says: fused, with the gate's rows, biases, q/k norms); attn_output (its bias and
 * the sinks); post_attention_norm where post_norms; the FFN's norm (ffn_norm: its
 * name; NULL: ffn_norm.weight); post_ffw_norm where post_norms; the FFN of kind ffn. */
pkv_status pkv_mk_layer(pkv_mk *b, int l, const pkv_attn_tensors *attn, const char *ffn_norm, pkv_ffn_tensors ffn,
                        bool post_norms);
/* Its first part: attn_norm and the attention tensors, no FFN. */
pkv_status pkv_mk_attention(pkv_mk *b, int l, const pkv_attn_tensors *attn);
/* A Mamba-2 mixer as llama.cpp reads it: attn_norm; ssm_in (rows z, x, B, C, dt),
 * ssm_conv1d (kernel 4) and its bias, ssm_dt.bias, ssm_a (< 0), ssm_d, ssm_norm
 * [G][H P / G], ssm_out; H = ssm_v_heads of P = ssm_head_dim in G = ssm_k_heads
 * groups, state size ssm_head_dim. */
pkv_status pkv_mk_mamba2(pkv_mk *b, int l);

/* Checks shared by the architectures' check_rows: cols a multiple of blk, else
 * "type T needs row lengths that are multiples of blk: <what> is <cols>". */
pkv_status pkv_mk_row_check(const pkv_mkmodel_params *p, size_t blk, const char *what, int64_t cols);

#endif
