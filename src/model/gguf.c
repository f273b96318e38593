/* GGUF reader: map the file, validate all of its structure against the file
 * size once, then serve O(1) lookups from the mapping. */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_BYTES 24u
/* Smallest possible encodings, used to reject absurd counts before allocating:
 * a key-value pair is a key length (8) + value type (4) + a 1-byte value; a
 * tensor info is name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8). */
#define MIN_KV_BYTES 13u
#define MIN_TENSOR_INFO_BYTES 32u

typedef struct gguf_kv {
    size_t key_off;       /* into g->names, NUL-terminated */
    size_t key_len;
    pkv_gguf_type type;
    pkv_gguf_type arr_type; /* ARRAY only */
    uint64_t count;       /* ARRAY only */
    size_t val_off;       /* file offset of the value; ARRAY: of the first element */
    size_t str_first;     /* string ARRAY: index of element 0 in g->str_offs */
} gguf_kv;

typedef struct gguf_tensor {
    pkv_gguf_tensor t;
    size_t name_off;      /* into g->names */
    size_t name_len;
    uint64_t rel_offset;  /* as stored: relative to the data section */
} gguf_tensor;

struct pkv_gguf {
    char *label;
    const uint8_t *base; /* the file's bytes */
    size_t size;
    void *map;           /* mmap'ed region (size bytes) or NULL */
    void *owned;         /* pkv_malloc copy when mmap was not possible, or NULL */
    uint32_t version;
    size_t alignment;
    size_t data_off;

    gguf_kv *kvs;
    size_t n_kv, cap_kv;
    gguf_tensor *tensors;
    size_t n_tensors, cap_tensors;
    char *names;         /* keys and tensor names, each NUL-terminated */
    size_t names_len, names_cap;
    size_t *str_offs;    /* file offset of each string-array element's length prefix */
    size_t n_str, cap_str;
    int64_t *kv_index;   /* open-addressing hash: key -> kv index, -1 empty */
    size_t kv_index_cap; /* power of two */
    int64_t *t_index;    /* name -> tensor index */
    size_t t_index_cap;
};

/* ------------------------------------------------------------ small helpers */

/* ggml's names of tensor type ids, for messages about types pagekv lacks;
 * NULL: ids ggml removed. */
static const char *const k_ggml_names[] = {
    "f32", "f16", "q4_0", "q4_1", NULL, NULL, "q5_0", "q5_1", "q8_0", "q8_1",
    "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s",
    "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m",
    "bf16", NULL, NULL, NULL, "tq1_0", "tq2_0", NULL, NULL, NULL, "mxfp4",
    "nvfp4", "q1_0", "q2_0",
};

