"""Earlier datasets: which ones --dedup_against names, and (for the scheduled templates) which
dated datasets came before a day's.

    python -m pipeline.earlier OUTPUT   # prints the --dedup_against flags run_daily.sh passes

A day's dataset is `<prefix>/<YYYY-MM-DD>[suffix]` (e.g. gs://b/flat-tokens/2024-06-01.zarr);
the earlier ones are every sibling whose name has the same form and an earlier date: the
documented window of templates/scheduled/ is "all earlier dates under the same prefix".
Siblings that are not committed (a failed day being retried) are left out with a warning on
stderr: they hold no dataset yet, and --dedup_against would refuse them.
"""
import posixpath
import re
import sys

from fsspec.core import url_to_fs

from flat_tokens import read_guard
from transforms.read.inputs import absolute
from flat_tokens.format.index_files import INDEX_DIRECTORY, MissingIndex, index_key, is_index_file, near_file_of
from transforms.write.zarr_store import read_root_attributes

_DATED = re.compile(r"(\d{4}-\d{2}-\d{2})(.*)")
_GLOB = re.compile(r"[*?\[]")


def _url(fs, path: str) -> str:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def _same(a: str, b: str) -> bool:
    return absolute(a).rstrip("/") == absolute(b).rstrip("/")


def committed(fs, path: str) -> bool:
    """Whether `path` holds a dataset's root metadata (written last, by its commit)."""
    return fs.exists(f"{path}/zarr.json") or fs.exists(f"{path}/.zattrs")


def resolve_datasets(patterns: list[str], output: str, storage_options: dict | None = None) -> list[str]:
    """--dedup_against's datasets: each path as given (refused later when it is not a committed
    dataset with an index), each glob expanded (sorted) to its committed matches, the output
    itself left out (a glob over a prefix matches today's dataset too), each once."""
    found = []
    for pattern in patterns:
        if _GLOB.search(pattern):
            fs, path = url_to_fs(pattern, **(storage_options or {}))
            listed = sorted(fs.glob(path.rstrip("/")))
            # A glob over a prefix also matches datasets being built (today's, a concurrent
            # day's, a failed one's): those hold no dataset yet, and are skipped, said on stderr.
            matches = []
            for match in listed:
                if committed(fs, match):
                    matches.append(_url(fs, match))
                elif not _same(_url(fs, match), output):
                    print(f"flat-tokens: --dedup_against {pattern}: {_url(fs, match)} is not committed: skipped",
                          file=sys.stderr)
        else:
            matches = [absolute(pattern)]
        found += [m for m in matches if not _same(m, output) and m not in found]
    return found


def earlier_index_files(url: str, storage_options: dict | None = None) -> list[tuple[str, tuple | None]]:
    """The index files of the committed dataset at `url` (as fsspec URLs), checked against its
    commit, each with the (size, CRC-32C, tail) its manifest lists for it (None for a dataset
    without a manifest), which the build checks it against as it reads it; MissingIndex saying
    how to get one when there is none."""
    try:
        attrs = read_root_attributes(url, storage_options)
    except Exception as e:  # noqa: BLE001 - any reason it cannot be opened is the same answer
        raise MissingIndex(f"--dedup_against {url}: not a committed flat-tokens dataset ({type(e).__name__}: {e}); "
                           f"build it first, or leave it out") from None
    if not attrs.get("complete") or attrs.get("format") != "flat-tokens":
        raise MissingIndex(f"--dedup_against {url}: not a committed flat-tokens dataset; build it first, or leave it "
                           f"out")
    described = (attrs.get("stats") or {}).get("dedup_index")
    if not described:
        raise MissingIndex(f"--dedup_against {url}: has no dedup index (built with --dedup none, or by a version "
                           f"before dedup indexes); rebuild it with --dedup exact or near (and --overwrite) to "
                           f"give it one, or add one with `flat-tokens index {url}` (docs/dedup.md)")
    fs, path = url_to_fs(url, **(storage_options or {}))
    directory = posixpath.join(path.rstrip("/"), INDEX_DIRECTORY)
    names = sorted(p for p in (fs.ls(directory, detail=False) if fs.exists(directory) else []) if is_index_file(p))
    if len(names) != described.get("files"):
        raise MissingIndex(f"--dedup_against {url}: its dedup index has {len(names)} files, its commit says "
                           f"{described.get('files')}: damaged; rebuild it with --overwrite")
    try:
        listed = read_guard.load_manifest(url, storage_options)
    except read_guard.DatasetError as e:
        raise MissingIndex(f"--dedup_against {url}: its manifest cannot be trusted ({e}); rebuild it with "
                           f"--overwrite") from None
    expected = {}
    for name in names:
        entry = None if listed is None else listed.expected(index_key(name))
        if listed is not None and entry is None:
            raise MissingIndex(f"--dedup_against {url}: {index_key(name)} is not in its manifest (run "
                               f"{listed.run_id}): not this dataset's; rebuild it with --overwrite")
        expected[name] = None if entry is None else tuple(entry)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return [(p if protocol in ("file", "local") else f"{protocol}://{p}", expected[p]) for p in names]


