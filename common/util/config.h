/* config.h - one schema-driven configuration loader for every specd service.
 *
 * A service describes its settings once, as a static table of fields, and
 * gets from that table: defaults, a YAML file reader, command-line flags,
 * --help text and a dump of the effective configuration. The order is always
 *
 *     table defaults  ->  YAML file (--config PATH)  ->  flags
 *
 * each step overriding the one before it.
 *
 *     typedef struct my_cfg {
 *         char *listen;
 *         int64_t threads;
 *         struct { int64_t max_sessions; } limits;
 *     } my_cfg;
 *
 *     static const specd_cfg_field my_fields[] = {
 *         SPECD_CFG_FIELD("listen", SPECD_CFG_STRING, my_cfg, listen, "0.0.0.0:50051",
 *                         "address to serve gRPC on"),
 *         SPECD_CFG_FIELD("threads", SPECD_CFG_INT64, my_cfg, threads, "4",
 *                         "compute threads", .min = 1, .max = 1024),
 *         SPECD_CFG_FIELD("limits.max_sessions", SPECD_CFG_INT64, my_cfg, limits.max_sessions,
 *                         "64", "most concurrent sessions", .min = 1, .max = INT64_MAX),
 *     };
 *
 * Names are dotted paths: "limits.max_sessions" is the key max_sessions in the
 * mapping limits, and also the flag --limits.max_sessions. In the file a
 * dotted key (`limits.max_sessions: 64` at top level) means the same as the
 * nested form.
 *
 * Field types and the C type at `offset`:
 *
 *   SPECD_CFG_STRING    char *            owned copy; YAML null (~, empty) = NULL
 *   SPECD_CFG_INT64     int64_t           decimal or 0x hex; bounds .min/.max
 *   SPECD_CFG_DOUBLE    double            finite decimal; bounds .fmin/.fmax
 *   SPECD_CFG_BOOL      bool              true/false, yes/no, on/off (any case)
 *   SPECD_CFG_ENUM      int               index into .choices (NULL-terminated),
 *                                         matched ignoring case
 *   SPECD_CFG_DURATION  int64_t (ms)      "250ms", "2s", "1m", "1h", "1m30s",
 *                                         "1.5s"; bounds .min/.max in ms
 *   SPECD_CFG_SIZE      uint64_t (bytes)  "512MiB", "4GB", "1.5GiB" or bytes;
 *                                         KiB..TiB are 1024-based, kB..TB
 *                                         1000-based; bounds .min/.max
 *   SPECD_CFG_STRLIST   specd_cfg_strlist a YAML sequence of strings; on the
 *                                         command line a comma-separated list
 *
 * Bounds: .min == .max == 0 (and .fmin == .fmax == 0) means unbounded; use
 * INT64_MIN / INT64_MAX (or -INFINITY / INFINITY) for a one-sided bound.
 *
 * Defaults are written as text (`def`) and parsed by the same rules as the
 * file and the flags, so "250ms" or "512MiB" work there too; NULL means
 * NULL / 0 / false / first choice / empty list. A string list default is
 * comma-separated.
 *
 * Types are strict where YAML is: a quoted "8" is a string, not an integer,
 * so it is refused for an INT64, DOUBLE or BOOL field. Any scalar is accepted
 * for a STRING field (`listen: 8080` gives "8080").
 *
 * Errors name the source, line and key, e.g.
 *
 *   config.yaml:12: unknown key 'limits.max_sesions' (did you mean 'limits.max_sessions'?)
 *   config.yaml:7: 'batching.max_wait_ms' expects a duration like 5ms, got 'soon'
 *   config.yaml:3: 'threads' expects an integer in 1..1024, got -4
 *   config.yaml:9: duplicate key 'threads' (first set on line 2)
 *   config.yaml:5:1: YAML syntax error: did not find expected ',' or ']' (while
 *       parsing a flow sequence on line 4)
 *   command line: unknown flag '--thread' (did you mean '--threads'?)
 *
 * Safety (the file may come from anywhere; the loader is fuzzed): inputs over
 * SPECD_CONFIG_MAX_BYTES are refused before parsing; anchors, aliases and tags
 * are refused (no alias expansion, so no "billion laughs"); only one YAML
 * document is allowed; nesting is bounded by the schema, because every value
 * is a scalar or a flat list and anything deeper is an error at the first
 * level where it is not allowed, so parsing stops there.
 *
 * Not thread-safe per `out` struct; different structs may be loaded
 * concurrently. */
#ifndef SPECD_CONFIG_H
#define SPECD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/util/error.h"

/* Largest configuration file or buffer accepted (1 MiB). */
#define SPECD_CONFIG_MAX_BYTES (1u << 20)
/* Most dotted components in a field name ("a.b.c" has 3). */
#define SPECD_CONFIG_MAX_DEPTH 8

