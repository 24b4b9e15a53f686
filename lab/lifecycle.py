"""The whole lifecycle across separate hosts: link, train, predict, each organisation on
its own ``lab.hosts.Lab`` host with only its own data.

The organisations' data is a shipped dataset written out as the parties' own CSVs (``dataset =
"csv"``, one ``parties.toml`` each, docs/own-data.md): every home gets ``data/parties.toml`` and
its own CSV, nothing else. Then, each step on its own host as its own user:

1. linkage (lab/linking.py): the service on its host, each party's `fedsim link` from its own;
2. training (lab/training.py): the SuperLink + ServerApp on the primary's host, a SuperNode on
   each secondary's, TLS + node authentication, S = 1 over the direct transport;
3. predict: the primary asks the service for its new records' links (`fedsim query`) and runs
   `flwr run` in predict mode; each SuperNode embeds with the model it kept in its own home.

    python -m lab.lifecycle --base /tmp/lab [--n-rows 1500] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lab import linking, training
from lab.hosts import Lab

SERVICE, PRIMARY = linking.SERVICE, linking.PRIMARY
RUN = training.RUN_NAME
IDS = ["lat", "lon"]


@dataclass(frozen=True)
class Exported:
    """Per party its folder (parties.toml + its own CSV), and the primary's new records to predict."""

    folders: dict[str, Path]
    new_records: Path
    parties: list[str]  # the secondaries


def _frame(ids: np.ndarray, features: np.ndarray, prefix: str) -> pd.DataFrame:
    cols = {name: ids[:, i] for i, name in enumerate(IDS)}
    cols.update({f"{prefix}{j}": features[:, j] for j in range(features.shape[1])})
    return pd.DataFrame(cols)


def export_parties(dataset: str, data_dir: Path, out: Path, n_rows: int, seed: int = 0) -> Exported:
    """A shipped dataset with 2-D numeric identifiers as each party's own CSV and parties.toml."""
    from datasets import load_dataset  # lazy: pandas loaders, for the export only
    from datasets.registry import DatasetOptions  # lazy: with load_dataset

    ds = load_dataset(dataset, data_dir, DatasetOptions(seed=seed, n_rows=n_rows))
    spec = [f'task = "{ds.task}"', 'label = "label"', "[primary]", 'file = "primary.csv"']
    spec += ['identifiers = ["lat", "lon"]', 'numeric = "rest"']
    for p in sorted(ds.secondaries):
        spec += [f"[secondaries.{p}]", f'file = "{p}.csv"', 'identifiers = ["lat", "lon"]', 'numeric = "rest"']
    primary = _frame(ds.primary.identifiers, ds.primary.features, "x").assign(label=ds.labels)
    frames = {PRIMARY: primary, **{p: _frame(t.identifiers, t.features, "s") for p, t in ds.secondaries.items()}}
    folders = {}
    for party, frame in frames.items():
        folders[party] = out / party
        folders[party].mkdir(parents=True)
        (folders[party] / "parties.toml").write_text("\n".join(spec) + "\n")
        frame.to_csv(folders[party] / f"{party}.csv", index=False, float_format="%.9g")
    new = out / "new-records.csv"
    primary.drop(columns="label").iloc[ds.split.test[:20]].to_csv(new, index=False, float_format="%.9g")
    return Exported(folders, new, sorted(ds.secondaries))


def place(lab: Lab, exported: Exported) -> None:
    """Each organisation's operator puts its own folder in its home (data/), nothing else."""
    for party, folder in exported.folders.items():
        for f in sorted(folder.iterdir()):
            lab.copy_in(lab.hosts[party], f, Path("data") / f.name)
    lab.copy_in(lab.hosts[PRIMARY], exported.new_records, "new-records.csv")


def predict(lab: Lab, url: str, job: str, values: dict, commands: dict, timeout: float = 600.0) -> Path:
    """The primary's new records: their links from the service, then `flwr run` in predict mode
    (``values``: the training's run config, as deploy/predict.py takes the deployment's)."""
    from deploy.predict import predict_values  # lazy: deploy.commands, for predict only

    primary = lab.hosts[PRIMARY]
    query = ["query", *linking.party_args(url, job, PRIMARY), "--csv", "new-records.csv", "--columns", "lat,lon"]
    linking.fedsim(lab, PRIMARY, *query, "--out", "queries/new.npz", timeout=timeout)
    home = primary.home
    asked = predict_values(RUN, home / "new-records.csv", home / "predictions.csv", home / "queries" / "new.npz")
    output = training.flwr_run(lab, primary, {**values, **asked}, commands, timeout)
    if not (primary.home / "predictions.csv").exists():
        raise RuntimeError(f"predict wrote no predictions; its output ends:\n{output[-4000:]}")
    return primary.home / "predictions.csv"


def lifecycle(lab: Lab, exported: Exported, logs: Path, *, epochs: int = 2, k: int = 8, timeout: float = 900.0) -> dict:
    """Link, train and predict across the lab's hosts; what each step gave and each host ran."""
    t0, primary = time.monotonic(), lab.hosts[PRIMARY]
    hosts = {p: lab.hosts[p] for p in exported.parties}
    commands: dict[str, list[list[str]]] = {primary.name: []}
    place(lab, exported)
    url, service = linking.start_service(lab, logs)
    try:
        job = linking.create_job(lab, url, exported.parties)
        linking.link_all(lab, url, job, exported.parties, k, data="data/")
        linked = time.monotonic()
        training.credentials(lab, primary, hosts)
        with training.federation(lab, hosts, logs, commands):
            extra = {"epochs": epochs, "node-timeout": 120.0, "threads": 1}
            values = training.run_values(primary, "csv", {"k": k, "tau": 1.0}, extra)
            summary, run_dir, _ = training.train(lab, values, commands, timeout)
            trained = time.monotonic()
            predictions = predict(lab, url, job, values, commands, timeout)
    finally:
        service.stop()
    seconds = {"link": linked - t0, "train": trained - linked, "predict": time.monotonic() - trained}
    return {"job": job, "summary": summary, "run_dir": run_dir, "predictions": predictions, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="where the homes go (not under a 0700 folder)")
    ap.add_argument("--dataset", default="hdb", help="a shipped dataset with 2-D numeric identifiers")
    ap.add_argument("--data-dir", type=Path, default=training.REPO.parent / "shared" / "data")
    ap.add_argument("--n-rows", type=int, default=1500)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        exported = export_parties(args.dataset, args.data_dir, Path(tmp) / "data", args.n_rows)
        with Lab(args.base, [SERVICE, PRIMARY, *exported.parties]) as lab:
            out = lifecycle(lab, exported, Path(tmp), epochs=args.epochs)
            print(json.dumps({**out, "transfers": [t.__dict__ for t in lab.transfers]}, indent=1, default=str))
            print(Path(out["predictions"]).read_text()[:2000], file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
