/* The device layer: registry, buffers, and the dispatcher that validates every
 * transfer once before a backend sees it. Cross-device copies go through host
 * staging here, so no backend ever sees another backend's buffer. */
#include "device/device-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGING_BYTES ((size_t)8 << 20)

pkv_status pkv_device_memory_stats_get(const pkv_device *dev, pkv_device_memory_stats *out) {
    if (!dev || !out) return pkv_err(PKV_ERR_INVALID, "pkv_device_memory_stats_get: NULL argument");
    memset(out, 0, sizeof *out);
    out->buffers = out->peak_buffers = dev->n_buffers;
    out->allocations = out->peak_allocations = -1;
    if (dev->ops->memory_stats) dev->ops->memory_stats(dev->ctx, out);
    return PKV_OK;
}

int64_t pkv_vulkan_validation_messages(char *msg, size_t msg_size) {
#ifdef PKV_HAVE_VULKAN
    return pkv_vulkan_validation(msg, msg_size);
#else
    if (msg && msg_size) snprintf(msg, msg_size, "this build has no Vulkan backend (PKV_VULKAN=OFF)");
    return -1;
#endif
}

pkv_device_params pkv_device_default_params(void) {
    pkv_device_params p = {0};
    p.n_threads = 0;
    p.memory_limit = 0;
    return p;
}

static bool faulty_enabled(void) {
    const char *e = getenv("PKV_FAULTY_DEVICE");
    return e && strcmp(e, "1") == 0;
}

pkv_status pkv_device_enumerate(int n_extra_cpu, char (*names)[64], int max, int *n, char *why,
                                size_t why_size) {
    if (!n) return pkv_err(PKV_ERR_INVALID, "pkv_device_enumerate: n is NULL");
    if (n_extra_cpu < 0 || n_extra_cpu > 64)
        return pkv_err(PKV_ERR_INVALID, "extra CPU devices: %d is outside [0, 64]", n_extra_cpu);
    int count = 0;
#define ADD(...)                                                                           \
    do {                                                                                   \
        if (names && count < max) snprintf(names[count], 64, __VA_ARGS__);                 \
        count++;                                                                           \
    } while (0)
    if (why && why_size) why[0] = 0;
    ADD("cpu");
    for (int i = 1; i <= n_extra_cpu; i++) ADD("cpu:%d", i);
#ifdef PKV_HAVE_VULKAN
    {
        char vwhy[256] = "";
        int nv = pkv_vulkan_count(vwhy, sizeof vwhy);
        for (int i = 0; i < nv; i++) ADD("vulkan:%d", i);
        if (nv == 0 && why && why_size) snprintf(why, why_size, "vulkan: %s", vwhy);
    }
#else
    if (why && why_size) snprintf(why, why_size, "vulkan: not built (PKV_VULKAN=OFF)");
#endif
    {
        /* CUDA devices, and why there are none, after Vulkan's line */
        char cwhy[256] = "";
        int nc = 0;
#ifdef PKV_HAVE_CUDA
        nc = pkv_cuda_count(cwhy, sizeof cwhy);
        for (int i = 0; i < nc; i++) ADD("cuda:%d", i);
#else
        snprintf(cwhy, sizeof cwhy, "not built (PKV_CUDA=OFF)");
#endif
        if (nc == 0 && why && why_size) {
            size_t len = strlen(why);
            snprintf(why + len, why_size - len, "%scuda: %s", len ? "; " : "", cwhy);
        }
    }
    if (faulty_enabled()) ADD("faulty");
#undef ADD
    *n = count;
    return PKV_OK;
}

static pkv_status self_check(pkv_device *dev);

/* "no device 'X' (why): the devices here are cpu (and cpu:1 ... cpu:64), vulkan:0":
 * the real list, so a typo is answered with what exists. */
static void no_device(pkv_status st, const char *name, const char *why) {
    char names[16][64], list[512] = "", vwhy[256] = "";
    int n = 0;
    if (pkv_device_enumerate(0, names, 16, &n, vwhy, sizeof vwhy)) n = 0;
    size_t k = 0;
    for (int i = 0; i < n && i < 16 && k < sizeof list; i++) {
        int w = snprintf(list + k, sizeof list - k, "%s%s%s", i ? ", " : "", names[i],
                         !strcmp(names[i], "cpu") ? " (and cpu:1 ... cpu:64)" : "");
        if (w > 0) k += (size_t)w;
    }
    pkv_err(st, "no device '%s'%s%s%s: the devices here are %s%s%s", name, why ? " (" : "", why ? why : "", why ? ")" : "",
            list, vwhy[0] ? "; " : "", vwhy);
}

