/* target_pool.c - the pool of target services (target_pool.h). */
#include "draft-svc/target_pool.h"

#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <arpa/inet.h>

#include "specd.pb-c.h"
#include "common/util/clock.h"

#define POOL_MAX_MEMBERS 1024

typedef enum member_state {
    MEMBER_UNCHECKED,    /* GetInfo not done yet (new, or back from down) */
    MEMBER_UP,
    MEMBER_DOWN,         /* failed; retried after down_until */
    MEMBER_INCOMPATIBLE, /* answered, but with another model or tokenizer */
} member_state;

struct specd_tpool_member {
    char addr[300];
    int source;           /* index of the configured entry it came from */
    specd_rpc_channel *ch;
    member_state state;
    _Atomic int sessions; /* open sessions of this draft-svc on it; written under the
                           * pool's mu, read without (specd_tpool_member_sessions) */
    int refs;             /* pool list (1 while listed) + sessions */
    int listed;           /* still in the resolved set */
    int failures;         /* consecutive */
    int64_t down_until_ms;
    _Atomic int64_t last_alive_ms; /* last SERVING health answer; read without mu */
    specd_target_info info;
    /* the live cost curves, under cost_mu (sessions update them per step):
     * [0] passes that held one session alone, [1] passes shared with others */
    pthread_mutex_t cost_mu;
    specd_step_cost cost[2];
};

/* Members' weight of each new step time in their cost curve: a few dozen
 * steps make the estimate, so it follows a change of load within a second
 * or two. */
#define COST_ALPHA 0.05

/* A checked member's info, and its cost curve restarted from GetInfo's.
 * Caller holds the pool's mu. */
static void set_info(specd_tpool_member *m, const specd_target_info *info) {
    m->info = *info;
    pthread_mutex_lock(&m->cost_mu);
    m->cost[0] = m->cost[1] = info->step_cost;
    pthread_mutex_unlock(&m->cost_mu);
}

struct specd_tpool {
    specd_tpool_opts o;
    char **targets; /* owned copies of o.targets */
    char *ca, *cert, *key, *server_name;
    pthread_mutex_t mu;
    specd_tpool_member *m[POOL_MAX_MEMBERS];
    int n;
    unsigned rr;            /* round-robin cursor */
    int64_t resolved_at_ms; /* last DNS pass; 0 = never */
};

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* ---- membership ------------------------------------------------------------ */

static void member_unref(specd_tpool_member *m) {
    if (--m->refs > 0) return;
    specd_rpc_channel_free(m->ch);
    pthread_mutex_destroy(&m->cost_mu);
    free(m);
}

static specd_tpool_member *find_member(specd_tpool *p, const char *addr) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->m[i]->addr, addr)) return p->m[i];
    return NULL;
}

/* Adds addr (or marks it listed again). Caller holds mu. */
static void add_member(specd_tpool *p, const char *addr, int source) {
    specd_tpool_member *m = find_member(p, addr);
    if (m) {
        m->listed = 1;
        return;
    }
    if (p->n >= POOL_MAX_MEMBERS) return;
    m = calloc(1, sizeof *m);
    if (!m) return;
    pthread_mutex_init(&m->cost_mu, NULL);
    snprintf(m->addr, sizeof m->addr, "%s", addr);
    specd_rpc_channel_opts co = p->o.channel;
    co.target = m->addr;
    specd_error err = {{0}};
    if (!(m->ch = specd_rpc_channel_create(&co, &err))) {
        fprintf(stderr, "draft-svc: target %s: %s\n", addr, err.msg);
        pthread_mutex_destroy(&m->cost_mu);
        free(m);
        return;
    }
    m->source = source;
    m->listed = 1;
    m->refs = 1;
    m->state = MEMBER_UNCHECKED;
    p->m[p->n++] = m;
}

