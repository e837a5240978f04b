/* model_file.c - the format-independent half of model loading: picking the
 * loader (directory = Hugging Face, "GGUF" magic = GGUF), the tensor table
 * and its lookups, file mappings, and the validation that guarantees the
 * transformer finds every tensor it needs with the shape it expects. */
#include "common/model/model_file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util/mmap_file.h"

#include "common/model/gguf.h"

/* Hyperparameter bounds: far above any real Llama, low enough that a garbage
 * value is rejected before it sizes an allocation. */
#define MAX_VOCAB (1 << 22)
#define MAX_DIM 65536
#define MAX_HIDDEN (1 << 20)
#define MAX_LAYERS 1024
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024
#define MAX_SEQ_LEN (1 << 24)

/* ---- opening ---------------------------------------------------------------- */

static int load_by_kind(specd_model_file *m, const char *path, specd_error *err) {
    struct stat st;
    if (stat(path, &st))
        return specd_seterr(err, "model: cannot open '%s': %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return specd_model_load_hf(m, path, err);
    unsigned char magic[4] = {0};
    FILE *fp = fopen(path, "rb");
    if (!fp) return specd_seterr(err, "model: cannot open '%s': %s", path, strerror(errno));
    size_t got = fread(magic, 1, sizeof magic, fp);
    fclose(fp);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) return specd_model_load_gguf(m, path, err);
    return specd_seterr(err,
                        "model: '%s' is neither a Hugging Face model directory nor a GGUF file "
                        "(first bytes %02x %02x %02x %02x)",
                        path, magic[0], magic[1], magic[2], magic[3]);
}

specd_model_file *specd_model_open(const char *path, specd_error *err) {
    specd_model_file *m = calloc(1, sizeof *m);
    if (!m) {
        specd_seterr(err, "model: out of memory");
        return NULL;
    }
    if (load_by_kind(m, path, err)) {
        specd_model_close(m);
        return NULL;
    }
    if (specd_model_validate(m, err)) {
        specd_preferr(err, "%s", path);
        specd_model_close(m);
        return NULL;
    }
    return m;
}

void specd_model_close(specd_model_file *m) {
    if (!m) return;
    free(m->tensors);
    for (size_t i = 0; i < m->n_maps; i++) specd_unmap_file(m->maps[i].addr, m->maps[i].len);
    free(m->maps);
    gguf_close(m->gguf);
    free(m);
}

int specd_model_map_file(specd_model_file *m, const char *path, const void **addr, size_t *len,
                         specd_error *err) {
    specd_mapping *maps = realloc(m->maps, (m->n_maps + 1) * sizeof *maps);
    if (!maps) return specd_seterr(err, "model: out of memory");
    m->maps = maps;
    void *p;
    if (specd_map_file(path, &p, len, err)) return -1;
    m->maps[m->n_maps++] = (specd_mapping){p, *len};
    *addr = p;
    return 0;
}

/* ---- the tensor table ------------------------------------------------------ */

int specd_model_add_tensor(specd_model_file *m, const specd_tensor *t, specd_error *err) {
    /* grow by doubling: capacity is the next power of two >= n_tensors */
    size_t n = m->n_tensors;
    if ((n & (n - 1)) == 0) {
        size_t cap = n ? 2 * n : 16;
        specd_tensor *grown = realloc(m->tensors, cap * sizeof *grown);
        if (!grown) return specd_seterr(err, "model: out of memory for %zu tensors", cap);
        m->tensors = grown;
    }
    m->tensors[m->n_tensors++] = *t;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const specd_tensor *)a)->name, ((const specd_tensor *)b)->name);
}

int specd_model_index_tensors(specd_model_file *m, specd_error *err) {
    if (m->n_tensors) qsort(m->tensors, m->n_tensors, sizeof *m->tensors, cmp_tensor_name);
    for (size_t i = 1; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i - 1].name, m->tensors[i].name) == 0)
            return specd_seterr(err, "model: duplicate tensor '%s'", m->tensors[i].name);
    return 0;
}

