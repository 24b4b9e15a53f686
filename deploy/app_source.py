"""The folder `flwr run` is given: the project's own files, without the virtual environment.

`flwr run <folder>` builds the app's FAB by walking *every* file under the folder and only then
applying .gitignore (Flower 1.42 `collect_files`, resolving each path). The project's root holds
its `.venv`: 47,684 of its 48,577 files (506 are the app's), and the walk cost 2.2 s of CPU per
`flwr run` (2026-12-06, 2-core VM), on every `fedsim train`, `deploy run` and test run.

:func:`app_folder` gives Flower a folder holding only the files git would keep (the walk prunes
ignored folders, as git does), hard-linked (copied where links fail) under the root's ignored
`.fedsim-app/`, named for those files' paths, sizes and change times: made once per state of the
tree and reused by every run after. Its folders are 0755, as a checkout's: the source, which a
deployment's or the test lab's other users read, holds nothing private. The FAB Flower builds
from it is byte for byte the one it builds from the root (tests/test_app_source.py). Anything
that stops it (a read-only checkout) gives the root itself: Flower's own walk, slower, the same
app.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import pathspec

STAGED = Path(".fedsim-app")  # under the root, ignored by .gitignore (.flwr/ is FLWR_HOME: scripts/flwr_env.sh)
KEEP_S = 3600.0  # a superseded folder older than this is removed (a run started from it has its FAB long since)


def source_files(root: Path) -> list[str]:
    """The files under ``root`` that its .gitignore keeps, as sorted POSIX paths relative to it:
    ignored folders (and .git) are not entered; symlinks are left out, as Flower leaves them."""
    ignore = root / ".gitignore"
    spec = pathspec.GitIgnoreSpec.from_lines(ignore.read_text().splitlines() if ignore.exists() else [])
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        rel = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if d != ".git" and not spec.match_file(f"{prefix}{d}/")]
        found += [
            prefix + f for f in files if not spec.match_file(prefix + f) and not os.path.islink(os.path.join(folder, f))
        ]
    return sorted(found)


def tree_key(root: Path, files: list[str]) -> str:
    """A name for this state of the tree: the files' paths, sizes and change times."""
    h = hashlib.sha256()
    for rel in files:
        st = os.stat(root / rel)
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a copy holds the same bytes
        shutil.copy2(src, dst)


def _drop_old(apps: Path, keep: Path) -> None:
    for old in apps.iterdir():
        try:
            if old != keep and time.time() - old.stat().st_mtime > KEEP_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # removed by another run meanwhile


def _make(root: Path, files: list[str], apps: Path, target: Path) -> None:
    """``target`` complete or absent: built aside, then renamed (another run may have made it
    meanwhile); a file that went away while it was built leaves nothing behind."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=apps))
    try:
        for rel in files:
            _link_or_copy(root / rel, tmp / rel)
        for folder, _, _ in os.walk(tmp):
            os.chmod(folder, 0o755)  # whatever the umask: readable as the checkout is
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise


def app_folder(root: Path) -> Path:
    """The folder to give `flwr run` for the app at ``root`` (module docstring)."""
    try:
        files = source_files(root)
        apps = root / STAGED
        try:
            apps.mkdir()
            os.chmod(apps, 0o755)
        except FileExistsError:
            pass
        target = apps / tree_key(root, files)
        if not target.is_dir():
            _make(root, files, apps, target)
        _drop_old(apps, target)
        return target
    except OSError:
        return root
