#!/usr/bin/env python3
"""acceptance_needed.py - what per-token acceptance a drafted chain needs for
a given speed-up, at a measured verify cost curve.

A chain of d drafted tokens, each accepted with probability a given its
parent was, yields (1 - a^(d+1)) / (1 - a) tokens a step (the target's own
token included). The step costs c(d) plain steps to verify, from
`specd bench --verify` (the "x of plain" of k = d), plus `draft` plain steps
for each drafted level (`step ms: draft` of `specd bench --e2e` over its
plain step). The best depth's speed-up is then

    max over d of  ((1 - a^(d+1)) / (1 - a)) / (c(d) + draft * d)

and this prints, for each target speed-up, the smallest a that reaches it
and at which depth, plus the speed-up at a few values of a. c between the
measured points is interpolated linearly (c(0) = 1: a plain step).

    python3 bench/acceptance_needed.py --costs 1:1.10,4:1.71,8:2.64 [--draft 0.09]

No packages beyond the standard library. The model is the speculator's
chains only: a tree's second candidate and the n-gram lookup's long matches
(code, math) do better than it. docs/BENCHMARKS.md, fiftieth session, has
the numbers it was run on.
"""
import argparse
import sys


def parse_costs(text):
    pts = {0: 1.0}
    for item in text.split(","):
        k, _, v = item.partition(":")
        try:
            k, v = int(k), float(v)
        except ValueError:
            sys.exit(f"acceptance_needed.py: --costs wants K:COST,..., got '{item}'")
        if k < 1 or v <= 0:
            sys.exit(f"acceptance_needed.py: --costs: K >= 1 and COST > 0, got '{item}'")
        pts[k] = v
    return dict(sorted(pts.items()))


def cost_at(pts, d):
    ks = list(pts)
    if d >= ks[-1]:
        return pts[ks[-1]]
    for lo, hi in zip(ks, ks[1:]):
        if lo <= d <= hi:
            return pts[lo] + (d - lo) / (hi - lo) * (pts[hi] - pts[lo])
    return pts[ks[-1]]


def best(pts, draft, a, max_depth):
    """(speed-up, depth) of the best chain depth at acceptance a."""
    out = (1.0, 0)
    for d in range(1, max_depth + 1):
        tokens = (1 - a ** (d + 1)) / (1 - a)
        out = max(out, (tokens / (cost_at(pts, d) + draft * d), d))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--costs", required=True,
                    help="K:COST,... verify cost of K drafted rows in plain steps")
    ap.add_argument("--draft", type=float, default=0.09,
                    help="drafting time per level, in plain steps (default 0.09)")
    ap.add_argument("--targets", default="1.2,1.3,1.5", help="speed-ups to solve for")
    ap.add_argument("--at", default="0.5,0.6", help="acceptances to report the speed-up at")
    args = ap.parse_args()
    pts = parse_costs(args.costs)
    max_depth = max(pts)
    print(f"costs {args.costs}, draft {args.draft} of a plain step a level, chains up to {max_depth}")
    print("| speed-up | needs a >= | at depth |")
    print("|--:|--:|--:|")
    for t in (float(x) for x in args.targets.split(",")):
        lo, hi = 0.0, 0.999
        if best(pts, args.draft, hi, max_depth)[0] < t:
            print(f"| {t:.2f}x | unreachable | - |")
            continue
        for _ in range(60):
            mid = (lo + hi) / 2
            if best(pts, args.draft, mid, max_depth)[0] < t:
                lo = mid
            else:
                hi = mid
        print(f"| {t:.2f}x | {hi:.2f} | {best(pts, args.draft, hi, max_depth)[1]} |")
    for a in (float(x) for x in args.at.split(",")):
        s, d = best(pts, args.draft, a, max_depth)
        print(f"at a = {a:.2f}: {s:.2f}x (depth {d})")


if __name__ == "__main__":
    main()
