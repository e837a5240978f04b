/* cli.h - what the specd subcommands share: their entry points, the few
 * helpers for parsing numbers and timing, and the sampling flags every
 * decoding command takes (so `generate`, `generate --server` and
 * `bench --e2e` spell and check them the same way). */
#ifndef SPECD_CLI_H
#define SPECD_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "common/spec/sampling.h"
#include "specd.pb-c.h"

int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* `specd bench --e2e` (cmd_bench hands over when it sees --e2e). */
int cmd_bench_e2e(int argc, char **argv);
/* `specd train speculator | accept-head` (cmd_train.c dispatches). */
int cmd_train(int argc, char **argv);
int cmd_train_accept_head(int argc, char **argv);
/* `specd eval`: tau and SpecDec++ tables for a speculator (cmd_eval.c). */
int cmd_eval(int argc, char **argv);
/* `specd health ADDRESS [SERVICE]`: a grpc.health.v1 probe (cmd_health.c). */
int cmd_health(int argc, char **argv);

/* Monotonic seconds. */
double cli_now(void);
/* The CPU's model name from /proc/cpuinfo ("this CPU" where there is none),
 * for benchmark headers. */
void cli_cpu_model(char *out, size_t cap);
/* Parses an integer/float option value or exits with a message naming the
 * option. */
long cli_int(const char *opt, const char *val, long lo, long hi);
/* --precision fast|exact as a specd_precision; exits 2 on anything else. */
int cli_precision(const char *opt, const char *val);
/* --kv-cache-dtype auto|f32|f16|q8_0 as a specd_kv_dtype; exits 2 on anything else. */
int cli_kv_dtype(const char *opt, const char *val);
double cli_float(const char *opt, const char *val, double lo, double hi);
/* The value after option argv[*i], advancing *i; exits if missing. */
const char *cli_value(int argc, char **argv, int *i);
/* Parses "1,2,3" into a malloc'd array of ints in lo..hi (exits with a
 * message naming the option on a bad entry). Returns the count. */
int cli_int_list(const char *opt, const char *val, long lo, long hi, int32_t **out);

#define SPECD_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
/* The speculator trained for the default model (committed; `specd train
 * speculator` writes here by default, reproducing it). */
#define SPECD_DEFAULT_SPECULATOR "models/SmolLM2-135M-Instruct.speculator"

/* ---- sampling flags -------------------------------------------------------- */

/* The specd_sampling a command line asks for, with the storage its logit
 * bias points into (specd_sampling only borrows its arrays). */
typedef struct cli_sampling {
    specd_sampling s;
    int32_t bias_ids[SPECD_MAX_LOGIT_BIAS];
    float bias_values[SPECD_MAX_LOGIT_BIAS];
} cli_sampling;

/* Greedy, every filter and penalty off, seed 0. */
void cli_sampling_init(cli_sampling *o);
/* If argv[*i] is a sampling flag (--temp/--temperature, --top-k, --top-p,
 * --min-p, --seed, --repetition-penalty, --frequency-penalty,
 * --presence-penalty, --logit-bias ID:BIAS), consumes it and its value
 * (advancing *i) and returns 1; else 0. Malformed values exit(2) with a
 * message naming the flag. */
int cli_sampling_option(int argc, char **argv, int *i, cli_sampling *o);
/* The settings with the bias pointers aimed at o's own arrays (valid while
 * o lives and does not move). */
const specd_sampling *cli_sampling_get(cli_sampling *o);
/* Help lines for the flags above. */
void cli_sampling_usage(FILE *f);
/* The wire form. pb borrows bias_msgs/bias_ptrs (SPECD_MAX_LOGIT_BIAS each,
 * owned by the caller) for the logit bias. */
void cli_sampling_to_proto(const cli_sampling *o, Specd__V1__SamplingParams *pb,
                           Specd__V1__LogitBias *bias_msgs, Specd__V1__LogitBias **bias_ptrs);

#endif
