"""The house rules, checked: module and function sizes, and which package may import which.

Limits from the developers' guide: no module over 400 lines, no function over 60. Layering
(docs/design.md "Where things live"): the shared file helpers (files/) import nothing of ours;
the linkage library imports no web framework and nothing of ours
but itself; the Flower-free training core (strategies/) and the data loaders (datasets/) import
no Flower and nothing of the app; the Flower app (app/) reads linkages through the library, not
the service; no product package imports the operator tooling (deploy/), the experiment runner
(experiments/), the benchmarks (bench/) or the command line (fedsim/), which sits on top. Inside app/ and strategies/, one training mode's room
never imports the other's, and the shared modules import neither (the entry points and
app/modes.py, which dispatch on the mode, excepted).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("app", "files", "linkage", "linkage_server", "strategies", "datasets")
CHECKED = (*PRODUCT, "deploy", "lab", "experiments", "bench", "fedsim")
MAX_MODULE, MAX_FUNCTION = 400, 60
TOOLS = ("deploy", "lab", "experiments", "bench", "fedsim")
WEB = ("fastapi", "starlette", "uvicorn", "httpx")
# package -> modules (ours or third-party, matched as dotted prefixes) it must not import
FORBIDDEN = {
    "files": ("app", "linkage", "strategies", "datasets", "linkage_server", *TOOLS, *WEB, "flwr"),
    "linkage": ("app", "strategies", "datasets", "linkage_server", *TOOLS, *WEB, "flwr"),
    "linkage_server": ("app", "strategies", "datasets", *TOOLS, "flwr"),
    "datasets": ("app", "strategies", "linkage_server", *TOOLS, "flwr"),
    "strategies": ("app", "datasets", "linkage_server", *TOOLS, "flwr"),
    "app": ("linkage_server", *TOOLS),
    "deploy": ("lab", "experiments", "bench", "fedsim"),  # the operator's tooling never needs the test lab
    "lab": ("experiments", "bench", "fedsim"),
    "experiments": ("bench", "fedsim"),
    "fedsim": ("bench",),
    "app/vfl": ("app.entity_aug", "strategies.entity_aug"),
    "app/entity_aug": ("app.vfl", "strategies.vfl"),
    "strategies/vfl": ("strategies.entity_aug",),
    "strategies/entity_aug": ("strategies.vfl",),
}
SHARED = {"app": ("app.vfl", "app.entity_aug"), "strategies": ("strategies.vfl", "strategies.entity_aug")}
DISPATCHERS = {"client_app.py", "server_app.py", "modes.py"}


def _modules(packages) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _imports(tree: ast.AST) -> set[str]:
    """Dotted names of the modules imported anywhere in the module (lazy imports included)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _hits(names: set[str], forbidden) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


