"""ServerApp side of Entity Augmentation (``mode = "entity-aug"``): the primary (labels; the EA
paper's host) drives the secondaries (the paper's guests) over Flower messages with Algorithm 1's
queue and timeout fallback; and the same run with the secondaries in process
(app/entity_aug/inprocess.py, used by experiments.sweep).

Both write the run record of app/run_record.py (plus, per epoch and in the summary, the stale
counts per secondary) and status.json (app/run_status.py).
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from pathlib import Path

from flwr.common.logger import log
from flwr.serverapp import Grid

from app import run_status, threads
from app.config import RunConfig
from app.entity_aug import id_exchange
from app.entity_aug.channel import FlowerChannel
from app.entity_aug.direct import DirectChannel
from app.entity_aug.kept import PRIMARY_MODEL, Keeper, state_name
from app.entity_aug.parties import (
    aligned_share,
    build_party,
    build_primary,
    ea_data,
    ea_plan,
    evaluation_warnings,
    hyperparameters,
    overlap_parts,
)
from app.run_record import FinishedRun, RunRecord, Seconds, constant_predictor, hyperparameter_lines
from app.transport import handshake, introduce, party_nodes
from datasets.overlap import PRIMARY_BLOCK, EntityData
from strategies.entity_aug.channel import LocalChannel
from strategies.entity_aug.exchange import Exchanger
from strategies.entity_aug.model import PrimaryParty, fit_ea, party_records
from strategies.records import EpochRecord, stopping
from strategies.torch_threads import torch_threads


def run_ea(
    cfg: RunConfig, data: EntityData, channel: FlowerChannel | LocalChannel, out: Path, engine: str, say=lambda *a: None
) -> dict:
    """Train, evaluate every epoch, write the run record (app/run_record.py); returns the summary."""
    t_start = time.perf_counter()
    settings, patience, hyper = hyperparameters(cfg)
    plan = ea_plan(cfg, data, settings, patience)
    aligned, shares = overlap_parts(cfg, data)
    primary = build_primary(cfg, data)
    with RunRecord(out, engine) as record:
        _start_record(record, cfg, data, settings, plan, hyper)
        _say_plan(say, cfg, data, len(aligned), settings, plan)
        exchanger = Exchanger(channel, cfg.ea.secondary_timeout, cfg.runtime.node_timeout)
        record.open_metrics(primary.head)
        keeper, models = Keeper(primary.head), kept_models(primary, channel)

        def on_epoch(rec: EpochRecord) -> None:
            record.epoch(rec, stale=dict(exchanger.queue.stale))
            if keeper.offer(rec, models) and isinstance(channel, FlowerChannel):  # the states the evaluation just used
                channel.keep(str(out), rec.epoch)  # each secondary keeps its own
            say(
                "[primary] epoch %d: loss=%.5f | val %s | test %s | stale %s | %.1f s",
                rec.epoch,
                rec.train_loss,
                rec.val,
                rec.test,
                exchanger.queue.stale,
                rec.seconds,
            )

        t0 = time.perf_counter()
        cpu = primary.device.type == "cpu"
        choice = threads.use(threads.entity_aug_choice(cfg.runtime.threads, [primary.model]), "[primary]", cpu)
        with torch_threads(choice.threads):  # and the in-process secondaries' steps, as the run config says
            records, losses = fit_ea(primary, exchanger, data.split.val, data.split.test, plan, on_epoch, record.step)
        train_and_eval = time.perf_counter() - t0
        keeper.save(out, cfg, data, secondaries_keep=not isinstance(channel, LocalChannel))
        seconds = Seconds(train_and_eval=train_and_eval, total=time.perf_counter() - t_start)
        run = FinishedRun(
            dataset=data.name,
            method=cfg.train.mode,
            head=primary.head,
            records=records,
            losses=losses,
            model=primary.model,
            device=primary.device,
            seconds=seconds,
            exchange=_exchange(channel, exchanger),
            preprocessing=data.preprocessing,  # the loaded parties', before entity blocks
            stopping=stopping(records, primary.head, plan.stop, len(losses)),
            hyperparameters=hyper,
            extra_warnings=evaluation_warnings(data),
            constant_predictor=constant_predictor(
                primary.head, data.labels[data.split.train], data.labels[data.split.val]
            ),
        )
        summary = record.finish(cfg, run, **_ea_fields(cfg, data, aligned, shares, exchanger, len(losses)))
    _say_result(say, summary)
    return summary


def _start_record(record: RunRecord, cfg: RunConfig, data: EntityData, settings, plan, hyper: dict) -> None:
    """config.json, split.csv and progress.json of the run, and its hyperparameters logged."""
    record.write_config(cfg, settings, hyper)
    record.write_split(
        data.split,
        len(data.labels),
        "seed %d: validation and test entities held out first among "
        "those every party holds, then the overlap applied to training (datasets/entity_ids.py, "
        "datasets/overlap.py)" % cfg.train.seed,
        entity_ids=data.entity_ids,
    )
    record.start_progress(plan.stop.epochs, phase="training")
    log(INFO, "[primary] hyperparameters (by where each value came from):\n%s", "\n".join(hyperparameter_lines(hyper)))


def _say_plan(say, cfg: RunConfig, data: EntityData, n_aligned: int, settings, plan) -> None:
    """The run's plan in one line: variant, aligned share, entities per part, parties, schedule."""
    share, source = aligned_share(cfg, data)
    say(
        "[primary] entity-aug %s on %s: aligned share %.4g (%d of %d training entities, from %s), validation %d "
        "and test %d entities (held by every party, none trained on), parties %s, batch %d, %d epochs "
        "(patience %d) x %d steps, lr %g",
        cfg.ea.variant,
        data.name,
        share,
        n_aligned,
        len(data.split.train),
        source,
        len(data.split.val),
        len(data.split.test),
        data.parties,
        settings.batch_size,
        plan.stop.epochs,
        plan.stop.patience,
        plan.steps_per_epoch,
        settings.lr,
    )


