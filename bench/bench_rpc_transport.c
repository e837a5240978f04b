/* bench_rpc_transport.c - per-step overhead of the gRPC transport between
 * draft-svc and target-svc: loopback TCP against a Unix domain socket (the
 * co-located pod, deploy/k8s-colocated/).
 *
 * One Verify step is one message each way on a bidi stream. The benchmark
 * runs that ping-pong through the real server and client layers
 * (common/rpc/rpc_server.c, rpc_client.c) against an echo method, with messages
 * the size of a step: a 64-node tree request (~320 B) and a response that
 * carries the hidden state for the MLP speculator (576 fp16 = 1152 B plus
 * tokens, ~1.3 KiB; the echo returns what it gets, so both sizes go both
 * ways). It prints the mean, median and 99th percentile round trip in
 * microseconds per transport and size, with the CPU it ran on.
 *
 *   build/bench_rpc_transport [--steps N]   (default 5000 per row, in 5
 *                                            alternating slices, each after 200
 *                                            warm-up steps) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_args.h"
#include "bench/echo_service.h"
#include "common/rpc/rpc_client.h"
#include "common/util/clock.h"

#define WARMUP 200
#define ROUNDS 5

/* N ping-pongs of `size` bytes on one stream to target; the round trips
 * (us) into rt. 0 or -1 + err. */
static int run(const char *target, size_t size, int n, double *rt, specd_error *err) {
    specd_rpc_channel_opts co = {.target = target, .insecure = 1};
    specd_rpc_channel *ch = specd_rpc_channel_create(&co, err);
    if (!ch) return -1;
    int rc = -1;
    specd_rpc_stream *st = specd_rpc_stream_start(ch, SPECD_ECHO_METHOD, 0, err);
    uint8_t *msg = malloc(size), *back = NULL;
    size_t len;
    if (!st || !msg) goto out;
    for (size_t i = 0; i < size; i++) msg[i] = (uint8_t)(i * 31 + 7);
    /* the echo's first message is the (absent) request id */
    if (specd_rpc_stream_recv_bytes(st, &back, &len, 10000, err) != SPECD_RPC_CIO_OK) goto out;
    free(back);
    for (int i = -WARMUP; i < n; i++) {
        double t0 = specd_now_us();
        back = NULL;
        if (specd_rpc_stream_send_bytes(st, msg, size, 0, err) != SPECD_RPC_CIO_OK ||
            specd_rpc_stream_recv_bytes(st, &back, &len, 10000, err) != SPECD_RPC_CIO_OK)
            goto out;
        if (len != size || memcmp(back, msg, size)) {
            specd_seterr(err, "echo returned other bytes");
            free(back);
            goto out;
        }
        free(back);
        if (i >= 0) rt[i] = specd_now_us() - t0;
    }
    specd_rpc_stream_close_send(st, err);
    rc = 0;
out:
    specd_rpc_stream_free(st);
    specd_rpc_channel_free(ch);
    free(msg);
    return rc;
}

/* The "Model name" line of lscpu (util-linux), as the README's tables cite. */
static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown (no lscpu)");
    FILE *p = popen("lscpu 2>/dev/null", "r");
    if (!p) return;
    char line[512];
    while (fgets(line, sizeof line, p)) {
        if (strncmp(line, "Model name:", 11)) continue;
        char *v = line + 11 + strspn(line + 11, " \t");
        v[strcspn(v, "\n")] = 0;
        snprintf(out, cap, "%s", v);
    }
    pclose(p);
}

int main(int argc, char **argv) {
    int n = 5000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) n = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--steps N]\n", argv[0]);
            return 2;
        }
    }
    if (n < 100) n = 100;
    specd_error err = {{0}};
    char sock[128], unix_addr[160], tcp_addr[64];
    snprintf(sock, sizeof sock, "/tmp/specd-bench-%d.sock", (int)getpid());
    snprintf(unix_addr, sizeof unix_addr, "unix:%s", sock);
    unlink(sock);
    specd_rpc_server *tcp = specd_echo_server_start("127.0.0.1:0", &err);
    specd_rpc_server *uds = tcp ? specd_echo_server_start(unix_addr, &err) : NULL;
    if (!tcp || !uds) {
        fprintf(stderr, "bench_rpc_transport: %s\n", err.msg);
        specd_rpc_server_destroy(tcp);
        return 1;
    }
    snprintf(tcp_addr, sizeof tcp_addr, "127.0.0.1:%d", specd_rpc_server_port(tcp));
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf("gRPC bidi ping-pong, one message each way per step, %d steps per row\n", n);
    printf("CPU: %s (SIMD: %s%s%s)\n\n", cpu, __builtin_cpu_supports("avx512f") ? "avx512f " : "",
           __builtin_cpu_supports("avx2") ? "avx2 " : "",
           __builtin_cpu_supports("sse4.2") ? "sse4.2" : "");
    printf("| transport | message | mean us | p50 us | p99 us |\n");
    printf("|---|---:|---:|---:|---:|\n");
    const size_t sizes[] = {320, 1330};
    const struct { const char *name, *target; } tr[] = {{"loopback TCP", tcp_addr},
                                                        {"Unix socket", unix_addr}};
    /* The transports take turns in ROUNDS slices, so a change in the
     * machine's load (a shared CI box) hits both alike. */
    double *rt[2] = {malloc(sizeof(double) * (size_t)n), malloc(sizeof(double) * (size_t)n)};
    int status = rt[0] && rt[1] ? 0 : 1, per = n / ROUNDS;
    for (size_t s = 0; !status && s < sizeof sizes / sizeof sizes[0]; s++) {
        for (int r = 0; !status && r < ROUNDS; r++) {
            for (size_t t = 0; !status && t < 2; t++) {
                if (run(tr[t].target, sizes[s], per, rt[t] + r * per, &err)) {
                    fprintf(stderr, "bench_rpc_transport: %s: %s\n", tr[t].name, err.msg);
                    status = 1;
                }
            }
        }
        for (size_t t = 0; !status && t < 2; t++) {
            int m = per * ROUNDS;
            qsort(rt[t], (size_t)m, sizeof(double), bench_cmp_double);
            double sum = 0;
            for (int i = 0; i < m; i++) sum += rt[t][i];
            printf("| %s | %zu B | %.1f | %.1f | %.1f |\n", tr[t].name, sizes[s], sum / m,
                   rt[t][m / 2], rt[t][(int)(0.99 * m)]);
            fflush(stdout);
        }
    }
    free(rt[0]);
    free(rt[1]);
    specd_rpc_server_destroy(uds);
    specd_rpc_server_destroy(tcp);
    unlink(sock);
    return status;
}
