#!/usr/bin/env bash
# concurrent_check.sh - many concurrent sessions of mixed lengths through both
# services, default config, each output checked against the same prompt run
# alone.
#
# Starts target-svc and draft-svc with every setting at its default (only the
# model, the addresses, plaintext on loopback and a metrics port given: the
# metrics listener changes nothing the sessions see), writes N prompts of
# random lengths (LO..HI tokens, a fixed seed, so every run sends the same
# ones) cut from this repository's own text, sends all N at once through
# Draft.Generate (`specd generate --server`, greedy, the server's default
# drafter, MAX_NEW tokens each), waits for all of them, then runs each prompt
# alone with local greedy decoding (`specd generate -m`, no services: a fresh
# process, one session, nothing cached) and compares the token ids. Prints
# the prompt sizes, the wall time of the concurrent phase, the target's pool
# and prefix-cache counters and the failovers (the default pool is smaller
# than 64 long contexts, so sessions wait for pages or are preempted and
# re-opened from their tokens), and PASS/FAIL with counts.
#
# Half of the prompts start at the same place of the text (so they share
# prefixes of different lengths and the prefix cache is exercised, and a
# re-opened session can reuse its own pages), the other half at random
# places.
#
#   scripts/concurrent_check.sh [BUILD_DIR] [N]      (default build, 64)
#   env: LO=100 HI=4000 MAX_NEW=16 SEED=15 THREADS=(all cores)
#        TARGET_FLAGS, DRAFT_FLAGS: extra flags for target-svc / draft-svc
#
# Takes a long time on a 2-core CPU (~120k prompt tokens in all, each
# prefilled twice: once concurrently, once alone); run it under nice. With
# the defaults on 2 cores, requests whose prefill waits in the queue longer
# than draft-svc's target.open_timeout (120 s a 2,048 tokens of history)
# fail over and, with one target, end UNAVAILABLE; on such a machine run it
# with DRAFT_FLAGS=--target.open_timeout=1800s to check the outputs.
set -euo pipefail
BUILD=${1:-build}
N=${2:-64}
LO=${LO:-100}
HI=${HI:-4000}
MAX_NEW=${MAX_NEW:-16}
SEED=${SEED:-15}
THREAD_FLAG=()
[ -n "${THREADS:-}" ] && THREAD_FLAG=(--threads "$THREADS")
read -r -a TFLAGS <<<"${TARGET_FLAGS:-}"
read -r -a DFLAGS <<<"${DRAFT_FLAGS:-}"
. scripts/lib/services.sh
MPORT=$(free_port)
scrape() { # the target's /metrics, the lines of the named counters / gauges
  python3 - "$MPORT" "$@" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
for line in text.splitlines():
    if any(line.startswith(name) for name in sys.argv[2:]):
        print("  " + line)
EOF
}
DRAFT_ARGS=(${DFLAGS[@]+"${DFLAGS[@]}"})
services_start "$BUILD" ${THREAD_FLAG[@]+"${THREAD_FLAG[@]}"} --metrics.listen "127.0.0.1:$MPORT" \
  ${TFLAGS[@]+"${TFLAGS[@]}"}
