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
cd "$(dirname "$0")/.."
. scripts/lib/services.sh
services_start "$BUILD"

# Text to fill prompts with: the README and the prose of docs/, repeated.
for _ in 1 2 3 4 5 6; do cat README.md docs/ARCHITECTURE.md docs/SPECULATION.md docs/OPERATIONS.md docs/TESTS.md; done >"$TMP/corpus.txt"

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
