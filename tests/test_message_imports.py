"""A deployed SuperNode runs every message in a fresh ClientApp process (Flower 1.41), so what
the ClientApp imports is paid per message: it must not pull in the data stack (pandas, sklearn,
scipy: about 2 s of a 5 s import on this VM, bench/message_cost.py). The handlers that need
data import it when they load it."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "sklearn", "scipy")


def _heavy_modules_after(statements: str) -> tuple[list[str], list[str]]:
    """In a fresh interpreter: the heavy modules imported at the statements' first printed list,
    and at their end."""
    code = f"import json, sys\nHEAVY = {HEAVY!r}\n{statements}\nprint(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    lists = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    return lists[0], lists[-1]


def test_the_clientapp_imports_no_data_stack_until_it_loads_data():
    before, after = _heavy_modules_after(
        "import app.client_app\nprint(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))\n"
        "from app.config import RunConfig\nfrom app.data import load_data\n"
        "print(load_data(RunConfig.of(dataset='synthetic', n_rows=200)).name)"
    )
    assert before == []
    assert after == ["pandas", "scipy", "sklearn"]  # the lazy imports are still there when needed
