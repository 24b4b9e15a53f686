"""Results never go into the project's source tree.

A command that writes results (linkage, secrets, the service's data, runs, predictions) refuses
a target inside a folder that holds the project's source: the project root itself, and every
top-level folder of it that git tracks (the Python packages, tests, docs, examples, the shipped
data). Work folders beside them (`runs/`, `work/`: ignored by git) are fine, as is anything
outside the project.

    inside_source(path) -> the reason, or None      path: a file or folder to be written
    refuse_source(path, what)                      raises ValueError naming ``what`` and the folder
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# top-level folders of ROOT that hold the project's own files (git tracks them)
SOURCE = (
    "app",
    "bench",
    "conf",
    "data",
    "datasets",
    "deploy",
    "docs",
    "examples",
    "experiments",
    "fedsim",
    "files",
    "lab",
    "linkage",
    "linkage_server",
    "scripts",
    "strategies",
    "tests",
    ".ci",
    ".git",
    ".venv",
)


def _folder(path: Path) -> Path:
    """The folder a target lands in: itself if it is (or is named as) a folder, else its parent."""
    path = Path(path).expanduser().absolute()
    return path if path.is_dir() or not path.suffix else path.parent


def inside_source(path: Path) -> str | None:
    folder = _folder(path).resolve()
    if folder == ROOT:
        return f"{folder} is the project's root (its source, README, pyproject.toml)"
    try:
        top = folder.relative_to(ROOT).parts[0]
    except ValueError:
        return None  # outside the project
    if top in SOURCE:
        return f"{folder} is inside the project's source folder {ROOT / top}"
    return None


def refuse_source(path: Path, what: str) -> None:
    why = inside_source(path)
    if why:
        raise ValueError(
            f"{what} {path}: {why}; write results into a work folder outside the source "
            f"(e.g. {ROOT / 'work'} or a folder outside {ROOT}; git ignores work/ and runs/)"
        )


def exit_if_source(path: Path, what: str) -> None:
    """:func:`refuse_source` for a command line: the reason on stderr and exit status 2."""
    import sys

    try:
        refuse_source(path, what)
    except ValueError as e:
        print(f"refused: {e}", file=sys.stderr)
        raise SystemExit(2) from None
