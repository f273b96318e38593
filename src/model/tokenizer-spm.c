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

typedef struct spm_work {
    char *text;     /* [3 + 3n] escaped text */
    int32_t *start; /* [m] byte offset of each symbol */
    int32_t *len;   /* [m] byte length; 0 = merged away */
    int32_t *prev, *next;
    pkv_tok_heap heap;
} spm_work;

static void push_pair(const pkv_tokenizer *tok, spm_work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    int32_t size = w->len[l] + w->len[r];
    int32_t id = lookup_normal(tok, w->text + w->start[l], (size_t)size);
    if (id < 0) return;
    pkv_tok_heap_push(&w->heap, (pkv_tok_pair){-(double)tok->scores[id], l, r, size, 0});
}

pkv_status pkv_spm_tokenize(const pkv_tokenizer *tok, const char *text, size_t len,
                            bool add_prefix, pkv_idvec *out) {
    /* escaped text: at most 3 bytes per input byte plus the prefix */
    size_t tn, per = 3 + 4 * sizeof(int32_t) + 3 * sizeof(pkv_tok_pair);
    size_t m_max = len + 1; /* symbols: at most one per input byte plus the prefix */
    if (len > INT32_MAX / 4 || !pkv_mul_ok(per, m_max + 1, &tn))
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: text of %zu bytes is too large", len);
    char *mem = pkv_malloc(tn);
    if (!mem)
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate %zu bytes of scratch", tn);
    spm_work w;
    char *p = mem;
    w.heap.v = (pkv_tok_pair *)p;
    w.heap.cap = 3 * (m_max + 1);
    w.heap.n = 0;
    p += sizeof(pkv_tok_pair) * 3 * (m_max + 1);
    w.start = (int32_t *)p;
    w.len = w.start + (m_max + 1);
    w.prev = w.len + (m_max + 1);
    w.next = w.prev + (m_max + 1);
    w.text = (char *)(w.next + (m_max + 1));

    size_t tl = 0;
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
    for (int32_t k = 0; k + 1 < m; k++) push_pair(tok, &w, k, k + 1);
    while (w.heap.n) {
        pkv_tok_pair q = pkv_tok_heap_pop(&w.heap);
        if (w.len[q.left] == 0 || w.len[q.right] == 0 || w.next[q.left] != q.right ||
            w.len[q.left] + w.len[q.right] != q.a)
            continue; /* stale */
        w.len[q.left] += w.len[q.right];
        w.len[q.right] = 0;
        int32_t nx = w.next[q.right];
        w.next[q.left] = nx;
        if (nx >= 0) w.prev[nx] = q.left;
        push_pair(tok, &w, w.prev[q.left], q.left);
        push_pair(tok, &w, q.left, nx);
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
