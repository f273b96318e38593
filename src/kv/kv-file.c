/* Save / load one sequence.
 *
 * Version 3 is written by caches with recurrent layers (state_per_head > 0), with
 * or without sliding-window layers: after exact_until come u64 w_first, u64 w_len
 * (as in version 2; 0 and n_tokens without window layers) and u64 state_len (the
 * tokens the live state has taken in, <= n_tokens). A recurrent layer's row in the
 * geometry is {n_kv_heads, 0, state_per_head, 0x80000000}, and its payload
 * section, in place of K and V, is its live state f32 [n_kv_heads][state_per_head]
 * (heads in the layer's order, each head's state parts concatenated, whatever the
 * sharding: pkv_kv_layer_desc.state_part). A version-3 file loads only into a cache
 * of equal layout fingerprint (which covers the state sizes and parts).
 *
 * Version 2 is written by caches with sliding-window layers: after exact_until
 * come u64 w_first, u64 w_len, and each window layer's K and V sections hold
 * tokens [w_first, w_len) only (w_first is page-aligned: the pages before it had
 * left the window; w_len < n_tokens when the window layers were behind, to be
 * recomputed). A version-2 file loads only into a cache of equal layout
 * fingerprint (which covers the windows); version 1 is as below.
 *
 * File format, version 1, all integers little-endian (the host order of every
 * supported platform):
 *   "PKVKVSEQ"                          8 bytes magic
 *   u32 version, u32 n_layers, u32 page_size, u32 reserved (0)
 *   u64 layout fingerprint               (pkv_kv_layout_fingerprint)
 *   n_layers x {u32 n_kv_heads, u32 head_dim_k, u32 head_dim_v, u32 dtypes}
 *       dtypes: the K type (pkv_type) in bits 0-7; when V's type differs, V's
 *       type + 1 in bits 8-15 (0 = V as K, so files of f16/f32 caches are as before)
 *   u64 n_tokens, u64 sequence fingerprint, u64 exact_until (first token moved by a
 *       shift, never published for prefix reuse; 2^63-1 when none)
 *   i32 tokens[n_tokens], i32 positions[n_tokens]
 *   per layer: K dtype_k [n_tokens][n_kv_heads][head_dim_k], V dtype_v [n_tokens][n_kv_heads][head_dim_v]
 *       (quantized types: each head's row is head_dim / 32 GGUF blocks, stored as is)
 *   u64 checksum: h = pkv_hash64(header, 0), then h = pkv_hash64(section, h) for
 *       each layer's K and V section in order.
 * The payload is in token-then-head order for the whole layer, so a file loads
 * into any sharding and any devices of the same geometry.
 *
 * Media trailer (any version; only when the sequence records media chunks, so
 * files without media are unchanged): after the checksum
 *   "PKVMEDIA", u32 n_chunks, u32 reserved (0),
 *   n_chunks x {u64 key, u64 start, u32 n_rows, u32 flags},
 *   u64 pkv_hash64(trailer before this field, seed = the checksum above).
 * Load checks every chunk against the tokens (each row's id is
 * pkv_media_token(key, row); every media id lies in a chunk) and refuses a file
 * whose media ids are not described, naming the token and chunk. A build before
 * media refuses such a file ("bytes after the expected end"). */
#include "kv/kv-file.h"
#include "kv/kv-impl.h"

#include <stdio.h>
#include <string.h>

#define KV_FILE_MAGIC "PKVKVSEQ"
#define KV_FILE_VERSION 1u
#define KV_FILE_VERSION_WINDOW 2u
#define KV_FILE_VERSION_STATE 3u
#define KV_FILE_RECURRENT 0x80000000u /* the dtypes word of a recurrent layer */

/* The version a cache writes, and the only one it reads. */
static uint32_t file_version(const pkv_kv_cache *c) {
    return kv_has_state(c) ? KV_FILE_VERSION_STATE : c->sub ? KV_FILE_VERSION_WINDOW : KV_FILE_VERSION;
}

static size_t header_bytes(const pkv_kv_cache *c, int64_t n_tokens) {
    size_t ext = kv_has_state(c) ? 24 : c->sub ? 16 : 0;
    return 8 + 16 + 8 + (size_t)c->layout.n_layers * 16 + 24 + ext + (size_t)n_tokens * 8;
}

/* Which pool holds a layer and the tokens its sections cover. */
typedef struct kv_span {
    pkv_kv_cache *pool;
    const int32_t *pages; /* the sequence's pages in that pool, from page t0 / page_size */
    int64_t t0, t1;
} kv_span;

