/* test_safetensors.c - the safetensors reader: a valid image round-trips
 * (dtypes, shapes, offsets, data pointers, __metadata__ string entries),
 * and bad headers (truncation, huge lengths, broken JSON, wrong dtypes, bad
 * shapes or offsets, duplicates) fail with a message naming the tensor and
 * the problem. The writer (safetensors_write.h): what it writes reads back
 * value for value, aligned, with its metadata, and bad arguments leave no
 * file behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/safetensors.h"
#include "common/model/safetensors_write.h"
#include "tests/harness/test_util.h"

typedef struct image {
    uint8_t *p;
    size_t n;
} image;

/* u64 header length, the JSON padded with spaces to a multiple of 8 (as the
 * reference writer does), then data_len bytes where byte j holds j & 0xff. */
static image make_image(const char *json, size_t data_len) {
    size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;
    image im = {malloc(8 + hlen + data_len), 8 + hlen + data_len};
    assert_non_null(im.p);
    for (int i = 0; i < 8; i++) im.p[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(im.p + 8, json, jlen);
    memset(im.p + 8 + jlen, ' ', hlen - jlen);
    for (size_t j = 0; j < data_len; j++) im.p[8 + hlen + j] = (uint8_t)j;
    return im;
}

static void expect_fail_len(const image *im, size_t len, const char *want) {
    uint8_t *copy = malloc(len ? len : 1);
    if (len) memcpy(copy, im->p, len);
    specd_error err = {{0}};
    safetensors_file *f = safetensors_open_memory(copy, len, &err);
    if (f || !strstr(err.msg, want))
        fail_msg("len %zu: expected failure with '%s', got %s '%s'", len, want,
                 f ? "success" : "failure", err.msg);
    safetensors_close(f);
    free(copy);
}

/* Builds an image from a one-tensor header and expects `want` in the error. */
static void expect_header_fail(const char *json, size_t data_len, const char *want) {
    image im = make_image(json, data_len);
    expect_fail_len(&im, im.n, want);
    free(im.p);
}

#define GOOD_JSON                                                                                  \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                                      \
    "\"w\":{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[0,24]},"                          \
    "\"v\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[24,44]},"                           \
    "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[44,46]},"                           \
    "\"i\":{\"dtype\":\"I64\",\"shape\":[2,1],\"data_offsets\":[46,62]},"                         \
    "\"z\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[62,62]}}"
#define GOOD_DATA 62

static void check_good(const safetensors_file *f, const uint8_t *data) {
    assert_int_equal(safetensors_n_tensors(f), 5);
    const safetensors_tensor *w = safetensors_tensor_at(f, 0);
    assert_string_equal(w->name, "w"); /* header order, __metadata__ skipped */
    assert_int_equal(w->type, SPECD_F16);
    assert_int_equal(w->n_dims, 2);
    assert_int_equal(w->shape[0], 3);
    assert_int_equal(w->shape[1], 4);
    assert_int_equal(w->numel, 12);
    assert_int_equal(w->nbytes, 24);
    assert_ptr_equal(w->data, data);
    const safetensors_tensor *v = safetensors_find(f, "v");
    assert_non_null(v);
    assert_int_equal(v->type, SPECD_F32);
    assert_int_equal(v->offset, 24);
    assert_int_equal(((const uint8_t *)v->data)[0], 24);
    const safetensors_tensor *s = safetensors_find(f, "s");
    assert_int_equal(s->type, SPECD_BF16);
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->numel, 1);
    assert_int_equal(safetensors_find(f, "i")->type, SPECD_I64);
    assert_int_equal(safetensors_find(f, "z")->numel, 0);
    assert_null(safetensors_find(f, "__metadata__"));
    assert_null(safetensors_find(f, "q"));
    assert_null(safetensors_tensor_at(f, 5));
}

static void test_round_trip(void **state) {
    (void)state;
    image im = make_image(GOOD_JSON, GOOD_DATA);
    specd_error err = {{0}};
    safetensors_file *f = safetensors_open_memory(im.p, im.n, &err);
    if (!f) fail_msg("%s", err.msg);
    check_good(f, im.p + im.n - GOOD_DATA);
    safetensors_close(f);

    const char *path = test_write_temp(im.p, im.n, ".safetensors");
    f = safetensors_open(path, &err);
    if (!f) fail_msg("%s", err.msg);
    assert_int_equal(safetensors_n_tensors(f), 5);
    safetensors_close(f);
    remove(path);
    assert_null(safetensors_open("/nonexistent.safetensors", &err));
    assert_non_null(strstr(err.msg, "cannot open"));
    free(im.p);
}

