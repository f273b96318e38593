/* The CPU instruction-set paths a test forces in turn with PKV_CPU_PATH: those
 * of this build's architecture (generic, avx2, avx512, amx on x86-64; generic,
 * neon, dotprod, i8mm on aarch64) that this CPU can run. A path it lacks is
 * named on stderr and left out: forcing it would only run the next best again. */
#ifndef PKV_TEST_CPU_PATHS_H
#define PKV_TEST_CPU_PATHS_H

#include "device/cpu/cpu-impl.h"

#include <stdbool.h>
#include <stdio.h>

#define TH_MAX_CPU_PATHS 8

/* Fills out[] with the names; returns how many. */
static inline int th_cpu_paths(const char **out) {
    static bool said;
    int n = 0, all = 0;
    const char *const *names = pkv_cpu_paths(&all);
    for (int i = 0; i < all && n < TH_MAX_CPU_PATHS; i++) {
        if (pkv_cpu_path_available(names[i]))
            out[n++] = names[i];
        else if (!said)
            fprintf(stderr, "note: this CPU lacks the %s path: not tested here\n", names[i]);
    }
    said = true;
    return n;
}

#endif
