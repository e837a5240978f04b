/* admission.h - the limits a GenerateRequest is admitted under, checked in
 * one place for both services.
 *
 * draft-svc and target-svc both serve GenerateRequest. A client must get the
 * same answer from either for the same request, so every size limit is one
 * pure function here, called once per request by each service after the
 * prompt has become token ids:
 *
 *   - max_new_tokens: 0 means the server's default; otherwise 1..cap;
 *   - the prompt against max_prompt_tokens (the prefill a client may ask for);
 *   - the prompt against the context: the prompt plus the first generated
 *     token must fit, so prompt < context, else INVALID_ARGUMENT naming both
 *     numbers. (A prompt that fits but leaves less room than max_new_tokens
 *     still runs and ends with finish CONTEXT: the client asked for "at
 *     most", and a context limit is a normal way to stop.)
 *
 * The checks are in this order, so a request breaking two limits gets the
 * same message from both services. Messages name the field:
 *   "request.max_new_tokens = 5000: must be in 1..4096 (0 = 256)"
 *   "request.input: the prompt has 5000 tokens, over the limit of 4096"
 *   "request.input: the prompt has 1506 tokens, but the context holds 728"
 * target-svc's Verify.Open checks its prompt with the same function
 * (field "open.prompt_ids", resumed tokens exempt from max_prompt_tokens).
 *
 * Before any of that, every string field of the request must be valid
 * UTF-8 (specd_admit_strings). proto3 requires it of `string` fields, but
 * protobuf-c does not check, and invalid bytes would reach the tokenizer,
 * the chat template and the stop matcher; most clients cannot even parse a
 * response echoing them. */
#ifndef SPECD_ADMISSION_H
#define SPECD_ADMISSION_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

#include "common/util/error.h"
#include "specd.pb-c.h"

typedef struct specd_admission_limits {
    int context;                /* KV rows of one session; 0 = not known (not checked) */
    int max_prompt_tokens;      /* > 0 */
    int max_new_tokens;         /* the most a request may ask for, > 0 */
    int default_max_new_tokens; /* what 0 means, 1..max_new_tokens */
} specd_admission_limits;

/* The prompt checks alone: n_prompt ids of which n_resumed were generated
 * on a lost target (they count against the context, not against
 * max_prompt_tokens). GRPC_STATUS_OK or INVALID_ARGUMENT + err. */
grpc_status_code specd_admit_prompt(const specd_admission_limits *lim, const char *field,
                                    size_t n_prompt, size_t n_resumed, specd_error *err);

/* A whole GenerateRequest: max_new_tokens as asked (0 = default), then the
 * prompt (field "request.input"). GRPC_STATUS_OK and *max_new_out = the
 * effective max_new_tokens, or INVALID_ARGUMENT + err. */
grpc_status_code specd_admit_generate(const specd_admission_limits *lim, size_t n_prompt,
                                      int max_new_tokens, int *max_new_out, specd_error *err);

/* The output options both services take (GenerateRequest on both, and
 * VerifyOpen): at most SPECD_ADMIT_MAX_STOP_IDS stop ids, each in
 * 0..vocab-1 (vocab <= 0: not checked here, the target checks them);
 * top_logprobs in 0..SPECD_MAX_TOP_LOGPROBS and only with logprobs.
 * field prefixes the names ("request" -> "request.stop_ids[0] = ..."). */
#define SPECD_ADMIT_MAX_STOP_IDS 64
grpc_status_code specd_admit_outputs(const char *field, const int32_t *stop_ids, size_t n_stop_ids,
                                     int logprobs, int top_logprobs, int vocab, specd_error *err);

/* Every string field of req is valid UTF-8: text, chat.messages[i].role and
 * .content, stop[i], drafter. GRPC_STATUS_OK or INVALID_ARGUMENT + err
 * naming the first bad field ("request.stop[1] is not valid UTF-8 (byte 0
 * of 3)"). */
grpc_status_code specd_admit_strings(const Specd__V1__GenerateRequest *req, specd_error *err);

#endif
