/* corpus.h - the trainers' text input: plain text or JSONL, read into
 * documents (training text) or prompts (for self-generated data and eval).
 *
 * Accepted files:
 *   *.jsonl  one JSON object per line with "text" (a document) or "prompt"
 *            (a user message, to be sent through the chat template), and an
 *            optional "kind" ("chat", "code", "math", ...). Blank lines are
 *            skipped.
 *   other    plain UTF-8 text; documents are separated by a line holding
 *            only a form feed; a file without one is one document.
 * Outside bytes: limits below; errors name the file and line. */
#ifndef SPECD_TRAIN_CORPUS_H
#define SPECD_TRAIN_CORPUS_H

#include <stddef.h>

#include "common/util/error.h"

#define CORPUS_MAX_FILE_BYTES ((size_t)1 << 31) /* 2 GiB */
#define CORPUS_MAX_LINE_BYTES ((size_t)1 << 24) /* 16 MiB per JSONL line */
#define CORPUS_MAX_KIND 31

typedef struct corpus_doc {
    char *text;                   /* NUL-terminated UTF-8 */
    size_t len;
    int is_prompt;                /* came from a "prompt" key */
    char kind[CORPUS_MAX_KIND + 1]; /* "" when absent */
} corpus_doc;

typedef struct corpus {
    corpus_doc *docs;
    size_t n_docs;
} corpus;

/* Reads one file (format by extension: ".jsonl", any case, or plain text)
 * and appends its documents to *c (zero-initialize c first; an empty file
 * adds none). Every document is valid UTF-8 without NUL bytes. -1 + message
 * naming file and line ("corpus.jsonl:17: missing \"text\" or \"prompt\"")
 * on a malformed line, an over-limit size, invalid UTF-8 or a NUL (raw or
 * \u0000); *c then holds exactly the documents it had before the call. */
int corpus_read_file(corpus *c, const char *path, specd_error *err);
/* The same on a buffer (fuzz target); name is used in messages. */
int corpus_read_buffer(corpus *c, const char *name, const char *buf, size_t len, int jsonl,
                       specd_error *err);
void corpus_free(corpus *c);

#endif
