/* Tokenizer: vocabulary, special tokens, and the API common to BPE and SPM. */
#include "model/tokenizer-impl.h"

#include <stdlib.h>
#include <string.h>

pkv_vocab_desc pkv_vocab_desc_default(void) {
    pkv_vocab_desc d;
    memset(&d, 0, sizeof d);
    d.bos_id = d.eos_id = d.unk_id = d.pad_id = d.eot_id = d.eom_id = -1;
    d.fim_pre_id = d.fim_suf_id = d.fim_mid_id = d.fim_pad_id = d.fim_rep_id = d.fim_sep_id = -1;
    d.add_bos = d.add_eos = d.add_space_prefix = -1;
    return d;
}

/* ------------------------------------------------------------- helpers */

pkv_status pkv_idvec_push(pkv_idvec *vec, int32_t id) {
    if (vec->n == vec->cap) {
        pkv_status s = pkv_grow((void **)&vec->v, &vec->cap, vec->n + 1, sizeof(int32_t));
        if (s) return pkv_err_prefix(s, "tokenizer: output ids");
    }
    vec->v[vec->n++] = id;
    return PKV_OK;
}

size_t pkv_utf8_decode(const unsigned char *s, size_t n, int32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = (int32_t)c;
        return 1;
    }
    size_t need;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = -1;
        return 1;
    }
    if (n < need) {
        *cp = -1;
        return 1;
    }
    for (size_t k = 1; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = v << 6 | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = -1;
        return 1;
    }
    *cp = (int32_t)v;
    return need;
}

size_t pkv_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's table: the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
 * themselves; the other 68 bytes, in increasing order, take 0x100, 0x101, ... */
static bool bpe_byte_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

/* The 68 others: 0x00-0x20 (0x100 + b), 0x7F-0xA0 (0x121 + b - 0x7F), 0xAD (0x143). */
uint32_t pkv_bpe_byte_to_cp(uint8_t b) {
    if (bpe_byte_printable(b)) return b;
    if (b <= 0x20) return 0x100 + (uint32_t)b;
    if (b <= 0xA0) return 0x121 + (uint32_t)(b - 0x7F);
    return 0x143; /* 0xAD */
}

int pkv_bpe_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return bpe_byte_printable(cp) ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(cp - 0x121 + 0x7F);
    return cp == 0x143 ? 0xAD : -1;
}

int32_t pkv_tok_lookup(const pkv_tokenizer *tok, const char *s, size_t n) {
    if (!tok->map) return -1;
    size_t mask = tok->n_map - 1;
    for (size_t i = pkv_hash64(s, n, 0) & mask;; i = (i + 1) & mask) {
        int32_t slot = tok->map[i];
        if (!slot) return -1;
        int32_t id = slot - 1;
        if (tok->len[id] == n && memcmp(tok->text + tok->off[id], s, n) == 0) return id;
    }
}

/* ------------------------------------------------------------- create */

/* llama.cpp's names for the pre-tokenizer patterns pagekv has: the
 * tokenizer_pre == "..." tests of llama_vocab::impl::load in llama.cpp's
 * src/llama-vocab.cpp (commit 00ad355), each name with the pattern of its
 * LLAMA_VOCAB_PRE_TYPE_*. Types whose regex lists are the same share a pattern:
 * MINIMAX_M2 that of GPT4O; HUNYUAN_DENSE, JOYAI_LLM and HY_V4 that of
 * DEEPSEEK3_LLM. */
