/* KV layout: per-layer geometry (I4) and explicit shard placement (I5),
 * validated once at creation with errors that name the layer. */
#include "kv/kv-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Shards in order of their first head, stable: replicas (the same heads on several
 * devices, when devices outnumber KV heads) keep the order they were given in, so
 * shard i is the i-th device's. A layer has a shard per device: few. */
static void sort_shards(kv_shard *sh, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && sh[j].head_begin < sh[j - 1].head_begin; j--) {
            kv_shard t = sh[j];
            sh[j] = sh[j - 1];
            sh[j - 1] = t;
        }
}

uint64_t pkv_kv_geometry_hash(int n_layers, int page_size, const int32_t *geom) {
    int32_t head[3] = {0x4b56, n_layers, page_size};
    uint64_t h = pkv_hash64(head, sizeof head, 0x706b766c61796f75ull);
    return pkv_hash64(geom, (size_t)n_layers * 4 * sizeof(int32_t), h);
}

static pkv_status check_shards(const pkv_kv_params *p, int il, const pkv_kv_layer_desc *d) {
    if (d->n_shards < 0 || (d->n_shards > 0 && !d->shards))
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: %d shards but no shard list", il, d->n_shards);
    if (d->n_shards == 0 && !p->device)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: no shards and no default device (params.device)", il);
    return PKV_OK;
}

static pkv_status check_layer(const pkv_kv_params *p, int il, const pkv_kv_layer_desc *d) {
    if (d->n_kv_heads <= 0)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: %d KV heads (must be > 0)", il, d->n_kv_heads);
    if (d->state_per_head < 0)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: state_per_head %d (0 = attention, > 0 = recurrent)", il,
                       d->state_per_head);
    if (d->state_per_head == 0 && d->state_n_parts != 0)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: %d state parts but no state (state_per_head 0)", il,
                       d->state_n_parts);
    if (d->state_per_head > 0) { /* recurrent: head sizes, dtypes, window and RoPE do not apply */
        if ((uint64_t)d->n_kv_heads * (uint64_t)d->state_per_head > (uint64_t)INT32_MAX / 4)
            return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: a state of %d heads x %d floats is too large", il,
                           d->n_kv_heads, d->state_per_head);
        if (d->state_n_parts < 0 || d->state_n_parts > PKV_KV_STATE_MAX_PARTS)
            return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: %d state parts (0 = one, at most %d)", il,
                           d->state_n_parts, PKV_KV_STATE_MAX_PARTS);
        int64_t sum = 0;
        for (int i = 0; i < d->state_n_parts; i++) {
            if (d->state_part[i] <= 0)
                return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: state part %d has %d floats (must be > 0)", il, i,
                               d->state_part[i]);
            sum += d->state_part[i];
        }
        if (d->state_n_parts > 0 && sum != d->state_per_head)
            return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: its %d state parts sum to %lld floats, state_per_head "
                           "is %d", il, d->state_n_parts, (long long)sum, d->state_per_head);
        return check_shards(p, il, d);
    }
    if (d->head_dim_k <= 0 || d->head_dim_v <= 0)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: head sizes K %d, V %d (must be > 0)", il,
                       d->head_dim_k, d->head_dim_v);
    for (int v = 0; v < (d->v_in_k ? 1 : 2); v++) { /* v_in_k: dtype_v is not used */
        const pkv_type t = v ? d->dtype_v : d->dtype_k;
        const int hd = v ? d->head_dim_v : d->head_dim_k;
        if (!pkv_kv_type_ok(t)) {
            const char *n = pkv_type_name(t);
            return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: %s dtype %s (KV pages are f32, f16, q8_0 or q4_0)", il,
                           v ? "V" : "K", n ? n : "unknown");
        }
        if (pkv_type_block_elems(t) > 1 && hd % (int)pkv_type_block_elems(t))
            return pkv_err(PKV_ERR_INVALID,
                           "KV layout layer %d: %s head size %d is not a multiple of %zu, the block of %s pages: "
                           "use f16 or f32 for %s",
                           il, v ? "V" : "K", hd, pkv_type_block_elems(t), pkv_type_name(t), v ? "V" : "K");
    }
    int n_rot = d->rope_n_rot ? d->rope_n_rot : p->rope_n_rot ? p->rope_n_rot : d->head_dim_k;
    if (n_rot <= 0 || n_rot % 2 || n_rot > d->head_dim_k)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: rope_n_rot %d must be even and <= head_dim_k %d", il,
                       n_rot, d->head_dim_k);
    if (d->rope_n_pairs < 0 || d->rope_n_pairs > n_rot / 2 || (d->rope_n_pairs > 0 && p->rope_yarn_ext_factor != 0))
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: rope_n_pairs %d must be in [0, %d] (rope_n_rot / 2) and 0 "
                       "with YaRN", il, d->rope_n_pairs, n_rot / 2);
    if (d->window < 0)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: window %d tokens (0 = full attention, > 0 = sliding)", il,
                       d->window);
    if (d->chunk < 0 || (d->chunk > 0 && d->window > 0))
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: chunk %d tokens with window %d (chunk 0 = none, > 0 = "
                       "chunked attention, not together with a window)", il, d->chunk, d->window);
    const int kblock = (int)pkv_type_block_elems(d->dtype_k);
    if (d->v_in_k && (d->n_kv_heads != 1 || d->head_dim_v > d->head_dim_k || d->head_dim_v % kblock))
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: V read from K (v_in_k) needs 1 KV head (got %d) and "
                       "head_dim_v %d <= head_dim_k %d, a multiple of %d (the %s block)", il, d->n_kv_heads,
                       d->head_dim_v, d->head_dim_k, kblock, pkv_type_name(d->dtype_k));
    if (d->rope_off < 0 || d->rope_off + n_rot > d->head_dim_k || (d->rope_off > 0 && d->n_kv_heads != 1) ||
        d->rope_off % kblock)
        return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: rope_off %d must be >= 0 with rope_off + n_rot (%d) <= "
                       "head_dim_k %d, a multiple of %d (the %s block), and > 0 only with 1 KV head (got %d)", il,
                       d->rope_off, n_rot, d->head_dim_k, kblock, pkv_type_name(d->dtype_k), d->n_kv_heads);
    return check_shards(p, il, d);
}

