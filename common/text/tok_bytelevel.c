/* tok_bytelevel.c - GPT-2's byte <-> unicode alphabet (bytes_to_unicode in
 * the original encoder.py), used to read byte-level vocabularies. */
#include <pthread.h>

#include "common/text/tokenizer_internal.h"
#include "common/util/utf8.h"

/* Bytes that stand for themselves: '!'..'~', '¡'..'¬', '®'..'ÿ'. */
static int is_self_byte(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (is_self_byte(b)) return b;
    /* The others get U+0100 + (their rank among the non-self bytes). */
    unsigned rank = 0;
    for (unsigned x = 0; x < b; x++)
        if (!is_self_byte(x)) rank++;
    return 0x100 + rank;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return is_self_byte(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    unsigned rank = cp - 0x100;
    for (unsigned x = 0; x < 256; x++) {
        if (is_self_byte(x)) continue;
        if (rank == 0) return (int)x;
        rank--;
    }
    return -1;
}

/* The loops above run once per byte value; tables make the hot paths O(1). */
static uint8_t spelled[256][2];
static uint8_t spelled_len[256];
static int16_t cp_byte[0x100 + 68];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (unsigned b = 0; b < 256; b++) {
        uint8_t enc[4];
        spelled_len[b] = (uint8_t)specd_utf8_encode(tok_byte_to_cp((uint8_t)b), enc);
        spelled[b][0] = enc[0];
        spelled[b][1] = enc[1];
    }
    for (uint32_t cp = 0; cp < 0x100 + 68; cp++) cp_byte[cp] = (int16_t)tok_cp_to_byte(cp);
}

static void ensure_tables(void) { pthread_once(&tables_once, build_tables); }

size_t tok_bytes_to_text(const uint8_t *bytes, size_t n, char *out) {
    ensure_tables();
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        out[k++] = (char)spelled[bytes[i]][0];
        if (spelled_len[bytes[i]] == 2) out[k++] = (char)spelled[bytes[i]][1];
    }
    return k;
}

long tok_text_to_bytes(const char *text, size_t len, uint8_t *out) {
    ensure_tables();
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0, k = 0;
    while (i < len) {
        size_t clen;
        if (specd_utf8_next(s + i, len - i, &clen) != SPECD_UTF8_OK) return -1;
        uint32_t cp = specd_utf8_decode(s + i, clen);
        if (cp >= 0x100 + 68 || cp_byte[cp] < 0) return -1;
        out[k++] = (uint8_t)cp_byte[cp];
        i += clen;
    }
    return (long)k;
}
