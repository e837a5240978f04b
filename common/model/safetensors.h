/* safetensors.h - reader for Hugging Face .safetensors files.
 *
 * Layout: u64 little-endian header length N, then N bytes of JSON
 *   {"name": {"dtype": "F16", "shape": [out, in], "data_offsets": [b, e]},
 *    ..., "__metadata__": {...}}
 * then the data section; offsets are relative to its start. Shapes are
 * row-major (shape[0] is the outermost dimension), the reverse of GGUF's ne.
 *
 * The file is mmapped read-only and tensor data points into the map. The
 * header is validated whole: JSON shape, dtype, every offset inside the data
 * section and every byte size equal to numel * element size, so a hostile
 * file produces an error message, never a crash. Data pointers are only as
 * aligned as the writer made them (the reference writer pads the header to a
 * multiple of 8), so consumers should not assume more than byte alignment. */
#ifndef SPECD_SAFETENSORS_H
#define SPECD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/dtype.h"
#include "common/util/error.h"

#define SAFETENSORS_MAX_HEADER (100u << 20) /* bytes of JSON; larger = corrupt */
#define SAFETENSORS_MAX_DIMS 8

typedef struct safetensors_tensor {
    char *name;       /* NUL-terminated, owned by the file handle */
    specd_dtype type; /* F32, F16, BF16, F64, I8, I16, I32 or I64 */
    uint32_t n_dims;  /* 0 (a scalar) .. SAFETENSORS_MAX_DIMS */
    uint64_t shape[SAFETENSORS_MAX_DIMS]; /* as stored: shape[0] outermost */
    uint64_t numel;
    uint64_t offset;  /* relative to the data section */
    uint64_t nbytes;
    const void *data; /* into the map (or the caller's buffer) */
} safetensors_tensor;

typedef struct safetensors_file safetensors_file;

/* mmaps and validates a file. */
safetensors_file *safetensors_open(const char *path, specd_error *err);
/* Parses an in-memory image; the buffer must outlive the handle (the tensor
 * data pointers point into it). Used by the HF loader over its own maps and
 * by the fuzz target. */
safetensors_file *safetensors_open_memory(const void *buf, size_t len, specd_error *err);
void safetensors_close(safetensors_file *f);

size_t safetensors_n_tensors(const safetensors_file *f);
/* Tensors in header order. */
const safetensors_tensor *safetensors_tensor_at(const safetensors_file *f, size_t i);
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);
/* The value of a string entry of "__metadata__", NULL if absent (or not a
 * string). Owned by the handle. */
const char *safetensors_metadata(const safetensors_file *f, const char *key);

/* Element i of a float tensor (F32, F16 or BF16) as fp32. Safetensors data
 * is only byte-aligned, so it is copied, never cast. */
float safetensors_elem_f32(const safetensors_tensor *t, size_t i);

#endif
