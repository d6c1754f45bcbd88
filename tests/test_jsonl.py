"""Line splitting and parsing rules, without a runner."""
import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms.read import jsonl


def ranges_of(size, cuts):
    points = sorted({c for c in cuts if 0 < c < size})
    bounds = [0, *points, None]
    return list(zip(bounds[:-1], bounds[1:]))


@settings(deadline=None)
@given(lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=20),
       final_newline=st.booleans(), cuts=st.lists(st.integers(0, 300), max_size=6),
       block=st.one_of(st.none(), st.integers(1, 9)))
def test_ranges_see_every_line_exactly_once(lines, final_newline, cuts, block):
    """Also with blocks far smaller than the lines (`block`; None: the reader's own): a line
    begun in one block and ended blocks later is joined, at its offset."""
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    saved = jsonl._READ_BLOCK
    jsonl._READ_BLOCK = block or saved
    try:
        whole = [(offset, bytes(line)) for offset, line in jsonl.iter_lines(io.BytesIO(data))]
        pieces = [(offset, bytes(line)) for a, b in ranges_of(len(data), cuts)
                  for offset, line in jsonl.iter_lines(io.BytesIO(data), a, b)]
    finally:
        jsonl._READ_BLOCK = saved
    assert pieces == whole
    assert [line for _, line in whole] == (data.split(b"\n")[:-1] if data.endswith(b"\n") else
                                           data.split(b"\n") if data else [])
    for offset, line in whole:
        assert data[offset:offset + len(line)] == line


def test_only_newline_splits_lines():
    text = "a\u2028b\u2029c\u0085d\re"
    data = (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode()
    [(_, line)] = list(jsonl.iter_lines(io.BytesIO(data)))
    assert jsonl.parse_line(line, "text") == (text, None)


def test_parse_line_follows_the_json_module():
    assert jsonl.parse_line(b'  {"text": "x", "score": NaN}  ', "text") == ("x", None)
    assert jsonl.parse_line(b'{"text": "a", "text": "b"}', "text") == ("b", None)
    assert jsonl.parse_line(b'\xef\xbb\xbf{"text": "bom"}\r', "text") == ("bom", None)
    assert jsonl.parse_line(b"   \r", "text") == (None, None)
    assert jsonl.parse_line(b'{"text": "\\ud800"}', "text") == (None, jsonl.UNENCODABLE_TEXT)
    assert jsonl.parse_line(b'{"text": "a"', "text") == (None, jsonl.INVALID_JSON)
    assert jsonl.parse_line(b'{"text": "\xff"}', "text") == (None, jsonl.INVALID_UTF8)
    assert jsonl.parse_line(b'["text"]', "text") == (None, jsonl.NOT_AN_OBJECT)
    assert jsonl.parse_line(b'{"body": "x"}', "text") == (None, jsonl.MISSING_TEXT_KEY)
    assert jsonl.parse_line(b'{"text": 3}', "text") == (None, jsonl.TEXT_NOT_A_STRING)


def test_the_key_census_suggests_only_a_key_that_always_holds_a_string():
    census = jsonl.KeyCensus()
    for raw in (b'{"id": "a", "body": "a long text"}', b'\xef\xbb\xbf {"id": "b", "body": "more text", "n": 1}'):
        census.add(jsonl.load_object(raw))
    assert census.likely_text_key() == "body"  # both are strings everywhere: the longer ones
    assert census.describe() == "id (2), body (2), n (1); use --text_key body"
    census.add(jsonl.load_object(b'{"id": "c", "body": null}'))
    assert census.likely_text_key() == "id" and census.describe().endswith("use --text_key id")
    census.add(jsonl.load_object(b'{"id": 4}'))
    assert census.likely_text_key() is None and census.describe() == "id (4), body (3), n (1)"
    # it travels inside the counts Counter that ranges sum up, and comes back whole
    again = jsonl.KeyCensus.from_counts(census.to_counts() + census.to_counts())
    assert (again.objects, again.keys, again.strings) == (8, census.keys + census.keys, census.strings + census.strings)
    assert jsonl.load_object(b"[1, 2]") is None and jsonl.load_object(b"{broken") is None


_JSON_SPACE = st.sampled_from([b"", b" ", b"\t", b"\r", b"  \r", b"\x0c", b"\x0b"])
# An explicit alphabet (ASCII, accents, CJK, a line separator, quote, backslash, control):
# st.text() over all of Unicode first builds a table of every character, seconds on a busy CI machine.
_VALUES = st.one_of(st.text(alphabet="a \u00e9\u65e5\u2028\"\\\x01", max_size=8), st.integers(), st.none(),
                    st.lists(st.integers(), max_size=2))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.sampled_from([b"", jsonl.BOM, b"\xff"]), before=_JSON_SPACE, after=_JSON_SPACE,
       obj=st.dictionaries(st.sampled_from(["text", "body", "id"]), _VALUES, max_size=3),
       raw_tail=st.sampled_from([b"", b",", b"}", b"NaN"]))
def test_the_fast_path_over_a_view_agrees_with_every_rule(prefix, before, after, obj, raw_tail):
    """parse_line reads iter_lines' memoryviews with orjson first; whatever the line, the
    answer is the one the full rules give on its bytes."""
    line = prefix + before + json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass") + raw_tail + after
    block = b"xx\n" + line + b"\nyy"
    view = memoryview(block)[3:3 + len(line)]
    assert jsonl.parse_line(view, "text") == jsonl._parse_slowly(line, "text")
    assert jsonl.parse_line(line, "text") == jsonl._parse_slowly(line, "text")
