/* admission.c - request limits for both services (admission.h). */
#include "common/rpc/admission.h"

#include <stdio.h>
#include <string.h>

#include "common/spec/sampling.h"
#include "common/util/utf8.h"

/* 0 if s is valid UTF-8, else -1 + err naming the field and the offset of
 * the first bad byte (so a client can find it). */
static int check_utf8(const char *s, const char *field, long index, specd_error *err) {
    if (!s) return 0;
    size_t n = strlen(s), i = 0, len;
    while (i < n) {
        if (specd_utf8_next((const uint8_t *)s + i, n - i, &len) != SPECD_UTF8_OK) {
            if (index >= 0)
                return specd_seterr(err, "%s[%ld] is not valid UTF-8 (byte %zu of %zu)", field,
                                    index, i, n);
            return specd_seterr(err, "%s is not valid UTF-8 (byte %zu of %zu)", field, i, n);
        }
        i += len;
    }
    return 0;
}

grpc_status_code specd_admit_outputs(const char *field, const int32_t *stop_ids, size_t n_stop_ids,
                                     int logprobs, int top_logprobs, int vocab, specd_error *err) {
    if (n_stop_ids > SPECD_ADMIT_MAX_STOP_IDS)
        return specd_seterr(err, "%s.stop_ids: %zu ids, at most %d", field, n_stop_ids,
                            SPECD_ADMIT_MAX_STOP_IDS),
               GRPC_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; vocab > 0 && i < n_stop_ids; i++)
        if (stop_ids[i] < 0 || stop_ids[i] >= vocab)
            return specd_seterr(err, "%s.stop_ids[%zu] = %d is outside 0..%d", field, i,
                                stop_ids[i], vocab - 1),
                   GRPC_STATUS_INVALID_ARGUMENT;
    if (vocab <= 0)
        for (size_t i = 0; i < n_stop_ids; i++)
            if (stop_ids[i] < 0)
                return specd_seterr(err, "%s.stop_ids[%zu] = %d is negative", field, i,
                                    stop_ids[i]),
                       GRPC_STATUS_INVALID_ARGUMENT;
    if (top_logprobs < 0 || top_logprobs > SPECD_MAX_TOP_LOGPROBS)
        return specd_seterr(err, "%s.top_logprobs = %d must be in 0..%d", field, top_logprobs,
                            SPECD_MAX_TOP_LOGPROBS),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* Alternatives without the log-probabilities they belong to would be
     * silently dropped; say so instead (OpenAI refuses the same). */
    if (top_logprobs > 0 && !logprobs)
        return specd_seterr(err, "%s.top_logprobs = %d needs %s.logprobs = true", field,
                            top_logprobs, field),
               GRPC_STATUS_INVALID_ARGUMENT;
    return GRPC_STATUS_OK;
}

grpc_status_code specd_admit_strings(const Specd__V1__GenerateRequest *req, specd_error *err) {
    int bad = 0;
    if (req->input_case == SPECD__V1__GENERATE_REQUEST__INPUT_TEXT)
        bad = check_utf8(req->text, "request.text", -1, err);
    if (!bad && req->input_case == SPECD__V1__GENERATE_REQUEST__INPUT_CHAT && req->chat)
        for (size_t i = 0; !bad && i < req->chat->n_messages; i++) {
            char field[64];
            snprintf(field, sizeof field, "request.chat.messages[%zu].role", i);
            bad = check_utf8(req->chat->messages[i]->role, field, -1, err);
            snprintf(field, sizeof field, "request.chat.messages[%zu].content", i);
            if (!bad) bad = check_utf8(req->chat->messages[i]->content, field, -1, err);
        }
    for (size_t i = 0; !bad && i < req->n_stop; i++)
        bad = check_utf8(req->stop[i], "request.stop", (long)i, err);
    if (!bad) bad = check_utf8(req->drafter, "request.drafter", -1, err);
    return bad ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_OK;
}

grpc_status_code specd_admit_prompt(const specd_admission_limits *lim, const char *field,
                                    size_t n_prompt, size_t n_resumed, specd_error *err) {
    size_t n_new = n_prompt - (n_resumed < n_prompt ? n_resumed : n_prompt);
    if (n_new > (size_t)lim->max_prompt_tokens) {
        if (n_resumed)
            specd_seterr(err, "%s: the prompt has %zu tokens (%zu of them resumed), over the "
                              "limit of %d", field, n_prompt, n_resumed, lim->max_prompt_tokens);
        else
            specd_seterr(err, "%s: the prompt has %zu tokens, over the limit of %d", field,
                         n_prompt, lim->max_prompt_tokens);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    /* The prompt plus the first generated (pending) token must fit. */
    if (lim->context > 0 && n_prompt >= (size_t)lim->context)
        return specd_seterr(err, "%s: the prompt has %zu tokens, but the context holds %d",
                            field, n_prompt, lim->context),
               GRPC_STATUS_INVALID_ARGUMENT;
    return GRPC_STATUS_OK;
}

grpc_status_code specd_admit_generate(const specd_admission_limits *lim, size_t n_prompt,
                                      int max_new_tokens, int *max_new_out, specd_error *err) {
    if (max_new_tokens < 0 || max_new_tokens > lim->max_new_tokens)
        return specd_seterr(err, "request.max_new_tokens = %d: must be in 1..%d (0 = %d)",
                            max_new_tokens, lim->max_new_tokens, lim->default_max_new_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    grpc_status_code code = specd_admit_prompt(lim, "request.input", n_prompt, 0, err);
    if (code) return code;
    *max_new_out = max_new_tokens ? max_new_tokens : lim->default_max_new_tokens;
    return GRPC_STATUS_OK;
}
