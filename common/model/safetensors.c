/* safetensors.c - parses and validates a safetensors image (see
 * safetensors.h): the length-prefixed JSON header via cJSON, then every
 * tensor's dtype, shape and data_offsets against the data section. */
#include "common/model/safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/dtype.h"
#include "common/util/mmap_file.h"

/* JSON numbers are doubles: integers above 2^53 are not exact, so a shape or
 * offset beyond it cannot be trusted. */
#define MAX_JSON_INT 9007199254740992.0

struct safetensors_file {
    void *map; /* safetensors_open only */
    size_t map_len;
    safetensors_tensor *tensors;
    size_t n_tensors;
    const safetensors_tensor **by_name; /* sorted by name, for lookups */
    char **meta_keys, **meta_vals;       /* the string entries of "__metadata__" */
    size_t n_meta;
};

typedef struct dtype_name {
    const char *name;
    specd_dtype type;
} dtype_name;

static const dtype_name k_dtypes[] = {
    {"F32", SPECD_F32}, {"F16", SPECD_F16}, {"BF16", SPECD_BF16}, {"F64", SPECD_F64},
    {"I8", SPECD_I8},   {"I16", SPECD_I16}, {"I32", SPECD_I32},   {"I64", SPECD_I64},
};

static int parse_dtype(const char *s, specd_dtype *out) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (strcmp(s, k_dtypes[i].name) == 0) {
            *out = k_dtypes[i].type;
            return 0;
        }
    return -1;
}

/* A JSON number that is a whole number in 0..2^53. */
static int json_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return -1;
    double v = item->valuedouble;
    if (!(v >= 0 && v <= MAX_JSON_INT) || v != (double)(uint64_t)v) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_shape(const cJSON *entry, safetensors_tensor *t, specd_error *err) {
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    if (!cJSON_IsArray(shape))
        return specd_seterr(err, "safetensors: tensor '%s': \"shape\" is missing or not an array",
                            t->name);
    int n = cJSON_GetArraySize(shape);
    if (n > SAFETENSORS_MAX_DIMS)
        return specd_seterr(err, "safetensors: tensor '%s': %d dimensions (at most %d)", t->name,
                            n, SAFETENSORS_MAX_DIMS);
    t->n_dims = (uint32_t)n;
    t->numel = 1;
    uint32_t d = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        if (json_uint(dim, &t->shape[d]))
            return specd_seterr(err, "safetensors: tensor '%s': shape[%u] is not a non-negative "
                                     "integer", t->name, d);
        if (t->shape[d] && t->numel > UINT64_MAX / 16 / t->shape[d])
            return specd_seterr(err, "safetensors: tensor '%s': element count overflows",
                                t->name);
        t->numel *= t->shape[d];
        d++;
    }
    return 0;
}

static int parse_offsets(const cJSON *entry, safetensors_tensor *t, uint64_t data_size,
                         specd_error *err) {
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        json_uint(cJSON_GetArrayItem(offs, 0), &begin) ||
        json_uint(cJSON_GetArrayItem(offs, 1), &end))
        return specd_seterr(err, "safetensors: tensor '%s': \"data_offsets\" must be two "
                                 "non-negative integers", t->name);
    if (begin > end || end > data_size)
        return specd_seterr(err, "safetensors: tensor '%s': data_offsets [%llu, %llu] lie outside "
                                 "the data section (%llu bytes)", t->name,
                            (unsigned long long)begin, (unsigned long long)end,
                            (unsigned long long)data_size);
    int ok;
    uint64_t want = specd_dtype_nbytes(t->type, t->numel, &ok);
    /* numel < 2^60 (parse_shape) and elements are <= 8 bytes: ok is 1 */
    if (!ok || end - begin != want)
        return specd_seterr(err, "safetensors: tensor '%s': data_offsets span %llu bytes, shape "
                                 "and dtype imply %llu", t->name,
                            (unsigned long long)(end - begin), (unsigned long long)want);
    t->offset = begin;
    t->nbytes = want;
    return 0;
}

