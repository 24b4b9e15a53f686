"""Entity Augmentation mode (``mode = "entity-aug"``): each party's pieces built from a run
config, shared by the ServerApp (app/entity_aug/server.py), the ClientApp (app/entity_aug/client.py) and the
in-process runner, so all of them start from identical data, record lists, orders and initial
weights; and the wire format of the mode's messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from app import probes
from app.config import RunConfig
from app.data import load_data
from app.messages import ProtocolError, read_named, require_finite, unwrapped, wrapped
from strategies.entity_aug.channel import StepReply, StepRequest
from strategies.entity_aug.model import (
    BatchSchedule,
    EntityAugError,
    Layer,
    PrimaryParty,
    TrainPlan,
    layers,
    out_width,
    party_records,
    require_classification,
)
from strategies.entity_aug.secondary import SecondaryParty
from strategies.heads import TaskHead
from strategies.optim import Adam, build_seeded, party_seed
from strategies.shields import EA_EMBED_NOISE, GRAD_NOISE, level_shield

if TYPE_CHECKING:
    from datasets.overlap import EntityData


@dataclass(frozen=True)
class Settings:
    """Training hyperparameters (as app/config.py Settings): a dataset's defaults, or those resolved for one run."""

    batch_size: int
    epochs: int
    lr: float
    secondary: tuple[Layer, ...]  # each party's local model (Sec. 5.2 notation, see strategies.entity_aug.model.layers)
    primary: tuple[Layer, ...]  # the primary's (the EA paper's host's) model before its output layer


# The paper's Sec. 5.2 models, 60 epochs and Sec. 5.5 learning rates (Adam, betas 0.9 / 0.999),
# except handwritten: the paper's 0.1 made Adam collapse here (augment at 5%: 0.19 test
# accuracy after 20 epochs, 0.985 at 1e-3), so it gets the CV rate 1e-3. Batch sizes are not in
# the paper (ours). digits (two 8x8 halves) is not in the paper: handwritten's MLPs, the CV lr.
DATASET_DEFAULTS: dict[str, Settings] = {
    "credit": Settings(256, 60, 5e-4, (5, 2, "relu"), (22, 10, 8, 4)),
    "parkinsons": Settings(16, 60, 5e-4, (94, 47, "relu"), (94, 47, "leaky", 22, 10, "leaky")),
    "handwritten": Settings(64, 60, 1e-3, (120, 70, "relu"), (280, 120, "leaky", 40)),
    "digits": Settings(64, 60, 1e-3, (120, 70, "relu"), (280, 120, "leaky", 40)),
}
FALLBACK = Settings(64, 60, 1e-3, (120, 70, "relu"), (280, 120, "leaky", 40))


def ea_settings(cfg: RunConfig) -> Settings:
    d = DATASET_DEFAULTS.get(cfg.data.dataset, FALLBACK)
    return Settings(
        cfg.train.batch_size or d.batch_size, cfg.train.epochs or d.epochs, cfg.train.lr or d.lr, d.secondary, d.primary
    )


def hyperparameters(cfg: RunConfig) -> tuple[Settings, int, dict]:
    """The run's settings (epochs: the maximum), its patience, and each value with its source
    (as app/config.py RunConfig.hyperparameters): the run config, the dataset's tuned defaults
    (DATASET_DEFAULTS), or for a dataset without them handwritten's models with early stopping."""
    tuned = cfg.data.dataset in DATASET_DEFAULTS
    epochs, patience = cfg.stopping(DATASET_DEFAULTS[cfg.data.dataset].epochs if tuned else None)
    settings = replace(ea_settings(cfg), epochs=epochs)
    base = (
        f"dataset default ({cfg.data.dataset}, Entity Augmentation paper Sec. 5.2 / 5.5)"
        if tuned
        else "fallback: handwritten's defaults — dataset has no tuned defaults"
    )
    stop = base if tuned else "fallback: early stopping — dataset has no tuned defaults"
    rows = {
        "batch_size": (settings.batch_size, "run config" if cfg.train.batch_size else base),
        "epochs": (epochs, "run config" if cfg.train.epochs else stop),
        "patience": (patience, "run config" if cfg.train.patience >= 0 else stop),
        "lr": (settings.lr, "run config" if cfg.train.lr else base),
        "secondary_layers": (list(settings.secondary), base),
        "primary_layers": (list(settings.primary), base),
    }
    return settings, patience, {name: {"value": v, "source": src} for name, (v, src) in rows.items()}


