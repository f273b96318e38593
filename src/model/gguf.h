/* GGUF reader and writer (model layer, internal).
 *
 * File layout (GGUF v2/v3, little-endian; ggml's docs/gguf.md):
 *   "GGUF" | version u32 | tensor_count u64 | kv_count u64
 *   kv_count x  { key: string | value type u32 | value }
 *   tensor_count x { name: string | n_dims u32 | ne u64[n_dims] | type u32 | offset u64 }
 *   zero padding to general.alignment (u32 key; default 32)
 *   tensor data; each tensor at data_start + offset, offset a multiple of the alignment
 * where string = length u64 + bytes (no NUL), and an ARRAY value is
 * element type u32 + count u64 + elements.
 *
 * The reader maps the file read-only and validates all of the structure against
 * the file size when it opens it; after a successful open every accessor is
 * safe: no later call can read outside the mapping. It rejects (PKV_ERR_FORMAT):
 *  - a magic other than "GGUF"; version 1, big-endian files, versions other than 2, 3;
 *  - counts that cannot fit in the bytes left (checked before allocating: a KV
 *    takes >= 13 bytes, a tensor info >= 32, a string >= 8), and any string,
 *    array or value running past the end of the file;
 *  - unknown value types, arrays of arrays, bool values other than 0 and 1,
 *    keys or tensor names containing a NUL byte, duplicate keys or tensor names;
 *  - general.alignment that is not a uint32 power of two;
 *  - n_dims outside 1..4, a dimension of 0 or >= 2^63, element counts or byte
 *    sizes that overflow 64 bits, tensor types pagekv does not know
 *    (pkv_type_block_bytes == 0), ne[0] not a multiple of the type's block;
 *  - tensor offsets not a multiple of the alignment, tensor data past the end
 *    of the file, tensors whose data overlap.
 * It does not require tensors to be stored contiguously in order (llama.cpp's
 * writer does that; the pagekv writer too).
 *
 * Pointers returned by accessors (names, strings, tensor data) point into the
 * reader and stay valid until pkv_gguf_close. Strings of values are NOT
 * NUL-terminated (GGUF strings carry a length); keys and tensor names are.
 * Model-layer code may read tensor data through these host pointers: the
 * mapping is a file on the host, not device memory.
 *
 * A reader is immutable after open: any number of threads may use it at once.
 * As with any mmap, truncating the file while it is open makes later reads of
 * the lost pages fault (SIGBUS); files are meant to be replaced by rename, as
 * the writer does. */
#ifndef PKV_MODEL_GGUF_H
#define PKV_MODEL_GGUF_H

#include "base/base.h"

/* GGUF value types (the u32 stored before each value). */
typedef enum pkv_gguf_type {
    PKV_GGUF_UINT8 = 0,
    PKV_GGUF_INT8 = 1,
    PKV_GGUF_UINT16 = 2,
    PKV_GGUF_INT16 = 3,
    PKV_GGUF_UINT32 = 4,
    PKV_GGUF_INT32 = 5,
    PKV_GGUF_FLOAT32 = 6,
    PKV_GGUF_BOOL = 7,
    PKV_GGUF_STRING = 8,
    PKV_GGUF_ARRAY = 9,
    PKV_GGUF_UINT64 = 10,
    PKV_GGUF_INT64 = 11,
    PKV_GGUF_FLOAT64 = 12,
    PKV_GGUF_TYPE_COUNT = 13,
} pkv_gguf_type;

#define PKV_GGUF_DEFAULT_ALIGNMENT 32
#define PKV_GGUF_MAX_DIMS 4
/* llama.cpp keeps tensor names in a 64-byte field; the writer refuses longer
 * names so that its files load there too. The reader accepts any length. */
#define PKV_GGUF_MAX_TENSOR_NAME 63

/* "uint8", "string", "array", ... or "unknown" for values outside the enum. */
const char *pkv_gguf_type_name(pkv_gguf_type t);
/* Size of one element of a fixed-size type (1 for bool); 0 for STRING, ARRAY
 * and unknown types. */
