"""Issue 29: results never land in the project's source tree. The README's service example wrote
primary.npz, privacy.json and the secondaries' maps into the `linkage/` package and secrets and
the admin token into the repository root, none of it ignored by git."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from files.source_tree import ROOT, inside_source

OUTPUT_OPTIONS = ("--out", "--fetch", "--data-dir", "--secrets-dir", "--record", "--out-dir", "--admin-token-file")


def test_the_source_folders_are_named_and_work_folders_are_not(tmp_path):
    assert "project's root" in inside_source(ROOT)
    assert "linkage" in inside_source(ROOT / "linkage")  # the README's old `--out linkage`
    assert inside_source(ROOT / "linkage" / "primary.npz") and inside_source(ROOT / "predictions.csv")
    assert inside_source(ROOT / "tests" / "new-folder")
    for fine in (ROOT / "runs" / "x", ROOT / "work" / "linkage", tmp_path / "linkage", tmp_path / "p.csv"):
        assert inside_source(fine) is None, fine


def test_a_fetch_into_the_linkage_package_is_refused_before_anything_is_written(tmp_path, capsys):
    from linkage_server.cli import main

    secret = tmp_path / "s.secret"
    secret.write_text("x" * 43)
    secret.chmod(0o600)
    before = sorted(p.name for p in (ROOT / "linkage").iterdir())
    with pytest.raises(SystemExit) as e:  # the URL is never contacted: nothing listens on port 9
        main(
            [
                "fetch",
                "--url",
                "http://127.0.0.1:9",
                "--job",
                "j",
                "--party",
                "p",
                "--secret-file",
                str(secret),
                "--out",
                str(ROOT / "linkage"),
            ]
        )
    assert e.value.code == 2 and "inside the project's source folder" in capsys.readouterr().err
    assert sorted(p.name for p in (ROOT / "linkage").iterdir()) == before


def _readme_outputs() -> list[tuple[str, str]]:
    """(option, path) of every output option in the bash blocks of the README and the manual behind
    it (docs/reference.md), $W expanded."""
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "reference.md").read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        variables = dict(re.findall(r"\b([A-Z])=(\S+?)(?:;|\s|$)", block))
        for line in block.replace("\\\n", " ").splitlines():
            for option, value in re.findall(r"(--[a-z-]+)[ =](\S+)", line):
                if option in OUTPUT_OPTIONS and (option != "--data-dir" or " serve " in line):  # train's is input
                    found.append((option, re.sub(r"\$([A-Z])", lambda m: variables.get(m.group(1), m.group(0)), value)))
        for value in re.findall(r"-c (?:linkage-dir|out-dir)=(\S+)", block):
            found.append(("-c", re.sub(r"\$([A-Z])", lambda m: variables.get(m.group(1), m.group(0)), value)))
    return found


def test_the_readme_examples_write_outside_the_source_into_folders_git_ignores():
    outputs = [(o, v) for o, v in _readme_outputs() if "<" not in v.split("/")[0]]
    assert len(outputs) >= 15, outputs  # the service example, the game example, predict, deploy
    inside = [(o, v) for o, v in outputs if not v.startswith("/") and inside_source(ROOT / v)]
    assert inside == [], inside
    if shutil.which("git") and (ROOT / ".git").exists():
        relative = sorted({v.replace("<job>", "j") for _, v in outputs if not v.startswith(("/", ".."))})
        ignored = subprocess.run(
            ["git", "check-ignore", "--no-index", *relative], cwd=ROOT, capture_output=True, text=True
        ).stdout.split()
        assert sorted(ignored) == relative, sorted(set(relative) - set(ignored))


def test_predict_train_and_deploy_refuse_the_source_tree_before_anything_runs(tmp_path, capsys):
    from fedsim.cli import main

    assert (
        main(["predict", str(tmp_path / "no-run"), str(tmp_path / "new.csv"), "--out", str(ROOT / "predictions.csv")])
        == 2
    )  # named before the run is even looked at
    assert "project's root" in capsys.readouterr().err and not (ROOT / "predictions.csv").exists()
    assert main(["train", "--dataset", "hdb", "--engine", "inprocess", "--out-dir", str(ROOT / "linkage")]) == 2
    assert "inside the project's source folder" in capsys.readouterr().err
    assert main(["deploy", "up", str(ROOT / "tests" / "deployment"), "--dataset", "house3"]) == 2
    assert "inside the project's source folder" in capsys.readouterr().err
    assert not (ROOT / "tests" / "deployment").exists()
