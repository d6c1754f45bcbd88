"""The `mixture` root attribute of a dataset built with --mixture, as readers show it: the
names of its per-source fields (which are also the job's count keys, transforms/read/mixture.py)
and the text table that `flat-tokens run`'s summary and `flat-tokens inspect` print."""

DOCUMENTS = "documents"  # documents read (empty ones included)
DUPLICATES = "duplicates"  # copies removed by --dedup exact
TOKENS_AVAILABLE = "tokens_available"  # their tokens: tokens_s of the multiplier
TRAIN_TOKENS = "train_tokens"
VALIDATION_TOKENS = "validation_tokens"


def source_table(report: dict, indent: str = "  ") -> list[str]:
    """The `mixture` root attribute as a text table: one row per source, asked and achieved."""
    header = ("source", "share", "max_epochs", "multiplier", "documents", "duplicates", "tokens available",
              "train tokens", "train share", "validation tokens")
    rows = [header] + [(
        s["name"], f"{s['share']:.3f}", f"{s['max_epochs']:g}", f"{s['multiplier']:.4f}", f"{s[DOCUMENTS]:,}",
        f"{s[DUPLICATES]:,}", f"{s[TOKENS_AVAILABLE]:,}", f"{s[TRAIN_TOKENS]:,}", f"{s['train_share']:.3f}",
        f"{s[VALIDATION_TOKENS]:,}") for s in report["sources"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"{indent}mixture {report['file']}: train target {report['train_tokens_target']:,.0f} tokens"]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append(indent + "  " + "  ".join(cells).rstrip())
    return lines
