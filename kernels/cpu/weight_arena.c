/* weight_arena.c - repacked weights on transparent huge pages (read
 * weight_arena.h first). */
#include "weight_arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define ALIGN 64

typedef struct chunk {
    struct chunk *next;
    uint8_t *start; /* 2 MiB aligned */
    size_t cap, used;
} chunk;

struct cpu_arena {
    chunk *head; /* the chunk being filled first */
    size_t used;
};

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* A chunk of at least `bytes`, starting on a 2 MiB boundary: one extra huge
 * page is mapped and the unaligned ends are unmapped again, so no page of
 * the chunk straddles a huge-page boundary it could have filled. */
static chunk *chunk_new(size_t bytes) {
    size_t cap = round_up(bytes > CPU_ARENA_CHUNK ? bytes : CPU_ARENA_CHUNK, HUGE_PAGE);
    size_t map = cap + HUGE_PAGE;
    uint8_t *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *start = (uint8_t *)round_up((uintptr_t)p, HUGE_PAGE);
    size_t head = (size_t)(start - p), tail = map - head - cap;
    if (head) munmap(p, head);
    if (tail) munmap(start + cap, tail);
    /* advice only: where the kernel has THP off (or refuses), the chunk
     * stays ordinary memory */
    (void)madvise(start, cap, MADV_HUGEPAGE);
    chunk *c = malloc(sizeof *c);
    if (!c) {
        munmap(start, cap);
        return NULL;
    }
    *c = (chunk){.start = start, .cap = cap};
    return c;
}

cpu_arena *cpu_arena_create(void) { return calloc(1, sizeof(cpu_arena)); }

void cpu_arena_destroy(cpu_arena *a) {
    if (!a) return;
    for (chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        munmap(c->start, c->cap);
        free(c);
    }
    free(a);
}

void *cpu_arena_alloc(cpu_arena *a, size_t bytes) {
    if (!a || bytes > SIZE_MAX / 2) return NULL;
    bytes = round_up(bytes ? bytes : 1, ALIGN);
    chunk *c = a->head;
    if (!c || c->cap - c->used < bytes) {
        chunk *n = chunk_new(bytes);
        if (!n) return NULL;
        n->next = c; /* the old chunk's tail stays unused (and uncommitted) */
        a->head = c = n;
    }
    void *p = c->start + c->used; /* fresh anonymous memory: already zero */
    c->used += bytes;
    a->used += bytes;
    return p;
}

size_t cpu_arena_used(const cpu_arena *a) { return a ? a->used : 0; }