grep -m1 -i "sessions" "$TMP/target.log" || true
[ ${#TFLAGS[@]} -gt 0 ] && echo "target-svc flags beyond the defaults: ${TFLAGS[*]}"
[ ${#DFLAGS[@]} -gt 0 ] && echo "draft-svc flags beyond the defaults: ${DFLAGS[*]}"

# The prompts: N files of random lengths. Without a tokenizer here the text
# is cut by characters: this Markdown runs 3.7 characters a token on
# average (2.25 to 3.85 per prompt), so a draw of T tokens in LO..HI is cut
# at 3.6 characters a token and lands near T tokens; the exact counts are
# the local runs' and are printed.
for _ in 1 2 3 4 5 6; do cat README.md docs/ARCHITECTURE.md docs/SPECULATION.md docs/OPERATIONS.md docs/TESTS.md; done >"$TMP/corpus.txt"
python3 - "$TMP" "$N" "$LO" "$HI" "$SEED" <<'EOF'
import random, sys
tmp, n, lo, hi, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
text = open(tmp + "/corpus.txt", encoding="utf-8", errors="replace").read()
rng = random.Random(seed)
for i in range(n):
    chars = rng.randint(lo, hi) * 36 // 10
    start = 0 if i % 2 == 0 else rng.randrange(0, len(text) - chars)
    body = text[start:start + chars]
    with open("%s/p%d.txt" % (tmp, i), "w", encoding="utf-8") as f:
        f.write(body + "\n\nSummarize the text above in one sentence.")
EOF

echo "phase 1: $N requests at once through draft-svc + target-svc (max_new_tokens $MAX_NEW)"
t0=$(date +%s.%N)
pids=()
for i in $(seq 0 $((N - 1))); do
  "$BUILD/specd" generate --server "127.0.0.1:$DPORT" --insecure -f "$TMP/p$i.txt" \
    -n "$MAX_NEW" --ids >"$TMP/served$i.txt" 2>"$TMP/served$i.err" &
  pids+=($!)
done
served_fail=0
for i in $(seq 0 $((N - 1))); do
  wait "${pids[$i]}" || { served_fail=$((served_fail + 1)); echo "  request $i failed: $(tail -1 "$TMP/served$i.err")"; }
done
t1=$(date +%s.%N)
conc_s=$(echo "$t1 - $t0" | bc)
failovers=$(cat "$TMP"/served*.err | grep -oE 'failovers [0-9]+' | awk '{s += $2} END {print s + 0}')
printf '  %d of %d finished in %.1f s wall; failovers (re-opens after preemption) of those: %s\n' \
  $((N - served_fail)) "$N" "$conc_s" "$failovers"
grep -ohE 'failed \(DEADLINE_EXCEEDED[^;]*|failed \((RESOURCE_EXHAUSTED|UNAVAILABLE)[^;]*' \
  "$TMP/draft.log" | sort | uniq -c | sed 's/^/  draft-svc: /' || true
echo "  target-svc counters:"
scrape specd_target_kv_pages specd_target_prefix_cache specd_target_kv_evictions \
  specd_target_kv_preemptions specd_target_queue_timeouts || true
services_kill

echo "phase 2: each prompt alone, local greedy decoding (no services)"
pass=0 fail=0 total_prompt=0 min_len=1000000 max_len=0
t2=$(date +%s.%N)
for i in $(seq 0 $((N - 1))); do
  "$BUILD/specd" generate -m "$MODEL" ${THREAD_FLAG[@]+"${THREAD_FLAG[@]}"} -f "$TMP/p$i.txt" -n "$MAX_NEW" --ids \
    >"$TMP/local$i.txt" 2>"$TMP/local$i.err" || {
    echo "  prompt $i: local run failed: $(tail -1 "$TMP/local$i.err")"; fail=$((fail + 1)); continue; }
  len=$(grep -oE 'prompt [0-9]+ tokens' "$TMP/local$i.err" | head -1 | awk '{print $2}')
  len=${len:-0}
  total_prompt=$((total_prompt + len))
  [ "$len" -lt "$min_len" ] && min_len=$len
  [ "$len" -gt "$max_len" ] && max_len=$len
  served=$(grep -i '^ids' "$TMP/served$i.txt" || true)
  local_ids=$(grep -i '^ids' "$TMP/local$i.txt" || true)
  if [ -n "$served" ] && [ "$served" = "$local_ids" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "  prompt $i ($len tokens): FAIL"; echo "    served: $served"; echo "    alone:  $local_ids"
  fi
done
t3=$(date +%s.%N)
printf '  %d prompts alone in %.1f s; prompt tokens %d..%d, %d in all\n' \
  "$N" "$(echo "$t3 - $t2" | bc)" "$min_len" "$max_len" "$total_prompt"
if [ "$fail" -eq 0 ] && [ "$pass" -eq "$N" ]; then
  echo "PASS: $pass of $N concurrent outputs equal their alone runs (concurrent phase $(printf '%.1f' "$conc_s") s)"
  exit 0
fi
echo "FAIL: $pass of $N equal, $fail differ or failed"
exit 1
