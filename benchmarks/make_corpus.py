#!/usr/bin/env python3
"""Build a deterministic JSONL text corpus (``{"text": ...}`` per line) from
real documentation that Debian packages ship, for benchmarking the pipeline.

Nothing is downloaded here: the script reads the files that a fixed list of
installed Debian 12 (bookworm) documentation packages own (``dpkg -L``), so
the same package versions give a byte-identical corpus.  Install them once
(as root; about 0.9 GB on disk, no services are started; apt may also
upgrade python3.11 and perl to the point release that their -doc packages
match):

    apt-get update
    apt-get install -y --no-install-recommends \\
        python3.11-doc perl-doc linux-doc-6.1 python-django-doc nodejs-doc \\
        git-doc debian-handbook \\
        manpages manpages-dev manpages-cs manpages-da manpages-de manpages-el \\
        manpages-es manpages-fi manpages-fr manpages-hu manpages-id \\
        manpages-it manpages-ja manpages-mk manpages-nb manpages-nl \\
        manpages-pl manpages-pt-br manpages-ro manpages-ru manpages-sr \\
        manpages-sv manpages-tr manpages-uk manpages-vi manpages-zh \\
        debian-reference-de debian-reference-en debian-reference-es \\
        debian-reference-fr debian-reference-id debian-reference-it \\
        debian-reference-ja debian-reference-pt debian-reference-pt-br \\
        debian-reference-zh-cn debian-reference-zh-tw \\
        libreoffice-help-de libreoffice-help-en-us libreoffice-help-es \\
        libreoffice-help-fr libreoffice-help-it libreoffice-help-ja \\
        libreoffice-help-ko libreoffice-help-nl libreoffice-help-pl \\
        libreoffice-help-pt-br libreoffice-help-ru libreoffice-help-zh-cn \\
        libreoffice-help-zh-tw \\
        fortunes fortunes-cs fortunes-de fortunes-es fortunes-it \\
        fortunes-pl fortunes-ru fortunes-zh

(``python3-doc`` is the meta package that pulls ``python3.11-doc``.)
Together they give about 280 MB of distinct JSONL in 30 languages (English
about 37%, then zh, de, ja, ru, fr, it, es, pl, pt, nl, ko, ...):
Python / Django / Node.js / git / Perl / Linux-kernel docs, the Debian
Administrator's Handbook and Debian Reference in their translations,
LibreOffice help in 13 languages, man pages in 26 languages, and fortune
files.

How text is extracted, per file (a document is one file; files longer than
``--max-doc-chars`` are cut into sections at paragraph breaks):

* ``.gz``/``.bz2``/``.xz`` are decompressed; files with NUL bytes or that are
  not valid UTF-8 are skipped (so are images, scripts, fonts, PDFs, ...).
* man pages: roff requests/escapes are stripped by a small built-in converter
  (no groff, so the output does not depend on its version).
* HTML: tags dropped (``<script>``/``<style>``/``<head>`` removed, block tags
  become line breaks, ``<pre>`` kept verbatim).
* POD: commands and formatting codes are stripped.
* plain text (txt, rst, md, yaml, info, README, changelog, fortunes...)
  is kept as is.
* duplicates are dropped: an HTML page is skipped when its Sphinx
  ``_sources`` text or a same-named .txt/.md/.rst sibling exists, a handful
  of known duplicate trees are excluded (see ``EXCLUDE``), and any document
  whose text is byte-identical to an earlier one is skipped.

Order: the candidate files are sorted by path, then interleaved by a seeded
hash of the path (``--seed``), so every prefix of the output, e.g. the first
25 MB, is a mix of all sources and languages.  Documents are written until
the output reaches ``--mb`` megabytes (10**6 bytes, counted on the JSONL
bytes).  If the distinct text is smaller than that, the same document
sequence is written again (pass 2, 3, ...) and a NOTE saying so is printed
to stderr.

Example:
    python benchmarks/make_corpus.py --out /tmp/corpus.jsonl --mb 250 \\
        --manifest /tmp/corpus.manifest.tsv
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import html
import lzma
import os
import re
import subprocess
import sys
import time
from multiprocessing import Pool

import orjson

PACKAGES = """
python3.11-doc perl-doc linux-doc-6.1 python-django-doc nodejs-doc git-doc
debian-handbook
manpages manpages-dev manpages-cs manpages-da manpages-de manpages-el
manpages-es manpages-fi manpages-fr manpages-hu manpages-id manpages-it
manpages-ja manpages-mk manpages-nb manpages-nl manpages-pl manpages-pt-br
manpages-ro manpages-ru manpages-sr manpages-sv manpages-tr manpages-uk
manpages-vi manpages-zh
debian-reference-de debian-reference-en debian-reference-es
debian-reference-fr debian-reference-id debian-reference-it
debian-reference-ja debian-reference-pt debian-reference-pt-br
debian-reference-zh-cn debian-reference-zh-tw
libreoffice-help-de libreoffice-help-en-us libreoffice-help-es
libreoffice-help-fr libreoffice-help-it libreoffice-help-ja
libreoffice-help-ko libreoffice-help-nl libreoffice-help-pl
libreoffice-help-pt-br libreoffice-help-ru libreoffice-help-zh-cn
libreoffice-help-zh-tw
fortunes fortunes-cs fortunes-de fortunes-es fortunes-it fortunes-pl
fortunes-ru fortunes-zh
""".split()

# Known duplicate or non-prose trees (regexes on the absolute path).
EXCLUDE = [
    r"^/usr/share/doc/linux-doc-[^/]+/html/",  # built from Documentation/*.rst
    r"^/usr/share/info/python",  # python3.11-doc: same text as _sources/*.txt
    r"^/usr/share/man/man1/perl",  # perl-doc: rendered from the .pod files
    r"^/usr/share/debian-reference/.*\.html$",  # same text as the .txt.gz
    r"^/usr/share/doc/nodejs/api/.*\.json(\.gz)?$",  # generated from the .md
    r"/Common_Content/",  # handbook boilerplate
    r"^/usr/share/doc-base/",
    r"^/usr/share/lintian/",
    r"^/usr/share/bug/",
    r"^/usr/share/menu/",
]
EXCLUDE_RE = re.compile("|".join(EXCLUDE))

TEXT_EXT = {"txt", "rst", "md", "markdown", "yaml", "yml", "text", "info",
            "u8", "pod", "tex", "texi", "asc", "adoc", "asciidoc", "el", "org"}
HTML_EXT = {"html", "htm", "xhtml", "xhp"}
TEXT_NAMES = re.compile(
    r"^(README|NEWS|CHANGES|changelog|ChangeLog|copyright|COPYING|CREDITS|"
    r"MAINTAINERS|TODO|AUTHORS|THANKS|HISTORY|FAQ|BUGS|INSTALL|RelNotes)",
    re.I)
MAN_RE = re.compile(r"^/usr/share/man/(?:[^/]+/)?man[0-9n]/[^/]+\.[0-9n][a-z]*$")
INFO_RE = re.compile(r"\.info(-[0-9]+)?$")
FORTUNE_DIR = "/usr/share/games/fortunes/"

MB = 1_000_000


# ----------------------------------------------------------------------------
# file discovery

def package_files(pkgs):
    """(package, path) for every regular, non-symlink file the packages own."""
    missing, versions, out = [], {}, []
    for pkg in pkgs:
        q = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", pkg],
                           capture_output=True, text=True)
        if q.returncode != 0 or not q.stdout.startswith("install ok installed"):
            missing.append(pkg)
            continue
        versions[pkg] = q.stdout.split("\t", 1)[1]
        listing = subprocess.run(["dpkg-query", "-L", pkg], capture_output=True,
                                 text=True, check=True).stdout
        for path in listing.splitlines():
            if path and os.path.isfile(path) and not os.path.islink(path):
                out.append((pkg, path))
    return out, versions, missing


def strip_compression(path):
    for ext in (".gz", ".bz2", ".xz"):
        if path.endswith(ext):
            return path[: -len(ext)]
    return path


def classify(path):
    """Return the extractor name for a path, or None to skip it."""
    if EXCLUDE_RE.search(path):
        return None
    base = strip_compression(path)
    name = base.rsplit("/", 1)[-1]
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if MAN_RE.match(base):
        return "man"
    if base.startswith(FORTUNE_DIR):
        if ext == "dat":
            return None
        return "text"
    if ext in HTML_EXT:
        return "html"
    if ext == "pod":
        return "pod"
    if INFO_RE.search(base):
        return "info"
    if ext in TEXT_EXT or TEXT_NAMES.match(name):
        return "text"
    return None


def is_shadowed(path, existing):
    """True when `path` duplicates a text source that is also in the corpus."""
    base = strip_compression(path)
    if base.endswith((".html", ".htm")):
        stem = base.rsplit(".", 1)[0]
        for ext in (".txt", ".md", ".rst"):
            for comp in ("", ".gz"):
                if stem + ext + comp in existing:
                    return True
        # Sphinx: <root>/x/y.html has its source in <root>/_sources/x/y.rst.txt
        parts = base.split("/")
        for i in range(len(parts) - 1, 0, -1):
            root = "/".join(parts[:i])
            rel = "/".join(parts[i:]).rsplit(".", 1)[0]
            if root + "/_sources/" + rel + ".rst.txt" in existing or \
               root + "/_sources/" + rel + ".txt" in existing:
                return True
    if base.startswith(FORTUNE_DIR) and not base.endswith(".u8"):
        # fortune files come as legacy-charset X and UTF-8 X.u8
        if base + ".u8" in existing:
            return True
    return False


def lang_of(pkg, path):
    """Language of a file's source (primary subtag), from its package or
    path.  Approximate: translated pages can keep untranslated passages."""
    m = re.match(r"(?:manpages|debian-reference|libreoffice-help|fortunes)-([a-z]+)", pkg)
    if m and m.group(1) != "dev":
        return m.group(1)
    m = re.search(r"/debian-handbook/html/([a-z]{2})-", path)
    if m:
        return m.group(1)
    m = re.search(r"/Documentation/translations/([a-z]{2})_", path)
    if m:
        return m.group(1)
    m = re.match(r"/usr/share/man/([a-z]{2})", path)
    if m and not path.startswith("/usr/share/man/man"):
        return m.group(1)
    return "en"


# ----------------------------------------------------------------------------
# extractors

def read_bytes(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return f.read()
    if path.endswith(".bz2"):
        with bz2.open(path, "rb") as f:
            return f.read()
    if path.endswith(".xz"):
        with lzma.open(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


_HTML_DROP = re.compile(
    r"<!--.*?-->|<(script|style|head|noscript|svg|math|template)\b.*?</\1\s*>",
    re.S | re.I)
_HTML_PRE = re.compile(r"(<pre\b[^>]*>.*?</pre\s*>)", re.S | re.I)
_HTML_BLOCK = re.compile(
    r"</?(?:p|div|br|li|ul|ol|dl|dt|dd|tr|table|h[1-6]|section|article|header|"
    r"footer|blockquote|hr|title|td|th|figure|figcaption|nav|aside|main|"
    r"caption|body|html)\b[^>]*>", re.I)
_HTML_TAG = re.compile(r"<[^>]*>")
_WS = re.compile(r"\s+")


def html_to_text(s):
    """Tags dropped, block tags -> line breaks, <pre> kept verbatim."""
    s = _HTML_DROP.sub(" ", s)
    out = []
    for i, part in enumerate(_HTML_PRE.split(s)):
        if i % 2:  # a <pre> block
            out.append("\n" + html.unescape(_HTML_TAG.sub("", part)) + "\n")
        else:
            part = _WS.sub(" ", part)
            part = _HTML_BLOCK.sub("\n", part)
            part = html.unescape(_HTML_TAG.sub("", part))
            out.append("\n".join(l.strip(" ") for l in part.split("\n")))
    return "".join(out)


_ROFF_CHARS = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "aq": "'", "dq": '"',
    "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019",
    "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae", "tm": "\u2122",
    "de": "\u00b0", "mu": "\u00d7", "di": "\u00f7", "+-": "\u00b1",
    "->": "\u2192", "<-": "\u2190", "<=": "\u2264", ">=": "\u2265",
    "!=": "\u2260", "ga": "`", "ha": "^", "ti": "~", "rs": "\\",
    "sl": "/", "ba": "|", "or": "|", "fo": "\u00ab", "fc": "\u00bb",
    "Fo": "\u00ab", "Fc": "\u00bb", "Tm": "\u2122", "R": "\u00ae",
    "lh": "\u261c", "rh": "\u261e", "at": "@", "sh": "#", "Do": "$",
    "ss": "\u00df", "ae": "\u00e6", "oe": "\u0153", "pc": "\u00b7",
    "ua": "\u2191", "da": "\u2193", "ul": "_", "ru": "_", "bv": "|",
    "lB": "[", "rB": "]", "lC": "{", "rC": "}", "la": "\u27e8",
    "ra": "\u27e9", "OK": "\u2713", "sc": "\u00a7", "ps": "\u00b6",
}
_ROFF_ESC = re.compile(
    r"""\\(?:
        \((?P<c2>..)                      # \(xx
      | \[(?P<cn>[^\]]*)\]                # \[name]
      | \*(?:\((?P<s2>..)|\[(?P<sn>[^\]]*)\]|(?P<s1>.))   # strings
      | [fFgkmMnVY](?:\(..|\[[^\]]*\]|.)  # fonts, regs, colours
      | [sS][+-]?(?:\d\d?|\(\d\d|\[[^\]]*\])  # size
      | [hvwlLNoxXbDRZAB]'[^']*'          # motions, width, \N'nn', ...
      | (?P<nl>$)                         # line continuation
      | (?P<one>.)
    )""", re.X | re.M)
_ROFF_ONE = {"-": "-", "e": "\\", "\\": "\\", "~": " ", " ": " ", "0": " ",
             "'": "'", "`": "`", ".": ".", "t": "\t", "%": "", "&": "",
             "|": "", "^": "", "c": "", "d": "", "u": "", "p": "", "r": "",
             "{": "", "}": "", "a": "", "z": "", "!": "", ")": "", "/": "",
             ",": "", ":": ""}


def _roff_esc(m):
    if m.group("c2") is not None:
        return _ROFF_CHARS.get(m.group("c2"), "")
    if m.group("cn") is not None:
        name = m.group("cn")
        if name.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}", name):
            return chr(int(name[1:], 16))
        return _ROFF_CHARS.get(name, "")
    if m.group("s2") is not None or m.group("sn") is not None:
        n = m.group("s2") or m.group("sn")
        return {"lq": "\u201c", "rq": "\u201d", "R": "\u00ae", "Tm": "\u2122"}.get(n, "")
    if m.group("s1") is not None:
        return {"R": "\u00ae"}.get(m.group("s1"), "")
    if m.group("nl") is not None:
        return ""
    if m.group("one") is not None:
        return _ROFF_ONE.get(m.group("one"), m.group("one"))
    return ""


def _macro_args(rest):
    args = re.findall(r'"((?:[^"]|"")*)"|(\S+)', rest)
    return " ".join(a.replace('""', '"') if a else b for a, b in args)


_ROFF_INLINE = {
    "B", "I", "BR", "RB", "BI", "IB", "IR", "RI", "SM", "SB", "UR", "MT",
    "OP", "Nm", "Fl", "Ar", "Op", "Pa", "Xr", "Dv", "Er", "Ev", "Fn", "Fa",
    "Ft", "Va", "Cm", "Ic", "Em", "Sy", "Li", "Ql", "Dq", "Sq", "Pq", "Qq",
    "Ms", "Tn", "Ux", "Bx", "At", "Ox", "Nx", "Fx", "Ad", "An", "Cd", "Lb",
    "Ns", "Nd",
}
_ROFF_BREAK = {"PP", "P", "LP", "sp", "br", "RS", "RE", "Pp", "Bl", "El",
               "Bd", "Ed", "HP", "in", "ti", "ne", "bp", "Lp", "YS", "SY"}


def roff_to_text(s):
    """Rough man(7)/mdoc(7) to plain text: filled paragraphs, headings and
    list tags on their own lines, no-fill blocks and tables kept line by
    line."""
    out = []
    para = []
    fill = True
    tbl = 0          # 0: not in table, 1: options/format lines, 2: data
    tag_next = False
    skip_until = None
    lines = s.split("\n")
    if len(lines) < 5 and any(l.startswith(".so ") for l in lines):
        return ""  # alias page

    def flush():
        if para:
            out.append(" ".join(para))
            para.clear()

    def emit(text):
        nonlocal tag_next
        text = _ROFF_ESC.sub(_roff_esc, text)
        if tag_next or not fill or tbl:
            flush()
            out.append(text)
            tag_next = False
        elif text.strip():
            para.append(text.strip())

    for line in lines:
        if skip_until is not None:
            if line.startswith(skip_until):
                skip_until = None
            continue
        if line.startswith(('.\\"', "'\\\"", ".\\#", '\\"')):
            continue
        if '\\"' in line:
            line = re.sub(r'\\".*$', "", line)
        if line.startswith((".", "'")):
            m = re.match(r"[.'][ \t]*([A-Za-z0-9_]+)[ \t]*(.*)$", line)
            if not m:
                continue
            req, rest = m.group(1), m.group(2)
            if req in ("ig", "de", "am", "de1"):
                skip_until = ".."
            elif req == "TS":
                flush()
                tbl = 1
            elif req == "TE":
                tbl = 0
                out.append("")
            elif req in ("nf", "EX", "Bd"):
                flush()
                fill = req == "Bd" and "-filled" in rest
                out.append("")
            elif req in ("fi", "EE", "Ed"):
                flush()
                fill = True
                out.append("")
            elif req in ("TH", "Dd", "Dt", "Os"):
                flush()
                out.append(_ROFF_ESC.sub(_roff_esc, _macro_args(rest)))
                out.append("")
            elif req in ("SH", "SS", "Sh", "Ss"):
                flush()
                out.append("")
                if rest:
                    out.append(_ROFF_ESC.sub(_roff_esc, _macro_args(rest)))
                else:
                    tag_next = True
            elif req in ("TP", "TQ", "It"):
                flush()
                if req == "It" and rest:  # mdoc: the tag; man: an indent
                    out.append(_ROFF_ESC.sub(_roff_esc, _macro_args(rest)))
                else:
                    tag_next = True
            elif req == "IP":
                flush()
                args = _macro_args(rest).rsplit(" ", 1)[0] if rest else ""
                if args and not args.isdigit():
                    out.append(_ROFF_ESC.sub(_roff_esc, args))
            elif req in _ROFF_BREAK:
                flush()
                if req not in ("br", "in", "ti", "ne"):
                    out.append("")
            elif req in _ROFF_INLINE and rest:
                glue = "" if req in ("BR", "RB", "BI", "IB", "IR", "RI") else " "
                args = re.findall(r'"((?:[^"]|"")*)"|(\S+)', rest)
                emit(glue.join(a.replace('""', '"') if a else b for a, b in args))
            continue
        if tbl == 1:
            # option line ends with ';', the last format line ends with '.'
            if line.rstrip().endswith("."):
                tbl = 2
            continue
        if tbl:
            line = line.replace("T{", "").replace("T}", "").replace("\t", "  ")
        if fill and not tbl and (not line.strip() or line[:1] in " \t"):
            flush()
            if not line.strip():
                out.append("")
                continue
        emit(line)
    flush()
    return "\n".join(out)


def pod_to_text(s):
    out = []
    skip = False
    for line in s.split("\n"):
        if line.startswith("="):
            cmd, _, rest = line[1:].partition(" ")
            if cmd in ("begin", "for"):
                skip = cmd == "begin"
                continue
            if cmd == "end":
                skip = False
                continue
            if cmd.startswith("head") or cmd == "item":
                out.append(rest)
            continue
        if not skip:
            out.append(line)
    t = "\n".join(out)
    t = re.sub(r"E<lt>", "<", t)
    t = re.sub(r"E<gt>", ">", t)
    t = re.sub(r"E<[^<>]*>", "", t)
    for _ in range(4):  # nested codes
        t = re.sub(r"[A-Z]<<+\s+(.*?)\s+>>+", r"\1", t, flags=re.S)
        t = re.sub(r"L<([^<>|]*)\|[^<>]*>", r"\1", t)
        t = re.sub(r"[A-Z]<([^<>]*)>", r"\1", t)
    return t


_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_BLANKS = re.compile(r"\n[ \t]*(?:\n[ \t]*){2,}")


def clean(t):
    t = t.replace("\r\n", "\n").replace("\r", "\n")
    t = _CTRL.sub("", t)
    t = "\n".join(l.rstrip() for l in t.split("\n"))
    t = _BLANKS.sub("\n\n", t)
    return t.strip("\n")


def extract(job):
    """Worker: (path, kind) -> text or None."""
    path, kind = job
    try:
        raw = read_bytes(path)
    except (OSError, EOFError, lzma.LZMAError):
        return None
    if b"\x00" in raw[:65536]:
        return None
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if s.startswith("\ufeff"):
        s = s[1:]
    if kind == "man":
        s = roff_to_text(s)
    elif kind == "html":
        s = html_to_text(s)
    elif kind == "pod":
        s = pod_to_text(s)
    return clean(s)


def split_sections(text, max_chars):
    if len(text) <= max_chars:
        return [text]
    parts, start = [], 0
    while len(text) - start > max_chars:
        end = start + max_chars
        cut = text.rfind("\n\n", start + max_chars // 2, end)
        if cut < 0:
            cut = text.rfind("\n", start + max_chars // 2, end)
        if cut < 0:
            cut = end
        parts.append(text[start:cut].strip("\n"))
        start = cut
    parts.append(text[start:].strip("\n"))
    return [p for p in parts if p]


# ----------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Expects these Debian 12 packages to be installed (apt-get install "
               "--no-install-recommends ...): " + " ".join(PACKAGES) +
               ". Missing ones are an error unless --allow-missing. "
               "If their distinct text is smaller than --mb, the document "
               "sequence is repeated and a NOTE is printed to stderr.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output .jsonl path")
    ap.add_argument("--mb", type=float, default=250,
                    help="output size in MB (10**6 bytes of JSONL; default 250)")
    ap.add_argument("--seed", default="flat-tokens-beam",
                    help="seed of the document interleaving hash")
    ap.add_argument("--max-doc-chars", type=int, default=100_000,
                    help="longer documents are split at paragraph breaks")
    ap.add_argument("--min-doc-chars", type=int, default=64,
                    help="shorter documents are dropped")
    ap.add_argument("--packages", nargs="+", default=PACKAGES,
                    help="Debian packages whose files are read")
    ap.add_argument("--allow-missing", action="store_true",
                    help="skip packages that are not installed instead of failing")
    ap.add_argument("--manifest", help="write a TSV (path, package, lang, "
                    "sections, bytes) of the distinct documents used")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)

    t0 = time.time()
    files, versions, missing = package_files(sorted(set(args.packages)))
    if missing:
        msg = ("missing packages: " + " ".join(missing) +
               "\ninstall with: apt-get install --no-install-recommends " +
               " ".join(missing))
        if not args.allow_missing:
            sys.exit("error: " + msg)
        print("warning: " + msg, file=sys.stderr)
    owner = {}
    for pkg, path in sorted(files, key=lambda x: (x[1], x[0])):
        owner.setdefault(path, pkg)
    existing = set()
    cands = []
    for path in sorted(owner):
        kind = classify(path)
        if kind:
            cands.append((path, kind))
            existing.add(strip_compression(path))
            existing.add(path)
    cands = [(p, k) for p, k in cands if not is_shadowed(p, existing)]
    seed = args.seed.encode()
    cands.sort(key=lambda pk: (hashlib.sha256(seed + b"\0" + pk[0].encode()).digest(), pk[0]))
    print(f"{len(cands)} candidate files from {len(versions)} packages "
          f"({time.time() - t0:.1f}s)", file=sys.stderr)

    target = int(args.mb * MB)
    seen = set()
    docs = []  # distinct encoded lines written, in output order
    manifest = []
    written = 0
    n_docs = 0
    with open(args.out, "wb") as out, Pool(args.jobs) as pool:
        for (path, kind), text in zip(cands, pool.imap(extract, cands, chunksize=16)):
            if written >= target:
                break
            if not text or len(text) < args.min_doc_chars:
                continue
            h = hashlib.sha1(text.encode()).digest()
            if h in seen:
                continue
            seen.add(h)
            secs = [s for s in split_sections(text, args.max_doc_chars)
                    if len(s) >= args.min_doc_chars]
            nbytes = nsec = 0
            for s in secs:
                if written >= target:
                    break
                line = orjson.dumps({"text": s}) + b"\n"
                docs.append(line)
                out.write(line)
                written += len(line)
                n_docs += 1
                nsec += 1
                nbytes += len(line)
            manifest.append((path, owner[path], lang_of(owner[path], path),
                             nsec, nbytes))
        pool.terminate()
        distinct = sum(len(l) for l in docs)
        passes = 1
        while written < target:
            if not docs:
                sys.exit("error: no text found")
            passes += 1
            print(f"NOTE: distinct text is only {distinct / MB:.1f} MB < "
                  f"{args.mb:g} MB requested; repeating it (pass {passes})",
                  file=sys.stderr)
            for line in docs:
                if written >= target:
                    break
                out.write(line)
                written += len(line)
                n_docs += 1

    if args.manifest:
        with open(args.manifest, "w", encoding="utf-8") as m:
            m.write("# packages: " + " ".join(f"{p}={v}" for p, v in sorted(versions.items())) + "\n")
            m.write("path\tpackage\tlang\tsections\tbytes\n")
            for row in manifest:
                m.write("\t".join(map(str, row)) + "\n")
    langs = {}
    for _, _, lang, _, b in manifest:
        langs[lang] = langs.get(lang, 0) + b
    top = ", ".join(f"{k} {v / MB:.1f}" for k, v in
                    sorted(langs.items(), key=lambda kv: -kv[1])[:12])
    print(f"wrote {n_docs} docs, {written / MB:.1f} MB to {args.out} "
          f"({len(manifest)} distinct files, {distinct / MB:.1f} MB distinct, "
          f"{passes} pass(es), {time.time() - t0:.0f}s); {len(langs)} languages, "
          f"MB by language: {top}, ...", file=sys.stderr)


if __name__ == "__main__":
    main()
