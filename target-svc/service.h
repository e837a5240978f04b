/* service.h - the specd.v1.Target gRPC service.
 *
 *   /specd.v1.Target/Verify    BIDI: one speculative session per stream
 *   /specd.v1.Target/Generate  SERVER_STREAMING: plain decoding
 *   /specd.v1.Target/GetInfo   UNARY: what model this target serves
 *
 * Every handler runs on its own thread (common/rpc/rpc_server.h) and hands its
 * model work to the one scheduler (scheduler.h), so all sessions share each
 * forward pass. The service does not own the model, transformer or tokenizer;
 * they must outlive it. */
#ifndef SPECD_SERVICE_H
#define SPECD_SERVICE_H

#include "common/util/error.h"
#include "common/model/model_file.h"
#include "common/rpc/rpc_server.h"
#include "common/spec/step_cost.h"
#include "common/text/tokenizer.h"
#include "common/model/transformer.h"

/* GetInfo.version: the one specd version (CMake project VERSION) */
#include "common/util/version.h"
#include "specd.pb-c.h"
#include "target-svc/session.h"

typedef struct specd_target_service specd_target_service;

typedef struct specd_target_opts {
    int max_sessions;      /* = the transformer's n_slots */
    int max_prompt_tokens;
    int max_tree_tokens;   /* + 1 (the pending token) must be <= max_batch_tokens */
    int max_batch_tokens;  /* = the transformer's max_batch */
    int max_wait_ms;
    int device;            /* the transformer's CUDA device: where co-located
                            * sessions' hidden-state buffers live (ipc_caps.h) */
    /* Generate's max_new_tokens cap and default (0 = 4096 / 256, draft-svc's
     * defaults); Verify sessions are bounded by the context instead. */
    int max_new_tokens, default_max_new_tokens;
    int prefill_chunk;     /* prompt tokens per forward pass (scheduler.h) */
    int prefill_chunk_ms;  /* time budget of a pass's prompt work beside decoding streams */
    int kv_wait_ms;        /* longest wait of a running session's step for KV pages */
    int queue_wait_ms;     /* longest wait of a new session for pages to start (0 = 10 min) */
    int prefix_cache;      /* reported in GetInfo (the transformer does the caching) */
    int calibrate_tokens;  /* start-up timing of the cost curve up to this pass size (0 = none) */
} specd_target_opts;

/* Starts the scheduler's model worker. tok may be NULL (a model without a
 * tokenizer: Generate then takes token_ids only, tokenizer_sha256 is empty). */
specd_target_service *specd_target_service_create(const specd_model_file *m,
                                                  specd_transformer *t,
                                                  const specd_tokenizer *tok,
                                                  const specd_target_opts *o, specd_error *err);

/* Registers the three methods and marks "specd.v1.Target" SERVING (the
 * server's own "" is SERVING from create). Before specd_rpc_server_start. */
int specd_target_service_register(specd_target_service *svc, specd_rpc_server *srv,
                                  specd_error *err);

/* After the server has shut down (no handler running). NULL is a no-op. */
void specd_target_service_free(specd_target_service *svc);

/* The kernel path the target's forward passes run: the CPU backend's SIMD
 * path (kernels/cpu/matmul.h: "amx", "avx512vnni", ... "scalar"), else the
 * backend's name ("cuda"). Also specd_target_backend_info's label. */
const char *specd_target_service_kernels(const specd_target_service *svc);

/* The forward-pass cost curve as GetInfo reports it (common/spec/step_cost.h). */
void specd_target_service_step_cost(specd_target_service *svc, specd_step_cost *out);
/* A Verify Open into the session (session.h): the protobuf message
 * converted to specd_session_open_req once, here, then
 * specd_session_check_open, the sampling parameters, and
 * specd_session_open_plain. The same statuses and messages. */
grpc_status_code specd_session_open(specd_session *s, const Specd__V1__VerifyOpen *o,
                                    const char *field, specd_error *err);
/* A Verify Tree as session.h's plain request; the draft distributions are
 * converted into the session's q buffer (valid until the next Tree). -1 +
 * err only when out of memory; malformed q entries are left for
 * specd_session_tree to report in its order. */
int specd_session_tree_from_pb(specd_session *s, const Specd__V1__VerifyTree *pb,
                               specd_session_tree_req *out, specd_error *err);

#endif
