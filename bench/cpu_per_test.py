"""Each test's CPU, as a pytest plugin: its process's own CPU and its reaped children's
(``resource.getrusage``) over the test's protocol (set-up, call, teardown), one JSON line per test
per worker process into ``$TEST_CPU_OUT`` (default ``test-cpu/`` under the working folder).
Flower's and the lab's detached daemons are nobody's reaped children: they are missed here
(bench/suite_cpu.py counts them, by kind of process). Then the summary, heaviest first:

    scripts/test.sh -q -p no:cacheprovider -p bench.cpu_per_test
    python -m bench.cpu_per_test test-cpu [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path

import pytest

OUT_ENV = "TEST_CPU_OUT"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own0, children0), t0 = _cpu(), time.monotonic()
    yield
    (own1, children1), wall = _cpu(), time.monotonic() - t0
    folder = Path(os.environ.get(OUT_ENV, "test-cpu"))
    folder.mkdir(parents=True, exist_ok=True)
    row = {"id": item.nodeid, "own": own1 - own0, "children": children1 - children0, "wall": wall}
    with open(folder / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(Path(folder).glob("*.jsonl")) for line in path.open()]


def summary(rows: list[dict], top: int = 40) -> list[str]:
    """The heaviest tests and test modules by CPU (own + reaped children), and the workers' busy time."""
    cpu = lambda r: r["own"] + r["children"]  # noqa: E731 - the one measure, used twice
    lines = [f"{len(rows)} tests, {sum(map(cpu, rows)):.0f} s of CPU attributed (own + reaped children)"]
    for r in sorted(rows, key=cpu, reverse=True)[:top]:
        lines.append(
            f"{cpu(r):7.1f} s (own {r['own']:6.1f}, children {r['children']:6.1f}; wall {r['wall']:6.1f})  {r['id']}"
        )
    modules = collections.Counter()
    for r in rows:
        modules[r["id"].split("::")[0]] += cpu(r)
    lines += ["by module:", *(f"{v:7.1f} s  {m}" for m, v in modules.most_common(top // 2))]
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help=f"where the plugin wrote (${OUT_ENV}, default test-cpu)")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    print("\n".join(summary(read_rows(args.folder), args.top)))


if __name__ == "__main__":
    main()
