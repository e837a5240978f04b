/* fuzz_target_info.c - libFuzzer target for what draft-svc does with a
 * target's GetInfo answer (bytes from another service) before it sends that
 * target a session: decode (size-limited, as the client's unary call is),
 * specd_target_info_from_pb, then specd_target_info_mismatch
 * (draft-svc/target_pool.h).
 *
 * Any input must decode or be refused without a crash. What the pool keeps
 * must hold: at most SPECD_TARGET_MAX_END end ids, each the answer's own;
 * every string field terminated within its array; a cost curve that is
 * finite, non-negative and never cheaper for a bigger pass. The
 * compatibility verdict must follow from the fields: the answer's own
 * vocabulary, hidden size and fingerprint expected never give a mismatch
 * on those, and a target with no room for a session is always refused. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "draft-svc/target_pool.h"
#include "specd.pb-c.h"

/* far above any real GetInfo answer (a few hundred bytes) */
#define MAX_INFO (1 << 20)

static int terminated(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INFO) return 0;
    Specd__V1__Info *r = specd__v1__info__unpack(NULL, size, data);
    if (!r) return 0;
    specd_target_info info;
    specd_target_info_from_pb(r, &info);

    if (info.n_end_token_ids < 0 || info.n_end_token_ids > SPECD_TARGET_MAX_END) abort();
    for (int i = 0; i < info.n_end_token_ids; i++)
        if ((size_t)i >= r->n_end_token_ids || info.end_token_ids[i] != r->end_token_ids[i])
            abort();
    if (!terminated(info.tokenizer_sha256, sizeof info.tokenizer_sha256) ||
        !terminated(info.model_id, sizeof info.model_id) ||
        !terminated(info.backend, sizeof info.backend))
        abort();
    if (info.queue_wait_ms < 0) abort();
    double prev = 0;
    for (int n = 1; n <= 4096; n = n < 64 ? n + 1 : n * 2) {
        double us = specd_step_cost_at(&info.step_cost, n);
        if (!isfinite(us) || us < 0 || us < prev) abort();
        prev = us;
    }

    /* the answer's own identity expected: only its limits can refuse it */
    specd_tpool_opts o = {.expect_vocab = info.vocab_size,
                          .expect_hidden = info.hidden_size,
                          .expect_tokenizer_sha256 = info.tokenizer_sha256};
    const char *why = specd_target_info_mismatch(&o, &info);
    int no_room = info.max_tree_tokens < 1 || info.vocab_size < 1 || info.context_length < 2;
    if (why && strcmp(why, "limits")) abort();
    if (!why != !no_room) abort();
    /* a different vocabulary expected is always a mismatch */
    o.expect_vocab = info.vocab_size == 7 ? 8 : 7;
    why = specd_target_info_mismatch(&o, &info);
    if (!why || strcmp(why, "vocab_size")) abort();

    specd__v1__info__free_unpacked(r, NULL);
    return 0;
}
