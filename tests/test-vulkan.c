// labels: vulkan device timeout=600
/* The Vulkan backend on vulkan:0: discovery, transfers at random unaligned offsets
 * against a host shadow copy (direct-mapped path and PKV_VK_FORCE_STAGING=1),
 * cross-device copies with the CPU, queue ordering, and every kernel against a
 * plain-C reference. Skipped (77) when no Vulkan device can be opened. */
#include "testhelp.h"

#include "base/base.h"
#include "device/device.h"

#include <stdlib.h>

/* ------------------------------------------------------------- transfers */

typedef struct {
    pkv_buffer *buf[2];
    uint8_t *shadow[2];
    size_t size[2];
} tx_state;

/* A random region of a buffer of `size` bytes, with the edge cases weighted in. */
static void rand_region(uint64_t *rng, size_t size, size_t *off, size_t *n) {
    switch (th_rand(rng) % 8) {
    case 0: *off = th_rand(rng) % (size + 1); *n = 0; return;
    case 1: *off = th_rand(rng) % size; *n = 1; return;
    case 2: *off = size - 1; *n = 1; return;
    case 3: *off = 0; *n = size; return;
    case 4: *off = th_rand(rng) % size; *n = size - *off; return; /* to the end */
    default: break;
    }
    *off = th_rand(rng) % size;
    size_t max = size - *off;
    size_t cap = th_rand(rng) % 2 ? 16 : max;
    *n = th_rand(rng) % (PKV_MIN(cap, max) + 1);
}

