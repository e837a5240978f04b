/* cuda_backend.c - the CUDA implementation of kernels/backend.h: creation,
 * memory, errors, finish, device info and the ops table.
 *
 * Execution model: one non-blocking stream per backend; every op, copy and
 * upload is queued on it, so the stream's order is the program's order and
 * nothing synchronizes with the legacy default stream (or with another
 * backend on the same GPU). The host waits only in finish(), to_host,
 * from_host, free and at load time.
 *
 * Errors: ops return nothing (they only queue work). Every CUDA and cuBLAS
 * call is checked and the first failure's message is kept; finish()
 * synchronizes, adds any fault the kernels hit, returns the message and
 * clears it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* cuBLAS's recommended workspace on Hopper. Given once, it is what every
 * GEMM uses, so a graph capture never makes cuBLAS allocate. */
#define BLAS_WORKSPACE_BYTES ((size_t)32 << 20)

void cuda_fail(cuda_backend *cb, const char *fmt, ...) {
    if (cb->has_err) return; /* the first error is the informative one */
    int n = snprintf(cb->err, sizeof cb->err, "cuda backend: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cb->err + n, sizeof cb->err - (size_t)n, fmt, ap);
    va_end(ap);
    cb->has_err = 1;
}

int cuda_ok(cuda_backend *cb, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    /* clear the thread's last-error slot so the next launch check does not
     * report this failure again under another name (sticky errors stay) */
    (void)cudaGetLastError();
    cuda_fail(cb, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}

int cublas_ok(cuda_backend *cb, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return 1;
    cuda_fail(cb, "%s: %s", what, cublasGetStatusString(s));
    return 0;
}

/* The calling thread's current device must be ours before any runtime call
 * that does not name a stream (cudaMalloc, cudaFree, ...); a server may
 * drive backends on several GPUs from one thread. */
void cuda_enter(cuda_backend *cb) { cuda_ok(cb, cudaSetDevice(cb->device), "cudaSetDevice"); }

static void cuda_destroy(specd_backend *be) {
    cuda_backend *cb = cuda_of(be);
    if (!cb) return;
    (void)cudaSetDevice(cb->device);
    if (cb->stream) {
        cuda_capture_abort(cb, 0);
        (void)cudaStreamSynchronize(cb->stream);
        cuda_graph_reset(be);
    }
    cuda_ops_free(cb);
    cuda_weights_free_staging(cb);
    cuda_step_free(cb);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->blas_workspace) cudaFree(cb->blas_workspace);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    (void)cudaGetLastError();
    free(cb);
}

static void *cuda_alloc(specd_backend *be, size_t bytes) {
    cuda_backend *cb = cuda_of(be);
    cuda_capture_abort(cb, 0); /* cudaMalloc may not run inside a capture */
    cuda_enter(cb);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is the caller's to report */
        return NULL;
    }
    /* zeroed on our stream, so it is ordered before every later use (a plain
     * cudaMemset would run on the legacy stream, unordered with ours) */
    if (!cuda_ok(cb, cudaMemsetAsync(p, 0, bytes, cb->stream), "alloc: cudaMemsetAsync")) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free_buf(specd_backend *be, void *buf) {
    cuda_backend *cb = cuda_of(be);
    if (!buf) return;
    cuda_capture_abort(cb, 0);
    cuda_enter(cb);
    /* queued work may still read it */
    cuda_ok(cb, cudaStreamSynchronize(cb->stream), "free: cudaStreamSynchronize");
    cuda_ok(cb, cudaFree(buf), "free: cudaFree");
}

static void cuda_to_host(specd_backend *be, void *host, const void *dev, size_t bytes) {
    cuda_backend *cb = cuda_of(be);
    if (!bytes) return;
    cuda_capture_abort(cb, 0);
    cuda_enter(cb); /* the speculator's threads reach the GPU through here first */
    /* on the stream: waits for the work that produces `dev`; then wait for
     * the copy itself (the destination may be pageable) */
    cuda_ok(cb, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, cb->stream),
            "to_host: cudaMemcpyAsync");
    cuda_ok(cb, cudaStreamSynchronize(cb->stream), "to_host: cudaStreamSynchronize");
}

