"""The seed attack: the primary rebuilds its linkage job's randomness.

Until the service drew a job's randomness from its own secret, every draw came from
``default_rng([seed, 7])`` with a seed the primary chose when starting the job: first the noise
(m, P) on the standardised similarities, then the token permutation of each secondary. The job
status shows every party the row counts, K and sigma, so the primary could replay those draws,
map every token back to the secondary's row and subtract the noise.

This script plays the primary with exactly what it receives from a real service on 127.0.0.1:
its result file (tokens, noisy similarities, the job's statistics) and the job status. It tries
the seeds it could have chosen (or guessed), keeps the guess whose replayed noise makes the most
records' similarities consistent (descending in distance order, which a right guess always does),
and is judged against the truth, which only this script (not the attacker) knows: the
secondary's token -> row map and the noise-free similarities.

    python -m bench.seed_attack [--m 400 --n 150 --k 3 --tau 0.5 --seed 3 --guesses 64]
"""

from __future__ import annotations

import argparse
import itertools
import json
import secrets
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

from linkage.store import load_primary, load_secondary
from linkage_server.client import LinkageClient, create_job
from linkage_server.local import free_port, local_service


@dataclass(frozen=True)
class AttackResult:
    seed_guess: int
    consistent_rows: float  # the attacker's own score of its guess (fraction of records it explains)
    token_accuracy: float  # released tokens mapped to the secondary's true row
    chance: float  # 1 / n: a random guess of the row
    sim_error_released: float  # mean |released similarity - noise-free similarity|
    sim_error_attacked: float  # mean |attacker's denoised similarity - noise-free similarity|
    sigma: float


def replay(seed: int, m: int, pool: int, n: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """The draws of the seeded release: noise (m, P) in search order, then row_of_token (n,)."""
    rng = np.random.default_rng([seed, 7])
    noise = rng.normal(0.0, sigma, size=(m, pool)) if sigma > 0 else np.zeros((m, pool))
    token_of_row = rng.permutation(n)
    return noise, np.argsort(token_of_row)


def denoise(released: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Assign each released similarity (m, K) descending to a noise draw (m, K) in search order so
    that the denoised values fall with the distance rank; of several, the tightest. Returns the
    denoised values in released order and which rows some assignment explains (m,)."""
    m, k = released.shape
    best = np.full((m, k), np.nan)
    spread = np.full(m, np.inf)
    for perm in itertools.permutations(range(k)):  # perm[j]: the released position of draw j
        z = released[:, perm] - noise  # (m, K) denoised, in search order
        ok = (np.diff(z, axis=1) <= 1e-5).all(axis=1) & (z[:, 0] - z[:, -1] < spread)
        spread = np.where(ok, z[:, 0] - z[:, -1], spread)
        best[ok] = z[ok][:, np.argsort(perm)]
    explained = np.isfinite(spread)
    return np.where(explained[:, None], best, released), explained


def attack(
    sims: np.ndarray, tokens: np.ndarray, n: int, sigma: float, guesses
) -> tuple[int, float, np.ndarray, np.ndarray]:
    """The attacker's best guess, from what the primary holds: (seed, score, row_of_token, denoised)."""
    best = None
    for seed in guesses:
        noise, row_of_token = replay(seed, len(sims), sims.shape[1], n, sigma)
        denoised, explained = denoise(sims.astype(np.float64), noise)
        if best is None or explained.mean() > best[1]:
            best = (seed, float(explained.mean()), row_of_token, denoised)
    return best


def judge(guess, tokens, sims, true_row_of_token, query, base, mean, std, sigma) -> AttackResult:
    seed, score, row_of_token, denoised = guess
    rows = true_row_of_token[tokens]  # (m, K) the true secondary row of each released neighbour
    clean = (-np.linalg.norm(query[:, None, :] - base[rows], axis=2) - mean) / std  # (m, K)
    return AttackResult(
        seed,
        score,
        float((row_of_token[tokens] == rows).mean()),
        1.0 / len(base),
        float(np.abs(sims - clean).mean()),
        float(np.abs(denoised - clean).mean()),
        sigma,
    )


def planted(m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0, 100, size=(n, 2))
    query = base[rng.integers(0, n, m)] + rng.normal(0, 2.0, size=(m, 2))
    return query, base


def start(url: str, job: str, secret: str, body: dict) -> dict:
    """Start as the primary, offering the seed; a service that refuses seeds is asked without one."""
    headers = {"Authorization": f"Bearer {secret}"}
    r = httpx.post(f"{url}/jobs/{job}/start", json=body, headers=headers, timeout=30)
    if r.status_code == 422 and "seed" in r.text:
        r = httpx.post(
            f"{url}/jobs/{job}/start", json={k: v for k, v in body.items() if k != "seed"}, headers=headers, timeout=30
        )
    r.raise_for_status()
    return r.json()


def run(
    m: int = 400,
    n: int = 150,
    k: int = 3,
    tau: float = 0.5,
    seed: int = 3,
    guesses: int = 64,
    workdir: Path | None = None,
) -> AttackResult:
    """One job on a fresh local service, attacked by its primary; judged by this script."""
    query, base = planted(m, n)
    admin = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(workdir or tmp)
        with local_service(root / "service", free_port(), admin) as url:
            made = create_job(url, admin, "p", ["s"])
            job, keys = made["job"], made["secrets"]
            with LinkageClient(url, job, "p", keys["p"]) as p, LinkageClient(url, job, "s", keys["s"]) as s:
                p.upload(query)
                s.upload(base)
                start(url, job, keys["p"], {"metric": "euclidean", "k": k, "tau": tau, "radius": 0.5, "seed": seed})
                status = p.wait(timeout=120)
                p.fetch(root / "primary")
                s.fetch(root / "judge")  # the truth: the secondary's own map, never the attacker's
        link = load_primary(root / "primary").links["s"]
        true_map = load_secondary(root / "judge", "s").row_of_token
    rows_of_s = status["uploads"]["s"]["rows"] if "s" in status.get("uploads", {}) else n
    seeds = [seed, *(g for g in range(guesses) if g != seed)]  # the seed it offered first, then small seeds
    guess = attack(link.sims, link.tokens, rows_of_s, link.sigma, seeds)
    return judge(
        guess, link.tokens, link.sims.astype(np.float64), true_map, query, base, link.sim_mean, link.sim_std, link.sigma
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=400, help="primary records (default: %(default)s)")
    ap.add_argument("--n", type=int, default=150, help="secondary records (default: %(default)s)")
    ap.add_argument("--k", type=int, default=3, help="neighbours per record (default: %(default)s)")
    ap.add_argument("--tau", type=float, default=0.5, help="attack bound of the job (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=3, help="the seed the primary offers (default: %(default)s)")
    ap.add_argument("--guesses", type=int, default=64, help="seeds 0..N-1 tried (default: %(default)s)")
    a = ap.parse_args()
    result = run(a.m, a.n, a.k, a.tau, a.seed, a.guesses)
    print(json.dumps(asdict(result), indent=1))


if __name__ == "__main__":
    main()