size_t pkv_gguf_type_size(pkv_gguf_type t);

/* ------------------------------------------------------------------ reader */

typedef struct pkv_gguf pkv_gguf;

/* A tensor of the file. ne[0] is the innermost (row) length; dims past n_dims
 * are 1. n_bytes = pkv_type_row_bytes(type, ne[0]) * ne[1] * ne[2] * ne[3]. */
typedef struct pkv_gguf_tensor {
    const char *name;    /* NUL-terminated */
    pkv_type type;       /* known: pkv_type_block_bytes(type) != 0 */
    uint32_t n_dims;     /* 1..4 */
    int64_t ne[PKV_GGUF_MAX_DIMS]; /* each >= 1 */
    uint64_t n_elements;
    size_t n_bytes;
    size_t file_offset;  /* absolute offset of the data in the file */
    const void *data;    /* host pointer into the file's bytes, n_bytes long.
                            Mapped: aligned to the file alignment (the map is
                            page-aligned). Read fallback: to min(alignment, the
                            allocator's). open_memory: as the caller's buffer. */
} pkv_gguf_tensor;

/* An array value. Elements of fixed-size types are stored raw, little-endian
 * and possibly unaligned at `data` (read them with pkv_gguf_arr_int/_float or
 * memcpy). String elements are read with pkv_gguf_arr_str. */
typedef struct pkv_gguf_array {
    pkv_gguf_type type; /* element type; never ARRAY (nested arrays are rejected) */
    uint64_t count;
    const void *data;   /* first element (for strings: the first length prefix) */
    int64_t kv;         /* index of the key-value pair it belongs to */
} pkv_gguf_array;

/* Open and validate a GGUF file. The file is memory-mapped read-only; when
 * mmap is not possible (or the environment has PKV_GGUF_NO_MMAP=1, a test
 * hook) it is read into pkv_malloc memory.
 * pkv_gguf_read returns PKV_OK and sets *out, or returns PKV_ERR_IO (cannot
 * open, stat or read; not a regular file), PKV_ERR_FORMAT (malformed: the
 * message names the file, the key or tensor, what was expected and what was
 * found, e.g. "x.gguf: tensor 'blk.3.attn_q.weight': data [offset 1234, +5678)
 * runs past the end of the file (4096 bytes)") or PKV_ERR_NOMEM, with *out
 * unchanged. On failure nothing stays allocated, mapped or open.
 * pkv_gguf_open is the same returning the handle, or NULL on failure. */
pkv_status pkv_gguf_read(const char *path, pkv_gguf **out);
pkv_gguf *pkv_gguf_open(const char *path);

/* The same on `size` bytes in memory. The bytes are NOT copied: they must stay
 * alive and unchanged until pkv_gguf_close. `label` (copied) names the source
 * in error messages; NULL means "<memory>". */
pkv_status pkv_gguf_read_memory(const void *data, size_t size, const char *label, pkv_gguf **out);
pkv_gguf *pkv_gguf_open_memory(const void *data, size_t size, const char *label);

/* Unmap and free. NULL is a no-op. */
void pkv_gguf_close(pkv_gguf *g);

const char *pkv_gguf_label(const pkv_gguf *g); /* the path or label given to open */
uint32_t pkv_gguf_version(const pkv_gguf *g);  /* 2 or 3 */
size_t pkv_gguf_alignment(const pkv_gguf *g);  /* general.alignment or 32 */
size_t pkv_gguf_data_offset(const pkv_gguf *g); /* start of the data section, <= the file
                                                   size (a file without tensor data may end
                                                   before the padding) */
size_t pkv_gguf_file_size(const pkv_gguf *g);

/* Key-value pairs, in file order; i in [0, pkv_gguf_n_kv). An index out of
 * range gives NULL / PKV_GGUF_TYPE_COUNT. */
