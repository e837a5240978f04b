#!/usr/bin/env bash
# check_kquants.sh - the K-quant tiles of the fast path (Q4_K, Q6_K;
# kernels/cpu/qmatmul.h) against llama.cpp's logits on real K-quant GGUFs.
#
# CI has no K-quant model: the default model's dimension (576) is not a
# multiple of 256, so llama.cpp's Q4_K_M of it is mostly Q5_0, and no
# package ships one. This script makes them from the default model with
# llama.cpp's own llama-quantize (built from source, bench/llamacpp_build.sh):
# every ffn_down matrix (576 x 1536, the only ones whose rows are whole
# super-blocks) in Q4_K, then in Q6_K, the rest requantized as Q4_1. For
# each it dumps llama.cpp's logits (make_llamacpp_logits.sh) and runs
# test_llamacpp_logits on that pair, on every SIMD path this CPU has: first
# our fp32 path (precision exact), whose distance from llama.cpp is
# llama.cpp's own rounding, then the fast path with the tolerances below.
# The bit-for-bit checks of every path against the scalar twin are in
# tests/unit/test_qmatmul.c and run in CI.
#
# Tolerances: Q4_K takes the default fixture's (TOL 2.0, mean 0.3, near-tie
# 0.5). Q6_K's are wider because llama.cpp's are: it multiplies Q6_K by
# activations quantized with one scale per 256 values (Q8_K), and on the
# SwiGLU outputs that ffn_down reads, that is coarse. On the Zen 5 VM
# (2026-12-03), |ours - llama.cpp| over 4,872 logits, worst / mean, argmax
# equal at N of 203 positions:
#   Q4_K  exact 1.99 / 0.281, 198;  fast 1.80 / 0.280, 202
#   Q6_K  exact 2.99 / 0.294, 193;  fast 2.92 / 0.311, 194
# so the fast path is as close to llama.cpp as exact fp32 arithmetic is.
#
#   tests/golden/check_kquants.sh          # needs build/ (cmake --build build)
#
# Takes a few minutes after llama.cpp is built (5-15 minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$MODEL" ] || ./scripts/fetch_model.sh
build=$(bench/llamacpp_build.sh)
[ -x "$build/bin/llama-quantize" ] || cmake --build "$build" --target llama-quantize -j"$(nproc)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A tol=([q4_k]=2.0,0.3,0.5 [q6_k]=3.5,0.35,1.5)
for k in q4_k q6_k; do
  gguf="$work/smollm2-ffn_down-$k.gguf"
  "$build/bin/llama-quantize" --allow-requantize --tensor-type "ffn_down=$k" \
    "$MODEL" "$gguf" Q4_1 2 > "$work/quantize-$k.log" 2>&1 ||
    { cat "$work/quantize-$k.log" >&2; exit 1; }
  n=$(grep -ci "ffn_down.*override.*-> $k" "$work/quantize-$k.log" || true)
  echo "check_kquants: $gguf: $n ffn_down matrices in $k"
  [ "$n" -gt 0 ] || { echo "check_kquants: llama-quantize made no $k matrix" >&2; exit 1; }
  SPECD_LLAMACPP_MODEL="$gguf" SPECD_LLAMACPP_FIXTURE="$work/logits-$k.json" \
    tests/golden/make_llamacpp_logits.sh f32 > /dev/null
  echo "check_kquants: $k, precision exact (no bound; for scale):"
  SPECD_LLAMACPP_MODEL="$gguf" SPECD_LLAMACPP_FIXTURE="$work/logits-$k.json" \
    SPECD_LLAMACPP_PRECISION=exact SPECD_LLAMACPP_TOL=100,100,100 build/test_llamacpp_logits |
    grep ', KV auto:' | sed 's/greedy tokens equal.*//'
  echo "check_kquants: $k, precision fast (tolerances ${tol[$k]}):"
  SPECD_LLAMACPP_MODEL="$gguf" SPECD_LLAMACPP_FIXTURE="$work/logits-$k.json" \
    SPECD_LLAMACPP_TOL="${tol[$k]}" build/test_llamacpp_logits
done
