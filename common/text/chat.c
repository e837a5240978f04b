/* chat.c - chat templates rendered natively; see chat.h.
 *
 * Each family's output is exactly what its templates render under jinja2
 * with transformers' settings (tests/unit/test_chat.c, fixtures in
 * tests/golden/tokenizer/):
 *
 *   chatml:   [<|im_start|>system\nDEFAULT<|im_end|>\n]   when the template has a
 *                                                      default and messages[0]
 *                                                      is not "system"
 *             <|im_start|>ROLE\nCONTENT<|im_end|>\n        for each message
 *             <|im_start|>assistant\n                     if add_generation_prompt
 *   llama3:   BOS (before the first message only)
 *             <|start_header_id|>ROLE<|end_header_id|>\n\nTRIM(CONTENT)<|eot_id|>
 *             <|start_header_id|>assistant<|end_header_id|>\n\n   if add_generation_prompt
 *   llama3.1: BOS <|start_header_id|>system<|end_header_id|>\n\n
 *             Cutting Knowledge Date: December 2023\nToday Date: DATE\n\n
 *             TRIM(messages[0].content if it is "system") <|eot_id|>
 *             then the turns as llama3 (a "tool" turn: an ipython header and
 *             the content as a JSON string, untrimmed), then the header.
 *   deepseek-r1 (DeepSeek-R1-Distill-Llama): BOS, the LAST system message's
 *             content, then <｜User｜>CONTENT per user turn,
 *             <｜Assistant｜>ANSWER<｜end▁of▁sentence｜> per assistant turn
 *             (ANSWER: what follows its last </think>, the reasoning is not
 *             history), tool outputs wrapped in DeepSeek's tool-output
 *             markers, and <｜Assistant｜><think>\n as the generation prompt.
 *
 * TRIM is Jinja's trim filter, Python's str.strip(): every character for
 * which str.isspace() holds, Unicode's among them. */
#include "common/text/chat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util/utf8.h"

#define IM_START "<|im_start|>"
#define IM_END "<|im_end|>"
#define L3_START "<|start_header_id|>"
#define L3_END "<|end_header_id|>"
#define L3_EOT "<|eot_id|>"
/* DeepSeek's markers: fullwidth bars (U+FF5C) and U+2581 for spaces */
#define DS_TOK(name) "<\uFF5C" name "\uFF5C>"
#define DS_USER DS_TOK("User")
#define DS_ASSISTANT DS_TOK("Assistant")
#define DS_EOS DS_TOK("end\u2581of\u2581sentence")
#define DS_OUTS_BEGIN DS_TOK("tool\u2581outputs\u2581begin")
#define DS_OUTS_END DS_TOK("tool\u2581outputs\u2581end")
#define DS_OUT_BEGIN DS_TOK("tool\u2581output\u2581begin")
#define DS_OUT_END DS_TOK("tool\u2581output\u2581end")
/* Llama 3.1's system preamble, as the templates spell it */
#define L31_CUTOFF "Cutting Knowledge Date: December 2023\n"
#define L31_TODAY "Today Date: "
#define L31_DEFAULT_DATE "26 Jul 2024"

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

/* ---- families -------------------------------------------------------------- */

typedef enum { FAM_CHATML, FAM_LLAMA3, FAM_LLAMA31, FAM_DEEPSEEK_R1 } chat_fam;

static const char *const fam_names[] = {"chatml", "llama3", "llama3.1", "deepseek-r1"};

static int has(const char *s, const char *what) { return strstr(s, what) != NULL; }

/* Llama 3's header tokens alone do not make a Llama 3 template: function-
 * calling fine-tunes (functionary, firefunction) reuse them with turns of
 * their own. So llama3.1 needs Meta's system preamble (with its "Today
 * Date" line, which functionary's preamble lacks), and llama3 needs the
 * header + trimmed content turn and no tool or function handling at all.
 * DeepSeek's R1 distills: the template's own state and generation prompt,
 * and no enable_thinking switch (the Qwen distill's copy in llama.cpp closes
 * the thinking block with one). */
static int detect(const char *tmpl, chat_fam *fam, specd_error *err) {
    if (!tmpl || (has(tmpl, IM_START) && has(tmpl, IM_END))) {
        *fam = FAM_CHATML;
        return 0;
    }
    if (has(tmpl, DS_USER) && has(tmpl, "{{'" DS_ASSISTANT "<think>\\n'}}") &&
        has(tmpl, "content.split('</think>')[-1]") &&
        has(tmpl, "ns = namespace(is_first=false, is_tool=false, is_output_first=true, "
                  "system_prompt='')") &&
        !has(tmpl, "enable_thinking")) {
        *fam = FAM_DEEPSEEK_R1;
        return 0;
    }
    if (has(tmpl, L3_START) && has(tmpl, L3_END) && has(tmpl, L3_EOT)) {
        if (has(tmpl, L3_START "system" L3_END "\\n\\n") && has(tmpl, "Cutting Knowledge Date: "
                                                                        "December 2023\\n\" }}") &&
            has(tmpl, "\"" L31_TODAY "\" + date_string")) {
            *fam = FAM_LLAMA31;
            return 0;
        }
        if (!has(tmpl, "tool") && !has(tmpl, "function") &&
            (has(tmpl, "message['content'] | trim") || has(tmpl, "message['content']|trim"))) {
            *fam = FAM_LLAMA3;
            return 0;
        }
    }
    specd_seterr(err, "unsupported chat template (specd renders the ChatML, Llama 3, "
                      "Llama 3.1-3.3 and DeepSeek-R1-Distill templates; send text or "
                      "token_ids instead)");
    return -1;
}