typedef enum specd_cfg_type {
    SPECD_CFG_STRING,
    SPECD_CFG_INT64,
    SPECD_CFG_DOUBLE,
    SPECD_CFG_BOOL,
    SPECD_CFG_ENUM,
    SPECD_CFG_DURATION,
    SPECD_CFG_SIZE,
    SPECD_CFG_STRLIST,
} specd_cfg_type;

/* Field flags. */
#define SPECD_CFG_SECRET 1u /* value is never printed by dump or help */

/* The C type of a SPECD_CFG_STRLIST field: n owned strings. */
typedef struct specd_cfg_strlist {
    char **items;
    size_t n;
} specd_cfg_strlist;

typedef struct specd_cfg_field {
    const char *name;           /* dotted path: "batching.max_wait" */
    specd_cfg_type type;
    size_t offset;              /* offsetof(struct, member) */
    const char *def;            /* default as text; NULL = zero value */
    const char *help;           /* one line for --help */
    int64_t min, max;           /* INT64 / DURATION (ms) / SIZE (bytes) */
    double fmin, fmax;          /* DOUBLE */
    const char *const *choices; /* ENUM: allowed strings, NULL-terminated */
    unsigned flags;             /* SPECD_CFG_SECRET */
} specd_cfg_field;

/* One table entry: name, type, the struct and member it fills, default text,
 * help, then any of .min/.max, .fmin/.fmax, .choices, .flags. All members
 * are designated, so -Wextra's missing-initializer check stays quiet. */
#define SPECD_CFG_FIELD(name_, type_, cfg_type, member, def_, help_, ...)                  \
    {                                                                                     \
        .name = (name_), .type = (type_), .offset = offsetof(cfg_type, member),            \
        .def = (def_), .help = (help_), __VA_ARGS__                                       \
    }

/* Checks the table (names, types, choices, that every default parses and is
 * in bounds) and writes every field's default into `out`. `out` is treated
 * as uninitialized: nothing in it is freed, so call this on a fresh struct or
 * after specd_config_free(). On failure nothing needs freeing. */
int specd_config_defaults(const specd_cfg_field *fields, size_t n, void *out,
                          specd_error *err);

/* Reads a YAML file and sets the fields it names in `out` (which must hold
 * defaults or earlier values: replaced strings and lists are freed). Keys not
 * in the file keep their values; an empty file changes nothing. On failure
 * `out` may be partly updated but stays valid for specd_config_free(). */
int specd_config_load_file(const specd_cfg_field *fields, size_t n, const char *path,
                           void *out, specd_error *err);

/* Same for a buffer (need not be NUL-terminated); name_for_errors stands in
 * for the file name in messages. */
int specd_config_load_mem(const specd_cfg_field *fields, size_t n, const char *buf,
                          size_t len, const char *name_for_errors, void *out,
                          specd_error *err);

/* Applies command-line flags argv[1..argc) to `out`:
 *   --name=VALUE, --name VALUE   any field, by its dotted name
 *   --name, --name=false         BOOL fields (a bare flag means true; the
 *                                value must be attached with '=')
 *   --list=a,b --list c          STRLIST: the first use replaces the list,
 *                                later uses append
 *   --config PATH / --config=PATH  skipped (specd_config_load reads it)
 *   --                           everything after it is positional
 * Positional arguments are moved, in order, to argv[1..1 + *n_left) (argv is
 * permuted as getopt does); when n_left is NULL they are an error.
 * Returns 0, or 1 if --help or -h was given (nothing after it is applied), or
 * -1 on error ("command line: 'threads' expects an integer in 1..1024, got
 * -4"). On failure `out` stays valid for specd_config_free(). */
int specd_config_apply_flags(const specd_cfg_field *fields, size_t n, int argc, char **argv,
                             void *out, int *n_left, specd_error *err);

/* The whole sequence for a service's main(): defaults, then the file named
 * by --config (if any), then the other flags; positional arguments are an
 * error. Returns 0 with `out` filled; 1 if --help/-h was given (checked
 * first, so help works with a broken config; `out` holds nothing); -1 on
 * error (`out` holds nothing). */
int specd_config_load(const specd_cfg_field *fields, size_t n, int argc, char **argv,
                      void *out, specd_error *err);

/* Writes one line per flag (--config and --help first) with its type, help,
 * bounds and default (defaults of secret fields are not shown). */
void specd_config_print_help(const specd_cfg_field *fields, size_t n, FILE *f);

/* Writes the configuration as YAML, nested by the dotted names, in a form
 * specd_config_load_file() reads back to the same values. Secret fields that
 * are set print as "<redacted>". */
void specd_config_dump(const specd_cfg_field *fields, size_t n, const void *cfg, FILE *f);

/* Frees the owned strings and lists and sets them to NULL / empty. */
void specd_config_free(const specd_cfg_field *fields, size_t n, void *out);

#endif
