"""build.py - writes corpus.jsonl, prompts.jsonl and SOURCES.md from the
Debian packages that scripts/fetch_train_data.sh downloaded and extracted.

usage: build.py PKGDIR MANIFEST OUTDIR EVAL_PROMPTS

MANIFEST is a TSV written by the fetch script: role, package, version,
licence, what was taken. Each package is extracted at PKGDIR/<package>/.
Everything is deterministic: files are walked in sorted order, sampling
uses a fixed-seed generator, and the output order is a hash of the names.
"""
import json
import os
import re
import sys

import corpus_docs
import prompts_chat
import prompts_code
import prompts_math

# SPECD_TRAIN_PROMPTS_PER_KIND raises it for a larger stage-2 set (the GPU
# recipe in docs/TRAINING.md uses 6000); 1000 stays the default so the CPU
# recipe's data is unchanged.
PROMPTS_PER_KIND = int(os.environ.get("SPECD_TRAIN_PROMPTS_PER_KIND", "1000"))
STDLIB_BUDGET = 1_900_000   # bytes of code per Python standard-library package
MAX_PROMPT_CHARS = 1000     # the trainer keeps a prompt's last 384 tokens
SEED = 0x5EEDDA7A


def read_manifest(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            role, pkg, version, licence, what = line.rstrip("\n").split("\t")
            rows.append(dict(role=role, pkg=pkg, version=version, licence=licence, what=what))
    return rows


def normalize(prompt):
    """Eval prompts are matched case- and whitespace-insensitively, a little
    stricter than exact equality."""
    return " ".join(prompt.split()).casefold()


def load_eval(path):
    seen = set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    seen.add(normalize(json.loads(line)["prompt"]))
                except (ValueError, KeyError) as e:
                    sys.exit(f"{path}:{n}: {e}")
    return seen


def collect(pkgdir, manifest):
    docs, sections, py_files, words = [], [], [], set()
    for m in manifest:
        root = os.path.join(pkgdir, m["pkg"])
        role = m["role"]
        if role == "pydoc":
            got = corpus_docs.python_docs(m["pkg"], root)
            sections = corpus_docs.python_doc_sections(root)
        elif role == "pystdlib":
            got = corpus_docs.python_code(m["pkg"], root, STDLIB_BUDGET)
            py_files += corpus_docs.python_files(root)
        elif role == "pypkg":
            got = corpus_docs.python_code(m["pkg"], root, 1 << 40)
            py_files += corpus_docs.python_files(root)
        elif role == "debref":
            got = corpus_docs.debian_reference(m["pkg"], root)
        elif role == "handbook":
            got = corpus_docs.debian_handbook(m["pkg"], root)
        elif role == "words":
            got = []
            for dp, _, fs in os.walk(os.path.join(root, "usr/share/dict")):
                for name in sorted(fs):
                    with open(os.path.join(dp, name), encoding="utf-8", errors="replace") as f:
                        words |= {w.strip() for w in f if re.fullmatch(r"[a-z]+\n?", w)}
        else:
            sys.exit(f"build.py: unknown role {role!r} in the manifest")
        m["docs"] = len(got)
        m["bytes"] = sum(len(d.text.encode()) for d in got)
        docs += got
    docs.sort(key=lambda d: corpus_docs.stable_key(d.source, d.path))
    return docs, sections, py_files, words


def make_prompts(docs, sections, py_files, words, eval_set):
    prose = [d.text for d in docs if d.kind == "prose"]
    dropped = {"chat": 0, "code": 0, "math": 0}

    def acceptor(kind):
        def accept(p):
            if normalize(p) in eval_set:
                dropped[kind] += 1
                return False
            return len(p) <= MAX_PROMPT_CHARS
        return accept

    n = PROMPTS_PER_KIND
    kinds = {
        "chat": prompts_chat.chat_prompts(n, SEED + 1, sections, prose, words, acceptor("chat")),
        "code": prompts_code.code_prompts(n, SEED + 2, py_files, acceptor("code")),
        "math": prompts_math.math_prompts(n, SEED + 3, acceptor("math")),
    }
    # interleaved chat, code, math, ... so that any prefix is balanced
    # (the trainer can be told to use only the first N prompts)
    out = []
    for i in range(max(len(v) for v in kinds.values())):
        for kind in ("chat", "code", "math"):
            if i < len(kinds[kind]):
                out.append((kind, kinds[kind][i]))
    return out, dropped


def write_jsonl(path, rows):
    with open(path + ".part", "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(path + ".part", path)


def write_sources(path, manifest, n_prompts):
    lines = [
        "# Training data sources",
        "",
        "Written by `scripts/fetch_train_data.sh`; do not edit. Every source is a Debian",
        "`main` package (downloaded with `apt-get download`, unpacked with `dpkg-deb -x`),",
        "and its licence was checked against the package's `copyright` file at fetch time.",
        "",
        "| package | version | licence | what was taken | docs | bytes |",
        "|---|---|---|---|---|---|",
    ]
    for m in manifest:
        lines.append(f"| {m['pkg']} | {m['version']} | {m['licence']} | {m['what']} "
                     f"| {m['docs']} | {m['bytes']} |")
    lines += [
        "",
        "## prompts.jsonl",
        "",
        f"{n_prompts} prompts, generated by `scripts/train_data/` (our own templates and word",
        "lists) from the sources above: Python FAQ questions and section titles, prose",
        "paragraphs to summarize, dictionary words (wamerican) that occur often in the prose,",
        "docstrings and short functions of the Python sources, and arithmetic / word",
        "problems with numbers from a fixed seed. Prompts equal to one in",
        "`bench/eval-prompts.jsonl` (ignoring case and whitespace) are removed.",
        "",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    pkgdir, manifest_path, outdir, eval_path = sys.argv[1:]
    manifest = read_manifest(manifest_path)
    docs, sections, py_files, words = collect(pkgdir, manifest)
    prompts, dropped = make_prompts(docs, sections, py_files, words, load_eval(eval_path))
    os.makedirs(outdir, exist_ok=True)
    write_jsonl(os.path.join(outdir, "corpus.jsonl"), ({"text": d.text, "kind": d.kind} for d in docs))
    write_jsonl(os.path.join(outdir, "prompts.jsonl"), ({"prompt": p, "kind": k} for k, p in prompts))
    write_sources(os.path.join(outdir, "SOURCES.md"), manifest, len(prompts))
    for kind in ("prose", "code"):
        sel = [d for d in docs if d.kind == kind]
        print(f"corpus {kind}: {len(sel)} docs, {sum(len(d.text.encode()) for d in sel)} bytes")
    for kind in ("chat", "code", "math"):
        print(f"prompts {kind}: {sum(1 for k, _ in prompts if k == kind)}"
              f" ({dropped[kind]} eval prompts filtered)")


if __name__ == "__main__":
    main()
