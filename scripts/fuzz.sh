#!/usr/bin/env bash
# fuzz.sh - builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang and
# -DSPECD_FUZZ=ON, then runs each for a given time, one after another on one
# core, and prints a table: executions, executions per second, new corpus
# inputs, crashes.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 600 (10 minutes); TARGETs are short names
# (gguf, verify_request, ...; default: every tests/fuzz/fuzz_*.c). Run it
# under `nice -n 10` on a shared machine.
#
# The committed corpus (tests/fuzz/corpus/NAME/) seeds each run and is never
# written: new inputs go to build-fuzz/corpus/NAME/, crash inputs to
# build-fuzz/crashes/NAME/ (add those to the committed corpus once fixed, so
# ctest replays them forever). Exit status 1 if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
secs=${1:-600}
shift || true
if ! [[ $secs =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in tests/fuzz/fuzz_*.c; do
    n=${f##*/fuzz_}
    targets+=("${n%.c}")
  done
fi
for t in "${targets[@]}"; do
  if [ ! -f "tests/fuzz/fuzz_$t.c" ]; then
    echo "fuzz.sh: no target tests/fuzz/fuzz_$t.c" >&2
    exit 2
  fi
done

# clang for libFuzzer; the CUDA backend is not fuzzed (nvcc would get
# clang's fuzzer flags), so it is left out of this build.
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECD_FUZZ=ON \
  -DSPECD_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null

export SPECD_SOURCE_DIR=$root # fuzz_generate_request loads the test tokenizer
status=0
rows=()
for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t crashes=build-fuzz/crashes/$t
  mkdir -p "$work" "$crashes"
  log=build-fuzz/fuzz_$t.log
  echo "fuzz.sh: $t for ${secs}s (log: $log)" >&2
  # -rss_limit_mb: a leak or runaway allocation is a finding too;
  # -timeout: one input may take at most 10 s (a hang is a finding).
  set +e
  ./build-fuzz/fuzz_"$t" "$work" "tests/fuzz/corpus/$t" -max_total_time="$secs" \
    -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$crashes/" -print_final_stats=1 \
    >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  new=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
  found=$(find "$crashes" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
    status=1
    grep -m1 -E "ERROR: libFuzzer|ERROR: AddressSanitizer|runtime error" "$log" >&2 || true
  fi
  rows+=("$(printf '%-22s %14s %10s %8s %8s' "$t" "${runs:-?}" "${rate:-?}" "${new:-?}" "$found")")
done

echo
printf '%-22s %14s %10s %8s %8s\n' target executions exec/s new crashes
for r in "${rows[@]}"; do echo "$r"; done
echo "(${secs} s per target; $(lscpu | sed -n 's/^Model name: *//p'))"
exit $status
