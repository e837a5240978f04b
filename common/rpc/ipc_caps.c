/* ipc_caps.c - see ipc_caps.h. */
#include "common/rpc/ipc_caps.h"

#include <stdio.h>
#include <string.h>

int specd_ipc_node_id(char *out, specd_error *err) {
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return specd_seterr(err, "ipc: cannot read /proc/sys/kernel/random/boot_id");
    size_t n = fread(out, 1, SPECD_IPC_NODE_MAX - 1, f);
    fclose(f);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' ')) n--;
    out[n] = '\0';
    if (n == 0) return specd_seterr(err, "ipc: empty boot_id");
    return 0;
}

const char *specd_ipc_grant_refusal(const Specd__V1__CudaIpcOffer *offer, int return_hidden,
                                    const char *backend, const char *own_node) {
    if (!offer) return "not offered";
    if (!return_hidden) return "no hidden states asked for (return_hidden is false)";
    if (!backend || strcmp(backend, "cuda")) return "the target does not run on CUDA";
    if (!own_node || !*own_node) return "the target cannot tell which node it is on";
    const char *node = offer->node_id ? offer->node_id : "";
    if (!*node) return "the offer has no node_id";
    if (strlen(node) >= SPECD_IPC_NODE_MAX) return "the offer's node_id is too long";
    /* CUDA IPC handles are meaningful only to processes of the same boot
     * of the same machine */
    if (strcmp(node, own_node)) return "the client is on another node";
    return NULL;
}

int specd_ipc_grant_check(const Specd__V1__CudaIpcGrant *g, int hidden_size, specd_error *err) {
    if (!g) return specd_seterr(err, "cuda_ipc: no grant");
    if (g->mem_handle.len != SPECD_IPC_HANDLE_BYTES)
        return specd_seterr(err, "cuda_ipc.mem_handle: %zu bytes, expected %d",
                            g->mem_handle.len, SPECD_IPC_HANDLE_BYTES);
    if (hidden_size <= 0 || g->hidden_size != (uint32_t)hidden_size)
        return specd_seterr(err, "cuda_ipc.hidden_size: %u, expected %d", g->hidden_size,
                            hidden_size);
    /* fp16 values: an odd offset would misalign every one of them; 2^40
     * bounds the arithmetic far above any real allocation */
    if (g->offset % 2 || g->offset > ((uint64_t)1 << 40))
        return specd_seterr(err, "cuda_ipc.offset: %llu is odd or absurd",
                            (unsigned long long)g->offset);
    return 0;
}

void specd_ipc_export_grant(specd_ipc_export *e, Specd__V1__CudaIpcGrant *g) {
    specd_ipc_handle h;
    specd_ipc_export_handle(e, &h);
    g->mem_handle.data = (uint8_t *)h.mem_handle;
    g->mem_handle.len = h.mem_handle_len;
    g->offset = h.offset;
    g->hidden_size = (uint32_t)h.hidden_size;
    g->device_uuid = (char *)h.device_uuid;
}

specd_ipc_import *specd_ipc_import_open(const Specd__V1__CudaIpcGrant *g, int device,
                                        specd_error *err) {
    if (specd_ipc_grant_check(g, g ? (int)g->hidden_size : 0, err)) return NULL;
    specd_ipc_handle h = {.mem_handle = g->mem_handle.data,
                          .mem_handle_len = g->mem_handle.len,
                          .offset = g->offset,
                          .hidden_size = (int)g->hidden_size,
                          .device_uuid = g->device_uuid};
    return specd_ipc_import_map(&h, device, err);
}
