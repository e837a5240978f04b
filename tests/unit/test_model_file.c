/* test_model_file.c - loading a Llama model from either format into one
 * description: a tiny GGUF and a tiny Hugging Face directory (single file
 * and sharded) written by the test, config.json parsing, the checks of
 * specd_model_validate, and the real default model when present. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/gguf.h"
#include "common/model/model_file.h"
#include "tests/harness/test_util.h"

/* The tiny model: vocab 16, dim 8, MLP 12, 2 layers, 2 heads of 4, 1 KV head. */
enum { VOCAB = 16, DIM = 8, HIDDEN = 12, LAYERS = 2, HEADS = 2, KV_HEADS = 1, HEAD_DIM = 4 };

typedef struct tdesc {
    char hf[96], gguf[96];
    int n_dims;
    uint64_t shape[2]; /* Hugging Face order: [out, in] or [n] */
} tdesc;

static int add_desc(tdesc *t, int n, const char *hf, const char *gguf, uint64_t s0, uint64_t s1) {
    snprintf(t[n].hf, sizeof t[n].hf, "%s", hf);
    snprintf(t[n].gguf, sizeof t[n].gguf, "%s", gguf);
    t[n].n_dims = s1 ? 2 : 1;
    t[n].shape[0] = s0;
    t[n].shape[1] = s1;
    return n + 1;
}

/* Every tensor of the tiny model, lm_head optional. */
static int tiny_tensors(tdesc *t, int with_lm_head) {
    int n = 0;
    n = add_desc(t, n, "model.embed_tokens.weight", "token_embd.weight", VOCAB, DIM);
    n = add_desc(t, n, "model.norm.weight", "output_norm.weight", DIM, 0);
    if (with_lm_head) n = add_desc(t, n, "lm_head.weight", "output.weight", VOCAB, DIM);
    static const struct {
        const char *hf, *gguf;
        uint64_t out, in;
    } layer[] = {
        {"input_layernorm", "attn_norm", DIM, 0},
        {"self_attn.q_proj", "attn_q", HEADS * HEAD_DIM, DIM},
        {"self_attn.k_proj", "attn_k", KV_HEADS * HEAD_DIM, DIM},
        {"self_attn.v_proj", "attn_v", KV_HEADS * HEAD_DIM, DIM},
        {"self_attn.o_proj", "attn_output", DIM, HEADS * HEAD_DIM},
        {"post_attention_layernorm", "ffn_norm", DIM, 0},
        {"mlp.gate_proj", "ffn_gate", HIDDEN, DIM},
        {"mlp.up_proj", "ffn_up", HIDDEN, DIM},
        {"mlp.down_proj", "ffn_down", DIM, HIDDEN},
    };
    for (int l = 0; l < LAYERS; l++)
        for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++) {
            char hf[96], gguf[96];
            snprintf(hf, sizeof hf, "model.layers.%d.%s.weight", l, layer[i].hf);
            snprintf(gguf, sizeof gguf, "blk.%d.%s.weight", l, layer[i].gguf);
            n = add_desc(t, n, hf, gguf, layer[i].out, layer[i].in);
        }
    return n;
}

static uint64_t numel(const tdesc *t) { return t->shape[0] * (t->n_dims == 2 ? t->shape[1] : 1); }

