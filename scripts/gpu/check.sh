#!/usr/bin/env bash
# check.sh - the GPU bring-up kit: one command that builds, checks and
# benchmarks the CUDA path on a GPU machine within one 10-minute device
# command (issue 17; docs/GPU.md gives the order of commands).
#
#   scripts/gpu/check.sh                 # on the GPU machine (after bundle.sh here)
#   scripts/gpu/check.sh --dry-run       # anywhere: the same steps on the CPU backend
#   OUT=dir scripts/gpu/check.sh ...     # where the report goes (default gpu-report/)
#
# Steps (each a row of the summary table; a step that cannot run says why):
#   bundle     verify .gpu-bundle/ (scripts/gpu/bundle.sh) by checksum, unpack
#              it into .gpu-prefix/ and use it: pkg-config, protoc-c and the
#              shared libraries come from there. Dry run: the same unpacking,
#              plus a CMake configure against the bundle alone.
#   build      GPU: a fresh build-gpu/ with nvcc for the GPU's own
#              architecture (sm_90 on H100/H200), Ninja, all cores.
#              Dry run: the existing --build-dir (default build/), brought
#              up to date.
#   model      the default GGUF from .gpu-model/ parts (model_parts.sh) if
#              they were sent; else none (the benches use its shape).
#   torch      PyTorch cross-check: torch_xcheck.py builds a tiny Llama with
#              transformers (fixed seed) and PyTorch's references on the GPU;
#              test_golden compares our CPU and CUDA forward with them.
#              Skipped, visibly, where torch is not installed (CI).
#   tests      test_backend_ops, test_golden, test_transformer and
#              test_hidden_ipc; on a GPU, any "SKIPPED:" of their CUDA
#              halves is a failure.
#   bench-7b   specd bench --verify --backend cuda --shape llama2-7b (GPU only)
#   bench-smol the same on SmolLM2-135M: the real file if present, else the
#              random same-shape model (--shape smollm2-135m). Dry run: the
#              default model on the CPU, a small grid.
#   e2e        both services in this process, mlp drafter (the shipped
#              speculator) on the same backend: specd bench --e2e plain vs
#              mlp vs ngram, and specd generate speculative vs plain, which
#              must give identical tokens (greedy).
#   ipc        co-location: target-svc as a separate process, draft-svc's
#              mlp speculator on the same GPU: hidden states through CUDA
#              IPC (common/rpc/ipc_caps.h); any fallback to bytes fails it.
#              Dry run: the CPU target refuses, the bytes path must work.
#   profile    GPU only: the batch-1 verify bench with CUDA graphs off, and
#              each kernel's GPU time (ncu) over a 16-token generation,
#              summed by kernel name into $OUT/kernels.txt.
# Writes $OUT/report.md (machine, summary table, bench tables) and
# $OUT/check.log (every command's raw output), and prints the summary table
# last. Exit 0 when no step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
T0=$(date +%s)
BUDGET=${SPECD_CHECK_BUDGET:-560}   # seconds: the device allows 600 per command

DRY=0; BUILD=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --build-dir) BUILD=$2; shift ;;
    -h|--help) sed -n 2,40p "$0"; exit 0 ;;
    *) echo "check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ $DRY = 0 ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "check.sh: no NVIDIA GPU here (nvidia-smi -L fails): running the dry run on the CPU"
  DRY=1
fi
if [ $DRY = 1 ]; then BACKEND=cpu; BUILD=${BUILD:-build}; else BACKEND=cuda; BUILD=${BUILD:-build-gpu}; fi
OUT=${OUT:-$ROOT/gpu-report}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/check.log; REPORT=$OUT/report.md; TABLE=$OUT/.summary; BENCHES=$OUT/.benches
WORK=$ROOT/.gpu-prefix/work          # models made here (git-ignored)
: > "$LOG"; : > "$TABLE"; : > "$BENCHES"
mkdir -p "$WORK"
FAILED=0
SPEC=models/SmolLM2-135M-Instruct.speculator
GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf

