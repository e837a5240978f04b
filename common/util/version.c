/* version.c - `--version` (version.h). */
#include "common/util/version.h"

#include <stdio.h>
#include <string.h>

int specd_print_version_if_asked(int argc, char **argv, const char *prog) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--version")) {
            printf("%s %s\n", prog, SPECD_VERSION);
            return 1;
        }
    return 0;
}
