/* Test models: GGUF files with random weights, written with the same key and
 * tensor names as llama.cpp's converters, so the loader path they exercise is the
 * one real files take. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/quant.h"
#include "chat/chat-families.h"
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

typedef struct {
    uint64_t s;
} rng;

static double urand(rng *r) { /* [-1, 1) from splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

typedef struct {
    pkv_gguf_writer *w;
    rng r;
    float *f;        /* scratch, f32 */
    void *q;         /* scratch, quantized */
    size_t cap;      /* elements */
} gen;

/* Add tensor [rows][cols] of `type` with values center + scale * U(-1, 1). */
static pkv_status add(gen *G, const char *name, pkv_type type, int64_t cols, int64_t rows, double center, double scale) {
    size_t n = (size_t)cols * (size_t)rows;
    if (n > G->cap) return pkv_err(PKV_ERR_INTERNAL, "mkmodel: tensor %s larger than scratch", name);
    for (size_t i = 0; i < n; i++) G->f[i] = (float)(center + scale * urand(&G->r));
    size_t row = pkv_type_row_bytes(type, (size_t)cols);
    if (!row)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: tensor %s: %lld columns is not a multiple of the %s block (%zu)", name,
                       (long long)cols, pkv_type_name(type), pkv_type_block_elems(type));
    for (int64_t r = 0; r < rows; r++) {
        pkv_status s = pkv_quantize_row(type, G->f + (size_t)r * (size_t)cols, (uint8_t *)G->q + (size_t)r * row, cols);
        if (s) return pkv_err_prefix(s, "mkmodel: tensor %s", name);
    }
    int64_t ne[2] = {cols, rows};
    return pkv_gguf_writer_add_tensor(G->w, name, type, rows > 1 ? 2 : 1, ne, G->q, row * (size_t)rows);
}

/* Add a 3-D tensor of n matrices [rows][cols] (experts), values scale * U(-1, 1). */
static pkv_status add3(gen *G, const char *name, pkv_type type, int64_t cols, int64_t rows, int64_t n, double scale) {
    size_t count = (size_t)cols * (size_t)rows * (size_t)n;
    if (count > G->cap) return pkv_err(PKV_ERR_INTERNAL, "mkmodel: tensor %s larger than scratch", name);
    for (size_t i = 0; i < count; i++) G->f[i] = (float)(scale * urand(&G->r));
    size_t row = pkv_type_row_bytes(type, (size_t)cols);
    if (!row)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: tensor %s: %lld columns is not a multiple of the %s block (%zu)", name,
                       (long long)cols, pkv_type_name(type), pkv_type_block_elems(type));
    for (int64_t r = 0; r < rows * n; r++) {
        pkv_status s = pkv_quantize_row(type, G->f + (size_t)r * (size_t)cols, (uint8_t *)G->q + (size_t)r * row, cols);
        if (s) return pkv_err_prefix(s, "mkmodel: tensor %s", name);
    }
    int64_t ne[3] = {cols, rows, n};
    return pkv_gguf_writer_add_tensor(G->w, name, type, 3, ne, G->q, row * (size_t)(rows * n));
}

/* The type of a matrix: p->type, or in a mixture (k_mixture) like the ones
 * llama-quantize writes (Q4_K_M, Q3_K_M, IQ3_M, ...): q6_k for the output
 * matrix; for attn_v and ffn_down of every other layer q6_k when the base type
 * is q4_k (as published Q4_K_M files), else q4_k; with other base types also
 * q5_k for attn_k of the odd layers, so that one file holds four or five types.
 * (llama.cpp's exact per-layer choice differs; the point is files of several
 * types.) */
