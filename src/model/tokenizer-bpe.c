/* Byte-level BPE (tokenizer.ggml.model = "gpt2"): pre-tokenizer, merges, pieces.
 *
 * The pre-tokenizers follow these regular expressions, matched by hand:
 *   gpt2/default  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   llama-bpe     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *                 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   qwen2         as llama-bpe with \p{N} instead of \p{N}{1,3}
 * At each position the alternatives are tried in order and the first that matches
 * wins, with the greedy-then-backtrack semantics of a regex engine.
 *
 * Character classes: \p{L}, \p{N} and \s (Unicode White_Space) are exact for the
 * Unicode version of the generated table tokenizer-unicode.inc (see
 * tools/gen-tokenizer-unicode.py); code points unassigned there count as "other".
 * Bytes that are not valid UTF-8 count as "other" (one byte each), as U+FFFD would. */
#include "model/tokenizer-impl.h"

#include <string.h>

enum { C_LETTER, C_NUMBER, C_SPACE, C_OTHER };

typedef struct cp_range {
    uint32_t lo, hi;
    uint8_t cls;
} cp_range;

#include "model/tokenizer-unicode.inc"

static int cp_class(int32_t cp) {
    if (cp < 0) return C_OTHER;
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return C_LETTER;
        if (cp >= '0' && cp <= '9') return C_NUMBER;
        if ((cp >= 0x09 && cp <= 0x0D) || cp == ' ') return C_SPACE;
        return C_OTHER;
    }
    size_t lo = 0, hi = PKV_ARRAY_LEN(k_ranges);
    uint32_t u = (uint32_t)cp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (u < k_ranges[mid].lo)
            hi = mid;
        else if (u > k_ranges[mid].hi)
            lo = mid + 1;
        else
            return k_ranges[mid].cls;
    }
    return C_LETTER;
}

/* ------------------------------------------------------------- pre-tokenizer */

/* The patterns test code points against ASCII characters and U+017F (which folds to
 * 's') only, so one byte per code point says all they need: */
enum {
    CH_LONG_S = 0x80, /* U+017F */
    CH_OTHER = 0xFF,  /* any other code point above ASCII, or an invalid byte */
};

typedef struct cps_view {
    const uint8_t *cp; /* [n] the code point if ASCII, else CH_LONG_S or CH_OTHER */
    const uint8_t *cl; /* [n] classes */
    size_t n;
} cps_view;

