#!/usr/bin/env python3
"""check_docs.py - fails when the Markdown documentation points at something
that is not there: a relative link to a missing file, a link to a heading
(#anchor) that the target page does not have, or a source path in backticks
(`draft-svc/driver.c`, `scripts/fuzz.sh`) that the tree does not hold.

The README is the front page and docs/ holds the pages it links; a page
moved or a file renamed must not leave a reader at a dead end. Run by ctest
(check_docs) from the repository root; standard library only.

    python3 scripts/check_docs.py [FILE.md ...]   (default: README.md docs/*.md)
"""
import functools
import glob
import os
import re
import sys

# Backticked paths are checked only under the folders the repository tracks
# as source; build outputs (build/...), downloads (models/*.gguf) and data
# made by scripts (data/...) are not there on a fresh clone by design.
SOURCE_DIRS = ("common/", "kernels/", "draft-svc/", "target-svc/", "tools/",
               "tests/", "scripts/", "bench/", "deploy/", "proto/", "docs/", ".ci/")

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
FENCE = re.compile(r"^\s*```")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path):
    """The anchors of a Markdown file's headings (outside code fences)."""
    found, in_fence = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                in_fence = not in_fence
            elif not in_fence and line.startswith("#"):
                found.add(slug(line.lstrip("#")))
    return found


def source_path(token):
    """The repository path a backticked token names, or None when it is not
    one (a flag, a key, a command line, a glob, a build output)."""
    token = token.rstrip(".,;:")
    if not token.startswith(SOURCE_DIRS) or any(c in token for c in "*{}<>$|=\\"):
        return None
    path = token.split(":", 1)[0]  # file.c:123 or file.c:function
    return path


def check(md):
    errors, in_fence = [], False
    base = os.path.dirname(md)
    with open(md, encoding="utf-8") as f:
        lines = f.readlines()
    for no, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in LINK.finditer(line):
            url = m.group(1)
            if re.match(r"^[a-z]+:", url):  # http:, https:, mailto:
                continue
            path, _, anchor = url.partition("#")
            target = os.path.normpath(os.path.join(base, path)) if path else md
            if not os.path.exists(target):
                errors.append(f"{md}:{no}: link to a missing file: {url}")
            elif anchor and target.endswith(".md") and anchor not in anchors(target):
                errors.append(f"{md}:{no}: link to a missing heading: {url}")
        for m in CODE.finditer(line):
            path = source_path(m.group(1))
            if path and not os.path.exists(path):
                errors.append(f"{md}:{no}: no such path in the tree: {path}")
    return errors


def main(argv):
    files = argv[1:] or ["README.md"] + sorted(glob.glob("docs/*.md"))
    errors = []
    for md in files:
        errors += check(md)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"check_docs: {len(files)} files, {len(errors)} dead references")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