static const char *k_type_names[PKV_GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};
static const size_t k_type_sizes[PKV_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *pkv_gguf_type_name(pkv_gguf_type t) {
    return (unsigned)t < PKV_GGUF_TYPE_COUNT ? k_type_names[t] : "unknown";
}

size_t pkv_gguf_type_size(pkv_gguf_type t) {
    return (unsigned)t < PKV_GGUF_TYPE_COUNT ? k_type_sizes[t] : 0;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

/* "label: <message>" with PKV_ERR_FORMAT (or s). */
static pkv_status gerr(const pkv_gguf *g, pkv_status s, const char *fmt, ...) PKV_PRINTF(3, 4);
static pkv_status gerr(const pkv_gguf *g, pkv_status s, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pkv_err(s, "%s: %s", g->label, msg);
}

/* Printable excerpt of a name from the file (for messages about names that may
 * contain odd bytes). */
static const char *excerpt(const uint8_t *s, size_t n, char *buf, size_t cap) {
    size_t j = 0, i = 0;
    for (; i < n; i++) {
        unsigned c = s[i];
        bool plain = c >= 32 && c < 127 && c != '\'';
        if (j + (plain ? 1 : 4) + 4 > cap) break; /* keep room for "..." and the NUL */
        if (plain) buf[j++] = (char)c;
        else j += (size_t)snprintf(buf + j, cap - j, "\\x%02x", c);
    }
    if (i < n) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = 0;
    return buf;
}

static uint64_t name_hash(const char *s, size_t n) { return pkv_hash64(s, n, 0x67677566ull); }

static const char *kv_key(const pkv_gguf *g, const gguf_kv *kv) { return g->names + kv->key_off; }

/* A cursor over the file with the context of what is being read, for messages. */
typedef struct cursor {
    pkv_gguf *g;
    size_t pos;
    char ctx[192]; /* "key 'general.name'", "tensor #3" ... */
} cursor;

static pkv_status need(cursor *c, size_t n, const char *what) {
    if (n <= c->g->size - c->pos) return PKV_OK;
    return gerr(c->g, PKV_ERR_FORMAT,
                "truncated: %s: %s at offset %zu needs %zu bytes, but the file has only %zu bytes",
                c->ctx, what, c->pos, n, c->g->size);
}

static pkv_status take_u32(cursor *c, const char *what, uint32_t *v) {
    pkv_status s = need(c, 4, what);
    if (s) return s;
    *v = rd32(c->g->base + c->pos);
    c->pos += 4;
    return PKV_OK;
}

static pkv_status take_u64(cursor *c, const char *what, uint64_t *v) {
    pkv_status s = need(c, 8, what);
    if (s) return s;
    *v = rd64(c->g->base + c->pos);
    c->pos += 8;
    return PKV_OK;
}

/* A GGUF string: u64 length + bytes. Sets *off to the first byte. */
static pkv_status take_str(cursor *c, const char *what, size_t *off, size_t *len) {
    uint64_t n;
    size_t at = c->pos;
    pkv_status s = take_u64(c, what, &n);
    if (s) return s;
    if (n > c->g->size - c->pos)
        return gerr(c->g, PKV_ERR_FORMAT,
                    "%s: %s at offset %zu has length %llu, which runs past the end of the file "
                    "(%zu bytes)",
                    c->ctx, what, at, (unsigned long long)n, c->g->size);
    *off = c->pos;
    *len = (size_t)n;
    c->pos += (size_t)n;
    return PKV_OK;
}

/* Copy a name (key or tensor name) into the names arena; reject NUL bytes. */
static pkv_status add_name(cursor *c, size_t off, size_t len, const char *what, size_t *name_off) {
    pkv_gguf *g = c->g;
    if (memchr(g->base + off, 0, len))
        return gerr(g, PKV_ERR_FORMAT, "%s: %s at offset %zu contains a NUL byte", c->ctx, what, off);
    size_t need_bytes;
    if (!pkv_add_ok(g->names_len, len + 1, &need_bytes))
        return gerr(g, PKV_ERR_FORMAT, "%s: names too long", c->ctx);
    pkv_status s = pkv_grow((void **)&g->names, &g->names_cap, need_bytes, 1);
    if (s) return pkv_err_prefix(s, "%s", g->label);
    memcpy(g->names + g->names_len, g->base + off, len);
    g->names[g->names_len + len] = 0;
    *name_off = g->names_len;
    g->names_len = need_bytes;
    return PKV_OK;
}

/* -------------------------------------------------------------- parsing */

static pkv_status parse_header(pkv_gguf *g, uint64_t *n_tensors, uint64_t *n_kv) {
    if (g->size < 4)
        return gerr(g, PKV_ERR_FORMAT, "file is %zu bytes, too short for a GGUF header (%u bytes)",
                    g->size, HEADER_BYTES);
    if (memcmp(g->base, "GGUF", 4) != 0) {
        char buf[32];
        return gerr(g, PKV_ERR_FORMAT, "not a GGUF file: magic is '%s', expected 'GGUF'",
                    excerpt(g->base, 4, buf, sizeof buf));
    }
    if (g->size < HEADER_BYTES)
        return gerr(g, PKV_ERR_FORMAT,
                    "truncated header: the file has %zu bytes, a GGUF header needs %u", g->size,
                    HEADER_BYTES);
    uint32_t v = rd32(g->base + 4);
    if (v == 1)
        return gerr(g, PKV_ERR_FORMAT,
                    "GGUF version 1 is not supported (32-bit counts); expected version 2 or 3");
    if (v != 2 && v != 3) {
        if (v == 0x02000000u || v == 0x03000000u)
            return gerr(g, PKV_ERR_FORMAT,
                        "GGUF version %u looks like a big-endian file (version %u byte-swapped); "
                        "only little-endian files are supported",
                        v, v >> 24);
        return gerr(g, PKV_ERR_FORMAT, "unsupported GGUF version %u, expected 2 or 3", v);
    }
    g->version = v;
    *n_tensors = rd64(g->base + 8);
    *n_kv = rd64(g->base + 16);
    size_t rest = g->size - HEADER_BYTES;
    if (*n_kv > rest / MIN_KV_BYTES)
        return gerr(g, PKV_ERR_FORMAT,
                    "kv_count %llu is impossible: that many key-value pairs need at least %u bytes "
                    "each, but only %zu bytes follow the header",
                    (unsigned long long)*n_kv, MIN_KV_BYTES, rest);
    if (*n_tensors > rest / MIN_TENSOR_INFO_BYTES)
        return gerr(g, PKV_ERR_FORMAT,
                    "tensor_count %llu is impossible: that many tensor infos need at least %u "
                    "bytes each, but only %zu bytes follow the header",
                    (unsigned long long)*n_tensors, MIN_TENSOR_INFO_BYTES, rest);
    return PKV_OK;
}

/* The value of kv (whose type is already read), at c->pos. */
static pkv_status parse_value(cursor *c, gguf_kv *kv) {
    pkv_gguf *g = c->g;
    pkv_status s;
    kv->val_off = c->pos;
    if (kv->type == PKV_GGUF_STRING) {
        size_t off, len;
        return take_str(c, "string value", &off, &len);
    }
    if (kv->type != PKV_GGUF_ARRAY) {
        size_t n = pkv_gguf_type_size(kv->type);
        if ((s = need(c, n, "value"))) return s;
        if (kv->type == PKV_GGUF_BOOL && g->base[c->pos] > 1)
            return gerr(g, PKV_ERR_FORMAT, "%s: bool value at offset %zu is %u, expected 0 or 1",
                        c->ctx, c->pos, g->base[c->pos]);
        c->pos += n;
        return PKV_OK;
    }
    uint32_t et;
    if ((s = take_u32(c, "array element type", &et))) return s;
    if (et == PKV_GGUF_ARRAY)
        return gerr(g, PKV_ERR_FORMAT, "%s: arrays of arrays are not supported", c->ctx);
    if (et >= PKV_GGUF_TYPE_COUNT)
        return gerr(g, PKV_ERR_FORMAT, "%s: unknown array element type %u (valid: 0 to %d)",
                    c->ctx, et, PKV_GGUF_TYPE_COUNT - 1);
    kv->arr_type = (pkv_gguf_type)et;
    size_t count_at = c->pos;
    if ((s = take_u64(c, "array count", &kv->count))) return s;
    kv->val_off = c->pos;
    size_t rest = g->size - c->pos;
    if (kv->arr_type != PKV_GGUF_STRING) {
        size_t es = pkv_gguf_type_size(kv->arr_type);
        if (kv->count > rest / es)
            return gerr(g, PKV_ERR_FORMAT,
                        "%s: array of %llu %s at offset %zu needs %llu x %zu bytes, but the file "
                        "has only %zu bytes left",
                        c->ctx, (unsigned long long)kv->count, pkv_gguf_type_name(kv->arr_type),
                        count_at, (unsigned long long)kv->count, es, rest);
        size_t bytes = (size_t)kv->count * es;
        if (kv->arr_type == PKV_GGUF_BOOL)
            for (size_t i = 0; i < bytes; i++)
                if (g->base[c->pos + i] > 1)
                    return gerr(g, PKV_ERR_FORMAT,
                                "%s: bool array element %zu is %u, expected 0 or 1", c->ctx, i,
                                g->base[c->pos + i]);
        c->pos += bytes;
        return PKV_OK;
    }
    if (kv->count > rest / 8)
        return gerr(g, PKV_ERR_FORMAT,
                    "%s: array of %llu strings at offset %zu needs at least 8 bytes per string, "
                    "but the file has only %zu bytes left",
                    c->ctx, (unsigned long long)kv->count, count_at, rest);
    size_t cnt = (size_t)kv->count;
    kv->str_first = g->n_str;
    if ((s = pkv_grow((void **)&g->str_offs, &g->cap_str, g->n_str + cnt, sizeof(size_t))))
        return pkv_err_prefix(s, "%s: %s", g->label, c->ctx);
    for (size_t i = 0; i < cnt; i++) {
        size_t at = c->pos;
        if (8 > g->size - at)
            return gerr(g, PKV_ERR_FORMAT,
                        "truncated: %s: length of string %zu of %zu at offset %zu needs 8 bytes, "
                        "but the file has only %zu bytes",
                        c->ctx, i, cnt, at, g->size);
        uint64_t n = rd64(g->base + at);
        if (n > g->size - at - 8)
            return gerr(g, PKV_ERR_FORMAT,
                        "%s: string %zu of %zu at offset %zu has length %llu, which runs past the "
                        "end of the file (%zu bytes)",
                        c->ctx, i, cnt, at, (unsigned long long)n, g->size);
        g->str_offs[g->n_str++] = at;
        c->pos = at + 8 + (size_t)n;
    }
    return PKV_OK;
}

static pkv_status parse_kvs(pkv_gguf *g, cursor *c, uint64_t n_kv) {
    pkv_status s;
    if ((s = pkv_grow((void **)&g->kvs, &g->cap_kv, (size_t)n_kv, sizeof(gguf_kv))))
        return pkv_err_prefix(s, "%s", g->label);
    for (size_t i = 0; i < (size_t)n_kv; i++) {
        gguf_kv kv = {0};
        snprintf(c->ctx, sizeof c->ctx, "key-value pair #%zu", i);
        size_t off, len;
        if ((s = take_str(c, "key", &off, &len))) return s;
        if ((s = add_name(c, off, len, "key", &kv.key_off))) return s;
        kv.key_len = len;
        char ex[128];
        snprintf(c->ctx, sizeof c->ctx, "key '%s'", excerpt(g->base + off, len, ex, sizeof ex));
        uint32_t t;
        if ((s = take_u32(c, "value type", &t))) return s;
        if (t >= PKV_GGUF_TYPE_COUNT)
            return gerr(g, PKV_ERR_FORMAT, "%s: unknown value type %u at offset %zu (valid: 0 to %d)",
                        c->ctx, t, c->pos - 4, PKV_GGUF_TYPE_COUNT - 1);
        kv.type = (pkv_gguf_type)t;
        if ((s = parse_value(c, &kv))) return s;
        g->kvs[g->n_kv++] = kv;
    }
    return PKV_OK;
}

/* Build an open-addressing index over n names; rejects duplicates. */
static pkv_status build_index(pkv_gguf *g, bool tensors, int64_t **out, size_t *out_cap) {
    size_t n = tensors ? g->n_tensors : g->n_kv;
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    int64_t *idx = pkv_malloc(cap * sizeof *idx);
    if (!idx)
        return gerr(g, PKV_ERR_NOMEM, "cannot allocate the %s index (%zu entries)",
                    tensors ? "tensor" : "key", cap);
    for (size_t i = 0; i < cap; i++) idx[i] = -1;
    for (size_t i = 0; i < n; i++) {
        size_t off = tensors ? g->tensors[i].name_off : g->kvs[i].key_off;
        size_t len = tensors ? g->tensors[i].name_len : g->kvs[i].key_len;
        const char *name = g->names + off;
        size_t h = (size_t)name_hash(name, len) & (cap - 1);
        for (;; h = (h + 1) & (cap - 1)) {
            if (idx[h] < 0) {
                idx[h] = (int64_t)i;
                break;
            }
            size_t o = tensors ? g->tensors[idx[h]].name_off : g->kvs[idx[h]].key_off;
            if (strcmp(g->names + o, name) == 0) {
                long long first = (long long)idx[h];
                pkv_free(idx);
                return gerr(g, PKV_ERR_FORMAT, "duplicate %s '%s' (entries #%lld and #%zu)",
                            tensors ? "tensor name" : "key", name, first, i);
            }
        }
    }
    *out = idx;
    *out_cap = cap;
    return PKV_OK;
}

static int64_t index_find(const pkv_gguf *g, bool tensors, const char *name) {
    const int64_t *idx = tensors ? g->t_index : g->kv_index;
    size_t cap = tensors ? g->t_index_cap : g->kv_index_cap;
    if (!idx || !name) return -1;
    size_t len = strlen(name);
    for (size_t h = (size_t)name_hash(name, len) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (idx[h] < 0) return -1;
        size_t o = tensors ? g->tensors[idx[h]].name_off : g->kvs[idx[h]].key_off;
        if (strcmp(g->names + o, name) == 0) return idx[h];
    }
}

static pkv_status parse_alignment(pkv_gguf *g) {
    g->alignment = PKV_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = index_find(g, false, "general.alignment");
    if (i < 0) return PKV_OK;
    const gguf_kv *kv = &g->kvs[i];
    if (kv->type != PKV_GGUF_UINT32)
        return gerr(g, PKV_ERR_FORMAT, "key 'general.alignment' has type %s, expected uint32",
                    pkv_gguf_type_name(kv->type));
    uint32_t a = rd32(g->base + kv->val_off);
    if (a == 0 || (a & (a - 1)) != 0)
        return gerr(g, PKV_ERR_FORMAT,
                    "key 'general.alignment' is %u, expected a power of two (default 32)", a);
    g->alignment = a;
    return PKV_OK;
}

static pkv_status parse_tensor_info(pkv_gguf *g, cursor *c, size_t i) {
    gguf_tensor *gt = &g->tensors[i];
    pkv_gguf_tensor *t = &gt->t;
    pkv_status s;
    snprintf(c->ctx, sizeof c->ctx, "tensor #%zu", i);
    size_t off, len;
    if ((s = take_str(c, "name", &off, &len))) return s;
    if ((s = add_name(c, off, len, "name", &gt->name_off))) return s;
    gt->name_len = len;
    char ex[128];
    snprintf(c->ctx, sizeof c->ctx, "tensor '%s'", excerpt(g->base + off, len, ex, sizeof ex));
    if ((s = take_u32(c, "n_dims", &t->n_dims))) return s;
    if (t->n_dims < 1 || t->n_dims > PKV_GGUF_MAX_DIMS)
        return gerr(g, PKV_ERR_FORMAT, "%s: n_dims is %u, expected 1 to %d", c->ctx, t->n_dims,
                    PKV_GGUF_MAX_DIMS);
    uint64_t ne[PKV_GGUF_MAX_DIMS] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((s = take_u64(c, "dimension", &ne[d]))) return s;
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX)
            return gerr(g, PKV_ERR_FORMAT, "%s: dimension %u is %llu, expected 1 to 2^63-1",
                        c->ctx, d, (unsigned long long)ne[d]);
    }
    uint32_t type;
    if ((s = take_u32(c, "type", &type))) return s;
    if ((s = take_u64(c, "data offset", &gt->rel_offset))) return s;
    size_t bb = pkv_type_block_bytes((pkv_type)type), be = pkv_type_block_elems((pkv_type)type);
    if (bb == 0) {
        const char *gn = type < PKV_ARRAY_LEN(k_ggml_names) ? k_ggml_names[type] : NULL;
        return gerr(g, PKV_ERR_FORMAT,
                    "%s: unknown or unsupported tensor type %u%s%s%s (this build reads f32, f16, "
                    "bf16, i32, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k..q8_k, iq1_s, iq1_m, iq2_xxs, "
                    "iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_nl, iq4_xs, tq1_0, tq2_0, mxfp4)",
                    c->ctx, type, gn ? " (ggml " : "", gn ? gn : "", gn ? ")" : "");
    }
    t->type = (pkv_type)type;
    if (ne[0] % be != 0)
        return gerr(g, PKV_ERR_FORMAT,
                    "%s: row length ne[0] = %llu is not a multiple of the %s block size %zu",
                    c->ctx, (unsigned long long)ne[0], pkv_type_name(t->type), be);
    uint64_t n_el = 1;
    bool ok = true;
    size_t bytes = 0;
    for (int d = 0; d < PKV_GGUF_MAX_DIMS; d++) {
        if (ne[d] > UINT64_MAX / n_el) ok = false;
        else n_el *= ne[d];
        t->ne[d] = (int64_t)ne[d];
    }
    if (ok && n_el > (uint64_t)INT64_MAX) ok = false;
    if (ok && ne[0] > SIZE_MAX) ok = false;
    if (ok) {
        bytes = pkv_type_row_bytes(t->type, (size_t)ne[0]); /* 0 on overflow */
        ok = bytes != 0;
        for (int d = 1; d < PKV_GGUF_MAX_DIMS && ok; d++)
            ok = ne[d] <= SIZE_MAX && pkv_mul_ok(bytes, (size_t)ne[d], &bytes);
    }
    if (!ok)
        return gerr(g, PKV_ERR_FORMAT,
                    "%s: dims [%llu, %llu, %llu, %llu] overflow: the element count or byte size "
                    "does not fit in 64 bits",
                    c->ctx, (unsigned long long)ne[0], (unsigned long long)ne[1],
                    (unsigned long long)ne[2], (unsigned long long)ne[3]);
    t->n_elements = n_el;
    t->n_bytes = bytes;
    return PKV_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->rel_offset < y->rel_offset ? -1 : x->rel_offset > y->rel_offset;
}

