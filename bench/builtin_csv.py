"""Writes a built-in data set as an own-data folder (parties.toml and a CSV per party), so that the
default `fedsim train --dataset csv` can be scored on it as on a user's data: each party's features
as the built-in loader prepared them (numbers, one-hot columns), its identifiers, the primary's
label. ``--rows`` as the built-in's own `n-rows` samples them (hdb, house, game: the primary's
rows, every secondary row kept; frog, synthetic: the records before they are split into parties).

    python -m bench.builtin_csv DATASET OUT [--rows 1500] [--seed 0]

For the leave-one-data-set-out table of docs/fedsim-attn.md (bench.recipe_heldout on each folder).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import PartyTable, VFLDataset
from datasets.registry import DatasetOptions, load_dataset


def _frame(table: PartyTable, prefix: str) -> pd.DataFrame:
    ids = np.asarray(table.identifiers)
    ids = ids.reshape(len(ids), -1)
    cols = {f"id_{i}": ids[:, i] for i in range(ids.shape[1])}
    cols |= {f"{prefix}{j}": table.features[:, j] for j in range(table.features.shape[1])}
    return pd.DataFrame(cols)


def _section(name: str, table: PartyTable, n_ids: int) -> list[str]:
    kind = "string" if table.id_kind == "string" else "numeric"
    ids = json.dumps([f"id_{i}" for i in range(n_ids)])
    return [
        f"[{name}]",
        f'file = "{name.split(".")[-1]}.csv"',
        f"identifiers = {ids}",
        f'kind = "{kind}"',
        'numeric = "rest"',
        "",
    ]


def write(data: VFLDataset, out: Path) -> str:
    """Writes ``out``; returns a one-line description."""
    out.mkdir(parents=True, exist_ok=True)
    prim = _frame(data.primary, "x")
    prim["label"] = data.labels if data.task == "regression" else data.labels.astype(np.int64)
    prim.to_csv(out / "primary.csv", index=False)
    n_ids = np.asarray(data.primary.identifiers).reshape(data.primary.n_rows, -1).shape[1]
    spec = [f'task = "{data.task}"', 'label = "label"']
    spec += [f'metric = "{data.metric}"'] if data.metric else []
    spec += ["", *_section("primary", data.primary, n_ids)]
    for i, (name, table) in enumerate(sorted(data.secondaries.items())):
        party = f"s{i}_{name}".replace(".", "_")
        _frame(table, f"{party}_f").to_csv(out / f"{party}.csv", index=False)
        spec += _section(f"secondaries.{party}", table, n_ids)
    (out / "parties.toml").write_text("\n".join(spec))
    sizes = ", ".join(f"{t.name} {t.n_rows}" for t in data.secondaries.values())
    return f"{data.name}: {data.primary.n_rows} primary rows ({data.task}), secondaries {sizes}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", type=int, default=1500, help="the built-in's n-rows (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    data = load_dataset(args.dataset, args.data_dir, DatasetOptions(n_rows=args.rows, seed=args.seed))
    print("wrote", args.out, "-", write(data, args.out))


if __name__ == "__main__":
    main()