def index_files(datasets: list[str], storage_options: dict | None = None) -> list[tuple[int, str, tuple | None]]:
    """(dataset number, index file URL, its manifest entry) of every earlier dataset;
    MissingIndex when one has none."""
    return [(i, f, entry) for i, url in enumerate(datasets) for f, entry in earlier_index_files(url, storage_options)]


def near_files(datasets: list[str], near: tuple, storage_options: dict | None = None) -> list[tuple]:
    """--dedup near: (dataset number, exact file URL, its manifest entry, near file URL, its
    manifest entry) of every earlier dataset's index. MissingIndex when one's index has no near
    part (built with --dedup exact: its near-copies could not be found, and a build that said
    it removed them would not have), or keys made from other signatures (shingles, their size,
    the bins), which could never match this build's."""
    settings, _ = near
    found = []
    for i, url in enumerate(datasets):
        exact = earlier_index_files(url, storage_options)
        described = ((read_root_attributes(url, storage_options).get("stats") or {}).get("dedup_index") or {})
        near_part = described.get("near")
        if not near_part:
            raise MissingIndex(f"--dedup_against {url}: its dedup index has no near part (built with --dedup exact), "
                               f"so near-copies of its texts cannot be found; rebuild it with --dedup near (and "
                               f"--overwrite), or build this dataset with --dedup exact")
        if near_part.get("signature") != settings.signature_key():
            raise MissingIndex(f"--dedup_against {url}: its near index was made from other signatures "
                               f"({near_part.get('signature')}) than this build's ({settings.signature_key()}); "
                               f"build with the same --near_shingle, --near_shingle_size and --near_hashes")
        listed = read_guard.load_manifest(url, storage_options)
        fs, _ = url_to_fs(url, **(storage_options or {}))
        for exact_url, entry in exact:
            near_url = near_file_of(exact_url)
            near_entry = None if listed is None else listed.expected(index_key(near_url))
            there = fs.exists(url_to_fs(near_url, **(storage_options or {}))[1])
            if (listed is not None and near_entry is None) or not there:
                raise MissingIndex(f"--dedup_against {url}: {index_key(near_url)} is missing or not in its "
                                   f"manifest: damaged; rebuild it with --overwrite")
            found.append((i, exact_url, entry, near_url, None if near_entry is None else tuple(near_entry)))
    return found


def earlier_dated(output: str, storage_options: dict | None = None) -> list[str]:
    """The committed siblings of a dated OUTPUT with an earlier date and the same suffix."""
    fs, path = url_to_fs(output, **(storage_options or {}))
    path = path.rstrip("/")
    dated = _DATED.fullmatch(posixpath.basename(path))
    if not dated:
        raise ValueError(f"{output}: not a dated dataset (<prefix>/YYYY-MM-DD[suffix])")
    day, suffix = dated.groups()
    parent = posixpath.dirname(path)
    earlier = []
    for sibling in sorted(fs.ls(parent, detail=False)) if fs.exists(parent) else []:
        other = _DATED.fullmatch(posixpath.basename(sibling.rstrip("/")))
        if not other or other.group(2) != suffix or other.group(1) >= day:
            continue
        if not committed(fs, sibling):
            print(f"flat-tokens: {_url(fs, sibling)} is not committed: not deduplicated against", file=sys.stderr)
            continue
        earlier.append(_url(fs, sibling.rstrip("/")))
    return earlier


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipeline.earlier OUTPUT", file=sys.stderr)
        return 2
    try:
        for url in earlier_dated(argv[0]):
            print(f"--dedup_against={url}")
    except ValueError as e:  # not a dated output: no earlier days to speak of
        print(f"flat-tokens: {e}: not deduplicated against earlier days", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