/* Parse "cpu", "cpu:N", "vulkan:N", "cuda:N", "faulty". */
pkv_device *pkv_device_open(const char *name, pkv_device_params params) {
    if (!name) {
        pkv_err(PKV_ERR_INVALID, "pkv_device_open: name is NULL");
        return NULL;
    }
    if (params.n_threads < 0) {
        pkv_err(PKV_ERR_INVALID, "pkv_device_open %s: n_threads %d is negative (0 = all cores)", name, params.n_threads);
        return NULL;
    }
    const pkv_backend_ops *ops = NULL;
    void *ctx = NULL;
    pkv_device_caps caps;
    memset(&caps, 0, sizeof caps);
    pkv_status s;
    char *end = NULL;
    if (strcmp(name, "cpu") == 0 || strncmp(name, "cpu:", 4) == 0) {
        if (name[3] == ':') {
            long idx = strtol(name + 4, &end, 10);
            if (end == name + 4 || *end || idx < 0 || idx > 64) {
                no_device(PKV_ERR_NOT_FOUND, name, NULL);
                return NULL;
            }
        }
        s = pkv_cpu_backend_create(name, params, &ops, &ctx, &caps);
    } else if (strcmp(name, "faulty") == 0) {
        if (!faulty_enabled()) {
            pkv_err(PKV_ERR_NOT_FOUND,
                    "no device 'faulty': the faulty test device exists only with PKV_FAULTY_DEVICE=1");
            return NULL;
        }
        s = pkv_faulty_backend_create(name, params, &ops, &ctx, &caps);
    } else if (strncmp(name, "vulkan:", 7) == 0) {
#ifdef PKV_HAVE_VULKAN
        long idx = strtol(name + 7, &end, 10);
        char why[256] = "";
        int nv = pkv_vulkan_count(why, sizeof why);
        if (end == name + 7 || *end || idx < 0 || idx >= nv) {
            no_device(PKV_ERR_NOT_FOUND, name, NULL);
            return NULL;
        }
        s = pkv_vulkan_backend_create(name, (int)idx, params, &ops, &ctx, &caps);
#else
        no_device(PKV_ERR_UNSUPPORTED, name, "this build has no Vulkan backend (PKV_VULKAN=OFF)");
        return NULL;
#endif
    } else if (strncmp(name, "cuda:", 5) == 0) {
#ifdef PKV_HAVE_CUDA
        long idx = strtol(name + 5, &end, 10);
        char why[256] = "";
        int nc = pkv_cuda_count(why, sizeof why);
        if (end == name + 5 || *end || idx < 0 || idx >= nc) {
            no_device(PKV_ERR_NOT_FOUND, name, nc == 0 ? "no CUDA devices" : NULL); /* the list says why */
            return NULL;
        }
        s = pkv_cuda_backend_create(name, (int)idx, params, &ops, &ctx, &caps);
#else
        no_device(PKV_ERR_UNSUPPORTED, name, "this build has no CUDA backend (PKV_CUDA=OFF)");
        return NULL;
#endif
    } else {
        no_device(PKV_ERR_NOT_FOUND, name, NULL);
        return NULL;
    }
    if (s != PKV_OK) return NULL;
    pkv_device *dev = pkv_calloc(1, sizeof *dev);
    if (!dev) {
        ops->destroy(ctx);
        pkv_err(PKV_ERR_NOMEM, "opening device %s: out of memory", name);
        return NULL;
    }
    if (ops->version != PKV_BACKEND_VERSION) {
        ops->destroy(ctx);
        pkv_free(dev);
        pkv_err(PKV_ERR_INTERNAL, "device %s: backend interface version %d, expected %d", name,
                ops->version, PKV_BACKEND_VERSION);
        return NULL;
    }
    dev->ops = ops;
    dev->ctx = ctx;
    dev->caps = caps;
    snprintf(dev->caps.name, sizeof dev->caps.name, "%s", name);
    dev->caps.has_kernels = ops->kernels != NULL;
    dev->memory_limit = params.memory_limit;
    if (self_check(dev)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        pkv_device_close(dev);
        pkv_err(PKV_ERR_DEVICE, "%s", msg);
        return NULL;
    }
    return dev;
}

