/* bench_shapes.c - in-memory model files of well-known shapes with no
 * weights (see bench_shapes.h). The tensor list mirrors what
 * specd_model_validate demands of a Llama, so the transformer meets exactly
 * the table a converted checkpoint of the same model would give it. */
#include "bench_shapes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_shape {
    const char *name;
    specd_llama_hparams hp;
    specd_dtype matrix_type; /* norms are always F32, as converters store them */
} bench_shape;

/* Llama-2-7B as Meta released it (config.json of meta-llama/Llama-2-7b-hf):
 * full multi-head attention, untied LM head, 4k context. fp16 matrices are
 * what a production server runs it in, and what the paper benchmarks. */
static const bench_shape shapes[] = {
    {"llama2-7b",
     {.vocab_size = 32000, .dim = 4096, .hidden_dim = 11008, .n_layers = 32, .n_heads = 32,
      .n_kv_heads = 32, .head_dim = 128, .max_seq_len = 4096, .rope_theta = 10000.0f,
      .rope_scaling = SPECD_ROPE_SCALING_NONE,
      /* GGUF naming implies GGUF's row order; with random weights it only
       * picks the RoPE kernel variant, and both cost the same */
      .rope_interleaved = 1, .norm_eps = 1e-5f, .tied_embeddings = 0, .bos_id = 1, .eos_id = 2},
     SPECD_F16},
    /* SmolLM2-135M (config.json of HuggingFaceTB/SmolLM2-135M-Instruct): the
     * default model's shape, so the GPU kit times it without carrying the
     * 98 MB file (on the GPU its Q4_1 matrices are fp16 anyway, see
     * cuda_weights.c: the same bytes per step as these random ones) */
    {"smollm2-135m",
     {.vocab_size = 49152, .dim = 576, .hidden_dim = 1536, .n_layers = 30, .n_heads = 9,
      .n_kv_heads = 3, .head_dim = 64, .max_seq_len = 8192, .rope_theta = 100000.0f,
      .rope_scaling = SPECD_ROPE_SCALING_NONE, .rope_interleaved = 1, .norm_eps = 1e-5f,
      .tied_embeddings = 1, .bos_id = 1, .eos_id = 2},
     SPECD_F16},
};

/* Appends one tensor with no data: ne1 == 0 makes a vector [ne0]. */
static int add(specd_model_file *m, const char *name, specd_dtype type, uint64_t ne0,
               uint64_t ne1, specd_error *err) {
    specd_tensor t = {.type = type, .n_dims = ne1 ? 2 : 1, .ne = {ne0, ne1 ? ne1 : 1, 1, 1}};
    snprintf(t.name, sizeof t.name, "%s", name);
    int ok;
    t.nbytes = specd_dtype_nbytes(type, ne0 * t.ne[1], &ok);
    if (!ok) return specd_seterr(err, "shape: tensor '%s' has an impossible size", name);
    return specd_model_add_tensor(m, &t, err);
}

/* The tensors of layer l, named and shaped as validation expects them
 * (specd_llama_layer_shapes); matrices in the shape's type, norms F32. */
static int add_layer(specd_model_file *m, int l, specd_dtype wt, specd_error *err) {
    specd_tensor_shape want[SPECD_LLAMA_LAYER_TENSORS];
    specd_llama_layer_shapes(&m->hp, l, want);
    for (int i = 0; i < SPECD_LLAMA_LAYER_TENSORS; i++)
        if (add(m, want[i].name, want[i].ne1 ? wt : SPECD_F32, want[i].ne0, want[i].ne1, err))
            return -1;
    return 0;
}

static int fill(specd_model_file *m, const bench_shape *s, specd_error *err) {
    m->hp = s->hp;
    /* format stays 0 (neither GGUF nor HF): nothing may look for a GGUF
     * handle or a tokenizer.json here, and a tokenizer load fails cleanly */
    snprintf(m->path, sizeof m->path, "%s (synthetic, random weights)", s->name);
    snprintf(m->arch, sizeof m->arch, "llama");
    uint64_t dim = (uint64_t)s->hp.dim, vocab = (uint64_t)s->hp.vocab_size;
    if (add(m, "token_embd.weight", s->matrix_type, dim, vocab, err) ||
        add(m, "output_norm.weight", SPECD_F32, dim, 0, err) ||
        (!s->hp.tied_embeddings && add(m, "output.weight", s->matrix_type, dim, vocab, err)))
        return -1;
    for (int l = 0; l < s->hp.n_layers; l++)
        if (add_layer(m, l, s->matrix_type, err)) return -1;
    /* sorted, so lookups are a binary search as for a loaded file */
    return specd_model_index_tensors(m, err);
}

specd_model_file *bench_shape_create(const char *name, specd_error *err) {
    const bench_shape *s = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, name)) s = &shapes[i];
    if (!s) {
        specd_seterr(err, "unknown --shape '%s' (known: %s)", name, SPECD_BENCH_SHAPE_NAMES);
        return NULL;
    }
    /* zeroed like specd_model_open's object, so specd_model_close can free
     * a half-built one too */
    specd_model_file *m = calloc(1, sizeof *m);
    if (!m) {
        specd_seterr(err, "shape: out of memory");
        return NULL;
    }
    if (fill(m, s, err)) {
        specd_model_close(m);
        return NULL;
    }
    return m;
}
