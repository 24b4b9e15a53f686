"""The split-learning protocol, written against a channel to the secondaries.

One exchange serves one window of S training steps: the message carries the gradient
blocks of the previous window (applied in order by each secondary) and the token
requests of this window; the reply carries embeddings of those tokens computed from the
secondary's current weights. S = 1 is exact split learning.

Exact overlap (every run): a window's exchange goes out as soon as its last step's gradient
blocks exist, before that step's optimiser update (``PrimaryParty.backward`` / ``update``),
and the next window's inputs are staged while it is in flight: the update changes no block, so
the run is the same to the bit, and a deployed exchange's round trip hides the update's time.

Pipelined (``plan.pipeline``): the request for window w + 1 goes out as soon as window w's
embeddings are in, so the secondaries answer it while the primary computes window w and a
deployed exchange's latency hides behind that compute. It carries window w - 1's blocks, so
window w + 1's embeddings miss window w's updates: one more window of staleness, the same at
every run (the twin reproduces it). Each epoch drains the pipeline: its evaluation exchange
delivers the last two windows' blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import numpy as np
import torch

from strategies.records import EpochRecord, Progress, eval_part, finished, lr_scale
from strategies.schedule import epoch_batches, windows
from strategies.stop_rule import StopRule
from strategies.vfl.channel import SecondaryChannel, deliverable, host
from strategies.vfl.exchange_checks import check_losses
from strategies.vfl.primary import PrimaryParty, distinct
from strategies.vfl.wire import GradBlock
from strategies.wire_checks import Expect, PeerValueError, check_block

ATTENTION_ROWS = 2000  # validation records the per-epoch attention-by-rank record averages over (one forward)


@dataclass
class TrainPlan:
    stop: StopRule  # epochs, patience, max-steps, max-minutes
    batch_size: int
    steps_per_exchange: int
    seed: int
    eval_chunk: int = 50_000  # tokens per evaluation message
    eval_batch: int = 4096  # primary records per evaluation forward pass
    pipeline: bool = False  # request window w + 1 before computing window w (module docstring)
    lr_decay: float = 1.0  # the schedule (strategies/records.py lr_scale): 1 = a constant learning rate
    lr_patience: int = 3  # epochs without a better validation value before each reduction


# Steps between two reads of the step losses to the host (at a window's end): each read waits for
# the device, so the steps between them queue without a host sync.
LOSS_READS = 64


@dataclass
class Window:
    """One window's token bookkeeping, on the host: per batch its sorted distinct tokens and the
    (B, K) index of its pairs into them (PrimaryParty.batch_tokens), the window's union per
    party (the tokens its exchange embeds) and each batch's positions in it (None when the window
    is one batch: the union is that batch's tokens)."""

    batches: list[np.ndarray]
    tokens: list[dict[str, np.ndarray]]
    index: list[dict[str, np.ndarray]]
    union: dict[str, np.ndarray]
    at: list[dict[str, np.ndarray]] | None


def plan_window(strategy: PrimaryParty, batches: list[np.ndarray]) -> Window:
    """The window of ``batches``' bookkeeping, its unions without sorting (fedsim.distinct)."""
    per = [strategy.batch_tokens(rows) for rows in batches]
    tokens, index = [t for t, _ in per], [i for _, i in per]
    if len(batches) == 1:
        return Window(batches, tokens, index, tokens[0], None)
    union, at = {}, [{} for _ in batches]
    for p in strategy.parties:
        union[p], inverse = distinct(np.concatenate([t[p] for t in tokens]), strategy.n_tokens[p])
        for j, part in enumerate(np.split(inverse, np.cumsum([len(t[p]) for t in tokens])[:-1])):
            at[j][p] = part
    return Window(batches, tokens, index, union, at)


def first_window_tokens(strategy: PrimaryParty, batches: list[np.ndarray], plan: TrainPlan) -> dict[str, np.ndarray]:
    """Per party the sorted tokens (U,) the epoch's first window embeds ({} without batches)."""
    window = next(iter(windows(batches, plan.steps_per_exchange)), [])
    return plan_window(strategy, window).union if window else {}


def _staged(strategy: PrimaryParty, plan_windows: list[Window]):
    """Each window's steps on the device (PrimaryParty.stage), in order, staged ``LOSS_READS``
    steps or more at a time: one host-to-device copy per input for all of them."""
    w = 0
    while w < len(plan_windows):
        group = [plan_windows[w]]
        while sum(len(g.batches) for g in group) < LOSS_READS and w + len(group) < len(plan_windows):
            group.append(plan_windows[w + len(group)])
        steps = strategy.stage(*(sum((getattr(g, f) for g in group), []) for f in ("batches", "index", "tokens")))
        for g in group:
            yield steps[: len(g.batches)]
            steps = steps[len(g.batches) :]
        w += len(group)


