/* draft_config.h - draft-svc's settings: the struct and its schema.
 *
 * One table for the one config loader (common/config.h): defaults, YAML
 * keys, flags and --help all come from here. deploy/config/
 * draft-svc.example.yaml documents every key; tests/unit/test_config.c
 * checks that it parses with this very schema. */
#ifndef SPECD_DRAFT_CONFIG_H
#define SPECD_DRAFT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util/config.h"

typedef struct specd_draft_cfg {
    char *listen;
    char *tokenizer;
    int64_t threads;
    specd_cfg_strlist targets;
    struct {
        int def;
        struct { char *path, *accept_head; int backend; int64_t device; int quantize; } mlp;
        struct { char *path; int64_t max_sessions, max_ctx; } draft_lm;
        struct { bool enabled; int64_t min_n, max_n, max_scan; double min_prob; } ngram;
    } drafter;
    struct {
        int tree;        /* specd_speculation_trees: 0 cost, 1 table */
        char *max_shape;
        specd_cfg_strlist load_table;
        int64_t off_above;
        double min_acceptance, ewma_alpha;
        int64_t warmup_steps, cooldown_steps;
        struct { double threshold; int64_t min_depth; } adaptive;
        bool sampled_load_aware;
        bool pipeline;
        struct { int64_t max_tokens; bool shared; } suffix_cache; /* ngram's shared cache */
    } speculation;
    struct {
        int64_t max_prompt_tokens, max_new_tokens, default_max_new_tokens, max_tree_tokens;
        int64_t max_calls;
    } limits;
    struct {
        int64_t step_timeout, open_timeout, max_failovers, resolve_interval;
        struct { char *ca, *cert, *key, *server_name; bool insecure; } tls;
    } target;
    struct {
        char *cert, *key, *client_ca;
        bool insecure;
    } tls;
    struct { char *listen; } metrics;
    struct { int format; } log;
} specd_draft_cfg;

/* `drafter.default` choices: specd_drafter_names (service.h), the one
 * list of drafter names. */
/* Names of drafter.mlp.backend, indexed by its value. */
extern const char *const specd_draft_backends[];
extern const char *const specd_mlp_quant_names[];
/* Names of speculation.tree, indexed by its value. */
extern const char *const specd_speculation_trees[];
extern const specd_cfg_field specd_draft_cfg_fields[];
extern const size_t specd_draft_cfg_n_fields;

#endif
