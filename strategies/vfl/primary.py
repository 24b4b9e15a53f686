"""The primary party (the label holder): owns its model, optimiser, labels and linkage view, and
turns secondaries' embeddings into a loss, a step, and gradients for each secondary.

A training step reads nothing back to the host: its loss stays a device tensor (the protocol
reads the losses in bulk, strategies/vfl/protocol.py) and its gradient blocks are device tensors
(a serialising channel copies them to the host once per exchange). The step's inputs (rows,
(B, K) indexes, similarities, targets) are prepared per window, their token bookkeeping without
sorting (:func:`distinct`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from linkage.contracts import PrimaryLinkage
from strategies.heads import TaskHead
from strategies.optim import make_optimizer, set_lr
from strategies.vfl.defences import GradientDefence, SentGradients
from strategies.vfl.model import SimilarityModel
from strategies.vfl.wire import GradBlock


@dataclass(frozen=True)
class Step:
    """One training step's inputs, on the primary's device (:meth:`PrimaryParty.stage`)."""

    rows: torch.Tensor  # (B,) the batch's primary rows
    tokens: dict[str, np.ndarray]  # per party the batch's sorted distinct tokens (U_p,)
    index: dict[str, torch.Tensor]  # per party (B, K) positions into tokens[p]
    sims: dict[str, torch.Tensor]  # (B, K) per path of the model
    target: torch.Tensor  # (B,) or (B, ...) the head's target


def distinct(values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for int values in [0, n): the sorted distinct values
    and each entry's position among them (``values``' shape). With n not far above the entries'
    count it marks each possible value instead of sorting (the same arrays, O(size + n))."""
    if n > 32 * values.size:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(values.shape)
    mark = np.zeros(n, dtype=bool)
    mark[values] = True
    uniq = np.flatnonzero(mark)
    pos = np.empty(n, dtype=np.intp)  # only the marked entries are read
    pos[uniq] = np.arange(len(uniq))
    return uniq, pos[values]


@dataclass(frozen=True)
class Optim:
    """The primary's optimiser settings (strategies/optim.py make_optimizer: LAMB)."""

    lr: float = 1e-3
    weight_decay: float = 0.0


