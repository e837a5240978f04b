/* utf8.h - UTF-8 scanning for the tokenizer and the streaming decoder.
 *
 * Text reaching specd may be any bytes (a client can send invalid UTF-8, and
 * a byte-level BPE token can end in the middle of a character), so these
 * helpers classify bytes exactly like the Unicode "maximal subpart" rule that
 * Rust's String::from_utf8_lossy and Python's errors="replace" follow: each
 * maximal invalid subsequence becomes one U+FFFD. */
#ifndef SPECD_UTF8_H
#define SPECD_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The replacement character U+FFFD, encoded. */
#define SPECD_UTF8_REPLACEMENT "\xEF\xBF\xBD"
#define SPECD_UTF8_REPLACEMENT_LEN 3

typedef enum specd_utf8_status {
    SPECD_UTF8_OK = 0,        /* a complete, valid character of `len` bytes */
    SPECD_UTF8_INVALID = 1,   /* `len` bytes form one maximal invalid subpart */
    SPECD_UTF8_TRUNCATED = 2, /* `len` bytes are a valid prefix that the buffer cut short */
} specd_utf8_status;

/* Classifies the character starting at s[0] (n >= 1). Sets *len (>= 1). */
specd_utf8_status specd_utf8_next(const uint8_t *s, size_t n, size_t *len);

/* Encodes a code point (< 0x110000) into out (4 bytes); returns its length. */
size_t specd_utf8_encode(uint32_t cp, uint8_t out[4]);

/* Decodes the valid character at s (caller checked with specd_utf8_next). */
uint32_t specd_utf8_decode(const uint8_t *s, size_t len);

/* 1 if the whole buffer is valid UTF-8. */
int specd_utf8_valid(const uint8_t *s, size_t n);

#endif
