#!/usr/bin/env bash
# model_parts.sh - the default model's GGUF in parts small enough to travel
# with device commands, and their reassembly there (docs/GPU.md).
#
#   ./scripts/gpu/model_parts.sh split [MiB]   # here: .gpu-model/part-NN + SHA256SUMS
#   ./scripts/gpu/model_parts.sh join          # there (check.sh calls it): rebuild the
#                                              # GGUF if every part is present and each
#                                              # part's and the whole file's sha256 match
#
# The kit's default is NOT to send the model: the GPU stores quantized
# matrices as fp16 (kernels/cuda/cuda_weights.c), so a random model of the
# same shape (`--shape smollm2-135m`, or torch_xcheck.py smol-shape for the
# services) moves exactly the same bytes per step and times the same, in one
# command. The real file matters only for tau and text quality end to end;
# for that, send one part per command while the machine stays warm (it is
# given back after 30 s idle, and the parts are lost with it): the part
# size leaves room for the tracked tree under the 64 MiB a command carries.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
DIR=.gpu-model

case "${1:-}" in
  split)
    mib=${2:-24}
    [ -f "$MODEL" ] || { echo "model_parts: $MODEL not found (scripts/fetch_model.sh)" >&2; exit 1; }
    rm -rf "$DIR"; mkdir -p "$DIR"
    split -b "${mib}M" -d -a 2 "$MODEL" "$DIR/part-"
    (cd "$DIR" && sha256sum part-* > SHA256SUMS &&
     printf '%s  whole\n' "$(sha256sum < "../$MODEL" | cut -d' ' -f1)" >> SHA256SUMS)
    n=$(ls "$DIR"/part-* | wc -l)
    echo "model_parts: $n parts of at most $mib MiB in $DIR/; send each with its own command:"
    for p in "$DIR"/part-*; do echo "  carry [\"$p\"], command: true"; done
    echo "  then: carry [\"$DIR/SHA256SUMS\", \".gpu-bundle\"], command: scripts/gpu/check.sh"
    ;;
  join)
    [ -f "$DIR/SHA256SUMS" ] || { echo "model_parts: no $DIR/SHA256SUMS: not sent"; exit 2; }
    parts=$(awk '$2 != "whole" {print $2}' "$DIR/SHA256SUMS")
    for p in $parts; do
      [ -f "$DIR/$p" ] || { echo "model_parts: $DIR/$p missing (machine given back between commands?)" >&2; exit 1; }
    done
    (cd "$DIR" && grep -v ' whole$' SHA256SUMS | sha256sum -c --quiet) ||
      { echo "model_parts: a part's checksum does not match" >&2; exit 1; }
    want=$(awk '$2 == "whole" {print $1}' "$DIR/SHA256SUMS")
    tmp="$MODEL.joining"
    mkdir -p "$(dirname "$MODEL")"
    (cd "$DIR" && cat $parts) > "$tmp"
    got=$(sha256sum < "$tmp" | cut -d' ' -f1)
    [ "$got" = "$want" ] || { rm -f "$tmp"; echo "model_parts: joined file sha256 $got, expected $want" >&2; exit 1; }
    rm -f "$MODEL"; mv "$tmp" "$MODEL"
    echo "model_parts: $MODEL rebuilt from $(echo $parts | wc -w) parts, sha256 $got"
    ;;
  *) echo "usage: $0 split [MiB] | join" >&2; exit 2 ;;
esac
