/* test_util.c - see test_util.h. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *test_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("SPECD_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

const char *test_write_temp(const void *buf, size_t len, const char *suffix) {
    static char path[256];
    static int counter;
    snprintf(path, sizeof path, "/tmp/specd_test_%d_%d%s", (int)getpid(), counter++,
             suffix ? suffix : "");
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fwrite(buf, 1, len, f);
    fclose(f);
    return path;
}

int test_file_exists(const char *path) { return access(path, R_OK) == 0; }

void test_fill_random(float *x, size_t n, uint64_t seed, float scale) {
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 33;
        s *= 0xff51afd7ed558ccdULL;
        s ^= s >> 33;
        x[i] = ((float)(s >> 40) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
    }
}
