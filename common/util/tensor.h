/* tensor.h - one weight as it lies in a model file: name, on-disk type,
 * GGUF-order shape (ne[0] is the row length) and where its bytes are.
 * The model readers (common/model/model_file.h) fill these; the compute
 * backends (kernels/backend.h) take them, and need nothing else of the
 * model layer, so the type lives down here. */
#ifndef SPECD_TENSOR_H
#define SPECD_TENSOR_H

#include <stdint.h>

#include "common/util/dtype.h"

typedef struct specd_tensor {
    char name[96];      /* canonical (GGUF) name */
    specd_dtype type;
    uint32_t n_dims;
    uint64_t ne[4];     /* ne[0] = contiguous length; unused dims are 1 */
    const void *data;   /* in the mmapped file */
    uint64_t nbytes;
} specd_tensor;

#endif
