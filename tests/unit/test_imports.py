"""The package's shape: no import circle anywhere, and the pure layer imports no infrastructure.

The import graph is read from the source (every ``import`` statement, also those inside
functions, which would only hide a circle), so the test needs no AWS library loaded.
``if TYPE_CHECKING:`` blocks are skipped: they never run.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reshard"
FORBIDDEN = ["boto3", "botocore", "click", "tqdm", "tenacity"]
#: The pure layer: everything in reshard/core, and the error classes.
PURE = sorted(["reshard.errors"] + [f"reshard.core.{p.stem}" for p in (PACKAGE / "core").glob("*.py")
                                     if p.stem != "__init__"])


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The reshard modules ``name`` imports (a package import counts as its ``__init__``)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name in known)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                for a in child.names:
                    # `from P import m` with m a module depends on P.m; otherwise on P itself.
                    out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    out.discard(name)
    return out & known


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = dfs(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            found = dfs(m)
            if found:
                return found
    return None


def test_no_import_circle_in_the_package():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_would_see_a_circle():
    """The check can fail: a planted circle is reported with its path."""
    g = graph()
    g["reshard.core.phases"] = set(g["reshard.core.phases"]) | {"reshard.control.store"}
    cycle = find_cycle(g)
    assert cycle is not None and "reshard.core.phases" in cycle and "reshard.control.store" in cycle


def test_the_pure_layer_imports_only_the_pure_layer():
    """core/ (and errors) never import aws, control, jobs, shim, cli or the operations."""
    g = graph()
    for m in PURE:
        assert g[m] <= set(PURE) | {"reshard", "reshard.core"}, (m, sorted(g[m] - set(PURE)))


def test_the_pure_layer_loads_no_infrastructure():
    """Importing every pure module in a fresh interpreter loads no AWS SDK, CLI, progress or retry library."""
    assert len(PURE) >= 10 and "reshard.core.wire" in PURE, PURE  # all of core/, found by listing it
    code = (
        "import importlib, json, sys\n"
        f"for m in {PURE!r}: importlib.import_module(m)\n"
        f"print(json.dumps([m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_the_probe_would_see_a_forbidden_import():
    """The same probe does report boto3 when a module pulls it in (the check can fail)."""
    code = (f"import sys, json, reshard.aws.dynamo; "
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "boto3" in json.loads(proc.stdout)
