#!/usr/bin/env python3
"""check_alerts.py - the alerting rules in deploy/k8s-components/monitoring/
alerts.yaml, checked three ways (ctest runs it as check_alerts):

  1. every metric an expression reads is one the services export: its name
     (less _bucket/_sum/_count) stands as a string literal in the C sources
     of draft-svc/, target-svc/ or common/, so a renamed metric fails here
     instead of leaving an alert that can never fire;
  2. `promtool check rules` on the PrometheusRule's spec, written out as the
     plain rules file it is;
  3. `promtool test rules` with tests/alerts/specd-alerts.test.yaml: series
     that must fire each alert, with its labels and annotations, and series
     that must not.

Needs PyYAML (scripts/setup.sh's build/tools-venv has it, through
kubernetes-validate) and promtool (Debian's prometheus package). Exits 77,
which ctest reports as skipped, when either is missing.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "deploy/k8s-components/monitoring/alerts.yaml")
TESTS = os.path.join(ROOT, "tests/alerts/specd-alerts.test.yaml")
SOURCES = ("draft-svc", "target-svc", "common")

try:
    import yaml
except ImportError:
    print("check_alerts: PyYAML is not installed (scripts/setup.sh puts it in build/tools-venv)")
    sys.exit(77)
promtool = shutil.which("promtool")
if not promtool:
    print("check_alerts: promtool is not on PATH (Debian package prometheus)")
    sys.exit(77)


def exported_metrics():
    names = set()
    for top in SOURCES:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".c"):
                    with open(os.path.join(d, f), encoding="utf-8") as fh:
                        names.update(re.findall(r'"(specd_[a-z0-9_]+)"', fh.read()))
    return names


def main():
    with open(RULES, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    if doc.get("kind") != "PrometheusRule" or "groups" not in doc.get("spec", {}):
        sys.exit(f"check_alerts: {RULES} is not a PrometheusRule with spec.groups")
    groups = doc["spec"]["groups"]

    exported = exported_metrics()
    failed = 0
    n_alerts = 0
    for g in groups:
        for r in g["rules"]:
            n_alerts += "alert" in r
            for m in sorted(set(re.findall(r"\bspecd_[a-z0-9_]+", r["expr"]))):
                base = re.sub(r"_(bucket|sum|count)$", "", m)
                if base not in exported:
                    print(f"FAIL {r.get('alert', r.get('record'))}: {m} is not a metric "
                          f"the services export")
                    failed += 1
    if failed:
        sys.exit(1)
    print(f"check_alerts: {n_alerts} alerts read only exported metrics")

    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "specd-alerts.rules.yaml")
        with open(rules, "w", encoding="utf-8") as fh:
            yaml.safe_dump({"groups": groups}, fh, sort_keys=False)
        # the unit tests name the rules file by its base name, beside them
        shutil.copy(TESTS, os.path.join(tmp, os.path.basename(TESTS)))
        for cmd in ([promtool, "check", "rules", rules],
                    [promtool, "test", "rules", os.path.basename(TESTS)]):
            p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            sys.stdout.write(p.stdout + p.stderr)
            if p.returncode != 0:
                print(f"FAIL: {' '.join(cmd[1:])} exited {p.returncode}")
                sys.exit(1)


if __name__ == "__main__":
    main()
