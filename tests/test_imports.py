"""The package import graph: no cycles between jaxformer's packages, and checkpoint reading below the
trainer.

A package is ``jaxformer.<first component>`` (``jaxformer.train``, ``jaxformer.ops``, …); a
top-level module (``jaxformer.config``, ``jaxformer.plan``) is its own. Every ``import`` and
``from … import`` statement of the source counts, read with `ast` (nothing is imported):

- module-level imports;
- imports inside functions: a lazy import still makes its module depend on the other package
  when the function runs, and a lazy import written to dodge a cycle hides the cycle, not removes it;
- imports under ``if TYPE_CHECKING:``: a type hint naming a higher layer's class is that layer
  known to a lower one (the guide: ops know nothing of the layers above them);
- relative imports, resolved against the importing module; ``from jaxformer import x`` as
  ``jaxformer.x``.

``JAXFORMER_IMPORTS_ROOT=<checkout>`` checks another checkout's ``jaxformer/`` (e.g. an older one).
"""

from __future__ import annotations

import ast
import os
import textwrap
from collections import defaultdict
from pathlib import Path

ROOT = Path(os.environ.get("JAXFORMER_IMPORTS_ROOT", Path(__file__).resolve().parents[1]))
# What reading a checkpoint may not need: the trainer, evaluation of runs, and the command lines.
ABOVE_CHECKPOINT = ("jaxformer.train", "jaxformer.evaluation", "jaxformer.evaluate_run",
                    "jaxformer.cli", "jaxformer.predict", "jaxformer.plan", "jaxformer.compile")

Edges = dict[str, dict[str, list[tuple[str, str]]]]  # package → package → [(module, imported)]


def module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    name = ".".join(parts)
    return name.removesuffix(".__init__")


def package_of(module: str) -> str:
    """``jaxformer.train.loop`` → ``jaxformer.train``; ``jaxformer.config`` → itself."""
    return ".".join(module.split(".")[:2])


def is_module(name: str, package_dir: Path) -> bool:
    """Whether ``name`` (``jaxformer.a.b``) is a module or package of the source tree."""
    path = package_dir.parent / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(path: Path, module: str, package_dir: Path) -> list[str]:
    """Every module ``path`` (the module ``module``) imports, at any depth of its syntax tree."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: ``.`` is the module's package (a package's own for __init__)
                parts = module.split(".")
                base = parts[: len(parts) - node.level + is_package]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            out.append(source)  # and ``from jaxformer import train``: the submodule jaxformer.train
            out += [f"{source}.{a.name}" for a in node.names
                    if is_module(f"{source}.{a.name}", package_dir)]
    return out


def package_edges(package_dir: Path) -> Edges:
    """package → package it imports → the (module, imported module) pairs behind that edge."""
    top = package_dir.name
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for path in sorted(package_dir.rglob("*.py")):
        module = module_name(path, package_dir)
        for target in imported_modules(path, module, package_dir):
            if target != top and not target.startswith(top + "."):
                continue
            src, dst = package_of(module), package_of(target)
            if dst != top and src != dst:
                edges[src][dst].append((module, target))
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """Strongly connected components of two or more packages (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def describe(component: list[str], edges: Edges) -> str:
    """The edges inside one cycle, each with the imports behind it (module → module)."""
    lines = ["a cycle among " + ", ".join(component)]
    for src in component:
        for dst in component:
            for module, target in edges.get(src, {}).get(dst, []):
                lines.append(f"    {src} → {dst}:  {module} → {target}")
    return "\n".join(lines)


def reachable(edges: Edges, start: str) -> dict[str, list[str]]:
    """Packages ``start`` imports, directly or not → the path of packages that reaches each."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in edges.get(v, {}):
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return paths


def test_no_import_cycle_between_packages():
    edges = package_edges(ROOT / "jaxformer")
    found = cycles(edges)
    assert not found, (f"{len(found)} import cycle(s) between jaxformer's packages (move the code to "
                       "the layer it belongs to):\n" + "\n".join(describe(c, edges) for c in found))


def test_checkpoint_reading_needs_nothing_above_it():
    edges = package_edges(ROOT / "jaxformer")
    paths = reachable(edges, "jaxformer.checkpoint")
    above = {p: " → ".join(paths[p]) for p in paths if p in ABOVE_CHECKPOINT}
    assert not above, f"jaxformer.checkpoint imports the layers above it: {above}"


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "jaxformer" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "jaxformer"


def test_the_checker_finds_a_lazy_a_relative_and_a_type_checking_cycle(tmp_path):
    """The checker itself: each kind of import it counts closes a cycle it reports, edge by edge."""
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/ops.py": """
            def f():
                from jaxformer.high.run import g  # lazy: still a dependency
                return g
            """,
        "high/__init__.py": "from .run import g\n",
        "high/run.py": "from jaxformer.low import ops\n\ndef g():\n    return ops\n",
        "hints/__init__.py": "",
        "hints/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jaxformer import top\n",
        "top.py": "from jaxformer.hints import a\n",
        "alone.py": "import os\n",
    })
    edges = package_edges(package)
    found = cycles(edges)
    assert sorted(found) == [["jaxformer.high", "jaxformer.low"], ["jaxformer.hints", "jaxformer.top"]]
    text = describe(["jaxformer.high", "jaxformer.low"], edges)
    assert "jaxformer.low.ops → jaxformer.high.run" in text
    assert "jaxformer.high.run → jaxformer.low.ops" in text
    assert "jaxformer.high → jaxformer.high.run" not in text  # inside a package: not an edge
    assert reachable(edges, "jaxformer.top") == {
        "jaxformer.top": ["jaxformer.top"], "jaxformer.hints": ["jaxformer.top", "jaxformer.hints"]}


def test_the_checker_passes_a_layered_package(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "import numpy\n",
        "mid/__init__.py": "from jaxformer import low\n",
        "high/__init__.py": "from jaxformer.mid import low\nfrom ..mid import low as again\n",
    })
    edges = package_edges(package)
    assert cycles(edges) == []
    assert {dst for dst in edges["jaxformer.high"]} == {"jaxformer.mid"}
    assert {dst for dst in edges["jaxformer.mid"]} == {"jaxformer.low"}
