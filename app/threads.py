"""How many threads a party's torch ops and the BLAS/OpenMP pools use, for every engine.

torch's default (a thread per core) is the slow setting for this project's models: they are
small (hdb, fedsim_attn: 1.9 M parameters, the primary's and the school's), so an op's work is
split into slivers whose barriers cost more than they save, and on a machine whose cores are
shared (other jobs, or the other parties of a simulation) one descheduled thread stalls every op:
a held-out run took 277 s with the default threads against 33 s with one (docs/benchmarks.md "Threads").

:func:`choose_threads` (pure) decides from what the process knows or measures: the CPUs it may
use (:func:`usable_cpus`: its affinity mask and its cgroup's CPU quota), how many processes of
the run share them (a simulation's SuperNodes and its ServerApp; one process for the in-process
engine, whose parties run one after another), how busy other work keeps the CPUs (their busy
share over a fifth of a second: :func:`others_load`), and the parameters of the models it
trains. A model gets one thread per :data:`PARAMS_PER_THREAD` parameters, at most its share of
the CPUs that are free. Measured (docs/benchmarks.md "GPU"): hdb's 1.9 M-parameter model on a
quiet 16-core machine trains an epoch in 12.75 s with 16 threads and 24.08 s with one, and on a
2-core machine held by another job one thread is 8x faster than two.
``OMP_NUM_THREADS``, where set (by a user, a sweep worker, or Ray for a simulation's ClientApp
actors: the federation's client-resources num-cpus), is an upper bound. The run-config key
``threads`` (> 0) overrides the choice: it travels with the run to every party (ServerApp,
ClientApps, deployed SuperNodes and their workers; a secondary takes it up to its own CPUs), is
checked with the run config and recorded in config.json; an environment variable reaches none of
a deployment's other machines.

:func:`use` is the one place that applies a choice (torch.set_num_threads and threadpoolctl's
global limit on the BLAS/OpenMP pools); it logs the choice once per process (and again only if it
changes) and :func:`recorded` gives it to summary.json. The thread count changes results only
through the order of float summations (last digits); with the same count a CPU run is repeatable
(docs/reference.md "Threads and reproducibility").
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import asdict, dataclass
from logging import INFO
from pathlib import Path

PARAMS_PER_THREAD = 100_000  # a thread per this many parameters (module docstring): hdb's 1.9 M model gets 16+
LOAD_WINDOW = 0.2  # seconds others_load watches the CPUs
RESAMPLE_AFTER = 60.0  # seconds its reading is reused for

_current: "ThreadChoice | None" = None
_sampled: tuple[float, float] | None = None  # (when, CPUs busy): others_load's last reading


@dataclass(frozen=True)
class ThreadChoice:
    """A process's thread count and what it was chosen from."""

    threads: int
    cpus: int  # the CPUs this process may use
    processes: int  # processes of the run sharing them
    parties: int  # parties whose models this process trains
    params: int  # their parameters, all together
    source: str  # "auto", "auto, OMP_NUM_THREADS=N" or "run config threads=N"

    def line(self) -> str:
        """``threads: 1 (2 CPUs, 4 parties in this process, model 0.3 M params)``."""
        sharing = f", {self.processes} processes share them" if self.processes > 1 else ""
        return (
            f"threads: {self.threads} ({self.cpus} CPUs{sharing}, {self.parties} "
            f"part{'y' if self.parties == 1 else 'ies'} in this process, model {self.params / 1e6:.2f} M params; "
            f"{self.source})"
        )