static kv_span span_of(pkv_kv_cache *c, const kv_layer *L, const int32_t *pages, const int32_t *wpages, int64_t n,
                       int64_t w_first, int64_t w_len) {
    if (L->window > 0 && c->sub) return (kv_span){c->sub, wpages + w_first / c->page_size, w_first, w_len};
    return (kv_span){c, pages, 0, n};
}

static int64_t span_pages(const kv_span *sp) {
    int ps = sp->pool->page_size;
    return (sp->t1 + ps - 1) / ps - sp->t0 / ps;
}

/* One payload section: K (v false) or V of n_tokens tokens; a recurrent layer has
 * one section, its state (v false), and an empty V. */
static size_t layer_bytes(const kv_layer *L, int64_t n_tokens, bool v) {
    if (L->state_per_head > 0) return v ? 0 : (size_t)L->n_kv_heads * (size_t)L->state_per_head * sizeof(float);
    return (size_t)n_tokens * (size_t)L->n_kv_heads * (v ? L->hv : L->hk);
}

/* Move a recurrent layer's state in slot `slot` between its shards and the
 * canonical section canon ([n_kv_heads][state_per_head] f32, each head's parts
 * concatenated): a shard's heads are one contiguous range of it, permuted through
 * tmp (a slot of the shard) where the layer's state has parts. canon is only read
 * when to_device. */
static pkv_status move_state(pkv_kv_cache *c, int il, int32_t slot, uint8_t *canon, uint8_t *tmp, bool to_device) {
    const kv_layer *L = &c->layout.layers[il];
    pkv_status st = PKV_OK;
    for (int ish = 0; ish < L->n_shards && !st; ish++) {
        const kv_shard *sh = &L->shards[ish];
        const kv_state_array *a = &c->st_arrays[sh->s_array];
        pkv_buffer *buf = c->st_arenas[a->arena].buf;
        size_t off = a->off + (size_t)slot * a->slot_bytes;
        uint8_t *h = L->n_parts ? tmp : canon + (size_t)sh->head_begin * (size_t)L->state_per_head * sizeof(float);
        if (to_device && L->n_parts) pkv_kv_state_permute(L, sh->head_begin, sh->n_heads, tmp, canon, true);
        st = to_device ? pkv_buffer_write(buf, off, h, a->slot_bytes) : pkv_buffer_read(buf, off, h, a->slot_bytes);
        if (!st && !to_device && L->n_parts) pkv_kv_state_permute(L, sh->head_begin, sh->n_heads, tmp, canon, false);
    }
    return st;
}

/* Copy the sequence's rows of array `a` between its device pages and the
 * canonical layer buffer canon ([n_tokens][H][d]), through tmp ([n][page]). */
static pkv_status move_array(pkv_kv_cache *c, const kv_array *a, const int32_t *pages, int64_t n_pages,
                             int64_t n_tokens, uint8_t *canon, uint8_t *tmp, bool to_device) {
    const kv_layer *L = &c->layout.layers[a->layer];
    const kv_shard *sh = &L->shards[a->shard];
    size_t hb = a->is_v ? L->hv : L->hk; /* one head's row */
    size_t canon_row = (size_t)L->n_kv_heads * hb, head_off = (size_t)sh->head_begin * hb;
    int ps = c->page_size;
    pkv_buffer *buf = kv_array_buf(c, a);
    if (to_device)
        for (int64_t t = 0; t < n_tokens; t++)
            memcpy(tmp + (size_t)t * a->row_bytes, canon + (size_t)t * canon_row + head_off, a->row_bytes);
    pkv_status st = PKV_OK;
    for (int64_t i = 0; i < n_pages && !st;) {
        int64_t j = i + 1;
        while (j < n_pages && pages[j] == pages[j - 1] + 1) j++;
        size_t off = a->off + (size_t)pages[i] * a->page_bytes, bytes = (size_t)(j - i) * a->page_bytes;
        if (j == n_pages) bytes -= (size_t)(n_pages * ps - n_tokens) * a->row_bytes; /* unused tail slots */
        uint8_t *h = tmp + (size_t)i * a->page_bytes;
        st = to_device ? pkv_buffer_write(buf, off, h, bytes) : pkv_buffer_read(buf, off, h, bytes);
        i = j;
    }
    if (!st && !to_device)
        for (int64_t t = 0; t < n_tokens; t++)
            memcpy(canon + (size_t)t * canon_row + head_off, tmp + (size_t)t * a->row_bytes, a->row_bytes);
    return st;
}