/* Data placement: aligned, inside the file, no two tensors overlapping. */
static pkv_status check_tensor_data(pkv_gguf *g) {
    for (size_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *gt = &g->tensors[i];
        const char *name = g->names + gt->name_off;
        if (gt->rel_offset % g->alignment != 0)
            return gerr(g, PKV_ERR_FORMAT,
                        "tensor '%s': data offset %llu is not a multiple of the alignment %zu",
                        name, (unsigned long long)gt->rel_offset, g->alignment);
        size_t abs_off = 0, end = 0;
        bool ok = gt->rel_offset <= SIZE_MAX &&
                  pkv_add_ok(g->data_off, (size_t)gt->rel_offset, &abs_off) &&
                  pkv_add_ok(abs_off, gt->t.n_bytes, &end) && end <= g->size;
        if (!ok)
            return gerr(g, PKV_ERR_FORMAT,
                        "tensor '%s': data [offset %llu, +%zu) runs past the end of the file (%zu "
                        "bytes)",
                        name, (unsigned long long)g->data_off + gt->rel_offset, gt->t.n_bytes,
                        g->size);
        gt->t.file_offset = abs_off;
        gt->t.data = g->base + abs_off;
    }
    if (g->n_tensors < 2) return PKV_OK;
    gguf_tensor **order = pkv_malloc(g->n_tensors * sizeof *order);
    if (!order) return gerr(g, PKV_ERR_NOMEM, "cannot allocate %zu tensor pointers", g->n_tensors);
    for (size_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof *order, cmp_by_offset);
    pkv_status s = PKV_OK;
    for (size_t i = 1; i < g->n_tensors; i++) {
        const gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->t.file_offset + a->t.n_bytes > b->t.file_offset) {
            s = gerr(g, PKV_ERR_FORMAT,
                     "tensor '%s': data [offset %zu, +%zu) overlaps tensor '%s' at offset %zu",
                     g->names + a->name_off, a->t.file_offset, a->t.n_bytes,
                     g->names + b->name_off, b->t.file_offset);
            break;
        }
    }
    pkv_free(order);
    return s;
}

