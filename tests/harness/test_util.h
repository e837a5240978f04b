/* test_util.h - small helpers shared by the cmocka tests. */
#ifndef SPECD_TEST_UTIL_H
#define SPECD_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/dtype.h"

/* Path under the source tree (SPECD_SOURCE_DIR or "."), in a static buffer
 * that the next call overwrites. */
const char *test_path(const char *rel);
/* Whole file into a malloc'd buffer (NUL-terminated); NULL if unreadable. */
char *test_read_file(const char *path, size_t *len);
/* Writes a buffer to a fresh temp file and returns its path (static). The
 * file is removed when the process exits. */
const char *test_write_temp(const void *buf, size_t len, const char *suffix);
/* 1 if the file exists. */
int test_file_exists(const char *path);
/* Fills with deterministic pseudo-random floats in [-scale, scale]. */
void test_fill_random(float *x, size_t n, uint64_t seed, float scale);

/* rows x cols weights of `type` in the file's block layout, malloc'd:
 * random quants and valid random fp16 scales (floats in [-1, 1) for
 * F32/F16/BF16); *row_bytes gets the bytes per row. Deterministic in seed. */
uint8_t *test_random_weights(specd_dtype type, int64_t rows, int64_t cols, uint64_t seed,
                             size_t *row_bytes);
/* One raw exchange with 127.0.0.1:port: sends `request` as is (e.g.
 * "GET /metrics HTTP/1.0\r\n\r\n"), reads until the server closes (5 s
 * receive timeout), and puts the whole response, NUL-terminated, in buf.
 * Returns the bytes read, or -1 if the connection failed. */
int test_http_raw(int port, const char *request, char *buf, size_t cap);

/* An MLPSpeculator checkpoint (config.json + model.safetensors, the Hugging
 * Face layout IBM publishes) with random F32 weights, shaped for the tiny
 * test model (vocab 512, emb_dim 64): TEST_SPEC_STAGES untied stages of
 * width TEST_SPEC_INNER, written into dir. No trained fixture of that shape
 * exists, and losslessness must hold for any weights, so tests use it to
 * run the mlp path end to end with drafts that are mostly wrong. 0, or -1
 * when a file cannot be written. */
#define TEST_SPEC_INNER 48
#define TEST_SPEC_STAGES 3
int test_write_random_speculator(const char *dir);

#endif