def ea_data(cfg: RunConfig) -> EntityData:
    from datasets.overlap import entity_data  # here: pandas; a secondary's messages load no data (PartyInputs)

    ds = load_data(cfg)
    require_classification(ds.task, ds.name)
    return entity_data(ds)


def ea_check(cfg: RunConfig) -> EntityData:
    """The run's data with everything the ServerApp would refuse about it refused here, before
    Flower starts (fedsim train's check()): a regression target, a dataset without entity ids,
    ea-variant 'full' when the parties' ids leave training entities out, a party with no
    training entity to iterate."""
    data = ea_data(cfg)
    aligned, shares = overlap_parts(cfg, data)
    records = party_records(cfg.ea.variant, data.parties, data.split.train, aligned, shares)
    empty = [p for p, r in records.items() if len(r) == 0]
    if empty:
        raise EntityAugError(
            f"dataset {data.name!r}: party {empty[0]!r} has no training entity to iterate in "
            f"ea-variant {cfg.ea.variant!r} (aligned training entities: {len(aligned)})"
        )
    return data


def aligned_share(cfg: RunConfig, data: EntityData) -> tuple[float, str]:
    """(the share of training entities every party holds, where it comes from): run-config
    ``overlap`` for the built-in sets; the parties' entity ids (``overlap`` unused) otherwise."""
    aligned, _ = overlap_parts(cfg, data)
    source = "the parties' entity ids" if data.held is not None else "run-config overlap"
    return len(aligned) / max(1, len(data.split.train)), source


def evaluation_warnings(data: EntityData) -> list[str]:
    """A validation or test set too small to rank epochs or variants (datasets/entity_ids.py eval_sizes)."""
    from datasets.entity_ids import EVAL_WARN_BELOW  # lazy: pandas (datasets), off the ClientApp's per-message imports

    sizes = {"validation": len(data.split.val), "test": len(data.split.test)}
    small = {k: v for k, v in sizes.items() if v < EVAL_WARN_BELOW}
    if not small:
        return []
    n, n_eval = len(data.labels), len(data.split.val) + len(data.split.test)
    why = (
        f" (the {n} entities' parties hold too few in common for 10% and 20% of them: evaluation needs "
        "entities every party holds)"
        if data.held is not None and n_eval < 0.3 * n - 2
        else f" (the dataset has {n} entities)"
    )
    return [
        f"{' and '.join(f'{k} has {v}' for k, v in small.items())} records, under {EVAL_WARN_BELOW}{why}: "
        "metrics move in coarse steps, so early stopping and comparisons of variants are unreliable"
    ]


def steps_per_epoch(data: EntityData, settings: Settings) -> int:
    """Every variant runs the same number of steps per epoch: one pass over the training
    entities' count (a party with fewer records cycles through them)."""
    return math.ceil(len(data.split.train) / settings.batch_size)


def ea_plan(cfg: RunConfig, data: EntityData, settings: Settings, patience: int = 0) -> TrainPlan:
    return TrainPlan(cfg.stop_rule(settings.epochs, patience), steps_per_epoch(data, settings))


def overlap_parts(cfg: RunConfig, data: EntityData) -> tuple[np.ndarray, list[np.ndarray]]:
    """The aligned training entities and each party's disjoint share of the rest (seeded by the run)."""
    from datasets.overlap import entity_overlap  # lazy: pandas, off the ClientApp's per-message imports

    return entity_overlap(data, cfg.ea.overlap, np.random.default_rng([cfg.train.seed, 41]), cfg.ea.variant)


