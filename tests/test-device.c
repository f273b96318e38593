// labels: unit device
/* The device layer: the dispatcher refuses bad arguments with the right status
 * and a message naming buffer size, offset and length; cross-device copies;
 * allocation-failure injection through device and buffer creation. */
#include "base/base.h"
#include "testhelp.h"

static void test_dispatcher(pkv_device *d, pkv_device *d2) {
    pkv_buffer *b = pkv_buffer_alloc(d, 100);
    if (!b) {
        TH_FAIL("alloc: %s", pkv_errmsg());
        return;
    }
    CHECK_INT(pkv_buffer_size(b), 100);
    CHECK(pkv_buffer_device(b) == d);
    CHECK_INT(pkv_device_allocated(d), 100);
    uint8_t data[200] = {0};
    CHECK_STATUS(pkv_buffer_write(b, 90, data, 11), PKV_ERR_INVALID);
    CHECK_MSG("offset 90 + length 11 is outside the buffer of 100 bytes");
    CHECK_STATUS(pkv_buffer_read(b, 101, data, 0), PKV_ERR_INVALID);
    CHECK_MSG("offset 101");
    CHECK_STATUS(pkv_buffer_fill(b, SIZE_MAX, 2, 0), PKV_ERR_INVALID); /* no wrap-around */
    CHECK_STATUS(pkv_buffer_read(b, 0, NULL, 4), PKV_ERR_INVALID);
    CHECK_MSG("NULL");
    CHECK_STATUS(pkv_buffer_write(NULL, 0, data, 4), PKV_ERR_INVALID);
    CHECK_STATUS(pkv_buffer_copy(b, 0, b, 10, 20), PKV_ERR_INVALID);
    CHECK_MSG("overlap");
    CHECK_OK(pkv_buffer_copy(b, 0, b, 20, 20));
    CHECK_OK(pkv_buffer_read(b, 100, data, 0)); /* zero length at the end is fine */
    CHECK_OK(pkv_buffer_write(b, 0, NULL, 0));
    CHECK(pkv_buffer_alloc(d, 0) == NULL);
    CHECK_MSG("size is 0");

    pkv_region r[3] = {{0, 50, 10}, {20, 55, 10}, {40, 80, 5}};
    CHECK_STATUS(pkv_buffer_copy_regions(b, b, r, 3), PKV_ERR_INVALID); /* dst 50..60 and 55..65 */
    CHECK_MSG("overlap");
    r[1].dst_off = 60;
    CHECK_OK(pkv_buffer_copy_regions(b, b, r, 3));
    pkv_region r2[2] = {{0, 60, 10}, {55, 90, 10}}; /* dst 60..70 over src 55..65 */
    CHECK_STATUS(pkv_buffer_copy_regions(b, b, r2, 2), PKV_ERR_INVALID);
    CHECK_MSG("overlaps source");
    pkv_region r3[1] = {{95, 0, 10}};
    CHECK_STATUS(pkv_buffer_copy_regions(b, b, r3, 1), PKV_ERR_INVALID);
    CHECK_MSG("region 0 source");
    CHECK_STATUS(pkv_buffer_copy_regions(b, b, NULL, 2), PKV_ERR_INVALID);

    /* Content through a batched copy between devices. */
    for (int i = 0; i < 100; i++) data[i] = (uint8_t)(i * 7 + 1);
    CHECK_OK(pkv_buffer_write(b, 0, data, 100));
    pkv_buffer *c = pkv_buffer_alloc(d2, 64);
    if (c) {
        CHECK_OK(pkv_buffer_fill(c, 0, 64, 0xee));
        pkv_region cr[2] = {{3, 1, 7}, {90, 50, 10}};
        CHECK_OK(pkv_buffer_copy_regions(b, c, cr, 2));
        uint8_t got[64], want[64];
        memset(want, 0xee, 64);
        memcpy(want + 1, data + 3, 7);
        memcpy(want + 50, data + 90, 10);
        CHECK_OK(pkv_buffer_read(c, 0, got, 64));
        CHECK_MEM(got, want, 64);
        CHECK_OK(pkv_buffer_copy(c, 50, b, 0, 10));
        CHECK_OK(pkv_buffer_read(b, 0, got, 10));
        CHECK_MEM(got, data + 90, 10);
        pkv_buffer_free(c);
    }
    pkv_buffer_free(b);
    CHECK_INT(pkv_device_allocated(d), 0);
    pkv_buffer_free(NULL);
}

