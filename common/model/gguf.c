/* gguf.c - GGUF reader: parses and validates the header, metadata and tensor
 * table of a GGUF v2/v3 image that lies whole in memory (an mmapped file or a
 * caller's buffer). See gguf.h for the layout.
 *
 * The parser is written for hostile input: every read goes through a cursor
 * that checks the bytes left, every count is compared with the bytes it
 * needs at minimum and with the GGUF_MAX_* limits before anything is
 * allocated, and every error says what was being read and at which offset.
 * Keys and tensor names are indexed in hash tables, which both rejects
 * duplicates in linear time and makes lookups O(1). */
#include "common/model/gguf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/mmap_file.h"

#define GGUF_DEFAULT_ALIGNMENT 32
/* Nested arrays are legal GGUF; a bound on the depth keeps the recursion
 * that skips them from exhausting the stack on a crafted file. */
#define GGUF_MAX_NESTING 8
/* Alignments beyond this would only ever be a corrupt value. */
#define GGUF_MAX_ALIGNMENT (1u << 24)

/* Smallest encodings, used to bound counts by the bytes actually left:
 * a key/value is a key length (8) + type (4) + at least one value byte; a
 * tensor info is a name length (8) + n_dims (4) + one ne (8) + type (4) +
 * offset (8); an array element of strings is a length (8); of arrays, a
 * type (4) + a length (8). */
#define MIN_KV_BYTES 13u
#define MIN_TENSOR_INFO_BYTES 32u
#define MIN_STRING_BYTES 8u
#define MIN_ARRAY_BYTES 12u

/* Open-addressing hash set of item indices, keyed by the gguf_str that every
 * indexed item (gguf_kv, gguf_tensor) holds as its first member. */
typedef struct name_index {
    uint32_t *slots; /* item index + 1; 0 = empty */
    uint64_t mask;
} name_index;

struct gguf_file {
    const uint8_t *buf;
    uint64_t size;
    void *map; /* gguf_open only: the mmap to undo on close */
    size_t map_len;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    gguf_kv *kvs;
    name_index kv_index;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    name_index tensor_index;
};

/* Bounds-checked little-endian cursor. `what` describes the item being read
 * so that a truncation message can name it. */
typedef struct reader {
    const uint8_t *buf;
    uint64_t size;
    uint64_t off;
    specd_error *err;
    char what[160];
} reader;

/* ---- names and hashing -------------------------------------------------- */

/* Copies a file string into `out` for an error message: at most 64 bytes,
 * unprintable bytes replaced, so a hostile name cannot garble the terminal
 * or the message. */
static const char *preview(gguf_str s, char *out, size_t cap) {
    size_t n = s.len < 64 ? (size_t)s.len : 64;
    if (n > cap - 4) n = cap - 4;
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        out[i] = (c >= 32 && c < 127) ? (char)c : '?';
    }
    if (s.len > n) out[i++] = '.', out[i++] = '.', out[i++] = '.';
    out[i] = 0;
    return out;
}

static uint64_t hash_bytes(const char *p, uint64_t len) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int str_eq(gguf_str a, const char *p, uint64_t len) {
    return a.len == len && (len == 0 || memcmp(a.ptr, p, len) == 0);
}

static const gguf_str *item_name(const void *items, size_t stride, uint32_t i) {
    return (const gguf_str *)((const char *)items + (size_t)i * stride);
}

static int index_init(name_index *ix, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1; /* load factor <= 1/2 */
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : -1;
}

/* Returns the index of the item named (p, len), or -1. */
static int64_t index_find(const name_index *ix, const void *items, size_t stride, const char *p,
                          uint64_t len) {
    if (!ix->slots) return -1;
    for (uint64_t h = hash_bytes(p, len) & ix->mask;; h = (h + 1) & ix->mask) {
        uint32_t s = ix->slots[h];
        if (!s) return -1;
        if (str_eq(*item_name(items, stride, s - 1), p, len)) return s - 1;
    }
}

