/* fuzz_safetensors.c - libFuzzer target for the safetensors reader: parses
 * the input and, when it is accepted, checks that every tensor lies inside
 * the input, that lookups by name find it, and that metadata lookups are
 * safe. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/safetensors.h"

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    specd_error err;
    safetensors_file *f = safetensors_open_memory(data, size, &err);
    if (!f) return 0;
    for (size_t i = 0; i < safetensors_n_tensors(f); i++) {
        const safetensors_tensor *t = safetensors_tensor_at(f, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size) abort();
        if (t->nbytes) g_sink ^= p[0] ^ p[t->nbytes - 1];
        if (!safetensors_find(f, t->name)) abort();
    }
    /* metadata lookups return a NUL-terminated string or NULL */
    const char *keys[2] = {"format", "specd.data"};
    for (int i = 0; i < 2; i++) {
        const char *v = safetensors_metadata(f, keys[i]);
        if (v) g_sink ^= (uint8_t)strlen(v);
    }
    safetensors_close(f);
    return 0;
}
