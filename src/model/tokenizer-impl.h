/* Tokenizer internals shared by tokenizer.c, tokenizer-bpe.c and tokenizer-spm.c. */
#ifndef PKV_TOKENIZER_IMPL_H
#define PKV_TOKENIZER_IMPL_H

#include "base/base.h"
#include "model/tokenizer.h"

/* The patterns are in tokenizer-bpe.c; the names of each in tokenizer.c. */
typedef enum pkv_pretok {
    PKV_PRETOK_GPT2 = 0,       /* "default", "gpt2" */
    PKV_PRETOK_LLAMA3 = 1,     /* "llama-bpe", "llama3" */
    PKV_PRETOK_QWEN2 = 2,      /* "qwen2": llama-bpe with single digits */
    PKV_PRETOK_GPT4O = 3,      /* "gpt-4o", "llama4": o200k, split at case changes */
    PKV_PRETOK_TEKKEN = 4,     /* "tekken" (Mistral) */
    PKV_PRETOK_DEEPSEEK3 = 5,  /* "deepseek-v3": three patterns in sequence */
    PKV_PRETOK_KIMI_K2 = 6,    /* "kimi-k2" */
    PKV_PRETOK_SEED_CODER = 7, /* "seed-coder" */
    PKV_PRETOK_SUPERBPE = 8,   /* "superbpe": numbers only */
} pkv_pretok;

/* Merge table entry (BPE): the pair (left, right) of token ids merges into result
 * with priority rank (lower first). Open addressing; key 0 is never a valid pair
 * key because it is stored as key + 1. */
/* The pattern named by a tokenizer.ggml.pre value (llama.cpp's names for the
 * patterns pagekv has); false for an unknown name. */
bool pkv_pretok_from_name(const char *name, pkv_pretok *out);
/* Every name pkv_pretok_from_name knows, ", "-separated, into buf[0..size)
 * (truncated to fit, always terminated; size > 0). */
void pkv_pretok_names(char *buf, size_t size);

typedef struct pkv_merge_slot {
    uint64_t key1; /* ((uint64_t)left << 32 | right) + 1; 0 = empty */
    int32_t rank;
    int32_t result;
} pkv_merge_slot;

struct pkv_tokenizer {
    pkv_tokenizer_kind kind;
    pkv_pretok pre;
    int32_t n_tokens;
    /* token texts, back to back: token i is text[off[i] .. off[i] + len[i]) */
    char *text;       /* [sum of len] */
    size_t *off;      /* [n_tokens] */
    uint32_t *len;    /* [n_tokens] */
    float *scores;    /* [n_tokens] (SPM only; NULL for BPE and none) */
    uint8_t *types;   /* [n_tokens] PKV_TOKEN_* */
    /* text -> id, open addressing, slot = id + 1 (0 empty); n_map is a power of two */
    int32_t *map;     /* [n_map] */
    size_t n_map;
    /* BPE merges */
    pkv_merge_slot *merges; /* [n_merge_slots], power of two; NULL when none */
    size_t n_merge_slots;
    /* BPE: id of the token for each byte (in byte-to-unicode form); SPM: id of the
     * <0xNN> token. -1 when the vocabulary lacks it. */
    int32_t byte_id[256];
    /* special tokens matched in text (types 3, 4), longest first */
    int32_t *special;   /* [n_special] */
    size_t n_special;
    bool special_first[256]; /* some special token starts with this byte */
    /* end-of-generation ids (eos included), ascending */
    int32_t *eog;       /* [n_eog] */
    size_t n_eog;
    int32_t bos, eos, unk, pad; /* -1 = none */
    bool add_bos, add_eos, add_space_prefix;
};

/* A growable id vector used while tokenizing. */
typedef struct pkv_idvec {
    int32_t *v;
    size_t n, cap;
} pkv_idvec;

pkv_status pkv_idvec_push(pkv_idvec *vec, int32_t id);