/* "dns:NAME:PORT" -> every address NAME has, as "ip:port" / "[ip6]:port". */
static void resolve_entry(specd_tpool *p, const char *entry, int source) {
    const char *spec = entry + 4;
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec) {
        fprintf(stderr, "draft-svc: target '%s': expected dns:NAME:PORT\n", entry);
        return;
    }
    char host[256];
    size_t hl = (size_t)(colon - spec);
    if (hl >= sizeof host) return;
    memcpy(host, spec, hl);
    host[hl] = 0;
    const char *port = colon + 1;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) {
        /* A headless Service with no ready pods has no records: not fatal,
         * the next pass may find some. */
        fprintf(stderr, "draft-svc: resolving %s: %s\n", host, gai_strerror(rc));
        return;
    }
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        char ip[INET6_ADDRSTRLEN], addr[300];
        if (a->ai_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)a->ai_addr)->sin_addr, ip, sizeof ip);
            snprintf(addr, sizeof addr, "%s:%s", ip, port);
        } else if (a->ai_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)a->ai_addr)->sin6_addr, ip, sizeof ip);
            snprintf(addr, sizeof addr, "[%s]:%s", ip, port);
        } else {
            continue;
        }
        add_member(p, addr, source);
    }
    freeaddrinfo(res);
}

/* Re-reads every configured entry; members no longer listed leave the pool
 * (sessions on them keep their reference until they end). Caller holds mu.
 * getaddrinfo blocks, but only once per resolve_interval, and a pool lookup
 * that waits behind it is a session start, not a token step. */
static void refresh(specd_tpool *p) {
    int64_t t = specd_now_ms_int();
    if (p->resolved_at_ms && t - p->resolved_at_ms < p->o.resolve_interval_ms) return;
    p->resolved_at_ms = t;
    for (int i = 0; i < p->n; i++) p->m[i]->listed = 0;
    for (int e = 0; e < p->o.n_targets; e++) {
        if (!strncmp(p->targets[e], "dns:", 4) && strncmp(p->targets[e], "dns:///", 7))
            resolve_entry(p, p->targets[e], e);
        else
            add_member(p, p->targets[e], e);
    }
    int k = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->m[i]->listed) {
            p->m[k++] = p->m[i];
        } else {
            fprintf(stderr, "draft-svc: target %s left the pool\n", p->m[i]->addr);
            member_unref(p->m[i]);
        }
    }
    p->n = k;
}

/* ---- compatibility --------------------------------------------------------- */

void specd_target_info_from_pb(const struct Specd__V1__Info *r, specd_target_info *info) {
    memset(info, 0, sizeof *info);
    info->vocab_size = r->vocab_size;
    info->hidden_size = r->hidden_size;
    info->context_length = r->context_length;
    info->max_tree_tokens = r->max_tree_tokens;
    info->max_sessions = r->max_sessions;
    info->queue_wait_ms = r->queue_wait_ms > INT32_MAX ? INT32_MAX : (int)r->queue_wait_ms;
    info->eos_token_id = r->eos_token_id;
    info->bos_token_id = r->bos_token_id;
    for (size_t i = 0; i < r->n_end_token_ids && i < SPECD_TARGET_MAX_END; i++)
        info->end_token_ids[info->n_end_token_ids++] = r->end_token_ids[i];
    snprintf(info->tokenizer_sha256, sizeof info->tokenizer_sha256, "%s",
             r->tokenizer_sha256 ? r->tokenizer_sha256 : "");
    snprintf(info->model_id, sizeof info->model_id, "%s", r->model_id ? r->model_id : "");
    snprintf(info->backend, sizeof info->backend, "%s", r->backend ? r->backend : "");
    /* the curve on our own grid, up to what one pass of the target holds */
    specd_step_cost_init(&info->step_cost, 4096);
    if (r->step_cost) {
        const Specd__V1__StepCost *sc = r->step_cost;
        size_t n = sc->n_batch_tokens < sc->n_forward_us ? sc->n_batch_tokens : sc->n_forward_us;
        for (size_t i = 0; i < n; i++)
            if (sc->batch_tokens[i] >= 1 && sc->batch_tokens[i] <= 1u << 20 &&
                isfinite(sc->forward_us[i]) && sc->forward_us[i] > 0)
                specd_step_cost_load(&info->step_cost, &(int){(int)sc->batch_tokens[i]},
                                     &(double){sc->forward_us[i]}, 1);
    }
}

