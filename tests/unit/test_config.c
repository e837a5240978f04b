/* test_config.c - the schema-driven configuration loader (common/util/config.h).
 *
 * One representative schema (every field type, two nested sections, a
 * secret) is loaded from YAML buffers, files and flags. Error cases assert
 * the whole message, line number included, because the message is the
 * feature: it must tell an operator which key on which line is wrong.
 * The last tests parse deploy/config/target-svc.example.yaml with a schema
 * that matches it (target-svc will own the real one). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/util/config.h"
#include "common/model/mlp_speculator.h"
#include "draft-svc/draft_config.h"
#include "draft-svc/service.h" /* specd_drafter_names */
#include "target-svc/target_config.h"
#include "target-svc/target_opts.h"
#include "tests/harness/test_util.h"

/* ---- the test schema ---------------------------------------------------- */

typedef struct test_cfg {
    char *listen;
    int64_t threads;
    double temperature;
    bool verbose;
    int backend;
    int64_t timeout_ms;
    uint64_t cache;
    specd_cfg_strlist targets;
    char *token;
    struct {
        int64_t max_sessions;
        uint64_t kv_memory;
    } limits;
    struct {
        int64_t max_batch_tokens;
        int64_t max_wait_ms;
    } batching;
    struct {
        char *cert;
        bool insecure;
    } tls;
} test_cfg;

enum { BACKEND_CPU, BACKEND_CUDA };
static const char *const BACKENDS[] = {"cpu", "cuda", NULL};

static const specd_cfg_field FIELDS[] = {
    SPECD_CFG_FIELD("listen", SPECD_CFG_STRING, test_cfg, listen, "0.0.0.0:50051",
                    "address to serve gRPC on"),
    SPECD_CFG_FIELD("threads", SPECD_CFG_INT64, test_cfg, threads, "4", "compute threads",
                    .min = 1, .max = 1024),
    SPECD_CFG_FIELD("temperature", SPECD_CFG_DOUBLE, test_cfg, temperature, "0.7",
                    "sampling temperature", .fmin = 0, .fmax = 2),
    SPECD_CFG_FIELD("verbose", SPECD_CFG_BOOL, test_cfg, verbose, "no", "log every request"),
    SPECD_CFG_FIELD("backend", SPECD_CFG_ENUM, test_cfg, backend, "cpu", "compute backend",
                    .choices = BACKENDS),
    SPECD_CFG_FIELD("timeout", SPECD_CFG_DURATION, test_cfg, timeout_ms, "1m30s",
                    "request timeout"),
    SPECD_CFG_FIELD("cache", SPECD_CFG_SIZE, test_cfg, cache, "512MiB", "tokenizer cache size"),
    SPECD_CFG_FIELD("targets", SPECD_CFG_STRLIST, test_cfg, targets, "a:1,b:2",
                    "target addresses"),
    SPECD_CFG_FIELD("token", SPECD_CFG_STRING, test_cfg, token, NULL, "auth token",
                    .flags = SPECD_CFG_SECRET),
    SPECD_CFG_FIELD("limits.max_sessions", SPECD_CFG_INT64, test_cfg, limits.max_sessions, "64",
                    "most concurrent sessions", .min = 1, .max = INT64_MAX),
    SPECD_CFG_FIELD("limits.kv_memory", SPECD_CFG_SIZE, test_cfg, limits.kv_memory, "1GiB",
                    "KV cache budget", .min = 1 << 20, .max = INT64_MAX),
    SPECD_CFG_FIELD("batching.max_batch_tokens", SPECD_CFG_INT64, test_cfg,
                    batching.max_batch_tokens, "2048", "tokens per forward pass", .min = 1,
                    .max = 1 << 20),
    SPECD_CFG_FIELD("batching.max_wait_ms", SPECD_CFG_DURATION, test_cfg, batching.max_wait_ms,
                    "2ms", "batching delay"),
    SPECD_CFG_FIELD("tls.cert", SPECD_CFG_STRING, test_cfg, tls.cert, NULL, "certificate file"),
    SPECD_CFG_FIELD("tls.insecure", SPECD_CFG_BOOL, test_cfg, tls.insecure, NULL,
                    "serve plaintext"),
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

static void defaults(test_cfg *c) {
    specd_error err = {{0}};
    memset(c, 0xA5, sizeof *c); /* defaults must not read what is there */
    assert_int_equal(specd_config_defaults(FIELDS, N_FIELDS, c, &err), 0);
}

static int load(const char *yaml, test_cfg *c, specd_error *err) {
    return specd_config_load_mem(FIELDS, N_FIELDS, yaml, strlen(yaml), "t.yaml", c, err);
}

/* Defaults, then the YAML must fail with exactly this message. */
static void expect_error(const char *yaml, const char *msg) {
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    assert_int_equal(load(yaml, &c, &err), -1);
    assert_string_equal(err.msg, msg);
    specd_config_free(FIELDS, N_FIELDS, &c);
}

/* A one-key document "key: value" parsed into c (after defaults). */
static int load_one(const char *key, const char *value, test_cfg *c, specd_error *err) {
    char yaml[512];
    snprintf(yaml, sizeof yaml, "%s: %s\n", key, value);
    defaults(c);
    return load(yaml, c, err);
}

/* ---- defaults and every type -------------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    test_cfg c;
    defaults(&c);
    assert_string_equal(c.listen, "0.0.0.0:50051");
    assert_int_equal(c.threads, 4);
    assert_true(c.temperature == 0.7);
    assert_false(c.verbose);
    assert_int_equal(c.backend, BACKEND_CPU);
    assert_int_equal(c.timeout_ms, 90000);
    assert_true(c.cache == 512ull << 20);
    assert_int_equal(c.targets.n, 2);
    assert_string_equal(c.targets.items[0], "a:1");
    assert_string_equal(c.targets.items[1], "b:2");
    assert_null(c.token);
    assert_int_equal(c.limits.max_sessions, 64);
    assert_true(c.limits.kv_memory == 1ull << 30);
    assert_int_equal(c.batching.max_batch_tokens, 2048);
    assert_int_equal(c.batching.max_wait_ms, 2);
    assert_null(c.tls.cert);
    assert_false(c.tls.insecure);
    specd_config_free(FIELDS, N_FIELDS, &c);
    assert_null(c.listen);
    assert_null(c.targets.items);
    assert_int_equal(c.targets.n, 0);
}

static void test_every_type(void **state) {
    (void)state;
    const char *yaml = "listen: \"127.0.0.1:9000\"\n"
                       "threads: 16\n"
                       "temperature: 1.25\n"
                       "verbose: yes\n"
                       "backend: cuda\n"
                       "timeout: 250ms\n"
                       "cache: 4GB\n"
                       "targets:\n"
                       "  - target-0:50052\n"
                       "  - \"target-1:50052\"\n"
                       "token: s3cret\n";
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    assert_int_equal(load(yaml, &c, &err), 0);
    assert_string_equal(c.listen, "127.0.0.1:9000");
    assert_int_equal(c.threads, 16);
    assert_true(c.temperature == 1.25);
    assert_true(c.verbose);
    assert_int_equal(c.backend, BACKEND_CUDA);
    assert_int_equal(c.timeout_ms, 250);
    assert_true(c.cache == 4000000000ull);
    assert_int_equal(c.targets.n, 2);
    assert_string_equal(c.targets.items[0], "target-0:50052");
    assert_string_equal(c.targets.items[1], "target-1:50052");
    assert_string_equal(c.token, "s3cret");
    /* keys not in the file keep their defaults */
    assert_int_equal(c.limits.max_sessions, 64);
    specd_config_free(FIELDS, N_FIELDS, &c);
}