static pkv_status parse(pkv_gguf *g) {
    uint64_t n_tensors = 0, n_kv = 0;
    pkv_status s = parse_header(g, &n_tensors, &n_kv);
    if (s) return s;
    cursor c = {.g = g, .pos = HEADER_BYTES};
    if ((s = parse_kvs(g, &c, n_kv))) return s;
    if ((s = build_index(g, false, &g->kv_index, &g->kv_index_cap))) return s;
    if ((s = parse_alignment(g))) return s;
    size_t rest = g->size - c.pos;
    if (n_tensors > rest / MIN_TENSOR_INFO_BYTES)
        return gerr(g, PKV_ERR_FORMAT,
                    "tensor_count %llu is impossible: that many tensor infos need at least %u "
                    "bytes each, but only %zu bytes follow the key-value pairs",
                    (unsigned long long)n_tensors, MIN_TENSOR_INFO_BYTES, rest);
    if ((s = pkv_grow((void **)&g->tensors, &g->cap_tensors, (size_t)n_tensors, sizeof(gguf_tensor))))
        return pkv_err_prefix(s, "%s", g->label);
    for (size_t i = 0; i < (size_t)n_tensors; i++) {
        memset(&g->tensors[i], 0, sizeof g->tensors[i]);
        g->n_tensors = i + 1;
        if ((s = parse_tensor_info(g, &c, i))) return s;
    }
    if ((s = build_index(g, true, &g->t_index, &g->t_index_cap))) return s;
    /* The data section starts at the next multiple of the alignment. */
    size_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    if (!pkv_add_ok(c.pos, pad, &g->data_off)) g->data_off = SIZE_MAX;
    if ((s = check_tensor_data(g))) return s;
    /* A file without tensor data may end before the padding (llama.cpp reads such
     * files too): the data section is then empty at the end of the file, and
     * data_offset stays <= the file size (found by fuzz-gguf). */
    if (g->data_off > g->size) g->data_off = g->size;
    for (size_t i = 0; i < g->n_tensors; i++) g->tensors[i].t.name = g->names + g->tensors[i].name_off;
    return PKV_OK;
}

