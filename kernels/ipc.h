/* ipc.h - hidden states through GPU memory between two processes of one
 * node (CUDA IPC): the transport behind the co-location capability that
 * common/rpc/ipc_caps.h negotiates.
 *
 * The target exports one small device buffer per granted session
 * (cudaMalloc + cudaIpcGetMemHandle) and writes each step's hidden state
 * into it as fp16, synchronously, before it sends the response; the client
 * maps the handle once (cudaIpcOpenMemHandle, peer access enabled lazily,
 * so another GPU of the node reached over NVLink works too) and reads it
 * when the response says so.
 *
 * Today both ends still hold the hidden state on the host: the target's
 * scheduler returns it to the host (transformer.h) and the speculator
 * takes host input (mlp_speculator.h), so put/get copy host<->device. What
 * the capability saves now is the gRPC bytes (hidden_size x 2 per step,
 * encoded, sent, decoded); the device-to-device path (the transformer's
 * output row copied into the buffer, the speculator reading it in place)
 * plugs in behind the same two calls.
 *
 * Built without nvcc, every function fails with "not built" (ipc_nocuda.c),
 * so callers need no #ifdef and simply fall back to the bytes path. */
#ifndef SPECD_KERNELS_IPC_H
#define SPECD_KERNELS_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"

/* Size of a cudaIpcMemHandle_t (CUDA's CUDA_IPC_HANDLE_SIZE), fixed by the
 * driver ABI; checked against the real type in kernels/cuda/cuda_ipc.c. */
#define SPECD_IPC_HANDLE_BYTES 64

/* What a grant carries, as plain C. */
typedef struct specd_ipc_handle {
    const uint8_t *mem_handle; /* mem_handle_len bytes (SPECD_IPC_HANDLE_BYTES) */
    size_t mem_handle_len;
    uint64_t offset;           /* of the hidden state in the allocation */
    int hidden_size;           /* fp16 values */
    const char *device_uuid;   /* 32 hex digits */
} specd_ipc_handle;

typedef struct specd_ipc_export specd_ipc_export;
typedef struct specd_ipc_import specd_ipc_import;

/* The UUID of CUDA device `device` as 32 lowercase hex digits into
 * out[33]. -1 + err without the device or without CUDA. */
int specd_ipc_device_uuid(int device, char *out, specd_error *err);

/* Target side: a buffer of hidden_size fp16 values on `device`, exported.
 * NULL + err on failure (the session then answers without a grant). */
specd_ipc_export *specd_ipc_export_create(int device, int hidden_size, specd_error *err);
/* The grant describing it: h's pointers point into e; h must not outlive
 * e. (specd_ipc_export_grant in common/rpc/ipc_caps.h: the same as a
 * protobuf grant.) */
void specd_ipc_export_handle(const specd_ipc_export *e, specd_ipc_handle *h);
/* Writes hidden[hidden_size] (fp32, rounded to fp16 like hidden_fp16) and
 * waits until the device holds it. */
int specd_ipc_export_put(specd_ipc_export *e, const float *hidden, specd_error *err);
void specd_ipc_export_free(specd_ipc_export *e);

/* Client side: maps a grant (already checked: specd_ipc_import_open in
 * common/rpc/ipc_caps.h checks a protobuf grant and calls this) on
 * `device`. NULL + err when it cannot (another node after all, no peer
 * access, no CUDA): the caller keeps the bytes path. */
specd_ipc_import *specd_ipc_import_map(const specd_ipc_handle *h, int device, specd_error *err);
/* Reads the buffer into hidden[hidden_size] as fp32. */
int specd_ipc_import_get(specd_ipc_import *m, float *hidden, specd_error *err);
void specd_ipc_import_free(specd_ipc_import *m);

#endif
