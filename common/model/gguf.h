/* gguf.h - reader for GGUF v3 model files (also accepts v2).
 *
 * The file is mmapped read-only; tensor data pointers point into the map, so
 * nothing is copied. Every length, count and offset read from the file is
 * checked against the file size and against the limits below before use, so a
 * truncated or hostile file produces an error message, never a crash.
 *
 * Layout (little endian): magic "GGUF", u32 version, u64 n_tensors,
 * u64 n_kv, then n_kv key/value pairs, then n_tensors tensor infos
 * (name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset), then padding to
 * `general.alignment` (default 32), then the tensor data section. */
#ifndef SPECD_GGUF_H
#define SPECD_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/dtype.h"
#include "common/util/error.h"

/* Limits on what a file may declare; larger is treated as corruption. */
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_STRING (1u << 24)       /* bytes in one string */
#define GGUF_MAX_ARRAY (1u << 26)        /* elements in one array */
#define GGUF_MAX_DIMS 4

typedef enum gguf_type {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
} gguf_type;

/* A string inside the mapped file: NOT NUL-terminated. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    /* For scalars: the value (unsigned types and bool in u64, signed types
     * in i64, float32/float64 in f64). For GGUF_STRING: `str`. For
     * GGUF_ARRAY: arr_type, arr_len and arr_data (raw little-endian elements
     * in the map; for string arrays use gguf_get_arr_str or arr_strs; for
     * arrays of arrays arr_data points at the encoded nested arrays, each
     * "u32 type, u64 len, elements", already validated by the parser). */
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        gguf_str str;
    } v;
    gguf_type arr_type;
    uint64_t arr_len;
    const uint8_t *arr_data;
    const gguf_str *arr_strs; /* string arrays: decoded index, owned by file */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) length; unused dims are 1 */
    specd_dtype type;
    uint64_t offset; /* relative to the data section */
    uint64_t nbytes;
    const void *data; /* points into the map */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Opens and validates the whole header and tensor table. */
gguf_file *gguf_open(const char *path, specd_error *err);
/* Parses an in-memory image (used by the fuzz target; the buffer must
 * outlive the returned handle). */
gguf_file *gguf_open_memory(const void *buf, size_t len, specd_error *err);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);

/* File offset where the tensor data section starts (aligned). */
uint64_t gguf_data_offset(const gguf_file *f);

uint64_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i);
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
/* Element i of a string array; NULL if kv is not one or i is out of range. */
const gguf_str *gguf_get_arr_str(const gguf_kv *kv, uint64_t i);

/* Typed getters: return 0 on success, -1 with a message naming the key when
 * missing or of an incompatible type. Integer getters accept any integer
 * type whose value fits. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, specd_error *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, specd_error *err);
int gguf_get_bool(const gguf_file *f, const char *key, int *out, specd_error *err);
/* Returns a NUL-terminated copy the caller frees. */
char *gguf_get_str(const gguf_file *f, const char *key, specd_error *err);

uint64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

const char *gguf_type_name(gguf_type t);

#endif
