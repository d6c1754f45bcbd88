"""The staging area: the work a run keeps under its output, so that a rerun after a kill or a
failure redoes only what was not finished, and never reuses stale work (issue 20).

    OUTPUT/.flat-tokens-staging/
      command.json                   the command whose unfinished output this is (pipeline/resume.py)
      arrays.json                    the job key whose chunks the arrays train/ and validation/ hold
      units/<unit key>/<place>.ids   a tokenized batch's ids: as they are locally (the shuffle's
                                     spill file too), LZ4-compressed on an object store
      units/<unit key>/<place>.batch its documents: places, lengths, empty count, digests,
                                     MinHash signatures and copy defects (--dedup near)
      units/<unit key>/unit.<n>.json the unit's account (counts, line counts, rejected lines)
                                     and the places of its n batches
      shards/<job key>/<split>.<shard>.<chunks>.rec  a shard whose owned chunks all landed: its
                                     size, its receipts and the fragments it handed to the merge
      chunks/<job key>/<split>.<array>.<index>       a shared (merged) chunk that landed

A *unit* is what one worker reads: a JSONL byte range or a Parquet row group. Its key hashes
everything its tokenized batches depend on (pipeline/resume.py: the file's identity, the
range, the text key, the tokenizer's content and backend, the batch limits, the package
version). The *job key* hashes every unit key with every option that changes the arrays: a
shard gathers documents from every input, so its record is only good for the same job.

Trust. Every object is written whole: under a temporary name renamed into place locally; an
object store's upload is atomic. Every object carries a checksum written with it
(flat_tokens/format/checksums.py): accounts, `.batch` objects, shard records and chunk marks are
sealed (a CRC-32C trailer); a batch's ids stay as they are (the shuffle maps them in place),
and their size and CRC-32C are sealed into its `.batch`. A shard record and a chunk mark also
hold the size and CRC-32C of every chunk object they vouch for. Before a rerun reuses
anything, the launcher checks it against those sums (pipeline/resume.py); what is damaged is
redone, never reused. A unit's account also holds the spans and sha256 of the input bytes it
was read from, which the launcher reads again before it reuses the unit.

Fencing. Shard records, chunk marks and the arrays' mark are written in the lease of the write
they describe, create-only, like the chunks themselves (transforms/create_only.py): a run that
lost the output takes them back with its chunks, and one that is not trusted on a rerun is
deleted (fenced, by CreateOutput) before its shard writes it again. Their bytes depend only on
what they describe, so a retried write finds its own. Staged units are not fenced: their keys
name their content (and their stored bytes are checked before reuse), so a late one is never
wrong, at worst left over until the next run.

A unit is trusted when its account and all n of its batches (both files) are there,
whichever runner fused what. A batch's `.batch` is written only once the tokenizer guard has
compared its sample, so a batch that failed the guard is never reused. Shard records and chunk markers are written once their chunks landed and the claim
was confirmed after them; they count only while `arrays.json` names the same job key. That
marker is removed before any record or array is deleted, and written again only after the
arrays are created anew, so no record outlives the chunks it describes.

The folder's name starts with `.flat-tokens-`, which is how the ownership rules recognise the
tool's own objects (transforms/write/ownership.py). It is removed by the commit; `--restart`
throws it away; nothing else in it is ever deleted but by these names (and a unit or record
the launcher no longer trusts, before it is written again).
"""
import bisect
import hashlib
import io
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field

import numcodecs
import numpy as np
from fsspec.core import url_to_fs

from transforms import create_only
from flat_tokens.format import storage_faults
from flat_tokens.format.checksums import Damaged, Sum, seal, stored_problem, unseal
from transforms.local_files import LocalFile, mapped
from transforms.records import TokenizedBatch

