/* Shared helpers of the recurrent-layer kernel tests (test-delta-kernels,
 * test-ssm-scan): device buffers from host data and back, bitwise float compare. */
#ifndef PKV_RECURRENT_TESTLIB_H
#define PKV_RECURRENT_TESTLIB_H

#include "testhelp.h"
#include "device/device.h"

/* A buffer of n bytes holding data (zeros when data is NULL); NULL on failure. */
static pkv_buffer *up(pkv_device *d, const void *data, size_t n) {
    pkv_buffer *b = pkv_buffer_alloc(d, n ? n : 4);
    if (b && data && n && pkv_buffer_write(b, 0, data, n)) {
        pkv_buffer_free(b);
        return NULL;
    }
    if (b && !data && pkv_buffer_fill(b, 0, n ? n : 4, 0)) {
        pkv_buffer_free(b);
        return NULL;
    }
    return b;
}

static bool down(pkv_buffer *b, void *out, size_t n) { return pkv_buffer_read(b, 0, out, n) == PKV_OK; }

static bool bits_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

#endif
