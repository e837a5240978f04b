/* test_util.h - small helpers shared by the cmocka tests. */
#ifndef SPECD_TEST_UTIL_H
#define SPECD_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Path under the source tree (SPECD_SOURCE_DIR or "."), in a static buffer
 * that the next call overwrites. */
const char *test_path(const char *rel);
/* Whole file into a malloc'd buffer (NUL-terminated); NULL if unreadable. */
char *test_read_file(const char *path, size_t *len);
/* Writes a buffer to a fresh temp file and returns its path (static). */
const char *test_write_temp(const void *buf, size_t len, const char *suffix);
/* 1 if the file exists. */
int test_file_exists(const char *path);
/* Fills with deterministic pseudo-random floats in [-scale, scale]. */
void test_fill_random(float *x, size_t n, uint64_t seed, float scale);

#endif
