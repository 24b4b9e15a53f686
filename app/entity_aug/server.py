"""ServerApp side of Entity Augmentation (``mode = "entity-aug"``): the host (labels) drives
the guests over Flower messages with Algorithm 1's queue and timeout fallback; and the same
run with the guests in process (app/entity_aug/inprocess.py, used by experiments.sweep).

Both write the run record of app/run_record.py (plus, per epoch and in the summary, the stale
counts per guest) and status.json (app/run_status.py).
"""

from __future__ import annotations

import dataclasses
import time
from logging import INFO, WARNING
from pathlib import Path

from flwr.common.logger import log
from flwr.serverapp import Grid

from app import run_status
from app.config import RunConfig
from app.data import load_data
from app.entity_aug.channel import FlowerLink
from app.entity_aug.kept import HOST_MODEL, Keeper, state_name
from app.entity_aug.parties import (
    EA_DEFAULTS,
    EASettings,
    aligned_share,
    build_host,
    build_party,
    ea_data,
    ea_plan,
    ea_settings,
    evaluation_warnings,
    overlap_parts,
    torch_threads,
)
from app.run_record import RunRecord, Seconds, constant_predictor, hyperparameter_lines
from app.transport import handshake
from datasets.overlap import HOST, EntityData
from strategies.entity_aug.exchange import Exchanger, LocalLink
from strategies.entity_aug.model import EAHost, fit_ea, party_records
from strategies.records import EpochRecord, stopping


def run_ea(cfg: RunConfig, data: EntityData, link: FlowerLink | LocalLink, out: Path, engine: str,
           say=lambda *a: None) -> dict:
    """Train, evaluate every epoch, write the run record (app/run_record.py); returns the summary."""
    t_start = time.perf_counter()
    settings, patience, hyper = ea_hyperparameters(cfg)
    plan = dataclasses.replace(ea_plan(cfg, data, settings), patience=patience)
    aligned, shares = overlap_parts(cfg, data)
    host = build_host(cfg, data)
    with RunRecord(out, engine) as record:
        record.write_config(cfg, settings, hyper)
        record.write_split(data.split, len(data.labels), "seed %d: validation and test entities held out first among "
                           "those every party holds, then the overlap applied to training (datasets/entity_ids.py, "
                           "datasets/overlap.py)" % cfg.seed, entity_ids=data.entity_ids)
        record.start_progress(plan.epochs, phase="training")
        log(INFO, "[host] hyperparameters (value, source):\n%s", "\n".join(hyperparameter_lines(hyper)))
        share, source = aligned_share(cfg, data)
        say("[host] entity-aug %s on %s: aligned share %.4g (%d of %d training entities, from %s), validation %d "
            "and test %d entities (held by every party, none trained on), parties %s, batch %d, %d epochs "
            "(patience %d) x %d steps, lr %g", cfg.ea_variant, data.name, share, len(aligned), len(data.split.train),
            source, len(data.split.val), len(data.split.test), data.parties, settings.batch_size, plan.epochs,
            patience, plan.steps_per_epoch, settings.lr)
        exchanger = Exchanger(link, cfg.guest_timeout, cfg.node_timeout)
        record.open_metrics(host.head)
        keeper, models = Keeper(host.head), kept_models(host, link)

        def on_epoch(rec: EpochRecord) -> None:
            record.epoch(rec, stale=dict(exchanger.queue.stale))
            if keeper.offer(rec, models) and isinstance(link, FlowerLink):  # the states the evaluation just used
                link.keep(str(out), rec.epoch)  # each guest keeps its own
            say("[host] epoch %d: loss=%.5f | val %s | test %s | stale %s | %.1f s", rec.epoch, rec.train_loss,
                rec.val, rec.test, exchanger.queue.stale, rec.seconds)

        t0 = time.perf_counter()
        with torch_threads(1):
            records, losses = fit_ea(host, exchanger, data.split.val, data.split.test, plan, on_epoch, record.step)
        train_and_eval = time.perf_counter() - t0
        keeper.save(out, cfg, data, guests_keep=not isinstance(link, LocalLink))
        seconds = Seconds(train_and_eval=train_and_eval, total=time.perf_counter() - t_start)
        summary = record.finish(
            cfg, dataset=data.name, method=cfg.mode, head=host.head, records=records, losses=losses, model=host.model,
            device=host.device, seconds=seconds, exchange=_exchange(link, exchanger),
            preprocessing=load_data(cfg).preprocessing,  # the loaded parties' (cached), before entity blocks
            stopping=stopping(records, host.head, patience, plan.epochs, len(losses), plan.max_steps),
            hyperparameters=hyper, extra_warnings=evaluation_warnings(data), constant_predictor=constant_predictor(
                host.head, data.labels[data.split.train], data.labels[data.split.val]),
            **_ea_fields(cfg, data, aligned, shares, exchanger, len(losses)))
    say("[host] best epoch %d: val %s | test %s | stale %s; %s", summary["best_epoch"], summary["val"],
        summary["test"], summary["stale"], summary["stopping"]["reason"])
    for warning in summary["warnings"]:
        log(WARNING, "[host] %s", warning)
    return summary


