/* detok.c - ids back to text, whole or streaming.
 *
 * A byte-level token can end in the middle of a UTF-8 character ("😀" is
 * often two or three tokens), so the streaming decoder keeps the bytes of an
 * unfinished character until the next token. Invalid sequences become U+FFFD
 * exactly as Rust's String::from_utf8_lossy does (what Hugging Face decode()
 * returns), so streaming and whole decoding give the same text. */
#include <stdlib.h>
#include <string.h>

#include "common/text/tokenizer_internal.h"
#include "common/util/utf8.h"

void specd_detok_init(specd_detok *d, const specd_tokenizer *t) {
    memset(d, 0, sizeof *d);
    d->tok = t;
}

void specd_detok_free(specd_detok *d) {
    free(d->out);
    memset(d, 0, sizeof *d);
}

static int reserve_out(specd_detok *d, size_t need) {
    if (need <= d->out_cap) return 0;
    size_t cap = d->out_cap ? d->out_cap : 64;
    while (cap < need) cap *= 2;
    char *out = realloc(d->out, cap);
    if (!out) return -1;
    d->out = out;
    d->out_cap = cap;
    return 0;
}

/* Reads the next character of the logical stream pending + bytes, starting
 * at logical offset i. Copies up to 4 bytes of it into ch. */
static size_t peek(const specd_detok *d, const uint8_t *bytes, size_t n, size_t i, uint8_t ch[4]) {
    size_t total = d->n_pending + n, k = 0;
    for (; k < 4 && i + k < total; k++) {
        size_t at = i + k;
        ch[k] = at < d->n_pending ? d->pending[at] : bytes[at - d->n_pending];
    }
    return k;
}

const char *specd_detok_push(specd_detok *d, int32_t id, size_t *len, specd_error *err) {
    size_t n;
    const uint8_t *bytes = specd_token_bytes(d->tok, id, &n);
    if (!bytes) {
        specd_seterr(err, "detokenize: token id %d is outside the vocabulary (size %d)", id,
                     specd_tokenizer_n_vocab(d->tok));
        return NULL;
    }
    size_t total = d->n_pending + n;
    /* Worst case every byte is invalid and becomes 3 bytes of U+FFFD. */
    if (reserve_out(d, total * SPECD_UTF8_REPLACEMENT_LEN + 1) != 0) {
        specd_seterr(err, "detokenize: out of memory");
        return NULL;
    }
    size_t i = 0, k = 0;
    uint8_t carried[4];
    size_t n_carried = 0;
    while (i < total) {
        uint8_t ch[4];
        size_t avail = peek(d, bytes, n, i, ch), clen;
        specd_utf8_status st = specd_utf8_next(ch, avail, &clen);
        if (st == SPECD_UTF8_TRUNCATED) { /* only possible at the very end */
            memcpy(carried, ch, clen);
            n_carried = clen;
            break;
        }
        if (st == SPECD_UTF8_OK) {
            memcpy(d->out + k, ch, clen);
            k += clen;
        } else {
            memcpy(d->out + k, SPECD_UTF8_REPLACEMENT, SPECD_UTF8_REPLACEMENT_LEN);
            k += SPECD_UTF8_REPLACEMENT_LEN;
        }
        i += clen;
    }
    memcpy(d->pending, carried, n_carried);
    d->n_pending = n_carried;
    d->out[k] = '\0';
    *len = k;
    return d->out;
}

const char *specd_detok_flush(specd_detok *d, size_t *len) {
    if (d->n_pending > 0) {
        memcpy(d->tail, SPECD_UTF8_REPLACEMENT, SPECD_UTF8_REPLACEMENT_LEN);
        d->tail[SPECD_UTF8_REPLACEMENT_LEN] = '\0';
        *len = SPECD_UTF8_REPLACEMENT_LEN;
    } else {
        d->tail[0] = '\0';
        *len = 0;
    }
    d->n_pending = 0;
    return d->tail;
}

char *specd_detokenize(const specd_tokenizer *t, const int32_t *ids, size_t n, size_t *len,
                       specd_error *err) {
    specd_detok d;
    specd_detok_init(&d, t);
    char *text = NULL;
    size_t used = 0, cap = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t piece_len;
        const char *piece = i < n ? specd_detok_push(&d, ids[i], &piece_len, err)
                                  : specd_detok_flush(&d, &piece_len);
        if (!piece) goto fail;
        if (used + piece_len + 1 > cap) {
            size_t new_cap = cap ? cap : 64;
            while (new_cap < used + piece_len + 1) new_cap *= 2;
            char *bigger = realloc(text, new_cap);
            if (!bigger) {
                specd_seterr(err, "detokenize: out of memory");
                goto fail;
            }
            text = bigger;
            cap = new_cap;
        }
        memcpy(text + used, piece, piece_len);
        used += piece_len;
    }
    specd_detok_free(&d);
    if (!text && !(text = malloc(1))) {
        specd_seterr(err, "detokenize: out of memory");
        return NULL;
    }
    text[used] = '\0';
    if (len) *len = used;
    return text;
fail:
    specd_detok_free(&d);
    free(text);
    return NULL;
}