def _take(values: np.ndarray | torch.Tensor, positions: np.ndarray) -> np.ndarray | torch.Tensor:
    """values[positions], a tensor indexed on its own device."""
    if isinstance(values, torch.Tensor):
        return values[torch.as_tensor(positions, device=values.device)]
    return values[positions]


@dataclass(frozen=True)
class Exchange:
    """The primary's side of a run's exchanges: its strategy (model, optimiser, gates), the channel
    to the secondaries (None: Solo, no secondary) and the plan its windows follow."""

    strategy: PrimaryParty
    channel: SecondaryChannel | None
    plan: TrainPlan


def train_epoch(
    ex: Exchange,
    batches: list[np.ndarray],
    step_losses: list[float],
    progress: Callable[[int, int, float], None],
    first: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    scale: float = 1.0,
) -> tuple[int, dict[str, list[GradBlock]]]:
    """Run the epoch's steps window by window; ``progress(steps done this epoch, steps, loss)``
    after every step, with the last loss read (the losses stay on the device and are read every
    ``LOSS_READS`` steps or more, at a window's end, and at the epoch's end). ``first``: the first window's embeddings, fetched with the previous epoch's
    evaluation (per party sorted tokens (T,) and embeddings (T, c) holding the window's; no
    block lies between the two, so they are the embeddings its own exchange would return).
    Returns the number of exchanges and the gradient blocks not delivered yet (the last
    window's; pipelined, the last two windows'), which the evaluation's exchange delivers.
    ``scale``: the epoch's fraction of the learning rate, which the secondaries apply the
    blocks at (the primary's own optimiser is set by the caller: PrimaryParty.scale_lr)."""
    strategy, channel, plan = ex.strategy, ex.channel, ex.plan
    parties = strategy.parties
    pending: dict[str, list[GradBlock]] = {p: [] for p in parties}
    plan_windows = [plan_window(strategy, w) for w in windows(batches, plan.steps_per_exchange)]
    exchanges, n0, request, losses = 0, len(step_losses), None, []
    staged = _staged(strategy, plan_windows)

    def send(w: int) -> None:  # window w's tokens, with every block computed so far
        nonlocal pending, request, exchanges
        request = channel.send(deliverable(channel, pending), plan_windows[w].union, lr_scale=scale)
        pending, exchanges = {p: [] for p in parties}, exchanges + 1

    if parties and plan_windows and first is None:
        send(0)
    for w, window in enumerate(plan_windows):
        steps = next(staged)  # host work done while the exchange is in flight
        if w == 0 and first is not None and parties:
            emb = {p: first[p][1][np.searchsorted(first[p][0], window.union[p])] for p in parties}  # (U, c) each
        elif parties:
            emb = checked(strategy, channel.receive(request), window.union, "train.step", channel.cursor)
        else:
            emb = {}
        more = parties and w + 1 < len(plan_windows)
        if more and plan.pipeline:
            send(w + 1)  # answered while this window computes
        for j, step in enumerate(steps):
            batch_emb = emb if window.at is None else {p: _take(emb[p], window.at[j][p]) for p in parties}
            loss, grads = strategy.backward(step, batch_emb)
            losses.append(loss)
            for p in parties:
                pending[p].append(grads[p])
            if more and not plan.pipeline and j + 1 == len(steps):
                send(w + 1)  # exact all the same: the update below changes no block; it overlaps the exchange
            strategy.update()
            read = step_losses[-1] if step_losses else float("nan")  # no host read here
            progress(len(step_losses) + len(losses) - n0, len(batches), read)
        if len(losses) >= LOSS_READS or w + 1 == len(plan_windows):
            read = torch.stack(losses).tolist()  # one host sync for these steps
            check_losses(read, len(step_losses))
            step_losses.extend(read)
            losses.clear()
    return exchanges, pending


