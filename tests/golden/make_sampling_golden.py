#!/usr/bin/env python3
"""make_sampling_golden.py - reference fixture for specd's logit processing (common/spec/sampling.h).

WHAT IT MAKES (committed; CI never runs this script):

  tests/golden/data/sampling/reference.json   ("specd-sampling-golden/1")

  A few dozen cases, each a random logit row over a small vocabulary plus a random token history
  (prompt ids, then generated ids, with repeats), and a full set of sampling parameters. For each
  case it stores what the reference computes:

    "adjusted"  the logits after, in this order (specd's documented order, proto SamplingParams):
                  1. logit bias            transformers SequenceBiasLogitsProcessor with one-token
                                           sequences (adds the bias to those ids)
                  2. repetition penalty    transformers RepetitionPenaltyLogitsProcessor over prompt +
                                           generated ids (CTRL: score < 0 ? score * r : score / r,
                                           once per distinct id)
                  3. frequency / presence  the OpenAI formula (transformers has no processor for it):
                                           l[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty
                                           with c[j] = times j was GENERATED (the prompt does not
                                           count), evaluated in float32 as (c * f + p) then subtracted
    "probs"     softmax after transformers' warpers on "adjusted", in generate()'s order:
                TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper -> MinPLogitsWarper
                (each only when on); filtered tokens are exactly 0.
    "logprobs"  log_softmax of the RAW logits (what specd reports as TokenLogprob), computed in
                float64 and rounded to float32, with the top 5 ids (descending, lower id on ties).

  The existing C tests compare specd_sampling_probs with a C reference written from the header's
  definition; this fixture checks the same chain against transformers itself.

WHY THE CASES ARE SAFE TO COMPARE
  specd and torch round differently in the last bits (temperature as a multiply vs a divide, float
  vs double sums). A case whose kept set could flip from that (a token whose cumulative top-p mass
  or min-p ratio sits within 1e-4 of the threshold, or a tie at the top-k boundary) is redrawn, so
  the kept sets must agree exactly and the values within float rounding.

  C side: tests/unit/test_sampling.c, test_hf_golden (tolerances there).

USAGE
  python3 tests/golden/make_sampling_golden.py            # writes the fixture
  python3 tests/golden/make_sampling_golden.py --verify   # recomputes and compares, writes nothing
Versions used: torch 2.15.0 (CPU), transformers 5.23.0, numpy 2.4.6 (recorded in the file).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "sampling", "reference.json")
VOCAB = 40
N_TOP = 5
SEED = 20261121
MARGIN = 1e-4  # how far every filter threshold must be from the case's values

# (temperature, top_k, top_p, min_p, repetition, frequency, presence, n_bias)
# Hand-picked to cover each stage alone, the combinations, the edges of each range, and
# "off" values (repetition 1, penalties 0).
CONFIGS = [
    (1.0, 0, 1.0, 0.0, 1.3, 0.0, 0.0, 0),
    (1.0, 0, 1.0, 0.0, 0.7, 0.0, 0.0, 0),    # r < 1 rewards repeats
    (1.0, 0, 1.0, 0.0, 10.0, 0.0, 0.0, 0),   # the largest allowed
    (1.0, 0, 1.0, 0.0, 1.0, 0.5, 0.0, 0),
    (1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.8, 0),
    (1.0, 0, 1.0, 0.0, 1.0, -2.0, 2.0, 0),   # range ends, negative frequency
    (1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 3),    # bias alone
    (1.0, 0, 1.0, 0.0, 1.2, 0.3, 0.4, 4),    # every adjustment
    (0.7, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 0),    # temperature alone
    (1.0, 5, 1.0, 0.0, 1.0, 0.0, 0.0, 0),    # top-k alone
    (1.0, 0, 0.9, 0.0, 1.0, 0.0, 0.0, 0),    # top-p alone
    (1.0, 0, 1.0, 0.1, 1.0, 0.0, 0.0, 0),    # min-p alone
    (0.8, 12, 0.95, 0.05, 1.0, 0.0, 0.0, 0),
    (1.5, 8, 0.8, 0.0, 1.5, 0.2, 0.1, 2),
    (0.6, 0, 0.7, 0.02, 1.1, 0.0, 1.0, 5),
    (2.0, 20, 0.99, 0.0, 0.9, 1.0, -0.5, 1),
    (1.0, 3, 0.5, 0.2, 2.0, 0.0, 0.0, 6),
    (0.9, 0, 0.95, 0.0, 1.3, 0.6, 0.6, 40),  # bias on the whole vocabulary
]


def processed(logits, prompt, gen, cfg, bias):
    """Runs the reference chain. Returns (adjusted float32 [V], probs float32 [V], margin)."""
    t, k, p, minp, rep, freq, pres, _ = cfg
    scores = torch.tensor(logits, dtype=torch.float32).unsqueeze(0)
    history = torch.tensor([prompt + gen], dtype=torch.long) if prompt + gen else \
        torch.zeros((1, 0), dtype=torch.long)
    if bias:
        scores = SequenceBiasLogitsProcessor([[[i], float(b)] for i, b in bias])(history, scores)
    if rep != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(penalty=rep)(history, scores)
    adj = scores[0].numpy().astype(np.float32).copy()
    if freq != 0.0 or pres != 0.0:
        counts = np.bincount(np.array(gen, dtype=np.int64), minlength=VOCAB) if gen else \
            np.zeros(VOCAB, dtype=np.int64)
        for j in range(VOCAB):
            if counts[j] > 0:
                amount = np.float32(np.float32(counts[j]) * np.float32(freq)) + np.float32(pres)
                adj[j] = np.float32(adj[j] - np.float32(amount))
    scores = torch.tensor(adj).unsqueeze(0)

    # Distance of every filter decision from its threshold (in the reference's own arithmetic),
    # so that cases on a knife edge can be redrawn.
    margin = float("inf")
    if t != 1.0:
        scores = TemperatureLogitsWarper(t)(history, scores)
    if k > 0:
        srt = torch.sort(scores[0], descending=True).values
        margin = min(margin, float(srt[k - 1] - srt[k]))  # a tie at the boundary keeps both in HF
        scores = TopKLogitsWarper(k)(history, scores)
    if p < 1.0:
        asc = torch.sort(scores[0], descending=False).values
        cum = asc.softmax(dim=-1).cumsum(dim=-1)
        margin = min(margin, float((cum - (1 - p)).abs().min()))
        scores = TopPLogitsWarper(p)(history, scores)
    if minp > 0.0:
        pr = torch.softmax(scores[0], dim=-1)
        thr = minp * pr.max()
        live = pr > 0
        margin = min(margin, float(((pr[live] - thr).abs() / pr.max()).min()))
        scores = MinPLogitsWarper(minp)(history, scores)
    probs = torch.softmax(scores[0], dim=-1).numpy().astype(np.float32)
    return adj, probs, margin


def logprobs(logits):
    l64 = np.asarray(logits, dtype=np.float64)
    m = l64.max()
    lse = m + np.log(np.exp(l64 - m).sum())
    lp = (l64 - lse).astype(np.float32)
    order = sorted(range(VOCAB), key=lambda i: (-logits[i], i))[:N_TOP]
    return lp, order


def draw_case(rng, cfg):
    """One random case for cfg whose filter decisions are at least MARGIN from a threshold."""
    for _ in range(1000):
        logits = (rng.standard_normal(VOCAB) * 3.0).astype(np.float32)
        n_prompt = int(rng.integers(0, 12))
        n_gen = int(rng.integers(0, 16))
        # A narrow id range for the history so that ids repeat (counts > 1).
        prompt = [int(x) for x in rng.integers(0, VOCAB, n_prompt)]
        gen = [int(x) for x in rng.integers(0, VOCAB // 2, n_gen)]
        n_bias = cfg[7]
        ids = rng.permutation(VOCAB)[:n_bias]
        bias = [(int(i), float(np.float32(rng.uniform(-5.0, 5.0)))) for i in ids]
        if n_bias >= 3:
            bias[0] = (bias[0][0], -100.0)  # a ban
            bias[1] = (bias[1][0], 100.0)   # the other end of the range
        adj, probs, margin = processed([float(x) for x in logits], prompt, gen, cfg, bias)
        if margin < MARGIN:
            continue
        return logits, prompt, gen, bias, adj, probs
    raise SystemExit("could not draw a case away from the thresholds")


def f32list(a):
    # float(np.float32) is exact in a double, and json writes the shortest repr that parses back
    # to that double, so C reads the identical float.
    return [float(np.float32(x)) for x in a]


def build():
    rng = np.random.default_rng(SEED)
    cases = []
    for ci, cfg in enumerate(CONFIGS):
        for rep in range(2):
            logits, prompt, gen, bias, adj, probs = draw_case(rng, cfg)
            lp, top = logprobs([float(x) for x in logits])
            t, k, p, minp, r, freq, pres, _ = cfg
            cases.append({
                "name": f"config{ci}/{rep}",
                "params": {"temperature": t, "top_k": k, "top_p": p, "min_p": minp,
                           "repetition_penalty": r, "frequency_penalty": freq,
                           "presence_penalty": pres,
                           "logit_bias": [{"token_id": i, "bias": b} for i, b in bias]},
                "prompt": prompt,
                "generated": gen,
                "logits": f32list(logits),
                "adjusted": f32list(adj),
                "probs": f32list(probs),
                "logprobs": f32list(lp),
                "top_ids": top,
            })
    return {
        "schema": "specd-sampling-golden/1",
        "description": "logit bias, repetition / frequency / presence penalties, temperature, top-k, "
                       "top-p, min-p and log-probabilities, by transformers' logits processors "
                       "(frequency/presence: the OpenAI formula); see make_sampling_golden.py",
        "generator": {"script": "tests/golden/make_sampling_golden.py", "seed": SEED,
                      "versions": {"torch": torch.__version__,
                                   "transformers": transformers.__version__,
                                   "numpy": np.__version__, "python": sys.version.split()[0]}},
        "vocab": VOCAB,
        "n_top": N_TOP,
        "cases": cases,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verify", action="store_true", help="recompute and compare; write nothing")
    a = ap.parse_args()
    ref = build()
    if a.verify:
        with open(OUT) as f:
            old = json.load(f)
        same = old["cases"] == ref["cases"]
        print("fixture reproduces" if same else "fixture DIFFERS from a fresh run")
        return 0 if same else 1
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # One case per line: small, and a regenerated fixture diffs case by case.
    head = {k: v for k, v in ref.items() if k != "cases"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "cases": [\n'
    text += ",\n".join("  " + json.dumps(c, separators=(",", ":")) for c in ref["cases"])
    text += "\n ]\n}\n"
    assert json.loads(text) == ref
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT}: {len(ref['cases'])} cases, vocab {VOCAB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
