/* model_hf.c - loads a Hugging Face Llama directory: config.json for the
 * hyperparameters, and the weights from model.safetensors or from the shards
 * that model.safetensors.index.json lists. Tensor names are renamed to the
 * GGUF canonical names and shapes reversed to GGUF's order, so the rest of
 * specd sees one kind of model. Tensors the Llama forward does not use (e.g.
 * rotary inv_freq buffers) are skipped.
 *
 * Unlike GGUF files, HF checkpoints rotate halves of each head in RoPE, so
 * rope_interleaved is 0. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/model_file.h"
#include "common/model/safetensors.h"
#include "common/util/small_file.h"

#define CONFIG "config.json"
#define SINGLE_WEIGHTS "model.safetensors"
#define SHARD_INDEX "model.safetensors.index.json"
#define TOKENIZER "tokenizer.json"
#define MAX_JSON_FILE (64u << 20) /* config and index files are KBs; larger = wrong file */

/* ---- config.json -------------------------------------------------------- */

static const char *json_type_name(const cJSON *item) {
    if (cJSON_IsNull(item)) return "null";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsObject(item)) return "an object";
    return "invalid";
}

/* A JSON null counts as absent: configs write "head_dim": null for "use the
 * default". */
static const cJSON *member(const cJSON *obj, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(item) ? NULL : item;
}

static int number_to_int(const cJSON *item, const char *key, int *out, specd_error *err) {
    if (!cJSON_IsNumber(item))
        return specd_seterr(err, CONFIG ": '%s' must be an integer, got %s", key,
                            json_type_name(item));
    double v = item->valuedouble;
    if (!(v >= INT_MIN && v <= INT_MAX) || v != floor(v))
        return specd_seterr(err, CONFIG ": '%s' = %g is not an integer in the int range", key, v);
    *out = (int)v;
    return 0;
}

static int get_int(const cJSON *obj, const char *key, int required, int def, int *out,
                   specd_error *err) {
    const cJSON *item = member(obj, key);
    if (!item) {
        if (required) return specd_seterr(err, CONFIG ": '%s' is missing", key);
        *out = def;
        return 0;
    }
    return number_to_int(item, key, out, err);
}

static int get_float(const cJSON *obj, const char *key, int required, float def, float *out,
                     specd_error *err) {
    const cJSON *item = member(obj, key);
    if (!item) {
        if (required) return specd_seterr(err, CONFIG ": '%s' is missing", key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(item))
        return specd_seterr(err, CONFIG ": '%s' must be a number, got %s", key,
                            json_type_name(item));
    *out = (float)item->valuedouble;
    return 0;
}

static int get_bool(const cJSON *obj, const char *key, int def, int *out, specd_error *err) {
    const cJSON *item = member(obj, key);
    if (!item) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(item))
        return specd_seterr(err, CONFIG ": '%s' must be true or false, got %s", key,
                            json_type_name(item));
    *out = cJSON_IsTrue(item);
    return 0;
}

/* bos/eos: an id, a list of ids (the first is used), or null (none). When
 * the key is absent, transformers' LlamaConfig defaults apply (bos 1, eos
 * 2), which is what the reference implementation would use. */
static int get_token_id(const cJSON *obj, const char *key, int def, int *out, specd_error *err) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item) {
        *out = def;
        return 0;
    }
    if (cJSON_IsNull(item)) {
        *out = -1;
        return 0;
    }
    if (cJSON_IsArray(item)) {
        const cJSON *first = cJSON_GetArrayItem(item, 0);
        if (!first) {
            *out = -1;
            return 0;
        }
        return number_to_int(first, key, out, err);
    }
    return number_to_int(item, key, out, err);
}

