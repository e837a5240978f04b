/* model_hf.c - loads a Hugging Face Llama directory: config.json for the
 * hyperparameters, and the weights from model.safetensors or from the shards
 * that model.safetensors.index.json lists. Tensor names are renamed to the
 * GGUF canonical names and shapes reversed to GGUF's order, so the rest of
 * specd sees one kind of model. Tensors the Llama forward does not use (e.g.
 * rotary inv_freq buffers) are skipped.
 *
 * Unlike GGUF files, HF checkpoints rotate halves of each head in RoPE, so
 * rope_interleaved is 0. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/hf_dir.h"
#include "common/model/model_file.h"
#include "common/model/safetensors.h"
#include "common/util/json.h"
#include "common/util/small_file.h"

#define CONFIG SPECD_HF_CONFIG
#define TOKENIZER "tokenizer.json"
#define MAX_JSON_FILE (64u << 20) /* config and index files are KBs; larger = wrong file */

/* ---- config.json -------------------------------------------------------- */

/* config.json's keys through the one JSON accessor (common/util/json.h):
 * any int, a null counting as absent. */
static int get_int(const cJSON *obj, const char *key, int required, int def, int *out,
                   specd_error *err) {
    return specd_json_int(obj, CONFIG, key, required, def, INT_MIN, INT_MAX, out, err);
}

static int get_float(const cJSON *obj, const char *key, int required, float def, float *out,
                     specd_error *err) {
    return specd_json_float(obj, CONFIG, key, required, def, out, err);
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
        return specd_json_to_int(first, CONFIG, key, INT_MIN, INT_MAX, out, err);
    }
    return specd_json_to_int(item, CONFIG, key, INT_MIN, INT_MAX, out, err);
}

static int check_model_type(const cJSON *root, specd_error *err) {
    const cJSON *type = specd_json_member(root, "model_type");
    if (type) {
        if (!cJSON_IsString(type))
            return specd_seterr(err, CONFIG ": 'model_type' must be a string, got %s",
                                specd_json_type_name(type));
        if (strcmp(type->valuestring, "llama") != 0)
            return specd_seterr(err, CONFIG ": model_type is '%.64s'; specd supports 'llama'",
                                type->valuestring);
        return 0;
    }
    const cJSON *archs = specd_json_member(root, "architectures"), *a;
    if (archs && !cJSON_IsArray(archs))
        return specd_seterr(err, CONFIG ": 'architectures' must be an array, got %s",
                            specd_json_type_name(archs));
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
                            specd_json_type_name(rs));
    /* newer transformers write rope_type, older ones type */
    const cJSON *type = specd_json_member(rs, "rope_type");
    if (!type) type = specd_json_member(rs, "type");
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
    const cJSON *rp = specd_json_member(root, "rope_parameters");
    if (rp) {
        if (!cJSON_IsObject(rp))
            return specd_seterr(err, CONFIG ": 'rope_parameters' must be an object, got %s",
                                specd_json_type_name(rp));
        return get_float(rp, "rope_theta", 0, 10000.0f, &hp->rope_theta, err) ||
                       parse_rope_object(rp, "rope_parameters", hp, err)
                   ? -1
                   : 0;
    }
    if (get_float(root, "rope_theta", 0, 10000.0f, &hp->rope_theta, err)) return -1;
    const cJSON *rs = specd_json_member(root, "rope_scaling");
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
        specd_json_bool(root, CONFIG, "tie_word_embeddings", 0, &hp->tied_embeddings, err) ||
        get_token_id(root, "bos_token_id", 1, &hp->bos_id, err) ||
        get_token_id(root, "eos_token_id", 2, &hp->eos_id, err))
        return -1;
    hp->rope_interleaved = 0;
    return 0;
}

int specd_hf_parse_config(const char *json, size_t len, specd_llama_hparams *hp,
                          specd_error *err) {
    memset(hp, 0, sizeof *hp);
    cJSON *root = specd_json_parse(json, len, CONFIG, err);
    if (!root) return -1;
    int rc = parse_config_object(root, hp, err);
    cJSON_Delete(root);
    return rc;
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

/* Maps one safetensors file (recorded in m->maps, so the tensors outlive
 * the handle) and parses its header. */
static safetensors_file *open_mapped(void *model, const char *path, specd_error *err) {
    specd_model_file *m = model;
    const void *addr;
    size_t len;
    if (specd_model_map_file(m, path, &addr, &len, err)) return NULL;
    safetensors_file *st = safetensors_open_memory(addr, len, err);
    if (!st) specd_preferr(err, "%s", path);
    return st;
}

/* model.safetensors or the shards (hf_dir.h): every tensor of each file
 * that belongs there, under its canonical name. */
static int load_weights(specd_model_file *m, const char *dir, specd_error *err) {
    specd_hf_weights w;
    if (specd_hf_weights_open(&w, dir, open_mapped, m, err)) return specd_preferr(err, "hf");
    int rc = 0;
    for (int f = 0; f < w.n_files && rc == 0; f++)
        for (size_t i = 0; i < safetensors_n_tensors(w.files[f]) && rc == 0; i++) {
            const safetensors_tensor *t = safetensors_tensor_at(w.files[f], i);
            if (specd_hf_weights_owns(&w, f, t)) rc = add_tensor(m, t, err);
        }
    specd_hf_weights_close(&w);
    return rc;
}

static int load_config(specd_model_file *m, const char *dir, specd_error *err) {
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, CONFIG, err)) return -1;
    size_t len;
    char *text = specd_read_small_file(path, MAX_JSON_FILE, &len, err);
    if (!text) return specd_preferr(err, "hf");
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
