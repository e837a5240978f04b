/* test_gguf.c - the GGUF reader: every metadata type round-trips, alignment
 * and tensor data land where the writer put them, and every kind of
 * corruption (truncation at each byte, huge counts, misaligned or
 * out-of-file tensors, unknown types, bad dims, duplicates) is rejected with
 * a message that names the problem. Images are built in memory by a tiny
 * writer below; the real default model is checked when present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model/gguf.h"
#include "tests/harness/test_util.h"

/* ---- a tiny GGUF writer ----------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_le(buf *b, uint64_t v, int bytes) {
    uint8_t tmp[8];
    for (int i = 0; i < bytes; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    put(b, tmp, (size_t)bytes);
}

static void put_u32(buf *b, uint32_t v) { put_le(b, v, 4); }
static void put_u64(buf *b, uint64_t v) { put_le(b, v, 8); }

static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void put_key(buf *b, const char *key, gguf_type t) {
    put_str(b, key);
    put_u32(b, t);
}

static void patch_u32(buf *b, size_t off, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[off + i] = (uint8_t)(v >> (8 * i));
}

static void patch_u64(buf *b, size_t off, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[off + i] = (uint8_t)(v >> (8 * i));
}

typedef struct img_opts {
    uint32_t version;   /* 0 = 3 */
    uint32_t alignment; /* 0 = no general.alignment key (default 32) */
    int dup_key;
    int dup_tensor;
    int nest_depth; /* > 0: add a key holding arrays nested this deep */
} img_opts;

#define N_TENSORS 3

/* Where the writer put the fields that tests corrupt. */
typedef struct img {
    buf b;
    size_t off_n_tensors, off_n_kv, off_u8_arr_len, off_str_arr_len, off_name_len;
    size_t off_f32_type, off_align_value;
    size_t off_ndims[N_TENSORS], off_ne[N_TENSORS], off_type[N_TENSORS], off_offset[N_TENSORS];
    size_t header_end, data_offset;
    uint64_t t_offset[N_TENSORS], t_nbytes[N_TENSORS];
} img;

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static void put_metadata(img *im, const img_opts *o) {
    buf *b = &im->b;
    put_key(b, "general.architecture", GGUF_STRING);
    put_str(b, "llama");
    put_key(b, "general.name", GGUF_STRING);
    im->off_name_len = b->n;
    put_str(b, "tiny test");
    put_key(b, "t.u8", GGUF_UINT8), put_le(b, 200, 1);
    put_key(b, "t.i8", GGUF_INT8), put_le(b, (uint8_t)-5, 1);
    put_key(b, "t.u16", GGUF_UINT16), put_le(b, 60000, 2);
    put_key(b, "t.i16", GGUF_INT16), put_le(b, (uint16_t)-30000, 2);
    put_key(b, "t.u32", GGUF_UINT32), put_u32(b, 4000000000u);
    put_key(b, "t.i32", GGUF_INT32), put_u32(b, (uint32_t)-2000000000);
    float f = 1.5f;
    uint32_t fbits;
    memcpy(&fbits, &f, 4);
    im->off_f32_type = b->n + 8 + strlen("t.f32");
    put_key(b, "t.f32", GGUF_FLOAT32), put_u32(b, fbits);
    put_key(b, "t.bool", GGUF_BOOL), put_le(b, 1, 1);
    put_key(b, "t.u64", GGUF_UINT64), put_u64(b, 1ULL << 40);
    put_key(b, "t.i64", GGUF_INT64), put_u64(b, (uint64_t)-(1LL << 40));
    double d = 2.25;
    uint64_t dbits;
    memcpy(&dbits, &d, 8);
    put_key(b, "t.f64", GGUF_FLOAT64), put_u64(b, dbits);
    put_key(b, "t.arr_u8", GGUF_ARRAY), put_u32(b, GGUF_UINT8);
    im->off_u8_arr_len = b->n;
    put_u64(b, 3), put(b, "\x01\x02\x03", 3);
    put_key(b, "t.arr_i32", GGUF_ARRAY), put_u32(b, GGUF_INT32), put_u64(b, 2);
    put_u32(b, (uint32_t)-1), put_u32(b, 7);
    put_key(b, "t.arr_str", GGUF_ARRAY), put_u32(b, GGUF_STRING);
    im->off_str_arr_len = b->n;
    put_u64(b, 3), put_str(b, "a"), put_str(b, "bc"), put_str(b, "");
    /* [[1, 2], [3]] as uint16 */
    put_key(b, "t.arr_arr", GGUF_ARRAY), put_u32(b, GGUF_ARRAY), put_u64(b, 2);
    put_u32(b, GGUF_UINT16), put_u64(b, 2), put_le(b, 1, 2), put_le(b, 2, 2);
    put_u32(b, GGUF_UINT16), put_u64(b, 1), put_le(b, 3, 2);
    put_key(b, "t.arr_empty", GGUF_ARRAY), put_u32(b, GGUF_STRING), put_u64(b, 0);
    if (o->alignment) {
        put_key(b, "general.alignment", GGUF_UINT32);
        im->off_align_value = b->n;
        put_u32(b, o->alignment);
    }
    if (o->dup_key) put_key(b, "t.u8", GGUF_UINT8), put_le(b, 1, 1);
    if (o->nest_depth > 0) {
        put_key(b, "t.deep", GGUF_ARRAY);
        for (int i = 0; i < o->nest_depth; i++) put_u32(b, GGUF_ARRAY), put_u64(b, 1);
        put_u32(b, GGUF_UINT8), put_u64(b, 0);
    }
}