static int check_model_type(const cJSON *root, specd_error *err) {
    const cJSON *type = member(root, "model_type");
    if (type) {
        if (!cJSON_IsString(type))
            return specd_seterr(err, CONFIG ": 'model_type' must be a string, got %s",
                                json_type_name(type));
        if (strcmp(type->valuestring, "llama") != 0)
            return specd_seterr(err, CONFIG ": model_type is '%.64s'; specd supports 'llama'",
                                type->valuestring);
        return 0;
    }
    const cJSON *archs = member(root, "architectures"), *a;
    if (archs && !cJSON_IsArray(archs))
        return specd_seterr(err, CONFIG ": 'architectures' must be an array, got %s",
                            json_type_name(archs));
    cJSON_ArrayForEach(a, archs) {
        if (cJSON_IsString(a) && strcmp(a->valuestring, "LlamaForCausalLM") == 0) return 0;
    }
    return specd_seterr(err, CONFIG ": neither model_type \"llama\" nor architectures "
                             "[\"LlamaForCausalLM\"]; specd supports only Llama models");
}

/* The scaling rule in a rope_scaling / rope_parameters object; `key` names
 * the object in messages. */
static int parse_rope_object(const cJSON *rs, const char *key, specd_llama_hparams *hp,
                             specd_error *err) {
    if (!cJSON_IsObject(rs))
        return specd_seterr(err, CONFIG ": '%s' must be an object, got %s", key,
                            json_type_name(rs));
    /* newer transformers write rope_type, older ones type */
    const cJSON *type = member(rs, "rope_type");
    if (!type) type = member(rs, "type");
    if (!cJSON_IsString(type))
        return specd_seterr(err, CONFIG ": '%s' needs a string 'rope_type' or 'type'", key);
    const char *t = type->valuestring;
    if (strcmp(t, "default") == 0) return 0;
    if (strcmp(t, "linear") == 0) {
        hp->rope_scaling = SPECD_ROPE_SCALING_LINEAR;
        return get_float(rs, "factor", 1, 0, &hp->rope_factor, err);
    }
    if (strcmp(t, "llama3") == 0) {
        hp->rope_scaling = SPECD_ROPE_SCALING_LLAMA3;
        if (get_float(rs, "factor", 1, 0, &hp->rope_factor, err) ||
            get_float(rs, "low_freq_factor", 1, 0, &hp->rope_low_freq_factor, err) ||
            get_float(rs, "high_freq_factor", 1, 0, &hp->rope_high_freq_factor, err) ||
            get_int(rs, "original_max_position_embeddings", 1, 0, &hp->rope_original_max_pos,
                    err))
            return -1;
        return 0;
    }
    return specd_seterr(err, CONFIG ": %s type '%.32s' is not supported (specd knows "
                                    "default, linear, llama3)", key, t);
}

/* RoPE base and scaling. transformers >= 5 writes them together as
 * "rope_parameters": {rope_theta, rope_type, factor, ...}; earlier versions
 * (and most published checkpoints) write top-level "rope_theta" and an
 * optional "rope_scaling" object. Reading only the old keys would silently
 * fall back to theta = 10000 on new files. */