static void cuda_from_host(specd_backend *be, void *dev, const void *host, size_t bytes) {
    cuda_backend *cb = cuda_of(be);
    if (!bytes) return;
    cuda_capture_abort(cb, 0);
    cuda_enter(cb);
    /* ordered after queued work (which may still read `dev`), and complete
     * on return, so the caller may reuse `host` at once */
    cuda_ok(cb, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cb->stream),
            "from_host: cudaMemcpyAsync");
    cuda_ok(cb, cudaStreamSynchronize(cb->stream), "from_host: cudaStreamSynchronize");
}

static int cuda_finish(specd_backend *be, specd_error *err) {
    cuda_backend *cb = cuda_of(be);
    cuda_capture_abort(cb, 0); /* a graph_begin without graph_end: run what was recorded */
    /* a fault inside a kernel surfaces here */
    cuda_ok(cb, cudaStreamSynchronize(cb->stream), "step");
    if (!cb->has_err) return 0;
    specd_seterr(err, "%s", cb->err);
    cb->has_err = 0;
    return -1;
}

/* Peak bandwidth by name, for a runtime that does not report memory clocks:
 * the vendors' data-sheet figures. */
static double bandwidth_by_name(const char *name) {
    if (strstr(name, "H200")) return 4.8e12;
    if (strstr(name, "H100") && strstr(name, "PCIe")) return 2.0e12;
    if (strstr(name, "H100")) return 3.35e12; /* SXM */
    if (strstr(name, "A100") && strstr(name, "80GB")) return 2.039e12;
    if (strstr(name, "A100")) return 1.555e12;
    return 0;
}

static int cuda_device_info(specd_backend *be, specd_device_info *out) {
    cuda_backend *cb = cuda_of(be);
    memset(out, 0, sizeof *out);
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, cb->device) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    size_t n = strnlen(p.name, sizeof p.name);
    if (n >= sizeof out->name) n = sizeof out->name - 1;
    memcpy(out->name, p.name, n);
    out->name[n] = '\0';
    out->memory_bytes = (uint64_t)p.totalGlobalMem;
    /* CUDA 13 dropped the clock fields from cudaDeviceProp but still has the
     * attributes: peak = 2 transfers per clock (DDR) * clock * bus bytes. */
    int clk_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, cb->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, cb->device) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        clk_khz = bus_bits = 0;
    }
    if (clk_khz > 0 && bus_bits > 0)
        out->peak_bytes_per_s = 2.0 * (double)clk_khz * 1e3 * (double)bus_bits / 8.0;
    else
        out->peak_bytes_per_s = bandwidth_by_name(out->name);
    return 0;
}

static const specd_backend_ops k_cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free_buf,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .prepare_weight = cuda_prepare_weight,
    .release_weight = cuda_release_weight,
    .begin_step = cuda_begin_step,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_reset = cuda_graph_reset,
    .finish = cuda_finish,
    .embed = cuda_op_embed,
    .embed_ids = cuda_op_embed_ids,
    .rmsnorm = cuda_op_rmsnorm,
    .norm_gelu = cuda_op_norm_gelu,
    .matmul = cuda_op_matmul,
    .matmuls = cuda_op_matmuls,
    .rope = cuda_op_rope,
    .attention = cuda_op_attention,
    .swiglu = cuda_op_swiglu,
    .axpy = cuda_op_axpy,
    .scale = cuda_op_scale,
    .gather_out = cuda_op_gather_out,
    .argmax = cuda_op_argmax,
    .kv_move = cuda_op_kv_move,
    .device_info = cuda_device_info,
};

