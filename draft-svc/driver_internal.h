/* driver_internal.h - the state of one request inside the driver, shared by
 * the driver's three files (not a public header):
 *
 *   driver.c        the request's Verify stream: open, send, answer, deliver,
 *                   fail over;
 *   driver_draft.c  drafting each step's tree: the job, the shape, pipelined
 *                   drafting ahead of the answer;
 *   driver_price.c  pricing that tree against the target's measured cost and
 *                   deciding when drafting pays at all (tree_choice.h).
 *
 * All of it runs on the request's one thread (driver.h). */
#ifndef SPECD_DRIVER_INTERNAL_H
#define SPECD_DRIVER_INTERNAL_H

#include "draft-svc/driver.h"
#include "common/rpc/ipc_caps.h"

/* ---- per-request state ------------------------------------------------------- */

/* A session's view of what its steps cost and earn. */
typedef struct price_state {
    int active;          /* this step's tree was priced (greedy, cost mode) */
    float *score, *p_path;  /* [max_tree_tokens] per node of the tree sent */
    uint8_t *rank, *keep;
    int32_t *levels;     /* [max_tree_tokens] drafting stages per node (driver_price_tree) */
    float *p_alt;        /* [max_tree_tokens] scratch: the tree without the model's part */
    uint8_t *keep_alt;
    uint8_t *keep_shape; /* [max_tree_tokens] the tree worth drafting again (driver_price_tree) */
    double predicted;    /* expected accepted tokens of the tree sent, as priced */
    double predicted_raw;/* the same without the session's scale */
    double predicted_unbiased; /* ... with the scale, without the drafter's bias */
    int sent_sessions;   /* the load it was priced at */
    float scale;         /* how this session accepts against the calibration */
    int batch_tokens;    /* the last pass: all its tokens */
    int sent_rows;       /* ... and ours in it (1 + tree nodes) */
    int draft_tokens;    /* ... and its draft nodes, every session's (0: not reported) */
    int prompt_tokens;   /* ... and its prompt rows, every session's (0: not reported) */
    double overhead_us;  /* step time outside the forward pass, smoothed */
    double run_overhead_us; /* ... of a plain run's step (no round trip), smoothed */
    int run_seen;        /* run_overhead_us has been measured */
    double draft_one_us; /* the drafter's time per tree level, smoothed (note_draft_time) */
    double gain;         /* smoothed priced gain of drafting, draft time included */
    int skip, backoff;   /* plain steps left before drafting again; the next skip */
    int look;            /* the next draft is a look after a skip: checked as a sure node */
    int looking;         /* this step's tree is a look: it sends at least one node */
    int empty_draft;     /* this step drafted and sends nothing (nothing found, or nothing paid) */
    int look_steps;      /* priced steps this session drafted (driver_price_run_pays) */
    int look_tokens;     /* ... the draft tokens the target accepted in them */
    double look_extra_us;/* ... and their own cost: drafting, and the rows they sent */
    double step_extra_us;/* that cost of the step priced last (driver_price_tree) */
    int sent_look;       /* the tree in flight is a look's forced node */
    float p1;            /* the first node's estimated chance, smoothed; < 0: none yet */
    int want_cand, want_depth; /* the shape to draft next */
    int priced_steps;    /* trees priced so far (for the exploring ones) */
    double t_send;       /* when the last tree went out (in a run: the last answer came) */
    double t_recv;       /* when the last answer came */
    int in_run;          /* the answer awaited is a plain run's step (plain_run) */
} price_state;


/* Pipelined drafting. While the target verifies the tree in flight, a
 * drafter with draft_ahead (drafter.h) drafts the next step's tree on a
 * guess: that the target accepts the tree's most likely path whole (while
 * it prefills the prompt for Open, that the guess's first level holds the
 * first token; the draft model's own prefill then overlaps the target's). The
 * tree drafted ahead is rooted at that path's last token, one level deeper
 * than the next step asks, so its first level also guesses the target's own
 * next token. When the answer accepts exactly that path and its next token
 * is one of the first level's nodes, that node's subtree is the next tree
 * (driver_draft() adopts it instead of calling the drafter), and the step goes out
 * with no drafting between the answer and the Tree: on a target with cores
 * or a GPU of its own, the drafter's time hides behind the target's pass.
 * Otherwise the next tree is drafted as always; the drafter's session state
 * follows the history each job brings, so the wrong guess leaves nothing
 * behind. Greedy and seed-exact requests only: a rejection-sampled tree
 * carries the q its children were drawn from, and its shape must not follow
 * anything but the request (policy.h). The guess drafts with the history's
 * penalty counts, not counting the guessed path's tokens: a draft a little
 * off, never an output (the target applies the exact penalties). */
