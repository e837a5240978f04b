#!/usr/bin/env bash
# train_speculator.sh - the GPU recipe for the default model's speculator, as
# one device command (docs/TRAINING.md). Here, before it:
#
#   SPECD_DATA_DIR=data/train6k SPECD_TRAIN_PROMPTS_PER_KIND=6000 ./scripts/fetch_train_data.sh
#   python3 scripts/gpu/speculator_tokens.py data/train6k .gpu-spec/tokens.npz
#   python3 -m pip download --no-deps --only-binary=:all: -d .gpu-spec gguf==0.19.0
#   ./scripts/gpu/model_parts.sh split      # then send each part with its own command
#
# There (carry [".gpu-spec", ".gpu-model/part-NN", ".gpu-model/SHA256SUMS"]):
#
#   scripts/gpu/train_speculator.sh [train_speculator.py flags]
#
# Joins the GGUF, installs the gguf wheel into /tmp/site, runs
# train_speculator.py and leaves in $OUT what comes back: train.log,
# config.json, model.safetensors in parts under 15 MiB (the device returns
# files of at most 16 MiB; `cat model.safetensors.part-* > model.safetensors`
# here), stage2_tokens.npz (the target's greedy continuations) and, with
# --self-prompts, self_prompts.jsonl (the prompts the target wrote).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-report}
mkdir -p "$OUT"
scripts/gpu/model_parts.sh join || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu-spec/gguf-*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L
lscpu | grep -E '^Model name' || true
work=$(mktemp -d)
python3 scripts/gpu/train_speculator.py --tokens .gpu-spec/tokens.npz --out "$work" "$@" 2>&1 |
  tee "$OUT/train.log"
rc=${PIPESTATUS[0]}
for f in config.json stage2_tokens.npz self_prompts.jsonl; do [ -f "$work/$f" ] && cp "$work/$f" "$OUT/"; done
[ -f "$work/model.safetensors" ] &&
  split -b 15M -d -a 1 "$work/model.safetensors" "$OUT/model.safetensors.part-"
ls -la "$OUT"
exit "$rc"