static int parse_rope(const cJSON *root, specd_llama_hparams *hp, specd_error *err) {
    hp->rope_scaling = SPECD_ROPE_SCALING_NONE;
    hp->rope_factor = 1.0f;
    const cJSON *rp = member(root, "rope_parameters");
    if (rp) {
        if (!cJSON_IsObject(rp))
            return specd_seterr(err, CONFIG ": 'rope_parameters' must be an object, got %s",
                                json_type_name(rp));
        return get_float(rp, "rope_theta", 0, 10000.0f, &hp->rope_theta, err) ||
                       parse_rope_object(rp, "rope_parameters", hp, err)
                   ? -1
                   : 0;
    }
    if (get_float(root, "rope_theta", 0, 10000.0f, &hp->rope_theta, err)) return -1;
    const cJSON *rs = member(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return 0;
    return parse_rope_object(rs, "rope_scaling", hp, err);
}

/* Defaults are transformers' LlamaConfig defaults, for keys a real
 * config.json may leave out; sizes have no sensible default and are
 * required. */
static int parse_config_object(const cJSON *root, specd_llama_hparams *hp, specd_error *err) {
    if (!cJSON_IsObject(root)) return specd_seterr(err, CONFIG ": not a JSON object");
    if (check_model_type(root, err) ||
        get_int(root, "vocab_size", 1, 0, &hp->vocab_size, err) ||
        get_int(root, "hidden_size", 1, 0, &hp->dim, err) ||
        get_int(root, "intermediate_size", 1, 0, &hp->hidden_dim, err) ||
        get_int(root, "num_hidden_layers", 1, 0, &hp->n_layers, err) ||
        get_int(root, "num_attention_heads", 1, 0, &hp->n_heads, err) ||
        get_int(root, "num_key_value_heads", 0, hp->n_heads, &hp->n_kv_heads, err) ||
        get_int(root, "head_dim", 0, hp->n_heads > 0 ? hp->dim / hp->n_heads : 0,
                &hp->head_dim, err) ||
        get_int(root, "max_position_embeddings", 0, 2048, &hp->max_seq_len, err) ||
        parse_rope(root, hp, err) ||
        get_float(root, "rms_norm_eps", 0, 1e-6f, &hp->norm_eps, err) ||
        get_bool(root, "tie_word_embeddings", 0, &hp->tied_embeddings, err) ||
        get_token_id(root, "bos_token_id", 1, &hp->bos_id, err) ||
        get_token_id(root, "eos_token_id", 2, &hp->eos_id, err))
        return -1;
    hp->rope_interleaved = 0;
    return 0;
}

int specd_hf_parse_config(const char *json, size_t len, specd_llama_hparams *hp,
                          specd_error *err) {
    memset(hp, 0, sizeof *hp);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return specd_seterr(err, CONFIG ": not valid JSON (error near byte %ld)",
                            end ? (long)(end - json) : -1L);
    int rc = parse_config_object(root, hp, err);
    cJSON_Delete(root);
    return rc;
}

/* ---- files ------------------------------------------------------------- */

/* A config or index file, with errors prefixed "hf: " like the rest here. */
static char *hf_read_json(const char *path, size_t *len, specd_error *err) {
    char *text = specd_read_small_file(path, MAX_JSON_FILE, len, err);
    if (!text) specd_preferr(err, "hf");
    return text;
}

/* ---- tensor names -------------------------------------------------------- */

typedef struct name_pair {
    const char *hf, *gguf;
} name_pair;

static const name_pair k_global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

static const name_pair k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Writes the GGUF name of an HF tensor into out; 0 if the tensor is not one
 * the Llama forward uses. */
static int canonical_name(const char *hf, char *out, size_t cap) {
    for (size_t i = 0; i < N_OF(k_global_names); i++)
        if (strcmp(hf, k_global_names[i].hf) == 0) {
            snprintf(out, cap, "%s", k_global_names[i].gguf);
            return 1;
        }
    static const char prefix[] = "model.layers.";
    if (strncmp(hf, prefix, sizeof prefix - 1) != 0) return 0;
    const char *p = hf + sizeof prefix - 1;
    /* a layer number: digits, no leading zero, at most 6 of them */
    int layer = 0, digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 7) layer = layer * 10 + (*p++ - '0'), digits++;
    if (digits == 0 || digits > 6 || (digits > 1 && hf[sizeof prefix - 1] == '0') || *p != '.')
        return 0;
    p++;
    for (size_t i = 0; i < N_OF(k_layer_names); i++)
        if (strcmp(p, k_layer_names[i].hf) == 0) {
            snprintf(out, cap, "blk.%d.%s", layer, k_layer_names[i].gguf);
            return 1;
        }
    return 0;
}

/* Adds one safetensors tensor under its canonical name, if it has one.
 * Safetensors shapes are [out, in] row-major; GGUF order is ne[0] = in. */
