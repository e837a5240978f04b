/* cmd_eval.c - `specd eval`: how good a speculator is.
 *
 * Decodes a prompt set greedily to the end of every prompt, once plainly and
 * once per speculation setting, in process with the real drafter and the
 * real target code (tools/train/eval.h: target-svc's session and scheduler,
 * no gRPC), and prints:
 *
 *   - IBM's table ("Accelerating Production LLMs with Combined Token/
 *     Embedding Speculators"): tau, the mean accepted length, per prompt
 *     kind (chat, code, math, all) for each number of candidates k and of
 *     heads (tree depth);
 *   - SpecDec++'s table: for fixed depths 1..n_predict and for the adaptive
 *     policy (the acceptance head stops a path once 1 - prod p_accept
 *     exceeds a threshold), with k = 1 and with the largest k: tau, discard
 *     rate (drafted-but-rejected tokens per generated token), verification
 *     rate (target forward passes per generated token) and drafted tokens per
 *     tree step.
 *
 * tau = generated tokens / target forward passes, the prefill included, as
 * the services report it (GenerateStats.mean_accepted_length): plain
 * decoding has tau = 1 exactly. Every speculative token is checked against
 * the plain greedy output on the fly; a difference is a losslessness bug and
 * stops the run (exit status 3). Wall times are whole runs over all prompts
 * on this machine's backend (CPU here), secondary to tau, which does not
 * depend on the machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "common/util/cpu_count.h"
#include "common/model/model_file.h"
#include "common/rpc/prompt.h"
#include "common/text/tokenizer.h"
#include "draft-svc/draft_config.h"
#include "draft-svc/drafter.h"
#include "draft-svc/policy.h"
#include "tools/train/corpus.h"
#include "tools/train/eval.h"

#define EVAL_DEFAULT_PROMPTS "bench/eval-prompts.jsonl"
#define EVAL_MAX_KINDS 16
#define EVAL_MAX_LIST 32
#define EVAL_EXIT_MISMATCH 3

static void eval_usage(void) {
    printf("usage: specd eval [options]\n"
           "\n"
           "How good a speculator is: greedy speculative decoding of every prompt to its end\n"
           "with the real drafter and target code (in process, no gRPC), checked token for\n"
           "token against plain greedy decoding. Prints tau per prompt kind x candidates x\n"
           "heads (IBM) and fixed vs adaptive length (SpecDec++) as Markdown tables.\n"
           "\n"
           "  -m, --model PATH       target .gguf or Hugging Face directory\n"
           "                         (default %s)\n"
           "  --speculator DIR       MLPSpeculator directory (default\n"
           "                         %s); with DIR/accept_head/\n"
           "                         the adaptive rows are measured too\n"
           "  --accept-head DIR      the acceptance head, if not DIR/accept_head/\n"
           "  --drafter NAME         mlp (the speculator alone) or mlp_ngram (the speculator\n"
           "                         and suffix decoding over each prompt and its output in\n"
           "                         one tree, draft-svc's default drafter; default mlp)\n"
           "  --quant Q              the speculator's matrices: none (as stored, default),\n"
           "                         q8_0 or q4_1_head, as draft-svc's drafter.mlp.quantize\n"
           "  --lookup-shape KxD     mlp_ngram: the lookup's part of every tree, up to K\n"
           "                         candidates x D deep, beside the speculator's k x heads\n"
           "                         (default 4x6, draft-svc's speculation.max_shape)\n"
           "  --prompts FILE         JSONL, one {\"prompt\": ..., \"kind\": \"chat\"|\"code\"|\"math\"}\n"
           "                         per line, sent as a user message through the model's\n"
           "                         chat template (default %s)\n"
           "  --limit N              at most N prompts of each kind (default: all)\n"
           "  -n, --max-new-tokens N most tokens per prompt (default 128)\n"
           "  --ks LIST              candidates k (default 1,2,4,8)\n"
           "  --heads LIST           depths (default 1..n_predict)\n"
           "  --top-k LIST           children per node at each depth (default: the\n"
           "                         checkpoint's top_k_tokens_per_head, which caps how many\n"
           "                         of the k candidates exist at the first depths)\n"
           "  --thresholds LIST      adaptive stop thresholds (default 0.3,0.5,0.7,0.9)\n"
           "  --min-depth N          adaptive: drafted tokens before a path may stop (default 1)\n"
           "  -b, --batch N          prompts decoded together, one target pass for all\n"
           "                         (default 4; changes the speed, never a token)\n"
           "  -t, --threads N        CPU threads (default: all cores)\n"
           "  --backend cpu|cuda     the target's compute backend (default cpu; the\n"
           "                         speculator always runs on the CPU)\n"
           "  --json                 one JSON object instead of the tables\n",
           SPECD_DEFAULT_MODEL, SPECD_DEFAULT_SPECULATOR, EVAL_DEFAULT_PROMPTS);
}

typedef struct eval_opts {
    const char *model, *speculator, *accept_head, *prompts, *backend;
    const char *drafter; /* "mlp" or "mlp_ngram" */
    int lookup;          /* drafter is mlp_ngram: its lookup part has a shape */
    int lookup_k, lookup_d;
    int max_new, threads, limit, lanes, min_depth, json;
    int quant; /* specd_mlp_quant, by its name in specd_mlp_quant_names */
    int32_t *ks, *heads, *top_k;
    int n_ks, n_heads, n_top_k; /* n_heads 0 = 1..n_predict; n_top_k 0 = the checkpoint's */
    float thresholds[EVAL_MAX_LIST];
    int n_thresholds;
} eval_opts;