static void put32(uint8_t **p, uint32_t v) {
    memcpy(*p, &v, 4);
    *p += 4;
}
static void put64(uint8_t **p, uint64_t v) {
    memcpy(*p, &v, 8);
    *p += 8;
}
static uint32_t get32(const uint8_t **p) {
    uint32_t v;
    memcpy(&v, *p, 4);
    *p += 4;
    return v;
}
static uint64_t get64(const uint8_t **p) {
    uint64_t v;
    memcpy(&v, *p, 8);
    *p += 8;
    return v;
}

/* Largest canonical layer section and largest per-array staging. */
static void scratch_sizes(const pkv_kv_cache *c, int64_t n_tokens, size_t *canon, size_t *tmp) {
    *canon = 1;
    *tmp = 1;
    int64_t n_pages = (n_tokens + c->page_size - 1) / c->page_size;
    for (int il = 0; il < c->layout.n_layers; il++)
        for (int v = 0; v < 2; v++) *canon = PKV_MAX(*canon, layer_bytes(&c->layout.layers[il], n_tokens, v));
    /* (a recurrent layer's section is read straight from the file on load, through
     * a slot's staging where its state has parts) */
    for (const pkv_kv_cache *pc = c; pc; pc = pc->sub)
        for (int a = 0; a < pc->n_arrays; a++) *tmp = PKV_MAX(*tmp, (size_t)n_pages * pc->arrays[a].page_bytes);
    for (int a = 0; a < c->n_st_arrays; a++) *tmp = PKV_MAX(*tmp, c->st_arrays[a].slot_bytes);
}

/* Move one layer's K or V between the pool and the canonical buffer. */
static pkv_status move_layer(const kv_span *sp, int il, bool v, uint8_t *canon, uint8_t *tmp, bool to_device) {
    const kv_layer *L = &sp->pool->layout.layers[il]; /* the pool's own copy names its arrays */
    pkv_status st = PKV_OK;
    for (int ish = 0; ish < L->n_shards && !st; ish++) {
        const kv_array *a = &sp->pool->arrays[v ? L->shards[ish].v_array : L->shards[ish].k_array];
        st = move_array(sp->pool, a, sp->pages, span_pages(sp), sp->t1 - sp->t0, canon, tmp, to_device);
    }
    return st;
}

pkv_status pkv_kv_file_move_layer(pkv_kv_cache *c, int il, bool v, const int32_t *pages, int64_t n_pages,
                                  int64_t n_tokens, uint8_t *canon, uint8_t *tmp, bool to_device) {
    kv_span sp = {c, pages, 0, n_tokens};
    (void)n_pages; /* span_pages() derives it from the tokens */
    return move_layer(&sp, il, v, canon, tmp, to_device);
}

size_t pkv_kv_file_layer_bytes(const pkv_kv_cache *c, int il, int64_t n_tokens, bool v) {
    return layer_bytes(&c->layout.layers[il], n_tokens, v);
}