static int add_tensor(specd_model_file *m, const safetensors_tensor *st, specd_error *err) {
    specd_tensor t = {0};
    if (!canonical_name(st->name, t.name, sizeof t.name)) return 0;
    if (st->type != SPECD_F32 && st->type != SPECD_F16 && st->type != SPECD_BF16)
        return specd_seterr(err, "hf: tensor '%s' has dtype %s; Llama weights must be F32, F16 "
                                 "or BF16", st->name, specd_dtype_get(st->type)->name);
    if (st->n_dims < 1 || st->n_dims > 4)
        return specd_seterr(err, "hf: tensor '%s' has %u dimensions; expected 1 to 4", st->name,
                            st->n_dims);
    t.type = st->type;
    t.n_dims = st->n_dims;
    for (uint32_t d = 0; d < 4; d++) t.ne[d] = d < st->n_dims ? st->shape[st->n_dims - 1 - d] : 1;
    t.data = st->data;
    t.nbytes = st->nbytes;
    return specd_model_add_tensor(m, &t, err);
}

/* ---- weights --------------------------------------------------------------- */

/* Maps one safetensors file (recorded in m->maps) and parses its header. */
static safetensors_file *open_shard(specd_model_file *m, const char *path, specd_error *err) {
    const void *addr;
    size_t len;
    if (specd_model_map_file(m, path, &addr, &len, err)) return NULL;
    safetensors_file *st = safetensors_open_memory(addr, len, err);
    if (!st) specd_preferr(err, "%s", path);
    return st;
}

static int load_single(specd_model_file *m, const char *path, specd_error *err) {
    safetensors_file *st = open_shard(m, path, err);
    if (!st) return -1;
    int rc = 0;
    for (size_t i = 0; i < safetensors_n_tensors(st) && rc == 0; i++)
        rc = add_tensor(m, safetensors_tensor_at(st, i), err);
    safetensors_close(st);
    return rc;
}

/* One weight_map entry: which shard holds a tensor. */
typedef struct shard_entry {
    const char *tensor, *shard;
    int found;
} shard_entry;

static int cmp_entry_tensor(const void *a, const void *b) {
    return strcmp(((const shard_entry *)a)->tensor, ((const shard_entry *)b)->tensor);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Shard names come from the index file and become paths: only plain file
 * names in the model directory are allowed. */
static int check_shard_name(const char *name, specd_error *err) {
    if (!name[0] || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return specd_seterr(err, SHARD_INDEX ": shard name '%.64s' is not a plain file name",
                            name);
    return 0;
}

/* Reads weight_map into entries sorted by tensor name (rejecting duplicates)
 * and the distinct shard names sorted. */
static int read_weight_map(const cJSON *root, shard_entry **entries_out, size_t *n_out,
                           const char ***shards_out, size_t *n_shards_out, specd_error *err) {
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map"), *item;
    if (!cJSON_IsObject(map))
        return specd_seterr(err, SHARD_INDEX ": 'weight_map' is missing or not an object");
    size_t n = 0;
    cJSON_ArrayForEach(item, map) n++;
    shard_entry *entries = calloc(n ? n : 1, sizeof *entries);
    const char **shards = calloc(n ? n : 1, sizeof *shards);
    *entries_out = entries;
    *shards_out = shards;
    if (!entries || !shards) return specd_seterr(err, "hf: out of memory");
    size_t i = 0;
    cJSON_ArrayForEach(item, map) {
        if (!cJSON_IsString(item))
            return specd_seterr(err, SHARD_INDEX ": weight_map['%.64s'] must be a string",
                                item->string);
        if (check_shard_name(item->valuestring, err)) return -1;
        entries[i] = (shard_entry){item->string, item->valuestring, 0};
        shards[i++] = item->valuestring;
    }
    qsort(entries, n, sizeof *entries, cmp_entry_tensor);
    for (i = 1; i < n; i++)
        if (strcmp(entries[i - 1].tensor, entries[i].tensor) == 0)
            return specd_seterr(err, SHARD_INDEX ": tensor '%.64s' is listed twice",
                                entries[i].tensor);
    qsort(shards, n, sizeof *shards, cmp_str_ptr);
    size_t n_shards = 0;
    for (i = 0; i < n; i++)
        if (n_shards == 0 || strcmp(shards[n_shards - 1], shards[i]) != 0)
            shards[n_shards++] = shards[i];
    *n_out = n;
    *n_shards_out = n_shards;
    return 0;
}

/* Adds the tensors of one shard that the index assigns to it. */
static int load_shard(specd_model_file *m, const char *dir, const char *shard,
                      shard_entry *entries, size_t n_entries, specd_error *err) {
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, shard, err)) return -1;
    safetensors_file *st = open_shard(m, path, err);
    if (!st) return -1;
    int rc = 0;
    for (size_t i = 0; i < safetensors_n_tensors(st) && rc == 0; i++) {
        const safetensors_tensor *t = safetensors_tensor_at(st, i);
        shard_entry key = {t->name, NULL, 0};
        shard_entry *e = bsearch(&key, entries, n_entries, sizeof *entries, cmp_entry_tensor);
        if (!e || strcmp(e->shard, shard) != 0) continue; /* the index places it elsewhere */
        e->found = 1;
        rc = add_tensor(m, t, err);
    }
    safetensors_close(st);
    return rc;
}

