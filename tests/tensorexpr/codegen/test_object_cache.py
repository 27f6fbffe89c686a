"""The disk cache cannot hurt: damaged entries are replaced, an unwritable directory warns
once and fusion goes on, the directory stays under its cap, and processes share it.

The end-to-end cases run fresh processes (a damaged entry used to crash LLVM inside one);
the entry format, the checks and eviction are tested in this process.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nncfuse.tensorexpr.codegen import object_cache
from nncfuse.tensorexpr.codegen.object_cache import BadEntry, decode, encode, entry_name

ROOT = Path(__file__).resolve().parents[3]
LOG = ">llvm_jit:>object_cache"
WARNING = "nncfuse: cannot write the object-code cache"

#: Kernels by name (argv), each called 3 times and compared with eager; every one must fuse.
#: k<i> differ only in a constant: distinct IR, entries of the same size.
PROGRAM = """
import sys, torch, nncfuse
def f(a, b):
    return (a * b).sin() + b
def h(x):
    return torch.tanh(x) * 2 + x
{kernels}
CALLS = {{"f": (f, 2), "h": (h, 1), {calls}}}
for name in sys.argv[1:]:
    fn, arity = CALLS[name]
    args = [torch.randn(64) for _ in range(arity)]
    g = nncfuse.jit(fn)
    for _ in range(3):
        out = g(*args)
    torch.testing.assert_close(out, fn(*args))
    assert nncfuse.fusion_groups(g.graph_for(*args)), name
print("ok")
""".format(
    kernels="\n".join(f"def k{i}(x):\n    return torch.cos(x) * {i} - x" for i in range(8)),
    calls=", ".join(f'"k{i}": (k{i}, 1)' for i in range(8)),
)


def _command(tmp_path, cache_dir, names, **env_extra):
    script = tmp_path / "object_cache_program.py"
    if not script.exists():
        script.write_text(PROGRAM)
    # PYTHONPATH and cwd: the child imports this checkout, not whichever nncfuse is installed
    env = {**os.environ, "NNCFUSE_CACHE_DIR": str(cache_dir), "NNCFUSE_LOG_LEVEL": LOG,
           "PYTHONPATH": str(ROOT), **env_extra}
    return [sys.executable, str(script), *names], env


def run(tmp_path, cache_dir, names, **env_extra):
    """Run PROGRAM on `names` in a fresh process; its log (stderr). It must succeed."""
    cmd, env = _command(tmp_path, cache_dir, names, **env_extra)
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def cached_paths(log):
    """The entries a process wrote, in order."""
    prefix = "Object code cached: "
    return [Path(line.split(prefix, 1)[1]) for line in log.splitlines() if prefix in line]


def entries(cache_dir):
    return {p.name: p.read_bytes() for p in Path(cache_dir).glob("*" + object_cache.SUFFIX)}


def assert_intact(cache_dir):
    """Every entry decodes and sits under the name of the identity it carries."""
    for name, data in entries(cache_dir).items():
        identity, _ = decode(data)
        assert entry_name(identity) == name


# -- Damaged entries, in fresh processes ---------------------------------------------------


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A cache with the entries of f and h, which a second process loads."""
    tmp_path = tmp_path_factory.mktemp("seeded")
    cache = tmp_path / "cache"
    first = run(tmp_path, cache, ["f", "h"])
    assert len(cached_paths(first)) == 2
    second = run(tmp_path, cache, ["f", "h"])
    assert second.count("Object code from the cache: ") == 2 and "cached: " not in second
    return entries(cache)


def _truncate_empty(paths):
    for p in paths:
        p.write_bytes(b"")


def _truncate_half(paths):
    for p in paths:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garble(paths):
    for p in paths:
        data = bytearray(p.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 16] = bytes(b ^ 0x5A for b in data[middle:middle + 16])
        p.write_bytes(bytes(data))


def _swap(paths):
    a, b = paths
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)


@pytest.mark.parametrize("damage", [_truncate_empty, _truncate_half, _garble, _swap],
                         ids=["empty", "half", "garbled", "swapped"])
def test_a_damaged_entry_is_replaced_not_trusted(seeded, tmp_path, damage):
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, data in seeded.items():
        (cache / name).write_bytes(data)
    damage(sorted(cache.glob("*.o")))
    log = run(tmp_path, cache, ["f", "h"])  # used to die with SIGSEGV or an LLVM abort
    assert log.count("Bad cache entry") == 2, log
    assert len(cached_paths(log)) == 2 and "from the cache" not in log, log
    assert_intact(cache)
    # Compiling is deterministic (test_deterministic): the rewritten entries are the very
    # bytes `seeded` showed a later process loads.
    assert entries(cache) == seeded


# -- Unwritable directories ----------------------------------------------------------------


