"""The package's import graph: the layers of pyproject.toml's contract hold, and no module
imports itself through others (function-level imports included; type-checking ones aside)."""

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _cycles() -> list[list[str]]:
    graph = grimp.build_graph("nncfuse", exclude_type_checking_imports=True)
    found = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                found.append([module, *back])
    return found


def test_no_import_cycles():
    assert _cycles() == []


@pytest.mark.parametrize("module", ["nncfuse.tensorexpr.expr", "nncfuse.tensorexpr.stmt"])
def test_ir_nodes_print_without_importing_the_printer_first(module):
    code = (f"import importlib; m = importlib.import_module({module!r}); "
            "from nncfuse.tensorexpr import expr as E; print(E.imm(3) + E.Var('i'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "3 + i", done.stderr
