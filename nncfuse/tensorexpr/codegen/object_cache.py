"""The on-disk object-code cache (NNCFUSE_CACHE_DIR): entries that are checked before use.

An entry is one file, `<sha256 of its identity>.o`, written whole to a temporary file in
the same directory and renamed into place, so a reader never sees half of one:

    offset  size  field
    0       8     MAGIC
    8       4     FORMAT, little-endian
    12      8     payload length
    20      32    sha256 of the payload
    52      4     identity length
    56      n     identity: UTF-8 text naming what the code was built for (the LLVM and
                  llvmlite versions, nncfuse's VERSION, the host CPU and its features,
                  the digest of the IR text), one `name=value` per line
    56 + n        payload: the object code

`load` checks every field (and the file name against the identity) before returning the
payload, because LLVM trusts object files: a truncated, garbled or swapped one crashed the
process inside `ObjectFileRef.from_data`, and every later process with it. A bad entry is
logged, removed and reported as a miss; the caller compiles and stores it again.

Faults never stop fusion: a read that fails is a miss; a directory that cannot be written
(under a regular file, read-only, disk full) warns once per process and directory, and
code stays in the caller's in-memory cache. The directory is capped
(NNCFUSE_CACHE_MAX_MB, default 512): a hit touches its entry, and a write that takes the
total over the cap deletes the least recently used entries down to 90% of it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import threading
import time
import warnings

from ... import log

_log = log.get_logger(__file__)

CACHE_ENV = "NNCFUSE_CACHE_DIR"
MAX_MB_ENV = "NNCFUSE_CACHE_MAX_MB"
DEFAULT_MAX_MB = 512.0
#: After a write takes the directory over its cap, eviction stops at this fraction of it,
#: so that the next few writes do not each scan and evict again.
EVICT_TO = 0.9
#: Temporary files older than this are left by a process that died mid-write: eviction
#: deletes them (younger ones may be another process's write in progress).
STALE_TMP_SECONDS = 3600.0

MAGIC = b"NNCFOBJ\n"
FORMAT = 1
SUFFIX = ".o"
TMP_SUFFIX = ".tmp"
_HEADER = struct.Struct("<8sIQ32sI")

#: Directories this process failed to write: warned about once, not written again.
_unwritable: set[str] = set()
_lock = threading.Lock()


def directory() -> str | None:
    """The cache directory NNCFUSE_CACHE_DIR names, or None (no disk cache)."""
    return os.environ.get(CACHE_ENV) or None


def max_bytes() -> int | None:
    """The directory's cap in bytes from NNCFUSE_CACHE_MAX_MB; None when it is 0 (no cap)."""
    text = os.environ.get(MAX_MB_ENV, "").strip()
    megabytes = DEFAULT_MAX_MB
    if text:
        try:
            megabytes = float(text)
        except ValueError:
            _log.dump(f"{MAX_MB_ENV}={text!r} is not a number: using {DEFAULT_MAX_MB:g}")
        else:
            if megabytes <= 0:
                return None
    return int(megabytes * 2**20)


def entry_name(identity: str) -> str:
    """The file name of the entry built for `identity`."""
    return hashlib.sha256(identity.encode()).hexdigest() + SUFFIX


def entry_path(identity: str) -> str | None:
    """Where the entry built for `identity` lives, or None (no disk cache)."""
    root = directory()
    return None if root is None else os.path.join(root, entry_name(identity))


def encode(identity: str, payload: bytes) -> bytes:
    """An entry's bytes: the header, then `payload`."""
    ident = identity.encode()
    digest = hashlib.sha256(payload).digest()
    return _HEADER.pack(MAGIC, FORMAT, len(payload), digest, len(ident)) + ident + payload


class BadEntry(ValueError):
    """An entry's bytes are not a whole, intact entry of this format."""


