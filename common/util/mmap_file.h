/* mmap_file.h - maps a whole model file read-only.
 *
 * Model weights are used where they lie in the page cache: mapping instead
 * of reading means a 100 GB checkpoint costs no copy and no startup time,
 * and several processes serving the same file share its pages. */
#ifndef SPECD_MMAP_FILE_H
#define SPECD_MMAP_FILE_H

#include <stddef.h>

#include "common/util/error.h"

/* Maps `path` (a regular, non-empty file). On failure: -1 and a message
 * naming the path ("cannot open 'x': No such file or directory"). */
int specd_map_file(const char *path, void **addr, size_t *len, specd_error *err);
void specd_unmap_file(void *addr, size_t len);

#endif