/* A quick self-check of the transfer primitives at open (a few KiB, well under a
 * millisecond): reads and writes at offset 0 must work; reads or writes at other
 * offsets that do not are routed through whole-prefix transfers from offset 0
 * (slower, correct); anything else makes the device unusable. The full
 * conformance suite (pagekv check) reports the failure itself. */
static pkv_status self_check(pkv_device *dev) {
    enum { N = 4096 };
    pkv_status s = PKV_OK;
    uint8_t *a = pkv_malloc(2 * N);
    pkv_buffer *b = pkv_buffer_alloc(dev, N);
    if (!a || !b) {
        s = pkv_err(PKV_ERR_NOMEM, "opening %s: no memory for the transfer self-check", dev->caps.name);
        goto out;
    }
    uint8_t *got = a + N;
    for (int i = 0; i < N; i++) a[i] = (uint8_t)(i * 131 + 7);
    if ((s = dev->ops->write(dev->ctx, b->handle, 0, a, N)) || (s = dev->ops->read(dev->ctx, b->handle, 0, got, N))) goto out;
    if (memcmp(a, got, N) != 0) {
        s = pkv_err(PKV_ERR_DEVICE, "device %s failed its transfer self-check: a whole-buffer write and read do not round-trip; refusing to use it",
                    dev->caps.name);
        goto out;
    }
    static const size_t offs[][2] = {{1, 1}, {17, 5}, {100, 300}, {N - 1, 1}, {2048, 2048}};
    for (size_t k = 0; k < PKV_ARRAY_LEN(offs) && !s; k++) {
        if ((s = dev->ops->read(dev->ctx, b->handle, offs[k][0], got, offs[k][1]))) goto out;
        if (memcmp(a + offs[k][0], got, offs[k][1]) != 0) dev->bad_offset_read = true;
    }
    for (size_t k = 0; k < PKV_ARRAY_LEN(offs) && !s; k++) {
        for (size_t i = 0; i < offs[k][1]; i++) a[offs[k][0] + i] ^= 0xa5;
        if ((s = dev->ops->write(dev->ctx, b->handle, offs[k][0], a + offs[k][0], offs[k][1]))) goto out;
    }
    if ((s = dev->ops->read(dev->ctx, b->handle, 0, got, N))) goto out;
    if (memcmp(a, got, N) != 0) dev->bad_offset_write = true;
    if (dev->bad_offset_read || dev->bad_offset_write)
        PKV_WARN("device %s: %s at non-zero offsets failed the self-check; using whole-prefix transfers from offset 0 "
                 "instead (slower); see 'pagekv check --device %s'",
                 dev->caps.name, dev->bad_offset_read && dev->bad_offset_write ? "reads and writes" : dev->bad_offset_read ? "reads" : "writes",
                 dev->caps.name);
out:
    pkv_buffer_free(b);
    pkv_free(a);
    return s;
}

bool pkv_device_set_raw(pkv_device *dev, bool raw) {
    bool was = dev->raw;
    dev->raw = raw;
    return was;
}

void pkv_device_close(pkv_device *dev) {
    if (!dev) return;
    if (dev->ops->sync) dev->ops->sync(dev->ctx);
    if (dev->n_buffers)
        PKV_WARN("device %s closed with %d buffers still allocated", dev->caps.name, dev->n_buffers);
    dev->ops->destroy(dev->ctx);
    pkv_free(dev);
}

const pkv_device_caps *pkv_device_get_caps(const pkv_device *dev) { return dev ? &dev->caps : NULL; }
const char *pkv_device_name(const pkv_device *dev) { return dev ? dev->caps.name : "(null)"; }
uint64_t pkv_device_allocated(const pkv_device *dev) { return dev ? dev->allocated : 0; }

bool pkv_device_can_access(const pkv_device *compute, const pkv_device *storage) {
    return compute && storage && compute == storage;
}

