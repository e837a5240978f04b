/* error.h - one way to report failures: a message buffer the caller owns.
 *
 * Every loader and parser in specd takes a `specd_error *` (may be NULL) and,
 * on failure, returns NULL / a negative value after writing a message that
 * names what was wrong ("tensor 'blk.3.attn_q.weight': shape [576, 575] does
 * not match config [576, 576]").  Messages are meant for users, so they say
 * which file, field, key or offset caused the problem. */
#ifndef SPECD_ERROR_H
#define SPECD_ERROR_H

#include <stdarg.h>

typedef struct specd_error {
    char msg[512];
} specd_error;

/* Formats into err->msg (no-op when err is NULL). Always returns -1 so that
 * callers can write `return specd_seterr(err, "...")`. */
int specd_seterr(specd_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (used to add file names as an
 * error travels up). Returns -1. */
int specd_preferr(specd_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
