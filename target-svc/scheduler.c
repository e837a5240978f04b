/* scheduler.c - the model's pass loop and its queue (see scheduler.h).
 *
 * One mutex guards the queue, the slot free list and every item's private
 * fields; it is never held during a forward pass, so sessions can submit
 * (and be cancelled) while the model runs. Each item has its own condition
 * variable so waking one session never wakes the others.
 *
 * Who runs the passes: one thread at a time holds the runner role
 * (s->running) and with it the transformer and the runner buffers. A
 * submitter that finds nobody running takes the role itself and runs
 * passes until its own item is done, then hands what is left to the worker
 * thread. At one stream that is every step: the handler's thread runs its
 * own pass, and the two thread wake-ups of a hand-off (to the worker and
 * back) are gone, which on a VM whose idle vCPUs halt cost 60-80 us of a
 * 2-3 ms step. Under load a runner is usually busy, so items queue and
 * ride its passes as before. */
#include "target-svc/scheduler.h"
#include "common/util/thread_name.h"

#include "target-svc/target_metrics.h"
#include "common/util/clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How often a waiting submitter re-checks its call's cancellation probe. */
#define CANCEL_POLL_MS 10
/* How often a runner whose queue waits for KV pages looks again (a
 * slot's release also wakes it). */
#define PAGE_POLL_MS 10

struct specd_sched {
    specd_transformer *t;
    specd_sched_opts o;
    int vocab, dim, n_slots;

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the worker sleeps here while the queue is empty or someone
                             * else runs; a runner waits here for a batch to fill */
    pthread_t worker;
    int stop, started;
    specd_work *head, *tail; /* FIFO: older items get the budget first */
    int queued_tokens;       /* tokens still to be run by queued items */
    int *free_slots, n_free;
    /* Admission order of each slot's session (larger = younger): the
     * youngest waiting session is the one preempted in a page deadlock. */
    uint64_t *slot_seq, next_seq;
    int running;                   /* a thread holds the runner role (see the top) */
    int in_pass;                   /* the runner is inside a forward pass */
    int64_t t_pass_end_us;         /* when the last pass's results went out */
    double prefill_us_per_tok;     /* the last pass with prompt work: time / tokens */
    pthread_cond_t pass_cv;        /* signalled when a pass ends */
    specd_kv_pool_stats kv_stats;  /* as of the last pass or idle release */
    specd_step_cost cost;          /* forward time by pass size (step_cost.h) */
    /* slots given back whose KV pages are yet to go back to the pool (the
     * transformer belongs to the runner alone) */
    int *released, n_released;

    /* The prefix cache's running totals at the last pass (metrics count
     * what is new since). */
    specd_kv_pool_stats metrics_seen;

    /* The runner's buffers, grown on demand. */
    int32_t *tokens, *out_rows;
    specd_seq_input *seqs;
    specd_work **items;
    int *item_rows;   /* first output row of each item in the pass (-1: none) */
    int *rcs;         /* each item's result in the pass */
    float *logits, *hidden;
    /* Per pass: when no item needs whole rows of logits (greedy, no
     * penalties or bias, no log-probabilities), the device computes each
     * output row's argmax and only those ids cross to the host. */
    int32_t *argmax;
    int pass_ids;
    size_t out_cap;
    uint8_t *mask;    /* trees' masks, back to back */
    int32_t *pos;
    int32_t *kept;
    void *scratch;
};

/* Weight of each pass in the cost curve: a pass lands in one of a few
 * dozen grid points, and a few dozen passes there make its estimate. */
#define COST_ALPHA 0.05

/* Items waiting in the queue (a handful: at most one per session). */
static int queued_items(const specd_sched *s) {
    int n = 0;
    for (const specd_work *w = s->head; w; w = w->next) n++;
    return n;
}

/* Tokens the next pass would carry if it ran now: every queued decode and
 * tree item, plus prompts up to the chunk. (queued_tokens counts whole
 * prompts, which would make a long prompt look like a full pass.) */
static int pass_tokens(const specd_sched *s) {
    int steps = 0, prompts = 0;
    for (const specd_work *w = s->head; w; w = w->next) {
        if (w->kind == SPECD_WORK_PREFILL) prompts += w->n_tokens - w->n_done;
        else steps += w->n_tokens - w->n_done;
    }
    return steps + (prompts < s->o.prefill_chunk ? prompts : s->o.prefill_chunk);
}

/* Condition variables use CLOCK_MONOTONIC so a wall-clock jump cannot stretch
 * a wait. */
static void abs_in_us(struct timespec *ts, int64_t us) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    int64_t ns = ts->tv_nsec + (us % 1000000) * 1000;
    ts->tv_sec += us / 1000000 + ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
}

static void cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* Tokens an item still needs to run. */
static int remaining(const specd_work *w) { return w->n_tokens - w->n_done; }