static void test_open_errors(void) {
    CHECK(pkv_device_open("gpu:7", pkv_device_default_params()) == NULL);
    CHECK_MSG("no device 'gpu:7'");
    CHECK(pkv_device_open("cpu:x", pkv_device_default_params()) == NULL);
    CHECK(pkv_device_open(NULL, pkv_device_default_params()) == NULL);
    pkv_device_close(NULL);
    char names[8][64];
    int n = 0;
    CHECK_OK(pkv_device_enumerate(2, names, 8, &n, NULL, 0));
    CHECK(n >= 3);
    CHECK(strcmp(names[0], "cpu") == 0 && strcmp(names[2], "cpu:2") == 0);
    pkv_device_params p = pkv_device_default_params();
    p.memory_limit = 1000;
    pkv_device *d = pkv_device_open("cpu:3", p);
    if (d) {
        pkv_buffer *a = pkv_buffer_alloc(d, 600);
        CHECK(a != NULL);
        CHECK(pkv_buffer_alloc(d, 600) == NULL);
        CHECK_MSG("already allocated");
        pkv_buffer_free(a);
        pkv_device_close(d);
    }
}

/* Fail each allocation of device creation and buffer creation in turn. */
static void test_alloc_failures(void) {
    int64_t live0 = pkv_alloc_live();
    pkv_device_params p = pkv_device_default_params();
    p.n_threads = 2;
    pkv_alloc_fail_at(0);
    pkv_device *d = pkv_device_open("cpu:1", p);
    pkv_buffer *b = d ? pkv_buffer_alloc(d, 4096) : NULL;
    uint64_t n_allocs = pkv_alloc_fail_at(0);
    pkv_buffer_free(b);
    pkv_device_close(d);
    CHECK(n_allocs >= 3);
    CHECK_INT(pkv_alloc_live(), live0);
    int failures_seen = 0;
    for (uint64_t k = 1; k <= n_allocs; k++) {
        pkv_alloc_fail_at(k);
        d = pkv_device_open("cpu:1", p);
        b = d ? pkv_buffer_alloc(d, 4096) : NULL;
        pkv_alloc_fail_at(0);
        if (!d || !b) {
            failures_seen++;
            CHECK(pkv_errmsg()[0] != 0);
        }
        if (b) { /* a buffer that was created must work */
            uint8_t x[16] = {1, 2, 3}, y[16];
            CHECK_OK(pkv_buffer_write(b, 4000, x, 16));
            CHECK_OK(pkv_buffer_read(b, 4000, y, 16));
            CHECK_MEM(x, y, 16);
        }
        pkv_buffer_free(b);
        pkv_device_close(d);
        CHECK_INT(pkv_alloc_live(), live0);
    }
    CHECK_INT(failures_seen, (long long)n_allocs);
}

int main(void) {
    pkv_device *d = pkv_device_open("cpu", pkv_device_default_params());
    pkv_device *d2 = pkv_device_open("cpu:1", pkv_device_default_params());
    REQUIRE(d && d2);
    CHECK(strcmp(pkv_device_name(d2), "cpu:1") == 0);
    CHECK(pkv_device_can_access(d, d) && !pkv_device_can_access(d, d2));
    test_dispatcher(d, d2);
    test_open_errors();
    pkv_device_close(d2);
    pkv_device_close(d);
    test_alloc_failures();
    return th_done();
}