static void test_nested_sections(void **state) {
    (void)state;
    const char *yaml = "limits:\n"
                       "  max_sessions: 128\n"
                       "  kv_memory: 8GiB\n"
                       "batching: {max_batch_tokens: 4096, max_wait_ms: 5ms}\n"
                       "tls.cert: /etc/specd/tls.crt\n" /* dotted key = nested */
                       "tls:\n"
                       "  insecure: true\n";
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    assert_int_equal(load(yaml, &c, &err), 0);
    assert_int_equal(c.limits.max_sessions, 128);
    assert_true(c.limits.kv_memory == 8ull << 30);
    assert_int_equal(c.batching.max_batch_tokens, 4096);
    assert_int_equal(c.batching.max_wait_ms, 5);
    assert_string_equal(c.tls.cert, "/etc/specd/tls.crt");
    assert_true(c.tls.insecure);
    specd_config_free(FIELDS, N_FIELDS, &c);
}

static void test_empty_section_and_nulls(void **state) {
    (void)state;
    /* a section with every line commented out is null, not an error; a null
     * string is NULL and a null list is empty */
    const char *yaml = "limits:\n"
                       "  # max_sessions: 5\n"
                       "listen: ~\n"
                       "targets:\n"
                       "tls:\n"
                       "  cert: \"\"\n";
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    assert_int_equal(load(yaml, &c, &err), 0);
    assert_int_equal(c.limits.max_sessions, 64);
    assert_null(c.listen);
    assert_int_equal(c.targets.n, 0);
    assert_string_equal(c.tls.cert, ""); /* quoted empty is a string */
    specd_config_free(FIELDS, N_FIELDS, &c);
}

static void test_sequences(void **state) {
    (void)state;
    test_cfg c;
    specd_error err = {{0}};
    assert_int_equal(load_one("targets", "[x, \"y,z\", 'w']", &c, &err), 0);
    assert_int_equal(c.targets.n, 3);
    assert_string_equal(c.targets.items[0], "x");
    assert_string_equal(c.targets.items[1], "y,z");
    assert_string_equal(c.targets.items[2], "w");
    specd_config_free(FIELDS, N_FIELDS, &c);

    assert_int_equal(load_one("targets", "[]", &c, &err), 0);
    assert_int_equal(c.targets.n, 0);
    specd_config_free(FIELDS, N_FIELDS, &c);

    /* many items: the list grows */
    char yaml[8192] = "targets:\n";
    for (int i = 0; i < 500; i++) {
        char line[32];
        snprintf(line, sizeof line, "- t%d\n", i);
        strcat(yaml, line);
    }
    defaults(&c);
    assert_int_equal(load(yaml, &c, &err), 0);
    assert_int_equal(c.targets.n, 500);
    assert_string_equal(c.targets.items[499], "t499");
    specd_config_free(FIELDS, N_FIELDS, &c);
}

static void test_bools(void **state) {
    (void)state;
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "ON"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", "OFF"};
    test_cfg c;
    specd_error err = {{0}};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        assert_int_equal(load_one("verbose", yes[i], &c, &err), 0);
        assert_true(c.verbose);
        specd_config_free(FIELDS, N_FIELDS, &c);
        assert_int_equal(load_one("verbose", no[i], &c, &err), 0);
        assert_false(c.verbose);
        specd_config_free(FIELDS, N_FIELDS, &c);
    }
    expect_error("verbose: maybe\n", "t.yaml:1: 'verbose' expects true or false, got 'maybe'");
    expect_error("verbose: 1\n", "t.yaml:1: 'verbose' expects true or false, got '1'");
}

static void test_integers(void **state) {
    (void)state;
    test_cfg c;
    specd_error err = {{0}};
    assert_int_equal(load_one("threads", "0x40", &c, &err), 0);
    assert_int_equal(c.threads, 64);
    specd_config_free(FIELDS, N_FIELDS, &c);
    assert_int_equal(load_one("threads", "+1024", &c, &err), 0);
    assert_int_equal(c.threads, 1024);
    specd_config_free(FIELDS, N_FIELDS, &c);
    assert_int_equal(load_one("limits.max_sessions", "9223372036854775807", &c, &err), 0);
    assert_true(c.limits.max_sessions == INT64_MAX);
    specd_config_free(FIELDS, N_FIELDS, &c);

    expect_error("threads: 1025\n", "t.yaml:1: 'threads' expects an integer in 1..1024, got 1025");
    expect_error("threads: 2.5\n", "t.yaml:1: 'threads' expects an integer in 1..1024, got '2.5'");
    expect_error("threads: 0x\n", "t.yaml:1: 'threads' expects an integer in 1..1024, got '0x'");
    expect_error("limits: {max_sessions: 9223372036854775808}\n",
                 "t.yaml:1: 'limits.max_sessions' expects an integer >= 1, got "
                 "9223372036854775808");
    expect_error("limits: {max_sessions: 99999999999999999999999}\n",
                 "t.yaml:1: 'limits.max_sessions' expects an integer >= 1, got "
                 "99999999999999999999999");
}

static void test_doubles(void **state) {
    (void)state;
    test_cfg c;
    specd_error err = {{0}};
    static const struct {
        const char *text;
        double want;
    } ok[] = {{"0", 0}, {"2", 2}, {".5", 0.5}, {"1e-3", 1e-3}, {"+1.5E0", 1.5}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(load_one("temperature", ok[i].text, &c, &err), 0);
        assert_true(c.temperature == ok[i].want);
        specd_config_free(FIELDS, N_FIELDS, &c);
    }
    expect_error("temperature: 2.5\n",
                 "t.yaml:1: 'temperature' expects a number in 0..2, got 2.5");
    expect_error("temperature: .nan\n",
                 "t.yaml:1: 'temperature' expects a number in 0..2, got '.nan'");
    expect_error("temperature: 0x1p3\n",
                 "t.yaml:1: 'temperature' expects a number in 0..2, got '0x1p3'");
    expect_error("temperature: 1e999\n",
                 "t.yaml:1: 'temperature' expects a number in 0..2, got 1e999");
}

static void test_enums(void **state) {
    (void)state;
    test_cfg c;
    specd_error err = {{0}};
    assert_int_equal(load_one("backend", "CUDA", &c, &err), 0);
    assert_int_equal(c.backend, BACKEND_CUDA);
    specd_config_free(FIELDS, N_FIELDS, &c);
    expect_error("backend: gpu\n", "t.yaml:1: 'backend' expects one of cpu|cuda, got 'gpu'");
}