pkv_buffer *pkv_buffer_alloc(pkv_device *dev, size_t size) {
    if (!dev) {
        pkv_err(PKV_ERR_INVALID, "pkv_buffer_alloc: device is NULL");
        return NULL;
    }
    if (size == 0) {
        pkv_err(PKV_ERR_INVALID, "pkv_buffer_alloc on %s: size is 0", dev->caps.name);
        return NULL;
    }
    if (dev->caps.max_buffer_bytes && size > dev->caps.max_buffer_bytes) {
        pkv_err(PKV_ERR_NOMEM, "buffer of %zu bytes on %s exceeds the device's largest buffer (%zu bytes)",
                size, dev->caps.name, dev->caps.max_buffer_bytes);
        return NULL;
    }
    uint64_t limit = dev->memory_limit ? dev->memory_limit : dev->caps.memory_bytes;
    if (limit && dev->allocated + size > limit) {
        pkv_err(PKV_ERR_NOMEM, "buffer of %zu bytes on %s: %llu of %llu bytes already allocated", size,
                dev->caps.name, (unsigned long long)dev->allocated, (unsigned long long)limit);
        return NULL;
    }
    pkv_buffer *b = pkv_calloc(1, sizeof *b);
    if (!b) {
        pkv_err(PKV_ERR_NOMEM, "buffer of %zu bytes on %s: out of host memory", size, dev->caps.name);
        return NULL;
    }
    if (dev->ops->buffer_alloc(dev->ctx, size, &b->handle) != PKV_OK) {
        pkv_free(b);
        pkv_err_prefix(PKV_ERR_NOMEM, "buffer of %zu bytes on %s", size, dev->caps.name);
        return NULL;
    }
    b->dev = dev;
    b->size = size;
    dev->allocated += size;
    dev->n_buffers++;
    return b;
}

pkv_buffer *pkv_buffer_wrap_host(pkv_device *dev, const void *host, size_t size) {
    if (!dev || !host || size == 0) {
        pkv_err(PKV_ERR_INVALID, "pkv_buffer_wrap_host: NULL device or memory, or size 0");
        return NULL;
    }
    if (!dev->ops->buffer_wrap) {
        pkv_err(PKV_ERR_UNSUPPORTED, "%s cannot use host memory in place", dev->caps.name);
        return NULL;
    }
    pkv_buffer *b = pkv_calloc(1, sizeof *b);
    if (!b) {
        pkv_err(PKV_ERR_NOMEM, "wrapping %zu bytes on %s: out of host memory", size, dev->caps.name);
        return NULL;
    }
    if (dev->ops->buffer_wrap(dev->ctx, host, size, &b->handle) != PKV_OK) {
        pkv_free(b);
        return NULL;
    }
    b->dev = dev;
    b->size = size;
    b->wrapped = true;
    dev->n_buffers++;
    return b;
}

void pkv_buffer_free(pkv_buffer *buf) {
    if (!buf) return;
    pkv_device *dev = buf->dev;
    if (!buf->wrapped) {
        dev->ops->buffer_free(dev->ctx, buf->handle);
        dev->allocated -= buf->size;
    } else if (dev->ops->buffer_unwrap) {
        dev->ops->buffer_unwrap(dev->ctx, buf->handle, buf->size);
    }
    dev->n_buffers--;
    pkv_free(buf);
}

/* Transfers into a wrapped (read-only, borrowed) buffer are refused. */
static pkv_status check_writable(const char *what, const pkv_buffer *buf) {
    if (buf && buf->wrapped)
        return pkv_err(PKV_ERR_INVALID, "%s on %s: the buffer wraps read-only host memory (mapped weights)", what,
                       buf->dev->caps.name);
    return PKV_OK;
}

size_t pkv_buffer_size(const pkv_buffer *buf) { return buf ? buf->size : 0; }
pkv_device *pkv_buffer_device(const pkv_buffer *buf) { return buf ? buf->dev : NULL; }

/* Bounds check shared by every transfer: the region [off, off+n) inside buf. */
static pkv_status check_region(const char *what, const pkv_buffer *buf, size_t off, size_t n) {
    if (!buf) return pkv_err(PKV_ERR_INVALID, "%s: buffer is NULL", what);
    if (off > buf->size || n > buf->size - off)
        return pkv_err(PKV_ERR_INVALID,
                       "%s on %s: offset %zu + length %zu is outside the buffer of %zu bytes", what,
                       buf->dev->caps.name, off, n, buf->size);
    return PKV_OK;
}

static bool overlaps(size_t a, size_t b, size_t n) { return a < b + n && b < a + n; }
static bool overlaps2(size_t a, size_t an, size_t b, size_t bn) { return a < b + bn && b < a + an; }

/* The backend's read, or for a device whose offset reads failed the self-check,
 * a read of the whole prefix [0, off + n) from offset 0 (which passed). */