/* ------------------------------------------------------------ open/close */

static pkv_gguf *gguf_new(const char *label) {
    pkv_gguf *g = pkv_calloc(1, sizeof *g);
    if (!g) {
        pkv_err(PKV_ERR_NOMEM, "%s: cannot allocate the GGUF reader", label);
        return NULL;
    }
    g->label = pkv_strdup(label);
    if (!g->label) {
        pkv_free(g);
        pkv_err(PKV_ERR_NOMEM, "%s: cannot allocate the GGUF reader", label);
        return NULL;
    }
    return g;
}

void pkv_gguf_close(pkv_gguf *g) {
    if (!g) return;
    if (g->map) munmap(g->map, g->size);
    pkv_free(g->owned);
    pkv_free(g->kvs);
    pkv_free(g->tensors);
    pkv_free(g->names);
    pkv_free(g->str_offs);
    pkv_free(g->kv_index);
    pkv_free(g->t_index);
    pkv_free(g->label);
    pkv_free(g);
}

pkv_status pkv_gguf_read_memory(const void *data, size_t size, const char *label, pkv_gguf **out) {
    if (!label) label = "<memory>";
    if (!out || (!data && size)) return pkv_err(PKV_ERR_INVALID, "%s: NULL argument", label);
    pkv_gguf *g = gguf_new(label);
    if (!g) return PKV_ERR_NOMEM;
    g->base = data;
    g->size = size;
    pkv_status s = parse(g);
    if (s) {
        pkv_gguf_close(g);
        return s;
    }
    *out = g;
    return PKV_OK;
}