def choose_threads(
    cpus: int, processes: int, parties: int, params: int, override: int = 0, env_cap: int = 0, busy: float = 0.0
) -> ThreadChoice:
    """The thread count for a process that may use ``cpus`` CPUs shared by ``processes`` processes
    of the run and trains ``parties`` models of ``params`` parameters in all. ``override`` (> 0):
    the run config's ``threads``; ``env_cap`` (> 0): ``OMP_NUM_THREADS``, an upper bound;
    ``busy``: CPUs other work keeps busy (:func:`others_load`), which the run leaves to it."""
    cpus, processes, parties = max(1, cpus), max(1, processes), max(1, parties)
    if override > 0:
        return ThreadChoice(override, cpus, processes, parties, params, f"run config threads={override}")
    free = max(1, min(cpus, math.floor(cpus - max(0.0, busy) + 0.5)))
    share = max(1, free // processes)
    n = min(share, max(1, params // PARAMS_PER_THREAD))
    source = f"auto, {cpus - free} of {cpus} CPUs busy" if free < cpus else "auto"
    if env_cap > 0 and env_cap < n:
        n, source = env_cap, f"auto, OMP_NUM_THREADS={env_cap}"
    return ThreadChoice(n, cpus, processes, parties, params, source)


def cpu_quota(cpu_max: str) -> float | None:
    """CPUs a cgroup v2 ``cpu.max`` line allows ("200000 100000" -> 2.0; "max 100000" -> None)."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """This process's cgroup CPU quota (v2 cpu.max, else v1 cfs quota / period), None without one."""
    try:
        if (root / "cpu.max").exists():
            return cpu_quota((root / "cpu.max").read_text())
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


@functools.cache
def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask, capped by its cgroup's quota (rounded
    down, at least 1)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    return max(1, min(n, math.floor(quota))) if quota else n


def _cpu_times(stat: Path = Path("/proc/stat")) -> tuple[int, int, int] | None:
    """(busy, all) jiffies of every CPU together since boot and the CPUs counted, or None."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    fields = [int(x) for x in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(fields) - fields[3] - fields[4], sum(fields), max(1, cpus)


def others_load(window: float = LOAD_WINDOW) -> float:
    """CPUs other work keeps busy now: the machine's busy share over ``window`` seconds, which this
    process sleeps through (/proc/stat); where there is none, the 1-minute load average less this
    process's own 1. Not the load average first: it counts, for a minute after, work that has
    ended, such as the run's own linkage or the run before it (measured: an in-process hdb epoch
    chose 1 thread after a run and took 28.0 s, against 15.9 s at the 2 it chose on a quiet machine)."""
    global _sampled
    if _sampled is not None and time.monotonic() - _sampled[0] < RESAMPLE_AFTER:
        return _sampled[1]  # a party decides at each message: watched once a minute, not each time
    first = _cpu_times()
    if first is not None:
        time.sleep(window)
        second = _cpu_times()
        if second is not None and second[1] > first[1]:
            busy = second[2] * (second[0] - first[0]) / (second[1] - first[1])
            _sampled = (time.monotonic(), busy)
            return busy
    try:
        return max(0.0, os.getloadavg()[0] - 1.0)
    except OSError:
        return 0.0


def env_cap() -> int:
    """``OMP_NUM_THREADS`` as a positive int, else 0."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 0


def params_of(*models) -> int:
    """Parameters of ``models`` (torch modules), all together."""
    return sum(p.numel() for m in models for p in m.parameters())


def decide(override: int, processes: int, models) -> ThreadChoice:
    """:func:`choose_threads` with this process's measured CPUs, OMP_NUM_THREADS and ``models``;
    the CPUs are watched (:func:`others_load`, LOAD_WINDOW) only where the answer can depend on it: a
    model of under 2 x PARAMS_PER_THREAD parameters (a secondary's, typically, whose process may
    be started for each message) gets one thread whatever the load."""
    models = list(models)
    cpus, params = usable_cpus(), params_of(*models)
    busy = others_load() if override <= 0 and cpus > 1 and params >= 2 * PARAMS_PER_THREAD else 0.0
    return choose_threads(cpus, processes, len(models), params, override, env_cap(), busy)


def entity_aug_choice(override: int, models) -> ThreadChoice:
    """Entity Augmentation's primary: its parties' few small Linears on one thread
    (strategies/torch_threads.py says why), unless the run config's ``threads`` says otherwise."""
    models = list(models)
    cpus, params = usable_cpus(), params_of(*models)
    if override > 0:
        return choose_threads(cpus, 1, len(models), params, override)
    return ThreadChoice(1, cpus, 1, len(models), params, "entity augmentation: one thread")


def secondary_asked(override: int) -> int:
    """The run config's ``threads`` as a secondary takes it: the value is the primary's, so at
    most the CPUs this process may use (0: none asked)."""
    return min(override, usable_cpus()) if override > 0 else 0


def entity_aug_secondary(override: int) -> int:
    """An Entity Augmentation secondary's threads: one, or what the run config asks
    (:func:`secondary_asked`)."""
    return secondary_asked(override) or 1


def use(choice: ThreadChoice, tag: str = "", cpu: bool = True) -> ThreadChoice:
    """Apply ``choice`` to torch's intra-op threads and the BLAS/OpenMP pools (threadpoolctl); the
    choice is logged the first time and whenever it changes. ``cpu`` (the party trains on the CPU):
    torch's deterministic algorithms too, so a run repeats bit for bit at any thread count (with
    two threads or more, index_put_'s accumulation, the backward of an indexed gather, adds floats
    atomically in whatever order the threads reach them; deterministic, it adds them in order)."""
    global _current
    import torch  # lazy: app/run_record.py's readers and the unit tests of the pure choice need no torch
    from flwr.common.logger import log
    from threadpoolctl import threadpool_limits

    if cpu and not torch.are_deterministic_algorithms_enabled():
        # CPU: no op refuses; warn_only for any new one. torch.use_deterministic_algorithms also sets
        # its compiler's flag, importing torch._inductor and torch._dynamo (~1.1 s of CPU in every
        # party's process); nothing here compiles, so the eager ops' flag is set alone
        torch._C._set_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # its NaN fill of every torch.empty costs time
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    if _current is None or _current.threads != choice.threads:
        threadpool_limits(limits=choice.threads)
    if _current != choice:
        log(INFO, "%s%s", f"{tag} " if tag else "", choice.line())
    _current = choice
    return choice


def recorded() -> dict | None:
    """The choice in force in this process (summary.json's ``threads``), None before any."""
    if _current is None:
        return None
    import torch  # lazy: as in use()

    return {
        **asdict(_current),
        "torch": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


def same_host(grid) -> int:
    """Processes of the run on the ServerApp's machine: a simulation's (an InMemoryGrid) are its
    SuperNodes' and its own; a deployment's SuperNodes are their own machines' (1)."""
    if type(grid).__name__ != "InMemoryGrid":
        return 1
    return 1 + len(list(grid.get_node_ids()))