pkv_status pkv_kv_seq_save(pkv_kv_cache *c, int32_t seq, const char *path) {
    if (!path) return pkv_err(PKV_ERR_INVALID, "save: path is NULL");
    kv_seq *s = pkv_kv_seq_resident(c, seq, "save");
    if (!s) return PKV_ERR_INVALID;
    const pkv_kv_layout *l = &c->layout;
    int64_t n = s->n_tokens, n_pages = pkv_kv_seq_pages(c, s);
    kv_seq *w = c->sub ? &c->sub->seqs[seq] : NULL;
    int64_t w_len = w ? w->n_tokens : 0, w_first = w ? PKV_MIN(w->n_hole * c->page_size, w_len) : 0;
    size_t hb = header_bytes(c, n), canon_b, tmp_b;
    scratch_sizes(c, n, &canon_b, &tmp_b);
    uint8_t *hdr = pkv_malloc(hb), *canon = pkv_malloc(canon_b), *tmp = pkv_malloc(tmp_b);
    int32_t *pages = pkv_malloc((size_t)(2 * n_pages + 1) * sizeof *pages), *wpages = pages + n_pages;
    pkv_status st = PKV_OK;
    FILE *f = NULL;
    if (!hdr || !canon || !tmp || !pages) {
        st = pkv_err(PKV_ERR_NOMEM, "save of sequence %d: out of memory", seq);
        goto done;
    }
    pkv_kv_seq_publish(c, s);
    pkv_kv_seq_flatten(s, n_pages, pages);
    if (w) pkv_kv_seq_flatten(w, pkv_kv_seq_pages(c->sub, w), wpages);
    uint8_t *p = hdr;
    memcpy(p, KV_FILE_MAGIC, 8);
    p += 8;
    put32(&p, file_version(c));
    put32(&p, (uint32_t)l->n_layers);
    put32(&p, (uint32_t)l->page_size);
    put32(&p, 0);
    put64(&p, l->fingerprint);
    for (int il = 0; il < l->n_layers; il++) {
        const kv_layer *L = &l->layers[il];
        const bool rec = L->state_per_head > 0;
        put32(&p, (uint32_t)L->n_kv_heads);
        put32(&p, (uint32_t)L->dk);
        put32(&p, (uint32_t)(rec ? L->state_per_head : L->dv));
        put32(&p, rec ? KV_FILE_RECURRENT : kv_dtype_word(L->tk, L->tv));
    }
    put64(&p, (uint64_t)n);
    put64(&p, s->fp);
    put64(&p, (uint64_t)s->exact_until);
    if (c->sub || kv_has_state(c)) {
        put64(&p, (uint64_t)(c->sub ? w_first : 0));
        put64(&p, (uint64_t)(c->sub ? w_len : n));
    }
    if (kv_has_state(c)) put64(&p, (uint64_t)s->st.len);
    pkv_kv_seq_tokens(c, seq, 0, n, (int32_t *)(void *)p, (int32_t *)(void *)(p + (size_t)n * 4));
    pkv_wfile wf;
    if ((st = pkv_wfile_open(&wf, path))) {
        pkv_err_prefix(st, "save");
        goto done;
    }
    f = wf.f;
    uint64_t h = pkv_hash64(hdr, hb, 0);
    if (fwrite(hdr, 1, hb, f) != hb) st = pkv_err(PKV_ERR_IO, "save: writing the header of %s failed", path);
    for (int il = 0; il < l->n_layers && !st; il++) {
        const kv_layer *L = &l->layers[il];
        kv_span sp = span_of(c, L, pages, wpages, n, w_first, w_len);
        for (int v = 0; v < 2 && !st; v++) {
            if (L->state_per_head > 0 && v) break; /* one section: the state */
            st = L->state_per_head > 0 ? move_state(c, il, s->st.slot, canon, tmp, false)
                                       : move_layer(&sp, il, v, canon, tmp, false);
            size_t bytes = layer_bytes(L, sp.t1 - sp.t0, v);
            if (!st) {
                h = pkv_hash64(canon, bytes, h);
                if (fwrite(canon, 1, bytes, f) != bytes)
                    st = pkv_err(PKV_ERR_IO, "save: writing layer %d of %s failed", il, path);
            }
        }
    }
    if (!st && fwrite(&h, 1, 8, f) != 8) st = pkv_err(PKV_ERR_IO, "save: writing the checksum of %s failed", path);
    if (!st && s->n_media > 0) { /* the media trailer */
        size_t tb = 16 + (size_t)s->n_media * 24;
        uint8_t *tr = pkv_malloc(tb + 8), *q = tr;
        if (!tr) st = pkv_err(PKV_ERR_NOMEM, "save: out of memory");
        if (!st) {
            memcpy(q, "PKVMEDIA", 8);
            q += 8;
            put32(&q, (uint32_t)s->n_media);
            put32(&q, 0);
            for (int i = 0; i < s->n_media; i++) {
                put64(&q, s->media[i].key);
                put64(&q, (uint64_t)s->media[i].start);
                put32(&q, (uint32_t)s->media[i].n_rows);
                put32(&q, s->media[i].flags);
            }
            put64(&q, pkv_hash64(tr, tb, h));
            if (fwrite(tr, 1, tb + 8, f) != tb + 8) st = pkv_err(PKV_ERR_IO, "save: writing the media of %s failed", path);
        }
        pkv_free(tr);
    }
    if (st)
        pkv_wfile_abort(&wf);
    else if ((st = pkv_wfile_commit(&wf)))
        pkv_err_prefix(st, "save");
done:
    pkv_free(hdr);
    pkv_free(canon);
    pkv_free(tmp);
    pkv_free(pages);
    return st;
}

static const char *type_name(uint32_t t) {
    const char *n = pkv_type_name((pkv_type)t);
    return n ? n : "unknown";
}

/* Parse and check the whole file against the cache; on success *n_tokens and the
 * offsets of tokens/positions/payload are set. */