def _ea_fields(cfg: RunConfig, data: EntityData, aligned, shares, exchanger: Exchanger, n_steps: int) -> dict:
    """The mode's own summary fields: variant, overlap, entities per party, stale counts."""
    share, source = aligned_share(cfg, data)
    return dict(ea_variant=cfg.ea_variant, overlap=cfg.overlap, aligned_share=share, aligned_share_from=source,
                guest_timeout=cfg.guest_timeout,
                entities={"train": len(data.split.train), "aligned": len(aligned), "val": len(data.split.val),
                          "test": len(data.split.test),
                          "records_per_party": {p: len(r) for p, r in party_records(
                              cfg.ea_variant, data.parties, data.split.train, aligned, shares).items()}},
                stale=dict(exchanger.queue.stale),  # steps at which a party's last activation stood in for it
                stale_fraction={p: c / max(1, n_steps) for p, c in exchanger.queue.stale.items()})


def ea_hyperparameters(cfg: RunConfig) -> tuple[EASettings, int, dict]:
    """The run's settings (epochs: the maximum), its patience, and each value with its source
    (as app/config.py RunConfig.hyperparameters): the run config, the dataset's tuned defaults
    (EA_DEFAULTS), or for a dataset without them handwritten's models with early stopping."""
    tuned = cfg.dataset in EA_DEFAULTS
    epochs, patience = cfg.stopping(EA_DEFAULTS[cfg.dataset].epochs if tuned else None)
    settings = dataclasses.replace(ea_settings(cfg), epochs=epochs)
    base = (f"dataset default ({cfg.dataset}, Entity Augmentation paper Sec. 5.2 / 5.5)" if tuned
            else "fallback: handwritten's defaults — dataset has no tuned defaults")
    stop = base if tuned else "fallback: early stopping — dataset has no tuned defaults"
    rows = {"batch_size": (settings.batch_size, "run config" if cfg.batch_size else base),
            "epochs": (epochs, "run config" if cfg.epochs else stop),
            "patience": (patience, "run config" if cfg.patience >= 0 else stop),
            "lr": (settings.lr, "run config" if cfg.lr else base),
            "guest_layers": (list(settings.guest), base), "host_layers": (list(settings.host), base)}
    return settings, patience, {name: {"value": v, "source": src} for name, (v, src) in rows.items()}


def kept_models(host: EAHost, link: FlowerLink | LocalLink) -> dict:
    """What this process keeps at the best epoch (state name -> module): the host's model and
    its own block's always; the guests' only in process. Over Flower each guest keeps its own
    (told from on_epoch when keeper.offer returns True: FlowerLink.keep, ``query.ea_keep``)."""
    local = link.members if isinstance(link, LocalLink) else link.local.members
    return {HOST_MODEL: host.model, **{state_name(p): party.model for p, party in local.items()}}


def _exchange(link, exchanger: Exchanger) -> dict | None:
    """summary.json's traffic over Flower (None in process)."""
    if not isinstance(link, FlowerLink):
        return None
    return {"count": exchanger.exchanges, "bytes_down": link.traffic.bytes_down, "bytes_up": link.traffic.bytes_up}


def run_ea_host(grid: Grid, cfg: RunConfig) -> dict:
    """The ServerApp's run: handshake, training over Flower, guests' models saved at the end;
    recorded in <run>/status.json (app/run_status.py)."""
    name = cfg.run_name or f"{cfg.dataset}-ea-{cfg.ea_variant}-x{cfg.overlap:g}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = cfg.out_path() / name
    with run_status.tracked(out, "flower"):
        log(INFO, "[host] run dir %s", out)
        data = ea_data(cfg)
        nodes = handshake(grid, data.guests, "", cfg.node_timeout, action="ea_hello")
        log(INFO, "[host] guests: %s", nodes)
        local = {HOST: build_party(cfg, HOST, data)} if HOST in data.blocks else {}
        link = FlowerLink(grid, nodes, cfg.node_timeout, local)
        summary = run_ea(cfg, data, link, out, "flower", say=lambda m, *a: log(INFO, m, *a))
        link.finish(str(out))
        log(INFO, "[host] results in %s", out)
        return summary
