"""Would aggregating the K neighbours' embeddings before the primary sees them hide the secondary's
records from a primary holding a register? Measured on a user's CSVs, with no training.

The mechanism examined: a party that knows the links (the linkage service) pools each primary
record's K linked secondary rows into one vector, pooled_i = sum_k w_ik g_(N_ik), and the primary
sees only pooled_i (no tokens, no per-link rows). The attacker holds every true identifier of the
secondary (the register) and its own records', so it knows every record's K neighbours N and
their similarities; it does not know the weights, and fits them from a family (a softmax over the
similarities at temperature beta plus a bonus b on rank 1) by least squares over a grid, each
fit solving for every secondary row's vector g at once (m records, n rows: an m x n system),
ridge-regularised, the grid point and ridge chosen by generalised cross-validation.

The vector g stands for what split learning sends per record today (its embedding): here the
secondary's own standardised features, the best case for the mechanism being a linear map of
them. Weights examined: uniform (AvgSim), a softmax over the similarities, and 0.8 on rank 1
with the rest uniform (what fedsim_attn learned: 0.81-0.88 on rank 1, docs/fedsim-attn.md).
Gaussian noise of sigma (in units of g's per-column spread) may be added to each pooled vector.

Reported per weighting and sigma: the rows' error ratio (the attacker's squared error over the
mean-predictor's, per linked row; the bound docs/privacy.md states is >= 0.5), the share of rows
whose recovered vector is nearest its own true one among all rows (named), and the pooled
vectors' signal to noise (their spread over sigma^2), which is what the model would learn from.

    python -m bench.aggregate_unmixing [--data-dir examples/housing] [--k 50] [--sigmas 0 0.1 0.3 1 3]
    python -m bench.aggregate_unmixing --dataset hdb [--rows 3000]   (a built-in set: its K, its first secondary)

Loaded as a run loads them (app.data), linked by the project's exact top-K and spacing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from linkage.exact import topk
from linkage.protection import spacing

BETAS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)  # the attacker's grid of softmax temperatures (per spacing)
BONUSES = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)  # its grid of logit bonuses on rank 1
RIDGES = (0.0, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 1e2, 1e3, 1e4)  # its ridge strengths


def read_parties(dataset: str, data_dir: str, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(primary identifiers (m, 2), first secondary's identifiers (n, 2), its features (n, d)
    standardised, constant columns dropped, the run's K) as the project loads them: a built-in
    set at ``rows`` primary rows, or "csv" (a parties.toml in ``data_dir``)."""
    from app.config import RunConfig  # lazy: the data stack, only when the bench runs
    from app.data import load_data  # lazy: the data stack, only when the bench runs

    cfg = RunConfig.of(dataset=dataset, data_dir=data_dir, n_rows=rows)
    ds = load_data(cfg)
    table = ds.secondaries[sorted(ds.secondaries)[0]]
    feats = np.asarray(table.features, np.float64)
    feats = feats[:, feats.std(0) > 0]
    feats = (feats - feats.mean(0)) / feats.std(0)
    ids = np.asarray(ds.primary.identifiers, np.float64), np.asarray(table.identifiers, np.float64)
    return ids[0], ids[1], feats, cfg.resolve().k


