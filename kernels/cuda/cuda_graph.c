/* cuda_graph.c - recording a step's ops as a CUDA graph and replaying it.
 *
 * A decode or tree-verify step of a small model is hundreds of short
 * kernels; launching them one by one costs more than running them. The
 * caller brackets a step's ops with graph_begin(key)/graph_end and promises
 * the same ops on the same buffers for every step with that key and the
 * same (n_tokens, n_seqs, n_out); everything else that varies lives in the
 * step buffer (cuda_step.c). So a graph recorded once replays every later
 * step of that shape.
 *
 * Policy, per (key, n_tokens, n_seqs, n_out), for n_tokens <= 128:
 *   1st time: eager (and scratch buffers grow to this shape's size);
 *   2nd time: recorded (stream capture; nothing runs while capturing), then
 *             instantiated and launched once - this step's work;
 *   later:    replayed with one cudaGraphLaunch (graph_begin returns 1).
 * If recording fails, that shape stays eager until graph_reset. Entries
 * live in a 256-slot table (cuda_internal.h), least recently used
 * evicted. graph_reset (and any reallocation of a buffer graphs use: step
 * buffer, op scratch) drops
 * the recorded graphs but remembers which shapes ran before: scratch only
 * grows, so a shape that ran once still fits, and its next step records.
 *
 * Capture mode is thread-local: other threads using the GPU (another
 * backend) neither break nor are broken by our capture. While capturing,
 * nothing may synchronize or allocate; the backend's entry points that must
 * (alloc, free, copies, growing a scratch buffer, begin_step, finish) first
 * call cuda_capture_abort, which closes the recording, launches what was
 * recorded so far, and lets the rest of the step run eagerly. */
#include <string.h>

#include "cuda_internal.h"

static int same_shape(const cuda_graph_entry *e, uint32_t key, const cuda_backend *cb) {
    return e->key == key && e->n_tokens == cb->n_tokens && e->n_seqs == cb->n_seqs &&
           e->n_out == cb->n_out;
}

/* Destroys an entry's graph. A replay of it may still be queued: wait first
 * (never called while capturing, when waiting is not allowed). */
static void drop_exec(cuda_backend *cb, cuda_graph_entry *e) {
    if (!e->exec) return;
    cuda_ok(cb, cudaStreamSynchronize(cb->stream), "graph: cudaStreamSynchronize");
    cudaGraphExecDestroy(e->exec);
    e->exec = NULL;
}

int cuda_graph_begin(specd_backend *be, uint32_t key) {
    cuda_backend *cb = cuda_of(be);
    if (cb->capturing >= 0) { /* nested inside a recording: part of it */
        cb->capture_nest++;
        return 0;
    }
    /* no graphs for big steps, without a step, or after an error (a graph
     * recorded in a broken state would replay it) */
    if (cb->graphs_off || !cb->have_step || cb->has_err || cb->n_tokens <= 0 ||
        cb->n_tokens > CUDA_GRAPH_MAX_TOKENS)
        return 0;
    uint64_t now = ++cb->graph_clock;
    int found = -1, empty = -1, lru = -1;
    for (int i = 0; i < cb->graph_slots; i++) {
        cuda_graph_entry *e = &cb->graphs[i];
        if (e->state == CG_FREE) {
            if (empty < 0) empty = i;
        } else if (same_shape(e, key, cb)) {
            found = i;
            break;
        } else if (lru < 0 || e->last_used < cb->graphs[lru].last_used) {
            lru = i;
        }
    }
    if (found < 0) { /* first sighting: remember it, run eagerly */
        cuda_graph_entry *e = &cb->graphs[empty >= 0 ? empty : lru];
        drop_exec(cb, e);
        *e = (cuda_graph_entry){.state = CG_SEEN, .key = key, .n_tokens = cb->n_tokens,
                                .n_seqs = cb->n_seqs, .n_out = cb->n_out, .last_used = now};
        return 0;
    }
    cuda_graph_entry *e = &cb->graphs[found];
    e->last_used = now;
    if (e->state == CG_RECORDED) {
        if (cudaGraphLaunch(e->exec, cb->stream) == cudaSuccess) return 1;
        /* a graph problem is not the step's problem: the caller issues the
         * ops eagerly, and this shape stays eager */
        (void)cudaGetLastError();
        drop_exec(cb, e);
        e->state = CG_EAGER;
        return 0;
    }
    if (e->state == CG_SEEN) {
        if (cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
            (void)cudaGetLastError();
            e->state = CG_EAGER;
            return 0;
        }
        cb->capturing = found;
        cb->capture_nest = 0;
    }
    return 0; /* recording, or eager */
}

/* Ends the recording in progress and runs it once (capturing executes
 * nothing, so this launch is the step's work). keep: store the graph for
 * replays; else drop it, and the shape records again next time (retry) or
 * stays eager (a call that cannot be captured came in: it would again). */
static void end_capture(cuda_backend *cb, int keep, int retry) {
    cuda_graph_entry *e = &cb->graphs[cb->capturing];
    cb->capturing = -1;
    cb->capture_nest = 0;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t r = cudaStreamEndCapture(cb->stream, &g);
    if (r == cudaSuccess && !g) r = cudaErrorStreamCaptureInvalidated;
    if (r == cudaSuccess) r = cudaGraphInstantiate(&exec, g, 0);
    if (g) cudaGraphDestroy(g); /* the executable graph is independent of it */
    if (r == cudaSuccess) r = cudaGraphLaunch(exec, cb->stream);
    if (r != cudaSuccess) {
        (void)cudaGetLastError();
        if (exec) cudaGraphExecDestroy(exec);
        e->exec = NULL;
        e->state = CG_EAGER;
        /* The recorded ops never ran and cannot be issued again from here, so
         * this one step fails; the shape runs eagerly from now on. With the
         * backend's ops (no synchronizing or allocating calls while
         * capturing) this does not happen short of a driver problem. */
        cuda_fail(cb, "graph for %d tokens could not be recorded (%s); the step's ops did not "
                      "run; this shape now runs without graphs",
                  e->n_tokens, cudaGetErrorString(r));
        return;
    }
    e->exec = exec;
    e->state = CG_RECORDED;
    if (!keep) {
        drop_exec(cb, e); /* waits for the launch above */
        e->state = retry ? CG_SEEN : CG_EAGER;
    }
}

void cuda_graph_end(specd_backend *be) {
    cuda_backend *cb = cuda_of(be);
    if (cb->capturing < 0) return; /* after a replay or an eager run */
    if (cb->capture_nest > 0) {
        cb->capture_nest--;
        return;
    }
    end_capture(cb, 1, 0);
}

void cuda_capture_abort(cuda_backend *cb, int retry) {
    if (cb->capturing >= 0) end_capture(cb, 0, retry);
}

void cuda_graph_reset(specd_backend *be) {
    cuda_backend *cb = cuda_of(be);
    cuda_capture_abort(cb, 1);
    for (int i = 0; i < cb->graph_slots; i++) {
        cuda_graph_entry *e = &cb->graphs[i];
        drop_exec(cb, e);
        if (e->state == CG_RECORDED) e->state = CG_SEEN;
    }
}
