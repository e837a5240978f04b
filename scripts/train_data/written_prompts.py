#!/usr/bin/env python3
"""written_prompts.py - prompts the target writes itself, on the CPU, for
training the acceptance head on the kind of prompt the speculator was
trained for (docs/TRAINING.md).

    python3 scripts/train_data/written_prompts.py OUT.jsonl [--every N] [--threads N]
                                                  [--seed-base S]

Every N-th request of scripts/gpu/self_prompts.py (default 2: 360 of the
720) is answered by `./build/specd generate --chat` at temperature 0.8,
top-k 50, 64 tokens, seed S + its index (S = 1000 by default: seeds the
GPU recipe never used, so these are new samples; another S gives another
set, as the speculator fine-tune of docs/TRAINING.md draws several); each answer goes through
self_prompts.clean(), duplicates and the held-out prompts of
bench/eval-prompts.jsonl are dropped, and the rest are shuffled (seed 5)
so that every kind is in the first examples `specd train accept-head`
collects. Two processes of one thread each; about 6 minutes on 2 cores.
"""
import argparse
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu"))
import self_prompts  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="specd generate processes at once")
    ap.add_argument("--seed-base", type=int, default=1000, help="request i is sampled at seed S + i")
    a = ap.parse_args()
    reqs = self_prompts.requests()
    pick = [(i, reqs[i]) for i in range(0, len(reqs), a.every)]

    def answer(item):
        i, (text, kind) = item
        r = subprocess.run([os.path.join(ROOT, "build", "specd"), "generate", "--chat",
                            "--temp", "0.8", "--top-k", "50", "--seed", str(a.seed_base + i),
                            "-n", "64", "-t", "1", text],
                           capture_output=True, text=True, cwd=ROOT, check=True)
        return kind, r.stdout

    seen = self_prompts.held_out_keys(os.path.join(ROOT, "bench", "eval-prompts.jsonl"))
    kept = []
    with ThreadPoolExecutor(a.threads) as ex:
        for kind, out in ex.map(answer, pick):
            text = self_prompts.clean(out)
            if text and self_prompts.fresh(text, seen):
                kept.append({"prompt": text, "kind": kind})
    random.Random(5).shuffle(kept)
    with open(a.out, "w", encoding="utf-8") as f:
        for k in kept:
            f.write(json.dumps(k) + "\n")
    print(f"written_prompts: {len(pick)} requests, {len(kept)} prompts kept -> {a.out}")


if __name__ == "__main__":
    main()