/* ---- byte buffers ------------------------------------------------------------ */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_le(buf *b, uint64_t v, int bytes) {
    uint8_t tmp[8];
    for (int i = 0; i < bytes; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    put(b, tmp, (size_t)bytes);
}

static void put_str(buf *b, const char *s) {
    put_le(b, strlen(s), 8);
    put(b, s, strlen(s));
}

static void put_f32(buf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_le(b, u, 4);
}

/* Tensor i's element j is i + j / 1000. */
static float tensor_value(int i, uint64_t j) { return (float)i + (float)j / 1000.0f; }

/* ---- a tiny GGUF ----------------------------------------------------------- */

typedef struct gguf_opts {
    const char *arch;     /* NULL = "llama" */
    const char *skip_key; /* leave this key out */
    int with_output;      /* write output.weight (untied) */
    int bad_q_rows;       /* blk.1.attn_q.weight gets this many rows instead */
    int rope_freqs;       /* add rope_freqs.weight [HEAD_DIM/2] */
    const char *q8_0;     /* this tensor in Q8_0 (zero blocks) instead of F32 */
} gguf_opts;

static void kv_u32(buf *b, int *n, const gguf_opts *o, const char *key, uint32_t v) {
    if (o->skip_key && strcmp(key, o->skip_key) == 0) return;
    put_str(b, key), put_le(b, GGUF_UINT32, 4), put_le(b, v, 4), (*n)++;
}

static void kv_f32(buf *b, int *n, const gguf_opts *o, const char *key, float v) {
    if (o->skip_key && strcmp(key, o->skip_key) == 0) return;
    put_str(b, key), put_le(b, GGUF_FLOAT32, 4), put_f32(b, v), (*n)++;
}

static int put_gguf_metadata(buf *b, const gguf_opts *o) {
    int n = 0;
    put_str(b, "general.architecture"), put_le(b, GGUF_STRING, 4);
    put_str(b, o->arch ? o->arch : "llama"), n++;
    kv_u32(b, &n, o, "llama.context_length", 64);
    kv_u32(b, &n, o, "llama.embedding_length", DIM);
    kv_u32(b, &n, o, "llama.feed_forward_length", HIDDEN);
    kv_u32(b, &n, o, "llama.block_count", LAYERS);
    kv_u32(b, &n, o, "llama.attention.head_count", HEADS);
    kv_u32(b, &n, o, "llama.attention.head_count_kv", KV_HEADS);
    kv_f32(b, &n, o, "llama.rope.freq_base", 50000.0f);
    kv_f32(b, &n, o, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_u32(b, &n, o, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(b, &n, o, "tokenizer.ggml.eos_token_id", 2);
    /* the vocabulary size comes from the token list */
    put_str(b, "tokenizer.ggml.tokens"), put_le(b, GGUF_ARRAY, 4), put_le(b, GGUF_STRING, 4);
    put_le(b, VOCAB, 8);
    for (int i = 0; i < VOCAB; i++) {
        char tok[16];
        snprintf(tok, sizeof tok, "t%d", i);
        put_str(b, tok);
    }
    return n + 1;
}

static buf make_gguf(const gguf_opts *o) {
    tdesc t[64];
    int n = tiny_tensors(t, o->with_output);
    if (o->rope_freqs) n = add_desc(t, n, "", "rope_freqs.weight", HEAD_DIM / 2, 0);
    for (int i = 0; i < n; i++)
        if (o->bad_q_rows && strcmp(t[i].gguf, "blk.1.attn_q.weight") == 0)
            t[i].shape[0] = (uint64_t)o->bad_q_rows;
    buf meta = {0};
    int n_kv = put_gguf_metadata(&meta, o);
    buf b = {0};
    put(&b, "GGUF", 4);
    put_le(&b, 3, 4), put_le(&b, (uint64_t)n, 8), put_le(&b, (uint64_t)n_kv, 8);
    put(&b, meta.p, meta.n);
    free(meta.p);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        put_str(&b, t[i].gguf);
        put_le(&b, (uint64_t)t[i].n_dims, 4);
        for (int d = t[i].n_dims - 1; d >= 0; d--) put_le(&b, t[i].shape[d], 8);
        const int q8 = o->q8_0 && strcmp(t[i].gguf, o->q8_0) == 0;
        put_le(&b, q8 ? SPECD_Q8_0 : SPECD_F32, 4);
        put_le(&b, off, 8);
        off += ((q8 ? numel(&t[i]) / 32 * 34 : numel(&t[i]) * 4) + 31) / 32 * 32;
    }
    while (b.n % 32) put_le(&b, 0, 1);
    for (int i = 0; i < n; i++) {
        if (o->q8_0 && strcmp(t[i].gguf, o->q8_0) == 0) {
            const uint64_t bytes = numel(&t[i]) / 32 * 34;
            for (uint64_t j = 0; j < (bytes + 31) / 32 * 32; j++) put_le(&b, 0, 1);
            continue;
        }
        uint64_t j;
        for (j = 0; j < numel(&t[i]); j++) put_f32(&b, tensor_value(i, j));
        for (; j % 8; j++) put_f32(&b, 0);
    }
    return b;
}

static specd_model_file *open_gguf(const gguf_opts *o, specd_error *err) {
    buf b = make_gguf(o);
    const char *path = test_write_temp(b.p, b.n, ".gguf");
    free(b.p);
    char keep[256];
    snprintf(keep, sizeof keep, "%s", path);
    specd_model_file *m = specd_model_open(keep, err);
    remove(keep); /* the mapping keeps the data */
    return m;
}

static void test_gguf_tiny(void **state) {
    (void)state;
    specd_error err = {{0}};
    gguf_opts o = {0};
    specd_model_file *m = open_gguf(&o, &err);
    if (!m) fail_msg("%s", err.msg);
    const specd_llama_hparams *hp = &m->hp;
    assert_int_equal(m->format, SPECD_FORMAT_GGUF);
    assert_string_equal(m->arch, "llama");
    assert_non_null(m->gguf);
    assert_int_equal(hp->vocab_size, VOCAB);
    assert_int_equal(hp->dim, DIM);
    assert_int_equal(hp->hidden_dim, HIDDEN);
    assert_int_equal(hp->n_layers, LAYERS);
    assert_int_equal(hp->n_heads, HEADS);
    assert_int_equal(hp->n_kv_heads, KV_HEADS);
    assert_int_equal(hp->head_dim, HEAD_DIM);
    assert_int_equal(hp->max_seq_len, 64);
    assert_true(hp->rope_theta == 50000.0f);
    assert_true(hp->norm_eps == 1e-5f);
    assert_int_equal(hp->rope_scaling, SPECD_ROPE_SCALING_NONE);
    assert_int_equal(hp->rope_interleaved, 1);
    assert_int_equal(hp->tied_embeddings, 1);
    assert_int_equal(hp->bos_id, 1);
    assert_int_equal(hp->eos_id, 2);
    const specd_tensor *t = specd_model_tensor(m, "blk.1.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], HIDDEN);
    assert_int_equal(t->ne[1], DIM);
    assert_int_equal(t->type, SPECD_F32);
    assert_null(specd_model_tensor(m, "output.weight"));
    /* token_embd is tensor 0 in the writer: element 3 holds 0.003 */
    assert_true(((const float *)specd_model_tensor(m, "token_embd.weight")->data)[3] == 0.003f);
    specd_model_close(m);

    o.with_output = 1;
    o.rope_freqs = 1;
    m = open_gguf(&o, &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(m->hp.tied_embeddings, 0);
    assert_non_null(specd_model_tensor(m, "rope_freqs.weight"));
    specd_model_close(m);
}

static void expect_gguf_fail(const gguf_opts *o, const char *want) {
    specd_error err = {{0}};
    specd_model_file *m = open_gguf(o, &err);
    if (m || !strstr(err.msg, want))
        fail_msg("expected failure with '%s', got '%s'", want, m ? "success" : err.msg);
}

static void test_gguf_errors(void **state) {
    (void)state;
    expect_gguf_fail(&(gguf_opts){.arch = "qwen2"},
                     "general.architecture is 'qwen2'; specd supports only 'llama'");
    expect_gguf_fail(&(gguf_opts){.skip_key = "llama.block_count"},
                     "gguf: key 'llama.block_count' not found");
    expect_gguf_fail(&(gguf_opts){.skip_key = "llama.attention.layer_norm_rms_epsilon"},
                     "layer_norm_rms_epsilon' not found");
    expect_gguf_fail(&(gguf_opts){.bad_q_rows = 7},
                     "model: tensor 'blk.1.attn_q.weight' has shape [8, 7], config implies "
                     "[8, 8]");
    /* 8 x 8 weights are two whole Q8_0 blocks, but a row of 8 ends inside
     * one: the kernels (and the K-quant tiles) walk rows block by block */
    expect_gguf_fail(&(gguf_opts){.q8_0 = "blk.1.attn_q.weight"},
                     "tensor 'blk.1.attn_q.weight': row length 8 is not a multiple of the Q8_0 "
                     "block size 32");
    specd_error err = {{0}};
    const char *path = test_write_temp("not a model", 11, ".bin");
    assert_null(specd_model_open(path, &err));
    assert_non_null(strstr(err.msg, "neither a Hugging Face model directory nor a GGUF file"));
    remove(path);
    assert_null(specd_model_open("/nonexistent/model", &err));
    assert_non_null(strstr(err.msg, "cannot open"));
}

/* ---- a tiny Hugging Face directory ------------------------------------------------ */

typedef struct hf_opts {
    const char *config;      /* NULL = the default below */
    int with_lm_head;
    int shards;              /* 0 = model.safetensors; 2 = two shards + index */
    const char *drop;        /* HF tensor to leave out */
    const char *bad_shape;   /* HF tensor whose first dim is off by one */
    const char *int_dtype;   /* HF tensor stored as I32 */
    int tokenizer;           /* write tokenizer.json */
    const char *index_shard; /* override the shard name of every index entry */
} hf_opts;

#define DEFAULT_CONFIG                                                                             \
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":16,"       \
    "\"hidden_size\":8,\"intermediate_size\":12,\"num_hidden_layers\":2,"                        \
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"max_position_embeddings\":64,"        \
    "\"rope_theta\":10000.0,\"rms_norm_eps\":1e-06,\"tie_word_embeddings\":false,"              \
    "\"bos_token_id\":1,\"eos_token_id\":[2,3],\"torch_dtype\":\"bfloat16\"}"

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* Writes tensors [from, to) of t as one safetensors file (F32 unless
 * int_dtype names the tensor). */
static void write_safetensors(const char *dir, const char *name, const tdesc *t, int from,
                              int to, const hf_opts *o) {
    buf json = {0}, data = {0};
    /* an unused tensor the loader must skip, as real checkpoints have */
    const char *head = "{\"__metadata__\":{\"format\":\"pt\"},\"model.rotary_emb.inv_freq\":"
                       "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    put(&json, head, strlen(head));
    put_f32(&data, 1.0f), put_f32(&data, 0.5f);
    for (int i = from; i < to; i++) {
        char entry[512];
        uint64_t s0 = t[i].shape[0] + (o->bad_shape && !strcmp(t[i].hf, o->bad_shape));
        const char *dtype = (o->int_dtype && !strcmp(t[i].hf, o->int_dtype)) ? "I32" : "F32";
        uint64_t n = s0 * (t[i].n_dims == 2 ? t[i].shape[1] : 1);
        char shape[64];
        if (t[i].n_dims == 2)
            snprintf(shape, sizeof shape, "[%llu,%llu]", (unsigned long long)s0,
                     (unsigned long long)t[i].shape[1]);
        else
            snprintf(shape, sizeof shape, "[%llu]", (unsigned long long)s0);
        int len = snprintf(entry, sizeof entry,
                           ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%llu]}",
                           t[i].hf, dtype, shape, data.n,
                           (unsigned long long)(data.n + n * 4));
        put(&json, entry, (size_t)len);
        for (uint64_t j = 0; j < n; j++) put_f32(&data, tensor_value(i, j));
    }
    put(&json, "}", 1);
    while (json.n % 8) put(&json, " ", 1);
    buf file = {0};
    put_le(&file, json.n, 8);
    put(&file, json.p, json.n);
    put(&file, data.p, data.n);
    write_file(dir, name, file.p, file.n);
    free(json.p), free(data.p), free(file.p);
}

static void write_index(const char *dir, const tdesc *t, int n, int split, const hf_opts *o) {
    buf json = {0};
    const char *head = "{\"metadata\":{\"total_size\":0},\"weight_map\":{";
    put(&json, head, strlen(head));
    for (int i = 0; i < n; i++) {
        char entry[256];
        const char *shard = o->index_shard ? o->index_shard
                            : i < split   ? "model-00001-of-00002.safetensors"
                                          : "model-00002-of-00002.safetensors";
        int len = snprintf(entry, sizeof entry, "%s\"%s\":\"%s\"", i ? "," : "", t[i].hf, shard);
        put(&json, entry, (size_t)len);
    }
    put(&json, "}}", 2);
    write_file(dir, "model.safetensors.index.json", json.p, json.n);
    free(json.p);
}

static void write_hf_dir(const char *dir, const hf_opts *o) {
    const char *config = o->config ? o->config : DEFAULT_CONFIG;
    write_file(dir, "config.json", config, strlen(config));
    if (o->tokenizer) write_file(dir, "tokenizer.json", "{}", 2);
    tdesc t[64], kept[64];
    int n_all = tiny_tensors(t, o->with_lm_head), n = 0;
    for (int i = 0; i < n_all; i++)
        if (!o->drop || strcmp(t[i].hf, o->drop) != 0) kept[n++] = t[i];
    if (o->shards == 0) {
        write_safetensors(dir, "model.safetensors", kept, 0, n, o);
        return;
    }
    int split = n / 2;
    write_safetensors(dir, "model-00001-of-00002.safetensors", kept, 0, split, o);
    write_safetensors(dir, "model-00002-of-00002.safetensors", kept, split, n, o);
    write_index(dir, kept, n, split, o);
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static specd_model_file *open_hf(const hf_opts *o, specd_error *err) {
    char dir[] = "/tmp/specd_hf_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_hf_dir(dir, o);
    specd_model_file *m = specd_model_open(dir, err);
    if (m && o->tokenizer) {
        char want[64];
        snprintf(want, sizeof want, "%s/tokenizer.json", dir);
        assert_string_equal(m->tokenizer_json, want);
    }
    remove_dir(dir);
    return m;
}

static void check_hf_model(const specd_model_file *m, int with_lm_head) {
    const specd_llama_hparams *hp = &m->hp;
    assert_int_equal(m->format, SPECD_FORMAT_HF);
    assert_string_equal(m->arch, "llama");
    assert_int_equal(hp->vocab_size, VOCAB);
    assert_int_equal(hp->dim, DIM);
    assert_int_equal(hp->head_dim, HEAD_DIM);
    assert_int_equal(hp->n_kv_heads, KV_HEADS);
    assert_int_equal(hp->rope_interleaved, 0);
    assert_int_equal(hp->bos_id, 1);
    assert_int_equal(hp->eos_id, 2);
    assert_true(hp->norm_eps == 1e-6f);
    assert_int_equal(hp->tied_embeddings, !with_lm_head);
    assert_int_equal(m->n_tensors, 3 + 9 * LAYERS - !with_lm_head);
    /* [out, in] in the file becomes ne = [in, out] */
    const specd_tensor *t = specd_model_tensor(m, "blk.0.attn_k.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], DIM);
    assert_int_equal(t->ne[1], KV_HEADS * HEAD_DIM);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->nbytes, DIM * KV_HEADS * HEAD_DIM * 4);
    t = specd_model_tensor(m, "token_embd.weight");
    assert_true(((const float *)t->data)[5] == tensor_value(0, 5));
    assert_null(specd_model_tensor(m, "model.rotary_emb.inv_freq"));
}

static void test_hf_single(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_model_file *m = open_hf(&(hf_opts){.with_lm_head = 1, .tokenizer = 1}, &err);
    if (!m) fail_msg("%s", err.msg);
    check_hf_model(m, 1);
    specd_model_close(m);
    m = open_hf(&(hf_opts){0}, &err);
    if (!m) fail_msg("%s", err.msg);
    check_hf_model(m, 0);
    assert_string_equal(m->tokenizer_json, "");
    specd_model_close(m);
}

static void test_hf_sharded(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_model_file *m = open_hf(&(hf_opts){.with_lm_head = 1, .shards = 2}, &err);
    if (!m) fail_msg("%s", err.msg);
    check_hf_model(m, 1);
    assert_int_equal(m->n_maps, 2);
    specd_model_close(m);
}

static void expect_hf_fail(const hf_opts *o, const char *want) {
    specd_error err = {{0}};
    specd_model_file *m = open_hf(o, &err);
    if (m || !strstr(err.msg, want))
        fail_msg("expected failure with '%s', got '%s'", want, m ? "success" : err.msg);
}

static void test_hf_errors(void **state) {
    (void)state;
    expect_hf_fail(&(hf_opts){.drop = "model.layers.1.mlp.up_proj.weight"},
                   "model: tensor 'blk.1.ffn_up.weight' is missing");
    expect_hf_fail(&(hf_opts){.bad_shape = "model.layers.0.self_attn.q_proj.weight"},
                   "model: tensor 'blk.0.attn_q.weight' has shape [8, 9], config implies [8, 8]");
    expect_hf_fail(&(hf_opts){.bad_shape = "model.norm.weight"},
                   "tensor 'output_norm.weight' has shape [9], config implies [8]");
    expect_hf_fail(&(hf_opts){.int_dtype = "model.layers.0.mlp.up_proj.weight"},
                   "hf: tensor 'model.layers.0.mlp.up_proj.weight' has dtype I32");
    expect_hf_fail(&(hf_opts){.shards = 2, .index_shard = "../evil.safetensors"},
                   "is not a plain file name");
    expect_hf_fail(&(hf_opts){.shards = 2, .index_shard = "model-00001-of-00002.safetensors"},
                   "is not in shard 'model-00001-of-00002.safetensors'");
    expect_hf_fail(&(hf_opts){.config = "{\"model_type\":\"mistral\"}"},
                   "model_type is 'mistral'; specd supports 'llama'");
    expect_hf_fail(&(hf_opts){.config = "{\"model_type\":\"llama\",\"vocab_size\":\"16\"}"},
                   "config.json: 'vocab_size' must be an integer, got a string");
    /* a directory without weights */
    char dir[] = "/tmp/specd_hf_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(dir, "config.json", DEFAULT_CONFIG, strlen(DEFAULT_CONFIG));
    specd_error err = {{0}};
    assert_null(specd_model_open(dir, &err));
    assert_non_null(strstr(err.msg, "no model.safetensors or model.safetensors.index.json"));
    remove_dir(dir);
}

/* ---- config.json ---------------------------------------------------------------- */

static int parse(const char *json, specd_llama_hparams *hp, specd_error *err) {
    return specd_hf_parse_config(json, strlen(json), hp, err);
}

#define BASE                                                                                       \
    "\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"   \
    "\"num_attention_heads\":4"

/* transformers >= 5 nests theta and scaling under rope_parameters; a loader
 * that only knew the old keys would silently use theta = 10000. */
static void test_config_rope_parameters(void **state) {
    (void)state;
    specd_llama_hparams hp;
    specd_error err = {{0}};
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":"
                           "{\"rope_theta\":500000.0,\"rope_type\":\"llama3\",\"factor\":8.0,"
                           "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8192}}",
                           &hp, &err),
                     0);
    assert_true(hp.rope_theta == 500000.0f);
    assert_int_equal(hp.rope_scaling, SPECD_ROPE_SCALING_LLAMA3);
    assert_true(hp.rope_factor == 8.0f);
    assert_int_equal(hp.rope_original_max_pos, 8192);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":"
                           "{\"rope_theta\":250000.0,\"rope_type\":\"default\"}}",
                           &hp, &err),
                     0);
    assert_true(hp.rope_theta == 250000.0f);
    assert_int_equal(hp.rope_scaling, SPECD_ROPE_SCALING_NONE);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":7}", &hp, &err),
                     -1);
    assert_non_null(strstr(err.msg, "rope_parameters"));
}

