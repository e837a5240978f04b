/* tree_builder.c - the candidate tree buffer and its shaping rules
 * (tree_builder.h). */
#include "draft-svc/tree_builder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int specd_tree_buf_init(specd_tree_buf *b, int cap, size_t q_pool, specd_error *err) {
    memset(b, 0, sizeof *b);
    if (cap < 1) return specd_seterr(err, "tree buffer: capacity %d < 1", cap);
    b->cap = cap;
    b->tokens = malloc(sizeof(int32_t) * (size_t)cap);
    b->parents = malloc(sizeof(int32_t) * (size_t)cap);
    b->depth = malloc(sizeof(int32_t) * (size_t)cap);
    b->logq = malloc(sizeof(float) * (size_t)cap);
    b->pcond = malloc(sizeof(float) * (size_t)cap);
    b->src = malloc((size_t)cap);
    b->q = calloc((size_t)cap + 1, sizeof *b->q);
    if (q_pool) {
        b->q_ids = malloc(sizeof(int32_t) * q_pool);
        b->q_probs = malloc(sizeof(float) * q_pool);
    }
    b->q_pool_cap = q_pool;
    if (!b->tokens || !b->parents || !b->depth || !b->logq || !b->pcond || !b->src || !b->q ||
        (q_pool && (!b->q_ids || !b->q_probs))) {
        specd_tree_buf_free(b);
        return specd_seterr(err, "tree buffer: out of memory");
    }
    return 0;
}

void specd_tree_buf_free(specd_tree_buf *b) {
    free(b->tokens);
    free(b->parents);
    free(b->depth);
    free(b->logq);
    free(b->pcond);
    free(b->src);
    free(b->q);
    free(b->q_ids);
    free(b->q_probs);
    memset(b, 0, sizeof *b);
}

void specd_tree_buf_reset(specd_tree_buf *b) {
    /* Only the q entries of nodes that existed can be set. */
    for (int i = 0; i <= b->n_nodes; i++) b->q[i] = (specd_sparse_dist){0, NULL, NULL};
    b->n_nodes = 0;
    b->q_pool_used = 0;
}

int specd_tree_buf_add(specd_tree_buf *b, int parent, int32_t token, float logq) {
    if (b->n_nodes >= b->cap || parent < -1 || parent >= b->n_nodes) return -1;
    int i = b->n_nodes++;
    b->tokens[i] = token;
    b->parents[i] = parent;
    b->depth[i] = parent < 0 ? 1 : b->depth[parent] + 1;
    b->logq[i] = logq;
    b->pcond[i] = -1.0f;
    b->src[i] = SPECD_SRC_MODEL;
    b->q[i + 1] = (specd_sparse_dist){0, NULL, NULL};
    return i;
}

float specd_tree_node_score(const specd_tree_buf *b, int i) {
    float s;
    if (b->pcond && b->pcond[i] >= 0) {
        s = b->pcond[i];
    } else {
        float parent = b->parents[i] >= 0 ? b->logq[b->parents[i]] : 0.0f;
        s = expf(b->logq[i] - parent);
    }
    return isfinite(s) ? (s < 0 ? 0 : s > 1 ? 1 : s) : 0;
}

int specd_tree_buf_prune(specd_tree_buf *b, const uint8_t *keep) {
    /* parents precede children, so new indices are known before use; the
     * old-to-new map reuses nothing the loop still reads */
    int32_t map_small[64];
    int32_t *map = b->n_nodes <= 64 ? map_small : malloc(sizeof(int32_t) * (size_t)b->n_nodes);
    if (!map) return b->n_nodes; /* keeps the whole tree: still a valid one */
    int n = 0;
    for (int i = 0; i < b->n_nodes; i++) {
        int par = b->parents[i];
        if (!keep[i] || (par >= 0 && map[par] < 0)) {
            map[i] = -1;
            continue;
        }
        map[i] = n;
        b->tokens[n] = b->tokens[i];
        b->parents[n] = par >= 0 ? map[par] : -1;
        b->depth[n] = b->depth[i];
        b->logq[n] = b->logq[i];
        b->pcond[n] = b->pcond[i];
        b->src[n] = b->src[i];
        n++;
    }
    for (int i = 0; i <= b->n_nodes; i++) b->q[i] = (specd_sparse_dist){0, NULL, NULL};
    b->q_pool_used = 0;
    b->n_nodes = n;
    if (map != map_small) free(map);
    return n;
}

int specd_tree_buf_set_q(specd_tree_buf *b, int node, const int32_t *ids, const float *probs,
                         int n) {
    if (node < -1 || node >= b->n_nodes || n < 1 || (size_t)n > b->q_pool_cap - b->q_pool_used)
        return -1;
    int32_t *di = b->q_ids + b->q_pool_used;
    float *dp = b->q_probs + b->q_pool_used;
    memcpy(di, ids, sizeof(int32_t) * (size_t)n);
    memcpy(dp, probs, sizeof(float) * (size_t)n);
    b->q_pool_used += (size_t)n;
    b->q[node + 1] = (specd_sparse_dist){n, di, dp};
    return 0;
}

