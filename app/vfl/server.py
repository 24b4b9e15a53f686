"""The primary party's run: data, linkage, handshake, training, metrics on disk."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from logging import INFO
from pathlib import Path

import numpy as np
import torch
from flwr.common.logger import log
from flwr.serverapp import Grid

from app import run_status
from app.config import RunConfig
from app.data import load_data
from app.transport import handshake
from app.vfl import checkpoint
from app.vfl.channel import FlowerChannel
from app.vfl.parties import build_strategy, linkage_job, train_plan
from strategies.records import EpochRecord, best_epoch
from strategies.vfl.protocol import fit


def run_dir_for(cfg: RunConfig) -> Path:
    name = cfg.run_name or f"{cfg.dataset}-{cfg.method}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = cfg.out_path() / name
    if cfg.resume and not (folder / "checkpoint" / checkpoint.MANIFEST).exists():
        raise checkpoint.CheckpointError(f"run-config resume=true but run {name!r} has no checkpoint at "
                                         f"{folder / 'checkpoint'}")
    if cfg.resume:  # refused here, before any file is touched; the linkage job is checked once known
        manifest = checkpoint.read_manifest(folder / "checkpoint")
        checkpoint.check_resume(manifest, checkpoint.fixed_config(cfg), manifest.job_id)
    return folder


def write_config(out: Path, cfg: RunConfig, settings) -> None:
    (out / "config.json").write_text(json.dumps({"run": dataclasses.asdict(cfg), "resolved": dataclasses.asdict(settings)}, indent=2))


def fmt(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items())


def run_primary(grid: Grid, cfg: RunConfig) -> dict:
    """The ServerApp's run, recorded in <run>/status.json (app/run_status.py): a fresh run from
    its start, a resumed one once its checkpoint is accepted (a refused resume touches no file)."""
    out = run_dir_for(cfg)
    status = run_status.RunStatus(out, "flower")
    with status.recording():
        if not cfg.resume:
            status.start()
        return _run_primary(grid, cfg, out, status)


def _run_primary(grid: Grid, cfg: RunConfig, out: Path, status: run_status.RunStatus) -> dict:
    settings = cfg.resolve()
    if not cfg.resume:
        write_config(out, cfg, settings)
    log(INFO, "[primary] run dir %s (working directory %s)", out, Path.cwd())

    t0 = time.perf_counter()
    ds = load_data(cfg)
    log(INFO, "[primary] dataset %s: %d primary records (%d/%d/%d train/val/test), secondaries %s",
        ds.name, ds.primary.n_rows, len(ds.split.train), len(ds.split.val), len(ds.split.test),
        {p: t.n_rows for p, t in ds.secondaries.items()})
    log(INFO, "[primary] feature preparation: %s", ds.preprocessing_note())
    load_seconds = time.perf_counter() - t0

    linkage, channel, link_seconds = _connect(grid, ds, cfg, settings)
    floor = [channel.ping() for _ in range(cfg.bench_floor)] if channel and cfg.bench_floor else []
    if floor:
        log(INFO, "[primary] empty-exchange floor: median %.4f s over %d", statistics.median(floor), len(floor))

    strategy = build_strategy(ds, linkage, cfg, settings)
    plan = train_plan(cfg, settings)
    log(INFO, "[primary] training %s: K=%d, batch %d, %d epochs, lr %g, S=%d steps per exchange, device %s",
        cfg.method, settings.k, settings.batch_size, settings.epochs, settings.lr, cfg.steps_per_exchange,
        strategy.device)
    ckpt = out / "checkpoint"
    job_id = linkage.job_id if linkage else ""
    done = checkpoint.resume(ckpt, strategy, channel, cfg, job_id) if cfg.resume else None
    if not cfg.resume:
        checkpoint.fresh(ckpt)
    else:  # the checkpoint was accepted: from here on this is the run
        status.start(resume=True)
        write_config(out, cfg, settings)
    if done:
        log(INFO, "[primary] resumed from the checkpoint of epoch %d (%d steps done)", len(done[0]) - 1, len(done[1]))
    after_epoch = checkpoint.checkpointer(ckpt, strategy, channel, cfg, job_id) if cfg.checkpoint else None
    metrics_file = (out / "metrics.jsonl").open("w")
    for rec in done[0] if done else []:
        metrics_file.write(json.dumps(dataclasses.asdict(rec)) + "\n")
    on_epoch, progress = _epoch_log(metrics_file, channel)
    t0 = time.perf_counter()
    records, step_losses = fit(strategy, channel, ds.split.train, ds.split.val, ds.split.test, plan, on_epoch, progress,
                               after_epoch, done, str(ckpt) if cfg.checkpoint else "")
    train_seconds = time.perf_counter() - t0
    metrics_file.close()

    torch.save(strategy.model.state_dict(), out / "primary_model.pt")
    if channel:
        channel.finish(str(out))
    seconds = {"load": load_seconds, "linkage": link_seconds, "train_and_eval": train_seconds,
               "epochs": [r.seconds for r in records]}
    summary = _summary(ds, cfg, settings, strategy, records, step_losses, seconds, channel, floor)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    np.save(out / "step_losses.npy", np.asarray(step_losses))
    log(INFO, "[primary] best epoch %d: val %s | test %s", summary["best_epoch"], fmt(summary["val"]),
        fmt(summary["test"]))
    log(INFO, "[primary] results in %s", out)
    return summary


def _connect(grid: Grid, ds, cfg: RunConfig, settings) -> tuple:
    """The linkage job and the channel to the parties who hold it: (linkage, channel, seconds);
    Solo has neither."""
    if cfg.method == "solo":
        return None, None, 0.0
    t0 = time.perf_counter()
    linkage, _ = linkage_job(ds, cfg, settings)  # each party reads its own copy of the job
    link_seconds = time.perf_counter() - t0
    log(INFO, "[primary] linkage job %s (%s): K=%d tau=%g sigma %s in %.2f s", linkage.job_id, linkage.layout,
        linkage.k, linkage.tau, {p: round(l.sigma, 4) for p, l in linkage.links.items()}, link_seconds)
    nodes = handshake(grid, sorted(ds.secondaries), linkage.job_id, cfg.node_timeout)
    log(INFO, "[primary] parties: %s", nodes)
    return linkage, FlowerChannel(grid, nodes, cfg.node_timeout, linkage.job_id), link_seconds


def _summary(ds, cfg: RunConfig, settings, strategy, records: list[EpochRecord], step_losses, seconds: dict,
             channel, floor: list[float]) -> dict:
    """summary.json: the best-validation epoch's metrics, timings and traffic."""
    best = best_epoch(records, strategy.head)
    traffic = channel.traffic if channel else None
    times = traffic.seconds if traffic else []
    return {
        "dataset": ds.name, "method": cfg.method, "seed": cfg.seed, "k": settings.k,
        "steps_per_exchange": cfg.steps_per_exchange, "device": str(strategy.device),
        "best_epoch": best.epoch, "val": best.val, "test": best.test, "preprocessing": ds.preprocessing,
        "epochs_run": len(records), "steps": len(step_losses), "seconds": seconds,
        "exchange": {
            "count": traffic.exchanges if traffic else 0,
            "bytes_down": traffic.bytes_down if traffic else 0,
            "bytes_up": traffic.bytes_up if traffic else 0,
            "median_seconds": statistics.median(times) if times else 0.0,
            "mean_seconds": statistics.fmean(times) if times else 0.0,
            "floor_median_seconds": statistics.median(floor) if floor else None,
            "floor_mean_seconds": statistics.fmean(floor) if floor else None,
        },
    }


def _epoch_log(metrics_file, channel):
    """The per-epoch record (metrics.jsonl line + log) and a step log at most every 10 s."""
    last = {"t": time.perf_counter()}

    def on_epoch(rec: EpochRecord) -> None:
        row = dataclasses.asdict(rec)
        if channel:
            row.update(bytes_down=channel.traffic.bytes_down, bytes_up=channel.traffic.bytes_up)
        metrics_file.write(json.dumps(row) + "\n")
        metrics_file.flush()
        log(INFO, "[primary] epoch %d: loss=%.5f | val %s | test %s | %d steps, %d exchanges, %.1f s",
            rec.epoch, rec.train_loss, fmt(rec.val), fmt(rec.test), rec.steps, rec.exchanges, rec.seconds)

    def progress(step: int, n_steps: int, loss: float) -> None:
        if time.perf_counter() - last["t"] > 10.0:
            last["t"] = time.perf_counter()
            log(INFO, "[primary]   step %d (%d per epoch) loss=%.5f", step, n_steps, loss)

    return on_epoch, progress