static int transfer_suite(pkv_device *dev, uint64_t seed, int iters) {
    int fails0 = th_failures;
    uint64_t rng = seed;
    tx_state st;
    st.size[0] = 4099;
    st.size[1] = 1 << 13;
    for (int i = 0; i < 2; i++) {
        st.buf[i] = pkv_buffer_alloc(dev, st.size[i]);
        st.shadow[i] = malloc(st.size[i]);
        if (!st.buf[i]) {
            TH_FAIL("alloc: %s", pkv_errmsg());
            return 1;
        }
        for (size_t k = 0; k < st.size[i]; k++) st.shadow[i][k] = (uint8_t)th_rand(&rng);
        CHECK_OK(pkv_buffer_write(st.buf[i], 0, st.shadow[i], st.size[i]));
    }
    uint8_t *tmp = malloc(1 << 13);
    long counts[6] = {0};
    for (int it = 0; it < iters && th_failures == fails0; it++) {
        int b = (int)(th_rand(&rng) % 2), op = (int)(th_rand(&rng) % 6);
        size_t off, n;
        rand_region(&rng, st.size[b], &off, &n);
        counts[op]++;
        switch (op) {
        case 0: /* write */
            for (size_t k = 0; k < n; k++) tmp[k] = (uint8_t)th_rand(&rng);
            CHECK_OK(pkv_buffer_write(st.buf[b], off, tmp, n));
            memcpy(st.shadow[b] + off, tmp, n);
            memset(tmp, 0xEE, n); /* the device must have copied it already */
            break;
        case 1: { /* read */
            memset(tmp, 0xCD, n);
            CHECK_OK(pkv_buffer_read(st.buf[b], off, tmp, n));
            if (memcmp(tmp, st.shadow[b] + off, n) != 0) {
                size_t k = 0;
                while (tmp[k] == st.shadow[b][off + k]) k++;
                TH_FAIL("iter %d: read buf%d [%zu, +%zu): byte %zu is %d, want %d", it, b, off, n, off + k,
                        tmp[k], st.shadow[b][off + k]);
            }
            break;
        }
        case 2: { /* fill */
            uint8_t v = (uint8_t)th_rand(&rng);
            CHECK_OK(pkv_buffer_fill(st.buf[b], off, n, v));
            memset(st.shadow[b] + off, v, n);
            break;
        }
        case 3: { /* copy to the other buffer */
            int d = 1 - b;
            if (n > st.size[d]) n = st.size[d];
            size_t doff = th_rand(&rng) % (st.size[d] - n + 1);
            CHECK_OK(pkv_buffer_copy(st.buf[b], off, st.buf[d], doff, n));
            memcpy(st.shadow[d] + doff, st.shadow[b] + off, n);
            break;
        }
        case 4: { /* copy within one buffer, non-overlapping */
            if (n > st.size[b] / 2) n = st.size[b] / 2;
            size_t a = th_rand(&rng) % (st.size[b] - 2 * n + 1);
            size_t gap = th_rand(&rng) % (st.size[b] - 2 * n - a + 1);
            size_t s0 = a, d0 = a + n + gap;
            if (th_rand(&rng) % 2) { size_t t = s0; s0 = d0; d0 = t; }
            CHECK_OK(pkv_buffer_copy(st.buf[b], s0, st.buf[b], d0, n));
            memmove(st.shadow[b] + d0, st.shadow[b] + s0, n);
            break;
        }
        default: { /* copy_regions: disjoint destination slots, random sources */
            int d = (int)(th_rand(&rng) % 2);
            pkv_region r[24];
            int nr = (int)(th_rand(&rng) % 24) + 1;
            size_t slot = st.size[d] / (size_t)nr;
            if (b == d) slot = st.size[d] / (size_t)(2 * nr); /* sources in the upper half */
            size_t maxn = PKV_MIN(slot, st.size[b] / 2);
            uint8_t *snap = malloc(st.size[b]);
            memcpy(snap, st.shadow[b], st.size[b]);
            for (int i = 0; i < nr; i++) {
                size_t sz = th_rand(&rng) % (maxn + 1);
                r[i].size = sz;
                r[i].dst_off = (size_t)i * slot + th_rand(&rng) % (slot - sz + 1);
                if (b == d) {
                    size_t half = st.size[b] / 2 + (st.size[b] & 1);
                    r[i].src_off = half + th_rand(&rng) % (st.size[b] - half - sz + 1);
                } else {
                    r[i].src_off = th_rand(&rng) % (st.size[b] - sz + 1);
                }
            }
            CHECK_OK(pkv_buffer_copy_regions(st.buf[b], st.buf[d], r, (size_t)nr));
            for (int i = 0; i < nr; i++) memcpy(st.shadow[d] + r[i].dst_off, snap + r[i].src_off, r[i].size);
            free(snap);
            break;
        }
        }
    }
    for (int i = 0; i < 2; i++) {
        uint8_t *all = malloc(st.size[i]);
        CHECK_OK(pkv_buffer_read(st.buf[i], 0, all, st.size[i]));
        CHECK_MEM(all, st.shadow[i], st.size[i]);
        free(all);
        pkv_buffer_free(st.buf[i]);
        free(st.shadow[i]);
    }
    free(tmp);
    fprintf(stderr, "  %s: %d random transfers (w %ld r %ld f %ld c %ld c-in %ld regions %ld)\n",
            pkv_device_get_caps(dev)->description, iters, counts[0], counts[1], counts[2], counts[3], counts[4],
            counts[5]);
    return th_failures != fails0;
}

/* A transfer larger than the staging buffer's largest size goes in chunks. */
static void big_transfer(pkv_device *dev) {
    size_t n = ((size_t)65 << 20) + 3;
    pkv_buffer *b = pkv_buffer_alloc(dev, n + 8);
    CHECK(b != NULL);
    if (!b) return;
    uint8_t *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK_OK(pkv_buffer_fill(b, 0, 5, 0x11)); /* queue is busy: the write takes the staged path */
    CHECK_OK(pkv_buffer_write(b, 5, h, n));
    CHECK_OK(pkv_buffer_fill(b, n + 5, 3, 0x22));
    memset(back, 0, n);
    CHECK_OK(pkv_buffer_read(b, 5, back, n));
    CHECK_MEM(back, h, n);
    uint8_t edge[8];
    CHECK_OK(pkv_buffer_read(b, 0, edge, 5));
    CHECK(edge[0] == 0x11 && edge[4] == 0x11);
    CHECK_OK(pkv_buffer_read(b, n + 5, edge, 3));
    CHECK(edge[0] == 0x22 && edge[2] == 0x22);
    pkv_buffer_free(b);
    free(h);
    free(back);
}

