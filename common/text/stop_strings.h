/* stop_strings.h - ends a text stream at the first of several stop strings.
 *
 * Tokens arrive one at a time and a stop string may span several of them, so
 * text that could still turn into a stop string is held back until it cannot
 * (or until the stream ends). What push() releases is therefore always safe:
 * nothing at or after a stop string is ever emitted. The stop string itself
 * is not emitted either (as OpenAI-style APIs behave). Text is released
 * and held back in whole UTF-8 characters only, so every piece released is
 * valid UTF-8 when the text pushed is (requests' stop strings are checked
 * to be valid UTF-8 too: common/rpc/admission.h). */
#ifndef SPECD_STOP_STRINGS_H
#define SPECD_STOP_STRINGS_H

#include <stddef.h>

#include "common/util/error.h"

#define SPECD_MAX_STOP_STRINGS 16
#define SPECD_MAX_STOP_LEN 256

typedef struct specd_stopper {
    char *stops[SPECD_MAX_STOP_STRINGS];
    size_t stop_len[SPECD_MAX_STOP_STRINGS];
    size_t n;
    char *buf;       /* held text followed by the newest push */
    size_t held;     /* bytes of buf held back */
    size_t cap;
    char *out;       /* text released by the last call */
    size_t out_cap;
    int stopped;
} specd_stopper;

/* Copies the stop strings. Each must be 1..SPECD_MAX_STOP_LEN bytes; at most
 * SPECD_MAX_STOP_STRINGS. `field` names them in errors ("request.stop"). */
int specd_stopper_init(specd_stopper *st, char **stops, size_t n, const char *field,
                       specd_error *err);
void specd_stopper_free(specd_stopper *st);

/* Adds text; returns the text that is now safe to emit (owned by st, valid
 * until the next call) with its length in *out_len. Sets st->stopped when a
 * stop string matched: the returned text then ends right before it, and
 * later pushes return nothing. NULL when out of memory. */
const char *specd_stopper_push(specd_stopper *st, const char *text, size_t len, size_t *out_len);
/* At the end of the stream: the held text, which can no longer complete a
 * stop string ("" after a stop). */
const char *specd_stopper_flush(specd_stopper *st, size_t *out_len);

#endif
