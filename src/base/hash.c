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

/* Four independent multiply-rotate lanes over 32-byte blocks (no dependency
 * between lanes, so the CPU overlaps them: several GB/s per thread), folded
 * with pkv_hash64 at the end. For bulk data (model weights); not the same
 * value as pkv_hash64 of the same bytes. */
static inline uint64_t rotl64(uint64_t x, int r) { return x << r | x >> (64 - r); }

uint64_t pkv_hash64_bulk(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = data;
    const uint64_t k1 = 0x9e3779b185ebca87ull, k2 = 0xc2b2ae3d27d4eb4full;
    uint64_t v[4] = {seed + k1 + k2, seed + k2, seed, seed - k1};
    size_t blocks = n / 32;
    for (size_t b = 0; b < blocks; b++, p += 32)
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, p + 8 * l, 8);
            v[l] = rotl64(v[l] + w * k2, 31) * k1;
        }
    uint64_t fold[4] = {mix(v[0]), mix(v[1] ^ 1), mix(v[2] ^ 2), mix(v[3] ^ 3)};
    return pkv_hash64(p, n % 32, pkv_hash64(fold, sizeof fold, seed ^ (uint64_t)n));
}
