"""Attacks on what training exchanges against defences and K: in-process runs (the
protocol every engine runs), each scored by its own exchange-privacy report (the secondary's
label attacks, app/vfl/exchange.py) and, for the primary's feature inversion, by an inversion
model fitted on an auxiliary fifth of each secondary's records (features known to the primary)
from the embeddings the kept secondary model sends, with the run's embedding defence applied.

    python -m experiments.exchange_table --dataset hdb --k 50 --defences none,grad,label,embedding
        --seeds 0,1,2,3,4 [--n-rows N] [--epochs E] [--out rows.jsonl] [--set key=value ...]

Defences (``DEFENCES``; the gradient clip per dataset is the median per-record cut-layer gradient
norm of an undefended run's first 50 steps, training data only: ``CLIP``). One JSON row per run
goes to --out (runs already there are skipped: the table resumes), and the markdown table, per
defence: the test metric (mean, sd, and the paired difference to no defence over the same seeds),
each attack's success (mean over seeds), links per observation and the inversion's error ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from app.config import RunConfig
from app.data import load_data
from app.vfl.inprocess import run_experiment
from app.vfl.parties import build_secondary_model
from experiments.runner import parse_overrides
from strategies.shields import RowShield, secret_generator, split_shield
from strategies.vfl import exchange_attacks as attacks
from strategies.vfl.defences import ClipNoise, clipped_rows

# median per-record gradient norm, first 50 steps of an undefended run (n_rows 6000, seed 0)
CLIP = {"hdb": 0.0085, "game": 0.066, "frog": 0.17}
OFF = {"privacy": "off"}  # each preset alone: no level's defences (linkage noise included) beside it
DEFENCES = {
    "none": lambda ds: OFF,
    "grad": lambda ds: OFF | {"grad-clip": CLIP.get(ds, 0.05), "grad-noise": 1.0},
    "grad4": lambda ds: OFF | {"grad-clip": CLIP.get(ds, 0.05), "grad-noise": 4.0},
    "marvell": lambda ds: OFF | {"marvell": 4.0},
    "label": lambda ds: OFF | {"label-dp": 2.0},
    "embedding": lambda ds: OFF | {"embedding-clip": 1.0, "embedding-noise": 0.1},
    "exchange": lambda ds: OFF | {"exchange-privacy": "standard"},  # the default's exchange, an exact linkage
    "standard": lambda ds: {"privacy": "standard"},  # the default: every mechanism of the level
    "strict": lambda ds: {"privacy": "strict"},
}
ATTACKS = ("norm", "direction", "completion")


def inversion(cfg: RunConfig, run: Path, seed: int) -> dict[str, float]:
    """Per secondary the inversion's error ratio on the kept model's embeddings of every record."""
    ds, settings, out = load_data(cfg), cfg.resolve(), {}
    rng = np.random.default_rng(seed)
    for party, table in ds.secondaries.items():
        model = build_secondary_model(table.n_features, party, cfg, settings)
        state, kept = split_shield(torch.load(run / "kept" / f"{party}.pt", weights_only=True))
        model.load_state_dict(state)
        x = torch.as_tensor(table.features, dtype=torch.float32)
        with torch.no_grad():
            emb = model.to(torch.float32)(x)  # (n, c)
            shield = ClipNoise(cfg.exchange.embedding_clip, cfg.exchange.embedding_noise)
            emb = clipped_rows(emb, shield, secret_generator(emb.device))
            if kept:  # the level's shield as the kept party sends (top-K jobs: no imputed row)
                emb = RowShield.from_state(kept, len(emb), emb[:0]).send(emb, torch.arange(len(emb)))
        aux = np.sort(rng.choice(len(emb), size=max(len(emb) // 5, 10), replace=False))
        out[party] = round(attacks.inversion(emb.numpy(), np.asarray(table.features), aux, seed)["ratio"], 4)
    return out


def baseline(values: dict, seeds: list[int]) -> dict[str, float]:
    """Per secondary the model-completion attack on its raw features instead of its embeddings
    (the same truth and known-label draws): what its own data and a handful of labels give
    without any training. The linkage is the runs' (tau = 1: the same neighbours; only the
    tokens' order differs, which this does not use)."""
    from app.vfl.linking import linkage_job  # lazy: the baseline alone links
    from linkage.store import load_secondary  # lazy: as above

    out: dict[str, list[float]] = {}
    for seed in seeds:
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            cfg = RunConfig.from_flower({**values, "seed": seed, "out-dir": tmp, "privacy-report": False})
            ds, settings = load_data(cfg), cfg.resolve()
            linkage, folder = linkage_job(ds, cfg, settings)
            train = ds.split.train
            for party, table in ds.secondaries.items():
                rows = load_secondary(folder, party).row_of_token[linkage.tokens[party][train]]  # (m, K)
                n = len(table.features)
                truth = attacks.record_truth(rows, ds.labels[train].astype(float), n, ds.task)
                known = attacks.known_rows(truth, ds.task, np.random.default_rng(seed), ds.n_classes)
                score = attacks.completion(np.asarray(table.features), truth, known, ds.task)
                out.setdefault(party, []).append(score)
    return {p: round(statistics.mean(v), 4) for p, v in out.items()}


