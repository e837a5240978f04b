/* attn_ab.c - two builds of one attention kernel file (kernels/cpu/vec_*.c),
 * timed in turn inside one process: kernel_ab.c's method for the KV side.
 *
 * Built and run by bench/kernel_ab.sh when its FILE is a vec_*.c (read that
 * script first): it compiles the file twice, a git revision's as vs_A and
 * the working tree's as vs_B, each filling a copy of the active kernel set.
 *
 * What is timed is one step's attention on one thread, SmolLM2's shape:
 * for each of 30 layers and each of its 3 KV heads, the 3 query heads of the
 * group, for each of the step's T tokens (1: a decode step; 5 or 9: a
 * verified chain), scored against every cached row of an fp16 pool
 * (kv_dots_block_f16), softmax (softmax_exp), and the weighted sum of the V
 * rows (kv_axpys_block_f16): what cpu_backend.c's attn_task does with the
 * cached rows of a decode token or a tree (a tree's own few rows, masked
 * per query, are left out). Each layer has its own K and V pools of P
 * rows (rows of the 3 heads side by side, pages of SPECD_KV_PAGE_ROWS in
 * order, as a fresh server hands them out), so a step reads P x 23 KB
 * from memory, as the model does. A and B alternate step by step, 41 times per P; the medians
 * are printed with B / A, and the outputs of the last step are compared bit
 * for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_args.h"
#include "common/util/clock.h"
#include "common/util/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant_impl.h"

void vs_A(cpu_kernel_set *ks);
void vs_B(cpu_kernel_set *ks);

#define REPS 41
enum { LAYERS = 30, KV = 3, GROUP = 3, HD = 64 };
static int NQ = GROUP; /* queries per KV head: GROUP x the step's tokens */

/* One step's attention over every layer; out[layer][kvh][NQ][HD]. */
static void step(const cpu_kernel_set *ks, uint16_t *const *kp, uint16_t *const *vp,
                 const int32_t *pages, int P, const float *q, float *out, float *scores) {
    const size_t stride = (size_t)KV * HD;
    const float scale = 1.0f / sqrtf((float)HD);
    for (int l = 0; l < LAYERS; l++)
        for (int h = 0; h < KV; h++) {
            const float *qs[CPU_ATTN_MAXQ];
            float *os[CPU_ATTN_MAXQ], *ss[CPU_ATTN_MAXQ], maxs[CPU_ATTN_MAXQ], invs[CPU_ATTN_MAXQ];
            for (int k = 0; k < NQ; k++) {
                qs[k] = q + ((size_t)l * KV * NQ + (size_t)h * NQ + k) * HD;
                os[k] = out + ((size_t)l * KV * NQ + (size_t)h * NQ + k) * HD;
                ss[k] = scores + (size_t)k * (size_t)(P + 16);
                maxs[k] = -INFINITY;
            }
            ks->kv_dots_block_f16(qs, NQ, kp[l], pages, P, stride, (size_t)h * HD, HD, scale,
                                  ss, maxs);
            for (int k = 0; k < NQ; k++) {
                invs[k] = (float)(1.0 / ks->softmax_exp(ss[k], P, maxs[k]));
                memset(os[k], 0, sizeof(float) * HD);
            }
            ks->kv_axpys_block_f16(os, (const float *const *)ss, invs, NQ, vp[l], pages, P,
                                   stride, (size_t)h * HD, HD);
        }
}

int main(int argc, char **argv) {
    int ps[8] = {1000, 3000}, n_p = 2, tok = 1;
    if (argc > 1 && (n_p = bench_int_list(argv[1], ps, 8, 16, 1 << 16)) < 1) n_p = -1;
    if (argc > 2) tok = atoi(argv[2]);
    if (n_p < 1 || tok < 1 || GROUP * tok > CPU_ATTN_MAXQ) {
        fprintf(stderr, "usage: attn_ab [P,P,...] [T]  (cached rows, default 1000,3000; tokens "
                        "per step, default 1, at most %d)\n", CPU_ATTN_MAXQ / GROUP);
        return 2;
    }
    NQ = GROUP * tok;
    const cpu_kernel_set *active = cpu_active_kernels();
    cpu_kernel_set A = *active, B = *active;
    vs_A(&A), vs_B(&B);
    if (!A.kv_dots_block_f16 || !B.kv_dots_block_f16 || !A.kv_axpys_block_f16 ||
        !B.kv_axpys_block_f16) {
        fprintf(stderr, "attn_ab: this CPU lacks the path\n");
        return 1;
    }
    int max_p = 0;
    for (int i = 0; i < n_p; i++) max_p = ps[i] > max_p ? ps[i] : max_p;
    const int n_pages = (max_p + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS;
    const size_t pool_elems = (size_t)n_pages * SPECD_KV_PAGE_ROWS * KV * HD;
    uint16_t *kp[LAYERS], *vp[LAYERS];
    uint64_t seed = 1;
    for (int l = 0; l < LAYERS; l++) {
        kp[l] = aligned_alloc(64, pool_elems * sizeof(uint16_t));
        vp[l] = aligned_alloc(64, pool_elems * sizeof(uint16_t));
        if (!kp[l] || !vp[l]) return 1;
        for (size_t i = 0; i < pool_elems; i++) {
            kp[l][i] = specd_f32_to_fp16(bench_urand(&seed));
            vp[l][i] = specd_f32_to_fp16(bench_urand(&seed));
        }
    }
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)n_pages);
    const size_t n_q = (size_t)LAYERS * KV * NQ * HD;
    float *q = malloc(sizeof(float) * n_q), *out[2] = {malloc(sizeof(float) * n_q),
                                                      malloc(sizeof(float) * n_q)};
    float *scores = malloc(sizeof(float) * (size_t)NQ * (size_t)(max_p + 16));
    if (!pages || !q || !out[0] || !out[1] || !scores) return 1;
    for (int i = 0; i < n_pages; i++) pages[i] = i;
    for (size_t i = 0; i < n_q; i++) q[i] = 4.0f * bench_urand(&seed);

    printf("one step's attention (%d token%s), SmolLM2 shape (30 layers, 3 KV heads x 3 queries, "
           "head 64), fp16 cache, 1 thread; median ms of %d turns\n", tok, tok > 1 ? "s" : "",
           REPS);
    printf("| cached rows | A ms | B ms | B/A | KV GB/s A | KV GB/s B | bits |\n");
    printf("|--:|--:|--:|--:|--:|--:|---|\n");
    int differ = 0;
    for (int i = 0; i < n_p; i++) {
        const int P = ps[i];
        double ts[2][REPS];
        for (int r = 0; r < REPS; r++)
            for (int v = 0; v < 2; v++) {
                const double t0 = specd_now_s();
                step(v ? &B : &A, kp, vp, pages, P, q, out[v], scores);
                ts[v][r] = (specd_now_s() - t0) * 1e3;
            }
        double med[2];
        for (int v = 0; v < 2; v++) {
            qsort(ts[v], REPS, sizeof(double), bench_cmp_double);
            med[v] = ts[v][REPS / 2];
        }
        const double gb = (double)P * LAYERS * 2 * KV * HD * sizeof(uint16_t) / 1e9;
        const int same = !memcmp(out[0], out[1], sizeof(float) * n_q);
        differ |= !same;
        printf("| %d | %.3f | %.3f | %.3f | %.1f | %.1f | %s |\n", P, med[0], med[1],
               med[1] / med[0], gb / (med[0] / 1e3), gb / (med[1] / 1e3),
               same ? "same" : "DIFFER");
    }
    return differ;
}