static const struct {
    const char *name;
    pkv_pretok pre;
} k_pre_names[] = {
    {"llama3", PKV_PRETOK_LLAMA3}, {"llama-v3", PKV_PRETOK_LLAMA3},
    {"llama-bpe", PKV_PRETOK_LLAMA3}, {"falcon3", PKV_PRETOK_LLAMA3},
    {"falcon-h1", PKV_PRETOK_LLAMA3}, {"pixtral", PKV_PRETOK_LLAMA3},
    {"midm-2.0", PKV_PRETOK_LLAMA3}, {"lfm2", PKV_PRETOK_LLAMA3},
    {"jina-v5-nano", PKV_PRETOK_LLAMA3},
    {"qwen2", PKV_PRETOK_QWEN2}, {"deepseek-r1-qwen", PKV_PRETOK_QWEN2},
    {"kormo", PKV_PRETOK_QWEN2}, {"f2llmv2", PKV_PRETOK_QWEN2}, {"megrez", PKV_PRETOK_QWEN2},
    {"default", PKV_PRETOK_GPT2}, {"gpt2", PKV_PRETOK_GPT2}, {"gpt-2", PKV_PRETOK_GPT2},
    {"gpt-4o", PKV_PRETOK_GPT4O}, {"llama4", PKV_PRETOK_GPT4O}, {"kanana2", PKV_PRETOK_GPT4O},
    {"talkie", PKV_PRETOK_GPT4O}, {"minimax-m2", PKV_PRETOK_GPT4O},
    {"tekken", PKV_PRETOK_TEKKEN},
    {"deepseek-v3", PKV_PRETOK_DEEPSEEK3}, {"hunyuan-dense", PKV_PRETOK_DEEPSEEK3},
    {"joyai-llm", PKV_PRETOK_DEEPSEEK3}, {"hy_v4", PKV_PRETOK_DEEPSEEK3},
    {"kimi-k2", PKV_PRETOK_KIMI_K2},
    {"seed-coder", PKV_PRETOK_SEED_CODER},
    {"superbpe", PKV_PRETOK_SUPERBPE},
};

bool pkv_pretok_from_name(const char *name, pkv_pretok *out) {
    for (size_t i = 0; i < PKV_ARRAY_LEN(k_pre_names); i++)
        if (strcmp(name, k_pre_names[i].name) == 0) {
            *out = k_pre_names[i].pre;
            return true;
        }
    return false;
}

void pkv_pretok_names(char *buf, size_t size) {
    size_t at = 0;
    for (size_t i = 0; i < PKV_ARRAY_LEN(k_pre_names); i++) {
        const char *sep = i ? ", " : "", *name = k_pre_names[i].name;
        for (const char *p = sep; *p && at + 1 < size; p++) buf[at++] = *p;
        for (const char *p = name; *p && at + 1 < size; p++) buf[at++] = *p;
    }
    buf[at] = 0;
}

/* Tokens llama.cpp finds by their text when the GGUF does not give their id, and
 * makes control tokens (same source). Each list is NULL-terminated. */
#define FW_BAR "\xEF\xBD\x9C" /* U+FF5C FULLWIDTH VERTICAL LINE */
#define SPM_SP "\xE2\x96\x81" /* U+2581 */
enum { ROLE_EOT, ROLE_EOM, ROLE_FIM_PRE, ROLE_FIM_SUF, ROLE_FIM_MID, ROLE_FIM_PAD, ROLE_FIM_REP,
       ROLE_FIM_SEP, N_ROLES };
static const char *const k_role_texts[N_ROLES][12] = {
    [ROLE_EOT] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                  "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                  "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">", "<end_of_utterance>", NULL},
    [ROLE_EOM] = {"<|eom_id|>", NULL},
    [ROLE_FIM_PRE] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<" FW_BAR "fim" SPM_SP "begin" FW_BAR ">",
                      "<PRE>", SPM_SP "<PRE>", "<|code_prefix|>", "<|prefix|>", NULL},
    [ROLE_FIM_SUF] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<" FW_BAR "fim" SPM_SP "hole" FW_BAR ">",
                      "<SUF>", SPM_SP "<SUF>", "<|code_suffix|>", "<|suffix|>", NULL},
    [ROLE_FIM_MID] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<" FW_BAR "fim" SPM_SP "end" FW_BAR ">",
                      "<MID>", SPM_SP "<MID>", "<|code_middle|>", "<|middle|>", NULL},
    [ROLE_FIM_PAD] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL},
    [ROLE_FIM_REP] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL},
    [ROLE_FIM_SEP] = {"<|file_sep|>", NULL},
};

/* Every token with one of these texts ends generation and becomes a control token
 * (same source: the list that builds special_eog_ids). */
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">", "[e~[",
};

typedef struct special_ent {
    uint32_t len;
    int32_t id;
} special_ent;

static int special_cmp(const void *a, const void *b) {
    const special_ent *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return x->id < y->id ? -1 : x->id > y->id;
}

