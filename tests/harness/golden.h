/* golden.h - loads the reference ("golden") fixtures of tests/golden/data/<set>/.
 *
 * A fixture set is a directory holding reference.json plus raw little-endian
 * float32 files (ref/ *.f32, row-major). tests/golden/make_golden.py wrote
 * them with Hugging Face transformers; tests/golden/README.md documents the
 * schema ("specd-golden/1"). Typical use in a cmocka test:
 *
 *     specd_error err = {0};
 *     golden_set *g = golden_load(test_path("tests/golden/data/tiny-gqa"), &err);
 *     for (int i = 0; i < g->n_cases; i++) {
 *         const golden_case *c = &g->cases[i];
 *         const char *model = c->model_path;          // .gguf file or HF dir
 *         float *ref = golden_load_array(&c->logits, &err);
 *         ... run the model on c->prompt[0 .. c->n_prompt) ...
 *         golden_diff d = golden_compare(mine, ref, c->logits.rows, c->logits.cols);
 *         assert_true(golden_within(&d, g->logits_rel));
 *         free(ref);
 *     }
 *     golden_free(g);
 *
 * Everything returned by golden_load() belongs to the set and lives until
 * golden_free(); arrays from golden_load_array()/golden_read_f32() are the
 * caller's to free(). */
#ifndef SPECD_GOLDEN_H
#define SPECD_GOLDEN_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"
#include "kernels/backend.h"

typedef enum golden_positions {
    GOLDEN_POS_ALL = 0,  /* one row per prompt position */
    GOLDEN_POS_LAST = 1, /* a single row: the last prompt position */
} golden_positions;

/* A reference array stored in its own .f32 file. */
typedef struct golden_array {
    int present;               /* 0 when the case has no such array */
    char *path;                /* resolved: <set dir>/<relative path> */
    int rows, cols;
    golden_positions positions;
} golden_array;

typedef struct golden_case {
    char *name;                /* "gguf_q8_0/prompt2", "smollm2/chat4" */
    char *file_key;            /* key into format_files: "hf", "gguf_f16", ... */
    const char *model_path;    /* resolved model file/dir for file_key (owned by the set) */
    char *text;                /* the prompt text (real models); NULL for tiny models */
    int32_t *prompt;
    int n_prompt;
    golden_array logits;       /* rows x vocab_size */
    golden_array hidden;       /* rows x hidden_size: final hidden state AFTER the final norm */
    int32_t *greedy;           /* argmax continuation, no EOS stop */
    float *greedy_margins;     /* top1 - top2 logit at each greedy step */
    int n_greedy;
    float greedy_min_margin;
    int topk;                  /* k of topk_ids/topk_logits; 0 when absent */
    int32_t *topk_ids;         /* n_prompt x topk, best first (real models only) */
    float *topk_logits;        /* n_prompt x topk */
    int32_t *eos_steps;        /* greedy steps that produced EOS (real models only) */
    int n_eos_steps;
    double fp64_logits_err;    /* max |fp32 reference - fp64 recomputation| */
    int greedy_fp64_agrees;    /* 1 when the fp64 recomputation picks the same greedy tokens */
} golden_case;

typedef struct golden_config {
    int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings;
    float rms_norm_eps, rope_theta;
    int tie_word_embeddings;
    int bos_token_id, eos_token_id;      /* -1 when absent */
    char rope_type[16];                  /* "default" or "llama3" */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position_embeddings;
} golden_config;

typedef struct golden_set {
    char *dir;                 /* as given to golden_load */
    char *model;               /* "tiny-gqa", "tiny-tied", "smollm2" */
    golden_config config;
    float logits_rel;          /* tolerance: see golden_within() */
    float hidden_rel;
    int n_new;                 /* greedy tokens per case (64) */
    int n_formats;
    char **format_keys;        /* "hf", "gguf_f32", ... */
    char **format_paths;       /* resolved paths, same order */
    int n_cases;
    golden_case *cases;
} golden_set;

/* Parses <dir>/reference.json and checks it (schema, shapes, ids < vocab).
 * NULL with a message on failure. Does not open the model or .f32 files. */
golden_set *golden_load(const char *dir, specd_error *err);
void golden_free(golden_set *g);

/* Resolved path of a model file/dir by its format_files key; NULL if none. */
const char *golden_format_path(const golden_set *g, const char *key);

/* Reads a raw little-endian float32 file that must hold exactly
 * expected_count floats. malloc'd; NULL with a message on failure. */
float *golden_read_f32(const char *path, size_t expected_count, specd_error *err);
/* golden_read_f32(a->path, rows * cols). */
float *golden_load_array(const golden_array *a, specd_error *err);

typedef struct golden_diff {
    double max_abs;            /* max |got - ref| */
    double max_ref;            /* max |ref| */
    size_t worst;              /* flat index of max_abs */
    int argmax_mismatches;     /* rows whose argmax differs */
    int nonfinite;             /* got values that are NaN/Inf */
} golden_diff;

/* Compares rows x cols arrays. */
golden_diff golden_compare(const float *got, const float *ref, int rows, int cols);
/* The fixtures' rule: max_abs <= rel * max(1, max_ref), and no NaN/Inf. */
int golden_within(const golden_diff *d, double rel);
/* First step where got[] differs from c->greedy (compares min(n, n_greedy)
 * tokens); -1 when all agree. A difference at step i whose
 * c->greedy_margins[i] is below the comparison's numerical error is a
 * near-tie, not a bug: see tests/golden/README.md. */
int golden_greedy_first_diff(const golden_case *c, const int32_t *got, int n);

/* The reference a service must match: plain greedy decoding of n_gen tokens
 * after prompt[n_prompt] on a transformer of its own (CPU, one thread, one
 * slot of ctx rows; _kv: with that KV cache type). Fails the test on any
 * error. */
void golden_plain_greedy(const char *model, int ctx, const int32_t *prompt, int n_prompt,
                         int n_gen, int32_t *out);
void golden_plain_greedy_kv(const char *model, int ctx, const int32_t *prompt, int n_prompt,
                            int n_gen, specd_kv_dtype kv, int32_t *out);

#endif
