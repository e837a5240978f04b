/* test_sha256.c - SHA-256 known answers (FIPS 180-4 examples, NIST CAVP
 * style): empty input, "abc", the two-block 448-bit message, one million 'a'
 * fed in odd-sized pieces (exercises the streaming buffer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/util/sha256.h"

static void test_known_answers(void **state) {
    (void)state;
    char hex[65];
    specd_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    specd_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    specd_sha256_hex(m, strlen(m), hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_streaming_million_a(void **state) {
    (void)state;
    uint8_t chunk[997];
    memset(chunk, 'a', sizeof chunk);
    specd_sha256 c;
    specd_sha256_init(&c);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof chunk ? left : sizeof chunk;
        specd_sha256_update(&c, chunk, n);
        left -= n;
    }
    uint8_t d[32];
    char hex[65];
    specd_sha256_final(&c, d);
    specd_sha256_to_hex(d, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers),
        cmocka_unit_test(test_streaming_million_a),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
