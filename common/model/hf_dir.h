/* hf_dir.h - the one reader of a Hugging Face model directory, for every
 * model that comes as one: the target or draft Llama (model_hf.c), the MLP
 * speculator (mlp_speculator.c) and the acceptance head (accept_head.c).
 *
 *   dir/config.json                    specd_hf_read_json (any JSON file of
 *                                      the directory; keys through
 *                                      common/util/json.h)
 *   dir/model.safetensors              specd_hf_weights: one file, or
 *   dir/model.safetensors.index.json   the shards its weight_map names, a
 *     + the shards                     tensor counting only in the shard
 *                                      the index assigns it to
 *
 * Shard names come from the index and become paths, so only plain file
 * names of the directory are allowed; a tensor listed twice, or listed in
 * a shard that does not hold it, is an error. How a file is opened (mapped
 * for the model's lifetime, or owned by its handle) is the caller's. */
#ifndef SPECD_HF_DIR_H
#define SPECD_HF_DIR_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/model/safetensors.h"
#include "common/util/error.h"

#define SPECD_HF_CONFIG "config.json"
#define SPECD_HF_SINGLE_WEIGHTS "model.safetensors"
#define SPECD_HF_SHARD_INDEX "model.safetensors.index.json"

/* dir/name read (at most max_bytes) and parsed; NULL + err. */
cJSON *specd_hf_read_json(const char *dir, const char *name, size_t max_bytes,
                          specd_error *err);

/* Opens one safetensors file of the directory (path is dir/file). */
typedef safetensors_file *(*specd_hf_open_fn)(void *ctx, const char *path, specd_error *err);

typedef struct specd_hf_weight_entry {
    const char *tensor; /* into index */
    int file;           /* index into files */
} specd_hf_weight_entry;

typedef struct specd_hf_weights {
    safetensors_file **files; /* one (no index), or each distinct shard in name order */
    char **names;             /* the files' names in the directory */
    int n_files;
    cJSON *index;                    /* the parsed index; NULL = one model.safetensors */
    specd_hf_weight_entry *entries;  /* weight_map sorted by tensor name */
    size_t n_entries;
} specd_hf_weights;

/* Opens dir's weights with `open` (called once per file). On failure w is
 * closed again and err says why. */
int specd_hf_weights_open(specd_hf_weights *w, const char *dir, specd_hf_open_fn open, void *ctx,
                          specd_error *err);
/* Tensor `name`, only from the file it belongs to; NULL if absent. */
const safetensors_tensor *specd_hf_weights_find(const specd_hf_weights *w, const char *name);
/* 1 if tensor t, read from file `file`, belongs there (always without an
 * index; with one, only where the weight_map puts it). */
int specd_hf_weights_owns(const specd_hf_weights *w, int file, const safetensors_tensor *t);
/* Closes every file (safetensors_close) and frees w's contents. */
void specd_hf_weights_close(specd_hf_weights *w);

#endif
