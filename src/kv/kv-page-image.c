/* A stored page: the one format the tiers below memory keep a full prefix page in
 * (the disk tier's page file, kv-disk.c, and the remote tier's value, kv-redis.c).
 * What a page image holds and how it is verified are described here once; the
 * tiers only decide where images live.
 *
 * Image, version 1, integers little-endian:
 *   "PKVDPAGE", u32 version, u32 page_size, u32 n_layers, u32 flags (bit 0: a
 *       recurrent-state section follows the payload; bit 1: a window section does)
 *   u64 layout fingerprint (pkv_kv_layout_fingerprint: geometry, dtypes, page size)
 *   u64 producer fingerprint (the sequence's, e.g. the model's)
 *   u64 key (the page's chained prefix key), u64 prev_key (the predecessor's key,
 *       or the chain's seed for a first page), u64 key2 (a second chain over the
 *       same tokens with another seed), u64 payload bytes
 *   i32 tokens[page_size], i32 positions[page_size]
 *   payload: per layer, K [page_size][n_kv_heads][head row] then V likewise (the
 *       canonical order of kv-file.c, independent of sharding); a recurrent layer
 *       and a sliding-window layer have no rows here (0 bytes)
 *   with flags bit 1: the sliding-window layers' rows of the page, in the same
 *       order (their pool's page beside this one, when it was still cached: a
 *       prefix hit on a sliding model needs the window before its end, so the
 *       last pages of a prompt carry it and the earlier ones, released as the
 *       window moved on, do not)
 *   with flags bit 0: u64 pos, then the recurrent state the page offered to
 *       prefix matching (the state after its sequence's first pos tokens, pos the
 *       page's end), every recurrent layer's [n_kv_heads][state_per_head] f32 in
 *       the layers' order (kv-state.c's canonical order, as in saved sequences)
 *   u64 checksum: pkv_hash64 over everything before it, the header first and then
 *       each section chained (as kv-file.c's): payload, window, state
 * A cache without sliding-window layers writes what format 1 always held.
 * An image is used only if its size, magic, version, flags, page size, layer
 * count, both fingerprints, key, prev_key, key2, tokens, positions and checksum
 * all match what the request expects (pkv_kv_pimg_check). */
#include "kv/kv-file.h"
#include "kv/kv-impl.h"

#include <string.h>

#define PIMG_MAGIC "PKVDPAGE"
#define PIMG_VERSION 1u

/* header fields at a fixed offset (kv-impl.h's cursor readers, the cursor a copy) */
static uint32_t get32(const uint8_t *p) { return kv_get32(&p); }
static uint64_t get64(const uint8_t *p) { return kv_get64(&p); }

/* Whether a tier (what: "KV disk tier (DIR)", "KV remote tier") can store c's
 * pages: every kind of layer but chunked attention. */
pkv_status pkv_kv_pimg_supported(const pkv_kv_cache *c, const char *what) {
    for (int il = 0; il < c->layout.n_layers; il++)
        if (c->layout.layers[il].chunk > 0)
            return pkv_err(PKV_ERR_UNSUPPORTED, "%s: layer %d is a chunked-attention layer; the tier works for caches "
                           "of full-attention, sliding-window and recurrent layers (not implemented: chunked layers)",
                           what, il);
    return PKV_OK;
}

/* A layer's K or V section of pool's image part: a layer the pool does not hold
 * has none (a recurrent layer's state is the image's state section). */
static size_t sect_bytes(const pkv_kv_cache *pool, int il, int v) {
    return pool && pkv_kv_pool_holds(pool, il) ? pkv_kv_file_layer_bytes(pool, il, pool->page_size, v) : 0;
}

static size_t tmp_of(const pkv_kv_cache *pool, size_t tmp) {
    for (int a = 0; pool && a < pool->n_arrays; a++) tmp = PKV_MAX(tmp, pool->arrays[a].page_bytes);
    return tmp;
}