pkv_status pkv_kv_layout_init(pkv_kv_layout *l, const pkv_kv_params *p) {
    memset(l, 0, sizeof *l);
    if (p->n_layers <= 0 || !p->layers)
        return pkv_err(PKV_ERR_INVALID, "KV layout: %d layers%s", p->n_layers, p->layers ? "" : " and no layer list");
    int ps = p->page_size ? p->page_size : 16;
    if (ps < 1 || ps > PKV_KV_MAX_PAGE_SIZE)
        return pkv_err(PKV_ERR_INVALID, "KV layout: page size %d tokens is outside [1, %d]", p->page_size,
                       PKV_KV_MAX_PAGE_SIZE);
    if (!isfinite(p->rope_yarn_ext_factor) || !(p->rope_yarn_beta_fast >= 0 && p->rope_yarn_beta_fast < INFINITY) ||
        !(p->rope_yarn_beta_slow >= 0 && p->rope_yarn_beta_slow < INFINITY))
        return pkv_err(PKV_ERR_INVALID, "KV layout: YaRN rope_yarn_ext_factor %g, beta_fast %g, beta_slow %g must be finite "
                       "(betas >= 0; 0 = 32 and 1)", (double)p->rope_yarn_ext_factor, (double)p->rope_yarn_beta_fast,
                       (double)p->rope_yarn_beta_slow);
    if (p->rope_yarn_ext_factor != 0 && p->rope_yarn_n_ctx_orig <= 0)
        return pkv_err(PKV_ERR_INVALID, "KV layout: YaRN (rope_yarn_ext_factor %g) needs rope_yarn_n_ctx_orig > 0, the "
                       "model's original context length (got %d)", (double)p->rope_yarn_ext_factor, p->rope_yarn_n_ctx_orig);
    for (int il = 0; il < p->n_layers; il++) {
        pkv_status s = check_layer(p, il, &p->layers[il]);
        if (s) return s;
    }
    /* LongRoPE's factors: one per pair of the cache's rotation; every layer turns
     * with them (Phi-3's are global) */
    const int n_ff = p->rope_factors ? (p->rope_n_rot ? p->rope_n_rot : p->layers[0].head_dim_k) / 2 : 0;
    for (int i = 0; i < n_ff; i++)
        if (!(p->rope_factors[i] > 0 && p->rope_factors[i] < INFINITY))
            return pkv_err(PKV_ERR_INVALID, "KV layout: rope_factors[%d] is %g, must be finite and > 0", i,
                           (double)p->rope_factors[i]);
    for (int il = 0; n_ff && il < p->n_layers; il++)
        if (p->layers[il].state_per_head == 0 && p->layers[il].rope_n_rot && p->layers[il].rope_n_rot != 2 * n_ff)
            return pkv_err(PKV_ERR_INVALID, "KV layout layer %d: rope_n_rot %d differs from the %d dims of rope_factors",
                           il, p->layers[il].rope_n_rot, 2 * n_ff);
    if (n_ff) {
        l->rope_ff = pkv_malloc((size_t)n_ff * sizeof *l->rope_ff);
        if (!l->rope_ff) return pkv_err(PKV_ERR_NOMEM, "KV layout: out of memory for %d rope factors", n_ff);
        memcpy(l->rope_ff, p->rope_factors, (size_t)n_ff * sizeof *l->rope_ff);
        l->n_ff = n_ff;
    }
    l->layers = pkv_calloc((size_t)p->n_layers, sizeof *l->layers);
    if (!l->layers) {
        pkv_free(l->rope_ff);
        l->rope_ff = NULL;
        return pkv_err(PKV_ERR_NOMEM, "KV layout: out of memory for %d layers", p->n_layers);
    }
    l->n_layers = p->n_layers;
    l->page_size = ps;
    pkv_status s = PKV_OK;
    for (int il = 0; il < p->n_layers && !s; il++) {
        const pkv_kv_layer_desc *d = &p->layers[il];
        kv_layer *L = &l->layers[il];
        L->n_kv_heads = d->n_kv_heads;
        L->state_per_head = d->state_per_head;
        if (d->state_n_parts > 1) { /* one part is the plain layout */
            L->n_parts = d->state_n_parts;
            memcpy(L->part, d->state_part, (size_t)d->state_n_parts * sizeof *L->part);
        }
        const bool rec = d->state_per_head > 0; /* no K/V: sizes, types and window are ignored */
        L->dk = rec ? 0 : d->head_dim_k;
        L->dv = rec ? 0 : d->head_dim_v;
        L->tk = rec ? PKV_TYPE_F32 : d->dtype_k;
        L->tv = rec ? PKV_TYPE_F32 : d->v_in_k ? d->dtype_k : d->dtype_v;
        L->v_in_k = !rec && d->v_in_k;
        L->rope_off = rec ? 0 : d->rope_off;
        L->other_rank = !rec && p->on_other_rank && p->on_other_rank[il];
        /* a chunked layer lives in the window pool as a window of its chunk */
        L->window = rec ? 0 : d->chunk > 0 ? d->chunk : d->window;
        L->chunk = rec ? 0 : d->chunk;
        L->freq_base = d->rope_freq_base > 0 ? d->rope_freq_base : p->rope_freq_base > 0 ? p->rope_freq_base : 10000.0f;
        L->freq_scale = d->rope_freq_scale > 0 ? d->rope_freq_scale : p->rope_freq_scale > 0 ? p->rope_freq_scale : 1.0f;
        L->n_rot = rec ? 0 : d->rope_n_rot;
        L->n_pairs = rec ? 0 : d->rope_n_pairs;
        L->nope = !rec && d->rope_none;
        if (p->rope_yarn_ext_factor != 0 && !rec) { /* the forward pass's correction range: this layer's base */
            L->yarn_ext = p->rope_yarn_ext_factor;
            pkv_rope_yarn_corr_dims(d->rope_n_rot     ? d->rope_n_rot
                                    : p->rope_n_rot ? p->rope_n_rot
                                                    : d->head_dim_k,
                                    p->rope_yarn_n_ctx_orig, L->freq_base,
                                    p->rope_yarn_beta_fast > 0 ? p->rope_yarn_beta_fast : 32.0f,
                                    p->rope_yarn_beta_slow > 0 ? p->rope_yarn_beta_slow : 1.0f, L->yarn_corr);
        }
        L->hk = pkv_type_row_bytes(L->tk, (size_t)L->dk);
        L->hv = L->v_in_k ? 0 : pkv_type_row_bytes(L->tv, (size_t)L->dv); /* v_in_k: no V bytes of its own */
        int ns = d->n_shards ? d->n_shards : 1;
        L->shards = pkv_calloc((size_t)ns, sizeof *L->shards);
        if (!L->shards) {
            s = pkv_err(PKV_ERR_NOMEM, "KV layout layer %d: out of memory", il);
            break;
        }
        L->n_shards = ns;
        if (d->n_shards == 0) {
            L->shards[0] = (kv_shard){p->device, p->device, 0, d->n_kv_heads, -1, -1, -1};
        } else {
            for (int i = 0; i < ns; i++) {
                const pkv_kv_shard_desc *sd = &d->shards[i];
                if (!sd->storage) {
                    s = pkv_err(PKV_ERR_INVALID, "KV layout layer %d shard %d: no storage device", il, i);
                    break;
                }
                if (sd->n_heads <= 0 || sd->head_begin < 0 || sd->head_begin + sd->n_heads > d->n_kv_heads) {
                    s = pkv_err(PKV_ERR_INVALID,
                                "KV layout layer %d shard %d: heads [%d, %d) are outside the layer's %d KV heads", il,
                                i, sd->head_begin, sd->head_begin + sd->n_heads, d->n_kv_heads);
                    break;
                }
                L->shards[i] = (kv_shard){sd->storage, sd->compute ? sd->compute : sd->storage, sd->head_begin,
                                          sd->n_heads, -1, -1, -1};
            }
            if (s) break;
            sort_shards(L->shards, ns);
            int next = 0;
            for (int i = 0; i < ns && !s; i++) {
                kv_shard *sh = &L->shards[i];
                if (i > 0 && sh->head_begin == sh[-1].head_begin && sh->n_heads == sh[-1].n_heads)
                    continue; /* a replica of the shard before it (also on the same device: --kv-on-host) */
                if (sh->head_begin < next)
                    s = pkv_err(PKV_ERR_INVALID, "KV layout layer %d: shards overlap: head %d is in two shards with "
                                "different head ranges (replicas must hold the same heads)", il, sh->head_begin);
                else if (sh->head_begin > next)
                    s = pkv_err(PKV_ERR_INVALID, "KV layout layer %d: heads [%d, %d) are in no shard", il, next,
                                sh->head_begin);
                next = sh->head_begin + sh->n_heads;
            }
            if (!s && next != d->n_kv_heads)
                s = pkv_err(PKV_ERR_INVALID, "KV layout layer %d: heads [%d, %d) are in no shard", il, next,
                            d->n_kv_heads);
        }
        for (int i = 0; i < ns && !s; i++) {
            kv_shard *sh = &L->shards[i];
            if (!pkv_device_can_access(sh->compute, sh->storage))
                s = pkv_err(PKV_ERR_INVALID,
                            "KV layout layer %d shard %d (heads %d..%d): stored on %s but computed on %s, which cannot "
                            "access it: store the shard on %s or compute it on %s",
                            il, i, sh->head_begin, sh->head_begin + sh->n_heads - 1, pkv_device_name(sh->storage),
                            pkv_device_name(sh->compute), pkv_device_name(sh->compute), pkv_device_name(sh->storage));
        }
    }
    if (s) {
        pkv_kv_layout_release(l);
        return s;
    }
    int32_t *geom = pkv_malloc((size_t)l->n_layers * 4 * sizeof(int32_t));
    if (!geom) {
        pkv_kv_layout_release(l);
        return pkv_err(PKV_ERR_NOMEM, "KV layout: out of memory");
    }
    for (int il = 0; il < l->n_layers; il++) {
        geom[il * 4 + 0] = l->layers[il].n_kv_heads;
        geom[il * 4 + 1] = l->layers[il].dk;
        geom[il * 4 + 2] = l->layers[il].dv;
        geom[il * 4 + 3] = (int32_t)kv_dtype_word(l->layers[il].tk, l->layers[il].tv);
    }
    l->fingerprint = pkv_kv_geometry_hash(l->n_layers, l->page_size, geom);
    bool windows = false;
    for (int il = 0; il < l->n_layers; il++) {
        geom[il] = l->layers[il].window * (l->layers[il].chunk > 0 ? -1 : 1); /* chunked layers differ */
        windows |= geom[il] != 0;
    }
    /* Windows change which tokens a file holds: part of the geometry (hashed only
     * when present, so caches without them keep their fingerprints). */
    if (windows) l->fingerprint = pkv_hash64(geom, (size_t)l->n_layers * sizeof(int32_t), l->fingerprint);
    bool states = false;
    for (int il = 0; il < l->n_layers; il++) {
        geom[il] = l->layers[il].state_per_head;
        states |= geom[il] > 0;
    }
    /* So are recurrent layers and their state sizes (again only when present). */
    if (states) l->fingerprint = pkv_hash64(geom, (size_t)l->n_layers * sizeof(int32_t), ~l->fingerprint);
    /* And how a state is made of parts (which fixes what a file's per-head state
     * means), for the layers that have them. */
    for (int il = 0; il < l->n_layers; il++) {
        const kv_layer *L = &l->layers[il];
        if (L->n_parts == 0) continue;
        int32_t head[2] = {il, L->n_parts};
        l->fingerprint = pkv_hash64(head, sizeof head, l->fingerprint ^ 0x7061727473ull);
        l->fingerprint = pkv_hash64(L->part, (size_t)L->n_parts * sizeof *L->part, l->fingerprint);
    }
    /* K without RoPE on some layers is other data (hashed only when present) */
    bool nope = false;
    for (int il = 0; il < l->n_layers; il++) nope |= l->layers[il].nope;
    for (int il = 0; nope && il < l->n_layers; il++) geom[il] = l->layers[il].nope;
    if (nope) l->fingerprint = pkv_hash64(geom, (size_t)l->n_layers * sizeof(int32_t), l->fingerprint ^ 0x6e6f7065ull);
    /* So are V read from K and where K's rotation starts (MLA; hashed only when present):
     * a cache file of another latent width or layout is refused */
    bool mla = false;
    for (int il = 0; il < l->n_layers; il++) mla |= l->layers[il].v_in_k || l->layers[il].rope_off;
    for (int il = 0; mla && il < l->n_layers; il++)
        geom[il] = (int32_t)((uint32_t)l->layers[il].rope_off << 1 | (uint32_t)l->layers[il].v_in_k);
    if (mla) l->fingerprint = pkv_hash64(geom, (size_t)l->n_layers * sizeof(int32_t), l->fingerprint ^ 0x6d6c61ull);
    /* Layers another rank holds have nothing in this cache's files (hashed only when present) */
    bool other = false;
    for (int il = 0; il < l->n_layers; il++) other |= l->layers[il].other_rank;
    for (int il = 0; other && il < l->n_layers; il++) geom[il] = l->layers[il].other_rank;
    if (other) l->fingerprint = pkv_hash64(geom, (size_t)l->n_layers * sizeof(int32_t), l->fingerprint ^ 0x72656dull);
    /* K rotated with other frequency factors is other data (hashed only when present) */
    if (l->n_ff) l->fingerprint = pkv_hash64(l->rope_ff, (size_t)l->n_ff * sizeof *l->rope_ff, l->fingerprint ^ 0x66666ull);
    pkv_free(geom);
    return PKV_OK;
}

