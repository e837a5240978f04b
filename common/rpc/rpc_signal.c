/* rpc_signal.c - run a server until SIGTERM or SIGINT, then stop it gracefully.
 *
 * Kubernetes stops a pod with SIGTERM and kills it after its grace period;
 * a terminal sends SIGINT. The signal handler does the one async-signal-safe
 * thing needed: it writes the signal number into a pipe (the self-pipe
 * trick). The waiting thread polls the pipe and does the real work (the
 * shutdown) in normal context. Unlike signalfd this needs no signal mask in
 * every thread, which gRPC's own threads would not have.
 *
 * The previous handlers are restored as soon as a signal arrives, so a
 * second Ctrl-C during the grace period terminates the process the usual
 * way instead of being swallowed. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "common/rpc/rpc_server.h"

/* The pipe's write end for the handler; -1 when nobody waits. A lock-free
 * atomic: safe to read in a signal handler (C11 7.14.1.1) and ordered with
 * the waiting thread's writes on whatever thread the signal lands. */
static atomic_int sig_write_fd = -1;
/* One waiter per process: the handlers and the fd are process-wide. */
static atomic_flag waiting = ATOMIC_FLAG_INIT;

static void on_signal(int sig) {
    int saved = errno; /* write may clobber errno under the interrupted code */
    int fd = sig_write_fd;
    unsigned char b = (unsigned char)sig;
    if (fd >= 0 && write(fd, &b, 1) < 0) {
        /* pipe full (a signal is already pending) or closed: nothing to do */
    }
    errno = saved;
}

int specd_rpc_server_run_until_signal(specd_rpc_server *s, int grace_ms) {
    if (atomic_flag_test_and_set(&waiting)) return -1;
    int p[2];
    /* non-blocking write end: a signal storm must never block the handler */
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK)) {
        atomic_flag_clear(&waiting);
        return -1;
    }
    sig_write_fd = p[1];
    struct sigaction sa, old_term, old_int;
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    int ok = !sigaction(SIGTERM, &sa, &old_term);
    if (ok && sigaction(SIGINT, &sa, &old_int)) {
        sigaction(SIGTERM, &old_term, NULL);
        ok = 0;
    }
    int sig = -1;
    while (ok) {
        struct pollfd pfd = {.fd = p[0], .events = POLLIN};
        int r = poll(&pfd, 1, -1);
        if (r < 0 && errno != EINTR) break;
        unsigned char b;
        if (r > 0 && read(p[0], &b, 1) == 1) {
            sig = b;
            break;
        }
    }
    if (ok) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
    }
    sig_write_fd = -1;
    close(p[0]);
    close(p[1]);
    atomic_flag_clear(&waiting);
    if (sig < 0) return -1;
    specd_rpc_server_shutdown(s, grace_ms);
    return sig;
}
