"""Where a command's CPU goes, by kind of process: every process's CPU (utime + stime, /proc) is
sampled every 0.2 s until the command ends, and its growth summed per kind (a Flower daemon, a
ClientApp, a party worker, the linkage service, a pytest worker...). Daemons that leave the
command's process tree (Flower's sessions) are counted too; a process that lives less than a
sample loses its last fraction of a second. Other users' and earlier processes count only for
what they burn meanwhile: run it on a quiet machine.

    python -m bench.suite_cpu scripts/test.sh -q -p no:cacheprovider
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def kind(cmd: str) -> str:
    """A process's kind from its command line: the module of `python -m`, else the script's name."""
    words = cmd.split() or ["?"]
    if len(words) > 2 and words[1] == "-m":
        return "python -m " + words[2]
    if len(words) > 1 and "python" in words[0] and not words[1].startswith("-"):
        script = words[1].split("/")[-1]
        return script + (" " + words[2] if len(words) > 2 and not words[2].startswith("-") else "")
    if len(words) > 2 and words[1] == "-c":
        return "python -c " + words[2][:30]
    return words[0].split("/")[-1]


def scan(seen: dict) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        key = (pid, stat[19])  # pid and start time: a reused pid is another process
        first, cpu = seen.get(key, ("", 0.0))
        seen[key] = (first or cmd, max(cpu, (int(stat[11]) + int(stat[12])) / TICK))


def main(argv: list[str]) -> None:
    seen: dict = {}
    scan(seen)
    base = {k: cpu for k, (_, cpu) in seen.items()}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        scan(seen)
        time.sleep(0.2)
    scan(seen)
    total, count = collections.Counter(), collections.Counter()
    for key, (cmd, cpu) in seen.items():
        grown = cpu - base.get(key, 0.0)
        if grown > 0.05:
            total[kind(cmd)] += grown
            count[kind(cmd)] += 1
    for name, cpu in total.most_common(30):
        print(f"{cpu:7.1f} s  x{count[name]:3d}  {name[:90]}")
    print(f"total {sum(total.values()):.1f} s of CPU in {time.monotonic() - t0:.0f} s; exit {proc.returncode}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