/* Read the whole file into pkv_malloc memory (when mmap is unavailable). */
static pkv_status read_all(pkv_gguf *g, int fd) {
    g->owned = pkv_malloc(g->size);
    if (!g->owned) return gerr(g, PKV_ERR_NOMEM, "cannot allocate %zu bytes to read the file", g->size);
    size_t done = 0;
    while (done < g->size) {
        ssize_t r = pread(fd, (uint8_t *)g->owned + done, g->size - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return gerr(g, PKV_ERR_IO, "read failed at offset %zu of %zu: %s", done, g->size,
                        r < 0 ? strerror(errno) : "unexpected end of file");
        done += (size_t)r;
    }
    g->base = g->owned;
    return PKV_OK;
}

pkv_status pkv_gguf_read(const char *path, pkv_gguf **out) {
    if (!path || !out) return pkv_err(PKV_ERR_INVALID, "pkv_gguf_read: NULL argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pkv_err(PKV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pkv_err(PKV_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pkv_err(PKV_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return pkv_err(PKV_ERR_IO, "%s: file of %lld bytes does not fit in memory", path,
                       (long long)st.st_size);
    }
    pkv_gguf *g = gguf_new(path);
    if (!g) {
        close(fd);
        return PKV_ERR_NOMEM;
    }
    g->size = (size_t)st.st_size;
    pkv_status s = PKV_OK;
    if (g->size > 0) {
        const char *no_mmap = getenv("PKV_GGUF_NO_MMAP"); /* test hook: force the read path */
        void *m = no_mmap && *no_mmap == '1'
                      ? MAP_FAILED
                      : mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            g->map = m;
            g->base = m;
        } else {
            s = read_all(g, fd);
        }
    } else {
        g->base = (const uint8_t *)"";
    }
    close(fd);
    if (!s) s = parse(g);
    if (s) {
        pkv_gguf_close(g);
        return s;
    }
    *out = g;
    return PKV_OK;
}

pkv_gguf *pkv_gguf_open(const char *path) {
    pkv_gguf *g = NULL;
    return pkv_gguf_read(path, &g) == PKV_OK ? g : NULL;
}

pkv_gguf *pkv_gguf_open_memory(const void *data, size_t size, const char *label) {
    pkv_gguf *g = NULL;
    return pkv_gguf_read_memory(data, size, label, &g) == PKV_OK ? g : NULL;
}

/* ------------------------------------------------------------ accessors */

const char *pkv_gguf_label(const pkv_gguf *g) { return g->label; }
uint32_t pkv_gguf_version(const pkv_gguf *g) { return g->version; }
size_t pkv_gguf_alignment(const pkv_gguf *g) { return g->alignment; }
size_t pkv_gguf_data_offset(const pkv_gguf *g) { return g->data_off; }
size_t pkv_gguf_file_size(const pkv_gguf *g) { return g->size; }
int64_t pkv_gguf_n_kv(const pkv_gguf *g) { return (int64_t)g->n_kv; }
int64_t pkv_gguf_n_tensors(const pkv_gguf *g) { return (int64_t)g->n_tensors; }

