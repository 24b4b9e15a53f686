"""`fedsim report RUN`: one run's summary printed, and its learning curve and weight-gate plots
written into the run folder (learning_curve.png, weight_gate.png). Without RUN: the sweeps'
report (experiments/report.py, its options)."""

from __future__ import annotations

import sys
from pathlib import Path

from app.run_files import CURVE, GATE, YARDSTICK, read_json
from app.run_record import hyperparameter_lines, read_metrics
from app.run_status import problem
from fedsim.ensemble_step import RECORD as ENSEMBLE
from fedsim.ensemble_step import kept_members
from fedsim.ensemble_step import lines as ensemble_lines
from fedsim.recipe_search import RECORD as SEARCH
from fedsim.recipe_search import lines as search_lines
from files.atomic import atomic_path
from linkage.privacy import report_lines
from strategies.vfl.exchange_observer import report_lines as exchange_lines
from strategies.vfl.gates import WeightGate
from strategies.vfl.methods import REGISTRY


def is_run(path: str) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").exists()


def one_run(run_dir: Path) -> int:
    try:
        why = problem(run_dir, kept=True)
        if why:
            print(f"fedsim report: {why}", file=sys.stderr)
            return 1
        return _report(run_dir)
    except (OSError, ValueError, KeyError) as e:  # a file of the run missing, cut short or edited: named
        print(f"fedsim report: run {run_dir}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _report(run_dir: Path) -> int:
    summary = read_json(run_dir / "summary.json")
    for line in headline(summary):
        print(line)
    if (run_dir / SEARCH).exists():
        print("\n".join(search_lines(read_json(run_dir / SEARCH))))
    if (run_dir / ENSEMBLE).exists():
        print("\n".join(ensemble_lines(read_json(run_dir / ENSEMBLE))))
    unusable, own = _unpredictable(run_dir)
    if unusable:
        print(f"warning: `fedsim predict` refuses this run as it is: {unusable}")
    if (run_dir / YARDSTICK).exists():
        from fedsim.yardstick import lines  # lazy: scikit-learn, only for a run that has a yardstick

        print("\n".join(lines(read_json(run_dir / YARDSTICK))))
    rows = read_metrics(run_dir)
    title = f"run {run_dir.name}: {summary.get('method')} on {summary.get('dataset')}"
    print(f"plots: {learning_curve(rows, summary, run_dir / CURVE, title)}")
    best = next((r for r in rows if r["epoch"] == summary["best_epoch"]), {})
    if own:  # its kept state, which the weight gate is drawn from, is what is gone
        return 0
    gate = weight_gate(run_dir, run_dir / GATE, best.get("attention"))
    if gate is None:
        (run_dir / GATE).unlink(missing_ok=True)  # an earlier run's: none of this one's
    print(f"plots: {gate}" if gate else "plots: no weight gate in this run (method or gate off)")
    return 0


def _unpredictable(run_dir: Path) -> tuple[str, bool]:
    """(why predict would refuse the run folder as it is, "" when it would not; whether the run's
    own kept state is why): the checks predict makes of the run and of each kept ensemble member."""
    from app.kept import read_manifest  # lazy: the predict stack (numpy), for this check only
    from app.vfl.ensemble import check_members  # lazy: as the line above

    try:
        _kept_states(read_manifest(run_dir), run_dir)
    except Exception as e:  # noqa: BLE001 - what predict would say, said here
        return f"{type(e).__name__}: {e}", True
    members = kept_members(run_dir)
    alone = " (--alone predicts with the run alone)"
    gone = [str(m) for m in members if not Path(m).is_dir()]
    if gone:
        return f"its kept ensemble's member(s) {gone} are gone{alone}", False
    try:
        if members:
            for member, meta in zip(members, check_members([run_dir, *members], in_process=False)[1:], strict=True):
                _kept_states(meta, member)
    except Exception as e:  # noqa: BLE001 - as above
        return f"{type(e).__name__}: {e}{alone}", False
    return "", False


def _kept_states(meta: dict, run_dir: Path) -> None:
    """Load the states predict loads from the run folder (app/kept.py load_states): every party's
    where the run kept them (in process), else the primary's; a missing or broken one raises."""
    from app.entity_aug import kept as entity_aug  # lazy: as _unpredictable's imports
    from app.kept import load_states  # lazy: as above
    from app.vfl import kept as vfl  # lazy: as above

    names = (entity_aug if meta.get("mode") == "entity-aug" else vfl).kept_state_names(meta)
    load_states(Path(run_dir) / "kept", names)


def headline(summary: dict) -> list[str]:
    fmt = lambda m: " ".join(f"{k}={v:.4f}" for k, v in m.items())  # noqa: E731
    lines = [
        f"{summary.get('dataset')} {summary.get('method')}: best epoch {summary['best_epoch']}/"
        f"{summary.get('epochs_run', '?')} (numbered from 0) | val {fmt(summary['val'])} | test {fmt(summary['test'])}"
    ]
    if summary.get("stopping"):
        lines.append(f"stopping: {summary['stopping']['reason']}")
    lines += [
        "hyperparameters (by where each value came from):",
        *hyperparameter_lines(summary.get("hyperparameters") or {}),
    ]
    lines += [f"warning: {w}" for w in summary.get("warnings", [])]
    if summary.get("privacy"):
        lines += report_lines(summary["privacy"])
    elif summary.get("method") not in REGISTRY or REGISTRY[summary["method"]].federated:  # Solo links nothing
        lines.append("privacy: no report (run-config privacy-report = false, or the linkage service sent none)")
    if summary.get("exchange_privacy"):
        lines += exchange_lines(summary["exchange_privacy"])
    return lines


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def learning_curve(rows: list[dict], summary: dict, out: Path, title: str = "") -> Path:
    """Training loss (left axis) and the key metric on validation (chooses the best epoch) and on
    test (reported only) per epoch (right axis), the best epoch marked; the legend below the axes."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    key = next(iter(summary["val"]))
    epochs = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(epochs, [r["train_loss"] for r in rows], "o-", ms=3, label="training loss (left axis)", color="tab:blue")
    ax.set_xlabel("epoch (numbered as in summary.json)")
    ax.set_ylabel("training loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2 = ax.twinx()
    ax2.plot(
        epochs,
        [r["val"][key] for r in rows],
        "o-",
        ms=3,
        color="tab:orange",
        label=f"validation {key} (chooses the best epoch)",
    )
    if all(key in r.get("test", {}) for r in rows):
        ax2.plot(
            epochs,
            [r["test"][key] for r in rows],
            "s--",
            ms=3,
            color="tab:grey",
            alpha=0.8,
            label=f"test {key} (reported, never used to choose)",
        )
    ax2.set_ylabel(key)
    ax2.axvline(summary["best_epoch"], color="tab:green", linestyle=":", label=f"best epoch ({summary['best_epoch']})")
    ax.set_title(title or f"{summary.get('dataset')} {summary.get('method')}", fontsize=10)
    handles = [h for a in (ax, ax2) for h in a.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    with atomic_path(out) as tmp:  # 0600, renamed when whole: a failed report keeps the older plot
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return out


def _gate_curves(state: dict) -> dict[str, object]:
    """Each path's weight gate (strategies/vfl/gates.py) from the kept primary state, by label."""
    prefixes = sorted({k.split("weight_gate.")[0] for k in state if ".weight_gate." in k})
    gates = {}
    for prefix in prefixes:
        gate = WeightGate()
        gate.load_state_dict(
            {
                k[len(prefix) + len("weight_gate.") :]: v
                for k, v in state.items()
                if k.startswith(prefix + "weight_gate.")
            }
        )
        name = prefix.split(".")[1] if "." in prefix else prefix
        gates[name if name != "all" else "all secondaries (one gate on their shared similarities)"] = gate
    return gates


def weight_gate(run_dir: Path, out: Path, attention: dict[str, list[float]] | None = None) -> Path | None:
    """The weight gate at the best epoch: the weight a linked record gets against its
    (standardised, noisy) similarity, per secondary; for fedsim_attn a second panel with the
    attention's mean weight by similarity rank and on the null slot (validation records)."""
    import torch

    path = run_dir / "kept" / "primary.pt"
    if not path.exists():
        return None
    gates = _gate_curves(torch.load(path, map_location="cpu", weights_only=True))
    if not gates and not attention:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2 if attention else 1, figsize=(10 if attention else 5.5, 4.2), squeeze=False)
    ax = axes[0][0]
    sims = torch.linspace(-4, 4, 200)
    for label, gate in gates.items():
        with torch.no_grad():
            ax.plot(sims, gate(sims[None, :])[0], label=label)
    ax.set_xlabel("similarity of a linked record (standardised: 0 = the mean pair)")
    ax.set_ylabel("weight the gate gives it")
    ax.set_title("weight gate (FedSim's path), best epoch", fontsize=10)
    if gates:
        ax.legend(fontsize=8, loc="upper left")
    if attention:
        _attention_panel(axes[0][1], attention)
    fig.tight_layout()
    with atomic_path(out) as tmp:  # 0600, renamed when whole: a failed report keeps the older plot
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return out


def _attention_panel(ax, attention: dict[str, list[float]]) -> None:
    """Bars: the mean attention weight of each similarity rank (1 = most similar) and the null slot."""
    from matplotlib.ticker import MaxNLocator

    width = 0.8 / len(attention)
    for i, (party, w) in enumerate(sorted(attention.items())):
        ranks = list(range(1, len(w)))
        ax.bar([r + i * width for r in ranks], w[:-1], width=width, label=f"{party}: null slot {w[-1]:.2f}")
    ax.set_xlabel("neighbour's similarity rank (1 = most similar)")
    ax.set_ylabel("mean attention weight")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("fedsim_attn: attention by rank, best epoch (validation)", fontsize=10)
    ax.legend(fontsize=8, title="secondary (weight left to no neighbour)", title_fontsize=8)