static pkv_type mtype(const pkv_mkmodel_params *p, const char *what, int layer) {
    if (!p->k_mixture) return p->type;
    if (!strcmp(what, "output")) return PKV_TYPE_Q6_K;
    const bool q4 = p->type == PKV_TYPE_Q4_K;
    if ((!strcmp(what, "attn_v") || !strcmp(what, "ffn_down")) && layer % 2 == 0) return q4 ? PKV_TYPE_Q6_K : PKV_TYPE_Q4_K;
    if (!q4 && !strcmp(what, "attn_k") && layer % 2 == 1) return PKV_TYPE_Q5_K;
    return p->type;
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

static pkv_status validate(pkv_mkmodel_params *p) {
    if (!p->arch) p->arch = "llama";
    bool known = false;
    for (int a = 0; a < PKV_ARCH_COUNT; a++) known = known || !strcmp(p->arch, pkv_arch_name((pkv_arch)a));
    if (!known)
        return pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: architecture '%s' is not supported (%s)", p->arch, pkv_arch_list());
    const bool oss = !strcmp(p->arch, "gpt-oss"), g4 = !strcmp(p->arch, "gemma4");
    if (!strcmp(p->arch, "gemma2") || !strcmp(p->arch, "gemma3") || g4 || oss) {
        if (!p->sliding_window) p->sliding_window = 8;
        if (!oss) p->tied = true; /* Gemma files have no output.weight */
    } else if (p->sliding_window) {
        return pkv_err(PKV_ERR_INVALID, "mkmodel: a sliding window is for gemma2, gemma3, gemma4 and gpt-oss, not %s", p->arch);
    }
    if (!g4 && (p->head_dim_swa || p->n_head_kv_full || p->n_embd_per_layer || p->n_shared_kv || p->swa_layers))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: sliding head sizes, full-layer KV heads, per-layer embeddings, shared KV "
                       "layers and a sliding pattern are for gemma4, not %s", p->arch);
    if (g4) {
        if (!p->n_layer) p->n_layer = p->swa_layers ? (int)strlen(p->swa_layers) : 6;
        /* 8 heads: KV heads 4 (sliding) and 2 (full), so the test shape splits over two devices */
        if (!p->n_head) p->n_head = 8;
        if (!p->head_dim) p->head_dim = 64;
        /* rows of the weight type's blocks: the sliding heads and per-layer embeddings too */
        const int blk = (int)pkv_type_block_elems(p->type);
        if (!p->head_dim_swa) p->head_dim_swa = blk && (p->n_head * p->head_dim / 2) % blk ? p->head_dim : p->head_dim / 2;
        if (!p->n_head_kv_full) p->n_head_kv_full = p->n_head >= 4 ? p->n_head / 4 : 1;
        if (!p->n_embd_per_layer) p->n_embd_per_layer = blk > 16 ? blk : 16;
        if (p->n_embd_per_layer < 0) p->n_embd_per_layer = 0;
        if (!p->n_shared_kv) p->n_shared_kv = 2;
        if (p->n_shared_kv < 0) p->n_shared_kv = 0;
        const int L = p->n_layer, Lkv = L - p->n_shared_kv;
        if (p->head_dim_swa < 2 || p->head_dim_swa % 2 || p->n_embd_per_layer > 4096)
            return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: sliding head size %d (even, >= 2), per-layer embedding size %d "
                           "(<= 4096)", p->head_dim_swa, p->n_embd_per_layer);
        if (p->swa_layers && (int)strlen(p->swa_layers) != L)
            return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: the sliding pattern '%s' has %zu layers, the model %d",
                           p->swa_layers, strlen(p->swa_layers), L);
        for (int l = 0; p->swa_layers && l < L; l++)
            if (p->swa_layers[l] != 's' && p->swa_layers[l] != 'f')
                return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: sliding pattern '%s': one 's' (sliding) or 'f' (full) per "
                               "layer", p->swa_layers);
        /* what the loader checks (model-load.c: share_kv), refused here before a file is written */
        if (p->n_shared_kv > 0 && (Lkv < 2 || (p->swa_layers && (p->swa_layers[Lkv - 1] != 'f' || p->swa_layers[Lkv - 2] != 's'))))
            return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4: %d shared KV layers of %d leave %d with KV of their own, the last "
                           "two of which (%d, %d) must be sliding and full", p->n_shared_kv, L, Lkv, Lkv - 2, Lkv - 1);
    }
    if (p->sliding_window < 0) return pkv_err(PKV_ERR_INVALID, "mkmodel: sliding window %d", p->sliding_window);
    /* gemma4: experts optional (0: dense), beside each layer's dense FFN */
    bool moe = !strcmp(p->arch, "qwen3moe") || oss || (g4 && (p->n_expert || p->n_expert_used));
    if (!moe && (p->n_expert || p->n_expert_used))
        return pkv_err(PKV_ERR_INVALID,
                       "mkmodel: experts are for a mixture-of-experts architecture (qwen3moe, gpt-oss, gemma4), not %s", p->arch);
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
    const bool q35 = !strcmp(p->arch, "qwen35");
    if (!p->n_layer) p->n_layer = q35 ? 4 : 2; /* qwen35: three delta-net layers and one attention layer */
    if (!q35 && (p->ssm_v_heads || p->ssm_k_heads || p->ssm_head_dim))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: delta-net sizes are for qwen35, not %s", p->arch);
    if (q35) {
        if (!p->ssm_v_heads) p->ssm_v_heads = 4;
        if (!p->ssm_k_heads) p->ssm_k_heads = p->ssm_v_heads >= 2 ? 2 : 1;
        /* k-quant rows are blocks of 256: the output projection's rows too */
        if (!p->ssm_head_dim) p->ssm_head_dim = pkv_type_block_elems(p->type) == 256 ? 256 / p->ssm_v_heads : 16;
        if (p->ssm_v_heads < 1 || p->ssm_k_heads < 1 || p->ssm_v_heads % p->ssm_k_heads || p->ssm_head_dim < 1 ||
            p->ssm_head_dim > 256 || p->n_layer > 64)
            return pkv_err(PKV_ERR_INVALID, "mkmodel: qwen35 needs value heads a multiple of key heads, a head size of 1 "
                           "to 256 and at most 64 layers");
    }
    if (p->n_mtp && (!q35 || p->n_mtp < 0 || p->n_mtp > 4))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: MTP layers (0 to 4) are for qwen35, not %s", p->arch);
    if (q35 && (p->head_dim ? p->head_dim : p->n_embd / (p->n_head ? p->n_head : 4)) % 4)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: qwen35 rotates half of each head in pairs of sections: the head size must be a "
                       "multiple of 4");
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
    int64_t cols[4] = {p->n_embd, (int64_t)p->n_head * p->head_dim, p->n_ff, (int64_t)p->ssm_v_heads * p->ssm_head_dim};
    for (int i = 0; i < (q35 ? 4 : 3); i++)
        if (cols[i] % (int64_t)blk)
            return pkv_err(PKV_ERR_INVALID, "mkmodel: type %s needs row lengths that are multiples of %zu: %s is %lld",
                           pkv_type_name(p->type), blk,
                           i == 0 ? "--dim" : i == 1 ? "--heads x --head-dim" : i == 2 ? "--ffn" : "value heads x head size",
                           (long long)cols[i]);
    if (!strcmp(p->arch, "gemma4") && (((int64_t)p->n_head * p->head_dim_swa) % (int64_t)blk || p->n_embd_per_layer % (int64_t)blk))
        return pkv_err(PKV_ERR_INVALID, "mkmodel: type %s needs row lengths that are multiples of %zu: --heads x --head-dim-swa "
                       "is %lld, --per-layer-embd %d", pkv_type_name(p->type), blk, (long long)p->n_head * p->head_dim_swa,
                       p->n_embd_per_layer);
    return PKV_OK;
}

/* Settings a draft takes over from its target (--draft-of). */
typedef struct {
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
    p->n_expert = hp.n_expert; /* a draft of a MoE model is one too */
    p->n_expert_used = hp.n_expert_used;
    p->n_ctx = hp.n_ctx_train;
    p->sliding_window = hp.n_swa; /* gemma: the target's window (0 elsewhere) */
    if (hp.arch == PKV_ARCH_GEMMA4) { /* its sliding and full layers' shapes; no KV sharing, the last layer full */
        int ls = -1, lf = -1;
        for (int l = 0; l < hp.n_layer; l++) {
            bool sl = hp.swa_layers[l / 64] >> (l % 64) & 1;
            if (sl && ls < 0) ls = l;
            if (!sl && lf < 0) lf = l;
        }
        p->n_head = nh[lf >= 0 ? lf : ls];
        p->n_head_kv = nkv[ls >= 0 ? ls : lf];
        p->n_head_kv_full = nkv[lf >= 0 ? lf : ls];
        p->head_dim_swa = hp.head_dim_k_swa;
        p->n_embd_per_layer = hp.n_embd_per_layer ? hp.n_embd_per_layer : -1;
        p->n_shared_kv = -1;
    }
    const char *tm;
    size_t tml;
    p->no_vocab = pkv_gguf_get_str(g, "tokenizer.ggml.model", &tm, &tml) || (tml == 4 && !memcmp(tm, "none", 4));
    const pkv_gguf_tensor *te = pkv_gguf_find_tensor(g, "token_embd.weight");
    if (!te) s = pkv_err(PKV_ERR_FORMAT, "mkmodel: %s: tensor 'token_embd.weight' not found", pkv_gguf_label(g));
    else p->n_vocab = (int)te->ne[1];
    if (!s && hp.head_dim_k != hp.head_dim_v)
        s = pkv_err(PKV_ERR_UNSUPPORTED, "mkmodel: %s: K and V head sizes differ (%d, %d)", pkv_gguf_label(g), hp.head_dim_k,
                    hp.head_dim_v);
    t->g = g;
    t->rope_base = hp.rope_base;
    t->rope_freq_scale = hp.rope_freq_scale;
    t->rms_eps = hp.rms_eps;
    t->n_rot = hp.n_rot;
    t->yarn_orig = hp.rope_ext_factor != 0 ? hp.rope_n_ctx_orig : 0;
    pkv_free(nh);
    pkv_free(nkv);
    pkv_free(nff);
    return s;
}

