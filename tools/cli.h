/* cli.h - what the specd subcommands share: their entry points and the few
 * helpers for parsing numbers and timing. */
#ifndef SPECD_CLI_H
#define SPECD_CLI_H

#include <stdint.h>

int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Monotonic seconds. */
double cli_now(void);
/* Parses an integer/float option value or exits with a message naming the
 * option. */
long cli_int(const char *opt, const char *val, long lo, long hi);
double cli_float(const char *opt, const char *val, double lo, double hi);
/* The value after option argv[*i], advancing *i; exits if missing. */
const char *cli_value(int argc, char **argv, int *i);

#define SPECD_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

#endif
