/* model_file.h - a Llama-family model on disk, whatever its format.
 *
 * Two formats load into the same description:
 *   - a GGUF file (model_gguf.c), and
 *   - a Hugging Face directory: config.json + model.safetensors or
 *     model.safetensors.index.json with shards (model_hf.c).
 * Tensors keep their on-disk type and stay in the mmapped file; the compute
 * backend decides how to use them. Tensor names are canonicalised to GGUF's
 * names (token_embd.weight, blk.N.attn_q.weight, ...), and shapes use GGUF's
 * order: ne[0] is the row length (the input dimension of a weight matrix),
 * ne[1] the number of rows (output dimension).
 *
 * After loading, specd_model_validate() checks that every tensor the Llama
 * forward pass needs exists with the shape the hyperparameters imply, so the
 * transformer never meets a surprise. */
#ifndef SPECD_MODEL_FILE_H
#define SPECD_MODEL_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/dtype.h"
#include "common/util/error.h"
#include "common/util/tensor.h"

typedef enum specd_rope_scaling {
    SPECD_ROPE_SCALING_NONE = 0,
    SPECD_ROPE_SCALING_LINEAR = 1, /* positions divided by factor */
    SPECD_ROPE_SCALING_LLAMA3 = 2, /* Llama 3.1 frequency-dependent scaling */
} specd_rope_scaling;

typedef struct specd_llama_hparams {
    int vocab_size;
    int dim;          /* hidden size */
    int hidden_dim;   /* MLP intermediate size */
    int n_layers;
    int n_heads;
    int n_kv_heads;   /* < n_heads means grouped-query attention */
    int head_dim;     /* usually dim / n_heads */
    int max_seq_len;  /* context length the model was trained for */
    float rope_theta;
    specd_rope_scaling rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;   /* llama3 scaling only */
    float rope_high_freq_factor;  /* llama3 scaling only */
    int rope_original_max_pos;    /* llama3 scaling only */
    /* GGUF converters permute the rows of Q and K so that RoPE rotates
     * adjacent pairs (x[2i], x[2i+1]); Hugging Face checkpoints rotate
     * halves (x[i], x[i + head_dim/2]). Both give identical attention
     * scores; the forward pass just has to use the matching rotation. */
    int rope_interleaved;
    float norm_eps;
    int tied_embeddings; /* LM head reuses token_embd.weight */
    int bos_id;          /* -1 if none */
    int eos_id;          /* -1 if none */
} specd_llama_hparams;

typedef enum specd_model_format {
    SPECD_FORMAT_GGUF = 1,
    SPECD_FORMAT_HF = 2,
} specd_model_format;

typedef struct specd_mapping {
    void *addr;
    size_t len;
} specd_mapping;

typedef struct specd_model_file {
    specd_model_format format;
    char path[1024];            /* the .gguf file or the HF directory */
    specd_llama_hparams hp;
    char arch[32];              /* "llama" */
    specd_tensor *tensors;
    size_t n_tensors;
    specd_mapping *maps;        /* mmapped files, unmapped on close */
    size_t n_maps;
    struct gguf_file *gguf;     /* GGUF only: kept open for tokenizer metadata */
    char tokenizer_json[1024];  /* HF only: path to tokenizer.json ("" if none) */
} specd_model_file;

/* Opens a .gguf file or a Hugging Face directory, fills hparams and the
 * tensor table, and validates shapes. NULL + message on any problem. */
specd_model_file *specd_model_open(const char *path, specd_error *err);
void specd_model_close(specd_model_file *m);

const specd_tensor *specd_model_tensor(const specd_model_file *m, const char *name);

/* Format-specific loaders (called by specd_model_open; they fill format,
 * hp, arch, tensors and maps but do not validate shapes). `m` must be a
 * zeroed heap object; on failure it may be partly filled and is released
 * with specd_model_close like a loaded one. */
int specd_model_load_gguf(specd_model_file *m, const char *path, specd_error *err);
int specd_model_load_hf(specd_model_file *m, const char *dir, specd_error *err);

/* Checks that the hyperparameters are sane and every required tensor exists
 * with the implied shape and a supported type. */
int specd_model_validate(const specd_model_file *m, specd_error *err);

/* The tensors of one Llama layer that the forward pass reads, with the
 * shapes the hyperparameters imply: ne1 == 0 marks a vector [ne0] (a norm
 * weight), else a matrix [ne0 = inputs, ne1 = outputs]. One table for
 * validation and for the benchmarks' synthetic models. */
#define SPECD_LLAMA_LAYER_TENSORS 9
typedef struct specd_tensor_shape {
    char name[96];
    uint64_t ne0, ne1;
} specd_tensor_shape;
void specd_llama_layer_shapes(const specd_llama_hparams *hp, int layer,
                              specd_tensor_shape out[SPECD_LLAMA_LAYER_TENSORS]);

/* mmaps a whole file read-only and records it in m->maps. */
int specd_model_map_file(specd_model_file *m, const char *path, const void **addr,
                         size_t *len, specd_error *err);

/* Loader helpers (model_file.c). add_tensor appends a copy of *t to the
 * table. index_tensors sorts the table by name, so specd_model_tensor is a
 * binary search, and rejects duplicate names; loaders call it last. A table
 * built by hand without it still works: lookups fall back to a scan. */
int specd_model_add_tensor(specd_model_file *m, const specd_tensor *t, specd_error *err);
int specd_model_index_tensors(specd_model_file *m, specd_error *err);

/* Parses a Hugging Face config.json (model_hf.c) into hparams: model_type
 * "llama" (or architectures ["LlamaForCausalLM"]), sizes, rope_theta,
 * rope_scaling, rms_norm_eps, tie_word_embeddings, bos/eos ids. Keys of the
 * wrong JSON type are errors naming the key. Exposed for the fuzz target. */
int specd_hf_parse_config(const char *json, size_t len, specd_llama_hparams *hp,
                          specd_error *err);

#endif
