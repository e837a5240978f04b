/* chat.c - ChatML prompt rendering; see chat.h.
 *
 * The output is exactly what the template renders under Jinja (checked
 * against transformers' apply_chat_template in tests/golden/tokenizer):
 *   [<|im_start|>system\nDEFAULT<|im_end|>\n]   when the template has a default
 *                                              and messages[0] is not "system"
 *   <|im_start|>ROLE\nCONTENT<|im_end|>\n        for each message
 *   <|im_start|>assistant\n                     if add_generation_prompt */
#include "common/text/chat.h"

#include <stdlib.h>
#include <string.h>

#define IM_START "<|im_start|>"
#define IM_END "<|im_end|>"

typedef struct strbuf {
    char *s;
    size_t n, cap;
    int oom;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t len) {
    if (b->oom) return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len + 1) cap *= 2;
        char *bigger = realloc(b->s, cap);
        if (!bigger) {
            b->oom = 1;
            return;
        }
        b->s = bigger;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, len);
    b->n += len;
    b->s[b->n] = '\0';
}

static void sb_str(strbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Reads the Jinja string literal whose opening quote is at q (Python-style
 * escapes). Returns its value (malloc'd) or NULL if it is unterminated. */
static char *read_literal(const char *q) {
    char quote = *q;
    strbuf b = {0};
    sb_add(&b, "", 0);
    for (const char *p = q + 1; *p; p++) {
        if (*p == quote) {
            if (b.oom) break;
            return b.s;
        }
        if (*p != '\\' || !p[1]) {
            sb_add(&b, p, 1);
            continue;
        }
        p++;
        switch (*p) {
        case 'n': sb_add(&b, "\n", 1); break;
        case 't': sb_add(&b, "\t", 1); break;
        case 'r': sb_add(&b, "\r", 1); break;
        case '\\': case '\'': case '"': sb_add(&b, p, 1); break;
        default: sb_add(&b, p - 1, 2); break; /* unknown escapes stay as written */
        }
    }
    free(b.s);
    return NULL;
}

/* A default system prompt is a literal '<|im_start|>system\n...<|im_end|>\n'
 * written out whole in the template. A literal holding just the header
 * ('<|im_start|>system\n' + message['content'] ...) is not one. */
char *specd_chat_default_system(const char *tmpl) {
    static const char header[] = IM_START "system\n";
    static const char footer[] = IM_END "\n";
    for (const char *at = strstr(tmpl, IM_START); at; at = strstr(at + 1, IM_START)) {
        if (at == tmpl || (at[-1] != '\'' && at[-1] != '"')) continue;
        char *lit = read_literal(at - 1);
        if (!lit) continue;
        size_t len = strlen(lit), hl = strlen(header), fl = strlen(footer);
        if (len >= hl + fl && !strncmp(lit, header, hl) && !strcmp(lit + len - fl, footer)) {
            size_t body = len - hl - fl;
            memmove(lit, lit + hl, body);
            lit[body] = '\0';
            if (!strstr(lit, IM_END)) return lit;
        }
        free(lit);
    }
    return NULL;
}

static void add_turn(strbuf *b, const char *role, const char *content) {
    sb_str(b, IM_START);
    sb_str(b, role);
    sb_str(b, "\n");
    sb_str(b, content);
    sb_str(b, IM_END "\n");
}

char *specd_chat_render(const char *tmpl, const specd_chat_msg *msgs, size_t n,
                        int add_generation_prompt, specd_error *err) {
    if (tmpl && !(strstr(tmpl, IM_START) && strstr(tmpl, IM_END))) {
        specd_seterr(err, "unsupported chat template (specd renders ChatML templates only, "
                     "with <|im_start|> and <|im_end|>)");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            specd_seterr(err, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
            return NULL;
        }
    }
    char *default_system = tmpl ? specd_chat_default_system(tmpl) : NULL;
    strbuf b = {0};
    sb_add(&b, "", 0);
    if (n > 0 && default_system && strcmp(msgs[0].role, "system") != 0)
        add_turn(&b, "system", default_system);
    for (size_t i = 0; i < n; i++) add_turn(&b, msgs[i].role, msgs[i].content);
    if (add_generation_prompt) sb_str(&b, IM_START "assistant\n");
    free(default_system);
    if (b.oom) {
        free(b.s);
        specd_seterr(err, "chat: out of memory");
        return NULL;
    }
    return b.s;
}
