"""The house rules, checked: module and function sizes, and which package may import which.

Limits from the developers' guide: no module over 400 lines, no function over 60. Layering: the
Flower-free training core (strategies/) and the data loaders (datasets/) import nothing from the
Flower app (app/); no product package imports the benchmarks (bench/).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("app", "linkage_server", "strategies", "datasets")
CHECKED = (*PRODUCT, "bench")
MAX_MODULE, MAX_FUNCTION = 400, 60
# package -> packages of this repo it must not import
FORBIDDEN = {"strategies": ("app", "bench"), "datasets": ("app", "bench", "strategies"),
             "linkage_server": ("app", "bench", "strategies"), "app": ("bench",)}


def _modules(packages) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _imports(tree: ast.AST) -> set[str]:
    """Top-level package names imported anywhere in the module (lazy imports included)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules(CHECKED)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE}
    assert not long, f"modules over {MAX_MODULE} lines: {long}"


def test_no_function_over_60_lines():
    long = {}
    for path in _modules(CHECKED):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION} lines: {long}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(package):
    bad = {}
    for path in _modules([package]):
        hits = _imports(ast.parse(path.read_text())) & set(FORBIDDEN[package])
        if hits:
            bad[str(path.relative_to(ROOT))] = sorted(hits)
    assert not bad, f"{package}/ must not import {FORBIDDEN[package]}: {bad}"


def test_the_checks_can_fail(tmp_path):
    """The scanners see a long function and a forbidden import when there is one."""
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    tree = ast.parse(f"import app.config\nfrom bench import sweep\n\ndef f():\n{body}\n")
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert fn.end_lineno - fn.lineno + 1 == 62
    assert _imports(tree) == {"app", "bench"}