const char *pkv_gguf_kv_key(const pkv_gguf *g, int64_t i) {
    return i >= 0 && (size_t)i < g->n_kv ? kv_key(g, &g->kvs[i]) : NULL;
}

pkv_gguf_type pkv_gguf_kv_type(const pkv_gguf *g, int64_t i) {
    return i >= 0 && (size_t)i < g->n_kv ? g->kvs[i].type : PKV_GGUF_TYPE_COUNT;
}

int64_t pkv_gguf_find_key(const pkv_gguf *g, const char *key) { return index_find(g, false, key); }

/* The kv of key, or an error naming the key and, when the type is wrong, both types. */
static pkv_status lookup(const pkv_gguf *g, const char *key, pkv_gguf_type want, bool any_int,
                         bool any_float, const gguf_kv **out) {
    int64_t i = index_find(g, false, key);
    if (i < 0) return gerr(g, PKV_ERR_NOT_FOUND, "key '%s' not found", key ? key : "(null)");
    const gguf_kv *kv = &g->kvs[i];
    pkv_gguf_type t = kv->type;
    bool is_int = t <= PKV_GGUF_INT32 || t == PKV_GGUF_UINT64 || t == PKV_GGUF_INT64;
    bool is_float = t == PKV_GGUF_FLOAT32 || t == PKV_GGUF_FLOAT64;
    if (t != want && !(any_int && is_int) && !(any_float && is_float))
        return gerr(g, PKV_ERR_FORMAT, "key '%s' has type %s, expected %s%s", key,
                    pkv_gguf_type_name(t), any_int ? "an integer type like " : "",
                    pkv_gguf_type_name(want));
    *out = kv;
    return PKV_OK;
}

/* An integer scalar at p of type t as sign + magnitude. */
static void read_int(pkv_gguf_type t, const uint8_t *p, bool *neg, uint64_t *mag) {
    int64_t sv = 0;
    uint64_t uv = 0;
    bool is_signed = true;
    switch (t) {
    case PKV_GGUF_UINT8: case PKV_GGUF_BOOL: uv = p[0]; is_signed = false; break;
    case PKV_GGUF_INT8: sv = (int8_t)p[0]; break;
    case PKV_GGUF_UINT16: uv = rd16(p); is_signed = false; break;
    case PKV_GGUF_INT16: sv = (int16_t)rd16(p); break;
    case PKV_GGUF_UINT32: uv = rd32(p); is_signed = false; break;
    case PKV_GGUF_INT32: sv = (int32_t)rd32(p); break;
    case PKV_GGUF_UINT64: uv = rd64(p); is_signed = false; break;
    case PKV_GGUF_INT64: sv = (int64_t)rd64(p); break;
    default: is_signed = false; break;
    }
    if (is_signed) {
        *neg = sv < 0;
        *mag = sv < 0 ? (uint64_t)0 - (uint64_t)sv : (uint64_t)sv;
    } else {
        *neg = false;
        *mag = uv;
    }
}

pkv_status pkv_gguf_get_u32(const pkv_gguf *g, const char *key, uint32_t *out) {
    const gguf_kv *kv = NULL;
    pkv_status s = lookup(g, key, PKV_GGUF_UINT32, true, false, &kv);
    if (s) return s;
    bool neg;
    uint64_t m;
    read_int(kv->type, g->base + kv->val_off, &neg, &m);
    if (neg || m > UINT32_MAX)
        return gerr(g, PKV_ERR_FORMAT, "key '%s' is %s%llu (%s), which does not fit in uint32", key,
                    neg ? "-" : "", (unsigned long long)m, pkv_gguf_type_name(kv->type));
    *out = (uint32_t)m;
    return PKV_OK;
}

pkv_status pkv_gguf_get_i64(const pkv_gguf *g, const char *key, int64_t *out) {
    const gguf_kv *kv = NULL;
    pkv_status s = lookup(g, key, PKV_GGUF_INT64, true, false, &kv);
    if (s) return s;
    bool neg;
    uint64_t m;
    read_int(kv->type, g->base + kv->val_off, &neg, &m);
    if (!neg && m > (uint64_t)INT64_MAX)
        return gerr(g, PKV_ERR_FORMAT, "key '%s' is %llu (%s), which does not fit in int64", key,
                    (unsigned long long)m, pkv_gguf_type_name(kv->type));
    *out = neg ? (int64_t)(0 - m) : (int64_t)m;
    return PKV_OK;
}

