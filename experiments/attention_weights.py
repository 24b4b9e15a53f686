"""What a trained fedsim_attn run learned: its attention's weight per neighbour rank and on the
null slot, and on the neighbour that is the record's exact twin (identical identifier) or, on
synthetic sets, its true row. Validation records only.

    python -m experiments.attention_weights runs/sweeps/attn_game/game/fedsim_attn/s0 [--out table.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from app.node import simulated_linkage_dir
from app.vfl.predict import _embed_here, link_here, open_kept
from linkage.store import load_secondary
from strategies.vfl.primary import PrimaryParty

RANK_BINS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 1000))


@torch.no_grad()
def weights_of(run_dir: Path) -> tuple[np.ndarray, np.ndarray, object]:
    """(q, K + 1) attention weights of the validation records' sorted neighbours and null slot
    (the first secondary's path), (q, K) their rows at that party, and the run's data."""
    kept = open_kept(run_dir)
    ds, party = kept.ds, sorted(kept.ds.secondaries)[0]
    rows = ds.split.val
    seconds: dict[str, float] = {}
    linkage = link_here(kept, ds.primary.identifiers[rows], seconds)
    lookup = _embed_here(kept, linkage, seconds)
    on = (kept.cfg.torch_device(), kept.cfg.torch_dtype())
    strategy = PrimaryParty(kept.model, kept.head, linkage, ds.primary.features[rows], np.zeros(len(rows)), on=on)
    unsorted = strategy.attention(np.arange(len(rows)), lookup)[party]  # (q, K + 1), the linkage's order
    order = np.argsort(-linkage.links[party].sims, axis=1, kind="stable")  # (q, K) most similar first
    w = np.concatenate([np.take_along_axis(unsorted, order, 1), unsorted[:, -1:]], axis=1)  # (q, K + 1)
    maps = {p: np.asarray(m) for p, m in _row_maps(kept).items()}
    sec_rows = maps[party][np.take_along_axis(linkage.links[party].tokens, order, 1)]  # (q, K) sorted
    return w, sec_rows, (ds, party, rows)


def _row_maps(kept) -> dict[str, np.ndarray]:
    folder = simulated_linkage_dir(kept.cfg, kept.meta["job_id"])
    return {p: load_secondary(folder, p).row_of_token for p in kept.ds.secondaries}


def twin_rank(ds, party: str, rows: np.ndarray, sec_rows: np.ndarray) -> np.ndarray:
    """(q,) the 0-based rank of the record's twin among its neighbours (-1: none): its true row on
    synthetic sets, else a neighbour with the identical identifier."""
    if ds.true_match:
        hit = sec_rows == ds.true_match[party][rows][:, None]
    else:
        ids = ds.secondaries[party].identifiers
        hit = np.array([[_same(ids[j], ds.primary.identifiers[i]) for j in sr] for i, sr in zip(rows, sec_rows)])
    return np.where(hit.any(axis=1), hit.argmax(axis=1), -1)


def _same(a, b) -> bool:
    return bool(np.all(np.asarray(a) == np.asarray(b)))


def table(w: np.ndarray, ranks: np.ndarray, what: str) -> str:
    k = w.shape[1] - 1
    lines = [
        "| | "
        + " | ".join(f"rank {a}" if a == b else f"ranks {a}-{min(b, k)}" for a, b in RANK_BINS if a <= k)
        + " | null slot |",
        "|---" * (1 + sum(a <= k for a, _ in RANK_BINS) + 1) + "|",
    ]

    def row(name, ww):
        cells = [ww[:, a - 1 : min(b, k)].sum(axis=1).mean() for a, b in RANK_BINS if a <= k]
        return f"| {name} ({len(ww)}) | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {ww[:, -1].mean():.3f} |"

    lines.append(row("all records", w))
    for r in range(3):
        if (ranks == r).any():
            lines.append(row(f"{what} at rank {r + 1}", w[ranks == r]))
    if (ranks == -1).any():
        lines.append(row(f"no {what} among the K", w[ranks == -1]))
    has = ranks >= 0
    on_twin = w[has, ranks[has]].mean() if has.any() else float("nan")
    lines.append(f"\nMean weight on the {what} where the K hold it: {on_twin:.3f} ({has.mean():.1%} of records).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.attention_weights",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    w, sec_rows, (ds, party, rows) = weights_of(args.run)
    what = "true row" if ds.true_match else "exact twin"
    text = f"{args.run} (validation records; party {party})\n\n" + table(w, twin_rank(ds, party, rows, sec_rows), what)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