static void test_truncation_everywhere(void **state) {
    (void)state;
    image im = make_image(GOOD_JSON, GOOD_DATA);
    for (size_t len = 0; len < im.n; len++) expect_fail_len(&im, len, "safetensors: ");
    expect_fail_len(&im, 7, "no header length");
    expect_fail_len(&im, 100, "truncated: header of");
    expect_fail_len(&im, im.n - 1, "tensor 'i': data_offsets [46, 62] lie outside the data "
                                   "section (61 bytes)");
    free(im.p);
}

static void test_bad_lengths(void **state) {
    (void)state;
    image im = make_image(GOOD_JSON, GOOD_DATA);
    uint64_t huge = 1ULL << 40;
    for (int i = 0; i < 8; i++) im.p[i] = (uint8_t)(huge >> (8 * i));
    expect_fail_len(&im, im.n, "header length 1099511627776 exceeds the 104857600-byte limit");
    memset(im.p, 0, 8);
    expect_fail_len(&im, im.n, "not valid JSON");
    free(im.p);
}

static void test_bad_json(void **state) {
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":", 0, "not valid JSON");
    expect_header_fail("[1,2]", 0, "not a JSON object");
    expect_header_fail("{} x", 0, "trailing bytes");
    expect_header_fail("{\"w\":[1]}", 0, "tensor 'w': entry is not a JSON object");
    expect_header_fail("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                       "tensor 'w': \"dtype\" is missing");
    expect_header_fail("{\"w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                       "\"dtype\" is missing or not a string");
}

static void test_bad_dtype(void **state) {
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                       "tensor 'w' has dtype 'U8'");
    expect_header_fail("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                       "has dtype 'F8_E4M3'; specd reads F32, F16 and BF16");
}

static void test_bad_shape(void **state) {
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16,
                       "tensor 'w': \"shape\" is missing or not an array");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16,
                       "shape[0] is not a non-negative integer");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,12]}}",
                       12, "shape[1] is not");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,\"2\"],\"data_offsets\":[0,16]}}",
                       16, "shape[1] is not");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                       "\"data_offsets\":[0,4]}}", 4, "9 dimensions (at most 8)");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                       "\"data_offsets\":[0,4]}}", 4, "element count overflows");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4,
                       "shape[0] is not");
}

static void test_bad_offsets(void **state) {
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16,
                       "tensor 'w': \"data_offsets\" must be two non-negative integers");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}", 16,
                       "\"data_offsets\" must be two");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16,32]}}",
                       32, "\"data_offsets\" must be two");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", 16,
                       "data_offsets [16, 0] lie outside");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,17]}}", 16,
                       "data_offsets [0, 17] lie outside the data section (16 bytes)");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16,
                       "tensor 'w': data_offsets span 12 bytes, shape and dtype imply 16");
    expect_header_fail("{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[4,16]}}", 15,
                       "lie outside");
}

static void test_duplicates(void **state) {
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                       8, "duplicate tensor name 'w'");
}

static void test_random_corruption(void **state) {
    (void)state;
    image im = make_image(GOOD_JSON, GOOD_DATA);
    uint64_t s = 99;
    for (int iter = 0; iter < 3000; iter++) {
        uint8_t *copy = malloc(im.n);
        memcpy(copy, im.p, im.n);
        for (int k = 0; k < 1 + iter % 3; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t pos = (size_t)(s >> 33) % (im.n - GOOD_DATA);
            copy[pos] = (uint8_t)(s >> 13);
        }
        specd_error err = {{0}};
        safetensors_file *f = safetensors_open_memory(copy, im.n, &err);
        if (f) {
            for (size_t i = 0; i < safetensors_n_tensors(f); i++) {
                const safetensors_tensor *t = safetensors_tensor_at(f, i);
                const uint8_t *d = t->data;
                assert_true(d >= copy && d + t->nbytes <= copy + im.n);
            }
        } else {
            assert_true(strncmp(err.msg, "safetensors: ", 13) == 0);
        }
        safetensors_close(f);
        free(copy);
    }
    free(im.p);
}