static void test_durations(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } ok[] = {
        {"0", 0},       {"5ms", 5},          {"2s", 2000},       {"1m", 60000},
        {"1h", 3600000}, {"1m30s", 90000},   {"1.5s", 1500},     {"0.25s", 250},
        {"1h2m3s4ms", 3723004}, {"\"250ms\"", 250}, {"1.500000s", 1500},
    };
    test_cfg c;
    specd_error err = {{0}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(load_one("timeout", ok[i].text, &c, &err), 0);
        assert_int_equal(c.timeout_ms, ok[i].ms);
        specd_config_free(FIELDS, N_FIELDS, &c);
    }
    static const char *const bad[] = {"5", "soon", "-5ms", "5 ms", "0.5ms", "1.2345678s",
                                      "ms", "5sec", "1.s5", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char yaml[64], msg[160];
        snprintf(yaml, sizeof yaml, "timeout: \"%s\"\n", bad[i]);
        snprintf(msg, sizeof msg, "t.yaml:1: 'timeout' expects a duration like 5ms, got '%s'",
                 bad[i]);
        expect_error(yaml, msg);
    }
    expect_error("timeout: 9999999999999999h\n",
                 "t.yaml:1: 'timeout' expects a duration like 5ms, got 9999999999999999h");
}

static void test_sizes(void **state) {
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes;
    } ok[] = {
        {"0", 0},
        {"1048576", 1048576},
        {"512MiB", 512ull << 20},
        {"4GB", 4000000000ull},
        {"1.5GiB", 3ull << 29},
        {"1 KiB", 1024},
        {"2kb", 2000},
        {"3B", 3},
        {"1TiB", 1ull << 40},
        {"18446744073709551615", UINT64_MAX},
    };
    test_cfg c;
    specd_error err = {{0}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(load_one("cache", ok[i].text, &c, &err), 0);
        assert_true(c.cache == ok[i].bytes);
        specd_config_free(FIELDS, N_FIELDS, &c);
    }
    static const char *const bad[] = {"big", "-1", "1.5", "0.5B", "12XB", "1 ", "MiB", "1  MiB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char yaml[64], msg[160];
        snprintf(yaml, sizeof yaml, "cache: \"%s\"\n", bad[i]);
        snprintf(msg, sizeof msg,
                 "t.yaml:1: 'cache' expects a size like 512MiB or 4GB, got '%s'", bad[i]);
        expect_error(yaml, msg);
    }
    expect_error("cache: 16777216TiB\n",
                 "t.yaml:1: 'cache' expects a size like 512MiB or 4GB, got 16777216TiB");
    expect_error("limits: {kv_memory: 1000KiB}\n",
                 "t.yaml:1: 'limits.kv_memory' expects a size >= 1MiB, got 1000KiB");
}

static void test_strings_take_any_scalar(void **state) {
    (void)state;
    test_cfg c;
    specd_error err = {{0}};
    /* YAML would type these as int / bool; a string field keeps the text */
    assert_int_equal(load_one("listen", "8080", &c, &err), 0);
    assert_string_equal(c.listen, "8080");
    specd_config_free(FIELDS, N_FIELDS, &c);
    assert_int_equal(load_one("listen", "no", &c, &err), 0);
    assert_string_equal(c.listen, "no");
    specd_config_free(FIELDS, N_FIELDS, &c);
    assert_int_equal(load_one("listen", "|\n  two\n  lines", &c, &err), 0);
    assert_string_equal(c.listen, "two\nlines\n"); /* "|" keeps the last newline */
    specd_config_free(FIELDS, N_FIELDS, &c);
}

/* ---- the error messages, with their line numbers ------------------------ */

static void test_error_unknown_key(void **state) {
    (void)state;
    expect_error("threads: 4\n"
                 "\n"
                 "# limits\n"
                 "limits:\n"
                 "  max_sesions: 8\n",
                 "t.yaml:5: unknown key 'limits.max_sesions' (did you mean "
                 "'limits.max_sessions'?)");
    expect_error("listen: x\nlimit:\n  max_sessions: 1\n",
                 "t.yaml:2: unknown key 'limit' (did you mean 'limits'?)");
    expect_error("zzz: 1\n", "t.yaml:1: unknown key 'zzz'");
    /* names whose length differs by 3 or more are not even compared (the
     * distance is at least that); up to 2 they still are */
    expect_error("threadsxx: 1\n", "t.yaml:1: unknown key 'threadsxx' (did you mean 'threads'?)");
    expect_error("threadsxxx: 1\n", "t.yaml:1: unknown key 'threadsxxx'");
    /* a value key used as a section, and a section used as a value */
    expect_error("threads:\n  count: 4\n",
                 "t.yaml:2: 'threads' expects an integer in 1..1024, got a mapping");
    expect_error("\nlimits: 5\n",
                 "t.yaml:2: 'limits' is a section and expects a mapping, got '5'");
    expect_error("? [a, b]\n: 1\n", "t.yaml:1: keys must be plain names, got a list");
}

static void test_error_wrong_type(void **state) {
    (void)state;
    expect_error("listen: x\n"
                 "threads: 8\n"
                 "batching:\n"
                 "  max_batch_tokens: 64\n"
                 "\n"
                 "  # how long to wait\n"
                 "  max_wait_ms: soon\n",
                 "t.yaml:7: 'batching.max_wait_ms' expects a duration like 5ms, got 'soon'");
    expect_error("listen: x\n"
                 "# threads\n"
                 "threads: -4\n",
                 "t.yaml:3: 'threads' expects an integer in 1..1024, got -4");
    expect_error("threads: \"8\"\n",
                 "t.yaml:1: 'threads' expects an integer in 1..1024, got the quoted string '8'");
    expect_error("verbose: 'true'\n",
                 "t.yaml:1: 'verbose' expects true or false, got the quoted string 'true'");
    expect_error("threads:\n", "t.yaml:1: 'threads' expects an integer in 1..1024, got no value");
    expect_error("listen: [a]\n", "t.yaml:1: 'listen' expects a string, got a list");
    expect_error("targets: one\n", "t.yaml:1: 'targets' expects a list of strings, got 'one'");
    expect_error("targets:\n  - a\n  - [b]\n",
                 "t.yaml:3: 'targets' expects a list of strings, got a list as an item");
    expect_error("targets:\n  - a\n  -\n", "t.yaml:3: 'targets' has an empty item");
    expect_error("listen: \"a\\0b\"\n", "t.yaml:1: 'listen' contains a NUL character");
    /* values from hostile input are escaped and cut short in messages */
    expect_error("backend: \"\\e[31m\"\n",
                 "t.yaml:1: 'backend' expects one of cpu|cuda, got '\\x1b[31m'");
}

