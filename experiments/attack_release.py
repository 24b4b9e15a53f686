"""Attack what the linkage releases: play the primary of a coordinate dataset (hdb,
house) with its release and its own identifiers, run the paper's greedy attack and the
aggregation attack (linkage/attacks.py), and score both against the secondary's true locations.

    python -m experiments.attack_release hdb --tau 1 0.999 0.99 0.9 0.5 [--n-rows N] [--seed 0]
        [--k K] [--project none|m|km] [--radii 50 100 500]

The data is loaded and linked as a run does it (app.data.load_data, app.vfl.linking.run_linkage:
the run config's tau sets the noise; the in-process service's job secrets live in a temporary
folder). A tau that Theorem 2 cannot reach (linkage.noise.sigma_from_tau) is reported as such.

--project m|km: before linking, both parties' [lat, lon] are projected to local metres (or km),
equirectangular about the primary's mean position (north, east), as parties would preprocess
their identifiers to give tau a unit: Theorem 2 counts a distance as guessed when it is right to
half a unit, so on degrees (1/2 degree = 55 km) no tau below 1 is reachable. Errors are scored
in metres: haversine between [lat, lon] estimates and truth (none), else the projected Euclidean
distance (equirectangular: within 1 % of haversine over a city).

Rows per tau: the paper's greedy attack (one pair per token, |Q| = 1); the aggregation attack
(trilateration over every pair of a token); and "links only", the centroid of the records linked
to each token, which uses no similarity at all (what noise on the similarities cannot hide).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time

import numpy as np

from app.config import RunConfig
from app.data import load_data
from app.vfl.linking import run_linkage
from linkage.attacks import EARTH_RADIUS_M, aggregation_attack, greedy_attack, haversine_m, reidentification
from linkage.contracts import LinkageError

DATASETS = ("hdb", "house")
# metres per identifier unit (none: degrees, a degree of latitude)
UNITS_M = {"none": math.pi * EARTH_RADIUS_M / 180.0, "m": 1.0, "km": 1000.0}
RADII_M = (50.0, 100.0, 500.0)


def projected(ds, unit_m: float):
    """The dataset with every party's (n, 2) [lat, lon] identifiers as (n, 2) [north, east] in
    units of unit_m metres, equirectangular about the primary's mean position."""
    lat0, lon0 = ds.primary.identifiers.mean(axis=0)
    per_degree = math.pi * EARTH_RADIUS_M / 180.0 / unit_m

    def project(ids: np.ndarray) -> np.ndarray:
        return np.stack(
            [(ids[:, 0] - lat0) * per_degree, (ids[:, 1] - lon0) * per_degree * math.cos(math.radians(lat0))], axis=1
        )

    tables = {p: dataclasses.replace(t, identifiers=project(t.identifiers)) for p, t in ds.secondaries.items()}
    return dataclasses.replace(
        ds, primary=dataclasses.replace(ds.primary, identifiers=project(ds.primary.identifiers)), secondaries=tables
    )


def error_m(est: np.ndarray, truth: np.ndarray, project: str) -> np.ndarray:
    """(T,) metres between estimated and true (T, 2) identifiers."""
    if project == "none":
        return haversine_m(est, truth)
    return np.linalg.norm(est - truth, axis=1) * UNITS_M[project]


def attack_release(ds, cfg: RunConfig, project: str, radii) -> dict:
    """Link at cfg.link.tau, attack every secondary's release, score; one dict per party."""
    t0 = time.monotonic()
    result = run_linkage(ds, cfg, cfg.resolve())
    t_link = time.monotonic() - t0
    ids = ds.primary.identifiers
    out = {}
    for party, link in sorted(result.primary.links.items()):
        t1 = time.monotonic()
        guesses = {
            "greedy (paper, one pair)": greedy_attack(link, ids, np.random.default_rng([cfg.train.seed, 19])),
            "aggregation": aggregation_attack(link, ids),
            "links only (centroid)": aggregation_attack(link, ids, min_links=2**62),
        }
        t_attack = time.monotonic() - t1
        truth = ds.secondaries[party].identifiers[result.secondaries[party].row_of_token]  # (n, 2) scoring only
        errs = {name: error_m(g.location, truth[g.tokens], project) for name, g in guesses.items()}  # each (T,)
        agg = guesses["aggregation"]
        out[party] = {
            "sigma": link.sigma,
            "noise_m": link.sigma * link.sim_std * UNITS_M[project],
            "links": agg.links,
            "distinct": agg.distinct,
            "link_s": t_link,
            "attack_s": t_attack,
            "scores": scores(errs, agg.fallback, radii),
        }
    return out


