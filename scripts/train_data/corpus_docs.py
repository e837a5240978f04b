"""corpus_docs.py - the training documents, one collector per source.

Each collector reads one extracted Debian package (a directory under the
fetch script's temp dir) and returns Doc records. Sizes are capped per
source so that no single source dominates: the trainers read the corpus
from the front, and a mix of prose and code is what the speculator needs.
"""
import gzip
import hashlib
import os
import re
from dataclasses import dataclass

import textutil

CHUNK_BYTES = 16 * 1024  # one JSONL document at most (about 4k tokens)


@dataclass
class Doc:
    source: str  # Debian package name
    path: str    # path inside the package, for ordering and SOURCES.md
    kind: str    # "prose" or "code"
    text: str


def stable_key(*parts):
    """A deterministic pseudo-random order: sorting by a hash of the name
    mixes sources and directories while staying the same on every run."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _files(root, suffix):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(suffix):
                found.append(os.path.join(dirpath, name))
    return found


def _read(path):
    with open(path, "rb") as f:
        data = f.read()
    # every source here is UTF-8; one that is not is skipped, not guessed at
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # form feeds (page breaks in old sources) and CRs: never model output
    return text.replace("\r\n", "\n").replace("\x0c", "")


def _chunked(pkg, rel, kind, text):
    return [Doc(pkg, f"{rel}#{i}", kind, chunk)
            for i, chunk in enumerate(textutil.split_chunks(text, CHUNK_BYTES, kind == "code"))]


def _take_budget(items, budget):
    """items: (key, size, value); whole items in key order until the budget."""
    taken, used = [], 0
    for _, size, value in sorted(items, key=lambda t: t[0]):
        if used + size > budget:
            continue  # a smaller later file may still fit
        taken.append(value)
        used += size
    return taken


# ---- Python documentation (reST sources) -------------------------------------

# The narrative parts come whole; the library reference (6 MB) fills the rest
# of the budget in hashed order. whatsnew (change lists), c-api, distutils
# (removed in 3.12) and the licence pages are left out.
PYDOC_WHOLE = ("tutorial", "howto", "faq", "reference", "using", "extending",
               "installing", "distributing", "glossary.rst.txt")
PYDOC_FILL = ("library",)
PYDOC_BUDGET = 5_000_000


def pydoc_sources_dir(root):
    for dirpath, dirnames, _ in os.walk(root):
        dirnames.sort()
        if dirpath.endswith("/html/_sources"):
            return dirpath
    raise SystemExit(f"no html/_sources directory under {root}")


def python_docs(pkg, root):
    src = pydoc_sources_dir(root)
    whole, fill = [], []
    for path in _files(src, ".rst.txt"):
        rel = os.path.relpath(path, src)
        top = rel.split("/")[0]
        if top not in PYDOC_WHOLE and top not in PYDOC_FILL:
            continue
        raw = _read(path)
        if raw is None:
            continue
        text = textutil.clean_rst(raw)
        item = (stable_key(pkg, rel), len(text.encode()), (rel, text))
        (whole if top in PYDOC_WHOLE else fill).append(item)
    used = sum(size for _, size, _ in whole)
    chosen = [v for _, _, v in whole] + _take_budget(fill, PYDOC_BUDGET - used)
    docs = []
    for rel, text in sorted(chosen):
        docs += _chunked(pkg, rel, "prose", text)
    return docs


def python_doc_sections(root):
    """(path, section titles) of the reST sources, for prompts."""
    src = pydoc_sources_dir(root)
    out = []
    for path in _files(src, ".rst.txt"):
        raw = _read(path)
        if raw is not None:
            out.append((os.path.relpath(path, src), textutil.rst_headings(raw)))
    return out


# ---- Python source code -------------------------------------------------------

# Generated tables and data modules teach nothing about code; tests and the
# IDLE/turtle demos are skipped for size.
PY_SKIP = re.compile(r"(^|/)(encodings|pydoc_data|test|tests|idlelib|turtledemo|lib2to3|"
                     r"site-packages|dist-packages/\w+/vendor|config-[^/]*)/|"
                     r"(^|/)(_sysconfigdata[^/]*|entities|__phello__[^/]*|__hello__)\.py$")


def python_files(root):
    """(relative path, text) of every usable .py file under root."""
    out = []
    for path in _files(root, ".py"):
        rel = os.path.relpath(path, root)
        if PY_SKIP.search(rel):
            continue
        text = _read(path)
        if text and text.strip():
            out.append((rel, text))
    return out


def python_code(pkg, root, budget):
    items = [(stable_key(pkg, rel), len(text.encode()), (rel, text))
             for rel, text in python_files(root)]
    docs = []
    for rel, text in sorted(_take_budget(items, budget)):
        docs += _chunked(pkg, rel, "code", text)
    return docs


# ---- Debian Reference (plain text) ---------------------------------------------

def debian_reference(pkg, root):
    paths = [p for p in _files(root, ".txt.gz") if os.path.basename(p).startswith("debian-reference")]
    if not paths:
        raise SystemExit(f"{pkg}: no debian-reference*.txt.gz")
    with gzip.open(paths[0], "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    # the book's own table of contents ends where the second "Preface" starts
    starts = [i for i, ln in enumerate(lines) if ln == "Preface"]
    lines = lines[starts[-1]:] if starts else lines
    kept, in_toc = [], False
    for ln in lines:
        if ln.strip() == "Table of Contents":
            in_toc = True
            continue
        if in_toc:
            if not ln.strip() or re.match(r"\s+[\dA-Z]+(\.\d+)*\.\s", ln):
                continue
            in_toc = False
        if re.match(r"\s*[|+][-+|]", ln) or re.match(r"\s*\|", ln):
            continue  # ASCII tables of package popularity numbers: noise
        kept.append(ln[4:] if ln.startswith("    ") else ln)
    text = textutil.squeeze_blank_lines("\n".join(kept))
    # one document per chapter
    parts = re.split(r"\n(?=(?:Chapter \d+|Appendix [A-Z])\. )", text)
    docs = []
    for i, part in enumerate(parts):
        docs += _chunked(pkg, f"chapter-{i:02d}", "prose", part.strip("\n") + "\n")
    return docs


# ---- The Debian Administrator's Handbook (HTML) ----------------------------------

def debian_handbook(pkg, root):
    html_dirs = [os.path.join(dp, "en-US") for dp, dn, _ in os.walk(root) if "en-US" in dn]
    if not html_dirs:
        raise SystemExit(f"{pkg}: no en-US HTML directory")
    docs = []
    for path in _files(html_dirs[0], ".html"):
        name = os.path.basename(path)
        if name in ("index.html", "ix01.html"):
            continue  # title page and the book's index: lists of links
        raw = _read(path)
        if raw is None:
            continue
        text = textutil.html_to_text(raw)
        if len(text) > 200:
            docs += _chunked(pkg, name, "prose", text)
    return docs