static double read_float(pkv_gguf_type t, const uint8_t *p) {
    if (t == PKV_GGUF_FLOAT32) {
        uint32_t b = rd32(p);
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    uint64_t b = rd64(p);
    double d;
    memcpy(&d, &b, 8);
    return d;
}

pkv_status pkv_gguf_get_f32(const pkv_gguf *g, const char *key, float *out) {
    const gguf_kv *kv = NULL;
    pkv_status s = lookup(g, key, PKV_GGUF_FLOAT32, false, true, &kv);
    if (s) return s;
    *out = (float)read_float(kv->type, g->base + kv->val_off);
    return PKV_OK;
}

pkv_status pkv_gguf_get_bool(const pkv_gguf *g, const char *key, bool *out) {
    const gguf_kv *kv = NULL;
    pkv_status s = lookup(g, key, PKV_GGUF_BOOL, false, false, &kv);
    if (s) return s;
    *out = g->base[kv->val_off] != 0;
    return PKV_OK;
}

pkv_status pkv_gguf_get_str(const pkv_gguf *g, const char *key, const char **str, size_t *len) {
    const gguf_kv *kv = NULL;
    pkv_status s = lookup(g, key, PKV_GGUF_STRING, false, false, &kv);
    if (s) return s;
    *len = (size_t)rd64(g->base + kv->val_off);
    *str = (const char *)g->base + kv->val_off + 8;
    return PKV_OK;
}

pkv_status pkv_gguf_get_arr(const pkv_gguf *g, const char *key, pkv_gguf_type elem_type,
                            pkv_gguf_array *out) {
    const gguf_kv *kv = NULL;
    pkv_status s = lookup(g, key, PKV_GGUF_ARRAY, false, false, &kv);
    if (s) return s;
    if (elem_type != PKV_GGUF_TYPE_COUNT && kv->arr_type != elem_type)
        return gerr(g, PKV_ERR_FORMAT, "key '%s' is an array of %s, expected an array of %s", key,
                    pkv_gguf_type_name(kv->arr_type), pkv_gguf_type_name(elem_type));
    out->type = kv->arr_type;
    out->count = kv->count;
    out->data = g->base + kv->val_off;
    out->kv = kv - g->kvs;
    return PKV_OK;
}

pkv_status pkv_gguf_arr_str(const pkv_gguf *g, const pkv_gguf_array *a, uint64_t i, const char **s,
                            size_t *len) {
    if (!a || a->kv < 0 || (size_t)a->kv >= g->n_kv)
        return gerr(g, PKV_ERR_INVALID, "pkv_gguf_arr_str: not an array of this file");
    const gguf_kv *kv = &g->kvs[a->kv];
    if (kv->type != PKV_GGUF_ARRAY || kv->arr_type != PKV_GGUF_STRING)
        return gerr(g, PKV_ERR_INVALID, "key '%s' is not an array of strings", kv_key(g, kv));
    if (i >= kv->count)
        return gerr(g, PKV_ERR_INVALID, "key '%s': string index %llu out of range (%llu strings)",
                    kv_key(g, kv), (unsigned long long)i, (unsigned long long)kv->count);
    size_t at = g->str_offs[kv->str_first + (size_t)i];
    *len = (size_t)rd64(g->base + at);
    *s = (const char *)g->base + at + 8;
    return PKV_OK;
}

static bool numeric_elem(const pkv_gguf_array *a, uint64_t i) {
    return a && i < a->count && a->type < PKV_GGUF_TYPE_COUNT && a->type != PKV_GGUF_STRING &&
           a->type != PKV_GGUF_ARRAY;
}

int64_t pkv_gguf_arr_int(const pkv_gguf_array *a, uint64_t i) {
    if (!numeric_elem(a, i)) return 0;
    const uint8_t *p = (const uint8_t *)a->data + (size_t)i * pkv_gguf_type_size(a->type);
    if (a->type == PKV_GGUF_FLOAT32 || a->type == PKV_GGUF_FLOAT64) {
        double d = read_float(a->type, p);
        if (!(d == d)) return 0;
        if (d >= 9223372036854775807.0) return INT64_MAX;
        if (d <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    bool neg;
    uint64_t m;
    read_int(a->type, p, &neg, &m);
    if (neg) return (int64_t)(0 - m);
    return m > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)m;
}

double pkv_gguf_arr_float(const pkv_gguf_array *a, uint64_t i) {
    if (!numeric_elem(a, i)) return 0;
    const uint8_t *p = (const uint8_t *)a->data + (size_t)i * pkv_gguf_type_size(a->type);
    if (a->type == PKV_GGUF_FLOAT32 || a->type == PKV_GGUF_FLOAT64) return read_float(a->type, p);
    bool neg;
    uint64_t m;
    read_int(a->type, p, &neg, &m);
    return neg ? -(double)m : (double)m;
}

const pkv_gguf_tensor *pkv_gguf_tensor_at(const pkv_gguf *g, int64_t i) {
    return i >= 0 && (size_t)i < g->n_tensors ? &g->tensors[i].t : NULL;
}

const pkv_gguf_tensor *pkv_gguf_find_tensor(const pkv_gguf *g, const char *name) {
    int64_t i = index_find(g, true, name);
    return i < 0 ? NULL : &g->tensors[i].t;
}

pkv_status pkv_gguf_get_tensor(const pkv_gguf *g, const char *name, const pkv_gguf_tensor **out) {
    const pkv_gguf_tensor *t = pkv_gguf_find_tensor(g, name);
    if (!t) return gerr(g, PKV_ERR_NOT_FOUND, "tensor '%s' not found", name ? name : "(null)");
    *out = t;
    return PKV_OK;
}
