"""ServerApp side of Entity Augmentation (``mode = "entity-aug"``): the host (labels) drives
the guests over Flower messages with Algorithm 1's queue and timeout fallback; and the same
run with the guests in process (:func:`run_ea_in_process`, used by bench.sweep).

Both write into the run folder: config.json, metrics.jsonl (one line per epoch),
summary.json (the best-validation epoch's val / test metrics, stale counts per guest),
primary_model.pt (the host's model), step_losses.npy, and status.json (app/run_status.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from logging import INFO
from pathlib import Path

import numpy as np
import torch
from flwr.app import Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from app import ea_parties as wire
from app import run_status
from app.channel import POLL, PartyError, Traffic, handshake, run_name
from app.config import RunConfig
from app.ea_parties import build_host, build_party, ea_data, ea_plan, ea_settings, overlap_parts, torch_threads
from app.messages import named_content, payload_bytes
from app.parties import load_data
from datasets.overlap import HOST, EntityData
from strategies.ea_exchange import Exchanger, LocalLink, StepReply, StepRequest
from strategies.entity_aug import EAParty, fit_ea, party_records
from strategies.protocol import EpochRecord, best_epoch


class FlowerLink:
    """The guests behind Flower nodes (plus the host's own block, if any, in process)."""

    def __init__(self, grid: Grid, nodes: dict[str, int], patience: float, local: dict[str, EAParty]) -> None:
        self.grid, self.nodes, self.patience = grid, nodes, patience
        self.local = LocalLink(local)
        self.parties = sorted(nodes) + self.local.parties
        self.traffic = Traffic()
        self._pending: dict[str, str] = {}  # party -> id of its outstanding message

    def send(self, party: str, request: StepRequest) -> None:
        if party in self.local.members:
            self.local.send(party, request)
            return
        content = wire.request_content(request)
        msg = Message(content, dst_node_id=self.nodes[party], message_type="train.ea_step")
        (self._pending[party],) = self.grid.push_messages([msg])
        self.traffic.bytes_down += payload_bytes(content)

    def _pull(self, wanted: dict[str, str], until: float, what: str) -> dict[str, RecordDict]:
        """message id -> party; pull every POLL s until all are in or ``until``."""
        out: dict[str, RecordDict] = {}
        while wanted:
            for reply in self.grid.pull_messages(list(wanted)):
                party = wanted.pop(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    raise PartyError(f"guest {party!r} failed on {what}: {reply.error.reason}")
                out[party] = reply.content
                self.traffic.bytes_up += payload_bytes(reply.content)
            if not wanted or time.monotonic() >= until:
                break
            time.sleep(POLL)
        return out

    def collect(self, parties: set[str], until: float) -> dict[str, StepReply]:
        out = self.local.collect(parties & set(self.local.members), until)
        wanted = {self._pending[p]: p for p in parties if p in self._pending}
        for party, content in self._pull(wanted, until, "ea_step").items():
            del self._pending[party]
            out[party] = wire.read_reply(content, party)
        return out

    def _ask_all(self, message_type: str, content: RecordDict) -> dict[str, RecordDict]:
        msgs = {p: Message(content, dst_node_id=n, message_type=message_type) for p, n in self.nodes.items()}
        ids = self.grid.push_messages(list(msgs.values()))
        self.traffic.bytes_down += payload_bytes(content) * len(msgs)
        got = self._pull(dict(zip(ids, msgs)), time.monotonic() + self.patience, message_type)
        missing = sorted(set(self.nodes) - set(got))
        if missing:
            raise PartyError(f"guest {missing[0]!r} did not answer {message_type} within {self.patience} s")
        return got

    def embed(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        got = self._ask_all("query.ea_embed", wire.ids_content(ids))
        return {**{p: wire.read_act(c, p) for p, c in got.items()}, **self.local.embed(ids)}

    def finish(self, folder: str) -> None:
        """Every guest saves its model into its own folder for the run (``folder`` = the host's
        run dir; only its name travels)."""
        self._ask_all("query.ea_finish", named_content("ea_finish", run=run_name(Path(folder))))


# ---------------------------------------------------------------------------- one run


def run_ea(cfg: RunConfig, data: EntityData, link: FlowerLink | LocalLink, out: Path, engine: str,
           say=lambda *a: None) -> dict:
    """Train, evaluate every epoch, write the run's files; returns the summary."""
    t0 = time.perf_counter()
    settings = ea_settings(cfg)
    plan = ea_plan(cfg, data, settings)
    aligned, shares = overlap_parts(cfg, data)
    host = build_host(cfg, data)
    (out / "config.json").write_text(json.dumps({"run": dataclasses.asdict(cfg), "resolved": dataclasses.asdict(settings)},
                                                indent=2))
    say("[host] entity-aug %s on %s: overlap %g (%d aligned of %d training entities), parties %s, batch %d, "
        "%d epochs x %d steps, lr %g", cfg.ea_variant, data.name, cfg.overlap, len(aligned), len(data.split.train),
        data.parties, settings.batch_size, plan.epochs, plan.steps_per_epoch, settings.lr)
    exchanger = Exchanger(link, cfg.guest_timeout, cfg.node_timeout)
    with (out / "metrics.jsonl").open("w") as f:
        def on_epoch(rec: EpochRecord) -> None:
            f.write(json.dumps({**dataclasses.asdict(rec), "stale": dict(exchanger.queue.stale)}) + "\n")
            f.flush()
            say("[host] epoch %d: loss=%.5f | val %s | test %s | stale %s | %.1f s", rec.epoch, rec.train_loss,
                rec.val, rec.test, exchanger.queue.stale, rec.seconds)

        with torch_threads(1):
            records, losses = fit_ea(host, exchanger, data.split.val, data.split.test, plan, on_epoch, lambda *a: None)
    torch.save(host.model.state_dict(), out / "primary_model.pt")
    np.save(out / "step_losses.npy", np.asarray(losses))
    best = best_epoch(records, host)
    n_steps = max(1, len(losses))
    summary = {
        "dataset": data.name, "mode": "entity-aug", "ea_variant": cfg.ea_variant, "overlap": cfg.overlap,
        "seed": cfg.seed, "engine": engine, "best_epoch": best.epoch, "val": best.val, "test": best.test,
        "epochs_run": len(records), "steps": len(losses), "seconds": time.perf_counter() - t0,
        "entities": {"train": len(data.split.train), "aligned": len(aligned),
                     "records_per_party": {p: len(r) for p, r in party_records(
                         cfg.ea_variant, data.parties, data.split.train, aligned, shares).items()}},
        "guest_timeout": cfg.guest_timeout,
        "preprocessing": load_data(cfg).preprocessing,  # the loaded parties' (cached), before entity blocks
        "stale": dict(exchanger.queue.stale),  # steps at which a party's last activation stood in for it
        "stale_fraction": {p: c / n_steps for p, c in exchanger.queue.stale.items()},
    }
    if isinstance(link, FlowerLink):
        summary["exchange"] = {"count": exchanger.exchanges, "bytes_down": link.traffic.bytes_down,
                               "bytes_up": link.traffic.bytes_up}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    say("[host] best epoch %d: val %s | test %s | stale %s", best.epoch, best.val, best.test, summary["stale"])
    return summary


def run_ea_in_process(cfg: RunConfig, out: Path) -> dict:
    """The run with every party in this process (threads only when a guest timeout is set),
    recorded in <out>/status.json (app/run_status.py)."""
    with run_status.tracked(Path(out), "inprocess"):
        data = ea_data(cfg)
        link = LocalLink({p: build_party(cfg, p, data) for p in data.parties}, threaded=cfg.guest_timeout > 0)
        try:
            return run_ea(cfg, data, link, Path(out), "inprocess")
        finally:
            link.close()


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
