"""Turning the bytes of a JSONL file into documents, blank lines and rejected lines.

Pure functions, so every rule is testable without a runner. Lines are split on b"\\n"
only: U+2028, U+2029 and U+0085 inside a string are text, not line breaks. The meaning of
a line is the standard library's `json` (orjson is only the fast path: when it refuses a
line, `json` decides, so NaN or huge integers in other keys do not reject a document).
"""
import json
from collections import Counter
from dataclasses import dataclass, field

import orjson

BOM = b"\xef\xbb\xbf"
EXCERPT_BYTES = 200
_READ_BLOCK = 1 << 22

# Reasons a line is rejected (the keys of stats["rejected_by_reason"]).
INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_TEXT_KEY = "missing_text_key"
TEXT_NOT_A_STRING = "text_not_a_string"
UNENCODABLE_TEXT = "unencodable_text"  # lone surrogates: valid JSON, but no UTF-8 to tokenize
# Nested deeper than orjson (1024 levels) and then `json` (Python's recursion limit) can parse.
TOO_DEEPLY_NESTED = "too_deeply_nested"


def iter_lines(f, start: int = 0, stop: int | None = None):
    """Yields (byte offset, line without its b"\\n") for each line starting in [start, stop).

    A line belongs to the range holding its first byte, so consecutive ranges of one file
    see every line exactly once. `f` is a binary file object positioned anywhere.

    Each line is bytes-like: a memoryview into the block read (no copy of the line: on
    documents of kilobytes, splitting every block into bytes objects cost as much CPU as
    parsing the JSON, 0.85 s of 1.25 GB), or bytes for a line that spanned blocks.
    `bytes(line)` copies one out."""
    if start > 0:
        # The line holding byte start-1 belongs to the previous range, unless it ends there.
        f.seek(start - 1)
        pos = start - 1 + len(f.readline())
    else:
        if f.seekable():
            f.seek(0)
        pos = 0
    pending = []  # pieces of a line not yet ended: joined once, so long lines cost linear time
    while stop is None or pos < stop:
        block = f.read(_READ_BLOCK)
        if not block:
            break
        find = block.find
        end = find(b"\n")
        if end < 0:
            pending.append(block)
            continue
        view = memoryview(block)
        begin = 0
        while end >= 0:
            line = view[begin:end]
            if pending:
                # Only the line the last block left unfinished is joined: prepending it to
                # the whole block copied every byte of the input once more.
                pending.append(line)
                line = b"".join(pending)
                pending = []
            yield pos, line
            pos += len(line) + 1
            if stop is not None and pos >= stop:
                return
            begin = end + 1
            end = find(b"\n", begin)
        if begin < len(block):
            pending.append(view[begin:])
    rest = b"".join(pending)
    if rest and (stop is None or pos < stop):
        yield pos, rest


def parse_line(raw, text_key: str) -> tuple[str | None, str | None]:
    """Returns (text, None) for a document, (None, None) for a blank line, (None, reason) else.
    `raw`: bytes-like (iter_lines' memoryview)."""
    # The fast path, for the line that is one JSON object holding a string under the key:
    # orjson reads the line where it lies. It accepts only what the slow path accepts too,
    # with the same value (JSON whitespace around the object is what strip() removes), and
    # refuses lone surrogates, so the text is valid UTF-8. Everything else takes the slow path.
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        obj = None
    if type(obj) is dict:
        text = obj.get(text_key)
        if type(text) is str:
            return text, None
    return _parse_slowly(bytes(raw), text_key)


def _parse_slowly(raw: bytes, text_key: str) -> tuple[str | None, str | None]:
    """parse_line's every rule: blank lines, a byte-order mark, and why a line is rejected."""
    raw = raw.strip()
    if raw.startswith(BOM):
        raw = raw[len(BOM):].strip()
    if not raw:
        return None, None
    checked_utf8 = True  # orjson refuses lone surrogates itself
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        checked_utf8 = False
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return None, INVALID_UTF8
        except ValueError:
            return None, INVALID_JSON
        except RecursionError:
            return None, TOO_DEEPLY_NESTED
    if not isinstance(obj, dict):
        return None, NOT_AN_OBJECT
    if text_key not in obj:
        return None, MISSING_TEXT_KEY
    text = obj[text_key]
    if not isinstance(text, str):
        return None, TEXT_NOT_A_STRING
    if not checked_utf8 and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None, UNENCODABLE_TEXT
    return text, None


def excerpt(raw) -> str:
    """A bounded, printable excerpt of a raw line (bytes-like) for the rejected-lines report."""
    cut = bytes(raw[:EXCERPT_BYTES])
    text = cut.decode("utf-8", errors="backslashreplace")
    return text + ("..." if len(raw) > EXCERPT_BYTES else "")


def load_object(raw) -> dict | None:
    """The JSON object on a line (bytes-like), or None when the line holds no object (the
    slow path: only for lines parse_line has already rejected)."""
    raw = bytes(raw).strip()
    if raw.startswith(BOM):
        raw = raw[len(BOM):].strip()
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError included
            return None
    return obj if isinstance(obj, dict) else None


_CENSUS = "keys_seen:"  # how a KeyCensus travels inside a Counter of line counts
CENSUS_KEYS_PER_OBJECT = 32


@dataclass
class KeyCensus:
    """Which keys the JSON objects of some lines have, and which hold strings: what a
    message needs to say why --text_key matched nothing, and which key was probably meant."""
    objects: int = 0
    keys: Counter = field(default_factory=Counter)  # key -> objects that have it
    strings: Counter = field(default_factory=Counter)  # key -> objects where it holds a string
    chars: Counter = field(default_factory=Counter)  # key -> characters of those strings

    def add(self, obj: dict) -> None:
        self.objects += 1
        for key, value in list(obj.items())[:CENSUS_KEYS_PER_OBJECT]:
            self.keys[key] += 1
            if isinstance(value, str):
                self.strings[key] += 1
                self.chars[key] += len(value)

    def likely_text_key(self) -> str | None:
        """The key holding a string in every object (the longest strings when several do)."""
        always = [k for k, n in self.strings.items() if n == self.objects]
        return max(always, key=lambda k: (self.chars[k], k)) if always and self.objects else None

    def describe(self) -> str:
        """'content (256), id (256), meta (12); use --text_key content'."""
        keys = ", ".join(f"{k} ({n})" for k, n in self.keys.most_common(8)) or "none"
        likely = self.likely_text_key()
        return keys + (f"; use --text_key {likely}" if likely else "")

    def to_counts(self) -> Counter:
        counts = Counter({_CENSUS + "objects": self.objects})
        for name in ("keys", "strings", "chars"):
            counts.update({f"{_CENSUS}{name}:{k}": v for k, v in getattr(self, name).items()})
        return counts

    @classmethod
    def from_counts(cls, counts: dict) -> "KeyCensus":
        census = cls(objects=counts.get(_CENSUS + "objects", 0))
        for k, v in counts.items():
            if k.startswith(_CENSUS) and k != _CENSUS + "objects":
                name, key = k[len(_CENSUS):].split(":", 1)
                getattr(census, name)[key] += v
        return census