static pkv_status check_id(const char *what, int32_t id, int32_t n) {
    if (id < -1 || id >= n)
        return pkv_err(PKV_ERR_FORMAT, "tokenizer: %s %d is out of range [0, %d) (-1 = absent)",
                       what, id, n);
    return PKV_OK;
}

/* The id a desc gives, or the model's default when absent and in range, or -1. */
static int32_t resolve_id(int32_t given, int32_t def, int32_t n) {
    if (given >= 0) return given;
    return def >= 0 && def < n ? def : -1;
}

static int32_t find_text(const pkv_tokenizer *tok, const char *t) {
    return pkv_tok_lookup(tok, t, strlen(t));
}

static void make_control(pkv_tokenizer *tok, int32_t id) {
    if (id >= 0) tok->types[id] = PKV_TOKEN_CONTROL;
}

/* Add id to the ascending set tok->eog (room for it was allocated). */
static void eog_add(pkv_tokenizer *tok, int32_t id) {
    if (id < 0) return;
    size_t i = 0;
    while (i < tok->n_eog && tok->eog[i] < id) i++;
    if (i < tok->n_eog && tok->eog[i] == id) return;
    memmove(tok->eog + i + 1, tok->eog + i, (tok->n_eog - i) * sizeof *tok->eog);
    tok->eog[i] = id;
    tok->n_eog++;
}

static void eog_remove(pkv_tokenizer *tok, int32_t id) {
    for (size_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id) {
            memmove(tok->eog + i, tok->eog + i + 1, (tok->n_eog - i - 1) * sizeof *tok->eog);
            tok->n_eog--;
            return;
        }
}

static bool eog_has_text(const pkv_tokenizer *tok, const char *t) {
    int32_t id = find_text(tok, t);
    return id >= 0 && pkv_tokenizer_is_eog(tok, id);
}

/* The end-of-generation set and the tokens recognised by their text, as llama.cpp
 * builds them: roles (eot, eom, fim) not given by the desc are looked for by text
 * (the lowest matching id: llama.cpp takes whichever its hash map yields first) and
 * made control; every token with an end-of-generation text is made control and
 * joins the set, with the eos/eot/eom ids and the fim pad/repo/separator ids. */
static pkv_status find_specials(pkv_tokenizer *tok, const pkv_vocab_desc *d) {
    int32_t role[N_ROLES] = {d->eot_id, d->eom_id, d->fim_pre_id, d->fim_suf_id, d->fim_mid_id,
                             d->fim_pad_id, d->fim_rep_id, d->fim_sep_id};
    for (int r = 0; r < N_ROLES; r++) {
        if (role[r] >= 0) continue;
        for (size_t k = 0; k_role_texts[r][k]; k++) {
            int32_t id = find_text(tok, k_role_texts[r][k]);
            if (id >= 0 && (role[r] < 0 || id < role[r])) role[r] = id;
        }
        make_control(tok, role[r]);
    }
    size_t cap = 6 + PKV_ARRAY_LEN(k_eog_texts);
    tok->eog = pkv_calloc(cap, sizeof *tok->eog);
    if (!tok->eog) return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate eog ids");
    eog_add(tok, role[ROLE_FIM_PAD]);
    eog_add(tok, role[ROLE_FIM_REP]);
    eog_add(tok, role[ROLE_FIM_SEP]);
    for (size_t e = 0; e < PKV_ARRAY_LEN(k_eog_texts); e++) {
        int32_t id = find_text(tok, k_eog_texts[e]);
        make_control(tok, id);
        eog_add(tok, id);
    }
    eog_add(tok, tok->eos);
    eog_add(tok, role[ROLE_EOT]);
    eog_add(tok, role[ROLE_EOM]);
    /* llama.cpp's two exceptions: in gpt-oss/solar-open vocabularies <|end|> ends a
     * message but not generation (it becomes user-defined); next to <|tool_response>
     * (gemma4) </s> is an ordinary token */
    bool has_call = eog_has_text(tok, "<|call|>") || eog_has_text(tok, "<|calls|>");
    if (eog_has_text(tok, "<|end|>") && has_call &&
        (eog_has_text(tok, "<|return|>") || eog_has_text(tok, "<|flush|>"))) {
        int32_t id = find_text(tok, "<|end|>");
        eog_remove(tok, id);
        tok->types[id] = PKV_TOKEN_USER_DEFINED;
    }
    if (eog_has_text(tok, "<|tool_response>") && eog_has_text(tok, "</s>")) {
        int32_t id = find_text(tok, "</s>");
        eog_remove(tok, id);
        tok->types[id] = PKV_TOKEN_NORMAL;
    }
    return PKV_OK;
}

