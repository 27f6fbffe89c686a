"""The package's import graph: the layers of pyproject.toml's contract hold, every module of a
package of five or more modules is placed in one, and no module imports itself through others
(function-level imports included; type-checking ones aside)."""

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


#: A package of this many modules (subpackages included) or more has its modules placed.
PLACED_FROM = 5


def _packages() -> dict[str, list[str]]:
    """Each package of nncfuse (dotted name) and its modules and subpackages (dotted)."""
    found = {}
    for init in sorted((ROOT / "nncfuse").rglob("__init__.py")):
        folder = init.parent
        name = ".".join(folder.relative_to(ROOT).parts)
        children = [f"{name}.{p.stem}" for p in sorted(folder.glob("*.py"))
                    if p.name != "__init__.py"]
        children += [f"{name}.{d.name}" for d in sorted(folder.iterdir())
                     if (d / "__init__.py").is_file()]
        found[name] = children
    return found


def _placed() -> set[str]:
    """Every module or package some layers contract of pyproject.toml names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = set()
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            for layer in contract["layers"]:
                names |= {m.strip().strip("()") for m in layer.replace(":", "|").split("|")}
    return names


def test_every_module_of_a_large_package_is_placed_in_a_layers_contract():
    placed = _placed()
    packages = {p: c for p, c in _packages().items() if len(c) >= PLACED_FROM}
    assert {"nncfuse", "nncfuse.tensorexpr", "nncfuse.tensorexpr.passes", "nncfuse.fuzz"} <= set(
        packages)
    unplaced = sorted(m for children in packages.values() for m in children if m not in placed)
    assert unplaced == [], "place these in a layers contract of pyproject.toml"


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