/* "0.3,0.5" into o->thresholds, each in (0, 1). */
static void parse_thresholds(const char *opt, const char *val, eval_opts *o) {
    char *buf = strdup(val), *save = NULL;
    if (!buf) {
        fprintf(stderr, "specd eval: out of memory\n");
        exit(1);
    }
    o->n_thresholds = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->n_thresholds == EVAL_MAX_LIST) {
            fprintf(stderr, "specd eval: %s takes at most %d values\n", opt, EVAL_MAX_LIST);
            exit(2);
        }
        double v = cli_float(opt, tok, 1e-6, 1.0 - 1e-6);
        o->thresholds[o->n_thresholds++] = (float)v;
    }
    free(buf);
    if (o->n_thresholds == 0) {
        fprintf(stderr, "specd eval: %s expects a comma-separated list, got '%s'\n", opt, val);
        exit(2);
    }
}

static int parse_args(int argc, char **argv, eval_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = SPECD_DEFAULT_MODEL;
    o->prompts = EVAL_DEFAULT_PROMPTS;
    o->backend = "cpu";
    o->max_new = 128;
    o->lanes = 4;
    o->min_depth = 1;
    o->drafter = "mlp";
    o->lookup_k = 4;
    o->lookup_d = 6;
    static const float default_thresholds[] = {0.3f, 0.5f, 0.7f, 0.9f};
    memcpy(o->thresholds, default_thresholds, sizeof default_thresholds);
    o->n_thresholds = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--speculator")) o->speculator = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--accept-head")) o->accept_head = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--drafter")) {
            o->drafter = cli_value(argc, argv, &i);
            if (strcmp(o->drafter, "mlp") && strcmp(o->drafter, "mlp_ngram")) {
                fprintf(stderr, "specd eval: --drafter: expected mlp or mlp_ngram, got '%s'\n",
                        o->drafter);
                return 2;
            }
            o->lookup = !strcmp(o->drafter, "mlp_ngram");
        } else if (!strcmp(a, "--quant")) {
            const char *q = cli_value(argc, argv, &i);
            for (o->quant = 0; specd_mlp_quant_names[o->quant] &&
                               strcmp(q, specd_mlp_quant_names[o->quant]);
                 o->quant++) {
            }
            if (!specd_mlp_quant_names[o->quant]) {
                fprintf(stderr, "specd eval: --quant: expected none, q8_0 or q4_1_head, got '%s'\n",
                        q);
                return 2;
            }
        } else if (!strcmp(a, "--lookup-shape")) {
            /* draft-svc's speculation.max_shape rule, which it stands for */
            specd_policy shape = {0};
            specd_error err = {{0}};
            if (specd_policy_parse_shape(&shape, cli_value(argc, argv, &i), a, &err)) {
                fprintf(stderr, "specd eval: %s\n", err.msg);
                return 2;
            }
            o->lookup_k = shape.max_candidates;
            o->lookup_d = shape.max_depth;
        }
        else if (!strcmp(a, "--prompts")) o->prompts = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--limit")) o->limit = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens"))
            o->max_new = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--ks")) {
            free(o->ks);
            o->n_ks = cli_int_list(a, cli_value(argc, argv, &i), 1, 64, &o->ks);
        } else if (!strcmp(a, "--heads")) {
            free(o->heads);
            o->n_heads = cli_int_list(a, cli_value(argc, argv, &i), 1, 64, &o->heads);
        } else if (!strcmp(a, "--top-k")) {
            free(o->top_k);
            o->n_top_k = cli_int_list(a, cli_value(argc, argv, &i), 1, 1 << 20, &o->top_k);
        } else if (!strcmp(a, "--thresholds")) parse_thresholds(a, cli_value(argc, argv, &i), o);
        else if (!strcmp(a, "--min-depth"))
            o->min_depth = (int)cli_int(a, cli_value(argc, argv, &i), 0, 64);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch"))
            o->lanes = (int)cli_int(a, cli_value(argc, argv, &i), 1, 256);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            o->threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--backend")) o->backend = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            eval_usage();
            return 1;
        } else {
            fprintf(stderr, "specd eval: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o->ks) {
        static const char def_ks[] = "1,2,4,8";
        o->n_ks = cli_int_list("--ks", def_ks, 1, 64, &o->ks);
    }
    return 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode);
}

