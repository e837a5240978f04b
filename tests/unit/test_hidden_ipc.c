/* test_hidden_ipc.c - co-location of draft-svc and target-svc (CUDA IPC
 * handles instead of hidden_fp16 bytes): the capability negotiated at
 * Verify Open (common/rpc/ipc_caps.h), its fallback, and on a GPU the
 * transport itself (kernels/ipc.h) between two processes.
 *
 *   - grant or refuse: an old client (no offer), no hidden states asked, a
 *     target on the CPU, an offer from another node or with a bad node id
 *     are all refused with a reason; only same node + CUDA target grants;
 *   - an old client's Open (the bytes of a VerifyOpen without field 10)
 *     decodes to no offer, and an old target's response (no field 9/10) to
 *     no grant and hidden bytes: both sides stay on the bytes path;
 *   - a grant from the wire is checked before mapping: handle length,
 *     hidden_size, offset, each error naming its field;
 *   - a Tree asking for hidden_via_ipc on a session without a grant is
 *     INVALID_ARGUMENT naming the field (target-svc/session.c);
 *   - the client's fallback: mapping a grant that cannot be mapped (here:
 *     no CUDA, or the exporting process itself) returns NULL with a
 *     message, never a crash;
 *   - with a CUDA device: a parent process exports a buffer and writes two
 *     successive hidden states (as two steps), a child process maps the
 *     handle and reads each exactly (fp16-representable values). Without
 *     one the round trip prints "SKIPPED: ..." (scripts/gpu/check.sh fails
 *     such a line on a GPU machine). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/rpc/ipc_caps.h"
#include "kernels/ipc.h"
#include "specd.pb-c.h"
#include "target-svc/service.h" /* specd_session_open: a Verify Open into a session */
#include "target-svc/session.h"

#define HIDDEN 96

/* Values exactly representable in fp16, different per step. */
static float value(int step, int i) { return (float)((i * 7 + step * 13) % 64 - 32) / 8.0f; }

static void test_refusals(void **state) {
    (void)state;
    char node[SPECD_IPC_NODE_MAX];
    specd_error err = {{0}};
    assert_int_equal(specd_ipc_node_id(node, &err), 0);
    assert_true(strlen(node) > 0);
    Specd__V1__CudaIpcOffer o = SPECD__V1__CUDA_IPC_OFFER__INIT;
    o.node_id = node;
    /* the one case that grants */
    assert_null(specd_ipc_grant_refusal(&o, 1, "cuda", node));
    /* and every reason not to */
    assert_string_equal(specd_ipc_grant_refusal(NULL, 1, "cuda", node), "not offered");
    assert_non_null(strstr(specd_ipc_grant_refusal(&o, 0, "cuda", node), "return_hidden"));
    assert_non_null(strstr(specd_ipc_grant_refusal(&o, 1, "cpu", node), "CUDA"));
    assert_non_null(strstr(specd_ipc_grant_refusal(&o, 1, NULL, node), "CUDA"));
    assert_non_null(strstr(specd_ipc_grant_refusal(&o, 1, "cuda", NULL), "node"));
    Specd__V1__CudaIpcOffer other = o;
    other.node_id = "00000000-1111-2222-3333-444444444444";
    assert_non_null(strstr(specd_ipc_grant_refusal(&other, 1, "cuda", node), "another node"));
    other.node_id = "";
    assert_non_null(strstr(specd_ipc_grant_refusal(&other, 1, "cuda", node), "no node_id"));
    char longid[SPECD_IPC_NODE_MAX + 8];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    other.node_id = longid;
    assert_non_null(strstr(specd_ipc_grant_refusal(&other, 1, "cuda", longid), "too long"));
}