FOLDER = ".flat-tokens-staging"
FORMAT = 2  # of the objects below; part of every key. 2: every object carries its checksum, and a unit's
# account the digest of the input bytes it was read from (one bump for both: issue 27)
UNITS, SHARDS, CHUNKS = "units", "shards", "chunks"
COMMAND, ARRAYS = "command.json", "arrays.json"
IDS, BATCH, SIGNATURES = ".ids", ".batch", ".signatures"
TEMPORARY = ".tmp"
# Staged ids cross the network to an object store LZ4-compressed (1.2 bytes per GPT-2 token
# instead of 2), as they cross a runner's shuffle; local ids stay as they are, since the
# shuffle maps them in place (transforms/shuffle/spill.py).
_IDS_CODEC = numcodecs.LZ4(acceleration=1)
# Shard records hold up to two chunks' worth of fragments per array.
_RECORD_CODEC = numcodecs.Zstd(level=1)


def key_of(value) -> str:
    """A key: 128 bits of sha256 over the canonical JSON of `value`."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def place_name(place: int) -> str:
    return f"{place:016x}"


def whole_units(names) -> dict:
    """Trusted unit key -> its account's name, from the area's names (relative to it): a unit
    is trusted once its account and every batch the account counts (ids and documents) are
    there. An account alone proves nothing: the reader writes it once it has read the unit
    (transforms/read/staged_reads.py), which can be before the unit's last batch is staged
    (its ids are written behind: transforms/tokenize/staged.py)."""
    batches = {}  # unit -> {place: set of suffixes}
    accounts = {}  # unit -> (n, name)
    for rel in names:
        parts = rel.split("/")
        if len(parts) != 3 or parts[0] != UNITS:
            continue
        unit, name = parts[1], parts[2]
        stem, _, suffix = name.partition(".")
        if stem == "unit" and name.endswith(".json") and name.count(".") == 2:
            n = name.split(".")[1]
            if n.isdigit():
                accounts[unit] = (int(n), name)
        elif "." + suffix in (IDS, BATCH, SIGNATURES):
            batches.setdefault(unit, {}).setdefault(stem, set()).add("." + suffix)
    # A batch's signatures file, when its `.batch` names one, is checked with it (check_batch).
    return {unit: name for unit, (n, name) in accounts.items()
            if sum(1 for suffixes in batches.get(unit, {}).values() if {IDS, BATCH} <= suffixes) == n}


@dataclass
class Staged:
    """What the staging area holds, as its names say (one listing)."""

    units: dict = field(default_factory=dict)  # trusted unit key -> its account's name
    shards: dict = field(default_factory=dict)  # job key -> {(split, shard): (chunks, record name)}
    chunks: dict = field(default_factory=dict)  # job key -> {(split, array, index)}
    arrays_key: str | None = None  # the job key arrays.json names
    # name -> its listing entry, where the store lists checksums (GCS: size and CRC-32C)
    entries: dict = field(default_factory=dict)


@dataclass
class Documents:
    """What put_batch stages of a batch besides its ids (batch_documents)."""

    header: dict
    arrays: dict


class StagingArea:
    """The staging folder of one output, and the keys of this job's units: plain data, so it
    pickles into every DoFn that reads or writes staged work."""

    def __init__(self, output: str, storage_options: dict | None = None, job_key: str = "",
                 unit_keys: dict | None = None):
        self.local = is_local(output)
        if self.local:
            output = os.path.abspath(os.path.expanduser(output.removeprefix("file://")))
        self.output = output
        self.url = output.rstrip("/") + "/" + FOLDER
        self.storage_options = dict(storage_options or {})
        self.job_key = job_key
        # file key -> (sorted unit starts, their keys): the unit holding a place
        self.unit_keys = unit_keys or {}
        self._fs = None

    def __getstate__(self):
        return {**self.__dict__, "_fs": None}

    @property
    def fs(self):
        if self._fs is None:
            self._fs = url_to_fs(self.url, **self.storage_options)[0]
        return self._fs

    def path(self, *parts: str) -> str:
        return "/".join((self.url, *parts))

    def unit_of(self, file_key: str, place: int) -> str:
        """The key of the unit whose documents start at or before `place` of the file."""
        starts, keys = self.unit_keys[file_key]
        return keys[bisect.bisect_right(starts, place) - 1]

    # -- writing ---------------------------------------------------------------------------

    def put(self, relative: str, data, lease=None) -> str:
        """Writes `data` (bytes or a buffer) whole at `relative`; returns the object's path.
        In a write's `lease` (transforms/write/ownership.py: shard records, chunk marks, the
        arrays' mark), create-only, as the chunks they describe (transforms/create_only.py)."""
        path = self.path(relative)
        if lease is not None:
            create_only.put_new(self.fs, path, data, lease.ledger)
            return path
        if not self.local:
            self.fs.pipe_file(path, bytes(data))
            return path
        for attempt in range(3):
            temporary = f"{path}.{uuid.uuid4().hex}{TEMPORARY}"
            try:
                # Inside the try: the area can go between making a folder and its subfolder.
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(temporary, "wb") as f:
                    f.write(data)
                os.replace(temporary, path)
                return path
            except FileNotFoundError:
                # A folder went while this was written: another run on this output committed
                # and removed the area. Write it again (this run stops at its claim anyway).
                if attempt == 2:
                    raise
            except OSError as e:  # a full disk: say which file (a write's error names none), and leave no part of it
                if os.path.exists(temporary):
                    os.unlink(temporary)
                raise OSError(e.errno, e.strerror, path) from None
        return path

    def put_batch_ids(self, unit: str, place: int, ids: np.ndarray) -> Sum:
        """Stages a batch's ids (batch_ids_path says where, for the shuffle to map them), as
        they are: returns the Sum of what was stored, for put_batch to seal into the `.batch`."""
        ids = np.ascontiguousarray(ids)
        data = ids if self.local else _IDS_CODEC.encode(ids)
        self.put(self._batch_ids(unit, place), data.data if self.local else data)
        return Sum.of(data)

    def batch_ids_path(self, unit: str, place: int) -> str | None:
        """Where put_batch_ids puts a batch's ids when the area is on local disk, else None."""
        return self.path(self._batch_ids(unit, place)) if self.local else None

    @staticmethod
    def _batch_ids(unit: str, place: int) -> str:
        return f"{UNITS}/{unit}/{place_name(place)}{IDS}"

    def put_batch_signatures(self, unit: str, place: int, signatures: np.ndarray) -> Sum:
        """Stages a batch's near signatures beside it, as they are (local areas: near dedup's
        node parts name the file, batch_signatures_path, rather than write them once more):
        returns the Sum of what was stored, for put_batch to seal into the `.batch`."""
        signatures = np.ascontiguousarray(signatures, dtype=np.uint16)
        self.put(self._batch_signatures(unit, place), signatures.data)
        return Sum.of(signatures)

    def batch_signatures_path(self, unit: str, place: int) -> str:
        """Where put_batch_signatures puts a batch's signatures (a local area's)."""
        return self.path(self._batch_signatures(unit, place))

    @staticmethod
    def _batch_signatures(unit: str, place: int) -> str:
        return f"{UNITS}/{unit}/{place_name(place)}{SIGNATURES}"

    def batch_documents(self, batch: TokenizedBatch, signatures_beside: bool = False) -> Documents:
        """What put_batch stages of a batch: everything but its ids (a few bytes per document),
        and but its signatures when they are `signatures_beside` it (put_batch_signatures)."""
        header = {"file_key": batch.file_key, "split": batch.split, "empty": int(batch.empty),
                  "ids_dtype": batch.ids.dtype.name, "ids": int(batch.ids.size), "local": self.local}
        arrays = {"offsets": batch.offsets, "lengths": batch.lengths}
        if batch.digests is not None:
            arrays["digests"] = batch.digests
        if batch.signatures is not None and signatures_beside:
            header["signatures_shape"] = list(batch.signatures.shape)
        elif batch.signatures is not None:
            arrays["signatures"] = batch.signatures
        if batch.defects is not None:
            arrays["defects"] = batch.defects
        return Documents(header, arrays)

    def put_batch(self, unit: str, place: int, documents: Documents, ids: Sum, signatures: Sum | None = None) -> None:
        """Stages a batch's documents (batch_documents), with the Sum of its ids (staged
        already: put_batch_ids) and of its signatures when they are beside it, sealed: the
        batch counts from here."""
        header = {**documents.header, "ids_sum": Sum(*ids).to_json()}
        if signatures is not None:
            header["signatures_sum"] = Sum(*signatures).to_json()
        self.put(f"{UNITS}/{unit}/{place_name(place)}{BATCH}", seal(_npz(header, documents.arrays)))

    def put_unit(self, unit: str, account: dict) -> None:
        """Stages a unit's account, after its last batch was emitted: the unit counts once every
        batch it names is staged."""
        name = f"unit.{len(account['places'])}.json"
        self.put(f"{UNITS}/{unit}/{name}", seal(json.dumps({"format": FORMAT, "unit": unit, **account}).encode()))

    def put_shard(self, split: str, shard: int, record: dict, fragments: list, lease=None) -> None:
        """Stages a written shard: `record` (its size, receipts, and `objects`: the chunk
        objects it wrote with their Sums, [[key under the split, size, crc32c]]), and its
        fragments [((split, array, index), (start, values))]; in the write's `lease`."""
        header = {**record, "fragments": [[key[1], key[2], int(start)] for key, (start, _) in fragments]}
        arrays = {f"f{i}": np.asarray(values) for i, (_, (_, values)) in enumerate(fragments)}
        chunks = sum(n for _, n in record["receipts"])
        name = f"{SHARDS}/{self.job_key}/{split}.{shard:08d}.{chunks}.rec"
        self.put(name, seal(_RECORD_CODEC.encode(_npz(header, arrays))), lease)

    def put_chunk(self, split: str, array: str, index: int, objects: list, lease=None) -> None:
        """Marks a shared chunk written: `objects`, [(key under the split, Sum)], what landed;
        in the write's `lease`."""
        value = {"objects": [[key, *Sum(*summed).to_json()] for key, summed in objects]}
        self.put(f"{CHUNKS}/{self.job_key}/{split}.{array}.{index}", seal(json.dumps(value).encode()), lease)

    def put_json(self, name: str, value: dict, lease=None) -> None:
        self.put(name, json.dumps(value, sort_keys=True).encode(), lease)

    def mark_arrays(self, lease=None) -> None:
        """The arrays were just created for this job: its records count from here."""
        self.put_json(ARRAYS, {"job_key": self.job_key}, lease)

    def arrays_key(self) -> str | None:
        """The job key whose chunks the arrays hold, or None."""
        return (self.read_json(ARRAYS) or {}).get("job_key")

    # -- reading ---------------------------------------------------------------------------

    def _sealed(self, *parts: str) -> memoryview:
        """The checked payload of a sealed object; Damaged (naming it) when it is not whole."""
        path = self.path(*parts)
        name = f"staged file {path}"
        # Read again while its checksum fails (a body cut short in transit): only bytes wrong on a
        # fresh read are damaged (flat_tokens/format/storage_faults.py).
        return unseal(storage_faults.cat_file(self.fs, path, name, storage_faults.judged_by(lambda d: unseal(d, name))),
                      name)

    def read_unit(self, unit: str, name: str) -> dict:
        """A unit's account, checked: Damaged when it is not the one written."""
        path = self.path(UNITS, unit, name)
        try:
            account = json.loads(bytes(self._sealed(UNITS, unit, name)))
        except ValueError as e:  # Damaged, or a sealed payload that is not JSON
            raise e if isinstance(e, Damaged) else Damaged(f"staged file {path}: damaged: {e}") from None
        if not isinstance(account, dict) or account.get("format") != FORMAT or account.get("unit") != unit:
            raise Damaged(f"staged file {path}: not this version's account of this unit")
        return account

    def _batch_header(self, unit: str, place: int) -> tuple[dict, dict]:
        base = self.path(UNITS, unit, place_name(place))
        payload = self._sealed(UNITS, unit, place_name(place) + BATCH)
        try:
            header, arrays = _unnpz(payload)
            Sum.from_json(header["ids_sum"])
            return header, arrays
        except (ValueError, KeyError, TypeError, OSError) as e:  # sealed, but not what put_batch seals
            raise Damaged(f"staged file {base}{BATCH}: damaged: {type(e).__name__}: {e}") from None

    def check_batch(self, unit: str, place: int, entries: dict | None = None) -> None:
        """Checks a staged batch without keeping it: its `.batch` (sealed), and its ids against
        the Sum sealed there (from the listing `entries` where it gives their CRC-32C, else by
        reading them). Damaged, naming the file, when either is not what was written."""
        header, _ = self._batch_header(unit, place)
        for suffix, sealed in ((IDS, "ids_sum"), (SIGNATURES, "signatures_sum")):
            if sealed not in header:  # signatures beside the batch: --dedup near, a local area
                continue
            rel = f"{UNITS}/{unit}/{place_name(place)}{suffix}"
            why = stored_problem(self.fs, self.path(rel), Sum.from_json(header[sealed]), (entries or {}).get(rel))
            if why:
                raise Damaged(f"staged file {self.path(rel)}: damaged: {why}")

    def read_batch(self, unit: str, place: int) -> TokenizedBatch:
        """A staged batch, as it was tokenized, checked against the sums sealed with it; locally
        its ids are mapped from their file. Damaged, naming the file, when it is not whole."""
        base = self.path(UNITS, unit, place_name(place))
        header, arrays = self._batch_header(unit, place)
        dtype, n = np.dtype(header["ids_dtype"]), header["ids"]
        want = Sum.from_json(header["ids_sum"])
        if header["local"]:
            ids_file = LocalFile(base + IDS, want)
            try:
                ids = mapped(ids_file, dtype, n, kind="staged file")  # checked against `want`
            except RuntimeError as e:  # a Sum of another size than its documents need
                raise Damaged(f"staged file {base}{IDS}: damaged: {e}") from None
        else:
            stored = storage_faults.cat_file(self.fs, base + IDS, f"staged file {base}{IDS}",
                                             lambda data: None if Sum.of(data) == want else "its checksum differs")
            _as_written(base + IDS, Sum.of(stored), want)
            ids_file = None
            ids = np.frombuffer(_IDS_CODEC.decode(stored), dtype=dtype)
        if ids.size != n:
            raise Damaged(f"staged file {base}{IDS}: holds {ids.size} ids, its documents need {n}")
        signatures, signatures_file = arrays.get("signatures"), None
        if "signatures_sum" in header:  # beside the batch, in a local area
            signatures_file, signatures = self._signatures_beside(base + SIGNATURES, header)
            if signatures.shape[0] != arrays["offsets"].size:  # a shape that is not its documents'
                raise Damaged(f"staged file {signatures_file.path}: holds {signatures.shape[0]} signatures, its "
                              f"documents need {arrays['offsets'].size}")
        return TokenizedBatch(header["file_key"], header["split"], arrays["offsets"], arrays["lengths"], ids,
                              header["empty"], arrays.get("digests"), signatures, ids_file=ids_file,
                              defects=arrays.get("defects"), signatures_file=signatures_file)

    @staticmethod
    def _signatures_beside(path: str, header: dict) -> tuple[LocalFile, np.ndarray]:
        """A batch's staged signatures file, and its signatures mapped and checked against the
        Sum sealed with them."""
        try:
            rows, hashes = (int(x) for x in header["signatures_shape"])
            file = LocalFile(path, Sum.from_json(header["signatures_sum"]))
            return file, mapped(file, "uint16", rows * hashes, kind="staged file").reshape(rows, hashes)
        except Damaged:
            raise
        except (RuntimeError, KeyError, TypeError, ValueError) as e:  # another size; a header not put_batch's
            raise Damaged(f"staged file {path}: damaged: {e}") from None

    def read_shard(self, job_key: str, name: str) -> tuple[dict, list]:
        """A shard record, checked: (header, fragments as [((split, array, index), (start,
        values))]). Damaged, naming the file, when it is not the one written."""
        try:
            header, arrays = _unnpz(_RECORD_CODEC.decode(self._sealed(SHARDS, job_key, name)))
        except Damaged:
            raise
        except (ValueError, KeyError, RuntimeError) as e:  # sealed, but not what put_shard wrote
            raise Damaged(f"staged file {self.path(SHARDS, job_key, name)}: damaged: {type(e).__name__}: {e}") from None
        fragments = [((header["split"], array, index), (start, arrays[f"f{i}"]))
                     for i, (array, index, start) in enumerate(header["fragments"])]
        return header, fragments

    def read_chunk_mark(self, job_key: str, split: str, array: str, index: int) -> list[tuple[str, Sum]]:
        """The chunk objects a shared chunk's mark vouches for: [(key under the split, Sum)].
        Damaged when the mark is not the one written."""
        path = self.path(CHUNKS, job_key, f"{split}.{array}.{index}")
        try:
            value = json.loads(bytes(self._sealed(CHUNKS, job_key, f"{split}.{array}.{index}")))
            return [(key, Sum(int(size), int(crc))) for key, size, crc in value["objects"]]
        except Damaged:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise Damaged(f"staged file {path}: damaged: {type(e).__name__}: {e}") from None

    def read_json(self, name: str) -> dict | None:
        try:
            value = storage_faults.read_json(self.fs, self.path(name))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, ValueError,
                UnicodeDecodeError):  # absent, or --output is not a directory
            return None
        return value if isinstance(value, dict) else None

    def listing(self) -> Staged:
        """What the area holds, from one listing of its names."""
        entries = self._entries()
        names = list(entries)
        staged = Staged(units=whole_units(names), entries={k: v for k, v in entries.items() if v})
        for rel in names:
            parts = rel.split("/")
            if len(parts) == 3 and parts[0] == SHARDS:
                fields = parts[2].split(".")
                if len(fields) == 4 and fields[3] == "rec" and fields[1].isdigit() and fields[2].isdigit():
                    staged.shards.setdefault(parts[1], {})[fields[0], int(fields[1])] = (int(fields[2]), parts[2])
            elif len(parts) == 3 and parts[0] == CHUNKS:
                fields = parts[2].split(".")
                if len(fields) == 3 and fields[2].isdigit():
                    staged.chunks.setdefault(parts[1], set()).add((fields[0], fields[1], int(fields[2])))
        if ARRAYS in names:
            staged.arrays_key = self.arrays_key()
        return staged

    def _entries(self) -> dict:
        """Every object's name under the area, relative to it (temporary files left out), with
        its listing entry on an object store (GCS lists each object's size and CRC-32C: the
        checks before reuse then read nothing), None locally."""
        if self.local:
            out = {}
            for root, _, files in os.walk(self.url):
                rel = os.path.relpath(root, self.url)
                out.update((name if rel == "." else f"{rel}/{name}", None)
                           for name in files if not name.endswith((TEMPORARY, create_only.PARTIAL)))
            return out
        fs = self.fs
        fs.invalidate_cache(self.url)
        try:
            found = fs.find(self.url, withdirs=False, detail=True)
        except FileNotFoundError:
            return {}
        root = url_to_fs(self.url, **self.storage_options)[1].rstrip("/") + "/"
        return {p[len(root):]: info for p, info in found.items()
                if p.startswith(root) and not p.endswith((TEMPORARY, create_only.PARTIAL))}

    # -- removing --------------------------------------------------------------------------

    def forget_arrays(self) -> None:
        """Before the arrays are deleted or replaced: their chunks stop counting (the marker goes
        first), then every shard record and chunk marker goes."""
        self._remove(ARRAYS)
        for folder in (SHARDS, CHUNKS):
            self._remove(folder)

    def forget_unit(self, unit: str) -> None:
        """A staged unit whose input changed since it was read (pipeline/resume.py): read again."""
        self._remove(f"{UNITS}/{unit}")

    def remove(self) -> None:
        """The whole area (the commit, --restart)."""
        self._remove("")

    def _remove(self, relative: str) -> None:
        path = self.path(relative) if relative else self.url
        if self.local:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.remove(path)
            return
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(self.url)


def _as_written(path: str, got: Sum, want: Sum) -> None:
    """Damaged, naming the staged file at `path`, when what it holds is not what was written."""
    if got != want:
        raise Damaged(f"staged file {path}: damaged: {got.size} bytes of CRC-32C {got.crc32c:08x}, "
                      f"{want.size} bytes of CRC-32C {want.crc32c:08x} were written")


def _npz(header: dict, arrays: dict) -> memoryview:
    out = io.BytesIO()
    np.savez(out, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays)
    return out.getbuffer()  # not a copy: seal copies it once, with its trailer


def _unnpz(data: bytes) -> tuple[dict, dict]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(arrays.pop("header").tobytes()), arrays