/* Adds item i; returns -1 if an item of the same name is already there. */
static int index_add(name_index *ix, const void *items, size_t stride, uint32_t i) {
    const gguf_str *name = item_name(items, stride, i);
    for (uint64_t h = hash_bytes(name->ptr, name->len) & ix->mask;; h = (h + 1) & ix->mask) {
        uint32_t s = ix->slots[h];
        if (!s) {
            ix->slots[h] = i + 1;
            return 0;
        }
        if (str_eq(*item_name(items, stride, s - 1), name->ptr, name->len)) return -1;
    }
}

/* ---- the cursor ---------------------------------------------------------- */

static int need(reader *r, uint64_t n) {
    if (n <= r->size - r->off) return 0;
    return specd_seterr(r->err, "gguf: truncated at offset %llu reading %s",
                        (unsigned long long)r->off, r->what);
}

static uint64_t load_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd_u32(reader *r, uint32_t *v) {
    if (need(r, 4)) return -1;
    *v = (uint32_t)load_le(r->buf + r->off, 4);
    r->off += 4;
    return 0;
}

static int rd_u64(reader *r, uint64_t *v) {
    if (need(r, 8)) return -1;
    *v = load_le(r->buf + r->off, 8);
    r->off += 8;
    return 0;
}

static int rd_str(reader *r, gguf_str *s) {
    uint64_t start = r->off, len;
    if (rd_u64(r, &len)) return -1;
    if (len > GGUF_MAX_STRING)
        return specd_seterr(r->err,
                            "gguf: string of %llu bytes at offset %llu (reading %s) exceeds the "
                            "%u-byte limit",
                            (unsigned long long)len, (unsigned long long)start, r->what,
                            GGUF_MAX_STRING);
    if (need(r, len)) return -1;
    s->ptr = (const char *)r->buf + r->off;
    s->len = len;
    r->off += len;
    return 0;
}

/* ---- values --------------------------------------------------------------- */

static int type_valid(uint32_t t) { return t <= GGUF_FLOAT64; }

