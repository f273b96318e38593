/* A stored page: the one format the tiers below memory keep a full prefix page in
 * (the disk tier's page file, kv-disk.c, and the remote tier's value, kv-redis.c).
 * What a page image holds and how it is verified are described here once; the
 * tiers only decide where images live.
 *
 * Image, version 1, integers little-endian:
 *   "PKVDPAGE", u32 version, u32 page_size, u32 n_layers, u32 flags (bit 0: a
 *       recurrent-state section follows the payload)
 *   u64 layout fingerprint (pkv_kv_layout_fingerprint: geometry, dtypes, page size)
 *   u64 producer fingerprint (the sequence's, e.g. the model's)
 *   u64 key (the page's chained prefix key), u64 prev_key (the predecessor's key,
 *       or the chain's seed for a first page), u64 key2 (a second chain over the
 *       same tokens with another seed), u64 payload bytes
 *   i32 tokens[page_size], i32 positions[page_size]
 *   payload: per layer, K [page_size][n_kv_heads][head row] then V likewise (the
 *       canonical order of kv-file.c, independent of sharding); a recurrent layer
 *       has no rows here (0 bytes)
 *   with flags bit 0: u64 pos, then the recurrent state the page offered to
 *       prefix matching (the state after its sequence's first pos tokens, pos the
 *       page's end), every recurrent layer's [n_kv_heads][state_per_head] f32 in
 *       the layers' order (kv-state.c's canonical order, as in saved sequences)
 *   u64 checksum: pkv_hash64 over everything before it, the header first and then
 *       each section chained (as kv-file.c's)
 * An image is used only if its size, magic, version, flags, page size, layer
 * count, both fingerprints, key, prev_key, key2, tokens, positions and checksum
 * all match what the request expects (pkv_kv_pimg_check). */
#include "kv/kv-file.h"
#include "kv/kv-impl.h"

#include <string.h>

#define PIMG_MAGIC "PKVDPAGE"
#define PIMG_VERSION 1u

static void put32(uint8_t **p, uint32_t v) {
    memcpy(*p, &v, 4);
    *p += 4;
}
static void put64(uint8_t **p, uint64_t v) {
    memcpy(*p, &v, 8);
    *p += 8;
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* A layer's K or V section: a recurrent layer has none (its state is the image's
 * state section). */
static size_t sect_bytes(const pkv_kv_cache *c, int il, int v) {
    return c->layout.layers[il].state_per_head > 0 ? 0 : pkv_kv_file_layer_bytes(c, il, c->page_size, v);
}

pkv_status pkv_kv_pimg_init(kv_pimg *g, const pkv_kv_cache *c, const char *what) {
    memset(g, 0, sizeof *g);
    size_t ps = (size_t)c->page_size, payload = 0, tmp = 1;
    g->page_size = (int)ps;
    g->n_sect = 2 * c->layout.n_layers;
    if (!(g->sect = pkv_malloc((size_t)g->n_sect * sizeof *g->sect)))
        return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", what);
    for (int il = 0; il < c->layout.n_layers; il++)
        for (int v = 0; v < 2; v++) payload += g->sect[2 * il + v] = sect_bytes(c, il, v);
    for (int a = 0; a < c->n_arrays; a++) tmp = PKV_MAX(tmp, c->arrays[a].page_bytes);
    g->base_bytes = PKV_PIMG_HEADER + 8 * ps + payload + 8;
    const size_t canon = pkv_kv_state_canon_bytes(c);
    g->state_bytes = canon ? 8 + canon : 0;
    g->tmp_bytes = tmp;
    return PKV_OK;
}

void pkv_kv_pimg_release(kv_pimg *g) {
    pkv_free(g->sect);
    g->sect = NULL;
}

size_t pkv_kv_pimg_bytes(const pkv_kv_cache *c, const kv_pimg *g, int32_t id, bool *has_state, int64_t *spos) {
    *spos = 0;
    *has_state = g->state_bytes && pkv_kv_state_page_offered(c, id, spos);
    return g->base_bytes + (*has_state ? g->state_bytes : 0);
}

pkv_status pkv_kv_pimg_encode(pkv_kv_cache *c, const kv_pimg *g, int32_t id, bool has_state, int64_t spos,
                              uint8_t *img, uint8_t *tmp) {
    const int ps = c->page_size;
    const kv_page *pg = &c->pages[id];
    uint8_t *p = img;
    memcpy(p, PIMG_MAGIC, 8);
    p += 8;
    put32(&p, PIMG_VERSION);
    put32(&p, (uint32_t)ps);
    put32(&p, (uint32_t)c->layout.n_layers);
    put32(&p, has_state ? 1u : 0u);
    put64(&p, c->layout.fingerprint);
    put64(&p, pg->fp);
    put64(&p, pg->key);
    put64(&p, pg->prev_key);
    put64(&p, pg->key2);
    put64(&p, (uint64_t)(g->base_bytes - PKV_PIMG_HEADER - 8 * (size_t)ps - 8));
    memcpy(p, &c->tok[(size_t)id * ps], (size_t)ps * 4);
    memcpy(p + (size_t)ps * 4, &c->pos[(size_t)id * ps], (size_t)ps * 4);
    p += (size_t)ps * 8;
    pkv_status st = PKV_OK;
    for (int il = 0; il < c->layout.n_layers && !st; il++)
        for (int v = 0; v < 2 && !st; v++) {
            if (g->sect[2 * il + v]) st = pkv_kv_file_move_layer(c, il, v, &id, 1, ps, p, tmp, false);
            p += g->sect[2 * il + v];
        }
    if (!st && has_state) {
        put64(&p, (uint64_t)spos);
        st = pkv_kv_state_page_read(c, id, p);
    }
    return st;
}

