/* Test models: GGUF files with random weights, written with the same key and
 * tensor names as llama.cpp's converters, so the loader path they exercise is the
 * one real files take. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/quant.h"
#include "chat/chat-families.h"
#include "model/arch/arch.h"
#include "model/arch/mk.h"
#include "model/model-impl.h"
#include "model/tokenizer-impl.h"

pkv_mkmodel_params pkv_mkmodel_default_params(void) {
    pkv_mkmodel_params p;
    memset(&p, 0, sizeof p);
    p.arch = "llama";
    p.type = PKV_TYPE_F16;
    return p;
}

/* ------------------------------------------------------- chat templates */

/* The chat-template families a test model can carry: the family's special tokens
 * (control tokens at ids 256.., in the order the real vocabulary has them), the
 * tokenizer settings its real GGUF files have, and a Jinja template (written for
 * pagekv) that renders the turn format the server renders for that family
 * (src/chat/chat-template.c, whose detector recognises each one by its markers).
 * The vocabulary stays the builtin byte-level BPE for every family: the families
 * whose real models use SentencePiece (llama2, mistral, gemma) get their special
 * tokens and flags, not their tokenizer. None of the templates writes bos_token:
 * the BOS, where the family has one, comes from tokenizer.ggml.add_bos_token, as
 * the server (which renders the turns in C and tokenizes with BOS) sees it. */
#define FW "\xef\xbd\x9c" /* U+FF5C FULLWIDTH VERTICAL LINE */
#define SP "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

typedef struct {
    const char *name;
    const char *pre;           /* tokenizer.ggml.pre */
    bool add_bos;              /* tokenizer.ggml.add_bos_token */
    const char *specials[8];   /* ids 256.., NULL-terminated */
    int bos, eos, eot, pad;    /* index in specials of each id key written; -1 = key absent */
    const char *jinja;         /* tokenizer.chat_template */
} chat_family;

