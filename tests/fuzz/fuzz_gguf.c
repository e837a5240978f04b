/* fuzz_gguf.c - libFuzzer target for the GGUF reader: parses the input as a
 * GGUF image and, when it is accepted, touches every key, value, string of
 * every string array and the first and last byte of every tensor, so that
 * any pointer the parser hands out beyond the input shows up under ASan. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/gguf.h"

static volatile uint8_t g_sink;

static void touch(const void *p, uint64_t n) {
    if (!n) return;
    const uint8_t *b = p;
    g_sink ^= b[0] ^ b[n - 1];
}

static void walk_kv(const gguf_file *f, const gguf_kv *kv) {
    touch(kv->key.ptr, kv->key.len);
    if (kv->type == GGUF_STRING) touch(kv->v.str.ptr, kv->v.str.len);
    if (kv->type == GGUF_ARRAY) {
        for (uint64_t j = 0; j < kv->arr_len; j++) {
            const gguf_str *s = gguf_get_arr_str(kv, j);
            if (!s) break;
            touch(s->ptr, s->len);
        }
    }
    /* lookups by the key itself must find this very entry */
    char *key = malloc(kv->key.len + 1);
    memcpy(key, kv->key.ptr, kv->key.len);
    key[kv->key.len] = 0;
    if (strlen(key) == kv->key.len && gguf_find_kv(f, key) != kv) abort();
    uint32_t u;
    float x;
    int b;
    gguf_get_u32(f, key, &u, NULL);
    gguf_get_f32(f, key, &x, NULL);
    gguf_get_bool(f, key, &b, NULL);
    free(gguf_get_str(f, key, NULL));
    free(key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    specd_error err;
    gguf_file *f = gguf_open_memory(data, size, &err);
    if (!f) return 0;
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) walk_kv(f, gguf_kv_at(f, i));
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        touch(t->name.ptr, t->name.len);
        touch(t->data, t->nbytes);
        if ((const uint8_t *)t->data < data ||
            (const uint8_t *)t->data + t->nbytes > data + size)
            abort();
    }
    gguf_close(f);
    return 0;
}