static int parse_tensor(const cJSON *entry, safetensors_tensor *t, const uint8_t *data,
                        uint64_t data_size, specd_error *err) {
    if (!cJSON_IsObject(entry))
        return specd_seterr(err, "safetensors: tensor '%s': entry is not a JSON object", t->name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    if (!cJSON_IsString(dtype))
        return specd_seterr(err, "safetensors: tensor '%s': \"dtype\" is missing or not a string",
                            t->name);
    if (parse_dtype(dtype->valuestring, &t->type))
        return specd_seterr(err, "safetensors: tensor '%s' has dtype '%.16s'; specd reads F32, "
                                 "F16 and BF16 (and F64, I8, I16, I32, I64)",
                            t->name, dtype->valuestring);
    if (parse_shape(entry, t, err) || parse_offsets(entry, t, data_size, err)) return -1;
    t->data = data + t->offset;
    return 0;
}

static int cmp_by_name(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a;
    const safetensors_tensor *y = *(const safetensors_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Sorts the lookup index; a JSON object may repeat a key, which cJSON keeps,
 * so duplicates show up as neighbours here. */
static int index_names(safetensors_file *f, specd_error *err) {
    f->by_name = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *f->by_name);
    if (!f->by_name) return specd_seterr(err, "safetensors: out of memory");
    for (size_t i = 0; i < f->n_tensors; i++) f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->n_tensors, sizeof *f->by_name, cmp_by_name);
    for (size_t i = 1; i < f->n_tensors; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            return specd_seterr(err, "safetensors: duplicate tensor name '%s'",
                                f->by_name[i]->name);
    return 0;
}

/* "__metadata__" is a map of strings by the format's definition; entries of
 * other types (some writers put numbers there) are skipped rather than
 * rejected. A repeated key is kept twice; lookups find the first. */
static int parse_metadata(safetensors_file *f, const cJSON *meta, specd_error *err) {
    if (!cJSON_IsObject(meta) || f->meta_keys) return 0;
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, meta) n++;
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_vals = calloc(n ? n : 1, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals) return specd_seterr(err, "safetensors: out of memory");
    cJSON_ArrayForEach(e, meta) {
        if (!cJSON_IsString(e)) continue;
        f->meta_keys[f->n_meta] = strdup(e->string);
        f->meta_vals[f->n_meta] = strdup(e->valuestring);
        f->n_meta++; /* counted before the check so close() frees a half pair */
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_vals[f->n_meta - 1])
            return specd_seterr(err, "safetensors: out of memory");
    }
    return 0;
}

static int parse_tensors(safetensors_file *f, const cJSON *root, const uint8_t *data,
                         uint64_t data_size, specd_error *err) {
    size_t n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) n++;
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) return specd_seterr(err, "safetensors: out of memory for %zu tensors", n);
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (parse_metadata(f, item, err)) return -1;
            continue;
        }
        safetensors_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(item->string);
        if (!t->name) return specd_seterr(err, "safetensors: out of memory");
        f->n_tensors++;
        if (parse_tensor(item, t, data, data_size, err)) return -1;
    }
    return index_names(f, err);
}

/* The JSON may be padded after its closing brace; only whitespace may follow. */
static int only_whitespace(const char *p, const char *end) {
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') return 0;
    return 1;
}

static int parse(safetensors_file *f, const uint8_t *buf, size_t len, specd_error *err) {
    if (len < 8)
        return specd_seterr(err, "safetensors: truncated: %zu bytes, no header length", len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > SAFETENSORS_MAX_HEADER)
        return specd_seterr(err, "safetensors: header length %llu exceeds the %u-byte limit",
                            (unsigned long long)hlen, SAFETENSORS_MAX_HEADER);
    if (hlen > len - 8)
        return specd_seterr(err, "safetensors: truncated: header of %llu bytes but only %zu "
                                 "bytes follow", (unsigned long long)hlen, len - 8);
    const char *json = (const char *)buf + 8, *json_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &json_end, 0);
    if (!root) {
        long at = json_end ? (long)(json_end - json) : -1;
        return specd_seterr(err, "safetensors: header is not valid JSON (error near byte %ld of "
                                 "%llu)", at, (unsigned long long)hlen);
    }
    int rc;
    if (!only_whitespace(json_end, json + hlen))
        rc = specd_seterr(err, "safetensors: header has trailing bytes after the JSON (at byte "
                               "%ld)", (long)(json_end - json));
    else if (!cJSON_IsObject(root))
        rc = specd_seterr(err, "safetensors: header is not a JSON object");
    else
        rc = parse_tensors(f, root, buf + 8 + hlen, len - 8 - hlen, err);
    cJSON_Delete(root);
    return rc;
}

safetensors_file *safetensors_open_memory(const void *buf, size_t len, specd_error *err) {
    safetensors_file *f = calloc(1, sizeof *f);
    if (!f) {
        specd_seterr(err, "safetensors: out of memory");
        return NULL;
    }
    if (parse(f, buf, len, err)) {
        safetensors_close(f);
        return NULL;
    }
    return f;
}

safetensors_file *safetensors_open(const char *path, specd_error *err) {
    void *map;
    size_t len;
    if (specd_map_file(path, &map, &len, err)) {
        specd_preferr(err, "safetensors");
        return NULL;
    }
    safetensors_file *f = safetensors_open_memory(map, len, err);
    if (!f) {
        specd_unmap_file(map, len);
        specd_preferr(err, "%s", path);
        return NULL;
    }
    f->map = map;
    f->map_len = len;
    return f;
}

void safetensors_close(safetensors_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    if (f->map) specd_unmap_file(f->map, f->map_len);
    free(f);
}

size_t safetensors_n_tensors(const safetensors_file *f) { return f->n_tensors; }

const safetensors_tensor *safetensors_tensor_at(const safetensors_file *f, size_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *safetensors_metadata(const safetensors_file *f, const char *key) {
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

float safetensors_elem_f32(const safetensors_tensor *t, size_t i) {
    uint16_t h;
    switch (t->type) {
    case SPECD_F16:
        memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
        return specd_fp16_to_f32(h);
    case SPECD_BF16:
        memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
        return specd_bf16_to_f32(h);
    default: {
        float f;
        memcpy(&f, (const uint8_t *)t->data + 4 * i, 4);
        return f;
    }
    }
}