/* Encoded size of a fixed-size value; 0 for strings and arrays. */
static uint32_t scalar_size(gguf_type t) {
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static void decode_scalar(gguf_type t, const uint8_t *p, gguf_kv *kv) {
    uint64_t raw = load_le(p, (int)scalar_size(t));
    switch (t) {
    case GGUF_INT8: kv->v.i64 = (int8_t)raw; break;
    case GGUF_INT16: kv->v.i64 = (int16_t)raw; break;
    case GGUF_INT32: kv->v.i64 = (int32_t)raw; break;
    case GGUF_INT64: kv->v.i64 = (int64_t)raw; break;
    case GGUF_BOOL: kv->v.u64 = raw != 0; break;
    case GGUF_FLOAT32: {
        uint32_t bits = (uint32_t)raw;
        float f;
        memcpy(&f, &bits, 4);
        kv->v.f64 = f;
        break;
    }
    case GGUF_FLOAT64: memcpy(&kv->v.f64, &raw, 8); break;
    default: kv->v.u64 = raw; break;
    }
}

/* Reads an array header and checks its element type and length against the
 * limit and against the bytes left (each element takes `min` bytes at least). */
static int rd_array_header(reader *r, uint32_t *type, uint64_t *len) {
    uint64_t start = r->off;
    if (rd_u32(r, type) || rd_u64(r, len)) return -1;
    if (!type_valid(*type))
        return specd_seterr(r->err, "gguf: %s: array at offset %llu has unknown element type %u",
                            r->what, (unsigned long long)start, *type);
    if (*len > GGUF_MAX_ARRAY)
        return specd_seterr(r->err,
                            "gguf: %s: array of %llu elements at offset %llu exceeds the limit "
                            "of %u",
                            r->what, (unsigned long long)*len, (unsigned long long)start,
                            GGUF_MAX_ARRAY);
    uint64_t min = scalar_size(*type);
    if (*type == GGUF_STRING) min = MIN_STRING_BYTES;
    if (*type == GGUF_ARRAY) min = MIN_ARRAY_BYTES;
    if (*len > (r->size - r->off) / min)
        return specd_seterr(r->err,
                            "gguf: truncated at offset %llu reading %s: array of %llu elements "
                            "needs at least %llu bytes, %llu left",
                            (unsigned long long)r->off, r->what, (unsigned long long)*len,
                            (unsigned long long)(*len * min),
                            (unsigned long long)(r->size - r->off));
    return 0;
}

/* Skips (validating) one array value whose header starts at the cursor. */
static int skip_array(reader *r, int depth) {
    if (depth > GGUF_MAX_NESTING)
        return specd_seterr(r->err, "gguf: %s: arrays nested deeper than %d at offset %llu",
                            r->what, GGUF_MAX_NESTING, (unsigned long long)r->off);
    uint32_t type;
    uint64_t len;
    if (rd_array_header(r, &type, &len)) return -1;
    if (type == GGUF_STRING) {
        gguf_str s;
        for (uint64_t i = 0; i < len; i++)
            if (rd_str(r, &s)) return -1;
    } else if (type == GGUF_ARRAY) {
        for (uint64_t i = 0; i < len; i++)
            if (skip_array(r, depth + 1)) return -1;
    } else {
        r->off += len * scalar_size(type); /* checked by rd_array_header */
    }
    return 0;
}

/* Reads a top-level array value into kv; string arrays get an index. */
static int rd_array(reader *r, gguf_kv *kv) {
    uint32_t type;
    uint64_t len;
    if (rd_array_header(r, &type, &len)) return -1;
    kv->arr_type = (gguf_type)type;
    kv->arr_len = len;
    kv->arr_data = r->buf + r->off;
    if (type == GGUF_STRING) {
        gguf_str *strs = calloc(len ? len : 1, sizeof *strs);
        if (!strs) return specd_seterr(r->err, "gguf: out of memory indexing %s", r->what);
        kv->arr_strs = strs; /* owned by kv from here, freed on close */
        for (uint64_t i = 0; i < len; i++)
            if (rd_str(r, &strs[i])) return -1;
    } else if (type == GGUF_ARRAY) {
        for (uint64_t i = 0; i < len; i++)
            if (skip_array(r, 1)) return -1;
    } else {
        r->off += len * scalar_size(type);
    }
    return 0;
}

static int rd_value(reader *r, gguf_kv *kv) {
    if (kv->type == GGUF_STRING) return rd_str(r, &kv->v.str);
    if (kv->type == GGUF_ARRAY) return rd_array(r, kv);
    uint32_t n = scalar_size(kv->type);
    if (need(r, n)) return -1;
    decode_scalar(kv->type, r->buf + r->off, kv);
    r->off += n;
    return 0;
}

/* ---- header, metadata, tensor table ------------------------------------- */

static int parse_header(reader *r, gguf_file *f, uint64_t *n_tensors, uint64_t *n_kv) {
    snprintf(r->what, sizeof r->what, "the header");
    if (need(r, 4)) return -1;
    if (memcmp(r->buf, "GGUF", 4) != 0) return specd_seterr(r->err, "gguf: bad magic (not a GGUF file)");
    r->off = 4;
    if (rd_u32(r, &f->version)) return -1;
    if (f->version == 1)
        return specd_seterr(r->err, "gguf: version 1 files are not supported (re-convert the model)");
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0)
            return specd_seterr(r->err, "gguf: version %u looks byte-swapped; big-endian GGUF "
                                        "files are not supported", f->version);
        return specd_seterr(r->err, "gguf: unsupported version %u (expected 2 or 3)", f->version);
    }
    if (rd_u64(r, n_tensors) || rd_u64(r, n_kv)) return -1;
    if (*n_tensors > GGUF_MAX_TENSORS)
        return specd_seterr(r->err, "gguf: tensor count %llu exceeds the limit of %u",
                            (unsigned long long)*n_tensors, GGUF_MAX_TENSORS);
    if (*n_kv > GGUF_MAX_KV)
        return specd_seterr(r->err, "gguf: key/value count %llu exceeds the limit of %u",
                            (unsigned long long)*n_kv, GGUF_MAX_KV);
    uint64_t left = r->size - r->off;
    if (*n_kv > left / MIN_KV_BYTES ||
        *n_tensors > (left - *n_kv * MIN_KV_BYTES) / MIN_TENSOR_INFO_BYTES)
        return specd_seterr(r->err,
                            "gguf: truncated: header declares %llu keys and %llu tensors but "
                            "only %llu bytes follow",
                            (unsigned long long)*n_kv, (unsigned long long)*n_tensors,
                            (unsigned long long)left);
    return 0;
}