static void test_error_duplicate_keys(void **state) {
    (void)state;
    expect_error("threads: 2\n"
                 "listen: x\n"
                 "threads: 3\n",
                 "t.yaml:3: duplicate key 'threads' (first set on line 1)");
    expect_error("limits:\n"
                 "  max_sessions: 1\n"
                 "limits:\n"
                 "  kv_memory: 1GiB\n",
                 "t.yaml:3: duplicate key 'limits' (first set on line 1)");
    /* the dotted and the nested spelling of one key */
    expect_error("limits.max_sessions: 1\n"
                 "limits:\n"
                 "  max_sessions: 2\n",
                 "t.yaml:3: duplicate key 'limits.max_sessions' (first set on line 1)");
}

static void test_error_syntax(void **state) {
    (void)state;
    expect_error("threads: 4\nlisten: \"abc\n",
                 "t.yaml:3:1: YAML syntax error: found unexpected end of stream (while scanning "
                 "a quoted scalar on line 2)");
    expect_error("threads: 4\ntargets: [a, b\n",
                 "t.yaml:3:1: YAML syntax error: did not find expected ',' or ']' (while "
                 "parsing a flow sequence on line 2)");
    expect_error("listen: x\n\tthreads: 4\n",
                 "t.yaml:2:1: YAML syntax error: found a tab character that violates indentation "
                 "(while scanning a plain scalar on line 1)");
    expect_error("threads: 4\nlisten: \"\xff\"\n",
                 "t.yaml: invalid text at byte 20: invalid leading UTF-8 octet");
}

static void test_error_top_level(void **state) {
    (void)state;
    expect_error("- a\n- b\n", "t.yaml:1: the top level must be a mapping of settings, got a list");
    expect_error("hello\n", "t.yaml:1: the top level must be a mapping of settings, got 'hello'");
    expect_error("threads: 4\n---\nthreads: 5\n", "t.yaml:2: only one YAML document is allowed");
}

/* Empty input, comments only and a bare document marker change nothing. */
static void test_empty_file_is_defaults(void **state) {
    (void)state;
    static const char *const empties[] = {"", "\n\n", "# nothing here\n", "---\n", "--- ~\n",
                                          "---\n...\n"};
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
        test_cfg c;
        specd_error err = {{0}};
        defaults(&c);
        assert_int_equal(load(empties[i], &c, &err), 0);
        assert_int_equal(c.threads, 4);
        assert_string_equal(c.listen, "0.0.0.0:50051");
        specd_config_free(FIELDS, N_FIELDS, &c);
    }
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    const char *path = test_write_temp("", 0, ".yaml");
    assert_int_equal(specd_config_load_file(FIELDS, N_FIELDS, path, &c, &err), 0);
    assert_int_equal(c.threads, 4);
    remove(path);
    specd_config_free(FIELDS, N_FIELDS, &c);
}

static double seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* Billion laughs: nine levels of nine aliases would expand to 10^9 items.
 * The first anchor is refused, before any alias is read. */
