/* A small byte-level BPE vocabulary, built deterministically in memory for the test
 * models of `pagekv mkmodel` (see pkv_vocab_builtin_create in tokenizer.h).
 *
 * Building: tokens are kept as raw bytes while merges are added; each word (plain and
 * with a leading space) is run through BPE with the merges so far, and while it is
 * more than one token the first two pieces are merged by a new merge (the lowest
 * priority so far, so words built earlier keep tokenizing to one token). At the end
 * every text is written in GPT-2 byte-to-unicode form ("Ġthe"). */
#include "model/tokenizer-impl.h"

#include <stdio.h>
#include <string.h>

static const char *const k_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
    "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
    "she", "other", "its", "may", "these", "what", "them", "than", "some", "him", "time",
    "into", "only", "do", "could", "new", "about", "two", "then", "first", "also", "any",
    "like", "our", "over", "out", "did", "should", "such", "made", "my", "your", "most",
    "after", "very", "know", "how", "many", "must", "before", "through", "back", "years",
    "where", "much", "way", "well", "down", "good", "because", "each", "those", "people",
    "same", "work", "long", "make", "life", "just", "here", "both", "between", "under",
    "never", "being", "day", "world", "still", "own", "see", "man", "used", "last",
    "might", "great", "little", "old", "while", "since", "part", "place", "us", "off",
    "found", "another", "even", "three", "without", "again", "take", "every", "number",
    "small", "house", "right", "large", "hand", "high", "home", "point", "need", "water",
    "think", "say", "said", "look", "come", "came", "went", "go", "get", "give", "find",
    "use", "want", "tell", "help", "keep", "start", "show", "hear", "play", "run", "move",
    "live", "believe", "bring", "write", "read", "learn", "change", "turn", "open", "name",
    "word", "words", "text", "model", "token", "cache", "page", "memory", "data", "system",
    "value", "state", "group", "order", "form", "end", "line", "light", "city", "country",
    "school", "family", "story", "question", "answer", "example", "problem", "idea",
    "hello", "yes", "why", "who", "now", "today", "night", "year", "week", "hour",
    "cat", "dog", "tree", "sun", "moon", "star", "sea", "river", "road", "car", "book",
    "food", "music", "color", "red", "blue", "green", "black", "white", "big", "short",
    "ing", "ed", "er", "ly", "tion", "es", "ment", "ness", "able", "est", "ful", "less",
    "pre", "re", "un", "con", "com", "pro", "dis", "ous", "ive", "al", "ity", "ic",
};

typedef struct vb {
    int32_t n_cap;    /* total token budget */
    int32_t n_tok;
    char *raw;        /* [raw_cap] token raw bytes, back to back */
    size_t raw_n, raw_cap;
    size_t *off;      /* [n_cap] */
    size_t *len;      /* [n_cap] */
    int32_t *type;    /* [n_cap] */
    int32_t *map;     /* [n_map] raw text -> id + 1 */
    size_t n_map;
    int32_t n_mer;
    int32_t *ml, *mr; /* [n_cap] merge pairs, rank = index */
    uint64_t *mkey;   /* [n_map] pair key + 1 -> rank in mval */
    int32_t *mval;    /* [n_map] */
} vb;

static int32_t vb_find(const vb *b, const char *s, size_t n) {
    size_t mask = b->n_map - 1;
    for (size_t h = pkv_hash64(s, n, 0) & mask;; h = (h + 1) & mask) {
        int32_t slot = b->map[h];
        if (!slot) return -1;
        int32_t id = slot - 1;
        if (b->len[id] == n && memcmp(b->raw + b->off[id], s, n) == 0) return id;
    }
}

/* Append a token (raw bytes); returns its id, or -1 when out of memory. The caller
 * checks the budget. */
static int32_t vb_add(vb *b, const char *s, size_t n, int32_t type) {
    if (b->raw_n + n > b->raw_cap && pkv_grow((void **)&b->raw, &b->raw_cap, b->raw_n + n, 1))
        return -1;
    int32_t id = b->n_tok++;
    memcpy(b->raw + b->raw_n, s, n);
    b->off[id] = b->raw_n;
    b->len[id] = n;
    b->type[id] = type;
    b->raw_n += n;
    size_t mask = b->n_map - 1;
    size_t h = pkv_hash64(s, n, 0) & mask;
    while (b->map[h]) h = (h + 1) & mask;
    b->map[h] = id + 1;
    return id;
}

