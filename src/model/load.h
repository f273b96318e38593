/* Loading a layer's tensors (model layer, internal): the blocks an architecture's
 * load_layer composes (src/model/arch/). Every tensor is checked against the shape
 * the model's hyper-parameters give it, and a missing required one is named. With
 * several devices each shard gets its rows or columns. */
#ifndef PKV_LOAD_H
#define PKV_LOAD_H

#include "model/model-impl.h"

typedef struct pkv_loader pkv_loader;

/* The model being loaded, and its file. */
pkv_model *pkv_loader_model(pkv_loader *L);
const pkv_gguf *pkv_loader_gguf(pkv_loader *L);

/* blk.<il>.<name>: an f32 [n_embd] norm on the model's first device. */
pkv_status pkv_load_norm(pkv_loader *L, int il, const char *name, pkv_weight *w);

/* The attention's tensors: attn_q, attn_k, attn_v (or, where allowed, one attn_qkv
 * of Q's rows, then K's, then V's) and attn_output, split by heads; their biases
 * attn_{q,k,v}.bias where present (required with qkv_bias); and as asked: */
typedef struct pkv_attn_tensors {
    bool qkv_bias;  /* attn_q/k/v.bias required */
    bool qk_norm;   /* attn_q_norm, attn_k_norm [head_dim_k] required */
    bool fused_qkv; /* attn_qkv.weight accepted in place of the three */
    bool out_bias;  /* attn_output.bias [n_embd] required */
    bool sinks;     /* attn_sinks.weight [n_head] required: each shard's heads where its KV is attended */
    bool q_gate;    /* attn_q has 2 head_dim rows per head: q's, then the output gate's (qwen35) */
    bool v_optional; /* attn_v may be absent: V is then K's projection (gemma4) */
    bool v_norm;    /* V gets a weightless RMS norm per head (gemma4): pkv_shard_w.v_norm, ones */
    bool qk_unit;   /* q and k get weightless RMS norms per head (llama4): q_norm, k_norm of ones */
} pkv_attn_tensors;
pkv_status pkv_load_attention(pkv_loader *L, int il, const pkv_attn_tensors *t);

/* Multi-head latent attention's tensors (deepseek2; pkv_shard_w.mla), split by query
 * heads, the latent projections whole on every device: attn_q_a, attn_q_a_norm and
 * attn_q_b where hp.mla.q_lora > 0, else attn_q (each head's nope rows, then its rope
 * rows); attn_kv_a_mqa (the latent's rows, then k_pe's), attn_kv_a_norm, attn_k_b
 * [heads][kv_lora][nope] and attn_v_b [heads][dv][kv_lora] (3-D), attn_output. Sets
 * pkv_layer.latent. A file with only the older attn_kv_b is refused (unsupported). */
pkv_status pkv_load_mla(pkv_loader *L, int il);

/* A gated delta-net layer's tensors (qwen35), split by key-head groups (each
 * shard's key heads and value heads, pkv_shard_w): attn_qkv (q, k, v channels),
 * attn_gate, ssm_beta, ssm_alpha, ssm_conv1d, ssm_dt.bias, ssm_a, ssm_norm (whole)
 * and ssm_out (its value heads' columns: with several devices a quantized ssm_out
 * needs head sizes that keep each run of columns on whole blocks). */
pkv_status pkv_load_delta_net(pkv_loader *L, int il);

/* A gated short-convolution layer's tensors (lfm2; pkv_shard_w.sc), split by channel
 * blocks of n_embd / hp.shortconv.n_unit (each shard's kv_h0, n_kv): the B, C and x
 * rows of its channels in shortconv.in_proj [3 n_embd][n_embd], their taps in
 * shortconv.conv [n_embd][l_cache] (f32), their columns of shortconv.out_proj. */
pkv_status pkv_load_short_conv(pkv_loader *L, int il);

/* A Mamba-2 layer's tensors (granitehybrid), split by SSM groups (pkv_shard_w's
 * Mamba-2 use): ssm_in's x, B, C rows (qkv), z rows and dt rows (beta);
 * ssm_conv1d and its optional bias, ssm_dt.bias, ssm_a and ssm_d of its heads,
 * ssm_norm of its groups (gnorm), ones for the group norm (norm), ssm_out's columns
 * of its heads. */
pkv_status pkv_load_mamba2(pkv_loader *L, int il);

