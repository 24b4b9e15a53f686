"""The query bisection attack: chosen query records locate a secondary record.

A primary that may query a finished job (``POST /jobs/{job}/query``, linkage.query.query) picks
the query records itself. With pool = K the *set* of K tokens a query returns is noise-free: it
changes exactly where the query crosses the bisector of its K-th and (K+1)-th nearest secondary
records. This script plays that primary in process (linkage.query.query under the job's secret,
the service's own function): from a training record linked to a target token it walks rays,
bisects every change of the returned set to the float's precision (one query record per step),
labels each crossing with the pair of tokens swapped, fits each pair's bisector, and solves the
reflections for every site's position (least squares). The truth (the target's position) is
known to this script only, for scoring.

A second attacker averages instead: N query records scattered near the target, each returned
noisy similarity to the target read as a distance, trilaterated (least squares); the records it
needs to place the target within the job's privacy radius are the "records to locate".

    python -m bench.query_bisection [--n 60 --m 400 --k 3 --radius 0.02 --rays 48 --seed 0]

"before": pool = K (the release of old, passed explicitly); "after": the default pool
(linkage.release.default_pool, K chosen under noise from 4 K with a smoothed edge).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from linkage.contracts import Defences, LinkageError
from linkage.job_secret import operator_secret
from linkage.pipeline import link
from linkage.query import QueryJob, query

TAUS = (1.0, 0.9, 0.5, 0.1)


@dataclass
class Job:
    """A finished job and what the attacker may call: ``ask(points (q, 2))`` -> (tokens, sims)."""

    primary: np.ndarray
    base: np.ndarray
    released: object  # PrimaryLinkage
    maps: dict
    secret: bytes
    pool: int
    asked: int = 0

    def ask(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        got = query(
            np.atleast_2d(points),
            QueryJob({"s": self.base}, self.released, self.maps, pool=self.pool),
            secret=self.secret,
        ).links["s"]
        self.asked += len(np.atleast_2d(points))
        return got.tokens, got.sims

    def truth(self, token: int) -> np.ndarray:
        return self.base[self.maps["s"][token]]


def make_job(*, n: int, m: int, k: int, tau: float, radius: float, compose: bool, pool: int, seed: int) -> Job:
    rng = np.random.default_rng(seed)
    primary, base = rng.uniform(0, 10, (m, 2)), rng.uniform(0, 10, (n, 2))
    secret = operator_secret(seed, f"query-bisection-{tau}-{compose}")
    job = link(primary, {"s": base}, k=k, tau=tau, secret=secret, pool=pool, defences=Defences(radius, compose))
    return Job(primary, base, job.primary, {"s": job.secondaries["s"].row_of_token}, secret, pool)


def target_of(job: Job) -> tuple[int, np.ndarray]:
    """The token the attacker goes after (the most linked one) and where it starts: the centroid
    of the training records linked to it (the attacker's own identifiers)."""
    tokens = job.released.links["s"].tokens
    token = int(np.bincount(tokens.ravel()).argmax())
    return token, job.primary[(tokens == token).any(axis=1)].mean(axis=0)


def crossings(job: Job, a: np.ndarray, b: np.ndarray, budget: int, eps: float) -> list[tuple[frozenset, np.ndarray]]:
    """Every change of the returned set along segment a-b, each bisected to ``eps``: (the two
    tokens swapped, the crossing point)."""
    sets = [frozenset(t.tolist()) for t in job.ask(np.stack([a, b]))[0]]
    found, stack = [], [(a, sets[0], b, sets[1])]
    while stack and job.asked < budget:
        lo, s_lo, hi, s_hi = stack.pop()
        if s_lo == s_hi:
            continue
        if np.linalg.norm(hi - lo) < eps:
            if len(s_lo ^ s_hi) == 2:  # one swap: the point is on that pair's bisector
                found.append((s_lo ^ s_hi, (lo + hi) / 2))
            continue
        mid = (lo + hi) / 2
        s_mid = frozenset(job.ask(mid)[0][0].tolist())
        stack += [(lo, s_lo, mid, s_mid), (mid, s_mid, hi, s_hi)]
    return found


def fit_lines(points: dict) -> dict:
    """pair -> (unit normal, offset) of the line through its crossing points (total least squares)."""
    lines = {}
    for pair, pts in points.items():
        pts = np.array(pts)
        if len(pts) < 2 or np.ptp(pts, axis=0).max() < 1e-9:
            continue
        centre = pts.mean(axis=0)
        normal = np.linalg.svd(pts - centre)[2][-1]
        lines[pair] = (normal, float(normal @ centre))
    return lines


def solve_sites(lines: dict) -> dict:
    """token -> position from bisectors: site u reflected in the line of (u, v) is site v, i.e.
    n.(p_u + p_v) / 2 = c and (p_u - p_v) along n. Linear least squares over every line."""
    sites = sorted({t for pair in lines for t in pair})
    col = {t: i for i, t in enumerate(sites)}
    rows, rhs = [], []
    for (u, v), (normal, offset) in ((tuple(sorted(p)), line) for p, line in lines.items()):
        along = np.array([-normal[1], normal[0]])
        for coef_u, coef_v, vec, value in ((0.5, 0.5, normal, offset), (1.0, -1.0, along, 0.0)):
            row = np.zeros(2 * len(sites))
            row[2 * col[u] : 2 * col[u] + 2] += coef_u * vec
            row[2 * col[v] : 2 * col[v] + 2] += coef_v * vec
            rows.append(row)
            rhs.append(value)
    if not rows:
        return {}
    x = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0]
    return {t: x[2 * col[t] : 2 * col[t] + 2] for t in sites}


