/* Prefix reuse: full pages are indexed by a chained hash of their tokens and
 * positions, seeded by the producer's fingerprint. A hit is trusted only after
 * comparing the page's tokens, positions, fingerprint and predecessor page (with
 * its generation, so a predecessor evicted and reused never matches), so the
 * whole prefix is verified and a hash collision can never return wrong KV. */
#include "kv/kv-impl.h"

#include <string.h>

uint64_t pkv_kv_page_key(const pkv_kv_cache *c, uint64_t seed, const int32_t *tok, const int32_t *pos) {
    if (pkv_kv_test_hash_collide) return 42;
    size_t n = (size_t)c->page_size * sizeof(int32_t);
    return pkv_hash64(pos, n, pkv_hash64(tok, n, seed));
}

static uint64_t fp_seed(uint64_t fp) {
    if (pkv_kv_test_hash_collide) return 42;
    return pkv_hash64(&fp, sizeof fp, 0x70726566697821ull);
}

uint64_t pkv_kv_fp_seed(uint64_t fp) { return fp_seed(fp); }
uint64_t pkv_kv_fp_seed2(uint64_t fp) { return pkv_hash64(&fp, sizeof fp, 0x6b766469736b32ull); }

/* A second chain over the same tokens with another seed: the disk tier compares
 * both, so a page file is trusted only when two independent 64-bit chains agree. */
uint64_t pkv_kv_page_key2(const pkv_kv_cache *c, uint64_t seed, const int32_t *tok, const int32_t *pos) {
    size_t n = (size_t)c->page_size * sizeof(int32_t);
    return pkv_hash64(tok, n, pkv_hash64(pos, n, seed ^ 0x9e3779b97f4a7c15ull));
}

static void index_insert(pkv_kv_cache *c, int32_t id, uint64_t key, uint64_t fp, int32_t prev) {
    kv_page *p = &c->pages[id];
    uint64_t b = key & (c->n_buckets - 1);
    p->key = key;
    p->fp = fp;
    p->prev_page = prev;
    p->prev_gen = prev >= 0 ? c->pages[prev].gen : 0;
    p->indexed = true;
    p->hnext = c->buckets[b];
    c->buckets[b] = id;
}

void pkv_kv_index_page(pkv_kv_cache *c, int32_t id, uint64_t key, uint64_t fp, int32_t prev) {
    index_insert(c, id, key, fp, prev);
}

void pkv_kv_index_remove(pkv_kv_cache *c, int32_t id) {
    kv_page *p = &c->pages[id];
    if (!p->indexed) return;
    int32_t *link = &c->buckets[p->key & (c->n_buckets - 1)];
    while (*link != id) link = &c->pages[*link].hnext;
    *link = p->hnext;
    p->hnext = -1;
    p->indexed = false;
    p->gen++; /* pages chained after this one no longer match */
    if (p->st_slot >= 0) pkv_kv_state_page_drop(c, id);
}

void pkv_kv_seq_publish(pkv_kv_cache *c, kv_seq *s) { pkv_kv_seq_publish_upto(c, s, INT64_MAX); }

void pkv_kv_seq_publish_upto(pkv_kv_cache *c, kv_seq *s, int64_t n) {
    if (!s->fp || s->swapped) return;
    int ps = c->page_size;
    int64_t full = PKV_MIN(PKV_MIN(s->n_tokens, s->exact_until), n) / ps;
    while (!s->pub_stop && s->pub_n < full) {
        int32_t id = pkv_kv_seq_page(s, s->pub_n);
        int32_t prev = s->pub_n > 0 ? pkv_kv_seq_page(s, s->pub_n - 1) : -1;
        if (id < 0 || (s->pub_n > 0 && prev < 0)) { /* released window pages: the chain is cut */
            s->pub_stop = true;
            break;
        }
        kv_page *p = &c->pages[id];
        if (!p->indexed) {
            const int32_t *tok = &c->tok[(size_t)id * ps], *pos = &c->pos[(size_t)id * ps];
            bool known = true;
            for (int i = 0; i < ps; i++) known &= tok[i] >= 0 || pkv_token_is_media(tok[i]); /* media rows: by content */
            if (!known) {
                s->pub_stop = true;
                break;
            }
            uint64_t seed = prev >= 0 ? c->pages[prev].key : fp_seed(s->fp);
            index_insert(c, id, pkv_kv_page_key(c, seed, tok, pos), s->fp, prev);
            p->prev_key = seed;
            p->on_disk = false;
            p->on_remote = false;
            if (c->disk || c->remote)
                p->key2 = pkv_kv_page_key2(c, prev >= 0 ? c->pages[prev].key2 : pkv_kv_fp_seed2(s->fp), tok, pos);
            p->link = -1;
            p->st_slot = -1;
            if (c->main) { /* window pool: remember the main page this one sits beside */
                const kv_seq *ms = &c->main->seqs[s - c->seqs];
                if (ms->live && !ms->swapped && s->pub_n < pkv_kv_seq_pages(c->main, ms)) {
                    int32_t mp = pkv_kv_seq_page(ms, s->pub_n);
                    if (c->main->pages[mp].indexed) {
                        p->link = mp;
                        p->link_gen = c->main->pages[mp].gen;
                    }
                }
            }
        }
        s->pub_n++;
    }
}

