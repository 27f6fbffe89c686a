"""The README's python blocks run, top to bottom, in one namespace.

They are written to a file and run in a fresh interpreter: TorchScript scripts a function
from its source file, so the blocks cannot be `exec`uted from a string. Blocks that need
optional packages (transformers) are fenced as `text`, not `python`.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fences of `text`, in order (indented fences too)."""
    blocks = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.M | re.S):
        indent = len(m.group(1))
        blocks.append("".join(line[indent:] for line in m.group(2).splitlines(True)))
    return blocks


def test_readme_has_python_blocks():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 5
    assert "import nncfuse" in blocks[0]


def test_readme_python_blocks_run(tmp_path):
    blocks = python_blocks(README.read_text())
    script = tmp_path / "readme_blocks.py"
    script.write_text("\n\n".join(f"# README block {k}\n{b}" for k, b in enumerate(blocks)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name in ("NNCFUSE_LOG_LEVEL", "NNCFUSE_DISABLE", "NNCFUSE_STRICT"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"README blocks failed:\n{result.stdout}\n{result.stderr}"
