"""The same program compiles to the same bytes in every process (the disk cache's key).

Buffers hash by identity, so a set of them iterates in an order that follows object
addresses, which move with PYTHONHASHSEED and whatever the process allocated before: the
order of Allocates (insert_allocations) and which temporary lives in an output's memory
(reuse_outputs) came out differently in two processes, and the cache missed.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: layer_norm, gelu, softmax and a second layer_norm: several temporaries in one kernel.
#: argv[1] objects are allocated first, so that the two processes' buffers sit elsewhere.
PROGRAM = """
import hashlib, sys, torch, nncfuse
import torch.nn.functional as F
from nncfuse.jit.fuser.runtime import kernel_of
padding = [[object()] * k for k in range(int(sys.argv[1]))]
def block(x, w, b, w2, b2):
    y = F.layer_norm(x, (x.shape[-1],), w, b)
    z = y * 0.5 * (1 + torch.erf(y * 0.7071067811865476))
    s = torch.softmax(z * 2.0, -1)
    t = F.layer_norm(s + x, (x.shape[-1],), w2, b2)
    return torch.tanh(t) * z + s, t.sum(-1)
args = [torch.randn(64, 256)] + [torch.randn(256) for _ in range(4)]
g = nncfuse.jit(block)
g(*args)
torch.testing.assert_close(g(*args), block(*args))
for group in nncfuse.fusion_groups(g.graph_for(*args)):
    k = kernel_of(group)
    print("kernel", k.name, hashlib.sha256(k.jit.ir_text.encode()).hexdigest())
    print(k.stmt)
"""


def run(tmp_path, seed, padding):
    env = {**os.environ, "NNCFUSE_CACHE_DIR": str(tmp_path / "cache"),
           "NNCFUSE_LOG_LEVEL": ">llvm_jit", "PYTHONHASHSEED": str(seed),
           "PYTHONPATH": str(ROOT)}  # the child imports this checkout
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(script), str(padding)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_two_processes_give_byte_identical_ir_and_hit_the_cache(tmp_path):
    first, log = run(tmp_path, 0, 0)
    kernels = first.count("kernel ")
    assert kernels >= 1 and "Allocate(" in first  # temporaries: the case that varied
    assert log.count("Object code cached: ") == kernels and "from the cache" not in log
    for seed, padding in [(1, 37), (2, 1000)]:
        again, log = run(tmp_path, seed, padding)
        assert again == first  # Final Stmts and the IR's hash, kernel by kernel
        assert log.count("Object code from the cache: ") == kernels, log
        assert "cached: " not in log, log
