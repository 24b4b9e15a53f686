"""Entity Augmentation's exchange at each privacy level: the secondary's label attack on the
gradients it receives, and the accuracy, in process on a classification set (digits by default).

The attacker is secondary "left" following the protocol and keeping what it receives: per
entity the sum of the unit gradient rows it was sent, then the cosine attack for classes
(strategies/vfl/exchange_attacks.py ``class_direction``: 4 known labels per class, scored on
the other entities it received gradients for; chance 0.10 guessing uniformly among digits' 10).
``--grad-noise`` / ``--shield`` replace the standard level's two values for a frontier point
(the level tables of strategies/shields.py, in this process only).

    python -m bench.ea_exchange [--dataset digits] [--levels off standard strict] [--seeds 0 1 2]
                                [--grad-noise X --shield Y]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from app.config import RunConfig
from app.entity_aug.inprocess import run_ea_in_process
from app.entity_aug.parties import ea_data
from strategies import shields
from strategies.entity_aug.secondary import SecondaryParty
from strategies.vfl import exchange_attacks as attacks

ATTACKER = "left"


class Received:
    """What the attacking secondary keeps: per entity the sum of its unit gradient rows."""

    def __init__(self) -> None:
        self.sums: dict[int, np.ndarray] = {}

    def spy(self, apply):
        def wrapped(party: SecondaryParty, ids: np.ndarray, grad: np.ndarray) -> None:
            if party.name == ATTACKER:
                unit = grad / np.maximum(np.linalg.norm(grad, axis=1, keepdims=True), 1e-30)  # (B, c)
                for i, u in zip(ids.tolist(), unit):
                    self.sums[i] = self.sums.get(i, 0) + u
            return apply(party, ids, grad)

        return wrapped

    def attack(self, labels: np.ndarray, n_classes: int, seed: int) -> float:
        ids = np.array(sorted(self.sums))
        truth = labels[ids].astype(float)
        known = attacks.known_rows(truth, "multiclass", np.random.default_rng(seed), n_classes)
        pred = attacks.class_direction(np.stack([self.sums[i] for i in ids]), truth, known)
        rest = np.setdiff1d(np.arange(len(ids)), known)
        return float((pred[rest] == truth[rest]).mean())


def one_run(dataset: str, level: str, seed: int) -> dict:
    received, apply = Received(), SecondaryParty.apply
    SecondaryParty.apply = received.spy(apply)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = RunConfig.of(dataset=dataset, mode="entity-aug", seed=seed, out_dir=tmp, privacy=level)
            summary = run_ea_in_process(cfg, Path(tmp) / "run")
            data = ea_data(cfg)
    finally:
        SecondaryParty.apply = apply
    return {
        "level": level,
        "seed": seed,
        "val": summary["val"]["accuracy"],
        "test": summary["test"]["accuracy"],
        "attack": round(received.attack(data.labels, data.n_classes, seed), 4),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--levels", nargs="+", default=["off", "standard", "strict"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--grad-noise", type=float, default=None, help="the standard level's gradient noise, here")
    ap.add_argument("--shield", type=float, default=None, help="the standard level's activation shield, here")
    args = ap.parse_args(argv)
    if args.grad_noise is not None:
        shields.GRAD_NOISE["standard"] = args.grad_noise
    if args.shield is not None:
        shields.EA_EMBED_NOISE["standard"] = args.shield
    for level in args.levels:
        runs = [one_run(args.dataset, level, seed) for seed in args.seeds]
        for r in runs:
            print(json.dumps(r), flush=True)
        mean = {k: round(statistics.mean(r[k] for r in runs), 4) for k in ("val", "test", "attack")}
        print(f"{args.dataset} {level}: val {mean['val']} test {mean['test']} attack {mean['attack']}", flush=True)


if __name__ == "__main__":
    main()