/* ---- prompts ------------------------------------------------------------------------ */

typedef struct prompt_set {
    eval_prompt *p;
    int *kind; /* index into kinds */
    int n, max_len;
    char kinds[EVAL_MAX_KINDS][CORPUS_MAX_KIND + 1];
    int n_kinds;
    int per_kind[EVAL_MAX_KINDS];
} prompt_set;

static void prompt_set_free(prompt_set *s) {
    for (int i = 0; i < s->n; i++) free((void *)s->p[i].ids);
    free(s->p);
    free(s->kind);
}

static int kind_index(prompt_set *s, const char *kind, specd_error *err) {
    const char *k = kind[0] ? kind : "other";
    for (int i = 0; i < s->n_kinds; i++)
        if (!strcmp(s->kinds[i], k)) return i;
    if (s->n_kinds == EVAL_MAX_KINDS)
        return specd_seterr(err, "more than %d prompt kinds", EVAL_MAX_KINDS);
    snprintf(s->kinds[s->n_kinds], sizeof s->kinds[0], "%s", k);
    return s->n_kinds++;
}

/* Reads the JSONL prompts (kinds in file order, at most `limit` each) and
 * renders each as a user message through the model's chat template, with
 * the services' own request path (common/prompt.h). */
static int load_prompts(const eval_opts *o, const specd_tokenizer *tok, int vocab,
                        prompt_set *s, specd_error *err) {
    memset(s, 0, sizeof *s);
    corpus c;
    memset(&c, 0, sizeof c);
    if (corpus_read_file(&c, o->prompts, err)) return -1;
    int rc = -1, skipped = 0;
    s->p = calloc(c.n_docs ? c.n_docs : 1, sizeof *s->p);
    s->kind = calloc(c.n_docs ? c.n_docs : 1, sizeof *s->kind);
    if (!s->p || !s->kind) {
        specd_seterr(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < c.n_docs; i++) {
        const corpus_doc *d = &c.docs[i];
        if (!d->is_prompt) { /* a "text" document: training data, not a prompt */
            skipped++;
            continue;
        }
        int k = kind_index(s, d->kind, err);
        if (k < 0) goto out;
        if (o->limit && s->per_kind[k] >= o->limit) continue;
        Specd__V1__ChatMessage msg = SPECD__V1__CHAT_MESSAGE__INIT;
        msg.role = "user";
        msg.content = d->text;
        Specd__V1__ChatMessage *mp = &msg;
        Specd__V1__ChatMessages chat = SPECD__V1__CHAT_MESSAGES__INIT;
        chat.n_messages = 1;
        chat.messages = &mp;
        Specd__V1__GenerateRequest req = SPECD__V1__GENERATE_REQUEST__INIT;
        req.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_CHAT;
        req.chat = &chat;
        int32_t *ids = NULL;
        size_t n = 0;
        if (specd_prompt_from_request(tok, &req, vocab, 0, &ids, &n, err)) {
            free(ids);
            specd_preferr(err, "%s: prompt %zu", o->prompts, i + 1);
            goto out;
        }
        s->p[s->n] = (eval_prompt){ids, (int)n};
        s->kind[s->n++] = k;
        s->per_kind[k]++;
        if ((int)n > s->max_len) s->max_len = (int)n;
    }
    if (skipped)
        fprintf(stderr, "specd eval: %s: skipped %d documents without a \"prompt\" key\n",
                o->prompts, skipped);
    if (s->n == 0) {
        specd_seterr(err, "%s holds no prompts", o->prompts);
        goto out;
    }
    rc = 0;
out:
    corpus_free(&c);
    return rc;
}

/* ---- settings and results --------------------------------------------------------- */

typedef struct eval_row {
    eval_config c;
    eval_stats *st; /* per prompt */
    double wall_s;
} eval_row;

typedef struct eval_rows {
    eval_row *r;
    int n, cap;
} eval_rows;

/* The row for a setting, added once however many tables show it. */
static int row_index(eval_rows *rows, eval_config c) {
    for (int i = 0; i < rows->n; i++)
        if (!memcmp(&rows->r[i].c, &c, sizeof c)) return i;
    if (rows->n == rows->cap) {
        int cap = rows->cap ? rows->cap * 2 : 32;
        eval_row *r = realloc(rows->r, sizeof *r * (size_t)cap);
        if (!r) {
            fprintf(stderr, "specd eval: out of memory\n");
            exit(1);
        }
        rows->r = r;
        rows->cap = cap;
    }
    rows->r[rows->n] = (eval_row){.c = c};
    return rows->n++;
}

static eval_config fixed(int k, int depth) { return (eval_config){k, depth, 0.0f, 0, 0, 0}; }

/* Sums of one row over the prompts of one kind (-1 = all). */
typedef struct eval_sum {
    int prompts;
    long generated, steps, drafted, accepted;
} eval_sum;

static eval_sum sum_kind(const eval_stats *st, const prompt_set *ps, int kind) {
    eval_sum s = {0};
    for (int i = 0; i < ps->n; i++) {
        if (kind >= 0 && ps->kind[i] != kind) continue;
        s.prompts++;
        s.generated += st[i].generated;
        s.steps += st[i].steps;
        s.drafted += st[i].drafted;
        s.accepted += st[i].accepted;
    }
    return s;
}

static double tau(const eval_sum *s) { return s->steps ? (double)s->generated / s->steps : 0; }
static double discard_rate(const eval_sum *s) {
    return s->generated ? (double)(s->drafted - s->accepted) / s->generated : 0;
}
static double verification_rate(const eval_sum *s) {
    return s->generated ? (double)s->steps / s->generated : 0;
}
/* Tree steps are the passes after each prompt's prefill. */
static double drafted_per_step(const eval_sum *s) {
    long tree_steps = s->steps - s->prompts;
    return tree_steps > 0 ? (double)s->drafted / tree_steps : 0;
}

/* Kinds in display order: chat, code, math (the set IBM reports), then any
 * others as they came. */
static int kind_order(const prompt_set *ps, int *order) {
    static const char *first[] = {"chat", "code", "math"};
    int n = 0;
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < ps->n_kinds; k++)
            if (!strcmp(ps->kinds[k], first[f])) order[n++] = k;
    for (int k = 0; k < ps->n_kinds; k++) {
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= order[j] == k;
        if (!seen) order[n++] = k;
    }
    return n;
}

