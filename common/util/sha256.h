/* sha256.h - SHA-256 (FIPS 180-4), small and dependency-free.
 *
 * Used for fingerprints that two services compare (target-svc's
 * tokenizer_sha256), not for security decisions. Streaming: init, update any
 * number of times, final. */
#ifndef SPECD_SHA256_H
#define SPECD_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct specd_sha256 {
    uint32_t h[8];
    uint64_t n_bytes;
    uint8_t buf[64];
    size_t n_buf;
} specd_sha256;

void specd_sha256_init(specd_sha256 *c);
void specd_sha256_update(specd_sha256 *c, const void *data, size_t len);
void specd_sha256_final(specd_sha256 *c, uint8_t out[32]);
/* One shot, as 64 lowercase hex digits + NUL. */
void specd_sha256_hex(const void *data, size_t len, char out[65]);
/* The 32-byte digest as 64 lowercase hex digits + NUL. */
void specd_sha256_to_hex(const uint8_t digest[32], char out[65]);

#endif
