/* json.h - the one JSON accessor for the files specd reads by key: a
 * Hugging Face config.json and model.safetensors.index.json
 * (common/model/model_hf.c, hf_dir.c), the MLP speculator's and the
 * acceptance head's config.json (common/model/mlp_speculator.c,
 * accept_head.c). cJSON underneath.
 *
 * Every message reads "<file>: '<key>' ...", so a user sees which file and
 * which key. A JSON null counts as absent, as transformers' config classes
 * treat it ("head_dim": null means "use the default"). */
#ifndef SPECD_JSON_H
#define SPECD_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/util/error.h"

/* "a number", "a string", ... for messages; "nothing" for NULL. */
const char *specd_json_type_name(const cJSON *item);

/* obj[key], NULL when absent or null. */
const cJSON *specd_json_member(const cJSON *obj, const char *key);

/* Parses text[len] (no trailing garbage allowed beyond cJSON's rule);
 * NULL + "<file>: not valid JSON (error near byte N)". Free with
 * cJSON_Delete. */
cJSON *specd_json_parse(const char *text, size_t len, const char *file, specd_error *err);

/* item as an integer in [lo, hi] (an integral number; lo = INT_MIN and
 * hi = INT_MAX means "any int"). */
int specd_json_to_int(const cJSON *item, const char *file, const char *key, int lo, int hi,
                      int *out, specd_error *err);

/* obj[key] as an integer in [lo, hi]; absent (or null): an error when
 * required, else def. */
int specd_json_int(const cJSON *obj, const char *file, const char *key, int required, int def,
                   int lo, int hi, int *out, specd_error *err);

/* obj[key] as a number; absent: an error when required, else def. */
int specd_json_float(const cJSON *obj, const char *file, const char *key, int required,
                     float def, float *out, specd_error *err);

/* obj[key] as true/false; absent: def. */
int specd_json_bool(const cJSON *obj, const char *file, const char *key, int def, int *out,
                    specd_error *err);

#endif
