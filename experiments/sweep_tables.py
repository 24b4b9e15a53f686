"""A sweep's tables and plots: results.csv (one row per finished run), results.md (mean ± std
over seeds of the test metric at the best-validation epoch, and the strongest attack on each run's
linkage release from its privacy report), learning curves, the weight gate's similarity -> weight
curve and the metric against the sweep's x parameter. experiments/sweep.py runs the runs."""

from __future__ import annotations

import collections
import csv
import statistics
import time
from pathlib import Path

from app.run_record import machine, read_metrics, read_summary
from app.run_status import is_finished
from experiments.runner import git_rev
from strategies.vfl.gates import WeightGate


def key_metric(summary: dict) -> tuple[str, bool]:
    """The metric a table reports, and whether higher is better."""
    return ("accuracy", True) if "accuracy" in summary["test"] else ("rmse", False)


def tabulate(root: Path, sweep: dict) -> list[dict]:
    rows = []
    for dataset in sweep["datasets"]:
        for variant in sweep["variants"]:
            for seed in sweep["seeds"]:
                run = root / dataset / variant / f"s{seed}"
                if is_finished(run):
                    s = read_summary(run)
                    metric, _ = key_metric(s)
                    rows.append(
                        {
                            "dataset": dataset,
                            "variant": variant,
                            "seed": seed,
                            "metric": metric,
                            "test": s["test"][metric],
                            "val": s["val"][metric],
                            "best_epoch": s["best_epoch"],
                            "epochs": s["epochs_run"],
                            "seconds": round(s["seconds"]["total"], 1),
                            "machine": s.get("machine", ""),
                            "device": s.get("device", ""),
                            "attack": strongest_attack(s),
                            **exchange_attacks(s),
                        }
                    )
    root.mkdir(parents=True, exist_ok=True)
    with (root / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["dataset"])
        w.writeheader()
        w.writerows(rows)
    return rows


def strongest_attack(summary: dict) -> float | None:
    """The run's privacy report (linkage/privacy.py): the strongest attack's success rate over
    its secondaries (the worst case for the parties); None without a report (e.g. Solo)."""
    parties = (summary.get("privacy") or {}).get("parties") or {}
    rates = [e["strongest"]["rate"] for e in parties.values()]
    return max(rates) if rates else None


def exchange_attacks(summary: dict) -> dict:
    """The run's exchange report (app/vfl/exchange.py): the strongest label attack's score over its
    secondaries (AUC, Spearman or accuracy) and the primary's best inversion (the lowest error
    ratio); None where the run has no report."""
    report = summary.get("exchange_privacy") or {}
    scores = [v for a in (report.get("attacks") or {}).values() for k, v in a.items() if k in ATTACKS and v is not None]
    ratios = [r["ratio"] for r in (report.get("inversion") or {}).values()]
    return {"label_attack": max(scores) if scores else None, "inversion": min(ratios) if ratios else None}


ATTACKS = ("norm", "direction", "completion")


def markdown(rows: list[dict], sweep: dict, command: str, engine: str, seconds: float) -> str:
    lines = [
        f"### Sweep `{sweep['name']}`",
        "",
        f"`{command}` — engine {engine}; tabulated on {machine()}, git {git_rev()}, "
        f"{time.strftime('%Y-%m-%d')}; this invocation ran for {seconds / 60:.1f} min. "
        f"Test metric at the best-validation epoch, mean ± std over seeds "
        f"{sweep['seeds']}.",
        "",
    ]
    ran_on = collections.Counter(
        (r["machine"] or "not recorded") + (f" [{r['device']}]" if r["device"] else "") for r in rows
    )
    if ran_on:
        note = (
            ' ("not recorded": runs from before summaries named their machine; docs/results-notes.md '
            "says where they ran)"
            if any(m.startswith("not recorded") for m in ran_on)
            else ""
        )
        lines += ["Runs ran on: " + "; ".join(f"{m} ({n} runs)" for m, n in ran_on.most_common()) + note + ".", ""]
    for dataset in sweep["datasets"]:
        sub = [r for r in rows if r["dataset"] == dataset]
        if not sub:
            continue
        metric = sub[0]["metric"]
        attacked = any(r.get("attack") is not None for r in sub)
        exchanged = any(r.get("label_attack") is not None or r.get("inversion") is not None for r in sub)
        head = (
            f"| variant | test {metric} | val {metric} | runs | s/run |"
            + (" strongest attack |" if attacked else "")
            + (" label attack / inversion error |" if exchanged else "")
        )
        rule = "|---|---|---|---|---|" + ("---|" if attacked else "") + ("---|" if exchanged else "")
        lines += [f"**{dataset}** (test {metric})", "", head, rule]
        for variant in sweep["variants"]:
            v = [r for r in sub if r["variant"] == variant]
            if not v:
                continue
            t, va = [r["test"] for r in v], [r["val"] for r in v]
            sd = statistics.stdev(t) if len(t) > 1 else 0.0
            lines.append(
                f"| {variant} | {statistics.fmean(t):.4f} ± {sd:.4f} | {statistics.fmean(va):.4f} | "
                f"{len(v)} | {statistics.fmean(r['seconds'] for r in v):.0f} |"
                + attack_cell(v, attacked)
                + (exchange_cell(v) if exchanged else "")
            )
        lines.append("")
    return "\n".join(lines)