static void policy_name(const eval_config *c, char *buf, size_t cap) {
    if (c->stop_threshold > 0)
        snprintf(buf, cap, "adaptive %.2f (depth <= %d)", c->stop_threshold, c->depth);
    else
        snprintf(buf, cap, "fixed depth %d", c->depth);
}

/* ---- output --------------------------------------------------------------------------- */

typedef struct eval_report {
    const eval_opts *o;
    const char *speculator, *accept_head; /* accept_head NULL = none */
    const prompt_set *ps;
    const eval_rows *rows;
    eval_stats *plain;
    double plain_wall;
    int n_predict, lanes, threads;
    const char *backend;
    int *grid; /* [n_ks][n_heads] row indices */
    int n_heads;
    int spd_ks[2], n_spd_ks;
    int *spd;  /* [n_spd_ks][n_predict + n_thresholds] row indices, -1 = skipped */
    int n_spd_cols;
    const char *adaptive_note; /* why the adaptive rows are missing, or NULL */
} eval_report;

static void print_markdown(const eval_report *R) {
    const eval_opts *o = R->o;
    const prompt_set *ps = R->ps;
    int order[EVAL_MAX_KINDS];
    int nk = kind_order(ps, order);
    printf("## specd eval\n\n");
    printf("target %s, speculator %s (n_predict %d)", o->model, R->speculator, R->n_predict);
    if (o->lookup)
        printf(", drafter mlp_ngram (every tree also holds suffix decoding's drafts over the "
               "prompt and its output, up to %dx%d)", o->lookup_k, o->lookup_d);
    printf("; %d prompts (", ps->n);
    for (int j = 0; j < nk; j++)
        printf("%s%s %d", j ? ", " : "", ps->kinds[order[j]], ps->per_kind[order[j]]);
    printf(") through the chat template, greedy, up to %d new tokens each", o->max_new);
    if (R->accept_head) printf("; acceptance head %s", R->accept_head);
    printf("; speculator matrices %s", specd_mlp_quant_names[o->quant]);
    printf(".\n\n");
    printf("tau = generated tokens / target forward passes, the prefill included (plain "
           "decoding: 1.00). Every output was checked token for token against plain greedy "
           "decoding. Wall time: all prompts, %d per target pass, backend %s, %d CPU threads "
           "(a secondary measure: tau does not depend on the machine).\n\n",
           R->lanes, R->backend, R->threads);

    printf("### tau by candidates and heads (IBM)\n\n| k | heads |");
    for (int j = 0; j < nk; j++) printf(" %s |", ps->kinds[order[j]]);
    printf(" all | wall s (%s) |\n|--:|------:|", R->backend);
    for (int j = 0; j <= nk; j++) printf("-----:|");
    printf("-------:|\n");
    eval_sum s;
    printf("| plain | - |");
    for (int j = 0; j < nk; j++) {
        s = sum_kind(R->plain, ps, order[j]);
        printf(" %.2f |", tau(&s));
    }
    s = sum_kind(R->plain, ps, -1);
    printf(" %.2f | %.1f |\n", tau(&s), R->plain_wall);
    for (int ki = 0; ki < o->n_ks; ki++)
        for (int hi = 0; hi < R->n_heads; hi++) {
            const eval_row *row = &R->rows->r[R->grid[ki * R->n_heads + hi]];
            printf("| %d | %d |", row->c.candidates, row->c.depth);
            for (int j = 0; j < nk; j++) {
                s = sum_kind(row->st, ps, order[j]);
                printf(" %.2f |", tau(&s));
            }
            s = sum_kind(row->st, ps, -1);
            printf(" %.2f | %.1f |\n", tau(&s), row->wall_s);
        }

    printf("\n### fixed vs adaptive length (SpecDec++), all prompts\n\n");
    printf("discard rate = drafted-but-rejected tokens per generated token; verification rate = "
           "target passes per generated token; drafted/step over tree steps.\n\n");
    printf("| k | policy | tau | discard rate | verification rate | drafted/step | wall s (%s) |\n"
           "|--:|:-------|----:|-------------:|------------------:|-------------:|-------:|\n",
           R->backend);
    for (int ki = 0; ki < R->n_spd_ks; ki++)
        for (int col = 0; col < R->n_spd_cols; col++) {
            int idx = R->spd[ki * R->n_spd_cols + col];
            if (idx < 0) continue;
            const eval_row *row = &R->rows->r[idx];
            char name[64];
            policy_name(&row->c, name, sizeof name);
            s = sum_kind(row->st, ps, -1);
            printf("| %d | %s | %.2f | %.3f | %.3f | %.2f | %.1f |\n", row->c.candidates, name,
                   tau(&s), discard_rate(&s), verification_rate(&s), drafted_per_step(&s),
                   row->wall_s);
        }
    if (R->adaptive_note) printf("\nadaptive rows skipped: %s\n", R->adaptive_note);
}