static int count_kvs(const img_opts *o) {
    return 18 + (o->alignment != 0) + (o->dup_key != 0) + (o->nest_depth > 0);
}

static const struct {
    const char *name;
    specd_dtype type;
    uint32_t n_dims;
    uint64_t ne[4];
} k_tensors[N_TENSORS] = {
    {"a", SPECD_F32, 2, {4, 2, 1, 1}},
    {"b", SPECD_Q8_0, 2, {32, 3, 1, 1}},
    {"c", SPECD_F16, 4, {2, 2, 2, 2}},
};

static void put_tensor_infos(img *im, const img_opts *o, uint64_t align) {
    buf *b = &im->b;
    uint64_t off = 0;
    for (int i = 0; i < N_TENSORS; i++) {
        int ok;
        uint64_t n = k_tensors[i].ne[0] * k_tensors[i].ne[1] * k_tensors[i].ne[2] *
                     k_tensors[i].ne[3];
        im->t_nbytes[i] = specd_dtype_nbytes(k_tensors[i].type, n, &ok);
        im->t_offset[i] = off;
        put_str(b, (o->dup_tensor && i == 2) ? "a" : k_tensors[i].name);
        im->off_ndims[i] = b->n;
        put_u32(b, k_tensors[i].n_dims);
        im->off_ne[i] = b->n;
        for (uint32_t d = 0; d < k_tensors[i].n_dims; d++) put_u64(b, k_tensors[i].ne[d]);
        im->off_type[i] = b->n;
        put_u32(b, k_tensors[i].type);
        im->off_offset[i] = b->n;
        put_u64(b, off);
        off = align_up(off + im->t_nbytes[i], align);
    }
}

/* Builds the test image; tensor t's byte j holds (t * 50 + j) & 0xff. */
static img build(const img_opts *o) {
    img im = {0};
    buf *b = &im.b;
    uint64_t align = o->alignment ? o->alignment : 32;
    put(b, "GGUF", 4);
    put_u32(b, o->version ? o->version : 3);
    im.off_n_tensors = b->n;
    put_u64(b, N_TENSORS);
    im.off_n_kv = b->n;
    put_u64(b, (uint64_t)count_kvs(o));
    put_metadata(&im, o);
    put_tensor_infos(&im, o, align);
    im.header_end = b->n;
    im.data_offset = align_up(b->n, align);
    while (b->n < im.data_offset) put_le(b, 0, 1);
    for (int i = 0; i < N_TENSORS; i++) {
        while (b->n < im.data_offset + im.t_offset[i]) put_le(b, 0, 1);
        for (uint64_t j = 0; j < im.t_nbytes[i]; j++) put_le(b, (uint64_t)(i * 50 + j) & 0xff, 1);
    }
    return im;
}

/* Parses a copy of exactly `len` bytes, so ASan sees any read past the end. */
static gguf_file *open_copy(const uint8_t *p, size_t len, uint8_t **copy, specd_error *err) {
    *copy = malloc(len ? len : 1);
    if (len) memcpy(*copy, p, len);
    return gguf_open_memory(*copy, len, err);
}

static void expect_fail_len(const buf *b, size_t len, const char *want) {
    specd_error err = {{0}};
    uint8_t *copy;
    gguf_file *f = open_copy(b->p, len, &copy, &err);
    if (f || !strstr(err.msg, want))
        fail_msg("len %zu: expected failure with '%s', got %s '%s'", len, want,
                 f ? "success" : "failure", err.msg);
    gguf_close(f);
    free(copy);
}