static pkv_status dev_read(pkv_buffer *src, size_t off, void *dst, size_t n) {
    pkv_device *d = src->dev;
    if (off == 0 || !d->bad_offset_read || d->raw) return d->ops->read(d->ctx, src->handle, off, dst, n);
    uint8_t *tmp = pkv_malloc(off + n);
    if (!tmp) return pkv_err(PKV_ERR_NOMEM, "read on %s: no memory for the safe offset-read path", d->caps.name);
    pkv_status s = d->ops->read(d->ctx, src->handle, 0, tmp, off + n);
    if (!s) memcpy(dst, tmp + off, n);
    pkv_free(tmp);
    return s;
}

/* The backend's write, or for a device whose offset writes failed the
 * self-check, read-modify-write of the prefix [0, off + n) at offset 0. */
static pkv_status dev_write(pkv_buffer *dst, size_t off, const void *src, size_t n) {
    pkv_device *d = dst->dev;
    if (off == 0 || !d->bad_offset_write || d->raw) return d->ops->write(d->ctx, dst->handle, off, src, n);
    uint8_t *tmp = pkv_malloc(off + n);
    if (!tmp) return pkv_err(PKV_ERR_NOMEM, "write on %s: no memory for the safe offset-write path", d->caps.name);
    pkv_status s = dev_read(dst, 0, tmp, off);
    if (!s) {
        memcpy(tmp + off, src, n);
        s = d->ops->write(d->ctx, dst->handle, 0, tmp, off + n);
    }
    pkv_free(tmp);
    return s;
}

pkv_status pkv_buffer_write(pkv_buffer *dst, size_t off, const void *src, size_t n) {
    pkv_status s = check_region("write", dst, off, n);
    if (!s) s = check_writable("write", dst);
    if (s) return s;
    if (n == 0) return PKV_OK;
    if (!src) return pkv_err(PKV_ERR_INVALID, "write on %s: source pointer is NULL", dst->dev->caps.name);
    return dev_write(dst, off, src, n);
}

pkv_status pkv_buffer_read(pkv_buffer *src, size_t off, void *dst, size_t n) {
    pkv_status s = check_region("read", src, off, n);
    if (s) return s;
    if (n == 0) return PKV_OK;
    if (!dst) return pkv_err(PKV_ERR_INVALID, "read on %s: destination pointer is NULL", src->dev->caps.name);
    return dev_read(src, off, dst, n);
}

pkv_status pkv_buffer_fill(pkv_buffer *dst, size_t off, size_t n, uint8_t value) {
    pkv_status s = check_region("fill", dst, off, n);
    if (!s) s = check_writable("fill", dst);
    if (s) return s;
    if (n == 0) return PKV_OK;
    return dst->dev->ops->fill(dst->dev->ctx, dst->handle, off, n, value);
}

/* Cross-device copy through a host staging buffer, in chunks. */
static pkv_status staged_copy(pkv_buffer *src, size_t soff, pkv_buffer *dst, size_t doff, size_t n) {
    size_t chunk = PKV_MIN(n, STAGING_BYTES);
    void *stage = pkv_malloc(chunk);
    if (!stage) return pkv_err(PKV_ERR_NOMEM, "copy %s -> %s: cannot allocate %zu bytes of staging",
                               src->dev->caps.name, dst->dev->caps.name, chunk);
    pkv_status s = PKV_OK;
    for (size_t done = 0; done < n && s == PKV_OK; done += chunk) {
        size_t k = PKV_MIN(chunk, n - done);
        s = dev_read(src, soff + done, stage, k);
        if (s == PKV_OK) s = dev_write(dst, doff + done, stage, k);
    }
    pkv_free(stage);
    return s;
}

pkv_status pkv_buffer_copy(pkv_buffer *src, size_t src_off, pkv_buffer *dst, size_t dst_off, size_t n) {
    pkv_status s = check_region("copy source", src, src_off, n);
    if (s) return s;
    if ((s = check_region("copy destination", dst, dst_off, n))) return s;
    if ((s = check_writable("copy", dst))) return s;
    if (n == 0) return PKV_OK;
    if (src == dst && overlaps(src_off, dst_off, n))
        return pkv_err(PKV_ERR_INVALID,
                       "copy on %s: source [%zu, +%zu) and destination [%zu, +%zu) overlap in the same buffer",
                       src->dev->caps.name, src_off, n, dst_off, n);
    if (src->dev != dst->dev) return staged_copy(src, src_off, dst, dst_off, n);
    return src->dev->ops->copy(src->dev->ctx, src->handle, src_off, dst->handle, dst_off, n);
}

