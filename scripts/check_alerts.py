#!/usr/bin/env python3
"""check_alerts.py - the alerting rules in deploy/k8s-components/monitoring/
alerts.yaml, checked three ways (ctest runs it as check_alerts):

  1. every metric an expression reads is one the services register (a
     specd_metrics_counter/gauge/histogram call in the C sources of
     draft-svc/, target-svc/ or common/; _bucket/_sum/_count only for a
     histogram), and every label its selectors name is one of that
     metric's labels (or one a scrape adds: namespace, pod, job, ...), so
     a renamed metric or label fails here instead of leaving an alert that
     can never fire;
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


# A registration in the sources: specd_metrics_counter/gauge/histogram(r,
# "name", "help" "help...", "label,label" or NULL, ...).
REGISTER = re.compile(r'specd_metrics_(counter|gauge|histogram)\(\s*[^,]+,\s*"(specd_[a-z0-9_]+)",'
                      r'\s*(?:"(?:[^"\\]|\\.)*"\s*)+,\s*(NULL|"[^"]*")')
# Labels a scrape adds (Kubernetes service discovery, Prometheus itself).
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance", "service"}


def exported_metrics():
    """{name: set of label names} for every metric the services register
    (a histogram's _bucket series also carry `le`). The registry's own
    counter (common/rpc/metrics.c) is registered the same way."""
    metrics = {}
    for top in SOURCES:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith(".c"):
                    continue
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    for kind, name, labels in REGISTER.findall(fh.read()):
                        names = set() if labels == "NULL" else set(labels.strip('"').split(","))
                        names.discard("")
                        metrics[name] = (kind, names)
    return metrics


def check_expr(alert, expr, exported):
    """Messages for each metric the expression reads that is not exported,
    and each label its selectors name that the metric does not carry."""
    bad = []
    for m, sel in re.findall(r"\b(specd_[a-z0-9_]+)(\{[^}]*\})?", expr):
        base, suffix = re.match(r"(.*?)(_bucket|_sum|_count)?$", m).groups()
        if base not in exported or (suffix and exported[base][0] != "histogram"):
            bad.append(f"{alert}: {m} is not a metric the services export")
            continue
        allowed = exported[base][1] | TARGET_LABELS | ({"le"} if suffix == "_bucket" else set())
        for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel):
            if label not in allowed:
                bad.append(f"{alert}: {m} has no label '{label}' (it has: "
                           f"{', '.join(sorted(exported[base][1])) or 'none'})")
    return bad


def main():
    with open(RULES, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    if doc.get("kind") != "PrometheusRule" or "groups" not in doc.get("spec", {}):
        sys.exit(f"check_alerts: {RULES} is not a PrometheusRule with spec.groups")
    groups = doc["spec"]["groups"]

    exported = exported_metrics()
    if len(exported) < 20:  # the pattern above no longer finds the registrations
        sys.exit(f"check_alerts: found only {len(exported)} metric registrations in the sources")
    bad = []
    n_alerts = 0
    for g in groups:
        for r in g["rules"]:
            n_alerts += "alert" in r
            bad += check_expr(r.get("alert", r.get("record")), r["expr"], exported)
    for b in bad:
        print("FAIL " + b)
    if bad:
        sys.exit(1)
    print(f"check_alerts: {n_alerts} alerts read only exported metrics and labels "
          f"({len(exported)} metrics registered in the sources)")

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