/* Backwards compatibility on the wire, both directions. */
static void test_old_peers(void **state) {
    (void)state;
    /* an old client's Open: prompt_ids [5] and return_hidden, nothing else */
    const uint8_t old_open[] = {0x0a, 0x01, 0x05, 0x30, 0x01};
    Specd__V1__VerifyOpen *o = specd__v1__verify_open__unpack(NULL, sizeof old_open, old_open);
    assert_non_null(o);
    assert_true(o->return_hidden);
    assert_null(o->cuda_ipc);
    assert_string_equal(specd_ipc_grant_refusal(o->cuda_ipc, 1, "cuda", "x"), "not offered");
    specd__v1__verify_open__free_unpacked(o, NULL);
    /* an old target's step 0: next_token 7 and 4 bytes of hidden state */
    const uint8_t old_resp[] = {0x20, 0x07, 0x2a, 0x04, 0x00, 0x3c, 0x00, 0x40};
    Specd__V1__VerifyResponse *r =
        specd__v1__verify_response__unpack(NULL, sizeof old_resp, old_resp);
    assert_non_null(r);
    assert_null(r->cuda_ipc);
    assert_false(r->hidden_in_ipc);
    assert_int_equal(r->hidden_fp16.len, 4);
    specd__v1__verify_response__free_unpacked(r, NULL);
    /* and a new Open with an offer still decodes for a new target */
    Specd__V1__VerifyOpen n = SPECD__V1__VERIFY_OPEN__INIT;
    Specd__V1__CudaIpcOffer off = SPECD__V1__CUDA_IPC_OFFER__INIT;
    int32_t ids[1] = {5};
    n.n_prompt_ids = 1;
    n.prompt_ids = ids;
    off.node_id = "node-a";
    off.device_uuid = "0123456789abcdef0123456789abcdef";
    n.cuda_ipc = &off;
    uint8_t buf[128];
    size_t len = specd__v1__verify_open__pack(&n, buf);
    o = specd__v1__verify_open__unpack(NULL, len, buf);
    assert_non_null(o);
    assert_non_null(o->cuda_ipc);
    assert_string_equal(o->cuda_ipc->node_id, "node-a");
    specd__v1__verify_open__free_unpacked(o, NULL);
}

static void test_grant_check(void **state) {
    (void)state;
    uint8_t handle[SPECD_IPC_HANDLE_BYTES] = {1};
    Specd__V1__CudaIpcGrant g = SPECD__V1__CUDA_IPC_GRANT__INIT;
    g.mem_handle.data = handle;
    g.mem_handle.len = sizeof handle;
    g.hidden_size = HIDDEN;
    specd_error err = {{0}};
    assert_int_equal(specd_ipc_grant_check(&g, HIDDEN, &err), 0);
    g.mem_handle.len = 63;
    assert_int_equal(specd_ipc_grant_check(&g, HIDDEN, &err), -1);
    assert_non_null(strstr(err.msg, "cuda_ipc.mem_handle"));
    g.mem_handle.len = sizeof handle;
    assert_int_equal(specd_ipc_grant_check(&g, HIDDEN + 1, &err), -1);
    assert_non_null(strstr(err.msg, "cuda_ipc.hidden_size"));
    g.offset = 3;
    assert_int_equal(specd_ipc_grant_check(&g, HIDDEN, &err), -1);
    assert_non_null(strstr(err.msg, "cuda_ipc.offset"));
    g.offset = (uint64_t)1 << 50;
    assert_int_equal(specd_ipc_grant_check(&g, HIDDEN, &err), -1);
    assert_int_equal(specd_ipc_grant_check(NULL, HIDDEN, &err), -1);
}

/* The target refuses hidden_via_ipc on a session it granted nothing. */
static void test_tree_without_grant(void **state) {
    (void)state;
    specd_session_limits lim = {.vocab = 100, .context = 32, .max_prompt_tokens = 8,
                                .max_tree_tokens = 4, .eos_id = -1};
    specd_session s;
    specd_session_init(&s, &lim);
    Specd__V1__VerifyOpen o = SPECD__V1__VERIFY_OPEN__INIT;
    int32_t ids[2] = {3, 4};
    o.n_prompt_ids = 2;
    o.prompt_ids = ids;
    o.max_new_tokens = 8;
    o.return_hidden = 1;
    specd_error err = {{0}};
    assert_int_equal(specd_session_open(&s, &o, "open", &err), GRPC_STATUS_OK);
    int32_t first = 9;
    specd_finish fr;
    specd_session_emit(&s, &first, 1, s.n_prompt, &fr);
    specd_session_tree_req t = {.step = 1, .hidden_via_ipc = 1, .bad_q = -1};
    assert_int_equal(specd_session_tree(&s, &t, &err), GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "tree.hidden_via_ipc"));
    /* granted: the same tree is fine */
    s.ipc_granted = 1;
    assert_int_equal(specd_session_tree(&s, &t, &err), GRPC_STATUS_OK);
    specd_session_free(&s);
}