def attack_cell(runs: list[dict], attacked: bool) -> str:
    """The strongest attack's success over a variant's runs (mean), '' when no run was attacked."""
    if not attacked:
        return ""
    rates = [r["attack"] for r in runs if r.get("attack") is not None]
    return f" {100 * statistics.fmean(rates):.1f} % |" if rates else " - |"


def exchange_cell(runs: list[dict]) -> str:
    """The strongest label attack and the best inversion over a variant's runs (means)."""
    cells = []
    for key in ("label_attack", "inversion"):
        values = [r[key] for r in runs if r.get(key) is not None]
        cells.append(f"{statistics.fmean(values):.3f}" if values else "-")
    return f" {cells[0]} / {cells[1]} |"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plots(root: Path, sweep: dict) -> list[Path]:
    """Validation learning curves per dataset; the weight gate's curve for FedSim variants."""
    import torch

    plt = _pyplot()
    out = []
    for dataset in sweep["datasets"]:
        fig, (ax, gx) = plt.subplots(1, 2, figsize=(11, 4))
        for variant in sweep["variants"]:
            curves, gates = [], []
            for seed in sweep["seeds"]:
                run = root / dataset / variant / f"s{seed}"
                if not is_finished(run):  # unfinished, failed (or running) runs are not plotted
                    continue
                recs = read_metrics(run)
                metric = "accuracy" if "accuracy" in recs[0]["val"] else "rmse"
                curves.append([r["val"][metric] for r in recs])
                if not (run / "primary_model.pt").exists():  # e.g. runs copied back from another machine
                    continue
                state = torch.load(run / "primary_model.pt", map_location="cpu", weights_only=True)
                if gate_prefix(state):
                    gates.append(weight_curve(state))
            if curves:
                n = min(map(len, curves))
                ax.plot(range(n), [statistics.fmean(c[i] for c in curves) for i in range(n)], label=variant)
                ax.set_ylabel(f"validation {metric}")
            if gates:
                s, _ = gates[0]
                gx.plot(s, [statistics.fmean(g[1][i] for g in gates) for i in range(len(s))], label=variant)
        ax.set_xlabel("epoch")
        ax.set_title(f"{dataset}: learning curves (mean over seeds)")
        ax.legend(fontsize=7)
        gx.set_xlabel("standardised similarity s")
        gx.set_ylabel("weight")
        gx.set_title("weight gate")
        if gx.lines:
            gx.legend(fontsize=7)
        out.append(_save(plt, fig, root / f"{dataset}.png"))
    return out


def param_plot(root: Path, sweep: dict, rows: list[dict]) -> list[Path]:
    """A sweep with `x = "<run-config key>"` (e.g. k, tau): test metric vs that value, per dataset."""
    plt = _pyplot()
    key, out = sweep.get("x"), []
    if not key:
        return out
    for dataset in sweep["datasets"]:
        pts = []
        for variant, values in sweep["variants"].items():
            t = [r["test"] for r in rows if r["dataset"] == dataset and r["variant"] == variant]
            if t and key in values:
                pts.append((values[key], statistics.fmean(t), statistics.stdev(t) if len(t) > 1 else 0.0))
        if not pts:
            continue
        pts.sort()
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3)
        ax.set_xlabel(key)
        ax.set_ylabel(f"test {rows[0]['metric']}")
        ax.set_title(f"{dataset}: test {rows[0]['metric']} vs {key}")
        if key == "tau":
            ax.set_xscale("log")
        out.append(_save(plt, fig, root / f"{dataset}-vs-{key}.png"))
    return out


def gate_prefix(state: dict) -> str:
    """Where the (first) weight gate sits in a saved primary model ("" when it has none);
    models saved before the per-path refactor kept it at the top level."""
    for key in ("paths.all.weight_gate.", "weight_gate."):
        if f"{key}net.0.weight" in state:
            return key
    return next((k.removesuffix("net.0.weight") for k in sorted(state) if k.endswith("weight_gate.net.0.weight")), "")


def weight_curve(state: dict) -> tuple[list[float], list[float]]:
    import torch

    gate, prefix = WeightGate(), gate_prefix(state)
    gate.load_state_dict({k.removeprefix(prefix): v.float() for k, v in state.items() if k.startswith(prefix)})
    s = torch.linspace(-3, 3, 61)
    with torch.no_grad():
        w = gate(s[None, :])[0]
    return s.tolist(), w.tolist()
