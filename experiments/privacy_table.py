"""Attack success against tau, per dataset and encoding: each job linked as a run links
it (app.vfl.linking.link_and_report: the run config's tau and encoding, the in-process service's
fresh secret) and measured by its privacy report (linkage/privacy.py), no training.

    python -m experiments.privacy_table hdb house game --encoding raw bloom --tau 1 0.9 0.5 0.1 0.05
        [--radius 0.5 0.001] [--compose] [--max-tokens 300] [--seed 0] [--n-rows N]

One markdown row per (dataset, encoding, tau) and secondary: sigma, links per secondary record,
and each attack's success on a seeded sample of released tokens: the dictionary attack (record
named exactly, the attacker's dictionary holding every true identifier; in private mode the
attacker encodes it with the parties' shared key) and, for coordinates linked raw, the paper's
greedy attack, trilateration and the links' centroid (located within half an identifier unit,
Theorem 2's event, within the job's privacy radius). --radius: one table per radius (Theorem 2's
success radius in identifier units, linkage.contracts.Defences); --compose: also each with the
composed noise. A tau Theorem 2 cannot reach for a job is listed as such. Rows print as they come.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from app.config import RunConfig
from app.data import load_data
from app.vfl.linking import link_and_report
from linkage.contracts import LinkageError

ATTACKS = ("dictionary", "membership", "greedy", "aggregation", "centroid")
HEADER = [
    "| dataset | encoding | radius | compose | tau | party | sigma | noise per distance | links per record "
    "(median / max) | records attacked | " + " | ".join(ATTACKS) + " | s (link + report) |",
    "|" + "---|" * (11 + len(ATTACKS)),
]


def row(dataset: str, cfg: RunConfig, party: str, e: dict, seconds: float) -> str:
    rate = {name: f"{100 * next(iter(v.values())):.1f} %" for name, v in e["attacks"].items()}
    lc = e["links_per_record"]
    return (
        f"| {dataset} | {cfg.link.encoding} | {cfg.link.privacy_radius:g} | {'yes' if cfg.link.privacy_compose else 'no'} | "
        f"{cfg.link.tau:g} | {party} | {e['sigma']:.4g} | {e['noise_per_distance']:.3g} | {lc['median']:g} / "
        f"{lc['max']} | {e['tokens_attacked']} | "
        + " | ".join(rate.get(a, "-") for a in ATTACKS)
        + f" | {seconds:.1f} |"
    )


def configs(base: RunConfig, encodings, radii, composes, taus):
    for encoding in encodings:
        for radius in radii:
            for compose in composes:
                for tau in taus:
                    yield base.replace(  # tau's own noise, no floor (the table speaks of tau)
                        encoding=encoding, tau=tau, privacy="off", privacy_radius=radius, privacy_compose=compose
                    )


def table(
    datasets, encodings, taus, radii, composes, *, seed: int, n_rows: int, max_tokens: int, out=print
) -> list[str]:
    """Print the table's rows as they come; return the unreachable jobs."""
    skipped = []
    for line in HEADER:
        out(line)
    with tempfile.TemporaryDirectory(prefix="privacy-table-") as tmp:
        for dataset in datasets:
            base = RunConfig.of(dataset=dataset, seed=seed, n_rows=n_rows, out_dir=tmp)
            ds = load_data(base)
            for cfg in configs(base, encodings, radii, composes, taus):
                t0 = time.monotonic()
                try:
                    _, report = link_and_report(ds, cfg, cfg.resolve(), max_tokens=max_tokens)
                except LinkageError as e:
                    skipped.append(
                        f"- {dataset} {cfg.link.encoding} radius {cfg.link.privacy_radius:g} tau = {cfg.link.tau:g}: {e}"
                    )
                    continue
                for party, e in report["parties"].items():
                    out(row(dataset, cfg, party, e, time.monotonic() - t0))
    return skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.privacy_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("datasets", nargs="+")
    ap.add_argument("--encoding", nargs="+", default=["raw", "bloom"], choices=["raw", "bloom"])
    ap.add_argument("--tau", type=float, nargs="+", default=[1.0, 0.9, 0.5, 0.1, 0.05])
    ap.add_argument("--seed", type=int, default=0, help="the data split (and the simulated parties' shared key)")
    ap.add_argument("--n-rows", type=int, default=0, help="a sample of the primary's records (0 = all)")
    ap.add_argument(
        "--radius",
        type=float,
        nargs="+",
        default=[0.5],
        help="Theorem 2's success radius(es), identifier units (0.5: the paper's half unit)",
    )
    ap.add_argument("--compose", action="store_true", help="each job also with composed noise")
    ap.add_argument("--max-tokens", type=int, default=300, help="released tokens attacked per job and party")
    args = ap.parse_args(argv)
    skipped = table(
        args.datasets,
        args.encoding,
        args.tau,
        args.radius,
        [False, True] if args.compose else [False],
        seed=args.seed,
        n_rows=args.n_rows,
        max_tokens=args.max_tokens,
        out=lambda line: print(line, flush=True),
    )
    if skipped:
        print("\nNot reachable:\n" + "\n".join(skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
