"""The primary's side of the exchange's privacy: the defences it applies (label DP, clipped and
noised cut-layer gradients; strategies/vfl/defences.py) and the report of the label attacks a
secondary could run on what it received (strategies/vfl/exchange_observer.py), summary.json's
``exchange_privacy``. A secondary's embedding defence is its own (app/vfl/secondary.py)."""

from __future__ import annotations

import secrets
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.common.logger import log

from app.config import ConfigError, RunConfig
from strategies.optim import party_seed
from strategies.shields import EMBED_NOISE
from strategies.vfl import exchange_attacks as attacks
from strategies.vfl.defences import GradientDefence, epsilon, level_defence, randomised_labels
from strategies.vfl.exchange_observer import ExchangeObserver, leaks, report_lines


def private_labels(ds, cfg: RunConfig, head) -> np.ndarray:
    """The labels the primary trains on: ``ds.labels`` with the training rows randomised to
    epsilon = ``label-dp`` (from a secret of this process), or as they are."""
    eps = cfg.exchange.label_dp
    if eps <= 0:
        return ds.labels
    rng = np.random.default_rng(secrets.randbits(128))
    y, train = ds.labels.copy(), ds.split.train
    if ds.task == "regression":
        span = head.y_max - head.y_min
        scaled = randomised_labels((y[train] - head.y_min) / span, "regression", eps, rng)
        y[train] = (scaled * span + head.y_min).astype(y.dtype)
    else:
        y[train] = randomised_labels(y[train], ds.task, eps, rng, ds.n_classes)
    return y


def require_defences(ds, cfg: RunConfig) -> None:
    """Refuse, by name, a defence the data's task cannot take (`fedsim train` asks before Flower)."""
    if cfg.exchange.marvell and ds.task != "binary":
        raise ConfigError(f"run-config 'marvell' protects binary labels; dataset {ds.name!r} is {ds.task}")


def protect(strategy, ds, cfg: RunConfig, settings, tag: str) -> None:
    """The primary's defences on ``strategy`` and, with ``exchange-report``, its observer."""
    ex = cfg.exchange
    require_defences(ds, cfg)
    strategy.y = private_labels(ds, cfg, strategy.head)
    strategy.protect(gradient_defence(cfg))
    if strategy.defence.on or ex.label_dp:
        log(INFO, "%s exchange defences: %s", tag, defences(cfg, ds, settings))
    if ex.exchange_report and strategy.parties:
        strategy.observer = ExchangeObserver(
            ds.task, strategy.n_tokens, settings.model.cut_dim, strategy.device, party_seed(cfg.train.seed, "exchange")
        )


def gradient_defence(cfg: RunConfig) -> GradientDefence:
    """The primary's defence of the gradients it sends: an explicit ``grad-clip`` (with its
    ``grad-noise``) as set, else its privacy level's (a clip calibrated in the run and the level's
    noise; strategies/vfl/defences.py). The primary's own level: it protects its own labels."""
    ex = cfg.exchange
    if ex.grad_clip > 0:
        return GradientDefence(ex.grad_clip, ex.grad_noise, ex.marvell)
    return level_defence(cfg.exchange_level(), ex.marvell)


def defences(cfg: RunConfig, ds, settings, steps: int | None = None, clips: dict | None = None) -> dict:
    """The run's exchange defences as summary.json records them, with the accountant's epsilon of
    the gradient noise (per secondary, delta = 1 / training rows) once the steps are known, and
    the clips calibrated in the run (``clips``: per secondary, the last step's)."""
    ex, n, grad = cfg.exchange, len(ds.split.train), gradient_defence(cfg)
    out = {
        "privacy": cfg.exchange_level(),
        "grad_clip": "auto" if grad.auto is not None else grad.clip,
        "grad_noise": grad.noise,
        "marvell": ex.marvell,
        "label_dp_epsilon": ex.label_dp or None,
        "embedding_clip": ex.embedding_clip,
        "embedding_noise": ex.embedding_noise,
    }
    if not ex.embedding_clip and EMBED_NOISE[cfg.exchange_level()]:  # the secondaries' level shield (a simulation's)
        out["embedding_shield"] = {"clip": "auto", "noise_norm": EMBED_NOISE[cfg.exchange_level()], "per_record": True}
    if grad.auto is not None and clips:
        out["grad_clip_calibrated"] = {p: round(v, 6) for p, v in clips.items()}
    if grad.on and grad.noise and steps:
        eps = epsilon(grad.noise, settings.batch_size / n, steps, 1.0 / n)
        out["grad_epsilon"] = {"epsilon": round(eps, 3), "delta": 1.0 / n, "steps": steps, "end_to_end": False}
        if grad.auto is not None:  # the clip follows earlier steps' norms: the accountant's figure is approximate
            out["grad_epsilon"]["clip_from_data"] = True
    return out


def report(strategy, ds, cfg: RunConfig, settings, steps: int, tag: str, inverted: dict) -> dict | None:
    """summary.json's ``exchange_privacy``: the defences and, per secondary, the label attacks'
    success on its records against the true labels (exchange_observer.ExchangeObserver.report),
    and the primary's feature inversion against it (``inverted``: measured by each party on its
    own data and sent with its finish reply, or :func:`inversions` of in-process parties)."""
    if not strategy.parties:
        return None
    out = {"defences": defences(cfg, ds, settings, steps, strategy.sent.clip_values()), "attacks": None}
    if cfg.exchange.exchange_report:
        out["inversion"] = inverted
    if strategy.observer is not None:
        train = ds.split.train
        labels = strategy.head.target(ds.labels[train], "cpu", strategy.dtype).numpy()
        tokens = {p: strategy.linkage.tokens[p][train] for p in strategy.parties}
        seed = party_seed(cfg.train.seed, "exchange-known")
        out["attacks"] = strategy.observer.report(tokens, labels, ds.n_classes, seed)
        for line in report_lines(out):
            log(WARNING if leaks(out) else INFO, "%s %s", tag, line)
    return out


AUX, SCORED = 5_000, 20_000  # at most these many of a secondary's records fit / score the inversion


def inversions(cfg: RunConfig, local: dict) -> dict:
    """:func:`inversion` against each in-process secondary of ``local`` ({} with exchange-report off)."""
    if not cfg.exchange.exchange_report:
        return {}
    return {p: inversion(party, party_seed(cfg.train.seed, f"inversion-{p}")) for p, party in local.items()}


def inversion(party, seed: int) -> dict:
    """The primary's feature inversion against an in-process secondary (``party``: its object):
    an inversion model fitted on an auxiliary fifth of its records (features the primary is
    assumed to hold; at most :data:`AUX`) from the embeddings the party sends now (its defence
    applied), scored on up to :data:`SCORED` others (strategies/vfl/exchange_attacks.py)."""
    rng = np.random.default_rng(seed)
    n = len(party.x)
    rows = rng.permutation(n)[: min(n, AUX + SCORED)]
    aux = np.arange(min(max(n // 5, 10), AUX, len(rows) - 1))
    emb = party.embed_rows(torch.as_tensor(rows, device=party.x.device))  # (R, c), as the party sends them
    found = attacks.inversion(emb.float().cpu().numpy(), party.x[rows].float().cpu().numpy(), aux, seed)
    return {k: round(v, 4) for k, v in found.items()} | {"auxiliary_records": int(len(aux))}
