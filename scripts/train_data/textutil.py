"""textutil.py - turning fetched files into clean plain text.

Offline helper for scripts/fetch_train_data.sh. The speculator learns to
predict what SmolLM2 writes, and SmolLM2 writes Markdown-ish plain text, so
markup that the model never produces (HTML tags, Sphinx roles, link targets)
is removed; structure it does produce (headings, lists, code blocks) stays.
"""
import html.parser
import re
import textwrap

# ---- reST (Python documentation sources) -----------------------------------

# :role:`text <target>` / :role:`!text` / :role:`~mod.name` -> `text`.
# Sphinx roles are rendered as inline code or links; Markdown-style backticks
# are what a chat model writes for the same thing.
_ROLE_TARGET = re.compile(r":[a-z:+-]+:`([^`<]*?)\s*<[^`>]*>`")
_ROLE = re.compile(r":[a-z:+-]+:`[!~]?([^`]*)`")
_LITERAL = re.compile(r"``([^`]+)``")
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`_{1,2}")
# `Name`_ (a reference): not after a role's colon, not "`...`_name"
_REF = re.compile(r"(?<![:`])`([^`\s][^`]*)`__?(?!\w)")
# Directives that only steer Sphinx (index entries, labels, toc options):
# they carry no text a reader sees, so they are dropped with their bodies.
_DROP_DIRECTIVES = ("index", "only", "toctree", "contents", "highlight", "sectionauthor",
                    "moduleauthor", "testsetup", "testcleanup", "raw", "include",
                    "currentmodule", "literalinclude", "audit-event", "impl-detail")


def clean_rst_inline(s):
    # hyperlinks first: after roles become `x`, "`x`_" would be ambiguous
    s = _LINK.sub(r"\1", s)
    s = _REF.sub(r"\1", s)
    s = _ROLE_TARGET.sub(r"`\1`", s)
    s = _ROLE.sub(r"`\1`", s)
    return _LITERAL.sub(r"`\1`", s)


def clean_rst(text):
    """Light cleanup of a reST file: the structure stays, Sphinx-only lines go."""
    out, skip_indent = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if skip_indent is not None:
            # a dropped directive's body: its indented lines and blank lines
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if re.match(r"\.\. _[^:]*:\s*$", stripped) or re.match(r":[a-z]+:\s*\d*\s*$", stripped):
            continue  # a label (".. _tut-if:") or a file option (":tocdepth: 2")
        m = re.match(r"\.\. ([a-z-]+)::", stripped)
        if m and m.group(1) in _DROP_DIRECTIVES:
            skip_indent = indent
            continue
        if re.match(r"\.\.(\s|$)", stripped) and not m:
            skip_indent = indent  # a reST comment and its indented body
            continue
        out.append(clean_rst_inline(line.rstrip()))
    return squeeze_blank_lines("\n".join(out))


def rst_headings(text):
    """Section titles of a reST file (a line underlined by = - ~ ^ * or #)."""
    lines = text.splitlines()
    titles = []
    for i in range(len(lines) - 1):
        title, under = lines[i].strip(), lines[i + 1].strip()
        if (title and under and len(set(under)) == 1 and under[0] in "=-~^*#"
                and len(under) >= len(title) >= 3 and not set(title) <= set("=-~^*#")):
            titles.append(clean_rst_inline(title))
    return titles


# ---- HTML (Debian Administrator's Handbook) --------------------------------

_BLOCK = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "pre", "tr",
          "table", "ul", "ol", "dl", "br", "blockquote", "section", "title", "figure"}
# Page furniture repeated on every page (navigation, tables of contents):
# it would teach the model boilerplate, so whole subtrees are skipped.
_SKIP_TAGS = {"head", "script", "style", "nav"}
_SKIP_CLASSES = {"docnav", "toc", "list-of-tables", "list-of-figures", "list-of-examples",
                 "navheader", "navfooter"}
