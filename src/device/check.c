/* The transfer conformance suite (invariant I2): random operations at random
 * offsets and sizes against a host shadow copy, through the public transfer API
 * only, so it tests exactly what the rest of pagekv relies on. */
#include "device/device-impl.h"

#include <stdio.h>
#include <string.h>

pkv_check_params pkv_check_default_params(void) {
    pkv_check_params p = {0};
    p.seed = 0;
    p.iterations = 0;
    return p;
}

typedef struct {
    uint64_t s;
} rng;

static uint64_t rnd(rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t rnd_below(rng *r, size_t n) { return n ? (size_t)(rnd(r) % n) : 0; }

static void fill_random(rng *r, uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd(r);
}

/* A random (offset, size) inside a buffer of `cap` bytes, biased to the edge cases
 * that break backends: zero length, one byte, unaligned heads and tails, the last
 * byte, the whole buffer. */
static void pick_region(rng *r, size_t cap, size_t *off, size_t *n) {
    switch (rnd_below(r, 10)) {
    case 0: *off = rnd_below(r, cap + 1); *n = 0; break;
    case 1: *off = rnd_below(r, cap); *n = 1; break;
    case 2: *off = cap - 1; *n = 1; break;
    case 3: *off = 0; *n = cap; break;
    case 4: /* unaligned start, short */
        *off = rnd_below(r, cap / 4) * 4 + 1 + rnd_below(r, 3);
        if (*off >= cap) *off = cap - 1;
        *n = 1 + rnd_below(r, PKV_MIN(cap - *off, (size_t)13));
        break;
    case 5: /* aligned start, unaligned end */
        *off = rnd_below(r, cap / 4) * 4;
        *n = 1 + rnd_below(r, cap - *off);
        break;
    default:
        *off = rnd_below(r, cap);
        *n = rnd_below(r, cap - *off + 1);
        if (rnd_below(r, 2)) *n = PKV_MIN(*n, (size_t)300);
    }
}

typedef struct {
    const char *device;
    pkv_check_report_fn report;
    void *user;
    bool all_passed;
} reporter;

static void emit(reporter *rep, const char *test, bool passed, long count, double secs, const char *detail) {
    pkv_check_result r;
    memset(&r, 0, sizeof r);
    r.device = rep->device;
    r.test = test;
    r.passed = passed;
    r.count = count;
    r.seconds = secs;
    snprintf(r.detail, sizeof r.detail, "%s", detail ? detail : "");
    if (!passed) rep->all_passed = false;
    if (rep->report) rep->report(&r, rep->user);
}

/* Compare device contents with the shadow; on mismatch describe the first bad byte. */
static bool verify(pkv_buffer *b, const uint8_t *shadow, uint8_t *tmp, size_t size, char *detail, size_t dn,
                   const char *after) {
    if (pkv_buffer_read(b, 0, tmp, size) != PKV_OK) {
        snprintf(detail, dn, "after %s: whole-buffer read failed: %s", after, pkv_errmsg());
        return false;
    }
    for (size_t i = 0; i < size; i++)
        if (tmp[i] != shadow[i]) {
            snprintf(detail, dn, "after %s: byte %zu is 0x%02x, expected 0x%02x", after, i, tmp[i], shadow[i]);
            return false;
        }
    return true;
}

#define BUF_BYTES ((size_t)65536 + 13) /* odd size: the last byte is not aligned */

typedef struct {
    pkv_device *dev;
    pkv_buffer *b;
    uint8_t *shadow, *tmp, *data;
    size_t size;
    rng r;
    int iters;
} tctx;

typedef bool (*test_fn)(tctx *t, long *count, char *detail, size_t dn);

static bool t_write(tctx *t, long *count, char *detail, size_t dn) {
    for (int i = 0; i < t->iters; i++) {
        size_t off, n;
        pick_region(&t->r, t->size, &off, &n);
        fill_random(&t->r, t->data, n);
        if (pkv_buffer_write(t->b, off, t->data, n) != PKV_OK) {
            snprintf(detail, dn, "write offset %zu size %zu failed: %s", off, n, pkv_errmsg());
            return false;
        }
        memcpy(t->shadow + off, t->data, n);
        (*count)++;
        if (i % 64 == 63 || i == t->iters - 1) {
            char what[96];
            snprintf(what, sizeof what, "write offset %zu size %zu", off, n);
            if (!verify(t->b, t->shadow, t->tmp, t->size, detail, dn, what)) return false;
        }
    }
    return true;
}

static bool t_read(tctx *t, long *count, char *detail, size_t dn) {
    for (int i = 0; i < t->iters; i++) {
        size_t off, n;
        pick_region(&t->r, t->size, &off, &n);
        memset(t->tmp, 0xcd, n);
        if (pkv_buffer_read(t->b, off, t->tmp, n) != PKV_OK) {
            snprintf(detail, dn, "read offset %zu size %zu failed: %s", off, n, pkv_errmsg());
            return false;
        }
        for (size_t k = 0; k < n; k++)
            if (t->tmp[k] != t->shadow[off + k]) {
                snprintf(detail, dn, "read offset %zu size %zu: byte %zu is 0x%02x, expected 0x%02x", off, n, k,
                         t->tmp[k], t->shadow[off + k]);
                return false;
            }
        (*count)++;
    }
    return true;
}

static bool t_fill(tctx *t, long *count, char *detail, size_t dn) {
    for (int i = 0; i < t->iters; i++) {
        size_t off, n;
        pick_region(&t->r, t->size, &off, &n);
        uint8_t v = (uint8_t)rnd(&t->r);
        if (pkv_buffer_fill(t->b, off, n, v) != PKV_OK) {
            snprintf(detail, dn, "fill offset %zu size %zu failed: %s", off, n, pkv_errmsg());
            return false;
        }
        memset(t->shadow + off, v, n);
        (*count)++;
        if (i % 64 == 63 || i == t->iters - 1) {
            char what[96];
            snprintf(what, sizeof what, "fill offset %zu size %zu value 0x%02x", off, n, v);
            if (!verify(t->b, t->shadow, t->tmp, t->size, detail, dn, what)) return false;
        }
    }
    return true;
}

static bool t_copy(tctx *t, long *count, char *detail, size_t dn) {
    for (int i = 0; i < t->iters; i++) {
        size_t soff, n, doff;
        pick_region(&t->r, t->size / 2, &soff, &n); /* source in the first half */
        doff = t->size / 2 + rnd_below(&t->r, t->size - t->size / 2 - n + 1);
        if (rnd_below(&t->r, 2)) { /* sometimes copy the other way */
            size_t x = soff;
            soff = doff;
            doff = x;
        }
        if (pkv_buffer_copy(t->b, soff, t->b, doff, n) != PKV_OK) {
            snprintf(detail, dn, "copy %zu -> %zu size %zu failed: %s", soff, doff, n, pkv_errmsg());
            return false;
        }
        memmove(t->shadow + doff, t->shadow + soff, n);
        (*count)++;
        if (i % 64 == 63 || i == t->iters - 1) {
            char what[96];
            snprintf(what, sizeof what, "copy %zu -> %zu size %zu", soff, doff, n);
            if (!verify(t->b, t->shadow, t->tmp, t->size, detail, dn, what)) return false;
        }
    }
    return true;
}

/* Batched copies: hundreds of non-overlapping regions from a second buffer (and
 * within the same buffer between disjoint halves), like a fork's page copies. */
static bool t_copy_regions(tctx *t, long *count, char *detail, size_t dn) {
    pkv_buffer *src = pkv_buffer_alloc(t->dev, t->size);
    uint8_t *src_shadow = pkv_malloc(t->size);
    pkv_region *reg = pkv_malloc(512 * sizeof *reg);
    bool ok = src && src_shadow && reg;
    if (!ok) snprintf(detail, dn, "cannot allocate the source buffer: %s", pkv_errmsg());
    if (ok) {
        fill_random(&t->r, src_shadow, t->size);
        if (pkv_buffer_write(src, 0, src_shadow, t->size) != PKV_OK) {
            snprintf(detail, dn, "initial write failed: %s", pkv_errmsg());
            ok = false;
        }
    }
    int rounds = PKV_MAX(t->iters / 100, 4);
    for (int round = 0; ok && round < rounds; round++) {
        bool same = round % 2 == 1;
        size_t nreg = 100 + rnd_below(&t->r, 400);
        /* Split the destination range into nreg disjoint slots of random sizes. */
        size_t dlo = same ? t->size / 2 : 0, dhi = t->size, slot = (dhi - dlo) / nreg;
        size_t shi = same ? t->size / 2 : t->size;
        for (size_t k = 0; k < nreg; k++) {
            size_t n = rnd_below(&t->r, slot + 1);
            if (k % 50 == 7) n = 0;
            reg[k].dst_off = dlo + k * slot + rnd_below(&t->r, slot - n + 1);
            reg[k].size = n;
            reg[k].src_off = rnd_below(&t->r, shi - n + 1);
        }
        pkv_buffer *s = same ? t->b : src;
        uint8_t *ss = same ? t->shadow : src_shadow;
        if (pkv_buffer_copy_regions(s, t->b, reg, nreg) != PKV_OK) {
            snprintf(detail, dn, "copy_regions of %zu regions failed: %s", nreg, pkv_errmsg());
            ok = false;
            break;
        }
        for (size_t k = 0; k < nreg; k++) memmove(t->shadow + reg[k].dst_off, ss + reg[k].src_off, reg[k].size);
        *count += (long)nreg;
        char what[96];
        snprintf(what, sizeof what, "copy_regions round %d (%zu regions, %s)", round, nreg,
                 same ? "same buffer" : "two buffers");
        if (!verify(t->b, t->shadow, t->tmp, t->size, detail, dn, what)) ok = false;
    }
    pkv_free(reg);
    pkv_free(src_shadow);
    pkv_buffer_free(src);
    return ok;
}

static uint64_t seed_of(pkv_check_params p, uint64_t salt) { return (p.seed ? p.seed : 0x5eed) * 0x100000001b3ull ^ salt; }

pkv_status pkv_check_transfers(pkv_device *dev, pkv_check_params p, pkv_check_report_fn report, void *user) {
    if (!dev) return pkv_err(PKV_ERR_INVALID, "check: device is NULL");
    tctx t;
    memset(&t, 0, sizeof t);
    t.dev = dev;
    t.size = BUF_BYTES;
    t.iters = p.iterations > 0 ? p.iterations : 2000;
    t.r.s = seed_of(p, 1);
    reporter rep = {dev->caps.name, report, user, true};
    bool was_raw = dev->raw;
    dev->raw = true; /* test the backend's own primitives, not the safe routing */
    t.b = pkv_buffer_alloc(dev, t.size);
    t.shadow = pkv_malloc(t.size);
    t.tmp = pkv_malloc(t.size);
    t.data = pkv_malloc(t.size);
    pkv_status s = PKV_OK;
    if (!t.b || !t.shadow || !t.tmp || !t.data) {
        s = pkv_err_prefix(PKV_ERR_NOMEM, "check on %s: cannot allocate %zu-byte test buffers", dev->caps.name, t.size);
        goto done;
    }
    /* Establish a known state: whole-buffer write of random bytes. */
    fill_random(&t.r, t.shadow, t.size);
    if ((s = pkv_buffer_write(t.b, 0, t.shadow, t.size)) != PKV_OK) goto done;

    static const struct {
        const char *name;
        test_fn fn;
    } tests[] = {{"write", t_write}, {"read", t_read}, {"fill", t_fill}, {"copy", t_copy},
                 {"copy_regions", t_copy_regions}};
    for (size_t i = 0; i < PKV_ARRAY_LEN(tests); i++) {
        char detail[256] = "";
        long count = 0;
        double t0 = pkv_time_now();
        bool ok = tests[i].fn(&t, &count, detail, sizeof detail);
        emit(&rep, tests[i].name, ok, count, pkv_time_now() - t0, detail);
        if (!ok) { /* re-sync the shadow so later tests report their own failures */
            if (pkv_buffer_write(t.b, 0, t.shadow, t.size) != PKV_OK) break;
        }
    }
    /* Out-of-bounds requests must be refused, not performed. */
    {
        double t0 = pkv_time_now();
        char detail[256] = "";
        bool ok = pkv_buffer_write(t.b, t.size - 3, t.data, 4) == PKV_ERR_INVALID &&
                  pkv_buffer_read(t.b, t.size, t.tmp, 1) == PKV_ERR_INVALID &&
                  pkv_buffer_fill(t.b, SIZE_MAX - 1, 4, 0) == PKV_ERR_INVALID &&
                  pkv_buffer_copy(t.b, 0, t.b, 1, 4) == PKV_ERR_INVALID;
        if (!ok) snprintf(detail, sizeof detail, "an out-of-bounds or overlapping request was accepted");
        else if (!verify(t.b, t.shadow, t.tmp, t.size, detail, sizeof detail, "refused requests")) ok = false;
        emit(&rep, "bounds", ok, 4, pkv_time_now() - t0, detail);
    }
    s = rep.all_passed ? PKV_OK : pkv_err(PKV_ERR_DEVICE, "device %s failed the transfer conformance suite", dev->caps.name);
done:
    dev->raw = was_raw;
    pkv_free(t.data);
    pkv_free(t.tmp);
    pkv_free(t.shadow);
    pkv_buffer_free(t.b);
    return s;
}

pkv_status pkv_check_cross(pkv_device *a, pkv_device *b, pkv_check_params p, pkv_check_report_fn report, void *user) {
    if (!a || !b) return pkv_err(PKV_ERR_INVALID, "check: device is NULL");
    char label[140];
    snprintf(label, sizeof label, "%s -> %s", a->caps.name, b->caps.name);
    reporter rep = {label, report, user, true};
    bool raw_a = a->raw, raw_b = b->raw;
    a->raw = b->raw = true;
    size_t size = BUF_BYTES;
    rng r = {seed_of(p, 2)};
    pkv_buffer *ba = pkv_buffer_alloc(a, size), *bb = pkv_buffer_alloc(b, size);
    uint8_t *sa = pkv_malloc(size), *sb = pkv_malloc(size), *tmp = pkv_malloc(size);
    pkv_region *reg = pkv_malloc(256 * sizeof *reg);
    pkv_status s = PKV_OK;
    if (!ba || !bb || !sa || !sb || !tmp || !reg) {
        s = pkv_err_prefix(PKV_ERR_NOMEM, "cross check %s", label);
        goto done;
    }
    fill_random(&r, sa, size);
    fill_random(&r, sb, size);
    if ((s = pkv_buffer_write(ba, 0, sa, size)) || (s = pkv_buffer_write(bb, 0, sb, size))) goto done;
    int iters = (p.iterations > 0 ? p.iterations : 2000) / 4;
    char detail[256] = "";
    long count = 0;
    double t0 = pkv_time_now();
    bool ok = true;
    for (int i = 0; i < iters && ok; i++) {
        bool fwd = i % 2 == 0;
        pkv_buffer *src = fwd ? ba : bb, *dst = fwd ? bb : ba;
        uint8_t *ssh = fwd ? sa : sb, *dsh = fwd ? sb : sa;
        size_t soff, n;
        pick_region(&r, size, &soff, &n);
        size_t doff = rnd_below(&r, size - n + 1);
        if (pkv_buffer_copy(src, soff, dst, doff, n) != PKV_OK) {
            snprintf(detail, sizeof detail, "copy %zu -> %zu size %zu failed: %s", soff, doff, n, pkv_errmsg());
            ok = false;
            break;
        }
        memcpy(dsh + doff, ssh + soff, n);
        count++;
        if (i % 32 == 31 || i == iters - 1) {
            char what[96];
            snprintf(what, sizeof what, "copy %zu -> %zu size %zu", soff, doff, n);
            ok = verify(dst, dsh, tmp, size, detail, sizeof detail, what);
        }
    }
    emit(&rep, "cross copy", ok, count, pkv_time_now() - t0, detail);
    /* Batched cross-device regions. */
    t0 = pkv_time_now();
    count = 0;
    detail[0] = 0;
    ok = true;
    for (int round = 0; round < 4 && ok; round++) {
        size_t nreg = 64 + rnd_below(&r, 192), slot = size / nreg;
        for (size_t k = 0; k < nreg; k++) {
            size_t n = rnd_below(&r, slot + 1);
            reg[k].dst_off = k * slot + rnd_below(&r, slot - n + 1);
            reg[k].size = n;
            reg[k].src_off = rnd_below(&r, size - n + 1);
        }
        if (pkv_buffer_copy_regions(ba, bb, reg, nreg) != PKV_OK) {
            snprintf(detail, sizeof detail, "copy_regions of %zu regions failed: %s", nreg, pkv_errmsg());
            ok = false;
            break;
        }
        for (size_t k = 0; k < nreg; k++) memcpy(sb + reg[k].dst_off, sa + reg[k].src_off, reg[k].size);
        count += (long)nreg;
        ok = verify(bb, sb, tmp, size, detail, sizeof detail, "cross copy_regions");
    }
    emit(&rep, "cross copy_regions", ok, count, pkv_time_now() - t0, detail);
    s = rep.all_passed ? PKV_OK : pkv_err(PKV_ERR_DEVICE, "cross-device copies %s failed", label);
done:
    a->raw = raw_a;
    b->raw = raw_b;
    pkv_free(reg);
    pkv_free(tmp);
    pkv_free(sb);
    pkv_free(sa);
    pkv_buffer_free(bb);
    pkv_buffer_free(ba);
    return s;
}
