/* ipc_caps.h - the co-location capability of Target.Verify (CUDA IPC),
 * without CUDA: who may offer it, when the target grants it, and the checks
 * on what comes over the wire (proto/specd.proto, CudaIpcOffer/Grant).
 *
 * The protocol, in one place:
 *   Open     client -> cuda_ipc {node_id, device_uuid}, only when its
 *            speculator runs on CUDA and this build has CUDA;
 *   step 0   target -> cuda_ipc grant {mem_handle, offset, hidden_size,
 *            device_uuid} when specd_ipc_grant_refusal() finds no reason
 *            to refuse, and hidden_fp16 as always;
 *   Tree     client -> hidden_via_ipc = true once it has mapped the grant
 *            (kernels/ipc.h); never set when mapping failed: that is the
 *            fallback, the bytes path, at no cost to anyone;
 *   step n   target -> hidden_in_ipc = true and no hidden_fp16 when the
 *            Tree asked (the buffer is written and synchronised before the
 *            response is sent; the protocol is lock-step, so one buffer per
 *            session suffices: the target writes it again only after the
 *            client's next Tree, which it sends after reading it).
 * Clients and targets that predate the fields never offer or grant. */
#ifndef SPECD_IPC_CAPS_H
#define SPECD_IPC_CAPS_H

#include <stddef.h>

#include "common/util/error.h"
#include "kernels/ipc.h" /* SPECD_IPC_HANDLE_BYTES, the transport */
#include "specd.pb-c.h"
/* node ids are boot ids (36 characters); anything longer is refused */
#define SPECD_IPC_NODE_MAX 64

/* This machine's node id (/proc/sys/kernel/random/boot_id, trimmed) into
 * out[SPECD_IPC_NODE_MAX]. -1 + err when it cannot be read. */
int specd_ipc_node_id(char *out, specd_error *err);

/* NULL when the target should grant the offer, else why not (a static
 * string for logs and tests): no offer, no hidden states asked for, the
 * target not on CUDA, a node id that is empty, too long or another
 * machine's. own_node NULL = this machine's could not be read. */
const char *specd_ipc_grant_refusal(const Specd__V1__CudaIpcOffer *offer, int return_hidden,
                                    const char *backend, const char *own_node);

/* Checks a grant received from a target before anything maps it: the
 * handle is SPECD_IPC_HANDLE_BYTES long, hidden_size equals the client's,
 * the offset is even and leaves room for hidden_size fp16 values below
 * 2^40. -1 + err naming the field otherwise. */
int specd_ipc_grant_check(const Specd__V1__CudaIpcGrant *g, int hidden_size, specd_error *err);

/* The transport's two calls that meet the wire (kernels/ipc.h), in
 * protobuf form. Export: fills g from e (g's pointers point into e; g must
 * not outlive e). Import: checks g (specd_ipc_grant_check) and maps it on
 * `device`; NULL + err when it cannot. */
void specd_ipc_export_grant(specd_ipc_export *e, Specd__V1__CudaIpcGrant *g);
specd_ipc_import *specd_ipc_import_open(const Specd__V1__CudaIpcGrant *g, int device,
                                        specd_error *err);

#endif