/* The end of a build: the target and the scratch freed; the writer to *out, or
 * freed when s is an error. Returns s. */
static pkv_status build_end(gen *G, pkv_gguf *tg, pkv_status s, pkv_gguf_writer **out) {
    pkv_gguf_close(tg);
    pkv_free(G->f);
    pkv_free(G->q);
    if (s) {
        pkv_gguf_writer_free(G->w);
        return s;
    }
    *out = G->w;
    return PKV_OK;
}

/* gemma4-assistant (draft_of a gemma4 target): the file llama.cpp's converter writes
 * for a Gemma 4 assistant checkpoint, with random weights. Width n_embd (0 = half the
 * target's), n_layer layers (0 = 4; swa_layers, or every layer sliding but the last),
 * n_head query heads (0 = the target's full layers'), n_ff (0 = 2 n_embd); each layer's
 * KV heads and head size are those of the target layer it reads (its last sliding /
 * full layer), RoPE and norms the target's, rope_freqs.weight copied from it. */
static pkv_status build_assistant(pkv_mkmodel_params p, pkv_gguf_writer **out) {
    if (!p.draft_of)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: a gemma4-assistant drafts for a gemma4 model: give its target (draft_of)");
    if (p.chat_template || p.no_vocab || p.shared_kv_layers || p.n_expert || p.n_mtp)
        return pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4-assistant: chat_template, no_vocab, shared_kv_layers, experts and MTP "
                       "layers do not apply (it takes its target's vocabulary and reads its target's KV)");
    pkv_gguf *tg = NULL;
    pkv_status s = pkv_gguf_read(p.draft_of, &tg);
    if (s) return s;
    pkv_hparams hp;
    int *nh = NULL, *nkv = NULL, *nff = NULL;
    gen G;
    memset(&G, 0, sizeof G);
    if ((s = pkv_hparams_read(tg, &hp, &nh, &nkv, &nff))) goto done;
    if (hp.arch != PKV_ARCH_GEMMA4) {
        s = pkv_err(PKV_ERR_INVALID, "mkmodel: %s is a %s model: a gemma4-assistant drafts for a gemma4 model", p.draft_of,
                    pkv_arch_name(hp.arch));
        goto done;
    }
