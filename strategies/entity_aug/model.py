"""Entity Augmentation (Nagaswamy et al., 2024, ../shared/papers/entity-augmentation-limited-overlap.txt):
split learning for classification without private set intersection or entity alignment.

Every secondary (the paper's guest) encodes the next batch of *its own* records, in its own order,
and sends the activations with the entities' ids. The primary (the paper's host), which holds the
labels of all entities, concatenates the parties' activations and trains on the **interpolated label**: per row, the
average of the one-hot labels of the entities the parties sent, each weighted by that party's
share of the primary's input (its activation width), like CutMix across parties (Algorithm 1).
It returns each party the gradient of the loss w.r.t. its activations.

Algorithm 1's per-party queue (``strategies.entity_aug.exchange.SecondaryQueue``) holds the last
activation and ids received from each party: a party that does not answer within the timeout is represented by its last
ones, and the run counts how often (``stale``).

This module holds the labels, models, record orders (:class:`BatchSchedule`), the parties
(:class:`PrimaryParty`; the secondary in strategies/entity_aug/secondary.py) and the training loop; the channel to the
secondaries (payloads, :class:`~strategies.entity_aug.channel.SecondaryChannel`, the in-process
LocalChannel) lives in ``strategies.entity_aug.channel``, the queue and its fallback in
``strategies.entity_aug.exchange``.
Shapes: G parties, B entities per step, c_p activation width of party p, C classes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from strategies.entity_aug.channel import SecondaryChannel
from strategies.entity_aug.exchange import Exchanger
from strategies.heads import TaskHead
from strategies.records import EpochRecord, Progress, finished
from strategies.shields import AutoClip, defended_rows, secret_generator
from strategies.stop_rule import StopRule
from strategies.wire_checks import Expect, PeerValueError, check_block

__all__ = [
    "ACTIVATIONS",
    "VARIANTS",
    "BatchSchedule",
    "EntityAugError",
    "Layer",
    "PrimaryParty",
    "TrainPlan",
    "evaluate",
    "fit_ea",
    "interpolated_labels",
    "layers",
    "out_width",
    "party_records",
    "record_stream",
    "require_classification",
    "soft_cross_entropy",
]

VARIANTS = ("aligned", "augment", "full")
# aligned: every party iterates the aligned entities only, in one shared order (hard labels);
# augment: every party iterates the aligned entities and its own share, in its own order;
# full:    every party iterates all training entities, in one shared order (hard labels).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "leaky": nn.LeakyReLU}
Layer = int | str  # a Linear layer's output width, or an activation name (ACTIVATIONS)


class EntityAugError(ValueError):
    """A run entity augmentation cannot do (e.g. a regression task)."""


def require_classification(task: str, dataset: str) -> None:
    if task not in ("binary", "multiclass"):
        raise EntityAugError(
            f"entity augmentation is for classification: it averages the one-hot labels of the entities "
            f"the secondaries sent, and dataset {dataset!r} has a {task} target; run it with mode 'vfl' instead"
        )


# ---------------------------------------------------------------------------- labels and loss


def interpolated_labels(ids: np.ndarray, widths: Sequence[int], labels: np.ndarray, n_classes: int) -> np.ndarray:
    """(G, B) entity ids sent by G parties, their activation widths (G,) -> (B, C) soft labels:
    y_b = sum_g (w_g / sum w) onehot(labels[ids[g, b]])."""
    ids = np.asarray(ids)
    w = np.asarray(widths, dtype=np.float64)
    if ids.ndim != 2 or len(w) != len(ids):
        raise ValueError(f"ids must be (G, B) with one width per party, got ids {ids.shape} and {len(w)} widths")
    if (w <= 0).any():
        raise ValueError(f"activation widths must be positive, got {w.tolist()}")
    onehot = np.eye(n_classes)[labels[ids]]  # (G, B, C)
    return np.einsum("g,gbc->bc", w / w.sum(), onehot)  # (B, C)


def soft_cross_entropy(logits: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with soft targets (B, C). One logit (binary): BCE on P(class 1)."""
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], soft[:, 1])
    return -(soft * F.log_softmax(logits, dim=1)).sum(1).mean()