def scores(errs: dict[str, np.ndarray], fallback: np.ndarray, radii) -> dict[str, dict]:
    """Each attack's re-identification; the aggregation's also apart for the tokens it trilaterated
    and those it left at their links' centroid (fallback (T,) bool), when there are any."""
    out = {name: reidentification(err, radii) for name, err in errs.items() if name != "links only (centroid)"}
    if fallback.any():
        err, n_few = errs["aggregation"], int(fallback.sum())
        out[f"- of which {len(err) - n_few} tokens with >= 3 links"] = reidentification(err[~fallback], radii)
        out[f"- of which {n_few} tokens with < 3 links (centroid)"] = reidentification(err[fallback], radii)
    out["links only (centroid)"] = reidentification(errs["links only (centroid)"], radii)
    return out


def rows_md(tau: float, party_out: dict, radii) -> list[str]:
    """Markdown rows of one tau: one per attack."""
    r = party_out
    links = f"{np.median(r['links']):.0f} / {r['links'].max()}"
    distinct = f"{np.median(r['distinct']):.0f}"
    lines = []
    for i, (name, score) in enumerate(r["scores"].items()):
        head = (
            f"| {tau:g} | {r['sigma']:.4g} | {r['noise_m']:.3g} | {links} | {distinct} | " if i == 0 else "| | | | | | "
        )
        cells = " | ".join(f"{100 * score['within'][float(x)]:.1f} %" for x in radii)
        secs = f"{r['link_s']:.1f} + {r['attack_s']:.1f}" if i == 0 else ""
        lines.append(f"{head}{name} | {cells} | {score['median_m']:.3g} | {secs} |")
    return lines


def header_md(radii) -> list[str]:
    within = " | ".join(f"within {x:g} m" for x in radii)
    return [
        f"| tau | sigma | noise on a distance (m) | links per token (median / max) | distinct ids per token "
        f"(median) | attack | {within} | median error (m) | s (link + attacks) |",
        "|" + "---|" * (8 + len(radii)),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.attack_release",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("dataset", choices=DATASETS)
    ap.add_argument("--tau", type=float, nargs="+", default=[1.0, 0.999, 0.99, 0.9, 0.5])
    ap.add_argument("--n-rows", type=int, default=0, help="a sample of the primary's records (0 = all)")
    ap.add_argument("--seed", type=int, default=0, help="the data sample/split and the greedy attacker's draws")
    ap.add_argument("--k", type=int, default=0, help="neighbours per record (0 = the dataset's default)")
    ap.add_argument(
        "--project",
        choices=sorted(UNITS_M),
        default="none",
        help="identifiers as they are (degrees) or projected to metres / km before linking",
    )
    ap.add_argument("--radii", type=float, nargs="+", default=list(RADII_M), help="re-identification radii in metres")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="attack-release-") as tmp:
        cfg = RunConfig.of(dataset=args.dataset, n_rows=args.n_rows, seed=args.seed, k=args.k, out_dir=tmp)
        ds = load_data(cfg)
        if args.project != "none":
            ds = projected(ds, UNITS_M[args.project])
        unit = "degrees" if args.project == "none" else args.project
        print(
            f"{args.dataset}: {ds.primary.n_rows} primary records, "
            + ", ".join(f"{p} {t.n_rows} records" for p, t in ds.secondaries.items())
            + f"; K = {cfg.resolve().k}; identifiers in {unit}"
        )
        lines, skipped = header_md(args.radii), []
        for tau in args.tau:
            try:
                out = attack_release(ds, cfg.replace(tau=tau), args.project, args.radii)
            except LinkageError as e:
                skipped.append(f"- tau = {tau:g}: {e}")
                continue
            for party, party_out in out.items():
                lines += rows_md(tau, party_out, args.radii)
        print("\n".join(lines))
        if skipped:
            print("\nNot reachable:\n" + "\n".join(skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
