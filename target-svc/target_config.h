/* target_config.h - target-svc's settings: the struct and its schema.
 *
 * The schema is a table for the one config loader (common/util/config.h), so the
 * defaults, the YAML keys, the flags and `--help` all come from here. The
 * example file deploy/config/target-svc.example.yaml documents every key;
 * tests/unit/test_config.c checks that it parses with this very schema. */
#ifndef SPECD_TARGET_CONFIG_H
#define SPECD_TARGET_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util/config.h"

typedef struct specd_target_cfg {
    char *listen;
    char *model;
    int backend;
    int64_t device;
    int64_t threads;
    int precision; /* specd_precision, named by specd_precision_names */
    int kv_cache_dtype; /* specd_kv_dtype, named by specd_kv_dtype_names */
    struct {
        int64_t max_sessions, max_prompt_tokens, max_tree_tokens, max_context, kv_wait, queue_wait;
        int64_t max_new_tokens, default_max_new_tokens;
        uint64_t kv_memory;
        bool prefix_cache;
    } limits;
    struct {
        int64_t max_batch_tokens, max_wait, prefill_chunk, prefill_chunk_time, calibrate_tokens;
    } batching;
    struct {
        char *cert, *key, *client_ca;
        bool insecure;
    } tls;
    struct { char *listen; } metrics;
    struct { int format; } log;
} specd_target_cfg;

/* Names of the `backend` enum values, indexed by specd_target_cfg.backend. */
extern const char *const specd_target_backends[];
extern const specd_cfg_field specd_target_cfg_fields[];
extern const size_t specd_target_cfg_n_fields;

#endif
