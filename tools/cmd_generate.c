/* cmd_generate.c - `specd generate`: plain decoding on a model file, and
 * the option parsing of both modes (with --server the request goes to a
 * running service instead: cmd_generate_remote.c).
 *
 * Local decoding is the non-speculative baseline: tokenize (optionally through the
 * model's chat template), prefill the prompt in one batched forward pass,
 * then decode one token per step, streaming text as it becomes valid UTF-8.
 * Prefill and decode tokens/s are printed at the end; every later speed-up
 * is measured against these numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tools/client.h"
#include "tools/inproc.h"
#include "tools/generate.h"
#include "common/text/chat.h"
#include "common/model/gguf.h"
#include "common/spec/sampling.h"
#include "common/text/tokenizer.h"
#include "common/model/transformer.h"

#define PREFILL_CHUNK 256

static void generate_usage(void) {
    printf("usage: specd generate [options] [PROMPT]\n"
           "\n"
           "Local decoding on a model file (default), or with --server ADDR the client of a\n"
           "running draft-svc (or target-svc with --service target).\n"
           "\n"
           "prompt and output (both modes):\n"
           "  PROMPT, -p, --prompt TEXT  prompt text; '-' reads stdin (local default: a short\n"
           "                       question; with --server the default is stdin)\n"
           "  -f, --file PATH      read the prompt from a file ('-' = stdin)\n"
           "  --chat               send the prompt as a user message in the chat template\n"
           "  --system TEXT        system message (with --chat)\n"
           "  -n, --max-tokens, --max-new-tokens N  most tokens to generate (local default\n"
           "                       128; with --server 0 = the server's default)\n"
           "  --ignore-eos         keep going past end-of-sequence tokens\n"
           "  --ids                also print the generated token ids\n");
    cli_sampling_usage(stdout);
    printf("\n"
           "local mode:\n"
           "  -m, --model PATH     .gguf file or Hugging Face directory (default %s)\n"
           "  -t, --threads N      CPU threads (default: all cores)\n"
           "  --backend cpu|cuda   compute backend for the model (and the speculator)\n"
           "                       (default cpu)\n"
           "  --device N           CUDA device id (default 0)\n"
           "  --precision P        CPU matmul: fast (int8 activations, as llama.cpp; default)\n"
           "                       or exact (fp32 activations)\n"
           "  --kv-cache-dtype T   auto (f16; f32 with --precision exact on the cpu), f32,\n"
           "                       f16 (half the KV memory; K and V rounded to fp16) or q8_0\n"
           "                       (cpu only: 53%% of f16's memory; int8 blocks of 32)\n"
           "  --speculator DIR     speculative decoding with this MLP speculator: target-svc\n"
           "                       and draft-svc run in this process and the server-mode\n"
           "                       flags below apply to them\n"
           "\n"
           "server mode:\n"
           "  --server ADDR        host:port of draft-svc or target-svc\n"
           "  --service draft|target  which service's Generate to call (default draft)\n"
           "  --prompt-ids 1,2,3   send token ids instead of text (models without tokenizer)\n"
           "  --stop STR           stop string; nothing past it is printed (repeatable)\n"
           "  --stop-id ID         stop at this token id (repeatable)\n"
           "  --drafter NAME       mlp, mlp_ngram, draft_lm, ngram or none (default: the\n"
           "                       server's; with --speculator, mlp_ngram)\n"
           "  --candidates N, --depth N  tree shape (default: the server's load-aware one)\n"
           "  --stop-threshold X   adaptive draft length (mlp with an acceptance head): stop a\n"
           "                       path once P(some token on it is rejected) > X, X < 1;\n"
           "                       negative = off (default: the server's)\n"
           "  --no-spec            no speculation: plain decoding through the target\n"
           "  --logprobs           log-probabilities of each token (shown with --json)\n"
           "  --top-logprobs N     and the N most likely alternatives (0..20)\n"
           "  --timeout SECONDS    deadline for the whole call (default: none)\n"
           "  --json               one JSON object per response message on stdout, then one\n"
           "                       with the finish reason and stats\n",
           SPECD_DEFAULT_MODEL);
    cli_tls_usage(stdout);
}

static char *read_stream(FILE *f) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) break;
        if (feof(f)) {
            buf[n] = 0;
            return buf;
        }
        if (n + 1 == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) break;
            buf = bigger;
            cap *= 2;
        }
    }
    free(buf);
    return NULL;
}

static char *read_text_file(const char *path) {
    if (!strcmp(path, "-")) return read_stream(stdin);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = read_stream(f);
    fclose(f);
    return buf;
}

int gen_prompt_text(const gen_opts *o, int want_stdin, const char **text, char **owned,
                    specd_error *err) {
    *owned = NULL;
    *text = NULL;
    /* -f wins over -p, as it always has in local mode */
    const char *file = o->prompt_file;
    if (!file && o->prompt && !strcmp(o->prompt, "-")) file = "-";
    if (!file && o->prompt) {
        *text = o->prompt;
        return 0;
    }
    if (!file && want_stdin) file = "-";
    if (!file) return 0;
    if (!(*owned = read_text_file(file)))
        return specd_seterr(err, "cannot read the prompt from %s",
                            strcmp(file, "-") ? file : "stdin");
    /* `echo PROMPT | specd generate` ends the text with the newline echo
     * adds, which the user did not mean as part of the prompt (and which
     * changes what the model writes); files are taken byte for byte. */
    size_t len = strlen(*owned);
    if (!strcmp(file, "-") && len && (*owned)[len - 1] == '\n') (*owned)[--len] = 0;
    *text = *owned;
    return 0;
}

