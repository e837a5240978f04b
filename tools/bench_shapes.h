/* bench_shapes.h - model shapes nobody ships in this repository, built in
 * memory for benchmarks (`specd bench --verify --shape llama2-7b`).
 *
 * A shape is a specd_model_file with real hyperparameters and a full tensor
 * table (GGUF names, GGUF shapes: ne[0] = input dimension) whose data
 * pointers are all NULL. A NULL tensor asks the backend to generate seeded
 * random values on the device (kernels/backend.h, prepare_weight), so a
 * 13.5 GB Llama-2-7B can be benchmarked without a file and without crossing
 * the host link. Backends that cannot (the CPU backend: its weights are the
 * mmapped file) refuse, and so does specd_model_validate (it wants data), so
 * the table is built to validate's shapes but never passed through it.
 *
 * The result is released with specd_model_close: it owns only the tensor
 * table (no mappings, no GGUF handle), which is what close frees first. */
#ifndef SPECD_BENCH_SHAPES_H
#define SPECD_BENCH_SHAPES_H

#include "common/util/error.h"
#include "common/model/model_file.h"

/* The names bench_shape_create knows, for usage text. */
#define SPECD_BENCH_SHAPE_NAMES "llama2-7b, smollm2-135m"

/* Builds the named shape; NULL + message for an unknown name or OOM. */
specd_model_file *bench_shape_create(const char *name, specd_error *err);

#endif
