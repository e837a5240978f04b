#!/usr/bin/env bash
# make_llamacpp_logits.sh - writes tests/golden/data/smollm2/llamacpp-logits.json,
# llama.cpp's logits on the default model for a few prompts: the reference
# of specd's fast (integer-activation) CPU path, checked by
# tests/golden/test_llamacpp_logits.c. CI only reads the committed fixture.
#
#   tests/golden/make_llamacpp_logits.sh            # llamacpp-logits.json (fp32 KV)
#   tests/golden/make_llamacpp_logits.sh q8_0       # llamacpp-logits-kvq8.json: K and V
#                                                   # cached as Q8_0 (kv_cache_dtype q8_0)
#
#   SPECD_LLAMACPP_MODEL=M SPECD_LLAMACPP_FIXTURE=F tests/golden/make_llamacpp_logits.sh
#                                                   # another GGUF's logits into F
#                                                   # (tests/golden/check_quant_types.sh)
#
# llama.cpp is built natively from the PyPI sdist (bench/llamacpp_build.sh);
# the dumper tests/golden/llamacpp_logits.c is compiled against it here.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${SPECD_LLAMACPP_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
KV=${1:-f32}
case "$KV" in
  f32) OUT=tests/golden/data/smollm2/llamacpp-logits.json ;;
  q8_0) OUT=tests/golden/data/smollm2/llamacpp-logits-kvq8.json ;;
  *) echo "make_llamacpp_logits: KV is f32 or q8_0, got '$KV'" >&2; exit 2 ;;
esac
OUT=${SPECD_LLAMACPP_FIXTURE:-$OUT}
[ -f "$MODEL" ] || ./scripts/fetch_model.sh
build=$(bench/llamacpp_build.sh)
src=$(dirname "$build")/src
tool=$(dirname "$build")/llamacpp_logits
cc -std=c11 -O2 -Wall -Wextra -Werror -I"$src/include" -I"$src/ggml/include" \
  tests/golden/llamacpp_logits.c -o "$tool" -L"$build/bin" -lllama -lggml -lggml-base \
  -Wl,-rpath,"$build/bin"
# chat, code, prose and a long-ish ChatML prompt; 16 positions of headroom
"$tool" "$MODEL" 16 24 "$KV" > "$OUT.part" <<'PROMPTS'
<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nExplain in two sentences why the sky is blue.<|im_end|>\n<|im_start|>assistant\n
def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n
The history of the printing press begins in the fifteenth century, when
<|im_start|>user\nWhat is 17 times 23? Show your work step by step.<|im_end|>\n<|im_start|>assistant\n
PROMPTS
mv "$OUT.part" "$OUT"
echo "wrote $OUT ($(wc -c < "$OUT") bytes) with llama.cpp from $build"