static const chat_family k_families[] = {
    /* Qwen2/2.5 instruct files: no BOS added, though bos_token_id names
     * <|endoftext|>; eos is <|im_end|> (the instruct models' end of turn, also
     * written as eot) and <|endoftext|> is the padding token. */
    {"chatml", "qwen2", false, {"<|endoftext|>", "<|im_start|>", "<|im_end|>", NULL}, 0, 2, 2, 0,
     PKV_JINJA_CHATML},
    /* Llama 3.1 instruct files: BOS added; eos and eot are <|eot_id|> (the end of
     * an instruct turn); <|end_of_text|> and <|eom_id|> end generation by their text. */
    {"llama3", "llama-bpe", true,
     {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
      NULL},
     0, 5, 5, -1,
     PKV_JINJA_LLAMA3},
    /* Llama 2 chat: only <s> and </s> are special; [INST] and <<SYS>> are text. */
    {"llama2", "default", true, {"<s>", "</s>", NULL}, 0, 1, -1, -1,
     PKV_JINJA_LLAMA2},
    /* Mistral v0.3 instruct: [INST] and [/INST] are control tokens. */
    {"mistral", "default", true, {"<s>", "</s>", "[INST]", "[/INST]", NULL}, 0, 1, -1, -1,
     PKV_JINJA_MISTRAL},
    /* Voxtral (Mistral's tekken vocabulary, as the converter writes Voxtral's text
     * model): mistral's turns plus the transcription prompt's control tokens. */
    {"voxtral", "tekken", true, {"<s>", "</s>", "[INST]", "[/INST]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", NULL}, 0, 1, -1, -1,
     PKV_JINJA_MISTRAL},
    /* Gemma 2/3 instruct: <pad> 0, <eos> 1, <bos> 2 as there; <end_of_turn> is eot. */
    {"gemma", "default", true, {"<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", NULL}, 2, 1, 4, 0,
     PKV_JINJA_GEMMA},
    /* In the manner of Phi-4-mini instruct (the family's byte-level BPE model): no
     * BOS added, <|endoftext|> as bos and padding, <|end|> (end of a turn) as eos and eot. */
    {"phi3", "llama-bpe", false, {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>", "<|system|>", NULL}, 0, 2, 2,
     0,
     PKV_JINJA_PHI3},
    /* DeepSeek-R1-Distill-Qwen: the Qwen pre-tokenizer under DeepSeek's name, BOS
     * added, ids in that vocabulary's order (end of sentence first). */
    {"deepseek", "deepseek-r1-qwen", true,
     {"<" FW "end" SP "of" SP "sentence" FW ">", "<" FW "User" FW ">", "<" FW "Assistant" FW ">",
      "<" FW "begin" SP "of" SP "sentence" FW ">", NULL},
     3, 0, -1, -1,
     PKV_JINJA_DEEPSEEK},
};
#undef FW
#undef SP

#define FAMILY_NAMES "chatml, llama3, llama2, mistral, gemma, phi3, deepseek, voxtral"

static const chat_family *find_family(const char *name) {
    for (size_t i = 0; i < PKV_ARRAY_LEN(k_families); i++)
        if (!strcmp(name, k_families[i].name)) return &k_families[i];
    return NULL;
}

/* The builtin vocabulary, with the family's special tokens when there is one. */
static pkv_vocab_desc *family_vocab(const chat_family *f, const char *const *extra, int32_t n_vocab) {
    if (!f) return pkv_vocab_builtin_create(n_vocab);
    const char *sp[32];
    int n = 0;
    while (f->specials[n]) sp[n] = f->specials[n], n++;
    for (int i = 0; extra && extra[i] && n < (int)PKV_ARRAY_LEN(sp); i++) sp[n++] = extra[i];
    pkv_vocab_desc *d = pkv_vocab_builtin_create_specials(n_vocab, sp, n);
    if (!d) return NULL;
    d->pre = f->pre;
    d->add_bos = f->add_bos;
    d->bos_id = f->bos >= 0 ? 256 + f->bos : -1;
    d->eos_id = f->eos >= 0 ? 256 + f->eos : -1;
    d->eot_id = f->eot >= 0 ? 256 + f->eot : -1;
    d->pad_id = f->pad >= 0 ? 256 + f->pad : -1;
    return d;
}


static double urand(pkv_mk *b) { /* [-1, 1) from splitmix64 */
    uint64_t z = (b->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

/* Quantize rows [rows][cols] of b->f into b->q and add them as a tensor of ne. */
static pkv_status add_rows(pkv_mk *b, const char *name, pkv_type type, int64_t cols, int64_t rows, int nd,
                           const int64_t *ne) {
    size_t row = pkv_type_row_bytes(type, (size_t)cols);
    if (!row)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: tensor %s: %lld columns is not a multiple of the %s block (%zu)", name,
                       (long long)cols, pkv_type_name(type), pkv_type_block_elems(type));
    for (int64_t r = 0; r < rows; r++) {
        pkv_status s = pkv_quantize_row(type, b->f + (size_t)r * (size_t)cols, (uint8_t *)b->q + (size_t)r * row, cols);
        if (s) return pkv_err_prefix(s, "mkmodel: tensor %s", name);
    }
    return pkv_gguf_writer_add_tensor(b->w, name, type, nd, ne, b->q, row * (size_t)rows);
}

pkv_status pkv_mk_mamba2_check(pkv_mkmodel_params *p) {
    if (!p->ssm_head_dim) p->ssm_head_dim = 16;
    if (!p->ssm_state) p->ssm_state = p->ssm_head_dim;
    if (p->ssm_state < 1 || p->ssm_state > 256)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: %s needs a state size of 1 to 256, not %d", p->arch, p->ssm_state);
    const int E = p->n_embd ? p->n_embd : 128;
    if (!p->ssm_v_heads) p->ssm_v_heads = 2 * E % p->ssm_head_dim == 0 ? 2 * E / p->ssm_head_dim : 4;
    if (!p->ssm_k_heads) p->ssm_k_heads = p->ssm_v_heads % 2 == 0 ? 2 : 1;
    return pkv_mk_ssm_check(p);
}

pkv_status pkv_mk_ssm_check(const pkv_mkmodel_params *p) {
    if (p->ssm_v_heads < 1 || p->ssm_k_heads < 1 || p->ssm_v_heads % p->ssm_k_heads || p->ssm_head_dim < 1 ||
        p->ssm_head_dim > 256 || p->n_layer > 64)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: %s needs value heads a multiple of key heads (groups), a head size of 1 "
                       "to 256 and at most 64 layers", p->arch);
    return PKV_OK;
}

pkv_status pkv_mk_ssm_rows(const pkv_mkmodel_params *p, size_t blk) {
    return pkv_mk_row_check(p, blk, "value heads x head size", (int64_t)p->ssm_v_heads * p->ssm_head_dim);
}

pkv_status pkv_mk_ssm_keys(pkv_mk *b, int d_conv, int state, int groups, int heads, int inner) {
    PKV_MK_TRY(pkv_mk_u32(b, "ssm.conv_kernel", (uint32_t)d_conv));
    PKV_MK_TRY(pkv_mk_u32(b, "ssm.state_size", (uint32_t)state));
    PKV_MK_TRY(pkv_mk_u32(b, "ssm.group_count", (uint32_t)groups));
    PKV_MK_TRY(pkv_mk_u32(b, "ssm.time_step_rank", (uint32_t)heads));
    return pkv_mk_u32(b, "ssm.inner_size", (uint32_t)inner);
}

pkv_status pkv_mk_add(pkv_mk *b, const char *name, pkv_type type, int64_t cols, int64_t rows, double center, double scale) {
    size_t n = (size_t)cols * (size_t)rows;
    if (n > b->cap) return pkv_err(PKV_ERR_INTERNAL, "mkmodel: tensor %s larger than scratch", name);
    for (size_t i = 0; i < n; i++) b->f[i] = (float)(center + scale * urand(b));
    int64_t ne[2] = {cols, rows};
    return add_rows(b, name, type, cols, rows, rows > 1 ? 2 : 1, ne);
}

pkv_status pkv_mk_add3(pkv_mk *b, const char *name, pkv_type type, int64_t cols, int64_t rows, int64_t n, double scale) {
    size_t count = (size_t)cols * (size_t)rows * (size_t)n;
    if (count > b->cap) return pkv_err(PKV_ERR_INTERNAL, "mkmodel: tensor %s larger than scratch", name);
    for (size_t i = 0; i < count; i++) b->f[i] = (float)(scale * urand(b));
    int64_t ne[3] = {cols, rows, n};
    return add_rows(b, name, type, cols, rows * n, 3, ne);
}

pkv_status pkv_mk_blk(pkv_mk *b, int l, const char *suffix, pkv_type type, int64_t cols, int64_t rows, double center,
                      double scale) {
    char n[96];
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);
    return pkv_mk_add(b, n, type, cols, rows, center, scale);
}

pkv_status pkv_mk_blk3(pkv_mk *b, int l, const char *suffix, pkv_type type, int64_t cols, int64_t rows, double scale) {
    char n[96];
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);
    return pkv_mk_add3(b, n, type, cols, rows, b->p->n_expert, scale);
}

pkv_status pkv_mk_norm(pkv_mk *b, int l, const char *suffix, int64_t n) {
    return pkv_mk_blk(b, l, suffix, PKV_TYPE_F32, n, 1, 1.0, 0.1);
}

/* The type of a matrix: p->type, or in a mixture (k_mixture) like the ones
 * llama-quantize writes (Q4_K_M, Q3_K_M, IQ3_M, ...): q6_k for the output
 * matrix; for attn_v and ffn_down of every other layer q6_k when the base type
 * is q4_k (as published Q4_K_M files), else q4_k; with other base types also
 * q5_k for attn_k of the odd layers, so that one file holds four or five types.
 * (llama.cpp's exact per-layer choice differs; the point is files of several
 * types.) */
pkv_type pkv_mk_type(const pkv_mkmodel_params *p, const char *what, int layer) {
    if (!p->k_mixture) return p->type;
    if (!strcmp(what, "output")) return PKV_TYPE_Q6_K;
    const bool q4 = p->type == PKV_TYPE_Q4_K;
    if ((!strcmp(what, "attn_v") || !strcmp(what, "ffn_down")) && layer % 2 == 0) return q4 ? PKV_TYPE_Q6_K : PKV_TYPE_Q4_K;
    if (!q4 && !strcmp(what, "attn_k") && layer % 2 == 1) return PKV_TYPE_Q5_K;
    return p->type;
}

