/* GGUF writer: a builder that keeps encoded key-value pairs and copies of the
 * tensor data, and writes them as llama.cpp's converters do (version 3, data
 * section and every tensor padded to general.alignment). */
#include "model/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct wkv {
    char *key;
    uint8_t *val;  /* encoded: value type u32 + value, as in the file */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    pkv_type type;
    uint32_t n_dims;
    int64_t ne[PKV_GGUF_MAX_DIMS];
    uint8_t *data; /* size bytes; a copy */
    size_t size;
} wtensor;

struct pkv_gguf_writer {
    uint32_t version;
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
};

static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static bool host_is_le(void) {
    uint16_t x = 1;
    uint8_t b;
    memcpy(&b, &x, 1);
    return b == 1;
}

/* Store one fixed-size element from host order as little-endian. */
static void put_elem(uint8_t *dst, pkv_gguf_type t, const uint8_t *src) {
    size_t n = pkv_gguf_type_size(t);
    if (t == PKV_GGUF_BOOL) dst[0] = src[0] != 0;
    else if (host_is_le()) memcpy(dst, src, n);
    else for (size_t i = 0; i < n; i++) dst[i] = src[n - 1 - i];
}

pkv_gguf_writer *pkv_gguf_writer_create(void) {
    pkv_gguf_writer *w = pkv_calloc(1, sizeof *w);
    if (!w) {
        pkv_err(PKV_ERR_NOMEM, "cannot allocate a GGUF writer");
        return NULL;
    }
    w->version = 3;
    return w;
}

void pkv_gguf_writer_free(pkv_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        pkv_free(w->kvs[i].key);
        pkv_free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        pkv_free(w->tensors[i].name);
        pkv_free(w->tensors[i].data);
    }
    pkv_free(w->kvs);
    pkv_free(w->tensors);
    pkv_free(w);
}

pkv_status pkv_gguf_writer_set_version(pkv_gguf_writer *w, uint32_t version) {
    if (version != 2 && version != 3)
        return pkv_err(PKV_ERR_INVALID, "GGUF writer: version %u, expected 2 or 3", version);
    w->version = version;
    return PKV_OK;
}

static bool pow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }

pkv_status pkv_gguf_writer_set_alignment(pkv_gguf_writer *w, uint32_t alignment) {
    if (!pow2(alignment))
        return pkv_err(PKV_ERR_INVALID, "GGUF writer: alignment %u is not a power of two", alignment);
    return pkv_gguf_writer_add_u32(w, "general.alignment", alignment);
}

static pkv_status check_key(const char *key) {
    if (!key || !*key) return pkv_err(PKV_ERR_INVALID, "GGUF writer: empty or NULL key");
    return PKV_OK;
}

/* Take ownership of val (val_len bytes, encoded) under key: replace or append.
 * On error val is freed and the writer unchanged. */
static pkv_status set_kv(pkv_gguf_writer *w, const char *key, uint8_t *val, size_t val_len) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0) {
            pkv_free(w->kvs[i].val);
            w->kvs[i].val = val;
            w->kvs[i].val_len = val_len;
            return PKV_OK;
        }
    pkv_status s = pkv_grow((void **)&w->kvs, &w->cap_kv, w->n_kv + 1, sizeof(wkv));
    char *k = s ? NULL : pkv_strdup(key);
    if (!k) {
        pkv_free(val);
        return s ? pkv_err_prefix(s, "GGUF writer: key '%s'", key)
                 : pkv_err(PKV_ERR_NOMEM, "GGUF writer: key '%s': out of memory", key);
    }
    w->kvs[w->n_kv++] = (wkv){k, val, val_len};
    return PKV_OK;
}

static uint8_t *alloc_val(const char *key, size_t n) {
    uint8_t *v = pkv_malloc(n);
    if (!v) pkv_err(PKV_ERR_NOMEM, "GGUF writer: key '%s': cannot allocate %zu bytes", key, n);
    return v;
}