/* Creation failed at `what`: the message names the device; undo what exists. */
static specd_backend *create_failed(cuda_backend *cb, specd_error *err, const char *what,
                                    cudaError_t e) {
    specd_seterr(err, "cuda backend: device %d: %s: %s", cb->device, what,
                 e != cudaSuccess ? cudaGetErrorString(e) : (cb->has_err ? cb->err : "failed"));
    cuda_destroy(&cb->base);
    return NULL;
}

specd_backend *specd_cuda_backend_create(int device, int kv_f32, specd_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        specd_seterr(err, "cuda backend: no CUDA device (device %d requested; %s)", device,
                     e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
        return NULL;
    }
    if (device < 0 || device >= n) {
        specd_seterr(err, "cuda backend: no CUDA device %d (this machine has %d: 0..%d)", device, n,
                     n - 1);
        return NULL;
    }
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        specd_seterr(err, "cuda backend: out of host memory");
        return NULL;
    }
    cb->base.ops = &k_cuda_ops;
    cb->base.kv_type = kv_f32 ? SPECD_F32 : SPECD_F16;
    cb->base.warm_passes = 2;
    cb->device = device;
    cb->capturing = -1;
    /* SPECD_CUDA_GRAPHS=0: every step eager. An operator's switch for ruling
     * graphs in or out when a step misbehaves on a new driver or GPU. */
    const char *graphs = getenv("SPECD_CUDA_GRAPHS");
    cb->graphs_off = graphs && !strcmp(graphs, "0");
    /* SPECD_CUDA_GRAPH_SLOTS=N: a smaller graph cache (for measuring what
     * the cache size buys; cuda_internal.h) */
    const char *slots = getenv("SPECD_CUDA_GRAPH_SLOTS");
    cb->graph_slots = slots ? atoi(slots) : CUDA_GRAPH_SLOTS;
    if (cb->graph_slots < 1 || cb->graph_slots > CUDA_GRAPH_SLOTS) cb->graph_slots = CUDA_GRAPH_SLOTS;
    if ((e = cudaSetDevice(device)) != cudaSuccess) return create_failed(cb, err, "cudaSetDevice", e);
    if ((e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return create_failed(cb, err, "cudaStreamCreateWithFlags", e);

    cublasStatus_t s = cublasCreate(&cb->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cb->blas = NULL;
        specd_seterr(err, "cuda backend: device %d: cublasCreate: %s", device,
                     cublasGetStatusString(s));
        cuda_destroy(&cb->base);
        return NULL;
    }
    if ((e = cudaMalloc(&cb->blas_workspace, BLAS_WORKSPACE_BYTES)) != cudaSuccess)
        return create_failed(cb, err, "cuBLAS workspace", e);
    /* order matters: cublasSetStream resets the workspace to cuBLAS's own
     * pool, so the stream is set first. Host pointer mode: alpha/beta are
     * read at call time from host memory, which graph capture bakes in. */
    if (!cublas_ok(cb, cublasSetStream(cb->blas, cb->stream), "cublasSetStream") ||
        !cublas_ok(cb, cublasSetWorkspace(cb->blas, cb->blas_workspace, BLAS_WORKSPACE_BYTES),
                   "cublasSetWorkspace") ||
        !cublas_ok(cb, cublasSetPointerMode(cb->blas, CUBLAS_POINTER_MODE_HOST),
                   "cublasSetPointerMode") ||
        /* default math: no TF32 for fp32 GEMMs (the fp32 golden tests need
         * fp32 products) */
        !cublas_ok(cb, cublasSetMathMode(cb->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"))
        return create_failed(cb, err, "cuBLAS setup", cudaSuccess);

    if ((e = cudaEventCreateWithFlags(&cb->move_copied, cudaEventDisableTiming)) != cudaSuccess)
        return create_failed(cb, err, "cudaEventCreate", e);
    if (cuda_step_init(cb)) return create_failed(cb, err, "step buffer", cudaSuccess);
    return &cb->base;
}
