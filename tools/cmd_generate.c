/* cmd_generate.c - `specd generate`: plain decoding on a model file.
 *
 * This is the non-speculative baseline: tokenize (optionally through the
 * model's chat template), prefill the prompt in one batched forward pass,
 * then decode one token per step, streaming text as it becomes valid UTF-8.
 * Prefill and decode tokens/s are printed at the end; every later speed-up
 * is measured against these numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/chat.h"
#include "common/gguf.h"
#include "common/sampling.h"
#include "common/tokenizer.h"
#include "target-svc/transformer.h"

#define PREFILL_CHUNK 256

static void generate_usage(void) {
    printf("usage: specd generate [options]\n"
           "  -m, --model PATH     .gguf file or Hugging Face directory (default %s)\n"
           "  -p, --prompt TEXT    prompt text (default: a short question)\n"
           "  -f, --file PATH      read the prompt from a file\n"
           "  --chat               wrap the prompt as a user message in the chat template\n"
           "  --system TEXT        system message (with --chat)\n"
           "  -n, --max-tokens N   most tokens to generate (default 128)\n"
           "  --temp T             temperature, 0 = greedy (default 0)\n"
           "  --top-k K            keep the K most likely tokens (0 = off)\n"
           "  --top-p P            nucleus sampling threshold (1 = off)\n"
           "  --min-p P            drop tokens below P x the top probability (0 = off)\n"
           "  --seed S             sampling seed (default 0)\n"
           "  --ignore-eos         keep going past end-of-sequence tokens\n"
           "  -t, --threads N      CPU threads (default: all cores)\n"
           "  --ids                also print the generated token ids\n",
           SPECD_DEFAULT_MODEL);
}

static char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

typedef struct gen_opts {
    const char *model, *prompt, *prompt_file, *system;
    int chat, max_tokens, threads, ignore_eos, print_ids;
    specd_sampling sampling;
} gen_opts;

static int parse_args(int argc, char **argv, gen_opts *o) {
    *o = (gen_opts){.model = SPECD_DEFAULT_MODEL,
                    .prompt = "What is speculative decoding?",
                    .max_tokens = 128,
                    .sampling = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->prompt_file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--system")) o->system = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens"))
            o->max_tokens = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--temp"))
            o->sampling.temperature = (float)cli_float(a, cli_value(argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--top-k"))
            o->sampling.top_k = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1 << 24);
        else if (!strcmp(a, "--top-p"))
            o->sampling.top_p = (float)cli_float(a, cli_value(argc, argv, &i), 1e-6, 1);
        else if (!strcmp(a, "--min-p"))
            o->sampling.min_p = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--seed"))
            o->sampling.seed = (uint64_t)cli_int(a, cli_value(argc, argv, &i), 0, 0x7fffffffffffffffL);
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--ids")) o->print_ids = 1;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            o->threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage();
            return 1;
        } else {
            fprintf(stderr, "specd generate: unknown option '%s'\n", a);
            return 2;
        }
    }
    return 0;
}

/* The prompt as token ids: raw text, or a user turn in the chat template
 * (whose special tokens are then parsed as special). */
static int build_prompt(const gen_opts *o, const specd_model_file *m, const specd_tokenizer *tok,
                        int32_t **ids, size_t *n_ids, specd_error *err) {
    char *owned = NULL;
    const char *text = o->prompt;
    if (o->prompt_file) {
        owned = read_text_file(o->prompt_file);
        if (!owned) return specd_seterr(err, "cannot read prompt file '%s'", o->prompt_file);
        text = owned;
    }
    int rc;
    if (o->chat) {
        specd_chat_msg msgs[2];
        size_t n = 0;
        if (o->system) msgs[n++] = (specd_chat_msg){"system", o->system};
        msgs[n++] = (specd_chat_msg){"user", text};
        /* GGUF files carry their template; without one, plain ChatML */
        char *tmpl = m->gguf ? gguf_get_str(m->gguf, "tokenizer.chat_template", NULL) : NULL;
        char *rendered = specd_chat_render(tmpl, msgs, n, 1, err);
        free(tmpl);
        rc = rendered ? specd_tokenize(tok, rendered, strlen(rendered), 1, ids, n_ids, err) : -1;
        free(rendered);
    } else {
        rc = specd_tokenize(tok, text, strlen(text), 0, ids, n_ids, err);
    }
    free(owned);
    /* models trained with a BOS token (Llama 3) expect it first; SmolLM2 not */
    int32_t bos = specd_tokenizer_bos(tok);
    if (rc == 0 && specd_tokenizer_wants_bos(tok) && bos >= 0) {
        int32_t *with_bos = realloc(*ids, sizeof(int32_t) * (*n_ids + 1));
        if (!with_bos) return specd_seterr(err, "out of memory");
        memmove(with_bos + 1, with_bos, sizeof(int32_t) * *n_ids);
        with_bos[0] = bos;
        *ids = with_bos;
        (*n_ids)++;
    }
    return rc;
}

