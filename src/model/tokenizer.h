/* Tokenizer: text <-> token ids for GGUF models (internal to the library).
 *
 * Three kinds, chosen by tokenizer.ggml.model:
 *   "gpt2"  byte-level BPE (Llama 3, Qwen2/3): bytes mapped to printable code points
 *           (GPT-2's byte-to-unicode table), a regex-like pre-tokenizer written by
 *           hand (tokenizer.ggml.pre selects the pattern), merges applied by rank
 *           inside each pre-token;
 *   "llama" SentencePiece-style BPE (Llama 1/2): spaces become U+2581 with a dummy
 *           leading U+2581, pieces merged greedily by the score of the merged piece,
 *           byte fallback to <0xNN> tokens;
 *   "none"  no vocabulary: only the token count is known; tokenize/detokenize fail
 *           with PKV_ERR_UNSUPPORTED.
 * A tokenizer is immutable after creation: every function below may be called from
 * several threads at once on the same tokenizer. */
#ifndef PKV_TOKENIZER_H
#define PKV_TOKENIZER_H

#include "pagekv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Token types (tokenizer.ggml.token_type). */
enum {
    PKV_TOKEN_NORMAL = 1,
    PKV_TOKEN_UNKNOWN = 2,
    PKV_TOKEN_CONTROL = 3,
    PKV_TOKEN_USER_DEFINED = 4,
    PKV_TOKEN_UNUSED = 5,
    PKV_TOKEN_BYTE = 6,
};

/* What the model loader reads from GGUF keys. Only borrowed: the tokenizer copies
 * what it needs, so the desc and its arrays may be freed after creation. */
typedef struct pkv_vocab_desc {
    const char *model;  /* tokenizer.ggml.model: "gpt2", "llama", "none"; NULL = "none" */
    const char *pre;    /* tokenizer.ggml.pre: "llama-bpe" (and llama.cpp's other names
                           of that pattern: "llama3", "llama-v3", "falcon3", ...),
                           "qwen2" (also "deepseek-r1-qwen", "megrez", ...),
                           "default"/"gpt2"/"gpt-2" (the GPT-2 pattern); NULL = "default";
                           ignored unless model is "gpt2" */
    int32_t n_tokens;   /* tokenizer.ggml.tokens length, or <arch>.vocab_size for "none" */
    const char *const *tokens;  /* [n_tokens] token texts (NULL for "none") */
    const size_t *token_lens;   /* [n_tokens] byte lengths; NULL = strlen of each */
    const float *scores;        /* [n_tokens] tokenizer.ggml.scores, may be NULL
                                   (SPM then ranks pieces by -id: lower id wins) */
    const int32_t *types;       /* [n_tokens] tokenizer.ggml.token_type, may be NULL: then
                                   bos/eos/pad are control, unk unknown, the rest normal,
                                   and SPM detects "<0xNN>" byte tokens by their text */
    int32_t n_merges;           /* tokenizer.ggml.merges length (BPE), 0 if absent */
    const char *const *merges;  /* [n_merges] "left right", lower index = higher priority */
    const size_t *merge_lens;   /* [n_merges] byte lengths; NULL = strlen of each */
    /* Special token ids (tokenizer.ggml.<name>_token_id). -1 = the key is absent:
     * then llama.cpp's default for the model is taken when it is in range
     * (llama: bos 1, eos 2, unk 0; gpt2: bos 11, eos 11; none: none), and
     * eot/eom/fim are looked for by their text (docs/tokenizer.md). */
    int32_t bos_id, eos_id, unk_id, pad_id;
    int32_t eot_id, eom_id; /* end of turn / end of message */
    int32_t fim_pre_id, fim_suf_id, fim_mid_id, fim_pad_id, fim_rep_id, fim_sep_id;
    int add_bos, add_eos;  /* 0/1, -1 = absent: llama.cpp's default for the model and
                              pre-tokenizer: BOS yes for llama and for the llama3 family
                              of gpt2 pre-tokenizers, no for the others; EOS never.
                              Creation fails when one is on and its token is missing */
    int add_space_prefix;  /* tokenizer.ggml.add_space_prefix, SPM only; -1 = absent: yes */
} pkv_vocab_desc;