/* Case folding for the contraction letters: ASCII, and U+017F (long s) folds to 's'. */
static int fold(int c) {
    if (c == CH_LONG_S) return 's';
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* Length (in code points) of a contraction 's 't 're 've 'm 'll 'd at i, or 0. */
static size_t match_contraction(const cps_view *v, size_t i, bool icase) {
    if (v->cp[i] != '\'' || i + 1 >= v->n) return 0;
    int a = v->cp[i + 1], b = i + 2 < v->n ? v->cp[i + 2] : -1;
    if (icase) a = fold(a), b = fold(b);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

static size_t run_of(const cps_view *v, size_t i, int cls) {
    while (i < v->n && v->cl[i] == cls) i++;
    return i;
}

static bool is_crlf(int c) { return c == '\r' || c == '\n'; }

/* \s+(?!\S) then \s+, from i where cl[i] is space: the end of the match. */
static size_t match_spaces(const cps_view *v, size_t i) {
    size_t j = run_of(v, i, C_SPACE);
    if (j == v->n || j - i == 1) return j; /* at the end, or a lone space before \S */
    return j - 1; /* leave the last space to join the next piece */
}

static size_t pretok_next_gpt2(const cps_view *v, size_t i) {
    size_t k = match_contraction(v, i, false);
    if (k) return i + k;
    size_t s = i + (v->cp[i] == ' ' && i + 1 < v->n && v->cl[i + 1] != C_SPACE);
    int c = v->cl[s];
    if (c == C_LETTER || c == C_NUMBER || c == C_OTHER) return run_of(v, s, c);
    return match_spaces(v, i);
}

static size_t pretok_next_llama3(const cps_view *v, size_t i, size_t max_digits) {
    size_t k = match_contraction(v, i, true);
    if (k) return i + k;
    int c = v->cl[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c == C_LETTER) return run_of(v, i, C_LETTER);
    if (c != C_NUMBER && !is_crlf(v->cp[i]) && i + 1 < v->n && v->cl[i + 1] == C_LETTER)
        return run_of(v, i + 1, C_LETTER);
    /* \p{N}{1,max_digits} */
    if (c == C_NUMBER) {
        size_t j = i;
        while (j < v->n && j - i < max_digits && v->cl[j] == C_NUMBER) j++;
        return j;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t s = i + (v->cp[i] == ' ' && i + 1 < v->n && v->cl[i + 1] == C_OTHER);
    if (v->cl[s] == C_OTHER) {
        size_t j = run_of(v, s, C_OTHER);
        while (j < v->n && is_crlf(v->cp[j])) j++;
        return j;
    }
    /* \s*[\r\n]+ : up to the last CR/LF of the whitespace run */
    size_t j = run_of(v, i, C_SPACE), last = SIZE_MAX;
    for (size_t t = i; t < j; t++)
        if (is_crlf(v->cp[t])) last = t;
    if (last != SIZE_MAX) return last + 1;
    return match_spaces(v, i);
}

static size_t pretok_next(pkv_pretok pre, const cps_view *v, size_t i) {
    switch (pre) {
    case PKV_PRETOK_LLAMA3: return pretok_next_llama3(v, i, 3);
    case PKV_PRETOK_QWEN2: return pretok_next_llama3(v, i, 1);
    case PKV_PRETOK_GPT2: break;
    }
    return pretok_next_gpt2(v, i);
}

/* Scratch for pre-tokenizing a fragment of n bytes (6 bytes per code point). */
typedef struct pretok_work {
    void *mem;
    uint32_t *boff; /* [n_cp + 1] byte offset of each code point, then n */
    uint8_t *cp;    /* [n_cp] as cps_view.cp */
    uint8_t *cl;    /* [n_cp] classes */
    size_t n_cp;
} pretok_work;

/* On error nothing is allocated (w->mem is NULL). */
static pkv_status pretok_init(pretok_work *w, const char *text, size_t n) {
    memset(w, 0, sizeof *w);
    /* byte offsets are 32-bit to keep the scratch small */
    size_t sz;
    if (n > UINT32_MAX || !pkv_mul_ok(n + 1, sizeof(uint32_t) + 2, &sz))
        return pkv_err(PKV_ERR_INVALID, "tokenizer: text of %zu bytes is too large (the limit is "
                       "4 GiB - 1)", n);
    w->mem = pkv_malloc(sz);
    if (!w->mem)
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate %zu bytes of scratch for %zu "
                       "bytes of text", sz, n);
    w->boff = w->mem;
    w->cp = (uint8_t *)(w->boff + n + 1);
    w->cl = w->cp + n + 1;
    size_t at = 0, k = 0;
    const unsigned char *u = (const unsigned char *)text;
    while (at < n) {
        int32_t cp;
        size_t l = pkv_utf8_decode(u + at, n - at, &cp);
        w->cp[k] = cp >= 0 && cp < 0x80 ? (uint8_t)cp : cp == 0x17F ? CH_LONG_S : CH_OTHER;
        w->cl[k] = (uint8_t)cp_class(cp);
        w->boff[k] = (uint32_t)at;
        at += l;
        k++;
    }
    w->boff[k] = (uint32_t)n;
    w->n_cp = k;
    return PKV_OK;
}

pkv_status pkv_pretokenize(const char *pre, const char *text, size_t len, size_t *ends,
                           size_t max, size_t *n_out) {
    if (!pre || !n_out || (!text && len) || (!ends && max))
        return pkv_err(PKV_ERR_INVALID, "pkv_pretokenize: NULL argument");
    pkv_pretok p;
    if (!pkv_pretok_from_name(pre, &p))
        return pkv_err(PKV_ERR_NOT_FOUND, "pkv_pretokenize: unknown pattern \"%s\"", pre);
    pretok_work w;
    pkv_status s = pretok_init(&w, text, len);
    if (s) return s;
    cps_view v = {w.cp, w.cl, w.n_cp};
    size_t count = 0;
    for (size_t i = 0; i < v.n; count++) {
        size_t j = pretok_next(p, &v, i);
        if (count < max) ends[count] = w.boff[j];
        i = j;
    }
    pkv_free(w.mem);
    *n_out = count;
    if (count > max)
        return pkv_err(PKV_ERR_INVALID, "pkv_pretokenize: %zu pieces, room for %zu", count, max);
    return PKV_OK;
}

/* ------------------------------------------------------------- merges */

static uint64_t pair_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1; }

static size_t key_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static const pkv_merge_slot *find_merge(const pkv_tokenizer *tok, int32_t l, int32_t r) {
    if (!tok->merges || l < 0 || r < 0) return NULL;
    uint64_t key = pair_key(l, r);
    size_t mask = tok->n_merge_slots - 1;
    for (size_t i = key_hash(key) & mask;; i = (i + 1) & mask) {
        const pkv_merge_slot *m = &tok->merges[i];
        if (m->key1 == key) return m;
        if (!m->key1) return NULL;
    }
}

pkv_status pkv_bpe_init(pkv_tokenizer *tok, const pkv_vocab_desc *d) {
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t l = pkv_utf8_encode(pkv_bpe_byte_to_cp((uint8_t)b), u);
        tok->byte_id[b] = pkv_tok_lookup(tok, u, l);
    }
    if (d->n_merges == 0) return PKV_OK;
    size_t cap = 16;
    while (cap < 2 * (size_t)d->n_merges) cap *= 2;
    size_t maxlen = 0;
    for (int32_t i = 0; i < d->n_merges; i++) {
        if (!d->merges[i]) return pkv_err(PKV_ERR_FORMAT, "tokenizer: merge %d is NULL", i);
        size_t l = d->merge_lens ? d->merge_lens[i] : strlen(d->merges[i]);
        if (l > maxlen) maxlen = l;
    }
    tok->merges = pkv_calloc(cap, sizeof *tok->merges);
    char *cat = pkv_malloc(maxlen + 1);
    if (!tok->merges || !cat) {
        pkv_free(cat);
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate the merge table (%d merges)",
                       d->n_merges);
    }
    tok->n_merge_slots = cap;
    int32_t skipped = 0;
    for (int32_t i = 0; i < d->n_merges; i++) {
        const char *m = d->merges[i];
        size_t l = d->merge_lens ? d->merge_lens[i] : strlen(m);
        /* "left right": the first space after the first byte separates them (byte-level
         * tokens never contain a raw space) */
        const char *sp = l > 1 ? memchr(m + 1, ' ', l - 1) : NULL;
        if (!sp) {
            pkv_free(cat);
            return pkv_err(PKV_ERR_FORMAT, "tokenizer: merge %d \"%.*s\" is not \"left right\"",
                           i, (int)PKV_MIN(l, 64), m);
        }
        size_t ll = (size_t)(sp - m), rl = l - ll - 1;
        int32_t a = pkv_tok_lookup(tok, m, ll), b = pkv_tok_lookup(tok, sp + 1, rl);
        memcpy(cat, m, ll);
        memcpy(cat + ll, sp + 1, rl);
        int32_t r = pkv_tok_lookup(tok, cat, ll + rl);
        if (a < 0 || b < 0 || r < 0) {
            skipped++;
            continue;
        }
        uint64_t key = pair_key(a, b);
        size_t mask = cap - 1;
        for (size_t h = key_hash(key) & mask;; h = (h + 1) & mask) {
            pkv_merge_slot *slot = &tok->merges[h];
            if (slot->key1 == key) break; /* an earlier (better) rank stays */
            if (!slot->key1) {
                *slot = (pkv_merge_slot){key, i, r};
                break;
            }
        }
    }
    pkv_free(cat);
    if (skipped) PKV_DEBUG("tokenizer: %d of %d merges refer to tokens not in the vocabulary",
                           skipped, d->n_merges);
    return PKV_OK;
}