pkv_status pkv_gguf_writer_add(pkv_gguf_writer *w, const char *key, pkv_gguf_type type,
                               const void *value) {
    pkv_status s = check_key(key);
    if (s) return s;
    size_t n = pkv_gguf_type_size(type);
    if (n == 0 || !value)
        return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': type %s (%d) is not a fixed-size type",
                       key, pkv_gguf_type_name(type), (int)type);
    uint8_t *v = alloc_val(key, 4 + n);
    if (!v) return PKV_ERR_NOMEM;
    wr32(v, (uint32_t)type);
    put_elem(v + 4, type, value);
    return set_kv(w, key, v, 4 + n);
}

pkv_status pkv_gguf_writer_add_u32(pkv_gguf_writer *w, const char *key, uint32_t v) {
    return pkv_gguf_writer_add(w, key, PKV_GGUF_UINT32, &v);
}
pkv_status pkv_gguf_writer_add_i32(pkv_gguf_writer *w, const char *key, int32_t v) {
    return pkv_gguf_writer_add(w, key, PKV_GGUF_INT32, &v);
}
pkv_status pkv_gguf_writer_add_u64(pkv_gguf_writer *w, const char *key, uint64_t v) {
    return pkv_gguf_writer_add(w, key, PKV_GGUF_UINT64, &v);
}
pkv_status pkv_gguf_writer_add_f32(pkv_gguf_writer *w, const char *key, float v) {
    return pkv_gguf_writer_add(w, key, PKV_GGUF_FLOAT32, &v);
}
pkv_status pkv_gguf_writer_add_bool(pkv_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v;
    return pkv_gguf_writer_add(w, key, PKV_GGUF_BOOL, &b);
}

pkv_status pkv_gguf_writer_add_str(pkv_gguf_writer *w, const char *key, const char *str) {
    pkv_status s = check_key(key);
    if (s) return s;
    if (!str) return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': NULL string", key);
    size_t len = strlen(str);
    if (len > SIZE_MAX - 12) return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': string too long", key);
    uint8_t *v = alloc_val(key, 12 + len);
    if (!v) return PKV_ERR_NOMEM;
    wr32(v, PKV_GGUF_STRING);
    wr64(v + 4, len);
    memcpy(v + 12, str, len);
    return set_kv(w, key, v, 12 + len);
}

pkv_status pkv_gguf_writer_add_arr(pkv_gguf_writer *w, const char *key, pkv_gguf_type elem_type,
                                   const void *elems, uint64_t count) {
    pkv_status s = check_key(key);
    if (s) return s;
    size_t es = pkv_gguf_type_size(elem_type), bytes, total;
    if (es == 0)
        return pkv_err(PKV_ERR_INVALID,
                       "GGUF writer: key '%s': arrays of %s need pkv_gguf_writer_add_arr_str or are "
                       "not supported",
                       key, pkv_gguf_type_name(elem_type));
    if (count > SIZE_MAX || !pkv_mul_ok((size_t)count, es, &bytes) || !pkv_add_ok(bytes, 16, &total))
        return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': array of %llu elements is too large",
                       key, (unsigned long long)count);
    if (count && !elems) return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': NULL elements", key);
    uint8_t *v = alloc_val(key, total);
    if (!v) return PKV_ERR_NOMEM;
    wr32(v, PKV_GGUF_ARRAY);
    wr32(v + 4, (uint32_t)elem_type);
    wr64(v + 8, count);
    for (size_t i = 0; i < (size_t)count; i++)
        put_elem(v + 16 + i * es, elem_type, (const uint8_t *)elems + i * es);
    return set_kv(w, key, v, total);
}

pkv_status pkv_gguf_writer_add_arr_str(pkv_gguf_writer *w, const char *key,
                                       const char *const *strs, const size_t *lens, uint64_t count) {
    pkv_status s = check_key(key);
    if (s) return s;
    if (count && !strs) return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': NULL strings", key);
    size_t total = 16;
    bool ok = count <= SIZE_MAX;
    for (size_t i = 0; ok && i < (size_t)count; i++) {
        if (!strs[i]) return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': string %zu is NULL", key, i);
        size_t len = lens ? lens[i] : strlen(strs[i]);
        ok = pkv_add_ok(total, 8, &total) && pkv_add_ok(total, len, &total);
    }
    if (!ok)
        return pkv_err(PKV_ERR_INVALID, "GGUF writer: key '%s': array of %llu strings is too large",
                       key, (unsigned long long)count);
    uint8_t *v = alloc_val(key, total);
    if (!v) return PKV_ERR_NOMEM;
    wr32(v, PKV_GGUF_ARRAY);
    wr32(v + 4, PKV_GGUF_STRING);
    wr64(v + 8, count);
    size_t pos = 16;
    for (size_t i = 0; i < (size_t)count; i++) {
        size_t len = lens ? lens[i] : strlen(strs[i]);
        wr64(v + pos, len);
        memcpy(v + pos + 8, strs[i], len);
        pos += 8 + len;
    }
    return set_kv(w, key, v, total);
}

