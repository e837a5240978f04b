/* test_policy.c - load-aware tree shapes and the acceptance-collapse rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "draft-svc/policy.h"

static void parse(specd_policy *p, const char *const *e, int n) {
    specd_error err = {{0}};
    memset(p, 0, sizeof *p);
    int rc = specd_policy_parse_table(p, (char *const *)e, n, "speculation.load_table", &err);
    if (rc) fail_msg("%s", err.msg);
}

static void test_table_lookup(void **state) {
    (void)state;
    static const char *const t[] = {"1:4x5", "4:2x4", "16:1x3"};
    specd_policy p;
    parse(&p, t, 3);
    p.off_above = 32;
    int c, d;
    assert_int_equal(specd_policy_shape(&p, 1, &c, &d), 1);
    assert_int_equal(c, 4);
    assert_int_equal(d, 5);
    assert_int_equal(specd_policy_shape(&p, 2, &c, &d), 1);
    assert_int_equal(c, 2);
    assert_int_equal(d, 4);
    assert_int_equal(specd_policy_shape(&p, 16, &c, &d), 1);
    assert_int_equal(c, 1);
    /* above the last rule but not above off_above: the last rule */
    assert_int_equal(specd_policy_shape(&p, 20, &c, &d), 1);
    assert_int_equal(d, 3);
    /* above off_above: speculation off, so serving is never slower than plain */
    assert_int_equal(specd_policy_shape(&p, 33, &c, &d), 0);
    p.off_above = 0; /* never off */
    assert_int_equal(specd_policy_shape(&p, 1000, &c, &d), 1);
    /* an empty table means no speculation by default */
    specd_policy empty;
    memset(&empty, 0, sizeof empty);
    assert_int_equal(specd_policy_shape(&empty, 1, &c, &d), 0);
}

static void test_table_errors(void **state) {
    (void)state;
    specd_policy p;
    specd_error err = {{0}};
    static const char *const bad_syntax[] = {"1:4x5", "4:2y4"};
    assert_int_equal(specd_policy_parse_table(&p, (char *const *)bad_syntax, 2, "t", &err), -1);
    assert_string_equal(err.msg, "t[1] = '4:2y4': expected SESSIONS:CANDIDATESxDEPTH, e.g. 4:2x4");
    static const char *const trailing[] = {"1:4x5x"};
    assert_int_equal(specd_policy_parse_table(&p, (char *const *)trailing, 1, "t", &err), -1);
    static const char *const order[] = {"4:2x4", "4:1x3"};
    assert_int_equal(specd_policy_parse_table(&p, (char *const *)order, 2, "t", &err), -1);
    assert_non_null(strstr(err.msg, "must increase"));
    static const char *const range[] = {"1:0x4"};
    assert_int_equal(specd_policy_parse_table(&p, (char *const *)range, 1, "t", &err), -1);
    static const char *const deep[] = {"1:1x65"};
    assert_int_equal(specd_policy_parse_table(&p, (char *const *)deep, 1, "t", &err), -1);
    const char *many[SPECD_POLICY_MAX_RULES + 1];
    for (int i = 0; i <= SPECD_POLICY_MAX_RULES; i++) many[i] = "1:1x1";
    assert_int_equal(
        specd_policy_parse_table(&p, (char *const *)many, SPECD_POLICY_MAX_RULES + 1, "t", &err),
        -1);
}

/* A session whose drafts keep failing stops drafting for cooldown steps,
 * then tries again from a clean slate; a good session never stops. */
static void test_collapse_and_recovery(void **state) {
    (void)state;
    specd_policy p;
    memset(&p, 0, sizeof p);
    p.min_acceptance = 0.2;
    p.ewma_alpha = 0.5;
    p.warmup_steps = 3;
    p.cooldown_steps = 4;
    specd_accept_state s;
    specd_accept_state_init(&s);
    for (int i = 0; i < 50; i++) {
        assert_int_equal(specd_accept_allows(&p, &s), 1);
        specd_accept_update(&p, &s, 4, 3);
    }
    assert_int_equal(s.collapses, 0);
    specd_accept_state_init(&s);
    int steps = 0;
    while (specd_accept_allows(&p, &s)) {
        specd_accept_update(&p, &s, 4, 0);
        steps++;
        assert_true(steps < 10);
    }
    /* 1.0 -> 0.5 -> 0.25 -> 0.125 < 0.2, and not before warmup (3 steps) */
    assert_int_equal(steps, 3);
    assert_int_equal(s.collapses, 1);
    int plain = 1; /* the allows() call that ended the loop was a plain step */
    while (!specd_accept_allows(&p, &s)) plain++;
    assert_int_equal(plain, 4);
    assert_true(s.ewma == 1.0); /* reset */
    /* min_acceptance 0 disables the rule */
    p.min_acceptance = 0;
    specd_accept_state_init(&s);
    for (int i = 0; i < 20; i++) specd_accept_update(&p, &s, 4, 0);
    assert_int_equal(specd_accept_allows(&p, &s), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_lookup),
        cmocka_unit_test(test_table_errors),
        cmocka_unit_test(test_collapse_and_recovery),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
