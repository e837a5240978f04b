/* stop_strings.c - see stop_strings.h. */
#include "common/text/stop_strings.h"

#include <stdlib.h>
#include <string.h>

int specd_stopper_init(specd_stopper *st, char **stops, size_t n, const char *field,
                       specd_error *err) {
    memset(st, 0, sizeof *st);
    if (n > SPECD_MAX_STOP_STRINGS)
        return specd_seterr(err, "%s: %zu stop strings, at most %d", field, n,
                            SPECD_MAX_STOP_STRINGS);
    for (size_t i = 0; i < n; i++) {
        size_t len = stops[i] ? strlen(stops[i]) : 0;
        if (len == 0 || len > SPECD_MAX_STOP_LEN) {
            specd_stopper_free(st);
            return specd_seterr(err, "%s[%zu]: must be 1..%d bytes", field, i, SPECD_MAX_STOP_LEN);
        }
        st->stops[i] = strdup(stops[i]);
        if (!st->stops[i]) {
            specd_stopper_free(st);
            return specd_seterr(err, "out of memory");
        }
        st->stop_len[i] = len;
        st->n = i + 1;
    }
    return 0;
}

void specd_stopper_free(specd_stopper *st) {
    for (size_t i = 0; i < st->n; i++) free(st->stops[i]);
    free(st->buf);
    free(st->out);
    memset(st, 0, sizeof *st);
}

/* Length of the longest suffix of s[0..len) that is a proper prefix of some
 * stop string: those bytes might still become a stop string. */
static size_t held_suffix(const specd_stopper *st, const char *s, size_t len) {
    size_t best = 0;
    for (size_t i = 0; i < st->n; i++) {
        size_t max = st->stop_len[i] - 1 < len ? st->stop_len[i] - 1 : len;
        for (size_t k = max; k > best; k--)
            if (!memcmp(s + len - k, st->stops[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* pos moved back to the start of the UTF-8 character it falls in (at most
 * 3 continuation bytes back). The released text must end between whole
 * characters: a cut inside one (a stop string, or a held prefix of one,
 * that begins with a continuation byte) would send a text delta that is not
 * valid UTF-8, which most clients cannot parse as a proto3 string. */
static size_t char_start(const char *buf, size_t pos, size_t total) {
    for (int i = 0; i < 3 && pos > 0 && pos < total && ((unsigned char)buf[pos] & 0xC0) == 0x80;
         i++)
        pos--;
    return pos;
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t cap2 = need * 2;
    char *nb = realloc(*buf, cap2);
    if (!nb) return -1;
    *buf = nb;
    *cap = cap2;
    return 0;
}

const char *specd_stopper_push(specd_stopper *st, const char *text, size_t len, size_t *out_len) {
    *out_len = 0;
    if (st->stopped) return "";
    size_t total = st->held + len;
    if (grow(&st->buf, &st->cap, total + 1) || grow(&st->out, &st->out_cap, total + 1)) return NULL;
    memcpy(st->buf + st->held, text, len);
    /* the earliest stop string in held + new text ends the stream there */
    size_t emit = total;
    for (size_t i = 0; i < st->n; i++) {
        const char *hit = memmem(st->buf, total, st->stops[i], st->stop_len[i]);
        if (hit && (size_t)(hit - st->buf) < emit) emit = (size_t)(hit - st->buf);
    }
    size_t keep = 0;
    if (emit < total) {
        st->stopped = 1;
        /* The partial character before a mid-character match is dropped
         * with the rest of the stream. */
        emit = char_start(st->buf, emit, total);
    } else {
        emit = char_start(st->buf, total - held_suffix(st, st->buf, total), total);
        keep = total - emit;
    }
    memcpy(st->out, st->buf, emit);
    st->out[emit] = 0;
    memmove(st->buf, st->buf + emit, keep);
    st->held = st->stopped ? 0 : keep;
    *out_len = emit;
    return st->out;
}

const char *specd_stopper_flush(specd_stopper *st, size_t *out_len) {
    *out_len = 0;
    if (st->stopped || !st->held) return "";
    if (grow(&st->out, &st->out_cap, st->held + 1)) return NULL;
    memcpy(st->out, st->buf, st->held);
    st->out[st->held] = 0;
    *out_len = st->held;
    st->held = 0;
    return st->out;
}