# ---------------------------------------------------------------------------- models


def layers(d_in: int, spec: Sequence[Layer], d_out: int | None = None) -> nn.Sequential:
    """The paper's Sec. 5.2 notation: ``(120, 70, "relu")`` = Linear(d_in, 120) -> Linear(120, 70)
    -> ReLU (no activation between Linears unless written). ``d_out``: a final Linear."""
    mods: list[nn.Module] = []
    for layer in spec:
        if isinstance(layer, str):
            if layer not in ACTIVATIONS:
                raise ValueError(f"unknown activation {layer!r}; known: {sorted(ACTIVATIONS)}")
            mods.append(ACTIVATIONS[layer]())
        else:
            mods.append(nn.Linear(d_in, layer))
            d_in = layer
    if d_out is not None:
        mods.append(nn.Linear(d_in, d_out))
    return nn.Sequential(*mods)


def out_width(d_in: int, spec: Sequence[Layer]) -> int:
    widths = [layer for layer in spec if not isinstance(layer, str)]
    return widths[-1] if widths else d_in


# ---------------------------------------------------------------------------- what each party iterates


def party_records(
    variant: str, parties: Sequence[str], train: np.ndarray, aligned: np.ndarray, shares: Sequence[np.ndarray]
) -> dict[str, np.ndarray]:
    """The training entities each party iterates in a variant (see VARIANTS)."""
    if variant not in VARIANTS:
        raise EntityAugError(f"unknown entity-augmentation variant {variant!r}; known: {VARIANTS}")
    if variant == "aligned":
        return {p: aligned for p in parties}
    if variant == "full":
        return {p: np.sort(train) for p in parties}
    return {p: np.sort(np.concatenate([aligned, share])) for p, share in zip(parties, shares, strict=True)}


