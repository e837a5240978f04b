#!/usr/bin/env bash
# check_quant_types.sh - the fast path's tiles for the types CI has no model
# in (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS;
# kernels/cpu/qmatmul.h) against llama.cpp's logits on real GGUFs of those
# types.
#
# No package ships such a model, and the default model's dimension (576)
# is not a multiple of 256. This script makes six from the default model
# with llama.cpp's own llama-quantize (built from source,
# bench/llamacpp_build.sh), the rest of each requantized as Q4_1:
#   ffn_down-q4_k  every ffn_down (576 x 1536, the only matrices whose rows
#                  are whole super-blocks) in Q4_K
#   ffn_down-q5_k  the same in Q5_K
#   ffn_down-q6_k  the same in Q6_K
#   q4_k_m         llama.cpp's Q4_K_M recipe as it comes out for this
#                  model: Q5_0 where rows are not whole super-blocks,
#                  Q4_K and Q6_K in the ffn_down matrices, Q8_0 for the
#                  embeddings
#   q5_k_m         llama.cpp's Q5_K_M recipe: Q5_1 where rows are not
#                  whole super-blocks, Q5_K and Q6_K in ffn_down
#   q5_1           Q5_1 everywhere
#   ffn_down-q2_k  every ffn_down in Q2_K (the fast path as Q2K tiles)
#   ffn_down-q3_k  every ffn_down in Q3_K (the fast path as Q3K tiles)
#   q3_k_m         llama.cpp's Q3_K_M recipe for this model: Q4_0 and Q5_0
#                  where rows are not whole super-blocks, Q4_K, Q5_K
#   q2_k           llama.cpp's Q2_K recipe for this model: Q3_K in ffn_down,
#                  Q4_0 elsewhere
#   ffn_down-iq4_nl, ffn_down-iq4_xs  every ffn_down in IQ4_NL, in IQ4_XS
#   iq4_xs         llama.cpp's IQ4_XS recipe: IQ4_NL where rows are not
#                  whole super-blocks, IQ4_XS in ffn_down, Q5_K in 3
# For each it dumps llama.cpp's logits (make_llamacpp_logits.sh) and runs
# test_llamacpp_logits on that pair, on every SIMD path this CPU has: first
# our fp32 path (precision exact), whose distance from llama.cpp is
# llama.cpp's own rounding, then the fast path with the tolerances below.
# The bit-for-bit checks of every path against the scalar twin are in
# tests/unit/test_qmatmul.c and run in CI.
#
# Tolerances: the default fixture's (TOL 2.0, mean 0.3, near-tie 0.5)
# except where llama.cpp's own arithmetic is farther: it multiplies Q4_K and
# Q6_K by activations quantized with one scale per 256 values (Q8_K),
# coarse on the SwiGLU outputs that ffn_down reads. On the Zen 5 VM
# (2026-12-03), |ours - llama.cpp| over 4,872 logits, worst / mean, argmax
# equal at N of 203 positions:
#   ffn_down-q4_k  exact 1.99 / 0.281, 198;  fast 1.80 / 0.280, 202
#   ffn_down-q5_k  exact 2.37 / 0.286, 192;  fast 2.01 / 0.272, 194
#   ffn_down-q6_k  exact 2.99 / 0.294, 193;  fast 2.92 / 0.311, 194
#   q4_k_m         exact 2.80 / 0.266, 191;  fast 2.36 / 0.275, 192
#   q5_k_m         exact 2.65 / 0.312, 199;  fast 2.49 / 0.323, 194
#   q5_1           exact 2.29 / 0.244, 197;  fast 1.61 / 0.214, 195
# and on the Sapphire Rapids VM (2026-12-03; avx512vnni path):
#   ffn_down-q2_k  exact 6.37 / 0.412, 185;  fast 6.81 / 0.454, 184
#                  (Q2K tiles, the forty-fifth session; the fp32 kernels'
#                  fast run read 7.02 / 0.437, 185)
#   ffn_down-q3_k  exact 1.90 / 0.283, 193;  fast 3.29 / 0.286, 191
#   q3_k_m         exact 2.57 / 0.264, 198;  fast 1.97 / 0.285, 194
#   q2_k           exact 2.76 / 0.270, 196;  fast 2.18 / 0.281, 190
#   ffn_down-iq4_nl exact 2.56 / 0.187, 195; fast 1.17 / 0.190, 195
#   ffn_down-iq4_xs exact 2.28 / 0.255, 194; fast 2.07 / 0.295, 193
#   iq4_xs         exact 4.15 / 0.251, 197;  fast 3.07 / 0.265, 197
# (2-bit ffn_down weights leave the model noisier, and llama.cpp's Q8_K
# activations move it farther; the dequantized Q2_K and Q3_K weights
# themselves equal gguf-py's numpy dequantizer bit for bit on every path,
# as do IQ4_NL's and IQ4_XS's.)
# so the fast path is as close to llama.cpp as exact fp32 arithmetic is.
#
#   tests/golden/check_quant_types.sh [NAME...]   # needs build/ (cmake --build build)
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
declare -A args=([ffn_down-q4_k]="--tensor-type ffn_down=q4_k Q4_1"
                 [ffn_down-q2_k]="--tensor-type ffn_down=q2_k Q4_1"
                 [ffn_down-q3_k]="--tensor-type ffn_down=q3_k Q4_1"
                 [q2_k]="Q2_K" [q3_k_m]="Q3_K_M"
                 [ffn_down-iq4_nl]="--tensor-type ffn_down=iq4_nl Q4_1"
                 [ffn_down-iq4_xs]="--tensor-type ffn_down=iq4_xs Q4_1" [iq4_xs]="IQ4_XS"
                 [ffn_down-q5_k]="--tensor-type ffn_down=q5_k Q4_1"
                 [ffn_down-q6_k]="--tensor-type ffn_down=q6_k Q4_1"
                 [q4_k_m]="Q4_K_M" [q5_k_m]="Q5_K_M" [q5_1]="Q5_1")