static void expect_fail(const buf *b, const char *want) { expect_fail_len(b, b->n, want); }

/* ---- round trip ---------------------------------------------------------------- */

static void check_scalars(const gguf_file *f) {
    const gguf_kv *kv;
    assert_non_null(kv = gguf_find_kv(f, "t.u8"));
    assert_int_equal(kv->type, GGUF_UINT8);
    assert_int_equal(kv->v.u64, 200);
    assert_int_equal(gguf_find_kv(f, "t.i8")->v.i64, -5);
    assert_int_equal(gguf_find_kv(f, "t.u16")->v.u64, 60000);
    assert_int_equal(gguf_find_kv(f, "t.i16")->v.i64, -30000);
    assert_int_equal(gguf_find_kv(f, "t.u32")->v.u64, 4000000000u);
    assert_int_equal(gguf_find_kv(f, "t.i32")->v.i64, -2000000000);
    assert_true(gguf_find_kv(f, "t.f32")->v.f64 == 1.5);
    assert_int_equal(gguf_find_kv(f, "t.bool")->v.u64, 1);
    assert_int_equal(gguf_find_kv(f, "t.u64")->v.u64, 1ULL << 40);
    assert_true(gguf_find_kv(f, "t.i64")->v.i64 == -(1LL << 40));
    assert_true(gguf_find_kv(f, "t.f64")->v.f64 == 2.25);
    assert_null(gguf_find_kv(f, "t.missing"));
}

static void check_getters(const gguf_file *f) {
    specd_error err = {{0}};
    uint32_t u;
    float x;
    int bl;
    assert_int_equal(gguf_get_u32(f, "t.u8", &u, &err), 0);
    assert_int_equal(u, 200);
    assert_int_equal(gguf_get_u32(f, "t.u32", &u, &err), 0);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_u32(f, "t.i32", &u, &err), -1);
    assert_non_null(strstr(err.msg, "'t.i32'"));
    assert_int_equal(gguf_get_u32(f, "t.u64", &u, &err), -1);
    assert_non_null(strstr(err.msg, "does not fit"));
    assert_int_equal(gguf_get_u32(f, "general.name", &u, &err), -1);
    assert_non_null(strstr(err.msg, "key 'general.name' has type string, expected an integer"));
    assert_int_equal(gguf_get_u32(f, "t.nope", &u, &err), -1);
    assert_string_equal(err.msg, "gguf: key 't.nope' not found");
    assert_int_equal(gguf_get_f32(f, "t.f32", &x, &err), 0);
    assert_true(x == 1.5f);
    assert_int_equal(gguf_get_f32(f, "t.f64", &x, &err), 0);
    assert_true(x == 2.25f);
    assert_int_equal(gguf_get_f32(f, "t.i16", &x, &err), 0);
    assert_true(x == -30000.0f);
    assert_int_equal(gguf_get_f32(f, "t.arr_u8", &x, &err), -1);
    assert_non_null(strstr(err.msg, "has type array"));
    assert_int_equal(gguf_get_bool(f, "t.bool", &bl, &err), 0);
    assert_int_equal(bl, 1);
    assert_int_equal(gguf_get_bool(f, "t.u8", &bl, &err), -1);
    char *s = gguf_get_str(f, "general.name", &err);
    assert_string_equal(s, "tiny test");
    free(s);
    assert_null(gguf_get_str(f, "t.bool", &err));
    assert_non_null(strstr(err.msg, "expected string"));
}

