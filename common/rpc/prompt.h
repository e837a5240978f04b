/* prompt.h - a GenerateRequest's input as token ids.
 *
 * Both services take the same three forms of input (proto/specd.proto,
 * GenerateRequest.input): raw text, chat messages rendered with the model's
 * chat template, or token ids. This turns any of them into the ids the model
 * sees, with BOS prepended when the tokenizer asks for it, and checks what
 * can be checked without the model: a non-empty prompt, ids inside the
 * vocabulary, the length limit. */
#ifndef SPECD_PROMPT_H
#define SPECD_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

#include "common/util/error.h"
#include "common/text/tokenizer.h"
#include "specd.pb-c.h"

/* GRPC_STATUS_OK and *ids (malloc'd, caller frees) / *n, or INVALID_ARGUMENT
 * (empty, too long, bad id, bad chat), FAILED_PRECONDITION (text input
 * without a tokenizer) or RESOURCE_EXHAUSTED, with err naming the field
 * ("request.input: the prompt has 5000 tokens, over the limit of 4096").
 * vocab <= 0 skips the id range check (the target checks it). */
grpc_status_code specd_prompt_from_request(const specd_tokenizer *tok,
                                           const Specd__V1__GenerateRequest *req, int vocab,
                                           int max_tokens, int32_t **ids, size_t *n,
                                           specd_error *err);

#endif