static int cmp_region_dst(const void *a, const void *b) {
    const pkv_region *x = a, *y = b;
    return x->dst_off < y->dst_off ? -1 : x->dst_off > y->dst_off;
}
static int cmp_region_src(const void *a, const void *b) {
    const pkv_region *x = a, *y = b;
    return x->src_off < y->src_off ? -1 : x->src_off > y->src_off;
}

/* Validate a region list: bounds of each, no two destinations overlapping, and for
 * src == dst no destination over any source. Sorting a copy makes this O(n log n). */
static pkv_status check_regions(pkv_buffer *src, pkv_buffer *dst, const pkv_region *r, size_t n,
                                size_t *n_nonempty) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "copy_regions region %zu source", i);
        pkv_status s = check_region(what, src, r[i].src_off, r[i].size);
        if (s) return s;
        snprintf(what, sizeof what, "copy_regions region %zu destination", i);
        if ((s = check_region(what, dst, r[i].dst_off, r[i].size))) return s;
        if (r[i].size) k++;
    }
    *n_nonempty = k;
    if (k < 2 && src != dst) return PKV_OK;
    pkv_region *d = pkv_malloc(2 * k * sizeof *d);
    if (!d) return pkv_err(PKV_ERR_NOMEM, "copy_regions: cannot allocate the overlap check for %zu regions", k);
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].size) d[j++] = r[i];
    pkv_status s = PKV_OK;
    qsort(d, k, sizeof *d, cmp_region_dst);
    for (size_t i = 1; i < k && !s; i++)
        if (d[i - 1].dst_off + d[i - 1].size > d[i].dst_off)
            s = pkv_err(PKV_ERR_INVALID, "copy_regions on %s: destination regions at %zu (+%zu) and %zu (+%zu) overlap",
                        dst->dev->caps.name, d[i - 1].dst_off, d[i - 1].size, d[i].dst_off, d[i].size);
    if (!s && src == dst) {
        /* Merge-walk sorted destinations against sorted sources. */
        pkv_region *srt = d + k;
        memcpy(srt, d, k * sizeof *d);
        qsort(srt, k, sizeof *d, cmp_region_src);
        size_t a = 0;
        for (size_t i = 0; i < k && !s; i++) {
            while (a < k && srt[a].src_off + srt[a].size <= d[i].dst_off) a++;
            if (a < k && overlaps2(d[i].dst_off, d[i].size, srt[a].src_off, srt[a].size))
                s = pkv_err(PKV_ERR_INVALID,
                            "copy_regions on %s: destination [%zu, +%zu) overlaps source [%zu, +%zu) in the same buffer",
                            dst->dev->caps.name, d[i].dst_off, d[i].size, srt[a].src_off, srt[a].size);
        }
    }
    pkv_free(d);
    return s;
}

pkv_status pkv_buffer_copy_regions(pkv_buffer *src, pkv_buffer *dst, const pkv_region *regions, size_t n) {
    if (!src || !dst) return pkv_err(PKV_ERR_INVALID, "copy_regions: %s buffer is NULL", src ? "destination" : "source");
    if (n == 0) return PKV_OK;
    if (!regions) return pkv_err(PKV_ERR_INVALID, "copy_regions: %zu regions but the list is NULL", n);
    size_t k;
    pkv_status s = check_writable("copy_regions", dst);
    if (!s) s = check_regions(src, dst, regions, n, &k);
    if (s || k == 0) return s;
    if (src->dev != dst->dev) {
        for (size_t i = 0; i < n && !s; i++)
            if (regions[i].size)
                s = staged_copy(src, regions[i].src_off, dst, regions[i].dst_off, regions[i].size);
        return s;
    }
    return src->dev->ops->copy_regions(src->dev->ctx, src->handle, dst->handle, regions, n);
}

pkv_status pkv_device_flush(pkv_device *dev) {
    if (!dev) return pkv_err(PKV_ERR_INVALID, "flush: device is NULL");
    return dev->ops->flush ? dev->ops->flush(dev->ctx) : PKV_OK;
}

pkv_status pkv_device_sync(pkv_device *dev) {
    if (!dev) return pkv_err(PKV_ERR_INVALID, "sync: device is NULL");
    return dev->ops->sync ? dev->ops->sync(dev->ctx) : PKV_OK;
}
