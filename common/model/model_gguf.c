/* model_gguf.c - loads a Llama GGUF file into a specd_model_file: the
 * hyperparameters from the llama.* and tokenizer.ggml.* keys, and the tensor
 * table (GGUF names are already the canonical ones). The gguf handle stays
 * open in m->gguf: it owns the mapping the tensors point into, and the
 * tokenizer reads its vocabulary from the same metadata. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/gguf.h"
#include "common/model/model_file.h"

#define ARCH "llama"

/* Llama 3.1's published scaling constants, used when a GGUF names "llama3"
 * scaling but leaves a constant out. */
#define LLAMA3_DEFAULT_LOW_FREQ 1.0f
#define LLAMA3_DEFAULT_HIGH_FREQ 4.0f
#define LLAMA3_DEFAULT_ORIGINAL_CTX 8192

static const char *arch_key(char *buf, size_t cap, const char *suffix) {
    snprintf(buf, cap, ARCH ".%s", suffix);
    return buf;
}

static int get_int(const gguf_file *f, const char *key, int *out, specd_error *err) {
    uint32_t v;
    if (gguf_get_u32(f, key, &v, err)) return -1;
    if (v > INT_MAX) return specd_seterr(err, "gguf: key '%s' = %u is too large", key, v);
    *out = (int)v;
    return 0;
}

static int opt_int(const gguf_file *f, const char *key, int def, int *out, specd_error *err) {
    if (!gguf_find_kv(f, key)) {
        *out = def;
        return 0;
    }
    return get_int(f, key, out, err);
}

static int opt_f32(const gguf_file *f, const char *key, float def, float *out,
                   specd_error *err) {
    if (!gguf_find_kv(f, key)) {
        *out = def;
        return 0;
    }
    return gguf_get_f32(f, key, out, err);
}

static int read_arch(specd_model_file *m, specd_error *err) {
    char *arch = gguf_get_str(m->gguf, "general.architecture", err);
    if (!arch) return -1;
    int rc = 0;
    if (strcmp(arch, ARCH) != 0)
        rc = specd_seterr(err, "gguf: general.architecture is '%.64s'; specd supports only '"
                               ARCH "'", arch);
    else
        snprintf(m->arch, sizeof m->arch, "%s", arch);
    free(arch);
    return rc;
}

/* llama.vocab_size is optional in GGUF; the token list always gives it. */
static int read_vocab_size(const gguf_file *f, int *out, specd_error *err) {
    char key[96];
    if (gguf_find_kv(f, arch_key(key, sizeof key, "vocab_size"))) return get_int(f, key, out, err);
    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUF_ARRAY)
        return specd_seterr(err, "gguf: neither " ARCH ".vocab_size nor tokenizer.ggml.tokens "
                                 "gives the vocabulary size");
    *out = (int)tokens->arr_len; /* <= GGUF_MAX_ARRAY */
    return 0;
}

/* head_dim: attention.key_length when given, else the rotary dimension
 * (equal to head_dim for Llama), else dim / heads. */
static int read_head_dim(const gguf_file *f, specd_llama_hparams *hp, specd_error *err) {
    char key[96];
    int def = hp->n_heads > 0 ? hp->dim / hp->n_heads : 0;
    int key_len = 0, rot_dim = 0;
    if (opt_int(f, arch_key(key, sizeof key, "attention.key_length"), def, &key_len, err) ||
        opt_int(f, arch_key(key, sizeof key, "rope.dimension_count"), key_len, &rot_dim, err))
        return -1;
    if (rot_dim != key_len)
        return specd_seterr(err, "gguf: " ARCH ".rope.dimension_count (%d) differs from the head "
                                 "size (%d); partial rotary embeddings are not supported",
                            rot_dim, key_len);
    hp->head_dim = key_len;
    return 0;
}

static int parse_scaling_type(const gguf_file *f, const char *key, specd_rope_scaling *out,
                              specd_error *err) {
    char *type = gguf_get_str(f, key, err);
    if (!type) return -1;
    int rc = 0;
    if (strcmp(type, "none") == 0)
        *out = SPECD_ROPE_SCALING_NONE;
    else if (strcmp(type, "linear") == 0)
        *out = SPECD_ROPE_SCALING_LINEAR;
    else if (strcmp(type, "llama3") == 0)
        *out = SPECD_ROPE_SCALING_LLAMA3;
    else
        rc = specd_seterr(err, "gguf: key '%s' = '%.32s' is not supported (specd knows none, "
                               "linear, llama3)", key, type);
    free(type);
    return rc;
}

/* RoPE scaling. Llama 3.1-style GGUFs usually say nothing here: the
 * converter bakes the llama3 frequency factors into a "rope_freqs.weight"
 * tensor, which stays in the tensor table for the transformer to apply (and
 * specd_model_validate checks its shape). Older files spell linear scaling
 * as llama.rope.scale_linear. */
