/* target_pool.h - the target services a draft-svc sends its sessions to.
 *
 * Configured as a list of entries, each either a fixed "host:port" or
 * "dns:NAME:PORT": a DNS name resolved (getaddrinfo) to every address it has
 * and re-resolved every resolve_interval, which is what a Kubernetes headless
 * Service gives (one A record per ready target pod). Every address becomes a
 * member with its own gRPC channel.
 *
 * Picking: the member with the fewest sessions this draft-svc has open on it
 * among those that are up and compatible, round robin among equals, so load
 * spreads even when one member is slower to finish.
 *
 * Health: a member whose session failed (connection lost, UNAVAILABLE, full)
 * is marked down and skipped for a backoff that doubles with each
 * consecutive failure (min_backoff .. max_backoff); after it, the next
 * acquire tries it again, so a restarted target is used again without any
 * operator action. A member is checked with Target.GetInfo before its first
 * session (and again after it was down): vocabulary size, hidden size and
 * tokenizer fingerprint must match what draft-svc expects, else it is
 * marked incompatible (and logged) rather than served wrong tokens.
 *
 * Names: specd_tpool ("target pool"), not specd_pool, which is the CPU
 * kernels' thread pool (kernels/cpu/threadpool.h); both end up in one
 * binary (the specd tool, the tests), where the same function names clashed
 * at link time.
 *
 * Thread-safe. Members are reference counted: a session keeps its member
 * (and channel) alive even if a re-resolution drops the address. */
#ifndef SPECD_TARGET_POOL_H
#define SPECD_TARGET_POOL_H

#include <stdint.h>

#include "common/util/error.h"
#include "common/spec/step_cost.h"
#include "common/rpc/rpc_client.h"

typedef struct specd_tpool specd_tpool;
typedef struct specd_tpool_member specd_tpool_member;

/* What the pool learned from a member's GetInfo. */
#define SPECD_TARGET_MAX_END 16

typedef struct specd_target_info {
    int vocab_size, hidden_size, context_length, max_tree_tokens, max_sessions;
    int queue_wait_ms; /* how long it may queue a new session before RESOURCE_EXHAUSTED */
    int eos_token_id, bos_token_id;
    /* the ids that end a generation there (GetInfo's end_token_ids; a
     * longer list is cut: GetInfo passes it on, nothing decides by it) */
    int32_t end_token_ids[SPECD_TARGET_MAX_END];
    int n_end_token_ids;
    char tokenizer_sha256[65];
    char model_id[256];
    char backend[16];
    specd_step_cost step_cost; /* as GetInfo reported it (nothing measured: all 0) */
} specd_target_info;

typedef struct specd_tpool_opts {
    const char *const *targets; /* "host:port" or "dns:NAME:PORT" */
    int n_targets;
    /* TLS towards the targets (insecure = plaintext); target is filled per
     * member. */
    specd_rpc_channel_opts channel;
    int resolve_interval_ms;    /* DNS re-resolution; default 10000 */
    int min_backoff_ms;         /* default 500 */
    int max_backoff_ms;         /* default 30000 */
    int info_timeout_ms;        /* GetInfo deadline; default 2000 */
    /* What a member must match (0 / "" = do not check that field). */
    int expect_vocab;
    int expect_hidden;
    const char *expect_tokenizer_sha256;
} specd_tpool_opts;

/* A target's GetInfo answer (bytes from another service) as the pool keeps
 * it: numbers as they are, strings cut to their fields, at most
 * SPECD_TARGET_MAX_END end ids, and only the cost points with 1..2^20
 * tokens and a finite positive time. Pure: tests/fuzz/fuzz_target_info.c
 * feeds it any bytes protobuf-c decodes. */
struct Specd__V1__Info;
void specd_target_info_from_pb(const struct Specd__V1__Info *r, specd_target_info *info);
/* Why draft-svc must not send this target sessions ("vocab_size",
 * "hidden_size", "tokenizer_sha256" against o's expectations, or "limits"
 * for a target that cannot hold a session), or NULL when it may. */
