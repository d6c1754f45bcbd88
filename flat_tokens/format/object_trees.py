"""Deleting and sizing a directory of many objects in bounded memory.

A dataset holds one object per chunk: ~890,000 for 1 TB of text with the default chunks,
more with smaller ones. gcsfs lists a whole tree before it deletes or sizes it, and keeps
~3.5 KB per object while it does (measured with the GCS emulator: 72 MB for 20,000
objects), so replacing a 1 TB dataset with --overwrite would take ~3 GB on the worker
that runs CreateOutput, and the launcher's summary as much (docs/design.md, "1 TB of
text"). On GCS these functions list one page of names (at most 1,000) at a time; a local
directory is walked entry by entry. Other filesystems use fsspec's own calls.
"""
import os

PAGE = 1000  # objects per listing page: GCS's maximum


def _is_gcs(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("gs", "gcs")


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def identity(fs, path: str) -> tuple | None:
    """What tells this object from another at the same path, or None when there is none."""
    if _is_local(fs):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    if info.get("type") == "directory":
        return None
    generation = info.get("generation")
    return ("generation", str(generation)) if generation else ("etag", str(info.get("etag") or info.get("ETag")),
                                                                 info.get("size"))


def _gcs_pages(fs, path: str, fields: str, page: int = PAGE):
    """Yields the pages of a GCS listing under directory `path`: lists of (at most `page`)
    object resources with only `fields` (e.g. "name", "size"), in name order."""
    bucket, key, _ = fs.split_path(path)
    prefix = key.rstrip("/") + "/" if key else ""
    token = None
    while True:
        listed = fs.call("GET", "b/{}/o", bucket, json_out=True, prefix=prefix, maxResults=page,
                         pageToken=token, fields=f"items({fields}),nextPageToken")
        items = listed.get("items", [])
        if items:
            yield bucket, items
        token = listed.get("nextPageToken")
        if not token:
            return


def is_gcs(fs) -> bool:
    return _is_gcs(fs)


def gcs_entries(fs, path: str, fields: str = "name,size,crc32c", page: int = PAGE):
    """Yields (object path as gcsfs names it, its resource with only `fields`) for every object
    under directory `path` on GCS, one page at a time: sizes and CRC-32Cs without a read."""
    for bucket, items in _gcs_pages(fs, path, fields, page):
        for item in items:
            yield f"{bucket}/{item['name']}", item


def walk_tree(fs, path: str, page: int = PAGE, identities: bool = False):
    """Yields what is under directory `path` as pages (lists of at most about `page`) of
    (path relative to it, is a directory), a directory always before what it holds. Nothing
    when `path` does not exist. GCS has no directories: each object's parent prefixes are
    yielded as directories the first time one of them is seen (their number is small: a
    split holds an array's `c/` and little else). With `identities`, each entry also holds
    the object's identity as listed (transforms/create_only.py; None for a directory), so
    that it can be deleted only while it is still that object."""
    if identities:
        yield from _walk_with_identities(fs, path, page)
        return
    if _is_gcs(fs):
        seen = set()
        for bucket, items in _gcs_pages(fs, path, "name", page):
            entries = []
            for item in items:
                relative = item["name"][len(fs.split_path(path)[1].rstrip("/")) + 1:]
                parts = relative.rstrip("/").split("/")
                for depth in range(1, len(parts)):
                    directory = "/".join(parts[:depth])
                    if directory not in seen:
                        seen.add(directory)
                        entries.append((directory, True))
                if relative.endswith("/"):  # a directory placeholder object
                    if relative.rstrip("/") not in seen:
                        seen.add(relative.rstrip("/"))
                        entries.append((relative.rstrip("/"), True))
                else:
                    entries.append((relative, False))
            yield entries
        return
    if _is_local(fs):
        yield from _local_pages(path, page)
        return
    try:
        found = fs.find(path, withdirs=True, detail=True)
    except FileNotFoundError:
        return
    entries = sorted((p.rstrip("/")[len(path.rstrip("/")) + 1:], info.get("type") == "directory")
                     for p, info in found.items() if p.rstrip("/").startswith(path.rstrip("/") + "/"))
    for i in range(0, len(entries), page):
        yield entries[i:i + page]


def _walk_with_identities(fs, path: str, page: int):
    if _is_gcs(fs):
        base = len(fs.split_path(path)[1].rstrip("/")) + 1
        seen = set()
        for _, items in _gcs_pages(fs, path, "name,generation", page):
            entries = []
            for item in items:
                relative = item["name"][base:]
                parts = relative.rstrip("/").split("/")
                for depth in range(1, len(parts) + relative.endswith("/")):
                    directory = "/".join(parts[:depth])
                    if directory not in seen:
                        seen.add(directory)
                        entries.append((directory, True, None))
                if not relative.endswith("/"):
                    entries.append((relative, False, ("generation", str(item.get("generation")))))
            yield entries
        return
    for entries in walk_tree(fs, path, page):
        yield [(relative, is_dir, None if is_dir else identity(fs, f"{path.rstrip('/')}/{relative}"))
               for relative, is_dir in entries]


def _local_pages(path: str, page: int):
    pending, entries = [""], []
    while pending:
        relative = pending.pop()
        try:
            with os.scandir(os.path.join(path, relative)) as listed:
                for entry in listed:
                    name = f"{relative}/{entry.name}" if relative else entry.name
                    is_dir = entry.is_dir(follow_symlinks=False)
                    entries.append((name, is_dir))
                    if is_dir:
                        pending.append(name)
                    if len(entries) >= page:
                        yield entries
                        entries = []
        except FileNotFoundError:
            if relative:  # removed while listed: nothing of it to see
                continue
            return
    if entries:
        yield entries


def remove_tree(fs, path: str, page: int = PAGE) -> None:
    """Deletes directory `path` and everything under it; FileNotFoundError when it holds nothing."""
    if not _is_gcs(fs):
        fs.rm(path, recursive=True)
        return
    removed = 0
    for bucket, items in _gcs_pages(fs, path, "name", page):
        names = [f"{bucket}/{item['name']}" for item in items]
        try:
            fs.rm(names)
        except FileNotFoundError:  # another attempt of this step deleted them already
            pass
        removed += len(names)
    fs.invalidate_cache(path)
    if not removed:
        raise FileNotFoundError(path)


def tree_size(fs, path: str, page: int = PAGE) -> int:
    """The bytes of every file under `path` (or of `path`, a file)."""
    if _is_local(fs):
        return _local_size(path)
    if not _is_gcs(fs) or not fs.isdir(path):
        return int(fs.du(path))
    return sum(int(item.get("size", 0)) for _, items in _gcs_pages(fs, path, "size", page) for item in items)


def _local_size(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    total, pending = 0, [path]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total
