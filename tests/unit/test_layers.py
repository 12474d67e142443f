"""The packages import one way: perfmodel <- workload <- calibration, validation (issue 15, item 4).

The graph is built from every import statement of the sources (module level and inside
functions, as a function-level import runs too), read with ast: nothing is imported. A module
depends on the module it names (`from a.b import c`: a.b.c when that is a module, else a.b).
Checked: no cycle among the modules of a package (a cycle broken by moving an import into a
function is still a cycle here), no import against the arrows: perfmodel imports none of the
others, workload only perfmodel's specs, errors and files, and calibration and validation never
each other; and perfmodel never imports torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("perfmodel", "workload", "calibration", "validation")
ACYCLIC = PACKAGES
# what each package may import of ours (its own modules always)
ALLOWED = {
    "perfmodel": (),
    "workload": ("perfmodel.specs", "perfmodel.errors", "perfmodel.files"),
    "calibration": ("perfmodel", "workload"),
    "validation": ("perfmodel", "workload"),
}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of PACKAGES."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` (source at path) imports anywhere."""
    is_package = path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text())
    # `if TYPE_CHECKING:` imports are for annotations only: no dependency when the code runs
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = name.split(".")
                base = base[: len(base) - node.level + is_package]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
            targets = [t for t in targets[:-1] if t in known] or [module]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a function c: a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the arrows: `importer -> imported`."""
    bad = []
    for importer, targets in sorted(graph.items()):
        package = importer.split(".")[0]
        for target in sorted(targets):
            other = target.split(".")[0]
            allowed = other == package or any(
                target == a or target.startswith(f"{a}.") for a in ALLOWED[package])
            if not allowed:
                bad.append(f"{importer} -> {target}")
    return bad


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycle_within_a_package(graph, package):
    inside = {m: {t for t in ts if t.split(".")[0] == package}
              for m, ts in graph.items() if m.split(".")[0] == package}
    assert cycles(inside) == []


def test_every_import_points_down_the_layers(graph):
    assert upward(graph) == []


def torch_imports(root: Path = ROOT, package: str = "perfmodel") -> list[str]:
    """The modules of `package` that import torch anywhere (module level or in a function)."""
    found = []
    for name, path in module_files(root).items():
        if name.split(".")[0] != package:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                found.append(name)
                break
    return found


def test_perfmodel_never_imports_torch():
    assert torch_imports() == []


def test_a_torch_import_is_found(tmp_path):
    for name, text in {"__init__.py": "", "a.py": "def f():\n    from torch.nn import Linear\n",
                       "b.py": "import numpy, torch.distributed as dist\n", "c.py": "import os\n",
                       "d.py": "from . import torchlike\n"}.items():
        (tmp_path / "perfmodel" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "perfmodel" / name).write_text(text)
    assert torch_imports(tmp_path) == ["perfmodel.a", "perfmodel.b"]


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """A cycle through a function-level or relative import, and an upward import, are found."""
    for package, files in {
        "calibration": {"__init__.py": "", "a.py": "from calibration.b import f\n",
                        "b.py": "def f():\n    from . import a\n"},
        "workload": {"__init__.py": "", "x.py": "from perfmodel.predict import predict\n"
                                                "from perfmodel.specs.model import load_model\n"},
        "perfmodel": {"__init__.py": "", "predict.py": "", "specs/__init__.py": "",
                      "specs/model.py": "def g():\n    import validation.run\n",
                      "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    import calibration.a\n"},
        "validation": {"__init__.py": "", "run.py": "import calibration.a\n"},
    }.items():
        for name, text in files.items():
            (tmp_path / package / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / package / name).write_text(text)
    g = import_graph(tmp_path)
    assert cycles(g) == [["calibration.a", "calibration.b"]]
    assert upward(g) == ["perfmodel.specs.model -> validation.run",
                         "validation.run -> calibration.a", "workload.x -> perfmodel.predict"]
