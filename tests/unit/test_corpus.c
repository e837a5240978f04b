/* test_corpus.c - the trainers' text input: JSONL documents and prompts,
 * plain text split at form feeds, and errors that name the file and line
 * and leave the corpus as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/harness/test_util.h"
#include "tools/train/corpus.h"

static int read_jsonl(corpus *c, const char *text, specd_error *err) {
    return corpus_read_buffer(c, "corpus.jsonl", text, strlen(text), 1, err);
}

/* The error a one-line (or multi-line) JSONL input gives; the corpus must
 * come back empty. */
static const char *jsonl_error(const char *text) {
    static specd_error err;
    corpus c = {0};
    memset(&err, 0, sizeof err);
    assert_int_equal(corpus_read_buffer(&c, "corpus.jsonl", text, strlen(text), 1, &err), -1);
    assert_int_equal(c.n_docs, 0);
    corpus_free(&c);
    return err.msg;
}

static void test_jsonl_docs_and_prompts(void **state) {
    (void)state;
    const char *in = "{\"text\": \"Hello,\\nworld\", \"kind\": \"prose\"}\n"
                     "\n"
                     "   \r\n"
                     "{\"prompt\": \"What is 2 + 2?\", \"kind\": \"math\", \"extra\": [1, 2]}\r\n"
                     "{\"text\": \"caf\\u00e9 \xe2\x82\xac \\ud83d\\ude00\"}\n"
                     "{\"prompt\": \"\", \"kind\": \"\"}"; /* no final newline */
    corpus c = {0};
    specd_error err = {{0}};
    assert_int_equal(read_jsonl(&c, in, &err), 0);
    assert_int_equal(c.n_docs, 4);
    assert_string_equal(c.docs[0].text, "Hello,\nworld");
    assert_int_equal(c.docs[0].len, 12);
    assert_false(c.docs[0].is_prompt);
    assert_string_equal(c.docs[0].kind, "prose");
    assert_string_equal(c.docs[1].text, "What is 2 + 2?");
    assert_true(c.docs[1].is_prompt);
    assert_string_equal(c.docs[1].kind, "math");
    assert_string_equal(c.docs[2].text, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    assert_string_equal(c.docs[2].kind, "");
    assert_int_equal(c.docs[3].len, 0);
    assert_true(c.docs[3].is_prompt);
    corpus_free(&c);
    assert_null(c.docs);
    assert_int_equal(c.n_docs, 0);
}

static void test_plain_text_form_feeds(void **state) {
    (void)state;
    const char *in = "\f\n" /* a leading separator: no empty document */
                     "first doc\nline 2\n"
                     "\f\n"
                     "second\f inline form feeds stay\n"
                     "\f\r\n" /* CRLF separator */
                     "\n\n"   /* blank: skipped */
                     "\f\n"
                     "last, no newline";
    corpus c = {0};
    specd_error err = {{0}};
    assert_int_equal(corpus_read_buffer(&c, "book.txt", in, strlen(in), 0, &err), 0);
    assert_int_equal(c.n_docs, 3);
    assert_string_equal(c.docs[0].text, "first doc\nline 2\n");
    assert_string_equal(c.docs[1].text, "second\f inline form feeds stay\n");
    assert_string_equal(c.docs[2].text, "last, no newline");
    for (size_t i = 0; i < c.n_docs; i++) {
        assert_false(c.docs[i].is_prompt);
        assert_string_equal(c.docs[i].kind, "");
        assert_int_equal(c.docs[i].len, strlen(c.docs[i].text));
    }
    corpus_free(&c);

    /* no separator: the whole file is one document */
    assert_int_equal(corpus_read_buffer(&c, "a.txt", "one\ntwo\n", 8, 0, &err), 0);
    assert_int_equal(c.n_docs, 1);
    assert_string_equal(c.docs[0].text, "one\ntwo\n");
    corpus_free(&c);
}

static void test_jsonl_errors_name_file_and_line(void **state) {
    (void)state;
    assert_string_equal(jsonl_error("{\"text\": \"a\"}\n\n{\"txt\": \"b\"}\n"),
                        "corpus.jsonl:3: missing \"text\" or \"prompt\"");
    assert_string_equal(jsonl_error("{\"text\": \"a\"}\n{\"text\": \"b\"\n"),
                        "corpus.jsonl:2: invalid JSON at column 12");
    assert_string_equal(jsonl_error("{\"text\": 17}"), "corpus.jsonl:1: \"text\" is not a string");
    assert_string_equal(jsonl_error("{\"prompt\": null}"),
                        "corpus.jsonl:1: \"prompt\" is not a string");
    assert_string_equal(jsonl_error("[\"text\"]"), "corpus.jsonl:1: not a JSON object");
    assert_string_equal(jsonl_error("{\"text\": \"a\"} x"),
                        "corpus.jsonl:1: text after the JSON object at column 15");
    assert_string_equal(
        jsonl_error("{\"text\": \"a\", \"prompt\": \"b\"}"),
        "corpus.jsonl:1: both \"text\" and \"prompt\" (a line is one or the other)");
    assert_string_equal(jsonl_error("{\"text\": \"a\", \"kind\": 3}"),
                        "corpus.jsonl:1: \"kind\" is not a string");
    /* 31 bytes of kind fit, 32 do not */
    corpus c = {0};
    specd_error err = {{0}};
    assert_int_equal(
        read_jsonl(&c, "{\"text\": \"a\", \"kind\": \"abcdefghijklmnopqrstuvwxyz01234\"}", &err),
        0);
    assert_string_equal(c.docs[0].kind, "abcdefghijklmnopqrstuvwxyz01234");
    corpus_free(&c);
    assert_string_equal(
        jsonl_error("\n{\"text\": \"a\", \"kind\": \"abcdefghijklmnopqrstuvwxyz012345\"}"),
        "corpus.jsonl:2: \"kind\" is longer than 31 bytes");
}

static void test_jsonl_bytes(void **state) {
    (void)state;
    /* raw invalid UTF-8 (a lone continuation byte), with its column */
    assert_string_equal(jsonl_error("{\"text\": \"ok\"}\n{\"text\": \"ab\x80\"}\n"),
                        "corpus.jsonl:2: invalid UTF-8 at column 13");
    /* an overlong encoding and a truncated character at the end */
    assert_string_equal(jsonl_error("{\"text\": \"\xc0\xaf\"}"),
                        "corpus.jsonl:1: invalid UTF-8 at column 11");
    assert_string_equal(jsonl_error("{\"text\": \"a\"}\xe2\x82"),
                        "corpus.jsonl:1: invalid UTF-8 at column 14");
    /* an unpaired surrogate escape is refused by the JSON parser */
    assert_non_null(strstr(jsonl_error("{\"text\": \"\\udc00\"}"), "corpus.jsonl:1: invalid JSON"));
    /* U+0000 would cut the C string short; an escaped backslash before
     * "u0000" is plain text and fine */
    assert_string_equal(jsonl_error("{\"text\": \"a\\u0000b\"}"),
                        "corpus.jsonl:1: \\u0000 in a string (texts cannot hold NUL)");
    corpus c = {0};
    specd_error err = {{0}};
    assert_int_equal(read_jsonl(&c, "{\"text\": \"a\\\\u0000b\"}", &err), 0);
    assert_string_equal(c.docs[0].text, "a\\u0000b");
    corpus_free(&c);
    /* a raw NUL byte */
    static const char nul[] = "{\"text\": \"a\"}\n{\"text\": \"a\0b\"}\n";
    assert_int_equal(corpus_read_buffer(&c, "corpus.jsonl", nul, sizeof nul - 1, 1, &err), -1);
    assert_string_equal(err.msg, "corpus.jsonl:2: NUL byte in line");
    assert_int_equal(c.n_docs, 0);
    assert_null(c.docs); /* a failed first read leaves nothing to free */
}

static void test_plain_text_errors(void **state) {
    (void)state;
    corpus c = {0};
    specd_error err = {{0}};
    const char *bad = "fine\n\f\nline 3\nline 4 \xff here\n";
    assert_int_equal(corpus_read_buffer(&c, "book.txt", bad, strlen(bad), 0, &err), -1);
    assert_string_equal(err.msg, "book.txt:4: invalid UTF-8");
    assert_int_equal(c.n_docs, 0);
    static const char nul[] = "a\nb\nc\0d\n";
    assert_int_equal(corpus_read_buffer(&c, "book.txt", nul, sizeof nul - 1, 0, &err), -1);
    assert_string_equal(err.msg, "book.txt:3: NUL byte");
    corpus_free(&c);
}

/* A failed read leaves the documents of earlier reads untouched. */
static void test_failed_read_keeps_earlier_docs(void **state) {
    (void)state;
    corpus c = {0};
    specd_error err = {{0}};
    char line[64];
    for (int i = 0; i < 40; i++) { /* past the first growth steps */
        snprintf(line, sizeof line, "{\"text\": \"doc %d\"}\n", i);
        assert_int_equal(read_jsonl(&c, line, &err), 0);
    }
    assert_int_equal(read_jsonl(&c, "{\"text\": \"x\"}\n{\"text\": \"y\"}\n{}\n", &err), -1);
    assert_string_equal(err.msg, "corpus.jsonl:3: missing \"text\" or \"prompt\"");
    assert_int_equal(c.n_docs, 40);
    assert_string_equal(c.docs[39].text, "doc 39");
    assert_int_equal(read_jsonl(&c, "{\"text\": \"doc 40\"}", &err), 0);
    assert_int_equal(c.n_docs, 41);
    corpus_free(&c);
}

static void test_line_limit(void **state) {
    (void)state;
    size_t n = CORPUS_MAX_LINE_BYTES + 1;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, ' ', n);
    big[n] = 0;
    assert_string_equal(jsonl_error(big), "corpus.jsonl:1: line is longer than 16777216 bytes");
    free(big);
}

