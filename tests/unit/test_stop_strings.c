/* test_stop_strings.c - stop strings end the text exactly before the match,
 * however the text is split into pushes, and nothing after is released. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/stop_strings.h"

/* Feeds `text` in pieces of `step` bytes; returns everything released. */
static char *run(char **stops, size_t n, const char *text, size_t step, int *stopped) {
    specd_stopper st;
    specd_error err = {{0}};
    assert_int_equal(specd_stopper_init(&st, stops, n, "request.stop", &err), 0);
    static char out[1024];
    size_t o = 0, len = strlen(text);
    for (size_t i = 0; i < len; i += step) {
        size_t piece = len - i < step ? len - i : step, got;
        const char *r = specd_stopper_push(&st, text + i, piece, &got);
        assert_non_null(r);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
