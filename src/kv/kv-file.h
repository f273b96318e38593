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

/* For the disk tier (kv-disk.c): one layer's K (v false) or V of pages[0..n_pages)
 * (n_tokens tokens) between the cache and canon, the file's canonical
 * [n_tokens][n_kv_heads][head row] order, through tmp (n_pages pages of the
 * largest array). Every device access is a transfer of the device API. */
pkv_status pkv_kv_file_move_layer(pkv_kv_cache *c, int il, bool v, const int32_t *pages, int64_t n_pages,
                                  int64_t n_tokens, uint8_t *canon, uint8_t *tmp, bool to_device);
/* Bytes of one layer's K or V section of n_tokens tokens (0 for a recurrent layer's V). */
size_t pkv_kv_file_layer_bytes(const pkv_kv_cache *c, int il, int64_t n_tokens, bool v);

#endif