def batch_schedule(cfg: RunConfig, data: EntityData, settings: Settings, party: str) -> BatchSchedule:
    aligned, shares = overlap_parts(cfg, data)
    records = party_records(cfg.ea.variant, data.parties, data.split.train, aligned, shares)[party]
    return BatchSchedule(records, order_seed(cfg, party), settings.batch_size, steps_per_epoch(data, settings))


def order_seed(cfg: RunConfig, party: str) -> int:
    """The seed of ``party``'s batch order: its own in variant augment (no alignment), else one shared by all."""
    own = cfg.ea.variant == "augment"
    return party_seed(cfg.train.seed, f"ea-order:{party}" if own else "ea-order")


@dataclass(frozen=True)
class PartyInputs:
    """What a party takes from the run's data: its feature block, its batch schedule and its
    fault-test delay. A deployed secondary keeps them in context.state from its hello on
    (app/entity_aug/client.py), so no later message loads the dataset again."""

    x: np.ndarray  # (n, d_p) by entity id
    schedule: BatchSchedule
    delay: float


def party_inputs(cfg: RunConfig, party: str, data: EntityData | None = None) -> PartyInputs:
    data = data or ea_data(cfg)
    if party not in data.blocks:
        raise ValueError(f"unknown party {party!r} for dataset {cfg.data.dataset!r}; parties: {data.parties}")
    delay = probes.secondary_delay() if party == data.secondaries[0] else 0.0
    return PartyInputs(data.blocks[party], batch_schedule(cfg, data, ea_settings(cfg), party), delay)


def build_party(
    cfg: RunConfig, party: str, data: EntityData | None = None, inputs: PartyInputs | None = None
) -> SecondaryParty:
    """A party at its initial weights, from the run's data (``data``, loaded if None) or from
    ``inputs`` already taken from it."""
    inputs = inputs or party_inputs(cfg, party, data)
    settings = ea_settings(cfg)
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    d = inputs.x.shape[1]
    model = build_seeded(party_seed(cfg.train.seed, f"ea:{party}"), lambda: layers(d, settings.secondary)).to(
        device, dtype
    )
    optimizer = Adam(model.parameters(), lr=settings.lr, betas=(0.9, 0.999))
    built = SecondaryParty(party, inputs.x, inputs.schedule, model, optimizer, (device, dtype), inputs.delay)
    from datasets.overlap import PRIMARY_BLOCK  # lazy: pandas; as ea_data's import

    if party != PRIMARY_BLOCK:  # a secondary's activations defended at its level (the primary's own block: not)
        like = torch.empty(0, out_width(d, settings.secondary), device=device, dtype=dtype)  # (0, c)
        built.protect(level_shield(cfg.exchange_level(), False, len(inputs.x), like, party, EA_EMBED_NOISE))
    return built


def build_primary(cfg: RunConfig, data: EntityData) -> PrimaryParty:
    settings = ea_settings(cfg)
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    early_stopping = hyperparameters(cfg)[1] > 0
    head = TaskHead.fit(data.task, data.labels[data.split.train], data.n_classes, early_stopping)
    widths = {p: out_width(data.blocks[p].shape[1], settings.secondary) for p in data.parties}  # c_p
    model = build_seeded(
        party_seed(cfg.train.seed, "ea-host"),  # the seed's name is kept: same weights as before
        lambda: layers(sum(widths.values()), settings.primary, head.d_out),
    ).to(device, dtype)
    optimizer = Adam(model.parameters(), lr=settings.lr, betas=(0.9, 0.999))
    primary = PrimaryParty(widths, data.labels, head, model, optimizer, device, dtype)
    primary.protect(GRAD_NOISE[cfg.exchange_level()], data.secondaries)  # its own block's gradient stays here
    aligned, shares = overlap_parts(cfg, data)  # the parties' schedules' records (batch_schedule), all at once
    primary.expect_records(party_records(cfg.ea.variant, data.parties, data.split.train, aligned, shares))
    return primary