/* Child: maps the handle the parent sends and checks two steps' values. */
static int child(int from_parent, int to_parent) {
    uint8_t msg[1 + SPECD_IPC_HANDLE_BYTES];
    if (read(from_parent, msg, sizeof msg) != (ssize_t)sizeof msg) return 2;
    if (msg[0] == 0) return 0; /* the parent has no device: nothing to do */
    Specd__V1__CudaIpcGrant g = SPECD__V1__CUDA_IPC_GRANT__INIT;
    g.mem_handle.data = msg + 1;
    g.mem_handle.len = SPECD_IPC_HANDLE_BYTES;
    g.hidden_size = HIDDEN;
    specd_error err = {{0}};
    specd_ipc_import *m = specd_ipc_import_open(&g, 0, &err);
    if (!m) {
        fprintf(stderr, "child: %s\n", err.msg);
        return 3;
    }
    float got[HIDDEN];
    int rc = 0;
    for (int step = 0; step < 2 && !rc; step++) {
        char go;
        if (read(from_parent, &go, 1) != 1) rc = 4;
        else if (specd_ipc_import_get(m, got, &err)) rc = 5;
        else
            for (int i = 0; i < HIDDEN; i++)
                if (got[i] != value(step, i)) rc = 6;
        char done = (char)rc;
        if (write(to_parent, &done, 1) != 1) rc = 7;
    }
    specd_ipc_import_free(m);
    return rc;
}

static void test_roundtrip(void **state) {
    (void)state;
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    /* fork before this process touches CUDA: a child must not inherit a
     * CUDA context */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(child(down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    specd_error err = {{0}};
    uint8_t msg[1 + SPECD_IPC_HANDLE_BYTES] = {0};
    specd_ipc_export *e = specd_ipc_export_create(0, HIDDEN, &err);
    if (!e) {
        /* tell the child, then report why */
        assert_int_equal(write(down[1], msg, sizeof msg), (ssize_t)sizeof msg);
        int st;
        waitpid(pid, &st, 0);
        printf("SKIPPED: CUDA IPC round trip between two processes: %s\n", err.msg);
        /* the client's fallback without CUDA: mapping fails cleanly */
        Specd__V1__CudaIpcGrant g = SPECD__V1__CUDA_IPC_GRANT__INIT;
        g.mem_handle.data = msg + 1;
        g.mem_handle.len = SPECD_IPC_HANDLE_BYTES;
        g.hidden_size = HIDDEN;
        assert_null(specd_ipc_import_open(&g, 0, &err));
        assert_true(strlen(err.msg) > 0);
        close(down[1]);
        close(up[0]);
        return;
    }
    Specd__V1__CudaIpcGrant g = SPECD__V1__CUDA_IPC_GRANT__INIT;
    specd_ipc_export_grant(e, &g);
    assert_int_equal(specd_ipc_grant_check(&g, HIDDEN, &err), 0);
    assert_int_equal(strlen(g.device_uuid), 32);
    /* the exporting process cannot map its own handle: the fallback path */
    assert_null(specd_ipc_import_open(&g, 0, &err));
    msg[0] = 1;
    memcpy(msg + 1, g.mem_handle.data, SPECD_IPC_HANDLE_BYTES);
    assert_int_equal(write(down[1], msg, sizeof msg), (ssize_t)sizeof msg);
    float h[HIDDEN];
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < HIDDEN; i++) h[i] = value(step, i);
        assert_int_equal(specd_ipc_export_put(e, h, &err), 0);
        char go = 1, done = -1;
        assert_int_equal(write(down[1], &go, 1), 1);
        assert_int_equal(read(up[0], &done, 1), 1);
        assert_int_equal(done, 0); /* the child read exactly this step's values */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    specd_ipc_export_free(e);
    close(down[1]);
    close(up[0]);
    printf("CUDA IPC round trip: 2 steps of %d fp16 values read exactly by another process\n",
           HIDDEN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* first: it forks, and the child must not inherit CUDA state */
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_old_peers),
        cmocka_unit_test(test_grant_check),
        cmocka_unit_test(test_tree_without_grant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
