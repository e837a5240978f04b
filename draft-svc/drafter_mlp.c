/* drafter_mlp.c - IBM's MLP speculator as a drafter (drafter.h, "mlp").
 *
 * The speculator (mlp_speculator.h) runs one stage per tree depth: stage s
 * takes, for every node at depth s (the root is depth 0), the node's input
 * state and its token, and gives the logits of its children plus the state
 * those children read at stage s+1 (children share their parent's output
 * state, as in the reference's generate_suffixes). The root's state is the
 * target's final-norm hidden state, its token the pending token.
 *
 * Greedy mode (temperature 0). Every frontier node proposes its top_k[s]
 * children (top_k_tokens_per_head, or the options' override) scored by the
 * cumulative log-probability of their path; specd_tree_beam_select keeps the
 * `candidates` best of the whole depth, which become the next frontier.
 * This is the reference's tree (top-k per head, best n paths by summed
 * log-probability) pruned per depth instead of once at the end, so the work
 * per depth is bounded by `candidates` rows rather than the product of the
 * top-k's.
 *
 * Sampling mode. The shape comes from specd_tree_sampling_branching() (the
 * root gets `candidates` children, deeper nodes one each), fixed before any
 * draw. A node's children are drawn i.i.d. from q = specd_sampling_probs of
 * the speculator's logits after the request's adjustments along the node's
 * path (specd_logits_adjust with the history counts plus the path tokens,
 * exactly as the target adjusts its own logits there), and q goes to the
 * tree as its nonzero entries. The uniform for a node comes from
 * (seed ^ SPECD_DRAFT_RNG_SALT, stream = the node's output index
 * (position + depth - 1), counter = its chain: the index of the root's
 * child it descends from), so every draw has its own address, and a chain's
 * addresses do not move when another chain stops early (below).
 *
 * Seed-exact sampling (the default method, sampling.h) keeps that shape
 * but replaces the draws: a node's b children are the b best of the race
 * over its q with the target's own noise (the request's seed, unsalted, at
 * the children's output index), so the first is the token the target picks
 * whenever the two races agree, and the rest are the runners-up. No q is
 * sent: verification is exact match.
 *
 * Both modes apply the adjustments (penalties and logit bias) when the
 * request has any: the target's greedy choice is the argmax of its adjusted
 * logits, so the draft's must be too.
 *
 * A speculator over a reduced vocabulary (mlp_speculator.h) speaks target
 * ids and gives -inf to tokens outside its map: greedy never proposes
 * them, and q gives them probability 0.
 *
 * Adaptive length (SpecDec++, with an acceptance head, accept_head.h, and
 * a job's stop_threshold > 0). After stage s, the head reads each frontier
 * row's new state (and, a head with draft features, the row's two largest
 * probabilities, prepare_rows) and gives p: its estimate that the token
 * drafted from that state is accepted, given the path so far was. Every child of the row gets
 * P = P(parent) * p, the chance its whole path survives verification (the
 * root has P = 1). A child at depth d stops growing (becomes a leaf) when
 * 1 - P > stop_threshold and d >= min_depth; nothing grows past `depth`.
 *   greedy: P also shapes the tree: the beam keeps the `candidates` children
 *     with the best log q + log P, the draft's probability of the path times
 *     the head's that it is accepted, i.e. the nodes that add the most to the
 *     expected accepted length, instead of log q alone. Siblings share p, so
 *     among them the order is still the draft's (the argmax chain stays the
 *     argmax chain).
 *   sampling: only the length rule applies (no branch is chosen, so there is
 *     nothing to rank). It keeps the tree lossless: a node's P depends on the
 *     states of its ancestors, i.e. on the tokens drawn ABOVE it, never on
 *     its own token or its siblings'. So the number of children of every
 *     node (branching[d] or 0) is fixed before the node itself is drawn, let
 *     alone its children, and given the path the verifier has accepted to
 *     reach a node, that node's children are still i.i.d. draws from the q
 *     sent with it, whose count was fixed in advance: the condition of the
 *     recursive rejection rule (tree_builder.h). Siblings at the root share
 *     P, so all chains stop at depth 1 or none does.
 * With stop_threshold 0 (or no head) the tree is exactly the fixed-shape one.
 *
 * Batching: at each depth the frontier rows of every job go through one
 * specd_mlp_speculator_stage call, so the head matmul reads its weights once
 * per depth for the whole batch. Jobs without a hidden state (the target
 * sent none) get an empty tree. The drafter keeps no per-session state.
 * Calls are serialized (a mutex): besides its own batcher, the hybrid
 * drafter's calls it. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/rng.h"
#include "common/model/accept_head.h"
#include "draft-svc/drafter.h"
#include "kernels/cpu/matmul.h"
#include "common/model/mlp_speculator.h"

#define MLP_DEFAULT_MAX_BATCH 64
#define MLP_MAX_DEPTH SPECD_MLP_SPEC_MAX_PREDICT
#define MLP_N_TOPK_OPTS ((int)(sizeof(((specd_mlp_drafter_opts *)0)->top_k_per_stage) / \
                               sizeof(int)))

/* A frontier node: a tree node (or the root, -1) whose children the next
 * stage predicts. */