def test_no_module_over_400_lines():
    """The tests too: a test module past the cap splits by what its tests are about."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules((*CHECKED, "tests"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE
    }
    assert not long, f"modules over {MAX_MODULE} lines: {long}"


TRACKER = __import__("re").compile(r"\b[Ii]ssues?[ _-]?\d")  # "issue 31", "issue31"


def test_the_product_names_no_tracker_issue():
    """The issue tracker is not in the repository: code, sweeps and scripts say what a thing is
    for, not which ticket asked for it."""
    files = [p for p in _modules(CHECKED)] + sorted((ROOT / "conf").rglob("*.toml")) + sorted(ROOT.glob("*/*.sh"))
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not hits, f"issue numbers in the product: {hits[:10]}"


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
        hits = _hits(_imports(ast.parse(path.read_text())), FORBIDDEN[package])
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"{package}/ must not import {FORBIDDEN[package]}: {bad}"


@pytest.mark.parametrize("package", sorted(SHARED))
def test_shared_modules_import_no_mode(package):
    bad = {}
    for path in sorted((ROOT / package).glob("*.py")):
        hits = _hits(_imports(ast.parse(path.read_text())), SHARED[package])
        if hits and path.name not in DISPATCHERS:
            bad[path.name] = hits
    assert not bad, f"{package}/'s shared modules import a mode's room: {bad}"


def _module_graph() -> dict[str, set[str]]:
    """Our modules (dotted) -> the ones of ours each imports anywhere (lazy and TYPE_CHECKING too)."""
    names = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in _modules(CHECKED)
    }
    return {m: {n for n in _imports(ast.parse(p.read_text())) if n in names and n != m} for m, p in names.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, out = {}, {}, [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    """Issue 30: no two modules of ours import each other, directly or around a loop, even through
    an import inside a function (which hides a cycle from Python, not from a reader)."""
    assert _cycles(_module_graph()) == []


# What a linkage job is, is decided in one place: linkage/job.py (JobSpec), and it runs one way:
# linkage/runner.py. The run (app/) and the service build a JobSpec and give it to the runner
# (run_job, run_topk); neither calls the job entry points below itself, wherever they live.
JOB_ENTRY_POINTS = (
    *(f"linkage.pipeline.{f}" for f in ("link", "link_chain", "link_exact", "link_known", "job_id_of")),
    *(f"linkage.runner.{f}" for f in ("link_exact", "link_known")),
    "linkage.job.job_id_of",
)


@pytest.mark.parametrize("package", ["app", "linkage_server"])
def test_the_linkage_library_owns_the_job(package):
    bad = {
        str(p.relative_to(ROOT)): hits
        for p in _modules([package])
        if (hits := _hits(_imports(ast.parse(p.read_text())), JOB_ENTRY_POINTS))
    }
    assert not bad, f"{package}/ must run linkage jobs through linkage.job.JobSpec, not {JOB_ENTRY_POINTS}: {bad}"


def _bare_lazy_imports(source: str) -> list[int]:
    """Lines of the imports of our own packages (CHECKED, or relative) made inside a function with
    no comment on the import's first line to say why they are not at the module's top."""
    lines, bare = source.splitlines(), set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                ours = any(a.name.split(".")[0] in CHECKED for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] in CHECKED
            else:
                continue
            if ours and "#" not in lines[node.lineno - 1]:
                bare.add(node.lineno)
    return sorted(bare)


def test_every_import_of_ours_inside_a_function_says_why():
    """Issue 30: an import of our own modules inside a function is moved to the module's top, or
    says on its line why it is lazy (a heavy import kept off a start-up path, a cycle broken...).
    tests/ is not checked: a test may import what it tests lazily."""
    bare = [f"{p.relative_to(ROOT)}:{n}" for p in _modules(CHECKED) for n in _bare_lazy_imports(p.read_text())]
    assert not bare, f"imports of ours inside a function without a comment saying why: {bare}"


def test_the_checks_can_fail(tmp_path):
    """The scanners see a long function and a forbidden import when there is one."""
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    tree = ast.parse(f"import app.config\nfrom bench import sweep\nfrom fastapi import FastAPI\n\ndef f():\n{body}\n")
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert fn.end_lineno - fn.lineno + 1 == 62
    assert _hits(_imports(tree), FORBIDDEN["linkage"]) == [
        "app.config",
        "bench",
        "bench.sweep",
        "fastapi",
        "fastapi.FastAPI",
    ]
    assert _hits({"app.entity_aug.client", "app.vfl"}, FORBIDDEN["app/vfl"]) == ["app.entity_aug.client"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    lazy = (
        "import os\n\n\ndef f():\n    from app import config\n    from linkage.store import x  # lazy: why\n"
        "    import numpy\n    from . import sibling\n    import bench.linkage, json\n"
    )
    assert _bare_lazy_imports(lazy) == [5, 8, 9]
    assert _hits(_imports(ast.parse("from linkage.pipeline import link, searcher\n")), JOB_ENTRY_POINTS) == [
        "linkage.pipeline.link"
    ]
