/* test_driver_price.c - a session's skip rule (draft-svc/driver_price.c
 * driver_skip_drafting): after drafting is declined, plain steps for 1, 2,
 * 4 ... DRIVER_MAX_SKIP steps while the declines are about the text, and
 * the longest skip at once when the load declined (not even a sure node
 * pays for its row: every look before it could only be a round trip). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "draft-svc/driver_internal.h"

static void test_skip_doubles_for_the_text(void **state) {
    (void)state;
    specd_policy pol = {.max_candidates = 4, .max_depth = 4};
    price_state ps;
    assert_int_equal(driver_price_init(&ps, 16, &pol), 0);
    int want = 1;
    for (int i = 0; i < 9; i++) {
        driver_skip_drafting(&ps, 0);
        assert_int_equal(ps.skip, want);
        assert_true(ps.look);
        ps.look = 0;
        want = want * 2 < DRIVER_MAX_SKIP ? want * 2 : DRIVER_MAX_SKIP;
    }
    driver_price_free(&ps);
}

static void test_skip_for_the_load_is_the_longest(void **state) {
    (void)state;
    specd_policy pol = {.max_candidates = 4, .max_depth = 4};
    price_state ps;
    assert_int_equal(driver_price_init(&ps, 16, &pol), 0);
    driver_skip_drafting(&ps, 1); /* the first decline, under load */
    assert_int_equal(ps.skip, DRIVER_MAX_SKIP);
    assert_true(ps.look);
    /* a text decline after it stays at the longest */
    driver_skip_drafting(&ps, 0);
    assert_int_equal(ps.skip, DRIVER_MAX_SKIP);
    /* once drafting pays again (the backoff back to 1), a text decline
     * starts over from one step */
    ps.backoff = 1;
    driver_skip_drafting(&ps, 0);
    assert_int_equal(ps.skip, 1);
    driver_price_free(&ps);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_doubles_for_the_text),
        cmocka_unit_test(test_skip_for_the_load_is_the_longest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