static void test_alias_bomb_refused(void **state) {
    (void)state;
    char yaml[4096];
    size_t o = (size_t)snprintf(yaml, sizeof yaml,
                                "targets: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n");
    for (int i = 1; i <= 9; i++) {
        o += (size_t)snprintf(yaml + o, sizeof yaml - o, "listen%d: &a%d [", i, i);
        for (int j = 0; j < 9; j++)
            o += (size_t)snprintf(yaml + o, sizeof yaml - o, "%s*a%d", j ? "," : "", i - 1);
        o += (size_t)snprintf(yaml + o, sizeof yaml - o, "]\n");
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_error(yaml, "t.yaml:1: anchors (&a0) are not supported");
    assert_true(seconds_since(&t0) < 0.5);

    expect_error("threads: 4\nlisten: *x\n", "t.yaml:2: aliases (*x) are not supported");
    expect_error("threads: !!str 4\n", "t.yaml:1: tags (tag:yaml.org,2002:str) are not supported");
}

/* Deep nesting stops at the first level the schema does not allow. */
static void test_deep_nesting_refused(void **state) {
    (void)state;
    size_t depth = 200000;
    char *yaml = malloc(9 + depth + 1);
    memcpy(yaml, "targets: ", 9);
    memset(yaml + 9, '[', depth);
    yaml[9 + depth] = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_error(yaml, "t.yaml:1: 'targets' expects a list of strings, got a list as an item");
    assert_true(seconds_since(&t0) < 0.5);
    free(yaml);
}

static void test_huge_input_refused(void **state) {
    (void)state;
    size_t len = SPECD_CONFIG_MAX_BYTES + 1;
    char *buf = malloc(len);
    memset(buf, '#', len);
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    assert_int_equal(specd_config_load_mem(FIELDS, N_FIELDS, buf, len, "t.yaml", &c, &err), -1);
    assert_string_equal(err.msg, "t.yaml: 1048577 bytes is more than the 1048576 bytes a "
                                 "configuration may have");
    /* exactly the limit is fine (a file of comments) */
    assert_int_equal(specd_config_load_mem(FIELDS, N_FIELDS, buf, len - 1, "t.yaml", &c, &err), 0);

    const char *path = test_write_temp(buf, len, ".yaml");
    char msg[600];
    snprintf(msg, sizeof msg, "%s: file is larger than the 1048576 bytes a configuration may have",
             path);
    assert_int_equal(specd_config_load_file(FIELDS, N_FIELDS, path, &c, &err), -1);
    assert_string_equal(err.msg, msg);
    remove(path);
    free(buf);

    assert_int_equal(specd_config_load_file(FIELDS, N_FIELDS, "/nonexistent/x.yaml", &c, &err), -1);
    assert_string_equal(err.msg, "/nonexistent/x.yaml: cannot open: No such file or directory");
    assert_int_equal(specd_config_load_file(FIELDS, N_FIELDS, "/tmp", &c, &err), -1);
    assert_string_equal(err.msg, "/tmp: cannot read: Is a directory");
    specd_config_free(FIELDS, N_FIELDS, &c);
}

/* A failed load leaves a struct that still frees cleanly (ASan checks). */
static void test_failed_load_keeps_struct_valid(void **state) {
    (void)state;
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    assert_int_equal(load("listen: new\ntargets: [p, q]\nthreads: bad\n", &c, &err), -1);
    assert_string_equal(c.listen, "new");
    assert_int_equal(c.targets.n, 2);
    specd_config_free(FIELDS, N_FIELDS, &c);
    defaults(&c);
    assert_int_equal(load("targets: [p, q, [r]]\n", &c, &err), -1);
    assert_int_equal(c.targets.n, 2); /* the default list, untouched */
    specd_config_free(FIELDS, N_FIELDS, &c);
}

/* ---- flags --------------------------------------------------------------- */

static void test_flags_both_syntaxes(void **state) {
    (void)state;
    char *argv[] = {"svc",       "--threads=8",  "--limits.max_sessions", "32",
                    "--verbose", "--tls.insecure=no", "--backend", "cuda",
                    "--timeout=2s", "--cache", "1GiB", "--temperature=0", "--listen="};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    c.tls.insecure = true;
    assert_int_equal(specd_config_apply_flags(FIELDS, N_FIELDS, argc, argv, &c, NULL, &err), 0);
    assert_int_equal(c.threads, 8);
    assert_int_equal(c.limits.max_sessions, 32);
    assert_true(c.verbose);
    assert_false(c.tls.insecure);
    assert_int_equal(c.backend, BACKEND_CUDA);
    assert_int_equal(c.timeout_ms, 2000);
    assert_true(c.cache == 1ull << 30);
    assert_true(c.temperature == 0);
    assert_string_equal(c.listen, "");
    /* a value may start with a single '-' */
    char *neg[] = {"svc", "--threads", "-4"};
    assert_int_equal(specd_config_apply_flags(FIELDS, N_FIELDS, 3, neg, &c, NULL, &err), -1);
    assert_string_equal(err.msg, "command line: 'threads' expects an integer in 1..1024, got -4");
    specd_config_free(FIELDS, N_FIELDS, &c);
}

static void test_flags_lists(void **state) {
    (void)state;
    char *argv[] = {"svc", "--targets=x:1,y:2", "--targets", "z:3"};
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    /* the first use replaces the default list, later uses append */
    assert_int_equal(specd_config_apply_flags(FIELDS, N_FIELDS, 4, argv, &c, NULL, &err), 0);
    assert_int_equal(c.targets.n, 3);
    assert_string_equal(c.targets.items[0], "x:1");
    assert_string_equal(c.targets.items[1], "y:2");
    assert_string_equal(c.targets.items[2], "z:3");
    char *typo[] = {"svc", "--targets=p,,q"};
    assert_int_equal(specd_config_apply_flags(FIELDS, N_FIELDS, 2, typo, &c, NULL, &err), -1);
    assert_string_equal(err.msg, "command line: 'targets' has an empty item in 'p,,q'");
    assert_int_equal(c.targets.n, 3); /* unchanged */
    char *clear[] = {"svc", "--targets="};
    assert_int_equal(specd_config_apply_flags(FIELDS, N_FIELDS, 2, clear, &c, NULL, &err), 0);
    assert_int_equal(c.targets.n, 0);
    specd_config_free(FIELDS, N_FIELDS, &c);
}

static void test_flags_positionals_and_errors(void **state) {
    (void)state;
    char *argv[] = {"svc", "in.txt", "--threads", "2", "more", "--config=x.yaml", "--",
                    "--not-a-flag"};
    test_cfg c;
    specd_error err = {{0}};
    int n_left = -1;
    defaults(&c);
    assert_int_equal(specd_config_apply_flags(FIELDS, N_FIELDS, 8, argv, &c, &n_left, &err), 0);
    assert_int_equal(c.threads, 2);
    assert_int_equal(n_left, 3);
    assert_string_equal(argv[1], "in.txt");
    assert_string_equal(argv[2], "more");
    assert_string_equal(argv[3], "--not-a-flag");
    /* the rest of argv is the flags, in their order */
    assert_string_equal(argv[4], "--threads");
    assert_string_equal(argv[5], "2");
    assert_string_equal(argv[6], "--config=x.yaml");
    assert_string_equal(argv[7], "--");

    static struct {
        int argc;
        char *argv[3];
        const char *msg;
    } bad[] = {
        {2, {"svc", "--thread=3"},
         "command line: unknown flag '--thread' (did you mean '--threads'?)"},
        {2, {"svc", "--limits.max_sesions=3"},
         "command line: unknown flag '--limits.max_sesions' (did you mean "
         "'--limits.max_sessions'?)"},
        {2, {"svc", "--bogus"}, "command line: unknown flag '--bogus'"},
        {2, {"svc", "-t"}, "command line: unknown flag '-t'"},
        {2, {"svc", "--threads"}, "command line: '--threads' needs a value"},
        {3, {"svc", "--listen", "--threads=4"}, "command line: '--listen' needs a value"},
        {2, {"svc", "extra"}, "command line: unexpected argument 'extra'"},
        {2, {"svc", "--verbose=maybe"},
         "command line: 'verbose' expects true or false, got 'maybe'"},
        {2, {"svc", "--batching.max_wait_ms=soon"},
         "command line: 'batching.max_wait_ms' expects a duration like 5ms, got 'soon'"},
        {2, {"svc", "--config"}, "command line: '--config' needs a value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(
            specd_config_apply_flags(FIELDS, N_FIELDS, bad[i].argc, bad[i].argv, &c, NULL, &err),
            -1);
        assert_string_equal(err.msg, bad[i].msg);
    }
    char *help[] = {"svc", "--threads=3", "-h", "--threads=5"};
    assert_int_equal(specd_config_apply_flags(FIELDS, N_FIELDS, 4, help, &c, NULL, &err), 1);
    assert_int_equal(c.threads, 3);
    specd_config_free(FIELDS, N_FIELDS, &c);
}

/* specd_config_load: defaults, then the --config file, then flags. */
static void test_load_order(void **state) {
    (void)state;
    const char *yaml = "threads: 16\nlisten: file\nlimits: {max_sessions: 7}\n";
    const char *tmp = test_write_temp(yaml, strlen(yaml), ".yaml");
    char path[300], config_flag[320];
    snprintf(path, sizeof path, "%s", tmp);
    snprintf(config_flag, sizeof config_flag, "--config=%s", path);

    char *argv[] = {"svc", "--threads=32", config_flag};
    test_cfg c;
    specd_error err = {{0}};
    assert_int_equal(specd_config_load(FIELDS, N_FIELDS, 3, argv, &c, &err), 0);
    assert_int_equal(c.threads, 32);            /* flag beats file */
    assert_string_equal(c.listen, "file");      /* file beats default */
    assert_int_equal(c.limits.max_sessions, 7);
    assert_int_equal(c.batching.max_wait_ms, 2); /* default */
    specd_config_free(FIELDS, N_FIELDS, &c);

    char *spaced[] = {"svc", "--config", path, "--listen", "flag"};
    assert_int_equal(specd_config_load(FIELDS, N_FIELDS, 5, spaced, &c, &err), 0);
    assert_string_equal(c.listen, "flag");
    assert_int_equal(c.threads, 16);
    specd_config_free(FIELDS, N_FIELDS, &c);

    /* a broken file fails the load and leaves nothing to free */
    FILE *f = fopen(path, "w");
    fputs("threads: 4\nthreads: 5\n", f);
    fclose(f);
    char msg[400];
    snprintf(msg, sizeof msg, "%s:2: duplicate key 'threads' (first set on line 1)", path);
    assert_int_equal(specd_config_load(FIELDS, N_FIELDS, 3, argv, &c, &err), -1);
    assert_string_equal(err.msg, msg);
    /* --help wins even over a broken file */
    char *help[] = {"svc", config_flag, "--help"};
    assert_int_equal(specd_config_load(FIELDS, N_FIELDS, 3, help, &c, &err), 1);
    remove(path);

    char *none[] = {"svc"};
    assert_int_equal(specd_config_load(FIELDS, N_FIELDS, 1, none, &c, &err), 0);
    assert_int_equal(c.threads, 4);
    specd_config_free(FIELDS, N_FIELDS, &c);
    char *empty[] = {"svc", "--config="};
    assert_int_equal(specd_config_load(FIELDS, N_FIELDS, 2, empty, &c, &err), -1);
    assert_string_equal(err.msg, "command line: '--config' needs a value");
}

/* ---- help, dump, schema checks ------------------------------------------ */

static char *capture(void (*fn)(FILE *, const void *), const void *arg) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fn(f, arg);
    fclose(f);
    return text;
}

