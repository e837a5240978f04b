/* json.c - see json.h. */
#include "common/util/json.h"

#include <limits.h>
#include <math.h>

const char *specd_json_type_name(const cJSON *item) {
    if (!item) return "nothing";
    if (cJSON_IsNull(item)) return "null";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsObject(item)) return "an object";
    return "invalid";
}

const cJSON *specd_json_member(const cJSON *obj, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(item) ? NULL : item;
}

cJSON *specd_json_parse(const char *text, size_t len, const char *file, specd_error *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root)
        specd_seterr(err, "%s: not valid JSON (error near byte %ld)", file,
                     end ? (long)(end - text) : -1L);
    return root;
}

int specd_json_to_int(const cJSON *item, const char *file, const char *key, int lo, int hi,
                      int *out, specd_error *err) {
    if (!cJSON_IsNumber(item))
        return specd_seterr(err, "%s: '%s' must be an integer, got %s", file, key,
                            specd_json_type_name(item));
    double v = item->valuedouble;
    if (v != floor(v) || !(v >= lo && v <= hi)) {
        if (lo == INT_MIN && hi == INT_MAX)
            return specd_seterr(err, "%s: '%s' = %g is not an integer in the int range", file,
                                key, v);
        return specd_seterr(err, "%s: '%s' = %g must be an integer in %d..%d", file, key, v, lo,
                            hi);
    }
    *out = (int)v;
    return 0;
}

int specd_json_int(const cJSON *obj, const char *file, const char *key, int required, int def,
                   int lo, int hi, int *out, specd_error *err) {
    const cJSON *item = specd_json_member(obj, key);
    if (!item) {
        if (required) return specd_seterr(err, "%s: '%s' is missing", file, key);
        *out = def;
        return 0;
    }
    return specd_json_to_int(item, file, key, lo, hi, out, err);
}

int specd_json_float(const cJSON *obj, const char *file, const char *key, int required,
                     float def, float *out, specd_error *err) {
    const cJSON *item = specd_json_member(obj, key);
    if (!item) {
        if (required) return specd_seterr(err, "%s: '%s' is missing", file, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(item))
        return specd_seterr(err, "%s: '%s' must be a number, got %s", file, key,
                            specd_json_type_name(item));
    *out = (float)item->valuedouble;
    return 0;
}

int specd_json_bool(const cJSON *obj, const char *file, const char *key, int def, int *out,
                    specd_error *err) {
    const cJSON *item = specd_json_member(obj, key);
    if (!item) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(item))
        return specd_seterr(err, "%s: '%s' must be true or false, got %s", file, key,
                            specd_json_type_name(item));
    *out = cJSON_IsTrue(item);
    return 0;
}
