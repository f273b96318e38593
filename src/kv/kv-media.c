/* Media chunks in a sequence: rows of embeddings (an image's, an audio window's)
 * that occupy token positions no vocabulary id describes. Each row's token id is a
 * negative "media id" derived from the chunk's content key and the row index, so
 * the prefix index, fork, swap, save/load and the disk tier, which already carry
 * token ids, key the rows by content. The sequence also records each chunk
 * (key, start, rows, flags): truncation into a chunk drops it whole, a shift may
 * not cut one, a prefix match never ends inside one, and a saved file names them.
 * docs/multimodal.md, "Media in the cache". */
#include "kv/kv-impl.h"

#include <string.h>

static uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define MEDIA_ID_BITS 30 /* ids -2 .. -(2^30 + 1): far from -1 ("no token") and from INT32_MIN */

uint64_t pkv_media_key(uint64_t media_hash, uint64_t projector_fingerprint) {
    return mix64(media_hash ^ mix64(projector_fingerprint + 0x6d656469614b4559ULL));
}

int32_t pkv_media_token(uint64_t key, int32_t row) {
    uint64_t h = mix64(key ^ mix64((uint64_t)(uint32_t)row + 0x9e3779b97f4a7c15ULL));
    return -2 - (int32_t)(h & ((1u << MEDIA_ID_BITS) - 1));
}

bool pkv_token_is_media(int32_t id) { return id <= -2 && id >= -2 - (int32_t)((1u << MEDIA_ID_BITS) - 1); }

/* ------------------------------------------------------------ records */

void pkv_kv_media_release(kv_seq *s) {
    pkv_free(s->media);
    s->media = NULL;
    s->n_media = s->cap_media = 0;
}

static pkv_status reserve(kv_seq *s, int n) {
    if (n <= s->cap_media) return PKV_OK;
    void *a = s->media;
    size_t cap = (size_t)s->cap_media;
    pkv_status st = pkv_grow(&a, &cap, (size_t)n, sizeof(pkv_kv_media));
    if (st) return pkv_err_prefix(st, "media records");
    s->media = a;
    s->cap_media = (int)PKV_MIN(cap, (size_t)INT32_MAX);
    return PKV_OK;
}

pkv_status pkv_kv_media_copy(kv_seq *dst, const kv_seq *src) {
    pkv_status st = reserve(dst, src->n_media);
    if (st) return st;
    if (src->n_media) memcpy(dst->media, src->media, (size_t)src->n_media * sizeof *dst->media);
    dst->n_media = src->n_media;
    return PKV_OK;
}

int64_t pkv_kv_media_cut(const kv_seq *s, int64_t n_keep) {
    for (int i = 0; i < s->n_media; i++) {
        const pkv_kv_media *m = &s->media[i];
        if (n_keep > m->start && n_keep < m->start + m->n_rows) return m->start;
    }
    return n_keep;
}

void pkv_kv_media_truncate(kv_seq *s, int64_t n) {
    while (s->n_media > 0 && s->media[s->n_media - 1].start + s->media[s->n_media - 1].n_rows > n) s->n_media--;
}

pkv_status pkv_kv_media_shift_check(const kv_seq *s, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    if (n_remove == 0 && pos_delta == 0) return PKV_OK;
    const int64_t cuts[2] = {start, start + n_remove};
    for (int i = 0; i < s->n_media; i++) {
        const pkv_kv_media *m = &s->media[i];
        for (int k = 0; k < 2; k++)
            if (cuts[k] > m->start && cuts[k] < m->start + m->n_rows)
                return pkv_err(PKV_ERR_INVALID, "shift of sequence %d: removing tokens [%lld, %lld) would cut media chunk "
                               "%d (tokens [%lld, %lld), key %016llx): remove or keep whole chunks", seq,
                               (long long)start, (long long)(start + n_remove), i, (long long)m->start,
                               (long long)(m->start + m->n_rows), (unsigned long long)m->key);
    }
    return PKV_OK;
}

void pkv_kv_media_shift_apply(kv_seq *s, int64_t start, int64_t n_remove) {
    int k = 0;
    for (int i = 0; i < s->n_media; i++) {
        pkv_kv_media m = s->media[i];
        if (m.start >= start && m.start + m.n_rows <= start + n_remove) continue; /* removed whole */
        if (m.start >= start + n_remove) m.start -= n_remove;
        s->media[k++] = m;
    }
    s->n_media = k;
}

