/* test_cpu_count.c - the CPUs a compute pool sizes itself to: cgroup v2
 * cpu.max lines as the kernel writes them (Kubernetes sets "QUOTA PERIOD"
 * from a container's CPU limit, "max PERIOD" without one), malformed ones,
 * and the count for this process against its affinity mask. */

#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util/cpu_count.h"

static int parse(const char *s) { return specd_cpu_quota_parse(s, strlen(s)); }

static void test_quota_lines(void **state) {
    (void)state;
    assert_int_equal(parse("max 100000\n"), 0);   /* no limit */
    assert_int_equal(parse("200000 100000\n"), 2); /* limits.cpu: 2 */
    assert_int_equal(parse("400000 100000"), 4);
    assert_int_equal(parse("150000 100000\n"), 2); /* 1.5 CPUs: rounded up */
    assert_int_equal(parse("50000 100000\n"), 1);  /* 500m */
    assert_int_equal(parse("1 1000000\n"), 1);
    /* no more than 2^20 CPUs, however large the quota */
    assert_int_equal(parse("999999999999999999 1\n"), 1 << 20);
}

static void test_bad_lines(void **state) {
    (void)state;
    const char *bad[] = {"", "\n", "max", "max\n", "100000", "max 0\n", "0 100000\n",
                         "-100 100000\n", "100 -1\n", "100  100\n", "100 100\n\n",
                         "100 100 100\n", "maxx 100\n", " 100 100\n", "100 100x\n",
                         "99999999999999999999 1\n", "1 99999999999999999999\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (parse(bad[i]) != -1) fail_msg("'%s' parsed as %d", bad[i], parse(bad[i]));
    }
    assert_int_equal(specd_cpu_quota_parse(NULL, 5), -1);
    /* longer than any cpu.max line */
    char longline[100];
    memset(longline, '1', sizeof longline);
    assert_int_equal(specd_cpu_quota_parse(longline, sizeof longline), -1);
}

/* At least one, and never more than the affinity mask allows. */
static void test_this_process(void **state) {
    (void)state;
    int n = specd_cpu_count();
    assert_true(n >= 1);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) assert_true(n <= CPU_COUNT(&set));
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0) assert_true(n <= online);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quota_lines),
        cmocka_unit_test(test_bad_lines),
        cmocka_unit_test(test_this_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