static pkv_status check_file(const pkv_kv_cache *c, const char *path, const uint8_t *data, size_t size,
                             int64_t *n_tokens, uint64_t *fp, int64_t *exact_until, int64_t *w_first, int64_t *w_len,
                             int64_t *state_len, size_t *media_off, int *n_media) {
    const pkv_kv_layout *l = &c->layout;
    if (size < 8 + 16 + 8 || memcmp(data, KV_FILE_MAGIC, 8) != 0)
        return pkv_err(PKV_ERR_FORMAT, "%s is not a pagekv sequence file (bad magic or shorter than a header: %zu bytes)",
                       path, size);
    const uint8_t *p = data + 8;
    uint32_t version = get32(&p), n_layers = get32(&p), page_size = get32(&p);
    (void)get32(&p);
    uint64_t layout_fp = get64(&p);
    if (version != KV_FILE_VERSION && version != KV_FILE_VERSION_WINDOW && version != KV_FILE_VERSION_STATE)
        return pkv_err(PKV_ERR_FORMAT, "%s: format version %u, this build reads versions %u to %u", path, version,
                       KV_FILE_VERSION, KV_FILE_VERSION_STATE);
    const bool state = kv_has_state(c);
    if ((version == KV_FILE_VERSION_STATE) != state)
        return pkv_err(PKV_ERR_FORMAT, "%s was saved from a cache %s recurrent layers, this cache has %s", path,
                       state ? "without" : "with", state ? "some" : "none");
    if (!state && (version == KV_FILE_VERSION_WINDOW) != (c->sub != NULL))
        return pkv_err(PKV_ERR_FORMAT, "%s was saved from a cache %s sliding-window layers, this cache has %s", path,
                       c->sub ? "without" : "with", c->sub ? "some" : "none");
    if (n_layers != (uint32_t)l->n_layers)
        return pkv_err(PKV_ERR_FORMAT, "%s: the file has %u layers, the cache has %d", path, n_layers, l->n_layers);
    if (size < header_bytes(c, 0))
        return pkv_err(PKV_ERR_FORMAT, "%s is truncated: %zu bytes, shorter than its header", path, size);
    for (int il = 0; il < l->n_layers; il++) {
        const kv_layer *L = &l->layers[il];
        uint32_t h = get32(&p), dk = get32(&p), dv = get32(&p), dt = get32(&p);
        if ((dt == KV_FILE_RECURRENT) != (L->state_per_head > 0))
            return pkv_err(PKV_ERR_FORMAT, "%s: layer %d is %s in the file, %s in the cache", path, il,
                           dt == KV_FILE_RECURRENT ? "recurrent" : "an attention layer",
                           L->state_per_head > 0 ? "recurrent" : "an attention layer");
        if (L->state_per_head > 0) {
            if (h != (uint32_t)L->n_kv_heads || dk != 0 || dv != (uint32_t)L->state_per_head)
                return pkv_err(PKV_ERR_FORMAT, "%s: recurrent layer %d has a state of %u heads x %u floats in the "
                               "file, %d x %d in the cache", path, il, h, dv, L->n_kv_heads, L->state_per_head);
            continue;
        }
        if (h != (uint32_t)L->n_kv_heads)
            return pkv_err(PKV_ERR_FORMAT, "%s: layer %d has %u KV heads in the file, %d in the cache", path, il, h,
                           L->n_kv_heads);
        if (dk != (uint32_t)L->dk || dv != (uint32_t)L->dv)
            return pkv_err(PKV_ERR_FORMAT, "%s: layer %d has head sizes K %u, V %u in the file, K %d, V %d in the cache",
                           path, il, dk, dv, L->dk, L->dv);
        if (dt != kv_dtype_word(L->tk, L->tv))
            return pkv_err(PKV_ERR_FORMAT,
                           "%s: layer %d stores K %s, V %s in the file, K %s, V %s in the cache: load it into a cache "
                           "of the file's KV types",
                           path, il, type_name(kv_word_k(dt)), type_name(kv_word_v(dt)), type_name(L->tk),
                           type_name(L->tv));
    }
    if (page_size != (uint32_t)l->page_size)
        return pkv_err(PKV_ERR_FORMAT, "%s: pages of %u tokens in the file, %d in the cache", path, page_size,
                       l->page_size);
    if ((c->sub || state) && layout_fp != l->fingerprint)
        return pkv_err(PKV_ERR_FORMAT, "%s: layout fingerprint %016llx, the cache's is %016llx (layers, windows, "
                       "state sizes or parts, or page size differ)", path, (unsigned long long)layout_fp,
                       (unsigned long long)l->fingerprint);
    uint64_t n = get64(&p);
    *fp = get64(&p);
    uint64_t ex = get64(&p);
    *exact_until = ex > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)ex;
    uint64_t wf = 0, wl = n, sl = 0;
    if (c->sub || state) {
        wf = get64(&p);
        wl = get64(&p);
    }
    if (state) sl = get64(&p);
    /* Each token needs at least 8 bytes of header, so this bounds n before any product. */
    if (n > (uint64_t)INT32_MAX || n > size / 8)
        return pkv_err(PKV_ERR_FORMAT, "%s is truncated or corrupt: %llu tokens in a file of %zu bytes", path,
                       (unsigned long long)n, size);
    if (wl > n || wf > wl || wf % (uint64_t)l->page_size)
        return pkv_err(PKV_ERR_FORMAT, "%s is corrupt: window tokens [%llu, %llu) of %llu (pages of %d)", path,
                       (unsigned long long)wf, (unsigned long long)wl, (unsigned long long)n, l->page_size);
    if (!c->sub && (wf != 0 || wl != n))
        return pkv_err(PKV_ERR_FORMAT, "%s is corrupt: window tokens [%llu, %llu) of %llu in a file without window "
                       "layers", path, (unsigned long long)wf, (unsigned long long)wl, (unsigned long long)n);
    if (sl > n)
        return pkv_err(PKV_ERR_FORMAT, "%s is corrupt: a recurrent state of %llu tokens in a sequence of %llu", path,
                       (unsigned long long)sl, (unsigned long long)n);
    *w_first = (int64_t)wf;
    *w_len = (int64_t)wl;
    *state_len = (int64_t)sl;
    size_t want = header_bytes(c, (int64_t)n) + 8;
    for (int il = 0; il < l->n_layers; il++) {
        int64_t nt = l->layers[il].window > 0 && c->sub ? (int64_t)(wl - wf) : (int64_t)n;
        want += layer_bytes(&l->layers[il], nt, false) + layer_bytes(&l->layers[il], nt, true);
    }
    if (size < want)
        return pkv_err(PKV_ERR_FORMAT, "%s is truncated: %zu bytes, %zu expected for %llu tokens", path, size, want,
                       (unsigned long long)n);
    *media_off = 0;
    *n_media = 0;
    if (size > want) { /* only the media trailer may follow */
        const uint8_t *q = data + want;
        uint32_t nm = 0;
        if (size - want >= 24 && memcmp(q, "PKVMEDIA", 8) == 0) {
            q += 8;
            nm = get32(&q);
        }
        if (nm == 0 || nm > (size - want) / 24 || size - want != 16 + (size_t)nm * 24 + 8)
            return pkv_err(PKV_ERR_FORMAT, "%s has %zu bytes after the expected end (%zu bytes) that are not a media "
                           "section", path, size - want, want);
        *media_off = want;
        *n_media = (int)nm;
    }
    size_t hb = header_bytes(c, (int64_t)n);
    uint64_t h = pkv_hash64(data, hb, 0);
    size_t off = hb;
    for (int il = 0; il < l->n_layers; il++)
        for (int v = 0; v < 2; v++) {
            if (l->layers[il].state_per_head > 0 && v) break; /* one section, as saved */
            int64_t nt = l->layers[il].window > 0 && c->sub ? (int64_t)(wl - wf) : (int64_t)n;
            size_t b = layer_bytes(&l->layers[il], nt, v);
            h = pkv_hash64(data + off, b, h);
            off += b;
        }
    uint64_t stored;
    memcpy(&stored, data + off, 8);
    if (stored != h)
        return pkv_err(PKV_ERR_FORMAT, "%s: checksum mismatch (stored %016llx, computed %016llx): the file is corrupt",
                       path, (unsigned long long)stored, (unsigned long long)h);
    if (*n_media) {
        size_t tb = 16 + (size_t)*n_media * 24;
        uint64_t ms, mh = pkv_hash64(data + *media_off, tb, h);
        memcpy(&ms, data + *media_off + tb, 8);
        if (ms != mh)
            return pkv_err(PKV_ERR_FORMAT, "%s: media section checksum mismatch (stored %016llx, computed %016llx): the "
                           "file is corrupt", path, (unsigned long long)ms, (unsigned long long)mh);
    }
    *n_tokens = (int64_t)n;
    return PKV_OK;
}

