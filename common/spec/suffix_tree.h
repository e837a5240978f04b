/* suffix_tree.h - a depth-bounded suffix trie over token sequences, for
 * suffix decoding (SuffixDecoding, Oliaro et al. 2024; Snowflake's Arctic
 * Inference): the ngram drafter's memory of what followed what.
 *
 * Structure. Every suffix of every inserted sequence ("document"), cut to
 * at most `depth` tokens, is a path from the root; a node stands for the
 * string spelled on its path and counts how often that string occurs in the
 * documents held (an occurrence that starts too close to a document's end
 * to reach the node's depth still counts; one cut off by `depth` does not
 * exist). So count(child) / sum(count(children)) is the empirical chance
 * that the child's token follows the parent's string. Every substring of
 * at most `depth` tokens is a path, which makes the tree suffix-closed:
 * if a string occurs followed by something, so does each of its suffixes,
 * and the longest matching suffix is found by binary search.
 *
 * Documents are added whole (specd_suffix_tree_insert) or grown one token
 * at a time (specd_suffix_tree_append: the newest document; O(depth) per
 * token, as it extends the paths of the last `depth` suffixes).
 *
 * Memory cap: max_tokens > 0 bounds the tokens held over all documents.
 * Inserting past it evicts whole documents, oldest first (FIFO), until the
 * new one fits; a document longer than max_tokens keeps its first
 * max_tokens tokens. Evicting a document walks its suffixes, decrements
 * their counts, and frees the nodes that fall to zero, so the counts stay
 * exact for the documents held. Nodes <= tokens held x depth (+ the root),
 * 16 bytes each (plus one int per vocabulary entry for the root's index).
 *
 * Drafting (specd_suffix_tree_draft): match the longest suffix of the
 * context that occurs followed by something (and, when they score higher,
 * the trees of shorter suffixes), then grow a candidate tree
 * from the match's subtree best-first by path probability. A child's
 * probability is count(child) / (sum of its siblings' counts + 1/L), L the
 * length of the string it follows (match + path so far): a pseudo-count
 * for "something never seen here" (PPM's escape method A when L = 1),
 * smaller the longer the context that agreed. One sighting after one
 * token of context is worth 1/2, after nine tokens 0.9; nine agreeing
 * sightings after one token 0.9; a 5/5 split after one token two branches
 * of 5/11. Nodes are taken in order of path probability
 * while it is at least min_prob and the node and depth budgets last: a
 * confident match drafts deep and narrow, an uncertain one short and wide,
 * a weak one not at all. logq of each node is its log path probability.
 *
 * A specd_suffix_tree is not thread-safe; specd_suffix_cache wraps one with
 * a rwlock for the deployment-wide cache (many drafting readers, writers
 * that insert finished requests). */
#ifndef SPECD_SUFFIX_TREE_H
#define SPECD_SUFFIX_TREE_H

#include <stdint.h>

#include "common/util/error.h"

typedef struct specd_suffix_tree specd_suffix_tree;

/* vocab: tokens outside [0, vocab) end a document early (they cannot be
 * proposed anyway). depth: longest path, >= 2. max_tokens: cap on tokens
 * held, 0 = none. NULL + err on bad arguments or out of memory. */
specd_suffix_tree *specd_suffix_tree_create(int vocab, int depth, int64_t max_tokens,
                                            specd_error *err);
void specd_suffix_tree_free(specd_suffix_tree *t);

/* Adds toks[0..n) as a new document (evicting old ones past the cap).
 * -1 only when out of memory (the tree then holds a prefix of it). */
int specd_suffix_tree_insert(specd_suffix_tree *t, const int32_t *toks, int n);

/* Appends one token to the newest document (starting one if there is
 * none), evicting older documents past the cap; a document that is itself
 * at the cap stops growing. -1 when out of memory. */
int specd_suffix_tree_append(specd_suffix_tree *t, int32_t tok);

/* Drops every document. */
void specd_suffix_tree_clear(specd_suffix_tree *t);

/* Statistics: tokens held, documents held, live nodes (root excluded),
 * documents evicted so far. */
int64_t specd_suffix_tree_tokens(const specd_suffix_tree *t);
int specd_suffix_tree_docs(const specd_suffix_tree *t);
int64_t specd_suffix_tree_nodes(const specd_suffix_tree *t);
int64_t specd_suffix_tree_evicted(const specd_suffix_tree *t);
int specd_suffix_tree_depth(const specd_suffix_tree *t);

/* Document i (0 = the oldest held) and its length; NULL past the end. */
const int32_t *specd_suffix_tree_doc(const specd_suffix_tree *t, int i, int *n);

/* How often pattern[0..n) occurs in the documents held (n <= depth); 0 if
 * never. n = 0: the number of token positions (the root's count). */
int64_t specd_suffix_tree_count(const specd_suffix_tree *t, const int32_t *pattern, int n);

/* Length of the longest suffix of ctx[0..n), at least min_len and at most
 * max_len tokens (and < depth), that occurs followed by at least one token;
 * 0 when none. */
int specd_suffix_tree_match(const specd_suffix_tree *t, const int32_t *ctx, int n, int min_len,
                            int max_len);

typedef struct specd_suffix_draft {
    int n;            /* nodes written */
    int match_len;    /* context tokens matched (0: no draft) */
    float score;      /* expected accepted tokens: sum of the path probabilities */
} specd_suffix_draft;

/* A candidate tree for what follows ctx[0..n): from the longest matching
 * suffix of at most depth - max_depth tokens (so paths can reach
 * max_depth), or from a shorter one (halving its length, never below
 * min_len) whose tree scores higher: at most max_nodes nodes
 * (capacity of tokens/parents/logq), paths at most max_depth long, every
 * node's path probability >= min_prob. Nodes come parents first; parents[i]
 * = -1 for a child of the root (the context's last token); logq[i] = log
 * path probability. The match is at least min_len tokens long. */
specd_suffix_draft specd_suffix_tree_draft(const specd_suffix_tree *t, const int32_t *ctx, int n,
                                           int min_len, int max_depth, int max_nodes,
                                           float min_prob, int32_t *tokens, int32_t *parents,
                                           float *logq);

/* ---- the deployment-wide cache: a tree behind a rwlock ------------------ */

typedef struct specd_suffix_cache specd_suffix_cache;

specd_suffix_cache *specd_suffix_cache_create(int vocab, int depth, int64_t max_tokens,
                                              specd_error *err);
void specd_suffix_cache_free(specd_suffix_cache *c);
/* One finished request's tokens as a document (write lock). */
int specd_suffix_cache_insert(specd_suffix_cache *c, const int32_t *toks, int n);
/* specd_suffix_tree_draft under the read lock. */
specd_suffix_draft specd_suffix_cache_draft(specd_suffix_cache *c, const int32_t *ctx, int n,
                                            int min_len, int max_depth, int max_nodes,
                                            float min_prob, int32_t *tokens, int32_t *parents,
                                            float *logq);
/* Runs fn(tree, arg) under the read lock (tests, statistics). */
void specd_suffix_cache_read(specd_suffix_cache *c, void (*fn)(const specd_suffix_tree *, void *),
                             void *arg);
/* Tokens and documents held, nodes, evictions (read lock). */
void specd_suffix_cache_stats(specd_suffix_cache *c, int64_t *tokens, int *docs, int64_t *nodes,
                              int64_t *evicted);

#endif