const char *pkv_mk_key(pkv_mk *b, const char *suffix) {
    snprintf(b->k, sizeof b->k, "%s.%s", b->p->arch, suffix);
    return b->k;
}

pkv_status pkv_mk_u32(pkv_mk *b, const char *suffix, uint32_t v) {
    return pkv_gguf_writer_add_u32(b->w, pkv_mk_key(b, suffix), v);
}

pkv_status pkv_mk_f32(pkv_mk *b, const char *suffix, float v) {
    return pkv_gguf_writer_add_f32(b->w, pkv_mk_key(b, suffix), v);
}

pkv_status pkv_mk_arr(pkv_mk *b, const char *suffix, pkv_gguf_type type, const void *data, uint64_t n) {
    return pkv_gguf_writer_add_arr(b->w, pkv_mk_key(b, suffix), type, data, n);
}

pkv_status pkv_mk_expert_keys(pkv_mk *b, int n_ff_exp) { /* llama.cpp's keys */
    PKV_MK_TRY(pkv_mk_u32(b, "expert_count", (uint32_t)b->p->n_expert));
    PKV_MK_TRY(pkv_mk_u32(b, "expert_used_count", (uint32_t)b->p->n_expert_used));
    return pkv_mk_u32(b, "expert_feed_forward_length", (uint32_t)n_ff_exp);
}

pkv_status pkv_mk_moe_extras(pkv_mk *b, int l, unsigned what, int64_t n_ff_sh) {
    const int64_t E = b->p->n_embd;
    /* a selection bias about the spread of sigmoid scores, so it changes some choices */
    if (what & PKV_MOE_PROBS_B) PKV_MK_TRY(pkv_mk_blk(b, l, "exp_probs_b.bias", PKV_TYPE_F32, b->p->n_expert, 1, 0.0, 0.2));
    if (!(what & (PKV_MOE_SHARED | PKV_MOE_SHARED_GATE))) return PKV_OK;
    PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate_shexp.weight", b->p->type, E, n_ff_sh, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_up_shexp.weight", b->p->type, E, n_ff_sh, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_down_shexp.weight", pkv_mk_type(b->p, "ffn_down", l), n_ff_sh, E, 0.0, b->lin_f));
    if (what & PKV_MOE_SHARED_GATE) PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate_inp_shexp.weight", PKV_TYPE_F32, E, 1, 0.0, b->lin_e));
    return PKV_OK;
}

pkv_status pkv_mk_nextn(pkv_mk *b, int l) {
    const int64_t E = b->E;
    PKV_MK_TRY(pkv_mk_blk(b, l, "nextn.eh_proj.weight", b->p->type, 2 * E, E, 0.0, sqrt(3.0 / (double)(2 * E))));
    PKV_MK_TRY(pkv_mk_norm(b, l, "nextn.enorm.weight", E));
    PKV_MK_TRY(pkv_mk_norm(b, l, "nextn.hnorm.weight", E));
    return pkv_mk_norm(b, l, "nextn.shared_head_norm.weight", E);
}

pkv_status pkv_mk_window_key(pkv_mk *b) {
    return pkv_mk_u32(b, "attention.sliding_window", (uint32_t)b->p->sliding_window);
}

pkv_status pkv_mk_ffn(pkv_mk *b, int l, pkv_ffn_tensors ffn) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E;
    const pkv_type down = pkv_mk_type(p, "ffn_down", l);
    switch (ffn) {
    case PKV_FFN_EXPERTS:
    case PKV_FFN_EXPERTS_BIASED: /* the router and n_expert FFNs as 3-D tensors [experts][rows][cols] */
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate_inp.weight", p->type, E, p->n_expert, 0.0, 4.0 * b->lin_e));
        PKV_MK_TRY(pkv_mk_blk3(b, l, "ffn_gate_exps.weight", p->type, E, p->n_ff, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk3(b, l, "ffn_up_exps.weight", p->type, E, p->n_ff, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk3(b, l, "ffn_down_exps.weight", down, p->n_ff, E, b->lin_f));
        if (ffn == PKV_FFN_EXPERTS) return PKV_OK;
        /* the router's bias and each expert's bias rows [experts][rows] */
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate_inp.bias", PKV_TYPE_F32, p->n_expert, 1, 0.0, 0.5));
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate_exps.bias", PKV_TYPE_F32, p->n_ff, p->n_expert, 0.0, 0.1));
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_up_exps.bias", PKV_TYPE_F32, p->n_ff, p->n_expert, 0.0, 0.1));
        return pkv_mk_blk(b, l, "ffn_down_exps.bias", PKV_TYPE_F32, E, p->n_expert, 0.0, 0.1);
    case PKV_FFN_FUSED_UP: /* the gate's rows, then the up projection's, in one matrix */
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_up.weight", p->type, E, 2 * p->n_ff, 0.0, b->lin_e));
        return pkv_mk_blk(b, l, "ffn_down.weight", down, p->n_ff, E, 0.0, b->lin_f);
    case PKV_FFN_GATED:
    default:
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_gate.weight", p->type, E, p->n_ff, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk(b, l, "ffn_up.weight", p->type, E, p->n_ff, 0.0, b->lin_e));
        return pkv_mk_blk(b, l, "ffn_down.weight", down, p->n_ff, E, 0.0, b->lin_f);
    }
}


pkv_status pkv_mk_attention(pkv_mk *b, int l, const pkv_attn_tensors *attn) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E, qd = b->qd, kd = b->kd;
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
    if (attn->q_gate) { /* per head: its q rows, then its output gate's */
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_q.weight", p->type, E, 2 * qd, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_k.weight", p->type, E, kd, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_v.weight", pkv_mk_type(p, "attn_v", l), E, kd, 0.0, b->lin_e));
    } else if (attn->fused_qkv) { /* Q, K, V in one matrix, as Phi-3's GGUFs have them */
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_qkv.weight", p->type, E, qd + 2 * kd, 0.0, b->lin_e));
    } else {
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_q.weight", p->type, E, qd, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_k.weight", pkv_mk_type(p, "attn_k", l), E, kd, 0.0, b->lin_e));
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_v.weight", pkv_mk_type(p, "attn_v", l), E, kd, 0.0, b->lin_e));
    }
    if (attn->qkv_bias) {
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_q.bias", PKV_TYPE_F32, qd, 1, 0.0, 0.1));
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_k.bias", PKV_TYPE_F32, kd, 1, 0.0, 0.1));
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_v.bias", PKV_TYPE_F32, kd, 1, 0.0, 0.1));
    }
    if (attn->qk_norm) {
        PKV_MK_TRY(pkv_mk_norm(b, l, "attn_q_norm.weight", p->head_dim));
        PKV_MK_TRY(pkv_mk_norm(b, l, "attn_k_norm.weight", p->head_dim));
    }
    PKV_MK_TRY(pkv_mk_blk(b, l, "attn_output.weight", p->type, qd, E, 0.0, b->lin_q));
    if (attn->out_bias) PKV_MK_TRY(pkv_mk_blk(b, l, "attn_output.bias", PKV_TYPE_F32, E, 1, 0.0, 0.1));
    if (attn->sinks) /* a sink logit per query head (U(-1, 2): about a score) */
        PKV_MK_TRY(pkv_mk_blk(b, l, "attn_sinks.weight", PKV_TYPE_F32, p->n_head, 1, 0.5, 1.5));
    return PKV_OK;
}

