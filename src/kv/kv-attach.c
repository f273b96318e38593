/* Attach validation (I6): a second consumer of the cache (draft model, MTP head)
 * is checked once, up front, with errors that name the layer, both devices and
 * the fix, instead of failing deep inside a forward pass. */
#include "kv/kv-impl.h"

#include <stdio.h>

pkv_status pkv_kv_attach(const pkv_kv_cache *c, const char *consumer, int page_size,
                         const pkv_kv_attach_layer *layers, int n_layers) {
    const char *who = consumer && *consumer ? consumer : "consumer";
    if (!c || (n_layers > 0 && !layers) || n_layers < 0)
        return pkv_err(PKV_ERR_INVALID, "attach %s: NULL cache or layer list", who);
    if (page_size != c->page_size)
        return pkv_err(PKV_ERR_MISMATCH, "attach %s: it uses KV pages of %d tokens, the cache %d: build the %s with "
                       "page size %d", who, page_size, c->page_size, who, c->page_size);
    for (int j = 0; j < n_layers; j++) {
        const pkv_kv_attach_layer *d = &layers[j];
        int i = d->kv_layer;
        if (i < 0 || i >= c->layout.n_layers)
            return pkv_err(PKV_ERR_MISMATCH, "%s layer %d shares KV layer %d, but the cache has %d layers (0..%d)", who,
                           j, i, c->layout.n_layers, c->layout.n_layers - 1);
        const kv_layer *L = &c->layout.layers[i];
        if (L->state_per_head > 0)
            return pkv_err(PKV_ERR_MISMATCH, "%s layer %d shares KV layer %d, which is recurrent (a state of %d x %d "
                           "floats per sequence, no K/V pages): map the %s onto an attention layer", who, j, i,
                           L->n_kv_heads, L->state_per_head, who);
        if (d->n_kv_heads != L->n_kv_heads)
            return pkv_err(PKV_ERR_MISMATCH, "%s layer %d shares KV layer %d: it has %d KV heads, the cache layer %d",
                           who, j, i, d->n_kv_heads, L->n_kv_heads);
        if (d->head_dim_k != L->dk || d->head_dim_v != L->dv)
            return pkv_err(PKV_ERR_MISMATCH,
                           "%s layer %d shares KV layer %d: head sizes K %d, V %d, the cache layer has K %d, V %d", who,
                           j, i, d->head_dim_k, d->head_dim_v, L->dk, L->dv);
        for (int v = 0; v < 2; v++) {
            const pkv_type want = v ? d->dtype_v : d->dtype_k, have = v ? L->tv : L->tk;
            if (want == have) continue;
            const char *a = pkv_type_name(want), *b = pkv_type_name(have);
            return pkv_err(PKV_ERR_MISMATCH,
                           "%s layer %d shares KV layer %d: %s dtype %s, the cache layer stores %s: give the %s the "
                           "cache's KV types",
                           who, j, i, v ? "V" : "K", a ? a : "unknown", b, who);
        }
        for (int k = 0; k < L->n_shards; k++) {
            const kv_shard *sh = &L->shards[k];
            pkv_device *comp = d->compute ? d->compute : sh->compute;
            if (pkv_device_can_access(comp, sh->storage)) continue;
            char heads[64] = "";
            if (L->n_shards > 1) snprintf(heads, sizeof heads, " heads %d..%d", sh->head_begin, sh->head_begin + sh->n_heads - 1);
            return pkv_err(PKV_ERR_MISMATCH,
                           "%s layer %d shares KV layer %d%s, stored on %s, but computes on %s: place the %s on %s or "
                           "store the cache on %s",
                           who, j, i, heads, pkv_device_name(sh->storage), pkv_device_name(comp), who,
                           pkv_device_name(sh->storage), pkv_device_name(comp));
        }
    }
    return PKV_OK;
}