pkv_status kv1_prefix_match(pkv_kv_cache *c, int32_t seq, const int32_t *tokens, const int32_t *pos, int64_t n,
                               int64_t *n_matched) {
    if (!c || !n_matched || (n > 0 && !tokens) || n < 0)
        return pkv_err(PKV_ERR_INVALID, "pkv_kv_prefix_match: NULL or negative argument");
    kv_seq *s = pkv_kv_seq_resident(c, seq, "prefix match");
    if (!s) return PKV_ERR_INVALID;
    if (s->n_tokens != 0)
        return pkv_err(PKV_ERR_INVALID, "prefix match: sequence %d already holds %lld tokens (it must be empty)", seq,
                       (long long)s->n_tokens);
    *n_matched = 0;
    if (!s->fp) return PKV_OK;
    int ps = c->page_size;
    int64_t n_full = n / ps;
    int32_t *posbuf = NULL, *found = NULL;
    if (!pos && n_full > 0) {
        posbuf = pkv_malloc((size_t)(n_full * ps) * sizeof *posbuf);
        if (!posbuf) return pkv_err(PKV_ERR_NOMEM, "prefix match: out of memory");
        for (int64_t i = 0; i < n_full * ps; i++) posbuf[i] = (int32_t)i;
        pos = posbuf;
    }
    /* Depth-first over candidates: with duplicate chains (the same prefix computed
     * twice) the first candidate of a page need not lead to the longest match. */
    size_t nf = (size_t)(n_full ? n_full : 1);
    found = pkv_malloc(nf * (3 * sizeof(int32_t) + sizeof(uint64_t)) + 8);
    if (!found) {
        pkv_free(posbuf);
        return pkv_err(PKV_ERR_NOMEM, "prefix match: out of memory");
    }
    int32_t *path = found + nf, *cur = path + nf;
    uint64_t *keys = (uint64_t *)(void *)(cur + nf + (nf & 1)); /* 8-byte aligned */
    uint64_t seed = fp_seed(s->fp);
    for (int64_t i = 0; i < n_full; i++) seed = keys[i] = pkv_kv_page_key(c, seed, tokens + i * ps, pos + i * ps);
    int64_t m = 0, depth = 0;
    size_t bytes = (size_t)ps * sizeof(int32_t);
    if (n_full > 0) cur[0] = -2;
    while (n_full > 0 && depth >= 0) {
        int32_t prev = depth > 0 ? path[depth - 1] : -1;
        int32_t q = cur[depth] == -2 ? c->buckets[keys[depth] & (c->n_buckets - 1)] : c->pages[cur[depth]].hnext;
        const int32_t *tk = tokens + depth * ps, *pp = pos + depth * ps;
        for (; q >= 0; q = c->pages[q].hnext) {
            const kv_page *p = &c->pages[q];
            if (p->key != keys[depth] || p->fp != s->fp || p->prev_page != prev) continue;
            if (prev >= 0 && p->prev_gen != c->pages[prev].gen) continue;
            if (memcmp(&c->tok[(size_t)q * ps], tk, bytes) || memcmp(&c->pos[(size_t)q * ps], pp, bytes)) continue;
            break;
        }
        if (q < 0) {
            depth--;
            continue;
        }
        cur[depth] = q;
        path[depth] = q;
        /* With recurrent layers a hit must end where a state is stored (a duplicate
         * chain may have one where the first does not). */
        if (depth + 1 > m && (!kv_has_state(c) || pkv_kv_state_stored(c, q, (depth + 1) * ps))) {
            m = depth + 1;
            memcpy(found, path, (size_t)m * sizeof *found);
        }
        if (m == n_full) break;
        if (depth + 1 < n_full) cur[++depth] = -2; /* else: the next candidate at this depth */
    }
    if (m > 0 && (size_t)m > s->cap_own) {
        void *arr = s->own;
        size_t cap = s->cap_own;
        pkv_status st = pkv_grow(&arr, &cap, (size_t)m, sizeof(int32_t));
        if (st) {
            pkv_free(found);
            pkv_free(posbuf);
            return st;
        }
        s->own = arr;
        s->cap_own = cap;
    }
    for (int64_t i = 0; i < m; i++) {
        pkv_kv_page_ref(c, found[i]);
        s->own[i] = found[i];
    }
    s->n_own = (size_t)m;
    s->n_tokens = m * ps;
    s->pub_n = m;
    s->pub_stop = false;
    c->stats.prefix_hit_pages += (uint64_t)m;
    if (c->disk && m < n_full) { /* the disk tier goes on where memory stopped */
        m = pkv_kv_disk_match(c, s, tokens, pos, m, n_full, keys);
        s->n_tokens = m * ps;
    }
    if (c->remote && m < n_full) { /* and the remote tier where the disk stopped */
        m = pkv_kv_remote_match(c, s, tokens, pos, m, n_full, keys);
        s->n_tokens = m * ps;
    }
    pkv_free(found);
    pkv_free(posbuf);
    *n_matched = m * ps;
    return PKV_OK;
}
