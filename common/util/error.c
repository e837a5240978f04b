/* error.c - see error.h. */
#include "common/util/error.h"

#include <stdio.h>
#include <string.h>

int specd_seterr(specd_error *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int specd_preferr(specd_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* "prefix: old", truncated to the buffer (a long message loses its tail,
     * never its start, which names the outermost context) */
    size_t cap = sizeof err->msg, n = strnlen(prefix, cap - 1);
    memcpy(err->msg, prefix, n);
    if (n + 2 < cap) {
        memcpy(err->msg + n, ": ", 2);
        n += 2;
    }
    size_t rest = strnlen(old, sizeof old);
    if (rest > cap - 1 - n) rest = cap - 1 - n;
    memcpy(err->msg + n, old, rest);
    err->msg[n + rest] = 0;
    return -1;
}