static cJSON *json_sum(const eval_sum *s) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "prompts", s->prompts);
    cJSON_AddNumberToObject(j, "generated", (double)s->generated);
    cJSON_AddNumberToObject(j, "steps", (double)s->steps);
    cJSON_AddNumberToObject(j, "drafted", (double)s->drafted);
    cJSON_AddNumberToObject(j, "accepted", (double)s->accepted);
    cJSON_AddNumberToObject(j, "tau", tau(s));
    cJSON_AddNumberToObject(j, "discard_rate", discard_rate(s));
    cJSON_AddNumberToObject(j, "verification_rate", verification_rate(s));
    cJSON_AddNumberToObject(j, "drafted_per_step", drafted_per_step(s));
    return j;
}

static cJSON *json_kinds(const eval_stats *st, const prompt_set *ps) {
    cJSON *j = cJSON_CreateObject();
    for (int k = 0; k < ps->n_kinds; k++) {
        eval_sum s = sum_kind(st, ps, k);
        cJSON_AddItemToObject(j, ps->kinds[k], json_sum(&s));
    }
    eval_sum s = sum_kind(st, ps, -1);
    cJSON_AddItemToObject(j, "all", json_sum(&s));
    return j;
}

static int print_json(const eval_report *R) {
    const eval_opts *o = R->o;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddStringToObject(root, "speculator", R->speculator);
    cJSON_AddNumberToObject(root, "n_predict", R->n_predict);
    cJSON_AddStringToObject(root, "drafter", o->drafter);
    if (o->lookup) {
        cJSON_AddNumberToObject(root, "lookup_candidates", o->lookup_k);
        cJSON_AddNumberToObject(root, "lookup_depth", o->lookup_d);
    }
    if (R->accept_head) cJSON_AddStringToObject(root, "accept_head", R->accept_head);
    cJSON_AddStringToObject(root, "prompts_file", o->prompts);
    cJSON_AddStringToObject(root, "speculator_quant", specd_mlp_quant_names[o->quant]);
    cJSON_AddNumberToObject(root, "max_new_tokens", o->max_new);
    cJSON_AddNumberToObject(root, "batch", R->lanes);
    cJSON_AddStringToObject(root, "backend", R->backend);
    cJSON_AddNumberToObject(root, "threads", R->threads);
    cJSON_AddStringToObject(root, "tau_definition",
                            "generated tokens / target forward passes, prefill included");
    cJSON *plain = cJSON_AddObjectToObject(root, "plain");
    cJSON_AddNumberToObject(plain, "wall_s", R->plain_wall);
    cJSON_AddItemToObject(plain, "kinds", json_kinds(R->plain, R->ps));
    cJSON *arr = cJSON_AddArrayToObject(root, "configs");
    for (int i = 0; i < R->rows->n; i++) {
        const eval_row *row = &R->rows->r[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "candidates", row->c.candidates);
        cJSON_AddNumberToObject(j, "depth", row->c.depth);
        cJSON_AddStringToObject(j, "policy", row->c.stop_threshold > 0 ? "adaptive" : "fixed");
        if (row->c.stop_threshold > 0) {
            cJSON_AddNumberToObject(j, "stop_threshold", row->c.stop_threshold);
            cJSON_AddNumberToObject(j, "min_depth", row->c.min_depth);
        }
        cJSON_AddNumberToObject(j, "wall_s", row->wall_s);
        cJSON_AddItemToObject(j, "kinds", json_kinds(row->st, R->ps));
        cJSON_AddItemToArray(arr, j);
    }
    if (R->adaptive_note) cJSON_AddStringToObject(root, "adaptive_skipped", R->adaptive_note);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return -1;
    printf("%s\n", text);
    free(text);
    return 0;
}