/* A desc with every id -1 (absent), every flag -1 and no arrays. */
pkv_vocab_desc pkv_vocab_desc_default(void);

typedef struct pkv_tokenizer pkv_tokenizer;

typedef enum pkv_tokenizer_kind {
    PKV_TOKENIZER_NONE = 0,
    PKV_TOKENIZER_BPE = 1, /* "gpt2" */
    PKV_TOKENIZER_SPM = 2, /* "llama" */
} pkv_tokenizer_kind;

/* Build a tokenizer from desc. Returns NULL with pkv_errmsg() set when the desc is
 * malformed (unknown model or pre-tokenizer, id out of range, missing arrays) or
 * memory runs out; nothing is leaked then. Merges whose parts or result are not in
 * the vocabulary are skipped (they could never apply). */
pkv_tokenizer *pkv_tokenizer_create(const pkv_vocab_desc *desc);
/* NULL is a no-op. */
void pkv_tokenizer_free(pkv_tokenizer *tok);

/* Accessors; a NULL tok gives NONE, 0 and -1. */
pkv_tokenizer_kind pkv_tokenizer_kind_of(const pkv_tokenizer *tok);
int32_t pkv_tokenizer_n_tokens(const pkv_tokenizer *tok);
int32_t pkv_tokenizer_bos(const pkv_tokenizer *tok); /* -1 when none */
int32_t pkv_tokenizer_eos(const pkv_tokenizer *tok); /* -1 when none */
/* End of generation, as llama.cpp decides it: the EOS, EOT and EOM ids; the FIM
 * pad/repo/file-separator ids; and every token whose text is one of llama.cpp's
 * end-of-generation markers (<|eot_id|>, <|im_end|>, <|endoftext|>, </s>, ... the
 * list is in docs/tokenizer.md), whatever its type in the file: such tokens are
 * made control tokens (so parse_special matches them). False for ids out of range. */
bool pkv_tokenizer_is_eog(const pkv_tokenizer *tok, int32_t id);
/* Id of the token whose text is exactly text[0..len), or -1. */
int32_t pkv_tokenizer_find(const pkv_tokenizer *tok, const char *text, size_t len);

/* Tokenize text[0..len) (any bytes; NUL is an ordinary byte).
 * add_special: prepend BOS / append EOS as the model asks (add_bos/add_eos).
 * parse_special: text equal to a control or unknown token's text (types 3, 2)
 * becomes that token.
 * User-defined tokens (type 4) are always matched as whole tokens.
 * On success *n_out is the token count and out[0..*n_out) the ids.
 * Errors: PKV_ERR_INVALID when max is too small (*n_out then gets the count needed,
 * out is untouched), PKV_ERR_UNSUPPORTED for a "none" tokenizer, PKV_ERR_NOMEM;
 * on any error out is unchanged. */
pkv_status pkv_tokenize(const pkv_tokenizer *tok, const char *text, size_t len,
                        bool add_special, bool parse_special, int32_t *out, size_t max,
                        size_t *n_out);
/* pkv_tokenize where data_spans (n_spans sorted pairs [start, end) of byte offsets)
 * mark text that came from outside (a chat message): a special token is parsed only
 * where its text lies wholly outside every span, so a message can never produce a
 * control token. Tokenization is otherwise that of the whole text in one pass. */
pkv_status pkv_tokenize_spans(const pkv_tokenizer *tok, const char *text, size_t len, bool add_special,
                              bool parse_special, const size_t *data_spans, size_t n_spans, int32_t *out,
                              size_t max, size_t *n_out);

