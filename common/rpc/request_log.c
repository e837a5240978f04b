/* request_log.c - see request_log.h. */
#include "common/rpc/request_log.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <cjson/cJSON.h>

const char *const specd_log_formats[] = {"text", "json", NULL};

static atomic_int log_format = -1; /* -1: off (no main() asked for lines) */

void specd_request_log_set_format(specd_log_format f) { atomic_store(&log_format, (int)f); }

int specd_request_id_valid(const char *s) {
    size_t n = 0;
    for (; s && s[n]; n++) {
        unsigned char ch = (unsigned char)s[n];
        if (n == SPECD_REQUEST_ID_MAX ||
            !(isalnum(ch) || ch == '.' || ch == '_' || ch == ':' || ch == '-'))
            return 0;
    }
    return n > 0;
}

void specd_request_id_new(char out[33]) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        /* no entropy (cannot happen on Linux >= 3.17 once booted): time and a
         * counter still give ids unique within this process */
        static atomic_ullong seq;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long a = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
        unsigned long long c = atomic_fetch_add(&seq, 1);
        memcpy(b, &a, 8);
        memcpy(b + 8, &c, 8);
    }
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* 2026-11-25T06:40:01.123Z */
static void utc_now(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

static char *format_json(const char *ts, const char *service, const specd_log_field *f, int n) {
    cJSON *o = cJSON_CreateObject();
    int ok = o && cJSON_AddStringToObject(o, "ts", ts) &&
             cJSON_AddStringToObject(o, "service", service) &&
             cJSON_AddStringToObject(o, "event", "request");
    for (int i = 0; ok && i < n; i++) {
        if (f[i].type == SPECD_LF_STR) {
            if (f[i].s) ok = cJSON_AddStringToObject(o, f[i].key, f[i].s) != NULL;
        } else {
            ok = cJSON_AddNumberToObject(o, f[i].key, f[i].type == SPECD_LF_INT ? (double)f[i].i
                                                                                 : f[i].d) != NULL;
        }
    }
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* key=value pairs; a string value with spaces, quotes or control bytes is
 * quoted with those escaped, so a line always splits back into its fields. */
static char *format_text(const char *ts, const char *service, const specd_log_field *f, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return NULL;
    fprintf(m, "%s %s request", ts, service);
    for (int i = 0; i < n; i++) {
        if (f[i].type == SPECD_LF_INT) {
            fprintf(m, " %s=%lld", f[i].key, f[i].i);
        } else if (f[i].type == SPECD_LF_NUM) {
            fprintf(m, " %s=%.6g", f[i].key, f[i].d);
        } else if (f[i].s) {
            const char *s = f[i].s;
            int plain = *s != 0;
            for (const char *p = s; *p; p++)
                if ((unsigned char)*p <= ' ' || *p == '"' || *p == '\\' || *p == 0x7f) plain = 0;
            fprintf(m, " %s=", f[i].key);
            if (plain) {
                fputs(s, m);
                continue;
            }
            fputc('"', m);
            for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
                if (*p == '"' || *p == '\\') fprintf(m, "\\%c", *p);
                else if (*p < ' ' || *p == 0x7f) fprintf(m, "\\x%02x", *p);
                else fputc(*p, m);
            }
            fputc('"', m);
        }
    }
    if (fclose(m)) {
        free(buf);
        return NULL;
    }
    return buf;
}

char *specd_request_log_format(const char *service, const specd_log_field *fields, int n) {
    char ts[40];
    utc_now(ts, sizeof ts);
    return atomic_load(&log_format) == SPECD_LOG_JSON ? format_json(ts, service, fields, n)
                                                      : format_text(ts, service, fields, n);
}

void specd_request_log(const char *service, const specd_log_field *fields, int n) {
    if (atomic_load(&log_format) < 0) return;
    char *line = specd_request_log_format(service, fields, n);
    if (!line) return;
    flockfile(stderr);
    fputs(line, stderr);
    fputc('\n', stderr);
    funlockfile(stderr);
    free(line);
}

const char *specd_finish_reason_name(Specd__V1__FinishReason f) {
    switch (f) {
    case SPECD__V1__FINISH_REASON__FINISH_REASON_EOS: return "eos";
    case SPECD__V1__FINISH_REASON__FINISH_REASON_STOP: return "stop";
    case SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH: return "length";
    case SPECD__V1__FINISH_REASON__FINISH_REASON_CONTEXT: return "context";
    case SPECD__V1__FINISH_REASON__FINISH_REASON_CANCELLED: return "cancelled";
    default: return "unspecified";
    }
}