int64_t pkv_gguf_n_kv(const pkv_gguf *g);
const char *pkv_gguf_kv_key(const pkv_gguf *g, int64_t i);   /* NUL-terminated */
pkv_gguf_type pkv_gguf_kv_type(const pkv_gguf *g, int64_t i);
/* Index of key, or -1 when absent (no error message is set). O(1). */
int64_t pkv_gguf_find_key(const pkv_gguf *g, const char *key);

/* Typed getters. Each returns PKV_OK and sets *out, or returns
 * PKV_ERR_NOT_FOUND ("<file>: key '<key>' not found") or PKV_ERR_FORMAT
 * ("<file>: key '<key>' has type string, expected uint32") and leaves *out
 * unchanged.
 * get_u32 accepts every integer type whose value fits in uint32_t (a negative
 * or too large value is PKV_ERR_FORMAT naming the value); get_i64 likewise for
 * int64_t; get_f32 accepts float32 and float64; get_bool only bool. */
pkv_status pkv_gguf_get_u32(const pkv_gguf *g, const char *key, uint32_t *out);
pkv_status pkv_gguf_get_i64(const pkv_gguf *g, const char *key, int64_t *out);
pkv_status pkv_gguf_get_f32(const pkv_gguf *g, const char *key, float *out);
pkv_status pkv_gguf_get_bool(const pkv_gguf *g, const char *key, bool *out);
/* *s points into the file (not NUL-terminated), *len is its length in bytes. */
pkv_status pkv_gguf_get_str(const pkv_gguf *g, const char *key, const char **s, size_t *len);
/* An array value. elem_type PKV_GGUF_TYPE_COUNT accepts any element type;
 * otherwise the element type must match (PKV_ERR_FORMAT naming both). */
pkv_status pkv_gguf_get_arr(const pkv_gguf *g, const char *key, pkv_gguf_type elem_type,
                            pkv_gguf_array *out);
/* Element i of a string array, in O(1). PKV_ERR_INVALID when a is not a string
 * array of g or i >= a->count; on error *s and *len are unchanged. */
pkv_status pkv_gguf_arr_str(const pkv_gguf *g, const pkv_gguf_array *a, uint64_t i,
                            const char **s, size_t *len);
/* Element i of a numeric (integer, bool or float) array converted to int64_t /
 * double (uint64 values above INT64_MAX saturate; floats truncate toward 0).
 * Returns 0 when i is out of range or the elements are strings. */
int64_t pkv_gguf_arr_int(const pkv_gguf_array *a, uint64_t i);
double pkv_gguf_arr_float(const pkv_gguf_array *a, uint64_t i);

/* Tensors, in file order. tensor_at returns NULL for an index out of range;
 * find_tensor returns NULL when absent (no message); get_tensor returns
 * PKV_ERR_NOT_FOUND with "<file>: tensor '<name>' not found" instead. O(1). */
int64_t pkv_gguf_n_tensors(const pkv_gguf *g);
const pkv_gguf_tensor *pkv_gguf_tensor_at(const pkv_gguf *g, int64_t i);
const pkv_gguf_tensor *pkv_gguf_find_tensor(const pkv_gguf *g, const char *name);
pkv_status pkv_gguf_get_tensor(const pkv_gguf *g, const char *name, const pkv_gguf_tensor **out);

/* ------------------------------------------------------------------ writer */

/* A builder for GGUF files, as llama.cpp's converters write them: version 3,
 * keys in the order added, tensor data in the order added, each tensor padded
 * to the alignment. Values and tensor data are COPIED when added, so the
 * caller's memory may be freed at once. */
typedef struct pkv_gguf_writer pkv_gguf_writer;

/* NULL on allocation failure. */
pkv_gguf_writer *pkv_gguf_writer_create(void);
void pkv_gguf_writer_free(pkv_gguf_writer *w);