void specd_tree_buf_view(const specd_tree_buf *b, int sampling, specd_tree *out) {
    out->n_nodes = b->n_nodes;
    out->tokens = b->tokens;
    out->parents = b->parents;
    out->q = sampling ? b->q : NULL;
}

/* a ranks before b: higher value, then lower index. */
static int ranks_before(const float *v, int a, int b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

int specd_tree_beam_select(const float *cand_logq, int n, int keep, uint8_t *keep_mask) {
    memset(keep_mask, 0, (size_t)(n > 0 ? n : 0));
    if (keep >= n) {
        memset(keep_mask, 1, (size_t)(n > 0 ? n : 0));
        return n > 0 ? n : 0;
    }
    /* n is small (a frontier of a few dozen), so counting how many beat each
     * candidate is clearer than a partial sort and exact on ties. */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        int better = 0;
        for (int j = 0; j < n && better < keep; j++)
            if (j != i && ranks_before(cand_logq, j, i)) better++;
        if (better < keep) {
            keep_mask[i] = 1;
            kept++;
        }
    }
    return kept;
}

int specd_tree_sampling_branching(int candidates, int depth, int max_nodes, int *branching) {
    if (candidates < 1) candidates = 1;
    if (depth < 1) depth = 1;
    if (max_nodes < 1) return 0;
    /* Independent chains: the root fans out, every deeper node has one
     * child. Keep as many chains as fit at full depth, and if not even one
     * fits, shorten the single chain. */
    if (candidates * depth > max_nodes) {
        candidates = max_nodes / depth;
        if (candidates < 1) {
            candidates = 1;
            depth = max_nodes;
        }
    }
    branching[0] = candidates;
    for (int d = 1; d < depth; d++) branching[d] = 1;
    return depth;
}

/* Min-heap of (value, id) keyed by "ranks before", so the root is the worst
 * of the current top k. */
static int heap_worse(const float *hv, const int32_t *hi, int a, int b) {
    return hv[a] < hv[b] || (hv[a] == hv[b] && hi[a] > hi[b]);
}

static void heap_sift_down(float *hv, int32_t *hi, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_worse(hv, hi, l, m)) m = l;
        if (r < n && heap_worse(hv, hi, r, m)) m = r;
        if (m == i) return;
        float tv = hv[i];
        hv[i] = hv[m];
        hv[m] = tv;
        int32_t ti = hi[i];
        hi[i] = hi[m];
        hi[m] = ti;
        i = m;
    }
}

int specd_topk(const float *x, int n, int k, int32_t *ids, float *vals) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = x[i];
        if (v != v) continue; /* NaN never ranks */
        if (m < k) {
            vals[m] = v;
            ids[m] = i;
            m++;
            if (m == k)
                for (int j = k / 2 - 1; j >= 0; j--) heap_sift_down(vals, ids, k, j);
        } else if (v > vals[0]) { /* ties keep the earlier (lower) id */
            vals[0] = v;
            ids[0] = i;
            heap_sift_down(vals, ids, k, 0);
        }
    }
    /* Sort the survivors best first (insertion sort: k is small). */
    for (int i = 1; i < m; i++) {
        float v = vals[i];
        int32_t id = ids[i];
        int j = i - 1;
        while (j >= 0 && (vals[j] < v || (vals[j] == v && ids[j] > id))) {
            vals[j + 1] = vals[j];
            ids[j + 1] = ids[j];
            j--;
        }
        vals[j + 1] = v;
        ids[j + 1] = id;
    }
    return m;
}

/* Sorts (ids, vals) by id ascending; n <= SPECD_DRAFT_Q_MAX, ids distinct
 * (insertion sort: the input is short, and often sorted already). */
static void sort_by_id(int32_t *ids, float *vals, int n) {
    for (int i = 1; i < n; i++) {
        int32_t id = ids[i];
        float v = vals[i];
        int j = i - 1;
        while (j >= 0 && ids[j] > id) {
            ids[j + 1] = ids[j];
            vals[j + 1] = vals[j];
            j--;
        }
        ids[j + 1] = id;
        vals[j + 1] = v;
    }
}

int specd_draft_q_sparse(const float *probs, int n, const int32_t *id_map, int32_t *ids,
                         float *sparse) {
    int nz = 0;
    for (int i = 0; i < n && nz <= SPECD_DRAFT_Q_MAX; i++) nz += probs[i] > 0.0f;
    int m;
    if (nz <= SPECD_DRAFT_Q_MAX) {
        m = 0;
        for (int i = 0; i < n; i++)
            if (probs[i] > 0.0f) {
                ids[m] = i;
                sparse[m++] = probs[i];
            }
    } else {
        m = specd_topk(probs, n, SPECD_DRAFT_Q_MAX, ids, sparse);
    }
    if (id_map)
        for (int j = 0; j < m; j++) ids[j] = id_map[ids[j]];
    sort_by_id(ids, sparse, m);
    double sum = 0;
    for (int j = 0; j < m; j++) sum += sparse[j];
    if (m == 0 || !(sum > 0)) return 0;
    for (int j = 0; j < m; j++) sparse[j] = (float)(sparse[j] / sum);
    return m;
}
