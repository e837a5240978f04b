/* tok_special.c - finds special / added tokens inside text.
 *
 * Added tokens ("<|im_end|>") are matched as whole strings before any
 * pre-tokenization. A byte trie gives the longest token starting at a
 * position; scanning positions left to right yields the leftmost-longest
 * matches that Hugging Face's Aho-Corasick matcher produces. */
#include <stdlib.h>
#include <string.h>

#include "common/text/tokenizer_internal.h"

static int64_t new_node(tok_trie *tr) {
    if (tr->n_nodes == tr->cap_nodes) {
        size_t cap = tr->cap_nodes ? tr->cap_nodes * 2 : 64;
        int32_t *tok = realloc(tr->node_token, cap * sizeof *tok);
        if (!tok) return -1;
        tr->node_token = tok;
        uint8_t *always = realloc(tr->node_always, cap * sizeof *always);
        if (!always) return -1;
        tr->node_always = always;
        tr->cap_nodes = cap;
    }
    tr->node_token[tr->n_nodes] = -1;
    tr->node_always[tr->n_nodes] = 0;
    return (int64_t)tr->n_nodes++;
}

static uint64_t edge_key(uint64_t node, uint8_t byte) { return node << 8 | byte; }

int tok_trie_add(tok_trie *tr, const uint8_t *s, size_t len, int32_t id, int always) {
    if (len == 0) return 0; /* an empty token can never be matched */
    if (tr->n_nodes == 0 && new_node(tr) < 0) return -1;
    uint64_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint64_t child;
        if (!tok_u64map_get(&tr->edges, edge_key(node, s[i]), &child)) {
            int64_t fresh = new_node(tr);
            if (fresh < 0) return -1;
            child = (uint64_t)fresh;
            if (tok_u64map_put(&tr->edges, edge_key(node, s[i]), child) != 0) return -1;
        }
        node = child;
    }
    tr->first[s[0]] = 1;
    /* Two added tokens with the same text: the later id wins, as in HF. */
    tr->node_token[node] = id;
    tr->node_always[node] = (uint8_t)always;
    return 0;
}

size_t tok_trie_match(const tok_trie *tr, const uint8_t *s, size_t n, int allow_special,
                      int32_t *id) {
    if (n == 0 || !tr->first[s[0]]) return 0;
    uint64_t node = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tok_u64map_get(&tr->edges, edge_key(node, s[i]), &node)) break;
        if (tr->node_token[node] >= 0 && (allow_special || tr->node_always[node])) {
            best = i + 1;
            *id = tr->node_token[node];
        }
    }
    return best;
}

void tok_trie_free(tok_trie *tr) {
    tok_u64map_free(&tr->edges);
    free(tr->node_token);
    free(tr->node_always);
    memset(tr, 0, sizeof *tr);
}
