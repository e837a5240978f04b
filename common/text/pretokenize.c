/* pretokenize.c - splits text into the pieces BPE runs on.
 *
 * A pre-tokenizer is a pipeline of steps; each step splits every piece the
 * previous step produced (Hugging Face applies Sequence members the same way:
 * a regex never sees across an earlier split, which matters for lookaheads
 * like the `\s+(?!\S)` in GPT-2's pattern). The pipeline runs depth first,
 * so no list of pieces is ever materialised: each final piece goes straight
 * to a callback (BPE).
 *
 * Patterns come in Hugging Face's dialect (Oniguruma) and run on PCRE2 with
 * PCRE2_MATCH_INVALID_UTF, so arbitrary bytes are safe: bytes that are not
 * valid UTF-8 never match and end up in the gaps, which are pieces too. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "common/text/tokenizer_internal.h"
#include "common/util/utf8.h"

/* GPT-2's pattern, as the Hugging Face ByteLevel pre-tokenizer uses it. */
const char TOK_REGEX_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Llama 3's tokenizer.json Split pattern. */
const char TOK_REGEX_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* The Digits pre-tokenizer (Rust's char::is_numeric is \p{N}). */
const char TOK_REGEX_DIGIT[] = "\\p{N}";
const char TOK_REGEX_DIGITS[] = "\\p{N}+";

/* Rewrites the escapes whose meaning differs between Oniguruma and PCRE2:
 * PCRE2's \s (with UCP) also matches U+180E, Oniguruma's is exactly the
 * Unicode White_Space property; Oniguruma's \h is a hex digit, PCRE2's is
 * horizontal space. Text inside \Q...\E is copied untouched. Returns a
 * malloc'd NUL-terminated pattern. */
static char *translate_pattern(const char *pat, size_t len) {
    char *out = malloc(len * 8 + 1); /* "\P{White_Space}" is 15 bytes for 2 */
    if (!out) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (pat[i] != '\\' || i + 1 == len) {
            out[k++] = pat[i];
            continue;
        }
        char c = pat[++i];
        const char *rep = NULL;
        switch (c) {
        case 's': rep = "\\p{White_Space}"; break;
        case 'S': rep = "\\P{White_Space}"; break;
        case 'h': rep = "\\p{AHex}"; break;
        case 'H': rep = "\\P{AHex}"; break;
        default: break;
        }
        if (rep) {
            memcpy(out + k, rep, strlen(rep));
            k += strlen(rep);
            continue;
        }
        out[k++] = '\\';
        out[k++] = c;
        if (c == 'Q') { /* literal until \E */
            while (i + 1 < len && !(pat[i + 1] == '\\' && i + 2 < len && pat[i + 2] == 'E'))
                out[k++] = pat[++i];
        }
    }
    out[k] = '\0';
    return out;
}

int tok_pretok_regex(tok_pretok_step *step, const char *pattern, size_t len, specd_error *err) {
    char *pcre_pattern = translate_pattern(pattern, len);
    if (!pcre_pattern) return specd_seterr(err, "out of memory compiling a pre-tokenizer regex");
    int code_err;
    PCRE2_SIZE err_off;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pcre_pattern, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code_err,
                                     &err_off, NULL);
    free(pcre_pattern);
    if (!code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code_err, msg, sizeof msg);
        return specd_seterr(err, "unsupported pre-tokenizer regex '%.*s': %s",
                            (int)(len > 120 ? 120 : len), pattern, (const char *)msg);
    }
    /* JIT is an optimisation only: the interpreter gives the same matches. */
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    step->kind = TOK_PRETOK_REGEX;
    step->code = code;
    return 0;
}

void tok_pretok_free(tok_pretok_step *step) {
    if (step->kind == TOK_PRETOK_REGEX) pcre2_code_free(step->code);
    memset(step, 0, sizeof *step);
}

typedef struct pretok_run {
    const tok_pretok_step *steps;
    size_t n_steps;
    pcre2_match_data *md[TOK_MAX_PRETOK_STEPS];
    tok_piece_fn fn;
    void *ctx;
    specd_error *err;
} pretok_run;

static int run_step(pretok_run *r, size_t k, const uint8_t *s, size_t len);

static int emit(pretok_run *r, size_t k, const uint8_t *s, size_t len) {
    if (len == 0) return 0; /* HF drops empty pieces */
    return run_step(r, k + 1, s, len);
}

static int split_prefix_space(pretok_run *r, size_t k, const uint8_t *s, size_t len) {
    if (s[0] == ' ') return emit(r, k, s, len);
    uint8_t *spaced = malloc(len + 1);
    if (!spaced) return specd_seterr(r->err, "out of memory in pre-tokenizer");
    spaced[0] = ' ';
    memcpy(spaced + 1, s, len);
    int rc = emit(r, k, spaced, len + 1);
    free(spaced);
    return rc;
}

/* Matches and the gaps between them both become pieces ("Isolated"). */
static int split_regex(pretok_run *r, size_t k, const uint8_t *s, size_t len) {
    const pcre2_code *code = r->steps[k].code;
    pcre2_match_data *md = r->md[k];
    size_t pos = 0, gap = 0;
    while (pos <= len) {
        int rc = pcre2_match(code, s, len, pos, 0, md, NULL);
        /* The JIT runs on a small fixed stack; the interpreter uses the heap
         * and gives the same answer, so a deep match is retried there. */
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(code, s, len, pos, PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return specd_seterr(r->err, "pre-tokenizer regex failed: %s", (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        if (start < gap || end < start || end > len)
            return specd_seterr(r->err, "pre-tokenizer regex reported an impossible match");
        if (start == end) { /* empty match: skip one character, as Oniguruma's find_iter */
            if (start >= len) break;
            size_t clen;
            specd_utf8_next(s + start, len - start, &clen);
            pos = start + clen;
            continue;
        }
        if (emit(r, k, s + gap, start - gap) != 0) return -1;
        if (emit(r, k, s + start, end - start) != 0) return -1;
        gap = pos = end;
    }
    return emit(r, k, s + gap, len - gap);
}

static int run_step(pretok_run *r, size_t k, const uint8_t *s, size_t len) {
    if (k == r->n_steps) return r->fn(r->ctx, s, len);
    if (r->steps[k].kind == TOK_PRETOK_PREFIX_SPACE) return split_prefix_space(r, k, s, len);
    return split_regex(r, k, s, len);
}

int tok_pretokenize(const tok_pretok_step *steps, size_t n_steps, const uint8_t *text,
                    size_t len, tok_piece_fn fn, void *ctx, specd_error *err) {
    if (len == 0) return 0;
    pretok_run r = {.steps = steps, .n_steps = n_steps, .fn = fn, .ctx = ctx, .err = err};
    int rc = 0;
    /* Match data per step and per call keeps a shared tokenizer thread-safe;
     * one ovector pair is enough because only the whole match is used. */
    for (size_t k = 0; k < n_steps && rc == 0; k++) {
        if (steps[k].kind != TOK_PRETOK_REGEX) continue;
        r.md[k] = pcre2_match_data_create(1, NULL);
        if (!r.md[k]) rc = specd_seterr(err, "out of memory in pre-tokenizer");
    }
    if (rc == 0) rc = run_step(&r, 0, text, len);
    for (size_t k = 0; k < n_steps; k++) pcre2_match_data_free(r.md[k]);
    return rc;
}
