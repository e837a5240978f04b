/* specd.c - the specd command-line tool: dispatches to a subcommand.
 *
 *   specd generate   plain (non-speculative) decoding on a model file
 *   specd bench      prefill/decode throughput of the CPU transformer
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

long cli_int(const char *opt, const char *val, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || *end || end == val || v < lo || v > hi) {
        fprintf(stderr, "specd: %s expects an integer in %ld..%ld, got '%s'\n", opt, lo, hi, val);
        exit(2);
    }
    return v;
}

double cli_float(const char *opt, const char *val, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || *end || end == val || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "specd: %s expects a number in %g..%g, got '%s'\n", opt, lo, hi, val);
        exit(2);
    }
    return v;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "specd: option %s needs a value\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

static void usage(FILE *f) {
    fprintf(f, "usage: specd <command> [options]\n\n"
               "commands:\n"
               "  generate   plain decoding on a model file (specd generate --help)\n"
               "  bench      prefill and decode throughput (specd bench --help)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "specd: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
