/* corpus.c - reads the trainers' corpus and prompt files (corpus.h).
 *
 * Files are mapped, not read: a corpus may be up to 2 GiB, and only the
 * documents (copied out, NUL-terminated) need to live on the heap. Each
 * document is checked before it is kept, so the trainers can hand any text
 * to the tokenizer without checks of their own: valid UTF-8, no NUL byte
 * (texts are C strings), a bounded "kind". A failed read leaves the corpus
 * as it was, so a caller can report the error and carry on with what it
 * had. */
#include "tools/train/corpus.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/util/mmap_file.h"
#include "common/util/utf8.h"

/* ---- the document array -------------------------------------------------- */

/* The array is never shrunk and grows by doubling from 16, so its capacity
 * follows from n_docs alone and corpus.h needs no capacity field: it is
 * full exactly when n_docs is 16 or a larger power of two. */
static int grow(corpus *c, specd_error *err) {
    size_t n = c->n_docs;
    if (n != 0 && (n < 16 || (n & (n - 1)) != 0)) return 0;
    size_t cap = n == 0 ? 16 : n * 2;
    if (cap > SIZE_MAX / sizeof(corpus_doc)) return specd_seterr(err, "too many documents");
    corpus_doc *docs = realloc(c->docs, cap * sizeof(corpus_doc));
    if (!docs) return specd_seterr(err, "out of memory for %zu documents", cap);
    c->docs = docs;
    return 0;
}

static int push_doc(corpus *c, const char *text, size_t len, int is_prompt, const char *kind,
                    specd_error *err) {
    if (grow(c, err) != 0) return -1;
    char *copy = malloc(len + 1);
    if (!copy) return specd_seterr(err, "out of memory for a document of %zu bytes", len);
    memcpy(copy, text, len);
    copy[len] = 0;
    corpus_doc *d = &c->docs[c->n_docs++];
    memset(d, 0, sizeof *d);
    d->text = copy;
    d->len = len;
    d->is_prompt = is_prompt;
    if (kind) memcpy(d->kind, kind, strlen(kind) + 1); /* length checked by the caller */
    return 0;
}

/* Drops the documents after the first `keep` (a failed read's partial work). */
static void truncate_docs(corpus *c, size_t keep) {
    while (c->n_docs > keep) free(c->docs[--c->n_docs].text);
}

/* ---- byte checks ----------------------------------------------------------- */

/* Offset of the first byte that is not part of a valid UTF-8 character, or n. */
static size_t utf8_invalid_at(const uint8_t *s, size_t n) {
    size_t i = 0, len;
    while (i < n) {
        if (s[i] < 0x80) { /* ASCII: most of any corpus, so no call */
            i++;
            continue;
        }
        if (specd_utf8_next(s + i, n - i, &len) != SPECD_UTF8_OK) return i;
        i += len;
    }
    return n;
}

static size_t count_lines(const char *s, size_t n) {
    size_t lines = 0;
    for (const char *p = s, *end = s + n; (p = memchr(p, '\n', (size_t)(end - p))); p++) lines++;
    return lines;
}

/* 1 if a JSON string in the line escapes U+0000: cJSON would decode it into
 * a NUL that ends the C string, silently dropping the rest of the text. */
static int has_escaped_nul(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && n - i >= 6 && memcmp(s + i + 2, "0000", 4) == 0) return 1;
        i++; /* the escaped character, which may itself be a backslash */
    }
    return 0;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* ---- JSONL ----------------------------------------------------------------- */

/* One line (without its '\n'): an object with "text" or "prompt" and an
 * optional "kind"; a blank line is skipped. */