static void unlink_item(specd_sched *s, specd_work *w) {
    specd_work **pp = &s->head, *prev = NULL;
    while (*pp && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = w->next;
    if (s->tail == w) s->tail = prev;
    w->next = NULL;
    s->queued_tokens -= remaining(w);
}

/* Marks an item finished and wakes its session. Holds mu. */
static void complete(specd_work *w, int rc) {
    w->rc = rc;
    w->done = 1;
    w->in_flight = 0;
    pthread_cond_signal(&w->cv);
}

static int grow_out(specd_sched *s, size_t rows) {
    if (rows <= s->out_cap) return 0;
    size_t cap = rows * 2;
    int32_t *a = realloc(s->argmax, cap * sizeof(int32_t));
    if (!a) return -1;
    s->argmax = a;
    float *l = realloc(s->logits, cap * (size_t)s->vocab * sizeof(float));
    if (!l) return -1;
    s->logits = l;
    float *h = realloc(s->hidden, cap * (size_t)s->dim * sizeof(float));
    if (!h) return -1;
    s->hidden = h;
    s->out_cap = cap;
    return 0;
}

/* Post-processing of one item whose last tokens rode in this pass; rows are
 * its output rows starting at `row`. */
static int finish_item(specd_sched *s, specd_work *w, int row) {
    const float *logits = s->logits + (size_t)row * s->vocab;
    int out_row = row;
    if (w->kind == SPECD_WORK_TREE) {
        specd_verify_result res = {.accepted = w->accepted, .kept_rows = s->kept};
        int rc = s->pass_ids ? specd_verify_walk_greedy(w->tree, s->argmax + row, &res, &w->err)
                             : specd_verify_walk(w->tree, logits, s->vocab, w->sampling,
                                                 w->counts, w->position, s->scratch, &res,
                                                 &w->err);
        if (rc) return -1;
        /* Emitted token i came from row kept[i] (the pending token's row for
         * the first, then each accepted node's row): the same raw logits a
         * plain decode of that position would produce. */
        if (w->logprobs)
            for (int i = 0; i <= res.n_accepted; i++)
                specd_token_logprob_fill(&w->logprobs[i], logits + (size_t)s->kept[i] * s->vocab,
                                         s->vocab,
                                         i < res.n_accepted ? res.accepted[i] : res.next_token,
                                         w->top_logprobs);
        /* The cache keeps pending + the accepted path only: rows are moved in
         * place, nothing is recomputed. */
        if (specd_transformer_kv_compact(s->t, w->slot, w->n_past, s->kept, 1 + res.n_accepted,
                                         &w->err))
            return -1;
        for (int i = 0; i < res.n_accepted; i++) w->accepted_nodes[i] = s->kept[1 + i] - 1;
        w->n_accepted = res.n_accepted;
        w->next_token = res.next_token;
        out_row = row + res.next_row;
    } else {
        w->n_accepted = 0;
        w->next_token = s->pass_ids ? s->argmax[row]
                                    : specd_decode_token(logits, s->vocab, w->sampling, w->counts,
                                                         w->position, s->scratch);
        if (w->logprobs)
            specd_token_logprob_fill(&w->logprobs[0], logits, s->vocab, w->next_token,
                                     w->top_logprobs);
    }
    if (w->hidden)
        memcpy(w->hidden, s->hidden + (size_t)out_row * s->dim, sizeof(float) * (size_t)s->dim);
    return 0;
}

/* Whether the item's step needs its rows' whole logits on the host. */
static int needs_logits(const specd_work *w) {
    return w->sampling->temperature > 0.0f || specd_sampling_adjusts_logits(w->sampling) ||
           w->logprobs != NULL;
}

/* Whether the item is past its first pass: a new prompt (a new session's or
 * a re-open's) is not, and waits in the admission queue (queue_wait_ms);
 * everything else is a running session's step (kv_wait_ms). */
static int started(const specd_work *w) {
    return w->kind != SPECD_WORK_PREFILL || w->admitted == 2;
}

static int64_t wait_bound_us(const specd_sched *s, const specd_work *w) {
    return (int64_t)(started(w) ? s->o.kv_wait_ms : s->o.queue_wait_ms) * 1000;
}

/* Fails an item that could not get KV pages (see the policy in scheduler.h):
 * a new prompt whose queue wait ran out (queued), or a session preempted.
 * Holds mu. */
static void fail_no_pages(specd_sched *s, specd_work *w, int need, int avail, int64_t now,
                          int queued) {
    specd_kv_pool_stats st;
    specd_transformer_kv_stats(s->t, &st);
    if (queued)
        specd_seterr(&w->err, "KV pool busy: a prompt of %d tokens waited %lld ms in the queue "
                              "for %d pages of %d rows to start (%d of %d available, %d sessions "
                              "active); nothing was started (limits.queue_wait, limits.kv_memory)",
                     w->n_tokens, (long long)((now - w->t_blocked_us) / 1000), need,
                     SPECD_KV_PAGE_ROWS, avail, st.n_pages, s->n_slots - s->n_free);
    else
        specd_seterr(&w->err, "KV pool full: waited %lld ms for %d pages of %d rows (%d of %d "
                              "available, %d sessions active); the session was preempted and can "
                              "be re-opened from its tokens (limits.kv_memory, limits.kv_wait)",
                     (long long)((now - w->t_blocked_us) / 1000), need, SPECD_KV_PAGE_ROWS,
                     avail, st.n_pages, s->n_slots - s->n_free);
    specd_target_metrics_no_pages(queued);
    unlink_item(s, w);
    complete(w, SPECD_WORK_NO_PAGES);
}

typedef struct gather_state {
    int n_tok, n_items, n_out, prefill_left, blocked;
    int prompt_waiting; /* a new prompt is waiting for pages: younger ones queue behind it */
    /* Pages that started prompts still need for the rest of their prompt,
     * beyond what this pass gives them: promised, so a new prompt is
     * started only if it fits beside them (else two prompts started
     * together could run the pool dry halfway and be preempted). */
    int pending;
    /* Sessions holding pages (they may grow by a page while a new prompt
     * prefills: each gets one in reserve). Sessions that only hold a slot,
     * new prompts waiting in the queue among them, need no reserve: with
     * 64 queued prompts a pool of one whole context could otherwise never
     * start a long one. */
    int growing;
    int used; /* pages the items gathered so far will take from the pool */
    size_t mask_off;
} gather_state;

/* Adds `take` tokens of the item to the pass. Holds mu. Returns -1 when the
 * output buffers cannot grow (out of memory: run what is gathered). */
static int add_item(specd_sched *s, gather_state *g, specd_work *w, int take) {
    int last = w->n_done + take == w->n_tokens; /* produces output this pass */
    int rows = !last ? 0 : (w->kind == SPECD_WORK_TREE ? w->n_tokens : 1);
    if (grow_out(s, (size_t)(g->n_out + rows))) return -1;
    specd_seq_input *in = &s->seqs[g->n_items];
    *in = (specd_seq_input){.slot = w->slot, .n_past = w->n_past + w->n_done, .n_new = take};
    memcpy(s->tokens + g->n_tok, w->tokens + w->n_done, sizeof(int32_t) * (size_t)take);
    if (w->kind == SPECD_WORK_TREE) {
        uint8_t *mask = s->mask + g->mask_off;
        int32_t *pos = s->pos + g->n_tok;
        specd_tree_mask(w->tree, w->n_past, mask, pos);
        in->mask = mask;
        in->pos = pos;
        g->mask_off += (size_t)take * (size_t)take;
    }
    s->item_rows[g->n_items] = rows ? g->n_out : -1;
    for (int r = 0; r < rows; r++)
        s->out_rows[g->n_out + r] = g->n_tok + (w->kind == SPECD_WORK_TREE ? r : take - 1);
    g->n_out += rows;
    if (rows && needs_logits(w)) s->pass_ids = 0;
    s->items[g->n_items] = w;
    w->in_flight = take;
    w->active_sessions = (uint32_t)(s->n_slots - s->n_free);
    g->n_tok += take;
    g->n_items++;
    return 0;
}

/* Whether the item may join the pass: its kind belongs to this round and it
 * gets pages. Decides the chunk (*take). Holds mu. Returns 1 to take it,
 * 0 to leave it queued. */
static int admit(specd_sched *s, gather_state *g, specd_work *w, int prefill_round, int *take,
                 int64_t now) {
    if ((w->kind == SPECD_WORK_PREFILL) != prefill_round) return 0;
    int room = s->o.max_batch_tokens - g->n_tok;
    int n = remaining(w);
    /* in g->growing already: it held pages when the pass began (a prefix
     * attached on an earlier look) */
    int counted = w->admitted && specd_transformer_slot_pages(s->t, w->slot) > 0;
    if (prefill_round) {
        if (!started(w) && g->prompt_waiting) {
            /* first come, first served: behind an older prompt that waits */
            if (!w->t_blocked_us) w->t_blocked_us = now;
            g->blocked++;
            return 0;
        }
        if (!w->admitted && w->n_past == 0) {
            /* First look: share the cached pages of its prefix. The slot is
             * fresh (its previous owner's pages went back at gather start). */
            int rows = specd_transformer_prefix_attach(s->t, w->slot, w->tokens, w->n_tokens);
            int avail;
            specd_transformer_kv_pages(s->t, &avail, NULL);
            if (avail < g->used) {
                /* The attach took cached pages that items already in this
                 * pass count on: give them back and try in a later pass. */
                specd_transformer_release_slot(s->t, w->slot);
                if (!w->t_blocked_us) w->t_blocked_us = now;
                g->blocked++;
                g->prompt_waiting = 1;
                return 0;
            }
            w->n_done += rows;
            w->cached_tokens = (uint32_t)rows;
            s->queued_tokens -= rows;
            n = remaining(w);
        }
        if (!w->admitted) w->admitted = 1;
        if (room > g->prefill_left) room = g->prefill_left;
        if (room <= 0) return 0;
        if (n > room) n = room;
    } else if (n > room) {
        /* Only a prompt can be split; a tree or decode step waits for a pass
         * with room (create checks every tree fits an empty pass). */
        return 0;
    }
    int need = specd_transformer_pages_needed(s->t, w->slot, w->n_past + w->n_done, n);
    int reserve = 0;
    int whole = 0;
    if (prefill_round && w->admitted == 1) {
        /* A prompt not yet started: its whole remainder, a page for each
         * other running session to grow into, and what started prompts
         * still need. */
        whole = need = specd_transformer_pages_needed(s->t, w->slot, w->n_past + w->n_done,
                                                      remaining(w));
        reserve = g->growing - counted + g->pending;
    }
    /* available now: a prefix attach above may just have taken cached pages */
    int avail;
    specd_transformer_kv_pages(s->t, &avail, NULL);
    avail -= g->used;
    if (need + reserve > avail) {
        if (!w->t_blocked_us) w->t_blocked_us = now;
        g->blocked++;
        if (!started(w)) g->prompt_waiting = 1;
        return 0;
    }
    int chunk = specd_transformer_pages_needed(s->t, w->slot, w->n_past + w->n_done, n);
    g->used += chunk;
    /* a started prompt's chunk comes out of its promise; a new one promises the rest */
    if (prefill_round) {
        if (w->admitted == 1 && !counted) g->growing++;
        g->pending += w->admitted == 2 ? -chunk : whole - chunk;
    }
    w->t_blocked_us = 0;
    if (prefill_round) w->admitted = 2; /* started: later chunks need no reserve */
    *take = n;
    return 1;
}

/* Prompt tokens the pass may carry (round 1 of gather, after the steps):
 * prefill_chunk, cut to prefill_chunk_ms of work when some other session
 * is decoding (it has an item in this pass, or is open with nothing queued
 * because its next step is on the way). The cost per token is the last
 * prompt pass's; before any, the start-up cost curve's at prefill_chunk. */
static int prefill_budget(const specd_sched *s, const gather_state *g) {
    int left = s->o.prefill_chunk;
    if (s->o.prefill_chunk_ms <= 0) return left;
    int prompts = 0;
    for (const specd_work *w = s->head; w; w = w->next) prompts += w->kind == SPECD_WORK_PREFILL;
    if (g->n_items == 0 && s->n_slots - s->n_free <= prompts) return left; /* prompts alone */
    double rate = s->prefill_us_per_tok;
    if (!(rate > 0)) rate = specd_step_cost_at(&s->cost, left) / left;
    if (!(rate > 0)) return left;
    double fit = (double)s->o.prefill_chunk_ms * 1000.0 / rate;
    if (fit < SPECD_MIN_PREFILL_CHUNK) fit = SPECD_MIN_PREFILL_CHUNK;
    return fit < left ? (int)fit : left;
}

/* Gathers queued items into one batch under the token budget: decode and
 * tree items first, then prompt chunks (see scheduler.h). Holds mu. Returns
 * the number of items; fills the runner buffers. */
static int gather(specd_sched *s, int *n_tokens_out, int *n_out_out) {
    while (s->n_released > 0) specd_transformer_release_slot(s->t, s->released[--s->n_released]);
    s->pass_ids = 1;
    int64_t now = specd_now_us_int();
    gather_state g = {.prefill_left = s->o.prefill_chunk};
    for (int i = 0; i < s->n_slots; i++) g.growing += specd_transformer_slot_pages(s->t, i) > 0;
    for (const specd_work *w = s->head; w; w = w->next)
        if (w->kind == SPECD_WORK_PREFILL && w->admitted == 2)
            g.pending += specd_transformer_pages_needed(s->t, w->slot, w->n_past + w->n_done,
                                                        remaining(w));
    int avail;
    for (int round = 0; round < 2; round++) {
        if (round == 1) g.prefill_left = prefill_budget(s, &g);
        specd_work *w = s->head;
        while (w && g.n_tok < s->o.max_batch_tokens) {
            specd_work *next = w->next;
            int take = 0;
            if (w->in_flight) {
                /* already in this pass (taken in round 0): the runner will
                 * use it, so neither a cancel nor a page wait may complete
                 * it now (its owner would return and free it mid-pass) */
            } else if (w->is_cancelled && w->is_cancelled(w->cancel_arg)) {
                /* Dropped before it costs model time; the session returns at once. */
                unlink_item(s, w);
                complete(w, SPECD_WORK_CANCELLED);
            } else if (admit(s, &g, w, round, &take, now)) {
                if (add_item(s, &g, w, take)) break;
            } else if (w->t_blocked_us && now - w->t_blocked_us > wait_bound_us(s, w)) {
                specd_transformer_kv_pages(s->t, &avail, NULL);
                fail_no_pages(s, w, specd_transformer_pages_needed(
                                        s->t, w->slot, w->n_past + w->n_done, remaining(w)),
                              avail - g.used, now, !started(w));
            }
            w = next;
        }
    }
    if (g.n_items == 0 && g.blocked && queued_items(s) >= s->n_slots - s->n_free) {
        /* Every session waits for pages: none will ever be freed. The
         * youngest session holding some gives them back. */
        specd_work *young = NULL;
        for (specd_work *w = s->head; w; w = w->next)
            if (w->t_blocked_us && specd_transformer_slot_pages(s->t, w->slot) > 0 &&
                (!young || s->slot_seq[w->slot] > s->slot_seq[young->slot]))
                young = w;
        specd_transformer_kv_pages(s->t, &avail, NULL);
        if (young)
            fail_no_pages(s, young, specd_transformer_pages_needed(
                                        s->t, young->slot, young->n_past + young->n_done,
                                        remaining(young)),
                          avail, now, 0);
    }
    *n_tokens_out = g.n_tok;
    *n_out_out = g.n_out;
    return g.n_items;
}

/* One round of the pass loop, by whichever thread holds the runner role
 * (s->running): wait briefly for a small batch to fill, gather, run the
 * forward pass, post-process every item and wake its session. Holds mu on
 * entry and exit; releases it for the pass itself. */
static void run_round(specd_sched *s) {
    /* A small batch waits a little for others to join: bigger passes
     * mean more throughput, max_wait bounds the latency it costs. But
     * only while some session holding a slot has nothing queued: when
     * every open session is already in the batch nobody else can join,
     * and waiting would only add latency to every step (a lone session
     * would pay max_wait per token).
     * The wait counts from the later of the oldest item's arrival and the
     * end of the last pass: a session cannot send its next step before
     * it has the last one's answer, so while a long prompt is being
     * prefilled chunk by chunk (its item queued since long ago) the
     * running streams still get max_wait to join the next chunk's pass,
     * instead of missing it and waiting a whole chunk more. */
    if (s->o.max_wait_ms > 0 && pass_tokens(s) < s->o.max_batch_tokens &&
        queued_items(s) < s->n_slots - s->n_free) {
        struct timespec until;
        int64_t since = s->head->t_submit_us > s->t_pass_end_us ? s->head->t_submit_us
                                                               : s->t_pass_end_us;
        int64_t left = (int64_t)s->o.max_wait_ms * 1000 - (specd_now_us_int() - since);
        if (left > 0) {
            abs_in_us(&until, left);
            while (!s->stop && pass_tokens(s) < s->o.max_batch_tokens &&
                   queued_items(s) < s->n_slots - s->n_free &&
                   pthread_cond_timedwait(&s->work_cv, &s->mu, &until) != ETIMEDOUT) {
            }
        }
        if (s->stop) return;
    }
    int n_tok, n_out;
    int n_items = gather(s, &n_tok, &n_out);
    if (n_items == 0) {
        /* Everything queued was cancelled, or waits for KV pages: look
         * again when a slot is released or work arrives, or after a
         * short while (the page wait bound runs on). */
        if (s->head) {
            struct timespec until;
            abs_in_us(&until, (int64_t)PAGE_POLL_MS * 1000);
            pthread_cond_timedwait(&s->work_cv, &s->mu, &until);
        }
        return;
    }
    s->in_pass = 1;
    pthread_mutex_unlock(&s->mu);

    int64_t t0 = specd_now_us_int();
    specd_error err = {{0}};
    specd_batch b = {.n_tokens = n_tok, .tokens = s->tokens, .n_seqs = n_items,
                     .seqs = s->seqs, .n_out = n_out, .out_rows = s->out_rows,
                     .logits = s->pass_ids ? NULL : s->logits,
                     .argmax = s->pass_ids ? s->argmax : NULL, .hidden = s->hidden};
    int frc = specd_transformer_forward(s->t, &b, &err);
    uint32_t fwd_us = (uint32_t)(specd_now_us_int() - t0);
    /* cost is written under mu only, and only by the runner, which this
     * thread is, so reading it here without the lock is safe */
    uint32_t est_us = (uint32_t)specd_step_cost_at(&s->cost, n_tok);
    /* the pass's draft nodes (trees ride whole, never split), which
     * each drafter counts as tokens the pass is expected to add */
    uint32_t draft_rows = 0, prompt_rows = 0;
    for (int i = 0; i < n_items; i++) {
        if (s->items[i]->kind == SPECD_WORK_TREE)
            draft_rows += (uint32_t)s->items[i]->tree->n_nodes;
        else if (s->items[i]->kind == SPECD_WORK_PREFILL)
            prompt_rows += (uint32_t)s->items[i]->in_flight;
    }
    specd_target_metrics_pass(s->t, n_tok, fwd_us, !frc, &s->metrics_seen);
    int *rcs = s->rcs;
    for (int i = 0; i < n_items; i++) {
        specd_work *w = s->items[i];
        rcs[i] = SPECD_WORK_OK;
        if (frc) { /* the forward pass left every cache untouched */
            w->err = err;
            rcs[i] = SPECD_WORK_FAILED;
        } else if (w->kind == SPECD_WORK_PREFILL && w->n_past == 0) {
            /* The prompt's full pages computed so far become findable. */
            specd_transformer_prefix_publish(s->t, w->slot, w->tokens,
                                             w->n_past + w->n_done + w->in_flight);
        }
        if (!frc && s->item_rows[i] >= 0) {
            w->queue_us = (uint32_t)(t0 - w->t_submit_us);
            w->forward_us = fwd_us;
            w->batch_tokens = (uint32_t)n_tok;
            w->est_forward_us = est_us;
            w->draft_tokens = draft_rows;
            w->prompt_tokens = prompt_rows;
            if (finish_item(s, w, s->item_rows[i])) rcs[i] = SPECD_WORK_FAILED;
        }
    }

    pthread_mutex_lock(&s->mu);
    if (!frc) specd_step_cost_observe(&s->cost, n_tok, fwd_us, COST_ALPHA);
    int had_prompt = 0;
    for (int i = 0; i < n_items; i++) had_prompt |= s->items[i]->kind == SPECD_WORK_PREFILL;
    if (!frc && had_prompt) s->prefill_us_per_tok = (double)fwd_us / n_tok;
    specd_transformer_kv_stats(s->t, &s->kv_stats);
    s->in_pass = 0;
    s->t_pass_end_us = specd_now_us_int();
    pthread_cond_broadcast(&s->pass_cv);
    for (int i = 0; i < n_items; i++) {
        specd_work *w = s->items[i];
        int took = w->in_flight;
        w->in_flight = 0;
        if (rcs[i] == SPECD_WORK_OK && s->item_rows[i] < 0) {
            /* A prompt chunk: the rest stays queued for the next pass. */
            w->n_done += took;
            s->queued_tokens -= took;
            continue;
        }
        unlink_item(s, w);
        complete(w, rcs[i]);
    }
}

/* Fails whatever is still queued: nobody will run it. Holds mu. */
static void drain(specd_sched *s) {
    while (s->head) {
        specd_work *w = s->head;
        unlink_item(s, w);
        specd_seterr(&w->err, "target is shutting down");
        complete(w, SPECD_WORK_FAILED);
    }
}

/* The worker runs passes whenever work is queued and no submitter is running
 * them itself (specd_sched_run), and hands idle slots' pages back. */
static void *worker_main(void *arg) {
    specd_sched *s = arg;
    specd_thread_name("sched");
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while ((!s->head || s->running) && !s->stop) {
            /* Idle with slots given back: their pages go back to the pool
             * now rather than at the next request's pass, so GetInfo and
             * the page gauges show an idle target's pool as it is. Never
             * while a submitter runs passes: the transformer is the
             * runner's alone. */
            if (!s->running && s->n_released > 0) {
                while (s->n_released > 0)
                    specd_transformer_release_slot(s->t, s->released[--s->n_released]);
                specd_transformer_kv_stats(s->t, &s->kv_stats);
                continue;
            }
            pthread_cond_wait(&s->work_cv, &s->mu);
        }
        if (s->stop) break;
        s->running = 1;
        run_round(s);
        s->running = 0;
    }
    /* Shutdown: a submitter inside a pass finishes it first; then nobody
     * will run what is left. */
    while (s->running) pthread_cond_wait(&s->work_cv, &s->mu);
    drain(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

#define CALIBRATE_ROUNDS 5
/* Cached tokens before the timed rows. Short on purpose: a pass of n > 1
 * rows costs more per row as the context grows (on a 2-core AMD EPYC, 2
 * rows cost 1.18x one row at 100 cached tokens and 1.5x at 256), and the
 * curve must err on the cheap side. A curve that prices trees too high is
 * never corrected: the session stops drafting, so no multi-row pass is
 * ever observed. One that prices them too low is: the trees it sends are
 * timed and folded in (specd_step_cost_observe) on both services. */
#define CALIBRATE_CONTEXT 64

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One pass of n tokens of one sequence after ctx cached ones, every row's
 * argmax out (the shape of a tree step); microseconds, or -1 on failure. */
static double calibrate_pass(specd_sched *s, int slot, int ctx, const int32_t *toks, int n,
                             specd_error *err) {
    specd_seq_input seq = {.slot = slot, .n_past = ctx, .n_new = n};
    specd_batch b = {.n_tokens = n, .tokens = toks, .n_seqs = 1, .seqs = &seq, .n_out = n,
                     .out_rows = s->out_rows, .argmax = s->argmax};
    int64_t t0 = specd_now_us_int();
    if (specd_transformer_forward(s->t, &b, err)) return -1;
    return (double)(specd_now_us_int() - t0);
}

/* Times one sequence of n tokens at each grid point up to max_n, after a
 * context of CALIBRATE_CONTEXT tokens, before the worker starts. The
 * context matters: each row attends to it, so on an empty cache extra rows
 * look cheaper than they are in a running session.
 *
 * The sizes are timed in CALIBRATE_ROUNDS interleaved rounds and each
 * point keeps its median. Draft-svc prices a tree by the RATIO of these
 * points, and a shared machine slows down in bursts: timed one size after
 * another, a burst lands on some sizes only. On a 2-core VM, timed one
 * after the other at 256 cached tokens, a 2-token pass was priced at 1.44x
 * a 1-token one, where the served 2-token steps of a session took 1.08x:
 * the mlp drafter stopped drafting. The rounds go up (1, 2, ..., max_n)
 * and back down, so that every pass follows one of about its own size: a
 * pass right after a much larger one runs slow (the memory side lags for
 * tens of milliseconds after compute-bound work, bench/bench_step_lag.c),
 * and with every round going up, the 1-token pass came right after the
 * 64-token one and was priced at 3.7-4.1 ms where a run of them takes
 * 2.1-2.3 (2-vCPU Xeon VM): 5 tokens then cost 0.93-0.97x of 1, trees looked
 * free. Up and down: 1 token 2.11-2.23 ms, 2 tokens 1.10-1.13x, 5 tokens
 * 1.60-1.62x, as `specd bench --verify` measures them.
 *
 * Every pass rewrites the rows after the context; the slot is emptied at
 * the end and nothing is published to the prefix cache. A point whose
 * passes fail stays unmeasured (the curve then fills from real passes). */
static void calibrate(specd_sched *s, int max_n) {
    if (max_n > s->o.max_batch_tokens) max_n = s->o.max_batch_tokens;
    int slot = s->free_slots[s->n_free - 1];
    int ctx = CALIBRATE_CONTEXT;
    if (ctx > specd_transformer_max_ctx(s->t) - max_n) ctx = specd_transformer_max_ctx(s->t) - max_n;
    if (ctx < 0) ctx = 0;
    int n_tok = ctx > max_n ? ctx : max_n;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_tok);
    double(*us)[CALIBRATE_ROUNDS] = calloc((size_t)s->cost.n, sizeof *us);
    int *ok = calloc((size_t)s->cost.n, sizeof(int));
    if (!toks || !us || !ok) goto out;
    for (int i = 0; i < n_tok; i++) toks[i] = (int32_t)((1 + 7 * i) % s->vocab);
    specd_error err = {{0}};
    /* the context, in passes the batch holds */
    for (int done = 0; done < ctx;) {
        int n = ctx - done < s->o.max_batch_tokens ? ctx - done : s->o.max_batch_tokens;
        specd_seq_input seq = {.slot = slot, .n_past = done, .n_new = n};
        int32_t last = n - 1;
        if (grow_out(s, 1)) goto out;
        specd_batch b = {.n_tokens = n, .tokens = toks + done, .n_seqs = 1, .seqs = &seq,
                         .n_out = 1, .out_rows = &last, .argmax = s->argmax};
        if (specd_transformer_forward(s->t, &b, &err)) goto out;
        done += n;
    }
    int n_pts = 0;
    while (n_pts < s->cost.n && s->cost.tokens[n_pts] <= max_n) n_pts++;
    if (n_pts == 0 || grow_out(s, (size_t)s->cost.tokens[n_pts - 1])) goto out;
    for (int i = 0; i < max_n; i++) s->out_rows[i] = i;
    /* Untimed passes first: the backend's warm_passes for every size (CUDA
     * runs a shape eagerly the first time and records its graph the second:
     * timing those priced a 2-token pass at 3.5x a 1-token one on an H100,
     * where the bench measured 1.0x), and at least one before the very first
     * timing, which pays for page faults and cold caches. */
    int warm = specd_transformer_backend(s->t)->warm_passes;
    for (int p = 0; p < n_pts; p++)
        for (int r = 0; r < (p == 0 && warm < 1 ? 1 : warm); r++)
            calibrate_pass(s, slot, ctx, toks, s->cost.tokens[p], &err);
    for (int r = 0; r < CALIBRATE_ROUNDS; r++)
        for (int i = 0; i < n_pts; i++) {
            const int p = r % 2 ? n_pts - 1 - i : i; /* up, then down: see above */
            double t = calibrate_pass(s, slot, ctx, toks, s->cost.tokens[p], &err);
            if (t >= 0) us[p][ok[p]++] = t;
        }
    for (int p = 0; p < n_pts; p++) {
        if (ok[p] < CALIBRATE_ROUNDS) continue;
        qsort(us[p], CALIBRATE_ROUNDS, sizeof us[p][0], cmp_double);
        s->cost.us[p] = us[p][CALIBRATE_ROUNDS / 2];
    }
out:
    specd_transformer_release_slot(s->t, slot);
    free(toks);
    free(us);
    free(ok);
}

void specd_sched_step_cost(specd_sched *s, specd_step_cost *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->cost;
    pthread_mutex_unlock(&s->mu);
}

specd_sched *specd_sched_create(specd_transformer *t, const specd_sched_opts *o,
                                specd_error *err) {
    if (!t || !o || o->max_batch_tokens < 1 || o->max_wait_ms < 0 || o->n_slots < 1 ||
        o->prefill_chunk < 0 || o->prefill_chunk_ms < 0 || o->kv_wait_ms < 0 ||
        o->queue_wait_ms < 0) {
        specd_seterr(err, "scheduler: bad options");
        return NULL;
    }
    specd_sched *s = calloc(1, sizeof *s);
    if (!s) {
        specd_seterr(err, "scheduler: out of memory");
        return NULL;
    }
    const specd_llama_hparams *hp = specd_transformer_hparams(t);
    s->t = t;
    s->o = *o;
    if (!s->o.prefill_chunk || s->o.prefill_chunk > s->o.max_batch_tokens)
        s->o.prefill_chunk = s->o.max_batch_tokens;
    if (!s->o.kv_wait_ms) s->o.kv_wait_ms = 30000;
    if (!s->o.queue_wait_ms) s->o.queue_wait_ms = 600000;
    specd_transformer_kv_stats(t, &s->kv_stats);
    s->vocab = hp->vocab_size;
    s->dim = hp->dim;
    /* Every slot starts free; popping from the end hands out slot 0 first. */
    s->n_slots = o->n_slots;
    s->free_slots = malloc(sizeof(int) * (size_t)o->n_slots);
    if (s->free_slots)
        for (int i = 0; i < o->n_slots; i++) s->free_slots[i] = o->n_slots - 1 - i;
    s->n_free = o->n_slots;
    s->released = malloc(sizeof(int) * (size_t)o->n_slots);
    s->slot_seq = calloc((size_t)o->n_slots, sizeof(uint64_t));
    int B = o->max_batch_tokens;
    s->tokens = malloc(sizeof(int32_t) * (size_t)B);
    s->out_rows = malloc(sizeof(int32_t) * (size_t)B);
    s->seqs = malloc(sizeof(specd_seq_input) * (size_t)B);
    s->items = malloc(sizeof(specd_work *) * (size_t)B);
    s->item_rows = malloc(sizeof(int) * (size_t)B);
    s->rcs = malloc(sizeof(int) * (size_t)B);
    s->pos = malloc(sizeof(int32_t) * (size_t)B);
    s->kept = malloc(sizeof(int32_t) * (size_t)B);
    /* Masks of all trees in a pass: sum of n^2 over trees <= B^2. */
    s->mask = malloc((size_t)B * (size_t)B);
    /* A tree rides in one pass with its pending token: at most B - 1 nodes.
     * This size also covers specd_decode_token. */
    s->scratch = malloc(specd_verify_scratch_size(s->vocab, B > 1 ? B - 1 : 1));
    if (!s->tokens || !s->out_rows || !s->seqs || !s->items || !s->item_rows || !s->rcs || !s->pos ||
        !s->kept || !s->mask || !s->scratch || !s->free_slots || !s->released || !s->slot_seq || grow_out(s, 1)) {
        specd_seterr(err, "scheduler: out of memory");
        specd_sched_free(s);
        return NULL;
    }
    specd_step_cost_init(&s->cost, s->o.max_batch_tokens);
    if (o->calibrate_tokens > 0) calibrate(s, o->calibrate_tokens);
    pthread_mutex_init(&s->mu, NULL);
    cond_init(&s->work_cv);
    cond_init(&s->pass_cv);
    if (pthread_create(&s->worker, NULL, worker_main, s)) {
        specd_seterr(err, "scheduler: cannot start the model worker");
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        pthread_cond_destroy(&s->pass_cv);
        specd_sched_free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

void specd_sched_free(specd_sched *s) {
    if (!s) return;
    if (s->started) { /* fully created: stop and join the worker */
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->work_cv); /* the worker, and a runner filling a batch */
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->worker, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        pthread_cond_destroy(&s->pass_cv);
    }
    free(s->tokens);
    free(s->out_rows);
    free(s->seqs);
    free(s->items);
    free(s->item_rows);
    free(s->rcs);
    free(s->pos);
    free(s->kept);
    free(s->mask);
    free(s->scratch);
    free(s->logits);
    free(s->hidden);
    free(s->argmax);
    free(s->free_slots);
    free(s->released);
    free(s->slot_seq);
    free(s);
}

int specd_sched_acquire_slot(specd_sched *s) {
    pthread_mutex_lock(&s->mu);
    int slot = s->n_free > 0 ? s->free_slots[--s->n_free] : -1;
    if (slot >= 0) s->slot_seq[slot] = ++s->next_seq;
    pthread_mutex_unlock(&s->mu);
    return slot;
}

void specd_sched_release_slot(specd_sched *s, int slot) {
    if (slot < 0 || slot >= s->n_slots) return;
    pthread_mutex_lock(&s->mu);
    /* The next owner starts at n_past = 0 and overwrites the rows; the
     * pages go back to the pool before the next pass, so other sessions can
     * use them meanwhile. */
    s->free_slots[s->n_free++] = slot;
    s->released[s->n_released++] = slot;
    pthread_cond_signal(&s->work_cv); /* its pages may unblock a waiting item */
    pthread_mutex_unlock(&s->mu);
}

int specd_sched_free_slots(specd_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_free;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void specd_sched_queue(specd_sched *s, int *items, int *tokens) {
    pthread_mutex_lock(&s->mu);
    *items = queued_items(s);
    *tokens = s->queued_tokens;
    pthread_mutex_unlock(&s->mu);
}

int specd_sched_run(specd_sched *s, specd_work *w) {
    w->err.msg[0] = 0;
    if (w->n_tokens < 1 || (w->kind != SPECD_WORK_PREFILL && w->n_tokens > s->o.max_batch_tokens) ||
        (w->kind == SPECD_WORK_TREE && (!w->tree || w->n_tokens != 1 + w->tree->n_nodes)) ||
        w->slot < 0 || w->slot >= s->n_slots) {
        /* An item that could never run would otherwise wait forever. */
        specd_seterr(&w->err, "scheduler: a %d-token item does not fit a %d-token pass",
                     w->n_tokens, s->o.max_batch_tokens);
        return SPECD_WORK_FAILED;
    }
    w->rc = 0;
    w->done = w->in_flight = w->n_done = w->admitted = 0;
    w->t_blocked_us = 0;
    w->cached_tokens = 0;
    w->next = NULL;
    w->queue_us = w->forward_us = w->batch_tokens = w->active_sessions = w->draft_tokens =
        w->prompt_tokens = 0;
    cond_init(&w->cv);
    pthread_mutex_lock(&s->mu);
    w->t_submit_us = specd_now_us_int();
    if (s->stop) {
        specd_seterr(&w->err, "target is shutting down");
        complete(w, SPECD_WORK_FAILED);
    } else {
        if (s->tail)
            s->tail->next = w;
        else
            s->head = w;
        s->tail = w;
        s->queued_tokens += w->n_tokens;
        /* broadcast: the worker and a runner waiting for its batch to
         * fill may both be waiting */
        pthread_cond_broadcast(&s->work_cv);
        if (!s->running) {
            /* Nobody runs passes: this thread does, until its own item is
             * done, and then leaves the rest to the worker. */
            s->running = 1;
            while (!w->done && !s->stop) run_round(s);
            s->running = 0;
            if (s->head || s->stop) pthread_cond_broadcast(&s->work_cv);
        }
    }
    while (!w->done) {
        struct timespec until;
        abs_in_us(&until, (int64_t)CANCEL_POLL_MS * 1000);
        pthread_cond_timedwait(&w->cv, &s->mu, &until);
        /* A cancelled call's item leaves the queue now rather than at the
         * next gather, so its handler can free the slot at once. An item in
         * a running pass must wait for the pass: the runner still uses it. */
        if (!w->done && !w->in_flight && w->is_cancelled && w->is_cancelled(w->cancel_arg)) {
            unlink_item(s, w);
            complete(w, SPECD_WORK_CANCELLED);
        }
    }
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&w->cv);
    return w->rc;
}

void specd_sched_kv_stats(specd_sched *s, specd_kv_pool_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->kv_stats;
    pthread_mutex_unlock(&s->mu);
}

int specd_sched_check_pages(specd_sched *s, specd_error *err) {
    pthread_mutex_lock(&s->mu);
    while (s->in_pass) pthread_cond_wait(&s->pass_cv, &s->mu);
    int rc = specd_transformer_check_pages(s->t, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int specd_sched_queue_wait_ms(const specd_sched *s) { return s->o.queue_wait_ms; }
