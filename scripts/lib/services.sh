# services.sh - sourced by the scripts that check both services end to end
# (long_prompt_check.sh, stall_check.sh, concurrent_check.sh): starts
# target-svc and draft-svc on free loopback ports with every setting at its
# default (only the model, the addresses and plaintext given), waits until
# draft-svc is healthy, and stops both (and anything in EXTRA_PIDS) on exit.
#
#   . scripts/lib/services.sh
#   DRAFT_ARGS=(...)                # optional: extra draft-svc flags
#   services_start BUILD_DIR [target-svc flags...]
#   # now: $TMP (a scratch directory), $TPORT, $DPORT, $TPID, $DPID
#   services_kill                   # stop both early (the trap still cleans up)
#
# Scripts that start the services themselves (bench/pipeline.sh,
# bench/two_pods.sh: each on its own core) use free_port, wait_serving and
# the same clean-up: TPID and DPID are stopped and $TMP removed on exit.
#
# The caller owns `set -euo pipefail`. MODEL may be set before sourcing.
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
TMP=$(mktemp -d)
EXTRA_PIDS=()
DRAFT_ARGS=()
services_stop() {
  for p in "${EXTRA_PIDS[@]}" "${DPID:-}" "${TPID:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap services_stop EXIT

services_kill() {
  kill ${DPID:-} ${TPID:-} 2>/dev/null || true
  wait ${DPID:-} ${TPID:-} 2>/dev/null || true
  DPID= TPID=
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_serving LOG PID: until a service started by hand (pinned to a core,
# another build) logs that it is serving; its log and exit 1 if it dies or
# takes two minutes.
wait_serving() {
  for _ in $(seq 1200); do
    grep -q serving "$1" && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  cat "$1" >&2
  exit 1
}

services_start() {
  local build=$1
  shift
  TPORT=$(free_port)
  DPORT=$(free_port)
  "$build/target-svc" --model "$MODEL" --listen "127.0.0.1:$TPORT" --tls.insecure "$@" \
    >"$TMP/target.log" 2>&1 &
  TPID=$!
  "$build/draft-svc" --tokenizer "$MODEL" --targets "127.0.0.1:$TPORT" \
    --listen "127.0.0.1:$DPORT" --tls.insecure --target.tls.insecure \
    ${DRAFT_ARGS[@]+"${DRAFT_ARGS[@]}"} >"$TMP/draft.log" 2>&1 &
  DPID=$!
  for _ in $(seq 1 600); do
    "$build/specd" health "127.0.0.1:$DPORT" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "draft-svc did not become healthy"
  cat "$TMP/target.log" "$TMP/draft.log"
  exit 1
}