static void test_metadata(void **state) {
    (void)state;
    /* strings are kept (first of a repeated key wins), other types skipped */
    image im = make_image("{\"__metadata__\": {\"format\": \"pt\", \"n\": 3, \"format\": \"x\", "
                          "\"e\": \"\\u00e9\\\"\"}, \"w\": {\"dtype\": \"I8\", \"shape\": [2], "
                          "\"data_offsets\": [0, 2]}}", 2);
    specd_error err = {{0}};
    safetensors_file *f = safetensors_open_memory(im.p, im.n, &err);
    if (!f) fail_msg("%s", err.msg);
    assert_string_equal(safetensors_metadata(f, "format"), "pt");
    assert_string_equal(safetensors_metadata(f, "e"), "\xc3\xa9\"");
    assert_null(safetensors_metadata(f, "n"));
    assert_null(safetensors_metadata(f, "w"));
    safetensors_close(f);
    free(im.p);
}

static void test_writer_round_trip(void **state) {
    (void)state;
    const float f[6] = {1.0f, -2.5f, 3.14159265f, 65504.0f, 1e-8f, -0.0f};
    const int32_t ids[3] = {7, -1, 2147483647};
    const uint16_t raw[2] = {0x3c00, 0xc000}; /* fp16 1.0 and -2.0, already encoded */
    safetensors_out t[5] = {
        {.name = "a.f32", .type = SPECD_F32, .n_dims = 2, .shape = {2, 3}, .data = f},
        {.name = "a.f16", .type = SPECD_F16, .n_dims = 1, .shape = {6}, .data = f},
        {.name = "a.bf16", .type = SPECD_BF16, .n_dims = 2, .shape = {3, 2}, .data = f},
        {.name = "ids", .type = SPECD_I32, .n_dims = 1, .shape = {3}, .data = ids},
        {.name = "raw", .type = SPECD_F16, .n_dims = 1, .shape = {2}, .data = raw, .raw = 1},
    };
    const char *keys[2] = {"format", "blob"}, *vals[2] = {"pt", "{\"q\": \"\\\"\"}"};
    char path[128];
    snprintf(path, sizeof path, "/tmp/specd_test_st_%d.safetensors", (int)getpid());
    specd_error err = {{0}};
    if (safetensors_write(path, t, 5, keys, vals, 2, &err)) fail_msg("%s", err.msg);
    size_t len;
    uint8_t *buf = (uint8_t *)test_read_file(path, &len);
    assert_non_null(buf);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    assert_int_equal(hlen % 8, 0); /* the data section starts 8-byte aligned */
    safetensors_file *sf = safetensors_open_memory(buf, len, &err);
    if (!sf) fail_msg("%s", err.msg);
    assert_int_equal(safetensors_n_tensors(sf), 5);
    assert_string_equal(safetensors_metadata(sf, "blob"), vals[1]);
    const safetensors_tensor *a = safetensors_find(sf, "a.f32"), *h = safetensors_find(sf, "a.f16"),
                             *b = safetensors_find(sf, "a.bf16"), *i = safetensors_find(sf, "ids"),
                             *r = safetensors_find(sf, "raw");
    assert_true(a && h && b && i && r);
    assert_true(a->type == SPECD_F32 && a->n_dims == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    assert_memory_equal(a->data, f, sizeof f);
    assert_memory_equal(i->data, ids, sizeof ids);
    assert_memory_equal(r->data, raw, sizeof raw);
    for (int k = 0; k < 6; k++) {
        uint16_t hv, bv;
        memcpy(&hv, (const uint8_t *)h->data + 2 * k, 2);
        memcpy(&bv, (const uint8_t *)b->data + 2 * k, 2);
        assert_int_equal(hv, specd_f32_to_fp16(f[k]));
        assert_int_equal(bv, specd_f32_to_bf16(f[k]));
    }
    safetensors_close(sf);
    free(buf);

    /* bad arguments: an error naming the problem, the old file untouched */
    safetensors_out dup[2] = {t[0], t[0]};
    assert_int_equal(safetensors_write(path, dup, 2, NULL, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "duplicate tensor name 'a.f32'"));
    safetensors_out q = t[0];
    q.type = SPECD_Q8_0;
    assert_int_equal(safetensors_write(path, &q, 1, NULL, NULL, 0, &err), -1);
    sf = safetensors_open(path, &err);
    assert_non_null(sf);
    assert_int_equal(safetensors_n_tensors(sf), 5);
    safetensors_close(sf);
    unlink(path);
    /* an unwritable place: an error, nothing created */
    assert_int_equal(safetensors_write("/nonexistent-dir/x.safetensors", t, 1, NULL, NULL, 0, &err),
                     -1);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/x.safetensors"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncation_everywhere),
        cmocka_unit_test(test_bad_lengths),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_dtype),
        cmocka_unit_test(test_bad_shape),
        cmocka_unit_test(test_bad_offsets),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_writer_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
