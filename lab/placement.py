"""What the operator places on each lab host before training: the public dataset's folder (or,
for parties' own CSVs, each party's own file and parties.toml only), and each party's own files
of the linkage job it ran through the linkage service on root's loopback."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lab.hosts import PRIMARY, Host, Lab


def place_data(lab: Lab, hosts: list[Host], dataset: str, data_dir: Path) -> None:
    """The operator copies the public dataset's folder into each home (data/<its folder>)."""
    from datasets.registry import data_folder  # lazy: the dataset table, for its folder name

    folder = data_folder(dataset)
    if not folder:
        return  # the dataset reads no data folder
    for src in sorted(p for p in (Path(data_dir) / folder).rglob("*") if p.is_file()):
        for host in hosts:
            lab.copy_in(host, src, Path("data") / folder / src.relative_to(Path(data_dir) / folder))


def place_own_files(lab: Lab, hosts: dict[str, Host], folder: Path) -> None:
    """Dataset csv: each party's home gets data/parties.toml and its own file of ``folder``
    (the primary's [primary] file, a secondary's its own), nothing of another party's."""
    from datasets.csv_parties import read_spec  # lazy: pandas, for parties.toml's file names
    from datasets.options import SPEC  # lazy: with read_spec

    spec = read_spec(Path(folder))
    files = {PRIMARY: spec["primary"]["file"], **{p: s["file"] for p, s in spec["secondaries"].items()}}
    for party, host in hosts.items():
        lab.copy_in(host, Path(folder) / SPEC, Path("data") / SPEC)
        lab.copy_in(host, Path(folder) / files[party], Path("data") / files[party])


def place_linkage(lab: Lab, dep, hosts: dict[str, Host]) -> None:
    """Each party's own result files of the operator's job (``dep``, a deploy.deployment.Deployment)
    into its home's linkage/, nothing of another party's."""
    for party, host in hosts.items():
        own = dep.linkage_dir(party)
        for src in sorted(p for p in own.rglob("*") if p.is_file()):
            lab.copy_in(host, src, Path("linkage") / src.relative_to(own))


def link_as_operator(lab: Lab, hosts: dict[str, Host], dataset: str, data_dir: Path, k: int, n_rows: int) -> dict:
    """The linkage job through the linkage service on root's loopback (deploy.commands.link);
    each party's own result files go to its home's linkage/ only. Returns the link values."""
    from deploy.commands import link, stop_all  # lazy: the linkage client and pandas
    from deploy.deployment import Deployment, LinkRequest  # lazy: with deploy.commands
    from deploy.servers import linkage_service  # lazy: with deploy.commands

    folder = Path(tempfile.mkdtemp(prefix="lab-link-"))
    parties = [p for p in hosts if p != PRIMARY]
    dep = Deployment(str(folder), dataset, str(Path(data_dir).resolve()), False, parties)
    try:
        linkage_service(dep, 120)
        link(dep, LinkRequest(k=k, n_rows=n_rows), timeout=600)
        place_linkage(lab, dep, hosts)
        return dict(dep.link_params)
    finally:
        stop_all(dep)
        shutil.rmtree(folder, ignore_errors=True)