def _say_result(say, summary: dict) -> None:
    """The run's last lines: the best epoch, how it stopped, every warning (as WARNING)."""
    say(
        "[primary] best epoch %d: val %s | test %s | stale %s; %s",
        summary["best_epoch"],
        summary["val"],
        summary["test"],
        summary["stale"],
        summary["stopping"]["reason"],
    )
    for warning in summary["warnings"]:
        log(WARNING, "[primary] %s", warning)


def _ea_fields(cfg: RunConfig, data: EntityData, aligned, shares, exchanger: Exchanger, n_steps: int) -> dict:
    """The mode's own summary fields: variant, overlap, entities per party, stale counts."""
    share, source = aligned_share(cfg, data)
    return dict(
        ea_variant=cfg.ea.variant,
        overlap=cfg.ea.overlap,
        aligned_share=share,
        aligned_share_from=source,
        secondary_timeout=cfg.ea.secondary_timeout,
        entities={
            "train": len(data.split.train),
            "aligned": len(aligned),
            "val": len(data.split.val),
            "test": len(data.split.test),
            "records_per_party": {
                p: len(r)
                for p, r in party_records(cfg.ea.variant, data.parties, data.split.train, aligned, shares).items()
            },
        },
        stale=dict(exchanger.queue.stale),  # steps at which a party's last activation stood in for it
        stale_fraction={p: c / max(1, n_steps) for p, c in exchanger.queue.stale.items()},
    )


def kept_models(primary: PrimaryParty, channel: FlowerChannel | LocalChannel) -> dict:
    """What this process keeps at the best epoch (state name -> module): the primary's model and
    its own block's always; the secondaries' only in process. Over Flower each secondary keeps its
    own (told from on_epoch when keeper.offer returns True: FlowerChannel.keep, ``query.ea_keep``)."""
    local = channel.members if isinstance(channel, LocalChannel) else channel.local.members
    return {PRIMARY_MODEL: primary.model, **{state_name(p): party for p, party in local.items()}}  # with shields


def _exchange(channel, exchanger: Exchanger) -> dict | None:
    """summary.json's traffic over Flower (None in process)."""
    if not isinstance(channel, FlowerChannel):
        return None
    return {
        "count": exchanger.exchanges,
        "bytes_down": channel.traffic.bytes_down,
        "bytes_up": channel.traffic.bytes_up,
    }