static void help_to(FILE *f, const void *arg) {
    (void)arg;
    specd_config_print_help(FIELDS, N_FIELDS, f);
}

static void dump_to(FILE *f, const void *cfg) { specd_config_dump(FIELDS, N_FIELDS, cfg, f); }

static void test_help(void **state) {
    (void)state;
    char *text = capture(help_to, NULL);
    static const char *const lines[] = {
        "  --config=PATH                   YAML file with these settings (flags override it)\n",
        "  --threads=INT                   compute threads (in 1..1024, default: 4)\n",
        "  --verbose[=BOOL]                log every request (default: no)\n",
        "  --backend=cpu|cuda              compute backend (default: cpu)\n",
        "  --limits.kv_memory=SIZE         KV cache budget (>= 1MiB, default: 1GiB)\n",
        "  --token=STRING                  auth token\n",
        /* a flag exactly as wide as the first column still fits on its line */
        ("  --batching.max_batch_tokens=INT tokens per forward pass (in 1..1048576, "
         "default: 2048)\n"),
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!strstr(text, lines[i])) fprintf(stderr, "missing:\n%s\nin:\n%s", lines[i], text);
        assert_non_null(strstr(text, lines[i]));
    }
    free(text);

    /* a flag too long for the first column gets a line of its own */
    static const specd_cfg_field longer[] = {
        SPECD_CFG_FIELD("speculation.acceptance_threshold", SPECD_CFG_DOUBLE, test_cfg,
                        temperature, NULL, "stop drafting below this"),
    };
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    specd_config_print_help(longer, 1, f);
    fclose(f);
    assert_non_null(strstr(out, "\n  --speculation.acceptance_threshold=NUM\n"
                                "                                  stop drafting below this\n"));
    free(out);
}

static void test_dump(void **state) {
    (void)state;
    test_cfg c;
    specd_error err = {{0}};
    defaults(&c);
    assert_int_equal(load("token: hunter2\ntls: {cert: \"a \\\"b\\\"\"}\n", &c, &err), 0);
    char *text = capture(dump_to, &c);
    assert_string_equal(text, "listen: \"0.0.0.0:50051\"\n"
                              "threads: 4\n"
                              "temperature: 0.7\n"
                              "verbose: false\n"
                              "backend: cpu\n"
                              "timeout: 1m30s\n"
                              "cache: 512MiB\n"
                              "targets:\n"
                              "  - \"a:1\"\n"
                              "  - \"b:2\"\n"
                              "token: \"<redacted>\"\n"
                              "limits:\n"
                              "  max_sessions: 64\n"
                              "  kv_memory: 1GiB\n"
                              "batching:\n"
                              "  max_batch_tokens: 2048\n"
                              "  max_wait_ms: 2ms\n"
                              "tls:\n"
                              "  cert: \"a \\\"b\\\"\"\n"
                              "  insecure: false\n");
    free(text);
    specd_config_free(FIELDS, N_FIELDS, &c);
}

/* What dump writes, load reads back to the same values. */
static void test_dump_round_trip(void **state) {
    (void)state;
    test_cfg a, b;
    specd_error err = {{0}};
    defaults(&a);
    assert_int_equal(load("listen: \"tab\\there\\nnewline \\x01 é\"\n"
                          "temperature: 0.1\n"
                          "timeout: 1h0m0.001s\n"
                          "cache: 4000000001\n"
                          "targets: []\n"
                          "limits: {kv_memory: 4GB}\n"
                          "tls: {insecure: on}\n",
                          &a, &err),
                     0);
    char *text = capture(dump_to, &a);
    defaults(&b);
    assert_int_equal(load(text, &b, &err), 0);
    assert_string_equal(a.listen, b.listen);
    assert_true(a.temperature == b.temperature);
    assert_int_equal(a.timeout_ms, b.timeout_ms);
    assert_int_equal(b.timeout_ms, 3600001);
    assert_true(a.cache == b.cache);
    assert_int_equal(b.targets.n, 0);
    assert_true(b.limits.kv_memory == 4000000000ull);
    assert_true(b.tls.insecure);
    assert_null(b.tls.cert);
    free(text);
    specd_config_free(FIELDS, N_FIELDS, &a);
    specd_config_free(FIELDS, N_FIELDS, &b);
}

static void test_schema_checks(void **state) {
    (void)state;
    typedef struct {
        int64_t a, b;
    } two;
    static const char *const no_choices[] = {NULL};
    /* each case: a bad first field, then a good one at offset 8 */
#define B {.name = "b", .type = SPECD_CFG_INT64, .offset = 8}
    static const struct {
        specd_cfg_field f[2];
        const char *msg;
    } bad[] = {
        {{{.name = "a..b", .type = SPECD_CFG_INT64}, B},
         "config schema: 'a..b' has an empty component"},
        {{{.name = "a b", .type = SPECD_CFG_INT64}, B},
         "config schema: 'a b' has a character other than letters, digits, '_', '-' and '.'"},
        {{{.name = "b", .type = SPECD_CFG_INT64}, B}, "config schema: 'b' is listed twice"},
        {{{.name = "b.c", .type = SPECD_CFG_INT64}, B},
         "config schema: 'b' is both a field and a section"},
        {{{.name = "config", .type = SPECD_CFG_STRING}, B},
         "config schema: 'config' is a reserved flag name"},
        {{{.name = "a", .type = SPECD_CFG_ENUM, .choices = no_choices}, B},
         "config schema: enum 'a' has no choices"},
        {{{.name = "a", .type = SPECD_CFG_INT64, .min = 5, .max = 1}, B},
         "config schema: 'a' has min > max"},
        {{{.name = "a.b.c.d.e.f.g.h.i", .type = SPECD_CFG_INT64}, B},
         "config schema: 'a.b.c.d.e.f.g.h.i' is nested deeper than 8 levels"},
        {{{.name = "a", .type = SPECD_CFG_INT64, .def = "1", .min = 2, .max = 3}, B},
         "config schema default: 'a' expects an integer in 2..3, got 1"},
    };
#undef B
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        two t;
        specd_error err = {{0}};
        assert_int_equal(specd_config_defaults(bad[i].f, 2, &t, &err), -1);
        assert_string_equal(err.msg, bad[i].msg);
    }
}

/* ---- deploy/config/target-svc.example.yaml ------------------------------ */

/* target-svc's real schema (target-svc/target_config.c) against its example. */
#define TARGET_FIELDS specd_target_cfg_fields
#define N_TARGET specd_target_cfg_n_fields