#define SLIDES(l) (hp.swa_layers[(l) / 64] >> ((l) % 64) & 1)
    const int TL = hp.n_layer, Lkv = TL - hp.n_shared_kv;
    if (TL < 2 || !SLIDES(TL - 2) || SLIDES(TL - 1) || Lkv < 2) {
        s = pkv_err(PKV_ERR_INVALID, "mkmodel: %s's last two layers must be sliding then full (the assistant reads their KV)",
                    p.draft_of);
        goto done;
    }
    const int ksw = hp.n_shared_kv ? Lkv - 2 : TL - 2, kfu = hp.n_shared_kv ? Lkv - 1 : TL - 1; /* the KV they own */
    const pkv_gguf_tensor *te = pkv_gguf_find_tensor(tg, "token_embd.weight"), *rf = pkv_gguf_find_tensor(tg, "rope_freqs.weight");
    if (!te || !rf || rf->type != PKV_TYPE_F32) {
        s = pkv_err(PKV_ERR_FORMAT, "mkmodel: %s: no token_embd.weight or f32 rope_freqs.weight", p.draft_of);
        goto done;
    }
    const int64_t Eb = hp.n_embd, V = te->ne[1];
    const int64_t E = p.n_embd ? p.n_embd : Eb / 2, L = p.n_layer ? p.n_layer : 4, H = p.n_head ? p.n_head : nh[TL - 1];
    const int64_t F = p.n_ff ? p.n_ff : 2 * E, Dfull = hp.head_dim_k, Dswa = hp.head_dim_k_swa;
    if (E == Eb || L > 256 || (p.swa_layers && (int64_t)strlen(p.swa_layers) != L) || H % nkv[ksw] || H % nkv[kfu]) {
        s = pkv_err(PKV_ERR_INVALID, "mkmodel: gemma4-assistant: width %lld must differ from the target's %lld, at most 256 "
                    "layers, swa_layers one letter per layer, %lld heads a multiple of the target's KV heads (%d, %d)",
                    (long long)E, (long long)Eb, (long long)H, nkv[ksw], nkv[kfu]);
        goto done;
    }
    bool slides[256];
    for (int64_t l = 0; l < L; l++) slides[l] = p.swa_layers ? p.swa_layers[l] == 's' : l < L - 1;
    G.r.s = p.seed ? p.seed : 1;
    G.cap = (size_t)PKV_MAX(PKV_MAX(E * V, 2 * Eb * E), PKV_MAX(E * H * PKV_MAX(Dfull, Dswa), E * F));
    G.f = pkv_malloc(G.cap * sizeof(float));
    G.q = pkv_malloc(G.cap * sizeof(float));
    G.w = pkv_gguf_writer_create();
    if (!G.f || !G.q || !G.w) {
        s = pkv_err(PKV_ERR_NOMEM, "mkmodel: out of memory");
        goto done;
    }
    const char *a = "gemma4-assistant";
    char k[96];
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", a, suffix), k)
#define TRY(x)                                                                                      \
    do {                                                                                            \
        if ((s = (x))) goto done;                                                                   \
    } while (0)
    TRY(pkv_gguf_writer_add_str(G.w, "general.architecture", a));
    TRY(pkv_gguf_writer_add_str(G.w, "general.name", "pagekv random test assistant"));
    TRY(pkv_gguf_writer_add_u32(G.w, "general.file_type", p.type == PKV_TYPE_F32 ? 0 : p.type == PKV_TYPE_BF16 ? 32 : 1));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("block_count"), (uint32_t)L));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("nextn_predict_layers"), (uint32_t)L));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("context_length"), (uint32_t)hp.n_ctx_train));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("embedding_length"), (uint32_t)E));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("embedding_length_out"), (uint32_t)Eb));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("feed_forward_length"), (uint32_t)F));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("attention.head_count"), (uint32_t)H));
    {
        int32_t kv[256];
        uint8_t pat[256];
        for (int64_t l = 0; l < L; l++) kv[l] = nkv[slides[l] ? ksw : kfu], pat[l] = slides[l];
        TRY(pkv_gguf_writer_add_arr(G.w, KEY("attention.head_count_kv"), PKV_GGUF_INT32, kv, (uint64_t)L));
        TRY(pkv_gguf_writer_add_arr(G.w, KEY("attention.sliding_window_pattern"), PKV_GGUF_BOOL, pat, (uint64_t)L));
    }
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("attention.key_length"), (uint32_t)Dfull));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("attention.value_length"), (uint32_t)Dfull));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("attention.key_length_swa"), (uint32_t)Dswa));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("attention.value_length_swa"), (uint32_t)Dswa));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("rope.dimension_count"), (uint32_t)hp.n_rot));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("rope.dimension_count_swa"), (uint32_t)hp.n_rot_swa));
    TRY(pkv_gguf_writer_add_f32(G.w, KEY("rope.freq_base"), hp.rope_base));
    TRY(pkv_gguf_writer_add_f32(G.w, KEY("rope.freq_base_swa"), hp.rope_base_swa));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("attention.sliding_window"), (uint32_t)hp.n_swa));
    TRY(pkv_gguf_writer_add_f32(G.w, KEY("attention.layer_norm_rms_epsilon"), hp.rms_eps));
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("attention.shared_kv_layers"), 0)); /* read by llama.cpp, unused */
    TRY(pkv_gguf_writer_add_u32(G.w, KEY("vocab_size"), (uint32_t)V));
    for (int64_t i = 0; i < pkv_gguf_n_kv(tg); i++)
        if (!strncmp(pkv_gguf_kv_key(tg, i), "tokenizer.", 10)) TRY(pkv_gguf_writer_copy_kv(G.w, tg, i));
    const double lin_e = sqrt(3.0 / (double)E);
    TRY(add(&G, "token_embd.weight", p.type, E, V, 0.0, 1.0));
    TRY(add(&G, "output_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1));
    TRY(add(&G, "nextn.pre_projection.weight", p.type, 2 * Eb, E, 0.0, sqrt(3.0 / (double)(2 * Eb))));
    TRY(add(&G, "nextn.post_projection.weight", p.type, E, Eb, 0.0, 3.0 * lin_e));
    {
        int64_t ne[1] = {rf->ne[0]};
        TRY(pkv_gguf_writer_add_tensor(G.w, "rope_freqs.weight", PKV_TYPE_F32, 1, ne, rf->data, (size_t)rf->ne[0] * 4));
    }
    for (int64_t l = 0; l < L; l++) {
        char n[96];
#define T(suffix, type, cols, rows, c, sc) \
    TRY((snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, suffix), add(&G, n, type, cols, rows, c, sc)))
        const int64_t D = slides[l] ? Dswa : Dfull, lq = H * D;
        T("attn_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("attn_q.weight", p.type, E, lq, 0.0, lin_e);
        T("attn_q_norm.weight", PKV_TYPE_F32, D, 1, 1.0, 0.1);
        T("attn_output.weight", p.type, lq, E, 0.0, sqrt(3.0 / (double)lq));
        T("post_attention_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("ffn_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("ffn_gate.weight", p.type, E, F, 0.0, lin_e);
        T("ffn_up.weight", p.type, E, F, 0.0, lin_e);
        T("ffn_down.weight", p.type, F, E, 0.0, sqrt(3.0 / (double)F));
        T("post_ffw_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("layer_output_scale.weight", PKV_TYPE_F32, 1, 1, 1.0, 0.5);
#undef T
    }
#undef KEY
#undef TRY
#undef SLIDES
done:
    pkv_free(nh);
    pkv_free(nkv);
    pkv_free(nff);
    return build_end(&G, tg, s, out);
}

/* What build() writes from: the params (completed by validate), the writer and
 * its scratch, and the architecture's traits, read once from p->arch. */
typedef struct mkb {
    pkv_mkmodel_params *p;
    gen *G;
    const target_of *tgt; /* a draft's target (tgt->g NULL: none) */
    pkv_vocab_desc *voc;  /* NULL with no_vocab or a target */
    const chat_family *fam;
    const char *a; /* p->arch */
    bool gemma3, gemma, g4, oss, qwen, phi3, q35, moe, qk_norm;
    bool slides[256]; /* gemma4: which layers slide */
    int Lkv;          /* gemma4: the layers that own KV */
    int64_t E, qd, kd, PL, Hk, Hv, dS, C;
    double lin_e, lin_q, lin_f; /* uniform ranges that keep activations sane */
    char k[96];
} mkb;

#define KEY(suffix) (snprintf(b->k, sizeof b->k, "%s.%s", a, suffix), b->k)
#define TRY(x)                                                                                      \
    do {                                                                                            \
        pkv_status s_ = (x);                                                                        \
        if (s_) return s_;                                                                          \
    } while (0)
/* gemma4: the sharing layers' FFN is twice as wide; the sliding layers' heads and KV heads */
#define G4_FF(l) (b->g4 && (l) >= b->Lkv ? 2 * p->n_ff : p->n_ff)
#define G4_HD(l) (b->g4 && b->slides[l] ? p->head_dim_swa : p->head_dim)
#define G4_KV(l) (b->g4 && !b->slides[l] ? p->n_head_kv_full : p->n_head_kv)
#define T(suffix, type, cols, rows, c, sc) TRY((snprintf(n, sizeof n, "blk.%d.%s", l, suffix), add(G, n, type, cols, rows, c, sc)))
#define T3(suffix, type, cols, rows, sc) \
    TRY((snprintf(n, sizeof n, "blk.%d.%s", l, suffix), add3(G, n, type, cols, rows, p->n_expert, sc)))

/* The general keys and the sizes (gemma4's per-layer ones). */
static pkv_status mk_sizes(mkb *b) {
    pkv_mkmodel_params *p = b->p;
    gen *G = b->G;
    const char *a = b->a;
    const int64_t E = b->E;
    const bool g4 = b->g4;
    TRY(pkv_gguf_writer_add_str(G->w, "general.architecture", a));
    TRY(pkv_gguf_writer_add_str(G->w, "general.name", "pagekv random test model"));
    /* general.file_type uses llama.cpp's file-type ids, not tensor types: only
     * the ones this writer can make */
    uint32_t ftype = llama_ftype(p->type, p->k_mixture);
    TRY(pkv_gguf_writer_add_u32(G->w, "general.file_type", ftype));
    TRY(pkv_gguf_writer_add_u32(G->w, KEY("block_count"), (uint32_t)(p->n_layer + p->n_mtp)));
    if (p->n_mtp) TRY(pkv_gguf_writer_add_u32(G->w, KEY("nextn_predict_layers"), (uint32_t)p->n_mtp));
    TRY(pkv_gguf_writer_add_u32(G->w, KEY("context_length"), (uint32_t)p->n_ctx));
    TRY(pkv_gguf_writer_add_u32(G->w, KEY("embedding_length"), (uint32_t)E));
    if (g4 && p->n_shared_kv > 0) { /* llama.cpp's keys: per-layer arrays where the layers differ */
        int32_t ff[256];
        for (int l = 0; l < p->n_layer; l++) ff[l] = G4_FF(l);
        TRY(pkv_gguf_writer_add_arr(G->w, KEY("feed_forward_length"), PKV_GGUF_INT32, ff, (uint64_t)p->n_layer));
    } else {
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("feed_forward_length"), (uint32_t)p->n_ff));
    }
    TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.head_count"), (uint32_t)p->n_head));
    if (g4 && p->n_head_kv_full != p->n_head_kv) {
        int32_t kv[256];
        for (int l = 0; l < p->n_layer; l++) kv[l] = G4_KV(l);
        TRY(pkv_gguf_writer_add_arr(G->w, KEY("attention.head_count_kv"), PKV_GGUF_INT32, kv, (uint64_t)p->n_layer));
    } else {
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv));
    }
    if (g4) { /* Gemma 4's keys, as its converter writes them */
        uint8_t pat[256];
        for (int l = 0; l < p->n_layer; l++) pat[l] = b->slides[l];
        TRY(pkv_gguf_writer_add_arr(G->w, KEY("attention.sliding_window_pattern"), PKV_GGUF_BOOL, pat, (uint64_t)p->n_layer));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.key_length_swa"), (uint32_t)p->head_dim_swa));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.value_length_swa"), (uint32_t)p->head_dim_swa));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("rope.dimension_count_swa"), (uint32_t)p->head_dim_swa));
        TRY(pkv_gguf_writer_add_f32(G->w, KEY("rope.freq_base_swa"), 10000.0f));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.shared_kv_layers"), (uint32_t)p->n_shared_kv));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("embedding_length_per_layer_input"), (uint32_t)p->n_embd_per_layer));
        TRY(pkv_gguf_writer_add_f32(G->w, KEY("final_logit_softcapping"), 30.0f));
    }
    return PKV_OK;
}

