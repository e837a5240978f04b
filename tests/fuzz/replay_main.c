/* replay_main.c - runs a fuzz target over every file in a corpus directory.
 *
 * libFuzzer needs clang; this driver lets ctest replay the committed corpus
 * (seed inputs plus every crash ever found) with gcc and sanitizers, so a
 * parser regression fails the normal test run. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) {
        fprintf(stderr, "cannot open corpus %s\n", argv[1]);
        return 1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        size_t got = fread(buf, 1, (size_t)len, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, got);
        free(buf);
        n++;
    }
    closedir(d);
    printf("replayed %d inputs from %s\n", n, argv[1]);
    return n > 0 ? 0 : 1;
}
