/* safetensors_write.c - see safetensors_write.h. The header is built with
 * cJSON (which escapes names and metadata), then the tensors are streamed
 * out, half-precision ones converted through a small buffer so no second
 * copy of a large tensor is ever held. Values are written in host byte
 * order: specd, like the reader, assumes a little-endian machine. */
#include "common/model/safetensors_write.h"
#include "common/util/small_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONVERT_CHUNK 65536 /* elements converted per fwrite */

static int out_elem_size(specd_dtype t) {
    switch (t) {
    case SPECD_F32:
    case SPECD_I32: return 4;
    case SPECD_F16:
    case SPECD_BF16: return 2;
    default: return 0;
    }
}

static const char *out_dtype_name(specd_dtype t) {
    switch (t) {
    case SPECD_F32: return "F32";
    case SPECD_F16: return "F16";
    case SPECD_BF16: return "BF16";
    default: return "I32";
    }
}

/* The header JSON, padded with spaces to a multiple of 8 bytes. */
static char *build_header(const safetensors_out *t, int n, const char *const *keys,
                          const char *const *vals, int n_meta, size_t *hlen, specd_error *err) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && n_meta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int i = 0; ok && i < n_meta; i++)
            ok = cJSON_AddStringToObject(meta, keys[i], vals[i]) != NULL;
    }
    uint64_t offset = 0;
    for (int i = 0; ok && i < n; i++) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < t[i].n_dims; d++) numel *= t[i].shape[d];
        uint64_t end = offset + numel * (uint64_t)out_elem_size(t[i].type);
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        ok = e && shape && offs && cJSON_AddStringToObject(e, "dtype", out_dtype_name(t[i].type));
        for (uint32_t d = 0; ok && d < t[i].n_dims; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end));
        offset = end;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) {
        specd_seterr(err, "out of memory building the header");
        return NULL;
    }
    size_t len = strlen(json), padded = (len + 7) & ~(size_t)7;
    char *h = realloc(json, padded + 1);
    if (!h) {
        free(json);
        specd_seterr(err, "out of memory building the header");
        return NULL;
    }
    memset(h + len, ' ', padded - len);
    h[padded] = 0;
    *hlen = padded;
    return h;
}

static int write_tensor(FILE *f, const safetensors_out *t) {
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) numel *= t->shape[d];
    if (t->raw || t->type == SPECD_F32 || t->type == SPECD_I32) {
        size_t size = (size_t)out_elem_size(t->type);
        return fwrite(t->data, size, numel, f) == numel ? 0 : -1;
    }
    uint16_t buf[CONVERT_CHUNK];
    const float *src = t->data;
    for (uint64_t i = 0; i < numel;) {
        size_t k = numel - i < CONVERT_CHUNK ? (size_t)(numel - i) : CONVERT_CHUNK;
        for (size_t j = 0; j < k; j++) {
            float v;
            memcpy(&v, src + i + j, sizeof v); /* callers may pass unaligned data */
            buf[j] = t->type == SPECD_F16 ? specd_f32_to_fp16(v) : specd_f32_to_bf16(v);
        }
        if (fwrite(buf, 2, k, f) != k) return -1;
        i += k;
    }
    return 0;
}

static int check_args(const safetensors_out *t, int n, const char *const *keys, int n_meta,
                      specd_error *err) {
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || !strcmp(t[i].name, "__metadata__"))
            return specd_seterr(err, "tensor %d has no usable name", i);
        if (!out_elem_size(t[i].type))
            return specd_seterr(err, "tensor '%s': dtype must be F32, F16, BF16 or I32",
                                t[i].name);
        if (t[i].n_dims > SAFETENSORS_MAX_DIMS)
            return specd_seterr(err, "tensor '%s': %u dimensions (at most %d)", t[i].name,
                                t[i].n_dims, SAFETENSORS_MAX_DIMS);
        for (int j = 0; j < i; j++)
            if (!strcmp(t[i].name, t[j].name))
                return specd_seterr(err, "duplicate tensor name '%s'", t[i].name);
    }
    for (int i = 0; i < n_meta; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(keys[i], keys[j]))
                return specd_seterr(err, "duplicate metadata key '%s'", keys[i]);
    return 0;
}

int safetensors_write(const char *path, const safetensors_out *tensors, int n,
                      const char *const *meta_keys, const char *const *meta_vals, int n_meta,
                      specd_error *err) {
    if (check_args(tensors, n, meta_keys, n_meta, err)) return specd_preferr(err, "%s", path);
    size_t hlen;
    char *header = build_header(tensors, n, meta_keys, meta_vals, n_meta, &hlen, err);
    if (!header) return specd_preferr(err, "%s", path);

    char tmp[SPECD_ATOMIC_TMP_MAX];
    FILE *f = specd_atomic_open(path, tmp, err);
    if (!f) {
        free(header);
        return -1;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int bad = fwrite(len8, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen;
    free(header);
    for (int i = 0; !bad && i < n; i++) bad = write_tensor(f, &tensors[i]);
    return specd_atomic_commit(f, tmp, path, bad, err);
}
