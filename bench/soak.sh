#!/usr/bin/env bash
# soak.sh - no creep: target-svc and draft-svc under STREAMS concurrent
# streams for SECONDS, with the resident memory (VmRSS) of both services
# sampled every INTERVAL seconds and printed as a table, then the growth
# over the second half of the run (which must level off: issue 20 asks for
# less than 1 MiB over the last 5 minutes of a 10-minute run).
#
#   bench/soak.sh [SECONDS=600] [STREAMS=32] [INTERVAL=10]
#
# The services are the built executables (build/target-svc, build/draft-svc)
# on free loopback ports, plaintext, with the default model and its trained
# speculator (models/; scripts/fetch_model.sh). Each stream is a loop of
# `specd generate --server` calls cycling through the held-out prompts
# (bench/eval-prompts.jsonl), the drafters mlp / ngram / none, greedy and
# seeded T=0.8 sampling, as chat, 48 tokens each; every 7th call is
# cancelled early by a 1 s client deadline, so cancellation paths soak too.
# Run it under `nice -n 10` on a shared machine. Needs: bash, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
streams=${2:-32}
interval=${3:-10}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
spec=models/SmolLM2-135M-Instruct.speculator
for f in build/target-svc build/draft-svc build/specd "$model" "$spec/config.json"; do
  [ -e "$f" ] || { echo "soak.sh: $f is missing (build, and scripts/fetch_model.sh)" >&2; exit 2; }
done
work=$(mktemp -d /tmp/specd-soak-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
tport=$(free_port)
dport=$(free_port)
./build/target-svc --model="$model" --listen="127.0.0.1:$tport" --tls.insecure=true \
  --limits.max_sessions=40 --limits.kv_memory=1GiB >"$work/target.log" 2>&1 &
tpid=$!
pids+=("$tpid")
./build/draft-svc --targets="127.0.0.1:$tport" --target.tls.insecure=true --tls.insecure=true \
  --listen="127.0.0.1:$dport" --tokenizer="$model" --drafter.mlp.path="$spec" \
  --drafter.default=mlp >"$work/draft.log" 2>&1 &
dpid=$!
pids+=("$dpid")
for _ in $(seq 600); do
  grep -q serving "$work/target.log" && grep -q serving "$work/draft.log" && break
  sleep 0.1
done
grep -q serving "$work/draft.log" || { cat "$work/target.log" "$work/draft.log" >&2; exit 1; }

# the prompts, one per line
python3 -c '
import json, sys
for line in open("bench/eval-prompts.jsonl"):
    print(json.loads(line)["prompt"].replace("\n", " "))' >"$work/prompts.txt"
n_prompts=$(wc -l <"$work/prompts.txt")

stream() { # stream INDEX: requests until the end time, counting them
  local i=$1 k=0 end=$2
  local drafters=(mlp ngram none)
  while [ "$(date +%s)" -lt "$end" ]; do
    local p d args
    p=$(sed -n "$(( (i * 7 + k) % n_prompts + 1 ))p" "$work/prompts.txt")
    d=${drafters[$(( (i + k) % 3 ))]}
    args=(--server "127.0.0.1:$dport" --insecure --chat -n 48 --drafter "$d" --timeout 120)
    if (( (i + k) % 2 )); then args+=(--temp 0.8 --seed "$k"); fi
    if (( k % 7 == 6 )); then args+=(--timeout 1); fi
    ./build/specd generate "${args[@]}" -p "$p" >/dev/null 2>>"$work/client-$i.err" || true
    k=$((k + 1))
  done
  echo "$k" >"$work/count-$i"
}

rss() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
start=$(date +%s)
end=$((start + secs))
for i in $(seq 0 $((streams - 1))); do
  stream "$i" "$end" &
  pids+=($!)
done

printf '%8s %14s %15s\n' "t (s)" "draft RSS MiB" "target RSS MiB"
samples=()
while :; do
  now=$(date +%s)
  t=$((now - start))
  d=$(rss "$dpid") tg=$(rss "$tpid")
  awk -v t="$t" -v d="$d" -v g="$tg" 'BEGIN { printf "%8d %14.1f %15.1f\n", t, d / 1024, g / 1024 }'
  samples+=("$t $d $tg")
  [ "$now" -ge "$end" ] && break
  sleep "$interval"
done
wait_clients=0
for i in $(seq 0 $((streams - 1))); do
  while [ ! -f "$work/count-$i" ] && [ $wait_clients -lt 1500 ]; do sleep 0.1; wait_clients=$((wait_clients + 1)); done
done
total=0
for i in $(seq 0 $((streams - 1))); do total=$((total + $(cat "$work/count-$i" 2>/dev/null || echo 0))); done

# growth over the second half: last sample minus the first sample at or
# after the midpoint
half=$((secs / 2))
python3 - "$half" "${samples[@]}" <<'PY'
import sys
half = int(sys.argv[1])
rows = [tuple(int(x) for x in s.split()) for s in sys.argv[2:]]
mid = next(r for r in rows if r[0] >= half)
last = rows[-1]
print(f"second half ({mid[0]} s -> {last[0]} s): draft-svc {(last[1]-mid[1])/1024:+.1f} MiB, "
      f"target-svc {(last[2]-mid[2])/1024:+.1f} MiB")
print(f"whole run: draft-svc {rows[0][1]/1024:.1f} -> {last[1]/1024:.1f} MiB, "
      f"target-svc {rows[0][2]/1024:.1f} -> {last[2]/1024:.1f} MiB")
PY
echo "$total requests by $streams streams in $secs s; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
# the clients' failures (their stats lines aside), most frequent first; the
# 1 s deadlines show up here as DEADLINE_EXCEEDED by design
echo "client errors:"
cat "$work"/client-*.err 2>/dev/null | grep -v -e '^\[specd\] ' -e '^$' | sed 's/[0-9.]\+ ms//' |
  sort | uniq -c | sort -rn | head -5 || true