void pkv_kv_layout_release(pkv_kv_layout *l) {
    if (l->layers)
        for (int il = 0; il < l->n_layers; il++) pkv_free(l->layers[il].shards);
    pkv_free(l->layers);
    pkv_free(l->rope_ff);
    memset(l, 0, sizeof *l);
}

const pkv_kv_layout *pkv_kv_cache_layout(const pkv_kv_cache *c) { return c ? &c->layout : NULL; }
int pkv_kv_layout_n_layers(const pkv_kv_layout *l) { return l ? l->n_layers : 0; }
int pkv_kv_layout_page_size(const pkv_kv_layout *l) { return l ? l->page_size : 0; }
uint64_t pkv_kv_layout_fingerprint(const pkv_kv_layout *l) { return l ? l->fingerprint : 0; }
const float *pkv_kv_layout_rope_factors(const pkv_kv_layout *l, int *n) {
    if (n) *n = l ? l->n_ff : 0;
    return l ? l->rope_ff : NULL;
}

pkv_status pkv_kv_layout_layer(const pkv_kv_layout *l, int il, pkv_kv_layer_info *out) {
    if (!l || !out) return pkv_err(PKV_ERR_INVALID, "pkv_kv_layout_layer: NULL argument");
    if (il < 0 || il >= l->n_layers)
        return pkv_err(PKV_ERR_INVALID, "KV layer %d does not exist (the layout has %d layers)", il, l->n_layers);
    const kv_layer *L = &l->layers[il];
    memset(out, 0, sizeof *out);
    out->n_kv_heads = L->n_kv_heads;
    out->head_dim_k = L->dk;
    out->head_dim_v = L->dv;
    out->dtype_k = L->tk;
    out->dtype_v = L->tv;
    out->n_shards = L->n_shards;
    out->k_page_bytes = (size_t)l->page_size * (size_t)L->n_kv_heads * L->hk;
    out->v_page_bytes = (size_t)l->page_size * (size_t)L->n_kv_heads * L->hv;
    out->window = L->window;
    out->chunk = L->chunk;
    out->state_per_head = L->state_per_head;
    out->state_n_parts = L->n_parts;
    memcpy(out->state_part, L->part, (size_t)L->n_parts * sizeof *out->state_part);
    out->v_in_k = L->v_in_k;
    out->rope_off = L->rope_off;
    return PKV_OK;
}

