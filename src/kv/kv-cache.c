/* KV cache creation: layout, page arrays packed into per-device arenas, page pool,
 * host swap pool. */
#include "kv/kv-impl.h"

#include <string.h>

#define KV_ARRAY_ALIGN 256

bool pkv_kv_test_hash_collide = false;
bool pkv_kv_test_plain_host_pool = false;

pkv_kv_params pkv_kv_default_params(void) {
    pkv_kv_params p;
    memset(&p, 0, sizeof p);
    p.page_size = 16;
    p.rope_freq_base = 10000.0f;
    p.rope_freq_scale = 1.0f;
    return p;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Does this cache hold layer L's K/V arrays? The window sub-cache holds the window
 * layers, the main cache the other attention layers; recurrent layers have none
 * (their state slots are in the main cache, kv-state.c), nor have layers another
 * rank holds. */
static bool holds(const pkv_kv_cache *c, const kv_layer *L) {
    return L->state_per_head == 0 && !L->other_rank && (L->window > 0) == (c->window > 0);
}

bool pkv_kv_pool_holds(const pkv_kv_cache *pool, int il) {
    return pool && il >= 0 && il < pool->layout.n_layers && holds(pool, &pool->layout.layers[il]);
}

/* Assign every (layer, shard, K/V) array of this pool an arena and an offset. */
static pkv_status plan_arrays(pkv_kv_cache *c) {
    const pkv_kv_layout *l = &c->layout;
    int n = 0;
    for (int il = 0; il < l->n_layers; il++)
        n += holds(c, &l->layers[il]) ? (l->layers[il].v_in_k ? 1 : 2) * l->layers[il].n_shards : 0;
    c->arrays = pkv_calloc((size_t)n, sizeof *c->arrays);
    c->arenas = pkv_calloc((size_t)n, sizeof *c->arenas); /* at most one arena per array */
    if (!c->arrays || !c->arenas) return pkv_err(PKV_ERR_NOMEM, "KV cache: out of memory for %d page arrays", n);
    size_t ps = (size_t)c->page_size;
    size_t total_page = 0;
    for (int il = 0; il < l->n_layers; il++) {
        kv_layer *L = &l->layers[il];
        for (int is = 0; is < L->n_shards && holds(c, L); is++) {
            kv_shard *sh = &L->shards[is];
            for (int v = 0; v < (L->v_in_k ? 1 : 2); v++) { /* v_in_k: V is read from K, no array */
                kv_array *a = &c->arrays[c->n_arrays];
                a->layer = il;
                a->shard = is;
                a->is_v = v;
                a->row_bytes = (size_t)sh->n_heads * (v ? L->hv : L->hk);
                a->page_bytes = ps * a->row_bytes;
                size_t bytes;
                if (!pkv_mul_ok(a->page_bytes, (size_t)c->n_pages, &bytes) || bytes > SIZE_MAX / 2)
                    return pkv_err(PKV_ERR_NOMEM, "KV cache layer %d: %lld pages of %zu bytes overflow", il,
                                   (long long)c->n_pages, a->page_bytes);
                /* Find the open arena of this device; start a new one past its buffer limit. */
                int ar = -1;
                for (int k = c->n_arenas - 1; k >= 0; k--)
                    if (c->arenas[k].dev == sh->storage) {
                        ar = k;
                        break;
                    }
                size_t maxb = pkv_device_get_caps(sh->storage)->max_buffer_bytes;
                if (ar >= 0 && maxb && align_up(c->arenas[ar].size, KV_ARRAY_ALIGN) + bytes > maxb) ar = -1;
                if (ar < 0) {
                    ar = c->n_arenas++;
                    c->arenas[ar].dev = sh->storage;
                    c->arenas[ar].size = 0;
                }
                a->arena = ar;
                a->off = align_up(c->arenas[ar].size, KV_ARRAY_ALIGN);
                c->arenas[ar].size = a->off + bytes;
                if (v)
                    sh->v_array = c->n_arrays;
                else
                    sh->k_array = c->n_arrays;
                total_page += a->page_bytes;
                c->n_arrays++;
            }
        }
    }
    c->page_bytes_all = total_page;
    return PKV_OK;
}

static size_t layout_page_bytes(const pkv_kv_layout *l) {
    size_t t = 0;
    for (int il = 0; il < l->n_layers; il++) {
        const kv_layer *L = &l->layers[il];
        t += (size_t)l->page_size * (size_t)L->n_kv_heads * (L->hk + L->hv);
    }
    return t;
}

/* One pool: the main one (window 0: the full-attention layers, or every layer
 * when none has a window) or the window sub-cache (window > 0). */
static pkv_kv_cache *create_pool(pkv_kv_params p, int window) {
    pkv_kv_cache *c = pkv_calloc(1, sizeof *c);
    if (!c) {
        pkv_err(PKV_ERR_NOMEM, "KV cache: out of memory");
        return NULL;
    }
    pkv_status s = pkv_kv_layout_init(&c->layout, &p);
    if (s) {
        pkv_free(c);
        return NULL;
    }
    c->page_size = c->layout.page_size;
    c->window = window;
    c->keep = window > 0 ? (int64_t)window + c->page_size : 0;
    c->n_rot = p.rope_n_rot;
    c->neox = p.rope_neox;
    c->freq_base = p.rope_freq_base > 0 ? p.rope_freq_base : 10000.0f;
    c->freq_scale = p.rope_freq_scale > 0 ? p.rope_freq_scale : 1.0f;
    c->lru_head = c->lru_tail = -1;
    size_t pb = layout_page_bytes(&c->layout);
    if (p.n_pages < 0 || p.host_pages < 0) {
        s = pkv_err(PKV_ERR_INVALID, "KV cache: negative page count (%lld device, %lld host)",
                    (long long)p.n_pages, (long long)p.host_pages);
        goto fail;
    }
    if (pb == 0 && p.n_pages == 0) { /* every layer is recurrent: pages hold only token ids */
        s = pkv_err(PKV_ERR_INVALID, "KV cache: no layer has K/V pages (all are recurrent): set n_pages, the pages "
                    "that then hold only token ids");
        goto fail;
    }
    c->n_pages = p.n_pages ? p.n_pages : (int64_t)(p.budget_bytes / pb);
    if (c->n_pages <= 0) {
        s = pkv_err(PKV_ERR_INVALID, "KV cache: a budget of %llu bytes holds no page of %zu bytes (all layers, K+V)",
                    (unsigned long long)p.budget_bytes, pb);
        goto fail;
    }
    if ((uint64_t)c->n_pages * (uint64_t)c->page_size > INT32_MAX) {
        s = pkv_err(PKV_ERR_INVALID, "KV cache: %lld pages of %d tokens exceed 2^31 rows", (long long)c->n_pages,
                    c->page_size);
        goto fail;
    }
    c->host_pages = p.host_pages ? p.host_pages : pb ? (int64_t)(p.host_budget_bytes / pb)
                                                     : p.host_budget_bytes ? c->n_pages : 0;
    if ((s = plan_arrays(c))) goto fail;
    for (int k = 0; k < c->n_arenas; k++) {
        c->arenas[k].buf = pkv_buffer_alloc(c->arenas[k].dev, c->arenas[k].size);
        if (!c->arenas[k].buf) {
            s = pkv_err_prefix(PKV_ERR_NOMEM, "KV cache: %lld pages on %s", (long long)c->n_pages,
                               pkv_device_name(c->arenas[k].dev));
            goto fail;
        }
    }
    if (c->host_pages > 0) {
        size_t bytes;
        if (!pkv_mul_ok((size_t)c->host_pages, c->page_bytes_all, &bytes)) {
            s = pkv_err(PKV_ERR_NOMEM, "KV host pool: %lld pages overflow", (long long)c->host_pages);
            goto fail;
        }
        c->host_on_device = !pkv_kv_test_plain_host_pool;
        for (int k = 0; k < c->n_arenas; k++) c->host_on_device &= pkv_device_get_caps(c->arenas[k].dev)->host_memory;
        c->host_used = pkv_calloc((size_t)c->host_pages, 1);
        if (!c->host_on_device) c->host = pkv_malloc(bytes);
        if (!c->host_used || (!c->host_on_device && !c->host)) {
            s = pkv_err(PKV_ERR_NOMEM, "KV host pool: cannot allocate %lld pages (%zu bytes)",
                        (long long)c->host_pages, bytes);
            goto fail;
        }
        size_t off = 0;
        for (int i = 0; i < c->n_arrays; i++) {
            kv_arena *ar = &c->arenas[c->arrays[i].arena];
            size_t *at = c->host_on_device ? &ar->host_size : &off;
            c->arrays[i].host_off = *at;
            *at += (size_t)c->host_pages * c->arrays[i].page_bytes;
        }
        for (int k = 0; k < c->n_arenas && c->host_on_device; k++) {
            c->arenas[k].host_buf = pkv_buffer_alloc(c->arenas[k].dev, c->arenas[k].host_size);
            if (!c->arenas[k].host_buf) {
                s = pkv_err_prefix(PKV_ERR_NOMEM, "KV host pool: %lld pages", (long long)c->host_pages);
                goto fail;
            }
        }
        c->host_free = c->host_pages;
    }
    if ((s = pkv_kv_pool_init(c))) goto fail;
    if (window == 0 && (s = pkv_kv_state_init(c, &p))) goto fail; /* states live in the main cache */
    return c;
fail:
    (void)s; /* the message is set; freeing sets none */
    pkv_kv_cache_free(c);
    return NULL;
}

static pkv_kv_cache *create_pools(pkv_kv_params p);

pkv_kv_cache *pkv_kv_cache_create(pkv_kv_params p) {
    for (int il = 0; (p.disk_dir || p.remote_url) && p.layers && p.on_other_rank && il < p.n_layers; il++)
        if (p.on_other_rank[il] && p.layers[il].state_per_head <= 0) {
            pkv_err(PKV_ERR_UNSUPPORTED, "KV cache: the %s tier with layer %d held by another MPI rank is not supported",
                    p.disk_dir ? "disk" : "Redis", il);
            return NULL;
        }
    pkv_kv_cache *c = create_pools(p);
    if (c && ((p.disk_dir && pkv_kv_disk_open(c, &p)) || (p.remote_url && pkv_kv_remote_open(c, &p)))) {
        pkv_kv_cache_free(c);
        return NULL;
    }
    return c;
}

static pkv_kv_cache *create_pools(pkv_kv_params p) {
    int window = 0;
    for (int il = 0; p.layers && il < p.n_layers; il++)
        if (p.layers[il].state_per_head <= 0) /* a chunked layer keeps its chunk as a window would */
            window = PKV_MAX(window, PKV_MAX(p.layers[il].window, p.layers[il].chunk));
    pkv_kv_cache *c = create_pool(p, 0);
    if (!c || window <= 0) return c;
    if (p.window_pages < 0) {
        pkv_err(PKV_ERR_INVALID, "KV cache: %lld window pages", (long long)p.window_pages);
        pkv_kv_cache_free(c);
        return NULL;
    }
    p.n_pages = p.window_pages ? p.window_pages : c->n_pages;
    p.host_pages = c->host_pages;
    c->sub = create_pool(p, window);
    if (!c->sub) {
        pkv_err_prefix(PKV_ERR_INVALID, "KV cache: the pool of the sliding-window layers");
        pkv_kv_cache_free(c);
        return NULL;
    }
    c->sub->main = c;
    return c;
}

void pkv_kv_cache_free(pkv_kv_cache *c) {
    if (!c) return;
    pkv_kv_remote_close(c); /* publishes the cached pages not in Redis yet, while they exist */
    pkv_kv_disk_close(c); /* writes the cached pages not on disk yet, while they exist */
    pkv_kv_cache_free(c->sub);
    for (size_t i = 0; i < c->n_seqs; i++)
        if (c->seqs[i].live) pkv_kv_seq_release(c, &c->seqs[i]);
    pkv_kv_state_free(c);
    pkv_free(c->seqs);
    pkv_kv_pool_release(c);
    for (int k = 0; k < c->n_arenas; k++) {
        pkv_buffer_free(c->arenas[k].buf);
        pkv_buffer_free(c->arenas[k].host_buf);
    }
    pkv_free(c->arenas);
    pkv_free(c->arrays);
    pkv_free(c->host);
    pkv_free(c->host_used);
    pkv_free(c->bt_indptr);
    pkv_free(c->bt_pages);
    pkv_free(c->bt_last);
    pkv_free(c->bt_len);
    pkv_free(c->bt_tok_indptr);
    pkv_free(c->bt_pos);
    pkv_kv_layout_release(&c->layout);
    pkv_free(c);
}

void kv1_stats(const pkv_kv_cache *c, pkv_kv_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!c) return;
    *out = c->stats;
    out->n_pages = c->n_pages;
    out->pages_free = c->n_free;
    out->pages_cached = c->n_cached;
    out->pages_used = c->n_pages - c->n_free - c->n_cached;
    out->host_pages = c->host_pages;
    out->host_free = c->host_free;
    out->n_seqs = c->n_live;
    if (kv_has_state(c)) {
        out->state_slots = c->n_slots;
        out->state_free = c->n_slot_free;
        out->state_checkpoints = c->n_ck;
        out->state_slot_bytes = c->state_slot_bytes;
    }
}
