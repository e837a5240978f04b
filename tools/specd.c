/* specd.c - the specd command-line tool: dispatches to a subcommand.
 *
 *   specd generate   plain decoding on a model file, or (--server) the client
 *                    of draft-svc / target-svc
 *   specd bench      prefill/decode throughput of the CPU transformer, or
 *                    (--e2e) speculative serving end to end over gRPC
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "common/util/version.h"

#include "kernels/backend.h"

/* The CPU's model name from /proc/cpuinfo ("this CPU" where there is none):
 * what the CPU backend runs on, for a backend that does not say. */
void cli_cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "this CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        colon += strspn(colon + 1, " \t") + 1;
        colon[strcspn(colon, "\n")] = 0;
        snprintf(out, cap, "%s", colon);
        break;
    }
    fclose(f);
}

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

int cli_precision(const char *opt, const char *val) {
    for (int i = 0; specd_precision_names[i]; i++)
        if (!strcmp(val, specd_precision_names[i])) return i;
    fprintf(stderr, "specd: %s expects fast or exact, got '%s'\n", opt, val);
    exit(2);
}

int cli_kv_dtype(const char *opt, const char *val) {
    for (int i = 0; specd_kv_dtype_names[i]; i++)
        if (!strcmp(val, specd_kv_dtype_names[i])) return i;
    fprintf(stderr, "specd: %s expects auto, f32 or f16, got '%s'\n", opt, val);
    exit(2);
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

int cli_int_list(const char *opt, const char *val, long lo, long hi, int32_t **out) {
    /* one entry per comma, so the count bounds the array */
    size_t cap = 1;
    for (const char *p = val; *p; p++) cap += *p == ',';
    int32_t *v = malloc(sizeof(int32_t) * cap);
    char *buf = strdup(val);
    if (!v || !buf) {
        fprintf(stderr, "specd: out of memory\n");
        exit(1);
    }
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        v[n++] = (int32_t)cli_int(opt, tok, lo, hi);
    free(buf);
    if (n == 0) {
        fprintf(stderr, "specd: %s expects a comma-separated list, got '%s'\n", opt, val);
        exit(2);
    }
    *out = v;
    return n;
}

static void usage(FILE *f) {
    fprintf(f, "usage: specd <command> [options]\n\n"
               "commands:\n"
               "  generate   plain decoding on a model file, or --server ADDR: generate\n"
               "             through draft-svc / target-svc (specd generate --help)\n"
               "  bench      prefill and decode throughput, or --e2e: speculative serving\n"
               "             end to end (specd bench --help)\n"
               "  train      train a speculator (train speculator) or its acceptance head\n"
               "             (train accept-head) for a target (specd train --help)\n"
               "  eval       tau per candidates and heads, and SpecDec++ rates, of a\n"
               "             speculator on held-out prompts (specd eval --help)\n"
               "  health     one gRPC health check, for exec probes (specd health --help)\n"
               "  --version  print the version\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* only as the first word: a subcommand owns the rest of the line */
    if (specd_print_version_if_asked(2, argv, "specd")) return 0;
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "health")) return cmd_health(argc - 1, argv + 1);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "specd: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
