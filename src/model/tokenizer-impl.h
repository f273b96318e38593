/* Tokenizer internals shared by tokenizer.c, tokenizer-bpe.c and tokenizer-spm.c. */
#ifndef PKV_TOKENIZER_IMPL_H
#define PKV_TOKENIZER_IMPL_H

#include "base/base.h"
#include "model/tokenizer.h"

typedef enum pkv_pretok {
    PKV_PRETOK_GPT2 = 0,  /* "default", "gpt2" */
    PKV_PRETOK_LLAMA3 = 1, /* "llama-bpe", "llama3" */
    PKV_PRETOK_QWEN2 = 2, /* "qwen2": llama-bpe with single digits */
} pkv_pretok;

/* Merge table entry (BPE): the pair (left, right) of token ids merges into result
 * with priority rank (lower first). Open addressing; key 0 is never a valid pair
 * key because it is stored as key + 1. */
/* The pattern named by a tokenizer.ggml.pre value (llama.cpp's names for the three
 * patterns pagekv has); false for an unknown name. */
bool pkv_pretok_from_name(const char *name, pkv_pretok *out);

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

/* A candidate merge of the adjacent symbols left and right, in a binary min-heap
 * ordered by key, then by left (so equal keys merge leftmost first). a and b let the
 * popper check the candidate is still current (the symbols did not change). */
typedef struct pkv_tok_pair {
    double key;
    int32_t left, right;
    int32_t a, b;
} pkv_tok_pair;

typedef struct pkv_tok_heap {
    pkv_tok_pair *v; /* [cap] */
    size_t n, cap;   /* the caller sizes cap for every push it will make */
} pkv_tok_heap;

void pkv_tok_heap_push(pkv_tok_heap *h, pkv_tok_pair p);
pkv_tok_pair pkv_tok_heap_pop(pkv_tok_heap *h); /* h->n > 0 */

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