static void test_config_defaults(void **state) {
    (void)state;
    specd_llama_hparams hp;
    specd_error err = {{0}};
    assert_int_equal(parse("{\"architectures\":[\"LlamaForCausalLM\"]," BASE ",\"head_dim\":null}",
                           &hp, &err), 0);
    assert_int_equal(hp.n_kv_heads, 4);
    assert_int_equal(hp.head_dim, 16);
    assert_int_equal(hp.max_seq_len, 2048);
    assert_true(hp.rope_theta == 10000.0f);
    assert_true(hp.norm_eps == 1e-6f);
    assert_int_equal(hp.tied_embeddings, 0);
    assert_int_equal(hp.bos_id, 1);
    assert_int_equal(hp.eos_id, 2);
    assert_int_equal(hp.rope_scaling, SPECD_ROPE_SCALING_NONE);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"bos_token_id\":null,"
                           "\"eos_token_id\":[128001,128009],\"tie_word_embeddings\":true,"
                           "\"head_dim\":32,\"rope_scaling\":null}", &hp, &err), 0);
    assert_int_equal(hp.bos_id, -1);
    assert_int_equal(hp.eos_id, 128001);
    assert_int_equal(hp.tied_embeddings, 1);
    assert_int_equal(hp.head_dim, 32);
}

