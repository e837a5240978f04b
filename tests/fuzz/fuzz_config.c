/* fuzz_config.c - libFuzzer target for the YAML configuration loader.
 *
 * Loads the input into a schema that has every field type, two nested
 * sections and a secret, then frees it (LeakSanitizer checks that every
 * replaced string and list was released, on success and on every error
 * path). When the input is accepted it also checks the loader against
 * itself: the dump of the result must load back without error and dump to
 * the very same text, so dump and load agree on every value the loader can
 * produce (escapes, doubles, durations, sizes, enums, lists). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/config.h"

typedef struct fuzz_cfg {
    char *listen;
    int64_t threads;
    double ratio;
    bool verbose;
    int backend;
    int64_t wait_ms;
    uint64_t memory;
    specd_cfg_strlist targets;
    char *token;
    int64_t limits_sessions;
    uint64_t limits_kv;
    int64_t deep_value;
} fuzz_cfg;

static const char *const BACKENDS[] = {"cpu", "cuda", NULL};

static const specd_cfg_field FIELDS[] = {
    SPECD_CFG_FIELD("listen", SPECD_CFG_STRING, fuzz_cfg, listen, "0.0.0.0:1", "address"),
    SPECD_CFG_FIELD("threads", SPECD_CFG_INT64, fuzz_cfg, threads, "4", "threads", .min = 1,
                    .max = 1024),
    SPECD_CFG_FIELD("ratio", SPECD_CFG_DOUBLE, fuzz_cfg, ratio, "0.5", "ratio", .fmin = -1,
                    .fmax = 1e300),
    SPECD_CFG_FIELD("verbose", SPECD_CFG_BOOL, fuzz_cfg, verbose, NULL, "verbose"),
    SPECD_CFG_FIELD("backend", SPECD_CFG_ENUM, fuzz_cfg, backend, "cpu", "backend",
                    .choices = BACKENDS),
    SPECD_CFG_FIELD("wait", SPECD_CFG_DURATION, fuzz_cfg, wait_ms, "2ms", "wait"),
    SPECD_CFG_FIELD("memory", SPECD_CFG_SIZE, fuzz_cfg, memory, "1GiB", "memory"),
    SPECD_CFG_FIELD("targets", SPECD_CFG_STRLIST, fuzz_cfg, targets, "a,b", "targets"),
    SPECD_CFG_FIELD("token", SPECD_CFG_STRING, fuzz_cfg, token, NULL, "token",
                    .flags = SPECD_CFG_SECRET),
    SPECD_CFG_FIELD("limits.max_sessions", SPECD_CFG_INT64, fuzz_cfg, limits_sessions, "64",
                    "sessions", .min = 1, .max = INT64_MAX),
    SPECD_CFG_FIELD("limits.kv_memory", SPECD_CFG_SIZE, fuzz_cfg, limits_kv, "2GiB", "kv",
                    .min = 1024, .max = INT64_MAX),
    SPECD_CFG_FIELD("a.b.c.d.e.f.g.h", SPECD_CFG_INT64, fuzz_cfg, deep_value, NULL, "deepest"),
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

static char *dump_text(const fuzz_cfg *c, size_t *len) {
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (!f) abort();
    specd_config_dump(FIELDS, N_FIELDS, c, f);
    fclose(f);
    return text;
}

static void check_round_trip(const fuzz_cfg *c) {
    size_t len1, len2;
    char *first = dump_text(c, &len1);
    fuzz_cfg again;
    specd_error err;
    if (specd_config_defaults(FIELDS, N_FIELDS, &again, &err)) abort();
    if (specd_config_load_mem(FIELDS, N_FIELDS, first, len1, "dump", &again, &err)) {
        fprintf(stderr, "dump does not load back: %s\n%s", err.msg, first);
        abort();
    }
    char *second = dump_text(&again, &len2);
    if (len1 != len2 || memcmp(first, second, len1)) {
        fprintf(stderr, "dump changed on reload:\n%s---\n%s", first, second);
        abort();
    }
    free(first);
    free(second);
    specd_config_free(FIELDS, N_FIELDS, &again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_cfg c;
    specd_error err;
    if (specd_config_defaults(FIELDS, N_FIELDS, &c, &err)) abort();
    int rc = specd_config_load_mem(FIELDS, N_FIELDS, (const char *)data, size, "fuzz.yaml", &c,
                                   &err);
    /* every error names its source */
    if (rc != 0 && strncmp(err.msg, "fuzz.yaml", 9) != 0) abort();
    if (rc == 0) check_round_trip(&c);
    specd_config_free(FIELDS, N_FIELDS, &c);
    return 0;
}
