/* One architecture, one file (model layer, internal). An architecture is its GGUF
 * keys beyond the common ones (hparams.c), the tensors of a layer (loaded with the
 * blocks of load.h) and the forward pass of a layer (composed of the blocks of
 * blocks.h). Its file reads as the model's block diagram; what the blocks share
 * lives in them, so adding an architecture is one short file and one line in the
 * table of hparams.c. */
#ifndef PKV_ARCH_H
#define PKV_ARCH_H

#include "model/blocks.h"
#include "model/load.h"

struct pkv_arch_mk;

typedef struct pkv_arch_ops {
    const char *name;   /* general.architecture */
    bool moe;           /* the FFN of every layer is a mixture of experts (expert_* keys required) */
    bool moe_after_dense; /* where the file has expert_count, the layers after its
                             leading_dense_block_count are mixtures of experts (their n_ff
                             expert_feed_forward_length), the first ones dense (deepseek2) */
    bool kv0_recurrent; /* attention.head_count_kv 0 marks a recurrent layer (granitehybrid, lfm2,
                           as llama.cpp reads them): hparams.c sets its hp.recurrent bit and takes its
                           KV heads as its heads (unused); elsewhere 0 is refused */
    bool rec_first;     /* a recurrent layer of fewer state groups than devices runs whole on the
                           first device (pkv_blk_mamba2; pkv_layer.rec_first), its other shards
                           replicas that no kernel touches; elsewhere such a split is refused */
    bool ff0_layers;    /* feed_forward_length 0 marks a layer without FFN (nemotron_h); with
                           kv0_recurrent a layer of 0 KV heads and FFN rows is an FFN alone
                           (hp.ffn_only), one of 0 KV heads and 0 rows recurrent */
    bool rope_neox;     /* RoPE rotates pairs (i, i + n_rot/2), else adjacent pairs (i, i + 1) */
    bool rope_freqs;    /* reads rope_freqs.weight itself (hparams); elsewhere the tensor is refused */
    bool yarn_log_mul;  /* takes rope.scaling.yarn_log_multiplier (mistral3: its YaRN magnitude, hparams.c);
                           elsewhere a non-zero one is refused */
    bool longrope;      /* reads LongRoPE's rope_factors_short/_long.weight itself (hparams, load_global);
                           elsewhere they are refused */
    bool rerank;        /* rank pooling over a classification head (cls.output), as llama.cpp scores
                           this architecture's rerankers (Qwen3-Reranker); mkmodel --pooling rank */
    const char *output_norm; /* the final norm's tensor where it is not output_norm.weight (lfm2:
                                token_embd_norm.weight, llama.cpp's name for it); NULL: that */
    bool foreign_embd;  /* the step's input rows come from another model's token embedding (the
                           assistant's target's): a LoRA adapter of its own token_embd is refused */
    /* The architecture's own keys and rules, after the common ones are read; n_head
     * is per layer. NULL: none. */
    pkv_status (*hparams)(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head);
    /* The tensors of layer il (the shards' ranges, window and RoPE are set). */
    pkv_status (*load_layer)(pkv_loader *L, int il);
    /* Layer il of a forward step. */
    pkv_status (*layer)(pkv_fwd *f, int il);
    /* Tensors outside the layers beyond the embedding, final norm and output, and
     * what the model reads instead of KV of its own, set up before the layers are
     * loaded (gemma4's per-layer embeddings; the assistant's queries-only map, an MTP
     * head's input projection and norms). NULL: none. */
    pkv_status (*load_global)(pkv_loader *L);
    /* The file's nextn_predict_layers (hp.n_nextn) layers after the trunk can be
     * loaded alone as an MTP head (pkv_model_params.mtp): load_global reads its
     * tensors and input sets its input. */
    bool mtp_head;
    /* The step's input: x = f32 [T][n_embd] on the model's first device from
     * f->b (tokens, media rows, hidden_in), and whatever per-step inputs the layers
     * read (gemma4: every layer's per-layer input). NULL: pkv_blk_embed. */
    pkv_status (*input)(pkv_fwd *f);
    /* The step's head, after the layers: logits f32 [n_out][n_vocab] into the host
     * array logits (NULL: not wanted) and, where f->b asks, the hidden rows
     * (pkv_fwd_batch.hidden_out); the step's work is done on the device at return.
     * NULL: pkv_blk_logits, then a device sync. */
    pkv_status (*output)(pkv_fwd *f, float *logits);
    /* A draft with no cache of its own that reads a target's (pkv_model_attach):
     * check draft d against target t and c, the target's cache, and point d's
     * kv_layer (and embd_of) at the target. On error nothing is changed. NULL: the
     * architecture is no such draft. */
    pkv_status (*attach)(pkv_model *d, const pkv_model *t, pkv_kv_cache *c);
    /* The cache's description of recurrent layer il's state (pkv_kv_layer_desc's
     * n_kv_heads, state_per_head and parts; its "heads" are the layer's shard unit,
     * pkv_shard_w.kv_h0 / n_kv). NULL: the gated delta-net's (pkv_fwd_state_desc). */
    void (*state_desc)(const pkv_model *m, int il, pkv_kv_layer_desc *d);
    /* What `pagekv mkmodel` writes for it (mk.h). */
    const struct pkv_arch_mk *mk;
} pkv_arch_ops;