pkv_status pkv_kv_seq_load(pkv_kv_cache *c, const char *path, uint64_t fingerprint, int32_t *seq) {
    if (!c || !path || !seq) return pkv_err(PKV_ERR_INVALID, "pkv_kv_seq_load: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f) return pkv_err(PKV_ERR_IO, "load: cannot open %s", path);
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0) end = ftell(f);
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return pkv_err(PKV_ERR_IO, "load: cannot determine the size of %s", path);
    }
    size_t size = (size_t)end;
    uint8_t *data = pkv_malloc(size ? size : 1);
    if (!data) {
        fclose(f);
        return pkv_err(PKV_ERR_NOMEM, "load: cannot buffer %s (%zu bytes)", path, size);
    }
    size_t got = fread(data, 1, size, f);
    fclose(f);
    pkv_status st;
    if (got != size)
        st = pkv_err(PKV_ERR_IO, "load: reading %s failed after %zu of %zu bytes", path, got, size);
    else
        st = pkv_kv_seq_load_memory(c, path, data, size, fingerprint, seq);
    pkv_free(data);
    return st;
}

/* Slot id of pool c becomes a live sequence owning pages[n_pages] (the first
 * n_hole of them released window pages, -1). */
static void adopt(pkv_kv_cache *c, int32_t id, uint64_t fp, int64_t exact_until, int64_t n_tokens, int64_t n_hole,
                  int32_t *pages, int64_t n_pages) {
    kv_seq *s = &c->seqs[id];
    memset(s, 0, sizeof *s);
    s->live = true;
    s->fp = fp;
    s->exact_until = exact_until;
    s->n_tokens = n_tokens;
    s->n_hole = n_hole;
    s->own = pages;
    s->n_own = (size_t)n_pages;
    s->cap_own = (size_t)(n_pages ? n_pages : 1);
    c->n_live++;
}