static uint64_t vb_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1; }

static int32_t vb_rank(const vb *b, int32_t l, int32_t r) {
    uint64_t k = vb_key(l, r);
    size_t mask = b->n_map - 1;
    for (size_t h = (size_t)(k * 0x9e3779b97f4a7c15ull >> 20) & mask;; h = (h + 1) & mask) {
        if (b->mkey[h] == k) return b->mval[h];
        if (!b->mkey[h]) return -1;
    }
}

static void vb_add_merge(vb *b, int32_t l, int32_t r) {
    uint64_t k = vb_key(l, r);
    size_t mask = b->n_map - 1;
    size_t h = (size_t)(k * 0x9e3779b97f4a7c15ull >> 20) & mask;
    while (b->mkey[h]) h = (h + 1) & mask;
    b->mkey[h] = k;
    b->mval[h] = b->n_mer;
    b->ml[b->n_mer] = l;
    b->mr[b->n_mer] = r;
    b->n_mer++;
}

/* Merge result of rank: the token whose raw text is left + right. */
static int32_t vb_result(const vb *b, int32_t rank, char *tmp) {
    int32_t l = b->ml[rank], r = b->mr[rank];
    memcpy(tmp, b->raw + b->off[l], b->len[l]);
    memcpy(tmp + b->len[l], b->raw + b->off[r], b->len[r]);
    return vb_find(b, tmp, b->len[l] + b->len[r]);
}

/* BPE of raw bytes w[0..n) (n <= 64) with the merges so far: pieces into ids, count. */
static int vb_bpe(const vb *b, const char *w, int n, int32_t *ids) {
    char tmp[128];
    for (int i = 0; i < n; i++) ids[i] = (unsigned char)w[i];
    for (;;) {
        int best = -1;
        int32_t best_rank = INT32_MAX;
        for (int i = 0; i + 1 < n; i++) {
            int32_t r = vb_rank(b, ids[i], ids[i + 1]);
            if (r >= 0 && r < best_rank) best_rank = r, best = i;
        }
        if (best < 0) return n;
        ids[best] = vb_result(b, best_rank, tmp);
        memmove(ids + best + 1, ids + best + 2, sizeof *ids * (size_t)(n - best - 2));
        n--;
    }
}

/* Add merges until raw word w is one token (or the budget is spent). */
static pkv_status vb_word(vb *b, const char *w, int n) {
    int32_t ids[64];
    char tmp[128];
    for (;;) {
        int k = vb_bpe(b, w, n, ids);
        if (k <= 1) return PKV_OK;
        size_t ll = b->len[ids[0]], rl = b->len[ids[1]];
        memcpy(tmp, b->raw + b->off[ids[0]], ll);
        memcpy(tmp + ll, b->raw + b->off[ids[1]], rl);
        if (vb_find(b, tmp, ll + rl) < 0) {
            if (b->n_tok >= b->n_cap) return PKV_OK; /* budget spent */
            if (vb_add(b, tmp, ll + rl, PKV_TOKEN_NORMAL) < 0)
                return pkv_err(PKV_ERR_NOMEM, "builtin vocab: out of memory");
        }
        if (b->n_mer >= b->n_cap) return PKV_OK;
        vb_add_merge(b, ids[0], ids[1]);
    }
}

typedef struct builtin_desc {
    pkv_vocab_desc desc; /* first: the public part */
    char *text;          /* all token and merge texts */
    const char **tokens; /* [n_tokens] */
    size_t *token_lens;  /* [n_tokens] */
    int32_t *types;      /* [n_tokens] */
    const char **merges; /* [n_merges] */
    size_t *merge_lens;  /* [n_merges] */
} builtin_desc;

void pkv_vocab_builtin_free(pkv_vocab_desc *desc) {
    if (!desc) return;
    builtin_desc *bd = (builtin_desc *)desc;
    pkv_free(bd->text);
    pkv_free(bd->tokens);
    pkv_free(bd->token_lens);
    pkv_free(bd->types);
    pkv_free(bd->merges);
    pkv_free(bd->merge_lens);
    pkv_free(bd);
}

static void vb_free(vb *b) {
    pkv_free(b->raw);
    pkv_free(b->off);
    pkv_free(b->len);
    pkv_free(b->type);
    pkv_free(b->map);
    pkv_free(b->ml);
    pkv_free(b->mr);
    pkv_free(b->mkey);
    pkv_free(b->mval);
}