/* ---- the command ----------------------------------------------------------------------- */

int cmd_eval(int argc, char **argv) {
    eval_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) {
        free(o.ks);
        free(o.heads);
        free(o.top_k);
        return prc == 1 ? 0 : prc;
    }
    int rc = 1;
    specd_error err = {{0}};
    specd_model_file *m = NULL;
    specd_tokenizer *tok = NULL;
    specd_drafter *mlp = NULL, *ngram = NULL, *d = NULL; /* d: the one measured */
    eval_target *t = NULL;
    prompt_set ps;
    memset(&ps, 0, sizeof ps);
    eval_rows rows = {0};
    eval_output *ref = NULL;
    eval_stats *plain = NULL;
    int *grid = NULL, *spd = NULL;
    char accept_dir[4096];

    const char *spec_dir = o.speculator;
    if (!spec_dir) {
        if (!is_dir(SPECD_DEFAULT_SPECULATOR)) {
            fprintf(stderr, "specd eval: no speculator: pass --speculator DIR (there is none at "
                            "%s)\n", SPECD_DEFAULT_SPECULATOR);
            rc = 2;
            goto done;
        }
        spec_dir = SPECD_DEFAULT_SPECULATOR;
    }
    if (!(m = specd_model_open(o.model, &err))) goto done;
    if (!(tok = specd_tokenizer_from_model(m, &err))) goto done;
    int vocab = m->hp.vocab_size;
    if (load_prompts(&o, tok, vocab, &ps, &err)) goto done;

    /* SpecDec++ needs the acceptance head; without one the adaptive rows
     * would silently be fixed-depth ones, so they are left out. The head
     * changes nothing in the fixed rows (stop_threshold 0). */
    if (o.accept_head) snprintf(accept_dir, sizeof accept_dir, "%s", o.accept_head);
    else snprintf(accept_dir, sizeof accept_dir, "%s/accept_head", spec_dir);
    int adaptive = is_dir(accept_dir);
    if (o.accept_head && !adaptive) {
        specd_seterr(&err, "--accept-head %s is not a directory", o.accept_head);
        goto done;
    }
    char note[4200];
    snprintf(note, sizeof note, "%s has no accept_head/ (train one: specd train accept-head)",
             spec_dir);
    if (!adaptive) fprintf(stderr, "specd eval: note: adaptive rows skipped: %s\n", note);

    specd_mlp_drafter_opts mo = {.path = spec_dir, .n_threads = o.threads, .max_batch = o.lanes,
                                 .accept_head = adaptive ? accept_dir : NULL, .quant = o.quant};
    int n_topk_opts = (int)(sizeof mo.top_k_per_stage / sizeof mo.top_k_per_stage[0]);
    if (o.n_top_k > n_topk_opts) {
        specd_seterr(&err, "--top-k takes at most %d values", n_topk_opts);
        goto done;
    }
    for (int i = 0; i < o.n_top_k; i++) mo.top_k_per_stage[i] = o.top_k[i];
    if (!(mlp = specd_mlp_drafter_create(&mo, &err))) goto done;
    int n_predict = mlp->max_depth;
    d = mlp;
    if (o.lookup) {
        /* draft-svc's defaults: suffix decoding over each request's own
         * prompt and output (no shared cache) */
        specd_ngram_drafter_opts no = {.vocab = vocab};
        if (!(ngram = specd_ngram_drafter_create(&no, &err))) goto done;
        specd_hybrid_drafter_opts ho = {.model = mlp, .lookup = ngram};
        if (!(d = specd_hybrid_drafter_create(&ho, &err))) goto done;
    }
    int n_heads = o.n_heads;
    int32_t *heads = o.heads;
    int32_t def_heads[64];
    if (!heads) {
        for (int i = 0; i < n_predict; i++) def_heads[i] = i + 1;
        heads = def_heads;
        n_heads = n_predict;
    }
    for (int i = 0; i < n_heads; i++)
        if (heads[i] > n_predict) {
            specd_seterr(&err, "--heads %d: the speculator has %d heads (n_predict)", heads[i],
                         n_predict);
            goto done;
        }

    /* Every setting the two tables show, each measured once. */
    int kmax = 0;
    for (int i = 0; i < o.n_ks; i++) kmax = o.ks[i] > kmax ? o.ks[i] : kmax;
    grid = malloc(sizeof(int) * (size_t)(o.n_ks * n_heads));
    int spd_ks[2] = {1, kmax}, n_spd_ks = kmax > 1 ? 2 : 1;
    int n_spd_cols = n_predict + o.n_thresholds;
    spd = malloc(sizeof(int) * (size_t)(n_spd_ks * n_spd_cols));
    if (!grid || !spd) {
        specd_seterr(&err, "out of memory");
        goto done;
    }
    for (int ki = 0; ki < o.n_ks; ki++)
        for (int hi = 0; hi < n_heads; hi++)
            grid[ki * n_heads + hi] = row_index(&rows, fixed(o.ks[ki], heads[hi]));
    for (int ki = 0; ki < n_spd_ks; ki++) {
        for (int dd = 1; dd <= n_predict; dd++)
            spd[ki * n_spd_cols + dd - 1] = row_index(&rows, fixed(spd_ks[ki], dd));
        for (int ti = 0; ti < o.n_thresholds; ti++) {
            int min_depth = o.min_depth < n_predict ? o.min_depth : n_predict;
            eval_config c = {spd_ks[ki], n_predict, o.thresholds[ti], min_depth, 0, 0};
            spd[ki * n_spd_cols + n_predict + ti] = adaptive ? row_index(&rows, c) : -1;
        }
    }
    /* A greedy MLP tree keeps k nodes per depth; mlp_ngram's lookup adds
     * up to its own shape (less where the two agree) to every setting. */
    int max_tree = 1;
    for (int i = 0; i < rows.n; i++) {
        if (o.lookup) {
            rows.r[i].c.lookup_candidates = o.lookup_k;
            rows.r[i].c.lookup_depth = o.lookup_d;
        }
        int nodes = rows.r[i].c.candidates * rows.r[i].c.depth +
                    (o.lookup ? o.lookup_k * o.lookup_d : 0);
        if (nodes > max_tree) max_tree = nodes;
    }

    /* The session's EOS rule takes the model's EOS; the other end-of-
     * generation ids (ChatML's end of turn / of text) go in as stop ids, as
     * every decoding command stops on them. */
    int32_t stops[SPECD_TOKENIZER_MAX_END];
    int n_stops = specd_tokenizer_end_ids(tok, stops);
    int32_t eos = specd_tokenizer_eos(tok) >= 0 ? specd_tokenizer_eos(tok) : m->hp.eos_id;
    eval_target_opts to = {.backend = {.name = o.backend, .n_threads = o.threads},
                           .lanes = o.lanes, .max_new_tokens = o.max_new,
                           .max_prompt = ps.max_len, .max_tree_tokens = max_tree,
                           .eos_id = eos, .stop_ids = stops, .n_stop_ids = n_stops};
    if (!(t = eval_target_create(m, &to, &err))) goto done;

    ref = calloc((size_t)ps.n, sizeof *ref);
    plain = calloc((size_t)ps.n, sizeof *plain);
    if (!ref || !plain) {
        specd_seterr(&err, "out of memory");
        goto done;
    }
    double plain_wall = 0;
    fprintf(stderr, "specd eval: %d prompts, %d settings + plain decoding\n", ps.n, rows.n);
    if (eval_greedy(t, ps.p, ps.n, ref, plain, &plain_wall, &err)) goto done;
    eval_sum ps_all = sum_kind(plain, &ps, -1);
    fprintf(stderr, "specd eval: plain greedy: %ld tokens in %.1f s\n", ps_all.generated,
            plain_wall);
    for (int i = 0; i < rows.n; i++) {
        eval_row *row = &rows.r[i];
        char name[64];
        policy_name(&row->c, name, sizeof name);
        if (!(row->st = calloc((size_t)ps.n, sizeof *row->st))) {
            specd_seterr(&err, "out of memory");
            goto done;
        }
        int src = eval_spec(t, d, &row->c, ps.p, ps.n, ref, row->st, &row->wall_s, &err);
        if (src == EVAL_MISMATCH) {
            fprintf(stderr, "\nspecd eval: LOSSLESSNESS BUG with k=%d, %s: %s\n"
                            "specd eval: speculative greedy decoding must equal plain greedy "
                            "decoding token for token; stopping.\n",
                    row->c.candidates, name, err.msg);
            rc = EVAL_EXIT_MISMATCH;
            err.msg[0] = 0;
            goto done;
        }
        if (src) goto done;
        eval_sum s = sum_kind(row->st, &ps, -1);
        fprintf(stderr, "specd eval: [%d/%d] k=%d, %s: tau %.2f, %.1f s\n", i + 1, rows.n,
                row->c.candidates, name, tau(&s), row->wall_s);
    }

    eval_report R = {.o = &o, .speculator = spec_dir, .accept_head = adaptive ? accept_dir : NULL,
                     .ps = &ps, .rows = &rows, .plain = plain,
                     .plain_wall = plain_wall, .n_predict = n_predict, .lanes = o.lanes,
                     .threads = o.threads > 0 ? o.threads : specd_cpu_count(),
                     .backend = o.backend, .grid = grid,
                     .n_heads = n_heads, .spd_ks = {spd_ks[0], spd_ks[1]}, .n_spd_ks = n_spd_ks,
                     .spd = spd, .n_spd_cols = n_spd_cols, .adaptive_note = adaptive ? NULL : note};
    if (o.json) {
        if (print_json(&R)) {
            specd_seterr(&err, "out of memory");
            goto done;
        }
    } else {
        print_markdown(&R);
    }
    rc = 0;
done:
    if (rc && err.msg[0]) fprintf(stderr, "specd eval: %s\n", err.msg);
    for (int i = 0; i < rows.n; i++) free(rows.r[i].st);
    free(rows.r);
    if (ref)
        for (int i = 0; i < ps.n; i++) eval_output_free(&ref[i]);
    free(ref);
    free(plain);
    free(grid);
    free(spd);
    eval_target_free(t);
    if (d != mlp) specd_drafter_free(d);
    specd_drafter_free(ngram);
    specd_drafter_free(mlp);
    prompt_set_free(&ps);
    specd_tokenizer_free(tok);
    specd_model_close(m);
    free(o.ks);
    free(o.heads);
    free(o.top_k);
    return rc;
}