/* Scratch for BPE on one pre-token of up to n bytes: 28 bytes per byte. */
typedef struct bpe_work {
    void *mem;
    const pkv_tokenizer *tok;
    pkv_tok_cands heap; /* [2n] keys, priority = merge rank */
    int32_t *sym;       /* [n] token id of each symbol (-1: a byte without a token) */
    uint32_t *prev;     /* [n] previous symbol, NO_SYM at the first */
    uint32_t *next;     /* [n] next symbol, NO_SYM at the last and once merged away */
    /* [2n] byte-to-unicode text of the word (2 bytes per byte at most), only for the
     * whole-word lookup before the merges: it lives in the heap's memory */
    char *mapped;
} bpe_work;

#define NO_SYM UINT32_MAX /* pre-tokens are shorter than 4 GiB, so no index reaches it */

/* The merge of the pair now at key's left symbol if it has key's rank, else NULL
 * (the key is stale: that symbol was merged away, or the pair changed since). */
static const pkv_merge_slot *current_merge(const bpe_work *w, uint64_t key) {
    uint32_t l = (uint32_t)key, r = w->next[l];
    if (r == NO_SYM) return NULL;
    const pkv_merge_slot *m = find_merge(w->tok, w->sym[l], w->sym[r]);
    return m && (uint32_t)m->rank == (uint32_t)(key >> 32) ? m : NULL;
}

