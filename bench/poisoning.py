"""Poisoning split learning with finite but huge (or misshapen) tensors: what the other party's
run does with them, without and with the receivers' checks (strategies/wire_checks.py).

The real protocol (strategies.vfl.protocol.fit) and the real parties of a small hdb run, over a
channel that hands messages over as host arrays (as Flower and the direct transport do) and
tampers with the secondary's honest replies. "without checks" replaces the check by a pass-through,
as the code before them behaved; "with checks" is the code as it is.

    python -m bench.poisoning
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from unittest import mock

import numpy as np

from app.config import RunConfig
from app.vfl.inprocess import _local_parties, _setup
from app.vfl.parties import build_strategy
from strategies.vfl import protocol
from strategies.vfl.channel import LocalChannel, host
from strategies.vfl.protocol import fit

CFG = dict(dataset="hdb", n_rows=400, k=5, batch_size=64, epochs=1, max_steps=6, steps_per_exchange=1)


class Tampered(LocalChannel):
    """The secondaries' honest replies as host arrays, ``tamper`` applied to party ``who``'s from
    the ``after``-th on (training or evaluation)."""

    tensors = False

    def __init__(self, parties, who, tamper, after=0) -> None:
        super().__init__(parties)
        self.who, self.tamper, self.after, self.replies = who, tamper, after, 0

    def step(self, apply, embed, save=None, lr_scale=1.0):
        out = {p: replace(r, emb=host(r.emb)) for p, r in super().step(apply, embed, save, lr_scale).items()}
        self.replies += 1
        if self.replies > self.after:
            out[self.who] = replace(out[self.who], emb=self.tamper(out[self.who].emb))
        return out

    def send(self, apply, embed, save=None, lr_scale=1.0):
        return self.step(apply, embed, save, lr_scale)


def run(tmp: Path, tamper, after: int = 0):
    """(records, step losses) of the small run with the secondary's replies tampered."""
    cfg, settings, ds, linkage, job, plan = _setup(RunConfig.of(**CFG, out_dir=str(tmp)), None)
    strategy = build_strategy(ds, linkage, cfg, settings)
    channel = Tampered(_local_parties(cfg, ds, job, linkage), "school", tamper, after)
    return fit(strategy, channel, ds.split, plan)


def _set(value, dtype=None):
    def tamper(emb):
        emb = emb.astype(dtype) if dtype else emb.copy()
        emb[0, 0] = value
        return emb

    return tamper


CASES = {
    "embedding 3.4e38 (float32 max)": (_set(np.float32(3.4e38)), 0),
    "one 1e300 cell in float64": (_set(1e300, np.float64), 0),
    "five rows extra": (lambda e: np.vstack([e, e[:5]]), 0),
    "complex64": (lambda e: e.astype(np.complex64), 0),
    "3.4e38 only in the evaluation reply": (_set(np.float32(3.4e38)), 5),  # 5 training replies, then eval
}


def outcome(tmp: Path, tamper, after: int) -> str:
    try:
        records, losses = run(tmp, tamper, after)
    except Exception as e:  # noqa: BLE001 - the outcome is what this measures
        return f"refused: {type(e).__name__}: {str(e)[:110]}"
    val = records[-1].val if records else {}
    return f"returned normally: losses {np.round(losses[:3], 4).tolist()}..., val {val}"


def main() -> None:
    print("| tampered reply | without checks | with checks |")
    print("|---|---|---|")
    for name, (tamper, after) in CASES.items():
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            with mock.patch.object(protocol, "check_block", lambda values, expect: values):
                before = outcome(Path(a), tamper, after)
            after_ = outcome(Path(b), tamper, after)
        print(f"| {name} | {before} | {after_} |", flush=True)


if __name__ == "__main__":
    main()
