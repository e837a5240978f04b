/* fuzz_chat.c - libFuzzer target for chat rendering (common/text/chat.c):
 * the template comes from a model file (GGUF, tokenizer_config.json,
 * chat_template.jinja) and the messages from a request, both outside bytes.
 *
 * Input: one control byte, then fields separated by 0x00. Control bits 0-2
 * pick the template: 0 none (plain ChatML), 1 a ChatML one with a default
 * system prompt, 2 Llama 3.0's, 3 Llama 3.1's (a literal date), 4 Llama
 * 3.2's (strftime_now), 5 DeepSeek-R1's, 6-7 the first field itself. Bit 3:
 * the generation prompt; bit 4: a given date. The remaining fields are
 * role, content, role, content, ...
 *
 * Invariants: never a crash; specd_chat_family and specd_chat_render agree
 * (a family renders every conversation but Llama 3.1's empty one, no family
 * renders nothing); a ChatML or Llama 3 rendering holds every message's
 * role; asked for the generation prompt, a rendering ends with it (or, for
 * DeepSeek-R1 after tool outputs, with the end of their block). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text/chat.h"

#define MAX_INPUT (16u << 10)
#define MAX_MSGS 16

/* Short templates with each family's markers (the real ones are in
 * tests/golden/tokenizer/); detection reads markers, not the whole text. */
#define DS "\uFF5C"
static const char *const templates[6] = {
    NULL,
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe kind.<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}",
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}",
    "{%- set date_string = \"26 Jul 2024\" %}"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}<|end_header_id|><|eot_id|>",
    "{%- set date_string = strftime_now(\"%d %b %Y\") %}"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}<|end_header_id|><|eot_id|>",
    "{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, "
    "system_prompt='') -%}{{'<" DS "User" DS ">' + message['content']}}"
    "{%- set content = content.split('</think>')[-1] -%}"
    "{%- if add_generation_prompt and not ns.is_tool -%}{{'<" DS "Assistant" DS "><think>\\n'}}",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > MAX_INPUT) return 0;
    uint8_t ctl = data[0];
    /* fields as NUL-terminated strings in one copy */
    char *buf = malloc(size);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *fields[2 * MAX_MSGS + 1];
    int nf = 0;
    for (char *p = buf; nf < 2 * MAX_MSGS + 1;) {
        fields[nf++] = p;
        char *z = memchr(p, '\0', (size_t)(buf + size - 1 - p) + 1);
        if (!z || z >= buf + size - 1) break;
        p = z + 1;
    }
    int pick = ctl & 7, first = 0;
    const char *tmpl = pick < 6 ? templates[pick] : (first = 1, fields[0]);
    specd_chat_msg msgs[MAX_MSGS];
    size_t n = 0;
    for (int i = first; i + 1 < nf && n < MAX_MSGS; i += 2)
        msgs[n++] = (specd_chat_msg){fields[i], fields[i + 1]};
    int gen = (ctl >> 3) & 1;

    specd_error err = {{0}};
    const char *fam = specd_chat_family(tmpl, &err);
    specd_chat_vars vars = {"<|begin_of_text|>", ctl & 16 ? "07 Mar 2026" : NULL};
    char *out = specd_chat_render(tmpl, &vars, msgs, n, gen, &err);
    if (!fam && (out || pick < 6)) abort(); /* the built-in templates are recognised */
    if (fam && !out && !(n == 0 && !strcmp(fam, "llama3.1"))) abort();
    if (out && !strcmp(fam, "deepseek-r1")) {
        size_t lo = strlen(out);
        const char *tails[2] = {"<" DS "Assistant" DS "><think>\n",
                                "<" DS "tool\u2581outputs\u2581end" DS ">"};
        int ok = !gen;
        for (int k = 0; k < 2 && !ok; k++)
            ok = lo >= strlen(tails[k]) && !strcmp(out + lo - strlen(tails[k]), tails[k]);
        if (!ok) abort();
        free(out);
    } else if (out) {
        for (size_t i = 0; i < n; i++) {
            /* a Llama 3.1 "tool" turn is spelled "ipython" */
            int renamed = !strcmp(fam, "llama3.1") &&
                          (!strcmp(msgs[i].role, "tool") || !strcmp(msgs[i].role, "ipython"));
            if (!renamed && !strstr(out, msgs[i].role)) abort();
        }
        const char *tail = !strcmp(fam, "chatml") ? "<|im_start|>assistant\n"
                                                  : "<|start_header_id|>assistant<|end_header_id|>\n\n";
        size_t lo = strlen(out), lt = strlen(tail);
        if (gen && (lo < lt || strcmp(out + lo - lt, tail) != 0)) abort();
        free(out);
    }
    free(buf);
    return 0;
}