def simulation_secondary(cfg: RunConfig, partition_id: int, names: list[str] | None = None) -> str:
    """In simulation, virtual node i plays secondary i (sorted by name; ``names``, or the run's data's)."""
    secondaries = names if names is not None else ea_data(cfg).secondaries
    if not 0 <= partition_id < len(secondaries):
        raise ValueError(f"partition-id {partition_id} but dataset {cfg.data.dataset!r} has secondaries {secondaries}")
    return secondaries[partition_id]


# ---------------------------------------------------------------------------- wire format


def request_content(req: StepRequest) -> RecordDict:
    return wrapped(req.encode(), "ea", "ea_meta")  # the core's codec (strategies/entity_aug/channel.py)


def read_request(content: RecordDict) -> StepRequest:
    """A secondary's step request, checked as StepRequest.decode checks it; the secondary checks the
    gradient's values before applying them (strategies/entity_aug/secondary.py)."""
    if set(content) != {"ea", "ea_meta"}:
        raise ProtocolError(f"train.ea_step holds {sorted(content)}; expected 'ea' and 'ea_meta'")
    return StepRequest.decode(*unwrapped(content, "ea", "ea_meta"))


def reply_content(reply: StepReply) -> RecordDict:
    return wrapped(reply.encode(), "ea", "ea_meta")


def read_reply(content: RecordDict, party: str = "") -> StepReply:
    if set(content) != {"ea", "ea_meta"}:
        raise ProtocolError(f"party {party!r}'s reply to train.ea_step holds {sorted(content)}")
    return StepReply.decode(*unwrapped(content, "ea", "ea_meta"), party)


def ids_content(ids: np.ndarray) -> RecordDict:
    return RecordDict({"ea": ArrayRecord({"ids": Array(np.ascontiguousarray(ids, dtype=np.int64))})})


def read_ids(content: RecordDict, n: int | None = None, message: str = "") -> np.ndarray:
    """The entity ids (q,) a query asks for; with ``n`` (the party's rows), checked (:func:`check_ids`)."""
    ids = content.array_records["ea"]["ids"].numpy()
    return ids if n is None else check_ids(ids, n, message)


def check_ids(ids: np.ndarray, n: int, message: str) -> np.ndarray:
    """``ids`` when one vector of integers in [0, n) (the party's rows), else refused naming the
    primary and ``message``."""
    if not (ids.ndim == 1 and ids.dtype.kind in "iu" and (len(ids) == 0 or (ids.min() >= 0 and ids.max() < n))):
        raise ProtocolError(
            f"the primary's {message}: ids must be one vector of integers in [0, {n}), got {ids.dtype} {ids.shape}"
        )
    return ids


def kept_request_content(run: str, ids: np.ndarray, attempt: str = "") -> RecordDict:
    """query.ea_embed_kept: the run whose kept state (of its training ``attempt``, app/kept.py;
    "" for a run kept before attempts) embeds, and the entity ids (q,)."""
    content = ids_content(ids)
    content.config_records["ea_kept"] = ConfigRecord({"run": run, **({"attempt": attempt} if attempt else {})})
    return content


def read_kept_request(content: RecordDict) -> tuple[dict, np.ndarray]:
    """({"run", "attempt"}, entity ids (q,)) of a query.ea_embed_kept."""
    kept = read_named(content, "ea_kept", "query.ea_embed_kept", names=("run",), optional=("attempt",))
    return kept, read_ids(content)


def act_content(act: np.ndarray) -> RecordDict:
    return RecordDict({"ea": ArrayRecord({"act": Array(np.ascontiguousarray(act))})})


def read_act(content: RecordDict, party: str = "") -> np.ndarray:
    """A party's activations from its reply to query.ea_embed (or ea_embed_kept), refused naming it
    unless the reply is exactly its array record of one array; the primary checks the values."""
    arrays = content.array_records.get("ea") if set(content) == {"ea"} else None
    if arrays is None or set(arrays) != {"act"}:
        raise ProtocolError(
            f"party {party!r}'s reply to query.ea_embed holds {sorted(content)}; expected 'ea' with 'act'"
        )
    act = arrays["act"].numpy()
    require_finite(act, party, "activations", "the reply to query.ea_embed")
    return act