typedef struct mlp_front {
    int job;
    int node;     /* -1 = the pending token */
    int32_t token;
    float logq;   /* log q of the path root..node */
    float pacc;   /* the head's P(path root..node is accepted); 1 without a head */
    int chain;    /* sampling: index of the root's child it descends from */
    int src_row;  /* row of the previous stage's output state it reads; -1 = hidden */
} mlp_front;

/* A greedy candidate child, before beam selection. */
typedef struct mlp_cand {
    int parent_row; /* frontier row of the parent */
    int32_t token;
} mlp_cand;

/* What one job does in this call. */
typedef struct mlp_plan {
    int depth;    /* stages to run, 0 = no tree */
    int sampling; /* 1 = draw children from q */
    int branching[MLP_MAX_DEPTH];
    int bound;    /* most frontier rows this job can have at any depth */
    int adaptive; /* the acceptance head shapes this job (see the top) */
    float stop_threshold;
    int min_depth;
} mlp_plan;

typedef struct mlp_impl {
    specd_mlp_speculator *sp;
    specd_accept_head *head; /* NULL = no adaptive length */
    int vocab, emb_dim, inner_dim, n_predict, max_batch;
    int top_k[MLP_MAX_DEPTH]; /* per stage, already clamped to the vocabulary */
    /* A reduced draft vocabulary's size (0: none). Its rows stay at the
     * draft ids (specd_mlp_speculator_stage_draft_ids), greedy or sampled,
     * adjusted or not (prepare_draft_row): 8k entries a row instead of the
     * target's 49k, which was most of a draft's time. row_w and row_map
     * describe the logits of the current call. */
    int draft_vocab;
    int row_w;
    const int32_t *row_map;
    int max_k;
    /* One call at a time, over the scratch below: the session driver
     * has a batcher per drafter, and the hybrid drafter (drafter_hybrid.c)
     * borrows this one, so two batchers may call it. */
    pthread_mutex_t mu;
    int mu_ready;
    /* per-call scratch, grown on demand */
    size_t rows_cap;
    float *in_states;  /* [rows][max(emb_dim, inner_dim)] */
    float *out_states; /* [rows][inner_dim] */
    float *logits;     /* [rows][vocab] */
    int32_t *tokens;   /* [rows] */
    float *p_rows;     /* [rows] the head's p for each frontier row's children */
    float *row_top2;   /* [rows][2] a row's two largest probabilities, for a head
                        * with draft features (accept_head.h) */
    double *row_lse;   /* [rows] log(sum(exp(row))) of a prepared row (prepare_rows) */
    mlp_front *front, *next; /* [rows] */
    size_t cand_cap;
    mlp_cand *cand;    /* [bound * max_k] of one job */
    float *cand_logq;
    float *cand_score; /* what the beam ranks: log q, + log P when adaptive */
    float *cand_pacc;
    uint8_t *keep;
    mlp_plan *plans;   /* [max_batch] */
    /* fixed-size scratch */
    int32_t *topk_ids; /* [max_k] */
    float *topk_vals;
    float *probs;      /* [vocab] */
    /* [vocab] with a reduced vocabulary: a draft-id row at target width for
     * its adjustments, -inf off the map (prepare_draft_row) */
    float *wide;
    int probs_zero;    /* probs is all 0 (a draft-id row scatters into it) */
    float *q_probs;    /* [vocab]: a draft-id row's dense q */
    /* a rejection-sampled node's q as sent (specd_draft_q_sparse) */
    int32_t sq_ids[SPECD_DRAFT_Q_MAX];
    float sq_probs[SPECD_DRAFT_Q_MAX];
    void *sample_scratch;
    void *adjust_scratch; /* specd_logits_adjust_scratch_size(n_predict) */
    int32_t path[MLP_MAX_DEPTH];
} mlp_impl;

