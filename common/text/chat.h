/* chat.h - renders chat messages into a prompt string (ChatML).
 *
 * specd does not embed a Jinja interpreter. It recognises ChatML templates
 * (the <|im_start|>role\ncontent<|im_end|>\n format of SmolLM2, Qwen and
 * others) and renders them natively, including a default system prompt that
 * the template injects when the conversation does not start with a system
 * message (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by
 * Hugging Face"); that prompt is read from the template, not hard-coded. */
#ifndef SPECD_CHAT_H
#define SPECD_CHAT_H

#include <stddef.h>

#include "common/util/error.h"

typedef struct {
    const char *role;
    const char *content;
} specd_chat_msg;

/* Returns the rendered prompt (malloc'd, NUL-terminated), or NULL with a
 * message ("unsupported chat template" for a template that is not ChatML).
 * template_or_null NULL means plain ChatML with no default system prompt.
 * add_generation_prompt appends "<|im_start|>assistant\n". */
char *specd_chat_render(const char *template_or_null, const specd_chat_msg *msgs, size_t n,
                        int add_generation_prompt, specd_error *err);

/* The default system prompt a ChatML template injects, malloc'd; NULL if it
 * has none. Exposed for tests and for `specd generate --verbose`. */
char *specd_chat_default_system(const char *tmpl);

#endif
