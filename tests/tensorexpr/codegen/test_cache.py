"""NNCFUSE_CACHE_DIR: a second process loads object code instead of compiling it."""

import os
import subprocess
import sys

PROGRAM = """
import torch, nncfuse
def f(a, b):
    return torch.sigmoid(a * b) + torch.cos(b)
g = nncfuse.jit(f)
a, b = torch.randn(1000), torch.randn(1000)
g(a, b)
torch.testing.assert_close(g(a, b), f(a, b))
print("ok")
"""


def run(cache_dir, tmp_path):
    env = {**os.environ, "NNCFUSE_CACHE_DIR": str(cache_dir), "NNCFUSE_LOG_LEVEL": ">llvm_jit"}
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    return done.stderr


def test_second_process_loads_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = run(cache, tmp_path)
    assert "Object code cached" in first and "from the cache" not in first
    assert len(list(cache.glob("*.o"))) == 1
    second = run(cache, tmp_path)
    assert "Object code from the cache" in second and "cached:" not in second