def bisection_attack(
    job: Job, *, budget: int, rays: int = 48, reach: float = 1.5, eps: float = 1e-12, seed: int = 0
) -> tuple[int, float]:
    """(query records used, error of the target's position) of the bisection attack."""
    token, start = target_of(job)
    rng, points = np.random.default_rng(seed), {}
    for i in range(rays):
        if job.asked >= budget:
            break
        angle = 2 * np.pi * (i + rng.uniform()) / rays
        origin = start + rng.normal(0, 0.3, 2)
        end = origin + reach * np.array([np.cos(angle), np.sin(angle)])
        for pair, point in crossings(job, origin, end, budget, eps):
            points.setdefault(pair, []).append(point)
    guess = solve_sites(fit_lines(points)).get(token)
    error = float(np.linalg.norm(guess - job.truth(token))) if guess is not None else float("inf")
    return job.asked, error


def trilateration_attack(job: Job, records: int, spread: float = 1.0, seed: int = 0) -> float:
    """Error of the target's position from ``records`` query records scattered around it: each
    returned similarity to the target read back as a distance, least squares (Gauss-Newton)."""
    token, start = target_of(job)
    link = job.released.links["s"]
    probes = start + np.random.default_rng(seed).normal(0, spread, (records, 2))
    tokens, sims = job.ask(probes)
    hit = tokens == token
    if hit.any(axis=1).sum() < 3:
        return float("inf")
    where, dist = probes[hit.any(axis=1)], -(sims[hit].astype(np.float64) * link.sim_std + link.sim_mean)
    guess = where.mean(axis=0)
    for _ in range(50):
        delta = guess - where
        norm = np.maximum(np.linalg.norm(delta, axis=1), 1e-12)
        step = np.linalg.lstsq(delta / norm[:, None], dist - norm, rcond=None)[0]
        guess = guess + step
        if np.linalg.norm(step) < 1e-13:
            break
    return float(np.linalg.norm(guess - job.truth(token)))


def records_to_locate(make, radius: float, ladder=(30, 100, 300, 1000, 3000, 10000), seeds: int = 3) -> str:
    """The fewest records on ``ladder`` with which trilateration places the target within the
    radius (the median over ``seeds`` scatters of probes)."""
    for records in ladder:
        if np.median([trilateration_attack(make(), records, seed=s) for s in range(seeds)]) <= radius:
            return str(records)
    return f">{ladder[-1]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--m", type=int, default=400)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--radius", type=float, default=0.02)
    ap.add_argument("--rays", type=int, default=48)
    ap.add_argument("--budget", type=int, default=6000, help="query records the bisection may use")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(
        f"secondary n={args.n}, primary m={args.m} on a 10 x 10 square, K={args.k}, radius {args.radius}, "
        f"bisection budget {args.budget} records ({args.budget * args.k} records x K)"
    )
    print(
        "| regime | compose | tau | sigma on a distance | bisection: records used | bisection: error | "
        "trilateration: error @ 100 | @ 1000 | records to within the radius |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for regime, pool in (("before (pool = K)", args.k), ("after (default pool)", 0)):
        for compose in (False, True):
            for tau in TAUS:
                row(args, regime, pool, compose, tau)


def row(args, regime: str, pool: int, compose: bool, tau: float) -> None:
    def make() -> Job:
        return make_job(
            n=args.n, m=args.m, k=args.k, tau=tau, radius=args.radius, compose=compose, pool=pool, seed=args.seed
        )

    try:
        job = make()
    except LinkageError as e:
        print(f"| {regime} | {compose} | {tau} | unreachable: {e} |")
        return
    link_s = job.released.links["s"]
    t0 = time.perf_counter()
    used, error = bisection_attack(job, budget=args.budget, rays=args.rays, seed=args.seed)
    tri = [trilateration_attack(make(), r) for r in (100, 1000)]
    print(
        f"| {regime} | {'yes' if compose else 'no'} | {tau} | {link_s.sigma * link_s.sim_std:.3g} | {used} | "
        f"{error:.2g} | {tri[0]:.2g} | {tri[1]:.2g} | {records_to_locate(make, args.radius)} |"
        f" <!-- {time.perf_counter() - t0:.1f} s -->",
        flush=True,
    )


if __name__ == "__main__":
    main()
