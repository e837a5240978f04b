#!/usr/bin/env bash
# stall_check.sh - how long a running stream stalls while a long prompt
# prefills beside it (issue 20, "busy is not dead").
#
# Starts target-svc and draft-svc with every setting at its default (only the
# model, the addresses and plaintext on loopback given), starts stream A (a
# chat prompt, 600 new tokens, greedy, end-of-sequence ignored), and once it
# is decoding sends prompt B of about TOKENS tokens of this repository's own
# text. Prints B's time to first token, A's longest gap between two streamed
# messages (`specd generate`'s "longest gap"), both requests' failovers, and
# PASS when A's longest gap is under LIMIT_MS (default 2000) with no failover.
#
#   scripts/stall_check.sh [BUILD_DIR] [TOKENS]   (default build 3000)
set -euo pipefail
BUILD=${1:-build}
SIZE=${2:-3000}
LIMIT_MS=${LIMIT_MS:-2000}
cd "$(dirname "$0")/.."
. scripts/lib/services.sh
# TARGET_FLAGS: extra target-svc flags, e.g. --batching.prefill_chunk_time=0
# shellcheck disable=SC2086
services_start "$BUILD" ${TARGET_FLAGS:-}

for _ in 1 2 3 4 5 6; do cat README.md docs/ARCHITECTURE.md docs/SPECULATION.md docs/OPERATIONS.md docs/TESTS.md; done >"$TMP/corpus.txt"
head -c $((SIZE * 33 / 10)) "$TMP/corpus.txt" >"$TMP/long.txt"
printf '\n\nSummarize the text above in one sentence.' >>"$TMP/long.txt"

"$BUILD/specd" generate --server "127.0.0.1:$DPORT" --insecure --chat \
  -p "Write a long story about a lighthouse keeper." -n 600 --ignore-eos \
  >"$TMP/a.out" 2>"$TMP/a.err" &
APID=$!
EXTRA_PIDS+=("$APID")
# until A streams (its first text lands on stdout)
for _ in $(seq 1 200); do [ -s "$TMP/a.out" ] && break; sleep 0.05; done
sleep 0.5
"$BUILD/specd" generate --server "127.0.0.1:$DPORT" --insecure -f "$TMP/long.txt" -n 8 \
  >"$TMP/b.out" 2>"$TMP/b.err"
b_done=$(kill -0 "$APID" 2>/dev/null && echo yes || echo no)
wait "$APID"
stats() { grep -E '^\[specd\] TTFT' "$1" | tail -1; }
a=$(stats "$TMP/a.err")
b=$(stats "$TMP/b.err")
gap=$(echo "$a" | sed -E 's/.*longest gap ([0-9.]+) ms.*/\1/')
fa=$(echo "$a" | sed -E 's/.*failovers ([0-9]+).*/\1/')
fb=$(echo "$b" | sed -E 's/.*failovers ([0-9]+).*/\1/')
echo "B: $b"
echo "A: $a"
echo "A still running when B finished: $b_done"
if [ "$b_done" = yes ] && awk -v g="$gap" -v l="$LIMIT_MS" 'BEGIN{exit !(g < l)}' &&
   [ "$fa" = 0 ] && [ "$fb" = 0 ]; then
  echo "longest stall of the running stream ${gap} ms (limit ${LIMIT_MS} ms), no failover: PASS"
else
  echo "longest stall ${gap} ms, failovers $fa / $fb: FAIL"
  exit 1
fi