const char *specd_chat_family(const char *tmpl, specd_error *err) {
    chat_fam fam;
    return detect(tmpl, &fam, err) ? NULL : fam_names[fam];
}

const char *specd_chat_format(const specd_tokenizer *tok) {
    if (!tok) return "";
    specd_error err;
    const char *fam = specd_chat_family(specd_tokenizer_chat_template(tok), &err);
    return fam ? fam : "";
}

/* ---- Jinja's trim and transformers' tojson -------------------------------- */

/* The character at p and its length in *len; an invalid byte sequence is
 * no space (a template never sees one: requests are checked for UTF-8). */
static uint32_t utf8_at(const uint8_t *p, const uint8_t *end, size_t *len) {
    if (specd_utf8_next(p, (size_t)(end - p), len) != SPECD_UTF8_OK) return 0xFFFD;
    return specd_utf8_decode(p, *len);
}

/* Python's str.isspace(), the set str.strip() removes. */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Appends s with leading and trailing Python whitespace removed. */
static void sb_trimmed(strbuf *b, const char *s) {
    const uint8_t *p = (const uint8_t *)s, *end = p + strlen(s);
    size_t len;
    while (p < end && py_space(utf8_at(p, end, &len))) p += len;
    const uint8_t *last = p; /* one past the last non-space character */
    for (const uint8_t *q = p; q < end; q += len)
        if (!py_space(utf8_at(q, end, &len))) last = q + len;
    sb_add(b, (const char *)p, (size_t)(last - p));
}

/* Appends s as json.dumps(s, ensure_ascii=False) writes it. */
static void sb_json_string(strbuf *b, const char *s) {
    sb_str(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': sb_str(b, "\\\""); break;
        case '\\': sb_str(b, "\\\\"); break;
        case '\n': sb_str(b, "\\n"); break;
        case '\r': sb_str(b, "\\r"); break;
        case '\t': sb_str(b, "\\t"); break;
        case '\b': sb_str(b, "\\b"); break;
        case '\f': sb_str(b, "\\f"); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                sb_str(b, esc);
            } else {
                sb_add(b, (const char *)p, 1);
            }
        }
    }
    sb_str(b, "\"");
}

/* ---- the renderers ---------------------------------------------------------- */

static void chatml_turn(strbuf *b, const char *role, const char *content) {
    sb_str(b, IM_START);
    sb_str(b, role);
    sb_str(b, "\n");
    sb_str(b, content);
    sb_str(b, IM_END "\n");
}

static void render_chatml(strbuf *b, const char *tmpl, const specd_chat_msg *msgs, size_t n,
                          int gen) {
    char *default_system = tmpl ? specd_chat_default_system(tmpl) : NULL;
    if (n > 0 && default_system && strcmp(msgs[0].role, "system") != 0)
        chatml_turn(b, "system", default_system);
    for (size_t i = 0; i < n; i++) chatml_turn(b, msgs[i].role, msgs[i].content);
    if (gen) sb_str(b, IM_START "assistant\n");
    free(default_system);
}

static void llama3_header(strbuf *b, const char *role) {
    sb_str(b, L3_START);
    sb_str(b, role);
    sb_str(b, L3_END "\n\n");
}

/* The date Llama 3.1-3.3 print: today's (strftime_now("%d %b %Y"), C locale)
 * where the template asks for it, else the template's own literal. The
 * month names are a table, not strftime's %b, so that a process whose
 * locale is set still prints Python's English ones. */
