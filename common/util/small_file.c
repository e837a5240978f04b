/* small_file.c - capped whole-file reads and path joining (small_file.h). */
#include "common/util/small_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *specd_read_small_file(const char *path, size_t max_bytes, size_t *len, specd_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        specd_seterr(err, "cannot open '%s'", path);
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0) n = ftell(fp);
    if (n < 0 || (unsigned long)n > max_bytes || fseek(fp, 0, SEEK_SET) != 0) {
        specd_seterr(err, "'%s' is unreadable or larger than %zu bytes", path, max_bytes);
    } else if (!(buf = malloc((size_t)n + 1))) {
        specd_seterr(err, "out of memory reading '%s'", path);
    } else if (fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        specd_seterr(err, "cannot read '%s'", path);
        free(buf);
        buf = NULL;
    } else {
        buf[n] = 0;
        *len = (size_t)n;
    }
    fclose(fp);
    return buf;
}

FILE *specd_atomic_open(const char *path, char tmp[SPECD_ATOMIC_TMP_MAX], specd_error *err) {
    if (snprintf(tmp, SPECD_ATOMIC_TMP_MAX, "%s.tmp.%ld", path, (long)getpid()) >=
        SPECD_ATOMIC_TMP_MAX) {
        specd_seterr(err, "%s: path too long", path);
        return NULL;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) specd_seterr(err, "%s: cannot create: %s", tmp, strerror(errno));
    return f;
}

int specd_atomic_commit(FILE *f, const char *tmp, const char *path, int failed, specd_error *err) {
    /* the data must be on disk before the rename makes it the file */
    int bad = failed || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int saved = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        saved = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        bad = 1;
        saved = errno;
    }
    if (bad) {
        unlink(tmp);
        return specd_seterr(err, "%s: write failed: %s", path, strerror(saved));
    }
    return 0;
}

int specd_write_small_file(const char *path, const void *data, size_t len, specd_error *err) {
    char tmp[SPECD_ATOMIC_TMP_MAX];
    FILE *f = specd_atomic_open(path, tmp, err);
    if (!f) return -1;
    return specd_atomic_commit(f, tmp, path, fwrite(data, 1, len, f) != len, err);
}

int specd_path_join(char *out, size_t cap, const char *dir, const char *name, specd_error *err) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap)
        return specd_seterr(err, "path '%.64s/%s' is too long", dir, name);
    return 0;
}

int specd_is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