pkv_status pkv_kv_media_verify(const pkv_kv_media *m, int n_media, const int32_t *tokens, int64_t n_tokens,
                               const char *what, bool every_id) {
    int64_t end = 0;
    for (int i = 0; i < n_media; i++) {
        if (m[i].n_rows < 1 || m[i].start < end || m[i].start > n_tokens || m[i].n_rows > n_tokens - m[i].start)
            return pkv_err(PKV_ERR_INVALID, "%s: media chunk %d (tokens [%lld, +%d)) is empty, overlaps the chunk before "
                           "it or lies outside the %lld tokens", what, i, (long long)m[i].start, m[i].n_rows,
                           (long long)n_tokens);
        if (m[i].flags & ~PKV_MEDIA_NON_CAUSAL)
            return pkv_err(PKV_ERR_INVALID, "%s: media chunk %d has unknown flags %#x", what, i, m[i].flags);
        for (int32_t r = 0; tokens && r < m[i].n_rows; r++)
            if (tokens[m[i].start + r] != pkv_media_token(m[i].key, r))
                return pkv_err(PKV_ERR_INVALID, "%s: token %lld holds id %d, but row %d of media chunk %d (key %016llx) "
                               "is id %d: the tokens are not that media's rows", what, (long long)(m[i].start + r),
                               tokens[m[i].start + r], r, i, (unsigned long long)m[i].key, pkv_media_token(m[i].key, r));
        if (every_id && tokens)
            for (int64_t t = end; t < m[i].start; t++)
                if (pkv_token_is_media(tokens[t]))
                    return pkv_err(PKV_ERR_INVALID, "%s: token %lld is a media row (id %d) outside every recorded media "
                                   "chunk", what, (long long)t, tokens[t]);
        end = m[i].start + m[i].n_rows;
    }
    for (int64_t t = end; every_id && tokens && t < n_tokens; t++)
        if (pkv_token_is_media(tokens[t]))
            return pkv_err(PKV_ERR_INVALID, "%s: token %lld is a media row (id %d) outside every recorded media chunk",
                           what, (long long)t, tokens[t]);
    return PKV_OK;
}

/* ------------------------------------------------------------- public */

int pkv_kv_media_count(const pkv_kv_cache *c, int32_t seq) {
    if (pkv_kv_seq_len(c, seq) < 0) return -1;
    return c->seqs[seq].n_media;
}

pkv_status pkv_kv_media_get(const pkv_kv_cache *c, int32_t seq, int i, pkv_kv_media *out) {
    kv_seq *s = pkv_kv_seq_get((pkv_kv_cache *)c, seq, "media record");
    if (!s) return PKV_ERR_NOT_FOUND;
    if (!out || i < 0 || i >= s->n_media)
        return pkv_err(PKV_ERR_INVALID, "media record %d of sequence %d: it has %d (or out is NULL)", i, seq, s->n_media);
    *out = s->media[i];
    return PKV_OK;
}

pkv_status pkv_kv_media_add(pkv_kv_cache *c, int32_t seq, const pkv_kv_media *m) {
    kv_seq *s = pkv_kv_seq_get(c, seq, "media record");
    if (!s) return PKV_ERR_NOT_FOUND;
    if (!m) return pkv_err(PKV_ERR_INVALID, "media record: NULL");
    int64_t end = s->n_media ? s->media[s->n_media - 1].start + s->media[s->n_media - 1].n_rows : 0;
    char what[64];
    snprintf(what, sizeof what, "media record in sequence %d", seq);
    if (m->start < end)
        return pkv_err(PKV_ERR_INVALID, "%s: the chunk starts at token %lld, before the end of the last one (%lld)", what,
                       (long long)m->start, (long long)end);
    if (m->n_rows < 1 || m->start > s->n_tokens || m->n_rows > s->n_tokens - m->start)
        return pkv_err(PKV_ERR_INVALID, "%s: rows [%lld, +%d) are not all in its %lld tokens (decode them first)", what,
                       (long long)m->start, m->n_rows, (long long)s->n_tokens);
    int32_t *tok = pkv_malloc((size_t)m->n_rows * sizeof *tok);
    if (!tok) return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", what);
    pkv_status st = pkv_kv_seq_tokens(c, seq, m->start, m->n_rows, tok, NULL);
    pkv_kv_media one = *m;
    one.start = 0;
    if (!st) st = pkv_kv_media_verify(&one, 1, tok, m->n_rows, what, false);
    pkv_free(tok);
    if (!st) st = reserve(s, s->n_media + 1);
    if (st) return st;
    s->media[s->n_media++] = *m;
    return PKV_OK;
}

/* ------------------------------------------------------------------ kind */

/* The records of a sequence's media chunks: a chunk is one input, kept or cut
 * whole. They live in kv_seq (the full pool releases them with it). */
static bool media_present(const pkv_kv_cache *c) { return c != NULL; }

static pkv_status media_fork(pkv_kv_cache *c, int32_t parent, int32_t *child) {
    return pkv_kv_media_copy(&c->seqs[*child], &c->seqs[parent]);
}

/* Into a media chunk: the whole chunk goes (its rows are one input). */
static int64_t media_cut(const pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    return pkv_kv_media_cut(&c->seqs[seq], n_keep);
}

static pkv_status media_truncate(pkv_kv_cache *c, int32_t seq, int64_t n_keep) {
    pkv_kv_media_truncate(&c->seqs[seq], n_keep);
    return PKV_OK;
}

static pkv_status media_shift_check(const pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove,
                                    int32_t pos_delta) {
    return pkv_kv_media_shift_check(&c->seqs[seq], seq, start, n_remove, pos_delta);
}

static pkv_status media_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    (void)pos_delta;
    pkv_kv_media_shift_apply(&c->seqs[seq], start, n_remove);
    return PKV_OK;
}