/* The bytes a token stands for: BPE pieces are mapped back through the byte
 * table, SPM pieces have U+2581 turned into spaces and <0xNN> into byte NN.
 * Control, unknown and unused tokens give their text when render_special, else
 * nothing; user-defined tokens always give their text as it is. No dummy
 * prefix is stripped here (see pkv_detokenize). Writes up to size bytes into buf
 * and a terminating NUL if there is room; *n_out gets the byte count (without NUL).
 * Errors: PKV_ERR_INVALID for an id out of range or when size < the byte count
 * (*n_out then gets the count needed, buf untouched); PKV_ERR_UNSUPPORTED for "none". */
pkv_status pkv_token_piece(const pkv_tokenizer *tok, int32_t id, bool render_special,
                           char *buf, size_t size, size_t *n_out);

/* The text of ids[0..n): the pieces concatenated. For SPM with a space prefix, the
 * single leading space that tokenize added (at the start of the text and after
 * each special token) is removed, so detokenize(tokenize(s)) == s.
 * Buffer contract as pkv_token_piece. */
pkv_status pkv_detokenize(const pkv_tokenizer *tok, const int32_t *ids, size_t n,
                          bool render_special, char *buf, size_t size, size_t *n_out);

/* The byte-level BPE pre-tokenizer alone (exposed for tests and tools): splits
 * text[0..len) by the pattern named pre (any name tokenizer.ggml.pre may hold that
 * pagekv knows: "llama-bpe", "qwen2", "default"/"gpt2", "gpt-4o", "tekken",
 * "deepseek-v3", "kimi-k2", "seed-coder", "superbpe" and their aliases)
 * and writes the end byte offset of each piece to ends[0..*n). Same buffer
 * contract as pkv_tokenize (PKV_ERR_INVALID with the needed count when max is too
 * small); PKV_ERR_NOT_FOUND for an unknown pattern name. */
pkv_status pkv_pretokenize(const char *pre, const char *text, size_t len, size_t *ends,
                           size_t max, size_t *n_out);

/* A small byte-level BPE vocabulary for test models (`pagekv mkmodel`), built
 * deterministically in memory:
 *   ids 0..255   the 256 bytes in GPT-2 byte-to-unicode form (id b = byte b),
 *   id 256       "<|begin_of_text|>" (control, BOS),
 *   id 257       "<|end_of_text|>"   (control, EOS),
 *   258..        merges building common English words and word pieces, each
 *                plain and with a leading space ("the", "Ġthe"), each word a
 *                single token under these merges; then letter pairs; then
 *                "<|reserved_N|>" unused tokens up to n_tokens.
 * model "gpt2", pre "llama-bpe", add_bos 1, add_eos 0.
 * n_tokens must be in [300, 1000000]. Returns NULL with a message on bad size or
 * out of memory. The desc owns all its memory: free it with pkv_vocab_builtin_free. */
pkv_vocab_desc *pkv_vocab_builtin_create(int32_t n_tokens);

/* The same vocabulary with other control tokens at 256..: specials[0..n_specials)
 * (1 to PKV_VOCAB_BUILTIN_MAX_SPECIALS texts, each 2 to 64 bytes, starting with '<'
 * or '[' so no merge can build it, none repeated) take the place of the two above;
 * the merge-built tokens follow them (each id moves by n_specials - 2, and as many
 * of the last merges as the budget lacks are left out) and the reserved ones fill
 * up to n_tokens. With {"<|begin_of_text|>", "<|end_of_text|>"} the tokens and
 * merges are those of pkv_vocab_builtin_create. The desc names no special ids
 * (bos_id, eos_id, ... all -1) and has add_bos 0, add_eos 0, model "gpt2", pre
 * "llama-bpe": the caller sets what its family needs. Same errors and ownership as
 * pkv_vocab_builtin_create. */
#define PKV_VOCAB_BUILTIN_MAX_SPECIALS 16
pkv_vocab_desc *pkv_vocab_builtin_create_specials(int32_t n_tokens, const char *const *specials,
                                                  int n_specials);
/* Frees a desc from pkv_vocab_builtin_create or _create_specials (only such a desc);
 * NULL is a no-op. */
void pkv_vocab_builtin_free(pkv_vocab_desc *desc);

#endif /* PKV_TOKENIZER_H */
