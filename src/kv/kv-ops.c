/* Batched device work on pages (row-run copies, fills) and the operations built
 * on it: context shift with on-device K re-rotation, and clears. All of it goes
 * through the device layer's transfers and kernels (I1), in queue order (I3). */
#include "kv/kv-impl.h"

#include <stdlib.h>
#include <string.h>

pkv_status pkv_kv_copy_runs(pkv_kv_cache *c, const kv_run *runs, size_t n_runs) {
    if (n_runs == 0) return PKV_OK;
    pkv_region *r = pkv_malloc((size_t)c->n_arrays * n_runs * sizeof *r);
    if (!r) return pkv_err(PKV_ERR_NOMEM, "KV page copy: out of memory for %zu regions", (size_t)c->n_arrays * n_runs);
    pkv_status st = PKV_OK;
    for (int ar = 0; ar < c->n_arenas && !st; ar++) {
        size_t k = 0;
        for (int i = 0; i < c->n_arrays; i++) {
            const kv_array *a = &c->arrays[i];
            if (a->arena != ar) continue;
            for (size_t j = 0; j < n_runs; j++) {
                r[k].src_off = a->off + (size_t)runs[j].src * a->row_bytes;
                r[k].dst_off = a->off + (size_t)runs[j].dst * a->row_bytes;
                r[k].size = (size_t)runs[j].n * a->row_bytes;
                k++;
            }
        }
        st = pkv_buffer_copy_regions(c->arenas[ar].buf, c->arenas[ar].buf, r, k);
    }
    pkv_free(r);
    return st;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

pkv_status pkv_kv_fill_pages(pkv_kv_cache *c, int32_t *p, int64_t n) {
    if (n <= 0) return PKV_OK;
    qsort(p, (size_t)n, sizeof *p, cmp_i32);
    pkv_status st = PKV_OK;
    for (int64_t i = 0; i < n && !st;) {
        int64_t j = i + 1;
        while (j < n && p[j] == p[j - 1] + 1) j++;
        for (int a = 0; a < c->n_arrays && !st; a++) {
            const kv_array *A = &c->arrays[a];
            st = pkv_buffer_fill(kv_array_buf(c, A), A->off + (size_t)p[i] * A->page_bytes,
                                 (size_t)(j - i) * A->page_bytes, 0);
        }
        i = j;
    }
    return st;
}

/* Re-rotate K rows `rows` (cache rows) of every K array by `delta` positions. */
static pkv_status rerotate(pkv_kv_cache *c, const int32_t *rows, int64_t n, int32_t delta) {
    /* rows, then the deltas, then LongRoPE's factors (f32) where K has them */
    const int n_ff = c->layout.n_ff;
    const size_t ibytes = ((size_t)n * 2 + (size_t)n_ff) * sizeof(int32_t);
    int32_t *host = pkv_malloc(ibytes);
    if (!host) return pkv_err(PKV_ERR_NOMEM, "shift: out of memory");
    memcpy(host, rows, (size_t)n * sizeof *host);
    for (int64_t i = 0; i < n; i++) host[n + i] = delta;
    if (n_ff) memcpy(host + 2 * n, c->layout.rope_ff, (size_t)n_ff * sizeof(float));
    pkv_status st = PKV_OK;
    /* One small index buffer per storage device (kernels only see their own memory). */
    for (int ar = 0; ar < c->n_arenas && !st; ar++) {
        pkv_device *dev = c->arenas[ar].dev;
        bool first = true;
        for (int k = 0; k < ar; k++) first &= c->arenas[k].dev != dev;
        if (!first) continue;
        pkv_buffer *idx = pkv_buffer_alloc(dev, ibytes);
        if (!idx) {
            st = pkv_err_prefix(PKV_ERR_NOMEM, "shift: row index buffer on %s", pkv_device_name(dev));
            break;
        }
        st = pkv_buffer_write(idx, 0, host, ibytes);
        for (int i = 0; i < c->n_arrays && !st; i++) {
            const kv_array *a = &c->arrays[i];
            if (a->is_v || c->arenas[a->arena].dev != dev) continue;
            const kv_layer *L = &c->layout.layers[a->layer];
            if (L->nope) continue; /* K of a NoPE layer has no angle to change */
            pkv_k_rope_args ra;
            memset(&ra, 0, sizeof ra);
            /* MLA: only the rotary tail [rope_off, dk) of the one head turns (whole blocks
             * before it where K is quantized: layout checks) */
            ra.x = pkv_tref_make(kv_array_buf(c, a), a->off + pkv_type_row_bytes(L->tk, (size_t)L->rope_off));
            ra.dtype = L->tk;
            ra.n_rows = n;
            ra.max_rows = c->n_pages * c->page_size;
            ra.row_stride = a->row_bytes;
            ra.n_heads = L->shards[a->shard].n_heads;
            ra.head_dim = L->dk - L->rope_off;
            ra.n_rot = L->n_rot ? L->n_rot : c->n_rot ? c->n_rot : L->dk;
            ra.neox = c->neox;
            ra.freq_base = L->freq_base;
            ra.freq_scale = L->freq_scale;
            ra.ext_factor = L->yarn_ext; /* YaRN's angles, no magnitude factor: a pure turn */
            ra.corr_lo = L->yarn_corr[0];
            ra.corr_hi = L->yarn_corr[1];
            pkv_rope_partial(&ra, L->n_pairs); /* Gemma 4's full layers: part of the pairs turn */
            if (n_ff) ra.ff = pkv_tref_make(idx, (size_t)n * 2 * sizeof(int32_t)); /* the forward pass's factors */
            ra.pos = pkv_tref_make(idx, (size_t)n * sizeof(int32_t));
            ra.rows = pkv_tref_make(idx, 0);
            st = pkv_k_rope(dev, &ra);
            if (st) pkv_err_prefix(st, "shift: re-rotating K of layer %d on %s", a->layer, pkv_device_name(dev));
        }
        /* The kernels may still be queued: wait before the index buffer goes away. */
        pkv_status ss = pkv_device_sync(dev);
        if (!st) st = ss;
        pkv_buffer_free(idx);
    }
    pkv_free(host);
    return st;
}

pkv_status kv1_shift(pkv_kv_cache *c, int32_t seq, int64_t start, int64_t n_remove, int32_t pos_delta) {
    kv_seq *s = pkv_kv_seq_resident(c, seq, "shift");
    if (!s) return PKV_ERR_INVALID;
    if (start < 0 || n_remove < 0 || start > s->n_tokens || n_remove > s->n_tokens - start)
        return pkv_err(PKV_ERR_INVALID, "shift: range [%lld, +%lld) is outside sequence %d of %lld tokens",
                       (long long)start, (long long)n_remove, seq, (long long)s->n_tokens);
    int64_t len = s->n_tokens, moved = len - start - n_remove;
    if (moved == 0) return kv1_truncate(c, seq, start);
    if (n_remove == 0 && pos_delta == 0) return PKV_OK;
    int ps = c->page_size;
    int64_t first = start / ps, new_len = len - n_remove, holes = 0;
    if (first < s->n_hole) {
        /* A window sequence shifted from inside its released pages: the pages the
         * new window cannot see become released too, and the rest is rebuilt from
         * sources that must all be resident (else PKV_ERR_UNSUPPORTED: the caller
         * recomputes the window layers instead). */
        holes = PKV_MIN(kv_window_first_page(c, new_len), (new_len + ps - 1) / ps);
        /* A page is kept only whole: after the last token whose source is gone. The
         * next query's window must still be covered. */
        for (int64_t d = holes * ps; d < new_len; d++) {
            int64_t t = d < start ? d : d + n_remove;
            if (t / ps < s->n_hole) holes = d / ps + 1;
        }
        int64_t need = new_len + 1 - c->window;
        if (holes > (need > 0 ? need / ps : 0))
            return pkv_err(PKV_ERR_UNSUPPORTED, "shift of sequence %d: the new window needs released tokens", seq);
        first = holes;
    }
    int64_t n_dst = (new_len + ps - 1) / ps - first, n_src = pkv_kv_seq_pages(c, s);
    int64_t avail = pkv_kv_pool_available(c);
    if (n_dst > avail)
        return pkv_err(PKV_ERR_OUT_OF_PAGES, "shift of sequence %d needs %lld fresh pages, %lld are free or evictable",
                       seq, (long long)n_dst, (long long)avail);
    pkv_kv_seq_publish(c, s);
    kv_keep_plan plan;
    pkv_status st = pkv_kv_keep_prepare(c, s, holes ? 0 : first, holes + n_dst, new_len, &plan);
    if (st) return pkv_err_prefix(st, "shift of sequence %d", seq);
    const int64_t r0 = PKV_MAX(start, first * ps); /* the first moved token rebuilt */
    int32_t *fresh = pkv_malloc((size_t)(holes + n_dst + 1) * sizeof *fresh);
    int32_t *src = pkv_malloc((size_t)(n_src + 1) * sizeof *src);
    int32_t *rows = pkv_malloc((size_t)(moved + 1) * sizeof *rows);
    kv_run *runs = pkv_malloc((size_t)(2 * n_dst + 2) * sizeof *runs);
    if (!fresh || !src || !rows || !runs) {
        st = pkv_err(PKV_ERR_NOMEM, "shift of sequence %d: out of memory", seq);
        goto done;
    }
    pkv_kv_seq_flatten(s, n_src, src);
    for (int64_t i = 0; i < holes; i++) fresh[i] = -1;
    int32_t *dst = fresh + holes; /* dst[i]: new page first + i */
    pkv_kv_pool_take(c, n_dst, dst);
    size_t n_runs = 0;
    for (int64_t d = first * ps; d < new_len; d++) {
        int64_t t = d < start ? d : d + n_remove;
        int64_t sr = (int64_t)src[t / ps] * ps + t % ps;
        int64_t dr = (int64_t)dst[d / ps - first] * ps + d % ps;
        if (n_runs && runs[n_runs - 1].src + runs[n_runs - 1].n == sr && runs[n_runs - 1].dst + runs[n_runs - 1].n == dr)
            runs[n_runs - 1].n++;
        else
            runs[n_runs++] = (kv_run){sr, dr, 1};
        if (d >= r0) rows[d - r0] = (int32_t)dr;
    }
    st = pkv_kv_copy_runs(c, runs, n_runs);
    if (!st && pos_delta != 0 && new_len > r0) st = rerotate(c, rows, new_len - r0, pos_delta);
    if (st) {
        for (int64_t i = 0; i < n_dst; i++) pkv_kv_page_unref(c, dst[i]);
        goto done;
    }
    for (int64_t d = first * ps; d < new_len; d++) {
        int64_t t = d < start ? d : d + n_remove;
        size_t si = (size_t)src[t / ps] * ps + (size_t)(t % ps);
        size_t di = (size_t)dst[d / ps - first] * ps + (size_t)(d % ps);
        c->tok[di] = c->tok[si];
        c->pos[di] = c->pos[si] + (d >= start ? pos_delta : 0);
    }
    pkv_kv_keep_apply(c, s, &plan, fresh, holes + n_dst, new_len);
    s->n_hole = holes ? holes : s->n_hole;
    s->exact_until = PKV_MIN(s->exact_until, start);
done:
    pkv_free(plan.arr); /* NULL once applied */
    pkv_free(fresh);
    pkv_free(src);
    pkv_free(rows);
    pkv_free(runs);
    return st;
}

pkv_status kv1_seq_clear(pkv_kv_cache *c, int32_t seq) {
    kv_seq *s = pkv_kv_seq_get(c, seq, "clear sequence");
    if (!s) return PKV_ERR_NOT_FOUND;
    if (s->swapped) {
        pkv_kv_seq_release(c, s);
        return PKV_OK;
    }
    int64_t n = pkv_kv_seq_pages(c, s);
    int32_t *pages = pkv_malloc((size_t)(n ? n : 1) * sizeof *pages);
    if (!pages) return pkv_err(PKV_ERR_NOMEM, "clear of sequence %d: out of memory", seq);
    pkv_kv_seq_publish(c, s);
    pkv_kv_seq_flatten(s, n, pages);
    pkv_kv_seq_release(c, s);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (pages[i] >= 0 && c->pages[pages[i]].free) pages[k++] = pages[i];
    pkv_status st = pkv_kv_fill_pages(c, pages, k);
    pkv_free(pages);
    return st;
}

pkv_status kv1_clear(pkv_kv_cache *c) {
    if (!c) return pkv_err(PKV_ERR_INVALID, "pkv_kv_clear: cache is NULL");
    for (size_t i = 0; i < c->n_seqs; i++)
        if (c->seqs[i].live) pkv_kv_seq_release(c, &c->seqs[i]);
    pkv_kv_pool_reset(c);
    if (c->host_used) memset(c->host_used, 0, (size_t)c->host_pages);
    c->host_free = c->host_pages;
    pkv_status st = PKV_OK;
    for (int ar = 0; ar < c->n_arenas && !st; ar++) st = pkv_buffer_fill(c->arenas[ar].buf, 0, c->arenas[ar].size, 0);
    return st;
}