pkv_status pkv_mk_mamba2(pkv_mk *b, int l) {
    const pkv_mkmodel_params *p = b->p;
    const int64_t E = b->E, H = p->ssm_v_heads, G = p->ssm_k_heads, P = p->ssm_head_dim, N = p->ssm_state;
    const int64_t DI = H * P, C = DI + 2 * G * N;
    PKV_MK_TRY(pkv_mk_norm(b, l, "attn_norm.weight", E));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_in.weight", p->type, E, 2 * DI + 2 * G * N + H, 0.0, b->lin_e));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_conv1d.weight", PKV_TYPE_F32, 4, C, 0.0, 0.5));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_conv1d.bias", PKV_TYPE_F32, C, 1, 0.0, 0.2));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_dt.bias", PKV_TYPE_F32, H, 1, 0.0, 1.0));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_a", PKV_TYPE_F32, 1, H, -1.0, 0.5)); /* -exp(A_log) < 0 */
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_d", PKV_TYPE_F32, 1, H, 1.0, 0.5));
    PKV_MK_TRY(pkv_mk_blk(b, l, "ssm_norm.weight", PKV_TYPE_F32, DI / G, G, 1.0, 0.1));
    return pkv_mk_blk(b, l, "ssm_out.weight", p->type, DI, E, 0.0, sqrt(3.0 / (double)DI));
}

pkv_status pkv_mk_layer(pkv_mk *b, int l, const pkv_attn_tensors *attn, const char *ffn_norm, pkv_ffn_tensors ffn,
                        bool post_norms) {
    const int64_t E = b->E;
    PKV_MK_TRY(pkv_mk_attention(b, l, attn));
    if (post_norms) PKV_MK_TRY(pkv_mk_norm(b, l, "post_attention_norm.weight", E));
    PKV_MK_TRY(pkv_mk_norm(b, l, ffn_norm ? ffn_norm : "ffn_norm.weight", E));
    if (post_norms) PKV_MK_TRY(pkv_mk_norm(b, l, "post_ffw_norm.weight", E));
    return pkv_mk_ffn(b, l, ffn);
}

pkv_status pkv_mk_row_check(const pkv_mkmodel_params *p, size_t blk, const char *what, int64_t cols) {
    if (cols % (int64_t)blk)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: type %s needs row lengths that are multiples of %zu: %s is %lld",
                       pkv_type_name(p->type), blk, what, (long long)cols);
    return PKV_OK;
}

pkv_status pkv_mk_begin(pkv_mk *b, uint64_t seed, size_t cap) {
    b->rng = seed;
    b->cap = cap;
    b->f = pkv_malloc(cap * sizeof(float));
    b->q = pkv_malloc(cap * sizeof(float));
    b->w = pkv_gguf_writer_create();
    return b->f && b->q && b->w ? PKV_OK : pkv_err(PKV_ERR_NOMEM, "mkmodel: out of memory");
}

pkv_status pkv_mk_end(pkv_mk *b, pkv_gguf *tg, pkv_status s, pkv_gguf_writer **out) {
    pkv_gguf_close(tg);
    pkv_free(b->f);
    pkv_free(b->q);
    if (s) {
        pkv_gguf_writer_free(b->w);
        return s;
    }
    *out = b->w;
    return PKV_OK;
}

/* general.file_type: llama.cpp's file-type id of a file mostly of type t
 * (the k-quants as their _S or _M mixes: 15 = Q4_K_M for the q4_k mixture). */
static uint32_t llama_ftype(pkv_type t, bool k_mixture) {
    switch (t) {
    case PKV_TYPE_F32: return 0;
    case PKV_TYPE_F16: return 1;
    case PKV_TYPE_Q4_0: return 2;
    case PKV_TYPE_Q4_1: return 3;
    case PKV_TYPE_Q8_0: return 7;
    case PKV_TYPE_Q5_0: return 8;
    case PKV_TYPE_Q5_1: return 9;
    case PKV_TYPE_Q2_K: return 10;
    case PKV_TYPE_Q3_K: return k_mixture ? 12 : 11; /* Q3_K_M, Q3_K_S */
    case PKV_TYPE_Q4_K: return k_mixture ? 15 : 14;
    case PKV_TYPE_Q5_K: return 17;
    case PKV_TYPE_Q6_K: return 18;
    case PKV_TYPE_IQ2_XXS: return 19;
    case PKV_TYPE_IQ2_XS: return 20;
    case PKV_TYPE_IQ3_XXS: return 23;
    case PKV_TYPE_IQ1_S: return 24;
    case PKV_TYPE_IQ4_NL: return 25;
    case PKV_TYPE_IQ3_S: return k_mixture ? 27 : 26; /* IQ3_M, IQ3_S */
    case PKV_TYPE_IQ2_S: return k_mixture ? 29 : 28; /* IQ2_M, IQ2_S */
    case PKV_TYPE_IQ4_XS: return 30;
    case PKV_TYPE_IQ1_M: return 31;
    case PKV_TYPE_BF16: return 32;
    case PKV_TYPE_TQ1_0: return 36;
    case PKV_TYPE_TQ2_0: return 37;
    case PKV_TYPE_MXFP4: return 38; /* MXFP4_MOE */
    default: return 1024;           /* LLAMA_FTYPE_GUESSED */
    }
}