left() { echo $((BUDGET - ($(date +%s) - T0))); }
# row STEP RESULT SECONDS DETAIL
row() {
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >> "$TABLE"
  [ "$2" != FAIL ] || FAILED=1
  printf 'check.sh: %-10s %-4s %5ss  %s\n' "$1" "$2" "$3" "$4"
}
# run NAME TIMEOUT CMD...: the command's output to the log (and to $STEP_OUT)
STEP_OUT=$WORK/step.out
run() {
  local name=$1 limit=$2; shift 2
  { echo; echo "===== [$name] $*"; } >> "$LOG"
  timeout --kill-after=10 "$limit" "$@" > "$STEP_OUT" 2>&1
  local rc=$?
  cat "$STEP_OUT" >> "$LOG"
  [ $rc != 124 ] && [ $rc != 137 ] || echo "===== [$name] stopped after ${limit}s" >> "$LOG"
  return $rc
}
since() { echo $(($(date +%s) - $1)); }
# a step's time limit: its own cap, but never past the budget
cap() { local l; l=$(left); [ "$l" -gt "$1" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
bench_block() { { echo; echo "### $1"; echo; echo '```'; cat "$STEP_OUT"; echo '```'; } >> "$BENCHES"; }

# --- the machine -----------------------------------------------------------
{
  echo "# specd GPU bring-up kit report"
  echo
  # the device's copy of the tree may have no .git
  if rev=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet 2>/dev/null || rev="$rev (+ local changes)"
  else rev="unknown (no git here)"; fi
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $rev"
  echo "- mode: $([ $DRY = 1 ] && echo 'DRY RUN on the CPU backend (no GPU)' || echo 'GPU, backend cuda')"
  echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; SIMD: $(grep -o -w 'avx2\|avx512f\|avx512bw\|avx512vl\|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  if [ $DRY = 0 ]; then
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader)"
    echo "- nvcc: $(nvcc --version | tail -2 | head -1)"
  fi
} > "$REPORT"
[ $DRY = 1 ] || nvidia-smi >> "$LOG" 2>&1

# --- bundle ----------------------------------------------------------------
t=$(date +%s)
PREFIX=$ROOT/.gpu-prefix/root
if [ -f .gpu-bundle/prefix.tar.xz ]; then
  if ! (cd .gpu-bundle && sha256sum -c --quiet SHA256SUMS) >> "$LOG" 2>&1; then
    row bundle FAIL "$(since $t)" ".gpu-bundle/prefix.tar.xz does not match SHA256SUMS"
  else
    rm -rf "$PREFIX"; mkdir -p "$PREFIX"
    # tar's xz filter, or Python's (an image may lack xz-utils)
    if tar -C "$PREFIX" -xJf .gpu-bundle/prefix.tar.xz 2>> "$LOG" ||
       python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
         .gpu-bundle/prefix.tar.xz "$PREFIX" 2>> "$LOG"; then
      if [ $DRY = 0 ]; then
        export SPECD_PREFIX=$PREFIX
        # shellcheck disable=SC1091
        . "$PREFIX/bundle.env"
        mods=""; for m in libpcre2-8 libcjson cmocka yaml-0.1 grpc libprotobuf-c openblas; do
          "$PKG_CONFIG" --exists "$m" || mods="$mods $m"; done
        if [ -z "$mods" ] && protoc-c --version >> "$LOG" 2>&1; then
          row bundle PASS "$(since $t)" "$(wc -l < .gpu-bundle/MANIFEST) packages unpacked into .gpu-prefix/; pkg-config and protoc-c from there"
        else
          row bundle FAIL "$(since $t)" "unresolved:${mods:- protoc-c does not run}"
        fi
      else
        # dry run: prove CMake finds everything in the bundle alone (the
        # GPU build does this for real); the build below keeps the
        # system libraries it was configured with
        if run bundle "$(cap 120)" env SPECD_PREFIX="$PREFIX" bash -c \
             '. "$SPECD_PREFIX/bundle.env" && rm -rf "$0" && cmake -S . -B "$0" -DSPECD_CUDA=OFF -DCMAKE_BUILD_TYPE=Release' \
             "$WORK/cmake-bundle"; then
          row bundle PASS "$(since $t)" "unpacked; CMake configured against the bundle alone ($(wc -l < .gpu-bundle/MANIFEST) packages)"
        else
          row bundle FAIL "$(since $t)" "CMake could not configure against the bundle (check.log)"
        fi
        rm -rf "$WORK/cmake-bundle"
      fi
    else
      row bundle FAIL "$(since $t)" "could not unpack .gpu-bundle/prefix.tar.xz"
    fi
  fi
elif [ $DRY = 1 ]; then
  row bundle SKIP 0 "no .gpu-bundle/ (run scripts/gpu/bundle.sh); using the system libraries"
else
  row bundle FAIL 0 "no .gpu-bundle/: run scripts/gpu/bundle.sh here and carry .gpu-bundle"
fi

# --- build -----------------------------------------------------------------
t=$(date +%s)
BUILT=0
if [ $DRY = 0 ]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  # SPECD_WERROR=OFF: the image's gcc may be newer than Debian 12's and
  # warn where ours does not; a warning must not cost the GPU window, so it
  # is counted in the row instead (CI keeps -Werror)
  if run build-cfg "$(cap 120)" cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSPECD_WERROR=OFF &&
     run build "$(cap 420)" cmake --build "$BUILD" -j"$(nproc)"; then
    BUILT=1
    row build PASS "$(since $t)" "$BUILD/, nvcc for sm_$arch, $(nproc) jobs, $(grep -c 'warning' "$STEP_OUT") warning lines (check.log)"
  else
    row build FAIL "$(since $t)" "$(grep -m1 -i 'error' "$STEP_OUT" | cut -c1-160)"
  fi
else
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    row build FAIL 0 "$BUILD/ is not configured (cmake -S . -B $BUILD first)"
  elif run build "$(cap 300)" cmake --build "$BUILD" -j2; then
    BUILT=1; row build PASS "$(since $t)" "$BUILD/ up to date"
  else
    row build FAIL "$(since $t)" "$(grep -m1 -i 'error' "$STEP_OUT" | cut -c1-160)"
  fi
fi
S=$BUILD/specd

# --- model -----------------------------------------------------------------
t=$(date +%s)
if [ -f .gpu-model/SHA256SUMS ]; then
  if run model 120 scripts/gpu/model_parts.sh join; then
    row model PASS "$(since $t)" "$(tail -1 "$STEP_OUT" | cut -c1-160)"
  else
    row model FAIL "$(since $t)" "$(tail -1 "$STEP_OUT" | cut -c1-160)"
  fi
elif [ -f "$GGUF" ]; then
  row model PASS 0 "$GGUF present"
else
  row model SKIP 0 "no model parts sent: the benches use the same-shape random model"
fi
HAVE_GGUF=0; [ -f "$GGUF" ] && HAVE_GGUF=1

# --- torch -----------------------------------------------------------------
# Python runs without the bundle's libraries on its path (its own OpenSSL,
# zlib and libstdc++ stay the image's).
t=$(date +%s)
XSET=""
PY=(env -u LD_LIBRARY_PATH python3)
if ! "${PY[@]}" -c 'import torch, transformers' >/dev/null 2>&1; then
  row torch SKIP 0 "PyTorch/transformers not installed here (CI does not install them)"
elif run torch-make "$(cap 180)" "${PY[@]}" scripts/gpu/torch_xcheck.py xcheck "$WORK/xcheck"; then
  XSET=$WORK/xcheck
  if [ $BUILT = 0 ]; then
    row torch SKIP "$(since $t)" "PyTorch references made ($WORK/xcheck); not built, so nothing to compare"
  elif run torch "$(cap 180)" env SPECD_GOLDEN_EXTRA="$XSET" SPECD_SOURCE_DIR="$ROOT" \
       "$BUILD/test_golden"; then
    cuda=$(grep -o 'golden on cuda: [0-9]* cases' "$STEP_OUT" || true)
    if [ $DRY = 0 ] && [ -z "$cuda" ]; then
      row torch FAIL "$(since $t)" "test_golden did not run its CUDA half"
    else
      row torch PASS "$(since $t)" "our forward vs PyTorch on a tiny Llama (fp32 + bf16)${cuda:+; $cuda}"
    fi
  else
    row torch FAIL "$(since $t)" "$(grep -m1 -E 'differ|FAILED|error' "$STEP_OUT" | cut -c1-160)"
  fi
else
  row torch FAIL "$(since $t)" "torch_xcheck.py failed (check.log)"
fi

# --- tests -----------------------------------------------------------------
t=$(date +%s)
if [ $BUILT = 1 ]; then
  # -V: the tests' own lines (their SKIPPED: lines) reach the log
  if run tests "$(cap 240)" ctest --test-dir "$BUILD" -V \
       -R '^(test_backend_ops|test_golden|test_transformer|test_hidden_ipc)$'; then
    skipped=$(grep -c 'SKIPPED:' "$STEP_OUT" || true)
    passed=$(grep -o '[0-9]*% tests passed.*' "$STEP_OUT" | head -1)
    if [ $DRY = 0 ] && grep 'SKIPPED:' "$STEP_OUT" | grep -qiv 'SPECD_GOLDEN_EXTRA'; then
      row tests FAIL "$(since $t)" "a CUDA half skipped on a GPU machine: $(grep -m1 'SKIPPED:' "$STEP_OUT" | cut -c1-120)"
    else
      row tests PASS "$(since $t)" "$passed; $skipped SKIPPED lines$([ $DRY = 1 ] && echo ' (the CUDA halves: no GPU)')"
    fi
  else
    row tests FAIL "$(since $t)" "$(grep -m3 -E 'Failed|FAILED|\*\*\*' "$STEP_OUT" | tr '\n' ' ' | cut -c1-160)"
  fi
else
  row tests SKIP 0 "not built"
fi

# --- benches ---------------------------------------------------------------
# A verify table's last lines are the two goals (bench --verify); the row
# quotes the batch-1 plain and k=4 lines.
goals() { grep -E 'plain decode at batch 1|verify k=4 at batch 1' "$STEP_OUT" | head -2 | tr '\n' ' ' | cut -c1-200; }
t=$(date +%s)
if [ $BUILT = 0 ]; then
  row bench-7b SKIP 0 "not built"
elif [ $DRY = 1 ]; then
  row bench-7b SKIP 0 "GPU only: random weights are made on the device"
elif run bench-7b "$(cap 200)" "$S" bench --verify --backend cuda --shape llama2-7b --reps 5; then
  bench_block "specd bench --verify --backend cuda --shape llama2-7b --reps 5"
  row bench-7b PASS "$(since $t)" "$(goals)"
else
  bench_block "specd bench --verify --backend cuda --shape llama2-7b --reps 5 (FAILED)"
  row bench-7b FAIL "$(since $t)" "$(tail -1 "$STEP_OUT" | cut -c1-160)"
fi

t=$(date +%s)
if [ $BUILT = 0 ]; then
  row bench-smol SKIP 0 "not built"
else
  if [ $DRY = 1 ]; then
    # the CPU is slow: the default model, a small grid
    if [ $HAVE_GGUF = 1 ]; then
      args=(bench --verify --backend cpu -m "$GGUF" --batches 1,2 --ks 1,4 --prompts 64 --reps 1 --warmup 1)
    else args=(); fi
  elif [ $HAVE_GGUF = 1 ]; then
    args=(bench --verify --backend cuda -m "$GGUF" --reps 5)
  else
    args=(bench --verify --backend cuda --shape smollm2-135m --reps 5)
  fi
  if [ ${#args[@]} = 0 ]; then
    row bench-smol SKIP 0 "no $GGUF (scripts/fetch_model.sh)"
  elif run bench-smol "$(cap 150)" "$S" "${args[@]}"; then
    bench_block "specd ${args[*]}"
    row bench-smol PASS "$(since $t)" "$(goals)"
  else
    bench_block "specd ${args[*]} (FAILED)"
    row bench-smol FAIL "$(since $t)" "$(tail -1 "$STEP_OUT" | cut -c1-160)"
  fi
fi

# --- e2e -------------------------------------------------------------------
t=$(date +%s)
# four requests a stream on the GPU: every stream count then runs both
# prompt classes, not only the first (one request a stream made the
# 1-stream row the repeat prompt alone on the first H100 run)
if [ $DRY = 1 ]; then n=16; streams=1; thr=(-t 2); reqs=1; else n=64; streams=1,4,16; thr=(); reqs=4; fi
E2E_MODEL=""
if [ $HAVE_GGUF = 1 ]; then
  E2E_MODEL=$GGUF
elif [ $DRY = 0 ] && run e2e-model "$(cap 120)" "${PY[@]}" scripts/gpu/torch_xcheck.py smol-shape "$WORK/smol-shape"; then
  E2E_MODEL=$WORK/smol-shape
fi
if [ $BUILT = 0 ]; then
  row e2e SKIP 0 "not built"
elif [ -z "$E2E_MODEL" ]; then
  row e2e SKIP 0 "no SmolLM2 model: neither the GGUF nor PyTorch to make the same-shape one"
else
  prompt="Write a short list of five colours, one per line."
  gen=("$S" generate "${thr[@]}" --backend "$BACKEND" -m "$E2E_MODEL" -p "$prompt" -n "$n" --ignore-eos)
  ok=1; detail=""
  if run e2e-plain "$(cap 90)" "${gen[@]}"; then cp "$STEP_OUT" "$WORK/plain.txt"; else ok=0; detail="plain generate failed"; fi
  if [ $ok = 1 ] && run e2e-spec "$(cap 90)" "${gen[@]}" --speculator "$SPEC"; then
    cp "$STEP_OUT" "$WORK/spec.txt"
    # the text, without the [specd] stats lines (which differ by design), the
    # services' log lines (an in-process CUDA run logs its IPC fallback)
    # and blank lines (the speculative client ends with one more newline)
    if [ "$(grep -v -E -e '^(\[specd\]|draft-svc:|target-svc:)' -e '^$' "$WORK/plain.txt")" = \
         "$(grep -v -E -e '^(\[specd\]|draft-svc:|target-svc:)' -e '^$' "$WORK/spec.txt")" ]; then
      detail="speculative text == plain ($n tokens)"
    else
      ok=0; detail="speculative text differs from plain (check.log: e2e-plain vs e2e-spec)"
    fi
  elif [ $ok = 1 ]; then ok=0; detail="speculative generate failed"; fi
  ecmd=("$S" bench --e2e "${thr[@]}" --backend "$BACKEND" -m "$E2E_MODEL" --speculator "$SPEC"
        --drafters none,mlp,ngram --streams "$streams" -n "$n" --requests "$reqs")
  # the dry run (CI) also exercises --rounds: two rounds, the second in reverse
  [ $DRY = 1 ] && ecmd+=(--rounds 2)
  if [ $ok = 1 ] && run e2e "$(cap 200)" "${ecmd[@]}"; then
    bench_block "specd ${ecmd[*]:1}"
    # the mlp row at one stream: tok/s total, tau, speed-up over plain (the
    # speed-up column found by its header, so a new column cannot shift it)
    mlp=$(awk -F'|' '/\| drafter/ {for (i = 1; i <= NF; i++) if ($i ~ /speed-up/) sp = i}
                     sp && $2 ~ /^ *mlp *$/ && $3 ~ /^ *1 *$/ {gsub(/ /, ""); print $4 " tok/s, tau " $6 ", " $sp " vs plain"; exit}' "$STEP_OUT")
    detail="$detail; mlp at 1 stream: ${mlp:-see report}"
  elif [ $ok = 1 ]; then
    ok=0; detail="$detail; bench --e2e failed: $(tail -1 "$STEP_OUT" | cut -c1-100)"
  fi
  row e2e "$([ $ok = 1 ] && echo PASS || echo FAIL)" "$(since $t)" "$([ "$E2E_MODEL" = "$GGUF" ] || echo 'random same-shape model; ')$detail"
fi

# --- ipc -------------------------------------------------------------------
# Co-location across two processes: target-svc as its own process, draft-svc
# (in specd bench --e2e) with the mlp speculator on the same backend. On a
# GPU the target grants CUDA IPC at Open and every step's hidden state goes
# through GPU memory; either side logs a line if it falls back to bytes,
# which fails the step. Dry run: the CPU target refuses the offer and the
# run must simply work on the bytes path. (In one process, as in e2e above,
# a handle cannot be mapped by its own exporter: that run uses bytes.)
t=$(date +%s)
if [ $BUILT = 0 ] || [ -z "$E2E_MODEL" ]; then
  row ipc SKIP 0 "$([ $BUILT = 0 ] && echo 'not built' || echo 'no SmolLM2 model (see e2e)')"
else
  port=$((40000 + $$ % 10000))
  "$BUILD/target-svc" --config deploy/config/target-svc.example.yaml --tls.insecure=true \
    --listen="127.0.0.1:$port" --model="$E2E_MODEL" --backend="$BACKEND" > "$WORK/target-svc.log" 2>&1 &
  tpid=$!
  up=0
  for _ in $(seq 1 120); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { up=1; break; }
    kill -0 $tpid 2>/dev/null || break
    sleep 0.5
  done
  if [ $up = 0 ]; then
    row ipc FAIL "$(since $t)" "target-svc did not start (check.log)"
  else
    icmd=("$S" bench --e2e "${thr[@]}" --target "127.0.0.1:$port" --insecure --backend "$BACKEND"
          -m "$E2E_MODEL" --speculator "$SPEC" --drafters mlp --streams 1 -n "$n" --requests 1)
    if run ipc "$(cap 150)" "${icmd[@]}"; then
      bench_block "target-svc as its own process; specd ${icmd[*]:1}"
      if grep -q 'CUDA IPC' "$STEP_OUT" "$WORK/target-svc.log"; then
        ipc_note=$(grep -h -m1 'CUDA IPC' "$STEP_OUT" "$WORK/target-svc.log" | cut -c1-140)
        [ $DRY = 1 ] && row ipc PASS "$(since $t)" "fallback: $ipc_note" || row ipc FAIL "$(since $t)" "$ipc_note"
      elif [ $DRY = 1 ]; then
        row ipc PASS "$(since $t)" "CPU backend: no offer (speculator on the CPU), hidden states as bytes through a separate target-svc process"
      else
        row ipc PASS "$(since $t)" "hidden states through CUDA IPC between target-svc and draft-svc, no fallback logged"
      fi
    else
      row ipc FAIL "$(since $t)" "$(tail -1 "$STEP_OUT" | cut -c1-160)"
    fi
  fi
  kill $tpid 2>/dev/null; wait $tpid 2>/dev/null
  { echo; echo "===== [target-svc process]"; cat "$WORK/target-svc.log"; } >> "$LOG"
fi

# --- profile ---------------------------------------------------------------
# Where a decode step's time goes (GPU only): the batch-1 verify bench with
# CUDA graphs off (against bench-smol's, graphs on), and each kernel's GPU
# time over a short greedy generation from Nsight Compute (ncu, one metric,
# clocks left alone), summed by kernel name into $OUT/kernels.txt.
t=$(date +%s)
if [ $DRY = 1 ] || [ $BUILT = 0 ] || [ $HAVE_GGUF = 0 ]; then
  row profile SKIP 0 "GPU, a build and the real model only"
else
  pdetail=""
  pargs=(bench --verify --backend cuda -m "$GGUF" --batches 1 --ks 1,4 --reps 5)
  if run profile-nographs "$(cap 60)" env SPECD_CUDA_GRAPHS=0 "$S" "${pargs[@]}"; then
    bench_block "SPECD_CUDA_GRAPHS=0 specd ${pargs[*]}"
    pdetail="graphs off: $(grep -m1 'plain decode at batch 1' "$STEP_OUT" | cut -c1-80)"
  fi
  if command -v ncu >/dev/null &&
     run profile-ncu "$(cap 120)" ncu --clock-control none --metrics gpu__time_duration.sum --csv \
       --launch-count 4000 "$S" generate --backend cuda -m "$GGUF" -p "Name three colours." -n 16 --ignore-eos; then
    "${PY[@]}" - "$STEP_OUT" > "$OUT/kernels.txt" <<'PY' 2>> "$LOG"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
# ncu names the unit "ns" (the first H100 run; longer names in other
# versions); an unknown unit is an error, not a silent 1.0
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}
tot, cnt = collections.Counter(), collections.Counter()
for r in body:
    if len(r) <= max(ki, vi, ui): continue
    us = float(r[vi].replace(",", "")) * scale[r[ui]]
    name = r[ki].split("(")[0][:60]
    tot[name] += us; cnt[name] += 1
all_us = sum(tot.values())
print(f"{sum(cnt.values())} kernel launches, {all_us:.0f} us of GPU time in all")
print(f"{'kernel':60s} {'launches':>8s} {'total us':>10s} {'avg us':>8s} {'share':>6s}")
for name, us in tot.most_common():
    print(f"{name:60s} {cnt[name]:8d} {us:10.1f} {us / cnt[name]:8.2f} {100 * us / all_us:5.1f}%")
PY
    pdetail="$pdetail; ncu: $(head -1 "$OUT/kernels.txt")"
  fi
  row profile PASS "$(since $t)" "${pdetail:-nothing measured (check.log)}"
fi

# --- report ----------------------------------------------------------------
{
  echo "- total: $(since "$T0") s"
  echo
  echo "| step | result | s | detail |"
  echo "|---|---|--:|---|"
  cat "$TABLE"
  if [ -s "$BENCHES" ]; then echo; echo "## Benchmarks"; cat "$BENCHES"; fi
  echo
  echo "Raw output of every command: check.log beside this file."
} >> "$REPORT"
rm -f "$TABLE" "$BENCHES"
echo
echo "check.sh: report in $REPORT, raw logs in $LOG"
echo
sed -n '/^| step |/,/^$/p' "$REPORT"
exit $FAILED
