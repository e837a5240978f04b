/* fuzz_corpus.c - libFuzzer target for the trainers' corpus reader
 * (corpus_read_buffer), fed every input both as JSONL and as plain text.
 * Any input must give documents that keep the reader's promises (valid
 * UTF-8, NUL-terminated at len, a bounded kind) or an error that names the
 * input and leaves the corpus empty. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/utf8.h"
#include "tools/train/corpus.h"

static void check(const char *buf, size_t size, int jsonl) {
    corpus c = {0};
    specd_error err;
    if (corpus_read_buffer(&c, "fuzz", buf, size, jsonl, &err) != 0) {
        if (c.n_docs != 0 || strncmp(err.msg, "fuzz", 4) != 0) abort();
        corpus_free(&c);
        return;
    }
    /* Plain documents are slices of the input, in order: each is searched
     * for from the end of the one before. (Searching the whole input for
     * each was quadratic: with a separator every few bytes, a 4 KB input
     * holds a thousand documents, and ASan's memmem checks the whole
     * haystack on every call.) */
    size_t from = 0;
    for (size_t i = 0; i < c.n_docs; i++) {
        const corpus_doc *d = &c.docs[i];
        if (strlen(d->text) != d->len || !specd_utf8_valid((const uint8_t *)d->text, d->len))
            abort();
        if (strlen(d->kind) > CORPUS_MAX_KIND) abort();
        if (jsonl) continue;
        if (d->is_prompt || d->kind[0]) abort();
        const char *at = memmem(buf + from, size - from, d->text, d->len);
        if (!at) abort();
        from = (size_t)(at - buf) + d->len;
    }
    corpus_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check((const char *)data, size, 1);
    check((const char *)data, size, 0);
    return 0;
}
