"""The layering of app/colibri, enforced (style points 10 and 18):

  * the engine binding, the shared values, the generation loop, the CLI, `colibri.inspection`,
    `colibri.debugging`, `colibri.jitter`, `colibri.serving` and `colibri.reference` import no
    Qt (only `colibri.inspector` may);
  * no module imports another module's private name (`from colibri.x import _y`, `x._y`), and
    only the binding imports the compiled extension `colibri._colibri_cffi`;
  * the import graph of app/colibri has no cycle.

Imports are read from the source (every `import` a module runs, at the top or inside a
function; those under `if TYPE_CHECKING:` never run and are left out).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "app" / "colibri"
QT_FREE = ("colibri", "colibri.values", "colibri.errors", "colibri.engine", "colibri.generation",
           "colibri.numerics", "colibri.tokens", "colibri.files", "colibri.fileformat",
           "colibri.convert", "colibri.convert_gguf", "colibri.formats", "colibri.reload",
           "colibri.bench", "colibri.compute", "colibri.cli",
           "colibri.inspection", "colibri.debugging", "colibri.jitter", "colibri.profile",
           "colibri.serving", "colibri.margins", "colibri.families", "colibri.reference")
# The compiled extension belongs to the binding: errors.py names status codes with it.
EXTENSION = "colibri._colibri_cffi"
EXTENSION_USERS = {"colibri.engine", "colibri.errors", "colibri._build_ffi"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _runs(tree: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a module that execute: everything but the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in (child, *_runs(child)))
            continue
        yield node
        yield from _runs(node)


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, str, int]]:
    """(imported module, imported name or '', line) of each import `name` runs; `from pkg import
    mod` counts as an import of pkg.mod when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _runs(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub, "", node.lineno) if sub in known else (base, alias.name, node.lineno)


def test_the_core_imports_no_qt() -> None:
    code = ("import sys, pkgutil, importlib\n"
            "sys.modules['PySide6'] = None\n"
            "sys.modules['pyqtgraph'] = None\n"
            f"for name in {QT_FREE!r}:\n"
            "    module = importlib.import_module(name)\n"
            "    if name == 'colibri':\n"
            "        continue  # its subpackages are listed one by one: colibri.inspector is Qt\n"
            "    for m in pkgutil.walk_packages(getattr(module, '__path__', []), name + '.'):\n"
            "        if not m.name.endswith('__main__'):\n"
            "            importlib.import_module(m.name)\n"
            "assert not [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph'))\n"
            "            and sys.modules[m] is not None]\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_no_module_imports_a_private_name_of_another() -> None:
    known = modules()
    wrong = []
    for name, path in known.items():
        aliases: dict[str, str] = {}
        for target, attr, line in imports(name, path, known):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if target == EXTENSION or target.startswith(EXTENSION + "."):
                if name not in EXTENSION_USERS:
                    wrong.append(f"{where} imports the compiled extension")
                continue
            if not target.startswith("colibri"):
                continue
            private = [p for p in [*target.split("."), attr] if p.startswith("_")
                       and not p.startswith("__")]
            if private and target != name:
                wrong.append(f"{where} imports {target}{'.' + attr if attr else ''}")
            if not attr:
                aliases[target.rpartition(".")[2]] = target
        for node in ast.walk(ast.parse(path.read_text())):
            for alias in getattr(node, "names", []) or []:
                if isinstance(node, ast.ImportFrom) and f"{node.module}.{alias.name}" in known:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif isinstance(node, ast.Import) and alias.asname:
                    aliases[alias.asname] = alias.name
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and aliases[node.value.id] in known
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} uses "
                             f"{aliases[node.value.id]}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    known = modules()
    graph = {name: sorted({target for target, _, _ in imports(name, path, known)
                           if target in known and target != name})
             for name, path in known.items()}
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_scan_sees_the_package() -> None:
    """The checks above read real imports (a broken scan would pass them vacuously)."""
    known = modules()
    assert {"colibri.engine", "colibri.cli.common", "colibri.inspector.main_window"} <= set(known)
    found = {target for target, _, _ in imports("colibri.cli.run", known["colibri.cli.run"],
                                                known)}
    assert {"colibri.cli.common", "colibri.reload", "colibri.engine"} <= found