_SKIP_IDS = {"banner", "title", "site_footer"}


class _TextExtractor(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts = []
        self.skip_depth = 0  # >0 while inside a skipped subtree
        self.stack = []      # (tag, skipping) for every open element
        self.pre = 0

    _VOID = {"br", "img", "meta", "link", "hr", "input", "col", "area", "base", "wbr"}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        skip = (tag in _SKIP_TAGS or classes & _SKIP_CLASSES or a.get("id") in _SKIP_IDS)
        if tag in self._VOID:
            if tag == "br" and not self.skip_depth:
                self.parts.append("\n")
            return
        self.stack.append((tag, bool(skip)))
        if skip:
            self.skip_depth += 1
        if self.skip_depth:
            return
        if tag == "pre":
            # fenced, as a chat model writes code blocks
            self.pre += 1
            self.parts.append("\n\n```\n")
        elif tag == "li":
            self.parts.append("\n* ")
        elif tag in ("h1", "h2", "h3", "h4"):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag in _BLOCK:
            self.parts.append("\n\n")
        elif tag == "code" and not self.pre:
            self.parts.append("`")

    def handle_endtag(self, tag):
        if tag in self._VOID:
            return
        # pop to the matching open tag (tolerates unclosed <p> and the like)
        while self.stack:
            open_tag, skipping = self.stack.pop()
            if skipping:
                self.skip_depth -= 1
            if not self.skip_depth:
                if open_tag == "pre":
                    self.pre -= 1
                    self.parts.append("\n```\n\n")
                elif open_tag == "code" and not self.pre:
                    self.parts.append("`")
                elif open_tag in _BLOCK:
                    self.parts.append("\n\n")
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self.skip_depth:
            return
        if self.pre:
            self.parts.append(data)
        else:
            self.parts.append(re.sub(r"\s+", " ", data))


def html_to_text(markup):
    p = _TextExtractor()
    p.feed(markup)
    p.close()
    # spaces that block breaks left at line edges; code keeps its indentation
    lines, in_code = [], False
    for ln in "".join(p.parts).splitlines():
        if ln.strip() == "```":
            in_code = not in_code
            lines.append("```")
        elif in_code:
            lines.append(ln.rstrip())
        else:
            lines.append(ln.strip().replace("``", ""))  # an empty <code></code>
    return squeeze_blank_lines("\n".join(lines))


# ---- plain text --------------------------------------------------------------

def squeeze_blank_lines(text):
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def dedent_block(text):
    return textwrap.dedent(text)


def paragraphs(text):
    """Blank-line separated paragraphs, each joined into one line."""
    for block in re.split(r"\n\s*\n", text):
        yield " ".join(ln.strip() for ln in block.splitlines() if ln.strip())


def split_chunks(text, limit, code=False):
    """Cuts text into pieces of at most limit bytes, at the coarsest boundary
    that works: before a top-level statement (code), then at blank lines,
    then at line ends, so one long file does not fill a training prefix
    alone. Only a single line longer than limit stays over it."""
    seps = ([r"\n\n(?=\S)"] if code else []) + [r"\n\n", r"\n"]
    return [c.rstrip("\n") + "\n" for c in _split(text.strip("\n"), limit, seps) if c.strip()]


def _split(text, limit, seps):
    if len(text.encode()) <= limit or not seps:
        return [text]
    joiner = "\n" if seps[0] == r"\n" else "\n\n"
    chunks, cur = [], ""
    for piece in re.split(seps[0], text):
        cand = cur + joiner + piece if cur else piece
        if len(cand.encode()) <= limit:
            cur = cand
            continue
        if cur:
            chunks.append(cur)
        if len(piece.encode()) > limit:
            sub = _split(piece, limit, seps[1:])
            chunks += sub[:-1]
            cur = sub[-1]
        else:
            cur = piece
    if cur:
        chunks.append(cur)
    return chunks