class PrimaryParty:
    """Primary-side logic, independent of transport. Secondaries are reached through a
    channel by :mod:`strategies.vfl.protocol`; this class never sees their rows or features."""

    def __init__(
        self,
        model: SimilarityModel,
        head: TaskHead,
        linkage: PrimaryLinkage | None,
        x: np.ndarray,
        y: np.ndarray,
        optim: Optim = Optim(),
        on: tuple[torch.device, torch.dtype] = (torch.device("cpu"), torch.float32),
    ) -> None:
        """``x`` (m, d_P) the primary's features, ``y`` (m,) its labels (zeros where no step is
        taken: predict); the model is moved ``on`` (device, dtype)."""
        device, dtype = on
        lr, weight_decay = optim.lr, optim.weight_decay
        self.model = model.to(device=device, dtype=dtype)
        self.head = head
        self.linkage = linkage
        self.parties = list(model.parties)
        self.x = torch.as_tensor(x, device=device, dtype=dtype)  # (m, d_P)
        self.y = y
        self.device, self.dtype = device, dtype
        self.lr = lr  # the schedule's scale multiplies it (:meth:`scale_lr`)
        self.optimizer = make_optimizer(self.model.optimizer_groups(), lr, weight_decay)
        self.sims: dict[str, np.ndarray] = {}  # (m, K) per path of the model
        self.n_tokens: dict[str, int] = {}  # per party the size of its token space (max token + 1)
        if self.parties:
            self.sims = {"all": linkage.sims} if model.shared_sims else {p: linkage.links[p].sims for p in self.parties}
            self.n_tokens = {p: int(linkage.tokens[p].max(initial=-1)) + 1 for p in self.parties}
        self.sent = SentGradients(GradientDefence(), self.parties, device)  # the blocks' defence (:meth:`protect`)
        self.observer = None  # an ExchangeObserver (strategies/vfl/exchange_observer.py) sees each step's exchange
        self._seen = None  # the last backward's (index, target, embeddings, blocks), for the observer

    def scale_lr(self, scale: float) -> None:
        """The primary's steps at ``scale`` of its learning rate from now on (strategies/records.py lr_scale)."""
        set_lr(self.optimizer, self.lr * scale)

    def protect(self, defence: GradientDefence) -> None:
        """Send defended gradient blocks from now on (strategies/vfl/defences.py), the noise from
        a secret of this process; a clip calibrated in the run is calibrated per secondary."""
        self.sent = SentGradients(defence, self.parties, self.device)

    @property
    def defence(self) -> GradientDefence:
        return self.sent.defence

    def needs(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Distinct tokens per party that the records ``rows`` are linked to."""
        return {p: distinct(self.linkage.tokens[p][rows], self.n_tokens[p])[0] for p in self.parties}

    def _inputs(self, rows: np.ndarray, tokens: dict[str, np.ndarray]):
        """Per party the (B, K) index of each pair into ``tokens[p]`` (sorted distinct tokens),
        and the (B, K) similarities: one shared entry "all", or one per independently linked party."""
        index = {
            p: torch.as_tensor(np.searchsorted(tokens[p], self.linkage.tokens[p][rows]), device=self.device)
            for p in self.parties
        }
        sims = {name: torch.as_tensor(s[rows], device=self.device, dtype=self.dtype) for name, s in self.sims.items()}
        return index, sims

    def batch_tokens(self, rows: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per party the batch's sorted distinct tokens (U_p,) (:meth:`needs`) and the (B, K)
        position of each pair's token among them."""
        out = {p: distinct(self.linkage.tokens[p][rows], self.n_tokens[p]) for p in self.parties}
        return {p: t for p, (t, _) in out.items()}, {p: i for p, (_, i) in out.items()}

    def stage(self, batches: list[np.ndarray], index: list[dict[str, np.ndarray]], tokens: list[dict]) -> list[Step]:
        """The steps of consecutive ``batches`` on the device, one host-to-device copy per input for
        all of them; ``index`` / ``tokens``: each batch's :meth:`batch_tokens`."""
        sizes = [len(b) for b in batches]
        rows = np.concatenate(batches)
        dev = self.device
        parts = {
            "rows": torch.as_tensor(rows, device=dev).split(sizes),
            "target": self.head.target(self.y[rows], dev, self.dtype).split(sizes),
            "sims": {
                k: torch.as_tensor(s[rows], device=dev, dtype=self.dtype).split(sizes) for k, s in self.sims.items()
            },
            "index": {
                p: torch.as_tensor(np.concatenate([i[p] for i in index]), device=dev).split(sizes) for p in self.parties
            },
        }
        return [
            Step(
                parts["rows"][j],
                tokens[j],
                {p: v[j] for p, v in parts["index"].items()},
                {k: v[j] for k, v in parts["sims"].items()},
                parts["target"][j],
            )
            for j in range(len(batches))
        ]

    def train_step(
        self, step: Step, emb: dict[str, np.ndarray | torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, GradBlock]]:
        """One step; emb[p] (U, c) are the embeddings of step.tokens[p] (host arrays or tensors).
        Returns the loss, a 0-dim device tensor (reading it is the caller's host sync), and per party
        the gradient block of its embeddings, a device tensor (defended where :meth:`protect` says)."""
        out = self.backward(step, emb)
        self.update()
        return out

    def backward(
        self, step: Step, emb: dict[str, np.ndarray | torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, GradBlock]]:
        """:meth:`train_step` up to its gradients, the model not updated yet: :meth:`update` must
        follow before the next step. The blocks do not change with the update, so a caller may send
        them first and update while the exchange is in flight (strategies/vfl/protocol.py)."""
        self.model.train()
        emb = {p: torch.as_tensor(emb[p], device=self.device, dtype=self.dtype) for p in self.parties}
        if self.defence.on:  # each pair's embedding a leaf of its own: per-record gradients to clip
            leaves = {p: emb[p][step.index[p]].flatten(0, 1).detach().requires_grad_(True) for p in self.parties}
            index = {p: torch.arange(i.numel(), device=self.device).view(i.shape) for p, i in step.index.items()}
        else:
            leaves, index = {p: e.detach().requires_grad_(True) for p, e in emb.items()}, step.index
        out = self.model(self.x[step.rows], leaves, index, step.sims)
        loss = self.head.loss(out, step.target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        blocks = {p: GradBlock(step.tokens[p], self._block(p, leaves[p].grad, step)) for p in self.parties}
        self._seen = (step.index, step.target, emb, blocks)
        return loss.detach(), blocks

    def update(self) -> None:
        """The step :meth:`backward` computed: the optimiser's update, and the observer's look at
        the exchange (strategies/vfl/exchange_observer.py)."""
        self.optimizer.step()
        if self.observer is not None:
            self.observer.observe(*self._seen)
        self._seen = None

    def _block(self, p: str, grad: torch.Tensor, step: Step) -> torch.Tensor:
        """Party p's gradient block (U, c): as computed, or from the per-pair gradients (B * K, c)
        defended per record (strategies/vfl/defences.py)."""
        if not self.defence.on:
            return grad
        b, k = step.index[p].shape
        n = len(step.tokens[p])
        return self.sent.block(p, grad.view(b, k, -1), step.index[p], n, step.target)

    @torch.no_grad()
    def outputs(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]) -> torch.Tensor:
        """The model's raw outputs (B, d_out) for ``rows``; lookup[p] = (sorted tokens (T,),
        embeddings (T, c))."""
        self.model.eval()
        return self.model(self.x[rows], *self._looked_up(rows, lookup))

    @torch.no_grad()
    def attention(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """fedsim_attn, per secondary (B, K + 1): the attention's weights on the linked records of
        ``rows`` (the linkage's order) and on the null slot (last)."""
        self.model.eval()
        weights = self.model.attention_weights(self.x[rows], *self._looked_up(rows, lookup))
        return {p: w.cpu().numpy() for p, w in weights.items()}

    def attention_by_rank(
        self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]
    ) -> dict[str, list[float]]:
        """fedsim_attn, per secondary: the mean weight over ``rows`` of the neighbour of each
        similarity rank (1 .. K, most similar first) and of the null slot (last), K + 1 numbers
        summing to 1; {} for the other methods (no attention)."""
        if not self.model.cfg.attention or not len(rows):
            return {}
        out = {}
        for p, w in self.attention(rows, lookup).items():  # (B, K + 1), the linkage's order
            order = np.argsort(-self.sims["all" if "all" in self.sims else p][rows], axis=1, kind="stable")  # (B, K)
            ranked = np.concatenate([np.take_along_axis(w[:, :-1], order, 1), w[:, -1:]], axis=1)  # (B, K + 1)
            out[p] = [round(float(v), 6) for v in ranked.mean(axis=0)]
        return out

    def _looked_up(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]):
        """(emb, index, sims) of ``rows`` with each party's embeddings taken from ``lookup``."""
        tokens = self.needs(rows)
        emb = {
            p: torch.as_tensor(
                lookup[p][1][np.searchsorted(lookup[p][0], tokens[p])], device=self.device, dtype=self.dtype
            )
            for p in self.parties
        }
        return (emb, *self._inputs(rows, tokens))

    def predict(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Predictions for ``rows`` in the label's units (strategies.heads.TaskHead.predict)."""
        return self.head.predict(self.outputs(rows, lookup))
