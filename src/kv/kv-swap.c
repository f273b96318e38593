/* Swap: a sequence's pages go to a host pool and back in coalesced transfers (a
 * run of pages adjacent both on the device and in the host pool is one transfer
 * per K/V array). The host pool mirrors the device arrays page-major, so a page
 * keeps its exact bytes. Shared pages: swap out copies them and drops only this
 * sequence's reference; swap in gives the sequence private pages. */
#include "kv/kv-impl.h"

#include <string.h>

void pkv_kv_host_release_pages(pkv_kv_cache *c, const int32_t *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (h[i] < 0) continue; /* a released window page */
        c->host_used[h[i]] = 0;
        c->host_free++;
    }
}

/* Take n host pages: a contiguous run when one exists (first fit), else the
 * lowest free pages. Caller checked host_free >= n. */
static void host_take(pkv_kv_cache *c, int64_t n, int32_t *out) {
    if (n == 0) return;
    int64_t run = 0;
    for (int64_t i = 0; i < c->host_pages; i++) {
        run = c->host_used[i] ? 0 : run + 1;
        if (run == n) {
            for (int64_t k = 0; k < n; k++) out[k] = (int32_t)(i - n + 1 + k);
            goto mark;
        }
    }
    for (int64_t i = 0, k = 0; k < n; i++)
        if (!c->host_used[i]) out[k++] = (int32_t)i;
mark:
    for (int64_t k = 0; k < n; k++) c->host_used[out[k]] = 1;
    c->host_free -= n;
}

/* Host pool on the storage device itself: one batched region copy per arena. */
static pkv_status transfer_regions(pkv_kv_cache *c, const int32_t *dev, const int32_t *host, int64_t n, bool to_host) {
    int64_t n_runs = 0;
    for (int64_t i = 0; i < n; i++) n_runs += i == 0 || dev[i] != dev[i - 1] + 1 || host[i] != host[i - 1] + 1;
    pkv_region *r = pkv_malloc((size_t)(n_runs ? n_runs : 1) * (size_t)c->n_arrays * sizeof *r);
    if (!r) return pkv_err(PKV_ERR_NOMEM, "swap: out of memory for %lld regions", (long long)n_runs * c->n_arrays);
    pkv_status st = PKV_OK;
    for (int ar = 0; ar < c->n_arenas && !st; ar++) {
        size_t k = 0;
        for (int a = 0; a < c->n_arrays; a++) {
            const kv_array *A = &c->arrays[a];
            if (A->arena != ar) continue;
            for (int64_t i = 0; i < n;) {
                int64_t j = i + 1;
                while (j < n && dev[j] == dev[j - 1] + 1 && host[j] == host[j - 1] + 1) j++;
                size_t doff = A->off + (size_t)dev[i] * A->page_bytes;
                size_t hoff = A->host_off + (size_t)host[i] * A->page_bytes;
                r[k].src_off = to_host ? doff : hoff;
                r[k].dst_off = to_host ? hoff : doff;
                r[k].size = (size_t)(j - i) * A->page_bytes;
                k++;
                i = j;
            }
        }
        kv_arena *A = &c->arenas[ar];
        st = to_host ? pkv_buffer_copy_regions(A->buf, A->host_buf, r, k)
                     : pkv_buffer_copy_regions(A->host_buf, A->buf, r, k);
    }
    pkv_free(r);
    return st;
}

/* Move pages between the device arrays and the host pool, coalescing runs. */
static pkv_status transfer(pkv_kv_cache *c, const int32_t *dev, const int32_t *host, int64_t n, bool to_host) {
    if (c->host_on_device) return transfer_regions(c, dev, host, n, to_host);
    pkv_status st = PKV_OK;
    for (int a = 0; a < c->n_arrays && !st; a++) {
        const kv_array *A = &c->arrays[a];
        pkv_buffer *buf = kv_array_buf(c, A);
        for (int64_t i = 0; i < n && !st;) {
            int64_t j = i + 1;
            while (j < n && dev[j] == dev[j - 1] + 1 && host[j] == host[j - 1] + 1) j++;
            size_t doff = A->off + (size_t)dev[i] * A->page_bytes, bytes = (size_t)(j - i) * A->page_bytes;
            uint8_t *h = c->host + A->host_off + (size_t)host[i] * A->page_bytes;
            st = to_host ? pkv_buffer_read(buf, doff, h, bytes) : pkv_buffer_write(buf, doff, h, bytes);
            i = j;
        }
    }
    return st;
}