pkv_status pkv_gguf_writer_add_tensor(pkv_gguf_writer *w, const char *name, pkv_type type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      size_t size) {
    if (!name || !*name) return pkv_err(PKV_ERR_INVALID, "GGUF writer: empty or NULL tensor name");
    if (strlen(name) > PKV_GGUF_MAX_TENSOR_NAME)
        return pkv_err(PKV_ERR_INVALID,
                       "GGUF writer: tensor '%s': name is %zu bytes, at most %d are allowed", name,
                       strlen(name), PKV_GGUF_MAX_TENSOR_NAME);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return pkv_err(PKV_ERR_INVALID, "GGUF writer: tensor '%s' was already added", name);
    if (pkv_type_block_bytes(type) == 0)
        return pkv_err(PKV_ERR_INVALID, "GGUF writer: tensor '%s': unknown type %d", name, (int)type);
    if (n_dims < 1 || n_dims > PKV_GGUF_MAX_DIMS || !ne)
        return pkv_err(PKV_ERR_INVALID, "GGUF writer: tensor '%s': n_dims %u, expected 1 to %d", name,
                       n_dims, PKV_GGUF_MAX_DIMS);
    wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return pkv_err(PKV_ERR_INVALID, "GGUF writer: tensor '%s': ne[%u] = %lld, expected >= 1",
                           name, d, (long long)ne[d]);
        t.ne[d] = ne[d];
    }
    size_t bytes = 0;
    bool ok = (uint64_t)t.ne[0] <= SIZE_MAX &&
              (bytes = pkv_type_row_bytes(type, (size_t)t.ne[0])) != 0;
    if (!ok)
        return pkv_err(PKV_ERR_INVALID,
                       "GGUF writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block "
                       "size %zu",
                       name, (long long)t.ne[0], pkv_type_name(type), pkv_type_block_elems(type));
    for (int d = 1; d < PKV_GGUF_MAX_DIMS && ok; d++)
        ok = (uint64_t)t.ne[d] <= SIZE_MAX && pkv_mul_ok(bytes, (size_t)t.ne[d], &bytes);
    if (!ok) return pkv_err(PKV_ERR_INVALID, "GGUF writer: tensor '%s': size overflows", name);
    if (size != bytes)
        return pkv_err(PKV_ERR_INVALID,
                       "GGUF writer: tensor '%s': %s [%lld, %lld, %lld, %lld] is %zu bytes, got %zu",
                       name, pkv_type_name(type), (long long)t.ne[0], (long long)t.ne[1],
                       (long long)t.ne[2], (long long)t.ne[3], bytes, size);
    pkv_status s = pkv_grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1, sizeof(wtensor));
    if (s) return pkv_err_prefix(s, "GGUF writer: tensor '%s'", name);
    t.name = pkv_strdup(name);
    t.data = pkv_malloc(size);
    if (!t.name || !t.data) {
        pkv_free(t.name);
        pkv_free(t.data);
        return pkv_err(PKV_ERR_NOMEM, "GGUF writer: tensor '%s': cannot allocate %zu bytes", name, size);
    }
    if (data) memcpy(t.data, data, size);
    else memset(t.data, 0, size);
    t.size = size;
    w->tensors[w->n_tensors++] = t;
    return PKV_OK;
}

/* ------------------------------------------------------------ output */

/* Output to a FILE or to a preallocated buffer. */
typedef struct sink {
    FILE *f;
    uint8_t *buf;
    size_t pos;
    bool failed;
} sink;

