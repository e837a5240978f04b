#include "common/util/thread_name.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define THREAD_NAME_MAX 15 /* Linux's TASK_COMM_LEN less the terminator */

void specd_thread_name(const char *fmt, ...) {
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t len = strlen(buf);
    const char *name = len > THREAD_NAME_MAX ? buf + len - THREAD_NAME_MAX : buf;
    (void)pthread_setname_np(pthread_self(), name);
}