static int parse_kvs(reader *r, gguf_file *f, uint64_t n_kv) {
    f->kvs = calloc(n_kv ? n_kv : 1, sizeof *f->kvs);
    if (!f->kvs || index_init(&f->kv_index, n_kv))
        return specd_seterr(r->err, "gguf: out of memory for %llu keys", (unsigned long long)n_kv);
    char name[80];
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &f->kvs[i];
        f->n_kv = i + 1; /* so close() frees this kv's string index on error */
        snprintf(r->what, sizeof r->what, "key #%llu", (unsigned long long)i);
        if (rd_str(r, &kv->key)) return -1;
        if (kv->key.len == 0)
            return specd_seterr(r->err, "gguf: key #%llu at offset %llu has an empty name",
                                (unsigned long long)i, (unsigned long long)(r->off - 8));
        preview(kv->key, name, sizeof name);
        snprintf(r->what, sizeof r->what, "key #%llu '%s'", (unsigned long long)i, name);
        if (index_add(&f->kv_index, f->kvs, sizeof *f->kvs, (uint32_t)i))
            return specd_seterr(r->err, "gguf: duplicate key '%s' (key #%llu)", name,
                                (unsigned long long)i);
        uint32_t type;
        if (rd_u32(r, &type)) return -1;
        if (!type_valid(type))
            return specd_seterr(r->err, "gguf: key '%s' has unknown value type %u", name, type);
        kv->type = (gguf_type)type;
        if (rd_value(r, kv)) return -1;
    }
    return 0;
}

static int set_alignment(reader *r, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv) return 0;
    uint32_t a;
    if (gguf_get_u32(f, "general.alignment", &a, r->err)) return -1;
    if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
        return specd_seterr(r->err, "gguf: general.alignment = %u is not a power of two in 1..%u",
                            a, GGUF_MAX_ALIGNMENT);
    f->alignment = a;
    return 0;
}

static int parse_tensor_shape(reader *r, gguf_tensor *t, const char *name) {
    if (rd_u32(r, &t->n_dims)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return specd_seterr(r->err, "gguf: tensor '%s': n_dims %u is not in 1..%d", name,
                            t->n_dims, GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        if (rd_u64(r, &t->ne[d])) return -1;
        if (t->ne[d] == 0)
            return specd_seterr(r->err, "gguf: tensor '%s': dimension %u is 0", name, d);
        /* INT64_MAX, not UINT64_MAX: element counts get signed use downstream */
        if (t->ne[d] > (uint64_t)INT64_MAX / n_elems)
            return specd_seterr(r->err, "gguf: tensor '%s': element count overflows", name);
        n_elems *= t->ne[d];
    }
    uint32_t type;
    if (rd_u32(r, &type)) return -1;
    const specd_dtype_info *info = specd_dtype_get(type);
    if (!info) return specd_seterr(r->err, "gguf: tensor '%s': unknown type %u", name, type);
    t->type = (specd_dtype)type;
    if (t->ne[0] % info->block_elems)
        return specd_seterr(r->err,
                            "gguf: tensor '%s': row length %llu is not a multiple of the %s block "
                            "size %u",
                            name, (unsigned long long)t->ne[0], info->name, info->block_elems);
    int ok;
    t->nbytes = specd_dtype_nbytes(t->type, n_elems, &ok);
    if (!ok) return specd_seterr(r->err, "gguf: tensor '%s': byte size overflows", name);
    return 0;
}

static int parse_tensor_infos(reader *r, gguf_file *f, uint64_t n_tensors) {
    if (n_tensors > (r->size - r->off) / MIN_TENSOR_INFO_BYTES)
        return specd_seterr(r->err,
                            "gguf: truncated at offset %llu: %llu tensor infos need at least "
                            "%llu bytes, %llu left",
                            (unsigned long long)r->off, (unsigned long long)n_tensors,
                            (unsigned long long)(n_tensors * MIN_TENSOR_INFO_BYTES),
                            (unsigned long long)(r->size - r->off));
    f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *f->tensors);
    if (!f->tensors || index_init(&f->tensor_index, n_tensors))
        return specd_seterr(r->err, "gguf: out of memory for %llu tensors",
                            (unsigned long long)n_tensors);
    char name[80];
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        snprintf(r->what, sizeof r->what, "tensor #%llu", (unsigned long long)i);
        if (rd_str(r, &t->name)) return -1;
        if (t->name.len == 0)
            return specd_seterr(r->err, "gguf: tensor #%llu has an empty name",
                                (unsigned long long)i);
        preview(t->name, name, sizeof name);
        snprintf(r->what, sizeof r->what, "tensor #%llu '%s'", (unsigned long long)i, name);
        if (index_add(&f->tensor_index, f->tensors, sizeof *f->tensors, (uint32_t)i))
            return specd_seterr(r->err, "gguf: duplicate tensor name '%s' (tensor #%llu)", name,
                                (unsigned long long)i);
        if (parse_tensor_shape(r, t, name) || rd_u64(r, &t->offset)) return -1;
        if (t->offset % f->alignment)
            return specd_seterr(r->err,
                                "gguf: tensor '%s': offset %llu is not a multiple of the "
                                "alignment %llu",
                                name, (unsigned long long)t->offset,
                                (unsigned long long)f->alignment);
        f->n_tensors = i + 1;
    }
    return 0;
}