pkv_status pkv_kv_seq_load_memory(pkv_kv_cache *c, const char *label, const void *bytes, size_t size,
                                  uint64_t fingerprint, int32_t *seq) {
    if (!c || !seq || (!bytes && size)) return pkv_err(PKV_ERR_INVALID, "pkv_kv_seq_load_memory: NULL argument");
    const char *path = label ? label : "<memory>";
    const uint8_t *data = bytes;
    pkv_status st = PKV_OK;
    uint8_t *canon = NULL, *tmp = NULL;
    int32_t *pages = NULL, *wpages = NULL;
    int64_t n = 0;
    uint64_t file_fp = 0;
    int64_t exact_until = INT64_MAX, w_first = 0, w_len = 0, state_len = 0;
    int32_t slot = -1;
    size_t media_off = 0;
    int n_media = 0;
    pkv_kv_media *media = NULL;
    if ((st = check_file(c, path, data, size, &n, &file_fp, &exact_until, &w_first, &w_len, &state_len, &media_off,
                         &n_media)))
        goto done;
    if (fingerprint && file_fp != fingerprint) { /* another model's (or adapter's) KV: never adopted as this one's */
        st = pkv_err(PKV_ERR_FORMAT, "load of %s: it was saved by another producer (sequence fingerprint %016llx, "
                     "expected %016llx: another model or other weights)", path, (unsigned long long)file_fp,
                     (unsigned long long)fingerprint);
        goto done;
    }
    { /* the media chunks it names must be exactly its media rows */
        media = pkv_malloc((size_t)(n_media ? n_media : 1) * sizeof *media);
        if (!media) {
            st = pkv_err(PKV_ERR_NOMEM, "load of %s: out of memory", path);
            goto done;
        }
        const uint8_t *q = data + media_off + 16;
        for (int i = 0; i < n_media; i++) {
            media[i].key = get64(&q);
            uint64_t start = get64(&q);
            media[i].start = start > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)start;
            uint32_t rows = get32(&q);
            media[i].n_rows = rows > (uint32_t)INT32_MAX ? 0 : (int32_t)rows;
            media[i].flags = get32(&q);
        }
        int32_t *ftok = pkv_malloc((size_t)(n ? n : 1) * sizeof *ftok);
        if (!ftok) {
            st = pkv_err(PKV_ERR_NOMEM, "load of %s: out of memory", path);
            goto done;
        }
        memcpy(ftok, data + header_bytes(c, 0), (size_t)n * 4);
        char what[300];
        snprintf(what, sizeof what, "load of %s", path);
        st = pkv_kv_media_verify(media, n_media, ftok, n, what, true);
        pkv_free(ftok);
        if (st) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", pkv_errmsg());
            st = pkv_err(PKV_ERR_FORMAT, "%s", msg);
            goto done;
        }
    }
    int ps = c->page_size;
    int64_t n_pages = (n + ps - 1) / ps, avail = pkv_kv_pool_available(c);
    int64_t w_hole = w_first / ps, w_pages = (w_len + ps - 1) / ps; /* window pool: -1 before w_hole */
    if (n_pages > avail) {
        st = pkv_err(PKV_ERR_OUT_OF_PAGES, "load of %s needs %lld pages, %lld are free or evictable", path,
                     (long long)n_pages, (long long)avail);
        goto done;
    }
    if (kv_has_state(c) && pkv_kv_state_available(c) < 1) {
        st = pkv_err(PKV_ERR_NOMEM, "load of %s: no recurrent-state slot can be had: all %lld state slots hold the "
                     "live states of other sequences (raise pkv_kv_params.state_slots)", path, (long long)c->n_slots);
        goto done;
    }
    if (c->sub && w_pages - w_hole > pkv_kv_pool_available(c->sub)) {
        st = pkv_err(PKV_ERR_OUT_OF_PAGES, "load of %s needs %lld pages of the sliding-window pool, %lld are free or "
                     "evictable", path, (long long)(w_pages - w_hole), (long long)pkv_kv_pool_available(c->sub));
        goto done;
    }
    size_t canon_b, tmp_b;
    scratch_sizes(c, n, &canon_b, &tmp_b);
    tmp = pkv_malloc(tmp_b);
    pages = pkv_malloc((size_t)(n_pages ? n_pages : 1) * sizeof *pages);
    wpages = c->sub ? pkv_malloc((size_t)(w_pages ? w_pages : 1) * sizeof *wpages) : NULL;
    int32_t id = -1, wid = -1;
    if (!tmp || !pages || (c->sub && !wpages)) {
        st = pkv_err(PKV_ERR_NOMEM, "load of %s: out of memory", path);
        goto done;
    }
    if ((st = pkv_kv_seq_alloc_slot(c, &id))) goto done;
    if (c->sub && (st = pkv_kv_seq_alloc_slot(c->sub, &wid))) goto done;
    if (c->sub && wid != id) {
        st = pkv_err(PKV_ERR_INTERNAL, "load of %s: the window pool gave sequence %d for %d", path, wid, id);
        goto done;
    }
    pkv_kv_pool_take(c, n_pages, pages);
    if (c->sub) {
        for (int64_t i = 0; i < w_hole; i++) wpages[i] = -1;
        pkv_kv_pool_take(c->sub, w_pages - w_hole, wpages + w_hole);
    }
    if (kv_has_state(c)) slot = pkv_kv_state_slot_take(c); /* available: checked above */
    const pkv_kv_layout *l = &c->layout;
    size_t off = header_bytes(c, n);
    for (int il = 0; il < l->n_layers && !st; il++) {
        const kv_layer *L = &l->layers[il];
        kv_span sp = span_of(c, L, pages, wpages, n, w_first, w_len);
        for (int v = 0; v < 2 && !st; v++) { /* to_device: the file image is only read */
            if (L->state_per_head > 0 && !v) st = move_state(c, il, slot, (uint8_t *)data + off, tmp, true);
            else if (L->state_per_head == 0) st = move_layer(&sp, il, v, (uint8_t *)data + off, tmp, true);
            off += layer_bytes(L, sp.t1 - sp.t0, v);
        }
    }
    if (st) {
        for (int64_t i = 0; i < n_pages; i++) pkv_kv_page_unref(c, pages[i]);
        for (int64_t i = 0; c->sub && i < w_pages; i++) pkv_kv_page_unref(c->sub, wpages[i]);
        if (slot >= 0) pkv_kv_state_slot_unref(c, slot, c->slots[slot].gen);
        pkv_err_prefix(st, "load of %s", path);
        goto done;
    }
    const uint8_t *tp = data + header_bytes(c, 0);
    for (int64_t t = 0; t < n; t++) {
        size_t at = (size_t)pages[t / ps] * ps + (size_t)(t % ps);
        memcpy(&c->tok[at], tp + (size_t)t * 4, 4);
        memcpy(&c->pos[at], tp + (size_t)(n + t) * 4, 4);
        if (c->sub && t >= w_first && t < w_len) {
            size_t wa = (size_t)wpages[t / ps] * ps + (size_t)(t % ps);
            c->sub->tok[wa] = c->tok[at];
            c->sub->pos[wa] = c->pos[at];
        }
    }
    uint64_t fp = fingerprint ? fingerprint : file_fp;
    adopt(c, id, fp, exact_until, n, 0, pages, n_pages);
    c->seqs[id].media = media;
    c->seqs[id].n_media = c->seqs[id].cap_media = n_media;
    if (!n_media) pkv_free(media);
    if (!n_media) c->seqs[id].media = NULL;
    media = NULL;
    c->seqs[id].st.slot = slot;
    c->seqs[id].st.len = state_len;
    pages = NULL;
    if (c->sub) {
        adopt(c->sub, id, fp, exact_until, w_len, w_hole, wpages, w_pages);
        wpages = NULL;
    }
    *seq = id;
done:
    pkv_free(media);
    pkv_free(canon);
    pkv_free(tmp);
    pkv_free(pages);
    pkv_free(wpages);
    return st;
}