/* The checksum of image b of `bytes` (its last 8 bytes excluded), chained as written. */
static uint64_t checksum(const kv_pimg *g, const uint8_t *b, size_t bytes) {
    size_t off = PKV_PIMG_HEADER + 8 * (size_t)g->page_size;
    uint64_t h = pkv_hash64(b, off, 0);
    for (int k = 0; k < g->n_sect; k++) {
        h = pkv_hash64(b + off, g->sect[k], h);
        off += g->sect[k];
    }
    if (bytes > g->base_bytes) h = pkv_hash64(b + off, g->state_bytes, h); /* the state section, chained last */
    return h;
}

void pkv_kv_pimg_seal(const kv_pimg *g, uint8_t *img, size_t bytes) {
    uint64_t h = checksum(g, img, bytes);
    memcpy(img + bytes - 8, &h, 8);
}

const char *pkv_kv_pimg_check(const pkv_kv_cache *c, const kv_pimg *g, const uint8_t *b, size_t n, uint64_t fp,
                              uint64_t key, uint64_t prev_key, uint64_t key2, const int32_t *tk, const int32_t *pp) {
    const size_t tb = (size_t)g->page_size * 4;
    if (n != g->base_bytes && (!g->state_bytes || n != g->base_bytes + g->state_bytes)) return "wrong size";
    if (memcmp(b, PIMG_MAGIC, 8)) return "bad magic";
    if (get32(b + 8) != PIMG_VERSION) return "other format version";
    if (get32(b + 20) != (n > g->base_bytes ? 1u : 0u)) return "flags that do not match its size";
    if (get32(b + 12) != (uint32_t)g->page_size || get32(b + 16) != (uint32_t)c->layout.n_layers)
        return "other page size or layer count";
    if (get64(b + 24) != c->layout.fingerprint) return "other cache layout (fingerprint)";
    if (get64(b + n - 8) != checksum(g, b, n)) return "checksum mismatch";
    if (get64(b + 32) != fp) return "produced by another model (fingerprint)";
    if (get64(b + 40) != key || get64(b + 48) != prev_key || get64(b + 56) != key2) return "another prefix chain";
    if (memcmp(b + PKV_PIMG_HEADER, tk, tb) || memcmp(b + PKV_PIMG_HEADER + tb, pp, tb))
        return "other tokens or positions";
    return NULL;
}

const uint8_t *pkv_kv_pimg_state(const kv_pimg *g, const uint8_t *b, size_t n, int64_t end) {
    if (n <= g->base_bytes) return NULL;
    const uint8_t *s = b + g->base_bytes - 8; /* the state section follows the payload */
    return (int64_t)get64(s) == end ? s + 8 : NULL;
}

pkv_status pkv_kv_pimg_install(pkv_kv_cache *c, const kv_pimg *g, kv_seq *s, const uint8_t *b, int64_t dep,
                               const uint64_t *keys, uint64_t key2, uint8_t *tmp, int32_t *out) {
    const int ps = c->page_size;
    const size_t tb = (size_t)ps * 4;
    *out = -1;
    if (pkv_kv_pool_available(c) < 1) return PKV_ERR_OUT_OF_PAGES;
    if ((size_t)dep + 1 > s->cap_own) {
        void *arr = s->own;
        size_t cap = s->cap_own;
        pkv_status st = pkv_grow(&arr, &cap, (size_t)dep + 1, sizeof(int32_t));
        if (st) return st;
        s->own = arr;
        s->cap_own = cap;
    }
    int32_t id;
    pkv_kv_pool_take(c, 1, &id); /* may evict (and write) a cached page: the caller's tmp is not the writers' */
    size_t off = PKV_PIMG_HEADER + 2 * tb;
    pkv_status st = PKV_OK;
    for (int il = 0; il < c->layout.n_layers && !st; il++)
        for (int v = 0; v < 2 && !st; v++) {
            if (g->sect[2 * il + v]) st = pkv_kv_file_move_layer(c, il, v, &id, 1, ps, (uint8_t *)b + off, tmp, true);
            off += g->sect[2 * il + v];
        }
    if (st) {
        pkv_kv_page_unref(c, id);
        return st;
    }
    memcpy(&c->tok[(size_t)id * ps], b + PKV_PIMG_HEADER, tb);
    memcpy(&c->pos[(size_t)id * ps], b + PKV_PIMG_HEADER + tb, tb);
    int32_t prev = dep > 0 ? s->own[dep - 1] : -1;
    pkv_kv_index_page(c, id, keys[dep], s->fp, prev);
    kv_page *pg = &c->pages[id];
    pg->prev_key = dep ? keys[dep - 1] : pkv_kv_fp_seed(s->fp);
    pg->key2 = key2;
    pg->link = -1;
    pg->st_slot = -1;
    s->own[dep] = id;
    s->n_own = (size_t)dep + 1;
    s->pub_n = dep + 1;
    *out = id;
    return PKV_OK;
}
