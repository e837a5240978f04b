/* small_file.h - reading the small text files beside a model (config.json,
 * tokenizer.json, a shard index) and building their paths.
 *
 * Big tensor data is mmapped (mmap_file.h); these files are parsed whole, so
 * they are read into memory with a size cap: a multi-gigabyte file in place
 * of a config is the wrong file, refused before it is read. */
#ifndef SPECD_SMALL_FILE_H
#define SPECD_SMALL_FILE_H

#include <stddef.h>

#include "common/error.h"

/* The whole file, NUL-terminated (*len excludes the NUL; caller frees), or
 * NULL + err ("cannot open 'x'", "'x' is unreadable or larger than N bytes"). */
char *specd_read_small_file(const char *path, size_t max_bytes, size_t *len, specd_error *err);

/* Writes a whole small file atomically: a temporary name in the same
 * directory, flushed to disk, renamed over `path`, so a reader (or a crash)
 * never sees half a config. -1 + err naming the path. */
int specd_write_small_file(const char *path, const void *data, size_t len, specd_error *err);

/* "dir/name" into out[cap]; -1 + err if it does not fit. */
int specd_path_join(char *out, size_t cap, const char *dir, const char *name, specd_error *err);

/* 1 if path names a regular file. */
int specd_is_regular_file(const char *path);

#endif
