/* Sequence files from memory (kv-file.c), for the layers above kv and the fuzz
 * harnesses (fuzz/): the file format is described in kv-file.c. */
#ifndef PKV_KV_FILE_H
#define PKV_KV_FILE_H

#include "pagekv.h"

#include <stddef.h>
#include <stdint.h>

/* pkv_kv_seq_load on a file image in memory (not copied, only read during the
 * call); label names it in messages (NULL = "<memory>"). Same checks and failure
 * contract as pkv_kv_seq_load: on error nothing changes. */
pkv_status pkv_kv_seq_load_memory(pkv_kv_cache *c, const char *label, const void *data, size_t size,
                                  uint64_t fingerprint, int32_t *seq);

#endif
