/* text_stream.h - generated tokens -> the text a client may see.
 *
 * Both services stream text as tokens come out, and both must get the same
 * two things right:
 *   - never half a UTF-8 character (the streaming detokenizer holds the
 *     bytes of an unfinished character until a later token completes it);
 *   - nothing past a stop string (text that could still turn out to be the
 *     start of one is held back; on a match the text ends right before it and
 *     the generation must end with the token that completed it).
 * This wraps specd_detok and specd_stopper into one object that collects the
 * releasable text of any number of tokens, so a step that accepted several
 * tokens becomes one message. */
#ifndef SPECD_TEXT_STREAM_H
#define SPECD_TEXT_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"
#include "common/text/stop_strings.h"
#include "common/text/tokenizer.h"

typedef struct specd_text_stream {
    int have_detok;   /* 0 without a tokenizer: no text at all, ids only */
    specd_detok dt;
    specd_stopper stopper;
    char *text;       /* released since the last take, NUL-terminated */
    size_t len, cap;
    int stopped;      /* a stop string matched */
} specd_text_stream;

/* tok may be NULL (then stop strings are refused: they need text). field
 * names the stop list in errors ("request.stop"). */
int specd_text_stream_init(specd_text_stream *ts, const specd_tokenizer *tok, char **stops,
                           size_t n_stops, const char *field, specd_error *err);
void specd_text_stream_free(specd_text_stream *ts);

/* Adds one token. 1 if a stop string completed within its text (the caller
 * must end the generation after this token), 0 if not, -1 + err on failure
 * (an id outside the vocabulary, out of memory). After a stop, further
 * tokens add nothing. */
int specd_text_stream_push(specd_text_stream *ts, int32_t tok, specd_error *err);

/* The generation ended for another reason (EOS, length, ...): releases what
 * was held (an unfinished character as U+FFFD, text that might have begun a
 * stop string). -1 when out of memory. */
int specd_text_stream_finish(specd_text_stream *ts);

/* The text released since the last take (owned by ts, valid until the next
 * call), then forgets it. */
const char *specd_text_stream_take(specd_text_stream *ts, size_t *len);

#endif
