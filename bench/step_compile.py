"""Candidates for the fixed-shape step: the primary's model under torch.compile, and
under CUDA graphs (torch.compile mode "reduce-overhead"), against the eager step, on the
in-process protocol (bench.step_profile's pieces: train_epoch behind a LocalChannel).

    python -m bench.step_compile --dataset hdb --steps 200 [--modes eager,default,reduce-overhead]

A compiled step needs fixed shapes, so each candidate pads the step's distinct-token embeddings
(U, c) to the batch's B * K pairs (zero rows no index points at; their gradient is zero and is
cut off again): every full batch then has one shape. Measured per mode: the first ``--steps``
steps (compile and graph capture included) and the next ``--steps`` (steady state); and the
largest difference of the steady steps' losses from eager's (dropout drawn as eager does:
inductor's fallback_random). The secondaries' local models stay eager in every mode.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.step_profile import _pieces
from experiments.runner import parse_overrides
from strategies.vfl.primary import PrimaryParty, Step
from strategies.vfl.protocol import Exchange, train_epoch
from strategies.vfl.wire import GradBlock


class PaddedStrategy(PrimaryParty):
    """The primary's step with each party's embeddings padded to B * K rows (fixed shapes)."""

    def backward(self, step: Step, emb: dict) -> tuple[torch.Tensor, dict[str, GradBlock]]:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the graphs' last outputs are done with
        self.model.train()
        leaves = {}
        for p in self.parties:
            e = torch.as_tensor(emb[p], device=self.device, dtype=self.dtype)  # (U, c)
            full = torch.zeros(step.index[p].numel(), e.shape[1], device=self.device, dtype=self.dtype)  # (B * K, c)
            full[: len(e)] = e
            leaves[p] = full.requires_grad_(True)
        out = self.model(self.x[step.rows], leaves, step.index, step.sims)
        loss = self.head.loss(out, step.target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self._seen = None  # no observer here; PrimaryParty.update steps the optimiser
        return loss.detach(), {
            p: GradBlock(step.tokens[p], leaves[p].grad[: len(step.tokens[p])]) for p in self.parties
        }


def run(values: dict, mode: str, steps: int) -> tuple[float, float, list[float]]:
    """(seconds of the first ``steps`` steps, of the next ``steps``, the next steps' losses)."""
    torch.manual_seed(0)
    strategy, channel, batches, plan = _pieces(values)
    if mode != "eager":
        strategy.__class__ = PaddedStrategy
        strategy.model = torch.compile(strategy.model, mode=mode, dynamic=False)
    sync = torch.cuda.synchronize if strategy.device.type == "cuda" else (lambda: None)
    seconds, losses = [], []
    for part in (batches[:steps], batches[steps : 2 * steps]):
        losses = []
        t0 = time.perf_counter()
        train_epoch(Exchange(strategy, channel, plan), part, losses, lambda *a: None)
        sync()
        seconds.append(time.perf_counter() - t0)
    return seconds[0], seconds[1], losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="hdb")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--modes", default="eager,default,reduce-overhead")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more run-config values (TOML)")
    args = ap.parse_args()
    torch._inductor.config.fallback_random = True  # dropout draws as eager's, so losses compare
    values = {"dataset": args.dataset, "epochs": 1, **parse_overrides(args.set)}
    print(f"run config {values}; {torch.get_num_threads()} torch threads")
    print("| mode | first steps s (compile incl.) | steady ms/step | max loss diff vs eager |")
    print("|---|---|---|---|")
    eager = None
    for mode in args.modes.split(","):
        try:
            first, steady, losses = run(values, mode, args.steps)
        except Exception as e:  # a candidate that fails is a measured result too
            print(f"| {mode} | failed: {type(e).__name__}: {str(e).splitlines()[0][:150]} | | |", flush=True)
            continue
        eager = losses if mode == "eager" else eager
        diff = max(abs(a - b) for a, b in zip(losses, eager)) if eager else float("nan")
        print(f"| {mode} | {first:.2f} | {1000 * steady / args.steps:.2f} | {diff:.2e} |", flush=True)


if __name__ == "__main__":
    main()
