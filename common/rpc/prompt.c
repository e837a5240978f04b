/* prompt.c - request input -> token ids (prompt.h). */
#include "common/rpc/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "common/text/chat.h"

/* Text or chat -> ids. */
static grpc_status_code tokenize_input(const specd_tokenizer *tok,
                                       const Specd__V1__GenerateRequest *req, int32_t **ids,
                                       size_t *n, specd_error *err) {
    if (req->input_case == SPECD__V1__GENERATE_REQUEST__INPUT_CHAT) {
        size_t nm = req->chat->n_messages;
        if (nm == 0)
            return specd_seterr(err, "request.chat: no messages"), GRPC_STATUS_INVALID_ARGUMENT;
        /* A model whose template specd cannot render takes no chat input
         * at all: the request is fine, this server cannot serve it. */
        if (!specd_chat_family(specd_tokenizer_chat_template(tok), err))
            return specd_preferr(err, "request.chat"), GRPC_STATUS_UNIMPLEMENTED;
        specd_chat_msg *msgs = calloc(nm, sizeof *msgs);
        if (!msgs) return specd_seterr(err, "out of memory"), GRPC_STATUS_RESOURCE_EXHAUSTED;
        for (size_t i = 0; i < nm; i++) {
            const char *role = req->chat->messages[i]->role;
            /* The templates render any role string; an unknown one is
             * almost surely a client bug (a typo would silently change the
             * prompt), so refuse it. */
            if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
                strcmp(role, "tool")) {
                free(msgs);
                return specd_seterr(err, "request.chat.messages[%zu].role: '%.32s' is not one "
                                         "of system, user, assistant, tool", i, role),
                       GRPC_STATUS_INVALID_ARGUMENT;
            }
            msgs[i].role = role;
            msgs[i].content = req->chat->messages[i]->content;
        }
        int rc = specd_chat_tokenize(tok, msgs, nm, ids, n, err);
        free(msgs);
        if (rc) return specd_preferr(err, "request.chat"), GRPC_STATUS_INVALID_ARGUMENT;
        return GRPC_STATUS_OK;
    }
    /* Special tokens in raw text are recognized too, as Hugging Face
     * encode() does. */
    if (specd_tokenize(tok, req->text, strlen(req->text), 1, ids, n, err))
        return specd_preferr(err, "request.input"), GRPC_STATUS_INVALID_ARGUMENT;
    if (specd_tokenizer_add_bos(tok, ids, n)) {
        free(*ids);
        *ids = NULL;
        return specd_seterr(err, "out of memory"), GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    return GRPC_STATUS_OK;
}

grpc_status_code specd_prompt_from_request(const specd_tokenizer *tok,
                                           const Specd__V1__GenerateRequest *req, int vocab,
                                           int max_tokens, int32_t **ids, size_t *n,
                                           specd_error *err) {
    *ids = NULL;
    *n = 0;
    grpc_status_code code = GRPC_STATUS_OK;
    switch (req->input_case) {
    case SPECD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS:
        *n = req->token_ids->n_ids;
        /* Refuse an absurd id list before copying it. */
        if (max_tokens > 0 && *n > (size_t)max_tokens) break;
        *ids = malloc(sizeof(int32_t) * (*n + 1));
        if (!*ids) return specd_seterr(err, "out of memory"), GRPC_STATUS_RESOURCE_EXHAUSTED;
        if (*n) memcpy(*ids, req->token_ids->ids, sizeof(int32_t) * *n);
        break;
    case SPECD__V1__GENERATE_REQUEST__INPUT_TEXT:
    case SPECD__V1__GENERATE_REQUEST__INPUT_CHAT:
        if (!tok)
            return specd_seterr(err, "request.input: this server has no tokenizer; send "
                                     "token_ids"),
                   GRPC_STATUS_FAILED_PRECONDITION;
        if ((code = tokenize_input(tok, req, ids, n, err))) return code;
        break;
    default:
        return specd_seterr(err, "request.input: one of text, chat, token_ids is required"),
               GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (*n == 0) {
        specd_seterr(err, "request.input: the prompt is empty");
        code = GRPC_STATUS_INVALID_ARGUMENT;
    } else if (max_tokens > 0 && *n > (size_t)max_tokens) {
        specd_seterr(err, "request.input: the prompt has %zu tokens, over the limit of %d", *n,
                     max_tokens);
        code = GRPC_STATUS_INVALID_ARGUMENT;
    } else if (vocab > 0) {
        for (size_t i = 0; i < *n; i++)
            if ((*ids)[i] < 0 || (*ids)[i] >= vocab) {
                specd_seterr(err, "request.input: token id %d at %zu is outside the vocabulary "
                                  "(0..%d)", (*ids)[i], i, vocab - 1);
                code = GRPC_STATUS_INVALID_ARGUMENT;
                break;
            }
    }
    if (code) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return code;
}
