/* chat.h - renders chat messages into a prompt, as the model's template would.
 *
 * specd does not embed a Jinja interpreter. It recognises the template
 * families that Llama-family models ship and renders them natively, byte
 * for byte what jinja2 renders under transformers' apply_chat_template
 * (tests/unit/test_chat.c checks both against jinja2's output):
 *
 *   chatml   <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Yi, Hermes and
 *            others), including a default system prompt that the template
 *            injects when the conversation does not start with one (SmolLM2:
 *            "You are a helpful AI assistant named SmolLM, trained by
 *            Hugging Face"; read from the template, not hard-coded);
 *   llama3   Meta's Llama 3.0 Instruct template: BOS, then
 *            <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
 *            with content trimmed;
 *   llama3.1 Meta's Llama 3.1 / 3.2 / 3.3 Instruct templates: the same
 *            turns after a system turn that always opens with "Cutting
 *            Knowledge Date: December 2023\nToday Date: DATE\n\n" (3.1 and
 *            3.3 print the template's own date, "26 Jul 2024"; 3.2 prints
 *            today's, as transformers' strftime_now gives it), and "tool"
 *            messages as an ipython turn holding the content as a JSON
 *            string. Tool definitions and tool calls are not rendered;
 *   deepseek-r1  DeepSeek's R1-Distill template (the Llama 3.1 8B and 70B
 *            distills): <｜User｜> and <｜Assistant｜> turns, the system
 *            prompt up front, answers without their </think> reasoning, and
 *            "<｜Assistant｜><think>\n" to start the answer.
 *
 * Any other template (function-calling fine-tunes that reuse Llama 3's
 * header tokens, DeepSeek V3's, ...) is refused with a message saying so,
 * rather than rendered in a format the model was not trained on; such
 * models still take text and token-id prompts. */
#ifndef SPECD_CHAT_H
#define SPECD_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/text/tokenizer.h"
#include "common/util/error.h"

typedef struct {
    const char *role;
    const char *content;
} specd_chat_msg;

/* The template's variables besides the messages. */
typedef struct specd_chat_vars {
    const char *bos_token; /* the BOS token's text ("<|begin_of_text|>"); NULL = "" */
    const char *date;      /* what strftime_now("%d %b %Y") gives; NULL = today, UTC */
} specd_chat_vars;

/* The family a template belongs to ("chatml", "llama3", "llama3.1",
 * "deepseek-r1"; NULL = plain ChatML), or NULL with a message naming the
 * families specd renders. */
const char *specd_chat_family(const char *template_or_null, specd_error *err);

/* Returns the rendered prompt (malloc'd, NUL-terminated), or NULL with a
 * message: the template is of no family above, a message has no role or
 * content, or the template itself would raise (llama3.1 with no messages).
 * template_or_null NULL means plain ChatML with no default system prompt.
 * add_generation_prompt appends the assistant's header. vars may be NULL. */
char *specd_chat_render(const char *template_or_null, const specd_chat_vars *vars,
                        const specd_chat_msg *msgs, size_t n, int add_generation_prompt,
                        specd_error *err);

/* The family a service renders chat messages in with this tokenizer's
 * template (GetInfo's chat_format), or "" where it takes none: no
 * tokenizer, or a template of no family above. */
const char *specd_chat_format(const specd_tokenizer *tok_or_null);

/* Chat messages -> prompt ids, as every service and tool builds them: the
 * tokenizer's template rendered with the generation prompt and the BOS
 * token's text, tokenized with special tokens recognized, then BOS first
 * where the model wants one and the template did not write it
 * (specd_tokenizer_add_bos). *ids is malloc'd. 0 or -1 with a message. */
int specd_chat_tokenize(const specd_tokenizer *tok, const specd_chat_msg *msgs, size_t n,
                        int32_t **ids, size_t *n_ids, specd_error *err);

/* The default system prompt a ChatML template injects, malloc'd; NULL if it
 * has none. Exposed for tests and for `specd generate --verbose`. */
char *specd_chat_default_system(const char *tmpl);

#endif
