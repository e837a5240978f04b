/* text_stream.c - tokens -> releasable text (text_stream.h). */
#include "common/text/text_stream.h"

#include <stdlib.h>
#include <string.h>

static int append(specd_text_stream *ts, const char *s, size_t n) {
    if (ts->len + n + 1 > ts->cap) {
        size_t cap = ts->cap ? ts->cap : 256;
        while (cap < ts->len + n + 1) cap *= 2;
        char *t = realloc(ts->text, cap);
        if (!t) return -1;
        ts->text = t;
        ts->cap = cap;
    }
    memcpy(ts->text + ts->len, s, n);
    ts->len += n;
    ts->text[ts->len] = 0;
    return 0;
}

int specd_text_stream_init(specd_text_stream *ts, const specd_tokenizer *tok, char **stops,
                           size_t n_stops, const char *field, specd_error *err) {
    memset(ts, 0, sizeof *ts);
    if (n_stops && !tok)
        return specd_seterr(err, "%s: stop strings need a tokenizer, and this server has none",
                            field);
    if (specd_stopper_init(&ts->stopper, stops, n_stops, field, err)) return -1;
    if (tok) {
        specd_detok_init(&ts->dt, tok);
        ts->have_detok = 1;
    }
    if (append(ts, "", 0)) {
        specd_text_stream_free(ts);
        return specd_seterr(err, "out of memory");
    }
    return 0;
}

void specd_text_stream_free(specd_text_stream *ts) {
    if (ts->have_detok) specd_detok_free(&ts->dt);
    specd_stopper_free(&ts->stopper);
    free(ts->text);
    memset(ts, 0, sizeof *ts);
}

/* Runs text through the stop matcher and keeps what it releases. */
static int through_stopper(specd_text_stream *ts, const char *s, size_t n) {
    size_t safe_len;
    const char *safe = specd_stopper_push(&ts->stopper, s, n, &safe_len);
    if (!safe || append(ts, safe, safe_len)) return -1;
    if (ts->stopper.stopped) ts->stopped = 1;
    return 0;
}

int specd_text_stream_push(specd_text_stream *ts, int32_t tok, specd_error *err) {
    if (!ts->have_detok || ts->stopped) return 0;
    size_t n;
    const char *piece = specd_detok_push(&ts->dt, tok, &n, err);
    if (!piece) return -1;
    if (through_stopper(ts, piece, n)) return specd_seterr(err, "out of memory");
    return ts->stopped;
}

int specd_text_stream_finish(specd_text_stream *ts) {
    if (!ts->have_detok || ts->stopped) return 0;
    size_t n;
    const char *tail = specd_detok_flush(&ts->dt, &n);
    if (through_stopper(ts, tail, n)) return -1;
    if (ts->stopped) return 0; /* the replacement character completed a stop */
    const char *held = specd_stopper_flush(&ts->stopper, &n);
    if (!held || append(ts, held, n)) return -1;
    return 0;
}

const char *specd_text_stream_take(specd_text_stream *ts, size_t *len) {
    /* The returned pointer stays valid until the next call because the
     * buffer is only rewritten by later pushes; resetting len here makes the
     * next append start over at offset 0. */
    *len = ts->len;
    /* Nothing released since the last take: the buffer still holds the text
     * already taken (append writes the NUL only when it runs, and nothing
     * runs after a stop), and callers send it as a C string, so hand out ""
     * rather than that stale text (it used to be streamed twice). */
    if (ts->len == 0) return "";
    ts->len = 0;
    return ts->text;
}