/* Merge candidates of BPE and SPM in 8 bytes each (a 24-byte entry with room for 3
 * per symbol made the scratch about 100 bytes per byte of text): a binary min-heap
 * of keys priority << 32 | left, where left is the index of the pair's left symbol,
 * so equal priorities merge leftmost first. A key does not say which pair it was
 * made for: the tokenizer takes it as current when the pair now at `left` has that
 * priority, and skips it otherwise.
 *
 * Why the ids do not depend on the heap: both tokenizers merge, at each step, the
 * current pair of least (priority, left). Every current pair has its key in the
 * heap (pushed when the pair formed), so a popped key taken as current is the least
 * of all current pairs' keys and names that pair. A stale key can equal a current
 * one (SPM: the pair at left changed into one of the same score); popping either
 * merges the same pair.
 *
 * Capacity: a word of n symbols pushes n - 1 keys, then at most 2 per merge, and
 * each merge pops at least one key; there are at most n - 1 merges, so the heap
 * never holds more than 2n - 2 keys. */
typedef struct pkv_tok_cands {
    uint64_t *v;   /* [cap], cap >= 2 * symbols */
    size_t n, cap;
} pkv_tok_cands;

static inline uint64_t pkv_tok_cand(uint32_t priority, uint32_t left) {
    return (uint64_t)priority << 32 | left;
}

/* h->n < h->cap */
static inline void pkv_tok_cands_push(pkv_tok_cands *h, uint64_t key) {
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->v[parent] <= key) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = key;
}

/* The least key; h->n > 0. */
static inline uint64_t pkv_tok_cands_pop(pkv_tok_cands *h) {
    uint64_t *v = h->v, top = v[0], x = v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && v[c + 1] < v[c]) c++;
        if (v[c] >= x) break;
        v[i] = v[c];
        i = c;
    }
    if (n) v[i] = x;
    return top;
}

/* Look up text in the token map: id or -1. */
int32_t pkv_tok_lookup(const pkv_tokenizer *tok, const char *s, size_t n);

/* Decode one UTF-8 sequence at s[0..n) (n >= 1). Returns its length in bytes (1..4)
 * and the code point in *cp; an invalid or truncated sequence gives length 1 and
 * *cp = -1 (the byte stands alone). */
size_t pkv_utf8_decode(const unsigned char *s, size_t n, int32_t *cp);
/* Encode cp (< 0x110000) as UTF-8 into out[4]; returns the byte count. */
size_t pkv_utf8_encode(uint32_t cp, char *out);

/* GPT-2 byte <-> code point tables. */
uint32_t pkv_bpe_byte_to_cp(uint8_t b);
/* Byte for a code point of the table, or -1. */
int pkv_bpe_cp_to_byte(uint32_t cp);

/* tokenizer-bpe.c: build merge table and byte ids (create); tokenize one raw-text
 * fragment and append to out. */
pkv_status pkv_bpe_init(pkv_tokenizer *tok, const pkv_vocab_desc *desc);
pkv_status pkv_bpe_tokenize(const pkv_tokenizer *tok, const char *text, size_t len,
                            pkv_idvec *out);
/* Bytes of a BPE token's piece: appends to out[0..cap); returns the byte count
 * (which may exceed cap, then nothing past cap is written). */
size_t pkv_bpe_piece(const pkv_tokenizer *tok, int32_t id, char *out, size_t cap);

/* tokenizer-spm.c */
pkv_status pkv_spm_init(pkv_tokenizer *tok, const pkv_vocab_desc *desc);
pkv_status pkv_spm_tokenize(const pkv_tokenizer *tok, const char *text, size_t len,
                            bool add_prefix, pkv_idvec *out);
/* Bytes of an SPM token's piece without its first `skip` bytes (detokenize skips
 * the dummy prefix space this way): writes out[0..cap), returns the byte count
 * after the skip (which may exceed cap, then nothing past cap is written). */
size_t pkv_spm_piece(const pkv_tokenizer *tok, int32_t id, size_t skip, char *out, size_t cap);

#endif /* PKV_TOKENIZER_IMPL_H */