def record_stream(records: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) ids: seeded permutations of the party's records, one after another (a party with
    fewer records than an epoch needs goes through them again, in a fresh order)."""
    if len(records) == 0:
        raise EntityAugError("a party has no training records")
    passes = [rng.permutation(records) for _ in range(math.ceil(n / len(records)))]
    return np.concatenate(passes)[:n]


@dataclass(frozen=True)
class BatchSchedule:
    """A party's batch schedule: what it iterates, its records, in the order drawn from
    ``order_seed`` (one seed shared by every party = aligned batches; a party's own seed =
    misaligned), ``batch_size`` at a time for ``steps_per_epoch`` steps."""

    records: np.ndarray
    order_seed: int
    batch_size: int
    steps_per_epoch: int

    def batch(self, stream: np.ndarray, step: int) -> np.ndarray:
        return stream[step * self.batch_size : (step + 1) * self.batch_size]

    def stream(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.order_seed, epoch])
        return record_stream(self.records, self.steps_per_epoch * self.batch_size, rng)


# ---------------------------------------------------------------------------- the primary


class PrimaryParty:
    """The label holder (the EA paper's host): its model over the concatenated activations
    (parties in a fixed order), the interpolated labels, the loss, and the gradient per party."""

    def __init__(
        self,
        widths: dict[str, int],
        labels: np.ndarray,
        head: TaskHead,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        """``widths``: each party's activation width c_p, in the order of the model's input; the
        primary accepts a party's activations only at that width (:meth:`_cat`)."""
        self.parties, self.widths, self.labels, self.head = list(widths), dict(widths), labels, head
        self.model, self.optimizer, self.device, self.dtype = model, optimizer, device, dtype
        self.noise_scale, self.noise, self.clips = 0.0, None, {}  # :meth:`protect`
        self.trains_on: dict[str, np.ndarray] = {}  # party -> (n,) bool: the entities its steps may send

    def expect_records(self, records: dict[str, np.ndarray]) -> None:
        """Each party's training entities (its schedule's records, which this primary planned):
        a step's ids from a party must be among them (never a validation or test entity)."""
        for p, rec in records.items():
            mask = np.zeros(len(self.labels), dtype=bool)
            mask[np.asarray(rec, dtype=np.int64)] = True
            self.trains_on[p] = mask

    def protect(self, noise: float, parties: Sequence[str]) -> None:
        """Send the gradients of ``parties``' activations defended per record from now on: each
        row clipped at a clip calibrated in the run (per party), N(0, (noise x clip)^2) added
        (strategies/shields.py), from a secret of this party; noise 0 = undefended."""
        self.noise_scale = noise
        self.noise = secret_generator(self.device, "ea-grad-noise") if noise > 0 else None
        self.clips = {p: AutoClip() for p in parties} if noise > 0 else {}

    def _defended(self, p: str, grad: torch.Tensor) -> torch.Tensor:
        """(B, c) party p's gradient as sent (its rows' records defended, where :meth:`protect` says)."""
        return defended_rows(grad, self.clips[p], self.noise_scale, self.noise) if p in self.clips else grad

    def _cat(
        self, acts: dict[str, np.ndarray], rows: int, message: str, grad: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(B, sum c_p) the parties' activations side by side, each first checked as this primary
        asked for it: ``rows`` rows of the party's width, in this primary's dtype, finite and
        within the bound (strategies/wire_checks.py); a refusal names the party."""
        xs = []
        for p in self.parties:
            want = Expect(f"party {p!r}", "activations", message, (rows, self.widths[p]), self.dtype)
            checked = torch.as_tensor(check_block(acts[p], want), device=self.device, dtype=self.dtype)  # (B, c_p)
            xs.append(checked.requires_grad_(grad))
        return torch.cat(xs, dim=1), xs  # (B, sum c_p)

    def _ids(self, ids: dict[str, np.ndarray]) -> np.ndarray:
        """(G, B) the entity ids the parties sent with a step, refused naming the party unless
        integers of entities this primary holds labels for, as many from every party."""
        sizes = {p: np.shape(ids[p]) for p in self.parties}
        if len(set(sizes.values())) != 1 or len(sizes[self.parties[0]]) != 1:
            raise PeerValueError(f"the primary: the parties' entity ids in train.ea_step differ in shape {sizes}")
        for p in self.parties:
            got = ids[p]
            bad = not isinstance(got, np.ndarray) or got.dtype.kind not in "iu"
            if bad or (got.size and (got.min() < 0 or got.max() >= len(self.labels))):
                raise PeerValueError(
                    f"the primary: entity ids from party {p!r} in train.ea_step are not integers in "
                    f"[0, {len(self.labels)}) (got {getattr(got, 'dtype', type(got).__name__)}); refused, nothing applied"
                )
            outside = int((~self.trains_on[p][got]).sum()) if p in self.trains_on else 0
            if outside:
                raise PeerValueError(
                    f"the primary: entity ids from party {p!r} in train.ea_step: {outside} of {got.size} are "
                    "not among its training entities (its schedule's: never a validation or test entity); "
                    "refused, nothing applied"
                )
        return np.stack([ids[p] for p in self.parties])

    def train_step(
        self, acts: dict[str, np.ndarray], ids: dict[str, np.ndarray]
    ) -> tuple[float, dict[str, np.ndarray]]:
        """One step: :meth:`backward`, then :meth:`update`; (loss, each party's gradient (B, c_p))."""
        loss, grads = self.backward(acts, ids)
        self.update()
        return loss.item(), grads

    def backward(
        self, acts: dict[str, np.ndarray], ids: dict[str, np.ndarray]
    ) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """The step up to each party's gradient (B, c_p), defended; the loss a 0-d tensor."""
        stacked = self._ids(ids)  # (G, B)
        x, xs = self._cat(acts, stacked.shape[1], "train.ea_step", grad=True)
        widths = [self.widths[p] for p in self.parties]
        soft = interpolated_labels(stacked, widths, self.labels, self.head.n_classes)
        self.model.train()
        loss = soft_cross_entropy(self.model(x), torch.as_tensor(soft, device=self.device, dtype=self.dtype))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss.detach(), {p: self._defended(p, t.grad).cpu().numpy() for p, t in zip(self.parties, xs)}

    def update(self) -> None:
        """The primary's own step, after :meth:`backward` (its gradients may be sent first)."""
        self.optimizer.step()

    @torch.no_grad()
    def outputs(self, acts: dict[str, np.ndarray], rows: int) -> torch.Tensor:
        """(B, d_out) the model's raw output (logits) over the parties' activations of ``rows``
        entities (each party's checked: :meth:`_cat`), in eval mode."""
        self.model.eval()
        return self.model(self._cat(acts, rows, "query.ea_embed")[0])

    def predict(self, acts: dict[str, np.ndarray], rows: int) -> np.ndarray:
        return self.head.predict(self.outputs(acts, rows))


# ---------------------------------------------------------------------------- training loop


@dataclass(frozen=True)
class TrainPlan:
    stop: StopRule  # epochs, patience, max-steps, max-minutes
    steps_per_epoch: int
    eval_batch: int = 4096


def evaluate(primary: PrimaryParty, channel: SecondaryChannel, ids: np.ndarray, eval_batch: int) -> dict[str, float]:
    """Metrics on aligned entities: every party encodes the same ids, in the same order."""
    chunks = [ids[i : i + eval_batch] for i in range(0, len(ids), eval_batch)]
    outs = [primary.outputs(channel.embed(chunk), len(chunk)) for chunk in chunks]
    return primary.head.evaluation(torch.cat(outs), primary.labels[ids])  # (N, d_out)


def fit_ea(
    primary: PrimaryParty,
    exchanger: Exchanger,
    val_ids: np.ndarray,
    test_ids: np.ndarray,
    plan: TrainPlan,
    on_epoch: Callable[[EpochRecord], None],
    progress: Progress,
) -> tuple[list[EpochRecord], list[float]]:
    """Train for at most ``plan.stop.epochs`` of ``plan.steps_per_epoch`` steps, and with
    its patience > 0 only until that many epochs brought no better validation value
    (strategies/records.py); evaluate validation and test after each epoch (the caller reports
    test at the best-validation epoch). ``progress`` hears of every step and each evaluation."""
    records: list[EpochRecord] = []
    losses: list[float] = []
    for epoch in range(plan.stop.epochs):
        t0, n0, x0 = time.perf_counter(), len(losses), exchanger.exchanges
        n_steps = plan.steps_per_epoch
        if plan.stop.max_steps:
            n_steps = min(n_steps, plan.stop.max_steps - len(losses))

        def step_done(loss: float) -> None:  # of this epoch
            losses.append(loss)
            progress("training", epoch, len(losses) - n0, n_steps, loss)

        exchanger.flush(epoch, train_epoch(primary, exchanger, epoch, n_steps, step_done))
        rec = EpochRecord(
            epoch,
            float(np.mean(losses[n0:])) if n_steps else float("nan"),
            n_steps,
            exchanger.exchanges - x0,
            time.perf_counter() - t0,
        )
        progress("evaluation", epoch, n_steps, n_steps, losses[-1] if losses else float("nan"))
        t1 = time.perf_counter()
        rec.val = evaluate(primary, exchanger.channel, val_ids, plan.eval_batch)
        rec.test = evaluate(primary, exchanger.channel, test_ids, plan.eval_batch)
        rec.eval_seconds = time.perf_counter() - t1
        records.append(rec)
        on_epoch(rec)
        if finished(records, primary.head, plan.stop, len(losses)):
            break
    return records, losses


def train_epoch(
    primary: PrimaryParty, exchanger: Exchanger, epoch: int, n_steps: int, step_done: Callable[[float], None]
) -> dict[str, np.ndarray]:
    """``n_steps`` steps; returns the last step's gradients (for the epoch's flush). Each step's
    gradients go out with the next step's request before the primary updates its own model, so
    the secondaries' step runs while it does (the same values in the same order: a secondary's
    step does not read the primary's weights)."""
    grads: dict[str, np.ndarray] = {}
    if n_steps:
        exchanger.send(epoch, 0, grads)
    for step in range(n_steps):
        replies, fresh = exchanger.receive(step)
        loss, g = primary.backward({p: r.act for p, r in replies.items()}, {p: r.ids for p, r in replies.items()})
        grads = {p: g[p] for p in fresh}
        if step + 1 < n_steps:
            exchanger.send(epoch, step + 1, grads)
        primary.update()
        step_done(loss.item())
    return grads
