/* peak.h - the arithmetic this CPU can do at best, measured.
 *
 * The compute-side twin of the memory bandwidth `specd bench` measures for
 * decode: prefill, long-context attention and verification of many rows
 * are bound by arithmetic, and a figure such as "pp3000 runs at 48% of
 * pp128" means little without the rate the machine could do it at. Each
 * function runs 12 independent multiply-add chains per thread (enough to
 * hide the instructions' latency) on every thread of the pool, in the
 * instruction form the active kernel set (matmul.h, SPECD_SIMD) uses:
 *
 *   fp32: vfmadd231ps on zmm (avx512*), ymm (avx2, avxvnni), scalar C
 *         (what the attention and fp32 matmul kernels issue)
 *   int8: vpdpbusd (avx512vnni on zmm, avxvnni on ymm), else vpmaddubsw +
 *         vpmaddwd + vpaddd (avx512 on zmm, avx2 on ymm), scalar C
 *         (what the integer-activation matmuls issue, qmatmul.h)
 *
 * Multiply-adds per second (one MAC = one multiply and one add), the best
 * of three passes of a few ms each per thread. No loads or stores: a bound
 * that no kernel reaches, against which a kernel's fraction can be read.
 * (On the Cascade Lake VM of the README a zmm vpdpbusd retires about once
 * per two cycles, so the int8 peak there is only ~1.3-1.5x the fp32 one:
 * 83-106 against 63-72 G multiply-adds/s a core.) */
#ifndef SPECD_CPU_PEAK_H
#define SPECD_CPU_PEAK_H

#include "threadpool.h"

double cpu_peak_fp32_macs(specd_pool *pool);
double cpu_peak_int8_macs(specd_pool *pool);

#endif