static bool takes(const pkv_arch_ops *ops, unsigned what) { return ops->mk && (ops->mk->takes & what); }

/* Options of pkv_arch_mk.takes what given to an architecture that does not take
 * them: refused, naming those that do. */
static pkv_status refuse(const pkv_mkmodel_params *p, const pkv_arch_ops *ops, unsigned what, bool given, const char *msg) {
    if (!given || takes(ops, what)) return PKV_OK;
    char names[256];
    return pkv_err(PKV_ERR_INVALID, "mkmodel: %s are for %s, not %s", msg,
                   pkv_arch_names_where(takes, what, " and ", names, sizeof names), p->arch);
}

/* pkv_mkmodel_params.pooling's names, in llama.cpp's enum order */
static const char *const k_pooling[] = {"none", "mean", "cls", "last", "rank"};

static int pooling_of(const char *name) {
    for (int i = 0; name && i < 5; i++)
        if (!strcmp(name, k_pooling[i])) return i;
    return -1;
}

/* Qwen3-Reranker's query/document prompt, as llama.cpp's converter writes it
 * (tokenizer.chat_template.rerank; {query} and {document} are replaced) */
static const char k_rerank_template[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n";

static bool reranks(const pkv_arch_ops *ops, unsigned arg) {
    (void)arg;
    return ops->rerank;
}

static pkv_status validate(pkv_mkmodel_params *p) {
    if (!p->arch) p->arch = "llama";
    if (p->pooling && pooling_of(p->pooling) < 0)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: pooling '%s' is not one of none, mean, cls, last, rank", p->pooling);
    const pkv_arch_ops *ops = pkv_arch_ops_find(p->arch);
    if (pooling_of(p->pooling) == 4 && !(ops && ops->rerank)) {
        char names[256];
        return pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: pooling rank writes a reranker's layout: --arch %s only",
                       pkv_arch_names_where(reranks, 0, " or ", names, sizeof names));
    }
    if (!ops || !ops->mk)
        return pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: architecture '%s' is not supported (%s)", p->arch, pkv_arch_list());
    const pkv_arch_mk *mk = ops->mk;
    pkv_status s;
    if (mk->takes & PKV_MK_WINDOW) {
        if (!p->sliding_window) p->sliding_window = 8;
    } else if (p->sliding_window) {
        char names[256];
        return pkv_err(PKV_ERR_INVALID, "mkmodel: a sliding window is for %s, not %s",
                       pkv_arch_names_where(takes, PKV_MK_WINDOW, " and ", names, sizeof names), p->arch);
    }
    if (mk->tied) p->tied = true;
    if ((s = refuse(p, ops, PKV_MK_LAYERS,
                    p->head_dim_swa || p->n_head_kv_full || p->n_embd_per_layer || p->n_shared_kv || p->swa_layers,
                    "sliding head sizes, full-layer KV heads, per-layer embeddings, shared KV layers and a sliding "
                    "pattern")) ||
        (s = refuse(p, ops, PKV_MK_DELTANET, p->ssm_v_heads || p->ssm_k_heads || p->ssm_head_dim || p->ssm_state,
                            "recurrent-layer sizes")) ||
        (s = refuse(p, ops, PKV_MK_MTP, p->n_mtp, "MTP layers (0 to 4)")) ||
        (s = refuse(p, ops, PKV_MK_LONGROPE, p->rope_orig_ctx, "LongRoPE factors (rope_orig_ctx)")) ||
        (s = refuse(p, ops, PKV_MK_MLA, p->q_lora_rank || p->kv_lora_rank, "latent attention ranks (q/kv_lora_rank)")))
        return s;
    if (!mk->layer) /* made whole by its build hook, which a draft of such a file does not take */
        return pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: a draft of a %s model is not supported", p->arch);
    if (mk->check && (s = mk->check(p))) return s;
    if (p->sliding_window < 0) return pkv_err(PKV_ERR_INVALID, "mkmodel: sliding window %d", p->sliding_window);
    /* experts: required where the architecture is a mixture, else optional where taken (0: dense) */
    bool moe = ops->moe || (takes(ops, PKV_MK_EXPERTS) && (p->n_expert || p->n_expert_used));
    if (!moe && (p->n_expert || p->n_expert_used)) {
        char names[256];
        return pkv_err(PKV_ERR_INVALID, "mkmodel: experts are for a mixture-of-experts architecture (%s), not %s",
                       pkv_arch_names_where(takes, PKV_MK_EXPERTS, ", ", names, sizeof names), p->arch);
    }
    if (moe && !p->n_expert) p->n_expert = 4;
    if (moe && !p->n_expert_used) p->n_expert_used = p->n_expert >= 2 ? 2 : 1;
    if (moe && (p->n_expert < 1 || p->n_expert > 256 || p->n_expert_used < 1 || p->n_expert_used > p->n_expert))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: %d experts with %d used per token: need 1 <= used <= experts <= 256",
                       p->n_expert, p->n_expert_used);
    if (p->chat_template_text && !p->chat_template) p->chat_template = "chatml";
    if (p->chat_template && !find_family(p->chat_template))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: unknown chat template '%s': the families are " FAMILY_NAMES,
                       p->chat_template);
    if (p->chat_template && p->no_vocab)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: a chat template needs a vocabulary (not with no_vocab)");
    pkv_pretok pre;
    if (p->pre && (p->no_vocab || p->draft_of))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: a pre-tokenizer (pre) needs a vocabulary of its own (not with no_vocab "
                                        "or draft_of)");
    if (p->pre && !pkv_pretok_from_name(p->pre, &pre)) {
        char names[2048];
        pkv_pretok_names(names, sizeof names);
        return pkv_err(PKV_ERR_INVALID, "mkmodel: unknown pre-tokenizer (pre) '%s': the names are %s", p->pre, names);
    }
    if (p->extra_specials && !p->chat_template)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: extra special tokens go after a chat template's: give one");
    if (!p->n_layer) p->n_layer = 2;
    /* k-quants pack rows in blocks of 256: the default width follows */
    bool kq = pkv_type_block_elems(p->type) == 256;
    if (!p->n_embd) p->n_embd = kq ? 256 : 128;
    if (!p->n_head) p->n_head = 4;
    if (!p->n_head_kv) p->n_head_kv = p->n_head >= 2 ? p->n_head / 2 : 1;
    if (!p->head_dim) p->head_dim = p->n_embd / p->n_head;
    if (!p->n_ff) p->n_ff = kq ? 512 : 256;
    if (!p->n_vocab) p->n_vocab = 512;
    if (!p->n_ctx) p->n_ctx = 2048;
    if (!p->seed) p->seed = 1;
    if (p->n_layer < 1 || p->n_layer > 256 || p->n_embd < 1 || p->n_head < 1 || p->n_head_kv < 1 || p->n_ff < 1 ||
        p->head_dim < 2 || p->head_dim % 2 || p->n_ctx < 1)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: sizes must be positive (layers <= 256, even head size)");
    if (p->n_head % p->n_head_kv)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: %d heads is not a multiple of %d KV heads", p->n_head, p->n_head_kv);
    if (p->n_vocab < (p->no_vocab ? 2 : 300) || p->n_vocab > (1 << 20))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: vocabulary of %d tokens: need %d to %d", p->n_vocab, p->no_vocab ? 2 : 300,
                       1 << 20);
    if (p->k_mixture && pkv_type_block_elems(p->type) <= 1)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: a mixture is of a quantized base type with k-quants, not %s",
                       pkv_type_name(p->type) ? pkv_type_name(p->type) : "?");
    size_t blk = p->k_mixture ? 256 : pkv_type_block_elems(p->type);
    if (!blk || p->type == PKV_TYPE_I32 || p->type == PKV_TYPE_Q8_K)
        return pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: weight type %s is not supported", pkv_type_name(p->type) ? pkv_type_name(p->type) : "?");
    if ((s = pkv_mk_row_check(p, blk, "--dim", p->n_embd)) ||
        (s = pkv_mk_row_check(p, blk, "--heads x --head-dim", (int64_t)p->n_head * p->head_dim)) ||
        (s = pkv_mk_row_check(p, blk, "--ffn", p->n_ff)))
        return s;
    return mk->check_rows ? mk->check_rows(p, blk) : PKV_OK;
}