def one_run(values: dict, seed: int) -> dict:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        cfg = RunConfig.from_flower({**values, "seed": seed, "out-dir": tmp, "privacy-report": False})
        summary = run_experiment(cfg, Path(tmp) / "run")
        metric = next(iter(summary["test"]))
        return {
            "test": summary["test"][metric],
            "metric": metric,
            "epochs": summary["epochs_run"],
            "exchange": summary["exchange_privacy"],
            "inversion": inversion(cfg, Path(tmp) / "run", seed),
        }


def rows_table(rows: list[dict]) -> list[str]:
    """The markdown table of ``rows`` (one per run), per (dataset, K, defence, party)."""
    out = [
        "| dataset | K | defence | test (mean ± sd) | paired diff vs none | seeds | links / observation | "
        + " | ".join(ATTACKS)
        + " | inversion error ratio |",
        "|" + "---|" * (8 + len(ATTACKS)),
    ]
    groups: dict[tuple, list[dict]] = {}
    seen = set()
    for r in rows:  # a run recorded twice (two invocations on one file) counts once
        key = (r["dataset"], r["k"], r["defence"], r["seed"], r.get("n_rows"))
        if key not in seen:
            seen.add(key)
            groups.setdefault((r["dataset"], r["k"], r["defence"]), []).append(r)
    for (dataset, k, defence), runs in sorted(
        groups.items(), key=lambda g: (g[0][0], g[0][1], list(DEFENCES).index(g[0][2]))
    ):
        base = {r["seed"]: r["test"] for r in groups.get((dataset, k, "none"), [])}
        tests = [r["test"] for r in runs]
        diffs = [r["test"] - base[r["seed"]] for r in runs if r["seed"] in base]
        for party in runs[0]["exchange"]["attacks"]:
            a = [r["exchange"]["attacks"][party] for r in runs]
            cells = [_mean([x.get(name) for x in a]) for name in ATTACKS]
            out.append(
                f"| {dataset} | {k or 'default'} | {defence} | {_fmt(tests)} | {_fmt(diffs) if defence != 'none' else '-'} | "
                f"{len(runs)} | {_mean([x.get('links_per_observation') for x in a])} | "
                + " | ".join(cells)
                + f" | {_mean([r['inversion'][party] for r in runs])} |"
            )
    return out


def _mean(values) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.mean(values):.3f}" if values else "-"


def _fmt(values) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4g} ± {sd:.2g}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument(
        "--name", default="", help="the rows' data set name (e.g. housing for --dataset csv); default --dataset"
    )
    ap.add_argument("--k", type=int, default=0, help="0 = the dataset's")
    ap.add_argument("--defences", default="none,grad,label,embedding")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--n-rows", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--out", default="exchange_rows.jsonl")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--baseline", action="store_true", help="only the completion on raw features")
    args = ap.parse_args(argv)
    if args.baseline:
        values = {"dataset": args.dataset, "k": args.k, "n-rows": args.n_rows} | parse_overrides(args.set)
        seeds = list(map(int, args.seeds.split(",")))
        print(f"{args.dataset} K={args.k or 'default'}: completion on raw features {baseline(values, seeds)}")
        return
    out, name = Path(args.out), args.name or args.dataset
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    for defence in args.defences.split(","):
        for seed in map(int, args.seeds.split(",")):
            key = dict(dataset=name, k=args.k, defence=defence, seed=seed, n_rows=args.n_rows)
            if any(all(r.get(f) == v for f, v in key.items()) for r in rows):
                continue
            values = {"dataset": args.dataset, "k": args.k, "n-rows": args.n_rows, "epochs": args.epochs}
            values |= DEFENCES[defence](args.dataset) | parse_overrides(args.set)
            rows.append({**key, **one_run(values, seed)})
            with out.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
            print(json.dumps(rows[-1]), flush=True)
    print("\n".join(rows_table([r for r in rows if r["dataset"] == name and r["n_rows"] == args.n_rows])))


if __name__ == "__main__":
    main()
