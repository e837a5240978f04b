#!/usr/bin/env bash
# long_prompt_check.sh - long prompts through both services, default config.
#
# Starts target-svc and draft-svc with every setting at its default (only the
# model, the addresses and plaintext on loopback given), sends prompts of about 3,000 and 8,000 tokens of
# this repository's own text through Draft.Generate (greedy, ngram drafter:
# the server's default), and checks that the token ids equal local greedy
# decoding (`specd generate`, no services) of the same prompt. Prints the
# prompt sizes, the time each took through the services, and PASS/FAIL.
#
#   scripts/long_prompt_check.sh [BUILD_DIR] [TOKENS...]   (default build, 3000 8000)
#
# Takes a few minutes on a 2-core CPU (an 8k prefill is the slow part).
set -euo pipefail
BUILD=${1:-build}
shift || true
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(3000 8000)
N_NEW=${N_NEW:-32}
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
TMP=$(mktemp -d)
cleanup() {
  [ -n "${DPID:-}" ] && kill "$DPID" 2>/dev/null || true
  [ -n "${TPID:-}" ] && kill "$TPID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TPORT=$(free_port)
DPORT=$(free_port)

"$BUILD/target-svc" --model "$MODEL" \
  --listen "127.0.0.1:$TPORT" --tls.insecure >"$TMP/target.log" 2>&1 &
TPID=$!
"$BUILD/draft-svc" --tokenizer "$MODEL" \
  --targets "127.0.0.1:$TPORT" --listen "127.0.0.1:$DPORT" --tls.insecure \
  --target.tls.insecure >"$TMP/draft.log" 2>&1 &
DPID=$!
for _ in $(seq 1 600); do
  "$BUILD/specd" health "127.0.0.1:$DPORT" >/dev/null 2>&1 && break
  sleep 0.2
done
"$BUILD/specd" health "127.0.0.1:$DPORT" >/dev/null || {
  echo "draft-svc did not become healthy"; cat "$TMP/target.log" "$TMP/draft.log"; exit 1; }

# Text to fill prompts with: the README and the architecture map, repeated.
for _ in 1 2 3 4 5 6; do cat README.md docs/ARCHITECTURE.md; done >"$TMP/corpus.txt"

status=0
for size in "${SIZES[@]}"; do
  # about 3.3 characters a token for this Markdown text; the exact count is
  # the local run's (its "[specd] prompt N tokens" line)
  head -c $((size * 33 / 10)) "$TMP/corpus.txt" >"$TMP/p$size.txt"
  printf '\n\nSummarize the text above in one sentence.' >>"$TMP/p$size.txt"
  t0=$(date +%s.%N)
  "$BUILD/specd" generate --server "127.0.0.1:$DPORT" --insecure -f "$TMP/p$size.txt" \
    -n "$N_NEW" --ids >"$TMP/served$size.txt" 2>"$TMP/served$size.err" || {
    echo "size $size: served request failed"; cat "$TMP/served$size.err"
    echo "--- target-svc log:"; tail -5 "$TMP/target.log"; echo "--- draft-svc log:"; tail -5 "$TMP/draft.log"
    status=1; continue; }
  t1=$(date +%s.%N)
  "$BUILD/specd" generate -m "$MODEL" -f "$TMP/p$size.txt" -n "$N_NEW" --ids \
    >"$TMP/local$size.txt" 2>"$TMP/local$size.err" || {
    echo "size $size: local run failed"; cat "$TMP/local$size.err"; status=1; continue; }
  served=$(grep -i '^ids' "$TMP/served$size.txt" || true)
  local_ids=$(grep -i '^ids' "$TMP/local$size.txt" || true)
  prompt_tokens=$(grep -oE 'prompt [0-9]+ tokens' "$TMP/local$size.err" | head -1 || true)
  if [ -n "$served" ] && [ "$served" = "$local_ids" ]; then
    printf 'size ~%s tokens (%s): %.1f s through draft-svc+target-svc, %s: PASS\n' \
      "$size" "${prompt_tokens:-?}" "$(echo "$t1 - $t0" | bc)" "$(echo "$served" | cut -c1-60)"
  else
    echo "size ~$size: FAIL"; echo " served: $served"; echo " local:  $local_ids"; status=1
  fi
done
exit $status
