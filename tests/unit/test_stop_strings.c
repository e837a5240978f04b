/* test_stop_strings.c - stop strings end the text exactly before the match,
 * however the text is split into pushes, and nothing after is released. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/text/stop_strings.h"
#include "common/util/utf8.h"

/* Feeds `text` in pieces of `step` bytes; returns everything released. */
/* Push one character at a time and check each released piece for valid
 * UTF-8 (`step` is then ignored). */
static int valid_pieces;

static char *run(char **stops, size_t n, const char *text, size_t step, int *stopped) {
    specd_stopper st;
    specd_error err = {{0}};
    assert_int_equal(specd_stopper_init(&st, stops, n, "request.stop", &err), 0);
    static char out[1024];
    size_t o = 0, len = strlen(text);
    for (size_t i = 0, piece; i < len; i += piece) {
        size_t got;
        piece = len - i < step ? len - i : step;
        if (valid_pieces) /* one whole character per push, as the text stream pushes */
            specd_utf8_next((const uint8_t *)text + i, len - i, &piece);
        const char *r = specd_stopper_push(&st, text + i, piece, &got);
        assert_non_null(r);
        /* every piece released is whole characters (the texts here are
         * valid UTF-8 at every split point the tests use) */
        if (valid_pieces) assert_true(specd_utf8_valid((const uint8_t *)r, got));
        memcpy(out + o, r, got);
        o += got;
        /* released text never contains a stop string */
        for (size_t k = 0; k < n; k++) assert_null(memmem(out, o, stops[k], strlen(stops[k])));
    }
    size_t got;
    const char *r = specd_stopper_flush(&st, &got);
    memcpy(out + o, r, got);
    o += got;
    out[o] = 0;
    *stopped = st.stopped;
    specd_stopper_free(&st);
    return out;
}

static void test_stops_at_every_split(void **state) {
    (void)state;
    char *stops[] = {"\nUser:", "###", "abcabd"};
    int stopped;
    for (size_t step = 1; step <= 9; step++) {
        assert_string_equal(run(stops, 3, "Hello there.\nUser: hi", step, &stopped), "Hello there.");
        assert_true(stopped);
        assert_string_equal(run(stops, 3, "no stop here, # ## #", step, &stopped),
                            "no stop here, # ## #");
        assert_false(stopped);
        /* a near miss that overlaps the real match */
        assert_string_equal(run(stops, 3, "xxabcabcabdyy", step, &stopped), "xxabc");
        assert_true(stopped);
        /* the earliest of several matches wins */
        assert_string_equal(run(stops, 3, "a###b\nUser:", step, &stopped), "a");
        /* text ending on a partial stop string is released at flush */
        assert_string_equal(run(stops, 3, "tail ##", step, &stopped), "tail ##");
        assert_false(stopped);
    }
}

/* Stop strings that begin inside a character (the fuzzer's "\xbdhx"
 * against a U+FFFD, EF BF BD, in the text): the matcher holds back and cuts
 * whole characters only, so no released piece ends mid-character. Pushed a
 * whole character at a time, as the text stream does. */
static void test_whole_characters(void **state) {
    (void)state;
    char *stops[] = {"\xbdhx"};
    int stopped;
    valid_pieces = 1;
    /* a held prefix ("\xbd") of the stop inside U+FFFD: held as the whole
     * character, released at flush */
    assert_string_equal(run(stops, 1, "a\xef\xbf\xbd", 3, &stopped), "a\xef\xbf\xbd");
    assert_false(stopped);
    /* a match starting mid-character: the partial character is dropped */
    assert_string_equal(run(stops, 1, "ab\xef\xbf\xbdhx tail", 1, &stopped), "ab");
    assert_true(stopped);
    char *cjk[] = {"\xe4\xb8\x96\xe7"}; /* a valid character + a lead byte */
    assert_string_equal(run(cjk, 1, "x\xe4\xb8\x96y", 1, &stopped), "x\xe4\xb8\x96y");
    valid_pieces = 0;
}

static void test_bad_stop_strings(void **state) {
    (void)state;
    specd_stopper st;
    specd_error err = {{0}};
    char *empty[] = {"ok", ""};
    assert_int_equal(specd_stopper_init(&st, empty, 2, "request.stop", &err), -1);
    assert_non_null(strstr(err.msg, "request.stop[1]"));
    char *many[SPECD_MAX_STOP_STRINGS + 1];
    for (int i = 0; i <= SPECD_MAX_STOP_STRINGS; i++) many[i] = "x";
    assert_int_equal(specd_stopper_init(&st, many, SPECD_MAX_STOP_STRINGS + 1, "request.stop", &err),
                     -1);
    assert_non_null(strstr(err.msg, "at most"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stops_at_every_split),
        cmocka_unit_test(test_bad_stop_strings),
        cmocka_unit_test(test_whole_characters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
