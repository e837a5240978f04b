/* cli_sampling.c - the sampling flags, shared by every decoding command
 * (cli.h), and their wire form. Checks here are per flag (a number in
 * range); the combination (duplicate bias ids, ids inside the vocabulary)
 * is checked by specd_sampling_validate locally or by the server, which
 * names the field. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_sampling_init(cli_sampling *o) {
    memset(o, 0, sizeof *o);
    specd_sampling_init(&o->s);
    /* Greedy by default, as `specd generate` always was: reproducible text
     * without a seed. */
    o->s.temperature = 0.0f;
}

/* "ID:BIAS" into the next logit-bias entry. */
static void parse_bias(const char *opt, const char *val, cli_sampling *o) {
    const char *colon = strchr(val, ':');
    if (!colon || colon == val) {
        fprintf(stderr, "specd: %s expects ID:BIAS (e.g. 42:-100), got '%s'\n", opt, val);
        exit(2);
    }
    if (o->s.n_logit_bias == SPECD_MAX_LOGIT_BIAS) {
        fprintf(stderr, "specd: %s given more than %d times\n", opt, SPECD_MAX_LOGIT_BIAS);
        exit(2);
    }
    char id[32];
    size_t n = (size_t)(colon - val);
    if (n >= sizeof id) n = sizeof id - 1;
    memcpy(id, val, n);
    id[n] = 0;
    int k = o->s.n_logit_bias++;
    o->bias_ids[k] = (int32_t)cli_int(opt, id, 0, INT32_MAX);
    o->bias_values[k] = (float)cli_float(opt, colon + 1, -100, 100);
}

int cli_sampling_option(int argc, char **argv, int *i, cli_sampling *o) {
    const char *a = argv[*i];
    specd_sampling *s = &o->s;
    /* Ranges are the ones specd_sampling_validate enforces, so a bad value
     * is caught before any model is loaded or any call is made. */
    if (!strcmp(a, "--temp") || !strcmp(a, "--temperature"))
        s->temperature = (float)cli_float(a, cli_value(argc, argv, i), 0, 100);
    else if (!strcmp(a, "--top-k"))
        s->top_k = (int)cli_int(a, cli_value(argc, argv, i), 0, 1 << 24);
    else if (!strcmp(a, "--top-p"))
        s->top_p = (float)cli_float(a, cli_value(argc, argv, i), 1e-6, 1);
    else if (!strcmp(a, "--min-p"))
        s->min_p = (float)cli_float(a, cli_value(argc, argv, i), 0, 1);
    else if (!strcmp(a, "--seed"))
        s->seed = (uint64_t)cli_int(a, cli_value(argc, argv, i), 0, 0x7fffffffffffffffL);
    else if (!strcmp(a, "--repetition-penalty"))
        s->repetition_penalty = (float)cli_float(a, cli_value(argc, argv, i), 0, 10);
    else if (!strcmp(a, "--frequency-penalty"))
        s->frequency_penalty = (float)cli_float(a, cli_value(argc, argv, i), -2, 2);
    else if (!strcmp(a, "--presence-penalty"))
        s->presence_penalty = (float)cli_float(a, cli_value(argc, argv, i), -2, 2);
    else if (!strcmp(a, "--sampling-method")) {
        const char *v = cli_value(argc, argv, i);
        if (!strcmp(v, "seed-exact"))
            s->method = SPECD_SAMPLING_SEED_EXACT;
        else if (!strcmp(v, "rejection"))
            s->method = SPECD_SAMPLING_REJECTION;
        else {
            fprintf(stderr, "specd: --sampling-method is seed-exact or rejection, got '%s'\n", v);
            exit(2);
        }
    } else if (!strcmp(a, "--logit-bias"))
        parse_bias(a, cli_value(argc, argv, i), o);
    else
        return 0;
    return 1;
}

const specd_sampling *cli_sampling_get(cli_sampling *o) {
    o->s.bias_ids = o->s.n_logit_bias ? o->bias_ids : NULL;
    o->s.bias_values = o->s.n_logit_bias ? o->bias_values : NULL;
    return &o->s;
}

void cli_sampling_usage(FILE *f) {
    fprintf(f,
            "  --temp, --temperature T  temperature, 0 = greedy (default 0)\n"
            "  --top-k K            keep the K most likely tokens (0 = off)\n"
            "  --top-p P            nucleus sampling threshold (1 = off)\n"
            "  --min-p P            drop tokens below P x the top probability (0 = off)\n"
            "  --seed S             sampling seed (default 0)\n"
            "  --sampling-method M  seed-exact (default: the seed fixes the output at any\n"
            "                       load and with any drafter) or rejection\n"
            "  --repetition-penalty R  CTRL penalty on prompt and output tokens (1 = off)\n"
            "  --frequency-penalty F   OpenAI penalty per repeat of an output token (0 = off)\n"
            "  --presence-penalty F    OpenAI penalty on any output token seen (0 = off)\n"
            "  --logit-bias ID:BIAS added to token ID's logit, -100..100 (repeatable)\n");
}

void cli_sampling_to_proto(const cli_sampling *o, Specd__V1__SamplingParams *pb,
                           Specd__V1__LogitBias *bias_msgs, Specd__V1__LogitBias **bias_ptrs) {
    const specd_sampling *s = &o->s;
    specd__v1__sampling_params__init(pb);
    pb->temperature = s->temperature;
    pb->top_k = s->top_k;
    pb->top_p = s->top_p;
    pb->min_p = s->min_p;
    pb->seed = s->seed;
    pb->method = (Specd__V1__SamplingMethod)s->method;
    pb->repetition_penalty = s->repetition_penalty;
    pb->frequency_penalty = s->frequency_penalty;
    pb->presence_penalty = s->presence_penalty;
    for (int k = 0; k < s->n_logit_bias; k++) {
        specd__v1__logit_bias__init(&bias_msgs[k]);
        bias_msgs[k].token_id = o->bias_ids[k];
        bias_msgs[k].bias = o->bias_values[k];
        bias_ptrs[k] = &bias_msgs[k];
    }
    pb->n_logit_bias = (size_t)s->n_logit_bias;
    pb->logit_bias = s->n_logit_bias ? bias_ptrs : NULL;
}