static void test_files(void **state) {
    (void)state;
    const char *jl = "{\"prompt\": \"Hi\", \"kind\": \"chat\"}\n";
    const char *path = test_write_temp(jl, strlen(jl), ".jsonl");
    corpus c = {0};
    specd_error err = {{0}};
    assert_int_equal(corpus_read_file(&c, path, &err), 0);
    unlink(path);
    assert_int_equal(c.n_docs, 1);
    assert_true(c.docs[0].is_prompt);
    /* the same bytes under another extension are one plain document */
    path = test_write_temp(jl, strlen(jl), ".txt");
    assert_int_equal(corpus_read_file(&c, path, &err), 0);
    unlink(path);
    assert_int_equal(c.n_docs, 2);
    assert_false(c.docs[1].is_prompt);
    assert_string_equal(c.docs[1].text, jl);
    /* an empty file has no documents */
    path = test_write_temp("", 0, ".jsonl");
    assert_int_equal(corpus_read_file(&c, path, &err), 0);
    unlink(path);
    assert_int_equal(c.n_docs, 2);
    /* errors carry the path */
    const char *bad = "{\"text\": 1}\n";
    path = test_write_temp(bad, strlen(bad), ".jsonl");
    assert_int_equal(corpus_read_file(&c, path, &err), -1);
    unlink(path);
    char want[600];
    snprintf(want, sizeof want, "%s:1: \"text\" is not a string", path);
    assert_string_equal(err.msg, want);
    assert_int_equal(corpus_read_file(&c, "/nonexistent/corpus.jsonl", &err), -1);
    assert_non_null(strstr(err.msg, "cannot open '/nonexistent/corpus.jsonl'"));
    assert_int_equal(corpus_read_file(&c, "/", &err), -1);
    assert_string_equal(err.msg, "'/' is not a regular file");
    assert_int_equal(c.n_docs, 2);
    corpus_free(&c);
}