/* Prefills the prompt in chunks, leaving the last position's logits. */
static int prefill(specd_transformer *t, const int32_t *ids, int n, float *logits,
                   specd_error *err) {
    for (int done = 0; done < n;) {
        int chunk = n - done < PREFILL_CHUNK ? n - done : PREFILL_CHUNK;
        int32_t last = chunk - 1;
        specd_seq_input in = {.slot = 0, .n_past = done, .n_new = chunk};
        specd_batch b = {.n_tokens = chunk, .tokens = ids + done, .n_seqs = 1, .seqs = &in,
                         .n_out = 1, .out_rows = &last, .logits = logits};
        if (specd_transformer_forward(t, &b, err)) return -1;
        done += chunk;
    }
    return 0;
}

/* End of generation: the model's EOS, or the end-of-turn / end-of-text
 * markers of ChatML models (some GGUF files name only one of them as EOS). */
static int is_end_token(const specd_tokenizer *tok, int32_t id) {
    return id == specd_tokenizer_eos(tok) || id == specd_tokenizer_token_id(tok, "<|im_end|>") ||
           id == specd_tokenizer_token_id(tok, "<|endoftext|>");
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc == 1 ? 0 : prc;
    specd_error err = {{0}};
    if (specd_sampling_validate(&o.sampling, 0, &err)) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        return 2;
    }
    specd_model_file *m = specd_model_open(o.model, &err);
    if (!m) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        return 1;
    }
    specd_tokenizer *tok = specd_tokenizer_from_model(m, &err);
    specd_transformer *t = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    void *scratch = NULL;
    int rc = 1;
    if (!tok || build_prompt(&o, m, tok, &ids, &n_ids, &err)) goto done;
    if (n_ids == 0) {
        specd_seterr(&err, "the prompt is empty after tokenization");
        goto done;
    }
    int ctx = (int)n_ids + o.max_tokens;
    if (ctx > m->hp.max_seq_len) {
        specd_seterr(&err, "prompt (%zu tokens) + --max-tokens (%d) exceeds the model context %d",
                     n_ids, o.max_tokens, m->hp.max_seq_len);
        goto done;
    }
    specd_transformer_opts topts = {.backend = {.name = "cpu", .n_threads = o.threads},
                                    .n_slots = 1, .max_ctx = ctx, .max_batch = PREFILL_CHUNK};
    t = specd_transformer_create(m, &topts, &err);
    if (!t) goto done;
    int vocab = m->hp.vocab_size;
    logits = malloc(sizeof(float) * vocab);
    scratch = malloc(specd_sampling_scratch_size(vocab));

    double t0 = cli_now();
    if (prefill(t, ids, (int)n_ids, logits, &err)) goto done;
    double t1 = cli_now();

    specd_detok detok;
    specd_detok_init(&detok, tok);
    int32_t *out_ids = malloc(sizeof(int32_t) * (o.max_tokens + 1));
    int n_gen = 0;
    const char *finish = "length";
    for (int pos = (int)n_ids; n_gen < o.max_tokens; pos++) {
        /* draw address: stream = output position, counter 0 = "the token itself" */
        int32_t next = specd_sample(&o.sampling, logits, vocab, (uint64_t)n_gen, 0, scratch);
        out_ids[n_gen++] = next;
        if (!o.ignore_eos && is_end_token(tok, next)) {
            finish = "eos";
            break;
        }
        size_t len = 0;
        const char *text = specd_detok_push(&detok, next, &len, &err);
        if (!text) {
            free(out_ids);
            specd_detok_free(&detok);
            goto done;
        }
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        if (n_gen == o.max_tokens) break;
        int32_t zero = 0;
        specd_seq_input in = {.slot = 0, .n_past = pos, .n_new = 1};
        specd_batch b = {.n_tokens = 1, .tokens = &next, .n_seqs = 1, .seqs = &in, .n_out = 1,
                         .out_rows = &zero, .logits = logits};
        if (specd_transformer_forward(t, &b, &err)) {
            free(out_ids);
            specd_detok_free(&detok);
            goto done;
        }
    }
    size_t len = 0;
    const char *tail = specd_detok_flush(&detok, &len);
    fwrite(tail, 1, len, stdout);
    specd_detok_free(&detok);
    double t2 = cli_now();
    printf("\n");
    if (o.print_ids) {
        printf("ids:");
        for (int i = 0; i < n_gen; i++) printf(" %d", out_ids[i]);
        printf("\n");
    }
    /* decode time covers n_gen-1 forward steps: the first generated token
     * comes from the prefill's logits */
    int steps = n_gen > 1 ? n_gen - 1 : 1;
    fprintf(stderr,
            "\n[specd] prompt %zu tokens, prefill %.1f ms (%.1f tokens/s); generated %d tokens "
            "(%s), decode %.1f tokens/s; backend %s, %s\n",
            n_ids, (t1 - t0) * 1e3, n_ids / (t1 - t0), n_gen, finish, steps / (t2 - t1),
            specd_transformer_backend_name(t), o.sampling.temperature > 0 ? "sampling" : "greedy");
    free(out_ids);
    rc = 0;
done:
    if (rc) fprintf(stderr, "specd generate: %s\n", err.msg);
    free(scratch);
    free(logits);
    free(ids);
    specd_transformer_free(t);
    specd_tokenizer_free(tok);
    specd_model_close(m);
    return rc;
}