static void test_target_example_parses(void **state) {
    (void)state;
    specd_target_cfg c;
    specd_error err = {{0}};
    char *argv[] = {"target-svc", "--config",
                    (char *)test_path("deploy/config/target-svc.example.yaml"),
                    "--batching.max_wait", "5ms"};
    int rc = specd_config_load(TARGET_FIELDS, N_TARGET, 5, argv, &c, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_string_equal(c.listen, "0.0.0.0:50052");
    assert_string_equal(c.model, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_int_equal(c.backend, BACKEND_CPU);
    assert_int_equal(c.device, 0);
    assert_int_equal(c.threads, 0);
    assert_int_equal(c.limits.max_sessions, 64);
    assert_int_equal(c.limits.max_prompt_tokens, 32768);
    assert_int_equal(c.limits.max_tree_tokens, 64);
    assert_true(c.limits.kv_memory == 2ull << 30);
    assert_int_equal(c.batching.max_batch_tokens, 2048);
    assert_int_equal(c.batching.max_wait, 5); /* the flag */
    assert_string_equal(c.tls.cert, "/etc/specd/tls/target-svc.crt");
    assert_string_equal(c.tls.key, "/etc/specd/tls/target-svc.key");
    assert_string_equal(c.tls.client_ca, "/etc/specd/tls/ca.crt");
    assert_false(c.tls.insecure);
    specd_config_free(TARGET_FIELDS, N_TARGET, &c);
}

/* kv_cache_dtype: the example's auto, the flag's f16 and q8_0 reaching the
 * backend options (target_opts.c), and a misspelt value refused by name. */
static void test_target_kv_cache_dtype(void **state) {
    (void)state;
    specd_target_cfg c;
    specd_error err = {{0}};
    char *argv[] = {"target-svc", "--config",
                    (char *)test_path("deploy/config/target-svc.example.yaml"),
                    "--kv_cache_dtype", "f16"};
    assert_int_equal(specd_config_load(TARGET_FIELDS, N_TARGET, 3, argv, &c, &err), 0);
    assert_int_equal(c.kv_cache_dtype, SPECD_KV_AUTO);
    specd_config_free(TARGET_FIELDS, N_TARGET, &c);
    assert_int_equal(specd_config_load(TARGET_FIELDS, N_TARGET, 5, argv, &c, &err), 0);
    assert_int_equal(c.kv_cache_dtype, SPECD_KV_F16);
    specd_transformer_opts to;
    specd_transformer_opts_from_config(&c, 8192, &to);
    assert_int_equal(to.backend.kv_dtype, SPECD_KV_F16);
    specd_config_free(TARGET_FIELDS, N_TARGET, &c);
    argv[4] = "q8_0";
    assert_int_equal(specd_config_load(TARGET_FIELDS, N_TARGET, 5, argv, &c, &err), 0);
    specd_transformer_opts_from_config(&c, 8192, &to);
    assert_int_equal(to.backend.kv_dtype, SPECD_KV_Q8_0);
    specd_config_free(TARGET_FIELDS, N_TARGET, &c);
    char *bad[] = {"target-svc", "--config",
                   (char *)test_path("deploy/config/target-svc.example.yaml"),
                   "--kv_cache_dtype", "fp8"};
    assert_int_not_equal(specd_config_load(TARGET_FIELDS, N_TARGET, 5, bad, &c, &err), 0);
    if (!strstr(err.msg, "kv_cache_dtype")) fail_msg("error does not name the key: %s", err.msg);
}

/* The example documents every setting of its schema: each field's key
 * appears in the file (nested keys indented under their section). */
static void test_target_example_is_complete(void **state) {
    (void)state;
    char *text = test_read_file(test_path("deploy/config/target-svc.example.yaml"), NULL);
    assert_non_null(text);
    for (size_t i = 0; i < N_TARGET; i++) {
        const char *name = TARGET_FIELDS[i].name, *dot = strrchr(name, '.');
        char key[80];
        snprintf(key, sizeof key, "\n%s%s:", dot ? "  " : "", dot ? dot + 1 : name);
        if (!strstr(text, key)) fprintf(stderr, "example lacks '%s'\n", name);
        assert_non_null(strstr(text, key));
    }
    free(text);
}

/* ---- deploy/config/draft-svc.example.yaml ------------------------------- */

static void test_draft_example_parses(void **state) {
    (void)state;
    specd_draft_cfg c;
    specd_error err = {{0}};
    char *argv[] = {"draft-svc", "--config",
                    (char *)test_path("deploy/config/draft-svc.example.yaml"),
                    "--targets", "a:1,dns:b:2"};
    int rc = specd_config_load(specd_draft_cfg_fields, specd_draft_cfg_n_fields, 5, argv, &c,
                               &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_string_equal(c.listen, "0.0.0.0:50051");
    assert_string_equal(c.tokenizer, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_int_equal(c.targets.n, 2); /* the flag */
    assert_string_equal(c.targets.items[1], "dns:b:2");
    assert_string_equal(specd_drafter_names[c.drafter.def], "auto");
    /* the shipped speculator and its acceptance head: the example serves
     * what the README's main job measures (default auto: mlp_ngram) */
    assert_string_equal(c.drafter.mlp.path, "models/SmolLM2-135M-Instruct.speculator");
    assert_string_equal(c.drafter.mlp.accept_head,
                        "models/SmolLM2-135M-Instruct.speculator/accept_head");
    assert_true(c.drafter.ngram.enabled);
    assert_int_equal(c.speculation.load_table.n, 1);
    assert_string_equal(c.speculation.load_table.items[0], "1:1x1");
    assert_int_equal(c.speculation.off_above, 32);
    assert_true(c.speculation.adaptive.threshold == 0.0); /* adaptive length off */
    assert_int_equal(c.speculation.adaptive.min_depth, 1);
    assert_int_equal(c.target.step_timeout, 30000);
    assert_string_equal(c.target.tls.server_name, "target-svc");
    assert_false(c.tls.insecure);
    specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &c);
}

/* drafter.mlp.quantize: the example's (and the default) Q4_1 heads, the
 * names in specd_mlp_quant's order, and the old boolean refused by name. */
static void test_draft_mlp_quantize(void **state) {
    (void)state;
    const char *flags[] = {NULL, "--drafter.mlp.quantize=q8_0", "--drafter.mlp.quantize=none",
                           "--drafter.mlp.quantize=true"};
    const int want[] = {SPECD_MLP_Q4_HEAD, SPECD_MLP_Q8_0, SPECD_MLP_AS_STORED, -1};
    for (int i = 0; i < 4; i++) {
        specd_draft_cfg c;
        specd_error err = {{0}};
        char *argv[] = {"draft-svc", "--config",
                        (char *)test_path("deploy/config/draft-svc.example.yaml"),
                        (char *)flags[i]};
        int rc = specd_config_load(specd_draft_cfg_fields, specd_draft_cfg_n_fields,
                                   flags[i] ? 4 : 3, argv, &c, &err);
        if (want[i] < 0) {
            assert_int_equal(rc, -1);
            assert_non_null(strstr(err.msg, "drafter.mlp.quantize"));
            assert_non_null(strstr(err.msg, "q4_1_head"));
            continue;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(c.drafter.mlp.quantize, want[i]);
        assert_string_equal(specd_mlp_quant_names[c.drafter.mlp.quantize],
                            i == 0 ? "q4_1_head" : flags[i] + strlen("--drafter.mlp.quantize="));
        specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &c);
    }
}

static void test_draft_example_is_complete(void **state) {
    (void)state;
    char *text = test_read_file(test_path("deploy/config/draft-svc.example.yaml"), NULL);
    assert_non_null(text);
    for (size_t i = 0; i < specd_draft_cfg_n_fields; i++) {
        const char *name = specd_draft_cfg_fields[i].name, *dot = strrchr(name, '.');
        char key[80];
        /* Indented once per dot: "drafter.ngram.min_n" is "    min_n:". */
        int depth = 0;
        for (const char *p = name; *p; p++) depth += *p == '.';
        snprintf(key, sizeof key, "\n%*s%s:", 2 * depth, "", dot ? dot + 1 : name);
        if (!strstr(text, key)) fprintf(stderr, "example lacks '%s'\n", name);
        assert_non_null(strstr(text, key));
    }
    free(text);
}

/* Every manifest's draft-svc serves what the README measures: drafter
 * auto (mlp_ngram) over the shipped speculator and its acceptance head,
 * both on the models volume. */
static void assert_shipped_speculator(const specd_draft_cfg *d) {
    assert_string_equal(specd_drafter_names[d->drafter.def], "auto");
    assert_string_equal(d->drafter.mlp.path, "/models/SmolLM2-135M-Instruct.speculator");
    assert_string_equal(d->drafter.mlp.accept_head,
                        "/models/SmolLM2-135M-Instruct.speculator/accept_head");
    assert_true(d->drafter.ngram.enabled);
}

/* The Kubernetes configs (deploy/k8s/config/) load with the real schemas,
 * so a manifest never ships a key a service would refuse at startup. */
static void test_k8s_configs_parse(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_target_cfg t;
    char *ta[] = {"target-svc", "--config", (char *)test_path("deploy/k8s/config/target-svc.yaml")};
    int rc = specd_config_load(TARGET_FIELDS, N_TARGET, 3, ta, &t, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_true(t.tls.insecure);
    specd_config_free(TARGET_FIELDS, N_TARGET, &t);
    /* the GPU overlay's config (deploy/k8s-gpu/) */
    char *ga[] = {"target-svc", "--config", (char *)test_path("deploy/k8s-gpu/target-svc-config.yaml")};
    rc = specd_config_load(TARGET_FIELDS, N_TARGET, 3, ga, &t, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_string_equal(specd_target_backends[t.backend], "cuda");
    specd_config_free(TARGET_FIELDS, N_TARGET, &t);
    specd_draft_cfg d;
    char *da[] = {"draft-svc", "--config", (char *)test_path("deploy/k8s/config/draft-svc.yaml")};
    rc = specd_config_load(specd_draft_cfg_fields, specd_draft_cfg_n_fields, 3, da, &d, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(d.targets.n, 1);
    assert_string_equal(d.targets.items[0], "dns:target-svc:50052");
    assert_string_equal(d.metrics.listen, "0.0.0.0:9401");
    assert_int_equal(d.speculation.load_table.n, 1); /* the CPU default */
    assert_string_equal(d.speculation.load_table.items[0], "1:1x1");
    assert_shipped_speculator(&d);
    specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &d);
    /* the GPU overlay's draft-svc: the same, with wider fixed trees */
    char *gd[] = {"draft-svc", "--config", (char *)test_path("deploy/k8s-gpu/draft-svc-config.yaml")};
    rc = specd_config_load(specd_draft_cfg_fields, specd_draft_cfg_n_fields, 3, gd, &d, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_string_equal(d.targets.items[0], "dns:target-svc:50052");
    assert_int_equal(d.speculation.load_table.n, 3);
    assert_string_equal(d.speculation.load_table.items[0], "1:4x5");
    assert_shipped_speculator(&d);
    specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &d);
    /* the co-located overlays: the pair talks over the pod's Unix socket */
    const char *const overlays[] = {"deploy/k8s-colocated", "deploy/k8s-colocated-gpu"};
    for (int i = 0; i < 2; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/target-svc-config.yaml", overlays[i]);
        char *ca[] = {"target-svc", "--config", (char *)test_path(path)};
        rc = specd_config_load(TARGET_FIELDS, N_TARGET, 3, ca, &t, &err);
        if (rc) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, 0);
        assert_string_equal(t.listen, "unix:/run/specd/target.sock");
        specd_config_free(TARGET_FIELDS, N_TARGET, &t);
        snprintf(path, sizeof path, "%s/draft-svc-config.yaml", overlays[i]);
        char *cd[] = {"draft-svc", "--config", (char *)test_path(path)};
        rc = specd_config_load(specd_draft_cfg_fields, specd_draft_cfg_n_fields, 3, cd, &d, &err);
        if (rc) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(d.targets.n, 1);
        assert_string_equal(d.targets.items[0], "unix:/run/specd/target.sock");
        assert_shipped_speculator(&d);
        specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &d);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_every_type),
        cmocka_unit_test(test_nested_sections),
        cmocka_unit_test(test_empty_section_and_nulls),
        cmocka_unit_test(test_sequences),
        cmocka_unit_test(test_bools),
        cmocka_unit_test(test_integers),
        cmocka_unit_test(test_doubles),
        cmocka_unit_test(test_enums),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_strings_take_any_scalar),
        cmocka_unit_test(test_error_unknown_key),
        cmocka_unit_test(test_error_wrong_type),
        cmocka_unit_test(test_error_duplicate_keys),
        cmocka_unit_test(test_error_syntax),
        cmocka_unit_test(test_error_top_level),
        cmocka_unit_test(test_empty_file_is_defaults),
        cmocka_unit_test(test_alias_bomb_refused),
        cmocka_unit_test(test_deep_nesting_refused),
        cmocka_unit_test(test_huge_input_refused),
        cmocka_unit_test(test_failed_load_keeps_struct_valid),
        cmocka_unit_test(test_flags_both_syntaxes),
        cmocka_unit_test(test_flags_lists),
        cmocka_unit_test(test_flags_positionals_and_errors),
        cmocka_unit_test(test_load_order),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_dump),
        cmocka_unit_test(test_dump_round_trip),
        cmocka_unit_test(test_schema_checks),
        cmocka_unit_test(test_target_example_parses),
        cmocka_unit_test(test_target_example_is_complete),
        cmocka_unit_test(test_target_kv_cache_dtype),
        cmocka_unit_test(test_draft_example_parses),
        cmocka_unit_test(test_draft_mlp_quantize),
        cmocka_unit_test(test_draft_example_is_complete),
        cmocka_unit_test(test_k8s_configs_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
