"""Every Ray this project starts keeps its session folders (logs, sockets, runtime resources:
0777, no sticky bit) inside a 0700 folder of the user's own, so no other local user can create or
delete a file in a run's sockets/."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from files.private import private_ray_tmp

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, os, ray, stat
from pathlib import Path
from linkage_server.chunk_search import connect
from tests.test_ray_private import _reachable_by_others
connect("local")
session = Path(ray._private.worker._global_node.get_session_dir_path())
private = next(p for p in session.parents if p.name.startswith("fedsim-ray-"))
print(json.dumps({
    "private_mode": stat.S_IMODE(private.stat().st_mode), "private_uid": private.stat().st_uid,
    "open_inside": any(stat.S_IMODE(p.stat().st_mode) & 0o002 for p in session.rglob("*") if p.is_dir()),
    "reachable": _reachable_by_others(session / "sockets"),
}))
ray.shutdown()
"""


def _reachable_by_others(path: Path) -> list[str]:
    """Folders on the way to ``path`` that another user may enter and write in (no sticky bit)."""
    out, blocked = [], False
    for folder in reversed([path, *path.parents]):
        mode = stat.S_IMODE(folder.stat().st_mode)
        if folder.stat().st_uid == os.getuid() and mode & 0o077 == 0:
            blocked = True  # nobody else gets past this folder
        if not blocked and mode & 0o002 and not folder.stat().st_mode & stat.S_ISVTX:
            out.append(str(folder))
    return out if not blocked else []


def test_a_local_ray_keeps_its_session_folders_in_a_private_folder(tmp_path):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])  # measured in the child: its folder goes with it
    assert seen["private_mode"] == 0o700 and seen["private_uid"] == os.getuid()
    assert seen["open_inside"] and seen["reachable"] == []  # Ray's 0777 folders, behind one no one else enters


def test_the_simulation_and_the_demo_give_their_ray_a_fresh_private_folder():
    a, b = Path(private_ray_tmp()), Path(private_ray_tmp())
    try:
        assert a != b and all(stat.S_IMODE(p.parent.stat().st_mode) == 0o700 for p in (a, b))
        assert len(str(a / "ray" / "session_2026-12-05_00-00-00_000000_00000" / "sockets" / "plasma_store")) < 107
    finally:
        a.parent.rmdir()
        b.parent.rmdir()
    source = (Path(__file__).resolve().parents[1] / "deploy" / "localsim.py").read_text()
    assert '"RAY_TMPDIR": private_ray_tmp()' in source
    demo = (Path(__file__).resolve().parents[1] / "scripts" / "demo.sh").read_text()
    assert "RAY_TMPDIR" in demo and "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT" in demo


def _sourced_ray_tmp(tmp: Path) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "RAY_TMPDIR"} | {"TMPDIR": str(tmp)}
    r = subprocess.run(
        # as scripts/demo.sh sources it: under set -euo pipefail, where any failing line ends the script
        ["bash", "-c", f"set -euo pipefail; . {REPO / 'scripts' / 'flwr_env.sh'}; echo $RAY_TMPDIR"],
        capture_output=True, text=True, env=env, cwd=tmp, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def test_the_flower_env_reuses_one_private_folder_per_user_and_never_anothers(tmp_path):
    """Sourcing scripts/flwr_env.sh made a fresh folder each time (a walk left 35 empty ones)."""
    first, again = _sourced_ray_tmp(tmp_path), _sourced_ray_tmp(tmp_path)
    own = tmp_path / f"fedsim-ray-{os.getuid()}"
    assert first == again == own / "r" and stat.S_IMODE(own.stat().st_mode) == 0o700
    own.chmod(0o777)  # opened to others (or made by another user): not used
    elsewhere = _sourced_ray_tmp(tmp_path)
    assert elsewhere.parent != own and stat.S_IMODE(elsewhere.parent.stat().st_mode) == 0o700