def neighbours(prim: np.ndarray, sec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each primary record's K nearest secondary rows (m, K), most similar first, and their
    similarities (m, K): minus the distance in the secondary's spacing (linkage.protection)."""
    dist, idx = topk("euclidean", prim, sec, k)  # (m, K) each, nearest first
    return idx, -dist / spacing(sec, "euclidean")


def weights(sims: np.ndarray, beta: float, bonus: float) -> np.ndarray:
    """(m, K) softmax over beta x similarity plus ``bonus`` on rank 1 (column 0)."""
    logits = beta * (sims - sims[:, :1])
    logits[:, 0] += bonus
    w = np.exp(logits - logits.max(1, keepdims=True))
    return w / w.sum(1, keepdims=True)


def mixing(idx: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """The dense (m, n) matrix W with pooled = W g."""
    mat = np.zeros((len(idx), n))
    np.add.at(mat, (np.repeat(np.arange(len(idx)), idx.shape[1]), idx.ravel()), w.ravel())
    return mat


def unmix(idx: np.ndarray, sims: np.ndarray, pooled: np.ndarray, n: int) -> np.ndarray:
    """The attacker: for each (beta, bonus) on its grid and each ridge strength, the ridge
    least-squares g (n, d) (shrunk toward the columns' mean, 0); it keeps the fit with the best
    generalised cross-validation score (which needs neither g nor sigma). Rows no record links
    stay at 0 (never pooled, never scored)."""
    best, best_g = np.inf, None
    for beta in BETAS:
        for bonus in BONUSES:
            u, s, vt = np.linalg.svd(mixing(idx, weights(sims, beta, bonus), n), full_matrices=False)
            proj = u.T @ pooled  # (r, d)
            for lam in RIDGES:
                shrink = s**2 / (s**2 + lam)  # (r,)
                resid = float((pooled**2).sum() - ((1 - (1 - shrink) ** 2) * (proj**2).sum(1)).sum())
                gcv = len(pooled) * resid / (len(pooled) - shrink.sum()) ** 2
                if gcv < best:
                    best, best_g = gcv, vt.T @ ((s / (s**2 + lam))[:, None] * proj)
    return best_g


def score(g_hat: np.ndarray, g: np.ndarray, linked: np.ndarray) -> tuple[float, float]:
    """(error ratio, share named) over the linked rows."""
    t, e = g[linked], g_hat[linked]
    ratio = float(((e - t) ** 2).sum() / ((t - t.mean(0)) ** 2).sum())
    nearest = np.argmin(((e[:, None, :] - t[None, :, :]) ** 2).sum(-1), axis=1)
    return ratio, float((nearest == np.arange(len(t))).mean())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=Path("examples/housing"))
    ap.add_argument("--dataset", default="", help="a built-in set with coordinates (hdb, house) instead of --data-dir")
    ap.add_argument("--rows", type=int, default=3000, help="the built-in set's primary rows")
    ap.add_argument("--k", type=int, default=0, help="0: the run's K (a built-in set's, or the default on CSVs)")
    ap.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.1, 0.3, 1.0, 3.0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)  # the bench's own noise; it protects no party
    prim, sec, g, k = read_parties(args.dataset or "csv", "" if args.dataset else str(args.data_dir), args.rows)
    args.k = args.k or k
    idx, sims = neighbours(prim, sec, args.k)
    linked = np.unique(idx)
    print(
        f"{args.dataset or args.data_dir}: {len(prim)} primary records, {len(sec)} secondary rows ({len(linked)} linked), "
        f"K = {args.k}, g: {g.shape[1]} standardised columns"
    )
    print("| weighting | sigma | pooled signal / noise | error ratio (bound >= 0.5) | rows named |")
    print("|---|---|---|---|---|")
    for name, (beta, bonus) in {
        "uniform (AvgSim)": (0.0, 0.0),
        "softmax over similarity": (1.0, 0.0),
        "0.8 on rank 1": (0.0, None),
    }.items():
        w = weights(sims, beta, 0.0 if bonus is not None else np.log(0.8 * (args.k - 1) / 0.2))
        clean = mixing(idx, w, len(sec)) @ g  # (m, d)
        for sigma in args.sigmas:
            pooled = clean + sigma * rng.standard_normal(clean.shape)
            snr = float(clean.var(0).mean() / sigma**2) if sigma else float("inf")
            ratio, named = score(unmix(idx, sims, pooled, len(sec)), g, linked)
            print(f"| {name} | {sigma:g} | {snr:.3g} | {ratio:.3f} | {100 * named:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