def default_run_name(cfg: RunConfig) -> str:
    """A run's folder name when run-config ``run-name`` is unset: data set, variant, the aligned share
    where run-config ``overlap`` sets it (a built-in set; own parties' entity ids set their own), seed, time."""
    share = "" if cfg.data.dataset == "csv" else f"-x{cfg.ea.overlap:g}"
    return f"{cfg.data.dataset}-ea-{cfg.ea.variant}{share}-s{cfg.train.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_ea_primary(grid: Grid, cfg: RunConfig) -> dict:
    """The ServerApp's run: handshake, training over Flower, secondaries' models saved at the end;
    recorded in <run>/status.json (app/run_status.py)."""
    out = cfg.out_path() / (cfg.runtime.run_name or default_run_name(cfg))
    with run_status.tracked(out, "flower"):
        log(INFO, "[primary] run dir %s", out)
        data, channel = _meet(grid, cfg, out)
        try:
            log(INFO, "[primary] secondaries: %s", channel.nodes)
            summary = run_ea(cfg, data, channel, out, "flower", say=lambda m, *a: log(INFO, m, *a))
            channel.finish(str(out))
        finally:
            channel.close()  # a direct transport's worker ends with its link, however the run ends
        log(INFO, "[primary] results in %s", out)
        return summary


def _meet(grid: Grid, cfg: RunConfig, out: Path) -> tuple[EntityData, FlowerChannel]:
    """The run's entities and the channel to the secondaries, each introduced (``query.ea_hello``).
    CSV parties with entity ids each hold only their own file: their ids meet the primary's in a
    private set intersection first (app/entity_aug/id_exchange.py), then each gets its plan; the
    matches are kept in the run folder ``out`` for predict."""
    if not id_exchange.exchanged(cfg):
        data = ea_data(cfg)
        return data, _channel(grid, cfg, data.secondaries, _own_block(cfg, data))
    exchange, parties, patience = (
        id_exchange.Exchange.start(cfg),
        id_exchange.secondaries(cfg),
        cfg.runtime.node_timeout,
    )
    if cfg.runtime.direct:
        channel = DirectChannel.open(grid, parties, patience, {})
        answers = channel.ask_each("query.ea_ids", {p: exchange.request for p in parties})
    else:
        met = introduce(grid, parties, patience, "ea_ids", lambda _: exchange.request)
        nodes = party_nodes(met, parties, "ea_ids", patience)
        channel, answers = FlowerChannel(grid, nodes, patience, {}), {p: met.contents[n] for p, n in nodes.items()}
    try:
        matches, widths = exchange.matches(answers)
        data = id_exchange.matched_data(cfg, matches, widths)
        id_exchange.save_matches(out, matches, widths)
        log(
            INFO,
            "[primary] ids met: %s of %d entities held",
            {p: int(h.sum()) for p, h in data.held.items()},
            len(data.labels),
        )
        channel.attach_local(_own_block(cfg, data))
        channel.ask_each("query.ea_hello", {p: id_exchange.plan_content(cfg, data, p) for p in parties})
        return data, channel
    except BaseException:
        channel.close()
        raise


def _own_block(cfg: RunConfig, data: EntityData) -> dict:
    return {PRIMARY_BLOCK: build_party(cfg, PRIMARY_BLOCK, data)} if PRIMARY_BLOCK in data.blocks else {}


def _channel(grid: Grid, cfg: RunConfig, parties: list[str], local: dict) -> FlowerChannel:
    """The secondaries over the run's transport: each one's direct link (the default), or
    Flower's messages (``transport = "flower"``)."""
    if cfg.runtime.direct:
        channel = DirectChannel.connect(grid, parties, cfg.runtime.node_timeout, local)
        log(INFO, "[primary] direct links to the party workers: %s", sorted(channel.links))
        return channel
    nodes = handshake(grid, parties, "", cfg.runtime.node_timeout, action="ea_hello")
    return FlowerChannel(grid, nodes, cfg.runtime.node_timeout, local)
