/* test_util.c - see test_util.h. */
#include "tests/harness/test_util.h"

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

const char *test_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("SPECD_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

/* Every temp file written, removed when the test process exits (a test
 * that fails midway leaves nothing behind either, unless it crashes). Only
 * by the process that wrote them: a forked child that exits must not take
 * its parent's files. */
#define MAX_TEMPS 64
static char temps[MAX_TEMPS][64];
static int n_temps;
static pid_t temps_owner;

static void remove_temps(void) {
    if (getpid() != temps_owner) return;
    for (int i = 0; i < n_temps; i++) unlink(temps[i]);
}

const char *test_write_temp(const void *buf, size_t len, const char *suffix) {
    static char path[256];
    static int counter;
    snprintf(path, sizeof path, "/tmp/specd_test_%d_%d%s", (int)getpid(), counter++,
             suffix ? suffix : "");
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fwrite(buf, 1, len, f);
    fclose(f);
    if (!temps_owner) {
        temps_owner = getpid();
        atexit(remove_temps);
    }
    if (n_temps < MAX_TEMPS && strlen(path) < sizeof temps[0])
        snprintf(temps[n_temps++], sizeof temps[0], "%s", path);
    return path;
}

int test_file_exists(const char *path) { return access(path, R_OK) == 0; }

void test_fill_random(float *x, size_t n, uint64_t seed, float scale) {
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 33;
        s *= 0xff51afd7ed558ccdULL;
        s ^= s >> 33;
        x[i] = ((float)(s >> 40) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
    }
}

int test_write_random_speculator(const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\": [\"MLPSpeculatorPreTrainedModel\"], \"model_type\": "
               "\"mlp_speculator\", \"vocab_size\": 512, \"emb_dim\": 64, \"inner_dim\": %d, "
               "\"n_predict\": %d, \"top_k_tokens_per_head\": [3, 2, 2], \"n_candidates\": 4, "
               "\"tie_weights\": false, \"scale_input\": true, \"torch_dtype\": \"float32\"}\n",
            TEST_SPEC_INNER, TEST_SPEC_STAGES);
    fclose(f);
    /* name, rows, cols (cols 0 = a vector) */
    struct { char name[48]; int rows, cols; } t[5 * TEST_SPEC_STAGES];
    int n = 0;
    for (int i = 0; i < TEST_SPEC_STAGES; i++) {
        snprintf(t[n].name, sizeof t[n].name, "speculator.emb.%d.weight", i);
        t[n].rows = 512, t[n++].cols = TEST_SPEC_INNER;
        snprintf(t[n].name, sizeof t[n].name, "speculator.proj.%d.weight", i);
        t[n].rows = TEST_SPEC_INNER, t[n++].cols = i ? TEST_SPEC_INNER : 64;
        snprintf(t[n].name, sizeof t[n].name, "speculator.head.%d.weight", i);
        t[n].rows = 512, t[n++].cols = TEST_SPEC_INNER;
        snprintf(t[n].name, sizeof t[n].name, "speculator.ln.%d.weight", i);
        t[n].rows = TEST_SPEC_INNER, t[n++].cols = 0;
        snprintf(t[n].name, sizeof t[n].name, "speculator.ln.%d.bias", i);
        t[n].rows = TEST_SPEC_INNER, t[n++].cols = 0;
    }
    char header[8192];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "{");
    for (int i = 0; i < n; i++) {
        size_t bytes = sizeof(float) * (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
        char shape[32];
        if (t[i].cols) snprintf(shape, sizeof shape, "[%d, %d]", t[i].rows, t[i].cols);
        else snprintf(shape, sizeof shape, "[%d]", t[i].rows);
        hl += (size_t)snprintf(header + hl, sizeof header - hl,
                               "%s\"%s\": {\"dtype\": \"F32\", \"shape\": %s, "
                               "\"data_offsets\": [%zu, %zu]}",
                               i ? ", " : "", t[i].name, shape, off, off + bytes);
        off += bytes;
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    if (hl >= sizeof header) return -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t hlen = hl;
    uint8_t le[8];
    for (int k = 0; k < 8; k++) le[k] = (uint8_t)(hlen >> (8 * k));
    fwrite(le, 1, 8, f);
    fwrite(header, 1, hl, f);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
        float *w = malloc(sizeof(float) * cnt);
        /* LayerNorm weights around 1, everything else small */
        test_fill_random(w, cnt, 1000 + (uint64_t)i, t[i].cols ? 0.3f : 0.2f);
        if (!t[i].cols && strstr(t[i].name, "weight"))
            for (size_t k = 0; k < cnt; k++) w[k] += 1.0f;
        fwrite(w, sizeof(float), cnt, f); /* little-endian hosts only, as specd */
        free(w);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- random valid weight blocks (test_util.h) ---------------------------- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_unit(uint64_t *s) { /* [-1, 1) */
    return (float)(rng_next(s) >> 40) / (float)(1u << 23) - 1.0f;
}

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* A positive fp16 scale spread over two decades, like real scales. */
static uint16_t rand_scale(uint64_t *s) {
    float v = 0.002f + 0.05f * (rng_unit(s) + 1.0f);
    return specd_f32_to_fp16(v);
}

uint8_t *test_random_weights(specd_dtype type, int64_t rows, int64_t cols, uint64_t seed,
                             size_t *row_bytes) {
    const specd_dtype_info *in = specd_dtype_get(type);
    *row_bytes = (size_t)(cols / in->block_elems) * in->block_bytes;
    size_t total = *row_bytes * (size_t)rows;
    uint8_t *w = malloc(total + 1);
    if (!w) abort();
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    switch (type) {
    case SPECD_F32:
        for (size_t i = 0; i < total / 4; i++) {
            float v = rng_unit(&s);
            memcpy(w + 4 * i, &v, 4);
        }
        break;
    case SPECD_F16:
        for (size_t i = 0; i < total / 2; i++) put_u16(w + 2 * i, specd_f32_to_fp16(rng_unit(&s)));
        break;
    case SPECD_BF16:
        for (size_t i = 0; i < total / 2; i++) put_u16(w + 2 * i, specd_f32_to_bf16(rng_unit(&s)));
        break;
    default: {
        /* Fill every byte at random (every bit pattern of quants and packed
         * 6-bit scales is valid), then overwrite the fp16 fields with sane
         * scales (random bits could be NaN or Inf). */
        for (size_t i = 0; i < total; i++) w[i] = (uint8_t)rng_next(&s);
        size_t nblk = total / in->block_bytes;
        for (size_t b = 0; b < nblk; b++) {
            uint8_t *p = w + b * in->block_bytes;
            switch (type) {
            case SPECD_Q8_0:
            case SPECD_Q4_0:
            case SPECD_Q5_0: put_u16(p, rand_scale(&s)); break;
            case SPECD_Q5_1:
                put_u16(p, rand_scale(&s));
                put_u16(p + 2, specd_f32_to_fp16(-0.4f * (rng_unit(&s) + 1.0f)));
                break;
            case SPECD_Q4_1:
                put_u16(p, rand_scale(&s));
                put_u16(p + 2, specd_f32_to_fp16(-0.4f * (rng_unit(&s) + 1.0f)));
                break;
            case SPECD_Q4_K:
            case SPECD_Q5_K:
                put_u16(p, specd_f32_to_fp16(0.1f * rng_unit(&s) + 0.11f));
                put_u16(p + 2, specd_f32_to_fp16(0.1f * rng_unit(&s) + 0.11f));
                break;
            case SPECD_Q6_K: put_u16(p + 208, rand_scale(&s)); break;
            case SPECD_Q2_K:
                put_u16(p + 80, specd_f32_to_fp16(0.1f * rng_unit(&s) + 0.11f));
                put_u16(p + 82, specd_f32_to_fp16(0.1f * rng_unit(&s) + 0.11f));
                break;
            case SPECD_Q3_K: put_u16(p + 108, rand_scale(&s)); break;
            case SPECD_IQ4_NL:
            case SPECD_IQ4_XS: put_u16(p, rand_scale(&s)); break;
            default: abort(); /* no generator for this type */
            }
        }
    }
    }
    return w;
}

int test_http_raw(int port, const char *request, char *buf, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t want = strlen(request);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) || write(fd, request, want) != (ssize_t)want) {
        close(fd);
        return -1;
    }
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)k;
    buf[n] = 0;
    close(fd);
    return (int)n;
}
