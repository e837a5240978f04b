/* llamacpp_logits.c - dumps llama.cpp's logits for given token ids, the
 * reference of the fast (integer-activation) CPU path.
 *
 * Built and run only by make_llamacpp_logits.sh, against llama.cpp built
 * from source (bench/llamacpp_build.sh); not part of the specd build.
 *
 *   llamacpp_logits MODEL TOP_K N_GREEDY [KV] < prompts > fixture.json
 *
 * stdin: one prompt per line, as text ("\\n" stands for a newline; special
 * tokens such as <|im_start|> are recognized), tokenized by llama.cpp's own
 * tokenizer; the fixture stores the ids, so the test needs no tokenizer. For each
 * prompt, N_GREEDY tokens are decoded greedily one at a time (argmax, ties
 * to the lower id); then prompt + continuation go through llama_decode in
 * one batch with logits for every position, and the JSON gets the tokens
 * and, per position, the TOP_K largest logits (id and value, descending)
 * and the logits of 8 fixed ids spread over the vocabulary. The KV cache is
 * fp32 (KV "f32", the default: the fast path's own arithmetic without a
 * cache rounding), or with KV "q8_0" Q8_0 for K and V (llama.cpp's
 * --cache-type-k q8_0 --cache-type-v q8_0, which needs its flash
 * attention), the reference of specd's kv_cache_dtype q8_0. Weight repacking
 * ("extra buffer types") is off: the AMX repack crashes in prefill on some
 * VMs that advertise AMX (see bench/llamacpp_yardstick.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_TOK 4096

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)text, (void)user;
}

/* Prints the row's entries: top_k (descending by logit, then ascending id)
 * and the fixed probes. */
static void print_row(const float *lg, int vocab, int top_k) {
    int *best = malloc(sizeof(int) * (size_t)top_k);
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        int pos = n;
        while (pos > 0 && lg[best[pos - 1]] < lg[i]) pos--;
        if (pos >= top_k) continue;
        if (n < top_k) n++;
        memmove(best + pos + 1, best + pos, sizeof(int) * (size_t)(n - 1 - pos));
        best[pos] = i;
    }
    printf("{\"top\": [");
    for (int k = 0; k < n; k++) printf("%s[%d, %.9g]", k ? ", " : "", best[k], lg[best[k]]);
    printf("], \"probe\": [");
    for (int k = 0; k < 8; k++) {
        int id = (int)((long)k * (vocab - 1) / 7);
        printf("%s[%d, %.9g]", k ? ", " : "", id, lg[id]);
    }
    printf("]}");
    free(best);
}

/* Decodes tok[0..n) at positions pos.. of sequence 0; logits for every
 * row when all_logits, else for the last. */
static int decode(struct llama_context *ctx, const llama_token *tok, int pos, int n,
                  int all_logits) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = tok[i];
        b.pos[i] = pos + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i == n - 1;
    }
    b.n_tokens = n;
    int r = llama_decode(ctx, b);
    llama_batch_free(b);
    return r;
}

static int argmax(const float *lg, int vocab) {
    int b = 0;
    for (int i = 1; i < vocab; i++)
        if (lg[i] > lg[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s MODEL TOP_K N_GREEDY [f32|q8_0] < prompts\n", argv[0]);
        return 2;
    }
    const int kv_q8 = argc == 5 && !strcmp(argv[4], "q8_0");
    if (argc == 5 && !kv_q8 && strcmp(argv[4], "f32")) {
        fprintf(stderr, "KV must be f32 or q8_0, got '%s'\n", argv[4]);
        return 2;
    }
    const int top_k = atoi(argv[2]), n_greedy = atoi(argv[3]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = MAX_TOK;
    cp.n_batch = cp.n_ubatch = MAX_TOK;
    cp.n_threads = cp.n_threads_batch = 2;
    /* fp32 KV cache (llama.cpp's default is fp16), or Q8_0 */
    cp.type_k = cp.type_v = kv_q8 ? GGML_TYPE_Q8_0 : GGML_TYPE_F32;
    if (kv_q8) cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED; /* a quantized V needs it */
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    static char line[1 << 16];
    int first = 1;
    printf("{\"vocab\": %d, \"top_k\": %d, \"prompts\": [\n", vocab, top_k);
    while (fgets(line, sizeof line, stdin)) {
        /* "\\n" -> newline, and the line's own newline dropped */
        char *w = line;
        for (const char *r = line; *r && *r != '\n'; r++) {
            if (r[0] == '\\' && r[1] == 'n') {
                *w++ = '\n';
                r++;
            } else {
                *w++ = *r;
            }
        }
        *w = 0;
        llama_token tok[MAX_TOK];
        int n = llama_tokenize(llama_model_get_vocab(model), line, (int32_t)strlen(line), tok,
                               MAX_TOK, false, true);
        if (n <= 0) continue;
        /* greedy continuation, one token per step */
        llama_memory_clear(llama_get_memory(ctx), true);
        if (decode(ctx, tok, 0, n, 0) != 0) return 1;
        int n_all = n;
        for (int g = 0; g < n_greedy && n_all < MAX_TOK; g++) {
            tok[n_all] = argmax(llama_get_logits_ith(ctx, -1), vocab);
            if (decode(ctx, tok + n_all, n_all, 1, 0) != 0) return 1;
            n_all++;
        }
        /* every row of prompt + continuation, from one batch */
        llama_memory_clear(llama_get_memory(ctx), true);
        if (decode(ctx, tok, 0, n_all, 1) != 0) return 1;
        printf("%s{\"n_prompt\": %d, \"tokens\": [", first ? "" : ",\n", n);
        first = 0;
        for (int i = 0; i < n_all; i++) printf("%s%d", i ? ", " : "", tok[i]);
        printf("],\n \"rows\": [");
        for (int i = 0; i < n_all; i++) {
            printf(i ? ",\n  " : "\n  ");
            print_row(llama_get_logits_ith(ctx, i), vocab, top_k);
        }
        printf("]}");
    }
    printf("\n]}\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
