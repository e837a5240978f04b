#!/usr/bin/env bash
# two_pods.sh - plain decoding and the default drafter through both services
# run as two pods would run them: target-svc on core 0, draft-svc and the
# client on core 1, one thread each, over loopback gRPC. Prints one
# `specd bench --e2e` table per draft-svc binary, the binaries alternated
# for ROUNDS rounds (to compare two builds, give both; the target is the
# same process for all of them). Within a table the drafters take turns
# request by request (--interleave), so a noisy host moves them together.
#
#   bench/two_pods.sh [--rounds 3] [-n 64] [--per-class 4] [--streams 1,4]
#                     [--drafters none,mlp_ngram] [--target-svc PATH]
#                     [--draft-svc PATH]...   (default: build/draft-svc)
#
# Needs 2 cores, taskset, python3, the speculator in models/.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 max_new=64 per_class=4 streams=1,4 drafters=none,mlp_ngram
target_svc=build/target-svc
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
spec=models/SmolLM2-135M-Instruct.speculator
drafts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    -n) max_new=$2; shift 2 ;;
    --per-class) per_class=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    --drafters) drafters=$2; shift 2 ;;
    --target-svc) target_svc=$2; shift 2 ;;
    --draft-svc) drafts+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "two_pods.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#drafts[@]} -gt 0 ] || drafts=(build/draft-svc)
for f in "$target_svc" "${drafts[@]}" build/specd "$model" "$spec"; do
  [ -e "$f" ] || { echo "two_pods.sh: $f is missing (scripts/setup.sh builds and fetches)" >&2; exit 2; }
done
[ "$(nproc)" -ge 2 ] || { echo "two_pods.sh: needs 2 cores, one per service" >&2; exit 2; }

. scripts/lib/services.sh

lscpu | sed -n 's/^Model name: *//p' | sed 's/^/machine: /'
echo "target-svc ($target_svc) on core 0; draft-svc and the client on core 1; 1 thread each"
tport=$(free_port)
taskset -c 0 "$target_svc" --model="$model" --listen="127.0.0.1:$tport" --tls.insecure=true \
  --threads=1 >"$TMP/target.log" 2>&1 &
TPID=$!
wait_serving "$TMP/target.log" "$TPID"

for r in $(seq "$rounds"); do
  order=("${drafts[@]}")
  if [ $((r % 2)) -eq 0 ]; then # alternate the order between rounds
    order=()
    for ((i = ${#drafts[@]} - 1; i >= 0; i--)); do order+=("${drafts[$i]}"); done
  fi
  for d in "${order[@]}"; do
    dport=$(free_port)
    taskset -c 1 "$d" --targets="127.0.0.1:$tport" --target.tls.insecure=true \
      --tls.insecure=true --listen="127.0.0.1:$dport" --tokenizer="$model" --threads=1 \
      --drafter.mlp.path="$spec" >"$TMP/draft.log" 2>&1 &
    DPID=$!
    wait_serving "$TMP/draft.log" "$DPID"
    echo
    echo "round $r, draft-svc $d:"
    taskset -c 1 ./build/specd bench --e2e --draft "127.0.0.1:$dport" --insecure \
      --drafters "$drafters" --streams "$streams" --prompts bench/eval-prompts.jsonl \
      --per-class "$per_class" -n "$max_new" --interleave 2>&1 | grep '^|'
    kill "$DPID"
    wait "$DPID" 2>/dev/null || true
    DPID=
  done
done