static int read_rope_scaling(const gguf_file *f, specd_llama_hparams *hp, specd_error *err) {
    char key[96];
    hp->rope_scaling = SPECD_ROPE_SCALING_NONE;
    hp->rope_factor = 1.0f;
    if (gguf_find_kv(f, arch_key(key, sizeof key, "rope.scaling.type"))) {
        if (parse_scaling_type(f, key, &hp->rope_scaling, err) ||
            opt_f32(f, arch_key(key, sizeof key, "rope.scaling.factor"), 1.0f, &hp->rope_factor,
                    err))
            return -1;
    } else if (gguf_find_kv(f, arch_key(key, sizeof key, "rope.scale_linear"))) {
        hp->rope_scaling = SPECD_ROPE_SCALING_LINEAR;
        if (gguf_get_f32(f, key, &hp->rope_factor, err)) return -1;
    }
    if (hp->rope_scaling != SPECD_ROPE_SCALING_LLAMA3) return 0;
    if (opt_f32(f, arch_key(key, sizeof key, "rope.scaling.low_freq_factor"),
                LLAMA3_DEFAULT_LOW_FREQ, &hp->rope_low_freq_factor, err) ||
        opt_f32(f, arch_key(key, sizeof key, "rope.scaling.high_freq_factor"),
                LLAMA3_DEFAULT_HIGH_FREQ, &hp->rope_high_freq_factor, err) ||
        opt_int(f, arch_key(key, sizeof key, "rope.scaling.original_context_length"),
                LLAMA3_DEFAULT_ORIGINAL_CTX, &hp->rope_original_max_pos, err))
        return -1;
    return 0;
}

static int read_token_id(const gguf_file *f, const char *key, int *out, specd_error *err) {
    return opt_int(f, key, -1, out, err);
}

static int read_hparams(specd_model_file *m, specd_error *err) {
    const gguf_file *f = m->gguf;
    specd_llama_hparams *hp = &m->hp;
    char key[96];
    if (read_vocab_size(f, &hp->vocab_size, err) ||
        get_int(f, arch_key(key, sizeof key, "embedding_length"), &hp->dim, err) ||
        get_int(f, arch_key(key, sizeof key, "feed_forward_length"), &hp->hidden_dim, err) ||
        get_int(f, arch_key(key, sizeof key, "block_count"), &hp->n_layers, err) ||
        get_int(f, arch_key(key, sizeof key, "attention.head_count"), &hp->n_heads, err) ||
        opt_int(f, arch_key(key, sizeof key, "attention.head_count_kv"), hp->n_heads,
                &hp->n_kv_heads, err) ||
        read_head_dim(f, hp, err) ||
        get_int(f, arch_key(key, sizeof key, "context_length"), &hp->max_seq_len, err) ||
        opt_f32(f, arch_key(key, sizeof key, "rope.freq_base"), 10000.0f, &hp->rope_theta,
                err) ||
        read_rope_scaling(f, hp, err) ||
        gguf_get_f32(f, arch_key(key, sizeof key, "attention.layer_norm_rms_epsilon"),
                     &hp->norm_eps, err) ||
        read_token_id(f, "tokenizer.ggml.bos_token_id", &hp->bos_id, err) ||
        read_token_id(f, "tokenizer.ggml.eos_token_id", &hp->eos_id, err))
        return -1;
    /* the converter permutes Q/K rows for adjacent-pair rotation */
    hp->rope_interleaved = 1;
    hp->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    return 0;
}

static int add_tensors(specd_model_file *m, specd_error *err) {
    for (uint64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const gguf_tensor *g = gguf_tensor_at(m->gguf, i);
        specd_tensor t = {0};
        if (g->name.len >= sizeof t.name || memchr(g->name.ptr, 0, g->name.len))
            return specd_seterr(err, "gguf: tensor #%llu: name '%.40s...' is longer than %zu "
                                     "bytes or holds a NUL byte", (unsigned long long)i,
                                g->name.ptr, sizeof t.name - 1);
        memcpy(t.name, g->name.ptr, g->name.len);
        t.type = g->type;
        t.n_dims = g->n_dims;
        memcpy(t.ne, g->ne, sizeof t.ne);
        t.data = g->data;
        t.nbytes = g->nbytes;
        if (specd_model_add_tensor(m, &t, err)) return -1;
    }
    return specd_model_index_tensors(m, err);
}

int specd_model_load_gguf(specd_model_file *m, const char *path, specd_error *err) {
    m->format = SPECD_FORMAT_GGUF;
    if (strlen(path) >= sizeof m->path)
        return specd_seterr(err, "gguf: path '%.64s...' is too long", path);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->gguf = gguf_open(path, err); /* its errors already name the file */
    if (!m->gguf) return -1;
    if (read_arch(m, err) || read_hparams(m, err) || add_tensors(m, err))
        return specd_preferr(err, "%s", path);
    return 0;
}
