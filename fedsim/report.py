"""`fedsim report RUN`: one run's summary printed, and its learning curve and weight-gate plots
written into the run folder (learning_curve.png, weight_gate.png). Without RUN: the sweeps'
report (experiments/report.py, its options)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def is_run(path: str) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").exists()


def one_run(run_dir: Path) -> int:
    from app.run_record import read_metrics
    from app.run_status import problem

    why = problem(run_dir)
    if why:
        print(f"fedsim report: {why}", file=sys.stderr)
        return 1
    summary = json.loads((run_dir / "summary.json").read_text())
    for line in headline(summary):
        print(line)
    rows = read_metrics(run_dir)
    print(f"plots: {learning_curve(rows, summary, run_dir / 'learning_curve.png')}")
    gate = weight_gate(run_dir, run_dir / "weight_gate.png")
    print(f"plots: {gate}" if gate else "plots: no weight gate in this run (method or gate off)")
    return 0


def headline(summary: dict) -> list[str]:
    fmt = lambda m: " ".join(f"{k}={v:.4f}" for k, v in m.items())  # noqa: E731
    lines = [f"{summary.get('dataset')} {summary.get('method')}: best epoch {summary['best_epoch']} of "
             f"{summary.get('epochs_run', '?')} | val {fmt(summary['val'])} | test {fmt(summary['test'])}"]
    from app.run_record import hyperparameter_lines

    if summary.get("stopping"):
        lines.append(f"stopping: {summary['stopping']['reason']}")
    lines += ["hyperparameters (value, source):", *hyperparameter_lines(summary.get("hyperparameters") or {})]
    lines += [f"warning: {w}" for w in summary.get("warnings", [])]
    if summary.get("privacy"):
        from linkage.privacy import report_lines

        lines += report_lines(summary["privacy"])
    elif summary.get("method") != "solo":
        lines.append("privacy: no report (run-config privacy-report = false, or the linkage service sent none)")
    return lines


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def learning_curve(rows: list[dict], summary: dict, out: Path) -> Path:
    """Training loss and the validation key metric per epoch, the best epoch marked."""
    plt = _plt()
    key = next(iter(summary["val"]))
    epochs = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(epochs, [r["train_loss"] for r in rows], label="training loss", color="tab:blue")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax2 = ax.twinx()
    ax2.plot(epochs, [r["val"][key] for r in rows], label=f"validation {key}", color="tab:orange")
    ax2.set_ylabel(f"validation {key}")
    ax2.axvline(summary["best_epoch"], color="grey", linestyle=":", label="best epoch")
    fig.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def weight_gate(run_dir: Path, out: Path) -> Path | None:
    """Each secondary's weight gate at the best epoch: the weight a neighbour gets against its
    (standardised, noisy) similarity."""
    import torch

    from strategies.vfl.gates import WeightGate

    path = run_dir / "kept" / "primary.pt"
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    prefixes = sorted({k.split("weight_gate.")[0] for k in state if ".weight_gate." in k})
    if not prefixes:
        return None
    plt = _plt()
    sims = torch.linspace(-4, 4, 200)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for prefix in prefixes:
        gate = WeightGate()
        gate.load_state_dict({k[len(prefix) + len("weight_gate."):]: v for k, v in state.items()
                              if k.startswith(prefix + "weight_gate.")})
        with torch.no_grad():
            ax.plot(sims, gate(sims[None, :])[0], label=prefix.split(".")[1] if "." in prefix else prefix)
    ax.set_xlabel("similarity (standardised)")
    ax.set_ylabel("weight")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
