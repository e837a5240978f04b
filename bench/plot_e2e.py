#!/usr/bin/env python3
"""plot_e2e.py - per-stream tok/s against total tok/s, one line per drafter.

The shape of IBM's latency-throughput figure for speculative decoding: each
point is one `specd bench --e2e` cell (a drafter at a number of concurrent
streams); moving right along a line is more load, moving up is a faster
stream. A drafter that pays sits above and to the right of `none`.

    ./build/specd bench --e2e --streams 1,4,16 --json e2e.json ...
    python3 bench/plot_e2e.py e2e.json -o e2e.png

Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="file written by specd bench --e2e --json")
    ap.add_argument("-o", "--out", default="e2e.png", help="image to write (default e2e.png)")
    ap.add_argument("--title", help="plot title (default: the CPU and thread count)")
    args = ap.parse_args()

    with open(args.json) as f:
        data = json.load(f)
    rows = data.get("rows", [])
    if not rows:
        sys.exit(f"{args.json}: no rows")

    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    by_drafter = {}
    for r in rows:
        by_drafter.setdefault(r["drafter"], []).append(r)
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    for name, rs in by_drafter.items():
        rs.sort(key=lambda r: r["streams"])
        xs = [r["tok_s"] for r in rs]
        ys = [r["tok_s_per_stream"] for r in rs]
        ax.plot(xs, ys, marker="o", label=name)
        for r, x, y in zip(rs, xs, ys):
            ax.annotate(str(r["streams"]), (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
    ax.set_xlabel("total tok/s (all streams)")
    ax.set_ylabel("tok/s per stream")
    ax.set_title(args.title or f'{data.get("cpu", "?")}, {data.get("threads", "?")} threads, '
                 f'{data.get("max_new_tokens", "?")} new tokens (labels: streams)', fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
