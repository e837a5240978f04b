/* hf_dir.c - see hf_dir.h. */
#include "common/model/hf_dir.h"

#include <stdlib.h>
#include <string.h>

#include "common/util/json.h"
#include "common/util/small_file.h"

#define MAX_INDEX_FILE (64u << 20) /* index files are KBs; larger = wrong file */

cJSON *specd_hf_read_json(const char *dir, const char *name, size_t max_bytes,
                          specd_error *err) {
    char path[2048];
    size_t len;
    if (specd_path_join(path, sizeof path, dir, name, err)) return NULL;
    char *text = specd_read_small_file(path, max_bytes, &len, err);
    if (!text) return NULL;
    cJSON *root = specd_json_parse(text, len, name, err);
    free(text);
    return root;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const specd_hf_weight_entry *)a)->tensor,
                  ((const specd_hf_weight_entry *)b)->tensor);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int add_file(specd_hf_weights *w, const char *dir, const char *name, specd_hf_open_fn open,
                    void *ctx, specd_error *err) {
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, name, err)) return -1;
    safetensors_file *f = open(ctx, path, err);
    if (!f) return -1;
    w->files[w->n_files] = f;
    if (!(w->names[w->n_files++] = strdup(name))) return specd_seterr(err, "out of memory");
    return 0;
}

/* Reads the index's weight_map into sorted entries, opens each distinct
 * shard once (in name order) and checks that every listed tensor is where
 * the index says. */
static int open_sharded(specd_hf_weights *w, const char *dir, specd_hf_open_fn open, void *ctx,
                        specd_error *err) {
    if (!(w->index = specd_hf_read_json(dir, SPECD_HF_SHARD_INDEX, MAX_INDEX_FILE, err)))
        return -1;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(w->index, "weight_map"), *item;
    if (!cJSON_IsObject(map))
        return specd_seterr(err, SPECD_HF_SHARD_INDEX ": 'weight_map' is missing or not an object");
    size_t n = 0;
    cJSON_ArrayForEach(item, map) n++;
    const char **shards = calloc(n ? n : 1, sizeof *shards);
    w->entries = calloc(n ? n : 1, sizeof *w->entries);
    w->files = calloc(n ? n : 1, sizeof *w->files);
    w->names = calloc(n ? n : 1, sizeof *w->names);
    if (!shards || !w->entries || !w->files || !w->names) {
        free(shards);
        return specd_seterr(err, "out of memory");
    }
    int rc = 0;
    cJSON_ArrayForEach(item, map) {
        const char *name = cJSON_IsString(item) ? item->valuestring : NULL;
        if (!name) {
            rc = specd_seterr(err, SPECD_HF_SHARD_INDEX ": weight_map['%.64s'] must be a string",
                              item->string);
            break;
        }
        if (!name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
            rc = specd_seterr(err, SPECD_HF_SHARD_INDEX ": shard name '%.64s' is not a plain "
                                   "file name", name);
            break;
        }
        w->entries[w->n_entries++] = (specd_hf_weight_entry){item->string, -1};
        shards[w->n_entries - 1] = name;
    }
    qsort(w->entries, w->n_entries, sizeof *w->entries, cmp_entry);
    for (size_t i = 1; i < w->n_entries && rc == 0; i++)
        if (!strcmp(w->entries[i - 1].tensor, w->entries[i].tensor))
            rc = specd_seterr(err, SPECD_HF_SHARD_INDEX ": tensor '%.64s' is listed twice",
                              w->entries[i].tensor);
    qsort(shards, w->n_entries, sizeof *shards, cmp_str_ptr);
    for (size_t i = 0; i < w->n_entries && rc == 0; i++)
        if (i == 0 || strcmp(shards[i - 1], shards[i]))
            rc = add_file(w, dir, shards[i], open, ctx, err);
    free(shards);
    if (rc) return -1;
    /* each entry's file, and the tensor really there */
    for (size_t i = 0; i < w->n_entries; i++) {
        const char *shard =
            cJSON_GetObjectItemCaseSensitive(map, w->entries[i].tensor)->valuestring;
        for (int f = 0; f < w->n_files && w->entries[i].file < 0; f++)
            if (!strcmp(w->names[f], shard)) w->entries[i].file = f;
        if (!safetensors_find(w->files[w->entries[i].file], w->entries[i].tensor))
            return specd_seterr(err, SPECD_HF_SHARD_INDEX ": tensor '%.64s' is not in shard "
                                     "'%.64s'", w->entries[i].tensor, shard);
    }
    return 0;
}

int specd_hf_weights_open(specd_hf_weights *w, const char *dir, specd_hf_open_fn open, void *ctx,
                          specd_error *err) {
    memset(w, 0, sizeof *w);
    char path[2048];
    int rc;
    if (specd_path_join(path, sizeof path, dir, SPECD_HF_SHARD_INDEX, err)) return -1;
    if (specd_is_regular_file(path)) {
        rc = open_sharded(w, dir, open, ctx, err);
    } else {
        if (specd_path_join(path, sizeof path, dir, SPECD_HF_SINGLE_WEIGHTS, err)) return -1;
        if (!specd_is_regular_file(path))
            return specd_seterr(err, "no " SPECD_HF_SINGLE_WEIGHTS " or " SPECD_HF_SHARD_INDEX
                                     " in the directory (a pytorch_model.bin checkpoint must be "
                                     "converted to safetensors first)");
        w->files = calloc(1, sizeof *w->files);
        w->names = calloc(1, sizeof *w->names);
        rc = w->files && w->names ? add_file(w, dir, SPECD_HF_SINGLE_WEIGHTS, open, ctx, err)
                                  : specd_seterr(err, "out of memory");
    }
    if (rc) specd_hf_weights_close(w);
    return rc ? -1 : 0;
}

static const specd_hf_weight_entry *entry_of(const specd_hf_weights *w, const char *name) {
    specd_hf_weight_entry key = {name, 0};
    return bsearch(&key, w->entries, w->n_entries, sizeof *w->entries, cmp_entry);
}

const safetensors_tensor *specd_hf_weights_find(const specd_hf_weights *w, const char *name) {
    if (!w->index) return w->n_files ? safetensors_find(w->files[0], name) : NULL;
    const specd_hf_weight_entry *e = entry_of(w, name);
    return e ? safetensors_find(w->files[e->file], name) : NULL;
}

int specd_hf_weights_owns(const specd_hf_weights *w, int file, const safetensors_tensor *t) {
    if (!w->index) return 1;
    const specd_hf_weight_entry *e = entry_of(w, t->name);
    return e && e->file == file;
}

void specd_hf_weights_close(specd_hf_weights *w) {
    for (int i = 0; i < w->n_files; i++) {
        safetensors_close(w->files[i]);
        free(w->names[i]);
    }
    free(w->files);
    free(w->names);
    free(w->entries);
    cJSON_Delete(w->index);
    memset(w, 0, sizeof *w);
}