def checked(strategy: PrimaryParty, replies: dict, asked: dict[str, np.ndarray], message: str, sent: dict) -> dict:
    """Each party's embeddings (U, c) of the tokens it was ``asked`` from its reply (a StepReply),
    refused by name unless exactly that shape, in the primary's dtype, finite and within the
    bound (strategies/wire_checks.py), and unless the party has applied exactly the
    gradient blocks ``sent`` to it (the channel's cursor)."""
    for p, r in replies.items():
        if r.applied is not None and r.applied != sent[p]:
            raise PeerValueError(
                f"party {p!r} says it has applied {r.applied} gradient blocks; it was sent {sent[p]} "
                f"(its reply to {message}): refusing embeddings from weights the primary did not train"
            )
    emb = {p: r.emb for p, r in replies.items()}
    missing = sorted(set(asked) - set(emb))
    if missing:
        raise PeerValueError(f"no embeddings from {missing} in the replies to {message}")
    return {
        p: check_block(
            emb[p],
            Expect(
                f"party {p!r}",
                "embeddings",
                f"its reply to {message}",
                (len(asked[p]), strategy.model.cuts[p]),
                strategy.dtype,
            ),
        )
        for p in asked
    }


def eval_embeddings(
    ex: Exchange,
    row_sets: list[np.ndarray],
    pending: dict[str, list[GradBlock]],
    save: tuple[str, int] | None = None,
    extra: dict[str, np.ndarray] | None = None,
    scale: float = 1.0,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """Deliver the last gradient blocks and fetch the embeddings every evaluation set needs, all
    parties together, ``plan.eval_chunk`` tokens per party per exchange (the first exchange also
    carries the blocks, and with ``save`` asks every party to checkpoint right after applying
    them: no extra exchange), and the ``extra`` tokens per party (the next epoch's first window:
    one exchange instead of two); the blocks are applied at ``scale`` of the learning rate.
    Returns per party (sorted tokens (T,), embeddings (T, c)) and the number of exchanges."""
    strategy, channel, plan = ex.strategy, ex.channel, ex.plan
    if not strategy.parties:
        return {}, 0
    needs = [strategy.needs(rows) for rows in row_sets] + ([extra] if extra else [])
    tokens = {p: np.unique(np.concatenate([n[p] for n in needs])) for p in strategy.parties}
    n_chunks = max(1, max(-(-len(t) // plan.eval_chunk) for t in tokens.values()))
    parts: dict[str, list[np.ndarray]] = {p: [] for p in tokens}
    for i in range(n_chunks):
        chunk = {p: t[i * plan.eval_chunk : (i + 1) * plan.eval_chunk] for p, t in tokens.items()}
        out = checked(
            strategy,
            channel.step(deliverable(channel, pending), chunk, save if i == 0 else None, scale),
            chunk,
            "train.step",
            channel.cursor,
        )
        pending = {p: [] for p in tokens}
        for p in tokens:
            parts[p].append(host(out[p]))
    return {p: (tokens[p], np.concatenate(parts[p])) for p in tokens}, n_chunks


def evaluate(
    strategy: PrimaryParty, lookup: dict[str, tuple[np.ndarray, np.ndarray]], rows: np.ndarray, plan: TrainPlan
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """(the metrics of ``rows``, their predictions as records.eval_part keeps them)."""
    out = torch.cat(
        [strategy.outputs(rows[i : i + plan.eval_batch], lookup) for i in range(0, len(rows), plan.eval_batch)]
    )  # (N, d_out)
    part = eval_part(strategy.head, out, rows, strategy.y[rows])
    return strategy.head.metrics(part["values"], part["y"], part.get("proba")), part


class Split(Protocol):
    """Row indices of the primary's table (datasets.base.Split has them)."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def _ignore(*args) -> None:
    return None


@dataclass(frozen=True)
class Hooks:
    """What a run does around :func:`fit`'s epochs. ``on_epoch(rec)`` hears of each evaluated
    epoch; ``progress`` of every step and of each evaluation's start; ``after_epoch(epoch,
    records, step_losses)`` (e.g. a checkpoint) runs once an epoch is evaluated, when every party
    has applied all of its gradient blocks; with ``checkpoint_dir`` the parties checkpoint in the
    evaluation's first exchange."""

    on_epoch: Callable[[EpochRecord], None] = _ignore
    progress: Progress = _ignore
    after_epoch: Callable[[int, list[EpochRecord], list[float]], None] | None = None
    checkpoint_dir: str = ""


def fit(
    strategy: PrimaryParty,
    channel: SecondaryChannel | None,
    split: Split,
    plan: TrainPlan,
    hooks: Hooks = Hooks(),
    done: tuple[list[EpochRecord], list[float]] | None = None,
) -> tuple[list[EpochRecord], list[float]]:
    """Train on ``split.train`` for at most ``plan.stop.epochs``, and with its patience > 0 only
    until that many epochs brought no better validation value (strategies/records.py); every
    epoch evaluate ``split.val`` and ``split.test``, calling the ``hooks``. ``done`` = the records
    and step losses of the epochs a checkpoint already holds: training goes on from the next
    epoch (the schedule is a function of the seed and the epoch, so it continues exactly). The
    caller picks the best-validation epoch from the records (test is reported there, never
    selected on)."""
    run = _Fit(strategy, channel, split, plan, hooks, list(done[1]) if done else [])
    records: list[EpochRecord] = list(done[0]) if done else []
    if run.stopped(records):
        return records, run.step_losses  # a resumed run that had already stopped
    first = None  # the first window's embeddings, fetched with the previous evaluation
    for epoch in range(len(records), plan.stop.epochs):
        scale = lr_scale(records, strategy.head, plan.lr_decay, plan.lr_patience)  # 1 unless scheduled
        strategy.scale_lr(scale)
        rec, pending = run.train_one(epoch, first, scale)
        first = run.evaluate_one(rec, pending)
        records.append(rec)
        hooks.on_epoch(rec)
        if hooks.after_epoch:
            hooks.after_epoch(epoch, records, run.step_losses)
        if run.stopped(records):
            break
    return records, run.step_losses


@dataclass
class _Fit:
    """One :func:`fit`: what every epoch trains and evaluates with, and the step losses so far."""

    strategy: PrimaryParty
    channel: SecondaryChannel | None
    split: Split
    plan: TrainPlan
    hooks: Hooks
    step_losses: list[float]

    @property
    def exchange(self) -> Exchange:
        return Exchange(self.strategy, self.channel, self.plan)

    def train_one(
        self, epoch: int, first: dict[str, tuple[np.ndarray, np.ndarray]] | None, scale: float
    ) -> tuple[EpochRecord, dict[str, list[GradBlock]]]:
        """One epoch's training steps (their losses appended to ``step_losses``): the epoch's
        record, its evaluation still to come, and the gradient blocks still pending."""
        t0, losses, progress = time.perf_counter(), self.step_losses, self.hooks.progress
        batches = _batches(self.split.train, self.plan, epoch, len(losses))
        n0 = len(losses)
        exchanges, pending = train_epoch(
            self.exchange, batches, losses, partial(progress, "training", epoch), first, scale
        )
        seconds = time.perf_counter() - t0
        progress("evaluation", epoch, len(batches), len(batches), losses[-1] if losses else float("nan"))
        mean = float(np.mean(losses[n0:])) if batches else float("nan")
        return EpochRecord(epoch, mean, len(batches), exchanges, seconds, lr_scale=scale), pending

    def evaluate_one(
        self, rec: EpochRecord, pending: dict[str, list[GradBlock]]
    ) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
        """Evaluate the epoch just trained on validation and test, into ``rec``, fetching the next
        epoch's first window in the same exchange (none after the last epoch); returns that
        window's embeddings, or None."""
        strategy, plan, split, folder = self.strategy, self.plan, self.split, self.hooks.checkpoint_dir
        epoch, t1 = rec.epoch, time.perf_counter()
        ahead = (
            first_window_tokens(strategy, _batches(split.train, plan, epoch + 1, len(self.step_losses)), plan)
            if epoch + 1 < plan.stop.epochs
            else {}
        )
        save = (folder, epoch) if folder else None
        lookup, n_eval = eval_embeddings(self.exchange, [split.val, split.test], pending, save, ahead, rec.lr_scale)
        rec.exchanges += n_eval
        (rec.val, val), (rec.test, test) = (evaluate(strategy, lookup, rows, plan) for rows in (split.val, split.test))
        rec.outputs = {"val": val, "test": test}
        rec.attention = strategy.attention_by_rank(split.val[:ATTENTION_ROWS], lookup)
        rec.eval_seconds = time.perf_counter() - t1
        return lookup if ahead else None

    def stopped(self, records: list[EpochRecord]) -> bool:
        """Training ends here (strategies/records.py finished: resumes stop alike)."""
        return finished(records, self.strategy.head, self.plan.stop, len(self.step_losses))


def _batches(train_rows: np.ndarray, plan: TrainPlan, epoch: int, steps_done: int) -> list[np.ndarray]:
    """The epoch's batches (a function of the seed and the epoch), cut at max-steps."""
    batches = epoch_batches(train_rows, plan.batch_size, plan.seed, epoch)
    most = plan.stop.max_steps
    return batches[: max(0, most - steps_done)] if most else batches