/* blk.<il>.<suffix>, shape [ne1][ne0], required, whole on the first device; f32:
 * converted to f32 (norms, biases, small vectors). */
pkv_status pkv_load_tensor(pkv_loader *L, int il, const char *suffix, int64_t ne0, int64_t ne1, bool f32, pkv_weight *w);

/* A tensor outside the layers (no blk. prefix), whole on the first device; absent
 * and not required: w stays empty. */
pkv_status pkv_load_global(pkv_loader *L, const char *name, int64_t ne0, int64_t ne1, bool required, bool f32, pkv_weight *w);

/* Columns [c0, c0 + nc) of a required matrix outside the layers, [ne1][ne0] in the
 * file, on the first device (an MTP head's input projection, split by input). */
pkv_status pkv_load_global_cols(pkv_loader *L, const char *name, int64_t ne0, int64_t ne1, int64_t c0, int64_t nc,
                                pkv_weight *w);

/* An MTP head's tensors (pkv_arch_ops.load_global of the architectures with
 * mtp_head; nothing unless pkv_model.mtp): blk.<layer_base>.nextn.eh_proj
 * [n_embd][2 n_embd] as its two column halves (the embedding's, then the hidden
 * state's: pkv_model.nextn.eh_e, eh_h), nextn.enorm and nextn.hnorm. */
pkv_status pkv_load_nextn(pkv_loader *L);

/* A table [ne1][ne0] kept on the host and read row by row (gemma4's
 * per_layer_token_embd: pkv_model.ple.tok): used in place from the mapped file where
 * the model keeps it, else copied. */
pkv_status pkv_load_host_table(pkv_loader *L, const char *name, int64_t ne0, int64_t ne1);

/* w = f32 [n] of value on dev, or of the host's data (not from the file as it is:
 * constants the blocks need, tensors changed at load). */
pkv_status pkv_weight_fill(pkv_model *m, pkv_device *dev, int64_t n, float value, pkv_weight *w);
pkv_status pkv_weight_host(pkv_model *m, pkv_device *dev, const float *data, int64_t n, pkv_weight *w);

/* Tensor `name` (any type) of n elements in one row, as f32 in *out (pkv_malloc'd;
 * NULL when absent and not required). */
pkv_status pkv_load_host_f32(pkv_loader *L, const char *name, int64_t n, bool required, float **out);

/* A gated FFN, split by rows: ffn_gate, ffn_up, ffn_down; fused_up: ffn_up holds
 * the gate's rows, then the up projection's (no ffn_gate). */
pkv_status pkv_load_ffn(pkv_loader *L, int il, bool fused_up);
/* An FFN without a gate (Nemotron-H's MLP layers), split by rows: ffn_up, ffn_down. */
pkv_status pkv_load_ffn_up(pkv_loader *L, int il);

/* A mixture of experts on the first device: ffn_gate_inp (the router) and the
 * experts as 3-D tensors ffn_{gate,up,down}_exps of hp.moe.n_ff rows (gate and up
 * may be one ffn_gate_up_exps: each expert's gate rows, then its up rows), and what
 * `what` adds (pkv_layer.moe): */
enum {
    PKV_MOE_BIASES = 1u << 0,      /* the router's and each expert's bias rows, required (gpt-oss) */
    PKV_MOE_PROBS_B = 1u << 1,     /* exp_probs_b.bias, the selection bias, where the file has it */
    PKV_MOE_SHARED = 1u << 2,      /* the shared expert ffn_{gate,up,down}_shexp, required */
    PKV_MOE_SHARED_GATE = 1u << 3, /* the shared expert and its gate ffn_gate_inp_shexp, required */
};
pkv_status pkv_load_moe(pkv_loader *L, int il, unsigned what);

/* The pre-norm layer every architecture here starts from: attn_norm, the
 * attention's tensors, the FFN's norm (ffn_norm, or the name given) and the FFN's
 * tensors of the kind given. */
typedef enum pkv_ffn_tensors {
    PKV_FFN_GATED,          /* pkv_load_ffn */
    PKV_FFN_FUSED_UP,       /* pkv_load_ffn, fused_up */
    PKV_FFN_EXPERTS,        /* pkv_load_moe */
    PKV_FFN_EXPERTS_BIASED, /* pkv_load_moe, biases */
} pkv_ffn_tensors;
pkv_status pkv_load_prenorm(pkv_loader *L, int il, const pkv_attn_tensors *attn, const char *ffn_norm, pkv_ffn_tensors ffn);

#endif