const char *specd_target_info_mismatch(const specd_tpool_opts *o, const specd_target_info *info) {
    if (o->expect_vocab && info->vocab_size != o->expect_vocab) return "vocab_size";
    if (o->expect_hidden && info->hidden_size != o->expect_hidden) return "hidden_size";
    if (o->expect_tokenizer_sha256 && *o->expect_tokenizer_sha256 &&
        strcmp(info->tokenizer_sha256, o->expect_tokenizer_sha256))
        return "tokenizer_sha256";
    if (info->max_tree_tokens < 1 || info->vocab_size < 1 || info->context_length < 2)
        return "limits";
    return NULL;
}

/* GetInfo and the compatibility check, without the pool lock (it is a
 * network call). 1 = compatible, 0 = incompatible, -1 = unreachable. */
static int check_member(specd_tpool *p, specd_tpool_member *m, specd_target_info *info) {
    Specd__V1__InfoRequest req = SPECD__V1__INFO_REQUEST__INIT;
    Specd__V1__Info *r = NULL;
    specd_error err = {{0}};
    grpc_status_code code =
        specd_rpc_unary(m->ch, "/specd.v1.Target/GetInfo", &req.base, &specd__v1__info__descriptor,
                        (ProtobufCMessage **)&r, p->o.info_timeout_ms, &err);
    if (code != GRPC_STATUS_OK) {
        fprintf(stderr, "draft-svc: target %s: GetInfo: %s\n", m->addr, err.msg);
        return -1;
    }
    specd_target_info_from_pb(r, info);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    const char *why = specd_target_info_mismatch(&p->o, info);
    if (why) {
        fprintf(stderr,
                "draft-svc: target %s (%s) is incompatible: its %s differs from what this "
                "draft-svc expects; not sending it sessions\n",
                m->addr, info->model_id, why);
        return 0;
    }
    return 1;
}

/* ---- public ----------------------------------------------------------------- */