static void test_config_rope_scaling(void **state) {
    (void)state;
    specd_llama_hparams hp;
    specd_error err = {{0}};
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":"
                           "\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                           "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}",
                           &hp, &err), 0);
    assert_int_equal(hp.rope_scaling, SPECD_ROPE_SCALING_LLAMA3);
    assert_true(hp.rope_factor == 8.0f);
    assert_true(hp.rope_low_freq_factor == 1.0f);
    assert_true(hp.rope_high_freq_factor == 4.0f);
    assert_int_equal(hp.rope_original_max_pos, 8192);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"type\":"
                           "\"linear\",\"factor\":2}}", &hp, &err), 0);
    assert_int_equal(hp.rope_scaling, SPECD_ROPE_SCALING_LINEAR);
    assert_true(hp.rope_factor == 2.0f);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":"
                           "\"default\"}}", &hp, &err), 0);
    assert_int_equal(hp.rope_scaling, SPECD_ROPE_SCALING_NONE);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"type\":"
                           "\"yarn\",\"factor\":2}}", &hp, &err), -1);
    assert_non_null(strstr(err.msg, "rope_scaling type 'yarn' is not supported"));
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":"
                           "\"llama3\",\"factor\":8.0}}", &hp, &err), -1);
    assert_non_null(strstr(err.msg, "'low_freq_factor' is missing"));
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":[1]}", &hp,
                           &err), -1);
    assert_non_null(strstr(err.msg, "'rope_scaling' must be an object, got an array"));
}

