"""Seconds per optimiser step: torch_optimizer.Lamb (the old optimiser) vs strategies.lamb.Lamb,
on hdb's models: the primary's SimilarityModel (57 primary features, one secondary
"school" with a 100-wide cut, K = 50, CNN merge, hdb's ModelConfig; fedsim_attn, the default
method, and fedsim, the paper's) and the school party's local model (4 features).

Only ``step()`` is timed, on fixed random gradients; the two optimisers alternate in rounds (which
goes first alternates too) and the median of the rounds' per-step times is printed.

    python -m bench.lamb_step [--rounds 15] [--steps 50] [--device cpu|cuda] [--dtype float32|float64] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import platform
import statistics
import time

import torch
import torch_optimizer

from app.dataset_defaults import DATASET_DEFAULTS
from strategies.lamb import Lamb
from strategies.vfl.model import SimilarityModel, local_model

HDB = DATASET_DEFAULTS["hdb"].model
D_PRIMARY, D_SCHOOL, K, LR, WD = 57, 4, 50, 1e-3, 1e-4  # hdb's features; its k, lr, weight decay


def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    attn = dataclasses.replace(HDB, attention=True)
    return {
        "primary, fedsim_attn": SimilarityModel(D_PRIMARY, {"school": HDB.cut_dim}, K, 1, attn, True),
        "primary, fedsim": SimilarityModel(D_PRIMARY, {"school": HDB.cut_dim}, K, 1, HDB, True),
        "school (secondary)": local_model(D_SCHOOL, HDB),
    }


def per_step(opt: torch.optim.Optimizer, steps: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        opt.step()
    sync()
    return (time.perf_counter() - t) / steps


def compare(model: torch.nn.Module, rounds: int, steps: int, device: torch.device, dtype: torch.dtype) -> dict:
    model = model.to(device=device, dtype=dtype)
    twin = copy.deepcopy(model)
    for p, q in zip(model.parameters(), twin.parameters()):
        p.grad = torch.randn_like(p) * 1e-2
        q.grad = p.grad.clone()
    opts = {
        "torch_optimizer": torch_optimizer.Lamb(model.parameters(), lr=LR, weight_decay=WD),
        "strategies.lamb": Lamb(twin.parameters(), lr=LR, weight_decay=WD),
    }
    for opt in opts.values():  # warm-up: state allocated, kernels loaded
        per_step(opt, 3, device)
    times: dict[str, list[float]] = {name: [] for name in opts}
    for r in range(rounds):
        for name in list(opts) if r % 2 == 0 else list(opts)[::-1]:
            times[name].append(per_step(opts[name], steps, device))
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    return {name: statistics.median(ts) for name, ts in times.items()} | {"max_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=50, help="steps per optimiser per round")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "no GPU used"
    print(
        f"{platform.node()}: {os.cpu_count()} cores, {gpu}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads, {args.dtype}, {args.rounds} rounds x {args.steps} steps"
    )
    print(
        "| model | tensors | parameters | torch_optimizer.Lamb ms/step | strategies.lamb ms/step | speed-up "
        "| max abs diff after |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, model in models().items():
        n_t, n_p = len(list(model.parameters())), sum(p.numel() for p in model.parameters())
        r = compare(model, args.rounds, args.steps, device, dtype)
        old, new = r["torch_optimizer"] * 1e3, r["strategies.lamb"] * 1e3
        print(
            f"| {name} | {n_t} | {n_p:,} | {old:.3f} | {new:.3f} | {old / new:.2f}x | {r['max_diff']:.1e} |", flush=True
        )


if __name__ == "__main__":
    main()