/* Cross-device copies cpu <-> vulkan at unaligned offsets, through pkv_buffer_copy
 * and copy_regions. */
static void cross_device(pkv_device *vk) {
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    if (!cpu) {
        TH_FAIL("open cpu: %s", pkv_errmsg());
        return;
    }
    size_t n = 10007;
    pkv_buffer *c = pkv_buffer_alloc(cpu, n), *v = pkv_buffer_alloc(vk, n);
    uint8_t *h = malloc(n), *back = malloc(n);
    uint64_t rng = 42;
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)th_rand(&rng);
    CHECK_OK(pkv_buffer_write(c, 0, h, n));
    CHECK_OK(pkv_buffer_fill(v, 0, n, 0));
    CHECK_OK(pkv_buffer_copy(c, 3, v, 1, n - 7));
    CHECK_OK(pkv_buffer_read(v, 1, back, n - 7));
    CHECK_MEM(back, h + 3, n - 7);
    /* back to the CPU at another offset */
    CHECK_OK(pkv_buffer_fill(c, 0, n, 0));
    CHECK_OK(pkv_buffer_copy(v, 1, c, 5, n - 7));
    CHECK_OK(pkv_buffer_read(c, 5, back, n - 7));
    CHECK_MEM(back, h + 3, n - 7);
    pkv_region r[3] = {{0, 100, 17}, {999, 1, 3}, {5000, 6001, 4000}};
    CHECK_OK(pkv_buffer_write(c, 0, h, n));
    CHECK_OK(pkv_buffer_copy_regions(c, v, r, 3));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(pkv_buffer_read(v, r[i].dst_off, back, r[i].size));
        CHECK_MEM(back, h + r[i].src_off, r[i].size);
    }
    pkv_buffer_free(c);
    pkv_buffer_free(v);
    pkv_device_close(cpu);
    free(h);
    free(back);
}

/* ------------------------------------------------------------------- main */

static pkv_device *open_vk(void) { return pkv_device_open("vulkan:0", pkv_device_default_params()); }

int main(void) {
    char names[16][64], why[256] = "";
    int n = 0;
    CHECK_OK(pkv_device_enumerate(0, names, 16, &n, why, sizeof why));
    bool listed = false;
    for (int i = 0; i < n && i < 16; i++) listed |= strcmp(names[i], "vulkan:0") == 0;
    pkv_device *dev = open_vk();
    if (!dev) {
        CHECK(!listed); /* listed devices must open */
        if (th_failures) return th_done();
        char msg[600];
        snprintf(msg, sizeof msg, "no Vulkan device: %s (%s)", pkv_errmsg(), why);
        return th_skip(msg);
    }
    CHECK(listed);
    const pkv_device_caps *caps = pkv_device_get_caps(dev);
    fprintf(stderr, "vulkan:0 = %s, %llu MiB, max buffer %zu, host_memory %d\n", caps->description,
            (unsigned long long)(caps->memory_bytes >> 20), caps->max_buffer_bytes, caps->host_memory);
    CHECK_INT(caps->kind, PKV_DEVICE_VULKAN);
    CHECK(strcmp(caps->name, "vulkan:0") == 0);
    CHECK(caps->description[0] != 0);
    CHECK(caps->memory_bytes > 0);
    CHECK_INT(caps->transfer_align, 4);

    transfer_suite(dev, 1, 3000);
    big_transfer(dev);
    cross_device(dev);
    pkv_device_close(dev);

    /* The same on the staging path (on lavapipe the default is direct mapping). */
    setenv("PKV_VK_FORCE_STAGING", "1", 1);
    dev = open_vk();
    REQUIRE(dev != NULL);
    CHECK(!pkv_device_get_caps(dev)->host_memory);
    transfer_suite(dev, 2, 3000);
    big_transfer(dev);
    cross_device(dev);
    pkv_device_close(dev);
    unsetenv("PKV_VK_FORCE_STAGING");
    CHECK_INT(pkv_alloc_live(), 0);
    return th_done();
}