static void test_config_errors(void **state) {
    (void)state;
    specd_llama_hparams hp;
    specd_error err = {{0}};
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{", "config.json: not valid JSON"},
        {"[]", "config.json: not a JSON object"},
        {"{" BASE "}", "neither model_type \"llama\" nor architectures"},
        {"{\"architectures\":[\"MistralForCausalLM\"]," BASE "}", "neither model_type"},
        {"{\"architectures\":\"LlamaForCausalLM\"," BASE "}",
         "'architectures' must be an array, got a string"},
        {"{\"model_type\":7," BASE "}", "'model_type' must be a string, got a number"},
        {"{\"model_type\":\"llama\",\"vocab_size\":100}", "'hidden_size' is missing"},
        {"{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":1.5}",
         "'num_key_value_heads' = 1.5 is not an integer"},
        {"{\"model_type\":\"llama\"," BASE ",\"max_position_embeddings\":1e20}",
         "'max_position_embeddings' = 1e+20 is not an integer in the int range"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_theta\":\"big\"}",
         "'rope_theta' must be a number, got a string"},
        {"{\"model_type\":\"llama\"," BASE ",\"tie_word_embeddings\":1}",
         "'tie_word_embeddings' must be true or false, got a number"},
        {"{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":\"x\"}",
         "'eos_token_id' must be an integer, got a string"},
        {"{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":[{}]}",
         "'eos_token_id' must be an integer, got an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err.msg[0] = 0;
        if (parse(cases[i].json, &hp, &err) != -1 || !strstr(err.msg, cases[i].want))
            fail_msg("case %zu: expected '%s', got '%s'", i, cases[i].want, err.msg);
    }
}

