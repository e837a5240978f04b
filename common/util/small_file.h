/* small_file.h - reading the small text files beside a model (config.json,
 * tokenizer.json, a shard index) and building their paths.
 *
 * Big tensor data is mmapped (mmap_file.h); these files are parsed whole, so
 * they are read into memory with a size cap: a multi-gigabyte file in place
 * of a config is the wrong file, refused before it is read. */
#ifndef SPECD_SMALL_FILE_H
#define SPECD_SMALL_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "common/util/error.h"

/* The whole file, NUL-terminated (*len excludes the NUL; caller frees), or
 * NULL + err ("cannot open 'x'", "'x' is unreadable or larger than N bytes"). */
char *specd_read_small_file(const char *path, size_t max_bytes, size_t *len, specd_error *err);

/* Writes a whole small file atomically: a temporary name in the same
 * directory, flushed to disk, renamed over `path`, so a reader (or a crash)
 * never sees half a config. -1 + err naming the path. */
int specd_write_small_file(const char *path, const void *data, size_t len, specd_error *err);

/* The mechanism under it, for writers that stream (safetensors_write.c):
 * specd_atomic_open creates "path.tmp.PID" (its name into tmp) for writing;
 * specd_atomic_commit flushes it to disk, closes it and renames it over
 * path, or, if failed != 0 or any of that fails, closes and removes it and
 * leaves path as it was. -1 + err naming the path. */
#define SPECD_ATOMIC_TMP_MAX 4096
FILE *specd_atomic_open(const char *path, char tmp[SPECD_ATOMIC_TMP_MAX], specd_error *err);
int specd_atomic_commit(FILE *f, const char *tmp, const char *path, int failed, specd_error *err);

/* "dir/name" into out[cap]; -1 + err if it does not fit. */
int specd_path_join(char *out, size_t cap, const char *dir, const char *name, specd_error *err);

/* 1 if path names a regular file. */
int specd_is_regular_file(const char *path);

#endif