/* The media trailer after the checksum (kv-file.c, "Media trailer"): only when
 * the sequence records chunks, so files without media are as before. part (load):
 * ptr the records read, a their count. */

static pkv_status media_save(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    (void)part;
    (void)il;
    const kv_seq *s = &c->seqs[f->seq];
    if (at != KV_FILE_TAIL || s->n_media == 0) return PKV_OK;
    size_t tb = 16 + (size_t)s->n_media * 24;
    uint8_t *tr = pkv_malloc(tb + 8), *q = tr;
    if (!tr) return pkv_err(PKV_ERR_NOMEM, "save: out of memory");
    memcpy(q, "PKVMEDIA", 8);
    q += 8;
    kv_put32(&q, (uint32_t)s->n_media);
    kv_put32(&q, 0);
    for (int i = 0; i < s->n_media; i++) {
        kv_put64(&q, s->media[i].key);
        kv_put64(&q, (uint64_t)s->media[i].start);
        kv_put32(&q, (uint32_t)s->media[i].n_rows);
        kv_put32(&q, s->media[i].flags);
    }
    kv_put64(&q, pkv_hash64(tr, tb, f->h));
    pkv_status st = PKV_OK;
    if (fwrite(tr, 1, tb + 8, f->out) != tb + 8)
        st = pkv_err(PKV_ERR_IO, "save: writing the media of %s failed", f->path);
    pkv_free(tr);
    return st;
}

/* The trailer, when the rest of the file is one (its checksum); then the
 * chunks, none without a trailer, against the file's tokens: each row's id, and
 * every media id inside a chunk. */
static pkv_status media_load_check(pkv_kv_cache *c, kv_file *f, kv_file_part *part, kv_file_at at, int il) {
    (void)c;
    (void)il;
    if (at != KV_FILE_TAIL) return PKV_OK;
    size_t rem = f->size - f->end;
    const uint8_t *q = f->data + f->end;
    uint32_t nm = 0;
    if (rem >= 24 && memcmp(q, "PKVMEDIA", 8) == 0) {
        q += 8;
        nm = kv_get32(&q);
    }
    if (rem > 0 && (nm == 0 || nm > rem / 24 || rem != 16 + (size_t)nm * 24 + 8))
        return PKV_OK; /* not a media section: the frame reports the bytes left over */
    size_t tb = 16 + (size_t)nm * 24;
    if (nm) {
        uint64_t ms, mh = pkv_hash64(f->data + f->end, tb, f->h);
        memcpy(&ms, f->data + f->end + tb, 8);
        if (ms != mh)
            return pkv_err(PKV_ERR_FORMAT, "%s: media section checksum mismatch (stored %016llx, computed %016llx): "
                           "the file is corrupt", f->path, (unsigned long long)ms, (unsigned long long)mh);
    }
    pkv_kv_media *media = pkv_malloc((size_t)(nm ? nm : 1) * sizeof *media);
    int32_t *ftok = pkv_malloc((size_t)(f->n_tokens ? f->n_tokens : 1) * sizeof *ftok);
    if (!media || !ftok) {
        pkv_free(media);
        pkv_free(ftok);
        return pkv_err(PKV_ERR_NOMEM, "load of %s: out of memory", f->path);
    }
    q = f->data + f->end + 16;
    for (uint32_t i = 0; i < nm; i++) {
        media[i].key = kv_get64(&q);
        uint64_t start = kv_get64(&q);
        media[i].start = start > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)start;
        uint32_t rows = kv_get32(&q);
        media[i].n_rows = rows > (uint32_t)INT32_MAX ? 0 : (int32_t)rows;
        media[i].flags = kv_get32(&q);
    }
    memcpy(ftok, f->data + f->tok_off, (size_t)f->n_tokens * 4);
    char what[300];
    snprintf(what, sizeof what, "load of %s", f->path);
    pkv_status st = pkv_kv_media_verify(media, (int)nm, ftok, f->n_tokens, what, true);
    pkv_free(ftok);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        pkv_free(media);
        return pkv_err(PKV_ERR_FORMAT, "%s", msg);
    }
    if (nm) {
        part->ptr = media;
        part->a = nm;
        f->end = f->size;
    } else {
        pkv_free(media);
    }
    return PKV_OK;
}

/* The records go to the new sequence (the full pool made it). */
static pkv_status media_load(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    kv_seq *s = &c->seqs[f->seq];
    if (!part->ptr) return PKV_OK;
    s->media = part->ptr;
    s->n_media = s->cap_media = (int)part->a;
    part->ptr = NULL;
    return PKV_OK;
}

static void media_load_undo(pkv_kv_cache *c, kv_file *f, kv_file_part *part) {
    (void)part;
    pkv_kv_media_release(&c->seqs[f->seq]);
}

const pkv_mem_kind kv_kind_media = {
    .name = "media chunks",
    .present = media_present,
    .fork = media_fork,
    .cut = media_cut,
    .truncate = media_truncate,
    .shift_check = media_shift_check,
    .shift = media_shift,
    .save = media_save,
    .load_check = media_load_check,
    .load = media_load,
    .load_undo = media_load_undo,
};