/* Mapped (byte-to-unicode) length of raw bytes, or the raw length for special text. */
static size_t mapped_len(const vb *b, int32_t id) {
    if (b->type[id] != PKV_TOKEN_NORMAL) return b->len[id];
    size_t n = 0;
    char u[4];
    for (size_t i = 0; i < b->len[id]; i++)
        n += pkv_utf8_encode(pkv_bpe_byte_to_cp((uint8_t)b->raw[b->off[id] + i]), u);
    return n;
}

static size_t write_mapped(const vb *b, int32_t id, char *out) {
    if (b->type[id] != PKV_TOKEN_NORMAL) {
        memcpy(out, b->raw + b->off[id], b->len[id]);
        return b->len[id];
    }
    size_t n = 0;
    for (size_t i = 0; i < b->len[id]; i++)
        n += pkv_utf8_encode(pkv_bpe_byte_to_cp((uint8_t)b->raw[b->off[id] + i]), out + n);
    return n;
}

static pkv_status vb_build(vb *b, const char *const *specials, int n_specials) {
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        if (vb_add(b, &ch, 1, PKV_TOKEN_NORMAL) < 0) return PKV_ERR_NOMEM;
    }
    for (int i = 0; i < n_specials; i++)
        if (vb_add(b, specials[i], strlen(specials[i]), PKV_TOKEN_CONTROL) < 0) return PKV_ERR_NOMEM;
    pkv_status s;
    for (size_t i = 0; i < PKV_ARRAY_LEN(k_words); i++) {
        char w[64];
        int n = snprintf(w, sizeof w, "%s", k_words[i]);
        if ((s = vb_word(b, w, n))) return s;
        n = snprintf(w, sizeof w, " %s", k_words[i]);
        if ((s = vb_word(b, w, n))) return s;
    }
    /* then letter pairs, with and without a leading space */
    for (int pass = 0; pass < 2; pass++)
        for (char x = 'a'; x <= 'z'; x++)
            for (char y = 'a'; y <= 'z'; y++) {
                char w[3] = {' ', x, y};
                int n = pass == 0 ? 2 : 3;
                if ((s = vb_word(b, pass == 0 ? w + 1 : w, n))) return s;
            }
    /* then letter triples and quadruples, so a vocabulary of any size prints as text
     * (a 151,936-token one used to be mostly reserved control tokens that print nothing) */
    for (int len = 3; len <= 4 && b->n_tok < b->n_cap; len++)
        for (int pass = 0; pass < 2 && b->n_tok < b->n_cap; pass++)
            for (int code = 0; code < (len == 3 ? 26 * 26 * 26 : 26 * 26 * 26 * 26) && b->n_tok < b->n_cap; code++) {
                char w[6] = {' '};
                for (int k = len - 1, c = code; k >= 0; k--, c /= 26) w[1 + k] = (char)('a' + c % 26);
                if ((s = vb_word(b, pass == 0 ? w + 1 : w, pass == 0 ? len : len + 1))) return s;
            }
    for (int32_t r = 0; b->n_tok < b->n_cap; r++) {
        char w[32];
        int n = snprintf(w, sizeof w, "<|reserved_%d|>", r);
        if (vb_add(b, w, (size_t)n, PKV_TOKEN_UNUSED) < 0) return PKV_ERR_NOMEM;
    }
    return PKV_OK;
}

