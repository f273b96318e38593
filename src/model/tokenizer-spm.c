/* SentencePiece-style BPE (tokenizer.ggml.model = "llama").
 *
 * Spaces become U+2581 ("▁"), and a dummy "▁" is put in front of each raw-text
 * fragment (the start of the text, and the text after a special token) when
 * add_space_prefix is on. The text is cut into UTF-8 characters (an invalid byte is a
 * character of its own); then, repeatedly, the adjacent pair whose concatenation is
 * a normal token with the highest score is merged (ties: leftmost first). A final
 * piece that is not a token (only single characters can be, since merges only form
 * tokens) falls back to its bytes as <0xNN> tokens, or to the unknown token when the
 * vocabulary has no byte tokens. */
#include "model/tokenizer-impl.h"

#include <string.h>

static const char k_space[] = "\xE2\x96\x81"; /* U+2581 */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xNN>" text, or -1. */
static int byte_token_value(const char *t, size_t n) {
    if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
    int hi = hexval(t[3]), lo = hexval(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

pkv_status pkv_spm_init(pkv_tokenizer *tok, const pkv_vocab_desc *d) {
    tok->scores = pkv_calloc((size_t)tok->n_tokens, sizeof *tok->scores);
    if (!tok->scores)
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate %d scores", tok->n_tokens);
    for (int32_t i = 0; i < tok->n_tokens; i++) {
        tok->scores[i] = d->scores ? d->scores[i] : -(float)i;
        int b = byte_token_value(tok->text + tok->off[i], tok->len[i]);
        if (b < 0) continue;
        if (d->types && tok->types[i] != PKV_TOKEN_BYTE) continue;
        tok->types[i] = PKV_TOKEN_BYTE;
        if (tok->byte_id[b] < 0) tok->byte_id[b] = i;
    }
    return PKV_OK;
}

/* Normal token with text s[0..n), or -1. */
static int32_t lookup_normal(const pkv_tokenizer *tok, const char *s, size_t n) {
    int32_t id = pkv_tok_lookup(tok, s, n);
    if (id >= 0 && tok->types[id] != PKV_TOKEN_NORMAL && tok->types[id] != PKV_TOKEN_USER_DEFINED)
        return -1;
    return id;
}

/* Scratch for one fragment of len bytes, one allocation: 32 bytes per symbol (at
 * most one per byte, plus the prefix) and the escaped text (3 bytes per space). */
typedef struct spm_work {
    const pkv_tokenizer *tok;
    pkv_tok_cands heap;   /* [2m] keys, priority = score_priority of the pair's token */
    int32_t *start;       /* [m] byte offset of each symbol in text */
    int32_t *len;         /* [m] byte length; 0 = merged away */
    int32_t *prev, *next; /* [m] -1 = none */
    char *text;           /* [tl] escaped text */
} spm_work;

/* Heap priority of a score: higher scores first; -0 ties with +0 as in the float
 * comparison; NaN last. */
static uint32_t score_priority(float f) {
    if (f != f) return UINT32_MAX;
    if (f == 0) f = 0;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = u >> 31 ? ~u : u | 0x80000000u; /* now increasing with f */
    return ~u;
}

/* Priority of the token the symbols l and r (adjacent) would merge into, or -1. */
static int64_t pair_priority(const spm_work *w, int32_t l, int32_t r) {
    int32_t id = lookup_normal(w->tok, w->text + w->start[l], (size_t)(w->len[l] + w->len[r]));
    return id < 0 ? -1 : (int64_t)score_priority(w->tok->scores[id]);
}

static void push_pair(spm_work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    int64_t p = pair_priority(w, l, r);
    if (p >= 0) pkv_tok_cands_push(&w->heap, pkv_tok_cand((uint32_t)p, (uint32_t)l));
}

/* Whether key is the pair now at its left symbol (else stale: that symbol was
 * merged away, or the pair changed since, into one of another score). */
static bool is_current(const spm_work *w, uint64_t key) {
    int32_t l = (int32_t)(uint32_t)key;
    if (w->len[l] == 0 || w->next[l] < 0) return false;
    return pair_priority(w, l, w->next[l]) == (int64_t)(key >> 32);
}

pkv_status pkv_spm_tokenize(const pkv_tokenizer *tok, const char *text, size_t len,
                            bool add_prefix, pkv_idvec *out) {
    /* offsets into the escaped text (3 bytes per space) are int32 */
    if (len > INT32_MAX / 4)
        return pkv_err(PKV_ERR_INVALID, "tokenizer: text of %zu bytes is too large (the limit is "
                       "%d bytes)", len, INT32_MAX / 4);
    size_t tl = add_prefix ? 3 : 0;
    for (size_t i = 0; i < len; i++) tl += text[i] == ' ' ? 3 : 1;
    size_t m_max = len + 1; /* symbols: at most one per input byte plus the prefix */
    size_t tn;
    if (!pkv_mul_ok(m_max, 2 * sizeof(uint64_t) + 4 * sizeof(int32_t), &tn) ||
        !pkv_add_ok(tn, tl, &tn))
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: text of %zu bytes is too large", len);
    char *mem = pkv_malloc(tn);
    if (!mem)
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate %zu bytes of scratch", tn);
    spm_work w;
    w.tok = tok;
    w.heap = (pkv_tok_cands){.v = (uint64_t *)mem, .cap = 2 * m_max};
    w.start = (int32_t *)(w.heap.v + w.heap.cap);
    w.len = w.start + m_max;
    w.prev = w.len + m_max;
    w.next = w.prev + m_max;
    w.text = (char *)(w.next + m_max);

    tl = 0;
    if (add_prefix) {
        memcpy(w.text, k_space, 3);
        tl = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w.text + tl, k_space, 3);
            tl += 3;
        } else {
            w.text[tl++] = text[i];
        }
    }
    /* one symbol per UTF-8 character */
    int32_t m = 0;
    for (size_t at = 0; at < tl; m++) {
        int32_t cp;
        size_t l = pkv_utf8_decode((const unsigned char *)w.text + at, tl - at, &cp);
        w.start[m] = (int32_t)at;
        w.len[m] = (int32_t)l;
        w.prev[m] = m - 1;
        w.next[m] = at + l < tl ? m + 1 : -1;
        at += l;
    }
    for (int32_t k = 0; k + 1 < m; k++) push_pair(&w, k, k + 1);
    while (w.heap.n) {
        uint64_t key = pkv_tok_cands_pop(&w.heap);
        if (!is_current(&w, key)) continue;
        int32_t l = (int32_t)(uint32_t)key, r = w.next[l], nx = w.next[r];
        w.len[l] += w.len[r];
        w.len[r] = 0;
        w.next[l] = nx;
        if (nx >= 0) w.prev[nx] = l;
        push_pair(&w, w.prev[l], l);
        push_pair(&w, l, nx);
    }
    pkv_status s = PKV_OK;
    for (int32_t k = m ? 0 : -1; k >= 0 && !s; k = w.next[k]) {
        const char *t = w.text + w.start[k];
        int32_t id = lookup_normal(tok, t, (size_t)w.len[k]);
        if (id >= 0) {
            s = pkv_idvec_push(out, id);
            continue;
        }
        for (int32_t b = 0; b < w.len[k] && !s; b++) {
            int32_t bid = tok->byte_id[(unsigned char)t[b]];
            if (bid < 0) bid = tok->unk;
            if (bid < 0) {
                s = pkv_err(PKV_ERR_UNSUPPORTED, "tokenizer: byte 0x%02x has no token (no <0x%02X> "
                            "and no unknown token)", (unsigned char)t[b], (unsigned char)t[b]);
                break;
            }
            /* the unknown token stands for the whole character, not each byte */
            s = pkv_idvec_push(out, bid);
            if (bid == tok->unk) break;
        }
    }
    pkv_free(mem);
    return s;
}

size_t pkv_spm_piece(const pkv_tokenizer *tok, int32_t id, size_t skip, char *out, size_t cap) {
    const char *t = tok->text + tok->off[id];
    size_t n = tok->len[id];
    size_t count = 0; /* bytes of the whole piece so far; byte i goes to out[i - skip] */
#define EMIT(c)                                                        \
    do {                                                               \
        if (count >= skip && count - skip < cap) out[count - skip] = (c); \
        count++;                                                       \
    } while (0)
    int b = tok->types[id] == PKV_TOKEN_BYTE ? byte_token_value(t, n) : -1;
    if (b >= 0) {
        EMIT((char)b);
    } else {
        for (size_t k = 0; k < n;) {
            if (k + 3 <= n && memcmp(t + k, k_space, 3) == 0) {
                EMIT(' ');
                k += 3;
            } else {
                EMIT(t[k]);
                k++;
            }
        }
    }
#undef EMIT
    return count > skip ? count - skip : 0;
}