static void check_arrays(const gguf_file *f) {
    const gguf_kv *kv = gguf_find_kv(f, "t.arr_u8");
    assert_int_equal(kv->type, GGUF_ARRAY);
    assert_int_equal(kv->arr_type, GGUF_UINT8);
    assert_int_equal(kv->arr_len, 3);
    assert_memory_equal(kv->arr_data, "\x01\x02\x03", 3);
    kv = gguf_find_kv(f, "t.arr_i32");
    int32_t ints[2];
    memcpy(ints, kv->arr_data, sizeof ints);
    assert_int_equal(ints[0], -1);
    assert_int_equal(ints[1], 7);
    kv = gguf_find_kv(f, "t.arr_str");
    assert_int_equal(kv->arr_type, GGUF_STRING);
    assert_int_equal(kv->arr_len, 3);
    const gguf_str *s = gguf_get_arr_str(kv, 1);
    assert_int_equal(s->len, 2);
    assert_memory_equal(s->ptr, "bc", 2);
    assert_int_equal(kv->arr_strs[2].len, 0);
    assert_null(gguf_get_arr_str(kv, 3));
    assert_null(gguf_get_arr_str(gguf_find_kv(f, "t.arr_u8"), 0));
    /* nested arrays stay encoded: type, len, elements */
    kv = gguf_find_kv(f, "t.arr_arr");
    assert_int_equal(kv->arr_type, GGUF_ARRAY);
    assert_int_equal(kv->arr_len, 2);
    assert_memory_equal(kv->arr_data, "\x02\x00\x00\x00\x02\0\0\0\0\0\0\0\x01\x00\x02\x00", 16);
    kv = gguf_find_kv(f, "t.arr_empty");
    assert_int_equal(kv->arr_len, 0);
}

static void check_tensors(const gguf_file *f, const img *im) {
    assert_int_equal(gguf_n_tensors(f), N_TENSORS);
    assert_int_equal(gguf_data_offset(f), im->data_offset);
    assert_int_equal(gguf_data_offset(f) % gguf_alignment(f), 0);
    for (int i = 0; i < N_TENSORS; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, k_tensors[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, gguf_tensor_at(f, (uint64_t)i));
        assert_int_equal(t->type, k_tensors[i].type);
        assert_int_equal(t->n_dims, k_tensors[i].n_dims);
        assert_memory_equal(t->ne, k_tensors[i].ne, sizeof t->ne);
        assert_int_equal(t->offset, im->t_offset[i]);
        assert_int_equal(t->nbytes, im->t_nbytes[i]);
        assert_int_equal(t->offset % gguf_alignment(f), 0);
        const uint8_t *data = t->data;
        for (uint64_t j = 0; j < t->nbytes; j++) assert_int_equal(data[j], (i * 50 + j) & 0xff);
    }
    assert_null(gguf_find_tensor(f, "d"));
    assert_null(gguf_tensor_at(f, N_TENSORS));
}

static void test_round_trip(void **state) {
    (void)state;
    img_opts o = {.alignment = 64};
    img im = build(&o);
    specd_error err = {{0}};
    gguf_file *f = gguf_open_memory(im.b.p, im.b.n, &err);
    if (!f) fail_msg("%s", err.msg);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), 64);
    assert_int_equal(gguf_n_kv(f), count_kvs(&o));
    assert_string_equal(gguf_type_name(GGUF_FLOAT32), "float32");
    assert_string_equal(gguf_type_name((gguf_type)77), "unknown");
    check_scalars(f);
    check_getters(f);
    check_arrays(f);
    check_tensors(f, &im);
    /* keys in file order */
    const gguf_kv *kv0 = gguf_kv_at(f, 0);
    assert_int_equal(kv0->key.len, strlen("general.architecture"));
    assert_null(gguf_kv_at(f, gguf_n_kv(f)));
    gguf_close(f);
    free(im.b.p);
}

static void test_default_alignment_and_v2(void **state) {
    (void)state;
    img_opts o = {.version = 2};
    img im = build(&o);
    specd_error err = {{0}};
    gguf_file *f = gguf_open_memory(im.b.p, im.b.n, &err);
    if (!f) fail_msg("%s", err.msg);
    assert_int_equal(gguf_version(f), 2);
    assert_int_equal(gguf_alignment(f), 32);
    check_tensors(f, &im);
    gguf_close(f);
    free(im.b.p);
}

static void test_open_file(void **state) {
    (void)state;
    img_opts o = {.alignment = 64};
    img im = build(&o);
    const char *path = test_write_temp(im.b.p, im.b.n, ".gguf");
    specd_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    if (!f) fail_msg("%s", err.msg);
    check_tensors(f, &im);
    gguf_close(f);
    /* a corrupt file: the message names the path */
    patch_u32(&im.b, im.off_type[1], 99);
    path = test_write_temp(im.b.p, im.b.n, ".gguf");
    assert_null(gguf_open(path, &err));
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "unknown type 99"));
    remove(path);
    assert_null(gguf_open("/nonexistent/x.gguf", &err));
    assert_non_null(strstr(err.msg, "cannot open"));
    path = test_write_temp("", 0, ".gguf");
    assert_null(gguf_open(path, &err));
    assert_non_null(strstr(err.msg, "non-empty"));
    remove(path);
    free(im.b.p);
}

