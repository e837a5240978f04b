/* request_log.h - one structured log line per request, and the request id
 * that joins draft-svc's line with target-svc's.
 *
 * draft-svc makes an id for every Generate call (or keeps the client's
 * `x-request-id` metadata when it is a valid id) and sends it to target-svc
 * in the Verify stream's metadata under the same key; each service writes
 * one line on stderr when the request ends:
 *
 *   text: specd draft-svc request id=6f1c... method=Generate code=OK tokens=64 ...
 *   json: {"ts":"2026-11-25T06:40:01.123Z","service":"draft-svc","event":"request",
 *          "id":"6f1c...","method":"Generate","code":"OK","tokens":64,...}
 *
 * (`log.format: json` in either service's config). JSON is built with
 * cJSON, so every value is escaped; ids are also checked before use
 * (specd_request_id_valid), since the metadata comes from the client. Each
 * line is written with one stdio call under the stream's lock, so lines of
 * concurrent requests never interleave. */
#ifndef SPECD_REQUEST_LOG_H
#define SPECD_REQUEST_LOG_H

#include <stddef.h>

#include "specd.pb-c.h"

/* The metadata key both services use. */
#define SPECD_REQUEST_ID_KEY "x-request-id"
/* Longest id accepted (ids we make are 32 hex digits). */
#define SPECD_REQUEST_ID_MAX 64

typedef enum { SPECD_LOG_TEXT = 0, SPECD_LOG_JSON = 1 } specd_log_format;
/* The `log.format` config choices, indexed by specd_log_format. */
extern const char *const specd_log_formats[];

/* Process-wide; set once by main() before serving. Until it is called no
 * line is written at all: the services' code also runs inside `specd
 * generate` and the tests, whose stderr is theirs. */
void specd_request_log_set_format(specd_log_format f);

/* 1 when s is 1..SPECD_REQUEST_ID_MAX characters of [A-Za-z0-9._:-]. */
int specd_request_id_valid(const char *s);

/* A fresh random id: 32 lower-case hex digits (128 bits) + NUL. */
void specd_request_id_new(char out[33]);

typedef enum { SPECD_LF_STR, SPECD_LF_INT, SPECD_LF_NUM } specd_log_field_type;
typedef struct specd_log_field {
    const char *key;
    specd_log_field_type type;
    const char *s; /* STR (NULL = omitted) */
    long long i;   /* INT */
    double d;      /* NUM */
} specd_log_field;

#define SPECD_LOG_STR(k, v) ((specd_log_field){.key = (k), .type = SPECD_LF_STR, .s = (v)})
#define SPECD_LOG_INT(k, v) ((specd_log_field){.key = (k), .type = SPECD_LF_INT, .i = (v)})
#define SPECD_LOG_NUM(k, v) ((specd_log_field){.key = (k), .type = SPECD_LF_NUM, .d = (v)})

/* Formats one line ("service", "event":"request", a UTC timestamp, then the
 * fields in order) in the current format (text while none is set), without
 * the newline. malloc'd; NULL on out of memory. */
char *specd_request_log_format(const char *service, const specd_log_field *fields, int n);

/* specd_request_log_format + newline, written to stderr; nothing while no
 * format was set. */
void specd_request_log(const char *service, const specd_log_field *fields, int n);

/* "eos", "stop", "length", "context", "cancelled" or "unspecified": how
 * logs, metrics and the CLI spell a finish reason. */
const char *specd_finish_reason_name(Specd__V1__FinishReason f);

#endif