static void llama31_date(const char *tmpl, const char *given, char out[32]) {
    static const char *const mon[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    snprintf(out, 32, "%s", L31_DEFAULT_DATE);
    if (has(tmpl, "strftime_now")) {
        if (given) {
            snprintf(out, 32, "%s", given);
        } else {
            time_t now = time(NULL);
            struct tm tm;
            if (gmtime_r(&now, &tm))
                snprintf(out, 32, "%02d %s %04d", tm.tm_mday, mon[tm.tm_mon], tm.tm_year + 1900);
        }
        return;
    }
    const char *set = strstr(tmpl, "set date_string = ");
    if (set) set += strlen("set date_string = ");
    if (set && (*set == '"' || *set == '\'')) {
        char *lit = read_literal(set);
        if (lit && strlen(lit) < 32) snprintf(out, 32, "%s", lit);
        free(lit);
    }
}

static int render_llama3(strbuf *b, chat_fam fam, const char *tmpl, const char *bos,
                         const char *date, const specd_chat_msg *msgs, size_t n, int gen,
                         specd_error *err) {
    size_t first = 0;
    if (fam == FAM_LLAMA31) {
        if (n == 0) {
            specd_seterr(err, "the chat template needs at least one message");
            return -1;
        }
        char day[32];
        llama31_date(tmpl, date, day);
        sb_str(b, bos);
        llama3_header(b, "system");
        sb_str(b, L31_CUTOFF L31_TODAY);
        sb_str(b, day);
        sb_str(b, "\n\n");
        if (!strcmp(msgs[0].role, "system")) {
            sb_trimmed(b, msgs[0].content);
            first = 1;
        }
        sb_str(b, L3_EOT);
    }
    for (size_t i = first; i < n; i++) {
        if (fam == FAM_LLAMA3 && i == 0) sb_str(b, bos);
        if (fam == FAM_LLAMA31 && (!strcmp(msgs[i].role, "tool") ||
                                   !strcmp(msgs[i].role, "ipython"))) {
            llama3_header(b, "ipython");
            sb_json_string(b, msgs[i].content);
        } else {
            llama3_header(b, msgs[i].role);
            sb_trimmed(b, msgs[i].content);
        }
        sb_str(b, L3_EOT);
    }
    if (gen) llama3_header(b, "assistant");
    return 0;
}

static void render_deepseek_r1(strbuf *b, const char *bos, const specd_chat_msg *msgs,
                               size_t n, int gen) {
    const char *system = "";
    for (size_t i = 0; i < n; i++)
        if (!strcmp(msgs[i].role, "system")) system = msgs[i].content;
    sb_str(b, bos);
    sb_str(b, system);
    /* in_tool: the last turns were tool outputs, whose block an answer or
     * the end closes (a user turn does not); first_out: no output yet, in
     * any block */
    int in_tool = 0, first_out = 1;
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        if (!strcmp(role, "user")) {
            in_tool = 0;
            sb_str(b, DS_USER);
            sb_str(b, c);
        } else if (!strcmp(role, "assistant") && in_tool) {
            in_tool = 0;
            sb_str(b, DS_OUTS_END);
            sb_str(b, c);
            sb_str(b, DS_EOS);
        } else if (!strcmp(role, "assistant")) {
            for (const char *t = strstr(c, "</think>"); t; t = strstr(t + 1, "</think>"))
                c = t + strlen("</think>");
            sb_str(b, DS_ASSISTANT);
            sb_str(b, c);
            sb_str(b, DS_EOS);
        } else if (!strcmp(role, "tool")) {
            in_tool = 1;
            sb_str(b, first_out ? DS_OUTS_BEGIN : "\n");
            first_out = 0;
            sb_str(b, DS_OUT_BEGIN);
            sb_str(b, c);
            sb_str(b, DS_OUT_END);
        }
    }
    if (in_tool) sb_str(b, DS_OUTS_END);
    if (gen && !in_tool) sb_str(b, DS_ASSISTANT "<think>\n");
}

char *specd_chat_render(const char *tmpl, const specd_chat_vars *vars,
                        const specd_chat_msg *msgs, size_t n, int add_generation_prompt,
                        specd_error *err) {
    chat_fam fam;
    if (detect(tmpl, &fam, err)) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            specd_seterr(err, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
            return NULL;
        }
    }
    const char *bos = vars && vars->bos_token ? vars->bos_token : "";
    strbuf b = {0};
    sb_add(&b, "", 0);
    if (fam == FAM_CHATML) {
        render_chatml(&b, tmpl, msgs, n, add_generation_prompt);
    } else if (fam == FAM_DEEPSEEK_R1) {
        render_deepseek_r1(&b, bos, msgs, n, add_generation_prompt);
    } else if (render_llama3(&b, fam, tmpl, bos, vars ? vars->date : NULL, msgs, n,
                             add_generation_prompt, err)) {
        free(b.s);
        return NULL;
    }
    if (b.oom) {
        free(b.s);
        specd_seterr(err, "chat: out of memory");
        return NULL;
    }
    return b.s;
}

int specd_chat_tokenize(const specd_tokenizer *tok, const specd_chat_msg *msgs, size_t n,
                        int32_t **ids, size_t *n_ids, specd_error *err) {
    *ids = NULL;
    *n_ids = 0;
    /* bos_token is the BOS token's text; the tokenizer turns it back into
     * the id, since templates spell their control tokens as text */
    char bos[64] = "";
    size_t len = 0;
    const uint8_t *p = specd_token_bytes(tok, specd_tokenizer_bos(tok), &len);
    if (p && len < sizeof bos) {
        memcpy(bos, p, len);
        bos[len] = '\0';
    }
    specd_chat_vars vars = {bos, NULL};
    char *text = specd_chat_render(specd_tokenizer_chat_template(tok), &vars, msgs, n, 1, err);
    if (!text) return -1;
    int rc = specd_tokenize(tok, text, strlen(text), 1, ids, n_ids, err);
    free(text);
    if (rc == 0 && specd_tokenizer_add_bos(tok, ids, n_ids)) {
        specd_seterr(err, "out of memory");
        return -1;
    }
    return rc ? -1 : 0;
}