/* ---- corruption ---------------------------------------------------------------- */

static void test_truncation_everywhere(void **state) {
    (void)state;
    img_opts o = {.alignment = 64};
    img im = build(&o);
    for (size_t len = 0; len < im.b.n; len++) {
        if (len < im.header_end)
            expect_fail_len(&im.b, len, "truncated");
        else
            expect_fail_len(&im.b, len, "gguf:");
    }
    /* the exact message form: a string value that runs past the end */
    patch_u64(&im.b, im.off_name_len, 100000);
    specd_error err = {{0}};
    assert_null(gguf_open_memory(im.b.p, im.b.n, &err));
    char want[96];
    snprintf(want, sizeof want, "gguf: truncated at offset %zu reading key #1 'general.name'",
             im.off_name_len + 8);
    assert_string_equal(err.msg, want);
    free(im.b.p);
}

static void test_bad_header(void **state) {
    (void)state;
    img_opts o = {0};
    img im = build(&o);
    im.b.p[0] = 'X';
    expect_fail(&im.b, "bad magic");
    im.b.p[0] = 'G';
    patch_u32(&im.b, 4, 1);
    expect_fail(&im.b, "version 1");
    patch_u32(&im.b, 4, 0x03000000);
    expect_fail(&im.b, "byte-swapped");
    patch_u32(&im.b, 4, 4);
    expect_fail(&im.b, "unsupported version 4");
    patch_u32(&im.b, 4, 3);
    patch_u64(&im.b, im.off_n_tensors, 1ULL << 40);
    expect_fail(&im.b, "tensor count 1099511627776 exceeds");
    patch_u64(&im.b, im.off_n_tensors, GGUF_MAX_TENSORS);
    expect_fail(&im.b, "truncated");
    patch_u64(&im.b, im.off_n_tensors, N_TENSORS + 1);
    expect_fail(&im.b, "gguf:");
    patch_u64(&im.b, im.off_n_tensors, N_TENSORS);
    patch_u64(&im.b, im.off_n_kv, UINT64_MAX);
    expect_fail(&im.b, "key/value count");
    patch_u64(&im.b, im.off_n_kv, 1000);
    expect_fail(&im.b, "truncated");
    free(im.b.p);
}

static void test_bad_metadata(void **state) {
    (void)state;
    img_opts o = {.alignment = 64};
    img im = build(&o);
    patch_u64(&im.b, im.off_u8_arr_len, 1ULL << 30);
    expect_fail(&im.b, "array of 1073741824 elements");
    patch_u64(&im.b, im.off_u8_arr_len, GGUF_MAX_ARRAY);
    expect_fail(&im.b, "truncated");
    patch_u64(&im.b, im.off_u8_arr_len, 3);
    patch_u64(&im.b, im.off_str_arr_len, UINT64_MAX);
    expect_fail(&im.b, "exceeds the limit");
    patch_u64(&im.b, im.off_str_arr_len, 4);
    expect_fail(&im.b, "gguf:");
    patch_u64(&im.b, im.off_str_arr_len, 3);
    patch_u64(&im.b, im.off_name_len, 1ULL << 32);
    expect_fail(&im.b, "exceeds the 16777216-byte limit");
    patch_u64(&im.b, im.off_name_len, 9);
    patch_u32(&im.b, im.off_f32_type, 13);
    expect_fail(&im.b, "gguf: key 't.f32' has unknown value type 13");
    patch_u32(&im.b, im.off_f32_type, GGUF_FLOAT32);
    patch_u32(&im.b, im.off_align_value, 48);
    expect_fail(&im.b, "general.alignment = 48 is not a power of two");
    patch_u32(&im.b, im.off_align_value, 0);
    expect_fail(&im.b, "general.alignment = 0");
    free(im.b.p);

    o = (img_opts){.dup_key = 1};
    im = build(&o);
    expect_fail(&im.b, "duplicate key 't.u8'");
    free(im.b.p);
}

static void test_nesting_limit(void **state) {
    (void)state;
    img_opts o = {.nest_depth = 8};
    img im = build(&o);
    specd_error err = {{0}};
    gguf_file *f = gguf_open_memory(im.b.p, im.b.n, &err);
    if (!f) fail_msg("%s", err.msg);
    gguf_close(f);
    free(im.b.p);
    o.nest_depth = 9;
    im = build(&o);
    expect_fail(&im.b, "nested deeper than 8");
    free(im.b.p);
}