/* The operations of a (valid) architecture. */
const pkv_arch_ops *pkv_arch_ops_of(pkv_arch a);
/* The operations of the architecture named name (general.architecture); NULL: none. */
const pkv_arch_ops *pkv_arch_ops_find(const char *name);
/* "a, b<last>c": the names of the architectures for which pred(ops, arg) holds, in
 * the table's order, into buf (cap bytes, truncated). Returns buf. */
const char *pkv_arch_names_where(bool (*pred)(const pkv_arch_ops *ops, unsigned arg), unsigned arg, const char *last,
                                 char *buf, size_t cap);

extern const pkv_arch_ops pkv_arch_llama, pkv_arch_qwen2, pkv_arch_qwen3, pkv_arch_qwen3moe, pkv_arch_phi3, pkv_arch_gemma2,
    pkv_arch_gemma3, pkv_arch_gpt_oss, pkv_arch_qwen35, pkv_arch_gemma4, pkv_arch_gemma4_assistant, pkv_arch_smollm3,
    pkv_arch_mistral3, pkv_arch_qwen35moe, pkv_arch_deepseek2, pkv_arch_llama4, pkv_arch_glm4moe,
    pkv_arch_granitehybrid, pkv_arch_nemotron_h,
    pkv_arch_lfm2, pkv_arch_lfm2moe;

/* Keys "<arch>.<suffix>" (hparams.c): a u32 that must be present and within [lo, hi];
 * an optional one (def when absent); an optional f32. Messages name the key. */
pkv_status pkv_hp_need_u32(const pkv_gguf *g, const char *arch, const char *suffix, uint32_t lo, uint32_t hi, int *out);
pkv_status pkv_hp_opt_u32(const pkv_gguf *g, const char *arch, const char *suffix, uint32_t lo, uint32_t hi, int def, int *out);
pkv_status pkv_hp_opt_f32(const pkv_gguf *g, const char *arch, const char *suffix, float def, float *out);
/* The recurrent layers' ssm.* keys (llama.cpp's), each required: conv_kernel (2 to
 * PKV_SSM_CONV_MAX) into hp->ssm.d_conv, inner_size into *inner, state_size into d_k,
 * time_step_rank into n_v_heads, group_count into n_k_heads. */
pkv_status pkv_hp_ssm_keys(const pkv_gguf *g, const char *arch, pkv_hparams *hp, int *inner);
/* hp->swa.n from '<arch>.attention.sliding_window' (0 when absent and not
 * required), at most the training context. */
pkv_status pkv_hp_window(const pkv_gguf *g, const char *arch, pkv_hparams *hp, bool required);

/* Gemma 2 and 3's keys and rules (gemma2.c): gemma3 has a window in five of six
 * layers, with a RoPE base of their own. */
pkv_status pkv_gemma_hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp, const int *n_head, bool gemma3);
/* Gemma's head (gemma2.c; gemma2, 3, 4): pkv_blk_logits, then each logit l of the
 * host copy becomes cap * tanh(l / cap), cap = hp.softcap.final (0: none). */
pkv_status pkv_gemma_output(pkv_fwd *f, float *logits);

/* The Mamba-2 hybrids' shared parts (granitehybrid.c; granitehybrid, nemotron_h):
 * the ssm.* keys into hp.ssm (d_conv, n_k_heads = groups, n_v_heads = heads, d_k =
 * state size, d_v = head size) with their rules, a Mamba-2 layer at least (hp.recurrent,
 * from kv0_recurrent), equal K and V head sizes and attention.scale (hp.attn_scale);
 * an attention layer's tensors with the Q/K/V and output biases where the file has
 * them; the state description of a Mamba-2 layer (pkv_arch_ops.state_desc). */
pkv_status pkv_mamba2_hparams(const pkv_gguf *g, const char *arch, pkv_hparams *hp);
pkv_status pkv_load_hybrid_attention(pkv_loader *L, int il);
void pkv_mamba2_layer_state(const pkv_model *m, int il, pkv_kv_layer_desc *d);

/* Gemma 4's keys its assistant shares (gemma4.c): which layers slide
 * (attention.sliding_window_pattern, one bool per layer), and rope_freqs.weight's
 * proportional RoPE of the full layers (hp->rope_pairs_full). */
pkv_status pkv_gemma4_pattern(const pkv_gguf *g, const char *arch, pkv_hparams *hp);
pkv_status pkv_gemma4_rope_freqs(const pkv_gguf *g, pkv_hparams *hp);

#endif