const specd_tensor *specd_model_tensor(const specd_model_file *m, const char *name) {
    size_t lo = 0, hi = m->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->tensors[mid].name, name);
        if (c == 0) return &m->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* Not found by bisection: either absent, or the table was built by hand
     * and never sorted. A scan settles it; misses are rare (optional tensors
     * and errors), so this costs nothing in practice. */
    for (size_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

/* ---- validation ---------------------------------------------------------------- */

static int check_range(const char *what, long long v, long long lo, long long hi,
                       specd_error *err) {
    if (v >= lo && v <= hi) return 0;
    return specd_seterr(err, "model: %s = %lld is not in %lld..%lld", what, v, lo, hi);
}

static int check_positive(const char *what, float v, specd_error *err) {
    if (isfinite(v) && v > 0) return 0;
    return specd_seterr(err, "model: %s = %g must be a positive number", what, (double)v);
}

static int check_rope(const specd_llama_hparams *hp, specd_error *err) {
    if (check_positive("rope_theta", hp->rope_theta, err)) return -1;
    if (hp->rope_scaling == SPECD_ROPE_SCALING_NONE) return 0;
    if (check_positive("rope scaling factor", hp->rope_factor, err)) return -1;
    if (hp->rope_scaling == SPECD_ROPE_SCALING_LINEAR) return 0;
    if (hp->rope_scaling != SPECD_ROPE_SCALING_LLAMA3)
        return specd_seterr(err, "model: unknown rope scaling kind %d", (int)hp->rope_scaling);
    if (check_positive("rope low_freq_factor", hp->rope_low_freq_factor, err) ||
        check_positive("rope high_freq_factor", hp->rope_high_freq_factor, err) ||
        check_range("rope original_max_position_embeddings", hp->rope_original_max_pos, 1,
                    MAX_SEQ_LEN, err))
        return -1;
    /* llama3 scaling interpolates between the two wavelength bounds; equal
     * factors would divide by zero */
    if (hp->rope_high_freq_factor <= hp->rope_low_freq_factor)
        return specd_seterr(err, "model: rope high_freq_factor (%g) must exceed low_freq_factor "
                                 "(%g)", (double)hp->rope_high_freq_factor,
                            (double)hp->rope_low_freq_factor);
    return 0;
}

static int check_hparams(const specd_llama_hparams *hp, specd_error *err) {
    if (check_range("vocab_size", hp->vocab_size, 1, MAX_VOCAB, err) ||
        check_range("dim", hp->dim, 1, MAX_DIM, err) ||
        check_range("hidden_dim", hp->hidden_dim, 1, MAX_HIDDEN, err) ||
        check_range("n_layers", hp->n_layers, 1, MAX_LAYERS, err) ||
        check_range("n_heads", hp->n_heads, 1, MAX_HEADS, err) ||
        check_range("n_kv_heads", hp->n_kv_heads, 1, hp->n_heads, err) ||
        check_range("head_dim", hp->head_dim, 2, MAX_HEAD_DIM, err) ||
        check_range("max_seq_len", hp->max_seq_len, 1, MAX_SEQ_LEN, err) ||
        check_range("bos_id", hp->bos_id, -1, hp->vocab_size - 1, err) ||
        check_range("eos_id", hp->eos_id, -1, hp->vocab_size - 1, err))
        return -1;
    if (hp->n_heads % hp->n_kv_heads)
        return specd_seterr(err, "model: n_heads (%d) is not a multiple of n_kv_heads (%d)",
                            hp->n_heads, hp->n_kv_heads);
    if (hp->head_dim % 2)
        return specd_seterr(err, "model: head_dim (%d) must be even for RoPE", hp->head_dim);
    if (!(isfinite(hp->norm_eps) && hp->norm_eps > 0 && hp->norm_eps < 1))
        return specd_seterr(err, "model: norm_eps = %g is not in (0, 1)", (double)hp->norm_eps);
    return check_rope(hp, err);
}

static void format_shape(char *out, size_t cap, const uint64_t *ne, uint32_t n_dims) {
    if (n_dims < 1) n_dims = 1;
    if (n_dims > 4) n_dims = 4;
    size_t n = (size_t)snprintf(out, cap, "[");
    for (uint32_t d = 0; d < n_dims && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%llu", d ? ", " : "",
                              (unsigned long long)ne[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

static int is_float_type(specd_dtype t) {
    return t == SPECD_F32 || t == SPECD_F16 || t == SPECD_BF16;
}

/* Checks one tensor: present, shape [ne0] (vector, ne1 == 0) or [ne0, ne1],
 * a type the forward pass computes with, and a byte size that matches. */
static int check_tensor(const specd_model_file *m, const char *name, uint64_t ne0, uint64_t ne1,
                        specd_error *err) {
    const specd_tensor *t = specd_model_tensor(m, name);
    if (!t) return specd_seterr(err, "model: tensor '%s' is missing", name);
    uint64_t want[4] = {ne0, ne1 ? ne1 : 1, 1, 1};
    if (memcmp(t->ne, want, sizeof want) != 0) {
        char have_s[96], want_s[96];
        format_shape(have_s, sizeof have_s, t->ne, t->n_dims);
        format_shape(want_s, sizeof want_s, want, ne1 ? 2 : 1);
        return specd_seterr(err, "model: tensor '%s' has shape %s, config implies %s", name,
                            have_s, want_s);
    }
    const specd_dtype_info *info = specd_dtype_get(t->type);
    const char *type_name = info ? info->name : "unknown";
    if (!ne1 && !is_float_type(t->type))
        return specd_seterr(err, "model: tensor '%s' has type %s; norm weights must be F32, F16 "
                                 "or BF16", name, type_name);
    if (!info || !info->supported)
        return specd_seterr(err, "model: tensor '%s' has type %s, which specd cannot compute with",
                            name, type_name);
    int ok;
    uint64_t nbytes = specd_dtype_nbytes(t->type, ne0 * want[1], &ok);
    if (!ok || t->nbytes != nbytes || !t->data)
        return specd_seterr(err, "model: tensor '%s' holds %llu bytes, its shape and type imply "
                                 "%llu", name, (unsigned long long)t->nbytes,
                            (unsigned long long)nbytes);
    return 0;
}

void specd_llama_layer_shapes(const specd_llama_hparams *hp, int layer,
                              specd_tensor_shape out[SPECD_LLAMA_LAYER_TENSORS]) {
    uint64_t dim = (uint64_t)hp->dim, hidden = (uint64_t)hp->hidden_dim;
    uint64_t q_dim = (uint64_t)hp->n_heads * (uint64_t)hp->head_dim;
    uint64_t kv_dim = (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim;
    const struct {
        const char *suffix;
        uint64_t ne0, ne1;
    } want[SPECD_LLAMA_LAYER_TENSORS] = {
        {"attn_norm", dim, 0},     {"attn_q", dim, q_dim},       {"attn_k", dim, kv_dim},
        {"attn_v", dim, kv_dim},   {"attn_output", q_dim, dim},  {"ffn_norm", dim, 0},
        {"ffn_gate", dim, hidden}, {"ffn_up", dim, hidden},      {"ffn_down", hidden, dim},
    };
    for (int i = 0; i < SPECD_LLAMA_LAYER_TENSORS; i++) {
        snprintf(out[i].name, sizeof out[i].name, "blk.%d.%s.weight", layer, want[i].suffix);
        out[i].ne0 = want[i].ne0;
        out[i].ne1 = want[i].ne1;
    }
}

static int check_layer(const specd_model_file *m, int l, specd_error *err) {
    specd_tensor_shape want[SPECD_LLAMA_LAYER_TENSORS];
    specd_llama_layer_shapes(&m->hp, l, want);
    for (int i = 0; i < SPECD_LLAMA_LAYER_TENSORS; i++)
        if (check_tensor(m, want[i].name, want[i].ne0, want[i].ne1, err)) return -1;
    return 0;
}

/* GGUF files of Llama 3.1-style models carry the llama3 RoPE frequency
 * factors as this optional tensor, one per rotated pair. */
static int check_rope_freqs(const specd_model_file *m, specd_error *err) {
    const specd_tensor *t = specd_model_tensor(m, "rope_freqs.weight");
    if (!t) return 0;
    uint64_t pairs = (uint64_t)m->hp.head_dim / 2;
    if (t->type != SPECD_F32 || t->ne[0] != pairs || t->ne[1] != 1 || t->ne[2] != 1 ||
        t->ne[3] != 1 || t->nbytes != pairs * 4 || !t->data)
        return specd_seterr(err, "model: tensor 'rope_freqs.weight' must be F32 [%llu]",
                            (unsigned long long)pairs);
    return 0;
}

int specd_model_validate(const specd_model_file *m, specd_error *err) {
    const specd_llama_hparams *hp = &m->hp;
    if (check_hparams(hp, err)) return -1;
    uint64_t dim = (uint64_t)hp->dim, vocab = (uint64_t)hp->vocab_size;
    if (check_tensor(m, "token_embd.weight", dim, vocab, err) ||
        check_tensor(m, "output_norm.weight", dim, 0, err) ||
        (!hp->tied_embeddings && check_tensor(m, "output.weight", dim, vocab, err)))
        return -1;
    for (int l = 0; l < hp->n_layers; l++)
        if (check_layer(m, l, err)) return -1;
    return check_rope_freqs(m, err);
}