/* Version to write: 3 (default) or 2 (same layout). PKV_ERR_INVALID otherwise. */
pkv_status pkv_gguf_writer_set_version(pkv_gguf_writer *w, uint32_t version);
/* Alignment of the data section and of each tensor: a power of two (default 32).
 * It is stored as the u32 key general.alignment (which is added, or replaced
 * in place); setting that key with add_u32 has the same effect. */
pkv_status pkv_gguf_writer_set_alignment(pkv_gguf_writer *w, uint32_t alignment);

/* Add a key-value pair. Adding a key that already exists replaces its value
 * (and type) in place. The key must be non-empty and NUL-free.
 * pkv_gguf_writer_add takes any fixed-size type (not STRING or ARRAY) and
 * copies pkv_gguf_type_size(type) bytes from value (host order); bool values
 * are stored as one byte 0 or 1.
 * On error (PKV_ERR_INVALID, PKV_ERR_NOMEM) the writer is unchanged. */
pkv_status pkv_gguf_writer_add(pkv_gguf_writer *w, const char *key, pkv_gguf_type type,
                               const void *value);
pkv_status pkv_gguf_writer_add_u32(pkv_gguf_writer *w, const char *key, uint32_t v);
pkv_status pkv_gguf_writer_add_i32(pkv_gguf_writer *w, const char *key, int32_t v);
pkv_status pkv_gguf_writer_add_u64(pkv_gguf_writer *w, const char *key, uint64_t v);
pkv_status pkv_gguf_writer_add_f32(pkv_gguf_writer *w, const char *key, float v);
pkv_status pkv_gguf_writer_add_bool(pkv_gguf_writer *w, const char *key, bool v);
/* A NUL-terminated string value. */
pkv_status pkv_gguf_writer_add_str(pkv_gguf_writer *w, const char *key, const char *s);
/* An array of count elements of a fixed-size type, packed in host order
 * (bool: one byte each, 0 or 1). count may be 0. */
pkv_status pkv_gguf_writer_add_arr(pkv_gguf_writer *w, const char *key, pkv_gguf_type elem_type,
                                   const void *elems, uint64_t count);
/* An array of count strings; lens[i] is the byte length of strs[i], or lens NULL
 * for NUL-terminated strings. */
pkv_status pkv_gguf_writer_add_arr_str(pkv_gguf_writer *w, const char *key,
                                       const char *const *strs, const size_t *lens,
                                       uint64_t count);

/* Add a tensor: n_dims in 1..4, ne[i] >= 1, ne[0] a multiple of the type's
 * block, size == its byte size (pkv_type_row_bytes(type, ne[0]) * ne[1]...);
 * data NULL means zeros. The name must be unique, non-empty, NUL-free and at
 * most 63 bytes. On error (PKV_ERR_INVALID, PKV_ERR_NOMEM) the writer is
 * unchanged. */
pkv_status pkv_gguf_writer_add_tensor(pkv_gguf_writer *w, const char *name, pkv_type type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      size_t size);

/* Key-value pair i of g, copied into w under its own key (strings, arrays and
 * scalars; an f64 is written as f32). */
pkv_status pkv_gguf_writer_copy_kv(pkv_gguf_writer *w, const pkv_gguf *g, int64_t i);
/* The same under the key `as` (renaming an architecture's keys). */
pkv_status pkv_gguf_writer_copy_kv_as(pkv_gguf_writer *w, const pkv_gguf *g, int64_t i, const char *as);

/* Write the file atomically: to "<path>.tmp", then rename over path. On error
 * (PKV_ERR_IO naming the path and errno text, PKV_ERR_INVALID for a bad
 * general.alignment, PKV_ERR_NOMEM) path is untouched and the .tmp removed.
 * The writer is not changed and may be written again. */
pkv_status pkv_gguf_writer_write(const pkv_gguf_writer *w, const char *path);
/* The same bytes into a new pkv_malloc buffer (*data, *size; pkv_free it).
 * On error *data and *size are unchanged. */
pkv_status pkv_gguf_writer_write_memory(const pkv_gguf_writer *w, void **data, size_t *size);

#endif /* PKV_MODEL_GGUF_H */