pkv_status pkv_kv_shard(const pkv_kv_cache *c, int il, int ish, pkv_kv_shard_info *out) {
    if (!c || !out) return pkv_err(PKV_ERR_INVALID, "pkv_kv_shard: NULL argument");
    if (il < 0 || il >= c->layout.n_layers)
        return pkv_err(PKV_ERR_INVALID, "KV layer %d does not exist (the cache has %d layers)", il,
                       c->layout.n_layers);
    const kv_layer *L = &c->layout.layers[il];
    if (ish < 0 || ish >= L->n_shards)
        return pkv_err(PKV_ERR_INVALID, "KV layer %d has no shard %d (it has %d)", il, ish, L->n_shards);
    if (L->window > 0 && c->sub) return pkv_kv_shard(c->sub, il, ish, out); /* its arrays are in the window pool */
    const kv_shard *sh = &L->shards[ish];
    memset(out, 0, sizeof *out);
    out->storage = sh->storage;
    out->compute = sh->compute;
    out->head_begin = sh->head_begin;
    out->n_heads = sh->n_heads;
    out->n_pages = c->n_pages;
    if (L->other_rank) return PKV_OK; /* another rank's layer: where it would be stored, no arrays */
    if (L->state_per_head > 0) { /* recurrent: state slots, no K/V */
        const kv_state_array *a = &c->st_arrays[sh->s_array];
        out->state = c->st_arenas[a->arena].buf;
        out->state_off = a->off;
        out->state_slot_bytes = a->slot_bytes;
        out->n_state_slots = c->n_slots;
        return PKV_OK;
    }
    const kv_array *k = &c->arrays[sh->k_array];
    out->k = kv_array_buf(c, k);
    out->k_off = k->off;
    out->k_row_bytes = k->row_bytes;
    out->k_page_bytes = k->page_bytes;
    if (sh->v_array >= 0) { /* none where V is read from K (v_in_k) */
        const kv_array *v = &c->arrays[sh->v_array];
        out->v = kv_array_buf(c, v);
        out->v_off = v->off;
        out->v_row_bytes = v->row_bytes;
        out->v_page_bytes = v->page_bytes;
    }
    return PKV_OK;
}