/* Records the first flag of one mode, for the check in cmd_generate. */
static void mark(const char **slot, const char *flag) {
    if (!*slot) *slot = flag;
}

static int parse_args(int argc, char **argv, gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = SPECD_DEFAULT_MODEL;
    o->max_tokens = -1;
    cli_sampling_init(&o->samp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_sampling_option(argc, argv, &i, &o->samp)) continue;
        if (cli_tls_option(argc, argv, &i, &o->tls)) {
            mark(&o->server_only_flag, a);
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            o->model = cli_value(argc, argv, &i);
            mark(&o->local_only_flag, a);
        } else if (!strcmp(a, "--speculator")) {
            o->speculator = cli_value(argc, argv, &i);
            mark(&o->local_only_flag, a);
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->prompt_file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--system")) o->system = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens") || !strcmp(a, "--max-new-tokens"))
            o->max_tokens = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--ids")) o->print_ids = 1;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            o->threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
            mark(&o->local_only_flag, a);
        } else if (!strcmp(a, "--backend")) {
            o->backend = cli_value(argc, argv, &i);
            mark(&o->local_only_flag, a);
        } else if (!strcmp(a, "--device")) {
            o->device = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1024);
            mark(&o->local_only_flag, a);
        } else if (!strcmp(a, "--precision")) {
            o->precision = cli_precision(a, cli_value(argc, argv, &i));
            mark(&o->local_only_flag, a);
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            o->kv_dtype = cli_kv_dtype(a, cli_value(argc, argv, &i));
            mark(&o->local_only_flag, a);
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage();
            return 1;
        } else if (!strcmp(a, "--server")) {
            o->server = cli_value(argc, argv, &i);
        } else if (a[0] == '-' && a[1]) {
            /* Everything else is a server-mode flag. */
            mark(&o->server_only_flag, a);
            if (!strcmp(a, "--service")) {
                const char *v = cli_value(argc, argv, &i);
                if (strcmp(v, "draft") && strcmp(v, "target")) {
                    fprintf(stderr, "specd generate: --service is 'draft' or 'target', got '%s'\n", v);
                    return 2;
                }
                o->service_target = !strcmp(v, "target");
            } else if (!strcmp(a, "--prompt-ids")) {
                free(o->prompt_ids);
                o->n_prompt_ids = cli_int_list(a, cli_value(argc, argv, &i), 0, INT32_MAX,
                                               &o->prompt_ids);
            } else if (!strcmp(a, "--stop") || !strcmp(a, "--stop-id")) {
                int id = !strcmp(a, "--stop-id");
                if ((id ? o->n_stop_ids : o->n_stops) == GEN_MAX_STOPS) {
                    fprintf(stderr, "specd generate: %s given more than %d times\n", a,
                            GEN_MAX_STOPS);
                    return 2;
                }
                const char *v = cli_value(argc, argv, &i);
                if (id) o->stop_ids[o->n_stop_ids++] = (int32_t)cli_int(a, v, 0, INT32_MAX);
                else o->stops[o->n_stops++] = v;
            } else if (!strcmp(a, "--drafter")) o->drafter = cli_value(argc, argv, &i);
            else if (!strcmp(a, "--candidates"))
                o->candidates = (int)cli_int(a, cli_value(argc, argv, &i), 1, 64);
            else if (!strcmp(a, "--depth"))
                o->depth = (int)cli_int(a, cli_value(argc, argv, &i), 1, 64);
            else if (!strcmp(a, "--stop-threshold"))
                o->stop_threshold = (float)cli_float(a, cli_value(argc, argv, &i), -1.0, 0.999);
            else if (!strcmp(a, "--no-spec")) o->no_spec = 1;
            else if (!strcmp(a, "--logprobs")) o->logprobs = 1;
            else if (!strcmp(a, "--top-logprobs"))
                o->top_logprobs = (int)cli_int(a, cli_value(argc, argv, &i), 0, 20);
            else if (!strcmp(a, "--timeout"))
                o->timeout_s = cli_float(a, cli_value(argc, argv, &i), 0.001, 1e6);
            else if (!strcmp(a, "--json")) o->json = 1;
            else {
                fprintf(stderr, "specd generate: unknown option '%s' (see --help)\n", a);
                return 2;
            }
        } else if (!o->prompt) {
            o->prompt = a; /* the positional prompt ("-" = stdin) */
        } else {
            fprintf(stderr, "specd generate: more than one prompt ('%s'); quote the prompt\n", a);
            return 2;
        }
    }
    return 0;
}