/* The committed evaluation prompts load, 40 per kind. */
static void test_eval_prompts_file(void **state) {
    (void)state;
    corpus c = {0};
    specd_error err = {{0}};
    assert_int_equal(corpus_read_file(&c, test_path("bench/eval-prompts.jsonl"), &err), 0);
    int chat = 0, code = 0, math = 0;
    for (size_t i = 0; i < c.n_docs; i++) {
        assert_true(c.docs[i].is_prompt);
        assert_true(c.docs[i].len > 0);
        chat += strcmp(c.docs[i].kind, "chat") == 0;
        code += strcmp(c.docs[i].kind, "code") == 0;
        math += strcmp(c.docs[i].kind, "math") == 0;
    }
    assert_int_equal(c.n_docs, 120);
    assert_int_equal(chat, 40);
    assert_int_equal(code, 40);
    assert_int_equal(math, 40);
    corpus_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_docs_and_prompts),
        cmocka_unit_test(test_plain_text_form_feeds),
        cmocka_unit_test(test_jsonl_errors_name_file_and_line),
        cmocka_unit_test(test_jsonl_bytes),
        cmocka_unit_test(test_plain_text_errors),
        cmocka_unit_test(test_failed_read_keeps_earlier_docs),
        cmocka_unit_test(test_line_limit),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_eval_prompts_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