const char *specd_target_info_mismatch(const specd_tpool_opts *o, const specd_target_info *info);

specd_tpool *specd_tpool_create(const specd_tpool_opts *o, specd_error *err);
void specd_tpool_free(specd_tpool *p); /* every member must have been released */

/* A member for a new session (its session count goes up), not `avoid` if
 * there is any other choice (failover prefers a different target). NULL +
 * err (UNAVAILABLE-worthy: "no target available: ...") when none is up. */
specd_tpool_member *specd_tpool_acquire(specd_tpool *p, const specd_tpool_member *avoid,
                                      specd_error *err);

/* Ends a session on the member. failed = 1 marks it down (backoff). */
void specd_tpool_release(specd_tpool *p, specd_tpool_member *m, int failed);

specd_rpc_channel *specd_tpool_member_channel(const specd_tpool_member *m);
const char *specd_tpool_member_addr(const specd_tpool_member *m);
const specd_target_info *specd_tpool_member_info(const specd_tpool_member *m);
/* The member's forward-pass cost curves (common/spec/step_cost.h): both
 * start as GetInfo's and are kept up to date by
 * specd_tpool_member_cost_observe from the timings of every step any
 * session runs there. Two, because the curve is keyed by the tokens in a
 * pass and a pass of n tokens from one session costs less than n tokens
 * from several (each sequence reads its own context): shared = 0 is the
 * curve of passes that held one session alone, shared = 1 of passes it
 * shared with others. With one curve, the 4- and 16-stream passes of a
 * bench taught it that 2-4 tokens cost what 2-4 sessions at long contexts
 * cost, and a lone session that came later priced its trees at that and
 * declined them (mlp tau 1.02 where alone it drafted at 1.39).
 * Thread-safe. */
void specd_tpool_member_cost(specd_tpool_member *m, int shared, specd_step_cost *out);
void specd_tpool_member_cost_observe(specd_tpool_member *m, int shared, int batch_tokens,
                                     double forward_us);
/* Sessions this draft-svc has open on the member right now. */
int specd_tpool_member_sessions(const specd_tpool_member *m);

/* Info of any compatible member (fetching one if needed): 0, or -1 + err. */
int specd_tpool_any_info(specd_tpool *p, specd_target_info *out, specd_error *err);

/* ---- liveness (draft-svc/target_watch.c probes, the driver reads) ---- */

/* References to every member now listed, in out[0..cap) (at most cap);
 * give each back with specd_tpool_member_put. Returns the count. */
int specd_tpool_members(specd_tpool *p, specd_tpool_member **out, int cap);
void specd_tpool_member_put(specd_tpool *p, specd_tpool_member *m);

/* A health probe's answer for m: serving = 1 records "alive now" and, for
 * a member marked down, ends its backoff (it is checked with GetInfo again
 * by the next acquire or specd_tpool_check: a target that is back is used
 * at once). serving = 0 changes nothing by itself: a busy target is slow,
 * not gone; the driver judges a silent one by how long it has been silent. */
void specd_tpool_note_health(specd_tpool *p, specd_tpool_member *m, int serving);

/* Runs the GetInfo compatibility check now for a member that has not had
 * it (so health can say whether a usable target exists before any request
 * came). 1 = the member is up and compatible, 0 = not (or unreachable). */
int specd_tpool_check(specd_tpool *p, specd_tpool_member *m);

/* Monotonic ms of m's last SERVING health answer; 0 = none yet. */
int64_t specd_tpool_member_last_alive(const specd_tpool_member *m);

/* Addresses of the members currently up, as "addr" strings written into
 * out[0..cap) (malloc'd; the caller frees each). Returns the count. */
int specd_tpool_list_up(specd_tpool *p, char **out, int cap);

/* Calls fn for every member (under the pool's lock: fn must be quick and
 * must not call back into the pool): its address, the sessions this
 * draft-svc has open on it, and whether it is up. For the metrics. */
void specd_tpool_each(specd_tpool *p, void (*fn)(void *arg, const char *addr, int sessions, int up),
                      void *arg);

#endif
