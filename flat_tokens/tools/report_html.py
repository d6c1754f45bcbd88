"""The dataset report (flat_tokens/tools/report.py) as one self-contained HTML page.

Self-contained: no script at all, no network at view time; every figure is inline SVG written
here by hand (a few bar and line charts do not need matplotlib, and the reader-only install
keeps its three dependencies). Every string that comes from the data (documents, rejected
lines, source names, file names) goes through html.escape, and the page's Content-Security-
Policy forbids scripts, so input text can never run as part of the page.
"""
from __future__ import annotations

import html
import json
import math

PALETTE = ("#3b6ea5", "#e07b39", "#4f9a57", "#b04a5a", "#7a5ba6", "#8c6d31", "#3a9a9a", "#a0a0a0")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d232b;margin:0;background:#f6f7f9}
main{max-width:1080px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:0 0 8px;border-bottom:1px solid #d8dce2;padding-bottom:4px}
h3{font-size:15px;margin:14px 0 6px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:12px 16px;margin:14px 0}
.sub{color:#5a6472}.note{color:#5a6472;font-size:13px}.warn{color:#9a4a00}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:4px 0}
td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}th{color:#5a6472;font-weight:600}
td.n,th.n{text-align:right}
dl.card{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}dl.card dt{color:#5a6472}
dl.card dd{margin:0;overflow-wrap:anywhere}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f3f4f6;padding:6px 8px;border-radius:4px;margin:4px 0}
figure{margin:8px 0}figcaption{color:#5a6472;font-size:12.5px}
svg{display:block;max-width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#333}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:8px 24px}
.pairs{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:6px 12px}.pairs .where{grid-column:1/-1;margin:8px 0 0;color:#555;font-size:12px;overflow-wrap:anywhere}
.window{white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.6;max-height:44em;overflow-y:auto}
.seg{padding:1px 0;border-radius:2px}.seg0{background:#e3edf8}.seg1{background:#fbead9}
.boundary{display:inline-block;background:#b04a5a;color:#fff;font:600 10px system-ui,sans-serif;
 padding:0 3px;margin:0 2px;border-radius:2px}
@media print{body{background:#fff}.window{max-height:none;overflow:visible}main{max-width:none;padding:0}section{break-inside:avoid;border:0;padding:0 0 8px}
 .grid{grid-template-columns:1fr 1fr}}
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def num(x) -> str:
    if isinstance(x, bool) or x is None:
        return esc(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"
    return esc(x)


def size(n) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def clip(text: str, width: int) -> str:
    """A label of at most `width` characters: its end, where names differ (paths, globs)."""
    text = str(text)
    return text if len(text) <= width else "…" + text[-(width - 1):]


def short(n: float) -> str:
    """An axis label: 1, 512, 4k, 2M."""
    for div, suffix in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "k")):
        if n >= div and n % div == 0:
            return f"{int(n // div)}{suffix}"
    return f"{n:g}"


# ---------------------------------------------------------------------------------------------
# SVG charts


def svg(width: int, height: int, title: str, body: list[str], fig_id: str, caption: str) -> str:
    return (f'<figure id="{esc(fig_id)}"><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><title>{esc(title)}</title>{"".join(body)}</svg>'
            f'<figcaption>{caption}</figcaption></figure>')


def log_bins(lengths: list[dict], per_octave: int = 4) -> tuple[list[float], list[list[int]]]:
    """Shared log2 bin edges for several (values, counts) distributions, and each one's counts."""
    lows = [min(d["values"]) for d in lengths if d["values"]]
    highs = [max(d["values"]) for d in lengths if d["values"]]
    lo = math.floor(math.log2(max(1, min(lows))) * per_octave) / per_octave
    hi = (math.floor(math.log2(max(1, max(highs))) * per_octave) + 1) / per_octave
    nbins = max(1, round((hi - lo) * per_octave))
    edges = [2 ** (lo + k / per_octave) for k in range(nbins + 1)]
    out = []
    for d in lengths:
        per = [0] * nbins
        for v, c in zip(d["values"], d["counts"]):
            k = min(nbins - 1, max(0, int((math.log2(max(1, v)) - lo) * per_octave + 1e-9)))
            per[k] += c
        out.append(per)
    return edges, out


def _log_x(edges, x0, w):
    a, b = math.log2(edges[0]), math.log2(edges[-1])
    return lambda v: x0 + w * (math.log2(max(v, edges[0])) - a) / (b - a)


def _x_ticks(edges, fx, y, tick_h=4) -> list[str]:
    out = []
    k = math.ceil(math.log2(edges[0]))
    while 2 ** k <= edges[-1]:
        x = fx(2 ** k)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + tick_h}" stroke="#666"/>'
                   f'<text x="{x:.1f}" y="{y + 15}" text-anchor="middle">{short(2 ** k)}</text>')
        k += 1 if edges[-1] / edges[0] < 2 ** 16 else 2
    return out


def length_histogram(dist: dict, fig_id: str, caption: str) -> str:
    """Sequence lengths on a log2 x axis (4 bins per octave), sequences per bin, with percentiles."""
    W, H, L, R, T, B = 640, 240, 56, 12, 16, 34
    edges, (per,) = log_bins([dist])
    top = max(per) or 1
    fx = _log_x(edges, L, W - L - R)
    fy = lambda c: T + (H - T - B) * (1 - c / top)  # noqa: E731
    body = [f'<line x1="{L}" x2="{W - R}" y1="{H - B}" y2="{H - B}" stroke="#666"/>',
            f'<line x1="{L}" x2="{L}" y1="{T}" y2="{H - B}" stroke="#666"/>']
    for k, c in enumerate(per):
        if c:
            x0, x1 = fx(edges[k]), fx(edges[k + 1])
            body.append(f'<rect class="bar" x="{x0 + 0.5:.1f}" y="{fy(c):.1f}" width="{max(1, x1 - x0 - 1):.1f}" '
                        f'height="{H - B - fy(c):.1f}" fill="{PALETTE[0]}"><title>{num(round(edges[k]))}–'
                        f'{num(round(edges[k + 1]))} tokens: {num(c)} sequences</title></rect>')
    for frac in (0.5, 1.0):
        y = fy(top * frac)
        body.append(f'<text x="{L - 4}" y="{y + 4:.1f}" text-anchor="end">{num(round(top * frac))}</text>')
    body += _x_ticks(edges, fx, H - B)
    for i, (name, value) in enumerate(dist.get("percentiles", {}).items()):
        x = fx(max(value, 1))
        right = x > W - R - 70  # near the right edge: the label goes left of its line
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{T}" y2="{H - B}" stroke="{PALETTE[3]}" '
                    f'stroke-dasharray="4 3"/><text x="{x - 3 if right else x + 3:.1f}" y="{T + 10 + 12 * i}" '
                    f'text-anchor="{"end" if right else "start"}" fill="{PALETTE[3]}" stroke="#fff" '
                    f'stroke-width="3" paint-order="stroke">{esc(name)} {num(value)}</text>')
    body.append(f'<text x="{(W + L) / 2}" y="{H - 3}" text-anchor="middle">tokens per sequence (log scale)</text>')
    return svg(W, H, "sequence-length distribution", body, fig_id, caption)


def source_lengths(per_source: list[dict], fig_id: str, caption: str) -> str:
    """Each source's length distribution (share of its sampled sequences per log2 bin), overlaid."""
    shown = [d for d in per_source if d["values"]]
    W, H, L, R, T, B = 640, 240, 56, 130, 16, 34
    edges, per = log_bins(shown)
    shares = [[c / (sum(p) or 1) for c in p] for p in per]
    top = max(max(s) for s in shares) or 1
    fx = _log_x(edges, L, W - L - R)
    fy = lambda c: T + (H - T - B) * (1 - c / top)  # noqa: E731
    body = [f'<line x1="{L}" x2="{W - R}" y1="{H - B}" y2="{H - B}" stroke="#666"/>',
            f'<line x1="{L}" x2="{L}" y1="{T}" y2="{H - B}" stroke="#666"/>',
            f'<text x="{L - 4}" y="{fy(top) + 4:.1f}" text-anchor="end">{top:.0%}</text>']
    for i, (d, s) in enumerate(zip(shown, shares)):
        color = PALETTE[i % len(PALETTE)]
        points = []
        for k, c in enumerate(s):
            points += [f"{fx(edges[k]):.1f},{fy(c):.1f}", f"{fx(edges[k + 1]):.1f},{fy(c):.1f}"]
        body.append(f'<polyline class="series" points="{" ".join(points)}" fill="none" stroke="{color}" '
                    f'stroke-width="1.6"><title>{esc(d["name"])}</title></polyline>')
        body.append(f'<rect x="{W - R + 10}" y="{T + 16 * i}" width="10" height="10" fill="{color}"/>'
                    f'<text x="{W - R + 24}" y="{T + 9 + 16 * i}">{esc(clip(d["name"], 18))}</text>')
    body += _x_ticks(edges, fx, H - B)
    body.append(f'<text x="{(W - R + L) / 2}" y="{H - 3}" text-anchor="middle">tokens per sequence (log scale)</text>')
    return svg(W, H, "sequence lengths per source", body, fig_id, caption)


def hbars(rows: list[tuple[str, list[float]]], series: list[str], fig_id: str, caption: str, fmt=num,
          title: str = "") -> str:
    """Horizontal bars, one group per row, one bar per series (with a legend)."""
    per = len(series)
    bar, gap = 12, 10
    W, L, R, T = 640, 150, 90, 8 + 16
    H = T + len(rows) * (per * bar + gap) + 6
    top = max([v for _, vs in rows for v in vs] + [0]) or 1
    body = []
    for j, name in enumerate(series):
        body.append(f'<rect x="{L + 110 * j}" y="4" width="10" height="10" fill="{PALETTE[j]}"/>'
                    f'<text x="{L + 14 + 110 * j}" y="13">{esc(name)}</text>')
    y = T
    for label, values in rows:
        body.append(f'<text x="{L - 6}" y="{y + per * bar / 2 + 4:.1f}" text-anchor="end">{esc(clip(label, 22))}</text>')
        for j, v in enumerate(values):
            w = (W - L - R) * v / top
            body.append(f'<rect class="bar" x="{L}" y="{y + j * bar}" width="{max(w, 0.5):.1f}" height="{bar - 2}" '
                        f'fill="{PALETTE[j]}"><title>{esc(label)} {esc(series[j])}: {fmt(v)}</title></rect>'
                        f'<text x="{L + w + 4:.1f}" y="{y + j * bar + bar - 3}">{fmt(v)}</text>')
        y += per * bar + gap
    body.append(f'<line x1="{L}" x2="{L}" y1="{T - 2}" y2="{H - 6}" stroke="#666"/>')
    return svg(W, H, title or caption, body, fig_id, caption)


def rank_frequency(counts: list[int], sampled: int, fig_id: str, caption: str) -> str:
    """Token frequency against rank, both on log10 axes (Zipf's plot)."""
    W, H, L, R, T, B = 640, 260, 60, 16, 12, 34
    n = len(counts)
    fmin = min(counts) / sampled
    xa, xb = 0, max(1.0, math.log10(n))
    ya, yb = math.floor(math.log10(fmin)), max(math.ceil(math.log10(counts[0] / sampled)), math.floor(math.log10(fmin)) + 1)
    fx = lambda r: L + (W - L - R) * (math.log10(r) - xa) / (xb - xa)  # noqa: E731
    fy = lambda f: T + (H - T - B) * (1 - (math.log10(f) - ya) / (yb - ya))  # noqa: E731
    # at most ~400 points: every rank up to 100, then log-spaced ranks
    ranks = sorted({*range(1, min(n, 100) + 1), *(int(round(10 ** (math.log10(n) * k / 300))) for k in range(301))})
    points = " ".join(f"{fx(r):.1f},{fy(counts[r - 1] / sampled):.1f}" for r in ranks if 1 <= r <= n)
    body = [f'<line x1="{L}" x2="{W - R}" y1="{H - B}" y2="{H - B}" stroke="#666"/>',
            f'<line x1="{L}" x2="{L}" y1="{T}" y2="{H - B}" stroke="#666"/>',
            f'<polyline class="series" points="{points}" fill="none" stroke="{PALETTE[0]}" stroke-width="1.6"/>']
    for k in range(0, math.floor(xb) + 1):
        x = fx(10 ** k)
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{H - B}" y2="{H - B + 4}" stroke="#666"/>'
                    f'<text x="{x:.1f}" y="{H - B + 15}" text-anchor="middle">{short(10 ** k)}</text>')
    for k in range(ya, yb + 1):
        y = fy(10 ** k)
        body.append(f'<line x1="{L - 4}" x2="{L}" y1="{y:.1f}" y2="{y:.1f}" stroke="#666"/>'
                    f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">1e{k}</text>')
    body.append(f'<text x="{(W + L) / 2}" y="{H - 3}" text-anchor="middle">rank (log scale); frequency per '
                f'sampled token (log scale)</text>')
    return svg(W, H, "token-id rank/frequency", body, fig_id, caption)


# ---------------------------------------------------------------------------------------------
# Sections


def card(rows: list[tuple[str, str]]) -> str:
    return '<dl class="card">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    th = "".join(f'<th class="{"n" if i in numeric else ""}">{esc(h)}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"n" if i in numeric else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def section(sid: str, title: str, content: list[str]) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{"".join(content)}</section>'


def provenance(r: dict) -> str:
    p = r["provenance"]
    tok = p.get("tokenizer") or {}
    build = p.get("build")
    package = p.get("package") or {}
    manifest = p.get("manifest")
    rows = [("command", f"<code>{esc(p['command'])}</code>" if p.get("command") else "not recorded"),
            ("inputs", "<br>".join(f"<code>{esc(i)}</code>" for i in (p.get("inputs") or [])) or "not recorded")]
    if p.get("mixture_file"):
        rows.append(("mixture file", f"<code>{esc(p['mixture_file'])}</code>"))
    rows += [("tokenizer", esc(f"{tok.get('spec')} ({tok.get('kind')}, vocab {tok.get('vocab_size')}, backend "
                               f"{tok.get('backend')}, sha256 {str(tok.get('sha256'))[:16]}…)") if tok else "not recorded"),
             ("seed", esc(p.get("seed"))), ("run id", f"<code>{esc(p.get('run_id'))}</code>"),
             ("versions", esc(f"written by {package.get('name')} {package.get('version')}; report by {r['version']}")),
             ("storage", esc(", ".join(f"{k} {json.dumps(v)}" for k, v in (p.get("storage") or {}).items()))),
             ("checksums", esc(p["checksums"])),
             # The report reads through the reader, which checks the seal when it opens the dataset
             # and each object it reads against the manifest (flat_tokens/read_guard.py).
             ("manifest", esc(f"sealed ({manifest.get('size')} bytes, sha256 {str(manifest.get('sha256'))[:16]}…): "
                              "every object this report read was checked against it; `flat-tokens verify` "
                              "checks every object") if isinstance(manifest, dict) else
              "none recorded in the dataset (committed before manifests): only the chunks' own checksums"),
             ("build", esc(f"{build['wall_seconds']:,.1f} s, {build['tokens_per_second'] or 0:,.0f} tokens/s, "
                           f"{size(build.get('output_bytes'))} written") if build and build.get("wall_seconds")
              is not None else "not recorded in the dataset (give the run's --summary_json as --summary)"),
             ("decoded with", esc(p.get("decoder") or p.get("decoder_note") or "token ids")),
             ("report", esc(f"generated {r['generated']} in {r['seconds']:.1f} s from {r['dataset']}"))]
    return section("provenance", "Provenance", [card(rows)])


def splits(r: dict) -> str:
    out = []
    s = r["splits"]
    rows = [[esc(name), num(x["sequences"]), num(x["tokens"]), num(x["max_token_id"]), size(x["bytes"]),
             num(x["bytes_per_token"]) if x["bytes_per_token"] is not None else "–"] for name, x in s.items()]
    out.append(table(["split", "documents", "tokens", "max token id", "on storage", "bytes/token"], rows, {1, 2, 3, 4, 5}))
    out.append('<div class="grid">')
    for name, x in s.items():
        d = x["lengths"]
        out.append(f'<div id="split-{esc(name)}"><h3>{esc(name)}</h3>')
        if d["summary"]:
            sm = d["summary"]
            out.append(f'<p class="mono">length: ' + "  ".join(f"{esc(k)} {num(v)}" for k, v in sm.items()) + "</p>")
            what = (f"all {num(d['sampled'])} sequences" if d["exact"] else
                    f"sample: {num(d['sampled'])} of {num(x['sequences'])} sequences, in {len(d['runs'])} runs "
                    f"spread over the split")
            out.append(length_histogram(d, f"fig-lengths-{name}", f"Sequence lengths of {esc(name)}, 4 bins per "
                                        f"octave, with p10/p50/p90/p99 ({what})."))
        else:
            out.append('<p class="note">empty split</p>')
        chosen = [w for w in x["windows"] if w["chosen"]][0]
        out.append(f'<p>Windows of the chosen length {num(chosen["length"])}: <b class="chosen">{num(chosen["full"])}</b> full '
                   f'windows ({num(chosen["dropped_tokens"])} tokens in the partial last one). Other lengths: '
                   + ", ".join(f"{num(w['length'])}: {num(w['full'])}" for w in x["windows"] if not w["chosen"])
                   + ".</p></div>")
    out.append("</div>")
    return section("splits", "Splits", out)


def mixture(r: dict) -> str:
    m = r.get("mixture")
    per_source = r["splits"]["train"]["lengths"].get("per_source")
    if not m and not per_source:
        return section("mixture", "Mixture", ['<p class="note">a single source: this dataset was written without '
                                              '--mixture or --record_sources</p>'])
    out = []
    if m:
        srcs = m["sources"]
        out.append(hbars([(s["name"], [s["share"], s.get("train_share") or 0]) for s in srcs],
                         ["asked share", "achieved share"], "fig-shares",
                         f"Share of the train tokens asked for (weights normalised) and achieved, per source of "
                         f"{esc(m.get('file'))} (exact, from the dataset's mixture record).",
                         fmt=lambda v: f"{v:.1%}", title="asked vs achieved token share"))
        out.append(table(["source", "weight", "max epochs", "multiplier", "documents", "train tokens",
                          "validation tokens"],
                         [[esc(s["name"]), num(s["weight"]), num(s["max_epochs"]), f"{s.get('multiplier', 0):.4f}",
                           num(s.get("documents")), num(s.get("train_tokens")), num(s.get("validation_tokens"))]
                          for s in srcs], {1, 2, 3, 4, 5, 6}))
    if per_source and any(d["values"] for d in per_source):
        d = r["splits"]["train"]["lengths"]
        what = "all train sequences" if d["exact"] else f"a sample of {num(d['sampled'])} train sequences"
        out.append(source_lengths(per_source, "fig-source-lengths",
                                  f"Sequence lengths per source, each as a share of its own sequences ({what})."))
    return section("mixture", "Mixture", out)


def dedup(r: dict) -> str:
    d = r["dedup"]
    out = [f'<p>Mode <b>{esc(d["mode"])}</b>: {num(d["exact"])} exact duplicates removed'
           + (f", {num(d['near'])} near-duplicates" if d.get("near") is not None else "") + ".</p>"]
    if d["per_source"]:
        out.append(hbars([(s["name"], [s["exact"], s["near"]]) for s in d["per_source"]], ["exact", "near"],
                         "fig-dedup", "Documents removed as duplicates per source (exact, from the dataset's stats).",
                         title="dedup removals per source"))
    near = d.get("near_dedup")
    if near:
        mean = near["clustered_texts"] / near["clusters"] if near.get("clusters") else 0
        out.append(f'<p>Near-duplicate clusters: {num(near["clusters"])} clusters of {num(near["clustered_texts"])} '
                   f'texts (mean cluster size {mean:.2f}; one text of each kept); {num(near["verified_pairs"])} of '
                   f'{num(near["candidate_pairs"])} candidate pairs verified, estimated false-positive rate '
                   f'{near["estimated_false_positive_rate"]:.2%}.</p>')
        if d.get("near_options"):
            out.append(f'<p class="note">settings: {esc(json.dumps(d["near_options"]))}</p>')
    if d.get("note"):
        out.append(f'<p class="warn">{esc(d["note"])}</p>')
    elif d.get("rows") is not None:
        out.extend(dedup_report(d))
    else:
        out.append('<p class="note">no dedup report was given (--dedup_report) or recorded: the run that built this '
                   'dataset was not asked for one</p>')
    return section("dedup", "Deduplication", out)


def cluster_bucket(size: int) -> str:
    """Cluster sizes 2..8 each, then power-of-two ranges (9–16, 17–32, ...)."""
    if size <= 8:
        return str(size)
    hi = 1 << (size - 1).bit_length()
    return f"{hi // 2 + 1}–{hi}"


def dedup_report(d: dict) -> list[str]:
    """The dedup report's part: the cluster sizes and a few removed/kept pairs."""
    if not d["rows"]:
        return [f'<p class="note">{esc(d["pairs_from"])}: no document was removed, so the dedup report has no rows</p>']
    out = []
    sizes = d["cluster_sizes"]
    buckets: dict[str, int] = {}
    for size, clusters in sizes:
        buckets[cluster_bucket(size)] = buckets.get(cluster_bucket(size), 0) + clusters
    whole = ("every row" if d["files_read"] == d["files"] else
             f"the {num(d['rows'])} rows of {num(d['files_read'])} of its {num(d['files'])} files (a kept text's rows "
             f"are all in one file, so these clusters are whole)")
    out.append(hbars([(k, [v]) for k, v in buckets.items()], ["clusters"], "fig-clusters",
                     f"Matched clusters by size: a kept text and the documents removed as its exact or near copies "
                     f"(rows of {esc(d['pairs_from'])} per kept text, plus the kept one; from {whole}).",
                     title="matched-cluster sizes"))
    clusters = sum(c for _, c in sizes)
    out.append(f'<p class="matched">{num(clusters)} kept texts were matched by {num(sum((s - 1) * c for s, c in sizes))} removed '
               f'documents; the largest cluster has {num(sizes[-1][0])} documents.</p>')
    if d["pairs"]:
        out.append(f'<h3>Removed / kept pairs</h3><p class="note">{len(d["pairs"])} rows of {esc(d["pairs_from"])} '
                   f'(near-copies first), each text read from the input at the place the row names</p>'
                   f'<div class="pairs"><b>removed</b><b>kept</b>')
        for p in d["pairs"]:
            how = ("exact copy" if p["match"] == "exact" else
                   "exact copy of a text an earlier dataset holds" if p["match"] == "earlier" else
                   f"near-copy of a text an earlier dataset holds, estimated Jaccard "
                   f"{p['estimated_similarity']:.3f}" if p["match"] == "earlier_near" else
                   f"near-copy, estimated Jaccard {p['estimated_similarity']:.3f}"
                   + (f", exact {p['similarity']:.3f}" if p.get("similarity") is not None else ""))
            out.append(f'<p class="where">{esc(p["removed_file"])} @ {esc(p["removed_offset"])} | kept '
                       f'{esc(p["kept_file"])} @ {esc(p["kept_offset"])} ({how})</p>'
                       f'<pre>{esc(p["removed_text"])}</pre><pre>{esc(p["kept_text"])}</pre>')
        out.append("</div>")
    return out


def rejected(r: dict) -> str:
    j = r["rejected"]
    if not j["total"]:
        return section("rejected", "Rejected lines", ["<p>No input line was rejected.</p>"])
    out = [hbars([(k, [v]) for k, v in j["by_reason"].items()], ["lines"], "fig-rejected",
                 f"{num(j['total'])} rejected lines by reason (exact, from the dataset's stats).",
                 title="rejected lines by reason")]
    if j.get("note"):
        out.append(f'<p class="warn">{esc(j["note"])}</p>')
    for reason, rows in j["examples"].items():
        out.append(f"<h3>{esc(reason)}</h3>")
        for e in rows:
            out.append(f'<p class="note">{esc(e.get("file"))}, line {num(e.get("line"))}</p>'
                       f'<pre class="excerpt">{esc(e.get("excerpt"))}</pre>')
    if j.get("where"):
        out.append(f'<p class="note">examples: the first of each reason in {esc(j["where"])}</p>')
    return section("rejected", "Rejected lines", out)


def tokens(r: dict) -> str:
    t = r["splits"]["train"]["token_ids"]
    if not t["sampled"]:
        return section("tokens", "Token ids", ['<p class="note">no train tokens</p>'])
    what = (f"all {num(t['sampled'])} train tokens" if t["exact"] else
            f"a sample of {num(t['sampled'])} train tokens: {t['windows']} windows of {num(t['window_tokens'])} "
            f"tokens spread over encoded_tokens")
    out = [rank_frequency(t["counts"], t["sampled"], "fig-rank-frequency",
                          f"{num(len(t['ids']))} distinct token ids by rank ({what})."),
           "<h3>Most frequent tokens</h3>",
           table(["rank", "id", "token", "share"],
                 [[num(k + 1), num(e["id"]), f'<code>{esc(e["piece"]) if e["piece"] is not None else "–"}</code>',
                   f"{e['count'] / t['sampled']:.2%}"] for k, e in enumerate(r["top_tokens"])], {0, 1, 3})]
    return section("tokens", "Token ids", out)


def docs(r: dict) -> str:
    out = ['<p class="note">train sequences spread over the split, decoded</p>']
    for e in r["documents"]:
        head = f"sequence {num(e['index'])}, {num(e['tokens'])} tokens" + (f", source {esc(e['source'])}"
                                                                            if e.get("source") else "")
        if "skipped" in e:
            out.append(f'<h3>{head}</h3><p class="note">not shown: {esc(e["skipped"])}</p>')
            continue
        body = esc(e["text"]) if "text" in e else esc(" ".join(map(str, e["ids"])))
        more = f' <span class="note">… (+{num(e["chars"] - len(e["text"]))} chars)</span>' if e.get("truncated") \
            and "text" in e else (" …" if e.get("truncated") else "")
        out.append(f'<h3>{head}</h3><pre class="doc">{body}{more}</pre>')
    return section("documents", "Documents", out)


def window(r: dict) -> str:
    w = r["window"]
    if "error" in w:
        return section("window", "A packed window", [f'<p class="note">{esc(w["error"])}</p>'])
    starts = sum(p["starts_document"] for p in w["pieces"])
    out = [f'<p>Window {w["index"]} of length {num(w["length"])} of {esc(w["split"])} '
           f'(encoded_tokens[0:{num(w["tokens"])}]{", partial: the split is shorter" if w["partial"] else ""}): '
           f'{starts} document starts, marked <span class="boundary">doc</span>; a window may begin inside a '
           f'document.</p><div class="window mono">']
    for k, p in enumerate(w["pieces"]):
        mark = '<span class="boundary">doc</span>' if p["starts_document"] else ""
        text = esc(p["text"]) if "text" in p else esc(" ".join(map(str, p["ids"])))
        out.append(f'{mark}<span class="seg seg{k % 2}" title="tokens {p["first"]}–{p["first"] + p["tokens"] - 1}">'
                   f'{text}</span>')
    out.append("</div>")
    return section("window", "A packed window", out)


def sample_note(r: dict) -> str:
    s = r["sample"]
    return section("sample", "How this page was computed", [
        f"<p>Counts (documents, tokens, mixture shares, dedup and rejected counts) are exact: they are the dataset's "
        f"metadata and the stats its run recorded. Distributions come from a bounded sample per split, so the "
        f"report of a large dataset costs about what a small one's does: up to {num(s['sequences'])} sequence "
        f"lengths and up to {num(s['tokens'])} tokens, each in up to {s['ranges']} runs spread evenly over the "
        f"split (everything when the split is smaller). Documents and the packed window are read whole; every "
        f"chunk read goes through the reader, which checks its checksum. Options: <code>flat-tokens report "
        f"--help</code>; docs/report.md in the repository.</p>"])


def render(r: dict) -> str:
    parts = [provenance(r), splits(r), mixture(r), dedup(r), rejected(r), tokens(r), docs(r), window(r),
             sample_note(r)]
    t = r["splits"]["train"]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>flat-tokens report: {esc(r["dataset"])}</title><style>{STYLE}</style></head><body><main>'
            f'<h1>flat-tokens dataset report</h1><p class="sub"><code>{esc(r["dataset"])}</code> · '
            f'{num(t["sequences"])} train documents, {num(t["tokens"])} train tokens · generated '
            f'{esc(r["generated"])}</p>' + "".join(parts) + "</main></body></html>\n")