static bool is_parsed_type(int t) {
    return t == PKV_TOKEN_CONTROL || t == PKV_TOKEN_USER_DEFINED || t == PKV_TOKEN_UNKNOWN;
}

static pkv_status build_vocab(pkv_tokenizer *tok, const pkv_vocab_desc *d) {
    int32_t n = d->n_tokens;
    if (!d->tokens)
        return pkv_err(PKV_ERR_FORMAT, "tokenizer: model \"%s\" needs tokenizer.ggml.tokens",
                       d->model);
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!d->tokens[i]) return pkv_err(PKV_ERR_FORMAT, "tokenizer: token %d is NULL", i);
        size_t l = d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
        if (l > UINT32_MAX || !pkv_add_ok(total, l, &total))
            return pkv_err(PKV_ERR_FORMAT, "tokenizer: token %d is too long (%zu bytes)", i, l);
    }
    tok->text = pkv_malloc(total);
    tok->off = pkv_calloc((size_t)n, sizeof *tok->off);
    tok->len = pkv_calloc((size_t)n, sizeof *tok->len);
    tok->types = pkv_calloc((size_t)n, sizeof *tok->types);
    size_t n_map = 16;
    while (n_map < 2 * (size_t)n) n_map *= 2;
    tok->map = pkv_calloc(n_map, sizeof *tok->map);
    tok->n_map = n_map;
    if (!tok->text || !tok->off || !tok->len || !tok->types || !tok->map)
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate the vocabulary (%d tokens, "
                       "%zu bytes of text)", n, total);
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
        if (l) memcpy(tok->text + at, d->tokens[i], l);
        tok->off[i] = at;
        tok->len[i] = (uint32_t)l;
        at += l;
        int32_t t = d->types ? d->types[i] : PKV_TOKEN_NORMAL;
        if (t < PKV_TOKEN_NORMAL || t > PKV_TOKEN_BYTE) t = PKV_TOKEN_NORMAL;
        if (!d->types && (i == tok->bos || i == tok->eos || i == tok->pad))
            t = PKV_TOKEN_CONTROL; /* without types, the named specials are control */
        if (!d->types && i == tok->unk) t = PKV_TOKEN_UNKNOWN;
        tok->types[i] = (uint8_t)t;
        /* insert into the map; a duplicate text keeps its first id */
        size_t mask = n_map - 1;
        for (size_t h = pkv_hash64(tok->text + tok->off[i], l, 0) & mask;; h = (h + 1) & mask) {
            int32_t slot = tok->map[h];
            if (!slot) {
                tok->map[h] = i + 1;
                break;
            }
            int32_t o = slot - 1;
            if (tok->len[o] == l && memcmp(tok->text + tok->off[o], tok->text + tok->off[i], l) == 0)
                break;
        }
    }
    pkv_status s = find_specials(tok, d);
    if (s) return s;
    /* the tokens cut out of text before tokenizing: control, unknown and user-defined
     * (llama.cpp's special-token cache) */
    size_t n_special = 0;
    for (int32_t i = 0; i < n; i++)
        if (is_parsed_type(tok->types[i]) && tok->len[i] > 0) n_special++;
    if (n_special) {
        special_ent *ents = pkv_calloc(n_special, sizeof *ents);
        tok->special = pkv_calloc(n_special, sizeof *tok->special);
        if (!ents || !tok->special) {
            pkv_free(ents);
            return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate %zu special tokens",
                           n_special);
        }
        size_t k = 0;
        for (int32_t i = 0; i < n; i++)
            if (is_parsed_type(tok->types[i]) && tok->len[i] > 0)
                ents[k++] = (special_ent){tok->len[i], i};
        qsort(ents, n_special, sizeof *ents, special_cmp);
        for (size_t j = 0; j < n_special; j++) {
            tok->special[j] = ents[j].id;
            tok->special_first[(unsigned char)tok->text[tok->off[ents[j].id]]] = true;
        }
        tok->n_special = n_special;
        pkv_free(ents);
    }
    return PKV_OK;
}