static int grow(void **p, size_t n, size_t elem) {
    size_t bytes = n * elem;
    void *q = realloc(*p, bytes > 0 ? bytes : 1);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int grow_rows(mlp_impl *m, size_t rows, specd_error *err) {
    if (rows <= m->rows_cap) return 0;
    size_t in_w = (size_t)(m->emb_dim > m->inner_dim ? m->emb_dim : m->inner_dim);
    if (grow((void **)&m->in_states, rows * in_w, sizeof(float)) ||
        grow((void **)&m->out_states, rows * (size_t)m->inner_dim, sizeof(float)) ||
        grow((void **)&m->logits, rows * (size_t)m->vocab, sizeof(float)) ||
        grow((void **)&m->tokens, rows, sizeof(int32_t)) ||
        grow((void **)&m->p_rows, rows, sizeof(float)) ||
        grow((void **)&m->row_top2, 2 * rows, sizeof(float)) ||
        grow((void **)&m->row_lse, rows, sizeof(double)) ||
        grow((void **)&m->front, rows, sizeof(mlp_front)) ||
        grow((void **)&m->next, rows, sizeof(mlp_front)))
        return specd_seterr(err, "mlp drafter: out of memory for %zu rows", rows);
    m->rows_cap = rows;
    return 0;
}

static int grow_cand(mlp_impl *m, size_t n, specd_error *err) {
    if (n <= m->cand_cap) return 0;
    if (grow((void **)&m->cand, n, sizeof(mlp_cand)) ||
        grow((void **)&m->cand_logq, n, sizeof(float)) ||
        grow((void **)&m->cand_score, n, sizeof(float)) ||
        grow((void **)&m->cand_pacc, n, sizeof(float)) ||
        grow((void **)&m->keep, n, sizeof(uint8_t)))
        return specd_seterr(err, "mlp drafter: out of memory for %zu candidates", n);
    m->cand_cap = n;
    return 0;
}

/* Decides a job's depth and shape. A job is skipped (empty tree) without a
 * hidden state, a history, a valid pending token or room in its tree. */
static void plan_job(const mlp_impl *m, const specd_draft_job *job, mlp_plan *p) {
    memset(p, 0, sizeof *p);
    if (!job->hidden || !job->history || job->n_history < 1 || job->depth < 1 ||
        !job->out || job->out->cap < 1)
        return;
    int32_t pending = job->history[job->n_history - 1];
    if (pending < 0 || pending >= m->vocab) return;
    int depth = job->depth < m->n_predict ? job->depth : m->n_predict;
    int cands = job->candidates > 0 ? job->candidates : 1;
    p->sampling = job->sampling && job->sampling->temperature > 0.0f;
    if (p->sampling) {
        depth = specd_tree_sampling_branching(cands, depth, job->out->cap, p->branching);
        p->bound = p->branching[0]; /* chains: one frontier row each */
    } else {
        p->bound = cands < job->out->cap ? cands : job->out->cap;
    }
    p->depth = depth;
    /* min_depth is clamped into 1..depth: a floor above the depth this job
     * can reach only means "never stop early" */
    p->adaptive = m->head && job->stop_threshold > 0;
    p->stop_threshold = job->stop_threshold;
    p->min_depth = job->min_depth < 1 ? 1 : job->min_depth > depth ? depth : job->min_depth;
}

/* Whether a new node at depth d (1 = a child of the root) whose path has
 * acceptance estimate pacc gets children: the SpecDec++ rule, within the
 * job's depth. */
static int keeps_growing(const mlp_plan *p, int d, float pacc) {
    if (d >= p->depth) return 0;
    return !(p->adaptive && d >= p->min_depth && 1.0f - pacc > p->stop_threshold);
}

/* The tokens of the path root..node (excluding the pending token, which the
 * history counts already hold) into m->path; returns its length. */
static int node_path(mlp_impl *m, const specd_tree_buf *out, int node) {
    int n = 0;
    for (int i = node; i >= 0 && n < MLP_MAX_DEPTH; i = out->parents[i]) m->path[n++] = out->tokens[i];
    for (int i = 0; i < n / 2; i++) {
        int32_t t = m->path[i];
        m->path[i] = m->path[n - 1 - i];
        m->path[n - 1 - i] = t;
    }
    return n;
}

/* The request's logit adjustments at a node, in place (no-op without any). */
static void adjust_row(mlp_impl *m, const specd_draft_job *job, int node, float *row) {
    if (!job->sampling) return;
    int n = node_path(m, job->out, node);
    specd_logits_adjust(job->sampling, job->counts, m->path, n, row, m->vocab,
                        m->adjust_scratch);
}

/* A draft-id row ready for use: the "other" bucket is no token (-inf), and
 * the request's adjustments apply. They address target ids, so an adjusted
 * row goes out to m->wide, the target-width row that is -inf off the map
 * (an adjustment leaves -inf at -inf, so it stays so), and back: the same
 * logits as the target-width row gets, at 8k entries a row instead of 49k,
 * and one request with a penalty no longer sends the whole batch's rows
 * to target width. */
static void prepare_draft_row(mlp_impl *m, const specd_draft_job *job, int node, float *row) {
    for (int i = 0; i < m->row_w; i++)
        if (m->row_map[i] < 0) row[i] = -INFINITY;
    if (!job->sampling || !specd_sampling_adjusts_logits(job->sampling)) return;
    for (int i = 0; i < m->row_w; i++)
        if (m->row_map[i] >= 0) m->wide[m->row_map[i]] = row[i];
    adjust_row(m, job, node, m->wide);
    for (int i = 0; i < m->row_w; i++)
        if (m->row_map[i] >= 0) row[i] = m->wide[m->row_map[i]];
}

/* Greedy expansion of one job's frontier rows [a, b) at stage s: every row's
 * top-k children, then the `candidates` best of them by path log-probability
 * join the tree (in frontier order, so parents precede children); those that
 * go on are appended to m->next. Returns the new count of next rows. */
static int expand_greedy(mlp_impl *m, specd_draft_job *job, const mlp_plan *p, int s, int a,
                         int b, int n_next) {
    specd_tree_buf *out = job->out;
    int nc = 0;
    for (int r = a; r < b; r++) {
        const float *row = m->logits + (size_t)r * m->row_w; /* prepared (prepare_rows) */
        double lse = m->row_lse[r];
        int k = specd_topk(row, m->row_w, m->top_k[s], m->topk_ids, m->topk_vals);
        if (m->row_map)
            for (int i = 0; i < k; i++) m->topk_ids[i] = m->row_map[m->topk_ids[i]];
        float pacc = p->adaptive ? m->front[r].pacc * m->p_rows[r] : 1.0f;
        /* log 0 = -inf ranks last, which is what a certain rejection deserves */
        float log_pacc = p->adaptive ? logf(pacc) : 0.0f;
        for (int i = 0; i < k; i++) {
            /* -inf: a token the speculator cannot predict (outside a reduced
             * vocabulary, or banned by a bias); the rest of the list is too */
            if (m->topk_vals[i] == -INFINITY) break;
            m->cand[nc] = (mlp_cand){r, m->topk_ids[i]};
            m->cand_logq[nc] = m->front[r].logq + (float)((double)m->topk_vals[i] - lse);
            m->cand_score[nc] = m->cand_logq[nc] + log_pacc;
            m->cand_pacc[nc++] = pacc;
        }
    }
    int room = out->cap - out->n_nodes;
    int keep = job->candidates > 0 ? job->candidates : 1;
    if (keep > room) keep = room;
    specd_tree_beam_select(m->cand_score, nc, keep, m->keep);
    for (int i = 0; i < nc; i++) {
        if (!m->keep[i]) continue;
        const mlp_front *par = &m->front[m->cand[i].parent_row];
        int node = specd_tree_buf_add(out, par->node, m->cand[i].token, m->cand_logq[i]);
        if (node < 0) break; /* full: the tree ends here */
        if (keeps_growing(p, s + 1, m->cand_pacc[i]))
            m->next[n_next++] = (mlp_front){par->job, node, m->cand[i].token, m->cand_logq[i],
                                            m->cand_pacc[i], 0, m->cand[i].parent_row};
    }
    return n_next;
}

/* Sampling expansion of rows [a, b) at stage s: each row's node gets
 * branching[s] children: with rejection sampling drawn i.i.d. from its q,
 * q stored on the node first (a child never exists without the
 * distribution it came from); seed-exact, the race's best (see the top). */
static int expand_sampling(mlp_impl *m, specd_draft_job *job, const mlp_plan *p, int s, int a,
                           int b, int n_next) {
    specd_tree_buf *out = job->out;
    const specd_sampling *smp = job->sampling;
    int raced = specd_sampling_is(smp, SPECD_SAMPLING_SEED_EXACT);
    uint64_t seed = smp->seed ^ SPECD_DRAFT_RNG_SALT;
    uint64_t stream = job->position + (uint64_t)s; /* output index of the drawn nodes */
    for (int r = a; r < b; r++) {
        const mlp_front *par = &m->front[r];
        /* decided from the parent's state alone: see the top on losslessness */
        float pacc = p->adaptive ? par->pacc * m->p_rows[r] : 1.0f;
        int grows = keeps_growing(p, s + 1, pacc);
        float *row = m->logits + (size_t)r * m->row_w;
        /* q, dense: over the draft ids of a reduced vocabulary (q_map maps
         * them to target ids) or over the target's vocabulary. A draft-id
         * row is 8k entries where the target-width one is 49k, 41k of them
         * -inf: q over the wide row was half of a sampled node's time. */
        const float *q;
        const int32_t *q_map = NULL;
        int q_n;
        if (m->row_map) { /* the row is prepared (prepare_rows) */
            specd_sampling_probs(smp, row, m->row_w, m->q_probs, m->sample_scratch);
            q = m->q_probs;
            q_map = m->row_map;
            q_n = m->row_w;
        } else {
            specd_sampling_probs(smp, row, m->vocab, m->probs, m->sample_scratch);
            m->probs_zero = 0;
            q = m->probs;
            q_n = m->vocab;
        }
        if (raced) {
            /* The race addresses its noise by target id: a draft-id q is
             * scattered into the all-zero target-width m->probs for it. */
            if (m->row_map) {
                if (!m->probs_zero) memset(m->probs, 0, sizeof(float) * (size_t)m->vocab);
                for (int i = 0; i < m->row_w; i++)
                    if (m->row_map[i] >= 0) m->probs[m->row_map[i]] = m->q_probs[i];
                m->probs_zero = 0;
            }
            int32_t ids[SPECD_RACE_MAX_K];
            int nb = specd_race_topk(m->probs, m->vocab, (specd_race_addr){smp->seed, stream, 0},
                                     p->branching[s], ids);
            for (int c = 0; c < nb; c++) {
                float logq = par->logq + logf(m->probs[ids[c]]);
                int node = specd_tree_buf_add(out, par->node, ids[c], logq);
                if (node < 0) break;
                if (grows)
                    m->next[n_next++] =
                        (mlp_front){par->job, node, ids[c], logq, pacc, par->chain * p->branching[s] + c, r};
            }
            if (m->row_map) { /* back to all zero, cheaper than a memset */
                for (int i = 0; i < m->row_w; i++)
                    if (m->row_map[i] >= 0) m->probs[m->row_map[i]] = 0.0f;
                m->probs_zero = 1;
            }
            if (out->n_nodes >= out->cap) return n_next;
            continue;
        }
        /* Draw from (and send) q cut to its most likely tokens, sparse and
         * in target-id order: see SPECD_DRAFT_Q_MAX and
         * specd_draft_q_sparse. */
        int nq = specd_draft_q_sparse(q, q_n, q_map, m->sq_ids, m->sq_probs);
        if (specd_tree_buf_set_q(out, par->node, m->sq_ids, m->sq_probs, nq)) return n_next;
        for (int c = 0; c < p->branching[s]; c++) {
            /* the root (chain 0) fans out into chains 0..k-1; deeper rows
             * have one child, which continues its parent's chain */
            int chain = par->chain * p->branching[s] + c;
            double u = specd_rng_uniform(seed, stream, (uint64_t)chain);
            int j = specd_sample_from_probs(m->sq_probs, nq, u);
            int32_t tok = m->sq_ids[j];
            float logq = par->logq + logf(m->sq_probs[j]);
            int node = specd_tree_buf_add(out, par->node, tok, logq);
            if (node < 0) return n_next; /* full (the shape was sized to fit; a guard) */
            if (grows) m->next[n_next++] = (mlp_front){par->job, node, tok, logq, pacc, chain, r};
        }
    }
    return n_next;
}

/* Every frontier row of a stage made ready once, before anything reads
 * it: a draft-id row's "other" bucket off and the request's adjustments on
 * (prepare_draft_row), or a target-width row's adjustments (adjust_row).
 * A greedy row's log(sum(exp(row))) goes to m->row_lse: by the sampling
 * core's vector exp, in double and summed in a fixed order
 * (specd_log_sum_exp), so the log-probabilities are a function of the
 * logits alone; -inf entries (a bias, or ids outside a reduced vocabulary)
 * count 0. Scalar expf over the row was a fifth of a draft level's time.
 * With `top2`, also each row's two largest probabilities at temperature 1
 * into m->row_top2, the draft features of a head that reads them
 * (accept_head.h): from the row as the drafter ranks it, so a function of
 * the row's path alone, never of the children it will draw (which keeps a
 * sampled tree's shape fixed before its draws, see the top). */
static void prepare_rows(mlp_impl *m, const specd_draft_job *jobs, int n_rows, int top2) {
    for (int r = 0; r < n_rows; r++) {
        float *row = m->logits + (size_t)r * m->row_w;
        const specd_draft_job *job = &jobs[m->front[r].job];
        if (m->row_map) prepare_draft_row(m, job, m->front[r].node, row);
        else adjust_row(m, job, m->front[r].node, row);
        if (!top2 && m->plans[m->front[r].job].sampling) continue;
        m->row_lse[r] = specd_log_sum_exp(row, m->row_w);
        if (!top2) continue;
        int32_t ids[2];
        float vals[2] = {-INFINITY, -INFINITY};
        int k = specd_topk(row, m->row_w, 2, ids, vals);
        m->row_top2[2 * r] = k > 0 ? (float)exp((double)vals[0] - m->row_lse[r]) : 0.0f;
        m->row_top2[2 * r + 1] = k > 1 ? (float)exp((double)vals[1] - m->row_lse[r]) : 0.0f;
    }
}

static int mlp_propose_locked(mlp_impl *m, specd_draft_job *jobs, int n, specd_error *err) {
    /* plan every job and size the scratch for the largest frontier */
    size_t rows = 0, cand = 0;
    /* a reduced vocabulary's rows stay at its draft ids (prepare_draft_row) */
    int draft_ids = m->draft_vocab > 0;
    int any_adaptive = 0; /* the head runs only then (below) */
    for (int i = 0; i < n; i++) {
        plan_job(m, &jobs[i], &m->plans[i]);
        if (!m->plans[i].depth) continue;
        any_adaptive |= m->plans[i].adaptive;
        size_t bound = (size_t)(m->plans[i].bound > 1 ? m->plans[i].bound : 1);
        rows += bound;
        if (bound * (size_t)m->max_k > cand) cand = bound * (size_t)m->max_k;
    }
    if (rows == 0) return 0;
    if (grow_rows(m, rows, err) || grow_cand(m, cand, err)) return -1;

    /* depth 0: every job's root, reading the target's hidden state */
    int n_rows = 0;
    for (int i = 0; i < n; i++) {
        if (!m->plans[i].depth) continue;
        m->front[n_rows] =
            (mlp_front){i, -1, jobs[i].history[jobs[i].n_history - 1], 0.0f, 1.0f, 0, -1};
        memcpy(m->in_states + (size_t)n_rows * m->emb_dim, jobs[i].hidden,
               sizeof(float) * (size_t)m->emb_dim);
        n_rows++;
    }

    for (int s = 0; n_rows > 0; s++) {
        for (int r = 0; r < n_rows; r++) m->tokens[r] = m->front[r].token;
        m->row_w = m->vocab;
        m->row_map = NULL;
        if (draft_ids ? specd_mlp_speculator_stage_draft_ids(m->sp, s, n_rows, m->in_states,
                                                             m->tokens, m->out_states, m->logits,
                                                             &m->row_map, err)
                      : specd_mlp_speculator_stage(m->sp, s, n_rows, m->in_states, m->tokens,
                                                   m->out_states, m->logits, err))
            return -1;
        if (m->row_map) m->row_w = m->draft_vocab;
        prepare_rows(m, jobs, n_rows, any_adaptive && specd_accept_head_wants_top2(m->head));
        /* The head over every row in one call, when a job of the call is
         * adaptive (the head's p only shapes those). It does not score the
         * nodes the driver prices (tree_choice.h): the speculator's own
         * probability of its draft, which every node carries as its logq,
         * predicts acceptance far better than the head does (held-out
         * eval prompts, shipped speculator and head, 24,868 drafted
         * tokens: AUC 0.83 against 0.69; BCE after calibration 0.529
         * against 0.626; docs/BENCHMARKS.md, thirty-sixth session), and
         * the driver calibrates either by depth, rank and score. */
        if (any_adaptive &&
            specd_accept_head_forward(m->head, s, n_rows, m->out_states, m->row_top2, m->p_rows,
                                      NULL, err))
            return -1;
        /* each job's rows are contiguous (frontier order follows job order) */
        int n_next = 0;
        for (int a = 0; a < n_rows;) {
            int j = m->front[a].job, b = a;
            while (b < n_rows && m->front[b].job == j) b++;
            const mlp_plan *p = &m->plans[j];
            n_next = p->sampling ? expand_sampling(m, &jobs[j], p, s, a, b, n_next)
                                 : expand_greedy(m, &jobs[j], p, s, a, b, n_next);
            a = b;
        }
        /* the next stage reads each child's parent's new state */
        for (int r = 0; r < n_next; r++)
            memcpy(m->in_states + (size_t)r * m->inner_dim,
                   m->out_states + (size_t)m->next[r].src_row * m->inner_dim,
                   sizeof(float) * (size_t)m->inner_dim);
        mlp_front *t = m->front;
        m->front = m->next;
        m->next = t;
        n_rows = n_next;
    }
    return 0;
}

static int mlp_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err) {
    mlp_impl *m = d->impl;
    pthread_mutex_lock(&m->mu);
    int rc = mlp_propose_locked(m, jobs, n, err);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static void mlp_free_impl(mlp_impl *m) {
    if (!m) return;
    if (m->mu_ready) pthread_mutex_destroy(&m->mu);
    specd_mlp_speculator_free(m->sp);
    specd_accept_head_free(m->head);
    free(m->in_states);
    free(m->out_states);
    free(m->logits);
    free(m->tokens);
    free(m->p_rows);
    free(m->row_top2);
    free(m->row_lse);
    free(m->front);
    free(m->next);
    free(m->cand);
    free(m->cand_logq);
    free(m->cand_score);
    free(m->cand_pacc);
    free(m->keep);
    free(m->plans);
    free(m->topk_ids);
    free(m->topk_vals);
    free(m->probs);
    free(m->wide);
    free(m->q_probs);
    free(m->sample_scratch);
    free(m->adjust_scratch);
    free(m);
}

static void mlp_destroy(specd_drafter *d) {
    mlp_free_impl(d->impl);
    free(d);
}

/* The acceptance head, checked against the speculator it will read: its
 * input is a stage's output state and it needs an embedding per stage.
 * When the speculator's matrices are quantized (drafter.mlp.quantize, the
 * default q4_1_head), so are the head's: Q8_0 on the integer path. A 1x1
 * draft after a 96 MB read then took 108-120 us against 125-151 with the
 * fp16 head, 3x4 489-630 against 542-579 (bench_draft, four alternated
 * pairs, AMD EPYC Zen 5 VM). */
static int load_head(mlp_impl *m, const char *dir, int quantize, specd_error *err) {
    if (!(m->head = specd_accept_head_load(dir, err))) return -1;
    if (quantize && specd_accept_head_use_int8(m->head, err)) return -1;
    const specd_accept_head_config *hc = specd_accept_head_config_of(m->head);
    if (hc->input_dim != m->inner_dim)
        return specd_seterr(err, "accept head %s: input_dim %d, but the speculator's inner_dim "
                                 "is %d", dir, hc->input_dim, m->inner_dim);
    if (hc->n_stages < m->n_predict)
        return specd_seterr(err, "accept head %s: n_stages %d, but the speculator has %d stages",
                            dir, hc->n_stages, m->n_predict);
    return 0;
}

static const specd_drafter_ops mlp_ops = {
    .name = "mlp",
    .session_open = NULL, /* stateless: everything it needs comes with the job */
    .session_close = NULL,
    .propose = mlp_propose,
    .destroy = mlp_destroy,
};

specd_drafter *specd_mlp_drafter_create(const specd_mlp_drafter_opts *o, specd_error *err) {
    if (!o || !o->path || !o->path[0]) {
        specd_seterr(err, "mlp drafter: no speculator path");
        return NULL;
    }
    if (o->n_threads < 0 || o->max_batch < 0) {
        specd_seterr(err, "mlp drafter: n_threads and max_batch must not be negative");
        return NULL;
    }
    for (int i = 0; i < MLP_N_TOPK_OPTS; i++)
        if (o->top_k_per_stage[i] < 0 || o->top_k_per_stage[i] > SPECD_MLP_SPEC_MAX_TOPK) {
            specd_seterr(err, "mlp drafter: top_k_per_stage[%d] = %d must be in 0..%d", i,
                         o->top_k_per_stage[i], SPECD_MLP_SPEC_MAX_TOPK);
            return NULL;
        }
    mlp_impl *m = calloc(1, sizeof *m);
    specd_drafter *d = calloc(1, sizeof *d);
    if (!m || !d) {
        free(m);
        free(d);
        specd_seterr(err, "mlp drafter: out of memory");
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->mu_ready = 1;
    specd_backend_opts bo = {.name = o->backend ? o->backend : "cpu", .n_threads = o->n_threads,
                             .device = o->device};
    m->sp = specd_mlp_speculator_load_ex(o->path, &bo, (specd_mlp_quant)o->quant, err);
    if (!m->sp) goto fail;
    const specd_mlp_spec_config *c = specd_mlp_speculator_config(m->sp);
    m->vocab = c->target_vocab_size; /* the stage API's width, even over a reduced vocabulary */
    m->draft_vocab = c->vocab_size < c->target_vocab_size ? c->vocab_size : 0;
    m->emb_dim = c->emb_dim;
    m->inner_dim = c->inner_dim;
    m->n_predict = c->n_predict;
    m->max_batch = o->max_batch ? o->max_batch : MLP_DEFAULT_MAX_BATCH;
    for (int s = 0; s < m->n_predict; s++) {
        int k = s < MLP_N_TOPK_OPTS && o->top_k_per_stage[s] ? o->top_k_per_stage[s] : c->top_k[s];
        m->top_k[s] = k < m->vocab ? k : m->vocab;
        if (m->top_k[s] > m->max_k) m->max_k = m->top_k[s];
    }
    if (o->accept_head && load_head(m, o->accept_head, o->quant != SPECD_MLP_AS_STORED, err))
        goto fail;
    size_t V = (size_t)m->vocab;
    m->plans = calloc((size_t)m->max_batch, sizeof *m->plans);
    m->topk_ids = malloc(sizeof(int32_t) * (size_t)m->max_k);
    m->topk_vals = malloc(sizeof(float) * (size_t)m->max_k);
    m->probs = malloc(sizeof(float) * V);
    m->q_probs = malloc(sizeof(float) * V);
    if (m->draft_vocab > 0) {
        m->wide = malloc(sizeof(float) * V);
        if (m->wide)
            for (size_t i = 0; i < V; i++) m->wide[i] = -INFINITY;
    }
    m->sample_scratch = malloc(specd_sampling_scratch_size(m->vocab));
    m->adjust_scratch = malloc(specd_logits_adjust_scratch_size(MLP_MAX_DEPTH));
    if (!m->plans || !m->topk_ids || !m->topk_vals || !m->probs || !m->q_probs ||
        (m->draft_vocab > 0 && !m->wide) || !m->sample_scratch || !m->adjust_scratch) {
        specd_seterr(err, "mlp drafter: out of memory");
        goto fail;
    }
    d->ops = &mlp_ops;
    d->vocab = m->vocab;
    d->hidden_size = m->emb_dim; /* conditions on the target's hidden state */
    d->max_batch = m->max_batch;
    d->max_depth = m->n_predict;
    d->on_cuda = o->backend && !strcmp(o->backend, "cuda");
    d->cuda_device = o->device;
    d->impl = m;
    return d;
fail:
    mlp_free_impl(m);
    free(d);
    return NULL;
}