/* On error nothing is allocated (w->mem is NULL). */
static pkv_status bpe_work_init(bpe_work *w, const pkv_tokenizer *tok, size_t n) {
    memset(w, 0, sizeof *w);
    size_t sz;
    if (!pkv_mul_ok(n + 1, 2 * sizeof(uint64_t) + sizeof(int32_t) + 2 * sizeof(uint32_t), &sz))
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: a word of %zu bytes is too large", n);
    w->mem = pkv_malloc(sz);
    if (!w->mem)
        return pkv_err(PKV_ERR_NOMEM, "tokenizer: cannot allocate %zu bytes of scratch for a "
                       "word of %zu bytes", sz, n);
    w->tok = tok;
    w->heap = (pkv_tok_cands){.v = w->mem, .cap = 2 * (n + 1)};
    w->mapped = w->mem;
    w->sym = (int32_t *)(w->heap.v + w->heap.cap);
    w->prev = (uint32_t *)(w->sym + n + 1);
    w->next = w->prev + n + 1;
    return PKV_OK;
}

static void push_pair(bpe_work *w, uint32_t l, uint32_t r) {
    if (l == NO_SYM || r == NO_SYM) return;
    const pkv_merge_slot *m = find_merge(w->tok, w->sym[l], w->sym[r]);
    if (m) pkv_tok_cands_push(&w->heap, pkv_tok_cand((uint32_t)m->rank, l));
}

/* BPE on bytes text[b0..b1) (one pre-token of at most the size w was made for),
 * appending ids. */