def _under_a_file(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    return tmp_path / "file" / "cache"


def _read_only(tmp_path):
    cache = tmp_path / "read-only"
    cache.mkdir()
    cache.chmod(0o555)
    if os.access(cache, os.W_OK):  # root: permissions do not stop writes
        pytest.skip("a read-only directory is writable for this user (root)")
    return cache


@pytest.mark.parametrize("make", [_under_a_file, _read_only], ids=["under-a-file", "read-only"])
def test_an_unwritable_directory_warns_once_and_fusion_goes_on(tmp_path, make):
    cache = make(tmp_path)
    try:
        log = run(tmp_path, cache, ["f", "h", "k0"])  # three kernels, three failed writes
    finally:
        if cache.parent.is_dir():
            cache.parent.chmod(0o755)
        if cache.is_dir():
            cache.chmod(0o755)
    assert log.count(WARNING) == 1, log
    assert str(cache) in log and "cached: " not in log, log


# -- The cap: least recently used entries go -----------------------------------------------


def test_the_directory_stays_under_its_cap_keeping_recently_used_entries(tmp_path):
    cache = tmp_path / "cache"
    first = cached_paths(run(tmp_path, cache, ["k0", "k1", "k2", "k3"]))
    assert len(first) == 4
    now = time.time()
    for age, path in enumerate(reversed(first)):  # k0 oldest; distinct times on any disk
        os.utime(path, (now - 100 - age, now - 100 - age))
    size = max(p.stat().st_size for p in first)
    cap = 3.5 * size  # holds 3 entries; eviction goes down to 90%: 3 entries
    log = run(tmp_path, cache, ["k1", "k4", "k5"],
              NNCFUSE_CACHE_MAX_MB=str(cap / 2**20))
    assert "Object code from the cache" in log  # k1, touched: now the most recent
    k4, k5 = cached_paths(log)
    left = set(cache.glob("*.o"))
    assert left == {first[1], k4, k5}, log
    assert sum(p.stat().st_size for p in left) <= cap


# -- Processes sharing one directory -------------------------------------------------------


def test_two_processes_share_a_directory(tmp_path):
    cache = tmp_path / "cache"
    orders = [["f", "h", "k6", "k7"], ["k7", "k6", "h", "f"]]
    procs = []
    for names in orders:
        cmd, env = _command(tmp_path, cache, names)
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0 and out.strip() == "ok", err
        assert "Bad cache entry" not in err, err  # never half an entry
    assert len(entries(cache)) == 4
    assert_intact(cache)
    assert not list(cache.glob("*.tmp")) and not list(cache.glob(".*.tmp"))


# -- The entry format and eviction, in this process ----------------------------------------

IDENTITY = "llvm=1\nir=abc\n"
PAYLOAD = b"\x7fELF object code" * 8


def test_an_entry_round_trips():
    assert decode(encode(IDENTITY, PAYLOAD)) == (IDENTITY, PAYLOAD)


@pytest.mark.parametrize("cut", [
    lambda d: b"",
    lambda d: d[:10],
    lambda d: d[: len(d) // 2],
    lambda d: d[:-1],
    lambda d: d + b"\0",
    lambda d: b"X" + d[1:],  # magic
    lambda d: d[:8] + b"\x09" + d[9:],  # format
    lambda d: d[:-5] + bytes([d[-5] ^ 1]) + d[-4:],  # payload
    lambda d: d[:30] + bytes([d[30] ^ 1]) + d[31:],  # checksum
], ids=["empty", "short", "half", "less", "more", "magic", "format", "payload", "checksum"])
def test_damage_is_detected(cut):
    with pytest.raises(BadEntry):
        decode(cut(encode(IDENTITY, PAYLOAD)))


def test_load_rejects_and_removes_another_identitys_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(object_cache.CACHE_ENV, str(tmp_path))
    other = "llvm=1\nir=def\n"
    path = tmp_path / entry_name(IDENTITY)
    path.write_bytes(encode(other, PAYLOAD))  # intact, but built for `other`
    assert object_cache.load(IDENTITY) is None and not path.exists()
    assert object_cache.store(IDENTITY, PAYLOAD) == str(path)
    assert object_cache.load(IDENTITY) == PAYLOAD


def test_an_unwritable_directory_warns_once(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(object_cache.CACHE_ENV, str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(object_cache, "_unwritable", set())
    with pytest.warns(UserWarning, match="Not a directory") as caught:
        assert object_cache.store(IDENTITY, PAYLOAD) is None
        assert object_cache.store("ir=other\n", PAYLOAD) is None
        assert object_cache.load(IDENTITY) is None  # the read fails: a miss
    assert len(caught) == 1 and str(tmp_path / "file" / "cache") in str(caught[0].message)


def _entry(root, name, size, age):
    path = root / f"{name}.o"
    path.write_bytes(b"\0" * size)
    t = time.time() - age
    os.utime(path, (t, t))
    return path


def test_eviction_deletes_the_least_recently_used_down_to_90_percent(tmp_path):
    paths = [_entry(tmp_path, f"e{i}", 100, age=100 - i) for i in range(10)]  # e0 oldest
    stale = tmp_path / ".x.tmp"
    stale.write_bytes(b"\0" * 50)
    os.utime(stale, (0, 0))
    fresh = tmp_path / ".y.tmp"  # another process's write in progress
    fresh.write_bytes(b"")
    deleted = object_cache.evict(str(tmp_path), cap=800, keep=str(paths[0]))
    assert str(stale) in deleted and fresh.exists()
    left = sorted(p.name for p in tmp_path.glob("*.o"))
    assert left == ["e0.o", "e4.o", "e5.o", "e6.o", "e7.o", "e8.o", "e9.o"]  # 700 <= 720


def test_eviction_tolerates_entries_vanishing(tmp_path, monkeypatch):
    """Another process evicting the same files: each is gone by the time we remove it."""
    for i in range(10):
        _entry(tmp_path, f"e{i}", 100, age=100 - i)
    real_remove = os.remove

    def raced(path):
        real_remove(path)
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "remove", raced)
    object_cache.evict(str(tmp_path), cap=500)
    assert len(list(tmp_path.glob("*.o"))) == 4


def test_the_cap_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(object_cache.MAX_MB_ENV, raising=False)
    assert object_cache.max_bytes() == 512 * 2**20
    monkeypatch.setenv(object_cache.MAX_MB_ENV, "0.5")
    assert object_cache.max_bytes() == 2**19
    monkeypatch.setenv(object_cache.MAX_MB_ENV, "0")
    assert object_cache.max_bytes() is None
    monkeypatch.setenv(object_cache.MAX_MB_ENV, "lots")
    assert object_cache.max_bytes() == 512 * 2**20