static void test_bad_tensors(void **state) {
    (void)state;
    img_opts o = {.alignment = 64};
    img im = build(&o);
    patch_u32(&im.b, im.off_type[1], 99);
    expect_fail(&im.b, "gguf: tensor 'b': unknown type 99");
    patch_u32(&im.b, im.off_type[1], 4); /* a retired GGML type number */
    expect_fail(&im.b, "unknown type 4");
    patch_u32(&im.b, im.off_type[1], SPECD_Q8_0);
    patch_u64(&im.b, im.off_offset[1], im.t_offset[1] + 1);
    expect_fail(&im.b, "tensor 'b': offset 65 is not a multiple of the alignment 64");
    patch_u64(&im.b, im.off_offset[1], 64 * 1000);
    expect_fail(&im.b, "tensor 'b': data at offset 64000");
    patch_u64(&im.b, im.off_offset[1], UINT64_MAX - 63);
    expect_fail(&im.b, "outside the data section");
    patch_u64(&im.b, im.off_offset[1], im.t_offset[1]);
    patch_u64(&im.b, im.off_ne[1], 33);
    expect_fail(&im.b, "row length 33 is not a multiple of the Q8_0 block size 32");
    patch_u64(&im.b, im.off_ne[1], 0);
    expect_fail(&im.b, "tensor 'b': dimension 0 is 0");
    patch_u64(&im.b, im.off_ne[1], 32);
    patch_u64(&im.b, im.off_ne[1] + 8, 1ULL << 40);
    expect_fail(&im.b, "outside the data section");
    patch_u64(&im.b, im.off_ne[1] + 8, 3);
    patch_u32(&im.b, im.off_ndims[0], 0);
    expect_fail(&im.b, "tensor 'a': n_dims 0 is not in 1..4");
    patch_u32(&im.b, im.off_ndims[0], 5);
    expect_fail(&im.b, "n_dims 5");
    patch_u32(&im.b, im.off_ndims[0], 2);
    for (int d = 0; d < 4; d++) patch_u64(&im.b, im.off_ne[2] + 8 * (size_t)d, 1ULL << 20);
    expect_fail(&im.b, "tensor 'c': element count overflows");
    free(im.b.p);

    o.dup_tensor = 1;
    im = build(&o);
    expect_fail(&im.b, "duplicate tensor name 'a'");
    free(im.b.p);
}

/* Random byte flips: whatever the parser says, it must not crash or leak. */
static void test_random_corruption(void **state) {
    (void)state;
    img_opts o = {.alignment = 64};
    img im = build(&o);
    uint64_t s = 12345;
    int ok = 0;
    for (int iter = 0; iter < 3000; iter++) {
        uint8_t *copy = malloc(im.b.n);
        memcpy(copy, im.b.p, im.b.n);
        for (int k = 0; k < 1 + iter % 4; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t pos = (size_t)(s >> 33) % im.header_end;
            copy[pos] ^= (uint8_t)(1u << ((s >> 20) & 7));
        }
        specd_error err = {{0}};
        gguf_file *f = gguf_open_memory(copy, im.b.n, &err);
        if (f) {
            ok++;
            for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
                const gguf_tensor *t = gguf_tensor_at(f, i);
                const uint8_t *d = t->data;
                assert_true(d >= copy && d + t->nbytes <= copy + im.b.n);
            }
        } else {
            assert_true(strncmp(err.msg, "gguf: ", 6) == 0);
        }
        gguf_close(f);
        free(copy);
    }
    assert_true(ok > 0); /* some flips hit bytes that do not matter */
    free(im.b.p);
}

/* ---- the real default model ------------------------------------------------- */

static void test_real_model(void **state) {
    (void)state;
    const char *path = test_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!test_file_exists(path)) skip();
    specd_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    if (!f) fail_msg("%s", err.msg);
    assert_int_equal(gguf_version(f), 3);
    char *arch = gguf_get_str(f, "general.architecture", &err);
    assert_string_equal(arch, "llama");
    free(arch);
    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(tokens);
    assert_int_equal(tokens->arr_len, 49152);
    const gguf_str *tok = gguf_get_arr_str(tokens, 1);
    assert_non_null(tok);
    assert_int_equal(gguf_n_tensors(f), 272);
    assert_int_equal(gguf_find_tensor(f, "token_embd.weight")->type, SPECD_Q8_0);
    assert_int_equal(gguf_find_tensor(f, "blk.0.attn_q.weight")->type, SPECD_Q4_1);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_default_alignment_and_v2),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_truncation_everywhere),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