static pkv_status bpe_word(bpe_work *w, const char *text, size_t b0, size_t b1, pkv_idvec *out) {
    const pkv_tokenizer *tok = w->tok;
    const unsigned char *u = (const unsigned char *)text;
    uint32_t n = (uint32_t)(b1 - b0);
    if (tok->pre == PKV_PRETOK_LLAMA3 && n > 1) {
        /* Llama 3's tokenizer ignores merges for a word that is itself a token */
        size_t ml = 0;
        for (size_t k = b0; k < b1; k++) ml += pkv_utf8_encode(pkv_bpe_byte_to_cp(u[k]), w->mapped + ml);
        int32_t id = pkv_tok_lookup(tok, w->mapped, ml);
        if (id >= 0 && tok->types[id] == PKV_TOKEN_NORMAL) return pkv_idvec_push(out, id);
    }
    for (uint32_t k = 0; k < n; k++) {
        w->sym[k] = tok->byte_id[u[b0 + k]];
        w->prev[k] = k ? k - 1 : NO_SYM;
        w->next[k] = k + 1 < n ? k + 1 : NO_SYM;
    }
    w->heap.n = 0;
    for (uint32_t k = 0; k + 1 < n; k++) push_pair(w, k, k + 1);
    while (w->heap.n) {
        uint64_t key = pkv_tok_cands_pop(&w->heap);
        const pkv_merge_slot *m = current_merge(w, key);
        if (!m) continue;
        uint32_t l = (uint32_t)key, r = w->next[l], nx = w->next[r];
        w->sym[l] = m->result;
        w->next[l] = nx;
        if (nx != NO_SYM) w->prev[nx] = l;
        w->next[r] = NO_SYM;
        push_pair(w, w->prev[l], l);
        push_pair(w, l, nx);
    }
    for (uint32_t k = 0; k != NO_SYM; k = w->next[k]) {
        int32_t id = w->sym[k];
        if (id < 0) {
            if (tok->unk < 0)
                return pkv_err(PKV_ERR_UNSUPPORTED, "tokenizer: byte 0x%02x has no token and "
                               "the vocabulary has no unknown token", u[b0 + k]);
            id = tok->unk;
        }
        pkv_status s = pkv_idvec_push(out, id);
        if (s) return s;
    }
    return PKV_OK;
}

pkv_status pkv_bpe_tokenize(const pkv_tokenizer *tok, const char *text, size_t len,
                            pkv_idvec *out) {
    pretok_work p;
    pkv_status s = pretok_init(&p, text, len);
    if (s) return s;
    cps_view v = {p.cp, p.cl, p.n_cp};
    /* The BPE scratch is sized for the longest pre-token, found by a first pass of
     * the (cheap) pre-tokenizer: text made of short words needs little. */
    size_t longest = 0;
    for (size_t i = 0; i < v.n;) {
        size_t j = pretok_next(tok->pre, &v, i);
        longest = PKV_MAX(longest, (size_t)(p.boff[j] - p.boff[i]));
        i = j;
    }
    bpe_work w;
    s = bpe_work_init(&w, tok, longest);
    for (size_t i = 0; i < v.n && !s;) {
        size_t j = pretok_next(tok->pre, &v, i);
        s = bpe_word(&w, text, p.boff[i], p.boff[j], out);
        i = j;
    }
    pkv_free(w.mem);
    pkv_free(p.mem);
    return s;
}

size_t pkv_bpe_piece(const pkv_tokenizer *tok, int32_t id, char *out, size_t cap) {
    const unsigned char *t = (const unsigned char *)tok->text + tok->off[id];
    size_t n = tok->len[id], k = 0, count = 0;
    while (k < n) {
        int32_t cp;
        size_t l = pkv_utf8_decode(t + k, n - k, &cp);
        int b = cp >= 0 ? pkv_bpe_cp_to_byte((uint32_t)cp) : -1;
        if (b >= 0) {
            if (count < cap) out[count] = (char)b;
            count++;
        } else { /* not from the byte table: the text as it is */
            for (size_t q = 0; q < l; q++, count++)
                if (count < cap) out[count] = (char)t[k + q];
        }
        k += l;
    }
    return count;
}