/* The prompt as token ids: raw text, or a user turn in the chat template
 * (whose special tokens are then parsed as special). */
static int build_prompt(const gen_opts *o, const specd_tokenizer *tok, int32_t **ids,
                        size_t *n_ids, specd_error *err) {
    char *owned = NULL;
    const char *text = NULL;
    if (gen_prompt_text(o, 0, &text, &owned, err)) return -1;
    if (!text) text = "What is speculative decoding?";
    int rc;
    if (o->chat) {
        specd_chat_msg msgs[2];
        size_t n = 0;
        if (o->system) msgs[n++] = (specd_chat_msg){"system", o->system};
        msgs[n++] = (specd_chat_msg){"user", text};
        rc = specd_chat_tokenize(tok, msgs, n, ids, n_ids, err);
    } else {
        rc = specd_tokenize(tok, text, strlen(text), 0, ids, n_ids, err);
        /* models trained with a BOS token (Llama 3) expect it first; SmolLM2 not */
        if (rc == 0 && specd_tokenizer_add_bos(tok, ids, n_ids))
            rc = specd_seterr(err, "out of memory");
    }
    free(owned);
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

/* --speculator: both services in this process, on loopback, and this
 * command as their client, so local speculative decoding runs exactly the
 * code a deployment runs (draft-svc's driver and drafter, target-svc's
 * verification), gRPC hop included. */
static int generate_speculative(gen_opts *o) {
    if (o->server) {
        fprintf(stderr, "specd generate: --speculator runs the services locally; it cannot be "
                        "combined with --server\n");
        return 2;
    }
    specd_error err = {{0}};
    cli_inproc_opts io = {.model = o->model, .threads = o->threads, .backend = o->backend,
                          .device = o->device, .precision = o->precision, .kv_dtype = o->kv_dtype,
                          .max_sessions = 1, .speculator = o->speculator, .ngram = 1};
    cli_inproc *p = cli_inproc_start(&io, &err);
    if (!p) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        return 1;
    }
    o->server = cli_inproc_draft_addr(p);
    o->tls.insecure = 1; /* the in-process services serve plaintext on loopback */
    /* no --drafter: the services' default, "auto": mlp_ngram here */
    int rc = cmd_generate_remote(o);
    cli_inproc_stop(p);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) {
        free(o.prompt_ids);
        return prc == 1 ? 0 : prc;
    }
    if (o.server) {
        if (o.local_only_flag) {
            fprintf(stderr, "specd generate: %s is for local decoding; with --server the "
                            "server's model and threads are used\n", o.local_only_flag);
            free(o.prompt_ids);
            return 2;
        }
        int rrc = cmd_generate_remote(&o);
        free(o.prompt_ids);
        return rrc;
    }
    if (o.speculator) {
        int src = generate_speculative(&o);
        free(o.prompt_ids);
        return src;
    }
    if (o.server_only_flag) {
        fprintf(stderr, "specd generate: %s needs --server ADDR or --speculator DIR\n",
                o.server_only_flag);
        free(o.prompt_ids);
        return 2;
    }
    if (o.max_tokens < 0) o.max_tokens = 128;
    specd_error err = {{0}};
    const specd_sampling *sampling = cli_sampling_get(&o.samp);
    if (specd_sampling_validate(sampling, 0, &err)) {
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
    specd_token_counts counts;
    int adjust = 0, have_counts = 0;
    int rc = 1;
    if (!tok || build_prompt(&o, tok, &ids, &n_ids, &err)) goto done;
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
    specd_transformer_opts topts = {.backend = {.name = o.backend ? o.backend : "cpu",
                                                .n_threads = o.threads, .device = o.device,
                                                .precision = (specd_precision)o.precision,
                                                .kv_dtype = (specd_kv_dtype)o.kv_dtype},
                                    .n_slots = 1, .max_ctx = ctx, .max_batch = PREFILL_CHUNK};
    t = specd_transformer_create(m, &topts, &err);
    if (!t) goto done;
    int vocab = m->hp.vocab_size;
    /* now that the vocabulary is known: logit-bias ids inside it */
    if (specd_sampling_validate(sampling, vocab, &err)) goto done;
    logits = malloc(sizeof(float) * vocab);
    scratch = malloc(specd_sampling_scratch_size(vocab));
    /* Penalties depend on the tokens so far: the prompt counts as seen, the
     * output as generated (the same counts target-svc keeps per session). */
    adjust = specd_sampling_adjusts_logits(sampling);
    if (adjust) {
        if (specd_token_counts_init(&counts, vocab, &err)) goto done;
        have_counts = 1;
        for (size_t k = 0; k < n_ids; k++) specd_token_counts_add(&counts, ids[k], 0);
    }

    double t0 = cli_now();
    if (prefill(t, ids, (int)n_ids, logits, &err)) goto done;
    double t1 = cli_now();

    specd_detok detok;
    specd_detok_init(&detok, tok);
    int32_t *out_ids = malloc(sizeof(int32_t) * (o.max_tokens + 1));
    int n_gen = 0;
    const char *finish = "length";
    for (int pos = (int)n_ids; n_gen < o.max_tokens; pos++) {
        if (adjust) specd_logits_adjust(sampling, &counts, NULL, 0, logits, vocab, NULL);
        /* draw address: stream = output position, counter 0 = "the token itself" */
        int32_t next = specd_sample(sampling, logits, vocab, (uint64_t)n_gen, 0, scratch);
        out_ids[n_gen++] = next;
        if (adjust) specd_token_counts_add(&counts, next, 1);
        if (!o.ignore_eos && specd_tokenizer_is_end(tok, next)) {
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
            specd_transformer_backend_name(t), sampling->temperature > 0 ? "sampling" : "greedy");
    free(out_ids);
    rc = 0;
done:
    if (rc) fprintf(stderr, "specd generate: %s\n", err.msg);
    if (have_counts) specd_token_counts_free(&counts);
    free(scratch);
    free(logits);
    free(ids);
    specd_transformer_free(t);
    specd_tokenizer_free(tok);
    specd_model_close(m);
    return rc;
}