/* The data section starts at the first aligned offset after the tensor
 * table; every tensor must lie wholly inside the file. */
static int place_tensor_data(reader *r, gguf_file *f) {
    uint64_t pad = (f->alignment - r->off % f->alignment) % f->alignment;
    f->data_offset = r->off + pad; /* off <= size < 2^63: cannot overflow */
    if (f->n_tensors && f->data_offset > r->size)
        return specd_seterr(r->err,
                            "gguf: truncated: data section at offset %llu is past the end of the "
                            "file (%llu bytes)",
                            (unsigned long long)f->data_offset, (unsigned long long)r->size);
    uint64_t data_size = f->data_offset <= r->size ? r->size - f->data_offset : 0;
    char name[80];
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return specd_seterr(r->err,
                                "gguf: tensor '%s': data at offset %llu + %llu bytes lies outside "
                                "the data section (%llu bytes at file offset %llu)",
                                preview(t->name, name, sizeof name),
                                (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                                (unsigned long long)data_size,
                                (unsigned long long)f->data_offset);
        t->data = r->buf + f->data_offset + t->offset;
    }
    return 0;
}

static int parse(gguf_file *f, specd_error *err) {
    reader r = {.buf = f->buf, .size = f->size, .err = err};
    uint64_t n_tensors = 0, n_kv = 0;
    if (parse_header(&r, f, &n_tensors, &n_kv) || parse_kvs(&r, f, n_kv) ||
        set_alignment(&r, f) || parse_tensor_infos(&r, f, n_tensors) ||
        place_tensor_data(&r, f))
        return -1;
    return 0;
}

/* ---- opening and closing ------------------------------------------------ */

gguf_file *gguf_open_memory(const void *buf, size_t len, specd_error *err) {
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        specd_seterr(err, "gguf: out of memory");
        return NULL;
    }
    f->buf = buf;
    f->size = len;
    if (!buf && len) {
        specd_seterr(err, "gguf: NULL buffer");
        free(f);
        return NULL;
    }
    if (parse(f, err)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open(const char *path, specd_error *err) {
    void *map;
    size_t len;
    if (specd_map_file(path, &map, &len, err)) {
        specd_preferr(err, "gguf");
        return NULL;
    }
    gguf_file *f = gguf_open_memory(map, len, err);
    if (!f) {
        specd_unmap_file(map, len);
        specd_preferr(err, "%s", path);
        return NULL;
    }
    f->map = map;
    f->map_len = len;
    return f;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (uint64_t i = 0; i < f->n_kv; i++) free((void *)f->kvs[i].arr_strs);
    free(f->kvs);
    free(f->kv_index.slots);
    free(f->tensors);
    free(f->tensor_index.slots);
    if (f->map) specd_unmap_file(f->map, f->map_len);
    free(f);
}

/* ---- accessors ----------------------------------------------------------- */

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
uint64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
uint64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i) {
    return i < f->n_kv ? &f->kvs[i] : NULL;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    int64_t i = index_find(&f->kv_index, f->kvs, sizeof *f->kvs, key, strlen(key));
    return i < 0 ? NULL : &f->kvs[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int64_t i = index_find(&f->tensor_index, f->tensors, sizeof *f->tensors, name, strlen(name));
    return i < 0 ? NULL : &f->tensors[i];
}

const gguf_str *gguf_get_arr_str(const gguf_kv *kv, uint64_t i) {
    if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || i >= kv->arr_len) return NULL;
    return &kv->arr_strs[i];
}

