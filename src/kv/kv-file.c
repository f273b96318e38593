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
 * media refuses such a file ("bytes after the expected end").
 *
 * Whose part is what. This file writes and checks the frame: the magic, version,
 * layer count, page size, layout fingerprint, n_tokens, sequence fingerprint,
 * exact_until, tokens, positions and the checksum. The rest belongs to the memory
 * kinds (pkv_mem_kind's file hooks), asked in file order: each layer's geometry
 * row and payload to the kind holding the layer (kv-full.c: full-attention
 * layers; kv-window.c: window layers; kv-state.c: recurrent layers), so the kinds
 * interleave layer by layer; the fields after exact_until (the window span, then
 * state_len) and what follows the checksum (the media trailer) in table order.
 * File order and table order differ in one place: the media records (kv-media.c,
 * before the state in the table) are a trailer after the whole payload. A
 * cache writes the version of its newest kind (file_version: window 2, state 3)
 * and reads only that one; a version-3 file has the window span even without
 * window layers (0, n_tokens: kv-state.c writes it then). */
#include "kv/kv-file.h"
#include "kv/kv-impl.h"

#include <stdio.h>
#include <string.h>

#define KV_FILE_MAGIC "PKVKVSEQ"
#define KV_FILE_VERSION 1u      /* the frame and the full pool alone */
#define KV_FILE_VERSION_LAST 3u /* the newest file_version of any kind */

enum { N_KINDS = PKV_MEM_KINDS };

/* ------------------------------------------------------ field helpers */


void pkv_kv_file_put32(kv_file *f, uint32_t v) { kv_put32(&f->put, v); }
void pkv_kv_file_put64(kv_file *f, uint64_t v) { kv_put64(&f->put, v); }
uint32_t pkv_kv_file_get32(kv_file *f) { return kv_get32(&f->get); }
uint64_t pkv_kv_file_get64(kv_file *f) { return kv_get64(&f->get); }

pkv_status pkv_kv_file_write(kv_file *f, const void *bytes, size_t n, int il) {
    f->h = pkv_hash64(bytes, n, f->h);
    if (fwrite(bytes, 1, n, f->out) != n)
        return pkv_err(PKV_ERR_IO, "save: writing layer %d of %s failed", il, f->path);
    return PKV_OK;
}

/* ---------------------------------------------- attention layers' pages */

/* One payload section: K (v false) or V of n_tokens tokens; a recurrent layer has
 * one section, its state (v false), and an empty V. */
static size_t layer_bytes(const kv_layer *L, int64_t n_tokens, bool v) {
    if (L->state_per_head > 0) return v ? 0 : (size_t)L->n_kv_heads * (size_t)L->state_per_head * sizeof(float);
    return (size_t)n_tokens * (size_t)L->n_kv_heads * (v ? L->hv : L->hk);
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

/* Move one layer's K or V of tokens [t0, t1) (pages[0] holds t0) between the
 * pool and the canonical buffer. */
static pkv_status move_layer(pkv_kv_cache *pool, int il, bool v, const int32_t *pages, int64_t t0, int64_t t1,
                             uint8_t *canon, uint8_t *tmp, bool to_device) {
    const kv_layer *L = &pool->layout.layers[il]; /* the pool's own copy names its arrays */
    int ps = pool->page_size;
    int64_t n_pages = (t1 + ps - 1) / ps - t0 / ps;
    pkv_status st = PKV_OK;
    if (v && L->v_in_k) return PKV_OK; /* V is read from K: nothing of its own (0 bytes in files) */
    for (int ish = 0; ish < L->n_shards && !st; ish++) {
        const kv_array *a = &pool->arrays[v ? L->shards[ish].v_array : L->shards[ish].k_array];
        st = move_array(pool, a, pages, n_pages, t1 - t0, canon, tmp, to_device);
    }
    return st;
}

pkv_status pkv_kv_file_move_layer(pkv_kv_cache *c, int il, bool v, const int32_t *pages, int64_t n_pages,
                                  int64_t n_tokens, uint8_t *canon, uint8_t *tmp, bool to_device) {
    (void)n_pages; /* move_layer derives it from the tokens */
    return move_layer(c, il, v, pages, 0, n_tokens, canon, tmp, to_device);
}

size_t pkv_kv_file_layer_bytes(const pkv_kv_cache *c, int il, int64_t n_tokens, bool v) {
    return layer_bytes(&c->layout.layers[il], n_tokens, v);
}

void pkv_kv_file_attn_row(kv_file *f, int il) {
    const kv_layer *L = &f->cache->layout.layers[il];
    pkv_kv_file_put32(f, (uint32_t)L->n_kv_heads);
    pkv_kv_file_put32(f, (uint32_t)L->dk);
    pkv_kv_file_put32(f, (uint32_t)L->dv);
    pkv_kv_file_put32(f, kv_dtype_word(L->tk, L->tv));
}

static const char *type_name(uint32_t t) {
    const char *n = pkv_type_name((pkv_type)t);
    return n ? n : "unknown";
}

pkv_status pkv_kv_file_row_kind(const kv_file *f, int il, uint32_t dt, bool recurrent) {
    if ((dt == KV_FILE_RECURRENT) == recurrent) return PKV_OK;
    return pkv_err(PKV_ERR_FORMAT, "%s: layer %d is %s in the file, %s in the cache", f->path, il,
                   dt == KV_FILE_RECURRENT ? "recurrent" : "an attention layer",
                   recurrent ? "recurrent" : "an attention layer");
}

pkv_status pkv_kv_file_attn_row_check(kv_file *f, int il) {
    const kv_layer *L = &f->cache->layout.layers[il];
    uint32_t h = pkv_kv_file_get32(f), dk = pkv_kv_file_get32(f), dv = pkv_kv_file_get32(f),
             dt = pkv_kv_file_get32(f);
    pkv_status st = pkv_kv_file_row_kind(f, il, dt, false);
    if (st) return st;
    if (h != (uint32_t)L->n_kv_heads)
        return pkv_err(PKV_ERR_FORMAT, "%s: layer %d has %u KV heads in the file, %d in the cache", f->path, il, h,
                       L->n_kv_heads);
    if (dk != (uint32_t)L->dk || dv != (uint32_t)L->dv)
        return pkv_err(PKV_ERR_FORMAT, "%s: layer %d has head sizes K %u, V %u in the file, K %d, V %d in the cache",
                       f->path, il, dk, dv, L->dk, L->dv);
    if (dt != kv_dtype_word(L->tk, L->tv))
        return pkv_err(PKV_ERR_FORMAT,
                       "%s: layer %d stores K %s, V %s in the file, K %s, V %s in the cache: load it into a cache "
                       "of the file's KV types",
                       f->path, il, type_name(kv_word_k(dt)), type_name(kv_word_v(dt)), type_name(L->tk),
                       type_name(L->tv));
    return PKV_OK;
}

int pkv_kv_file_attn_bytes(const pkv_kv_cache *c, int il, int64_t n_tokens, size_t bytes[2]) {
    for (int v = 0; v < 2; v++) bytes[v] = layer_bytes(&c->layout.layers[il], n_tokens, v);
    return 2;
}

size_t pkv_kv_file_attn_staging(const pkv_kv_cache *pool, int64_t n_tokens) {
    int64_t n_pages = (n_tokens + pool->page_size - 1) / pool->page_size;
    size_t b = 0;
    for (int a = 0; a < pool->n_arrays; a++) b = PKV_MAX(b, (size_t)n_pages * pool->arrays[a].page_bytes);
    return b;
}

pkv_status pkv_kv_file_attn_save(kv_file *f, pkv_kv_cache *pool, int il, const int32_t *pages, int64_t t0,
                                 int64_t t1) {
    pkv_status st = PKV_OK;
    for (int v = 0; v < 2 && !st; v++) {
        st = move_layer(pool, il, v, pages, t0, t1, f->canon, f->tmp, false);
        if (!st) st = pkv_kv_file_write(f, f->canon, layer_bytes(&pool->layout.layers[il], t1 - t0, v), il);
    }
    return st;
}

pkv_status pkv_kv_file_attn_load(kv_file *f, pkv_kv_cache *pool, int il, const int32_t *pages, int64_t t0,
                                 int64_t t1) {
    size_t off = f->layer_off[il];
    pkv_status st = PKV_OK;
    for (int v = 0; v < 2 && !st; v++) { /* to_device: the file image is only read */
        st = move_layer(pool, il, v, pages, t0, t1, (uint8_t *)f->data + off, f->tmp, true);
        off += layer_bytes(&pool->layout.layers[il], t1 - t0, v);
    }
    return st;
}

/* ------------------------------------------------------------ the frame */

/* The kinds present in c and the version their files have: the newest
 * file_version among them. */
static int file_kinds(const pkv_kv_cache *c, const pkv_mem_kind **k, uint32_t *version) {
    int n = pkv_kv_kinds(c, k);
    *version = KV_FILE_VERSION;
    for (int i = 0; i < n; i++) *version = PKV_MAX(*version, k[i]->file_version);
    return n;
}

/* The kind holding layer il (-1: none, a bug). */
static int holder(const pkv_kv_cache *c, const pkv_mem_kind **k, int n, int il) {
    for (int i = 0; i < n; i++)
        if (k[i]->holds_layer && k[i]->holds_layer(c, il)) return i;
    return -1;
}

static int kind_bytes(const pkv_mem_kind *k, const kv_file *f, const kv_file_part *part, kv_file_at at, int il,
                      size_t b[2]) {
    b[0] = b[1] = 0;
    return k->file_bytes ? k->file_bytes(f->cache, f, part, at, il, b) : 0;
}

/* The frame's header fields, each layer's row, the kinds' fields, tokens and positions. */
static size_t header_bytes(const kv_file *f, const pkv_mem_kind **k, int n, const kv_file_part *part,
                           int64_t n_tokens) {
    size_t b = 8 + 16 + 8 + (size_t)f->cache->layout.n_layers * 16 + 24 + (size_t)n_tokens * 8, x[2];
    for (int i = 0; i < n; i++) {
        kind_bytes(k[i], f, &part[i], KV_FILE_HEADER, -1, x);
        b += x[0];
    }
    return b;
}

/* Every layer has a kind holding it; *max_section: the largest payload section. */
static pkv_status check_holders(const kv_file *f, const pkv_mem_kind **k, int n, const kv_file_part *part,
                                size_t *max_section) {
    *max_section = 1;
    for (int il = 0; il < f->cache->layout.n_layers; il++) {
        int o = holder(f->cache, k, n, il);
        if (o < 0 && f->cache->layout.layers[il].other_rank) continue; /* another rank's: nothing here */
        if (o < 0) return pkv_err(PKV_ERR_INTERNAL, "%s: no memory kind holds layer %d", f->path, il);
        size_t b[2];
        int ns = kind_bytes(k[o], f, &part[o], KV_FILE_LAYER, il, b);
        for (int j = 0; j < ns; j++) *max_section = PKV_MAX(*max_section, b[j]);
    }
    return PKV_OK;
}

/* The largest staging a kind's moves need; with alloc, each kind's part->ptr too. */
static size_t staging(const kv_file *f, const pkv_mem_kind **k, int n, kv_file_part *part, bool alloc, bool *nomem) {
    size_t t = 1, b[2];
    for (int i = 0; i < n; i++) {
        kind_bytes(k[i], f, &part[i], KV_FILE_STAGING, -1, b);
        t = PKV_MAX(t, b[0]);
        if (alloc && b[1] && !(part[i].ptr = pkv_malloc(b[1]))) *nomem = true;
    }
    return t;
}

pkv_status pkv_kv_seq_save(pkv_kv_cache *c, int32_t seq, const char *path) {
    if (!path) return pkv_err(PKV_ERR_INVALID, "save: path is NULL");
    kv_seq *s = pkv_kv_seq_resident(c, seq, "save");
    if (!s) return PKV_ERR_INVALID;
    const pkv_kv_layout *l = &c->layout;
    const pkv_mem_kind *k[N_KINDS];
    uint32_t version;
    int nk = file_kinds(c, k, &version);
    kv_file f = {.cache = c, .path = path, .seq = seq, .n_tokens = s->n_tokens};
    kv_file_part part[N_KINDS];
    memset(part, 0, sizeof part);
    int64_t n = s->n_tokens;
    size_t canon_b;
    pkv_status st = check_holders(&f, k, nk, part, &canon_b);
    if (st) return st;
    size_t hb = header_bytes(&f, k, nk, part, n);
    bool nomem = false;
    size_t tmp_b = staging(&f, k, nk, part, true, &nomem);
    uint8_t *hdr = pkv_malloc(hb);
    f.canon = pkv_malloc(canon_b);
    f.tmp = pkv_malloc(tmp_b);
    pkv_wfile wf;
    if (!hdr || !f.canon || !f.tmp || nomem) {
        st = pkv_err(PKV_ERR_NOMEM, "save of sequence %d: out of memory", seq);
        goto done;
    }
    f.put = hdr;
    memcpy(f.put, KV_FILE_MAGIC, 8);
    f.put += 8;
    kv_put32(&f.put, version);
    kv_put32(&f.put, (uint32_t)l->n_layers);
    kv_put32(&f.put, (uint32_t)l->page_size);
    kv_put32(&f.put, 0);
    kv_put64(&f.put, l->fingerprint);
    for (int il = 0; il < l->n_layers; il++) {
        int o = holder(c, k, nk, il);
        if (o >= 0) k[o]->save(c, &f, &part[o], KV_FILE_ROW, il);
        else /* a layer another rank holds: an empty row */
            for (int j = 0; j < 4; j++) kv_put32(&f.put, 0);
    }
    kv_put64(&f.put, (uint64_t)n);
    kv_put64(&f.put, s->fp);
    kv_put64(&f.put, (uint64_t)s->exact_until);
    for (int i = 0; i < nk && !st; i++) /* the full pool publishes its pages here */
        if (k[i]->save) st = k[i]->save(c, &f, &part[i], KV_FILE_HEADER, -1);
    if (st) goto done;
    pkv_kv_seq_tokens(c, seq, 0, n, (int32_t *)(void *)f.put, (int32_t *)(void *)(f.put + (size_t)n * 4));
    f.put += (size_t)n * 8;
    if (f.put != hdr + hb) {
        st = pkv_err(PKV_ERR_INTERNAL, "save: a header of %zu bytes, %zu expected", (size_t)(f.put - hdr), hb);
        goto done;
    }
    if ((st = pkv_wfile_open(&wf, path))) {
        pkv_err_prefix(st, "save");
        goto done;
    }
    f.out = wf.f;
    f.h = pkv_hash64(hdr, hb, 0);
    if (fwrite(hdr, 1, hb, f.out) != hb) st = pkv_err(PKV_ERR_IO, "save: writing the header of %s failed", path);
    for (int il = 0; il < l->n_layers && !st; il++) {
        int o = holder(c, k, nk, il);
        if (o >= 0) st = k[o]->save(c, &f, &part[o], KV_FILE_LAYER, il);
    }
    if (!st && fwrite(&f.h, 1, 8, f.out) != 8)
        st = pkv_err(PKV_ERR_IO, "save: writing the checksum of %s failed", path);
    for (int i = 0; i < nk && !st; i++)
        if (k[i]->save) st = k[i]->save(c, &f, &part[i], KV_FILE_TAIL, -1);
    if (st)
        pkv_wfile_abort(&wf);
    else if ((st = pkv_wfile_commit(&wf)))
        pkv_err_prefix(st, "save");
done:
    for (int i = 0; i < nk; i++) pkv_free(part[i].ptr);
    pkv_free(hdr);
    pkv_free(f.canon);
    pkv_free(f.tmp);
    return st;
}

/* The version names the newest kind whose parts the file holds: from the newest
 * kind down, the first one the cache has (or the file has) decides. */
static pkv_status check_version(const kv_file *f, uint32_t version) {
    const pkv_mem_kind *all[N_KINDS];
    int n = pkv_kv_kinds_all(all);
    for (uint32_t v = KV_FILE_VERSION_LAST; v > KV_FILE_VERSION; v--)
        for (int i = 0; i < n; i++) {
            if (all[i]->file_version != v) continue;
            bool here = all[i]->present(f->cache), in_file = version == v;
            if (here != in_file)
                return pkv_err(PKV_ERR_FORMAT, "%s was saved from a cache %s %s, this cache has %s", f->path,
                               here ? "without" : "with", all[i]->file_what, here ? "some" : "none");
            if (here) return PKV_OK;
        }
    return PKV_OK;
}

/* Parse and check the whole file against the cache, the kinds' parts included;
 * on success f holds n_tokens, fp, exact_until, the offsets of the tokens and of
 * each layer's payload, and the verified checksum. */
static pkv_status check_file(kv_file *f, const pkv_mem_kind **k, int nk, kv_file_part *part) {
    const pkv_kv_cache *c = f->cache;
    const pkv_kv_layout *l = &c->layout;
    const char *path = f->path;
    const uint8_t *data = f->data;
    size_t size = f->size;
    if (size < 8 + 16 + 8 || memcmp(data, KV_FILE_MAGIC, 8) != 0)
        return pkv_err(PKV_ERR_FORMAT, "%s is not a pagekv sequence file (bad magic or shorter than a header: %zu bytes)",
                       path, size);
    const uint8_t *p = data + 8;
    uint32_t version = kv_get32(&p), n_layers = kv_get32(&p), page_size = kv_get32(&p);
    (void)kv_get32(&p);
    uint64_t layout_fp = kv_get64(&p);
    if (version < KV_FILE_VERSION || version > KV_FILE_VERSION_LAST)
        return pkv_err(PKV_ERR_FORMAT, "%s: format version %u, this build reads versions %u to %u", path, version,
                       KV_FILE_VERSION, KV_FILE_VERSION_LAST);
    pkv_status st = check_version(f, version);
    if (st) return st;
    if (n_layers != (uint32_t)l->n_layers)
        return pkv_err(PKV_ERR_FORMAT, "%s: the file has %u layers, the cache has %d", path, n_layers, l->n_layers);
    if (size < header_bytes(f, k, nk, part, 0))
        return pkv_err(PKV_ERR_FORMAT, "%s is truncated: %zu bytes, shorter than its header", path, size);
    for (int il = 0; il < l->n_layers; il++) {
        int o = holder(c, k, nk, il);
        f->get = p + (size_t)il * 16;
        if (o >= 0 && k[o]->load_check && (st = k[o]->load_check(f->cache, f, &part[o], KV_FILE_ROW, il))) return st;
    }
    p += (size_t)l->n_layers * 16;
    if (page_size != (uint32_t)l->page_size)
        return pkv_err(PKV_ERR_FORMAT, "%s: pages of %u tokens in the file, %d in the cache", path, page_size,
                       l->page_size);
    if (version > KV_FILE_VERSION && layout_fp != l->fingerprint)
        return pkv_err(PKV_ERR_FORMAT, "%s: layout fingerprint %016llx, the cache's is %016llx (layers, windows, "
                       "state sizes or parts, or page size differ)", path, (unsigned long long)layout_fp,
                       (unsigned long long)l->fingerprint);
    uint64_t n = kv_get64(&p);
    f->fp = kv_get64(&p);
    uint64_t ex = kv_get64(&p);
    f->exact_until = ex > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)ex;
    /* Each token needs at least 8 bytes of header, so this bounds n before any product. */
    if (n > (uint64_t)INT32_MAX || n > size / 8)
        return pkv_err(PKV_ERR_FORMAT, "%s is truncated or corrupt: %llu tokens in a file of %zu bytes", path,
                       (unsigned long long)n, size);
    f->n_tokens = (int64_t)n;
    f->get = p;
    for (int i = 0; i < nk; i++)
        if (k[i]->load_check && (st = k[i]->load_check(f->cache, f, &part[i], KV_FILE_HEADER, -1))) return st;
    size_t hb = header_bytes(f, k, nk, part, (int64_t)n), want = hb;
    f->tok_off = hb - (size_t)n * 8;
    size_t b[2];
    for (int il = 0; il < l->n_layers; il++) {
        int o = holder(c, k, nk, il);
        f->layer_off[il] = want;
        int ns = o < 0 ? 0 : kind_bytes(k[o], f, &part[o], KV_FILE_LAYER, il, b);
        for (int j = 0; j < ns; j++) want += b[j];
    }
    want += 8;
    if (size < want)
        return pkv_err(PKV_ERR_FORMAT, "%s is truncated: %zu bytes, %zu expected for %llu tokens", path, size, want,
                       (unsigned long long)n);
    uint64_t h = pkv_hash64(data, hb, 0);
    for (int il = 0; il < l->n_layers; il++) {
        int o = holder(c, k, nk, il), ns = o < 0 ? 0 : kind_bytes(k[o], f, &part[o], KV_FILE_LAYER, il, b);
        size_t off = f->layer_off[il];
        for (int j = 0; j < ns; j++) {
            h = pkv_hash64(data + off, b[j], h);
            off += b[j];
        }
    }
    uint64_t stored;
    memcpy(&stored, data + want - 8, 8);
    if (stored != h)
        return pkv_err(PKV_ERR_FORMAT, "%s: checksum mismatch (stored %016llx, computed %016llx): the file is corrupt",
                       path, (unsigned long long)stored, (unsigned long long)h);
    f->h = h;
    f->end = want;
    for (int i = 0; i < nk; i++)
        if (k[i]->load_check && (st = k[i]->load_check(f->cache, f, &part[i], KV_FILE_TAIL, -1))) return st;
    if (f->end != size) /* the media trailer is the only part after the checksum */
        return pkv_err(PKV_ERR_FORMAT, "%s has %zu bytes after the expected end (%zu bytes) that are not a media "
                       "section", path, size - want, want);
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

pkv_status pkv_kv_seq_load_memory(pkv_kv_cache *c, const char *label, const void *bytes, size_t size,
                                  uint64_t fingerprint, int32_t *seq) {
    if (!c || !seq || (!bytes && size)) return pkv_err(PKV_ERR_INVALID, "pkv_kv_seq_load_memory: NULL argument");
    const char *path = label ? label : "<memory>";
    const pkv_mem_kind *k[N_KINDS];
    uint32_t version;
    int nk = file_kinds(c, k, &version);
    kv_file f = {.cache = c, .path = path, .load = true, .seq = -1, .data = bytes, .size = size};
    kv_file_part part[N_KINDS];
    memset(part, 0, sizeof part);
    int loaded = 0;
    pkv_status st = PKV_OK;
    f.layer_off = pkv_malloc((size_t)(c->layout.n_layers ? c->layout.n_layers : 1) * sizeof *f.layer_off);
    if (!f.layer_off) {
        st = pkv_err(PKV_ERR_NOMEM, "load of %s: out of memory", path);
        goto done;
    }
    if ((st = check_file(&f, k, nk, part))) goto done;
    if (fingerprint && f.fp != fingerprint) { /* another model's (or adapter's) KV: never adopted as this one's */
        st = pkv_err(PKV_ERR_FORMAT, "load of %s: it was saved by another producer (sequence fingerprint %016llx, "
                     "expected %016llx: another model or other weights)", path, (unsigned long long)f.fp,
                     (unsigned long long)fingerprint);
        goto done;
    }
    if (!fingerprint) fingerprint = f.fp;
    f.fp = fingerprint;
    for (int i = 0; i < nk && !st; i++)
        if (k[i]->load_check) st = k[i]->load_check(c, &f, &part[i], KV_FILE_FIT, -1);
    if (st) goto done;
    f.tmp = pkv_malloc(staging(&f, k, nk, part, false, NULL));
    if (!f.tmp) {
        st = pkv_err(PKV_ERR_NOMEM, "load of %s: out of memory", path);
        goto done;
    }
    for (; loaded < nk && !st; loaded++)
        if (k[loaded]->load) st = k[loaded]->load(c, &f, &part[loaded]);
    if (st) { /* kind loaded - 1 failed: take the earlier ones back */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        for (int i = loaded - 2; i >= 0; i--)
            if (k[i]->load_undo) k[i]->load_undo(c, &f, &part[i]);
        st = pkv_err(st, "load of %s: %s", path, msg);
        goto done;
    }
    *seq = f.seq;
done:
    for (int i = 0; i < nk; i++) pkv_free(part[i].ptr);
    pkv_free(f.layer_off);
    pkv_free(f.tmp);
    return st;
}