def decode(data: bytes) -> tuple[str, bytes]:
    """The identity and payload of an entry's bytes; BadEntry says what is wrong."""
    if len(data) < _HEADER.size:
        raise BadEntry(f"{len(data)} bytes, shorter than the header")
    magic, fmt, length, digest, ident_length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadEntry("not an nncfuse cache entry (magic)")
    if fmt != FORMAT:
        raise BadEntry(f"format {fmt}, expected {FORMAT}")
    start = _HEADER.size + ident_length
    if len(data) != start + length:
        raise BadEntry(f"{len(data)} bytes, the header says {start + length}")
    payload = data[start:]
    if hashlib.sha256(payload).digest() != digest:
        raise BadEntry("checksum mismatch")
    try:
        identity = data[_HEADER.size:start].decode()
    except UnicodeDecodeError as e:
        raise BadEntry("identity is not text") from e
    return identity, payload


def load(identity: str) -> bytes | None:
    """The payload cached for `identity`, or None: no cache, no entry, unreadable or bad."""
    path = entry_path(identity)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:  # unreadable: a miss, as if it were not there
        _log.update("Cannot read the cached entry ", path, ": ", e)
        return None
    try:
        found, payload = decode(data)
        if found != identity:  # another key's entry under this name (swapped, copied)
            raise BadEntry("built for another identity")
    except BadEntry as e:
        _log.update("Bad cache entry ", path, " (", e, "): removed, compiling again")
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used: eviction keeps it longer
    except OSError:
        pass
    return payload


def store(identity: str, payload: bytes) -> str | None:
    """Write `payload` for `identity` atomically, then evict down to the cap; the path
    written, or None (no cache, or the directory cannot be written: warned once)."""
    root = directory()
    if root is None or root in _unwritable:
        return None
    path = os.path.join(root, entry_name(identity))
    tmp = None
    try:
        os.makedirs(root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".", suffix=TMP_SUFFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(encode(identity, payload))
        os.replace(tmp, path)  # atomic: concurrent readers see the old file or the new
    except OSError as e:
        if tmp is not None:
            _remove(tmp)
        _unusable(root, e)
        return None
    cap = max_bytes()
    if cap is not None:
        evict(root, cap, keep=path)
    return path


def evict(root: str, cap: int, keep: str | None = None) -> list[str]:
    """If the entries in `root` take more than `cap` bytes, delete the least recently used
    (oldest mtime) until they take at most EVICT_TO of it, sparing `keep`; stale temporary
    files go too. Files other processes delete meanwhile are skipped. The paths deleted."""
    entries: list[tuple[float, int, str]] = []
    stale: list[str] = []
    now = time.time()
    try:
        with os.scandir(root) as it:
            for item in it:
                try:
                    if not item.is_file(follow_symlinks=False):
                        continue
                    st = item.stat(follow_symlinks=False)
                except OSError:  # gone since the listing
                    continue
                if item.name.endswith(SUFFIX):
                    entries.append((st.st_mtime, st.st_size, item.path))
                elif item.name.endswith(TMP_SUFFIX) and now - st.st_mtime > STALE_TMP_SECONDS:
                    stale.append(item.path)
    except OSError as e:
        _log.update("Cannot list the cache ", root, ": ", e)
        return []
    deleted = [path for path in stale if _remove(path)]
    total = sum(size for _, size, _ in entries)
    if total <= cap:
        return deleted
    target = cap * EVICT_TO
    for _, size, path in sorted(entries):
        if total <= target:
            break
        if path == keep:
            continue
        _remove(path)  # gone already (another process evicted it): its bytes are gone too
        total -= size
        deleted.append(path)
    _log.update("Cache over ", cap, " bytes: evicted ", len(deleted), " entries")
    return deleted


def _remove(path: str) -> bool:
    try:
        os.remove(path)
        return True
    except OSError:  # removed by another process, or not ours to remove: nothing to do
        return False


def _unusable(root: str, error: OSError) -> None:
    with _lock:
        if root in _unwritable:
            return
        _unwritable.add(root)
    warnings.warn(f"nncfuse: cannot write the object-code cache {CACHE_ENV}={root!r} "
                  f"({error}); compiled code is kept in memory for this process only",
                  stacklevel=2)


def forget_unwritable() -> None:
    """Try again to write directories that failed before (for tests)."""
    with _lock:
        _unwritable.clear()
