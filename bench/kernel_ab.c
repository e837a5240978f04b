/* kernel_ab.c - two builds of one matmul kernel file, timed in turn inside
 * one process: the way to tell a kernel change of a few percent on a shared
 * machine, whose speed drifts between runs by more than that.
 *
 * Built and run by bench/kernel_ab.sh, which compiles the kernel file twice
 * (a git revision's as ks_A, the working tree's as ks_B) and links both
 * here; read that script first.
 *
 * For each token count: one Q4_1 (1536 x 576, the FFN gate), Q8_0
 * (4096 x 576, a slice of the LM head), or Q6_K, Q3_K or Q2_K (576 x 1536,
 * the FFN down) matrix, repacked into a huge-page arena as the CPU backend
 * keeps it, multiplied on one thread
 *   hot:  the same copy again and again (in L2: the kernel's arithmetic);
 *   cold: the next of copies spanning 96 MB (from DRAM, as in a forward
 *         pass);
 * A and B alternate call batch by call batch, 41 times; the medians are
 * printed with B / A. The two outputs are compared bit for bit: a kernel
 * change that is meant to be a pure speed-up must not move a bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_args.h"
#include "common/util/clock.h"
#include "common/util/dtype.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/quant_impl.h"
#include "kernels/cpu/weight_arena.h"

int ks_A(cpu_kernel_set *ks, int vnni);
int ks_B(cpu_kernel_set *ks, int vnni);

#define REPS 41
#define HOT_CALLS 20

int main(int argc, char **argv) {
    /* the matrices: name, type, its tile kind, shape, and where each block
     * keeps its fp16 scale fields (-1: none) */
    static const struct {
        const char *name;
        specd_dtype type;
        cpu_qkind kind;
        int64_t rows, cols;
        int f16_at[2];
    } mats[] = {
        {"q4", SPECD_Q4_1, CPU_Q4, 1536, 576, {0, 2}},
        {"q8", SPECD_Q8_0, CPU_Q8, 4096, 576, {0, -1}},
        {"q6k", SPECD_Q6_K, CPU_Q6K, 576, 1536, {208, -1}},
        {"q3k", SPECD_Q3_K, CPU_Q3K, 576, 1536, {108, -1}},
        {"q2k", SPECD_Q2_K, CPU_Q2K, 576, 1536, {80, 82}},
    };
    int m = -1;
    for (int i = 0; argc == 3 && i < (int)(sizeof mats / sizeof mats[0]); i++)
        if (!strcmp(argv[1], mats[i].name)) m = i;
    if (m < 0) {
        fprintf(stderr, "usage: kernel_ab q4|q8|q6k|q3k|q2k VNNI(0|1)\n");
        return 2;
    }
    const int vnni = atoi(argv[2]);
    const int64_t rows = mats[m].rows, cols = mats[m].cols;
    const specd_dtype type = mats[m].type;
    const specd_dtype_info *ti = specd_dtype_get(type);
    const size_t nblk = (size_t)(rows * cols) / ti->block_elems, bytes = nblk * ti->block_bytes;
    uint8_t *raw = malloc(bytes);
    if (!raw) return 1;
    srand(1);
    for (size_t i = 0; i < bytes; i++) raw[i] = (uint8_t)rand();
    /* finite scales (fp16 0x2000 = 2^-7): random bits would make NaNs and
     * infinities, whose bits say nothing about the kernels */
    for (size_t b = 0; b < nblk; b++) {
        const uint16_t h = 0x2000;
        for (int f = 0; f < 2; f++)
            if (mats[m].f16_at[f] >= 0)
                memcpy(raw + b * ti->block_bytes + mats[m].f16_at[f], &h, 2);
    }
    specd_tensor t = {.type = type, .n_dims = 2, .ne = {(uint64_t)cols, (uint64_t)rows, 1, 1},
                      .data = raw, .nbytes = bytes};
    const int n_copies = (int)((96u << 20) / bytes) + 1;
    cpu_arena *arena = cpu_arena_create();
    cpu_qweight *w = calloc((size_t)n_copies, sizeof *w);
    if (!arena || !w) return 1;
    for (int i = 0; i < n_copies; i++)
        if (cpu_qweight_make(&t, &w[i], arena) != 1) return 1;

    cpu_kernel_set A, B;
    memset(&A, 0, sizeof A), memset(&B, 0, sizeof B);
    if (!ks_A(&A, vnni) || !ks_B(&B, vnni)) {
        fprintf(stderr, "kernel_ab: this CPU lacks the path\n");
        return 1;
    }
    const cpu_qkind kind = mats[m].kind;
    const int max_tok = 64;
    float *x = malloc(sizeof(float) * (size_t)(max_tok * cols));
    float *y[2] = {malloc(sizeof(float) * (size_t)(max_tok * rows)),
                   malloc(sizeof(float) * (size_t)(max_tok * rows))};
    int8_t *q = malloc((size_t)(max_tok * cols));
    const size_t nb_all = (size_t)(max_tok * cols / 32);
    float *d = malloc(sizeof(float) * nb_all), *s = malloc(sizeof(float) * nb_all);
    int32_t *sq = malloc(sizeof(int32_t) * nb_all), *sh = malloc(sizeof(int32_t) * nb_all);
    if (!x || !y[0] || !y[1] || !q || !d || !s || !sq || !sh) return 1;
    for (int64_t i = 0; i < max_tok * cols; i++) x[i] = (float)(rand() % 1000) / 500.0f - 1.0f;
    cpu_quantize_act(x, max_tok, cols, q, d, s, sq);
    cpu_act_half_sums(q, max_tok, cols, sh);

    printf("%s %lldx%lld, %s kernels, 1 thread, %d copies (cold); median us of %d turns\n",
           ti->name, (long long)rows, (long long)cols, vnni ? "VNNI" : "non-VNNI", n_copies, REPS);
    printf("| n_tok | hot A | hot B | B/A | cold A | cold B | B/A | bits |\n");
    printf("|--:|--:|--:|--:|--:|--:|--:|---|\n");
    const int toks[] = {1, 2, 4, 5, 8, 9, 12, 16, 32, 64};
    int differ = 0;
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        const int nt = toks[k];
        double med[2][2];
        for (int cold = 0; cold < 2; cold++) {
            double ts[2][REPS];
            const int calls = cold ? n_copies : HOT_CALLS;
            for (int r = 0; r < REPS; r++)
                for (int v = 0; v < 2; v++) {
                    const cpu_kernel_set *ks = v ? &B : &A;
                    const double t0 = specd_now_s();
                    for (int i = 0; i < calls; i++) {
                        const cpu_qweight *W = &w[cold ? i : 0];
                        cpu_qmm_args a = {.w = W,
                                          .a = {.n_tok = nt, .cols = cols, .nb = cols / 32,
                                                .q = q, .d = d, .s = s, .sq = sq, .sh = sh},
                                          .y = y[v],
                                          .ldy = rows};
                        ks->qrows[kind](&a, 0, W->n_groups);
                    }
                    ts[v][r] = (specd_now_s() - t0) / calls * 1e6;
                }
            for (int v = 0; v < 2; v++) {
                qsort(ts[v], REPS, sizeof(double), bench_cmp_double);
                med[cold][v] = ts[v][REPS / 2];
            }
        }
        const int same = !memcmp(y[0], y[1], sizeof(float) * (size_t)(nt * rows));
        differ |= !same;
        printf("| %d | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f | %s |\n", nt, med[0][0], med[0][1],
               med[0][1] / med[0][0], med[1][0], med[1][1], med[1][1] / med[1][0],
               same ? "same" : "DIFFER");
    }
    return differ;
}