pkv_status kv1_swap_out(pkv_kv_cache *c, int32_t seq) {
    kv_seq *s = pkv_kv_seq_resident(c, seq, "swap out");
    if (!s) return PKV_ERR_INVALID;
    /* A window sequence's released leading pages (-1) have nothing to move. */
    int64_t n = pkv_kv_seq_pages(c, s), h = s->n_hole, nr = n - h;
    if (nr > c->host_free)
        return pkv_err(PKV_ERR_OUT_OF_PAGES, "swap out of sequence %d needs %lld host pages, %lld of %lld are free%s",
                       seq, (long long)nr, (long long)c->host_free, (long long)c->host_pages,
                       c->host_pages ? "" : " (no host pool: set host_pages or host_budget_bytes)");
    int32_t *dev = pkv_malloc((size_t)(n ? n : 1) * sizeof *dev);
    int32_t *host = pkv_malloc((size_t)(n ? n : 1) * sizeof *host);
    int32_t *tok = pkv_malloc((size_t)(s->n_tokens ? s->n_tokens : 1) * sizeof *tok);
    int32_t *pos = pkv_malloc((size_t)(s->n_tokens ? s->n_tokens : 1) * sizeof *pos);
    pkv_status st = PKV_OK;
    if (!dev || !host || !tok || !pos) {
        st = pkv_err(PKV_ERR_NOMEM, "swap out of sequence %d: out of memory", seq);
        goto fail;
    }
    pkv_kv_seq_publish(c, s);
    pkv_kv_seq_flatten(s, n, dev);
    for (int64_t i = 0; i < h; i++) host[i] = -1;
    host_take(c, nr, host + h);
    st = transfer(c, dev + h, host + h, nr, true);
    if (st) {
        pkv_kv_host_release_pages(c, host, n);
        pkv_err_prefix(st, "swap out of sequence %d", seq);
        goto fail;
    }
    int64_t t0 = PKV_MIN(h * c->page_size, s->n_tokens);
    for (int64_t t = 0; t < t0; t++) tok[t] = pos[t] = -1;
    pkv_kv_seq_tokens(c, seq, t0, s->n_tokens - t0, tok + t0, pos + t0);
    for (size_t i = 0; i < s->n_own; i++) pkv_kv_page_unref(c, s->own[i]);
    pkv_kv_node_unref(c, s->prefix);
    pkv_free(s->own);
    s->own = NULL;
    s->n_own = s->cap_own = 0;
    s->prefix = NULL;
    s->n_prefix = 0;
    s->pub_n = 0;
    s->pub_stop = false;
    s->swapped = true;
    s->host = host;
    s->sw_tok = tok;
    s->sw_pos = pos;
    pkv_free(dev);
    return PKV_OK;
fail:
    pkv_free(dev);
    pkv_free(host);
    pkv_free(tok);
    pkv_free(pos);
    return st;
}

pkv_status kv1_swap_in(pkv_kv_cache *c, int32_t seq) {
    kv_seq *s = pkv_kv_seq_get(c, seq, "swap in");
    if (!s) return PKV_ERR_NOT_FOUND;
    if (!s->swapped) return pkv_err(PKV_ERR_INVALID, "swap in: sequence %d is not swapped out", seq);
    int64_t n = pkv_kv_seq_pages(c, s), h = s->n_hole, avail = pkv_kv_pool_available(c);
    if (n - h > avail)
        return pkv_err(PKV_ERR_OUT_OF_PAGES, "swap in of sequence %d needs %lld pages, %lld are free or evictable", seq,
                       (long long)(n - h), (long long)avail);
    int32_t *own = pkv_malloc((size_t)(n ? n : 1) * sizeof *own);
    if (!own) return pkv_err(PKV_ERR_NOMEM, "swap in of sequence %d: out of memory", seq);
    for (int64_t i = 0; i < h; i++) own[i] = -1;
    pkv_kv_pool_take(c, n - h, own + h);
    pkv_status st = transfer(c, own + h, s->host + h, n - h, false);
    if (st) {
        for (int64_t i = 0; i < n; i++) pkv_kv_page_unref(c, own[i]);
        pkv_free(own);
        return pkv_err_prefix(st, "swap in of sequence %d", seq);
    }
    int ps = c->page_size;
    for (int64_t t = h * ps; t < s->n_tokens; t++) {
        size_t at = (size_t)own[t / ps] * ps + (size_t)(t % ps);
        c->tok[at] = s->sw_tok[t];
        c->pos[at] = s->sw_pos[t];
    }
    pkv_kv_host_release_pages(c, s->host, n);
    pkv_free(s->host);
    pkv_free(s->sw_tok);
    pkv_free(s->sw_pos);
    s->host = s->sw_tok = s->sw_pos = NULL;
    s->own = own;
    s->n_own = s->cap_own = (size_t)n;
    if (s->cap_own == 0) s->cap_own = 1;
    s->swapped = false;
    return PKV_OK;
}