static const gguf_kv *find_or_err(const gguf_file *f, const char *key, specd_error *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) specd_seterr(err, "gguf: key '%s' not found", key);
    return kv;
}

static int wrong_type(const gguf_kv *kv, const char *key, const char *expected,
                      specd_error *err) {
    return specd_seterr(err, "gguf: key '%s' has type %s, expected %s", key,
                        gguf_type_name(kv->type), expected);
}

static int is_unsigned(gguf_type t) {
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static int is_signed(gguf_type t) {
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, specd_error *err) {
    const gguf_kv *kv = find_or_err(f, key, err);
    if (!kv) return -1;
    if (is_unsigned(kv->type)) {
        if (kv->v.u64 > UINT32_MAX)
            return specd_seterr(err, "gguf: key '%s' = %llu does not fit in 32 bits", key,
                                (unsigned long long)kv->v.u64);
        *out = (uint32_t)kv->v.u64;
        return 0;
    }
    if (is_signed(kv->type)) {
        if (kv->v.i64 < 0 || kv->v.i64 > (int64_t)UINT32_MAX)
            return specd_seterr(err, "gguf: key '%s' = %lld is not in 0..%u", key,
                                (long long)kv->v.i64, UINT32_MAX);
        *out = (uint32_t)kv->v.i64;
        return 0;
    }
    return wrong_type(kv, key, "an integer", err);
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, specd_error *err) {
    const gguf_kv *kv = find_or_err(f, key, err);
    if (!kv) return -1;
    if (kv->type == GGUF_FLOAT32 || kv->type == GGUF_FLOAT64)
        *out = (float)kv->v.f64;
    else if (is_unsigned(kv->type))
        *out = (float)kv->v.u64;
    else if (is_signed(kv->type))
        *out = (float)kv->v.i64;
    else
        return wrong_type(kv, key, "a number", err);
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, specd_error *err) {
    const gguf_kv *kv = find_or_err(f, key, err);
    if (!kv) return -1;
    if (kv->type != GGUF_BOOL) return wrong_type(kv, key, "bool", err);
    *out = kv->v.u64 != 0;
    return 0;
}

char *gguf_get_str(const gguf_file *f, const char *key, specd_error *err) {
    const gguf_kv *kv = find_or_err(f, key, err);
    if (!kv) return NULL;
    if (kv->type != GGUF_STRING) {
        wrong_type(kv, key, "string", err);
        return NULL;
    }
    char *s = malloc(kv->v.str.len + 1);
    if (!s) {
        specd_seterr(err, "gguf: out of memory copying key '%s'", key);
        return NULL;
    }
    if (kv->v.str.len) memcpy(s, kv->v.str.ptr, kv->v.str.len);
    s[kv->v.str.len] = 0;
    return s;
}

const char *gguf_type_name(gguf_type t) {
    static const char *const names[] = {
        [GGUF_UINT8] = "uint8",   [GGUF_INT8] = "int8",       [GGUF_UINT16] = "uint16",
        [GGUF_INT16] = "int16",   [GGUF_UINT32] = "uint32",   [GGUF_INT32] = "int32",
        [GGUF_FLOAT32] = "float32", [GGUF_BOOL] = "bool",     [GGUF_STRING] = "string",
        [GGUF_ARRAY] = "array",   [GGUF_UINT64] = "uint64",   [GGUF_INT64] = "int64",
        [GGUF_FLOAT64] = "float64",
    };
    return (unsigned)t <= GGUF_FLOAT64 ? names[t] : "unknown";
}
