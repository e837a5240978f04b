/* utf8.c - see utf8.h. */
#include "common/util/utf8.h"

/* The second byte's allowed range depends on the lead byte (this is what
 * rules out overlong forms, surrogates and code points above U+10FFFF);
 * later continuation bytes are always 0x80..0xBF. Table 3-7 of the Unicode
 * standard. */
static int second_byte_ok(uint8_t lead, uint8_t b) {
    switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
    }
}

static size_t sequence_length(uint8_t lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0; /* 0x80..0xC1 and 0xF5..0xFF never start a character */
}

specd_utf8_status specd_utf8_next(const uint8_t *s, size_t n, size_t *len) {
    size_t need = sequence_length(s[0]);
    if (need == 0) {
        *len = 1;
        return SPECD_UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = i;
            return SPECD_UTF8_TRUNCATED;
        }
        int ok = i == 1 ? second_byte_ok(s[0], s[i]) : (s[i] & 0xC0) == 0x80;
        if (!ok) {
            /* The bytes so far were a valid prefix; they are one subpart. */
            *len = i;
            return SPECD_UTF8_INVALID;
        }
    }
    *len = need;
    return SPECD_UTF8_OK;
}

size_t specd_utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t specd_utf8_decode(const uint8_t *s, size_t len) {
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

int specd_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t len;
        if (specd_utf8_next(s + i, n - i, &len) != SPECD_UTF8_OK) return 0;
        i += len;
    }
    return 1;
}
