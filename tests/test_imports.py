"""qlinear's import graph: every module imports on its own, no two modules import each other, no module is too long."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "qlinear"
MAX_LINES = 400
# Importing these runs the command line.
_ENTRY_POINTS = {"qlinear.__main__", "qlinear.cli.__main__"}
_TORCH = "qlinear.torch"

# One process imports each module in turn, all of qlinear dropped from sys.modules before each: every module
# then starts from nothing of qlinear, as in a fresh interpreter, while numpy, onnx and torch stay loaded (a
# process per module would take a minute).
_IMPORT_EACH = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "qlinear" or m.startswith("qlinear.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Every module of qlinear by dotted name (a package by its name, its ``__init__.py`` the file)."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The qlinear modules ``name`` imports anywhere in its text (functions included).

    ``import qlinear.a.b`` and ``from qlinear.a.b import f`` depend on
    ``qlinear.a.b``. ``from qlinear.a import b`` depends on ``qlinear.a.b``
    when ``b`` is a module, else on the package ``qlinear.a``: its names are
    what its ``__init__`` re-exports, so that is an edge to the package, and
    the package's own imports are its edges to its modules.

    Python runs ``qlinear/a/__init__.py`` before any ``qlinear.a.b``, but
    that is not an edge from ``qlinear.a.b`` to ``qlinear.a``: a package that
    re-exports its modules, whose modules import each other by their full
    names, is the usual layout and has no cycle. A module that imports a name
    from its own package's ``__init__`` does depend on the package, and the
    package on it: that works only while the ``__init__`` imports in the
    right order, and is reported as the cycle it is.

    Imports under ``if TYPE_CHECKING:`` are left out: they never run, and
    name types for annotations only (``from __future__ import annotations``).
    """
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _run_time(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if source not in modules:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in modules else source)
    out.discard(name)
    return out


def _run_time(tree: ast.AST) -> list[ast.AST]:
    """The nodes of ``tree`` outside ``if TYPE_CHECKING:`` blocks (their ``else`` kept)."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return out


def _graph() -> dict[str, set[str]]:
    return {name: _imported(name, path, MODULES) for name, path in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_imports_graph_has_no_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_cycle_is_found():
    # The check is real: a two-module cycle and one through a package's __init__ are reported.
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"p": {"p._x"}, "p._x": {"p._y"}, "p._y": {"p"}}) == ["p", "p._x", "p._y", "p"]
    assert _cycle({"p": {"p._x", "p._y"}, "p._x": {"p._y"}, "p._y": set()}) is None


def test_imports_from_package_names_resolved(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from p._x import f\n")
    (pkg / "_x.py").write_text("def f():\n    from p import _y\n    from p import g\n")
    (pkg / "_y.py").write_text("from . import _x\nimport p._x\nif TYPE_CHECKING:\n    import p\n")
    modules = {"p": pkg / "__init__.py", "p._x": pkg / "_x.py", "p._y": pkg / "_y.py"}
    assert _imported("p", modules["p"], modules) == {"p._x"}
    assert _imported("p._x", modules["p._x"], modules) == {"p._y", "p"}
    assert _imported("p._y", modules["p._y"], modules) == {"p._x"}


def test_imports_each_module_alone():
    names = [n for n in MODULES if n not in _ENTRY_POINTS]
    if importlib.util.find_spec("torch") is None:
        names = [n for n in names if n != _TORCH and not n.startswith(_TORCH + ".")]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{trace}" for name, trace in failed.items())


def test_imports_modules_short():
    long = {
        path.relative_to(SRC).as_posix(): n for path in MODULES.values() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
