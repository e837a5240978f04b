#!/usr/bin/env bash
# fetch_train_data.sh - builds the trainers' data from licence-clean Debian
# packages: data/train/corpus.jsonl (prose and code documents for stage-1
# speculator training), data/train/prompts.jsonl (chat, code and math prompts
# that the target model answers itself for stage 2) and data/train/SOURCES.md
# (package, version, licence, what was taken).
#
# Only the Debian mirror is needed: packages are fetched with
# `apt-get download` and unpacked with `dpkg-deb -x` into a temp dir, so
# nothing is installed. The extraction is offline Python
# (scripts/train_data/). Each package's licence is checked against its
# copyright file, so a package whose licence changed stops the fetch instead
# of slipping into the data.
#
# SPECD_DATA_DIR overrides the output directory (default data/train).
# SPECD_TRAIN_PROMPTS_PER_KIND sets how many chat, code and math prompts
# each (default 1000; the GPU recipe in docs/TRAINING.md uses 6000).
# Idempotent: a stamp holds the hashes of the inputs (these scripts and
# bench/eval-prompts.jsonl) and of the outputs; when all match, nothing is
# fetched. SPECD_DATA_FORCE=1 rebuilds anyway.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${SPECD_DATA_DIR:-$root/data/train}
eval_prompts=$root/bench/eval-prompts.jsonl
stamp=$out/.stamp
start=$(date +%s)

for tool in apt-get apt-cache dpkg-deb python3 sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch_train_data: needs $tool (a Debian system)" >&2; exit 1; }
done

# The stamp's first lines: one hash over every input, then one per output.
stamp_lines() {
  { (cd "$root" && cat scripts/fetch_train_data.sh scripts/train_data/*.py bench/eval-prompts.jsonl)
    echo "prompts per kind ${SPECD_TRAIN_PROMPTS_PER_KIND:-1000}"; } |
    sha256sum | sed 's/ .*/  inputs/'
  for f in corpus.jsonl prompts.jsonl SOURCES.md; do
    if [ -f "$out/$f" ]; then sha256sum "$out/$f" | sed "s| .*|  $f|"; else echo "missing  $f"; fi
  done
}

if [ "${SPECD_DATA_FORCE:-0}" != 1 ] && [ -f "$stamp" ] &&
   [ "$(stamp_lines)" = "$(head -n 4 "$stamp")" ]; then
  echo "fetch_train_data: $out is up to date"
  tail -n +5 "$stamp"
  exit 0
fi

# apt-get download needs the package lists; a fresh machine (or container)
# has none until `apt-get update`, which only root may run.
if ! apt-cache show python3-doc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
  else
    echo "fetch_train_data: no apt package lists; run 'apt-get update' as root first" >&2
    exit 1
  fi
fi

# The first versioned package that a metapackage depends on
# (python3-doc -> python3.11-doc on bookworm, python3.13-doc on trixie).
dep_of() {
  apt-cache depends "$1" | awk -v re="$2" '$1 == "Depends:" && $2 ~ re && !found { print $2; found = 1 }'
}
pydoc=$(dep_of python3-doc '^python3\.[0-9]+-doc$')
stdlib=$(dep_of libpython3-stdlib '^libpython3\.[0-9]+-stdlib$')
[ -n "$pydoc" ] && [ -n "$stdlib" ] || { echo "fetch_train_data: cannot resolve the Python packages" >&2; exit 1; }
minimal=${stdlib%-stdlib}-minimal

# role | package | licence (as reported) | a line its copyright file must contain | what is taken
sources=(
  "pydoc|$pydoc|PSF-2.0|PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2|Python documentation reST sources: tutorial, HOWTOs, FAQ, language reference, part of the library reference (prose)"
  "pystdlib|$minimal|PSF-2.0|PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2|Python standard-library .py files, sampled (code)"
  "pystdlib|$stdlib|PSF-2.0|PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2|Python standard-library .py files, sampled (code)"
  "pypkg|python3-click|BSD-3-Clause|License: BSD-3-clause|click sources (code)"
  "pypkg|python3-attr|MIT (Expat)|License: Expat|attrs sources (code)"
  "pypkg|python3-requests|Apache-2.0|License: Apache|requests sources (code)"
  "pypkg|python3-markdown|BSD-3-Clause (serializers.py: ElementTree licence, permissive)|License: BSD-3-clause|Python-Markdown sources (code)"
  "debref|debian-reference-en|GPL-2+|License: GPL-2+|Debian Reference, plain-text edition, one document per chapter (prose)"
  "handbook|debian-handbook|GPL-2.0+ or CC-BY-SA-3.0|License: GPL-2.0+ or CC-BY-SA-3.0|The Debian Administrator's Handbook, English HTML converted to text (prose)"
  "words|wamerican|SCOWL (permissive, MIT-like)|Permission to use, copy, modify, distribute and sell these word|American English word list, for word prompts only (not in the corpus)"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mkdir "$tmp/deb" "$tmp/x"
pkgs=()
for s in "${sources[@]}"; do IFS='|' read -r _ pkg _ _ _ <<<"$s"; pkgs+=("$pkg"); done
# As root, apt drops to the _apt user to download, which cannot write into a
# root-owned temp dir; downloading as root avoids the warning and the retry.
apt_opts=()
[ "$(id -u)" = 0 ] && apt_opts=(-o APT::Sandbox::User=root)
(cd "$tmp/deb" && apt-get "${apt_opts[@]}" download -q "${pkgs[@]}" >/dev/null)

# The copyright file of a package; Debian points some doc directories at a
# sibling package's (libpython3.x-stdlib -> libpython3.x-minimal).
copyright_of() {
  local d="$tmp/x/$1/usr/share/doc/$1"
  if [ -L "$d" ]; then
    local t; t=$(basename "$(readlink "$d")")
    d="$tmp/x/$t/usr/share/doc/$t"
  fi
  echo "$d/copyright"
}

manifest=$tmp/manifest.tsv
: >"$manifest"
for pkg in "${pkgs[@]}"; do
  deb=$(ls "$tmp/deb/${pkg}_"*.deb)
  mkdir -p "$tmp/x/$pkg"
  dpkg-deb -x "$deb" "$tmp/x/$pkg"
done
for s in "${sources[@]}"; do
  IFS='|' read -r role pkg licence must what <<<"$s"
  deb=$(ls "$tmp/deb/${pkg}_"*.deb)
  copyright=$(copyright_of "$pkg")
  if ! grep -qF -- "$must" "$copyright"; then
    echo "fetch_train_data: $pkg: licence changed? '$must' not in $copyright" >&2
    exit 1
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$role" "$pkg" "$(dpkg-deb -f "$deb" Version)" "$licence" "$what" >>"$manifest"
done

mkdir -p "$out"
rm -f "$stamp"
summary=$(PYTHONDONTWRITEBYTECODE=1 python3 "$root/scripts/train_data/build.py" "$tmp/x" "$manifest" "$out" "$eval_prompts")
summary+=$'\n'"files: $(for f in corpus.jsonl prompts.jsonl SOURCES.md; do printf '%s %s bytes; ' "$f" "$(stat -c %s "$out/$f")"; done)"
{ stamp_lines; echo "$summary"; } >"$stamp"
echo "$summary"
echo "fetch_train_data: wrote $out in $(($(date +%s) - start)) s"
