"""The primary party's run, one driver for every engine (:func:`drive`): data, linkage, the parties
(over Flower, or in process: app/vfl/inprocess.py), training, metrics on disk."""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable
from logging import INFO, WARNING
from pathlib import Path

from flwr.common.logger import log
from flwr.serverapp import Grid

from app import probes, run_status, threads
from app.config import RunConfig
from app.data import primary_data
from app.kept import KEPT
from app.run_record import FinishedRun, RunRecord, Seconds, constant_predictor, hyperparameter_lines
from app.transport import handshake
from app.vfl import checkpoint, exchange
from app.vfl.channel import FlowerChannel
from app.vfl.direct import DirectChannel
from app.vfl.engine import Engine
from app.vfl.kept import Keeper
from app.vfl.linking import job_privacy, linkage_job
from app.vfl.parties import build_strategy, epochs_note, train_plan
from strategies.records import EpochRecord, best_epoch, stopping
from strategies.vfl.protocol import Hooks, fit


def run_dir_for(cfg: RunConfig) -> Path:
    name = (
        cfg.runtime.run_name
        or f"{cfg.data.dataset}-{cfg.train.method}-s{cfg.train.seed}{cfg.train.member_tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    folder = cfg.out_path() / name
    if cfg.train.resume and not (folder / "checkpoint" / checkpoint.MANIFEST).exists():
        raise checkpoint.CheckpointError(
            f"run-config resume=true but run {name!r} has no checkpoint at {folder / 'checkpoint'}"
        )
    if cfg.train.resume:  # refused here, before any file is touched; the linkage job is checked once known
        manifest = checkpoint.read_manifest(folder / "checkpoint")
        checkpoint.check_resume(manifest, checkpoint.fixed_config(cfg), manifest.job_id)
    return folder


def fmt(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items())


def run_primary(grid: Grid, cfg: RunConfig) -> dict:
    """The ServerApp's run, recorded in <run>/status.json (app/run_status.py): a fresh run from
    its start, a resumed one once its checkpoint is accepted (a refused resume touches no file)."""
    out = run_dir_for(cfg)
    status = run_status.RunStatus(out, "flower")
    with status.recording():
        if not cfg.train.resume:
            status.start()
        sharing = threads.same_host(grid) if cfg.train.pipeline else 1  # unpipelined, the parties take turns
        engine = Engine("flower", "[primary]", functools.partial(_connect, grid), sharing)
        return drive(cfg, out, engine, status)


def drive(cfg: RunConfig, out: Path, engine: Engine, status: run_status.RunStatus | None = None) -> dict:
    """The VFL run, for every engine: data, linkage, parties, training (checkpointed and
    resumable over Flower), the best epoch kept, the run record (app/run_record.py)."""
    t_start, tag = time.perf_counter(), engine.tag
    settings, hyper = cfg.resolve(), cfg.hyperparameters()
    with RunRecord(out, engine.name) as record, contextlib.ExitStack() as links:
        ds, seconds = _start(record, cfg, settings, hyper, out, tag)
        linkage, channel, seconds.linkage, privacy = engine.connect(ds, cfg, settings)
        if channel is not None:
            links.callback(channel.close)  # a direct transport's links close with the run, however it ends
        floor = _floor(channel, cfg, tag)
        strategy = build_strategy(ds, linkage, cfg, settings)
        exchange.protect(strategy, ds, cfg, settings, tag)  # label DP, gradient defence, attack observer
        local = channel.parties if channel is not None else {}  # the party objects in this process (in process: all)
        models = [strategy.model, *(s.model for s in local.values())]
        threads.use(threads.decide(cfg.runtime.threads, engine.processes, models), tag, strategy.device.type == "cpu")
        plan = _plan(cfg, settings, strategy, tag)
        ckpt, job_id = out / "checkpoint", linkage.job_id if linkage else ""
        done = (
            _start_or_resume(ckpt, strategy, channel, cfg, job_id, lambda: _resumed(status, record, cfg, settings))
            if engine.resumable
            else None
        )
        after_epoch = (
            checkpoint.checkpointer(ckpt, strategy, channel, cfg, job_id)
            if cfg.train.checkpoint and engine.resumable
            else None
        )
        record.open_metrics(strategy.head, done[0] if done else [])
        keeper, keep = _keeper(out, strategy, channel, engine, done)
        on_epoch, progress = _epoch_log(record, channel, keep, tag)
        t0 = time.perf_counter()
        hooks = Hooks(on_epoch, progress, after_epoch, str(ckpt) if after_epoch else "")
        fitted = fit(strategy, channel, ds.split, plan, hooks, done)  # (epoch records, step losses)
        seconds.train_and_eval = time.perf_counter() - t0
        measured = channel.finish(str(out)) if channel is not None else {}  # each party's own inversion measurement
        keeper.save(out, cfg, settings, ds, job_id, parties_keep=channel is not None and not local)
        seconds.total = time.perf_counter() - t_start
        run = finished_run(cfg, ds, strategy, plan, fitted, seconds, _exchange(channel, floor))
        inverted = measured or exchange.inversions(cfg, local)
        exchange_privacy = exchange.report(strategy, ds, cfg, settings, len(fitted[1]), tag, inverted)
        summary = record.finish(cfg, run, **vfl_fields(cfg, settings, privacy, exchange_privacy))
    log_end(tag, summary, out)
    return summary


def vfl_fields(cfg: RunConfig, settings, privacy: dict | None, exchange_privacy: dict | None) -> dict:
    """summary.json's fields of a VFL run (after the common ones): K, tau, S and both privacy reports."""
    return {
        "k": settings.k,
        "tau": cfg.link.tau,
        "steps_per_exchange": cfg.train.steps_per_exchange,
        "privacy": privacy,
        "exchange_privacy": exchange_privacy,
    }


def _floor(channel, cfg: RunConfig, tag: str) -> list[float]:
    """The transport's empty-exchange floor, measured :func:`app.probes.bench_floor` times (none in process)."""
    times = probes.bench_floor()
    floor = (
        [channel.ping() for _ in range(times)] if channel is not None and channel.traffic is not None and times else []
    )
    if floor:
        log(INFO, "%s empty-exchange floor: median %.4f s over %d", tag, statistics.median(floor), len(floor))
    return floor


def _keeper(out: Path, strategy, channel, engine: Engine, done) -> tuple[Keeper, Callable]:
    """The best epoch's keeper and the per-epoch ``keep(rec)``. Over Flower the primary's state is
    written at each improvement and every party keeps its own (told over the channel); in process
    the keeper holds every party's state until the run saves it."""
    if not engine.resumable:
        local = channel.parties if channel is not None else {}  # a LocalChannel's party objects
        models = {"primary": strategy.model, **local}  # a party's state: its model's and its shield's
        keeper = Keeper(strategy.head)
        return keeper, lambda rec: keeper.offer(rec, models)  # the states the evaluation just used
    keeper = Keeper(strategy.head, out / KEPT)
    keeper.resume(done[0] if done else [])
    if done and channel is not None and best_epoch(done[0], strategy.head).epoch == done[0][-1].epoch:
        channel.keep(out, done[0][-1].epoch)  # its keep rode on a step the interruption may have lost
    return keeper, lambda rec: _keep(keeper, rec, strategy, channel, out)


def log_hyperparameters(tag: str, hyper: dict) -> None:
    log(INFO, "%s hyperparameters (by where each value came from):\n%s", tag, "\n".join(hyperparameter_lines(hyper)))


def finished_run(
    cfg: RunConfig,
    ds,
    strategy,
    plan,
    fitted: tuple[list[EpochRecord], list[float]],
    seconds: Seconds,
    exchange: dict | None,
) -> FinishedRun:
    """What the run record's summary says of the trained ``strategy`` and what it ``fitted``
    (:func:`fit`'s epoch records and step losses): with its stopping, hyperparameters and
    constant predictor (training labels only)."""
    head, (records, step_losses) = strategy.head, fitted
    return FinishedRun(
        dataset=ds.name,
        method=cfg.train.method,
        head=head,
        records=records,
        losses=step_losses,
        model=strategy.model,
        device=strategy.device,
        seconds=seconds,
        preprocessing=ds.preprocessing,
        exchange=exchange,
        hyperparameters=cfg.hyperparameters(),
        stopping=stopping(records, head, plan.stop, len(step_losses)),
        constant_predictor=constant_predictor(head, ds.labels[ds.split.train], ds.labels[ds.split.val]),
    )


def _start(record: RunRecord, cfg: RunConfig, settings, hyper: dict, out: Path, tag: str) -> tuple:
    """The run's start: config.json and progress.json (a resumed run writes nothing before its
    checkpoint is accepted), its first log lines, the parties' data loaded and split.csv written.
    Returns the data and the run's Seconds (:func:`_load`)."""
    if not cfg.train.resume:
        record.write_config(cfg, settings, hyper)
        record.start_progress(settings.epochs)
    log(INFO, "%s run dir %s (working directory %s)", tag, out, Path.cwd())
    log_hyperparameters(tag, hyper)
    ds, seconds = _load(cfg, tag)
    record.write_split(
        ds.split, ds.primary.n_rows, ds.split_rule(cfg.train.seed, cfg.data.search_fold), ds.source_lines, ds.entity_ids
    )
    return ds, seconds


def _plan(cfg: RunConfig, settings, strategy, tag: str):
    """The training's plan (early stopping's patience from the settings), logged."""
    plan = train_plan(cfg, settings)
    log(
        INFO,
        "%s training %s: K=%d, batch %d, %s, lr %g%s, S=%d steps per exchange, device %s",
        tag,
        cfg.train.method,
        settings.k,
        settings.batch_size,
        epochs_note(plan.stop.epochs, plan.stop.patience),
        settings.lr,
        f" (x {plan.lr_decay} after {plan.lr_patience} epochs not better)" if plan.lr_decay < 1 else "",
        cfg.train.steps_per_exchange,
        strategy.device,
    )
    return plan


def log_end(tag: str, summary: dict, out: Path) -> None:
    """The run's last lines: how it stopped, the best epoch, every warning (as WARNING)."""
    log(INFO, "%s stopped after %d epochs: %s", tag, summary["epochs_run"], summary["stopping"]["reason"])
    log(
        INFO,
        "%s best epoch %d: val %s | test %s",
        tag,
        summary["best_epoch"],
        fmt(summary["val"]),
        fmt(summary["test"]),
    )
    for warning in summary["warnings"]:
        log(WARNING, "%s %s", tag, warning)
    log(INFO, "%s results in %s", tag, out)


def _load(cfg: RunConfig, tag: str) -> tuple:
    """The parties' data, and the run's Seconds with the load time filled in."""
    t0 = time.perf_counter()
    ds = primary_data(cfg)  # with the linkage service's result: csv reads the primary's own file only
    log(
        INFO,
        "%s dataset %s: %d primary records (%d/%d/%d train/val/test), secondaries %s",
        tag,
        ds.name,
        ds.primary.n_rows,
        len(ds.split.train),
        len(ds.split.val),
        len(ds.split.test),
        {p: ds.secondaries[p].n_rows if p in ds.secondaries else "on its own host" for p in ds.party_names},
    )
    log(INFO, "%s feature preparation: %s", tag, ds.preprocessing_note())
    return ds, Seconds(load=time.perf_counter() - t0)


def _start_or_resume(ckpt: Path, strategy, channel, cfg: RunConfig, job_id: str, accepted: Callable[[], None]):
    """A fresh run empties its checkpoint folder; a resumed one loads every party's state, and
    only once the checkpoint is accepted does the run become this one (``accepted``). Returns
    what was done."""
    if not cfg.train.resume:
        checkpoint.fresh(ckpt)
        return None
    done = checkpoint.resume(ckpt, strategy, channel, cfg, job_id)
    accepted()
    if done:
        log(INFO, "[primary] resumed from the checkpoint of epoch %d (%d steps done)", len(done[0]) - 1, len(done[1]))
    return done


def _resumed(status: run_status.RunStatus, record: RunRecord, cfg: RunConfig, settings) -> None:
    """The resumed run becomes this one: its status, its config and its progress record."""
    status.start(resume=True)
    record.write_config(cfg, settings, cfg.hyperparameters())
    record.start_progress(settings.epochs, phase="training")


def link(ds, cfg: RunConfig, settings, tag: str) -> tuple:
    """The run's linkage job, every engine's: (linkage, its folder, seconds, the job's privacy
    report); all None (0 s) for a method that links nothing."""
    if not cfg.training_method.federated:
        return None, None, 0.0, None
    t0 = time.perf_counter()
    linkage, folder = linkage_job(ds, cfg, settings)  # each party reads its own copy of the job
    link_seconds = time.perf_counter() - t0
    log(
        INFO,
        "%s linkage job %s (%s): K=%d tau=%g sigma %s in %.2f s",
        tag,
        linkage.job_id,
        linkage.layout,
        linkage.k,
        linkage.tau,
        {p: round(pl.sigma, 4) for p, pl in linkage.links.items()},
        link_seconds,
    )
    return linkage, folder, link_seconds, job_privacy(folder, linkage, tag)


def _connect(grid: Grid, ds, cfg: RunConfig, settings) -> tuple:
    """The linkage job and the channel to the parties who hold it over Flower: (linkage, channel,
    seconds, the job's privacy report); a method that links nothing has none of them."""
    linkage, _, link_seconds, privacy = link(ds, cfg, settings, "[primary]")
    if linkage is None:
        return None, None, 0.0, None
    if cfg.runtime.direct:  # the last step: nothing between opening the links and closing them with the run
        channel = DirectChannel.connect(grid, sorted(ds.party_names), linkage.job_id, cfg.runtime.node_timeout)
        log(INFO, "[primary] parties: %s", channel.nodes)
        log(INFO, "[primary] direct links to the party workers: %s", sorted(channel.links))
    else:
        channel = FlowerChannel(
            grid,
            handshake(grid, sorted(ds.party_names), linkage.job_id, cfg.runtime.node_timeout),
            cfg.runtime.node_timeout,
            linkage.job_id,
        )
        log(INFO, "[primary] parties: %s", channel.nodes)
    return linkage, channel, link_seconds, privacy


def _exchange(channel, floor: list[float]) -> dict | None:
    """summary.json's traffic: exchanges, bytes each way, their times, Flower's empty-exchange floor
    (None where nothing travels: in process, or no secondaries)."""
    if channel is None or channel.traffic is None:
        return None
    traffic, times = channel.traffic, channel.traffic.seconds
    return {
        "count": traffic.exchanges,
        "bytes_down": traffic.bytes_down,
        "bytes_up": traffic.bytes_up,
        "median_seconds": statistics.median(times) if times else 0.0,
        "mean_seconds": statistics.fmean(times) if times else 0.0,
        "floor_median_seconds": statistics.median(floor) if floor else None,
        "floor_mean_seconds": statistics.fmean(floor) if floor else None,
    }


def _keep(keeper: Keeper, rec: EpochRecord, strategy, channel, out: Path) -> None:
    """After the evaluation, before any later step: a best-so-far epoch is kept by every party."""
    if keeper.offer(rec, {"primary": strategy.model}) and channel is not None:
        channel.keep(out, rec.epoch)


def _epoch_log(record: RunRecord, channel, keep, tag: str):
    """The per-epoch record (metrics.jsonl line, progress.json + log, then ``keep``), and the
    training loop's progress: progress.json, and a step log at most every 10 s."""
    last = {"t": time.perf_counter()}

    def on_epoch(rec: EpochRecord) -> None:
        traffic = channel.traffic if channel else None
        record.epoch(rec, **({"bytes_down": traffic.bytes_down, "bytes_up": traffic.bytes_up} if traffic else {}))
        keep(rec)
        log(
            INFO,
            "%s epoch %d: loss=%.5f | val %s | test %s | %d steps, %d exchanges, %.1f s",
            tag,
            rec.epoch,
            rec.train_loss,
            fmt(rec.val),
            fmt(rec.test),
            rec.steps,
            rec.exchanges,
            rec.seconds,
        )

    def progress(phase: str, epoch: int, step: int, n_steps: int, loss: float) -> None:
        record.step(phase, epoch, step, n_steps, loss)
        if time.perf_counter() - last["t"] > 10.0:
            last["t"] = time.perf_counter()
            # the losses stay on the device and are read every LOSS_READS steps: say which one this is
            read = "not read yet" if math.isnan(loss) else f"{loss:.5f} (the last read)"
            log(INFO, "%s   epoch %d: %s step %d of %d, loss %s", tag, epoch, phase, step, n_steps, read)

    return on_epoch, progress
