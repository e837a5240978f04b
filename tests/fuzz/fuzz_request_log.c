/* fuzz_request_log.c - libFuzzer target for what the request log and the
 * metrics exposition do with bytes a client controls: the x-request-id
 * metadata value (specd_request_id_valid decides whether it is kept), and
 * strings that end up in a log line or a label value.
 *
 * Invariants, for any input:
 *   - a valid id is 1..SPECD_REQUEST_ID_MAX bytes of [A-Za-z0-9._:-];
 *   - a log line is one line (no raw newline), in JSON mode it parses back
 *     and gives the value unchanged, and in text mode key=value splits back
 *     into the same value (quoted values unescaped);
 *   - an exposition with the value as a label has exactly the lines it
 *     would have with a plain value (no line can be injected). */
#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/rpc/metrics.h"
#include "common/rpc/request_log.h"

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The value of ` key=` in a text line, unquoted and unescaped as the
 * format writes it (request_log.c); NULL if the line does not parse. */
static char *text_value(const char *line, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    if (!p) return NULL;
    p += strlen(pat);
    char *out = malloc(strlen(p) + 1), *o = out;
    if (!out) return NULL;
    if (*p != '"') { /* plain: up to the next space */
        while (*p && *p != ' ') *o++ = *p++;
        *o = 0;
        return out;
    }
    for (p++; *p && *p != '"'; p++) {
        if (*p != '\\') {
            *o++ = *p;
        } else if (p[1] == 'x' && isxdigit((unsigned char)p[2]) && isxdigit((unsigned char)p[3])) {
            char hex[3] = {p[2], p[3], 0};
            *o++ = (char)strtol(hex, NULL, 16);
            p += 3;
        } else if (p[1]) {
            *o++ = *++p;
        }
    }
    *o = 0;
    if (*p != '"') {
        free(out);
        return NULL;
    }
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0; /* metadata values are small; keep runs fast */
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0; /* as the metadata reader hands it on: cut at the first NUL */
    size_t len = strlen(s);

    if (specd_request_id_valid(s)) {
        if (len == 0 || len > SPECD_REQUEST_ID_MAX) abort();
        for (size_t i = 0; i < len; i++)
            if (!isalnum((unsigned char)s[i]) && !strchr("._:-", s[i])) abort();
    }

    specd_log_field f[] = {SPECD_LOG_STR("id", s), SPECD_LOG_INT("n", (long long)size)};
    for (int fmt = 0; fmt < 2; fmt++) {
        specd_request_log_set_format(fmt ? SPECD_LOG_JSON : SPECD_LOG_TEXT);
        char *line = specd_request_log_format("fuzz", f, 2);
        if (!line) continue; /* out of memory, or not valid UTF-8 for cJSON's printer */
        if (strchr(line, '\n')) abort();
        if (fmt) {
            cJSON *j = cJSON_Parse(line);
            cJSON *id = cJSON_GetObjectItem(j, "id");
            if (!j || !cJSON_IsString(id) || strcmp(id->valuestring, s)) abort();
            cJSON_Delete(j);
        } else {
            char *back = text_value(line, "id");
            if (!back || strcmp(back, s)) abort();
            free(back);
        }
        free(line);
    }

    specd_metrics *r = specd_metrics_new();
    specd_metric *c = specd_metrics_counter(r, "fuzz_total", "x", "v");
    specd_metric_add(c, SPECD_LABELS(s), 1);
    char *text = specd_metrics_render(r, NULL);
    /* dropped-series counter: HELP, TYPE, value; ours: HELP, TYPE, one series */
    if (text && count_lines(text) != 6) abort();
    free(text);
    specd_metrics_free(r);
    free(s);
    return 0;
}
