/* safetensors_write.h - writes .safetensors files (the format
 * common/model/safetensors.h reads): named F32/F16/BF16/I32 tensors and an
 * optional "__metadata__" map of strings.
 *
 * The header JSON is padded with spaces so the data section starts at a
 * multiple of 8 bytes, as the reference writer does; tensors follow in the
 * order given, back to back. The file is written under a temporary name in
 * the same directory, flushed to disk and renamed over `path`, so a reader
 * (or a crash) never sees half a file. */
#ifndef SPECD_SAFETENSORS_WRITE_H
#define SPECD_SAFETENSORS_WRITE_H

#include <stdint.h>

#include "common/util/dtype.h"
#include "common/util/error.h"
#include "common/model/safetensors.h"

typedef struct safetensors_out {
    const char *name;
    specd_dtype type; /* stored dtype: F32, F16, BF16 or I32 */
    uint32_t n_dims;  /* 0 .. SAFETENSORS_MAX_DIMS */
    uint64_t shape[SAFETENSORS_MAX_DIMS];
    /* Source values: float for F32/F16/BF16 (converted while writing, with
     * round-to-nearest-even), int32_t for I32. Any alignment of a float or
     * int32 array. */
    const void *data;
    /* 1: data already holds the stored dtype's little-endian bytes (e.g.
     * fp16 hidden states) and is written as is, with no conversion. */
    int raw;
} safetensors_out;

/* Writes n tensors and n_meta metadata pairs (distinct keys, values any
 * NUL-terminated UTF-8 string; n_meta 0 writes no "__metadata__"). -1 + a
 * message naming the path on a bad argument or I/O failure; a failed write
 * removes its temporary file and leaves `path` as it was. */
int safetensors_write(const char *path, const safetensors_out *tensors, int n,
                      const char *const *meta_keys, const char *const *meta_vals, int n_meta,
                      specd_error *err);

#endif