/* Experts, delta-net layers, windows, soft-caps, RoPE and norms. */
static pkv_status mk_hparams(mkb *b) {
    pkv_mkmodel_params *p = b->p;
    gen *G = b->G;
    const char *a = b->a;
    const int64_t E = b->E;
    const target_of *tgt = b->tgt;
    const bool gemma = b->gemma, gemma3 = b->gemma3, g4 = b->g4, oss = b->oss, qwen = b->qwen, q35 = b->q35;
    const int64_t Hk = b->Hk, Hv = b->Hv, dS = b->dS;
    if (b->moe) { /* llama.cpp's keys */
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("expert_count"), (uint32_t)p->n_expert));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("expert_used_count"), (uint32_t)p->n_expert_used));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("expert_feed_forward_length"), (uint32_t)(g4 ? p->n_ff / 2 : p->n_ff)));
    }
    if (q35) { /* llama.cpp's keys: every 4th layer attends, the others are delta-net layers */
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("ssm.conv_kernel"), 4));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("ssm.state_size"), (uint32_t)dS));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("ssm.group_count"), (uint32_t)Hk));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("ssm.time_step_rank"), (uint32_t)Hv));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("ssm.inner_size"), (uint32_t)(Hv * dS)));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("full_attention_interval"), 4));
        uint8_t recr[64 + 4];
        for (int l = 0; l < p->n_layer + p->n_mtp; l++) recr[l] = l < p->n_layer && (l + 1) % 4 != 0;
        TRY(pkv_gguf_writer_add_arr(G->w, KEY("attention.recurrent_layers"), PKV_GGUF_BOOL, recr,
                                    (uint64_t)(p->n_layer + p->n_mtp)));
        /* M-RoPE sections over half the head (Qwen3.5 rotates a quarter), so every pair
         * takes the text position: [ceil, mid, floor] thirds of the pairs, and 0 */
        int32_t P = p->head_dim / 4, sec[4] = {(P + 2) / 3, (P + 1) / 3, P / 3, 0};
        TRY(pkv_gguf_writer_add_arr(G->w, KEY("rope.dimension_sections"), PKV_GGUF_INT32, sec, 4));
    }
    if (gemma || g4 || oss) /* the window: small here, so tests cross it */
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.sliding_window"), (uint32_t)p->sliding_window));
    if (gemma && !gemma3) { /* Gemma 2's soft-caps (Gemma 3 has none) */
        TRY(pkv_gguf_writer_add_f32(G->w, KEY("attn_logit_softcapping"), 50.0f));
        TRY(pkv_gguf_writer_add_f32(G->w, KEY("final_logit_softcapping"), 30.0f));
    }
    /* Gemma 3's global layers: base 1e6 and linear scaling by 8 as the 4B-27B files
     * have them (here by 4: any factor but 1 shows whether the scaling is applied,
     * and to the global layers only) */
    /* gpt-oss: base 150000 and YaRN as its files have them (factor 32 over 4096
     * positions), here factor 4 over 256, so tests' positions pass the original context */
    float rope_base = tgt->g ? tgt->rope_base : oss ? 150000.0f : qwen || gemma3 || g4 ? 1000000.0f : 10000.0f;
    float rope_factor = tgt->g ? 1.0f / tgt->rope_freq_scale : gemma3 || oss ? 4.0f : 1.0f;
    int yarn_orig = tgt->g ? tgt->yarn_orig : oss ? PKV_MIN(256, p->n_ctx) : 0;
    if (rope_factor != 1.0f || yarn_orig) {
        TRY(pkv_gguf_writer_add_str(G->w, KEY("rope.scaling.type"), yarn_orig ? "yarn" : "linear"));
        TRY(pkv_gguf_writer_add_f32(G->w, KEY("rope.scaling.factor"), rope_factor));
    }
    if (yarn_orig) TRY(pkv_gguf_writer_add_u32(G->w, KEY("rope.scaling.original_context_length"), (uint32_t)yarn_orig));
    if (p->head_dim * p->n_head != E || b->qk_norm || gemma || g4 || oss) {
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.key_length"), (uint32_t)p->head_dim));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("attention.value_length"), (uint32_t)p->head_dim));
    }
    TRY(pkv_gguf_writer_add_f32(G->w, KEY("rope.freq_base"), rope_base));
    TRY(pkv_gguf_writer_add_u32(G->w, KEY("rope.dimension_count"), (uint32_t)(tgt->g ? tgt->n_rot : q35 ? p->head_dim / 2 : p->head_dim)));
    TRY(pkv_gguf_writer_add_f32(G->w, KEY("attention.layer_norm_rms_epsilon"), tgt->g ? tgt->rms_eps : qwen || gemma || g4 ? 1e-6f : 1e-5f));
    if (p->shared_kv_layers)
        TRY(pkv_gguf_writer_add_arr(G->w, "pagekv.shared_kv_layers", PKV_GGUF_INT32, p->shared_kv_layers, (uint64_t)p->n_layer));
    return PKV_OK;
}

