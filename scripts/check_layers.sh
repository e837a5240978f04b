#!/usr/bin/env bash
# check_layers.sh - fails on any edge upwards between the layers
# (docs/ARCHITECTURE.md, "Folders and libraries"). Two views of the same rule:
#
#  1. the link graph, from `cmake --graphviz` on a scratch configure of the
#     tree: no library of a layer reaches (directly or through others) a
#     library of a higher layer, nor gRPC, protobuf-c, the generated proto
#     library or libmicrohttpd below common/rpc;
#  2. the #include lines of every .c/.h/.cu/.cuh file of a layer's folder:
#     no header of a higher layer, no protobuf-c, gRPC or microhttpd header
#     below common/rpc. (Headers are where an upward use starts; a header-
#     only one would not show in the link graph.)
#
# Layers, lowest first (equal numbers are siblings that must not use each
# other):
#   0 common/util   specd_util
#   1 common/spec   specd_spec
#   2 kernels       specd_kernels
#   3 common/model  specd_model
#   4 common/text   specd_text
#   5 common/rpc    specd_rpc     (+ specd_proto, gRPC, protobuf-c, MHD)
#   6 target-svc    specd_target
#   6 draft-svc     specd_draft
#   7 tools/train   specd_train
#
# Usage: scripts/check_layers.sh [scratch-dir]  (CI: .ci/run; ctest:
# check_layers). Needs cmake (or $CMAKE) and awk; about 15 s, mostly the
# configure.
set -euo pipefail
cd "$(dirname "$0")/.."

LAYERS="common/util:specd_util:0 common/spec:specd_spec:1 kernels:specd_kernels:2
common/model:specd_model:3 common/text:specd_text:4 common/rpc:specd_rpc:5
target-svc:specd_target:6.1 draft-svc:specd_draft:6.2 tools/train:specd_train:7"
# below this rank nothing may touch the wire
WIRE_RANK=5
WIRE_LIBS='^(specd_proto|PkgConfig::GRPC|PkgConfig::PROTOBUF_C|PkgConfig::MHD)$|libgrpc|libprotobuf-c|libmicrohttpd'
WIRE_HEADERS='\.pb-c\.h"|[<"]grpc/|[<"]protobuf-c/|microhttpd\.h'

fail=0

# `upward A B`: true when layer B is above layer A, or a sibling of it
upward() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(int(b) > int(a) || (b != a && int(b) == int(a))) }'; }
# `below_wire A`: true when layer A may not touch gRPC/protobuf-c/microhttpd
below_wire() { awk -v a="$1" -v w="$WIRE_RANK" 'BEGIN { exit !(int(a) < w) }'; }

# --- 1. the link graph ---------------------------------------------------
scratch="${1:-}"
if [ -z "$scratch" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
fi
mkdir -p "$scratch"
# CUDA off: the layering is the same with it, and the configure is faster
if ! "${CMAKE:-cmake}" -S . -B "$scratch" -DSPECD_CUDA=OFF --graphviz="$scratch/layers.dot" \
     >"$scratch/configure.log" 2>&1; then
  cat "$scratch/configure.log" >&2
  echo "check_layers: cmake configure failed" >&2
  exit 1
fi
# label of every node, then every edge as "from-label to-label"
awk '
  /^ *"node[0-9]+" \[ label = / {
    match($0, /"node[0-9]+"/); id = substr($0, RSTART, RLENGTH)
    match($0, /label = "[^"]*"/); lab = substr($0, RSTART + 9, RLENGTH - 10)
    label[id] = lab
  }
  /^ *"node[0-9]+" -> "node[0-9]+"/ {
    split($0, p, "\""); print label["\"" p[2] "\""] "\t" label["\"" p[4] "\""]
  }' "$scratch/layers.dot" >"$scratch/edges.tsv"
[ -s "$scratch/edges.tsv" ] || { echo "check_layers: no edges in the graph" >&2; exit 1; }

rank_of_lib() { # library name -> rank, or nothing
  local l
  for l in $LAYERS; do
    [ "$(echo "$l" | cut -d: -f2)" = "$1" ] && { echo "${l##*:}"; return 0; }
  done
  return 0
}
# everything a library reaches through the link graph
reach() {
  awk -F'\t' -v start="$1" '
    { adj[$1] = adj[$1] "\t" $2 }
    END {
      n = 1; q[1] = start; seen[start] = 1
      for (i = 1; i <= n; i++) {
        k = split(adj[q[i]], next_, "\t")
        for (j = 2; j <= k; j++) if (!(next_[j] in seen)) { seen[next_[j]] = 1; q[++n] = next_[j]; print next_[j] }
      }
    }' "$scratch/edges.tsv"
}
for l in $LAYERS; do
  lib=$(echo "$l" | cut -d: -f2)
  rank=$(echo "$l" | cut -d: -f3)
  grep -q "^$lib	" "$scratch/edges.tsv" || { echo "check_layers: $lib is not in the graph" >&2; fail=1; continue; }
  while read -r dep; do
    drank=$(rank_of_lib "$dep")
    if [ -n "$drank" ] && [ "$dep" != "$lib" ] && upward "$rank" "$drank"; then
      echo "check_layers: link edge upwards: $lib (layer $rank) reaches $dep (layer $drank)" >&2
      fail=1
    fi
    if below_wire "$rank" && echo "$dep" | grep -Eq "$WIRE_LIBS"; then
      echo "check_layers: $lib (layer $rank) links the wire layer: $dep" >&2
      fail=1
    fi
  done < <(reach "$lib")
done

# --- 2. the #include lines ---------------------------------------------------
rank_of_path() { # a path under the repository -> rank of its folder, or nothing
  local l best="" bestlen=0
  for l in $LAYERS; do
    local dir=${l%%:*}
    case "$1" in
      "$dir"/*) [ ${#dir} -gt $bestlen ] && { best=${l##*:}; bestlen=${#dir}; } ;;
    esac
  done
  echo "$best"
  return 0
}
for l in $LAYERS; do
  dir=${l%%:*}
  rank=${l##*:}
  while IFS= read -r hit; do
    file=${hit%%:*}
    inc=$(echo "$hit" | sed -n 's/.*#[[:space:]]*include[[:space:]]*[<"]\([^">]*\)[">].*/\1/p')
    [ -n "$inc" ] || continue
    # a layer's own files may include each other; tools/train is inside tools/
    irank=$(rank_of_path "$inc")
    if [ -n "$irank" ] && upward "$rank" "$irank"; then
      echo "check_layers: include upwards: $file (layer $rank) includes $inc (layer $irank)" >&2
      fail=1
    fi
    if below_wire "$rank" && echo "$hit" | grep -Eq "$WIRE_HEADERS"; then
      echo "check_layers: $file (layer $rank) includes a wire header: $inc" >&2
      fail=1
    fi
  done < <(find "$dir" \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
             -exec grep -HE '^[[:space:]]*#[[:space:]]*include' {} + 2>/dev/null)
done

if [ "$fail" -ne 0 ]; then
  echo "check_layers: FAILED (see docs/ARCHITECTURE.md, 'Folders and libraries')" >&2
  exit 1
fi
echo "check_layers: OK (no link or include edge upwards; nothing below common/rpc touches gRPC, protobuf-c or microhttpd)"
