#!/usr/bin/env python3
"""lookup_headroom.py - how much a datastore of the target's own greedy
outputs could add beside the speculator's first head (retrieval drafting,
as REST, He et al. 2024, does with a text corpus), measured offline before
building it.

    build/tools-venv/bin/python bench/lookup_headroom.py \
        --datastore 'DS/cache/stage2-*.safetensors' --held 'HO/cache/stage2-*.safetensors'

Both inputs are `specd train speculator --prepare-only` caches (tokens and
the target's final-norm hidden states of its greedy continuations; see
docs/BENCHMARKS.md, fifty-first session, for the commands that make them).
For every held-out position j it compares, for the token at j + 2:

  - the speculator's first head (the script's own numpy forward of stage 0 of
    the MLPSpeculator checkpoint: the state at j and the true token j + 1),
    top-1 and top-2, as draft-svc drafts them;
  - the datastore's guess: the most frequent continuation of the longest
    context (up to --max-n tokens) that occurs in the datastore, with the
    suffix tree's probability count / (total + 1 / length)
    (common/spec/suffix_tree.h), at several floors of that probability.

It prints how often each is right, and how often the datastore is right
where it differs from the head: what it would add as a second child of the
draft's first level, next to what the head's own second choice adds.
numpy only (the tools venv has it, through matplotlib).
"""
import argparse
import collections
import math
import os

import numpy as np

from spec_cache import first_stage, load_shard, shard_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_seqs(patterns, hidden):
    """Each cached row: its tokens (the prompt's last token, then the
    continuation) and, with hidden, the state at each of them."""
    seqs = []
    for p in shard_paths(patterns, "lookup_headroom"):
        t = load_shard(p)
        for i in range(t["tokens"].shape[0]):
            n = int(t["len"][i])
            h = t["hidden"][i, :n].astype(np.float32) if hidden else None
            seqs.append((t["tokens"][i, :n].tolist(), h))
    return seqs


class FirstHead:
    """Stage 0 of an MLPSpeculator checkpoint with a reduced draft
    vocabulary (common/model/mlp_speculator.c's forward, scale_input)."""

    def __init__(self, d):
        st = first_stage(d)
        self.proj, self.emb, self.head = st["proj"], st["emb"], st["head"]
        self.lnw, self.lnb, self.vmap, self.t2d = st["lnw"], st["lnb"], st["vmap"], st["t2d"]
        self.esc = st["esc"]
        self.erf = np.frompyfunc(math.erf, 1, 1)

    def top2(self, h, nxt):
        s = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) / math.sqrt(2)
        u = s @ self.proj.T + self.esc * self.emb[self.t2d[nxt]]
        mu = u.mean(-1, keepdims=True)
        u = (u - mu) / np.sqrt(((u - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * self.lnw + self.lnb
        g = 0.5 * u * (1 + self.erf(u / math.sqrt(2)).astype(np.float32))
        lg = g @ self.head.T
        lg[:, self.vmap < 0] = -np.inf  # "other" is never drafted
        return self.vmap[np.argsort(-lg, -1)[:, :2]]


def build_table(seqs, max_n):
    tab = collections.defaultdict(collections.Counter)
    for toks, _ in seqs:
        for i in range(1, len(toks)):
            for k in range(1, min(max_n, i) + 1):
                tab[tuple(toks[i - k:i])][toks[i]] += 1
    return tab


def guess(tab, ctx, max_n):
    for k in range(min(max_n, len(ctx)), 0, -1):
        c = tab.get(tuple(ctx[-k:]))
        if c:
            tok, cnt = c.most_common(1)[0]
            return tok, cnt / (sum(c.values()) + 1.0 / k)
    return None, 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datastore", required=True, nargs="+", help="globs of the datastore's cache shards")
    ap.add_argument("--held", required=True, help="glob of the held-out prompts' cache shards")
    ap.add_argument("--speculator", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.speculator"))
    ap.add_argument("--max-n", type=int, default=8, help="longest context matched (default 8)")
    a = ap.parse_args()

    ds = load_seqs(a.datastore, hidden=False)
    held = load_seqs([a.held], hidden=True)
    head = FirstHead(a.speculator)
    tab = build_table(ds, a.max_n)
    rows = []  # (head top-1, head top-2, datastore guess, its probability, truth)
    for toks, h in held:
        if len(toks) < 3:
            continue
        j = len(toks) - 2
        top = head.top2(h[:j], np.array(toks[1:j + 1]))
        for i in range(j):
            g, p = guess(tab, toks[:i + 2], a.max_n)
            rows.append((top[i, 0], top[i, 1], g, p, toks[i + 2]))
    n = len(rows)
    h1 = sum(r[0] == r[4] for r in rows) / n
    h2 = sum(r[4] in (r[0], r[1]) for r in rows) / n
    print(f"datastore: {len(ds)} continuations, {sum(len(t) for t, _ in ds)} tokens; "
          f"held out: {len(held)} continuations, {n} positions")
    print(f"speculator's first head: top-1 right {h1:.3f}, top-1 or top-2 {h2:.3f} "
          f"(the second child adds {h2 - h1:+.3f})\n")
    print("| datastore guess | positions with one | right | differs from the head's top-1 | "
          "right where it differs (adds as a second child) |")
    print("|---|--:|--:|--:|--:|")
    for floor in (0.0, 0.5, 0.7, 0.8, 0.9):
        cov = [r for r in rows if r[2] is not None and r[3] >= floor]
        diff = [r for r in cov if r[2] != r[0]]
        right = sum(r[2] == r[4] for r in cov) / max(len(cov), 1)
        add = sum(r[2] == r[4] for r in diff) / n
        print(f"| probability >= {floor:.1f} | {len(cov) / n:.1%} | {right:.1%} | "
              f"{len(diff) / n:.1%} | {add:+.3f} |")


if __name__ == "__main__":
    main()
