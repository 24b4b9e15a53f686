"""A local deployment's record: its folder, dataset, parties and the processes ``up`` started
(DIR/deploy.json), and where each party keeps its own files under DIR (deploy.commands acts on it).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.localsim import QUIET_ENV
from deploy.processes import Proc
from files.atomic import write_atomic
from linkage.protection import DEFAULT_LEVEL, LEVELS

CONNECTION = "fedsim-deploy"  # the SuperLink connection's name in the deployment's Flower config
PRIMARY = "primary"
SECRET = "linkage-secret"  # the primary's party secret of the deployment's job, 0600 in its own folder


@dataclass(frozen=True)
class LinkRequest:
    """What `deploy link` asks of the linkage service: K and the job's shape (tau: the primary's
    attack bound, None = the floors'; layout; the rows and seed the run will sample), the noise's
    radius and composition (docs/privacy.md), the floor every secondary states (None: each its own
    level from `up`) and whether the parties upload encoded identifiers (private mode)."""

    k: int
    tau: float | None = None
    seed: int = 0
    layout: str = "independent"
    n_rows: int = 0
    radius: float = 0.0
    compose: bool = False
    privacy: str | None = None
    private: bool = False

    def run_values(self) -> dict:
        """The run-config values a run on the job must share (deploy.commands.run_values)."""
        return {"k": self.k, "tau": self.tau or 1.0, "seed": self.seed, "n-rows": self.n_rows, "layout": self.layout}


@dataclass
class Deployment:
    folder: str
    dataset: str
    data_dir: str
    secure: bool
    parties: list[str]  # the secondaries, one SuperNode each
    superlink: Proc | None = None
    nodes: dict[str, Proc] = field(default_factory=dict)
    service: Proc | None = None
    job: str = ""  # the linkage job of `link`
    link_params: dict = field(default_factory=dict)  # run-config values the job was linked with
    privacy: dict[str, str] = field(default_factory=dict)  # each secondary's own level ({} = the default)

    # ------------------------------------------------------------------ paths

    @property
    def root(self) -> Path:
        return Path(self.folder)

    @property
    def creds(self) -> Path:
        return self.root / "credentials"

    @property
    def home(self) -> Path:
        return self.root / "flwr-home"

    def party_dir(self, party: str) -> Path:
        """What a party keeps on its own host: its copy of the linkage result, its feature
        cache, checkpoints and final models (node config; never a folder a message names)."""
        return self.root / "parties" / party

    def linkage_dir(self, party: str) -> Path:
        return self.party_dir(party) / "linkage"

    @property
    def service_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://127.0.0.1:{self.service.port}"

    @property
    def verify(self) -> str | bool:
        return str(self.creds / "ca.crt") if self.secure else False

    def env(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            **QUIET_ENV,
            "FLWR_HOME": str(self.home),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        }

    def save(self) -> None:
        write_atomic(self.root / "deploy.json", json.dumps(asdict(self), indent=2).encode())

    @classmethod
    def load(cls, folder: Path) -> "Deployment":
        path = Path(folder) / "deploy.json"
        if not path.exists():
            raise SystemExit(f"no deployment at {folder} (no deploy.json); run `python -m deploy up {folder}`")
        raw = json.loads(path.read_text())
        raw["superlink"] = Proc(**raw["superlink"]) if raw["superlink"] else None
        raw["service"] = Proc(**raw["service"]) if raw["service"] else None
        raw["nodes"] = {p: Proc(**v) for p, v in raw["nodes"].items()}
        return cls(**raw)


def party_levels(spec: str, parties: list[str]) -> dict[str, str]:
    """Each secondary's own privacy level from ``--privacy``: one level for all ("strict") or
    per party ("bus=strict,school=off"; a party not named states none and gets the default).
    An unknown level or party, or a party named twice, is refused by name."""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    if len(items) == 1 and "=" not in items[0]:
        items = [f"{p}={items[0]}" for p in parties]
    levels = dict.fromkeys(parties, DEFAULT_LEVEL)
    named: set[str] = set()
    for item in items:
        party, _, level = (x.strip() for x in item.partition("="))
        if party not in levels or party in named:
            why = "named twice" if party in named else f"not one of the deployment's secondaries {parties}"
            raise SystemExit(f"--privacy: party {party!r} is {why}")
        if level not in LEVELS:
            raise SystemExit(f"--privacy: level {level!r} for {party!r} is not one of {list(LEVELS)}")
        levels[party] = level
        named.add(party)
    return levels


def node_config(dep: Deployment, party: str) -> str:
    """A party's own node config: its name, its privacy level (its embedding defence; a
    deployment recorded before levels gets the default) and every folder it reads or writes."""
    own = dep.party_dir(party)
    return (
        f'party="{party}" privacy="{dep.privacy.get(party, DEFAULT_LEVEL)}" data-dir="{dep.data_dir}" '
        f'linkage-dir="{dep.linkage_dir(party)}" cache-dir="{own / "cache"}" '
        f'checkpoint-dir="{own / "checkpoints"}" model-dir="{own / "models"}"'
    )
