"""deploy/app_source.py: the folder `flwr run` is given holds the app's files only, and Flower
builds the same FAB from it as from the project's root."""

from __future__ import annotations

import os
from pathlib import Path

from deploy.app_source import app_folder, source_files
from deploy.localsim import REPO


def _tree(root: Path) -> Path:
    for rel, text in {
        ".gitignore": ".venv/\nruns/\n*.pyc\n.fedsim-app/\n",
        "pyproject.toml": "[project]\nname = 'x'\n",
        "app/a.py": "A = 1\n",
        "app/b.pyc": "compiled",
        ".venv/lib/torch.py": "big",
        "runs/r1/model.pt": "model",
        ".git/HEAD": "ref",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_staged_folder_holds_what_git_keeps_and_is_made_once_per_state_of_the_tree(tmp_path):
    root = _tree(tmp_path / "project")
    os.symlink(root / "app" / "a.py", root / "app" / "link.py")  # Flower leaves symlinks out too
    assert source_files(root) == [".gitignore", "app/a.py", "pyproject.toml"]
    first = app_folder(root)
    assert first.parent == root / ".fedsim-app"
    assert sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file()) == source_files(root)
    assert (first / "app" / "a.py").read_text() == "A = 1\n"
    assert app_folder(root) == first  # the same tree: the same folder, not made again
    (root / "app" / "c.py").write_text("C = 3\n")
    second = app_folder(root)
    assert second != first and (second / "app" / "c.py").exists() and first.is_dir()  # the old one stays a while
    assert not any(p.name.startswith(".tmp-") for p in (root / ".fedsim-app").iterdir())
    assert oct(second.stat().st_mode & 0o777) == "0o755"  # readable as the checkout is, whatever the umask


def test_a_read_only_checkout_gives_flower_the_root_itself(tmp_path, monkeypatch):
    root = _tree(tmp_path / "project")
    root.chmod(0o555)
    try:
        if os.access(root, os.W_OK):  # root ignores the mode: make the folder's creation fail instead
            (root / ".fedsim-app").write_text("a file where the folder would go")
        assert app_folder(root) == root
    finally:
        root.chmod(0o755)


def test_flower_builds_the_same_fab_from_the_staged_folder_as_from_the_root():
    from flwr.cli.build import build_fab_from_disk

    assert build_fab_from_disk(app_folder(REPO)) == build_fab_from_disk(REPO)


def test_a_file_gone_while_the_folder_is_made_leaves_no_half_folder(tmp_path, monkeypatch):
    import deploy.app_source as app_source

    root = _tree(tmp_path / "project")

    def vanished(src, dst):
        raise FileNotFoundError(src)

    monkeypatch.setattr(app_source, "_link_or_copy", vanished)
    assert app_folder(root) == root  # Flower walks the root itself, as before
    assert list((root / ".fedsim-app").iterdir()) == []