static int jsonl_line(corpus *c, const char *name, size_t lineno, const char *line, size_t len,
                      specd_error *err) {
    if (len > CORPUS_MAX_LINE_BYTES)
        return specd_seterr(err, "%s:%zu: line is longer than %zu bytes", name, lineno,
                            (size_t)CORPUS_MAX_LINE_BYTES);
    if (is_blank(line, len)) return 0;
    if (memchr(line, 0, len)) return specd_seterr(err, "%s:%zu: NUL byte in line", name, lineno);
    size_t bad = utf8_invalid_at((const uint8_t *)line, len);
    if (bad < len)
        return specd_seterr(err, "%s:%zu: invalid UTF-8 at column %zu", name, lineno, bad + 1);
    if (has_escaped_nul(line, len))
        return specd_seterr(err, "%s:%zu: \\u0000 in a string (texts cannot hold NUL)", name,
                            lineno);

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!root)
        return specd_seterr(err, "%s:%zu: invalid JSON at column %zu", name, lineno,
                            end ? (size_t)(end - line) + 1 : (size_t)1);
    int rc = -1;
    /* cJSON stops after the value; anything but blanks after it is an error */
    size_t rest = end ? (size_t)(end - line) : len;
    while (rest < len && is_blank(line + rest, 1)) rest++;
    if (rest < len) {
        specd_seterr(err, "%s:%zu: text after the JSON object at column %zu", name, lineno,
                     rest + 1);
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        specd_seterr(err, "%s:%zu: not a JSON object", name, lineno);
        goto done;
    }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
    if (text && prompt) {
        specd_seterr(err, "%s:%zu: both \"text\" and \"prompt\" (a line is one or the other)", name,
                     lineno);
        goto done;
    }
    const cJSON *body = text ? text : prompt;
    const char *key = text ? "text" : "prompt";
    if (!body) {
        specd_seterr(err, "%s:%zu: missing \"text\" or \"prompt\"", name, lineno);
        goto done;
    }
    if (!cJSON_IsString(body) || !body->valuestring) {
        specd_seterr(err, "%s:%zu: \"%s\" is not a string", name, lineno, key);
        goto done;
    }
    const char *kind_str = NULL;
    if (kind) {
        if (!cJSON_IsString(kind) || !kind->valuestring) {
            specd_seterr(err, "%s:%zu: \"kind\" is not a string", name, lineno);
            goto done;
        }
        kind_str = kind->valuestring;
        if (strlen(kind_str) > CORPUS_MAX_KIND) {
            specd_seterr(err, "%s:%zu: \"kind\" is longer than %d bytes", name, lineno,
                         CORPUS_MAX_KIND);
            goto done;
        }
    }
    /* The line was valid UTF-8 and cJSON rejects unpaired surrogates in
     * \u escapes, so the decoded strings are valid too. */
    size_t body_len = strlen(body->valuestring);
    if (push_doc(c, body->valuestring, body_len, prompt != NULL, kind_str, err) != 0) {
        specd_preferr(err, "%s:%zu", name, lineno);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

static int read_jsonl(corpus *c, const char *name, const char *buf, size_t len, specd_error *err) {
    size_t lineno = 1;
    for (size_t i = 0; i < len; lineno++) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len;
        if (jsonl_line(c, name, lineno, buf + i, end - i, err) != 0) return -1;
        i = end + 1;
    }
    return 0;
}

/* ---- plain text -------------------------------------------------------------- */

/* One document of a plain-text file; first_line numbers its first line. */
static int plain_doc(corpus *c, const char *name, size_t first_line, const char *text, size_t len,
                     specd_error *err) {
    if (is_blank(text, len)) return 0; /* e.g. before a leading separator */
    const char *nul = memchr(text, 0, len);
    if (nul)
        return specd_seterr(err, "%s:%zu: NUL byte", name,
                            first_line + count_lines(text, (size_t)(nul - text)));
    size_t bad = utf8_invalid_at((const uint8_t *)text, len);
    if (bad < len)
        return specd_seterr(err, "%s:%zu: invalid UTF-8", name,
                            first_line + count_lines(text, bad));
    return push_doc(c, text, len, 0, NULL, err);
}

/* A separator is a line holding only a form feed (a CRLF file's "\f\r"
 * too). Each document keeps its text exactly, up to the separator line. */
static int read_plain(corpus *c, const char *name, const char *buf, size_t len, specd_error *err) {
    size_t doc_start = 0, doc_line = 1, lineno = 1;
    for (size_t i = 0; i < len; lineno++) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len;
        size_t n = end - i;
        if ((n == 1 || (n == 2 && buf[i + 1] == '\r')) && buf[i] == '\f') {
            if (plain_doc(c, name, doc_line, buf + doc_start, i - doc_start, err) != 0) return -1;
            doc_start = nl ? end + 1 : len;
            doc_line = lineno + 1;
        }
        i = end + 1;
    }
    if (doc_start < len) return plain_doc(c, name, doc_line, buf + doc_start, len - doc_start, err);
    return 0;
}

/* ---- entry points --------------------------------------------------------------- */

int corpus_read_buffer(corpus *c, const char *name, const char *buf, size_t len, int jsonl,
                       specd_error *err) {
    if (len > CORPUS_MAX_FILE_BYTES)
        return specd_seterr(err, "%s: larger than %zu bytes", name, (size_t)CORPUS_MAX_FILE_BYTES);
    if (len == 0) return 0; /* no documents (and buf may be NULL) */
    size_t keep = c->n_docs;
    int rc = jsonl ? read_jsonl(c, name, buf, len, err) : read_plain(c, name, buf, len, err);
    if (rc != 0) truncate_docs(c, keep);
    if (rc != 0 && keep == 0) corpus_free(c); /* as it was: no array either */
    return rc;
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

int corpus_read_file(corpus *c, const char *path, specd_error *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return specd_seterr(err, "cannot open '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return specd_seterr(err, "'%s' is not a regular file", path);
    /* refused before mapping: a file over the cap is the wrong file */
    if ((uint64_t)st.st_size > (uint64_t)CORPUS_MAX_FILE_BYTES)
        return specd_seterr(err, "'%s' is larger than %zu bytes", path,
                            (size_t)CORPUS_MAX_FILE_BYTES);
    if (st.st_size == 0) return 0; /* an empty file has no documents (and cannot be mapped) */
    void *addr = NULL;
    size_t len = 0;
    if (specd_map_file(path, &addr, &len, err) != 0) return -1;
    int rc = corpus_read_buffer(c, path, addr, len, has_suffix(path, ".jsonl"), err);
    specd_unmap_file(addr, len);
    return rc;
}

void corpus_free(corpus *c) {
    truncate_docs(c, 0);
    free(c->docs);
    c->docs = NULL;
    c->n_docs = 0;
}
