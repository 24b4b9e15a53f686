"""Attack success at each privacy level, per data set, through the linkage service's own code.

For each data set and level (off / standard / strict) the dataset's identifiers are linked as
the service links them (a JobStore whose operator floor is the level, the secondaries stating
nothing more), with the dataset's K and the seed's training rows; the job's own privacy report
gives the release attacks on a sample of 300 tokens (register identification from the
similarities and from which records link a token, greedy,
trilateration of the links, the links' centroid). Then the query-averaging attack with the
whole default budget (coordinates only): for the T most linked secondary records, jittered
query records around each one's linked records are asked (batches of 256, halved at each
refusal) until the service refuses three single records (at most 200 queries a target), and every similarity to the target (the release's and
the queries') is trilaterated. Reported: the median localisation error in radii (the bound: at
least 1) and in the dataset's spacings.

    python -m bench.privacy_defaults [--datasets hdb house game frog housing] [--levels off standard strict]
                                     [--targets 12] [--seed 0]

Accuracy at each level is measured by training (conf/sweeps/privacy_levels.toml), not here.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from app.config import RunConfig
from app.data import load_data
from app.vfl.linking import metric_of
from linkage.protection import spacing
from linkage.store import read_primary, read_secondary
from linkage_server.floors import Floors
from linkage_server.jobs import JobError, JobParams, JobStore
from linkage_server.limits import QueryLimits
from linkage_server.queries import Queries
from linkage_server.uploads import to_npy

DATASETS = {  # name -> run-config values that load it
    "hdb": {"dataset": "hdb"},
    "house": {"dataset": "house"},
    "game": {"dataset": "game"},
    "frog": {"dataset": "frog"},
    "housing": {"dataset": "csv", "data_dir": "examples/housing"},
}
LEVELS = ("off", "standard", "strict")


def linked(root: Path, values: dict, level: str, seed: int):
    """(store, job, ds, metric) of the dataset linked by a job store at the level's floor."""
    cfg = RunConfig.of(**values, seed=seed, out_dir=str(root / "runs"))
    ds, settings = load_data(cfg), cfg.resolve()
    metric = metric_of(ds)
    store = JobStore(root / f"svc-{level}", floors=Floors(level))
    job, _ = store.create("primary", sorted(ds.secondaries))
    own = np.asarray(ds.primary.identifiers)
    store.upload(job, "primary", to_npy(own.astype(str) if own.dtype == object else own))
    store.upload(job, "primary", to_npy(np.asarray(ds.split.train, np.int64)), train_rows=True)
    for party, table in ds.secondaries.items():
        ids = np.asarray(table.identifiers)
        store.upload(
            job, party, to_npy(ids.astype(str) if ids.dtype == object else ids)
        )  # strings as the CLI sends them
    # off: the attacks counted within the same radius as the other levels (half the spacing), not the paper's 0.5
    radius = 0.0 if level != "off" else min(spacing(t.identifiers, metric) for t in ds.secondaries.values()) / 2
    store.start(job, JobParams(metric, settings.k, radius=radius))
    store.run(job)
    meta = store.meta(job)
    if meta["state"] != "done":
        raise SystemExit(f"{values} at {level}: the job failed: {meta['error']}")
    return store, job, ds, metric