pkv_vocab_desc *pkv_vocab_builtin_create_specials(int32_t n_tokens, const char *const *specials,
                                                  int n_specials) {
    if (n_tokens < 300 || n_tokens > 1000000) {
        pkv_err(PKV_ERR_INVALID, "builtin vocab: %d tokens requested, must be in [300, 1000000]",
                n_tokens);
        return NULL;
    }
    if (n_specials < 1 || n_specials > PKV_VOCAB_BUILTIN_MAX_SPECIALS || !specials) {
        pkv_err(PKV_ERR_INVALID, "builtin vocab: %d special tokens, must be 1 to %d", n_specials,
                PKV_VOCAB_BUILTIN_MAX_SPECIALS);
        return NULL;
    }
    for (int i = 0; i < n_specials; i++) {
        /* a text the merges could build, or a repeated one, would give two ids one text */
        size_t l = specials[i] ? strlen(specials[i]) : 0;
        bool dup = false;
        for (int j = 0; l && j < i && !dup; j++) dup = !strcmp(specials[i], specials[j]);
        if (l < 2 || l > 64 || (specials[i][0] != '<' && specials[i][0] != '[') || dup) {
            pkv_err(PKV_ERR_INVALID,
                    "builtin vocab: special token %d \"%s\" must be 2 to 64 bytes starting with '<' or '[', "
                    "and appear once", i, specials[i] ? specials[i] : "(null)");
            return NULL;
        }
    }
    vb b;
    memset(&b, 0, sizeof b);
    b.n_cap = n_tokens;
    b.n_map = 1024;
    while (b.n_map < 2 * (size_t)n_tokens) b.n_map *= 2;
    size_t n = (size_t)n_tokens;
    b.off = pkv_calloc(n, sizeof *b.off);
    b.len = pkv_calloc(n, sizeof *b.len);
    b.type = pkv_calloc(n, sizeof *b.type);
    b.map = pkv_calloc(b.n_map, sizeof *b.map);
    b.ml = pkv_calloc(n, sizeof *b.ml);
    b.mr = pkv_calloc(n, sizeof *b.mr);
    b.mkey = pkv_calloc(b.n_map, sizeof *b.mkey);
    b.mval = pkv_calloc(b.n_map, sizeof *b.mval);
    builtin_desc *bd = NULL;
    if (!b.off || !b.len || !b.type || !b.map || !b.ml || !b.mr || !b.mkey || !b.mval ||
        vb_build(&b, specials, n_specials) != PKV_OK)
        goto nomem;
    bd = pkv_calloc(1, sizeof *bd);
    if (!bd) goto nomem;
    size_t total = 0;
    for (int32_t i = 0; i < b.n_tok; i++) total += mapped_len(&b, i);
    for (int32_t i = 0; i < b.n_mer; i++) total += mapped_len(&b, b.ml[i]) + 1 + mapped_len(&b, b.mr[i]);
    bd->text = pkv_malloc(total);
    bd->tokens = pkv_calloc(n, sizeof *bd->tokens);
    bd->token_lens = pkv_calloc(n, sizeof *bd->token_lens);
    bd->types = pkv_calloc(n, sizeof *bd->types);
    bd->merges = pkv_calloc((size_t)b.n_mer, sizeof *bd->merges);
    bd->merge_lens = pkv_calloc((size_t)b.n_mer, sizeof *bd->merge_lens);
    if (!bd->text || !bd->tokens || !bd->token_lens || !bd->types || !bd->merges || !bd->merge_lens)
        goto nomem;
    size_t at = 0;
    for (int32_t i = 0; i < b.n_tok; i++) {
        bd->tokens[i] = bd->text + at;
        bd->token_lens[i] = write_mapped(&b, i, bd->text + at);
        bd->types[i] = b.type[i];
        at += bd->token_lens[i];
    }
    for (int32_t i = 0; i < b.n_mer; i++) {
        bd->merges[i] = bd->text + at;
        size_t l = write_mapped(&b, b.ml[i], bd->text + at);
        bd->text[at + l] = ' ';
        l += 1 + write_mapped(&b, b.mr[i], bd->text + at + l + 1);
        bd->merge_lens[i] = l;
        at += l;
    }
    pkv_vocab_desc *d = &bd->desc;
    *d = pkv_vocab_desc_default();
    d->model = "gpt2";
    d->pre = "llama-bpe";
    d->n_tokens = n_tokens;
    d->tokens = bd->tokens;
    d->token_lens = bd->token_lens;
    d->types = bd->types;
    d->n_merges = b.n_mer;
    d->merges = bd->merges;
    d->merge_lens = bd->merge_lens;
    d->add_bos = 0;
    d->add_eos = 0;
    vb_free(&b);
    return d;
nomem:
    vb_free(&b);
    pkv_vocab_builtin_free(bd ? &bd->desc : NULL);
    pkv_err(PKV_ERR_NOMEM, "builtin vocab: out of memory building %d tokens", n_tokens);
    return NULL;
}

pkv_vocab_desc *pkv_vocab_builtin_create(int32_t n_tokens) {
    static const char *const specials[] = {"<|begin_of_text|>", "<|end_of_text|>"};
    pkv_vocab_desc *d = pkv_vocab_builtin_create_specials(n_tokens, specials, 2);
    if (!d) return NULL;
    d->bos_id = 256;
    d->eos_id = 257;
    d->add_bos = 1;
    return d;
}
