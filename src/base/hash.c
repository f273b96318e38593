/* 64-bit hash for prefix chains and checksums: a simple multiply-xorshift over
 * 8-byte words with a final avalanche. Not cryptographic; collisions are handled
 * by callers (the prefix index compares tokens on every hit). */
#include "base/base.h"

#include <string.h>

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

uint64_t pkv_hash64(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = data;
    uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (n + 1));
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ mix(w)) * 0x100000001b3ull + 0x2545f4914f6cdd1dull;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ mix(w ^ (uint64_t)n << 56)) * 0x100000001b3ull;
    return mix(h);
}