/* ---- validation of hyperparameters -------------------------------------------- */

static void test_validate_hparams(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_model_file *m = open_hf(&(hf_opts){0}, &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(specd_model_validate(m, &err), 0);
    specd_llama_hparams good = m->hp;
    static const struct {
        int field; /* which mutation */
        const char *want;
    } cases[] = {
        {0, "n_heads (3) is not a multiple of n_kv_heads (2)"},
        {1, "head_dim (3) must be even"},
        {2, "vocab_size = 8388608 is not in 1..4194304"},
        {3, "n_layers = 0 is not in 1..1024"},
        {4, "norm_eps = 0 is not in (0, 1)"},
        {5, "rope_theta = nan must be a positive number"},
        {6, "eos_id = 16 is not in -1..15"},
        {7, "rope high_freq_factor (1) must exceed low_freq_factor (1)"},
        {8, "dim = -8 is not in 1..65536"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        m->hp = good;
        switch (cases[i].field) {
        case 0: m->hp.n_heads = 3, m->hp.n_kv_heads = 2; break;
        case 1: m->hp.head_dim = 3; break;
        case 2: m->hp.vocab_size = 1 << 23; break;
        case 3: m->hp.n_layers = 0; break;
        case 4: m->hp.norm_eps = 0; break;
        case 5: m->hp.rope_theta = __builtin_nanf(""); break;
        case 6: m->hp.eos_id = VOCAB; break;
        case 7:
            m->hp.rope_scaling = SPECD_ROPE_SCALING_LLAMA3;
            m->hp.rope_factor = 8, m->hp.rope_low_freq_factor = 1;
            m->hp.rope_high_freq_factor = 1, m->hp.rope_original_max_pos = 8192;
            break;
        case 8: m->hp.dim = -8; break;
        }
        err.msg[0] = 0;
        if (specd_model_validate(m, &err) != -1 || !strstr(err.msg, cases[i].want))
            fail_msg("case %zu: expected '%s', got '%s'", i, cases[i].want, err.msg);
    }
    specd_model_close(m);
}

/* ---- the real default model --------------------------------------------------- */

static void test_real_model(void **state) {
    (void)state;
    const char *path = test_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!test_file_exists(path)) skip();
    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(path, &err);
    if (!m) fail_msg("%s", err.msg);
    const specd_llama_hparams *hp = &m->hp;
    assert_int_equal(hp->vocab_size, 49152);
    assert_int_equal(hp->dim, 576);
    assert_int_equal(hp->hidden_dim, 1536);
    assert_int_equal(hp->n_layers, 30);
    assert_int_equal(hp->n_heads, 9);
    assert_int_equal(hp->n_kv_heads, 3);
    assert_int_equal(hp->head_dim, 64);
    assert_int_equal(hp->max_seq_len, 8192);
    assert_true(hp->rope_theta == 100000.0f);
    assert_true(hp->norm_eps == 1e-5f);
    assert_int_equal(hp->rope_interleaved, 1);
    assert_int_equal(hp->tied_embeddings, 1);
    assert_int_equal(hp->bos_id, 1);
    assert_int_equal(hp->eos_id, 2);
    assert_int_equal(specd_model_validate(m, &err), 0);
    assert_int_equal(specd_model_tensor(m, "token_embd.weight")->type, SPECD_Q8_0);
    char name[96];
    for (int l = 0; l < hp->n_layers; l++) {
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        assert_int_equal(specd_model_tensor(m, name)->type, SPECD_Q4_1);
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        assert_int_equal(specd_model_tensor(m, name)->type, SPECD_Q4_1);
    }
    assert_int_equal(specd_model_tensor(m, "output_norm.weight")->type, SPECD_F32);
    specd_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_tiny),
        cmocka_unit_test(test_gguf_errors),
        cmocka_unit_test(test_hf_single),
        cmocka_unit_test(test_hf_sharded),
        cmocka_unit_test(test_hf_errors),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_config_rope_scaling),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_config_rope_parameters),
        cmocka_unit_test(test_validate_hparams),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