pkv_status pkv_kv_pimg_init(kv_pimg *g, const pkv_kv_cache *c, const char *what) {
    memset(g, 0, sizeof *g);
    size_t ps = (size_t)c->page_size, payload = 0;
    g->page_size = (int)ps;
    g->n_sect = 2 * c->layout.n_layers;
    g->sect = pkv_malloc((size_t)g->n_sect * sizeof *g->sect);
    g->wsect = pkv_malloc((size_t)g->n_sect * sizeof *g->wsect);
    if (!g->sect || !g->wsect) {
        pkv_kv_pimg_release(g);
        return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", what);
    }
    for (int il = 0; il < c->layout.n_layers; il++)
        for (int v = 0; v < 2; v++) {
            payload += g->sect[2 * il + v] = sect_bytes(c, il, v);
            g->win_bytes += g->wsect[2 * il + v] = sect_bytes(c->sub, il, v);
        }
    g->base_bytes = PKV_PIMG_HEADER + 8 * ps + payload + 8;
    const size_t canon = pkv_kv_state_canon_bytes(c);
    g->state_bytes = canon ? 8 + canon : 0;
    g->max_bytes = g->base_bytes + g->win_bytes + g->state_bytes;
    g->tmp_bytes = tmp_of(c->sub, tmp_of(c, 1));
    return PKV_OK;
}

void pkv_kv_pimg_release(kv_pimg *g) {
    pkv_free(g->sect);
    pkv_free(g->wsect);
    g->sect = g->wsect = NULL;
}

kv_pimg_plan pkv_kv_pimg_plan(const pkv_kv_cache *c, const kv_pimg *g, int32_t id) {
    kv_pimg_plan p = {-1, false, 0, g->base_bytes};
    p.has_state = g->state_bytes && pkv_kv_state_page_offered(c, id, &p.spos);
    if (g->win_bytes) p.win = pkv_kv_window_linked(c, id);
    p.bytes += (p.has_state ? g->state_bytes : 0) + (p.win >= 0 ? g->win_bytes : 0);
    return p;
}

/* The rows of the layers pool holds, page id, between the cache and the image at
 * *p (advanced past them); sect: those layers' section sizes. */
static pkv_status move_rows(pkv_kv_cache *pool, const size_t *sect, int32_t id, uint8_t **p, uint8_t *tmp, bool in) {
    pkv_status st = PKV_OK;
    for (int il = 0; il < pool->layout.n_layers && !st; il++)
        for (int v = 0; v < 2 && !st; v++) {
            if (sect[2 * il + v]) st = pkv_kv_file_move_layer(pool, il, v, &id, 1, pool->page_size, *p, tmp, in);
            *p += sect[2 * il + v];
        }
    return st;
}

pkv_status pkv_kv_pimg_encode(pkv_kv_cache *c, const kv_pimg *g, int32_t id, kv_pimg_plan plan, uint8_t *img,
                              uint8_t *tmp) {
    const bool has_state = plan.has_state;
    const int ps = c->page_size;
    const kv_page *pg = &c->pages[id];
    uint8_t *p = img;
    memcpy(p, PIMG_MAGIC, 8);
    p += 8;
    kv_put32(&p, PIMG_VERSION);
    kv_put32(&p, (uint32_t)ps);
    kv_put32(&p, (uint32_t)c->layout.n_layers);
    kv_put32(&p, (has_state ? 1u : 0u) | (plan.win >= 0 ? 2u : 0u));
    kv_put64(&p, c->layout.fingerprint);
    kv_put64(&p, pg->fp);
    kv_put64(&p, pg->key);
    kv_put64(&p, pg->prev_key);
    kv_put64(&p, pg->key2);
    kv_put64(&p, (uint64_t)(g->base_bytes - PKV_PIMG_HEADER - 8 * (size_t)ps - 8));
    memcpy(p, &c->tok[(size_t)id * ps], (size_t)ps * 4);
    memcpy(p + (size_t)ps * 4, &c->pos[(size_t)id * ps], (size_t)ps * 4);
    p += (size_t)ps * 8;
    pkv_status st = move_rows(c, g->sect, id, &p, tmp, false);
    if (!st && plan.win >= 0) st = move_rows(c->sub, g->wsect, plan.win, &p, tmp, false);
    if (!st && has_state) {
        kv_put64(&p, (uint64_t)plan.spos);
        st = pkv_kv_state_page_read(c, id, p);
    }
    return st;
}

/* The checksum of image b (flags its header's), chained as written. */
static uint64_t checksum(const kv_pimg *g, const uint8_t *b, uint32_t flags) {
    size_t off = PKV_PIMG_HEADER + 8 * (size_t)g->page_size;
    uint64_t h = pkv_hash64(b, off, 0);
    for (int k = 0; k < g->n_sect; k++) {
        h = pkv_hash64(b + off, g->sect[k], h);
        off += g->sect[k];
    }
    for (int k = 0; (flags & 2) && k < g->n_sect; k++) { /* the window section */
        h = pkv_hash64(b + off, g->wsect[k], h);
        off += g->wsect[k];
    }
    if (flags & 1) h = pkv_hash64(b + off, g->state_bytes, h); /* the state section, chained last */
    return h;
}