/* Settings a draft takes over from its target (--draft-of). */
typedef struct pkv_mk_target {
    const pkv_gguf *g; /* the target, for its tokenizer.* keys */
    float rope_base, rms_eps;
    float rope_freq_scale; /* 1 / the RoPE scaling factor */
    int n_rot;
    int yarn_orig; /* YaRN's original context (the scaling is YaRN's); 0 = linear or none */
} target_of;

/* Read the target's sizes into p (a draft shares its geometry and vocabulary). */
static pkv_status read_target(pkv_mkmodel_params *p, const pkv_gguf *g, target_of *t) {
    pkv_hparams hp;
    int *nh = NULL, *nkv = NULL, *nff = NULL;
    pkv_status s = pkv_hparams_read(g, &hp, &nh, &nkv, &nff);
    if (s) return s;
    int l0 = 0; /* the layer whose heads the draft copies: the first listed one the target has */
    for (int j = 0; p->shared_kv_layers && j < p->n_layer; j++)
        if (p->shared_kv_layers[j] >= 0 && p->shared_kv_layers[j] < hp.n_layer) {
            l0 = p->shared_kv_layers[j];
            break;
        }
    p->arch = pkv_arch_name(hp.arch);
    p->n_embd = hp.n_embd;
    p->n_head = nh[l0];
    p->n_head_kv = nkv[l0];
    p->head_dim = hp.head_dim_k;
    p->n_ff = nff[l0];
    p->n_expert = hp.moe.n_expert; /* a draft of a MoE model is one too */
    p->n_expert_used = hp.moe.n_used;
    p->n_ctx = hp.n_ctx_train;
    p->sliding_window = hp.swa.n; /* the target's window (0 where none) */
    const pkv_arch_mk *mk = pkv_arch_ops_of(hp.arch)->mk;
    if (mk && mk->draft) mk->draft(p, &hp, nh, nkv);
    const char *tm;
    size_t tml;
    p->no_vocab = pkv_gguf_get_str(g, "tokenizer.ggml.model", &tm, &tml) || (tml == 4 && !memcmp(tm, "none", 4));
    const pkv_gguf_tensor *te = pkv_gguf_find_tensor(g, "token_embd.weight");
    if (!te) s = pkv_err(PKV_ERR_FORMAT, "mkmodel: %s: tensor 'token_embd.weight' not found", pkv_gguf_label(g));
    else p->n_vocab = (int)te->ne[1];
    if (!s && hp.head_dim_k != hp.head_dim_v && !(mk && mk->own_head_keys)) /* deepseek2's latent row: its own */
        s = pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: %s: K and V head sizes differ (%d, %d)", pkv_gguf_label(g), hp.head_dim_k,
                    hp.head_dim_v);
    t->g = g;
    t->rope_base = hp.rope_base;
    t->rope_freq_scale = hp.rope_freq_scale;
    t->rms_eps = hp.rms_eps;
    t->n_rot = hp.n_rot;
    t->yarn_orig = hp.yarn.ext_factor != 0 ? hp.yarn.n_ctx_orig : 0;
    pkv_free(nh);
    pkv_free(nkv);
    pkv_free(nff);
    return s;
}

#define TRY PKV_MK_TRY

