#!/usr/bin/env bash
# pipeline.sh - pipelined drafting (docs/SPECULATION.md, "Pipelined drafting") measured as
# the services are deployed: two processes, each on a core of its own.
#
# target-svc runs on core 0 and draft-svc, offering draft_lm, on core 1 (one
# thread each). For each of ROUNDS rounds draft-svc is started twice, with
# speculation.pipeline on and off (the order alternates between rounds), and
# `specd bench --e2e --draft` sends the same held-out prompts through it,
# plain (drafter none) and with draft_lm. One Markdown table: per run, plain
# and draft_lm tok/s, the speed-up, tau, draft-svc's drafting time per step
# (what pipelining takes off the step's path) and the share of the trees
# drafted ahead that were used; then the median speed-up of each mode.
#
#   bench/pipeline.sh [--rounds 3] [-n 64] [--per-class 2]
#                     [--draft-model PATH] [--precision exact|fast]
#                     [--draft-svc PATH]   (another build's draft-svc, to compare two)
#
# What it drafts with: the setup installs one model, so by default the draft
# model is the target's own file, and the target runs it at `precision:
# exact` (fp32 activations) while draft_lm runs the fast int8 path: the
# draft is then a cheaper, quantized twin of the target that agrees with its
# greedy tokens nearly always, the shape of a real deployment (a small fast
# draft model for a slow target) on two cores. --precision fast makes the
# two equally fast, where no drafting can pay. Needs 2 cores, taskset,
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
max_new=64
per_class=2
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
draft_model=$model
precision=exact
draft_svc=build/draft-svc
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    -n) max_new=$2; shift 2 ;;
    --per-class) per_class=$2; shift 2 ;;
    --draft-model) draft_model=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --draft-svc) draft_svc=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "pipeline.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for f in build/target-svc "$draft_svc" build/specd "$model" "$draft_model"; do
  [ -e "$f" ] || { echo "pipeline.sh: $f is missing (scripts/setup.sh builds and fetches)" >&2; exit 2; }
done
[ "$(nproc)" -ge 2 ] || { echo "pipeline.sh: needs 2 cores, one per service" >&2; exit 2; }

. scripts/lib/services.sh

tport=$(free_port)
taskset -c 0 ./build/target-svc --model="$model" --listen="127.0.0.1:$tport" --tls.insecure=true \
  --threads=1 --precision="$precision" >"$TMP/target.log" 2>&1 &
TPID=$!
wait_serving "$TMP/target.log" "$TPID"

run() { # run on|off ROUND: one draft-svc, one bench; appends a JSON line
  local mode=$1 round=$2 dport
  dport=$(free_port)
  local pipe=true
  [ "$mode" = on ] || pipe=false
  taskset -c 1 "$draft_svc" --targets="127.0.0.1:$tport" --target.tls.insecure=true \
    --tls.insecure=true --listen="127.0.0.1:$dport" --tokenizer="$model" --threads=1 \
    --drafter.draft_lm.path="$draft_model" --drafter.draft_lm.max_sessions=4 \
    --speculation.pipeline="$pipe" >"$TMP/draft-$mode-$round.log" 2>&1 &
  DPID=$!
  wait_serving "$TMP/draft-$mode-$round.log" "$DPID"
  # the client on core 1 too: it only waits on the stream
  taskset -c 1 ./build/specd bench --e2e --draft "127.0.0.1:$dport" --insecure \
    --drafters none,draft_lm --streams 1 --prompts bench/eval-prompts.jsonl \
    --per-class "$per_class" -n "$max_new" --json "$TMP/run-$mode-$round.json" \
    >"$TMP/bench-$mode-$round.txt" 2>&1 || { cat "$TMP/bench-$mode-$round.txt" >&2; exit 1; }
  kill "$DPID"
  wait "$DPID" 2>/dev/null || true
  DPID=
  echo "$mode $round $TMP/run-$mode-$round.json" >>"$TMP/runs"
}

for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then run on "$r"; run off "$r"; else run off "$r"; run on "$r"; fi
  echo "pipeline.sh: round $r of $rounds done" >&2
done

python3 - "$TMP/runs" "$precision" "$draft_model" "$model" <<'EOF'
import json, statistics, subprocess, sys
runs_file, precision, draft_model, model = sys.argv[1:5]
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
name = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
flags = next((l.split(":", 1)[1].split() for l in lscpu.splitlines() if l.startswith("Flags")), [])
simd = " ".join(f for f in ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"] if f in flags)
print(f"machine: {name} ({simd}); target-svc on core 0, draft-svc + client on core 1, 1 thread each")
print(f"target: {model}, precision {precision}; draft_lm: {draft_model} (fast path)\n")
print("| round | pipeline | plain tok/s | draft_lm tok/s | speed-up | tau | draft ms/step | trees drafted ahead used |")
print("|--:|---|--:|--:|--:|--:|--:|--:|")
speedups = {"on": [], "off": []}
for line in open(runs_file):
    mode, rnd, path = line.split()
    rows = {r["drafter"]: r for r in json.load(open(path))["rows"]}
    plain, lm = rows["none"], rows["draft_lm"]
    sp = lm["tok_s"] / plain["tok_s"]
    speedups[mode].append(sp)
    ahead = lm.get("pipelined_drafts", 0)
    used = f"{100 * lm['pipelined_hits'] / ahead:.0f}% of {ahead:.0f}" if ahead else "-"
    print(f"| {rnd} | {mode} | {plain['tok_s']:.1f} | {lm['tok_s']:.1f} | {sp:.2f}x | "
          f"{lm['tau']:.2f} | {lm['step_draft_ms']:.2f} | {used} |")
print()
for mode in ("on", "off"):
    if speedups[mode]:
        print(f"pipeline {mode}: median speed-up {statistics.median(speedups[mode]):.2f}x "
              f"over {len(speedups[mode])} runs")
EOF
