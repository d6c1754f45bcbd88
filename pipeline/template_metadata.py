"""templates/dataflow/metadata.json, generated from the option table (pipeline/options.py):

    python -m pipeline.template_metadata > templates/dataflow/metadata.json

tests/test_templates.py fails while the committed file differs from what this prints.

Dataflow checks every parameter value against its regexes before the launch (the whole value
must match). Google documents them as POSIX egrep expressions and does not say which engine
applies them, so they keep to what POSIX EREs, RE2 and Java's java.util.regex all read alike
(tests/test_templates.py checks Python's re, RE2 and the C library's regcomp): anchored ^...$;
literal characters and \\. outside brackets; bracket expressions of plain characters and ranges
only (no backslash, `[`, `]` or [:class:] inside; whitespace is the character itself, which
JSON shows as \\t \\n \\r); groups (...), |, ?, *, + and {m,n} up to 255. Nothing else: no
lookaround, no (?:...), no \\d \\w \\s \\S shorthands, no lazy quantifiers, no backreferences.
"""
import json
import re
import string
import sys

from pipeline import logs  # noqa: F401 (before apache_beam: it filters Beam's import-time noise)
from pipeline.options import OPTIONS, Option, Template, default_text

NAME = "flat-tokens-beam"
DESCRIPTION = ("Turns a JSONL corpus into a globally shuffled, tokenized flat-tokens zarr dataset (train and "
               "validation splits of encoded_tokens + seq_starts). The output is committed only when the whole "
               "job succeeds, and an existing non-empty output is never replaced unless overwrite=true.")

SPACE = " \t\n\r"
BUCKET = "[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"
# Characters of an output path: no glob characters, no whitespace, nothing a shell or URL quotes.
WRITE_PATH = "A-Za-z0-9._~=+@%:,/-"
HUB_NAME_CHARS = set(string.ascii_letters + string.digits + "._-")


def bracket(chars: set[str]) -> str:
    """A bracket expression for a set of letters, digits and `.`, `_`, `-` (runs become ranges)."""
    assert chars <= HUB_NAME_CHARS, chars - HUB_NAME_CHARS
    parts = []
    for alphabet in (string.ascii_uppercase, string.ascii_lowercase, string.digits):
        run = ""
        for c in alphabet + " ":  # the space ends the last run
            if c in chars:
                run += c
                continue
            if run:
                parts.append(run if len(run) < 3 else f"{run[0]}-{run[-1]}")
            run = ""
    parts += [c for c in "._" if c in chars]
    return "[" + "".join(parts) + ("-" if "-" in chars else "") + "]"


def not_ending_with(chars: set[str], suffix: str) -> str:
    """Strings over `chars` that do not end with `suffix`, without lookaround: shorter than the
    suffix, or ending in a character that breaks it at some position."""
    alternatives = []
    for i in range(len(suffix)):  # the i-th character from the end differs, the ones after it match
        broken, kept = suffix[-1 - i], suffix[len(suffix) - i:]
        alternatives.append(bracket(chars - {broken}) + kept.replace(".", "\\."))
    return f"({bracket(chars)}{{0,{len(suffix) - 1}}}|{bracket(chars)}*({'|'.join(alternatives)}))"


def _hub_name() -> str:
    """A HuggingFace hub name, `name` or `org/name`, whose last part does not end in .json (which
    would be a local tokenizer.json path, absent on Dataflow's machines)."""
    first = bracket(HUB_NAME_CHARS - set("._-"))
    part = first + bracket(HUB_NAME_CHARS) + "*"
    return f"({part}/)?{first}{not_ending_with(HUB_NAME_CHARS, '.json')}"


_FRACTION_BELOW_1 = ("0|0\\.[0-9]*|\\.[0-9]+"  # 0, 0., 0.25, .25
                     # scientific: a one-digit mantissa times 10 to a negative power is below 1
                     "|([0-9](\\.[0-9]*)?|\\.[0-9]+)[eE]-0*[1-9][0-9]{0,2}")

# kind -> (Dataflow paramType, regex or None)
KINDS = {
    "text": ("TEXT", None),
    "count": ("NUMBER", "^[0-9]{1,9}$"),
    "uint64": ("NUMBER", "^[0-9]{1,19}$"),  # 19 digits stay below 2**64
    "positive_int": ("NUMBER", "^[1-9][0-9]{0,11}$"),
    "fraction": ("NUMBER", f"^({_FRACTION_BELOW_1}|1|1\\.0*)$"),
    "fraction_below_1": ("NUMBER", f"^({_FRACTION_BELOW_1})$"),
    "flag": ("BOOLEAN", "^(true|false)$"),
    "choice": ("ENUM", None),  # the regex lists the choices
    "gcs_read": ("GCS_READ_FILE", f"^gs://{BUCKET}/[^\n\r]*[^{SPACE}]$"),
    # one file: no wildcard (* ?), not a folder
    "gcs_file": ("GCS_READ_FILE", f"^gs://{BUCKET}/[^\n\r*?]*[^{SPACE}/*?]$"),
    "gcs_write": ("GCS_WRITE_FOLDER", f"^gs://{BUCKET}/[{WRITE_PATH}]+$"),
    "tokenizer": ("TEXT", f"^(bytes|gs://{BUCKET}/[^{SPACE}]*[^{SPACE}/]|https://[^{SPACE}]+|{_hub_name()})$"),
}


def regex(t: Template) -> str | None:
    if t.kind != "choice":
        return KINDS[t.kind][1]
    values = [value for value, _, _ in t.choices]
    assert all(set(v) <= HUB_NAME_CHARS - {"."} for v in values), values  # no character needs escaping
    return f"^({'|'.join(values)})$"


def sentence(o: Option, text: str) -> str:
    """The option's help as a template help sentence: --name becomes name (a parameter)."""
    names = {x.name for x in OPTIONS}
    text = re.sub(r"--([a-z0-9_]+)", lambda m: m[1] if m[1] in names else m[0], text)
    first = text.split(" ", 1)[0]
    values = {str(c) for c in o.choices} | {v for v, _, _ in o.template.choices}
    if first.isalpha() and first.islower() and first not in values:
        text = text[0].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def template_default(o: Option) -> str | None:
    if o.required or default_text(o).startswith("required"):
        return None
    if o.type is bool:
        return "false"
    return None if o.default is None and o.default_text is None else default_text(o)


def parameter(o: Option) -> dict:
    t = o.template
    param_type, pattern = KINDS[t.kind][0], regex(t)
    help_text = sentence(o, t.help or o.help)
    if template_default(o) is not None:
        help_text += f" Default: {template_default(o)}."
    if t.example:
        help_text += f" Example: {t.example}"
    p = {"name": o.name, "label": t.label, "helpText": help_text, "paramType": param_type,
         "isOptional": not o.required}
    if t.choices:
        p["enumOptions"] = [{"value": v, "label": label, "description": d} for v, label, d in t.choices]
    if pattern:
        p["regexes"] = [pattern]
    # Only fixed defaults: a console may send defaultValue explicitly, and validation_fraction's
    # 0.01 would then override its "0 with validation_input" (default_text marks such cases).
    if template_default(o) is not None and o.default_text is None:
        p["defaultValue"] = template_default(o)
    return p


def metadata() -> dict:
    """Required parameters first (the console shows them first), then the table's order."""
    offered = [o for o in OPTIONS if isinstance(o.template, Template)]
    ordered = [o for o in offered if o.required] + [o for o in offered if not o.required]
    return {"name": NAME, "description": DESCRIPTION, "parameters": [parameter(o) for o in ordered]}


def render() -> str:
    return json.dumps(metadata(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