/* The general keys and the sizes. */
static pkv_status mk_sizes(pkv_mk *b, const pkv_arch_mk *mk) {
    pkv_mkmodel_params *p = b->p;
    TRY(pkv_gguf_writer_add_str(b->w, "general.architecture", p->arch));
    TRY(pkv_gguf_writer_add_str(b->w, "general.name", "pagekv random test model"));
    /* general.file_type uses llama.cpp's file-type ids, not tensor types: only
     * the ones this writer can make */
    TRY(pkv_gguf_writer_add_u32(b->w, "general.file_type", llama_ftype(p->type, p->k_mixture)));
    TRY(pkv_mk_u32(b, "block_count", (uint32_t)(p->n_layer + p->n_mtp)));
    if (p->n_mtp) TRY(pkv_mk_u32(b, "nextn_predict_layers", (uint32_t)p->n_mtp));
    TRY(pkv_mk_u32(b, "context_length", (uint32_t)p->n_ctx));
    if (p->pooling) TRY(pkv_mk_u32(b, "pooling_type", (uint32_t)pooling_of(p->pooling)));
    if (pooling_of(p->pooling) == 4) {
        static const char *const labels[] = {"yes", "no"};
        static const size_t label_lens[] = {3, 2};
        char k[96];
        snprintf(k, sizeof k, "%s.classifier.output_labels", p->arch);
        TRY(pkv_gguf_writer_add_arr_str(b->w, k, labels, label_lens, 2));
    }
    TRY(pkv_mk_u32(b, "embedding_length", (uint32_t)b->E));
    if (mk->sizes) return mk->sizes(b);
    TRY(pkv_mk_u32(b, "feed_forward_length", (uint32_t)p->n_ff));
    TRY(pkv_mk_u32(b, "attention.head_count", (uint32_t)p->n_head));
    return pkv_mk_u32(b, "attention.head_count_kv", (uint32_t)p->n_head_kv);
}

/* The architecture's keys, then RoPE's and the norms'. */
static pkv_status mk_hparams(pkv_mk *b, const pkv_arch_mk *mk) {
    pkv_mkmodel_params *p = b->p;
    const target_of *tgt = b->tgt;
    if (mk->keys) TRY(mk->keys(b));
    else if (p->n_expert > 0) TRY(pkv_mk_expert_keys(b, p->n_ff));
    float rope_base = tgt->g ? tgt->rope_base : mk->rope_base;
    float rope_factor = tgt->g ? 1.0f / tgt->rope_freq_scale : mk->rope_factor ? mk->rope_factor : 1.0f;
    int yarn_orig = tgt->g ? tgt->yarn_orig : mk->rope_yarn ? PKV_MIN(256, p->n_ctx) : 0;
    if (rope_factor != 1.0f || yarn_orig) {
        TRY(pkv_gguf_writer_add_str(b->w, pkv_mk_key(b, "rope.scaling.type"), yarn_orig ? "yarn" : "linear"));
        TRY(pkv_mk_f32(b, "rope.scaling.factor", rope_factor));
    }
    if (yarn_orig) TRY(pkv_mk_u32(b, "rope.scaling.original_context_length", (uint32_t)yarn_orig));
    if (mk->own_head_keys) { /* written by its keys hook */
    } else if (p->head_dim * p->n_head != b->E || mk->head_keys) {
        TRY(pkv_mk_u32(b, "attention.key_length", (uint32_t)p->head_dim));
        TRY(pkv_mk_u32(b, "attention.value_length", (uint32_t)p->head_dim));
    }
    TRY(pkv_mk_f32(b, "rope.freq_base", rope_base));
    if (!mk->own_head_keys)
        TRY(pkv_mk_u32(b, "rope.dimension_count",
                       (uint32_t)(tgt->g ? tgt->n_rot : mk->rope_half ? p->head_dim / 2 : p->head_dim)));
    TRY(pkv_mk_f32(b, "attention.layer_norm_rms_epsilon", tgt->g ? tgt->rms_eps : mk->rms_eps));
    if (p->shared_kv_layers)
        TRY(pkv_gguf_writer_add_arr(b->w, "pagekv.shared_kv_layers", PKV_GGUF_INT32, p->shared_kv_layers,
                                    (uint64_t)p->n_layer));
    return PKV_OK;
}

/* The vocabulary: the target's (a draft), none, or the chat family's. */
static pkv_status mk_vocab(pkv_mk *b, const pkv_vocab_desc *voc, const chat_family *fam) {
    pkv_mkmodel_params *p = b->p;
    pkv_gguf_writer *w = b->w;
    const target_of *tgt = b->tgt;
    if (tgt->g) { /* the target's vocabulary, key by key */
        TRY(pkv_mk_u32(b, "vocab_size", (uint32_t)p->n_vocab));
        for (int64_t i = 0; i < pkv_gguf_n_kv(tgt->g); i++)
            if (!strncmp(pkv_gguf_kv_key(tgt->g, i), "tokenizer.", 10)) TRY(pkv_gguf_writer_copy_kv(w, tgt->g, i));
    } else if (p->no_vocab) {
        TRY(pkv_gguf_writer_add_str(w, "tokenizer.ggml.model", "none"));
        TRY(pkv_mk_u32(b, "vocab_size", (uint32_t)p->n_vocab));
    } else {
        TRY(pkv_gguf_writer_add_str(w, "tokenizer.ggml.model", voc->model));
        TRY(pkv_gguf_writer_add_str(w, "tokenizer.ggml.pre", voc->pre));
        TRY(pkv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", voc->tokens, voc->token_lens, (uint64_t)voc->n_tokens));
        if (voc->types)
            TRY(pkv_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", PKV_GGUF_INT32, voc->types, (uint64_t)voc->n_tokens));
        if (voc->n_merges)
            TRY(pkv_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", voc->merges, voc->merge_lens, (uint64_t)voc->n_merges));
        if (voc->bos_id >= 0) TRY(pkv_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)voc->bos_id));
        if (voc->eos_id >= 0) TRY(pkv_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)voc->eos_id));
        if (voc->eot_id >= 0) TRY(pkv_gguf_writer_add_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)voc->eot_id));
        if (voc->pad_id >= 0) TRY(pkv_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)voc->pad_id));
        TRY(pkv_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", voc->add_bos == 1));
        if (fam)
            TRY(pkv_gguf_writer_add_str(w, "tokenizer.chat_template",
                                        p->chat_template_text ? p->chat_template_text : fam->jinja));
        if (fam && pooling_of(p->pooling) == 4)
            TRY(pkv_gguf_writer_add_str(w, "tokenizer.chat_template.rerank", k_rerank_template));
    }
    return PKV_OK;
}

