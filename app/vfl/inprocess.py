"""One-process runs built from a RunConfig exactly as the Flower apps build them:
the federated protocol with in-process secondaries, and the one-process twin.
Used by the equivalence tests and the benchmarks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from app import run_status
from app.config import RunConfig
from app.data import load_data
from app.run_record import Seconds
from app.vfl.engine import Engine
from app.vfl.exchange import gradient_defence
from app.vfl.linking import linkage_job
from app.vfl.parties import (
    build_primary_model,
    build_secondary_model,
    build_strategy,
    head_for,
    train_plan,
)
from app.vfl.secondary import SecondaryParty, with_imputed_row
from app.vfl.server import drive, link
from linkage.contracts import LinkageError
from linkage.store import load_secondary
from strategies.optim import party_seed
from strategies.shields import RowShield, level_shield
from strategies.vfl.channel import LocalChannel
from strategies.vfl.gates import seed_dropout
from strategies.vfl.primary import Optim
from strategies.vfl.protocol import fit
from strategies.vfl.twin import TwinParties, train_twin

TAG = "[inprocess]"


@dataclass
class OneProcessRun:
    losses: np.ndarray  # (steps,)
    primary: dict[str, torch.Tensor]  # final state dicts
    secondaries: dict[str, dict[str, torch.Tensor]]
    train_seconds: float  # training steps only, no evaluation


def _setup(cfg: RunConfig, steps_per_exchange: int | None, seconds: Seconds | None = None):
    """The run's config, settings, data, linkage (job folder) and plan; ``seconds`` gets the
    load and linkage times."""
    seconds = seconds or Seconds()
    if steps_per_exchange:
        cfg = cfg.replace(steps_per_exchange=steps_per_exchange)
    settings = cfg.resolve()
    t0 = time.perf_counter()
    ds = load_data(cfg)
    t1 = time.perf_counter()
    linkage, job = linkage_job(ds, cfg, settings) if cfg.training_method.federated else (None, None)
    seconds.load, seconds.linkage = t1 - t0, time.perf_counter() - t1
    return cfg, settings, ds, linkage, job, train_plan(cfg, settings)


def _local_parties(cfg: RunConfig, ds, job, linkage) -> dict[str, SecondaryParty]:
    """The secondaries as in-process objects (none for Solo, which has no linkage job), each
    holding the primary's linkage job (as a deployed party checks in its hello handler)."""
    parties = {p: SecondaryParty(cfg, p, str(job)) for p in ds.party_names} if job is not None else {}
    for p, s in parties.items():
        if s.job_id != linkage.job_id:
            raise LinkageError(
                f"party {p!r}: the primary's linkage is job {linkage.job_id!r}, but this party's "
                f"file in {job} is from job {s.job_id!r}; fetch that job's secondary-{p}.npz"
            )
    return parties


def run_in_process(cfg: RunConfig, steps_per_exchange: int | None = None) -> OneProcessRun:
    """The federated protocol with in-process secondaries (LocalChannel)."""
    cfg, settings, ds, linkage, job, plan = _setup(cfg, steps_per_exchange)
    strategy = build_strategy(ds, linkage, cfg, settings)
    if strategy.parties:
        strategy.protect(gradient_defence(cfg))  # the run's default defence, as the ServerApp's
    parties = _local_parties(cfg, ds, job, linkage)
    records, losses = fit(strategy, LocalChannel(parties) if parties else None, ds.split, plan)
    return OneProcessRun(
        np.asarray(losses),
        strategy.model.state_dict(),
        {p: s.model.state_dict() for p, s in parties.items()},
        sum(r.seconds for r in records),
    )


def run_twin(
    cfg: RunConfig, steps_per_exchange: int | None = None, lr_scales: list[float] | None = None
) -> OneProcessRun:
    """The one-process twin from the same config: same data, linkage, seeds and schedule
    (``lr_scales``: the learning rate's per epoch, a federated run's records' ``lr_scale``)."""
    cfg, settings, ds, linkage, job, plan = _setup(cfg, steps_per_exchange)
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    model = build_primary_model(ds, cfg, settings)
    seed_dropout(model, party_seed(cfg.train.model_seed, "dropout"), device)
    secondaries = {p: build_secondary_model(t.n_features, p, cfg, settings) for p, t in ds.secondaries.items()}
    row_of_token = {p: load_secondary(job, p).row_of_token for p in secondaries}
    t0 = time.perf_counter()
    parties = TwinParties(
        model,
        head_for(ds, settings),
        ds.primary.features,
        ds.labels,
        linkage,
        secondaries,
        {p: with_imputed_row(t.features, row_of_token[p], p) for p, t in ds.secondaries.items()},
        row_of_token,
        twin_shields(cfg, ds, row_of_token, device, dtype),
        gradient_defence(cfg),
    )
    optim = Optim(settings.lr, settings.weight_decay)
    losses = train_twin(parties, ds.split.train, plan, optim, (device, dtype), lr_scales)
    seconds = time.perf_counter() - t0
    return OneProcessRun(
        np.asarray(losses), model.state_dict(), {p: m.state_dict() for p, m in secondaries.items()}, seconds
    )


def twin_shields(cfg: RunConfig, ds, row_of_token: dict, device, dtype) -> dict[str, RowShield]:
    """The secondaries' level embedding defences as each party builds its own (app/vfl/secondary.py),
    from the same secrets: the twin sees the values they send."""
    like = torch.empty(0, cfg.resolve().model.cut_dim, device=device, dtype=dtype)  # (0, c)
    shields = {
        p: level_shield(cfg.exchange_level(), cfg.exchange.embedding_clip > 0, len(x), like, p)
        for p, x in ((p, with_imputed_row(t.features, row_of_token[p], p)) for p, t in ds.secondaries.items())
    }
    return {p: s for p, s in shields.items() if s is not None}


def max_param_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double().cpu() - b[k].double().cpu()).abs().max()) for k in a)


def run_experiment(cfg: RunConfig, out: Path) -> dict:
    """A whole FedSim (or baseline) run in one process: the ServerApp's driver
    (app/vfl/server.py:drive) with the secondaries behind a LocalChannel, the protocol proven
    equal to `flwr run` by the twin oracles; every epoch evaluated, the best-validation epoch
    reported. The same run record as the ServerApp (app/run_record.py), tracked in
    <out>/status.json (app/run_status.py)."""
    with run_status.tracked(Path(out), "inprocess"):  # running, then finished or failed
        return drive(cfg, Path(out), Engine("inprocess", TAG, _connect_local))


def _connect_local(ds, cfg: RunConfig, settings) -> tuple:
    """The linkage job and the in-process secondaries holding it: (linkage, LocalChannel, seconds,
    the job's privacy report); none of them for a method that links nothing."""
    linkage, job, link_seconds, privacy = link(ds, cfg, settings, TAG)
    parties = _local_parties(cfg, ds, job, linkage)
    return linkage, LocalChannel(parties) if parties else None, link_seconds, privacy
