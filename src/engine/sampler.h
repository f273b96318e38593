/* Sampling: the public API is in include/pagekv.h (engine section). */
#ifndef PKV_SAMPLER_H
#define PKV_SAMPLER_H

#include "pagekv.h"

#endif /* PKV_SAMPLER_H */