def trilaterate(points: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """The least-squares position from noisy distances to known points: the privacy report's own
    trilateration (linkage.attacks.best_fit: Levenberg-Marquardt from the centroid and the linear fit)."""
    from linkage.attacks import best_fit  # lazy: scipy's optimiser, for the averaging attack only

    return best_fit(np.zeros(len(points), np.int64), points, dist, points.mean(axis=0, keepdims=True))[0]


def averaging_attack(
    store: JobStore, job: str, ds, party: str, targets: int, rng, max_queries: int = 200
) -> tuple[list[float], int]:
    """Per target, the localisation error after the whole query budget (or ``max_queries`` queries
    of up to 256 records, where no floor bounds them: level off); and the queries answered."""
    folder, queries = store.folder(job), Queries(store, QueryLimits())
    released = read_primary(folder / "results" / "primary.npz").links[party]
    row_of_token = read_secondary(folder / "results" / f"secondary-{party}.npz", party).row_of_token
    base = np.asarray(ds.secondaries[party].identifiers, np.float64)
    primary = np.asarray(ds.primary.identifiers, np.float64)
    mean, std = released.sim_mean, released.sim_std
    tokens = np.argsort(-np.bincount(released.tokens.ravel(), minlength=len(base)))[:targets]
    errors, answered = [], 0
    for token in tokens:
        hit = released.tokens == token
        points, dist = [primary[hit.any(axis=1)]], [-(released.sims[hit].astype(np.float64) * std + mean)]
        spread = max(float(np.median(np.linalg.norm(points[0] - points[0].mean(axis=0), axis=1))), 1e-9)
        batch, refusals, asked = 256, 0, 0
        while refusals < 3 and asked < max_queries:  # halve the batch at each refusal, down to one record
            probes = points[0][rng.integers(len(points[0]), size=batch)]
            probes = probes + rng.normal(0, spread / 4, probes.shape)
            asked += 1
            try:
                data, _ = queries.answer(job, to_npy(probes), None)
            except JobError as e:
                if e.status != 429:
                    raise
                refusals += batch == 1
                batch = max(1, batch // 2)
                continue
            answered += 1
            got = read_primary(io.BytesIO(data)).links[party]
            mask = got.tokens == token
            points.append(probes[mask.any(axis=1)])
            dist.append(-(got.sims[mask].astype(np.float64) * std + mean))
        guess = trilaterate(np.concatenate(points), np.concatenate(dist))
        errors.append(float(np.linalg.norm(guess - base[row_of_token[token]])))
    return errors, answered


def measured(name: str, level: str, store: JobStore, job: str, ds, metric: str, args, rng) -> list[dict]:
    """Per secondary of the job: its protection, the release attacks' success (% of the sampled
    tokens) and, on coordinates, the query-averaging attack's median error in radii."""
    meta, out = store.meta(job), []
    for party, entry in sorted(meta["privacy"]["parties"].items()):
        got = meta["protection"]["parties"][party]
        attacks = {a: 100 * next(iter(v.values())) for a, v in entry["attacks"].items()}
        cell = {"data": name, "level": level, "secondary": party, "spacing": got["spacing"], "radius": entry["radius"]}
        cell |= {"noise_per_distance": entry["noise_per_distance"], "attacks_pct": attacks, "seed": args.seed}
        if metric == "euclidean" and np.asarray(ds.secondaries[party].identifiers).shape[1] <= 3:
            errors, answered = averaging_attack(store, job, ds, party, args.targets, rng)
            cell |= {"averaging_radii": float(np.median(errors) / entry["radius"]), "queries_answered": answered}
        out.append(cell)
    return out


def line(c: dict) -> str:
    """One table row of :func:`measured`'s cell."""
    a = c["attacks_pct"]
    avg = f"{c['averaging_radii']:.2f} radii ({c['queries_answered']} queries)" if "averaging_radii" in c else "n/a"
    pct = [
        f"{a[k]:.1f} %" if k in a else "-" for k in ("dictionary", "membership", "greedy", "aggregation", "centroid")
    ]
    spacing = f"{c['spacing']:.4}" if c["spacing"] else "-"
    return " | ".join(
        [
            "",
            c["data"],
            c["level"],
            c["secondary"],
            spacing,
            f"{c['noise_per_distance']:.4g}",
            f"{c['radius']:.4g}",
            *pct,
            avg,
            "",
        ]
    ).strip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--levels", nargs="+", default=list(LEVELS), choices=LEVELS)
    ap.add_argument("--targets", type=int, default=12, help="records the averaging attack goes after")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also append each row as JSON here (bench.privacy_frontier reads it)")
    args = ap.parse_args(argv)
    print(
        "| data | level | secondary | spacing | noise on a distance | radius | register named: similarities | "
        "register named: who links it | greedy within radius | trilateration within radius | centroid within radius | query averaging: median error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.datasets:
        for level in args.levels:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                store, job, ds, metric = linked(Path(tmp), DATASETS[name], level, args.seed)
                cells = measured(name, level, store, job, ds, metric, args, np.random.default_rng(args.seed))
            print("\n".join(map(line, cells)), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.writelines(json.dumps(c) + "\n" for c in cells)
            print(f"<!-- {name} {level}: {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