specd_tpool *specd_tpool_create(const specd_tpool_opts *o, specd_error *err) {
    if (o->n_targets < 1) {
        specd_seterr(err, "targets: at least one target address is required");
        return NULL;
    }
    specd_tpool *p = calloc(1, sizeof *p);
    if (!p) {
        specd_seterr(err, "out of memory");
        return NULL;
    }
    p->o = *o;
    if (p->o.resolve_interval_ms <= 0) p->o.resolve_interval_ms = 10000;
    if (p->o.min_backoff_ms <= 0) p->o.min_backoff_ms = 500;
    if (p->o.max_backoff_ms < p->o.min_backoff_ms) p->o.max_backoff_ms = 30000;
    if (p->o.info_timeout_ms <= 0) p->o.info_timeout_ms = 2000;
    /* Own every string the options point to: the caller's config may go. */
    p->targets = calloc((size_t)o->n_targets, sizeof *p->targets);
    p->ca = dup_or_null(o->channel.tls_ca_path);
    p->cert = dup_or_null(o->channel.tls_cert_path);
    p->key = dup_or_null(o->channel.tls_key_path);
    p->server_name = dup_or_null(o->channel.tls_server_name);
    p->o.channel.tls_ca_path = p->ca;
    p->o.channel.tls_cert_path = p->cert;
    p->o.channel.tls_key_path = p->key;
    p->o.channel.tls_server_name = p->server_name;
    p->o.expect_tokenizer_sha256 = dup_or_null(o->expect_tokenizer_sha256);
    p->o.targets = NULL;
    if (!p->targets) goto oom;
    for (int i = 0; i < o->n_targets; i++) {
        if (!o->targets[i] || !*o->targets[i]) {
            specd_seterr(err, "targets[%d]: empty address", i);
            specd_tpool_free(p);
            return NULL;
        }
        if (!(p->targets[i] = strdup(o->targets[i]))) goto oom;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_lock(&p->mu);
    refresh(p);
    pthread_mutex_unlock(&p->mu);
    return p;
oom:
    specd_seterr(err, "out of memory");
    specd_tpool_free(p);
    return NULL;
}

void specd_tpool_free(specd_tpool *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) member_unref(p->m[i]);
    if (p->targets)
        for (int i = 0; i < p->o.n_targets; i++) free(p->targets[i]);
    free(p->targets);
    free(p->ca);
    free(p->cert);
    free(p->key);
    free(p->server_name);
    free((char *)p->o.expect_tokenizer_sha256);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Usable now: up, or unchecked, or down with its backoff over. */
static int usable(const specd_tpool_member *m, int64_t t) {
    if (m->state == MEMBER_INCOMPATIBLE) return 0;
    if (m->state == MEMBER_DOWN) return t >= m->down_until_ms;
    return 1;
}

static void mark_down(specd_tpool *p, specd_tpool_member *m) {
    m->failures++;
    int64_t backoff = p->o.min_backoff_ms;
    for (int i = 1; i < m->failures && backoff < p->o.max_backoff_ms; i++) backoff *= 2;
    if (backoff > p->o.max_backoff_ms) backoff = p->o.max_backoff_ms;
    m->state = MEMBER_DOWN;
    m->down_until_ms = specd_now_ms_int() + backoff;
}

specd_tpool_member *specd_tpool_acquire(specd_tpool *p, const specd_tpool_member *avoid,
                                      specd_error *err) {
    /* Each round picks the best candidate; one that fails its check is
     * marked and the next round picks again, at most once per member. */
    for (int round = 0; round <= POOL_MAX_MEMBERS; round++) {
        pthread_mutex_lock(&p->mu);
        refresh(p);
        int64_t t = specd_now_ms_int();
        specd_tpool_member *best = NULL;
        int best_avoided = 1;
        for (int k = 0; k < p->n; k++) {
            specd_tpool_member *m = p->m[(p->rr + (unsigned)k) % (unsigned)p->n];
            if (!usable(m, t)) continue;
            int avoided = m == avoid;
            /* Prefer not-avoided, then fewest sessions; the rotating start
             * makes ties round robin. */
            if (!best || (best_avoided && !avoided) ||
                (avoided == best_avoided && m->sessions < best->sessions)) {
                best = m;
                best_avoided = avoided;
            }
        }
        if (!best) {
            int n = p->n;
            pthread_mutex_unlock(&p->mu);
            specd_seterr(err, "no target available (%d known, all down or incompatible)", n);
            return NULL;
        }
        p->rr++;
        best->refs++;
        best->sessions++;
        int needs_check = best->state != MEMBER_UP;
        pthread_mutex_unlock(&p->mu);
        if (!needs_check) return best;
        specd_target_info info;
        int ok = check_member(p, best, &info);
        pthread_mutex_lock(&p->mu);
        if (ok == 1) {
            set_info(best, &info);
            best->state = MEMBER_UP;
            best->failures = 0;
            pthread_mutex_unlock(&p->mu);
            return best;
        }
        if (ok == 0)
            best->state = MEMBER_INCOMPATIBLE;
        else
            mark_down(p, best);
        best->sessions--;
        member_unref(best);
        pthread_mutex_unlock(&p->mu);
    }
    specd_seterr(err, "no target available");
    return NULL;
}

void specd_tpool_release(specd_tpool *p, specd_tpool_member *m, int failed) {
    if (!m) return;
    pthread_mutex_lock(&p->mu);
    m->sessions--;
    if (failed && m->state == MEMBER_UP) {
        fprintf(stderr, "draft-svc: target %s failed; retrying it after a backoff\n", m->addr);
        mark_down(p, m);
    }
    member_unref(m);
    pthread_mutex_unlock(&p->mu);
}

specd_rpc_channel *specd_tpool_member_channel(const specd_tpool_member *m) { return m->ch; }
const char *specd_tpool_member_addr(const specd_tpool_member *m) { return m->addr; }
const specd_target_info *specd_tpool_member_info(const specd_tpool_member *m) { return &m->info; }
int specd_tpool_member_sessions(const specd_tpool_member *m) { return atomic_load(&m->sessions); }

void specd_tpool_member_cost(specd_tpool_member *m, int shared, specd_step_cost *out) {
    pthread_mutex_lock(&m->cost_mu);
    *out = m->cost[shared != 0];
    pthread_mutex_unlock(&m->cost_mu);
}

void specd_tpool_member_cost_observe(specd_tpool_member *m, int shared, int batch_tokens,
                                     double forward_us) {
    pthread_mutex_lock(&m->cost_mu);
    specd_step_cost_observe(&m->cost[shared != 0], batch_tokens, forward_us, COST_ALPHA);
    pthread_mutex_unlock(&m->cost_mu);
}

int specd_tpool_any_info(specd_tpool *p, specd_target_info *out, specd_error *err) {
    specd_tpool_member *m = specd_tpool_acquire(p, NULL, err);
    if (!m) return -1;
    *out = m->info;
    pthread_mutex_lock(&p->mu);
    m->sessions--;
    member_unref(m);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int specd_tpool_list_up(specd_tpool *p, char **out, int cap) {
    int k = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n && k < cap; i++)
        if (p->m[i]->state == MEMBER_UP) out[k++] = strdup(p->m[i]->addr);
    pthread_mutex_unlock(&p->mu);
    return k;
}

/* ---- liveness ------------------------------------------------------------------- */

int specd_tpool_members(specd_tpool *p, specd_tpool_member **out, int cap) {
    pthread_mutex_lock(&p->mu);
    refresh(p);
    int k = 0;
    for (int i = 0; i < p->n && k < cap; i++) {
        p->m[i]->refs++;
        out[k++] = p->m[i];
    }
    pthread_mutex_unlock(&p->mu);
    return k;
}

void specd_tpool_member_put(specd_tpool *p, specd_tpool_member *m) {
    pthread_mutex_lock(&p->mu);
    member_unref(m);
    pthread_mutex_unlock(&p->mu);
}

void specd_tpool_note_health(specd_tpool *p, specd_tpool_member *m, int serving) {
    if (!serving) return;
    atomic_store(&m->last_alive_ms, specd_now_ms_int());
    pthread_mutex_lock(&p->mu);
    if (m->state == MEMBER_DOWN) {
        /* Answering again: no reason to wait out the backoff. GetInfo runs
         * again before it gets a session (it may have been replaced by
         * another model). */
        m->state = MEMBER_UNCHECKED;
        m->failures = 0;
    }
    pthread_mutex_unlock(&p->mu);
}

int specd_tpool_check(specd_tpool *p, specd_tpool_member *m) {
    pthread_mutex_lock(&p->mu);
    member_state st = m->state;
    pthread_mutex_unlock(&p->mu);
    if (st == MEMBER_UP) return 1;
    if (st != MEMBER_UNCHECKED) return 0;
    specd_target_info info;
    int ok = check_member(p, m, &info);
    pthread_mutex_lock(&p->mu);
    if (m->state == MEMBER_UNCHECKED) { /* an acquire may have checked it meanwhile */
        if (ok == 1) {
            set_info(m, &info);
            m->state = MEMBER_UP;
            m->failures = 0;
        } else if (ok == 0) {
            m->state = MEMBER_INCOMPATIBLE;
        }
    }
    ok = m->state == MEMBER_UP;
    pthread_mutex_unlock(&p->mu);
    return ok;
}

int64_t specd_tpool_member_last_alive(const specd_tpool_member *m) {
    return atomic_load(&((specd_tpool_member *)m)->last_alive_ms);
}
void specd_tpool_each(specd_tpool *p, void (*fn)(void *arg, const char *addr, int sessions, int up),
                      void *arg) {
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) fn(arg, p->m[i]->addr, p->m[i]->sessions, p->m[i]->state == MEMBER_UP);
    pthread_mutex_unlock(&p->mu);
}
