/* fuzz_verify_response.c - libFuzzer target for what draft-svc does with a
 * target's VerifyResponse bytes before it trusts a co-location grant:
 * decode (size-limited, as the stream layer does), then
 * specd_ipc_grant_check (common/rpc/ipc_caps.h) before anything would map it.
 *
 * Any input must decode or be refused without a crash; a grant the check
 * accepts must really have a 64-byte handle, the expected hidden_size and
 * an even, bounded offset; one it refuses must come with a message. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/rpc/ipc_caps.h"
#include "specd.pb-c.h"

/* a response is a few KB at most (hidden_fp16 + logprobs); far above that
 * the stream layer refuses the message before decoding it */
#define MAX_RESPONSE (1 << 20)
#define HIDDEN 576

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_RESPONSE) return 0;
    Specd__V1__VerifyResponse *r = specd__v1__verify_response__unpack(NULL, size, data);
    if (!r) return 0;
    if (r->cuda_ipc) {
        specd_error err;
        err.msg[0] = 0;
        const Specd__V1__CudaIpcGrant *g = r->cuda_ipc;
        if (specd_ipc_grant_check(g, HIDDEN, &err) == 0) {
            if (g->mem_handle.len != SPECD_IPC_HANDLE_BYTES || g->hidden_size != HIDDEN ||
                g->offset % 2 || g->offset > ((uint64_t)1 << 40))
                abort();
        } else if (!err.msg[0]) {
            abort();
        }
    }
    specd__v1__verify_response__free_unpacked(r, NULL);
    return 0;
}