/* The size of an image with these flags. */
static size_t size_of(const kv_pimg *g, uint32_t flags) {
    return g->base_bytes + (flags & 2 ? g->win_bytes : 0) + (flags & 1 ? g->state_bytes : 0);
}

void pkv_kv_pimg_seal(const kv_pimg *g, uint8_t *img, size_t bytes) {
    uint64_t h = checksum(g, img, get32(img + 20));
    memcpy(img + bytes - 8, &h, 8);
}

const char *pkv_kv_pimg_check(const pkv_kv_cache *c, const kv_pimg *g, const uint8_t *b, size_t n, uint64_t fp,
                              uint64_t key, uint64_t prev_key, uint64_t key2, const int32_t *tk, const int32_t *pp) {
    const size_t tb = (size_t)g->page_size * 4;
    if (n < g->base_bytes || n > g->max_bytes) return "wrong size";
    if (memcmp(b, PIMG_MAGIC, 8)) return "bad magic";
    if (get32(b + 8) != PIMG_VERSION) return "other format version";
    const uint32_t flags = get32(b + 20);
    if (flags > 3 || ((flags & 1) && !g->state_bytes) || ((flags & 2) && !g->win_bytes) || size_of(g, flags) != n)
        return "flags that do not match its size";
    if (get32(b + 12) != (uint32_t)g->page_size || get32(b + 16) != (uint32_t)c->layout.n_layers)
        return "other page size or layer count";
    if (get64(b + 24) != c->layout.fingerprint) return "other cache layout (fingerprint)";
    if (get64(b + n - 8) != checksum(g, b, flags)) return "checksum mismatch";
    if (get64(b + 32) != fp) return "produced by another model (fingerprint)";
    if (get64(b + 40) != key || get64(b + 48) != prev_key || get64(b + 56) != key2) return "another prefix chain";
    if (memcmp(b + PKV_PIMG_HEADER, tk, tb) || memcmp(b + PKV_PIMG_HEADER + tb, pp, tb))
        return "other tokens or positions";
    return NULL;
}

const uint8_t *pkv_kv_pimg_state(const kv_pimg *g, const uint8_t *b, size_t n, int64_t end) {
    (void)n;
    const uint32_t flags = get32(b + 20);
    if (!(flags & 1)) return NULL;
    const uint8_t *s = b + g->base_bytes - 8 + (flags & 2 ? g->win_bytes : 0); /* after the payload and window */
    return (int64_t)get64(s) == end ? s + 8 : NULL;
}

/* The window section of image b as a window-pool page beside main page id,
 * cached (no holder) and linked to it. Skipped without a page to spare. */
static void install_window(pkv_kv_cache *c, const kv_pimg *g, const uint8_t *b, int32_t id, uint8_t *tmp) {
    pkv_kv_cache *w = c->sub;
    const size_t tb = (size_t)g->page_size * 4;
    if (!w || pkv_kv_pool_available(w) < 1) return;
    int32_t wid;
    pkv_kv_pool_take(w, 1, &wid);
    uint8_t *p = (uint8_t *)b + g->base_bytes - 8;
    pkv_status st = move_rows(w, g->wsect, wid, &p, tmp, true);
    if (st) {
        PKV_WARN("KV tier: writing a loaded page's window rows to the device failed (%s); matched without them",
                 pkv_errmsg());
        pkv_kv_page_unref(w, wid);
        return;
    }
    memcpy(&w->tok[(size_t)wid * g->page_size], b + PKV_PIMG_HEADER, tb);
    memcpy(&w->pos[(size_t)wid * g->page_size], b + PKV_PIMG_HEADER + tb, tb);
    const kv_page *m = &c->pages[id];
    pkv_kv_index_page(w, wid, m->key, m->fp, -1);
    kv_page *wp = &w->pages[wid];
    wp->link = id;
    wp->link_gen = m->gen;
    wp->st_slot = -1;
    pkv_kv_page_unref(w, wid); /* cached: a prefix hit's window takes it */
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
    uint8_t *p = (uint8_t *)b + PKV_PIMG_HEADER + 2 * tb;
    pkv_status st = move_rows(c, g->sect, id, &p, tmp, true);
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
    if (get32(b + 20) & 2) install_window(c, g, b, id, tmp);
    *out = id;
    return PKV_OK;
}