pkv_tokenizer *pkv_tokenizer_create(const pkv_vocab_desc *d) {
    if (!d) {
        pkv_err(PKV_ERR_INVALID, "tokenizer: desc is NULL");
        return NULL;
    }
    const char *model = d->model ? d->model : "none";
    pkv_tokenizer_kind kind;
    if (strcmp(model, "gpt2") == 0)
        kind = PKV_TOKENIZER_BPE;
    else if (strcmp(model, "llama") == 0)
        kind = PKV_TOKENIZER_SPM;
    else if (strcmp(model, "none") == 0)
        kind = PKV_TOKENIZER_NONE;
    else {
        pkv_err(PKV_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.model \"%s\" is not supported "
                "(supported: gpt2, llama, none)", model);
        return NULL;
    }
    pkv_pretok pre = PKV_PRETOK_GPT2;
    if (kind == PKV_TOKENIZER_BPE && d->pre && !pkv_pretok_from_name(d->pre, &pre)) {
        char names[512];
        pkv_pretok_names(names, sizeof names);
        /* the value is cut so that the list always fits in the message */
        pkv_err(PKV_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer tokenizer.ggml.pre = \"%.64s\" "
                "is not supported (supported: %s)", d->pre, names);
        return NULL;
    }
    if (d->n_tokens < 0 || (kind != PKV_TOKENIZER_NONE && d->n_tokens == 0)) {
        pkv_err(PKV_ERR_FORMAT, "tokenizer: model \"%s\" with %d tokens", model, d->n_tokens);
        return NULL;
    }
    pkv_status s;
    const struct { const char *name; int32_t id; } ids[] = {
        {"bos_id", d->bos_id}, {"eos_id", d->eos_id}, {"unk_id", d->unk_id}, {"pad_id", d->pad_id},
        {"eot_id", d->eot_id}, {"eom_id", d->eom_id}, {"fim_pre_id", d->fim_pre_id},
        {"fim_suf_id", d->fim_suf_id}, {"fim_mid_id", d->fim_mid_id}, {"fim_pad_id", d->fim_pad_id},
        {"fim_rep_id", d->fim_rep_id}, {"fim_sep_id", d->fim_sep_id},
    };
    for (size_t i = 0; i < PKV_ARRAY_LEN(ids); i++)
        if ((s = check_id(ids[i].name, ids[i].id, d->n_tokens))) return NULL;
    /* llama.cpp's defaults when the GGUF has no key (llama_vocab::impl::load) */
    bool spm = kind == PKV_TOKENIZER_SPM, bpe = kind == PKV_TOKENIZER_BPE;
    int32_t bos = resolve_id(d->bos_id, spm ? 1 : bpe ? 11 : -1, d->n_tokens);
    int32_t eos = resolve_id(d->eos_id, spm ? 2 : bpe ? 11 : -1, d->n_tokens);
    int32_t unk = resolve_id(d->unk_id, spm ? 0 : -1, d->n_tokens);
    /* llama.cpp's default where the file is silent: BOS for SPM, the llama-bpe family and tekken */
    bool add_bos = d->add_bos >= 0 ? d->add_bos != 0 : spm || (bpe && (pre == PKV_PRETOK_LLAMA3 || pre == PKV_PRETOK_TEKKEN));
    bool add_eos = d->add_eos > 0;
    if (kind != PKV_TOKENIZER_NONE && ((add_bos && bos < 0) || (add_eos && eos < 0))) {
        bool b = add_bos && bos < 0; /* BOS is the one missing (else EOS) */
        const char *name = b ? "bos" : "eos";
        pkv_err(PKV_ERR_FORMAT, "tokenizer: tokenizer.ggml.add_%s_token is %s, but the vocabulary has no %s "
                "token (tokenizer.ggml.%s_token_id absent and no default in range)", name,
                (b ? d->add_bos : d->add_eos) >= 0 ? "true" : "absent and the model's default is true",
                b ? "BOS" : "EOS", name);
        return NULL;
    }
    if (d->n_merges < 0 || (d->n_merges > 0 && !d->merges)) {
        pkv_err(PKV_ERR_FORMAT, "tokenizer: %d merges but no merge array", d->n_merges);
        return NULL;
    }

    pkv_tokenizer *tok = pkv_calloc(1, sizeof *tok);
    if (!tok) {
        pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate the tokenizer");
        return NULL;
    }
    tok->kind = kind;
    tok->pre = pre;
    tok->n_tokens = d->n_tokens;
    tok->bos = bos;
    tok->eos = eos;
    tok->unk = unk;
    tok->pad = d->pad_id;
    tok->add_bos = add_bos;
    tok->add_eos = add_eos;
    tok->add_space_prefix = kind == PKV_TOKENIZER_SPM && d->add_space_prefix != 0;
    for (int b = 0; b < 256; b++) tok->byte_id[b] = -1;
    if (kind == PKV_TOKENIZER_NONE) { /* no texts: only the ids given */
        int32_t eog[] = {tok->eos, d->eot_id, d->eom_id, d->fim_pad_id, d->fim_rep_id, d->fim_sep_id};
        tok->eog = pkv_calloc(PKV_ARRAY_LEN(eog), sizeof *tok->eog);
        if (!tok->eog) {
            pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate eog ids");
            pkv_tokenizer_free(tok);
            return NULL;
        }
        for (size_t i = 0; i < PKV_ARRAY_LEN(eog); i++) eog_add(tok, eog[i]);
        return tok;
    }

    s = build_vocab(tok, d);
    if (!s) s = kind == PKV_TOKENIZER_BPE ? pkv_bpe_init(tok, d) : pkv_spm_init(tok, d);
    if (s) {
        pkv_tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

void pkv_tokenizer_free(pkv_tokenizer *tok) {
    if (!tok) return;
    pkv_free(tok->text);
    pkv_free(tok->off);
    pkv_free(tok->len);
    pkv_free(tok->scores);
    pkv_free(tok->types);
    pkv_free(tok->map);
    pkv_free(tok->merges);
    pkv_free(tok->special);
    pkv_free(tok->eog);
    pkv_free(tok);
}

pkv_tokenizer_kind pkv_tokenizer_kind_of(const pkv_tokenizer *tok) {
    return tok ? tok->kind : PKV_TOKENIZER_NONE;
}
int32_t pkv_tokenizer_n_tokens(const pkv_tokenizer *tok) { return tok ? tok->n_tokens : 0; }
int32_t pkv_tokenizer_bos(const pkv_tokenizer *tok) { return tok ? tok->bos : -1; }
int32_t pkv_tokenizer_eos(const pkv_tokenizer *tok) { return tok ? tok->eos : -1; }

bool pkv_tokenizer_is_eog(const pkv_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_tokens) return false;
    for (size_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id) return true;
    return false;
}

int32_t pkv_tokenizer_find(const pkv_tokenizer *tok, const char *text, size_t len) {
    if (!tok || (!text && len)) return -1;
    return pkv_tok_lookup(tok, text, len);
}

/* ------------------------------------------------------------- tokenize */

static pkv_status no_vocab(void) {
    return pkv_err(PKV_ERR_UNSUPPORTED, "this model has no vocabulary "
                   "(tokenizer.ggml.model = none): use token ids");
}

static pkv_status tokenize_raw(const pkv_tokenizer *tok, const char *text, size_t len,
                               bool after_special, pkv_idvec *out) {
    if (len == 0) return PKV_OK;
    if (tok->kind == PKV_TOKENIZER_BPE) return pkv_bpe_tokenize(tok, text, len, out);
    return pkv_spm_tokenize(tok, text, len, tok->add_space_prefix && after_special, out);
}

/* Id of the special token that starts at text[pos], or -1. */
static int32_t match_special(const pkv_tokenizer *tok, const char *text, size_t len, size_t pos,
                             bool parse_special) {
    for (size_t k = 0; k < tok->n_special; k++) {
        int32_t id = tok->special[k];
        size_t l = tok->len[id];
        if (l > len - pos) continue;
        if (tok->types[id] != PKV_TOKEN_USER_DEFINED && !parse_special) continue;
        const char *t = tok->text + tok->off[id];
        if (t[0] == text[pos] && memcmp(t, text + pos, l) == 0) return id;
    }
    return -1;
}

pkv_status pkv_tokenize(const pkv_tokenizer *tok, const char *text, size_t len,
                        bool add_special, bool parse_special, int32_t *out, size_t max,
                        size_t *n_out) {
    return pkv_tokenize_spans(tok, text, len, add_special, parse_special, NULL, 0, out, max, n_out);
}

/* Does [pos, end) overlap one of the data spans (sorted pairs [start, end))? *at
 * is the first span that may still matter; positions only grow, so it only moves on. */
static bool in_data(const size_t *spans, size_t n_spans, size_t *at, size_t pos, size_t end) {
    while (*at < n_spans && spans[2 * *at + 1] <= pos) (*at)++;
    return *at < n_spans && spans[2 * *at] < end;
}

pkv_status pkv_tokenize_spans(const pkv_tokenizer *tok, const char *text, size_t len, bool add_special,
                              bool parse_special, const size_t *data_spans, size_t n_spans, int32_t *out,
                              size_t max, size_t *n_out) {
    if (!tok || !n_out || (!text && len) || (!out && max) || (n_spans && !data_spans))
        return pkv_err(PKV_ERR_INVALID, "pkv_tokenize: NULL argument");
    for (size_t k = 0; k < n_spans; k++)
        if (data_spans[2 * k] > data_spans[2 * k + 1] || data_spans[2 * k + 1] > len ||
            (k && data_spans[2 * k] < data_spans[2 * k - 1]))
            return pkv_err(PKV_ERR_INVALID, "pkv_tokenize: data span %zu [%zu, %zu) is out of order or past the "
                           "text's %zu bytes", k, data_spans[2 * k], data_spans[2 * k + 1], len);
    size_t span_at = 0;
    if (tok->kind == PKV_TOKENIZER_NONE) return no_vocab();
    pkv_idvec ids = {0};
    pkv_status s = PKV_OK;
    if (add_special && tok->add_bos && tok->bos >= 0) s = pkv_idvec_push(&ids, tok->bos);
    /* Split the text at special tokens: raw fragments go to the tokenizer proper. */
    size_t seg = 0, pos = 0;
    bool after_special = true;
    bool any_special = tok->n_special > 0;
    while (!s && pos < len) {
        int32_t id = any_special && tok->special_first[(unsigned char)text[pos]]
                         ? match_special(tok, text, len, pos, parse_special) : -1;
        /* request text is data: a special token's text that touches a data span is
         * not the special token (user-defined tokens are text tokens: kept) */
        if (id >= 0 && n_spans && tok->types[id] != PKV_TOKEN_USER_DEFINED &&
            in_data(data_spans, n_spans, &span_at, pos, pos + tok->len[id]))
            id = match_special(tok, text, len, pos, false);
        if (id < 0) {
            pos++;
            continue;
        }
        s = tokenize_raw(tok, text + seg, pos - seg, after_special, &ids);
        if (!s) s = pkv_idvec_push(&ids, id);
        pos += tok->len[id];
        seg = pos;
        after_special = true;
    }
    if (!s) s = tokenize_raw(tok, text + seg, len - seg, after_special, &ids);
    if (!s && add_special && tok->add_eos && tok->eos >= 0) s = pkv_idvec_push(&ids, tok->eos);
    if (!s) {
        if (ids.n > max) {
            *n_out = ids.n;
            s = pkv_err(PKV_ERR_INVALID, "pkv_tokenize: the output holds %zu tokens, %zu needed",
                        max, ids.n);
        } else {
            if (ids.n) memcpy(out, ids.v, ids.n * sizeof *out);
            *n_out = ids.n;
        }
    }
    pkv_free(ids.v);
    return s;
}

/* ------------------------------------------------------------- decode */

/* Piece bytes of id without the first `skip` into out[0..cap), returning the
 * count after the skip (nothing past cap is written). skip > 0 only for SPM,
 * whose dummy prefix space detokenize drops. */
static size_t piece_bytes(const pkv_tokenizer *tok, int32_t id, bool render_special, size_t skip, char *out,
                          size_t cap) {
    int t = tok->types[id];
    if (t == PKV_TOKEN_CONTROL || t == PKV_TOKEN_UNKNOWN || t == PKV_TOKEN_UNUSED ||
        t == PKV_TOKEN_USER_DEFINED) {
        if (!render_special && t != PKV_TOKEN_USER_DEFINED) return 0;
        size_t l = tok->len[id];
        if (skip >= l) return 0;
        if (cap) memcpy(out, tok->text + tok->off[id] + skip, PKV_MIN(l - skip, cap));
        return l - skip;
    }
    if (tok->kind == PKV_TOKENIZER_BPE) return pkv_bpe_piece(tok, id, out, cap);
    return pkv_spm_piece(tok, id, skip, out, cap);
}

/* Tokens after which tokenize starts a new raw fragment (with its dummy prefix), so
 * detokenize drops that prefix: the types cut out of text as specials. An unknown
 * token from SPM's fallback (a vocabulary without byte tokens) is lossy anyway. */
static bool is_special_type(int t) { return is_parsed_type(t); }

pkv_status pkv_token_piece(const pkv_tokenizer *tok, int32_t id, bool render_special,
                           char *buf, size_t size, size_t *n_out) {
    if (!tok || !n_out || (!buf && size))
        return pkv_err(PKV_ERR_INVALID, "pkv_token_piece: NULL argument");
    if (tok->kind == PKV_TOKENIZER_NONE) return no_vocab();
    if (id < 0 || id >= tok->n_tokens)
        return pkv_err(PKV_ERR_INVALID, "pkv_token_piece: token id %d is out of range [0, %d)",
                       id, tok->n_tokens);
    size_t n = piece_bytes(tok, id, render_special, 0, NULL, 0);
    *n_out = n;
    if (n > size)
        return pkv_err(PKV_ERR_INVALID, "pkv_token_piece: token %d needs %zu bytes, buffer has %zu",
                       id, n, size);
    piece_bytes(tok, id, render_special, 0, buf, n);
    if (n < size) buf[n] = 0;
    return PKV_OK;
}

/* Both passes of detokenize: with buf == NULL only counts. */
static size_t detok_pass(const pkv_tokenizer *tok, const int32_t *ids, size_t n,
                         bool render_special, char *buf) {
    size_t total = 0;
    bool strip = tok->add_space_prefix; /* strip the dummy space of the next text piece */
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (is_special_type(tok->types[id])) {
            size_t l = piece_bytes(tok, id, render_special, 0, buf ? buf + total : NULL, buf ? SIZE_MAX : 0);
            total += l;
            strip = tok->add_space_prefix;
            continue;
        }
        if (strip) {
            char first = 0;
            size_t l = piece_bytes(tok, id, render_special, 0, &first, 1);
            strip = false;
            if (l > 0 && first == ' ') {
                /* written from its second byte: the buffer may end at the piece's end */
                total += piece_bytes(tok, id, render_special, 1, buf ? buf + total : NULL, buf ? SIZE_MAX : 0);
                continue;
            }
        }
        total += piece_bytes(tok, id, render_special, 0, buf ? buf + total : NULL, buf ? SIZE_MAX : 0);
    }
    return total;
}

pkv_status pkv_detokenize(const pkv_tokenizer *tok, const int32_t *ids, size_t n,
                          bool render_special, char *buf, size_t size, size_t *n_out) {
    if (!tok || !n_out || (!ids && n) || (!buf && size))
        return pkv_err(PKV_ERR_INVALID, "pkv_detokenize: NULL argument");
    if (tok->kind == PKV_TOKENIZER_NONE) return no_vocab();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_tokens)
            return pkv_err(PKV_ERR_INVALID, "pkv_detokenize: ids[%zu] = %d is out of range [0, %d)",
                           i, ids[i], tok->n_tokens);
    size_t total = detok_pass(tok, ids, n, render_special, NULL);
    *n_out = total;
    if (total > size)
        return pkv_err(PKV_ERR_INVALID, "pkv_detokenize: the text needs %zu bytes, buffer has %zu",
                       total, size);
    detok_pass(tok, ids, n, render_special, buf);
    if (total < size) buf[total] = 0;
    return PKV_OK;
}