static int load_sharded(specd_model_file *m, const char *dir, const char *index_path,
                        specd_error *err) {
    size_t len;
    char *text = hf_read_json(index_path, &len, err);
    if (!text) return -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    shard_entry *entries = NULL;
    const char **shards = NULL;
    size_t n_entries = 0, n_shards = 0;
    int rc;
    if (!root)
        rc = specd_seterr(err, SHARD_INDEX ": not valid JSON (error near byte %ld)",
                          end ? (long)(end - text) : -1L);
    else
        rc = read_weight_map(root, &entries, &n_entries, &shards, &n_shards, err);
    for (size_t i = 0; i < n_shards && rc == 0; i++)
        rc = load_shard(m, dir, shards[i], entries, n_entries, err);
    for (size_t i = 0; i < n_entries && rc == 0; i++)
        if (!entries[i].found)
            rc = specd_seterr(err, SHARD_INDEX ": tensor '%.64s' is not in shard '%.64s'",
                              entries[i].tensor, entries[i].shard);
    free(entries);
    free(shards);
    cJSON_Delete(root);
    free(text);
    return rc;
}

static int load_weights(specd_model_file *m, const char *dir, specd_error *err) {
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, SHARD_INDEX, err)) return -1;
    if (specd_is_regular_file(path)) return load_sharded(m, dir, path, err);
    if (specd_path_join(path, sizeof path, dir, SINGLE_WEIGHTS, err)) return -1;
    if (specd_is_regular_file(path)) return load_single(m, path, err);
    return specd_seterr(err, "hf: no " SINGLE_WEIGHTS " or " SHARD_INDEX " in the directory");
}

static int load_config(specd_model_file *m, const char *dir, specd_error *err) {
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, CONFIG, err)) return -1;
    size_t len;
    char *text = hf_read_json(path, &len, err);
    if (!text) return -1;
    int rc = specd_hf_parse_config(text, len, &m->hp, err);
    free(text);
    return rc;
}

int specd_model_load_hf(specd_model_file *m, const char *dir, specd_error *err) {
    m->format = SPECD_FORMAT_HF;
    snprintf(m->arch, sizeof m->arch, "llama");
    if (strlen(dir) >= sizeof m->path)
        return specd_seterr(err, "hf: path '%.64s...' is too long", dir);
    snprintf(m->path, sizeof m->path, "%s", dir);
    if (load_config(m, dir, err) || load_weights(m, dir, err) ||
        specd_model_index_tensors(m, err))
        return specd_preferr(err, "%s", dir);
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, TOKENIZER, err)) return specd_preferr(err, "%s", dir);
    size_t path_len = strlen(path);
    if (specd_is_regular_file(path) && path_len < sizeof m->tokenizer_json)
        memcpy(m->tokenizer_json, path, path_len + 1);
    m->hp.tied_embeddings =
        m->hp.tied_embeddings || specd_model_tensor(m, "output.weight") == NULL;
    return 0;
}