static void emit(sink *o, const void *p, size_t n) {
    if (o->failed || n == 0) return;
    if (o->f) {
        if (fwrite(p, 1, n, o->f) != n) o->failed = true;
    } else {
        memcpy(o->buf + o->pos, p, n);
    }
    o->pos += n;
}

static void emit_u32(sink *o, uint32_t v) {
    uint8_t b[4];
    wr32(b, v);
    emit(o, b, 4);
}
static void emit_u64(sink *o, uint64_t v) {
    uint8_t b[8];
    wr64(b, v);
    emit(o, b, 8);
}
static void emit_str(sink *o, const char *s) {
    size_t n = strlen(s);
    emit_u64(o, n);
    emit(o, s, n);
}
static void emit_zeros(sink *o, size_t n) {
    static const uint8_t z[256];
    while (n) {
        size_t k = PKV_MIN(n, sizeof z);
        emit(o, z, k);
        n -= k;
    }
}

static size_t pad_to(size_t x, size_t a) { return (a - x % a) % a; }

/* The alignment stored in general.alignment, or the default. */
static pkv_status writer_alignment(const pkv_gguf_writer *w, size_t *out) {
    *out = PKV_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0) continue;
        const uint8_t *v = w->kvs[i].val;
        uint32_t t = (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 | (uint32_t)v[3] << 24;
        uint32_t a = (uint32_t)v[4] | (uint32_t)v[5] << 8 | (uint32_t)v[6] << 16 | (uint32_t)v[7] << 24;
        if (t != PKV_GGUF_UINT32 || !pow2(a))
            return pkv_err(PKV_ERR_INVALID,
                           "GGUF writer: general.alignment must be a uint32 power of two (type %s)",
                           pkv_gguf_type_name((pkv_gguf_type)t));
        *out = a;
    }
    return PKV_OK;
}

/* Write everything; returns the total size in *total (also when o only counts). */
static void emit_all(const pkv_gguf_writer *w, size_t align, sink *o) {
    emit(o, "GGUF", 4);
    emit_u32(o, w->version);
    emit_u64(o, w->n_tensors);
    emit_u64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        emit_str(o, w->kvs[i].key);
        emit(o, w->kvs[i].val, w->kvs[i].val_len);
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        emit_str(o, t->name);
        emit_u32(o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) emit_u64(o, (uint64_t)t->ne[d]);
        emit_u32(o, (uint32_t)t->type);
        emit_u64(o, off);
        off += t->size + pad_to(t->size, align);
    }
    emit_zeros(o, pad_to(o->pos, align));
    for (size_t i = 0; i < w->n_tensors; i++) {
        emit(o, w->tensors[i].data, w->tensors[i].size);
        emit_zeros(o, pad_to(w->tensors[i].size, align));
    }
}

/* Total file size, with overflow checks (the emitters then cannot overflow). */
static pkv_status total_size(const pkv_gguf_writer *w, size_t align, size_t *out) {
    size_t n = 24;
    bool ok = true;
    for (size_t i = 0; i < w->n_kv && ok; i++)
        ok = pkv_add_ok(n, 8 + strlen(w->kvs[i].key), &n) && pkv_add_ok(n, w->kvs[i].val_len, &n);
    for (size_t i = 0; i < w->n_tensors && ok; i++)
        ok = pkv_add_ok(n, 8 + strlen(w->tensors[i].name) + 4 + 8 * w->tensors[i].n_dims + 12, &n);
    ok = ok && pkv_add_ok(n, pad_to(n, align), &n);
    for (size_t i = 0; i < w->n_tensors && ok; i++)
        ok = pkv_add_ok(n, w->tensors[i].size, &n) &&
             pkv_add_ok(n, pad_to(w->tensors[i].size, align), &n);
    if (!ok) return pkv_err(PKV_ERR_INVALID, "GGUF writer: the file would be larger than SIZE_MAX");
    *out = n;
    return PKV_OK;
}

