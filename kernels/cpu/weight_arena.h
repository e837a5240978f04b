/* weight_arena.h - where the CPU backend keeps the weights it repacks: one
 * growing region backed by 2 MiB transparent huge pages, in the order the
 * weights are prepared (the forward pass's order).
 *
 * Why: a decode step streams every weight once (96 MB for the default
 * model), far more than any TLB covers with 4 KiB pages, so each step took
 * a page walk every 4 KiB of weights, and every matrix (most of them under
 * 1 MB, each a malloc of its own) began at a page of its own. On the
 * 2-vCPU AMD EPYC Zen 5 VM, two transformers in one process, one with its
 * weights here and one without, stepped in turn (300 steps each, three
 * runs): a decode step at 64 cached tokens took 0.966-0.991x the time, a
 * 5-row step 0.965-0.980x, a decode step at 2,000 cached tokens
 * 0.965-0.981x; the mlp drafter, whose backend keeps its weights here
 * too, drafted a 1x1 tree after a 96 MB read in 137-179 us against
 * 163-186 (bench_draft, docs/BENCHMARKS.md, thirty-second session). The
 * KV cache stays on ordinary pages: on huge pages it commits memory 2 MiB
 * per layer at a time and gained no more than the noise there.
 *
 * How: chunks of at least CPU_ARENA_CHUNK bytes, each an anonymous mmap
 * aligned to 2 MiB with madvise(MADV_HUGEPAGE), so the kernel backs it
 * with huge pages when transparent huge pages are "madvise" or "always"
 * (the Debian default is madvise; with "never", or where madvise fails,
 * the same memory comes in 4 KiB pages and nothing else changes). Memory
 * is committed only where written: a chunk's unused tail costs address
 * space, not RAM. Allocations are bump-allocated, 64-byte aligned and
 * zeroed, and live until the arena is destroyed (a backend's weights are
 * released together, with the backend). Not thread-safe: weights are
 * prepared by one thread. */
#ifndef SPECD_CPU_WEIGHT_ARENA_H
#define SPECD_CPU_WEIGHT_ARENA_H

#include <stddef.h>

/* The smallest chunk: a model's layers come in a few chunks, and a chunk
 * never wastes more than its untouched tail. */
#define CPU_ARENA_CHUNK ((size_t)32 << 20)

typedef struct cpu_arena cpu_arena;

cpu_arena *cpu_arena_create(void);
/* Frees every chunk (and with them every allocation). NULL is a no-op. */
void cpu_arena_destroy(cpu_arena *a);
/* bytes of zeroed memory, 64-byte aligned; NULL when out of memory. */
void *cpu_arena_alloc(cpu_arena *a, size_t bytes);
/* Bytes handed out so far. (Whether the kernel granted huge pages shows in
 * /proc/PID/smaps_rollup, AnonHugePages.) */
size_t cpu_arena_used(const cpu_arena *a);

#endif