declare -A tol=([ffn_down-q4_k]=2.0,0.3,0.5 [ffn_down-q5_k]=3.0,0.35,1.0
                [ffn_down-q6_k]=3.5,0.35,1.5 [q4_k_m]=3.0,0.35,1.0
                [q5_k_m]=3.0,0.35,1.0 [q5_1]=2.0,0.3,0.5
                [ffn_down-q2_k]=8.0,0.5,2.0 [ffn_down-q3_k]=4.0,0.35,1.5
                [q2_k]=4.0,0.35,1.5 [q3_k_m]=3.0,0.35,1.0
                [ffn_down-iq4_nl]=2.0,0.3,1.0 [ffn_down-iq4_xs]=3.0,0.35,1.0 [iq4_xs]=4.0,0.35,1.5)
names=(ffn_down-q4_k ffn_down-q5_k ffn_down-q6_k q4_k_m q5_k_m q5_1
       ffn_down-q2_k ffn_down-q3_k q2_k q3_k_m ffn_down-iq4_nl ffn_down-iq4_xs iq4_xs)
[ $# -gt 0 ] && names=("$@")
for name in "${names[@]}"; do
  [ -n "${args[$name]:-}" ] || { echo "check_quant_types: no file named $name" >&2; exit 2; }
  gguf="$work/smollm2-$name.gguf"
  read -r -a a <<< "${args[$name]}"
  n=${#a[@]}
  # llama-quantize [options] IN OUT TYPE THREADS
  "$build/bin/llama-quantize" --allow-requantize "${a[@]:0:n-1}" "$MODEL" "$gguf" "${a[n-1]}" 2 \
    > "$work/quantize-$name.log" 2>&1 || { cat "$work/quantize-$name.log" >&2; exit 1; }
  # the matrices' types as written: "type = q4_1, converting to q5_0" or,
  # kept, "type = q8_0, size"
  echo "check_quant_types: $name: $(grep -E '^\[ *[0-9]+/ *[0-9]+\] ' "$work/quantize-$name.log" |
    grep -v ' type = *f32' | sed -E 's/.*converting to ([a-zA-Z0-9_]+).*/\1/; s/.*type = *([a-zA-Z0-9_]+), size.*/\1/' |
    sort | uniq -c | awk '{printf "%s%d %s", (NR > 1 ? ", " : ""), $1, $2}') matrices"
  SPECD_LLAMACPP_MODEL="$gguf" SPECD_LLAMACPP_FIXTURE="$work/logits-$name.json" \
    tests/golden/make_llamacpp_logits.sh f32 > /dev/null
  echo "check_quant_types: $name, precision exact (no bound; for scale):"
  SPECD_LLAMACPP_MODEL="$gguf" SPECD_LLAMACPP_FIXTURE="$work/logits-$name.json" \
    SPECD_LLAMACPP_PRECISION=exact SPECD_LLAMACPP_TOL=100,100,100 build/test_llamacpp_logits |
    grep ', KV auto:' | sed 's/greedy tokens equal.*//'
  echo "check_quant_types: $name, precision fast (tolerances ${tol[$name]}):"
  SPECD_LLAMACPP_MODEL="$gguf" SPECD_LLAMACPP_FIXTURE="$work/logits-$name.json" \
    SPECD_LLAMACPP_TOL="${tol[$name]}" build/test_llamacpp_logits
done