pkv_status pkv_gguf_writer_write_memory(const pkv_gguf_writer *w, void **data, size_t *size) {
    size_t align, n;
    pkv_status s = writer_alignment(w, &align);
    if (!s) s = total_size(w, align, &n);
    if (s) return s;
    uint8_t *buf = pkv_malloc(n);
    if (!buf) return pkv_err(PKV_ERR_NOMEM, "GGUF writer: cannot allocate %zu bytes", n);
    sink o = {.buf = buf};
    emit_all(w, align, &o);
    PKV_CHECK_INTERNAL(o.pos == n);
    *data = buf;
    *size = n;
    return PKV_OK;
}

pkv_status pkv_gguf_writer_write(const pkv_gguf_writer *w, const char *path) {
    size_t align, n;
    pkv_status s = writer_alignment(w, &align);
    if (!s) s = total_size(w, align, &n);
    if (s) return s;
    pkv_wfile wf;
    if ((s = pkv_wfile_open(&wf, path))) return s;
    sink o = {.f = wf.f};
    emit_all(w, align, &o);
    if (o.failed || o.pos != n) {
        s = pkv_err(PKV_ERR_IO, "%s: write failed: %s", path, strerror(o.failed && errno ? errno : EIO));
        pkv_wfile_abort(&wf);
        return s;
    }
    return pkv_wfile_commit(&wf);
}

pkv_status pkv_gguf_writer_copy_kv_as(pkv_gguf_writer *w, const pkv_gguf *g, int64_t i, const char *as) {
    const char *key = pkv_gguf_kv_key(g, i);
    pkv_gguf_type t = pkv_gguf_kv_type(g, i);
    pkv_status s;
    if (t == PKV_GGUF_STRING) {
        const char *v;
        size_t n;
        if ((s = pkv_gguf_get_str(g, key, &v, &n))) return s;
        char *z = pkv_malloc(n + 1);
        if (!z) return pkv_err(PKV_ERR_NOMEM, "GGUF writer: key %s", key);
        memcpy(z, v, n);
        z[n] = 0;
        s = pkv_gguf_writer_add_str(w, as, z);
        pkv_free(z);
        return s;
    }
    if (t == PKV_GGUF_ARRAY) {
        pkv_gguf_array a;
        if ((s = pkv_gguf_get_arr(g, key, PKV_GGUF_TYPE_COUNT, &a))) return s;
        if (a.type != PKV_GGUF_STRING) return pkv_gguf_writer_add_arr(w, as, a.type, a.data, a.count);
        const char **strs = pkv_malloc((size_t)(a.count ? a.count : 1) * sizeof *strs);
        size_t *lens = pkv_malloc((size_t)(a.count ? a.count : 1) * sizeof *lens);
        s = strs && lens ? PKV_OK : pkv_err(PKV_ERR_NOMEM, "GGUF writer: key %s", key);
        for (uint64_t k = 0; !s && k < a.count; k++) s = pkv_gguf_arr_str(g, &a, k, &strs[k], &lens[k]);
        if (!s) s = pkv_gguf_writer_add_arr_str(w, as, strs, lens, a.count);
        pkv_free(strs);
        pkv_free(lens);
        return s;
    }
    /* a scalar: its bytes follow the type in the file; re-read it through the typed getters */
    uint8_t buf[8];
    int64_t iv = 0;
    float fv = 0;
    bool bv = false;
    switch (t) {
    case PKV_GGUF_FLOAT32:
    case PKV_GGUF_FLOAT64:
        if ((s = pkv_gguf_get_f32(g, key, &fv))) return s;
        return pkv_gguf_writer_add_f32(w, as, fv);
    case PKV_GGUF_BOOL:
        if ((s = pkv_gguf_get_bool(g, key, &bv))) return s;
        return pkv_gguf_writer_add_bool(w, as, bv);
    default:
        if ((s = pkv_gguf_get_i64(g, key, &iv))) return s;
        memcpy(buf, &iv, sizeof buf); /* little-endian: the low bytes are the narrower value */
        return pkv_gguf_writer_add(w, as, t, buf);
    }
}

pkv_status pkv_gguf_writer_copy_kv(pkv_gguf_writer *w, const pkv_gguf *g, int64_t i) {
    return pkv_gguf_writer_copy_kv_as(w, g, i, pkv_gguf_kv_key(g, i));
}