/* The vocabulary: the target's (a draft), none, or the chat family's. */
static pkv_status mk_vocab(mkb *b) {
    pkv_mkmodel_params *p = b->p;
    gen *G = b->G;
    const char *a = b->a;
    const target_of *tgt = b->tgt;
    const pkv_vocab_desc *voc = b->voc;
    const chat_family *fam = b->fam;
    if (tgt->g) { /* the target's vocabulary, key by key */
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("vocab_size"), (uint32_t)p->n_vocab));
        for (int64_t i = 0; i < pkv_gguf_n_kv(tgt->g); i++)
            if (!strncmp(pkv_gguf_kv_key(tgt->g, i), "tokenizer.", 10)) TRY(pkv_gguf_writer_copy_kv(G->w, tgt->g, i));
    } else if (p->no_vocab) {
        TRY(pkv_gguf_writer_add_str(G->w, "tokenizer.ggml.model", "none"));
        TRY(pkv_gguf_writer_add_u32(G->w, KEY("vocab_size"), (uint32_t)p->n_vocab));
    } else {
        TRY(pkv_gguf_writer_add_str(G->w, "tokenizer.ggml.model", voc->model));
        TRY(pkv_gguf_writer_add_str(G->w, "tokenizer.ggml.pre", voc->pre));
        TRY(pkv_gguf_writer_add_arr_str(G->w, "tokenizer.ggml.tokens", voc->tokens, voc->token_lens, (uint64_t)voc->n_tokens));
        if (voc->types)
            TRY(pkv_gguf_writer_add_arr(G->w, "tokenizer.ggml.token_type", PKV_GGUF_INT32, voc->types, (uint64_t)voc->n_tokens));
        if (voc->n_merges)
            TRY(pkv_gguf_writer_add_arr_str(G->w, "tokenizer.ggml.merges", voc->merges, voc->merge_lens, (uint64_t)voc->n_merges));
        if (voc->bos_id >= 0) TRY(pkv_gguf_writer_add_u32(G->w, "tokenizer.ggml.bos_token_id", (uint32_t)voc->bos_id));
        if (voc->eos_id >= 0) TRY(pkv_gguf_writer_add_u32(G->w, "tokenizer.ggml.eos_token_id", (uint32_t)voc->eos_id));
        if (voc->eot_id >= 0) TRY(pkv_gguf_writer_add_u32(G->w, "tokenizer.ggml.eot_token_id", (uint32_t)voc->eot_id));
        if (voc->pad_id >= 0)
            TRY(pkv_gguf_writer_add_u32(G->w, "tokenizer.ggml.padding_token_id", (uint32_t)voc->pad_id));
        TRY(pkv_gguf_writer_add_bool(G->w, "tokenizer.ggml.add_bos_token", voc->add_bos == 1));
        if (fam)
            TRY(pkv_gguf_writer_add_str(G->w, "tokenizer.chat_template",
                                        p->chat_template_text ? p->chat_template_text : fam->jinja));
    }
    return PKV_OK;
}