/* The tensors outside the layers. */
static pkv_status mk_globals(pkv_mk *b, const pkv_arch_mk *mk) {
    pkv_mkmodel_params *p = b->p;
    TRY(pkv_mk_add(b, "token_embd.weight", p->type, b->E, p->n_vocab, 0.0, 1.0));
    const char *on = pkv_arch_ops_find(p->arch)->output_norm; /* lfm2: its own name for the final norm */
    TRY(pkv_mk_add(b, on ? on : "output_norm.weight", PKV_TYPE_F32, b->E, 1, 1.0, 0.1));
    if (!p->tied) TRY(pkv_mk_add(b, "output.weight", pkv_mk_type(p, "output", 0), b->E, p->n_vocab, 0.0, 3.0 * b->lin_e));
    if (pooling_of(p->pooling) == 4) TRY(pkv_mk_add(b, "cls.output.weight", PKV_TYPE_F32, b->E, 2, 0.0, 3.0 * b->lin_e));
    return mk->globals ? mk->globals(b) : PKV_OK;
}
#undef TRY

static pkv_status build(pkv_mkmodel_params p, pkv_gguf_writer **out) {
    const pkv_arch_ops *ops = pkv_arch_ops_find(p.arch);
    if (ops && ops->mk && ops->mk->build) {
        if (p.pooling)
            return pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: pooling is not written for architecture '%s' (only the "
                                                "generic writer's: llama, qwen2, qwen3, ...)", p.arch);
        return ops->mk->build(p, out);
    }
    target_of tgt = {NULL, 0, 0, 0, 0, 0};
    pkv_gguf *tg = NULL;
    pkv_status s;
    if (p.draft_of) {
        if (p.chat_template || p.chat_template_text)
            return pkv_err(PKV_ERR_INVALID, "mkmodel: a draft takes its target's vocabulary and chat template: "
                                            "no chat_template with draft_of");
        if (!p.n_layer && p.shared_kv_layers) return pkv_err(PKV_ERR_INVALID, "mkmodel: shared_kv_layers needs n_layer");
        if ((s = pkv_gguf_read(p.draft_of, &tg))) return s;
        if (!p.n_layer) p.n_layer = 1;
        if ((s = read_target(&p, tg, &tgt))) {
            pkv_gguf_close(tg);
            return s;
        }
    }
    s = validate(&p);
    if (s) {
        pkv_gguf_close(tg);
        return s;
    }
    const pkv_arch_mk *mk = pkv_arch_ops_find(p.arch)->mk;
    pkv_mk b;
    memset(&b, 0, sizeof b);
    b.p = &p, b.tgt = &tgt;
    int64_t E = b.E = p.n_embd, qd = b.qd = (int64_t)p.n_head * p.head_dim, kd = b.kd = (int64_t)p.n_head_kv * p.head_dim;
    const int64_t PL = (int64_t)p.n_embd_per_layer * p.n_layer; /* per-layer embedding columns */
    size_t cap = (size_t)PKV_MAX(PKV_MAX(E * p.n_vocab, E * (qd + 2 * PKV_MAX(kd, (int64_t)p.n_head_kv_full * p.head_dim))),
                                 E * p.n_ff * PKV_MAX(2 * p.n_expert, 4));
    cap = PKV_MAX(cap, (size_t)(PL * PKV_MAX((int64_t)p.n_vocab, E)));
    /* latent attention: attn_k_b / attn_v_b [heads][kv_lora][head_dim], attn_q_b [qd][q_lora] */
    cap = PKV_MAX(cap, (size_t)PKV_MAX(qd * p.kv_lora_rank, qd * p.q_lora_rank));
    /* recurrent layers' input projections (a Mamba-2 ssm_in: z, x, B, C and dt rows) */
    cap = PKV_MAX(cap, (size_t)E * (size_t)(2 * (p.ssm_v_heads + p.ssm_k_heads) * PKV_MAX(p.ssm_head_dim, p.ssm_state) +
                                            p.ssm_v_heads));
    pkv_vocab_desc *voc = NULL;
    const chat_family *fam = p.chat_template ? find_family(p.chat_template) : NULL;
    if ((s = pkv_mk_begin(&b, p.seed, cap))) goto done;
    voc = p.no_vocab || tgt.g ? NULL : family_vocab(fam, p.extra_specials, p.n_vocab);
    if (voc && p.pre) voc->pre = p.pre;
    if (!p.no_vocab && !tgt.g && !voc) {
        s = pkv_err(PKV_ERR_NOMEM, "mkmodel: out of memory");
        goto done;
    }
    b.lin_e = sqrt(3.0 / (double)E), b.lin_q = sqrt(3.0 / (double)qd), b.lin_f = sqrt(3.0 / (double)p.n_ff);
    if ((s = mk_sizes(&b, mk)) || (s = mk_hparams(&b, mk)) || (s = mk_vocab(&b, voc, fam)) || (s = mk_globals(&b, mk)))
        goto done;
    for (int l = 0; l < p.n_layer + p.n_mtp; l++)
        if ((s = mk->layer(&b, l))) goto done;
done:
    pkv_vocab_builtin_free(voc);
    return pkv_mk_end(&b, tg, s, out);
}

pkv_status pkv_mkmodel_write(const pkv_mkmodel_params *p, const char *path) {
    if (!p || !path) return pkv_err(PKV_ERR_INVALID, "mkmodel: NULL argument");
    pkv_gguf_writer *w = NULL;
    pkv_status s = build(*p, &w);
    if (s) return s;
    s = pkv_gguf_writer_write(w, path);
    pkv_gguf_writer_free(w);
    return s;
}

pkv_status pkv_mkmodel_memory(const pkv_mkmodel_params *p, void **data, size_t *size) {
    if (!p || !data || !size) return pkv_err(PKV_ERR_INVALID, "mkmodel: NULL argument");
    pkv_gguf_writer *w = NULL;
    pkv_status s = build(*p, &w);
    if (s) return s;
    s = pkv_gguf_writer_write_memory(w, data, size);
    pkv_gguf_writer_free(w);
    return s;
}

void pkv_mkmodel_free_memory(void *data) { pkv_free(data); }

pkv_model *pkv_model_builtin(pkv_model_params p) {
    pkv_mkmodel_params mp = pkv_mkmodel_default_params();
    void *data = NULL;
    size_t size = 0;
    if (pkv_mkmodel_memory(&mp, &data, &size)) return NULL;
    pkv_model *m = pkv_model_load_memory(data, size, "builtin", p);
    pkv_mkmodel_free_memory(data);
    return m;
}