typedef struct ahead_state {
    int on;              /* this request may draft ahead (buffers allocated) */
    specd_tree_buf tb;   /* the tree drafted ahead */
    int32_t *hist;       /* [cap_hist] the history + the guessed path */
    int n_synced;        /* hist[0 .. n_synced) mirrors the request's history */
    int32_t *map;        /* [tb.cap] scratch: node -> adopted node */
    int n_path;          /* the guessed path: nodes of the tree in flight */
    int32_t path[SPECD_MAX_DRAFT_DEPTH];
    int base_hist;       /* the history's length when it was drafted */
    int cand, depth;     /* its job's shape; depth counts the next-token level */
    float stop;          /* its job's stop_threshold */
    int valid;           /* tb is the tree drafted ahead of the tree in flight */
    int hit, hit_node;   /* the answer confirmed the guess: hit_node's subtree */
} ahead_state;

typedef struct gen {
    const specd_driver_env *env;
    const specd_gen_request *req;
    const specd_gen_sink *sink;
    specd_gen_cancel *cancel;
    specd_gen_stats *st;
    int32_t *hist; /* prompt then every token handed to the sink */
    int n_hist, cap_hist;
    int n_gen;     /* tokens generated (handed to the sink) */
    specd_token_counts counts;
    float *hidden; /* target hidden state of the newest token, if have_hidden */
    int hidden_size, have_hidden;
    specd_ipc_import *ipc; /* the current target session's co-location grant, mapped */
    void *draft_state;
    int drafting; /* 0 once the drafter has no session for us */
    specd_tree_buf tb;
    specd_accept_state acc;
    int target_load; /* active sessions the target reported last */
    specd_tpool_member *member; /* the target of the current session */
    price_state price;
    ahead_state ahead;
    /* Plain runs (the proto's VerifyTree.plain_steps): the most steps this
     * target session runs by itself (its answer to Open; 0 = none), the
     * run steps still to be answered, whether they stand for priced steps
     * the skip rules declined (counted as such), and the plain steps in a
     * row so far (a lookup drafter's runs grow with it, plain_run). */
    uint32_t max_plain;
    uint32_t run_left;
    int run_priced;
    int plain_streak;
    /* an Open or Tree is out and its answer not yet in: the next answer
     * completes a round trip (stats round_trips); a plain run's later
     * answers complete none */
    int trip_open;
    double t_start, t_first;
    int done;        /* finish reason reached */
    int target_finished; /* the target sent a finish reason: its status follows */
} gen;

/* Most plain steps in a row before drafting again to see whether a tree
 * pays now (text changes: a table, a quote, code): the longest skip, and
 * the longest run after drafts that found nothing (driver.c plain_run). */
#define DRIVER_MAX_SKIP 64

/* ---- driver_price.c ----------------------------------------------------------- */

/* Allocates a session's price state for trees of up to cap nodes; -1 when
 * out of memory (driver_price_free frees what was allocated). */
int driver_price_init(price_state *ps, int cap, const specd_policy *pol);
void driver_price_free(price_state *ps);
/* What the next pass will cost this session (tree_choice.h's price). */
void driver_price_of_step(const gen *g, specd_tree_price *pr);
/* Decodes plainly for the next few steps, then drafts once to look;
 * for_load: the longest skip at once (the load, not the text, said no). */
void driver_skip_drafting(price_state *ps, int for_load);
/* Cuts g->tb to the tree worth its verification time, and learns the
 * drafter's time from draft_us. */
void driver_price_tree(gen *g, double draft_us);
/* After the answer to a priced tree: calibration and the session's scale. */
void driver_price_learn(gen *g, const Specd__V1__VerifyResponse *r);
/* Notes a drafted step that sends nothing (its drafting, draft_us, won no
 * token). */
void driver_price_note_empty(gen *g, double draft_us);
/* Whether a plain run pays better, alone, than drafting on: what a drafted
 * step costs beyond a run's step, against what a step's drafting has been
 * winning (specd_tree_run_pays). */
int driver_price_run_pays(gen *g);
/* Folds a step's timings (received at t_recv, ms) into the cost curve. */
void driver_price_timings(gen *g, const Specd__V1__VerifyResponse *r, double t_recv);

/* ---- driver_draft.c ----------------------------------------------------------- */

/* Whether this request's trees are priced (cost mode, no shape of its own). */
int driver_q_priced(const gen *g);
/* Drafts the next tree into g->tb (left empty for a plain step). */
void driver_draft(gen *g, const specd_target_info *info);
/* While the tree just sent is verified (or Open answered, opening = 1):
 * drafts the step after it on the guess that its likely path is accepted. */
void driver_draft_ahead(gen *g, const specd_target_info *info, int opening);
/* On the answer to the tree in flight: whether it confirmed the guess. */
void driver_check_ahead(gen *g, const Specd__V1__VerifyResponse *r);

#endif