/* The tensors outside the layers. */
static pkv_status mk_globals(mkb *b) {
    pkv_mkmodel_params *p = b->p;
    gen *G = b->G;
    const int64_t E = b->E;
    const int64_t PL = b->PL;
    const bool g4 = b->g4;
    const double lin_e = b->lin_e;
    TRY(add(G, "token_embd.weight", p->type, E, p->n_vocab, 0.0, 1.0));
    TRY(add(G, "output_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1));
    if (!p->tied) TRY(add(G, "output.weight", mtype(p, "output", 0), E, p->n_vocab, 0.0, 3.0 * lin_e));
    if (g4) { /* proportional RoPE: a quarter of the full layers' pairs turn (partial_rotary_factor 0.25) */
        const int half = p->head_dim / 2, turn = PKV_MAX(1, p->head_dim / 8);
        for (int i = 0; i < half; i++) G->f[i] = i < turn ? 1.0f : 1e30f;
        int64_t ne[1] = {half};
        TRY(pkv_gguf_writer_add_tensor(G->w, "rope_freqs.weight", PKV_TYPE_F32, 1, ne, G->f, (size_t)half * 4));
    }
    if (g4 && PL) { /* per-layer embeddings: a second token table, the embedding's projection and its norm */
        TRY(add(G, "per_layer_token_embd.weight", p->type, PL, p->n_vocab, 0.0, 1.0));
        TRY(add(G, "per_layer_model_proj.weight", p->type, E, PL, 0.0, lin_e));
        TRY(add(G, "per_layer_proj_norm.weight", PKV_TYPE_F32, p->n_embd_per_layer, 1, 1.0, 0.1));
    }
    return PKV_OK;
}

/* A Gemma 4 layer, llama.cpp's tensors. */
static pkv_status mk_gemma4_layer(mkb *b, int l) {
    pkv_mkmodel_params *p = b->p;
    gen *G = b->G;
    const int64_t E = b->E;
    const double lin_e = b->lin_e;
    char n[96];
    const int64_t D = G4_HD(l), lq = (int64_t)p->n_head * D, lk = (int64_t)G4_KV(l) * D, F = G4_FF(l);
    const int64_t P = p->n_embd_per_layer;
    T("attn_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    T("attn_q.weight", p->type, E, lq, 0.0, lin_e);
    if (l < b->Lkv) { /* the layers that own KV; the full ones have no attn_v (V = K) */
        T("attn_k.weight", p->type, E, lk, 0.0, lin_e);
        if (b->slides[l]) T("attn_v.weight", mtype(p, "attn_v", l), E, lk, 0.0, lin_e);
        T("attn_k_norm.weight", PKV_TYPE_F32, D, 1, 1.0, 0.1);
    }
    T("attn_q_norm.weight", PKV_TYPE_F32, D, 1, 1.0, 0.1);
    T("attn_output.weight", p->type, lq, E, 0.0, sqrt(3.0 / (double)lq));
    T("post_attention_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    T("ffn_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    T("ffn_gate.weight", p->type, E, F, 0.0, lin_e);
    T("ffn_up.weight", p->type, E, F, 0.0, lin_e);
    T("ffn_down.weight", mtype(p, "ffn_down", l), F, E, 0.0, sqrt(3.0 / (double)F));
    T("post_ffw_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    T("layer_output_scale.weight", PKV_TYPE_F32, 1, 1, 1.0, 0.5);
    if (b->moe) { /* the 26B-A4B layout: experts of n_ff / 2 rows beside the dense FFN, their norms and scales */
        const int64_t Fe = p->n_ff / 2;
        T("ffn_gate_inp.weight", p->type, E, p->n_expert, 0.0, 4.0 * lin_e);
        T("ffn_gate_inp.scale", PKV_TYPE_F32, E, 1, 1.0, 0.5);
        T3("ffn_gate_exps.weight", p->type, E, Fe, lin_e);
        T3("ffn_up_exps.weight", p->type, E, Fe, lin_e);
        T3("ffn_down_exps.weight", mtype(p, "ffn_down", l), Fe, E, sqrt(3.0 / (double)Fe));
        T("ffn_down_exps.scale", PKV_TYPE_F32, p->n_expert, 1, 1.0, 0.5);
        T("pre_ffw_norm_2.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("post_ffw_norm_1.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("post_ffw_norm_2.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    }
    if (P) {
        T("inp_gate.weight", p->type, E, P, 0.0, lin_e);
        T("proj.weight", p->type, P, E, 0.0, sqrt(3.0 / (double)P));
        T("post_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    }
    return PKV_OK;
}

/* A qwen35 gated delta-net layer, llama.cpp's tensors. */
static pkv_status mk_deltanet_layer(mkb *b, int l) {
    pkv_mkmodel_params *p = b->p;
    gen *G = b->G;
    const int64_t E = b->E;
    const int64_t Hv = b->Hv, dS = b->dS, C = b->C;
    const double lin_e = b->lin_e, lin_f = b->lin_f;
    char n[96];
    double lin_v = sqrt(3.0 / (double)(Hv * dS));
    T("attn_qkv.weight", p->type, E, C, 0.0, lin_e);
    T("attn_gate.weight", p->type, E, Hv * dS, 0.0, lin_e);
    T("ssm_conv1d.weight", PKV_TYPE_F32, 4, C, 0.0, 0.5);
    T("ssm_dt.bias", PKV_TYPE_F32, Hv, 1, 0.0, 1.0);
    T("ssm_a", PKV_TYPE_F32, Hv, 1, -1.0, 0.5); /* -exp(A_log) < 0 */
    T("ssm_beta.weight", p->type, E, Hv, 0.0, lin_e);
    T("ssm_alpha.weight", p->type, E, Hv, 0.0, lin_e);
    T("ssm_norm.weight", PKV_TYPE_F32, dS, 1, 1.0, 0.1);
    T("ssm_out.weight", p->type, Hv * dS, E, 0.0, lin_v);
    T("post_attention_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    T("ffn_gate.weight", p->type, E, p->n_ff, 0.0, lin_e);
    T("ffn_up.weight", p->type, E, p->n_ff, 0.0, lin_e);
    T("ffn_down.weight", mtype(p, "ffn_down", l), p->n_ff, E, 0.0, lin_f);
    return PKV_OK;
}

/* A layer of the other architectures (or an MTP layer after the trunk). */
static pkv_status mk_layer(mkb *b, int l) {
    pkv_mkmodel_params *p = b->p;
    gen *G = b->G;
    const char *a = b->a;
    const int64_t E = b->E;
    const int64_t qd = b->qd, kd = b->kd;
    const bool gemma = b->gemma, oss = b->oss, phi3 = b->phi3, q35 = b->q35;
    const double lin_e = b->lin_e, lin_q = b->lin_q, lin_f = b->lin_f;
    char n[96];
    const bool mtp_layer = l >= p->n_layer; /* an MTP layer: a gated attention block plus its nextn tensors */
    T("attn_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    if (q35 && !mtp_layer && (l + 1) % 4 != 0) return mk_deltanet_layer(b, l); /* llama.cpp's tensors */
    if (q35) { /* per head: its q rows, then its output gate's */
        T("attn_q.weight", p->type, E, 2 * qd, 0.0, lin_e);
        T("attn_k.weight", p->type, E, kd, 0.0, lin_e);
        T("attn_v.weight", mtype(p, "attn_v", l), E, kd, 0.0, lin_e);
    } else if (phi3) { /* Q, K, V in one matrix, as Phi-3's GGUFs have them */
        T("attn_qkv.weight", p->type, E, qd + 2 * kd, 0.0, lin_e);
    } else {
        T("attn_q.weight", p->type, E, qd, 0.0, lin_e);
        T("attn_k.weight", mtype(p, "attn_k", l), E, kd, 0.0, lin_e);
        T("attn_v.weight", mtype(p, "attn_v", l), E, kd, 0.0, lin_e);
    }
    if (!strcmp(a, "qwen2") || oss) {
        T("attn_q.bias", PKV_TYPE_F32, qd, 1, 0.0, 0.1);
        T("attn_k.bias", PKV_TYPE_F32, kd, 1, 0.0, 0.1);
        T("attn_v.bias", PKV_TYPE_F32, kd, 1, 0.0, 0.1);
    }
    if (b->qk_norm) {
        T("attn_q_norm.weight", PKV_TYPE_F32, p->head_dim, 1, 1.0, 0.1);
        T("attn_k_norm.weight", PKV_TYPE_F32, p->head_dim, 1, 1.0, 0.1);
    }
    T("attn_output.weight", p->type, qd, E, 0.0, lin_q);
    if (oss) { /* the output's bias, and a sink logit per query head (U(-1, 2): about a score) */
        T("attn_output.bias", PKV_TYPE_F32, E, 1, 0.0, 0.1);
        T("attn_sinks.weight", PKV_TYPE_F32, p->n_head, 1, 0.5, 1.5);
    }
    /* gpt-oss's FFN norm has the name of Gemma's post-attention norm */
    if (gemma || oss || q35) T("post_attention_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    if (!oss && !q35) T("ffn_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    if (gemma) T("post_ffw_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    if (b->moe) { /* the router and n_expert FFNs as 3-D tensors [experts][rows][cols] */
        T("ffn_gate_inp.weight", p->type, E, p->n_expert, 0.0, 4.0 * lin_e);
        T3("ffn_gate_exps.weight", p->type, E, p->n_ff, lin_e);
        T3("ffn_up_exps.weight", p->type, E, p->n_ff, lin_e);
        T3("ffn_down_exps.weight", mtype(p, "ffn_down", l), p->n_ff, E, lin_f);
        if (oss) { /* the router's bias and each expert's bias rows [experts][rows] */
            T("ffn_gate_inp.bias", PKV_TYPE_F32, p->n_expert, 1, 0.0, 0.5);
            T("ffn_gate_exps.bias", PKV_TYPE_F32, p->n_ff, p->n_expert, 0.0, 0.1);
            T("ffn_up_exps.bias", PKV_TYPE_F32, p->n_ff, p->n_expert, 0.0, 0.1);
            T("ffn_down_exps.bias", PKV_TYPE_F32, E, p->n_expert, 0.0, 0.1);
        }
    } else if (phi3) { /* the gate's rows, then the up projection's, in one matrix */
        T("ffn_up.weight", p->type, E, 2 * p->n_ff, 0.0, lin_e);
        T("ffn_down.weight", mtype(p, "ffn_down", l), p->n_ff, E, 0.0, lin_f);
    } else {
        T("ffn_gate.weight", p->type, E, p->n_ff, 0.0, lin_e);
        T("ffn_up.weight", p->type, E, p->n_ff, 0.0, lin_e);
        T("ffn_down.weight", mtype(p, "ffn_down", l), p->n_ff, E, 0.0, lin_f);
    }
    if (mtp_layer) { /* x = eh_proj [enorm(embedding); hnorm(h)], its own final norm */
        T("nextn.eh_proj.weight", p->type, 2 * E, E, 0.0, sqrt(3.0 / (double)(2 * E)));
        T("nextn.enorm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("nextn.hnorm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
        T("nextn.shared_head_norm.weight", PKV_TYPE_F32, E, 1, 1.0, 0.1);
    }
    return PKV_OK;
}
#undef T3
#undef T
#undef G4_KV
#undef G4_HD
#undef G4_FF
#undef TRY
#undef KEY

static pkv_status build(pkv_mkmodel_params p, pkv_gguf_writer **out) {
    if (p.arch && !strcmp(p.arch, "gemma4-assistant")) return build_assistant(p, out);
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
    gen G;
    memset(&G, 0, sizeof G);
    G.r.s = p.seed;
    mkb b = {.p = &p, .G = &G, .tgt = &tgt, .a = p.arch};
    int64_t E = b.E = p.n_embd, qd = b.qd = (int64_t)p.n_head * p.head_dim, kd = b.kd = (int64_t)p.n_head_kv * p.head_dim;
    const int64_t PL = b.PL = (int64_t)p.n_embd_per_layer * p.n_layer; /* gemma4's per-layer embedding columns */
    G.cap = (size_t)PKV_MAX(PKV_MAX(E * p.n_vocab, E * (qd + 2 * PKV_MAX(kd, (int64_t)p.n_head_kv_full * p.head_dim))),
                            E * p.n_ff * PKV_MAX(2 * p.n_expert, 4));
    G.cap = PKV_MAX(G.cap, (size_t)(PL * PKV_MAX((int64_t)p.n_vocab, E)));
    G.f = pkv_malloc(G.cap * sizeof(float));
    G.q = pkv_malloc(G.cap * sizeof(float));
    G.w = pkv_gguf_writer_create();
    b.fam = p.chat_template ? find_family(p.chat_template) : NULL;
    b.voc = p.no_vocab || tgt.g ? NULL : family_vocab(b.fam, p.extra_specials, p.n_vocab);
    if (b.voc && p.pre) b.voc->pre = p.pre;
    if (!G.f || !G.q || !G.w || (!p.no_vocab && !tgt.g && !b.voc)) {
        s = pkv_err(PKV_ERR_NOMEM, "mkmodel: out of memory");
        goto done;
    }
    const char *a = p.arch;
    b.gemma3 = !strcmp(a, "gemma3"), b.gemma = !strcmp(a, "gemma2") || b.gemma3, b.g4 = !strcmp(a, "gemma4");
    b.oss = !strcmp(a, "gpt-oss");
    b.qwen = strcmp(a, "llama") != 0 && strcmp(a, "phi3") != 0 && !b.gemma && !b.oss && !b.g4; /* Qwen's RoPE base, eps */
    b.phi3 = !strcmp(a, "phi3");
    b.q35 = !strcmp(a, "qwen35");
    b.moe = p.n_expert > 0;
    b.qk_norm = !strcmp(a, "qwen3") || !strcmp(a, "qwen3moe") || b.gemma3 || b.q35;
    /* gemma4: which layers slide, which own KV */
    b.Lkv = p.n_layer - p.n_shared_kv;
    for (int l = 0; b.g4 && l < p.n_layer; l++)
        b.slides[l] = p.swa_layers ? p.swa_layers[l] == 's' : l < b.Lkv ? (b.Lkv - 1 - l) % 3 != 0 : (l - b.Lkv) % 2 == 0;
    b.Hk = p.ssm_k_heads, b.Hv = p.ssm_v_heads, b.dS = p.ssm_head_dim, b.C = 2 * b.Hk * b.dS + b.Hv * b.dS;
    b.lin_e = sqrt(3.0 / (double)E), b.lin_q = sqrt(3.0 / (double)qd), b.lin_f = sqrt(3.0 / (double)p.n_ff);
    if ((s = mk_sizes(&b)) || (s = mk_hparams(&b)) || (s = mk_vocab(&b)) || (s = mk_globals(&b))) goto done;
    for (int l = 0; b.g4 && l < p.n_layer; l++)
        if ((s = mk_gemma4_layer(&b, l))) goto done;
    for (int l = 0; !b.g4 && l < p.n_layer + p.n_mtp; l++)
        if ((s = mk_layer(&b, l))) goto done;
done:
    pkv_vocab_builtin_free(b.voc);
    return build_end(&G, tg, s, out);
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
