/* mmap_file.c - see mmap_file.h. */
#include "common/util/mmap_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int specd_map_file(const char *path, void **addr, size_t *len, specd_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return specd_seterr(err, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size == 0) {
        close(fd);
        return specd_seterr(err, "'%s' is not a regular, non-empty file", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED) return specd_seterr(err, "cannot mmap '%s': %s", path, strerror(errno));
    *addr = p;
    *len = (size_t)st.st_size;
    return 0;
}

void specd_unmap_file(void *addr, size_t len) {
    if (addr) munmap(addr, len);
}
